//! startTimes exact under every interleaving: exhaustive, deterministic fault injection.
//!
//! The real reconcile and the real pod-event policy (the watcher's filter and hints) run
//! against a model of the API server (pods with finalizers, graceful deletion as the pod
//! strategy decides it, resourceVersion preconditions, a kubelet that starts pods and finishes
//! deletions, garbage collection). A scenario (new object, pod deleted, pod failed, image
//! changed, foreign pod, object deleted) runs once without faults to learn its API calls; then,
//! for every call index k and every fault kind, it runs again with that fault at call k, and
//! for every such fault again with a second fault during the recovery from the first. Each run
//! settles (until nothing is queued, due or pending in the kubelet) and is checked: the
//! object's `startTimes` equals the number of pod creates the model accepted for it, exactly
//! one healthy pod of ours exists (none once the object is deleted), nothing of ours holds a
//! pod, and Ready matches the pod.
//!
//! Three faults reach what a restart with a fresh list cannot: a failover to a standby whose
//! copy of the object is older than the old leader's last writes, its watch of objects
//! lagging behind everything else; the same with the object made again before it, its new
//! pod uncounted and force-deleted; and the object deleted and made again under its name
//! while the operator's watches are cut, which it learns from the relist after its version
//! expired.
//!
//! Interleavings (when the kubelet acts, when watch events arrive) are drawn from a seeded
//! generator: `IMMORTAL_FAULT_SEED=N` replays another set; a failure prints the seed, the
//! faults and every call the run made.

use immortal_operator::immortal::desired;
use immortal_operator::immortal::ic_state::{self, IcState, IcStore};
use immortal_operator::immortal::lifecycle::{CachedPod, IcEventHandler, PodEventHandler, PodHint};
use immortal_operator::immortal::reconcile::{self, Api, Context};
use immortal_operator::immortal::types::{
    ImmortalContainer, ImmortalContainerSpec, ImmortalContainerStatus, ImmortalPod, COUNT_FINALIZER,
};
use immortal_operator::kube::client;
use immortal_operator::kube::events::Note;
use immortal_operator::kube::types::{
    Condition, ObjectMeta, Pod, PodCondition, PodStatus, Status, StatusDetails,
};
use immortal_operator::runtime::controller::{Failure, LogContext};
use immortal_operator::runtime::queue::Hint;
use immortal_operator::runtime::watcher::{EventHandler, Listed, Reaction};
use serde_json::Value;
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::fmt;
use std::panic::{self, AssertUnwindSafe};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const NS: &str = "ns";
const IC: &str = "web";
const KEY: &str = "ns/web";
const POD: &str = "web-immortalpod";
const IMAGE: &str = "nginx:1";
const IMAGE2: &str = "nginx:2";
/// Steps one run may take before it counts as not settling (a hot loop).
const MAX_STEPS: usize = 400;
/// How far after the first fault a second one is injected.
const SECOND_FAULT_WINDOW: usize = 6;

// ------------------------------------------------------------------------------------------
// Faults

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// The process dies before the call is sent; it restarts with empty memory.
    CrashBefore,
    /// The call is applied, the process dies before it reads the answer.
    CrashAfter,
    Conflict409,
    Internal500,
    Unavailable503,
    TooMany429,
    Forbidden403,
    Invalid422,
    /// The call is applied, its answer lost (a timeout), and the operator goes on.
    AnswerLost,
    /// Before the call, a person deletes the pod (gracefully).
    PodDeleted,
    /// Before the call, a person force-deletes the pod.
    PodForceDeleted,
    /// Before the call, the kubelet fails the pod.
    PodFailed,
    /// Before the call, a person deletes the object (the garbage collector then deletes its
    /// pods).
    ObjectDeleted,
    /// The call is applied (the old leader's last write), then the leader stops and a standby
    /// takes over: its copy of the object is the one its watch showed when the scenario
    /// began, and its watch of objects brings what happened since only once everything else
    /// has settled (a watch stalled until its idle limit). Its pod watch and queue are warm.
    Failover,
    /// Before the call, the operator's watches are cut; a person deletes the object and makes
    /// it again under the same name (the garbage collector then deletes the old one's pods);
    /// the watches resume from a version too old (410) and list again.
    Recreated,
    /// Before the call, a person deletes the object and makes it again under the same name
    /// while the watches run: the operator may still act on its copy of the old one, and a
    /// status write, which `/status` applies whatever uid it names (fixture
    /// kube-1.28-kubelet/21), could land on the new one.
    RecreatedLive,
    /// As `Failover`, but the standby's copy is the object as it was made, with no status
    /// at all (its watch saw only the create): a refused create must not write its count.
    FailoverBare,
    /// Before the call, a person deletes the object and makes it again under the same name;
    /// the leader makes the new object's pod, with our finalizer, and stops before counting
    /// it; the pod is force-deleted. A standby takes over as in `Failover`: its copy is the
    /// old object, so the pod is not its copy's, yet only the new object can count it.
    FailoverAfterRecreate,
}

const FAULTS: [Fault; 18] = [
    Fault::CrashBefore,
    Fault::CrashAfter,
    Fault::Conflict409,
    Fault::Internal500,
    Fault::Unavailable503,
    Fault::TooMany429,
    Fault::Forbidden403,
    Fault::Invalid422,
    Fault::AnswerLost,
    Fault::PodDeleted,
    Fault::PodForceDeleted,
    Fault::PodFailed,
    Fault::ObjectDeleted,
    Fault::Failover,
    Fault::Recreated,
    Fault::RecreatedLive,
    Fault::FailoverBare,
    Fault::FailoverAfterRecreate,
];

/// Faults to inject: call index → fault.
#[derive(Debug, Clone, Default)]
struct Plan(Vec<(usize, Fault)>);

