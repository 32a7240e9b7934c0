//! End-to-end harness: a cluster per test (the in-memory test server, or a real one named by
//! `IMMORTAL_E2E_KUBECONFIG`), a raw JSON client of its own, the operator as a child process,
//! and bounded polling with the convergence checks every scenario shares.
//!
//! The raw client is deliberately independent of the operator's typed client: the thing under
//! test must not grade itself. It only borrows `immortal_operator::kube::config` to read the
//! kubeconfig (server, CA, credentials), which has its own tests.

// Each test crate under tests/ compiles this module and uses only part of it.
#![allow(dead_code)]

use immortal_operator::kube::auth::Credentials;
use immortal_operator::kube::client::transport;
use immortal_operator::kube::config::{self, LoadOptions};
use kube_testserver::{Options, TestServer};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub const GROUP_VERSION: &str = "immortalcontainer.flugel.it/v1alpha1";
pub const KIND: &str = "ImmortalContainer";
pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
pub const MANAGED_BY_VALUE: &str = "immortal-operator";
pub const OWNER_UID_LABEL: &str = "immortalcontainer.flugel.it/owner-uid";
pub const IMAGE_ANNOTATION: &str = "immortalcontainer.flugel.it/image";
pub const SPEC_HASH_ANNOTATION: &str = "immortalcontainer.flugel.it/spec-hash";
pub const CONTAINER: &str = "acontainer";
pub const COUNT_FINALIZER: &str = "immortalcontainer.flugel.it/count-start";
pub const POD_SUFFIX: &str = "-immortalpod";
const CRD_NAME: &str = "immortalcontainers.immortalcontainer.flugel.it";
const CRD_PATH: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/config/crd/immortalcontainers.yaml"
);

/// Environment variable naming a file to which every skipped scenario appends a line (the
/// real-cluster tier lists them at its end).
pub const SKIPS_ENV: &str = "IMMORTAL_E2E_SKIPS";

/// Says that the running scenario is skipped here, and why: `SKIPPED test_name: why` on
/// stderr, and a line in `$IMMORTAL_E2E_SKIPS` when set. The caller then returns.
pub fn skipped(why: &str) {
    let thread = std::thread::current();
    let line = format!("SKIPPED {}: {why}", thread.name().unwrap_or("a scenario"));
    eprintln!("{line}");
    if let Some(path) = std::env::var_os(SKIPS_ENV).filter(|p| !p.is_empty()) {
        let written = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| writeln!(f, "{line}"));
        if let Err(e) = written {
            panic!("cannot append to {}: {e}", Path::new(&path).display());
        }
    }
}

/// Environment variable naming a real cluster's kubeconfig; unset: the test server.
pub const KUBECONFIG_ENV: &str = "IMMORTAL_E2E_KUBECONFIG";
/// When set, scratch directories (operator logs) are kept also for passing tests.
pub const KEEP_ENV: &str = "IMMORTAL_E2E_KEEP";
/// Multiplies every bound (default 1 on the test server, 4 on a real cluster).
pub const TIMEOUT_SCALE_ENV: &str = "IMMORTAL_E2E_TIMEOUT_SCALE";
/// The operator binary to test; unset: the one cargo built for this test run. Set it to the
/// shipped static build to test what the image runs.
pub const OPERATOR_ENV: &str = "IMMORTAL_E2E_OPERATOR";
/// A real cluster's audit log of pod creates, JSON lines (tests/real-cluster.sh writes one):
/// what a scenario counts the accepted creates against.
pub const AUDIT_LOG_ENV: &str = "IMMORTAL_E2E_AUDIT_LOG";

/// The operator binary the scenarios start.
pub fn operator_binary() -> PathBuf {
    std::env::var_os(OPERATOR_ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_immortal-operator")))
}

/// First image the scenarios run. On a real cluster it is really pulled and started, so a tiny
/// image that runs forever (pause) keeps the pods alive; overridable for air-gapped clusters.
pub fn image() -> String {
    std::env::var("IMMORTAL_E2E_IMAGE").unwrap_or_else(|_| "registry.k8s.io/pause:3.9".into())
}

/// The image a spec change switches to.
pub fn other_image() -> String {
    std::env::var("IMMORTAL_E2E_IMAGE2").unwrap_or_else(|_| "registry.k8s.io/pause:3.10".into())
}

pub fn pod_name(ic: &str) -> String {
    format!("{ic}{POD_SUFFIX}")
}

/// What a harness API call can fail with.
#[derive(Debug, Clone)]
pub enum Error {
    /// The server answered with a status outside 2xx. 429, 500, 503 and 504 were retried by
    /// [`Api::request`] first (they are what fault injection and an overloaded server send);
    /// anything else is returned at once.
    Status {
        code: u16,
        reason: String,
        message: String,
    },
    /// No HTTP answer (connection refused or reset, TLS failure, timeout). Retried by
    /// [`Api::request`], then returned.
    Transport(String),
    /// A 2xx answer whose body is not JSON. Not retried.
    Decode(String),
    /// The kubeconfig's credentials could not produce an Authorization header. Not retried.
    Credentials(String),
}

impl Error {
    pub fn code(&self) -> Option<u16> {
        match self {
            Error::Status { code, .. } => Some(*code),
            _ => None,
        }
    }

    pub fn is_not_found(&self) -> bool {
        self.code() == Some(404)
    }

    fn is_transient(&self) -> bool {
        matches!(self, Error::Transport(_)) || matches!(self.code(), Some(429 | 500 | 503 | 504))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Status {
                code,
                reason,
                message,
            } => write!(f, "{code} {reason}: {message}"),
            Error::Transport(e) => write!(f, "transport: {e}"),
            Error::Decode(e) => write!(f, "decode: {e}"),
            Error::Credentials(e) => write!(f, "credentials: {e}"),
        }
    }
}

/// A raw JSON client for the Kubernetes API, built from a kubeconfig.
#[derive(Clone)]
pub struct Api {
    agent: ureq::Agent,
    server: String,
    credentials: Arc<Credentials>,
}

/// One answer: the status code, the `Retry-After` seconds if any, the body.
struct Answer {
    code: u16,
    retry_after: Option<u64>,
    body: String,
}

impl Api {
    pub fn from_kubeconfig(path: &Path) -> Api {
        let opts = LoadOptions {
            kubeconfig: Some(path.to_path_buf()),
            context: None,
        };
        let config = config::load(&opts)
            .unwrap_or_else(|e| panic!("cannot load kubeconfig {}: {e}", path.display()));
        let tls = config
            .tls_config()
            .unwrap_or_else(|e| panic!("cannot build tls config: {e}"));
        // A cluster reached through a proxy is reached through it by the harness too.
        let proxy = config.proxy.as_ref().map(|p| p.ureq.clone());
        // A watch is never made here, so no request legitimately takes long.
        let agent_config = transport::config(proxy, 4)
            .timeout_global(Some(Duration::from_secs(30)))
            .build();
        let agent = transport::agent_with(tls, agent_config);
        Api {
            agent,
            server: config.server.trim_end_matches('/').to_string(),
            credentials: config.credentials.clone(),
        }
    }

    /// One attempt, no retry: `Ok` for 2xx (body parsed; an empty body is `null`).
    pub fn try_request(
        &self,
        method: &str,
        path: &str,
        content_type: &str,
        body: Option<&Value>,
    ) -> Result<Value, Error> {
        self.send(method, path, content_type, body).and_then(decode)
    }

