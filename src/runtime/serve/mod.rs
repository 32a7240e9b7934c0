//! The operator's own small HTTP endpoints: `/metrics` (Prometheus text, over HTTPS for callers
//! the API server vouches for, see [`crate::runtime::serve::auth`]) and the plain-HTTP `/healthz` and
//! `/readyz` probes the Deployment points the kubelet at.
//!
//! Any pod in the cluster can connect to both, so nothing a client sends may cost more than a
//! fixed amount, and nothing sent to the metrics port may delay a probe:
//! - each listener has its own accept thread and at most [`MAX_CONNECTIONS`] connection
//!   threads, [`MAX_PER_PEER`] of them for one client address; a connection beyond either is
//!   closed at once, without reading it (so one pod holding its share cannot keep the kubelet,
//!   which probes from the node's address, out);
//! - a request head (request line and headers) may be [`MAX_HEAD`] bytes; a longer one is
//!   answered 431 and the connection closed, so a line without end costs 8 KiB, not memory
//!   without bound (a 200 MiB line took the operator past its 64 MiB limit before);
//! - a whole exchange (TLS handshake, head, the access reviews, the answer) must end by a
//!   deadline fixed when the connection is accepted, so a client trickling a byte at a time
//!   holds its thread no longer than that: [`PROBE_DEADLINE`], [`METRICS_DEADLINE`].
//!
//! One request per connection (`Connection: close`): scrapes and probes are a few per minute,
//! so plain blocking I/O on short-lived threads is all this needs, and costs nothing at idle.

pub mod auth;
pub mod tls;

use crate::kube::client::Client;
use crate::runtime::metrics;
use auth::{MetricsAuth, Verdict};
use rustls::{ServerConfig, ServerConnection, StreamOwned};
use std::io::{self, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// Largest request head read, in bytes. The kubelet's and Prometheus' requests are a few
/// hundred bytes, a bearer token included; Go's net/http allows 1 MiB, nginx 8 KiB per line.
pub const MAX_HEAD: usize = 8 * 1024;

/// Connections served at once per listener: each is a short-lived thread with an 8 KiB
/// buffer, so 8 cost well under 1 MiB even when all are held.
pub const MAX_CONNECTIONS: usize = 8;

/// Connections served at once per client address. The kubelet sends at most two probes at a
/// time (liveness, readiness), and Prometheus one scrape per target.
pub const MAX_PER_PEER: usize = 2;

/// A probe exchange must be over by then: the kubelet gives up after the probe's
/// `timeoutSeconds` (1 s, the default our Deployment keeps) anyway.
pub const PROBE_DEADLINE: Duration = Duration::from_secs(2);

/// A metrics exchange must be over by then, the TokenReview and SubjectAccessReview included:
/// Prometheus' default scrape timeout is 10 s.
pub const METRICS_DEADLINE: Duration = Duration::from_secs(10);

/// After answering 431 the connection is closed only once the client's pending bytes are read
/// (at most this many, for at most [`LINGER_TIME`]): closing a socket with unread data sends a
/// reset, which would make the client lose the answer. Go's net/http does the same.
const LINGER_BYTES: usize = 64 * 1024;
const LINGER_TIME: Duration = Duration::from_millis(250);

/// What the probes report on.
#[derive(Default)]
pub struct Health {
    /// Watchers that completed their first list.
    pub synced: AtomicUsize,
    /// Set when a worker or watcher thread died.
    pub dead: AtomicBool,
    /// Resources watched, one watcher each.
    pub resources: Vec<&'static str>,
    /// The watchers' idle limit (`--watch-idle-timeout`): a watch is live while open and heard
    /// from within it, and one not live for longer than it makes the operator unready.
    pub watch_idle_timeout: Duration,
}

impl Health {
    pub fn new(resources: Vec<&'static str>, watch_idle_timeout: Duration) -> Health {
        Health {
            resources,
            watch_idle_timeout,
            ..Default::default()
        }
    }

    /// Live unless a thread died.
    pub fn live(&self) -> Result<(), String> {
        if self.dead.load(Ordering::Relaxed) {
            return Err("a worker thread died".into());
        }
        Ok(())
    }

    /// Ready once every first list completed, and unless a watch has not been live (open, and
    /// heard from within the idle limit) for longer than the idle limit: a watch that went
    /// silent is given up at the limit, and if it cannot be opened again within one more, the
    /// operator says so. Watches run on a standby replica too, so it is ready as well.
    pub fn ready(&self) -> Result<(), String> {
        self.live()?;
        let (synced, all) = (self.synced.load(Ordering::Relaxed), self.resources.len());
        if synced < all {
            return Err(format!(
                "{synced} of {all} watches have completed their first list"
            ));
        }
        let idle = self.watch_idle_timeout;
        for r in &self.resources {
            match metrics::watch_down_for(r, idle) {
                Some(d) if d > idle => {
                    return Err(format!("{r} watch not live for {}s", d.as_secs()))
                }
                _ => {}
            }
        }
        Ok(())
    }
}

/// Parses a bind address as controller-runtime takes it: `:8443` means every interface,
/// `0` disables the endpoint.
pub fn parse_bind(s: &str) -> Result<Option<SocketAddr>, String> {
    if s == "0" || s.is_empty() {
        return Ok(None);
    }
    let full = if s.starts_with(':') {
        format!("0.0.0.0{s}")
    } else {
        s.to_string()
    };
    full.parse()
        .map(Some)
        .map_err(|_| format!("invalid bind address {s:?} (want HOST:PORT, :PORT or 0)"))
}

/// Where and how to serve, from the flags.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// `--metrics-bind-address`; `None` serves no metrics.
    pub metrics: Option<SocketAddr>,
    /// `--health-probe-bind-address`; `None` serves no probes.
    pub probes: Option<SocketAddr>,
    /// `--metrics-secure`: HTTPS with TokenReview/SubjectAccessReview, or plain HTTP to anyone.
    pub secure: bool,
    /// `--metrics-cert-path`: a directory with `tls.crt` and `tls.key`; `None`: self-signed.
    pub cert_dir: Option<PathBuf>,
}

