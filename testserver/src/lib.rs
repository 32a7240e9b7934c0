//! kube-testserver: an in-memory Kubernetes API server over TLS, faithful to the recorded
//! kube-apiserver fixtures, with simulated nodes (scheduler, kubelets, PodGC, node lifecycle
//! controller, taint manager) and fault injection, for end-to-end tests and the local demo.
//!
//! ```no_run
//! let server = kube_testserver::TestServer::start(kube_testserver::Options::default())?;
//! println!("KUBECONFIG={}", server.kubeconfig_path().display());
//! # Ok::<(), std::io::Error>(())
//! ```

// `ApiError` carries a `Status`'s details (~200 bytes); it is only built on the error path of
// a request, where boxing would buy nothing measurable.
#![allow(clippy::result_large_err)]

mod accept;
mod admission;
mod api;
mod auth;
mod cel;
mod cluster;
mod cost;
mod discovery;
mod faults;
mod http;
mod inert;
mod kubelet;
#[cfg(test)]
mod layers;
mod lifecycle;
mod names;
mod nodes;
mod openapi;
mod patch;
mod podspec;
mod policy;
mod policy_admission;
mod rbac;
mod regex;
mod reply;
mod resources;
mod review;
mod route;
mod runtime;
mod scheduler;
mod selector;
mod server;
mod shared;
mod status;
mod store;
mod strategy;
mod structural;
mod table;
mod taints;
mod tls;
mod token;
mod util;
mod validate;
mod watch;

pub use auth::Rule;
pub use cost::{CostModel, InFlight};
pub use faults::{FailRule, Logged, StallRule};
pub use kubelet::KubeletOptions;
pub use store::Snapshot;

use server::Listener;
use shared::Shared;
use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

/// The ImmortalContainer CRD, embedded so the binary works from any directory.
pub const IMMORTALCONTAINER_CRD: &str = include_str!("../../config/crd/immortalcontainers.yaml");

/// Where the CRD lives in the source tree; read at start when present, so an edited CRD is
/// served without rebuilding.
const CRD_SOURCE_PATH: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../config/crd/immortalcontainers.yaml"
);

/// Names a stall put in force by [`TestServer::stall`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StallId(u64);

/// How to start a server.
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    /// Port on 127.0.0.1; 0 picks a free one.
    pub port: u16,
    /// Where `kubeconfig`, `ca.crt`, `tls.crt` and `tls.key` are written. `None`: a fresh
    /// directory under the system temp dir, removed when the server is dropped.
    pub dir: Option<PathBuf>,
    /// CRD YAML to pre-install; `None`: the project's ImmortalContainer CRD.
    pub crd_path: Option<PathBuf>,
    /// Whether to pre-install the CRD (otherwise tests create it through the API).
    pub install_crd: bool,
    /// Events retained per resource for watches resuming from a resourceVersion.
    pub history: usize,
    /// How often watches with `allowWatchBookmarks=true` get a BOOKMARK.
    pub bookmark_interval: Duration,
    /// Nodes registered at start, Ready: `node-0`, `node-1`, ... Default 1.
    pub nodes: usize,
    /// The scheduler, a kubelet on every node and PodGC, with their timing. `None`: nothing
    /// runs pods, they stay Pending, and every pod DELETE is immediate (MODIFIED with grace 0,
    /// then DELETED), as on a cluster with no node (the `kube-apiserver` fixtures).
    pub kubelet: Option<KubeletOptions>,
    /// The `SidecarContainers` feature gate: an init container's `restartPolicy: Always` is
    /// kept and the kubelet runs it as a native sidecar (KEP-753). On by default, as in every
    /// Kubernetes since 1.29; `false` drops the field from pods, as v1.28 does by default.
    pub sidecar_containers: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            port: 0,
            dir: None,
            crd_path: None,
            install_crd: true,
            history: 10_000,
            bookmark_interval: Duration::from_secs(1),
            nodes: 1,
            kubelet: Some(KubeletOptions::default()),
            sidecar_containers: true,
        }
    }
}

