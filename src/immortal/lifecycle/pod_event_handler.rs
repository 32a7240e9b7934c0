//! The pod watcher's event handler: which pod events are worth a reconcile, and what each tells it.

use super::{Ending, LeftPod, PodHint, PodView, SeenPod, Waiting};
use crate::immortal::counting::is_held;
use crate::immortal::desired::recorded_hash;
use crate::immortal::types::{self as ic, ImmortalOwner, IMAGE_ANNOTATION};
use crate::kube::client::Resource;
use crate::kube::types::{self, Pod, Uid};
use crate::runtime::queue::Priority;
use crate::runtime::watcher::{EventHandler, Reaction};
use crate::util;

/// Our pods only (selected by label), each mapped to the ImmortalContainer that controls it.
pub struct PodEventHandler;

/// What the pod watcher remembers of a key's pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CachedPod {
    /// A digest of the pod's view: enough to tell a change from a repeat.
    digest: u64,
    /// It ended, or still holds our finalizer: listed, it goes before every refresh.
    urgent: bool,
}

impl CachedPod {
    fn of(o: &Pod, view: &PodView) -> CachedPod {
        CachedPod {
            digest: view.digest(),
            urgent: view.phase.is_terminal() || is_held(&o.metadata.finalizers),
        }
    }
}

impl EventHandler for PodEventHandler {
    type Object = Pod;
    type Hint = PodHint;
    type Cached = CachedPod;

    fn meta(o: &Pod) -> &types::ObjectMeta {
        &o.metadata
    }

    fn key_of_meta(&self, meta: &types::ObjectMeta) -> Option<String> {
        match meta.controller().filter(|r| r.is_immortal_container()) {
            Some(owner) => Some(types::key(&meta.namespace, &owner.name)),
            // Orphaned (`kubectl delete ic --cascade=orphan`) yet carrying our finalizer, which
            // nobody else would take off: its name says which object it was made for.
            None if is_held(&meta.finalizers) => meta
                .name
                .strip_suffix(ic::POD_SUFFIX)
                .map(|name| types::key(&meta.namespace, name)),
            None => None,
        }
    }

    fn cached(&self, o: &Pod) -> CachedPod {
        CachedPod::of(o, &PodView::of(o))
    }

    fn relist_priority(&self, cached: &CachedPod) -> Priority {
        match cached.urgent {
            true => Priority::Urgent,
            false => Priority::Routine,
        }
    }

    fn on_event(
        &self,
        event: &'static str,
        o: &Pod,
        cached: &mut Option<CachedPod>,
    ) -> Reaction<PodHint> {
        let m = &o.metadata;
        let held = is_held(&m.finalizers);
        if event == "DELETED" {
            *cached = None;
            // Its owner needs a pod (or its finalizer released): urgent.
            return Reaction::Queue(
                Some(PodHint::Left(Box::new(LeftPod {
                    uid: Uid::new(&m.uid),
                    ending: Ending::of(o),
                    held,
                }))),
                Priority::Urgent,
            );
        }
        let view = PodView::of(o);
        let now = CachedPod::of(o, &view);
        // Orphaned while holding our finalizer: released, whether or not its view changed.
        let owner = m.controller().filter(|r| r.is_immortal_container());
        let orphaned = held && owner.is_none();
        // Compared on the view: our own release of a pod changes nothing reconcile acts on. A
        // pod our finalizer still holds is worth a look at every event: its release waits on one.
        match cached.replace(now) {
            Some(before) if before.digest == now.digest && !held => return Reaction::Ignore,
            // A new pod plainly pending and released (an older CRD): reconcile made it and wrote
            // this very view; one someone else made is found by a relist or its next change.
            None if event == "ADDED" && view == PodView::pending() && !held => {
                return Reaction::Ignore
            }
            _ => {}
        }
        // Urgent: a pod that ended is replaced, one just made counted, one held for nobody or
        // while someone deletes it released. Any other change only changes what status says.
        let deleting_held = held && m.deletion_timestamp.is_some();
        let made = event == "ADDED" && held;
        let priority = if view.phase.is_terminal() || orphaned || deleting_held || made {
            Priority::Urgent
        } else {
            Priority::Routine
        };
        let (owner_uid, owner_name) = match owner {
            Some(c) => (Some(Uid::new(&c.uid)), c.name.as_str()),
            // Keyed by its own name (see `key_of_meta`).
            None if orphaned => (None, m.name.trim_end_matches(ic::POD_SUFFIX)),
            None => return Reaction::Queue(None, priority),
        };
        let hint = PodHint::Seen(Box::new(SeenPod {
            named_for_owner: m.name == ic::pod_name(owner_name),
            uid: Uid::new(&m.uid),
            owner_uid,
            created_for: util::intern(
                m.annotations
                    .get(IMAGE_ANNOTATION)
                    .map_or("", String::as_str),
            ),
            spec_hash: recorded_hash(o).map(util::intern),
            held,
            rv: m.resource_version.parse().unwrap_or(0),
            ending: Ending::of(o).map(Box::new),
            waiting: Waiting::of(o, &view),
            view,
        }));
        Reaction::Queue(Some(hint), priority)
    }
}

/// The pod watch: our pods only, selected by our label.
pub fn pods_kind(namespace: Option<String>) -> crate::runtime::watcher::Kind {
    crate::runtime::watcher::Kind {
        resource: Resource::PODS,
        namespace,
        label_selector: Some(format!("{}={}", ic::MANAGED_BY_LABEL, ic::MANAGED_BY_VALUE)),
        if_missing: None,
    }
}
