//! What reconcile reads of every ImmortalContainer, kept by the watcher and by our own status
//! writes' answers, so that a reconcile costs no GET; a key the store does not know is read.
//! Safe because every write that must not act on stale state carries a precondition, and a
//! watch event never steps the store back ([`IcState::replaces`]). Why most objects are held
//! [`Compact`]: docs/design.md, "Design".

use crate::immortal::lifecycle::{Message, Reason, PHASES, READY};
use crate::immortal::types::{
    pod_name, ImmortalContainer, ImmortalContainerSpec, ImmortalContainerStatus, Template,
};
use crate::kube::types::{format_uuid, parse_uuid, Condition, ObjectMeta};
use crate::runtime::store::Store;
use crate::util::{self, intern, SharedSet};
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

/// The store of ImmortalContainers, by `namespace/name`.
pub type IcStore = Store<Arc<IcState>>;

/// What reconcile needs of one ImmortalContainer.
#[derive(Debug, Clone, PartialEq)]
pub enum IcState {
    Compact(Compact),
    /// The fields the store keeps (see `projection`), for what the compact form cannot hold.
    Full(Box<ImmortalContainer>),
}

/// An object as the operator leaves it (its pod running, starting or not ready).
#[derive(Debug, Clone, PartialEq)]
pub struct Compact {
    uid: [u8; 16],
    resource_version: u64,
    generation: i64,
    spec: Arc<SharedSpec>,
    /// [`NONE`] when not written yet.
    start_times: i64,
    last_counted: Option<[u8; 16]>,
    /// Whether `currentPod` names the object's pod (the only pod it ever names).
    current_pod: bool,
    /// Index into [`PHASES`].
    pod_phase: Option<u8>,
    observed_generation: i64,
    ready: Option<CompactReady>,
}

/// An object's spec, one copy for every object that has the same (most come from a few manifests).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct SharedSpec {
    image: Arc<str>,
    template: Option<Template>,
}

impl SharedSpec {
    /// The shared copy of `spec` (see `util::SharedSet`).
    fn of(spec: &ImmortalContainerSpec) -> Arc<SharedSpec> {
        static SHARED: SharedSet<SharedSpec> = SharedSet::new();
        let probe = SharedSpec {
            image: intern(&spec.image),
            template: spec.template.clone(),
        };
        SHARED.get(&probe, |p| Arc::new(p.clone()))
    }
}

/// The Ready condition, every object's (one that also has `FieldsDropped` keeps a typed copy).
#[derive(Debug, Clone, PartialEq)]
struct CompactReady {
    status: bool,
    /// One of [`REASONS`].
    reason: Reason,
    /// Another text than the two derived is shared by every object that shows the same words.
    message: Message,
    observed_generation: i64,
    /// Seconds since the epoch, as the RFC 3339 the API server holds (`...Z`, no fraction); a
    /// time this cannot hold keeps the object whole ([`IcState::Full`]).
    last_transition: u32,
}

/// Stands for "none" in the compact form's numbers.
const NONE: i64 = i64::MIN;

/// The Ready reasons of a pod that runs or starts: the states an object stays in.
const REASONS: [Reason; 3] = [Reason::Running, Reason::Pending, Reason::NotReady];

impl IcState {
    /// What reconcile needs of `ic`: compact when that gives back the same object.
    pub fn of(ic: &ImmortalContainer) -> IcState {
        let (ns, name) = (&ic.metadata.namespace, &ic.metadata.name);
        match Compact::of(ic) {
            Some(c) if c.to_object(ns, name) == projection(ic, ns, name) => IcState::Compact(c),
            _ => IcState::Full(Box::new(projection(ic, "", ""))),
        }
    }

    /// The object as reconcile reads it.
    pub fn to_object(&self, namespace: &str, name: &str) -> ImmortalContainer {
        match self {
            IcState::Full(f) => projection(f, namespace, name),
            IcState::Compact(c) => c.to_object(namespace, name),
        }
    }

    pub fn uid(&self) -> String {
        match self {
            IcState::Full(f) => f.metadata.uid.clone(),
            IcState::Compact(c) => format_uuid(&c.uid),
        }
    }

    pub fn resource_version(&self) -> String {
        match self {
            IcState::Full(f) => f.metadata.resource_version.clone(),
            IcState::Compact(c) => c.resource_version.to_string(),
        }
    }

