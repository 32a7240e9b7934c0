//! The journal: what this process did and learned that the API server does not hold, kept
//! between reconciles and lost on a restart (nothing the count depends on).

use crate::immortal::counting::{Counting, RELEASE_WITHIN};
use crate::immortal::restarts::Restarts;
use crate::kube::types::Uid;
use crate::runtime::store::Key;
use crate::util::{lock, Stamp};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime};

/// Replacements whose old pod's DELETED event is awaited, at most (see [`Journal`]): about
/// half a megabyte. Each is held only until that event comes, normally milliseconds.
const REPLACED_AT_MOST: usize = 4096;

/// Pods this process released that are remembered at once, in each of two generations (see
/// [`Journal::released`]): about 160 kB at most. An entry is needed only while an event from
/// before the release may still wait in the queue, normally milliseconds.
const RELEASED_AT_MOST: usize = 2048;

/// Pods this process created and has not released yet that are remembered, at most: about 50
/// bytes each (the key is the queue's), as many as a backlog creates ahead of its counts.
/// Forgetting them costs a read and an early release each, never a wrong count.
const MADE_AT_MOST: usize = 1 << 18;

/// What this process did and learned, shared by the reconcile workers: the restart back-off,
/// what the installed CRD keeps of the status we write, the pods it made, replaced and released
/// whose watch events may still be on their way (as client-go controllers' expectations), and
/// the clock (virtual in the exactly-once fault-injection tests).
pub struct Journal {
    pub restarts: Restarts,
    pub counting: Counting,
    /// Pods (uid, by key) this process saw removed and then replaced, until their DELETED
    /// event comes: the only ground on which such an event is "nothing new" without a read.
    replaced: Mutex<HashMap<String, String>>,
    /// Pods this process released, with the resourceVersion the release answered: a watch
    /// event older than that still shows our finalizer, and must not make us release again.
    released: Mutex<Released>,
    /// The pod (by key) this process created last and has not released: it exists and nothing
    /// after it was counted, so a watch event showing it is counted without a read; and its
    /// release may wait while other objects get their pods and statuses, within a bound.
    made: Mutex<HashMap<Key, Made>>,
    /// What the API server did not keep of the pod (uid, by key) this process made, until it
    /// is released: the status write that counts it says so (see [`Journal::dropped`]).
    dropped: Mutex<HashMap<Key, (Uid, Arc<str>)>>,
    /// The API server's Kubernetes version (`/version`'s `gitVersion`), read at start: named
    /// where the operator says what the cluster did not keep of a pod.
    pub version: OnceLock<String>,
    clock: Box<dyn Fn() -> Instant + Send + Sync>,
    /// What [`Made`]'s times count from.
    epoch: Instant,
    /// The time of day, read against the API server's timestamps (a grace period's end).
    wall: Box<dyn Fn() -> SystemTime + Send + Sync>,
}

impl Journal {
    pub fn with_clock(clock: impl Fn() -> Instant + Send + Sync + 'static) -> Journal {
        let epoch = clock();
        Journal {
            epoch,
            restarts: Restarts::default(),
            counting: Counting::default(),
            replaced: Mutex::default(),
            released: Mutex::default(),
            made: Mutex::default(),
            dropped: Mutex::default(),
            version: OnceLock::new(),
            clock: Box::new(clock),
            wall: Box::new(SystemTime::now),
        }
    }

    /// The journal, its time of day told by `wall` instead of the system's.
    #[cfg(test)]
    pub fn with_wall_clock(self, wall: impl Fn() -> SystemTime + Send + Sync + 'static) -> Journal {
        Journal {
            wall: Box::new(wall),
            ..self
        }
    }

    pub fn now(&self) -> Instant {
        (self.clock)()
    }

    /// The time of day, for comparing with the API server's timestamps.
    pub fn wall_now(&self) -> SystemTime {
        (self.wall)()
    }

    /// This process saw the pod `uid` of `key` removed, then created its replacement.
    pub(super) fn replaced(&self, key: &str, uid: &str) {
        let mut replaced = lock(&self.replaced);
        if replaced.len() >= REPLACED_AT_MOST {
            // Events that never came (a relist took their place): forgetting one costs a
            // read when it does come, never a wrong answer.
            replaced.clear();
        }
        replaced.insert(key.to_string(), uid.to_string());
    }

