//! One pod as a v1.28 kubelet runs it: the containers' lives (start, exit, restart with
//! back-off, failed pulls, SIGTERM and SIGKILL), activeDeadlineSeconds, graceful termination
//! ending in a terminal phase, and the pod status the kubelet writes, in the order the
//! recordings show (tests/fixtures/kube-1.28-kubelet, 03-10).
//!
//! Pure state and decisions: [`PodRun::sync`] is given the pod as stored and the time, and
//! answers what to write; the cluster thread writes it under the store's write lock
//! (`cluster.rs`).
//!
//! Readiness is a real prober's with no probes defined: a container is ready (and `started`)
//! while it runs, and only then. The recordings come from a kubemark hollow node whose fake
//! prober (`probetest.FakeManager`) reports every container ready, even while
//! ContainerCreating or after it terminated; a real node does not.

use crate::runtime::{self, Behaviour};
use serde_json::{json, Map, Value};
use std::time::{Duration, Instant};

/// How fast the simulated kubelets act. The defaults make a pod Running within ~50 ms of its
/// creation and finish a graceful deletion in tens of milliseconds, so tests stay fast.
#[derive(Debug, Clone, PartialEq)]
pub struct KubeletOptions {
    /// From the pod's first status (ContainerCreating) to its containers running; also how
    /// long the kubelet takes to notice an exited container and how long a busybox container
    /// runs before it exits. Default 20 ms.
    pub start_delay: Duration,
    /// How long a container takes to exit after SIGTERM. Default 10 ms.
    pub stop_delay: Duration,
    /// Multiplies the kubelet's own waits on grace periods (SIGKILL at the end of the grace
    /// period); the pod object still says the grace period that was asked for. Default 0.01
    /// (30 s of grace is 300 ms). The node controllers' waits are multiplied too: the node
    /// monitor grace period (40 s), a pod's `tolerationSeconds` before the taint manager
    /// evicts it, the 10 s between two nodes tainted NoExecute.
    pub grace_scale: f64,
    /// Multiplies the restart and image-pull back-offs (10 s doubling to 5 min; messages still
    /// name the unscaled ones). Default 0.01.
    pub backoff_scale: f64,
    /// How long a status written by someone else stays before the kubelet writes its own back
    /// (the recording shows a few seconds). Default 500 ms.
    pub status_sync_delay: Duration,
}

impl Default for KubeletOptions {
    fn default() -> Self {
        KubeletOptions {
            start_delay: Duration::from_millis(20),
            stop_delay: Duration::from_millis(10),
            grace_scale: 0.01,
            backoff_scale: 0.01,
            status_sync_delay: Duration::from_millis(500),
        }
    }
}

/// The kubelet never gives a container less than this to stop
/// (`minimumGracePeriodInSeconds` of the kuberuntime manager).
const MIN_KILL_GRACE_SECS: i64 = 2;

/// One container termination, as `state.terminated` / `lastState.terminated` show it.
#[derive(Debug, Clone, PartialEq)]
struct Term {
    exit_code: i32,
    reason: &'static str,
    message: Option<&'static str>,
    started_at: Option<String>,
    finished_at: Option<String>,
    container_id: Option<String>,
    /// When it happened, for back-off arithmetic.
    at: Instant,
}

impl Term {
    fn to_json(&self) -> Value {
        let mut t = json!({
            "exitCode": self.exit_code,
            "reason": self.reason,
            "startedAt": self.started_at,
            "finishedAt": self.finished_at,
        });
        if let Some(m) = self.message {
            t["message"] = json!(m);
        }
        if let Some(id) = &self.container_id {
            t["containerID"] = json!(id);
        }
        t
    }

    /// A container that never started, in a pod that is now terminal: what the v1.28 kubelet
    /// reports for it.
    fn never_started(at: Instant) -> Term {
        Term {
            exit_code: 137,
            reason: "ContainerStatusUnknown",
            message: Some("The container could not be located when the pod was terminated"),
            started_at: None,
            finished_at: None,
            container_id: None,
            at,
        }
    }
}

/// What a failed pull currently shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PullShown {
    ErrImagePull,
    ImagePullBackOff,
}

#[derive(Debug, Clone, PartialEq)]
enum State {
    /// Waiting (PodInitializing) for the init containers before it to complete.
    Initializing,
    /// Waiting, ContainerCreating (PodInitializing in a pod with init containers), until the
    /// runtime has it started.
    Creating { until: Instant },
    /// Waiting, InvalidImageName: the image reference does not parse; nothing changes.
    InvalidName,
    /// The image cannot be pulled: ErrImagePull at each attempt, ImagePullBackOff between.
    PullFailed {
        shown: PullShown,
        /// When what is shown changes next.
        next: Instant,
        failed_at: Instant,
        backoff: Duration,
    },
    Running {
        started_at: String,
        id: String,
        /// When it will exit and with which code (busybox, SIGTERM, SIGKILL, `exit_container`).
        exit: Option<(Instant, i32)>,
    },
    /// Terminated; restarted at `restart_at` if the restart policy says so.
    Exited {
        term: Term,
        restart_at: Option<Instant>,
    },
    /// Waiting, CrashLoopBackOff, until the back-off after `term` is over.
    BackOff {
        term: Term,
        until: Instant,
        shown: Duration,
    },
}

#[derive(Debug, Clone)]
struct Container {
    name: String,
    image: String,
    /// An init container with `restartPolicy: Always`: a native sidecar (KEP-753), which runs
    /// beside the containers, restarted whenever it exits, instead of to completion first.
    sidecar: bool,
    behaviour: Behaviour,
    state: State,
    restart_count: u32,
    /// The termination of the instance before the current one (`lastState`).
    last_term: Option<Term>,
    /// The kubelet's restart back-off for this container, and when it last moved.
    backoff: Option<(Duration, Instant)>,
}

impl Container {
    fn is_running(&self) -> bool {
        matches!(self.state, State::Running { .. })
    }

    fn next_event(&self) -> Option<Instant> {
        match &self.state {
            State::Initializing | State::InvalidName => None,
            State::Creating { until } => Some(*until),
            State::PullFailed { next, .. } => Some(*next),
            State::Running { exit, .. } => exit.map(|(t, _)| t),
            State::Exited { restart_at, .. } => *restart_at,
            State::BackOff { until, .. } => Some(*until),
        }
    }

    /// Whether it ever ran: a sidecar that did lets the init containers after it start.
    fn has_started(&self) -> bool {
        match &self.state {
            State::Running { .. } | State::BackOff { .. } => true,
            State::Exited { term, .. } => term.container_id.is_some(),
            _ => self.restart_count > 0,
        }
    }

    /// An init container that has done its work: exited 0, for good; a sidecar once started.
    fn initialized(&self) -> bool {
        if self.sidecar {
            self.has_started()
        } else {
            self.succeeded()
        }
    }

    /// An init container that has done its work: exited 0, for good.
    fn succeeded(&self) -> bool {
        matches!(&self.state, State::Exited { term, restart_at: None } if term.exit_code == 0)
    }

    /// Given up for good: exited and not to be restarted.
    fn exited_for_good(&self) -> bool {
        matches!(
            self.state,
            State::Exited {
                restart_at: None,
                ..
            }
        )
    }
}

