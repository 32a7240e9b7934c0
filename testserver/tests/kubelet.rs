//! Scenario tests of the simulated nodes over HTTPS: scheduling, the kubelet's pod lifecycle,
//! graceful deletion the 1.27+ way, eviction, activeDeadlineSeconds, the container runtime's
//! image behaviours, node loss, admission refusals, and the test controls.

mod common;

use common::{bounded, types, wait_for, Client, Events};
use kube_testserver::{KubeletOptions, Options, TestServer};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const PODS: &str = "/api/v1/namespaces/default/pods";

fn start() -> (TestServer, Client) {
    start_with(Options::default())
}

fn start_with(opts: Options) -> (TestServer, Client) {
    let server = TestServer::start(opts).expect("server starts");
    let admin = Client::admin(&server);
    (server, admin)
}

fn pod(name: &str, image: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "t"}},
        "spec": {"containers": [{"name": "acontainer", "image": image}]}})
}

const PAUSE: &str = "registry.k8s.io/pause:3.9";

fn phase(p: &Value) -> &str {
    p["status"]["phase"].as_str().unwrap_or("")
}

fn condition<'a>(p: &'a Value, kind: &str) -> &'a Value {
    p["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == kind))
        .unwrap_or(&Value::Null)
}

fn container(p: &Value) -> &Value {
    &p["status"]["containerStatuses"][0]
}

