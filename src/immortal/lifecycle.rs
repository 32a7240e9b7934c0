//! What a pod of ours is doing, and what each of its watch events means for its owner.
//!
//! Both halves of one agreement live here, side by side:
//! - [`PodView::of`] says what the object's status reports about its pod (the `Ready`
//!   condition and the PHASE column). Reconcile writes it; nothing else decides it.
//! - [`PodEvents`] is the pod watcher's policy: which events are worth a reconcile and what
//!   each tells reconcile (a [`PodHint`]). An event is worth one exactly when reconcile would
//!   do something about it: the pod is gone (its name may be free), it ended (it must be
//!   replaced), or its view changed (status must say so). Anything else, and a pod's start-up
//!   is mostly MODIFIED events the scheduler and the kubelet write, costs no API request.
//!
//! What a real cluster streams, and what these rules are built on
//! (`tests/fixtures/kube-1.28-kubelet/`): since Kubernetes 1.27 the kubelet ends a graceful
//! deletion by writing phase Succeeded or Failed while `deletionTimestamp` is set, then removes
//! the pod, so a DELETED event may carry a terminal phase and a terminal phase may come with a
//! `deletionTimestamp`; neither means someone else already handled it. A forced delete is
//! DELETED while the phase still says Running. A label-selected watch reports DELETED when our
//! label is removed from a pod that lives on. So: a DELETED event always queues the owner, and
//! only a request to the API server (never an assumption about who else acts) decides what
//! happens next.

use crate::immortal::store::IcState;
use crate::immortal::types::{
    self as ic, ImmortalContainer, ImmortalOwner, ImmortalPod, IMAGE_ANNOTATION,
    IMMORTAL_CONTAINERS, SPEC_HASH_ANNOTATION,
};
use crate::kube::client::Resource;
use crate::kube::types::{self, Pod, PodStatus, Uid};
use crate::runtime::queue::Priority;
use crate::runtime::watcher::{Verdict, Watched};
use crate::util;
use std::collections::hash_map::DefaultHasher;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

/// The condition type the operator maintains.
pub const READY: &str = "Ready";

/// A pod's phase as the object's status reports it (`status.podPhase`, the PHASE column):
/// the pod's own `status.phase`, except `Terminating` once it has a `deletionTimestamp`, as
/// `kubectl get pod` shows it. The terminal phase the kubelet writes while it finishes a
/// deletion therefore changes nothing a user sees, and costs no status write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    Pending,
    Running,
    Succeeded,
    Failed,
    Unknown,
    Terminating,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Pending => "Pending",
            Phase::Running => "Running",
            Phase::Succeeded => "Succeeded",
            Phase::Failed => "Failed",
            Phase::Unknown => "Unknown",
            Phase::Terminating => "Terminating",
        }
    }

    /// Succeeded or Failed without a deletion under way: a pod never leaves these phases (API
    /// conventions, pod lifecycle), so it has to be replaced.
    pub fn is_terminal(self) -> bool {
        matches!(self, Phase::Succeeded | Phase::Failed)
    }
}

/// Container waiting reasons that mean the image cannot be pulled (the kubelet's names).
const PULL_FAILURES: [&str; 6] = [
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "ErrImageNeverPull",
    "RegistryUnavailable",
    "SignatureValidationFailed",
];

/// What the object's status says about its pod: the `Ready` condition (status, reason,
/// message) and the PHASE column. Built from the pod alone, the same way for a watch event and
/// for a pod reconcile read, so the watcher can tell when it changes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PodView {
    pub phase: Phase,
    /// True only when the pod runs and its own Ready condition is True.
    pub ready: bool,
    /// The condition's reason: what a user should look at.
    pub reason: &'static str,
    /// The condition's message, with the scheduler's or the kubelet's words when they gave any
    /// (see [`PodView::message`]).
    pub message: Message,
}

/// A Ready message. The two every pod shows in its life, which follow from its name and image,
/// are not kept as text: a view rides with every queued key until its reconcile, and is kept
/// for every object (see `store`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Message {
    /// "pod NAME runs IMAGE"
    Runs(Arc<str>),
    /// "pod NAME is pending"
    Pending,
    Text(Box<str>),
}

