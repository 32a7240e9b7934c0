//! The results of a run: what was measured, the targets next to it, the machine it ran on, and
//! the plain-text table `make bench` prints.

use crate::operator::Usage;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::time::Duration;

/// Where the run happened.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    pub cpu_model: String,
    pub cores: usize,
    pub kernel: String,
    /// When the run started (RFC 3339, UTC).
    pub date: String,
}

impl Machine {
    /// Reads /proc/cpuinfo and /proc/sys/kernel/osrelease; unknown fields say "unknown".
    pub fn read() -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
            .unwrap_or_else(|| "unknown".into());
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|k| format!("Linux {}", k.trim()))
            .unwrap_or_else(|_| "unknown".into());
        Machine {
            cpu_model,
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            kernel,
            date: immortal_operator::util::now_rfc3339(),
        }
    }
}

/// The bare client's time for N pod creates and N status merge patches.
#[derive(Debug, Clone, Serialize)]
pub struct Floor {
    pub connections: usize,
    /// The N pod creates alone, timed before any patch is sent: the pods-only floor, what the
    /// time until every pod exists is held to.
    pub pod_creates_seconds: f64,
    pub status_patches_seconds: f64,
    /// Both together: what the operator's time is divided by.
    pub seconds: f64,
    pub requests_per_second: f64,
}

/// The operator's requests in one phase.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Requests {
    /// Pods the operator created in the phase.
    pub pods_created: u64,
    pub total: u64,
    /// Requests an operator makes once per start, whatever the number of objects: API
    /// discovery, the initial lists and the watches (test server counts only; a real cluster's
    /// /metrics counts them as GETs with the rest).
    pub startup: u64,
    /// `(total - startup) / pods_created`.
    pub per_pod_created: f64,
    /// Writes (POST, PUT, PATCH, DELETE) over `pods_created`: what a pod costs a control plane
    /// whose commits and watchers decide its throughput.
    pub writes_per_pod_created: f64,
    /// The same without Events (`create events`): the writes on the reconcile's path, as the
    /// Event thread writes Events off it, best effort. The same as `writes_per_pod_created`
    /// where the counts are by HTTP method (a real cluster), which cannot tell them apart.
    pub writes_per_pod_created_without_events: f64,
    /// The writes by `"verb resource"` (`create pods`, `patch immortalcontainers/status`...),
    /// or by HTTP method from the operator's /metrics.
    pub writes_by_kind: BTreeMap<String, u64>,
    /// By `"verb resource"` (test server's counts) or by HTTP method (the operator's
    /// /metrics, on a real cluster).
    pub by_verb: BTreeMap<String, u64>,
    /// Where `by_verb` comes from: "test server" or "operator metrics".
    pub source: String,
    /// The operator's own count (/metrics), to cross-check the server's.
    pub metrics_total: Option<u64>,
    /// Of its requests, those answered 409 (a precondition that did not hold, a name taken).
    pub conflicts: u64,
}

/// Backlog or bulk: N objects to converge.
#[derive(Debug, Clone, Serialize)]
pub struct Convergence {
    /// Until every object had its pod and a status naming it: the later of the two below.
    pub seconds: f64,
    /// Until every object's pod existed: the bench's pod watch saw the last ADDED, or every
    /// status named its pod, if that was seen first.
    pub pods_seconds: f64,
    /// Until every object's status named its pod (`currentPod` set, `startTimes` counted).
    pub status_seconds: f64,
    /// Both over the floor they are held to; `None` until the phase's floor is known.
    pub over_floor: Option<OverFloor>,
    /// `seconds` over the floor at 1 connection.
    pub ratio_to_floor_1: f64,
    /// Over the floor at `--workers` connections, when there is more than one worker.
    pub ratio_to_floor_workers: Option<f64>,
    /// Operator CPU for the phase (backlog: from its start, start-up included).
    pub cpu_seconds: f64,
    pub cpu_seconds_per_1000_objects: f64,
    /// Objects whose status said Ready when the requests were counted: the requests include
    /// each one's Ready write only for these (a real node may hold fewer pods than objects).
    pub ready: usize,
    /// From the phase's start until every object said Ready; `None` when some never did
    /// within [`crate::READY_MAX`] or went quiet first.
    pub ready_seconds: Option<f64>,
    pub requests: Requests,
    /// Writes without Events from the phase's start until it converged, over the objects: the
    /// writes its convergence waited for, the rest (releases, Ready writes, Events) coming
    /// after. Counted when the bench saw convergence, so a few later writes may be in it. Test
    /// server only (a real cluster's /metrics cannot tell Events apart).
    pub writes_per_pod_until_converged: Option<f64>,
    /// Passed the correctness check (counts, pods, owners).
    pub correct: bool,
    /// Requests in flight at the test server from the operator's start to convergence (the
    /// backlog's: the operator's requests and the bench's watch re-opens only).
    pub in_flight: Option<InFlight>,
}