/// Why a pod's containers are being stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StopReason {
    /// The pod was deleted (gracefully): it ends Succeeded or Failed, then is removed.
    Deleted,
    /// `activeDeadlineSeconds` passed: it ends Failed, DeadlineExceeded, and stays.
    DeadlineExceeded,
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct Stop {
    reason: StopReason,
    /// The grace period in force (seconds, as the pod says it).
    grace: i64,
    /// When containers still running get SIGKILL.
    kill_at: Instant,
}

/// The phase the kubelet settled on for good, with the pod-level reason.
#[derive(Debug, Clone, PartialEq)]
struct Terminal {
    phase: &'static str,
    deadline: bool,
}

/// What [`PodRun::sync`] asks to be written, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Write {
    /// Store this pod object (same object, new status) through the status subresource.
    Status(Value),
    /// DELETE the pod with grace 0 and a uid precondition: the kubelet's last word on a pod
    /// whose deletion it has carried out.
    Remove,
}

/// Facts about the pod's place the kubelet needs, fixed at admission.
#[derive(Debug, Clone)]
pub struct Placement {
    pub node: String,
    pub host_ip: String,
    pub pod_ip: String,
}

/// The kubelet's view of one pod it runs. Cloned before a sync decided outside the store
/// lock, so that the sync can be dropped when the pod changed before it was written.
#[derive(Debug, Clone)]
pub struct PodRun {
    pub uid: String,
    pub node: String,
    host_ip: String,
    pod_ip: String,
    start_time: String,
    started: Instant,
    /// Whether the sandbox exists (it has an IP): once a container got past ContainerCreating.
    sandbox: bool,
    /// Just admitted: the first sync writes the ContainerCreating status.
    fresh: bool,
    /// `spec.initContainers`, run one after the other before `containers` start.
    init_containers: Vec<Container>,
    containers: Vec<Container>,
    stop: Option<Stop>,
    terminal: Option<Terminal>,
    removal_requested: bool,
    /// When a status the kubelet did not write and does not want was first seen.
    foreign_since: Option<Instant>,
    /// The resourceVersion of the kubelet's last write to this pod: changes up to it are its
    /// own, or were already seen when it wrote.
    pub written_rv: u64,
    /// When this pod next needs the kubelet.
    pub wake: Option<Instant>,
}

fn wall_now() -> String {
    crate::util::now_rfc3339()
}

fn meta_str<'a>(pod: &'a Value, field: &str) -> &'a str {
    pod["metadata"][field].as_str().unwrap_or("")
}

/// The kubelet's own pod conditions, in the order it writes them.
const KUBELET_CONDITIONS: [&str; 4] = ["Initialized", "Ready", "ContainersReady", "PodScheduled"];

impl PodRun {
    /// A pod this kubelet has just been given: its containers are being created.
    pub fn admit(pod: &Value, place: Placement, now: Instant, opts: &KubeletOptions) -> PodRun {
        let creating = State::Creating {
            until: now + opts.start_delay,
        };
        let of = |list: &str| -> Vec<Container> {
            pod["spec"][list]
                .as_array()
                .map(Vec::as_slice)
                .unwrap_or(&[])
                .iter()
                .map(|c| {
                    let image = c["image"].as_str().unwrap_or("").to_string();
                    Container {
                        name: c["name"].as_str().unwrap_or("").to_string(),
                        // Only an init container's is kept by the API server.
                        sidecar: list == "initContainers" && c["restartPolicy"] == "Always",
                        behaviour: Behaviour::of(&image),
                        image,
                        state: State::Initializing,
                        restart_count: 0,
                        last_term: None,
                        backoff: None,
                    }
                })
                .collect()
        };
        let mut init_containers = of("initContainers");
        let mut containers = of("containers");
        // The first init container is created at once, or with none, every container.
        match init_containers.first_mut() {
            Some(first) => first.state = creating,
            None => containers
                .iter_mut()
                .for_each(|c| c.state = creating.clone()),
        }
        PodRun {
            uid: meta_str(pod, "uid").to_string(),
            node: place.node,
            host_ip: place.host_ip,
            pod_ip: place.pod_ip,
            start_time: wall_now(),
            started: now,
            sandbox: false,
            fresh: true,
            init_containers,
            containers,
            stop: None,
            terminal: None,
            removal_requested: false,
            foreign_since: None,
            written_rv: 0,
            wake: None,
        }
    }

    /// Makes the container called `name`, or else the first running one (init containers
    /// first, sidecars included), exit with `code` now (a crash, or the process ending);
    /// `false` when that container is not running.
    pub fn exit_container(&mut self, name: Option<&str>, code: i32, now: Instant) -> bool {
        let mut all = self.init_containers.iter_mut().chain(&mut self.containers);
        match all.find(|c| c.is_running() && name.is_none_or(|n| c.name == n)) {
            Some(c) => {
                if let State::Running { exit, .. } = &mut c.state {
                    *exit = Some((now, code));
                }
                true
            }
            None => false,
        }
    }

