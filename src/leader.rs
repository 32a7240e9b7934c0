//! Leader election on a `coordination.k8s.io/v1` Lease, as client-go's `leaderelection` does it,
//! so that of several replicas exactly one writes.
//!
//! Expiry is judged by the local clock from when we last saw the Lease change, never by
//! comparing our clock with the holder's `renewTime` (clocks of different nodes disagree).
//! A leader that cannot renew within the renew deadline, or finds another holder, exits at
//! once with a non-zero code: a process that is gone makes no stale writes.

use crate::client::{self, Client, Resource};
use crate::metrics;
use crate::resources::ObjectMeta;
use crate::util;
use crossbeam_channel::{Receiver, RecvTimeoutError};
use serde::{Deserialize, Serialize};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

/// Settings, from the command line.
#[derive(Debug, Clone)]
pub struct Settings {
    pub namespace: String,
    pub name: String,
    pub identity: String,
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Lease {
    /// Always written, and always read back: every body we send starts from a Lease the server
    /// returned, or from [`Lease::new`].
    #[serde(
        default,
        rename = "apiVersion",
        skip_serializing_if = "String::is_empty"
    )]
    api_version: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    kind: String,
    #[serde(default)]
    metadata: ObjectMeta,
    #[serde(default)]
    spec: LeaseSpec,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct LeaseSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    holder_identity: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    lease_duration_seconds: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    acquire_time: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    renew_time: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    lease_transitions: Option<i64>,
}

/// What one attempt found.
#[derive(Debug, PartialEq)]
enum Attempt {
    /// We hold the lease now.
    Held,
    /// Someone else holds it and it has not expired.
    HeldBy(String),
}

/// The elector. Shared by the thread that renews and the one that releases at shutdown.
pub struct Elector {
    client: Client,
    s: Settings,
    /// The lease record last seen, and when (our clock) it was first seen like that.
    observed: Mutex<Option<(LeaseSpec, Instant)>>,
    /// The lease as we last wrote it, for the release.
    ours: Mutex<Option<Lease>>,
}

impl Elector {
    pub fn new(client: Client, s: Settings) -> Elector {
        // An attempt (a GET and a PUT) must end well inside the renew deadline, or a leader stuck
        // on a hung request would go on writing after its lease expired and a standby took it.
        let attempt = (s.renew_deadline / 4).max(Duration::from_millis(500));
        let client = client.with_deadline(attempt);
        Elector {
            client,
            s,
            observed: Mutex::new(None),
            ours: Mutex::new(None),
        }
    }

    pub fn identity(&self) -> &str {
        &self.s.identity
    }

    /// Blocks until this process leads (true) or shutdown comes (false).
    pub fn acquire(&self, quit: &Receiver<()>) -> bool {
        log::info!(target: "leader", lease = self.lease_key().as_str(), identity = self.s.identity.as_str(); "waiting for leadership");
        let mut last_holder = String::new();
        loop {
            match self.try_acquire_or_renew() {
                Ok(Attempt::Held) => {
                    metrics::set_leader(true);
                    log::info!(target: "leader", lease = self.lease_key().as_str(), identity = self.s.identity.as_str(); "became leader");
                    return true;
                }
                Ok(Attempt::HeldBy(h)) => {
                    if h != last_holder {
                        log::info!(target: "leader", lease = self.lease_key().as_str(), holder = h.as_str(); "lease held by another replica; standing by");
                        last_holder = h;
                    }
                }
                Err(e) => {
                    log::warn!(target: "leader", lease = self.lease_key().as_str(), error = e.to_string().as_str(); "cannot acquire lease")
                }
            }
            // client-go waits retryPeriod with a jitter factor of 1.2.
            let wait = self.s.retry_period.mul_f64(1.0 + 1.2 * util::rand_f64());
            if !matches!(quit.recv_timeout(wait), Err(RecvTimeoutError::Timeout)) {
                return false;
            }
        }
    }

    /// Renews every retry period until shutdown. Exits the process (code 1) when leadership is
    /// lost: the renew deadline passed without a successful renew, or another holder appeared.
    pub fn keep_renewing(&self, quit: &Receiver<()>) {
        let mut last_renew = Instant::now();
        loop {
            if !matches!(
                quit.recv_timeout(self.s.retry_period),
                Err(RecvTimeoutError::Timeout)
            ) {
                return;
            }
            match self.try_acquire_or_renew() {
                Ok(Attempt::Held) => last_renew = Instant::now(),
                Ok(Attempt::HeldBy(h)) => self.lost(&format!("lease taken by {h}")),
                Err(e) => {
                    log::warn!(target: "leader", lease = self.lease_key().as_str(), error = e.to_string().as_str(); "lease renewal failed");
                }
            }
            if last_renew.elapsed() >= self.s.renew_deadline {
                self.lost("could not renew the lease within the renew deadline");
            }
        }
    }

    fn lost(&self, why: &str) -> ! {
        metrics::set_leader(false);
        log::error!(target: "leader", lease = self.lease_key().as_str(), identity = self.s.identity.as_str(); "leadership lost: {why}; exiting so no stale write can happen");
        log::logger().flush();
        std::process::exit(1);
    }

