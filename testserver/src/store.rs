//! The object store: every served resource's objects, the cluster-wide resourceVersion, a
//! bounded event history per resource, open watches, and the owner index garbage collection
//! walks. One `Store` lives behind one read-write lock (`shared.rs`): `&self` methods are what
//! readers may do together, `&mut self` ones are commits, one at a time; nothing here blocks
//! or does I/O.

use crate::resources::{self, Class, ResourceDef};
use crate::status::{ApiError, Details};
use crate::strategy;
use crate::util;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, OnceLock};

/// A stored object. Kept without `kind`/`apiVersion` (added when written out), so lists of
/// built-in kinds can be served as they are (fixture 16: PodList items carry neither).
pub type Obj = Arc<Value>;

/// `(resource key, namespace, name)`: where an object lives; namespace "" when cluster-scoped.
pub type ObjRef = (String, String, String);

/// Watch event types a store change produces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One committed change, kept in the history and fanned out to watches.
#[derive(Debug)]
pub struct Event {
    pub typ: EventType,
    pub rv: u64,
    pub object: Obj,
    /// The object before the change (for MODIFIED), so a label-selector watch can turn an
    /// update into ADDED or DELETED as the real watch cache does.
    pub prev: Option<Obj>,
    /// The object serialized with kind/apiVersion of the storage version, done once by
    /// whichever watch writes it first.
    encoded: OnceLock<Vec<u8>>,
}

impl Event {
    pub fn new(typ: EventType, rv: u64, object: Obj, prev: Option<Obj>) -> Event {
        Event {
            typ,
            rv,
            object,
            prev,
            encoded: OnceLock::new(),
        }
    }

    /// The object as JSON with `kind` and `apiVersion`, shared between watches.
    pub fn encoded(&self, def: &ResourceDef) -> &[u8] {
        self.encoded
            .get_or_init(|| resources::encode_object(def, def.preferred_version(), &self.object))
    }
}

/// Work for the garbage collector thread, queued by deletes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GcJob {
    /// The object with this uid is gone: delete dependents that have no other live owner.
    OwnerDeleted(String),
    /// The object with this uid was deleted with `propagationPolicy: Orphan`: strip the
    /// owner references to it from its dependents.
    Orphan(String),
    /// An object was written with an owner reference to a uid that does not exist (the owner
    /// was deleted first): collect it as the real GC does when it finds the owner absent.
    Dangling(ObjRef),
    /// The namespace is terminating: delete everything in it, then the namespace.
    Namespace(String),
}

/// What DELETE does to dependents (`propagationPolicy`, `orphanDependents`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Propagation {
    /// The default: dependents are collected in the background after the owner is gone.
    /// `Foreground` is treated the same (documented in the README).
    Background,
    /// Dependents are kept and lose their owner reference.
    Orphan,
}

/// Preconditions and options of a DELETE.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeleteOpts {
    pub uid: Option<String>,
    pub resource_version: Option<String>,
    pub propagation: Propagation,
    /// `gracePeriodSeconds`: only pods use it (`None`: the pod's own
    /// `terminationGracePeriodSeconds`).
    pub grace_period: Option<i64>,
}

impl Default for DeleteOpts {
    fn default() -> Self {
        DeleteOpts {
            uid: None,
            resource_version: None,
            propagation: Propagation::Background,
            grace_period: None,
        }
    }
}

/// Called with every committed change (resource key and event), under the write lock: how
/// the simulated cluster components (scheduler, kubelets) hear about pods and nodes without
/// a watch of their own. It must not block.
pub type Tap = Box<dyn Fn(&str, &Event) + Send + Sync>;

/// A namespace's state as creates see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NamespaceState {
    Missing,
    Active,
    Terminating,
}

/// The start of a watch: what to send first, and the channel that carries what follows.
pub enum WatchStart {
    Started {
        id: u64,
        rx: Receiver<Arc<Event>>,
        backlog: Vec<Arc<Event>>,
    },
    /// The requested version is older than the retained history: answer 410 in-stream.
    Expired { requested: u64, oldest: u64 },
}

struct Watcher {
    id: u64,
    namespace: Option<String>,
    tx: Sender<Arc<Event>>,
}

/// One table's objects, by `(namespace, name)`.
type Objects = BTreeMap<(String, String), Obj>;

/// The store as an etcd snapshot holds it (see [`Store::snapshot`]).
#[derive(Clone)]
pub struct Snapshot {
    rv: u64,
    tables: HashMap<String, (Arc<ResourceDef>, Objects)>,
    routes: HashMap<(String, String, String), String>,
    by_uid: HashMap<String, ObjRef>,
    dependents: HashMap<String, HashSet<ObjRef>>,
}

/// One served resource: its objects in key order (so paging and namespace scans are range
/// reads), its history and its watches.
struct Table {
    def: Arc<ResourceDef>,
    objects: Objects,
    history: VecDeque<Arc<Event>>,
    /// The oldest version a watch may resume from: every event after it is retained.
    horizon: u64,
    watchers: Vec<Watcher>,
}

impl Table {
    fn new(def: ResourceDef, horizon: u64) -> Table {
        Table {
            def: Arc::new(def),
            objects: BTreeMap::new(),
            history: VecDeque::new(),
            horizon,
            watchers: Vec::new(),
        }
    }
}

