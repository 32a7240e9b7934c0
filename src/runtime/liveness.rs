//! Whether each watch (one resource in one namespace, or in all) is live: the watchers record
//! their lists and streams; `/readyz`, start-up and the metrics read it.

use crate::util;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::{Duration, UNIX_EPOCH};

/// One watch and its moments, in Unix milliseconds.
#[derive(Debug, Default)]
pub struct Watch {
    /// The resource's short name (`pod`, `immortalcontainer`).
    pub resource: &'static str,
    /// `None` for a watch of every namespace.
    pub namespace: Option<&'static str>,
    /// The last event or bookmark; 0 = never.
    last_heard_ms: AtomicU64,
    /// Since when no stream has been open; 0 while one is.
    down_since_ms: AtomicU64,
    /// A list completed: its objects are known.
    listed: AtomicBool,
    /// Why its last list failed, until one completes.
    failure: Mutex<Option<String>>,
}

static WATCHES: Mutex<BTreeMap<(&'static str, Option<&'static str>), &'static Watch>> =
    Mutex::new(BTreeMap::new());

/// The one watch of `resource` in `namespace` (`None`: all), leaked so that updates take no lock.
pub fn watch(resource: &'static str, namespace: Option<&str>) -> &'static Watch {
    let mut w = util::lock(&WATCHES);
    if let Some(found) = w.get(&(resource, namespace)) {
        return found;
    }
    let namespace = namespace.map(|ns| &*Box::leak(ns.into()));
    let new: &'static Watch = Box::leak(Box::new(Watch {
        resource,
        namespace,
        ..Default::default()
    }));
    w.insert((resource, namespace), new);
    new
}

/// Every watch a watcher or the probes asked for, in order of resource and namespace.
pub fn watches() -> Vec<&'static Watch> {
    util::lock(&WATCHES).values().copied().collect()
}

impl Watch {
    pub fn listed(&self) {
        self.listed.store(true, Relaxed);
        *util::lock(&self.failure) = None;
    }

    pub fn has_listed(&self) -> bool {
        self.listed.load(Relaxed)
    }

    pub fn list_failed(&self, why: String) {
        *util::lock(&self.failure) = Some(why);
    }

    /// Why its last list failed, if no list has completed since (`None`: none failed).
    pub fn failure(&self) -> Option<String> {
        util::lock(&self.failure).clone()
    }

    /// `pod list: why` while no list of this watch has completed.
    pub fn unlisted(&self) -> Option<String> {
        let failure = (!self.has_listed()).then(|| self.failure())?;
        let why = failure.as_deref().unwrap_or("not answered yet");
        Some(format!("{} list: {why}", self.resource))
    }

    pub fn opened(&self) {
        self.down_since_ms.store(0, Relaxed);
        self.last_heard_ms.store(unix_ms(), Relaxed);
    }

    /// The stream ended, or could not be opened: down from now, unless it was.
    pub fn closed(&self) {
        let _ = self
            .down_since_ms
            .compare_exchange(0, unix_ms(), Relaxed, Relaxed);
    }

    /// The server said something on this watch, or a list completed.
    pub fn heard(&self) {
        self.last_heard_ms.store(unix_ms(), Relaxed);
    }

    /// How long since the server last spoke on this watch (`None`: never).
    pub fn silence(&self) -> Option<Duration> {
        let last = self.last_heard_ms.load(Relaxed);
        (last != 0).then(|| Duration::from_millis(unix_ms().saturating_sub(last)))
    }

    /// How long this watch has not been live (a stream open, the server heard within `idle`).
    pub fn down_for(&self, idle: Duration) -> Option<Duration> {
        let heard = self.last_heard_ms.load(Relaxed);
        let down = self.down_since_ms.load(Relaxed);
        let quiet_from = heard.saturating_add(idle.as_millis() as u64);
        let since = match down {
            0 => quiet_from,
            d => d.min(quiet_from),
        };
        let now = unix_ms();
        (now > since).then(|| Duration::from_millis(now - since))
    }
}

impl std::fmt::Display for Watch {
    /// `pod watch`, or `pod watch in namespace team-a`, as `/readyz` says which is not live.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.namespace {
            None => write!(f, "{} watch", self.resource),
            Some(ns) => write!(f, "{} watch in namespace {ns}", self.resource),
        }
    }
}

fn unix_ms() -> u64 {
    UNIX_EPOCH.elapsed().map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn a_watch_is_live_while_open_and_heard_within_the_idle_limit() {
        let w = watch("liveness-test-resource", None);
        let idle = Duration::from_millis(200);
        let opened_at = Instant::now();
        w.opened();
        assert_eq!(w.down_for(idle), None);
        std::thread::sleep(Duration::from_millis(300));
        // Open but silent for longer than the limit: down since the limit ran out.
        let d = w.down_for(idle).expect("silent");
        let silent = opened_at.elapsed();
        assert!(
            d >= Duration::from_millis(90) && d + idle <= silent + Duration::from_millis(5),
            "{d:?} down after {silent:?} of silence"
        );
        w.heard();
        assert_eq!(w.down_for(idle), None);
        // Closed: down at once, and a later close does not move the moment.
        w.closed();
        std::thread::sleep(Duration::from_millis(50));
        w.closed();
        let d = w.down_for(idle).expect("closed");
        assert!(d >= Duration::from_millis(40), "{d:?}");
        w.opened();
        assert_eq!(w.down_for(idle), None);
    }

    #[test]
    fn each_namespace_has_a_watch_of_its_own_and_asking_again_finds_it() {
        let r = "liveness-test-namespaces";
        let (a, b, all) = (watch(r, Some("a")), watch(r, Some("b")), watch(r, None));
        assert!(std::ptr::eq(a, watch(r, Some("a"))));
        assert!(!std::ptr::eq(a, b) && !std::ptr::eq(a, all));
        a.opened();
        b.closed();
        let idle = Duration::from_secs(60);
        assert_eq!(a.down_for(idle), None);
        assert!(b.down_for(idle).is_some());
        assert_eq!(a.to_string(), format!("{r} watch in namespace a"));
        assert_eq!(all.to_string(), format!("{r} watch"));
        let listed = watches();
        assert!(listed.iter().any(|w| std::ptr::eq(*w, b)));
    }
}
