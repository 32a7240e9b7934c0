//! End-to-end tests of what running in production adds: leader election between replicas, the
//! Lease released on SIGTERM, and `immortal-operator trace` on logs the operator really wrote.
//! They run against the test API server, or a real cluster with IMMORTAL_E2E_KUBECONFIG.

mod common;

use common::{pod_name, uid, wait_until, Cluster, Operator};
use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

/// Leader-election flags with short timings so a takeover fits in a test.
fn elect_args(ns: &str, lease: &str) -> Vec<String> {
    [
        "--leader-elect",
        "--leader-election-namespace",
        ns,
        "--lease-duration",
        lease,
        "--renew-deadline",
        "2s",
        "--retry-period",
        "500ms",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// The Lease's current holder, if any.
fn holder(cluster: &Cluster) -> Option<String> {
    let path = format!(
        "/apis/coordination.k8s.io/v1/namespaces/{}/leases/immortal-operator",
        cluster.ns
    );
    let lease = cluster.api.get(&path).ok()?;
    lease["spec"]["holderIdentity"]
        .as_str()
        .filter(|h| !h.is_empty())
        .map(String::from)
}

#[test]
fn two_replicas_elect_one_leader_and_the_standby_takes_over_when_the_leader_is_killed() {
    let cluster = Cluster::new("leader-kill");
    let names: Vec<String> = (0..5).map(|i| format!("elect-{i}")).collect();
    for n in &names {
        cluster.create_ic(n, &common::image());
    }
    let args = elect_args(&cluster.ns, "3s");
    let mut a = Operator::start_with(&cluster, &args, "replica-a.log");
    let mut b = Operator::start_with(&cluster, &args, "replica-b.log");
    let want: BTreeMap<String, i64> = names.iter().map(|n| (n.clone(), 1)).collect();
    wait_until(
        cluster.timeout(Duration::from_secs(30)),
        "every object converged under one leader",
        || cluster.converged_all(&want),
    );
    let leaders: Vec<&Operator> = [&a, &b]
        .into_iter()
        .filter(|o| o.log_says("became leader"))
        .collect();
    assert_eq!(leaders.len(), 1, "exactly one replica leads");
    let a_leads = a.log_says("became leader");

    // Kill the leader where it stands, and give the survivor work: a deleted pod.
    let (leader, standby) = if a_leads {
        (&mut a, &mut b)
    } else {
        (&mut b, &mut a)
    };
    leader.sigkill();
    let victim = &names[0];
    let pod = cluster
        .get_pod(&pod_name(victim))
        .unwrap()
        .expect("pod exists");
    assert!(cluster.delete_pod(&pod_name(victim), uid(&pod)));

    let mut want = want.clone();
    want.insert(victim.clone(), 2);
    wait_until(
        cluster.timeout(Duration::from_secs(30)),
        "the standby took over and replaced the pod",
        || cluster.converged_all(&want),
    );
    assert!(
        standby.log_says("became leader"),
        "the survivor must say it leads"
    );
    // Still one pod per object, counted exactly, a while later.
    cluster.assert_stays_converged(&want, Duration::from_secs(2));
}

#[test]
fn a_leader_stopped_with_sigterm_releases_the_lease_so_the_standby_need_not_wait_for_expiry() {
    let cluster = Cluster::new("leader-release");
    // A long lease: a takeover well before it could expire proves the lease was released.
    let args = elect_args(&cluster.ns, "30s");
    let mut a = Operator::start_with(&cluster, &args, "replica-a.log");
    wait_until(
        cluster.timeout(Duration::from_secs(20)),
        "replica a leads",
        || {
            if a.log_says("became leader") {
                Ok(())
            } else {
                Err(a.log_tail(5))
            }
        },
    );
    let b = Operator::start_with(&cluster, &args, "replica-b.log");
    wait_until(
        cluster.timeout(Duration::from_secs(20)),
        "replica b stands by",
        || {
            if b.log_says("standing by") {
                Ok(())
            } else {
                Err(b.log_tail(5))
            }
        },
    );
    let first = holder(&cluster).expect("the lease has a holder");

    let stopped = Instant::now();
    a.sigterm();
    let status = a
        .wait_exit(Duration::from_secs(5))
        .expect("the leader exits within 5 s of SIGTERM");
    assert!(status.success(), "graceful exit: {status:?}");
    assert!(a.log_says("released lease"));
    wait_until(
        Duration::from_secs(20),
        "replica b takes the released lease",
        || match holder(&cluster) {
            Some(h) if h != first && b.log_says("became leader") => Ok(()),
            other => Err(format!("holder {other:?}")),
        },
    );
    assert!(
        stopped.elapsed() < Duration::from_secs(30),
        "took over before the 30 s lease could expire"
    );
    // The new leader works.
    cluster.create_ic("after-handover", &common::image());
    cluster.wait_converged("after-handover", 1, |_| Ok(()));
}

#[test]
fn trace_tells_an_objects_history_from_the_logs_the_operator_wrote() {
    let cluster = Cluster::new("trace");
    let mut op = Operator::start(&cluster);
    cluster.create_ic("traced", &common::image());
    cluster.wait_converged("traced", 1, |_| Ok(()));
    let pod = cluster
        .get_pod(&pod_name("traced"))
        .unwrap()
        .expect("pod exists");
    assert!(cluster.delete_pod(&pod_name("traced"), uid(&pod)));
    cluster.wait_converged("traced", 2, |_| Ok(()));
    op.sigterm();
    op.wait_exit(Duration::from_secs(5))
        .expect("operator exits");

    let object = format!("{}/traced", cluster.ns);
    let out = Command::new(common::operator_binary())
        .args(["trace", &object, "--log"])
        .arg(op.log_path())
        .output()
        .expect("trace runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "trace failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The object's story: created when first seen (its ADDED event, or the initial list if it
    // was created while the operator started), replaced after its pod's deletion.
    let created = [
        "triggered by: immortalcontainer ADDED",
        "triggered by: immortalcontainer relist",
    ]
    .iter()
    .filter_map(|t| text.find(t))
    .min()
    .unwrap_or_else(|| panic!("no reconcile triggered by the object itself in:\n{text}"));
    let replaced = text
        .find("triggered by: pod DELETED")
        .unwrap_or_else(|| panic!("no pod DELETED reconcile in:\n{text}"));
    assert!(created < replaced, "in time order:\n{text}");
    assert!(
        text.contains("create_pod:") && text.contains("cause=new"),
        "{text}"
    );
    assert!(text.contains("cause=deleted"), "{text}");
    // Every creation's finalizer is released once its start is counted (docs/operating.md's
    // example shows it).
    assert!(
        text.contains("release_pod:") && text.contains("reason=its start is counted"),
        "{text}"
    );
    assert!(
        text.contains("patch_status:") && text.contains("start_times=2"),
        "{text}"
    );
    assert!(text.contains("→ success"), "{text}");
    // Another object's name finds nothing and says so.
    let none = Command::new(common::operator_binary())
        .args(["trace", "nowhere/nothing", "--log"])
        .arg(op.log_path())
        .output()
        .expect("trace runs");
    assert!(!none.status.success());
    assert!(String::from_utf8_lossy(&none.stderr).contains("no log line mentions nowhere/nothing"));
}

#[test]
fn trace_says_what_each_retry_of_a_refused_create_sent_and_what_the_server_answered() {
    let cluster = Cluster::new("trace-refused");
    let mut op = Operator::start(&cluster);
    cluster.create_ic("web", &common::image());
    let first = cluster.wait_converged("web", 1, |_| Ok(()));
    // PodSecurity "restricted" refuses the plain pod (403); the operator retries after 1 s.
    cluster.label_namespace("pod-security.kubernetes.io/enforce", Some("restricted"));
    assert!(cluster.delete_pod_with_grace(common::name(&first), uid(&first), Some(0)));
    cluster.wait_ready("web", "False", "PodCreateFailed");
    let object = format!("{}/web", cluster.ns);
    let trace = || {
        let out = Command::new(common::operator_binary())
            .args(["trace", &object, "--log"])
            .arg(op.log_path())
            .output()
            .expect("trace runs");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let refused = "create_pod: cause=deleted image=";
    let text = wait_until(
        cluster.timeout(Duration::from_secs(20)),
        "a retry of the refused create in the trace",
        || {
            let text = trace();
            let retry = text.find("triggered by: scheduled requeue");
            match retry.and_then(|at| text[at..].find(refused)) {
                Some(_) => Ok(text),
                None => Err(text),
            }
        },
    );
    // The first try and each retry: the pod it sent, and the server's answer.
    let tries: Vec<&str> = text.lines().filter(|l| l.contains(refused)).collect();
    assert!(tries.len() >= 2, "{text}");
    for line in tries {
        assert!(
            line.contains("pod=web-immortalpod → refused: api error 403 Forbidden:")
                && line.contains("violates PodSecurity"),
            "{line}"
        );
    }
    cluster.label_namespace("pod-security.kubernetes.io/enforce", None);
    cluster.wait_converged("web", 2, |_| Ok(()));
    op.sigterm();
    op.wait_exit(Duration::from_secs(5))
        .expect("operator exits");
}

#[test]
fn trace_of_a_log_that_cannot_be_read_exits_3_not_the_bad_flags_code() {
    let missing =
        std::env::temp_dir().join(format!("immortal-trace-missing-{}.log", std::process::id()));
    let out = Command::new(common::operator_binary())
        .args(["trace", "default/example", "--log"])
        .arg(&missing)
        .output()
        .expect("trace runs");
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot open"));
    // Bad arguments keep 2, and the help says which code is which.
    let bad = Command::new(common::operator_binary())
        .args(["trace", "no-namespace"])
        .output()
        .expect("trace runs");
    assert_eq!(bad.status.code(), Some(2), "{bad:?}");
    let help = Command::new(common::operator_binary())
        .args(["trace", "--help"])
        .output()
        .expect("trace runs");
    assert!(String::from_utf8_lossy(&help.stdout).contains("3 the log file cannot be read"));
}
