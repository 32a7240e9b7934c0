//! A real control plane's costs, modeled on demand (CPU per request and per watcher of each
//! event, commits that concurrent writes share), and the requests in flight at the server.
//!
//! Off by default: every field of [`CostModel`] zero, nothing waits. The bench turns it on to
//! rank designs as a CPU-bound v1.28 control plane does (testserver/README.md, "Cost model";
//! its calibration is beside `MODEL` in bench/src/lib.rs).

use std::sync::{Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

/// What each request costs the modeled control plane. All zero ([`Default`]): no cost.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CostModel {
    /// Cores the modeled control plane has: at most this many requests spend CPU at once,
    /// the others queue for it. 0 with a CPU cost set counts as 1.
    pub cores: usize,
    /// CPU of a get, list or the opening of a watch.
    pub read: Duration,
    /// CPU of a write (create, update, patch, delete): decoding, admission, encoding, storage.
    pub write: Duration,
    /// CPU per watcher of the event a write makes (encoding and sending it to each watch).
    pub per_watcher: Duration,
    /// Watchers of every pod event beyond the watch streams open here: a real control plane's
    /// scheduler, kubelet and controller-manager watch pods too.
    pub pod_watchers: usize,
    /// One commit's latency (etcd's fsync and raft round trip). Writes arriving while a commit
    /// is in flight join the next one, as etcd batches them: many writes in flight share it.
    pub commit: Duration,
}

impl CostModel {
    /// Whether any cost is set.
    pub fn is_on(&self) -> bool {
        *self != CostModel::default()
    }
}

/// Requests in flight at the server (watch streams count only while being opened).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct InFlight {
    /// The most at once since the last reset.
    pub peak: usize,
    /// Their time-weighted mean since the last reset.
    pub mean: f64,
}

/// The model in force, its cores and commit batches, and the in-flight gauge.
#[derive(Debug, Default)]
pub struct Costs {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    model: CostModel,
    cores: Cores,
    batches: Batches,
    gauge: Gauge,
}

impl Costs {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn set(&self, model: CostModel) {
        self.state().model = model;
    }

    pub fn model(&self) -> CostModel {
        self.state().model
    }

    /// Spends `cpu` on the modeled core free first, after the work queued on it. The cores are
    /// kept in virtual time (when each is free next), so a busy real machine's late wake-ups
    /// delay the request that slept, never the modeled cores' next work.
    pub fn spend(&self, cpu: Duration) {
        if cpu.is_zero() {
            return;
        }
        let done = {
            let mut s = self.state();
            let cores = s.model.cores.max(1);
            s.cores.take(Instant::now(), cpu, cores)
        };
        thread::sleep(done.saturating_duration_since(Instant::now()));
    }

    /// Waits until the commit batch this write joins is done (at once when commits cost
    /// nothing).
    pub fn commit(&self) {
        let latency = self.model().commit;
        if latency.is_zero() {
            return;
        }
        let done = self.state().batches.join(Instant::now(), latency);
        thread::sleep(done.saturating_duration_since(Instant::now()));
    }

    /// A request arrives; it leaves when the guard is dropped.
    pub fn enter(&self) -> Flying<'_> {
        self.state().gauge.change(Instant::now(), 1);
        Flying(self)
    }

    /// The gauge since the last reset, and a new start from now.
    pub fn take_in_flight(&self) -> InFlight {
        self.state().gauge.take(Instant::now())
    }
}

/// A request in flight; leaves the gauge when dropped.
pub struct Flying<'a>(&'a Costs);

impl Drop for Flying<'_> {
    fn drop(&mut self) {
        self.0.state().gauge.change(Instant::now(), -1);
    }
}

/// The modeled cores, each by when it has done the work queued on it: a queue served first come,
/// first served by the core free first.
#[derive(Debug, Default)]
struct Cores {
    free_at: Vec<Instant>,
}

impl Cores {
    /// When `cpu` arriving at `now` is done on one of `cores`.
    fn take(&mut self, now: Instant, cpu: Duration, cores: usize) -> Instant {
        self.free_at.resize(cores, now);
        let first = self.free_at.iter_mut().min().expect("at least one core");
        let done = (*first).max(now) + cpu;
        *first = done;
        done
    }
}

/// Commit batches, as etcd's raft loop makes them: one commit in flight at a time; writes that
/// arrive meanwhile wait for it to end and go together in the next.
#[derive(Debug, Default)]
struct Batches {
    /// When the last batch scheduled ends; it started one latency before.
    last_end: Option<Instant>,
}

