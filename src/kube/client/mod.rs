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

use crate::kube::config::{ClusterConfig, ConfigError};
use crate::kube::fence::Fence;
use crate::kube::types::{Pod, Status};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::io::{BufRead, BufReader, Read};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

/// Deadline for an ordinary (non-watch) request, connect to last byte. client-go has no default,
/// but a reconcile blocked on a dead connection would stall every key behind it.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a watch may outlive its own `timeoutSeconds` before we give up on it: the server
/// closes the stream itself at `timeoutSeconds`. (A silent connection is given up much sooner,
/// after [`WatchParams::idle_timeout`].)
pub const WATCH_GRACE: Duration = Duration::from_secs(30);
/// Attempts for a request answered 429 or 503 (the first try included).
const THROTTLE_ATTEMPTS: u32 = 4;
/// Longest we honour a `Retry-After` before giving the error back to the caller's own backoff.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(10);

/// Errors of the API client.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The API server answered 4xx/5xx. Carries the parsed `Status` (synthesised from the HTTP
    /// code when the body was not one). Callers decide from the code: 404/409/410/422 are
    /// answers, 429/5xx are transient, 401/403 need a person.
    Api(Box<Status>),
    /// No HTTP answer: DNS, connect, TLS handshake, timeout, connection reset. Transient.
    Transport(String),
    /// A 2xx answer whose body did not decode as the expected type. A bug or a version skew;
    /// retried with backoff like a transient error, but logged as such.
    Decode(String),
    /// Credentials could not be produced (exec plugin failed, token file unreadable).
    Credentials(ConfigError),
    /// A write refused before it was sent: this replica does not hold the leader Lease, or
    /// renewed it too long ago to be sure that no other replica holds it now (see
    /// [`Fence`]). Transient: the reconcile is retried with backoff, and a replica that lost
    /// the Lease exits.
    Fenced,
}

impl Error {
    /// HTTP status of an API error, 0 otherwise.
    pub fn code(&self) -> u16 {
        match self {
            Error::Api(s) => s.code,
            _ => 0,
        }
    }
    pub fn reason(&self) -> &str {
        match self {
            Error::Api(s) => &s.reason,
            _ => "",
        }
    }
    pub fn is_not_found(&self) -> bool {
        self.code() == 404
    }
    /// 409 with reason AlreadyExists: a create hit an existing name.
    pub fn is_already_exists(&self) -> bool {
        self.code() == 409 && self.reason() == "AlreadyExists"
    }
    /// 409 Conflict: a stale resourceVersion or a uid precondition that did not match.
    pub fn is_conflict(&self) -> bool {
        self.code() == 409 && self.reason() != "AlreadyExists"
    }
    /// 410 Gone / Expired: a resourceVersion or continue token too old; relist.
    pub fn is_gone(&self) -> bool {
        self.code() == 410
    }
    pub fn is_forbidden(&self) -> bool {
        self.code() == 403
    }
    pub fn is_unauthorized(&self) -> bool {
        self.code() == 401
    }
    /// 422 Invalid: the server rejected what we sent; retrying the same request cannot help.
    pub fn is_invalid(&self) -> bool {
        self.code() == 422
    }
    /// How long the server asked us to wait before trying again (`Retry-After`, or
    /// `details.retryAfterSeconds` of its Status), if it did.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Error::Api(s) => s
                .details
                .as_ref()?
                .retry_after_seconds
                .map(Duration::from_secs),
            _ => None,
        }
    }
    /// Worth retrying unchanged after a while: throttling, server errors, no answer at all.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Api(s) => s.code == 429 || s.code >= 500,
            Error::Transport(_) | Error::Decode(_) | Error::Fenced => true,
            Error::Credentials(_) => false,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Api(s) => {
                write!(f, "api error {} {}: {}", s.code, s.reason, s.message)?;
                if let Some(d) = &s.details {
                    for c in &d.causes {
                        write!(f, "; {}: {}", c.field, c.message)?;
                    }
                }
                Ok(())
            }
            Error::Transport(m) => write!(f, "transport error: {m}"),
            Error::Decode(m) => write!(f, "decode error: {m}"),
            Error::Credentials(e) => write!(f, "credentials: {e}"),
            Error::Fenced => write!(
                f,
                "write refused: this replica does not hold the leader lease (or may no longer)"
            ),
        }
    }
}

impl std::error::Error for Error {}

// ---------------------------------------------------------------------------------------------
// Request building: pure functions over strings.

/// Where a kind of object lives in the API: its group-version path and its plural name. The
/// core kinds the operator touches are constants here; a custom resource defines its own
/// (`immortal::types::IMMORTAL_CONTAINERS`), as kube-rs's `ApiResource` does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resource {
    api_path: &'static str,
    plural: &'static str,
    short: &'static str,
}

