//! The cluster around the API server: the scheduler, one kubelet per node, PodGC, the node
//! lifecycle controller and the NoExecute taint manager, driven by one thread. It hears about
//! pods and nodes through the store's tap (keys and versions, never objects), keeps its timers
//! in a heap, and writes as a client would, without HTTP: the scheduler's and kubelets'
//! decisions are made outside the store lock and committed under the write lock only if the
//! pod is still as read. No thread per pod: 10,000 pods cost one map entry and a timer each,
//! a few hundred bytes of kubelet state a pod.

use crate::kubelet::{KubeletOptions, Placement, PodRun, Write};
use crate::lifecycle::{self, ZoneState};
use crate::nodes;
use crate::runtime;
use crate::scheduler::{self, Candidate, Decision};
use crate::shared::Shared;
use crate::store::{DeleteOpts, Event, EventType, Obj, Store};
use crate::taints;
use crate::util;
use serde_json::Value;
use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap, HashMap};
use std::io;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// `(namespace, name)` of a pod.
type Key = (String, String);

/// What the thread is told.
enum Msg {
    /// A pod changed (any event) at this resourceVersion.
    Pod { key: Key, rv: u64 },
    /// A node was added, changed or deleted.
    Node { name: String, deleted: bool },
    /// `TestServer::exit_container`: answered on `reply` once the exit is written.
    ExitContainer {
        key: Key,
        /// The container's name; `None`: the first running one.
        container: Option<String>,
        code: i32,
        reply: Sender<bool>,
    },
    /// `TestServer::partition_node` (`heal: false`) and `heal_node`: answered once the
    /// kubelet has stopped, or has resumed and posted its node status.
    Partition {
        node: String,
        heal: bool,
        reply: Sender<bool>,
    },
}

/// What a timer wakes.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Wake {
    /// The pod's kubelet.
    Pod(Key),
    /// The node lifecycle controller, for this node (its grace period ended, or the NoExecute
    /// rate limit lets the next taint through).
    Node(String),
    /// The taint manager's eviction of this pod.
    Eviction(Key),
}

/// The test server's way to reach the running cluster.
pub struct Handle {
    tx: Sender<Msg>,
}

impl Handle {
    /// Makes the first running container of the pod exit with `code`; `false` when the pod is
    /// unknown to the kubelets or none of its containers runs.
    pub fn exit_container(&self, ns: &str, name: &str, container: Option<&str>, code: i32) -> bool {
        self.ask(|reply| Msg::ExitContainer {
            key: (ns.to_string(), name.to_string()),
            container: container.map(str::to_string),
            code,
            reply,
        })
    }

    /// Stops (`heal: false`) or resumes the kubelet of `node`; `false` when there is no such
    /// node (or, to heal, it was not partitioned).
    pub fn partition(&self, node: &str, heal: bool) -> bool {
        self.ask(|reply| Msg::Partition {
            node: node.to_string(),
            heal,
            reply,
        })
    }

    /// Sends the message `msg` makes around a reply channel and waits for its answer: `false`
    /// when the cluster thread is gone or does not answer within 10 s.
    fn ask(&self, msg: impl FnOnce(Sender<bool>) -> Msg) -> bool {
        let (reply, answer) = mpsc::channel();
        if self.tx.send(msg(reply)).is_err() {
            return false;
        }
        answer
            .recv_timeout(Duration::from_secs(10))
            .unwrap_or(false)
    }
}

/// Makes pod deletion graceful, installs the tap and starts the thread.
pub fn start(shared: &Arc<Shared>, opts: KubeletOptions) -> io::Result<Handle> {
    let (tx, rx) = mpsc::channel();
    let tap_tx = tx.clone();
    {
        let mut store = shared.write();
        store.set_graceful_pods(true);
        store.set_tap(Box::new(move |key: &str, ev: &Event| {
            let meta = &ev.object["metadata"];
            let name = meta["name"].as_str().unwrap_or("").to_string();
            let msg = match key {
                "pods" => Msg::Pod {
                    key: (meta["namespace"].as_str().unwrap_or("").to_string(), name),
                    rv: ev.rv,
                },
                "nodes" => Msg::Node {
                    name,
                    deleted: ev.typ == EventType::Deleted,
                },
                _ => return,
            };
            // Unbounded: never blocks the writer holding the write lock.
            let _ = tap_tx.send(msg);
        }));
    }
    let weak = Arc::downgrade(shared);
    std::thread::Builder::new()
        .name("kube-testserver-kubelet".into())
        .spawn(move || run(weak, rx, opts))?;
    Ok(Handle { tx })
}

