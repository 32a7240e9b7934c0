//! The watch events this process expects, as client-go controllers' expectations: the pods it
//! made, replaced and released, whose events may still be on their way. Kept between reconciles
//! and lost on a restart, which costs a read, never a wrong count.

use crate::immortal::counting::RELEASE_WITHIN;
use crate::kube::types::Uid;
use crate::runtime::store::Key;
use crate::util::{lock, Stamp};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Replacements whose old pod's DELETED event is awaited, at most; each is held only until
/// that event comes.
const REPLACED_AT_MOST: usize = 4096;

/// Pods this process released that are remembered, in each of two generations: an entry is
/// needed only while an event from before the release may still wait in the queue.
const RELEASED_AT_MOST: usize = 2048;

/// Pods this process created and has not released yet that are remembered, at most: as many
/// as a backlog creates ahead of its counts. Forgetting one costs a read, never a wrong count.
const MADE_AT_MOST: usize = 1 << 18;

/// The pods this process made, replaced and released whose watch events it expects.
pub struct Expectations {
    /// Pods (uid, by key) this process saw removed and then replaced, until their DELETED
    /// event comes: the only ground on which such an event is "nothing new" without a read.
    replaced: Mutex<HashMap<String, String>>,
    /// Pods this process released, with the resourceVersion the release answered: a watch
    /// event older than that still shows our finalizer, and must not make us release again.
    released: Mutex<Released>,
    /// The pod (by key) this process created last and has not released: it exists and nothing
    /// after it was counted, so a watch event showing it is counted without a read.
    made: Mutex<HashMap<Key, Made>>,
    /// What [`Made`]'s times count from.
    epoch: Instant,
}

impl Expectations {
    pub fn new(epoch: Instant) -> Expectations {
        Expectations {
            replaced: Mutex::default(),
            released: Mutex::default(),
            made: Mutex::default(),
            epoch,
        }
    }

    /// This process saw the pod `uid` of `key` removed, then created its replacement.
    pub(super) fn replaced(&self, key: &str, uid: &str) {
        let mut replaced = lock(&self.replaced);
        if replaced.len() >= REPLACED_AT_MOST {
            // Events that never came (a relist took their place): forgetting costs a read.
            replaced.clear();
        }
        replaced.insert(key.to_string(), uid.to_string());
    }

    /// Whether the pod `uid` of `key` is one this process replaced (forgotten once asked).
    pub(super) fn was_replaced(&self, key: &str, uid: &str) -> bool {
        let mut replaced = lock(&self.replaced);
        replaced.get(key).is_some_and(|u| u == uid) && replaced.remove(key).is_some()
    }

    /// This process created the pod `uid` of `key` (see [`Expectations::made_here`]).
    pub(super) fn made(&self, key: &Key, uid: &str, now: Instant) {
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
    pub(super) fn made_here(&self, key: &str, now: Instant) -> Option<(Uid, Duration)> {
        let now = self.stamp(now);
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
    pub(super) fn released_elsewhere(&self, key: &str, uid: &str) {
        let mut made = lock(&self.made);
        if made.get(key).is_some_and(|m| m.uid == *uid) {
            made.remove(key);
        }
    }

    /// Nothing made for `key` is held any more.
    pub(super) fn forget_made(&self, key: &str) {
        lock(&self.made).remove(key);
    }

    /// This process let the pod `uid` go; the API server answered the release with version
    /// `rv` (see [`Expectations::released_after`]).
    pub(super) fn released(&self, uid: &str, rv: &str) {
        let Ok(rv) = rv.parse::<u64>() else {
            return;
        };
        let mut released = lock(&self.released);
        if released.now.len() >= RELEASED_AT_MOST {
            // The older generation goes; forgetting one costs a repeated release at worst.
            released.before = std::mem::take(&mut released.now);
        }
        released.now.insert(Uid::new(uid), rv);
    }

    /// Whether this process released the pod `uid` after the watch event of version `rv` showed
    /// it. ResourceVersions compared as numbers, as `IcState::replaces` does; `rv` 0 (not a
    /// number) knows nothing, and the pod is released again (a repeat changes nothing).
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
