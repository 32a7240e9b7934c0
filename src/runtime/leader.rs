//! Leader election on a `coordination.k8s.io/v1` Lease, as client-go's `leaderelection` does it,
//! and a [`Fence`] that keeps a deposed leader from writing (docs/design.md, "Leader election").
//!
//! Expiry is judged by the local clock from when we last saw the Lease change, never by the
//! holder's `renewTime` (clocks of different nodes disagree). A standby cannot have seen our
//! renewal before we sent it, so the Lease stays ours until `sent + lease duration` on our
//! monotonic clock; the fence closes a safety margin before.

use crate::kube::client::{self, Client, Resource};
use crate::kube::fence::Fence;
use crate::kube::types::ObjectMeta;
use crate::runtime::metrics;
use crate::runtime::shutdown::quits_within;
use crate::util;
use crossbeam_channel::Receiver;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

/// How long before the Lease could pass the fence closes: for writes on the wire, clock drift.
pub fn safety_margin(lease_duration: Duration) -> Duration {
    lease_duration / 10
}

/// Leadership ended while renewing: the fence is closed and the process should exit.
#[derive(Debug)]
pub struct Lost(pub String);

#[derive(Debug, Clone)]
pub struct Settings {
    pub namespace: String,
    pub name: String,
    pub identity: String,
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

/// Every Lease we send starts from one the server returned, or one we make whole.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct Lease {
    #[serde(skip_serializing_if = "String::is_empty")]
    api_version: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    kind: String,
    metadata: ObjectMeta,
    spec: LeaseSpec,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct LeaseSpec {
    #[serde(skip_serializing_if = "Option::is_none")]
    holder_identity: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    lease_duration_seconds: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    acquire_time: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    renew_time: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    lease_transitions: Option<i64>,
}

/// What one attempt found.
#[derive(Debug, PartialEq)]
enum Attempt {
    /// We hold the lease now.
    Held,
    /// Someone else holds it and it has not expired.
    HeldBy(String),
    /// We held it when we read it, but it was written meanwhile (409): read it again.
    Conflict,
}

/// The elector. Shared by the thread that renews and the one that releases at shutdown.
pub struct Elector {
    client: Client,
    s: Settings,
    /// The lease duration as the Lease records it (whole seconds): what standbys go by.
    duration: Duration,
    fence: Arc<Fence>,
    /// Set when the release begins: an answer to a renewal still in flight is ignored then.
    releasing: AtomicBool,
    /// The lease record last seen, and when (our clock) it was first seen like that.
    observed: Mutex<Option<(LeaseSpec, Instant)>>,
    /// The lease as we last wrote it, for the release.
    ours: Mutex<Option<Lease>>,
}

impl Elector {
    pub fn new(client: Client, s: Settings) -> Elector {
        let duration = Duration::from_secs(s.lease_duration.as_secs());
        Elector {
            client,
            s,
            duration,
            fence: Arc::new(Fence::closed()),
            releasing: AtomicBool::new(false),
            observed: Mutex::new(None),
            ours: Mutex::new(None),
        }
    }

    pub fn identity(&self) -> &str {
        &self.s.identity
    }

    /// The fence every writing client of this process must go through.
    pub fn fence(&self) -> Arc<Fence> {
        self.fence.clone()
    }

    /// Blocks until this process leads (true) or shutdown comes (false).
    pub fn acquire(&self, quit: &Receiver<()>) -> bool {
        log::info!(target: "leader", lease = self.lease_key().as_str(), identity = self.s.identity.as_str(); "waiting for leadership");
        let mut last_holder = String::new();
        loop {
            match self.try_acquire_or_renew(Instant::now() + self.s.renew_deadline) {
                Ok(Attempt::Held) => {
                    metrics::set_leader(true);
                    log::info!(target: "leader", lease = self.lease_key().as_str(), identity = self.s.identity.as_str(); "became leader");
                    return true;
                }
                Ok(Attempt::HeldBy(h)) if h != last_holder => {
                    log::info!(target: "leader", lease = self.lease_key().as_str(), holder = h.as_str(); "lease held by another replica; standing by");
                    last_holder = h;
                }
                // Said once per holder; after a conflict, whoever holds it shows next time.
                Ok(Attempt::HeldBy(_) | Attempt::Conflict) => {}
                Err(e) => {
                    log::warn!(target: "leader", lease = self.lease_key().as_str(), error = e.to_string().as_str(); "cannot acquire lease")
                }
            }
            // client-go waits retryPeriod with a jitter factor of 1.2.
            let wait = self.s.retry_period.mul_f64(1.0 + 1.2 * util::rand_f64());
            if quits_within(quit, wait) {
                return false;
            }
        }
    }