    /// [`Api::try_request`], retrying transient failures (honouring `Retry-After`, at most
    /// 2 s per wait) for up to ~20 s. Safe to retry: an injected fault or a 429 answers before
    /// the request is acted on.
    pub fn request(
        &self,
        method: &str,
        path: &str,
        content_type: &str,
        body: Option<&Value>,
    ) -> Result<Value, Error> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let (result, wait) = match self.send(method, path, content_type, body) {
                Ok(a) => {
                    let wait = a.retry_after.map(|s| Duration::from_secs(s.min(2)));
                    (decode(a), wait)
                }
                Err(e) => (Err(e), None),
            };
            match result {
                Err(e) if e.is_transient() && Instant::now() < deadline => {
                    std::thread::sleep(wait.unwrap_or(Duration::from_millis(100)));
                }
                other => return other,
            }
        }
    }

    fn send(
        &self,
        method: &str,
        path: &str,
        content_type: &str,
        body: Option<&Value>,
    ) -> Result<Answer, Error> {
        let mut req = ureq::http::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.server))
            .header("Accept", "application/json");
        let auth = self
            .credentials
            .authorization()
            .map_err(|e| Error::Credentials(e.to_string()))?;
        if let Some(a) = auth {
            req = req.header("Authorization", a);
        }
        let sent = match body {
            Some(b) => req
                .header("Content-Type", content_type)
                .body(b.to_string())
                .map(|r| self.agent.run(r)),
            None => req.body(()).map(|r| self.agent.run(r)),
        };
        let transport = |e: String| Error::Transport(e);
        let resp = sent.map_err(|e| transport(e.to_string()))?;
        let resp = resp.map_err(|e| transport(e.to_string()))?;
        let code = resp.status().as_u16();
        let retry_after = resp
            .headers()
            .get("Retry-After")
            .and_then(|v| v.to_str().ok())
            .and_then(|s| s.trim().parse().ok());
        let mut body = String::new();
        resp.into_body()
            .into_reader()
            .take(64 << 20)
            .read_to_string(&mut body)
            .map_err(|e| Error::Transport(format!("reading body: {e}")))?;
        Ok(Answer {
            code,
            retry_after,
            body,
        })
    }

    pub fn get(&self, path: &str) -> Result<Value, Error> {
        self.request("GET", path, "", None)
    }

    pub fn post(&self, path: &str, body: &Value) -> Result<Value, Error> {
        self.request("POST", path, "application/json", Some(body))
    }

    pub fn merge_patch(&self, path: &str, body: &Value) -> Result<Value, Error> {
        self.request("PATCH", path, "application/merge-patch+json", Some(body))
    }

    pub fn delete(&self, path: &str, body: Option<&Value>) -> Result<Value, Error> {
        self.request("DELETE", path, "application/json", body)
    }
}

fn decode(a: Answer) -> Result<Value, Error> {
    if (200..300).contains(&a.code) {
        if a.body.trim().is_empty() {
            return Ok(Value::Null);
        }
        return serde_json::from_str(&a.body)
            .map_err(|e| Error::Decode(format!("{e} in {:.200}", a.body)));
    }
    // Errors are Status objects (fixtures `*-get-not-found`, `*-forbidden-*`...); a proxy in
    // front of a real cluster may answer anything, so fall back to the raw body.
    let status: Value = serde_json::from_str(&a.body).unwrap_or(Value::Null);
    Err(Error::Status {
        code: a.code,
        reason: status["reason"].as_str().unwrap_or("").to_string(),
        message: status["message"]
            .as_str()
            .map_or_else(|| format!("{:.200}", a.body), str::to_string),
    })
}

/// Which API server a test talks to.
enum Backend {
    /// A fresh in-memory server, owned by the test (shared with its [`Cluster::sibling`]s);
    /// fault injection available.
    TestServer(Arc<TestServer>),
    /// A real cluster shared by every test of the run.
    Real,
}

/// One test's cluster and namespace. Dropping it deletes the namespace (and with it everything
/// the test created), also when the test failed; the scratch directory (operator log) is kept
/// when the test failed and removed otherwise.
pub struct Cluster {
    backend: Backend,
    pub api: Api,
    pub ns: String,
    kubeconfig: PathBuf,
    dir: PathBuf,
}

static CRD_READY: Mutex<bool> = Mutex::new(false);

