//! Per-object back-off for what can turn into a loop of API requests: pods that end soon after
//! they start, and creates the API server keeps refusing. In memory only, as the DaemonSet
//! controller's back-off; docs/design.md, "Restarts and refusals", says why each number.

use crate::immortal::lifecycle::Ending;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub const BASE: Duration = Duration::from_secs(1);
/// The longest back-off: the kubelet's cap on a crash-looping container, which users know.
pub const MAX: Duration = Duration::from_secs(300);
/// A pod whose container ran at least this long before it ended is replaced at once: above
/// any loop, below any drain or eviction.
pub const MIN_RUN: Duration = Duration::from_secs(10);
/// The book is swept of expired entries when it grows past this many.
const SWEEP_AT: usize = 1024;

/// One doubling back-off.
#[derive(Debug, Clone, Copy)]
struct Streak {
    backoff: Duration,
    /// When the last step was taken.
    last: Instant,
    /// Steps in a row.
    count: u32,
}

impl Streak {
    /// The step taken at `now` after `prev`: the first, or `prev` doubled unless it expired.
    fn after(prev: Option<Streak>, now: Instant) -> Streak {
        let (backoff, count) = match prev.filter(|s| !s.expired(now)) {
            Some(s) => ((s.backoff * 2).min(MAX), s.count.saturating_add(1)),
            None => (BASE, 1),
        };
        Streak {
            backoff,
            last: now,
            count,
        }
    }

    /// Forgotten after twice the longest back-off without a step.
    fn expired(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.last) > MAX * 2
    }

    fn remaining(&self, now: Instant) -> Option<Duration> {
        let since = now.saturating_duration_since(self.last);
        (since < self.backoff).then(|| self.backoff - since)
    }
}

#[derive(Debug, Default)]
struct Entry {
    /// Quick endings in a row, each replaced.
    quick: Option<Streak>,
    /// Creates refused in a row.
    refused: Option<Streak>,
    /// How the object's last pod ended, learned before its replacement was made.
    ending: Option<Ending>,
}

impl Entry {
    fn idle(&self, now: Instant) -> bool {
        self.ending.is_none()
            && self.quick.is_none_or(|s| s.expired(now))
            && self.refused.is_none_or(|s| s.expired(now))
    }
}

/// The book, shared by the reconcile workers.
#[derive(Default)]
pub struct Restarts {
    entries: Mutex<HashMap<String, Entry>>,
}

/// A replacement that has to wait.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wait {
    pub remaining: Duration,
    pub backoff: Duration,
    /// Quick endings in a row, the one waited on included.
    pub streak: u32,
    /// How the pod it replaces ended, when that was seen.
    pub ending: Option<Ending>,
}

impl Restarts {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        crate::util::lock(&self.entries)
    }

    /// Records how the pod of `key` ended, before its replacement is made.
    pub fn ended(&self, key: &str, ending: Ending) {
        self.lock().entry(key.to_string()).or_default().ending = Some(ending);
    }

    /// How the last pod of `key` ended, if that was seen.
    pub fn ending(&self, key: &str) -> Option<Ending> {
        self.lock().get(key)?.ending.clone()
    }

    /// The pod of `key` ended and a replacement is due at `now`: how long it must wait, if it must.
    pub fn wait(&self, key: &str, now: Instant) -> Option<Wait> {
        let mut entries = self.lock();
        let e = entries.get_mut(key)?;
        if e.ending.as_ref().is_some_and(|e| !e.quick()) {
            e.quick = None;
            return None;
        }
        let s = e.quick.filter(|s| !s.expired(now))?;
        s.remaining(now).map(|remaining| Wait {
            remaining,
            backoff: s.backoff,
            streak: s.count + 1,
            ending: e.ending.clone(),
        })
    }

    /// A replacement for `key` was created at `now`: after a quick ending, the next one waits.
    pub fn replaced(&self, key: &str, now: Instant) {
        let mut entries = self.lock();
        if entries.len() >= SWEEP_AT {
            entries.retain(|_, e| !e.idle(now));
        }
        let e = entries.entry(key.to_string()).or_default();
        let quick = e.ending.take().is_none_or(|e| e.quick());
        e.refused = None;
        e.quick = quick.then(|| Streak::after(e.quick, now));
        if e.idle(now) {
            entries.remove(key);
        }
    }

    /// A create for `key` was accepted (a first pod, or one for a new image): refusals are over.
    pub fn created(&self, key: &str) {
        if let Some(e) = self.lock().get_mut(key) {
            e.refused = None;
        }
    }

    /// A create for `key` was refused at `now`: how long until the next try, and refusals in a row.
    pub fn refused(&self, key: &str, now: Instant) -> (Duration, u32) {
        let mut entries = self.lock();
        let e = entries.entry(key.to_string()).or_default();
        let s = Streak::after(e.refused, now);
        e.refused = Some(s);
        (s.backoff, s.count)
    }

    /// Forgets `key` (its object is gone).
    pub fn forget(&self, key: &str) {
        self.lock().remove(key);
    }
}

