//! Finds the cluster to talk to: --kubeconfig, KUBECONFIG, ~/.kube/config or the in-cluster service account.

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::Deserialize;

use crate::kube::auth::{self, redact_values, Credentials, ExecConfig, PemPair};
use crate::kube::tls::{self, TlsError};
use crate::util::lock;

/// Where the service account is mounted in every pod (token, ca.crt, namespace); the path
/// client-go's `rest.InClusterConfig` reads.
const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// What the command line says about configuration.
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    /// `--kubeconfig PATH`: use exactly this file; it must exist.
    pub kubeconfig: Option<PathBuf>,
    /// `--context NAME`: use this context instead of current-context.
    pub context: Option<String>,
}

/// The parts of the process environment configuration depends on, injectable for tests.
#[derive(Debug, Clone)]
pub struct Env {
    /// `KUBECONFIG`: a colon-separated list of files.
    pub kubeconfig_var: Option<String>,
    /// `HOME`, for `~/.kube/config`.
    pub home: Option<PathBuf>,
    /// `KUBERNETES_SERVICE_HOST`, set by the kubelet in every pod.
    pub service_host: Option<String>,
    /// `KUBERNETES_SERVICE_PORT`.
    pub service_port: Option<String>,
    /// Service account mount: `token`, `ca.crt`, `namespace`.
    pub sa_dir: PathBuf,
}

impl Env {
    /// The real environment. Empty variables count as unset, as in client-go.
    pub fn from_process() -> Env {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        Env {
            kubeconfig_var: var("KUBECONFIG"),
            home: std::env::var_os("HOME")
                .filter(|h| !h.is_empty())
                .map(PathBuf::from),
            service_host: var("KUBERNETES_SERVICE_HOST"),
            service_port: var("KUBERNETES_SERVICE_PORT"),
            sa_dir: PathBuf::from(SERVICE_ACCOUNT_DIR),
        }
    }
}

/// Why no usable configuration could be loaded. Every message is one line naming the file,
/// context, cluster, user or field at fault, and never contains token or key material.
#[derive(Debug)]
#[non_exhaustive]
pub enum ConfigError {
    /// No source applies: no --kubeconfig, no existing KUBECONFIG file, no ~/.kube/config, and
    /// not in a pod. Not retried.
    NoConfiguration(String),
    /// A file named by the configuration could not be read: a kubeconfig, CA, client
    /// certificate or key, or the service account's CA. `what` says which and where it was
    /// named. Not retried. (A token file is the credentials': [`ConfigError::Credentials`].)
    Read {
        what: String,
        path: PathBuf,
        error: io::Error,
    },
    /// A kubeconfig file is not YAML or not shaped like a kubeconfig. Not retried.
    Parse { path: PathBuf, error: String },
    /// The configuration is readable but wrong or unsupported (unknown context, missing
    /// cluster or user, no server, bad base64, auth-provider, ...). `origin` locates it. Not
    /// retried.
    Invalid { origin: String, problem: String },
    /// Certificates or keys are unusable. Not retried (from an exec plugin: rebuilt the next
    /// time the plugin runs).
    Tls { origin: String, error: TlsError },
    /// The user's credentials cannot be set up (a token file, an exec plugin setting) or, from
    /// [`ClusterConfig::tls_config`], an exec plugin failed to hand out its certificate: see
    /// [`auth::Error`] for which are retried.
    Credentials(auth::Error),
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::NoConfiguration(detail) => {
                write!(f, "no kubernetes configuration found: {detail}")
            }
            ConfigError::Read { what, path, error } => {
                write!(f, "{what}: cannot read {}: {error}", path.display())
            }
            ConfigError::Parse { path, error } => {
                write!(
                    f,
                    "kubeconfig {}: invalid kubeconfig: {error}",
                    path.display()
                )
            }
            ConfigError::Invalid { origin, problem } => write!(f, "{origin}: {problem}"),
            ConfigError::Tls { origin, error } => write!(f, "{origin}: {error}"),
            ConfigError::Credentials(e) => write!(f, "{e}"),
        }
    }
}

impl From<auth::Error> for ConfigError {
    fn from(e: auth::Error) -> ConfigError {
        ConfigError::Credentials(e)
    }
}

impl std::error::Error for ConfigError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ConfigError::Read { error, .. } => Some(error),
            ConfigError::Tls { error, .. } => Some(error),
            ConfigError::Credentials(error) => Some(error),
            _ => None,
        }
    }
}

/// Everything needed to reach and authenticate to one API server.
pub struct ClusterConfig {
    /// `https://host:port[/prefix]`, without a trailing slash.
    pub server: String,
    /// The context's namespace, or the in-cluster namespace file.
    pub default_namespace: Option<String>,
    /// For logs: `kubeconfig /path, context NAME` or `in-cluster`.
    pub source: String,
    pub credentials: Arc<Credentials>,
    tls: TlsSettings,
    built: Mutex<BuiltTls>,
    in_cluster: bool,
}

impl fmt::Debug for ClusterConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClusterConfig")
            .field("server", &self.server)
            .field("default_namespace", &self.default_namespace)
            .field("source", &self.source)
            .field("credentials", &self.credentials)
            .field("insecure", &self.tls.insecure)
            .finish_non_exhaustive()
    }
}

impl ClusterConfig {
    /// The TLS config to build agents with. Changes (new Arc) only when an exec plugin hands out a
    /// new client certificate; callers compare with Arc::ptr_eq and rebuild their agent.
    pub fn tls_config(&self) -> Result<Arc<rustls::ClientConfig>, ConfigError> {
        // Asks the plugin first (it may re-run it), then takes our own lock: always this order.
        let exec_pair = self.credentials.client_certificate()?;
        let mut built = lock(&self.built);
        if built.exec_pair != exec_pair {
            let origin = self.credentials.exec_origin().unwrap_or(&self.source);
            let pair = exec_pair.as_ref().map(|(cert, key)| ClientPair {
                cert: cert.clone(),
                cert_origin: format!("{origin}, clientCertificateData"),
                key: key.clone(),
                key_origin: format!("{origin}, clientKeyData"),
            });
            built.config = self.tls.build(pair.as_ref())?;
            built.exec_pair = exec_pair;
        }
        Ok(built.config.clone())
    }

    /// Whether this config came from the in-cluster service account (for logs).
    pub fn in_cluster(&self) -> bool {
        self.in_cluster
    }
}

/// Loads the configuration from the real environment; see [`load_with_env`].
pub fn load(opts: &LoadOptions) -> Result<ClusterConfig, ConfigError> {
    load_with_env(opts, &Env::from_process())
}

