//! The controller loop, generic over the resource: watcher and worker threads that report
//! their own death, and the worker's contract with the queue. What one reconcile does is the
//! caller's (a closure); which events queue a key is its [`EventHandler`]'s.

use crate::kube::client::Client;
use crate::runtime::metrics;
use crate::runtime::pool::{self, Pool};
use crate::runtime::queue::{Hint, Key, Priority, Queue, Trigger, Work};
use crate::runtime::serve::Health;
use crate::runtime::watcher::{EventHandler, Watcher};
use crossbeam_channel::Sender;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

/// What the worker does with the key after a successful reconcile (kube-runtime's `Action`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Action {
    requeue: Option<Duration>,
    priority: Priority,
}

impl Action {
    /// Nothing to do until a watch event says otherwise: a look asked for before is moot.
    pub const fn await_change() -> Action {
        Action {
            requeue: None,
            priority: Priority::Urgent,
        }
    }

    /// Look again after `after` (zero: at once, with its trigger), urgent unless [`Action::at`].
    pub const fn requeue(after: Duration) -> Action {
        Action {
            requeue: Some(after),
            priority: Priority::Urgent,
        }
    }

    /// The same, at `priority`: routine where only what status says changes then.
    pub const fn at(self, priority: Priority) -> Action {
        Action { priority, ..self }
    }

    pub fn requeue_after(&self) -> Option<Duration> {
        self.requeue
    }

    pub fn priority(&self) -> Priority {
        self.priority
    }
}

/// What the worker needs to know of a failed reconcile.
pub trait Failure: fmt::Display {
    /// How long the server asked us to wait before retrying, if it did.
    fn retry_after(&self) -> Option<Duration>;
    /// The latest the retry may come, whatever the key's back-off.
    fn retry_within(&self) -> Option<Duration> {
        None
    }
    /// Whether only a person can fix it (a refusal), so it is logged as a warning at once.
    fn needs_a_person(&self) -> bool;
}

/// Fields every log line of one reconcile carries.
pub struct LogContext<'a> {
    pub id: &'a str,
    /// The queue's own copy of the key, for what reconcile keeps of it.
    pub key: &'a Key,
}

/// Marks the operator unhealthy and tells `run` when its thread unwinds from a panic (in tests:
/// release builds abort).
pub struct Sentinel {
    pub health: Arc<Health>,
    pub dead: Sender<&'static str>,
    pub name: &'static str,
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        if thread::panicking() {
            self.health.dead.store(true, Ordering::Relaxed);
            let _ = self.dead.send(self.name);
        }
    }
}

pub fn spawn_watcher<W>(
    w: Watcher<Client, W>,
    sentinel: Sentinel,
) -> std::io::Result<thread::JoinHandle<()>>
where
    W: EventHandler + Send + 'static,
    W::Hint: Clone + Send,
{
    thread::Builder::new()
        .name(format!("watch-{}", w.kind.resource.short()))
        .spawn(move || {
            let _sentinel = sentinel;
            w.run()
        })
}

