//! The cluster around the API server: the scheduler, one kubelet per node and PodGC, driven by
//! one thread. It hears about pods and nodes through the store's tap (keys and versions, never
//! objects), keeps its timers in a heap, and writes under the store lock as a client would,
//! without HTTP. No thread per pod: 10,000 pods cost one map entry and a timer each.

use crate::kubelet::{KubeletOptions, Placement, PodRun, Write};
use crate::nodes;
use crate::scheduler::{self, Candidate, Decision};
use crate::server::Shared;
use crate::store::{DeleteOpts, Event, EventType, Obj, Store};
use crate::util;
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
}

/// Makes pod deletion graceful, installs the tap and starts the thread.
pub fn start(shared: &Arc<Shared>, opts: KubeletOptions) -> io::Result<Handle> {
    let (tx, rx) = mpsc::channel();
    let tap_tx = tx.clone();
    {
        let mut store = shared.store();
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
            }
        }
        cluster.due_timers(Instant::now(), &mut dirty);
        if dirty.is_empty() && node_changes.is_empty() && controls.is_empty() {
            if weak.strong_count() == 0 {
                return;
            }
            continue;
        }
        let Some(shared) = weak.upgrade() else {
            return;
        };
        if !node_changes.is_empty() {
            let mut store = shared.store();
            for (name, deleted) in node_changes.drain(..) {
                cluster.node_changed(&mut store, &name, deleted, &mut dirty);
            }
        }
        let keys: Vec<Key> = std::mem::take(&mut dirty).into_iter().collect();
        for chunk in keys.chunks(CHUNK) {
            let mut store = shared.store();
            let now = Instant::now();
            for key in chunk {
                cluster.sync_pod(&mut store, key, now);
            }
        }
        for (key, code, reply) in controls.drain(..) {
            let mut store = shared.store();
            let now = Instant::now();
            let exited = cluster
                .pods
                .get_mut(&key)
                .is_some_and(|run| run.exit_container(code, now));
            if exited {
                cluster.sync_pod(&mut store, &key, now);
            }
            let _ = reply.send(exited);
        }
    }
}

/// The scheduler's and the kubelets' state.
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
    timers: BinaryHeap<Reverse<(Instant, Key)>>,
    /// The wake-up each pod has in the heap (older entries are stale).
    timer_of: HashMap<Key, Instant>,
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
        }
    }

    /// Moves pods whose wake-up is due to `dirty`.
    fn due_timers(&mut self, now: Instant, dirty: &mut BTreeSet<Key>) {
        while let Some(Reverse((t, _))) = self.timers.peek() {
            if *t > now {
                break;
            }
            let Some(Reverse((t, key))) = self.timers.pop() else {
                break;
            };
            if self.timer_of.get(&key) == Some(&t) {
                self.timer_of.remove(&key);
                dirty.insert(key);
            }
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
            return;
        }
        let schedulable = store
            .get("nodes", "", name)
            .is_some_and(|n| nodes::is_ready(&n) && !nodes::is_cordoned(&n));
        if schedulable {
            dirty.extend(self.waiting.iter().cloned());
        }
    }

    fn forget(&mut self, key: &Key) {
        if let Some(run) = self.pods.remove(key) {
            if let Some(n) = self.per_node.get_mut(&run.node) {
                *n = n.saturating_sub(1);
            }
        }
        self.timer_of.remove(key);
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
            Some(t) if self.timer_of.get(key) != Some(&t) => {
                self.timer_of.insert(key.clone(), t);
                self.timers.push(Reverse((t, key.clone())));
            }
            Some(_) => {}
            None => {
                self.timer_of.remove(key);
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
                    ready: nodes::is_ready(n),
                    cordoned: nodes::is_cordoned(n),
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
