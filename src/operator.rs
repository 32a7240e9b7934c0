//! Wires the stages together: client → watchers → (leader election) → workers, and takes them
//! down in order on SIGTERM/SIGINT (docs/design.md, "Start-up and shutdown").

use crate::cli::Config;
use crate::immortal::counting::{self, Counting};
use crate::immortal::ic_state::IcStore;
use crate::immortal::lifecycle::{self, CachedPod, IcEventHandler, PodEventHandler, PodHint};
use crate::immortal::reconcile::{self, Context, LiveApi};
use crate::immortal::sweep;
use crate::immortal::types::{API_VERSION, GROUP, IMMORTAL_CONTAINERS, KIND, PLURAL, VERSION};
use crate::kube::client::{self, Client};
use crate::kube::config;
use crate::kube::events::{self, Recorder};
use crate::runtime::controller::{self, spawn_watcher, Sentinel};
use crate::runtime::leader::{self, Elector};
use crate::runtime::liveness;
use crate::runtime::metrics;
use crate::runtime::pool::Pool;
use crate::runtime::queue::Queue;
use crate::runtime::serve::{self, Health};
use crate::runtime::shutdown::{is_quitting, listen_for_signals, quits_within};
use crate::runtime::store::Store;
use crate::runtime::watcher::{Backoff, Relist, Watcher};
use crossbeam_channel::{select, Receiver, RecvTimeoutError, Sender};
use std::collections::HashSet;
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

/// How long start-up keeps trying to reach the API server and find our CRD before it gives up.
const PREFLIGHT_PATIENCE: Duration = Duration::from_secs(30);

/// Longest one start-up check may wait: it runs on the thread that answers signals.
const PREFLIGHT_ATTEMPT: Duration = Duration::from_secs(5);

/// How long start-up waits for one served namespace to be listed before it exits, so that the
/// kubelet's restarts show it, as controller-runtime's cache-sync timeout does.
const SERVE_PATIENCE: Duration = Duration::from_secs(30);

/// How often a served namespace that does not exist is looked up again.
const MISSING_RECHECK: Duration = Duration::from_secs(30);

/// How long a shutdown waits for reconciles, then the Lease's release: within the grace period.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
const RELEASE_TIMEOUT: Duration = Duration::from_secs(2);

/// Exit code for a configuration or cluster problem found at start.
const EXIT_CONFIG: u8 = 1;

/// Runs the operator until a signal; returns the process exit code.
pub fn run(config: Config) -> ExitCode {
    for said in &config.deprecated {
        log::warn!(target: "controller", "{said}");
    }
    // A stage answers `Err(code)` when the process is to exit now.
    run_stages(config).unwrap_or_else(|code| code)
}

