//! What the reconcile workers share: what this process learned that the API server does not
//! hold (lost on a restart, which the count does not depend on), and the clock.

use super::expectations::Expectations;
use crate::immortal::counting::Counting;
use crate::immortal::restarts::Restarts;
use crate::kube::types::Uid;
use crate::runtime::store::Key;
use crate::util::lock;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Instant, SystemTime};

/// Dropped-field messages remembered at most, one per pod made and not released.
const DROPPED_AT_MOST: usize = 1 << 18;

/// What the reconcile workers share, and the clock (virtual in the fault-injection tests).
pub struct Context {
    pub restarts: Restarts,
    pub counting: Counting,
    pub expectations: Expectations,
    /// What the API server did not keep of the pod (uid, by key) this process made, until it
    /// is released: the status write that counts it says so (see [`Context::dropped`]).
    dropped: Mutex<HashMap<Key, (Uid, Arc<str>)>>,
    /// The API server's Kubernetes version (`/version`'s `gitVersion`), read at start: named
    /// where the operator says what the cluster did not keep of a pod.
    pub version: OnceLock<String>,
    clock: Box<dyn Fn() -> Instant + Send + Sync>,
    /// The time of day, read against the API server's timestamps (a grace period's end).
    wall: Box<dyn Fn() -> SystemTime + Send + Sync>,
}

impl Context {
    pub fn with_clock(clock: impl Fn() -> Instant + Send + Sync + 'static) -> Context {
        let expectations = Expectations::new(clock());
        Context {
            restarts: Restarts::default(),
            counting: Counting::default(),
            expectations,
            dropped: Mutex::default(),
            version: OnceLock::new(),
            clock: Box::new(clock),
            wall: Box::new(SystemTime::now),
        }
    }

    /// The context, its time of day told by `wall` instead of the system's.
    #[cfg(test)]
    pub fn with_wall_clock(self, wall: impl Fn() -> SystemTime + Send + Sync + 'static) -> Context {
        Context {
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

    /// The pod of `key` was released, or the object is gone: nothing of it is held any more.
    pub(super) fn forget_held(&self, key: &str) {
        self.expectations.forget_made(key);
        lock(&self.dropped).remove(key);
    }

    /// This process created the pod `uid` of `key`, and the API server did not keep what
    /// `message` says (`None`: it kept everything).
    pub(super) fn dropped(&self, key: &Key, uid: &str, message: Option<String>) {
        let mut dropped = lock(&self.dropped);
        match message {
            Some(m) => {
                if dropped.len() >= DROPPED_AT_MOST {
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
}

impl Default for Context {
    fn default() -> Self {
        Context::with_clock(Instant::now)
    }
}
