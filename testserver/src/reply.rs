//! What a handler answers: a whole JSON response, or the plan of a watch stream that
//! `server.rs` hands to `watch.rs`.

use crate::resources::ResourceDef;
use crate::selector::Selector;
use crate::status::ApiError;
use crate::store::Event;
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::Duration;

/// What to send back.
pub enum Reply {
    /// A whole JSON response.
    Json {
        code: u16,
        body: Vec<u8>,
        headers: Vec<(&'static str, String)>,
    },
    /// A watch stream on the resource with this storage key.
    Watch(Box<WatchPlan>, String),
}

/// How the watch starts.
pub enum Start {
    /// Registered: send `backlog`, then what arrives on `rx`.
    Started {
        id: u64,
        rx: Receiver<Arc<Event>>,
        backlog: Vec<Arc<Event>>,
    },
    /// The requested version is too old: one in-stream ERROR event, then a clean end
    /// (fixture 28).
    Expired(ApiError),
}

/// Everything a watch stream needs, prepared by the API layer as it registers the watch.
pub struct WatchPlan {
    pub def: Arc<ResourceDef>,
    pub version: String,
    pub start: Start,
    pub labels: Selector,
    pub fields: Selector,
    pub timeout: Duration,
    pub bookmarks: bool,
    /// The version the client asked to start after, for bookmarks before any event.
    pub from: u64,
    /// `Some(includeObject)` when the client asked for Table events (`kubectl get -w`).
    pub table: Option<Option<String>>,
    /// `Some(meta.k8s.io version)` when the client asked for `PartialObjectMetadata` events
    /// (a metadata informer).
    pub metadata: Option<&'static str>,
    /// The fault epoch the stream started in (see `Faults::is_frozen`), read before it was
    /// registered.
    pub epoch: u64,
}