/// A running server. Dropping it closes the listener and every connection.
pub struct TestServer {
    shared: Arc<Shared>,
    listener: Mutex<Option<Listener>>,
    port: u16,
    dir: PathBuf,
    remove_dir: bool,
    ca_pem: String,
    admin_token: String,
    /// The scheduler and kubelets, when they run.
    cluster: Option<cluster::Handle>,
}

fn fresh_dir() -> io::Result<PathBuf> {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let mut rnd = [0u8; 4];
    util::random_bytes(&mut rnd);
    let dir = std::env::temp_dir().join(format!(
        "kube-testserver-{}-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed),
        util::hex(&rnd)
    ));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

fn invalid_data(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

impl TestServer {
    /// Generates certificates, binds 127.0.0.1, installs the CRD if asked, writes the admin
    /// kubeconfig and starts serving.
    pub fn start(opts: Options) -> io::Result<TestServer> {
        let certs = tls::generate()?;
        let (dir, remove_dir) = match &opts.dir {
            Some(d) => {
                std::fs::create_dir_all(d)?;
                (d.clone(), false)
            }
            None => (fresh_dir()?, true),
        };
        let (tcp, port) = Listener::bind(opts.port)?;
        let (gc_tx, gc_rx) = mpsc::channel();
        let store = store::Store::new(opts.history, gc_tx);
        let admin_token = util::new_token();
        let mut users = auth::Users::default();
        users.add(
            &admin_token,
            auth::User {
                name: "admin".into(),
                grants: auth::Grants::All,
            },
        );
        let mut shared = Shared::new(
            store,
            users,
            opts.bookmark_interval,
            port,
            certs.config.clone(),
        );
        shared.sidecar_containers = opts.sidecar_containers;
        let shared = Arc::new(shared);

        if opts.install_crd {
            let yaml = match &opts.crd_path {
                Some(p) => std::fs::read_to_string(p)?,
                None => std::fs::read_to_string(CRD_SOURCE_PATH)
                    .unwrap_or_else(|_| IMMORTALCONTAINER_CRD.to_string()),
            };
            let crd: serde_json::Value =
                serde_yaml::from_str(&yaml).map_err(|e| invalid_data(format!("crd yaml: {e}")))?;
            api::create_direct(
                &shared,
                "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                crd,
            )
            .map_err(|e| invalid_data(format!("crd rejected: {e}")))?;
        }

        // The collector holds only a weak reference: it ends when the server is gone and
        // the store (holding the sending side) is dropped.
        let weak = Arc::downgrade(&shared);
        std::thread::Builder::new()
            .name("kube-testserver-gc".into())
            .spawn(move || {
                while let Ok(job) = gc_rx.recv() {
                    let Some(shared) = weak.upgrade() else { break };
                    shared.write().collect(job);
                }
            })?;

        // Before the nodes register, so the scheduler hears of them.
        let cluster = match &opts.kubelet {
            Some(k) => Some(cluster::start(&shared, k.clone())?),
            None => None,
        };
        {
            let mut store = shared.write();
            for i in 0..opts.nodes {
                nodes::register(&mut store, &nodes::node_name(i));
            }
        }

        let listener = Listener::start(shared.clone(), tcp)?;
        let server = TestServer {
            shared,
            listener: Mutex::new(Some(listener)),
            port,
            dir,
            remove_dir,
            ca_pem: certs.ca_pem.clone(),
            admin_token,
            cluster,
        };
        std::fs::write(server.dir.join("ca.crt"), &certs.ca_pem)?;
        std::fs::write(server.dir.join("tls.crt"), &certs.server_cert_pem)?;
        tls::write_private(&server.dir.join("tls.key"), &certs.server_key_pem)?;
        server.write_kubeconfig(&server.kubeconfig_path(), &server.admin_token)?;
        log::debug!(port = port; "kube-testserver started");
        Ok(server)
    }

    /// `https://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The kubeconfig with the admin token.
    pub fn kubeconfig_path(&self) -> PathBuf {
        self.dir.join("kubeconfig")
    }

    /// The CA certificate clients must trust, PEM.
    pub fn ca_pem(&self) -> String {
        self.ca_pem.clone()
    }

    /// The token allowed to do everything.
    pub fn admin_token(&self) -> String {
        self.admin_token.clone()
    }

    /// Adds a user authenticated by `token` and allowed only what `rules` allow (403
    /// otherwise). Re-adding a token replaces its user. TokenReviews authenticate the token and
    /// SubjectAccessReviews answer from the same rules; a rule resource starting with `/` is a
    /// non-resource URL: `Rule::new(&["get"], &["/metrics"])` lets the user read a metrics
    /// endpoint that delegates to this server.
    pub fn add_user(&self, name: &str, token: &str, rules: Vec<Rule>) {
        let mut users = self.shared.users.write().unwrap_or_else(|e| e.into_inner());
        users.add(
            token,
            auth::User {
                name: name.to_string(),
                grants: auth::Grants::Rules(rules),
            },
        );
    }

    /// Replaces the allow rules of user `name` (every token added under that name), as editing
    /// the ClusterRole bound to the user does on a real cluster: from the next request on, what
    /// the new rules do not allow is answered 403 with the RBAC message, and SubjectAccessReviews
    /// answer from the new rules. As on a real server, authorization happens when a request
    /// arrives: a watch already open goes on. `false` if no user has that name. (Calling
    /// [`TestServer::add_user`] again with the same token replaces that token's user too.)
    pub fn set_rules(&self, name: &str, rules: Vec<Rule>) -> bool {
        let mut users = self.shared.users.write().unwrap_or_else(|e| e.into_inner());
        users.set_rules(name, &rules) > 0
    }

    /// Serves the requests of user `name` on threads at CPU niceness `nice` (Linux), from its
    /// connections' next request on: a load generator's requests then take only the CPU the
    /// rest leaves over, as on a real cluster, where the API server that serves a flood does
    /// not run on the CPU of the client under test, and its priority and fairness keep one
    /// user's flood from starving another's requests.
    pub fn set_user_nice(&self, name: &str, nice: u8) {
        shared::lock(&self.shared.niceness).insert(name.to_string(), nice);
    }

    /// Writes a kubeconfig for this server authenticating with `token`.
    pub fn write_kubeconfig(&self, path: &Path, token: &str) -> io::Result<()> {
        let user = {
            let users = self.shared.users.read().unwrap_or_else(|e| e.into_inner());
            users
                .authenticate(Some(&format!("Bearer {token}")))
                .map_or_else(|| "user".to_string(), |u| u.name.clone())
        };
        tls::write_private(
            path,
            &tls::kubeconfig(&self.url(), &self.ca_pem, &user, token),
        )
    }

    /// Ends every open watch stream abruptly: the connection closes without the final chunk.
    pub fn drop_watches(&self) {
        self.shared.write().drop_watches();
    }

    /// As after an API-server restart with compaction: every resourceVersion before the
    /// current one is too old (watches from them get the in-stream 410), and open watches end.
    pub fn expire_all(&self) {
        self.shared.write().expire_all();
    }

    /// Every object and the resourceVersion as they are now, as `etcdctl snapshot save` keeps
    /// them, for [`TestServer::restore`].
    pub fn snapshot(&self) -> Snapshot {
        self.shared.read().snapshot()
    }

    /// As etcd restored from `snapshot` without `--bump-revision`, and the API server and the
    /// cluster's components restarted on it: every object is as it was then, versions start
    /// again from the snapshot's, lower than those answered since, and open watches end.
    pub fn restore(&self, snapshot: &Snapshot) {
        self.shared.write().restore(snapshot);
    }

    /// Makes the next matching requests fail (see [`FailRule`]).
    pub fn fail_next(&self, rule: FailRule) {
        self.shared.faults().add(rule);
    }

    /// Makes every request `rule` matches fail for `duration` from now, whatever its count:
    /// a burst of errors, as from an API server that is coming back up.
    pub fn fail_for(&self, rule: FailRule, duration: Duration) {
        self.shared
            .faults()
            .add_until(rule, std::time::Instant::now() + duration);
    }

    /// Ends every failure put in force by [`TestServer::fail_next`] or
    /// [`TestServer::fail_for`]: requests are answered as usual again.
    pub fn clear_failures(&self) {
        self.shared.faults().clear_failures();
    }

    /// Freezes every watch stream open now: its connection stays open and it sends nothing,
    /// no event, no bookmark, not even its end, as a watch does whose node or load balancer
    /// vanished without a reset. Watches opened afterwards are served as usual (to make new
    /// watches hang too, [`TestServer::stall`] the `watch` verb). Ends with
    /// [`TestServer::thaw_watches`]; a frozen stream whose client has gone then ends.
    pub fn freeze_watches(&self) {
        self.shared.faults().freeze_watches();
    }

    /// Ends the freeze: frozen streams send what they held back and go on.
    pub fn thaw_watches(&self) {
        self.shared.faults().thaw_watches();
        self.shared.stall_lifted.notify_all();
    }

    /// Black-holes every TCP connection open now whose last request was authenticated as
    /// `user` (every open connection when `None`, those that carried no request yet included):
    /// idle keep-alive connections, requests in flight, watch streams. Each goes silent for
    /// good, as behind a proxy or NAT that stops forwarding without closing: the server neither
    /// answers nor closes it, reads nothing more from it (what the client sends stays unread in
    /// the socket) and writes nothing more to it, TLS included (no response, watch event,
    /// bookmark or final chunk). A request in flight may still take effect; its answer is
    /// never sent. Connections accepted afterwards, the same user's included, are served as
    /// usual, so a client that gives up on a dead connection and dials again recovers. The
    /// connections stay open until [`TestServer::stop_listening`] or the server is dropped.
    /// Returns how many connections this call silenced.
    pub fn blackhole(&self, user: Option<&str>) -> usize {
        self.shared.blackhole(user)
    }

    /// How many connections are black-holed and held open now.
    pub fn blackholed(&self) -> usize {
        self.shared.blackholed()
    }

    /// Holds matching requests before they are handled (see [`StallRule`]) until
    /// [`TestServer::lift_stall`] with the id returned, or their hold passes.
    pub fn stall(&self, rule: StallRule) -> StallId {
        StallId(self.shared.faults().add_stall(rule))
    }

    /// How many requests stall rules hold now (on arrival, or before their commit), so a test
    /// can wait until a request it sent is held before it acts.
    pub fn stalled(&self) -> usize {
        self.shared.faults().held()
    }

    /// Ends a stall: the requests it holds are handled now, new ones pass.
    pub fn lift_stall(&self, id: StallId) {
        self.shared.faults().lift_stall(id.0);
        self.shared.stall_lifted.notify_all();
    }

    /// Ends every stall.
    pub fn lift_all_stalls(&self) {
        self.shared.faults().lift_all_stalls();
        self.shared.stall_lifted.notify_all();
    }

    /// Starts logging every request from now on (see [`TestServer::request_log`]).
    pub fn record_requests(&self) {
        self.shared.log().get_or_insert_with(Vec::new);
    }

    /// The requests answered since [`TestServer::record_requests`], in the order their answers
    /// were ready. A request still held by a stall is not in it yet ([`TestServer::request_counts`]
    /// counts requests when they arrive).
    pub fn request_log(&self) -> Vec<Logged> {
        self.shared.log().clone().unwrap_or_default()
    }

    /// From now on, every pod created through the API has `patch` (a strategic merge patch:
    /// containers merge by name, so one can add a sidecar) applied after defaulting and before
    /// validation, as a mutating admission webhook's patch is. Patches given in turn apply in
    /// that order. Writes of the simulated cluster and updates are not mutated.
    pub fn mutate_pods(&self, patch: serde_json::Value) {
        self.shared
            .pod_mutations
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(patch);
    }

    /// Ends every [`TestServer::mutate_pods`] mutation.
    pub fn clear_pod_mutations(&self) {
        self.shared
            .pod_mutations
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clear();
    }

    /// Delays every request by `d` before it is handled (`Duration::ZERO` to stop).
    pub fn set_latency(&self, d: Duration) {
        self.shared.faults().latency = d;
    }

    /// Models a real control plane's costs from now on (see [`CostModel`];
    /// `CostModel::default()` turns the model off).
    pub fn set_cost_model(&self, model: CostModel) {
        self.shared.costs.set(model);
    }

    /// Requests in flight at the server since the last call (or the start): the peak and the
    /// time-weighted mean. Starts counting afresh.
    pub fn take_in_flight(&self) -> InFlight {
        self.shared.costs.take_in_flight()
    }

    /// Closes the listener and every connection (black-holed ones too); data and certificates
    /// are kept.
    pub fn stop_listening(&self) {
        let listener = self
            .listener
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(l) = listener {
            l.stop();
        }
        self.shared.write().drop_watches();
        self.shared.close_connections();
    }

    /// Listens again on the same port, with the same data and certificates.
    pub fn start_listening(&self) -> io::Result<()> {
        let mut slot = self.listener.lock().unwrap_or_else(|e| e.into_inner());
        if slot.is_some() {
            return Ok(());
        }
        let (tcp, _) = Listener::bind(self.port)?;
        *slot = Some(Listener::start(self.shared.clone(), tcp)?);
        Ok(())
    }

    /// Handled requests by `(verb, resource)`: verbs get, list, watch, create, update,
    /// patch, delete; resources like `pods`, `immortalcontainers/status`, or the path for
    /// non-resource requests (`/apis`).
    pub fn request_counts(&self) -> BTreeMap<(String, String), u64> {
        self.shared.counts().clone()
    }

    pub fn reset_request_counts(&self) {
        self.shared.counts().clear();
    }

    /// Watch streams currently open.
    pub fn open_watches(&self) -> usize {
        self.shared.read().open_watches()
    }

    /// Cordons `node` as `kubectl cordon` does (the strategic merge patch
    /// `{"spec":{"unschedulable":true}}`): new pods are no longer scheduled to it; its pods
    /// keep running. `false` if there is no such node.
    pub fn cordon(&self, node: &str) -> bool {
        nodes::set_cordoned(&mut self.shared.write(), node, true)
    }

    /// Uncordons `node` as `kubectl uncordon` does (`{"spec":{"unschedulable":null}}`); pods
    /// left Pending as Unschedulable are scheduled again. `false` if there is no such node.
    pub fn uncordon(&self, node: &str) -> bool {
        nodes::set_cordoned(&mut self.shared.write(), node, false)
    }

    /// Registers a new Ready node `name` with its kubelet (pods left Pending as Unschedulable
    /// are scheduled again); `false` if a node of that name exists.
    pub fn add_node(&self, name: &str) -> bool {
        nodes::register(&mut self.shared.write(), name)
    }

    /// Loses `node` with its pods, as when a machine is gone for good: the Node is deleted
    /// (DELETED), and PodGC marks each of its pods Failed (condition DisruptionTarget, reason
    /// DeletionByPodGC) and deletes it with grace 0 (MODIFIED, DELETED), all before this
    /// returns. `false` if there is no such node.
    pub fn lose_node(&self, node: &str) -> bool {
        let mut store = self.shared.write();
        if store
            .delete("nodes", "", node, &store::DeleteOpts::default())
            .is_err()
        {
            return false;
        }
        nodes::collect_orphans(&mut store, node);
        true
    }

    /// Cuts `node` off, as when its machine or network fails but the Node object stays: its
    /// kubelet stops, so nothing it would write is written any more (no status, no pod started
    /// or finished: a pod deleted now stays Terminating for good). After the node lifecycle
    /// controller's grace period (`--node-monitor-grace-period` 40 s, multiplied by
    /// [`KubeletOptions::grace_scale`]: 400 ms by default) the controllers of a v1.28 cluster
    /// react as they do: the Node's Ready, MemoryPressure, DiskPressure and PIDPressure
    /// conditions become Unknown (reason NodeStatusUnknown, message `Kubelet stopped posting
    /// node status.`), its pods get Ready=False (`MarkPodsNotReady`), it is tainted
    /// `node.kubernetes.io/unreachable:NoSchedule`, and `node.kubernetes.io/unreachable:NoExecute`
    /// (with `timeAdded`) unless the zone is in disruption: with no node Ready at all (the
    /// default single node partitioned) the controller enters master disruption mode and
    /// neither taints nor evicts; with more than two nodes and at least 55 % of them not
    /// Ready it taints no more nodes; successive nodes are tainted at least 10 s (scaled)
    /// apart. The taint manager then evicts each pod (condition DisruptionTarget, reason
    /// DeletionByTaintManager, then a graceful DELETE) after its shortest `tolerationSeconds`
    /// for the taint, scaled (the 300 s every pod gets from DefaultTolerationSeconds: 3 s by
    /// default), at once if it does not tolerate it; with the kubelet gone the pod stays
    /// Terminating. A client that then taints the node `node.kubernetes.io/out-of-service`
    /// (as `kubectl taint nodes NODE node.kubernetes.io/out-of-service=nodeshutdown:NoExecute`
    /// does) has the taint manager evict every pod not tolerating that taint and PodGC
    /// force-delete every terminating pod of the node (phase Failed first, then grace 0).
    /// Returns at once; `false` if there is no such node or no simulated cluster runs
    /// (`Options::kubelet: None`).
    pub fn partition_node(&self, node: &str) -> bool {
        self.cluster
            .as_ref()
            .is_some_and(|c| c.partition(node, false))
    }

    /// Ends [`TestServer::partition_node`]: the kubelet posts its node status again (Ready,
    /// no pressure) before this returns, then the controllers remove the unreachable taints
    /// (scheduled evictions are cancelled) and the kubelet syncs its pods: a status others
    /// wrote meanwhile is replaced after `status_sync_delay`, a pod deleted meanwhile is
    /// terminated and removed. `false` if there is no such node or it was not partitioned.
    pub fn heal_node(&self, node: &str) -> bool {
        self.cluster
            .as_ref()
            .is_some_and(|c| c.partition(node, true))
    }

    /// Makes the first running container of pod `ns/pod` exit with `exit_code` once, as a
    /// crash or a finished process would; the kubelet then acts on the pod's `restartPolicy`
    /// (Always: restart with back-off; Never: the pod ends Succeeded or Failed). The status
    /// showing the exit is written before this returns. `false` when no kubelet runs the pod
    /// (its node partitioned included) or none of its containers is running.
    pub fn exit_container(&self, ns: &str, pod: &str, exit_code: i32) -> bool {
        self.cluster
            .as_ref()
            .is_some_and(|c| c.exit_container(ns, pod, None, exit_code))
    }

    /// As [`TestServer::exit_container`], for the container called `container` (a sidecar
    /// among them); `false` when it is not running.
    pub fn exit_named_container(&self, ns: &str, pod: &str, container: &str, code: i32) -> bool {
        self.cluster
            .as_ref()
            .is_some_and(|c| c.exit_container(ns, pod, Some(container), code))
    }

    /// The names of the nodes, in order.
    pub fn node_names(&self) -> Vec<String> {
        nodes::names(&self.shared.read())
    }

    /// The JSON a GET of `path` would answer (an object or a list), bypassing HTTP, auth,
    /// faults and counters; `None` when it would not answer 200.
    pub fn get_json(&self, path: &str) -> Option<serde_json::Value> {
        api::get_direct(&self.shared, path)
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        // Held requests end with the server instead of waiting for a lift that never comes.
        self.lift_all_stalls();
        self.thaw_watches();
        self.stop_listening();
        if self.remove_dir {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads share the store: a GET and lists are answered while another reader holds the
    /// store (with one mutex for everything, they would wait for it). An HTTP test cannot hold
    /// the lock, so this one does it from inside.
    #[test]
    fn reads_are_answered_while_another_read_holds_the_store() {
        let server = TestServer::start(Options {
            kubelet: None,
            ..Options::default()
        })
        .expect("server starts");
        // Nothing writes meanwhile (no kubelet, no request): no writer waits for the lock, so
        // none makes new readers wait behind it.
        let held = server.shared.read();
        let shared = server.shared.clone();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let answered = [
                "/api/v1/namespaces/default",
                "/api/v1/namespaces",
                "/apis/immortalcontainer.flugel.it/v1alpha1/immortalcontainers",
            ]
            .map(|path| api::get_direct(&shared, path).is_some());
            let _ = tx.send(answered);
        });
        let answered = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("reads answered while the store is held for reading");
        assert_eq!(answered, [true, true, true]);
        drop(held);
    }
}