impl Resource {
    pub const PODS: Resource = Resource::new("/api/v1", "pods", "pod");
    pub const EVENTS: Resource = Resource::new("/api/v1", "events", "event");
    pub const LEASES: Resource = Resource::new("/apis/coordination.k8s.io/v1", "leases", "lease");
    /// Cluster-scoped and create-only: the metrics endpoint asks who a bearer token is.
    pub const TOKEN_REVIEWS: Resource = Resource::new(
        "/apis/authentication.k8s.io/v1",
        "tokenreviews",
        "tokenreview",
    );
    /// Cluster-scoped and create-only: the metrics endpoint asks whether a user may read it.
    pub const SUBJECT_ACCESS_REVIEWS: Resource = Resource::new(
        "/apis/authorization.k8s.io/v1",
        "subjectaccessreviews",
        "subjectaccessreview",
    );

    /// `api_path`: `/api/v1` for the core group, `/apis/GROUP/VERSION` for the others;
    /// `short`: the singular name logs and metrics labels use.
    pub const fn new(api_path: &'static str, plural: &'static str, short: &'static str) -> Self {
        Resource {
            api_path,
            plural,
            short,
        }
    }
    pub fn plural(self) -> &'static str {
        self.plural
    }
    /// Short name for logs and metrics labels.
    pub fn short(self) -> &'static str {
        self.short
    }
}

/// `/api/v1/namespaces/NS/pods`, or the cluster-wide `/api/v1/pods` when `ns` is `None`.
pub fn collection_path(res: Resource, ns: Option<&str>) -> String {
    match ns {
        Some(ns) => format!("{}/namespaces/{}/{}", res.api_path, ns, res.plural),
        None => format!("{}/{}", res.api_path, res.plural),
    }
}

/// `/api/v1/namespaces/NS/pods/NAME`.
pub fn object_path(res: Resource, ns: &str, name: &str) -> String {
    format!("{}/{}", collection_path(res, Some(ns)), name)
}

/// Parameters of a LIST.
#[derive(Debug, Clone, Default)]
pub struct ListParams<'a> {
    pub label_selector: Option<&'a str>,
    pub limit: Option<u32>,
    pub continue_token: Option<&'a str>,
}

/// Parameters of a WATCH.
#[derive(Debug, Clone, Default)]
pub struct WatchParams<'a> {
    pub label_selector: Option<&'a str>,
    pub resource_version: &'a str,
    pub timeout_seconds: u32,
    /// Not sent: how long the connection may stay silent (no event, no bookmark, not even the
    /// answer's head) before the watch is given up as dead, with an error of kind
    /// `TimedOut`. Zero: only the stream's deadline (`timeoutSeconds` + [`WATCH_GRACE`]).
    pub idle_timeout: Duration,
}

/// Query string of a LIST (with its leading `?`, or empty).
pub fn list_query(p: &ListParams) -> String {
    let mut q = Query::default();
    if let Some(s) = p.label_selector {
        q.push("labelSelector", s);
    }
    if let Some(l) = p.limit {
        q.push("limit", &l.to_string());
    }
    if let Some(c) = p.continue_token {
        q.push("continue", c);
    }
    q.finish()
}

/// Query string of a WATCH. Bookmarks are always requested: they move our resourceVersion
/// forward while nothing we watch changes, so a restarted watch rarely falls out of history.
pub fn watch_query(p: &WatchParams) -> String {
    let mut q = Query::default();
    q.push("watch", "true");
    if let Some(s) = p.label_selector {
        q.push("labelSelector", s);
    }
    if !p.resource_version.is_empty() {
        q.push("resourceVersion", p.resource_version);
    }
    q.push("allowWatchBookmarks", "true");
    q.push("timeoutSeconds", &p.timeout_seconds.to_string());
    q.finish()
}

#[derive(Default)]
struct Query(String);

impl Query {
    fn push(&mut self, k: &str, v: &str) {
        self.0.push(if self.0.is_empty() { '?' } else { '&' });
        self.0.push_str(k);
        self.0.push('=');
        percent_encode(v, &mut self.0);
    }
    fn finish(self) -> String {
        self.0
    }
}

/// Percent-encodes a query value (RFC 3986 unreserved characters pass through).
fn percent_encode(v: &str, out: &mut String) {
    for b in v.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
}

/// Body of a DELETE: a uid precondition so we never delete a pod that replaced the one we
/// looked at (the `*-uid-precondition-mismatch` fixture shows the 409 it earns otherwise).
pub fn delete_body(uid: &str, grace_period_seconds: Option<u32>) -> String {
    let mut body = serde_json::json!({
        "apiVersion": "v1",
        "kind": "DeleteOptions",
        "preconditions": { "uid": uid },
        "propagationPolicy": "Background",
    });
    if let Some(g) = grace_period_seconds {
        body["gracePeriodSeconds"] = g.into();
    }
    body.to_string()
}

/// Parses an error body into a `Status`; when the body is not one (a proxy's HTML, an empty
/// 503), synthesises one from the HTTP code so callers still get code and reason.
pub fn parse_status(code: u16, body: &str) -> Status {
    match serde_json::from_str::<Status>(body) {
        Ok(mut s) if !s.reason.is_empty() || s.code != 0 => {
            if s.code == 0 {
                s.code = code;
            }
            s
        }
        _ => {
            let mut message: String = body.trim().chars().take(200).collect();
            if message.is_empty() {
                message = format!("HTTP {code}");
            }
            Status {
                status: "Failure".into(),
                message,
                reason: reason_for(code).into(),
                code,
                details: None,
            }
        }
    }
}

