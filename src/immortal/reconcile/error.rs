//! Why a reconcile failed, and how the worker retries it.

use super::MAX_ROUNDS;
use crate::kube::client;
use crate::runtime::controller::Failure;
use crate::util;
use std::fmt;
use std::time::Duration;

/// Why a reconcile failed. Every variant is retried with the queue's per-key backoff; what
/// retrying cannot fix (an invalid spec, a name too long, a pod that is not ours) is not an
/// error but a status condition.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// An API call failed in a way a retry may fix: 5xx, 429, no answer, a 409 from a stale
    /// read, a pod name taken between our look and our create.
    Transient {
        action: &'static str,
        source: client::Error,
    },
    /// The API server refused us (401/403): RBAC, credentials, or admission (PodSecurity, a
    /// ResourceQuota). A person must act; retried with backoff, since that fix needs no restart.
    Denied {
        action: &'static str,
        source: client::Error,
    },
    /// The pod changed under every round of one reconcile (taken, freed, retaken). Retried
    /// with backoff rather than spun on.
    Unsettled { pod: String },
    /// Status could not be written (`source`) while our pod holds our finalizer for its count.
    /// Retried `within` at the latest: a pod being deleted (`deleting`) is released uncounted by
    /// then rather than kept from going (see `counting::HOLD_AT_MOST`); any other is counted
    /// and released soon after status can be written again (`counting::RECOUNT_AT_MOST`).
    Holding {
        pod: String,
        deleting: bool,
        within: Duration,
        source: Box<Error>,
    },
}

impl Error {
    pub(super) fn from_api(action: &'static str, source: client::Error) -> Error {
        if source.is_forbidden() || source.is_unauthorized() {
            Error::Denied { action, source }
        } else {
            Error::Transient { action, source }
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Transient { action, source } => write!(f, "{action}: {source}"),
            Error::Denied { action, source } => write!(f, "{action} denied: {source}"),
            Error::Unsettled { pod } => {
                write!(
                    f,
                    "pod {pod} changed under every one of {MAX_ROUNDS} attempts"
                )
            }
            Error::Holding {
                pod,
                deleting: true,
                within,
                source,
            } => write!(
                f,
                "{source}; pod {pod} is being deleted and waits on its count: it is let go uncounted in {}",
                util::human_duration(*within)
            ),
            Error::Holding {
                pod,
                deleting: false,
                within,
                source,
            } => write!(
                f,
                "{source}; pod {pod} holds our finalizer until it is counted: retried within {}",
                util::human_duration(*within)
            ),
        }
    }
}

impl std::error::Error for Error {}

impl Failure for Error {
    fn retry_after(&self) -> Option<Duration> {
        match self {
            Error::Transient { source, .. } | Error::Denied { source, .. } => source.retry_after(),
            Error::Unsettled { .. } => None,
            Error::Holding { source, within, .. } => source.retry_after().map(|d| d.min(*within)),
        }
    }
    fn retry_within(&self) -> Option<Duration> {
        match self {
            Error::Holding { within, .. } => Some(*within),
            _ => None,
        }
    }
    fn needs_a_person(&self) -> bool {
        match self {
            Error::Denied { .. } => true,
            Error::Holding { source, .. } => source.needs_a_person(),
            _ => false,
        }
    }
}
