//! Typed client for the Kubernetes REST calls the operator makes: retries of 429/503 and of a
//! 401 once with fresh credentials, every non-2xx an [`Error::Api`]. No header is ever logged.

use crate::kube::config::{ClusterConfig, ConfigError};
use crate::kube::fence::Fence;
use crate::kube::types::{Pod, Status};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::fmt;
use std::io::{BufRead, BufReader, Read};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

mod error;
mod request;
pub mod transport;
mod verbs;

pub use error::Error;
pub use request::*;
pub use verbs::CreatedPod;

/// Deadline for an ordinary (non-watch) request, connect to last byte. client-go has no default,
/// but a reconcile blocked on a dead connection would stall every key behind it.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a watch may outlive its own `timeoutSeconds` (at which the server ends it).
pub const WATCH_GRACE: Duration = Duration::from_secs(30);
const JSON: &str = "application/json";
const USER_AGENT: &str = concat!("immortal-operator/", env!("CARGO_PKG_VERSION"));
/// What a metadata-only list accepts: `PartialObjectMetadataList`, else whole objects.
const METADATA_LIST: &str =
    "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json";

/// Attempts for a request answered 429 or 503 (the first try included).
const THROTTLE_ATTEMPTS: u32 = 4;
/// Longest we honour a `Retry-After` before giving the error back to the caller's own backoff.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(10);
/// Distinct `Warning` texts logged at WARN, at most, however many objects they name.
const WARNED_AT_MOST: usize = 256;

/// Told of every request sent (each attempt of a retried one): its method and status (0: none).
pub type RequestHook = fn(method: &'static str, code: u16);

/// The HTTP client every thread shares. Cheap to clone: all state is behind `Arc`s.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
    until: Option<Instant>,
    fence: Option<Arc<Fence>>,
    pooled: bool,
    on_request: RequestHook,
}

/// Shows the configuration and the agent, neither with a token or a proxy's password.
impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let agent = self.inner.agent.read().unwrap_or_else(|p| p.into_inner());
        f.debug_struct("Client")
            .field("config", &self.inner.config)
            .field("agent", &agent.1)
            .field("pooled", &self.pooled)
            .finish_non_exhaustive()
    }
}

struct Inner {
    config: ClusterConfig,
    agent: RwLock<(Arc<rustls::ClientConfig>, ureq::Agent)>,
    max_idle_per_host: usize,
    warned: Mutex<HashSet<String>>,
}

/// An agent that keeps up to `pool` idle connections, through the cluster's proxy if any.
fn build_agent(config: &ClusterConfig, tls: Arc<rustls::ClientConfig>, pool: usize) -> ureq::Agent {
    let proxy = config.proxy.as_ref().map(|p| p.ureq.clone());
    transport::agent_with(tls, transport::config(proxy, pool).build())
}

struct Req<'a> {
    method: &'static str,
    path: &'a str,
    /// The `Accept` header: [`JSON`] but for metadata-only lists.
    accept: &'static str,
    body: Option<(&'static str, &'a [u8])>,
    timeout: Duration,
    /// A watch: no overall timeout, but every read and write waits at most this long.
    idle: Option<Duration>,
}

impl<'a> Req<'a> {
    /// An ordinary request: JSON answer, within [`REQUEST_TIMEOUT`].
    fn new(method: &'static str, path: &'a str, body: Option<(&'static str, &'a [u8])>) -> Self {
        Req {
            method,
            path,
            accept: JSON,
            body,
            timeout: REQUEST_TIMEOUT,
            idle: None,
        }
    }

    fn no_time_left(&self) -> String {
        let (method, path) = (self.method, self.path);
        format!("{method} {path}: no time left before the deadline; not sent")
    }
}

impl Client {
    /// A client over `config`, keeping an idle connection for each of `connections` at once.
    pub fn new(config: ClusterConfig, connections: usize) -> Result<Client, ConfigError> {
        let tls = config.tls_config()?;
        let max_idle_per_host = connections.max(2);
        let agent = build_agent(&config, tls.clone(), max_idle_per_host);
        Ok(Client {
            inner: Arc::new(Inner {
                config,
                agent: RwLock::new((tls, agent)),
                max_idle_per_host,
                warned: Mutex::default(),
            }),
            until: None,
            fence: None,
            pooled: true,
            on_request: |_, _| {},
        })
    }

