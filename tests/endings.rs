//! End-to-end: every way a pod of ours can end on a cluster with a kubelet, and what the
//! object's Ready condition says meanwhile. The same scenarios run on the test server (its
//! simulated kubelet) and on a real cluster (`IMMORTAL_E2E_KUBECONFIG`); a step that needs a
//! test-server control says SKIPPED there.
//!
//! What a real cluster streams for each ending is recorded in
//! `tests/fixtures/kube-1.28-kubelet/`: a graceful deletion ends in phase Succeeded before
//! the pod is removed, a forced one is removed while Running, an eviction is a graceful
//! deletion, the kubelet fails a pod past its activeDeadlineSeconds.

mod common;

use common::{
    condition, image, name, other_image, reason_message, uid, wait_until, Cluster, Operator,
};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::Duration;

fn one(name: &str, start_times: i64) -> BTreeMap<String, i64> {
    BTreeMap::from([(name.to_string(), start_times)])
}

/// Waits until `name` converged on a pod other than `old` with `starts` counted.
fn replaced(c: &Cluster, name: &str, old: &Value, starts: i64) -> Value {
    let old = uid(old).to_string();
    c.wait_converged(name, starts, |p| {
        if uid(p) != old {
            Ok(())
        } else {
            Err("still the old pod".into())
        }
    })
}

/// An image whose default command exits at once (busybox's `sh` without a terminal), so the
/// kubelet restarts it with back-off: CrashLoopBackOff. The test server's runtime knows it.
fn crash_image() -> String {
    std::env::var("IMMORTAL_E2E_CRASH_IMAGE").unwrap_or_else(|_| "busybox:1.36".into())
}

/// An image no registry has: the pull fails (ErrImagePull, ImagePullBackOff).
fn missing_image() -> String {
    std::env::var("IMMORTAL_E2E_MISSING_IMAGE")
        .unwrap_or_else(|_| "registry.k8s.io/does-not-exist:1.0".into())
}

#[test]
fn deleted_with_the_default_grace_period_is_replaced_once_it_is_gone() {
    let c = Cluster::new("delete-default-grace");
    let _op = Operator::start(&c);
    c.create_ic("web", &image());
    let first = c.wait_converged("web", 1, |_| Ok(()));
    // The kubelet stops the container, writes phase Succeeded, then removes the pod.
    assert!(c.delete_pod_with_grace(name(&first), uid(&first), None));
    replaced(&c, "web", &first, 2);
    c.assert_stays_converged(&one("web", 2), Duration::from_secs(1));
}

#[test]
fn deleted_with_a_one_second_grace_period_is_replaced() {
    let c = Cluster::new("delete-grace-1");
    let _op = Operator::start(&c);
    c.create_ic("web", &image());
    let first = c.wait_converged("web", 1, |_| Ok(()));
    assert!(c.delete_pod_with_grace(name(&first), uid(&first), Some(1)));
    replaced(&c, "web", &first, 2);
    c.assert_stays_converged(&one("web", 2), Duration::from_secs(1));
}

#[test]
fn force_deleted_is_replaced() {
    let c = Cluster::new("force-delete");
    let _op = Operator::start(&c);
    c.create_ic("web", &image());
    let first = c.wait_converged("web", 1, |_| Ok(()));
    // `kubectl delete pod --grace-period=0 --force`: DELETED while the phase says Running.
    assert!(c.delete_pod_with_grace(name(&first), uid(&first), Some(0)));
    replaced(&c, "web", &first, 2);
    c.assert_stays_converged(&one("web", 2), Duration::from_secs(1));
}

#[test]
fn evicted_is_replaced() {
    let c = Cluster::new("evict");
    let _op = Operator::start(&c);
    c.create_ic("web", &image());
    let first = c.wait_converged("web", 1, |_| Ok(()));
    c.evict_pod(name(&first));
    replaced(&c, "web", &first, 2);
    // Said after the fact: an eviction, not a person's delete.
    let said = c.wait_event("PodReplaced", |m| {
        m.contains("the previous one was deleted")
    });
    assert!(
        said.contains("was deleted (EvictionByEvictionAPI) ")
            && said.ends_with(" after it started"),
        "{said}"
    );
    c.assert_stays_converged(&one("web", 2), Duration::from_secs(1));
}

