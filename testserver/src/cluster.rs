//! The cluster around the API server: the scheduler, one kubelet per node, PodGC, the node
//! lifecycle controller and the NoExecute taint manager, driven by one thread. It hears about
//! pods and nodes through the store's tap (keys and versions, never objects), keeps its timers
//! in a heap, and writes under the store lock as a client would, without HTTP. No thread per
//! pod: 10,000 pods cost one map entry and a timer each.

use crate::kubelet::{KubeletOptions, Placement, PodRun, Write};
use crate::lifecycle::{self, ZoneState};
use crate::nodes;
use crate::runtime;
use crate::scheduler::{self, Candidate, Decision};
use crate::server::Shared;
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
    pub fn exit_container(&self, ns: &str, name: &str, code: i32) -> bool {
        let (reply, answer) = mpsc::channel();
        let msg = Msg::ExitContainer {
            key: (ns.to_string(), name.to_string()),
            code,
            reply,
        };
        if self.tx.send(msg).is_err() {
            return false;
        }
        answer
            .recv_timeout(Duration::from_secs(10))
            .unwrap_or(false)
    }

    /// Stops (`heal: false`) or resumes the kubelet of `node`; `false` when there is no such
    /// node (or, to heal, it was not partitioned).
    pub fn partition(&self, node: &str, heal: bool) -> bool {
        let (reply, answer) = mpsc::channel();
        let msg = Msg::Partition {
            node: node.to_string(),
            heal,
            reply,
        };
        if self.tx.send(msg).is_err() {
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
            // Unbounded: never blocks the writer holding the store lock.
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
/// Pods synced per store-lock hold, so API requests get in between during a flood.
const CHUNK: usize = 256;

fn run(weak: Weak<Shared>, rx: Receiver<Msg>, opts: KubeletOptions) {
    let mut cluster = Cluster::new(opts);
    let mut dirty: BTreeSet<Key> = BTreeSet::new();
    let mut node_changes: Vec<(String, bool)> = Vec::new();
    let mut controls: Vec<(Key, i32, Sender<bool>)> = Vec::new();
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
                Msg::ExitContainer { key, code, reply } => controls.push((key, code, reply)),
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
            let mut store = shared.write();
            let now = Instant::now();
            for key in chunk {
                cluster.sync_pod(&mut store, key, now);
            }
        }
        if !due.evictions.is_empty() {
            let mut store = shared.write();
            for key in due.evictions.drain(..) {
                cluster.evict_if_due(&mut store, &key, Instant::now());
            }
        }
        for (key, code, reply) in controls.drain(..) {
            let mut store = shared.write();
            let now = Instant::now();
            let partitioned = &cluster.partitioned;
            let exited = cluster
                .pods
                .get_mut(&key)
                .filter(|run| !partitioned.contains_key(&run.node))
                .is_some_and(|run| run.exit_container(code, now));
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

    /// Does whatever the pod needs from the scheduler or its kubelet now.
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
        let Some(run) = self.pods.get_mut(key) else {
            return;
        };
        for write in run.sync(&cur, now, &self.opts) {
            match write {
                // A write that changes nothing keeps the resourceVersion, as on a real server.
                Write::Status(next) if next == *cur => continue,
                Write::Status(next) => cur = store.update("pods", next, cur),
                Write::Remove => {
                    let opts = DeleteOpts {
                        uid: Some(uid.clone()),
                        grace_period: Some(0),
                        ..DeleteOpts::default()
                    };
                    if let Err(e) = store.delete("pods", &key.0, &key.1, &opts) {
                        log::debug!(object = format!("{}/{}", key.0, key.1).as_str(), error = e.to_string().as_str(); "kubelet could not remove a pod");
                    }
                }
            }
            run.written_rv = store.rv();
        }
        let wake = run.wake;
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
        let host = 2 + *n % 253;
        *n += 1;
        format!("{}.{host}", nodes::pod_network(node_obj))
    }
}
