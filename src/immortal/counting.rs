//! Counting every pod started exactly once, and what the installed CRD lets us keep of it.
//!
//! **Invariant.** Every pod the API server accepted for the object is counted in
//! `status.startTimes` (S), or still exists and carries the finalizer [`COUNT_FINALIZER`] (F),
//! which comes off only once S counts the pod. `status.lastCountedPodUID` (L) names the pod
//! counted last; S and L are written together, in one patch carrying the resourceVersion they
//! were computed from. A start is given up only when no object can count it any more, or when
//! status writes are refused for [`HOLD_AT_MOST`] while the pod is being deleted (a
//! `StartsNotCounted` Event). Why each step keeps it: docs/design.md, "Counting".

use crate::immortal::types::COUNT_FINALIZER;
use crate::util::lock;
use serde_json::{json, Value};
use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Longest a pod being deleted is held for its count while status cannot be written: about as
/// long as a person who runs `kubectl delete pod` waits before wondering.
pub const HOLD_AT_MOST: Duration = Duration::from_secs(60);

/// Longest a pod holding our finalizer waits between two tries at counting it while status
/// cannot be written, whatever the key's back-off: it is released soon after writes come back.
pub const RECOUNT_AT_MOST: Duration = Duration::from_secs(30);

/// Longest a pod this process made holds our finalizer when nothing goes wrong, whatever the
/// backlog (an operator stopped meanwhile leaves it held until it or its standby relists).
pub const RELEASE_WITHIN: Duration = Duration::from_secs(10);

/// How often the CRD is read again while it prunes something we write.
pub const RECHECK: Duration = Duration::from_secs(10);

/// The status fields the operator writes that an older CRD may not know.
pub const NEWER_FIELDS: [&str; 3] = ["lastCountedPodUID", "observedGeneration", "podPhase"];

/// What the installed CRD keeps of the status we write; shared by the reconcile workers.
#[derive(Default)]
pub struct Counting {
    /// Status fields the API server prunes (found at start, or when a write did not stick).
    pruned: Mutex<BTreeSet<&'static str>>,
    /// L does not stick: counting has stopped.
    suspended: AtomicBool,
    /// Counting stopped and resumed in this process: statuses without L are adopted.
    resumed: AtomicBool,
    /// Pods (uid) being deleted that wait on a count not written, since when.
    holding: Mutex<HashMap<String, Instant>>,
}

impl Counting {
    /// The pod `uid`, being deleted, waits on a count not written (since `now`, if not noted yet).
    pub fn note_held(&self, uid: &str, now: Instant) {
        let mut holding = lock(&self.holding);
        if holding.len() >= 1024 {
            // Pods that went some other way: long past any hold.
            holding.retain(|_, since| now.saturating_duration_since(*since) < HOLD_AT_MOST * 10);
        }
        holding.entry(uid.to_string()).or_insert(now);
    }

    /// How long the pod `uid` has waited on its count since it was noted held (zero: never).
    pub fn held_for(&self, uid: &str, now: Instant) -> Duration {
        let holding = lock(&self.holding);
        holding.get(uid).map_or(Duration::ZERO, |since| {
            now.saturating_duration_since(*since)
        })
    }

    /// The pod `uid` was released: it waits on nothing any more.
    pub fn note_released(&self, uid: &str) {
        lock(&self.holding).remove(uid);
    }

    /// Whether starts are counted (L sticks).
    pub fn active(&self) -> bool {
        !self.suspended.load(Ordering::Relaxed)
    }

    pub fn resumed(&self) -> bool {
        self.resumed.load(Ordering::Relaxed)
    }

    /// Whether any field we write is pruned (so the CRD is worth reading again).
    pub fn any_pruned(&self) -> bool {
        !lock(&self.pruned).is_empty()
    }

