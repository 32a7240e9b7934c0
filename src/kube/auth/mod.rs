//! Credentials for API requests: static token, rotating token file, or exec credential plugin.

use std::ffi::OsString;
use std::fmt;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use serde::Deserialize;

use crate::util::lock;

/// How long a token read from a file is used before the file is read again. Bound
/// service-account tokens are rotated by the kubelet at 80% of their lifetime (an hour or more),
/// and client-go re-reads token files every minute (`NewCachedFileTokenSource`).
const TOKEN_FILE_MAX_AGE: Duration = Duration::from_secs(60);

/// An exec credential is refreshed this long before its expirationTimestamp, so a request
/// sent just before expiry does not arrive just after it.
const EXEC_EXPIRY_MARGIN: Duration = Duration::from_secs(10);

/// An exec plugin that has not finished after this long is killed. client-go waits forever,
/// but a hung plugin here would stall every request of the operator.
const EXEC_TIMEOUT: Duration = Duration::from_secs(60);

/// Exec credential API versions we speak. v1alpha1 was removed in Kubernetes 1.24.
const EXEC_API_VERSIONS: [&str; 2] = [
    "client.authentication.k8s.io/v1",
    "client.authentication.k8s.io/v1beta1",
];

/// Why a credential could not be set up or produced. Every message names where it is
/// configured (`kubeconfig PATH, user "NAME", exec`) or the file at fault, never a token or key.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// A token file cannot be read, or is empty. At load: not retried. A failed re-read of a
    /// rotating token file keeps the previous token instead (see `TokenFile::current`).
    Read {
        what: String,
        path: PathBuf,
        error: io::Error,
    },
    /// An exec plugin setting the operator cannot honour (an apiVersion it does not speak,
    /// `interactiveMode: Always`). Found at load; not retried.
    Unsupported { origin: String, problem: String },
    /// An exec credential plugin was not found, failed, timed out or printed a bad
    /// ExecCredential. Returned on use (`authorization()`, `client_certificate()`); the plugin
    /// runs again on the next call, so callers retry with backoff.
    Exec { origin: String, problem: String },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Read { what, path, error } => {
                write!(f, "{what}: cannot read {}: {error}", path.display())
            }
            Error::Unsupported { origin, problem } | Error::Exec { origin, problem } => {
                write!(f, "{origin}: {problem}")
            }
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Read { error, .. } => Some(error),
            _ => None,
        }
    }
}

/// A client certificate chain and its private key, both PEM.
pub(crate) type PemPair = (Vec<u8>, Vec<u8>);

/// How to authenticate requests. Shared by all threads; caches sit behind mutexes.
pub struct Credentials {
    source: Source,
}

enum Source {
    /// No Authorization header: anonymous, or a client certificate does the job.
    Anonymous,
    Token(String),
    TokenFile(TokenFile),
    Exec(ExecPlugin),
}

impl fmt::Debug for Credentials {
    // Names the kind and where it comes from; never the token or key.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.source {
            Source::Anonymous => f.write_str("Credentials(none)"),
            Source::Token(_) => f.write_str("Credentials(token <redacted>)"),
            Source::TokenFile(file) => write!(f, "Credentials(token file {})", file.path.display()),
            Source::Exec(plugin) => write!(f, "Credentials(exec {:?})", plugin.config.command),
        }
    }
}

impl Credentials {
    pub(crate) fn anonymous() -> Credentials {
        Credentials {
            source: Source::Anonymous,
        }
    }

    pub(crate) fn token(token: String) -> Credentials {
        Credentials {
            source: Source::Token(token),
        }
    }

    /// A token read from `path` now (so a missing file fails at startup) and again whenever the
    /// copy is older than a minute. `what` names the file in errors.
    pub(crate) fn token_file(path: PathBuf, what: String) -> Result<Credentials, Error> {
        let token = read_token(&path, &what)?;
        Ok(Credentials {
            source: Source::TokenFile(TokenFile {
                path,
                what,
                cached: Mutex::new(CachedToken {
                    token,
                    reread_at: Instant::now() + TOKEN_FILE_MAX_AGE,
                }),
            }),
        })
    }