fn rv(p: &Value) -> String {
    p["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or("")
        .to_string()
}

/// Creates the pod and waits until it runs; returns it.
fn running(admin: &Client, body: &Value) -> Value {
    let name = body["metadata"]["name"].as_str().unwrap_or("");
    let r = admin.post(PODS, body);
    assert_eq!(r.code, 201, "{}", r.body);
    wait_for(
        10,
        &format!("{name} running"),
        || admin.get(&format!("{PODS}/{name}")).body,
        |p| phase(p) == "Running" && container(p)["state"]["running"].is_object(),
    )
}

/// A watch of the default namespace's pods from `from`, read on a thread.
fn watch_from(admin: &Client, from: &str) -> Events {
    admin
        .watch(&format!(
            "{PODS}?watch=true&resourceVersion={from}&timeoutSeconds=30"
        ))
        .spawn()
}

fn list_rv(admin: &Client) -> String {
    rv(&admin.get(PODS).body)
}

#[test]
fn created_pod_is_scheduled_then_created_then_running_within_a_moment() {
    bounded(20, || {
        let (_server, admin) = start();
        let from = list_rv(&admin);
        let events = watch_from(&admin, &from);
        let started = Instant::now();
        assert_eq!(admin.post(PODS, &pod("life", PAUSE)).code, 201);
        let seen = events.take(4, Duration::from_secs(5));
        let took = started.elapsed();
        assert_eq!(types(&seen), ["ADDED", "MODIFIED", "MODIFIED", "MODIFIED"]);
        let o = |i: usize| &seen[i]["object"];
        assert!(o(0)["spec"]["nodeName"].is_null());
        assert_eq!(o(1)["spec"]["nodeName"], "node-0");
        assert_eq!(condition(o(1), "PodScheduled")["status"], "True");
        assert_eq!(phase(o(2)), "Pending");
        assert_eq!(
            container(o(2))["state"]["waiting"]["reason"],
            "ContainerCreating"
        );
        assert_eq!(o(2)["status"]["hostIP"], "192.0.2.2");
        assert!(o(2)["status"]["startTime"].is_string());
        let p = o(3);
        assert_eq!(phase(p), "Running");
        assert!(p["status"]["podIP"]
            .as_str()
            .is_some_and(|ip| ip.starts_with("10.244.0.")));
        assert_eq!(condition(p, "Ready")["status"], "True");
        assert_eq!(container(p)["ready"], true);
        assert_eq!(container(p)["restartCount"], 0);
        assert!(took < Duration::from_secs(2), "running after {took:?}");
        assert!(events.more(Duration::from_millis(300)).is_empty());
    });
}

#[test]
fn graceful_delete_ends_in_succeeded_and_the_deleted_event_carries_it() {
    bounded(20, || {
        let (_server, admin) = start();
        let p = running(&admin, &pod("life", PAUSE));
        let events = watch_from(&admin, &rv(&p));
        let r = admin.delete(&format!("{PODS}/life"), None);
        assert_eq!(r.code, 200);
        assert_eq!(r.body["metadata"]["deletionGracePeriodSeconds"], 30);
        let seen = events.take(5, Duration::from_secs(5));
        assert_eq!(
            types(&seen),
            ["MODIFIED", "MODIFIED", "MODIFIED", "MODIFIED", "DELETED"]
        );
        let o = |i: usize| &seen[i]["object"];
        assert_eq!(phase(o(0)), "Running");
        assert_eq!(o(0)["metadata"]["deletionGracePeriodSeconds"], 30);
        assert_eq!(phase(o(1)), "Succeeded");
        assert!(o(1)["status"]["podIP"].is_null() && o(2)["status"]["podIP"].is_string());
        assert_eq!(condition(o(2), "Ready")["reason"], "PodCompleted");
        assert_eq!(container(o(2))["state"]["terminated"]["exitCode"], 0);
        assert_eq!(o(3)["metadata"]["deletionGracePeriodSeconds"], 0);
        assert_eq!(phase(o(4)), "Succeeded");
        assert_eq!(admin.get(&format!("{PODS}/life")).code, 404);
    });
}

#[test]
fn forced_delete_removes_the_pod_at_once_still_running() {
    bounded(20, || {
        let (_server, admin) = start();
        let p = running(&admin, &pod("forced", PAUSE));
        let events = watch_from(&admin, &rv(&p));
        let r = admin.delete(
            &format!("{PODS}/forced"),
            Some(&json!({"gracePeriodSeconds": 0, "propagationPolicy": "Background"})),
        );
        assert_eq!(r.code, 200);
        let seen = events.take(2, Duration::from_secs(5));
        assert_eq!(types(&seen), ["MODIFIED", "DELETED"]);
        assert_eq!(
            seen[0]["object"]["metadata"]["deletionGracePeriodSeconds"],
            0
        );
        assert_eq!(phase(&seen[1]["object"]), "Running");
        assert!(events.more(Duration::from_millis(200)).is_empty());
    });
}

#[test]
fn sigterm_ignoring_container_is_killed_when_the_scaled_grace_period_ends() {
    bounded(20, || {
        let (_server, admin) = start();
        let mut body = pod("stubborn", "example.com/ignore-sigterm:1");
        body["spec"]["terminationGracePeriodSeconds"] = json!(50);
        let p = running(&admin, &body);
        let events = watch_from(&admin, &rv(&p));
        let started = Instant::now();
        assert_eq!(admin.delete(&format!("{PODS}/stubborn"), None).code, 200);
        let seen = events.until(Duration::from_secs(10), |e| e["type"] == "DELETED");
        let took = started.elapsed();
        // 50 s of grace, scaled by the default 0.01.
        assert!(took >= Duration::from_millis(500), "killed after {took:?}");
        let last = &seen[seen.len() - 1]["object"];
        assert_eq!(phase(last), "Failed");
        assert_eq!(condition(last, "Ready")["reason"], "PodFailed");
        assert_eq!(container(last)["state"]["terminated"]["exitCode"], 137);
        assert_eq!(container(last)["state"]["terminated"]["reason"], "Error");
    });
}

#[test]
fn a_second_delete_may_shorten_the_grace_period_and_zero_removes_the_pod() {
    bounded(20, || {
        let (_server, admin) = start();
        let p = running(&admin, &pod("stubborn", "example.com/ignore-sigterm:1"));
        let events = watch_from(&admin, &rv(&p));
        let path = format!("{PODS}/stubborn");
        let first = admin.delete(&path, Some(&json!({"gracePeriodSeconds": 600})));
        assert_eq!(first.body["metadata"]["deletionGracePeriodSeconds"], 600);
        let longer = admin.delete(&path, Some(&json!({"gracePeriodSeconds": 900})));
        assert_eq!(
            longer.body["metadata"]["deletionGracePeriodSeconds"], 600,
            "only shorter"
        );
        let shorter = admin.delete(&path, Some(&json!({"gracePeriodSeconds": 300})));
        assert_eq!(shorter.body["metadata"]["deletionGracePeriodSeconds"], 300);
        let at = |v: &Value| {
            v["metadata"]["deletionTimestamp"]
                .as_str()
                .unwrap_or("")
                .to_string()
        };
        assert!(
            at(&shorter.body) < at(&first.body),
            "the deletion moved earlier"
        );
        let gone = admin.delete(&path, Some(&json!({"gracePeriodSeconds": 0})));
        assert_eq!(gone.code, 200);
        assert_eq!(admin.get(&path).code, 404);
        let seen = events.take(4, Duration::from_secs(5));
        assert_eq!(
            types(&seen),
            ["MODIFIED", "MODIFIED", "MODIFIED", "DELETED"]
        );
        assert_eq!(
            phase(&seen[3]["object"]),
            "Running",
            "the kubelet had not finished"
        );
    });
}

#[test]
fn unscheduled_and_terminal_pods_are_deleted_at_once() {
    bounded(20, || {
        let (server, admin) = start();
        let mut done = pod("done", "busybox");
        done["spec"]["restartPolicy"] = json!("Never");
        assert_eq!(admin.post(PODS, &done).code, 201);
        wait_for(
            10,
            "busybox to succeed",
            || admin.get(&format!("{PODS}/done")).body,
            |p| phase(p) == "Succeeded",
        );
        assert!(server.cordon("node-0"));
        assert_eq!(admin.post(PODS, &pod("unscheduled", PAUSE)).code, 201);
        wait_for(
            10,
            "unschedulable",
            || admin.get(&format!("{PODS}/unscheduled")).body,
            |p| condition(p, "PodScheduled")["reason"] == "Unschedulable",
        );
        for name in ["unscheduled", "done"] {
            let r = admin.delete(&format!("{PODS}/{name}"), None);
            assert_eq!(
                r.body["metadata"]["deletionGracePeriodSeconds"], 0,
                "{name}"
            );
            assert_eq!(admin.get(&format!("{PODS}/{name}")).code, 404, "{name}");
        }
    });
}

#[test]
fn finalizers_keep_a_terminated_pod_until_the_last_one_goes() {
    bounded(20, || {
        let (_server, admin) = start();
        let mut body = pod("held", PAUSE);
        body["metadata"]["finalizers"] = json!(["example.com/hold"]);
        running(&admin, &body);
        let path = format!("{PODS}/held");
        assert_eq!(admin.delete(&path, None).code, 200);
        let held = wait_for(
            10,
            "terminal and grace 0",
            || admin.get(&path).body,
            |p| p["metadata"]["deletionGracePeriodSeconds"] == 0,
        );
        assert_eq!(phase(&held), "Succeeded");
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(admin.get(&path).code, 200, "the finalizer holds it");
        let r = admin.merge_patch(&path, &json!({"metadata": {"finalizers": null}}));
        assert_eq!(r.code, 200);
        assert_eq!(admin.get(&path).code, 404);
    });
}

#[test]
fn eviction_marks_disruption_target_then_deletes_gracefully() {
    bounded(20, || {
        let (_server, admin) = start();
        let resources = admin.get("/api/v1").body;
        let eviction = resources["resources"]
            .as_array()
            .and_then(|rs| rs.iter().find(|r| r["name"] == "pods/eviction"))
            .cloned()
            .unwrap_or(Value::Null);
        assert_eq!(
            (&eviction["group"], &eviction["version"], &eviction["kind"]),
            (&json!("policy"), &json!("v1"), &json!("Eviction"))
        );
        let p = running(&admin, &pod("evicted", PAUSE));
        let events = watch_from(&admin, &rv(&p));
        let body = json!({"apiVersion": "policy/v1", "kind": "Eviction",
            "metadata": {"name": "evicted", "namespace": "default"}});
        let r = admin.post(&format!("{PODS}/evicted/eviction"), &body);
        assert_eq!(r.code, 201);
        assert_eq!(
            r.body,
            json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201})
        );
        let seen = events.until(Duration::from_secs(5), |e| e["type"] == "DELETED");
        assert_eq!(
            types(&seen),
            ["MODIFIED", "MODIFIED", "MODIFIED", "MODIFIED", "MODIFIED", "MODIFIED", "DELETED"]
        );
        let target = condition(&seen[0]["object"], "DisruptionTarget");
        assert_eq!(
            (&target["status"], &target["reason"], &target["message"]),
            (
                &json!("True"),
                &json!("EvictionByEvictionAPI"),
                &json!("Eviction API: evicting")
            )
        );
        assert_eq!(
            seen[2]["object"]["status"]["conditions"][0]["type"],
            "DisruptionTarget"
        );
        assert_eq!(phase(&seen[6]["object"]), "Succeeded");
        let missing = admin.post(&format!("{PODS}/evicted/eviction"), &body);
        assert_eq!(missing.code, 404);
        let mismatch = admin.post(&format!("{PODS}/other/eviction"), &body);
        assert_eq!(mismatch.code, 400);
    });
}

