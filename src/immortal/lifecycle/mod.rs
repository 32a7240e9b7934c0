//! What a pod of ours is doing, and what each watch event means for its owner.
//!
//! Both halves of one agreement, side by side: [`PodView::of`] says what the object's status
//! reports about its pod, and [`PodEventHandler`] queues the owner exactly when reconcile would
//! act: the pod is gone, it ended, or its view changed (docs/design.md, "Design").

mod ending;
mod hint;
mod ic_event_handler;
mod pod_event_handler;
mod view;
mod waiting;

pub use ending::{Ending, How};
pub use hint::{LeftPod, PodHint, SeenPod};
pub use ic_event_handler::{immortal_containers_kind, queue_objects_without_a_pod, IcEventHandler};
pub use pod_event_handler::{pods_kind, CachedPod, PodEventHandler};
pub use view::{Message, Phase, PodView, Reason, FIELDS_DROPPED, PHASES, READY};
pub use waiting::Waiting;

#[cfg(test)]
mod tests;