impl Cluster {
    /// A cluster for `scenario` (a short lowercase slug used in the namespace name).
    pub fn new(scenario: &str) -> Cluster {
        let suffix = random_suffix();
        let mut slug: String = scenario
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_lowercase()
                } else {
                    '-'
                }
            })
            .collect();
        // A namespace is a DNS-1123 label: at most 63 characters.
        slug.truncate(63 - "e2e--".len() - suffix.len());
        let ns = format!("e2e-{}-{suffix}", slug.trim_end_matches('-'));
        let dir = scratch_root().join(&ns);
        create_scratch(&dir);

        let (backend, kubeconfig) = match std::env::var_os(KUBECONFIG_ENV).filter(|v| !v.is_empty())
        {
            Some(path) => (Backend::Real, PathBuf::from(path)),
            None => {
                // The CRD is installed through the API below, as on a real cluster, so that
                // path of the harness is exercised on every run.
                let opts = Options {
                    install_crd: false,
                    ..Options::default()
                };
                let server = TestServer::start(opts)
                    .unwrap_or_else(|e| panic!("cannot start the test server: {e}"));
                let path = server.kubeconfig_path();
                (Backend::TestServer(Arc::new(server)), path)
            }
        };
        let api = Api::from_kubeconfig(&kubeconfig);
        let cluster = Cluster {
            backend,
            api,
            ns,
            kubeconfig,
            dir,
        };
        cluster.install_crd();
        cluster
            .api
            .post(
                "/api/v1/namespaces",
                &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": cluster.ns}}),
            )
            .unwrap_or_else(|e| panic!("cannot create namespace {}: {e}", cluster.ns));
        cluster
    }

    /// Another namespace of the same cluster, `NS-TAG` after this one's, with every helper
    /// of its own, deleted when dropped as this one is: for scenarios that span namespaces.
    pub fn sibling(&self, tag: &str) -> Cluster {
        let mut base = self.ns.clone();
        base.truncate(63 - tag.len() - 1);
        let ns = format!("{}-{tag}", base.trim_end_matches('-'));
        let dir = scratch_root().join(&ns);
        create_scratch(&dir);
        let backend = match &self.backend {
            Backend::TestServer(s) => Backend::TestServer(s.clone()),
            Backend::Real => Backend::Real,
        };
        let sibling = Cluster {
            backend,
            api: self.api.clone(),
            ns,
            kubeconfig: self.kubeconfig.clone(),
            dir,
        };
        sibling
            .api
            .post(
                "/api/v1/namespaces",
                &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": sibling.ns}}),
            )
            .unwrap_or_else(|e| panic!("cannot create namespace {}: {e}", sibling.ns));
        sibling
    }

    /// A ServiceAccount `name` in this namespace and a token for it (a TokenRequest, as
    /// `kubectl create token` asks, valid an hour).
    pub fn service_account_token(&self, name: &str) -> String {
        let accounts = format!("/api/v1/namespaces/{}/serviceaccounts", self.ns);
        self.api
            .post(
                &accounts,
                &json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}}),
            )
            .unwrap_or_else(|e| panic!("cannot create ServiceAccount {name}: {e}"));
        let request = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
            "spec": {"expirationSeconds": 3600}});
        let answer = self
            .api
            .post(&format!("{accounts}/{name}/token"), &request)
            .unwrap_or_else(|e| panic!("cannot get a token for ServiceAccount {name}: {e}"));
        answer["status"]["token"]
            .as_str()
            .unwrap_or_else(|| panic!("a TokenRequest without a token: {answer}"))
            .to_string()
    }

    /// A copy of the cluster's kubeconfig in the test's directory, named `name`, whose current
    /// context's user authenticates with `token` instead (the cluster, CA and proxy kept).
    pub fn token_kubeconfig(&self, name: &str, token: &str) -> PathBuf {
        let path = self.edited_kubeconfig(name, |_| {});
        let text = fs::read_to_string(&path).unwrap();
        let mut config: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
        let context = config["current-context"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let user = config["contexts"]
            .as_sequence()
            .and_then(|cs| cs.iter().find(|c| c["name"].as_str() == Some(&context)))
            .and_then(|c| c["context"]["user"].as_str())
            .unwrap_or_else(|| panic!("no user for current-context {context:?}"))
            .to_string();
        let entry = config
            .get_mut("users")
            .and_then(|u| u.as_sequence_mut())
            .and_then(|us| us.iter_mut().find(|u| u["name"].as_str() == Some(&user)))
            .unwrap_or_else(|| panic!("no user {user:?}"));
        let mut body = serde_yaml::Mapping::new();
        body.insert("token".into(), token.into());
        entry["user"] = serde_yaml::Value::Mapping(body);
        fs::write(&path, serde_yaml::to_string(&config).unwrap())
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
        path
    }

    /// The test server, or `None` (after printing why the scenario is skipped) on a real
    /// cluster.
    pub fn test_server_or_skip(&self, scenario: &str) -> Option<&TestServer> {
        match &self.backend {
            Backend::TestServer(s) => Some(&**s),
            Backend::Real => {
                skipped(&format!("needs the test server ({scenario})"));
                None
            }
        }
    }

    /// Whether the cluster's nodes run containers for real. kubemark's hollow node (the real
    /// kubelet over a fake runtime, `fakeRuntime://`) pulls every image and never lets a
    /// container exit: `false` there, after printing why the scenario is skipped.
    pub fn real_containers_or_skip(&self, scenario: &str) -> bool {
        if !self.is_real() {
            return true;
        }
        let nodes = self
            .api
            .get("/api/v1/nodes")
            .unwrap_or_else(|e| panic!("cannot list nodes: {e}"));
        let fake = nodes["items"].as_array().is_some_and(|ns| {
            !ns.is_empty()
                && ns.iter().all(|n| {
                    n["status"]["nodeInfo"]["containerRuntimeVersion"]
                        .as_str()
                        .is_some_and(|v| v.starts_with("fakeRuntime://"))
                })
        });
        if fake {
            skipped(&format!(
                "the cluster's nodes run a fake container runtime (kubemark's hollow node), \
                 where every image pulls and no container exits ({scenario})"
            ));
        }
        !fake
    }

    /// Starts keeping what [`Cluster::accepted_pod_creates`] counts: the test server's request
    /// log (a real cluster's audit log keeps itself).
    pub fn record_pod_creates(&self) {
        if let Some(s) = self.test_server() {
            s.record_requests();
        }
    }

    /// How many pod creates the API server accepted (201) in this namespace, by its own record:
    /// the test server's request log, or the audit log [`AUDIT_LOG_ENV`] names; `None`, said
    /// as skipped, on a real cluster without one.
    pub fn accepted_pod_creates(&self) -> Option<usize> {
        let pods = format!("/api/v1/namespaces/{}/pods", self.ns);
        if let Some(s) = self.test_server() {
            let log = s.request_log();
            let creates = log.iter().filter(|l| {
                l.verb == "create"
                    && l.resource == "pods"
                    && l.code == 201
                    && l.target.starts_with(&pods)
            });
            return Some(creates.count());
        }
        let Some(path) = std::env::var_os(AUDIT_LOG_ENV) else {
            skipped(&format!(
                "no audit log to count pod creates against ({AUDIT_LOG_ENV})"
            ));
            return None;
        };
        let text = fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!(
                "cannot read the audit log {}: {e}",
                Path::new(&path).display()
            )
        });
        let creates = text
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|e| {
                e["stage"] == "ResponseComplete"
                    && e["verb"] == "create"
                    && e["objectRef"]["resource"] == "pods"
                    && e["objectRef"]["subresource"].is_null()
                    && e["objectRef"]["namespace"] == self.ns.as_str()
                    && e["responseStatus"]["code"] == 201
            });
        Some(creates.count())
    }

    /// Whether the API server's own pod schema (`/openapi/v3/api/v1`) has `field` in the
    /// core/v1 type `kind` (`PodSecurityContext`): what it keeps of a pod.
    pub fn knows_pod_field(&self, kind: &str, field: &str) -> bool {
        let doc = self
            .api
            .get("/openapi/v3/api/v1")
            .unwrap_or_else(|e| panic!("cannot read the core/v1 OpenAPI: {e}"));
        let schema = &doc["components"]["schemas"][format!("io.k8s.api.core.v1.{kind}")];
        assert!(schema.is_object(), "no {kind} in the core/v1 OpenAPI");
        !schema["properties"][field].is_null()
    }

    /// The test server when there is one, without printing anything.
    pub fn test_server(&self) -> Option<&TestServer> {
        match &self.backend {
            Backend::TestServer(s) => Some(&**s),
            Backend::Real => None,
        }
    }

    pub fn is_real(&self) -> bool {
        matches!(self.backend, Backend::Real)
    }

    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// The API server's `host:port`, as a proxy is asked to `CONNECT` to it.
    pub fn api_server(&self) -> String {
        let (scheme, rest) = self.api.server.split_once("://").unwrap_or(("https", ""));
        let authority = rest.split('/').next().unwrap_or_default();
        match authority.rsplit_once(':') {
            Some((_, port)) if !port.ends_with(']') => authority.to_string(),
            _ if scheme == "http" => format!("{authority}:80"),
            _ => format!("{authority}:443"),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `base` scaled for the backend: pods really start (and images pull) on a real cluster.
    pub fn timeout(&self, base: Duration) -> Duration {
        let default = if self.is_real() { 4.0 } else { 1.0 };
        let scale = std::env::var(TIMEOUT_SCALE_ENV)
            .ok()
            .and_then(|s| s.parse::<f64>().ok())
            .filter(|s| s.is_finite() && *s > 0.0)
            .unwrap_or(default);
        base.mul_f64(scale)
    }

    /// Creates the CRD (AlreadyExists is fine) and waits until it is Established: once per
    /// process on a real cluster, once per server otherwise.
    fn install_crd(&self) {
        if !self.is_real() {
            return self.create_crd();
        }
        let mut done = CRD_READY.lock().unwrap_or_else(|e| e.into_inner());
        if !*done {
            self.create_crd();
            *done = true;
        }
    }

    /// Creates (or replaces) the CRD of this checkout and waits until it is Established.
    pub fn create_crd(&self) {
        let yaml =
            fs::read_to_string(CRD_PATH).unwrap_or_else(|e| panic!("cannot read {CRD_PATH}: {e}"));
        let crd: Value = serde_yaml::from_str(&yaml)
            .unwrap_or_else(|e| panic!("{CRD_PATH} is not valid yaml: {e}"));
        self.apply_crd(&crd);
        // The API server serves the new resource only once the CRD is Established.
        let path = format!("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{CRD_NAME}");
        wait_until(
            self.timeout(Duration::from_secs(30)),
            "the CRD to be Established",
            || {
                let crd = self.api.get(&path).map_err(|e| e.to_string())?;
                match condition(&crd, "Established") {
                    Some(c) if c["status"] == "True" => Ok(()),
                    _ => Err(format!("status: {}", crd["status"])),
                }
            },
        );
    }

    /// Creates the CRD, or replaces the one installed (an older version of this project's,
    /// left by an earlier run, would lack what the scenarios test: its CEL rules, new status
    /// fields).
    pub fn apply_crd(&self, crd: &Value) {
        const CRDS: &str = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions";
        match self.api.post(CRDS, crd) {
            Ok(_) => {}
            Err(e) if e.code() == Some(409) => {
                // Each test process of the suite installs it, so another may update it between
                // the read and the write: read again, as a controller would.
                let path = format!("{CRDS}/{CRD_NAME}");
                let mut conflicts = 0;
                loop {
                    let have = self
                        .api
                        .get(&path)
                        .unwrap_or_else(|e| panic!("cannot read the installed CRD: {e}"));
                    let mut want = crd.clone();
                    want["metadata"]["resourceVersion"] =
                        have["metadata"]["resourceVersion"].clone();
                    match self
                        .api
                        .request("PUT", &path, "application/json", Some(&want))
                    {
                        Ok(_) => break,
                        Err(e) if e.code() == Some(409) && conflicts < 20 => conflicts += 1,
                        Err(e) => panic!("cannot update the installed CRD: {e}"),
                    }
                }
            }
            Err(e) => panic!("cannot create the CRD: {e}"),
        }
    }

    /// The CRD of this checkout (config/crd), as JSON.
    pub fn crd(&self) -> Value {
        let yaml =
            fs::read_to_string(CRD_PATH).unwrap_or_else(|e| panic!("cannot read {CRD_PATH}: {e}"));
        serde_yaml::from_str(&yaml).unwrap_or_else(|e| panic!("{CRD_PATH} is not valid yaml: {e}"))
    }

    /// Creates an object, answering the API server's refusal instead of panicking on it.
    pub fn try_create_ic(&self, name: &str, image: &str) -> Result<Value, Error> {
        let body = json!({
            "apiVersion": GROUP_VERSION, "kind": KIND,
            "metadata": {"name": name, "namespace": self.ns},
            "spec": {"image": image},
        });
        self.api.try_request(
            "POST",
            &format!(
                "/apis/{GROUP_VERSION}/namespaces/{}/immortalcontainers",
                self.ns
            ),
            "application/json",
            Some(&body),
        )
    }

    fn ic_path(&self, name: &str) -> String {
        format!(
            "/apis/{GROUP_VERSION}/namespaces/{}/immortalcontainers/{name}",
            self.ns
        )
    }

    fn pod_path(&self, name: &str) -> String {
        format!("/api/v1/namespaces/{}/pods/{name}", self.ns)
    }

    pub fn create_ic(&self, name: &str, image: &str) -> Value {
        let body = json!({
            "apiVersion": GROUP_VERSION, "kind": KIND,
            "metadata": {"name": name, "namespace": self.ns},
            "spec": {"image": image},
        });
        self.api
            .post(
                &format!(
                    "/apis/{GROUP_VERSION}/namespaces/{}/immortalcontainers",
                    self.ns
                ),
                &body,
            )
            .unwrap_or_else(|e| panic!("cannot create immortalcontainer {name}: {e}"))
    }

    pub fn get_ic(&self, name: &str) -> Result<Option<Value>, Error> {
        found(self.api.get(&self.ic_path(name)))
    }

    /// Panics when the object is missing or cannot be read.
    pub fn ic(&self, name: &str) -> Value {
        match self.get_ic(name) {
            Ok(Some(v)) => v,
            Ok(None) => panic!("immortalcontainer {name} not found"),
            Err(e) => panic!("cannot get immortalcontainer {name}: {e}"),
        }
    }

    pub fn list_ics(&self) -> Result<Vec<Value>, Error> {
        let list = self.api.get(&format!(
            "/apis/{GROUP_VERSION}/namespaces/{}/immortalcontainers",
            self.ns
        ))?;
        Ok(items(list))
    }

    pub fn delete_ic(&self, name: &str) {
        self.api
            .delete(&self.ic_path(name), None)
            .unwrap_or_else(|e| panic!("cannot delete immortalcontainer {name}: {e}"));
    }

    pub fn set_image(&self, name: &str, image: &str) -> Value {
        self.api
            .merge_patch(&self.ic_path(name), &json!({"spec": {"image": image}}))
            .unwrap_or_else(|e| panic!("cannot patch immortalcontainer {name}: {e}"))
    }

    pub fn create_pod(&self, pod: &Value) -> Value {
        self.api
            .post(&format!("/api/v1/namespaces/{}/pods", self.ns), pod)
            .unwrap_or_else(|e| panic!("cannot create pod: {e}"))
    }

    pub fn get_pod(&self, name: &str) -> Result<Option<Value>, Error> {
        found(self.api.get(&self.pod_path(name)))
    }

    pub fn list_pods(&self) -> Result<Vec<Value>, Error> {
        Ok(items(
            self.api
                .get(&format!("/api/v1/namespaces/{}/pods", self.ns))?,
        ))
    }

    /// Pods labelled as the operator's.
    pub fn list_managed_pods(&self) -> Result<Vec<Value>, Error> {
        let path = format!(
            "/api/v1/namespaces/{}/pods?labelSelector={MANAGED_BY}%3D{MANAGED_BY_VALUE}",
            self.ns
        );
        Ok(items(self.api.get(&path)?))
    }

    /// Deletes the pod if it still has `uid` (a precondition, so a replacement is never hit).
    /// True when this call deleted it.
    pub fn delete_pod(&self, name: &str, uid: &str) -> bool {
        let opts =
            json!({"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": uid}});
        match self.api.delete(&self.pod_path(name), Some(&opts)) {
            Ok(_) => true,
            Err(e) if e.is_not_found() || e.code() == Some(409) => false,
            Err(e) => panic!("cannot delete pod {name}: {e}"),
        }
    }

    /// Deletes the pod if it still has `uid`, with `grace` seconds (`None`: the pod's own
    /// terminationGracePeriodSeconds), as `kubectl delete pod --grace-period=N`; `Some(0)` is
    /// `--grace-period=0 --force`. True when this call deleted it.
    pub fn delete_pod_with_grace(&self, name: &str, uid: &str, grace: Option<i64>) -> bool {
        let mut opts =
            json!({"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": uid}});
        if let Some(g) = grace {
            opts["gracePeriodSeconds"] = json!(g);
        }
        match self.api.delete(&self.pod_path(name), Some(&opts)) {
            Ok(_) => true,
            Err(e) if e.is_not_found() || e.code() == Some(409) => false,
            Err(e) => panic!("cannot delete pod {name}: {e}"),
        }
    }

    /// Evicts the pod through the eviction subresource, as `kubectl drain` does.
    pub fn evict_pod(&self, name: &str) {
        let body = json!({"apiVersion": "policy/v1", "kind": "Eviction",
            "metadata": {"name": name, "namespace": self.ns}});
        self.api
            .post(&format!("{}/eviction", self.pod_path(name)), &body)
            .unwrap_or_else(|e| panic!("cannot evict pod {name}: {e}"));
    }

    /// Merge-patches the pod (its spec, labels...).
    pub fn patch_pod(&self, name: &str, patch: &Value) -> Value {
        self.api
            .merge_patch(&self.pod_path(name), patch)
            .unwrap_or_else(|e| panic!("cannot patch pod {name}: {e}"))
    }

    /// Sets (or with `None` removes) a label on the test's namespace.
    pub fn label_namespace(&self, key: &str, value: Option<&str>) {
        self.api
            .merge_patch(
                &format!("/api/v1/namespaces/{}", self.ns),
                &json!({"metadata": {"labels": {key: value}}}),
            )
            .unwrap_or_else(|e| panic!("cannot label namespace {}: {e}", self.ns));
    }

    /// Waits for an Event of the test's namespace with `reason` whose message `says`; answers
    /// its message. Events are recorded on a thread of their own, a moment after their cause.
    pub fn wait_event(&self, reason: &str, says: impl Fn(&str) -> bool) -> String {
        let path = format!("/api/v1/namespaces/{}/events", self.ns);
        wait_until(
            self.timeout(Duration::from_secs(10)),
            &format!("a {reason} Event"),
            || {
                let events = items(self.api.get(&path).map_err(|e| e.to_string())?);
                let messages: Vec<&str> = events
                    .iter()
                    .filter(|e| e["reason"] == reason)
                    .filter_map(|e| e["message"].as_str())
                    .collect();
                match messages.iter().find(|m| says(m)) {
                    Some(m) => Ok(m.to_string()),
                    None => Err(format!("{reason} Events so far: {messages:?}")),
                }
            },
        )
    }

    /// Names of the cluster's nodes that accept pods (not cordoned).
    pub fn schedulable_nodes(&self) -> Vec<String> {
        let nodes = items(
            self.api
                .get("/api/v1/nodes")
                .unwrap_or_else(|e| panic!("cannot list nodes: {e}")),
        );
        nodes
            .iter()
            .filter(|n| n["spec"]["unschedulable"] != true)
            .map(|n| name(n).to_string())
            .collect()
    }

    /// Cordons every schedulable node, as `kubectl cordon` writes it, until the guard is
    /// dropped (also when the test fails): then exactly those nodes are uncordoned again.
    pub fn cordon_all(&self) -> Cordoned {
        let nodes = self.schedulable_nodes();
        assert!(!nodes.is_empty(), "the cluster has no schedulable node");
        let guard = Cordoned {
            api: self.api.clone(),
            nodes: nodes.clone(),
        };
        for n in &nodes {
            set_unschedulable(&self.api, n, true);
        }
        guard
    }

    /// A kubeconfig of the test server authenticating as the user `name`, allowed everything:
    /// so that what the operator sends can be told from (or cut off without) the harness's own.
    pub fn user_kubeconfig(&self, server: &TestServer, name: &str) -> PathBuf {
        let token = format!("{name}-token");
        server.add_user(
            name,
            &token,
            vec![kube_testserver::Rule::new(&["*"], &["*"])],
        );
        let path = self.dir().join(format!("{name}.kubeconfig"));
        server
            .write_kubeconfig(&path, &token)
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
        path
    }

    /// A copy of the cluster's kubeconfig in the test's directory, named `name`, with its
    /// current context's cluster passed through `edit`. Relative paths in the copy are made
    /// absolute, so that it works from there (a real cluster's kubeconfig may have them).
    pub fn edited_kubeconfig(
        &self,
        name: &str,
        edit: impl FnOnce(&mut serde_yaml::Mapping),
    ) -> PathBuf {
        self.edited_copy(&self.kubeconfig, name, edit)
    }

    /// [`Cluster::edited_kubeconfig`] of another kubeconfig (one of [`Cluster::user_kubeconfig`]).
    pub fn edited_copy(
        &self,
        kubeconfig: &Path,
        name: &str,
        edit: impl FnOnce(&mut serde_yaml::Mapping),
    ) -> PathBuf {
        let text = fs::read_to_string(kubeconfig)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", kubeconfig.display()));
        let mut config: serde_yaml::Value = serde_yaml::from_str(&text)
            .unwrap_or_else(|e| panic!("{} is not YAML: {e}", kubeconfig.display()));
        let base = kubeconfig.parent().unwrap_or(Path::new("/")).to_path_buf();
        let absolute = |v: &mut serde_yaml::Value, key: &str| {
            if let Some(p) = v.get_mut(key) {
                if let Some(rel) = p.as_str().filter(|s| !s.is_empty() && !s.starts_with('/')) {
                    if key != "command" || rel.contains('/') {
                        *p = base.join(rel).display().to_string().into();
                    }
                }
            }
        };
        for (_, c) in bodies(&mut config, "clusters", "cluster") {
            absolute(c, "certificate-authority");
        }
        for (_, u) in bodies(&mut config, "users", "user") {
            for key in ["client-certificate", "client-key", "tokenFile"] {
                absolute(u, key);
            }
            if let Some(exec) = u.get_mut("exec") {
                absolute(exec, "command");
            }
        }
        let context = config["current-context"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let cluster = config["contexts"]
            .as_sequence()
            .and_then(|cs| cs.iter().find(|c| c["name"].as_str() == Some(&context)))
            .and_then(|c| c["context"]["cluster"].as_str())
            .unwrap_or_else(|| panic!("no cluster for current-context {context:?}"))
            .to_string();
        let body = bodies(&mut config, "clusters", "cluster")
            .find(|(n, _)| *n == cluster)
            .and_then(|(_, b)| b.as_mapping_mut())
            .unwrap_or_else(|| panic!("no cluster {cluster:?}"));
        edit(body);
        let path = self.dir().join(name);
        fs::write(&path, serde_yaml::to_string(&config).unwrap())
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
        path
    }

    /// Cordons `node`, as `kubectl cordon` does, until the guard is dropped (also when the test
    /// fails).
    pub fn cordon(&self, node: &str) -> Cordoned {
        let guard = Cordoned {
            api: self.api.clone(),
            nodes: vec![node.to_string()],
        };
        set_unschedulable(&self.api, node, true);
        guard
    }

    /// Waits until the object's Ready condition has `status` and `reason`; returns the object.
    pub fn wait_ready(&self, name: &str, status: &str, reason: &str) -> Value {
        let what = format!("{}/{name} Ready={status} reason {reason}", self.ns);
        wait_until(self.timeout(Duration::from_secs(30)), &what, || {
            let ic = self
                .get_ic(name)
                .map_err(|e| e.to_string())?
                .ok_or("object gone")?;
            match condition(&ic, "Ready") {
                Some(c) if c["status"] == status && c["reason"] == reason => Ok(ic),
                other => Err(format!("Ready condition {other:?}")),
            }
        })
    }

    /// Merge-patches the pod's status subresource (as the kubelet reports a phase).
    pub fn patch_pod_status(&self, name: &str, patch: &Value) -> Value {
        self.api
            .merge_patch(&format!("{}/status", self.pod_path(name)), patch)
            .unwrap_or_else(|e| panic!("cannot patch status of pod {name}: {e}"))
    }

    /// Merge-patches the object's status subresource with `patch`, once, no retry.
    pub fn try_patch_ic_status(&self, name: &str, patch: &Value) -> Result<Value, Error> {
        self.api.try_request(
            "PATCH",
            &format!("{}/status", self.ic_path(name)),
            "application/merge-patch+json",
            Some(patch),
        )
    }

    /// Checks that `name` converged (see [`check_converged`]) with `start_times` pods counted;
    /// returns its pod.
    pub fn converged(&self, name: &str, start_times: i64) -> Result<Value, String> {
        let ic = self
            .get_ic(name)
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("immortalcontainer {name} not found"))?;
        let pods = self.list_managed_pods().map_err(|e| e.to_string())?;
        check_converged(&ic, &pods, start_times)
    }

    /// Asserts, once, that `name` converged with `start_times`; returns its pod.
    pub fn assert_converged(&self, name: &str, start_times: i64) -> Value {
        self.converged(name, start_times)
            .unwrap_or_else(|e| panic!("{}/{name} has not converged: {e}", self.ns))
    }

    /// Waits until `name` converged with `start_times` and `accept` holds for its pod.
    pub fn wait_converged(
        &self,
        name: &str,
        start_times: i64,
        accept: impl Fn(&Value) -> Result<(), String>,
    ) -> Value {
        let what = format!(
            "{}/{name} to converge with startTimes {start_times}",
            self.ns
        );
        wait_until(self.timeout(Duration::from_secs(30)), &what, || {
            let pod = self.converged(name, start_times)?;
            accept(&pod)?;
            Ok(pod)
        })
    }
}

