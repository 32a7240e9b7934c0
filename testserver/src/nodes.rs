//! Nodes: the Node objects a v1.28 kubelet registers, what the scheduler and the kubelets read
//! from them, cordoning, and what PodGC does to the pods of a node that is gone.

use crate::store::{DeleteOpts, EventType, Store};
use crate::util;
use serde_json::{json, Value};

/// The kubelet version the simulated nodes report (the recordings' cluster ran v1.28.7).
pub const KUBELET_VERSION: &str = "v1.28.7";

/// The name `Options::nodes` gives the `i`th node: `node-0`, `node-1`, ...
pub fn node_name(i: usize) -> String {
    format!("node-{i}")
}

/// The InternalIP of the `i`th registered node: TEST-NET-1 (`192.0.2.2`, as the recorded node
/// had), then 10.x addresses for the 254th node and beyond.
fn node_ip(i: usize) -> String {
    if i < 253 {
        format!("192.0.2.{}", i + 2)
    } else {
        format!("10.{}.{}.{}", (i >> 16) & 255, (i >> 8) & 255, i & 255)
    }
}

/// A Node as a v1.28 kubelet registers it and keeps its status: Ready, no pressure,
/// addresses, capacity and allocatable, nodeInfo. `index` picks its addresses and pod CIDR.
pub fn node_object(name: &str, index: usize) -> Value {
    let now = util::now_rfc3339();
    let condition = |t: &str, status: &str, reason: &str, message: &str| {
        json!({"type": t, "status": status, "lastHeartbeatTime": now, "lastTransitionTime": now,
            "reason": reason, "message": message})
    };
    let cidr = format!("10.244.{}.0/24", index % 256);
    let resources = |memory: &str, storage: &str| {
        json!({"cpu": "4", "ephemeral-storage": storage, "hugepages-1Gi": "0",
            "hugepages-2Mi": "0", "memory": memory, "pods": "110"})
    };
    let mut machine = [0u8; 16];
    util::random_bytes(&mut machine);
    json!({
        "metadata": {
            "name": name,
            "labels": {
                "beta.kubernetes.io/arch": "amd64",
                "beta.kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
            },
            "annotations": {
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
            },
        },
        "spec": {"podCIDR": cidr, "podCIDRs": [cidr]},
        "status": {
            "capacity": resources("16393216Ki", "102626232Ki"),
            "allocatable": resources("16290816Ki", "94580335255"),
            "conditions": [
                condition("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
                condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                condition("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
                condition("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
            ],
            "addresses": [
                {"type": "InternalIP", "address": node_ip(index)},
                {"type": "Hostname", "address": name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "machineID": util::hex(&machine),
                "systemUUID": util::new_uid(),
                "bootID": util::new_uid(),
                "kernelVersion": "6.1.0-18-amd64",
                "osImage": "Debian GNU/Linux 12 (bookworm)",
                "containerRuntimeVersion": "containerd://1.7.13",
                "kubeletVersion": KUBELET_VERSION,
                "kubeProxyVersion": KUBELET_VERSION,
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        },
    })
}

/// Registers node `name` (Ready) as a kubelet does at start; `false` if it exists.
pub fn register(store: &mut Store, name: &str) -> bool {
    if store.get("nodes", "", name).is_some() {
        return false;
    }
    // The first index whose address no node has: a node added after one was lost does not
    // take over a live node's addresses.
    let taken: Vec<String> = store
        .list("nodes", None, None, 0, |_| true)
        .0
        .iter()
        .map(|n| internal_ip(n))
        .collect();
    let index = (0..).find(|i| !taken.contains(&node_ip(*i))).unwrap_or(0);
    let mut obj = node_object(name, index);
    obj["metadata"]["uid"] = json!(util::new_uid());
    obj["metadata"]["creationTimestamp"] = json!(util::now_rfc3339());
    store.commit("nodes", EventType::Added, obj, None);
    true
}

/// Whether the node's Ready condition is True.
pub fn is_ready(node: &Value) -> bool {
    node["status"]["conditions"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    })
}

/// Whether the node is cordoned (`spec.unschedulable`).
pub fn is_cordoned(node: &Value) -> bool {
    node["spec"]["unschedulable"].as_bool() == Some(true)
}

/// The node's InternalIP: what its pods report as `hostIP`.
pub fn internal_ip(node: &Value) -> String {
    node["status"]["addresses"]
        .as_array()
        .and_then(|a| a.iter().find(|x| x["type"] == "InternalIP"))
        .and_then(|x| x["address"].as_str())
        .unwrap_or("192.0.2.1")
        .to_string()
}

/// The first three octets of the node's IPv4 pod CIDR (`10.244.0`), from which its pods get
/// their IPs.
pub fn pod_network(node: &Value) -> String {
    node["spec"]["podCIDR"]
        .as_str()
        .and_then(|c| c.split('/').next())
        .and_then(|ip| ip.rsplit_once('.'))
        .map_or_else(|| "10.244.255".to_string(), |(net, _)| net.to_string())
}

/// Cordons or uncordons `name` with the strategic merge patch kubectl sends
/// (`{"spec":{"unschedulable":true}}`, and `null` to uncordon); `false` if there is no such
/// node.
pub fn set_cordoned(store: &mut Store, name: &str, cordoned: bool) -> bool {
    let Some(cur) = store.get("nodes", "", name) else {
        return false;
    };
    let mut next = (*cur).clone();
    let patch =
        json!({"spec": {"unschedulable": if cordoned { json!(true) } else { Value::Null }}});
    crate::patch::strategic_merge(&mut next, &patch);
    if next != *cur {
        store.update("nodes", next, cur);
    }
    true
}

/// The names of every node, in order.
pub fn names(store: &Store) -> Vec<String> {
    store
        .list("nodes", None, None, 0, |_| true)
        .0
        .iter()
        .filter_map(|n| n["metadata"]["name"].as_str().map(String::from))
        .collect()
}

/// What PodGC does to the pods bound to a node that no longer exists (`gcOrphaned`, 1.28 with
/// PodDisruptionConditions): a pod not yet terminal is marked Failed with the condition
/// DisruptionTarget (reason DeletionByPodGC), then every pod is deleted with grace 0.
/// The real PodGC waits 40 s of quarantine first; this does it at once.
pub fn collect_orphans(store: &mut Store, node: &str) {
    let (bound, _) = store.list("pods", None, None, 0, |p| {
        p["spec"]["nodeName"].as_str() == Some(node)
    });
    let now = util::now_rfc3339();
    for pod in bound {
        let (ns, name) = util::namespace_and_name(&pod);
        let uid = pod["metadata"]["uid"].as_str().map(String::from);
        let terminal = matches!(
            pod["status"]["phase"].as_str(),
            Some("Succeeded" | "Failed")
        );
        if !terminal {
            let mut next: Value = (*pod).clone();
            next["status"]["phase"] = json!("Failed");
            set_condition(
                &mut next,
                json!({"type": "DisruptionTarget", "status": "True", "lastProbeTime": null,
                    "lastTransitionTime": now, "reason": "DeletionByPodGC",
                    "message": "PodGC: node no longer exists"}),
            );
            store.update("pods", next, pod.clone());
        }
        let opts = DeleteOpts {
            uid,
            grace_period: Some(0),
            ..DeleteOpts::default()
        };
        if let Err(e) = store.delete("pods", &ns, &name, &opts) {
            log::debug!(error = e.to_string().as_str(); "podgc could not delete a pod");
        }
    }
}

/// Sets a pod condition as `podutil.UpdatePodCondition` does: appended when new; replaced in
/// place otherwise, keeping `lastTransitionTime` when the status is unchanged. Returns whether
/// anything changed.
pub fn set_condition(pod: &mut Value, mut condition: Value) -> bool {
    if !pod["status"]["conditions"].is_array() {
        pod["status"]["conditions"] = json!([]);
    }
    let Some(list) = pod["status"]["conditions"].as_array_mut() else {
        return false;
    };
    match list.iter_mut().find(|c| c["type"] == condition["type"]) {
        None => {
            list.push(condition);
            true
        }
        Some(old) => {
            if old["status"] == condition["status"] {
                condition["lastTransitionTime"] = old["lastTransitionTime"].clone();
            }
            let changed = *old != condition;
            *old = condition;
            changed
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registered_node_is_ready_with_kubelet_version_and_addresses() {
        let n = node_object("node-0", 0);
        assert!(is_ready(&n));
        assert!(!is_cordoned(&n));
        assert_eq!(internal_ip(&n), "192.0.2.2");
        assert_eq!(pod_network(&n), "10.244.0");
        assert_eq!(n["status"]["nodeInfo"]["kubeletVersion"], KUBELET_VERSION);
        assert_eq!(n["status"]["allocatable"]["pods"], "110");
        assert_eq!(node_ip(300), "10.0.1.44");
    }

    #[test]
    fn set_condition_keeps_transition_time_when_status_is_unchanged() {
        let mut pod = json!({"status": {"conditions": [
            {"type": "Ready", "status": "True", "lastTransitionTime": "t0"}]}});
        let changed = set_condition(
            &mut pod,
            json!({"type": "Ready", "status": "True", "lastTransitionTime": "t1"}),
        );
        assert!(!changed);
        assert_eq!(pod["status"]["conditions"][0]["lastTransitionTime"], "t0");
        assert!(set_condition(
            &mut pod,
            json!({"type": "DisruptionTarget", "status": "True", "lastTransitionTime": "t1"})
        ));
        assert_eq!(pod["status"]["conditions"][1]["type"], "DisruptionTarget");
    }
}
