//! End-to-end scenarios: the operator binary against a fresh in-memory API server per test, or
//! against a real cluster when `IMMORTAL_E2E_KUBECONFIG` names one (see `common`).

mod common;

use common::{
    condition, image, name, other_image, pod_name, uid, wait_until, wait_until_every, Cluster,
    Operator,
};
use kube_testserver::FailRule;
use serde_json::json;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

fn one(name: &str, start_times: i64) -> BTreeMap<String, i64> {
    BTreeMap::from([(name.to_string(), start_times)])
}

/// A valid DNS-1123 subdomain of exactly `len` characters: lowercase letters in dot-separated
/// segments of 49, so no segment comes near the 63-character DNS label limit.
fn dotted_name(len: usize) -> String {
    let s: String = (0..len)
        .map(|i| {
            if i % 50 == 49 {
                '.'
            } else {
                (b'a' + (i / 50) as u8 % 26) as char
            }
        })
        .collect();
    assert!(!s.ends_with('.') && s.len() == len, "bad test name {s}");
    s
}

#[test]
fn create_makes_one_owned_pod_with_the_image_and_reports_ready() {
    let c = Cluster::new("create");
    let _op = Operator::start(&c);
    let ic = c.create_ic("web", &image());

    let pod = c.wait_converged("web", 1, |_| Ok(()));
    // check_converged already holds all of this; spelled out as the scenario's record.
    assert_eq!(name(&pod), "web-immortalpod");
    assert_eq!(pod["spec"]["containers"][0]["name"], "acontainer");
    assert_eq!(pod["spec"]["containers"][0]["image"], image().as_str());
    assert_eq!(
        pod["metadata"]["labels"]["app.kubernetes.io/managed-by"],
        "immortal-operator"
    );
    assert_eq!(
        pod["metadata"]["labels"]["immortalcontainer.flugel.it/owner-uid"],
        uid(&ic)
    );
    let owner = &pod["metadata"]["ownerReferences"][0];
    assert_eq!(
        (owner["uid"].as_str(), owner["controller"].as_bool()),
        (Some(uid(&ic)), Some(true))
    );
    let ic = c.ic("web");
    assert_eq!(ic["status"]["currentPod"], "web-immortalpod");
    assert_eq!(ic["status"]["startTimes"], 1);
    assert_eq!(
        condition(&ic, "Ready").map(|r| r["status"].clone()),
        Some(json!("True"))
    );
    c.assert_converged("web", 1);
    c.assert_stays_converged(&one("web", 1), Duration::from_secs(1));
}

#[test]
fn deleted_pod_is_replaced_by_a_new_one_and_counted() {
    let c = Cluster::new("delete-pod");
    let _op = Operator::start(&c);
    c.create_ic("web", &image());
    let first = c.wait_converged("web", 1, |_| Ok(()));

    assert!(
        c.delete_pod(name(&first), uid(&first)),
        "the pod was already gone"
    );
    let old = uid(&first).to_string();
    let second = c.wait_converged("web", 2, |p| {
        if uid(p) != old {
            Ok(())
        } else {
            Err("still the old pod".into())
        }
    });
    assert_ne!(uid(&second), old);
    c.assert_stays_converged(&one("web", 2), Duration::from_secs(1));
}

#[test]
fn failed_pod_is_replaced_and_every_start_counted() {
    let c = Cluster::new("failed-pod");
    let _op = Operator::start(&c);
    c.create_ic("web", &image());
    let mut pod = c.wait_converged("web", 1, |_| Ok(()));

    for starts in [2, 3] {
        // What the kubelet reports when the container exits and restartPolicy does not apply.
        c.patch_pod_status(name(&pod), &json!({"status": {"phase": "Failed"}}));
        let old = uid(&pod).to_string();
        pod = c.wait_converged("web", starts, |p| {
            if uid(p) != old {
                Ok(())
            } else {
                Err("still the failed pod".into())
            }
        });
    }
    c.assert_stays_converged(&one("web", 3), Duration::from_secs(1));
}

