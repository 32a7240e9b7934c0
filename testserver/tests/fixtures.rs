//! Replays the recorded kube-apiserver fixtures (tests/fixtures/kube-apiserver/*.http) in
//! order against a fresh server and compares status codes, Status reasons and details, body
//! shapes and watch event sequences. Versions and uids differ between servers, so the ones
//! the recording returned are mapped to ours before later requests use them.

mod common;

use common::http_fixture::{load, parse as parse_fixture, Fixture};
use common::{bounded, types, Client, End};
use kube_testserver::{Options, TestServer};
use serde_json::{json, Value};
use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

/// Keys of an object, ignoring what 1.20+ servers and ours leave out on purpose.
fn keys(v: &Value) -> BTreeSet<String> {
    v.as_object()
        .map(|m| {
            m.keys()
                .filter(|k| *k != "selfLink" && *k != "managedFields")
                .cloned()
                .collect()
        })
        .unwrap_or_default()
}

/// Real-server values (versions, uids) mapped to ours.
#[derive(Default)]
struct Ids {
    map: HashMap<String, String>,
}

impl Ids {
    fn learn(&mut self, expected: &Value, actual: &Value) {
        for field in ["resourceVersion", "uid"] {
            if let (Some(e), Some(a)) = (
                expected["metadata"][field].as_str(),
                actual["metadata"][field].as_str(),
            ) {
                self.map.insert(e.to_string(), a.to_string());
            }
        }
    }

    fn rewrite(&self, text: &str) -> String {
        let mut out = text.to_string();
        for (real, ours) in &self.map {
            // uids are unique text; versions are only rewritten where they appear as a
            // version (quoted in JSON, or a query value).
            if real.contains('-') {
                out = out.replace(real.as_str(), ours);
            } else {
                out = out.replace(
                    &format!("\"resourceVersion\":\"{real}\""),
                    &format!("\"resourceVersion\":\"{ours}\""),
                );
                out = out.replace(
                    &format!("resourceVersion={real}&"),
                    &format!("resourceVersion={ours}&"),
                );
            }
        }
        out
    }
}

