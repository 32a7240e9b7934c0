//! The controllers of kube-controller-manager v1.28 that act on a node whose kubelet is gone,
//! as writes on the store: the node lifecycle controller (`tryUpdateNodeHealth`,
//! `MarkPodsNotReady`, `doNoScheduleTaintingPass`, `doNoExecuteTaintingPass` and
//! `handleDisruption`), the NoExecute taint manager's eviction (`addConditionAndDeletePod`) and
//! PodGC's `gcTerminating`. When they act is the cluster thread's to decide (`cluster.rs`).

use crate::nodes;
use crate::store::{DeleteOpts, Obj, Store};
use crate::taints::{self, NOT_READY, NO_EXECUTE, NO_SCHEDULE, UNREACHABLE, UNSCHEDULABLE};
use crate::util;
use serde_json::{json, Value};
use std::time::Duration;

/// `--node-monitor-grace-period` of 1.28: how long a node may post no status before it is
/// marked Unknown.
pub const NODE_MONITOR_GRACE: Duration = Duration::from_secs(40);
/// `--node-eviction-rate` 0.1 per second: one node of a zone tainted NoExecute every 10 s.
pub const NO_EXECUTE_INTERVAL: Duration = Duration::from_secs(10);

/// The conditions the controller sets to Unknown besides Ready (NetworkUnavailable is left to
/// the control plane).
const CONDITIONS: [&str; 4] = ["Ready", "MemoryPressure", "DiskPressure", "PIDPressure"];