/// The stages in order, then a wait for a signal or a dead thread, and the shutdown.
fn run_stages(config: Config) -> Result<ExitCode, ExitCode> {
    let client = connect(&config)?;

    // The first signal drops `quit_tx`, waking every loop that selects on `quit`.
    let (quit_tx, quit) = crossbeam_channel::bounded::<()>(0);
    listen_for_signals(quit_tx)
        .map_err(|e| fail_at_start(&format!("cannot install signal handlers: {e}")))?;

    // Start-up checks and lists come minutes apart: their connections are not kept, so that an
    // idle operator holds only its watch streams.
    let unpooled = client.unpooled();
    preflight(&unpooled, &quit).map_err(|msg| fail_at_start(&msg))?;
    if is_quitting(&quit) {
        return Ok(ExitCode::SUCCESS);
    }
    // Known before the first count, an older CRD keeps that count from being a wrong one (see
    // `counting`); when the CRD cannot be read, the first status write tells.
    let ctx = Arc::new(Context::default());
    if let Some(missing) = read_crd_schema(&unpooled) {
        ctx.counting
            .learn_pruned(&missing, "the installed CRD's schema lacks it");
    }
    // Named when the API server does not keep a field of a pod (docs/templates.md).
    if let Some(version) = read_version(&unpooled) {
        log::info!(target: "controller", server = client.config().server.as_str(); "the API server runs Kubernetes {version}");
        let _ = ctx.version.set(version);
    }

    // Two watches per served namespace: all must be live.
    let watches = config
        .namespaces
        .each()
        .into_iter()
        .flat_map(|ns| {
            [IMMORTAL_CONTAINERS, client::Resource::PODS].map(|r| liveness::watch(r.short(), ns))
        })
        .collect();
    let health = Arc::new(Health::new(watches, config.watch_idle_timeout));
    // The server is `http[s]://HOST[:PORT][/PREFIX]`: loading the configuration made sure.
    let host = client.config().server.split('/').nth(2).unwrap_or("");
    serve::start(&config.endpoints, health.clone(), host.into(), &client)
        .map_err(|msg| fail_at_start(&msg))?;

    let (dead_tx, dead) = crossbeam_channel::unbounded::<&'static str>();
    let stages = Arc::new(Stages {
        config,
        client,
        unpooled,
        quit,
        queue: Arc::new(Queue::new()),
        health,
        dead_tx,
        dead,
        ctx,
        // What the ImmortalContainer watcher knows, which reconcile reads instead of the API.
        ics: Arc::new(IcStore::new()),
        pods: Arc::new(Store::new()),
    });
    let ic_relists = Relist::every(stages.config.relist_period);
    stages.start_watchers(&ic_relists)?;
    stages.recheck_crd(ic_relists)?;
    stages.start_sweep()?;

    let (stop_renewing_tx, stop_renewing) = crossbeam_channel::bounded::<()>(0);
    let elector = stages.elect(stop_renewing)?;
    // Each worker and the events thread hold a sender; all are gone once they have all ended.
    let (finished_tx, finished) = crossbeam_channel::bounded::<()>(0);
    stages.start_workers(elector.as_ref(), &finished_tx)?;

    select! {
        recv(stages.quit) -> _ => {}
        recv(stages.dead) -> r => {
            let what = r.unwrap_or("thread");
            return Err(fail_running(&format!("a {what} thread died; exiting so the kubelet restarts the operator")));
        }
    }

    // Workers finish their reconcile (abandoned after DRAIN_TIMEOUT: requests cannot be cancelled).
    log::info!(target: "controller", "shutting down: finishing in-flight reconciles");
    let started = Instant::now();
    stages.queue.shutdown();
    drop(finished_tx);
    if let Err(RecvTimeoutError::Timeout) = finished.recv_deadline(started + DRAIN_TIMEOUT) {
        log::warn!(
            target: "controller", elapsed_ms = started.elapsed().as_millis() as u64;
            "in-flight reconciles still wait on the API server; abandoning them"
        );
    }
    if let Some(e) = elector {
        drop(stop_renewing_tx);
        e.release(RELEASE_TIMEOUT);
    }
    log::info!(target: "controller", elapsed_ms = started.elapsed().as_millis() as u64; "stopped");
    log::logger().flush();
    Ok(ExitCode::SUCCESS)
}

/// Loads the configuration and builds the client every thread shares.
fn connect(config: &Config) -> Result<Client, ExitCode> {
    let cluster = config::load(&config.cluster).map_err(|e| fail_at_start(&e.to_string()))?;
    // A connection per worker, and for watchers, events and lease; every request is counted.
    let client = Client::new(cluster, config.max_workers + 4)
        .map_err(|e| fail_at_start(&e.to_string()))?
        .reporting(metrics::record_request);
    let cluster = client.config();
    log::info!(
        target: "controller",
        server = cluster.server.as_str(), config = cluster.source.as_str(),
        proxy = cluster.proxy.as_ref().map_or("none", |p| p.shown.as_str()),
        namespace = config.namespaces.shown().as_str(), workers = config.workers as u64,
        version = env!("CARGO_PKG_VERSION");
        "starting"
    );
    Ok(client)
}

/// What the stages after the start-up checks, and the threads they start, share.
struct Stages {
    config: Config,
    client: Client,
    /// The unpooled client of start-up checks and lists.
    unpooled: Client,
    quit: Receiver<()>,
    queue: Arc<Queue<PodHint>>,
    health: Arc<Health>,
    /// Where a dying thread's [`Sentinel`] says so.
    dead_tx: Sender<&'static str>,
    dead: Receiver<&'static str>,
    ctx: Arc<Context>,
    ics: Arc<IcStore>,
    /// What the pod watcher knows of each key's pod.
    pods: Arc<Store<CachedPod>>,
}

impl Stages {
    fn sentinel(&self, name: &'static str) -> Sentinel {
        Sentinel {
            health: self.health.clone(),
            dead: self.dead_tx.clone(),
            name,
        }
    }