    /// The same client, and those made from it, reporting every request to `hook`.
    pub fn reporting(&self, hook: RequestHook) -> Client {
        Client {
            on_request: hook,
            ..self.clone()
        }
    }

    /// The same client, but every request ends by `deadline` and a 429/503 is returned at once:
    /// for callers whose answer is worthless later (leader election, within its renew deadline).
    pub fn until(&self, deadline: Instant) -> Client {
        Client {
            until: Some(deadline),
            ..self.clone()
        }
    }

    /// The same client, but a write (not a GET) runs only while `fence` is open.
    pub fn fenced(&self, fence: Arc<Fence>) -> Client {
        Client {
            fence: Some(fence),
            ..self.clone()
        }
    }

    /// The same client, but each request on a connection of its own: for requests minutes apart.
    pub fn unpooled(&self) -> Client {
        Client {
            pooled: false,
            ..self.clone()
        }
    }

    fn cut(&self, deadline: Instant) -> Instant {
        self.until.map_or(deadline, |until| deadline.min(until))
    }

    /// When `req` must end: its timeout, cut to [`Client::until`] and, for a write, the fence.
    fn deadline(&self, req: &Req) -> Result<Instant, Error> {
        let now = Instant::now();
        let mut deadline = self.cut(now + req.timeout);
        if let (Some(fence), true) = (&self.fence, req.method != "GET") {
            deadline = deadline.min(fence.deadline().ok_or(Error::Fenced)?);
        }
        if deadline <= now {
            return Err(Error::Transport(req.no_time_left()));
        }
        Ok(deadline)
    }

    /// Drops every pooled connection of this client and of those made from it, for when one
    /// was found dead: see "A dead connection takes the pool with it" in docs/design.md.
    pub fn forget_connections(&self) {
        let mut cur = self.inner.agent.write().unwrap_or_else(|p| p.into_inner());
        cur.1 = self.pooled_agent(cur.0.clone());
        log::debug!(target: "client", server = self.inner.config.server.as_str(); "dropped every pooled connection");
    }

    pub fn config(&self) -> &ClusterConfig {
        &self.inner.config
    }

    fn pooled_agent(&self, tls: Arc<rustls::ClientConfig>) -> ureq::Agent {
        build_agent(&self.inner.config, tls, self.inner.max_idle_per_host)
    }

    /// The pooled agent, rebuilt for an exec plugin's new client certificate; else one's own.
    fn agent(&self) -> Result<ureq::Agent, Error> {
        let tls = self.inner.config.tls_config().map_err(Error::Credentials)?;
        if !self.pooled {
            return Ok(build_agent(&self.inner.config, tls, 0));
        }
        let cur = self.inner.agent.read().unwrap_or_else(|p| p.into_inner());
        if Arc::ptr_eq(&cur.0, &tls) {
            return Ok(cur.1.clone());
        }
        drop(cur);
        let agent = self.pooled_agent(tls.clone());
        *self.inner.agent.write().unwrap_or_else(|p| p.into_inner()) = (tls, agent.clone());
        Ok(agent)
    }