impl Cluster {
    /// Checks every object of `want` (name → startTimes) converged, with one list of objects
    /// and one of pods, and that the operator labelled no other pod.
    pub fn converged_all(&self, want: &BTreeMap<String, i64>) -> Result<(), String> {
        let ics = self.list_ics().map_err(|e| e.to_string())?;
        let pods = self.list_managed_pods().map_err(|e| e.to_string())?;
        let mut pending = Vec::new();
        let mut first = None;
        for (n, starts) in want {
            let Some(ic) = ics.iter().find(|ic| name(ic) == n) else {
                return Err(format!("immortalcontainer {n} not found"));
            };
            if let Err(e) = check_converged(ic, &pods, *starts) {
                pending.push(n.as_str());
                first.get_or_insert(format!("{n}: {e}"));
            }
        }
        if let Some(first) = first {
            return Err(format!(
                "{} of {} not converged, e.g. {first}",
                pending.len(),
                want.len()
            ));
        }
        if pods.len() != want.len() {
            let names: Vec<&str> = pods.iter().map(name).collect();
            return Err(format!(
                "{} operator pods for {} objects: {names:?}",
                pods.len(),
                want.len()
            ));
        }
        Ok(())
    }

    /// Asserts that every object of `want` stays converged for `hold`: late duplicates or
    /// extra counts would show up here.
    pub fn assert_stays_converged(&self, want: &BTreeMap<String, i64>, hold: Duration) {
        let end = Instant::now() + hold;
        while Instant::now() < end {
            if let Err(e) = self.converged_all(want) {
                panic!("{} left convergence: {e}", self.ns);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // Deleting the namespace deletes everything the test made in it. Not waited for: the
        // namespace controller finishes on its own, and the name is never reused.
        if let Err(e) = self.api.try_request(
            "DELETE",
            &format!("/api/v1/namespaces/{}", self.ns),
            "",
            None,
        ) {
            eprintln!("e2e: cannot delete namespace {}: {e}", self.ns);
        }
        if std::thread::panicking() || std::env::var_os(KEEP_ENV).is_some() {
            eprintln!("e2e: scratch directory kept: {}", self.dir.display());
        } else {
            let _ = fs::remove_dir_all(&self.dir);
            // The shared parent goes with its last scratch directory, so that a passing run
            // leaves nothing in the temp directory (remove_dir refuses a non-empty one).
            let _ = fs::remove_dir(scratch_root());
        }
    }
}

/// Where every test keeps its scratch directory, one per namespace.
fn scratch_root() -> PathBuf {
    std::env::temp_dir().join("immortal-e2e")
}

/// Creates a scratch directory. Another test's drop may remove the empty shared parent between
/// creating it and creating `dir` inside it, so a vanished parent is tried again.
fn create_scratch(dir: &Path) {
    let mut tries = 0;
    loop {
        match fs::create_dir_all(dir) {
            Ok(()) => return,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && tries < 10 => tries += 1,
            Err(e) => panic!("cannot create {}: {e}", dir.display()),
        }
    }
}

/// Nodes cordoned by a test, uncordoned when dropped.
/// The `body` of every named entry of a kubeconfig's `list` (`clusters`/`cluster`, ...).
fn bodies<'a>(
    config: &'a mut serde_yaml::Value,
    list: &str,
    body: &'a str,
) -> impl Iterator<Item = (String, &'a mut serde_yaml::Value)> {
    config
        .get_mut(list)
        .and_then(|l| l.as_sequence_mut())
        .into_iter()
        .flatten()
        .filter_map(move |item| {
            let name = item["name"].as_str().unwrap_or_default().to_string();
            item.get_mut(body).map(|b| (name, b))
        })
}

pub struct Cordoned {
    api: Api,
    nodes: Vec<String>,
}

impl Cordoned {
    pub fn nodes(&self) -> &[String] {
        &self.nodes
    }