/// How `/metrics` is served.
pub enum Metrics {
    /// Plain HTTP to anyone (`--metrics-secure=false`, for local runs).
    Plain,
    /// HTTPS, to callers `auth` allows.
    Secure {
        tls: Arc<ServerConfig>,
        auth: Arc<MetricsAuth>,
    },
}

/// Starts what `settings` asks for. An error (a port taken, an unusable certificate) is for
/// the user to see at start.
pub fn start(
    settings: &Settings,
    health: Arc<Health>,
    host: String,
    client: &Client,
) -> Result<(), String> {
    if let Some(addr) = settings.probes {
        let local = spawn_probes(addr, health)
            .map_err(|e| format!("cannot serve probes on {addr}: {e}"))?;
        log::info!(target: "controller", address = local.to_string().as_str(); "serving probes");
    }
    if let Some(addr) = settings.metrics {
        let metrics = if settings.secure {
            let tls = tls::config(settings.cert_dir.as_deref())
                .map_err(|e| format!("cannot serve metrics over HTTPS: {e}"))?;
            Metrics::Secure {
                tls,
                auth: Arc::new(MetricsAuth::new(client.clone())),
            }
        } else {
            Metrics::Plain
        };
        let local = spawn_metrics(addr, metrics, host)
            .map_err(|e| format!("cannot serve metrics on {addr}: {e}"))?;
        let scheme = match (settings.secure, &settings.cert_dir) {
            (false, _) => "http",
            (true, None) => "https (self-signed certificate)",
            (true, Some(_)) => "https (mounted certificate)",
        };
        log::info!(target: "controller", address = local.to_string().as_str(), scheme = scheme; "serving metrics");
    }
    Ok(())
}