/// How long the thread sleeps with nothing to do before checking the server still exists.
const IDLE: Duration = Duration::from_secs(1);
/// Pods synced per turn of read, decide, commit (see [`Cluster::sync_pods`]): one lock
/// acquisition of each kind for many pods, and a write-lock hold short enough (the commits
/// of this many pods) that API requests get in between during a flood.
const CHUNK: usize = 64;

fn run(weak: Weak<Shared>, rx: Receiver<Msg>, opts: KubeletOptions) {
    let mut cluster = Cluster::new(opts);
    let mut dirty: BTreeSet<Key> = BTreeSet::new();
    let mut node_changes: Vec<(String, bool)> = Vec::new();
    let mut controls: Vec<(Key, Option<String>, i32, Sender<bool>)> = Vec::new();
    let mut partitions: Vec<(String, bool, Sender<bool>)> = Vec::new();
    loop {
        let wait = cluster
            .timers
            .peek()
            .map_or(IDLE, |Reverse((t, _))| {
                t.saturating_duration_since(Instant::now())
            })
            .min(IDLE);
        let first = match rx.recv_timeout(wait) {
            Ok(m) => Some(m),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => return,
        };
        for msg in first
            .into_iter()
            .chain(std::iter::from_fn(|| rx.try_recv().ok()))
        {
            match msg {
                Msg::Pod { key, rv } => {
                    // Changes up to the kubelet's own last write were seen when it wrote.
                    if cluster.pods.get(&key).is_none_or(|r| rv > r.written_rv) {
                        dirty.insert(key);
                    }
                }
                Msg::Node { name, deleted } => node_changes.push((name, deleted)),
                Msg::ExitContainer {
                    key,
                    container,
                    code,
                    reply,
                } => controls.push((key, container, code, reply)),
                Msg::Partition { node, heal, reply } => partitions.push((node, heal, reply)),
            }
        }
        let mut due = Due::default();
        cluster.due_timers(Instant::now(), &mut dirty, &mut due);
        if dirty.is_empty()
            && node_changes.is_empty()
            && controls.is_empty()
            && partitions.is_empty()
            && due.is_empty()
        {
            if weak.strong_count() == 0 {
                return;
            }
            continue;
        }
        let Some(shared) = weak.upgrade() else {
            return;
        };
        for (node, heal, reply) in partitions.drain(..) {
            let mut store = shared.write();
            let done = cluster.partition(&mut store, &node, heal, Instant::now(), &mut dirty);
            let _ = reply.send(done);
        }
        if !node_changes.is_empty() || due.nodes {
            let mut store = shared.write();
            for (name, deleted) in node_changes.drain(..) {
                cluster.node_changed(&mut store, &name, deleted, &mut dirty);
            }
            cluster.node_lifecycle(&mut store, Instant::now());
        }
        let keys: Vec<Key> = std::mem::take(&mut dirty).into_iter().collect();
        for chunk in keys.chunks(CHUNK) {
            cluster.sync_pods(&shared, chunk, Instant::now());
        }
        if !due.evictions.is_empty() {
            let mut store = shared.write();
            for key in due.evictions.drain(..) {
                cluster.evict_if_due(&mut store, &key, Instant::now());
            }
        }
        for (key, container, code, reply) in controls.drain(..) {
            let mut store = shared.write();
            let now = Instant::now();
            let partitioned = &cluster.partitioned;
            let exited = cluster
                .pods
                .get_mut(&key)
                .filter(|run| !partitioned.contains_key(&run.node))
                .is_some_and(|run| run.exit_container(container.as_deref(), code, now));
            if exited {
                cluster.sync_pod(&mut store, &key, now);
            }
            let _ = reply.send(exited);
        }
    }
}

