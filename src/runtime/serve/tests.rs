//! Tests of the probe and metrics server: what it answers, to whom, and what a client may cost it.

use super::*;
use kube_testserver::TestServer;

const READ_BOUND: Duration = Duration::from_secs(10);

/// One HTTP/1.1 GET with `headers`, read to the end (bounded in time).
fn get_with(addr: SocketAddr, path: &str, headers: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(READ_BOUND)).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n{headers}\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

fn get(addr: SocketAddr, path: &str) -> String {
    get_with(addr, path, "")
}

fn localhost() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

#[test]
fn bind_addresses_follow_controller_runtime() {
    assert_eq!(
        parse_bind(":8443").unwrap(),
        Some("[::]:8443".parse().unwrap())
    );
    assert_eq!(
        parse_bind("0.0.0.0:8443").unwrap(),
        Some("0.0.0.0:8443".parse().unwrap())
    );
    assert_eq!(
        parse_bind("127.0.0.1:9").unwrap(),
        Some("127.0.0.1:9".parse().unwrap())
    );
    assert_eq!(parse_bind("0").unwrap(), None);
    assert!(parse_bind("nonsense").is_err());
}

#[test]
fn a_port_alone_answers_on_ipv4_and_ipv6() {
    let addr = parse_bind(":0").unwrap().unwrap();
    let port = spawn_probes(addr, Arc::default()).unwrap().port();
    let v4 = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    assert!(get(v4, "/healthz").starts_with("HTTP/1.1 200"));
    if TcpListener::bind("[::1]:0").is_err() {
        eprintln!("SKIPPED the IPv6 half: this host has no IPv6 loopback");
        return;
    }
    let v6 = SocketAddr::from((Ipv6Addr::LOCALHOST, port));
    assert!(get(v6, "/healthz").starts_with("HTTP/1.1 200"));
}

#[test]
fn heads_are_parsed_for_method_path_and_authorization_only() {
    let r =
        parse_head(b"GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\nauthorization:  Bearer t \r\nX: y")
            .unwrap();
    assert_eq!(
        (r.method, r.path, r.authorization),
        ("GET", "/metrics", Some("Bearer t"))
    );
    let r = parse_head(b"GET /healthz HTTP/1.0").unwrap();
    assert_eq!((r.path, r.authorization), ("/healthz", None));
    for bad in [
        &b"GET /healthz"[..],
        b"GET /a b HTTP/1.1",
        b"\xff\xfe HTTP/1.1",
        b"GET / SPDY/3",
    ] {
        assert!(parse_head(bad).is_none(), "{bad:?}");
    }
    assert_eq!(head_end(b"GET / HTTP/1.1\r\nA: b\r\n\r\nbody", 0), Some(21));
    assert_eq!(head_end(b"GET / HTTP/1.1\n\n", 0), Some(14));
    assert_eq!(head_end(b"GET / HTTP/1.1\r\nA: b\r\n", 0), None);
}

#[test]
fn probes_turn_ready_after_the_first_lists_and_unlive_when_a_thread_dies() {
    let watch = liveness::watch("probe-test-resource", None);
    let health = Arc::new(Health::new(vec![watch], Duration::from_secs(75)));
    let addr = spawn_probes(localhost(), health.clone()).unwrap();
    assert!(get(addr, "/healthz").starts_with("HTTP/1.1 200"));
    let r = get(addr, "/readyz");
    assert!(
        r.starts_with("HTTP/1.1 503")
            && r.contains("not served: probe-test-resource list: not answered yet"),
        "{r}"
    );
    watch.listed();
    watch.heard();
    assert!(get(addr, "/readyz").starts_with("HTTP/1.1 200"));
    health.dead.store(true, Ordering::Relaxed);
    assert!(get(addr, "/healthz").starts_with("HTTP/1.1 503"));
    assert!(get(addr, "/nope").starts_with("HTTP/1.1 404"));
}

