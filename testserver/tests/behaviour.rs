//! Scenario tests of the server over HTTPS: watches (410, bookmarks, timeout, drops,
//! selectors), garbage collection, auth, fault injection, listener restarts, optimistic
//! concurrency and the status subresource.

mod common;

use common::{bounded, ic_body, pod_body, start_without_kubelet, types, Client, End, IC};
use kube_testserver::{FailRule, Options, Rule, StallRule, TestServer};
use serde_json::json;
use std::time::{Duration, Instant};

const PODS: &str = "/api/v1/namespaces/default/pods";

fn ics() -> String {
    format!("{IC}/namespaces/default/immortalcontainers")
}

fn start() -> (TestServer, Client) {
    let server = TestServer::start(Options::default()).expect("server starts");
    let admin = Client::admin(&server);
    (server, admin)
}

fn rv_of(v: &serde_json::Value) -> String {
    v["metadata"]["resourceVersion"]
        .as_str()
        .expect("resourceVersion")
        .to_string()
}

#[test]
fn watch_from_expired_version_gets_one_410_error_event_then_clean_end() {
    bounded(20, || {
        let (server, admin) = start();
        let old = rv_of(&admin.post(PODS, &pod_body("a", None)).body);
        admin.post(PODS, &pod_body("b", None));
        server.expire_all();
        let w = admin.watch(&format!(
            "{PODS}?watch=true&resourceVersion={old}&timeoutSeconds=5"
        ));
        let (events, end) = w.collect();
        assert_eq!(end, End::Clean);
        assert_eq!(types(&events), vec!["ERROR"]);
        let status = &events[0]["object"];
        assert_eq!(status["code"], 410);
        assert_eq!(status["reason"], "Expired");
        let msg = status["message"].as_str().unwrap_or("");
        assert!(
            msg.starts_with(&format!("too old resource version: {old} (")),
            "{msg}"
        );
    });
}

#[test]
fn history_capacity_expires_versions_that_fell_out() {
    bounded(20, || {
        let server = TestServer::start(Options {
            history: 2,
            ..Options::default()
        })
        .expect("server");
        let admin = Client::admin(&server);
        let first = rv_of(&admin.post(PODS, &pod_body("a", None)).body);
        for n in ["b", "c", "d"] {
            admin.post(PODS, &pod_body(n, None));
        }
        let (events, _) = admin
            .watch(&format!(
                "{PODS}?watch=true&resourceVersion={first}&timeoutSeconds=2"
            ))
            .collect();
        assert_eq!(types(&events), vec!["ERROR"]);
    });
}

