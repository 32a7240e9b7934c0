//! What the object's status says about its pod: the PHASE column and the `Ready` condition.

use crate::immortal::types::{self as ic, ImmortalPod};
use crate::kube::types::{self, Pod, PodStatus};
use crate::util;
use std::collections::hash_map::DefaultHasher;
use std::hash::{BuildHasher, BuildHasherDefault};
use std::sync::Arc;
use std::time::Duration;

/// The condition type saying whether the pod runs, always there.
pub const READY: &str = "Ready";
/// The condition type naming template fields the API server did not keep, while there are any.
pub const FIELDS_DROPPED: &str = "FieldsDropped";

/// A pod's phase as `status.podPhase` (the PHASE column) reports it: `Terminating` once it is
/// being deleted, as `kubectl get pod` shows, so the terminal phase that follows costs nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    Pending,
    Running,
    Succeeded,
    Failed,
    Unknown,
    Terminating,
}

/// The phases' names, in the order of [`Phase`]'s variants.
pub const PHASES: [&str; 6] = [
    "Pending",
    "Running",
    "Succeeded",
    "Failed",
    "Unknown",
    "Terminating",
];

impl Phase {
    pub fn as_str(self) -> &'static str {
        PHASES[self as usize]
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

/// Waiting reasons of a pod starting as it should: saying so would cost a status write per pod
/// for nothing a user acts on.
const STARTING: [&str; 3] = ["", "ContainerCreating", "PodInitializing"];

/// Why a pod is ready or not, as the Ready condition's reason says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    Running,
    Pending,
    NotReady,
    Terminating,
    Terminated,
    Unschedulable,
    ImagePullFailed,
    CrashLooping,
    Unknown,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Running => "PodRunning",
            Reason::Pending => "PodPending",
            Reason::NotReady => "PodNotReady",
            Reason::Terminating => "PodTerminating",
            Reason::Terminated => "PodTerminated",
            Reason::Unschedulable => "PodUnschedulable",
            Reason::ImagePullFailed => "ImagePullFailed",
            Reason::CrashLooping => "PodCrashLooping",
            Reason::Unknown => "PodUnknown",
        }
    }
}

/// What the object's status says about its pod, from the pod alone, for the watcher to compare.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PodView {
    pub phase: Phase,
    /// True only when the pod runs and its own Ready condition is True.
    pub ready: bool,
    pub reason: Reason,
    pub message: Message,
}

/// A Ready message. The two every pod shows, which follow from its name and image, are not kept
/// as text: a view rides with every queued key until its reconcile, and the store keeps one.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Message {
    Runs(Arc<str>),
    Pending,
    /// Any other text, with the pod's name cut out at the offset (`NAMELESS`: it named none),
    /// shared by every pod not ready for one reason.
    Text(Arc<str>, u32),
}

/// A [`Message::Text`] that does not name the pod.
const NAMELESS: u32 = u32::MAX;

impl Message {
    /// The text, for the pod called `pod`.
    pub fn text(&self, pod: &str) -> String {
        match self {
            Message::Runs(image) => format!("pod {pod} runs {image}"),
            Message::Pending => format!("pod {pod} is pending"),
            Message::Text(t, NAMELESS) => t.to_string(),
            Message::Text(t, at) => {
                let (before, after) = t.split_at(*at as usize);
                format!("{before}{pod}{after}")
            }
        }
    }

    /// `text`, about the pod called `pod`, as it is kept.
    pub fn of_text(text: &str, pod: &str) -> Message {
        match text
            .find(pod)
            .filter(|&at| !pod.is_empty() && at < NAMELESS as usize)
        {
            Some(at) => {
                let nameless = [&text[..at], &text[at + pod.len()..]].concat();
                Message::Text(util::intern(&nameless), at as u32)
            }
            None => Message::Text(util::intern(text), NAMELESS),
        }
    }
}