/// The whole cluster state.
pub struct Store {
    rv: u64,
    history_cap: usize,
    tables: HashMap<String, Table>,
    /// `(group, version, plural)` to table key, for every served version.
    routes: HashMap<(String, String, String), String>,
    by_uid: HashMap<String, ObjRef>,
    /// Owner uid to the objects whose ownerReferences name it.
    dependents: HashMap<String, HashSet<ObjRef>>,
    gc: Sender<GcJob>,
    next_watch: u64,
    /// Versions before this were compacted by `expire_all`: list `continue` tokens from
    /// before it answer 410.
    compacted: u64,
    /// Whether pod deletion is graceful (a kubelet finishes it), or always immediate as on a
    /// cluster without nodes.
    graceful_pods: bool,
    tap: Option<Tap>,
}

fn meta_str<'a>(v: &'a Value, field: &str) -> &'a str {
    v["metadata"][field].as_str().unwrap_or("")
}

fn owner_uids(v: &Value) -> Vec<String> {
    v["metadata"]["ownerReferences"]
        .as_array()
        .map(|refs| {
            refs.iter()
                .filter_map(|r| r["uid"].as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// Namespaces every real cluster has.
const SYSTEM_NAMESPACES: [&str; 4] = ["default", "kube-system", "kube-public", "kube-node-lease"];

impl Store {
    /// A store with the built-in resources and the system namespaces; deletes queue garbage
    /// collection work on `gc`.
    pub fn new(history_cap: usize, gc: Sender<GcJob>) -> Store {
        let mut s = Store {
            rv: 0,
            history_cap,
            tables: HashMap::new(),
            routes: HashMap::new(),
            by_uid: HashMap::new(),
            dependents: HashMap::new(),
            gc,
            next_watch: 1,
            compacted: 0,
            graceful_pods: false,
            tap: None,
        };
        for def in resources::builtins() {
            s.serve(def);
        }
        let now = util::now_rfc3339();
        for ns in SYSTEM_NAMESPACES {
            let mut obj =
                json!({"metadata": {"name": ns, "uid": util::new_uid(), "creationTimestamp": now}});
            if let (Some(def), Some(m)) = (s.def_of("namespaces"), obj.as_object_mut()) {
                strategy::apply_defaults(&def, m);
                strategy::prepare_create(&def, m, &now);
            }
            s.commit("namespaces", EventType::Added, obj, None);
        }
        s
    }

    /// Makes pod deletion graceful (`terminationGracePeriodSeconds`, finished by a kubelet)
    /// instead of immediate.
    pub fn set_graceful_pods(&mut self, graceful: bool) {
        self.graceful_pods = graceful;
    }

    /// Installs the one [`Tap`] that hears every change.
    pub fn set_tap(&mut self, tap: Tap) {
        self.tap = Some(tap);
    }

    /// The version `expire_all` last compacted to (0 if never).
    pub fn compacted(&self) -> u64 {
        self.compacted
    }

    /// The current (latest) resourceVersion.
    pub fn rv(&self) -> u64 {
        self.rv
    }

    /// Whether resource `key` is served (a custom resource stops being when its CRD goes).
    pub fn serves(&self, key: &str) -> bool {
        self.tables.contains_key(key)
    }

    fn def_of(&self, key: &str) -> Option<Arc<ResourceDef>> {
        self.tables.get(key).map(|t| t.def.clone())
    }

    /// Starts serving `def` (a built-in, or a custom resource whose CRD was just created).
    /// A resource served again keeps its objects; a new one starts with empty history.
    pub fn serve(&mut self, def: ResourceDef) {
        let key = def.key();
        self.routes.retain(|_, k| *k != key);
        for v in &def.versions {
            self.routes.insert(
                (def.group.clone(), v.clone(), def.plural.clone()),
                key.clone(),
            );
        }
        match self.tables.get_mut(&key) {
            Some(t) => t.def = Arc::new(def),
            None => {
                self.tables.insert(key, Table::new(def, self.rv));
            }
        }
    }

    /// The resource served at `group/version/plural`, if any.
    pub fn resolve(&self, group: &str, version: &str, plural: &str) -> Option<Arc<ResourceDef>> {
        let key = self
            .routes
            .get(&(group.to_string(), version.to_string(), plural.to_string()))?;
        self.def_of(key)
    }

    /// Every served resource, built-ins first, for discovery.
    pub fn defs(&self) -> Vec<Arc<ResourceDef>> {
        let mut defs: Vec<Arc<ResourceDef>> = self.tables.values().map(|t| t.def.clone()).collect();
        defs.sort_by_key(|d| (d.is_custom(), d.group.clone(), d.plural.clone()));
        defs
    }

    pub fn get(&self, key: &str, ns: &str, name: &str) -> Option<Obj> {
        self.tables
            .get(key)?
            .objects
            .get(&(ns.to_string(), name.to_string()))
            .cloned()
    }

    /// Whether a namespace exists and accepts new objects.
    pub fn namespace_state(&self, name: &str) -> NamespaceState {
        match self.get("namespaces", "", name) {
            None => NamespaceState::Missing,
            Some(ns) if !ns["metadata"]["deletionTimestamp"].is_null() => {
                NamespaceState::Terminating
            }
            Some(_) => NamespaceState::Active,
        }
    }

    /// Up to `limit` objects (0 = all) that pass `keep`, in key order, in namespace `ns` or
    /// everywhere, starting after `after`. Returns them and, when more remain, the key of the
    /// last one returned (the next page starts after it).
    pub fn list(
        &self,
        key: &str,
        ns: Option<&str>,
        after: Option<(String, String)>,
        limit: usize,
        keep: impl Fn(&Value) -> bool,
    ) -> (Vec<Obj>, Option<(String, String)>) {
        use std::ops::Bound;
        let Some(table) = self.tables.get(key) else {
            return (Vec::new(), None);
        };
        let lower = match (&after, ns) {
            (Some(k), _) => Bound::Excluded(k.clone()),
            (None, Some(ns)) => Bound::Included((ns.to_string(), String::new())),
            (None, None) => Bound::Unbounded,
        };
        let mut items = Vec::new();
        for ((obj_ns, _), obj) in table.objects.range((lower, Bound::Unbounded)) {
            if ns.is_some_and(|ns| ns != obj_ns) {
                break;
            }
            if !keep(obj) {
                continue;
            }
            if limit > 0 && items.len() == limit {
                let last = items.last().map(|o: &Obj| {
                    (
                        meta_str(o, "namespace").to_string(),
                        meta_str(o, "name").to_string(),
                    )
                });
                return (items, last);
            }
            items.push(obj.clone());
        }
        (items, None)
    }

    /// Commits one change: bumps the resourceVersion, stores it, records it in the history,
    /// sends it to the watches of the resource, keeps the owner index and queues GC checks.
    /// `obj` must carry `metadata.name` (and namespace if namespaced). Returns the stored object.
    pub fn commit(&mut self, key: &str, typ: EventType, mut obj: Value, prev: Option<Obj>) -> Obj {
        self.rv += 1;
        let rv = self.rv;
        obj["metadata"]["resourceVersion"] = Value::String(rv.to_string());
        let obj = Arc::new(obj);
        let ns = meta_str(&obj, "namespace").to_string();
        let name = meta_str(&obj, "name").to_string();
        let uid = meta_str(&obj, "uid").to_string();
        let oref: ObjRef = (key.to_string(), ns.clone(), name.clone());

        // Owner index: drop the edges of the previous version, add the new ones.
        if let Some(p) = &prev {
            for owner in owner_uids(p) {
                if let Some(set) = self.dependents.get_mut(&owner) {
                    set.remove(&oref);
                    if set.is_empty() {
                        self.dependents.remove(&owner);
                    }
                }
            }
        }
        if typ == EventType::Deleted {
            self.by_uid.remove(&uid);
        } else {
            self.by_uid.insert(uid, oref.clone());
            let owners = owner_uids(&obj);
            let dangling = owners.iter().any(|o| !self.by_uid.contains_key(o));
            for owner in owners {
                self.dependents
                    .entry(owner)
                    .or_default()
                    .insert(oref.clone());
            }
            if dangling {
                let _ = self.gc.send(GcJob::Dangling(oref.clone()));
            }
        }

        let Some(table) = self.tables.get_mut(key) else {
            return obj;
        };
        match typ {
            EventType::Deleted => {
                table.objects.remove(&(ns.clone(), name));
            }
            EventType::Added | EventType::Modified => {
                table.objects.insert((ns.clone(), name), obj.clone());
            }
        }
        let event = Arc::new(Event::new(typ, rv, obj.clone(), prev));
        if let Some(tap) = &self.tap {
            tap(key, &event);
        }
        if self.history_cap == 0 {
            table.horizon = rv;
        } else {
            table.history.push_back(event.clone());
            while table.history.len() > self.history_cap {
                if let Some(old) = table.history.pop_front() {
                    table.horizon = old.rv;
                }
            }
        }
        // Sending on an unbounded channel never blocks; a watch whose receiver is gone is
        // dropped here.
        table.watchers.retain(|w| {
            if w.namespace.as_ref().is_some_and(|wns| *wns != ns) {
                return true;
            }
            w.tx.send(event.clone()).is_ok()
        });
        obj
    }

    /// Writes an updated object. If it is being deleted with no grace period left and has no
    /// finalizer (its last one just went away), it is removed, as the real registry does after
    /// an update (`ShouldDeleteDuringUpdate`): a pod still in its grace period stays.
    pub fn update(&mut self, key: &str, obj: Value, prev: Obj) -> Obj {
        let finalized = !prev["metadata"]["deletionTimestamp"].is_null()
            && prev["metadata"]["deletionGracePeriodSeconds"]
                .as_i64()
                .unwrap_or(0)
                == 0
            && obj["metadata"]["finalizers"]
                .as_array()
                .is_none_or(Vec::is_empty);
        let stored = self.commit(key, EventType::Modified, obj, Some(prev));
        if !finalized {
            return stored;
        }
        let uid = meta_str(&stored, "uid").to_string();
        let gone = self.commit(key, EventType::Deleted, (*stored).clone(), Some(stored));
        let _ = self.gc.send(GcJob::OwnerDeleted(uid));
        gone
    }

    /// 409 unless the uid and resourceVersion preconditions of a DELETE hold for `cur`
    /// (fixture 24).
    pub fn check_preconditions(
        &self,
        def: &ResourceDef,
        cur: &Value,
        opts: &DeleteOpts,
    ) -> Result<(), ApiError> {
        let name = meta_str(cur, "name");
        let uid = meta_str(cur, "uid");
        if let Some(want) = opts.uid.as_deref().filter(|u| *u != uid) {
            return Err(ApiError::Conflict(
                format!(
                    "Operation cannot be fulfilled on {} {name:?}: the UID in the precondition ({want}) does not match the UID in record ({uid}). The object might have been deleted and then recreated",
                    def.kind_label()
                ),
                def.kind_details(name),
            ));
        }
        let rv = meta_str(cur, "resourceVersion");
        if let Some(want) = opts.resource_version.as_deref().filter(|r| *r != rv) {
            return Err(ApiError::Conflict(
                format!(
                    "Operation cannot be fulfilled on {} {name:?}: the ResourceVersion in the precondition ({want}) does not match the ResourceVersion in record ({rv}). The object might have been modified",
                    def.kind_label()
                ),
                def.kind_details(name),
            ));
        }
        Ok(())
    }

    /// DELETE of one object with its preconditions. Pods follow the pod strategy (see
    /// [`Store::delete_pod`]); other objects with finalizers only get a deletionTimestamp;
    /// namespaces terminate in the background; a CRD takes its resource and every object of it
    /// along. Returns the last state.
    pub fn delete(
        &mut self,
        key: &str,
        ns: &str,
        name: &str,
        opts: &DeleteOpts,
    ) -> Result<Obj, ApiError> {
        let def = self.def_of(key).ok_or_else(not_served)?;
        let cur = self.get(key, ns, name).ok_or_else(|| def.not_found(name))?;
        self.check_preconditions(&def, &cur, opts)?;
        if def.class == Class::Pod {
            return Ok(self.delete_pod(key, cur, opts));
        }
        if !cur["metadata"]["deletionTimestamp"].is_null() {
            // Already terminating (finalizers pending, or a namespace being emptied).
            return Ok(cur);
        }
        let now = util::now_rfc3339();
        let mut next = (*cur).clone();
        next["metadata"]["deletionTimestamp"] = json!(now);
        next["metadata"]["deletionGracePeriodSeconds"] = json!(0);
        match def.class {
            Class::Namespace => {
                if matches!(name, "default" | "kube-system" | "kube-public") {
                    return Err(ApiError::Forbidden(
                        format!(
                            "namespaces {name:?} is forbidden: this namespace may not be deleted"
                        ),
                        def.details(name),
                    ));
                }
                next["status"] = json!({"phase": "Terminating"});
                let stored = self.commit(key, EventType::Modified, next, Some(cur));
                let _ = self.gc.send(GcJob::Namespace(name.to_string()));
                return Ok(stored);
            }
            Class::Crd => {
                self.unserve_crd(&cur);
                let stored = self.commit(key, EventType::Deleted, next, Some(cur));
                return Ok(stored);
            }
            _ => {}
        }
        let has_finalizers = cur["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|f| !f.is_empty());
        if has_finalizers {
            return Ok(self.commit(key, EventType::Modified, next, Some(cur)));
        }
        Ok(self.remove(key, cur, opts.propagation))
    }

    /// Removes an object for good (DELETED) and queues the collection of its dependents.
    fn remove(&mut self, key: &str, last: Obj, propagation: Propagation) -> Obj {
        let uid = meta_str(&last, "uid").to_string();
        let gone = self.commit(key, EventType::Deleted, (*last).clone(), Some(last));
        let job = match propagation {
            Propagation::Background => GcJob::OwnerDeleted(uid),
            Propagation::Orphan => GcJob::Orphan(uid),
        };
        let _ = self.gc.send(job);
        gone
    }

    /// The grace period a DELETE gives a pod, as the pod strategy's `CheckGracefulDelete`
    /// decides it: the request's `gracePeriodSeconds`, else the pod's
    /// `terminationGracePeriodSeconds`; but 0 for a pod no node runs (unscheduled) or that is
    /// already terminal, and 1 for a negative request. Always 0 without kubelets.
    fn pod_grace_period(&self, pod: &Value, requested: Option<i64>) -> i64 {
        if !self.graceful_pods {
            return 0;
        }
        let mut period = requested
            .or_else(|| pod["spec"]["terminationGracePeriodSeconds"].as_i64())
            .unwrap_or(0);
        if pod["spec"]["nodeName"].as_str().unwrap_or("").is_empty() {
            period = 0;
        }
        if matches!(
            pod["status"]["phase"].as_str(),
            Some("Succeeded" | "Failed")
        ) {
            period = 0;
        }
        if period < 0 {
            period = 1;
        }
        period
    }

    /// DELETE of a pod, as kube-apiserver's registry does it (`rest.BeforeDelete` and
    /// `Store.Delete`): a first DELETE sets `deletionTimestamp` (now + grace) and
    /// `deletionGracePeriodSeconds` (MODIFIED); with grace 0 and no finalizers the pod is then
    /// removed at once (DELETED, fixture 06), otherwise the kubelet finishes the deletion
    /// (fixture 04). A later DELETE may only shorten the grace period (0 removes the pod); a
    /// pod already at grace 0 is removed unless finalizers hold it.
    fn delete_pod(&mut self, key: &str, cur: Obj, opts: &DeleteOpts) -> Obj {
        let has_finalizers = cur["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|f| !f.is_empty());
        let now = util::unix_now();
        let (deletion, period) = if cur["metadata"]["deletionTimestamp"].is_null() {
            let period = self.pod_grace_period(&cur, opts.grace_period);
            (now + period, period)
        } else {
            let current = cur["metadata"]["deletionGracePeriodSeconds"]
                .as_i64()
                .unwrap_or(0);
            if current == 0 {
                // The deletion has no grace left: only finalizers keep the pod.
                return if has_finalizers {
                    cur
                } else {
                    self.remove(key, cur, opts.propagation)
                };
            }
            let Some(mut period) = opts.grace_period.filter(|g| *g < current) else {
                // A graceful deletion is pending and this one does not shorten it.
                return cur;
            };
            let at = cur["metadata"]["deletionTimestamp"]
                .as_str()
                .and_then(util::parse_rfc3339)
                .unwrap_or(now);
            // Moved back by the old grace and forward by the new one, never into the past.
            let mut deletion = at - current + period;
            if deletion < now {
                deletion = now;
                if period != 0 {
                    period = 1;
                }
            }
            (deletion, period)
        };
        let mut next = (*cur).clone();
        next["metadata"]["deletionTimestamp"] = json!(util::format_rfc3339(deletion));
        next["metadata"]["deletionGracePeriodSeconds"] = json!(period);
        let marked = self.commit(key, EventType::Modified, next, Some(cur));
        if period > 0 || has_finalizers {
            return marked;
        }
        self.remove(key, marked, opts.propagation)
    }

    /// Stops serving the resource a CRD defines and drops every object of it (their
    /// dependents are collected), ending its watches.
    fn unserve_crd(&mut self, crd: &Value) {
        let Ok(def) = resources::from_crd(crd) else {
            return;
        };
        let key = def.key();
        self.routes.retain(|_, k| *k != key);
        let Some(table) = self.tables.remove(&key) else {
            return;
        };
        for obj in table.objects.values() {
            let uid = meta_str(obj, "uid").to_string();
            self.by_uid.remove(&uid);
            for owner in owner_uids(obj) {
                if let Some(set) = self.dependents.get_mut(&owner) {
                    set.retain(|(k, _, _)| *k != key);
                }
            }
            let _ = self.gc.send(GcJob::OwnerDeleted(uid));
        }
    }

    /// Does one garbage-collection job (called by the GC thread, under the write lock).
    pub fn collect(&mut self, job: GcJob) {
        match job {
            GcJob::OwnerDeleted(uid) => {
                let deps: Vec<ObjRef> = self
                    .dependents
                    .get(&uid)
                    .map(|s| s.iter().cloned().collect())
                    .unwrap_or_default();
                for dep in deps {
                    self.collect_dependent(&dep);
                }
            }
            GcJob::Dangling(dep) => self.collect_dependent(&dep),
            GcJob::Orphan(uid) => {
                let deps: Vec<ObjRef> = self
                    .dependents
                    .get(&uid)
                    .map(|s| s.iter().cloned().collect())
                    .unwrap_or_default();
                for (key, ns, name) in deps {
                    if let Some(cur) = self.get(&key, &ns, &name) {
                        self.strip_owners(&key, cur, |o| o == uid);
                    }
                }
            }
            GcJob::Namespace(name) => self.empty_namespace(&name),
        }
    }

    /// Deletes a dependent whose owners are all gone, or strips the references to the gone
    /// ones when some owner lives (what the real GC does with dangling references).
    fn collect_dependent(&mut self, (key, ns, name): &ObjRef) {
        let Some(cur) = self.get(key, ns, name) else {
            return;
        };
        let owners = owner_uids(&cur);
        let live: Vec<&String> = owners
            .iter()
            .filter(|o| self.by_uid.contains_key(*o))
            .collect();
        if live.len() == owners.len() {
            return;
        }
        if live.is_empty() {
            let _ = self.delete(key, ns, name, &DeleteOpts::default());
        } else {
            let live: HashSet<String> = live.into_iter().cloned().collect();
            self.strip_owners(key, cur, |o| !live.contains(o));
        }
    }

    fn strip_owners(&mut self, key: &str, cur: Obj, remove: impl Fn(&str) -> bool) {
        let mut next = (*cur).clone();
        let mut now_empty = false;
        if let Some(refs) = next
            .pointer_mut("/metadata/ownerReferences")
            .and_then(Value::as_array_mut)
        {
            refs.retain(|r| !remove(r["uid"].as_str().unwrap_or("")));
            now_empty = refs.is_empty();
        }
        if now_empty {
            if let Some(m) = next.get_mut("metadata").and_then(Value::as_object_mut) {
                m.remove("ownerReferences");
            }
        }
        if next != *cur {
            self.update(key, next, cur);
        }
    }

    /// The namespace controller's work, done at once: delete every object in the namespace
    /// (finalizers are not waited for), then the namespace itself.
    fn empty_namespace(&mut self, ns: &str) {
        let keys: Vec<String> = self
            .tables
            .iter()
            .filter(|(_, t)| t.def.namespaced)
            .map(|(k, _)| k.clone())
            .collect();
        for key in keys {
            let (objs, _) = self.list(&key, Some(ns), None, 0, |_| true);
            for obj in objs {
                let uid = meta_str(&obj, "uid").to_string();
                let is_pod = self.def_of(&key).is_some_and(|d| d.class == Class::Pod);
                let mut next = (*obj).clone();
                if next["metadata"]["deletionTimestamp"].is_null() && is_pod {
                    next["metadata"]["deletionTimestamp"] = json!(util::now_rfc3339());
                    next["metadata"]["deletionGracePeriodSeconds"] = json!(0);
                    let marked = self.commit(&key, EventType::Modified, next, Some(obj));
                    self.commit(&key, EventType::Deleted, (*marked).clone(), Some(marked));
                } else {
                    self.commit(&key, EventType::Deleted, next, Some(obj));
                }
                let _ = self.gc.send(GcJob::OwnerDeleted(uid));
            }
        }
        if let Some(cur) = self.get("namespaces", "", ns) {
            self.commit("namespaces", EventType::Deleted, (*cur).clone(), Some(cur));
        }
    }

    /// Registers a watch on resource `key` (in namespace `ns`, or everywhere) from version
    /// `from`: `None` replays every current object as ADDED first (fixture 32); `Some(n)`
    /// replays the retained events after `n`, or is Expired when `n` is older than the
    /// history (fixture 28).
    pub fn watch(&mut self, key: &str, ns: Option<&str>, from: Option<u64>) -> WatchStart {
        let Some(table) = self.tables.get_mut(key) else {
            return WatchStart::Expired {
                requested: from.unwrap_or(0),
                oldest: self.rv,
            };
        };
        let in_ns = |o: &Value| ns.is_none_or(|ns| meta_str(o, "namespace") == ns);
        let backlog = match from {
            None => table
                .objects
                .values()
                .filter(|o| in_ns(o))
                .map(|o| {
                    let rv = meta_str(o, "resourceVersion").parse().unwrap_or(0);
                    Arc::new(Event::new(EventType::Added, rv, o.clone(), None))
                })
                .collect(),
            Some(n) if n < table.horizon => {
                return WatchStart::Expired {
                    requested: n,
                    oldest: table.horizon,
                };
            }
            Some(n) => {
                let start = table.history.partition_point(|e| e.rv <= n);
                table
                    .history
                    .range(start..)
                    .filter(|e| in_ns(&e.object))
                    .cloned()
                    .collect()
            }
        };
        let (tx, rx) = mpsc::channel();
        let id = self.next_watch;
        self.next_watch += 1;
        table.watchers.push(Watcher {
            id,
            namespace: ns.map(String::from),
            tx,
        });
        WatchStart::Started { id, rx, backlog }
    }

    /// Forgets a watch whose stream ended.
    pub fn unwatch(&mut self, key: &str, id: u64) {
        if let Some(t) = self.tables.get_mut(key) {
            t.watchers.retain(|w| w.id != id);
        }
    }

    /// Ends every watch: their streams see the channel close and drop the connection.
    pub fn drop_watches(&mut self) {
        for t in self.tables.values_mut() {
            t.watchers.clear();
        }
    }

    /// What a restart or compaction does: all history is forgotten, so any watch resuming
    /// from a version before now gets 410 Expired; open watches end.
    pub fn expire_all(&mut self) {
        let rv = self.rv;
        self.compacted = rv;
        for t in self.tables.values_mut() {
            t.history.clear();
            t.horizon = rv;
            t.watchers.clear();
        }
    }

    /// Every object and the version, as an etcd snapshot holds them, for [`Store::restore`].
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            rv: self.rv,
            tables: self
                .tables
                .iter()
                .map(|(k, t)| (k.clone(), (t.def.clone(), t.objects.clone())))
                .collect(),
            routes: self.routes.clone(),
            by_uid: self.by_uid.clone(),
            dependents: self.dependents.clone(),
        }
    }

    /// What `etcdctl snapshot restore` (etcd 3.4: no `--bump-revision`) and an API server
    /// started on it do: the objects and the version are the snapshot's again, so versions
    /// answered from now on are lower than those answered before; nothing before the snapshot
    /// can be watched from (410), a watch from a later version hears nothing until the store
    /// passes it, and every open watch ends. The simulated components hear of every object
    /// that changed, as the restarted ones the procedure asks for list everything again.
    pub fn restore(&mut self, snap: &Snapshot) {
        let mut changed: Vec<(String, Arc<Event>)> = Vec::new();
        for (key, t) in &self.tables {
            let kept = snap.tables.get(key).map(|(_, objects)| objects);
            for (at, o) in &t.objects {
                if kept.is_none_or(|objects| !objects.contains_key(at)) {
                    let ev = Event::new(EventType::Deleted, snap.rv, o.clone(), None);
                    changed.push((key.clone(), Arc::new(ev)));
                }
            }
        }
        self.tables.retain(|key, _| snap.tables.contains_key(key));
        for (key, (def, objects)) in &snap.tables {
            let t = self
                .tables
                .entry(key.clone())
                .or_insert_with(|| Table::new((**def).clone(), snap.rv));
            for (at, o) in objects {
                if t.objects.get(at).is_none_or(|now| !Arc::ptr_eq(now, o)) {
                    let rv = meta_str(o, "resourceVersion").parse().unwrap_or(snap.rv);
                    let ev = Event::new(EventType::Added, rv, o.clone(), None);
                    changed.push((key.clone(), Arc::new(ev)));
                }
            }
            t.def = def.clone();
            t.objects = objects.clone();
            t.history.clear();
            t.horizon = snap.rv;
            t.watchers.clear();
        }
        self.rv = snap.rv;
        self.compacted = snap.rv;
        self.routes = snap.routes.clone();
        self.by_uid = snap.by_uid.clone();
        self.dependents = snap.dependents.clone();
        if let Some(tap) = &self.tap {
            for (key, ev) in &changed {
                tap(key, ev);
            }
        }
    }

    /// Watches an event of table `key` in namespace `ns` would be sent to.
    pub fn watchers_of(&self, key: &str, ns: Option<&str>) -> usize {
        self.tables.get(key).map_or(0, |t| {
            t.watchers
                .iter()
                .filter(|w| w.namespace.is_none() || w.namespace.as_deref() == ns)
                .count()
        })
    }

    pub fn open_watches(&self) -> usize {
        self.tables.values().map(|t| t.watchers.len()).sum()
    }
}

/// 404 for a path no served resource matches (the real server's body for unknown resources).
pub fn not_served() -> ApiError {
    ApiError::NotFound(
        "the server could not find the requested resource".into(),
        Details::default(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> (Store, Receiver<GcJob>) {
        let (tx, rx) = mpsc::channel();
        (Store::new(3, tx), rx)
    }

    fn pod(name: &str, owner: Option<&str>) -> Value {
        let mut p = json!({"metadata": {"name": name, "namespace": "default", "uid": util::new_uid()},
            "spec": {"containers": [{"name": "c", "image": "i"}]}});
        if let Some(o) = owner {
            p["metadata"]["ownerReferences"] = json!([{"apiVersion": "v1", "kind": "X", "name": "o", "uid": o, "controller": true}]);
        }
        p
    }

    #[test]
    fn system_namespaces_exist_at_start() {
        let (s, _gc) = store();
        assert_eq!(s.namespace_state("default"), NamespaceState::Active);
        assert_eq!(s.namespace_state("kube-system"), NamespaceState::Active);
        assert_eq!(s.namespace_state("nope"), NamespaceState::Missing);
    }

    #[test]
    fn every_commit_bumps_the_cluster_wide_version() {
        let (mut s, _gc) = store();
        let before = s.rv();
        let a = s.commit("pods", EventType::Added, pod("a", None), None);
        let e = s.commit(
            "events",
            EventType::Added,
            json!({"metadata": {"name": "e", "namespace": "default", "uid": "u"}}),
            None,
        );
        assert_eq!(a["metadata"]["resourceVersion"], (before + 1).to_string());
        assert_eq!(e["metadata"]["resourceVersion"], (before + 2).to_string());
    }

    #[test]
    fn paging_returns_continue_key_until_the_end() {
        let (mut s, _gc) = store();
        for n in ["a", "b", "c"] {
            s.commit("pods", EventType::Added, pod(n, None), None);
        }
        let (page, next) = s.list("pods", Some("default"), None, 2, |_| true);
        assert_eq!(page.len(), 2);
        let (rest, end) = s.list("pods", Some("default"), next, 2, |_| true);
        assert_eq!(rest.len(), 1);
        assert_eq!(end, None);
        assert_eq!(s.list("pods", Some("other"), None, 0, |_| true).0.len(), 0);
    }

    #[test]
    fn history_beyond_capacity_expires_old_versions() {
        let (mut s, _gc) = store();
        let start = s.rv();
        for n in ["a", "b", "c", "d"] {
            s.commit("pods", EventType::Added, pod(n, None), None);
        }
        assert!(
            matches!(s.watch("pods", None, Some(start)), WatchStart::Expired { oldest, .. } if oldest == start + 1)
        );
        match s.watch("pods", None, Some(start + 1)) {
            WatchStart::Started { backlog, .. } => assert_eq!(backlog.len(), 3),
            WatchStart::Expired { .. } => panic!("should resume"),
        }
    }

    #[test]
    fn pod_delete_is_modified_then_deleted_and_queues_gc() {
        let (mut s, gc) = store();
        let p = s.commit("pods", EventType::Added, pod("a", None), None);
        let WatchStart::Started { rx, .. } = s.watch("pods", Some("default"), Some(s.rv())) else {
            panic!("watch")
        };
        let last = s
            .delete("pods", "default", "a", &DeleteOpts::default())
            .expect("delete");
        assert_eq!(last["metadata"]["deletionGracePeriodSeconds"], 0);
        let types: Vec<EventType> = rx.try_iter().map(|e| e.typ).collect();
        assert_eq!(types, vec![EventType::Modified, EventType::Deleted]);
        assert_eq!(
            gc.try_recv().ok(),
            Some(GcJob::OwnerDeleted(
                p["metadata"]["uid"].as_str().unwrap_or("").into()
            ))
        );
    }

    /// A pod bound to a node, as the scheduler leaves it.
    fn bound_pod(name: &str) -> Value {
        let mut p = pod(name, None);
        p["spec"]["nodeName"] = json!("node-0");
        p["spec"]["terminationGracePeriodSeconds"] = json!(30);
        p["status"] = json!({"phase": "Running"});
        p
    }

    fn graceful_store() -> (Store, Receiver<GcJob>) {
        let (mut s, gc) = store();
        s.set_graceful_pods(true);
        (s, gc)
    }

    fn grace_of(p: &Obj) -> Option<i64> {
        p["metadata"]["deletionGracePeriodSeconds"].as_i64()
    }

    fn with_grace(g: i64) -> DeleteOpts {
        DeleteOpts {
            grace_period: Some(g),
            ..DeleteOpts::default()
        }
    }

    #[test]
    fn pod_on_a_node_is_deleted_with_its_termination_grace_period_and_stays() {
        let (mut s, _gc) = graceful_store();
        s.commit("pods", EventType::Added, bound_pod("a"), None);
        let marked = s
            .delete("pods", "default", "a", &DeleteOpts::default())
            .expect("delete");
        assert_eq!(grace_of(&marked), Some(30));
        let at = marked["metadata"]["deletionTimestamp"]
            .as_str()
            .and_then(util::parse_rfc3339)
            .expect("deletionTimestamp");
        assert!((at - util::unix_now() - 30).abs() <= 1, "now + 30 s");
        assert!(
            s.get("pods", "default", "a").is_some(),
            "the kubelet finishes it"
        );
    }

    #[test]
    fn unscheduled_terminal_and_forced_pods_are_removed_at_once() {
        let (mut s, _gc) = graceful_store();
        let mut pending = bound_pod("pending");
        pending["spec"]
            .as_object_mut()
            .expect("spec")
            .remove("nodeName");
        let mut done = bound_pod("done");
        done["status"]["phase"] = json!("Succeeded");
        for p in [pending, done, bound_pod("forced")] {
            s.commit("pods", EventType::Added, p, None);
        }
        for (name, opts) in [
            ("pending", DeleteOpts::default()),
            ("done", DeleteOpts::default()),
            ("forced", with_grace(0)),
        ] {
            let last = s.delete("pods", "default", name, &opts).expect("delete");
            assert_eq!(grace_of(&last), Some(0), "{name}");
            assert!(s.get("pods", "default", name).is_none(), "{name}");
        }
    }

    #[test]
    fn a_later_delete_only_shortens_the_grace_period_and_zero_removes() {
        let (mut s, _gc) = graceful_store();
        s.commit("pods", EventType::Added, bound_pod("a"), None);
        let first = s
            .delete("pods", "default", "a", &with_grace(600))
            .expect("delete");
        let rv = first["metadata"]["resourceVersion"].clone();
        let same = s
            .delete("pods", "default", "a", &with_grace(900))
            .expect("longer");
        assert_eq!(same["metadata"]["resourceVersion"], rv, "no write");
        let shorter = s
            .delete("pods", "default", "a", &with_grace(60))
            .expect("shorter");
        assert_eq!(grace_of(&shorter), Some(60));
        s.delete("pods", "default", "a", &with_grace(0))
            .expect("zero");
        assert!(s.get("pods", "default", "a").is_none());
    }

    #[test]
    fn negative_grace_is_one_second_and_finalizers_hold_a_pod_at_grace_zero() {
        let (mut s, _gc) = graceful_store();
        s.commit("pods", EventType::Added, bound_pod("a"), None);
        let marked = s
            .delete("pods", "default", "a", &with_grace(-5))
            .expect("delete");
        assert_eq!(grace_of(&marked), Some(1));
        let mut held = bound_pod("held");
        held["metadata"]["finalizers"] = json!(["x/y"]);
        s.commit("pods", EventType::Added, held, None);
        let last = s
            .delete("pods", "default", "held", &with_grace(0))
            .expect("delete");
        assert_eq!(grace_of(&last), Some(0));
        let cur = s
            .get("pods", "default", "held")
            .expect("held by its finalizer");
        // A status write keeps it; removing the finalizer lets it go.
        let mut next = (*cur).clone();
        next["status"]["phase"] = json!("Succeeded");
        let cur = s.update("pods", next, cur);
        assert!(s.get("pods", "default", "held").is_some());
        let mut next = (*cur).clone();
        next["metadata"]["finalizers"] = json!([]);
        s.update("pods", next, cur);
        assert!(s.get("pods", "default", "held").is_none());
    }

    #[test]
    fn an_update_during_the_grace_period_does_not_remove_the_pod() {
        let (mut s, _gc) = graceful_store();
        s.commit("pods", EventType::Added, bound_pod("a"), None);
        let marked = s
            .delete("pods", "default", "a", &DeleteOpts::default())
            .expect("delete");
        let mut next = (*marked).clone();
        next["status"]["phase"] = json!("Succeeded");
        s.update("pods", next, marked);
        assert!(s.get("pods", "default", "a").is_some());
    }

    #[test]
    fn dependent_without_live_owner_is_collected() {
        let (mut s, gc) = store();
        let owner = s.commit(
            "events",
            EventType::Added,
            json!({"metadata": {"name": "o", "namespace": "default", "uid": "owner-1"}}),
            None,
        );
        s.commit(
            "pods",
            EventType::Added,
            pod("child", Some("owner-1")),
            None,
        );
        s.delete("events", "default", "o", &DeleteOpts::default())
            .expect("delete owner");
        let _ = owner;
        for job in gc.try_iter().collect::<Vec<_>>() {
            s.collect(job);
        }
        assert!(s.get("pods", "default", "child").is_none());
    }

    #[test]
    fn delete_with_stale_uid_precondition_conflicts() {
        let (mut s, _gc) = store();
        s.commit("pods", EventType::Added, pod("a", None), None);
        let opts = DeleteOpts {
            uid: Some("0".into()),
            ..DeleteOpts::default()
        };
        let err = s
            .delete("pods", "default", "a", &opts)
            .expect_err("conflict");
        assert_eq!(err.code(), 409);
    }
}
