//! Process-wide counters, named as controller-runtime names them so that existing dashboards
//! work unchanged, exported in Prometheus text format by `prometheus-client`.

use crate::runtime::liveness::{self, Watch};
use prometheus_client::encoding::{prometheus_text, DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

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

/// The reconcile results controller-runtime counts, exported from zero.
const RESULTS: [&str; 4] = ["error", "requeue", "requeue_after", "success"];

/// Why a watch stream ended (`immortal_watch_restarts_total`'s `reason`, [`REASONS`]).
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

const REASONS: [&str; 4] = ["closed", "expired", "stalled", "error"];

type Labels<const N: usize> = [(&'static str, &'static str); N];
/// A watch's labels: `resource`, and `watch_namespace` when it watches one namespace (a
/// `namespace` label would clash with the one Prometheus gives every scraped series).
type WatchLabels = Vec<(&'static str, &'static str)>;

struct Metrics {
    started: Instant,
    reconcile_results: Family<Labels<2>, Counter>,
    reconcile_errors: Counter,
    reconcile_time: Histogram,
    queue_depth: Gauge,
    queue_adds: Counter,
    queue_retries: Counter,
    queue_wait: Histogram,
    queue_work: Histogram,
    /// By method and code: the host label is only known when rendering.
    requests: Mutex<BTreeMap<(&'static str, u16), u64>>,
    leader: Gauge,
    watch_restarts: Family<WatchLabels, Counter>,
    watch_relists: Family<WatchLabels, Counter>,
    pods_created: Family<Labels<1>, Counter>,
    /// The Event recorder's own running total.
    events_dropped: AtomicU64,
}

fn metrics() -> &'static Metrics {
    static M: OnceLock<Metrics> = OnceLock::new();
    M.get_or_init(|| {
        let m = Metrics {
            started: Instant::now(),
            reconcile_results: Family::default(),
            reconcile_errors: Counter::default(),
            reconcile_time: Histogram::new(RECONCILE_BUCKETS.iter().copied()),
            queue_depth: Gauge::default(),
            queue_adds: Counter::default(),
            queue_retries: Counter::default(),
            queue_wait: Histogram::new(QUEUE_BUCKETS.iter().copied()),
            queue_work: Histogram::new(QUEUE_BUCKETS.iter().copied()),
            requests: Mutex::default(),
            leader: Gauge::default(),
            watch_restarts: Family::default(),
            watch_relists: Family::default(),
            pods_created: Family::default(),
            events_dropped: AtomicU64::new(0),
        };
        for result in RESULTS {
            let _ = m
                .reconcile_results
                .get_or_create(&[("controller", CONTROLLER), ("result", result)]);
        }
        m
    })
}

/// One API request answered with `code` (0: no answer): the API client's `RequestHook`.
pub fn record_request(method: &'static str, code: u16) {
    let mut requests = metrics().requests.lock().unwrap_or_else(|p| p.into_inner());
    *requests.entry((method, code)).or_insert(0) += 1;
}

/// One reconcile finished with `result` ("success", "error", "requeue", "requeue_after").
pub fn record_reconcile(result: &'static str, took: Duration) {
    let m = metrics();
    m.reconcile_results
        .get_or_create(&[("controller", CONTROLLER), ("result", result)])
        .inc();
    if result == "error" {
        m.reconcile_errors.inc();
    }
    m.reconcile_time.observe(took.as_secs_f64());
    m.queue_work.observe(took.as_secs_f64());
}

/// A pod was created; `cause` is "new", "deleted", "terminated" or "spec_changed".
pub fn record_pod_created(cause: &'static str) {
    metrics()
        .pods_created
        .get_or_create(&[("cause", cause)])
        .inc();
}

/// Events dropped so far because the Event writer fell behind: the recorder's `DropHook`.
pub fn events_dropped(total: u64) {
    metrics().events_dropped.store(total, Relaxed);
}

pub fn queue_add() {
    metrics().queue_adds.inc();
}
pub fn queue_depth(n: usize) {
    metrics().queue_depth.set(n as i64);
}
pub fn queue_retry() {
    metrics().queue_retries.inc();
}
pub fn queue_wait(d: Duration) {
    metrics().queue_wait.observe(d.as_secs_f64());
}
pub fn set_leader(is_leader: bool) {
    metrics().leader.set(is_leader as i64);
}

pub fn watch_restarted(watch: &Watch, why: Restart) {
    let mut labels = watch_labels(watch);
    labels.push(("reason", REASONS[why as usize]));
    metrics().watch_restarts.get_or_create(&labels).inc();
}
pub fn watch_relisted(watch: &Watch) {
    metrics()
        .watch_relists
        .get_or_create(&watch_labels(watch))
        .inc();
}

fn watch_labels(watch: &Watch) -> WatchLabels {
    let mut labels = vec![("resource", watch.resource)];
    if let Some(ns) = watch.namespace {
        labels.push(("watch_namespace", ns));
    }
    labels
}

/// The whole registry in Prometheus text format; `host` is the API server's.
pub fn render(host: &str) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Scrape(host.to_string())));
    let mut out = String::with_capacity(8 * 1024);
    // Writing to a String cannot fail.
    let _ = prometheus_text::encode(&mut out, &registry);
    out
}