impl PodView {
    /// The view of `pod`. The rules, first match wins:
    /// - a `deletionTimestamp`: PodTerminating (with the eviction's words, if it was evicted);
    /// - Succeeded or Failed: PodTerminated (reconcile replaces it at once);
    /// - Pending: PodUnschedulable (the scheduler's message), ImagePullFailed (the kubelet's),
    ///   else PodPending;
    /// - Running with the pod's Ready condition True: Ready, PodRunning;
    /// - Running otherwise: PodCrashLooping when the container waits in CrashLoopBackOff,
    ///   else PodNotReady (the Ready condition's reason and message);
    /// - Unknown: PodUnknown (its node stopped reporting).
    pub fn of(pod: &Pod) -> PodView {
        let name = pod.metadata.name.as_str();
        let st = pod.status.clone().unwrap_or_default();
        let phase = match st.phase.as_deref() {
            _ if pod.metadata.deletion_timestamp.is_some() => Phase::Terminating,
            Some("Running") => Phase::Running,
            Some("Succeeded") => Phase::Succeeded,
            Some("Failed") => Phase::Failed,
            Some("Unknown") => Phase::Unknown,
            _ => Phase::Pending,
        };
        let view = |ready, reason, message: String| PodView {
            phase,
            ready,
            reason,
            message: Message::Text(message.into()),
        };
        match phase {
            Phase::Terminating => {
                let why = condition(&st, "DisruptionTarget")
                    .filter(|c| c.status == "True")
                    .map(|c| format!(" ({}: {})", c.reason, c.message))
                    .unwrap_or_default();
                view(
                    false,
                    "PodTerminating",
                    format!("pod {name} is being deleted{why}"),
                )
            }
            Phase::Succeeded | Phase::Failed => {
                let how = match (st.reason.as_str(), container(&st).and_then(exit)) {
                    ("", Some(code)) => format!(": container exited with code {code}"),
                    ("", None) => String::new(),
                    (reason, _) => format!(": {reason}: {}", st.message),
                };
                view(
                    false,
                    "PodTerminated",
                    format!("pod {name} ended in phase {}{how}", phase.as_str()),
                )
            }
            Phase::Pending => {
                if let Some(c) = condition(&st, "PodScheduled")
                    .filter(|c| c.status == "False" && c.reason == "Unschedulable")
                {
                    return view(
                        false,
                        "PodUnschedulable",
                        format!("pod {name} cannot be scheduled: {}", c.message),
                    );
                }
                match waiting(&st) {
                    Some(w) if PULL_FAILURES.contains(&w.reason.as_str()) => view(
                        false,
                        "ImagePullFailed",
                        format!(
                            "pod {name} cannot pull its image: {}: {}",
                            w.reason, w.message
                        ),
                    ),
                    // ContainerCreating and PodInitializing are a pod starting as it should:
                    // saying so would cost a status write per pod for nothing a user acts on.
                    Some(w)
                        if !w.reason.is_empty()
                            && !matches!(
                                w.reason.as_str(),
                                "ContainerCreating" | "PodInitializing"
                            ) =>
                    {
                        let msg = if w.message.is_empty() {
                            w.reason.clone()
                        } else {
                            format!("{}: {}", w.reason, w.message)
                        };
                        view(false, "PodPending", format!("pod {name} is pending: {msg}"))
                    }
                    _ => PodView::pending(),
                }
            }
            Phase::Running => {
                let ready = condition(&st, "Ready").filter(|c| c.status == "True");
                if ready.is_some() {
                    let image = pod.container_image().unwrap_or("");
                    return PodView {
                        phase,
                        ready: true,
                        reason: "PodRunning",
                        message: Message::Runs(util::intern(image)),
                    };
                }
                if let Some(w) = waiting(&st).filter(|w| w.reason == "CrashLoopBackOff") {
                    let last = container(&st)
                        .and_then(|c| c.last_state.terminated.as_ref())
                        .map(|t| {
                            let code = t.exit_code.unwrap_or(0);
                            match t.reason.as_str() {
                                "" => format!("; it last exited with code {code}"),
                                r => format!("; it last exited with code {code} ({r})"),
                            }
                        })
                        .unwrap_or_default();
                    return view(
                        false,
                        "PodCrashLooping",
                        format!("container of pod {name} keeps exiting: {}{last}", w.message),
                    );
                }
                let why = condition(&st, "Ready")
                    .map(|c| match (c.reason.as_str(), c.message.as_str()) {
                        ("", "") => String::new(),
                        (r, "") => format!(" ({r})"),
                        ("", m) => format!(" ({m})"),
                        (r, m) => format!(" ({r}: {m})"),
                    })
                    .unwrap_or_default();
                view(
                    false,
                    "PodNotReady",
                    format!("pod {name} is running but not ready{why}"),
                )
            }
            Phase::Unknown => view(
                false,
                "PodUnknown",
                format!("the node of pod {name} stopped reporting its state"),
            ),
        }
    }

    /// The view of a pod that was just created: what reconcile writes after its create, and
    /// what a new pod's first events show until it runs.
    pub fn pending() -> PodView {
        PodView {
            phase: Phase::Pending,
            ready: false,
            reason: "PodPending",
            message: Message::Pending,
        }
    }

    /// The condition's message, for the pod called `pod`.
    pub fn message(&self, pod: &str) -> String {
        match &self.message {
            Message::Runs(image) => format!("pod {pod} runs {image}"),
            Message::Pending => format!("pod {pod} is pending"),
            Message::Text(t) => t.to_string(),
        }
    }

    /// A digest of the view, remembered by the watcher to tell a change from a repeat.
    fn digest(&self) -> u64 {
        let mut h = DefaultHasher::new();
        self.hash(&mut h);
        h.finish()
    }
}

