//! Whether each watch is live: the watchers record when a stream opens, closes and hears from
//! the server; `/readyz` and the metrics read it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// One watched resource's moments, in Unix milliseconds.
#[derive(Default)]
struct Watch {
    /// The last event or bookmark; 0 = never.
    last_heard_ms: AtomicU64,
    /// Since when no stream has been open; 0 while one is.
    down_since_ms: AtomicU64,
}

static WATCHES: Mutex<BTreeMap<&'static str, &'static Watch>> = Mutex::new(BTreeMap::new());

fn watch(resource: &'static str) -> &'static Watch {
    let mut w = WATCHES.lock().unwrap_or_else(|p| p.into_inner());
    // One leaked allocation per watched resource (two in all), so lock-free updates afterwards.
    w.entry(resource)
        .or_insert_with(|| Box::leak(Box::default()))
}

/// Every resource a watcher has reported on, and how long since the server last spoke on its
/// watch (`None`: never).
pub fn silences() -> Vec<(&'static str, Option<Duration>)> {
    let watches = WATCHES.lock().unwrap_or_else(|p| p.into_inner()).clone();
    watches
        .into_iter()
        .map(|(r, s)| {
            let last = s.last_heard_ms.load(Relaxed);
            let silence = Duration::from_millis(unix_ms().saturating_sub(last));
            (r, (last != 0).then_some(silence))
        })
        .collect()
}

/// A watch stream of this resource was opened.
pub fn opened(resource: &'static str) {
    let s = watch(resource);
    s.down_since_ms.store(0, Relaxed);
    s.last_heard_ms.store(unix_ms(), Relaxed);
}

/// This resource's watch stream ended, or could not be opened: down from now, unless it was.
pub fn closed(resource: &'static str) {
    let _ = watch(resource)
        .down_since_ms
        .compare_exchange(0, unix_ms(), Relaxed, Relaxed);
}

/// The server said something on this resource's watch (an event or a bookmark) or a list
/// completed: the connection is alive.
pub fn heard(resource: &'static str) {
    watch(resource).last_heard_ms.store(unix_ms(), Relaxed);
}

/// How long this resource's watch has not been live, `None` while it is. Live: a stream is
/// open and the server was heard within `idle`.
pub fn down_for(resource: &'static str, idle: Duration) -> Option<Duration> {
    let s = watch(resource);
    let heard = s.last_heard_ms.load(Relaxed);
    let down = s.down_since_ms.load(Relaxed);
    let quiet_from = heard.saturating_add(idle.as_millis() as u64);
    let since = match down {
        0 => quiet_from,
        d => d.min(quiet_from),
    };
    let now = unix_ms();
    (now > since).then(|| Duration::from_millis(now - since))
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn a_watch_is_live_while_open_and_heard_within_the_idle_limit() {
        let r = "liveness-test-resource";
        let idle = Duration::from_millis(200);
        let opened_at = Instant::now();
        opened(r);
        assert_eq!(down_for(r, idle), None);
        std::thread::sleep(Duration::from_millis(300));
        // Open but silent for longer than the limit: down since the limit ran out.
        let d = down_for(r, idle).expect("silent");
        let silent = opened_at.elapsed();
        assert!(
            d >= Duration::from_millis(90) && d + idle <= silent + Duration::from_millis(5),
            "{d:?} down after {silent:?} of silence"
        );
        heard(r);
        assert_eq!(down_for(r, idle), None);
        // Closed: down at once, and a later close does not move the moment.
        closed(r);
        std::thread::sleep(Duration::from_millis(50));
        closed(r);
        let d = down_for(r, idle).expect("closed");
        assert!(d >= Duration::from_millis(40), "{d:?}");
        opened(r);
        assert_eq!(down_for(r, idle), None);
    }
}
