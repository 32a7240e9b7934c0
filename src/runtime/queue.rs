//! Deduplicating work queue of `namespace/name` keys, with client-go's workqueue semantics: a
//! key is queued at most once and held by one worker at a time, a delayed add keeps the earliest
//! deadline, and failures back off per key and spend one overall [`Budget`].
//!
//! What runs next is decided here and only here: urgent keys before routine ones, which still
//! get one turn in [`SHARE`]; every "later" is a deadline of this queue (docs/design.md, "What
//! runs next").

use crate::runtime::metrics;
pub use crate::runtime::store::Key;
pub use crate::runtime::trigger::{Hint, Trigger};
use crate::util::Stamp;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet, VecDeque};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// A failing key's delay, doubling (client-go's `DefaultItemBasedRateLimiter`).
const BASE_DELAY: Duration = Duration::from_millis(5);
const MAX_DELAY: Duration = Duration::from_secs(1000);
/// The overall budget: client-go's `BucketRateLimiter{rate.NewLimiter(10, 100)}`.
const BUDGET_RATE: f64 = 10.0;
const BUDGET_BURST: f64 = 100.0;

/// While both priorities have keys ready, one key in this many handed out is routine: no starving.
pub const SHARE: u32 = 64;

/// How soon a queued key should be handed out; queued again higher, it moves up, never down.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Priority {
    /// Status refreshes, relists, releases: what only changes what status says.
    Routine,
    /// Something is missing or ended: a pod to make, replace or count.
    Urgent,
}

impl Priority {
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Urgent => "urgent",
            Priority::Routine => "routine",
        }
    }
}

/// How many failing reconciles the queue lets through: client-go's overall bucket, except that
/// a success refunds a token and a spent budget holds every key, first attempts too.
#[derive(Debug)]
struct Budget {
    /// Below zero when several workers fail at once: the debt is paid before the next key.
    tokens: f64,
    at: Instant,
}

impl Budget {
    fn new(now: Instant) -> Budget {
        Budget {
            tokens: BUDGET_BURST,
            at: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        let dt = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + dt * BUDGET_RATE).min(BUDGET_BURST);
        self.at = self.at.max(now);
    }

    /// How long until a key may be handed out with `in_flight` reconciles running (`None`: now).
    /// Once the budget is being spent, each of them holds a token: it may fail too.
    fn wait(&mut self, now: Instant, in_flight: usize) -> Option<Duration> {
        self.refill(now);
        let owed = match self.tokens < BUDGET_BURST {
            true => in_flight as f64,
            false => 0.0,
        };
        let have = self.tokens - owed;
        (have < 1.0).then(|| Duration::from_secs_f64((1.0 - have) / BUDGET_RATE))
    }

    fn spend(&mut self, now: Instant) {
        self.refill(now);
        self.tokens -= 1.0;
    }

    /// A reconcile succeeded: the API server answers.
    fn refund(&mut self, now: Instant) {
        self.refill(now);
        self.tokens = (self.tokens + 1.0).min(BUDGET_BURST);
    }
}

/// What [`Queue::get_within`] hands a worker.
#[derive(Debug)]
pub enum Work<H> {
    /// A key, what queued it, its priority, and how long it waited at that priority.
    Key(Key, Trigger<H>, Priority, Duration),
    /// No key to hand out for the whole wait.
    Idle,
    ShutDown,
}

/// A key queued and not yet handed out.
struct Dirty<H> {
    /// What queued it: the latest trigger, with what all of them tell ([`Trigger::then`]).
    trigger: Trigger<H>,
    /// When it was first added (for the queue-duration metric).
    added: Stamp,
    /// When it got its priority (later than `added` for a key moved up): `queued_ms`.
    in_band: Stamp,
    /// The highest priority it was queued with.
    priority: Priority,
}

/// A key queued for later.
struct Waiting<H> {
    at: Instant,
    trigger: Trigger<H>,
    priority: Priority,
}

struct State<H> {
    /// Keys ready to hand out, one deque per priority (`Priority as usize`). A key moved up
    /// leaves a stale copy behind, skipped when it comes up.
    ready: [VecDeque<Key>; 2],
    dirty: HashMap<Key, Dirty<H>>,
    /// What the [`Stamp`]s count from.
    epoch: Instant,
    /// Urgent keys handed out in a row while routine ones waited.
    urgent_streak: u32,
    /// Keys a worker holds now.
    processing: HashSet<Key>,
    /// Delayed keys: earliest deadline per key, and a heap of (deadline, key) with stale entries.
    waiting: HashMap<Key, Waiting<H>>,
    timers: BinaryHeap<Reverse<(Instant, Key)>>,
    /// Consecutive failures per key, for the rate limiter.
    failures: HashMap<Key, u32>,
    budget: Budget,
    /// Whether the last `get` found the budget spent (to log when that changes).
    throttled: bool,
    shutting_down: bool,
}