/// What came due on the timers besides pods, for one turn of the loop.
#[derive(Default)]
struct Due {
    /// Some node needs the node lifecycle controller.
    nodes: bool,
    /// Pods whose taint-manager eviction is due.
    evictions: Vec<Key>,
}

impl Due {
    fn is_empty(&self) -> bool {
        !self.nodes && self.evictions.is_empty()
    }
}

/// One pod's sync decided from the pod as read, with no store lock held, as a scheduler and a
/// kubelet decide from their caches: what they write for it, committed only if the pod (and
/// the nodes) are still as read.
struct Plan {
    /// The pod as read.
    read: Obj,
    /// The node the pod runs on, as read.
    node: String,
    /// The scheduler's write, for a pod that was not bound: the pod bound to `node`.
    bind: Option<Value>,
    /// The kubelet's state after this sync: advanced, or admitted now (`admitted`: the pod
    /// counts on the node and takes its next pod IP, so the plan counts on those before it).
    run: PodRun,
    admitted: bool,
    /// The kubelet's writes, those that would change nothing left out.
    writes: Vec<Write>,
}

/// The state of the scheduler, the kubelets and the node controllers.
struct Cluster {
    opts: KubeletOptions,
    /// Pods a kubelet runs.
    pods: HashMap<Key, PodRun>,
    /// Pods bound per node, for the scheduler's spreading.
    per_node: HashMap<String, usize>,
    /// The next pod IP per node.
    next_ip: HashMap<String, u32>,
    /// Pods no node could take, or bound to a node that does not exist: retried when a node
    /// is added or becomes schedulable.
    waiting: BTreeSet<Key>,
    timers: BinaryHeap<Reverse<(Instant, Wake)>>,
    /// The wake-up each pod or node has in the heap (older entries are stale).
    timer_of: HashMap<Wake, Instant>,
    /// Nodes whose kubelet is stopped (`partition_node`), since when.
    partitioned: HashMap<String, Instant>,
    /// Whether each node was Ready when the lifecycle controller last looked, so it marks the
    /// pods of a node not Ready once, when it stops being Ready.
    ready_seen: HashMap<String, bool>,
    /// The taint manager's scheduled evictions: when each pod goes.
    evictions: HashMap<Key, Instant>,
    /// The earliest moment the next node may be tainted NoExecute (the eviction rate limit).
    next_no_execute: Instant,
}

fn meta_str<'a>(v: &'a Obj, field: &str) -> &'a str {
    v["metadata"][field].as_str().unwrap_or("")
}

impl Cluster {
    fn new(opts: KubeletOptions) -> Cluster {
        Cluster {
            opts,
            pods: HashMap::new(),
            per_node: HashMap::new(),
            next_ip: HashMap::new(),
            waiting: BTreeSet::new(),
            timers: BinaryHeap::new(),
            timer_of: HashMap::new(),
            partitioned: HashMap::new(),
            ready_seen: HashMap::new(),
            evictions: HashMap::new(),
            next_no_execute: Instant::now(),
        }
    }

    /// A controller wait of the real cluster, scaled as the kubelet's grace periods are.
    fn scaled(&self, d: Duration) -> Duration {
        runtime::scaled(d, self.opts.grace_scale)
    }

    /// Sets the one wake-up of `what` to `at` (a later call replaces it).
    fn wake_at(&mut self, what: Wake, at: Instant) {
        if self.timer_of.get(&what) != Some(&at) {
            self.timer_of.insert(what.clone(), at);
            self.timers.push(Reverse((at, what)));
        }
    }

    /// Moves pods whose kubelet wake-up is due to `dirty`, and the rest to `due`.
    fn due_timers(&mut self, now: Instant, dirty: &mut BTreeSet<Key>, due: &mut Due) {
        while let Some(Reverse((t, _))) = self.timers.peek() {
            if *t > now {
                break;
            }
            let Some(Reverse((t, what))) = self.timers.pop() else {
                break;
            };
            if self.timer_of.get(&what) != Some(&t) {
                continue;
            }
            self.timer_of.remove(&what);
            match what {
                Wake::Pod(key) => {
                    dirty.insert(key);
                }
                Wake::Node(_) => due.nodes = true,
                Wake::Eviction(key) => due.evictions.push(key),
            }
        }
    }

