//! End-to-end: day-2 operation. Pods ended on purpose by people and by the cluster (rolling
//! drains, evictions) are replaced at once and never wait on a back-off they did not earn;
//! pods that end as soon as they start still back off; refused creates are retried; and our
//! counting finalizer never keeps a pod from going, whatever happens to its object, its labels
//! or the operator's status writes. Each scenario runs unchanged on a real cluster
//! (`IMMORTAL_E2E_KUBECONFIG`); a step that needs the test server says SKIPPED there. Every
//! scenario ends with the harness checking that no pod of its namespace holds our finalizer.

mod common;

use common::{
    condition, image, name, other_image, reason_message, uid, wait_until, Cluster, Operator,
    COUNT_FINALIZER,
};
use kube_testserver::{FailRule, StallRule};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// How long a pod must run before its end is no longer a quick one (the operator's
/// `restarts::MIN_RUN`), with a second to spare for the whole-second timestamps it is read from.
const RAN_LONG: Duration = Duration::from_secs(11);

/// Records every Ready reason an object shows while it lives, polling every 20 ms, so that a
/// scenario can say which it never showed (a back-off lasts a second at least).
struct Reasons {
    seen: Arc<Mutex<BTreeSet<String>>>,
    stop: Arc<AtomicBool>,
    handle: Option<thread::JoinHandle<()>>,
}