pub struct Queue<H> {
    state: Mutex<State<H>>,
    cond: Condvar,
}

impl<H> Default for Queue<H> {
    fn default() -> Self {
        let state = State {
            ready: Default::default(),
            dirty: HashMap::new(),
            epoch: Instant::now(),
            urgent_streak: 0,
            processing: HashSet::new(),
            waiting: HashMap::new(),
            timers: BinaryHeap::new(),
            failures: HashMap::new(),
            budget: Budget::new(Instant::now()),
            throttled: false,
            shutting_down: false,
        };
        Queue {
            state: Mutex::new(state),
            cond: Condvar::new(),
        }
    }
}

impl<H: Hint> Queue<H> {
    pub fn new() -> Queue<H> {
        Queue::default()
    }

    fn lock(&self) -> MutexGuard<'_, State<H>> {
        // Every mutation below completes before any call that could panic.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `key`; pass the store's own copy of it (see [`Key`]) where there is one.
    pub fn add(&self, key: Key, trigger: Trigger<H>, priority: Priority) {
        let mut st = self.lock();
        if Self::insert(&mut st, key, trigger, priority, false) {
            self.cond.notify_one();
        }
    }

    /// Queues `key` again with the trigger its reconcile had, older than any queued meanwhile.
    pub fn add_again(&self, key: Key, trigger: Trigger<H>, priority: Priority) {
        let mut st = self.lock();
        if Self::insert(&mut st, key, trigger, priority, true) {
            self.cond.notify_one();
        }
    }

    /// Marks `key` dirty (`older`: its trigger is older than the queued one); true: wake a waiter.
    fn insert(
        st: &mut State<H>,
        key: Key,
        trigger: Trigger<H>,
        priority: Priority,
        older: bool,
    ) -> bool {
        if st.shutting_down {
            return false;
        }
        let processing = st.processing.contains(&key);
        if let Some(d) = st.dirty.get_mut(&key) {
            let queued = std::mem::replace(&mut d.trigger, Trigger::Scheduled);
            d.trigger = match older {
                true => trigger.then(queued),
                false => queued.then(trigger),
            };
            if priority <= d.priority {
                return false;
            }
            // Moved up: the copy left behind is skipped when it comes.
            d.priority = priority;
            d.in_band = Stamp::of(Instant::now(), st.epoch);
        } else {
            // Counted as client-go counts it: a key already queued is not added again.
            metrics::queue_add();
            let now = Stamp::of(Instant::now(), st.epoch);
            let dirty = Dirty {
                trigger,
                added: now,
                in_band: now,
                priority,
            };
            st.dirty.insert(key.clone(), dirty);
        }
        if processing {
            // Handed out again by `done`.
            return false;
        }
        st.ready[priority as usize].push_back(key);
        Self::depth(st);
        true
    }

    /// Reports the number of keys ready (stale copies included: they are few).
    fn depth(st: &State<H>) {
        metrics::queue_depth(st.ready[0].len() + st.ready[1].len());
    }

    /// Queues `key` after `delay`. Two deadlines pending for one key are one: the earlier,
    /// at the higher of their priorities.
    pub fn add_after(&self, key: Key, delay: Duration, trigger: Trigger<H>, priority: Priority) {
        if delay.is_zero() {
            return self.add(key, trigger, priority);
        }
        let at = Instant::now() + delay;
        let mut st = self.lock();
        if st.shutting_down {
            return;
        }
        let (trigger, priority) = match st.waiting.remove(&key) {
            Some(w) if w.at <= at => {
                let w = Waiting {
                    priority: w.priority.max(priority),
                    ..w
                };
                st.waiting.insert(key, w);
                return;
            }
            Some(w) => (w.trigger.then(trigger), w.priority.max(priority)),
            None => (trigger, priority),
        };
        let w = Waiting {
            at,
            trigger,
            priority,
        };
        st.waiting.insert(key.clone(), w);
        st.timers.push(Reverse((at, key)));
        // A waiting `get` may need to wake earlier than it planned.
        self.cond.notify_one();
    }

    /// Drops what was scheduled for `key`.
    pub fn cancel(&self, key: &str) {
        self.lock().waiting.remove(key);
    }

    /// Queues `key`, whose reconcile failed, after its backoff or `at_least` (`Retry-After`)
    /// if longer, but no later than `at_most`; returns the delay. Spends the overall budget.
    pub fn add_rate_limited(
        &self,
        key: Key,
        at_least: Duration,
        at_most: Option<Duration>,
        priority: Priority,
    ) -> Duration {
        let delay = {
            let mut st = self.lock();
            st.budget.spend(Instant::now());
            let n = st.failures.entry(key.clone()).or_insert(0);
            let wanted = backoff(*n).max(at_least);
            *n = n.saturating_add(1);
            at_most.map_or(wanted, |d| d.min(wanted))
        };
        metrics::queue_retry();
        self.add_after(key, delay, Trigger::Retry, priority);
        delay
    }

