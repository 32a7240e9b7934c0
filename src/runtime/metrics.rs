//! Process-wide counters in Prometheus text format, named as controller-runtime names them so
//! existing dashboards work unchanged.
//!
//! Recording is a few atomic operations (or one short lock for labelled counters); nothing is
//! formatted until `/metrics` is scraped.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Controller and queue name in every label, as controller-runtime uses the lower-cased kind.
pub const CONTROLLER: &str = "immortalcontainer";

/// controller-runtime's reconcile-time buckets.
const RECONCILE_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.6, 0.7, 0.8, 0.9,
    1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 15.0, 20.0,
    25.0, 30.0, 40.0, 50.0, 60.0,
];
/// client-go's workqueue buckets: 10 ns · 10^i.
const QUEUE_BUCKETS: &[f64] = &[1e-8, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0];

struct Histogram {
    buckets: &'static [f64],
    counts: Vec<AtomicU64>,
    sum_micros: AtomicU64,
    count: AtomicU64,
}

impl Histogram {
    fn new(buckets: &'static [f64]) -> Histogram {
        Histogram {
            buckets,
            counts: buckets.iter().map(|_| AtomicU64::new(0)).collect(),
            sum_micros: AtomicU64::new(0),
            count: AtomicU64::new(0),
        }
    }
    fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        if let Some(i) = self.buckets.iter().position(|b| secs <= *b) {
            self.counts[i].fetch_add(1, Relaxed);
        }
        self.sum_micros.fetch_add(d.as_micros() as u64, Relaxed);
        self.count.fetch_add(1, Relaxed);
    }
    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let mut cumulative = 0;
        for (b, c) in self.buckets.iter().zip(&self.counts) {
            cumulative += c.load(Relaxed);
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{b}\"}} {cumulative}");
        }
        let count = self.count.load(Relaxed);
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {count}");
        let _ = writeln!(
            out,
            "{name}_sum{{{labels}}} {}",
            self.sum_micros.load(Relaxed) as f64 / 1e6
        );
        let _ = writeln!(out, "{name}_count{{{labels}}} {count}");
    }
}

/// Why a watch stream ended and was opened again (the `reason` of
/// `immortal_watch_restarts_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Restart {
    /// The server ended it cleanly (its `timeoutSeconds`).
    Closed,
    /// Our resourceVersion was too old (410): a relist follows.
    Expired,
    /// Nothing was heard for the idle limit: the connection was given up as dead.
    Stalled,
    /// A read error, an ERROR event, or data that did not decode.
    Error,
}

impl Restart {
    const ALL: [Restart; 4] = [
        Restart::Closed,
        Restart::Expired,
        Restart::Stalled,
        Restart::Error,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Restart::Closed => "closed",
            Restart::Expired => "expired",
            Restart::Stalled => "stalled",
            Restart::Error => "error",
        }
    }
}

/// Per-watched-resource counters.
#[derive(Default)]
struct WatchStats {
    /// By [`Restart`], in the order of `Restart::ALL`.
    restarts: [AtomicU64; 4],
    relists: AtomicU64,
    /// Unix time in ms of the last event or bookmark; 0 = never.
    last_heard_ms: AtomicU64,
    /// Unix time in ms since when no watch stream has been open; 0 while one is.
    down_since_ms: AtomicU64,
}

struct Registry {
    started: Instant,
    reconcile_results: Mutex<BTreeMap<&'static str, u64>>,
    reconcile_errors: AtomicU64,
    reconcile_time: Histogram,
    queue_depth: AtomicI64,
    queue_adds: AtomicU64,
    queue_retries: AtomicU64,
    queue_wait: Histogram,
    queue_work: Histogram,
    requests: Mutex<BTreeMap<(&'static str, u16), u64>>,
    leader: AtomicI64,
    watches: Mutex<BTreeMap<&'static str, &'static WatchStats>>,
    pods: Mutex<BTreeMap<&'static str, u64>>,
    events_dropped: AtomicU64,
}

fn registry() -> &'static Registry {
    static R: std::sync::OnceLock<Registry> = std::sync::OnceLock::new();
    R.get_or_init(|| Registry {
        started: Instant::now(),
        reconcile_results: Mutex::default(),
        reconcile_errors: AtomicU64::new(0),
        reconcile_time: Histogram::new(RECONCILE_BUCKETS),
        queue_depth: AtomicI64::new(0),
        queue_adds: AtomicU64::new(0),
        queue_retries: AtomicU64::new(0),
        queue_wait: Histogram::new(QUEUE_BUCKETS),
        queue_work: Histogram::new(QUEUE_BUCKETS),
        requests: Mutex::default(),
        leader: AtomicI64::new(0),
        watches: Mutex::default(),
        pods: Mutex::default(),
        events_dropped: AtomicU64::new(0),
    })
}