impl Reasons {
    fn watch(c: &Cluster, ic: &str) -> Reasons {
        let (api, path) = (
            c.api.clone(),
            format!(
                "/apis/{}/namespaces/{}/immortalcontainers/{ic}",
                common::GROUP_VERSION,
                c.ns
            ),
        );
        let seen = Arc::new(Mutex::new(BTreeSet::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (s, st) = (seen.clone(), stop.clone());
        let handle = thread::spawn(move || {
            while !st.load(Ordering::Relaxed) {
                if let Ok(obj) = api.get(&path) {
                    if let Some(r) = condition(&obj, "Ready").and_then(|r| r["reason"].as_str()) {
                        s.lock().unwrap().insert(r.to_string());
                    }
                }
                thread::sleep(Duration::from_millis(20));
            }
        });
        Reasons {
            seen,
            stop,
            handle: Some(handle),
        }
    }

    /// Stops watching; answers every reason seen.
    fn stop(mut self) -> BTreeSet<String> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
        self.seen.lock().unwrap().clone()
    }
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

/// Force-deletes each new pod of `ic` as soon as it exists until the object reports the
/// restart back-off; answers how many were deleted.
fn delete_on_sight_until_backing_off(c: &Cluster, ic: &str) -> i64 {
    let mut deleted = 0;
    let mut last = String::new();
    let end = Instant::now() + c.timeout(Duration::from_secs(30));
    while Instant::now() < end {
        if let Some(p) = c.get_pod(&common::pod_name(ic)).expect("get pod") {
            if uid(&p) != last && p["metadata"]["deletionTimestamp"].is_null() {
                last = uid(&p).to_string();
                if c.delete_pod_with_grace(name(&p), uid(&p), Some(0)) {
                    deleted += 1;
                }
            }
        }
        if condition(&c.ic(ic), "Ready").is_some_and(|r| r["reason"] == "PodRestartBackOff") {
            return deleted;
        }
        thread::sleep(Duration::from_millis(20));
    }
    panic!("{ic} never reported PodRestartBackOff after {deleted} deletions");
}

#[test]
fn a_pod_that_ran_a_while_is_replaced_at_once_even_right_after_quick_replacements() {
    let c = Cluster::new("ran-long");
    let _op = Operator::start(&c);
    c.create_ic("web", &image());
    c.wait_converged("web", 1, |_| Ok(()));
    // A streak of pods deleted as soon as they appear: the operator backs off, and says so.
    let deleted = delete_on_sight_until_backing_off(&c, "web");
    let ic = c.ic("web");
    assert!(
        ic["status"]["currentPod"].is_null(),
        "while it waits, status names no pod: {}",
        ic["status"]
    );
    let running = c.wait_converged("web", 1 + deleted, |_| Ok(()));
    // That pod runs for a while, then is deleted, as a person or a drain would: replaced at
    // once, the streak before it notwithstanding.
    thread::sleep(RAN_LONG);
    let reasons = Reasons::watch(&c, "web");
    assert!(c.delete_pod_with_grace(name(&running), uid(&running), None));
    replaced(&c, "web", &running, 2 + deleted);
    let seen = reasons.stop();
    assert!(
        !seen.contains("PodRestartBackOff"),
        "the replacement waited on a back-off it did not earn: {seen:?}"
    );
}

#[test]
fn a_rolling_drain_of_several_nodes_never_waits_on_a_back_off() {
    let c = Cluster::new("rolling-drain");
    if let Some(server) = c.test_server() {
        server.add_node("node-1");
        server.add_node("node-2");
    }
    let _op = Operator::start(&c);
    c.create_ic("web", &image());
    let mut pod = c.wait_converged("web", 1, |_| Ok(()));
    let reasons = Reasons::watch(&c, "web");
    // `kubectl drain` of each node in turn: cordon it, evict its pods, and once the
    // replacement runs elsewhere (after it has run for a while, as drains go), the next. With a
    // single node, the node is uncordoned for the replacement to be scheduled.
    let single = c.schedulable_nodes().len() < 2;
    for step in 0..3 {
        thread::sleep(RAN_LONG);
        let node = pod["spec"]["nodeName"]
            .as_str()
            .expect("scheduled")
            .to_string();
        let cordoned = c.cordon(&node);
        c.evict_pod(name(&pod));
        if single {
            c.wait_ready("web", "False", "PodUnschedulable");
            drop(cordoned);
            pod = replaced(&c, "web", &pod, 2 + step);
        } else {
            pod = replaced(&c, "web", &pod, 2 + step);
            assert_ne!(pod["spec"]["nodeName"], node.as_str());
            drop(cordoned);
        }
    }
    let seen = reasons.stop();
    assert!(
        !seen.contains("PodRestartBackOff"),
        "a drain step waited on a back-off: {seen:?}"
    );
}

#[test]
fn a_pod_that_fails_as_soon_as_it_starts_still_backs_off() {
    let c = Cluster::new("fails-at-once");
    let _op = Operator::start(&c);
    c.create_ic("web", &image());
    c.wait_converged("web", 1, |_| Ok(()));
    // Each new pod gets a one-second activeDeadlineSeconds: the kubelet fails it a second after
    // it started (phase Failed, DeadlineExceeded), again and again.
    let mut failed = BTreeSet::new();
    let end = Instant::now() + c.timeout(Duration::from_secs(40));
    let backing_off = loop {
        assert!(
            Instant::now() < end,
            "never backed off; {} pods failed",
            failed.len()
        );
        if let Some(p) = c.get_pod(&common::pod_name("web")).expect("get pod") {
            let live = p["metadata"]["deletionTimestamp"].is_null();
            if live && p["spec"]["activeDeadlineSeconds"].is_null() {
                // The pod may be gone (or going) by the time the patch lands: then it is not
                // one of ours to fail.
                let patched = c.api.merge_patch(
                    &format!("/api/v1/namespaces/{}/pods/{}", c.ns, name(&p)),
                    &json!({"metadata": {"uid": uid(&p)}, "spec": {"activeDeadlineSeconds": 1}}),
                );
                match patched {
                    Ok(_) => {
                        failed.insert(uid(&p).to_string());
                    }
                    Err(e) if matches!(e.code(), Some(404 | 409 | 422)) => {}
                    Err(e) => panic!("cannot patch pod {}: {e}", name(&p)),
                }
            }
        }
        let ic = c.ic("web");
        if condition(&ic, "Ready").is_some_and(|r| r["reason"] == "PodRestartBackOff") {
            break ic;
        }
        thread::sleep(Duration::from_millis(50));
    };
    // "ended 1 s after it started", or, when the reconcile did not see the ending itself,
    // "ended".
    let msg = reason_message(&backing_off);
    assert!(
        msg.contains("ended") && msg.contains("pods in a row ended within"),
        "{msg}"
    );
    assert!(msg.contains("the next one is created at"), "{msg}");
    // Left alone, a pod comes and stays; every start counted once.
    let pod = wait_until(
        c.timeout(Duration::from_secs(60)),
        "a pod nobody fails",
        || match c
            .get_pod(&common::pod_name("web"))
            .map_err(|e| e.to_string())?
        {
            Some(p) if !failed.contains(uid(&p)) => Ok(p),
            _ => Err("none yet".into()),
        },
    );
    let starts = 1 + failed.len() as i64;
    c.wait_converged("web", starts, |p| {
        if uid(p) == uid(&pod) {
            Ok(())
        } else {
            Err("another pod".into())
        }
    });
}

#[test]
fn a_create_refused_by_pod_security_is_retried_and_made_soon_after_the_refusal_is_lifted() {
    let c = Cluster::new("refused-403");
    let _op = Operator::start(&c);
    c.create_ic("web", &image());
    let first = c.wait_converged("web", 1, |_| Ok(()));
    c.label_namespace("pod-security.kubernetes.io/enforce", Some("restricted"));
    assert!(c.delete_pod_with_grace(name(&first), uid(&first), Some(0)));
    let ic = c.wait_ready("web", "False", "PodCreateFailed");
    assert!(
        reason_message(&ic).contains("PodSecurity"),
        "{}",
        reason_message(&ic)
    );
    assert!(ic["status"]["currentPod"].is_null(), "{}", ic["status"]);
    // Refused for a few seconds: the tries back off 1, 2, 4 s...
    thread::sleep(Duration::from_secs(3));
    c.label_namespace("pod-security.kubernetes.io/enforce", None);
    let lifted = Instant::now();
    replaced(&c, "web", &first, 2);
    // ...so the pod comes within the back-off reached, not at the queue's pace (which grows
    // to 1000 s) or never (a 422, before).
    let took = lifted.elapsed();
    assert!(took < c.timeout(Duration::from_secs(10)), "{took:?}");
}

/// A ValidatingAdmissionPolicy and its binding, bound to the test's namespace only (through a
/// label it gives the namespace), in force from when [`Policy::deny`] returns until dropped.
/// Works wherever the cluster serves `admissionregistration.k8s.io` policies (v1 from 1.30;
/// v1beta1 on 1.28 with the beta enabled; the test server serves both).
struct Policy<'c> {
    c: &'c Cluster,
    path: String,
}

impl<'c> Policy<'c> {
    /// The served version of the policy API, if any.
    fn version(c: &Cluster) -> Option<&'static str> {
        ["v1", "v1beta1"].into_iter().find(|v| {
            c.api
                .get(&format!("/apis/admissionregistration.k8s.io/{v}"))
                .is_ok_and(|doc| {
                    doc["resources"].as_array().is_some_and(|r| {
                        r.iter().any(|x| x["name"] == "validatingadmissionpolicies")
                    })
                })
        })
    }