/// Binds `addr` and serves `/healthz`, `/livez` and `/readyz` there on threads of its own.
pub fn spawn_probes(addr: SocketAddr, health: Arc<Health>) -> io::Result<SocketAddr> {
    listen(addr, "probes", Limits::DEFAULT, move |conn| {
        serve_probe(conn, &health)
    })
}

/// Binds `addr` and serves `/metrics` there on threads of its own.
pub fn spawn_metrics(addr: SocketAddr, metrics: Metrics, host: String) -> io::Result<SocketAddr> {
    listen(addr, "metrics", Limits::DEFAULT, move |conn| {
        serve_metrics(conn, &metrics, &host)
    })
}

/// How many connections a listener serves at once, in all and per client address.
#[derive(Clone, Copy)]
struct Limits {
    total: usize,
    per_peer: usize,
}

impl Limits {
    const DEFAULT: Limits = Limits {
        total: MAX_CONNECTIONS,
        per_peer: MAX_PER_PEER,
    };
}

/// Binds `addr`; an accept thread hands each connection to `serve` on a thread of its own,
/// within `limits`, and closes the rest at once.
fn listen(
    addr: SocketAddr,
    name: &'static str,
    limits: Limits,
    serve: impl Fn(TcpStream) + Send + Sync + 'static,
) -> io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr)?;
    let local = listener.local_addr()?;
    let serve = Arc::new(serve);
    let open = Arc::new(Open::default());
    thread::Builder::new()
        .name(format!("http-{name}"))
        .spawn(move || {
            for conn in listener.incoming() {
                let conn = match conn {
                    Ok(c) => c,
                    Err(e) => {
                        // Out of file descriptors, or a connection reset before it was accepted:
                        // pause instead of spinning on an error that repeats at once.
                        log::debug!(target: "serve", endpoint = name, error = e.to_string().as_str(); "accept failed");
                        thread::sleep(Duration::from_millis(50));
                        continue;
                    }
                };
                let Some(slot) = conn.peer_addr().ok().and_then(|p| open.take(p.ip(), limits))
                else {
                    log::debug!(target: "serve", endpoint = name; "connection limit reached; closing a new connection");
                    continue; // dropping `conn` closes it
                };
                let serve = serve.clone();
                // If the thread cannot start, the closure is dropped: the slot is given back
                // and the connection closed.
                let _ = thread::Builder::new()
                    .name(format!("{name}-conn"))
                    .spawn(move || {
                        let _slot = slot;
                        serve(conn)
                    });
            }
        })?;
    Ok(local)
}

/// The client addresses of a listener's open connections, one entry each.
#[derive(Default)]
struct Open(Mutex<Vec<IpAddr>>);

impl Open {
    /// A slot for a connection from `peer`, if `limits` leave one.
    fn take(self: &Arc<Self>, peer: IpAddr, limits: Limits) -> Option<Slot> {
        // An IPv4 client of a dual-stack listener shows as ::ffff:a.b.c.d: the same client.
        let peer = peer.to_canonical();
        let mut open = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if open.len() >= limits.total
            || open.iter().filter(|p| **p == peer).count() >= limits.per_peer
        {
            return None;
        }
        open.push(peer);
        Some(Slot {
            open: self.clone(),
            peer,
        })
    }
}

/// One of a listener's connection slots, given back when dropped.
struct Slot {
    open: Arc<Open>,
    peer: IpAddr,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self.open.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = open.iter().position(|p| *p == self.peer) {
            open.swap_remove(i);
        }
    }
}

/// A connection whose every read and write must end by `deadline`: each one waits at most for
/// what is left, so a client trickling bytes cannot stretch the exchange past it.
struct Timed {
    tcp: TcpStream,
    deadline: Instant,
}

impl Timed {
    fn left(&self) -> io::Result<Duration> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::ErrorKind::TimedOut.into());
        }
        Ok(left)
    }
}

impl Read for Timed {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.left()?;
        self.tcp.set_read_timeout(Some(left))?;
        self.tcp.read(buf)
    }
}

impl Write for Timed {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let left = self.left()?;
        self.tcp.set_write_timeout(Some(left))?;
        self.tcp.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.tcp.flush()
    }
}