    /// `partition_node` (the node's kubelet stops: nothing it would write is written, and the
    /// lifecycle controller marks the node Unknown after its grace period) and `heal_node`
    /// (the kubelet posts its node status again and syncs its pods).
    fn partition(
        &mut self,
        store: &mut Store,
        node: &str,
        heal: bool,
        now: Instant,
        dirty: &mut BTreeSet<Key>,
    ) -> bool {
        let Some(cur) = store.get("nodes", "", node) else {
            return false;
        };
        if !heal {
            let since = *self.partitioned.entry(node.to_string()).or_insert(now);
            let grace = self.scaled(lifecycle::NODE_MONITOR_GRACE);
            self.wake_at(Wake::Node(node.to_string()), since + grace);
            return true;
        }
        if self.partitioned.remove(node).is_none() {
            return false;
        }
        self.timer_of.remove(&Wake::Node(node.to_string()));
        let next = lifecycle::kubelet_status(&cur, &util::now_rfc3339());
        if next != *cur {
            store.update("nodes", next, cur);
        }
        dirty.extend(
            self.pods
                .iter()
                .filter(|(_, r)| r.node == node)
                .map(|(k, _)| k.clone()),
        );
        true
    }

    /// The node lifecycle controller's pass over every node (`monitorNodeHealth` and the
    /// tainting passes, at once where the real one polls): a partitioned node past its grace
    /// period is marked Unknown, the pods of a node that stopped being Ready are marked not
    /// Ready, and the condition taints follow the Ready condition: NoSchedule ones at once,
    /// NoExecute ones one node per 10 s (scaled) and none while the zone (every node here) is
    /// in disruption, as `handleDisruption` decides.
    fn node_lifecycle(&mut self, store: &mut Store, now: Instant) {
        let grace = self.scaled(lifecycle::NODE_MONITOR_GRACE);
        let stamp = util::now_rfc3339();
        let partitioned: Vec<(String, Instant)> = self
            .partitioned
            .iter()
            .map(|(n, t)| (n.clone(), *t))
            .collect();
        for (name, since) in partitioned {
            if now < since + grace {
                self.wake_at(Wake::Node(name), since + grace);
                continue;
            }
            if let Some(cur) = store.get("nodes", "", &name) {
                if let Some(next) = lifecycle::unknown_status(&cur, &stamp) {
                    store.update("nodes", next, cur);
                }
            }
        }
        for name in nodes::names(store) {
            let Some(cur) = store.get("nodes", "", &name) else {
                continue;
            };
            let ready = lifecycle::ready_status(&cur) == "True";
            if self.ready_seen.insert(name.clone(), ready) == Some(true) && !ready {
                lifecycle::mark_pods_not_ready(store, &name);
            }
            if let Some(next) = lifecycle::no_schedule_taints(&cur, &stamp) {
                store.update("nodes", next, cur);
            }
        }
        let (all, _) = store.list("nodes", None, None, 0, |_| true);
        let zone = lifecycle::zone_state(&all);
        for node in all {
            let name = node["metadata"]["name"].as_str().unwrap_or("").to_string();
            let want = lifecycle::wanted_no_execute(&node);
            let next = match (want, zone) {
                // markNodeAsReachable: a Ready node, or every node in master disruption mode.
                (None, _) | (Some(_), ZoneState::FullDisruption) => {
                    lifecycle::no_execute_taint(&node, None, &stamp)
                }
                (Some(_), ZoneState::PartialDisruption) => None,
                // A taint of the other kind is swapped at once; a new one waits its turn.
                (Some(_), ZoneState::Normal) if lifecycle::has_no_execute_taint(&node) => {
                    lifecycle::no_execute_taint(&node, want, &stamp)
                }
                (Some(_), ZoneState::Normal) if now < self.next_no_execute => {
                    self.wake_at(Wake::Node(name), self.next_no_execute);
                    None
                }
                (Some(_), ZoneState::Normal) => {
                    self.next_no_execute = now + self.scaled(lifecycle::NO_EXECUTE_INTERVAL);
                    lifecycle::no_execute_taint(&node, want, &stamp)
                }
            };
            if let Some(next) = next {
                store.update("nodes", next, node);
            }
        }
    }

