//! Credentials for API requests: a static token, a token file re-read as the kubelet rotates
//! it, or an exec credential plugin (`exec.rs`), each refreshed on demand after a 401.

use std::ffi::OsString;
use std::fmt;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use serde::Deserialize;

use crate::util::lock;

mod exec;

pub(crate) use exec::ExecConfig;
use exec::*;

/// How long a token file's token is kept before a re-read (client-go's `NewCachedFileTokenSource`).
const TOKEN_FILE_MAX_AGE: Duration = Duration::from_secs(60);

/// An exec credential is refreshed this long before it expires, lest a request arrive after.
const EXEC_EXPIRY_MARGIN: Duration = Duration::from_secs(10);

/// An exec plugin still running after this is killed: client-go waits, but it would stall us.
const EXEC_TIMEOUT: Duration = Duration::from_secs(60);

const EXEC_API_VERSIONS: [&str; 2] = [
    "client.authentication.k8s.io/v1",
    "client.authentication.k8s.io/v1beta1",
];

/// Why a credential could not be set up or produced; messages never hold a token or key.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// A token file cannot be read, or is empty. Found at load; not retried.
    Read {
        what: String,
        path: PathBuf,
        error: io::Error,
    },
    /// An exec plugin setting the operator cannot honour. Found at load; not retried.
    Unsupported { origin: String, problem: String },
    /// An exec plugin failed or printed a bad ExecCredential; retried, as it runs again next call.
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
pub struct Credentials(Source);

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
        match &self.0 {
            Source::Anonymous => f.write_str("Credentials(none)"),
            Source::Token(_) => f.write_str("Credentials(token <redacted>)"),
            Source::TokenFile(file) => write!(f, "Credentials(token file {})", file.path.display()),
            Source::Exec(plugin) => write!(f, "Credentials(exec {:?})", plugin.config.command),
        }
    }
}

impl Credentials {
    pub(crate) fn anonymous() -> Credentials {
        Credentials(Source::Anonymous)
    }

    pub(crate) fn token(token: String) -> Credentials {
        Credentials(Source::Token(token))
    }

    /// A token read from `path` now, so that a missing file fails at startup, and again later.
    pub(crate) fn token_file(path: PathBuf, what: String) -> Result<Credentials, Error> {
        let token = read_token(&path, &what)?;
        let reread_at = Instant::now() + TOKEN_FILE_MAX_AGE;
        let cached = Mutex::new(CachedToken { token, reread_at });
        Ok(Credentials(Source::TokenFile(TokenFile {
            path,
            what,
            cached,
        })))
    }

    /// An exec plugin; it first runs when a credential is first needed.
    pub(crate) fn exec(config: ExecConfig) -> Result<Credentials, Error> {
        let version = config.api_version.as_str();
        let problem = if !EXEC_API_VERSIONS.contains(&version) {
            let known = EXEC_API_VERSIONS.join(" or ");
            format!("apiVersion {version:?} is not supported (use {known})")
        } else if config.interactive_mode.as_deref() == Some("Always") {
            // We never have a terminal; client-go refuses "Always" without one.
            "interactiveMode Always needs a terminal, which the operator does not have".into()
        } else {
            let plugin = ExecPlugin {
                config,
                timeout: EXEC_TIMEOUT,
                cached: Mutex::new(None),
            };
            return Ok(Credentials(Source::Exec(plugin)));
        };
        let origin = config.origin;
        Err(Error::Unsupported { origin, problem })
    }

    /// The Authorization header to send ("Bearer ..."), or None for cert-only/anonymous.
    pub fn authorization(&self) -> Result<Option<String>, Error> {
        let token = match &self.0 {
            Source::Anonymous => None,
            Source::Token(token) => Some(token.clone()),
            Source::TokenFile(file) => Some(file.current()),
            Source::Exec(plugin) => plugin.credential()?.token.clone(),
        };
        Ok(token.map(|t| format!("Bearer {t}")))
    }

    /// Forget the cached credential (after a 401) so the next call fetches a fresh one.
    pub fn invalidate(&self) {
        match &self.0 {
            Source::Anonymous | Source::Token(_) => {}
            Source::TokenFile(file) => lock(&file.cached).reread_at = Instant::now(),
            Source::Exec(plugin) => *lock(&plugin.cached) = None,
        }
    }

    /// The client certificate and key an exec plugin handed out, and where it is configured.
    pub(crate) fn client_certificate(&self) -> Result<Option<(PemPair, &str)>, Error> {
        let Source::Exec(plugin) = &self.0 else {
            return Ok(None);
        };
        let pair = plugin.credential()?.client.clone();
        Ok(pair.map(|pair| (pair, plugin.config.origin.as_str())))
    }
}

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
    /// The token, re-read once due; a read racing the kubelet's swap keeps the old, as client-go.
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
        let empty = io::Error::new(io::ErrorKind::InvalidData, "file is empty");
        return Err(read_error(empty));
    }
    Ok(token.to_string())
}

/// Removes the value serde quotes in "invalid type/value" messages: it may be a token.
pub(crate) fn redact_values(message: &str) -> String {
    const MARKERS: [&str; 5] = [
        "string \"",
        "integer `",
        "floating point `",
        "character `",
        "bytes \"",
    ];
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    let first = |rest: &str| {
        MARKERS
            .iter()
            .filter_map(|m| Some((rest.find(m)?, m.len())))
            .min()
    };
    while let Some((at, len)) = first(rest) {
        let quote = rest.as_bytes()[at + len - 1];
        out.push_str(&rest[..at + len]);
        out.push_str("...");
        let value = &rest.as_bytes()[at + len..];
        // Debug-formatted strings escape inner quotes; skip those.
        let mut escaped = false;
        let end = value.iter().position(|&b| {
            let end = b == quote && !escaped;
            escaped = b == b'\\' && !escaped;
            end
        });
        let Some(end) = end else {
            return out;
        };
        out.push(quote as char);
        rest = &rest[at + len + end + 1..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests;