#[test]
fn image_change_replaces_the_pod_with_one_running_the_new_image() {
    let c = Cluster::new("image-change");
    let _op = Operator::start(&c);
    c.create_ic("web", &image());
    let first = c.wait_converged("web", 1, |_| Ok(()));

    c.set_image("web", &other_image());
    let old = uid(&first).to_string();
    let second = c.wait_converged("web", 2, |p| {
        if uid(p) != old {
            Ok(())
        } else {
            Err("still the old pod".into())
        }
    });
    assert_eq!(
        second["spec"]["containers"][0]["image"],
        other_image().as_str()
    );
    c.assert_stays_converged(&one("web", 2), Duration::from_secs(1));
}

#[test]
fn deleting_the_object_garbage_collects_its_pod() {
    let c = Cluster::new("delete-ic");
    let _op = Operator::start(&c);
    c.create_ic("web", &image());
    let pod = c.wait_converged("web", 1, |_| Ok(()));

    c.delete_ic("web");
    wait_until(
        c.timeout(Duration::from_secs(30)),
        "the pod to be garbage-collected",
        || match c.get_pod(name(&pod)).map_err(|e| e.to_string())? {
            None => Ok(()),
            Some(p) => Err(format!("pod {} (uid {}) still exists", name(&p), uid(&p))),
        },
    );
    // Nor was a replacement made for the vanished object.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(c.list_managed_pods().expect("list pods").len(), 0);
}

#[test]
fn name_of_64_gets_a_pod_and_names_over_241_or_images_with_spaces_are_refused_at_admission() {
    let c = Cluster::new("long-names");
    let _op = Operator::start(&c);
    let short = "a".repeat(64);
    c.create_ic(&short, &image());
    let pod = c.wait_converged(&short, 1, |_| Ok(()));
    assert_eq!(name(&pod).len(), 64 + "-immortalpod".len());

    // The CRD's CEL rules answer at once, with why: no object is made whose pod cannot be.
    for (ic, img, why) in [
        // Each at the field it is about, as kubectl shows it (the rules' fieldPath).
        (
            dotted_name(253),
            image(),
            "metadata.name: Forbidden: must be at most 241 characters",
        ),
        (
            dotted_name(242),
            image(),
            "metadata.name: Forbidden: must be at most 241 characters",
        ),
        (
            "spaces".to_string(),
            "nginx latest".to_string(),
            "spec.image: Forbidden: must be an image reference, without spaces",
        ),
        (
            "blank".to_string(),
            " ".to_string(),
            "spec.image: Forbidden: must be an image reference, without spaces",
        ),
    ] {
        match c.try_create_ic(&ic, &img) {
            Err(e) if e.code() == Some(422) => {
                assert!(e.to_string().contains(why), "{ic:.20}…: {e}")
            }
            other => panic!("{ic:.20}… with image {img:?} was not refused: {other:?}"),
        }
    }
    // 241 characters is allowed: the pod's name is then 253.
    let longest = dotted_name(241);
    c.create_ic(&longest, &image());
    let pod = c.wait_converged(&longest, 1, |_| Ok(()));
    assert_eq!(name(&pod).len(), 253);
    let both = BTreeMap::from([(short, 1), (longest, 1)]);
    c.assert_stays_converged(&both, Duration::from_millis(300));
}

