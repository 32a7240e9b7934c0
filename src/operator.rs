//! Wires the stages together: cluster config → client → watcher threads → (leader election) →
//! reconcile workers, and takes them down in order on SIGTERM/SIGINT.
//!
//! Shutdown follows the ripgrep/crossbeam pattern: one `quit` channel whose sender is dropped
//! to wake every blocking loop at once; the queue is shut down so workers finish their
//! in-flight reconcile and return, within `DRAIN_TIMEOUT`; the leader releases its Lease;
//! the process exits 0, all within the Deployment's grace period even when the API server
//! hangs. A second signal exits at once.

use crate::cli::Config;
use crate::immortal::counting::{self, Counting};
use crate::immortal::lifecycle::{self, IcEvents, PodEvents, PodHint};
use crate::immortal::reconcile::{self, LiveApi, Memory};
use crate::immortal::store::IcStore;
use crate::immortal::sweep;
use crate::immortal::types::{API_VERSION, GROUP, IMMORTAL_CONTAINERS, KIND, PLURAL, VERSION};
use crate::kube::client::{self, Client};
use crate::kube::config::{self, LoadOptions};
use crate::kube::events::{self, Recorder};
use crate::runtime::allocator;
use crate::runtime::controller::{self, is_quitting, listen_for_signals, spawn_watcher, Sentinel};
use crate::runtime::leader::{self, Elector};
use crate::runtime::metrics;
use crate::runtime::pool::Pool;
use crate::runtime::queue::Queue;
use crate::runtime::serve::{self, Health};
use crate::runtime::watcher::{Backoff, Resync, Watcher};
use crossbeam_channel::{select, Receiver, Sender};
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

/// `source.component` and `reportingComponent` of our Events.
const COMPONENT: &str = "immortal-operator";

/// How long start-up keeps trying to reach the API server (and find our CRD) before it gives
/// up with a clear message instead of retrying silently forever.
const PREFLIGHT_PATIENCE: Duration = Duration::from_secs(30);

/// Longest one start-up check may wait for an answer. The check runs on the thread that answers
/// signals, so this bounds how long a SIGTERM during start-up waits on a hung API server.
const PREFLIGHT_ATTEMPT: Duration = Duration::from_secs(5);

/// How long a shutdown waits for the reconciles in flight, and the Events they recorded, to
/// finish. What still waits on the API server then is abandoned: a blocking request cannot be
/// cancelled, but nothing has to wait for it, the process exits under it. With
/// [`RELEASE_TIMEOUT`] this keeps a shutdown within 7 s, inside the Deployment's
/// `terminationGracePeriodSeconds: 10` (config/manager); past it the kubelet kills the
/// process, which then cannot release the Lease.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// Longest the Lease release may take at shutdown.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(2);

/// Exit code for a configuration or cluster problem found at start.
const EXIT_CONFIG: u8 = 1;

/// Runs the operator until a signal; returns the process exit code.
pub fn run(config: Config) -> ExitCode {
    // Each stage answers `Err(code)` when the process is to exit now: a clear message at
    // start-up, a dead thread, or a signal before reconciling began.
    match run_stages(&config) {
        Ok(code) | Err(code) => code,
    }
}

