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

mod ending;
mod hint;
mod ic_events;
mod pod_events;
mod view;

pub use ending::{Ending, How};
pub use hint::{GonePod, PodHint, SeenPod};
pub use ic_events::{immortal_containers_kind, IcEvents};
pub use pod_events::{pods_kind, PodEvents};
pub use view::{Message, Phase, PodView, READY};

#[cfg(test)]
mod tests;