impl Plan {
    fn at(&self, k: usize) -> Option<Fault> {
        self.0.iter().find(|(i, _)| *i == k).map(|(_, f)| *f)
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("no fault");
        }
        let parts: Vec<String> = self
            .0
            .iter()
            .map(|(k, x)| format!("{x:?} at call {k}"))
            .collect();
        f.write_str(&parts.join(", then "))
    }
}

/// A panic payload: the process "died" here.
struct Crash;

/// A panic payload: the leader stopped here, and a standby takes over (with a copy of the
/// object that has no status, when bare).
struct Failover {
    bare: bool,
}

// ------------------------------------------------------------------------------------------
// A small deterministic generator (xorshift64*), so a seed replays a run exactly.

struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

// ------------------------------------------------------------------------------------------
// The model: an API server with a kubelet and a garbage collector.

/// A pod in the model, with what the kubelet knows of it.
#[derive(Debug, Clone)]
struct ModelPod {
    pod: Pod,
    scheduled: bool,
    /// Deleted gracefully: the kubelet still has to stop it and remove it.
    stopping: bool,
}

#[derive(Default)]
struct World {
    rv: u64,
    uids: u64,
    ic: Option<ImmortalContainer>,
    /// The uid the object had, for the pods it owns after it is gone.
    ic_uid: String,
    pods: BTreeMap<String, ModelPod>,
    /// Pod creates the API server accepted for the object: the truth startTimes must equal.
    accepted: i64,
    /// Accepted after the object was deleted (a reconcile that read it just before): the
    /// garbage collector removes them, once nothing of ours holds them.
    accepted_orphans: i64,
    /// Pod watch events not yet delivered: (type, pod).
    pod_events: Vec<(&'static str, Pod)>,
    ic_events: Vec<(&'static str, ImmortalContainer)>,
    /// The object as a standby's watch showed it when the scenario began.
    standby: Option<ImmortalContainer>,
    /// The object as it was made, before any status.
    created: Option<ImmortalContainer>,
    /// The operator's watches are cut: they deliver nothing until they list again.
    watches_cut: bool,
}

fn api_err(code: u16, reason: &str) -> client::Error {
    client::Error::Api(Box::new(Status {
        code,
        reason: reason.into(),
        message: format!("injected {reason}"),
        details: (code == 429).then(|| StatusDetails {
            retry_after_seconds: Some(1),
            ..Default::default()
        }),
        ..Default::default()
    }))
}

/// A real server's answer to a PATCH naming a uid that is not the object's `kind` `name`: no
/// precondition (that is only a DELETE's 409) but an immutable field changed, 422 (fixture
/// kube-1.28-kubelet/18).
fn uid_changed(kind: &str, name: &str, sent: &str) -> client::Error {
    let cause = serde_json::json!({"reason": "FieldValueInvalid",
        "message": format!("Invalid value: {sent:?}: field is immutable"), "field": "metadata.uid"});
    let status = serde_json::json!({"kind": "Status", "status": "Failure", "reason": "Invalid",
        "code": 422, "message": format!("{kind} {name:?} is invalid: metadata.uid: {}", cause["message"]),
        "details": {"name": name, "kind": kind, "causes": [cause, cause]}});
    client::Error::Api(Box::new(serde_json::from_value(status).expect("a Status")))
}

impl World {
    fn next_rv(&mut self) -> String {
        self.rv += 1;
        self.rv.to_string()
    }

    fn new_uid(&mut self, what: &str) -> String {
        self.uids += 1;
        format!("{what}-{}", self.uids)
    }

    /// A person deletes the object: its watch says DELETED.
    fn delete_object(&mut self) {
        if let Some(ic) = self.ic.take() {
            self.ic_events.push(("DELETED", ic));
        }
    }

    /// A person deletes the object and makes it again (while the operator's watches are cut,
    /// if `cut`).
    fn recreate_object(&mut self, cut: bool) {
        if self.ic.is_none() {
            return;
        }
        self.watches_cut |= cut;
        self.delete_object();
        self.new_object();
        self.accepted = 0;
    }

    /// A person deletes the object and makes it again; the old object's pod goes (the garbage
    /// collector, the kubelet and the leader done with it), the leader makes the new one's,
    /// and it is force-deleted before its count.
    fn recreate_with_an_uncounted_pod(&mut self) {
        if self.ic.is_none() {
            return;
        }
        self.recreate_object(false);
        if let Some(old) = self.pods.remove(POD) {
            self.pod_events.push(("DELETED", old.pod));
        }
        let ic = self.ic.clone().unwrap();
        let mut pod = desired::desired_pod(&ic, true);
        pod.metadata.uid = self.new_uid("pod");
        pod.metadata.resource_version = self.next_rv();
        set_phase(&mut pod, "Pending", false);
        self.accepted += 1;
        self.pods.insert(
            POD.into(),
            ModelPod {
                pod,
                scheduled: false,
                stopping: false,
            },
        );
        self.emit("ADDED", POD);
        drop(self.delete(POD, None, Some(0)));
    }

    fn new_object(&mut self) {
        let uid = self.new_uid("ic");
        let rv = self.next_rv();
        let ic = ImmortalContainer {
            metadata: ObjectMeta {
                name: IC.into(),
                namespace: NS.into(),
                uid: uid.clone(),
                resource_version: rv,
                generation: Some(1),
                ..Default::default()
            },
            spec: ImmortalContainerSpec {
                image: IMAGE.into(),
                ..Default::default()
            },
            status: Default::default(),
        };
        self.ic_uid = uid;
        self.ic_events.push(("ADDED", ic.clone()));
        self.created = Some(ic.clone());
        self.ic = Some(ic);
    }

    fn emit(&mut self, event: &'static str, name: &str) {
        if let Some(p) = self.pods.get(name) {
            self.pod_events.push((event, p.pod.clone()));
        }
    }

    fn ours(&self, p: &Pod) -> bool {
        p.metadata
            .controller()
            .is_some_and(|o| o.uid == self.ic_uid)
    }

    /// The API server's pod strategy (`CheckGracefulDelete`) and the registry's delete.
    fn delete(
        &mut self,
        name: &str,
        uid: Option<&str>,
        grace: Option<i64>,
    ) -> Result<Pod, client::Error> {
        let Some(mp) = self.pods.get(name) else {
            return Err(api_err(404, "NotFound"));
        };
        if uid.is_some_and(|u| u != mp.pod.metadata.uid) {
            return Err(api_err(409, "Conflict"));
        }
        let terminal = matches!(mp.pod.phase(), "Succeeded" | "Failed");
        let mut grace = grace.unwrap_or(30);
        if !mp.scheduled || terminal {
            grace = 0;
        }
        let rv = self.next_rv();
        let mp = self.pods.get_mut(name).unwrap();
        let m = &mut mp.pod.metadata;
        let shorter = m.deletion_grace_period_seconds.is_none_or(|g| grace < g);
        if shorter {
            m.deletion_timestamp = Some("2026-01-01T00:00:00Z".into());
            m.deletion_grace_period_seconds = Some(grace);
        }
        m.resource_version = rv;
        mp.stopping = grace > 0;
        let left = mp.pod.clone();
        self.emit("MODIFIED", name);
        self.remove_if_done(name);
        Ok(left)
    }

    /// A pod deleted with grace 0 and no finalizer left is gone.
    fn remove_if_done(&mut self, name: &str) {
        let done = self.pods.get(name).is_some_and(|mp| {
            mp.pod.metadata.deletion_grace_period_seconds == Some(0)
                && mp.pod.metadata.finalizers.is_empty()
        });
        if done {
            self.emit("DELETED", name);
            self.pods.remove(name);
        }
    }

    /// Whether the kubelet (or the garbage collector) has something to do.
    fn busy(&self) -> bool {
        self.pods.values().any(|mp| {
            !mp.scheduled
                || mp.stopping
                || (mp.pod.metadata.deletion_timestamp.is_none()
                    && mp.pod.phase() != "Running"
                    && !terminal(&mp.pod))
        }) || self.orphans().is_some()
    }

    /// A pod the garbage collector deletes: controlled by an object that is gone.
    fn orphans(&self) -> Option<String> {
        self.pods
            .iter()
            .find(|(_, mp)| {
                mp.pod
                    .metadata
                    .controller()
                    .is_some_and(|o| self.ic.as_ref().is_none_or(|ic| ic.metadata.uid != o.uid))
                    && mp.pod.metadata.deletion_timestamp.is_none()
            })
            .map(|(n, _)| n.clone())
    }

    /// One step of the kubelet or the garbage collector.
    fn kubelet_step(&mut self) {
        if let Some(name) = self.orphans() {
            let _ = self.delete(&name, None, None);
            return;
        }
        let Some(name) = self
            .pods
            .iter()
            .find(|(_, mp)| {
                !mp.scheduled
                    || mp.stopping
                    || (mp.pod.metadata.deletion_timestamp.is_none()
                        && mp.pod.phase() != "Running"
                        && !terminal(&mp.pod))
            })
            .map(|(n, _)| n.clone())
        else {
            return;
        };
        let rv = self.next_rv();
        let mp = self.pods.get_mut(&name).unwrap();
        mp.pod.metadata.resource_version = rv;
        if mp.stopping {
            if !terminal(&mp.pod) {
                // The 1.27+ kubelet: the terminal phase first, then the removal with grace 0.
                set_phase(&mut mp.pod, "Succeeded", false);
            } else {
                mp.stopping = false;
                mp.pod.metadata.deletion_grace_period_seconds = Some(0);
            }
            self.emit("MODIFIED", &name);
            self.remove_if_done(&name);
        } else if !mp.scheduled {
            mp.scheduled = true;
            self.emit("MODIFIED", &name);
        } else {
            set_phase(&mut mp.pod, "Running", true);
            self.emit("MODIFIED", &name);
        }
    }

    /// A person or the kubelet ends our pod (the "between two calls" faults).
    fn end_pod(&mut self, how: Fault) {
        let Some((name, mp)) = self
            .pods
            .iter()
            .find(|(_, mp)| self.ours(&mp.pod))
            .map(|(n, mp)| (n.clone(), mp.clone()))
        else {
            return;
        };
        if mp.pod.metadata.deletion_timestamp.is_some() {
            return;
        }
        match how {
            Fault::PodDeleted => drop(self.delete(&name, None, None)),
            Fault::PodForceDeleted => drop(self.delete(&name, None, Some(0))),
            _ => {
                if terminal(&mp.pod) {
                    return;
                }
                let rv = self.next_rv();
                let mp = self.pods.get_mut(&name).unwrap();
                mp.pod.metadata.resource_version = rv;
                set_phase(&mut mp.pod, "Failed", false);
                self.emit("MODIFIED", &name);
            }
        }
    }
}

fn terminal(p: &Pod) -> bool {
    matches!(p.phase(), "Succeeded" | "Failed")
}

fn set_phase(p: &mut Pod, phase: &str, ready: bool) {
    p.status = Some(PodStatus {
        phase: Some(phase.into()),
        conditions: vec![PodCondition {
            type_: "Ready".into(),
            status: if ready { "True" } else { "False" }.into(),
            ..Default::default()
        }],
        ..Default::default()
    });
}

/// The API as the operator sees it: the model, with faults injected at given call indexes.
struct ModelApi {
    world: RefCell<World>,
    plan: Plan,
    calls: Cell<usize>,
    log: RefCell<Vec<String>>,
    /// What the operator knows of the object, as its watcher and its own status writes keep
    /// it (the controller's, renewed at each restart): reconcile reads it, stale or not.
    ics: RefCell<Arc<IcStore>>,
}

enum Effect {
    /// Answer with this error, without applying the call.
    Refuse(client::Error),
    /// Apply, then lose the answer.
    Lose,
    /// Apply, then die.
    DieAfter,
    /// Apply, then a standby takes over (bare: its copy has no status).
    FailOverAfter {
        bare: bool,
    },
    Apply,
}

impl ModelApi {
    /// Counts the call, applies what the plan says happens before it, and says what to do.
    fn call(&self, what: String) -> Effect {
        let k = self.calls.get();
        self.calls.set(k + 1);
        let fault = self.plan.at(k);
        self.log.borrow_mut().push(match fault {
            Some(f) => format!("{k}: {what}  <- {f:?}"),
            None => format!("{k}: {what}"),
        });
        match fault {
            None => Effect::Apply,
            Some(Fault::CrashBefore) => panic::panic_any(Crash),
            Some(Fault::CrashAfter) => Effect::DieAfter,
            Some(Fault::AnswerLost) => Effect::Lose,
            Some(Fault::Conflict409) => Effect::Refuse(api_err(409, "Conflict")),
            Some(Fault::Internal500) => Effect::Refuse(api_err(500, "InternalError")),
            Some(Fault::Unavailable503) => Effect::Refuse(api_err(503, "ServiceUnavailable")),
            Some(Fault::TooMany429) => Effect::Refuse(api_err(429, "TooManyRequests")),
            Some(Fault::Forbidden403) => Effect::Refuse(api_err(403, "Forbidden")),
            Some(Fault::Invalid422) => Effect::Refuse(api_err(422, "Invalid")),
            Some(Fault::ObjectDeleted) => {
                self.world.borrow_mut().delete_object();
                Effect::Apply
            }
            Some(Fault::Failover) => Effect::FailOverAfter { bare: false },
            Some(Fault::FailoverAfterRecreate) => {
                self.world.borrow_mut().recreate_with_an_uncounted_pod();
                panic::panic_any(Failover { bare: false })
            }
            Some(Fault::FailoverBare) => Effect::FailOverAfter { bare: true },
            Some(f @ (Fault::Recreated | Fault::RecreatedLive)) => {
                self.world
                    .borrow_mut()
                    .recreate_object(f == Fault::Recreated);
                Effect::Apply
            }
            Some(f @ (Fault::PodDeleted | Fault::PodForceDeleted | Fault::PodFailed)) => {
                self.world.borrow_mut().end_pod(f);
                Effect::Apply
            }
        }
    }

    /// Runs `apply` against the world as `effect` says.
    fn with<T>(
        &self,
        effect: Effect,
        apply: impl FnOnce(&mut World) -> Result<T, client::Error>,
    ) -> Result<T, client::Error> {
        match effect {
            Effect::Refuse(e) => Err(e),
            Effect::Apply => apply(&mut self.world.borrow_mut()),
            Effect::Lose => {
                let _ = apply(&mut self.world.borrow_mut());
                Err(client::Error::Transport(
                    "timed out reading the answer".into(),
                ))
            }
            Effect::DieAfter => {
                let _ = apply(&mut self.world.borrow_mut());
                panic::panic_any(Crash)
            }
            Effect::FailOverAfter { bare } => {
                let _ = apply(&mut self.world.borrow_mut());
                panic::panic_any(Failover { bare })
            }
        }
    }
}

impl ModelApi {
    /// What the operator's store learns from an answer about the object: a copy, or that it
    /// is gone.
    fn learn(&self, answer: &Result<ImmortalContainer, client::Error>) {
        match answer {
            Ok(ic) => ic_state::saw(&self.ics.borrow(), KEY, ic),
            Err(e) if e.is_not_found() => ic_state::gone(&self.ics.borrow(), KEY),
            Err(_) => {}
        }
    }
}

impl Api for ModelApi {
    /// As the operator's: from the store when it knows the object (no request), else asked.
    fn cached_immortal_container(
        &self,
        ns: &str,
        name: &str,
    ) -> Result<ImmortalContainer, client::Error> {
        if let Some(known) = self.ics.borrow().get(KEY) {
            return Ok(known.to_object(ns, name));
        }
        let e = self.call(format!("GET ic/{name}"));
        self.with(e, |w| w.ic.clone().ok_or_else(|| api_err(404, "NotFound")))
    }

    fn get_immortal_container(
        &self,
        _: &str,
        name: &str,
    ) -> Result<ImmortalContainer, client::Error> {
        let e = self.call(format!("GET ic/{name}"));
        let read = self.with(e, |w| w.ic.clone().ok_or_else(|| api_err(404, "NotFound")));
        // As the operator's: what the API server answered is known from then on.
        self.learn(&read);
        read
    }

    fn get_pod(&self, _: &str, name: &str) -> Result<Pod, client::Error> {
        let e = self.call(format!("GET pod/{name}"));
        self.with(e, |w| {
            w.pods
                .get(name)
                .map(|mp| mp.pod.clone())
                .ok_or_else(|| api_err(404, "NotFound"))
        })
    }

    fn create_pod(&self, _: &str, pod: &Pod) -> Result<client::CreatedPod, client::Error> {
        let e = self.call(format!("POST pod/{}", pod.metadata.name));
        self.with(e, |w| {
            if w.pods.contains_key(&pod.metadata.name) {
                return Err(api_err(409, "AlreadyExists"));
            }
            let mut p = pod.clone();
            p.metadata.uid = w.new_uid("pod");
            p.metadata.resource_version = w.next_rv();
            p.status = Some(PodStatus {
                phase: Some("Pending".into()),
                ..Default::default()
            });
            if w.ic.is_some() && w.ours(&p) {
                w.accepted += 1;
            } else if w.ours(&p) {
                w.accepted_orphans += 1;
            }
            w.pods.insert(
                p.metadata.name.clone(),
                ModelPod {
                    pod: p.clone(),
                    scheduled: false,
                    stopping: false,
                },
            );
            w.emit("ADDED", &p.metadata.name);
            let spec = serde_json::to_value(&p.spec).unwrap_or_default();
            Ok(client::CreatedPod { pod: p, spec })
        })
    }

    fn delete_pod(
        &self,
        _: &str,
        name: &str,
        uid: &str,
        grace: Option<u32>,
    ) -> Result<Pod, client::Error> {
        let e = self.call(format!("DELETE pod/{name} uid={uid}"));
        self.with(e, |w| w.delete(name, Some(uid), grace.map(i64::from)))
    }

    fn patch_pod(&self, _: &str, name: &str, patch: &Value) -> Result<Pod, client::Error> {
        let e = self.call(format!("PATCH pod/{name}"));
        self.with(e, |w| {
            let Some(mp) = w.pods.get(name) else {
                return Err(api_err(404, "NotFound"));
            };
            if patch["metadata"]["uid"] != mp.pod.metadata.uid.as_str() {
                let sent = patch["metadata"]["uid"].as_str().unwrap_or("");
                return Err(uid_changed("Pod", name, sent));
            }
            let rv = w.next_rv();
            let mp = w.pods.get_mut(name).unwrap();
            let m = &mut mp.pod.metadata;
            m.resource_version = rv;
            if let Some(labels) = patch["metadata"]["labels"].as_object() {
                for (k, v) in labels {
                    m.labels.insert(k.clone(), v.as_str().unwrap_or("").into());
                }
            }
            if let Some(gone) = patch["metadata"]["$deleteFromPrimitiveList/finalizers"].as_array()
            {
                m.finalizers.retain(|f| !gone.iter().any(|g| g == f));
            }
            let left = mp.pod.clone();
            w.emit("MODIFIED", name);
            w.remove_if_done(name);
            Ok(left)
        })
    }

    fn patch_status(
        &self,
        _: &str,
        name: &str,
        patch: &Value,
    ) -> Result<ImmortalContainer, client::Error> {
        let e = self.call(format!("PATCH ic/{name}/status"));
        let answered = self.with(e, |w| {
            let Some(ic) = w.ic.as_mut() else {
                return Err(api_err(404, "NotFound"));
            };
            if let Some(rv) = patch["metadata"]["resourceVersion"].as_str() {
                if rv != ic.metadata.resource_version {
                    return Err(api_err(409, "Conflict"));
                }
            }
            // A uid in the patch is not checked: `/status` copies the stored metadata over it
            // (fixture kube-1.28-kubelet/21), so only the version above holds a write back.
            let st = &patch["status"];
            let s = &mut ic.status;
            if let Some(v) = st.get("currentPod") {
                s.current_pod = v.as_str().map(String::from);
            }
            if let Some(v) = st.get("startTimes") {
                s.start_times = v.as_i64();
            }
            if let Some(v) = st.get("lastCountedPodUID") {
                s.last_counted_pod_uid = v.as_str().map(String::from);
            }
            if let Some(v) = st.get("observedGeneration") {
                s.observed_generation = v.as_i64();
            }
            if let Some(v) = st.get("podPhase") {
                s.pod_phase = v.as_str().map(String::from);
            }
            if let Some(v) = st.get("conditions") {
                s.conditions =
                    serde_json::from_value::<Vec<Condition>>(v.clone()).unwrap_or_default();
            }
            w.rv += 1;
            let ic = w.ic.as_mut().unwrap();
            ic.metadata.resource_version = w.rv.to_string();
            let ic = ic.clone();
            w.ic_events.push(("MODIFIED", ic.clone()));
            Ok(ic)
        });
        // As the operator's: the answer is known at once.
        self.learn(&answered);
        answered
    }

    fn record(&self, _: &ImmortalContainer, _: Note) {}
}

// ------------------------------------------------------------------------------------------
// The controller around reconcile: cached copies of the watches, a one-key queue with the real
// queue's "latest trigger wins", retries with client-go's per-key backoff, requeues, a virtual clock.

struct Controller {
    clock: Arc<Mutex<Instant>>,
    ctx: Context,
    /// What the ImmortalContainer watcher knows (shared with the model API's reads).
    ics: Arc<IcStore>,
    /// The key is queued, with the hint of the latest event that queued it.
    queued: Option<Option<PodHint>>,
    /// When a delayed requeue is due.
    timer: Option<Instant>,
    failures: u32,
    cached_pod: Option<CachedPod>,
    /// The watch of objects delivers nothing until everything else has settled (a standby's
    /// stale watch after a failover).
    ic_lagging: bool,
}

impl Controller {
    fn new(clock: Arc<Mutex<Instant>>) -> Controller {
        let c = clock.clone();
        Controller {
            clock,
            ctx: Context::with_clock(move || *c.lock().unwrap()),
            ics: Arc::new(IcStore::new()),
            queued: None,
            timer: None,
            failures: 0,
            cached_pod: None,
            ic_lagging: false,
        }
    }

    fn now(&self) -> Instant {
        *self.clock.lock().unwrap()
    }

    /// Queues the key with `hint`, merged as the real queue merges what it holds
    /// (`Trigger::then`): a key queued without one stays without one.
    fn queue(&mut self, hint: Option<PodHint>) {
        self.queued = Some(match (self.queued.take(), hint) {
            (None, hint) => hint,
            (Some(Some(first)), Some(later)) => first.and(&later),
            (Some(_), _) => None,
        });
    }

    /// Queues the key again with the hint its reconcile had, older than whatever was queued
    /// meanwhile (the real queue's `add_again`).
    fn queue_again(&mut self, hint: Option<PodHint>) {
        self.queued = Some(match (hint, self.queued.take()) {
            (hint, None) => hint,
            (Some(earlier), Some(Some(later))) => earlier.and(&later),
            (_, Some(_)) => None,
        });
    }

    fn after(&mut self, d: Duration) {
        let due = self.now() + d;
        self.timer = Some(self.timer.map_or(due, |t| t.min(due)));
    }

    /// Whether a watcher has something to deliver.
    fn deliverable(&self, w: &World) -> bool {
        !w.watches_cut
            && (!w.pod_events.is_empty() || (!self.ic_lagging && !w.ic_events.is_empty()))
    }

    /// The two watchers deliver what they have: the real policies decide what is queued.
    fn deliver(&mut self, w: &mut World) {
        if w.watches_cut {
            return;
        }
        for (event, pod) in std::mem::take(&mut w.pod_events) {
            if PodEventHandler.key_of(&pod).as_deref() != Some(KEY) {
                continue;
            }
            let mut cached = self.cached_pod;
            let verdict = PodEventHandler.on_event(event, &pod, &mut cached);
            self.cached_pod = cached;
            if let Reaction::Queue(h, _) = verdict {
                self.queue(h);
            }
        }
        if self.ic_lagging {
            return;
        }
        for (event, ic) in std::mem::take(&mut w.ic_events) {
            let (verdict, _) = self.ics.entry(KEY.into(), |cached| {
                IcEventHandler.on_event(event, &ic, cached)
            });
            if let Reaction::Queue(h, _) = verdict {
                self.queue(h);
            }
        }
    }

    /// A restart: memory gone, the watchers list again and queue every key they find.
    fn restart(&mut self, w: &mut World) {
        let clock = self.clock.clone();
        *self = Controller::new(clock);
        w.watches_cut = false;
        w.ic_events.clear();
        // The first list fills the new store.
        if let Some(ic) = &w.ic {
            self.ics.entry(KEY.into(), |cached| {
                *cached = Some(Arc::new(IcState::of(ic)))
            });
        }
        self.list_pods(w);
    }

    /// A failover: the standby's ctx, its copy of the object the one it had when the
    /// scenario began; its watch of objects has yet to bring the object as it is now.
    fn fail_over(&mut self, w: &mut World, bare: bool) {
        let clock = self.clock.clone();
        *self = Controller::new(clock);
        self.ic_lagging = true;
        w.watches_cut = false;
        w.ic_events.clear();
        let copy = if bare { &w.created } else { &w.standby };
        if let Some(ic) = copy {
            self.ics.entry(KEY.into(), |cached| {
                *cached = Some(Arc::new(IcState::of(ic)))
            });
        }
        match (&w.ic, copy) {
            (Some(ic), _) => w.ic_events.push(("MODIFIED", ic.clone())),
            (None, Some(old)) => w.ic_events.push(("DELETED", old.clone())),
            (None, None) => {}
        }
        self.list_pods(w);
    }

    /// The watches resume from a version too old (410) and list again: what the object list
    /// shows replaces what was known, by the real policy's rule.
    fn relist(&mut self, w: &mut World) {
        w.watches_cut = false;
        w.ic_events.clear();
        match &w.ic {
            Some(ic) => {
                let listed = IcEventHandler.cached(ic);
                // Served now: the model's version is the list's.
                let served = Listed {
                    version: Some(w.rv),
                    rewound: false,
                };
                self.ics.entry(KEY.into(), |cached| {
                    *cached = Some(match cached.take() {
                        Some(old) => IcEventHandler.relisted(old, listed, &served),
                        None => listed,
                    })
                });
            }
            None => {
                self.ics.entry(KEY.into(), |cached| *cached = None);
            }
        }
        self.list_pods(w);
        self.queue(None);
    }

    /// The pod watch lists: it remembers the pod it finds, and every key is queued.
    fn list_pods(&mut self, w: &mut World) {
        w.pod_events.clear();
        self.cached_pod = None;
        let pod = w.pods.get(POD).map(|mp| mp.pod.clone());
        if let Some(p) = &pod {
            if PodEventHandler.key_of(p).as_deref() == Some(KEY) {
                self.cached_pod = Some(PodEventHandler.cached(p));
            }
        }
        if w.ic.is_some() || pod.is_some() {
            self.queue(None);
        }
    }
}

/// Injected crashes unwind through reconcile by design: keep them out of the test output.
fn quiet_crashes() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            if !info.payload().is::<Crash>() && !info.payload().is::<Failover>() {
                default(info);
            }
        }));
    });
}

