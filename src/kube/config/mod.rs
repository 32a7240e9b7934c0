//! Finds the cluster to talk to, in client-go's order: `--kubeconfig`, `KUBECONFIG`,
//! `~/.kube/config` (`kubeconfig.rs`), the pod's own service account.

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use base64::Engine;
use serde::Deserialize;

use crate::kube::auth::{self, redact_values, Credentials, ExecConfig, PemPair};
use crate::kube::tls::{self, TlsError};
use crate::util::lock;

mod kubeconfig;
mod proxy;

use kubeconfig::*;
pub(crate) use proxy::host_and_port;
pub use proxy::{Proxy, ProxyEnv};

/// Where every pod has its service account (token, ca.crt, namespace), as client-go reads it.
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
    pub service_port: Option<String>,
    /// Service account mount: `token`, `ca.crt`, `namespace`.
    pub sa_dir: PathBuf,
    /// `HTTPS_PROXY`, `HTTP_PROXY`, `NO_PROXY` (or their lower-case names).
    pub proxies: ProxyEnv,
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
            proxies: ProxyEnv::from_process(),
        }
    }
}

/// Why no usable configuration could be loaded; messages name what is at fault, never a key.
#[derive(Debug)]
#[non_exhaustive]
pub enum ConfigError {
    /// No kubeconfig found and not in a pod. Not retried.
    NoConfiguration(String),
    /// A kubeconfig, CA, certificate or key could not be read; `what` says which. Not retried.
    Read {
        what: String,
        path: PathBuf,
        error: io::Error,
    },
    /// A kubeconfig file is not YAML or not shaped like a kubeconfig. Not retried.
    Parse { path: PathBuf, error: String },
    /// The configuration is readable but wrong or unsupported; `origin` locates it. Not retried.
    Invalid { origin: String, problem: String },
    /// Certificates or keys are unusable. Not retried, but an exec plugin's next ones are tried.
    Tls { origin: String, error: TlsError },
    /// The user's credentials failed: see [`auth::Error`] for which are retried.
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
                let path = path.display();
                write!(f, "kubeconfig {path}: invalid kubeconfig: {error}")
            }
            ConfigError::Invalid { origin, problem } => write!(f, "{origin}: {problem}"),
            ConfigError::Tls { origin, error } => write!(f, "{origin}: {error}"),
            ConfigError::Credentials(e) => write!(f, "{e}"),
        }
    }
}

fn invalid(origin: impl Into<String>, problem: impl Into<String>) -> ConfigError {
    let (origin, problem) = (origin.into(), problem.into());
    ConfigError::Invalid { origin, problem }
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
    /// The HTTP proxy every connection to the server goes through, if any (see `proxy`).
    pub proxy: Option<Proxy>,
    tls: TlsSettings,
    built: Mutex<BuiltTls>,
}

impl fmt::Debug for ClusterConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClusterConfig")
            .field("server", &self.server)
            .field("default_namespace", &self.default_namespace)
            .field("source", &self.source)
            .field("credentials", &self.credentials)
            .field("proxy", &self.proxy)
            .field("insecure", &self.tls.insecure)
            .finish_non_exhaustive()
    }
}

impl ClusterConfig {
    /// The TLS config to build agents with: a new `Arc` only when an exec plugin hands out a new
    /// client certificate, so callers compare with `Arc::ptr_eq` and rebuild their agent.
    pub fn tls_config(&self) -> Result<Arc<rustls::ClientConfig>, ConfigError> {
        // Asks the plugin first (it may re-run it), then takes our own lock: always this order.
        let exec = self.credentials.client_certificate()?;
        let mut built = lock(&self.built);
        let exec_pair = exec.as_ref().map(|(pair, _)| pair);
        if built.exec_pair.as_ref() != exec_pair {
            let pair = exec.as_ref().map(|((cert, key), origin)| ClientPair {
                cert: cert.clone(),
                cert_origin: format!("{origin}, clientCertificateData"),
                key: key.clone(),
                key_origin: format!("{origin}, clientKeyData"),
            });
            built.config = self.tls.build(pair.as_ref())?;
            built.exec_pair = exec_pair.cloned();
        }
        Ok(built.config.clone())
    }

    /// The line to exit with, naming the setting to change, when only that can fix a handshake.
    pub fn tls_misconfigured(&self, e: &rustls::Error) -> Option<String> {
        use rustls::CertificateError::{NotValidForName, NotValidForNameContext};
        let (server, source) = (&self.server, &self.source);
        let line = match e {
            rustls::Error::InvalidCertificate(NotValidForName | NotValidForNameContext { .. }) => {
                match &self.tls.server_name {
                    Some((_, origin)) => format!(
                        "{origin}: the API server's certificate is not valid for this name ({e})"
                    ),
                    None => format!(
                        "{source}: the API server's certificate is not valid for the host in server {server} ({e}); set tls-server-name to a name it is valid for"
                    ),
                }
            }
            rustls::Error::InvalidCertificate(_) => match &self.tls.ca {
                Some((_, origin)) => format!(
                    "{origin}: the API server at {server} has a certificate this certificate authority does not verify ({e}); is it this cluster's CA?"
                ),
                None => format!(
                    "{source}: the system's CA bundle does not verify the certificate of the API server at {server} ({e}); set certificate-authority to the cluster's CA"
                ),
            },
            rustls::Error::AlertReceived(_) => match &self.tls.client {
                Some(pair) => format!(
                    "{}: the API server at {server} refused the TLS handshake ({e}); does the cluster's CA sign this client certificate?",
                    pair.cert_origin
                ),
                None => format!(
                    "{source}: the API server at {server} refused the TLS handshake ({e})"
                ),
            },
            _ => return None,
        };
        Some(line)
    }
}