impl Ending {
    /// Ended before it ran for [`MIN_RUN`] (or never ran): part of a loop, if it repeats.
    pub fn quick(&self) -> bool {
        self.ran.is_none_or(|r| r < MIN_RUN)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::immortal::lifecycle::How;

    const S: Duration = Duration::from_secs(1);

    fn len(r: &Restarts) -> usize {
        r.lock().len()
    }

    fn deleted_after(secs: u64) -> Ending {
        Ending {
            how: How::Deleted,
            ran: Some(Duration::from_secs(secs)),
            reason: None,
        }
    }

    /// A pod of `key` ends as `ending` at `now` and is replaced if it may be: the wait, if any.
    fn end(r: &Restarts, key: &str, ending: Option<Ending>, now: Instant) -> Option<Duration> {
        if let Some(e) = ending {
            r.ended(key, e);
        }
        match r.wait(key, now) {
            Some(w) => Some(w.remaining),
            None => {
                r.replaced(key, now);
                None
            }
        }
    }

    #[test]
    fn quick_endings_back_off_doubling_up_to_five_minutes() {
        let r = Restarts::default();
        let t0 = Instant::now();
        let ending = deleted_after(1);
        let quick = || Some(ending.clone());
        assert_eq!(end(&r, "ns/a", quick(), t0), None, "the first goes ahead");
        // Ended again half a second later: wait the rest of the first second.
        r.ended("ns/a", ending.clone());
        let w = r.wait("ns/a", t0 + S / 2).expect("in back-off");
        assert_eq!((w.remaining, w.streak), (S / 2, 2));
        assert_eq!(w.ending, quick());
        // Once it has passed, go ahead, and the back-off doubles.
        assert_eq!(end(&r, "ns/a", quick(), t0 + S), None);
        assert_eq!(r.wait("ns/a", t0 + S + S).map(|w| w.remaining), Some(S));
        let mut t = t0 + S;
        for _ in 0..20 {
            t += MAX;
            assert_eq!(end(&r, "ns/a", quick(), t), None);
        }
        assert_eq!(r.wait("ns/a", t).map(|w| w.remaining), Some(MAX), "capped");
        // Other objects are not affected.
        assert_eq!(r.wait("ns/b", t), None);
    }

    #[test]
    fn a_pod_that_ran_is_replaced_at_once_whatever_came_before() {
        let r = Restarts::default();
        let t0 = Instant::now();
        let mut t = t0;
        for _ in 0..9 {
            while let Some(w) = end(&r, "ns/a", Some(deleted_after(2)), t) {
                t += w;
            }
        }
        assert!(
            r.wait("ns/a", t).is_some(),
            "a streak of quick endings waits"
        );
        // Its replacement ran for a minute and was deleted: at once, and the streak is over.
        t += Duration::from_secs(60);
        assert_eq!(end(&r, "ns/a", Some(deleted_after(60)), t), None);
        // A quick ending after it is the first of a new streak.
        assert_eq!(end(&r, "ns/a", Some(deleted_after(1)), t + S / 10), None);
        let w = r.wait("ns/a", t + S / 5).expect("a new streak");
        assert_eq!((w.backoff, w.streak), (BASE, 2));
    }

    #[test]
    fn an_ending_not_seen_counts_as_quick() {
        let r = Restarts::default();
        let t0 = Instant::now();
        assert_eq!(end(&r, "ns/a", None, t0), None);
        assert!(r.wait("ns/a", t0).is_some());
    }

    #[test]
    fn refusals_back_off_doubling_and_a_create_clears_them() {
        let r = Restarts::default();
        let t0 = Instant::now();
        assert_eq!(r.refused("ns/a", t0), (BASE, 1));
        assert_eq!(r.refused("ns/a", t0 + S), (BASE * 2, 2));
        assert_eq!(r.refused("ns/a", t0 + S * 3), (BASE * 4, 3));
        r.created("ns/a");
        assert_eq!(r.refused("ns/a", t0 + S * 4), (BASE, 1));
    }

    #[test]
    fn expired_entries_are_swept_so_the_book_stays_small() {
        let r = Restarts::default();
        let t0 = Instant::now();
        for i in 0..SWEEP_AT {
            r.replaced(&format!("ns/{i}"), t0);
        }
        r.replaced("ns/new", t0 + MAX * 3);
        assert_eq!(len(&r), 1);
        r.forget("ns/new");
        assert_eq!(len(&r), 0);
    }
}