#[test]
fn readiness_goes_once_a_watch_has_not_been_live_for_longer_than_the_idle_limit() {
    let r = liveness::watch("readiness-test-resource", None);
    let health = Health::new(vec![r], Duration::from_millis(200));
    r.listed();
    r.opened();
    assert_eq!(health.ready(), Ok(()));
    // The stream ends and cannot be opened again: still ready for one idle limit...
    r.closed();
    thread::sleep(Duration::from_millis(100));
    assert_eq!(health.ready(), Ok(()));
    // ...and not after it.
    thread::sleep(Duration::from_millis(200));
    let e = health.ready().unwrap_err();
    assert!(e.contains("watch not live"), "{e}");
    r.opened();
    assert_eq!(health.ready(), Ok(()));
}

#[test]
fn with_a_watch_per_namespace_readiness_waits_for_every_one_and_names_the_one_down() {
    let r = "readiness-test-namespaces";
    let (a, b) = (liveness::watch(r, Some("a")), liveness::watch(r, Some("b")));
    let health = Health::new(vec![a, b], Duration::from_millis(100));
    a.opened();
    b.opened();
    a.listed();
    // The namespace whose list fails is named, with why, until a list completes.
    b.list_failed("api error 403 Forbidden: pods is forbidden".into());
    let e = health.ready().unwrap_err();
    assert_eq!(
        e,
        format!("namespace b not served: {r} list: api error 403 Forbidden: pods is forbidden")
    );
    b.listed();
    assert_eq!(health.ready(), Ok(()));
    // A served namespace that does not exist is said too.
    crate::util::lock(&health.missing).insert("nc-typo".into());
    assert_eq!(
        health.ready(),
        Err("namespace nc-typo does not exist".into())
    );
    crate::util::lock(&health.missing).clear();
    // One namespace's watch down is enough: its objects would go unseen.
    b.closed();
    thread::sleep(Duration::from_millis(250));
    a.heard();
    let e = health.ready().unwrap_err();
    assert!(
        e.contains(&format!("{r} watch in namespace b not live")),
        "{e}"
    );
}

#[test]
fn plain_metrics_serve_prometheus_text_to_anyone() {
    let addr = spawn_metrics(localhost(), Metrics::Plain, "h".into()).unwrap();
    let r = get(addr, "/metrics");
    assert!(
        r.starts_with("HTTP/1.1 200") && r.contains("workqueue_depth"),
        "{r}"
    );
    assert!(get(addr, "/healthz").starts_with("HTTP/1.1 404"));
}

#[test]
fn a_head_over_8_kib_is_answered_431() {
    let addr = spawn_probes(localhost(), Arc::default()).unwrap();
    let big = format!("X-Filler: {}\r\n", "a".repeat(MAX_HEAD));
    let r = get_with(addr, "/healthz", &big);
    assert!(r.starts_with("HTTP/1.1 431"), "{r}");
    // Just under the limit is still served.
    let fits = format!("X-Filler: {}\r\n", "a".repeat(MAX_HEAD - 100));
    assert!(get_with(addr, "/healthz", &fits).starts_with("HTTP/1.1 200"));
}

/// The attack of the issue: a line that never ends. The server must hang up (a reset or a
/// broken pipe on the sending side) after reading its 8 KiB, not keep reading, and not
/// merely stop reading (which would leave the sender blocked until its own timeout).
#[test]
fn a_line_without_end_is_cut_off_after_8_kib() {
    let addr = spawn_metrics(localhost(), Metrics::Plain, String::new()).unwrap();
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_write_timeout(Some(READ_BOUND)).unwrap();
    let chunk = vec![b'A'; 1 << 20];
    let mut sent = 0usize;
    let err = loop {
        match s.write(&chunk) {
            Ok(n) => sent += n,
            Err(e) => break e,
        }
        assert!(
            sent < 200 << 20,
            "the server took 200 MiB without hanging up"
        );
    };
    assert!(
        matches!(
            err.kind(),
            io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe
        ),
        "{err:?} after {sent} bytes"
    );
    // What the kernel buffers on the way, not what the server read: a few MiB at most.
    assert!(sent < 64 << 20, "{sent}");
}

