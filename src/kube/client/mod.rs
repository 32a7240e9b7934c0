//! Typed client for the handful of Kubernetes REST calls the operator makes.
//!
//! Request building (paths and query strings) is pure and unit-tested on URLs alone; [`Client`]
//! adds the I/O: credentials, retries of 429/503 after `Retry-After`, one credential refresh
//! after a 401, and turning every non-2xx answer into [`Error::Api`] carrying the server's
//! `Status`. Nothing here logs a header: the Authorization value never reaches a log line.
//!
//! Every request is reported to the client's [`RequestHook`] (the metrics registry's, in the
//! operator), which is how requests are counted without the client knowing how.
//!
//! A client given a [`Fence`] (leader election opens and closes it) sends a write only while
//! the fence is open, and with a timeout that ends when it closes.
//!
//! Here: the client and its sender; `request.rs` (pure request building), `error.rs`,
//! `verbs.rs` (GET to WATCH). Not here: what any resource means, or retrying beyond one
//! request (the caller's queue or watcher does that).

use crate::kube::config::{ClusterConfig, ConfigError, Proxy};
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
/// How long a watch may outlive its own `timeoutSeconds` before we give up on it: the server
/// closes the stream itself at `timeoutSeconds`. (A silent connection is given up much sooner,
/// after [`WatchParams::idle_timeout`].)
pub const WATCH_GRACE: Duration = Duration::from_secs(30);
/// What every request accepts, but metadata-only lists.
const JSON: &str = "application/json";
/// What a metadata-only list accepts: kube-apiserver's `PartialObjectMetadataList` (only each
/// object's `metadata`), or else whole objects, which read the same to a decoder of `metadata`.
const METADATA_LIST: &str =
    "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json";

/// Attempts for a request answered 429 or 503 (the first try included).
const THROTTLE_ATTEMPTS: u32 = 4;
/// Longest we honour a `Retry-After` before giving the error back to the caller's own backoff.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(10);

/// Told of every request a client sent: its method and the HTTP status it was answered with
/// (0: no answer at all). The client defines the hook and whoever keeps metrics supplies one
/// (see [`Client::reporting`]), as client-go's `tools/metrics` adapters are registered.
pub type RequestHook = fn(method: &'static str, code: u16);

/// The hook of a client nobody asked to report.
fn unreported(_: &'static str, _: u16) {}

/// The HTTP client every thread shares. Cheap to clone: all state is behind `Arc`s.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
    /// Set by [`Client::until`]: every request ends by then, and no throttle retries.
    until: Option<Instant>,
    /// Set by [`Client::fenced`]: writes only while it is open, ending when it closes.
    fence: Option<Arc<Fence>>,
    /// Cleared by [`Client::unpooled`]: every request on a connection of its own.
    pooled: bool,
    /// Set by [`Client::reporting`]: told of every request sent.
    on_request: RequestHook,
}

struct Inner {
    config: ClusterConfig,
    agent: RwLock<(Arc<rustls::ClientConfig>, ureq::Agent)>,
    max_idle_per_host: usize,
    user_agent: String,
}

fn build_agent(
    tls: Arc<rustls::ClientConfig>,
    max_idle_per_host: usize,
    proxy: Option<&Proxy>,
    server: &str,
) -> ureq::Agent {
    agent_builder(tls, proxy, server)
        .max_idle_connections_per_host(max_idle_per_host)
        .max_idle_connections(max_idle_per_host)
        .build()
}

/// What every agent shares. Through a proxy, a pooled connection is a tunnel already open,
/// so the pool saves the CONNECT as well as the handshake (see `tunnel`).
fn agent_builder(
    tls: Arc<rustls::ClientConfig>,
    proxy: Option<&Proxy>,
    server: &str,
) -> ureq::AgentBuilder {
    let b = ureq::AgentBuilder::new()
        .timeout_connect(Duration::from_secs(10))
        // Kubernetes never redirects API calls; a redirect would strip our Authorization.
        .redirects(0);
    match proxy {
        Some(p) if server.starts_with("https://") => tunnel::through(b, tls, p, server),
        // A plain-http server through a proxy: ureq's own forwarding, unpooled (see `tunnel`).
        Some(p) => b.tls_config(tls).proxy(p.ureq.clone()),
        None => b.tls_config(tls),
    }
}

/// What to send: method, path with query, optional body with its content type.
struct Req<'a> {
    method: &'static str,
    path: &'a str,
    /// The `Accept` header: [`JSON`] but for metadata-only lists.
    accept: &'static str,
    body: Option<(&'static str, &'a [u8])>,
    timeout: Duration,
    /// A watch: no overall timeout, but every read waits at most this long (see
    /// [`Client::watch`]).
    idle: Option<Duration>,
}

