//! What the operator knows of every ImmortalContainer: the part of it reconcile reads
//! (identity, version, spec, status), kept by the ImmortalContainer watcher and by reconcile's
//! own status writes, so that a reconcile costs no GET of its object.
//!
//! Why reading it here is safe: every write that must not act on stale state carries a
//! precondition (a count carries the resourceVersion it was computed from, a pod write the
//! pod's uid), and the store never steps back to a version older than one it holds: our own
//! status write's answer goes in at once (so the next reconcile does not count a pod again
//! from a copy that predates the count), and a watch event or a list that comes after it with
//! an older copy does not replace it. A key the store does not know is read from the API
//! server (a reconcile for an object deleted meanwhile, or not yet seen).

use crate::immortal::types::{ImmortalContainer, ImmortalContainerSpec, ImmortalContainerStatus};
use crate::kube::types::ObjectMeta;
use crate::runtime::store::Store;
use std::sync::Arc;

/// The store of ImmortalContainers, by `namespace/name`.
pub type IcStore = Store<Arc<IcState>>;

/// What reconcile needs of one ImmortalContainer.
#[derive(Debug, Clone, PartialEq)]
pub struct IcState {
    pub uid: String,
    pub resource_version: String,
    pub generation: Option<i64>,
    pub deletion_timestamp: Option<String>,
    pub image: String,
    pub status: ImmortalContainerStatus,
}

impl IcState {
    pub fn of(ic: &ImmortalContainer) -> IcState {
        let m = &ic.metadata;
        IcState {
            uid: m.uid.clone(),
            resource_version: m.resource_version.clone(),
            generation: m.generation,
            deletion_timestamp: m.deletion_timestamp.clone(),
            image: ic.spec.image.clone(),
            status: ic.status.clone(),
        }
    }

    /// The object as reconcile reads it.
    pub fn to_object(&self, namespace: &str, name: &str) -> ImmortalContainer {
        ImmortalContainer {
            metadata: ObjectMeta {
                name: name.to_string(),
                namespace: namespace.to_string(),
                uid: self.uid.clone(),
                resource_version: self.resource_version.clone(),
                generation: self.generation,
                deletion_timestamp: self.deletion_timestamp.clone(),
                ..Default::default()
            },
            spec: ImmortalContainerSpec {
                image: self.image.clone(),
            },
            status: self.status.clone(),
        }
    }

    /// Whether this is a later version of the object than `other`.
    pub fn newer_than(&self, other: &IcState) -> bool {
        self.uid != other.uid || rv_newer(&self.resource_version, &other.resource_version)
    }
}

/// Whether resourceVersion `a` is later than `b`. The API conventions call resourceVersions
/// opaque, but every kube-apiserver gives them out as etcd's revisions, decimal integers that
/// only grow; compared as such when both are. Otherwise `a`, the copy that came last, is taken
/// as the later one (at worst a write is repeated, or refused by its precondition).
pub fn rv_newer(a: &str, b: &str) -> bool {
    match (a.parse::<u64>(), b.parse::<u64>()) {
        (Ok(a), Ok(b)) => a > b,
        _ => a != b,
    }
}

/// Puts our own status write's answer in the store, unless it holds a later copy already.
pub fn saw(store: &IcStore, key: &str, answered: &ImmortalContainer) {
    let state = IcState::of(answered);
    store.update(key, |held| {
        if state.newer_than(held) {
            *held = Arc::new(state);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ic(rv: &str, starts: i64) -> ImmortalContainer {
        let mut ic = ImmortalContainer::default();
        ic.metadata.uid = "u".into();
        ic.metadata.resource_version = rv.into();
        ic.status.start_times = Some(starts);
        ic
    }

    #[test]
    fn versions_compare_as_numbers_and_otherwise_the_last_copy_wins() {
        assert!(rv_newer("10", "9"));
        assert!(!rv_newer("9", "10"));
        assert!(!rv_newer("10", "10"));
        assert!(rv_newer("abc", "9"));
        assert!(!rv_newer("abc", "abc"));
    }

    #[test]
    fn our_answer_replaces_an_older_copy_and_never_a_newer_one() {
        let store = IcStore::new();
        store
            .write()
            .insert("ns/a".into(), Arc::new(IcState::of(&ic("10", 0))));
        saw(&store, "ns/a", &ic("12", 1));
        assert_eq!(store.get("ns/a").unwrap().status.start_times, Some(1));
        // An answer that arrives after a later watch event changes nothing.
        store
            .write()
            .insert("ns/a".into(), Arc::new(IcState::of(&ic("15", 2))));
        saw(&store, "ns/a", &ic("12", 1));
        assert_eq!(store.get("ns/a").unwrap().resource_version, "15");
        // And nothing brings a deleted object back.
        store.write().remove("ns/a");
        saw(&store, "ns/a", &ic("20", 3));
        assert!(store.get("ns/a").is_none());
    }

    #[test]
    fn the_object_read_back_is_the_one_stored() {
        let mut want = ic("7", 3);
        want.metadata.name = "web".into();
        want.metadata.namespace = "ns".into();
        want.metadata.generation = Some(2);
        want.spec.image = "nginx".into();
        assert_eq!(IcState::of(&want).to_object("ns", "web"), want);
    }
}