    /// Denies what `rule` matches in the test's namespace when `expression` is false, with
    /// `message` (and `reason`: none is 422 Invalid, "Forbidden" 403). `probe` tries a request
    /// the policy must refuse, answering whether it was refused: the policy is in force once it
    /// is (a real API server takes a moment to load a new policy). `None`, after SKIPPED, when
    /// the cluster serves no policies.
    fn deny(
        c: &'c Cluster,
        what: &str,
        rule: Value,
        expression: &str,
        message: &str,
        reason: Option<&str>,
        probe: impl Fn() -> bool,
    ) -> Option<Policy<'c>> {
        let Some(v) = Policy::version(c) else {
            common::skipped(&format!(
                "the cluster serves no ValidatingAdmissionPolicy ({what})"
            ));
            return None;
        };
        let name = format!("{}-{what}", c.ns);
        let group = format!("/apis/admissionregistration.k8s.io/{v}");
        let mut validation = json!({"expression": expression, "message": message});
        if let Some(r) = reason {
            validation["reason"] = json!(r);
        }
        c.label_namespace("immortal-e2e/policy", Some(&c.ns));
        c.api
            .post(
                &format!("{group}/validatingadmissionpolicies"),
                &json!({"apiVersion": format!("admissionregistration.k8s.io/{v}"),
                    "kind": "ValidatingAdmissionPolicy", "metadata": {"name": name},
                    "spec": {"failurePolicy": "Fail",
                        "matchConstraints": {"resourceRules": [rule]},
                        "validations": [validation]}}),
            )
            .unwrap_or_else(|e| panic!("cannot create policy {name}: {e}"));
        let policy = Policy {
            c,
            path: format!("{group}/validatingadmissionpolicies/{name}"),
        };
        c.api
            .post(
                &format!("{group}/validatingadmissionpolicybindings"),
                &json!({"apiVersion": format!("admissionregistration.k8s.io/{v}"),
                    "kind": "ValidatingAdmissionPolicyBinding", "metadata": {"name": name},
                    "spec": {"policyName": name, "validationActions": ["Deny"],
                        "matchResources": {"namespaceSelector":
                            {"matchLabels": {"immortal-e2e/policy": c.ns}}}}}),
            )
            .unwrap_or_else(|e| panic!("cannot create binding {name}: {e}"));
        wait_until(
            c.timeout(Duration::from_secs(30)),
            &format!("policy {name} in force"),
            || match probe() {
                true => Ok(()),
                false => Err("not refused yet".into()),
            },
        );
        Some(policy)
    }
}

impl Drop for Policy<'_> {
    fn drop(&mut self) {
        let binding = self.path.replace(
            "validatingadmissionpolicies",
            "validatingadmissionpolicybindings",
        );
        for path in [binding, self.path.clone()] {
            if let Err(e) = self.c.api.try_request("DELETE", &path, "", None) {
                if !e.is_not_found() {
                    eprintln!("e2e: cannot delete {path}: {e}");
                }
            }
        }
    }
}

/// While the returned guard lives, every write of an ImmortalContainer's status in the test's
/// namespace is refused with 403, as when the operator's ClusterRole has been edited: on the
/// test server by injected failures, elsewhere by an admission policy (SKIPPED where none is
/// served). Call it before the operator starts: the policy is checked on a probe object first.
/// Something in force until dropped.
trait Guard {}
impl<T> Guard for T {}

fn refuse_status_writes<'c>(c: &'c Cluster) -> Option<Box<dyn Guard + 'c>> {
    if let Some(server) = c.test_server() {
        server.fail_for(
            FailRule {
                status: 403,
                verb: Some("patch".into()),
                path_contains: Some("/status".into()),
                ..FailRule::default()
            },
            Duration::from_secs(3600),
        );
        struct Lifted<'a>(&'a kube_testserver::TestServer);
        impl Drop for Lifted<'_> {
            fn drop(&mut self) {
                self.0.clear_failures();
            }
        }
        return Some(Box::new(Lifted(server)));
    }
    c.create_ic("probe", &image());
    let probe = || {
        c.try_patch_ic_status("probe", &json!({"status": {"startTimes": 7}}))
            .is_err_and(|e| e.code() == Some(403))
    };
    // Named apart from every other policy a test makes in its namespace (a cluster-scoped
    // name made twice is 409 AlreadyExists).
    let policy = Policy::deny(
        c,
        "status-refused",
        json!({"apiGroups": ["immortalcontainer.flugel.it"], "apiVersions": ["*"],
            "operations": ["UPDATE"], "resources": ["immortalcontainers/status"]}),
        "false",
        "status writes are refused by the e2e suite",
        Some("Forbidden"),
        probe,
    );
    c.delete_ic("probe");
    Some(Box::new(policy?))
}