    /// Renews every retry period until `stop` fires or disconnects (`Ok`), or leadership is
    /// lost (with the fence closed). As client-go's `renew`, a round retries every retry period
    /// and ends, requests included, by the renew deadline; a first conflict is retried at once.
    pub fn keep_renewing(&self, stop: &Receiver<()>) -> Result<(), Lost> {
        loop {
            if quits_within(stop, self.s.retry_period) {
                return Ok(());
            }
            let round_end = Instant::now() + self.s.renew_deadline;
            let fence_end = self.fence.deadline().unwrap_or_else(Instant::now);
            let give_up = round_end.min(fence_end);
            let mut conflicts = 0u32;
            loop {
                let result = self.try_acquire_or_renew(give_up);
                if self.releasing.load(SeqCst) {
                    return Ok(());
                }
                match result {
                    Ok(Attempt::Held) => break,
                    Ok(Attempt::HeldBy(h)) => return Err(self.lose(format!("lease taken by {h}"))),
                    Ok(Attempt::Conflict) => {
                        conflicts += 1;
                        log::debug!(target: "leader", lease = self.lease_key().as_str(), conflicts = conflicts;
                            "the lease was written by someone else between our read and our renewal; reading it again");
                        if conflicts == 1 && Instant::now() < give_up {
                            continue;
                        }
                    }
                    Err(e) => {
                        log::warn!(target: "leader", lease = self.lease_key().as_str(), error = e.to_string().as_str(); "lease renewal failed");
                    }
                }
                let left = give_up.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(self.lose(if fence_end < round_end {
                        "could not renew the lease before it could expire".to_string()
                    } else {
                        "could not renew the lease within the renew deadline".to_string()
                    }));
                }
                if quits_within(stop, self.s.retry_period.min(left)) {
                    return Ok(());
                }
            }
        }
    }

    fn lose(&self, why: String) -> Lost {
        self.fence.close();
        metrics::set_leader(false);
        log::error!(target: "leader", lease = self.lease_key().as_str(), identity = self.s.identity.as_str(); "leadership lost: {why}; exiting so no stale write can happen");
        Lost(why)
    }

    /// Closes the fence and gives the lease up (client-go's ReleaseOnCancel) within `timeout`,
    /// unless a write of ours is in flight: the server may yet apply it.
    pub fn release(&self, timeout: Duration) {
        self.releasing.store(true, SeqCst);
        self.fence.close();
        metrics::set_leader(false);
        let Some(mut lease) = util::lock(&self.ours).take() else {
            return;
        };
        let in_flight = self.fence.writes_in_flight();
        if in_flight > 0 {
            log::warn!(
                target: "leader", lease = self.lease_key().as_str(), writes_in_flight = in_flight as u64;
                "not releasing the lease: a write is still waiting for the API server; a standby takes over once the lease expires"
            );
            return;
        }
        let now = micro_time(SystemTime::now());
        lease.spec.holder_identity = None;
        lease.spec.lease_duration_seconds = Some(1);
        lease.spec.renew_time = Some(now.clone());
        lease.spec.acquire_time = Some(now);
        match self
            .client
            .until(Instant::now() + timeout)
            .replace::<_, Lease>(Resource::LEASES, &self.s.namespace, &self.s.name, &lease)
        {
            Ok(_) => {
                log::info!(target: "leader", lease = self.lease_key().as_str(); "released lease")
            }
            Err(e) => {
                log::warn!(target: "leader", lease = self.lease_key().as_str(), error = e.to_string().as_str(); "could not release lease; a standby takes over once it expires")
            }
        }
    }

    fn lease_key(&self) -> String {
        format!("{}/{}", self.s.namespace, self.s.name)
    }