#[test]
fn active_deadline_fails_the_pod_which_stays() {
    bounded(20, || {
        let (_server, admin) = start();
        let p = running(&admin, &pod("deadline", PAUSE));
        let events = watch_from(&admin, &rv(&p));
        let path = format!("{PODS}/deadline");
        let r = admin.merge_patch(&path, &json!({"spec": {"activeDeadlineSeconds": 1}}));
        assert_eq!(r.code, 200, "{}", r.body);
        let seen = events.until(Duration::from_secs(5), |e| {
            e["object"]["status"]["podIP"].is_string() && phase(&e["object"]) == "Failed"
        });
        let last = &seen[seen.len() - 1]["object"];
        assert_eq!(last["status"]["reason"], "DeadlineExceeded");
        assert_eq!(
            last["status"]["message"],
            "Pod was active on the node longer than the specified deadline"
        );
        assert_eq!(condition(last, "Ready")["reason"], "PodFailed");
        assert!(container(last)["state"]["terminated"].is_object());
        let ready_false_first = seen.iter().any(|e| {
            phase(&e["object"]) == "Running"
                && condition(&e["object"], "Ready")["reason"] == "PodFailed"
        });
        assert!(ready_false_first, "{:?}", types(&seen));
        assert!(events.more(Duration::from_millis(300)).is_empty());
        assert_eq!(admin.get(&path).code, 200, "the pod stays");
    });
}