/// How a pod of ours ended, read from its last state: whether it was deleted (through the API:
/// a person, a drain or eviction, the garbage collector, PodGC) or ended on its own (phase
/// Succeeded or Failed before anyone asked to delete it), and how long its container had run
/// by then. The restart back-off ([`crate::immortal::restarts`]) goes by how long it ran.
///
/// Every time is the pod's own, so no clock of ours is compared with the cluster's: the
/// container's `startedAt` (the kubelet's), and the moment the deletion was asked for, which is
/// `deletionTimestamp - deletionGracePeriodSeconds` (the API server sets the first to the time
/// of the request plus the grace period, and a later, shorter grace period moves both so that
/// this difference stays; `BeforeDelete` in the API server's registry).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ending {
    pub how: How,
    /// How long the container had run when the pod was deleted or ended; `None` when it never
    /// started (or the pod does not say).
    pub ran: Option<Duration>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum How {
    /// Deleted through the API, or evicted.
    Deleted,
    /// Ended on its own: phase Succeeded or Failed with nobody asking. Our pods restart their
    /// container (restartPolicy Always), so what ends one is the cluster: an
    /// `activeDeadlineSeconds`, a kubelet evicting under node pressure, a node shutting down.
    Ended,
}

impl Ending {
    /// How `pod` ended, or `None` when it shows no ending (it still runs; a watch saw it only
    /// leave our label selector).
    pub fn of(pod: &Pod) -> Option<Ending> {
        let st = pod.status.as_ref();
        let terminal = matches!(pod.phase(), "Succeeded" | "Failed");
        let c = st.and_then(container);
        let at = |t: Option<&String>| t.and_then(|t| util::parse_rfc3339(t));
        let started = c.and_then(|c| {
            at(c.state.running.as_ref().and_then(|r| r.started_at.as_ref()))
                .or(at(c
                    .state
                    .terminated
                    .as_ref()
                    .and_then(|t| t.started_at.as_ref())))
                .or(at(c
                    .last_state
                    .terminated
                    .as_ref()
                    .and_then(|t| t.started_at.as_ref())))
        });
        let finished = c.and_then(|c| {
            at(c.state
                .terminated
                .as_ref()
                .and_then(|t| t.finished_at.as_ref()))
        });
        let m = &pod.metadata;
        let asked = at(m.deletion_timestamp.as_ref()).map(|t| {
            let grace =
                Duration::from_secs(m.deletion_grace_period_seconds.unwrap_or(0).max(0) as u64);
            t.checked_sub(grace).unwrap_or(t)
        });
        let (how, end) = match (asked, terminal) {
            // Terminal before the deletion was asked for: it ended, then was cleared away.
            (Some(asked), true) if finished.is_some_and(|f| f < asked) => (How::Ended, finished),
            (Some(asked), _) => (How::Deleted, Some(asked)),
            (None, true) => (How::Ended, finished),
            (None, false) => return None,
        };
        let ran = match (started, end) {
            (Some(s), Some(e)) => Some(e.duration_since(s).unwrap_or_default()),
            _ => None,
        };
        Some(Ending { how, ran })
    }
}

impl fmt::Display for Ending {
    /// "was deleted 3 s after it started", "ended before it started"...
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verb = match self.how {
            How::Deleted => "was deleted",
            How::Ended => "ended",
        };
        match self.ran {
            Some(d) => write!(f, "{verb} {} s after it started", d.as_secs()),
            None => write!(f, "{verb} before it started"),
        }
    }
}

fn condition<'a>(st: &'a PodStatus, type_: &str) -> Option<&'a types::PodCondition> {
    st.conditions.iter().find(|c| c.type_ == type_)
}

/// Our container's status.
fn container(st: &PodStatus) -> Option<&types::ContainerStatus> {
    st.container_statuses
        .iter()
        .find(|c| c.name == ic::CONTAINER_NAME)
}

fn waiting(st: &PodStatus) -> Option<&types::StateDetail> {
    container(st).and_then(|c| c.state.waiting.as_ref())
}

fn exit(c: &types::ContainerStatus) -> Option<i32> {
    c.state.terminated.as_ref().and_then(|t| t.exit_code)
}

/// What a pod event tells reconcile beyond the key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodHint {
    /// The pod left our watch: deleted, or our label removed from it. Its name is probably
    /// free, so reconcile tries the create first and looks only if the name is taken.
    Gone(Box<GonePod>),
    /// The pod as the event showed it. Reconcile may act on it without reading the pod again
    /// (see `reconcile`, which says when it trusts it).
    Seen(Box<SeenPod>),
}

/// A pod as its DELETED event showed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GonePod {
    pub uid: Uid,
    /// How it ended, if its last state shows that it did (not when only our label went).
    pub ending: Option<Ending>,
    /// It still carried our finalizer, so it cannot have been removed: it only left our label
    /// selector, and must be looked at.
    pub holds_count: bool,
}

/// A pod as one watch event showed it: identifiers, the image it was created for, its view.
/// It rides with its key in the queue until the reconcile, so it is kept small: no text that
/// can be derived, uids in 16 bytes, the image shared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeenPod {
    /// It has the name its owner's pod has (`NAME-immortalpod`): a pod of another name
    /// controlled by the object is not the object's pod.
    pub named_for_owner: bool,
    pub uid: Uid,
    /// The uid of the ImmortalContainer its controller reference names (`None`: no
    /// ImmortalContainer controls it any more).
    pub owner_uid: Option<Uid>,
    /// Our image annotation: the image the pod was created for.
    pub created_for: Arc<str>,
    /// Our spec-hash annotation: the template it was made from, for an object with one.
    pub spec_hash: Option<Arc<str>>,
    /// It still carries our finalizer: its start may not be counted yet (see `counting`).
    pub holds_count: bool,
    pub view: PodView,
    /// How it ended, once it is terminal or being deleted.
    pub ending: Option<Ending>,
}