    /// The taint manager and PodGC on one pod bound to `node`: PodGC force-deletes a
    /// terminating pod of a node out of service; the taint manager evicts a pod that does not
    /// tolerate the node's NoExecute taints, at once or after its shortest `tolerationSeconds`
    /// (scaled), and cancels that when the taints go. Returns the pod as it is now, if it is.
    fn control_pod(
        &mut self,
        store: &mut Store,
        key: &Key,
        cur: Obj,
        node: &Value,
        now: Instant,
    ) -> Option<Obj> {
        if lifecycle::gc_terminating_applies(&cur, node) {
            self.evictions.remove(key);
            lifecycle::gc_terminating(store, cur);
            return store.get("pods", &key.0, &key.1);
        }
        let no_execute: Vec<Value> = taints::of_node(node)
            .into_iter()
            .filter(|t| t["effect"] == taints::NO_EXECUTE)
            .collect();
        let tolerated_for = if no_execute.is_empty() {
            None
        } else {
            taints::toleration_time(&cur, &no_execute)
        };
        match tolerated_for {
            None => {
                self.evictions.remove(key);
                Some(cur)
            }
            Some(d) if d.is_zero() => {
                self.evictions.remove(key);
                lifecycle::evict(store, cur);
                store.get("pods", &key.0, &key.1)
            }
            Some(d) => {
                // A scheduled eviction keeps its time (`processPodOnNode`).
                if !self.evictions.contains_key(key) {
                    let at = now + self.scaled(d);
                    self.evictions.insert(key.clone(), at);
                    self.wake_at(Wake::Eviction(key.clone()), at);
                }
                Some(cur)
            }
        }
    }

    /// The taint manager's timer: the pod goes if its eviction is still scheduled and due.
    fn evict_if_due(&mut self, store: &mut Store, key: &Key, now: Instant) {
        if self.evictions.get(key).is_none_or(|at| *at > now) {
            return;
        }
        self.evictions.remove(key);
        if let Some(pod) = store.get("pods", &key.0, &key.1) {
            lifecycle::evict(store, pod);
        }
    }

    fn node_changed(
        &mut self,
        store: &mut Store,
        name: &str,
        deleted: bool,
        dirty: &mut BTreeSet<Key>,
    ) {
        if deleted {
            // PodGC: the node's pods go (lose_node did it already; a DELETE through the API
            // did not).
            nodes::collect_orphans(store, name);
            self.per_node.remove(name);
            self.next_ip.remove(name);
            self.partitioned.remove(name);
            self.ready_seen.remove(name);
            self.timer_of.remove(&Wake::Node(name.to_string()));
            return;
        }
        let schedulable = store
            .get("nodes", "", name)
            .is_some_and(|n| nodes::is_ready(&n) && !nodes::is_cordoned(&n));
        if schedulable {
            dirty.extend(self.waiting.iter().cloned());
        }
        // Its taints or readiness may have changed: the taint manager and PodGC look at its
        // pods again.
        let (bound, _) = store.list("pods", None, None, 0, |p| {
            p["spec"]["nodeName"].as_str() == Some(name)
        });
        dirty.extend(bound.iter().map(|p| {
            (
                meta_str(p, "namespace").to_string(),
                meta_str(p, "name").to_string(),
            )
        }));
    }

    fn forget(&mut self, key: &Key) {
        if let Some(run) = self.pods.remove(key) {
            if let Some(n) = self.per_node.get_mut(&run.node) {
                *n = n.saturating_sub(1);
            }
        }
        self.timer_of.remove(&Wake::Pod(key.clone()));
        self.timer_of.remove(&Wake::Eviction(key.clone()));
        self.evictions.remove(key);
        self.waiting.remove(key);
    }