/// The Ready condition's status: `True`, `False`, `Unknown`, or `""` when there is none.
pub fn ready_status(node: &Value) -> &str {
    node["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
        .and_then(|c| c["status"].as_str())
        .unwrap_or("")
}

/// What `tryUpdateNodeHealth` writes once a node has posted nothing for the grace period:
/// Ready and the pressure conditions Unknown, reason NodeStatusUnknown, message `Kubelet
/// stopped posting node status.`, a new transition time, the last heartbeat kept. `None` when
/// they all say so already.
pub fn unknown_status(node: &Value, now: &str) -> Option<Value> {
    let mut next = node.clone();
    let conditions = next["status"]["conditions"].as_array_mut()?;
    let mut changed = false;
    for c in conditions
        .iter_mut()
        .filter(|c| CONDITIONS.contains(&c["type"].as_str().unwrap_or("")))
    {
        if c["status"] != "Unknown" {
            c["status"] = json!("Unknown");
            c["reason"] = json!("NodeStatusUnknown");
            c["message"] = json!("Kubelet stopped posting node status.");
            c["lastTransitionTime"] = json!(now);
            changed = true;
        }
    }
    changed.then_some(next)
}

/// What a kubelet that is back posts: its conditions as it registered them (Ready, no
/// pressure), with a new heartbeat, and a new transition time where the status changed.
pub fn kubelet_status(node: &Value, now: &str) -> Value {
    let mut next = node.clone();
    let registered = nodes::node_object("", 0);
    let fresh = registered["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let old = node["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let conditions: Vec<Value> = fresh
        .into_iter()
        .map(|mut c| {
            let before = old.iter().find(|o| o["type"] == c["type"]);
            c["lastHeartbeatTime"] = json!(now);
            c["lastTransitionTime"] = match before {
                Some(b) if b["status"] == c["status"] => b["lastTransitionTime"].clone(),
                _ => json!(now),
            };
            c
        })
        .collect();
    next["status"]["conditions"] = json!(conditions);
    next
}

/// `MarkPodsNotReady`: every pod bound to `node` whose Ready condition is not False gets it
/// False (reason and message as they were, a new transition time), as the controller does
/// when it finds a node not Ready.
pub fn mark_pods_not_ready(store: &mut Store, node: &str) {
    let (pods, _) = store.list("pods", None, None, 0, |p| {
        p["spec"]["nodeName"].as_str() == Some(node)
    });
    let now = util::now_rfc3339();
    for pod in pods {
        let Some(ready) = pod["status"]["conditions"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
        else {
            continue;
        };
        if ready["status"] == "False" {
            continue;
        }
        let mut condition = ready.clone();
        condition["status"] = json!("False");
        condition["lastTransitionTime"] = json!(now);
        let mut next = (*pod).clone();
        if nodes::set_condition(&mut next, condition) {
            store.update("pods", next, pod);
        }
    }
}

/// The condition taint for the node's Ready status: unreachable when Unknown, not-ready when
/// False, none when True or when the node has no Ready condition (the controllers map only a
/// condition they find).
fn condition_taint(node: &Value) -> Option<&'static str> {
    match ready_status(node) {
        "Unknown" => Some(UNREACHABLE),
        "False" => Some(NOT_READY),
        _ => None,
    }
}

/// The NoSchedule taints `TaintNodesByCondition` keeps on a node: the condition taint, and
/// unschedulable when it is cordoned.
fn wanted_no_schedule(node: &Value) -> Vec<&'static str> {
    let mut keys: Vec<&'static str> = condition_taint(node).into_iter().collect();
    if nodes::is_cordoned(node) {
        keys.push(UNSCHEDULABLE);
    }
    keys
}

/// `node` with the taints of `keys` (of `effect`) being exactly `want`: missing ones added at
/// the end, others of those keys removed; every other taint kept in place. `None` when nothing
/// changes.
fn with_taints(
    node: &Value,
    effect: &str,
    keys: &[&str],
    want: &[&str],
    now: &str,
) -> Option<Value> {
    let current = taints::of_node(node);
    let mut next_taints: Vec<Value> = current
        .iter()
        .filter(|t| {
            let key = t["key"].as_str().unwrap_or("");
            !(t["effect"] == effect && keys.contains(&key) && !want.contains(&key))
        })
        .cloned()
        .collect();
    for key in want {
        if !next_taints.iter().any(|t| taints::is(t, key, effect)) {
            let added = (effect == NO_EXECUTE).then_some(now);
            next_taints.push(taints::taint(key, effect, added));
        }
    }
    if next_taints == current {
        return None;
    }
    let mut next = node.clone();
    if next_taints.is_empty() {
        if let Some(spec) = next["spec"].as_object_mut() {
            spec.remove("taints");
        }
    } else {
        next["spec"]["taints"] = json!(next_taints);
    }
    Some(next)
}

/// The node with its NoSchedule condition taints as they should be (`doNoScheduleTaintingPass`,
/// not rate limited), or `None` when they are.
pub fn no_schedule_taints(node: &Value, now: &str) -> Option<Value> {
    with_taints(
        node,
        NO_SCHEDULE,
        &[UNREACHABLE, NOT_READY, UNSCHEDULABLE],
        &wanted_no_schedule(node),
        now,
    )
}

/// The NoExecute taint the node should carry for its Ready condition (`processTaintBaseEviction`).
pub fn wanted_no_execute(node: &Value) -> Option<&'static str> {
    condition_taint(node)
}

/// The node with NoExecute condition taint `want` only (the other swapped out, timeAdded now),
/// or `None` when it has just that.
pub fn no_execute_taint(node: &Value, want: Option<&str>, now: &str) -> Option<Value> {
    let want: Vec<&str> = want.into_iter().collect();
    with_taints(node, NO_EXECUTE, &[UNREACHABLE, NOT_READY], &want, now)
}

/// Whether the node carries a NoExecute condition taint (unreachable or not-ready).
pub fn has_no_execute_taint(node: &Value) -> bool {
    taints::of_node(node)
        .iter()
        .any(|t| taints::is(t, UNREACHABLE, NO_EXECUTE) || taints::is(t, NOT_READY, NO_EXECUTE))
}

