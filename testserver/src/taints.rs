//! Node taints and pod tolerations, as the scheduler's TaintToleration filter and the taint
//! manager read them (`Toleration.ToleratesTaint`, `v1helper.GetMatchingTolerations`), and the
//! taints the node lifecycle controller and its users write.

use serde_json::{json, Value};
use std::time::Duration;

/// Ready is Unknown: the node's kubelet stopped posting status.
pub const UNREACHABLE: &str = "node.kubernetes.io/unreachable";
/// Ready is False.
pub const NOT_READY: &str = "node.kubernetes.io/not-ready";
/// The node is cordoned (`spec.unschedulable`).
pub const UNSCHEDULABLE: &str = "node.kubernetes.io/unschedulable";
/// Set by a person once the node is known to be shut down (NodeOutOfServiceVolumeDetach, GA
/// in 1.28): PodGC then removes its terminating pods.
pub const OUT_OF_SERVICE: &str = "node.kubernetes.io/out-of-service";

pub const NO_SCHEDULE: &str = "NoSchedule";
pub const NO_EXECUTE: &str = "NoExecute";

/// A taint with no value, as the node controllers write them (`timeAdded` only on NoExecute
/// ones, as `AddOrUpdateTaintOnNode` callers set it).
pub fn taint(key: &str, effect: &str, time_added: Option<&str>) -> Value {
    let mut t = json!({"key": key, "effect": effect});
    if let Some(at) = time_added {
        t["timeAdded"] = json!(at);
    }
    t
}

/// The node's taints, in order.
pub fn of_node(node: &Value) -> Vec<Value> {
    node["spec"]["taints"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn field<'a>(v: &'a Value, k: &str) -> &'a str {
    v[k].as_str().unwrap_or("")
}

/// Whether `taint` has `key` and `effect`.
pub fn is(taint: &Value, key: &str, effect: &str) -> bool {
    field(taint, "key") == key && field(taint, "effect") == effect
}

/// `Toleration.ToleratesTaint`: the effect matches (or the toleration names none), the key
/// matches (or the toleration names none, with `Exists`), and the value matches under `Equal`
/// (the default operator) or any value under `Exists`.
pub fn tolerates(toleration: &Value, taint: &Value) -> bool {
    let effect = field(toleration, "effect");
    if !effect.is_empty() && effect != field(taint, "effect") {
        return false;
    }
    let key = field(toleration, "key");
    if !key.is_empty() && key != field(taint, "key") {
        return false;
    }
    match field(toleration, "operator") {
        "" | "Equal" => field(toleration, "value") == field(taint, "value"),
        "Exists" => true,
        _ => false,
    }
}

/// The pod's tolerations.
fn tolerations(pod: &Value) -> &[Value] {
    pod["spec"]["tolerations"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

/// Whether some toleration of `pod` tolerates `taint`.
pub fn tolerated(pod: &Value, taint: &Value) -> bool {
    tolerations(pod).iter().any(|t| tolerates(t, taint))
}

/// How long the pod may stay on a node with these NoExecute `taints`, as the taint manager
/// decides it (`GetMatchingTolerations`, then `getMinTolerationTime`): `Some(ZERO)` when a
/// taint is not tolerated, or a matching toleration's `tolerationSeconds` is 0 or less;
/// otherwise the shortest `tolerationSeconds` of the tolerations used (the first toleration
/// that tolerates each taint); `None` when they all tolerate it for ever.
pub fn toleration_time(pod: &Value, taints: &[Value]) -> Option<Duration> {
    let mut used = Vec::new();
    for taint in taints {
        match tolerations(pod).iter().find(|t| tolerates(t, taint)) {
            Some(t) => used.push(t),
            None => return Some(Duration::ZERO),
        }
    }
    if used.is_empty() {
        return Some(Duration::ZERO);
    }
    let mut min: Option<i64> = None;
    for t in used {
        if let Some(secs) = t["tolerationSeconds"].as_i64() {
            if secs <= 0 {
                return Some(Duration::ZERO);
            }
            min = Some(min.map_or(secs, |m| m.min(secs)));
        }
    }
    min.map(|s| Duration::from_secs(s as u64))
}

/// The first taint the scheduler's filters reject the pod for: NoSchedule and NoExecute
/// taints count, in the node's order (`FindMatchingUntoleratedTaint`).
pub fn first_untolerated<'a>(pod: &Value, taints: &'a [Value]) -> Option<&'a Value> {
    taints
        .iter()
        .find(|t| matches!(field(t, "effect"), NO_SCHEDULE | NO_EXECUTE) && !tolerated(pod, t))
}

/// `{KEY: VALUE}`, as the scheduler names a taint in its messages.
pub fn describe(taint: &Value) -> String {
    format!("{{{}: {}}}", field(taint, "key"), field(taint, "value"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tolerations DefaultTolerationSeconds gives every pod.
    fn default_pod() -> Value {
        json!({"spec": {"tolerations": [
            {"key": NOT_READY, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
            {"key": UNREACHABLE, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}]}})
    }

    #[test]
    fn tolerations_match_by_effect_key_operator_and_value() {
        let oos = json!({"key": OUT_OF_SERVICE, "value": "nodeshutdown", "effect": "NoExecute"});
        let t = |v: Value| tolerates(&v, &oos);
        assert!(t(json!({"operator": "Exists"})), "tolerates everything");
        assert!(t(json!({"key": OUT_OF_SERVICE, "operator": "Exists"})));
        assert!(t(json!({"key": OUT_OF_SERVICE, "value": "nodeshutdown"})));
        assert!(!t(json!({"key": OUT_OF_SERVICE, "value": "other"})));
        assert!(!t(
            json!({"key": OUT_OF_SERVICE, "operator": "Exists", "effect": "NoSchedule"})
        ));
        assert!(!t(json!({"key": UNREACHABLE, "operator": "Exists"})));
    }

    #[test]
    fn the_default_tolerations_give_300_seconds_on_an_unreachable_node_and_none_out_of_service() {
        let unreachable = [taint(UNREACHABLE, NO_EXECUTE, Some("t"))];
        assert_eq!(
            toleration_time(&default_pod(), &unreachable),
            Some(Duration::from_secs(300))
        );
        let both = [
            taint(UNREACHABLE, NO_EXECUTE, Some("t")),
            json!({"key": OUT_OF_SERVICE, "value": "nodeshutdown", "effect": "NoExecute"}),
        ];
        assert_eq!(toleration_time(&default_pod(), &both), Some(Duration::ZERO));
        let forever = json!({"spec": {"tolerations": [{"operator": "Exists"}]}});
        assert_eq!(toleration_time(&forever, &both), None);
        let zero = json!({"spec": {"tolerations": [
            {"key": UNREACHABLE, "operator": "Exists", "tolerationSeconds": 0}]}});
        assert_eq!(toleration_time(&zero, &unreachable), Some(Duration::ZERO));
    }

    #[test]
    fn the_scheduler_names_the_first_untolerated_schedule_or_execute_taint() {
        let taints = [
            json!({"key": "a", "effect": "PreferNoSchedule"}),
            taint(UNREACHABLE, NO_EXECUTE, Some("t")),
            taint(UNREACHABLE, NO_SCHEDULE, None),
        ];
        let found = first_untolerated(&default_pod(), &taints).expect("untolerated");
        assert_eq!(describe(found), "{node.kubernetes.io/unreachable: }");
        assert!(is(found, UNREACHABLE, NO_SCHEDULE));
    }
}
