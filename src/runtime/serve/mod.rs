//! The operator's own small HTTP endpoints: `/metrics` (Prometheus text, over HTTPS for callers
//! the API server vouches for, see [`auth`]) and the plain-HTTP `/healthz` and `/readyz` probes.
//!
//! Any pod in the cluster can connect to both, so nothing a client sends may cost more than a
//! fixed amount, and nothing sent to the metrics port may delay a probe: each listener caps its
//! connections, in all and per client, on threads of its own, bounds the request head, and ends
//! every exchange by a deadline fixed at accept (docs/operating.md, "Metrics and probes").
//!
//! Hand-written because no crate weighed keeps those limits: `tiny_http` (no connection caps, no
//! exchange deadline), `hyper`, `axum` and `actix-web` (an async runtime, which the design omits).

pub mod auth;
pub mod tls;

use crate::kube::client::Client;
use crate::runtime::{liveness, metrics};
use auth::{MetricsAuth, Verdict};
use rustls::{ServerConfig, ServerConnection, StreamOwned};
use std::collections::BTreeSet;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// Largest request head read, in bytes: far more than the kubelet's or Prometheus'.
pub const MAX_HEAD: usize = 8 * 1024;
/// Connections served at once per listener, each a thread with a head buffer.
pub const MAX_CONNECTIONS: usize = 8;
/// Connections served at once per client address: the kubelet's liveness and readiness probes.
pub const MAX_PER_PEER: usize = 2;
/// Longer than the probe's `timeoutSeconds`, after which the kubelet gives up anyway.
pub const PROBE_DEADLINE: Duration = Duration::from_secs(2);
/// Prometheus' default scrape timeout; the TokenReview and SubjectAccessReview count in it.
pub const METRICS_DEADLINE: Duration = Duration::from_secs(10);

/// After a 431 the client's pending bytes are read, within bounds, before closing, as Go's
/// net/http does: closing with unread data sends a reset, losing the answer.
const LINGER_BYTES: usize = 64 * 1024;
const LINGER_TIME: Duration = Duration::from_millis(250);

/// What the probes report on.
#[derive(Default)]
pub struct Health {
    /// Set when a worker or watcher thread died.
    pub dead: AtomicBool,
    /// Served namespaces that do not exist (see `operator`), for `/readyz` to name.
    pub missing: Mutex<BTreeSet<String>>,
    /// Every watch, one watcher each: each resource in each served namespace.
    pub watches: Vec<&'static liveness::Watch>,
    /// `--watch-idle-timeout`: a watch not live for longer than it makes the operator unready.
    pub watch_idle_timeout: Duration,
}

