//! Typed client for the handful of Kubernetes REST calls the operator makes: credentials,
//! retries of 429/503 after `Retry-After` and of a 401 once with fresh credentials, every
//! non-2xx answer an [`Error::Api`] with the server's `Status`. No header is ever logged.

use crate::kube::config::{ClusterConfig, ConfigError};
use crate::kube::fence::Fence;
use crate::kube::types::{Pod, Status};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::io::{BufRead, BufReader, Read};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

mod error;
mod request;
mod tunnel;
mod verbs;

pub use error::Error;
pub use request::*;

/// Deadline for an ordinary (non-watch) request, connect to last byte. client-go has no default,
/// but a reconcile blocked on a dead connection would stall every key behind it.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a watch may outlive its own `timeoutSeconds` (at which the server ends it).
pub const WATCH_GRACE: Duration = Duration::from_secs(30);
const JSON: &str = "application/json";
const USER_AGENT: &str = concat!("immortal-operator/", env!("CARGO_PKG_VERSION"));
/// What a metadata-only list accepts: kube-apiserver's `PartialObjectMetadataList` (only each
/// object's `metadata`), or else whole objects, which read the same to a decoder of `metadata`.
const METADATA_LIST: &str =
    "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json";

/// Attempts for a request answered 429 or 503 (the first try included).
const THROTTLE_ATTEMPTS: u32 = 4;
/// Longest we honour a `Retry-After` before giving the error back to the caller's own backoff.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(10);

/// Told of every request a client sent (each attempt of a retried one): its method and the
/// HTTP status it was answered with (0: no answer at all).
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

struct Inner {
    config: ClusterConfig,
    agent: RwLock<(Arc<rustls::ClientConfig>, ureq::Agent)>,
    max_idle_per_host: usize,
}

/// An agent that keeps up to `pool` idle connections (through a proxy, tunnels) for reuse.
/// With `idle` (a watch, see "The API client" in docs/design.md), every read and write waits
/// at most that long.
fn build_agent(
    config: &ClusterConfig,
    tls: Arc<rustls::ClientConfig>,
    pool: usize,
    idle: Option<Duration>,
) -> ureq::Agent {
    let mut b = ureq::AgentBuilder::new()
        .timeout_connect(Duration::from_secs(10))
        // Kubernetes never redirects API calls; a redirect would strip our Authorization.
        .redirects(0)
        .max_idle_connections_per_host(pool)
        .max_idle_connections(pool);
    if let Some(idle) = idle {
        b = b.timeout_read(idle).timeout_write(idle);
    }
    match &config.proxy {
        Some(p) if config.server.starts_with("https://") => {
            tunnel::through(b, tls, p, &config.server)
        }
        // A plain-http server through a proxy: ureq's own forwarding, unpooled (see `tunnel`).
        Some(p) => b.tls_config(tls).proxy(p.ureq.clone()),
        None => b.tls_config(tls),
    }
    .build()
}

struct Req<'a> {
    method: &'static str,
    path: &'a str,
    /// The `Accept` header: [`JSON`] but for metadata-only lists.
    accept: &'static str,
    body: Option<(&'static str, &'a [u8])>,
    timeout: Duration,
    /// A watch: no overall timeout, but every read waits at most this long.
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
        format!(
            "{} {}: no time left before the deadline; not sent",
            self.method, self.path
        )
    }
}