/// A phase's pods and status times over one floor: the pods over its creates alone (the
/// pods-only floor), the status over the whole of it (creates and status patches).
#[derive(Debug, Clone, Serialize)]
pub struct OverFloor {
    /// That floor's connections: `--workers`, or the kube-rs-style floor's in the modeled phase.
    pub connections: usize,
    pub pods_only_floor_seconds: f64,
    /// `pods_seconds` over `pods_only_floor_seconds`.
    pub pods_ratio: f64,
    pub floor_seconds: f64,
    /// `status_seconds` over `floor_seconds`.
    pub status_ratio: f64,
}

impl OverFloor {
    pub fn of(c: &Convergence, f: &Floor) -> OverFloor {
        OverFloor {
            connections: f.connections,
            pods_only_floor_seconds: f.pod_creates_seconds,
            pods_ratio: c.pods_seconds / f.pod_creates_seconds,
            floor_seconds: f.seconds,
            status_ratio: c.status_seconds / f.seconds,
        }
    }
}

/// Requests in flight at the test server over a phase.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct InFlight {
    pub peak: usize,
    /// Time-weighted mean.
    pub mean: f64,
}

impl From<kube_testserver::InFlight> for InFlight {
    fn from(f: kube_testserver::InFlight) -> InFlight {
        InFlight {
            peak: f.peak,
            mean: f.mean,
        }
    }
}

/// The writes among requests counted by `"verb resource"` or by HTTP method.
pub fn writes_by_kind(by_verb: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    const WRITES: [&str; 9] = [
        "create",
        "update",
        "patch",
        "delete",
        "deletecollection",
        "POST",
        "PUT",
        "PATCH",
        "DELETE",
    ];
    by_verb
        .iter()
        .filter(|(k, _)| WRITES.contains(&k.split(' ').next().unwrap_or("")))
        .map(|(k, n)| (k.clone(), *n))
        .collect()
}

/// Whether a write of `writes_by_kind` is an Event's (`create events`, `patch events`).
pub fn is_event_write(kind: &str) -> bool {
    kind.split(' ').nth(1) == Some("events")
}

/// The writes of `writes_by_kind` that are not Events'.
pub fn writes_without_events(writes_by_kind: &BTreeMap<String, u64>) -> u64 {
    writes_by_kind
        .iter()
        .filter(|(k, _)| !is_event_write(k))
        .map(|(_, n)| n)
        .sum()
}

/// The modeled phase: the same work against the test server modeling a real control plane
/// ([`crate::MODEL`]), where the kube-rs-style floor is what a design is held to.
#[derive(Debug, Clone, Serialize)]
pub struct Modeled {
    pub objects: usize,
    pub model: ModelSettings,
    /// N pod creates and N status patches at [`crate::KUBE_RS_IN_FLIGHT`] connections: the
    /// kube-rs peer's 2 writes per pod with hundreds in flight.
    pub kube_rs_floor: Floor,
    /// The same at `--workers` connections: the operator's concurrency.
    pub floor_workers: Floor,
    pub backlog: Convergence,
    /// The backlog's seconds over the kube-rs-style floor's (the real cluster: 2.4 at 16
    /// workers, 1.7 at 64).
    pub ratio_to_kube_rs: f64,
    /// Over the floor at `--workers` connections: what the design costs at the same
    /// concurrency.
    pub ratio_to_floor_workers: f64,
}

/// [`kube_testserver::CostModel`] in milliseconds, for the JSON.
#[derive(Debug, Clone, Serialize)]
pub struct ModelSettings {
    pub cores: usize,
    pub read_ms: f64,
    pub write_ms: f64,
    pub per_watcher_ms: f64,
    pub pod_watchers: usize,
    pub commit_ms: f64,
    /// The modeled phase's kubelet: from a pod's first status to its container running.
    pub container_start_ms: f64,
}

impl ModelSettings {
    pub fn of(m: &kube_testserver::CostModel, start_delay: Duration) -> ModelSettings {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        ModelSettings {
            cores: m.cores,
            read_ms: ms(m.read),
            write_ms: ms(m.write),
            per_watcher_ms: ms(m.per_watcher),
            pod_watchers: m.pod_watchers,
            commit_ms: ms(m.commit),
            container_start_ms: ms(start_delay),
        }
    }
}

