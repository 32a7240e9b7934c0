//! End-to-end tests of leader election when the API server misbehaves: a leader whose Lease
//! renewals hang must make no write once the Lease could have passed to the standby, and a
//! SIGTERM must end the process, Lease released or left to expire, within the Deployment's
//! `terminationGracePeriodSeconds` (10) even while the API server hangs.
//!
//! Each replica authenticates as a user of its own, so the test server's request log says who
//! sent what and when it took effect: the proof comes from the server's side, not from the
//! operator's own account. These scenarios need the test server's stalls; on a real cluster
//! they say SKIPPED, but for the last: a Lease written by someone else keeps its leader.

mod common;

use common::{image, pod_name, uid, wait_until, Cluster, Operator};
use kube_testserver::{Logged, StallRule, TestServer};
use serde_json::json;
use std::time::{Duration, Instant};

/// The lease duration of the fencing scenario (`--lease-duration 3s`).
const LEASE: Duration = Duration::from_secs(3);

/// The bound a shutdown must meet: the Deployment's `terminationGracePeriodSeconds`, less a
/// second for the kubelet and a loaded node. The operator aims at 7 s (5 s for the reconciles
/// in flight, 2 s for the release).
const SHUTDOWN_BOUND: Duration = Duration::from_secs(9);

fn elect_args(ns: &str, lease: &str, renew_deadline: &str, retry_period: &str) -> Vec<String> {
    [
        "--leader-elect",
        "--leader-election-namespace",
        ns,
        "--lease-duration",
        lease,
        "--renew-deadline",
        renew_deadline,
        "--retry-period",
        retry_period,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// The Lease's holder, read past HTTP, auth and stalls.
fn holder(server: &TestServer, ns: &str) -> Option<String> {
    let lease = server.get_json(&format!(
        "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/immortal-operator"
    ))?;
    lease["spec"]["holderIdentity"]
        .as_str()
        .filter(|h| !h.is_empty())
        .map(String::from)
}

fn wait_for_log(op: &Operator, needle: &str, what: &str) {
    wait_until(Duration::from_secs(20), what, || {
        if op.log_says(needle) {
            Ok(())
        } else {
            Err(op.log_tail(5))
        }
    });
}

/// A write of the Lease by `user` that made or kept it the holder.
fn lease_won(l: &Logged, user: &str) -> bool {
    l.user == user && l.resource == "leases" && l.is_write() && (200..300).contains(&l.code)
}

/// A write by `user` to anything but the Lease: pods, status, Events.
fn work_write(l: &Logged, user: &str) -> bool {
    l.user == user && l.resource != "leases" && l.is_write()
}

fn ms(d: Duration) -> u128 {
    d.as_millis()
}

#[test]
fn a_leader_whose_lease_renewals_hang_writes_nothing_once_the_lease_could_pass_and_the_standby_takes_over(
) {
    let cluster = Cluster::new("fence-hang");
    let Some(server) = cluster.test_server_or_skip("lease renewals that hang") else {
        return;
    };
    server.record_requests();
    let names: Vec<String> = (0..4).map(|i| format!("fenced-{i}")).collect();
    for n in &names {
        cluster.create_ic(n, &image());
    }
    // A renew deadline close to the lease duration, as the flags allow: the elector must keep
    // its writes inside the lease whatever the settings (the elector before the fence kept
    // writing for up to 1.25 renew deadlines plus a retry period: here 4 s of a 3 s lease).
    let args = elect_args(&cluster.ns, "3s", "2800ms", "500ms");
    let a_config = cluster.user_kubeconfig(server, "replica-a");
    let b_config = cluster.user_kubeconfig(server, "replica-b");
    let mut a = Operator::start_as(&cluster, &a_config, &args, "replica-a.log");
    wait_for_log(&a, "became leader", "replica a leads");
    let b = Operator::start_as(&cluster, &b_config, &args, "replica-b.log");
    wait_for_log(&b, "standing by", "replica b stands by");
    for n in &names {
        cluster.wait_converged(n, 1, |_| Ok(()));
    }

    // From now on replica a's Lease requests hang; everything else flows. The test keeps
    // deleting pods, so whoever leads always has writes to make.
    let stalled = Instant::now();
    server.stall(StallRule {
        user: Some("replica-a".into()),
        path_contains: Some("/leases".into()),
        ..StallRule::default()
    });
    let mut a_exit = None;
    let mut turn = 0;
    loop {
        let n = &names[turn % names.len()];
        turn += 1;
        if let Ok(Some(pod)) = cluster.get_pod(&pod_name(n)) {
            cluster.delete_pod(&pod_name(n), uid(&pod));
        }
        if a_exit.is_none() {
            a_exit = a.wait_exit(Duration::ZERO);
        }
        let b_wrote = server
            .request_log()
            .iter()
            .any(|l| work_write(l, "replica-b") && l.resource == "pods");
        if a_exit.is_some() && b_wrote {
            break;
        }
        assert!(
            stalled.elapsed() < Duration::from_secs(20),
            "20 s after the stall: replica a exited: {a_exit:?}, replica b wrote a pod: {b_wrote}\n{}",
            b.log_tail(10)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let status = a_exit.expect("replica a exited");
    assert!(
        !status.success(),
        "a deposed leader exits non-zero: {status:?}"
    );
    assert!(a.log_says("leadership lost"), "{}", a.log_tail(10));

    let log = server.request_log();
    let last_renewal = log
        .iter()
        .rfind(|l| lease_won(l, "replica-a"))
        .expect("replica a renewed its lease before the stall");
    // No standby can have seen that renewal before it arrived, and it takes the Lease only
    // after seeing one record unchanged for the lease duration.
    let could_pass = last_renewal.received + LEASE;
    let a_writes: Vec<&Logged> = log.iter().filter(|l| work_write(l, "replica-a")).collect();
    let last_a_write = a_writes
        .iter()
        .map(|l| l.answered)
        .max()
        .expect("replica a wrote while it led");
    let late: Vec<String> = a_writes
        .iter()
        .filter(|l| l.answered >= could_pass)
        .map(|l| {
            format!(
                "{} {} {} at +{} ms",
                l.verb,
                l.target,
                l.code,
                ms(l.answered - last_renewal.received)
            )
        })
        .collect();
    let took_over = log
        .iter()
        .find(|l| lease_won(l, "replica-b"))
        .expect("replica b took the lease");
    let first_b_write = log
        .iter()
        .filter(|l| work_write(l, "replica-b"))
        .map(|l| l.received)
        .min()
        .expect("replica b wrote");
    eprintln!(
        "replica a: last write {} ms after its last successful renewal arrived (lease {} ms); \
         replica b took the lease at +{} ms and wrote first at +{} ms",
        ms(last_a_write - last_renewal.received),
        ms(LEASE),
        ms(took_over.received - last_renewal.received),
        ms(first_b_write - last_renewal.received),
    );
    assert!(
        late.is_empty(),
        "replica a wrote after its lease could have passed to replica b (+{} ms): {late:#?}",
        ms(LEASE)
    );
    assert!(
        took_over.received >= could_pass,
        "replica b took the lease before it could expire"
    );
    assert!(last_a_write < first_b_write, "never two writers at once");

    // The new leader puts every pod back.
    wait_until(
        cluster.timeout(Duration::from_secs(20)),
        "replica b restored every pod",
        || {
            let missing: Vec<&String> = names
                .iter()
                .filter(|n| !matches!(cluster.get_pod(&pod_name(n)), Ok(Some(_))))
                .collect();
            if missing.is_empty() {
                Ok(())
            } else {
                Err(format!("missing pods of {missing:?}"))
            }
        },
    );
}

/// Starts one leading replica as user `replica-a` with a long lease (the scenario must not
/// lose it by expiry), its object converged; returns it and its identity.
fn lone_leader(cluster: &Cluster, server: &TestServer, object: &str) -> (Operator, String) {
    cluster.create_ic(object, &image());
    let config = cluster.user_kubeconfig(server, "replica-a");
    let args = elect_args(&cluster.ns, "30s", "20s", "500ms");
    let a = Operator::start_as(cluster, &config, &args, "replica-a.log");
    wait_for_log(&a, "became leader", "replica a leads");
    cluster.wait_converged(object, 1, |_| Ok(()));
    let identity = holder(server, &cluster.ns).expect("the lease has a holder");
    (a, identity)
}

/// SIGTERMs `op` and waits for its exit within [`SHUTDOWN_BOUND`]; returns how long it took.
fn sigterm_and_time_exit(op: &mut Operator) -> Duration {
    let t = Instant::now();
    op.sigterm();
    let status = op.wait_exit(SHUTDOWN_BOUND).unwrap_or_else(|| {
        panic!(
            "still running {SHUTDOWN_BOUND:?} after SIGTERM:\n{}",
            op.log_tail(10)
        )
    });
    let took = t.elapsed();
    assert!(status.success(), "graceful exit: {status:?}");
    took
}

#[test]
fn sigterm_while_the_api_server_hangs_every_request_exits_in_time_and_the_release_lands_once_answered(
) {
    let cluster = Cluster::new("sigterm-hang");
    let Some(server) = cluster.test_server_or_skip("an API server that hangs") else {
        return;
    };
    let (mut a, identity) = lone_leader(&cluster, server, "hung");

    // Every read and every update (the Lease's renewal and release are a GET and a PUT) of the
    // operator hangs from now on; the open watches go on streaming. Patches still pass: the
    // garbage collector deletes the object's pod at once, and the pod watch may deliver that
    // before the object's DELETED, whose reconcile must then find the worker free.
    let stalls = ["get", "update"].map(|verb| {
        server.stall(StallRule {
            user: Some("replica-a".into()),
            verb: Some(verb.into()),
            ..StallRule::default()
        })
    });
    // The object is deleted: its reconcile reads it from the API server (the watch's DELETED
    // made the operator forget it) to learn whether a pod of it is left to release. That read
    // is the reconcile that now hangs, so the release of the Lease may still be sent (no write
    // is in flight).
    cluster.delete_ic("hung");
    // The pod watch may deliver the pod's deletion (the garbage collector's) before the
    // object's DELETED, and the queue keeps the first trigger; either way the reconcile that
    // forgot the object is the one left hanging: the last the log shows started, and still
    // unfinished 300 ms later (its first request, the object's GET, is held by the server).
    let hanging = || {
        let tail = a.log_tail(200);
        let last = tail
            .lines()
            .rfind(|l| l.contains(r#""target":"reconcile""#))
            .map(String::from)
            .unwrap_or_default();
        last.contains(r#""msg":"reconciling""#)
            && (last.contains("immortalcontainer DELETED") || last.contains("Terminating"))
    };
    wait_until(
        Duration::from_secs(20),
        "a reconcile of the deleted object to start and hang",
        || {
            if hanging() {
                std::thread::sleep(Duration::from_millis(300));
                if hanging() {
                    return Ok(());
                }
            }
            Err(a.log_tail(5))
        },
    );

    let took = sigterm_and_time_exit(&mut a);
    eprintln!(
        "SIGTERM to exit with every request hanging: {} ms",
        ms(took)
    );
    assert!(a.log_says("abandoning"), "{}", a.log_tail(10));
    assert!(a.log_says("could not release lease"), "{}", a.log_tail(10));
    assert_eq!(
        holder(server, &cluster.ns).as_deref(),
        Some(identity.as_str()),
        "the release has not been answered yet"
    );

    // The server gets to the held release after all: the Lease is free without expiring.
    for stall in stalls {
        server.lift_stall(stall);
    }
    wait_until(
        Duration::from_secs(5),
        "the held release to be applied",
        || match holder(server, &cluster.ns) {
            None => Ok(()),
            Some(h) => Err(format!("holder {h}")),
        },
    );
}

#[test]
fn sigterm_while_a_write_hangs_leaves_the_lease_to_expire_instead_of_releasing_it() {
    let cluster = Cluster::new("sigterm-write");
    let Some(server) = cluster.test_server_or_skip("a pod create that hangs") else {
        return;
    };
    let (mut a, identity) = lone_leader(&cluster, server, "stuck");
    let creates = |server: &TestServer| {
        server
            .request_counts()
            .get(&("create".to_string(), "pods".to_string()))
            .copied()
            .unwrap_or(0)
    };
    let before = creates(server);
    server.stall(StallRule {
        user: Some("replica-a".into()),
        verb: Some("create".into()),
        path_contains: Some("/pods".into()),
        ..StallRule::default()
    });
    let pod = cluster
        .get_pod(&pod_name("stuck"))
        .unwrap()
        .expect("pod exists");
    assert!(cluster.delete_pod(&pod_name("stuck"), uid(&pod)));
    wait_until(
        Duration::from_secs(10),
        "the replacement pod's create to reach the server and hang",
        || {
            if creates(server) > before {
                Ok(())
            } else {
                Err(a.log_tail(5))
            }
        },
    );

    let took = sigterm_and_time_exit(&mut a);
    eprintln!("SIGTERM to exit with a pod create hanging: {} ms", ms(took));
    assert!(a.log_says("not releasing the lease"), "{}", a.log_tail(10));
    // The server may still apply that create; a standby must not lead before its timeout
    // ended, so the Lease stays until it expires.
    assert_eq!(
        holder(server, &cluster.ns).as_deref(),
        Some(identity.as_str())
    );
}

#[test]
fn sigterm_during_start_up_against_an_api_server_that_hangs_exits_in_time() {
    let cluster = Cluster::new("sigterm-start");
    let Some(server) = cluster.test_server_or_skip("an API server that hangs") else {
        return;
    };
    let config = cluster.user_kubeconfig(server, "replica-a");
    server.stall(StallRule {
        user: Some("replica-a".into()),
        ..StallRule::default()
    });
    let args = elect_args(&cluster.ns, "15s", "10s", "2s");
    server.reset_request_counts();
    let mut a = Operator::start_as(&cluster, &config, &args, "replica-a.log");
    // Its first request comes after its signal handlers are in place.
    wait_until(
        Duration::from_secs(10),
        "the start-up check to reach the server",
        || match server.request_counts().keys().next() {
            Some(_) => Ok(()),
            None => Err("no request yet".into()),
        },
    );
    let took = sigterm_and_time_exit(&mut a);
    eprintln!("SIGTERM to exit during start-up checks: {} ms", ms(took));
    assert!(
        took < Duration::from_secs(7),
        "one check is bounded to 5 s: {took:?}"
    );
}

#[test]
fn a_lease_written_by_someone_else_is_renewed_again_and_the_leader_keeps_leading() {
    let cluster = Cluster::new("lease-touched");
    cluster.create_ic("touched", &image());
    // A short retry period: many renewals, so that an annotation soon lands between one's
    // read and its write, the only moment it can conflict.
    let args = elect_args(&cluster.ns, "15s", "10s", "200ms");
    let a = Operator::start_with(&cluster, &args, "replica-a.log");
    wait_for_log(&a, "became leader", "replica a leads");
    let b = Operator::start_with(&cluster, &args, "replica-b.log");
    wait_for_log(&b, "standing by", "replica b stands by");
    cluster.wait_converged("touched", 1, |_| Ok(()));
    let lease = format!(
        "/apis/coordination.k8s.io/v1/namespaces/{}/leases/immortal-operator",
        cluster.ns
    );
    let holder = || {
        let l = cluster.api.get(&lease).expect("read the lease");
        l["spec"]["holderIdentity"]
            .as_str()
            .unwrap_or("")
            .to_string()
    };
    let leader = holder();

    // What `kubectl annotate lease` sends, again and again until a renewal meets one.
    let mut n = 0u64;
    wait_until(
        cluster.timeout(Duration::from_secs(60)),
        "a renewal to meet a write of someone else",
        || {
            for _ in 0..20 {
                n += 1;
                let patch =
                    json!({"metadata": {"annotations": {"example.com/touched": n.to_string()}}});
                cluster
                    .api
                    .merge_patch(&lease, &patch)
                    .expect("annotate the lease");
            }
            // The first line is the elector's on a conflict; the second, how it ended one of old.
            if a.log_says("reading it again") || a.log_says("leadership lost") {
                Ok(())
            } else {
                Err(format!("{n} annotations, no conflict yet"))
            }
        },
    );

    // Still the leader, and still at work: a deleted pod is replaced.
    let mut a = a;
    assert_eq!(
        a.wait_exit(Duration::from_secs(1)),
        None,
        "{}",
        a.log_tail(10)
    );
    assert!(!a.log_says("leadership lost"), "{}", a.log_tail(10));
    assert!(
        !b.log_says("became leader"),
        "no failover: {}",
        b.log_tail(10)
    );
    assert_eq!(holder(), leader);
    let pod = cluster
        .get_pod(&pod_name("touched"))
        .unwrap()
        .expect("its pod");
    cluster.delete_pod(&pod_name("touched"), uid(&pod));
    cluster.wait_converged("touched", 2, |_| Ok(()));
    assert!(
        !b.log_says("became leader"),
        "no failover: {}",
        b.log_tail(10)
    );
}