#[test]
fn a_trickling_client_is_cut_off_at_the_deadline() {
    let addr = spawn_probes(localhost(), Arc::default()).unwrap();
    let mut s = TcpStream::connect(addr).unwrap();
    let started = Instant::now();
    s.write_all(b"GET /healthz HTTP/1.1\r\nX-Slow: ").unwrap();
    let mut writer = s.try_clone().unwrap();
    thread::spawn(move || {
        // A byte every 100 ms, for far longer than the deadline, until the server hangs up.
        for _ in 0..200 {
            if writer.write_all(b"a").is_err() {
                return;
            }
            thread::sleep(Duration::from_millis(100));
        }
    });
    s.set_read_timeout(Some(PROBE_DEADLINE + READ_BOUND))
        .unwrap();
    let mut out = Vec::new();
    let read = s.read_to_end(&mut out);
    let elapsed = started.elapsed();
    // Closed without an answer (EOF, or a reset if a byte was in flight), not timed out on
    // our side.
    assert!(
        read.is_ok() || matches!(&read, Err(e) if e.kind() == io::ErrorKind::ConnectionReset),
        "{read:?}"
    );
    assert!(out.is_empty(), "{}", String::from_utf8_lossy(&out));
    assert!(
        elapsed >= PROBE_DEADLINE - Duration::from_millis(100)
            && elapsed < PROBE_DEADLINE + Duration::from_secs(5),
        "{elapsed:?}"
    );
}

/// Sends a whole request and reads what comes back; empty if the connection was closed
/// unread (a reset included, as the request was already sent).
fn request_once(addr: SocketAddr) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(READ_BOUND)).unwrap();
    let _ = s.write_all(b"GET /healthz HTTP/1.1\r\n\r\n");
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

/// Holds `limit` connections that send nothing, checks one more is closed unread, lets
/// them go and checks requests are served again.
fn connections_beyond(addr: SocketAddr, limit: usize) {
    let idle: Vec<TcpStream> = (0..limit)
        .map(|_| TcpStream::connect(addr).unwrap())
        .collect();
    let r = request_once(addr);
    assert!(r.is_empty(), "{r}");
    // The idle clients leave; their threads end and the slots come back. Until then a
    // request may still be closed unread: ask again.
    drop(idle);
    let deadline = Instant::now() + READ_BOUND;
    loop {
        let r = request_once(addr);
        if r.starts_with("HTTP/1.1 200") {
            break;
        }
        assert!(Instant::now() < deadline, "never served again: {r:?}");
        thread::sleep(Duration::from_millis(20));
    }
}

fn probes_with(limits: Limits) -> SocketAddr {
    let health = Arc::new(Health::default());
    listen(localhost(), "test", limits, move |c| {
        serve_probe(c, &health)
    })
    .unwrap()
}

#[test]
fn connections_beyond_the_per_client_limit_are_closed_unread() {
    connections_beyond(probes_with(Limits::DEFAULT), MAX_PER_PEER);
}

#[test]
fn connections_beyond_the_total_limit_are_closed_unread() {
    // Every test client is 127.0.0.1, so the total is tested with a per-client limit as
    // large as it.
    let limits = Limits {
        total: 5,
        per_peer: 5,
    };
    connections_beyond(probes_with(limits), 5);
}

#[test]
fn slots_are_counted_per_client_address_and_given_back() {
    let open = Arc::new(Open::default());
    let limits = Limits {
        total: 3,
        per_peer: 2,
    };
    let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
    let a1 = open.take(a, limits).unwrap();
    let _a2 = open.take(a, limits).unwrap();
    assert!(open.take(a, limits).is_none());
    // The IPv6 form of the same IPv4 client counts as it.
    assert!(open
        .take("::ffff:10.0.0.1".parse().unwrap(), limits)
        .is_none());
    let _b1 = open.take(b, limits).unwrap();
    assert!(open.take(b, limits).is_none(), "the total is reached");
    drop(a1);
    assert!(open.take(b, limits).is_some());
}