/// One reconcile thread: always `done`, `forget` on success, rate-limited requeue on error
/// (sample-controller's worker contract). `grow` starts a worker more, if it can.
pub fn work<H, E, R, G>(queue: &Queue<H>, run_id: u16, pool: &Pool, grow: G, reconcile: R)
where
    H: Hint + fmt::Display,
    E: Failure,
    R: Fn(&LogContext, Option<&H>) -> Result<Action, E>,
    G: Fn() -> bool,
{
    static NEXT_ID: AtomicU64 = AtomicU64::new(1);
    // Waits forever once it found it must stay (the pool at its minimum).
    let mut idle = Some(pool::IDLE_EXIT);
    loop {
        let (key, trigger, priority, waited) = match queue.get_within(idle) {
            Work::Key(key, trigger, priority, waited) => (key, trigger, priority, waited),
            Work::ShutDown => return,
            Work::Idle if pool.stop_idle() => {
                log::debug!(target: "controller", workers = pool.live() as u64; "idle worker ended");
                return;
            }
            Work::Idle => {
                idle = None;
                continue;
            }
        };
        idle = Some(pool::IDLE_EXIT);
        if queue.has_waiting() && pool.start() {
            if grow() {
                log::debug!(target: "controller", workers = pool.live() as u64; "keys wait: one worker more");
            } else {
                pool.not_started();
            }
        }
        let id = format!("{run_id:04x}-{}", NEXT_ID.fetch_add(1, Ordering::Relaxed));
        let trigger_s = trigger.to_string();
        let started = Instant::now();
        let hint = match &trigger {
            Trigger::Watch { hint, .. } => hint.as_ref(),
            _ => None,
        };
        log::debug!(target: "reconcile", reconcile_id = id.as_str(), object = &*key, trigger = trigger_s.as_str(); "reconciling");
        let result = reconcile(&LogContext { id: &id, key: &key }, hint);
        let elapsed = started.elapsed();
        // In tenths of a millisecond. `queued_ms` and the band say whether a replacement was slow
        // because the reconcile was, or because it queued behind other work.
        let elapsed_ms = (elapsed.as_secs_f64() * 10_000.0).round() / 10.0;
        let queued_ms = (waited.as_secs_f64() * 10_000.0).round() / 10.0;
        let band = priority.as_str();
        match result {
            Ok(action) => {
                queue.forget(&key);
                let outcome = match action.requeue_after() {
                    None => {
                        queue.cancel(&key);
                        "success"
                    }
                    Some(Duration::ZERO) => {
                        queue.add_again(key.clone(), trigger.clone(), action.priority());
                        "requeue"
                    }
                    Some(after) => {
                        queue.add_after(key.clone(), after, Trigger::Scheduled, action.priority());
                        "requeue_after"
                    }
                };
                metrics::record_reconcile(outcome, elapsed);
                let after = action.requeue_after().filter(|d| !d.is_zero());
                log::info!(
                    target: "reconcile",
                    reconcile_id = id.as_str(), object = &*key, trigger = trigger_s.as_str(),
                    result = outcome, requeue_after_ms = after.map(|d| d.as_millis() as u64),
                    elapsed_ms = elapsed_ms, queued_ms = queued_ms, priority = band;
                    "reconciled"
                );
            }
            Err(e) => {
                let at_least = e.retry_after().unwrap_or_default();
                let after =
                    queue.add_rate_limited(key.clone(), at_least, e.retry_within(), priority);
                metrics::record_reconcile("error", elapsed);
                // A person must act on a refusal, or on an error that keeps coming back.
                let level = if e.needs_a_person() || queue.num_requeues(&key) > 8 {
                    log::Level::Warn
                } else {
                    log::Level::Info
                };
                log::log!(
                    target: "reconcile", level,
                    reconcile_id = id.as_str(), object = &*key, trigger = trigger_s.as_str(),
                    result = "error", error = e.to_string().as_str(), requeue_after_ms = after.as_millis() as u64,
                    elapsed_ms = elapsed_ms, queued_ms = queued_ms, priority = band;
                    "reconcile failed"
                );
            }
        }
        queue.done(&key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::Mutex;

    #[derive(Debug)]
    struct Never;

    impl fmt::Display for Never {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("never")
        }
    }

    impl Failure for Never {
        fn retry_after(&self) -> Option<Duration> {
            None
        }
        fn needs_a_person(&self) -> bool {
            false
        }
    }

    /// Workers of one test: the queue, the pool, and how many reconciles ran at once.
    struct Crew {
        queue: Queue<String>,
        pool: Pool,
        in_flight: AtomicUsize,
        peak: AtomicUsize,
        done: AtomicUsize,
        threads: Mutex<Vec<thread::JoinHandle<()>>>,
    }

    fn start(crew: &Arc<Crew>) {
        let me = crew.clone();
        let t = thread::spawn(move || {
            work(
                &me.queue,
                1,
                &me.pool,
                || {
                    start(&me);
                    true
                },
                |_, _| {
                    let n = me.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                    me.peak.fetch_max(n, Ordering::SeqCst);
                    thread::sleep(Duration::from_millis(2));
                    me.in_flight.fetch_sub(1, Ordering::SeqCst);
                    me.done.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, Never>(Action::await_change())
                },
            )
        });
        crew.threads.lock().unwrap().push(t);
    }

    #[test]
    fn a_backlog_grows_the_workers_up_to_the_bound_and_no_further() {
        let crew = Arc::new(Crew {
            queue: Queue::new(),
            pool: Pool::new(1, 4),
            in_flight: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
            threads: Mutex::default(),
        });
        for i in 0..200 {
            crew.queue.add(
                format!("ns/o{i}").into(),
                Trigger::Scheduled,
                Priority::Routine,
            );
        }
        assert!(crew.pool.start());
        start(&crew);
        let deadline = Instant::now() + Duration::from_secs(30);
        while crew.done.load(Ordering::SeqCst) < 200 {
            assert!(Instant::now() < deadline, "the backlog was not worked off");
            thread::sleep(Duration::from_millis(5));
        }
        crew.queue.shutdown();
        loop {
            let t = crew.threads.lock().unwrap().pop();
            match t {
                Some(t) => t.join().unwrap(),
                None => break,
            }
        }
        let peak = crew.peak.load(Ordering::SeqCst);
        assert!(peak > 1, "one worker did it all: the pool never grew");
        assert!(peak <= 4, "{peak} reconciles at once, over the bound of 4");
        assert_eq!(crew.pool.live(), 4);
    }
}