/// Recovery latencies: from the API's answer to the ADDED event of the replacement pod.
#[derive(Debug, Clone, Serialize)]
pub struct Latency {
    pub samples_ms: Vec<f64>,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

impl Latency {
    pub fn from_samples(samples: &[Duration]) -> Latency {
        let mut ms: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1e3).collect();
        let samples_ms = ms.clone();
        ms.sort_by(f64::total_cmp);
        Latency {
            samples_ms,
            p50_ms: percentile(&ms, 50.0),
            p90_ms: percentile(&ms, 90.0),
            p99_ms: percentile(&ms, 99.0),
            max_ms: ms.last().copied().unwrap_or(0.0),
        }
    }
}

/// Nearest-rank percentile of sorted values (0 for none).
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The herd phase: a burst of errors while every object is queued.
#[derive(Debug, Clone, Serialize)]
pub struct Herd {
    pub objects: usize,
    /// What every request of the phase's namespace was answered during the burst.
    pub status: u16,
    pub burst_seconds: f64,
    /// The operator's requests in each second of the burst (the last may be shorter).
    pub per_second: Vec<u64>,
    pub max_per_second: u64,
    pub mean_per_second: f64,
    /// The operator's requests during the burst, by verb (the test server's counts).
    pub requests: Requests,
    /// From the end of the burst until every object had its pod and its status.
    pub converged_after_seconds: f64,
    /// Passed the correctness check.
    pub correct: bool,
}

/// Restart after a drain: N objects converged under one operator; it is stopped, K of their
/// pods are force-deleted while it is down, and a fresh one starts. Every time is from the
/// fresh operator's start.
#[derive(Debug, Clone, Serialize)]
pub struct Drain {
    pub objects: usize,
    /// Pods force-deleted (grace 0) while no operator ran.
    pub pods_deleted: usize,
    /// Until its /readyz said both first lists were in (polled every 10 ms).
    pub lists_seconds: f64,
    /// Until the first of the K had a new pod (its ADDED event, as the bench's watch saw it).
    pub first_back_seconds: f64,
    /// Until every one of the K had a new pod.
    pub back_seconds: f64,
    /// Until every object's status named its current pod (`lastCountedPodUID` its uid) with
    /// the exact `startTimes` (the K counted twice).
    pub status_seconds: f64,
    /// Until, besides, the operator's queue was empty and its requests had stopped: to the
    /// poll of its /metrics (every 10 ms or so) that last saw keys queued or requests move.
    pub refreshed_seconds: f64,
    /// The fresh operator's requests until it was refreshed, start-up included.
    pub requests: Requests,
    /// Passed the correctness check.
    pub correct: bool,
}

/// One of the operator processes: the backlog's, or the one that ran idle, bulk and recovery.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Process {
    /// After its first lists, before any object existed (the bulk operator only).
    pub idle: Option<Usage>,
    /// At the end of its phases, just before SIGTERM.
    pub end: Usage,
    /// Its exit code after SIGTERM (0 expected).
    pub exit_code: Option<i32>,
}

/// A result next to its target.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub name: String,
    pub result: String,
    pub target: String,
    pub met: bool,
}

/// Everything a run measured.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub machine: Machine,
    pub against: String,
    pub operator: String,
    pub operator_binary_bytes: u64,
    pub objects: usize,
    pub connections: usize,
    pub recoveries: usize,
    pub workers: usize,
    pub floor: Vec<Floor>,
    pub backlog: Option<Convergence>,
    pub bulk: Option<Convergence>,
    pub recovery_deleted: Option<Latency>,
    /// The same deletions, from the old pod's DELETED event to the new pod's ADDED: the
    /// operator's own part.
    pub recovery_deleted_reaction: Option<Latency>,
    pub recovery_failed: Option<Latency>,
    pub recovery_requests: Option<Requests>,
    pub backlog_operator: Option<Process>,
    pub bulk_operator: Option<Process>,
    /// Recovery under load: `None` when skipped (`--recovery 0`).
    pub load: Option<Load>,
    /// Test server only: the same design against a modeled real control plane; `None` when
    /// skipped (a real cluster, or `--model-objects 0`).
    pub modeled: Option<Modeled>,
    /// Restart after a drain: `None` when skipped (`--drain-objects 0`).
    pub drain: Option<Drain>,
    /// `None` when skipped (a real cluster, or `--burst-seconds 0`).
    pub herd: Option<Herd>,
    /// Targets, computed by [`Report::checks`] when the run ends.
    pub checks: Vec<Check>,
    /// Correctness failures: wrong counts, missing or extra pods, a bad exit. Any → exit 1.
    pub failures: Vec<String>,
    /// Where the operator logs were left: kept only when the run failed, else empty.
    pub logs: String,
}

