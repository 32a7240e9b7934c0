//! What the object's status says about its pod: the PHASE column and the `Ready` condition.

use crate::immortal::types::{self as ic, ImmortalPod};
use crate::kube::types::{self, Pod, PodStatus};
use crate::util;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

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
    pub(super) fn digest(&self) -> u64 {
        let mut h = DefaultHasher::new();
        self.hash(&mut h);
        h.finish()
    }
}

pub(super) fn condition<'a>(st: &'a PodStatus, type_: &str) -> Option<&'a types::PodCondition> {
    st.conditions.iter().find(|c| c.type_ == type_)
}

/// Our container's status.
pub(super) fn container(st: &PodStatus) -> Option<&types::ContainerStatus> {
    st.container_statuses
        .iter()
        .find(|c| c.name == ic::CONTAINER_NAME)
}

pub(super) fn waiting(st: &PodStatus) -> Option<&types::StateDetail> {
    container(st).and_then(|c| c.state.waiting.as_ref())
}

pub(super) fn exit(c: &types::ContainerStatus) -> Option<i32> {
    c.state.terminated.as_ref().and_then(|t| t.exit_code)
}