    /// Brings the pod up to `now` given the pod as stored, and says what to write. Sets
    /// [`PodRun::wake`] to when it next needs a sync.
    pub fn sync(&mut self, pod: &Value, now: Instant, opts: &KubeletOptions) -> Vec<Write> {
        let mut changed = std::mem::take(&mut self.fresh);
        let policy = pod["spec"]["restartPolicy"]
            .as_str()
            .unwrap_or("Always")
            .to_string();
        let deleting = !pod["metadata"]["deletionTimestamp"].is_null();
        let deletion_grace = pod["metadata"]["deletionGracePeriodSeconds"]
            .as_i64()
            .unwrap_or(0);

        // A deletion seen for the first time: the kubelet starts terminating the pod and
        // writes its status at once (with a DisruptionTarget condition added by an eviction,
        // that write is what moves it first, fixture 07).
        if deleting && self.terminal.is_none() {
            match self.stop {
                None => {
                    self.begin_stop(StopReason::Deleted, deletion_grace, now, opts);
                    changed = true;
                }
                Some(stop) if deletion_grace < stop.grace => {
                    // A shorter grace period: SIGKILL comes sooner.
                    self.begin_stop(stop.reason, deletion_grace, now, opts);
                }
                Some(_) => {}
            }
        }

        // activeDeadlineSeconds, counted from startTime; it may be added or lowered live.
        let mut deadline_at = None;
        if self.stop.is_none() && self.terminal.is_none() {
            if let Some(secs) = pod["spec"]["activeDeadlineSeconds"].as_i64() {
                let at = self.started + Duration::from_secs(secs.max(0) as u64);
                if now >= at {
                    let grace = pod["spec"]["terminationGracePeriodSeconds"]
                        .as_i64()
                        .unwrap_or(30);
                    self.begin_stop(StopReason::DeadlineExceeded, grace, now, opts);
                    changed = true;
                } else {
                    deadline_at = Some(at);
                }
            }
        }

        let ctx = Ctx {
            restart: self.stop.is_none() && self.terminal.is_none(),
            policy: &policy,
            pod_uid: &self.uid,
            now,
            opts,
        };
        let init_ctx = Ctx {
            restart: ctx.restart && !self.containers_done(&policy),
            ..ctx
        };
        changed |= advance_init(&mut self.init_containers, &mut self.containers, &init_ctx);
        for c in &mut self.containers {
            changed |= advance(c, &ctx);
        }
        // Under Never or OnFailure, once every container has exited for good the kubelet
        // stops the sidecars (KEP-753); the pod's phase follows its containers alone.
        let running_sidecar = |c: &Container| c.sidecar && !c.exited_for_good();
        if self.containers_done(&policy) && self.init_containers.iter().any(running_sidecar) {
            stop_sidecars(&mut self.init_containers, now, opts);
            changed = true;
        }
        self.sandbox |= self
            .init_containers
            .iter()
            .chain(&self.containers)
            .any(|c| {
                matches!(
                    c.state,
                    State::Running { .. } | State::PullFailed { .. } | State::InvalidName
                )
            });

        let mut writes = Vec::new();
        if self.terminal.is_none() {
            if let Some(terminal) = self.terminal_now(&policy) {
                self.terminal = Some(terminal);
                // The v1.28 kubelet's first terminal status has no pod IP (the sandbox is
                // gone); the next one puts it back (fixtures 04, 05, 07, 09).
                let first = self.with_status(pod, false);
                let second = self.with_status(&first, true);
                writes.push(Write::Status(first));
                writes.push(Write::Status(second));
                changed = false;
            }
        }
        if self.terminal.is_some() && deleting && !self.removal_requested {
            if writes.is_empty() && self.status(pod, true) != pod["status"] {
                writes.push(Write::Status(self.with_status(pod, true)));
            }
            writes.push(Write::Remove);
            self.removal_requested = true;
        }

        let mut foreign_at = None;
        if writes.is_empty() {
            let wanted = self.status(pod, true);
            if wanted == pod["status"] {
                self.foreign_since = None;
            } else if changed {
                let mut next = pod.clone();
                next["status"] = wanted;
                writes.push(Write::Status(next));
            } else {
                // Someone else wrote the status (a phase, a condition): the kubelet's status
                // manager writes its own back after a while (fixture 10).
                let since = *self.foreign_since.get_or_insert(now);
                let due = since + opts.status_sync_delay;
                if now >= due {
                    let mut next = pod.clone();
                    next["status"] = wanted;
                    writes.push(Write::Status(next));
                } else {
                    foreign_at = Some(due);
                }
            }
        }
        if !writes.is_empty() {
            self.foreign_since = None;
        }

        self.wake = self
            .init_containers
            .iter()
            .chain(&self.containers)
            .filter_map(Container::next_event)
            .chain(deadline_at)
            .chain(foreign_at)
            .chain(
                self.stop
                    .filter(|_| self.terminal.is_none())
                    .map(|s| s.kill_at),
            )
            .min();
        writes
    }

    /// Every container has exited for good, not stopped by a deletion or a deadline: the
    /// sidecars are stopped and not restarted.
    fn containers_done(&self, policy: &str) -> bool {
        policy != "Always"
            && self.stop.is_none()
            && !self.containers.is_empty()
            && self.containers.iter().all(Container::exited_for_good)
    }

    /// An init container failed for good: the pod can never start (`restartPolicy: Never`).
    fn init_failed(&self) -> bool {
        self.init_containers
            .iter()
            .any(|c| !c.sidecar && c.exited_for_good() && !c.succeeded())
    }

    /// SIGTERM to every running container (each exits after `stop_delay`, or is killed at
    /// the end of the grace period); containers that never started are given up.
    fn begin_stop(&mut self, reason: StopReason, grace: i64, now: Instant, opts: &KubeletOptions) {
        let kill_secs = grace.max(MIN_KILL_GRACE_SECS) as u64;
        let mut kill_at = now + runtime::scaled(Duration::from_secs(kill_secs), opts.grace_scale);
        if let Some(old) = self.stop {
            kill_at = kill_at.min(old.kill_at);
        }
        self.stop = Some(Stop {
            reason,
            grace,
            kill_at,
        });
        let graceful_exit = now + opts.stop_delay;
        for c in self.init_containers.iter_mut().chain(&mut self.containers) {
            let stopped = match &mut c.state {
                State::Initializing
                | State::Creating { .. }
                | State::InvalidName
                | State::PullFailed { .. } => Some(State::Exited {
                    term: Term::never_started(now),
                    restart_at: None,
                }),
                State::Running { exit, .. } => {
                    let planned =
                        if c.behaviour == Behaviour::IgnoresSigterm || graceful_exit > kill_at {
                            (kill_at, 137)
                        } else {
                            (graceful_exit, 0)
                        };
                    if exit.is_none_or(|(t, _)| planned.0 < t) {
                        *exit = Some(planned);
                    }
                    None
                }
                State::Exited { restart_at, .. } => {
                    *restart_at = None;
                    None
                }
                State::BackOff { term, .. } => Some(State::Exited {
                    term: term.clone(),
                    restart_at: None,
                }),
            };
            if let Some(s) = stopped {
                c.state = s;
            }
        }
    }

    /// The terminal phase, when the pod has just become terminal: its containers all stopped
    /// while it was being stopped, or they all exited for good under `restartPolicy` Never or
    /// OnFailure.
    fn terminal_now(&self, policy: &str) -> Option<Terminal> {
        let all_exited = self
            .init_containers
            .iter()
            .chain(&self.containers)
            .all(Container::exited_for_good);
        match self.stop {
            None if policy == "Never" && self.init_failed() => Some(Terminal {
                phase: "Failed",
                deadline: false,
            }),
            Some(stop) if all_exited => {
                let deadline = stop.reason == StopReason::DeadlineExceeded;
                let phase = if deadline {
                    "Failed"
                } else {
                    self.phase(true, policy)
                };
                Some(Terminal { phase, deadline })
            }
            None if all_exited && policy != "Always" && !self.containers.is_empty() => {
                let phase = self.phase(true, policy);
                matches!(phase, "Succeeded" | "Failed").then_some(Terminal {
                    phase,
                    deadline: false,
                })
            }
            _ => None,
        }
    }