#[test]
fn watch_resumes_with_every_event_after_the_version() {
    bounded(20, || {
        let (_server, admin) = start_without_kubelet();
        let from = rv_of(&admin.post(PODS, &pod_body("a", None)).body);
        admin.post(PODS, &pod_body("b", None));
        admin.send(
            "PATCH",
            &format!("{PODS}/a"),
            Some("application/merge-patch+json"),
            Some(r#"{"metadata":{"labels":{"x":"y"}}}"#),
        );
        let (events, end) = admin
            .watch(&format!(
                "{PODS}?watch=true&resourceVersion={from}&timeoutSeconds=1"
            ))
            .collect();
        assert_eq!(end, End::Clean);
        assert_eq!(types(&events), vec!["ADDED", "MODIFIED"]);
        assert_eq!(events[0]["object"]["kind"], "Pod");
        assert_eq!(events[0]["object"]["apiVersion"], "v1");
    });
}

#[test]
fn watch_without_version_replays_existing_objects_as_added() {
    bounded(20, || {
        let (_server, admin) = start_without_kubelet();
        admin.post(PODS, &pod_body("a", None));
        admin.post(PODS, &pod_body("b", None));
        admin.post(
            "/api/v1/namespaces/kube-system/pods",
            &pod_body("elsewhere", None),
        );
        let (events, _) = admin
            .watch(&format!("{PODS}?watch=true&timeoutSeconds=1"))
            .collect();
        assert_eq!(types(&events), vec!["ADDED", "ADDED"]);
        let (all, _) = admin
            .watch("/api/v1/pods?watch=1&resourceVersion=0&timeoutSeconds=1")
            .collect();
        assert_eq!(all.len(), 3);
    });
}

#[test]
fn bookmarks_carry_the_current_version_only() {
    bounded(20, || {
        let (_server, admin) = start_without_kubelet();
        let w = admin.watch(&format!(
            "{PODS}?watch=true&allowWatchBookmarks=true&timeoutSeconds=4"
        ));
        std::thread::sleep(Duration::from_millis(300));
        let created = admin.post(
            "/api/v1/namespaces/kube-system/pods",
            &pod_body("other-ns", None),
        );
        let (events, end) = w.collect();
        assert_eq!(end, End::Clean);
        assert!(
            !events.is_empty() && types(&events).iter().all(|t| t == "BOOKMARK"),
            "{:?}",
            types(&events)
        );
        let b = &events[events.len() - 1]["object"];
        assert_eq!(
            b,
            &json!({"kind": "Pod", "apiVersion": "v1",
            "metadata": {"resourceVersion": rv_of(&created.body), "creationTimestamp": null},
            "spec": {"containers": null}, "status": {}})
        );
    });
}

#[test]
fn a_watch_from_a_version_not_reached_says_nothing_not_even_a_bookmark() {
    // What kube-apiserver 1.28 answers (fixtures kube-1.28-kubelet/52, 55): 200, then
    // nothing until its timeout, though objects change meanwhile (below its version).
    bounded(20, || {
        let (_server, admin) = start_without_kubelet();
        let now: u64 = rv_of(&admin.post(PODS, &pod_body("a", None)).body)
            .parse()
            .expect("a number");
        let w = admin.watch(&format!(
            "{PODS}?watch=true&allowWatchBookmarks=true&resourceVersion={}&timeoutSeconds=3",
            now + 1000
        ));
        std::thread::sleep(Duration::from_millis(300));
        admin.post(PODS, &pod_body("b", None));
        let (events, end) = w.collect();
        assert_eq!(end, End::Clean);
        assert!(events.is_empty(), "{events:?}");
    });
}

#[test]
fn after_a_restore_versions_start_again_from_the_snapshots() {
    bounded(20, || {
        let (server, admin) = start_without_kubelet();
        let made = admin.post(PODS, &pod_body("a", None)).body;
        let snapshot = server.snapshot();
        admin.post(PODS, &pod_body("b", None));
        let later = rv_of(&admin.get(PODS).body);
        server.restore(&snapshot);
        let listed = admin.get(PODS).body;
        assert_eq!(rv_of(&listed), rv_of(&made), "the snapshot's version");
        assert!(rv_of(&listed).parse::<u64>().unwrap() < later.parse::<u64>().unwrap());
        let names: Vec<_> = listed["items"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|p| p["metadata"]["name"].clone())
            .collect();
        assert_eq!(names, [json!("a")], "b was made after the snapshot");
        // Nothing from before the snapshot can be watched from; from the snapshot, the next
        // change comes.
        let (events, _) = admin
            .watch(&format!(
                "{PODS}?watch=true&resourceVersion=1&timeoutSeconds=1"
            ))
            .collect();
        assert_eq!(types(&events), vec!["ERROR"]);
        let w = admin.watch(&format!(
            "{PODS}?watch=true&resourceVersion={}&timeoutSeconds=1",
            rv_of(&made)
        ));
        admin.post(PODS, &pod_body("c", None));
        let (events, _) = w.collect();
        assert_eq!(types(&events), vec!["ADDED"]);
    });
}

#[test]
fn custom_resource_bookmark_is_kind_apiversion_and_version() {
    bounded(20, || {
        let (_server, admin) = start();
        let (events, _) = admin
            .watch(&format!(
                "{IC}/immortalcontainers?watch=true&allowWatchBookmarks=true&timeoutSeconds=3"
            ))
            .collect();
        assert_eq!(types(&events), vec!["BOOKMARK"]);
        let o = &events[0]["object"];
        assert_eq!(o["kind"], "ImmortalContainer");
        assert_eq!(o["apiVersion"], "immortalcontainer.flugel.it/v1alpha1");
        assert_eq!(o["metadata"].as_object().map(|m| m.len()), Some(1));
    });
}

#[test]
fn watch_timeout_ends_the_stream_cleanly_and_keeps_the_connection_usable() {
    bounded(20, || {
        let (_server, admin) = start();
        let started = Instant::now();
        let w = admin.watch(&format!("{PODS}?watch=true&timeoutSeconds=1"));
        assert!(w.chunked.contains("chunked"));
        assert_eq!(w.content_type, "application/json");
        let (events, end) = w.collect();
        let took = started.elapsed();
        assert!(events.is_empty());
        assert_eq!(end, End::Clean);
        assert!(
            took >= Duration::from_millis(900) && took < Duration::from_secs(3),
            "{took:?}"
        );
        assert_eq!(admin.get(PODS).code, 200);
    });
}

#[test]
fn drop_watches_breaks_streams_without_the_final_chunk() {
    bounded(20, || {
        let (server, admin) = start();
        let w = admin.watch(&format!("{PODS}?watch=true&timeoutSeconds=30"));
        let deadline = Instant::now() + Duration::from_secs(5);
        while server.open_watches() != 1 {
            assert!(Instant::now() < deadline, "watch never registered");
            std::thread::sleep(Duration::from_millis(10));
        }
        server.drop_watches();
        let (_, end) = w.collect();
        assert!(matches!(end, End::Broken(_)), "{end:?}");
        assert_eq!(server.open_watches(), 0);
    });
}

#[test]
fn a_frozen_watch_sends_nothing_until_thawed_while_a_newer_watch_is_served() {
    bounded(30, || {
        let (server, admin) = start_without_kubelet();
        let watch = || {
            admin
                .watch(&format!(
                    "{PODS}?watch=true&allowWatchBookmarks=true&timeoutSeconds=30"
                ))
                .spawn()
        };
        let wait_open = |n: usize| {
            let deadline = Instant::now() + Duration::from_secs(5);
            while server.open_watches() != n {
                assert!(Instant::now() < deadline, "watch never registered");
                std::thread::sleep(Duration::from_millis(10));
            }
        };
        let frozen = watch();
        wait_open(1);
        server.freeze_watches();
        let fresh = watch();
        wait_open(2);
        admin.post(PODS, &pod_body("a", None));
        let seen = fresh.take(1, Duration::from_secs(5));
        assert_eq!(types(&seen), vec!["ADDED"], "the newer watch is served");
        // Bookmarks are due every second: 2.5 s of silence means the freeze holds them too.
        assert_eq!(frozen.any(Duration::from_millis(2500)), None);
        assert_eq!(server.open_watches(), 2, "the frozen stream stays open");
        server.thaw_watches();
        let held = frozen.take(1, Duration::from_secs(5));
        assert_eq!(
            types(&held),
            vec!["ADDED"],
            "what the freeze held comes after it"
        );
    });
}

#[test]
fn label_selector_watch_sees_relabel_as_added_and_deleted() {
    bounded(20, || {
        let (_server, admin) = start_without_kubelet();
        admin.post(PODS, &pod_body("a", None));
        let w = admin.watch(&format!(
            "{PODS}?watch=true&labelSelector=app%3Dweb&resourceVersion=1&timeoutSeconds=2"
        ));
        let label = |v: Option<&str>| {
            let body = json!({"metadata": {"labels": {"app": v}}}).to_string();
            let r = admin.send(
                "PATCH",
                &format!("{PODS}/a"),
                Some("application/merge-patch+json"),
                Some(&body),
            );
            assert_eq!(r.code, 200);
        };
        label(Some("web"));
        label(Some("db"));
        let (events, _) = w.collect();
        assert_eq!(types(&events), vec!["ADDED", "DELETED"]);
        assert_eq!(events[1]["object"]["metadata"]["labels"]["app"], "web");
    });
}

#[test]
fn without_kubelets_pod_delete_is_modified_with_grace_0_then_deleted() {
    bounded(20, || {
        let (_server, admin) = start_without_kubelet();
        let rv = rv_of(&admin.post(PODS, &pod_body("a", None)).body);
        let w = admin.watch(&format!(
            "{PODS}?watch=true&resourceVersion={rv}&timeoutSeconds=1"
        ));
        let r = admin.delete(
            &format!("{PODS}/a"),
            Some(&json!({"gracePeriodSeconds": 30, "propagationPolicy": "Background"})),
        );
        assert_eq!(r.code, 200);
        assert_eq!(r.body["kind"], "Pod");
        let (events, _) = w.collect();
        assert_eq!(types(&events), vec!["MODIFIED", "DELETED"]);
        assert_eq!(
            events[0]["object"]["metadata"]["deletionGracePeriodSeconds"],
            0
        );
        assert!(events[0]["object"]["metadata"]["deletionTimestamp"].is_string());
        assert_eq!(admin.get(&format!("{PODS}/a")).code, 404);
    });
}

/// Waits until the pod's phase is `phase`; returns the pod.
fn wait_phase(admin: &Client, path: &str, phase: &str) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let p = admin.get(path);
        if p.body["status"]["phase"] == phase {
            return p.body;
        }
        assert!(
            Instant::now() < deadline,
            "{path} never {phase}: {}",
            p.body
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn pod_owned_by_deleted_immortalcontainer_is_garbage_collected_gracefully() {
    bounded(20, || {
        let (_server, admin) = start();
        let ic = admin.post(&ics(), &ic_body("example", "nginx"));
        let uid = ic.body["metadata"]["uid"]
            .as_str()
            .expect("uid")
            .to_string();
        let pod = admin.post(
            PODS,
            &pod_body("example-immortalpod", Some(("example", &uid))),
        );
        assert_eq!(pod.code, 201);
        let running = wait_phase(&admin, &format!("{PODS}/example-immortalpod"), "Running");
        let w = admin.watch(&format!(
            "{PODS}?watch=true&resourceVersion={}&timeoutSeconds=2",
            rv_of(&running)
        ));
        let r = admin.delete(&format!("{}/example", ics()), None);
        assert_eq!(r.code, 200);
        assert_eq!(r.body["kind"], "Status");
        assert_eq!(r.body["status"], "Success");
        let (events, _) = w.collect();
        // The garbage collector deletes with the pod's own grace period; the kubelet ends it.
        assert_eq!(
            types(&events),
            vec!["MODIFIED", "MODIFIED", "MODIFIED", "MODIFIED", "DELETED"]
        );
        assert_eq!(
            events[0]["object"]["metadata"]["deletionGracePeriodSeconds"],
            30
        );
        assert_eq!(events[4]["object"]["status"]["phase"], "Succeeded");
        assert_eq!(
            events[4]["object"]["metadata"]["name"],
            "example-immortalpod"
        );
    });
}

#[test]
fn pod_created_for_an_already_deleted_owner_is_collected() {
    bounded(20, || {
        let (_server, admin) = start();
        let r = admin.post(
            PODS,
            &pod_body(
                "orphan",
                Some(("gone", "00000000-0000-4000-8000-000000000000")),
            ),
        );
        assert_eq!(r.code, 201);
        let deadline = Instant::now() + Duration::from_secs(5);
        while admin.get(&format!("{PODS}/orphan")).code != 404 {
            assert!(Instant::now() < deadline, "dangling pod was not collected");
            std::thread::sleep(Duration::from_millis(20));
        }
    });
}

#[test]
fn orphan_propagation_keeps_dependents_without_owner_reference() {
    bounded(20, || {
        let (_server, admin) = start();
        let uid = admin.post(&ics(), &ic_body("o", "nginx")).body["metadata"]["uid"]
            .as_str()
            .expect("uid")
            .to_string();
        admin.post(PODS, &pod_body("kept", Some(("o", &uid))));
        admin.delete(&format!("{}/o?propagationPolicy=Orphan", ics()), None);
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let p = admin.get(&format!("{PODS}/kept"));
            assert_eq!(p.code, 200);
            if p.body["metadata"]["ownerReferences"].is_null() {
                break;
            }
            assert!(Instant::now() < deadline, "owner reference not removed");
            std::thread::sleep(Duration::from_millis(20));
        }
    });
}

#[test]
fn unknown_token_is_401_and_missing_rule_is_403() {
    bounded(20, || {
        let (server, _admin) = start();
        let r = Client::new(&server, "").get(PODS);
        assert_eq!(r.code, 401);
        assert_eq!(r.body["reason"], "Unauthorized");
        server.add_user(
            "operator",
            "op-token",
            vec![
                Rule::new(&["get", "list", "watch"], &["pods"]),
                Rule::new(&["patch"], &["immortalcontainers/status"]),
            ],
        );
        let op = Client::new(&server, "op-token");
        assert_eq!(op.get(PODS).code, 200);
        assert_eq!(
            op.get("/apis").code,
            200,
            "discovery is open to every authenticated user"
        );
        let r = op.post(PODS, &pod_body("x", None));
        assert_eq!(r.code, 403);
        assert_eq!(r.body["reason"], "Forbidden");
        assert_eq!(
            r.body["message"],
            "pods is forbidden: User \"operator\" cannot create resource \"pods\" in API group \"\" in the namespace \"default\""
        );
        let r = op.merge_patch(&format!("{}/x", ics()), &json!({"spec": {"image": "a"}}));
        assert_eq!(r.code, 403);
        assert_eq!(
            r.body["message"],
            "immortalcontainers.immortalcontainer.flugel.it \"x\" is forbidden: User \"operator\" cannot patch resource \"immortalcontainers\" in API group \"immortalcontainer.flugel.it\" in the namespace \"default\""
        );
        assert_eq!(
            op.merge_patch(&format!("{}/x/status", ics()), &json!({"status": {}}))
                .code,
            404
        );
    });
}

#[test]
fn rules_edited_at_runtime_refuse_what_was_allowed_with_the_rbac_message() {
    bounded(20, || {
        let (server, admin) = start();
        server.add_user(
            "operator",
            "op-token",
            vec![Rule::new(&["*"], &["immortalcontainers/status", "pods"])],
        );
        let op = Client::new(&server, "op-token");
        assert_eq!(op.get(PODS).code, 200);
        let watch = op
            .watch(&format!(
                "{PODS}?watch=true&resourceVersion=1&timeoutSeconds=10"
            ))
            .spawn();
        // As when the ClusterRole bound to the operator loses `pods`.
        assert!(server.set_rules(
            "operator",
            vec![Rule::new(&["*"], &["immortalcontainers/status"])]
        ));
        assert!(!server.set_rules("nobody", Vec::new()));
        let r = op.get(PODS);
        assert_eq!(r.code, 403);
        assert_eq!(
            r.body["message"],
            "pods is forbidden: User \"operator\" cannot list resource \"pods\" in API group \"\" in the namespace \"default\""
        );
        // Authorization happens when a request arrives: the watch opened before goes on.
        assert_eq!(admin.post(PODS, &pod_body("seen", None)).code, 201);
        let seen = watch.until(Duration::from_secs(5), |e| {
            e["type"] == "ADDED" && e["object"]["metadata"]["name"] == "seen"
        });
        assert!(
            seen.last().is_some_and(|e| e["type"] == "ADDED"),
            "{seen:?}"
        );
        // And back, as when the role is restored.
        assert!(server.set_rules("operator", vec![Rule::new(&["list"], &["pods"])]));
        assert_eq!(op.get(PODS).code, 200);
    });
}

#[test]
fn fail_next_answers_injected_status_with_retry_after_then_recovers() {
    bounded(20, || {
        let (server, admin) = start();
        server.fail_next(FailRule {
            count: 2,
            status: 429,
            retry_after: Some(1),
            verb: Some("list".into()),
            path_contains: Some("/pods".into()),
        });
        assert_eq!(
            admin.get(&format!("{PODS}/missing")).code,
            404,
            "a get does not match a list rule"
        );
        for _ in 0..2 {
            let r = admin.get(PODS);
            assert_eq!(r.code, 429);
            assert_eq!(r.body["reason"], "TooManyRequests");
            assert_eq!(r.retry_after.as_deref(), Some("1"));
        }
        assert_eq!(admin.get(PODS).code, 200);
        server.fail_next(FailRule {
            status: 503,
            ..FailRule::default()
        });
        let r = admin.get(&ics());
        assert_eq!(
            (r.code, r.body["reason"].as_str()),
            (503, Some("ServiceUnavailable"))
        );
        assert_eq!(r.retry_after, None);
    });
}

#[test]
fn fail_for_fails_every_matching_request_for_its_duration_then_recovers() {
    bounded(20, || {
        let (server, admin) = start();
        server.fail_for(
            FailRule {
                status: 503,
                verb: Some("list".into()),
                ..FailRule::default()
            },
            Duration::from_millis(500),
        );
        for _ in 0..3 {
            assert_eq!(admin.get(PODS).code, 503);
        }
        assert_eq!(admin.post(PODS, &pod_body("a", None)).code, 201);
        std::thread::sleep(Duration::from_millis(600));
        assert_eq!(admin.get(PODS).code, 200);
    });
}

#[test]
fn stop_listening_refuses_connections_and_start_listening_keeps_data() {
    bounded(30, || {
        let (server, admin) = start();
        admin.post(PODS, &pod_body("survivor", None));
        let w = admin.watch(&format!("{PODS}?watch=true&timeoutSeconds=30"));
        server.stop_listening();
        let (_, end) = w.collect();
        assert!(
            matches!(end, End::Broken(_)),
            "open watch should break: {end:?}"
        );
        assert!(
            admin.try_send("GET", PODS, None, None).is_err(),
            "no listener while stopped"
        );
        server.start_listening().expect("listen again");
        let r = admin.get(&format!("{PODS}/survivor"));
        assert_eq!(r.code, 200);
    });
}

#[test]
fn merge_patch_with_stale_resource_version_conflicts() {
    bounded(20, || {
        let (_server, admin) = start_without_kubelet();
        let stale = rv_of(&admin.post(PODS, &pod_body("a", None)).body);
        let patch = |rv: &str, v: &str| {
            let body = json!({"metadata": {"resourceVersion": rv, "labels": {"v": v}}}).to_string();
            admin.send(
                "PATCH",
                &format!("{PODS}/a"),
                Some("application/merge-patch+json"),
                Some(&body),
            )
        };
        let fresh = patch(&stale, "1");
        assert_eq!(fresh.code, 200);
        let r = patch(&stale, "2");
        assert_eq!(r.code, 409);
        assert_eq!(r.body["reason"], "Conflict");
        assert_eq!(patch(&rv_of(&fresh.body), "2").code, 200);
    });
}

/// The Status a real server answers a patch whose `metadata.uid` is not the object's: 422
/// Invalid, the uid named immutable, twice in the causes (fixture kube-1.28-kubelet/18).
fn assert_uid_immutable(r: &common::Resp, kind_label: &str, name: &str, uid: &str) {
    assert_eq!(r.code, 422, "{}", r.body);
    assert_eq!(r.body["reason"], "Invalid");
    assert_eq!(
        r.body["message"],
        format!("{kind_label} {name:?} is invalid: metadata.uid: Invalid value: {uid:?}: field is immutable")
    );
    let cause = json!({"reason": "FieldValueInvalid",
        "message": format!("Invalid value: {uid:?}: field is immutable"), "field": "metadata.uid"});
    assert_eq!(r.body["details"]["causes"], json!([cause, cause]));
}

#[test]
fn a_patch_naming_another_uid_is_invalid_and_removes_one_finalizer_when_it_matches() {
    bounded(20, || {
        let (_server, admin) = start();
        let mut body = pod_body("a", None);
        body["metadata"]["finalizers"] = json!(["ours/count", "theirs/keep"]);
        let created = admin.post(PODS, &body).body;
        let uid = created["metadata"]["uid"]
            .as_str()
            .expect("uid")
            .to_string();
        let release = |uid: &str| {
            let body = json!({"metadata": {"uid": uid,
                "$deleteFromPrimitiveList/finalizers": ["ours/count"]}})
            .to_string();
            admin.send(
                "PATCH",
                &format!("{PODS}/a"),
                Some("application/strategic-merge-patch+json"),
                Some(&body),
            )
        };
        // A patch has no uid precondition: another uid is a change of an immutable field.
        let r = release("someone-else");
        assert_uid_immutable(&r, "Pod", "a", "someone-else");
        assert_eq!(
            admin.get(&format!("{PODS}/a")).body["metadata"]["finalizers"],
            json!(["ours/count", "theirs/keep"]),
            "not touched"
        );
        let r = release(&uid);
        assert_eq!(r.code, 200, "{}", r.body);
        assert_eq!(r.body["metadata"]["finalizers"], json!(["theirs/keep"]));
    });
}

#[test]
fn a_pods_status_patch_naming_another_uid_is_invalid_a_custom_resources_is_applied() {
    bounded(20, || {
        let (_server, admin) = start();
        admin.post(PODS, &pod_body("a", None));
        let ic = admin.post(&ics(), &ic_body("web", "nginx")).body;
        let status = json!({"metadata": {"uid": "gone-uid"}, "status": {"startTimes": 1}});
        let r = admin.merge_patch(&format!("{PODS}/a/status"), &status);
        assert_uid_immutable(&r, "Pod", "a", "gone-uid");
        // A custom resource's `/status` copies the stored metadata over the patch's: the uid
        // is ignored and the status applied (fixture kube-1.28-kubelet/21).
        let path = format!("{}/web", ics());
        let r = admin.merge_patch(&format!("{path}/status"), &status);
        assert_eq!(r.code, 200, "{}", r.body);
        assert_eq!(r.body["metadata"]["uid"], ic["metadata"]["uid"]);
        assert_eq!(admin.get(&path).body["status"]["startTimes"], 1);
        // What holds there: a stale resourceVersion (409, fixture 24)...
        let stale = json!({"metadata": {"resourceVersion": ic["metadata"]["resourceVersion"]},
            "status": {"startTimes": 2}});
        let r = admin.merge_patch(&format!("{path}/status"), &stale);
        assert_eq!(r.code, 409, "{}", r.body);
        assert_eq!(r.body["reason"], "Conflict");
        // ...and a JSON patch's test of the uid (422 with no causes, fixtures 22 and 23).
        let test = |uid: &serde_json::Value| {
            json!([{"op": "test", "path": "/metadata/uid", "value": uid},
                {"op": "replace", "path": "/status/startTimes", "value": 3}])
        };
        let r = admin.json_patch(&format!("{path}/status"), &test(&json!("gone-uid")));
        assert_eq!(r.code, 422, "{}", r.body);
        assert!(r.body["details"]["causes"].is_null(), "{}", r.body);
        let r = admin.json_patch(&format!("{path}/status"), &test(&ic["metadata"]["uid"]));
        assert_eq!(r.code, 200, "{}", r.body);
        assert_eq!(r.body["status"]["startTimes"], 3);
        // A PUT's uid is a precondition, checked by storage: 409 (no fixture records it).
        let mut put = admin.get(&path).body;
        put["metadata"]["uid"] = json!("gone-uid");
        let r = admin.put(&path, &put);
        assert_eq!(r.code, 409, "{}", r.body);
        assert_eq!(r.body["reason"], "Conflict");
    });
}

#[test]
fn put_requires_current_resource_version_and_leases_conflict_when_stale() {
    bounded(20, || {
        let (_server, admin) = start();
        let leases = "/apis/coordination.k8s.io/v1/namespaces/default/leases";
        let created = admin.post(
            leases,
            &json!({"metadata": {"name": "l"}, "spec": {"holderIdentity": "a"}}),
        );
        assert_eq!(created.code, 201);
        let mut next = created.body.clone();
        next["spec"]["holderIdentity"] = json!("b");
        let updated = admin.put(&format!("{leases}/l"), &next);
        assert_eq!(updated.code, 200);
        let again = admin.put(&format!("{leases}/l"), &next);
        assert_eq!(again.code, 409, "stale resourceVersion");
        assert_eq!(
            again.body["message"],
            "Operation cannot be fulfilled on leases.coordination.k8s.io \"l\": the object has been modified; please apply your changes to the latest version and try again"
        );
        let ic = admin.post(&ics(), &ic_body("e", "nginx")).body;
        let mut no_rv = ic.clone();
        no_rv["metadata"]
            .as_object_mut()
            .expect("meta")
            .remove("resourceVersion");
        assert_eq!(
            admin.put(&format!("{}/e", ics()), &no_rv).code,
            422,
            "custom resources need a resourceVersion on update"
        );
    });
}

#[test]
fn status_subresource_separates_spec_and_status_writes() {
    bounded(20, || {
        let (_server, admin) = start();
        let mut body = ic_body("s", "nginx");
        body["status"] = json!({"currentPod": "ignored"});
        let created = admin.post(&ics(), &body);
        assert_eq!(created.code, 201);
        assert!(
            created.body["status"].is_null(),
            "status is dropped on create"
        );
        assert_eq!(created.body["metadata"]["generation"], 1);
        let path = format!("{}/s", ics());

        let status = admin.merge_patch(&format!("{path}/status"), &json!({"spec": {"image": "other"}, "status": {"currentPod": "s-immortalpod", "startTimes": 1}}));
        assert_eq!(status.code, 200);
        assert_eq!(
            status.body["spec"]["image"], "nginx",
            "/status ignores spec"
        );
        assert_eq!(status.body["status"]["startTimes"], 1);
        assert_eq!(
            status.body["metadata"]["generation"], 1,
            "status writes keep generation"
        );

        let main = admin.merge_patch(
            &path,
            &json!({"spec": {"image": "nginx:1.27"}, "status": {"startTimes": 99}}),
        );
        assert_eq!(main.code, 200);
        assert_eq!(
            main.body["status"]["startTimes"], 1,
            "main endpoint ignores status"
        );
        assert_eq!(
            main.body["metadata"]["generation"], 2,
            "spec change bumps generation"
        );

        let invalid = admin.merge_patch(
            &format!("{path}/status"),
            &json!({"status": {"startTimes": -1}}),
        );
        assert_eq!(invalid.code, 422);

        let same = admin.merge_patch(&path, &json!({"spec": {"image": "nginx:1.27"}}));
        assert_eq!(
            rv_of(&same.body),
            rv_of(&main.body),
            "a patch that changes nothing keeps the version"
        );

        let strategic = admin.send(
            "PATCH",
            &path,
            Some("application/strategic-merge-patch+json"),
            Some(r#"{"spec":{"image":"x"}}"#),
        );
        assert_eq!(strategic.code, 415);
    });
}

#[test]
fn invalid_objects_are_rejected_with_causes() {
    bounded(20, || {
        let (_server, admin) = start();
        let r = admin.post(&ics(), &json!({"metadata": {"name": "nospec"}}));
        assert_eq!(r.code, 422);
        assert_eq!(r.body["details"]["causes"][0]["field"], "spec");
        let r = admin.post(PODS, &json!({"metadata": {"name": "Bad_Name"}, "spec": {"containers": [{"name": "c", "image": "i"}]}}));
        assert_eq!(r.code, 422);
        assert_eq!(r.body["details"]["causes"][0]["field"], "metadata.name");
        let r = admin.post(
            PODS,
            &json!({"metadata": {"name": "nocontainers"}, "spec": {}}),
        );
        assert_eq!(r.code, 422);
        let r = admin.post("/api/v1/namespaces/nope/pods", &pod_body("x", None));
        assert_eq!((r.code, r.body["reason"].as_str()), (404, Some("NotFound")));
        let r = admin.post(PODS, &json!({"metadata": {"name": "rv", "resourceVersion": "5"}, "spec": {"containers": [{"name": "c", "image": "i"}]}}));
        assert_eq!(r.code, 500);
    });
}

#[test]
fn created_pod_has_server_defaults_and_pending_status() {
    bounded(20, || {
        let (_server, admin) = start_without_kubelet();
        let p = admin.post(PODS, &json!({"metadata": {"generateName": "gen-"}, "spec": {"containers": [{"name": "c", "image": "nginx:1.27"}]}, "status": {"phase": "Running"}})).body;
        let name = p["metadata"]["name"].as_str().expect("name");
        assert!(name.starts_with("gen-") && name.len() == 9, "{name}");
        assert_eq!(p["spec"]["restartPolicy"], "Always");
        assert_eq!(p["spec"]["dnsPolicy"], "ClusterFirst");
        assert_eq!(p["spec"]["schedulerName"], "default-scheduler");
        assert_eq!(p["spec"]["terminationGracePeriodSeconds"], 30);
        assert_eq!(
            p["spec"]["containers"][0]["imagePullPolicy"],
            "IfNotPresent"
        );
        assert_eq!(
            p["spec"]["containers"][0]["terminationMessagePath"],
            "/dev/termination-log"
        );
        assert_eq!(
            p["status"],
            json!({"phase": "Pending", "qosClass": "BestEffort"})
        );
        let s = admin.merge_patch(
            &format!("{PODS}/{name}/status"),
            &json!({"status": {"phase": "Failed"}}),
        );
        assert_eq!(s.body["status"]["phase"], "Failed");
        let main = admin.merge_patch(
            &format!("{PODS}/{name}"),
            &json!({"status": {"phase": "Running"}}),
        );
        assert_eq!(
            main.body["status"]["phase"], "Failed",
            "main endpoint ignores pod status"
        );
    });
}

#[test]
fn list_pages_with_limit_and_continue() {
    bounded(20, || {
        let (_server, admin) = start();
        for i in 0..5 {
            let mut p = pod_body(&format!("p{i}"), None);
            p["metadata"]["labels"] = json!({"even": if i % 2 == 0 { "yes" } else { "no" }});
            admin.post(PODS, &p);
        }
        let mut names = Vec::new();
        let mut cont = String::new();
        loop {
            let r = admin.get(&format!("{PODS}?limit=2&continue={cont}"));
            assert_eq!(r.code, 200);
            names.extend(
                r.body["items"]
                    .as_array()
                    .expect("items")
                    .iter()
                    .map(|i| i["metadata"]["name"].as_str().unwrap_or("").to_string()),
            );
            assert!(
                r.body["items"][0]["kind"].is_null(),
                "built-in list items carry no kind"
            );
            match r.body["metadata"]["continue"].as_str() {
                Some(c) if !c.is_empty() => cont = c.to_string(),
                _ => break,
            }
        }
        assert_eq!(names, vec!["p0", "p1", "p2", "p3", "p4"]);
        let even = admin.get(&format!("{PODS}?labelSelector=even%3Dyes"));
        assert_eq!(even.body["items"].as_array().map(Vec::len), Some(3));
        let bad = admin.get(&format!("{PODS}?labelSelector=a%20in%20b"));
        assert_eq!(bad.code, 400);
    });
}

/// What client-go's metadata client sends for a list, and for a watch or a get.
const METADATA_LIST: &str = "application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json";
const METADATA: &str = "application/vnd.kubernetes.protobuf;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json";

#[test]
fn metadata_only_lists_gets_and_watches_answer_partial_object_metadata() {
    bounded(30, || {
        let (server, admin) = start_without_kubelet();
        for (name, app) in [("a", "x"), ("b", "x"), ("c", "y")] {
            let mut p = pod_body(name, None);
            p["metadata"]["labels"] = json!({"app": app});
            p["metadata"]["annotations"] = json!({"note": name});
            assert_eq!(admin.post(PODS, &p).code, 201);
        }
        let first = admin.get_accepting(
            &format!("{PODS}?labelSelector=app%3Dx&limit=1"),
            METADATA_LIST,
        );
        assert_eq!(first.code, 200, "{}", first.body);
        let b = &first.body;
        assert_eq!(b["kind"], "PartialObjectMetadataList");
        assert_eq!(b["apiVersion"], "meta.k8s.io/v1");
        assert!(b["metadata"]["resourceVersion"].is_string());
        let token = b["metadata"]["continue"]
            .as_str()
            .expect("a second page")
            .to_string();
        assert_eq!(b["items"].as_array().map(Vec::len), Some(1));
        let item = &b["items"][0];
        assert_eq!(item["kind"], "PartialObjectMetadata");
        assert_eq!(item["apiVersion"], "meta.k8s.io/v1");
        assert!(item.get("spec").is_none() && item.get("status").is_none());
        let full = admin.get(&format!("{PODS}/a")).body;
        assert_eq!(item["metadata"], full["metadata"], "the whole metadata");
        let second = admin.get_accepting(
            &format!("{PODS}?labelSelector=app%3Dx&limit=1&continue={token}"),
            METADATA_LIST,
        );
        assert_eq!(second.body["items"][0]["metadata"]["name"], "b");
        assert!(
            second.body["metadata"].get("continue").is_none(),
            "last page"
        );
        let by_field = admin.get_accepting(
            &format!("{PODS}?fieldSelector=metadata.name%3Dc"),
            "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1beta1",
        );
        assert_eq!(by_field.body["apiVersion"], "meta.k8s.io/v1beta1");
        assert_eq!(
            by_field.body["items"][0]["apiVersion"],
            "meta.k8s.io/v1beta1"
        );
        assert_eq!(by_field.body["items"][0]["metadata"]["name"], "c");
        let none = admin.get_accepting(&format!("{PODS}?labelSelector=app%3Dz"), METADATA_LIST);
        assert_eq!(none.body["items"], serde_json::Value::Null);

        // Custom resources too, and one object.
        assert_eq!(admin.post(&ics(), &ic_body("one", "nginx")).code, 201);
        let ic = admin.get_accepting(&format!("{}/one", ics()), METADATA);
        assert_eq!(ic.code, 200);
        assert_eq!(
            (
                ic.body["kind"].as_str(),
                ic.body["metadata"]["generation"].as_i64()
            ),
            (Some("PartialObjectMetadata"), Some(1))
        );
        assert!(ic.body.get("spec").is_none());

        // A form that does not fit is 406, as kube-apiserver answers it.
        let r = admin.get_accepting(&format!("{PODS}/a"), METADATA_LIST);
        assert_eq!(
            (r.code, r.body["reason"].as_str()),
            (406, Some("NotAcceptable"))
        );
        assert_eq!(
            r.body["message"],
            "you requested PartialObjectMetadataList, but the requested object is not a list (*core.Pod)"
        );
        assert_eq!(admin.get_accepting(PODS, METADATA).code, 406);

        // A metadata watch (what a metadata informer opens): events and bookmarks carry only
        // metadata.
        let events = admin
            .watch_accepting(
                &format!("{PODS}?watch=true&labelSelector=app%3Dy&allowWatchBookmarks=true&timeoutSeconds=3"),
                METADATA,
            )
            .spawn();
        let added = events.take(1, Duration::from_secs(5));
        assert_eq!(added[0]["type"], "ADDED");
        assert_eq!(added[0]["object"]["kind"], "PartialObjectMetadata");
        assert_eq!(added[0]["object"]["metadata"]["name"], "c");
        assert!(added[0]["object"].get("spec").is_none());
        let bookmark = std::iter::from_fn(|| events.any(Duration::from_secs(5)))
            .find(|e| e["type"] == "BOOKMARK")
            .expect("a bookmark");
        assert_eq!(
            bookmark["object"],
            json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                "metadata": {"resourceVersion": bookmark["object"]["metadata"]["resourceVersion"],
                    "creationTimestamp": null}})
        );
        drop(server);
    });
}