#[test]
fn a_phase_written_by_a_client_is_overwritten_by_the_kubelet() {
    bounded(20, || {
        let (_server, admin) = start_with(Options {
            kubelet: Some(KubeletOptions {
                status_sync_delay: Duration::from_millis(300),
                ..KubeletOptions::default()
            }),
            ..Options::default()
        });
        let p = running(&admin, &pod("patched", PAUSE));
        let events = watch_from(&admin, &rv(&p));
        let written = Instant::now();
        let r = admin.merge_patch(
            &format!("{PODS}/patched/status"),
            &json!({"status": {"phase": "Failed"}}),
        );
        assert_eq!(phase(&r.body), "Failed");
        let seen = events.take(2, Duration::from_secs(5));
        assert_eq!(types(&seen), ["MODIFIED", "MODIFIED"]);
        assert_eq!(phase(&seen[0]["object"]), "Failed");
        assert_eq!(phase(&seen[1]["object"]), "Running");
        assert!(written.elapsed() >= Duration::from_millis(300));
    });
}

#[test]
fn cordoned_node_leaves_pods_unschedulable_until_uncordoned_or_a_node_is_added() {
    bounded(20, || {
        let (server, admin) = start();
        assert!(server.cordon("node-0"));
        assert!(!server.cordon("no-such-node"));
        assert_eq!(admin.post(PODS, &pod("waiting", PAUSE)).code, 201);
        let path = format!("{PODS}/waiting");
        let p = wait_for(
            10,
            "unschedulable",
            || admin.get(&path).body,
            |p| !condition(p, "PodScheduled").is_null(),
        );
        let c = condition(&p, "PodScheduled");
        assert_eq!(
            (&c["status"], &c["reason"]),
            (&json!("False"), &json!("Unschedulable"))
        );
        assert_eq!(c["message"], "0/1 nodes are available: 1 node(s) were unschedulable. preemption: 0/1 nodes are available: 1 Preemption is not helpful for scheduling..");
        assert!(server.uncordon("node-0"));
        let p = wait_for(
            10,
            "running",
            || admin.get(&path).body,
            |p| phase(p) == "Running",
        );
        assert_eq!(condition(&p, "PodScheduled")["status"], "True");

        assert!(server.cordon("node-0"));
        assert_eq!(admin.post(PODS, &pod("second", PAUSE)).code, 201);
        wait_for(
            10,
            "unschedulable",
            || admin.get(&format!("{PODS}/second")).body,
            |p| condition(p, "PodScheduled")["reason"] == "Unschedulable",
        );
        assert!(server.add_node("node-1"));
        assert!(!server.add_node("node-1"));
        let p = wait_for(
            10,
            "running",
            || admin.get(&format!("{PODS}/second")).body,
            |p| phase(p) == "Running",
        );
        assert_eq!(p["spec"]["nodeName"], "node-1");
        assert_eq!(p["status"]["hostIP"], "192.0.2.3");
        assert_eq!(server.node_names(), ["node-0", "node-1"]);
    });
}

#[test]
fn pod_bound_to_a_node_that_registers_later_runs_there() {
    bounded(20, || {
        let (server, admin) = start();
        let mut body = pod("early", PAUSE);
        body["spec"]["nodeName"] = json!("node-9");
        assert_eq!(admin.post(PODS, &body).code, 201);
        std::thread::sleep(Duration::from_millis(100));
        let p = admin.get(&format!("{PODS}/early")).body;
        assert_eq!(phase(&p), "Pending");
        assert!(
            p["status"]["containerStatuses"].is_null(),
            "no kubelet runs it yet"
        );
        assert!(server.add_node("node-9"));
        let p = wait_for(
            10,
            "running",
            || admin.get(&format!("{PODS}/early")).body,
            |p| phase(p) == "Running",
        );
        assert_eq!(p["status"]["hostIP"], "192.0.2.3");
        // The kubelet reports PodScheduled too, although no scheduler bound it.
        assert_eq!(condition(&p, "PodScheduled")["status"], "True");
    });
}

#[test]
fn pods_spread_over_nodes_and_a_field_selector_finds_a_nodes_pods() {
    bounded(20, || {
        let (_server, admin) = start_with(Options {
            nodes: 2,
            ..Options::default()
        });
        for i in 0..4 {
            running(&admin, &pod(&format!("p{i}"), PAUSE));
        }
        let on = |node: &str| {
            admin
                .get(&format!(
                    "/api/v1/pods?fieldSelector=spec.nodeName%3D{node}"
                ))
                .body["items"]
                .as_array()
                .map_or(0, Vec::len)
        };
        assert_eq!((on("node-0"), on("node-1")), (2, 2));
        let (events, _) = admin
            .watch("/api/v1/pods?watch=true&fieldSelector=spec.nodeName%3Dnode-1&timeoutSeconds=1")
            .collect();
        assert_eq!(types(&events), ["ADDED", "ADDED"]);
    });
}