impl Client {
    /// Builds a client over `config`. `connections` is how many requests may run at once (one
    /// per reconcile worker plus the watchers); that many idle connections are kept for reuse.
    pub fn new(config: ClusterConfig, connections: usize) -> Result<Client, ConfigError> {
        let tls = config.tls_config()?;
        let max_idle_per_host = connections.max(2);
        let agent = build_agent(&config, tls.clone(), max_idle_per_host, None);
        Ok(Client {
            inner: Arc::new(Inner {
                config,
                agent: RwLock::new((tls, agent)),
                max_idle_per_host,
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

    /// The same client, but a write (any method but GET) is sent only while `fence` is open,
    /// with a timeout that ends when the fence closes. Reads are not fenced.
    pub fn fenced(&self, fence: Arc<Fence>) -> Client {
        Client {
            fence: Some(fence),
            ..self.clone()
        }
    }

    /// The same client, but every request on a connection of its own, closed when it ends: for
    /// requests minutes apart, whose pooled connection would sit idle, its TLS buffers resident.
    pub fn unpooled(&self) -> Client {
        Client {
            pooled: false,
            ..self.clone()
        }
    }

    /// `deadline`, or [`Client::until`] if sooner.
    fn cut(&self, deadline: Instant) -> Instant {
        self.until.map_or(deadline, |until| deadline.min(until))
    }

    /// When `req` must end: its own timeout, cut to [`Client::until`] and, for a write, to the
    /// fence. `Err` when the fence refuses the write or no time is left.
    fn deadline(&self, req: &Req) -> Result<Instant, Error> {
        let now = Instant::now();
        let mut deadline = self.cut(now + req.timeout);
        if let (Some(fence), true) = (&self.fence, is_write(req.method)) {
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

    /// The cluster this client talks to (for logs).
    pub fn config(&self) -> &ClusterConfig {
        &self.inner.config
    }

    fn pooled_agent(&self, tls: Arc<rustls::ClientConfig>) -> ureq::Agent {
        build_agent(&self.inner.config, tls, self.inner.max_idle_per_host, None)
    }

    /// With `idle` (a watch) or unpooled, an agent of the request's own; else the pooled one,
    /// rebuilt when an exec plugin handed out a new client certificate.
    fn agent(&self, idle: Option<Duration>) -> Result<ureq::Agent, Error> {
        let tls = self.inner.config.tls_config().map_err(Error::Credentials)?;
        if idle.is_some() || !self.pooled {
            return Ok(build_agent(&self.inner.config, tls, 0, idle));
        }
        {
            let cur = self.inner.agent.read().unwrap_or_else(|p| p.into_inner());
            if Arc::ptr_eq(&cur.0, &tls) {
                return Ok(cur.1.clone());
            }
        }
        let agent = self.pooled_agent(tls.clone());
        *self.inner.agent.write().unwrap_or_else(|p| p.into_inner()) = (tls, agent.clone());
        Ok(agent)
    }

    /// Sends one request, retrying as the module says; reports each attempt to the hook.
    fn send(&self, req: &Req) -> Result<ureq::Response, Error> {
        let mut refreshed = false;
        let mut attempt = 0;
        loop {
            attempt += 1;
            // Counted in flight before the fence is read: a release that closes the fence and
            // then finds no write in flight cannot have missed one about to be sent.
            let in_flight = match &self.fence {
                Some(f) if is_write(req.method) => Some(f.write_started()),
                _ => None,
            };
            let deadline = self.deadline(req)?;
            let started = Instant::now();
            let result = self.send_once(req, deadline);
            drop(in_flight);
            let code = match &result {
                Ok(r) => r.status(),
                Err(ureq::Error::Status(c, _)) => *c,
                Err(ureq::Error::Transport(_)) => 0,
            };
            (self.on_request)(req.method, code);
            log::trace!(
                target: "client",
                method = req.method, path = req.path, code = code,
                elapsed_ms = started.elapsed().as_millis() as u64;
                "request"
            );
            let (code, resp) = match result {
                Ok(resp) => return Ok(resp),
                Err(ureq::Error::Status(code, resp)) => (code, resp),
                Err(ureq::Error::Transport(t)) => {
                    if let Some(e) = tls_failure(&t) {
                        return Err(Error::Tls(e));
                    }
                    if timed_out(&t) {
                        self.forget_connections();
                    }
                    return Err(Error::Transport(t.to_string()));
                }
            };
            let wait = retry_after(resp.header("Retry-After"));
            let body = resp.into_string().unwrap_or_default();
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
                    // Keep the server's wish for whoever retries later (the queue, a
                    // watcher): they must not come back sooner than it asked.
                    if let Some(w) = wait {
                        let details = status.details.get_or_insert_with(Default::default);
                        details.retry_after_seconds.get_or_insert(w.as_secs());
                    }
                    return Err(Error::Api(Box::new(status)));
                }
            }
        }
    }

    #[allow(clippy::result_large_err)] // ureq's own error type; converted at once by `send`.
    fn send_once(&self, req: &Req, deadline: Instant) -> Result<ureq::Response, ureq::Error> {
        let url = format!("{}{}", self.inner.config.server, req.path);
        let agent = self.agent(req.idle).map_err(transport_error)?;
        let mut r = agent
            .request(req.method, &url)
            .set("Accept", req.accept)
            .set("User-Agent", USER_AGENT);
        let auth = self.inner.config.credentials.authorization();
        if let Some(auth) = auth.map_err(transport_error)? {
            r = r.set("Authorization", &auth);
        }
        // Measured after the credentials, which may have taken a while (an exec plugin): the
        // whole request, answer body included, must be over by the deadline.
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(transport_error(req.no_time_left()));
        }
        if req.idle.is_none() {
            r = r.timeout(left);
        }
        match req.body {
            Some((ct, body)) => r.set("Content-Type", ct).send_bytes(body),
            None => r.call(),
        }
    }

    fn json<T: DeserializeOwned>(&self, req: &Req) -> Result<T, Error> {
        let resp = self.send(req)?;
        // Read the body whole, then parse the slice: serde_json's reader-based parser goes
        // byte by byte through io::Read and costs several times more CPU than parsing a slice.
        let len = resp
            .header("Content-Length")
            .and_then(|l| l.parse::<usize>().ok())
            .unwrap_or(4096);
        let mut body = Vec::with_capacity(len.min(1 << 20));
        resp.into_reader().read_to_end(&mut body).map_err(|e| {
            if is_timeout(&e) {
                self.forget_connections();
            }
            Error::Transport(format!(
                "{} {}: reading the answer: {e}",
                req.method, req.path
            ))
        })?;
        serde_json::from_slice(&body)
            .map_err(|e| Error::Decode(format!("{} {}: {e}", req.method, req.path)))
    }
}

/// Whether a request of this method may change something, and so is fenced.
fn is_write(method: &str) -> bool {
    method != "GET"
}

/// Whether an I/O error is a socket timeout (which Unix reports as `WouldBlock`).
fn is_timeout(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
    )
}

fn causes(t: &ureq::Transport) -> impl Iterator<Item = &(dyn std::error::Error + 'static)> {
    std::iter::successors(std::error::Error::source(t), |e| e.source())
}

/// Whether a request failed because the server said nothing for its whole timeout (as opposed
/// to refusing or resetting the connection, which a new connection would meet as well).
fn timed_out(t: &ureq::Transport) -> bool {
    causes(t)
        .find_map(|e| e.downcast_ref::<std::io::Error>())
        .is_some_and(is_timeout)
}

/// The TLS error a request failed with, if the handshake failed. ureq hands it on inside an
/// `io::Error`, whose own `source` skips it.
fn tls_failure(t: &ureq::Transport) -> Option<rustls::Error> {
    causes(t).find_map(|e| {
        let inner = match e.downcast_ref::<std::io::Error>() {
            Some(io) => io.get_ref()? as &(dyn std::error::Error + 'static),
            None => e,
        };
        inner.downcast_ref::<rustls::Error>().cloned()
    })
}

/// A transport error of ours (ureq 2 has no public constructor; an io::Error converts).
fn transport_error(msg: impl fmt::Display) -> ureq::Error {
    std::io::Error::other(msg.to_string()).into()
}

#[cfg(test)]
mod tests;