/// Compares a non-watch response; returns the differences found.
fn compare_body(f: &Fixture, expected: &Value, actual: &Value, ids: &Ids) -> Vec<String> {
    let mut diffs = Vec::new();
    let mut check = |what: &str, e: &Value, a: &Value| {
        if e != a {
            diffs.push(format!("{what}: expected {e}, got {a}"));
        }
    };
    if expected["kind"] == "Status" {
        for k in ["kind", "apiVersion", "status", "reason", "code", "metadata"] {
            check(k, &expected[k], &actual[k]);
        }
        let d = &expected["details"];
        let ad = &actual["details"];
        check("details keys", &json!(keys(d)), &json!(keys(ad)));
        for k in ["name", "group", "kind"] {
            check(&format!("details.{k}"), &d[k], &ad[k]);
        }
        let causes = |v: &Value| -> Vec<(Value, Value)> {
            v["causes"]
                .as_array()
                .map(|c| {
                    c.iter()
                        .map(|x| (x["reason"].clone(), x["field"].clone()))
                        .collect()
                })
                .unwrap_or_default()
        };
        check(
            "causes",
            &json!(format!("{:?}", causes(d))),
            &json!(format!("{:?}", causes(ad))),
        );
        let msg = expected["message"].as_str().unwrap_or("");
        let msg = ids.rewrite(msg);
        if msg.starts_with("too old resource version") {
            check(
                "message prefix",
                &json!(true),
                &json!(actual["message"]
                    .as_str()
                    .unwrap_or("")
                    .starts_with("too old resource version: ")),
            );
        } else if f.name.starts_with("24-") {
            // The record names a uid of the recording's own pod.
            check(
                "message prefix",
                &json!(msg.split(" (").next()),
                &json!(actual["message"].as_str().unwrap_or("").split(" (").next()),
            );
        } else {
            check("message", &json!(msg), &actual["message"]);
        }
        return diffs;
    }
    check(
        "top-level keys",
        &json!(keys(expected)),
        &json!(keys(actual)),
    );
    for k in ["kind", "apiVersion", "groupVersion"] {
        check(k, &expected[k], &actual[k]);
    }
    if let Some(items) = expected["items"].as_array() {
        let actual_items = actual["items"].as_array().cloned().unwrap_or_default();
        check(
            "item count",
            &json!(items.len()),
            &json!(actual_items.len()),
        );
        if let (Some(e), Some(a)) = (items.first(), actual_items.first()) {
            check("item keys", &json!(keys(e)), &json!(keys(a)));
            check(
                "item metadata.name",
                &e["metadata"]["name"],
                &a["metadata"]["name"],
            );
        }
        check(
            "list metadata keys",
            &json!(keys(&expected["metadata"])),
            &json!(keys(&actual["metadata"])),
        );
        return diffs;
    }
    if let Some(resources) = expected["resources"].as_array() {
        let summary = |rs: &[Value]| -> Vec<(Value, Value, Value)> {
            rs.iter()
                .map(|r| (r["name"].clone(), r["kind"].clone(), r["verbs"].clone()))
                .collect()
        };
        let got = actual["resources"].as_array().cloned().unwrap_or_default();
        check(
            "resources",
            &json!(format!("{:?}", summary(resources))),
            &json!(format!("{:?}", summary(&got))),
        );
        return diffs;
    }
    if let Some(groups) = expected["groups"].as_array() {
        let names = |gs: &[Value]| -> BTreeSet<String> {
            gs.iter()
                .filter_map(|g| g["name"].as_str().map(String::from))
                .collect()
        };
        let ours = names(
            actual["groups"]
                .as_array()
                .map(Vec::as_slice)
                .unwrap_or(&[]),
        );
        let theirs = names(groups);
        check(
            "served groups are real groups",
            &json!(true),
            &json!(ours.is_subset(&theirs)),
        );
        check(
            "custom group listed",
            &json!(true),
            &json!(ours.contains("immortalcontainer.flugel.it")),
        );
        return diffs;
    }
    if expected.get("metadata").is_some() {
        let (em, am) = (&expected["metadata"], &actual["metadata"]);
        for k in ["name", "namespace", "generation"] {
            check(&format!("metadata.{k}"), &em[k], &am[k]);
        }
        let labels: Value =
            serde_json::from_str(&ids.rewrite(&em["labels"].to_string())).unwrap_or(Value::Null);
        check("metadata.labels", &labels, &am["labels"]);
        check("metadata keys", &json!(keys(em)), &json!(keys(am)));
        check("status", &expected["status"], &actual["status"]);
        if expected["kind"] != "Pod" {
            // Pod specs differ by the service-account volume a real cluster injects.
            check("spec", &expected["spec"], &actual["spec"]);
        } else {
            let fields = [
                "restartPolicy",
                "dnsPolicy",
                "schedulerName",
                "terminationGracePeriodSeconds",
                "tolerations",
            ];
            for k in fields {
                check(
                    &format!("spec.{k}"),
                    &expected["spec"][k],
                    &actual["spec"][k],
                );
            }
            check(
                "container pull policy",
                &expected["spec"]["containers"][0]["imagePullPolicy"],
                &actual["spec"]["containers"][0]["imagePullPolicy"],
            );
        }
    }
    diffs
}