/// Whether the pod (by name, whatever its labels) exists and is held by our finalizer.
fn held_by_our_finalizer(c: &Cluster, pod: &str) -> bool {
    c.get_pod(pod).expect("get pod").is_some_and(|p| {
        p["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|f| f.iter().any(|f| f == COUNT_FINALIZER))
    })
}

/// Creates `ic` while status writes are refused: its pod is made and holds our finalizer,
/// uncounted.
fn held_pod(c: &Cluster, ic: &str) -> Value {
    c.create_ic(ic, &image());
    let pod = common::pod_name(ic);
    wait_until(
        c.timeout(Duration::from_secs(30)),
        "a pod holding our finalizer",
        || match held_by_our_finalizer(c, &pod) {
            true => Ok(()),
            false => Err("not yet".into()),
        },
    );
    c.get_pod(&pod).unwrap().unwrap()
}

fn wait_gone(c: &Cluster, pod: &str) {
    wait_until(
        c.timeout(Duration::from_secs(30)),
        &format!("pod {pod} to go"),
        || match c.get_pod(pod).map_err(|e| e.to_string())? {
            None => Ok(()),
            Some(p) => Err(format!(
                "still there: finalizers {}",
                p["metadata"]["finalizers"]
            )),
        },
    );
}

#[test]
fn the_object_deleted_while_its_pod_waits_to_be_counted_lets_the_pod_go() {
    let c = Cluster::new("deleted-mid-count");
    let Some(refused) = refuse_status_writes(&c) else {
        return;
    };
    let _op = Operator::start(&c);
    let pod = held_pod(&c, "web");
    c.delete_ic("web");
    drop(refused);
    wait_gone(&c, name(&pod));
}

#[test]
fn an_orphaning_delete_of_the_object_lets_its_held_pod_go_and_keeps_it() {
    let c = Cluster::new("orphaned");
    let Some(refused) = refuse_status_writes(&c) else {
        return;
    };
    let _op = Operator::start(&c);
    let pod = held_pod(&c, "web");
    // kubectl delete ic web --cascade=orphan
    c.api
        .delete(
            &format!(
                "/apis/{}/namespaces/{}/immortalcontainers/web",
                common::GROUP_VERSION,
                c.ns
            ),
            Some(&json!({"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Orphan"})),
        )
        .expect("delete with orphan");
    wait_until(
        c.timeout(Duration::from_secs(30)),
        "the orphan to be let go",
        || match c.get_pod(name(&pod)).map_err(|e| e.to_string())? {
            Some(p) if !held_by_our_finalizer(&c, name(&p)) => Ok(p),
            Some(p) => Err(format!("{}", p["metadata"])),
            None => Err("the orphan is gone; it should have been kept".into()),
        },
    );
    drop(refused);
    // Orphaned on purpose: the pod lives on, none of ours any more.
    let kept = c.get_pod(name(&pod)).unwrap().expect("kept");
    assert_eq!(uid(&kept), uid(&pod));
}

#[test]
fn a_held_pod_that_lost_our_label_while_the_operator_was_down_is_found_and_released() {
    let c = Cluster::new("label-lost-down");
    let Some(refused) = refuse_status_writes(&c) else {
        return;
    };
    let mut op = Operator::start(&c);
    let pod = held_pod(&c, "web");
    op.sigkill();
    drop(refused);
    // While the operator is down: our label goes (our watch will never see the pod again),
    // then the object (the garbage collector deletes the pod, which our finalizer holds).
    c.patch_pod(
        name(&pod),
        &json!({"metadata": {"labels": {common::MANAGED_BY: null}}}),
    );
    c.delete_ic("web");
    thread::sleep(Duration::from_millis(500));
    assert!(
        held_by_our_finalizer(&c, name(&pod)),
        "held while we are down"
    );
    op.restart();
    wait_gone(&c, name(&pod));
    assert!(op.log_says("swept every pod's metadata for our finalizer"));
}

#[test]
fn a_pod_deleted_while_status_writes_are_refused_goes_within_a_minute_uncounted_and_said() {
    let c = Cluster::new("status-refused-long");
    let Some(refused) = refuse_status_writes(&c) else {
        return;
    };
    let _op = Operator::start(&c);
    let pod = held_pod(&c, "web");
    // A person (or a drain) deletes it; the count cannot be written: held a minute at most.
    let deleted = Instant::now();
    assert!(c.delete_pod_with_grace(name(&pod), uid(&pod), None));
    wait_until(
        c.timeout(Duration::from_secs(90)),
        "the deleted pod to be let go",
        || match c.get_pod(name(&pod)).map_err(|e| e.to_string())? {
            Some(p) if uid(&p) == uid(&pod) => Err("still held".into()),
            _ => Ok(()),
        },
    );
    eprintln!("let go {:?} after its deletion", deleted.elapsed());
    // The Event is recorded on a thread of its own, once the pod has been released.
    wait_until(
        c.timeout(Duration::from_secs(10)),
        "a StartsNotCounted Event naming the pod",
        || {
            let events = c
                .api
                .get(&format!("/api/v1/namespaces/{}/events", c.ns))
                .map_err(|e| e.to_string())?;
            let said = events["items"].as_array().into_iter().flatten().any(|e| {
                e["reason"] == "StartsNotCounted"
                    && e["message"].as_str().is_some_and(|m| m.contains(uid(&pod)))
            });
            if said {
                Ok(())
            } else {
                Err("not yet".into())
            }
        },
    );
    drop(refused);
    // Status can be written again: the replacement, made meanwhile and held, is counted (the
    // lost start is not) within half a minute, whatever its retries' back-off grew to.
    let counted = wait_until(
        c.timeout(Duration::from_secs(45)),
        "the replacement to be counted",
        || c.converged("web", 1),
    );
    assert_ne!(uid(&counted), uid(&pod));
}

/// While the returned policy lives, putting our label back on a pod that lost it is refused
/// (422), as a policy that guards labels would: every UPDATE of a pod in the test's namespace
/// that adds it. Other pod writes (our finalizer's release) pass.
fn refuse_relabels(c: &Cluster) -> Option<Policy<'_>> {
    let probe_pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "relabel-probe", "labels": {"probe": "yes"}},
        "spec": {"containers": [{"name": "c", "image": image()}]}});
    let probe_uid = uid(&c.create_pod(&probe_pod)).to_string();
    let path = format!("/api/v1/namespaces/{}/pods/relabel-probe", c.ns);
    let label = |value: Value| json!({"metadata": {"labels": {common::MANAGED_BY: value}}});
    let probe = || match c.api.try_request(
        "PATCH",
        &path,
        "application/merge-patch+json",
        Some(&label(json!("someone"))),
    ) {
        Err(e) => e.code() == Some(422),
        Ok(_) => {
            // Not in force yet: take it off again, or the next try would not add it.
            let _ = c.api.merge_patch(&path, &label(Value::Null));
            false
        }
    };
    let added = format!(
        "!('{0}' in object.metadata.labels) || '{0}' in oldObject.metadata.labels",
        common::MANAGED_BY
    );
    let policy = Policy::deny(
        c,
        "relabel-refused",
        json!({"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"],
            "resources": ["pods"]}),
        &added,
        "the e2e suite refuses relabels",
        None,
        probe,
    );
    c.delete_pod_with_grace("relabel-probe", &probe_uid, Some(0));
    policy
}