/// One scrape, for the API server at `.0`: every family, its HELP and TYPE even before it has a
/// sample (prometheus-client's registry leaves out empty families).
#[derive(Debug)]
struct Scrape(String);

impl prometheus_client::collector::Collector for Scrape {
    fn encode(&self, mut e: DescriptorEncoder) -> fmt::Result {
        let m = metrics();
        let ctl = [("controller", CONTROLLER)];
        let queue = [("name", CONTROLLER)];
        write_family(
            &mut e,
            "controller_runtime_reconcile",
            "Total number of reconciliations per controller",
            &[],
            &m.reconcile_results,
        )?;
        write_family(
            &mut e,
            "controller_runtime_reconcile_errors",
            "Total number of reconciliation errors per controller",
            &ctl,
            &m.reconcile_errors,
        )?;
        write_family(
            &mut e,
            "controller_runtime_reconcile_time_seconds",
            "Length of time per reconciliation per controller",
            &ctl,
            &m.reconcile_time,
        )?;
        let queue_families: [(&str, &str, &dyn EncodeMetric); 5] = [
            (
                "workqueue_depth",
                "Current depth of workqueue",
                &m.queue_depth,
            ),
            (
                "workqueue_adds",
                "Total number of adds handled by workqueue",
                &m.queue_adds,
            ),
            (
                "workqueue_retries",
                "Total number of retries handled by workqueue",
                &m.queue_retries,
            ),
            (
                "workqueue_queue_duration_seconds",
                "How long in seconds an item stays in workqueue before being requested",
                &m.queue_wait,
            ),
            (
                "workqueue_work_duration_seconds",
                "How long in seconds processing an item from workqueue takes",
                &m.queue_work,
            ),
        ];
        for (name, help, metric) in queue_families {
            write_family(&mut e, name, help, &queue, metric)?;
        }

        let requests = m.requests.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let mut r = e.encode_descriptor(
            "rest_client_requests",
            "Number of HTTP requests, partitioned by status code, method, and host",
            None,
            MetricType::Counter,
        )?;
        for ((method, code), n) in requests {
            let code = match code {
                0 => "<error>".to_string(),
                c => c.to_string(),
            };
            let labels = [
                ("code", code.as_str()),
                ("host", &self.0),
                ("method", method),
            ];
            ConstCounter::new(n).encode(r.encode_family(&labels)?)?;
        }
        write_family(&mut e, "leader_election_master_status", "Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, 1 indicates master", &[("name", "immortal-operator")], &m.leader)?;

        // Every watch shows every restart reason, from zero.
        let watches = liveness::watches();
        for w in &watches {
            for reason in REASONS {
                let mut labels = watch_labels(w);
                labels.push(("reason", reason));
                let _ = m.watch_restarts.get_or_create(&labels);
            }
            let _ = m.watch_relists.get_or_create(&watch_labels(w));
        }
        write_family(
            &mut e,
            "immortal_watch_restarts",
            "Watch streams re-opened, per watch and why the last one ended",
            &[],
            &m.watch_restarts,
        )?;
        write_family(
            &mut e,
            "immortal_watch_relists",
            "Full relists, per watch",
            &[],
            &m.watch_relists,
        )?;
        let mut ages = e.encode_descriptor(
            "immortal_watch_last_event_age_seconds",
            "Seconds since the last watch event or bookmark, per watch",
            None,
            MetricType::Gauge,
        )?;
        for w in watches {
            let age = w
                .silence()
                .unwrap_or_else(|| m.started.elapsed())
                .as_secs_f64();
            ConstGauge::new(age).encode(ages.encode_family(&watch_labels(w))?)?;
        }
        let help = format!(
            "Events not written because the Event writer was {} behind (best effort, as client-go)",
            crate::kube::events::BACKLOG
        );
        write_family(
            &mut e,
            "immortal_events_dropped",
            &help,
            &[],
            &ConstCounter::new(m.events_dropped.load(Relaxed)),
        )?;
        write_family(
            &mut e,
            "immortal_pods_created",
            "Pods created, by cause",
            &[],
            &m.pods_created,
        )
    }
}

/// A metric family: HELP, TYPE and its samples, each with the constant `labels` if any.
fn write_family(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    labels: &[(&str, &str)],
    metric: &dyn EncodeMetric,
) -> fmt::Result {
    let mut family = e.encode_descriptor(name, help, None, metric.metric_type())?;
    match labels {
        [] => metric.encode(family),
        _ => metric.encode(family.encode_family(&labels)?),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_controller_runtime_names_and_labels() {
        record_request("GET", 200);
        record_reconcile("success", Duration::from_millis(3));
        let pods = liveness::watch("pod", None);
        pods.heard();
        watch_restarted(pods, Restart::Stalled);
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
    fn a_watch_of_one_namespace_is_labelled_with_it() {
        let w = liveness::watch("metrics-test", Some("team-a"));
        w.heard();
        watch_relisted(w);
        let text = render("h");
        assert!(text.contains(
            "immortal_watch_relists_total{resource=\"metrics-test\",watch_namespace=\"team-a\"} 1\n"
        ));
        assert!(text.contains("immortal_watch_restarts_total{resource=\"metrics-test\",watch_namespace=\"team-a\",reason=\"closed\"} 0\n"));
        assert!(text.contains(
            "immortal_watch_last_event_age_seconds{resource=\"metrics-test\",watch_namespace=\"team-a\"}"
        ));
    }
}
