//! Fault injection (failing the next matching requests or every one for a while, holding
//! requests as a slow or hung server does, freezing open watch streams, added latency),
//! request counters and the request log.

use crate::status::ApiError;
use std::collections::BTreeMap;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// Makes the next `count` requests that match fail with `status` (and a `Status` body with
/// the reason the real server uses for it: InternalError, ServiceUnavailable,
/// TooManyRequests...), with a `Retry-After` header when `retry_after` is set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailRule {
    pub count: u32,
    pub status: u16,
    pub retry_after: Option<u64>,
    /// Only requests with this verb: get, list, watch, create, update, patch, delete.
    pub verb: Option<String>,
    /// Only requests whose path (with query) contains this.
    pub path_contains: Option<String>,
}

impl Default for FailRule {
    /// One request, any verb and path, answered 500.
    fn default() -> Self {
        FailRule {
            count: 1,
            status: 500,
            retry_after: None,
            verb: None,
            path_contains: None,
        }
    }
}

/// Holds every matching request before it is handled, as an API server that is slow (a fixed
/// `hold`) or hung (`hold: None`, until [`crate::TestServer::lift_stall`]) does. A held request
/// is handled when the hold ends, whether or not its client is still waiting: a request a
/// client gave up on may still take effect, as it may on a real server.
///
/// With `before_commit`, a write (create, update, patch) is held later instead: decoded,
/// defaulted, validated and admitted, about to commit, as a write whose storage is slow is; it
/// holds no lock meanwhile, so reads and other writes go on. When the hold ends it commits
/// against the object as it is then (an update computed from an object that has changed
/// since is computed again, as kube-apiserver's GuaranteedUpdate retries). Other requests do
/// not match such a rule.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StallRule {
    /// Only requests with this verb: get, list, watch, create, update, patch, delete.
    pub verb: Option<String>,
    /// Only requests whose path (with query) contains this.
    pub path_contains: Option<String>,
    /// Only requests authenticated as this user (the name given to `add_user`; the admin
    /// token's user is `admin`).
    pub user: Option<String>,
    /// How long each matching request is held; `None`: until the rule is lifted.
    pub hold: Option<Duration>,
    /// Hold writes just before they commit instead of on arrival (see above).
    pub before_commit: bool,
}

impl StallRule {
    fn matches(&self, verb: &str, target: &str, user: &str, before_commit: bool) -> bool {
        self.before_commit == before_commit
            && self.verb.as_deref().is_none_or(|v| v == verb)
            && self
                .path_contains
                .as_deref()
                .is_none_or(|p| target.contains(p))
            && self.user.as_deref().is_none_or(|u| u == user)
    }
}

/// Pending failures, stalls, frozen watches and latency, behind one mutex in the server.
#[derive(Debug, Default)]
pub struct Faults {
    /// Failure rules in force: each with the moment it ends when it is timed (its count is
    /// then not used up), `None` when it ends with its count.
    rules: Vec<(FailRule, Option<Instant>)>,
    /// Stall rules in force, by id; a request is held by the first that matches.
    stalls: Vec<(u64, StallRule)>,
    next_stall: u64,
    /// Requests held by a stall rule now.
    held: usize,
    /// The epoch the next watch stream starts in; [`Faults::freeze_watches`] starts a new one.
    watch_epoch: u64,
    /// Watch streams of this epoch and before are frozen; `None`: none is.
    frozen_through: Option<u64>,
    pub latency: Duration,
}

impl Faults {
    pub fn add(&mut self, rule: FailRule) {
        if rule.count > 0 {
            self.rules.push((rule, None));
        }
    }

    /// Fails every request `rule` matches until `until`, whatever its count: a burst of
    /// errors that lasts a while, as from an API server coming back up.
    pub fn add_until(&mut self, rule: FailRule, until: Instant) {
        self.rules.push((rule, Some(until)));
    }

    /// Ends every failure rule in force, counted or timed.
    pub fn clear_failures(&mut self) {
        self.rules.clear();
    }

    /// The injected failure for this request, if a rule matches; uses up one of its count.
    /// Rules are tried in the order they were added.
    pub fn take(&mut self, verb: &str, target: &str) -> Option<ApiError> {
        let now = Instant::now();
        self.rules
            .retain(|(_, until)| until.is_none_or(|u| u > now));
        let i = self.rules.iter().position(|(r, _)| {
            r.verb.as_deref().is_none_or(|v| v == verb)
                && r.path_contains
                    .as_deref()
                    .is_none_or(|p| target.contains(p))
        })?;
        let (rule, until) = &mut self.rules[i];
        let err = ApiError::Injected {
            code: rule.status,
            retry_after: rule.retry_after,
        };
        if until.is_none() {
            rule.count -= 1;
            if rule.count == 0 {
                self.rules.remove(i);
            }
        }
        Some(err)
    }