/// Recovery under load: pods deleted one at a time while every object's pod is being made not
/// ready, so that the operator's queue fills with routine refreshes.
#[derive(Debug, Clone, Serialize)]
pub struct Load {
    /// Pods made not ready at once, each a routine refresh for the operator.
    pub flooded: usize,
    /// How long the bench took to send those changes.
    pub flood_seconds: f64,
    /// What sent them: a child process at a lower CPU priority, or the bench's own threads.
    pub flood_runs_in: String,
    /// Keys the operator's queue held when each deletion was made.
    pub queued_at_deletions: Vec<u64>,
    /// Deletions whose replacement came while the flood still went on: those measured under
    /// load.
    pub replaced_during_flood: usize,
    /// From a deletion's answer to its replacement's ADDED event: the kubelet's graceful
    /// termination included, which on the test server shares one thread with every other
    /// pod's kubelet work.
    pub latency: Latency,
    /// From the old pod's DELETED event to its replacement's ADDED event: the operator's own
    /// part, what its queue's priorities decide.
    pub reaction: Latency,
    /// From the start of the flood until the queue was empty again.
    pub drained_seconds: f64,
    pub requests: Requests,
}

const MIB: f64 = 1024.0;

/// Peak RSS budget: 8 MiB at 1,000 objects, 15 MiB at 10,000, 60 MiB at 100,000, straight
/// lines between (and flat outside).
pub fn peak_rss_target_mib(objects: usize) -> f64 {
    let n = objects.clamp(1000, 100_000) as f64;
    if n <= 10_000.0 {
        8.0 + (n - 1000.0) * (15.0 - 8.0) / 9000.0
    } else {
        15.0 + (n - 10_000.0) * (60.0 - 15.0) / 90_000.0
    }
}

/// Most requests the operator may send during a burst of errors of `seconds`: its queue lets
/// 100 failing reconciles through, then 10 a second (plus one per worker in flight), and each
/// costs at most the client's 4 attempts (a 503 or 429 is retried within the request).
pub fn herd_request_bound(seconds: f64, workers: usize) -> u64 {
    4 * (100 + (10.0 * seconds).ceil() as u64 + workers as u64)
}

fn check(name: &str, result: String, target: &str, met: bool) -> Check {
    Check {
        name: name.into(),
        result,
        target: target.into(),
        met,
    }
}