/// Loads the configuration from the real environment; see [`load_with_env`].
pub fn load(opts: &LoadOptions) -> Result<ClusterConfig, ConfigError> {
    load_with_env(opts, &Env::from_process())
}

/// Loads the configuration as client-go's loading rules do: `--kubeconfig`, else `KUBECONFIG`
/// (in place of `~/.kube/config`), else in-cluster; without `proxy-url`, the environment's proxy.
pub fn load_with_env(opts: &LoadOptions, env: &Env) -> Result<ClusterConfig, ConfigError> {
    let mut config = load_source(opts, env)?;
    if config.proxy.is_none() {
        config.proxy = proxy::from_env(&config.server, &env.proxies)?;
    }
    Ok(config)
}

fn load_source(opts: &LoadOptions, env: &Env) -> Result<ClusterConfig, ConfigError> {
    let context = opts.context.as_deref();
    if let Some(path) = &opts.kubeconfig {
        return from_kubeconfig(&merge_files(std::slice::from_ref(path), true)?, context);
    }
    // Empty entries ("a::b", a trailing ':') are ignored, as kubectl does.
    let listed = env.kubeconfig_var.iter().flat_map(|var| var.split(':'));
    let listed: Vec<PathBuf> = listed
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .collect();
    // The files to read, and what to say when none of them exists.
    let (paths, missing) = match (&env.kubeconfig_var, &env.home) {
        (Some(var), _) if !listed.is_empty() => (
            listed,
            format!("none of the files in KUBECONFIG={var} exist"),
        ),
        (_, Some(home)) => {
            let path = home.join(".kube").join("config");
            let missing = format!("{} does not exist", path.display());
            (vec![path], missing)
        }
        (_, None) => (Vec::new(), "HOME is not set".to_string()),
    };
    let merged = merge_files(&paths, false)?;
    if !merged.files.is_empty() {
        return from_kubeconfig(&merged, context);
    }
    if let Some(context) = context {
        return Err(ConfigError::NoConfiguration(format!(
            "--context {context:?} given but no kubeconfig was found ({missing})"
        )));
    }
    match (&env.service_host, &env.service_port) {
        (Some(host), Some(port)) => in_cluster(host, port, &env.sa_dir),
        _ => Err(ConfigError::NoConfiguration(format!(
            "no --kubeconfig given, {missing}, not in a cluster (KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT unset)"
        ))),
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
    let what = "in-cluster service account token".to_string();
    let credentials = Credentials::token_file(sa_dir.join("token"), what)?;
    let ca_path = sa_dir.join("ca.crt");
    let ca = read_file(&ca_path, "in-cluster service account CA")?;
    // The namespace file is optional: without it objects must name their namespace.
    let namespace = std::fs::read_to_string(sa_dir.join("namespace"))
        .ok()
        .map(|ns| ns.trim().to_string())
        .filter(|ns| !ns.is_empty());
    let ca_origin = format!("in-cluster service account CA {}", ca_path.display());
    let settings = TlsSettings {
        ca: Some((ca, ca_origin)),
        ..TlsSettings::default()
    };
    let source = "in-cluster".to_string();
    finish(server, namespace, source, credentials, settings)
}

fn finish(
    server: String,
    default_namespace: Option<String>,
    source: String,
    credentials: Credentials,
    tls: TlsSettings,
) -> Result<ClusterConfig, ConfigError> {
    // Built now so broken certificates fail at startup, not at the first request.
    let config = tls.build(None)?;
    Ok(ClusterConfig {
        server,
        default_namespace,
        source,
        credentials: Arc::new(credentials),
        proxy: None,
        tls,
        built: Mutex::new(BuiltTls {
            exec_pair: None,
            config,
        }),
    })
}

/// TLS inputs, each with where it came from so a bad one can be named.
#[derive(Default)]
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
    /// A client config; an exec plugin's certificate replaces the kubeconfig's, as in client-go.
    fn build(&self, exec: Option<&ClientPair>) -> Result<Arc<rustls::ClientConfig>, ConfigError> {
        let pair = exec.or(self.client.as_ref());
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
            let origin = origin.unwrap_or_else(|| "tls".into());
            ConfigError::Tls { origin, error }
        })
    }
}

/// Standard base64 with padding.
pub(crate) fn base64_encode(input: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(input)
}

#[cfg(test)]
pub(crate) mod tests;