#[test]
fn an_object_made_before_the_name_rule_keeps_its_condition_without_hot_looping() {
    let c = Cluster::new("before-rule");
    let Some(server) = c.test_server_or_skip("before-rule replaces the CRD") else {
        return;
    };
    let _op = Operator::start(&c);
    // The CRD as it was before its CEL rules: a 253-character object could be created.
    let mut old = c.crd();
    let schema = &mut old["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
    schema
        .as_object_mut()
        .unwrap()
        .remove("x-kubernetes-validations");
    c.apply_crd(&old);
    let long = dotted_name(253);
    c.create_ic(&long, &image());
    let ic = c.wait_ready(&long, "False", "PodNameTooLong");
    assert!(common::reason_message(&ic).contains("253"));
    assert!(common::controlled_pods(&c.list_managed_pods().expect("pods"), uid(&ic)).is_empty());

    // The rule arrives; the object stays, with what it says.
    c.apply_crd(&c.crd());
    let before = server.request_counts();
    std::thread::sleep(Duration::from_secs(3));
    let diff = common::counts_diff(&before, &server.request_counts());
    let n = common::acting_requests(&diff);
    assert!(n <= 5, "{n} requests in 3 s while idle: {diff:?}");
    let again = c.ic(&long);
    assert_eq!(
        condition(&again, "Ready").map(|r| r["reason"].clone()),
        Some(json!("PodNameTooLong"))
    );
}

#[test]
fn foreign_pod_holding_the_name_is_left_untouched_and_reported() {
    let c = Cluster::new("foreign-pod");
    let foreign = c.create_pod(&json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": pod_name("web"), "labels": {"app": "someone-else"}},
        "spec": {"containers": [{"name": "main", "image": "busybox", "command": ["sleep", "3600"]}]},
    }));
    let _op = Operator::start(&c);
    c.create_ic("web", &image());

    wait_until(
        c.timeout(Duration::from_secs(30)),
        "Ready False with reason PodNameConflict",
        || {
            let ic = c
                .get_ic("web")
                .map_err(|e| e.to_string())?
                .ok_or("object gone")?;
            match condition(&ic, "Ready") {
                Some(r) if r["status"] == "False" && r["reason"] == "PodNameConflict" => Ok(()),
                other => Err(format!("Ready condition {other:?}")),
            }
        },
    );
    // The operator retries a conflict now and then; give it the time to misbehave.
    std::thread::sleep(Duration::from_secs(1));
    let now = c
        .get_pod(&pod_name("web"))
        .expect("get pod")
        .expect("the foreign pod is gone");
    assert_eq!(uid(&now), uid(&foreign), "the foreign pod was replaced");
    assert_eq!(now["spec"]["containers"][0]["image"], "busybox");
    assert!(
        now["metadata"]["ownerReferences"].is_null(),
        "owner added: {}",
        now["metadata"]["ownerReferences"]
    );
    assert_eq!(now["metadata"]["labels"], foreign["metadata"]["labels"]);
    // The kubelet runs it (its status moves on); nothing the operator could write changed.
    for field in ["annotations", "finalizers", "deletionTimestamp"] {
        assert_eq!(
            now["metadata"][field], foreign["metadata"][field],
            "metadata.{field} of the foreign pod changed"
        );
    }
    assert_eq!(now["spec"]["containers"], foreign["spec"]["containers"]);
    assert!(c.list_managed_pods().expect("list pods").is_empty());
    assert_eq!(
        c.list_pods().expect("list pods").len(),
        1,
        "a pod was added next to the foreign one"
    );
}

#[test]
fn sigkill_between_pod_create_and_status_write_counts_the_pod_once_after_restart() {
    let c = Cluster::new("sigkill");
    // Every status write fails, so the operator creates the pod but cannot record it.
    const STATUS_FAULTS: u32 = 400;
    if let Some(server) = c.test_server() {
        server.fail_next(FailRule {
            count: STATUS_FAULTS,
            status: 500,
            retry_after: None,
            verb: Some("patch".into()),
            path_contains: Some("/status".into()),
        });
    }
    let mut op = Operator::start(&c);
    c.create_ic("web", &image());
    let pod = wait_until(
        c.timeout(Duration::from_secs(30)),
        "the pod to be created",
        || {
            c.get_pod(&pod_name("web"))
                .map_err(|e| e.to_string())?
                .ok_or_else(|| "no pod yet".to_string())
        },
    );
    op.sigkill();

    if let Some(server) = c.test_server() {
        let ic = c.ic("web");
        assert!(
            ic["status"]["lastCountedPodUID"].is_null(),
            "the status write went through despite the faults (not a PATCH to /status?): {}",
            ic["status"]
        );
        // No way to clear a rule: use up what the operator left, with no-op status patches.
        let mut drained = false;
        for _ in 0..=STATUS_FAULTS {
            match c.try_patch_ic_status("web", &json!({})) {
                Ok(_) => {
                    drained = true;
                    break;
                }
                Err(e) if e.code() == Some(500) => {}
                Err(e) => panic!("unexpected error while draining faults: {e}"),
            }
        }
        assert!(
            drained,
            "status faults never ran out; counts {:?}",
            server.request_counts()
        );
    }

    op.restart();
    let after = c.wait_converged("web", 1, |_| Ok(()));
    assert_eq!(uid(&after), uid(&pod), "the healthy pod was replaced");
    c.assert_stays_converged(&one("web", 1), Duration::from_secs(1));
}