/// One run of a scenario under a plan; `Err` describes what went wrong.
fn run(scenario: Scenario, plan: &Plan, seed: u64) -> Result<usize, String> {
    quiet_crashes();
    let api = ModelApi {
        world: RefCell::new(World::default()),
        plan: plan.clone(),
        calls: Cell::new(0),
        log: RefCell::new(Vec::new()),
        ics: RefCell::new(Arc::new(IcStore::new())),
    };
    let clock = Arc::new(Mutex::new(Instant::now()));
    let mut ctl = Controller::new(clock.clone());
    let mut rng = Rng::new(seed);
    scenario.setup(&mut api.world.borrow_mut(), &mut ctl);
    let fail = |why: String, api: &ModelApi| -> String {
        format!(
            "{scenario:?} with {plan} (seed {seed}): {why}\ncalls:\n  {}",
            api.log.borrow().join("\n  ")
        )
    };

    let mut steps = 0;
    loop {
        steps += 1;
        if steps > MAX_STEPS {
            return Err(fail(format!("did not settle in {MAX_STEPS} steps"), &api));
        }
        // Watch events arrive with some lag; the kubelet acts at its own pace. Cut watches
        // list again after a while.
        if api.world.borrow().watches_cut && rng.chance(20) {
            ctl.relist(&mut api.world.borrow_mut());
        }
        if rng.chance(70) {
            ctl.deliver(&mut api.world.borrow_mut());
        }
        if api.world.borrow().busy() && (ctl.queued.is_none() || rng.chance(40)) {
            api.world.borrow_mut().kubelet_step();
            continue;
        }
        if let Some(hint) = ctl.queued.take() {
            let key = KEY.into();
            let trace = LogContext { id: "x", key: &key };
            let ctx = &ctl.ctx;
            let result = panic::catch_unwind(AssertUnwindSafe(|| {
                reconcile::reconcile(&api, ctx, &trace, hint.as_ref())
            }));
            match result {
                Ok(Ok(action)) => {
                    ctl.failures = 0;
                    match action.requeue_after() {
                        // As the queue's `cancel`: a look asked for before is moot.
                        None => ctl.timer = None,
                        // Queued again with its hint, behind what else waits (nothing, here).
                        Some(Duration::ZERO) => ctl.queue_again(hint.clone()),
                        Some(d) => ctl.after(d),
                    }
                }
                Ok(Err(e)) => {
                    // client-go's per-key backoff, at least the server's Retry-After.
                    let backoff = Duration::from_millis(5 << ctl.failures.min(16));
                    ctl.failures += 1;
                    ctl.after(backoff.max(e.retry_after().unwrap_or_default()));
                }
                Err(p) if p.is::<Crash>() => {
                    ctl.restart(&mut api.world.borrow_mut());
                    *api.ics.borrow_mut() = ctl.ics.clone();
                }
                Err(p) if p.is::<Failover>() => {
                    let bare = p.downcast_ref::<Failover>().is_some_and(|f| f.bare);
                    ctl.fail_over(&mut api.world.borrow_mut(), bare);
                    *api.ics.borrow_mut() = ctl.ics.clone();
                }
                Err(p) => panic::resume_unwind(p),
            }
            continue;
        }
        if ctl.deliverable(&api.world.borrow()) {
            ctl.deliver(&mut api.world.borrow_mut());
            continue;
        }
        if let Some(t) = ctl.timer.take() {
            let mut now = clock.lock().unwrap();
            *now = (*now).max(t);
            drop(now);
            ctl.queue(None);
            continue;
        }
        // Everything else has settled: a cut watch lists again, a lagging one catches up.
        if api.world.borrow().watches_cut {
            ctl.relist(&mut api.world.borrow_mut());
            continue;
        }
        if ctl.ic_lagging {
            ctl.ic_lagging = false;
            continue;
        }
        break;
    }
    let calls = api.calls.get();
    check(scenario, &api.world.borrow()).map_err(|why| fail(why, &api))?;
    Ok(calls)
}

