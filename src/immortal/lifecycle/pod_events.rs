//! The pod watcher's policy: which pod events are worth a reconcile, and what each tells it.

use super::{Ending, GonePod, PodHint, PodView, SeenPod};
use crate::immortal::types::{self as ic, ImmortalOwner, IMAGE_ANNOTATION, SPEC_HASH_ANNOTATION};
use crate::kube::client::Resource;
use crate::kube::types::{self, Pod, Uid};
use crate::runtime::queue::Priority;
use crate::runtime::watcher::{Reaction, Watched};
use crate::util;

/// The pod watcher's policy: our pods only (selected by label server-side), each mapped to the
/// ImmortalContainer that controls it.
pub struct PodEvents;

impl Watched for PodEvents {
    type Object = Pod;
    type Hint = PodHint;
    /// A digest of the pod's view: enough to tell a change from a repeat.
    type Memo = u64;

    fn meta(o: &Pod) -> &types::ObjectMeta {
        &o.metadata
    }

    fn key_of_meta(&self, meta: &types::ObjectMeta) -> Option<String> {
        match meta.controller().filter(|r| r.is_immortal_container()) {
            Some(owner) => Some(types::key(&meta.namespace, &owner.name)),
            // No ImmortalContainer controls it any more (`kubectl delete ic --cascade=orphan`
            // strips the reference), yet it still carries our finalizer: nobody would ever
            // take that off. Its name says which object it was made for.
            None if crate::immortal::counting::holds(&meta.finalizers) => meta
                .name
                .strip_suffix(ic::POD_SUFFIX)
                .map(|name| types::key(&meta.namespace, name)),
            None => None,
        }
    }

    fn memo(&self, o: &Pod) -> u64 {
        PodView::of(o).digest()
    }

    fn on_event(&self, event: &'static str, o: &Pod, memo: &mut Option<u64>) -> Reaction<PodHint> {
        if event == "DELETED" {
            *memo = None;
            // Its owner needs a pod (or its finalizer released): urgent.
            return Reaction::Queue(
                Some(PodHint::Gone(Box::new(GonePod {
                    uid: Uid::new(&o.metadata.uid),
                    ending: Ending::of(o),
                    holds_count: crate::immortal::counting::holds(&o.metadata.finalizers),
                }))),
                Priority::Urgent,
            );
        }
        let view = PodView::of(o);
        let digest = view.digest();
        let holds_count = crate::immortal::counting::holds(&o.metadata.finalizers);
        // Orphaned while holding our finalizer: its view may not have changed, but it must be
        // let go (see `key_of`).
        let orphaned = holds_count
            && !o
                .metadata
                .controller()
                .is_some_and(|r| r.is_immortal_container());
        match memo.replace(digest) {
            Some(before) if before == digest && !orphaned => return Reaction::Ignore,
            // A new pod that is plainly pending: reconcile created it, and writes this very
            // view by the bound of its count (`counting::COUNT_WAIT`). (A pod someone else
            // made is found by the relist after our restart, or by its next change.)
            None if event == "ADDED" && view == PodView::pending() && !orphaned => {
                return Reaction::Ignore
            }
            _ => {}
        }
        // A pod that ended must be replaced, and one held for nobody must be let go: urgent.
        // Any other change only changes what status says: routine.
        let priority = if view.phase.is_terminal() || orphaned {
            Priority::Urgent
        } else {
            Priority::Routine
        };
        let (owner_uid, owner_name) = match o.metadata.controller() {
            Some(c) if c.is_immortal_container() => (Some(Uid::new(&c.uid)), c.name.as_str()),
            // Keyed by its own name (see `key_of`).
            _ if orphaned => (None, o.metadata.name.trim_end_matches(ic::POD_SUFFIX)),
            _ => return Reaction::Queue(None, priority),
        };
        let hint = PodHint::Seen(Box::new(SeenPod {
            named_for_owner: o.metadata.name == ic::pod_name(owner_name),
            uid: Uid::new(&o.metadata.uid),
            owner_uid,
            created_for: util::intern(
                o.metadata
                    .annotations
                    .get(IMAGE_ANNOTATION)
                    .map_or("", String::as_str),
            ),
            spec_hash: o
                .metadata
                .annotations
                .get(SPEC_HASH_ANNOTATION)
                .map(|h| util::intern(h)),
            holds_count,
            rv: o.metadata.resource_version.parse().unwrap_or(0),
            ending: Ending::of(o),
            view,
        }));
        Reaction::Queue(Some(hint), priority)
    }
}

/// The two watched resources, their policies and where they are selected.
pub fn pods_kind(namespace: Option<String>) -> crate::runtime::watcher::Kind {
    crate::runtime::watcher::Kind {
        resource: Resource::PODS,
        namespace,
        label_selector: Some(format!("{}={}", ic::MANAGED_BY_LABEL, ic::MANAGED_BY_VALUE)),
        if_missing: None,
    }
}