    /// How many times `key` has failed in a row.
    pub fn num_requeues(&self, key: &str) -> u32 {
        self.lock().failures.get(key).copied().unwrap_or(0)
    }

    /// Resets the backoff of `key` after a success, and refunds the overall budget a token.
    pub fn forget(&self, key: &str) {
        let mut st = self.lock();
        st.failures.remove(key);
        st.budget.refund(Instant::now());
    }

    /// Blocks until a key is ready and the budget lets it out (the caller must then call
    /// [`Queue::done`]), or until `idle` passes without one.
    pub fn get_within(&self, idle: Option<Duration>) -> Work<H> {
        let idle_at = idle.map(|d| Instant::now() + d);
        let mut st = self.lock();
        loop {
            if st.shutting_down {
                return Work::ShutDown;
            }
            let mut next_deadline = Self::promote_due(&mut st);
            Self::drop_stale(&mut st);
            let urgent = !st.ready[Priority::Urgent as usize].is_empty();
            let routine = !st.ready[Priority::Routine as usize].is_empty();
            if urgent || routine {
                let now = Instant::now();
                let in_flight = st.processing.len();
                let held = st.budget.wait(now, in_flight);
                if held.is_some() != st.throttled {
                    st.throttled = held.is_some();
                    let ready = st.ready.iter().map(VecDeque::len).sum::<usize>();
                    if st.throttled {
                        log::debug!(
                            target: "queue", ready;
                            "reconciles keep failing: handing out at most {BUDGET_RATE} keys a second until one succeeds"
                        );
                    } else {
                        log::debug!(target: "queue", ready; "handing out keys again");
                    }
                }
                if let Some(wait) = held {
                    let at = now + wait;
                    next_deadline = Some(next_deadline.map_or(at, |d| d.min(at)));
                } else {
                    // Urgent first, but one in SHARE routine while routine keys wait too.
                    let band = match routine && (!urgent || st.urgent_streak + 1 >= SHARE) {
                        true => Priority::Routine,
                        false => Priority::Urgent,
                    };
                    let key = st.ready[band as usize].pop_front().expect("not empty");
                    st.urgent_streak = match (band, routine) {
                        (Priority::Urgent, true) => st.urgent_streak + 1,
                        _ => 0,
                    };
                    return Self::hand_out(&mut st, key);
                }
            }
            if let Some(at) = idle_at {
                if Instant::now() >= at {
                    return Work::Idle;
                }
                next_deadline = Some(next_deadline.map_or(at, |d| d.min(at)));
            }
            st = match next_deadline {
                // A timer, not a poll: until the next deadline, or until an add wakes us.
                Some(d) => {
                    let wait = d.saturating_duration_since(Instant::now());
                    self.cond
                        .wait_timeout(st, wait)
                        .unwrap_or_else(|p| p.into_inner())
                        .0
                }
                None => self.cond.wait(st).unwrap_or_else(|p| p.into_inner()),
            };
        }
    }

    /// Whether keys wait for a worker now: ready, and not held back by the failure budget.
    pub fn has_waiting(&self) -> bool {
        let mut st = self.lock();
        Self::drop_stale(&mut st);
        !st.throttled && st.ready.iter().any(|r| !r.is_empty())
    }

    /// Hands `key`, just taken from a ready deque, to a worker.
    fn hand_out(st: &mut State<H>, key: Key) -> Work<H> {
        Self::depth(st);
        let (trigger, priority, waited) = match st.dirty.remove(&key) {
            Some(d) => {
                let now = Stamp::of(Instant::now(), st.epoch);
                metrics::queue_wait(d.added.until(now));
                (d.trigger, d.priority, d.in_band.until(now))
            }
            None => (Trigger::Scheduled, Priority::Routine, Duration::ZERO),
        };
        st.processing.insert(key.clone());
        Work::Key(key, trigger, priority, waited)
    }

    /// Pops the stale copies at the front of each deque (keys moved up, or handed out).
    fn drop_stale(st: &mut State<H>) {
        let mut dropped = false;
        for band in 0..2 {
            while let Some(k) = st.ready[band].front() {
                let live = st.dirty.get(k).is_some_and(|d| d.priority as usize == band)
                    && !st.processing.contains(k);
                if live {
                    break;
                }
                st.ready[band].pop_front();
                dropped = true;
            }
        }
        // The depth reported counts them: an idle queue must say 0.
        if dropped {
            Self::depth(st);
        }
    }

    /// Moves due delayed keys to ready; returns the next pending deadline.
    fn promote_due(st: &mut State<H>) -> Option<Instant> {
        let now = Instant::now();
        while let Some(Reverse((deadline, _))) = st.timers.peek() {
            if *deadline > now {
                return Some(*deadline);
            }
            let Reverse((deadline, key)) = st.timers.pop().expect("peeked");
            // A stale heap entry is skipped: the key was re-added with another deadline.
            if st.waiting.get(&key).is_some_and(|w| w.at == deadline) {
                let w = st.waiting.remove(&key).expect("checked");
                Self::insert(st, key, w.trigger, w.priority, false);
            }
        }
        None
    }