impl Report {
    /// The targets, each next to its result.
    pub fn checks(&self) -> Vec<Check> {
        let mut out = Vec::new();
        for (name, c) in [("backlog", &self.backlog), ("bulk", &self.bulk)] {
            let Some(c) = c else { continue };
            if name == "backlog" {
                // Against the floor at as many connections as the operator has workers.
                let r = c.ratio_to_floor_workers.unwrap_or(c.ratio_to_floor_1);
                out.push(check(
                    &format!("backlog / floor@{}", self.workers),
                    format!("{r:.2}x ({:.3} s)", c.seconds),
                    "<= 1.5x",
                    r <= 1.5,
                ));
            }
            out.push(check(
                &format!("{name} cpu / 1000 objects"),
                format!("{:.3} s", c.cpu_seconds_per_1000_objects),
                "<= 0.5 s",
                c.cpu_seconds_per_1000_objects <= 0.5,
            ));
            out.push(check(
                &format!("{name} requests / pod"),
                format!("{:.3}", c.requests.per_pod_created),
                "<= 5",
                c.requests.per_pod_created <= 5.0,
            ));
        }
        if let Some(r) = &self.recovery_requests {
            out.push(check(
                "recovery requests / pod",
                format!("{:.3}", r.per_pod_created),
                "<= 5",
                r.per_pod_created <= 5.0,
            ));
        }
        if let Some(l) = &self.load {
            out.push(check(
                "recovery under load p99",
                format!("{:.2} ms", l.reaction.p99_ms),
                "<= 20 ms",
                l.reaction.p99_ms <= 20.0,
            ));
        }
        for (name, l) in [
            ("recovery (deleted)", &self.recovery_deleted),
            ("recovery (failed)", &self.recovery_failed),
        ] {
            let Some(l) = l else { continue };
            out.push(check(
                &format!("{name} p50"),
                format!("{:.2} ms", l.p50_ms),
                "<= 3 ms",
                l.p50_ms <= 3.0,
            ));
            out.push(check(
                &format!("{name} max"),
                format!("{:.2} ms", l.max_ms),
                "<= 8 ms",
                l.max_ms <= 8.0,
            ));
        }
        if let Some(c) = &self.backlog {
            let w = c.requests.writes_per_pod_created_without_events;
            out.push(check(
                "backlog writes per created pod, Events aside",
                format!(
                    "{w:.2} ({:.2} with Events)",
                    c.requests.writes_per_pod_created
                ),
                "<= 3",
                w <= 3.0,
            ));
            if let Some(w) = c.writes_per_pod_until_converged {
                out.push(check(
                    "backlog writes until converged (critical path)",
                    format!("{w:.2}"),
                    "<= 3",
                    w <= 3.0,
                ));
            }
        }
        if let Some(m) = &self.modeled {
            out.push(check(
                "modeled backlog, x the kube-rs-style floor",
                format!("{:.2}x", m.ratio_to_kube_rs),
                "<= 1.0x",
                m.ratio_to_kube_rs <= 1.0,
            ));
            if let Some(o) = &m.backlog.over_floor {
                out.push(check(
                    &format!("modeled backlog pods / pods-only floor@{}", o.connections),
                    format!("{:.2}x ({:.3} s)", o.pods_ratio, m.backlog.pods_seconds),
                    "<= 1.2x",
                    o.pods_ratio <= 1.2,
                ));
                out.push(check(
                    "modeled backlog status / kube-rs-style floor",
                    format!("{:.2}x ({:.3} s)", o.status_ratio, m.backlog.status_seconds),
                    "<= 1.0x",
                    o.status_ratio <= 1.0,
                ));
            }
        }
        if let Some(d) = &self.drain {
            out.push(check(
                &format!(
                    "drain: {} of {} pods back after restart",
                    d.pods_deleted, d.objects
                ),
                format!("{:.3} s", d.back_seconds),
                "<= 3 s",
                d.back_seconds <= 3.0,
            ));
        }
        if let Some(h) = &self.herd {
            let most = herd_request_bound(h.burst_seconds, self.workers);
            out.push(check(
                &format!("herd requests in {:.0} s of {}s", h.burst_seconds, h.status),
                format!("{} ({:.1}/s)", h.requests.total, h.mean_per_second),
                &format!("<= {most}"),
                h.requests.total <= most,
            ));
        }
        if let Some(idle) = self.bulk_operator.as_ref().and_then(|p| p.idle) {
            let mib = idle.rss_kib as f64 / MIB;
            out.push(check(
                "idle rss",
                format!("{mib:.2} MiB"),
                "<= 3 MiB",
                mib <= 3.0,
            ));
        }
        let peak_target = peak_rss_target_mib(self.objects);
        for (name, p) in [
            ("peak rss (backlog)", &self.backlog_operator),
            ("peak rss (bulk+recovery)", &self.bulk_operator),
        ] {
            let Some(p) = p else { continue };
            let mib = p.end.peak_rss_kib as f64 / MIB;
            out.push(check(
                name,
                format!("{mib:.2} MiB"),
                &format!("<= {peak_target:.1} MiB"),
                mib <= peak_target,
            ));
        }
        let mb = self.operator_binary_bytes as f64 / 1e6;
        out.push(check(
            "binary size",
            format!("{mb:.2} MB"),
            "<= 6 MB",
            self.operator_binary_bytes <= 6_000_000,
        ));
        out
    }

