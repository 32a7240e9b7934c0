//! Reconcile one key: make the world hold exactly one pod for the ImmortalContainer, and make
//! its status say truthfully what that pod is doing, counting every pod started exactly once.
//!
//! Level-based, as sample-controller's `syncHandler`: re-read the object by key (NotFound is
//! success: the garbage collector removes its pod), learn the pod's state, act, then write
//! status through `/status` only if it changed. How the pod's state is learned depends on the
//! trigger (see `lifecycle`): after its DELETED event the pod is probably gone, so the create
//! comes first; after an event that showed it, reconcile acts on what the event showed when
//! the pod is already counted, and otherwise reads it. A pod of ours that is gone or terminal
//! is replaced as soon as its name is free, and not before: while one terminates, reconcile
//! waits for its DELETED event instead of polling.
//!
//! Every pod started is counted exactly once; the invariant that makes it so, and why each
//! step below keeps it, is written down in `counting`.

use crate::immortal::counting::{self, Counting};
use crate::immortal::lifecycle::{Phase, PodHint, PodView, SeenPod, READY};
use crate::immortal::restarts::Restarts;
use crate::immortal::types::{
    self as ic, ImmortalContainer, ImmortalContainerStatus, ImmortalOwner, ImmortalPod,
    API_VERSION, CONTAINER_NAME, COUNT_FINALIZER, IMAGE_ANNOTATION, IMMORTAL_CONTAINERS, KIND,
    MANAGED_BY_LABEL, MANAGED_BY_VALUE, OWNER_UID_LABEL,
};
use crate::kube::client;
use crate::kube::events::{Note, Recorder};
use crate::kube::types::{
    self, Condition, Container, ObjectMeta, OwnerReference, Pod, PodSpec, MAX_NAME_LEN,
};
use crate::util;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::fmt;
use std::time::{Duration, Instant};

/// How long to wait before looking again at a pod name held by a pod that is not ours. Such a
/// pod is invisible to our pod watch (it lacks our label), so only a timer notices it leaving;
/// this one is slow enough not to load the API server with a stuck object.
pub const CONFLICT_RETRY: Duration = Duration::from_secs(30);

/// Rounds of look-and-act one reconcile makes before it leaves the key to the queue's backoff.
const MAX_ROUNDS: usize = 4;

/// The API calls reconcile makes. [`client::Client`] is the real one; tests use a fake that
/// records every call.
pub trait Api {
    fn get_immortal_container(
        &self,
        ns: &str,
        name: &str,
    ) -> Result<ImmortalContainer, client::Error>;
    fn get_pod(&self, ns: &str, name: &str) -> Result<Pod, client::Error>;
    fn create_pod(&self, ns: &str, pod: &Pod) -> Result<Pod, client::Error>;
    /// Deletes the pod if it still has `uid`; answers it as the server left it.
    fn delete_pod(
        &self,
        ns: &str,
        name: &str,
        uid: &str,
        grace: Option<u32>,
    ) -> Result<Pod, client::Error>;
    /// Merge-patches the pod; a `metadata.uid` in the patch is a precondition.
    fn patch_pod(&self, ns: &str, name: &str, patch: &Value) -> Result<Pod, client::Error>;
    fn patch_status(
        &self,
        ns: &str,
        name: &str,
        patch: &Value,
    ) -> Result<ImmortalContainer, client::Error>;
    /// Records a Kubernetes Event about `ic` (best effort: never fails the reconcile).
    fn record(&self, ic: &ImmortalContainer, note: Note);
}

/// The real API: the client, with Events going to the recorder thread.
pub struct Cluster {
    pub client: client::Client,
    pub events: Recorder,
}

impl Api for Cluster {
    fn get_immortal_container(
        &self,
        ns: &str,
        name: &str,
    ) -> Result<ImmortalContainer, client::Error> {
        self.client.get_object(IMMORTAL_CONTAINERS, ns, name)
    }
    fn get_pod(&self, ns: &str, name: &str) -> Result<Pod, client::Error> {
        self.client.get_pod(ns, name)
    }
    fn create_pod(&self, ns: &str, pod: &Pod) -> Result<Pod, client::Error> {
        self.client.create_pod(ns, pod)
    }
    fn delete_pod(
        &self,
        ns: &str,
        name: &str,
        uid: &str,
        grace: Option<u32>,
    ) -> Result<Pod, client::Error> {
        self.client.delete_pod(ns, name, uid, grace)
    }
    fn patch_pod(&self, ns: &str, name: &str, patch: &Value) -> Result<Pod, client::Error> {
        self.client.patch_pod(ns, name, patch)
    }
    fn patch_status(
        &self,
        ns: &str,
        name: &str,
        patch: &Value,
    ) -> Result<ImmortalContainer, client::Error> {
        self.client
            .patch_status(IMMORTAL_CONTAINERS, ns, name, patch)
    }
    fn record(&self, ic: &ImmortalContainer, note: Note) {
        self.events.record(&ic.metadata, note);
    }
}

/// What the reconcile workers keep between reconciles, shared by all of them: the restart
/// back-off, what the installed CRD keeps of the status we write, and the clock (virtual in the
/// exactly-once fault-injection tests).
pub struct Books {
    pub restarts: Restarts,
    pub counting: Counting,
    clock: Box<dyn Fn() -> Instant + Send + Sync>,
}

impl Books {
    pub fn new() -> Books {
        Books::with_clock(Instant::now)
    }

    pub fn with_clock(clock: impl Fn() -> Instant + Send + Sync + 'static) -> Books {
        Books {
            restarts: Restarts::new(),
            counting: Counting::new(),
            clock: Box::new(clock),
        }
    }

    pub fn now(&self) -> Instant {
        (self.clock)()
    }
}

impl Default for Books {
    fn default() -> Self {
        Books::new()
    }
}

/// What the worker does with the key after a successful reconcile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Nothing to do until a watch event says otherwise.
    Done,
    /// Look again after this long (a pod name held by someone else; a replacement backing off).
    RequeueAfter(Duration),
}

/// Why a reconcile failed. Every variant is retried with the queue's per-key backoff; what
/// retrying cannot fix (an invalid spec, a name too long, a pod that is not ours) is not an
/// error but a status condition.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// An API call failed in a way a retry may fix: 5xx, 429, no answer, a 409 from a stale
    /// read, a pod name taken between our look and our create.
    Transient {
        action: &'static str,
        source: client::Error,
    },
    /// The API server refused us (401/403): RBAC, credentials, or admission (PodSecurity, a
    /// ResourceQuota). A person must act; retried with backoff, since that fix needs no restart.
    Denied {
        action: &'static str,
        source: client::Error,
    },
    /// The pod changed under every round of one reconcile (taken, freed, retaken). Retried
    /// with backoff rather than spun on.
    Unsettled { pod: String },
}

impl Error {
    /// How long the server asked us to wait before retrying, if it did.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Error::Transient { source, .. } | Error::Denied { source, .. } => source.retry_after(),
            Error::Unsettled { .. } => None,
        }
    }

    fn from_api(action: &'static str, source: client::Error) -> Error {
        if source.is_forbidden() || source.is_unauthorized() {
            Error::Denied { action, source }
        } else {
            Error::Transient { action, source }
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Transient { action, source } => write!(f, "{action}: {source}"),
            Error::Denied { action, source } => write!(f, "{action} denied: {source}"),
            Error::Unsettled { pod } => {
                write!(
                    f,
                    "pod {pod} changed under every one of {MAX_ROUNDS} attempts"
                )
            }
        }
    }
}

impl std::error::Error for Error {}

/// Fields every log line of one reconcile carries.
pub struct Trace<'a> {
    pub id: &'a str,
    pub key: &'a str,
}

/// Why the pod we are about to create replaces another; also the metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cause {
    /// The first pod of this object.
    New,
    /// The previous pod disappeared.
    Deleted,
    /// The previous pod ended (phase Succeeded or Failed).
    Terminated,
    /// `spec.image` changed; the previous pod was deleted for it.
    ImageChanged,
}

impl Cause {
    fn label(self) -> &'static str {
        match self {
            Cause::New => "new",
            Cause::Deleted => "deleted",
            Cause::Terminated => "terminated",
            Cause::ImageChanged => "image_changed",
        }
    }

    /// The previous pod ended without anyone asking for a new one: subject to the back-off.
    fn is_restart(self) -> bool {
        matches!(self, Cause::Deleted | Cause::Terminated)
    }
}

/// The pod we want for `ic`: built from the object alone, so it is the same every time. It is
/// born carrying [`COUNT_FINALIZER`] while starts are counted (see `counting`).
pub fn desired_pod(ic: &ImmortalContainer, counted: bool) -> Pod {
    let m = &ic.metadata;
    Pod {
        api_version: "v1".into(),
        kind: "Pod".into(),
        metadata: ObjectMeta {
            name: ic::pod_name(&m.name),
            namespace: m.namespace.clone(),
            labels: desired_labels(ic),
            annotations: BTreeMap::from([(IMAGE_ANNOTATION.to_string(), ic.spec.image.clone())]),
            owner_references: vec![OwnerReference {
                api_version: API_VERSION.into(),
                kind: KIND.into(),
                name: m.name.clone(),
                uid: m.uid.clone(),
                controller: Some(true),
                // Foreground deletion of the object waits for its pod.
                block_owner_deletion: Some(true),
            }],
            finalizers: if counted {
                vec![COUNT_FINALIZER.to_string()]
            } else {
                Vec::new()
            },
            ..Default::default()
        },
        spec: PodSpec {
            containers: vec![Container {
                name: CONTAINER_NAME.into(),
                image: ic.spec.image.clone(),
            }],
        },
        status: None,
    }
}

/// The labels our pods carry: the pod watch selects on the first; the second names the owner.
fn desired_labels(ic: &ImmortalContainer) -> BTreeMap<String, String> {
    BTreeMap::from([
        (MANAGED_BY_LABEL.to_string(), MANAGED_BY_VALUE.to_string()),
        // The uid, not the name: names go to 253 characters, label values stop at 63.
        (OWNER_UID_LABEL.to_string(), ic.metadata.uid.clone()),
    ])
}

/// Whether `pod` is controlled by `ic` (its controller reference names this very object).
fn controlled_by(pod: &Pod, ic: &ImmortalContainer) -> bool {
    pod.metadata
        .controller()
        .is_some_and(|o| o.is_immortal_container() && o.uid == ic.metadata.uid)
}