/// Runs what happened on the recorded cluster while a watch fixture was streaming.
fn during_watch(f: &Fixture, admin: &Client) {
    std::thread::sleep(Duration::from_millis(200));
    if f.name.starts_with("30-") {
        let r = admin.send(
            "PATCH",
            "/api/v1/namespaces/fixtures/pods/example-immortalpod",
            Some("application/strategic-merge-patch+json"),
            Some(r#"{"metadata":{"labels":{"touched":"yes"}}}"#),
        );
        assert_eq!(r.code, 200, "label patch: {:?}", r.body);
        let r = admin.delete("/api/v1/namespaces/fixtures/pods/example-immortalpod", None);
        assert_eq!(r.code, 200, "pod delete: {:?}", r.body);
    } else if f.name.starts_with("31-") {
        let path = "/apis/immortalcontainer.flugel.it/v1alpha1/namespaces/fixtures/immortalcontainers/example";
        let r = admin.merge_patch(path, &json!({"spec": {"image": "nginx:1.27"}}));
        assert_eq!(r.code, 200, "spec patch: {:?}", r.body);
        let r = admin.delete(path, None);
        assert_eq!(r.code, 200, "ic delete: {:?}", r.body);
    }
}

/// Replays a watch fixture and compares the event sequence and event shapes.
fn replay_watch(f: &Fixture, client: &Client, admin: &Client, path: &str) -> Vec<String> {
    let mut diffs = Vec::new();
    let expected: Vec<Value> = f
        .response
        .lines()
        .filter(|l| !l.trim().is_empty())
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let watch = client.watch(path);
    if !watch.chunked.contains("chunked") {
        diffs.push(format!("transfer-encoding {:?}", watch.chunked));
    }
    if watch.content_type != "application/json" {
        diffs.push(format!("content-type {:?}", watch.content_type));
    }
    let f2 = f.clone();
    let admin2 = admin.clone();
    let actor = std::thread::spawn(move || during_watch(&f2, &admin2));
    let (events, end) = watch.collect();
    if actor.join().is_err() {
        diffs.push("actions during the watch failed".into());
    }
    if end != End::Clean {
        diffs.push(format!("stream did not end cleanly: {end:?}"));
    }
    if types(&expected) != types(&events) {
        diffs.push(format!(
            "event types: expected {:?}, got {:?}",
            types(&expected),
            types(&events)
        ));
        return diffs;
    }
    for (e, a) in expected.iter().zip(events.iter()) {
        let (eo, ao) = (&e["object"], &a["object"]);
        for k in ["kind", "apiVersion", "reason", "code"] {
            if eo[k] != ao[k] {
                diffs.push(format!(
                    "{} object.{k}: expected {}, got {}",
                    e["type"], eo[k], ao[k]
                ));
            }
        }
        if keys(eo) != keys(ao) {
            diffs.push(format!(
                "{} object keys: expected {:?}, got {:?}",
                e["type"],
                keys(eo),
                keys(ao)
            ));
        }
        if e["type"] == "BOOKMARK" && eo != &json!(null) {
            let shape = |o: &Value| {
                let mut o = o.clone();
                o["metadata"]["resourceVersion"] = json!("N");
                o
            };
            if shape(eo) != shape(ao) {
                diffs.push(format!(
                    "bookmark shape: expected {}, got {}",
                    shape(eo),
                    shape(ao)
                ));
            }
        }
        if e["type"] == "MODIFIED" || e["type"] == "DELETED" {
            for k in ["deletionTimestamp", "deletionGracePeriodSeconds"] {
                if eo["metadata"][k].is_null() != ao["metadata"][k].is_null() {
                    diffs.push(format!("{} metadata.{k} presence differs", e["type"]));
                }
            }
        }
    }
    diffs
}

#[test]
fn recorded_fixtures_replay_with_same_codes_reasons_and_shapes() {
    bounded(90, || {
        // Long bookmark interval: like the recording's server, only the bookmark ~2 s before
        // a watch's timeout is sent. No node, scheduler or kubelet: the recording's server had
        // none, so its pods stayed Pending and every deletion was immediate.
        let server = TestServer::start(Options {
            bookmark_interval: Duration::from_secs(60),
            nodes: 0,
            kubelet: None,
            ..Options::default()
        })
        .expect("server starts");
        server.add_user("nobody", "nobody-token", Vec::new());
        let admin = Client::admin(&server);
        let nobody = Client::new(&server, "nobody-token");
        let stranger = Client::new(&server, "not-a-known-token");
        let r = admin.post(
            "/api/v1/namespaces",
            &json!({"metadata": {"name": "fixtures"}}),
        );
        assert_eq!(r.code, 201, "namespace: {:?}", r.body);

        let mut ids = Ids::default();
        let mut failures = Vec::new();
        let fixtures = load("kube-apiserver");
        assert!(
            fixtures.len() >= 32,
            "expected the 32 recorded fixtures, found {}",
            fixtures.len()
        );
        for f in &fixtures {
            let client = match f.name.as_str() {
                n if n.starts_with("26-") => &nobody,
                n if n.starts_with("27-") => &stranger,
                _ => &admin,
            };
            let mut path = ids.rewrite(&format!("{}&", f.path));
            path.pop();
            if f.name.starts_with("28-") {
                // The recorded server had written and compacted past the requested version.
                let marker = json!({"metadata": {"name": "compaction-marker"}, "spec": {}});
                assert_eq!(
                    admin
                        .post(
                            "/apis/coordination.k8s.io/v1/namespaces/default/leases",
                            &marker
                        )
                        .code,
                    201
                );
                server.expire_all();
            }
            if f.name.starts_with("30-") || f.name.starts_with("31-") {
                // The recording resumed from the version of a list made just before.
                let rv = admin.get("/api/v1/namespaces/fixtures/pods").body["metadata"]
                    ["resourceVersion"]
                    .clone();
                let rv = rv.as_str().expect("list rv").to_string();
                let start =
                    path.find("resourceVersion=").expect("rv param") + "resourceVersion=".len();
                let end = path[start..].find('&').map_or(path.len(), |i| start + i);
                path.replace_range(start..end, &rv);
            }
            // Shorter watches than recorded (the bookmark still comes 2 s before the end).
            path = path.replace("timeoutSeconds=5", "timeoutSeconds=3");
            let diffs = if path.contains("watch=true") {
                replay_watch(f, client, &admin, &path)
            } else {
                let body = ids.rewrite(&f.body);
                let body = (!body.is_empty()).then_some(body);
                let resp =
                    client.send(&f.method, &path, f.content_type.as_deref(), body.as_deref());
                let expected: Value =
                    serde_json::from_str(&f.response).expect("fixture body is json");
                let mut diffs = Vec::new();
                if resp.code != f.status {
                    diffs.push(format!(
                        "status: expected {}, got {} ({})",
                        f.status, resp.code, resp.body
                    ));
                } else {
                    diffs = compare_body(f, &expected, &resp.body, &ids);
                    ids.learn(&expected, &resp.body);
                    if let (Some(e), Some(a)) = (
                        expected["metadata"]["resourceVersion"].as_str(),
                        resp.body["metadata"]["resourceVersion"].as_str(),
                    ) {
                        ids.map
                            .entry(e.to_string())
                            .or_insert_with(|| a.to_string());
                    }
                }
                if !resp.content_type.starts_with("application/json") {
                    diffs.push(format!("content-type {:?}", resp.content_type));
                }
                diffs
            };
            if !diffs.is_empty() {
                failures.push(format!("{}:\n  {}", f.name, diffs.join("\n  ")));
            }
        }
        assert!(
            failures.is_empty(),
            "fixtures that differ:\n{}",
            failures.join("\n")
        );
    });
}

#[test]
fn fixture_parser_reads_request_and_response() {
    let f = parse_fixture(
        "x.http",
        "### request\nPOST /api/v1/x\nContent-Type: application/json\n\n{\"a\":1}\n\n### response\nHTTP/1.1 201 Created\nA: b\n\n{\"b\":2}\n",
    );
    assert_eq!(
        (f.method.as_str(), f.path.as_str(), f.status),
        ("POST", "/api/v1/x", 201)
    );
    assert_eq!(f.content_type.as_deref(), Some("application/json"));
    assert_eq!(f.body, "{\"a\":1}");
    assert_eq!(f.response, "{\"b\":2}");
}