    /// Marks `key` finished; if it was added meanwhile it becomes ready again.
    pub fn done(&self, key: &str) {
        let mut st = self.lock();
        st.processing.remove(key);
        if st.shutting_down {
            return;
        }
        if st.throttled {
            // One reconcile fewer in flight: the budget may let the next key out now.
            self.cond.notify_one();
        }
        if let Some((key, priority)) = st
            .dirty
            .get_key_value(key)
            .map(|(k, d)| (k.clone(), d.priority))
        {
            st.ready[priority as usize].push_back(key);
            Self::depth(&st);
            self.cond.notify_one();
        }
    }

    /// Stops handing out keys and wakes every waiter.
    pub fn shutdown(&self) {
        self.lock().shutting_down = true;
        self.cond.notify_all();
    }
}

/// Delay after `failures` consecutive failures.
fn backoff(failures: u32) -> Duration {
    MAX_DELAY.min(BASE_DELAY * (1 << failures.min(31)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::thread;

    /// Tests queue plain strings as hints (here, so every module's tests have them): two say
    /// the same only when they are the same.
    impl Hint for String {
        fn and(&self, later: &String) -> Option<String> {
            (self == later).then(|| later.clone())
        }
    }

    pub(super) type Q = Queue<String>;

    impl<H: Hint> Queue<H> {
        /// [`Queue::get_within`] without an idle limit.
        pub(super) fn get(&self) -> Option<(String, Trigger<H>, Priority, Duration)> {
            match self.get_within(None) {
                Work::Key(k, t, p, w) => Some((k.to_string(), t, p, w)),
                Work::Idle | Work::ShutDown => None,
            }
        }

        /// Keys queued and not being processed.
        pub(super) fn len(&self) -> usize {
            let st = self.lock();
            st.dirty.len()
                - st.dirty
                    .keys()
                    .filter(|k| st.processing.contains(*k))
                    .count()
        }

        pub(super) fn is_empty(&self) -> bool {
            self.len() == 0
        }

        /// Ready keys in the order they would be handed out, and their triggers, for other
        /// modules' tests.
        pub(crate) fn lock_for_tests(&self) -> (Vec<String>, HashMap<String, Trigger<H>>) {
            let mut st = self.lock();
            Queue::drop_stale(&mut st);
            let dirty: HashMap<String, Trigger<H>> = st
                .dirty
                .iter()
                .map(|(k, d)| (k.to_string(), d.trigger.clone()))
                .collect();
            let mut ready = Vec::new();
            for band in [Priority::Urgent, Priority::Routine] {
                for k in &st.ready[band as usize] {
                    let live = st.dirty.get(k).is_some_and(|d| d.priority == band);
                    if live && !ready.iter().any(|r: &String| **r == **k) {
                        ready.push(k.to_string());
                    }
                }
            }
            (ready, dirty)
        }
    }

    fn t() -> Trigger<String> {
        Trigger::Scheduled
    }

    #[test]
    fn adding_a_queued_key_again_does_not_duplicate_it() {
        let q = Q::new();
        q.add("ns/a".into(), t(), Priority::Routine);
        q.add("ns/a".into(), t(), Priority::Routine);
        q.add("ns/b".into(), t(), Priority::Routine);
        assert_eq!(q.len(), 2);
        assert_eq!(q.get().unwrap().0, "ns/a");
        assert_eq!(q.get().unwrap().0, "ns/b");
    }

    #[test]
    fn keys_waiting_for_a_worker_are_told_and_a_wait_with_none_gives_up() {
        let q = Q::new();
        assert!(matches!(
            q.get_within(Some(Duration::from_millis(5))),
            Work::Idle
        ));
        q.add("ns/a".into(), t(), Priority::Routine);
        q.add("ns/b".into(), t(), Priority::Routine);
        assert!(q.has_waiting());
        assert!(
            matches!(q.get_within(Some(Duration::from_secs(5))), Work::Key(k, ..) if &*k == "ns/a")
        );
        // ns/b still waits: a worker more would have work.
        assert!(q.has_waiting());
        assert_eq!(q.get().unwrap().0, "ns/b");
        // Both taken: nothing waits, though both are being worked on.
        assert!(!q.has_waiting());
        q.shutdown();
        assert!(matches!(
            q.get_within(Some(Duration::from_secs(5))),
            Work::ShutDown
        ));
    }

    #[test]
    fn the_latest_trigger_of_a_deduplicated_key_is_reported_with_what_all_of_them_tell() {
        let q = Q::new();
        let deleted = |rv, hint: &str| Trigger::Watch {
            resource: "pod",
            event: "DELETED",
            rv,
            hint: Some(hint.to_string()),
        };
        q.add("ns/a".into(), deleted(8, "gone"), Priority::Routine);
        q.add("ns/a".into(), deleted(9, "gone"), Priority::Routine);
        assert_eq!(q.get().unwrap().1.to_string(), "pod DELETED rv=9 gone");
        // A trigger without a hint (a list, an object's own event: a spec change) is not
        // narrowed by a later one's hint: the reconcile looks at everything, and says why.
        q.add(
            "ns/b".into(),
            Trigger::Relist { resource: "pod" },
            Priority::Routine,
        );
        q.add("ns/b".into(), deleted(9, "gone"), Priority::Routine);
        assert_eq!(q.get().unwrap().1.to_string(), "pod relist");
        // Nor do two hints that say different things keep either.
        q.add("ns/c".into(), deleted(8, "seen"), Priority::Routine);
        q.add("ns/c".into(), deleted(9, "gone"), Priority::Routine);
        assert_eq!(q.get().unwrap().1.to_string(), "pod DELETED rv=9");
    }

    #[test]
    fn a_timer_of_our_own_keeps_the_hint_of_a_watch_event_already_queued() {
        let q = Q::new();
        let seen = Trigger::Watch {
            resource: "pod",
            event: "ADDED",
            rv: 7,
            hint: Some("seen".to_string()),
        };
        q.add("ns/a".into(), seen, Priority::Urgent);
        q.add("ns/a".into(), Trigger::Scheduled, Priority::Urgent);
        assert_eq!(q.get().unwrap().1.to_string(), "pod ADDED rv=7 seen");
        // A retry is another matter: something failed, so it looks at everything.
        q.add("ns/b".into(), Trigger::Retry, Priority::Urgent);
        q.add(
            "ns/b".into(),
            Trigger::Watch {
                resource: "pod",
                event: "MODIFIED",
                rv: 8,
                hint: Some("seen".to_string()),
            },
            Priority::Urgent,
        );
        assert_eq!(q.get().unwrap().1.to_string(), "retry after error");
    }

    #[test]
    fn a_key_queued_again_with_its_own_trigger_keeps_what_came_meanwhile() {
        let q = Q::new();
        let watch = |rv, hint: &str| Trigger::Watch {
            resource: "pod",
            event: "MODIFIED",
            rv,
            hint: Some(hint.to_string()),
        };
        q.add("ns/a".into(), watch(8, "seen"), Priority::Urgent);
        let (k, t, ..) = q.get().unwrap();
        // The pod changes while the key is reconciled; then the reconcile queues its key again
        // with the trigger it had: the later event is the one that stays.
        q.add(k.clone().into(), watch(9, "seen"), Priority::Routine);
        q.add_again(k.clone().into(), t, Priority::Routine);
        q.done(&k);
        assert_eq!(q.get().unwrap().1.to_string(), "pod MODIFIED rv=9 seen");
    }

    #[test]
    fn a_key_the_start_up_sweep_found_says_so_and_not_relist() {
        let q = Q::new();
        q.add(
            "ns/a".into(),
            Trigger::Sweep { resource: "pod" },
            Priority::Urgent,
        );
        assert_eq!(q.get().unwrap().1.to_string(), "pod sweep");
    }

    #[test]
    fn a_key_being_processed_is_not_handed_out_twice_and_comes_back_after_done() {
        let q = Q::new();
        q.add("ns/a".into(), t(), Priority::Routine);
        let (k, _, _, _) = q.get().unwrap();
        q.add("ns/a".into(), t(), Priority::Routine);
        // Still processing: not ready.
        assert_eq!(q.len(), 0);
        q.done(&k);
        assert_eq!(q.len(), 1);
        assert_eq!(q.get().unwrap().0, "ns/a");
    }

    #[test]
    fn done_without_a_new_add_leaves_nothing_behind() {
        let q = Q::new();
        q.add("ns/a".into(), t(), Priority::Routine);
        let (k, _, _, _) = q.get().unwrap();
        q.done(&k);
        assert!(q.is_empty());
    }

    #[test]
    fn two_workers_never_hold_the_same_key() {
        let q = Arc::new(Q::new());
        let busy = Arc::new(Mutex::new(HashSet::new()));
        let handled = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let workers: Vec<_> = (0..4)
            .map(|_| {
                let (q, busy, handled) = (q.clone(), busy.clone(), handled.clone());
                thread::spawn(move || {
                    while let Some((k, _, _, _)) = q.get() {
                        assert!(
                            busy.lock().unwrap().insert(k.clone()),
                            "{k} handed out twice"
                        );
                        thread::yield_now();
                        busy.lock().unwrap().remove(&k);
                        handled.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        q.done(&k);
                    }
                })
            })
            .collect();
        for i in 0..2000 {
            q.add(format!("ns/{}", i % 7).into(), t(), Priority::Routine);
        }
        // Let the workers drain, bounded in time.
        let deadline = Instant::now() + Duration::from_secs(10);
        while (!q.is_empty() || !q.lock().processing.is_empty()) && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(5));
        }
        q.shutdown();
        for w in workers {
            w.join().unwrap();
        }
        assert!(handled.load(std::sync::atomic::Ordering::SeqCst) >= 7);
    }

    #[test]
    fn delayed_add_becomes_ready_at_its_deadline() {
        let q = Q::new();
        let start = Instant::now();
        q.add_after(
            "ns/a".into(),
            Duration::from_millis(30),
            t(),
            Priority::Routine,
        );
        assert!(q.is_empty());
        assert_eq!(q.get().unwrap().0, "ns/a");
        assert!(start.elapsed() >= Duration::from_millis(30));
    }

    #[test]
    fn delayed_adds_keep_the_earliest_deadline() {
        let q = Q::new();
        q.add_after(
            "ns/a".into(),
            Duration::from_secs(3600),
            t(),
            Priority::Routine,
        );
        q.add_after(
            "ns/a".into(),
            Duration::from_millis(10),
            t(),
            Priority::Routine,
        );
        q.add_after(
            "ns/a".into(),
            Duration::from_secs(60),
            t(),
            Priority::Routine,
        );
        let (k, _, _, _) = q.get().unwrap();
        assert_eq!(k, "ns/a");
        q.done(&k);
        // The stale one-hour and one-minute entries are gone: nothing else is pending.
        assert!(q.lock().waiting.is_empty());
    }

    #[test]
    fn rate_limited_backoff_doubles_from_5ms_to_1000s_and_resets_on_forget() {
        assert_eq!(backoff(0), Duration::from_millis(5));
        assert_eq!(backoff(1), Duration::from_millis(10));
        assert_eq!(backoff(10), Duration::from_millis(5120));
        assert_eq!(backoff(30), Duration::from_secs(1000));
        assert_eq!(backoff(u32::MAX), Duration::from_secs(1000));
        let q = Q::new();
        assert_eq!(
            q.add_rate_limited("ns/a".into(), Duration::ZERO, None, Priority::Routine),
            Duration::from_millis(5)
        );
        assert_eq!(
            q.add_rate_limited("ns/a".into(), Duration::ZERO, None, Priority::Routine),
            Duration::from_millis(10)
        );
        assert_eq!(q.num_requeues("ns/a"), 2);
        q.forget("ns/a");
        assert_eq!(q.num_requeues("ns/a"), 0);
        assert_eq!(
            q.add_rate_limited("ns/a".into(), Duration::ZERO, None, Priority::Routine),
            Duration::from_millis(5)
        );
        // The server's Retry-After wins over a shorter backoff.
        assert_eq!(
            q.add_rate_limited(
                "ns/a".into(),
                Duration::from_secs(30),
                None,
                Priority::Routine
            ),
            Duration::from_secs(30)
        );
        // A key with something to do by a deadline is retried by then, however long its
        // back-off has grown.
        for _ in 0..30 {
            q.add_rate_limited("ns/b".into(), Duration::ZERO, None, Priority::Routine);
        }
        assert_eq!(
            q.add_rate_limited(
                "ns/b".into(),
                Duration::ZERO,
                Some(Duration::from_secs(7)),
                Priority::Routine
            ),
            Duration::from_secs(7)
        );
    }

    #[test]
    fn the_budget_lets_a_hundred_failures_through_then_ten_a_second() {
        let t0 = Instant::now();
        let mut b = Budget::new(t0);
        for i in 0..100 {
            assert_eq!(b.wait(t0, 0), None, "failure {i} is within the burst");
            b.spend(t0);
        }
        assert_eq!(b.wait(t0, 0), Some(Duration::from_millis(100)));
        let t1 = t0 + Duration::from_millis(100);
        assert_eq!(b.wait(t1, 0), None, "one token a tenth of a second later");
        b.spend(t1);
        assert!(b.wait(t1, 0).is_some());
        // A long quiet time refills only up to the burst.
        let t2 = t1 + Duration::from_secs(3600);
        for _ in 0..100 {
            assert_eq!(b.wait(t2, 0), None);
            b.spend(t2);
        }
        assert!(b.wait(t2, 0).is_some());
    }

    #[test]
    fn a_success_gives_a_spent_budget_a_token_back_at_once() {
        let t0 = Instant::now();
        let mut b = Budget::new(t0);
        for _ in 0..100 {
            b.spend(t0);
        }
        assert!(b.wait(t0, 0).is_some());
        b.refund(t0);
        assert_eq!(b.wait(t0, 0), None);
        // Successes never raise it past the burst.
        let mut full = Budget::new(t0);
        full.refund(t0);
        for _ in 0..100 {
            full.spend(t0);
        }
        assert!(full.wait(t0, 0).is_some());
    }

    #[test]
    fn once_failures_spend_the_budget_each_reconcile_in_flight_holds_a_token() {
        let t0 = Instant::now();
        let mut b = Budget::new(t0);
        // A healthy budget lets any number of workers run.
        assert_eq!(b.wait(t0, 256), None);
        // 40 failures: 60 tokens left, so 59 reconciles may be in flight, not 60.
        for _ in 0..40 {
            b.spend(t0);
        }
        assert_eq!(b.wait(t0, 59), None);
        assert!(b.wait(t0, 60).is_some());
    }

    #[test]
    fn failures_of_several_workers_at_once_are_a_debt_paid_before_the_next_key() {
        let t0 = Instant::now();
        let mut b = Budget::new(t0);
        for _ in 0..103 {
            b.spend(t0);
        }
        // Three tokens owed, and one to hand out: 0.4 s.
        assert_eq!(b.wait(t0, 0), Some(Duration::from_millis(400)));
    }

    #[test]
    fn keys_that_keep_failing_are_handed_out_at_most_a_hundred_then_ten_a_second() {
        let q = Q::new();
        for i in 0..1000 {
            q.add(format!("ns/{i}").into(), t(), Priority::Routine);
        }
        let start = Instant::now();
        let window = Duration::from_millis(1500);
        let mut handed_out = 0u32;
        // Every reconcile fails, as while the API server answers 503 to everything.
        while start.elapsed() < window {
            let (k, _, _, _) = q.get().expect("not shut down");
            handed_out += 1;
            q.add_rate_limited(k.clone().into(), Duration::ZERO, None, Priority::Routine);
            q.done(&k);
        }
        let secs = start.elapsed().as_secs_f64();
        // The bound is arithmetic: a slow machine only hands out fewer. Without the budget the
        // loop hands out tens of thousands.
        let most = 100.0 + 10.0 * secs + 1.0;
        assert!(
            (handed_out as f64) <= most,
            "{handed_out} handed out in {secs:.2} s, at most {most:.0}"
        );
        assert!(
            handed_out as f64 >= BUDGET_BURST,
            "the burst is not let through"
        );
        // One success, and the next key goes at once.
        q.forget("ns/0");
        assert_eq!(q.lock().budget.wait(Instant::now(), 0), None);
    }

    /// Hands out the next key, or panics if none comes within 5 s.
    pub(super) fn next_soon(q: &Arc<Q>) -> String {
        let (tx, rx) = crossbeam_channel::bounded(1);
        let q2 = q.clone();
        thread::spawn(move || {
            let _ = tx.send(q2.get().map(|(k, ..)| k));
        });
        rx.recv_timeout(Duration::from_secs(5))
            .expect("handed out without waiting on the budget")
            .expect("not shut down")
    }

    /// Spends the whole budget and more with `n` failing reconciles of `priority`.
    pub(super) fn fail_many(q: &Q, n: usize, priority: Priority) {
        for i in 0..n {
            let key = format!("ns/failing-{i}");
            q.add_rate_limited(key.into(), Duration::from_secs(3600), None, priority);
        }
    }

    #[test]
    fn shutdown_wakes_every_waiter() {
        let q = Arc::new(Q::new());
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let q = q.clone();
                thread::spawn(move || q.get())
            })
            .collect();
        thread::sleep(Duration::from_millis(20));
        q.shutdown();
        for w in waiters {
            assert_eq!(w.join().unwrap(), None);
        }
        q.add("ns/a".into(), t(), Priority::Routine);
        assert!(q.get().is_none());
    }
}