/// Loads the configuration. First match wins: `--kubeconfig`, `KUBECONFIG`, `~/.kube/config`,
/// in-cluster. Like client-go's loading rules, `KUBECONFIG` replaces `~/.kube/config` rather than
/// adding to it, and when the kubeconfig files it names do not exist the in-cluster
/// configuration is tried.
pub fn load_with_env(opts: &LoadOptions, env: &Env) -> Result<ClusterConfig, ConfigError> {
    if let Some(path) = &opts.kubeconfig {
        let merged = merge_files(std::slice::from_ref(path), true)?;
        return from_kubeconfig(&merged, opts.context.as_deref());
    }

    let mut tried = Vec::new();
    if let Some(var) = env.kubeconfig_var.as_deref() {
        // Empty entries ("a::b", a trailing ':') are ignored, as kubectl does.
        let paths: Vec<PathBuf> = var
            .split(':')
            .filter(|p| !p.is_empty())
            .map(PathBuf::from)
            .collect();
        if !paths.is_empty() {
            let merged = merge_files(&paths, false)?;
            if !merged.files.is_empty() {
                return from_kubeconfig(&merged, opts.context.as_deref());
            }
            tried.push(format!("none of the files in KUBECONFIG={var} exist"));
        }
    }
    if tried.is_empty() {
        match &env.home {
            Some(home) => {
                let path = home.join(".kube").join("config");
                let merged = merge_files(std::slice::from_ref(&path), false)?;
                if !merged.files.is_empty() {
                    return from_kubeconfig(&merged, opts.context.as_deref());
                }
                tried.push(format!("{} does not exist", path.display()));
            }
            None => tried.push("HOME is not set".to_string()),
        }
    }

    if let Some(context) = &opts.context {
        return Err(ConfigError::NoConfiguration(format!(
            "--context {context:?} given but no kubeconfig was found ({})",
            tried.join(", ")
        )));
    }
    match (&env.service_host, &env.service_port) {
        (Some(host), Some(port)) => in_cluster(host, port, &env.sa_dir),
        _ => {
            tried.push(
                "not in a cluster (KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT unset)"
                    .to_string(),
            );
            Err(ConfigError::NoConfiguration(format!(
                "no --kubeconfig given, {}",
                tried.join(", ")
            )))
        }
    }
}

/// The pod's own service account, as client-go's `rest.InClusterConfig` builds it.
fn in_cluster(host: &str, port: &str, sa_dir: &Path) -> Result<ClusterConfig, ConfigError> {
    // An IPv6 service host (dual-stack clusters) needs brackets in a URL.
    let host = if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]")
    } else {
        host.to_string()
    };
    let server = format!("https://{host}:{port}");
    let credentials = Credentials::token_file(
        sa_dir.join("token"),
        "in-cluster service account token".into(),
    )?;
    let ca_path = sa_dir.join("ca.crt");
    let ca = read_file(&ca_path, "in-cluster service account CA")?;
    // The namespace file is optional: without it objects must name their namespace.
    let default_namespace = std::fs::read_to_string(sa_dir.join("namespace"))
        .ok()
        .map(|ns| ns.trim().to_string())
        .filter(|ns| !ns.is_empty());
    let settings = TlsSettings {
        ca: Some((
            ca,
            format!("in-cluster service account CA {}", ca_path.display()),
        )),
        insecure: false,
        server_name: None,
        client: None,
    };
    finish(
        server,
        default_namespace,
        "in-cluster".into(),
        credentials,
        settings,
        true,
    )
}

fn finish(
    server: String,
    default_namespace: Option<String>,
    source: String,
    credentials: Credentials,
    tls: TlsSettings,
    in_cluster: bool,
) -> Result<ClusterConfig, ConfigError> {
    // Built now so broken certificates fail at startup, not at the first request.
    let config = tls.build(None)?;
    Ok(ClusterConfig {
        server,
        default_namespace,
        source,
        credentials: Arc::new(credentials),
        tls,
        built: Mutex::new(BuiltTls {
            exec_pair: None,
            config,
        }),
        in_cluster,
    })
}

/// TLS inputs, each with where it came from so a bad one can be named.
struct TlsSettings {
    ca: Option<(Vec<u8>, String)>,
    insecure: bool,
    server_name: Option<(String, String)>,
    client: Option<ClientPair>,
}

struct ClientPair {
    cert: Vec<u8>,
    cert_origin: String,
    key: Vec<u8>,
    key_origin: String,
}

/// The config handed out last and the exec plugin certificate it was built with.
struct BuiltTls {
    exec_pair: Option<PemPair>,
    config: Arc<rustls::ClientConfig>,
}

impl TlsSettings {
    /// A client config; a certificate from an exec plugin replaces the kubeconfig's one, as in
    /// client-go.
    fn build(
        &self,
        exec_pair: Option<&ClientPair>,
    ) -> Result<Arc<rustls::ClientConfig>, ConfigError> {
        let pair = exec_pair.or(self.client.as_ref());
        let result = tls::client_config(
            self.ca.as_ref().map(|(pem, _)| pem.as_slice()),
            self.insecure,
            self.server_name.as_ref().map(|(name, _)| name.as_str()),
            pair.map(|p| (p.cert.clone(), p.key.clone())),
        );
        result.map_err(|error| {
            let origin = match &error {
                TlsError::Ca(_) => self.ca.as_ref().map(|(_, o)| o.clone()),
                TlsError::ServerName(_) => self.server_name.as_ref().map(|(_, o)| o.clone()),
                TlsError::ClientCertificate(_) => pair.map(|p| p.cert_origin.clone()),
                TlsError::ClientKey(_) | TlsError::KeyMismatch => {
                    pair.map(|p| p.key_origin.clone())
                }
                _ => None,
            };
            ConfigError::Tls {
                origin: origin.unwrap_or_else(|| "tls".into()),
                error,
            }
        })
    }
}

// ---- kubeconfig files ----

/// A kubeconfig file as written by kubectl. Unknown fields (preferences, extensions we do not
/// use, apiVersion, kind) are ignored; lists may be null, as kubectl writes them.
#[derive(Deserialize, Default)]
struct RawConfig {
    #[serde(default)]
    clusters: Option<Vec<Named<RawCluster>>>,
    #[serde(default)]
    users: Option<Vec<Named<RawUser>>>,
    #[serde(default)]
    contexts: Option<Vec<Named<RawContext>>>,
    #[serde(default, rename = "current-context")]
    current_context: Option<String>,
}

/// `{name, cluster|user|context}`: the body's key differs per list, so all three are accepted.
#[derive(Deserialize)]
struct Named<T> {
    name: String,
    #[serde(default, rename = "cluster", alias = "user", alias = "context")]
    body: Option<T>,
}

#[derive(Deserialize, Default, Clone)]
#[serde(rename_all = "kebab-case")]
struct RawCluster {
    server: Option<String>,
    certificate_authority: Option<String>,
    certificate_authority_data: Option<String>,
    insecure_skip_tls_verify: Option<bool>,
    tls_server_name: Option<String>,
    extensions: Option<Vec<RawExtension>>,
}

#[derive(Deserialize, Clone)]
struct RawExtension {
    name: String,
    extension: Option<serde_yaml::Value>,
}

/// Deliberately not Debug: it holds tokens and keys.
#[derive(Deserialize, Default, Clone)]
#[serde(rename_all = "kebab-case")]
struct RawUser {
    token: Option<String>,
    #[serde(rename = "tokenFile")]
    token_file: Option<String>,
    client_certificate: Option<String>,
    client_certificate_data: Option<String>,
    client_key: Option<String>,
    client_key_data: Option<String>,
    username: Option<String>,
    password: Option<String>,
    #[serde(rename = "as")]
    impersonate: Option<String>,
    auth_provider: Option<RawAuthProvider>,
    exec: Option<RawExec>,
}