    /// The pod phase from its containers, as the kubelet's `getPhase` computes it.
    fn phase(&self, terminal: bool, policy: &str) -> &'static str {
        if policy == "Never" && self.init_failed() {
            return "Failed";
        }
        let (mut running, mut waiting, mut stopped, mut succeeded) = (0, 0, 0, 0);
        for c in &self.containers {
            match &c.state {
                State::Running { .. } => running += 1,
                State::Exited { term, .. } => {
                    stopped += 1;
                    if term.exit_code == 0 {
                        succeeded += 1;
                    }
                }
                // Waiting after a termination counts as stopped, not pending.
                State::BackOff { .. } => stopped += 1,
                State::Initializing
                | State::Creating { .. }
                | State::InvalidName
                | State::PullFailed { .. } => waiting += 1,
            }
        }
        if waiting > 0 {
            "Pending"
        } else if running > 0 {
            "Running"
        } else if stopped > 0 {
            if terminal {
                if stopped == succeeded {
                    "Succeeded"
                } else {
                    "Failed"
                }
            } else if policy == "Always" {
                "Running"
            } else if stopped == succeeded {
                "Succeeded"
            } else if policy == "Never" {
                "Failed"
            } else {
                "Running"
            }
        } else {
            "Pending"
        }
    }

    /// `pod` with the status this kubelet wants it to have.
    fn with_status(&self, pod: &Value, show_ip: bool) -> Value {
        let mut next = pod.clone();
        next["status"] = self.status(pod, show_ip);
        next
    }

    /// The status this kubelet wants the pod to have; fields the kubelet does not own (other
    /// conditions, `qosClass`, `nominatedNodeName`, ...) are kept from `pod`.
    fn status(&self, pod: &Value, show_ip: bool) -> Value {
        let old = &pod["status"];
        let mut status: Map<String, Value> = old.as_object().cloned().unwrap_or_default();
        let policy = pod["spec"]["restartPolicy"].as_str().unwrap_or("Always");
        let pod_name = format!(
            "{}_{}({})",
            meta_str(pod, "name"),
            meta_str(pod, "namespace"),
            self.uid
        );

        let (phase, failed_not_ready) = match (&self.terminal, self.stop) {
            (Some(t), _) => (t.phase, t.phase == "Failed"),
            // Deadline passed, containers still stopping: the status manager holds the phase
            // back (containers may still run) but ready goes False at once (fixture 09).
            (None, Some(s)) if s.reason == StopReason::DeadlineExceeded => {
                (self.phase(false, policy), true)
            }
            (None, _) => (self.phase(false, policy), false),
        };

        // With init containers, a container not started yet waits PodInitializing, not
        // ContainerCreating (the kubelet's default waiting state for such a pod).
        let has_init = !self.init_containers.is_empty();
        let shown = |c: &Container, init: bool| container_status(c, &pod_name, has_init, init);
        let statuses: Vec<Value> = self.containers.iter().map(|c| shown(c, false)).collect();
        let init_statuses: Vec<Value> = self
            .init_containers
            .iter()
            .map(|c| shown(c, true))
            .collect();
        let incomplete: Vec<&str> = self
            .init_containers
            .iter()
            .filter(|c| !c.initialized())
            .map(|c| c.name.as_str())
            .collect();
        // A sidecar is ready while it runs (no readiness probe is modelled), and the pod is
        // ready only with its sidecars ready too, listed first (`GeneratePodReadyCondition`).
        let unready: Vec<&str> = self
            .init_containers
            .iter()
            .filter(|c| c.sidecar)
            .chain(&self.containers)
            .filter(|c| !c.is_running())
            .map(|c| c.name.as_str())
            .collect();
        let (ready, reason, message) = if phase == "Succeeded" {
            ("False", Some("PodCompleted"), None)
        } else if phase == "Failed" || failed_not_ready {
            ("False", Some("PodFailed"), None)
        } else if !unready.is_empty() {
            (
                "False",
                Some("ContainersNotReady"),
                Some(format!(
                    "containers with unready status: [{}]",
                    unready.join(" ")
                )),
            )
        } else {
            ("True", None, None)
        };

        let now = wall_now();
        let old_conditions = old["conditions"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        let condition = |kind: &str, st: &str, reason: Option<&str>, message: Option<&str>| {
            let prior = old_conditions.iter().find(|c| c["type"] == kind);
            let since = match prior {
                Some(p) if p["status"] == st => p["lastTransitionTime"].clone(),
                _ => json!(now),
            };
            let mut c = json!({"type": kind, "status": st, "lastProbeTime": null, "lastTransitionTime": since});
            if let Some(r) = reason {
                c["reason"] = json!(r);
            }
            if let Some(m) = message {
                c["message"] = json!(m);
            }
            c
        };
        // Conditions others own come first, then the kubelet's (its status manager's merge).
        let mut conditions: Vec<Value> = old_conditions
            .iter()
            .filter(|c| !KUBELET_CONDITIONS.iter().any(|k| c["type"] == *k))
            .cloned()
            .collect();
        if phase == "Succeeded" {
            conditions.push(condition("Initialized", "True", Some("PodCompleted"), None));
        } else if !incomplete.is_empty() {
            let message = format!(
                "containers with incomplete status: [{}]",
                incomplete.join(" ")
            );
            conditions.push(condition(
                "Initialized",
                "False",
                Some("ContainersNotInitialized"),
                Some(&message),
            ));
        } else {
            conditions.push(condition("Initialized", "True", None, None));
        }
        conditions.push(condition("Ready", ready, reason, message.as_deref()));
        conditions.push(condition(
            "ContainersReady",
            ready,
            reason,
            message.as_deref(),
        ));
        conditions.push(condition("PodScheduled", "True", None, None));

        status.insert("phase".into(), json!(phase));
        status.insert("conditions".into(), Value::Array(conditions));
        match &self.terminal {
            Some(t) if t.deadline => {
                status.insert(
                    "message".into(),
                    json!("Pod was active on the node longer than the specified deadline"),
                );
                status.insert("reason".into(), json!("DeadlineExceeded"));
            }
            _ => {
                status.remove("message");
                status.remove("reason");
            }
        }
        status.insert("hostIP".into(), json!(self.host_ip));
        if self.sandbox && show_ip {
            status.insert("podIP".into(), json!(self.pod_ip));
            status.insert("podIPs".into(), json!([{"ip": self.pod_ip}]));
        } else {
            status.remove("podIP");
            status.remove("podIPs");
        }
        status.insert("startTime".into(), json!(self.start_time));
        if has_init {
            status.insert("initContainerStatuses".into(), Value::Array(init_statuses));
        }
        status.insert("containerStatuses".into(), Value::Array(statuses));
        Value::Object(status)
    }
}

/// What the container transitions need to know about their pod.
struct Ctx<'a> {
    /// Whether exited containers may be restarted (not while the pod is stopping).
    restart: bool,
    policy: &'a str,
    pod_uid: &'a str,
    now: Instant,
    opts: &'a KubeletOptions,
}

/// Runs the init containers in order: each is created once the one before it succeeded, or,
/// for a sidecar, started; a failed one is restarted unless `restartPolicy` is Never (init
/// containers never restart after success), a sidecar whenever it exits. When all have
/// done so, the containers are created.
fn advance_init(init: &mut [Container], containers: &mut [Container], ctx: &Ctx) -> bool {
    let policy = if ctx.policy == "Never" {
        "Never"
    } else {
        "OnFailure"
    };
    let init_ctx = Ctx { policy, ..*ctx };
    let sidecar_ctx = Ctx {
        policy: "Always",
        ..*ctx
    };
    let mut changed = false;
    for c in init.iter_mut() {
        if c.state == State::Initializing {
            if !ctx.restart {
                return changed;
            }
            c.state = State::Creating {
                until: ctx.now + ctx.opts.start_delay,
            };
            changed = true;
        }
        changed |= advance(c, if c.sidecar { &sidecar_ctx } else { &init_ctx });
        if !c.initialized() {
            return changed;
        }
    }
    if ctx.restart {
        for c in containers.iter_mut() {
            if c.state == State::Initializing {
                c.state = State::Creating {
                    until: ctx.now + ctx.opts.start_delay,
                };
                changed = true;
            }
        }
    }
    changed
}

/// SIGTERM to the sidecars, which exit after `stop_delay` and are not restarted: the pod's
/// containers have all exited for good.
fn stop_sidecars(init: &mut [Container], now: Instant, opts: &KubeletOptions) {
    for c in init.iter_mut().filter(|c| c.sidecar) {
        match &mut c.state {
            State::Running { exit, .. } => {
                let at = now + opts.stop_delay;
                if exit.is_none_or(|(t, _)| at < t) {
                    *exit = Some((at, 0));
                }
            }
            State::Exited { restart_at, .. } => *restart_at = None,
            State::BackOff { term, .. } => {
                c.state = State::Exited {
                    term: term.clone(),
                    restart_at: None,
                }
            }
            _ => {
                c.state = State::Exited {
                    term: Term::never_started(now),
                    restart_at: None,
                }
            }
        }
    }
}