    pub fn generation(&self) -> Option<i64> {
        match self {
            IcState::Full(f) => f.metadata.generation,
            IcState::Compact(c) => Some(c.generation),
        }
    }

    /// Whether there is a pod to make or replace: status names none, or has not seen the spec.
    pub fn needs_a_pod(&self) -> bool {
        match self {
            IcState::Full(f) => {
                let s = &f.status;
                (s.current_pod.is_none() && s.last_counted_pod_uid.is_none())
                    || s.observed_generation != f.metadata.generation
            }
            IcState::Compact(c) => {
                (!c.current_pod && c.last_counted.is_none())
                    || c.observed_generation != c.generation
            }
        }
    }

    /// Whether `other` asks for the same pod: the same image and template.
    pub fn same_spec(&self, other: &IcState) -> bool {
        match (self, other) {
            // Shared, one copy for every object with the same: equal at the pointer.
            (IcState::Compact(a), IcState::Compact(b)) => a.spec == b.spec,
            _ => self.to_object("", "").spec == other.to_object("", "").spec,
        }
    }

    pub fn deleting(&self) -> bool {
        matches!(self, IcState::Full(f) if f.metadata.deletion_timestamp.is_some())
    }

    /// Whether this copy, a watch event's that came after `held`, is later and should replace
    /// it. kube-apiserver's resourceVersions are etcd revisions, which compare across uids (an
    /// object of the name made since); where either is opaque, the copy that came last wins.
    pub fn replaces(&self, held: &IcState) -> bool {
        match (self.version(), held.version()) {
            (Some(v), Some(h)) => v > h,
            _ => self.resource_version() != held.resource_version() || self.uid() != held.uid(),
        }
    }

    /// The resourceVersion as the number kube-apiserver makes it, if it is one.
    pub fn version(&self) -> Option<u64> {
        match self {
            IcState::Full(f) => f.metadata.resource_version.parse().ok(),
            IcState::Compact(c) => Some(c.resource_version),
        }
    }
}

impl Compact {
    /// The compact form of `ic`, if it fits; what it does not test fails [`IcState::of`]'s check.
    fn of(ic: &ImmortalContainer) -> Option<Compact> {
        let (m, st) = (&ic.metadata, &ic.status);
        let (pod, spec) = (pod_name(&m.name), SharedSpec::of(&ic.spec));
        let ready = match st.conditions.as_slice() {
            [] => None,
            [c] if c.type_ == READY => Some(CompactReady {
                status: c.status == "True",
                reason: REASONS.into_iter().find(|r| r.as_str() == c.reason)?,
                message: [Message::Runs(spec.image.clone()), Message::Pending]
                    .into_iter()
                    .find(|derived| derived.text(&pod) == c.message)
                    .unwrap_or_else(|| Message::of_text(&c.message, &pod)),
                observed_generation: c.observed_generation.unwrap_or(NONE),
                last_transition: util::parse_rfc3339(&c.last_transition_time)
                    .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                    .and_then(|d| u32::try_from(d.as_secs()).ok())?,
            }),
            _ => return None,
        };
        Some(Compact {
            uid: parse_uuid(&m.uid)?,
            resource_version: m.resource_version.parse().ok()?,
            generation: m.generation?,
            spec,
            start_times: st.start_times.unwrap_or(NONE),
            last_counted: match &st.last_counted_pod_uid {
                Some(u) => Some(parse_uuid(u)?),
                None => None,
            },
            current_pod: st.current_pod.is_some(),
            pod_phase: match &st.pod_phase {
                Some(p) => Some(index(&PHASES, p)?),
                None => None,
            },
            observed_generation: st.observed_generation.unwrap_or(NONE),
            ready,
        })
    }