#[derive(Deserialize, Clone)]
struct RawAuthProvider {
    name: Option<String>,
}

#[derive(Deserialize, Clone)]
#[serde(rename_all = "camelCase")]
struct RawExec {
    command: Option<String>,
    args: Option<Vec<String>>,
    env: Option<Vec<RawEnvVar>>,
    api_version: Option<String>,
    install_hint: Option<String>,
    provide_cluster_info: Option<bool>,
    interactive_mode: Option<String>,
}

#[derive(Deserialize, Clone)]
struct RawEnvVar {
    name: String,
    value: Option<String>,
}

#[derive(Deserialize, Default, Clone)]
struct RawContext {
    cluster: Option<String>,
    user: Option<String>,
    namespace: Option<String>,
}

/// An entry and the file that defined it (relative paths inside resolve against its directory).
struct Defined<T> {
    file: PathBuf,
    value: T,
}

/// The merge of one or more kubeconfig files.
struct Merged {
    files: Vec<PathBuf>,
    clusters: BTreeMap<String, Defined<RawCluster>>,
    users: BTreeMap<String, Defined<RawUser>>,
    contexts: BTreeMap<String, Defined<RawContext>>,
    current_context: Option<(String, PathBuf)>,
}

impl Merged {
    fn label(&self) -> String {
        let files: Vec<String> = self.files.iter().map(|f| f.display().to_string()).collect();
        format!("kubeconfig {}", files.join(":"))
    }
}

/// Reads and merges kubeconfig files the way kubectl merges KUBECONFIG: for every cluster, user
/// and context name, and for current-context, the first file that sets it wins. Missing files
/// are an error only if `must_exist`; unreadable or malformed ones always are.
fn merge_files(paths: &[PathBuf], must_exist: bool) -> Result<Merged, ConfigError> {
    let mut merged = Merged {
        files: Vec::new(),
        clusters: BTreeMap::new(),
        users: BTreeMap::new(),
        contexts: BTreeMap::new(),
        current_context: None,
    };
    for path in paths {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == io::ErrorKind::NotFound && !must_exist => continue,
            Err(error) => {
                return Err(ConfigError::Read {
                    what: "kubeconfig".into(),
                    path: path.clone(),
                    error,
                })
            }
        };
        let raw = parse_kubeconfig(&text).map_err(|error| ConfigError::Parse {
            path: path.clone(),
            error,
        })?;
        merged.files.push(path.clone());
        for c in raw.clusters.unwrap_or_default() {
            let body = c.body.unwrap_or_default();
            merged.clusters.entry(c.name).or_insert_with(|| Defined {
                file: path.clone(),
                value: body,
            });
        }
        for u in raw.users.unwrap_or_default() {
            let body = u.body.unwrap_or_default();
            merged.users.entry(u.name).or_insert_with(|| Defined {
                file: path.clone(),
                value: body,
            });
        }
        for c in raw.contexts.unwrap_or_default() {
            let body = c.body.unwrap_or_default();
            merged.contexts.entry(c.name).or_insert_with(|| Defined {
                file: path.clone(),
                value: body,
            });
        }
        if merged.current_context.is_none() {
            if let Some(current) = raw.current_context.filter(|c| !c.is_empty()) {
                merged.current_context = Some((current, path.clone()));
            }
        }
    }
    Ok(merged)
}

fn parse_kubeconfig(text: &str) -> Result<RawConfig, String> {
    // An empty file is a valid, empty kubeconfig to kubectl; serde_yaml would call it an error.
    if text.trim().is_empty() {
        return Ok(RawConfig::default());
    }
    serde_yaml::from_str(text).map_err(|e| redact_values(&e.to_string()))
}

fn from_kubeconfig(merged: &Merged, context: Option<&str>) -> Result<ClusterConfig, ConfigError> {
    let invalid = |origin: String, problem: String| ConfigError::Invalid { origin, problem };
    let (context_name, named_in) = match (context, &merged.current_context) {
        (Some(name), _) => (name.to_string(), merged.label()),
        (None, Some((name, file))) => (name.clone(), format!("kubeconfig {}", file.display())),
        (None, None) => {
            return Err(invalid(
                merged.label(),
                format!(
                    "no current-context set and no --context given (available: {})",
                    available(&merged.contexts)
                ),
            ))
        }
    };
    let context = merged.contexts.get(&context_name).ok_or_else(|| {
        invalid(
            named_in,
            format!(
                "context {context_name:?} not found (available: {})",
                available(&merged.contexts)
            ),
        )
    })?;
    let context_origin = format!(
        "kubeconfig {}, context {context_name:?}",
        context.file.display()
    );

    let cluster_name = context.value.cluster.as_deref().unwrap_or_default();
    if cluster_name.is_empty() {
        return Err(invalid(context_origin, "no cluster set".into()));
    }
    let cluster = merged.clusters.get(cluster_name).ok_or_else(|| {
        invalid(
            context_origin.clone(),
            format!(
                "cluster {cluster_name:?} not found (available: {})",
                available(&merged.clusters)
            ),
        )
    })?;
    let cluster_origin = format!(
        "kubeconfig {}, cluster {cluster_name:?}",
        cluster.file.display()
    );

    let server = cluster.value.server.as_deref().unwrap_or_default();
    if server.trim().is_empty() {
        return Err(invalid(cluster_origin, "no server set".into()));
    }
    let server = normalize_server(server).map_err(|p| invalid(cluster_origin.clone(), p))?;
    let insecure = cluster.value.insecure_skip_tls_verify.unwrap_or(false);
    let ca = pem_from_data_or_file(
        &cluster_origin,
        &cluster.file,
        "certificate-authority",
        cluster.value.certificate_authority_data.as_deref(),
        cluster.value.certificate_authority.as_deref(),
    )?;
    if insecure && ca.is_some() {
        // The same refusal as client-go's transport: it is unclear which one was meant.
        return Err(invalid(
            cluster_origin,
            "certificate-authority and insecure-skip-tls-verify cannot both be set".into(),
        ));
    }
    let server_name = cluster
        .value
        .tls_server_name
        .clone()
        .filter(|n| !n.is_empty())
        .map(|n| (n, format!("{cluster_origin}, tls-server-name")));

    let user_name = context.value.user.as_deref().unwrap_or_default();
    let (credentials, client) = if user_name.is_empty() {
        // A context without a user is anonymous access; kubectl allows it.
        (Credentials::anonymous(), None)
    } else {
        let user = merged.users.get(user_name).ok_or_else(|| {
            invalid(
                context_origin.clone(),
                format!(
                    "user {user_name:?} not found (available: {})",
                    available(&merged.users)
                ),
            )
        })?;
        let user_origin = format!("kubeconfig {}, user {user_name:?}", user.file.display());
        let cluster_info = ExecClusterInfo {
            server: &server,
            ca: ca.as_ref().map(|(pem, _)| pem.as_slice()),
            insecure,
            server_name: server_name.as_ref().map(|(n, _)| n.as_str()),
            extensions: cluster.value.extensions.as_deref(),
        };
        user_credentials(&user_origin, &user.file, &user.value, &cluster_info)?
    };

    let settings = TlsSettings {
        ca,
        insecure,
        server_name,
        client,
    };
    let source = format!(
        "kubeconfig {}, context {context_name}",
        context.file.display()
    );
    let namespace = context.value.namespace.clone().filter(|ns| !ns.is_empty());
    finish(server, namespace, source, credentials, settings, false)
}