    /// Uncordons now (dropping the guard does the same).
    pub fn release(self) {}
}

impl Drop for Cordoned {
    fn drop(&mut self) {
        for n in &self.nodes {
            set_unschedulable(&self.api, n, false);
        }
    }
}

fn set_unschedulable(api: &Api, node: &str, on: bool) {
    let patch = json!({"spec": {"unschedulable": if on { json!(true) } else { Value::Null }}});
    if let Err(e) = api.request(
        "PATCH",
        &format!("/api/v1/nodes/{node}"),
        "application/strategic-merge-patch+json",
        Some(&patch),
    ) {
        // Leaving a node cordoned on someone's cluster must not go unnoticed.
        eprintln!("e2e: cannot set unschedulable={on} on node {node}: {e}");
        if !std::thread::panicking() {
            panic!("cannot set unschedulable={on} on node {node}: {e}");
        }
    }
}

fn items(list: Value) -> Vec<Value> {
    match list {
        Value::Object(mut m) => match m.remove("items") {
            Some(Value::Array(a)) => a,
            _ => Vec::new(),
        },
        _ => Vec::new(),
    }
}

/// A GET's answer, with NotFound as `None`.
pub fn found(r: Result<Value, Error>) -> Result<Option<Value>, Error> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(e),
    }
}