fn serve_probe(tcp: TcpStream, health: &Health) {
    let deadline = Instant::now() + PROBE_DEADLINE;
    let mut conn = Timed { tcp, deadline };
    let answered = exchange(&mut conn, |req| match req.path {
        "/healthz" | "/livez" => verdict(health.live()),
        "/readyz" => verdict(health.ready()),
        _ => Response::text(404, "not found\n"),
    });
    if answered == Some(431) {
        linger(&conn.tcp, deadline);
    }
}

fn serve_metrics(tcp: TcpStream, metrics: &Metrics, host: &str) {
    let deadline = Instant::now() + METRICS_DEADLINE;
    let conn = Timed { tcp, deadline };
    let (answered, tcp) = match metrics {
        Metrics::Plain => {
            let mut conn = conn;
            let answered = exchange(&mut conn, |req| metrics_response(req, None, host, deadline));
            (answered, conn.tcp)
        }
        Metrics::Secure { tls, auth } => {
            let Ok(server) = ServerConnection::new(tls.clone()) else {
                return;
            };
            // The handshake happens on the first read, within the deadline like the rest.
            let mut tls = StreamOwned::new(server, conn);
            let answered = exchange(&mut tls, |req| {
                metrics_response(req, Some(auth), host, deadline)
            });
            if answered.is_some() {
                tls.conn.send_close_notify();
                let _ = tls.flush();
            }
            (answered, tls.sock.tcp)
        }
    };
    if answered == Some(431) {
        linger(&tcp, deadline);
    }
}

fn metrics_response(
    req: &Request,
    auth: Option<&MetricsAuth>,
    host: &str,
    deadline: Instant,
) -> Response {
    if req.path != auth::PATH {
        return Response::text(404, "not found\n");
    }
    if req.method != "GET" {
        return Response::text(405, "method not allowed\n");
    }
    if let Some(auth) = auth {
        // Refusals are logged at debug only: anyone can send them, as often as they like.
        match auth.check(req.authorization, deadline) {
            Ok(Verdict::Allowed { user }) => {
                log::debug!(target: "serve", user = user.as_str(); "metrics scrape allowed");
            }
            Ok(Verdict::Unauthenticated) => {
                log::debug!(target: "serve", result = "unauthenticated"; "metrics scrape refused");
                return Response::text(401, "Unauthorized\n");
            }
            Ok(Verdict::Forbidden { user }) => {
                log::debug!(target: "serve", user = user.as_str(), result = "forbidden"; "metrics scrape refused");
                return Response::text(403, &format!("Authorization denied for user {user}\n"));
            }
            Err(e) => {
                let error = e.to_string();
                if e.is_denied() {
                    // Nothing will change until someone grants the operator the reviews.
                    log::warn!(
                        target: "serve", error = error.as_str();
                        "cannot check who may read /metrics: the operator needs create on tokenreviews and subjectaccessreviews (config/rbac/metrics_auth_role.yaml)"
                    );
                } else {
                    log::info!(target: "serve", error = error.as_str(); "cannot check who may read /metrics");
                }
                return Response::text(500, "Authorization check failed\n");
            }
        }
    }
    Response {
        code: 200,
        content_type: "text/plain; version=0.0.4; charset=utf-8",
        body: metrics::render(host),
    }
}

fn verdict(r: Result<(), String>) -> Response {
    match r {
        Ok(()) => Response::text(200, "ok\n"),
        Err(e) => Response::text(503, &format!("{e}\n")),
    }
}

/// What a handler needs of a request head.
struct Request<'a> {
    method: &'a str,
    /// Without the query.
    path: &'a str,
    /// The `Authorization` header's value.
    authorization: Option<&'a str>,
}

struct Response {
    code: u16,
    content_type: &'static str,
    body: String,
}

impl Response {
    fn text(code: u16, body: &str) -> Response {
        Response {
            code,
            content_type: "text/plain; charset=utf-8",
            body: body.to_string(),
        }
    }