    /// Watchers of ImmortalContainers and our pods per served namespace, which fill the queue
    /// on a standby too, so that a new leader starts warm. Returns once every first list was
    /// answered and one namespace's lists are in; the others are served once theirs are.
    fn start_watchers(self: &Arc<Self>, ic_relists: &Relist) -> Result<(), ExitCode> {
        let (synced_tx, synced) = crossbeam_channel::unbounded();
        let idle = self.config.watch_idle_timeout;
        let failed = |e| fail_at_start(&format!("cannot start watcher thread: {e}"));
        let namespaces = self.config.namespaces.each();
        for namespace in &namespaces {
            let namespace = namespace.map(str::to_string);
            let ics = Watcher::new(
                self.unpooled.clone(),
                lifecycle::immortal_containers_kind(namespace.clone()),
                IcEventHandler,
                self.queue.clone(),
                self.quit.clone(),
                synced_tx.clone(),
                idle,
            );
            let pods = Watcher::new(
                self.unpooled.clone(),
                lifecycle::pods_kind(namespace),
                PodEventHandler,
                self.queue.clone(),
                self.quit.clone(),
                synced_tx.clone(),
                idle,
            );
            let ics = ics.relisting(ic_relists.clone()).sharing(self.ics.clone());
            spawn_watcher(ics, self.sentinel("watcher")).map_err(failed)?;
            // Every pod watcher keeps its pods in one store, under the objects' own keys.
            let objects = self.ics.clone();
            let pods = pods
                .relisting(Relist::every(self.config.relist_period))
                .sharing(self.pods.clone())
                .keys_from(Box::new(move |key| objects.key(key)));
            spawn_watcher(pods, self.sentinel("watcher")).map_err(failed)?;
        }
        drop(synced_tx);
        let deadline = Instant::now() + SERVE_PATIENCE;
        let mut answered = HashSet::new();
        loop {
            let served = namespaces.iter().any(|ns| self.listed(*ns));
            let past = Instant::now() >= deadline;
            if served && (answered.len() == self.health.watches.len() || past) {
                break;
            }
            if past {
                let why = self.health.ready().err().unwrap_or_default();
                return Err(fail_running(&format!(
                    "no served namespace could be listed in {}s: {why}; exiting, for the kubelet to try again \
                     (check the operator's RBAC: its ClusterRole, or each served namespace's Role)",
                    SERVE_PATIENCE.as_secs()
                )));
            }
            select! {
                recv(synced) -> r => match r {
                    Ok(watch) => {
                        answered.insert((watch.resource, watch.namespace));
                        if watch.has_listed() {
                            log::info!(
                                target: "controller",
                                resource = watch.resource, namespace = watch.namespace.unwrap_or("(all)");
                                "initial list complete"
                            );
                        }
                    }
                    Err(_) => return Err(fail_running("a watcher stopped before its first list")),
                },
                recv(crossbeam_channel::at(deadline)) -> _ => {}
                recv(self.dead) -> _ => return Err(fail_running("a watcher thread died")),
                recv(self.quit) -> _ => return Err(stopped()),
            }
        }
        let mut pending = Vec::new();
        for ns in namespaces {
            if self.listed(ns) {
                self.now_served(ns);
                continue;
            }
            pending.push(ns.map(str::to_string));
            if let Some(why) = self.unserved_reason(ns) {
                log::warn!(
                    target: "controller", namespace = ns.unwrap_or("(all)"), error = why.as_str();
                    "namespace {} is not served: {why}; the others are, and its lists are tried again with back-off",
                    ns.unwrap_or("(all)")
                );
            }
        }
        let me = self.clone();
        spawn("namespaces", move || me.serve_namespaces(pending, synced))
    }

    /// Whether every watch of `namespace` has listed.
    fn listed(&self, namespace: Option<&str>) -> bool {
        self.health
            .watches
            .iter()
            .filter(|w| w.namespace == namespace)
            .all(|w| w.has_listed())
    }

    /// Why `namespace` is not served, as its watches' failed lists say.
    fn unserved_reason(&self, namespace: Option<&str>) -> Option<String> {
        let reasons: Vec<String> = self
            .health
            .watches
            .iter()
            .filter(|w| w.namespace == namespace)
            .filter_map(|w| w.unlisted())
            .collect();
        (!reasons.is_empty()).then(|| reasons.join("; "))
    }