/// The Ready condition's message, or "".
pub fn reason_message(ic: &Value) -> String {
    condition(ic, "Ready")
        .and_then(|c| c["message"].as_str())
        .unwrap_or("")
        .to_string()
}

pub fn condition<'a>(obj: &'a Value, type_: &str) -> Option<&'a Value> {
    obj["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

pub fn uid(obj: &Value) -> &str {
    obj["metadata"]["uid"].as_str().unwrap_or("")
}

pub fn name(obj: &Value) -> &str {
    obj["metadata"]["name"].as_str().unwrap_or("")
}

/// The pods among `pods` whose controller reference names `owner_uid`.
pub fn controlled_pods<'a>(pods: &'a [Value], owner_uid: &str) -> Vec<&'a Value> {
    pods.iter()
        .filter(|p| {
            p["metadata"]["ownerReferences"]
                .as_array()
                .is_some_and(|refs| {
                    refs.iter()
                        .any(|r| r["uid"] == owner_uid && r["controller"] == true)
                })
        })
        .collect()
}

/// Whether the object `ic` converged, given the operator-labelled pods of its namespace:
/// exactly one pod controlled by it, named `<name>-immortalpod`, not terminating or
/// terminated, one container `acontainer` running `spec.image`, the controlling owner
/// reference, labels and image annotation; and status naming that pod, counting
/// `start_times`, having counted that very pod, observed the current generation, and Ready
/// True. `Err` says the first thing that does not hold.
pub fn check_converged(ic: &Value, pods: &[Value], start_times: i64) -> Result<Value, String> {
    let name = name(ic);
    let uid = uid(ic);
    let image = ic["spec"]["image"].as_str().unwrap_or("");
    let ours = controlled_pods(pods, uid);
    let [pod] = ours.as_slice() else {
        let names: Vec<&str> = ours.iter().map(|p| self::name(p)).collect();
        return Err(format!(
            "want exactly one pod controlled by {name}, have {names:?}; status {}",
            ic["status"]
        ));
    };
    let pod = *pod;
    let m = &pod["metadata"];
    let want_name = pod_name(name);
    check(self::name(pod) == want_name, || {
        format!("pod is named {:?}, want {want_name:?}", self::name(pod))
    })?;
    check(m["deletionTimestamp"].is_null(), || {
        format!("pod {} is terminating", self::name(pod))
    })?;
    let phase = pod["status"]["phase"].as_str().unwrap_or("");
    check(phase != "Failed" && phase != "Succeeded", || {
        format!("pod {} has phase {phase}", self::name(pod))
    })?;
    let mut containers = pod["spec"]["containers"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if !ic["spec"]["template"].is_null() {
        // A template's pod has its containers (sidecars too); ours is the one named acontainer.
        containers.retain(|c| c["name"] == CONTAINER);
    }
    check(containers.len() == 1, || {
        format!("pod has {} containers, want 1", containers.len())
    })?;
    check(containers[0]["name"] == CONTAINER, || {
        format!(
            "container is named {}, want {CONTAINER}",
            containers[0]["name"]
        )
    })?;
    check(containers[0]["image"] == image, || {
        format!("pod runs {}, spec.image is {image}", containers[0]["image"])
    })?;
    let refs = m["ownerReferences"].as_array().cloned().unwrap_or_default();
    let want_ref = json!({"apiVersion": GROUP_VERSION, "kind": KIND, "name": name, "uid": uid,
                          "controller": true, "blockOwnerDeletion": true});
    check(refs == vec![want_ref.clone()], || {
        format!("ownerReferences {refs:?}, want [{want_ref}]")
    })?;
    check(m["labels"][MANAGED_BY] == MANAGED_BY_VALUE, || {
        format!("labels {}", m["labels"])
    })?;
    check(m["labels"][OWNER_UID_LABEL] == uid, || {
        format!("labels {}, want {OWNER_UID_LABEL}={uid}", m["labels"])
    })?;
    check(m["annotations"][IMAGE_ANNOTATION] == image, || {
        format!(
            "annotations {}, want {IMAGE_ANNOTATION}={image}",
            m["annotations"]
        )
    })?;

    let st = &ic["status"];
    check(st["currentPod"] == want_name.as_str(), || {
        format!("status.currentPod {}, want {want_name}", st["currentPod"])
    })?;
    check(st["startTimes"] == start_times, || {
        format!(
            "status.startTimes {}, want {start_times}; status {st}",
            st["startTimes"]
        )
    })?;
    check(st["lastCountedPodUID"] == self::uid(pod), || {
        format!(
            "status.lastCountedPodUID {}, pod uid {}",
            st["lastCountedPodUID"],
            self::uid(pod)
        )
    })?;
    check(
        st["observedGeneration"] == ic["metadata"]["generation"],
        || {
            format!(
                "status.observedGeneration {}, generation {}",
                st["observedGeneration"], ic["metadata"]["generation"]
            )
        },
    )?;
    match condition(ic, "Ready") {
        Some(c) if c["status"] == "True" => {}
        other => {
            return Err(format!(
                "Ready condition {}, want True",
                other.cloned().unwrap_or(Value::Null)
            ))
        }
    }
    Ok(pod.clone())
}

fn check(ok: bool, why: impl FnOnce() -> String) -> Result<(), String> {
    if ok {
        Ok(())
    } else {
        Err(why())
    }
}

/// Polls `f` every 50 ms until it returns `Ok`, for at most `timeout`; then panics with
/// `what` and the last `Err`.
pub fn wait_until<T>(timeout: Duration, what: &str, f: impl FnMut() -> Result<T, String>) -> T {
    wait_until_every(timeout, Duration::from_millis(50), what, f)
}

/// [`wait_until`] with a chosen poll interval (for checks that list many objects).
pub fn wait_until_every<T>(
    timeout: Duration,
    every: Duration,
    what: &str,
    mut f: impl FnMut() -> Result<T, String>,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        let last = match f() {
            Ok(v) => return v,
            Err(e) => e,
        };
        if Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for {what}; last observed: {last}");
        }
        std::thread::sleep(every);
    }
}

