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

#[test]
fn a_tiny_benchmark_run_completes_with_every_correctness_check_passed() {
    let cfg = immortal_bench::Config {
        operator: PathBuf::from(env!("CARGO_BIN_EXE_immortal-operator")),
        objects: 20,
        connections: 4,
        recovery: 5,
        workers: 1,
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
    let op = report.bulk_operator.as_ref().expect("bulk operator");
    assert!(op.idle.is_some_and(|u| u.rss_kib > 0));
    assert_eq!(op.exit_code, Some(0), "the operator exits 0 on SIGTERM");
    assert!(!report.checks.is_empty());
    assert!(report.table().contains("correctness: passed"));
}