fn bump<K: Ord>(m: &Mutex<BTreeMap<K, u64>>, k: K) {
    *m.lock()
        .unwrap_or_else(|p| p.into_inner())
        .entry(k)
        .or_insert(0) += 1;
}

/// One API request answered with `code` (0: no answer): the API client's
/// [`RequestHook`](crate::kube::client::RequestHook).
pub fn record_request(method: &'static str, code: u16) {
    bump(&registry().requests, (method, code));
}

/// One reconcile finished with `result` ("success", "error", "requeue", "requeue_after").
pub fn record_reconcile(result: &'static str, took: Duration) {
    let r = registry();
    bump(&r.reconcile_results, result);
    if result == "error" {
        r.reconcile_errors.fetch_add(1, Relaxed);
    }
    r.reconcile_time.observe(took);
    r.queue_work.observe(took);
}

/// A pod was created; `cause` is "new", "deleted", "terminated" or "image_changed".
pub fn record_pod_created(cause: &'static str) {
    bump(&registry().pods, cause);
}

/// Events dropped so far because the Event writer fell behind: the recorder's
/// [`DropHook`](crate::kube::events::DropHook).
pub fn events_dropped(total: u64) {
    registry().events_dropped.store(total, Relaxed);
}

pub fn queue_add() {
    registry().queue_adds.fetch_add(1, Relaxed);
}
pub fn queue_depth(n: usize) {
    registry().queue_depth.store(n as i64, Relaxed);
}
pub fn queue_retry() {
    registry().queue_retries.fetch_add(1, Relaxed);
}
pub fn queue_wait(d: Duration) {
    registry().queue_wait.observe(d);
}
pub fn set_leader(is_leader: bool) {
    registry().leader.store(is_leader as i64, Relaxed);
}