/// The `StatusReason` Kubernetes uses for an HTTP code.
fn reason_for(code: u16) -> &'static str {
    match code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        405 => "MethodNotAllowed",
        409 => "Conflict",
        410 => "Expired",
        415 => "UnsupportedMediaType",
        422 => "Invalid",
        429 => "TooManyRequests",
        500 => "InternalError",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "Unknown",
    }
}

/// `Retry-After` in seconds (the API server only sends the delta-seconds form).
fn retry_after(header: Option<&str>) -> Option<Duration> {
    header
        .and_then(|h| h.trim().parse::<u64>().ok())
        .map(Duration::from_secs)
}

// ---------------------------------------------------------------------------------------------
// Lists and watch events, decoded to the little the watchers need.

/// One page of a LIST, items decoded as `T`.
#[derive(Debug, Deserialize)]
pub struct ListPage<T> {
    #[serde(default)]
    pub metadata: ListMeta,
    #[serde(default = "Vec::new")]
    pub items: Vec<T>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListMeta {
    #[serde(default)]
    pub resource_version: String,
    #[serde(default, rename = "continue")]
    pub continue_token: Option<String>,
}

// ---------------------------------------------------------------------------------------------
// The client.

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

fn build_agent(tls: Arc<rustls::ClientConfig>, max_idle_per_host: usize) -> ureq::Agent {
    ureq::AgentBuilder::new()
        .tls_config(tls)
        .timeout_connect(Duration::from_secs(10))
        .max_idle_connections_per_host(max_idle_per_host)
        .max_idle_connections(max_idle_per_host)
        // Kubernetes never redirects API calls; a redirect would strip our Authorization.
        .redirects(0)
        .build()
}

/// What to send: method, path with query, optional body with its content type.
struct Req<'a> {
    method: &'static str,
    path: &'a str,
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
        let agent = build_agent(tls.clone(), max_idle_per_host);
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