#[cfg(test)]
mod band_tests {
    use super::tests::{fail_many, next_soon, Q};
    use super::*;
    use std::sync::Arc;

    fn add(q: &Q, key: &str, p: Priority) {
        q.add(key.into(), Trigger::Scheduled, p);
    }

    /// Hands out (and finishes) `n` keys; answers them in order.
    fn take(q: &Q, n: usize) -> Vec<String> {
        (0..n)
            .map(|_| {
                let (k, _, _, _) = q.get().expect("a key");
                q.done(&k);
                k
            })
            .collect()
    }

    #[test]
    fn urgent_keys_go_before_routine_ones_queued_earlier() {
        let q = Q::new();
        for i in 0..3 {
            add(&q, &format!("ns/routine-{i}"), Priority::Routine);
        }
        add(&q, "ns/deleted", Priority::Urgent);
        assert_eq!(take(&q, 1), ["ns/deleted"]);
        assert_eq!(
            take(&q, 3),
            ["ns/routine-0", "ns/routine-1", "ns/routine-2"]
        );
    }

    #[test]
    fn a_key_queued_again_as_urgent_moves_up_and_never_down() {
        let q = Q::new();
        add(&q, "ns/a", Priority::Routine);
        add(&q, "ns/b", Priority::Routine);
        add(&q, "ns/b", Priority::Urgent);
        add(&q, "ns/b", Priority::Routine);
        assert_eq!(q.len(), 2);
        let (k, _, p, _) = q.get().unwrap();
        assert_eq!((k.as_str(), p), ("ns/b", Priority::Urgent));
        q.done(&k);
        // Its stale copy in the routine band is not handed out again.
        assert_eq!(take(&q, 1), ["ns/a"]);
        assert!(q.is_empty());
    }

