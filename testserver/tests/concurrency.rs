//! Requests served concurrently keep every guarantee a serial server gives: parallel creates
//! get distinct, increasing resourceVersions and every watch sees each once, in order; updates
//! are decided against the object as it is when they commit (of two writers racing with one
//! resourceVersion exactly one wins, a patch lands on what the other writer left); writes to
//! different objects all land; a quota admits no more than it allows; and reads and other
//! writes go on while a write waits to commit. Races are forced with `before_commit` stalls
//! (a write held after its checks, just before it commits), not left to timing.

mod common;

use common::{bounded, start_without_kubelet, Client};
use kube_testserver::{StallRule, TestServer};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

const PODS: &str = "/api/v1/namespaces/default/pods";

fn rv(v: &Value) -> u64 {
    v["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no resourceVersion in {v}"))
}

fn pod(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"app": "x"}},
        "spec": {"containers": [{"name": "c", "image": "nginx:latest"}]}})
}

/// Waits until stall rules hold `n` requests (the bound of the test ends a wait that never
/// ends).
fn until_stalled(server: &TestServer, n: usize) {
    while server.stalled() < n {
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Holds every write of `verb` just before it commits, until lifted.
fn hold_before_commit(server: &TestServer, verb: &str) -> kube_testserver::StallId {
    server.stall(StallRule {
        verb: Some(verb.into()),
        before_commit: true,
        ..StallRule::default()
    })
}

/// Reads a watch to its end on a thread: (type, name, resourceVersion) of each event other
/// than BOOKMARK.
fn record(client: &Client, path: &str) -> std::thread::JoinHandle<Vec<(String, String, u64)>> {
    let mut w = client.watch(path);
    std::thread::spawn(move || {
        let mut seen = Vec::new();
        while let Ok(Some(e)) = w.next() {
            if e["type"] == "BOOKMARK" {
                continue;
            }
            let o = &e["object"];
            seen.push((
                e["type"].as_str().unwrap_or("").to_string(),
                o["metadata"]["name"].as_str().unwrap_or("").to_string(),
                rv(o),
            ));
        }
        seen
    })
}

#[test]
fn parallel_creates_get_distinct_increasing_versions_and_every_watch_sees_each_once_in_order() {
    bounded(60, || {
        let (server, admin) = start_without_kubelet();
        let from = rv(&admin.get(PODS).body);
        let watches = [
            record(
                &admin,
                &format!("/api/v1/pods?watch=true&resourceVersion={from}&timeoutSeconds=60"),
            ),
            record(
                &admin,
                &format!("{PODS}?watch=true&resourceVersion={from}&labelSelector=app%3Dx&timeoutSeconds=60&allowWatchBookmarks=true"),
            ),
        ];
        let (threads, each) = (16, 40);
        let writers: Vec<_> = (0..threads)
            .map(|t| {
                let c = Client::admin(&server);
                std::thread::spawn(move || {
                    let mut created = Vec::new();
                    for i in 0..each {
                        let r = c.post(PODS, &pod(&format!("p-{t}-{i}")));
                        assert_eq!(r.code, 201, "{}", r.body);
                        created.push((format!("p-{t}-{i}"), rv(&r.body)));
                    }
                    created
                })
            })
            .collect();
        let mut created: BTreeMap<String, u64> = BTreeMap::new();
        for w in writers {
            let mine = w.join().expect("writer");
            // One client's writes, one after the other, get increasing versions.
            assert!(mine.windows(2).all(|p| p[0].1 < p[1].1), "{mine:?}");
            created.extend(mine);
        }
        let versions: BTreeSet<u64> = created.values().copied().collect();
        assert_eq!(
            versions.len(),
            threads * each,
            "every create its own version"
        );
        assert!(versions.iter().all(|v| *v > from));

        // Every event committed before the drop reaches the stream before it breaks.
        server.drop_watches();
        for w in watches {
            let seen = w.join().expect("watch reader");
            assert_eq!(seen.len(), threads * each, "one event per create");
            assert!(seen.iter().all(|(typ, _, _)| typ == "ADDED"));
            assert!(
                seen.windows(2).all(|p| p[0].2 < p[1].2),
                "events in resourceVersion order"
            );
            let as_seen: BTreeMap<String, u64> =
                seen.into_iter().map(|(_, name, v)| (name, v)).collect();
            assert_eq!(
                as_seen, created,
                "each object once, at its create's version"
            );
        }
    });
}

#[test]
fn of_two_patches_racing_with_one_resource_version_exactly_one_wins() {
    bounded(60, || {
        let (server, admin) = start_without_kubelet();
        admin.post(PODS, &pod("contended"));
        let path = format!("{PODS}/contended");
        for round in 0..10 {
            let before = rv(&admin.get(&path).body);
            let stall = hold_before_commit(&server, "patch");
            // Both read the object at `before`, pass the precondition and wait to commit.
            let racers: Vec<_> = ["a", "b"]
                .into_iter()
                .map(|who| {
                    let c = Client::admin(&server);
                    let path = path.clone();
                    let body = json!({"metadata": {"resourceVersion": before.to_string(),
                        "labels": {"winner": format!("{who}{round}")}}});
                    std::thread::spawn(move || (who, c.merge_patch(&path, &body)))
                })
                .collect();
            until_stalled(&server, 2);
            server.lift_stall(stall);
            let answers: Vec<_> = racers
                .into_iter()
                .map(|r| r.join().expect("racer"))
                .collect();
            let won: Vec<_> = answers.iter().filter(|(_, r)| r.code == 200).collect();
            let lost: Vec<_> = answers.iter().filter(|(_, r)| r.code == 409).collect();
            assert_eq!((won.len(), lost.len()), (1, 1), "{answers:?}");
            assert_eq!(lost[0].1.body["reason"], "Conflict");
            let now = admin.get(&path).body;
            assert_eq!(
                now["metadata"]["labels"]["winner"],
                format!("{}{round}", won[0].0)
            );
            assert_eq!(rv(&now), rv(&won[0].1.body));
            assert!(rv(&now) > before);
        }
    });
}

#[test]
fn a_patch_held_before_its_commit_lands_on_the_object_as_it_is_then_while_reads_and_writes_go_on() {
    bounded(30, || {
        let (server, admin) = start_without_kubelet();
        admin.post(PODS, &pod("target"));
        let path = format!("{PODS}/target");
        let stall = hold_before_commit(&server, "patch");
        let held = {
            let c = Client::admin(&server);
            let path = path.clone();
            std::thread::spawn(move || {
                c.merge_patch(&path, &json!({"metadata": {"labels": {"first": "held"}}}))
            })
        };
        until_stalled(&server, 1);

        // Reads are answered while the write waits to commit; it has not taken effect.
        let read = admin.get(&path);
        assert_eq!(read.code, 200);
        assert!(read.body["metadata"]["labels"]["first"].is_null());
        assert_eq!(admin.get(PODS).code, 200);
        assert_eq!(admin.get("/apis").code, 200);
        // So are writes not held: a create, and an update of the very object.
        assert_eq!(admin.post(PODS, &pod("other")).code, 201);
        let mut replaced = read.body.clone();
        replaced["metadata"]["labels"]["second"] = json!("put");
        let put = admin.put(&path, &replaced);
        assert_eq!(put.code, 200, "{}", put.body);

        server.lift_stall(stall);
        let patched = held.join().expect("held patch");
        assert_eq!(patched.code, 200, "{}", patched.body);
        // Applied to the object the PUT left, not to the one it was first computed from.
        let labels = &patched.body["metadata"]["labels"];
        assert_eq!(labels["first"], "held");
        assert_eq!(labels["second"], "put");
        assert!(rv(&patched.body) > rv(&put.body));
        assert_eq!(admin.get(&path).body, patched.body);
    });
}

#[test]
fn a_precondition_is_checked_against_the_object_when_the_write_commits() {
    bounded(30, || {
        let (server, admin) = start_without_kubelet();
        let created = admin.post(PODS, &pod("target"));
        let path = format!("{PODS}/target");
        let stall = hold_before_commit(&server, "update");
        let held = {
            let c = Client::admin(&server);
            let path = path.clone();
            // Up to date when it is read and checked...
            let mut body = created.body.clone();
            body["metadata"]["labels"]["by"] = json!("stale-writer");
            std::thread::spawn(move || c.put(&path, &body))
        };
        until_stalled(&server, 1);
        // ...but not any more when it commits.
        let moved = admin.merge_patch(&path, &json!({"metadata": {"labels": {"by": "other"}}}));
        assert_eq!(moved.code, 200);
        server.lift_stall(stall);
        let answer = held.join().expect("held update");
        assert_eq!(answer.code, 409, "{}", answer.body);
        assert_eq!(
            admin.get(&path).body["metadata"]["labels"]["by"],
            "other",
            "the stale write changed nothing"
        );
    });
}

#[test]
fn parallel_patches_of_one_object_without_preconditions_all_land() {
    bounded(60, || {
        let (server, admin) = start_without_kubelet();
        let first = rv(&admin.post(PODS, &pod("shared")).body);
        let path = format!("{PODS}/shared");
        let (threads, each) = (8, 15);
        let writers: Vec<_> = (0..threads)
            .map(|t| {
                let c = Client::admin(&server);
                let path = path.clone();
                std::thread::spawn(move || {
                    for i in 0..each {
                        let body =
                            json!({"metadata": {"labels": {format!("t{t}"): i.to_string()}}});
                        let r = c.merge_patch(&path, &body);
                        assert_eq!(r.code, 200, "{}", r.body);
                        assert_eq!(r.body["metadata"]["labels"][format!("t{t}")], i.to_string());
                    }
                })
            })
            .collect();
        for w in writers {
            w.join().expect("writer");
        }
        let now = admin.get(&path).body;
        for t in 0..threads {
            assert_eq!(
                now["metadata"]["labels"][format!("t{t}")],
                (each - 1).to_string(),
                "no write lost: {now}"
            );
        }
        // Every patch changed the object: one commit each.
        assert_eq!(rv(&now), first + (threads * each) as u64);
    });
}

#[test]
fn parallel_read_modify_write_loops_on_different_objects_all_land() {
    bounded(60, || {
        let (server, admin) = start_without_kubelet();
        let (threads, rounds) = (8, 20);
        let writers: Vec<_> = (0..threads)
            .map(|t| {
                let c = Client::admin(&server);
                std::thread::spawn(move || {
                    let name = format!("own-{t}");
                    let mut obj = c.post(PODS, &pod(&name)).body;
                    for i in 1..=rounds {
                        // Each carries the version it read: nobody else writes this object,
                        // so none conflicts.
                        obj["metadata"]["labels"]["count"] = json!(i.to_string());
                        let r = c.put(&format!("{PODS}/{name}"), &obj);
                        assert_eq!(r.code, 200, "{}", r.body);
                        obj = r.body;
                    }
                })
            })
            .collect();
        for w in writers {
            w.join().expect("writer");
        }
        for t in 0..threads {
            let obj = admin.get(&format!("{PODS}/own-{t}")).body;
            assert_eq!(obj["metadata"]["labels"]["count"], rounds.to_string());
        }
    });
}

#[test]
fn a_quota_of_three_admits_exactly_three_of_twelve_creates_waiting_to_commit_together() {
    bounded(60, || {
        let (server, admin) = start_without_kubelet();
        admin.post(
            "/api/v1/namespaces",
            &json!({"metadata": {"name": "quoted"}}),
        );
        let quota = admin.post(
            "/api/v1/namespaces/quoted/resourcequotas",
            &json!({"metadata": {"name": "three"}, "spec": {"hard": {"pods": "3"}}}),
        );
        assert_eq!(quota.code, 201, "{}", quota.body);
        let stall = hold_before_commit(&server, "create");
        let creates: Vec<_> = (0..12)
            .map(|i| {
                let c = Client::admin(&server);
                std::thread::spawn(move || {
                    c.post("/api/v1/namespaces/quoted/pods", &pod(&format!("p{i}")))
                })
            })
            .collect();
        // All twelve are validated and admitted by every plugin that needs no count.
        until_stalled(&server, 12);
        server.lift_stall(stall);
        let codes: Vec<u16> = creates
            .into_iter()
            .map(|c| c.join().expect("create").code)
            .collect();
        assert_eq!(codes.iter().filter(|c| **c == 201).count(), 3, "{codes:?}");
        assert_eq!(codes.iter().filter(|c| **c == 403).count(), 9, "{codes:?}");
        let pods = admin.get("/api/v1/namespaces/quoted/pods").body;
        assert_eq!(pods["items"].as_array().map(Vec::len), Some(3));
        let used = admin
            .get("/api/v1/namespaces/quoted/resourcequotas/three")
            .body;
        assert_eq!(used["status"]["used"]["pods"], "3");
    });
}

#[test]
fn a_create_held_before_its_commit_into_a_namespace_deleted_meanwhile_is_refused() {
    bounded(30, || {
        let (server, admin) = start_without_kubelet();
        admin.post(
            "/api/v1/namespaces",
            &json!({"metadata": {"name": "going"}}),
        );
        let stall = hold_before_commit(&server, "create");
        let held = {
            let c = Client::admin(&server);
            std::thread::spawn(move || c.post("/api/v1/namespaces/going/pods", &pod("late")))
        };
        until_stalled(&server, 1);
        assert_eq!(admin.delete("/api/v1/namespaces/going", None).code, 200);
        server.lift_stall(stall);
        let answer = held.join().expect("held create");
        // Terminating (403), or already gone (404): never created into it.
        assert!(
            answer.code == 403 || answer.code == 404,
            "{} {}",
            answer.code,
            answer.body
        );
        assert_eq!(admin.get("/api/v1/namespaces/going/pods/late").code, 404);
    });
}
