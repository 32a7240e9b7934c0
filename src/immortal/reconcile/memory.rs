//! What the reconcile workers keep between reconciles.

use crate::immortal::counting::Counting;
use crate::immortal::restarts::Restarts;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

/// Replacements whose old pod's DELETED event is awaited, at most (see [`Memory`]): about
/// half a megabyte. Each is held only until that event comes, normally milliseconds.
const REPLACED_AT_MOST: usize = 4096;

/// What the reconcile workers keep between reconciles, shared by all of them: the restart
/// back-off, what the installed CRD keeps of the status we write, and the clock (virtual in the
/// exactly-once fault-injection tests).
pub struct Memory {
    pub restarts: Restarts,
    pub counting: Counting,
    /// Pods (uid, by key) this process saw removed and then replaced, until their DELETED
    /// event comes: the only ground on which such an event is "nothing new" without a read.
    replaced: Mutex<HashMap<String, String>>,
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
            clock: Box::new(clock),
        }
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
}

impl Default for Memory {
    fn default() -> Self {
        Memory::new()
    }
}