    #[test]
    fn a_key_made_urgent_while_processed_comes_back_urgent() {
        let q = Q::new();
        add(&q, "ns/a", Priority::Routine);
        add(&q, "ns/x", Priority::Routine);
        let (k, _, _, _) = q.get().unwrap();
        add(&q, &k, Priority::Urgent);
        q.done(&k);
        let (again, _, p, _) = q.get().unwrap();
        assert_eq!((again.as_str(), p), ("ns/a", Priority::Urgent));
    }

    #[test]
    fn routine_keys_get_one_turn_in_share_however_many_urgent_ones_keep_coming() {
        let q = Q::new();
        let routine: Vec<String> = (0..10).map(|i| format!("ns/routine-{i}")).collect();
        for k in &routine {
            add(&q, k, Priority::Routine);
        }
        // Urgent keys keep coming, always more than can be handed out.
        let mut served = Vec::new();
        for i in 0..(routine.len() * SHARE as usize) {
            add(&q, &format!("ns/urgent-{i}-a"), Priority::Urgent);
            add(&q, &format!("ns/urgent-{i}-b"), Priority::Urgent);
            served.extend(take(&q, 1));
        }
        // The bound: the routine key at place p (from 1) is handed out within SHARE × p keys.
        for (p, k) in routine.iter().enumerate() {
            let at = served.iter().position(|s| s == k).expect("served") + 1;
            assert!(
                at <= SHARE as usize * (p + 1),
                "{k} (place {}) handed out {at}th",
                p + 1
            );
        }
        // And urgent keys still got the rest.
        let urgent = served.iter().filter(|s| s.contains("urgent")).count();
        assert_eq!(urgent, served.len() - routine.len());
    }