impl Client {
    /// Builds a client over `config`. `connections` is how many requests may run at once (one
    /// per reconcile worker plus the watchers); that many idle connections are kept for reuse.
    pub fn new(config: ClusterConfig, connections: usize) -> Result<Client, ConfigError> {
        let tls = config.tls_config()?;
        let max_idle_per_host = connections.max(2);
        let agent = build_agent(
            tls.clone(),
            max_idle_per_host,
            config.proxy.as_ref(),
            &config.server,
        );
        Ok(Client {
            inner: Arc::new(Inner {
                config,
                agent: RwLock::new((tls, agent)),
                max_idle_per_host,
                user_agent: format!("immortal-operator/{}", env!("CARGO_PKG_VERSION")),
            }),
            until: None,
            fence: None,
            pooled: true,
            on_request: unreported,
        })
    }

    /// The same client, but every request it sends (each attempt of a retried one included)
    /// is reported to `hook`, and so is every request of the clients made from it.
    pub fn reporting(&self, hook: RequestHook) -> Client {
        Client {
            on_request: hook,
            ..self.clone()
        }
    }

    /// The same client, but every request ends by `deadline` (its timeout is cut to fit, and
    /// one that would have no time left is not sent) and a 429/503 is returned at once instead
    /// of retried: for callers whose answer is worthless later (leader election must know
    /// within its renew deadline whether it still leads).
    pub fn until(&self, deadline: Instant) -> Client {
        Client {
            until: Some(deadline),
            ..self.clone()
        }
    }

    /// The same client, but a write (any method but GET) is sent only while `fence` is open,
    /// with a timeout that ends when the fence closes, so no write of ours is sent, or waited
    /// for, once another replica may hold the leader Lease. Reads are not fenced.
    pub fn fenced(&self, fence: Arc<Fence>) -> Client {
        Client {
            fence: Some(fence),
            ..self.clone()
        }
    }

    /// The same client, but every request opens a connection of its own and closes it when it
    /// ends, instead of taking one from the pool and putting it back: for requests minutes
    /// apart (start-up checks, the watchers' lists), whose pooled connection would otherwise
    /// sit idle, its TLS buffers resident, until a reconcile happens to need it. (A watch
    /// always has a connection of its own, see [`Client::watch`].)
    pub fn unpooled(&self) -> Client {
        Client {
            pooled: false,
            ..self.clone()
        }
    }

    /// Timeout of an ordinary request; [`Client::until`] and the fence may end it sooner.
    fn request_timeout(&self) -> Duration {
        REQUEST_TIMEOUT
    }

    /// When `req` must end: its own timeout, cut to [`Client::until`] and, for a write, to the
    /// fence. `Err` when the fence refuses the write or no time is left.
    fn deadline(&self, req: &Req) -> Result<Instant, Error> {
        let now = Instant::now();
        let mut deadline = now + req.timeout;
        if let Some(until) = self.until {
            deadline = deadline.min(until);
        }
        if let (Some(fence), true) = (&self.fence, is_write(req.method)) {
            deadline = deadline.min(fence.deadline().ok_or(Error::Fenced)?);
        }
        if deadline <= now {
            return Err(Error::Transport(format!(
                "{} {}: no time left before the deadline; not sent",
                req.method, req.path
            )));
        }
        Ok(deadline)
    }

    /// Drops every pooled connection, so that the next request of this client and of every
    /// client made from it opens a new one. For when a connection to the server was found
    /// dead (a request timed out, a watch went silent): the pool's other connections took the
    /// same path, and a network that stops forwarding without closing (a proxy or a load
    /// balancer gone) leaves them open and as dead, so each request that picked one would wait
    /// its whole timeout too. Requests in flight keep theirs and end by their own timeouts.
    pub fn forget_connections(&self) {
        let mut cur = self.inner.agent.write().unwrap_or_else(|p| p.into_inner());
        let tls = cur.0.clone();
        *cur = (tls.clone(), self.build_agent(tls));
        log::debug!(target: "client", server = self.inner.config.server.as_str(); "dropped every pooled connection");
    }

    /// The cluster this client talks to (for logs).
    pub fn config(&self) -> &ClusterConfig {
        &self.inner.config
    }

    /// A pooling agent over `tls`.
    fn build_agent(&self, tls: Arc<rustls::ClientConfig>) -> ureq::Agent {
        let config = &self.inner.config;
        build_agent(
            tls,
            self.inner.max_idle_per_host,
            config.proxy.as_ref(),
            &config.server,
        )
    }

    /// The current agent; rebuilt when an exec plugin handed out a new client certificate.
    fn agent(&self) -> Result<ureq::Agent, Error> {
        let tls = self.inner.config.tls_config().map_err(Error::Credentials)?;
        {
            let cur = self.inner.agent.read().unwrap_or_else(|p| p.into_inner());
            if Arc::ptr_eq(&cur.0, &tls) {
                return Ok(cur.1.clone());
            }
        }
        let agent = self.build_agent(tls.clone());
        *self.inner.agent.write().unwrap_or_else(|p| p.into_inner()) = (tls, agent.clone());
        Ok(agent)
    }