#[test]
fn healthz_answers_while_the_metrics_port_is_flooded() {
    let health = Arc::new(Health::new(vec![], Duration::from_secs(75)));
    let probes = spawn_probes(localhost(), health).unwrap();
    let metrics = spawn_metrics(localhost(), Metrics::Plain, String::new()).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let mut flood = Vec::new();
    // Endless lines, trickles and bare connections, over and over, from 8 clients.
    for i in 0..8 {
        let stop = stop.clone();
        flood.push(thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let Ok(mut s) = TcpStream::connect(metrics) else {
                    continue;
                };
                let _ = s.set_write_timeout(Some(Duration::from_secs(1)));
                let junk = vec![b'A'; if i % 2 == 0 { 1 << 20 } else { 1 }];
                for _ in 0..16 {
                    if stop.load(Ordering::Relaxed) || s.write_all(&junk).is_err() {
                        break;
                    }
                }
            }
        }));
    }
    for _ in 0..20 {
        let r = get(probes, "/healthz");
        assert!(r.starts_with("HTTP/1.1 200"), "{r}");
        thread::sleep(Duration::from_millis(50));
    }
    stop.store(true, Ordering::Relaxed);
    for t in flood {
        t.join().unwrap();
    }
}

/// HTTPS metrics in front of a test API server that knows a reader and a stranger.
fn secure_metrics() -> (TestServer, SocketAddr) {
    let server = crate::testutil::server_with_metrics_reader();
    let client = crate::testutil::client_of(&server.kubeconfig_path());
    let metrics = Metrics::Secure {
        tls: tls::config(None).unwrap(),
        auth: Arc::new(MetricsAuth::new(client)),
    };
    let addr = spawn_metrics(localhost(), metrics, String::new()).unwrap();
    (server, addr)
}

/// GET over HTTPS, trusting any certificate (as the ServiceMonitor's insecureSkipVerify).
fn https_get(addr: SocketAddr, path: &str, token: Option<&str>) -> (u16, String) {
    let config = crate::kube::client::transport::config(None, 0)
        .timeout_global(Some(READ_BOUND))
        .build();
    let agent = crate::kube::client::transport::agent_with(
        crate::kube::tls::client_config(None, true, None, None).unwrap(),
        config,
    );
    let mut req = ureq::http::Request::builder().uri(format!("https://{addr}{path}"));
    if let Some(t) = token {
        req = req.header("Authorization", format!("Bearer {t}"));
    }
    let mut resp = agent
        .run(req.body(()).unwrap())
        .unwrap_or_else(|e| panic!("{e}"));
    let body = resp.body_mut().read_to_string().unwrap();
    (resp.status().as_u16(), body)
}

#[test]
fn secure_metrics_are_served_only_to_callers_allowed_to_get_them() {
    let (_server, addr) = secure_metrics();
    assert_eq!(https_get(addr, "/metrics", None).0, 401);
    assert_eq!(https_get(addr, "/metrics", Some("made-up")).0, 401);
    let (code, body) = https_get(addr, "/metrics", Some("nobody"));
    assert_eq!(
        (code, body.as_str()),
        (403, "Authorization denied for user nobody\n")
    );
    let (code, body) = https_get(addr, "/metrics", Some("reader"));
    assert_eq!(code, 200);
    assert!(body.contains("workqueue_depth"), "{body}");
}

#[test]
fn plain_http_to_the_secure_port_is_closed_without_an_answer() {
    let (_server, addr) = secure_metrics();
    let r = {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(READ_BOUND)).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\n\r\n").unwrap();
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        out
    };
    // At most a TLS alert record (content type 21), never metrics.
    assert!(r.is_empty() || r[0] == 21, "{r:?}");
}
