//! Replays the fixtures recorded on a v1.28 cluster with a node
//! (tests/fixtures/kube-1.28-kubelet/*.http) against a server with its simulated node: for each
//! watch it does what the recording's `### what happened` says and compares the sequence of
//! events and, per event, the fields that matter (phase, deletionTimestamp presence,
//! deletionGracePeriodSeconds, nodeName presence, pod IP presence, the conditions' type,
//! status and reason, the containers' state kinds); refusals are compared by code, reason,
//! message and details.
//!
//! Three things are normalized, each for a stated reason:
//! - BOOKMARKs are not compared: their number depends on how long a watch stays open, and
//!   these watches are closed as soon as the recorded events (and a quiet moment) have come.
//! - The recording's node ran kubemark's fake prober, which reports every container ready,
//!   even while ContainerCreating. A real node's prober (and this server) reports a container
//!   ready only while it runs, so where a recorded event shows a container that is not running,
//!   the expected Ready and ContainersReady become False, ContainersNotReady.
//! - Unknown fields (25, 26) are compared as a set: the real decoder names them in the order
//!   the request's JSON has them, and this server's JSON maps keep their keys sorted.

mod common;

use common::http_fixture::{load, Fixture};
use common::{bounded, types, wait_for, Client, Events};
use kube_testserver::{KubeletOptions, Options, TestServer};
use serde_json::{json, Value};
use std::time::Duration;

const NS: &str = "fixtures";
const PODS: &str = "/api/v1/namespaces/fixtures/pods";
/// How long to keep listening after the expected events, for ones that should not come. Longer
/// than the replay's status sync delay, so a late kubelet write would be seen.
const QUIET: Duration = Duration::from_millis(600);

/// Where the etcd-restore fixtures' object lives (52-56).
const RESTORED: &str =
    "/apis/immortalcontainer.flugel.it/v1alpha1/namespaces/fixtures-restore/immortalcontainers";

/// What a read (`object`, in the answer `answer`) after the restore must show: the recorded
/// spec and count, at versions below `before`, the one answered before the restore.
fn restored(f: &Fixture, object: &Value, answer: &Value, before: Option<&str>) -> Vec<String> {
    let want: Value = serde_json::from_str(&f.response).expect("recorded body is json");
    let want = want["items"].get(0).unwrap_or(&want);
    let mut diffs = Vec::new();
    for field in ["spec", "status"] {
        let (w, g) = (&want[field], &object[field]);
        let (w, g) = match field {
            "status" => (&w["startTimes"], &g["startTimes"]),
            _ => (w, g),
        };
        if w != g {
            diffs.push(format!("{field}: expected {w}, got {g}"));
        }
    }
    let version = |v: &Value| {
        v["metadata"]["resourceVersion"]
            .as_str()?
            .parse::<u64>()
            .ok()
    };
    let before = before.and_then(|b| b.parse::<u64>().ok());
    for (what, v) in [("object", version(object)), ("answer", version(answer))] {
        if v.zip(before).is_none_or(|(v, b)| v >= b) {
            diffs.push(format!(
                "the {what}'s resourceVersion {v:?} is not below {before:?}, answered before the restore"
            ));
        }
    }
    diffs
}

/// The pod the recording created (fixture 02), under another name.
fn pod_body(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "immortal-operator"}},
        "spec": {"containers": [{"name": "acontainer", "image": "registry.k8s.io/pause:3.9"}]}})
}

/// What is compared of one watch event.
fn shape(e: &Value) -> Value {
    let o = &e["object"];
    let meta = &o["metadata"];
    let conditions: Vec<Value> = o["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| json!([c["type"], c["status"], c["reason"]]))
        .collect();
    let states: Vec<Value> = o["status"]["containerStatuses"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            json!(c["state"]
                .as_object()
                .and_then(|s| s.keys().next().cloned()))
        })
        .collect();
    json!({
        "type": e["type"],
        "name": meta["name"],
        "phase": o["status"]["phase"],
        "reason": o["status"]["reason"],
        "deletionTimestamp": !meta["deletionTimestamp"].is_null(),
        "deletionGracePeriodSeconds": meta["deletionGracePeriodSeconds"],
        "nodeName": !o["spec"]["nodeName"].is_null(),
        "podIP": !o["status"]["podIP"].is_null(),
        "conditions": conditions,
        "containers": states,
    })
}

