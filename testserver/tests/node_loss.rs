//! A node lost but not deleted (`partition_node`, `heal_node`): the node lifecycle controller
//! marks it Unknown, marks its pods not Ready and taints it; the taint manager evicts the pods
//! after their toleration, and they stay Terminating with the kubelet gone; master disruption
//! mode when no node is Ready; the out-of-service taint (through kubectl when installed) makes
//! PodGC force-delete the terminating pods; the scheduler keeps new pods off; healing undoes it.

mod common;

use common::{bounded, kubectl, types, wait_for, Client};
use kube_testserver::{Options, TestServer};
use serde_json::{json, Value};
use std::time::Duration;

const PODS: &str = "/api/v1/namespaces/default/pods";
const PAUSE: &str = "registry.k8s.io/pause:3.9";
const UNREACHABLE: &str = "node.kubernetes.io/unreachable";

fn start(nodes: usize) -> (TestServer, Client) {
    let server = TestServer::start(Options {
        nodes,
        ..Options::default()
    })
    .expect("server starts");
    let admin = Client::admin(&server);
    (server, admin)
}

/// A pod bound to `node`, with `tolerations` of its own when given.
fn pod_on(name: &str, node: &str, tolerations: Option<Value>) -> Value {
    let mut p = json!({"metadata": {"name": name},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": PAUSE}]}});
    if let Some(t) = tolerations {
        p["spec"]["tolerations"] = t;
    }
    p
}

fn get(admin: &Client, path: &str) -> Value {
    admin.get(path).body
}

fn condition<'a>(obj: &'a Value, kind: &str) -> &'a Value {
    obj["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == kind))
        .unwrap_or(&Value::Null)
}

fn has_taint(node: &Value, key: &str, effect: &str) -> bool {
    node["spec"]["taints"]
        .as_array()
        .is_some_and(|ts| ts.iter().any(|t| t["key"] == key && t["effect"] == effect))
}

fn create_running(admin: &Client, body: &Value) {
    let r = admin.post(PODS, body);
    assert_eq!(r.code, 201, "{}", r.body);
    let name = body["metadata"]["name"].as_str().unwrap_or("");
    wait_for(
        10,
        "the pod to run",
        || get(admin, &format!("{PODS}/{name}")),
        |p| condition(p, "Ready")["status"] == "True",
    );
}

#[test]
fn a_partitioned_node_goes_unknown_and_its_pods_are_evicted_after_their_toleration_and_stay() {
    bounded(60, || {
        let (server, admin) = start(2);
        create_running(&admin, &pod_on("patient", "node-0", None));
        let now = json!([{"key": UNREACHABLE, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 0}]);
        create_running(&admin, &pod_on("eager", "node-0", Some(now)));
        let ever = json!([{"key": UNREACHABLE, "operator": "Exists", "effect": "NoExecute"}]);
        create_running(&admin, &pod_on("forever", "node-0", Some(ever)));
        assert_eq!(
            get(&admin, &format!("{PODS}/patient"))["spec"]["tolerations"][1],
            json!({"key": UNREACHABLE, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}),
            "DefaultTolerationSeconds"
        );

        assert!(server.partition_node("node-0"));
        assert!(!server.partition_node("no-such-node"));
        let node = wait_for(
            10,
            "node-0 to be tainted unreachable",
            || get(&admin, "/api/v1/nodes/node-0"),
            |n| has_taint(n, UNREACHABLE, "NoExecute"),
        );
        for kind in ["Ready", "MemoryPressure", "DiskPressure", "PIDPressure"] {
            let c = condition(&node, kind);
            assert_eq!(
                (
                    c["status"].as_str(),
                    c["reason"].as_str(),
                    c["message"].as_str()
                ),
                (
                    Some("Unknown"),
                    Some("NodeStatusUnknown"),
                    Some("Kubelet stopped posting node status.")
                ),
                "{kind}"
            );
        }
        assert!(has_taint(&node, UNREACHABLE, "NoSchedule"));
        let taints = node["spec"]["taints"].as_array().expect("taints");
        let no_execute = taints
            .iter()
            .find(|t| t["effect"] == "NoExecute")
            .expect("NoExecute");
        assert!(no_execute["timeAdded"].is_string());
        assert!(
            taints
                .iter()
                .all(|t| t["effect"] == "NoExecute" || t.get("timeAdded").is_none()),
            "NoSchedule taints have no timeAdded"
        );

        // MarkPodsNotReady, and the eviction of the pod that tolerates for 0 s, at once.
        let eager = wait_for(
            10,
            "eager to be evicted",
            || get(&admin, &format!("{PODS}/eager")),
            |p| !p["metadata"]["deletionTimestamp"].is_null(),
        );
        let target = condition(&eager, "DisruptionTarget");
        assert_eq!(
            (target["reason"].as_str(), target["message"].as_str()),
            (
                Some("DeletionByTaintManager"),
                Some("Taint manager: deleting due to NoExecute taint")
            )
        );
        assert_eq!(eager["metadata"]["deletionGracePeriodSeconds"], 30);
        // The default toleration: 300 s, scaled by grace_scale 0.01.
        let patient = wait_for(
            10,
            "patient to be evicted after its toleration",
            || get(&admin, &format!("{PODS}/patient")),
            |p| !p["metadata"]["deletionTimestamp"].is_null(),
        );
        assert_eq!(condition(&patient, "Ready")["status"], "False");
        assert_eq!(
            patient["status"]["phase"], "Running",
            "no kubelet writes it"
        );
        let forever = get(&admin, &format!("{PODS}/forever"));
        assert!(forever["metadata"]["deletionTimestamp"].is_null());
        assert_eq!(condition(&forever, "Ready")["status"], "False");

        // New pods go elsewhere.
        let r = admin.post(
            PODS,
            &json!({"metadata": {"name": "new"},
            "spec": {"containers": [{"name": "c", "image": PAUSE}]}}),
        );
        assert_eq!(r.code, 201);
        let placed = wait_for(
            10,
            "new to be scheduled",
            || get(&admin, &format!("{PODS}/new")),
            |p| p["spec"]["nodeName"].is_string(),
        );
        assert_eq!(placed["spec"]["nodeName"], "node-1");

        // Heal: Ready again, taints gone, the kubelet finishes the deletions and reports the
        // pod that stayed.
        assert!(server.heal_node("node-0"));
        assert!(!server.heal_node("node-0"), "not partitioned any more");
        assert_eq!(
            condition(&get(&admin, "/api/v1/nodes/node-0"), "Ready")["status"],
            "True",
            "posted before heal_node returns"
        );
        wait_for(
            10,
            "the unreachable taints to go",
            || get(&admin, "/api/v1/nodes/node-0"),
            |n| n["spec"].get("taints").is_none(),
        );
        for name in ["eager", "patient"] {
            wait_for(
                10,
                "the kubelet to finish the deletion",
                || json!(admin.get(&format!("{PODS}/{name}")).code),
                |c| *c == 404,
            );
        }
        wait_for(
            10,
            "forever to be Ready again",
            || get(&admin, &format!("{PODS}/forever")),
            |p| condition(p, "Ready")["status"] == "True",
        );
    });
}

#[test]
fn with_no_node_ready_nothing_is_evicted_until_out_of_service_lets_podgc_take_the_pods() {
    bounded(60, || {
        let (server, admin) = start(1);
        create_running(&admin, &pod_on("deleted", "node-0", None));
        create_running(&admin, &pod_on("kept", "node-0", None));
        let from = admin.get(PODS).body["metadata"]["resourceVersion"]
            .as_str()
            .expect("rv")
            .to_string();
        let events = admin
            .watch(&format!(
                "{PODS}?watch=true&resourceVersion={from}&fieldSelector=metadata.name%3Dkept"
            ))
            .spawn();
        assert!(server.partition_node("node-0"));
        // The NoSchedule taint is written in the same pass of the lifecycle controller that
        // decides on the NoExecute one: once it is there, the decision was made.
        let node = wait_for(
            10,
            "node-0 to be tainted unreachable",
            || get(&admin, "/api/v1/nodes/node-0"),
            |n| has_taint(n, UNREACHABLE, "NoSchedule"),
        );
        assert_eq!(condition(&node, "Ready")["status"], "Unknown");
        assert!(
            !has_taint(&node, UNREACHABLE, "NoExecute"),
            "master disruption mode: no node Ready, no NoExecute taint, no eviction"
        );
        // Nothing can be scheduled.
        let r = admin.post(
            PODS,
            &json!({"metadata": {"name": "nowhere"},
            "spec": {"containers": [{"name": "c", "image": PAUSE}]}}),
        );
        assert_eq!(r.code, 201);
        wait_for(
            10,
            "nowhere to be unschedulable",
            || get(&admin, &format!("{PODS}/nowhere")),
            |p| {
                condition(p, "PodScheduled")["message"] == "0/1 nodes are available: 1 node(s) had untolerated taint {node.kubernetes.io/unreachable: }. preemption: 0/1 nodes are available: 1 Preemption is not helpful for scheduling.."
            },
        );

        // A deletion the kubelet never finishes.
        assert_eq!(admin.delete(&format!("{PODS}/deleted"), None).code, 200);
        let deleted = get(&admin, &format!("{PODS}/deleted"));
        assert!(!deleted["metadata"]["deletionTimestamp"].is_null());

        // The out-of-service taint, as kubectl writes it (or its patch without kubectl).
        let taint = [
            "taint",
            "nodes",
            "node-0",
            "node.kubernetes.io/out-of-service=nodeshutdown:NoExecute",
        ];
        match kubectl(&server, &taint, None) {
            Some((ok, out)) => assert!(ok && out.contains("tainted"), "{out}"),
            None => {
                let current = get(&admin, "/api/v1/nodes/node-0")["spec"]["taints"].clone();
                let mut list = current.as_array().cloned().unwrap_or_default();
                list.push(json!({"key": "node.kubernetes.io/out-of-service", "value": "nodeshutdown", "effect": "NoExecute"}));
                let r = admin.send(
                    "PATCH",
                    "/api/v1/nodes/node-0",
                    Some("application/strategic-merge-patch+json"),
                    Some(&json!({"spec": {"taints": list}}).to_string()),
                );
                assert_eq!(r.code, 200, "{}", r.body);
            }
        }
        for name in ["deleted", "kept"] {
            wait_for(
                10,
                "podgc to force-delete the pod",
                || json!(admin.get(&format!("{PODS}/{name}")).code),
                |c| *c == 404,
            );
        }
        // `kept`: Ready False, evicted by the taint manager (it does not tolerate the taint),
        // then, terminating on a node out of service, Failed and deleted with grace 0 by PodGC.
        let seen = events.until(Duration::from_secs(10), |e| e["type"] == "DELETED");
        let objects: Vec<&Value> = seen.iter().map(|e| &e["object"]).collect();
        assert_eq!(
            types(&seen).last().map(String::as_str),
            Some("DELETED"),
            "{seen:?}"
        );
        let evicted = objects
            .iter()
            .position(|p| condition(p, "DisruptionTarget")["reason"] == "DeletionByTaintManager")
            .expect("the taint manager's condition");
        let marked = objects
            .iter()
            .position(|p| !p["metadata"]["deletionTimestamp"].is_null())
            .expect("a deletion");
        let failed = objects
            .iter()
            .position(|p| p["status"]["phase"] == "Failed")
            .expect("PodGC's Failed");
        let forced = objects
            .iter()
            .position(|p| p["metadata"]["deletionGracePeriodSeconds"] == 0)
            .expect("grace 0");
        assert!(
            evicted <= marked && marked < failed && failed < forced,
            "{seen:?}"
        );
        assert_eq!(
            objects[marked]["metadata"]["deletionGracePeriodSeconds"],
            30
        );
        assert_ne!(
            condition(objects[failed], "DisruptionTarget")["reason"],
            "DeletionByPodGC",
            "gcTerminating writes no condition of its own"
        );
        assert!(objects
            .iter()
            .take(evicted)
            .any(|p| condition(p, "Ready")["status"] == "False"));
    });
}

#[test]
fn a_partitioned_node_that_is_then_deleted_has_its_pods_collected_by_podgc() {
    bounded(30, || {
        let (server, admin) = start(2);
        create_running(&admin, &pod_on("orphan", "node-0", None));
        assert!(server.partition_node("node-0"));
        wait_for(
            10,
            "node-0 to be Unknown",
            || get(&admin, "/api/v1/nodes/node-0"),
            |n| condition(n, "Ready")["status"] == "Unknown",
        );
        assert!(server.lose_node("node-0"));
        assert_eq!(admin.get(&format!("{PODS}/orphan")).code, 404);
        assert!(!server.heal_node("node-0"));
        assert_eq!(server.node_names(), ["node-1"]);
    });
}

#[test]
fn cordoning_taints_the_node_unschedulable_and_uncordoning_removes_it() {
    bounded(30, || {
        let (server, admin) = start(1);
        assert!(server.cordon("node-0"));
        wait_for(
            10,
            "the unschedulable taint",
            || get(&admin, "/api/v1/nodes/node-0"),
            |n| {
                n["spec"]["taints"]
                    == json!([{"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}])
            },
        );
        assert!(server.uncordon("node-0"));
        wait_for(
            10,
            "no taint",
            || get(&admin, "/api/v1/nodes/node-0"),
            |n| n["spec"].get("taints").is_none(),
        );
    });
}

#[test]
fn a_no_execute_taint_a_client_adds_to_a_healthy_node_evicts_the_pods_that_do_not_tolerate_it() {
    bounded(30, || {
        let (_server, admin) = start(1);
        create_running(&admin, &pod_on("plain", "node-0", None));
        let tolerates = json!([{"key": "dedicated", "operator": "Exists", "effect": "NoExecute"}]);
        create_running(&admin, &pod_on("tolerant", "node-0", Some(tolerates)));
        let r = admin.send(
            "PATCH",
            "/api/v1/nodes/node-0",
            Some("application/strategic-merge-patch+json"),
            Some(r#"{"spec":{"taints":[{"key":"dedicated","value":"db","effect":"NoExecute"}]}}"#),
        );
        assert_eq!(r.code, 200, "{}", r.body);
        // Evicted, then terminated and removed by its (live) kubelet.
        wait_for(
            10,
            "plain to be evicted and removed",
            || json!(admin.get(&format!("{PODS}/plain")).code),
            |c| *c == 404,
        );
        let tolerant = get(&admin, &format!("{PODS}/tolerant"));
        assert!(tolerant["metadata"]["deletionTimestamp"].is_null());
        assert_eq!(condition(&tolerant, "Ready")["status"], "True");
    });
}