/// The stages, in order: connect, checks, endpoints, watchers and their first lists, the
/// Lease, the workers; then wait for a signal or a dead thread, and shut down.
fn run_stages(config: &Config) -> Result<ExitCode, ExitCode> {
    let (client, cluster) = connect(config)?;

    // The first signal drops `quit_tx`, waking every loop that selects on `quit`.
    let (quit_tx, quit) = crossbeam_channel::bounded::<()>(0);
    listen_for_signals(quit_tx)
        .map_err(|e| fail_at_start(&format!("cannot install signal handlers: {e}")))?;

    // Start-up checks and the watchers' lists come minutes apart: their connections are not
    // kept (see `Client::unpooled`), so an idle operator holds only its two watch streams.
    let once = client.unpooled();
    preflight(&once, &quit).map_err(|msg| fail_at_start(&msg))?;
    if is_quitting(&quit) {
        return Ok(ExitCode::SUCCESS);
    }
    let memory = Arc::new(Memory::new());
    check_crd_schema(&once, &memory);

    let health = Arc::new(Health::new(
        vec![IMMORTAL_CONTAINERS.short(), client::Resource::PODS.short()],
        config.watch_idle_timeout,
    ));
    let host = cluster
        .server
        .trim_start_matches("https://")
        .trim_start_matches("http://")
        .split('/')
        .next()
        .unwrap_or("")
        .to_string();
    serve::start(&config.endpoints, health.clone(), host, &client)
        .map_err(|msg| fail_at_start(&msg))?;

    let queue: Arc<Queue<PodHint>> = Arc::new(Queue::new());
    let (dead_tx, dead) = crossbeam_channel::unbounded::<&'static str>();
    let ic_resync = Resync::every(config.resync_period);
    // What the ImmortalContainer watcher knows, which reconcile reads instead of the API.
    let ics = Arc::new(IcStore::new());
    let synced = start_watchers(
        config, &once, &queue, &quit, &health, &dead_tx, &ic_resync, &ics,
    )?;
    wait_for_lists(&synced, &dead, &quit, &health)?;
    recheck_crd(&once, &memory, ic_resync, &quit)?;
    start_sweep(config, &once, &queue, &quit)?;

    let (stop_renewing_tx, stop_renewing) = crossbeam_channel::bounded::<()>(0);
    let elector = elect(
        config,
        &client,
        cluster.default_namespace,
        &quit,
        stop_renewing,
    )?;
    // Every write goes through the leader's fence: none is sent once the Lease may have passed.
    let writer = match &elector {
        Some(e) => client.fenced(e.fence()),
        None => client.clone(),
    };
    // Each worker and the events thread hold a sender; all are gone once they have all ended.
    let (finished_tx, finished) = crossbeam_channel::bounded::<()>(0);
    let identity = elector
        .as_ref()
        .map(|e| e.identity().to_string())
        .unwrap_or_else(leader::identity);
    start_workers(
        config,
        writer,
        identity,
        &queue,
        &memory,
        ics,
        &health,
        &dead_tx,
        &finished_tx,
    )?;

    select! {
        recv(quit) -> _ => {}
        recv(dead) -> r => {
            let what = r.unwrap_or("thread");
            return Err(fail_running(&format!("a {what} thread died; exiting so the kubelet restarts the operator")));
        }
    }

    shut_down(
        &queue,
        finished_tx,
        &finished,
        elector.as_deref(),
        stop_renewing_tx,
    );
    Ok(ExitCode::SUCCESS)
}

/// Graceful shutdown: workers finish the reconcile they are in (abandoned after
/// [`DRAIN_TIMEOUT`]), then the lease goes.
fn shut_down(
    queue: &Queue<PodHint>,
    finished_tx: Sender<()>,
    finished: &Receiver<()>,
    elector: Option<&Elector>,
    stop_renewing_tx: Sender<()>,
) {
    log::info!(target: "controller", "shutting down: finishing in-flight reconciles");
    let started = Instant::now();
    queue.shutdown();
    drop(finished_tx);
    if let Err(crossbeam_channel::RecvTimeoutError::Timeout) =
        finished.recv_deadline(started + DRAIN_TIMEOUT)
    {
        log::warn!(
            target: "controller", elapsed_ms = started.elapsed().as_millis() as u64;
            "in-flight reconciles still wait on the API server; abandoning them"
        );
    }
    if let Some(e) = elector {
        drop(stop_renewing_tx);
        e.release(RELEASE_TIMEOUT);
    }
    log::info!(target: "controller", elapsed_ms = started.elapsed().as_millis() as u64; "stopped");
    log::logger().flush();
}

/// What start-up learned of the cluster besides the client.
struct ClusterFacts {
    server: String,
    default_namespace: Option<String>,
}

