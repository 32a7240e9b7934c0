//! The ImmortalContainer watcher's event handler: which object events are worth a reconcile.

use super::{CachedPod, PodHint};
use crate::immortal::ic_state::{IcState, IcStore};
use crate::immortal::types::{ImmortalContainer, IMMORTAL_CONTAINERS};
use crate::kube::types;
use crate::runtime::queue::{Priority, Queue, Trigger};
use crate::runtime::store::{Key, Store};
use crate::runtime::watcher::{EventHandler, Listed, Reaction};
use std::sync::Arc;

/// Every object is its own key, and what reconcile needs of it is remembered (see `ic_state`).
pub struct IcEventHandler;

impl EventHandler for IcEventHandler {
    type Object = ImmortalContainer;
    type Hint = PodHint;
    type Cached = Arc<IcState>;

    fn meta(o: &ImmortalContainer) -> &types::ObjectMeta {
        &o.metadata
    }

    fn key_of_meta(&self, meta: &types::ObjectMeta) -> Option<String> {
        Some(types::key(&meta.namespace, &meta.name))
    }

    fn cached(&self, o: &ImmortalContainer) -> Arc<IcState> {
        Arc::new(IcState::of(o))
    }

    /// What the list shows, unless what is held is later (our own status write's answer, not to
    /// be undone) and etcd's history did not go back (`rewound`).
    fn relisted(&self, old: Arc<IcState>, new: Arc<IcState>, listed: &Listed) -> Arc<IcState> {
        let later = old
            .version()
            .zip(listed.version)
            .is_some_and(|(held, list)| held > list);
        match later && !listed.rewound {
            true => old,
            false => new,
        }
    }

    /// Listed, an object that needs a pod (new, or its spec changed while we were away) goes
    /// before every refresh.
    fn relist_priority(&self, cached: &Arc<IcState>) -> Priority {
        match cached.needs_a_pod() {
            true => Priority::Urgent,
            false => Priority::Routine,
        }
    }

    /// A new object or a spec change needs a pod (urgent); a deletion needs a look (routine: a
    /// pod held by our finalizer must be released). A change of status alone is our own write
    /// coming back (maybe before its answer): nothing to do. The spec is compared as well as
    /// the generation: etcd restored from a snapshot hands out generations held copies had.
    fn on_event(
        &self,
        event: &'static str,
        o: &ImmortalContainer,
        cached: &mut Option<Arc<IcState>>,
    ) -> Reaction<PodHint> {
        if event == "DELETED" {
            // A later object of the name, read before this event came, stays (`IcState::replaces`).
            let gone = IcState::of(o).version();
            cached.take_if(|held| {
                held.uid() == o.metadata.uid || gone.zip(held.version()).is_some_and(|(g, h)| g > h)
            });
            // Its pod goes with it, unless our finalizer holds it, which reconcile takes off.
            return Reaction::Queue(None, Priority::Routine);
        }
        let new = IcState::of(o);
        let verdict = match cached.as_deref() {
            None => Reaction::Queue(None, Priority::Urgent),
            // A copy we have, or an older one than we have.
            Some(old) if !new.replaces(old) => return Reaction::Ignore,
            Some(old)
                if new.uid() != old.uid()
                    || new.generation() != old.generation()
                    || !new.same_spec(old) =>
            {
                Reaction::Queue(None, Priority::Urgent)
            }
            Some(old) if new.deleting() != old.deleting() => {
                Reaction::Queue(None, Priority::Routine)
            }
            Some(_) => Reaction::Ignore,
        };
        *cached = Some(Arc::new(new));
        verdict
    }
}

/// Once both first lists of `namespace` (`None`: all) are in, queues urgent every object whose
/// pod the pod list lacks (either list alone cannot tell: a pod may be missing only from a list
/// not read yet); answers how many.
pub fn queue_objects_without_a_pod(
    ics: &IcStore,
    pods: &Store<CachedPod>,
    queue: &Queue<PodHint>,
    namespace: Option<&str>,
) -> usize {
    let within =
        |k: &Key| namespace.is_none_or(|ns| types::split_key(k).is_some_and(|(n, _)| n == ns));
    let missing: Vec<Key> = {
        let pods = pods.read();
        ics.read()
            .keys()
            .filter(|k| within(k) && !pods.contains_key(*k))
            .cloned()
            .collect()
    };
    let relist = Trigger::Relist {
        resource: IMMORTAL_CONTAINERS.short(),
    };
    for key in &missing {
        queue.add(key.clone(), relist.clone(), Priority::Urgent);
    }
    missing.len()
}

pub fn immortal_containers_kind(namespace: Option<String>) -> crate::runtime::watcher::Kind {
    crate::runtime::watcher::Kind {
        resource: IMMORTAL_CONTAINERS,
        namespace,
        label_selector: None,
        if_missing: Some(
            "the ImmortalContainer CRD is not installed (install it with `make install` or `kubectl apply -k config/crd`)",
        ),
    }
}