impl fmt::Display for PodHint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PodHint::Gone(g) => write!(f, "gone uid={}", g.uid),
            PodHint::Seen(p) => write!(f, "{} uid={}", p.view.phase.as_str(), p.uid),
        }
    }
}

/// The pod watcher's policy: our pods only (selected by label server-side), each mapped to the
/// ImmortalContainer that controls it.
pub struct PodEvents;

impl Watched for PodEvents {
    type Object = Pod;
    type Hint = PodHint;
    /// A digest of the pod's view: enough to tell a change from a repeat.
    type Memo = u64;

    fn meta(o: &Pod) -> &types::ObjectMeta {
        &o.metadata
    }

    fn key_of_meta(&self, meta: &types::ObjectMeta) -> Option<String> {
        match meta.controller().filter(|r| r.is_immortal_container()) {
            Some(owner) => Some(types::key(&meta.namespace, &owner.name)),
            // No ImmortalContainer controls it any more (`kubectl delete ic --cascade=orphan`
            // strips the reference), yet it still carries our finalizer: nobody would ever
            // take that off. Its name says which object it was made for.
            None if crate::immortal::counting::holds(&meta.finalizers) => meta
                .name
                .strip_suffix(ic::POD_SUFFIX)
                .map(|name| types::key(&meta.namespace, name)),
            None => None,
        }
    }

    fn memo(&self, o: &Pod) -> u64 {
        PodView::of(o).digest()
    }

    fn on_event(&self, event: &'static str, o: &Pod, memo: &mut Option<u64>) -> Verdict<PodHint> {
        if event == "DELETED" {
            *memo = None;
            // Its owner needs a pod (or its finalizer released): urgent.
            return Verdict::Queue(
                Some(PodHint::Gone(Box::new(GonePod {
                    uid: Uid::new(&o.metadata.uid),
                    ending: Ending::of(o),
                    holds_count: crate::immortal::counting::holds(&o.metadata.finalizers),
                }))),
                Priority::Urgent,
            );
        }
        let view = PodView::of(o);
        let digest = view.digest();
        let holds_count = crate::immortal::counting::holds(&o.metadata.finalizers);
        // Orphaned while holding our finalizer: its view may not have changed, but it must be
        // let go (see `key_of`).
        let orphaned = holds_count
            && !o
                .metadata
                .controller()
                .is_some_and(|r| r.is_immortal_container());
        match memo.replace(digest) {
            Some(before) if before == digest && !orphaned => return Verdict::Ignore,
            // A new pod that is plainly pending: reconcile created it and wrote this very
            // view. (A pod someone else made is found by the relist after our restart, or by
            // its next change.)
            None if event == "ADDED" && view == PodView::pending() && !orphaned => {
                return Verdict::Ignore
            }
            _ => {}
        }
        // A pod that ended must be replaced, and one held for nobody must be let go: urgent.
        // Any other change only changes what status says: routine.
        let priority = if view.phase.is_terminal() || orphaned {
            Priority::Urgent
        } else {
            Priority::Routine
        };
        let (owner_uid, owner_name) = match o.metadata.controller() {
            Some(c) if c.is_immortal_container() => (Some(Uid::new(&c.uid)), c.name.as_str()),
            // Keyed by its own name (see `key_of`).
            _ if orphaned => (None, o.metadata.name.trim_end_matches(ic::POD_SUFFIX)),
            _ => return Verdict::Queue(None, priority),
        };
        let hint = PodHint::Seen(Box::new(SeenPod {
            named_for_owner: o.metadata.name == ic::pod_name(owner_name),
            uid: Uid::new(&o.metadata.uid),
            owner_uid,
            created_for: util::intern(
                o.metadata
                    .annotations
                    .get(IMAGE_ANNOTATION)
                    .map_or("", String::as_str),
            ),
            spec_hash: o
                .metadata
                .annotations
                .get(SPEC_HASH_ANNOTATION)
                .map(|h| util::intern(h)),
            holds_count,
            ending: Ending::of(o),
            view,
        }));
        Verdict::Queue(Some(hint), priority)
    }
}

/// The ImmortalContainer watcher's policy: every object is its own key, and what reconcile
/// needs of it is remembered (see `store`).
pub struct IcEvents;

impl Watched for IcEvents {
    type Object = ImmortalContainer;
    type Hint = PodHint;
    type Memo = Arc<IcState>;

    fn meta(o: &ImmortalContainer) -> &types::ObjectMeta {
        &o.metadata
    }

    fn key_of_meta(&self, meta: &types::ObjectMeta) -> Option<String> {
        Some(types::key(&meta.namespace, &meta.name))
    }

    fn memo(&self, o: &ImmortalContainer) -> Arc<IcState> {
        Arc::new(IcState::of(o))
    }

    /// What the list shows, unless what is held is a later copy of the same object: a list
    /// served before our own latest status write answered must not undo it. A listed object
    /// with another uid always wins (the name was deleted and made again while the watch was
    /// down), and so does one whose resourceVersion cannot be compared.
    fn relisted(&self, old: Arc<IcState>, new: Arc<IcState>) -> Arc<IcState> {
        if new.replaces(&old) {
            new
        } else {
            old
        }
    }