    /// `namespace`'s lists are in: its objects without a pod go first; a missing namespace is said.
    fn now_served(&self, namespace: Option<&str>) {
        let missing =
            lifecycle::queue_objects_without_a_pod(&self.ics, &self.pods, &self.queue, namespace);
        if missing > 0 {
            log::info!(target: "controller", namespace = namespace.unwrap_or("(all)"), objects = missing as u64; "objects without a pod go first");
        }
        if let Some(ns) = namespace.filter(|ns| does_not_exist(&self.unpooled, ns)) {
            log::warn!(
                target: "controller", namespace = ns;
                "served namespace {ns} does not exist: nothing is reconciled there until it is made, and then at once"
            );
            crate::util::lock(&self.health.missing).insert(ns.to_string());
        }
    }

    /// Until shutdown, serves each `pending` namespace once its lists complete, and looks up
    /// those that do not exist every [`MISSING_RECHECK`].
    fn serve_namespaces(
        &self,
        mut pending: Vec<Option<String>>,
        synced: Receiver<&'static liveness::Watch>,
    ) {
        let mut synced = Some(synced);
        let mut recheck = Instant::now() + MISSING_RECHECK;
        loop {
            let listed = synced.clone().unwrap_or_else(crossbeam_channel::never);
            select! {
                recv(listed) -> r => {
                    if r.is_err() {
                        // Every watcher has listed: nothing more comes.
                        synced = None;
                    }
                    pending.retain(|ns| {
                        let listed = self.listed(ns.as_deref());
                        if listed {
                            log::info!(target: "controller", namespace = ns.as_deref().unwrap_or("(all)"); "namespace served now: its lists are in");
                            self.now_served(ns.as_deref());
                        }
                        !listed
                    });
                }
                recv(crossbeam_channel::at(recheck)) -> _ => {
                    recheck = Instant::now() + MISSING_RECHECK;
                    let missing: Vec<String> = crate::util::lock(&self.health.missing).iter().cloned().collect();
                    for ns in missing {
                        if !does_not_exist(&self.unpooled, &ns) {
                            log::info!(target: "controller", namespace = ns.as_str(); "served namespace {ns} exists now");
                            crate::util::lock(&self.health.missing).remove(&ns);
                        }
                    }
                }
                recv(self.quit) -> _ => return,
            }
        }
    }

    /// While the CRD prunes what we write, reads it every [`counting::RECHECK`] for an upgrade.
    fn recheck_crd(self: &Arc<Self>, relists: Relist) -> Result<(), ExitCode> {
        let me = self.clone();
        spawn("crd", move || {
            while !quits_within(&me.quit, counting::RECHECK) {
                if me.ctx.counting.any_pruned()
                    && read_crd_schema(&me.unpooled).is_some_and(|m| me.ctx.counting.relearn(&m))
                {
                    relists.ask();
                }
            }
        })
    }

    /// The start-up sweep (see `sweep`), on a thread of its own: reconciling does not wait.
    fn start_sweep(self: &Arc<Self>) -> Result<(), ExitCode> {
        let me = self.clone();
        spawn("sweep", move || {
            for namespace in me.config.namespaces.each() {
                sweep::run(&me.unpooled, namespace, &me.queue, &me.quit);
            }
        })
    }

    /// With `--leader-elect`, waits until this replica holds the Lease, and keeps renewing it on
    /// a thread of its own until `stop_renewing` closes; without, this replica leads.
    fn elect(&self, stop_renewing: Receiver<()>) -> Result<Option<Arc<Elector>>, ExitCode> {
        let Some(mut settings) = self.config.leader.clone() else {
            metrics::set_leader(true);
            return Ok(None);
        };
        if settings.namespace.is_empty() {
            let default = self.client.config().default_namespace.clone();
            settings.namespace = default.unwrap_or_else(|| "default".into());
        }
        let elector = Arc::new(Elector::new(self.client.clone(), settings));
        // On a thread of its own, so that a signal is answered while a request hangs. Renewal
        // goes on during shutdown until the release, so that reconciles finishing are not fenced.
        let (leading_tx, leading) = crossbeam_channel::bounded::<()>(1);
        let (e, quit) = (elector.clone(), self.quit.clone());
        spawn("lease", move || {
            if !e.acquire(&quit) {
                return;
            }
            let _ = leading_tx.send(());
            if e.keep_renewing(&stop_renewing).is_err() {
                // The fence is closed already: nothing more is written while we exit.
                log::logger().flush();
                std::process::exit(1);
            }
        })?;
        select! {
            recv(leading) -> r => if r.is_err() { return Err(stopped()) },
            recv(self.quit) -> _ => return Err(stopped()),
        }
        Ok(Some(elector))
    }