    /// The epoch of a watch stream starting now, for [`Faults::is_frozen`].
    pub fn watch_epoch(&self) -> u64 {
        self.watch_epoch
    }

    /// Freezes every watch stream open now: each keeps its connection open and sends nothing
    /// (no event, no bookmark, not its end) until [`Faults::thaw_watches`], as a watch behind
    /// a node or load balancer that vanished looks to its client. Streams opened later are
    /// not frozen.
    pub fn freeze_watches(&mut self) {
        self.frozen_through = Some(self.watch_epoch);
        self.watch_epoch += 1;
    }

    /// Ends every freeze: frozen streams send what they held back and go on. The caller wakes
    /// them (`Condvar::notify_all` on the server's `stall_lifted`).
    pub fn thaw_watches(&mut self) {
        self.frozen_through = None;
    }

    /// Whether a watch stream started in `epoch` is frozen.
    pub fn is_frozen(&self, epoch: u64) -> bool {
        self.frozen_through.is_some_and(|t| epoch <= t)
    }

    /// Puts `rule` in force; the id lifts it.
    pub fn add_stall(&mut self, rule: StallRule) -> u64 {
        self.next_stall += 1;
        self.stalls.push((self.next_stall, rule));
        self.next_stall
    }

    /// Ends the rule `id`: requests it holds go on at once, new ones pass. The caller wakes
    /// the held requests (`Condvar::notify_all`).
    pub fn lift_stall(&mut self, id: u64) {
        self.stalls.retain(|(i, _)| *i != id);
    }

    pub fn lift_all_stalls(&mut self) {
        self.stalls.clear();
    }

    /// The first stall rule in force for this request at this point (on arrival, or before
    /// its commit): its id, and until when it holds.
    fn stall_for(
        &self,
        verb: &str,
        target: &str,
        user: &str,
        before_commit: bool,
    ) -> Option<(u64, Option<Instant>)> {
        self.stalls
            .iter()
            .find(|(_, r)| r.matches(verb, target, user, before_commit))
            .map(|(id, r)| (*id, r.hold.map(|h| Instant::now() + h)))
    }

    /// How many requests stall rules hold now.
    pub fn held(&self) -> usize {
        self.held
    }
}

/// Blocks the calling connection thread while a stall rule holds this request, on arrival or
/// (`before_commit`) just before a write commits: until the rule's hold passes or the rule is
/// lifted (`lifted` is notified then). The caller holds no store lock.
pub fn wait_out_stalls(
    faults: &Mutex<Faults>,
    lifted: &Condvar,
    verb: &str,
    target: &str,
    user: &str,
    before_commit: bool,
) {
    let mut f = faults.lock().unwrap_or_else(|e| e.into_inner());
    let Some((id, until)) = f.stall_for(verb, target, user, before_commit) else {
        return;
    };
    log::debug!(verb = verb, target = target, user = user, before_commit = before_commit; "request stalled");
    f.held += 1;
    while f.stalls.iter().any(|(i, _)| *i == id) {
        f = match until {
            None => lifted.wait(f).unwrap_or_else(|e| e.into_inner()),
            Some(u) => {
                let left = u.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                lifted
                    .wait_timeout(f, left)
                    .unwrap_or_else(|e| e.into_inner())
                    .0
            }
        };
    }
    f.held -= 1;
}

/// Blocks a frozen watch stream's thread for at most `at_most`, or until the watches are
/// thawed; returns whether the stream started in `epoch` is still frozen.
pub fn wait_while_frozen(
    faults: &Mutex<Faults>,
    thawed: &Condvar,
    epoch: u64,
    at_most: Duration,
) -> bool {
    let f = faults.lock().unwrap_or_else(|e| e.into_inner());
    if !f.is_frozen(epoch) {
        return false;
    }
    let (f, _) = thawed
        .wait_timeout(f, at_most)
        .unwrap_or_else(|e| e.into_inner());
    f.is_frozen(epoch)
}

/// Handled requests by `(verb, resource)`.
pub type Counts = BTreeMap<(String, String), u64>;

/// One request as the server saw it, for tests that must prove when something happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Logged {
    /// When the request had been read whole, before any stall or latency.
    pub received: Instant,
    /// When its answer was ready (for a watch: when the stream started). A write took effect
    /// at or before this.
    pub answered: Instant,
    /// The authenticated user, empty when the token was unknown.
    pub user: String,
    /// get, list, watch, create, update, patch, delete... as in [`Counts`].
    pub verb: String,
    /// `pods`, `immortalcontainers/status`, `leases`..., or the path of a non-resource request.
    pub resource: String,
    /// The path with its query.
    pub target: String,
    /// The HTTP status of the answer (200 for a watch stream).
    pub code: u16,
}