    /// Sends one request, retrying as the module says; reports each attempt to the hook.
    fn send(&self, req: &Req) -> Result<Response, Error> {
        let mut refreshed = false;
        let mut attempt = 0;
        loop {
            attempt += 1;
            // Counted in flight before the fence is read: a release that closes the fence and
            // then finds no write in flight cannot have missed one about to be sent.
            let in_flight = match &self.fence {
                Some(f) if req.method != "GET" => Some(f.write_started()),
                _ => None,
            };
            let deadline = self.deadline(req)?;
            let started = Instant::now();
            let result = self.send_once(req, deadline);
            drop(in_flight);
            let code = result.as_ref().map_or(0, |r| r.status().as_u16());
            (self.on_request)(req.method, code);
            if let Ok(resp) = &result {
                self.note_warnings(req, resp);
            }
            log::trace!(
                target: "client",
                method = req.method, path = req.path, code = code,
                elapsed_ms = started.elapsed().as_millis() as u64;
                "request"
            );
            let mut resp = match result {
                Ok(resp) if code < 400 => return Ok(resp),
                Ok(resp) => resp,
                Err(e) => {
                    if let Some(e) = tls_failure(&e) {
                        return Err(Error::Tls(e));
                    }
                    if timed_out(&e) {
                        self.forget_connections();
                    }
                    return Err(self.no_answer(req, &e, started.elapsed()));
                }
            };
            let retry = resp.headers().get("Retry-After");
            let wait = retry_after(retry.and_then(|v| v.to_str().ok()));
            // An error's body is a Status, never large.
            let body = resp
                .body_mut()
                .with_config()
                .limit(1 << 20)
                .read_to_string();
            let body = body.unwrap_or_default();
            let attempts = self.until.map_or(THROTTLE_ATTEMPTS, |_| 1);
            match after_failure(code, attempt, attempts, refreshed, wait) {
                Again::Refreshed => {
                    refreshed = true;
                    self.inner.config.credentials.invalidate();
                }
                Again::After(wait) => {
                    log::debug!(
                        target: "client",
                        method = req.method, path = req.path, code = code,
                        retry_after_ms = wait.as_millis() as u64;
                        "throttled, retrying"
                    );
                    std::thread::sleep(wait);
                }
                Again::No => {
                    let mut status = parse_status(code, &body);
                    status.warnings = warnings(&resp);
                    // Whoever retries later must not come back sooner than the server asked.
                    if let Some(w) = wait {
                        let details = status.details.get_or_insert_with(Default::default);
                        details.retry_after_seconds.get_or_insert(w.as_secs());
                    }
                    return Err(Error::Api(Box::new(status)));
                }
            }
        }
    }

    /// Logs each `Warning` text once at WARN, as client-go's handler can, then at DEBUG.
    fn note_warnings(&self, req: &Req, resp: &Response) {
        for text in warnings(resp) {
            if self.first_warning(&text) {
                log::warn!(target: "client", method = req.method, path = req.path; "the API server warns: {text}");
            } else {
                log::debug!(target: "client", method = req.method, path = req.path; "the API server warns: {text}");
            }
        }
    }

    /// Whether `text` is new to this client and those made from it, with room to remember it.
    fn first_warning(&self, text: &str) -> bool {
        let mut warned = self.inner.warned.lock().unwrap_or_else(|p| p.into_inner());
        warned.len() < WARNED_AT_MOST && warned.insert(text.to_string())
    }

    /// Why `req` got no answer after `waited`: the proxy's doing when it was, else ureq's words.
    fn no_answer(&self, req: &Req, e: &ureq::Error, waited: Duration) -> Error {
        let url = format!("{}{}", self.inner.config.server, req.path);
        let at = format!("{} {url}", req.method);
        let secs = waited.as_secs_f64().round();
        let proxy = self.inner.config.proxy.as_ref().map(|p| &p.shown);
        let message = match (proxy, e) {
            // ureq says "proxy server responded 407/407", or "proxy server did not respond".
            (Some(shown), ureq::Error::ConnectProxyFailed(m)) => {
                let code = m
                    .split_once("responded ")
                    .and_then(|(_, s)| s.split('/').next());
                match code.and_then(|c| c.parse::<u16>().ok()) {
                    Some(code) => {
                        let reason = ureq::http::StatusCode::from_u16(code)
                            .ok()
                            .and_then(|c| c.canonical_reason())
                            .unwrap_or_default();
                        let message = format!(
                            "the proxy {shown} answered CONNECT for {url} with {code} {reason}"
                        );
                        return Error::Proxy { status: code, message };
                    }
                    None => format!("the proxy {shown} closed the connection without answering CONNECT for {url}"),
                }
            }
            // With a proxy, the only connection we open is to the proxy; a TLS handshake with
            // the server that goes unanswered is said by our connector, as an io::Error.
            (Some(shown), ureq::Error::Timeout(ureq::Timeout::Connect)) => {
                format!(
                    "the proxy {shown} did not accept our connection or answer CONNECT in {secs} s"
                )
            }
            (Some(shown), ureq::Error::HostNotFound) => format!("cannot resolve the proxy {shown}"),
            (Some(shown), ureq::Error::Io(io))
                if io.kind() == std::io::ErrorKind::ConnectionRefused =>
            {
                format!("cannot connect to the proxy {shown}: {io}")
            }
            _ if timed_out(e) => return Error::Transport(format!("{at}: no answer in {secs} s")),
            _ => return Error::Transport(format!("{at}: {e}")),
        };
        Error::Proxy { status: 0, message }
    }