fn watch_stats(resource: &'static str) -> &'static WatchStats {
    let mut w = registry().watches.lock().unwrap_or_else(|p| p.into_inner());
    // One leaked allocation per watched resource (two in all), so lock-free updates afterwards.
    w.entry(resource)
        .or_insert_with(|| Box::leak(Box::default()))
}

pub fn watch_restarted(resource: &'static str, why: Restart) {
    let i = Restart::ALL.iter().position(|r| *r == why).unwrap_or(0);
    watch_stats(resource).restarts[i].fetch_add(1, Relaxed);
}
/// A watch stream of this resource was opened: it is live while it keeps hearing from the
/// server.
pub fn watch_opened(resource: &'static str) {
    let s = watch_stats(resource);
    s.down_since_ms.store(0, Relaxed);
    s.last_heard_ms.store(unix_ms(), Relaxed);
}
/// This resource's watch stream ended, or could not be opened: it is down from now, unless it
/// already was.
pub fn watch_closed(resource: &'static str) {
    let _ = watch_stats(resource)
        .down_since_ms
        .compare_exchange(0, unix_ms(), Relaxed, Relaxed);
}
/// How long this resource's watch has not been live, `None` while it is. Live means: a stream
/// is open and the server was heard within `idle`; so a stream that fell silent stopped
/// being live `idle` after it was last heard, and a closed one when it closed, whichever came
/// first.
pub fn watch_down_for(resource: &'static str, idle: Duration) -> Option<Duration> {
    let s = watch_stats(resource);
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
pub fn watch_relisted(resource: &'static str) {
    watch_stats(resource).relists.fetch_add(1, Relaxed);
}
/// The server said something on this resource's watch (an event or a bookmark) or a list
/// completed: the connection is alive.
pub fn watch_heard(resource: &'static str) {
    watch_stats(resource)
        .last_heard_ms
        .store(unix_ms(), Relaxed);
}
/// Seconds since the server last spoke on this resource's watch; `None` if it never did.
pub fn watch_silence(resource: &'static str) -> Option<Duration> {
    let last = watch_stats(resource).last_heard_ms.load(Relaxed);
    (last != 0).then(|| Duration::from_millis(unix_ms().saturating_sub(last)))
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The whole registry in Prometheus text exposition format 0.0.4.
pub fn render(host: &str) -> String {
    let r = registry();
    let c = CONTROLLER;
    let mut out = String::with_capacity(8 * 1024);
    let ctl = format!("controller=\"{c}\"");
    let name = format!("name=\"{c}\"");

    out.push_str("# HELP controller_runtime_reconcile_total Total number of reconciliations per controller\n");
    out.push_str("# TYPE controller_runtime_reconcile_total counter\n");
    let results = r
        .reconcile_results
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    for res in ["error", "requeue", "requeue_after", "success"] {
        let n = results.get(res).copied().unwrap_or(0);
        let _ = writeln!(
            out,
            "controller_runtime_reconcile_total{{{ctl},result=\"{res}\"}} {n}"
        );
    }
    out.push_str("# HELP controller_runtime_reconcile_errors_total Total number of reconciliation errors per controller\n");
    out.push_str("# TYPE controller_runtime_reconcile_errors_total counter\n");
    let _ = writeln!(
        out,
        "controller_runtime_reconcile_errors_total{{{ctl}}} {}",
        r.reconcile_errors.load(Relaxed)
    );
    out.push_str("# HELP controller_runtime_reconcile_time_seconds Length of time per reconciliation per controller\n");
    out.push_str("# TYPE controller_runtime_reconcile_time_seconds histogram\n");
    r.reconcile_time
        .render(&mut out, "controller_runtime_reconcile_time_seconds", &ctl);

    out.push_str(
        "# HELP workqueue_depth Current depth of workqueue\n# TYPE workqueue_depth gauge\n",
    );
    let _ = writeln!(
        out,
        "workqueue_depth{{{name}}} {}",
        r.queue_depth.load(Relaxed)
    );
    out.push_str("# HELP workqueue_adds_total Total number of adds handled by workqueue\n# TYPE workqueue_adds_total counter\n");
    let _ = writeln!(
        out,
        "workqueue_adds_total{{{name}}} {}",
        r.queue_adds.load(Relaxed)
    );
    out.push_str("# HELP workqueue_retries_total Total number of retries handled by workqueue\n# TYPE workqueue_retries_total counter\n");
    let _ = writeln!(
        out,
        "workqueue_retries_total{{{name}}} {}",
        r.queue_retries.load(Relaxed)
    );
    out.push_str("# HELP workqueue_queue_duration_seconds How long in seconds an item stays in workqueue before being requested\n");
    out.push_str("# TYPE workqueue_queue_duration_seconds histogram\n");
    r.queue_wait
        .render(&mut out, "workqueue_queue_duration_seconds", &name);
    out.push_str("# HELP workqueue_work_duration_seconds How long in seconds processing an item from workqueue takes\n");
    out.push_str("# TYPE workqueue_work_duration_seconds histogram\n");
    r.queue_work
        .render(&mut out, "workqueue_work_duration_seconds", &name);

    out.push_str("# HELP rest_client_requests_total Number of HTTP requests, partitioned by status code, method, and host\n");
    out.push_str("# TYPE rest_client_requests_total counter\n");
    for ((method, code), n) in r.requests.lock().unwrap_or_else(|p| p.into_inner()).iter() {
        let code = if *code == 0 {
            "<error>".to_string()
        } else {
            code.to_string()
        };
        let _ = writeln!(
            out,
            "rest_client_requests_total{{code=\"{code}\",host=\"{host}\",method=\"{method}\"}} {n}"
        );
    }

    out.push_str("# HELP leader_election_master_status Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, 1 indicates master\n");
    out.push_str("# TYPE leader_election_master_status gauge\n");
    let _ = writeln!(
        out,
        "leader_election_master_status{{name=\"immortal-operator\"}} {}",
        r.leader.load(Relaxed)
    );

    out.push_str("# HELP immortal_watch_restarts_total Watch streams re-opened, per resource and why the last one ended\n# TYPE immortal_watch_restarts_total counter\n");
    let watches = r.watches.lock().unwrap_or_else(|p| p.into_inner()).clone();
    for (res, s) in &watches {
        for (why, n) in Restart::ALL.iter().zip(&s.restarts) {
            let _ = writeln!(
                out,
                "immortal_watch_restarts_total{{resource=\"{res}\",reason=\"{}\"}} {}",
                why.as_str(),
                n.load(Relaxed)
            );
        }
    }
    out.push_str("# HELP immortal_watch_relists_total Full relists, per resource\n# TYPE immortal_watch_relists_total counter\n");
    for (res, s) in &watches {
        let _ = writeln!(
            out,
            "immortal_watch_relists_total{{resource=\"{res}\"}} {}",
            s.relists.load(Relaxed)
        );
    }
    out.push_str("# HELP immortal_watch_last_event_age_seconds Seconds since the last watch event or bookmark, per resource\n");
    out.push_str("# TYPE immortal_watch_last_event_age_seconds gauge\n");
    for res in watches.keys() {
        let age = watch_silence(res)
            .unwrap_or_else(|| r.started.elapsed())
            .as_secs_f64();
        let _ = writeln!(
            out,
            "immortal_watch_last_event_age_seconds{{resource=\"{res}\"}} {age:.3}"
        );
    }
    let _ = writeln!(
        out,
        "# HELP immortal_events_dropped_total Events not written because the Event writer was {} behind (best effort, as client-go)\n\
         # TYPE immortal_events_dropped_total counter\n\
         immortal_events_dropped_total {}",
        crate::kube::events::BACKLOG,
        r.events_dropped.load(Relaxed)
    );
    out.push_str("# HELP immortal_pods_created_total Pods created, by cause\n# TYPE immortal_pods_created_total counter\n");
    for (cause, n) in r.pods.lock().unwrap_or_else(|p| p.into_inner()).iter() {
        let _ = writeln!(out, "immortal_pods_created_total{{cause=\"{cause}\"}} {n}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_controller_runtime_names_and_labels() {
        record_request("GET", 200);
        record_reconcile("success", Duration::from_millis(3));
        watch_heard("pod");
        watch_restarted("pod", Restart::Stalled);
        let text = render("127.0.0.1:6443");
        assert!(
            text.contains("immortal_watch_restarts_total{resource=\"pod\",reason=\"stalled\"} 1\n")
        );
        assert!(
            text.contains("immortal_watch_restarts_total{resource=\"pod\",reason=\"closed\"} 0\n")
        );
        assert!(text.contains("controller_runtime_reconcile_total{controller=\"immortalcontainer\",result=\"success\"}"));
        assert!(text.contains(
            "rest_client_requests_total{code=\"200\",host=\"127.0.0.1:6443\",method=\"GET\"}"
        ));
        assert!(text.contains("controller_runtime_reconcile_time_seconds_bucket{controller=\"immortalcontainer\",le=\"0.005\"}"));
        assert!(text.contains("workqueue_depth{name=\"immortalcontainer\"}"));
        assert!(text.contains("immortal_watch_last_event_age_seconds{resource=\"pod\"}"));
    }

    #[test]
    fn a_watch_is_live_while_open_and_heard_within_the_idle_limit() {
        let r = "liveness-test-resource";
        let idle = Duration::from_millis(200);
        let opened = Instant::now();
        watch_opened(r);
        assert_eq!(watch_down_for(r, idle), None);
        std::thread::sleep(Duration::from_millis(300));
        // Open but silent for longer than the limit: down since the limit ran out.
        let d = watch_down_for(r, idle).expect("silent");
        let silent = opened.elapsed();
        assert!(
            d >= Duration::from_millis(90) && d + idle <= silent + Duration::from_millis(5),
            "{d:?} down after {silent:?} of silence"
        );
        watch_heard(r);
        assert_eq!(watch_down_for(r, idle), None);
        // Closed: down at once, and a later close does not move the moment.
        watch_closed(r);
        std::thread::sleep(Duration::from_millis(50));
        watch_closed(r);
        let d = watch_down_for(r, idle).expect("closed");
        assert!(d >= Duration::from_millis(40), "{d:?}");
        watch_opened(r);
        assert_eq!(watch_down_for(r, idle), None);
    }

    #[test]
    fn histogram_buckets_are_cumulative() {
        let h = Histogram::new(&[0.1, 1.0]);
        h.observe(Duration::from_millis(50));
        h.observe(Duration::from_millis(500));
        h.observe(Duration::from_secs(5));
        let mut out = String::new();
        h.render(&mut out, "x", "a=\"b\"");
        assert!(out.contains("x_bucket{a=\"b\",le=\"0.1\"} 1\n"));
        assert!(out.contains("x_bucket{a=\"b\",le=\"1\"} 2\n"));
        assert!(out.contains("x_bucket{a=\"b\",le=\"+Inf\"} 3\n"));
        assert!(out.contains("x_count{a=\"b\"} 3\n"));
    }
}
