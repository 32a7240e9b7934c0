//! The API calls reconcile makes, and the production implementation of them.

use crate::immortal::ic_state::{self, IcStore};
use crate::immortal::types::{ImmortalContainer, IMMORTAL_CONTAINERS};
use crate::kube::client;
use crate::kube::events::{Note, Recorder};
use crate::kube::types::{self, Pod};
use serde_json::Value;
use std::sync::Arc;

/// The API calls reconcile makes. [`LiveApi`] is the real one; tests use a fake that
/// records every call.
pub trait Api {
    /// The object as the operator knows it: in the real one, its store (no request, as a
    /// client-go lister's Get), which may be older than the API server's copy.
    fn cached_immortal_container(
        &self,
        ns: &str,
        name: &str,
    ) -> Result<ImmortalContainer, client::Error>;
    /// The object as the API server holds it now: always a request (a client's Get). What it
    /// answers is known from then on (see `ic_state::saw`).
    fn get_immortal_container(
        &self,
        ns: &str,
        name: &str,
    ) -> Result<ImmortalContainer, client::Error>;
    fn get_pod(&self, ns: &str, name: &str) -> Result<Pod, client::Error>;
    /// Creates the pod; answers it with the spec the API server stored (to tell what of ours
    /// it dropped: `desired::dropped`).
    fn create_pod(&self, ns: &str, pod: &Pod) -> Result<client::CreatedPod, client::Error>;
    /// Deletes the pod if it still has `uid`; answers it as the server left it.
    fn delete_pod(
        &self,
        ns: &str,
        name: &str,
        uid: &str,
        grace: Option<u32>,
    ) -> Result<Pod, client::Error>;
    /// Merge-patches the pod; a `metadata.uid` in the patch that is not the pod's is refused
    /// (422, `client::Error::is_uid_changed`).
    fn patch_pod(&self, ns: &str, name: &str, patch: &Value) -> Result<Pod, client::Error>;
    fn patch_status(
        &self,
        ns: &str,
        name: &str,
        patch: &Value,
    ) -> Result<ImmortalContainer, client::Error>;
    /// Records a Kubernetes Event about `ic` (best effort: never fails the reconcile).
    fn record(&self, ic: &ImmortalContainer, note: Note);
}

/// The real API: the client, with Events going to the recorder thread, and objects read from
/// what the ImmortalContainer watcher knows (see `ic_state`).
pub struct LiveApi {
    pub client: client::Client,
    pub events: Recorder,
    pub ics: Arc<IcStore>,
}

impl LiveApi {
    /// Puts what the API server answered about the object into the store: the copy it sent,
    /// or, on a 404, no copy, so that the next reconcile reads.
    fn keep(
        &self,
        ns: &str,
        name: &str,
        answer: Result<ImmortalContainer, client::Error>,
    ) -> Result<ImmortalContainer, client::Error> {
        let key = types::key(ns, name);
        match &answer {
            Ok(ic) => ic_state::saw(&self.ics, &key, ic),
            Err(e) if e.is_not_found() => ic_state::gone(&self.ics, &key),
            Err(_) => {}
        }
        answer
    }
}

impl Api for LiveApi {
    /// The object as the store knows it, or as the API server answers when the store does not
    /// know it (deleted meanwhile, or not seen yet).
    fn cached_immortal_container(
        &self,
        ns: &str,
        name: &str,
    ) -> Result<ImmortalContainer, client::Error> {
        match self.ics.get(&types::key(ns, name)) {
            Some(state) => Ok(state.to_object(ns, name)),
            None => self.client.get_object(IMMORTAL_CONTAINERS, ns, name),
        }
    }
    fn get_immortal_container(
        &self,
        ns: &str,
        name: &str,
    ) -> Result<ImmortalContainer, client::Error> {
        let answer = self.client.get_object(IMMORTAL_CONTAINERS, ns, name);
        self.keep(ns, name, answer)
    }
    fn get_pod(&self, ns: &str, name: &str) -> Result<Pod, client::Error> {
        self.client.get_pod(ns, name)
    }
    fn create_pod(&self, ns: &str, pod: &Pod) -> Result<client::CreatedPod, client::Error> {
        self.client.create_pod_stored(ns, pod)
    }
    fn delete_pod(
        &self,
        ns: &str,
        name: &str,
        uid: &str,
        grace: Option<u32>,
    ) -> Result<Pod, client::Error> {
        self.client.delete_pod(ns, name, uid, grace)
    }
    fn patch_pod(&self, ns: &str, name: &str, patch: &Value) -> Result<Pod, client::Error> {
        self.client.patch_pod(ns, name, patch)
    }
    /// The answer goes into the store at once: the next reconcile of the object must not act
    /// on a copy from before this write (its resourceVersion would be refused). A 404 takes
    /// the copy out: the object is gone, whatever the watch has said so far.
    fn patch_status(
        &self,
        ns: &str,
        name: &str,
        patch: &Value,
    ) -> Result<ImmortalContainer, client::Error> {
        let answer =
            self.client
                .patch_status::<ImmortalContainer>(IMMORTAL_CONTAINERS, ns, name, patch);
        self.keep(ns, name, answer)
    }
    fn record(&self, ic: &ImmortalContainer, note: Note) {
        self.events.record(&ic.metadata, note);
    }
}