    /// The Event recorder's thread and the reconcile workers, all writing through the fence.
    fn start_workers(
        self: &Arc<Self>,
        elector: Option<&Arc<Elector>>,
        finished: &Sender<()>,
    ) -> Result<(), ExitCode> {
        let (writer, identity) = match elector {
            Some(e) => (self.client.fenced(e.fence()), e.identity().to_string()),
            None => (self.client.clone(), leader::identity()),
        };
        let (recorder, inbox) = Recorder::channel(events::Kind {
            api_version: API_VERSION,
            kind: KIND,
        });
        let (events_client, events_finished) = (writer.clone(), finished.clone());
        spawn("events", move || {
            let _finished = events_finished;
            events::run(events_client, inbox, "immortal-operator", identity)
        })?;
        let workers = Arc::new(Workers {
            stages: self.clone(),
            api: LiveApi {
                client: writer,
                events: recorder.reporting_drops(metrics::events_dropped),
                ics: self.ics.clone(),
            },
            pool: Pool::new(self.config.workers, self.config.max_workers),
            run_id: crate::util::rand_u64() as u16,
            _finished: finished.clone(),
            started: AtomicUsize::new(0),
        });
        for _ in 0..self.config.workers {
            if !workers.pool.start() {
                break;
            }
            if let Err(e) = workers.spawn() {
                return Err(fail_running(&format!("cannot start worker thread: {e}")));
            }
        }
        log::info!(
            target: "controller", workers = self.config.workers as u64, max_workers = workers.pool.max() as u64;
            "reconciling"
        );
        Ok(())
    }
}

/// What every reconcile worker shares, and how one more is started (see `runtime::pool`).
struct Workers {
    stages: Arc<Stages>,
    api: LiveApi,
    pool: Pool,
    run_id: u16,
    /// Held until the last worker ends: what the shutdown waits for.
    _finished: Sender<()>,
    /// Workers started so far, to name the next thread.
    started: AtomicUsize,
}

impl Workers {
    /// Starts one worker thread, already counted in the pool.
    fn spawn(self: &Arc<Self>) -> std::io::Result<()> {
        let i = self.started.fetch_add(1, Ordering::Relaxed);
        let sentinel = self.stages.sentinel("worker");
        let me = self.clone();
        thread::Builder::new()
            .name(format!("reconcile-{i}"))
            .spawn(move || {
                let _sentinel = sentinel;
                controller::work(
                    &me.stages.queue,
                    me.run_id,
                    &me.pool,
                    || match me.spawn() {
                        Ok(()) => true,
                        Err(e) => {
                            log::warn!(target: "controller", error = e.to_string().as_str(); "cannot start one worker more");
                            false
                        }
                    },
                    |trace, hint| reconcile::reconcile(&me.api, &me.stages.ctx, trace, hint),
                )
            })
            .map(drop)
    }
}