/// A recorded event as a node with a real prober would have sent it (see the module docs).
fn real_prober(mut e: Value) -> Value {
    let statuses = e["object"]["status"]["containerStatuses"].clone();
    let not_running = statuses
        .as_array()
        .is_some_and(|cs| cs.iter().any(|c| c["state"]["running"].is_null()));
    if let Some(conditions) = e["object"]["status"]["conditions"].as_array_mut() {
        for c in conditions {
            let kubelet_ready = c["type"] == "Ready" || c["type"] == "ContainersReady";
            if kubelet_ready && not_running && c["status"] == "True" {
                c["status"] = json!("False");
                c["reason"] = json!("ContainersNotReady");
            }
        }
    }
    e
}

/// The recorded events of a watch fixture, BOOKMARKs left out.
fn recorded_events(f: &Fixture) -> Vec<Value> {
    f.response
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["type"] != "BOOKMARK")
        .map(real_prober)
        .collect()
}

struct Replay {
    server: TestServer,
    admin: Client,
}

impl Replay {
    fn pod(&self, name: &str) -> Value {
        self.admin.get(&format!("{PODS}/{name}")).body
    }

    /// Creates a pod like the recording's and waits until it runs (the state every watch
    /// fixture starts from); returns it.
    fn running(&self, name: &str) -> Value {
        let r = self.admin.post(PODS, &pod_body(name));
        assert_eq!(r.code, 201, "{name}: {}", r.body);
        wait_for(
            10,
            &format!("{name} to run"),
            || self.pod(name),
            |p| {
                p["status"]["phase"] == "Running"
                    && p["status"]["containerStatuses"][0]["state"]["running"].is_object()
            },
        )
    }

    fn current_rv(&self) -> u64 {
        self.admin.get(PODS).body["metadata"]["resourceVersion"]
            .as_str()
            .and_then(|v| v.parse().ok())
            .expect("list resourceVersion")
    }

    /// Opens the fixture's watch from `from` (the recording's version is another server's).
    fn watch(&self, f: &Fixture, from: u64, diffs: &mut Vec<String>) -> Events {
        let mut path = String::new();
        for (i, part) in f.path.split('&').enumerate() {
            if i > 0 {
                path.push('&');
            }
            match part.split_once('=') {
                Some(("resourceVersion", _)) => path.push_str(&format!("resourceVersion={from}")),
                // Ended early once the events are in; the bound is only a safety net.
                Some(("timeoutSeconds", _)) => path.push_str("timeoutSeconds=30"),
                _ => path.push_str(part),
            }
        }
        let watch = self.admin.watch(&path);
        if !watch.chunked.contains("chunked") {
            diffs.push(format!("transfer-encoding {:?}", watch.chunked));
        }
        if watch.content_type != "application/json" {
            diffs.push(format!("content-type {:?}", watch.content_type));
        }
        watch.spawn()
    }

    /// Replays one watch fixture: `setup` before the watch opens (returns the version to watch
    /// from), `act` while it streams, then compares.
    fn replay_watch(
        &self,
        f: &Fixture,
        setup: impl FnOnce(&Replay) -> u64,
        act: impl FnOnce(&Replay) -> Vec<String>,
    ) -> Vec<String> {
        let mut diffs = Vec::new();
        let from = setup(self);
        let events = self.watch(f, from, &mut diffs);
        diffs.extend(act(self));
        let expected = recorded_events(f);
        let mut got = events.take(expected.len(), Duration::from_secs(10));
        got.extend(events.more(QUIET));
        if types(&expected) != types(&got) {
            diffs.push(format!(
                "event types: expected {:?}, got {:?}\n    got: {:#?}",
                types(&expected),
                types(&got),
                got.iter().map(shape).collect::<Vec<_>>()
            ));
            return diffs;
        }
        for (i, (e, g)) in expected.iter().zip(&got).enumerate() {
            let (want, have) = (shape(e), shape(g));
            if want != have {
                diffs.push(format!("event {i}: expected {want}\n      got {have}"));
            }
        }
        diffs
    }

    fn send(&self, f: &Fixture, body: Option<&str>) -> common::Resp {
        self.admin
            .send(&f.method, &f.path, f.content_type.as_deref(), body)
    }
}

/// A refusal or a Status: code, reason, message and details as recorded.
fn compare_status(f: &Fixture, got: &common::Resp) -> Vec<String> {
    let want: Value = serde_json::from_str(&f.response).expect("recorded body is json");
    let mut diffs = Vec::new();
    if got.code != f.status {
        diffs.push(format!(
            "code: expected {}, got {} ({})",
            f.status, got.code, got.body
        ));
        return diffs;
    }
    for k in [
        "kind",
        "apiVersion",
        "metadata",
        "status",
        "reason",
        "message",
        "details",
        "code",
    ] {
        if want[k] != got.body[k] {
            diffs.push(format!("{k}: expected {}, got {}", want[k], got.body[k]));
        }
    }
    diffs
}

