//! Tests of reconcile against a fake API: every decision, the calls it makes, the status it writes.

use super::starts::release_pod;
use super::*;
use crate::immortal::desired::desired_pod;
use crate::immortal::lifecycle::PodEventHandler;
use crate::immortal::types::{ImmortalPod, MANAGED_BY_LABEL, MANAGED_BY_VALUE};
use crate::kube::types::{
    Container, ObjectMeta, PodCondition, PodSpec, PodStatus, Status, StatusCause, StatusDetails,
};
use crate::runtime::controller::Failure;
use crate::runtime::queue::Priority;
use crate::runtime::watcher::{EventHandler, Reaction};
use std::cell::RefCell;
use std::time::{Instant, SystemTime};

/// A fake API holding one object and one pod, recording every call as "VERB what". It
/// deletes a pod as the API server's pod strategy does: gracefully (deletionTimestamp, the
/// pod stays) when it runs on a node, at once when it is unscheduled (Pending here) or
/// terminal. `CACHED ic/NAME` is the object as the operator knows it (from its store, no
/// request in the real operator, as a lister's Get); `GET ic/NAME` asks the API server.
#[derive(Default)]
struct Fake {
    ic: RefCell<Option<ImmortalContainer>>,
    /// The operator's own copy of the object when it differs from the API server's (`None`:
    /// it knows the server's): kept from reads and status writes' answers, as `ic_state::saw`.
    stored: RefCell<Option<ImmortalContainer>>,
    pod: RefCell<Option<Pod>>,
    calls: RefCell<Vec<String>>,
    notes: RefCell<Vec<Note>>,
    /// Errors to answer the next call of a verb with.
    fail: RefCell<Vec<(&'static str, client::Error)>>,
    next_uid: RefCell<u32>,
    /// The resourceVersion of the fake's last pod write.
    pod_rv: RefCell<u64>,
    ctx: Context,
    /// Status fields the "installed CRD" does not know, pruned from every write.
    prunes: RefCell<Vec<&'static str>>,
    /// The pod is removed just before the next pod PATCH reaches it (a graceful deletion
    /// ending between our read and our write).
    vanish_before_patch: RefCell<bool>,
    /// Pod spec fields the "API server" does not keep (`securityContext.appArmorProfile`),
    /// dropped from what a create stores.
    drops: RefCell<Vec<&'static str>>,
}

fn api_err(code: u16, reason: &str) -> client::Error {
    client::Error::Api(Box::new(Status {
        code,
        reason: reason.into(),
        message: reason.into(),
        ..Default::default()
    }))
}

/// What the API server answers a PATCH whose `metadata.uid` is not the object's `kind`
/// `name`: 422, the uid immutable (fixture kube-1.28-kubelet/18).
fn uid_changed(kind: &str, name: &str, sent: &str) -> client::Error {
    let cause = StatusCause {
        reason: "FieldValueInvalid".into(),
        message: format!("Invalid value: {sent:?}: field is immutable"),
        field: "metadata.uid".into(),
    };
    client::Error::Api(Box::new(Status {
        code: 422,
        reason: "Invalid".into(),
        message: format!(
            "{kind} {name:?} is invalid: metadata.uid: {}",
            cause.message
        ),
        details: Some(StatusDetails {
            name: name.into(),
            kind: kind.into(),
            causes: vec![cause.clone(), cause],
            ..Default::default()
        }),
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
    /// The resourceVersion of a pod write: one more than the last.
    fn stamp(&self) -> String {
        *self.pod_rv.borrow_mut() += 1;
        self.pod_rv.borrow().to_string()
    }
}

impl Api for Fake {
    fn cached_immortal_container(
        &self,
        _: &str,
        name: &str,
    ) -> Result<ImmortalContainer, client::Error> {
        self.call(format!("CACHED ic/{name}"));
        if let Some(stored) = self.stored.borrow().clone() {
            return Ok(stored);
        }
        self.ic
            .borrow()
            .clone()
            .ok_or_else(|| api_err(404, "NotFound"))
    }
    fn get_immortal_container(
        &self,
        _: &str,
        name: &str,
    ) -> Result<ImmortalContainer, client::Error> {
        self.call(format!("GET ic/{name}"));
        *self.stored.borrow_mut() = None;
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
    fn create_pod(&self, _: &str, pod: &Pod) -> Result<client::CreatedPod, client::Error> {
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
        p.metadata.resource_version = self.stamp();
        p.status = Some(PodStatus {
            phase: Some("Pending".into()),
            ..Default::default()
        });
        *self.pod.borrow_mut() = Some(p.clone());
        let mut spec = serde_json::to_value(&p.spec).unwrap();
        for path in self.drops.borrow().iter() {
            let (parent, field) = path.rsplit_once('.').unwrap_or(("", path));
            let node = parent
                .split('.')
                .filter(|k| !k.is_empty())
                .fold(&mut spec, |n, k| &mut n[k]);
            if let Some(o) = node.as_object_mut() {
                o.remove(field);
            }
        }
        Ok(client::CreatedPod { pod: p, spec })
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
        if self.vanish_before_patch.replace(false) {
            *self.pod.borrow_mut() = None;
        }
        let mut slot = self.pod.borrow_mut();
        let Some(p) = slot.as_mut() else {
            return Err(api_err(404, "NotFound"));
        };
        // A patch's uid that is not the pod's is a change of an immutable field.
        if patch["metadata"]["uid"] != p.metadata.uid.as_str() {
            let sent = patch["metadata"]["uid"].as_str().unwrap_or("");
            return Err(uid_changed("Pod", name, sent));
        }
        if let Some(labels) = patch["metadata"]["labels"].as_object() {
            for (k, v) in labels {
                p.metadata
                    .labels
                    .insert(k.clone(), v.as_str().unwrap().into());
            }
        }
        if let Some(gone) = patch["metadata"]["$deleteFromPrimitiveList/finalizers"].as_array() {
            p.metadata
                .finalizers
                .retain(|f| !gone.iter().any(|g| g == f));
        }
        p.metadata.resource_version = self.stamp();
        let left = p.clone();
        // The last finalizer of a pod being deleted with grace 0 gone: it is removed.
        if p.metadata.finalizers.is_empty() && p.metadata.deletion_grace_period_seconds == Some(0) {
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
        // The resourceVersion precondition, the one `/status` honours: a uid in the patch is
        // ignored, the stored metadata copied over it (fixtures kube-1.28-kubelet/21, 24).
        if let Some(rv) = patch["metadata"]["resourceVersion"].as_str() {
            if rv != ic.metadata.resource_version {
                return Err(api_err(409, "Conflict"));
            }
        }
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
        *self.stored.borrow_mut() = None;
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
            ..Default::default()
        },
        status: Default::default(),
    }
}

thread_local! {
    /// The time of day the operator reads in these tests: the moment the fake API server
    /// stamps its deletions with, until a test moves it.
    static WALL: std::cell::Cell<SystemTime> =
        std::cell::Cell::new(crate::util::parse_rfc3339("2026-01-01T00:00:00Z").unwrap());
}

fn wall() -> SystemTime {
    WALL.with(std::cell::Cell::get)
}

/// Moves the time of day the operator reads by `d`.
fn pass(d: Duration) {
    WALL.with(|w| w.set(w.get() + d));
}

/// A ctx that reads the time of day from [`WALL`].
fn ctx(clock: impl Fn() -> Instant + Send + Sync + 'static) -> Context {
    Context::with_clock(clock).with_wall_clock(wall)
}

fn fake(ic: ImmortalContainer) -> Fake {
    let f = Fake {
        ctx: ctx(Instant::now),
        ..Default::default()
    };
    *f.ic.borrow_mut() = Some(ic);
    f
}

fn run(f: &Fake, key: &str) -> Result<Action, Error> {
    let key = key.into();
    reconcile(f, &f.ctx, &LogContext { id: "1", key: &key }, None)
}

fn run_with(f: &Fake, hint: &PodHint) -> Result<Action, Error> {
    reconcile(
        f,
        &f.ctx,
        &LogContext {
            id: "2",
            key: &"ns/web".into(),
        },
        Some(hint),
    )
}

/// The hint the pod watcher would queue for the pod's DELETED event, as it is now.
fn gone(f: &Fake) -> PodHint {
    let pod = f.pod.borrow().clone().unwrap_or_default();
    match PodEventHandler.on_event("DELETED", &pod, &mut None) {
        Reaction::Queue(Some(h), _) => h,
        other => panic!("the watcher would not queue a DELETED pod: {other:?}"),
    }
}

/// Someone force-deletes the pod `ran` seconds after its container started: it is gone at
/// once. Answers the hint its DELETED event queues.
fn delete_after_running(f: &Fake, ran: u64) -> PodHint {
    {
        let mut slot = f.pod.borrow_mut();
        let p = slot.as_mut().unwrap();
        let asked = crate::util::parse_rfc3339("2026-01-01T00:00:00Z").unwrap();
        let started = crate::util::rfc3339(asked - std::time::Duration::from_secs(ran));
        let st = p.status.get_or_insert_with(Default::default);
        st.phase = Some("Running".into());
        st.container_statuses = vec![types::ContainerStatus {
            name: ic::CONTAINER_NAME.into(),
            state: types::ContainerState {
                running: Some(types::Running {
                    started_at: Some(started),
                }),
                ..Default::default()
            },
            ..Default::default()
        }];
        p.metadata.deletion_timestamp = Some("2026-01-01T00:00:00Z".into());
        p.metadata.deletion_grace_period_seconds = Some(0);
    }
    let hint = gone(f);
    *f.pod.borrow_mut() = None;
    hint
}

/// The hint the pod watcher would queue for the pod as it is now.
fn seen(f: &Fake) -> PodHint {
    let pod = f.pod.borrow().clone().unwrap();
    match PodEventHandler.on_event("MODIFIED", &pod, &mut None) {
        Reaction::Queue(Some(h), _) => h,
        other => panic!("the watcher would not queue this pod: {other:?}"),
    }
}

/// The hint the pod watcher queues for the ADDED event of the pod as it is now: a pod just
/// created, still held for its count, comes back to be counted, urgent.
fn added(f: &Fake) -> PodHint {
    let pod = f.pod.borrow().clone().unwrap();
    match PodEventHandler.on_event("ADDED", &pod, &mut None) {
        Reaction::Queue(Some(h), Priority::Urgent) => h,
        other => panic!("the watcher would not queue the new pod as urgent: {other:?}"),
    }
}

/// What a reconcile that made a pod answers: a look by the time it is to be released.
const MADE: Action = Action::requeue(counting::RELEASE_WITHIN);

/// The object's pod made and counted, as the create's reconcile and then the one its ADDED
/// event queues do: pending, still held by our finalizer.
fn made(f: &Fake) {
    assert_eq!(run(f, "ns/web").unwrap(), MADE);
    count_made(f);
}

/// The reconcile the ADDED event of the pod just made queues: it counts the pod, whose release
/// is left to routine work, within the bound.
fn count_made(f: &Fake) {
    assert_eq!(
        run_with(f, &added(f)).unwrap(),
        Action::requeue(Duration::ZERO).at(Priority::Routine)
    );
}

/// When the fake kubelet starts every container: a minute before the fake API server's
/// deletions (which it stamps `2026-01-01T00:00:00Z` plus the grace period).
const STARTED: &str = "2025-12-31T23:59:00Z";

/// Our container's status, started at [`STARTED`], running or `terminated` at `finished`.
fn container_status(finished: Option<&str>) -> types::ContainerStatus {
    let mut state = types::ContainerState::default();
    match finished {
        None => {
            state.running = Some(types::Running {
                started_at: Some(STARTED.into()),
            })
        }
        Some(at) => {
            state.terminated = Some(types::StateDetail {
                exit_code: Some(1),
                started_at: Some(STARTED.into()),
                finished_at: Some(at.into()),
                ..Default::default()
            })
        }
    }
    types::ContainerStatus {
        name: ic::CONTAINER_NAME.into(),
        state,
        ..Default::default()
    }
}

/// The kubelet fails the pod, its container having ended at `finished`, the rest of its
/// status (its conditions) left as it was; answers the pod.
fn end_pod_at(f: &Fake, finished: &str) -> Pod {
    let mut slot = f.pod.borrow_mut();
    let pod = slot.as_mut().unwrap();
    let st = pod.status.get_or_insert_with(Default::default);
    st.phase = Some("Failed".into());
    st.container_statuses = vec![container_status(Some(finished))];
    pod.clone()
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
        container_statuses: vec![container_status(None)],
        ..Default::default()
    });
}

/// The kubelet says the pod's containers are ready, or not.
fn set_pod_ready(f: &Fake, ready: bool) {
    let mut slot = f.pod.borrow_mut();
    let st = slot.as_mut().unwrap().status.as_mut().unwrap();
    st.conditions[0].status = if ready { "True" } else { "False" }.into();
}

/// The pod ends on its own, its container having run 65 s.
fn fail_pod(f: &Fake) {
    f.pod.borrow_mut().as_mut().unwrap().status = Some(PodStatus {
        phase: Some("Failed".into()),
        container_statuses: vec![container_status(Some("2026-01-01T00:00:05Z"))],
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
    made(&f);
    start_pod(&f);
    run_with(&f, &seen(&f)).unwrap();
    f.clear();
    f
}

#[test]
fn creates_the_pod_of_a_new_object_then_counts_it_and_reports_it_pending() {
    let f = fake(ic("web", "nginx"));
    assert_eq!(run(&f, "ns/web").unwrap(), MADE);
    // A new object has no pod yet: create first, no GET of the pod; and nothing else, so
    // that the worker goes on to the next object's pod (pods first).
    assert_eq!(f.calls(), ["CACHED ic/web", "POST pod/web-immortalpod"]);
    assert_eq!(status(&f), Default::default());
    assert_eq!(f.notes.borrow()[0].reason, "PodCreated");
    // The reconcile its ADDED event queues counts it from the event (this process made that
    // very pod) and says it is pending: one write.
    f.clear();
    count_made(&f);
    assert_eq!(f.calls(), ["CACHED ic/web", "PATCH ic/web/status"]);
    let st = status(&f);
    assert_eq!(st.start_times, Some(1));
    assert_eq!(st.current_pod.as_deref(), Some("web-immortalpod"));
    assert_eq!(st.last_counted_pod_uid.as_deref(), Some("pod-uid-1"));
    assert_eq!(st.observed_generation, Some(1));
    assert_eq!(st.pod_phase.as_deref(), Some("Pending"));
    // Not ready until the pod runs: a pod just created may never start.
    assert_eq!(ready(&f), ("False".into(), "PodPending".into()));
    // Still held: the reconcile of its next event (the scheduler's, the kubelet's) lets it go
    // as it says so.
    assert!(counting::is_held(&finalizers(&f)));
    start_pod(&f);
    f.clear();
    assert_eq!(run_with(&f, &seen(&f)).unwrap(), Action::await_change());
    assert_eq!(
        f.calls(),
        [
            "CACHED ic/web",
            "PATCH ic/web/status",
            "PATCH pod/web-immortalpod release"
        ]
    );
    assert!(finalizers(&f).is_empty());
    assert_eq!(status(&f).start_times, Some(1));
}

#[test]
fn the_pod_running_turns_ready_true_from_its_event_without_reading_it() {
    let f = fake(ic("web", "nginx"));
    run(&f, "ns/web").unwrap();
    start_pod(&f);
    f.clear();
    let hint = seen(&f);
    assert_eq!(
        run_with(&f, &hint).unwrap(),
        Action::requeue(Duration::ZERO).at(Priority::Routine)
    );
    // The kubelet's event replaced the ADDED one in the queue: its reconcile counts the pod
    // and says it runs, in one write; the release is routine work, queued again with the
    // same event, which it trusts.
    assert_eq!(f.calls(), ["CACHED ic/web", "PATCH ic/web/status"]);
    f.clear();
    assert_eq!(run_with(&f, &hint).unwrap(), Action::await_change());
    assert_eq!(
        f.calls(),
        ["CACHED ic/web", "PATCH pod/web-immortalpod release"]
    );
    assert_eq!(ready(&f), ("True".into(), "PodRunning".into()));
    assert_eq!(message(&f), "pod web-immortalpod runs nginx");
    // Running and released: the next change of it costs the status write alone.
    set_pod_ready(&f, false);
    f.clear();
    run_with(&f, &seen(&f)).unwrap();
    assert_eq!(f.calls(), ["CACHED ic/web", "PATCH ic/web/status"]);
    assert_eq!(ready(&f).0, "False");
    assert_eq!(status(&f).pod_phase.as_deref(), Some("Running"));
    assert_eq!(status(&f).start_times, Some(1));
}

#[test]
fn an_event_older_than_our_release_of_the_pod_does_not_release_it_again() {
    let f = fake(ic("web", "nginx"));
    made(&f);
    // The scheduler's write: its reconcile lets the pod go.
    f.clear();
    run_with(&f, &seen(&f)).unwrap();
    assert_eq!(
        f.calls(),
        ["CACHED ic/web", "PATCH pod/web-immortalpod release"]
    );
    // The pod ran within milliseconds: the kubelet's write came before our release, and its
    // event, queued meanwhile, still shows our finalizer.
    start_pod(&f);
    let released = f.pod.borrow().clone().unwrap();
    let mut before = released.clone();
    before.metadata.finalizers.push(ic::COUNT_FINALIZER.into());
    let release_rv: u64 = released.metadata.resource_version.parse().unwrap();
    before.metadata.resource_version = (release_rv - 1).to_string();
    *f.pod.borrow_mut() = Some(before);
    let hint = seen(&f);
    *f.pod.borrow_mut() = Some(released);
    f.clear();
    run_with(&f, &hint).unwrap();
    // Status says it runs; the pod is not written again.
    assert_eq!(f.calls(), ["CACHED ic/web", "PATCH ic/web/status"]);
    assert_eq!(ready(&f).0, "True");
    assert!(finalizers(&f).is_empty());
}

#[test]
fn our_finalizer_seen_after_our_release_is_released_again() {
    let f = fake(ic("web", "nginx"));
    made(&f);
    start_pod(&f);
    // Put back after our release (by a restore from a backup, say): a later event shows it,
    // and a pod already counted never keeps it.
    {
        let mut slot = f.pod.borrow_mut();
        let p = slot.as_mut().unwrap();
        p.metadata.finalizers.push(ic::COUNT_FINALIZER.into());
        p.metadata.resource_version = f.stamp();
    }
    let hint = seen(&f);
    f.clear();
    run_with(&f, &hint).unwrap();
    assert_eq!(
        f.calls(),
        [
            "CACHED ic/web",
            "PATCH ic/web/status",
            "PATCH pod/web-immortalpod release"
        ]
    );
    assert!(finalizers(&f).is_empty());
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
            "CACHED ic/web",
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
            image: "nginx:1.27".into(),
            ..Default::default()
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
    assert_eq!(run(&f, "ns/web").unwrap(), Action::await_change());
    assert_eq!(f.calls(), ["CACHED ic/web", "GET pod/web-immortalpod"]);
    assert_eq!(status(&f).start_times, Some(1));
}

#[test]
fn a_deleted_object_is_done_and_its_pod_is_released() {
    let f = Fake::default();
    // Nothing said about its pod (a relist): one look, in case it still holds our finalizer.
    assert_eq!(run(&f, "ns/gone").unwrap(), Action::await_change());
    assert_eq!(f.calls(), ["CACHED ic/gone", "GET pod/gone-immortalpod"]);

    // The object was deleted between its pod's create and the status write counting it:
    // the pod carries our finalizer, and the garbage collector cannot remove it until we
    // take it off.
    let f = fake(ic("web", "nginx"));
    run(&f, "ns/web").unwrap();
    f.fail_next("patch_status", api_err(500, "InternalError"));
    assert!(run_with(&f, &added(&f)).is_err());
    assert!(counting::is_held(
        &f.pod.borrow().as_ref().unwrap().metadata.finalizers
    ));
    *f.ic.borrow_mut() = None;
    start_deleting(&f);
    let hint = seen(&f);
    f.clear();
    run_with(&f, &hint).unwrap();
    assert_eq!(
        f.calls(),
        ["CACHED ic/web", "PATCH pod/web-immortalpod release"]
    );
    // An event saying the pod holds nothing of ours costs nothing more.
    f.clear();
    run_with(&f, &seen(&f)).unwrap();
    assert_eq!(f.calls(), ["CACHED ic/web"]);
}

#[test]
fn replaces_a_deleted_pod_and_counts_the_new_one() {
    let f = running("nginx");
    let hint = gone(&f);
    *f.pod.borrow_mut() = None;
    // Triggered by the pod's DELETED event: create without looking first; its ADDED event
    // counts it.
    run_with(&f, &hint).unwrap();
    assert_eq!(f.calls(), ["CACHED ic/web", "POST pod/web-immortalpod"]);
    f.clear();
    count_made(&f);
    assert_eq!(f.calls(), ["CACHED ic/web", "PATCH ic/web/status"]);
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
    assert_eq!(f.calls(), ["CACHED ic/web", "PATCH ic/web/status"]);
    assert_eq!(ready(&f), ("False".into(), "PodTerminating".into()));
    assert_eq!(status(&f).pod_phase.as_deref(), Some("Terminating"));
    // The kubelet writes Succeeded before it removes the pod (Kubernetes 1.27+); whatever
    // queues the object meanwhile, no create is tried while the name is held.
    fail_pod(&f);
    f.clear();
    run(&f, "ns/web").unwrap();
    assert_eq!(f.calls(), ["CACHED ic/web", "GET pod/web-immortalpod"]);
    // Removed: its DELETED event brings the replacement.
    let hint = gone(&f);
    *f.pod.borrow_mut() = None;
    f.clear();
    run_with(&f, &hint).unwrap();
    assert_eq!(f.calls(), ["CACHED ic/web", "POST pod/web-immortalpod"]);
    count_made(&f);
    assert_eq!(status(&f).start_times, Some(2));
    assert_eq!(
        f.notes.borrow().last().unwrap().message,
        "Created pod web-immortalpod: the previous one was deleted 1 min after it started"
    );
}

#[test]
fn the_replacement_s_event_says_who_ended_the_pod_and_how_long_it_ran() {
    let f = running("nginx");
    // Its node was deleted: the pod garbage collector marks it and deletes it at once.
    f.pod
        .borrow_mut()
        .as_mut()
        .unwrap()
        .status
        .get_or_insert_with(Default::default)
        .conditions
        .push(PodCondition {
            type_: "DisruptionTarget".into(),
            status: "True".into(),
            reason: "DeletionByPodGC".into(),
            message: "PodGC: node no longer exists".into(),
        });
    let hint = delete_after_running(&f, 1502);
    run_with(&f, &hint).unwrap();
    assert_eq!(f.calls(), ["CACHED ic/web", "POST pod/web-immortalpod"]);
    let note = f.notes.borrow().last().unwrap().clone();
    assert_eq!(
        (note.reason, note.message.as_str()),
        (
            "PodReplaced",
            "Created pod web-immortalpod: the previous one was deleted (DeletionByPodGC) 25 min after it started"
        )
    );
}

#[test]
fn a_pod_its_node_has_not_confirmed_deleted_says_so_once_a_step_and_looks_again_at_the_next() {
    let f = running("nginx");
    f.pod.borrow_mut().as_mut().unwrap().spec.node_name = "node-1".into();
    // Deleted now with a 30 s grace period, on a node that will never confirm it.
    start_deleting(&f);
    assert_eq!(
        run_with(&f, &seen(&f)).unwrap(),
        Action::requeue(Duration::from_secs(40)).at(Priority::Routine)
    );
    assert_eq!(f.calls(), ["CACHED ic/web", "PATCH ic/web/status"]);
    assert_eq!(message(&f), "pod web-immortalpod is being deleted");
    // 10 s past the grace period: said once, with where to look.
    pass(Duration::from_secs(40));
    f.clear();
    assert_eq!(
        run(&f, "ns/web").unwrap(),
        Action::requeue(Duration::from_secs(50)).at(Priority::Routine)
    );
    assert_eq!(
        f.calls(),
        [
            "CACHED ic/web",
            "GET pod/web-immortalpod",
            "PATCH ic/web/status"
        ]
    );
    assert_eq!(ready(&f), ("False".into(), "PodTerminating".into()));
    assert_eq!(
        message(&f),
        "pod web-immortalpod is being deleted; its 30 s grace period ended over 10 s ago and node node-1 has not \
         confirmed that the pod stopped: see kubectl describe pod web-immortalpod and the node's status \
         (kubectl describe node node-1); a node that is lost keeps its pods until the Node is deleted or tainted \
         node.kubernetes.io/out-of-service (the operator's docs: Known limits)"
    );
    // Anything that queues it before the next step writes nothing; an event's pod is read,
    // since the message names what only the pod shows.
    f.clear();
    run_with(&f, &seen(&f)).unwrap();
    assert_eq!(f.calls(), ["CACHED ic/web", "GET pod/web-immortalpod"]);
    // 4 min 30 s past it: "over 1 min", until 10 min.
    pass(Duration::from_secs(260));
    f.clear();
    assert_eq!(
        run(&f, "ns/web").unwrap(),
        Action::requeue(Duration::from_secs(330)).at(Priority::Routine)
    );
    assert!(
        message(&f).contains("grace period ended over 1 min ago"),
        "{}",
        message(&f)
    );
    // Gone at last: replaced, and no look asked for.
    let hint = gone(&f);
    *f.pod.borrow_mut() = None;
    f.clear();
    assert_eq!(run_with(&f, &hint).unwrap(), MADE);
    assert_eq!(f.calls(), ["CACHED ic/web", "POST pod/web-immortalpod"]);
}

#[test]
fn a_replacement_pending_past_a_minute_says_how_long_and_where_to_look() {
    let f = fake(ic("web", "nginx"));
    assert_eq!(run(&f, "ns/web").unwrap(), MADE);
    // The scheduler binds it to a node whose kubelet never reports on it.
    {
        let mut slot = f.pod.borrow_mut();
        let p = slot.as_mut().unwrap();
        p.metadata.creation_timestamp = Some(crate::util::rfc3339(wall()));
        p.spec.node_name = "node-1".into();
    }
    count_made(&f);
    // Its release, routine: then nothing to do until it has been pending a minute.
    assert_eq!(
        run_with(&f, &added(&f)).unwrap(),
        Action::requeue(Duration::from_secs(60)).at(Priority::Routine)
    );
    assert_eq!(message(&f), "pod web-immortalpod is pending");
    pass(Duration::from_secs(90));
    f.clear();
    assert_eq!(
        run(&f, "ns/web").unwrap(),
        Action::requeue(Duration::from_secs(510)).at(Priority::Routine)
    );
    assert_eq!(
        f.calls(),
        [
            "CACHED ic/web",
            "GET pod/web-immortalpod",
            "PATCH ic/web/status"
        ]
    );
    assert_eq!(ready(&f), ("False".into(), "PodPending".into()));
    assert_eq!(
        message(&f),
        "pod web-immortalpod has been pending for over 1 min on node node-1, whose kubelet has not reported \
         starting it: see kubectl describe pod web-immortalpod and the node's status (kubectl describe node \
         node-1); a node that is lost keeps its pods until the Node is deleted or tainted \
         node.kubernetes.io/out-of-service (the operator's docs: Known limits)"
    );
    // Looked at again before the next step: nothing new to write.
    f.clear();
    run(&f, "ns/web").unwrap();
    assert_eq!(f.calls(), ["CACHED ic/web", "GET pod/web-immortalpod"]);
    // It runs at last: ready, and no look asked for.
    start_pod(&f);
    f.clear();
    assert_eq!(run_with(&f, &seen(&f)).unwrap(), Action::await_change());
    assert_eq!(ready(&f), ("True".into(), "PodRunning".into()));
}

#[test]
fn a_pod_seen_terminated_is_deleted_by_uid_without_reading_it() {
    let f = running("nginx");
    fail_pod(&f);
    run_with(&f, &seen(&f)).unwrap();
    assert_eq!(
        f.calls(),
        [
            "CACHED ic/web",
            "DELETE pod/web-immortalpod uid=pod-uid-1",
            "POST pod/web-immortalpod"
        ]
    );
    count_made(&f);
    assert_eq!(status(&f).start_times, Some(2));
    assert_eq!(
        f.notes.borrow().last().unwrap().message,
        "Created pod web-immortalpod: the previous one ended 1 min 5 s after it started"
    );
}

#[test]
fn a_terminated_pod_never_counted_is_counted_once_when_deleted_by_hint() {
    // The operator died after creating pod-uid-1 and before recording it.
    let f = running("nginx");
    forget_the_count(&f);
    fail_pod(&f);
    run_with(&f, &seen(&f)).unwrap();
    assert_eq!(
        status(&f).start_times,
        Some(1),
        "pod-uid-1, written with its replacement's create"
    );
    count_made(&f);
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
    run_with(&f, &seen(&f)).unwrap();
    assert_eq!(status(&f).start_times, Some(2));
    f.clear();
    run_with(&f, &stale).unwrap();
    assert_eq!(
        f.calls(),
        [
            "CACHED ic/web",
            "DELETE pod/web-immortalpod uid=pod-uid-1",
            "GET pod/web-immortalpod"
        ]
    );
    assert_eq!(status(&f).start_times, Some(2));
    // And once no pod holds the name at all, the stale hint only leads to a create (the
    // restart back-off, which the replacement above started, set aside: not under test).
    *f.pod.borrow_mut() = None;
    f.ctx.restarts.forget("ns/web");
    f.clear();
    run_with(&f, &stale).unwrap();
    assert_eq!(
        f.calls(),
        [
            "CACHED ic/web",
            "DELETE pod/web-immortalpod uid=pod-uid-1",
            "POST pod/web-immortalpod"
        ]
    );
    count_made(&f);
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
            p.named_for_owner = name == "web-immortalpod";
            p.owner_uid = Some(owner.into());
            p.view.phase = Phase::Failed;
        }
        run_with(&f, &hint).unwrap();
        // The pod is running: looked at, left alone.
        assert_eq!(
            f.calls(),
            ["CACHED ic/web", "GET pod/web-immortalpod"],
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
            "CACHED ic/web",
            "GET pod/web-immortalpod",
            "GET ic/web",
            "DELETE pod/web-immortalpod uid=pod-uid-1",
            "PATCH ic/web/status"
        ]
    );
    assert_eq!(ready(&f), ("False".into(), "PodReplacing".into()));
    // Still terminating, and its events say so: nothing to do, nothing to write.
    f.clear();
    run_with(&f, &seen(&f)).unwrap();
    assert_eq!(f.calls(), ["CACHED ic/web"]);
    f.clear();
    run(&f, "ns/web").unwrap();
    assert_eq!(f.calls(), ["CACHED ic/web", "GET pod/web-immortalpod"]);
    // Gone: the replacement runs the new image.
    let hint = gone(&f);
    *f.pod.borrow_mut() = None;
    run_with(&f, &hint).unwrap();
    count_made(&f);
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

/// A running pod of an object whose template sets acontainer's env to `mode`.
fn running_templated(mode: &str) -> Fake {
    let f = fake(ic("web", "nginx"));
    set_template(&f, mode);
    made(&f);
    start_pod(&f);
    run_with(&f, &seen(&f)).unwrap();
    f.clear();
    f
}

fn set_template(f: &Fake, mode: &str) {
    let t = format!(
        r#"{{"spec":{{"containers":[{{"name":"acontainer","env":[{{"name":"MODE","value":"{mode}"}}]}}]}}}}"#
    );
    f.ic.borrow_mut().as_mut().unwrap().spec.template = Some(serde_json::from_str(&t).unwrap());
}

fn pod_mode(f: &Fake) -> serde_json::Value {
    let pod = f.pod.borrow();
    pod.as_ref().unwrap().spec.containers[0].rest["env"][0]["value"].clone()
}

fn fields_dropped(f: &Fake) -> Option<Condition> {
    status(f)
        .conditions
        .into_iter()
        .find(|c| c.type_ == FIELDS_DROPPED)
}

/// A v1.28 API server drops from the pod what it does not know (fixture 25): the operator
/// says so once, in an Event and a condition of its own that the count's status write
/// carries, and never replaces the pod for lacking it; a later pod that keeps everything
/// takes the condition away.
#[test]
fn fields_the_api_server_dropped_from_the_pod_are_reported_and_the_pod_is_kept() {
    let f = fake(ic("web", "nginx"));
    f.ctx.version.set("v1.28.7".into()).unwrap();
    f.ic.borrow_mut().as_mut().unwrap().spec.template = Some(
        serde_json::from_str(
            r#"{"spec":{"securityContext":{"appArmorProfile":{"type":"RuntimeDefault"}},
                "containers":[{"name":"acontainer","args":["a"]}]}}"#,
        )
        .unwrap(),
    );
    f.drops.borrow_mut().push("securityContext.appArmorProfile");
    made(&f);
    let want = "the API server did not keep spec.securityContext.appArmorProfile of pod web-immortalpod, \
                which runs without them: they are newer than Kubernetes v1.28.7, or behind a feature gate \
                it has off (the operator's docs: Pod templates)";
    let note = f
        .notes
        .borrow()
        .iter()
        .find(|n| n.reason == "FieldsDropped")
        .cloned();
    assert_eq!(
        note.map(|n| (n.warning, n.message)),
        Some((true, want.to_string()))
    );
    let c = fields_dropped(&f).expect("a FieldsDropped condition");
    assert_eq!(
        (c.status.as_str(), c.reason.as_str(), c.message.as_str()),
        ("True", "DroppedByAPIServer", want)
    );
    assert_eq!(status(&f).start_times, Some(1));
    // Running, the pod is the one wanted: left alone, reported as it runs.
    start_pod(&f);
    run_with(&f, &seen(&f)).unwrap();
    f.clear();
    run(&f, "ns/web").unwrap();
    assert_eq!(f.calls(), ["CACHED ic/web", "GET pod/web-immortalpod"]);
    assert!(fields_dropped(&f).is_some(), "kept while the pod runs");
    assert_eq!(status(&f).start_times, Some(1));
    // Replaced by a pod the server keeps whole: the condition goes with the count.
    f.drops.borrow_mut().clear();
    let hint = delete_after_running(&f, 60);
    run_with(&f, &hint).unwrap();
    count_made(&f);
    assert_eq!(status(&f).start_times, Some(2));
    assert_eq!(fields_dropped(&f), None);
}

#[test]
fn a_template_change_deletes_the_pod_once_and_the_replacement_runs_the_new_template() {
    let f = running_templated("a");
    assert_eq!(pod_mode(&f), "a");
    set_template(&f, "b");
    f.ic.borrow_mut().as_mut().unwrap().metadata.generation = Some(2);
    run(&f, "ns/web").unwrap();
    assert_eq!(
        f.calls(),
        [
            "CACHED ic/web",
            "GET pod/web-immortalpod",
            "GET ic/web",
            "DELETE pod/web-immortalpod uid=pod-uid-1",
            "PATCH ic/web/status"
        ]
    );
    assert_eq!(ready(&f), ("False".into(), "PodReplacing".into()));
    assert!(
        message(&f).contains("the template changed"),
        "{}",
        message(&f)
    );
    // Its own events while it terminates change nothing.
    f.clear();
    run_with(&f, &seen(&f)).unwrap();
    assert_eq!(f.calls(), ["CACHED ic/web"]);
    let hint = gone(&f);
    *f.pod.borrow_mut() = None;
    run_with(&f, &hint).unwrap();
    count_made(&f);
    assert_eq!(pod_mode(&f), "b");
    assert_eq!(status(&f).start_times, Some(2));
    // The replacement is the pod wanted: running, it is left alone (but for the release its
    // next event would have brought).
    start_pod(&f);
    f.clear();
    run(&f, "ns/web").unwrap();
    assert_eq!(
        f.calls(),
        [
            "CACHED ic/web",
            "GET pod/web-immortalpod",
            "PATCH ic/web/status",
            "PATCH pod/web-immortalpod release"
        ]
    );
    assert_eq!(status(&f).start_times, Some(2));
}

#[test]
fn a_pod_changed_by_admission_or_by_hand_is_not_replaced_for_it() {
    let f = running_templated("a");
    {
        let mut pod = f.pod.borrow_mut();
        let pod = pod.as_mut().unwrap();
        // A mutating webhook's sidecar and label, someone's annotation, a mirror's image.
        pod.spec.containers.push(Container {
            name: "istio-proxy".into(),
            image: "istio/proxyv2".into(),
            ..Default::default()
        });
        pod.metadata.labels.insert("injected".into(), "true".into());
        pod.metadata.annotations.insert("note".into(), "x".into());
        pod.spec.containers[0].image = "mirror.example/nginx".into();
    }
    run(&f, "ns/web").unwrap();
    run_with(&f, &seen(&f)).unwrap();
    let calls = f.calls();
    assert!(
        !calls
            .iter()
            .any(|c| c.starts_with("DELETE") || c.starts_with("POST")),
        "{calls:?}"
    );
    assert_eq!(status(&f).start_times, Some(1));
}

#[test]
fn an_image_change_replaces_a_pod_not_yet_scheduled_at_once() {
    let f = fake(ic("web", "nginx:1"));
    made(&f);
    run_with(&f, &seen(&f)).unwrap();
    f.ic.borrow_mut().as_mut().unwrap().spec.image = "nginx:2".into();
    f.clear();
    run(&f, "ns/web").unwrap();
    // The server removes an unscheduled pod at once: the name is free, no event awaited.
    assert_eq!(
        f.calls(),
        [
            "CACHED ic/web",
            "GET pod/web-immortalpod",
            "GET ic/web",
            "DELETE pod/web-immortalpod uid=pod-uid-1",
            "POST pod/web-immortalpod"
        ]
    );
    count_made(&f);
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
            "CACHED ic/web",
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
            "CACHED ic/web",
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
    // Deleted a second after it started: replaced at once; the back-off starts.
    let hint = delete_after_running(&f, 1);
    run_with(&f, &hint).unwrap();
    count_made(&f);
    assert_eq!(status(&f).start_times, Some(2));
    // Deleted again as soon as it started: the next one waits.
    start_pod(&f);
    let hint = delete_after_running(&f, 0);
    f.clear();
    let next = run_with(&f, &hint).unwrap();
    let Some(wait) = next.requeue_after() else {
        panic!("no back-off: {next:?}")
    };
    assert!(
        wait <= crate::immortal::restarts::BASE && !wait.is_zero(),
        "{wait:?}"
    );
    assert_eq!(f.calls(), ["CACHED ic/web", "PATCH ic/web/status"]);
    assert_eq!(ready(&f), ("False".into(), "PodRestartBackOff".into()));
    assert_eq!(status(&f).start_times, Some(2));
    // There is no pod meanwhile, and status names none (`kubectl get ic -o wide`).
    assert_eq!(status(&f).current_pod, None);
    assert_eq!(status(&f).pod_phase, None);
    let msg = message(&f);
    assert!(
        msg.contains("was deleted 0 s after it started: 2 pods in a row ended within 10 s"),
        "{msg}"
    );
    assert!(
        msg.ends_with(
            "(back-off 1 s, doubling to 5 min; a pod that runs 10 s or more is replaced at once)"
        ),
        "{msg}"
    );
    let note = f.notes.borrow().last().unwrap().clone();
    assert!(
        note.warning && note.reason == "PodRestartBackOff",
        "{note:?}"
    );
    // Its time come (as if the last replacement had been longer ago), the pod is made.
    f.ctx.restarts.forget("ns/web");
    f.ctx.restarts.replaced(
        "ns/web",
        Instant::now() - crate::immortal::restarts::BASE * 2,
    );
    f.clear();
    assert_eq!(run(&f, "ns/web").unwrap(), MADE);
    assert_eq!(
        f.calls(),
        [
            "CACHED ic/web",
            "GET pod/web-immortalpod",
            "POST pod/web-immortalpod"
        ]
    );
    count_made(&f);
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
        if f.pod.borrow().is_some() {
            count_made(&f);
        }
    }
    {
        let mut ic = f.ic.borrow_mut();
        let ic = ic.as_mut().unwrap();
        ic.spec.image = "nginx:2".into();
        ic.metadata.generation = Some(2);
    }
    f.clear();
    assert_eq!(run(&f, "ns/web").unwrap(), MADE);
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
                ..Default::default()
            }],
            ..Default::default()
        },
        ..Default::default()
    });
    assert_eq!(run(&f, "ns/web").unwrap(), Action::requeue(CONFLICT_RETRY));
    // Create first (new object), AlreadyExists, look, leave it: no DELETE, no second POST.
    assert_eq!(
        f.calls(),
        [
            "CACHED ic/web",
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
            "CACHED ic/web",
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
    assert_eq!(run(&f, &key).unwrap(), Action::await_change());
    assert_eq!(
        f.calls(),
        [
            format!("CACHED ic/{long}"),
            format!("PATCH ic/{long}/status")
        ]
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
        [format!("CACHED ic/{long}")],
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
    run(&f, "ns/web").unwrap();
    f.fail_next("patch_status", api_err(409, "Conflict"));
    let err = run_with(&f, &added(&f)).unwrap_err();
    // The new pod holds our finalizer meanwhile: retried soon whatever the back-off.
    let Error::Holding { source, .. } = err else {
        panic!("{err}")
    };
    assert!(matches!(
        *source,
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
        1,
        "the retry looks first: the pod this process made holds the name"
    );
}

#[test]
fn every_status_write_carries_the_resource_version_it_was_computed_from() {
    let o = ic("web", "nginx");
    let patch = |want: &ImmortalContainerStatus| status_patch("10", &o.status, want, |_| false);
    let mut want = o.status.clone();
    want.start_times = Some(1);
    want.last_counted_pod_uid = Some("u".into());
    assert_eq!(
        patch(&want).unwrap()["metadata"],
        json!({"resourceVersion": "10"})
    );
    // A condition-only change, or the first explicit zero, too: `/status` ignores a uid
    // (fixture 21), so only the version keeps a stale copy's write from landing.
    let mut want = o.status.clone();
    want.observed_generation = Some(1);
    want.start_times = Some(0);
    assert_eq!(
        patch(&want).unwrap()["metadata"],
        json!({"resourceVersion": "10"})
    );
    assert!(patch(&o.status).is_none());
}

#[test]
fn server_errors_are_transient_and_a_refusal_waits_for_the_objects_back_off() {
    let f = fake(ic("web", "nginx"));
    f.fail_next("create_pod", api_err(500, "InternalError"));
    assert!(matches!(
        run(&f, "ns/web"),
        Err(Error::Transient {
            action: "create pod",
            ..
        })
    ));
    // A refusal is the cluster's policy: no error to retry at the queue's pace, but the
    // object's own back-off.
    f.fail_next("create_pod", api_err(403, "Forbidden"));
    assert_eq!(
        run(&f, "ns/web").unwrap(),
        Action::requeue(crate::immortal::restarts::BASE)
    );
    assert_eq!(f.notes.borrow()[0].reason, "PodCreateFailed");
}

/// v1.28 drops a sleep action it does not know, then refuses the hook for having no handler
/// (fixture 51): the refusal is reported in the server's words, and the fields it dropped
/// first, which its warnings name, say why.
#[test]
fn a_create_refused_for_what_was_dropped_names_the_fields_the_server_did_not_know() {
    let name = "51-pod-create-sleep-pre-stop-dropped-leaves-no-handler-invalid";
    let (code, body) = crate::testutil::kubelet_fixture(name);
    let mut status = client::parse_status(code, &body);
    let text =
        std::fs::read_to_string(format!("tests/fixtures/kube-1.28-kubelet/{name}.http")).unwrap();
    status.warnings = text
        .lines()
        .filter_map(|l| l.strip_prefix("Warning: "))
        .flat_map(client::warning_texts)
        .collect();
    let f = fake(ic("web", "nginx"));
    f.ctx.version.set("v1.28.7".into()).unwrap();
    f.fail_next("create_pod", client::Error::Api(Box::new(status)));
    assert_eq!(
        run(&f, "ns/web").unwrap(),
        Action::requeue(crate::immortal::restarts::BASE)
    );
    assert_eq!(ready(&f), ("False".into(), "PodCreateFailed".into()));
    assert_eq!(
        message(&f),
        "the API server refused pod web-immortalpod: api error 422 Invalid: Pod \"sleepy\" is invalid: \
         spec.containers[0].lifecycle.preStop: Required value: must specify a handler type; \
         spec.containers[0].lifecycle.preStop: Required value: must specify a handler type; it dropped \
         first what it does not know, spec.resources, spec.securityContext.appArmorProfile, \
         spec.containers[0].lifecycle.preStop.sleep: newer than Kubernetes v1.28.7, or behind a feature \
         gate it has off (the operator's docs: Pod templates); the operator tries again after 1 s, \
         doubling to 5 min"
    );
}

#[test]
fn a_create_refused_by_admission_is_reported_with_the_servers_message() {
    let (code, body) = crate::testutil::kubelet_fixture("14-pod-create-forbidden-pod-security");
    let refusal = client::Error::Api(Box::new(client::parse_status(code, &body)));
    let f = fake(ic("web", "nginx"));
    f.fail_next("create_pod", refusal);
    assert_eq!(
        run(&f, "ns/web").unwrap(),
        Action::requeue(crate::immortal::restarts::BASE)
    );
    // The user sees why, without reading logs.
    assert!(f.calls().contains(&"PATCH ic/web/status".to_string()));
    assert_eq!(ready(&f), ("False".into(), "PodCreateFailed".into()));
    let msg = message(&f);
    assert!(
        msg.contains("violates PodSecurity \"restricted:latest\""),
        "{msg}"
    );
    assert_eq!(status(&f).start_times, Some(0));
    // Without a template nothing in the object can satisfy PodSecurity: say how to, in the
    // fields to set, not by a file of the repository.
    assert!(msg.contains("give the object a spec.template"), "{msg}");
    for field in [
        "runAsNonRoot: true",
        "seccompProfile: {type: RuntimeDefault}",
        "allowPrivilegeEscalation: false",
        "capabilities: {drop: [ALL]}",
    ] {
        assert!(msg.contains(field), "{field}: {msg}");
    }
    assert!(!msg.contains("config/samples"), "{msg}");
    assert!(
        msg.ends_with("; the operator tries again after 1 s, doubling to 5 min"),
        "{msg}"
    );
}

#[test]
fn a_templated_object_refused_by_pod_security_gets_no_hint_to_add_a_template() {
    let (code, body) = crate::testutil::kubelet_fixture("14-pod-create-forbidden-pod-security");
    let mut o = ic("web", "nginx");
    o.spec.template = Some(serde_json::from_str(r#"{"spec":{}}"#).unwrap());
    let f = fake(o);
    f.fail_next(
        "create_pod",
        client::Error::Api(Box::new(client::parse_status(code, &body))),
    );
    run(&f, "ns/web").unwrap();
    let msg = message(&f);
    assert!(msg.contains("violates PodSecurity"), "{msg}");
    assert!(!msg.contains("spec.template"), "{msg}");
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
    assert!(matches!(
        run_with(&f, &seen(&f)).map(|a| a.requeue_after().is_some()),
        Ok(true)
    ));
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
    run(&f, "ns/web").unwrap();
    f.fail_next("patch_status", api_err(409, "Conflict"));
    assert!(run_with(&f, &added(&f)).is_err());
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
        &PodHint::Left(Box::new(crate::immortal::lifecycle::LeftPod {
            uid: first.metadata.uid.as_str().into(),
            ending: None,
            held: false,
        })),
    )
    .unwrap();
    count_made(&f);
    assert_eq!(status(&f).start_times, Some(2));
    assert_eq!(*f.next_uid.borrow(), 2, "two pods were accepted");
}

#[test]
fn a_crd_that_prunes_the_last_counted_uid_stops_the_counting_and_says_so_once() {
    let f = fake(ic("web", "nginx"));
    *f.prunes.borrow_mut() = vec!["lastCountedPodUID", "observedGeneration", "podPhase"];
    run(&f, "ns/web").unwrap();
    run_with(&f, &added(&f)).unwrap();
    // The first count went through (startTimes is in every CRD), L did not stick.
    assert_eq!(status(&f).start_times, Some(1));
    assert!(!f.ctx.counting.active());
    let warned: Vec<Note> = f
        .notes
        .borrow()
        .iter()
        .filter(|n| n.reason == "StartsNotCounted")
        .cloned()
        .collect();
    assert_eq!(warned.len(), 1, "{:?}", f.notes.borrow());
    assert!(warned[0].warning && warned[0].message.contains("config/crd"));
    // The pod is released all the same, at its next event: nothing can count it any more.
    run_with(&f, &seen(&f)).unwrap();
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
    assert_eq!(f.calls(), ["CACHED ic/web", "GET pod/web-immortalpod"]);
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
fn a_create_an_admission_policy_refuses_is_retried_with_back_off_until_it_is_lifted() {
    // A ValidatingAdmissionPolicy answers 422 Invalid: nothing the object can change, and the
    // policy may be lifted at any time.
    let (code, body) = crate::testutil::kubelet_fixture("17-pod-create-denied-by-admission-policy");
    let refusal = || client::Error::Api(Box::new(client::parse_status(code, &body)));
    let f = fake(ic("web", "nginx"));
    f.fail_next("create_pod", refusal());
    let base = crate::immortal::restarts::BASE;
    assert_eq!(run(&f, "ns/web").unwrap(), Action::requeue(base));
    assert_eq!(ready(&f), ("False".into(), "PodCreateFailed".into()));
    let msg = message(&f);
    assert!(
        msg.contains("ValidatingAdmissionPolicy 'fixture-require-limits'"),
        "{msg}"
    );
    assert_eq!(status(&f).current_pod, None, "no pod to name");
    // Refused again: a longer wait; the condition and its message stand, nothing written,
    // no second Event. (A refusal of a create that only assumed the name free is checked by a
    // look: a pod of ours made before a crash must not hide behind it.)
    f.fail_next("create_pod", refusal());
    f.clear();
    assert_eq!(run(&f, "ns/web").unwrap(), Action::requeue(base * 2));
    assert_eq!(
        f.calls(),
        [
            "CACHED ic/web",
            "POST pod/web-immortalpod",
            "GET pod/web-immortalpod"
        ]
    );
    let warnings = |f: &Fake| {
        f.notes
            .borrow()
            .iter()
            .filter(|n| n.reason == "PodCreateFailed")
            .count()
    };
    assert_eq!(warnings(&f), 1);
    // Lifted: the pod is made and, once counted, the condition says what it does.
    assert_eq!(run(&f, "ns/web").unwrap(), MADE);
    count_made(&f);
    assert_eq!(ready(&f), ("False".into(), "PodPending".into()));
    assert_eq!(status(&f).start_times, Some(1));
    assert_eq!(status(&f).current_pod.as_deref(), Some("web-immortalpod"));
    // A later refusal starts from the first back-off again.
    let hint = gone(&f);
    *f.pod.borrow_mut() = None;
    f.fail_next("create_pod", refusal());
    assert_eq!(run_with(&f, &hint).unwrap(), Action::requeue(base));
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
    f.pod.borrow_mut().as_mut().unwrap().spec.containers[0].image = "mirror.example/nginx".into();
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

#[test]
fn a_pod_that_ran_for_a_while_is_replaced_at_once_even_right_after_quick_ones() {
    let f = running("nginx");
    // A quick ending: replaced at once, and the back-off starts.
    assert_eq!(run_with(&f, &delete_after_running(&f, 1)).unwrap(), MADE);
    count_made(&f);
    // Its replacement runs for a minute and is evicted by a drain, while that back-off still
    // runs: replaced at once all the same, as the ReplicaSet controller would.
    start_pod(&f);
    f.clear();
    assert_eq!(run_with(&f, &delete_after_running(&f, 60)).unwrap(), MADE);
    assert_eq!(f.calls(), ["CACHED ic/web", "POST pod/web-immortalpod"]);
    count_made(&f);
    assert_eq!(status(&f).start_times, Some(3));
    assert_eq!(
        f.notes.borrow().last().unwrap().message,
        "Created pod web-immortalpod: the previous one was deleted 1 min after it started"
    );
    // And the streak before it is forgotten: the next quick ending is the first of a row.
    start_pod(&f);
    assert_eq!(run_with(&f, &delete_after_running(&f, 2)).unwrap(), MADE);
    count_made(&f);
    start_pod(&f);
    assert!(run_with(&f, &delete_after_running(&f, 2))
        .unwrap()
        .requeue_after()
        .is_some());
}

#[test]
fn a_pod_that_ended_on_its_own_soon_after_it_started_backs_off_too() {
    let f = running("nginx");
    let end_quickly = |f: &Fake| {
        end_pod_at(f, "2025-12-31T23:59:02Z");
    };
    end_quickly(&f);
    assert_eq!(run_with(&f, &seen(&f)).unwrap(), MADE);
    count_made(&f);
    start_pod(&f);
    // Its next event lets it go.
    run_with(&f, &seen(&f)).unwrap();
    end_quickly(&f);
    let next = run_with(&f, &seen(&f)).unwrap();
    assert!(next.requeue_after().is_some(), "{next:?}");
    let msg = message(&f);
    assert!(msg.contains("ended 2 s after it started"), "{msg}");
}

#[test]
fn a_pod_deleted_before_its_added_event_was_served_is_released_at_once_and_replaced() {
    let f = fake(ic("web", "nginx"));
    run(&f, "ns/web").unwrap();
    // Someone deletes the new pod while its release still waits in the queue: the API server
    // only marks it (our finalizer holds it), and its event is urgent (see lifecycle).
    {
        let mut slot = f.pod.borrow_mut();
        let m = &mut slot.as_mut().unwrap().metadata;
        m.deletion_timestamp = Some("2026-01-01T00:00:00Z".into());
        m.deletion_grace_period_seconds = Some(0);
    }
    let pod = f.pod.borrow().clone().unwrap();
    let hint = match PodEventHandler.on_event("MODIFIED", &pod, &mut None) {
        Reaction::Queue(Some(h), Priority::Urgent) => h,
        other => panic!("a held pod being deleted must be urgent: {other:?}"),
    };
    f.clear();
    run_with(&f, &hint).unwrap();
    // Counted already: released without a read, and the API server removes it.
    assert_eq!(
        f.calls(),
        [
            "CACHED ic/web",
            "PATCH ic/web/status",
            "PATCH pod/web-immortalpod release"
        ]
    );
    assert!(f.pod.borrow().is_none(), "released, so removed");
    assert_eq!(ready(&f).1, "PodTerminating");
    // Its DELETED event brings the replacement, counted once.
    let gone = PodHint::Left(Box::new(crate::immortal::lifecycle::LeftPod {
        uid: pod.metadata.uid.as_str().into(),
        ending: None,
        held: false,
    }));
    run_with(&f, &gone).unwrap();
    count_made(&f);
    assert_eq!(status(&f).start_times, Some(2));
    assert_eq!(pod_uid(&f), "pod-uid-2");
}

#[test]
fn the_object_deleted_while_its_pod_is_counted_lets_the_pod_go() {
    let f = fake(ic("web", "nginx"));
    // The object goes between the create and the status write that would count its pod.
    run(&f, "ns/web").unwrap();
    f.fail_next("patch_status", api_err(404, "NotFound"));
    f.clear();
    assert_eq!(run_with(&f, &added(&f)).unwrap(), Action::await_change());
    assert_eq!(
        f.calls(),
        [
            "CACHED ic/web",
            "PATCH ic/web/status",
            "PATCH pod/web-immortalpod release"
        ]
    );
    assert!(f
        .pod
        .borrow()
        .as_ref()
        .unwrap()
        .metadata
        .finalizers
        .is_empty());
}

/// A pod of ours still holding our finalizer whose object was deleted with
/// `--cascade=orphan`: the garbage collector stripped its controller reference.
fn orphan(f: &Fake) -> Pod {
    let mut p = desired_pod(&ic("web", "nginx"), true);
    p.metadata.uid = "pod-uid-orphan".into();
    p.metadata.owner_references.clear();
    *f.pod.borrow_mut() = Some(p.clone());
    p
}

#[test]
fn an_orphaned_pod_held_by_our_finalizer_is_released() {
    let f = Fake::default();
    let pod = orphan(&f);
    // Its view did not change when its reference went; it is queued all the same, under the
    // name it was made for.
    assert_eq!(PodEventHandler.key_of(&pod).as_deref(), Some("ns/web"));
    let mut cached = Some(PodEventHandler.cached(&pod));
    let Reaction::Queue(Some(hint), crate::runtime::queue::Priority::Urgent) =
        PodEventHandler.on_event("MODIFIED", &pod, &mut cached)
    else {
        panic!("an orphan holding our finalizer was not queued")
    };
    run_with(&f, &hint).unwrap();
    assert_eq!(
        f.calls(),
        ["CACHED ic/web", "PATCH pod/web-immortalpod release"]
    );
    assert!(f
        .pod
        .borrow()
        .as_ref()
        .unwrap()
        .metadata
        .finalizers
        .is_empty());
    // Without our finalizer an orphan is none of ours: not even queued.
    let released = f.pod.borrow().clone().unwrap();
    assert_eq!(PodEventHandler.key_of(&released), None);
}

#[test]
fn an_orphan_held_by_our_finalizer_under_a_new_objects_name_is_released_and_left_alone() {
    let f = Fake::default();
    orphan(&f);
    let mut new = ic("web", "nginx");
    new.metadata.uid = "ic-uid-2".into();
    *f.ic.borrow_mut() = Some(new);
    assert_eq!(run(&f, "ns/web").unwrap(), Action::requeue(CONFLICT_RETRY));
    assert!(f
        .calls()
        .contains(&"PATCH pod/web-immortalpod release".to_string()));
    assert!(f
        .pod
        .borrow()
        .as_ref()
        .unwrap()
        .metadata
        .finalizers
        .is_empty());
    assert_eq!(ready(&f), ("False".into(), "PodNameConflict".into()));
    assert_eq!(status(&f).current_pod, None);
}

#[test]
fn a_pod_being_deleted_waits_on_a_count_that_cannot_be_written_a_minute_at_most() {
    let now = std::sync::Arc::new(std::sync::Mutex::new(Instant::now()));
    let clock = now.clone();
    let f = Fake {
        ctx: ctx(move || *clock.lock().unwrap()),
        ..Default::default()
    };
    *f.ic.borrow_mut() = Some(ic("web", "nginx"));
    // Status writes are refused (an edited ClusterRole): the pod is made, and held.
    let denied = || api_err(403, "Forbidden");
    run(&f, "ns/web").unwrap();
    f.fail_next("patch_status", denied());
    assert!(matches!(
        run_with(&f, &added(&f)),
        Err(Error::Holding {
            deleting: false,
            ..
        })
    ));
    start_pod(&f);
    let uid = f.pod.borrow().as_ref().unwrap().metadata.uid.clone();
    // A person deletes it (kubectl drain): it waits on our finalizer...
    f.delete_pod("ns", "web-immortalpod", &uid, None).unwrap();
    f.fail_next("patch_status", denied());
    let err = run_with(&f, &seen(&f)).unwrap_err();
    assert_eq!(err.retry_within(), Some(counting::HOLD_AT_MOST), "{err}");
    assert!(f.pod.borrow().as_ref().unwrap().metadata.finalizers.len() == 1);
    // ...and is retried within what is left of the minute...
    *now.lock().unwrap() += Duration::from_secs(45);
    f.fail_next("patch_status", denied());
    let err = run(&f, "ns/web").unwrap_err();
    assert_eq!(err.retry_within(), Some(Duration::from_secs(15)), "{err}");
    // ...then released uncounted, which is said.
    *now.lock().unwrap() += Duration::from_secs(15);
    f.fail_next("patch_status", denied());
    assert!(run(&f, "ns/web").is_err());
    assert!(
        f.pod
            .borrow()
            .as_ref()
            .unwrap()
            .metadata
            .finalizers
            .is_empty(),
        "released: the kubelet may now finish the deletion"
    );
    let note = f.notes.borrow().last().unwrap().clone();
    assert!(
        note.warning && note.reason == "StartsNotCounted",
        "{note:?}"
    );
    assert!(
        note.message.contains("let go uncounted"),
        "{}",
        note.message
    );
}

#[test]
fn a_pod_nobody_deletes_keeps_our_finalizer_while_status_cannot_be_written() {
    let f = fake(ic("web", "nginx"));
    run(&f, "ns/web").unwrap();
    for _ in 0..3 {
        // Held: retried within half a minute however long it has failed, so it is counted
        // soon after status can be written again.
        f.fail_next("patch_status", api_err(403, "Forbidden"));
        let err = run(&f, "ns/web").unwrap_err();
        assert_eq!(err.retry_within(), Some(counting::RECOUNT_AT_MOST), "{err}");
    }
    assert_eq!(
        f.pod.borrow().as_ref().unwrap().metadata.finalizers.len(),
        1
    );
    // Once status can be written, it is counted, and released with its next event (within
    // `counting::RELEASE_WITHIN` of its create at the latest).
    run(&f, "ns/web").unwrap();
    assert_eq!(status(&f).start_times, Some(1));
    run_with(&f, &seen(&f)).unwrap();
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
fn counting_resumed_adopts_the_pod_status_names_and_counts_the_next_one() {
    let f = fake(ic("web", "nginx"));
    *f.prunes.borrow_mut() = vec!["lastCountedPodUID", "observedGeneration", "podPhase"];
    made(&f);
    assert!(!f.ctx.counting.active());
    // Replaced while counting is off: not counted.
    let hint = gone(&f);
    *f.pod.borrow_mut() = None;
    run_with(&f, &hint).unwrap();
    assert_eq!(status(&f).start_times, Some(1));
    // The CRD is upgraded (make install): the schema read again keeps every field.
    f.prunes.borrow_mut().clear();
    assert!(f.ctx.counting.relearn(&[]));
    // The relist's reconcile adopts the pod status names: it may have been counted, or not.
    run(&f, "ns/web").unwrap();
    let st = status(&f);
    assert_eq!(st.start_times, Some(1), "not counted twice");
    assert_eq!(
        st.last_counted_pod_uid.as_deref(),
        Some(f.pod.borrow().as_ref().unwrap().metadata.uid.as_str())
    );
    let note = f.notes.borrow().last().unwrap().clone();
    assert!(
        !note.warning && note.reason == "CountingResumed",
        "{note:?}"
    );
    // From now on every start counts, exactly once.
    start_pod(&f);
    let hint = delete_after_running(&f, 60);
    run_with(&f, &hint).unwrap();
    count_made(&f);
    assert_eq!(status(&f).start_times, Some(2));
    run_with(&f, &seen(&f)).unwrap();
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
fn the_deleted_event_of_a_pod_replaced_already_changes_nothing() {
    let f = running("nginx");
    // The kubelet fails the pod, a second after it started: deleted and replaced at once.
    let failed = end_pod_at(&f, "2025-12-31T23:59:01Z");
    run_with(&f, &seen(&f)).unwrap();
    count_made(&f);
    let replacement = f.pod.borrow().as_ref().unwrap().metadata.uid.clone();
    assert_ne!(replacement, failed.metadata.uid);
    // Then the failed pod's DELETED event arrives: nothing to do, no request, no back-off
    // reported for a replacement that exists.
    let hint = match PodEventHandler.on_event("DELETED", &failed, &mut None) {
        Reaction::Queue(Some(h), _) => h,
        other => panic!("{other:?}"),
    };
    f.clear();
    assert_eq!(run_with(&f, &hint).unwrap(), Action::await_change());
    assert_eq!(f.calls(), ["CACHED ic/web"]);
    assert_eq!(ready(&f), ("False".into(), "PodPending".into()));
    assert_eq!(status(&f).current_pod.as_deref(), Some("web-immortalpod"));
}

/// A pod made while status could not be written (so it holds our finalizer, uncounted), then
/// stripped of our labels and deleted by someone: it is Terminating, waiting on us. Answers
/// its uid.
fn held_unlabelled_and_deleted(f: &Fake) -> String {
    run(f, "ns/web").unwrap();
    // The operator restarts before counting it: it knows nothing of the pod it made.
    f.ctx.forget_held("ns/web");
    start_pod(f);
    let uid = f.pod.borrow().as_ref().unwrap().metadata.uid.clone();
    f.pod.borrow_mut().as_mut().unwrap().metadata.labels.clear();
    f.delete_pod("ns", "web-immortalpod", &uid, None).unwrap();
    f.clear();
    uid
}

fn finalizers(f: &Fake) -> Vec<String> {
    f.pod.borrow().as_ref().unwrap().metadata.finalizers.clone()
}

#[test]
fn a_refused_relabel_does_not_keep_a_pod_being_deleted_waiting_on_our_finalizer() {
    let f = fake(ic("web", "nginx"));
    let uid = held_unlabelled_and_deleted(&f);
    // A policy refuses the relabel (422, nothing about the uid): the pod is counted and let
    // go all the same, and the relabel is retried after.
    f.fail_next("patch_pod", api_err(422, "Invalid"));
    let err = run(&f, "ns/web").unwrap_err();
    assert!(
        matches!(
            err,
            Error::Transient {
                action: "patch pod",
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(
        f.calls(),
        [
            "CACHED ic/web",
            // Status never said a pod: tried first, the name is taken.
            "POST pod/web-immortalpod",
            "GET pod/web-immortalpod",
            "PATCH pod/web-immortalpod labels",
            "PATCH ic/web/status",
            "PATCH pod/web-immortalpod release"
        ]
    );
    assert_eq!(status(&f).start_times, Some(1));
    assert_eq!(
        status(&f).last_counted_pod_uid.as_deref(),
        Some(uid.as_str())
    );
    assert!(finalizers(&f).is_empty(), "let go");
}

#[test]
fn a_pod_released_unlabelled_that_leaves_before_its_relabel_is_replaced() {
    let f = fake(ic("web", "nginx"));
    let uid = held_unlabelled_and_deleted(&f);
    // Counted and released, the relabel refused: our watch, which lost the pod with its label,
    // will never say it left.
    f.fail_next("patch_pod", api_err(422, "Invalid"));
    assert!(run(&f, "ns/web").is_err());
    assert!(finalizers(&f).is_empty());
    // The retry reads it still Terminating, and it is gone when the relabel reaches it.
    f.clear();
    *f.vanish_before_patch.borrow_mut() = true;
    assert_eq!(run(&f, "ns/web").unwrap(), MADE);
    assert_eq!(
        f.calls(),
        [
            "CACHED ic/web",
            "GET pod/web-immortalpod",
            "PATCH pod/web-immortalpod labels",
            "GET pod/web-immortalpod",
            "POST pod/web-immortalpod"
        ]
    );
    count_made(&f);
    assert_ne!(pod_uid(&f), uid, "replaced");
    assert_eq!(status(&f).start_times, Some(2), "each start counted once");
}

#[test]
fn a_refused_relabel_and_status_still_let_a_pod_being_deleted_go_within_a_minute() {
    let now = std::sync::Arc::new(std::sync::Mutex::new(Instant::now()));
    let clock = now.clone();
    let f = Fake {
        ctx: ctx(move || *clock.lock().unwrap()),
        ..Default::default()
    };
    *f.ic.borrow_mut() = Some(ic("web", "nginx"));
    held_unlabelled_and_deleted(&f);
    let refused = || api_err(422, "Invalid");
    f.fail_next("patch_pod", refused());
    f.fail_next("patch_status", refused());
    let err = run(&f, "ns/web").unwrap_err();
    assert_eq!(err.retry_within(), Some(counting::HOLD_AT_MOST), "{err}");
    assert_eq!(finalizers(&f).len(), 1);
    *now.lock().unwrap() += counting::HOLD_AT_MOST;
    f.fail_next("patch_pod", refused());
    f.fail_next("patch_status", refused());
    assert!(run(&f, "ns/web").is_err());
    assert!(finalizers(&f).is_empty(), "let go uncounted");
    assert_eq!(f.notes.borrow().last().unwrap().reason, "StartsNotCounted");
}

#[test]
fn a_relabel_that_meets_another_pod_of_the_name_is_not_an_error() {
    let f = running("nginx");
    f.pod
        .borrow_mut()
        .as_mut()
        .unwrap()
        .metadata
        .labels
        .remove(MANAGED_BY_LABEL);
    // Replaced between our read and our patch: the server refuses our uid.
    f.fail_next(
        "patch_pod",
        uid_changed("Pod", "web-immortalpod", "pod-uid-1"),
    );
    assert_eq!(run(&f, "ns/web").unwrap(), Action::await_change());
}

#[test]
fn releasing_a_pod_whose_name_holds_another_is_done() {
    let f = fake(ic("web", "nginx"));
    let mut other = desired_pod(&ic("web", "nginx"), true);
    other.metadata.uid = "pod-uid-new".into();
    *f.pod.borrow_mut() = Some(other);
    let trace = LogContext {
        id: "1",
        key: &"ns/web".into(),
    };
    release_pod(&f, &trace, "ns", "web-immortalpod", "pod-uid-old", "test").unwrap();
    assert_eq!(f.calls(), ["PATCH pod/web-immortalpod release"]);
    assert_eq!(
        finalizers(&f),
        [ic::COUNT_FINALIZER],
        "the other pod is untouched"
    );
}

/// The object is deleted and made again under its name, and the operator's copy is still the
/// old one's (its watch has not brought the events yet).
fn recreate_behind_the_copy(f: &Fake) {
    *f.stored.borrow_mut() = f.ic.borrow().clone();
    let mut now = f.ic.borrow_mut();
    let new = now.as_mut().unwrap();
    new.metadata.uid = "ic-uid-2".into();
    new.metadata.resource_version = "20".into();
    new.status = Default::default();
}

#[test]
fn a_status_write_refused_for_a_recreated_object_lets_our_pod_go_and_ends() {
    let f = fake(ic("web", "nginx"));
    recreate_behind_the_copy(&f);
    // The pod made from the old copy is counted in a write that a real `/status` would apply
    // whatever uid it named (fixture 21): its version is refused instead, and a read shows
    // another object, which is looked at next (its own event may bring nothing new now).
    run(&f, "ns/web").unwrap();
    f.clear();
    assert_eq!(
        run_with(&f, &added(&f)).unwrap(),
        Action::requeue(Duration::ZERO)
    );
    assert_eq!(
        f.calls(),
        [
            "CACHED ic/web",
            "PATCH ic/web/status",
            "GET ic/web",
            "PATCH pod/web-immortalpod release"
        ]
    );
    assert!(finalizers(&f).is_empty(), "nothing will count it now");
    assert_eq!(status(&f), Default::default(), "nothing landed");
    // Any other 422 is not taken for a re-created object.
    let f = fake(ic("web", "nginx"));
    run(&f, "ns/web").unwrap();
    f.fail_next("patch_status", api_err(422, "Invalid"));
    assert!(matches!(
        run_with(&f, &added(&f)),
        Err(Error::Holding {
            deleting: false,
            ..
        })
    ));
    assert_eq!(finalizers(&f).len(), 1);
}

#[test]
fn a_replaced_object_never_gets_the_old_ones_status() {
    let f = running("nginx");
    recreate_behind_the_copy(&f);
    // The old pod turns not ready: its status refresh, computed from the old copy, must not
    // land on the new object, whose own pod does not exist yet.
    set_pod_ready(&f, false);
    assert_eq!(
        run_with(&f, &seen(&f)).unwrap(),
        Action::requeue(Duration::ZERO)
    );
    assert_eq!(
        f.calls(),
        ["CACHED ic/web", "PATCH ic/web/status", "GET ic/web"]
    );
    assert_eq!(
        status(&f),
        Default::default(),
        "the new object's status untouched"
    );
    // Looked at next (once the garbage collector took the old object's pod), the new object
    // gets a pod of its own.
    assert!(f.pod.borrow_mut().take().is_some());
    f.clear();
    assert_eq!(run(&f, "ns/web").unwrap(), MADE);
    count_made(&f);
    assert_eq!(status(&f).start_times, Some(1));
    assert_eq!(status(&f).current_pod.as_deref(), Some("web-immortalpod"));
}

/// The object made again behind the copy has a pod, made by another leader that died before
/// counting it: held by our finalizer, and force-deleted since. Answers the hint its event
/// queues.
fn uncounted_pod_of_the_new_object_force_deleted(f: &Fake) -> PodHint {
    recreate_behind_the_copy(f);
    let new = f.ic.borrow().clone().unwrap();
    let mut pod = desired_pod(&new, true);
    pod.metadata.uid = "pod-uid-of-the-new-object".into();
    pod.metadata.resource_version = f.stamp();
    pod.metadata.deletion_timestamp = Some("2026-01-01T00:00:00Z".into());
    pod.metadata.deletion_grace_period_seconds = Some(0);
    *f.pod.borrow_mut() = Some(pod);
    seen(f)
}

#[test]
fn a_stale_copy_never_lets_go_the_uncounted_pod_of_the_object_made_after_it() {
    let f = fake(ic("web", "nginx"));
    let hint = uncounted_pod_of_the_new_object_force_deleted(&f);
    // From the copy the pod is not ours: before our finalizer goes, a read says whose it is.
    // The object that controls it exists, so it is the one to count it: looked at next.
    assert_eq!(
        run_elsewhere(&f, Some(&hint)).unwrap(),
        Action::requeue(Duration::ZERO)
    );
    assert_eq!(finalizers(&f), [ic::COUNT_FINALIZER], "let go uncounted");
    assert_eq!(
        status(&f),
        Default::default(),
        "nothing written from the copy"
    );
    assert_eq!(f.calls().last().map(String::as_str), Some("GET ic/web"));
    // The object read is the one it belongs to: counted, then released.
    f.clear();
    run_elsewhere(&f, Some(&seen(&f))).unwrap();
    assert_eq!(status(&f).start_times, Some(1));
    assert_eq!(
        status(&f).last_counted_pod_uid.as_deref(),
        Some("pod-uid-of-the-new-object")
    );
    assert!(f.pod.borrow().is_none(), "let go once counted, and gone");
}

#[test]
fn a_held_pod_of_an_object_gone_is_released_once_a_read_shows_it_gone() {
    // The pod of an earlier object of the name, which went between its pod's create and its
    // count: the read shows another object (ours), so nothing will count it.
    let f = fake(ic("web", "nginx"));
    let mut old = ic("web", "nginx");
    old.metadata.uid = "ic-uid-earlier".into();
    let mut pod = desired_pod(&old, true);
    pod.metadata.uid = "pod-uid-earlier".into();
    *f.pod.borrow_mut() = Some(pod);
    assert_eq!(run(&f, "ns/web").unwrap(), Action::requeue(CONFLICT_RETRY));
    assert_eq!(
        f.calls(),
        [
            "CACHED ic/web",
            "POST pod/web-immortalpod",
            "GET pod/web-immortalpod",
            "GET ic/web",
            "PATCH pod/web-immortalpod release",
            "PATCH ic/web/status"
        ]
    );
    assert!(finalizers(&f).is_empty());
    assert_eq!(ready(&f), ("False".into(), "PodNameConflict".into()));
    // No object of the name at all: released as well.
    let f = Fake::default();
    let mut pod = desired_pod(&old, true);
    pod.metadata.uid = "pod-uid-earlier".into();
    *f.pod.borrow_mut() = Some(pod);
    *f.stored.borrow_mut() = Some(ic("web", "nginx"));
    run(&f, "ns/web").unwrap();
    assert!(finalizers(&f).is_empty());
    assert!(f.calls().contains(&"GET ic/web".to_string()));
}

#[test]
fn a_pod_is_deleted_for_a_spec_change_only_once_a_read_shows_the_change() {
    // The copy held asks for an image the object no longer does: etcd restored from a
    // snapshot taken before the change, the list that tells not in yet.
    let f = running("nginx:1");
    let mut ahead = f.ic.borrow().clone().unwrap();
    ahead.spec.image = "nginx:2".into();
    ahead.metadata.generation = Some(2);
    ahead.metadata.resource_version = "2279".into();
    *f.stored.borrow_mut() = Some(ahead);
    assert_eq!(run(&f, "ns/web").unwrap(), Action::requeue(Duration::ZERO));
    assert_eq!(
        f.calls(),
        ["CACHED ic/web", "GET pod/web-immortalpod", "GET ic/web"]
    );
    // Looked at again, from the object read: its pod is the one it asks for.
    f.clear();
    assert_eq!(run(&f, "ns/web").unwrap(), Action::await_change());
    assert!(
        !f.calls().iter().any(|c| c.starts_with("DELETE")),
        "{:?}",
        f.calls()
    );
    // A change the read shows is acted on in the same reconcile.
    f.ic.borrow_mut().as_mut().unwrap().spec.image = "nginx:2".into();
    *f.stored.borrow_mut() = f.ic.borrow().clone();
    f.clear();
    run(&f, "ns/web").unwrap();
    assert_eq!(
        f.calls()[..4],
        [
            "CACHED ic/web",
            "GET pod/web-immortalpod",
            "GET ic/web",
            "DELETE pod/web-immortalpod uid=pod-uid-1"
        ]
    );
}

#[test]
fn a_stale_copy_without_status_never_writes_the_count_lower() {
    let f = running("nginx");
    let bare = {
        let mut copy = f.ic.borrow().clone().unwrap();
        copy.status = Default::default();
        copy.metadata.resource_version = "5".into();
        copy
    };
    // The pod goes; a standby whose watch lags has only the object as it was made, and its
    // create is refused (a quota): it says so, from a copy that counts nothing.
    let hint = delete_after_running(&f, 60);
    *f.stored.borrow_mut() = Some(bare);
    f.fail_next("create_pod", api_err(403, "Forbidden"));
    f.fail_next("create_pod", api_err(403, "Forbidden"));
    assert!(run_elsewhere(&f, Some(&hint)).is_err());
    assert_eq!(
        status(&f).start_times,
        Some(1),
        "the count the server held stands"
    );
    // The retry works from the object read: the refusal is reported on the real count.
    f.fail_next("create_pod", api_err(403, "Forbidden"));
    f.fail_next("create_pod", api_err(403, "Forbidden"));
    run_elsewhere(&f, None).unwrap();
    assert_eq!(status(&f).start_times, Some(1));
    assert_eq!(ready(&f).1, "PodCreateFailed");
}

/// A fake whose clock the test moves.
fn fake_with_clock(ic: ImmortalContainer) -> (Fake, std::sync::Arc<std::sync::Mutex<Instant>>) {
    let now = std::sync::Arc::new(std::sync::Mutex::new(Instant::now()));
    let clock = now.clone();
    let f = Fake {
        ctx: ctx(move || *clock.lock().unwrap()),
        ..Default::default()
    };
    *f.ic.borrow_mut() = Some(ic);
    (f, now)
}

fn pod_uid(f: &Fake) -> String {
    f.pod.borrow().as_ref().unwrap().metadata.uid.clone()
}

/// Reconciles `key` as another process would: one that remembers nothing of this one's
/// reconciles (a new leader after a failover).
fn run_elsewhere(f: &Fake, hint: Option<&PodHint>) -> Result<Action, Error> {
    reconcile(
        f,
        &ctx(Instant::now),
        &LogContext {
            id: "3",
            key: &"ns/web".into(),
        },
        hint,
    )
}

#[test]
fn a_pod_released_uncounted_whose_removal_is_slow_is_replaced_once_it_is_gone() {
    let (f, now) = fake_with_clock(ic("web", "nginx"));
    made(&f);
    start_pod(&f);
    run_with(&f, &seen(&f)).unwrap();
    let first = pod_uid(&f);
    // Status writes are refused (an edited ClusterRole) when the first pod is deleted a
    // minute after it started: its replacement is made, and held for its count.
    let denied = || api_err(403, "Forbidden");
    let hint = delete_after_running(&f, 60);
    run_with(&f, &hint).unwrap();
    f.fail_next("patch_status", denied());
    assert!(matches!(
        run_with(&f, &added(&f)),
        Err(Error::Holding {
            deleting: false,
            ..
        })
    ));
    start_pod(&f);
    let second = pod_uid(&f);
    // A drain deletes it: it waits on our count a minute at most, then is released uncounted.
    f.delete_pod("ns", "web-immortalpod", &second, None)
        .unwrap();
    f.fail_next("patch_status", denied());
    assert!(run_with(&f, &seen(&f)).is_err());
    *now.lock().unwrap() += counting::HOLD_AT_MOST;
    f.fail_next("patch_status", denied());
    assert!(run(&f, "ns/web").is_err());
    assert!(f
        .pod
        .borrow()
        .as_ref()
        .unwrap()
        .metadata
        .finalizers
        .is_empty());
    // The count still names the first pod.
    assert_eq!(
        status(&f).last_counted_pod_uid.as_deref(),
        Some(first.as_str())
    );
    // Its container takes its grace period to stop: the pod goes after the reconcile that let
    // it go. Its DELETED event is about a pod never counted, not one replaced already: the
    // object must get a pod.
    let hint = gone(&f);
    *f.pod.borrow_mut() = None;
    f.clear();
    assert_eq!(run_with(&f, &hint).unwrap(), MADE);
    assert_eq!(
        f.calls(),
        [
            "CACHED ic/web",
            "GET ic/web",
            "GET pod/web-immortalpod",
            "POST pod/web-immortalpod"
        ]
    );
    count_made(&f);
    // Three pods started; the one released is missing from the count, as its Event said.
    assert_eq!(status(&f).start_times, Some(2));
    assert_eq!(ready(&f), ("False".into(), "PodPending".into()));
}

#[test]
fn after_a_failover_a_copy_older_than_the_last_count_is_read_before_a_deleted_event_is_dropped() {
    let f = running("nginx");
    // What the standby's watch last showed: the first pod counted.
    let standby_copy = f.ic.borrow().clone();
    // The old leader replaces the first pod and counts the second, then loses its Lease
    // before the new leader's watch brings that count.
    let hint = delete_after_running(&f, 60);
    run_with(&f, &hint).unwrap();
    count_made(&f);
    start_pod(&f);
    run_with(&f, &seen(&f)).unwrap();
    assert_eq!(status(&f).start_times, Some(2));
    *f.stored.borrow_mut() = standby_copy;
    // The second pod is deleted: the new leader must not take its DELETED event for an old
    // pod's (its copy names the first pod as counted last).
    let hint = delete_after_running(&f, 60);
    f.clear();
    assert_eq!(run_elsewhere(&f, Some(&hint)).unwrap(), MADE);
    assert_eq!(
        f.calls(),
        ["CACHED ic/web", "GET ic/web", "POST pod/web-immortalpod"]
    );
    run_elsewhere(&f, Some(&added(&f))).unwrap();
    assert_eq!(status(&f).start_times, Some(3));
    assert_eq!(
        status(&f).last_counted_pod_uid.as_deref(),
        Some(pod_uid(&f).as_str())
    );
}

#[test]
fn the_deleted_event_of_a_pod_another_process_replaced_is_checked_and_changes_nothing() {
    let f = running("nginx");
    let failed = end_pod_at(&f, "2025-12-31T23:59:30Z");
    run_with(&f, &seen(&f)).unwrap();
    count_made(&f);
    run_with(&f, &seen(&f)).unwrap();
    let replacement = pod_uid(&f);
    let hint = match PodEventHandler.on_event("DELETED", &failed, &mut None) {
        Reaction::Queue(Some(h), _) => h,
        other => panic!("{other:?}"),
    };
    // A process that did not make the replacement cannot know the event is old news: it
    // reads, finds the replacement counted, and does nothing more.
    f.clear();
    assert_eq!(
        run_elsewhere(&f, Some(&hint)).unwrap(),
        Action::await_change()
    );
    assert_eq!(
        f.calls(),
        ["CACHED ic/web", "GET ic/web", "GET pod/web-immortalpod"]
    );
    assert_eq!(pod_uid(&f), replacement);
    assert_eq!(status(&f).start_times, Some(2));
}

#[test]
fn a_count_refused_for_a_stale_copy_reads_the_object_so_the_retry_counts_once() {
    let f = running("nginx");
    let standby_copy = f.ic.borrow().clone();
    let hint = delete_after_running(&f, 60);
    run_with(&f, &hint).unwrap();
    count_made(&f);
    run_with(&f, &seen(&f)).unwrap();
    *f.stored.borrow_mut() = standby_copy;
    // The new leader's first reconcile (its relist) finds the pod its copy has not counted:
    // the count is refused (the copy is old), and the object read.
    f.clear();
    assert!(run_elsewhere(&f, None).is_err());
    assert_eq!(
        f.calls(),
        [
            "CACHED ic/web",
            "GET pod/web-immortalpod",
            "PATCH ic/web/status",
            "GET ic/web"
        ]
    );
    // The retry counts from what the API server holds, without waiting for the watch: the
    // pod is counted already, nothing to write.
    f.clear();
    assert_eq!(run_elsewhere(&f, None).unwrap(), Action::await_change());
    assert_eq!(f.calls(), ["CACHED ic/web", "GET pod/web-immortalpod"]);
    assert_eq!(status(&f).start_times, Some(2));
}

#[test]
fn a_pod_made_here_is_released_within_the_bound_whatever_waits_before_it() {
    let (f, now) = fake_with_clock(ic("web", "nginx"));
    // The create asks for a look by the bound: a queue deadline like any other.
    assert_eq!(
        run(&f, "ns/web").unwrap(),
        Action::requeue(counting::RELEASE_WITHIN)
    );
    // A backlog's creates kept its count from coming; its bound comes, and the look counts
    // it and lets it go at once.
    *now.lock().unwrap() += counting::RELEASE_WITHIN;
    f.clear();
    assert_eq!(run_with(&f, &added(&f)).unwrap(), Action::await_change());
    assert_eq!(
        f.calls(),
        [
            "CACHED ic/web",
            "PATCH ic/web/status",
            "PATCH pod/web-immortalpod release"
        ]
    );
    assert!(f
        .ctx
        .expectations
        .made_here("ns/web", f.ctx.now())
        .is_none());
}

#[test]
fn a_pod_made_here_whose_finalizer_someone_else_took_off_gets_one_look_and_no_more() {
    let (f, now) = fake_with_clock(ic("web", "nginx"));
    assert_eq!(
        run(&f, "ns/web").unwrap(),
        Action::requeue(counting::RELEASE_WITHIN)
    );
    // A person unsticking it, or a mutating policy, takes our finalizer off before its count.
    f.pod
        .borrow_mut()
        .as_mut()
        .unwrap()
        .metadata
        .finalizers
        .clear();
    *now.lock().unwrap() += counting::RELEASE_WITHIN;
    // The look the create asked for counts it and asks for no other: nothing is held.
    assert_eq!(run(&f, "ns/web").unwrap(), Action::await_change());
    assert!(f
        .ctx
        .expectations
        .made_here("ns/web", f.ctx.now())
        .is_none());
    assert_eq!(status(&f).start_times, Some(1));
}

#[test]
fn a_held_pod_of_an_object_never_counted_is_counted_from_its_event_by_any_process() {
    // Made by a process that stopped before counting it (or forgot it): its event alone says
    // enough, since a pod held by our finalizer cannot have gone uncounted, and nothing was
    // ever counted for the object (a stale copy's count would be refused at its write).
    let f = fake(ic("web", "nginx"));
    run(&f, "ns/web").unwrap();
    f.clear();
    assert_eq!(
        run_elsewhere(&f, Some(&added(&f))).unwrap(),
        Action::await_change()
    );
    assert_eq!(
        f.calls(),
        [
            "CACHED ic/web",
            "PATCH ic/web/status",
            "PATCH pod/web-immortalpod release"
        ]
    );
    assert_eq!(status(&f).start_times, Some(1));
}