impl Logged {
    /// Whether the request may have changed something: not a get, list or watch.
    pub fn is_write(&self) -> bool {
        !matches!(self.verb.as_str(), "get" | "list" | "watch")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rule_fails_exactly_count_matching_requests() {
        let mut f = Faults::default();
        f.add(FailRule {
            count: 2,
            status: 503,
            verb: Some("list".into()),
            ..FailRule::default()
        });
        assert!(f.take("get", "/api/v1/pods").is_none());
        assert_eq!(f.take("list", "/api/v1/pods").map(|e| e.code()), Some(503));
        assert!(f.take("list", "/api/v1/pods").is_some());
        assert!(f.take("list", "/api/v1/pods").is_none());
    }

    #[test]
    fn path_filter_and_retry_after_carry_through() {
        let mut f = Faults::default();
        f.add(FailRule {
            status: 429,
            retry_after: Some(2),
            path_contains: Some("leases".into()),
            ..FailRule::default()
        });
        assert!(f.take("get", "/api/v1/pods").is_none());
        let e = f
            .take(
                "get",
                "/apis/coordination.k8s.io/v1/namespaces/default/leases/x",
            )
            .expect("fails");
        assert_eq!(e.retry_after(), Some(2));
    }

    #[test]
    fn a_timed_rule_fails_every_matching_request_until_it_ends() {
        let mut f = Faults::default();
        f.add_until(
            FailRule {
                status: 503,
                path_contains: Some("/namespaces/a/".into()),
                ..FailRule::default()
            },
            Instant::now() + Duration::from_millis(200),
        );
        for _ in 0..5 {
            assert_eq!(
                f.take("get", "/api/v1/namespaces/a/pods/x")
                    .map(|e| e.code()),
                Some(503),
                "a count of 1 does not end a timed rule"
            );
        }
        assert!(f.take("get", "/api/v1/namespaces/b/pods/x").is_none());
        std::thread::sleep(Duration::from_millis(250));
        assert!(f.take("get", "/api/v1/namespaces/a/pods/x").is_none());
        assert!(f.rules.is_empty(), "an ended rule is forgotten");
    }

    #[test]
    fn a_freeze_holds_the_streams_open_before_it_and_not_those_after() {
        let mut f = Faults::default();
        let before = f.watch_epoch();
        f.freeze_watches();
        let after = f.watch_epoch();
        assert!(f.is_frozen(before));
        assert!(!f.is_frozen(after));
        f.thaw_watches();
        assert!(!f.is_frozen(before));
    }

    #[test]
    fn a_timed_stall_holds_only_matching_requests_for_its_hold() {
        let faults = Mutex::new(Faults::default());
        let lifted = Condvar::new();
        faults.lock().unwrap().add_stall(StallRule {
            verb: Some("update".into()),
            path_contains: Some("leases".into()),
            user: Some("replica-a".into()),
            hold: Some(Duration::from_millis(200)),
            ..StallRule::default()
        });
        let t = Instant::now();
        wait_out_stalls(
            &faults,
            &lifted,
            "update",
            "/x/leases/l",
            "replica-b",
            false,
        );
        wait_out_stalls(&faults, &lifted, "get", "/x/leases/l", "replica-a", false);
        assert!(
            t.elapsed() < Duration::from_millis(150),
            "others pass at once"
        );
        wait_out_stalls(
            &faults,
            &lifted,
            "update",
            "/x/leases/l",
            "replica-a",
            false,
        );
        assert!(t.elapsed() >= Duration::from_millis(200));
    }

    #[test]
    fn an_open_ended_stall_holds_until_lifted() {
        let shared = std::sync::Arc::new((Mutex::new(Faults::default()), Condvar::new()));
        let id = shared.0.lock().unwrap().add_stall(StallRule::default());
        let held = shared.clone();
        let waiter = std::thread::spawn(move || {
            wait_out_stalls(&held.0, &held.1, "get", "/api/v1/pods", "admin", false);
            Instant::now()
        });
        std::thread::sleep(Duration::from_millis(300));
        assert!(!waiter.is_finished(), "still held");
        let lifted = Instant::now();
        shared.0.lock().unwrap().lift_stall(id);
        shared.1.notify_all();
        // Let go by the lift, not before it (a causal check: no timing bound to flake on).
        let released = waiter.join().unwrap();
        assert!(released >= lifted, "released before the lift");
    }
}