/// What must hold once a run settled.
fn check(scenario: Scenario, w: &World) -> Result<(), String> {
    for mp in w.pods.values() {
        if mp
            .pod
            .metadata
            .finalizers
            .iter()
            .any(|f| f == COUNT_FINALIZER)
        {
            return Err(format!(
                "pod {} still holds our finalizer",
                mp.pod.metadata.uid
            ));
        }
    }
    if let Some(name) = w.orphans() {
        return Err(format!("pod {name} of a deleted object outlived it"));
    }
    let Some(ic) = &w.ic else {
        return match w.pods.values().find(|mp| w.ours(&mp.pod)) {
            Some(mp) => Err(format!("pod {} outlived its object", mp.pod.metadata.uid)),
            None => Ok(()),
        };
    };
    let st = &ic.status;
    if st.start_times.unwrap_or(0) != w.accepted {
        return Err(format!(
            "startTimes {:?}, but the API server accepted {} pods",
            st.start_times, w.accepted
        ));
    }
    let ready = st.conditions.iter().find(|c| c.type_ == "Ready");
    let reason = ready.map(|c| c.reason.as_str()).unwrap_or("");
    let ours: Vec<&ModelPod> = w.pods.values().filter(|mp| w.ours(&mp.pod)).collect();
    if scenario == Scenario::ForeignPod && w.pods.values().any(|mp| !w.ours(&mp.pod)) {
        return Ok(());
    }
    let [mp] = ours.as_slice() else {
        // A 422 on the create: the server refuses the pod until the spec changes.
        if ours.is_empty() && reason == "PodCreateFailed" {
            return Ok(());
        }
        return Err(format!(
            "{} pods of ours (Ready {reason}): {:?}",
            ours.len(),
            w.pods.keys()
        ));
    };
    let p = &mp.pod;
    if p.metadata.deletion_timestamp.is_some() || terminal(p) {
        return Err(format!(
            "pod {} is ending, no replacement (Ready {reason})",
            p.metadata.uid
        ));
    }
    if p.container_image() != Some(ic.spec.image.as_str()) {
        return Err(format!(
            "pod runs {:?}, spec.image is {}",
            p.container_image(),
            ic.spec.image
        ));
    }
    if st.last_counted_pod_uid.as_deref() != Some(p.metadata.uid.as_str()) {
        return Err(format!(
            "lastCountedPodUID {:?}, pod {}",
            st.last_counted_pod_uid, p.metadata.uid
        ));
    }
    if ready.map(|c| c.status.as_str()) != Some("True") || reason != "PodRunning" {
        return Err(format!("Ready {ready:?} for a running pod"));
    }
    Ok(())
}