/// The `Warning` headers as recorded, in order.
fn compare_warnings(f: &Fixture, got: &common::Resp) -> Vec<String> {
    let sorted = |w: &[String]| {
        let mut w = w.to_vec();
        w.sort();
        w
    };
    if sorted(&got.warnings) == sorted(&f.warnings) {
        Vec::new()
    } else {
        vec![format!(
            "warnings: expected {:?}, got {:?}",
            f.warnings, got.warnings
        )]
    }
}

/// A strict decoding error's message with the unknown fields it names in sorted order.
fn fields_sorted(message: &Value) -> String {
    let m = message.as_str().unwrap_or_default();
    let Some((head, fields)) = m.split_once("strict decoding error: ") else {
        return m.to_string();
    };
    let mut fields: Vec<&str> = fields.split(", ").collect();
    fields.sort();
    format!("{head}strict decoding error: {}", fields.join(", "))
}

/// A write answered with the object: its status as recorded, its uid the object's own
/// (`uid`: the one the write named is not taken), its kind and name as recorded.
fn compare_object(f: &Fixture, got: &common::Resp, uid: &str) -> Vec<String> {
    let want: Value = serde_json::from_str(&f.response).expect("recorded body is json");
    if got.code != f.status {
        return vec![format!(
            "code: expected {}, got {} ({})",
            f.status, got.code, got.body
        )];
    }
    let mut diffs = Vec::new();
    for (what, e, a) in [
        ("kind", &want["kind"], &got.body["kind"]),
        (
            "name",
            &want["metadata"]["name"],
            &got.body["metadata"]["name"],
        ),
        ("status", &want["status"], &got.body["status"]),
        ("spec", &want["spec"], &got.body["spec"]),
    ] {
        if e != a {
            diffs.push(format!("{what}: expected {e}, got {a}"));
        }
    }
    if got.body["metadata"]["uid"] != uid {
        diffs.push(format!(
            "uid: {} is not the object's",
            got.body["metadata"]["uid"]
        ));
    }
    diffs
}

fn merge_patch(r: &Replay, path: &str, body: Value, what: &str) -> Vec<String> {
    let resp = r.admin.merge_patch(path, &body);
    if resp.code == 200 {
        Vec::new()
    } else {
        vec![format!("{what}: {} {}", resp.code, resp.body)]
    }
}

fn strategic_patch(r: &Replay, path: &str, body: &str, what: &str) -> Vec<String> {
    let resp = r.admin.send(
        "PATCH",
        path,
        Some("application/strategic-merge-patch+json"),
        Some(body),
    );
    if resp.code == 200 {
        Vec::new()
    } else {
        vec![format!("{what}: {} {}", resp.code, resp.body)]
    }
}

fn delete(r: &Replay, name: &str, body: Option<Value>) -> Vec<String> {
    let resp = r.admin.delete(&format!("{PODS}/{name}"), body.as_ref());
    if resp.code == 200 {
        Vec::new()
    } else {
        vec![format!("delete {name}: {} {}", resp.code, resp.body)]
    }
}

/// What fixture 02 shows of a created pod, and its GET after a label was removed (13).
fn compare_pod(f: &Fixture, got: &common::Resp) -> Vec<String> {
    let want: Value = serde_json::from_str(&f.response).expect("recorded body is json");
    let mut diffs = Vec::new();
    if got.code != f.status {
        diffs.push(format!("code: expected {}, got {}", f.status, got.code));
        return diffs;
    }
    let mut check = |what: &str, e: Value, a: Value| {
        if e != a {
            diffs.push(format!("{what}: expected {e}, got {a}"));
        }
    };
    let (w, g) = (&want, &got.body);
    check("kind", w["kind"].clone(), g["kind"].clone());
    check(
        "metadata.name",
        w["metadata"]["name"].clone(),
        g["metadata"]["name"].clone(),
    );
    check(
        "metadata.labels",
        w["metadata"]["labels"].clone(),
        g["metadata"]["labels"].clone(),
    );
    for k in [
        "restartPolicy",
        "terminationGracePeriodSeconds",
        "dnsPolicy",
        "serviceAccountName",
        "schedulerName",
        "tolerations",
        "priority",
        "enableServiceLinks",
        "preemptionPolicy",
    ] {
        check(
            &format!("spec.{k}"),
            w["spec"][k].clone(),
            g["spec"][k].clone(),
        );
    }
    check(
        "spec.nodeName presence",
        json!(w["spec"]["nodeName"].is_null()),
        json!(g["spec"]["nodeName"].is_null()),
    );
    let e = shape(&json!({"type": "GET", "object": w}));
    let a = shape(&json!({"type": "GET", "object": g}));
    check("status shape", e, a);
    if w["status"]["phase"] == "Pending" {
        // A pod just created: exactly what the strategy resets status to.
        check("status", w["status"].clone(), g["status"].clone());
    }
    diffs
}

