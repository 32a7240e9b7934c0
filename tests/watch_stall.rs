//! End-to-end: a watch whose connection stays open but says nothing (its node or load balancer
//! gone without a reset) is given up after `--watch-idle-timeout` and resumed, so what happened
//! meanwhile is still acted on; and `/readyz` fails while watches cannot be re-established, and
//! recovers after. Test server only: it freezes open streams and holds new ones; SKIPPED on a
//! real cluster.

mod common;

use common::{image, name, uid, wait_until, Cluster, Operator};
use kube_testserver::StallRule;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The idle limit the operator runs with here: three of the test server's one-second bookmark
/// intervals, so a healthy watch is never given up, and short enough for a test.
const IDLE: Duration = Duration::from_secs(3);
const IDLE_FLAG: &str = "3s";

#[test]
fn a_frozen_watch_is_given_up_and_a_pod_deleted_meanwhile_is_replaced_within_a_few_idle_periods() {
    let c = Cluster::new("watch-stall");
    let Some(server) = c.test_server_or_skip("watch stall") else {
        return;
    };
    let op = Operator::start_with(
        &c,
        &["--watch-idle-timeout".to_string(), IDLE_FLAG.to_string()],
        "operator.log",
    );
    c.create_ic("web", &image());
    let first = c.wait_converged("web", 1, |_| Ok(()));

    // Both of the operator's streams stay open and fall silent; the pod's DELETED event is
    // held back on the frozen one. Watches opened from now on are served.
    server.freeze_watches();
    let frozen = Instant::now();
    assert!(
        c.delete_pod(name(&first), uid(&first)),
        "the pod was already gone"
    );
    let old = uid(&first).to_string();
    // Before the idle limit, a frozen watch went unnoticed for its timeoutSeconds plus 30 s
    // (up to 260 s): this bound would fail.
    let bound = c.timeout(IDLE * 4);
    wait_until(bound, "the deleted pod's replacement, counted", || {
        let pod = c.converged("web", 2)?;
        if uid(&pod) == old {
            return Err("still the old pod".into());
        }
        Ok(pod)
    });
    let took = frozen.elapsed();
    eprintln!("replaced {took:?} after the freeze (idle limit {IDLE:?})");
    // The old streams are still open on the server (frozen, unanswered): the replacement came
    // through new watches, which the operator opened after giving the old ones up (the
    // ImmortalContainer watch's backoff may end a little after the pod watch's).
    wait_until(
        c.timeout(IDLE),
        "two frozen and two new watches",
        || match server.open_watches() {
            n if n >= 4 => Ok(()),
            n => Err(format!("{n} watches open")),
        },
    );
    let log = std::fs::read_to_string(op.log_path()).unwrap_or_default();
    assert!(
        log.lines()
            .any(|l| l.contains("given up as dead") && l.contains("\"WARN\"")),
        "the operator says at WARN that it gave a silent watch up:\n{}",
        op.log_tail(30)
    );
    server.thaw_watches();
}

#[test]
fn readyz_fails_while_watches_cannot_be_reestablished_and_passes_again_after() {
    let c = Cluster::new("watch-readyz");
    let Some(server) = c.test_server_or_skip("watch readiness") else {
        return;
    };
    let probes = free_port();
    let op = Probed::start(&c, probes);
    let ready = |body: &str| body.starts_with("HTTP/1.1 200");
    wait_until(c.timeout(Duration::from_secs(20)), "/readyz 200", || {
        let r = http_get(probes, "/readyz");
        op.check_alive();
        if ready(&r) {
            Ok(())
        } else {
            Err(r)
        }
    });

    // A partition: the open streams fall silent and new watches are never answered.
    let stall = server.stall(StallRule {
        verb: Some("watch".into()),
        ..StallRule::default()
    });
    server.freeze_watches();
    let cut = Instant::now();
    let why = wait_until(c.timeout(IDLE * 5), "/readyz to fail", || {
        let r = http_get(probes, "/readyz");
        op.check_alive();
        if r.starts_with("HTTP/1.1 503") {
            Ok(r)
        } else {
            Err(r)
        }
    });
    let unready_after = cut.elapsed();
    eprintln!("unready {unready_after:?} after the cut (idle limit {IDLE:?})");
    assert!(
        why.contains("watch in namespace") && why.contains("not live for"),
        "{why}"
    );
    // Not at the first silence: a watch is live until the idle limit has passed since it was
    // last heard, and unready only once it has not been live for another idle limit.
    assert!(unready_after >= IDLE, "{unready_after:?}");
    assert!(
        ready(&http_get(probes, "/healthz")),
        "alive all along: a partition is no reason for the kubelet to restart it"
    );

    server.lift_stall(stall);
    server.thaw_watches();
    let healed = Instant::now();
    wait_until(
        c.timeout(Duration::from_secs(40)),
        "/readyz 200 again",
        || {
            let r = http_get(probes, "/readyz");
            op.check_alive();
            if ready(&r) {
                Ok(())
            } else {
                Err(r)
            }
        },
    );
    eprintln!(
        "ready again {:?} after the partition ended",
        healed.elapsed()
    );
}

fn free_port() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free local port")
}

/// A plain HTTP GET; empty when the connection fails or closes without an answer.
fn http_get(addr: SocketAddr, path: &str) -> String {
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_secs(2)) else {
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

/// The operator with its probes on `probes` (the shared harness turns them off), killed when
/// dropped; its log is printed when the test fails.
struct Probed {
    child: std::cell::RefCell<Child>,
    log: std::path::PathBuf,
}

impl Probed {
    fn start(c: &Cluster, probes: SocketAddr) -> Probed {
        let log = c.dir().join("operator.log");
        let child = Command::new(common::operator_binary())
            .arg("--kubeconfig")
            .arg(c.kubeconfig())
            .args(["--namespace", &c.ns, "--log-format", "json"])
            .args(["--metrics-bind-address", "0"])
            .args(["--health-probe-bind-address", &probes.to_string()])
            .args(["--watch-idle-timeout", IDLE_FLAG])
            .env("RUST_LOG", "debug")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("operator log"))
            .spawn()
            .expect("the operator starts");
        Probed {
            child: std::cell::RefCell::new(child),
            log,
        }
    }

    fn check_alive(&self) {
        if let Ok(Some(status)) = self.child.borrow_mut().try_wait() {
            panic!("the operator exited: {status}");
        }
    }
}

impl Drop for Probed {
    fn drop(&mut self) {
        let child = self.child.get_mut();
        let _ = child.kill();
        let _ = child.wait();
        if std::thread::panicking() {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            let lines: Vec<&str> = log.lines().collect();
            eprintln!(
                "---- operator log tail ----\n{}",
                lines[lines.len().saturating_sub(40)..].join("\n")
            );
        }
    }
}
