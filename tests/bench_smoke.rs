//! CI smoke test of the benchmark: a tiny run through every phase proves the bench still works
//! and the operator stays correct under it. Timing is never asserted here; `make bench` measures.

use std::path::PathBuf;
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

/// The run's own budget: every wait inside it gives up by then and the operator is killed.
const RUN_BUDGET: Duration = Duration::from_secs(90);
/// The test's backstop, should the run not return at all.
const DEADLINE: Duration = Duration::from_secs(120);
/// The herd phase: this many objects queued when every request of theirs fails for this long.
const HERD_OBJECTS: usize = 500;
const HERD_BURST: Duration = Duration::from_secs(3);
/// The restart-after-drain phase: pods of its 20 objects force-deleted while no operator runs.
const DRAIN_PODS: usize = 5;

#[test]
fn a_tiny_benchmark_run_completes_with_every_correctness_check_passed() {
    let cfg = immortal_bench::Config {
        operator: PathBuf::from(env!("CARGO_BIN_EXE_immortal-operator")),
        objects: 20,
        connections: 4,
        recovery: 5,
        workers: 1,
        burst: HERD_BURST,
        // 500s, not 503s: the client retries a 503 within the request (sleeping 2.8 s over 4
        // attempts), which alone keeps one worker slow; a 500 goes straight back to the queue,
        // so only the queue's budget stands between 500 failing objects and a flood.
        burst_status: 500,
        burst_objects: Some(HERD_OBJECTS),
        drain_pods: DRAIN_PODS,
        timeout: RUN_BUDGET,
        ..immortal_bench::Config::default()
    };
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(immortal_bench::run(&cfg));
    });
    let report = rx
        .recv_timeout(DEADLINE)
        .expect("the bench run did not return within 120 s")
        .unwrap_or_else(|e| panic!("the bench run failed: {e}"));

    assert!(
        report.failures.is_empty(),
        "correctness failures:\n{}",
        report.failures.join("\n")
    );
    // Every phase ran and produced its numbers.
    assert_eq!(
        report
            .floor
            .iter()
            .map(|f| f.connections)
            .collect::<Vec<_>>(),
        [1, 4]
    );
    let backlog = report.backlog.as_ref().expect("backlog phase");
    let bulk = report.bulk.as_ref().expect("bulk phase");
    assert!(backlog.correct && bulk.correct);
    assert_eq!(backlog.requests.pods_created, 20);
    assert!(backlog.requests.total > 0 && bulk.requests.total > 0);
    let deleted = report
        .recovery_deleted
        .as_ref()
        .expect("recovery (deleted)");
    let failed = report.recovery_failed.as_ref().expect("recovery (failed)");
    assert_eq!((deleted.samples_ms.len(), failed.samples_ms.len()), (5, 5));
    // The test server's kubelet makes every pod Ready, and the phases wait for the operator
    // to say so before counting requests: the Ready writes are the phase's, not the next's.
    assert_eq!((backlog.ready, bulk.ready), (20, 20));
    assert!(backlog.ready_seconds.is_some() && bulk.ready_seconds.is_some());
    let load = report.load.as_ref().expect("recovery under load");
    assert_eq!(
        load.latency.samples_ms.len(),
        5,
        "every deletion under load replaced"
    );
    // The modeled control plane's phase ran on its own test server, correctly, and counted
    // the writes of every pod it created.
    let modeled = report.modeled.as_ref().expect("modeled phase");
    assert!(modeled.backlog.correct);
    assert_eq!(modeled.backlog.requests.pods_created, 20);
    assert!(modeled.backlog.requests.writes_per_pod_created >= 2.0);
    // Every object's POST and count come before convergence, and no write is counted twice.
    let until = modeled
        .backlog
        .writes_per_pod_until_converged
        .expect("the test server counts writes");
    assert!(
        (2.0..=modeled
            .backlog
            .requests
            .writes_per_pod_created_without_events)
            .contains(&until),
        "{until} writes a pod until converged"
    );
    assert!(modeled.backlog.in_flight.is_some_and(|f| f.peak >= 1));
    // Every phase says when every pod existed and when every status named it, each over its
    // floor: the modeled backlog over the kube-rs-style floor's connections.
    for c in [backlog, bulk, &modeled.backlog] {
        assert!(c.pods_seconds > 0.0 && c.status_seconds > 0.0);
        assert!(c.over_floor.as_ref().is_some_and(|o| o.pods_ratio > 0.0));
    }
    assert_eq!(
        modeled.backlog.over_floor.as_ref().map(|o| o.connections),
        Some(immortal_bench::KUBE_RS_IN_FLIGHT)
    );
    // After the restart each force-deleted pod came back once, and only those.
    let drain = report.drain.as_ref().expect("restart after a drain");
    assert!(drain.correct);
    assert_eq!((drain.objects, drain.pods_deleted), (20, DRAIN_PODS));
    assert_eq!(
        drain.requests.by_verb.get("create pods"),
        Some(&(DRAIN_PODS as u64))
    );
    assert!(drain.first_back_seconds <= drain.back_seconds);
    assert!(drain.back_seconds <= drain.status_seconds);
    assert!(drain.status_seconds <= drain.refreshed_seconds);
    let op = report.bulk_operator.as_ref().expect("bulk operator");
    assert!(op.idle.is_some_and(|u| u.rss_kib > 0));
    assert_eq!(op.exit_code, Some(0), "the operator exits 0 on SIGTERM");
    // The one timing-free bound of the run: requests in a window can only be fewer on a slow
    // machine. Without the queue's budget, 500 failing objects cost thousands a second. With
    // it: its 100 tokens and 10 a second, the workers' reconciles in flight when it ran out
    // (the pool grows to its bound while 500 keys wait), and what successes elsewhere refund
    // (the earlier phases' objects, in other namespaces), at most as many again.
    let herd = report.herd.as_ref().expect("herd phase");
    assert!(herd.correct, "converged after the burst");
    let budget = 100 + 10 * HERD_BURST.as_secs() + 1;
    let most = 2 * budget + immortal_operator::cli::DEFAULT_MAX_WORKERS as u64;
    assert!(
        herd.requests.total <= most,
        "{} requests during {:?} of 500s ({:?} a second), at most {most}",
        herd.requests.total,
        HERD_BURST,
        herd.per_second
    );
    assert!(!report.checks.is_empty());
    assert!(report.table().contains("correctness: passed"));
}