    /// An exec plugin; it first runs when a credential is first needed.
    pub(crate) fn exec(config: ExecConfig) -> Result<Credentials, Error> {
        if !EXEC_API_VERSIONS.contains(&config.api_version.as_str()) {
            return Err(Error::Unsupported {
                origin: config.origin,
                problem: format!(
                    "apiVersion {:?} is not supported (use {})",
                    config.api_version,
                    EXEC_API_VERSIONS.join(" or ")
                ),
            });
        }
        // We never have a terminal; client-go refuses "Always" without one.
        if config.interactive_mode.as_deref() == Some("Always") {
            return Err(Error::Unsupported {
                origin: config.origin,
                problem:
                    "interactiveMode Always needs a terminal, which the operator does not have"
                        .into(),
            });
        }
        Ok(Credentials {
            source: Source::Exec(ExecPlugin {
                config,
                timeout: EXEC_TIMEOUT,
                cached: Mutex::new(None),
            }),
        })
    }

    /// The Authorization header value to send ("Bearer ..."), or None for cert-only/anonymous.
    /// Re-reads a rotating token file / re-runs an expired exec plugin as needed.
    pub fn authorization(&self) -> Result<Option<String>, Error> {
        let token = match &self.source {
            Source::Anonymous => None,
            Source::Token(token) => Some(token.clone()),
            Source::TokenFile(file) => Some(file.current()),
            Source::Exec(plugin) => plugin.credential()?.token.clone(),
        };
        Ok(token.map(|t| format!("Bearer {t}")))
    }

    /// Forget the cached credential (after a 401) so the next call fetches a fresh one.
    pub fn invalidate(&self) {
        match &self.source {
            Source::Anonymous | Source::Token(_) => {}
            Source::TokenFile(file) => lock(&file.cached).reread_at = Instant::now(),
            Source::Exec(plugin) => *lock(&plugin.cached) = None,
        }
    }

    /// The client certificate and key (PEM) an exec plugin handed out, running it if needed;
    /// None for every other kind of credential.
    pub(crate) fn client_certificate(&self) -> Result<Option<PemPair>, Error> {
        match &self.source {
            Source::Exec(plugin) => Ok(plugin.credential()?.client.clone()),
            _ => Ok(None),
        }
    }

    /// Where the exec plugin is configured, for error messages.
    pub(crate) fn exec_origin(&self) -> Option<&str> {
        match &self.source {
            Source::Exec(plugin) => Some(&plugin.config.origin),
            _ => None,
        }
    }
}

// ---- token files ----

struct TokenFile {
    path: PathBuf,
    what: String,
    cached: Mutex<CachedToken>,
}

struct CachedToken {
    token: String,
    reread_at: Instant,
}

impl TokenFile {
    /// The token, re-read lazily once the cached copy is due. If the re-read fails (the kubelet
    /// swaps the file by symlink, a read can race it) the previous token is kept, as client-go's
    /// caching token source does, and the file is tried again a minute later.
    fn current(&self) -> String {
        let mut cached = lock(&self.cached);
        if Instant::now() >= cached.reread_at {
            cached.reread_at = Instant::now() + TOKEN_FILE_MAX_AGE;
            match read_token(&self.path, &self.what) {
                Ok(token) => cached.token = token,
                Err(e) => log::warn!(error:% = e; "keeping the previous token"),
            }
        }
        cached.token.clone()
    }
}

fn read_token(path: &Path, what: &str) -> Result<String, Error> {
    let read_error = |error| Error::Read {
        what: what.to_string(),
        path: path.to_path_buf(),
        error,
    };
    let text = std::fs::read_to_string(path).map_err(read_error)?;
    let token = text.trim();
    if token.is_empty() {
        return Err(read_error(io::Error::new(
            io::ErrorKind::InvalidData,
            "file is empty",
        )));
    }
    Ok(token.to_string())
}

// ---- exec plugins ----

/// An exec credential plugin as configured in a kubeconfig user (`exec:`), paths resolved.
pub(crate) struct ExecConfig {
    /// Where it is configured: `kubeconfig /path, user "name", exec`.
    pub origin: String,
    pub command: OsString,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub api_version: String,
    pub install_hint: Option<String>,
    pub interactive_mode: Option<String>,
    /// `spec.cluster` for plugins with provideClusterInfo.
    pub cluster: Option<serde_json::Value>,
}

