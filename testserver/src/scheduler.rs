//! The scheduler's decisions, as pure functions: which node a pending pod goes to, or why none
//! fits, in the words kube-scheduler v1.28 writes into the PodScheduled condition (fixture 11).

use crate::taints;
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// A node as the scheduler weighs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub name: String,
    pub cordoned: bool,
    /// Its taints, in order; see [`effective_taints`].
    pub taints: Vec<Value>,
    /// Pods bound to it now: the least loaded node wins (ties: by name).
    pub pods: usize,
}

/// The taints the scheduler sees on `node`: those it carries, and, for a node that is not
/// Ready and does not carry it yet, the NoSchedule taint the node lifecycle controller is
/// about to add (`node.kubernetes.io/unreachable` when Ready is Unknown, `not-ready`
/// otherwise), so no pod lands on it in between.
pub fn effective_taints(node: &Value) -> Vec<Value> {
    let mut out = taints::of_node(node);
    let ready = node["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
        .and_then(|c| c["status"].as_str());
    let key = match ready {
        Some("True") => return out,
        Some("Unknown") => taints::UNREACHABLE,
        _ => taints::NOT_READY,
    };
    if !out.iter().any(|t| taints::is(t, key, taints::NO_SCHEDULE)) {
        out.push(taints::taint(key, taints::NO_SCHEDULE, None));
    }
    out
}

/// Where a pod goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Bind(String),
    /// No node fits; the message for PodScheduled=False/Unschedulable.
    Unschedulable(String),
}

/// Picks the node for `pod`. Filters run in kube-scheduler's order and a node is counted
/// under the first that rejects it: NodeUnschedulable (cordoned, unless the pod tolerates
/// `node.kubernetes.io/unschedulable:NoSchedule`), then TaintToleration (the first NoSchedule
/// or NoExecute taint the pod does not tolerate). Resources, affinity and node selectors are
/// not simulated.
pub fn decide(pod: &Value, nodes: &[Candidate]) -> Decision {
    if nodes.is_empty() {
        // kube-scheduler's ErrNoNodesAvailable.
        return Decision::Unschedulable("no nodes available to schedule pods".into());
    }
    let unschedulable = taints::taint(taints::UNSCHEDULABLE, taints::NO_SCHEDULE, None);
    let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
    let mut best: Option<&Candidate> = None;
    for n in nodes {
        let reason = if n.cordoned && !taints::tolerated(pod, &unschedulable) {
            Some("node(s) were unschedulable".to_string())
        } else {
            taints::first_untolerated(pod, &n.taints)
                .map(|t| format!("node(s) had untolerated taint {}", taints::describe(t)))
        };
        match reason {
            Some(r) => *reasons.entry(r).or_default() += 1,
            None => {
                if best.is_none_or(|b| (n.pods, &n.name) < (b.pods, &b.name)) {
                    best = Some(n);
                }
            }
        }
    }
    if let Some(b) = best {
        return Decision::Bind(b.name.clone());
    }
    // FitError.Error(): the reasons sorted by text, then what preemption concluded (its own
    // sentence ends in a period, and the whole message gets one more).
    let total = nodes.len();
    let listed: Vec<String> = reasons.iter().map(|(r, c)| format!("{c} {r}")).collect();
    Decision::Unschedulable(format!(
        "0/{total} nodes are available: {}. preemption: 0/{total} nodes are available: {total} Preemption is not helpful for scheduling..",
        listed.join(", ")
    ))
}

/// The pod bound to `node`, as the binding subresource writes it: `spec.nodeName` and the
/// condition PodScheduled=True in one write (fixture 03).
pub fn bound(pod: &Value, node: &str, now: &str) -> Value {
    let mut next = pod.clone();
    next["spec"]["nodeName"] = json!(node);
    crate::nodes::set_condition(
        &mut next,
        json!({"type": "PodScheduled", "status": "True", "lastProbeTime": null, "lastTransitionTime": now}),
    );
    next
}