    /// Head and body in one write: one TLS record, one TCP segment for the small answers.
    fn write_to(&self, w: &mut impl Write) -> io::Result<()> {
        let reason = match self.code {
            200 => "OK",
            400 => "Bad Request",
            401 => "Unauthorized",
            403 => "Forbidden",
            404 => "Not Found",
            405 => "Method Not Allowed",
            431 => "Request Header Fields Too Large",
            500 => "Internal Server Error",
            _ => "Service Unavailable",
        };
        let mut out = format!(
            "HTTP/1.1 {} {reason}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            self.code,
            self.content_type,
            self.body.len()
        )
        .into_bytes();
        out.extend_from_slice(self.body.as_bytes());
        w.write_all(&out)?;
        w.flush()
    }
}

/// Reads one request head from `conn` and writes the answer `handle` gives (or 400, 431).
/// Returns the code answered; `None` when the client went away, sent no valid TLS, or ran out
/// of time first, which gets no answer.
fn exchange(
    conn: &mut (impl Read + Write),
    handle: impl FnOnce(&Request) -> Response,
) -> Option<u16> {
    let mut buf = [0u8; MAX_HEAD];
    let response = match read_head(conn, &mut buf) {
        Ok(len) => match parse_head(&buf[..len]) {
            Some(req) => handle(&req),
            None => Response::text(400, "bad request\n"),
        },
        Err(HeadError::TooLarge) => Response::text(431, "request head too large\n"),
        Err(HeadError::Gone) => return None,
    };
    response.write_to(conn).ok()?;
    Some(response.code)
}

#[derive(Debug)]
enum HeadError {
    /// [`MAX_HEAD`] bytes came without the blank line that ends a head.
    TooLarge,
    /// The connection closed, failed (TLS included), or reached its deadline: nothing to answer.
    Gone,
}

/// Reads until the blank line that ends a request head and returns the head's length (without
/// the blank line); anything after it is ignored. Never reads more than [`MAX_HEAD`] bytes.
fn read_head(conn: &mut impl Read, buf: &mut [u8; MAX_HEAD]) -> Result<usize, HeadError> {
    let mut len = 0;
    loop {
        if len == buf.len() {
            return Err(HeadError::TooLarge);
        }
        let n = match conn.read(&mut buf[len..]) {
            Ok(0) => return Err(HeadError::Gone),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return Err(HeadError::Gone),
        };
        // The end may straddle the previous read: look from a little before it.
        let from = len.saturating_sub(2);
        len += n;
        if let Some(end) = head_end(&buf[..len], from) {
            return Ok(end);
        }
    }
}

/// Where the head in `buf` ends: the first line break followed by an empty line (`\r\n\r\n`,
/// or bare `\n\n`, which HTTP/1.1 parsers accept), searching from `from`.
fn head_end(buf: &[u8], from: usize) -> Option<usize> {
    (from..buf.len()).find(|&i| {
        buf[i] == b'\n' && (buf[i + 1..].starts_with(b"\n") || buf[i + 1..].starts_with(b"\r\n"))
    })
}

/// The request line and the one header we read. `None` for a head that is not HTTP.
fn parse_head(head: &[u8]) -> Option<Request<'_>> {
    let head = std::str::from_utf8(head).ok()?;
    let mut lines = head.lines();
    let mut parts = lines.next()?.split(' ');
    let (method, target, version) = (parts.next()?, parts.next()?, parts.next()?);
    if !version.starts_with("HTTP/1.") || parts.next().is_some() {
        return None;
    }
    let path = target.split('?').next().unwrap_or(target);
    let authorization = lines.find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.eq_ignore_ascii_case("authorization")
            .then(|| value.trim())
    });
    Some(Request {
        method,
        path,
        authorization,
    })
}