/// Loads the configuration and builds the client every thread shares.
fn connect(config: &Config) -> Result<(Client, ClusterFacts), ExitCode> {
    let opts = LoadOptions {
        kubeconfig: config.kubeconfig.clone(),
        context: config.context.clone(),
    };
    let cluster = config::load(&opts).map_err(|e| fail_at_start(&e.to_string()))?;
    let source = cluster.source.clone();
    let proxy = cluster.proxy.as_ref().map(|p| p.shown.clone());
    let facts = ClusterFacts {
        server: cluster.server.clone(),
        default_namespace: cluster.default_namespace.clone(),
    };
    // One connection per worker, one per watcher, one for events and one for the lease.
    // Workers beyond --workers keep theirs when they end: a pool of 20 under 64 workers closed
    // and reopened TLS connections all through a backlog (operator CPU 0.70 s against 0.54 s
    // in the bench, and a handshake each on the API server). Every request of every client
    // made from this one is counted in the metrics.
    let client = Client::new(cluster, config.max_workers + 4)
        .map_err(|e| fail_at_start(&e.to_string()))?
        .reporting(metrics::record_request);
    log::info!(
        target: "controller",
        server = facts.server.as_str(), config = source.as_str(),
        proxy = proxy.as_deref().unwrap_or("none"),
        namespace = config.namespace.as_deref().unwrap_or("(all)"), workers = config.workers as u64,
        version = env!("CARGO_PKG_VERSION");
        "starting"
    );
    Ok((client, facts))
}

/// Watchers: ImmortalContainers and our pods. They fill the queue from their first list on,
/// also while this replica stands by, so a new leader starts with a warm queue. Answers the
/// channel on which each reports its first list.
#[allow(clippy::too_many_arguments)]
fn start_watchers(
    config: &Config,
    once: &Client,
    queue: &Arc<Queue<PodHint>>,
    quit: &Receiver<()>,
    health: &Arc<Health>,
    dead_tx: &Sender<&'static str>,
    ic_resync: &Resync,
    ics: &Arc<IcStore>,
) -> Result<Receiver<&'static str>, ExitCode> {
    let (synced_tx, synced) = crossbeam_channel::unbounded();
    let sentinel = || Sentinel {
        health: health.clone(),
        dead: dead_tx.clone(),
        name: "watcher",
    };
    let watchers = [
        spawn_watcher(
            Watcher::new(
                once.clone(),
                lifecycle::immortal_containers_kind(config.namespace.clone()),
                IcEvents,
                queue.clone(),
                quit.clone(),
                synced_tx.clone(),
                config.watch_idle_timeout,
            )
            .resyncing(ic_resync.clone())
            .sharing(ics.clone()),
            sentinel(),
        ),
        spawn_watcher(
            Watcher::new(
                once.clone(),
                lifecycle::pods_kind(config.namespace.clone()),
                PodEvents,
                queue.clone(),
                quit.clone(),
                synced_tx,
                config.watch_idle_timeout,
            )
            .resyncing(Resync::every(config.resync_period)),
            sentinel(),
        ),
    ];
    for spawned in watchers {
        if let Err(e) = spawned {
            return Err(fail_at_start(&format!("cannot start watcher thread: {e}")));
        }
    }
    Ok(synced)
}

/// Reconcile starts once both first lists are in: before that, a missing pod may only be
/// missing from a list not yet read.
fn wait_for_lists(
    synced: &Receiver<&'static str>,
    dead: &Receiver<&'static str>,
    quit: &Receiver<()>,
    health: &Health,
) -> Result<(), ExitCode> {
    let mut pending = 2;
    while pending > 0 {
        select! {
            recv(synced) -> r => match r {
                Ok(resource) => {
                    pending -= 1;
                    health.synced.fetch_add(1, Ordering::Relaxed);
                    log::info!(target: "controller", resource = resource; "initial list complete");
                }
                Err(_) => return Err(fail_running("a watcher stopped before its first list")),
            },
            recv(dead) -> _ => return Err(fail_running("a watcher thread died")),
            recv(quit) -> _ => return Err(stopped()),
        }
    }
    Ok(())
}