#[test]
fn a_held_pod_whose_relabel_is_refused_is_still_counted_and_released_when_deleted() {
    let c = Cluster::new("relabel-refused");
    let Some(refused) = refuse_status_writes(&c) else {
        return;
    };
    let Some(relabels) = refuse_relabels(&c) else {
        return;
    };
    let _op = Operator::start(&c);
    let pod = held_pod(&c, "web");
    // Our label goes (our watch loses the pod, and the operator cannot put it back), then a
    // person deletes the pod, which waits on our finalizer; status can be written again.
    c.patch_pod(
        name(&pod),
        &json!({"metadata": {"labels": {common::MANAGED_BY: null}}}),
    );
    assert!(c.delete_pod_with_grace(name(&pod), uid(&pod), None));
    drop(refused);
    // Counted and released within the half minute a held pod is retried in, the relabel
    // refused or not; then replaced.
    wait_until(
        c.timeout(Duration::from_secs(45)),
        "the deleted pod to be let go",
        || match c.get_pod(name(&pod)).map_err(|e| e.to_string())? {
            Some(p) if uid(&p) == uid(&pod) => {
                Err(format!("still held: {}", p["metadata"]["finalizers"]))
            }
            _ => Ok(()),
        },
    );
    let replacement = wait_until(
        c.timeout(Duration::from_secs(30)),
        "the replacement, both starts counted",
        || c.converged("web", 2),
    );
    assert_ne!(uid(&replacement), uid(&pod));
    drop(relabels);
}