/// What an exec plugin may be told about the cluster (`provideClusterInfo: true`).
struct ExecClusterInfo<'a> {
    server: &'a str,
    ca: Option<&'a [u8]>,
    insecure: bool,
    server_name: Option<&'a str>,
    extensions: Option<&'a [RawExtension]>,
}

impl ExecClusterInfo<'_> {
    /// The `spec.cluster` object of client.authentication.k8s.io ExecCredential.
    fn to_json(&self) -> serde_json::Value {
        let mut cluster = serde_json::Map::new();
        cluster.insert("server".into(), self.server.into());
        if let Some(name) = self.server_name {
            cluster.insert("tls-server-name".into(), name.into());
        }
        if self.insecure {
            cluster.insert("insecure-skip-tls-verify".into(), true.into());
        }
        if let Some(ca) = self.ca {
            cluster.insert(
                "certificate-authority-data".into(),
                base64_encode(ca).into(),
            );
        }
        // Per-cluster plugin settings live in the extension named for the exec API group.
        let config = self
            .extensions
            .unwrap_or_default()
            .iter()
            .find(|e| e.name == "client.authentication.k8s.io/exec")
            .and_then(|e| e.extension.as_ref())
            .and_then(|v| serde_json::to_value(v).ok());
        if let Some(config) = config {
            cluster.insert("config".into(), config);
        }
        serde_json::Value::Object(cluster)
    }
}

type UserCredentials = (Credentials, Option<ClientPair>);

fn user_credentials(
    origin: &str,
    file: &Path,
    user: &RawUser,
    cluster: &ExecClusterInfo,
) -> Result<UserCredentials, ConfigError> {
    let invalid = |problem: &str| ConfigError::Invalid {
        origin: origin.to_string(),
        problem: problem.to_string(),
    };
    if let Some(provider) = &user.auth_provider {
        let name = provider.name.as_deref().unwrap_or("");
        return Err(ConfigError::Invalid {
            origin: origin.to_string(),
            problem: format!(
                "auth-provider {name:?} is not supported (it was removed from kubectl); configure an exec credential plugin instead"
            ),
        });
    }
    if user.username.is_some() || user.password.is_some() {
        return Err(invalid(
            "username/password (basic auth) is not supported; use a token, client certificate or exec plugin",
        ));
    }
    if user.impersonate.is_some() {
        return Err(invalid("impersonation (as) is not supported"));
    }

    let cert = pem_from_data_or_file(
        origin,
        file,
        "client-certificate",
        user.client_certificate_data.as_deref(),
        user.client_certificate.as_deref(),
    )?;
    let key = pem_from_data_or_file(
        origin,
        file,
        "client-key",
        user.client_key_data.as_deref(),
        user.client_key.as_deref(),
    )?;
    let client = match (cert, key) {
        (Some((cert, cert_origin)), Some((key, key_origin))) => Some(ClientPair {
            cert,
            cert_origin,
            key,
            key_origin,
        }),
        (None, None) => None,
        (Some(_), None) => return Err(invalid("client-certificate is set but client-key is not")),
        (None, Some(_)) => return Err(invalid("client-key is set but client-certificate is not")),
    };

    // A token file wins over a token (client-go: "the last successfully read value takes
    // precedence over BearerToken"), and a static token over an exec plugin (client-go's exec
    // round-tripper leaves an Authorization header that is already set alone).
    let credentials = if let Some(token_file) = user.token_file.as_deref().filter(|t| !t.is_empty())
    {
        Credentials::token_file(resolve(file, token_file), format!("{origin}, tokenFile"))?
    } else if let Some(token) = user.token.as_deref().filter(|t| !t.is_empty()) {
        Credentials::token(token.trim().to_string())
    } else if let Some(exec) = &user.exec {
        Credentials::exec(exec_config(origin, file, exec, cluster)?)?
    } else {
        Credentials::anonymous()
    };
    Ok((credentials, client))
}

fn exec_config(
    origin: &str,
    file: &Path,
    exec: &RawExec,
    cluster: &ExecClusterInfo,
) -> Result<ExecConfig, ConfigError> {
    let origin = format!("{origin}, exec");
    let command = exec.command.as_deref().unwrap_or_default();
    if command.is_empty() {
        return Err(ConfigError::Invalid {
            origin,
            problem: "no command set".into(),
        });
    }
    // client-go: a command containing a path separator is relative to the kubeconfig's
    // directory; a bare name is looked up in PATH.
    let command = if command.contains('/') {
        resolve(file, command).into_os_string()
    } else {
        command.into()
    };
    Ok(ExecConfig {
        origin,
        command,
        args: exec.args.clone().unwrap_or_default(),
        env: exec
            .env
            .clone()
            .unwrap_or_default()
            .into_iter()
            .map(|v| (v.name, v.value.unwrap_or_default()))
            .collect(),
        api_version: exec.api_version.clone().unwrap_or_default(),
        install_hint: exec.install_hint.clone().filter(|h| !h.is_empty()),
        interactive_mode: exec.interactive_mode.clone().filter(|m| !m.is_empty()),
        cluster: exec
            .provide_cluster_info
            .unwrap_or(false)
            .then(|| cluster.to_json()),
    })
}

/// PEM from `FIELD-data` (base64, wins like in client-go) or from the file `FIELD` names.
/// Returns the bytes and where they came from, for error messages.
fn pem_from_data_or_file(
    origin: &str,
    file: &Path,
    field: &str,
    data: Option<&str>,
    path: Option<&str>,
) -> Result<Option<(Vec<u8>, String)>, ConfigError> {
    if let Some(data) = data.filter(|d| !d.trim().is_empty()) {
        let origin = format!("{origin}, {field}-data");
        let pem = base64_decode(data).map_err(|problem| ConfigError::Invalid {
            origin: origin.clone(),
            problem,
        })?;
        return Ok(Some((pem, origin)));
    }
    if let Some(path) = path.filter(|p| !p.is_empty()) {
        let path = resolve(file, path);
        let what = format!("{origin}, {field}");
        let pem = read_file(&path, &what)?;
        return Ok(Some((pem, format!("{what} {}", path.display()))));
    }
    Ok(None)
}

fn read_file(path: &Path, what: &str) -> Result<Vec<u8>, ConfigError> {
    std::fs::read(path).map_err(|error| ConfigError::Read {
        what: what.to_string(),
        path: path.to_path_buf(),
        error,
    })
}

/// A path from a kubeconfig: relative ones are relative to the directory of the file that
/// contains them (client-go's `ResolvePaths`).
fn resolve(kubeconfig: &Path, path: &str) -> PathBuf {
    let path = Path::new(path);
    if path.is_absolute() {
        return path.to_path_buf();
    }
    // Dropping "." components keeps "./bin/plugin" readable in messages.
    let relative: PathBuf = path
        .components()
        .filter(|c| *c != std::path::Component::CurDir)
        .collect();
    kubeconfig.parent().unwrap_or(Path::new("")).join(relative)
}