// ------------------------------------------------------------------------------------------
// Scenarios

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scenario {
    NewObject,
    PodDeleted,
    PodFailed,
    ImageChanged,
    ForeignPod,
    ObjectDeleted,
}

const SCENARIOS: [Scenario; 6] = [
    Scenario::NewObject,
    Scenario::PodDeleted,
    Scenario::PodFailed,
    Scenario::ImageChanged,
    Scenario::ForeignPod,
    Scenario::ObjectDeleted,
];

impl Scenario {
    fn setup(self, w: &mut World, ctl: &mut Controller) {
        w.new_object();
        w.standby = w.ic.clone();
        if self == Scenario::ForeignPod {
            // Someone else's pod holds the name; it goes away later (its owner deletes it).
            w.pods.insert(
                POD.into(),
                ModelPod {
                    pod: Pod {
                        metadata: ObjectMeta {
                            name: POD.into(),
                            namespace: NS.into(),
                            uid: "foreign".into(),
                            ..Default::default()
                        },
                        ..Default::default()
                    },
                    scheduled: true,
                    stopping: true,
                },
            );
            return;
        }
        if self == Scenario::NewObject {
            return;
        }
        // Converged: one running pod, counted.
        let ic = w.ic.clone().unwrap();
        let mut pod = desired::desired_pod(&ic, false);
        pod.metadata.uid = w.new_uid("pod");
        pod.metadata.resource_version = w.next_rv();
        set_phase(&mut pod, "Running", true);
        w.accepted = 1;
        let rv = w.next_rv();
        let ic = w.ic.as_mut().unwrap();
        ic.metadata.resource_version = rv;
        ic.status = ImmortalContainerStatus {
            current_pod: Some(POD.into()),
            start_times: Some(1),
            last_counted_pod_uid: Some(pod.metadata.uid.clone()),
            observed_generation: Some(1),
            pod_phase: Some("Running".into()),
            conditions: vec![Condition {
                type_: "Ready".into(),
                status: "True".into(),
                observed_generation: Some(1),
                last_transition_time: "2026-01-01T00:00:00Z".into(),
                reason: "PodRunning".into(),
                message: format!("pod {POD} runs {IMAGE}"),
            }],
        };
        ctl.cached_pod = Some(PodEventHandler.cached(&pod));
        w.standby = Some(ic.clone());
        // The watcher knows the converged object.
        ctl.ics.entry(KEY.into(), |cached| {
            *cached = Some(Arc::new(IcState::of(ic)))
        });
        w.pods.insert(
            POD.into(),
            ModelPod {
                pod,
                scheduled: true,
                stopping: false,
            },
        );
        w.ic_events.clear();
        match self {
            Scenario::PodDeleted => w.end_pod(Fault::PodDeleted),
            Scenario::PodFailed => w.end_pod(Fault::PodFailed),
            Scenario::ImageChanged => {
                let rv = w.next_rv();
                let ic = w.ic.as_mut().unwrap();
                ic.spec.image = IMAGE2.into();
                ic.metadata.generation = Some(2);
                ic.metadata.resource_version = rv;
                let ic = ic.clone();
                w.ic_events.push(("MODIFIED", ic));
            }
            Scenario::ObjectDeleted => w.delete_object(),
            _ => {}
        }
    }
}

