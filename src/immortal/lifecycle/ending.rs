//! How a pod of ours ended, read from the pod's own clocks, for the restart back-off.

use super::view::{condition, container, grace_period};
use crate::kube::types::Pod;
use crate::util;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// How a pod of ours ended, why, and how long its container had run by then.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Ending {
    pub how: How,
    /// How long the container had run by then; `None` when it never started (or no clock says).
    pub ran: Option<Duration>,
    /// Who ended it, in Kubernetes' word: its DisruptionTarget condition's reason
    /// (`EvictionByEvictionAPI`, `DeletionByTaintManager`, ...), or the kubelet's for a pod that
    /// ended on its own (`Evicted`); a `kubectl delete` leaves none. Shared: a drain ends many.
    pub reason: Option<Arc<str>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum How {
    /// Deleted through the API, or evicted.
    Deleted,
    /// Ended on its own, phase Succeeded or Failed with nobody asking: the cluster's doing, as
    /// our pods restart their container (`activeDeadlineSeconds`, node pressure, a shutdown).
    Ended,
}

impl Ending {
    /// How `pod` ended, or `None` when it still runs (it only left our label selector).
    pub fn of(pod: &Pod) -> Option<Ending> {
        let terminal = matches!(pod.phase(), "Succeeded" | "Failed");
        let c = pod.status.as_ref().and_then(container);
        let at = |t: Option<&String>| t.and_then(|t| util::parse_rfc3339(t));
        let started = c.and_then(|c| {
            at(c.state.running.as_ref().and_then(|r| r.started_at.as_ref()))
                .or_else(|| at(c.state.terminated.as_ref()?.started_at.as_ref()))
                .or_else(|| at(c.last_state.terminated.as_ref()?.started_at.as_ref()))
        });
        let finished = at(c.and_then(|c| c.state.terminated.as_ref()?.finished_at.as_ref()));
        // Asked for at deletionTimestamp - deletionGracePeriodSeconds (the API's `BeforeDelete`).
        let asked = at(pod.metadata.deletion_timestamp.as_ref())
            .map(|t| t.checked_sub(grace_period(pod)).unwrap_or(t));
        let (how, end) = match (asked, terminal) {
            // Terminal before the deletion was asked for: it ended, then was cleared away.
            (Some(asked), true) if finished.is_some_and(|f| f < asked) => (How::Ended, finished),
            (Some(asked), _) => (How::Deleted, Some(asked)),
            (None, true) => (How::Ended, finished),
            (None, false) => return None,
        };
        let ran = started
            .zip(end)
            .map(|(s, e)| e.duration_since(s).unwrap_or_default());
        let st = pod.status.as_ref();
        let disruption = st
            .and_then(|st| condition(st, "DisruptionTarget"))
            .filter(|c| c.status == "True")
            .map(|c| c.reason.as_str());
        let own = st.map(|st| st.reason.as_str());
        // A pod that ended on its own says best why (a node-pressure eviction's says `Evicted`).
        let reason = match how {
            How::Deleted => disruption.or(own),
            How::Ended => own.filter(|r| !r.is_empty()).or(disruption),
        };
        let reason = reason.filter(|r| !r.is_empty()).map(util::intern);
        Some(Ending { how, ran, reason })
    }

    /// Who ended it, if the pod said.
    pub fn reason(&self) -> Option<&str> {
        self.reason.as_deref()
    }
}

impl fmt::Display for Ending {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verb = match self.how {
            How::Deleted => "was deleted",
            How::Ended => "ended",
        };
        f.write_str(verb)?;
        if let Some(reason) = self.reason() {
            write!(f, " ({reason})")?;
        }
        match self.ran {
            Some(d) => write!(f, " {} after it started", util::human_duration(d)),
            None => f.write_str(" before it started"),
        }
    }
}