impl PodView {
    /// The view of `pod`, with the scheduler's or the kubelet's words where they gave any.
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
        let not_ready = |reason, message: String| PodView {
            phase,
            ready: false,
            reason,
            message: Message::of_text(&message, name),
        };
        match phase {
            Phase::Terminating => {
                let why = condition(&st, "DisruptionTarget")
                    .filter(|c| c.status == "True")
                    .map_or(String::new(), |c| format!(" ({}: {})", c.reason, c.message));
                not_ready(
                    Reason::Terminating,
                    format!("pod {name} is being deleted{why}"),
                )
            }
            // Reconcile replaces it at once.
            Phase::Succeeded | Phase::Failed => {
                let code = container(&st).and_then(|c| c.state.terminated.as_ref()?.exit_code);
                let how = match (st.reason.as_str(), code) {
                    ("", Some(code)) => format!(": container exited with code {code}"),
                    ("", None) => String::new(),
                    (reason, _) => format!(": {reason}: {}", st.message),
                };
                not_ready(
                    Reason::Terminated,
                    format!("pod {name} ended in phase {}{how}", phase.as_str()),
                )
            }
            Phase::Pending => {
                let unschedulable = condition(&st, "PodScheduled")
                    .filter(|c| c.status == "False" && c.reason == "Unschedulable");
                // While acontainer waits for the init containers, theirs is the news.
                let held = waiting(&st).filter(|w| !STARTING.contains(&w.reason.as_str()));
                let init = st.init_container_statuses.iter().find_map(|c| {
                    let w = c.state.waiting.as_ref()?;
                    (!STARTING.contains(&w.reason.as_str())).then_some((c, w))
                });
                match (unschedulable, held) {
                    (Some(c), _) => not_ready(
                        Reason::Unschedulable,
                        format!("pod {name} cannot be scheduled: {}", c.message),
                    ),
                    (None, Some(w)) if PULL_FAILURES.contains(&w.reason.as_str()) => not_ready(
                        Reason::ImagePullFailed,
                        format!(
                            "pod {name} cannot pull its image: {}: {}",
                            w.reason, w.message
                        ),
                    ),
                    (None, Some(w)) => {
                        let msg = match w.message.as_str() {
                            "" => w.reason.clone(),
                            m => format!("{}: {m}", w.reason),
                        };
                        not_ready(Reason::Pending, format!("pod {name} is pending: {msg}"))
                    }
                    (None, None) => match init {
                        Some((c, w)) if w.reason == "CrashLoopBackOff" => not_ready(
                            Reason::CrashLooping,
                            format!(
                                "init container {} of pod {name} keeps exiting: {}{}",
                                c.name,
                                w.message,
                                last_exit(c)
                            ),
                        ),
                        Some((c, w)) if PULL_FAILURES.contains(&w.reason.as_str()) => not_ready(
                            Reason::ImagePullFailed,
                            format!(
                                "pod {name} cannot pull the image of init container {}: {}: {}",
                                c.name, w.reason, w.message
                            ),
                        ),
                        _ => PodView::pending(),
                    },
                }
            }
            Phase::Running => {
                if condition(&st, "Ready").is_some_and(|c| c.status == "True") {
                    return PodView {
                        phase,
                        ready: true,
                        reason: Reason::Running,
                        message: Message::Runs(util::intern(pod.container_image().unwrap_or(""))),
                    };
                }
                if let Some(w) = waiting(&st).filter(|w| w.reason == "CrashLoopBackOff") {
                    let last = container(&st).map_or(String::new(), last_exit);
                    return not_ready(
                        Reason::CrashLooping,
                        format!("container of pod {name} keeps exiting: {}{last}", w.message),
                    );
                }
                // Then a sidecar (a restarting init container) or another container.
                let looping = st
                    .init_container_statuses
                    .iter()
                    .map(|c| ("sidecar", c))
                    .chain(st.container_statuses.iter().map(|c| ("container", c)))
                    .find_map(|(what, c)| {
                        let w = c.state.waiting.as_ref()?;
                        (w.reason == "CrashLoopBackOff").then_some((what, c, w))
                    });
                if let Some((what, c, w)) = looping {
                    return not_ready(
                        Reason::CrashLooping,
                        format!(
                            "{what} {} of pod {name} keeps exiting: {}{}",
                            c.name,
                            w.message,
                            last_exit(c)
                        ),
                    );
                }
                let why = condition(&st, "Ready").map_or(String::new(), |c| {
                    match (c.reason.as_str(), c.message.as_str()) {
                        ("", "") => String::new(),
                        (r, "") => format!(" ({r})"),
                        ("", m) => format!(" ({m})"),
                        (r, m) => format!(" ({r}: {m})"),
                    }
                });
                not_ready(
                    Reason::NotReady,
                    format!("pod {name} is running but not ready{why}"),
                )
            }
            // Its node stopped reporting.
            Phase::Unknown => not_ready(
                Reason::Unknown,
                format!("the node of pod {name} stopped reporting its state"),
            ),
        }
    }

    /// The view of a new pod: what reconcile writes after its create, and its first events show.
    pub fn pending() -> PodView {
        PodView {
            phase: Phase::Pending,
            ready: false,
            reason: Reason::Pending,
            message: Message::Pending,
        }
    }

    /// A digest of the view, remembered by the watcher to tell a change from a repeat.
    pub(super) fn digest(&self) -> u64 {
        BuildHasherDefault::<DefaultHasher>::default().hash_one(self)
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

/// The grace period of `pod`'s deletion.
pub(super) fn grace_period(pod: &Pod) -> Duration {
    let secs = pod.metadata.deletion_grace_period_seconds.unwrap_or(0);
    Duration::from_secs(secs.max(0) as u64)
}

/// How `c` last exited, as a crash-loop message ends: `; it last exited with code 1 (Error)`.
fn last_exit(c: &types::ContainerStatus) -> String {
    c.last_state.terminated.as_ref().map_or(String::new(), |t| {
        let code = t.exit_code.unwrap_or(0);
        match t.reason.as_str() {
            "" => format!("; it last exited with code {code}"),
            r => format!("; it last exited with code {code} ({r})"),
        }
    })
}

fn waiting(st: &PodStatus) -> Option<&types::StateDetail> {
    container(st).and_then(|c| c.state.waiting.as_ref())
}