    /// Syncs the pods of `chunk` as API clients would: what they need is read under the shared
    /// lock, decided with no lock (building pod objects and statuses is most of the cost), and
    /// committed under the write lock only where the pod and the nodes are still as read, so
    /// that API requests are not held up while the scheduler and kubelets think. A pod whose
    /// sync cannot be decided that way (not yet schedulable, a node tainted NoExecute or
    /// partitioned, an eviction pending, a pod changed meanwhile) is synced under the write
    /// lock instead, as [`Cluster::sync_pod`] always did.
    fn sync_pods(&mut self, shared: &Shared, chunk: &[Key], now: Instant) {
        let (pods, nodes) = {
            let store = shared.read();
            let pods: Vec<Option<Obj>> = chunk
                .iter()
                .map(|k| store.get("pods", &k.0, &k.1))
                .collect();
            (pods, store.list("nodes", None, None, 0, |_| true).0)
        };
        // Pods admitted to each node by the plans before, so that each plan spreads pods and
        // hands out pod IPs as if those before it had been written.
        let mut admitted: HashMap<String, usize> = HashMap::new();
        let plans: Vec<Option<Plan>> = chunk
            .iter()
            .zip(pods)
            .map(|(key, pod)| pod.and_then(|p| self.plan_pod(key, p, &nodes, &mut admitted, now)))
            .collect();
        let mut store = shared.write();
        let (now_nodes, _) = store.list("nodes", None, None, 0, |_| true);
        let nodes_as_read = now_nodes.len() == nodes.len()
            && now_nodes.iter().zip(&nodes).all(|(a, b)| Arc::ptr_eq(a, b));
        // Plans count on every plan before them having been written: once one was not, the
        // spreading and pod IPs of those that admit a pod are not theirs to decide any more.
        let mut in_step = nodes_as_read;
        for (key, plan) in chunk.iter().zip(plans) {
            let plan = plan.filter(|p| nodes_as_read && (in_step || !p.admitted));
            let applied = match plan {
                Some(plan) => self.apply_plan(&mut store, key, plan),
                None => false,
            };
            if !applied {
                in_step = false;
                self.sync_pod(&mut store, key, now);
            }
        }
    }

    /// Decides the sync of `key` from `pod` and `nodes` as read, changing nothing: `None` when
    /// it takes more than the scheduler binding the pod and its kubelet admitting and
    /// running it (see [`Cluster::sync_pods`]). `admitted` counts the pods admitted to each
    /// node by the plans before this one.
    fn plan_pod(
        &self,
        key: &Key,
        pod: Obj,
        nodes: &[Obj],
        admitted: &mut HashMap<String, usize>,
        now: Instant,
    ) -> Option<Plan> {
        let known = self.pods.get(key);
        if known.is_some_and(|r| r.uid != meta_str(&pod, "uid")) || self.evictions.contains_key(key)
        {
            return None;
        }
        let node_named = |name: &str| nodes.iter().find(|n| meta_str(n, "name") == name);
        let mut node = pod["spec"]["nodeName"].as_str().unwrap_or("").to_string();
        let mut bind = None;
        if node.is_empty() {
            let terminal = matches!(
                pod["status"]["phase"].as_str(),
                Some("Succeeded" | "Failed")
            );
            let ours = pod["spec"]["schedulerName"]
                .as_str()
                .unwrap_or("default-scheduler")
                == "default-scheduler";
            if known.is_some()
                || terminal
                || !ours
                || !pod["metadata"]["deletionTimestamp"].is_null()
            {
                return None;
            }
            let candidates: Vec<Candidate> = nodes
                .iter()
                .map(|n| {
                    let name = meta_str(n, "name").to_string();
                    Candidate {
                        cordoned: nodes::is_cordoned(n),
                        taints: scheduler::effective_taints(n),
                        pods: self.per_node.get(&name).copied().unwrap_or(0)
                            + admitted.get(&name).copied().unwrap_or(0),
                        name,
                    }
                })
                .collect();
            let Decision::Bind(chosen) = scheduler::decide(&pod, &candidates) else {
                return None;
            };
            bind = Some(scheduler::bound(&pod, &chosen, &util::now_rfc3339()));
            node = chosen;
        }
        let node_obj = node_named(&node)?;
        let bound = bind.as_ref().unwrap_or(&pod);
        let no_execute = taints::of_node(node_obj)
            .iter()
            .any(|t| t["effect"] == taints::NO_EXECUTE);
        if self.partitioned.contains_key(&node)
            || no_execute
            || lifecycle::gc_terminating_applies(bound, node_obj)
        {
            return None;
        }
        let (mut run, admit) = match known {
            Some(run) => (run.clone(), false),
            None => {
                let terminal = matches!(
                    bound["status"]["phase"].as_str(),
                    Some("Succeeded" | "Failed")
                );
                if terminal {
                    return None;
                }
                let before = admitted.entry(node.clone()).or_default();
                let place = Placement {
                    host_ip: nodes::internal_ip(node_obj),
                    pod_ip: pod_ip_at(
                        node_obj,
                        self.next_ip.get(&node).copied().unwrap_or(0) + *before as u32,
                    ),
                    node: node.clone(),
                };
                *before += 1;
                (PodRun::admit(bound, place, now, &self.opts), true)
            }
        };
        let mut writes = run.sync(bound, now, &self.opts);
        // A write that changes nothing keeps the resourceVersion, as on a real server: only one
        // that no write precedes can be such (the others follow a new version).
        let mut wrote = false;
        writes.retain(|w| match w {
            Write::Status(next) if !wrote && next == bound => false,
            Write::Status(_) => {
                wrote = true;
                true
            }
            Write::Remove => true,
        });
        Some(Plan {
            read: pod,
            node,
            bind,
            run,
            admitted: admit,
            writes,
        })
    }