    /// Compared with what is remembered: a new object or a spec change needs a pod (urgent);
    /// a deletion needs a look (routine: a pod held by our finalizer must be let go). A change
    /// of status alone needs nothing: it is our own write coming back (whose event may arrive
    /// before its answer does, so it cannot be told from someone else's by the version).
    fn on_event(
        &self,
        event: &'static str,
        o: &ImmortalContainer,
        memo: &mut Option<Arc<IcState>>,
    ) -> Verdict<PodHint> {
        if event == "DELETED" {
            // A later object of the name, read from the API server before this event came,
            // stays.
            if memo
                .as_deref()
                .is_none_or(|held| held.uid() == o.metadata.uid)
            {
                *memo = None;
            }
            // Its pod goes with it, unless our finalizer holds it (the object went while its
            // pod was being counted), which the reconcile of a key whose object is gone takes
            // off. Nothing waits on it.
            return Verdict::Queue(None, Priority::Routine);
        }
        let new = IcState::of(o);
        let verdict = match memo.as_deref() {
            None => Verdict::Queue(None, Priority::Urgent),
            // A copy we have, or an older one than we have.
            Some(old) if !new.replaces(old) => return Verdict::Ignore,
            Some(old) if new.uid() != old.uid() || new.generation() != old.generation() => {
                Verdict::Queue(None, Priority::Urgent)
            }
            Some(old) if new.deleting() != old.deleting() => {
                Verdict::Queue(None, Priority::Routine)
            }
            Some(_) => Verdict::Ignore,
        };
        *memo = Some(Arc::new(new));
        verdict
    }
}

/// The two watched resources, their policies and where they are selected.
pub fn pods_kind(namespace: Option<String>) -> crate::runtime::watcher::Kind {
    crate::runtime::watcher::Kind {
        resource: Resource::PODS,
        namespace,
        label_selector: Some(format!("{}={}", ic::MANAGED_BY_LABEL, ic::MANAGED_BY_VALUE)),
        if_missing: None,
    }
}

