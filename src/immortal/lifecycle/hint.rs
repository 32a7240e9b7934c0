//! What a pod event tells reconcile beyond the key.

use super::{Ending, PodView, Waiting};
use crate::kube::types::Uid;
use crate::runtime::queue::Hint;
use std::fmt;
use std::sync::Arc;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodHint {
    /// The pod left our label-selected watch (DELETED), deleted or unlabelled: its name is
    /// probably free, so reconcile tries the create first and looks only if the name is taken.
    Left(Box<LeftPod>),
    /// The pod as the event showed it (`reconcile` says when it trusts it without a read).
    Seen(Box<SeenPod>),
}

/// A pod as its DELETED event showed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeftPod {
    pub uid: Uid,
    /// How it ended, if its last state shows that it did (not when only our label went).
    pub ending: Option<Ending>,
    /// It still carried our finalizer, so it only left our label selector: it must be looked at.
    pub held: bool,
}

/// A pod as one watch event showed it, kept small: it rides with its key in the queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeenPod {
    /// It has its owner's pod's name: a pod of another name the object controls is not its pod.
    pub named_for_owner: bool,
    pub uid: Uid,
    /// The uid of the ImmortalContainer that controls it (`None`: none does any more).
    pub owner_uid: Option<Uid>,
    /// Our image annotation: the image the pod was created for.
    pub created_for: Arc<str>,
    /// Our spec-hash annotation: the template it was made from, for an object with one.
    pub spec_hash: Option<Arc<str>>,
    /// It still carries our finalizer: its start may not be counted yet (see `counting`).
    pub held: bool,
    /// The event's resourceVersion (0 where the server's is not a number): whether it came
    /// before our own release of the pod, which it cannot show.
    pub rv: u64,
    pub view: PodView,
    /// How it ended, once it is terminal or being deleted (boxed: most pods queued did not end).
    pub ending: Option<Box<Ending>>,
    /// Since when it waits on its node, being deleted or pending.
    pub waiting: Option<Waiting>,
}

/// An object's pods follow one another under one name, and one watch brings their events in
/// order, so the later event shows all reconcile needs (a pod gone, then its replacement).
impl Hint for PodHint {
    fn and(&self, later: &PodHint) -> Option<PodHint> {
        Some(later.clone())
    }
}

impl fmt::Display for PodHint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PodHint::Left(g) => write!(f, "left uid={}", g.uid),
            PodHint::Seen(p) => write!(f, "{} uid={}", p.view.phase.as_str(), p.uid),
        }
    }
}