/// With `--leader-elect`, waits until this replica holds the Lease, and keeps renewing it on a
/// thread of its own until `stop_renewing` closes; without, this replica leads.
fn elect(
    config: &Config,
    client: &Client,
    default_ns: Option<String>,
    quit: &Receiver<()>,
    stop_renewing: Receiver<()>,
) -> Result<Option<Arc<Elector>>, ExitCode> {
    let Some(flags) = &config.leader else {
        metrics::set_leader(true);
        return Ok(None);
    };
    let namespace = flags
        .namespace
        .clone()
        .or(default_ns)
        .unwrap_or_else(|| "default".into());
    let settings = leader::Settings {
        namespace,
        name: flags.name.clone(),
        identity: leader::identity(),
        lease_duration: flags.lease_duration,
        renew_deadline: flags.renew_deadline,
        retry_period: flags.retry_period,
    };
    let elector = Arc::new(Elector::new(client.clone(), settings));
    // Acquiring and renewing happen on a thread of their own, so that a signal is answered at
    // once even while a request to a hung API server is pending. Renewal goes on during
    // shutdown until the release, so reconciles finishing are not fenced.
    let (leading_tx, leading) = crossbeam_channel::bounded::<()>(1);
    let (e, quit_acquiring) = (elector.clone(), quit.clone());
    let spawned = thread::Builder::new().name("lease".into()).spawn(move || {
        if !e.acquire(&quit_acquiring) {
            return;
        }
        let _ = leading_tx.send(());
        if e.keep_renewing(&stop_renewing).is_err() {
            // The fence is closed already: nothing more is written while we exit.
            log::logger().flush();
            std::process::exit(1);
        }
    });
    if let Err(e) = spawned {
        return Err(fail_running(&format!("cannot start lease thread: {e}")));
    }
    select! {
        recv(leading) -> r => if r.is_err() { return Err(stopped()) },
        recv(quit) -> _ => return Err(stopped()),
    }
    Ok(Some(elector))
}

/// The Event recorder's thread and the reconcile workers, all writing through `writer`.
#[allow(clippy::too_many_arguments)]
fn start_workers(
    config: &Config,
    writer: Client,
    identity: String,
    queue: &Arc<Queue<PodHint>>,
    memory: &Arc<Memory>,
    ics: Arc<IcStore>,
    health: &Arc<Health>,
    dead_tx: &Sender<&'static str>,
    finished_tx: &Sender<()>,
) -> Result<(), ExitCode> {
    let (recorder, event_rx) = Recorder::channel(events::Kind {
        api_version: API_VERSION,
        kind: KIND,
    });
    let recorder = recorder.reporting_drops(metrics::events_dropped);
    {
        let (client, finished) = (writer.clone(), finished_tx.clone());
        if let Err(e) = thread::Builder::new().name("events".into()).spawn(move || {
            let _finished = finished;
            let _cache = allocator::cache_this_thread();
            events::run(client, event_rx, COMPONENT, identity)
        }) {
            return Err(fail_running(&format!("cannot start events thread: {e}")));
        }
    }
    let workers = Arc::new(Workers {
        queue: queue.clone(),
        api: Arc::new(LiveApi {
            client: writer,
            events: recorder,
            ics,
        }),
        memory: memory.clone(),
        pool: Pool::new(config.workers, config.max_workers),
        run_id: crate::util::rand_u64() as u16,
        health: health.clone(),
        dead: dead_tx.clone(),
        finished: finished_tx.clone(),
        started: AtomicUsize::new(0),
    });
    for _ in 0..config.workers {
        if !workers.pool.start() {
            break;
        }
        if let Err(e) = workers.spawn() {
            return Err(fail_running(&format!("cannot start worker thread: {e}")));
        }
    }
    log::info!(
        target: "controller", workers = config.workers as u64, max_workers = workers.pool.max() as u64;
        "reconciling"
    );
    Ok(())
}

/// What every reconcile worker shares, and how one more is started: by a worker that takes a
/// key while others wait (see `runtime::pool`). Only the workers hold it, so the senders in it
/// are gone once the last worker has ended.
struct Workers {
    queue: Arc<Queue<PodHint>>,
    api: Arc<LiveApi>,
    memory: Arc<Memory>,
    pool: Pool,
    run_id: u16,
    health: Arc<Health>,
    dead: Sender<&'static str>,
    /// Held until the last worker ends: what the shutdown waits for.
    #[allow(dead_code)]
    finished: Sender<()>,
    /// Workers started so far, to name the next thread.
    started: AtomicUsize,
}