#[test]
fn a_status_write_for_an_object_deleted_and_recreated_meanwhile_does_not_land_on_the_new_one() {
    let c = Cluster::new("recreated-mid-write");
    let Some(server) = c.test_server_or_skip("recreated-mid-write") else {
        return;
    };
    let _op = Operator::start(&c);
    c.create_ic("web", &image());
    c.wait_converged("web", 1, |_| Ok(()));
    // The image changes: the operator deletes the pod gracefully and says so in a status write
    // with no count in it, held on its way. A real `/status` applies a write whatever uid it
    // names (fixture kube-1.28-kubelet/21); the write's resourceVersion is what stops it.
    server.record_requests();
    let stall = server.stall(StallRule {
        verb: Some("patch".into()),
        path_contains: Some("/status".into()),
        ..StallRule::default()
    });
    c.set_image("web", &other_image());
    wait_until(
        c.timeout(Duration::from_secs(10)),
        "a status write to be held",
        || match server.stalled() {
            0 => Err("none yet".into()),
            _ => Ok(()),
        },
    );
    // Meanwhile the object is deleted and made again under the name.
    c.delete_ic("web");
    let recreated = Instant::now();
    let new = c.create_ic("web", &image());
    server.lift_stall(stall);
    let held = wait_until(
        c.timeout(Duration::from_secs(10)),
        "the held status write to be answered",
        || {
            server
                .request_log()
                .into_iter()
                .find(|l| {
                    l.resource.ends_with("/status")
                        && l.received < recreated
                        && l.answered > recreated
                })
                .ok_or_else(|| "not yet".to_string())
        },
    );
    assert_eq!(held.code, 409, "refused: its version is the old object's");
    let status = &c.ic("web")["status"];
    assert!(
        status["observedGeneration"].as_i64() <= new["metadata"]["generation"].as_i64(),
        "the old object's status landed: {status}"
    );
    c.wait_converged("web", 1, |p| {
        match p["metadata"]["ownerReferences"][0]["uid"] == new["metadata"]["uid"] {
            true => Ok(()),
            false => Err("the old object's pod".into()),
        }
    });
}

#[test]
fn counting_resumes_without_a_restart_once_the_crd_is_upgraded() {
    let c = Cluster::new("crd-upgraded");
    let Some(_server) = c.test_server_or_skip("crd-upgraded replaces the cluster-wide CRD") else {
        return;
    };
    // A CRD older than the operator: its status schema knows neither lastCountedPodUID nor
    // observedGeneration nor podPhase.
    let mut old = c.crd();
    let status = &mut old["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
        ["status"]["properties"];
    for f in ["lastCountedPodUID", "observedGeneration", "podPhase"] {
        status.as_object_mut().unwrap().remove(f);
    }
    c.apply_crd(&old);
    let op = Operator::start(&c);
    c.create_ic("web", &image());
    let first = wait_until(c.timeout(Duration::from_secs(30)), "a running pod", || {
        let ic = c.ic("web");
        match condition(&ic, "Ready") {
            Some(r) if r["reason"] == "PodRunning" => Ok(ic),
            other => Err(format!("{other:?}")),
        }
    });
    assert!(first["status"]["lastCountedPodUID"].is_null());
    // `make install`: the current CRD. Counting resumes by itself: the pod running now is
    // adopted, not counted (it may have been counted before the field was lost).
    c.apply_crd(&c.crd());
    let before = first["status"]["startTimes"].as_i64().unwrap_or(0);
    let pod = wait_until(
        c.timeout(Duration::from_secs(40)),
        "counting to resume",
        || {
            let ic = c.ic("web");
            match ic["status"]["lastCountedPodUID"].as_str() {
                Some(_) => Ok(ic),
                None => Err("not yet".into()),
            }
        },
    );
    assert_eq!(pod["status"]["startTimes"].as_i64().unwrap_or(0), before);
    assert!(op.log_says("counted again"), "{}", op.log_tail(20));
    // From now on every start counts.
    let running = c.wait_converged("web", before, |_| Ok(()));
    assert!(c.delete_pod_with_grace(name(&running), uid(&running), Some(0)));
    replaced(&c, "web", &running, before + 1);
}

#[test]
fn a_create_an_admission_policy_refuses_with_422_is_retried_and_made_once_the_policy_goes() {
    let c = Cluster::new("refused-422");
    let _op = Operator::start(&c);
    c.create_ic("web", &image());
    let first = c.wait_converged("web", 1, |_| Ok(()));
    // The policy recorded in fixture 17: every container must set resource limits (ours do
    // not). A probe pod shows when it is in force.
    let probe_pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "policy-probe"},
        "spec": {"containers": [{"name": "c", "image": image()}]}});
    let pods = format!("/api/v1/namespaces/{}/pods", c.ns);
    let probe = || match c
        .api
        .try_request("POST", &pods, "application/json", Some(&probe_pod))
    {
        Err(e) => e.code() == Some(422),
        Ok(_) => {
            let _ = c.api.delete(&format!("{pods}/policy-probe"), None);
            false
        }
    };
    let Some(policy) = Policy::deny(
        &c,
        "require-limits",
        json!({"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
            "resources": ["pods"]}),
        "object.spec.containers.all(c, has(c.resources) && has(c.resources.limits))",
        "every container must set resource limits",
        None,
        probe,
    ) else {
        return;
    };
    assert!(c.delete_pod_with_grace(name(&first), uid(&first), Some(0)));
    let ic = c.wait_ready("web", "False", "PodCreateFailed");
    let msg = reason_message(&ic);
    assert!(
        msg.contains("ValidatingAdmissionPolicy") && msg.contains("resource limits"),
        "{msg}"
    );
    assert!(ic["status"]["currentPod"].is_null(), "{}", ic["status"]);
    // A 422 was never tried again before. Now it is, with the object's back-off: lifted, the
    // pod comes within the back-off reached.
    thread::sleep(Duration::from_secs(3));
    drop(policy);
    let lifted = Instant::now();
    replaced(&c, "web", &first, 2);
    let took = lifted.elapsed();
    assert!(took < c.timeout(Duration::from_secs(10)), "{took:?}");
}