#[test]
fn lost_node_takes_its_pods_with_it_as_podgc_does() {
    bounded(20, || {
        let (server, admin) = start();
        let p = running(&admin, &pod("doomed", PAUSE));
        let events = watch_from(&admin, &rv(&p));
        assert!(server.lose_node("node-0"));
        assert!(!server.lose_node("node-0"));
        assert_eq!(admin.get("/api/v1/nodes/node-0").code, 404);
        assert_eq!(
            admin.get(&format!("{PODS}/doomed")).code,
            404,
            "gone before lose_node returns"
        );
        let seen = events.take(3, Duration::from_secs(5));
        assert_eq!(types(&seen), ["MODIFIED", "MODIFIED", "DELETED"]);
        let failed = &seen[0]["object"];
        assert_eq!(phase(failed), "Failed");
        let c = condition(failed, "DisruptionTarget");
        assert_eq!(
            (&c["reason"], &c["message"]),
            (
                &json!("DeletionByPodGC"),
                &json!("PodGC: node no longer exists")
            )
        );
        assert_eq!(
            seen[1]["object"]["metadata"]["deletionGracePeriodSeconds"],
            0
        );
        assert!(server.node_names().is_empty());

        // A Node deleted through the API: PodGC takes its pods the same way.
        assert!(server.add_node("node-1"));
        running(&admin, &pod("also-doomed", PAUSE));
        assert_eq!(admin.delete("/api/v1/nodes/node-1", None).code, 200);
        let gone = wait_for(
            10,
            "podgc",
            || json!(admin.get(&format!("{PODS}/also-doomed")).code),
            |c| *c == 404,
        );
        assert_eq!(gone, 404);

        assert_eq!(admin.post(PODS, &pod("nowhere", PAUSE)).code, 201);
        wait_for(
            10,
            "no nodes",
            || admin.get(&format!("{PODS}/nowhere")).body,
            |p| condition(p, "PodScheduled")["message"] == "no nodes available to schedule pods",
        );
    });
}

#[test]
fn exited_container_restarts_with_back_off_under_restart_policy_always() {
    bounded(20, || {
        let (server, admin) = start_with(Options {
            kubelet: Some(KubeletOptions {
                backoff_scale: 0.1,
                ..KubeletOptions::default()
            }),
            ..Options::default()
        });
        running(&admin, &pod("crashy", PAUSE));
        assert!(server.exit_container("default", "crashy", 2));
        let path = format!("{PODS}/crashy");
        let exited = admin.get(&path).body;
        assert_eq!(
            container(&exited)["state"]["terminated"]["exitCode"],
            2,
            "written before it returns"
        );
        assert_eq!(container(&exited)["state"]["terminated"]["reason"], "Error");
        let restarted = wait_for(
            10,
            "restart 1",
            || admin.get(&path).body,
            |p| container(p)["restartCount"] == 1 && container(p)["state"]["running"].is_object(),
        );
        assert_eq!(
            container(&restarted)["lastState"]["terminated"]["exitCode"],
            2
        );
        assert!(server.exit_container("default", "crashy", 1));
        let backing_off = wait_for(
            10,
            "back-off",
            || admin.get(&path).body,
            |p| container(p)["state"]["waiting"]["reason"] == "CrashLoopBackOff",
        );
        let uid = backing_off["metadata"]["uid"].as_str().unwrap_or("");
        assert_eq!(
            container(&backing_off)["state"]["waiting"]["message"],
            format!(
                "back-off 10s restarting failed container=acontainer pod=crashy_default({uid})"
            )
        );
        assert_eq!(phase(&backing_off), "Running");
        assert_eq!(
            condition(&backing_off, "Ready")["reason"],
            "ContainersNotReady"
        );
        assert!(
            !server.exit_container("default", "crashy", 1),
            "nothing runs during back-off"
        );
        assert!(!server.exit_container("default", "nope", 1));
        wait_for(
            10,
            "restart 2",
            || admin.get(&path).body,
            |p| container(p)["restartCount"] == 2,
        );
    });
}

#[test]
fn exited_container_under_restart_policy_never_ends_the_pod() {
    bounded(20, || {
        let (server, admin) = start();
        for (name, code, end) in [("zero", 0, "Succeeded"), ("one", 1, "Failed")] {
            let mut body = pod(name, PAUSE);
            body["spec"]["restartPolicy"] = json!("Never");
            running(&admin, &body);
            assert!(server.exit_container("default", name, code));
            let p = wait_for(
                10,
                end,
                || admin.get(&format!("{PODS}/{name}")).body,
                |p| p["status"]["podIP"].is_string() && phase(p) == end,
            );
            assert_eq!(container(&p)["state"]["terminated"]["exitCode"], code);
        }
    });
}