struct ExecPlugin {
    config: ExecConfig,
    timeout: Duration,
    cached: Mutex<Option<Arc<ExecCredential>>>,
}

/// What the plugin handed out; not Debug, it is secret.
struct ExecCredential {
    token: Option<String>,
    client: Option<PemPair>,
    expires: Option<SystemTime>,
}

/// `ExecCredential` as printed by the plugin (v1 and v1beta1 share these fields).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ExecOutput {
    api_version: Option<String>,
    kind: Option<String>,
    status: Option<ExecStatus>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ExecStatus {
    token: Option<String>,
    expiration_timestamp: Option<String>,
    client_certificate_data: Option<String>,
    client_key_data: Option<String>,
}

impl ExecPlugin {
    /// The cached credential, or a new one if there is none or it is about to expire. A
    /// credential without expirationTimestamp is kept until `invalidate()`, as in client-go.
    /// The lock is held while the plugin runs, so concurrent callers wait for one run.
    fn credential(&self) -> Result<Arc<ExecCredential>, Error> {
        let mut cached = lock(&self.cached);
        if let Some(credential) = cached.as_ref() {
            let fresh = match credential.expires {
                None => true,
                Some(expires) => SystemTime::now() + EXEC_EXPIRY_MARGIN < expires,
            };
            if fresh {
                return Ok(credential.clone());
            }
        }
        let credential = Arc::new(self.run()?);
        *cached = Some(credential.clone());
        Ok(credential)
    }

    fn error(&self, problem: String) -> Error {
        Error::Exec {
            origin: self.config.origin.clone(),
            problem,
        }
    }

    fn run(&self) -> Result<ExecCredential, Error> {
        let config = &self.config;
        let command = config.command.to_string_lossy();
        let mut spec = serde_json::json!({ "interactive": false });
        if let Some(cluster) = &config.cluster {
            spec["cluster"] = cluster.clone();
        }
        let exec_info = serde_json::json!({
            "apiVersion": config.api_version,
            "kind": "ExecCredential",
            "spec": spec,
        });
        // stderr is passed through (client-go does the same) so the plugin's own diagnostics
        // reach the operator's log stream.
        let spawned = Command::new(&config.command)
            .args(&config.args)
            .envs(config.env.iter().map(|(k, v)| (k, v)))
            .env("KUBERNETES_EXEC_INFO", exec_info.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn();
        let mut child = match spawned {
            Ok(child) => child,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let hint = config
                    .install_hint
                    .as_deref()
                    .map(|h| format!(" ({})", h.trim()))
                    .unwrap_or_default();
                return Err(self.error(format!("exec plugin {command:?} not found{hint}")));
            }
            Err(e) => return Err(self.error(format!("cannot run exec plugin {command:?}: {e}"))),
        };

        // Read stdout on a helper thread so a plugin that never exits (or leaves a child holding
        // the pipe) cannot block us past the timeout.
        let (tx, rx) = mpsc::channel();
        if let Some(mut stdout) = child.stdout.take() {
            std::thread::spawn(move || {
                let mut out = Vec::new();
                let result = stdout.read_to_end(&mut out).map(|_| out);
                let _ = tx.send(result);
            });
        }
        let deadline = Instant::now() + self.timeout;
        let timed_out = |child: &mut std::process::Child| {
            let _ = child.kill();
            let _ = child.wait();
            self.error(format!(
                "exec plugin {command:?} did not finish within {:?}",
                self.timeout
            ))
        };
        let stdout = match rx.recv_timeout(self.timeout) {
            Ok(Ok(out)) => out,
            Ok(Err(e)) => {
                return Err(self.error(format!("reading exec plugin {command:?} output: {e}")))
            }
            Err(_) => return Err(timed_out(&mut child)),
        };
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                Ok(None) => return Err(timed_out(&mut child)),
                Err(e) => {
                    return Err(self.error(format!("waiting for exec plugin {command:?}: {e}")))
                }
            }
        };
        if !status.success() {
            return Err(self.error(format!("exec plugin {command:?} failed: {status}")));
        }
        self.parse(&stdout)
    }

    /// Checks the output the way client-go does: same apiVersion as requested, a status, and a
    /// token or a complete certificate/key pair.
    fn parse(&self, stdout: &[u8]) -> Result<ExecCredential, Error> {
        let command = self.config.command.to_string_lossy();
        let output: ExecOutput = serde_json::from_slice(stdout).map_err(|e| {
            self.error(format!(
                "exec plugin {command:?} printed an invalid ExecCredential: {}",
                redact_values(&e.to_string())
            ))
        })?;
        let api_version = output.api_version.unwrap_or_default();
        if api_version != self.config.api_version {
            return Err(self.error(format!(
                "exec plugin {command:?} returned apiVersion {api_version:?}, expected {:?}",
                self.config.api_version
            )));
        }
        if let Some(kind) = output.kind.filter(|k| k != "ExecCredential") {
            return Err(self.error(format!(
                "exec plugin {command:?} returned kind {kind:?}, expected \"ExecCredential\""
            )));
        }
        let Some(status) = output.status else {
            return Err(self.error(format!("exec plugin {command:?} returned no status")));
        };
        let expires = match status
            .expiration_timestamp
            .as_deref()
            .filter(|t| !t.is_empty())
        {
            None => None,
            Some(text) => Some(crate::util::parse_rfc3339(text).ok_or_else(|| {
                self.error(format!(
                    "exec plugin {command:?} returned an invalid expirationTimestamp {text:?}"
                ))
            })?),
        };
        let non_empty = |s: Option<String>| s.filter(|s| !s.is_empty());
        let client = match (
            non_empty(status.client_certificate_data),
            non_empty(status.client_key_data),
        ) {
            (Some(cert), Some(key)) => Some((cert.into_bytes(), key.into_bytes())),
            (None, None) => None,
            _ => {
                return Err(self.error(format!(
                    "exec plugin {command:?} returned only one of clientCertificateData and clientKeyData"
                )))
            }
        };
        let token = non_empty(status.token);
        if token.is_none() && client.is_none() {
            return Err(self.error(format!(
                "exec plugin {command:?} returned neither a token nor a client certificate"
            )));
        }
        Ok(ExecCredential {
            token,
            client,
            expires,
        })
    }
}