#[test]
fn with_every_connection_black_holed_a_deleted_pod_is_back_within_90_seconds() {
    let c = Cluster::new("black-holed");
    let Some(server) = c.test_server_or_skip("black-holed silences the operator's connections")
    else {
        return;
    };
    // Its own user, so that only its connections go silent; default settings otherwise.
    let config = c.user_kubeconfig(server, "operator");
    let op = Operator::start_as(&c, &config, &[], "operator.log");
    c.create_ic("web", &image());
    let first = c.wait_converged("web", 1, |_| Ok(()));
    // Every connection the operator has open (its two watches, the pooled ones its reconciles
    // and Events used) goes silent without closing, as behind a proxy that stopped forwarding;
    // new connections work.
    let silenced = server.blackhole(Some("operator"));
    assert!(silenced >= 3, "{silenced} connections silenced");
    let cut = Instant::now();
    assert!(c.delete_pod_with_grace(name(&first), uid(&first), Some(0)));
    // The pod watch gives up after its idle limit (75 s), and drops the pool with it, so the
    // reconcile its resumed stream queues does not wait 30 s on a dead pooled connection (it
    // took 135 s before).
    replaced_within(&c, "web", &first, 2, Duration::from_secs(90));
    eprintln!(
        "replaced {:?} after the connections went silent",
        cut.elapsed()
    );
    assert!(op.log_says("given up as dead"), "{}", op.log_tail(20));
}

/// [`replaced`], within `bound` (not scaled: the bound is the point).
fn replaced_within(c: &Cluster, ic: &str, old: &Value, starts: i64, bound: Duration) -> Value {
    let old = uid(old).to_string();
    wait_until(bound, &format!("{ic} replaced"), || {
        let pod = c.converged(ic, starts)?;
        if uid(&pod) == old {
            return Err("still the old pod".into());
        }
        Ok(pod)
    })
}