/// `https://host:port[/prefix]` without a trailing slash. A bare `host:port` means https, as in
/// client-go's `DefaultServerURL`.
fn normalize_server(server: &str) -> Result<String, String> {
    let server = server.trim();
    let url = if server.contains("://") {
        server.to_string()
    } else {
        format!("https://{server}")
    };
    if !(url.starts_with("https://") || url.starts_with("http://")) {
        return Err(format!(
            "server {server:?} is not an http:// or https:// URL"
        ));
    }
    Ok(url.trim_end_matches('/').to_string())
}

fn available<T>(entries: &BTreeMap<String, T>) -> String {
    if entries.is_empty() {
        return "none".to_string();
    }
    entries
        .keys()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Decodes standard base64 (RFC 4648 alphabet), padding optional, whitespace ignored. Written
/// by hand to stay within the dependency budget. Errors name the offset, never the content.
pub(crate) fn base64_decode(input: &str) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(input.len() / 4 * 3 + 2);
    let (mut acc, mut bits, mut data_chars, mut padding) = (0u32, 0u32, 0usize, 0usize);
    for (offset, c) in input.bytes().enumerate() {
        let value = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            b'=' => {
                padding += 1;
                continue;
            }
            b' ' | b'\t' | b'\r' | b'\n' => continue,
            _ => {
                return Err(format!(
                    "invalid base64: unexpected character at offset {offset}"
                ))
            }
        };
        if padding > 0 {
            return Err(format!(
                "invalid base64: data after padding at offset {offset}"
            ));
        }
        acc = (acc << 6) | u32::from(value);
        bits += 6;
        data_chars += 1;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    if data_chars % 4 == 1 || padding > 2 {
        return Err("invalid base64: truncated input".to_string());
    }
    Ok(out)
}

