//! What a watcher knows of each key, its event handler's cached copy, which reconcile reads
//! instead of asking the API server, as sample-controller's `syncHandler` reads through its listers.

use std::collections::HashMap;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// A `namespace/name` key, stored once, shared by the store, the queue and reconcile.
pub type Key = Arc<str>;

/// The keys a watcher knows, each with its cached copy.
pub struct Store<M> {
    map: RwLock<HashMap<Key, M>>,
}

impl<M> Default for Store<M> {
    fn default() -> Self {
        Store {
            map: RwLock::new(HashMap::new()),
        }
    }
}

impl<M: Clone> Store<M> {
    pub fn new() -> Store<M> {
        Store::default()
    }

    /// The cached copy of `key`, if the watcher knows it.
    pub fn get(&self, key: &str) -> Option<M> {
        self.read().get(key).cloned()
    }

    /// Applies `f` to the cached copy of `key` if the watcher knows it. Only the watcher makes
    /// entries, so that an answer arriving after the object's deletion cannot bring it back.
    pub fn update(&self, key: &str, f: impl FnOnce(&mut M)) {
        if let Some(m) = self.write().get_mut(key) {
            f(m);
        }
    }

    /// The store's copy of `key`, if it knows it, for another store to share.
    pub fn key(&self, key: &str) -> Option<Key> {
        self.read().get_key_value(key).map(|(k, _)| k.clone())
    }

    /// Lets `f` change what is known of `key` (left `None`: forgotten); answers the store's copy.
    pub fn entry<R>(&self, key: Key, f: impl FnOnce(&mut Option<M>) -> R) -> (R, Key) {
        let mut map = self.write();
        let (key, mut cached) = match map.remove_entry(&*key) {
            Some((k, m)) => (k, Some(m)),
            None => (key, None),
        };
        let r = f(&mut cached);
        if let Some(m) = cached {
            map.insert(key.clone(), m);
        }
        (r, key)
    }

    pub(crate) fn read(&self) -> RwLockReadGuard<'_, HashMap<Key, M>> {
        // Every write below leaves the map whole before anything that could panic.
        self.map.read().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn write(&self) -> RwLockWriteGuard<'_, HashMap<Key, M>> {
        self.map.write().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl<M: Clone> Store<M> {
        /// Whether the watcher knows no key, for other modules' tests.
        pub(crate) fn is_empty(&self) -> bool {
            self.read().is_empty()
        }
    }

    #[test]
    fn an_update_changes_a_known_entry_and_never_makes_one() {
        let s: Store<u64> = Store::new();
        s.write().insert("ns/a".into(), 1);
        s.update("ns/a", |m| *m = 2);
        s.update("ns/gone", |m| *m = 3);
        assert_eq!(s.get("ns/a"), Some(2));
        assert_eq!(s.get("ns/gone"), None);
        assert_eq!(s.read().len(), 1);
    }
}
