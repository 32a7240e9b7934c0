//! immortal-bench: measures immortal-operator against a bare-client floor on the same server.
//!
//! One [`run`] goes through the phases in order, each in a namespace of its own:
//! **floor** (no operator: N pod creates + N status merge patches, at 1 and at C connections),
//! **backlog** (N objects exist, then the operator starts; time until all converged),
//! **bulk** (a second operator, idle first, then N objects created from C threads),
//! **recovery** (K pods deleted, then K pods marked Failed, one at a time; latency to the
//! replacement's ADDED event), **recovery under load** (every pod made not ready at once, so
//! the operator's queue holds a routine refresh for nearly every object, and while it does, K
//! pods deleted one at a time: the same latency, and how long the routine work took to drain),
//! **herd** (test server only: N objects queued by a fresh
//! operator's first lists, then every request of their namespace answered with an error for a
//! few seconds; the operator's requests per second while it lasts, and the time to converge
//! after). Correctness is checked after each operator phase by listing everything; CPU and
//! memory are read from the operator's /proc, never the bench's (the test server runs in the
//! bench's process).

pub mod cluster;
pub mod flood;
pub mod observe;
pub mod operator;
pub mod report;

use cluster::{Api, Cluster, Counts, Snapshot};
use flood::Flood;
use immortal_operator::immortal::types::{
    pod_name, ImmortalContainer, ImmortalContainerStatus, CONTAINER_NAME, IMAGE_ANNOTATION,
    IMMORTAL_CONTAINERS, MANAGED_BY_LABEL, MANAGED_BY_VALUE, OWNER_UID_LABEL,
};
use immortal_operator::immortal::{desired, reconcile};
use immortal_operator::kube::client::{self, Resource};
use immortal_operator::kube::types::{Condition, Pod};
use kube_testserver::{CostModel, FailRule, Rule, TestServer};
use observe::Observer;
use operator::Operator;
use report::{
    Convergence, Drain, Floor, Herd, InFlight, Latency, Load, Machine, Modeled, OverFloor, Process,
    Report, Requests,
};
use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

/// Image of every object. Never pulled by the test server; small and always pullable on a
/// real cluster.
pub const DEFAULT_IMAGE: &str = "registry.k8s.io/pause:3.9";

/// How long the state must stay unchanged before a phase's objects are checked: long enough
/// for a late extra write (a double count) to show up.
const SETTLE: Duration = Duration::from_millis(300);
/// The longest the settling may take.
const SETTLE_MAX: Duration = Duration::from_secs(5);
/// The longest a phase waits, once converged, for every object's status to say Ready, so that
/// its request count includes the Ready writes rather than leaving them to the next phase.
pub const READY_MAX: Duration = Duration::from_secs(300);
/// When no pod or object has changed for this long, the objects not Ready yet are taken to
/// stay so (pods a node has no room for). While pods still change (a kubelet working through
/// 100,000 of them), the wait goes on.
const READY_QUIET: Duration = Duration::from_secs(15);
/// At most this many correctness problems are listed per phase; the rest are counted.
const MAX_LISTED: usize = 20;

/// The control plane the modeled phase runs against (testserver/README.md, "Cost model"),
/// calibrated on the issue-26 cluster (v1.28, 2 cores, 1,000 objects: the kube-rs peer 5.8 s,
/// ours 13.9 s at 16 workers, 2.4x, and 10.0 s at 64, 1.7x). Modeled (2026-11-25): the floor
/// 3.67–3.69 s, ours 8.67 s at 16 (2.35x) and 5.86 s at 64 (1.59x, 7 % better than the
/// cluster). The commit latency sets what 16 in flight lose to waiting (20 ms: 2.26x, 25 ms:
/// 2.56x); how CPU is split between pod and status writes left the 64-worker ratio at 1.6.
pub const MODEL: CostModel = CostModel {
    cores: 2,
    read: Duration::from_micros(400),
    write: Duration::from_micros(2000),
    per_watcher: Duration::from_micros(400),
    pod_watchers: 4,
    commit: Duration::from_millis(23),
};

/// How long the modeled phase's kubelet takes to start a container: seconds on a busy real
/// node, so that pods run after the operator has counted and released them, as on the issue-26
/// cluster, rather than 20 ms after their creation (which, when calibrating, had the operator
/// release most pods twice, a Running event from before the release still showing our
/// finalizer: 6 writes a pod).
pub const MODEL_START_DELAY: Duration = Duration::from_secs(2);

/// Requests in flight of the kube-rs-style floor: kube-rs's controller runs every queued
/// reconcile at once (hundreds in flight on the issue-26 cluster, 1,189 sockets).
pub const KUBE_RS_IN_FLIGHT: usize = 256;

/// The test server's user of the load phase's flood (see `Run::flood_user`).
const FLOOD_USER: &str = "immortal-bench-flood";

/// What to run.
#[derive(Debug, Clone)]
pub struct Config {
    /// `None`: start the test API server in this process.
    pub kubeconfig: Option<PathBuf>,
    /// The operator binary.
    pub operator: PathBuf,
    pub objects: usize,
    pub connections: usize,
    pub recovery: usize,
    /// Passed to the operator as `--workers`.
    pub workers: usize,
    pub image: String,
    /// The pod template of every ImmortalContainer (`None`: none, the bare pod).
    pub template: Option<Value>,
    /// Test server only: added to every request's answer, as a round trip to a real API
    /// server adds it, so that concurrency (the floor's connections, the operator's workers)
    /// shows what it buys where the server is not the bottleneck.
    pub latency: Duration,
    /// Objects of the modeled phase (test server only; at most `objects`): the kube-rs-style
    /// floor and a backlog against [`MODEL`]; 0 skips it.
    pub model_objects: usize,
    /// How long the herd phase's burst of errors lasts; zero skips the phase.
    pub burst: Duration,
    /// The HTTP status the burst answers with.
    pub burst_status: u16,
    /// Objects of the herd phase; `None`: `objects`.
    pub burst_objects: Option<usize>,
    /// Objects of the restart-after-drain phase; `None`: `objects`; 0 skips it.
    pub drain_objects: Option<usize>,
    /// Their pods force-deleted while no operator runs (at most the phase's objects).
    pub drain_pods: usize,
    /// The whole run's budget; every wait gives up (with an error naming what it waited for)
    /// when it is spent.
    pub timeout: Duration,
    /// The `immortal-bench` binary, to run the load phase's flood in a child process at a
    /// lower CPU priority (see [`flood`]); `None`: on threads of this process.
    pub flood_exe: Option<PathBuf>,
    /// The niceness of the flood's process and, on the test server, of the threads that serve
    /// its requests; 0: as high a priority as the operator's.
    pub flood_nice: u8,
    /// Keep the operators' logs even when the run passed (they are kept when it fails).
    pub keep_logs: bool,
    /// Print one line per phase to stderr.
    pub progress: bool,
}

/// A pod template as real workloads write one, about 1 KB as JSON: labels, annotations, a
/// restricted securityContext, and acontainer's args, env, port, resources and probes.
pub fn typical_template() -> Value {
    serde_json::json!({
        "metadata": {
            "labels": {"app.kubernetes.io/name": "web", "app.kubernetes.io/part-of": "shop",
                       "team": "storefront"},
            "annotations": {"example.com/owner": "storefront-oncall@example.com",
                            "prometheus.io/scrape": "true", "prometheus.io/port": "8080"}
        },
        "spec": {
            "terminationGracePeriodSeconds": 20,
            "securityContext": {"runAsNonRoot": true, "runAsUser": 65532,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "acontainer",
                "args": ["--listen=:8080", "--log-format=json", "--cache-size=256"],
                "env": [{"name": "MODE", "value": "production"},
                        {"name": "REGION", "value": "eu-west-1"},
                        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                "ports": [{"name": "http", "containerPort": 8080}],
                "resources": {"requests": {"cpu": "100m", "memory": "64Mi"},
                              "limits": {"cpu": "500m", "memory": "128Mi"}},
                "readinessProbe": {"httpGet": {"path": "/healthz", "port": "http"},
                                   "periodSeconds": 10},
                "securityContext": {"allowPrivilegeEscalation": false,
                                    "readOnlyRootFilesystem": true,
                                    "capabilities": {"drop": ["ALL"]}}
            }]
        }
    })
}

