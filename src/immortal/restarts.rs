//! Per-object back-off for pods that keep ending, so that an object whose pods are evicted again
//! and again, or fail as soon as they start, does not turn into a create/delete loop.
//!
//! The DaemonSet controller's failed-pods back-off (`failedPodsBackoff`, client-go's
//! `flowcontrol.Backoff`): the first replacement goes ahead at once and starts a back-off of
//! [`BASE`]; a replacement due while the back-off since the previous one runs waits for it to
//! end; each replacement doubles it, up to [`MAX`] (the kubelet's cap on a crash-looping
//! container, which users know). It is forgotten once the last replacement was more than twice
//! [`MAX`] ago, that is once a pod has run for a while. In memory only, as the DaemonSet
//! controller keeps it: a restarted operator starts afresh, which costs at most one early
//! replacement.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The first back-off.
pub const BASE: Duration = Duration::from_secs(1);
/// The longest back-off.
pub const MAX: Duration = Duration::from_secs(300);
/// Entries are swept when the book grows past this many (the expired ones go).
const SWEEP_AT: usize = 1024;

#[derive(Debug, Clone, Copy)]
struct Entry {
    backoff: Duration,
    last: Instant,
    /// Replacements in a row, for the message.
    streak: u32,
}

impl Entry {
    fn expired(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.last) > MAX * 2
    }
}

/// The book, shared by the reconcile workers.
#[derive(Default)]
pub struct Restarts {
    entries: Mutex<HashMap<String, Entry>>,
}

/// A replacement that has to wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wait {
    /// How long until it may go ahead.
    pub remaining: Duration,
    /// Pods replaced in a row, each soon after the one before.
    pub streak: u32,
}

impl Restarts {
    pub fn new() -> Restarts {
        Restarts::default()
    }

    /// The pod of `key` ended and a replacement is due at `now`: `None` when it may be created
    /// now, else how long it must wait.
    pub fn wait(&self, key: &str, now: Instant) -> Option<Wait> {
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let e = entries.get(key).filter(|e| !e.expired(now))?;
        let since = now.saturating_duration_since(e.last);
        (since < e.backoff).then(|| Wait {
            remaining: e.backoff - since,
            streak: e.streak,
        })
    }

    /// Records that a replacement for `key` was created at `now`: the next one waits longer.
    pub fn replaced(&self, key: &str, now: Instant) {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if entries.len() >= SWEEP_AT {
            entries.retain(|_, e| !e.expired(now));
        }
        match entries.get_mut(key) {
            Some(e) if !e.expired(now) => {
                e.backoff = (e.backoff * 2).min(MAX);
                e.last = now;
                e.streak = e.streak.saturating_add(1);
            }
            _ => {
                entries.insert(
                    key.to_string(),
                    Entry {
                        backoff: BASE,
                        last: now,
                        streak: 1,
                    },
                );
            }
        }
    }

    /// Forgets `key` (its object is gone).
    pub fn forget(&self, key: &str) {
        self.entries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.lock().unwrap().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn the_first_replacement_goes_ahead_and_the_next_ones_wait_doubling_up_to_five_minutes() {
        let r = Restarts::new();
        let t0 = Instant::now();
        assert_eq!(r.wait("ns/a", t0), None, "nothing known: go ahead");
        r.replaced("ns/a", t0);
        // Ended again half a second later: wait the rest of the first second.
        let w = r.wait("ns/a", t0 + S / 2).expect("in back-off");
        assert_eq!((w.remaining, w.streak), (S / 2, 1));
        // Once it has passed, go ahead, and the back-off doubles.
        assert_eq!(r.wait("ns/a", t0 + S), None);
        r.replaced("ns/a", t0 + S);
        assert_eq!(r.wait("ns/a", t0 + S + S).map(|w| w.remaining), Some(S));
        let mut t = t0 + S;
        for _ in 0..20 {
            t += MAX;
            r.replaced("ns/a", t);
        }
        assert_eq!(r.wait("ns/a", t).map(|w| w.remaining), Some(MAX), "capped");
        // Other objects are not affected.
        assert_eq!(r.wait("ns/b", t), None);
    }

    #[test]
    fn a_pod_that_ran_for_a_while_resets_the_back_off() {
        let r = Restarts::new();
        let t0 = Instant::now();
        for i in 0..5 {
            r.replaced("ns/a", t0 + S * i);
        }
        // Its pod ran longer than twice the longest back-off: forgotten.
        let later = t0 + S * 4 + MAX * 2 + S;
        assert_eq!(r.wait("ns/a", later), None);
        r.replaced("ns/a", later);
        let w = r.wait("ns/a", later).expect("back-off restarted");
        assert_eq!((w.remaining, w.streak), (BASE, 1));
    }

    #[test]
    fn expired_entries_are_swept_so_the_book_stays_small() {
        let r = Restarts::new();
        let t0 = Instant::now();
        for i in 0..SWEEP_AT {
            r.replaced(&format!("ns/{i}"), t0);
        }
        r.replaced("ns/new", t0 + MAX * 3);
        assert_eq!(r.len(), 1);
        r.forget("ns/new");
        assert_eq!(r.len(), 0);
    }
}