    /// The plain-text table.
    pub fn table(&self) -> String {
        let mut t = String::new();
        let m = &self.machine;
        let _ = writeln!(
            t,
            "immortal-bench: {} objects, {} connections, {} recoveries, {} worker(s)",
            self.objects, self.connections, self.recoveries, self.workers
        );
        let _ = writeln!(t, "against:  {}", self.against);
        let _ = writeln!(
            t,
            "machine:  {} ({} cores), {}, {}",
            m.cpu_model, m.cores, m.kernel, m.date
        );
        let _ = writeln!(
            t,
            "operator: {} ({} bytes)",
            self.operator, self.operator_binary_bytes
        );
        let _ = writeln!(t);
        let _ = writeln!(
            t,
            "floor: bare client, {n} pod creates + {n} status merge patches; the creates alone \
             are the pods-only floor",
            n = self.objects
        );
        let _ = writeln!(
            t,
            "  {:>11}  {:>13}  {:>13}  {:>9}  {:>10}",
            "connections", "pods only (s)", "patches (s)", "total (s)", "requests/s"
        );
        for f in &self.floor {
            let _ = writeln!(
                t,
                "  {:>11}  {:>13.3}  {:>13.3}  {:>9.3}  {:>10.0}",
                f.connections,
                f.pod_creates_seconds,
                f.status_patches_seconds,
                f.seconds,
                f.requests_per_second
            );
        }
        let _ = writeln!(t);
        for (name, c) in [("backlog", &self.backlog), ("bulk", &self.bulk)] {
            let Some(c) = c else { continue };
            let _ = writeln!(
                t,
                "{name}: {:.3} s ({:.2}x floor@1{}), {}, operator cpu {:.3} s{}",
                c.seconds,
                c.ratio_to_floor_1,
                c.ratio_to_floor_workers
                    .map(|r| format!(", {r:.2}x floor@{}", self.workers))
                    .unwrap_or_default(),
                match c.ready_seconds {
                    Some(r) => format!("every object Ready after {r:.3} s"),
                    None => format!("{} of {} objects Ready", c.ready, self.objects),
                },
                c.cpu_seconds,
                if c.correct {
                    ""
                } else {
                    "  FAILED correctness check"
                }
            );
            let _ = writeln!(t, "  {}", milestones_line(c, "floor"));
            let _ = writeln!(t, "  requests: {}", requests_line(&c.requests));
            let _ = writeln!(t, "  {}", writes_line(c));
        }
        for (name, l) in [
            ("recovery (pod deleted)", &self.recovery_deleted),
            ("recovery (pod Failed) ", &self.recovery_failed),
        ] {
            let Some(l) = l else { continue };
            let _ = writeln!(
                t,
                "{name}: p50 {:.2} ms, p90 {:.2} ms, p99 {:.2} ms, max {:.2} ms ({} samples)",
                l.p50_ms,
                l.p90_ms,
                l.p99_ms,
                l.max_ms,
                l.samples_ms.len()
            );
        }
        if let Some(l) = &self.recovery_deleted_reaction {
            let _ = writeln!(
                t,
                "  operator's part (old pod's DELETED -> new pod's ADDED): p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
                l.p50_ms, l.p99_ms, l.max_ms
            );
        }
        if let Some(r) = &self.recovery_requests {
            let _ = writeln!(t, "  requests: {}", requests_line(r));
        }
        if let Some(l) = &self.load {
            let mut q = l.queued_at_deletions.clone();
            q.sort_unstable();
            let _ = writeln!(
                t,
                "recovery under load: {} pods made not ready in {:.3} s (by {}); queue at each deletion {}..{} keys (median {}); \
                 queue empty {:.3} s after the flood began\n  \
                 operator's part (old pod's DELETED -> new pod's ADDED): p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms ({} samples, {} while the flood lasted)\n  \
                 from the deletion's answer (the test server's kubelet ending the pod included): p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
                l.flooded,
                l.flood_seconds,
                l.flood_runs_in,
                q.first().copied().unwrap_or(0),
                q.last().copied().unwrap_or(0),
                q.get(q.len() / 2).copied().unwrap_or(0),
                l.drained_seconds,
                l.reaction.p50_ms,
                l.reaction.p99_ms,
                l.reaction.max_ms,
                l.reaction.samples_ms.len(),
                l.replaced_during_flood,
                l.latency.p50_ms,
                l.latency.p99_ms,
                l.latency.max_ms,
            );
            let r = &l.requests;
            let verbs: Vec<String> = r.by_verb.iter().map(|(k, n)| format!("{k} {n}")).collect();
            let _ = writeln!(
                t,
                "  requests: {} for {} pods made not ready and {} replaced ({}: {})",
                r.total - r.startup,
                l.flooded,
                r.pods_created,
                r.source,
                verbs.join(", ")
            );
        }
        for (name, p) in [
            ("backlog operator", &self.backlog_operator),
            ("bulk operator", &self.bulk_operator),
        ] {
            let Some(p) = p else { continue };
            let idle = p
                .idle
                .map(|u| format!("idle rss {:.2} MiB, ", u.rss_kib as f64 / MIB))
                .unwrap_or_default();
            let _ = writeln!(
                t,
                "{name}: {idle}peak rss {:.2} MiB, cpu {:.3} s, exit code {}",
                p.end.peak_rss_kib as f64 / MIB,
                p.end.cpu_seconds,
                p.exit_code
                    .map_or_else(|| "none (signal)".to_string(), |c| c.to_string())
            );
        }
        if let Some(m) = &self.modeled {
            let s = &m.model;
            let _ = writeln!(
                t,
                "modeled control plane ({} cores; per request {} ms read, {} ms write, {} ms a watcher of its event, \
                 {} more pod watchers; {} ms commits shared by the writes waiting; containers start in {} ms), {} objects:",
                s.cores, s.read_ms, s.write_ms, s.per_watcher_ms, s.pod_watchers, s.commit_ms, s.container_start_ms, m.objects
            );
            for (name, f) in [
                ("kube-rs-style floor", &m.kube_rs_floor),
                ("floor", &m.floor_workers),
            ] {
                let _ = writeln!(
                    t,
                    "  {name} at {} connections: {:.3} s (pods only {:.3} s, patches {:.3} s)",
                    f.connections, f.seconds, f.pod_creates_seconds, f.status_patches_seconds
                );
            }
            let b = &m.backlog;
            let _ = writeln!(
                t,
                "  backlog: {:.3} s, {:.2}x the kube-rs-style floor, {:.2}x the floor at {} connections{}",
                b.seconds,
                m.ratio_to_kube_rs,
                m.ratio_to_floor_workers,
                self.workers,
                if b.correct { "" } else { "  FAILED correctness check" }
            );
            let _ = writeln!(t, "  {}", milestones_line(b, "kube-rs-style floor"));
            let _ = writeln!(t, "  {}", writes_line(b));
        }
        if let Some(d) = &self.drain {
            let _ = writeln!(
                t,
                "restart after a drain: {} objects, {} of their pods force-deleted while no operator ran; \
                 from the fresh operator's start: lists in {:.3} s, first pod back {:.3} s, all {} back {:.3} s, \
                 every status exact {:.3} s, refreshed (queue empty, requests quiet) {:.3} s{}",
                d.objects,
                d.pods_deleted,
                d.lists_seconds,
                d.first_back_seconds,
                d.pods_deleted,
                d.back_seconds,
                d.status_seconds,
                d.refreshed_seconds,
                if d.correct { "" } else { "  FAILED correctness check" }
            );
            let _ = writeln!(t, "  requests: {}", requests_line(&d.requests));
        }
        if let Some(h) = &self.herd {
            let _ = writeln!(
                t,
                "herd: {} objects queued, {:.0} s of {}s: {} operator requests, {:.1}/s, at most {} in a second; converged {:.3} s after{}",
                h.objects,
                h.burst_seconds,
                h.status,
                h.requests.total,
                h.mean_per_second,
                h.max_per_second,
                h.converged_after_seconds,
                if h.correct {
                    ""
                } else {
                    "  FAILED correctness check"
                }
            );
            let per_second: Vec<String> = h.per_second.iter().map(u64::to_string).collect();
            let _ = writeln!(t, "  requests each second: {}", per_second.join(" "));
        }
        let _ = writeln!(t);
        let _ = writeln!(t, "  {:<30}  {:>22}  {:>14}", "target", "result", "goal");
        for c in &self.checks {
            let _ = writeln!(
                t,
                "  {:<30}  {:>22}  {:>14}  {}",
                c.name,
                c.result,
                c.target,
                if c.met { "ok" } else { "MISSED" }
            );
        }
        let _ = writeln!(t);
        if self.failures.is_empty() {
            let _ = writeln!(t, "correctness: passed");
        } else {
            let _ = writeln!(t, "correctness: FAILED");
            for f in &self.failures {
                let _ = writeln!(t, "  {f}");
            }
        }
        if !self.logs.is_empty() {
            let _ = writeln!(t, "operator logs: {}", self.logs);
        }
        t
    }
}