#[test]
fn recorded_v1_28_node_fixtures_replay_with_the_same_events_and_refusals() {
    bounded(120, || {
        let server = TestServer::start(Options {
            // Like the recording's server, no periodic bookmarks; none are compared anyway.
            bookmark_interval: Duration::from_secs(60),
            kubelet: Some(KubeletOptions {
                // The recording shows a few seconds; short here, but still a visible delay.
                status_sync_delay: Duration::from_millis(300),
                ..KubeletOptions::default()
            }),
            ..Options::default()
        })
        .expect("server starts");
        let admin = Client::admin(&server);
        for ns in [
            json!({"metadata": {"name": NS}}),
            json!({"metadata": {"name": "fixtures-restricted",
                "labels": {"pod-security.kubernetes.io/enforce": "restricted"}}}),
        ] {
            let r = admin.post("/api/v1/namespaces", &ns);
            assert_eq!(r.code, 201, "namespace: {}", r.body);
        }
        let r = Replay { server, admin };

        let fixtures = load("kube-1.28-kubelet");
        assert!(
            fixtures.len() >= 56,
            "expected the 56 recorded fixtures, found {}",
            fixtures.len()
        );
        let mut failures = Vec::new();
        let mut replayed = 0;
        // The object's version before etcd was restored (53), for what is asked with it after.
        let mut before_restore: Option<String> = None;
        for f in &fixtures {
            let number = &f.name[..2];
            let diffs = match number {
                "01" => {
                    let got = r.admin.get(&f.path);
                    let want: Value = serde_json::from_str(&f.response).expect("json");
                    let keys = |v: &Value| {
                        v.as_object()
                            .map(|m| m.keys().cloned().collect::<Vec<_>>())
                            .unwrap_or_default()
                    };
                    let mut d = Vec::new();
                    if keys(&want) != keys(&got.body) {
                        d.push(format!("keys: {:?} vs {:?}", keys(&want), keys(&got.body)));
                    }
                    d
                }
                "02" => {
                    let got = r.send(f, Some(&f.body));
                    let d = compare_pod(f, &got);
                    // Gone by fixture 15 in the recording, whose quota counts two pods:
                    // `patched` and `unschedulable` (`deadline` has failed and is not charged).
                    r.admin.delete(
                        &format!("{PODS}/created"),
                        Some(&json!({"gracePeriodSeconds": 0})),
                    );
                    d
                }
                "03" => r.replay_watch(
                    f,
                    |r| r.current_rv(),
                    |r| {
                        let resp = r.admin.post(PODS, &pod_body("life"));
                        if resp.code == 201 {
                            Vec::new()
                        } else {
                            vec![format!("create life: {}", resp.body)]
                        }
                    },
                ),
                "04" => r.replay_watch(
                    f,
                    |r| {
                        wait_for(
                            10,
                            "life to run",
                            || r.pod("life"),
                            |p| p["status"]["containerStatuses"][0]["state"]["running"].is_object(),
                        );
                        r.current_rv()
                    },
                    |r| delete(r, "life", None),
                ),
                "05" => r.replay_watch(
                    f,
                    |r| {
                        r.running("g1");
                        r.current_rv()
                    },
                    |r| delete(r, "g1", Some(json!({"gracePeriodSeconds": 1}))),
                ),
                "06" => r.replay_watch(
                    f,
                    |r| {
                        r.running("forced");
                        r.current_rv()
                    },
                    // What `kubectl delete --grace-period=0 --force` sends.
                    |r| {
                        delete(
                            r,
                            "forced",
                            Some(
                                json!({"gracePeriodSeconds": 0, "propagationPolicy": "Background"}),
                            ),
                        )
                    },
                ),
                "07" => {
                    let answer = fixtures
                        .iter()
                        .find(|x| x.name.starts_with("08-"))
                        .expect("the eviction's answer is fixture 08")
                        .clone();
                    r.replay_watch(
                        f,
                        |r| {
                            r.running("evicted");
                            r.current_rv()
                        },
                        move |r| {
                            let got = r.send(&answer, Some(&answer.body));
                            compare_status(&answer, &got)
                                .into_iter()
                                .map(|d| format!("08 (the eviction): {d}"))
                                .collect()
                        },
                    )
                }
                // The eviction request and its answer: replayed during 07, whose stream it
                // caused.
                "08" => Vec::new(),
                "09" => r.replay_watch(
                    f,
                    |r| {
                        r.running("deadline");
                        r.current_rv()
                    },
                    |r| {
                        merge_patch(
                            r,
                            &format!("{PODS}/deadline"),
                            json!({"spec": {"activeDeadlineSeconds": 1}}),
                            "patch activeDeadlineSeconds",
                        )
                    },
                ),
                "10" => r.replay_watch(
                    f,
                    |r| {
                        r.running("patched");
                        r.current_rv()
                    },
                    |r| {
                        merge_patch(
                            r,
                            &format!("{PODS}/patched/status"),
                            json!({"status": {"phase": "Failed"}}),
                            "patch phase",
                        )
                    },
                ),
                "11" => r.replay_watch(
                    f,
                    |r| {
                        let d = strategic_patch(
                            r,
                            "/api/v1/nodes/node-0",
                            r#"{"spec":{"unschedulable":true}}"#,
                            "cordon",
                        );
                        assert!(d.is_empty(), "{d:?}");
                        r.current_rv()
                    },
                    |r| {
                        let resp = r.admin.post(PODS, &pod_body("unschedulable"));
                        if resp.code == 201 {
                            Vec::new()
                        } else {
                            vec![format!("create unschedulable: {}", resp.body)]
                        }
                    },
                ),
                "12" => r.replay_watch(
                    f,
                    |r| {
                        // The recorded watch opened after the node was uncordoned, in time to
                        // see the pod's last step to Running: resume just before that write.
                        let d = strategic_patch(
                            r,
                            "/api/v1/nodes/node-0",
                            r#"{"spec":{"unschedulable":null}}"#,
                            "uncordon",
                        );
                        assert!(d.is_empty(), "{d:?}");
                        let p = wait_for(
                            10,
                            "unschedulable to run",
                            || r.pod("unschedulable"),
                            |p| p["status"]["podIP"].is_string(),
                        );
                        p["metadata"]["resourceVersion"]
                            .as_str()
                            .and_then(|v| v.parse::<u64>().ok())
                            .expect("rv")
                            - 1
                    },
                    |r| {
                        merge_patch(
                            r,
                            &format!("{PODS}/patched"),
                            json!({"metadata": {"labels": {"app.kubernetes.io/managed-by": null}}}),
                            "remove label",
                        )
                    },
                ),
                "13" => compare_pod(f, &r.send(f, None)),
                "14" => compare_status(f, &r.send(f, Some(&f.body))),
                "15" => {
                    let quota =
                        json!({"metadata": {"name": "one-pod"}, "spec": {"hard": {"pods": "1"}}});
                    let q = r
                        .admin
                        .post("/api/v1/namespaces/fixtures/resourcequotas", &quota);
                    assert_eq!(q.code, 201, "quota: {}", q.body);
                    compare_status(f, &r.send(f, Some(&f.body)))
                }
                // A CEL rule (x-kubernetes-validations) on a CRD: the recording shows the
                // object refused; its CRD (not recorded) carried the rule on the root.
                "16" => {
                    let crd = json!({
                        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                        "metadata": {"name": "celexamples.fixtures.example.com"},
                        "spec": {"group": "fixtures.example.com", "scope": "Namespaced",
                            "names": {"plural": "celexamples", "singular": "celexample",
                                "kind": "CelExample", "listKind": "CelExampleList"},
                            "versions": [{"name": "v1", "served": true, "storage": true,
                                "schema": {"openAPIV3Schema": {"type": "object",
                                    "x-kubernetes-validations": [{
                                        "rule": "self.metadata.name.size() <= 241",
                                        "message": "name must be at most 241 characters, so that the pod name NAME-immortalpod fits in 253"}],
                                    "properties": {"spec": {"type": "object",
                                        "properties": {"image": {"type": "string"}}}}}}}]}});
                    let c = r.admin.post(
                        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                        &crd,
                    );
                    assert_eq!(c.code, 201, "crd: {}", c.body);
                    compare_status(f, &r.send(f, Some(&f.body)))
                }
                // A ValidatingAdmissionPolicy refusing a pod: the recording shows the refusal;
                // its policy and binding (not recorded) required resource limits on every
                // container of the pods in the namespace. It answers before ResourceQuota
                // (fixture 15's quota is still full), as the admission chain orders them.
                "17" => {
                    let policy = json!({
                        "apiVersion": "admissionregistration.k8s.io/v1beta1",
                        "kind": "ValidatingAdmissionPolicy",
                        "metadata": {"name": "fixture-require-limits"},
                        "spec": {"failurePolicy": "Fail",
                            "matchConstraints": {"resourceRules": [{"apiGroups": [""],
                                "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
                                "resources": ["pods"]}]},
                            "validations": [{
                                "expression": "object.spec.containers.all(c, has(c.resources.limits))",
                                "message": "every container must set resource limits"}]}});
                    let binding = json!({
                        "apiVersion": "admissionregistration.k8s.io/v1beta1",
                        "kind": "ValidatingAdmissionPolicyBinding",
                        "metadata": {"name": "fixture-require-limits"},
                        "spec": {"policyName": "fixture-require-limits",
                            "validationActions": ["Deny"],
                            "matchResources": {"namespaceSelector": {
                                "matchLabels": {"kubernetes.io/metadata.name": NS}}}}});
                    for (what, body) in [
                        ("validatingadmissionpolicies", policy),
                        ("validatingadmissionpolicybindings", binding),
                    ] {
                        let c = r.admin.post(
                            &format!("/apis/admissionregistration.k8s.io/v1beta1/{what}"),
                            &body,
                        );
                        assert_eq!(c.code, 201, "{what}: {}", c.body);
                    }
                    compare_status(f, &r.send(f, Some(&f.body)))
                }
                // Patches of a pod the recording made in its own namespace: a wrong uid (18,
                // and a JSON patch `test` of it, 20) is 422, a stale resourceVersion (19) 409.
                "18" | "19" | "20" => {
                    let ns = r.admin.post(
                        "/api/v1/namespaces",
                        &json!({"metadata": {"name": "fixtures-uid"}}),
                    );
                    assert!(matches!(ns.code, 201 | 409), "namespace: {}", ns.body);
                    let pod = r
                        .admin
                        .post("/api/v1/namespaces/fixtures-uid/pods", &pod_body("patched"));
                    assert!(matches!(pod.code, 201 | 409), "pod: {}", pod.body);
                    compare_status(f, &r.send(f, Some(&f.body)))
                }
                // Status writes to a custom resource the recording made (`counted`, with
                // `registry.k8s.io/pause:3.9`): a merge patch naming another uid is applied
                // (21); a JSON patch testing the uid holds it back (22) or applies (23, the
                // recording's uid there is the object's: ours goes in its place); a stale
                // resourceVersion is 409 (24).
                "21" | "22" | "23" | "24" => {
                    let base = "/apis/immortalcontainer.flugel.it/v1alpha1/namespaces/fixtures-status/immortalcontainers";
                    if number == "21" {
                        let ns = r.admin.post(
                            "/api/v1/namespaces",
                            &json!({"metadata": {"name": "fixtures-status"}}),
                        );
                        assert_eq!(ns.code, 201, "namespace: {}", ns.body);
                        let ic = r.admin.post(
                            base,
                            &json!({"apiVersion": "immortalcontainer.flugel.it/v1alpha1",
                                "kind": "ImmortalContainer", "metadata": {"name": "counted"},
                                "spec": {"image": "registry.k8s.io/pause:3.9"}}),
                        );
                        assert_eq!(ic.code, 201, "object: {}", ic.body);
                    }
                    let uid = r.admin.get(&format!("{base}/counted")).body["metadata"]["uid"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string();
                    let body = f.body.replace("4aa4bcb4-721f-41a3-b84e-dce9bccb183b", &uid);
                    let got = r.send(f, Some(&body));
                    if f.status == 200 {
                        compare_object(f, &got, &uid)
                    } else {
                        compare_status(f, &got)
                    }
                }
                // Fields of newer Kubernetes in a pod: dropped with a warning each (25), or
                // the create refused under strict field validation (26); a custom resource's
                // unknown field pruned with the same warning (28).
                "25" | "26" | "28" => {
                    if number == "25" {
                        let ns = r.admin.post(
                            "/api/v1/namespaces",
                            &json!({"metadata": {"name": "fixtures-fields"}}),
                        );
                        assert_eq!(ns.code, 201, "namespace: {}", ns.body);
                    }
                    let got = r.send(f, Some(&f.body));
                    let mut d = compare_warnings(f, &got);
                    if f.status == 400 {
                        let mut want = f.clone();
                        let mut recorded: Value = serde_json::from_str(&f.response).expect("json");
                        recorded["message"] = json!(fields_sorted(&recorded["message"]));
                        want.response = recorded.to_string();
                        let mut got = got;
                        got.body["message"] = json!(fields_sorted(&got.body["message"]));
                        d.extend(compare_status(&want, &got));
                    } else if got.code != f.status {
                        d.push(format!(
                            "code: expected {}, got {} ({})",
                            f.status, got.code, got.body
                        ));
                    } else {
                        let want: Value = serde_json::from_str(&f.response).expect("json");
                        for field in ["schedulingGroup", "securityContext", "imagePullPolicy"] {
                            if want["spec"].get(field) != got.body["spec"].get(field) {
                                d.push(format!(
                                    "spec.{field}: expected {}, got {}",
                                    want["spec"][field], got.body["spec"][field]
                                ));
                            }
                        }
                        let rules = &got.body["spec"]["containers"][0]["restartPolicyRules"];
                        if !rules.is_null() {
                            d.push(format!("restartPolicyRules kept: {rules}"));
                        }
                    }
                    d
                }
                // CRDs: what the structural-schema rules refuse (27, 29-31, 33-42) and what
                // they let through (32, 43-45).
                "27" | "29" | "30" | "31" | "32" | "33" | "34" | "35" | "36" | "37" | "38"
                | "39" | "40" | "41" | "42" | "43" | "44" | "45" => {
                    let got = r.send(f, Some(&f.body));
                    if f.status == 201 {
                        let name = got.body["metadata"]["name"]
                            .as_str()
                            .unwrap_or("")
                            .to_string();
                        r.admin.delete(
                            &format!(
                                "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"
                            ),
                            None,
                        );
                        if got.code == 201 {
                            Vec::new()
                        } else {
                            vec![format!(
                                "code: expected 201, got {} ({})",
                                got.code, got.body
                            )]
                        }
                    } else {
                        compare_status(f, &got)
                    }
                }
                // The project's CRD refusing: rules with a fieldPath on one node, their paths
                // run together (46); two containers of one name (47); the fields the operator
                // keeps, each with its reason (48).
                "46" | "47" => compare_status(f, &r.send(f, Some(&f.body))),
                // A pod whose sleep action 1.28 does not know: dropped with a warning, and the
                // hook left without a handler refused, the warnings sent with the 422 (51).
                "51" => {
                    let got = r.send(f, Some(&f.body));
                    let mut d = compare_warnings(f, &got);
                    d.extend(compare_status(f, &got));
                    d
                }
                // The API server walks an object's fields in Go's map order, which is random:
                // the causes compared in order of their fields.
                "48" => {
                    let by_field = |mut status: Value| {
                        if let Some(c) = status["details"]["causes"].as_array_mut() {
                            c.sort_by(|a, b| a["field"].as_str().cmp(&b["field"].as_str()));
                        }
                        status["message"] = Value::Null;
                        status
                    };
                    let mut want = f.clone();
                    want.response =
                        by_field(serde_json::from_str(&f.response).expect("json")).to_string();
                    let mut got = r.send(f, Some(&f.body));
                    got.body = by_field(got.body);
                    compare_status(&want, &got)
                }
                // A native sidecar, with the gate on: its restartPolicy kept (49). The pod as
                // the hollow node runs it (50): both containers running; its sidecar never
                // reported ready is the hollow node's, not Kubernetes' (README, KEP-753), so
                // readiness is not compared.
                "49" => {
                    let got = r.send(f, Some(&f.body));
                    let mut d = compare_warnings(f, &got);
                    let policy = &got.body["spec"]["initContainers"][0]["restartPolicy"];
                    if got.code != 201 || policy != "Always" {
                        d.push(format!(
                            "expected 201 keeping restartPolicy Always, got {} ({policy})",
                            got.code
                        ));
                    }
                    d
                }
                "50" => {
                    let up = |p: &Value, list: &str| {
                        p["status"][list][0]["state"]["running"].is_object()
                    };
                    let got = wait_for(
                        10,
                        "the sidecar pod's containers running",
                        || r.admin.get(&f.path).body,
                        |p| up(p, "initContainerStatuses") && up(p, "containerStatuses"),
                    );
                    let want: Value = serde_json::from_str(&f.response).expect("json");
                    let mut d = Vec::new();
                    for k in ["phase", "qosClass"] {
                        if got["status"][k] != want["status"][k] {
                            d.push(format!(
                                "status.{k}: expected {}, got {}",
                                want["status"][k], got["status"][k]
                            ));
                        }
                    }
                    d
                }
                // A watch from a version the server has not reached answers 200 and then
                // nothing, though the object changes below that version (52).
                "52" => {
                    let ns = r.admin.post(
                        "/api/v1/namespaces",
                        &json!({"metadata": {"name": "fixtures-restore"}}),
                    );
                    assert_eq!(ns.code, 201, "namespace: {}", ns.body);
                    let ic = r.admin.post(
                        RESTORED,
                        &json!({"apiVersion": "immortalcontainer.flugel.it/v1alpha1",
                            "kind": "ImmortalContainer", "metadata": {"name": "example"},
                            "spec": {"image": "nginx:1.27"}}),
                    );
                    assert_eq!(ic.code, 201, "object: {}", ic.body);
                    let from = r.current_rv() + 1000;
                    r.replay_watch(
                        f,
                        |_| from,
                        |r| {
                            merge_patch(
                                r,
                                &format!("{RESTORED}/example"),
                                json!({"metadata": {"annotations": {"touched": "1"}}}),
                                "annotate",
                            )
                        },
                    )
                }
                // etcd restored from a snapshot taken before the object's count went from 1
                // to 4 and its image changed: a read answers the snapshot's object, at a
                // version lower than the one answered before the restore (53), and so does
                // a list (54).
                "53" => {
                    let path = format!("{RESTORED}/example");
                    let status = |starts: i64| json!({"status": {"startTimes": starts}});
                    let d = merge_patch(&r, &format!("{path}/status"), status(1), "count 1");
                    assert!(d.is_empty(), "{d:?}");
                    let snapshot = r.server.snapshot();
                    let d = merge_patch(&r, &format!("{path}/status"), status(4), "count 4");
                    assert!(d.is_empty(), "{d:?}");
                    let image = json!({"spec": {"image": "nginx:1.28"}});
                    let d = merge_patch(&r, &path, image, "image");
                    assert!(d.is_empty(), "{d:?}");
                    let before = r.admin.get(&path).body["metadata"]["resourceVersion"].clone();
                    r.server.restore(&snapshot);
                    before_restore = before.as_str().map(String::from);
                    let got = r.send(f, None);
                    let mut d = restored(f, &got.body, &got.body, before_restore.as_deref());
                    if got.code != f.status {
                        d.push(format!("code: expected {}, got {}", f.status, got.code));
                    }
                    d
                }
                "54" => {
                    let got = r.send(f, None);
                    let item = &got.body["items"][0];
                    restored(f, item, &got.body, before_restore.as_deref())
                }
                // A watch from the version answered before the restore: 200, then nothing.
                "55" => {
                    let from = before_restore.as_deref().and_then(|v| v.parse().ok());
                    r.replay_watch(f, |_| from.unwrap_or(0), |_| Vec::new())
                }
                // A status write carrying the version answered before the restore: 409.
                "56" => {
                    let recorded = f.body.split('"').nth(5).unwrap_or_default();
                    let body = f
                        .body
                        .replace(recorded, before_restore.as_deref().unwrap_or(""));
                    compare_status(f, &r.send(f, Some(&body)))
                }
                _ => vec!["a fixture this replay does not know".into()],
            };
            replayed += 1;
            if !diffs.is_empty() {
                let what = if f.what.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", f.what)
                };
                failures.push(format!("{}{what}:\n  {}", f.name, diffs.join("\n  ")));
            }
        }
        assert_eq!(replayed, 56, "every fixture was replayed");
        assert!(
            failures.is_empty(),
            "fixtures that differ:\n{}",
            failures.join("\n")
        );
        drop(r.server);
    });
}

#[test]
fn real_prober_normalization_only_touches_events_with_containers_not_running() {
    let creating = json!({"type": "MODIFIED", "object": {"status": {
        "conditions": [{"type": "Ready", "status": "True"}, {"type": "PodScheduled", "status": "True"}],
        "containerStatuses": [{"state": {"waiting": {"reason": "ContainerCreating"}}}]}}});
    let n = real_prober(creating);
    assert_eq!(
        n["object"]["status"]["conditions"][0]["reason"],
        "ContainersNotReady"
    );
    assert_eq!(n["object"]["status"]["conditions"][1]["status"], "True");
    let running = json!({"type": "MODIFIED", "object": {"status": {
        "conditions": [{"type": "Ready", "status": "True"}],
        "containerStatuses": [{"state": {"running": {}}}]}}});
    assert_eq!(real_prober(running.clone()), running);
}