#[test]
fn a_node_lost_but_not_deleted_holds_the_pod_until_it_is_tainted_out_of_service() {
    let c = Cluster::new("node-partitioned");
    let Some(server) = c.test_server_or_skip("node-partitioned cuts a node's kubelet off") else {
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
    // Its kubelet stops reporting: the node goes Unknown, the taint manager evicts our pod
    // once its toleration of unreachable nodes is over (300 s, a hundredth of it here), and
    // with no kubelet to finish the deletion the pod stays Terminating, its name held.
    assert!(server.partition_node(&node));
    let ic = c.wait_ready("web", "False", "PodTerminating");
    assert!(
        reason_message(&ic).contains("DeletionByTaintManager"),
        "{}",
        reason_message(&ic)
    );
    thread::sleep(Duration::from_secs(2));
    let pods = c.list_managed_pods().expect("pods");
    assert_eq!(
        pods.len(),
        1,
        "no replacement while the name is held: {pods:?}"
    );
    assert_eq!(uid(&pods[0]), uid(&first));
    // What docs/operating.md (Known limits) says to do: taint the node out-of-service
    // (kubectl taint nodes NODE node.kubernetes.io/out-of-service=nodeshutdown:NoExecute).
    // PodGC force-deletes the pod, and its replacement goes to the other node.
    let path = format!("/api/v1/nodes/{node}");
    let mut taints = c.api.get(&path).expect("node")["spec"]["taints"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    taints.push(
        json!({"key": "node.kubernetes.io/out-of-service", "value": "nodeshutdown",
        "effect": "NoExecute"}),
    );
    c.api
        .request(
            "PATCH",
            &path,
            "application/strategic-merge-patch+json",
            Some(&json!({"spec": {"taints": taints}})),
        )
        .expect("taint the node");
    let second = replaced(&c, "web", &first, 2);
    assert_ne!(second["spec"]["nodeName"], node.as_str());
}

/// Runs `make ARGS` in the repository with `kubectl` pointed at the cluster; answers whether
/// it succeeded and what it printed. Killed, and failed, after `bound`.
fn make(c: &Cluster, args: &[&str], bound: Duration) -> (bool, String) {
    let kubectl = std::env::var("KUBECTL").unwrap_or_else(|_| "kubectl".into());
    let log = c.dir().join(format!("make-{}.log", args[0]));
    let out = std::fs::File::create(&log).expect("make log");
    let mut child = std::process::Command::new("make")
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(args)
        .arg(format!(
            "KUBECTL={kubectl} --kubeconfig {}",
            c.kubeconfig().display()
        ))
        .stdout(out.try_clone().expect("make log"))
        .stderr(out)
        .spawn()
        .expect("make runs");
    let end = Instant::now() + bound;
    let status = loop {
        if let Some(s) = child.try_wait().expect("make status") {
            break Some(s);
        }
        if Instant::now() >= end {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        thread::sleep(Duration::from_millis(50));
    };
    let printed = std::fs::read_to_string(&log).unwrap_or_default();
    match status {
        Some(s) => (s.success(), printed),
        None => panic!("make {args:?} still running after {bound:?}:\n{printed}"),
    }
}

#[test]
fn make_undeploy_with_objects_present_leaves_no_pod_or_namespace_terminating() {
    let c = Cluster::new("undeploy");
    let Some(server) =
        c.test_server_or_skip("undeploy removes the cluster-wide CRD and the operator's namespace")
    else {
        return;
    };
    // What `make deploy` applies (nothing runs its Deployment here: the operator under test is
    // a process of this test, stopped the moment its Deployment is deleted, as the kubelet
    // would stop its pod).
    let (ok, out) = make(
        &c,
        &["deploy", "IMG=immortal-operator:e2e"],
        Duration::from_secs(60),
    );
    assert!(ok, "make deploy:\n{out}");
    let Some(refused) = refuse_status_writes(&c) else {
        return;
    };
    let op = Operator::start(&c);
    // Two objects, their pods held by our finalizer (status writes are refused), as pods are
    // in the moment after their create: the worst moment to uninstall.
    let pods = [held_pod(&c, "web"), held_pod(&c, "api")];
    let deployment =
        "/apis/apps/v1/namespaces/immortalcontainers-operator/deployments/immortal-operator";
    let stop = Arc::new(AtomicBool::new(false));
    let (api, pid, stopped) = (c.api.clone(), op.pid(), stop.clone());
    let reaper = thread::spawn(move || {
        while !stopped.load(Ordering::Relaxed) {
            if matches!(api.get(deployment), Err(e) if e.is_not_found()) {
                let _ = std::process::Command::new("kill")
                    .args(["-KILL", &pid.to_string()])
                    .status();
                return true;
            }
            thread::sleep(Duration::from_millis(10));
        }
        false
    });
    let (ok, out) = make(&c, &["undeploy", "YES=1"], Duration::from_secs(180));
    stop.store(true, Ordering::Relaxed);
    assert!(
        reaper.join().unwrap(),
        "the Deployment was never deleted:\n{out}"
    );
    assert!(ok, "make undeploy:\n{out}");
    drop(refused);
    // The objects went first, while the operator ran: it let their pods go, the garbage
    // collector removed them, and only then did the operator, its RBAC and the CRD go.
    for p in &pods {
        assert!(
            c.get_pod(name(p)).unwrap().is_none(),
            "{} left behind:\n{out}",
            name(p)
        );
    }
    assert!(
        server
            .get_json("/api/v1/namespaces/immortalcontainers-operator")
            .is_none(),
        "the operator's namespace is still there"
    );
    assert!(
        server
            .get_json("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/immortalcontainers.immortalcontainer.flugel.it")
            .is_none(),
        "the CRD is still there"
    );
}

/// An object deleted and made again under its name while the operator's watches were cut (a
/// partition, an API server restart), which the operator learns only from the relist after its
/// resourceVersion expired (410): the new object gets one pod of its own, counted once, and no
/// pod made for the deleted object's uid keeps coming back. Before, the relist kept the deleted
/// object's copy: every pod was made for the old uid (and removed by the garbage collector)
/// and every count was refused. The test server cuts the watches (holds them) and expires
/// every version (a compaction); on a real cluster the same needs the API server restarted
/// with the operator paused: SKIPPED there.
#[test]
fn an_object_made_again_while_the_watches_were_cut_gets_one_pod_of_its_own_after_the_relist() {
    let c = Cluster::new("recreated-behind-relist");
    let Some(server) = c.test_server_or_skip("an object made again behind a relist") else {
        return;
    };
    let _op = Operator::start(&c);
    c.create_ic("web", &image());
    let old_pod = c.wait_converged("web", 1, |_| Ok(()));
    let old_uid = uid(&c.ic("web")).to_string();

    // The operator's streams end and its new watches are held: it hears nothing more.
    let cut = server.stall(StallRule {
        verb: Some("watch".into()),
        ..StallRule::default()
    });
    server.drop_watches();
    wait_until(
        c.timeout(Duration::from_secs(20)),
        "both of the operator's watches held",
        || match server.stalled() {
            n if n >= 2 => Ok(()),
            n => Err(format!("{n} held")),
        },
    );
    c.delete_ic("web");
    wait_gone(&c, name(&old_pod));
    c.create_ic("web", &image());
    let new_uid = uid(&c.ic("web")).to_string();
    assert_ne!(new_uid, old_uid);
    // What happened meanwhile is compacted away: the watches resume from a version too old,
    // are answered 410, and list again.
    server.expire_all();
    server.lift_stall(cut);

    let pod = c.wait_converged("web", 1, |_| Ok(()));
    assert_eq!(
        pod["metadata"]["ownerReferences"][0]["uid"], new_uid,
        "the pod is the new object's"
    );
    let want = [("web".to_string(), 1)].into_iter().collect();
    c.assert_stays_converged(&want, Duration::from_secs(3));
}