/// Standard base64 with padding (for certificate-authority-data handed to exec plugins).
pub(crate) fn base64_encode(input: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(input.len().div_ceil(3) * 4);
    for chunk in input.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::kube::tls::tests::{fixture, get, one_shot_server};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    /// A scratch directory removed when dropped.
    pub(crate) struct TempDir(pub(crate) PathBuf);

    impl TempDir {
        pub(crate) fn new(name: &str) -> TempDir {
            static COUNTER: AtomicUsize = AtomicUsize::new(0);
            let n = COUNTER.fetch_add(1, Ordering::Relaxed);
            let dir = std::env::temp_dir().join(format!(
                "immortal-config-test-{}-{n}-{name}",
                std::process::id()
            ));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            TempDir(dir)
        }

        /// Writes `contents` to `relative` (creating directories) and returns the full path.
        pub(crate) fn write(&self, relative: &str, contents: impl AsRef<[u8]>) -> PathBuf {
            let path = self.0.join(relative);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).unwrap();
            }
            std::fs::write(&path, contents).unwrap();
            path
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// An environment with nothing set; the service account dir does not exist.
    pub(crate) fn empty_env(dir: &TempDir) -> Env {
        Env {
            kubeconfig_var: None,
            home: None,
            service_host: None,
            service_port: None,
            sa_dir: dir.0.join("no-service-account"),
        }
    }

    pub(crate) fn with_file(path: &Path) -> LoadOptions {
        LoadOptions {
            kubeconfig: Some(path.to_path_buf()),
            context: None,
        }
    }

    pub(crate) fn b64_fixture(name: &str) -> String {
        base64_encode(&fixture(name))
    }

    /// A one-context kubeconfig: `cluster_fields` and `user_fields` are YAML lines indented for
    /// the cluster and user bodies.
    pub(crate) fn kubeconfig(server: &str, cluster_fields: &str, user_fields: &str) -> String {
        format!(
            "apiVersion: v1
kind: Config
clusters:
- name: test-cluster
  cluster:
    server: {server}
{cluster_fields}
users:
- name: test-user
  user:
{user_fields}
contexts:
- name: test
  context:
    cluster: test-cluster
    user: test-user
    namespace: team-a
current-context: test
preferences: {{}}
"
        )
    }

    fn load_file(path: &Path) -> Result<ClusterConfig, ConfigError> {
        let dir = TempDir::new("env");
        load_with_env(&with_file(path), &empty_env(&dir))
    }

    #[test]
    fn cluster_config_can_be_shared_between_threads() {
        fn shareable<T: Send + Sync>() {}
        shareable::<ClusterConfig>();
        shareable::<Credentials>();
    }

    #[test]
    fn token_user_gets_bearer_header_and_context_namespace() {
        let dir = TempDir::new("token");
        let path = dir.write(
            "config",
            kubeconfig(
                "https://127.0.0.1:6443/",
                &format!("    certificate-authority-data: {}", b64_fixture("ca.crt")),
                "    token: abc.def",
            ),
        );
        let config = load_file(&path).unwrap();
        assert_eq!(config.server, "https://127.0.0.1:6443");
        assert_eq!(config.default_namespace.as_deref(), Some("team-a"));
        assert_eq!(
            config.source,
            format!("kubeconfig {}, context test", path.display())
        );
        assert!(!config.in_cluster());
        assert_eq!(
            config.credentials.authorization().unwrap().as_deref(),
            Some("Bearer abc.def")
        );
    }

    #[test]
    fn token_file_is_relative_to_the_kubeconfig_directory() {
        let dir = TempDir::new("tokenfile");
        dir.write("kube/secrets/token", "from-file\n");
        let path = dir.write(
            "kube/config",
            kubeconfig("https://127.0.0.1:6443", "", "    tokenFile: secrets/token"),
        );
        let config = load_file(&path).unwrap();
        assert_eq!(
            config.credentials.authorization().unwrap().as_deref(),
            Some("Bearer from-file")
        );
    }

    #[test]
    fn user_without_credentials_is_anonymous() {
        let dir = TempDir::new("anon");
        let path = dir.write("config", kubeconfig("https://127.0.0.1:6443", "", "    {}"));
        let config = load_file(&path).unwrap();
        assert_eq!(config.credentials.authorization().unwrap(), None);
    }

    #[test]
    fn server_without_scheme_means_https() {
        let dir = TempDir::new("scheme");
        let path = dir.write("config", kubeconfig("10.0.0.1:6443", "", "    {}"));
        assert_eq!(load_file(&path).unwrap().server, "https://10.0.0.1:6443");
    }

    /// Loads a kubeconfig pointing at a one-shot server and GETs / with its TLS config.
    fn handshake(
        server_cert: &str,
        require_client_cert: bool,
        cluster_fields: &str,
        user_fields: &str,
    ) -> (
        Result<String, String>,
        crate::kube::tls::tests::ServerOutcome,
    ) {
        let (port, rx) = one_shot_server(
            server_cert,
            &server_cert.replace(".crt", ".key"),
            require_client_cert,
        );
        let dir = TempDir::new("handshake");
        for name in ["ca.crt", "client-rsa.crt", "client-rsa.key"] {
            dir.write(&format!("pki/{name}"), fixture(name));
        }
        let path = dir.write(
            "config",
            kubeconfig(
                &format!("https://127.0.0.1:{port}"),
                cluster_fields,
                user_fields,
            ),
        );
        let config = load_file(&path).unwrap();
        let result = get(config.tls_config().unwrap(), "127.0.0.1", port);
        let outcome = rx
            .recv_timeout(Duration::from_secs(10))
            .unwrap_or_else(|_| Err("server did not finish".into()));
        (result, outcome)
    }

    fn der(name: &str) -> Vec<u8> {
        use rustls::pki_types::pem::PemObject;
        rustls::pki_types::CertificateDer::from_pem_slice(&fixture(name))
            .unwrap()
            .to_vec()
    }

    #[test]
    fn client_certificate_files_and_ca_file_authenticate_over_tls() {
        let (result, outcome) = handshake(
            "server.crt",
            true,
            "    certificate-authority: pki/ca.crt",
            "    client-certificate: pki/client-rsa.crt\n    client-key: pki/client-rsa.key",
        );
        assert_eq!(result.unwrap(), "ok");
        assert_eq!(outcome.unwrap(), Some(der("client-rsa.crt")));
    }

    #[test]
    fn client_certificate_data_and_ca_data_authenticate_over_tls() {
        let (result, outcome) = handshake(
            "server.crt",
            true,
            &format!("    certificate-authority-data: {}", b64_fixture("ca.crt")),
            &format!(
                "    client-certificate-data: {}\n    client-key-data: {}",
                b64_fixture("client-ec.crt"),
                b64_fixture("client-ec.key")
            ),
        );
        assert_eq!(result.unwrap(), "ok");
        assert_eq!(outcome.unwrap(), Some(der("client-ec.crt")));
    }

    #[test]
    fn tls_server_name_reaches_dns_only_server_by_ip() {
        let (result, _) = handshake(
            "server-dns-only.crt",
            false,
            "    certificate-authority: pki/ca.crt\n    tls-server-name: kubernetes.test",
            "    token: t",
        );
        assert_eq!(result.unwrap(), "ok");
    }

    #[test]
    fn without_tls_server_name_dns_only_server_is_refused() {
        let (result, _) = handshake(
            "server-dns-only.crt",
            false,
            "    certificate-authority: pki/ca.crt",
            "    token: t",
        );
        assert!(result.unwrap_err().contains("not valid for name"));
    }

    #[test]
    fn insecure_skip_tls_verify_accepts_unverifiable_server() {
        let (result, _) = handshake(
            "server-dns-only.crt",
            false,
            "    insecure-skip-tls-verify: true",
            "    token: t",
        );
        assert_eq!(result.unwrap(), "ok");
    }

    #[test]
    fn insecure_together_with_ca_is_refused() {
        let dir = TempDir::new("insecure-ca");
        let path = dir.write(
            "config",
            kubeconfig(
                "https://127.0.0.1:6443",
                &format!(
                    "    insecure-skip-tls-verify: true\n    certificate-authority-data: {}",
                    b64_fixture("ca.crt")
                ),
                "    token: t",
            ),
        );
        let err = load_file(&path).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "kubeconfig {}, cluster \"test-cluster\": certificate-authority and insecure-skip-tls-verify cannot both be set",
                path.display()
            )
        );
    }

    /// Two kubeconfigs that define the same names differently.
    fn two_files(dir: &TempDir) -> (PathBuf, PathBuf) {
        let a = dir.write(
            "a/config",
            "clusters:
- name: shared
  cluster: {server: 'https://a.example:6443'}
users:
- name: shared
  user: {token: from-a}
contexts:
- name: ctx-a
  context: {cluster: shared, user: shared, namespace: ns-a}
current-context: ctx-a
",
        );
        let b = dir.write(
            "b/config",
            "clusters:
- name: shared
  cluster: {server: 'https://b.example:6443'}
- name: only-b
  cluster: {server: 'https://only-b.example:6443'}
users:
- name: shared
  user: {token: from-b}
contexts:
- name: ctx-a
  context: {cluster: only-b, user: shared}
- name: ctx-b
  context: {cluster: only-b, user: shared, namespace: ns-b}
current-context: ctx-b
",
        );
        (a, b)
    }

    #[test]
    fn kubeconfig_list_merges_with_first_file_winning() {
        let dir = TempDir::new("merge");
        let (a, b) = two_files(&dir);
        let missing = dir.0.join("missing/config");
        let mut env = empty_env(&dir);
        env.kubeconfig_var = Some(format!(
            "{}::{}:{}:",
            missing.display(),
            a.display(),
            b.display()
        ));

        // current-context and ctx-a come from a; ctx-a's cluster "shared" from a as well.
        let config = load_with_env(&LoadOptions::default(), &env).unwrap();
        assert_eq!(config.server, "https://a.example:6443");
        assert_eq!(config.default_namespace.as_deref(), Some("ns-a"));
        assert_eq!(
            config.credentials.authorization().unwrap().as_deref(),
            Some("Bearer from-a")
        );

        // ctx-b exists only in b; its user "shared" is taken from a, the first file.
        let opts = LoadOptions {
            kubeconfig: None,
            context: Some("ctx-b".into()),
        };
        let config = load_with_env(&opts, &env).unwrap();
        assert_eq!(config.server, "https://only-b.example:6443");
        assert_eq!(config.default_namespace.as_deref(), Some("ns-b"));
        assert_eq!(
            config.credentials.authorization().unwrap().as_deref(),
            Some("Bearer from-a")
        );
        assert_eq!(
            config.source,
            format!("kubeconfig {}, context ctx-b", b.display())
        );

        // Reversed, b wins everything.
        env.kubeconfig_var = Some(format!("{}:{}", b.display(), a.display()));
        let config = load_with_env(&LoadOptions::default(), &env).unwrap();
        assert_eq!(config.server, "https://only-b.example:6443");
        assert_eq!(
            config.credentials.authorization().unwrap().as_deref(),
            Some("Bearer from-b")
        );
    }

    #[test]
    fn current_context_comes_from_the_first_file_that_sets_it() {
        let dir = TempDir::new("merge-current");
        let (_, b) = two_files(&dir);
        let first = dir.write(
            "first/config",
            "clusters: null\nusers: null\ncontexts: null\n",
        );
        let mut env = empty_env(&dir);
        env.kubeconfig_var = Some(format!("{}:{}", first.display(), b.display()));
        let config = load_with_env(&LoadOptions::default(), &env).unwrap();
        assert_eq!(config.default_namespace.as_deref(), Some("ns-b"));
    }

    #[test]
    fn kubeconfig_flag_wins_over_kubeconfig_variable_and_home() {
        let dir = TempDir::new("precedence");
        let (a, b) = two_files(&dir);
        let home = dir.0.join("home");
        dir.write("home/.kube/config", std::fs::read(&a).unwrap());
        let mut env = empty_env(&dir);
        env.kubeconfig_var = Some(a.display().to_string());
        env.home = Some(home.clone());

        let config = load_with_env(&with_file(&b), &env).unwrap();
        assert_eq!(config.server, "https://only-b.example:6443");

        env.kubeconfig_var = Some(b.display().to_string());
        let config = load_with_env(&LoadOptions::default(), &env).unwrap();
        assert_eq!(config.server, "https://only-b.example:6443");

        env.kubeconfig_var = None;
        let config = load_with_env(&LoadOptions::default(), &env).unwrap();
        assert_eq!(config.server, "https://a.example:6443");
        assert!(config.source.contains(".kube/config"));
    }

    #[test]
    fn context_flag_selects_another_context() {
        let dir = TempDir::new("context");
        let (_, b) = two_files(&dir);
        let opts = LoadOptions {
            kubeconfig: Some(b.clone()),
            context: Some("ctx-a".into()),
        };
        let config = load_with_env(&opts, &empty_env(&dir)).unwrap();
        assert_eq!(config.default_namespace, None);
        assert_eq!(
            config.source,
            format!("kubeconfig {}, context ctx-a", b.display())
        );
    }

    #[test]
    fn unknown_context_names_the_file_and_the_available_contexts() {
        let dir = TempDir::new("unknown-context");
        let (_, b) = two_files(&dir);
        let opts = LoadOptions {
            kubeconfig: Some(b.clone()),
            context: Some("foo".into()),
        };
        let err = load_with_env(&opts, &empty_env(&dir)).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "kubeconfig {}: context \"foo\" not found (available: ctx-a, ctx-b)",
                b.display()
            )
        );
    }

    #[test]
    fn context_naming_a_missing_cluster_or_user_is_an_error() {
        let dir = TempDir::new("dangling");
        let path = dir.write(
            "config",
            "clusters:
- name: real
  cluster: {server: 'https://x:1'}
contexts:
- name: no-cluster
  context: {cluster: gone, user: u}
- name: no-user
  context: {cluster: real, user: ghost}
",
        );
        let opts = |c: &str| LoadOptions {
            kubeconfig: Some(path.clone()),
            context: Some(c.into()),
        };
        let err = load_with_env(&opts("no-cluster"), &empty_env(&dir)).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "kubeconfig {}, context \"no-cluster\": cluster \"gone\" not found (available: real)",
                path.display()
            )
        );
        let err = load_with_env(&opts("no-user"), &empty_env(&dir)).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "kubeconfig {}, context \"no-user\": user \"ghost\" not found (available: none)",
                path.display()
            )
        );
    }

    #[test]
    fn empty_kubeconfig_has_no_current_context() {
        let dir = TempDir::new("empty");
        let path = dir.write("config", "");
        let err = load_file(&path).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "kubeconfig {}: no current-context set and no --context given (available: none)",
                path.display()
            )
        );
    }

    #[test]
    fn missing_kubeconfig_file_names_the_path() {
        let dir = TempDir::new("missing");
        let path = dir.0.join("nope/config");
        let err = load_file(&path).unwrap_err();
        assert!(matches!(err, ConfigError::Read { .. }));
        let text = err.to_string();
        assert!(
            text.starts_with(&format!("kubeconfig: cannot read {}: ", path.display())),
            "{text}"
        );
    }

    #[test]
    fn file_that_is_not_yaml_is_a_parse_error_naming_the_path() {
        let dir = TempDir::new("bad-yaml");
        let path = dir.write("config", "clusters: [\n  - {name: x\n");
        let err = load_file(&path).unwrap_err();
        assert!(matches!(err, ConfigError::Parse { .. }));
        assert!(err.to_string().starts_with(&format!(
            "kubeconfig {}: invalid kubeconfig: ",
            path.display()
        )));
    }

    #[test]
    fn misplaced_value_is_not_echoed_in_the_parse_error() {
        let dir = TempDir::new("bad-type");
        let path = dir.write(
            "config",
            "clusters:\n- name: c\n  cluster: {server: 'https://x:1', insecure-skip-tls-verify: s3cr3t-t0ken}\n",
        );
        let text = load_file(&path).unwrap_err().to_string();
        assert!(!text.contains("s3cr3t"), "{text}");
        assert!(text.contains("expected a boolean"), "{text}");
    }

    #[test]
    fn missing_client_key_file_names_field_and_path() {
        let dir = TempDir::new("missing-key");
        dir.write("client.crt", fixture("client-rsa.crt"));
        let path = dir.write(
            "config",
            kubeconfig(
                "https://127.0.0.1:6443",
                "",
                "    client-certificate: client.crt\n    client-key: client.key",
            ),
        );
        let text = load_file(&path).unwrap_err().to_string();
        let expected = format!(
            "kubeconfig {}, user \"test-user\", client-key: cannot read {}: ",
            path.display(),
            dir.0.join("client.key").display()
        );
        assert!(text.starts_with(&expected), "{text}");
    }

    #[test]
    fn unreadable_certificate_names_its_field() {
        let dir = TempDir::new("bad-ca");
        dir.write("ca.crt", "this is not PEM");
        let path = dir.write(
            "config",
            kubeconfig(
                "https://127.0.0.1:6443",
                "    certificate-authority: ca.crt",
                "    token: t",
            ),
        );
        let text = load_file(&path).unwrap_err().to_string();
        assert_eq!(
            text,
            format!(
                "kubeconfig {}, cluster \"test-cluster\", certificate-authority {}: bad certificate authority: no certificate found in PEM",
                path.display(),
                dir.0.join("ca.crt").display()
            )
        );
    }

    #[test]
    fn bad_base64_names_the_data_field() {
        let dir = TempDir::new("bad-b64");
        let path = dir.write(
            "config",
            kubeconfig(
                "https://127.0.0.1:6443",
                "    certificate-authority-data: 'abc$def'",
                "",
            ),
        );
        let text = load_file(&path).unwrap_err().to_string();
        assert_eq!(
            text,
            format!(
                "kubeconfig {}, cluster \"test-cluster\", certificate-authority-data: invalid base64: unexpected character at offset 3",
                path.display()
            )
        );
    }

    #[test]
    fn key_of_another_type_than_the_certificate_is_refused() {
        let dir = TempDir::new("mismatch");
        let path = dir.write(
            "config",
            kubeconfig(
                "https://127.0.0.1:6443",
                "",
                &format!(
                    "    client-certificate-data: {}\n    client-key-data: {}",
                    b64_fixture("client-rsa.crt"),
                    b64_fixture("client-ec.key")
                ),
            ),
        );
        let text = load_file(&path).unwrap_err().to_string();
        assert_eq!(
            text,
            format!(
                "kubeconfig {}, user \"test-user\", client-key-data: client key does not match client certificate",
                path.display()
            )
        );
    }

    #[test]
    fn certificate_without_key_is_refused() {
        let dir = TempDir::new("half-pair");
        let path = dir.write(
            "config",
            kubeconfig(
                "https://127.0.0.1:6443",
                "",
                &format!(
                    "    client-certificate-data: {}",
                    b64_fixture("client-rsa.crt")
                ),
            ),
        );
        let text = load_file(&path).unwrap_err().to_string();
        assert!(
            text.ends_with("client-certificate is set but client-key is not"),
            "{text}"
        );
    }

    #[test]
    fn auth_provider_is_refused_with_a_pointer_to_exec() {
        let dir = TempDir::new("auth-provider");
        let path = dir.write(
            "config",
            kubeconfig(
                "https://127.0.0.1:6443",
                "",
                "    auth-provider:\n      name: gcp\n      config: {access-token: s3cr3t}",
            ),
        );
        let text = load_file(&path).unwrap_err().to_string();
        assert!(
            text.contains("auth-provider \"gcp\" is not supported"),
            "{text}"
        );
        assert!(text.contains("exec"), "{text}");
        assert!(!text.contains("s3cr3t"), "{text}");
    }

    #[test]
    fn basic_auth_is_refused() {
        let dir = TempDir::new("basic");
        let path = dir.write(
            "config",
            kubeconfig(
                "https://127.0.0.1:6443",
                "",
                "    username: admin\n    password: s3cr3t",
            ),
        );
        let text = load_file(&path).unwrap_err().to_string();
        assert!(text.contains("basic auth) is not supported"), "{text}");
        assert!(!text.contains("s3cr3t"), "{text}");
    }

    #[test]
    fn debug_output_never_shows_the_token() {
        let dir = TempDir::new("debug");
        let path = dir.write(
            "config",
            kubeconfig("https://127.0.0.1:6443", "", "    token: s3cr3t-t0ken"),
        );
        let config = load_file(&path).unwrap();
        let debug = format!("{config:?} {:?}", config.credentials);
        assert!(!debug.contains("s3cr3t"), "{debug}");
        assert!(debug.contains("redacted"), "{debug}");
    }

    fn service_account(dir: &TempDir, token: &str) -> PathBuf {
        dir.write("sa/token", token);
        dir.write("sa/ca.crt", fixture("ca.crt"));
        dir.write("sa/namespace", "operators\n");
        dir.0.join("sa")
    }

    #[test]
    fn in_cluster_uses_service_account_files() {
        let dir = TempDir::new("in-cluster");
        let mut env = empty_env(&dir);
        env.sa_dir = service_account(&dir, "sa-token\n");
        env.service_host = Some("10.96.0.1".into());
        env.service_port = Some("443".into());
        // The home directory exists but has no kubeconfig: fall through to in-cluster.
        env.home = Some(dir.0.clone());
        let config = load_with_env(&LoadOptions::default(), &env).unwrap();
        assert!(config.in_cluster());
        assert_eq!(config.server, "https://10.96.0.1:443");
        assert_eq!(config.source, "in-cluster");
        assert_eq!(config.default_namespace.as_deref(), Some("operators"));
        assert_eq!(
            config.credentials.authorization().unwrap().as_deref(),
            Some("Bearer sa-token")
        );
        assert!(config.tls_config().is_ok());
    }

    #[test]
    fn in_cluster_ipv6_host_gets_brackets() {
        let dir = TempDir::new("in-cluster-v6");
        let mut env = empty_env(&dir);
        env.sa_dir = service_account(&dir, "t");
        env.service_host = Some("fd00:10:96::1".into());
        env.service_port = Some("443".into());
        let config = load_with_env(&LoadOptions::default(), &env).unwrap();
        assert_eq!(config.server, "https://[fd00:10:96::1]:443");
    }

    #[test]
    fn kubeconfig_variable_naming_only_missing_files_falls_back_to_in_cluster() {
        let dir = TempDir::new("in-cluster-fallback");
        let mut env = empty_env(&dir);
        env.kubeconfig_var = Some(dir.0.join("missing").display().to_string());
        env.sa_dir = service_account(&dir, "t");
        env.service_host = Some("10.96.0.1".into());
        env.service_port = Some("443".into());
        assert!(load_with_env(&LoadOptions::default(), &env)
            .unwrap()
            .in_cluster());

        env.service_host = None;
        let text = load_with_env(&LoadOptions::default(), &env)
            .unwrap_err()
            .to_string();
        assert_eq!(
            text,
            format!(
                "no kubernetes configuration found: no --kubeconfig given, none of the files in KUBECONFIG={} exist, not in a cluster (KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT unset)",
                dir.0.join("missing").display()
            )
        );
    }

    #[test]
    fn in_cluster_without_token_names_the_token_file() {
        let dir = TempDir::new("in-cluster-no-token");
        let mut env = empty_env(&dir);
        env.service_host = Some("10.96.0.1".into());
        env.service_port = Some("443".into());
        let text = load_with_env(&LoadOptions::default(), &env)
            .unwrap_err()
            .to_string();
        assert!(
            text.starts_with(&format!(
                "in-cluster service account token: cannot read {}",
                env.sa_dir.join("token").display()
            )),
            "{text}"
        );
    }

    #[test]
    fn nothing_configured_explains_what_was_tried() {
        let dir = TempDir::new("nothing");
        let mut env = empty_env(&dir);
        env.home = Some(dir.0.clone());
        let text = load_with_env(&LoadOptions::default(), &env)
            .unwrap_err()
            .to_string();
        assert_eq!(
            text,
            format!(
                "no kubernetes configuration found: no --kubeconfig given, {} does not exist, not in a cluster (KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT unset)",
                dir.0.join(".kube/config").display()
            )
        );
    }

    #[test]
    fn context_flag_without_any_kubeconfig_is_an_error_even_in_cluster() {
        let dir = TempDir::new("context-in-cluster");
        let mut env = empty_env(&dir);
        env.sa_dir = service_account(&dir, "t");
        env.service_host = Some("10.96.0.1".into());
        env.service_port = Some("443".into());
        let opts = LoadOptions {
            kubeconfig: None,
            context: Some("prod".into()),
        };
        let text = load_with_env(&opts, &env).unwrap_err().to_string();
        assert!(
            text.contains("--context \"prod\" given but no kubeconfig was found"),
            "{text}"
        );
    }

    #[test]
    fn base64_decoder_handles_padding_whitespace_and_errors() {
        assert_eq!(base64_decode("aGVsbG8=").unwrap(), b"hello");
        assert_eq!(base64_decode("aGVsbG8").unwrap(), b"hello");
        assert_eq!(base64_decode("aGVs\n bG8h\r\n").unwrap(), b"hello!");
        assert_eq!(base64_decode("").unwrap(), b"");
        assert_eq!(base64_decode("+/+/").unwrap(), vec![0xfb, 0xff, 0xbf]);
        assert_eq!(
            base64_decode("aGVsbG8=x").unwrap_err(),
            "invalid base64: data after padding at offset 8"
        );
        assert_eq!(
            base64_decode("a-b").unwrap_err(),
            "invalid base64: unexpected character at offset 1"
        );
        assert_eq!(
            base64_decode("aGVsb").unwrap_err(),
            "invalid base64: truncated input"
        );
    }

    #[test]
    fn base64_encoder_round_trips_every_length() {
        let data: Vec<u8> = (0..=255u8).collect();
        for len in [0, 1, 2, 3, 4, 5, 255, 256] {
            let encoded = base64_encode(&data[..len]);
            assert_eq!(encoded.len() % 4, 0);
            assert_eq!(base64_decode(&encoded).unwrap(), &data[..len]);
        }
        assert_eq!(base64_encode(b"hello"), "aGVsbG8=");
    }
}