    /// What the installed CRD's schema lacks, read again ([`Counting::missing_in_crd`]): fields
    /// it keeps now are written again, and counting resumes once L is kept (returns whether).
    pub fn relearn(&self, missing: &[&'static str]) -> bool {
        lock(&self.pruned).retain(|&f| {
            let kept_now = !missing.contains(&f);
            if kept_now && f != "lastCountedPodUID" {
                log::info!(target: "reconcile", field = f; "the installed ImmortalContainer CRD keeps status.{f} now: it is written again");
            }
            !kept_now
        });
        self.learn_pruned(missing, "the installed CRD's schema lacks it");
        let resume = !missing.contains(&"lastCountedPodUID")
            && self.suspended.swap(false, Ordering::Relaxed);
        if resume {
            self.resumed.store(true, Ordering::Relaxed);
            log::info!(
                target: "reconcile",
                field = "lastCountedPodUID";
                "the installed ImmortalContainer CRD keeps status.lastCountedPodUID now: status.startTimes is counted again; \
                 every object is reconciled, and a pod that started while counting was off is not counted"
            );
        }
        resume
    }

    pub fn prunes(&self, field: &str) -> bool {
        lock(&self.pruned).contains(field)
    }

    /// Records that the API server prunes `fields` (the CRD is older than the operator); returns
    /// those not known before, each of which is said once (ERROR when it stops the counting).
    pub fn learn_pruned(&self, fields: &[&'static str], how: &str) -> Vec<&'static str> {
        let new: Vec<&'static str> = fields
            .iter()
            .copied()
            .filter(|f| lock(&self.pruned).insert(f))
            .collect();
        for f in &new {
            if *f == "lastCountedPodUID" {
                self.suspended.store(true, Ordering::Relaxed);
                log::error!(
                    target: "reconcile",
                    field = *f;
                    "the installed ImmortalContainer CRD is older than this operator: it prunes status.{f} ({how}); \
                     without it starts cannot be counted exactly once, so status.startTimes is no longer counted. \
                     Apply the CRD of this version: kubectl apply -k config/crd (make install); counting resumes by itself \
                     once it is installed (the CRD is read again every {})",
                    crate::util::human_duration(RECHECK)
                );
            } else {
                log::warn!(
                    target: "reconcile",
                    field = *f;
                    "the installed ImmortalContainer CRD is older than this operator: it prunes status.{f} ({how}), \
                     which is no longer written. Apply the CRD of this version: kubectl apply -k config/crd (make install); \
                     it is written again once that is installed"
                );
            }
        }
        new
    }

    /// The fields of `sent` (a status we wrote) that the server's answer lacks: pruned.
    pub fn not_kept(sent: &Value, answered: &Value) -> Vec<&'static str> {
        NEWER_FIELDS
            .into_iter()
            .filter(|f| !sent[*f].is_null() && answered[*f].is_null())
            .collect()
    }

    /// The fields the CRD's schema of `version` lacks; `None` when the schema cannot tell (no
    /// such version, or status preserves unknown fields).
    pub fn missing_in_crd(crd: &Value, version: &str) -> Option<Vec<&'static str>> {
        let v = crd["spec"]["versions"]
            .as_array()?
            .iter()
            .find(|v| v["name"] == version)?;
        let status = &v["schema"]["openAPIV3Schema"]["properties"]["status"];
        if status["x-kubernetes-preserve-unknown-fields"] == true {
            return None;
        }
        let props = status["properties"].as_object();
        Some(
            NEWER_FIELDS
                .into_iter()
                .filter(|f| props.is_none_or(|p| !p.contains_key(*f)))
                .collect(),
        )
    }
}

/// Whether the pod's metadata carries our finalizer: the pod is held until we release it.
pub fn is_held(finalizers: &[String]) -> bool {
    finalizers.iter().any(|f| f == COUNT_FINALIZER)
}

/// The patch that releases a pod: our finalizer deleted from the list (others' untouched), and
/// the pod's uid, so that it is refused (422) on another pod of the name.
pub fn release_patch(uid: &str) -> Value {
    json!({"metadata": {
        "uid": uid,
        "$deleteFromPrimitiveList/finalizers": [COUNT_FINALIZER],
    }})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_field_the_server_did_not_keep_is_found_and_said_once() {
        let sent = json!({"startTimes": 2, "lastCountedPodUID": "u", "podPhase": "Running"});
        let answered = json!({"startTimes": 2, "podPhase": "Running"});
        let pruned = Counting::not_kept(&sent, &answered);
        assert_eq!(pruned, ["lastCountedPodUID"]);
        let c = Counting::default();
        assert!(c.active());
        assert_eq!(c.learn_pruned(&pruned, "test"), ["lastCountedPodUID"]);
        assert!(!c.active(), "counting stops without L");
        assert!(c.prunes("lastCountedPodUID"));
        assert!(c.learn_pruned(&pruned, "test").is_empty(), "said once");
    }

    #[test]
    fn counting_resumes_once_the_crd_keeps_the_last_counted_uid() {
        let c = Counting::default();
        c.learn_pruned(&NEWER_FIELDS, "test");
        assert!(!c.active() && c.any_pruned());
        // Upgraded part way: podPhase still pruned, L kept.
        assert!(c.relearn(&["podPhase"]));
        assert!(c.active() && c.resumed());
        assert!(!c.prunes("lastCountedPodUID") && !c.prunes("observedGeneration"));
        assert!(c.prunes("podPhase"));
        // Said once: reading the same schema again resumes nothing.
        assert!(!c.relearn(&["podPhase"]));
        assert!(!c.relearn(&[]));
        assert!(!c.any_pruned());
    }

    #[test]
    fn an_older_crd_is_recognised_from_its_schema() {
        let crd = |props: Value| {
            json!({"spec": {"versions": [{"name": "v1alpha1", "schema": {"openAPIV3Schema":
                {"properties": {"status": {"type": "object", "properties": props}}}}}]}})
        };
        let old = crd(json!({"currentPod": {}, "startTimes": {}, "conditions": {}}));
        assert_eq!(
            Counting::missing_in_crd(&old, "v1alpha1"),
            Some(NEWER_FIELDS.to_vec())
        );
        let ours: Value =
            serde_yaml::from_str(include_str!("../../config/crd/immortalcontainers.yaml")).unwrap();
        assert_eq!(Counting::missing_in_crd(&ours, "v1alpha1"), Some(vec![]));
        assert_eq!(Counting::missing_in_crd(&ours, "v2"), None);
    }

    #[test]
    fn the_release_patch_deletes_only_our_finalizer_of_this_very_pod() {
        let p = release_patch("u-1");
        assert_eq!(p["metadata"]["uid"], "u-1");
        assert_eq!(
            p["metadata"]["$deleteFromPrimitiveList/finalizers"],
            json!([COUNT_FINALIZER])
        );
        assert!(is_held(&[COUNT_FINALIZER.to_string()]));
        assert!(!is_held(&["other".to_string()]));
    }
}