impl Workers {
    /// Starts one worker thread, already counted in the pool.
    fn spawn(self: &Arc<Self>) -> std::io::Result<()> {
        let i = self.started.fetch_add(1, Ordering::Relaxed);
        let sentinel = Sentinel {
            health: self.health.clone(),
            dead: self.dead.clone(),
            name: "worker",
        };
        let me = self.clone();
        thread::Builder::new()
            .name(format!("reconcile-{i}"))
            .spawn(move || {
                let _sentinel = sentinel;
                let _cache = allocator::cache_this_thread();
                controller::work(
                    &me.queue,
                    me.run_id,
                    &me.pool,
                    || match me.spawn() {
                        Ok(()) => true,
                        Err(e) => {
                            log::warn!(target: "controller", error = e.to_string().as_str(); "cannot start one worker more");
                            false
                        }
                    },
                    |trace, hint| reconcile::reconcile(&*me.api, &me.memory, trace, hint),
                )
            })
            .map(drop)
    }
}

/// Checks, before anything starts, that the server answers and serves our resource: a wrong
/// kubeconfig, refused credentials or a missing CRD end the program with a message that says
/// which. Unreachable servers and a CRD not yet established are retried for a while, since both
/// happen briefly when a cluster and the operator are deployed together.
///
/// One WARN line says what is wrong and that it is retried; further attempts that fail the same
/// way log at DEBUG, a different failure WARNs again, and giving up is the caller's one message.
/// (A line per attempt, each with the error twice, was six lines saying one thing.)
fn preflight(client: &Client, quit: &Receiver<()>) -> Result<(), String> {
    let path = format!("/apis/{GROUP}/{VERSION}");
    let deadline = Instant::now() + PREFLIGHT_PATIENCE;
    let mut backoff = Backoff::new();
    let mut warned: Option<String> = None;
    loop {
        let attempt = client.until(Instant::now() + PREFLIGHT_ATTEMPT);
        let err = match attempt.get_path::<serde_json::Value>(&path) {
            Ok(_) => return Ok(()),
            Err(e) => e,
        };
        let server = &client.config().server;
        // What is wrong, without the error itself: it goes into the `error` field once.
        let what = match &err {
            e if e.is_unauthorized() => {
                return Err(format!("the API server at {server} refused our credentials (401 Unauthorized); check the kubeconfig user"))
            }
            e if e.is_forbidden() => return Err(format!("the API server at {server} forbids reading {path}: {e}")),
            e if e.is_not_found() => format!(
                "the API server at {server} does not serve {GROUP}/{VERSION}: the ImmortalContainer CRD is not installed \
                 (install it with `make install` or `kubectl apply -k config/crd`)"
            ),
            client::Error::Credentials(e) => return Err(format!("cannot get credentials: {e}")),
            client::Error::Tls(e) => match client.config().tls_misconfigured(e) {
                Some(line) => return Err(line),
                None => format!("cannot reach the API server at {server}"),
            },
            _ => format!("cannot reach the API server at {server}"),
        };
        if Instant::now() >= deadline {
            let patience = PREFLIGHT_PATIENCE.as_secs();
            return Err(if err.is_not_found() {
                format!("{what} (waited {patience}s)")
            } else {
                format!("{what} (tried for {patience}s): {err}")
            });
        }
        let error = err.to_string();
        if warned.as_deref() == Some(what.as_str()) {
            log::debug!(target: "controller", error = error.as_str(); "{what}; retrying");
        } else {
            log::warn!(
                target: "controller", error = error.as_str();
                "{what}; retrying for up to {}s", PREFLIGHT_PATIENCE.as_secs()
            );
            warned = Some(what);
        }
        let wait = backoff
            .next_delay()
            .min(deadline.saturating_duration_since(Instant::now()));
        if !matches!(
            quit.recv_timeout(wait),
            Err(crossbeam_channel::RecvTimeoutError::Timeout)
        ) {
            return Ok(());
        }
    }
}