    /// Whether the pod `uid` of `key` is one this process replaced (forgotten once asked).
    pub(super) fn was_replaced(&self, key: &str, uid: &str) -> bool {
        let mut replaced = lock(&self.replaced);
        replaced.get(key).is_some_and(|u| u == uid) && replaced.remove(key).is_some()
    }

    /// This process created the pod `uid` of `key` (see [`Journal::made_here`]).
    pub(super) fn made(&self, key: &Key, uid: &str) {
        let now = self.now();
        let mut made = lock(&self.made);
        if made.len() >= MADE_AT_MOST {
            made.clear();
        }
        let pod = Made {
            uid: Uid::new(uid),
            at: self.stamp(now),
        };
        made.insert(key.clone(), pod);
    }

    /// The pod of `key` this process created and has not released, and how long ago.
    pub(super) fn made_here(&self, key: &str) -> Option<(Uid, Duration)> {
        let now = self.stamp(self.now());
        lock(&self.made)
            .get(key)
            .map(|m| (m.uid.clone(), m.at.until(now)))
    }

    /// Whether a pod made `ago` is due for release ([`RELEASE_WITHIN`]).
    pub(super) fn is_overdue(ago: Duration) -> bool {
        ago >= RELEASE_WITHIN
    }

    /// `t` as [`Made`] keeps it.
    fn stamp(&self, t: Instant) -> Stamp {
        Stamp::of(t, self.epoch)
    }

    /// The pod `uid` of `key`, made here, holds our finalizer no more.
    pub(super) fn forget_made(&self, key: &str, uid: &str) {
        let mut made = lock(&self.made);
        if made.get(key).is_some_and(|m| m.uid == *uid) {
            made.remove(key);
        }
    }

    /// The pod of `key` was released, or the object is gone: nothing of it is held any more.
    pub(super) fn forget_held(&self, key: &str) {
        lock(&self.made).remove(key);
        lock(&self.dropped).remove(key);
    }

    /// This process created the pod `uid` of `key`, and the API server did not keep what
    /// `message` says (`None`: it kept everything).
    pub(super) fn dropped(&self, key: &Key, uid: &str, message: Option<String>) {
        let mut dropped = lock(&self.dropped);
        match message {
            Some(m) => {
                if dropped.len() >= MADE_AT_MOST {
                    dropped.clear();
                }
                dropped.insert(key.clone(), (Uid::new(uid), m.into()));
            }
            None => {
                dropped.remove(key);
            }
        }
    }

    /// What the API server did not keep of the pod `uid` of `key`, if this process made it
    /// and was told.
    pub(super) fn dropped_from(&self, key: &str, uid: &str) -> Option<Arc<str>> {
        lock(&self.dropped)
            .get(key)
            .filter(|(u, _)| *u == *uid)
            .map(|(_, m)| m.clone())
    }

    /// This process let the pod `uid` go; the API server answered the release with version
    /// `rv` (see [`Journal::released_after`]).
    pub(super) fn released(&self, uid: &str, rv: &str) {
        let Ok(rv) = rv.parse::<u64>() else {
            return;
        };
        let mut released = lock(&self.released);
        if released.now.len() >= RELEASED_AT_MOST {
            // The older generation goes: releases long past any event still queued. Forgetting
            // one costs a repeated release at worst, never a missed one.
            released.before = std::mem::take(&mut released.now);
        }
        released.now.insert(Uid::new(uid), rv);
    }

    /// Whether this process let the pod `uid` go after the watch event of version `rv` showed
    /// it: that event's finalizer is one the release took off. ResourceVersions compared as
    /// numbers, as `IcState::replaces` does; where either is not one (`rv` 0), nothing is known,
    /// and the pod is released again (a repeat changes nothing).
    pub(super) fn released_after(&self, uid: &Uid, rv: u64) -> bool {
        if rv == 0 {
            return false;
        }
        let released = lock(&self.released);
        released
            .now
            .get(uid)
            .or_else(|| released.before.get(uid))
            .is_some_and(|&at| rv < at)
    }
}

/// A pod this process made and has not released.
struct Made {
    uid: Uid,
    /// When it was made.
    at: Stamp,
}

/// Pods released, in two generations, so that the latest ones are always remembered.
#[derive(Default)]
struct Released {
    now: HashMap<Uid, u64>,
    before: HashMap<Uid, u64>,
}

impl Default for Journal {
    fn default() -> Self {
        Journal::with_clock(Instant::now)
    }
}
