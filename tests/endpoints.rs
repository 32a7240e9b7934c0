//! End-to-end tests of the operator binary's own endpoints: /metrics over HTTPS for callers the
//! API server authenticates and authorizes (the default), and endpoints that stay up and small
//! whatever a client sends. Always against the test API server: they need its users and tokens.

mod common;

use kube_testserver::{Options, Rule, TestServer};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

const BOUND: Duration = Duration::from_secs(20);

/// The operator process, killed when dropped.
struct Operator {
    child: Child,
    metrics: SocketAddr,
    probes: SocketAddr,
    log: std::path::PathBuf,
}

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if thread::panicking() {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            eprintln!("--- operator log ---\n{log}");
        }
        // Printed above when it matters; otherwise it would pile up in the temp directory.
        let _ = std::fs::remove_file(&self.log);
    }
}

fn free_port() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
}

/// Starts the operator with the admin kubeconfig on the `default` namespace and `extra` flags,
/// and waits until it is ready.
fn start(server: &TestServer, extra: &[&str]) -> Operator {
    let (metrics, probes) = (free_port(), free_port());
    let log = std::env::temp_dir().join(format!(
        "immortal-endpoints-{}-{}.log",
        std::process::id(),
        metrics.port()
    ));
    let child = Command::new(common::operator_binary())
        .arg("--kubeconfig")
        .arg(server.kubeconfig_path())
        .args(["--namespace", "default"])
        .args(["--metrics-bind-address", &metrics.to_string()])
        .args(["--health-probe-bind-address", &probes.to_string()])
        .args(extra)
        .env("RUST_LOG", "debug")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut op = Operator {
        child,
        metrics,
        probes,
        log,
    };
    let deadline = Instant::now() + BOUND;
    while !http_get(probes, "/readyz").starts_with("HTTP/1.1 200") {
        assert!(
            op.child.try_wait().unwrap().is_none(),
            "the operator exited"
        );
        assert!(Instant::now() < deadline, "the operator never became ready");
        thread::sleep(Duration::from_millis(20));
    }
    op
}

/// A plain HTTP GET; empty when the connection fails or closes without an answer.
fn http_get(addr: SocketAddr, path: &str) -> String {
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_secs(2)) else {
        return String::new();
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n");
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

/// An HTTPS GET that trusts any certificate, as the ServiceMonitor's insecureSkipVerify does.
fn https_get(addr: SocketAddr, token: Option<&str>) -> (u16, String) {
    let tls = immortal_operator::kube::tls::client_config(None, true, None, None).unwrap();
    let config = immortal_operator::kube::client::transport::config(None, 0)
        .timeout_global(Some(BOUND))
        .build();
    let agent = immortal_operator::kube::client::transport::agent_with(tls, config);
    let mut req = ureq::http::Request::builder().uri(format!("https://{addr}/metrics"));
    if let Some(t) = token {
        req = req.header("Authorization", format!("Bearer {t}"));
    }
    let mut resp = agent
        .run(req.body(()).unwrap())
        .unwrap_or_else(|e| panic!("GET https://{addr}/metrics: {e}"));
    let body = resp.body_mut().read_to_string().unwrap();
    (resp.status().as_u16(), body)
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

fn reviews(server: &TestServer) -> u64 {
    server
        .request_counts()
        .iter()
        .filter(|((verb, res), _)| verb == "create" && res.ends_with("reviews"))
        .map(|(_, n)| n)
        .sum()
}

#[test]
fn by_default_metrics_are_https_and_only_for_callers_allowed_to_get_them() {
    let server = TestServer::start(Options::default()).unwrap();
    server.add_user(
        "prometheus",
        "reader-token",
        vec![Rule::new(&["get"], &["/metrics"])],
    );
    server.add_user(
        "someone",
        "someone-token",
        vec![Rule::new(&["*"], &["pods"])],
    );
    let op = start(&server, &[]);

    // Plain HTTP to the metrics port gets no metrics.
    assert!(!http_get(op.metrics, "/metrics").contains("workqueue_depth"));
    assert_eq!(https_get(op.metrics, None).0, 401);
    assert_eq!(https_get(op.metrics, Some("not-a-token")).0, 401);
    assert_eq!(https_get(op.metrics, Some("someone-token")).0, 403);
    let (code, body) = https_get(op.metrics, Some("reader-token"));
    assert_eq!(code, 200);
    assert!(
        body.contains("controller_runtime_reconcile_total"),
        "{body}"
    );

    // Scraping again within the cache's lifetime asks the API server nothing more.
    let asked = reviews(&server);
    for _ in 0..3 {
        assert_eq!(https_get(op.metrics, Some("reader-token")).0, 200);
    }
    assert_eq!(reviews(&server), asked);
    // The probes stay plain HTTP, as the kubelet expects.
    assert!(http_get(op.probes, "/healthz").starts_with("HTTP/1.1 200"));
    // A passing test leaves no log behind in the temp directory.
    let log = op.log.clone();
    drop(op);
    assert!(!log.exists(), "{} left behind", log.display());
}

/// The attack: 200 MiB without a newline took the operator from 6 to 213 MiB (its
/// limit is 64 MiB) and kept its thread busy. Against the plain-HTTP port, where the bytes
/// reach the request parser: the sender is cut off, resident memory stays where it was, and
/// /healthz answers throughout.
#[test]
fn a_200_mib_line_is_cut_off_without_growing_memory_while_healthz_answers() {
    let server = TestServer::start(Options::default()).unwrap();
    let op = start(&server, &["--metrics-secure=false"]);
    let pid = op.child.id();
    let before = rss_kib(pid);

    let stop = Arc::new(AtomicBool::new(false));
    let peak = Arc::new(AtomicU64::new(before));
    let sampler = {
        let (stop, peak) = (stop.clone(), peak.clone());
        thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                peak.fetch_max(rss_kib(pid), Ordering::Relaxed);
                thread::sleep(Duration::from_millis(10));
            }
        })
    };
    let prober = {
        let (stop, probes) = (stop.clone(), op.probes);
        thread::spawn(move || {
            let mut answers = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                answers.push(http_get(probes, "/healthz"));
                thread::sleep(Duration::from_millis(50));
            }
            answers
        })
    };

    let mut sent = 0usize;
    let outcome = (|| -> std::io::Result<()> {
        let mut s = TcpStream::connect(op.metrics)?;
        s.set_write_timeout(Some(BOUND))?;
        let chunk = vec![b'A'; 1 << 20];
        while sent < 200 << 20 {
            s.write_all(&chunk)?;
            sent += chunk.len();
        }
        Ok(())
    })();
    // Give the probes a moment after the attack too.
    thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    sampler.join().unwrap();
    let answers = prober.join().unwrap();

    let err = outcome.expect_err("the operator read 200 MiB without hanging up");
    assert!(
        matches!(
            err.kind(),
            std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
        ),
        "{err:?} after {sent} bytes"
    );
    let grown = peak.load(Ordering::Relaxed).saturating_sub(before);
    eprintln!(
        "idle {before} KiB, peak during the attack +{grown} KiB; cut off after {} KiB sent",
        sent / 1024
    );
    // Generous: what a few connection threads cost, nowhere near the 200 MiB of before.
    assert!(grown < 8 * 1024, "resident memory grew by {grown} KiB");
    assert!(!answers.is_empty());
    for a in &answers {
        assert!(a.starts_with("HTTP/1.1 200"), "/healthz answered {a:?}");
    }
    assert!(op.child.id() == pid && rss_kib(pid) > 0);
}