/// A zone's state, as `ComputeZoneState` judges it from its nodes' Ready conditions. The
/// simulated nodes carry no zone label, so they all share one zone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ZoneState {
    Normal,
    /// More than two nodes and at least 55 % of them not Ready: in a cluster of up to 50
    /// nodes, no node is tainted NoExecute any more.
    PartialDisruption,
    /// No node Ready: with every zone so, the controller enters "master disruption mode",
    /// removes the NoExecute condition taints and stops evicting (it assumes the control
    /// plane, not the nodes, lost the network).
    FullDisruption,
}

pub fn zone_state(all: &[Obj]) -> ZoneState {
    let ready = all.iter().filter(|n| ready_status(n) == "True").count();
    let not_ready = all.len() - ready;
    if ready == 0 && not_ready > 0 {
        ZoneState::FullDisruption
    } else if not_ready > 2 && not_ready as f64 / all.len() as f64 >= 0.55 {
        ZoneState::PartialDisruption
    } else {
        ZoneState::Normal
    }
}

/// The taint manager's eviction (`addConditionAndDeletePod`): the condition DisruptionTarget
/// (reason DeletionByTaintManager) written, then a DELETE with default options, so the pod's
/// own grace period; its kubelet, if any, finishes the deletion.
pub fn evict(store: &mut Store, pod: Obj) {
    let (ns, name) = util::namespace_and_name(&pod);
    log::debug!(object = format!("{ns}/{name}").as_str(); "taint manager evicts a pod");
    let mut next = (*pod).clone();
    let condition = json!({"type": "DisruptionTarget", "status": "True", "lastProbeTime": null,
        "lastTransitionTime": util::now_rfc3339(), "reason": "DeletionByTaintManager",
        "message": "Taint manager: deleting due to NoExecute taint"});
    if nodes::set_condition(&mut next, condition) {
        store.update("pods", next, pod);
    }
    if let Err(e) = store.delete("pods", &ns, &name, &DeleteOpts::default()) {
        log::debug!(error = e.to_string().as_str(); "taint manager could not delete a pod");
    }
}

/// Whether PodGC's `gcTerminating` takes `pod` now: it is terminating, and its node is not
/// Ready and carries a `node.kubernetes.io/out-of-service` taint (any value or effect).
pub fn gc_terminating_applies(pod: &Value, node: &Value) -> bool {
    !pod["metadata"]["deletionTimestamp"].is_null()
        && ready_status(node) != "True"
        && taints::of_node(node)
            .iter()
            .any(|t| t["key"] == taints::OUT_OF_SERVICE)
}