/// Moves a container through every transition due by `ctx.now`; whether any happened.
fn advance(c: &mut Container, ctx: &Ctx) -> bool {
    let mut changed = false;
    // Each step moves time forward or ends the loop; the bound only guards against a bug.
    for _ in 0..16 {
        let Some(due) = c.next_event().filter(|t| *t <= ctx.now) else {
            break;
        };
        let now = ctx.now;
        let next = match &c.state {
            State::Initializing | State::InvalidName => break,
            State::Creating { .. } => {
                if c.behaviour == Behaviour::InvalidName {
                    State::InvalidName
                } else if c.behaviour == Behaviour::PullFails {
                    State::PullFailed {
                        shown: PullShown::ErrImagePull,
                        next: now + ctx.opts.start_delay,
                        failed_at: now,
                        backoff: runtime::next_backoff(None),
                    }
                } else {
                    start(c, ctx)
                }
            }
            State::PullFailed {
                shown: PullShown::ErrImagePull,
                failed_at,
                backoff,
                ..
            } => State::PullFailed {
                shown: PullShown::ImagePullBackOff,
                next: (*failed_at + runtime::scaled(*backoff, ctx.opts.backoff_scale)).max(due),
                failed_at: *failed_at,
                backoff: *backoff,
            },
            State::PullFailed {
                shown: PullShown::ImagePullBackOff,
                backoff,
                ..
            } => State::PullFailed {
                shown: PullShown::ErrImagePull,
                next: now + ctx.opts.start_delay,
                failed_at: now,
                backoff: runtime::next_backoff(Some(*backoff)),
            },
            State::Running {
                started_at,
                id,
                exit: Some((at, code)),
            } => {
                let term = Term {
                    exit_code: *code,
                    reason: if *code == 0 { "Completed" } else { "Error" },
                    message: None,
                    started_at: Some(started_at.clone()),
                    finished_at: Some(wall_now()),
                    container_id: Some(id.clone()),
                    at: *at,
                };
                let restart = ctx.restart
                    && (ctx.policy == "Always" || (ctx.policy == "OnFailure" && *code != 0));
                State::Exited {
                    term,
                    // The kubelet notices the exit at its next sync, then restarts.
                    restart_at: restart.then(|| now + ctx.opts.start_delay),
                }
            }
            State::Running { exit: None, .. } => break,
            State::Exited { term, .. } => {
                // kuberuntime's doBackOff: in back-off since the last exit, or restart now.
                let max = runtime::scaled(runtime::BACKOFF_MAX * 2, ctx.opts.backoff_scale);
                let window = c.backoff.and_then(|(d, updated)| {
                    let expired = term.at.saturating_duration_since(updated) > max;
                    (!expired).then(|| (d, runtime::scaled(d, ctx.opts.backoff_scale)))
                });
                match window {
                    Some((shown, wait)) if now < term.at + wait => State::BackOff {
                        term: term.clone(),
                        until: term.at + wait,
                        shown,
                    },
                    _ => restart(c, ctx),
                }
            }
            State::BackOff { .. } => restart(c, ctx),
        };
        c.state = next;
        changed = true;
    }
    changed
}

/// A new instance of the container, running.
fn start(c: &Container, ctx: &Ctx) -> State {
    let exit = (c.behaviour == Behaviour::ExitsAtOnce).then(|| (ctx.now + ctx.opts.start_delay, 0));
    State::Running {
        started_at: wall_now(),
        id: runtime::container_id(ctx.pod_uid, &c.name, c.restart_count),
        exit,
    }
}

/// Restarts an exited container: the back-off moves on and the restart count grows.
fn restart(c: &mut Container, ctx: &Ctx) -> State {
    let last = match &c.state {
        State::Exited { term, .. } | State::BackOff { term, .. } => Some(term.clone()),
        _ => None,
    };
    let max = runtime::scaled(runtime::BACKOFF_MAX * 2, ctx.opts.backoff_scale);
    let current = c.backoff.and_then(|(d, updated)| {
        let expired = last
            .as_ref()
            .is_some_and(|t| t.at.saturating_duration_since(updated) > max);
        (!expired).then_some(d)
    });
    c.backoff = Some((runtime::next_backoff(current), ctx.now));
    c.last_term = last;
    c.restart_count += 1;
    start(c, ctx)
}