impl Default for Config {
    fn default() -> Config {
        Config {
            kubeconfig: None,
            operator: PathBuf::from("immortal-operator"),
            objects: 1000,
            connections: 64,
            recovery: 50,
            workers: immortal_operator::cli::DEFAULT_WORKERS,
            image: DEFAULT_IMAGE.into(),
            template: None,
            latency: Duration::ZERO,
            model_objects: 1000,
            burst: Duration::from_secs(10),
            burst_status: 503,
            burst_objects: None,
            drain_objects: None,
            drain_pods: 50,
            timeout: Duration::from_secs(3600),
            flood_exe: None,
            flood_nice: flood::NICE,
            keep_logs: false,
            progress: false,
        }
    }
}

/// Why a run stopped before it could report. Nothing is retried: the bench reports, a person
/// looks. (Wrong results are not errors: they are [`Report::failures`].)
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// Bad flags, no operator binary, the test server would not start, the kubeconfig would not
    /// load, the CRD is not installed, a thread could not be spawned.
    Setup(String),
    /// A request of the bench's own failed (the floor's, creating objects, deleting pods).
    Api {
        action: String,
        source: client::Error,
    },
    /// The operator would not start, exited early, or would not stop on SIGTERM; its /proc or
    /// /metrics could not be read.
    Operator(String),
    /// The run's time budget ran out while waiting; says what was still missing.
    Timeout(String),
}

impl Error {
    fn api(action: &str, source: client::Error) -> Error {
        Error::Api {
            action: action.to_string(),
            source,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Setup(m) => write!(f, "setup: {m}"),
            Error::Api { action, source } => write!(f, "{action}: {source}"),
            Error::Operator(m) => write!(f, "operator: {m}"),
            Error::Timeout(m) => write!(f, "timeout: {m}"),
        }
    }
}

impl std::error::Error for Error {}

/// Runs every phase and returns the report (with its checks filled in). Correctness problems
/// are in `failures`; an `Err` means the run could not go on.
pub fn run(cfg: &Config) -> Result<Report, Error> {
    if cfg.objects == 0 || cfg.connections == 0 || cfg.workers == 0 {
        return Err(Error::Setup(
            "--objects, --connections and --workers must be at least 1".into(),
        ));
    }
    let deadline = Instant::now() + cfg.timeout;
    let binary_bytes = std::fs::metadata(&cfg.operator)
        .map_err(|e| {
            Error::Setup(format!(
                "operator binary {}: {e} (build it: cargo build --release)",
                cfg.operator.display()
            ))
        })?
        .len();
    let machine = Machine::read();
    // The floor's C threads, the bench's 4 watches, and some room.
    let cluster = Cluster::connect(
        cfg.kubeconfig.as_deref(),
        cfg.connections.max(cfg.workers) + 8,
    )?;
    if !cfg.latency.is_zero() {
        match cluster.test_server() {
            Some(server) => server.set_latency(cfg.latency),
            None => {
                return Err(Error::Setup(
                    "--latency-ms needs the in-process test server (no --kubeconfig)".into(),
                ))
            }
        }
    }
    let logs = std::env::temp_dir().join(format!("immortal-bench-{}", std::process::id()));
    std::fs::create_dir_all(&logs)
        .map_err(|e| Error::Setup(format!("cannot create {}: {e}", logs.display())))?;
    let mut report = Report {
        machine,
        against: if cfg.latency.is_zero() {
            cluster.describe()
        } else {
            format!(
                "{}, {} ms added to every answer",
                cluster.describe(),
                cfg.latency.as_millis()
            )
        },
        operator: cfg.operator.display().to_string(),
        operator_binary_bytes: binary_bytes,
        objects: cfg.objects,
        connections: cfg.connections,
        recoveries: cfg.recovery,
        workers: cfg.workers,
        floor: Vec::new(),
        backlog: None,
        bulk: None,
        recovery_deleted: None,
        recovery_deleted_reaction: None,
        recovery_failed: None,
        recovery_requests: None,
        backlog_operator: None,
        bulk_operator: None,
        load: None,
        modeled: None,
        drain: None,
        herd: None,
        checks: Vec::new(),
        failures: Vec::new(),
        logs: logs.display().to_string(),
    };
    let run = Run {
        cfg,
        cluster: &cluster,
        deadline,
        logs: &logs,
    };
    let result = run.phases(&mut report);
    for e in cluster.cleanup() {
        run.say(&e);
    }
    result?;
    report.checks = report.checks();
    if report.failures.is_empty() && !cfg.keep_logs {
        let _ = std::fs::remove_dir_all(&logs);
        report.logs.clear();
    }
    Ok(report)
}

struct Run<'a> {
    cfg: &'a Config,
    cluster: &'a Cluster,
    deadline: Instant,
    logs: &'a Path,
}