    /// The cluster this client talks to (for logs).
    pub fn config(&self) -> &ClusterConfig {
        &self.inner.config
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
        let agent = build_agent(tls.clone(), self.inner.max_idle_per_host);
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
        let mut b = ureq::AgentBuilder::new()
            .tls_config(tls)
            .timeout_connect(Duration::from_secs(10))
            .max_idle_connections(0)
            .max_idle_connections_per_host(0)
            .redirects(0);
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
                Err(ureq::Error::Transport(t)) => return Err(Error::Transport(t.to_string())),
                Err(ureq::Error::Status(code, resp)) => {
                    let wait = retry_after(resp.header("Retry-After"));
                    let body = resp.into_string().unwrap_or_default();
                    let mut status = parse_status(code, &body);
                    if code == 401 && !refreshed {
                        // An exec credential or a rotated service-account token may have expired
                        // early: fetch a fresh one and try once more, as client-go does.
                        refreshed = true;
                        self.inner.config.credentials.invalidate();
                        continue;
                    }
                    let attempts = if self.until.is_some() {
                        1
                    } else {
                        THROTTLE_ATTEMPTS
                    };
                    if (code == 429 || code == 503) && attempt < attempts {
                        let backoff = Duration::from_millis(200 << attempt);
                        let wait = wait
                            .unwrap_or(backoff)
                            .max(backoff.min(Duration::from_secs(1)));
                        if wait <= MAX_RETRY_AFTER {
                            log::debug!(
                                target: "client",
                                method = req.method, path = req.path, code = code,
                                retry_after_ms = wait.as_millis() as u64;
                                "throttled, retrying"
                            );
                            std::thread::sleep(wait);
                            continue;
                        }
                    }
                    // Keep the server's wish for whoever retries later (the queue, a watcher):
                    // they must not come back sooner than it asked.
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
            .set("Accept", "application/json")
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
            body: None,
            timeout: self.request_timeout(),
            idle: None,
        })
    }

    /// GET of any path (discovery documents), decoded as `T`.
    pub fn get_path<T: DeserializeOwned>(&self, path: &str) -> Result<T, Error> {
        self.get(path)
    }

    pub fn get_pod(&self, ns: &str, name: &str) -> Result<Pod, Error> {
        self.get(&object_path(Resource::PODS, ns, name))
    }

    pub fn create_pod(&self, ns: &str, pod: &Pod) -> Result<Pod, Error> {
        let body = serde_json::to_vec(pod).map_err(|e| Error::Decode(e.to_string()))?;
        let path = collection_path(Resource::PODS, Some(ns));
        self.json(&Req {
            method: "POST",
            path: &path,
            body: Some(("application/json", &body)),
            timeout: self.request_timeout(),
            idle: None,
        })
    }

    /// Deletes a pod only if it still has `uid`, and answers the pod as the server left it:
    /// still there with a `deletionTimestamp` while a graceful deletion runs, or, when it was
    /// removed at once, its last state with `deletionGracePeriodSeconds: 0` (see
    /// [`Pod::is_removed`]). An answer that is not a pod decodes as an empty one, which reads
    /// as "not known to be removed".
    pub fn delete_pod(
        &self,
        ns: &str,
        name: &str,
        uid: &str,
        grace: Option<u32>,
    ) -> Result<Pod, Error> {
        let body = delete_body(uid, grace);
        let path = object_path(Resource::PODS, ns, name);
        match self.json::<Pod>(&Req {
            method: "DELETE",
            path: &path,
            body: Some(("application/json", body.as_bytes())),
            timeout: self.request_timeout(),
            idle: None,
        }) {
            Err(Error::Decode(_)) => Ok(Pod::default()),
            other => other,
        }
    }

    /// Strategic merge patch of a pod (built-in kinds take it; its `$deleteFromPrimitiveList`
    /// removes one finalizer without touching others'). A `metadata.uid` in the patch is a
    /// precondition: the server answers 409 when the pod of that name has another uid.
    pub fn patch_pod(&self, ns: &str, name: &str, patch: &serde_json::Value) -> Result<Pod, Error> {
        let body = patch.to_string();
        let path = object_path(Resource::PODS, ns, name);
        self.json(&Req {
            method: "PATCH",
            path: &path,
            body: Some(("application/strategic-merge-patch+json", body.as_bytes())),
            timeout: self.request_timeout(),
            idle: None,
        })
    }

    /// JSON merge patch (RFC 7386) of an object's `/status` subresource. Custom resources do
    /// not support strategic merge patch (415, see the `*-strategic-merge-patch-unsupported`
    /// fixture).
    pub fn patch_status<T: DeserializeOwned>(
        &self,
        res: Resource,
        ns: &str,
        name: &str,
        patch: &serde_json::Value,
    ) -> Result<T, Error> {
        let body = patch.to_string();
        let path = format!("{}/status", object_path(res, ns, name));
        self.json(&Req {
            method: "PATCH",
            path: &path,
            body: Some(("application/merge-patch+json", body.as_bytes())),
            timeout: self.request_timeout(),
            idle: None,
        })
    }

    /// POST of any object to a namespaced collection (events, leases), decoded as `T`.
    pub fn create<B: Serialize, T: DeserializeOwned>(
        &self,
        res: Resource,
        ns: &str,
        body: &B,
    ) -> Result<T, Error> {
        let body = serde_json::to_vec(body).map_err(|e| Error::Decode(e.to_string()))?;
        let path = collection_path(res, Some(ns));
        self.json(&Req {
            method: "POST",
            path: &path,
            body: Some(("application/json", &body)),
            timeout: self.request_timeout(),
            idle: None,
        })
    }

    /// POST of any object to a cluster-scoped collection (token and access reviews), decoded
    /// as `T`.
    pub fn create_cluster_scoped<B: Serialize, T: DeserializeOwned>(
        &self,
        res: Resource,
        body: &B,
    ) -> Result<T, Error> {
        let body = serde_json::to_vec(body).map_err(|e| Error::Decode(e.to_string()))?;
        let path = collection_path(res, None);
        self.json(&Req {
            method: "POST",
            path: &path,
            body: Some(("application/json", &body)),
            timeout: self.request_timeout(),
            idle: None,
        })
    }

    /// GET of any namespaced object, decoded as `T`.
    pub fn get_object<T: DeserializeOwned>(
        &self,
        res: Resource,
        ns: &str,
        name: &str,
    ) -> Result<T, Error> {
        self.get(&object_path(res, ns, name))
    }

    /// PUT (replace) of a namespaced object; the body's resourceVersion makes it conditional.
    pub fn replace<B: Serialize, T: DeserializeOwned>(
        &self,
        res: Resource,
        ns: &str,
        name: &str,
        body: &B,
    ) -> Result<T, Error> {
        let body = serde_json::to_vec(body).map_err(|e| Error::Decode(e.to_string()))?;
        let path = object_path(res, ns, name);
        self.json(&Req {
            method: "PUT",
            path: &path,
            body: Some(("application/json", &body)),
            timeout: self.request_timeout(),
            idle: None,
        })
    }

    /// JSON merge patch of a namespaced object.
    pub fn merge_patch<B: Serialize, T: DeserializeOwned>(
        &self,
        res: Resource,
        ns: &str,
        name: &str,
        patch: &B,
    ) -> Result<T, Error> {
        let body = serde_json::to_vec(patch).map_err(|e| Error::Decode(e.to_string()))?;
        let path = object_path(res, ns, name);
        self.json(&Req {
            method: "PATCH",
            path: &path,
            body: Some(("application/merge-patch+json", &body)),
            timeout: self.request_timeout(),
            idle: None,
        })
    }

    /// One page of a LIST.
    pub fn list<T: DeserializeOwned>(
        &self,
        res: Resource,
        ns: Option<&str>,
        params: &ListParams,
    ) -> Result<ListPage<T>, Error> {
        let path = format!("{}{}", collection_path(res, ns), list_query(params));
        self.get(&path)
    }

    /// Opens a WATCH and returns the event stream, one JSON event per line.
    ///
    /// Two limits catch a connection that is open but dead (its node or load balancer gone
    /// without a reset): nothing may take longer than [`WatchParams::idle_timeout`] to arrive,
    /// the answer's head included (the API server sends a BOOKMARK about once a minute on a
    /// quiet watch), and no read starts after the watch's own `timeoutSeconds` plus
    /// [`WATCH_GRACE`], so a stream that never ends, ends. Either fails the read; silence with
    /// an error of kind `TimedOut`.
    pub fn watch(
        &self,
        res: Resource,
        ns: Option<&str>,
        params: &WatchParams,
    ) -> Result<Box<dyn BufRead + Send>, Error> {
        let path = format!("{}{}", collection_path(res, ns), watch_query(params));
        let timeout = Duration::from_secs(params.timeout_seconds as u64) + WATCH_GRACE;
        let idle = match params.idle_timeout {
            d if d.is_zero() => timeout,
            d => d.min(timeout),
        };
        let resp = self.send(&Req {
            method: "GET",
            path: &path,
            body: None,
            timeout,
            idle: Some(idle),
        })?;
        let mut deadline = Instant::now() + timeout;
        if let Some(until) = self.until {
            deadline = deadline.min(until);
        }
        // One TLS record's worth: the reader below hands over at most a record's plaintext per
        // read, so a larger buffer only adds resident memory to every watch (64 KiB cost
        // 0.1 MiB of idle RSS for the two watches).
        Ok(Box::new(BufReader::with_capacity(
            16 * 1024,
            WatchBody {
                inner: resp.into_reader(),
                deadline,
                idle,
            },
        )))
    }
}