    /// An agent for one request that never pools: its connection is opened for it and closed
    /// when it ends. With `idle` (a watch), every read (TLS handshake, the answer's head, each
    /// piece of the stream) and write waits at most that long, and the request is sent
    /// without an overall timeout.
    ///
    /// ureq 2 turns an overall timeout into a socket timeout re-armed on every read from the
    /// time left (`DeadlineStream::fill_buf`), so a per-read limit needs a request without
    /// one. It applies `timeout_read` only to a connection it opens (a pooled one reads the
    /// head with no limit at all, its timeout cleared when it was pooled), hence no pool: a
    /// watch costs a TLS handshake every few minutes.
    fn own_agent(&self, idle: Option<Duration>) -> Result<ureq::Agent, Error> {
        let tls = self.inner.config.tls_config().map_err(Error::Credentials)?;
        let config = &self.inner.config;
        let mut b = agent_builder(tls, config.proxy.as_ref(), &config.server)
            .max_idle_connections(0)
            .max_idle_connections_per_host(0);
        if let Some(idle) = idle {
            b = b.timeout_read(idle).timeout_write(idle);
        }
        Ok(b.build())
    }

    /// Sends one request, retrying 429/503 after `Retry-After` and a 401 once with refreshed
    /// credentials. Returns the 2xx response, or the error.
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
            match result {
                Ok(resp) => return Ok(resp),
                Err(ureq::Error::Transport(t)) => {
                    if let Some(e) = tls_failure(&t) {
                        return Err(Error::Tls(e));
                    }
                    if timed_out(&t) {
                        self.forget_connections();
                    }
                    return Err(Error::Transport(t.to_string()));
                }
                Err(ureq::Error::Status(code, resp)) => {
                    let wait = retry_after(resp.header("Retry-After"));
                    let body = resp.into_string().unwrap_or_default();
                    let attempts = if self.until.is_some() {
                        1
                    } else {
                        THROTTLE_ATTEMPTS
                    };
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
        }
    }

    #[allow(clippy::result_large_err)] // ureq's own error type; converted at once by `send`.
    fn send_once(&self, req: &Req, deadline: Instant) -> Result<ureq::Response, ureq::Error> {
        let agent = match (req.idle, self.pooled) {
            (Some(_), _) | (None, false) => self.own_agent(req.idle),
            (None, true) => self.agent(),
        };
        let agent = match agent {
            Ok(a) => a,
            Err(e) => return Err(ureq::Error::Transport(transport_error(e.to_string()))),
        };
        let url = format!("{}{}", self.inner.config.server, req.path);
        let mut r = agent
            .request(req.method, &url)
            .set("Accept", req.accept)
            .set("User-Agent", &self.inner.user_agent);
        match self.inner.config.credentials.authorization() {
            Ok(Some(auth)) => r = r.set("Authorization", &auth),
            Ok(None) => {}
            Err(e) => return Err(ureq::Error::Transport(transport_error(e.to_string()))),
        }
        // Measured after the credentials, which may have taken a while (an exec plugin): ureq
        // counts its timeout from the call, and the whole request, answer body included, must
        // be over by the deadline.
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ureq::Error::Transport(transport_error(format!(
                "{} {}: no time left before the deadline; not sent",
                req.method, req.path
            ))));
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

    fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, Error> {
        self.json(&Req {
            method: "GET",
            path,
            accept: JSON,
            body: None,
            timeout: self.request_timeout(),
            idle: None,
        })
    }
}

/// Whether a request of this method may change something, and so is fenced.
fn is_write(method: &str) -> bool {
    method != "GET"
}

/// Whether an I/O error is a read or write that waited its whole timeout (`WouldBlock` is how
/// a socket timeout shows on some platforms).
fn is_timeout(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
    )
}

/// Whether a request failed because the server said nothing for its whole timeout (as opposed
/// to refusing or resetting the connection, which a new connection would meet as well).
fn timed_out(t: &ureq::Transport) -> bool {
    let mut source = std::error::Error::source(t);
    while let Some(e) = source {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            return is_timeout(io);
        }
        source = e.source();
    }
    false
}

/// The TLS error a request failed with, if the handshake failed. ureq hands it on inside an
/// `io::Error`, whose own `source` skips it.
fn tls_failure(t: &ureq::Transport) -> Option<rustls::Error> {
    let mut source = std::error::Error::source(t);
    while let Some(e) = source {
        let inner = match e.downcast_ref::<std::io::Error>() {
            Some(io) => io
                .get_ref()
                .map(|i| i as &(dyn std::error::Error + 'static)),
            None => Some(e),
        };
        if let Some(tls) = inner.and_then(|i| i.downcast_ref::<rustls::Error>()) {
            return Some(tls.clone());
        }
        source = e.source();
    }
    None
}

fn transport_error(msg: String) -> ureq::Transport {
    // ureq 2 has no public constructor for Transport; an io::Error converts into one.
    match ureq::Error::from(std::io::Error::other(msg)) {
        ureq::Error::Transport(t) => t,
        ureq::Error::Status(..) => unreachable!("an io::Error converts to a transport error"),
    }
}

#[cfg(test)]
mod tests;