#[test]
fn busybox_crash_loops_and_an_unpullable_image_waits_in_back_off() {
    bounded(20, || {
        let (_server, admin) = start();
        let pulls = admin
            .watch(&format!(
                "{PODS}?watch=true&fieldSelector=metadata.name%3Dpull&timeoutSeconds=30"
            ))
            .spawn();
        assert_eq!(
            admin
                .post(PODS, &pod("loop", "docker.io/library/busybox:1.36"))
                .code,
            201
        );
        assert_eq!(
            admin
                .post(PODS, &pod("pull", "registry.example/does-not-exist:1"))
                .code,
            201
        );
        let looping = wait_for(
            10,
            "crash loop",
            || admin.get(&format!("{PODS}/loop")).body,
            |p| {
                container(p)["state"]["waiting"]["reason"] == "CrashLoopBackOff"
                    && container(p)["restartCount"].as_u64() >= Some(2)
            },
        );
        assert_eq!(phase(&looping), "Running");
        assert_eq!(
            container(&looping)["lastState"]["terminated"]["reason"],
            "Completed"
        );
        assert_eq!(
            container(&looping)["lastState"]["terminated"]["exitCode"],
            0
        );
        assert_eq!(condition(&looping, "Ready")["reason"], "ContainersNotReady");

        let seen = pulls.until(Duration::from_secs(10), |e| {
            container(&e["object"])["state"]["waiting"]["reason"] == "ImagePullBackOff"
        });
        let waiting: Vec<&Value> = seen
            .iter()
            .map(|e| &container(&e["object"])["state"]["waiting"])
            .filter(|w| w.is_object())
            .collect();
        let reasons: Vec<&str> = waiting
            .iter()
            .filter_map(|w| w["reason"].as_str())
            .collect();
        assert_eq!(
            reasons,
            ["ContainerCreating", "ErrImagePull", "ImagePullBackOff"]
        );
        assert_eq!(
            waiting[1]["message"],
            "rpc error: code = NotFound desc = failed to pull and unpack image \"registry.example/does-not-exist:1\": failed to resolve reference \"registry.example/does-not-exist:1\": registry.example/does-not-exist:1: not found"
        );
        assert_eq!(
            waiting[2]["message"],
            "Back-off pulling image \"registry.example/does-not-exist:1\""
        );
        let last = &seen[seen.len() - 1]["object"];
        assert_eq!(phase(last), "Pending");
        assert_eq!(condition(last, "Ready")["reason"], "ContainersNotReady");
    });
}