/// The operator binary running against a cluster's namespace, its output in a log file under
/// the test's scratch directory. Dropping it kills it (SIGKILL), and when the test is failing
/// prints the log's tail.
pub struct Operator {
    child: Option<Child>,
    kubeconfig: PathBuf,
    /// What it serves (`--namespace`).
    namespaces: Vec<String>,
    extra_args: Vec<String>,
    log: PathBuf,
    runs: u32,
    /// The harness's own client, and how long the last check may wait (see `Drop`).
    api: Api,
    settle: Duration,
}

impl Operator {
    /// Starts the operator on the cluster's namespace, logging to `operator.log`.
    pub fn start(cluster: &Cluster) -> Operator {
        Operator::start_with(cluster, &[], "operator.log")
    }

    /// Starts the operator with `extra_args` after the usual flags, logging to `log_name` in
    /// the test's scratch directory (one name per replica when several run).
    pub fn start_with(cluster: &Cluster, extra_args: &[String], log_name: &str) -> Operator {
        Operator::start_as(cluster, cluster.kubeconfig(), extra_args, log_name)
    }

    /// [`Operator::start_with`], authenticating with `kubeconfig` instead of the cluster's:
    /// replicas with users of their own can be told apart in the test server's request log.
    pub fn start_as(
        cluster: &Cluster,
        kubeconfig: &Path,
        extra_args: &[String],
        log_name: &str,
    ) -> Operator {
        Operator::start_serving(cluster, kubeconfig, &[cluster], extra_args, log_name)
    }