/// The pod with PodScheduled=False, reason Unschedulable and `message` (fixture 11), or
/// `None` when it already says so: the scheduler does not rewrite an unchanged condition.
pub fn unschedulable(pod: &Value, message: &str, now: &str) -> Option<Value> {
    let mut next = pod.clone();
    let changed = crate::nodes::set_condition(
        &mut next,
        json!({"type": "PodScheduled", "status": "False", "lastProbeTime": null,
            "lastTransitionTime": now, "reason": "Unschedulable", "message": message}),
    );
    changed.then_some(next)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, ready: bool, cordoned: bool, pods: usize) -> Candidate {
        let status = if ready { "True" } else { "False" };
        let obj = json!({"status": {"conditions": [{"type": "Ready", "status": status}]}});
        Candidate {
            name: name.into(),
            cordoned,
            taints: effective_taints(&obj),
            pods,
        }
    }

    #[test]
    fn least_loaded_schedulable_node_wins() {
        let pod = json!({"spec": {}});
        let nodes = [
            node("node-0", true, false, 3),
            node("node-1", true, true, 0),
            node("node-2", true, false, 1),
            node("node-3", true, false, 1),
        ];
        assert_eq!(decide(&pod, &nodes), Decision::Bind("node-2".into()));
    }

    #[test]
    fn one_cordoned_node_gives_the_recorded_message() {
        let pod = json!({"spec": {}});
        assert_eq!(
            decide(&pod, &[node("node-0", true, true, 0)]),
            Decision::Unschedulable("0/1 nodes are available: 1 node(s) were unschedulable. preemption: 0/1 nodes are available: 1 Preemption is not helpful for scheduling..".into())
        );
    }

    #[test]
    fn reasons_are_counted_per_node_and_sorted() {
        let pod = json!({"spec": {}});
        let Decision::Unschedulable(m) = decide(
            &pod,
            &[
                node("a", true, true, 0),
                node("b", false, false, 0),
                node("c", true, true, 0),
            ],
        ) else {
            panic!("nothing should fit")
        };
        assert_eq!(m, "0/3 nodes are available: 1 node(s) had untolerated taint {node.kubernetes.io/not-ready: }, 2 node(s) were unschedulable. preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling..");
        assert_eq!(
            decide(&pod, &[]),
            Decision::Unschedulable("no nodes available to schedule pods".into())
        );
    }

    #[test]
    fn tainted_and_unreachable_nodes_are_left_out_under_their_first_untolerated_taint() {
        let pod = json!({"spec": {"tolerations": [
            {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}]}});
        let unknown = json!({"status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}});
        let out_of_service = json!({"spec": {"taints": [{"key": "node.kubernetes.io/out-of-service",
            "value": "nodeshutdown", "effect": "NoExecute"}]},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}});
        let candidate = |name: &str, obj: &Value| Candidate {
            name: name.into(),
            cordoned: false,
            taints: effective_taints(obj),
            pods: 0,
        };
        let Decision::Unschedulable(m) = decide(
            &pod,
            &[candidate("a", &unknown), candidate("b", &out_of_service)],
        ) else {
            panic!("nothing should fit")
        };
        assert_eq!(m, "0/2 nodes are available: 1 node(s) had untolerated taint {node.kubernetes.io/out-of-service: nodeshutdown}, 1 node(s) had untolerated taint {node.kubernetes.io/unreachable: }. preemption: 0/2 nodes are available: 2 Preemption is not helpful for scheduling..");
    }

    #[test]
    fn a_pod_tolerating_unschedulable_goes_to_a_cordoned_node() {
        let pod = json!({"spec": {"tolerations": [
            {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}]}});
        assert_eq!(
            decide(&pod, &[node("node-0", true, true, 0)]),
            Decision::Bind("node-0".into())
        );
    }

    #[test]
    fn unchanged_unschedulable_condition_is_not_rewritten() {
        let pod = json!({"spec": {}, "status": {"phase": "Pending"}});
        let once = unschedulable(&pod, "m", "t0").expect("first write");
        assert!(unschedulable(&once, "m", "t1").is_none());
        assert!(unschedulable(&once, "other", "t1").is_some());
    }
}