/// The image `pod` was created for: our annotation, or for a pod without it (made by hand
/// with our ownerReference) the image its container runs.
fn created_for(pod: &Pod) -> &str {
    pod.metadata
        .annotations
        .get(IMAGE_ANNOTATION)
        .map(String::as_str)
        .or(pod.container_image())
        .unwrap_or("")
}

/// Describes who holds a pod name that is not ours, for the condition message.
fn holder(pod: &Pod, ic: &ImmortalContainer) -> String {
    match pod.metadata.controller() {
        None => "it has no controller".to_string(),
        Some(o) if o.is_immortal_container() && o.name == ic.metadata.name => format!(
            "it belongs to an earlier ImmortalContainer of the same name (uid {}) and will go once the garbage collector removes it",
            o.uid
        ),
        Some(o) => format!("it is controlled by {} {} (uid {})", o.kind, o.name, o.uid),
    }
}

/// How the next round learns about the pod.
enum Look<'h> {
    /// Read it.
    Get,
    /// It is probably absent: create, and read it only if the name is taken.
    AssumeAbsent,
    /// A watch event showed it, and it is the pod already counted: act on that.
    Seen(&'h SeenPod),
    /// A watch event showed this pod (uid) terminal: delete it without reading it.
    DeleteTerminated(&'h str),
}

/// What one round found.
enum Found<'h> {
    Absent,
    Read(Box<Pod>),
    Seen(&'h SeenPod),
}

/// One reconcile. Holds what it has decided about the object's status so far.
struct Run<'a, A: Api> {
    api: &'a A,
    books: &'a Books,
    trace: &'a Trace<'a>,
    ic: &'a ImmortalContainer,
    ns: &'a str,
    pod_name: String,
    /// The object's status and resourceVersion as the API server last answered them.
    have: ImmortalContainerStatus,
    rv: String,
    /// The status this reconcile wants.
    status: ImmortalContainerStatus,
    /// The pod (uid) to release once the status that counts it is written.
    release: Option<String>,
}

/// Reconciles the object called `key`, with what its trigger says about the pod.
pub fn reconcile<A: Api>(
    api: &A,
    books: &Books,
    trace: &Trace,
    hint: Option<&PodHint>,
) -> Result<Next, Error> {
    let Some((ns, name)) = types::split_key(trace.key) else {
        log::warn!(target: "reconcile", reconcile_id = trace.id, object = trace.key; "malformed key, dropped");
        return Ok(Next::Done);
    };
    let ic = match api.get_immortal_container(ns, name) {
        Ok(ic) => ic,
        // Deleted: Kubernetes' garbage collector removes the pod through its ownerReference,
        // once nothing of ours holds it.
        Err(e) if e.is_not_found() => {
            books.restarts.forget(trace.key);
            release_orphan(api, trace, ns, name, None, hint)?;
            return Ok(Next::Done);
        }
        Err(e) => return Err(Error::from_api("get immortalcontainer", e)),
    };
    if ic.metadata.deletion_timestamp.is_some() {
        // Foreground deletion waits for the pod (blockOwnerDeletion): let it go.
        release_orphan(api, trace, ns, name, Some(&ic.metadata.uid), hint)?;
        return Ok(Next::Done);
    }
    let mut run = Run {
        api,
        books,
        trace,
        ic: &ic,
        ns,
        pod_name: ic::pod_name(name),
        have: ic.status.clone(),
        rv: ic.metadata.resource_version.clone(),
        status: ic.status.clone(),
        release: None,
    };
    run.status.observed_generation = ic.metadata.generation;
    // Written as 0 on the first status write, so `kubectl get` shows STARTS from the start.
    run.status.start_times.get_or_insert(0);
    let synced = run.sync(hint);
    // Status says what this reconcile learned even when it then failed: a pod it created is
    // counted, a refusal is reported. When the write fails too, the first error is the one
    // worth retrying on.
    let written = run.write_status();
    let next = synced?;
    written?;
    // The pod created here is counted in the status just written: it may go now.
    if let Some(uid) = run.release.take() {
        run.release(&uid)?;
    }
    Ok(next)
}

/// Lets the pod of a deleted object (or of one being deleted, with `owner_uid`) go: takes our
/// finalizer off it if it still carries it, so the garbage collector can remove it. Nothing is
/// left to count for an object that is gone. Costs a request only when the trigger said the pod
/// holds our finalizer, or said nothing (a relist, a retry).
fn release_orphan<A: Api>(
    api: &A,
    trace: &Trace,
    ns: &str,
    name: &str,
    owner_uid: Option<&str>,
    hint: Option<&PodHint>,
) -> Result<(), Error> {
    let pod_name = ic::pod_name(name);
    let uid = match hint {
        Some(PodHint::Seen(p)) if p.name == pod_name => {
            if !p.holds_count || owner_uid.is_some_and(|o| o != p.owner_uid) {
                return Ok(());
            }
            p.uid.clone()
        }
        Some(_) => return Ok(()),
        None => match api.get_pod(ns, &pod_name) {
            Ok(p) => {
                let ours = p.metadata.controller().is_some_and(|o| {
                    o.is_immortal_container()
                        && o.name == name
                        && owner_uid.map_or(true, |u| u == o.uid)
                });
                if !ours || !counting::holds(&p.metadata.finalizers) {
                    return Ok(());
                }
                p.metadata.uid
            }
            Err(e) if e.is_not_found() => return Ok(()),
            Err(e) => return Err(Error::from_api("get pod", e)),
        },
    };
    release_pod(
        api,
        trace,
        ns,
        &pod_name,
        &uid,
        "its ImmortalContainer is gone",
    )
}

/// Takes our finalizer off the pod with `uid`. Gone meanwhile is as good. A 409 is not
/// assumed to mean "replaced": the retry reads the pod and decides.
fn release_pod<A: Api>(
    api: &A,
    trace: &Trace,
    ns: &str,
    pod: &str,
    uid: &str,
    why: &str,
) -> Result<(), Error> {
    match api.patch_pod(ns, pod, &counting::release_patch(uid)) {
        Ok(_) => {
            log::debug!(
                target: "reconcile",
                reconcile_id = trace.id, object = trace.key, action = "release_pod",
                pod = pod, uid = uid, reason = why;
                "released pod"
            );
            Ok(())
        }
        Err(e) if e.is_not_found() => Ok(()),
        Err(e) => Err(Error::from_api("release pod", e)),
    }
}

