//! Reconcile one key: make the world hold exactly one pod for the ImmortalContainer, and make
//! its status say so, counting every pod started exactly once.
//!
//! Level-based, as sample-controller's `syncHandler`: re-read the object by key (NotFound is
//! success: the garbage collector removes its pod), look at the pod by name, act, then write
//! status through `/status` only if it changed. The count survives crashes and 409s because it
//! is derived from what is observed: status keeps the uid of the last pod counted, and a pod we
//! control with any other uid has not been counted yet.

use crate::client;
use crate::queue::TerminatedPod;
use crate::resources::{
    self, Condition, Container, ImmortalContainer, ImmortalContainerStatus, ObjectMeta,
    OwnerReference, Pod, PodSpec, API_VERSION, CONTAINER_NAME, IMAGE_ANNOTATION, KIND,
    MANAGED_BY_LABEL, MANAGED_BY_VALUE, MAX_NAME_LEN, OWNER_UID_LABEL,
};
use crate::util;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

/// How long to wait before looking again at a pod name held by a pod that is not ours. Such a
/// pod is invisible to our pod watch (it lacks our label), so only a timer notices it leaving;
/// this one is slow enough not to load the API server with a stuck object.
pub const CONFLICT_RETRY: Duration = Duration::from_secs(30);

/// Rounds of look-and-act one reconcile makes before it leaves the key to the queue's backoff.
const MAX_ROUNDS: usize = 4;

/// The condition type the operator maintains.
pub const READY: &str = "Ready";

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
    fn delete_pod(
        &self,
        ns: &str,
        name: &str,
        uid: &str,
        grace: Option<u32>,
    ) -> Result<(), client::Error>;
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
    pub events: crate::events::Recorder,
}

impl Api for Cluster {
    fn get_immortal_container(
        &self,
        ns: &str,
        name: &str,
    ) -> Result<ImmortalContainer, client::Error> {
        self.client.get_immortal_container(ns, name)
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
    ) -> Result<(), client::Error> {
        self.client.delete_pod(ns, name, uid, grace)
    }
    fn patch_status(
        &self,
        ns: &str,
        name: &str,
        patch: &Value,
    ) -> Result<ImmortalContainer, client::Error> {
        self.client.patch_immortal_container_status(ns, name, patch)
    }
    fn record(&self, ic: &ImmortalContainer, note: Note) {
        self.events.record(ic, note);
    }
}

/// An Event to record: Normal or Warning, a CamelCase reason, a sentence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    pub warning: bool,
    pub reason: &'static str,
    pub message: String,
}

/// What the trigger already says about the object's pod. A stale hint costs one more answer
/// from the API server, never a wrong decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodHint<'a> {
    /// Nothing: look at the pod.
    None,
    /// Our pod's DELETED event: it is probably absent, so try the create first and look only
    /// if the name is taken.
    Gone,
    /// This pod was seen in a terminal phase: delete it by uid, without reading it first.
    Terminated(&'a TerminatedPod),
}

/// What the worker does with the key after a successful reconcile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Nothing to do until a watch event says otherwise.
    Done,
    /// Look again after this long (a pod name held by someone else).
    RequeueAfter(Duration),
}

/// Why a reconcile failed. Every variant is retried with the queue's per-key backoff; what
/// retrying cannot fix (an invalid spec, a name too long, a pod that is not ours) is not an
/// error but a status condition.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// An API call failed in a way a retry may fix: 5xx, 429, no answer, a 409 from a stale
    /// read, a pod name still held by a pod being deleted.
    Transient {
        action: &'static str,
        source: client::Error,
    },
    /// The API server refused us (401/403): a person must fix RBAC or credentials. Retried
    /// with backoff, since that fix needs no restart.
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
}