/// `markFailedAndDeletePod` (without a condition, as `gcTerminating` calls it): a pod not yet
/// terminal gets phase Failed, then it is deleted with grace 0.
pub fn gc_terminating(store: &mut Store, pod: Obj) {
    let (ns, name) = util::namespace_and_name(&pod);
    log::debug!(object = format!("{ns}/{name}").as_str(); "podgc force-deletes a terminating pod");
    if !matches!(
        pod["status"]["phase"].as_str(),
        Some("Succeeded" | "Failed")
    ) {
        let mut next = (*pod).clone();
        next["status"]["phase"] = json!("Failed");
        store.update("pods", next, pod);
    }
    let opts = DeleteOpts {
        grace_period: Some(0),
        ..DeleteOpts::default()
    };
    if let Err(e) = store.delete("pods", &ns, &name, &opts) {
        log::debug!(error = e.to_string().as_str(); "podgc could not delete a pod");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn node(ready: &str) -> Value {
        let mut n = nodes::node_object("n", 0);
        for c in n["status"]["conditions"]
            .as_array_mut()
            .expect("conditions")
        {
            if c["type"] == "Ready" {
                c["status"] = json!(ready);
            }
        }
        n
    }

    #[test]
    fn a_silent_node_gets_every_condition_unknown_with_the_controllers_words() {
        let n = node("True");
        let next = unknown_status(&n, "2030-01-01T00:00:00Z").expect("changed");
        for c in next["status"]["conditions"].as_array().expect("conditions") {
            assert_eq!(c["status"], "Unknown");
            assert_eq!(c["reason"], "NodeStatusUnknown");
            assert_eq!(c["message"], "Kubelet stopped posting node status.");
            assert_eq!(c["lastTransitionTime"], "2030-01-01T00:00:00Z");
            assert_ne!(c["lastHeartbeatTime"], "2030-01-01T00:00:00Z");
        }
        assert!(unknown_status(&next, "later").is_none(), "written once");
        let back = kubelet_status(&next, "2030-01-01T00:01:00Z");
        assert_eq!(ready_status(&back), "True");
        assert_eq!(back["status"]["conditions"][3]["reason"], "KubeletReady");
        assert_eq!(
            back["status"]["conditions"][3]["lastTransitionTime"],
            "2030-01-01T00:01:00Z"
        );
    }

    #[test]
    fn condition_taints_follow_ready_and_leave_other_taints_alone() {
        let mut n = node("Unknown");
        n["spec"]["taints"] = json!([{"key": "node.kubernetes.io/out-of-service",
            "value": "nodeshutdown", "effect": "NoExecute"}]);
        let n = no_schedule_taints(&n, "t").expect("added");
        let n = no_execute_taint(&n, wanted_no_execute(&n), "t").expect("added");
        assert_eq!(
            n["spec"]["taints"],
            json!([
                {"key": "node.kubernetes.io/out-of-service", "value": "nodeshutdown", "effect": "NoExecute"},
                {"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"},
                {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute", "timeAdded": "t"}
            ])
        );
        assert!(no_schedule_taints(&n, "t").is_none());
        assert!(has_no_execute_taint(&n));
        let mut healed = n.clone();
        healed["status"] = node("True")["status"].clone();
        let healed = no_schedule_taints(&healed, "t").expect("removed");
        let healed = no_execute_taint(&healed, wanted_no_execute(&healed), "t").expect("removed");
        assert_eq!(healed["spec"]["taints"].as_array().map(Vec::len), Some(1));
        let mut cordoned = node("True");
        cordoned["spec"]["unschedulable"] = json!(true);
        let cordoned = no_schedule_taints(&cordoned, "t").expect("added");
        assert_eq!(
            cordoned["spec"]["taints"],
            json!([{"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}])
        );
    }

    #[test]
    fn zone_states_are_judged_as_compute_zone_state_does() {
        let nodes = |ready: usize, not: usize| -> Vec<Obj> {
            (0..ready)
                .map(|_| Arc::new(node("True")))
                .chain((0..not).map(|_| Arc::new(node("Unknown"))))
                .collect()
        };
        assert_eq!(zone_state(&nodes(0, 1)), ZoneState::FullDisruption);
        assert_eq!(zone_state(&nodes(1, 1)), ZoneState::Normal);
        assert_eq!(
            zone_state(&nodes(1, 2)),
            ZoneState::Normal,
            "two are not enough"
        );
        assert_eq!(zone_state(&nodes(2, 3)), ZoneState::PartialDisruption);
        assert_eq!(zone_state(&nodes(3, 3)), ZoneState::Normal, "under 55 %");
    }

    #[test]
    fn podgc_takes_terminating_pods_of_a_not_ready_out_of_service_node_only() {
        let terminating = json!({"metadata": {"deletionTimestamp": "t"}});
        let mut oos = node("Unknown");
        oos["spec"]["taints"] =
            json!([{"key": "node.kubernetes.io/out-of-service", "effect": "NoExecute"}]);
        assert!(gc_terminating_applies(&terminating, &oos));
        assert!(!gc_terminating_applies(&json!({"metadata": {}}), &oos));
        let mut ready_oos = oos.clone();
        ready_oos["status"] = node("True")["status"].clone();
        assert!(!gc_terminating_applies(&terminating, &ready_oos));
        assert!(!gc_terminating_applies(&terminating, &node("Unknown")));
    }
}