#[test]
fn chaos_of_watch_drops_expiry_errors_and_deletions_still_converges_exactly() {
    let c = Cluster::new("chaos");
    let Some(server) = c.test_server_or_skip("chaos") else {
        return;
    };
    let _op = Operator::start(&c);
    let names: Vec<String> = (0..20).map(|i| format!("chaos-{i:02}")).collect();
    let mut want: BTreeMap<String, i64> = BTreeMap::new();
    for n in &names {
        c.create_ic(n, &image());
        want.insert(n.clone(), 1);
    }

    // Eight rounds: each object's pod is deleted in two of them, between bursts of 500s and
    // 429s (Retry-After 1), watch drops and a compaction that makes every resourceVersion
    // too old. A pod is deleted only once the object converged on it, so each deletion
    // starts exactly one more pod.
    for round in 0..8 {
        server.fail_next(FailRule {
            count: 10,
            status: 500,
            ..FailRule::default()
        });
        server.fail_next(FailRule {
            count: 4,
            status: 429,
            retry_after: Some(1),
            ..FailRule::default()
        });
        server.drop_watches();
        for (k, n) in names.iter().skip(round % 4).step_by(4).enumerate() {
            let starts = want[n];
            let pod = c.wait_converged(n, starts, |_| Ok(()));
            if c.delete_pod(name(&pod), uid(&pod)) {
                *want.get_mut(n).expect("known name") += 1;
            }
            if k == 2 {
                server.expire_all();
            }
        }
        server.drop_watches();
    }
    assert_eq!(
        want.values().sum::<i64>(),
        20 + 40,
        "every planned deletion happened"
    );

    wait_until_every(
        c.timeout(Duration::from_secs(60)),
        Duration::from_millis(200),
        "all 20 objects to converge",
        || c.converged_all(&want),
    );
    c.assert_stays_converged(&want, Duration::from_secs(1));
}

#[test]
fn two_hundred_objects_created_at_once_all_converge() {
    let c = Cluster::new("bulk");
    let _op = Operator::start(&c);
    let names: Vec<String> = (0..200).map(|i| format!("bulk-{i:03}")).collect();
    let started = Instant::now();
    std::thread::scope(|s| {
        for chunk in names.chunks(50) {
            let c = &c;
            s.spawn(move || chunk.iter().for_each(|n| drop(c.create_ic(n, &image()))));
        }
    });
    let want: BTreeMap<String, i64> = names.iter().map(|n| (n.clone(), 1)).collect();
    wait_until_every(
        c.timeout(Duration::from_secs(60)),
        Duration::from_millis(250),
        "200 objects to converge",
        || c.converged_all(&want),
    );
    eprintln!("200 objects converged in {:?}", started.elapsed());
    c.assert_stays_converged(&want, Duration::from_millis(500));
}

