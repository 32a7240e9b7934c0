//! The event handler half of a watcher: what a watched resource's events mean, as keys to queue.

use crate::kube::types::ObjectMeta;
use crate::runtime::queue::{Hint, Priority};
use serde::de::DeserializeOwned;

/// What a watched resource's events mean: which key each queues, with what hint, in which
/// band, as a client-go `ResourceEventHandler` does for an informer.
pub trait EventHandler {
    /// What is decoded of each object: only the fields the handler decides on.
    type Object: DeserializeOwned;
    /// What a trigger carries beyond the key.
    type Hint: Hint;
    /// What the watcher remembers of each key (in its [`Store`](crate::runtime::store::Store)).
    type Cached: Clone + Send + Sync;
    fn meta(o: &Self::Object) -> &ObjectMeta;
    /// The queue key an object with this metadata stands for, or `None` when it is none of
    /// ours: from the metadata alone, so that an object that does not decode is still queued.
    fn key_of_meta(&self, meta: &ObjectMeta) -> Option<String>;
    /// The queue key the object stands for, or `None` when it is none of ours.
    fn key_of(&self, o: &Self::Object) -> Option<String> {
        self.key_of_meta(Self::meta(o))
    }
    /// What the watcher remembers of a listed object until its next event.
    fn cached(&self, o: &Self::Object) -> Self::Cached;
    /// What to keep when a list shows `new` for a key remembered as `old`: `new`, unless the
    /// handler knows `old` to be more recent.
    fn relisted(&self, _old: Self::Cached, new: Self::Cached, _listed: &Listed) -> Self::Cached {
        new
    }
    /// The band a listed key is queued in.
    fn relist_priority(&self, _cached: &Self::Cached) -> Priority {
        Priority::Routine
    }
    /// Whether this ADDED, MODIFIED or DELETED event is worth a reconcile, and with what hint.
    /// `cached`, what is remembered of the key, is updated in place; left `None`, it is forgotten.
    fn on_event(
        &self,
        event: &'static str,
        o: &Self::Object,
        cached: &mut Option<Self::Cached>,
    ) -> Reaction<Self::Hint>;
}

/// What a list says of the server's history, for [`EventHandler::relisted`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Listed {
    /// The list's resourceVersion, where it is a number (etcd's revision).
    pub version: Option<u64>,
    /// The list's version is below one the watch before it reached: etcd's history went back.
    pub rewound: bool,
}

/// An event handler's answer to one event.
#[derive(Debug, PartialEq, Eq)]
pub enum Reaction<H> {
    /// Nothing reconcile would do differently.
    Ignore,
    /// Queue the key, with what the event tells reconcile, in this band.
    Queue(Option<H>, Priority),
}