/// A watch's body: each read waits at most `idle` (the agent's socket timeout does that; a
/// timeout is reported as `TimedOut` whatever the platform calls it), and none starts after
/// `deadline`.
struct WatchBody {
    inner: Box<dyn Read + Send + Sync>,
    deadline: Instant,
    idle: Duration,
}

impl Read for WatchBody {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if Instant::now() >= self.deadline {
            return Err(std::io::Error::other(
                "the watch outlived its timeoutSeconds and grace",
            ));
        }
        self.inner.read(buf).map_err(|e| match e.kind() {
            // Unix reports a socket read timeout as WouldBlock (the socket is blocking).
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("nothing heard for {:?}", self.idle),
            ),
            _ => e,
        })
    }
}

/// Whether a request of this method may change something, and so is fenced.
fn is_write(method: &str) -> bool {
    method != "GET"
}

fn transport_error(msg: String) -> ureq::Transport {
    // ureq 2 has no public constructor for Transport; an io::Error converts into one.
    match ureq::Error::from(std::io::Error::other(msg)) {
        ureq::Error::Transport(t) => t,
        ureq::Error::Status(..) => unreachable!("an io::Error converts to a transport error"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::fixture;

    /// A custom resource as the operator's own is addressed (the client knows none by name).
    const IMMORTAL_CONTAINERS: Resource = Resource::new(
        "/apis/immortalcontainer.flugel.it/v1alpha1",
        "immortalcontainers",
        "immortalcontainer",
    );

    #[test]
    fn builds_namespaced_and_cluster_wide_paths() {
        assert_eq!(
            object_path(IMMORTAL_CONTAINERS, "fixtures", "example"),
            "/apis/immortalcontainer.flugel.it/v1alpha1/namespaces/fixtures/immortalcontainers/example"
        );
        assert_eq!(collection_path(Resource::PODS, None), "/api/v1/pods");
        assert_eq!(
            collection_path(Resource::EVENTS, Some("ns")),
            "/api/v1/namespaces/ns/events"
        );
        assert_eq!(
            collection_path(Resource::LEASES, Some("op")),
            "/apis/coordination.k8s.io/v1/namespaces/op/leases"
        );
        assert_eq!(
            collection_path(IMMORTAL_CONTAINERS, None),
            "/apis/immortalcontainer.flugel.it/v1alpha1/immortalcontainers"
        );
        assert_eq!(
            collection_path(Resource::TOKEN_REVIEWS, None),
            "/apis/authentication.k8s.io/v1/tokenreviews"
        );
        assert_eq!(
            collection_path(Resource::SUBJECT_ACCESS_REVIEWS, None),
            "/apis/authorization.k8s.io/v1/subjectaccessreviews"
        );
    }

    #[test]
    fn watch_query_encodes_selector_and_asks_for_bookmarks() {
        let q = watch_query(&WatchParams {
            label_selector: Some("app.kubernetes.io/managed-by=immortal-operator"),
            resource_version: "967",
            timeout_seconds: 231,
            idle_timeout: Duration::from_secs(75),
        });
        assert_eq!(
            q,
            "?watch=true&labelSelector=app.kubernetes.io%2Fmanaged-by%3Dimmortal-operator\
             &resourceVersion=967&allowWatchBookmarks=true&timeoutSeconds=231"
        );
        // No resourceVersion: the server replays every object as ADDED, which we never want
        // from a watch (we list first), so the parameter is simply absent, never "0".
        let q = watch_query(&WatchParams {
            label_selector: None,
            resource_version: "",
            timeout_seconds: 5,
            ..Default::default()
        });
        assert_eq!(q, "?watch=true&allowWatchBookmarks=true&timeoutSeconds=5");
    }

    #[test]
    fn list_query_pages_with_limit_and_continue() {
        assert_eq!(list_query(&ListParams::default()), "");
        let q = list_query(&ListParams {
            label_selector: None,
            limit: Some(500),
            continue_token: Some("a+b="),
        });
        assert_eq!(q, "?limit=500&continue=a%2Bb%3D");
    }

    #[test]
    fn delete_body_carries_uid_precondition() {
        let v: serde_json::Value = serde_json::from_str(&delete_body("u-1", Some(0))).unwrap();
        assert_eq!(v["preconditions"]["uid"], "u-1");
        assert_eq!(v["gracePeriodSeconds"], 0);
        let v: serde_json::Value = serde_json::from_str(&delete_body("u-1", None)).unwrap();
        assert!(v.get("gracePeriodSeconds").is_none());
    }

    #[test]
    fn parses_recorded_not_found() {
        let (code, body) = fixture("09-ic-get-not-found");
        let e = Error::Api(Box::new(parse_status(code, &body)));
        assert!(e.is_not_found());
        assert!(!e.is_transient());
        assert_eq!(e.to_string(), "api error 404 NotFound: immortalcontainers.immortalcontainer.flugel.it \"missing\" not found");
    }

    #[test]
    fn tells_already_exists_from_conflict() {
        let (code, body) = fixture("12-pod-create-already-exists");
        let e = Error::Api(Box::new(parse_status(code, &body)));
        assert!(e.is_already_exists() && !e.is_conflict());
        let (code, body) = fixture("19-ic-status-merge-patch-stale-rv-conflict");
        let e = Error::Api(Box::new(parse_status(code, &body)));
        assert!(e.is_conflict() && !e.is_already_exists());
        let (code, body) = fixture("24-pod-delete-uid-precondition-mismatch");
        assert!(Error::Api(Box::new(parse_status(code, &body))).is_conflict());
    }

    #[test]
    fn invalid_keeps_its_causes() {
        let (code, body) = fixture("13-pod-create-invalid-label-too-long");
        let e = Error::Api(Box::new(parse_status(code, &body)));
        assert!(e.is_invalid());
        let Error::Api(s) = &e else { unreachable!() };
        assert!(!s.details.as_ref().unwrap().causes.is_empty());
        assert!(e.to_string().contains("metadata.labels"), "{e}");
    }

    #[test]
    fn parses_forbidden_unauthorized_and_unsupported_media_type() {
        let (code, body) = fixture("26-forbidden-list-pods");
        assert!(Error::Api(Box::new(parse_status(code, &body))).is_forbidden());
        let (code, body) = fixture("27-unauthorized");
        assert!(Error::Api(Box::new(parse_status(code, &body))).is_unauthorized());
        let (code, body) = fixture("20-ic-strategic-merge-patch-unsupported");
        let s = parse_status(code, &body);
        assert_eq!((s.code, s.reason.as_str()), (415, "UnsupportedMediaType"));
    }

    #[test]
    fn synthesises_status_from_a_body_that_is_not_one() {
        let s = parse_status(503, "<html>upstream unavailable</html>");
        assert_eq!((s.code, s.reason.as_str()), (503, "ServiceUnavailable"));
        assert!(Error::Api(Box::new(s)).is_transient());
        let s = parse_status(429, "");
        assert_eq!(s.message, "HTTP 429");
    }

    #[test]
    fn reads_retry_after_seconds() {
        assert_eq!(retry_after(Some("3")), Some(Duration::from_secs(3)));
        assert_eq!(retry_after(Some("soon")), None);
        assert_eq!(retry_after(None), None);
    }

    /// A client of a fresh test API server.
    fn against_test_server() -> (kube_testserver::TestServer, Client) {
        against(kube_testserver::Options::default())
    }

    fn against(options: kube_testserver::Options) -> (kube_testserver::TestServer, Client) {
        let server = kube_testserver::TestServer::start(options).unwrap();
        let opts = crate::kube::config::LoadOptions {
            kubeconfig: Some(server.kubeconfig_path()),
            context: None,
        };
        let client = Client::new(crate::kube::config::load(&opts).unwrap(), 2).unwrap();
        (server, client)
    }

    fn throttle(server: &kube_testserver::TestServer, status: u16, retry_after: u64) {
        server.fail_next(kube_testserver::FailRule {
            count: 1,
            status,
            retry_after: Some(retry_after),
            verb: Some("get".into()),
            path_contains: Some("/pods/x".into()),
        });
    }

    fn pod_gets(server: &kube_testserver::TestServer) -> u64 {
        server
            .request_counts()
            .get(&("get".to_string(), "pods".to_string()))
            .copied()
            .unwrap_or(0)
    }

    #[test]
    fn a_short_retry_after_is_waited_out_and_the_request_retried() {
        let (server, client) = against_test_server();
        throttle(&server, 429, 1);
        // Retried after the throttle: the answer is the real one (no such pod).
        assert!(client.get_pod("default", "x").unwrap_err().is_not_found());
        assert_eq!(pod_gets(&server), 2);
    }

    #[test]
    fn a_long_retry_after_is_handed_to_the_caller_instead_of_slept_on() {
        let (server, client) = against_test_server();
        throttle(&server, 429, 30);
        let e = client.get_pod("default", "x").unwrap_err();
        assert_eq!(e.code(), 429);
        // The caller's retry must wait at least this long.
        assert_eq!(e.retry_after(), Some(Duration::from_secs(30)));
        assert_eq!(pod_gets(&server), 1);
    }

    fn pod_creates(server: &kube_testserver::TestServer) -> u64 {
        server
            .request_counts()
            .get(&("create".to_string(), "pods".to_string()))
            .copied()
            .unwrap_or(0)
    }

    fn a_pod(name: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": "pause"}]},
        }))
        .unwrap()
    }

    #[test]
    fn a_write_outside_the_fence_is_refused_before_it_reaches_the_server() {
        let (server, client) = against_test_server();
        let fence = Arc::new(Fence::closed());
        let fenced = client.fenced(fence.clone());
        let e = fenced.create_pod("default", &a_pod("p")).unwrap_err();
        assert!(matches!(e, Error::Fenced) && e.is_transient(), "{e}");
        assert_eq!(pod_creates(&server), 0, "never sent");
        // Reads are not fenced.
        assert!(fenced.get_pod("default", "p").unwrap_err().is_not_found());
        fence.open_until(Instant::now() + Duration::from_secs(10));
        fenced.create_pod("default", &a_pod("p")).unwrap();
        fence.close();
        assert!(matches!(
            fenced.create_pod("default", &a_pod("q")),
            Err(Error::Fenced)
        ));
        assert_eq!(pod_creates(&server), 1);
    }

    #[test]
    fn a_write_the_server_never_answers_is_given_up_when_the_fence_closes() {
        let (server, client) = against_test_server();
        server.stall(kube_testserver::StallRule {
            verb: Some("create".into()),
            ..Default::default()
        });
        let fence = Arc::new(Fence::closed());
        fence.open_until(Instant::now() + Duration::from_millis(600));
        let fenced = client.fenced(fence.clone());
        let started = Instant::now();
        let write = std::thread::spawn(move || fenced.create_pod("default", &a_pod("p")));
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(fence.writes_in_flight(), 1, "counted while it waits");
        let result = write.join().unwrap();
        let took = started.elapsed();
        assert!(matches!(result, Err(Error::Transport(_))), "{result:?}");
        assert!(
            took >= Duration::from_millis(550) && took < Duration::from_millis(1500),
            "ended with the fence, not after the 30 s request timeout: {took:?}"
        );
        assert_eq!(fence.writes_in_flight(), 0);
    }

    fn pod_watch(idle: Duration) -> WatchParams<'static> {
        WatchParams {
            label_selector: None,
            resource_version: "",
            timeout_seconds: 60,
            idle_timeout: idle,
        }
    }

    /// Runs `f` on a thread and gives up after `bound`: a read that waits forever must fail
    /// the test, not hang it.
    fn bounded<T: Send + 'static>(bound: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(bound)
            .expect("still waiting: the idle timeout did not fire")
    }

    #[test]
    fn a_watch_that_goes_silent_on_an_open_connection_fails_after_its_idle_timeout() {
        let (server, client) = against(kube_testserver::Options {
            bookmark_interval: Duration::from_millis(200),
            ..Default::default()
        });
        let idle = Duration::from_millis(800);
        let mut stream = client
            .watch(Resource::PODS, Some("default"), &pod_watch(idle))
            .unwrap();
        // Bookmarks every 0.2 s keep a watch with a 0.8 s idle limit going.
        let talking = Instant::now();
        while talking.elapsed() < Duration::from_millis(1500) {
            let mut line = String::new();
            let n = stream
                .read_line(&mut line)
                .expect("bookmarks keep it alive");
            assert!(n > 0 && line.contains("BOOKMARK"), "{line:?}");
        }
        server.freeze_watches();
        let frozen = Instant::now();
        let (err, took) = bounded(Duration::from_secs(20), move || {
            let mut line = String::new();
            loop {
                line.clear();
                // Bookmarks the server had sent before the freeze may still be on their way.
                if let Err(e) = stream.read_line(&mut line) {
                    return (e, frozen.elapsed());
                }
            }
        });
        assert_eq!(err.kind(), std::io::ErrorKind::TimedOut, "{err}");
        assert!(
            took >= Duration::from_millis(500) && took < Duration::from_secs(5),
            "{took:?}"
        );
        assert_eq!(server.open_watches(), 1, "the server never closed it");
    }

    #[test]
    fn a_watch_whose_answer_never_comes_fails_after_its_idle_timeout_even_after_other_requests() {
        let (server, client) = against_test_server();
        // A pooled connection now exists; a watch must not read its head there without a limit.
        assert!(client.get_pod("default", "x").unwrap_err().is_not_found());
        server.stall(kube_testserver::StallRule {
            verb: Some("watch".into()),
            ..Default::default()
        });
        let started = Instant::now();
        let idle = Duration::from_millis(500);
        let result = bounded(Duration::from_secs(20), move || {
            client
                .watch(Resource::PODS, Some("default"), &pod_watch(idle))
                .map(drop)
        });
        let took = started.elapsed();
        assert!(matches!(result, Err(Error::Transport(_))), "{result:?}");
        assert!(
            took >= Duration::from_millis(400) && took < Duration::from_secs(5),
            "{took:?}"
        );
    }

    #[test]
    fn a_watch_body_ends_at_its_deadline_however_much_it_is_sent() {
        let mut body = WatchBody {
            inner: Box::new(std::io::repeat(b'x')),
            deadline: Instant::now() + Duration::from_millis(100),
            idle: Duration::from_secs(60),
        };
        let mut buf = [0u8; 64];
        assert_eq!(body.read(&mut buf).unwrap(), 64);
        std::thread::sleep(Duration::from_millis(150));
        let e = body.read(&mut buf).unwrap_err();
        assert_ne!(
            e.kind(),
            std::io::ErrorKind::TimedOut,
            "not taken for silence"
        );
        assert!(e.to_string().contains("outlived"), "{e}");
    }

    /// A TCP relay to `port` on 127.0.0.1 that counts the connections made through it and
    /// those still open.
    fn relay(
        port: u16,
    ) -> (
        u16,
        Arc<std::sync::atomic::AtomicUsize>,
        Arc<std::sync::atomic::AtomicUsize>,
    ) {
        use std::net::{Shutdown, TcpListener, TcpStream};
        use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let local = listener.local_addr().unwrap().port();
        let (made, open) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (m, o) = (made.clone(), open.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(client) = conn else { return };
                let Ok(server) = TcpStream::connect(("127.0.0.1", port)) else {
                    return;
                };
                m.fetch_add(1, SeqCst);
                o.fetch_add(1, SeqCst);
                let (mut c2, mut s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut s2, &mut c2);
                    let _ = c2.shutdown(Shutdown::Write);
                });
                let o = o.clone();
                std::thread::spawn(move || {
                    let (mut client, mut server) = (client, server);
                    // The client closing its side is what this counts.
                    let _ = std::io::copy(&mut client, &mut server);
                    let _ = server.shutdown(Shutdown::Write);
                    o.fetch_sub(1, SeqCst);
                });
            }
        });
        (local, made, open)
    }

    #[test]
    fn an_unpooled_client_closes_each_connection_and_a_pooled_one_keeps_one() {
        use std::sync::atomic::Ordering::SeqCst;
        let server =
            kube_testserver::TestServer::start(kube_testserver::Options::default()).unwrap();
        let (port, made, open) = relay(server.port());
        let opts = crate::kube::config::LoadOptions {
            kubeconfig: Some(server.kubeconfig_path()),
            context: None,
        };
        let mut config = crate::kube::config::load(&opts).unwrap();
        config.server = format!("https://127.0.0.1:{port}");
        let client = Client::new(config, 2).unwrap();
        let settled = |want_open: usize| {
            let deadline = Instant::now() + Duration::from_secs(5);
            while open.load(SeqCst) != want_open && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            (made.load(SeqCst), open.load(SeqCst))
        };
        for _ in 0..3 {
            assert!(client
                .unpooled()
                .get_pod("default", "x")
                .unwrap_err()
                .is_not_found());
        }
        assert_eq!(settled(0), (3, 0), "one connection each, none left open");
        for _ in 0..3 {
            assert!(client.get_pod("default", "x").unwrap_err().is_not_found());
        }
        assert_eq!(
            settled(1),
            (4, 1),
            "one connection, kept for the next request"
        );
    }

    #[test]
    fn a_request_with_no_time_left_before_its_deadline_is_not_sent() {
        let (server, client) = against_test_server();
        let e = client
            .until(Instant::now())
            .create_pod("default", &a_pod("p"))
            .unwrap_err();
        assert!(e.to_string().contains("no time left"), "{e}");
        assert_eq!(pod_creates(&server), 0);
    }

    #[test]
    fn a_client_with_a_deadline_does_not_retry_throttling() {
        let (server, client) = against_test_server();
        throttle(&server, 503, 1);
        let e = client
            .until(Instant::now() + Duration::from_secs(1))
            .get_pod("default", "x")
            .unwrap_err();
        assert_eq!(e.code(), 503);
        assert_eq!(pod_gets(&server), 1);
    }
}