    /// Writes what `plan` decided for `key` if the pod is still as read (`false`, changing
    /// nothing, otherwise), as [`Cluster::sync_pod`] would have written it.
    fn apply_plan(&mut self, store: &mut Store, key: &Key, plan: Plan) -> bool {
        let Some(mut cur) = store
            .get("pods", &key.0, &key.1)
            .filter(|p| Arc::ptr_eq(p, &plan.read))
        else {
            return false;
        };
        let Plan {
            node,
            bind,
            mut run,
            admitted,
            writes,
            ..
        } = plan;
        let uid = run.uid.clone();
        if let Some(bound) = bind {
            cur = store.update("pods", bound, cur);
        }
        self.waiting.remove(key);
        if admitted {
            *self.next_ip.entry(node.clone()).or_insert(0) += 1;
            *self.per_node.entry(node).or_default() += 1;
        }
        for write in writes {
            match write {
                Write::Status(next) => cur = store.update("pods", next, cur),
                Write::Remove => self.remove_pod(store, key, &uid),
            }
            run.written_rv = store.rv();
        }
        let wake = run.wake;
        self.pods.insert(key.clone(), run);
        self.after_sync(store, key, &uid, wake);
        true
    }

    /// The kubelet's last word on a pod whose deletion it carried out: DELETE with grace 0 and
    /// a uid precondition.
    fn remove_pod(&self, store: &mut Store, key: &Key, uid: &str) {
        let opts = DeleteOpts {
            uid: Some(uid.to_string()),
            grace_period: Some(0),
            ..DeleteOpts::default()
        };
        if let Err(e) = store.delete("pods", &key.0, &key.1, &opts) {
            log::debug!(object = format!("{}/{}", key.0, key.1).as_str(), error = e.to_string().as_str(); "kubelet could not remove a pod");
        }
    }

    /// After a sync: forgets a pod that is gone (or was replaced), else sets its next wake-up.
    fn after_sync(&mut self, store: &Store, key: &Key, uid: &str, wake: Option<Instant>) {
        let gone = store
            .get("pods", &key.0, &key.1)
            .is_none_or(|p| meta_str(&p, "uid") != uid);
        if gone {
            self.forget(key);
            return;
        }
        match wake {
            Some(t) => self.wake_at(Wake::Pod(key.clone()), t),
            None => {
                self.timer_of.remove(&Wake::Pod(key.clone()));
            }
        }
    }