fn base_seed() -> u64 {
    std::env::var("IMMORTAL_FAULT_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20261123)
}

fn seed_of(base: u64, scenario: Scenario, plan: &Plan) -> u64 {
    let mut h = base ^ (scenario as u64 + 1).wrapping_mul(0x100_0000_01B3);
    for (k, f) in &plan.0 {
        h = (h ^ (*k as u64 * 31 + *f as u64 + 7)).wrapping_mul(0x100_0000_01B3);
    }
    h
}

#[test]
fn every_scenario_settles_exactly_without_faults() {
    for s in SCENARIOS {
        let calls = run(s, &Plan::default(), base_seed()).unwrap_or_else(|e| panic!("{e}"));
        assert!(calls > 0, "{s:?} made no call");
    }
}

#[test]
fn one_fault_at_every_call_of_every_scenario_counts_exactly() {
    let base = base_seed();
    let mut runs = 0;
    let mut failures = Vec::new();
    for s in SCENARIOS {
        let calls = run(s, &Plan::default(), base).unwrap_or_else(|e| panic!("{e}"));
        for k in 0..calls + 2 {
            for f in FAULTS {
                let plan = Plan(vec![(k, f)]);
                runs += 1;
                if let Err(e) = run(s, &plan, seed_of(base, s, &plan)) {
                    failures.push(e);
                }
            }
        }
    }
    eprintln!("{runs} runs with one fault");
    assert!(
        failures.is_empty(),
        "{} of {runs} runs failed; the first:\n{}",
        failures.len(),
        failures[0]
    );
}

/// Every fault at every call k1, then every fault again at each of the next calls: the
/// recovery from the first is hit by the second.
fn two_faults(s: Scenario) {
    let base = base_seed();
    let mut runs = 0;
    let mut failures = Vec::new();
    let calls = run(s, &Plan::default(), base).unwrap_or_else(|e| panic!("{e}"));
    for k1 in 0..calls + 1 {
        for f1 in FAULTS {
            for k2 in k1 + 1..=k1 + SECOND_FAULT_WINDOW {
                for f2 in FAULTS {
                    let plan = Plan(vec![(k1, f1), (k2, f2)]);
                    runs += 1;
                    if let Err(e) = run(s, &plan, seed_of(base, s, &plan)) {
                        failures.push(e);
                    }
                }
            }
        }
    }
    eprintln!("{s:?}: {runs} runs with two faults");
    assert!(
        failures.is_empty(),
        "{} of {runs} runs failed; the first:\n{}",
        failures.len(),
        failures[0]
    );
}

#[test]
fn two_faults_new_object() {
    two_faults(Scenario::NewObject);
}

#[test]
fn two_faults_pod_deleted() {
    two_faults(Scenario::PodDeleted);
}

#[test]
fn two_faults_pod_failed() {
    two_faults(Scenario::PodFailed);
}

#[test]
fn two_faults_image_changed() {
    two_faults(Scenario::ImageChanged);
}

#[test]
fn two_faults_foreign_pod() {
    two_faults(Scenario::ForeignPod);
}

#[test]
fn two_faults_object_deleted() {
    two_faults(Scenario::ObjectDeleted);
}