impl<A: Api> Run<'_, A> {
    fn sync(&mut self, hint: Option<&PodHint>) -> Result<Next, Error> {
        if self.pod_name.len() > MAX_NAME_LEN {
            let msg = format!(
                "pod name {}… would be {} characters, over the Kubernetes limit of {MAX_NAME_LEN}; \
                 rename the ImmortalContainer to at most {} characters",
                &self.pod_name[..40],
                self.pod_name.len(),
                MAX_NAME_LEN - ic::POD_SUFFIX.len()
            );
            self.fail_permanently("PodNameTooLong", "InvalidSpec", msg);
            return Ok(Next::Done);
        }
        if self.ic.spec.image.trim().is_empty() {
            self.fail_permanently(
                "InvalidSpec",
                "InvalidSpec",
                "spec.image is empty".to_string(),
            );
            return Ok(Next::Done);
        }

        let mut look = self.first_look(hint);
        let mut cause = None;
        let mut refused: Option<client::Error> = None;
        // Normally two rounds at most (create, or look and act, then create). A world that keeps
        // changing under us (a name taken, freed and retaken between our calls) gets the
        // queue's backoff instead of a spin inside one reconcile.
        for _ in 0..MAX_ROUNDS {
            let found = match look {
                Look::AssumeAbsent => Found::Absent,
                Look::Seen(p) => Found::Seen(p),
                Look::Get => match self.api.get_pod(self.ns, &self.pod_name) {
                    Ok(p) => Found::Read(Box::new(p)),
                    Err(e) if e.is_not_found() => Found::Absent,
                    Err(e) => return Err(Error::from_api("get pod", e)),
                },
                Look::DeleteTerminated(uid) => {
                    match self.delete(uid, "it terminated")? {
                        Deleted::Removed { existed } => {
                            // It existed until now under our name, so no pod after it was
                            // started there: counting it is the decision a read of it would
                            // have led to. (Not on 404: by then a later pod may have come and
                            // gone.)
                            if existed {
                                self.count(uid);
                            }
                            cause = Some(Cause::Terminated);
                            look = Look::AssumeAbsent;
                        }
                        Deleted::Pending => {
                            self.count(uid);
                            look = Look::Get;
                        }
                        Deleted::OtherPod => look = Look::Get,
                    }
                    continue;
                }
            };
            let found = match found {
                Found::Absent => {
                    if let Some(e) = refused.take() {
                        // Looked: the name is free, the refusal stands.
                        return self.refused(e);
                    }
                    let cause = cause.unwrap_or_else(|| self.absent_cause());
                    if cause.is_restart() {
                        if let Some(wait) =
                            self.books.restarts.wait(self.trace.key, self.books.now())
                        {
                            self.back_off(wait);
                            return Ok(Next::RequeueAfter(wait.remaining));
                        }
                    }
                    match self.create(cause)? {
                        Created::Yes => {
                            if cause.is_restart() {
                                self.books
                                    .restarts
                                    .replaced(self.trace.key, self.books.now());
                            }
                            return Ok(Next::Done);
                        }
                        Created::NameTaken if matches!(look, Look::AssumeAbsent) => {
                            look = Look::Get;
                            continue;
                        }
                        // Taken although we just saw it free: whoever took it shows up on the
                        // next look. Let the queue's backoff pace that look.
                        Created::NameTaken => return Err(self.appeared()),
                        // Refused while we only assumed the name free: a pod of ours may hold
                        // it (created just before a crash, its answer lost) and must not go
                        // unnoticed behind the refusal. Look first; a second refusal stands.
                        Created::Refused(e)
                            if matches!(look, Look::AssumeAbsent) && refused.is_none() =>
                        {
                            refused = Some(e);
                            look = Look::Get;
                            continue;
                        }
                        Created::Refused(e) => return self.refused(e),
                    }
                }
                Found::Read(pod) => {
                    if !controlled_by(&pod, self.ic) {
                        return self.conflict(&pod);
                    }
                    self.restore_labels(&pod)?;
                    let view = PodView::of(&pod);
                    let image = created_for(&pod).to_string();
                    let holds = counting::holds(&pod.metadata.finalizers);
                    (pod.metadata.uid.clone(), image, view, holds)
                }
                Found::Seen(p) => (
                    p.uid.clone(),
                    p.created_for.clone(),
                    p.view.clone(),
                    p.holds_count,
                ),
            };
            let (uid, created_for, view, holds) = found;

            // Ours: it was started, so it counts, once.
            self.count(&uid);
            if holds {
                // Still held for its count (a status write failed, or the operator died, after
                // its create): it goes once the status write that ends this reconcile counts
                // it, so that whoever deletes it does not wait on us for long.
                self.release = Some(uid.clone());
            }
            if view.phase == Phase::Terminating {
                // Its DELETED event brings us back; creating now would only earn AlreadyExists.
                if created_for != self.ic.spec.image {
                    self.replacing(&created_for);
                } else {
                    self.report(&view);
                }
                return Ok(Next::Done);
            }
            if view.phase.is_terminal() {
                // A pod in a terminal phase holds no running container: the API server deletes
                // it at once whatever grace period we ask (its pod strategy), then we replace it.
                let why = format!("it ended in phase {}", view.phase.as_str());
                match self.delete(&uid, &why)? {
                    Deleted::Removed { .. } => {
                        cause = Some(Cause::Terminated);
                        look = Look::AssumeAbsent;
                    }
                    // Held by someone's finalizer: its DELETED event brings us back.
                    Deleted::Pending => {
                        self.report(&view);
                        return Ok(Next::Done);
                    }
                    Deleted::OtherPod => look = Look::Get,
                }
                continue;
            }
            // Compare the image the pod was created for (our annotation), not the one it runs:
            // an admission webhook may rewrite images (a registry mirror, a digest pin), and
            // replacing such a pod would only bring back another rewritten one, forever.
            if created_for != self.ic.spec.image {
                let why = format!("image changed from {created_for} to {}", self.ic.spec.image);
                // Graceful: the container may be running. Its DELETED event brings us back to
                // create the replacement, unless the server removed it at once (a pod not yet
                // scheduled), in which case the name is free now.
                match self.delete(&uid, &why)? {
                    Deleted::Removed { .. } => {
                        cause = Some(Cause::ImageChanged);
                        look = Look::AssumeAbsent;
                        continue;
                    }
                    Deleted::Pending => {
                        self.replacing(&created_for);
                        return Ok(Next::Done);
                    }
                    Deleted::OtherPod => {
                        look = Look::Get;
                        continue;
                    }
                }
            }
            self.report(&view);
            return Ok(Next::Done);
        }
        Err(Error::Unsettled {
            pod: self.pod_name.clone(),
        })
    }

    /// What the trigger lets the first round skip. A hint is only for this object's own pod
    /// (name and controller uid); a pod it shows alive is acted on without a read only when it
    /// is the pod already counted, so a count always rests on a pod known to exist at that
    /// moment (a watch may lag behind a replacement we made).
    fn first_look<'h>(&self, hint: Option<&'h PodHint>) -> Look<'h> {
        let ours = |p: &SeenPod| p.name == self.pod_name && p.owner_uid == self.ic.metadata.uid;
        match hint {
            Some(PodHint::Gone { .. }) => return Look::AssumeAbsent,
            Some(PodHint::Seen(p)) if ours(p) => {
                if p.view.phase.is_terminal() {
                    return Look::DeleteTerminated(&p.uid);
                }
                if self.status.last_counted_pod_uid.as_deref() == Some(p.uid.as_str()) {
                    return Look::Seen(p);
                }
            }
            _ => {}
        }
        // An object that never had a pod most likely has none: create first. (currentPod too:
        // an older CRD may prune lastCountedPodUID.)
        if self.status.last_counted_pod_uid.is_none() && self.status.current_pod.is_none() {
            Look::AssumeAbsent
        } else {
            Look::Get
        }
    }

    /// Why the pod is absent, judged from status: no pod counted yet means this is the first;
    /// a replacement in progress, or a spec not yet observed, means the image changed (a person
    /// asked for the new pod: it is never held back); otherwise it was deleted.
    fn absent_cause(&self) -> Cause {
        let spec_changed = self.ic.status.observed_generation.is_some()
            && self.ic.status.observed_generation != self.ic.metadata.generation;
        if self.status.start_times.unwrap_or(0) == 0 && self.status.last_counted_pod_uid.is_none() {
            Cause::New
        } else if spec_changed || self.ready_reason() == Some("PodReplacing") {
            Cause::ImageChanged
        } else {
            Cause::Deleted
        }
    }

    fn create(&mut self, cause: Cause) -> Result<Created, Error> {
        let counted = self.books.counting.active();
        let pod = desired_pod(self.ic, counted);
        match self.api.create_pod(self.ns, &pod) {
            Ok(created) => {
                log::info!(
                    target: "reconcile",
                    reconcile_id = self.trace.id, object = self.trace.key, action = "create_pod",
                    pod = created.metadata.name.as_str(), uid = created.metadata.uid.as_str(),
                    image = self.ic.spec.image.as_str(), cause = cause.label();
                    "created pod"
                );
                crate::runtime::metrics::record_pod_created(cause.label());
                self.count(&created.metadata.uid);
                if counted {
                    self.release = Some(created.metadata.uid.clone());
                }
                self.report(&PodView::of(&created));
                let (reason, message) = match cause {
                    Cause::New => (
                        "PodCreated",
                        format!(
                            "Created pod {} with image {}",
                            self.pod_name, self.ic.spec.image
                        ),
                    ),
                    Cause::Deleted => (
                        "PodReplaced",
                        format!(
                            "Created pod {}: the previous one was deleted",
                            self.pod_name
                        ),
                    ),
                    Cause::Terminated => (
                        "PodReplaced",
                        format!("Created pod {}: the previous one terminated", self.pod_name),
                    ),
                    Cause::ImageChanged => (
                        "PodReplaced",
                        format!(
                            "Created pod {} with image {}: the image changed",
                            self.pod_name, self.ic.spec.image
                        ),
                    ),
                };
                self.note(false, reason, message);
                Ok(Created::Yes)
            }
            Err(e) if e.is_already_exists() => Ok(Created::NameTaken),
            Err(e) if e.is_invalid() || e.is_forbidden() => Ok(Created::Refused(e)),
            Err(e) => Err(Error::from_api("create pod", e)),
        }
    }

    /// The API server refused our pod, and no pod holds its name: say why on the object. A 422
    /// will come back every time: wait for the spec to change. A 403 is admission (PodSecurity,
    /// a ResourceQuota) or RBAC: a person must act, and the fix needs no change to the object,
    /// so retry with backoff meanwhile.
    fn refused(&mut self, e: client::Error) -> Result<Next, Error> {
        let verb = if e.is_invalid() {
            "rejected"
        } else {
            "refused"
        };
        let msg = format!("the API server {verb} pod {}: {e}", self.pod_name);
        self.fail_permanently("PodCreateFailed", "PodCreateFailed", msg);
        if e.is_invalid() {
            Ok(Next::Done)
        } else {
            Err(Error::from_api("create pod", e))
        }
    }

    /// Deletes our pod with `uid` and says what became of it.
    fn delete(&mut self, uid: &str, why: &str) -> Result<Deleted, Error> {
        match self.api.delete_pod(self.ns, &self.pod_name, uid, None) {
            Ok(left) => {
                self.log_deleted(uid, why);
                if left.is_removed() {
                    Ok(Deleted::Removed { existed: true })
                } else {
                    Ok(Deleted::Pending)
                }
            }
            // Someone beat us to it, which is what we wanted.
            Err(e) if e.is_not_found() => Ok(Deleted::Removed { existed: false }),
            // The uid precondition failed: another pod holds the name now.
            Err(e) if e.is_conflict() => Ok(Deleted::OtherPod),
            Err(e) => Err(Error::from_api("delete pod", e)),
        }
    }

    fn log_deleted(&self, uid: &str, why: &str) {
        log::info!(
            target: "reconcile",
            reconcile_id = self.trace.id, object = self.trace.key, action = "delete_pod",
            pod = self.pod_name.as_str(), uid = uid, reason = why;
            "deleted pod"
        );
    }

    /// Puts back the labels of ours that someone removed from the pod: without the first, our
    /// watch no longer sees the pod at all (a label-selected watch reports it DELETED, see the
    /// `*-label-removed-*` fixtures), so its end would go unnoticed.
    fn restore_labels(&mut self, pod: &Pod) -> Result<(), Error> {
        let want = desired_labels(self.ic);
        let missing: Map<String, Value> = want
            .iter()
            .filter(|(k, v)| pod.metadata.labels.get(*k) != Some(*v))
            .map(|(k, v)| (k.clone(), json!(v)))
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        let names: Vec<&String> = missing.keys().collect();
        let patch = json!({"metadata": {"uid": pod.metadata.uid, "labels": missing}});
        match self.api.patch_pod(self.ns, &self.pod_name, &patch) {
            Ok(_) => {
                log::info!(
                    target: "reconcile",
                    reconcile_id = self.trace.id, object = self.trace.key, action = "patch_pod",
                    pod = self.pod_name.as_str(), uid = pod.metadata.uid.as_str();
                    "restored labels {names:?}"
                );
                self.note(
                    false,
                    "PodLabelsRestored",
                    format!(
                        "Restored labels {names:?} on pod {}: the operator follows its pods by them",
                        self.pod_name
                    ),
                );
                Ok(())
            }
            // Gone or replaced meanwhile: its own events bring us back.
            Err(e) if e.is_not_found() || e.is_conflict() => Ok(()),
            Err(e) => Err(Error::from_api("patch pod", e)),
        }
    }

    /// Counts the pod with `uid` unless it is the one counted last (see `counting`). While
    /// the CRD prunes `lastCountedPodUID` nothing is counted: without it a count cannot be told
    /// from a repeat.
    fn count(&mut self, uid: &str) {
        if self.status.last_counted_pod_uid.as_deref() == Some(uid) {
            return;
        }
        if !self.books.counting.active() {
            if self.have.current_pod.is_some() && self.status.start_times == self.have.start_times {
                self.note(
                    true,
                    "StartsNotCounted",
                    "status.startTimes is not counted: the installed ImmortalContainer CRD is older than the operator \
                     and prunes status.lastCountedPodUID; apply config/crd (kubectl apply -k config/crd)"
                        .to_string(),
                );
            }
            return;
        }
        *self.status.start_times.get_or_insert(0) += 1;
        self.status.last_counted_pod_uid = Some(uid.to_string());
    }

    /// Lets our pod with `uid` go (see `counting`: only once the status the API server holds
    /// counts it).
    fn release(&self, uid: &str) -> Result<(), Error> {
        let counted = self.have.last_counted_pod_uid.as_deref() == Some(uid);
        if counted || !self.books.counting.active() {
            release_pod(
                self.api,
                self.trace,
                self.ns,
                &self.pod_name,
                uid,
                "its start is counted",
            )?;
        }
        Ok(())
    }

    /// Status reports `view` of our pod.
    fn report(&mut self, view: &PodView) {
        self.status.current_pod = Some(self.pod_name.clone());
        self.status.pod_phase = Some(view.phase.as_str().to_string());
        self.set_ready(view.ready, view.reason, &view.message);
    }

    /// Our pod created for `old_image` is being deleted to make way for one with the new image.
    fn replacing(&mut self, old_image: &str) {
        self.status.current_pod = Some(self.pod_name.clone());
        self.status.pod_phase = Some(Phase::Terminating.as_str().to_string());
        let msg = format!(
            "replacing pod {}: image changed from {old_image} to {}; waiting for the old pod to go",
            self.pod_name, self.ic.spec.image
        );
        self.set_ready(false, "PodReplacing", &msg);
    }

    /// A replacement waits for the back-off: say so, once, on the object.
    fn back_off(&mut self, wait: crate::immortal::restarts::Wait) {
        let at = util::rfc3339_after(wait.remaining);
        let msg = format!(
            "pod {} ended {} time(s) in a row soon after it started; the next one is created at {at} (back-off {}s, doubling to {}s)",
            self.pod_name,
            wait.streak + 1,
            wait.remaining.as_secs_f64().ceil() as u64,
            crate::immortal::restarts::MAX.as_secs()
        );
        self.status.pod_phase = None;
        if self.set_ready(false, "PodRestartBackOff", &msg) {
            log::info!(
                target: "reconcile",
                reconcile_id = self.trace.id, object = self.trace.key, action = "back_off",
                requeue_after_ms = wait.remaining.as_millis() as u64;
                "{msg}"
            );
            self.note(true, "PodRestartBackOff", msg);
        }
    }

    /// The pod name is held by a pod we do not control: report it and leave it alone. A pod of
    /// an earlier object of the same name goes with it; if it still carries our finalizer (that
    /// object was deleted in the moment between its pod's create and its count), let it go.
    fn conflict(&mut self, pod: &Pod) -> Result<Next, Error> {
        let earlier = pod.metadata.controller().is_some_and(|o| {
            o.is_immortal_container()
                && o.name == self.ic.metadata.name
                && o.uid != self.ic.metadata.uid
        });
        if earlier && counting::holds(&pod.metadata.finalizers) {
            release_pod(
                self.api,
                self.trace,
                self.ns,
                &self.pod_name,
                &pod.metadata.uid,
                "its ImmortalContainer is gone",
            )?;
        }
        let msg = format!(
            "pod {} already exists and is not controlled by this ImmortalContainer: {}; it is left untouched",
            self.pod_name,
            holder(pod, self.ic)
        );
        self.status.pod_phase = None;
        if self.set_ready(false, "PodNameConflict", &msg) {
            log::warn!(target: "reconcile", reconcile_id = self.trace.id, object = self.trace.key, reason = "PodNameConflict"; "{msg}");
            self.note(true, "PodNameConflict", msg);
        }
        Ok(Next::RequeueAfter(CONFLICT_RETRY))
    }

    fn appeared(&self) -> Error {
        Error::Transient {
            action: "create pod",
            source: client::Error::Api(Box::new(types::Status {
                code: 409,
                reason: "AlreadyExists".into(),
                message: format!("pod {} appeared while we created it", self.pod_name),
                ..Default::default()
            })),
        }
    }

    fn ready_reason(&self) -> Option<&str> {
        self.status
            .conditions
            .iter()
            .find(|c| c.type_ == READY)
            .map(|c| c.reason.as_str())
    }

    /// Sets the Ready condition; returns whether its status or reason changed (the moments worth
    /// an Event). `lastTransitionTime` moves only when the status flips, per the API conventions.
    fn set_ready(&mut self, ready: bool, reason: &str, message: &str) -> bool {
        let status = if ready { "True" } else { "False" };
        let generation = self.ic.metadata.generation;
        match self.status.conditions.iter_mut().find(|c| c.type_ == READY) {
            Some(c) => {
                let changed = c.status != status || c.reason != reason;
                if c.status != status {
                    c.last_transition_time = util::now_rfc3339();
                }
                c.status = status.into();
                c.reason = reason.into();
                c.message = message.into();
                c.observed_generation = generation;
                changed
            }
            None => {
                self.status.conditions.push(Condition {
                    type_: READY.into(),
                    status: status.into(),
                    observed_generation: generation,
                    last_transition_time: util::now_rfc3339(),
                    reason: reason.into(),
                    message: message.into(),
                });
                true
            }
        }
    }

    /// A problem retrying cannot fix: a condition, a Warning Event when it is new, a WARN line
    /// (a person must act), and no requeue.
    fn fail_permanently(&mut self, reason: &'static str, event_reason: &'static str, msg: String) {
        self.status.pod_phase = None;
        if self.set_ready(false, reason, &msg) {
            log::warn!(target: "reconcile", reconcile_id = self.trace.id, object = self.trace.key, reason = reason; "{msg}");
            self.note(true, event_reason, msg);
        }
    }

    fn note(&self, warning: bool, reason: &'static str, message: String) {
        self.api.record(
            self.ic,
            Note {
                warning,
                reason,
                message,
            },
        );
    }

    /// Writes status if it differs from what the API server holds, as a JSON merge patch of the
    /// changed fields. A count change carries the resourceVersion we read: if anything wrote
    /// the object since, the patch fails with 409 and the next reconcile recounts from fresh
    /// state, so a pod is never counted twice. The answer is the API server's copy: what it did
    /// not keep, the CRD prunes (see `counting`).
    fn write_status(&mut self) -> Result<(), Error> {
        let counting = &self.books.counting;
        let Some(patch) = status_patch(&self.rv, &self.have, &self.status, |f| counting.prunes(f))
        else {
            return Ok(());
        };
        match self
            .api
            .patch_status(self.ns, &self.ic.metadata.name, &patch)
        {
            Ok(answered) => {
                let kept = serde_json::to_value(&answered.status).unwrap_or_default();
                let pruned = Counting::not_kept(&patch["status"], &kept);
                if !pruned.is_empty() {
                    let new = counting.learn_pruned(&pruned, "a status write did not keep it");
                    if new.contains(&"lastCountedPodUID") {
                        self.note(
                            true,
                            "StartsNotCounted",
                            "status.startTimes is no longer counted: the installed ImmortalContainer CRD is older than the \
                             operator and prunes status.lastCountedPodUID; apply config/crd (kubectl apply -k config/crd)"
                                .to_string(),
                        );
                    }
                }
                self.have = answered.status;
                self.rv = answered.metadata.resource_version;
                // What was pruned is not ours to write again: compare it as it is.
                for f in pruned {
                    match f {
                        "lastCountedPodUID" => {
                            self.status.last_counted_pod_uid =
                                self.have.last_counted_pod_uid.clone()
                        }
                        "observedGeneration" => {
                            self.status.observed_generation = self.have.observed_generation
                        }
                        _ => self.status.pod_phase = self.have.pod_phase.clone(),
                    }
                }
                log::info!(
                    target: "reconcile",
                    reconcile_id = self.trace.id, object = self.trace.key, action = "patch_status",
                    start_times = self.status.start_times.unwrap_or(0), ready = self.ready_reason().unwrap_or("");
                    "updated status"
                );
                Ok(())
            }
            // Gone meanwhile: nothing left to report on.
            Err(e) if e.is_not_found() => Ok(()),
            Err(e) => Err(Error::from_api("patch status", e)),
        }
    }
}