/// The start-up sweep for pods holding our finalizer unseen (see `sweep`), on a thread of its
/// own so that reconciling does not wait for it.
fn start_sweep(
    config: &Config,
    once: &Client,
    queue: &Arc<Queue<PodHint>>,
    quit: &Receiver<()>,
) -> Result<(), ExitCode> {
    let (client, queue, quit) = (once.clone(), queue.clone(), quit.clone());
    let namespace = config.namespace.clone();
    let spawned = thread::Builder::new().name("sweep".into()).spawn(move || {
        let started = Instant::now();
        match sweep::sweep(&client, namespace.as_deref(), &queue, &quit) {
            Ok(s) => log::info!(
                target: "sweep",
                pods = s.pods as u64, pages = s.pages as u64, found = s.found as u64,
                elapsed_ms = started.elapsed().as_millis() as u64;
                "swept every pod's metadata for our finalizer"
            ),
            Err(e) => log::warn!(
                target: "sweep", error = e.to_string().as_str();
                "cannot sweep pods for our finalizer (a pod that lost our label while the operator was down may stay Terminating; the next start sweeps again)"
            ),
        }
    });
    spawned
        .map(|_| ())
        .map_err(|e| fail_running(&format!("cannot start the sweep thread: {e}")))
}

/// Reads the installed CRD's schema once: a CRD older than the operator prunes status fields
/// it does not know, and without `lastCountedPodUID` starts cannot be counted exactly once
/// (see `counting`). Knowing it before the first count keeps that count from being a wrong
/// one. When the CRD cannot be read (RBAC), the first status write tells instead.
fn check_crd_schema(client: &Client, memory: &Memory) {
    if let Some(missing) = read_crd_schema(client) {
        memory
            .counting
            .learn_pruned(&missing, "the installed CRD's schema lacks it");
    }
}

/// The status fields the installed CRD's schema lacks, or `None` when it cannot be read or
/// cannot tell. Bounded like every start-up check.
fn read_crd_schema(client: &Client) -> Option<Vec<&'static str>> {
    let path = format!("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{PLURAL}.{GROUP}");
    let attempt = client.until(Instant::now() + PREFLIGHT_ATTEMPT);
    match attempt.get_path::<serde_json::Value>(&path) {
        Ok(crd) => Counting::missing_in_crd(&crd, VERSION),
        Err(e) => {
            log::debug!(target: "controller", error = e.to_string().as_str(); "cannot read the CRD; an older schema shows on status writes");
            None
        }
    }
}

/// While the CRD prunes something the operator writes, reads it again every
/// [`counting::RECHECK`] on a thread of its own, so that an upgraded CRD (`make install`) is
/// taken up without a restart: fields it keeps are written again, and once it keeps
/// `lastCountedPodUID` counting resumes and `resync` has every object reconciled (see
/// `counting`, Resuming). Costs one GET every 10 s, and only while something is pruned.
fn recheck_crd(
    client: &Client,
    memory: &Arc<Memory>,
    resync: Resync,
    quit: &Receiver<()>,
) -> Result<(), ExitCode> {
    let (client, memory, quit) = (client.clone(), memory.clone(), quit.clone());
    let spawned = thread::Builder::new()
        .name("crd".into())
        .spawn(move || loop {
            if !matches!(
                quit.recv_timeout(counting::RECHECK),
                Err(crossbeam_channel::RecvTimeoutError::Timeout)
            ) {
                return;
            }
            if !memory.counting.any_pruned() {
                continue;
            }
            if let Some(missing) = read_crd_schema(&client) {
                if memory.counting.relearn(&missing) {
                    resync.ask();
                }
            }
        });
    spawned
        .map(|_| ())
        .map_err(|e| fail_running(&format!("cannot start the CRD thread: {e}")))
}

fn fail_at_start(msg: &str) -> ExitCode {
    // One message, where a person looks: plain on stderr; JSON log collectors get it too.
    if crate::runtime::logging::is_json() {
        log::error!(target: "controller", "{msg}");
        log::logger().flush();
    }
    eprintln!("immortal-operator: {msg}");
    ExitCode::from(EXIT_CONFIG)
}

fn fail_running(msg: &str) -> ExitCode {
    log::error!(target: "controller", "{msg}");
    log::logger().flush();
    ExitCode::FAILURE
}

fn stopped() -> ExitCode {
    log::info!(target: "controller", "stopped before reconciling");
    log::logger().flush();
    ExitCode::SUCCESS
}