#[test]
fn nodes_are_served_and_kubectl_gets_cordons_and_drains_them() {
    bounded(60, || {
        let (server, admin) = start_with(Options {
            nodes: 2,
            ..Options::default()
        });
        let list = admin.get("/api/v1/nodes").body;
        assert_eq!(list["kind"], "NodeList");
        assert_eq!(list["items"].as_array().map(Vec::len), Some(2));
        let node = admin.get("/api/v1/nodes/node-0").body;
        assert_eq!(node["status"]["nodeInfo"]["kubeletVersion"], "v1.28.7");
        let r = admin.send(
            "PATCH",
            "/api/v1/nodes/node-1",
            Some("application/strategic-merge-patch+json"),
            Some(r#"{"spec":{"unschedulable":true}}"#),
        );
        assert_eq!(r.body["spec"]["unschedulable"], true);
        assert!(server.uncordon("node-1"));
        assert!(admin.get("/api/v1/nodes/node-1").body["spec"]["unschedulable"].is_null());

        if std::process::Command::new("kubectl")
            .arg("version")
            .arg("--client")
            .output()
            .is_err()
        {
            eprintln!("kubectl not installed; skipping the kubectl part");
            return;
        }
        let kubectl = |args: &[&str]| {
            let out = std::process::Command::new("kubectl")
                .args(args)
                .arg("--request-timeout=20s")
                .env("KUBECONFIG", server.kubeconfig_path())
                .env("HOME", server.kubeconfig_path().parent().expect("dir"))
                .output()
                .expect("kubectl runs");
            (
                out.status.success(),
                String::from_utf8_lossy(&out.stdout).to_string()
                    + &String::from_utf8_lossy(&out.stderr),
            )
        };
        running(&admin, &pod("on-0", PAUSE));
        running(&admin, &pod("on-1", PAUSE));
        let (ok, out) = kubectl(&["get", "nodes"]);
        assert!(
            ok && out.contains("node-0") && out.contains("Ready") && out.contains("v1.28.7"),
            "{out}"
        );
        let (ok, out) = kubectl(&["cordon", "node-0"]);
        assert!(ok, "{out}");
        let (ok, out) = kubectl(&["get", "nodes"]);
        assert!(ok && out.contains("Ready,SchedulingDisabled"), "{out}");
        let (ok, out) = kubectl(&["uncordon", "node-0"]);
        assert!(ok, "{out}");
        let (ok, out) = kubectl(&["get", "pods", "-o", "wide"]);
        assert!(
            ok && out.contains("Running") && out.contains("node-"),
            "{out}"
        );
        let (ok, out) = kubectl(&[
            "drain",
            "node-0",
            "--ignore-daemonsets",
            "--force",
            "--timeout=20s",
        ]);
        assert!(ok && out.contains("drained"), "{out}");
        let left = admin
            .get("/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-0")
            .body;
        assert_eq!(left["items"].as_array().map(Vec::len), Some(0), "{left}");
        assert_eq!(
            admin.get("/api/v1/nodes/node-0").body["spec"]["unschedulable"],
            true
        );
    });
}

#[test]
fn restricted_namespace_and_pod_quota_refuse_pods_with_403() {
    bounded(20, || {
        let (_server, admin) = start();
        let ns = json!({"metadata": {"name": "locked", "labels": {"pod-security.kubernetes.io/enforce": "restricted"}}});
        assert_eq!(admin.post("/api/v1/namespaces", &ns).code, 201);
        let r = admin.post("/api/v1/namespaces/locked/pods", &pod("psa", PAUSE));
        assert_eq!(r.code, 403);
        assert_eq!(r.body["reason"], "Forbidden");
        assert!(
            r.body["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("pods \"psa\" is forbidden: violates PodSecurity \"restricted:latest\": allowPrivilegeEscalation != false")),
            "{}",
            r.body
        );
        let mut ok = pod("fine", PAUSE);
        ok["spec"]["securityContext"] =
            json!({"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}});
        ok["spec"]["containers"][0]["securityContext"] =
            json!({"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}});
        assert_eq!(admin.post("/api/v1/namespaces/locked/pods", &ok).code, 201);

        let quotas = "/api/v1/namespaces/default/resourcequotas";
        running(&admin, &pod("first", PAUSE));
        let q = admin.post(
            quotas,
            &json!({"metadata": {"name": "two-pods"}, "spec": {"hard": {"pods": "2"}}}),
        );
        assert_eq!(q.code, 201, "{}", q.body);
        assert_eq!(q.body["status"]["used"]["pods"], "1");
        assert_eq!(admin.post(PODS, &pod("second", PAUSE)).code, 201);
        let over = admin.post(PODS, &pod("third", PAUSE));
        assert_eq!(over.code, 403);
        assert_eq!(
            over.body["message"],
            "pods \"third\" is forbidden: exceeded quota: two-pods, requested: pods=1, used: pods=2, limited: pods=2"
        );
        assert_eq!(
            over.body["details"],
            json!({"name": "third", "kind": "pods"})
        );
        assert_eq!(
            admin.get(&format!("{quotas}/two-pods")).body["status"]["used"]["pods"],
            "2"
        );
        // A pod that ended no longer counts.
        admin.delete(
            &format!("{PODS}/second"),
            Some(&json!({"gracePeriodSeconds": 0})),
        );
        assert_eq!(admin.post(PODS, &pod("third", PAUSE)).code, 201);
        assert_eq!(admin.delete(&format!("{quotas}/two-pods"), None).code, 200);
    });
}

#[test]
fn without_kubelets_pods_stay_pending_and_deletes_are_immediate() {
    bounded(20, || {
        let (server, admin) = start_with(Options {
            kubelet: None,
            ..Options::default()
        });
        assert_eq!(server.node_names(), ["node-0"]);
        assert_eq!(admin.post(PODS, &pod("idle", PAUSE)).code, 201);
        std::thread::sleep(Duration::from_millis(200));
        let p = admin.get(&format!("{PODS}/idle")).body;
        assert_eq!(phase(&p), "Pending");
        assert!(p["spec"]["nodeName"].is_null());
        assert!(!server.exit_container("default", "idle", 1));
        let r = admin.delete(&format!("{PODS}/idle"), None);
        assert_eq!(r.body["metadata"]["deletionGracePeriodSeconds"], 0);
        assert_eq!(admin.get(&format!("{PODS}/idle")).code, 404);
    });
}

#[test]
fn init_containers_complete_in_order_and_every_container_has_a_status() {
    let (server, admin) = start();
    let mut body = pod("init", PAUSE);
    body["spec"]["initContainers"] = json!([
        {"name": "migrate", "image": "busybox:1.36"},
        {"name": "wait-db", "image": PAUSE}]);
    body["spec"]["containers"] = json!([
        {"name": "acontainer", "image": PAUSE},
        {"name": "sidecar", "image": "nginx:1.27"}]);
    assert_eq!(admin.post(PODS, &body).code, 201);
    let path = format!("{PODS}/init");
    let waiting = wait_for(
        10,
        "the second init container running",
        || admin.get(&path).body,
        |p| p["status"]["initContainerStatuses"][1]["state"]["running"].is_object(),
    );
    assert_eq!(phase(&waiting), "Pending");
    assert_eq!(
        waiting["status"]["initContainerStatuses"][0]["state"]["terminated"]["reason"],
        "Completed"
    );
    assert_eq!(
        condition(&waiting, "Initialized")["message"],
        "containers with incomplete status: [wait-db]"
    );
    for c in waiting["status"]["containerStatuses"]
        .as_array()
        .expect("statuses")
    {
        assert_eq!(c["state"]["waiting"]["reason"], "PodInitializing", "{c}");
    }
    assert!(server.exit_container("default", "init", 0));
    let up = wait_for(
        10,
        "every container running",
        || admin.get(&path).body,
        |p| phase(p) == "Running" && condition(p, "Ready")["status"] == "True",
    );
    let names: Vec<&str> = up["status"]["containerStatuses"]
        .as_array()
        .expect("statuses")
        .iter()
        .map(|c| c["name"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(names, ["acontainer", "sidecar"]);
    assert_eq!(up["status"]["initContainerStatuses"][1]["ready"], true);
    assert_eq!(condition(&up, "Initialized")["status"], "True");
}

/// KEP-753 with the SidecarContainers gate (the default): the sidecar keeps its
/// `restartPolicy`, starts before the containers, and a restart of it is its own; without the
/// gate, as v1.28 by default, the field is dropped and it is an init container like any.
#[test]
fn a_native_sidecar_runs_beside_the_containers_only_with_the_gate() {
    let sidecar = |body: &mut Value| {
        body["spec"]["initContainers"] =
            json!([{"name": "log", "image": PAUSE, "restartPolicy": "Always"}]);
    };
    let (server, admin) = start();
    let mut body = pod("side", PAUSE);
    sidecar(&mut body);
    let r = admin.post(PODS, &body);
    assert_eq!(r.code, 201, "{}", r.body);
    assert_eq!(
        r.body["spec"]["initContainers"][0]["restartPolicy"],
        "Always"
    );
    let path = format!("{PODS}/side");
    let up = wait_for(
        10,
        "the pod ready with its sidecar",
        || admin.get(&path).body,
        |p| condition(p, "Ready")["status"] == "True",
    );
    assert_eq!(phase(&up), "Running");
    assert_eq!(up["status"]["initContainerStatuses"][0]["ready"], true);
    assert!(server.exit_named_container("default", "side", "log", 1));
    let again = wait_for(
        10,
        "the sidecar restarted",
        || admin.get(&path).body,
        |p| {
            p["status"]["initContainerStatuses"][0]["restartCount"] == 1
                && condition(p, "Ready")["status"] == "True"
        },
    );
    assert_eq!(container(&again)["restartCount"], 0, "acontainer ran on");

    let (_server, admin) = start_with(Options {
        sidecar_containers: false,
        ..Options::default()
    });
    let mut body = pod("side", PAUSE);
    sidecar(&mut body);
    let r = admin.post(PODS, &body);
    assert_eq!(r.code, 201, "{}", r.body);
    assert!(
        r.body["spec"]["initContainers"][0]["restartPolicy"].is_null(),
        "dropped"
    );
    assert!(r.warnings.is_empty(), "in silence: {:?}", r.warnings);
    let waiting = wait_for(
        10,
        "the init container running",
        || admin.get(&path).body,
        |p| p["status"]["initContainerStatuses"][0]["state"]["running"].is_object(),
    );
    assert_eq!(
        phase(&waiting),
        "Pending",
        "it holds the pod in its init phase"
    );
}

#[test]
fn an_image_reference_that_does_not_parse_waits_invalid_image_name() {
    let (_server, admin) = start();
    assert_eq!(
        admin.post(PODS, &pod("bad-ref", "NGINX:::Latest@@")).code,
        201
    );
    let p = wait_for(
        10,
        "InvalidImageName",
        || admin.get(&format!("{PODS}/bad-ref")).body,
        |p| container(p)["state"]["waiting"]["reason"] == "InvalidImageName",
    );
    assert_eq!(phase(&p), "Pending");
    assert!(container(&p)["state"]["waiting"]["message"]
        .as_str()
        .is_some_and(
            |m| m.ends_with("invalid reference format: repository name must be lowercase")
        ));
}

#[test]
fn mutate_pods_adds_a_sidecar_and_a_label_to_pods_created_through_the_api() {
    let (server, admin) = start();
    server.mutate_pods(json!({
        "metadata": {"labels": {"injected": "true"}, "annotations": {"mesh/version": "1"}},
        "spec": {"containers": [{"name": "proxy", "image": "registry.k8s.io/pause:3.9"}]}}));
    let p = running(&admin, &pod("meshed", PAUSE));
    assert_eq!(
        p["metadata"]["labels"],
        json!({"app": "t", "injected": "true"})
    );
    assert_eq!(p["metadata"]["annotations"]["mesh/version"], "1");
    let names: Vec<&str> = p["spec"]["containers"]
        .as_array()
        .expect("containers")
        .iter()
        .map(|c| c["name"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(names, ["acontainer", "proxy"]);
    assert_eq!(
        p["spec"]["containers"][1]["imagePullPolicy"], "IfNotPresent",
        "defaulted"
    );
    let up = wait_for(
        10,
        "both containers running",
        || admin.get(&format!("{PODS}/meshed")).body,
        |p| {
            p["status"]["containerStatuses"]
                .as_array()
                .is_some_and(|s| s.len() == 2 && s.iter().all(|c| c["ready"] == true))
        },
    );
    assert_eq!(up["status"]["containerStatuses"][1]["name"], "proxy");
    server.clear_pod_mutations();
    let plain = running(&admin, &pod("plain", PAUSE));
    assert_eq!(
        plain["spec"]["containers"].as_array().map(Vec::len),
        Some(1)
    );
}