/// Stops sending, then reads and drops what the client still sends (bounded in bytes and time)
/// so that closing does not reset the connection before the client read the answer.
fn linger(tcp: &TcpStream, deadline: Instant) {
    let _ = tcp.shutdown(Shutdown::Write);
    let until = deadline.min(Instant::now() + LINGER_TIME);
    let mut tcp = Timed {
        tcp: match tcp.try_clone() {
            Ok(t) => t,
            Err(_) => return,
        },
        deadline: until,
    };
    let mut sink = [0u8; 4096];
    let mut drained = 0;
    while drained < LINGER_BYTES {
        match tcp.read(&mut sink) {
            Ok(0) | Err(_) => return,
            Ok(n) => drained += n,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube_testserver::{Options, Rule, TestServer};

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
    fn heads_are_parsed_for_method_path_and_authorization_only() {
        let r = parse_head(
            b"GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\nauthorization:  Bearer t \r\nX: y",
        )
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
        let health = Arc::new(Health::new(
            vec!["probe-test-resource"],
            Duration::from_secs(75),
        ));
        let addr = spawn_probes(localhost(), health.clone()).unwrap();
        assert!(get(addr, "/healthz").starts_with("HTTP/1.1 200"));
        let r = get(addr, "/readyz");
        assert!(
            r.starts_with("HTTP/1.1 503") && r.contains("0 of 1 watches"),
            "{r}"
        );
        health.synced.fetch_add(1, Ordering::Relaxed);
        metrics::watch_heard("probe-test-resource");
        assert!(get(addr, "/readyz").starts_with("HTTP/1.1 200"));
        health.dead.store(true, Ordering::Relaxed);
        assert!(get(addr, "/healthz").starts_with("HTTP/1.1 503"));
        assert!(get(addr, "/nope").starts_with("HTTP/1.1 404"));
    }

    #[test]
    fn readiness_goes_once_a_watch_has_not_been_live_for_longer_than_the_idle_limit() {
        let r = "readiness-test-resource";
        let health = Health::new(vec![r], Duration::from_millis(200));
        health.synced.fetch_add(1, Ordering::Relaxed);
        metrics::watch_opened(r);
        assert_eq!(health.ready(), Ok(()));
        // The stream ends and cannot be opened again: still ready for one idle limit...
        metrics::watch_closed(r);
        thread::sleep(Duration::from_millis(100));
        assert_eq!(health.ready(), Ok(()));
        // ...and not after it.
        thread::sleep(Duration::from_millis(200));
        let e = health.ready().unwrap_err();
        assert!(e.contains("watch not live"), "{e}");
        metrics::watch_opened(r);
        assert_eq!(health.ready(), Ok(()));
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
        let server = TestServer::start(Options::default()).unwrap();
        server.add_user(
            "prometheus",
            "reader",
            vec![Rule::new(&["get"], &["/metrics"])],
        );
        server.add_user("nobody", "nobody", vec![]);
        let opts = crate::kube::config::LoadOptions {
            kubeconfig: Some(server.kubeconfig_path()),
            context: None,
        };
        let client = Client::new(crate::kube::config::load(&opts).unwrap(), 2).unwrap();
        let metrics = Metrics::Secure {
            tls: tls::config(None).unwrap(),
            auth: Arc::new(MetricsAuth::new(client)),
        };
        let addr = spawn_metrics(localhost(), metrics, String::new()).unwrap();
        (server, addr)
    }

    /// GET over HTTPS, trusting any certificate (as the ServiceMonitor's insecureSkipVerify).
    fn https_get(addr: SocketAddr, path: &str, token: Option<&str>) -> (u16, String) {
        let agent = ureq::AgentBuilder::new()
            .tls_config(crate::kube::tls::client_config(None, true, None, None).unwrap())
            .timeout(READ_BOUND)
            .build();
        let mut req = agent.get(&format!("https://{addr}{path}"));
        if let Some(t) = token {
            req = req.set("Authorization", &format!("Bearer {t}"));
        }
        match req.call() {
            Ok(r) => (r.status(), r.into_string().unwrap()),
            Err(ureq::Error::Status(code, r)) => (code, r.into_string().unwrap()),
            Err(e) => panic!("{e}"),
        }
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
}