    #[test]
    fn a_reconcile_that_asks_nothing_more_drops_what_was_scheduled() {
        let q = Q::new();
        q.add_after(
            "ns/a".into(),
            Duration::from_millis(10),
            Trigger::Scheduled,
            Priority::Routine,
        );
        q.add_after(
            "ns/b".into(),
            Duration::from_millis(10),
            Trigger::Scheduled,
            Priority::Urgent,
        );
        q.cancel("ns/a");
        q.cancel("ns/b");
        std::thread::sleep(Duration::from_millis(30));
        assert!(matches!(
            q.get_within(Some(Duration::from_millis(20))),
            Work::Idle
        ));
    }

    #[test]
    fn a_failed_key_is_retried_in_the_band_it_failed_in() {
        let q = Q::new();
        add(&q, "ns/a", Priority::Urgent);
        let (k, _, p, _) = q.get().unwrap();
        q.add_rate_limited(k.clone().into(), Duration::ZERO, None, p);
        q.done(&k);
        add(&q, "ns/b", Priority::Routine);
        std::thread::sleep(Duration::from_millis(20));
        let (k, t, p, _) = q.get().unwrap();
        assert_eq!(
            (k.as_str(), t, p),
            ("ns/a", Trigger::Retry, Priority::Urgent)
        );
    }

