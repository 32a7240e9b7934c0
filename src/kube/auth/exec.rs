//! Exec credential plugins as kubectl runs them, each answer cached until it expires.

use super::*;

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

pub(super) struct ExecPlugin {
    pub(super) config: ExecConfig,
    pub(super) timeout: Duration,
    pub(super) cached: Mutex<Option<Arc<ExecCredential>>>,
}

/// What the plugin handed out; not Debug, it is secret.
pub(super) struct ExecCredential {
    pub(super) token: Option<String>,
    pub(super) client: Option<PemPair>,
    pub(super) expires: Option<SystemTime>,
}

/// `ExecCredential` as printed by the plugin (v1 and v1beta1 share these fields).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct ExecOutput {
    api_version: Option<String>,
    kind: Option<String>,
    status: Option<ExecStatus>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct ExecStatus {
    token: Option<String>,
    expiration_timestamp: Option<String>,
    client_certificate_data: Option<String>,
    client_key_data: Option<String>,
}

impl ExecPlugin {
    /// The cached credential, or a new one if it is about to expire; concurrent callers wait.
    pub(super) fn credential(&self) -> Result<Arc<ExecCredential>, Error> {
        let mut cached = lock(&self.cached);
        let soon = SystemTime::now() + EXEC_EXPIRY_MARGIN;
        if let Some(credential) = cached.as_ref() {
            if credential.expires.is_none_or(|expires| soon < expires) {
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

    /// `exec plugin "COMMAND" {what}`.
    fn failed(&self, what: impl fmt::Display) -> Error {
        let command = self.config.command.to_string_lossy();
        self.error(format!("exec plugin {command:?} {what}"))
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
        // stderr is passed through, as client-go does, for the plugin's own diagnostics.
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
                return Err(self.failed(format!("not found{hint}")));
            }
            Err(e) => return Err(self.error(format!("cannot run exec plugin {command:?}: {e}"))),
        };

        // Read on a thread of its own, so a plugin that never closes it cannot block us.
        let (tx, rx) = mpsc::channel();
        if let Some(mut stdout) = child.stdout.take() {
            std::thread::spawn(move || {
                let mut out = Vec::new();
                let _ = tx.send(stdout.read_to_end(&mut out).map(|_| out));
            });
        }
        let deadline = Instant::now() + self.timeout;
        let timed_out = |child: &mut std::process::Child| {
            let _ = child.kill();
            let _ = child.wait();
            self.failed(format!("did not finish within {:?}", self.timeout))
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
            return Err(self.failed(format!("failed: {status}")));
        }
        self.parse(&stdout)
    }

    /// Checks the output as client-go does: the apiVersion asked for, a token or a key pair.
    fn parse(&self, stdout: &[u8]) -> Result<ExecCredential, Error> {
        let output: ExecOutput = serde_json::from_slice(stdout).map_err(|e| {
            let why = redact_values(&e.to_string());
            self.failed(format!("printed an invalid ExecCredential: {why}"))
        })?;
        let api_version = output.api_version.unwrap_or_default();
        if api_version != self.config.api_version {
            let want = &self.config.api_version;
            let got = format!("returned apiVersion {api_version:?}, expected {want:?}");
            return Err(self.failed(got));
        }
        if let Some(kind) = output.kind.filter(|k| k != "ExecCredential") {
            let got = format!("returned kind {kind:?}, expected \"ExecCredential\"");
            return Err(self.failed(got));
        }
        let status = output
            .status
            .ok_or_else(|| self.failed("returned no status"))?;
        let non_empty = |s: Option<String>| s.filter(|s| !s.is_empty());
        let expires = non_empty(status.expiration_timestamp).map(|text| {
            let invalid =
                || self.failed(format!("returned an invalid expirationTimestamp {text:?}"));
            crate::util::parse_rfc3339(&text).ok_or_else(invalid)
        });
        let expires = expires.transpose()?;
        let cert = non_empty(status.client_certificate_data);
        let client = match (cert, non_empty(status.client_key_data)) {
            (Some(cert), Some(key)) => Some((cert.into_bytes(), key.into_bytes())),
            (None, None) => None,
            _ => {
                let got = "returned only one of clientCertificateData and clientKeyData";
                return Err(self.failed(got));
            }
        };
        let token = non_empty(status.token);
        if token.is_none() && client.is_none() {
            let got = "returned neither a token nor a client certificate";
            return Err(self.failed(got));
        }
        Ok(ExecCredential {
            token,
            client,
            expires,
        })
    }
}