/// Checks that the server answers and serves our resource, retrying for [`PREFLIGHT_PATIENCE`].
fn preflight(client: &Client, quit: &Receiver<()>) -> Result<(), String> {
    let path = format!("/apis/{GROUP}/{VERSION}");
    let deadline = Instant::now() + PREFLIGHT_PATIENCE;
    let mut backoff = Backoff::new();
    let mut warned: Option<String> = None;
    loop {
        let attempt = client.until(Instant::now() + PREFLIGHT_ATTEMPT);
        let Err(err) = attempt.get_path::<serde_json::Value>(&path) else {
            return Ok(());
        };
        let server = &client.config().server;
        // What is wrong, without the error itself: it goes into the `error` field once.
        let what = match &err {
            e if e.is_unauthorized() => {
                return Err(format!("the API server at {server} refused our credentials (401 Unauthorized); check the kubeconfig user"))
            }
            e if e.is_forbidden() => return Err(format!("the API server at {server} forbids reading {path}: {e}")),
            e if e.is_not_found() => format!(
                "the API server at {server} does not serve {GROUP}/{VERSION}: the ImmortalContainer CRD is not installed \
                 (install it with `make install` or `kubectl apply -k config/crd`)"
            ),
            client::Error::Credentials(e) => return Err(format!("cannot get credentials: {e}")),
            // A proxy that wants other credentials, or will not tunnel to this server.
            client::Error::Proxy { status: 401 | 403 | 407, message } => {
                return Err(format!("{message}; check the proxy's credentials and policy (proxy-url, or HTTPS_PROXY)"))
            }
            client::Error::Proxy { status: 0, .. } => {
                let shown = client.config().proxy.as_ref().map_or("", |p| p.shown.as_str());
                format!("cannot reach the proxy {shown} (for the API server at {server})")
            }
            client::Error::Proxy { .. } => format!("the proxy cannot reach the API server at {server}"),
            client::Error::Tls(e) => match client.config().tls_misconfigured(e) {
                Some(line) => return Err(line),
                None => format!("cannot reach the API server at {server}"),
            },
            _ => format!("cannot reach the API server at {server}"),
        };
        let patience = PREFLIGHT_PATIENCE.as_secs();
        if Instant::now() >= deadline {
            return Err(if err.is_not_found() {
                format!("{what} (waited {patience}s)")
            } else {
                format!("{what} (tried for {patience}s): {err}")
            });
        }
        let error = err.to_string();
        if warned.as_deref() == Some(what.as_str()) {
            log::debug!(target: "controller", error = error.as_str(); "{what}; retrying");
        } else {
            log::warn!(
                target: "controller", error = error.as_str();
                "{what}; retrying for up to {patience}s"
            );
            warned = Some(what);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if quits_within(quit, backoff.next_delay().min(left)) {
            return Ok(());
        }
    }
}

/// Whether served namespace `ns` does not exist (404); a 403 leaves it to the lists to say.
fn does_not_exist(client: &Client, ns: &str) -> bool {
    let attempt = client.until(Instant::now() + PREFLIGHT_ATTEMPT);
    match attempt.get_path::<serde_json::Value>(&format!("/api/v1/namespaces/{ns}")) {
        Ok(_) => false,
        Err(e) if e.is_not_found() => true,
        Err(e) => {
            log::debug!(target: "controller", namespace = ns, error = e.to_string().as_str(); "cannot read the namespace; whether it exists is left to its lists");
            false
        }
    }
}

/// The status fields the installed CRD's schema lacks, or `None` when it cannot tell.
fn read_crd_schema(client: &Client) -> Option<Vec<&'static str>> {
    let path = format!("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{PLURAL}.{GROUP}");
    let attempt = client.until(Instant::now() + PREFLIGHT_ATTEMPT);
    match attempt.get_path::<serde_json::Value>(&path) {
        Ok(crd) => Counting::missing_in_crd(&crd, VERSION),
        Err(e) => {
            log::debug!(target: "controller", error = e.to_string().as_str(); "cannot read the CRD; an older schema shows on status writes");
            None
        }
    }
}

/// The API server's Kubernetes version (`/version`'s `gitVersion`), if it answers.
fn read_version(client: &Client) -> Option<String> {
    let attempt = client.until(Instant::now() + PREFLIGHT_ATTEMPT);
    match attempt.get_path::<serde_json::Value>("/version") {
        Ok(v) => v["gitVersion"].as_str().map(str::to_string),
        Err(e) => {
            log::debug!(target: "controller", error = e.to_string().as_str(); "cannot read the API server's version");
            None
        }
    }
}

/// Starts the thread `name`; not being able to ends the process.
fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> Result<(), ExitCode> {
    thread::Builder::new()
        .name(name.into())
        .spawn(f)
        .map(drop)
        .map_err(|e| fail_running(&format!("cannot start the {name} thread: {e}")))
}

fn fail_at_start(msg: &str) -> ExitCode {
    // One message, where a person looks: plain on stderr; JSON log collectors get it too.
    if crate::runtime::logging::is_json() {
        log::error!(target: "controller", "{msg}");
        log::logger().flush();
    }
    eprintln!("immortal-operator: {msg}");
    ExitCode::from(EXIT_CONFIG)
}

fn fail_running(msg: &str) -> ExitCode {
    log::error!(target: "controller", "{msg}");
    log::logger().flush();
    ExitCode::FAILURE
}

fn stopped() -> ExitCode {
    log::info!(target: "controller", "stopped before reconciling");
    log::logger().flush();
    ExitCode::SUCCESS
}