#[test]
fn deleting_a_namespace_deletes_its_objects_then_itself() {
    bounded(20, || {
        let (_server, admin) = start();
        assert_eq!(
            admin
                .post("/api/v1/namespaces", &json!({"metadata": {"name": "tmp"}}))
                .code,
            201
        );
        admin.post("/api/v1/namespaces/tmp/pods", &pod_body("p", None));
        admin.post(
            &format!("{IC}/namespaces/tmp/immortalcontainers"),
            &ic_body("i", "nginx"),
        );
        let r = admin.delete("/api/v1/namespaces/tmp", None);
        assert_eq!(r.code, 200);
        assert_eq!(r.body["status"]["phase"], "Terminating");
        let deadline = Instant::now() + Duration::from_secs(5);
        while admin.get("/api/v1/namespaces/tmp").code != 404 {
            assert!(Instant::now() < deadline, "namespace never went away");
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(
            admin.get("/api/v1/pods").body["items"]
                .as_array()
                .map(Vec::len),
            Some(0)
        );
        assert_eq!(admin.delete("/api/v1/namespaces/default", None).code, 403);
    });
}

#[test]
fn crd_created_through_the_api_serves_its_resource_until_deleted() {
    bounded(20, || {
        let server = TestServer::start(Options {
            install_crd: false,
            ..Options::default()
        })
        .expect("server");
        let admin = Client::admin(&server);
        assert_eq!(admin.get(&ics()).code, 404);
        let crd: serde_json::Value =
            serde_yaml::from_str(kube_testserver::IMMORTALCONTAINER_CRD).expect("crd");
        let crds = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions";
        let r = admin.post(crds, &crd);
        assert_eq!(r.code, 201, "{}", r.body);
        assert_eq!(r.body["status"]["conditions"][1]["type"], "Established");
        assert_eq!(admin.post(&ics(), &ic_body("x", "nginx")).code, 201);
        let groups = admin.get("/apis").body;
        assert!(groups["groups"]
            .as_array()
            .expect("groups")
            .iter()
            .any(|g| g["name"] == "immortalcontainer.flugel.it"));
        let r = admin.delete(
            &format!("{crds}/immortalcontainers.immortalcontainer.flugel.it"),
            None,
        );
        assert_eq!(r.code, 200);
        assert_eq!(admin.get(&ics()).code, 404);
        assert_eq!(admin.post(crds, &crd).code, 201);
        assert_eq!(
            admin.get(&ics()).body["items"].as_array().map(Vec::len),
            Some(0),
            "instances went with the CRD"
        );
    });
}

#[test]
fn latency_delays_every_request() {
    bounded(20, || {
        let (server, admin) = start();
        server.set_latency(Duration::from_millis(300));
        let t = Instant::now();
        assert_eq!(admin.get(PODS).code, 200);
        assert!(t.elapsed() >= Duration::from_millis(300));
        server.set_latency(Duration::ZERO);
    });
}

#[test]
fn a_stalled_request_is_held_until_lifted_then_handled_and_logged_with_its_user() {
    bounded(20, || {
        let (server, admin) = start();
        server.add_user("replica-a", "a-token", vec![Rule::new(&["*"], &["*"])]);
        let a = Client::new(&server, "a-token");
        server.record_requests();
        let stall = server.stall(StallRule {
            verb: Some("create".into()),
            user: Some("replica-a".into()),
            ..StallRule::default()
        });
        let held = std::thread::spawn(move || a.post(PODS, &pod_body("held", None)).code);
        // Another user's write, and the stalled user's reads, pass.
        assert_eq!(admin.post(PODS, &pod_body("free", None)).code, 201);
        let counted = |server: &TestServer| {
            server
                .request_counts()
                .get(&("create".to_string(), "pods".to_string()))
                .copied()
                .unwrap_or(0)
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        while counted(&server) < 2 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(counted(&server), 2, "the held request arrived");
        std::thread::sleep(Duration::from_millis(300));
        assert!(!held.is_finished(), "held while the stall is in force");
        assert_eq!(
            admin.get(&format!("{PODS}/held")).code,
            404,
            "not handled yet"
        );
        let lifted = Instant::now();
        server.lift_stall(stall);
        assert_eq!(held.join().unwrap(), 201);
        assert_eq!(admin.get(&format!("{PODS}/held")).code, 200);

        let log = server.request_log();
        let entry = log
            .iter()
            .find(|l| l.user == "replica-a" && l.verb == "create")
            .expect("the held create is logged");
        assert_eq!((entry.resource.as_str(), entry.code), ("pods", 201));
        assert!(entry.is_write());
        assert!(entry.received < lifted && entry.answered >= lifted);
        assert!(log.iter().any(|l| l.user == "admin" && l.verb == "get"));
    });
}

#[test]
fn request_counts_are_kept_by_verb_and_resource() {
    bounded(20, || {
        let (server, admin) = start();
        server.reset_request_counts();
        admin.get(PODS);
        admin.get(PODS);
        admin.post(PODS, &pod_body("a", None));
        admin.merge_patch(&format!("{}/nope/status", ics()), &json!({}));
        let counts = server.request_counts();
        let n = |v: &str, r: &str| {
            counts
                .get(&(v.to_string(), r.to_string()))
                .copied()
                .unwrap_or(0)
        };
        assert_eq!(n("list", "pods"), 2);
        assert_eq!(n("create", "pods"), 1);
        assert_eq!(n("patch", "immortalcontainers/status"), 1);
        server.reset_request_counts();
        assert!(server.request_counts().is_empty());
    });
}

#[test]
fn kubeconfig_names_the_server_and_restricted_users_get_their_own() {
    bounded(20, || {
        let (server, _admin) = start();
        let text = std::fs::read_to_string(server.kubeconfig_path()).expect("kubeconfig");
        assert!(text.contains(&format!("server: {}", server.url())));
        assert!(text.contains(&format!("token: {}", server.admin_token())));
        server.add_user("op", "op-token", vec![Rule::new(&["*"], &["*"])]);
        let path = server.kubeconfig_path().with_file_name("op.kubeconfig");
        server.write_kubeconfig(&path, "op-token").expect("write");
        assert!(std::fs::read_to_string(&path)
            .expect("read")
            .contains("token: op-token"));
        assert_eq!(
            server.get_json(PODS).map(|l| l["kind"].clone()),
            Some(json!("PodList"))
        );
    });
}

/// kubectl against the server, when kubectl is installed (it is on the project's machines).
#[test]
fn kubectl_creates_lists_and_deletes_immortalcontainers() {
    if std::process::Command::new("kubectl")
        .arg("version")
        .arg("--client")
        .output()
        .is_err()
    {
        eprintln!("kubectl not installed; skipping");
        return;
    }
    bounded(60, || {
        let (server, _admin) = start();
        let kubectl = |args: &[&str], stdin: Option<&str>| {
            use std::io::Write;
            let mut cmd = std::process::Command::new("kubectl");
            cmd.args(args)
                .arg("--request-timeout=10s")
                .env("KUBECONFIG", server.kubeconfig_path())
                .env("HOME", server.kubeconfig_path().parent().expect("dir"))
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped());
            let mut child = cmd.spawn().expect("kubectl runs");
            if let (Some(text), Some(mut input)) = (stdin, child.stdin.take()) {
                input.write_all(text.as_bytes()).expect("stdin");
            }
            let out = child.wait_with_output().expect("kubectl output");
            (
                out.status.success(),
                String::from_utf8_lossy(&out.stdout).to_string()
                    + &String::from_utf8_lossy(&out.stderr),
            )
        };
        let manifest = "apiVersion: immortalcontainer.flugel.it/v1alpha1\nkind: ImmortalContainer\nmetadata:\n  name: demo\nspec:\n  image: nginx:latest\n";
        let (ok, out) = kubectl(&["create", "-f", "-"], Some(manifest));
        assert!(ok, "{out}");
        let (ok, out) = kubectl(&["get", "ic"], None);
        assert!(
            ok && out.contains("demo") && out.contains("nginx:latest") && out.contains("IMAGE"),
            "{out}"
        );
        let (ok, out) = kubectl(&["get", "ic", "demo", "-o", "yaml"], None);
        assert!(ok && out.contains("generation: 1"), "{out}");
        let (ok, out) = kubectl(&["get", "pods"], None);
        assert!(ok, "{out}");
        let (ok, out) = kubectl(&["delete", "ic", "demo"], None);
        assert!(ok, "{out}");
        let (ok, out) = kubectl(&["get", "ic"], None);
        assert!(ok && !out.contains("demo"), "{out}");
    });
}

#[test]
fn sixty_four_parallel_clients_create_and_read_ten_thousand_objects() {
    bounded(120, || {
        let (server, admin) = start();
        let mut w = admin.watch(&format!(
            "{PODS}?watch=true&resourceVersion={}&timeoutSeconds=60",
            rv_of(&admin.get(PODS).body)
        ));
        // Read while the pods are created: a stream left unread for seconds under tens of MB
        // of events stalls in TCP's zero-window back-off, longer than the client's read
        // timeout. The scheduler and kubelet add their MODIFIED events; each create is one
        // ADDED.
        let reader = std::thread::spawn(move || {
            let mut added = 0;
            let end = loop {
                match w.next_type() {
                    Ok(Some(t)) if t == "ADDED" => added += 1,
                    Ok(Some(_)) => {}
                    Ok(None) => break "clean end".to_string(),
                    Err(e) => break e,
                }
            };
            (added, end)
        });
        let started = Instant::now();
        let workers: Vec<_> = (0..64)
            .map(|t| {
                let c = Client::admin(&server);
                std::thread::spawn(move || {
                    for i in 0..157 {
                        let r = c.post(PODS, &pod_body(&format!("p-{t}-{i}"), None));
                        assert_eq!(r.code, 201);
                        assert_eq!(c.get(&format!("{PODS}/p-{t}-{i}")).code, 200);
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().expect("worker");
        }
        let written = started.elapsed();
        let mut total = 0;
        let mut cont = String::new();
        loop {
            let r = admin.get(&format!("/api/v1/pods?limit=500&continue={cont}"));
            total += r.body["items"].as_array().map_or(0, Vec::len);
            match r.body["metadata"]["continue"].as_str() {
                Some(c) if !c.is_empty() => cont = c.to_string(),
                _ => break,
            }
        }
        assert_eq!(total, 64 * 157);
        eprintln!(
            "10048 creates + gets over 64 connections: {written:?}; paged list: {:?}",
            started.elapsed() - written
        );
        server.drop_watches();
        let (seen, end) = reader.join().expect("watch reader");
        assert_eq!(
            seen,
            64 * 157,
            "the watch saw every create (the stream ended: {end})"
        );
    });
}

#[test]
fn server_side_apply_creates_then_merges_and_needs_a_field_manager() {
    bounded(20, || {
        let (_server, admin) = start();
        let path = format!("{}/applied", ics());
        let apply = |query: &str, yaml: &str| {
            admin.send(
                "PATCH",
                &format!("{path}{query}"),
                Some("application/apply-patch+yaml"),
                Some(yaml),
            )
        };
        let doc = "apiVersion: immortalcontainer.flugel.it/v1alpha1\nkind: ImmortalContainer\nmetadata:\n  name: applied\n  labels: {team: a}\nspec:\n  image: nginx\n";
        let missing = apply("", doc);
        assert_eq!(missing.code, 400, "{}", missing.body);
        assert_eq!(
            missing.body["message"],
            "fieldManager is required for apply requests"
        );
        let created = apply("?fieldManager=kubectl&fieldValidation=Strict", doc);
        assert_eq!(created.code, 201, "{}", created.body);
        assert_eq!(created.body["spec"]["image"], "nginx");
        let changed = apply(
            "?fieldManager=kubectl",
            &doc.replace("image: nginx", "image: nginx:1.27"),
        );
        assert_eq!(changed.code, 200, "{}", changed.body);
        assert_eq!(changed.body["spec"]["image"], "nginx:1.27");
        assert_eq!(changed.body["metadata"]["labels"], json!({"team": "a"}));
        assert_eq!(
            changed.body["metadata"]["uid"], created.body["metadata"]["uid"],
            "the same object"
        );
    });
}
