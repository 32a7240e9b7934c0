//! How many reconcile workers run, between `min` and `max`: a worker that takes a key while
//! others wait starts one more; one idle for [`IDLE_EXIT`] ends (docs/design.md).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// How long a worker beyond the minimum waits for a key before it ends: far longer than the
/// gaps within a backlog, short enough that a burst's threads go soon after it.
pub const IDLE_EXIT: Duration = Duration::from_secs(10);

/// The number of workers running, between `min` and `max`. Shared by the workers.
#[derive(Debug)]
pub struct Pool {
    min: usize,
    max: usize,
    live: AtomicUsize,
}

impl Pool {
    pub fn new(min: usize, max: usize) -> Pool {
        Pool {
            min,
            max: max.max(min),
            live: AtomicUsize::new(0),
        }
    }

    /// Counts one worker more if the bound allows: `true` when the caller is to start it.
    pub fn start(&self) -> bool {
        self.live
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |live| {
                (live < self.max).then_some(live + 1)
            })
            .is_ok()
    }

    /// Counts an idle worker out if more than the minimum run: `true` when it is to end.
    pub fn stop_idle(&self) -> bool {
        self.live
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |live| {
                (live > self.min).then_some(live - 1)
            })
            .is_ok()
    }

    /// Counts out a worker that was counted in but could not be started.
    pub fn not_started(&self) {
        self.live.fetch_sub(1, Ordering::AcqRel);
    }

    pub fn live(&self) -> usize {
        self.live.load(Ordering::Acquire)
    }

    pub fn max(&self) -> usize {
        self.max
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_up_to_the_bound_and_no_further() {
        let pool = Pool::new(2, 4);
        assert!(pool.start() && pool.start(), "the minimum starts");
        assert!(pool.start() && pool.start(), "more while keys wait");
        assert!(!pool.start(), "never over the bound");
        assert_eq!(pool.live(), 4);
    }

    #[test]
    fn idle_workers_end_down_to_the_minimum_and_no_further() {
        let pool = Pool::new(2, 4);
        while pool.start() {}
        assert!(pool.stop_idle() && pool.stop_idle());
        assert!(!pool.stop_idle(), "the minimum stays, idle or not");
        assert_eq!(pool.live(), 2);
        // A new backlog grows it again.
        assert!(pool.start());
        assert_eq!(pool.live(), 3);
    }

    #[test]
    fn a_bound_below_the_minimum_is_the_minimum() {
        let pool = Pool::new(16, 4);
        assert_eq!(pool.max(), 16);
        for _ in 0..16 {
            assert!(pool.start());
        }
        assert!(!pool.start());
    }

    #[test]
    fn workers_growing_at_once_never_pass_the_bound() {
        let pool = std::sync::Arc::new(Pool::new(1, 8));
        let threads: Vec<_> = (0..16)
            .map(|_| {
                let pool = pool.clone();
                std::thread::spawn(move || (0..4).filter(|_| pool.start()).count())
            })
            .collect();
        let started: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
        assert_eq!(started, 8);
        assert_eq!(pool.live(), 8);
    }

    #[test]
    fn a_worker_that_could_not_start_frees_its_place() {
        let pool = Pool::new(0, 1);
        assert!(pool.start());
        pool.not_started();
        assert!(pool.start());
    }
}