impl Health {
    pub fn new(watches: Vec<&'static liveness::Watch>, watch_idle_timeout: Duration) -> Health {
        Health {
            watches,
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

    /// Ready once every watch has listed and every served namespace exists, unless a watch has
    /// not been live for longer than the idle limit; otherwise says why. A standby is ready too.
    pub fn ready(&self) -> Result<(), String> {
        self.live()?;
        let mut why: Vec<String> = self
            .watches
            .iter()
            .filter_map(|w| match (w.namespace, w.unlisted()?) {
                (Some(ns), reason) => Some(format!("namespace {ns} not served: {reason}")),
                (None, reason) => Some(format!("not served: {reason}")),
            })
            .collect();
        for ns in crate::util::lock(&self.missing).iter() {
            why.push(format!("namespace {ns} does not exist"));
        }
        if !why.is_empty() {
            return Err(why.join("; "));
        }
        let idle = self.watch_idle_timeout;
        for w in &self.watches {
            if let Some(d) = w.down_for(idle).filter(|d| *d > idle) {
                return Err(format!("{w} not live for {}s", d.as_secs()));
            }
        }
        Ok(())
    }
}

/// Parses a bind address as controller-runtime does: `:8443` is every interface, `0` is off.
pub fn parse_bind(s: &str) -> Result<Option<SocketAddr>, String> {
    if s == "0" || s.is_empty() {
        return Ok(None);
    }
    let full = s
        .strip_prefix(':')
        .map_or(s.to_string(), |port| format!("[::]:{port}"));
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

/// Starts what `settings` asks for; an error (a port taken, a bad certificate) ends the start.
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

/// Binds `addr` as Go's `net.Listen` does: `[::]`, and `0.0.0.0` where free or without IPv6.
fn bind(addr: SocketAddr) -> io::Result<Vec<TcpListener>> {
    use io::ErrorKind::{AddrInUse, PermissionDenied};
    let any4 = |port| TcpListener::bind(SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), port));
    if addr.ip() != IpAddr::V6(Ipv6Addr::UNSPECIFIED) {
        return Ok(vec![TcpListener::bind(addr)?]);
    }
    let v6 = match TcpListener::bind(addr) {
        Ok(l) => l,
        Err(e) if !matches!(e.kind(), AddrInUse | PermissionDenied) => {
            return Ok(vec![any4(addr.port())?])
        }
        Err(e) => return Err(e),
    };
    // Taken by the dual-stack socket itself (AddrInUse) on an ordinary host.
    let v4 = any4(v6.local_addr()?.port()).ok();
    Ok(std::iter::once(v6).chain(v4).collect())
}

/// Binds `addr`; a thread per socket hands each connection within `limits` to one of its own.
fn listen(
    addr: SocketAddr,
    name: &'static str,
    limits: Limits,
    serve: impl Fn(TcpStream) + Send + Sync + 'static,
) -> io::Result<SocketAddr> {
    let listeners = bind(addr)?;
    let local = listeners[0].local_addr()?;
    let serve = Arc::new(serve);
    let open = Arc::new(Open::default());
    for listener in listeners {
        let (serve, open) = (serve.clone(), open.clone());
        thread::Builder::new()
            .name(format!("http-{name}"))
            .spawn(move || {
                for conn in listener.incoming() {
                    let conn = match conn {
                        Ok(c) => c,
                        Err(e) => {
                            // Out of file descriptors, say: pause rather than spin.
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
                    // If the thread cannot start, dropping the closure frees slot and connection.
                    let _ = thread::Builder::new()
                        .name(format!("{name}-conn"))
                        .spawn(move || {
                            let _slot = slot;
                            serve(conn)
                        });
                }
            })?;
    }
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

/// A connection whose every read and write ends by `deadline`, however slowly a client sends.
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
        self.tcp.set_read_timeout(Some(self.left()?))?;
        self.tcp.read(buf)
    }
}

impl Write for Timed {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.tcp.set_write_timeout(Some(self.left()?))?;
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
    let mut conn = Timed { tcp, deadline };
    let (answered, tcp) = match metrics {
        Metrics::Plain => {
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
    // Refusals are logged at debug only: anyone can send them, as often as they like.
    match auth.map(|auth| auth.check(req.authorization, deadline)) {
        None => {}
        Some(Ok(Verdict::Allowed { user })) => {
            log::debug!(target: "serve", user = user.as_str(); "metrics scrape allowed");
        }
        Some(Ok(Verdict::Unauthenticated)) => {
            log::debug!(target: "serve", result = "unauthenticated"; "metrics scrape refused");
            return Response::text(401, "Unauthorized\n");
        }
        Some(Ok(Verdict::Forbidden { user })) => {
            log::debug!(target: "serve", user = user.as_str(), result = "forbidden"; "metrics scrape refused");
            return Response::text(403, &format!("Authorization denied for user {user}\n"));
        }
        Some(Err(e)) => {
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
        let reason = ureq::http::StatusCode::from_u16(self.code)
            .ok()
            .and_then(|c| c.canonical_reason())
            .unwrap_or_default();
        let (code, content_type, body, len) =
            (self.code, self.content_type, &self.body, self.body.len());
        let out = format!("HTTP/1.1 {code} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n{body}");
        w.write_all(out.as_bytes())?;
        w.flush()
    }
}

/// Reads one request head, writes the answer `handle` gives (or 400, 431) and returns its code.
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

/// Reads up to the blank line that ends a request head, at most [`MAX_HEAD`] bytes; its length.
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

/// Where the head in `buf` ends (`\r\n\r\n`, or `\n\n` as HTTP/1.1 parsers accept), from `from`.
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

/// Stops sending, then drops what the client still sends, lest closing reset the unread answer.
fn linger(tcp: &TcpStream, deadline: Instant) {
    let _ = tcp.shutdown(Shutdown::Write);
    let Ok(tcp) = tcp.try_clone() else { return };
    let deadline = deadline.min(Instant::now() + LINGER_TIME);
    let mut tcp = Timed { tcp, deadline };
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
mod tests;