#[test]
fn sigterm_is_logged_then_the_operator_drains_and_exits_zero_within_5_seconds() {
    let c = Cluster::new("sigterm");
    let mut op = Operator::start(&c);
    c.create_ic("web", &image());
    c.wait_converged("web", 1, |_| Ok(()));

    let sent = Instant::now();
    op.sigterm();
    let status = op.wait_exit(Duration::from_secs(5));
    let status = status.unwrap_or_else(|| {
        panic!(
            "still running 5 s after SIGTERM; log {}",
            op.log_path().display()
        )
    });
    assert!(
        status.success(),
        "exited with {status} after {:?}",
        sent.elapsed()
    );
    // The log tells the shutdown in the order it happened: the signal, then the drain.
    let log = std::fs::read_to_string(op.log_path()).expect("the operator's log");
    let signal = log.find("signal received").expect("the signal is logged");
    let drain = log
        .find("finishing in-flight reconciles")
        .expect("the drain is logged");
    assert!(
        signal < drain,
        "the drain is logged before the signal:\n{log}"
    );
}

/// Where a rendered object goes: its RBAC path, for `kind` in `namespace`.
fn rbac_path(kind: &str, namespace: &str) -> String {
    let plural = match kind {
        "Role" => "roles",
        "RoleBinding" => "rolebindings",
        other => panic!("not a namespaced RBAC kind: {other}"),
    };
    format!("/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/{plural}")
}

/// Applies the Roles and RoleBindings `rendered` (by `make render`) grants in the namespaces of
/// `granted`, and its Lease's Role moved to the test's namespace with the account when
/// `lease`; answers how many.
fn apply_roles(
    c: &Cluster,
    rendered: &[serde_json::Value],
    granted: &[&Cluster],
    lease: bool,
) -> usize {
    let operator_ns = "immortalcontainers-operator";
    let mut applied = 0;
    for o in rendered {
        let kind = o["kind"].as_str().unwrap_or("");
        if kind.starts_with("Cluster") {
            assert_ne!(
                o["metadata"]["name"], "immortal-operator",
                "the namespaced render grants the cluster-wide {kind}"
            );
        }
        let ns = o["metadata"]["namespace"].as_str().unwrap_or("");
        let wanted = granted.iter().any(|g| g.ns == ns) || (lease && ns == operator_ns);
        if !matches!(kind, "Role" | "RoleBinding") || !wanted {
            continue;
        }
        // The account lives in the test's namespace, and so does the Lease.
        let mut o = o.clone();
        if ns == operator_ns {
            o["metadata"]["namespace"] = json!(c.ns);
        }
        for s in o["subjects"].as_array_mut().into_iter().flatten() {
            assert_eq!(s["namespace"], operator_ns, "{s}");
            s["namespace"] = json!(c.ns);
        }
        let target = o["metadata"]["namespace"].as_str().unwrap().to_string();
        c.api
            .post(&rbac_path(kind, &target), &o)
            .unwrap_or_else(|e| panic!("cannot create {kind} in {target}: {e}"));
        applied += 1;
    }
    applied
}

/// Waits until `as_operator` may list ImmortalContainers in `ns`: a real authorizer learns new
/// bindings from its cache.
fn wait_for_role(c: &Cluster, as_operator: &common::Api, ns: &str) {
    let path = format!(
        "/apis/{}/namespaces/{ns}/immortalcontainers",
        common::GROUP_VERSION
    );
    wait_until(
        c.timeout(Duration::from_secs(20)),
        "the Role to count",
        || {
            as_operator
                .try_request("GET", &path, "", None)
                .map_err(|e| e.to_string())
        },
    );
}