    /// One look at the Lease, and a write if we hold it or may take it, all by `until`.
    fn try_acquire_or_renew(&self, until: Instant) -> Result<Attempt, client::Error> {
        let client = self.client.until(until);
        let (ns, name, me) = (&self.s.namespace, &self.s.name, &self.s.identity);
        let now = micro_time(SystemTime::now());
        let duration = self.duration.as_secs() as i64;
        let found = match client.get_object::<Lease>(Resource::LEASES, ns, name) {
            Ok(l) => Some(l),
            Err(e) if e.is_not_found() => None,
            Err(e) => return Err(e),
        };
        let mut next = found.clone().unwrap_or_else(|| Lease {
            api_version: "coordination.k8s.io/v1".into(),
            kind: "Lease".into(),
            metadata: ObjectMeta {
                name: name.clone(),
                namespace: ns.clone(),
                ..Default::default()
            },
            spec: LeaseSpec::default(),
        });
        let holder = next.spec.holder_identity.clone().unwrap_or_default();
        if let Some(current) = &found {
            let observed_at = match &mut *util::lock(&self.observed) {
                Some((spec, at)) if *spec == current.spec => *at,
                observed => observed.insert((current.spec.clone(), Instant::now())).1,
            };
            let theirs = current.spec.lease_duration_seconds.unwrap_or(duration);
            let expired = observed_at.elapsed() >= Duration::from_secs(theirs.max(0) as u64);
            if !holder.is_empty() && holder != *me && !expired {
                return Ok(Attempt::HeldBy(holder));
            }
        }

        next.spec.holder_identity = Some(me.clone());
        next.spec.lease_duration_seconds = Some(duration);
        next.spec.renew_time = Some(now.clone());
        if holder != *me {
            next.spec.acquire_time = Some(now);
            // A Lease we create starts at 0 transitions.
            let transitions = next.spec.lease_transitions.unwrap_or(0);
            next.spec.lease_transitions = Some(found.as_ref().map_or(0, |_| transitions + 1));
        }
        // Taken before the request leaves: no standby can count the expiry from earlier.
        let sent = Instant::now();
        let written = match &found {
            Some(_) => client.replace::<_, Lease>(Resource::LEASES, ns, name, &next),
            None => client.create::<_, Lease>(Resource::LEASES, ns, &next),
        };
        match written {
            Ok(l) => {
                self.remember(l, sent);
                Ok(Attempt::Held)
            }
            // Written between our read and our write: a new holder, if any, shows next read.
            Err(e) if e.is_conflict() && holder == *me => Ok(Attempt::Conflict),
            // We were taking it over, or creating it: whoever wrote it won this round.
            Err(e) if (e.is_conflict() && found.is_some()) || e.is_already_exists() => {
                Ok(Attempt::HeldBy("another replica".into()))
            }
            Err(e) => Err(e),
        }
    }

    /// A write that made or kept us the holder, sent at `sent`: opens or moves on the fence.
    fn remember(&self, l: Lease, sent: Instant) {
        *util::lock(&self.observed) = Some((l.spec.clone(), Instant::now()));
        *util::lock(&self.ours) = Some(l);
        self.fence
            .open_until(sent + self.duration - safety_margin(self.duration));
    }
}

/// `metav1.MicroTime`: RFC 3339 with microseconds, as Leases carry it.
fn micro_time(t: SystemTime) -> String {
    format!("{:.6}", jiff::Timestamp::try_from(t).unwrap_or_default())
}