/// When every pod existed and every status named its pod, each over its floor (`name`: the
/// floor's, the creates alone being its pods-only part).
fn milestones_line(c: &Convergence, name: &str) -> String {
    match &c.over_floor {
        Some(o) => format!(
            "every pod after {:.3} s, {:.2}x the pods-only {name}@{} ({:.3} s); \
             every status after {:.3} s, {:.2}x the {name}@{} ({:.3} s)",
            c.pods_seconds,
            o.pods_ratio,
            o.connections,
            o.pods_only_floor_seconds,
            c.status_seconds,
            o.status_ratio,
            o.connections,
            o.floor_seconds
        ),
        None => format!(
            "every pod after {:.3} s; every status after {:.3} s",
            c.pods_seconds, c.status_seconds
        ),
    }
}

/// Writes per created pod by kind, and the requests in flight when measured.
fn writes_line(c: &Convergence) -> String {
    let (r, in_flight) = (&c.requests, c.in_flight);
    let per_pod = |n: u64| n as f64 / r.pods_created.max(1) as f64;
    let kinds: Vec<String> = r
        .writes_by_kind
        .iter()
        .map(|(k, n)| format!("{k} {:.2}", per_pod(*n)))
        .collect();
    let flight = in_flight
        .map(|f| {
            format!(
                "; in flight at the server: peak {}, mean {:.1}",
                f.peak, f.mean
            )
        })
        .unwrap_or_default();
    let until = c
        .writes_per_pod_until_converged
        .map(|w| format!(", {w:.2} of them until converged"))
        .unwrap_or_default();
    format!(
        "writes: {:.2} per pod created, {:.2} without Events{until} ({}){flight}",
        r.writes_per_pod_created,
        r.writes_per_pod_created_without_events,
        kinds.join(", ")
    )
}