/// One entry of `status.containerStatuses` (or, for an `init` container,
/// `initContainerStatuses`: ready once it exited 0).
fn container_status(c: &Container, pod_name: &str, has_init: bool, init: bool) -> Value {
    let not_started = if has_init {
        "PodInitializing"
    } else {
        "ContainerCreating"
    };
    let last_state = |t: Option<&Term>| match t {
        Some(t) => json!({"terminated": t.to_json()}),
        None => json!({}),
    };
    let started_image = || {
        (
            json!(runtime::normalize(&c.image)),
            json!(runtime::image_id(&c.image)),
        )
    };
    let (state, last, running, id, (image, image_id)) = match &c.state {
        State::Initializing | State::Creating { .. } => (
            json!({"waiting": {"reason": not_started}}),
            last_state(c.last_term.as_ref()),
            false,
            None,
            (json!(c.image), json!("")),
        ),
        State::InvalidName => (
            json!({"waiting": {"reason": "InvalidImageName", "message": runtime::invalid_name_message(&c.image)}}),
            last_state(c.last_term.as_ref()),
            false,
            None,
            (json!(c.image), json!("")),
        ),
        State::PullFailed { shown, .. } => {
            let (reason, message) = match shown {
                PullShown::ErrImagePull => ("ErrImagePull", runtime::pull_error(&c.image)),
                PullShown::ImagePullBackOff => {
                    ("ImagePullBackOff", runtime::pull_backoff(&c.image))
                }
            };
            (
                json!({"waiting": {"reason": reason, "message": message}}),
                last_state(c.last_term.as_ref()),
                false,
                None,
                (json!(c.image), json!("")),
            )
        }
        State::Running { started_at, id, .. } => (
            json!({"running": {"startedAt": started_at}}),
            last_state(c.last_term.as_ref()),
            true,
            Some(id.clone()),
            started_image(),
        ),
        State::Exited { term, .. } => {
            let image = if term.container_id.is_some() {
                started_image()
            } else {
                (json!(c.image), json!(""))
            };
            (
                json!({"terminated": term.to_json()}),
                last_state(c.last_term.as_ref()),
                false,
                term.container_id.clone(),
                image,
            )
        }
        State::BackOff { term, shown, .. } => (
            json!({"waiting": {"reason": "CrashLoopBackOff", "message": format!(
                "back-off {} restarting failed container={} pod={pod_name}",
                runtime::go_duration(*shown),
                c.name
            )}}),
            last_state(Some(term)),
            false,
            term.container_id.clone(),
            started_image(),
        ),
    };
    let ready = if init && !c.sidecar {
        c.succeeded()
    } else {
        running
    };
    let mut s = json!({
        "name": c.name,
        "state": state,
        "lastState": last,
        "ready": ready,
        "restartCount": c.restart_count,
        "image": image,
        "imageID": image_id,
        "started": running,
    });
    if let Some(id) = id {
        s["containerID"] = json!(id);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(image: &str, policy: &str) -> Value {
        json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u-1"},
            "spec": {"nodeName": "node-0", "restartPolicy": policy, "terminationGracePeriodSeconds": 30,
                "containers": [{"name": "c", "image": image}]},
            "status": {"phase": "Pending", "qosClass": "BestEffort",
                "conditions": [{"type": "PodScheduled", "status": "True", "lastProbeTime": null, "lastTransitionTime": "t0"}]}
        })
    }

    fn place() -> Placement {
        Placement {
            node: "node-0".into(),
            host_ip: "192.0.2.2".into(),
            pod_ip: "10.244.0.2".into(),
        }
    }

    fn opts() -> KubeletOptions {
        KubeletOptions {
            start_delay: Duration::from_millis(10),
            stop_delay: Duration::from_millis(10),
            grace_scale: 0.01,
            backoff_scale: 0.01,
            status_sync_delay: Duration::from_millis(500),
        }
    }

    /// A pod under one simulated kubelet, with the store reduced to the last written object.
    struct Sim {
        run: PodRun,
        stored: Value,
        t: Instant,
        opts: KubeletOptions,
        removed: bool,
    }

    impl Sim {
        fn new(stored: Value) -> Sim {
            let t = Instant::now();
            let opts = opts();
            Sim {
                run: PodRun::admit(&stored, place(), t, &opts),
                stored,
                t,
                opts,
                removed: false,
            }
        }

        /// Syncs at the current simulated time; returns the statuses written.
        fn sync(&mut self) -> Vec<Value> {
            let writes = self.run.sync(&self.stored, self.t, &self.opts);
            let mut out = Vec::new();
            for w in writes {
                match w {
                    Write::Status(p) => {
                        out.push(p["status"].clone());
                        self.stored = p;
                    }
                    Write::Remove => self.removed = true,
                }
            }
            out
        }

        /// Advances to the next wake-up and syncs.
        fn step(&mut self) -> Vec<Value> {
            self.t = self.run.wake.expect("a pending wake-up").max(self.t);
            self.sync()
        }
    }

    fn kinds(status: &Value) -> Vec<String> {
        status["containerStatuses"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| {
                c["state"]
                    .as_object()
                    .and_then(|m| m.keys().next().cloned())
                    .unwrap_or_default()
            })
            .collect()
    }

    fn cond<'a>(status: &'a Value, kind: &str) -> &'a Value {
        status["conditions"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["type"] == kind))
            .unwrap_or(&Value::Null)
    }

    #[test]
    fn bound_pod_is_created_then_running_like_fixture_03() {
        let mut s = Sim::new(pod("registry.k8s.io/pause:3.9", "Always"));
        let first = s.sync();
        assert_eq!(first.len(), 1);
        assert_eq!(first[0]["phase"], "Pending");
        assert_eq!(kinds(&first[0]), ["waiting"]);
        assert_eq!(first[0]["hostIP"], "192.0.2.2");
        assert!(first[0]["podIP"].is_null());
        assert_eq!(cond(&first[0], "Ready")["reason"], "ContainersNotReady");
        assert_eq!(
            cond(&first[0], "Ready")["message"],
            "containers with unready status: [c]"
        );
        assert_eq!(cond(&first[0], "PodScheduled")["lastTransitionTime"], "t0");
        let running = s.step();
        assert_eq!(running.len(), 1);
        let st = &running[0];
        assert_eq!(st["phase"], "Running");
        assert_eq!(st["podIP"], "10.244.0.2");
        assert_eq!(st["podIPs"], json!([{"ip": "10.244.0.2"}]));
        assert_eq!(cond(st, "Ready")["status"], "True");
        let c = &st["containerStatuses"][0];
        assert_eq!(
            (c["ready"].as_bool(), c["started"].as_bool()),
            (Some(true), Some(true))
        );
        assert_eq!(c["restartCount"], 0);
        assert!(c["containerID"]
            .as_str()
            .is_some_and(|id| id.starts_with("containerd://")));
        assert_eq!(
            c["imageID"].as_str().map(|i| i.contains("@sha256:")),
            Some(true)
        );
        assert_eq!(
            s.run.wake, None,
            "a running pause container needs nothing more"
        );
        assert!(s.sync().is_empty(), "no write when nothing changed");
    }

    #[test]
    fn graceful_delete_writes_succeeded_twice_then_removes_like_fixture_04() {
        let mut s = Sim::new(pod("registry.k8s.io/pause:3.9", "Always"));
        s.sync();
        s.step();
        s.stored["metadata"]["deletionTimestamp"] = json!("2030-01-01T00:00:30Z");
        s.stored["metadata"]["deletionGracePeriodSeconds"] = json!(30);
        assert!(s.sync().is_empty(), "nothing to write when deletion starts");
        let terminal = s.step();
        assert_eq!(terminal.len(), 2);
        assert!(terminal[0]["podIP"].is_null() && terminal[1]["podIP"].is_string());
        for st in &terminal {
            assert_eq!(st["phase"], "Succeeded");
            assert_eq!(cond(st, "Ready")["reason"], "PodCompleted");
            assert_eq!(cond(st, "Initialized")["reason"], "PodCompleted");
            assert_eq!(kinds(st), ["terminated"]);
            assert_eq!(
                st["containerStatuses"][0]["state"]["terminated"]["reason"],
                "Completed"
            );
        }
        assert!(s.removed);
    }

    #[test]
    fn container_ignoring_sigterm_is_killed_at_the_end_of_the_grace_period() {
        let mut s = Sim::new(pod("example.com/ignore-sigterm:1", "Always"));
        s.sync();
        s.step();
        let deleted_at = s.t;
        s.stored["metadata"]["deletionTimestamp"] = json!("2030-01-01T00:00:30Z");
        s.stored["metadata"]["deletionGracePeriodSeconds"] = json!(30);
        s.sync();
        let terminal = s.step();
        assert_eq!(
            s.t - deleted_at,
            Duration::from_millis(300),
            "30 s scaled by 0.01"
        );
        assert_eq!(terminal[1]["phase"], "Failed");
        assert_eq!(
            terminal[1]["containerStatuses"][0]["state"]["terminated"]["exitCode"],
            137
        );
        assert_eq!(cond(&terminal[1], "Ready")["reason"], "PodFailed");
    }

    #[test]
    fn busybox_crash_loops_with_doubling_back_off() {
        let mut s = Sim::new(pod("busybox", "Always"));
        s.sync();
        let mut messages = Vec::new();
        let mut restarts = 0;
        for _ in 0..30 {
            for st in s.step() {
                assert_eq!(st["phase"], "Running");
                let c = &st["containerStatuses"][0];
                restarts = c["restartCount"].as_u64().unwrap_or(0);
                if let Some(m) = c["state"]["waiting"]["message"].as_str() {
                    assert_eq!(c["state"]["waiting"]["reason"], "CrashLoopBackOff");
                    assert_eq!(c["lastState"]["terminated"]["reason"], "Completed");
                    assert_eq!(c["lastState"]["terminated"]["exitCode"], 0);
                    assert_eq!(cond(&st, "Ready")["reason"], "ContainersNotReady");
                    messages.push(m.to_string());
                }
            }
        }
        assert!(restarts >= 5, "{restarts}");
        assert_eq!(
            messages[..3],
            [
                "back-off 10s restarting failed container=c pod=p_ns(u-1)",
                "back-off 20s restarting failed container=c pod=p_ns(u-1)",
                "back-off 40s restarting failed container=c pod=p_ns(u-1)",
            ]
        );
    }

    #[test]
    fn invalid_image_name_waits_for_ever_while_pending() {
        let mut s = Sim::new(pod("NGINX:::Latest@@", "Always"));
        s.sync();
        let st = s.step().pop().expect("a status after creation");
        assert_eq!(st["phase"], "Pending");
        let waiting = &st["containerStatuses"][0]["state"]["waiting"];
        assert_eq!(waiting["reason"], "InvalidImageName");
        assert_eq!(
            waiting["message"],
            "Failed to apply default image tag \"NGINX:::Latest@@\": couldn't parse image reference \"NGINX:::Latest@@\": invalid reference format: repository name must be lowercase"
        );
        assert_eq!(st["containerStatuses"][0]["image"], "NGINX:::Latest@@");
        assert!(s.run.wake.is_none(), "nothing changes until the pod goes");
    }

    fn init_names(status: &Value, list: &str) -> Vec<String> {
        status[list]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| {
                let state = c["state"].as_object().and_then(|m| m.iter().next());
                match state {
                    Some((k, v)) if k == "waiting" => {
                        format!("waiting {}", v["reason"].as_str().unwrap_or(""))
                    }
                    Some((k, v)) if k == "terminated" => format!("terminated {}", v["exitCode"]),
                    Some((k, _)) => k.clone(),
                    None => String::new(),
                }
            })
            .collect()
    }

    #[test]
    fn init_containers_run_in_order_before_the_containers_start() {
        let mut p = pod("registry.k8s.io/pause:3.9", "Always");
        p["spec"]["initContainers"] = json!([
            {"name": "first", "image": "busybox:1.36"},
            {"name": "second", "image": "registry.k8s.io/pause:3.9"}]);
        p["spec"]["containers"] = json!([
            {"name": "c", "image": "registry.k8s.io/pause:3.9"},
            {"name": "sidecar", "image": "nginx:1.27"}]);
        let mut s = Sim::new(p);
        let first = s.sync().pop().expect("the first status");
        assert_eq!(first["phase"], "Pending");
        assert_eq!(
            init_names(&first, "initContainerStatuses"),
            ["waiting PodInitializing", "waiting PodInitializing"]
        );
        assert_eq!(
            init_names(&first, "containerStatuses"),
            ["waiting PodInitializing", "waiting PodInitializing"]
        );
        assert_eq!(cond(&first, "Initialized")["status"], "False");
        assert_eq!(
            cond(&first, "Initialized")["reason"],
            "ContainersNotInitialized"
        );
        assert_eq!(
            cond(&first, "Initialized")["message"],
            "containers with incomplete status: [first second]"
        );
        // busybox exits 0 by itself; the second runs until it is made to exit.
        let mut last = first;
        while s.run.wake.is_some() {
            if let Some(st) = s.step().pop() {
                last = st;
            }
        }
        assert_eq!(
            init_names(&last, "initContainerStatuses"),
            ["terminated 0", "running"]
        );
        assert_eq!(last["initContainerStatuses"][0]["ready"], true);
        assert_eq!(last["initContainerStatuses"][1]["ready"], false);
        assert_eq!(last["initContainerStatuses"][1]["started"], true);
        assert_eq!(last["phase"], "Pending");
        assert_eq!(
            cond(&last, "Initialized")["message"],
            "containers with incomplete status: [second]"
        );
        assert!(s.run.exit_container(None, 0, s.t));
        s.sync();
        while s.run.wake.is_some() {
            if let Some(st) = s.step().pop() {
                last = st;
            }
        }
        assert_eq!(last["phase"], "Running");
        assert_eq!(
            init_names(&last, "initContainerStatuses"),
            ["terminated 0", "terminated 0"]
        );
        assert_eq!(
            init_names(&last, "containerStatuses"),
            ["running", "running"]
        );
        assert_eq!(last["containerStatuses"][1]["name"], "sidecar");
        assert_eq!(last["containerStatuses"][1]["ready"], true);
        assert_eq!(last["initContainerStatuses"][1]["restartCount"], 0);
        assert_eq!(cond(&last, "Initialized")["status"], "True");
        assert!(cond(&last, "Initialized")["reason"].is_null());
        assert_eq!(cond(&last, "Ready")["status"], "True");
    }

    /// Steps until `done` holds of the stored status (at most 200 wake-ups); returns it.
    fn until(s: &mut Sim, done: impl Fn(&Value) -> bool) -> Value {
        for _ in 0..200 {
            if done(&s.stored["status"]) {
                return s.stored["status"].clone();
            }
            if s.run.wake.is_none() {
                break;
            }
            s.step();
        }
        panic!("never reached: {}", s.stored["status"]);
    }

    #[test]
    fn a_native_sidecar_starts_before_the_next_init_container_and_counts_for_ready() {
        let mut p = pod("registry.k8s.io/pause:3.9", "Always");
        p["spec"]["initContainers"] = json!([
            {"name": "log", "image": "registry.k8s.io/pause:3.9", "restartPolicy": "Always"},
            {"name": "setup", "image": "busybox:1.36"}]);
        let mut s = Sim::new(p);
        let first = s.sync().pop().expect("the first status");
        assert_eq!(
            cond(&first, "Initialized")["message"],
            "containers with incomplete status: [log setup]"
        );
        let st = until(&mut s, |st| {
            init_names(st, "initContainerStatuses")[0] == "running"
        });
        assert_eq!(
            cond(&st, "Initialized")["message"],
            "containers with incomplete status: [setup]",
            "a sidecar counts as initialized once started"
        );
        let st = until(&mut s, |st| cond(st, "Ready")["status"] == "True");
        assert_eq!(st["phase"], "Running");
        assert_eq!(
            init_names(&st, "initContainerStatuses"),
            ["running", "terminated 0"]
        );
        assert_eq!(init_names(&st, "containerStatuses"), ["running"]);
        let sidecar = &st["initContainerStatuses"][0];
        assert_eq!(
            (&sidecar["ready"], &sidecar["started"]),
            (&json!(true), &json!(true))
        );
        assert_eq!(cond(&st, "Initialized")["status"], "True");

        // It exits: restarted, the pod not ready meanwhile, the containers left running.
        assert!(s.run.exit_container(Some("log"), 1, s.t));
        s.sync();
        let st = until(&mut s, |st| cond(st, "Ready")["status"] == "False");
        assert_eq!(
            cond(&st, "Ready")["message"],
            "containers with unready status: [log]"
        );
        assert_eq!(st["phase"], "Running");
        assert_eq!(cond(&st, "Initialized")["status"], "True");
        let st = until(&mut s, |st| cond(st, "Ready")["status"] == "True");
        assert_eq!(st["initContainerStatuses"][0]["restartCount"], 1);
        assert_eq!(st["containerStatuses"][0]["restartCount"], 0);
    }

    #[test]
    fn a_sidecar_that_keeps_exiting_crash_loops_beside_running_containers() {
        let mut p = pod("registry.k8s.io/pause:3.9", "Always");
        // busybox without a terminal exits at once, again and again.
        p["spec"]["initContainers"] =
            json!([{"name": "log", "image": "busybox:1.36", "restartPolicy": "Always"}]);
        let mut s = Sim::new(p);
        s.sync();
        let st = until(&mut s, |st| {
            init_names(st, "initContainerStatuses")[0] == "waiting CrashLoopBackOff"
        });
        assert_eq!(st["phase"], "Running");
        assert_eq!(init_names(&st, "containerStatuses"), ["running"]);
        assert_eq!(cond(&st, "Ready")["status"], "False");
        let waiting = &st["initContainerStatuses"][0]["state"]["waiting"];
        assert!(
            waiting["message"].as_str().is_some_and(
                |m| m.starts_with("back-off 10s restarting failed container=log pod=p_ns(u-1)")
            ),
            "{waiting}"
        );
    }

    #[test]
    fn a_never_pod_ends_with_its_containers_and_its_sidecar_is_stopped() {
        let mut p = pod("busybox:1.36", "Never");
        p["spec"]["initContainers"] = json!([{"name": "log", "image": "registry.k8s.io/pause:3.9", "restartPolicy": "Always"}]);
        let mut s = Sim::new(p);
        s.sync();
        let st = until(&mut s, |st| {
            st["phase"] == "Succeeded" && init_names(st, "initContainerStatuses")[0] != "running"
        });
        assert_eq!(init_names(&st, "initContainerStatuses"), ["terminated 0"]);
        assert_eq!(init_names(&st, "containerStatuses"), ["terminated 0"]);
    }

    #[test]
    fn failed_init_container_fails_a_never_pod_and_is_retried_otherwise() {
        let mut p = pod("registry.k8s.io/pause:3.9", "Never");
        p["spec"]["initContainers"] = json!([{"name": "i", "image": "registry.k8s.io/pause:3.9"}]);
        let mut s = Sim::new(p.clone());
        s.sync();
        s.step();
        assert!(s.run.exit_container(None, 3, s.t));
        let st = s.sync().pop().expect("the terminal status");
        assert_eq!(st["phase"], "Failed");
        assert_eq!(init_names(&st, "initContainerStatuses"), ["terminated 3"]);
        assert_eq!(
            init_names(&st, "containerStatuses"),
            ["waiting PodInitializing"]
        );

        p["spec"]["restartPolicy"] = json!("Always");
        let mut s = Sim::new(p);
        s.sync();
        s.step();
        assert!(s.run.exit_container(None, 3, s.t));
        s.sync();
        let mut seen = Vec::new();
        while s.run.wake.is_some() {
            for st in s.step() {
                assert_eq!(st["phase"], "Pending");
                seen.extend(init_names(&st, "initContainerStatuses"));
            }
        }
        assert!(seen.contains(&"running".to_string()), "restarted: {seen:?}");
        assert_eq!(
            s.stored["status"]["initContainerStatuses"][0]["restartCount"],
            1
        );
    }

    #[test]
    fn unpullable_image_alternates_err_image_pull_and_back_off_while_pending() {
        let mut s = Sim::new(pod("registry.example/does-not-exist:1", "Always"));
        s.sync();
        let mut reasons = Vec::new();
        for _ in 0..5 {
            for st in s.step() {
                assert_eq!(st["phase"], "Pending");
                assert_eq!(cond(&st, "Ready")["reason"], "ContainersNotReady");
                assert!(st["podIP"].is_string(), "the sandbox has its IP");
                reasons.push(
                    st["containerStatuses"][0]["state"]["waiting"]["reason"]
                        .as_str()
                        .unwrap_or("")
                        .to_string(),
                );
            }
        }
        assert_eq!(
            reasons,
            [
                "ErrImagePull",
                "ImagePullBackOff",
                "ErrImagePull",
                "ImagePullBackOff",
                "ErrImagePull"
            ]
        );
        // Deleted while never started: its container is given up, the pod ends Failed.
        s.stored["metadata"]["deletionTimestamp"] = json!("2030-01-01T00:00:30Z");
        s.stored["metadata"]["deletionGracePeriodSeconds"] = json!(30);
        let terminal = s.sync();
        assert_eq!(terminal[1]["phase"], "Failed");
        assert_eq!(
            terminal[1]["containerStatuses"][0]["state"]["terminated"]["reason"],
            "ContainerStatusUnknown"
        );
        assert!(s.removed);
    }

    #[test]
    fn deadline_sets_ready_false_first_then_failed_and_the_pod_stays() {
        let mut s = Sim::new(pod("registry.k8s.io/pause:3.9", "Always"));
        s.sync();
        s.step();
        s.stored["spec"]["activeDeadlineSeconds"] = json!(0);
        let first = s.sync();
        assert_eq!(first.len(), 1);
        assert_eq!(first[0]["phase"], "Running");
        assert_eq!(cond(&first[0], "Ready")["reason"], "PodFailed");
        assert_eq!(kinds(&first[0]), ["running"]);
        let terminal = s.step();
        assert_eq!(terminal.len(), 2);
        assert_eq!(terminal[1]["phase"], "Failed");
        assert_eq!(terminal[1]["reason"], "DeadlineExceeded");
        assert_eq!(
            terminal[1]["message"],
            "Pod was active on the node longer than the specified deadline"
        );
        assert!(!s.removed);
        assert_eq!(s.run.wake, None);
    }

    #[test]
    fn a_phase_written_by_someone_else_is_written_back_after_the_sync_delay() {
        let mut s = Sim::new(pod("registry.k8s.io/pause:3.9", "Always"));
        s.sync();
        s.step();
        s.stored["status"]["phase"] = json!("Failed");
        assert!(s.sync().is_empty(), "not at once");
        let back = s.step();
        assert_eq!(back[0]["phase"], "Running");
    }

    #[test]
    fn other_conditions_are_kept_and_moved_first() {
        let mut s = Sim::new(pod("registry.k8s.io/pause:3.9", "Always"));
        s.sync();
        s.step();
        s.stored["status"]["conditions"]
            .as_array_mut()
            .expect("conditions")
            .push(json!({"type": "DisruptionTarget", "status": "True"}));
        s.stored["metadata"]["deletionTimestamp"] = json!("2030-01-01T00:00:30Z");
        s.stored["metadata"]["deletionGracePeriodSeconds"] = json!(30);
        let at_once = s.sync();
        assert_eq!(
            at_once.len(),
            1,
            "the reorder is written when deletion starts"
        );
        assert_eq!(at_once[0]["conditions"][0]["type"], "DisruptionTarget");
    }

    #[test]
    fn restart_policy_never_ends_in_a_terminal_phase_from_the_exit_code() {
        for (code, phase) in [(0, "Succeeded"), (3, "Failed")] {
            let mut s = Sim::new(pod("registry.k8s.io/pause:3.9", "Never"));
            s.sync();
            s.step();
            assert!(s.run.exit_container(None, code, s.t));
            let terminal = s.sync();
            assert_eq!(terminal.len(), 2);
            assert_eq!(terminal[1]["phase"], phase);
            assert!(!s.removed);
        }
    }
}