    #[test]
    fn a_deadline_that_comes_while_the_budget_is_spent_waits_on_it_as_every_key_does() {
        let q = Arc::new(Q::new());
        // 150 failures at once: 50 tokens owed, five seconds to pay.
        fail_many(&q, 150, Priority::Urgent);
        // A pod made here is due to be released: its look is a deadline like any other.
        q.add_after(
            "ns/made".into(),
            Duration::from_millis(10),
            Trigger::Scheduled,
            Priority::Urgent,
        );
        std::thread::sleep(Duration::from_millis(20));
        assert!(
            matches!(q.get_within(Some(Duration::from_millis(300))), Work::Idle),
            "a key came due and was handed out past a spent budget"
        );
        q.lock().budget.tokens = BUDGET_BURST;
        assert_eq!(next_soon(&q), "ns/made");
    }

    #[test]
    fn an_urgent_retry_scheduled_behind_a_routine_one_comes_back_urgent() {
        let q = Q::new();
        // A Ready write fails (routine), then the replacement's create fails (urgent) while
        // the first retry, the sooner, is still pending.
        let first = q.add_rate_limited("ns/a".into(), Duration::ZERO, None, Priority::Routine);
        let second = q.add_rate_limited("ns/a".into(), Duration::ZERO, None, Priority::Urgent);
        assert!(first < second);
        add(&q, "ns/refresh", Priority::Routine);
        std::thread::sleep(second + Duration::from_millis(10));
        let (k, t, p, _) = q.get().unwrap();
        assert_eq!(
            (k.as_str(), t, p),
            ("ns/a", Trigger::Retry, Priority::Urgent)
        );
    }
}