    /// Gives the lease up so a standby takes over at its next retry instead of waiting for
    /// expiry (client-go's ReleaseOnCancel: empty holder, duration 1 s).
    pub fn release(&self) {
        let Some(mut lease) = self.ours.lock().unwrap_or_else(|p| p.into_inner()).take() else {
            return;
        };
        let now = micro_time(SystemTime::now());
        lease.spec.holder_identity = None;
        lease.spec.lease_duration_seconds = Some(1);
        lease.spec.renew_time = Some(now.clone());
        lease.spec.acquire_time = Some(now);
        match self.client.replace::<_, Lease>(
            Resource::Leases,
            &self.s.namespace,
            &self.s.name,
            &lease,
        ) {
            Ok(_) => {
                log::info!(target: "leader", lease = self.lease_key().as_str(); "released lease")
            }
            Err(e) => {
                log::warn!(target: "leader", lease = self.lease_key().as_str(), error = e.to_string().as_str(); "could not release lease; a standby takes over once it expires")
            }
        }
        metrics::set_leader(false);
    }

    fn lease_key(&self) -> String {
        format!("{}/{}", self.s.namespace, self.s.name)
    }

    fn try_acquire_or_renew(&self) -> Result<Attempt, client::Error> {
        let now = micro_time(SystemTime::now());
        let duration = self.s.lease_duration.as_secs() as i64;
        let current =
            match self
                .client
                .get_object::<Lease>(Resource::Leases, &self.s.namespace, &self.s.name)
            {
                Ok(l) => l,
                Err(e) if e.is_not_found() => {
                    let lease = Lease {
                        api_version: "coordination.k8s.io/v1".into(),
                        kind: "Lease".into(),
                        metadata: ObjectMeta {
                            name: self.s.name.clone(),
                            namespace: self.s.namespace.clone(),
                            ..Default::default()
                        },
                        spec: LeaseSpec {
                            holder_identity: Some(self.s.identity.clone()),
                            lease_duration_seconds: Some(duration),
                            acquire_time: Some(now.clone()),
                            renew_time: Some(now),
                            lease_transitions: Some(0),
                        },
                    };
                    return match self.client.create::<_, Lease>(
                        Resource::Leases,
                        &self.s.namespace,
                        &lease,
                    ) {
                        Ok(l) => {
                            self.remember(l);
                            Ok(Attempt::Held)
                        }
                        Err(e) if e.is_already_exists() => {
                            Ok(Attempt::HeldBy("another replica".into()))
                        }
                        Err(e) => Err(e),
                    };
                }
                Err(e) => return Err(e),
            };

        let holder = current.spec.holder_identity.clone().unwrap_or_default();
        let observed_at = {
            let mut obs = self.observed.lock().unwrap_or_else(|p| p.into_inner());
            match obs.as_ref() {
                Some((spec, at)) if *spec == current.spec => *at,
                _ => {
                    let at = Instant::now();
                    *obs = Some((current.spec.clone(), at));
                    at
                }
            }
        };
        let their_duration = Duration::from_secs(
            current
                .spec
                .lease_duration_seconds
                .unwrap_or(duration)
                .max(0) as u64,
        );
        if !holder.is_empty() && holder != self.s.identity && observed_at.elapsed() < their_duration
        {
            return Ok(Attempt::HeldBy(holder));
        }

        let mut next = current.clone();
        next.spec.holder_identity = Some(self.s.identity.clone());
        next.spec.lease_duration_seconds = Some(duration);
        next.spec.renew_time = Some(now.clone());
        if holder != self.s.identity {
            next.spec.acquire_time = Some(now);
            next.spec.lease_transitions = Some(current.spec.lease_transitions.unwrap_or(0) + 1);
        }
        match self.client.replace::<_, Lease>(
            Resource::Leases,
            &self.s.namespace,
            &self.s.name,
            &next,
        ) {
            Ok(l) => {
                self.remember(l);
                Ok(Attempt::Held)
            }
            // Someone wrote it between our read and our write: they won this round.
            Err(e) if e.is_conflict() => Ok(Attempt::HeldBy("another replica".into())),
            Err(e) => Err(e),
        }
    }

    fn remember(&self, l: Lease) {
        *self.observed.lock().unwrap_or_else(|p| p.into_inner()) =
            Some((l.spec.clone(), Instant::now()));
        *self.ours.lock().unwrap_or_else(|p| p.into_inner()) = Some(l);
    }
}

/// `metav1.MicroTime`: RFC 3339 with microseconds, as Leases carry it.
fn micro_time(t: SystemTime) -> String {
    let s = util::rfc3339(t);
    let micros = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.subsec_micros())
        .unwrap_or(0);
    format!("{}.{micros:06}Z", &s[..s.len() - 1])
}

/// This replica's identity: the pod name (downward API) or the host name, plus a random
/// suffix so a restarted process never mistakes the old holder for itself.
pub fn identity() -> String {
    let base = std::env::var("POD_NAME")
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|s| s.trim().to_string())
        })
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "immortal-operator".to_string());
    format!("{base}_{:08x}", util::rand_u64() as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn micro_time_has_six_fraction_digits() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_micros(1_795_352_323_000_042);
        assert_eq!(micro_time(t), "2026-11-22T12:58:43.000042Z");
    }

    #[test]
    fn identities_differ_between_processes_on_one_host() {
        assert_ne!(identity(), identity());
    }
}