#[test]
fn drained_with_every_node_cordoned_is_unschedulable_until_a_node_takes_it() {
    let c = Cluster::new("drain");
    let _op = Operator::start(&c);
    c.create_ic("web", &image());
    let first = c.wait_converged("web", 1, |_| Ok(()));

    // `kubectl drain`: cordon, then evict. With every node cordoned the replacement cannot be
    // scheduled, and Ready says so with the scheduler's words.
    let cordoned = c.cordon_all();
    c.evict_pod(name(&first));
    let ic = c.wait_ready("web", "False", "PodUnschedulable");
    let msg = reason_message(&ic);
    assert!(msg.contains("unschedulable"), "{msg}");
    assert_eq!(ic["status"]["podPhase"], "Pending");
    assert_eq!(
        ic["status"]["startTimes"], 2,
        "the pending replacement is counted"
    );
    let pods = c.list_managed_pods().expect("list pods");
    assert_eq!(pods.len(), 1, "one pending replacement, no more: {pods:?}");
    assert_ne!(uid(&pods[0]), uid(&first));

    cordoned.release();
    c.wait_converged("web", 2, |p| {
        if uid(p) == uid(&pods[0]) {
            Ok(())
        } else {
            Err(format!("not the pending pod {}", uid(&pods[0])))
        }
    });
    c.assert_stays_converged(&one("web", 2), Duration::from_secs(1));
}

#[test]
fn failed_by_the_kubelet_is_replaced() {
    let c = Cluster::new("kubelet-fails");
    let _op = Operator::start(&c);
    c.create_ic("web", &image());
    let first = c.wait_converged("web", 1, |_| Ok(()));
    // activeDeadlineSeconds may be added to a running pod; the kubelet then fails it
    // (phase Failed, reason DeadlineExceeded) and the pod stays until someone deletes it.
    c.patch_pod(name(&first), &json!({"spec": {"activeDeadlineSeconds": 1}}));
    replaced(&c, "web", &first, 2);
    let said = c.wait_event("PodReplaced", |m| m.contains("the previous one"));
    assert!(said.contains("ended (DeadlineExceeded) "), "{said}");
    c.assert_stays_converged(&one("web", 2), Duration::from_secs(1));
}

#[test]
fn a_terminating_pod_is_waited_for_without_polling() {
    let c = Cluster::new("no-polling");
    let Some(server) = c.test_server_or_skip("no-polling needs an image that ignores SIGTERM")
    else {
        return;
    };
    let _op = Operator::start(&c);
    // The test server's runtime runs this until the end of the grace period.
    c.create_ic("web", "registry.example/ignore-sigterm:1");
    let first = c.wait_converged("web", 1, |_| Ok(()));
    // The test server's kubelet waits a hundredth of a grace period: 300 s is 3 s here.
    assert!(c.delete_pod_with_grace(name(&first), uid(&first), Some(300)));
    let ic = c.wait_ready("web", "False", "PodTerminating");
    assert_eq!(ic["status"]["podPhase"], "Terminating");
    let before = server.request_counts();
    std::thread::sleep(Duration::from_secs(2));
    let diff = common::counts_diff(&before, &server.request_counts());
    eprintln!("requests while the pod terminated: {diff:?}");
    assert!(
        !diff.contains_key(&("create".to_string(), "pods".to_string())),
        "a create was tried while the name was held: {diff:?}"
    );
    assert!(
        common::acting_requests(&diff) <= 2,
        "requests while waiting: {diff:?}"
    );
    replaced(&c, "web", &first, 2);
}

#[test]
fn a_pod_its_node_never_confirms_deleted_says_so_past_its_grace_period_and_where_to_look() {
    let c = Cluster::new("unconfirmed");
    let Some(server) = c.test_server_or_skip("unconfirmed partitions a node") else {
        return;
    };
    let _op = Operator::start(&c);
    c.create_ic("web", &image());
    let first = c.wait_converged("web", 1, |_| Ok(()));
    let node = first["spec"]["nodeName"]
        .as_str()
        .expect("scheduled")
        .to_string();
    // Its kubelet gone (the only node: nothing is evicted), the deletion is never confirmed.
    assert!(server.partition_node(&node), "no node {node}");
    assert!(c.delete_pod_with_grace(name(&first), uid(&first), Some(1)));
    c.wait_ready("web", "False", "PodTerminating");
    let before = server.request_counts();
    // 10 s past its 1 s grace period the message says so, once, from one look asked for then.
    let ic = wait_until(
        c.timeout(Duration::from_secs(30)),
        "the message to say the node has not confirmed",
        || {
            let ic = c.ic("web");
            match reason_message(&ic) {
                m if m.contains("has not confirmed") => Ok(ic),
                m => Err(m),
            }
        },
    );
    let msg = reason_message(&ic);
    assert!(
        msg.contains("its 1 s grace period ended over 10 s ago")
            && msg.contains(&format!(
                "node {node} has not confirmed that the pod stopped"
            ))
            && msg.contains("kubectl describe pod web-immortalpod")
            && msg.contains("node.kubernetes.io/out-of-service"),
        "{msg}"
    );
    let diff = common::counts_diff(&before, &server.request_counts());
    eprintln!("requests while the pod waited on its node: {diff:?}");
    let reads = diff.get(&("get".to_string(), "pods".to_string()));
    assert!(
        reads.is_some_and(|&n| n <= 2),
        "requests while it waited: {diff:?}"
    );
    // The kubelet back, the deletion finishes and the pod is replaced.
    assert!(server.heal_node(&node));
    replaced(&c, "web", &first, 2);
}