pub fn immortal_containers_kind(namespace: Option<String>) -> crate::runtime::watcher::Kind {
    crate::runtime::watcher::Kind {
        resource: IMMORTAL_CONTAINERS,
        namespace,
        label_selector: None,
        if_missing: Some(
            "the ImmortalContainer CRD is not installed (install it with `make install` or `kubectl apply -k config/crd`)",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::kubelet_events;

    /// The events of a watch recorded on a real cluster with a kubelet, each pod given the
    /// controller reference our pods carry (the recorded pods were made with kubectl).
    fn recorded(name: &str) -> Vec<(&'static str, Pod)> {
        kubelet_events(name)
            .iter()
            .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap())
            .filter(|e| e["type"] != "BOOKMARK")
            .map(|mut e| {
                e["object"]["metadata"]["ownerReferences"] = serde_json::json!([{
                    "apiVersion": "immortalcontainer.flugel.it/v1alpha1",
                    "kind": "ImmortalContainer", "name": "web", "uid": "ic-uid", "controller": true}]);
                let event = match e["type"].as_str() {
                    Some("ADDED") => "ADDED",
                    Some("MODIFIED") => "MODIFIED",
                    _ => "DELETED",
                };
                (event, serde_json::from_value(e["object"].clone()).unwrap())
            })
            .collect()
    }

    /// What the pod watcher does with each recorded event: "-" for nothing, else the hint it
    /// queues ("gone!", or the phase and reason the event showed), with "!" when it is queued
    /// urgent. `seed`: the memo before the stream, as the event before it (the stream starts
    /// mid-life) would have left it.
    fn verdicts(name: &str, seed: Option<usize>) -> Vec<String> {
        let events = recorded(name);
        let mut memo = seed.map(|i| PodEvents.memo(&events[i].1));
        events
            .iter()
            .map(
                |(event, pod)| match PodEvents.on_event(event, pod, &mut memo) {
                    Verdict::Ignore => "-".to_string(),
                    Verdict::Queue(hint, priority) => {
                        let urgent = if priority == Priority::Urgent {
                            "!"
                        } else {
                            ""
                        };
                        let what = match hint {
                            Some(PodHint::Gone(_)) => "gone".to_string(),
                            Some(PodHint::Seen(p)) => {
                                format!("{} {}", p.view.phase.as_str(), p.view.reason)
                            }
                            None => "queue".to_string(),
                        };
                        what + urgent
                    }
                },
            )
            .collect()
    }

    #[test]
    fn a_pod_starting_costs_one_reconcile_when_it_runs() {
        // ADDED, PodScheduled, ContainerCreating: what reconcile wrote after its create.
        assert_eq!(
            verdicts("03-watch-pod-scheduled-then-running", None),
            ["-", "-", "-", "Running PodRunning"]
        );
    }

    #[test]
    fn a_graceful_deletion_queues_the_owner_when_it_starts_and_when_the_pod_is_gone() {
        // MODIFIED deleting (Running), Succeeded while deleting, again, grace 0, DELETED with
        // phase Succeeded: the terminal phase during deletion changes nothing we report, and
        // the DELETED event is never dropped, whatever phase it carries.
        for name in [
            "04-watch-graceful-delete-default-grace",
            "05-watch-delete-grace-period-1",
        ] {
            assert_eq!(
                verdicts(name, None),
                ["Terminating PodTerminating", "-", "-", "-", "gone!"],
                "{name}"
            );
        }
    }

    #[test]
    fn a_forced_delete_is_gone_while_the_phase_still_says_running() {
        assert_eq!(
            verdicts("06-watch-force-delete-grace-0", None),
            ["Terminating PodTerminating", "gone!"]
        );
    }

    #[test]
    fn an_eviction_says_why_the_pod_is_going_and_queues_the_owner_when_it_is_gone() {
        // The DisruptionTarget condition alone changes nothing: the pod still runs and is ready.
        let v = verdicts("07-watch-eviction", Some(0));
        assert_eq!(
            v,
            [
                "-",
                "Terminating PodTerminating",
                "-",
                "-",
                "-",
                "-",
                "gone!"
            ]
        );
        let events = recorded("07-watch-eviction");
        assert_eq!(
            PodView::of(&events[1].1).message(&events[1].1.metadata.name),
            "pod evicted is being deleted (EvictionByEvictionAPI: Eviction API: evicting)"
        );
    }

    #[test]
    fn a_pod_the_kubelet_failed_is_reported_not_ready_then_terminal() {
        assert_eq!(
            verdicts("09-watch-kubelet-fails-pod-deadline-exceeded", Some(0)),
            ["-", "Running PodNotReady", "Failed PodTerminated!", "-"]
        );
        let events = recorded("09-watch-kubelet-fails-pod-deadline-exceeded");
        assert_eq!(
            PodView::of(&events[2].1).message(&events[2].1.metadata.name),
            "pod deadline ended in phase Failed: DeadlineExceeded: Pod was active on the node longer than the specified deadline"
        );
    }

    #[test]
    fn a_phase_a_client_wrote_is_reported_and_so_is_the_kubelets_correction() {
        assert_eq!(
            verdicts("10-watch-client-writes-failed-kubelet-reverts", None),
            ["Failed PodTerminated!", "Running PodRunning"]
        );
    }

    #[test]
    fn an_unschedulable_pod_is_reported_with_the_schedulers_words() {
        assert_eq!(
            verdicts("11-watch-unschedulable-node-cordoned", None),
            ["-", "Pending PodUnschedulable"]
        );
        let events = recorded("11-watch-unschedulable-node-cordoned");
        let view = PodView::of(&events[1].1);
        let message = view.message(&events[1].1.metadata.name);
        assert!(!view.ready);
        assert!(
            message
                .starts_with("pod unschedulable cannot be scheduled: 0/1 nodes are available: 1 node(s) were unschedulable."),
            "{}",
            message
        );
    }

    #[test]
    fn a_pod_whose_label_was_removed_left_our_watch_and_queues_its_owner() {
        let v = verdicts("12-watch-label-removed-leaves-selected-watch", Some(0));
        assert_eq!(v, ["-", "gone!"]);
    }

    fn pod(phase: &str, status: serde_json::Value) -> Pod {
        let mut st = status;
        st["phase"] = phase.into();
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web-immortalpod"},
            "spec": {"containers": [{"name": "acontainer", "image": "nginx"}]},
            "status": st}))
        .unwrap()
    }

    #[test]
    fn ready_is_true_only_for_a_running_pod_whose_own_ready_condition_is_true() {
        let ready = serde_json::json!({"conditions": [{"type": "Ready", "status": "True"}]});
        let running = PodView::of(&pod("Running", ready.clone()));
        assert!(running.ready);
        assert_eq!(
            (running.reason, running.message("web-immortalpod").as_str()),
            ("PodRunning", "pod web-immortalpod runs nginx")
        );
        // The recorded fake kubelet says Ready while still Pending: not running, not ready.
        assert!(!PodView::of(&pod("Pending", ready.clone())).ready);
        let mut deleting = pod("Running", ready);
        deleting.metadata.deletion_timestamp = Some("2026-01-01T00:00:00Z".into());
        assert!(!PodView::of(&deleting).ready);
        let not_ready = PodView::of(&pod(
            "Running",
            serde_json::json!({"conditions": [{"type": "Ready", "status": "False",
                "reason": "ContainersNotReady", "message": "containers with unready status: [acontainer]"}]}),
        ));
        assert_eq!(
            (not_ready.ready, not_ready.reason, not_ready.message("web-immortalpod").as_str()),
            (
                false,
                "PodNotReady",
                "pod web-immortalpod is running but not ready (ContainersNotReady: containers with unready status: [acontainer])"
            )
        );
    }

    #[test]
    fn a_failing_image_pull_and_a_crash_loop_are_named_with_the_kubelets_words() {
        let pull = PodView::of(&pod(
            "Pending",
            serde_json::json!({"containerStatuses": [{"name": "acontainer", "state": {"waiting": {
                "reason": "ImagePullBackOff", "message": "Back-off pulling image \"nope\""}}}]}),
        ));
        assert_eq!(
            (pull.reason, pull.message("web-immortalpod").as_str()),
            (
                "ImagePullFailed",
                "pod web-immortalpod cannot pull its image: ImagePullBackOff: Back-off pulling image \"nope\""
            )
        );
        let crash = PodView::of(&pod(
            "Running",
            serde_json::json!({"conditions": [{"type": "Ready", "status": "False"}],
                "containerStatuses": [{"name": "acontainer", "restartCount": 3,
                "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s restarting failed container=acontainer"}},
                "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}}}]}),
        ));
        assert_eq!(
            (crash.reason, crash.message("web-immortalpod").as_str()),
            (
                "PodCrashLooping",
                "container of pod web-immortalpod keeps exiting: back-off 40s restarting failed container=acontainer; it last exited with code 1 (Error)"
            )
        );
        // A pod starting as it should is plainly pending: nothing for a user to act on.
        let creating = PodView::of(&pod(
            "Pending",
            serde_json::json!({"containerStatuses": [{"name": "acontainer", "state": {"waiting": {
                "reason": "ContainerCreating"}}}]}),
        ));
        assert_eq!(creating, PodView::pending());
    }

    #[test]
    fn a_changed_view_queues_its_owner_once_and_a_repeat_does_not() {
        let ready = pod(
            "Running",
            serde_json::json!({"conditions": [{"type": "Ready", "status": "True"}]}),
        );
        let mut p = ready.clone();
        p.metadata.owner_references = vec![types::OwnerReference {
            api_version: ic::API_VERSION.into(),
            kind: ic::KIND.into(),
            name: "web".into(),
            uid: "ic-uid".into(),
            controller: Some(true),
            block_owner_deletion: None,
        }];
        let mut memo = None;
        assert!(matches!(
            PodEvents.on_event("MODIFIED", &p, &mut memo),
            Verdict::Queue(Some(PodHint::Seen(_)), Priority::Routine)
        ));
        assert_eq!(
            PodEvents.on_event("MODIFIED", &p, &mut memo),
            Verdict::Ignore
        );
        assert_eq!(PodEvents.key_of(&p).as_deref(), Some("/web"));
        // Not ours (no controller reference to an ImmortalContainer): no key at all.
        assert_eq!(PodEvents.key_of(&ready), None);
    }

    #[test]
    fn an_object_is_queued_when_it_needs_a_pod_or_a_look_and_not_for_our_own_writes() {
        let ic = |rv: &str, generation: i64, starts: i64| -> ImmortalContainer {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "web", "namespace": "ns", "uid": "u",
                    "resourceVersion": rv, "generation": generation},
                "status": {"startTimes": starts}}))
            .unwrap()
        };
        // New: a pod to make.
        let mut memo = None;
        assert_eq!(
            IcEvents.on_event("ADDED", &ic("10", 1, 0), &mut memo),
            Verdict::Queue(None, Priority::Urgent)
        );
        // Our status write: its answer is remembered (as reconcile does, see `store::saw`),
        // so its event, and any older copy, is nothing new.
        memo = Some(Arc::new(IcState::of(&ic("11", 1, 1))));
        for older in [ic("11", 1, 1), ic("10", 1, 0)] {
            assert_eq!(
                IcEvents.on_event("MODIFIED", &older, &mut memo),
                Verdict::Ignore
            );
        }
        assert_eq!(memo.as_ref().unwrap().resource_version(), "11");
        // Our write's event before its answer: only status changed, nothing to do, but
        // remembered.
        assert_eq!(
            IcEvents.on_event("MODIFIED", &ic("12", 1, 7), &mut memo),
            Verdict::Ignore
        );
        assert_eq!(
            memo.as_ref()
                .unwrap()
                .to_object("ns", "web")
                .status
                .start_times,
            Some(7)
        );
        // A spec change: a pod to replace, urgent.
        assert_eq!(
            IcEvents.on_event("MODIFIED", &ic("13", 2, 7), &mut memo),
            Verdict::Queue(None, Priority::Urgent)
        );
        // A deletion is looked at (its pod may hold our finalizer), and forgotten.
        assert_eq!(
            IcEvents.on_event("DELETED", &ic("14", 2, 7), &mut memo),
            Verdict::Queue(None, Priority::Routine)
        );
        assert!(memo.is_none());
    }

    /// The ImmortalContainer watcher, run over `script` until it runs out: what its store
    /// holds of `ns/web` then.
    fn watched_ic(script: &crate::runtime::watcher::script::Script) -> ImmortalContainer {
        use crate::runtime::store::Store;
        use crate::runtime::watcher::Watcher;
        let store = Arc::new(Store::new());
        let (quit_tx, quit) = crossbeam_channel::bounded(0);
        *script.quit_tx.lock().unwrap() = Some(quit_tx);
        let (synced, _synced_rx) = crossbeam_channel::unbounded();
        let w = Watcher::new(
            script,
            immortal_containers_kind(None),
            IcEvents,
            Arc::new(crate::runtime::queue::Queue::new()),
            quit,
            synced,
            crate::runtime::watcher::DEFAULT_IDLE_TIMEOUT,
        )
        .sharing(store.clone());
        std::thread::scope(|s| s.spawn(move || w.run()).join()).unwrap();
        let held = store.get("ns/web").expect("the store knows ns/web");
        held.to_object("ns", "web")
    }

    fn ic_json(uid: &str, rv: &str, image: &str, starts: i64) -> serde_json::Value {
        serde_json::json!({
            "metadata": {"name": "web", "namespace": "ns", "uid": uid, "resourceVersion": rv,
                "generation": 1},
            "spec": {"image": image}, "status": {"startTimes": starts}})
    }

    fn ic_list(rv: &str, item: serde_json::Value) -> serde_json::Value {
        serde_json::json!({"metadata": {"resourceVersion": rv}, "items": [item]})
    }

    #[test]
    fn a_relist_after_410_takes_the_object_made_again_under_the_same_name() {
        use crate::runtime::watcher::script::{gone, Script};
        // Deleted and made again while the watch was down; the watch resumes with a version
        // too old (410) and lists: the store must hold the new object, or its pod is made for
        // the old uid (and removed by the garbage collector) and every count is refused.
        for (old_rv, new_rv) in [("10", "20"), ("20", "10"), ("opaque-1", "opaque-2")] {
            let s = Script::default();
            let mut lists = s.lists.lock().unwrap();
            lists.push_back(Ok(ic_list(old_rv, ic_json("old-uid", old_rv, "nginx", 3))));
            lists.push_back(Ok(ic_list(new_rv, ic_json("new-uid", new_rv, "nginx", 0))));
            drop(lists);
            s.watches.lock().unwrap().push_back(Err(gone()));
            let held = watched_ic(&s);
            assert_eq!(
                (held.metadata.uid.as_str(), held.status.start_times),
                ("new-uid", Some(0)),
                "{old_rv} then {new_rv}"
            );
        }
    }

    #[test]
    fn a_relist_takes_a_changed_object_whose_versions_cannot_be_compared() {
        use crate::runtime::watcher::script::{gone, Script};
        let s = Script::default();
        let mut lists = s.lists.lock().unwrap();
        lists.push_back(Ok(ic_list("a", ic_json("u", "a", "nginx:1", 1))));
        lists.push_back(Ok(ic_list("b", ic_json("u", "b", "nginx:2", 1))));
        drop(lists);
        s.watches.lock().unwrap().push_back(Err(gone()));
        assert_eq!(watched_ic(&s).spec.image, "nginx:2");
    }

    #[test]
    fn a_relist_keeps_a_later_copy_of_the_same_object() {
        use crate::runtime::watcher::script::{gone, Script};
        // Our status write's answer (rv 12) went in while a list served at rv 11 was read.
        let old = Arc::new(IcState::of(
            &serde_json::from_value(ic_json("u", "12", "nginx", 2)).unwrap(),
        ));
        let listed = Arc::new(IcState::of(
            &serde_json::from_value(ic_json("u", "11", "nginx", 1)).unwrap(),
        ));
        assert_eq!(IcEvents.relisted(old.clone(), listed), old);
        // The watcher's own path: the same object listed again, unchanged.
        let s = Script::default();
        let mut lists = s.lists.lock().unwrap();
        lists.push_back(Ok(ic_list("12", ic_json("u", "12", "nginx", 2))));
        lists.push_back(Ok(ic_list("13", ic_json("u", "12", "nginx", 2))));
        drop(lists);
        s.watches.lock().unwrap().push_back(Err(gone()));
        assert_eq!(watched_ic(&s).status.start_times, Some(2));
    }

    #[test]
    fn the_deleted_event_of_an_object_forgets_its_copy_and_not_a_later_objects() {
        let ic = |uid: &str, rv: &str| -> ImmortalContainer {
            serde_json::from_value(ic_json(uid, rv, "nginx", 0)).unwrap()
        };
        let mut memo = Some(Arc::new(IcState::of(&ic("new-uid", "20"))));
        assert_eq!(
            IcEvents.on_event("DELETED", &ic("old-uid", "15"), &mut memo),
            Verdict::Queue(None, Priority::Routine)
        );
        assert_eq!(memo.as_ref().unwrap().uid(), "new-uid");
        IcEvents.on_event("DELETED", &ic("new-uid", "21"), &mut memo);
        assert!(memo.is_none());
    }

    /// The pod policy over a recorded stream, run by a real watcher.
    #[test]
    fn recorded_stream_moves_the_version_through_bookmarks_and_rewatches_after_a_clean_end() {
        use crate::runtime::watcher::script::{page, run, Script};
        use crate::testutil::fixture_events;
        // The recorded stream: MODIFIED (Failed), MODIFIED (deleting), DELETED, BOOKMARK rv 970.
        let events = fixture_events("30-watch-pods-from-list-rv").join("\n") + "\n";
        let s = Script::default();
        s.lists
            .lock()
            .unwrap()
            .push_back(Ok(page("967", &[], None)));
        s.watches.lock().unwrap().push_back(Ok((events, None)));
        let (calls, queued) = run(&s, PodEvents);
        assert_eq!(
            calls[..3],
            ["list continue=", "watch rv=967", "watch rv=970"].map(String::from)
        );
        // Each event queued the owner, each replacing the last trigger; the pod is gone in the
        // end, which is what the reconcile that follows is told.
        assert_eq!(
            queued,
            vec![(
                "fixtures/example".to_string(),
                "pod DELETED rv=970 gone uid=c6f0852f-487c-4a9a-9867-b6cc2e7718f3".to_string()
            )]
        );
    }
}
