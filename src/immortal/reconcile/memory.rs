//! What the reconcile workers keep between reconciles.

use crate::immortal::counting::Counting;
use crate::immortal::restarts::Restarts;
use crate::kube::types::Uid;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Replacements whose old pod's DELETED event is awaited, at most (see [`Memory`]): about
/// half a megabyte. Each is held only until that event comes, normally milliseconds.
const REPLACED_AT_MOST: usize = 4096;

/// Pods this process let go that are remembered at once, in each of two generations (see
/// [`Memory::released`]): about 160 kB at most. An entry is needed only while an event from
/// before the release may still wait in the queue, normally milliseconds.
const RELEASED_AT_MOST: usize = 2048;

/// Pods whose count waits (see [`Memory::waiting`]), at most: about 1 MB. Each is held only
/// until its count, at most `counting::COUNT_WAIT` after its create unless status cannot be
/// written; forgetting one costs a read (or a refused create) when its key comes back.
const WAITING_AT_MOST: usize = 16_384;

/// What the reconcile workers keep between reconciles, shared by all of them: the restart
/// back-off, what the installed CRD keeps of the status we write, the pods whose count waits,
/// and the clock (virtual in the exactly-once fault-injection tests).
pub struct Memory {
    pub restarts: Restarts,
    pub counting: Counting,
    /// Pods (uid, by key) this process saw removed and then replaced, until their DELETED
    /// event comes: the only ground on which such an event is "nothing new" without a read.
    replaced: Mutex<HashMap<String, String>>,
    /// Pods (uid) this process let go, with the resourceVersion the release answered: a watch
    /// event older than that still shows our finalizer, and must not make us release again.
    released: Mutex<Released>,
    /// Pods (by key) this process created whose count waits (see `counting::COUNT_WAIT`):
    /// uid, the pod status counted last when it was created, and when.
    waiting: Mutex<HashMap<String, Waiting>>,
    /// `counting::COUNT_WAIT`; zero in the unit tests that predate the wait.
    pub(super) count_wait: Duration,
    clock: Box<dyn Fn() -> Instant + Send + Sync>,
}

impl Memory {
    pub fn new() -> Memory {
        Memory::with_clock(Instant::now)
    }

    pub fn with_clock(clock: impl Fn() -> Instant + Send + Sync + 'static) -> Memory {
        Memory {
            restarts: Restarts::new(),
            counting: Counting::new(),
            replaced: Mutex::default(),
            released: Mutex::default(),
            waiting: Mutex::default(),
            count_wait: crate::immortal::counting::COUNT_WAIT,
            clock: Box::new(clock),
        }
    }

    /// Every pod counted at once, as before the wait (for the tests of everything else).
    #[cfg(test)]
    pub(super) fn counting_at_once(self) -> Memory {
        let count_wait = Duration::ZERO;
        Memory { count_wait, ..self }
    }

    pub fn now(&self) -> Instant {
        (self.clock)()
    }

    /// This process saw the pod `uid` of `key` removed, then created its replacement.
    pub(super) fn replaced(&self, key: &str, uid: &str) {
        let mut replaced = self.replaced.lock().unwrap_or_else(|p| p.into_inner());
        if replaced.len() >= REPLACED_AT_MOST {
            // Events that never came (a relist took their place): forgetting one costs a
            // read when it does come, never a wrong answer.
            replaced.clear();
        }
        replaced.insert(key.to_string(), uid.to_string());
    }

    /// Whether the pod `uid` of `key` is one this process replaced (forgotten once asked).
    pub(super) fn was_replaced(&self, key: &str, uid: &str) -> bool {
        let mut replaced = self.replaced.lock().unwrap_or_else(|p| p.into_inner());
        let yes = replaced.get(key).is_some_and(|u| u == uid);
        if yes {
            replaced.remove(key);
        }
        yes
    }

    /// This process let the pod `uid` go; the API server answered the release with version
    /// `rv` (see [`Memory::released_after`]).
    pub(super) fn released(&self, uid: &str, rv: &str) {
        let Ok(rv) = rv.parse::<u64>() else {
            return;
        };
        let mut released = self.released.lock().unwrap_or_else(|p| p.into_inner());
        if released.now.len() >= RELEASED_AT_MOST {
            // The older generation goes: releases long past any event still queued. Forgetting
            // one costs a repeated release at worst, never a missed one.
            released.before = std::mem::take(&mut released.now);
        }
        released.now.insert(Uid::new(uid), rv);
    }

    /// Whether this process let the pod `uid` go after the watch event of version `rv` showed
    /// it: that event's finalizer is one the release took off. ResourceVersions compared as
    /// numbers, as `store::rv_later` does; where either is not one (`rv` 0), nothing is known,
    /// and the pod is released again (a repeat changes nothing).
    pub(super) fn released_after(&self, uid: &Uid, rv: u64) -> bool {
        if rv == 0 {
            return false;
        }
        let released = self.released.lock().unwrap_or_else(|p| p.into_inner());
        released
            .now
            .get(uid)
            .or_else(|| released.before.get(uid))
            .is_some_and(|&at| rv < at)
    }

    /// This process created the pod `uid` of `key`, with `last_counted` the pod status counted
    /// last; its count waits (see `counting::COUNT_WAIT`).
    pub(super) fn wait_for_count(&self, key: &str, uid: &str, last_counted: Option<&str>) {
        let now = self.now();
        let mut waiting = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
        if waiting.len() >= WAITING_AT_MOST {
            // Objects deleted while they waited: long past any bound.
            waiting.retain(|_, w| now.saturating_duration_since(w.2) < self.count_wait * 30);
        }
        let w = (Uid::new(uid), last_counted.map(Uid::new), now);
        waiting.insert(key.to_string(), w);
    }

    /// The pod of `key` whose count waits, and since when, while status still counts
    /// `last_counted` last. Counts only move on to newer pods, so that pod is not counted yet;
    /// once status counts another, it is forgotten.
    pub(super) fn waiting(&self, key: &str, last_counted: Option<&str>) -> Option<(Uid, Instant)> {
        let mut waiting = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
        let (pod, after, since) = waiting.get(key)?;
        if *after != last_counted.map(Uid::new) {
            waiting.remove(key);
            return None;
        }
        Some((pod.clone(), *since))
    }
}

type Waiting = (Uid, Option<Uid>, Instant);

/// Pods let go, in two generations, so that the latest ones are always remembered.
#[derive(Default)]
struct Released {
    now: HashMap<Uid, u64>,
    before: HashMap<Uid, u64>,
}

impl Default for Memory {
    fn default() -> Self {
        Memory::new()
    }
}