/// Removes the offending value serde quotes in "invalid type/value" messages (for example
/// `invalid type: integer `123`, expected a string`): that value may be a token.
pub(crate) fn redact_values(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(start) = [
        "string \"",
        "integer `",
        "floating point `",
        "character `",
        "bytes \"",
    ]
    .iter()
    .filter_map(|marker| rest.find(marker).map(|i| (i, marker.len())))
    .min()
    {
        let (at, len) = start;
        let quote = rest.as_bytes()[at + len - 1];
        out.push_str(&rest[..at + len]);
        let value = &rest[at + len..];
        // Debug-formatted strings escape inner quotes; skip those.
        let mut end = None;
        let mut escaped = false;
        for (i, b) in value.bytes().enumerate() {
            match b {
                b'\\' if !escaped => escaped = true,
                b if b == quote && !escaped => {
                    end = Some(i);
                    break;
                }
                _ => escaped = false,
            }
        }
        match end {
            Some(end) => {
                out.push_str("...");
                out.push(quote as char);
                rest = &value[end + 1..];
            }
            None => {
                out.push_str("...");
                return out;
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube::config::tests::{b64_fixture, empty_env, kubeconfig, with_file, TempDir};
    use crate::kube::config::{load_with_env, ClusterConfig, LoadOptions};
    use crate::kube::tls::tests::{fixture, get, one_shot_server};
    use std::os::unix::fs::PermissionsExt;

    /// Serializes the tests that write and run plugin scripts: a script still open for writing
    /// in a process forked by another test thread cannot be executed ("text file busy").
    static PLUGIN_LOCK: Mutex<()> = Mutex::new(());

    /// A fake plugin: counts its runs, records its environment and arguments, prints
    /// `response.json` and exits with `exit-code`, all in its directory.
    const PLUGIN: &str = r#"#!/bin/sh
dir="$PLUGIN_DIR"
n=$(cat "$dir/count" 2>/dev/null || echo 0)
echo $((n + 1)) > "$dir/count"
printf '%s' "$KUBERNETES_EXEC_INFO" > "$dir/exec-info"
printf '%s\n' "$@" > "$dir/args"
cat "$dir/response.json"
exit "$(cat "$dir/exit-code" 2>/dev/null || echo 0)"
"#;

    struct Plugin {
        dir: TempDir,
        kubeconfig: PathBuf,
    }

    impl Plugin {
        /// A kubeconfig whose user runs `./bin/plugin` (relative to the kubeconfig) with
        /// `api_version`; `extra` adds exec fields, `cluster` cluster fields.
        fn new(api_version: &str, extra: &str, cluster: &str) -> Plugin {
            let dir = TempDir::new("exec");
            let script = dir.write("kube/bin/plugin", PLUGIN);
            std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
            let user = format!(
                "    exec:
      apiVersion: {api_version}
      command: ./bin/plugin
      args: [--flag, value]
      env:
      - name: PLUGIN_DIR
        value: {}
      installHint: null
{extra}",
                dir.0.display()
            );
            let kubeconfig = dir.write(
                "kube/config",
                kubeconfig("https://127.0.0.1:6443", cluster, &user),
            );
            Plugin { dir, kubeconfig }
        }

        fn respond(&self, api_version: &str, status: serde_json::Value) {
            let body = serde_json::json!({
                "apiVersion": api_version, "kind": "ExecCredential", "status": status,
            });
            self.dir.write("response.json", body.to_string());
        }

        fn runs(&self) -> u32 {
            std::fs::read_to_string(self.dir.0.join("count"))
                .map(|s| s.trim().parse().unwrap())
                .unwrap_or(0)
        }

        fn load(&self) -> ClusterConfig {
            load_with_env(&with_file(&self.kubeconfig), &empty_env(&self.dir)).unwrap()
        }

        fn exec_info(&self) -> serde_json::Value {
            serde_json::from_str(&std::fs::read_to_string(self.dir.0.join("exec-info")).unwrap())
                .unwrap()
        }
    }

    const V1: &str = "client.authentication.k8s.io/v1";
    const V1BETA1: &str = "client.authentication.k8s.io/v1beta1";

    use crate::util::rfc3339;

    #[test]
    fn exec_v1_token_is_cached_until_invalidated() {
        let _guard = lock(&PLUGIN_LOCK);
        let plugin = Plugin::new(V1, "      interactiveMode: IfAvailable", "");
        let in_an_hour = rfc3339(SystemTime::now() + Duration::from_secs(3600));
        plugin.respond(
            V1,
            serde_json::json!({"token": "tok-1", "expirationTimestamp": in_an_hour}),
        );
        let config = plugin.load();
        assert_eq!(
            plugin.runs(),
            0,
            "the plugin runs only when a credential is needed"
        );

        for _ in 0..3 {
            assert_eq!(
                config.credentials.authorization().unwrap().as_deref(),
                Some("Bearer tok-1")
            );
        }
        assert_eq!(plugin.runs(), 1);

        plugin.respond(
            V1,
            serde_json::json!({"token": "tok-2", "expirationTimestamp": in_an_hour}),
        );
        config.credentials.invalidate();
        assert_eq!(
            config.credentials.authorization().unwrap().as_deref(),
            Some("Bearer tok-2")
        );
        assert_eq!(plugin.runs(), 2);

        let args = std::fs::read_to_string(plugin.dir.0.join("args")).unwrap();
        assert_eq!(args, "--flag\nvalue\n");
        assert_eq!(
            plugin.exec_info(),
            serde_json::json!({"apiVersion": V1, "kind": "ExecCredential", "spec": {"interactive": false}})
        );
    }

    #[test]
    fn exec_v1beta1_token_is_refreshed_once_expired() {
        let _guard = lock(&PLUGIN_LOCK);
        let plugin = Plugin::new(V1BETA1, "", "");
        plugin.respond(
            V1BETA1,
            serde_json::json!({"token": "old", "expirationTimestamp": "2020-01-01T00:00:00Z"}),
        );
        let config = plugin.load();
        config.credentials.authorization().unwrap();
        config.credentials.authorization().unwrap();
        assert_eq!(plugin.runs(), 2, "an expired credential is never reused");
        assert_eq!(plugin.exec_info()["apiVersion"], V1BETA1);
    }

    #[test]
    fn exec_token_expiring_within_the_margin_is_refreshed() {
        let _guard = lock(&PLUGIN_LOCK);
        let plugin = Plugin::new(V1, "", "");
        let soon = rfc3339(SystemTime::now() + EXEC_EXPIRY_MARGIN / 2);
        plugin.respond(
            V1,
            serde_json::json!({"token": "t", "expirationTimestamp": soon}),
        );
        let config = plugin.load();
        config.credentials.authorization().unwrap();
        config.credentials.authorization().unwrap();
        assert_eq!(plugin.runs(), 2);
    }

    #[test]
    fn exec_token_without_expiry_is_kept_until_invalidated() {
        let _guard = lock(&PLUGIN_LOCK);
        let plugin = Plugin::new(V1, "", "");
        plugin.respond(V1, serde_json::json!({"token": "forever"}));
        let config = plugin.load();
        for _ in 0..3 {
            config.credentials.authorization().unwrap();
        }
        assert_eq!(plugin.runs(), 1);
        config.credentials.invalidate();
        config.credentials.authorization().unwrap();
        assert_eq!(plugin.runs(), 2);
    }

    #[test]
    fn exec_client_certificate_is_presented_and_replaced_after_invalidate() {
        let _guard = lock(&PLUGIN_LOCK);
        let plugin = Plugin::new(
            V1,
            "",
            &format!("    certificate-authority-data: {}", b64_fixture("ca.crt")),
        );
        let pem = |name: &str| String::from_utf8(fixture(name)).unwrap();
        plugin.respond(
            V1,
            serde_json::json!({
                "clientCertificateData": pem("client-ec.crt"), "clientKeyData": pem("client-ec.key"),
            }),
        );
        let config = plugin.load();
        assert_eq!(config.credentials.authorization().unwrap(), None);

        let first = config.tls_config().unwrap();
        assert!(
            Arc::ptr_eq(&first, &config.tls_config().unwrap()),
            "unchanged certificate, same config"
        );
        let (port, rx) = one_shot_server("server.crt", "server.key", true);
        assert_eq!(get(first.clone(), "127.0.0.1", port).unwrap(), "ok");
        let seen = rx
            .recv_timeout(Duration::from_secs(10))
            .unwrap()
            .unwrap()
            .unwrap();
        use rustls::pki_types::pem::PemObject;
        let ec_der =
            rustls::pki_types::CertificateDer::from_pem_slice(&fixture("client-ec.crt")).unwrap();
        assert_eq!(seen, ec_der.to_vec());

        plugin.respond(
            V1,
            serde_json::json!({
                "clientCertificateData": pem("client-rsa.crt"), "clientKeyData": pem("client-rsa.key"),
            }),
        );
        config.credentials.invalidate();
        let second = config.tls_config().unwrap();
        assert!(
            !Arc::ptr_eq(&first, &second),
            "a new certificate needs a new agent"
        );
        assert_eq!(plugin.runs(), 2);
    }

    #[test]
    fn exec_plugin_gets_cluster_info_when_asked() {
        let _guard = lock(&PLUGIN_LOCK);
        let plugin = Plugin::new(
            V1,
            "      provideClusterInfo: true",
            &format!(
                "    certificate-authority-data: {}
    tls-server-name: kubernetes.test
    extensions:
    - name: client.authentication.k8s.io/exec
      extension: {{audience: operators}}",
                b64_fixture("ca.crt")
            ),
        );
        plugin.respond(V1, serde_json::json!({"token": "t"}));
        plugin.load().credentials.authorization().unwrap();
        let cluster = &plugin.exec_info()["spec"]["cluster"];
        assert_eq!(cluster["server"], "https://127.0.0.1:6443");
        assert_eq!(cluster["tls-server-name"], "kubernetes.test");
        assert_eq!(cluster["certificate-authority-data"], b64_fixture("ca.crt"));
        assert_eq!(
            cluster["config"],
            serde_json::json!({"audience": "operators"})
        );
    }

    #[test]
    fn failing_plugin_is_an_error_and_is_retried_on_the_next_call() {
        let _guard = lock(&PLUGIN_LOCK);
        let plugin = Plugin::new(V1, "", "");
        plugin.respond(V1, serde_json::json!({"token": "s3cr3t"}));
        plugin.dir.write("exit-code", "3");
        let config = plugin.load();
        let text = config.credentials.authorization().unwrap_err().to_string();
        assert_eq!(
            text,
            format!(
                "kubeconfig {}, user \"test-user\", exec: exec plugin {:?} failed: exit status: 3",
                plugin.kubeconfig.display(),
                plugin.dir.0.join("kube/bin/plugin").display().to_string()
            )
        );
        std::fs::remove_file(plugin.dir.0.join("exit-code")).unwrap();
        assert_eq!(
            config.credentials.authorization().unwrap().as_deref(),
            Some("Bearer s3cr3t")
        );
        assert_eq!(plugin.runs(), 2);
    }

    #[test]
    fn plugin_answering_another_api_version_is_refused() {
        let _guard = lock(&PLUGIN_LOCK);
        let plugin = Plugin::new(V1, "", "");
        plugin.respond(V1BETA1, serde_json::json!({"token": "t"}));
        let text = plugin
            .load()
            .credentials
            .authorization()
            .unwrap_err()
            .to_string();
        assert!(
            text.ends_with(&format!("returned apiVersion {V1BETA1:?}, expected {V1:?}")),
            "{text}"
        );
    }

    #[test]
    fn plugin_output_problems_are_named_without_echoing_secrets() {
        let _guard = lock(&PLUGIN_LOCK);
        let plugin = Plugin::new(V1, "", "");
        let config = plugin.load();
        let cases = [
            (
                serde_json::json!({"token": 987654321}),
                "invalid ExecCredential: invalid type: integer `...`, expected a string",
            ),
            (
                serde_json::json!({}),
                "returned neither a token nor a client certificate",
            ),
            (
                serde_json::json!({"clientKeyData": "s3cr3t"}),
                "returned only one of clientCertificateData and clientKeyData",
            ),
            (
                serde_json::json!({"token": "s3cr3t", "expirationTimestamp": "tomorrow"}),
                "returned an invalid expirationTimestamp \"tomorrow\"",
            ),
        ];
        for (status, expected) in cases {
            plugin.respond(V1, status);
            let text = config.credentials.authorization().unwrap_err().to_string();
            assert!(text.contains(expected), "{text}");
            assert!(
                !text.contains("s3cr3t") && !text.contains("987654321"),
                "{text}"
            );
        }
        plugin.dir.write(
            "response.json",
            r#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential"}"#,
        );
        let text = config.credentials.authorization().unwrap_err().to_string();
        assert!(text.ends_with("returned no status"), "{text}");
    }

    #[test]
    fn missing_plugin_says_not_found_with_the_install_hint() {
        let dir = TempDir::new("no-plugin");
        let user = "    exec:
      apiVersion: client.authentication.k8s.io/v1
      command: immortal-test-no-such-plugin
      installHint: install it from example.com";
        let path = dir.write("config", kubeconfig("https://127.0.0.1:6443", "", user));
        let config = load_with_env(&with_file(&path), &empty_env(&dir)).unwrap();
        let text = config.credentials.authorization().unwrap_err().to_string();
        assert_eq!(
            text,
            format!(
                "kubeconfig {}, user \"test-user\", exec: exec plugin \"immortal-test-no-such-plugin\" not found (install it from example.com)",
                path.display()
            )
        );
        assert!(
            config.tls_config().is_err(),
            "tls_config also needs the plugin"
        );
    }

    #[test]
    fn unsupported_exec_settings_are_refused_at_load() {
        let dir = TempDir::new("exec-settings");
        let load = |exec: &str| {
            let path = dir.write("config", kubeconfig("https://127.0.0.1:6443", "", exec));
            load_with_env(&with_file(&path), &empty_env(&dir))
                .unwrap_err()
                .to_string()
        };
        let text =
            load("    exec: {apiVersion: client.authentication.k8s.io/v1alpha1, command: x}");
        assert!(text.ends_with("apiVersion \"client.authentication.k8s.io/v1alpha1\" is not supported (use client.authentication.k8s.io/v1 or client.authentication.k8s.io/v1beta1)"), "{text}");
        let text = load("    exec: {apiVersion: client.authentication.k8s.io/v1, command: x, interactiveMode: Always}");
        assert!(
            text.contains("interactiveMode Always needs a terminal"),
            "{text}"
        );
        let text = load("    exec: {apiVersion: client.authentication.k8s.io/v1}");
        assert!(
            text.ends_with("user \"test-user\", exec: no command set"),
            "{text}"
        );
    }

    #[test]
    fn hung_plugin_is_killed_after_the_timeout() {
        let _guard = lock(&PLUGIN_LOCK);
        let dir = TempDir::new("hung");
        let script = dir.write("plugin", "#!/bin/sh\nexec sleep 30\n");
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut credentials = Credentials::exec(ExecConfig {
            origin: "test".into(),
            command: script.into_os_string(),
            args: vec![],
            env: vec![],
            api_version: V1.into(),
            install_hint: None,
            interactive_mode: None,
            cluster: None,
        })
        .unwrap();
        if let Source::Exec(plugin) = &mut credentials.source {
            plugin.timeout = Duration::from_millis(300);
        }
        let started = Instant::now();
        let text = credentials.authorization().unwrap_err().to_string();
        assert!(text.ends_with("did not finish within 300ms"), "{text}");
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    fn token_file_of(config: &ClusterConfig) -> &TokenFile {
        match &config.credentials.source {
            Source::TokenFile(file) => file,
            _ => panic!("expected a token file"),
        }
    }

    #[test]
    fn in_cluster_token_is_reread_once_older_than_a_minute() {
        let dir = TempDir::new("rotation");
        dir.write("sa/token", "first");
        dir.write("sa/ca.crt", fixture("ca.crt"));
        let mut env = empty_env(&dir);
        env.sa_dir = dir.0.join("sa");
        env.service_host = Some("10.96.0.1".into());
        env.service_port = Some("443".into());
        let config = load_with_env(&LoadOptions::default(), &env).unwrap();
        let header = || config.credentials.authorization().unwrap().unwrap();

        dir.write("sa/token", "second\n");
        assert_eq!(header(), "Bearer first", "a fresh copy is not re-read");

        // Make the cached copy look a minute old.
        lock(&token_file_of(&config).cached).reread_at = Instant::now();
        assert_eq!(header(), "Bearer second");

        // A failed re-read keeps the token it had.
        std::fs::remove_file(dir.0.join("sa/token")).unwrap();
        config.credentials.invalidate();
        assert_eq!(header(), "Bearer second");
    }

    #[test]
    fn empty_token_file_is_an_error() {
        let dir = TempDir::new("empty-token");
        let token = dir.write("token", "\n");
        let text = Credentials::token_file(token.clone(), "tokenFile".into())
            .unwrap_err()
            .to_string();
        assert_eq!(
            text,
            format!("tokenFile: cannot read {}: file is empty", token.display())
        );
    }

    #[test]
    fn debug_names_the_kind_of_credential_but_not_the_secret() {
        let dir = TempDir::new("debug-creds");
        let path = dir.write("token", "s3cr3t");
        let cases = [
            (
                Credentials::token("s3cr3t".into()),
                "Credentials(token <redacted>)".to_string(),
            ),
            (
                Credentials::token_file(path.clone(), "t".into()).unwrap(),
                format!("Credentials(token file {})", path.display()),
            ),
            (Credentials::anonymous(), "Credentials(none)".to_string()),
        ];
        for (credentials, expected) in cases {
            assert_eq!(format!("{credentials:?}"), expected);
        }
    }

    #[test]
    fn redaction_removes_quoted_values_and_keeps_the_rest() {
        assert_eq!(
            redact_values(
                "invalid type: string \"t0k\\\"en\", expected a boolean at line 3 column 5"
            ),
            "invalid type: string \"...\", expected a boolean at line 3 column 5"
        );
        assert_eq!(
            redact_values("invalid type: integer `12345`, expected a string"),
            "invalid type: integer `...`, expected a string"
        );
        assert_eq!(
            redact_values("missing field `name`"),
            "missing field `name`"
        );
    }
}