/// This replica's identity: the pod or host name, and a random suffix against taking the old
/// holder for itself after a restart.
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

    const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/default/leases";

    /// A test server recording requests, and an elector of it.
    fn elector(
        lease: Duration,
        renew_deadline: Duration,
        retry: Duration,
    ) -> (kube_testserver::TestServer, Arc<Elector>) {
        let server =
            kube_testserver::TestServer::start(kube_testserver::Options::default()).unwrap();
        server.record_requests();
        let client = crate::testutil::client_of(&server.kubeconfig_path());
        let e = Elector::new(
            client,
            Settings {
                namespace: "default".into(),
                name: "immortal-operator".into(),
                identity: identity(),
                lease_duration: lease,
                renew_deadline,
                retry_period: retry,
            },
        );
        (server, Arc::new(e))
    }

    fn holder(server: &kube_testserver::TestServer) -> Option<String> {
        let lease = server.get_json(&format!("{LEASES}/immortal-operator"))?;
        lease["spec"]["holderIdentity"].as_str().map(String::from)
    }

    /// When the last request of ours that won the Lease arrived at the server.
    fn last_won(server: &kube_testserver::TestServer) -> Instant {
        server
            .request_log()
            .iter()
            .rfind(|l| l.resource == "leases" && l.is_write() && l.code < 300)
            .expect("a lease write won")
            .received
    }

    /// What a misbehaving API server does to the Lease requests.
    #[derive(Debug, Clone, Copy)]
    enum Misbehaviour {
        Hangs,
        SlowReadsHungWrites,
        Unauthorized,
        Unavailable,
    }

    impl Misbehaviour {
        fn apply(self, server: &kube_testserver::TestServer) {
            use kube_testserver::{FailRule, StallRule};
            let leases = Some("/leases".to_string());
            let fail = |status| FailRule {
                count: 10_000,
                status,
                retry_after: None,
                verb: None,
                path_contains: leases.clone(),
            };
            match self {
                Misbehaviour::Hangs => {
                    server.stall(StallRule {
                        path_contains: leases,
                        ..Default::default()
                    });
                }
                Misbehaviour::SlowReadsHungWrites => {
                    // A read answered just in time, then a write that never is: the shape that
                    // let the elector of old overrun its lease.
                    server.stall(StallRule {
                        verb: Some("get".into()),
                        path_contains: leases.clone(),
                        hold: Some(Duration::from_millis(600)),
                        ..Default::default()
                    });
                    server.stall(StallRule {
                        verb: Some("update".into()),
                        path_contains: leases,
                        ..Default::default()
                    });
                }
                Misbehaviour::Unauthorized => server.fail_next(fail(401)),
                Misbehaviour::Unavailable => server.fail_next(fail(503)),
            }
        }
    }

    /// Leads, renews a few times, then meets `m`: the fence must never have let writes through
    /// past a safety margin before the Lease could pass, and the elector must report the loss,
    /// its fence closed. Returns how long after the last successful renewal arrived it gave up.
    fn renewal_against(m: Misbehaviour, lease: Duration, renew_deadline: Duration) -> Duration {
        let retry = Duration::from_millis(300);
        let (server, e) = elector(lease, renew_deadline, retry);
        let (_never, quit) = crossbeam_channel::bounded::<()>(0);
        assert!(e.acquire(&quit));
        let (_stop_tx, stop) = crossbeam_channel::bounded::<()>(0);
        let (done_tx, done) = crossbeam_channel::bounded(1);
        let renewing = e.clone();
        std::thread::spawn(move || {
            let _ = done_tx.send((renewing.keep_renewing(&stop), Instant::now()));
        });
        // The latest close the fence promised, watched while it renews: what keeps writes safe
        // whenever the renewing thread gets the CPU to notice.
        let fence_of = e.fence.clone();
        let (stop_watching, watched) = crossbeam_channel::bounded::<()>(0);
        let watcher = std::thread::spawn(move || {
            let mut latest = None;
            while watched.try_recv() == Err(crossbeam_channel::TryRecvError::Empty) {
                latest = fence_of.deadline().or(latest);
                std::thread::sleep(Duration::from_millis(1));
            }
            latest
        });
        std::thread::sleep(Duration::from_millis(800));
        m.apply(&server);
        let (result, at) = done
            .recv_timeout(Duration::from_secs(15))
            .unwrap_or_else(|_| panic!("{m:?}: still renewing 15 s later"));
        drop(stop_watching);
        assert!(result.is_err(), "{m:?}: leadership lost");
        assert_eq!(e.fence.deadline(), None, "{m:?}: fence closed");
        let won = last_won(&server);
        let fence = lease - safety_margin(lease);
        let promised = watcher.join().unwrap().expect("the fence was open");
        assert!(
            promised <= won + fence,
            "{m:?}: the fence stayed open {:?} after the last renewal arrived, past {fence:?}",
            promised - won
        );
        let after = at - won;
        // Reported soon after the close; the margin is for a loaded machine's scheduler.
        assert!(
            after <= fence + Duration::from_secs(1),
            "{m:?}: gave up {after:?} after the last renewal arrived; its fence closed at {fence:?}"
        );
        after
    }

    #[test]
    fn a_leader_gives_up_by_its_fence_whatever_the_api_server_does() {
        // A renew deadline close to the lease: the fence, not the deadline, must end it.
        let (lease, renew_deadline) = (Duration::from_secs(3), Duration::from_millis(2800));
        let runs: Vec<_> = [
            Misbehaviour::Hangs,
            Misbehaviour::SlowReadsHungWrites,
            Misbehaviour::Unauthorized,
            Misbehaviour::Unavailable,
        ]
        .into_iter()
        .map(|m| std::thread::spawn(move || renewal_against(m, lease, renew_deadline)))
        .collect();
        for r in runs {
            let after = r.join().unwrap();
            assert!(
                after >= Duration::from_millis(2000),
                "not before its time: {after:?}"
            );
        }
    }

    #[test]
    fn a_leader_gives_up_at_its_renew_deadline_when_that_comes_first() {
        let (lease, renew_deadline) = (Duration::from_secs(3), Duration::from_millis(1000));
        let after = renewal_against(Misbehaviour::Hangs, lease, renew_deadline);
        // One retry period after the last success, then the renew deadline.
        assert!(after < Duration::from_millis(1300 + 250), "{after:?}");
    }

    #[test]
    fn a_renewal_refused_because_someone_else_wrote_the_lease_is_retried_and_leadership_kept() {
        let (server, e) = elector(
            Duration::from_secs(15),
            Duration::from_secs(10),
            Duration::from_millis(200),
        );
        let (_never, quit) = crossbeam_channel::bounded::<()>(0);
        assert!(e.acquire(&quit));
        let (stop_tx, stop) = crossbeam_channel::bounded::<()>(0);
        let (done_tx, done) = crossbeam_channel::bounded(1);
        let renewing = e.clone();
        std::thread::spawn(move || {
            let _ = done_tx.send(renewing.keep_renewing(&stop));
        });
        // The next renewal's PUT is held on arrival; meanwhile someone annotates the Lease, as
        // `kubectl annotate lease` does, so the PUT's resourceVersion is stale when it lands.
        let held = server.stall(kube_testserver::StallRule {
            verb: Some("update".into()),
            path_contains: Some("/leases".into()),
            hold: Some(Duration::from_secs(1)),
            ..Default::default()
        });
        let t = Instant::now();
        while server.stalled() == 0 {
            assert!(t.elapsed() < Duration::from_secs(5), "no renewal came");
            std::thread::sleep(Duration::from_millis(5));
        }
        e.client
            .merge_patch::<_, serde::de::IgnoredAny>(
                Resource::LEASES,
                "default",
                "immortal-operator",
                &serde_json::json!({"metadata": {"annotations": {"touched-by": "someone"}}}),
            )
            .expect("annotate the lease");
        server.lift_stall(held);
        let conflict = |l: &kube_testserver::Logged| l.resource == "leases" && l.code == 409;
        let t = Instant::now();
        loop {
            let log = server.request_log();
            if let Some(i) = log.iter().position(conflict) {
                if log[i..]
                    .iter()
                    .any(|l| l.resource == "leases" && l.is_write() && l.code < 300)
                {
                    break;
                }
            }
            assert!(
                done.try_recv().is_err(),
                "the elector stopped renewing after a conflict"
            );
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "no renewal after the conflict"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(holder(&server).as_deref(), Some(e.identity()));
        assert!(e.fence.deadline().is_some(), "the fence stays open");
        drop(stop_tx);
        assert!(
            done.recv().unwrap().is_ok(),
            "still the leader when stopped"
        );
    }

    #[test]
    fn release_frees_the_lease_and_closes_the_fence_for_good() {
        let (server, e) = elector(
            Duration::from_secs(15),
            Duration::from_secs(10),
            Duration::from_secs(2),
        );
        let (_never, quit) = crossbeam_channel::bounded::<()>(0);
        assert!(e.acquire(&quit));
        assert!(e.fence.deadline().is_some());
        assert_eq!(holder(&server).as_deref(), Some(e.identity()));
        e.release(Duration::from_secs(2));
        assert_eq!(holder(&server), None);
        assert_eq!(e.fence.deadline(), None);
    }

    #[test]
    fn release_leaves_the_lease_to_expire_while_a_write_is_in_flight() {
        let (server, e) = elector(
            Duration::from_secs(15),
            Duration::from_secs(10),
            Duration::from_secs(2),
        );
        let (_never, quit) = crossbeam_channel::bounded::<()>(0);
        assert!(e.acquire(&quit));
        let write = e.fence.write_started();
        e.release(Duration::from_secs(2));
        drop(write);
        assert_eq!(holder(&server).as_deref(), Some(e.identity()));
        assert_eq!(e.fence.deadline(), None, "closed all the same");
    }

    #[test]
    fn a_release_the_server_never_answers_ends_within_its_timeout() {
        let (server, e) = elector(
            Duration::from_secs(15),
            Duration::from_secs(10),
            Duration::from_secs(2),
        );
        let (_never, quit) = crossbeam_channel::bounded::<()>(0);
        assert!(e.acquire(&quit));
        server.stall(kube_testserver::StallRule::default());
        let t = Instant::now();
        e.release(Duration::from_millis(500));
        assert!(
            t.elapsed() < Duration::from_millis(1500),
            "{:?}",
            t.elapsed()
        );
    }
}