    /// Does whatever the pod needs from the scheduler or its kubelet now, under the write lock.
    fn sync_pod(&mut self, store: &mut Store, key: &Key, now: Instant) {
        let Some(mut cur) = store.get("pods", &key.0, &key.1) else {
            self.forget(key);
            return;
        };
        let uid = meta_str(&cur, "uid").to_string();
        if self.pods.get(key).is_some_and(|r| r.uid != uid) {
            // Deleted and created again under the same name.
            self.forget(key);
        }
        if cur["spec"]["nodeName"].as_str().unwrap_or("").is_empty() {
            match self.schedule(store, key, &cur) {
                Some(bound) => cur = bound,
                None => return,
            }
        }
        self.waiting.remove(key);
        let node = cur["spec"]["nodeName"].as_str().unwrap_or("").to_string();
        if let Some(node_obj) = store.get("nodes", "", &node) {
            match self.control_pod(store, key, cur, &node_obj, now) {
                Some(c) => cur = c,
                None => return,
            }
        }
        if self.partitioned.contains_key(&node) {
            // Its kubelet is gone: nothing more happens to the pod until it is back.
            return;
        }
        if !self.pods.contains_key(key) {
            let terminal = matches!(
                cur["status"]["phase"].as_str(),
                Some("Succeeded" | "Failed")
            );
            // A pod that already ended is not started again.
            if terminal {
                return;
            }
            let Some(node_obj) = store.get("nodes", "", &node) else {
                // Bound to a node that does not exist (yet): it runs if that node registers.
                self.waiting.insert(key.clone());
                return;
            };
            let place = Placement {
                host_ip: nodes::internal_ip(&node_obj),
                pod_ip: self.pod_ip(&node, &node_obj),
                node: node.clone(),
            };
            self.pods
                .insert(key.clone(), PodRun::admit(&cur, place, now, &self.opts));
            *self.per_node.entry(node).or_default() += 1;
        }
        let Some(mut run) = self.pods.remove(key) else {
            return;
        };
        for write in run.sync(&cur, now, &self.opts) {
            match write {
                // A write that changes nothing keeps the resourceVersion, as on a real server.
                Write::Status(next) if next == *cur => continue,
                Write::Status(next) => cur = store.update("pods", next, cur),
                Write::Remove => self.remove_pod(store, key, &uid),
            }
            run.written_rv = store.rv();
        }
        let wake = run.wake;
        self.pods.insert(key.clone(), run);
        self.after_sync(store, key, &uid, wake);
    }

    /// Binds an unscheduled pod to a node (the pod as bound), or records why it cannot be
    /// (`None`: it waits for a node).
    fn schedule(&mut self, store: &mut Store, key: &Key, cur: &Obj) -> Option<Obj> {
        let terminal = matches!(
            cur["status"]["phase"].as_str(),
            Some("Succeeded" | "Failed")
        );
        if !cur["metadata"]["deletionTimestamp"].is_null()
            || terminal
            || cur["spec"]["schedulerName"]
                .as_str()
                .unwrap_or("default-scheduler")
                != "default-scheduler"
        {
            self.waiting.remove(key);
            return None;
        }
        let candidates: Vec<Candidate> = store
            .list("nodes", None, None, 0, |_| true)
            .0
            .iter()
            .map(|n| {
                let name = meta_str(n, "name").to_string();
                Candidate {
                    cordoned: nodes::is_cordoned(n),
                    taints: scheduler::effective_taints(n),
                    pods: self.per_node.get(&name).copied().unwrap_or(0),
                    name,
                }
            })
            .collect();
        let now = util::now_rfc3339();
        match scheduler::decide(cur, &candidates) {
            Decision::Bind(node) => {
                let next = scheduler::bound(cur, &node, &now);
                Some(store.update("pods", next, cur.clone()))
            }
            Decision::Unschedulable(message) => {
                if let Some(next) = scheduler::unschedulable(cur, &message, &now) {
                    store.update("pods", next, cur.clone());
                }
                self.waiting.insert(key.clone());
                None
            }
        }
    }

    /// The next IP of the node's pod network (`10.244.N.2` up to `.254`, then around again).
    fn pod_ip(&mut self, node: &str, node_obj: &Obj) -> String {
        let n = self.next_ip.entry(node.to_string()).or_insert(0);
        let ip = pod_ip_at(node_obj, *n);
        *n += 1;
        ip
    }
}

/// The `n`th pod IP handed out on the node (counting from 0).
fn pod_ip_at(node_obj: &Value, n: u32) -> String {
    format!("{}.{}", nodes::pod_network(node_obj), 2 + n % 253)
}