#[test]
fn an_image_change_goes_through_graceful_deletion_to_a_pod_with_the_new_image() {
    let c = Cluster::new("image-graceful");
    let _op = Operator::start(&c);
    c.create_ic("web", &image());
    let first = c.wait_converged("web", 1, |_| Ok(()));
    c.set_image("web", &other_image());
    let second = replaced(&c, "web", &first, 2);
    assert_eq!(
        second["spec"]["containers"][0]["image"],
        other_image().as_str()
    );
    c.assert_stays_converged(&one("web", 2), Duration::from_secs(1));
}

#[test]
fn pods_that_keep_ending_back_off_and_say_so() {
    let c = Cluster::new("backoff");
    let _op = Operator::start(&c);
    c.create_ic("web", &image());
    c.wait_converged("web", 1, |_| Ok(()));

    // Force-delete each new pod as soon as it exists: the operator must not follow at full
    // speed; it backs off and says so.
    let mut deleted = 0;
    let mut backing_off = None;
    let mut last_uid = String::new();
    let end = std::time::Instant::now() + c.timeout(Duration::from_secs(30));
    while backing_off.is_none() && std::time::Instant::now() < end {
        if let Some(p) = c.get_pod(&common::pod_name("web")).expect("get pod") {
            if uid(&p) != last_uid && p["metadata"]["deletionTimestamp"].is_null() {
                last_uid = uid(&p).to_string();
                if c.delete_pod_with_grace(name(&p), uid(&p), Some(0)) {
                    deleted += 1;
                }
            }
        }
        let ic = c.ic("web");
        if condition(&ic, "Ready").is_some_and(|r| r["reason"] == "PodRestartBackOff") {
            backing_off = Some(ic);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let ic = backing_off.expect("the object never reported PodRestartBackOff");
    assert!(deleted >= 2, "deleted {deleted}");
    let msg = reason_message(&ic);
    assert!(msg.contains("the next one is created at"), "{msg}");
    // Once the back-off ends the pod comes back, every start counted exactly once.
    let want = 1 + deleted;
    c.wait_converged("web", want, |_| Ok(()));
    c.assert_stays_converged(&one("web", want), Duration::from_secs(1));
}

#[test]
fn an_admission_refusal_is_reported_and_the_pod_made_once_allowed() {
    let c = Cluster::new("admission");
    let _op = Operator::start(&c);
    c.create_ic("web", &image());
    let first = c.wait_converged("web", 1, |_| Ok(()));
    // PodSecurity "restricted" refuses our plain pod with 403 Forbidden (a refusal, not RBAC).
    c.label_namespace("pod-security.kubernetes.io/enforce", Some("restricted"));
    assert!(c.delete_pod_with_grace(name(&first), uid(&first), Some(0)));
    let ic = c.wait_ready("web", "False", "PodCreateFailed");
    let msg = reason_message(&ic);
    assert!(msg.contains("PodSecurity"), "{msg}");
    assert_eq!(
        ic["status"]["startTimes"], 1,
        "a refused pod is not a start"
    );
    assert!(c.list_managed_pods().expect("list pods").is_empty());

    c.label_namespace("pod-security.kubernetes.io/enforce", None);
    replaced(&c, "web", &first, 2);
    c.assert_stays_converged(&one("web", 2), Duration::from_secs(1));
}

#[test]
fn an_image_that_cannot_be_pulled_is_reported_and_a_good_one_replaces_it() {
    let c = Cluster::new("pull-fails");
    if !c.real_containers_or_skip("an image must fail to pull") {
        return;
    }
    let _op = Operator::start(&c);
    c.create_ic("web", &missing_image());
    let ic = c.wait_ready("web", "False", "ImagePullFailed");
    assert_eq!(ic["status"]["podPhase"], "Pending");
    assert_eq!(ic["status"]["startTimes"], 1);
    let stuck = c
        .get_pod(&common::pod_name("web"))
        .expect("get pod")
        .expect("the pod exists, pending");
    c.set_image("web", &image());
    replaced(&c, "web", &stuck, 2);
}

#[test]
fn a_crash_looping_container_is_reported_and_its_pod_kept() {
    let c = Cluster::new("crash-loop");
    if !c.real_containers_or_skip("a container must crash") {
        return;
    }
    let _op = Operator::start(&c);
    c.create_ic("web", &crash_image());
    let ic = c.wait_ready("web", "False", "PodCrashLooping");
    assert_eq!(ic["status"]["podPhase"], "Running");
    let pod = c
        .get_pod(&common::pod_name("web"))
        .expect("get pod")
        .expect("the pod exists");
    // restartPolicy Always: the kubelet restarts the container; the pod is not ours to replace.
    assert!(
        pod["status"]["containerStatuses"][0]["restartCount"]
            .as_i64()
            .unwrap_or(0)
            >= 1
    );
    assert_eq!(ic["status"]["startTimes"], 1);
    std::thread::sleep(Duration::from_secs(1));
    let again = c.ic("web");
    assert_eq!(again["status"]["startTimes"], 1);
    assert_eq!(again["status"]["lastCountedPodUID"], uid(&pod));
    // A working image replaces it.
    c.set_image("web", &image());
    replaced(&c, "web", &pod, 2);
}

#[test]
fn a_pod_deleted_while_the_operator_was_down_is_replaced_and_counted() {
    let c = Cluster::new("deleted-while-down");
    let mut op = Operator::start(&c);
    c.create_ic("web", &image());
    let first = c.wait_converged("web", 1, |_| Ok(()));
    op.sigkill();
    assert!(c.delete_pod_with_grace(name(&first), uid(&first), Some(0)));
    op.restart();
    replaced(&c, "web", &first, 2);
    c.assert_stays_converged(&one("web", 2), Duration::from_secs(1));
}

#[test]
fn a_pod_whose_label_was_removed_gets_it_back_and_is_kept() {
    let c = Cluster::new("label-removed");
    let _op = Operator::start(&c);
    c.create_ic("web", &image());
    let first = c.wait_converged("web", 1, |_| Ok(()));
    // Our label-selected watch sees this as DELETED, although the pod lives on.
    c.patch_pod(
        name(&first),
        &json!({"metadata": {"labels": {common::MANAGED_BY: null}}}),
    );
    let back = wait_until(
        c.timeout(Duration::from_secs(30)),
        "the label to be put back",
        || {
            let p = c
                .get_pod(name(&first))
                .map_err(|e| e.to_string())?
                .ok_or("pod gone")?;
            if p["metadata"]["labels"][common::MANAGED_BY] == common::MANAGED_BY_VALUE {
                Ok(p)
            } else {
                Err(format!("labels {}", p["metadata"]["labels"]))
            }
        },
    );
    assert_eq!(uid(&back), uid(&first), "the pod was replaced");
    c.assert_stays_converged(&one("web", 1), Duration::from_secs(1));
}

#[test]
fn a_node_lost_with_its_pod_is_replaced_on_another_node() {
    let c = Cluster::new("node-lost");
    let Some(server) = c.test_server_or_skip("node-lost takes a node away") else {
        return;
    };
    server.add_node("node-spare");
    let _op = Operator::start(&c);
    c.create_ic("web", &image());
    let first = c.wait_converged("web", 1, |_| Ok(()));
    let node = first["spec"]["nodeName"]
        .as_str()
        .expect("scheduled")
        .to_string();
    assert!(server.lose_node(&node), "no node {node}");
    let second = replaced(&c, "web", &first, 2);
    assert_ne!(second["spec"]["nodeName"], node.as_str());
    // Said after the fact: the node's removal, by the pod garbage collector.
    let said = c.wait_event("PodReplaced", |m| m.contains("the previous one"));
    assert!(said.contains(" (DeletionByPodGC) "), "{said}");
    c.assert_stays_converged(&one("web", 2), Duration::from_secs(1));
}