    fn to_object(&self, namespace: &str, name: &str) -> ImmortalContainer {
        let some = |n: i64| (n != NONE).then_some(n);
        let pod = pod_name(name);
        let status = ImmortalContainerStatus {
            current_pod: self.current_pod.then(|| pod.clone()),
            start_times: some(self.start_times),
            last_counted_pod_uid: self.last_counted.as_ref().map(format_uuid),
            observed_generation: some(self.observed_generation),
            pod_phase: self.pod_phase.map(|i| PHASES[usize::from(i)].to_string()),
            conditions: Vec::from_iter(self.ready.iter().map(|r| Condition {
                type_: READY.to_string(),
                status: if r.status { "True" } else { "False" }.to_string(),
                observed_generation: some(r.observed_generation),
                last_transition_time: util::rfc3339(
                    UNIX_EPOCH + Duration::from_secs(u64::from(r.last_transition)),
                ),
                reason: r.reason.as_str().to_string(),
                message: r.message.text(&pod),
            })),
        };
        ImmortalContainer {
            metadata: ObjectMeta {
                name: name.to_string(),
                namespace: namespace.to_string(),
                uid: format_uuid(&self.uid),
                resource_version: self.resource_version.to_string(),
                generation: Some(self.generation),
                ..Default::default()
            },
            spec: ImmortalContainerSpec {
                image: self.spec.image.to_string(),
                template: self.spec.template.clone(),
            },
            status,
        }
    }
}

/// The fields of `ic` the store keeps, under `namespace/name`.
fn projection(ic: &ImmortalContainer, namespace: &str, name: &str) -> ImmortalContainer {
    let m = &ic.metadata;
    ImmortalContainer {
        metadata: ObjectMeta {
            name: name.to_string(),
            namespace: namespace.to_string(),
            uid: m.uid.clone(),
            resource_version: m.resource_version.clone(),
            generation: m.generation,
            deletion_timestamp: m.deletion_timestamp.clone(),
            ..Default::default()
        },
        spec: ic.spec.clone(),
        status: ic.status.clone(),
    }
}

fn index(table: &[&str], s: &str) -> Option<u8> {
    table.iter().position(|t| *t == s).map(|i| i as u8)
}

/// The API server answered 404 for `key`: the stale copy goes, so the next reconcile reads (a
/// new leader whose watch lags would make pods for a gone object).
pub fn gone(store: &IcStore, key: &str) {
    store.write().remove(key);
}