/// One operator for a set of namespaces, allowed only what the namespaced RBAC of `make render
/// NAMESPACES=a,b` grants: it runs as a ServiceAccount of the test's namespace, with that
/// render's Roles and RoleBindings in a and b (and its Lease's Role, moved to the test's
/// namespace with the account), on a token from a TokenRequest. Objects in a and b get their
/// pods and have them replaced; one in a third namespace gets none; nothing the operator
/// needs is refused. On a real cluster its authorizer decides the same.
#[test]
fn one_operator_serves_a_set_of_namespaces_with_only_their_roles() {
    let c = Cluster::new("namespaces");
    let (a, b, other) = (c.sibling("a"), c.sibling("b"), c.sibling("c"));
    let rendered = common::render(&[&a.ns, &b.ns]);
    assert_eq!(
        apply_roles(&c, &rendered, &[&a, &b], true),
        6,
        "a Role and RoleBinding in a, b and for the Lease"
    );
    let token = c.service_account_token("immortal-operator");
    let kubeconfig = c.token_kubeconfig("operator.kubeconfig", &token);
    let as_operator = common::Api::from_kubeconfig(&kubeconfig);
    for ns in [&a.ns, &b.ns] {
        wait_for_role(&c, &as_operator, ns);
    }
    let denied = as_operator.try_request(
        "GET",
        &format!("/api/v1/namespaces/{}/pods", other.ns),
        "",
        None,
    );
    assert_eq!(denied.err().and_then(|e| e.code()), Some(403));

    let args = [
        "--leader-elect".to_string(),
        format!("--leader-election-namespace={}", c.ns),
    ];
    let op = Operator::start_serving(&c, &kubeconfig, &[&a, &b], &args, "operator.log");
    for ns in [&a, &b, &other] {
        ns.create_ic("web", &image());
    }
    let pod_a = a.wait_converged("web", 1, |_| Ok(()));
    b.wait_converged("web", 1, |_| Ok(()));
    // The watches of b work on their own: a deleted pod comes back.
    let old = b.assert_converged("web", 1);
    assert!(b.delete_pod(name(&old), uid(&old)));
    b.wait_converged("web", 2, |p| {
        (uid(p) != uid(&old))
            .then_some(())
            .ok_or("the old pod".into())
    });
    a.assert_converged("web", 1);
    assert_eq!(uid(&a.assert_converged("web", 1)), uid(&pod_a));

    // Served or not, it had time: nothing touches the third namespace's object.
    std::thread::sleep(c.timeout(Duration::from_secs(2)));
    let unserved = other.ic("web");
    assert!(unserved["status"].is_null(), "status written: {unserved}");
    assert_eq!(other.list_managed_pods().unwrap().len(), 0);
    assert!(
        op.log_says(&format!("\"namespace\":\"{},{}\"", a.ns, b.ns)),
        "the starting line names the namespaces:\n{}",
        op.log_tail(20)
    );
    let log = std::fs::read_to_string(op.log_path()).unwrap();
    let refused: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("\"level\":\"WARN\"") || l.contains("\"level\":\"ERROR\""))
        .filter(|l| l.contains("denied") || l.contains("forbidden"))
        .collect();
    assert!(refused.is_empty(), "refused with its Roles: {refused:#?}");
}

fn free_port() -> std::net::SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free local port")
}

/// A plain HTTP GET of the operator's probes; empty when nothing answers.
fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)) else {
        return String::new();
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    );
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

/// Waits until `/readyz` answers `code` with a text that contains `says`; answers the text.
fn readyz(c: &Cluster, probes: std::net::SocketAddr, code: u16, says: &str) -> String {
    wait_until(
        c.timeout(Duration::from_secs(45)),
        &format!("/readyz {code} saying {says:?}"),
        || {
            let r = http_get(probes, "/readyz");
            (r.starts_with(&format!("HTTP/1.1 {code}")) && r.contains(says))
                .then(|| r.clone())
                .ok_or(r)
        },
    )
}