/// The pod we want for `ic`: built from the object alone, so it is the same every time.
pub fn desired_pod(ic: &ImmortalContainer) -> Pod {
    let m = &ic.metadata;
    let labels = BTreeMap::from([
        (MANAGED_BY_LABEL.to_string(), MANAGED_BY_VALUE.to_string()),
        // The uid, not the name: names go to 253 characters, label values stop at 63.
        (OWNER_UID_LABEL.to_string(), m.uid.clone()),
    ]);
    Pod {
        api_version: "v1".into(),
        kind: "Pod".into(),
        metadata: ObjectMeta {
            name: resources::pod_name(&m.name),
            namespace: m.namespace.clone(),
            labels,
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

/// One reconcile. Holds what it has decided about the object's status so far.
struct Run<'a, A: Api> {
    api: &'a A,
    trace: &'a Trace<'a>,
    ic: &'a ImmortalContainer,
    ns: &'a str,
    pod_name: String,
    status: ImmortalContainerStatus,
}

/// Reconciles the object called `key`, with what its trigger says about the pod.
pub fn reconcile<A: Api>(api: &A, trace: &Trace, hint: PodHint) -> Result<Next, Error> {
    let Some((ns, name)) = resources::split_key(trace.key) else {
        log::warn!(target: "reconcile", reconcile_id = trace.id, object = trace.key; "malformed key, dropped");
        return Ok(Next::Done);
    };
    let ic = match api.get_immortal_container(ns, name) {
        Ok(ic) => ic,
        // Deleted: Kubernetes' garbage collector removes the pod through its ownerReference.
        Err(e) if e.is_not_found() => return Ok(Next::Done),
        Err(e) => return Err(Error::from_api("get immortalcontainer", e)),
    };
    if ic.metadata.deletion_timestamp.is_some() {
        return Ok(Next::Done);
    }
    let mut run = Run {
        api,
        trace,
        ic: &ic,
        ns,
        pod_name: resources::pod_name(name),
        status: ic.status.clone(),
    };
    run.status.observed_generation = ic.metadata.generation;
    // Written as 0 on the first status write, so `kubectl get` shows STARTS from the start.
    run.status.start_times.get_or_insert(0);
    let next = run.sync(hint)?;
    run.write_status()?;
    Ok(next)
}

impl<A: Api> Run<'_, A> {
    fn sync(&mut self, hint: PodHint) -> Result<Next, Error> {
        if self.pod_name.len() > MAX_NAME_LEN {
            let msg = format!(
                "pod name {}… would be {} characters, over the Kubernetes limit of {MAX_NAME_LEN}; \
                 rename the ImmortalContainer to at most {} characters",
                &self.pod_name[..40],
                self.pod_name.len(),
                MAX_NAME_LEN - resources::POD_SUFFIX.len()
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

        // An object that never had a pod, or whose pod we just saw deleted, most likely has
        // none: try the create first and look only if the name is taken.
        let mut assume_absent = hint == PodHint::Gone || self.status.last_counted_pod_uid.is_none();
        let mut cause = None;
        if let PodHint::Terminated(pod) = hint {
            if let Some(free) = self.delete_terminated(pod)? {
                assume_absent = free;
                cause = Some(Cause::Terminated);
            }
        }
        // Normally two rounds at most (create, or look and act, then create). A world that keeps
        // changing under us (a name taken, freed and retaken between our calls) gets the
        // queue's backoff instead of a spin inside one reconcile.
        for _ in 0..MAX_ROUNDS {
            let pod = if assume_absent {
                None
            } else {
                match self.api.get_pod(self.ns, &self.pod_name) {
                    Ok(p) => Some(p),
                    Err(e) if e.is_not_found() => None,
                    Err(e) => return Err(Error::from_api("get pod", e)),
                }
            };
            let Some(pod) = pod else {
                let cause = cause.unwrap_or(self.absent_cause());
                match self.create(cause)? {
                    Created::Yes => return Ok(Next::Done),
                    Created::NameTaken if assume_absent => {
                        assume_absent = false;
                        continue;
                    }
                    // Taken although we just saw it free: whoever took it shows up on the next
                    // look. Let the queue's backoff pace that look.
                    Created::NameTaken => {
                        return Err(Error::Transient {
                            action: "create pod",
                            source: client::Error::Api(Box::new(resources::Status {
                                code: 409,
                                reason: "AlreadyExists".into(),
                                message: format!(
                                    "pod {} appeared while we created it",
                                    self.pod_name
                                ),
                                ..Default::default()
                            })),
                        })
                    }
                    Created::Rejected => return Ok(Next::Done),
                }
            };

            if !controlled_by(&pod, self.ic) {
                let msg = format!(
                    "pod {} already exists and is not controlled by this ImmortalContainer: {}; it is left untouched",
                    self.pod_name,
                    holder(&pod, self.ic)
                );
                if self.set_ready(false, "PodNameConflict", &msg) {
                    log::warn!(target: "reconcile", reconcile_id = self.trace.id, object = self.trace.key, reason = "PodNameConflict"; "{msg}");
                    self.note(true, "PodNameConflict", msg);
                }
                return Ok(Next::RequeueAfter(CONFLICT_RETRY));
            }

            // Ours: it was started, so it counts, once.
            self.count(&pod.metadata.uid);
            self.status.current_pod = Some(self.pod_name.clone());

            if pod.metadata.deletion_timestamp.is_some() {
                // Its DELETED event brings us back; creating now would only earn AlreadyExists.
                let replacing = self.ready_reason() == Some("PodReplacing");
                if !replacing {
                    self.set_ready(
                        false,
                        "PodTerminating",
                        &format!("pod {} is being deleted", self.pod_name),
                    );
                }
                return Ok(Next::Done);
            }
            if pod.is_terminated() {
                let phase = pod.phase().to_string();
                // A terminated pod holds no running container: delete it at once (grace 0).
                self.delete(&pod, Some(0), &format!("it terminated (phase {phase})"))?;
                cause = Some(Cause::Terminated);
                assume_absent = true;
                continue;
            }
            // Compare the image the pod was created for (our annotation), not the one it runs:
            // an admission webhook may rewrite images (a registry mirror, a digest pin), and
            // replacing such a pod would only bring back another rewritten one, forever.
            let have = created_for(&pod);
            if have != self.ic.spec.image {
                let why = format!("image changed from {have} to {}", self.ic.spec.image);
                // Graceful: the container is running. Its DELETED event brings us back to
                // create the replacement.
                self.delete(&pod, None, &why)?;
                self.set_ready(
                    false,
                    "PodReplacing",
                    &format!("replacing pod {}: {why}", self.pod_name),
                );
                return Ok(Next::Done);
            }
            self.set_ready(
                true,
                "PodRunning",
                &format!("pod {} runs {}", self.pod_name, self.ic.spec.image),
            );
            return Ok(Next::Done);
        }
        Err(Error::Unsettled {
            pod: self.pod_name.clone(),
        })
    }

    /// Why the pod is absent, judged from status: no pod counted yet means this is the first;
    /// a replacement in progress means the image changed; otherwise it was deleted.
    fn absent_cause(&self) -> Cause {
        if self.status.start_times.unwrap_or(0) == 0 && self.status.last_counted_pod_uid.is_none() {
            Cause::New
        } else if self.ready_reason() == Some("PodReplacing") {
            Cause::ImageChanged
        } else {
            Cause::Deleted
        }
    }

    fn create(&mut self, cause: Cause) -> Result<Created, Error> {
        let pod = desired_pod(self.ic);
        match self.api.create_pod(self.ns, &pod) {
            Ok(created) => {
                log::info!(
                    target: "reconcile",
                    reconcile_id = self.trace.id, object = self.trace.key, action = "create_pod",
                    pod = created.metadata.name.as_str(), uid = created.metadata.uid.as_str(),
                    image = self.ic.spec.image.as_str(), cause = cause.label();
                    "created pod"
                );
                crate::metrics::record_pod_created(cause.label());
                self.count(&created.metadata.uid);
                self.status.current_pod = Some(self.pod_name.clone());
                let msg = format!("pod {} runs {}", self.pod_name, self.ic.spec.image);
                self.set_ready(true, "PodRunning", &msg);
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
            Err(e) if e.is_invalid() => {
                // The server will refuse this pod every time: say why on the object and wait
                // for the spec to change.
                let msg = format!("the API server rejected pod {}: {e}", self.pod_name);
                self.fail_permanently("PodCreateFailed", "PodCreateFailed", msg);
                Ok(Created::Rejected)
            }
            Err(e) => {
                if e.is_forbidden() {
                    self.note(
                        true,
                        "PodCreateFailed",
                        format!("Cannot create pod {}: {e}", self.pod_name),
                    );
                }
                Err(Error::from_api("create pod", e))
            }
        }
    }

    fn delete(&mut self, pod: &Pod, grace: Option<u32>, why: &str) -> Result<(), Error> {
        // NotFound: someone beat us to it, which is what we wanted.
        let result = self
            .api
            .delete_pod(self.ns, &pod.metadata.name, &pod.metadata.uid, grace);
        match result.or_else(|e| if e.is_not_found() { Ok(()) } else { Err(e) }) {
            Ok(()) => {
                self.log_deleted(&pod.metadata.name, &pod.metadata.uid, why);
                Ok(())
            }
            Err(e) => Err(Error::from_api("delete pod", e)),
        }
    }

    /// Deletes the pod a watch event saw terminated, by its uid and without reading it first,
    /// when it holds our pod's name and this object controls it (else `None`: the hint is not
    /// for us). `Some(true)`: the name is most likely free. `Some(false)`: the uid precondition
    /// failed, another pod holds the name, so look at it.
    fn delete_terminated(&mut self, pod: &TerminatedPod) -> Result<Option<bool>, Error> {
        if pod.name != self.pod_name || pod.owner_uid != self.ic.metadata.uid {
            return Ok(None);
        }
        match self.api.delete_pod(self.ns, &pod.name, &pod.uid, Some(0)) {
            Ok(()) => {
                self.log_deleted(&pod.name, &pod.uid, "it terminated");
                // It existed until now under our name, so no pod after it was started there:
                // counting it here is the same decision a GET of it would have led to. (Not
                // on 404: by then a later pod may have come and gone.)
                self.count(&pod.uid);
                self.status.current_pod = Some(self.pod_name.clone());
                Ok(Some(true))
            }
            Err(e) if e.is_not_found() => Ok(Some(true)),
            Err(e) if e.is_conflict() => Ok(Some(false)),
            Err(e) => Err(Error::from_api("delete pod", e)),
        }
    }

    fn log_deleted(&self, pod: &str, uid: &str, why: &str) {
        log::info!(
            target: "reconcile",
            reconcile_id = self.trace.id, object = self.trace.key, action = "delete_pod",
            pod = pod, uid = uid, reason = why;
            "deleted pod"
        );
    }

    /// Counts the pod with `uid` unless it is the one counted last.
    fn count(&mut self, uid: &str) {
        if self.status.last_counted_pod_uid.as_deref() != Some(uid) {
            *self.status.start_times.get_or_insert(0) += 1;
            self.status.last_counted_pod_uid = Some(uid.to_string());
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

    /// Writes status if it differs from what was read, as a JSON merge patch of the changed
    /// fields. A count change carries the resourceVersion we read: if anything wrote the object
    /// since, the patch fails with 409 and the next reconcile recounts from fresh state, so a
    /// pod is never counted twice.
    fn write_status(&self) -> Result<(), Error> {
        let Some(patch) = status_patch(self.ic, &self.status) else {
            return Ok(());
        };
        match self
            .api
            .patch_status(self.ns, &self.ic.metadata.name, &patch)
        {
            Ok(_) => {
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
    /// 422: recorded as a condition.
    Rejected,
}

/// The merge patch taking `ic`'s status to `want`, or `None` when nothing changed (a reconcile
/// with nothing to do writes nothing).
pub fn status_patch(ic: &ImmortalContainer, want: &ImmortalContainerStatus) -> Option<Value> {
    let have = &ic.status;
    let mut st = Map::new();
    if want.current_pod != have.current_pod {
        st.insert("currentPod".into(), json!(want.current_pod));
    }
    if want.start_times != have.start_times {
        st.insert("startTimes".into(), json!(want.start_times));
    }
    if want.last_counted_pod_uid != have.last_counted_pod_uid {
        st.insert("lastCountedPodUID".into(), json!(want.last_counted_pod_uid));
    }
    if want.observed_generation != have.observed_generation {
        st.insert("observedGeneration".into(), json!(want.observed_generation));
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
        patch["metadata"] = json!({ "resourceVersion": ic.metadata.resource_version });
    }
    Some(patch)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::{PodStatus, Status};
    use std::cell::RefCell;

    /// A fake API over a map of objects, recording every call as "VERB what".
    #[derive(Default)]
    struct Fake {
        ic: RefCell<Option<ImmortalContainer>>,
        pod: RefCell<Option<Pod>>,
        calls: RefCell<Vec<String>>,
        notes: RefCell<Vec<Note>>,
        /// Errors to answer the next call of a verb with.
        fail: RefCell<Vec<(&'static str, client::Error)>>,
        next_uid: RefCell<u32>,
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
        fn calls(&self) -> Vec<String> {
            self.calls.borrow().clone()
        }
    }

    impl Api for Fake {
        fn get_immortal_container(
            &self,
            _: &str,
            name: &str,
        ) -> Result<ImmortalContainer, client::Error> {
            self.calls.borrow_mut().push(format!("GET ic/{name}"));
            self.ic
                .borrow()
                .clone()
                .ok_or_else(|| api_err(404, "NotFound"))
        }
        fn get_pod(&self, _: &str, name: &str) -> Result<Pod, client::Error> {
            self.calls.borrow_mut().push(format!("GET pod/{name}"));
            if let Some(e) = self.failing("get_pod") {
                return Err(e);
            }
            self.pod
                .borrow()
                .clone()
                .ok_or_else(|| api_err(404, "NotFound"))
        }
        fn create_pod(&self, _: &str, pod: &Pod) -> Result<Pod, client::Error> {
            self.calls
                .borrow_mut()
                .push(format!("POST pod/{}", pod.metadata.name));
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
        ) -> Result<(), client::Error> {
            let g = grace.map(|g| format!(" grace={g}")).unwrap_or_default();
            self.calls
                .borrow_mut()
                .push(format!("DELETE pod/{name} uid={uid}{g}"));
            if let Some(e) = self.failing("delete_pod") {
                return Err(e);
            }
            // The API server checks preconditions.uid against the object: 409 on a mismatch.
            match self.pod.borrow().as_ref() {
                None => return Err(api_err(404, "NotFound")),
                Some(p) if p.metadata.uid != uid => return Err(api_err(409, "Conflict")),
                Some(_) => {}
            }
            if grace == Some(0) {
                *self.pod.borrow_mut() = None;
            } else if let Some(p) = self.pod.borrow_mut().as_mut() {
                p.metadata.deletion_timestamp = Some("2026-01-01T00:00:00Z".into());
            }
            Ok(())
        }
        fn patch_status(
            &self,
            _: &str,
            name: &str,
            patch: &Value,
        ) -> Result<ImmortalContainer, client::Error> {
            self.calls
                .borrow_mut()
                .push(format!("PATCH ic/{name}/status"));
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
            if let Some(v) = st.get("conditions") {
                ic.status.conditions = serde_json::from_value(v.clone()).unwrap();
            }
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
            spec: resources::ImmortalContainerSpec {
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
        reconcile(f, &Trace { id: "1", key }, PodHint::None)
    }

    fn status(f: &Fake) -> ImmortalContainerStatus {
        f.ic.borrow().as_ref().unwrap().status.clone()
    }

    fn ready(f: &Fake) -> (String, String) {
        let st = status(f);
        let c = st.conditions.iter().find(|c| c.type_ == READY).unwrap();
        (c.status.clone(), c.reason.clone())
    }

    #[test]
    fn creates_the_pod_of_a_new_object_and_counts_it() {
        let f = fake(ic("web", "nginx"));
        assert_eq!(run(&f, "ns/web").unwrap(), Next::Done);
        // A new object has no pod yet: create first, no GET of the pod.
        assert_eq!(
            f.calls(),
            [
                "GET ic/web",
                "POST pod/web-immortalpod",
                "PATCH ic/web/status"
            ]
        );
        let st = status(&f);
        assert_eq!(st.start_times, Some(1));
        assert_eq!(st.current_pod.as_deref(), Some("web-immortalpod"));
        assert_eq!(st.last_counted_pod_uid.as_deref(), Some("pod-uid-1"));
        assert_eq!(st.observed_generation, Some(1));
        assert_eq!(ready(&f), ("True".into(), "PodRunning".into()));
        assert_eq!(f.notes.borrow()[0].reason, "PodCreated");
    }

    #[test]
    fn desired_pod_has_name_container_labels_and_controller_reference() {
        let mut o = ic(&"a".repeat(241), "nginx:1.27");
        o.metadata.uid = "09ff1c2a-773e-4ed4-824a-51e4cd7a3baf".into();
        let p = desired_pod(&o);
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
        let f = fake(ic("web", "nginx"));
        run(&f, "ns/web").unwrap();
        f.calls.borrow_mut().clear();
        assert_eq!(run(&f, "ns/web").unwrap(), Next::Done);
        assert_eq!(f.calls(), ["GET ic/web", "GET pod/web-immortalpod"]);
        assert_eq!(status(&f).start_times, Some(1));
    }

    #[test]
    fn a_deleted_object_is_done() {
        let f = Fake::default();
        assert_eq!(run(&f, "ns/gone").unwrap(), Next::Done);
        assert_eq!(f.calls(), ["GET ic/gone"]);
    }

    #[test]
    fn replaces_a_deleted_pod_and_counts_the_new_one() {
        let f = fake(ic("web", "nginx"));
        run(&f, "ns/web").unwrap();
        *f.pod.borrow_mut() = None;
        f.calls.borrow_mut().clear();
        // Triggered by the pod's DELETED event: create without looking first.
        reconcile(
            &f,
            &Trace {
                id: "2",
                key: "ns/web",
            },
            PodHint::Gone,
        )
        .unwrap();
        assert_eq!(
            f.calls(),
            [
                "GET ic/web",
                "POST pod/web-immortalpod",
                "PATCH ic/web/status"
            ]
        );
        assert_eq!(status(&f).start_times, Some(2));
        assert_eq!(f.notes.borrow().last().unwrap().reason, "PodReplaced");
    }

    #[test]
    fn replaces_a_terminated_pod_in_one_reconcile() {
        let f = fake(ic("web", "nginx"));
        run(&f, "ns/web").unwrap();
        fail_pod(&f);
        f.calls.borrow_mut().clear();
        run(&f, "ns/web").unwrap();
        assert_eq!(
            f.calls(),
            [
                "GET ic/web",
                "GET pod/web-immortalpod",
                "DELETE pod/web-immortalpod uid=pod-uid-1 grace=0",
                "POST pod/web-immortalpod",
                "PATCH ic/web/status"
            ]
        );
        assert_eq!(status(&f).start_times, Some(2));
        assert_eq!(
            status(&f).last_counted_pod_uid.as_deref(),
            Some("pod-uid-2")
        );
    }

    fn terminated(name: &str, uid: &str, owner_uid: &str) -> TerminatedPod {
        TerminatedPod {
            name: name.into(),
            uid: uid.into(),
            owner_uid: owner_uid.into(),
        }
    }

    fn run_with(f: &Fake, hint: PodHint) -> Result<Next, Error> {
        reconcile(
            f,
            &Trace {
                id: "2",
                key: "ns/web",
            },
            hint,
        )
    }

    fn fail_pod(f: &Fake) {
        f.pod.borrow_mut().as_mut().unwrap().status = Some(PodStatus {
            phase: Some("Failed".into()),
        });
    }

    #[test]
    fn a_pod_seen_terminated_is_deleted_by_uid_without_reading_it() {
        let f = fake(ic("web", "nginx"));
        run(&f, "ns/web").unwrap();
        fail_pod(&f);
        f.calls.borrow_mut().clear();
        let pod = terminated("web-immortalpod", "pod-uid-1", "ic-uid");
        run_with(&f, PodHint::Terminated(&pod)).unwrap();
        assert_eq!(
            f.calls(),
            [
                "GET ic/web",
                "DELETE pod/web-immortalpod uid=pod-uid-1 grace=0",
                "POST pod/web-immortalpod",
                "PATCH ic/web/status"
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
        let f = fake(ic("web", "nginx"));
        run(&f, "ns/web").unwrap();
        {
            let mut ic = f.ic.borrow_mut();
            let st = &mut ic.as_mut().unwrap().status;
            st.start_times = Some(0);
            st.last_counted_pod_uid = None;
        }
        fail_pod(&f);
        let pod = terminated("web-immortalpod", "pod-uid-1", "ic-uid");
        run_with(&f, PodHint::Terminated(&pod)).unwrap();
        // pod-uid-1 and its replacement pod-uid-2.
        assert_eq!(status(&f).start_times, Some(2));
        assert_eq!(
            status(&f).last_counted_pod_uid.as_deref(),
            Some("pod-uid-2")
        );
    }

    #[test]
    fn a_stale_terminated_hint_falls_back_to_looking_and_counts_nothing_twice() {
        let f = fake(ic("web", "nginx"));
        run(&f, "ns/web").unwrap();
        // pod-uid-1 terminated and was replaced by pod-uid-2 (running) before the hint's turn.
        fail_pod(&f);
        run(&f, "ns/web").unwrap();
        assert_eq!(status(&f).start_times, Some(2));
        f.calls.borrow_mut().clear();
        let stale = terminated("web-immortalpod", "pod-uid-1", "ic-uid");
        run_with(&f, PodHint::Terminated(&stale)).unwrap();
        assert_eq!(
            f.calls(),
            [
                "GET ic/web",
                "DELETE pod/web-immortalpod uid=pod-uid-1 grace=0",
                "GET pod/web-immortalpod"
            ]
        );
        assert_eq!(status(&f).start_times, Some(2));
        // And once no pod holds the name at all, the stale hint only leads to a create.
        *f.pod.borrow_mut() = None;
        f.calls.borrow_mut().clear();
        run_with(&f, PodHint::Terminated(&stale)).unwrap();
        assert_eq!(
            f.calls(),
            [
                "GET ic/web",
                "DELETE pod/web-immortalpod uid=pod-uid-1 grace=0",
                "POST pod/web-immortalpod",
                "PATCH ic/web/status"
            ]
        );
        assert_eq!(status(&f).start_times, Some(3));
    }

    #[test]
    fn a_terminated_hint_for_a_pod_of_another_owner_or_name_is_ignored() {
        for pod in [
            terminated("web-immortalpod", "pod-uid-1", "another-ic-uid"),
            terminated("other-immortalpod", "pod-uid-1", "ic-uid"),
        ] {
            let f = fake(ic("web", "nginx"));
            run(&f, "ns/web").unwrap();
            f.calls.borrow_mut().clear();
            run_with(&f, PodHint::Terminated(&pod)).unwrap();
            // The pod is running: looked at, left alone.
            assert_eq!(
                f.calls(),
                ["GET ic/web", "GET pod/web-immortalpod"],
                "{pod:?}"
            );
        }
    }

    #[test]
    fn an_image_change_deletes_the_pod_then_waits_for_its_deletion() {
        let f = fake(ic("web", "nginx:1"));
        run(&f, "ns/web").unwrap();
        {
            let mut ic = f.ic.borrow_mut();
            let ic = ic.as_mut().unwrap();
            ic.spec.image = "nginx:2".into();
            ic.metadata.generation = Some(2);
        }
        f.calls.borrow_mut().clear();
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
        // Still terminating: nothing to do.
        f.calls.borrow_mut().clear();
        run(&f, "ns/web").unwrap();
        assert_eq!(f.calls(), ["GET ic/web", "GET pod/web-immortalpod"]);
        // Gone: the replacement runs the new image.
        *f.pod.borrow_mut() = None;
        reconcile(
            &f,
            &Trace {
                id: "3",
                key: "ns/web",
            },
            PodHint::Gone,
        )
        .unwrap();
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
        f.calls.borrow_mut().clear();
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
        let mut stale = desired_pod(&ic("web", "nginx"));
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
        f.calls.borrow_mut().clear();
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
        let mut p = desired_pod(&ic("web", "nginx"));
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
        f.fail
            .borrow_mut()
            .push(("patch_status", api_err(409, "Conflict")));
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
        let mut want = o.status.clone();
        want.start_times = Some(1);
        want.last_counted_pod_uid = Some("u".into());
        let p = status_patch(&o, &want).unwrap();
        assert_eq!(p["metadata"]["resourceVersion"], "10");
        // A condition-only change, or the first explicit zero, needs no precondition.
        let mut want = o.status.clone();
        want.observed_generation = Some(1);
        want.start_times = Some(0);
        assert!(status_patch(&o, &want).unwrap().get("metadata").is_none());
        assert!(status_patch(&o, &o.status).is_none());
    }

    #[test]
    fn server_errors_are_transient_and_forbidden_is_denied() {
        let f = fake(ic("web", "nginx"));
        f.fail
            .borrow_mut()
            .push(("create_pod", api_err(500, "InternalError")));
        assert!(matches!(
            run(&f, "ns/web"),
            Err(Error::Transient {
                action: "create pod",
                ..
            })
        ));
        f.fail
            .borrow_mut()
            .push(("create_pod", api_err(403, "Forbidden")));
        assert!(matches!(run(&f, "ns/web"), Err(Error::Denied { .. })));
        assert_eq!(f.notes.borrow()[0].reason, "PodCreateFailed");
    }

    #[test]
    fn a_pod_the_server_rejects_becomes_a_condition() {
        let f = fake(ic("web", "nginx"));
        f.fail
            .borrow_mut()
            .push(("create_pod", api_err(422, "Invalid")));
        assert_eq!(run(&f, "ns/web").unwrap(), Next::Done);
        assert_eq!(ready(&f), ("False".into(), "PodCreateFailed".into()));
    }

    #[test]
    fn lasttransitiontime_moves_only_when_the_status_flips() {
        let f = fake(ic("web", "nginx"));
        run(&f, "ns/web").unwrap();
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
        let mut p = desired_pod(&ic("web", "nginx"));
        p.metadata.uid = "stuck".into();
        p.status = Some(PodStatus {
            phase: Some("Failed".into()),
        });
        *f.pod.borrow_mut() = Some(p);
        f.ic.borrow_mut()
            .as_mut()
            .unwrap()
            .status
            .last_counted_pod_uid = Some("stuck".into());
        for _ in 0..10 {
            f.fail
                .borrow_mut()
                .push(("delete_pod", api_err(404, "NotFound")));
        }
        let err = run(&f, "ns/web").unwrap_err();
        assert!(matches!(err, Error::Unsettled { .. }), "{err}");
        assert!(f.calls().len() <= 2 * MAX_ROUNDS + 1, "{:?}", f.calls());
    }

    #[test]
    fn an_image_rewritten_by_an_admission_webhook_does_not_replace_the_pod() {
        let f = fake(ic("web", "nginx"));
        run(&f, "ns/web").unwrap();
        // A mutating webhook pointed the container at a mirror.
        f.pod.borrow_mut().as_mut().unwrap().spec.containers[0].image =
            "mirror.example/nginx".into();
        f.calls.borrow_mut().clear();
        run(&f, "ns/web").unwrap();
        assert_eq!(
            f.calls(),
            ["GET ic/web", "GET pod/web-immortalpod"],
            "no delete, no write"
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