    /// [`Operator::start_as`], serving the namespaces of `served` (`--namespace a,b`) instead
    /// of the cluster's; its log goes to the cluster's scratch directory.
    pub fn start_serving(
        cluster: &Cluster,
        kubeconfig: &Path,
        served: &[&Cluster],
        extra_args: &[String],
        log_name: &str,
    ) -> Operator {
        let mut op = Operator {
            child: None,
            kubeconfig: kubeconfig.to_path_buf(),
            namespaces: served.iter().map(|c| c.ns.clone()).collect(),
            extra_args: extra_args.to_vec(),
            log: cluster.dir().join(log_name),
            runs: 0,
            api: cluster.api.clone(),
            settle: cluster.timeout(Duration::from_secs(10)),
        };
        op.spawn();
        op
    }

    fn spawn(&mut self) {
        self.runs += 1;
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap_or_else(|e| panic!("cannot open {}: {e}", self.log.display()));
        let _ = writeln!(log, "=== e2e: operator run {} ===", self.runs);
        let err = log
            .try_clone()
            .unwrap_or_else(|e| panic!("cannot clone log handle: {e}"));
        let child = Command::new(operator_binary())
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args([
                "--namespace",
                &self.namespaces.join(","),
                "--log-format",
                "json",
            ])
            // Tests run side by side: the default :8080/:8081 listeners would collide. A
            // scenario that reads the probes names their address itself.
            .args(["--metrics-bind-address", "0"])
            .args(
                ["--health-probe-bind-address", "0"]
                    .into_iter()
                    .filter(|_| {
                        !self
                            .extra_args
                            .iter()
                            .any(|a| a.starts_with("--health-probe"))
                    }),
            )
            .args(&self.extra_args)
            .env("RUST_LOG", "debug")
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(err))
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start the operator: {e}"));
        self.child = Some(child);
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// Whether the operator's log holds `needle` so far.
    pub fn log_says(&self, needle: &str) -> bool {
        std::fs::read_to_string(&self.log)
            .map(|t| t.contains(needle))
            .unwrap_or(false)
    }

    /// Sends SIGTERM (the operator's orderly shutdown signal).
    pub fn sigterm(&self) {
        let pid = self.pid().to_string();
        let status = Command::new("kill").args(["-TERM", &pid]).status();
        assert!(
            matches!(status, Ok(s) if s.success()),
            "kill -TERM {pid} failed: {status:?}"
        );
    }

    /// SIGKILL and reap: the process dies wherever it was.
    pub fn sigkill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Waits up to `timeout` for the process to exit; `None` if it is still running.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        let child = self.child.as_mut()?;
        loop {
            match child.try_wait() {
                Ok(Some(s)) => {
                    self.child = None;
                    return Some(s);
                }
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                _ => return None,
            }
        }
    }

    /// SIGKILLs the running process, if any, and starts a new one.
    pub fn restart(&mut self) {
        self.sigkill();
        self.spawn();
    }

    /// The last `n` lines of the log.
    pub fn log_tail(&self, n: usize) -> String {
        let mut text = String::new();
        if let Ok(mut f) = File::open(&self.log) {
            let _ = f.read_to_string(&mut text);
        }
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}

impl Operator {
    /// The pods of the operator's namespaces that still hold our counting finalizer (whatever
    /// their labels), `None` when they cannot be listed.
    fn holding_pods(&self) -> Option<Vec<String>> {
        let mut held = Vec::new();
        for ns in &self.namespaces {
            let path = format!("/api/v1/namespaces/{ns}/pods");
            let list = self.api.try_request("GET", &path, "", None).ok()?;
            held.extend(
                items(list)
                    .iter()
                    .filter(|p| {
                        p["metadata"]["finalizers"]
                            .as_array()
                            .is_some_and(|f| f.iter().any(|f| f == COUNT_FINALIZER))
                    })
                    .map(|p| format!("{ns}/{} (uid {})", name(p), uid(p))),
            );
        }
        Some(held)
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        // Every scenario ends with no pod held by our finalizer once the operator settled:
        // nothing of ours may keep a pod (or its namespace) from going.
        if !std::thread::panicking() && self.child.is_some() {
            let deadline = Instant::now() + self.settle;
            let held = loop {
                match self.holding_pods() {
                    Some(h) if !h.is_empty() && Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(100))
                    }
                    Some(h) => break h,
                    None => break Vec::new(),
                }
            };
            if !held.is_empty() {
                self.sigkill();
                panic!(
                    "pods of {} still hold {COUNT_FINALIZER} {:?} after the scenario:\n{}",
                    self.namespaces.join(","),
                    held,
                    self.log_tail(40)
                );
            }
        }
        self.sigkill();
        if std::thread::panicking() {
            eprintln!(
                "---- operator log tail ({}) ----\n{}\n---- end of operator log ----",
                self.log.display(),
                self.log_tail(60)
            );
        }
    }
}

/// Request counts of the test server summed over the verbs that act (not watch streams).
pub fn acting_requests(counts: &BTreeMap<(String, String), u64>) -> u64 {
    counts
        .iter()
        .filter(|((verb, _), _)| verb != "watch")
        .map(|(_, n)| n)
        .sum()
}

/// The difference of two request-count snapshots, entries that changed only.
pub fn counts_diff(
    before: &BTreeMap<(String, String), u64>,
    after: &BTreeMap<(String, String), u64>,
) -> BTreeMap<(String, String), u64> {
    after
        .iter()
        .filter_map(|(k, n)| {
            let d = n - before.get(k).copied().unwrap_or(0).min(*n);
            (d > 0).then(|| (k.clone(), d))
        })
        .collect()
}

/// Eight hex digits, different across tests and runs: namespace names must not be reused on
/// a real cluster, where a deleted namespace lingers while it terminates.
fn random_suffix() -> String {
    use std::collections::hash_map::RandomState;
    use std::hash::{BuildHasher, Hasher};
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let mut h = RandomState::new().build_hasher();
    h.write_u64(SEQ.fetch_add(1, Ordering::Relaxed));
    h.write_u32(std::process::id());
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    format!("{:08x}", h.finish() as u32)
}

/// The objects `make render NAMESPACES=...` prints: what `make deploy` would apply for an
/// operator serving `namespaces` (none: every namespace). Needs make and kubectl, as the
/// Makefile's render does.
pub fn render(namespaces: &[&str]) -> Vec<Value> {
    let out = Command::new("make")
        // Under `make test` the outer make's flags would reach this one.
        .env_remove("MAKEFLAGS")
        .env_remove("MFLAGS")
        .env_remove("MAKELEVEL")
        .args([
            "--no-print-directory",
            "-s",
            "-C",
            env!("CARGO_MANIFEST_DIR"),
        ])
        .args(["render", "IMG=immortal-operator:e2e"])
        .arg(format!("NAMESPACES={}", namespaces.join(",")))
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run make render: {e}"));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "make render failed (it needs kubectl):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_yaml::Deserializer::from_str(&text)
        .map(|doc| {
            <Value as serde::Deserialize>::deserialize(doc)
                .unwrap_or_else(|e| panic!("make render printed no YAML: {e}"))
        })
        .filter(|v| !v.is_null())
        .collect()
}
