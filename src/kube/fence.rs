//! The write fence: a client given one (`Client::fenced`) sends a write only while it is open,
//! and counts writes in flight so that whoever ends leadership knows whether one may still land.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::time::{Duration, Instant};

/// This replica's right to write: open until a point on the local monotonic clock, closed
/// before the first acquisition and for good once leadership ends.
#[derive(Debug)]
pub struct Fence {
    base: Instant,
    /// Nanoseconds after `base` until which writes may run; [`NEVER_OPENED`] or [`ENDED`].
    until: AtomicU64,
    in_flight: AtomicUsize,
}

const NEVER_OPENED: u64 = 0;
const ENDED: u64 = u64::MAX;

impl Fence {
    pub fn closed() -> Fence {
        Fence {
            base: Instant::now(),
            until: AtomicU64::new(NEVER_OPENED),
            in_flight: AtomicUsize::new(0),
        }
    }

    /// Until when a write may run, if the fence is open now.
    pub fn deadline(&self) -> Option<Instant> {
        match self.until.load(SeqCst) {
            NEVER_OPENED | ENDED => None,
            n => Some(self.base + Duration::from_nanos(n)).filter(|t| *t > Instant::now()),
        }
    }

    /// Opens the fence until `t`; never once it has ended, never shorter than it already is.
    pub fn open_until(&self, t: Instant) {
        let n = (t.saturating_duration_since(self.base).as_nanos() as u64).clamp(1, ENDED - 1);
        let _ = self
            .until
            .fetch_update(SeqCst, SeqCst, |cur| (cur != ENDED).then_some(cur.max(n)));
    }

    /// Closes the fence for good: leadership is over.
    pub fn close(&self) {
        self.until.store(ENDED, SeqCst);
    }

    /// Counts a write as in flight until the guard is dropped.
    pub fn write_started(&self) -> InFlight<'_> {
        self.in_flight.fetch_add(1, SeqCst);
        InFlight(self)
    }

    /// Writes sent and not yet answered or given up on.
    pub fn writes_in_flight(&self) -> usize {
        self.in_flight.load(SeqCst)
    }
}

pub struct InFlight<'a>(&'a Fence);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fence_moves_on_never_back_and_stays_closed_once_ended() {
        let f = Fence::closed();
        assert_eq!(f.deadline(), None, "closed until the first acquisition");
        let t = Instant::now() + Duration::from_secs(10);
        f.open_until(t);
        assert!(f
            .deadline()
            .is_some_and(|d| d.duration_since(t) < Duration::from_millis(1)));
        f.open_until(t - Duration::from_secs(5));
        assert!(f
            .deadline()
            .is_some_and(|d| d >= t - Duration::from_millis(1)));
        f.open_until(Instant::now() - Duration::from_millis(1));
        f.close();
        assert_eq!(f.deadline(), None);
        f.open_until(t + Duration::from_secs(10));
        assert_eq!(f.deadline(), None, "a late renewal does not reopen it");
    }

    #[test]
    fn a_fence_whose_time_has_passed_is_closed() {
        let f = Fence::closed();
        f.open_until(Instant::now() + Duration::from_millis(50));
        assert!(f.deadline().is_some());
        std::thread::sleep(Duration::from_millis(80));
        assert_eq!(f.deadline(), None);
    }
}