    #[allow(clippy::result_large_err)] // ureq's own error type; converted at once by `send`.
    fn send_once(&self, req: &Req, deadline: Instant) -> Result<Response, ureq::Error> {
        let url = format!("{}{}", self.inner.config.server, req.path);
        let agent = self.agent().map_err(transport_error)?;
        let mut r = ureq::http::Request::builder()
            .method(req.method)
            .uri(&url)
            .header("Accept", req.accept)
            .header("User-Agent", USER_AGENT);
        let auth = self.inner.config.credentials.authorization();
        if let Some(auth) = auth.map_err(transport_error)? {
            r = r.header("Authorization", &auth);
        }
        // Measured after the credentials, which an exec plugin may have taken a while for.
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(transport_error(req.no_time_left()));
        }
        match req.body {
            Some((ct, body)) => run(&agent, r.header("Content-Type", ct).body(body)?, req, left),
            None => run(&agent, r.body(())?, req, left),
        }
    }

    fn json<T: DeserializeOwned>(&self, req: &Req) -> Result<T, Error> {
        let resp = self.send(req)?;
        let (method, path) = (req.method, req.path);
        // Read whole, then parsed as a slice, which is much cheaper than serde_json's reader;
        // through a reader, as ureq's read_to_vec has a limit a long list page can pass.
        let len = resp.body().content_length().unwrap_or(4096) as usize;
        let mut body = Vec::with_capacity(len.min(1 << 20));
        resp.into_body()
            .into_reader()
            .read_to_end(&mut body)
            .map_err(|e| {
                if is_timeout(&e) {
                    self.forget_connections();
                }
                Error::Transport(format!("{method} {path}: reading the answer: {e}"))
            })?;
        serde_json::from_slice(&body).map_err(|e| Error::Decode(format!("{method} {path}: {e}")))
    }
}

type Response = ureq::http::Response<ureq::Body>;

fn warnings(resp: &Response) -> Vec<String> {
    let values = resp.headers().get_all("Warning").iter();
    values
        .flat_map(|v| warning_texts(&String::from_utf8_lossy(v.as_bytes())))
        .collect()
}

/// Sends `request`: a watch with a limit on every read and write, any other within `left`.
#[allow(clippy::result_large_err)]
fn run(
    agent: &ureq::Agent,
    request: ureq::http::Request<impl ureq::AsSendBody>,
    req: &Req,
    left: Duration,
) -> Result<Response, ureq::Error> {
    let config = agent.configure_request(request);
    let config = match req.idle {
        Some(idle) => config
            .timeout_per_read(Some(idle))
            .timeout_per_write(Some(idle)),
        None => config.timeout_global(Some(left)),
    };
    agent.run(config.build())
}

/// Whether an I/O error is a timeout: the socket's (`WouldBlock` on Unix), or ureq's inside it.
fn is_timeout(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
    ) || e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<ureq::Error>())
        .is_some_and(timed_out)
}

/// Whether the server said nothing for a request's whole timeout (not refused or reset).
pub(super) fn timed_out(e: &ureq::Error) -> bool {
    match e {
        ureq::Error::Timeout(_) => true,
        ureq::Error::Io(io) => is_timeout(io),
        _ => false,
    }
}

/// The TLS error a request failed with, if the handshake failed. It comes inside an
/// `io::Error` (rustls's own way, and ours in `transport`), whose `source` skips it.
fn tls_failure(e: &ureq::Error) -> Option<rustls::Error> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(tls) = err.downcast_ref::<rustls::Error>() {
            return Some(tls.clone());
        }
        cur = match (err.downcast_ref::<std::io::Error>(), err.downcast_ref()) {
            (Some(io), _) => io.get_ref().map(|e| e as _),
            (_, Some(ureq::Error::Io(io))) => Some(io),
            (_, Some(ureq::Error::Rustls(tls))) => return Some(tls.clone()),
            _ => err.source(),
        };
    }
    None
}

fn transport_error(msg: impl fmt::Display) -> ureq::Error {
    ureq::Error::Io(std::io::Error::other(msg.to_string()))
}

#[cfg(test)]
mod tests;