fn requests_line(r: &Requests) -> String {
    let verbs: Vec<String> = r.by_verb.iter().map(|(k, n)| format!("{k} {n}")).collect();
    let cross = match r.metrics_total {
        Some(m) if m != r.total => format!(" [operator /metrics says {m}]"),
        _ => String::new(),
    };
    let startup = match r.startup {
        0 => String::new(),
        n => format!(" + {n} at start-up"),
    };
    format!(
        "{:.2} per pod created ({} for {} pods{startup}; {}: {}){cross}; {} answered 409",
        r.per_pod_created,
        r.total - r.startup,
        r.pods_created,
        r.source,
        verbs.join(", "),
        r.conflicts
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_are_the_creates_patches_updates_and_deletes_by_kind() {
        let by_verb: BTreeMap<String, u64> = [
            ("create pods", 1000),
            ("patch immortalcontainers/status", 2000),
            ("patch pods", 1000),
            ("create events", 1000),
            ("list pods", 2),
            ("watch pods", 1),
            ("get /apis", 1),
        ]
        .into_iter()
        .map(|(k, n)| (k.to_string(), n))
        .collect();
        let writes = writes_by_kind(&by_verb);
        assert_eq!(
            writes.keys().collect::<Vec<_>>(),
            [
                "create events",
                "create pods",
                "patch immortalcontainers/status",
                "patch pods"
            ]
        );
        assert_eq!(writes.values().sum::<u64>(), 5000);
        let events: Vec<_> = writes.keys().filter(|k| is_event_write(k)).collect();
        assert_eq!(events, ["create events"]);
        // The operator's /metrics count by HTTP method.
        let metrics = [("GET", 9), ("POST", 2), ("PATCH", 3), ("DELETE", 1)]
            .into_iter()
            .map(|(k, n)| (k.to_string(), n))
            .collect();
        assert_eq!(writes_by_kind(&metrics).values().sum::<u64>(), 6);
    }

    #[test]
    fn pods_are_held_to_the_creates_alone_and_status_to_the_whole_floor() {
        let floor = Floor {
            connections: 256,
            pod_creates_seconds: 2.0,
            status_patches_seconds: 2.0,
            seconds: 4.0,
            requests_per_second: 500.0,
        };
        let c = Convergence {
            seconds: 4.4,
            pods_seconds: 3.0,
            status_seconds: 4.4,
            over_floor: None,
            ratio_to_floor_1: 0.0,
            ratio_to_floor_workers: None,
            cpu_seconds: 0.0,
            cpu_seconds_per_1000_objects: 0.0,
            ready: 0,
            ready_seconds: None,
            requests: Requests::default(),
            writes_per_pod_until_converged: None,
            correct: true,
            in_flight: None,
        };
        let o = OverFloor::of(&c, &floor);
        assert_eq!((o.connections, o.pods_ratio), (256, 1.5));
        assert!((o.status_ratio - 1.1).abs() < 1e-9);
        let c = Convergence {
            over_floor: Some(o),
            ..c
        };
        assert_eq!(
            milestones_line(&c, "floor"),
            "every pod after 3.000 s, 1.50x the pods-only floor@256 (2.000 s); \
             every status after 4.400 s, 1.10x the floor@256 (4.000 s)"
        );
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 50.0);
        assert_eq!(percentile(&v, 90.0), 90.0);
        assert_eq!(percentile(&v, 99.0), 99.0);
        assert_eq!(percentile(&[7.0], 99.0), 7.0);
        assert_eq!(percentile(&[], 50.0), 0.0);
        let l = Latency::from_samples(&[
            Duration::from_millis(4),
            Duration::from_millis(1),
            Duration::from_millis(2),
        ]);
        assert_eq!((l.p50_ms, l.max_ms), (2.0, 4.0));
        assert_eq!(
            l.samples_ms,
            vec![4.0, 1.0, 2.0],
            "samples kept in run order"
        );
    }

    #[test]
    fn the_herd_bound_is_the_budget_times_the_clients_attempts() {
        assert_eq!(herd_request_bound(10.0, 1), 4 * 201);
        assert_eq!(herd_request_bound(2.5, 4), 4 * 129);
    }

    #[test]
    fn peak_rss_budget_runs_8_15_60_mib_at_1000_10000_100000() {
        assert_eq!(peak_rss_target_mib(20), 8.0);
        assert_eq!(peak_rss_target_mib(1000), 8.0);
        assert_eq!(peak_rss_target_mib(10_000), 15.0);
        assert_eq!(peak_rss_target_mib(100_000), 60.0);
        assert_eq!(peak_rss_target_mib(1_000_000), 60.0);
        assert!((peak_rss_target_mib(5500) - 11.5).abs() < 1e-9);
        assert!((peak_rss_target_mib(55_000) - 37.5).abs() < 1e-9);
    }
}