/// Keeps a copy the API server answered (to a status write or a read) in place of the one held,
/// whatever their versions (an etcd restore takes them back): it is what the server holds now.
pub fn saw(store: &IcStore, key: &str, answered: &ImmortalContainer) {
    let state = Arc::new(IcState::of(answered));
    store.update(key, |held| *held = state);
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "6c1e8a2b-3f4d-4e5f-8a9b-0c1d2e3f4a5b";
    const POD_UID: &str = "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d";

    fn ic(rv: &str, starts: i64) -> ImmortalContainer {
        let mut ic = ImmortalContainer::default();
        ic.metadata.name = "web".into();
        ic.metadata.namespace = "ns".into();
        ic.metadata.uid = UID.into();
        ic.metadata.resource_version = rv.into();
        ic.metadata.generation = Some(1);
        ic.spec.image = "registry.k8s.io/pause:3.9".into();
        ic.status.start_times = Some(starts);
        ic
    }

    /// An object as the operator leaves it: its pod counted, running and ready.
    fn running() -> ImmortalContainer {
        let mut ic = ic("1234", 3);
        ic.status.current_pod = Some("web-immortalpod".into());
        ic.status.last_counted_pod_uid = Some(POD_UID.into());
        ic.status.observed_generation = Some(1);
        ic.status.pod_phase = Some("Running".into());
        ic.status.conditions = vec![Condition {
            type_: "Ready".into(),
            status: "True".into(),
            observed_generation: Some(1),
            last_transition_time: "2026-11-24T10:00:00Z".into(),
            reason: "PodRunning".into(),
            message: "pod web-immortalpod runs registry.k8s.io/pause:3.9".into(),
        }];
        ic
    }

    #[test]
    fn an_object_as_the_operator_leaves_it_is_held_compact_and_read_back_exactly() {
        let listed = {
            // As a list or watch decodes it: with metadata reconcile does not read.
            let mut l = running();
            l.metadata.creation_timestamp = Some("2026-11-24T09:00:00Z".into());
            l.metadata.labels.insert("team".into(), "a".into());
            l
        };
        assert!(matches!(IcState::of(&listed), IcState::Compact(_)));
        for want in [running(), ic("7", 0), {
            let mut p = running();
            p.status.conditions[0].status = "False".into();
            p.status.conditions[0].reason = "PodPending".into();
            p.status.conditions[0].message = "pod web-immortalpod is pending".into();
            p.status.pod_phase = Some("Pending".into());
            p
        }] {
            let state = IcState::of(&want);
            assert!(matches!(state, IcState::Compact(_)), "{state:?}");
            assert_eq!(state.to_object("ns", "web"), want);
        }
        // 120 bytes, with the Arc's counts 136: a 140-byte allocator class, a 144-byte slot.
        assert!(
            std::mem::size_of::<IcState>() <= 120,
            "{}",
            std::mem::size_of::<IcState>()
        );
    }

    #[test]
    fn whatever_the_compact_form_cannot_hold_keeps_the_typed_copy_exactly() {
        let mut odd = Vec::new();
        let mut a = running();
        a.metadata.uid = "ic-uid".into(); // not a UUID
        odd.push(a);
        let mut b = running();
        b.metadata.resource_version = "abc".into(); // not a number
        odd.push(b);
        let mut c = running();
        c.status.conditions[0].message = "the API server refused pod web-immortalpod: ...".into();
        c.status.conditions[0].reason = "PodCreateFailed".into();
        odd.push(c);
        let mut d = running();
        d.status.conditions[0].last_transition_time = "2026-11-24T10:00:00.5Z".into();
        odd.push(d);
        let mut f = running();
        f.metadata.deletion_timestamp = Some("2026-11-24T10:00:00Z".into());
        odd.push(f);
        let mut g = running();
        g.status.current_pod = Some("someone-elses".into());
        odd.push(g);
        for want in odd {
            let state = IcState::of(&want);
            assert!(matches!(state, IcState::Full(_)), "{want:?}");
            assert_eq!(state.to_object("ns", "web"), want);
        }
    }

    #[test]
    fn uids_round_trip_and_other_forms_are_refused() {
        assert_eq!(format_uuid(&parse_uuid(UID).unwrap()), UID);
        assert_eq!(parse_uuid("ic-uid"), None);
        assert_eq!(parse_uuid(&UID.to_uppercase()), None);
    }

    #[test]
    fn objects_not_ready_for_one_reason_stay_compact_and_share_its_message() {
        let not_ready = || {
            let mut ic = running();
            ic.status.conditions[0].status = "False".into();
            ic.status.conditions[0].reason = "PodNotReady".into();
            ic.status.conditions[0].message = "containers with unready status: [acontainer]".into();
            ic
        };
        let (a, b) = (IcState::of(&not_ready()), IcState::of(&not_ready()));
        assert_eq!(a.to_object("ns", "web"), not_ready());
        match (a, b) {
            (IcState::Compact(a), IcState::Compact(b)) => {
                let (Some(ra), Some(rb)) = (&a.ready, &b.ready) else {
                    panic!("no Ready condition")
                };
                match (&ra.message, &rb.message) {
                    (Message::Text(x, _), Message::Text(y, _)) => {
                        assert!(Arc::ptr_eq(x, y))
                    }
                    other => panic!("{other:?}"),
                }
            }
            other => panic!("{other:?}"),
        }
        // Objects whose pods are not ready for one reason share the words, each message
        // naming its own pod (the kubelet's words, the same for every pod).
        let naming = |name: &str| {
            let mut ic = not_ready();
            ic.metadata.name = name.into();
            ic.status.current_pod = Some(format!("{name}-immortalpod"));
            ic.status.conditions[0].message =
                format!("pod {name}-immortalpod is running but not ready (ContainersNotReady)");
            ic
        };
        let (web, api) = (IcState::of(&naming("web")), IcState::of(&naming("api")));
        assert_eq!(web.to_object("ns", "web"), naming("web"));
        assert_eq!(api.to_object("ns", "api"), naming("api"));
        match (web, api) {
            (IcState::Compact(w), IcState::Compact(a)) => {
                match (
                    &w.ready.as_ref().unwrap().message,
                    &a.ready.as_ref().unwrap().message,
                ) {
                    (Message::Text(x, _), Message::Text(y, _)) => assert!(Arc::ptr_eq(x, y)),
                    other => panic!("{other:?}"),
                }
            }
            other => panic!("{other:?}"),
        }
        // A message that only looks derived (another image) is held as itself, exactly.
        let mut e = running();
        e.status.conditions[0].message = "pod web-immortalpod runs mirror.example/pause:3.9".into();
        assert_eq!(IcState::of(&e).to_object("ns", "web"), e);
    }

    #[test]
    fn objects_running_one_image_share_it() {
        let a = IcState::of(&running());
        let b = IcState::of(&running());
        match (a, b) {
            (IcState::Compact(a), IcState::Compact(b)) => assert!(Arc::ptr_eq(&a.spec, &b.spec)),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn objects_with_one_template_share_it_and_read_it_back_whole() {
        let templated = || {
            let mut ic = running();
            // Decoded, as a watch event is: every decode of the same text gives one copy.
            ic.spec.template = serde_json::from_str(
                r#"{"metadata":{"labels":{"team":"a"}},"spec":{"containers":[{"name":"acontainer","env":[{"name":"A","value":"1"}]}]}}"#,
            )
            .unwrap();
            ic
        };
        let (a, b) = (IcState::of(&templated()), IcState::of(&templated()));
        assert_eq!(a.to_object("ns", "web"), templated());
        match (&a, &b) {
            (IcState::Compact(a), IcState::Compact(b)) => assert!(Arc::ptr_eq(&a.spec, &b.spec)),
            other => panic!("{other:?}"),
        }
        let (ta, tb) = (
            a.to_object("ns", "web").spec.template.unwrap(),
            b.to_object("ns", "web").spec.template.unwrap(),
        );
        assert!(
            ta.shares(&tb),
            "read back as the one shared copy, not a copy per read"
        );
    }

    #[test]
    fn versions_compare_as_numbers_and_otherwise_the_last_copy_wins() {
        // Opaque ones: nothing is known, so nothing may hold back the copy that came last.
        let at = |rv: &str| IcState::of(&ic(rv, 0));
        assert!(at("10").replaces(&at("9")));
        assert!(!at("9").replaces(&at("10")));
        assert!(!at("10").replaces(&at("10")));
        assert!(at("abc").replaces(&at("9")));
        assert!(at("9").replaces(&at("abc")));
        assert!(at("abd").replaces(&at("abc")));
        assert!(!at("abc").replaces(&at("abc")));
    }

    #[test]
    fn another_object_of_the_name_replaces_the_held_one_only_if_it_is_later() {
        let other = |rv: &str| {
            let mut recreated = ic(rv, 0);
            recreated.metadata.uid = "7d2f9b1c-0e4a-4b8c-9d3e-1f2a3b4c5d6e".into();
            IcState::of(&recreated)
        };
        // Deleted and made again: the new object's copy replaces the old one's...
        assert!(other("5678").replaces(&IcState::of(&ic("1234", 3))));
        // ...and a late event of the old object, from before the new one was made, does not
        // step the store back to it.
        assert!(!IcState::of(&ic("1234", 3)).replaces(&other("5678")));
        // Opaque versions: the copy that came last, if it is another object or version.
        assert!(other("x-1").replaces(&IcState::of(&ic("x-9", 3))));
        assert!(IcState::of(&ic("x-9", 3)).replaces(&other("x-9")));
    }

    #[test]
    fn our_answer_replaces_the_copy_whatever_its_version() {
        let store = IcStore::new();
        store
            .write()
            .insert("ns/a".into(), Arc::new(IcState::of(&ic("10", 0))));
        saw(&store, "ns/a", &ic("12", 1));
        let read = |s: &IcStore| s.get("ns/a").unwrap().to_object("ns", "web");
        assert_eq!(read(&store).status.start_times, Some(1));
        // An answer is the server's word whatever its version: after etcd is restored from a
        // snapshot every version is lower than those before (fixtures kube-1.28-kubelet/53-56),
        // and a copy the answer replaces by mistake costs a 409 and a read at worst.
        store
            .write()
            .insert("ns/a".into(), Arc::new(IcState::of(&ic("275", 4))));
        saw(&store, "ns/a", &ic("220", 1));
        assert_eq!(read(&store).metadata.resource_version, "220");
        assert_eq!(read(&store).status.start_times, Some(1));
        // And nothing brings a deleted object back.
        store.write().remove("ns/a");
        saw(&store, "ns/a", &ic("20", 3));
        assert!(store.get("ns/a").is_none());
    }

    #[test]
    fn an_answer_that_the_object_is_gone_takes_its_copy_out() {
        let store = IcStore::new();
        store
            .write()
            .insert("ns/a".into(), Arc::new(IcState::of(&ic("10", 0))));
        gone(&store, "ns/a");
        assert!(store.get("ns/a").is_none());
        // So the next reconcile asks the API server; the watcher makes the entry again.
        gone(&store, "ns/a");
        assert!(store.is_empty());
    }
}
