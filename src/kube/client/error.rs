//! What a request can fail with: the server's `Status`, or why no answer came.

use super::*;

#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The API server answered 4xx/5xx, with its `Status` (or one made from the code). 404, 409,
    /// 410 and 422 are answers, 429 and 5xx transient, 401 and 403 need a person.
    Api(Box<Status>),
    /// No HTTP answer: DNS, connect, TLS handshake, timeout, connection reset. Transient.
    Transport(String),
    /// The proxy was not reached (`status` 0) or refused CONNECT; retried but for 401/403/407.
    Proxy { status: u16, message: String },
    /// The TLS handshake failed; retried unless [`ClusterConfig::tls_misconfigured`] names it.
    Tls(rustls::Error),
    /// A 2xx answer whose body did not decode: a bug or a version skew, retried with backoff.
    Decode(String),
    /// Credentials could not be produced (exec plugin failed, token file unreadable).
    Credentials(ConfigError),
    /// A write refused before it was sent: this replica does not hold the leader Lease, or may
    /// no longer (see [`Fence`]). Retried with backoff; a replica that lost the Lease exits.
    Fenced,
}

impl Error {
    fn status(&self) -> Option<&Status> {
        match self {
            Error::Api(s) => Some(s),
            _ => None,
        }
    }
    /// HTTP status of an API error, 0 otherwise.
    pub fn code(&self) -> u16 {
        self.status().map_or(0, |s| s.code)
    }
    pub fn is_not_found(&self) -> bool {
        self.code() == 404
    }
    /// 409 with reason AlreadyExists: a create hit an existing name.
    pub fn is_already_exists(&self) -> bool {
        self.status()
            .is_some_and(|s| s.code == 409 && s.reason == "AlreadyExists")
    }
    /// 409 Conflict: a stale resourceVersion, or a DELETE's uid precondition that did not match.
    pub fn is_conflict(&self) -> bool {
        self.code() == 409 && !self.is_already_exists()
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
    /// The fields the API server warned it did not know and dropped, in an error's answer.
    pub fn unknown_fields(&self) -> Vec<&str> {
        self.status().map_or(Vec::new(), |s| {
            s.warnings
                .iter()
                .filter_map(|w| w.strip_prefix("unknown field \"")?.strip_suffix('"'))
                .collect()
        })
    }
    /// 422 with a cause on `metadata.uid`: a PATCH carrying a uid met another object of the name.
    pub fn is_uid_changed(&self) -> bool {
        self.is_invalid()
            && self
                .status()
                .and_then(|s| s.details.as_ref())
                .is_some_and(|d| d.causes.iter().any(|c| c.field == "metadata.uid"))
    }
    /// See [`Status::is_resource_version_too_large`]: list again.
    pub fn is_resource_version_too_large(&self) -> bool {
        self.status()
            .is_some_and(Status::is_resource_version_too_large)
    }
    /// How long the server asked us to wait (`Retry-After` or `details.retryAfterSeconds`).
    pub fn retry_after(&self) -> Option<Duration> {
        let seconds = self.status()?.details.as_ref()?.retry_after_seconds;
        seconds.map(Duration::from_secs)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Api(s) => {
                write!(f, "api error {} {}: {}", s.code, s.reason, s.message)?;
                for c in s.details.iter().flat_map(|d| &d.causes) {
                    write!(f, "; {}: {}", c.field, c.message)?;
                }
                Ok(())
            }
            Error::Transport(m) => write!(f, "transport error: {m}"),
            Error::Proxy { message, .. } => write!(f, "proxy error: {message}"),
            Error::Tls(e) => write!(f, "tls handshake failed: {e}"),
            Error::Decode(m) => write!(f, "decode error: {m}"),
            Error::Credentials(e) => write!(f, "credentials: {e}"),
            Error::Fenced => f.write_str(
                "write refused: this replica does not hold the leader lease (or may no longer)",
            ),
        }
    }
}

impl std::error::Error for Error {}