impl Run<'_> {
    fn say(&self, msg: &str) {
        if self.cfg.progress {
            eprintln!("immortal-bench: {msg}");
        }
    }

    fn api(&self) -> &Api {
        &self.cluster.api
    }

    /// The operator under test, serving `ns`, logging to `operator-<phase>.log`.
    fn spawn_operator(&self, ns: &str, phase: &str) -> Result<Operator, Error> {
        let log = self.logs.join(format!("operator-{phase}.log"));
        Operator::spawn(
            &self.cfg.operator,
            self.cluster.kubeconfig(),
            ns,
            self.cfg.workers,
            &log,
        )
    }

    fn phases(&self, report: &mut Report) -> Result<(), Error> {
        // Floor: at 1 connection, at C, and at --workers when the operator gets more than one.
        let floor_ns = self.cluster.create_namespace("floor")?;
        let mut conns = vec![1, self.cfg.connections];
        if self.cfg.workers > 1 {
            conns.push(self.cfg.workers);
        }
        conns.sort_unstable();
        conns.dedup();
        for (k, &c) in conns.iter().enumerate() {
            let f = self.floor(&floor_ns, &format!("f{k}-"), self.cfg.objects, c)?;
            self.say(&format!(
                "floor at {c} connection(s): {:.3} s, {:.0} requests/s",
                f.seconds, f.requests_per_second
            ));
            report.floor.push(f);
        }
        let floor_at = |c: usize| report.floor.iter().find(|f| f.connections == c).cloned();
        let floor_1 = floor_at(1).map_or(f64::NAN, |f| f.seconds);
        let floor_w = (self.cfg.workers > 1)
            .then(|| floor_at(self.cfg.workers).map(|f| f.seconds))
            .flatten();
        // Pods and status are held to the floor at as many connections as the operator has
        // workers (at 1 worker, the floor at 1).
        let floor_of_workers = floor_at(self.cfg.workers);

        // Backlog: its own operator, started on N existing objects.
        let (mut backlog, process) =
            self.backlog(self.cfg.objects, "backlog", &mut report.failures)?;
        backlog.ratio_to_floor_1 = backlog.seconds / floor_1;
        backlog.ratio_to_floor_workers = floor_w.map(|f| backlog.seconds / f);
        backlog.over_floor = floor_of_workers
            .as_ref()
            .map(|f| OverFloor::of(&backlog, f));
        self.say(&format!(
            "backlog: {:.3} s ({:.2}x floor@1)",
            backlog.seconds, backlog.ratio_to_floor_1
        ));
        report.backlog = Some(backlog);
        report.backlog_operator = Some(process);

        // Bulk and recovery: a second operator, measured idle first.
        let ns = self.cluster.create_namespace("bulk")?;
        let obs = Observer::start(self.api(), &ns, self.deadline)?;
        let mut op = self.spawn_operator(&ns, "bulk")?;
        op.wait_ready(self.deadline)?;
        // Ready means both first lists are in; give the threads a moment to park.
        thread::sleep(Duration::from_millis(200));
        let idle = op.usage()?;
        self.say(&format!("idle: rss {} KiB", idle.rss_kib));

        let mut bulk = self.bulk(&ns, &obs, &mut op, &mut report.failures)?;
        bulk.ratio_to_floor_1 = bulk.seconds / floor_1;
        bulk.ratio_to_floor_workers = floor_w.map(|f| bulk.seconds / f);
        bulk.over_floor = floor_of_workers.as_ref().map(|f| OverFloor::of(&bulk, f));
        self.say(&format!("bulk: {:.3} s", bulk.seconds));
        report.bulk = Some(bulk);

        let Recovery {
            deleted,
            deleted_reaction,
            failed,
            requests,
            mut starts,
        } = self.recovery(&ns, &obs, &mut op, &mut report.failures)?;
        self.say(&format!(
            "recovery: deleted p50 {:.2} ms, failed p50 {:.2} ms",
            deleted.p50_ms, failed.p50_ms
        ));
        report.recovery_deleted = Some(deleted);
        report.recovery_deleted_reaction = Some(deleted_reaction);
        report.recovery_failed = Some(failed);
        report.recovery_requests = Some(requests);

        if self.cfg.recovery > 0 {
            let load = self.load(&ns, &obs, &mut op, &mut starts, &mut report.failures)?;
            self.say(&format!(
                "recovery under load: p99 {:.2} ms, queue empty {:.3} s after the flood",
                load.latency.p99_ms, load.drained_seconds
            ));
            report.load = Some(load);
        }

        let end = op.usage()?;
        let exit_code = op.stop()?;
        if exit_code != Some(0) {
            report.failures.push(format!(
                "bulk operator: exit code {exit_code:?} after SIGTERM, want 0"
            ));
        }
        report.bulk_operator = Some(Process {
            idle: Some(idle),
            end,
            exit_code,
        });

        let drain_objects = self.cfg.drain_objects.unwrap_or(self.cfg.objects);
        if drain_objects > 0 {
            let d = self.drain(drain_objects, &mut report.failures)?;
            self.say(&format!(
                "drain: {} of {} pods back {:.3} s after the start, refreshed after {:.3} s",
                d.pods_deleted, d.objects, d.back_seconds, d.refreshed_seconds
            ));
            report.drain = Some(d);
        }

        // Modeled: needs the test server to model a real control plane's costs.
        match self.cluster.test_server() {
            Some(_) if self.cfg.model_objects > 0 => {
                let m = self.modeled(&mut report.failures)?;
                self.say(&format!(
                    "modeled: kube-rs-style floor {:.3} s, backlog {:.3} s ({:.2}x)",
                    m.kube_rs_floor.seconds, m.backlog.seconds, m.ratio_to_kube_rs
                ));
                report.modeled = Some(m);
            }
            Some(_) => {}
            None => self.say("modeled: skipped (needs the test server's cost model)"),
        }

        // Herd: needs the test server to answer errors on cue.
        match self.cluster.test_server() {
            Some(server) if !self.cfg.burst.is_zero() => {
                let herd = self.herd(server, &mut report.failures)?;
                self.say(&format!(
                    "herd: {} requests in {:.0} s of {}s, at most {} in a second; converged {:.3} s after",
                    herd.requests.total,
                    herd.burst_seconds,
                    herd.status,
                    herd.max_per_second,
                    herd.converged_after_seconds
                ));
                report.herd = Some(herd);
            }
            Some(_) => {}
            None => self.say("herd: skipped (needs the test server to inject errors)"),
        }
        Ok(())
    }

    /// Restart after a drain: `n` objects converged under a first operator, which is then
    /// stopped; `--drain-pods` of their pods force-deleted while none runs; a fresh operator
    /// started. How long from its start until those pods are back, and until every object is
    /// refreshed: its status exact, the queue empty and the requests stopped.
    fn drain(&self, n: usize, failures: &mut Vec<String>) -> Result<Drain, Error> {
        let k = self.cfg.drain_pods.min(n);
        let api = self.api();
        let ns = self.cluster.create_namespace("drain")?;
        let obs = self.existing_objects(&ns, n)?;
        // Settled under the first operator: every pod counted, released and (where a kubelet
        // has room) running, and nothing left in flight.
        let mut first = self.spawn_operator(&ns, "drain-before")?;
        self.converge(&ns, &obs, &mut first, "drain (first operator)", n)?;
        self.wait_ready(&obs, &mut first, n)?;
        obs.wait_quiet(SETTLE, Instant::now() + SETTLE_MAX);
        wait_requests_quiet(&first)?;
        let exit_code = first.stop()?;
        if exit_code != Some(0) {
            failures.push(format!(
                "drain (first operator): exit code {exit_code:?} after SIGTERM, want 0"
            ));
        }

        // Spread over the objects, so that a fresh operator's lists meet them among the
        // healthy ones rather than all first.
        let drained: Vec<(String, String, String)> = (0..k)
            .map(|j| {
                let name = format!("ic-{}", j * n / k);
                let pod = pod_name(&name);
                let uid = obs.uid_of(&pod, "drain")?;
                Ok((name, pod, uid))
            })
            .collect::<Result<_, Error>>()?;
        parallel(k, self.cfg.connections, self.deadline, |j| {
            let (_, pod, uid) = &drained[j];
            api.delete_pod(&ns, pod, uid)
        })?;
        // Gone, or held by a finalizer for the fresh operator to let go; then settled.
        obs.wait_until(
            self.deadline,
            "drain: the force-deleted pods to go",
            || Ok(()),
            |s| {
                drained
                    .iter()
                    .all(|(_, pod, _)| s.pods.get(pod).is_none_or(|p| p.deleting))
            },
        )?;
        obs.wait_quiet(SETTLE, Instant::now() + SETTLE_MAX);
        let twice: BTreeMap<&str, i64> = drained.iter().map(|(n, _, _)| (n.as_str(), 2)).collect();
        let want_starts = |name: &str| twice.get(name).copied().unwrap_or(1);

        let before = self.cluster.snapshot();
        let mut op = self.spawn_operator(&ns, "drain")?;
        let start = op.spawned_at;
        let secs = |t: Instant| t.saturating_duration_since(start).as_secs_f64();
        op.wait_ready(self.deadline)?;
        let lists = Instant::now();
        obs.wait_until(
            self.deadline,
            &format!("drain: {k} pods back after the restart"),
            || op.check_alive(),
            |s| {
                drained.iter().all(|(_, pod, old)| {
                    s.pods
                        .get(pod)
                        .is_some_and(|p| p.uid != *old && !p.deleting)
                })
            },
        )?;
        let (first_back, back) = {
            let s = obs.lock();
            let added = drained
                .iter()
                .filter_map(|(_, pod, _)| s.pods.get(pod).map(|p| p.added_at));
            added.fold((None, start), |(lo, hi): (Option<Instant>, Instant), t| {
                (Some(lo.map_or(t, |l| l.min(t))), hi.max(t))
            })
        };
        // Stamped with the latest event when the bench found every status exact.
        let mut status_at = start;
        obs.wait_until(
            self.deadline,
            "drain: every status naming its current pod",
            || op.check_alive(),
            |s| {
                let exact = s.ics.len() == n
                    && s.ics.iter().all(|(name, ic)| {
                        ic.start_times == want_starts(name)
                            && s.pods
                                .get(&pod_name(name))
                                .is_some_and(|p| p.uid == ic.last_counted_uid)
                    });
                if exact {
                    status_at = s.last_event.max(start);
                }
                exact
            },
        )?;
        // Refreshed: besides, the queue empty and no request for SETTLE; stamped at the last
        // poll that saw either (the one that found the status exact, at the earliest).
        let mut busy_at = status_at;
        let mut seen = None;
        loop {
            op.check_alive()?;
            let (depth, total) = op.queue_and_requests()?;
            let now = Instant::now();
            if depth > 0 || seen.is_some_and(|t| t != total) {
                busy_at = now;
            } else if now.saturating_duration_since(busy_at) >= SETTLE {
                break;
            }
            seen = Some(total);
            if now >= self.deadline {
                return Err(Error::Timeout(
                    "drain: the fresh operator's queue never emptied or its requests never stopped"
                        .into(),
                ));
            }
            thread::sleep(Duration::from_millis(10));
        }
        let requests = self.requests(&before, &self.cluster.snapshot(), &op, None, 0, k as u64)?;
        let problems = verify(api, &ns, &want_starts)?;
        let correct = problems.is_empty();
        failures.extend(problems.into_iter().map(|p| format!("drain: {p}")));
        let exit_code = op.stop()?;
        if exit_code != Some(0) {
            failures.push(format!(
                "drain operator: exit code {exit_code:?} after SIGTERM, want 0"
            ));
        }
        Ok(Drain {
            objects: n,
            pods_deleted: k,
            lists_seconds: secs(lists),
            first_back_seconds: secs(first_back.unwrap_or(start)),
            back_seconds: secs(back),
            status_seconds: secs(status_at),
            refreshed_seconds: secs(busy_at),
            requests,
            correct,
        })
    }

    /// N objects, a fresh operator whose first lists queue them all, then every request of
    /// their namespace answered `burst_status` for `burst`: what the operator asks of an API
    /// server that is coming back, second by second, and how long it takes to converge once
    /// the server answers again.
    fn herd(&self, server: &TestServer, failures: &mut Vec<String>) -> Result<Herd, Error> {
        let n = self.cfg.burst_objects.unwrap_or(self.cfg.objects);
        let ns = self.cluster.create_namespace("herd")?;
        let api = self.api();
        let obs = self.existing_objects(&ns, n)?;
        let spawned = self.cluster.snapshot();
        let mut op = self.spawn_operator(&ns, "herd")?;
        // Ready: both first lists are in, so every object is queued. The watches are opened
        // right after; wait for them too, so that the burst (which fails new requests only:
        // open streams go on) meets reconciles, not a watch still being opened.
        op.wait_ready(self.deadline)?;
        let watching = |verb: &str| {
            let now = self.cluster.snapshot();
            cluster::operator_requests(&spawned, &now).is_some_and(|c| c.contains_key(verb))
        };
        while !(watching("watch immortalcontainers") && watching("watch pods")) {
            op.check_alive()?;
            if Instant::now() >= self.deadline {
                return Err(Error::Timeout(
                    "herd: the operator never opened its watches".into(),
                ));
            }
            thread::sleep(Duration::from_millis(1));
        }
        let before = self.cluster.snapshot();
        server.fail_for(
            FailRule {
                count: 1,
                status: self.cfg.burst_status,
                retry_after: None,
                verb: None,
                path_contains: Some(format!("/namespaces/{ns}/")),
            },
            self.cfg.burst,
        );
        let started = Instant::now();
        let burst_end = started + self.cfg.burst;
        let mut per_second = Vec::new();
        let mut last = before.clone();
        let mut tick = started;
        while tick < burst_end {
            tick = (tick + Duration::from_secs(1)).min(burst_end);
            thread::sleep(tick.saturating_duration_since(Instant::now()));
            let now = self.cluster.snapshot();
            let sent: u64 = cluster::operator_requests(&last, &now)
                .map(|c| c.values().sum())
                .unwrap_or(0);
            per_second.push(sent);
            last = now;
            op.check_alive()?;
        }
        let by_verb = cluster::operator_requests(&before, &last).unwrap_or_default();
        let requests = Requests {
            total: by_verb.values().sum(),
            by_verb,
            source: "test server".into(),
            ..Requests::default()
        };
        let converged = self.converge(&ns, &obs, &mut op, "herd", n)?;
        let converged_after = converged.all.saturating_duration_since(burst_end);
        obs.wait_quiet(SETTLE, Instant::now() + SETTLE_MAX);
        let problems = verify(api, &ns, &|_| 1)?;
        let correct = problems.is_empty();
        failures.extend(problems.into_iter().map(|p| format!("herd: {p}")));
        let exit_code = op.stop()?;
        if exit_code != Some(0) {
            failures.push(format!(
                "herd operator: exit code {exit_code:?} after SIGTERM, want 0"
            ));
        }
        let burst_seconds = self.cfg.burst.as_secs_f64();
        Ok(Herd {
            objects: n,
            status: self.cfg.burst_status,
            burst_seconds,
            max_per_second: per_second.iter().copied().max().unwrap_or(0),
            mean_per_second: requests.total as f64 / burst_seconds,
            per_second,
            requests,
            converged_after_seconds: converged_after.as_secs_f64(),
            correct,
        })
    }

    /// N objects created untimed, then N pod creates and N status patches from `conns`
    /// threads, each timed.
    fn floor(&self, ns: &str, prefix: &str, n: usize, conns: usize) -> Result<Floor, Error> {
        let api = self.api();
        let image = &self.cfg.image;
        let template = self.cfg.template.as_ref();
        let ics = parallel(n, self.cfg.connections, self.deadline, |i| {
            api.create_immortal_container(ns, &format!("{prefix}{i}"), image, template)
        })?;
        let started = Instant::now();
        let pods = parallel(n, conns, self.deadline, |i| {
            api.create_pod(ns, &desired::desired_pod(&ics[i], false))
        })?;
        let pods_secs = started.elapsed().as_secs_f64();
        let started = Instant::now();
        parallel(n, conns, self.deadline, |i| {
            api.patch_status(
                ns,
                &ics[i].metadata.name,
                &first_status_patch(&ics[i], &pods[i]),
            )
        })?;
        let patches_secs = started.elapsed().as_secs_f64();
        let seconds = pods_secs + patches_secs;
        Ok(Floor {
            connections: conns,
            pod_creates_seconds: pods_secs,
            status_patches_seconds: patches_secs,
            seconds,
            requests_per_second: (2 * n) as f64 / seconds,
        })
    }

    /// `n` objects created in `ns` before any operator runs, and an observer of the namespace
    /// that expects them (the backlog and herd phases start from such a namespace).
    fn existing_objects(&self, ns: &str, n: usize) -> Result<Observer, Error> {
        let api = self.api();
        parallel(n, self.cfg.connections, self.deadline, |i| {
            api.create_immortal_container(
                ns,
                &format!("ic-{i}"),
                &self.cfg.image,
                self.cfg.template.as_ref(),
            )
        })?;
        let obs = Observer::start(api, ns, self.deadline)?;
        obs.expect(n);
        Ok(obs)
    }

    /// The kube-rs-style floor, the floor at `--workers` and a backlog, all against a test
    /// server of their own modeling [`MODEL`]'s control plane, so that designs rank as on a
    /// real one.
    fn modeled(&self, failures: &mut Vec<String>) -> Result<Modeled, Error> {
        let n = self.cfg.model_objects.min(self.cfg.objects);
        let cluster = Cluster::start_modeled(
            MODEL,
            MODEL_START_DELAY,
            KUBE_RS_IN_FLIGHT.max(self.cfg.workers) + 8,
        )?;
        let run = Run {
            cluster: &cluster,
            ..*self
        };
        let measured = run.modeled_phases(n, failures);
        for e in cluster.cleanup() {
            self.say(&e);
        }
        let (kube_rs_floor, floor_workers, backlog) = measured?;
        Ok(Modeled {
            objects: n,
            ratio_to_kube_rs: backlog.seconds / kube_rs_floor.seconds,
            ratio_to_floor_workers: backlog.seconds / floor_workers.seconds,
            model: report::ModelSettings::of(&MODEL, MODEL_START_DELAY),
            kube_rs_floor,
            floor_workers,
            backlog,
        })
    }

    fn modeled_phases(
        &self,
        n: usize,
        failures: &mut Vec<String>,
    ) -> Result<(Floor, Floor, Convergence), Error> {
        let ns = self.cluster.create_namespace("model-floor")?;
        // Each pod and object event costs a watcher's share: the floors get the watchers of the
        // operator's phase, the peer's own (pods, its objects) and the bench's.
        let _peer = Observer::start(self.api(), &ns, self.deadline)?;
        let _bench = Observer::start(self.api(), &ns, self.deadline)?;
        let kube_rs = self.floor(&ns, "k-", n, KUBE_RS_IN_FLIGHT)?;
        self.say(&format!(
            "modeled floor at {KUBE_RS_IN_FLIGHT} connections: {:.3} s",
            kube_rs.seconds
        ));
        let at_workers = self.floor(&ns, "w-", n, self.cfg.workers)?;
        self.say(&format!(
            "modeled floor at {} connections: {:.3} s",
            self.cfg.workers, at_workers.seconds
        ));
        let (mut backlog, _) = self.backlog(n, "model-backlog", failures)?;
        backlog.ratio_to_floor_1 = f64::NAN;
        backlog.ratio_to_floor_workers = Some(backlog.seconds / at_workers.seconds);
        backlog.over_floor = Some(OverFloor::of(&backlog, &kube_rs));
        Ok((kube_rs, at_workers, backlog))
    }

    fn backlog(
        &self,
        n: usize,
        phase: &str,
        failures: &mut Vec<String>,
    ) -> Result<(Convergence, Process), Error> {
        let ns = self.cluster.create_namespace(phase)?;
        let obs = self.existing_objects(&ns, n)?;
        let before = self.cluster.snapshot();
        let server = self.cluster.test_server();
        if let Some(s) = server {
            s.take_in_flight();
        }
        let mut op = self.spawn_operator(&ns, phase)?;
        let converged = self.converge(&ns, &obs, &mut op, phase, n)?;
        let until_converged = writes_without_events_per(&before, &self.cluster.snapshot(), n);
        let in_flight = server.map(|s| InFlight::from(s.take_in_flight()));
        let (pods_seconds, status_seconds, seconds) = converged.seconds_since(op.spawned_at);
        let (ready, ready_at) = self.wait_ready(&obs, &mut op, n)?;
        let ready_seconds =
            ready_at.map(|t| t.saturating_duration_since(op.spawned_at).as_secs_f64());
        obs.wait_quiet(SETTLE, Instant::now() + SETTLE_MAX);
        wait_requests_quiet(&op)?;
        let usage = op.usage()?;
        let requests = self.requests(&before, &self.cluster.snapshot(), &op, None, 0, n as u64)?;
        let problems = verify(self.api(), &ns, &|_| 1)?;
        let correct = problems.is_empty();
        failures.extend(problems.into_iter().map(|p| format!("{phase}: {p}")));
        let exit_code = op.stop()?;
        if exit_code != Some(0) {
            failures.push(format!(
                "{phase} operator: exit code {exit_code:?} after SIGTERM, want 0"
            ));
        }
        Ok((
            Convergence {
                seconds,
                pods_seconds,
                status_seconds,
                over_floor: None,
                ratio_to_floor_1: 0.0,
                ratio_to_floor_workers: None,
                cpu_seconds: usage.cpu_seconds,
                cpu_seconds_per_1000_objects: usage.cpu_seconds * 1000.0 / n as f64,
                ready,
                ready_seconds,
                requests,
                writes_per_pod_until_converged: until_converged,
                correct,
                in_flight,
            },
            Process {
                idle: None,
                end: usage,
                exit_code,
            },
        ))
    }

    fn bulk(
        &self,
        ns: &str,
        obs: &Observer,
        op: &mut Operator,
        failures: &mut Vec<String>,
    ) -> Result<Convergence, Error> {
        let n = self.cfg.objects;
        let api = self.api();
        let before = self.cluster.snapshot();
        let metrics_before = op.requests_by_method()?;
        let conflicts_before = op.conflicts()?;
        let cpu_before = op.usage()?.cpu_seconds;
        obs.expect(n);
        let started = Instant::now();
        parallel(n, self.cfg.connections, self.deadline, |i| {
            api.create_immortal_container(
                ns,
                &format!("ic-{i}"),
                &self.cfg.image,
                self.cfg.template.as_ref(),
            )
        })?;
        let converged = self.converge(ns, obs, op, "bulk", n)?;
        let until_converged = writes_without_events_per(&before, &self.cluster.snapshot(), n);
        let (pods_seconds, status_seconds, seconds) = converged.seconds_since(started);
        let (ready, ready_at) = self.wait_ready(obs, op, n)?;
        let ready_seconds = ready_at.map(|t| t.saturating_duration_since(started).as_secs_f64());
        obs.wait_quiet(SETTLE, Instant::now() + SETTLE_MAX);
        wait_requests_quiet(op)?;
        let cpu = op.usage()?.cpu_seconds - cpu_before;
        let requests = self.requests(
            &before,
            &self.cluster.snapshot(),
            op,
            Some(&metrics_before),
            conflicts_before,
            n as u64,
        )?;
        let problems = verify(api, ns, &|_| 1)?;
        let correct = problems.is_empty();
        failures.extend(problems.into_iter().map(|p| format!("bulk: {p}")));
        Ok(Convergence {
            seconds,
            pods_seconds,
            status_seconds,
            over_floor: None,
            ratio_to_floor_1: 0.0,
            ratio_to_floor_workers: None,
            cpu_seconds: cpu,
            cpu_seconds_per_1000_objects: cpu * 1000.0 / n as f64,
            ready,
            ready_seconds,
            requests,
            writes_per_pod_until_converged: until_converged,
            correct,
            // The bench's own creates are in flight too: not the operator's to report.
            in_flight: None,
        })
    }

    /// K pods deleted, then K marked Failed, one at a time, each on the next object.
    fn recovery(
        &self,
        ns: &str,
        obs: &Observer,
        op: &mut Operator,
        failures: &mut Vec<String>,
    ) -> Result<Recovery, Error> {
        let n = self.cfg.objects;
        let k = self.cfg.recovery;
        let api = self.api();
        let mut starts: BTreeMap<String, i64> = (0..n).map(|i| (format!("ic-{i}"), 1)).collect();
        let before = self.cluster.snapshot();
        let metrics_before = op.requests_by_method()?;
        let conflicts_before = op.conflicts()?;
        let mut deleted = Vec::with_capacity(k);
        let mut reaction = Vec::with_capacity(k);
        let mut failed = Vec::with_capacity(k);
        for round in 0..2 * k {
            let name = format!("ic-{}", round % n);
            let pod = pod_name(&name);
            let old = obs.uid_of(&pod, "recovery")?;
            if round < k {
                api.delete_pod(ns, &pod, &old)?;
            } else {
                api.fail_pod(ns, &pod)?;
            }
            let answered = Instant::now();
            let what = format!(
                "a new pod {pod} after {}",
                if round < k {
                    "its deletion"
                } else {
                    "it failed"
                }
            );
            let (latency, part) = self.replacement(obs, op, &pod, &old, answered, &what)?;
            if round < k {
                deleted.push(latency);
                reaction.push(part);
            } else {
                failed.push(latency);
            }
            // Let the count land before the next round, so rounds do not overlap.
            let want = starts.get(&name).copied().unwrap_or(1) + 1;
            starts.insert(name.clone(), want);
            let what = format!("{name} to count start {want}");
            obs.wait_until(
                self.deadline,
                &what,
                || op.check_alive(),
                |s| s.ics.get(&name).is_some_and(|i| i.start_times >= want),
            )?;
        }
        obs.wait_quiet(SETTLE, Instant::now() + SETTLE_MAX);
        wait_requests_quiet(op)?;
        let requests = self.requests(
            &before,
            &self.cluster.snapshot(),
            op,
            Some(&metrics_before),
            conflicts_before,
            2 * k as u64,
        )?;
        let problems = verify(api, ns, &|name| starts.get(name).copied().unwrap_or(1))?;
        failures.extend(problems.into_iter().map(|p| format!("recovery: {p}")));
        Ok(Recovery {
            deleted: Latency::from_samples(&deleted),
            deleted_reaction: Latency::from_samples(&reaction),
            failed: Latency::from_samples(&failed),
            requests,
            starts,
        })
    }

    /// Every pod made not ready (N pod status patches from C connections; on a cluster with a
    /// kubelet it writes its own status back soon after: a second change), so that the
    /// operator's queue fills with routine refreshes; once a quarter of them are sent, while
    /// the rest are still coming, K pods deleted one at a time (from the last object down, so
    /// that none is the one the recovery phase just replaced), each replacement timed as in
    /// `recovery`; then how long until the queue was empty again. The flood runs at
    /// `flood_nice` in a process of its own (see [`flood`]).
    fn load(
        &self,
        ns: &str,
        obs: &Observer,
        op: &mut Operator,
        starts: &mut BTreeMap<String, i64>,
        failures: &mut Vec<String>,
    ) -> Result<Load, Error> {
        let n = self.cfg.objects;
        let k = self.cfg.recovery.min(n);
        let api = self.api();
        let before = self.cluster.snapshot();
        let metrics_before = op.requests_by_method()?;
        let conflicts_before = op.conflicts()?;
        let mut latencies = Vec::with_capacity(k);
        let mut reactions = Vec::with_capacity(k);
        let mut queued = Vec::with_capacity(k);
        let mut during = 0;
        let flood_user = self.flood_user()?;
        let mut flood = Flood::start(
            self.cfg.flood_exe.as_deref(),
            self.cfg.flood_nice,
            flood_user.as_deref().unwrap_or(self.cluster.kubeconfig()),
            ns,
            n,
            self.cfg.connections,
            self.deadline,
        )?;
        while flood.sent() < n / 4 && !flood.is_finished() {
            op.check_alive()?;
            if Instant::now() >= self.deadline {
                return Err(Error::Timeout("load: the flood never got going".into()));
            }
            thread::sleep(Duration::from_millis(1));
        }
        let started = flood.started().unwrap_or_else(Instant::now);
        for j in 0..k {
            let name = format!("ic-{}", n - 1 - j);
            let pod = pod_name(&name);
            let old = obs.uid_of(&pod, "load")?;
            queued.push(op.queue_depth()?);
            api.delete_pod(ns, &pod, &old)?;
            let answered = Instant::now();
            let what = format!("a new pod {pod} after its deletion, under load");
            let (latency, part) = self.replacement(obs, op, &pod, &old, answered, &what)?;
            latencies.push(latency);
            reactions.push(part);
            *starts.entry(name).or_insert(1) += 1;
            if !flood.is_finished() {
                during += 1;
            }
        }
        let flood_runs_in = flood.runs_in.clone();
        let flood_seconds = flood.finish(api, self.deadline)?;
        // Drained: the queue empty twice in a row, a poll apart.
        let mut empty = 0;
        while empty < 2 {
            op.check_alive()?;
            if Instant::now() >= self.deadline {
                return Err(Error::Timeout(
                    "load: the operator's queue never drained".into(),
                ));
            }
            empty = if op.queue_depth()? == 0 { empty + 1 } else { 0 };
            thread::sleep(Duration::from_millis(5));
        }
        let drained_seconds = started.elapsed().as_secs_f64();
        obs.wait_quiet(SETTLE, Instant::now() + SETTLE_MAX);
        wait_requests_quiet(op)?;
        let requests = self.requests(
            &before,
            &self.cluster.snapshot(),
            op,
            Some(&metrics_before),
            conflicts_before,
            k as u64,
        )?;
        let problems = verify(api, ns, &|name| starts.get(name).copied().unwrap_or(1))?;
        failures.extend(problems.into_iter().map(|p| format!("load: {p}")));
        Ok(Load {
            flooded: n,
            flood_seconds,
            flood_runs_in,
            queued_at_deletions: queued,
            replaced_during_flood: during,
            latency: Latency::from_samples(&latencies),
            reaction: Latency::from_samples(&reactions),
            drained_seconds,
            requests,
        })
    }

    /// On the test server, a user of its own for the load phase's flood, whose requests it
    /// serves at the flood's niceness: the load generator, client and server side, takes only
    /// the CPU that the operator and the rest of the server leave over.
    /// Returns its kubeconfig; `None` on a real cluster (the flood uses the bench's).
    fn flood_user(&self) -> Result<Option<PathBuf>, Error> {
        let Some(server) = self.cluster.test_server() else {
            return Ok(None);
        };
        let token = format!("flood-{:016x}", immortal_operator::util::rand_u64());
        server.add_user(
            FLOOD_USER,
            &token,
            vec![Rule::new(&["patch"], &["pods/status"])],
        );
        if self.cfg.flood_nice > 0 {
            server.set_user_nice(FLOOD_USER, self.cfg.flood_nice);
        }
        let path = self.logs.join("flood.kubeconfig");
        server
            .write_kubeconfig(&path, &token)
            .map_err(|e| Error::Setup(format!("cannot write {}: {e}", path.display())))?;
        Ok(Some(path))
    }

    /// After convergence: waits until all `n` objects say Ready, or no pod or object has
    /// changed for [`READY_QUIET`], or [`READY_MAX`] passed. Returns how many said Ready and,
    /// when all did, when the last one did.
    fn wait_ready(
        &self,
        obs: &Observer,
        op: &mut Operator,
        n: usize,
    ) -> Result<(usize, Option<Instant>), Error> {
        let limit = (Instant::now() + READY_MAX).min(self.deadline);
        let mut last = (obs.lock().ready, Instant::now());
        loop {
            op.check_alive()?;
            let (ready, quiet) = {
                let s = obs.lock();
                (s.ready, s.last_event.elapsed())
            };
            let now = Instant::now();
            if ready >= n {
                return Ok((ready, Some(if ready != last.0 { now } else { last.1 })));
            }
            if ready != last.0 {
                last = (ready, now);
            }
            if now >= limit || quiet >= READY_QUIET {
                return Ok((ready, None));
            }
            thread::sleep(Duration::from_millis(5));
        }
    }

    /// Waits for a pod named `pod` other than `old` (answered for at `answered`), and returns
    /// how long after the answer it came, and the operator's part of that (see
    /// [`reaction_time`]). The replacement can be seen before the answer is read: that counts
    /// as 0.
    fn replacement(
        &self,
        obs: &Observer,
        op: &mut Operator,
        pod: &str,
        old: &str,
        answered: Instant,
        what: &str,
    ) -> Result<(Duration, Duration), Error> {
        obs.wait_until(
            self.deadline,
            what,
            || op.check_alive(),
            |s| s.pods.get(pod).is_some_and(|p| p.uid != old && !p.deleting),
        )?;
        let s = obs.lock();
        let added = s.pods.get(pod).map(|p| p.added_at);
        let gone = s.gone.get(pod).copied();
        Ok((
            added.map_or(Duration::ZERO, |a| a.saturating_duration_since(answered)),
            reaction_time(added, gone, answered),
        ))
    }

    /// Waits for `n` pods and started objects; returns when the last of each arrived. On
    /// timeout, lists what is still missing.
    fn converge(
        &self,
        ns: &str,
        obs: &Observer,
        op: &mut Operator,
        phase: &str,
        n: usize,
    ) -> Result<Converged, Error> {
        let waited = obs.wait_until(
            self.deadline,
            &format!("{phase} to converge"),
            || op.check_alive(),
            |s| s.converged_at.is_some(),
        );
        if let Err(e) = waited {
            let (pods, started) = {
                let s = obs.lock();
                (s.pods.len(), s.started)
            };
            let missing = verify(self.api(), ns, &|_| 1)
                .map(|p| p.join("; "))
                .unwrap_or_default();
            return Err(match e {
                Error::Timeout(m) => Error::Timeout(format!(
                    "{m}: {pods}/{n} pods, {started}/{n} statuses; {missing}"
                )),
                other => other,
            });
        }
        let s = obs.lock();
        let all = s.converged_at.unwrap_or_else(Instant::now);
        let status = s.status_at.unwrap_or(all);
        Ok(Converged {
            // A status that names its pod proves the pod exists: the two come on different
            // watch streams, and the pods' (with the kubelet's updates in it) can lag.
            pods: s.pods_at.unwrap_or(all).min(status),
            status,
            all,
        })
    }

    /// The operator's requests between two snapshots: the server's counts minus the bench's
    /// own where the server's are available, its /metrics otherwise (and as a cross-check).
    fn requests(
        &self,
        before: &Snapshot,
        after: &Snapshot,
        op: &Operator,
        metrics_before: Option<&BTreeMap<String, u64>>,
        conflicts_before: u64,
        pods_created: u64,
    ) -> Result<Requests, Error> {
        let conflicts = op.conflicts()?.saturating_sub(conflicts_before);
        let metrics = cluster::diff(
            &op.requests_by_method()?,
            metrics_before.unwrap_or(&Counts::new()),
        );
        let metrics_total = metrics.values().sum();
        let (by_verb, source) = match cluster::operator_requests(before, after) {
            Some(c) => (c, "test server"),
            None => (metrics, "operator metrics"),
        };
        let total: u64 = by_verb.values().sum();
        let startup = by_verb
            .iter()
            .filter(|(verb, _)| is_startup(verb))
            .map(|(_, n)| n)
            .sum();
        let writes_by_kind = report::writes_by_kind(&by_verb);
        let writes: u64 = writes_by_kind.values().sum();
        let without_events = report::writes_without_events(&writes_by_kind);
        Ok(Requests {
            pods_created,
            total,
            startup,
            per_pod_created: (total - startup) as f64 / pods_created.max(1) as f64,
            writes_per_pod_created: writes as f64 / pods_created.max(1) as f64,
            writes_per_pod_created_without_events: without_events as f64
                / pods_created.max(1) as f64,
            writes_by_kind,
            by_verb,
            source: source.into(),
            metrics_total: Some(metrics_total),
            conflicts,
        })
    }
}