enum Created {
    Yes,
    /// AlreadyExists.
    NameTaken,
    /// 422 or 403: the server will not take this pod.
    Refused(client::Error),
}

/// What a DELETE of our pod did.
enum Deleted {
    /// The pod is gone: removed now (`existed`), or it was already gone (404).
    Removed { existed: bool },
    /// It is being deleted gracefully, or a finalizer holds it: its DELETED event follows.
    Pending,
    /// The uid precondition failed: the name holds another pod.
    OtherPod,
}

/// The merge patch taking the status `have` (of resourceVersion `rv`) to `want`, or `None` when
/// nothing changed (a reconcile with nothing to do writes nothing). Fields `pruned` says the
/// CRD does not keep are left out.
pub fn status_patch(
    rv: &str,
    have: &ImmortalContainerStatus,
    want: &ImmortalContainerStatus,
    pruned: impl Fn(&str) -> bool,
) -> Option<Value> {
    let mut st = Map::new();
    if want.current_pod != have.current_pod {
        st.insert("currentPod".into(), json!(want.current_pod));
    }
    if want.start_times != have.start_times {
        st.insert("startTimes".into(), json!(want.start_times));
    }
    if want.last_counted_pod_uid != have.last_counted_pod_uid && !pruned("lastCountedPodUID") {
        st.insert("lastCountedPodUID".into(), json!(want.last_counted_pod_uid));
    }
    if want.observed_generation != have.observed_generation && !pruned("observedGeneration") {
        st.insert("observedGeneration".into(), json!(want.observed_generation));
    }
    if want.pod_phase != have.pod_phase && !pruned("podPhase") {
        st.insert("podPhase".into(), json!(want.pod_phase));
    }
    if want.conditions != have.conditions {
        // Merge patch replaces lists whole: send them all.
        st.insert(
            "conditions".into(),
            serde_json::to_value(&want.conditions).unwrap_or(Value::Null),
        );
    }
    if st.is_empty() {
        return None;
    }
    // Writing the first explicit 0 counts nothing; only a change of count needs a fresh read.
    let counted = want.start_times.unwrap_or(0) != have.start_times.unwrap_or(0)
        || want.last_counted_pod_uid != have.last_counted_pod_uid;
    let mut patch = json!({ "status": st });
    if counted {
        patch["metadata"] = json!({ "resourceVersion": rv });
    }
    Some(patch)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::immortal::lifecycle::PodEvents;
    use crate::kube::types::{PodCondition, PodStatus, Status};
    use crate::runtime::watcher::{Verdict, Watched};
    use std::cell::RefCell;

    /// A fake API holding one object and one pod, recording every call as "VERB what". It
    /// deletes a pod as the API server's pod strategy does: gracefully (deletionTimestamp, the
    /// pod stays) when it runs on a node, at once when it is unscheduled (Pending here) or
    /// terminal.
    #[derive(Default)]
    struct Fake {
        ic: RefCell<Option<ImmortalContainer>>,
        pod: RefCell<Option<Pod>>,
        calls: RefCell<Vec<String>>,
        notes: RefCell<Vec<Note>>,
        /// Errors to answer the next call of a verb with.
        fail: RefCell<Vec<(&'static str, client::Error)>>,
        next_uid: RefCell<u32>,
        books: Books,
        /// Status fields the "installed CRD" does not know, pruned from every write.
        prunes: RefCell<Vec<&'static str>>,
    }

    fn api_err(code: u16, reason: &str) -> client::Error {
        client::Error::Api(Box::new(Status {
            code,
            reason: reason.into(),
            message: reason.into(),
            ..Default::default()
        }))
    }

    impl Fake {
        fn failing(&self, verb: &'static str) -> Option<client::Error> {
            let mut f = self.fail.borrow_mut();
            let i = f.iter().position(|(v, _)| *v == verb)?;
            Some(f.remove(i).1)
        }
        fn fail_next(&self, verb: &'static str, e: client::Error) {
            self.fail.borrow_mut().push((verb, e));
        }
        fn calls(&self) -> Vec<String> {
            self.calls.borrow().clone()
        }
        fn clear(&self) {
            self.calls.borrow_mut().clear();
        }
        fn call(&self, c: String) {
            self.calls.borrow_mut().push(c);
        }
    }

    impl Api for Fake {
        fn get_immortal_container(
            &self,
            _: &str,
            name: &str,
        ) -> Result<ImmortalContainer, client::Error> {
            self.call(format!("GET ic/{name}"));
            self.ic
                .borrow()
                .clone()
                .ok_or_else(|| api_err(404, "NotFound"))
        }
        fn get_pod(&self, _: &str, name: &str) -> Result<Pod, client::Error> {
            self.call(format!("GET pod/{name}"));
            if let Some(e) = self.failing("get_pod") {
                return Err(e);
            }
            self.pod
                .borrow()
                .clone()
                .ok_or_else(|| api_err(404, "NotFound"))
        }
        fn create_pod(&self, _: &str, pod: &Pod) -> Result<Pod, client::Error> {
            self.call(format!("POST pod/{}", pod.metadata.name));
            if let Some(e) = self.failing("create_pod") {
                return Err(e);
            }
            if self.pod.borrow().is_some() {
                return Err(api_err(409, "AlreadyExists"));
            }
            let mut p = pod.clone();
            *self.next_uid.borrow_mut() += 1;
            p.metadata.uid = format!("pod-uid-{}", self.next_uid.borrow());
            p.status = Some(PodStatus {
                phase: Some("Pending".into()),
                ..Default::default()
            });
            *self.pod.borrow_mut() = Some(p.clone());
            Ok(p)
        }
        fn delete_pod(
            &self,
            _: &str,
            name: &str,
            uid: &str,
            grace: Option<u32>,
        ) -> Result<Pod, client::Error> {
            let g = grace.map(|g| format!(" grace={g}")).unwrap_or_default();
            self.call(format!("DELETE pod/{name} uid={uid}{g}"));
            if let Some(e) = self.failing("delete_pod") {
                return Err(e);
            }
            // The API server checks preconditions.uid against the object: 409 on a mismatch.
            let mut slot = self.pod.borrow_mut();
            let Some(p) = slot.as_mut() else {
                return Err(api_err(404, "NotFound"));
            };
            if p.metadata.uid != uid {
                return Err(api_err(409, "Conflict"));
            }
            let scheduled_and_live = p.phase() == "Running";
            let grace = if scheduled_and_live {
                grace.map_or(30, i64::from)
            } else {
                0
            };
            p.metadata.deletion_timestamp = Some("2026-01-01T00:00:00Z".into());
            p.metadata.deletion_grace_period_seconds = Some(grace);
            let left = p.clone();
            if grace == 0 && p.metadata.finalizers.is_empty() {
                *slot = None;
            }
            Ok(left)
        }
        fn patch_pod(&self, _: &str, name: &str, patch: &Value) -> Result<Pod, client::Error> {
            let what = if patch["metadata"]["labels"].is_object() {
                "labels"
            } else {
                "release"
            };
            self.call(format!("PATCH pod/{name} {what}"));
            if let Some(e) = self.failing("patch_pod") {
                return Err(e);
            }
            let mut slot = self.pod.borrow_mut();
            let Some(p) = slot.as_mut() else {
                return Err(api_err(404, "NotFound"));
            };
            // A uid in the patch is a precondition (the API server's update preconditions).
            if patch["metadata"]["uid"] != p.metadata.uid.as_str() {
                return Err(api_err(409, "Conflict"));
            }
            if let Some(labels) = patch["metadata"]["labels"].as_object() {
                for (k, v) in labels {
                    p.metadata
                        .labels
                        .insert(k.clone(), v.as_str().unwrap().into());
                }
            }
            if let Some(gone) = patch["metadata"]["$deleteFromPrimitiveList/finalizers"].as_array()
            {
                p.metadata
                    .finalizers
                    .retain(|f| !gone.iter().any(|g| g == f));
            }
            let left = p.clone();
            // The last finalizer of a pod being deleted with grace 0 gone: it is removed.
            if p.metadata.finalizers.is_empty()
                && p.metadata.deletion_grace_period_seconds == Some(0)
            {
                *slot = None;
            }
            Ok(left)
        }
        fn patch_status(
            &self,
            _: &str,
            name: &str,
            patch: &Value,
        ) -> Result<ImmortalContainer, client::Error> {
            self.call(format!("PATCH ic/{name}/status"));
            if let Some(e) = self.failing("patch_status") {
                return Err(e);
            }
            let mut ic = self.ic.borrow().clone().unwrap();
            let st = &patch["status"];
            if let Some(v) = st.get("currentPod") {
                ic.status.current_pod = v.as_str().map(String::from);
            }
            if let Some(v) = st.get("startTimes") {
                ic.status.start_times = v.as_i64();
            }
            if let Some(v) = st.get("lastCountedPodUID") {
                ic.status.last_counted_pod_uid = v.as_str().map(String::from);
            }
            if let Some(v) = st.get("observedGeneration") {
                ic.status.observed_generation = v.as_i64();
            }
            if let Some(v) = st.get("podPhase") {
                ic.status.pod_phase = v.as_str().map(String::from);
            }
            if let Some(v) = st.get("conditions") {
                ic.status.conditions = serde_json::from_value(v.clone()).unwrap();
            }
            for f in self.prunes.borrow().iter() {
                match *f {
                    "lastCountedPodUID" => ic.status.last_counted_pod_uid = None,
                    "observedGeneration" => ic.status.observed_generation = None,
                    _ => ic.status.pod_phase = None,
                }
            }
            ic.metadata.resource_version = format!("{}1", ic.metadata.resource_version);
            *self.ic.borrow_mut() = Some(ic.clone());
            Ok(ic)
        }
        fn record(&self, _: &ImmortalContainer, note: Note) {
            self.notes.borrow_mut().push(note);
        }
    }

    fn ic(name: &str, image: &str) -> ImmortalContainer {
        ImmortalContainer {
            metadata: ObjectMeta {
                name: name.into(),
                namespace: "ns".into(),
                uid: "ic-uid".into(),
                resource_version: "10".into(),
                generation: Some(1),
                ..Default::default()
            },
            spec: ic::ImmortalContainerSpec {
                image: image.into(),
            },
            status: Default::default(),
        }
    }

    fn fake(ic: ImmortalContainer) -> Fake {
        let f = Fake::default();
        *f.ic.borrow_mut() = Some(ic);
        f
    }

    fn run(f: &Fake, key: &str) -> Result<Next, Error> {
        reconcile(f, &f.books, &Trace { id: "1", key }, None)
    }

    fn run_with(f: &Fake, hint: &PodHint) -> Result<Next, Error> {
        reconcile(
            f,
            &f.books,
            &Trace {
                id: "2",
                key: "ns/web",
            },
            Some(hint),
        )
    }

    fn gone(f: &Fake) -> PodHint {
        PodHint::Gone {
            uid: f
                .pod
                .borrow()
                .as_ref()
                .map(|p| p.metadata.uid.clone())
                .unwrap_or_default(),
        }
    }

    /// The hint the pod watcher would queue for the pod as it is now.
    fn seen(f: &Fake) -> PodHint {
        let pod = f.pod.borrow().clone().unwrap();
        match PodEvents.on_event("MODIFIED", &pod, &mut None) {
            Verdict::Queue(Some(h)) => h,
            other => panic!("the watcher would not queue this pod: {other:?}"),
        }
    }

    /// What the kubelet writes once the container runs.
    fn start_pod(f: &Fake) {
        f.pod.borrow_mut().as_mut().unwrap().status = Some(PodStatus {
            phase: Some("Running".into()),
            conditions: vec![PodCondition {
                type_: "Ready".into(),
                status: "True".into(),
                ..Default::default()
            }],
            ..Default::default()
        });
    }

    fn fail_pod(f: &Fake) {
        f.pod.borrow_mut().as_mut().unwrap().status = Some(PodStatus {
            phase: Some("Failed".into()),
            ..Default::default()
        });
    }

    /// A person deletes the pod gracefully (`kubectl delete pod`): it stays while it stops.
    fn start_deleting(f: &Fake) {
        let mut p = f.pod.borrow_mut();
        let m = &mut p.as_mut().unwrap().metadata;
        m.deletion_timestamp = Some("2026-01-01T00:00:30Z".into());
        m.deletion_grace_period_seconds = Some(30);
    }

    fn status(f: &Fake) -> ImmortalContainerStatus {
        f.ic.borrow().as_ref().unwrap().status.clone()
    }

    fn ready(f: &Fake) -> (String, String) {
        let st = status(f);
        let c = st.conditions.iter().find(|c| c.type_ == READY).unwrap();
        (c.status.clone(), c.reason.clone())
    }

    fn message(f: &Fake) -> String {
        let st = status(f);
        st.conditions
            .iter()
            .find(|c| c.type_ == READY)
            .unwrap()
            .message
            .clone()
    }

    /// As if the operator died after creating the pod and before recording it.
    fn forget_the_count(f: &Fake) {
        let mut ic = f.ic.borrow_mut();
        let st = &mut ic.as_mut().unwrap().status;
        st.start_times = Some(0);
        st.last_counted_pod_uid = None;
    }

    /// A new object whose pod was created and now runs, ready; the calls so far forgotten.
    fn running(image: &str) -> Fake {
        let f = fake(ic("web", image));
        run(&f, "ns/web").unwrap();
        start_pod(&f);
        run_with(&f, &seen(&f)).unwrap();
        f.clear();
        f
    }

    #[test]
    fn creates_the_pod_of_a_new_object_counts_it_and_reports_it_pending() {
        let f = fake(ic("web", "nginx"));
        assert_eq!(run(&f, "ns/web").unwrap(), Next::Done);
        // A new object has no pod yet: create first, no GET of the pod.
        assert_eq!(
            f.calls(),
            [
                "GET ic/web",
                "POST pod/web-immortalpod",
                "PATCH ic/web/status",
                "PATCH pod/web-immortalpod release"
            ]
        );
        let st = status(&f);
        assert_eq!(st.start_times, Some(1));
        assert_eq!(st.current_pod.as_deref(), Some("web-immortalpod"));
        assert_eq!(st.last_counted_pod_uid.as_deref(), Some("pod-uid-1"));
        assert_eq!(st.observed_generation, Some(1));
        assert_eq!(st.pod_phase.as_deref(), Some("Pending"));
        // Not ready until the pod runs: a pod just created may never start.
        assert_eq!(ready(&f), ("False".into(), "PodPending".into()));
        assert_eq!(f.notes.borrow()[0].reason, "PodCreated");
    }

    #[test]
    fn the_pod_running_turns_ready_true_from_its_event_without_reading_it() {
        let f = fake(ic("web", "nginx"));
        run(&f, "ns/web").unwrap();
        start_pod(&f);
        f.clear();
        run_with(&f, &seen(&f)).unwrap();
        assert_eq!(f.calls(), ["GET ic/web", "PATCH ic/web/status"]);
        assert_eq!(ready(&f), ("True".into(), "PodRunning".into()));
        assert_eq!(message(&f), "pod web-immortalpod runs nginx");
        assert_eq!(status(&f).pod_phase.as_deref(), Some("Running"));
        assert_eq!(status(&f).start_times, Some(1));
    }

    #[test]
    fn an_event_for_a_pod_not_counted_yet_is_read_before_it_is_counted() {
        let f = running("nginx");
        f.ic.borrow_mut()
            .as_mut()
            .unwrap()
            .status
            .last_counted_pod_uid = Some("older".into());
        run_with(&f, &seen(&f)).unwrap();
        assert_eq!(
            f.calls(),
            [
                "GET ic/web",
                "GET pod/web-immortalpod",
                "PATCH ic/web/status"
            ]
        );
        assert_eq!(status(&f).start_times, Some(2));
    }

    #[test]
    fn desired_pod_has_name_container_labels_and_controller_reference() {
        let mut o = ic(&"a".repeat(241), "nginx:1.27");
        o.metadata.uid = "09ff1c2a-773e-4ed4-824a-51e4cd7a3baf".into();
        let p = desired_pod(&o, true);
        assert_eq!(p.metadata.name.len(), 253);
        assert_eq!(
            p.spec.containers,
            vec![Container {
                name: "acontainer".into(),
                image: "nginx:1.27".into()
            }]
        );
        for v in p.metadata.labels.values() {
            assert!(v.len() <= 63, "label value {v} too long");
        }
        let owner = p.metadata.controller().unwrap();
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str()),
            ("ImmortalContainer", o.metadata.name.as_str())
        );
        assert_eq!(owner.block_owner_deletion, Some(true));
    }

    #[test]
    fn a_second_reconcile_with_nothing_to_do_writes_nothing() {
        let f = running("nginx");
        assert_eq!(run(&f, "ns/web").unwrap(), Next::Done);
        assert_eq!(f.calls(), ["GET ic/web", "GET pod/web-immortalpod"]);
        assert_eq!(status(&f).start_times, Some(1));
    }

    #[test]
    fn a_deleted_object_is_done_and_its_pod_is_let_go() {
        let f = Fake::default();
        // Nothing said about its pod (a relist): one look, in case it still holds our finalizer.
        assert_eq!(run(&f, "ns/gone").unwrap(), Next::Done);
        assert_eq!(f.calls(), ["GET ic/gone", "GET pod/gone-immortalpod"]);

        // The object was deleted between its pod's create and the status write counting it:
        // the pod carries our finalizer, and the garbage collector cannot remove it until we
        // take it off.
        let f = fake(ic("web", "nginx"));
        f.fail_next("patch_status", api_err(500, "InternalError"));
        assert!(run(&f, "ns/web").is_err());
        assert!(counting::holds(
            &f.pod.borrow().as_ref().unwrap().metadata.finalizers
        ));
        *f.ic.borrow_mut() = None;
        start_deleting(&f);
        let hint = seen(&f);
        f.clear();
        run_with(&f, &hint).unwrap();
        assert_eq!(
            f.calls(),
            ["GET ic/web", "PATCH pod/web-immortalpod release"]
        );
        // An event saying the pod holds nothing of ours costs nothing more.
        f.clear();
        run_with(&f, &seen(&f)).unwrap();
        assert_eq!(f.calls(), ["GET ic/web"]);
    }

    #[test]
    fn replaces_a_deleted_pod_and_counts_the_new_one() {
        let f = running("nginx");
        let hint = gone(&f);
        *f.pod.borrow_mut() = None;
        // Triggered by the pod's DELETED event: create without looking first.
        run_with(&f, &hint).unwrap();
        assert_eq!(
            f.calls(),
            [
                "GET ic/web",
                "POST pod/web-immortalpod",
                "PATCH ic/web/status",
                "PATCH pod/web-immortalpod release"
            ]
        );
        assert_eq!(status(&f).start_times, Some(2));
        assert_eq!(
            status(&f).last_counted_pod_uid.as_deref(),
            Some("pod-uid-2")
        );
        assert_eq!(ready(&f), ("False".into(), "PodPending".into()));
    }

    #[test]
    fn a_graceful_deletion_is_reported_terminating_and_waited_for_without_polling() {
        let f = running("nginx");
        start_deleting(&f);
        run_with(&f, &seen(&f)).unwrap();
        assert_eq!(f.calls(), ["GET ic/web", "PATCH ic/web/status"]);
        assert_eq!(ready(&f), ("False".into(), "PodTerminating".into()));
        assert_eq!(status(&f).pod_phase.as_deref(), Some("Terminating"));
        // The kubelet writes Succeeded before it removes the pod (Kubernetes 1.27+); whatever
        // queues the object meanwhile, no create is tried while the name is held.
        fail_pod(&f);
        f.clear();
        run(&f, "ns/web").unwrap();
        assert_eq!(f.calls(), ["GET ic/web", "GET pod/web-immortalpod"]);
        // Removed: its DELETED event brings the replacement.
        let hint = gone(&f);
        *f.pod.borrow_mut() = None;
        f.clear();
        run_with(&f, &hint).unwrap();
        assert_eq!(
            f.calls(),
            [
                "GET ic/web",
                "POST pod/web-immortalpod",
                "PATCH ic/web/status",
                "PATCH pod/web-immortalpod release"
            ]
        );
        assert_eq!(status(&f).start_times, Some(2));
        assert_eq!(
            f.notes.borrow().last().unwrap().message,
            "Created pod web-immortalpod: the previous one was deleted"
        );
    }

    #[test]
    fn a_pod_seen_terminated_is_deleted_by_uid_without_reading_it() {
        let f = running("nginx");
        fail_pod(&f);
        run_with(&f, &seen(&f)).unwrap();
        assert_eq!(
            f.calls(),
            [
                "GET ic/web",
                "DELETE pod/web-immortalpod uid=pod-uid-1",
                "POST pod/web-immortalpod",
                "PATCH ic/web/status",
                "PATCH pod/web-immortalpod release"
            ]
        );
        assert_eq!(status(&f).start_times, Some(2));
        assert_eq!(
            f.notes.borrow().last().unwrap().message,
            "Created pod web-immortalpod: the previous one terminated"
        );
    }

    #[test]
    fn a_terminated_pod_never_counted_is_counted_once_when_deleted_by_hint() {
        // The operator died after creating pod-uid-1 and before recording it.
        let f = running("nginx");
        forget_the_count(&f);
        fail_pod(&f);
        run_with(&f, &seen(&f)).unwrap();
        // pod-uid-1 and its replacement pod-uid-2.
        assert_eq!(status(&f).start_times, Some(2));
        assert_eq!(
            status(&f).last_counted_pod_uid.as_deref(),
            Some("pod-uid-2")
        );
    }

    #[test]
    fn a_stale_terminated_hint_falls_back_to_looking_and_counts_nothing_twice() {
        let f = running("nginx");
        fail_pod(&f);
        let stale = seen(&f);
        // pod-uid-1 terminated and was replaced by pod-uid-2 (running) before the hint's turn.
        run(&f, "ns/web").unwrap();
        start_pod(&f);
        run_with(&f, &seen(&f)).unwrap();
        assert_eq!(status(&f).start_times, Some(2));
        f.clear();
        run_with(&f, &stale).unwrap();
        assert_eq!(
            f.calls(),
            [
                "GET ic/web",
                "DELETE pod/web-immortalpod uid=pod-uid-1",
                "GET pod/web-immortalpod"
            ]
        );
        assert_eq!(status(&f).start_times, Some(2));
        // And once no pod holds the name at all, the stale hint only leads to a create (the
        // restart back-off, which the replacement above started, set aside: not under test).
        *f.pod.borrow_mut() = None;
        f.books.restarts.forget("ns/web");
        f.clear();
        run_with(&f, &stale).unwrap();
        assert_eq!(
            f.calls(),
            [
                "GET ic/web",
                "DELETE pod/web-immortalpod uid=pod-uid-1",
                "POST pod/web-immortalpod",
                "PATCH ic/web/status",
                "PATCH pod/web-immortalpod release"
            ]
        );
        assert_eq!(status(&f).start_times, Some(3));
    }

    #[test]
    fn a_hint_for_a_pod_of_another_owner_or_name_is_not_trusted() {
        for (name, owner) in [
            ("web-immortalpod", "another-ic-uid"),
            ("other-immortalpod", "ic-uid"),
        ] {
            let f = running("nginx");
            let mut hint = seen(&f);
            if let PodHint::Seen(p) = &mut hint {
                p.name = name.into();
                p.owner_uid = owner.into();
                p.view.phase = Phase::Failed;
            }
            run_with(&f, &hint).unwrap();
            // The pod is running: looked at, left alone.
            assert_eq!(
                f.calls(),
                ["GET ic/web", "GET pod/web-immortalpod"],
                "{name} {owner}"
            );
        }
    }

    #[test]
    fn an_image_change_deletes_the_running_pod_then_waits_for_its_deletion() {
        let f = running("nginx:1");
        {
            let mut ic = f.ic.borrow_mut();
            let ic = ic.as_mut().unwrap();
            ic.spec.image = "nginx:2".into();
            ic.metadata.generation = Some(2);
        }
        run(&f, "ns/web").unwrap();
        assert_eq!(
            f.calls(),
            [
                "GET ic/web",
                "GET pod/web-immortalpod",
                "DELETE pod/web-immortalpod uid=pod-uid-1",
                "PATCH ic/web/status"
            ]
        );
        assert_eq!(ready(&f), ("False".into(), "PodReplacing".into()));
        // Still terminating, and its events say so: nothing to do, nothing to write.
        f.clear();
        run_with(&f, &seen(&f)).unwrap();
        assert_eq!(f.calls(), ["GET ic/web"]);
        f.clear();
        run(&f, "ns/web").unwrap();
        assert_eq!(f.calls(), ["GET ic/web", "GET pod/web-immortalpod"]);
        // Gone: the replacement runs the new image.
        let hint = gone(&f);
        *f.pod.borrow_mut() = None;
        run_with(&f, &hint).unwrap();
        assert_eq!(
            f.pod.borrow().as_ref().unwrap().container_image(),
            Some("nginx:2")
        );
        assert_eq!(status(&f).start_times, Some(2));
        assert!(f
            .notes
            .borrow()
            .last()
            .unwrap()
            .message
            .contains("the image changed"));
    }

    #[test]
    fn an_image_change_replaces_a_pod_not_yet_scheduled_at_once() {
        let f = fake(ic("web", "nginx:1"));
        run(&f, "ns/web").unwrap();
        f.ic.borrow_mut().as_mut().unwrap().spec.image = "nginx:2".into();
        f.clear();
        run(&f, "ns/web").unwrap();
        // The server removes an unscheduled pod at once: the name is free, no event awaited.
        assert_eq!(
            f.calls(),
            [
                "GET ic/web",
                "GET pod/web-immortalpod",
                "DELETE pod/web-immortalpod uid=pod-uid-1",
                "POST pod/web-immortalpod",
                "PATCH ic/web/status",
                "PATCH pod/web-immortalpod release"
            ]
        );
        assert_eq!(
            f.pod.borrow().as_ref().unwrap().container_image(),
            Some("nginx:2")
        );
        assert_eq!(status(&f).start_times, Some(2));
    }

    #[test]
    fn a_terminal_pod_held_by_a_finalizer_is_waited_for() {
        let f = running("nginx");
        fail_pod(&f);
        f.pod.borrow_mut().as_mut().unwrap().metadata.finalizers = vec!["someone/else".into()];
        run(&f, "ns/web").unwrap();
        assert_eq!(
            f.calls(),
            [
                "GET ic/web",
                "GET pod/web-immortalpod",
                "DELETE pod/web-immortalpod uid=pod-uid-1",
                "PATCH ic/web/status"
            ]
        );
        assert_eq!(status(&f).start_times, Some(1));
        assert_eq!(ready(&f), ("False".into(), "PodTerminated".into()));
    }

    #[test]
    fn a_pod_whose_label_was_removed_gets_it_back() {
        let f = running("nginx");
        f.pod
            .borrow_mut()
            .as_mut()
            .unwrap()
            .metadata
            .labels
            .remove(MANAGED_BY_LABEL);
        // Our label-selected watch reported it DELETED, although it lives on.
        run_with(&f, &gone(&f)).unwrap();
        assert_eq!(
            f.calls(),
            [
                "GET ic/web",
                "POST pod/web-immortalpod",
                "GET pod/web-immortalpod",
                "PATCH pod/web-immortalpod labels"
            ]
        );
        let pod = f.pod.borrow().clone().unwrap();
        assert_eq!(pod.metadata.labels[MANAGED_BY_LABEL], MANAGED_BY_VALUE);
        assert_eq!(status(&f).start_times, Some(1));
        assert_eq!(f.notes.borrow().last().unwrap().reason, "PodLabelsRestored");
    }

    #[test]
    fn pods_that_keep_ending_back_off_and_say_so() {
        let f = running("nginx");
        // Deleted: replaced at once; the back-off starts.
        let hint = gone(&f);
        *f.pod.borrow_mut() = None;
        run_with(&f, &hint).unwrap();
        assert_eq!(status(&f).start_times, Some(2));
        // Deleted again right away: the next one waits.
        let hint = gone(&f);
        *f.pod.borrow_mut() = None;
        f.clear();
        let next = run_with(&f, &hint).unwrap();
        let Next::RequeueAfter(wait) = next else {
            panic!("no back-off: {next:?}")
        };
        assert!(
            wait <= crate::immortal::restarts::BASE && !wait.is_zero(),
            "{wait:?}"
        );
        assert_eq!(f.calls(), ["GET ic/web", "PATCH ic/web/status"]);
        assert_eq!(ready(&f), ("False".into(), "PodRestartBackOff".into()));
        assert_eq!(status(&f).start_times, Some(2));
        let note = f.notes.borrow().last().unwrap().clone();
        assert!(
            note.warning && note.reason == "PodRestartBackOff",
            "{note:?}"
        );
        // Its time come (as if the last replacement had been longer ago), the pod is made.
        f.books.restarts.forget("ns/web");
        f.books.restarts.replaced(
            "ns/web",
            Instant::now() - crate::immortal::restarts::BASE * 2,
        );
        f.clear();
        assert_eq!(run(&f, "ns/web").unwrap(), Next::Done);
        assert_eq!(
            f.calls(),
            [
                "GET ic/web",
                "GET pod/web-immortalpod",
                "POST pod/web-immortalpod",
                "PATCH ic/web/status",
                "PATCH pod/web-immortalpod release"
            ]
        );
        assert_eq!(status(&f).start_times, Some(3));
    }

    #[test]
    fn an_image_change_is_never_held_back() {
        let f = running("nginx:1");
        // Two quick replacements: the back-off is running.
        for _ in 0..2 {
            let hint = gone(&f);
            *f.pod.borrow_mut() = None;
            let _ = run_with(&f, &hint);
        }
        {
            let mut ic = f.ic.borrow_mut();
            let ic = ic.as_mut().unwrap();
            ic.spec.image = "nginx:2".into();
            ic.metadata.generation = Some(2);
        }
        f.clear();
        assert_eq!(run(&f, "ns/web").unwrap(), Next::Done);
        assert_eq!(
            f.pod.borrow().as_ref().unwrap().container_image(),
            Some("nginx:2")
        );
    }

    #[test]
    fn a_pod_that_is_not_ours_is_left_alone_and_reported() {
        let f = fake(ic("web", "nginx"));
        *f.pod.borrow_mut() = Some(Pod {
            metadata: ObjectMeta {
                name: "web-immortalpod".into(),
                uid: "foreign".into(),
                ..Default::default()
            },
            spec: PodSpec {
                containers: vec![Container {
                    name: "x".into(),
                    image: "busybox".into(),
                }],
            },
            ..Default::default()
        });
        assert_eq!(
            run(&f, "ns/web").unwrap(),
            Next::RequeueAfter(CONFLICT_RETRY)
        );
        // Create first (new object), AlreadyExists, look, leave it: no DELETE, no second POST.
        assert_eq!(
            f.calls(),
            [
                "GET ic/web",
                "POST pod/web-immortalpod",
                "GET pod/web-immortalpod",
                "PATCH ic/web/status"
            ]
        );
        assert_eq!(ready(&f), ("False".into(), "PodNameConflict".into()));
        assert_eq!(status(&f).start_times, Some(0), "an explicit zero");
        assert!(f.notes.borrow()[0].warning);
        // Looking again later changes nothing and writes nothing.
        f.clear();
        run(&f, "ns/web").unwrap();
        assert_eq!(
            f.calls(),
            [
                "GET ic/web",
                "POST pod/web-immortalpod",
                "GET pod/web-immortalpod"
            ]
        );
        assert_eq!(f.notes.borrow().len(), 1, "the Warning is not repeated");
    }

    #[test]
    fn a_pod_of_another_owner_with_the_same_name_is_not_ours() {
        let f = fake(ic("web", "nginx"));
        let mut stale = desired_pod(&ic("web", "nginx"), true);
        stale.metadata.owner_references[0].uid = "previous-incarnation".into();
        stale.metadata.uid = "p".into();
        *f.pod.borrow_mut() = Some(stale);
        run(&f, "ns/web").unwrap();
        let st = status(&f);
        assert!(st.conditions[0]
            .message
            .contains("earlier ImmortalContainer of the same name"));
        assert!(!f.calls().iter().any(|c| c.starts_with("DELETE")));
    }

    #[test]
    fn a_name_too_long_for_its_pod_is_a_condition_not_a_retry_loop() {
        let long = "a".repeat(253);
        let f = fake(ic(&long, "nginx"));
        let key = format!("ns/{long}");
        assert_eq!(run(&f, &key).unwrap(), Next::Done);
        assert_eq!(
            f.calls(),
            [format!("GET ic/{long}"), format!("PATCH ic/{long}/status")]
        );
        let st = status(&f);
        assert_eq!(st.conditions[0].reason, "PodNameTooLong");
        assert!(
            st.conditions[0].message.contains("253"),
            "{}",
            st.conditions[0].message
        );
        assert_eq!(f.notes.borrow()[0].reason, "InvalidSpec");
        f.clear();
        run(&f, &key).unwrap();
        assert_eq!(
            f.calls(),
            [format!("GET ic/{long}")],
            "nothing new to write"
        );
    }

    #[test]
    fn an_uncounted_pod_left_by_a_crash_is_counted_once() {
        // The operator created a pod and died before writing status.
        let f = fake(ic("web", "nginx"));
        let mut p = desired_pod(&ic("web", "nginx"), true);
        p.metadata.uid = "left-behind".into();
        *f.pod.borrow_mut() = Some(p);
        run(&f, "ns/web").unwrap();
        assert_eq!(status(&f).start_times, Some(1));
        assert_eq!(
            status(&f).last_counted_pod_uid.as_deref(),
            Some("left-behind")
        );
        run(&f, "ns/web").unwrap();
        assert_eq!(status(&f).start_times, Some(1));
    }

    #[test]
    fn a_status_conflict_is_retried_and_the_retry_does_not_count_twice() {
        let f = fake(ic("web", "nginx"));
        f.fail_next("patch_status", api_err(409, "Conflict"));
        let err = run(&f, "ns/web").unwrap_err();
        assert!(matches!(
            err,
            Error::Transient {
                action: "patch status",
                ..
            }
        ));
        assert_eq!(status(&f).start_times, None, "nothing was written");
        run(&f, "ns/web").unwrap();
        assert_eq!(status(&f).start_times, Some(1));
        assert_eq!(
            f.calls().iter().filter(|c| c.starts_with("POST")).count(),
            2,
            "second POST met AlreadyExists"
        );
    }

    #[test]
    fn a_count_carries_the_resource_version_it_was_computed_from() {
        let o = ic("web", "nginx");
        let patch = |want: &ImmortalContainerStatus| status_patch("10", &o.status, want, |_| false);
        let mut want = o.status.clone();
        want.start_times = Some(1);
        want.last_counted_pod_uid = Some("u".into());
        assert_eq!(patch(&want).unwrap()["metadata"]["resourceVersion"], "10");
        // A condition-only change, or the first explicit zero, needs no precondition.
        let mut want = o.status.clone();
        want.observed_generation = Some(1);
        want.start_times = Some(0);
        assert!(patch(&want).unwrap().get("metadata").is_none());
        assert!(patch(&o.status).is_none());
    }

    #[test]
    fn server_errors_are_transient_and_forbidden_is_denied() {
        let f = fake(ic("web", "nginx"));
        f.fail_next("create_pod", api_err(500, "InternalError"));
        assert!(matches!(
            run(&f, "ns/web"),
            Err(Error::Transient {
                action: "create pod",
                ..
            })
        ));
        f.fail_next("create_pod", api_err(403, "Forbidden"));
        assert!(matches!(run(&f, "ns/web"), Err(Error::Denied { .. })));
        assert_eq!(f.notes.borrow()[0].reason, "PodCreateFailed");
    }

    #[test]
    fn a_create_refused_by_admission_is_reported_with_the_servers_message() {
        let (code, body) = crate::testutil::kubelet_fixture("14-pod-create-forbidden-pod-security");
        let refusal = client::Error::Api(Box::new(client::parse_status(code, &body)));
        let f = fake(ic("web", "nginx"));
        f.fail_next("create_pod", refusal);
        let err = run(&f, "ns/web").unwrap_err();
        assert!(matches!(err, Error::Denied { .. }), "{err}");
        // Written although the reconcile failed: the user sees why, without reading logs.
        assert!(f.calls().contains(&"PATCH ic/web/status".to_string()));
        assert_eq!(ready(&f), ("False".into(), "PodCreateFailed".into()));
        let msg = message(&f);
        assert!(
            msg.contains("violates PodSecurity \"restricted:latest\""),
            "{msg}"
        );
        assert_eq!(status(&f).start_times, Some(0));
    }

    #[test]
    fn a_start_counted_before_a_refused_create_is_still_written() {
        // A terminated pod never counted (the operator died before recording it) is deleted;
        // its replacement is refused by a quota. The first pod's start must not be lost.
        let f = running("nginx");
        forget_the_count(&f);
        fail_pod(&f);
        let (code, body) = crate::testutil::kubelet_fixture("15-pod-create-forbidden-quota");
        f.fail_next(
            "create_pod",
            client::Error::Api(Box::new(client::parse_status(code, &body))),
        );
        assert!(run_with(&f, &seen(&f)).is_err());
        assert_eq!(status(&f).start_times, Some(1));
        assert_eq!(
            status(&f).last_counted_pod_uid.as_deref(),
            Some("pod-uid-1")
        );
        assert!(message(&f).contains("exceeded quota"), "{}", message(&f));
    }

    #[test]
    fn a_pod_deleted_before_the_failed_status_write_is_retried_is_still_counted() {
        // The create is accepted, the status write counting it refused (someone labelled the
        // object: 409), and the pod deleted before the retry. It cannot vanish uncounted: it
        // carries our finalizer until a status write counts it.
        let f = fake(ic("web", "nginx"));
        f.fail_next("patch_status", api_err(409, "Conflict"));
        assert!(run(&f, "ns/web").is_err());
        let first = f.pod.borrow().clone().unwrap();
        f.call("(a person deletes the pod)".into());
        f.delete_pod("ns", "web-immortalpod", &first.metadata.uid, None)
            .unwrap();
        assert!(f.pod.borrow().is_some(), "held by our finalizer");
        // The retry (no hint: a retry after error) counts it, then lets it go.
        run(&f, "ns/web").unwrap();
        assert_eq!(status(&f).start_times, Some(1));
        assert!(f.pod.borrow().is_none(), "released, so removed");
        // Its DELETED event: the replacement, the second start.
        run_with(
            &f,
            &PodHint::Gone {
                uid: first.metadata.uid.clone(),
            },
        )
        .unwrap();
        assert_eq!(status(&f).start_times, Some(2));
        assert_eq!(*f.next_uid.borrow(), 2, "two pods were accepted");
    }

    #[test]
    fn a_crd_that_prunes_the_last_counted_uid_stops_the_counting_and_says_so_once() {
        let f = fake(ic("web", "nginx"));
        *f.prunes.borrow_mut() = vec!["lastCountedPodUID", "observedGeneration", "podPhase"];
        run(&f, "ns/web").unwrap();
        // The first count went through (startTimes is in every CRD), L did not stick.
        assert_eq!(status(&f).start_times, Some(1));
        assert!(!f.books.counting.active());
        let warned: Vec<Note> = f
            .notes
            .borrow()
            .iter()
            .filter(|n| n.reason == "StartsNotCounted")
            .cloned()
            .collect();
        assert_eq!(warned.len(), 1, "{:?}", f.notes.borrow());
        assert!(warned[0].warning && warned[0].message.contains("config/crd"));
        // The pod is let go all the same: nothing can count it any more.
        assert!(f
            .calls()
            .contains(&"PATCH pod/web-immortalpod release".to_string()));
        // Reconciling again and again counts nothing more and writes nothing.
        start_pod(&f);
        for _ in 0..5 {
            run(&f, "ns/web").unwrap();
        }
        assert_eq!(status(&f).start_times, Some(1));
        f.clear();
        run(&f, "ns/web").unwrap();
        assert_eq!(f.calls(), ["GET ic/web", "GET pod/web-immortalpod"]);
        // A replacement is still made, and not counted, and carries no finalizer.
        let hint = gone(&f);
        *f.pod.borrow_mut() = None;
        run_with(&f, &hint).unwrap();
        assert_eq!(status(&f).start_times, Some(1));
        assert!(f
            .pod
            .borrow()
            .as_ref()
            .unwrap()
            .metadata
            .finalizers
            .is_empty());
    }

    #[test]
    fn a_pod_the_server_rejects_becomes_a_condition() {
        let f = fake(ic("web", "nginx"));
        f.fail_next("create_pod", api_err(422, "Invalid"));
        assert_eq!(run(&f, "ns/web").unwrap(), Next::Done);
        assert_eq!(ready(&f), ("False".into(), "PodCreateFailed".into()));
    }

    #[test]
    fn lasttransitiontime_moves_only_when_the_status_flips() {
        let f = running("nginx");
        let t0 = status(&f).conditions[0].last_transition_time.clone();
        f.ic.borrow_mut().as_mut().unwrap().status.conditions[0].last_transition_time =
            "2000-01-01T00:00:00Z".into();
        run(&f, "ns/web").unwrap();
        assert_eq!(
            status(&f).conditions[0].last_transition_time,
            "2000-01-01T00:00:00Z"
        );
        assert!(!t0.is_empty());
    }

    #[test]
    fn a_name_that_keeps_changing_under_us_is_left_to_the_backoff_not_spun_on() {
        // A terminated pod of ours that every DELETE reports gone (404) and every look finds
        // again: delete, create (taken), look, delete, ... must stop.
        let f = fake(ic("web", "nginx"));
        let mut p = desired_pod(&ic("web", "nginx"), true);
        p.metadata.uid = "stuck".into();
        p.status = Some(PodStatus {
            phase: Some("Failed".into()),
            ..Default::default()
        });
        *f.pod.borrow_mut() = Some(p);
        f.ic.borrow_mut()
            .as_mut()
            .unwrap()
            .status
            .last_counted_pod_uid = Some("stuck".into());
        for _ in 0..10 {
            f.fail_next("delete_pod", api_err(404, "NotFound"));
        }
        let err = run(&f, "ns/web").unwrap_err();
        assert!(matches!(err, Error::Unsettled { .. }), "{err}");
        assert!(f.calls().len() <= 2 * MAX_ROUNDS + 2, "{:?}", f.calls());
    }

    #[test]
    fn an_image_rewritten_by_an_admission_webhook_does_not_replace_the_pod() {
        let f = running("nginx");
        // A mutating webhook pointed the container at a mirror.
        f.pod.borrow_mut().as_mut().unwrap().spec.containers[0].image =
            "mirror.example/nginx".into();
        run(&f, "ns/web").unwrap();
        assert!(
            !f.calls().iter().any(|c| c.starts_with("DELETE")),
            "{:?}",
            f.calls()
        );
        assert_eq!(status(&f).start_times, Some(1));
        // A change of spec.image still replaces it.
        f.ic.borrow_mut().as_mut().unwrap().spec.image = "nginx:2".into();
        run(&f, "ns/web").unwrap();
        assert!(
            f.calls().iter().any(|c| c.starts_with("DELETE")),
            "{:?}",
            f.calls()
        );
    }
}
