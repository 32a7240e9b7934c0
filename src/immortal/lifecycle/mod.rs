//! What a pod of ours is doing, and what each watch event means for its owner.
//!
//! Both halves of one agreement, side by side: [`PodView::of`] says what the object's status
//! reports about its pod, and [`PodEvents`] queues the owner exactly when reconcile would act:
//! the pod is gone, it ended, or its view changed (docs/design.md, "Design").

mod ending;
mod hint;
mod ic_events;
mod pod_events;
mod view;
mod waiting;

pub use ending::{Ending, How};
pub use hint::{LeftPod, PodHint, SeenPod};
pub use ic_events::{immortal_containers_kind, queue_objects_without_a_pod, IcEvents};
pub use pod_events::{pods_kind, PodEvents, PodMemo};
pub use view::{Message, Phase, PodView, FIELDS_DROPPED, PHASES, READY};
pub use waiting::Waiting;

#[cfg(test)]
mod tests;