/// A namespace served with no Role of ours (not applied yet, or deleted with it) is named,
/// with why, in the log and `/readyz`, and leaves the others served from the start; its Role
/// applied, it is served too.
#[test]
fn a_namespace_without_its_role_is_named_and_leaves_the_others_served_from_the_start() {
    let c = Cluster::new("ns-unserved");
    let (a, b) = (c.sibling("a"), c.sibling("b"));
    let rendered = common::render(&[&a.ns, &b.ns]);
    apply_roles(&c, &rendered, &[&a], false);
    let token = c.service_account_token("immortal-operator");
    let kubeconfig = c.token_kubeconfig("operator.kubeconfig", &token);
    let as_operator = common::Api::from_kubeconfig(&kubeconfig);
    wait_for_role(&c, &as_operator, &a.ns);
    let probes = free_port();
    let args = [
        "--health-probe-bind-address".to_string(),
        probes.to_string(),
    ];
    let op = Operator::start_serving(&c, &kubeconfig, &[&a, &b], &args, "operator.log");
    a.create_ic("web", &image());
    b.create_ic("web", &image());
    a.wait_converged("web", 1, |_| Ok(()));
    let r = readyz(&c, probes, 503, &format!("namespace {} not served", b.ns));
    assert!(
        r.contains("403") && !r.contains(&format!("namespace {} ", a.ns)),
        "{r}"
    );
    assert!(
        op.log_says(&format!("namespace {} is not served", b.ns)),
        "{}",
        op.log_tail(20)
    );
    // Its Role applied, it is served: its object gets its pod, and the operator is ready.
    apply_roles(&c, &rendered, &[&b], false);
    wait_for_role(&c, &as_operator, &b.ns);
    b.wait_converged("web", 1, |_| Ok(()));
    readyz(&c, probes, 200, "ok");
    a.assert_converged("web", 1);
}

/// A served namespace that does not exist (a typo, or one made later) is said in one WARN line
/// naming it and in `/readyz`; the others are served; made later, it is served at once.
#[test]
fn a_served_namespace_that_does_not_exist_is_said_and_served_once_it_is_made() {
    let c = Cluster::new("ns-missing");
    // The name `sibling` gives, before it makes the namespace.
    let mut later = c.ns.clone();
    later.truncate(63 - "later".len() - 1);
    let later = format!("{}-later", later.trim_end_matches('-'));
    let probes = free_port();
    let args = [
        "--namespace".to_string(),
        later.clone(),
        "--health-probe-bind-address".to_string(),
        probes.to_string(),
    ];
    let op = Operator::start_with(&c, &args, "operator.log");
    c.create_ic("web", &image());
    c.wait_converged("web", 1, |_| Ok(()));
    readyz(
        &c,
        probes,
        503,
        &format!("namespace {later} does not exist"),
    );
    let warned = std::fs::read_to_string(op.log_path())
        .unwrap_or_default()
        .lines()
        .filter(|l| {
            l.contains("\"level\":\"WARN\"")
                && l.contains(&format!("served namespace {later} does not exist"))
        })
        .count();
    assert_eq!(warned, 1, "{}", op.log_tail(20));
    let l = c.sibling("later");
    assert_eq!(l.ns, later);
    l.create_ic("web", &image());
    l.wait_converged("web", 1, |_| Ok(()));
    readyz(&c, probes, 200, "ok");
}

/// An operator whose every list is refused (a token the API server takes, no RBAC at all)
/// serves nothing: it exits 1 after waiting for a list, naming each namespace and why, for
/// the kubelet to restart it (CrashLoopBackOff).
#[test]
fn an_operator_that_may_list_nothing_exits_naming_each_namespace_and_why() {
    let c = Cluster::new("ns-denied");
    let token = c.service_account_token("nobody");
    let kubeconfig = c.token_kubeconfig("nobody.kubeconfig", &token);
    let started = Instant::now();
    let mut op = Operator::start_as(&c, &kubeconfig, &[], "operator.log");
    let status = op
        .wait_exit(c.timeout(Duration::from_secs(60)))
        .unwrap_or_else(|| panic!("still running:\n{}", op.log_tail(20)));
    assert_eq!(status.code(), Some(1), "{}", op.log_tail(20));
    assert!(
        started.elapsed() >= Duration::from_secs(25),
        "{:?}",
        started.elapsed()
    );
    let log = std::fs::read_to_string(op.log_path()).unwrap_or_default();
    let error = log
        .lines()
        .find(|l| l.contains("\"level\":\"ERROR\""))
        .unwrap_or_else(|| panic!("no ERROR line:\n{}", op.log_tail(20)));
    assert!(
        error.contains("no served namespace could be listed in 30s")
            && error.contains(&format!("namespace {} not served", c.ns))
            && error.contains("403"),
        "{error}"
    );
}