/// The operator's writes between two snapshots, Events aside, over `n` objects; `None` where
/// the server's counts are not available.
fn writes_without_events_per(before: &Snapshot, after: &Snapshot, n: usize) -> Option<f64> {
    let by_kind = report::writes_by_kind(&cluster::operator_requests(before, after)?);
    Some(report::writes_without_events(&by_kind) as f64 / n.max(1) as f64)
}

/// The longest a phase waits for the operator's requests to stop (its Event writer works
/// through a backlog after the last pod: about 2 s for 1,000 Events at 2 ms a round trip).
const REQUESTS_QUIET_MAX: Duration = Duration::from_secs(30);

/// Waits until the operator's request count (its /metrics) has not moved for [`SETTLE`], at
/// most [`REQUESTS_QUIET_MAX`]: a phase's requests are counted once its Events are written,
/// not while they still trickle into the next phase.
fn wait_requests_quiet(op: &Operator) -> Result<(), Error> {
    let limit = Instant::now() + REQUESTS_QUIET_MAX;
    let mut last = (u64::MAX, Instant::now());
    loop {
        let total: u64 = op.requests_by_method()?.values().sum();
        let now = Instant::now();
        if total != last.0 {
            last = (total, now);
        } else if now.duration_since(last.1) >= SETTLE || now >= limit {
            return Ok(());
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// When a phase's objects converged, as the bench's watch saw it.
struct Converged {
    /// Every object's pod existed.
    pods: Instant,
    /// Every object's status named its pod.
    status: Instant,
    /// Both: the later of the two.
    all: Instant,
}

impl Converged {
    /// Seconds from `start` until every pod, until every status, until both.
    fn seconds_since(&self, start: Instant) -> (f64, f64, f64) {
        let secs = |t: Instant| t.saturating_duration_since(start).as_secs_f64();
        (secs(self.pods), secs(self.status), secs(self.all))
    }
}

/// What the recovery phase measured.
struct Recovery {
    deleted: Latency,
    deleted_reaction: Latency,
    failed: Latency,
    requests: Requests,
    /// Each object's `startTimes` as it should be now.
    starts: BTreeMap<String, i64>,
}

/// The operator's own part of a replacement: from the old pod's DELETED event (the moment it
/// could know the name is free; before it, a kubelet is still ending the pod) to the new pod's
/// ADDED event, both as the bench's watch saw them. Without a DELETED event seen after the
/// deletion was answered (the replacement seen first), it is 0.
fn reaction_time(added: Option<Instant>, gone: Option<Instant>, answered: Instant) -> Duration {
    match (added, gone) {
        (Some(a), Some(g)) => a.saturating_duration_since(g.max(answered)),
        _ => Duration::ZERO,
    }
}

/// Whether a test server count (`"verb resource"`) is one an operator makes once per start:
/// discovery (`get /apis/...`), lists and watches. Per-object work is get, create, patch and
/// delete of named objects.
fn is_startup(verb: &str) -> bool {
    verb.starts_with("list ") || verb.starts_with("watch ") || verb.starts_with("get /")
}

/// The status the operator writes after creating an object's first pod, as the same merge
/// patch (built by the operator's own function), so the floor's patches cost the server what
/// the operator's do.
pub fn first_status_patch(ic: &ImmortalContainer, pod: &Pod) -> Value {
    let generation = ic.metadata.generation;
    let want = ImmortalContainerStatus {
        current_pod: Some(pod.metadata.name.clone()),
        start_times: Some(1),
        last_counted_pod_uid: Some(pod.metadata.uid.clone()),
        observed_generation: generation,
        pod_phase: Some("Pending".into()),
        conditions: vec![Condition {
            type_: "Ready".into(),
            status: "False".into(),
            observed_generation: generation,
            last_transition_time: immortal_operator::util::now_rfc3339(),
            reason: "PodPending".into(),
            message: format!("pod {} is pending", pod.metadata.name),
        }],
    };
    let rv = &ic.metadata.resource_version;
    reconcile::status_patch(rv, &ic.status, &want, |_| false)
        .unwrap_or_else(|| serde_json::json!({}))
}

/// Runs `f(0..n)` on `threads` threads (thread t takes t, t + threads, ...) and returns the
/// results in index order; the first error (or the deadline) stops every thread.
pub fn parallel<T: Send>(
    n: usize,
    threads: usize,
    deadline: Instant,
    f: impl Fn(usize) -> Result<T, Error> + Sync,
) -> Result<Vec<T>, Error> {
    let threads = threads.clamp(1, n.max(1));
    let slots: Mutex<Vec<Option<T>>> = Mutex::new((0..n).map(|_| None).collect());
    let failed: Mutex<Option<Error>> = Mutex::new(None);
    let stop = std::sync::atomic::AtomicBool::new(false);
    thread::scope(|s| {
        for t in 0..threads {
            let (f, slots, failed, stop) = (&f, &slots, &failed, &stop);
            s.spawn(move || {
                for i in (t..n).step_by(threads) {
                    if stop.load(std::sync::atomic::Ordering::Relaxed) {
                        return;
                    }
                    let r = if Instant::now() >= deadline {
                        Err(Error::Timeout("the run's time budget ran out".into()))
                    } else {
                        f(i)
                    };
                    match r {
                        Ok(v) => slots.lock().unwrap_or_else(|p| p.into_inner())[i] = Some(v),
                        Err(e) => {
                            stop.store(true, std::sync::atomic::Ordering::Relaxed);
                            failed
                                .lock()
                                .unwrap_or_else(|p| p.into_inner())
                                .get_or_insert(e);
                            return;
                        }
                    }
                }
            });
        }
    });
    if let Some(e) = failed.into_inner().unwrap_or_else(|p| p.into_inner()) {
        return Err(e);
    }
    let slots = slots.into_inner().unwrap_or_else(|p| p.into_inner());
    // Every slot is filled when no thread failed.
    Ok(slots.into_iter().flatten().collect())
}

/// Lists `ns` and checks every object against what the operator promises: `status.startTimes`
/// equal to `want_starts(name)`, `currentPod` naming its pod, that pod existing, controlled by
/// the object, labelled, annotated and running `spec.image` in `acontainer`; and no other pod.
/// Returns the problems found (empty: correct).
pub fn verify(
    api: &Api,
    ns: &str,
    want_starts: &dyn Fn(&str) -> i64,
) -> Result<Vec<String>, Error> {
    let (ics, _) = api.list_all::<ImmortalContainer>(IMMORTAL_CONTAINERS, ns)?;
    let (pods, _) = api.list_all::<Pod>(Resource::PODS, ns)?;
    let mut pods: BTreeMap<String, Pod> = pods
        .into_iter()
        .map(|p| (p.metadata.name.clone(), p))
        .collect();
    let mut problems = Vec::new();
    for ic in &ics {
        let name = &ic.metadata.name;
        let pod_name = pod_name(name);
        let want = want_starts(name);
        if ic.status.start_times != Some(want) {
            problems.push(format!(
                "{name}: startTimes {}, want {want}",
                ic.status
                    .start_times
                    .map_or_else(|| "unset".to_string(), |n| n.to_string())
            ));
        }
        if ic.status.current_pod.as_deref() != Some(pod_name.as_str()) {
            problems.push(format!(
                "{name}: currentPod {:?}, want {pod_name:?}",
                ic.status.current_pod
            ));
        }
        match pods.remove(&pod_name) {
            None => problems.push(format!("{name}: pod {pod_name} missing")),
            Some(pod) => problems.extend(pod_problems(ic, &pod)),
        }
    }
    problems.extend(pods.keys().map(|p| format!("extra pod {p}")));
    if problems.len() > MAX_LISTED {
        let more = problems.len() - MAX_LISTED;
        problems.truncate(MAX_LISTED);
        problems.push(format!("... and {more} more"));
    }
    Ok(problems)
}

/// What is wrong with `pod` as the pod of `ic`.
fn pod_problems(ic: &ImmortalContainer, pod: &Pod) -> Vec<String> {
    let name = &pod.metadata.name;
    let mut out = Vec::new();
    match pod.metadata.controller() {
        Some(o) if o.uid == ic.metadata.uid && o.block_owner_deletion == Some(true) => {}
        other => out.push(format!(
            "pod {name}: controller {other:?}, want {}",
            ic.metadata.uid
        )),
    }
    let labels = &pod.metadata.labels;
    if labels.get(MANAGED_BY_LABEL).map(String::as_str) != Some(MANAGED_BY_VALUE)
        || labels.get(OWNER_UID_LABEL) != Some(&ic.metadata.uid)
    {
        out.push(format!("pod {name}: labels {labels:?}"));
    }
    let annotated = pod.metadata.annotations.get(IMAGE_ANNOTATION);
    if annotated != Some(&ic.spec.image) {
        out.push(format!("pod {name}: image annotation {annotated:?}"));
    }
    let containers: Vec<(&str, &str)> = pod
        .spec
        .containers
        .iter()
        .map(|c| (c.name.as_str(), c.image.as_str()))
        .collect();
    if containers != [(CONTAINER_NAME, ic.spec.image.as_str())] {
        out.push(format!("pod {name}: containers {containers:?}"));
    }
    if pod.metadata.deletion_timestamp.is_some() || matches!(pod.phase(), "Succeeded" | "Failed") {
        out.push(format!(
            "pod {name}: not running (phase {:?}, deleting {})",
            pod.phase(),
            pod.metadata.deletion_timestamp.is_some()
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use immortal_operator::immortal::types::ImmortalContainerSpec;
    use immortal_operator::kube::types::ObjectMeta;

    #[test]
    fn the_typical_template_is_about_a_kilobyte_and_keeps_the_pod_checkable() {
        let t = typical_template();
        let size = serde_json::to_vec(&t).unwrap().len();
        assert!((900..=1300).contains(&size), "{size} bytes");
        // Only acontainer, so the bench's check of the pod's containers holds as it is.
        assert_eq!(t["spec"]["containers"].as_array().unwrap().len(), 1);
        assert_eq!(t["spec"]["containers"][0]["name"], CONTAINER_NAME);
    }

    #[test]
    fn startup_requests_are_discovery_lists_and_watches_only() {
        for verb in [
            "list pods",
            "watch immortalcontainers",
            "get /apis/immortalcontainer.flugel.it/v1alpha1",
        ] {
            assert!(is_startup(verb), "{verb}");
        }
        for verb in [
            "get immortalcontainers",
            "create pods",
            "patch immortalcontainers/status",
            "delete pods",
            "create events",
        ] {
            assert!(!is_startup(verb), "{verb}");
        }
    }

    #[test]
    fn the_operators_part_starts_at_the_old_pods_deleted_event() {
        let t = Instant::now();
        let ms = Duration::from_millis;
        // Answered at t, the kubelet ended the pod 40 ms later, the new pod came 2 ms after.
        assert_eq!(reaction_time(Some(t + ms(42)), Some(t + ms(40)), t), ms(2));
        // The DELETED event seen before the answer was read: measured from the answer.
        assert_eq!(reaction_time(Some(t + ms(3)), Some(t - ms(1)), t), ms(3));
        // No DELETED event or no new pod seen: nothing to measure.
        assert_eq!(reaction_time(Some(t + ms(3)), None, t), Duration::ZERO);
        assert_eq!(reaction_time(None, Some(t), t), Duration::ZERO);
    }

    #[test]
    fn parallel_returns_results_in_index_order() {
        let deadline = Instant::now() + Duration::from_secs(10);
        let got = parallel(10, 3, deadline, |i| Ok(i * 2)).expect("no error");
        assert_eq!(got, (0..10).map(|i| i * 2).collect::<Vec<_>>());
    }

    #[test]
    fn parallel_stops_at_the_first_error() {
        let deadline = Instant::now() + Duration::from_secs(10);
        let got = parallel(100, 4, deadline, |i| {
            if i == 7 {
                Err(Error::Setup("seven".into()))
            } else {
                Ok(i)
            }
        });
        assert!(matches!(got, Err(Error::Setup(m)) if m == "seven"));
    }

    #[test]
    fn parallel_gives_up_past_the_deadline() {
        let got = parallel(3, 1, Instant::now(), Ok);
        assert!(matches!(got, Err(Error::Timeout(_))));
    }

    #[test]
    fn the_floors_status_patch_is_the_operators_first_write() {
        let ic = ImmortalContainer {
            metadata: ObjectMeta {
                name: "a".into(),
                uid: "u1".into(),
                resource_version: "42".into(),
                generation: Some(1),
                ..Default::default()
            },
            spec: ImmortalContainerSpec {
                image: "nginx".into(),
                ..Default::default()
            },
            ..Default::default()
        };
        let mut pod = desired::desired_pod(&ic, true);
        pod.metadata.uid = "p1".into();
        let patch = first_status_patch(&ic, &pod);
        assert_eq!(patch["status"]["startTimes"], 1);
        assert_eq!(patch["status"]["currentPod"], "a-immortalpod");
        assert_eq!(patch["status"]["lastCountedPodUID"], "p1");
        assert_eq!(patch["status"]["conditions"][0]["type"], "Ready");
        assert_eq!(
            patch["metadata"],
            serde_json::json!({"resourceVersion": "42"})
        );
    }

    #[test]
    fn verify_names_the_missing_pod_the_extra_pod_and_the_wrong_count() {
        let cluster = Cluster::connect(None, 4).expect("test server");
        let ns = cluster.create_namespace("verify").expect("namespace");
        let api = &cluster.api;
        let good = api
            .create_immortal_container(&ns, "good", "nginx", None)
            .expect("ic");
        let pod = api
            .create_pod(&ns, &desired::desired_pod(&good, true))
            .expect("pod");
        api.patch_status(&ns, "good", &first_status_patch(&good, &pod))
            .expect("status");
        assert_eq!(
            verify(api, &ns, &|_| 1).expect("verify"),
            Vec::<String>::new()
        );

        api.create_immortal_container(&ns, "lonely", "nginx", None)
            .expect("ic");
        let mut stray = desired::desired_pod(&good, true);
        stray.metadata.name = "stray".into();
        api.create_pod(&ns, &stray).expect("stray pod");
        let problems =
            verify(api, &ns, &|name| if name == "good" { 2 } else { 1 }).expect("verify");
        assert_eq!(
            problems,
            [
                "good: startTimes 1, want 2",
                "lonely: startTimes unset, want 1",
                "lonely: currentPod None, want \"lonely-immortalpod\"",
                "lonely: pod lonely-immortalpod missing",
                "extra pod stray",
            ]
        );
    }

    #[test]
    fn a_pod_built_by_the_operator_has_no_problems_and_a_stranger_has_several() {
        let ic = ImmortalContainer {
            metadata: ObjectMeta {
                name: "a".into(),
                uid: "u1".into(),
                ..Default::default()
            },
            spec: ImmortalContainerSpec {
                image: "nginx".into(),
                ..Default::default()
            },
            ..Default::default()
        };
        let pod = desired::desired_pod(&ic, true);
        assert_eq!(pod_problems(&ic, &pod), Vec::<String>::new());
        let stranger = Pod {
            metadata: ObjectMeta {
                name: "a-immortalpod".into(),
                ..Default::default()
            },
            ..Default::default()
        };
        assert_eq!(pod_problems(&ic, &stranger).len(), 4);
    }
}