impl Batches {
    /// When the commit of a write arriving at `now` is done.
    fn join(&mut self, now: Instant, latency: Duration) -> Instant {
        let end = match self.last_end {
            // Idle: a batch of its own starts now.
            None => now + latency,
            Some(end) if end <= now => now + latency,
            // The last batch is in flight: the next starts when it ends.
            Some(end) if end - latency <= now => end + latency,
            // The last batch has not started yet: join it.
            Some(end) => end,
        };
        self.last_end = Some(end);
        end
    }
}

/// Requests in flight, their peak and time-weighted sum since `since`.
#[derive(Debug, Default)]
struct Gauge {
    now: usize,
    peak: usize,
    since: Option<Instant>,
    last: Option<Instant>,
    /// Requests times seconds since `since`.
    area: f64,
}

impl Gauge {
    fn change(&mut self, at: Instant, by: isize) {
        self.accrue(at);
        self.now = self.now.saturating_add_signed(by);
        self.peak = self.peak.max(self.now);
    }

    fn accrue(&mut self, at: Instant) {
        if let Some(last) = self.last {
            self.area += self.now as f64 * at.saturating_duration_since(last).as_secs_f64();
        }
        self.last = Some(at);
        self.since.get_or_insert(at);
    }

    fn take(&mut self, at: Instant) -> InFlight {
        self.accrue(at);
        let span = self
            .since
            .map_or(0.0, |s| at.saturating_duration_since(s).as_secs_f64());
        let taken = InFlight {
            peak: self.peak,
            mean: if span > 0.0 { self.area / span } else { 0.0 },
        };
        self.peak = self.now;
        self.area = 0.0;
        self.since = Some(at);
        taken
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn writes_arriving_during_a_commit_share_the_next_one() {
        let mut b = Batches::default();
        let t0 = Instant::now();
        let first = b.join(t0, 10 * MS);
        assert_eq!(first, t0 + 10 * MS, "an idle server commits at once");
        // Three writes while the first commit is in flight: one batch, one latency, together.
        let joined: Vec<Instant> = [1, 4, 9]
            .iter()
            .map(|&m| b.join(t0 + m * MS, 10 * MS))
            .collect();
        assert_eq!(joined, vec![t0 + 20 * MS; 3]);
        // While that batch is in flight, the next write waits for the one after it.
        assert_eq!(b.join(t0 + 12 * MS, 10 * MS), t0 + 30 * MS);
        // Once everything is committed, a write commits alone again.
        assert_eq!(b.join(t0 + 50 * MS, 10 * MS), t0 + 60 * MS);
    }

    #[test]
    fn the_default_model_costs_nothing_and_waits_for_nothing() {
        let costs = Costs::default();
        assert!(!costs.model().is_on());
        costs.spend(costs.model().write);
        for _ in 0..1000 {
            costs.commit();
        }
        let s = costs.state();
        assert_eq!(
            s.batches.last_end, None,
            "no commit batch was ever scheduled"
        );
        assert!(s.cores.free_at.is_empty(), "no core was taken");
    }

    #[test]
    fn cpu_queues_for_the_core_free_first() {
        let mut c = Cores::default();
        let t0 = Instant::now();
        // Two cores: two requests at once run side by side, the third waits for the first.
        assert_eq!(c.take(t0, 4 * MS, 2), t0 + 4 * MS);
        assert_eq!(c.take(t0, 6 * MS, 2), t0 + 6 * MS);
        assert_eq!(c.take(t0 + MS, 4 * MS, 2), t0 + 8 * MS);
        // An idle core starts at once.
        assert_eq!(c.take(t0 + 20 * MS, MS, 2), t0 + 21 * MS);
    }

    #[test]
    fn the_gauge_reports_the_peak_and_the_time_weighted_mean() {
        let mut g = Gauge::default();
        let t0 = Instant::now();
        g.take(t0);
        g.change(t0, 1);
        g.change(t0 + 10 * MS, 1);
        g.change(t0 + 20 * MS, -1);
        g.change(t0 + 30 * MS, -1);
        // 0-10 ms: 1, 10-20 ms: 2, 20-30 ms: 1, 30-40 ms: 0.
        let f = g.take(t0 + 40 * MS);
        assert_eq!(f.peak, 2);
        assert!((f.mean - 1.0).abs() < 1e-9, "mean {}", f.mean);
        assert_eq!(g.take(t0 + 50 * MS).peak, 0, "a take starts afresh");
    }
}
