//! Small helpers several stages share: randomness for jitter, RFC 3339 times, a poison-proof lock.

use std::borrow::Borrow;
use std::collections::hash_map::RandomState;
use std::collections::BTreeSet;
use std::hash::{BuildHasher, Hasher};
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A random u64, for jitter and identities, not secrets: std's OS-seeded `RandomState`.
pub fn rand_u64() -> u64 {
    RandomState::new().build_hasher().finish()
}

/// Uniform in [0, 1).
pub fn rand_f64() -> f64 {
    (rand_u64() >> 11) as f64 / (1u64 << 53) as f64
}

/// Uniform in [lo, hi].
pub fn rand_range(lo: u64, hi: u64) -> u64 {
    lo + rand_u64() % (hi - lo + 1)
}

/// `t` as RFC 3339 UTC to the second, as Kubernetes writes `metav1.Time`.
pub fn rfc3339(t: SystemTime) -> String {
    // jiff prints no fraction for a whole second.
    timestamp(t, false).to_string()
}

/// `t` as RFC 3339 UTC with milliseconds, for log lines.
pub fn rfc3339_millis(t: SystemTime) -> String {
    format!("{:.3}", timestamp(t, true))
}

/// `t` to the second (or the millisecond), from the epoch to jiff's last instant (year 9999).
fn timestamp(t: SystemTime, millis: bool) -> jiff::Timestamp {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let nanos = if millis {
        d.subsec_millis() * 1_000_000
    } else {
        0
    };
    i64::try_from(d.as_secs())
        .ok()
        .and_then(|secs| jiff::Timestamp::new(secs, nanos as i32).ok())
        .unwrap_or(jiff::Timestamp::MAX)
}

/// Now, as [`rfc3339`].
pub fn now_rfc3339() -> String {
    rfc3339(SystemTime::now())
}

/// The time `d` from now, RFC 3339 in UTC, rounded up to the second.
pub fn rfc3339_after(d: std::time::Duration) -> String {
    let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    rfc3339(SystemTime::now() + std::time::Duration::from_secs(secs))
}

/// `d` as a person says it, as kubectl's AGE is: two units while the larger is under 10
/// ("4 min 30 s"), one after ("25 min"). Cut, never rounded up, so that "over 25 min" stays true.
pub fn human_duration(d: Duration) -> String {
    const UNITS: [(u64, &str); 4] = [(86_400, "day"), (3_600, "h"), (60, "min"), (1, "s")];
    let say = |n: u64, unit: &str| match (n, unit) {
        (1, "day") => "1 day".to_string(),
        (n, "day") => format!("{n} days"),
        (n, unit) => format!("{n} {unit}"),
    };
    let secs = d.as_secs();
    let Some(i) = UNITS.iter().position(|&(size, _)| secs >= size) else {
        return "0 s".into();
    };
    let (size, unit) = UNITS[i];
    let (n, rest) = (secs / size, secs % size);
    match UNITS.get(i + 1) {
        Some(&(small, next)) if n < 10 && rest >= small => {
            format!("{} {}", say(n, unit), say(rest / small, next))
        }
        _ => say(n, unit),
    }
}

/// One shared copy of `s`, for strings many values repeat (an image).
pub fn intern(s: &str) -> Arc<str> {
    static SHARED: SharedSet<str> = SharedSet::new();
    SHARED.get(s, |s| Arc::from(s))
}

/// One shared copy of each value many others repeat; unused copies are swept as the set doubles.
pub struct SharedSet<T: ?Sized>(Mutex<(BTreeSet<Arc<T>>, usize)>);

impl<T: Ord + ?Sized> SharedSet<T> {
    pub(crate) const fn new() -> SharedSet<T> {
        SharedSet(Mutex::new((BTreeSet::new(), 64)))
    }

    /// The shared copy equal to `value`, made by `make` when there is none.
    pub fn get<Q>(&self, value: &Q, make: impl FnOnce(&Q) -> Arc<T>) -> Arc<T>
    where
        Arc<T>: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        let mut guard = lock(&self.0);
        let (set, sweep_at) = &mut *guard;
        if let Some(shared) = set.get(value) {
            return shared.clone();
        }
        if set.len() >= *sweep_at {
            set.retain(|v| Arc::strong_count(v) > 1);
            *sweep_at = (set.len() * 2).max(64);
        }
        let shared = make(value);
        set.insert(shared.clone());
        shared
    }
}

/// Parses an RFC 3339 timestamp, as Kubernetes writes `metav1.Time`; a leap second reads as :59.
pub fn parse_rfc3339(text: &str) -> Option<SystemTime> {
    if !rfc3339_shaped(text.as_bytes()) {
        return None;
    }
    let t: jiff::Timestamp = text.parse().ok()?;
    SystemTime::try_from(t).ok()
}

/// Whether `b` has the shape of RFC 3339's `date-time`: jiff parses the wider ISO 8601, which no
/// Kubernetes timestamp uses; the values and the calendar are jiff's to check.
fn rfc3339_shaped(b: &[u8]) -> bool {
    let digits = |r: &[u8]| !r.is_empty() && r.iter().all(u8::is_ascii_digit);
    let zone = match b.last() {
        Some(b'Z' | b'z') => 1,
        _ => 6,
    };
    if b.len() < 19 + zone {
        return false;
    }
    let (main, offset) = b.split_at(b.len() - zone);
    let shape = b"dddd-dd-ddTdd:dd:dd";
    let fixed = main.iter().zip(shape).all(|(c, want)| match want {
        b'd' => c.is_ascii_digit(),
        b'T' => matches!(c, b'T' | b't' | b' '),
        want => c == want,
    });
    let fraction = main.len() == 19 || (main[19] == b'.' && digits(&main[20..]));
    let offset = zone == 1
        || (matches!(offset[0], b'+' | b'-')
            && digits(&offset[1..3])
            && offset[3] == b':'
            && digits(&offset[4..6]));
    fixed && fraction && offset
}

/// Locks a mutex, recovering from poisoning: what it guards stays valid if a holder panicked.
pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A moment in 4 bytes where an `Instant` takes 16, for what is kept per object: ticks since an
/// `epoch` its owner keeps, wrapping every few days, since only ages of minutes are read of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp(NonZeroU32);

const TICK_MICROS: u128 = 100;

impl Stamp {
    /// `t`, counted from `epoch`.
    pub fn of(t: Instant, epoch: Instant) -> Stamp {
        // Counted from 1, so that 0 is free for `None`; a wrap's last tick reads as the first.
        let ticks = (t.saturating_duration_since(epoch).as_micros() / TICK_MICROS) as u32;
        Stamp(NonZeroU32::new(ticks.wrapping_add(1)).unwrap_or(NonZeroU32::MIN))
    }

    /// The time from this stamp to `now`.
    pub fn until(self, now: Stamp) -> Duration {
        let ticks = now.0.get().wrapping_sub(self.0.get());
        Duration::from_micros(u64::from(ticks) * TICK_MICROS as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_and_parses_rfc3339_round_trip() {
        let t = UNIX_EPOCH + Duration::from_secs(1_795_352_323);
        assert_eq!(rfc3339(t), "2026-11-22T12:58:43Z");
        assert_eq!(parse_rfc3339("2026-11-22T12:58:43Z"), Some(t));
        assert_eq!(parse_rfc3339("2026-11-22T13:58:43+01:00"), Some(t));
        assert_eq!(
            rfc3339(UNIX_EPOCH + Duration::from_secs(951_782_400)),
            "2000-02-29T00:00:00Z"
        );
        assert_eq!(parse_rfc3339("not a time"), None);
        assert_eq!(parse_rfc3339("2026-13-01T00:00:00Z"), None);
    }

    #[test]
    fn durations_read_as_a_person_says_them() {
        let s = Duration::from_secs;
        for (d, said) in [
            (Duration::from_millis(300), "0 s"),
            (s(2), "2 s"),
            (s(59), "59 s"),
            (s(60), "1 min"),
            (s(90), "1 min 30 s"),
            (s(270), "4 min 30 s"),
            (s(300), "5 min"),
            (s(1502), "25 min"),
            (s(3_599), "59 min"),
            (s(3_600 + 5 * 60 + 9), "1 h 5 min"),
            (s(14 * 3_600 + 59 * 60), "14 h"),
            (s(86_400 + 3 * 3_600), "1 day 3 h"),
            (s(2 * 86_400), "2 days"),
            (s(12 * 86_400 + 3_600), "12 days"),
        ] {
            assert_eq!(human_duration(d), said, "{d:?}");
        }
    }

    #[test]
    fn impossible_dates_are_refused() {
        for bad in [
            "2026-02-31T00:00:00Z",
            "2023-02-29T00:00:00Z",
            "2026-04-31T00:00:00Z",
            "2026-01-01T24:00:00Z",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
        }
        assert!(parse_rfc3339("2026-01-31T23:59:59Z").is_some());
    }

    #[test]
    fn a_stamp_reads_ages_to_a_tenth_of_a_millisecond_in_four_bytes_across_its_wrap() {
        let epoch = Instant::now();
        let t = epoch + Duration::from_millis(1500);
        let later = Stamp::of(t + Duration::from_micros(2_300), epoch);
        assert_eq!(
            Stamp::of(t, epoch).until(later),
            Duration::from_micros(2_300)
        );
        // Five days in, past the wrap of its 32 bits (4.97 days), an age still reads right.
        let late = epoch + Duration::from_secs(5 * 86_400);
        let nine_on = Stamp::of(late + Duration::from_secs(9), epoch);
        assert_eq!(
            Stamp::of(late, epoch).until(nine_on),
            Duration::from_secs(9)
        );
        assert_eq!(std::mem::size_of::<Option<Stamp>>(), 4);
    }

    #[test]
    fn log_timestamps_have_three_fraction_digits() {
        let t = UNIX_EPOCH + Duration::from_millis(1_795_352_323_042);
        assert_eq!(rfc3339_millis(t), "2026-11-22T12:58:43.042Z");
        assert_eq!(rfc3339_millis(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
    }

    #[test]
    fn random_values_stay_in_range() {
        for _ in 0..1000 {
            let f = rand_f64();
            assert!((0.0..1.0).contains(&f));
            assert!((170..=230).contains(&rand_range(170, 230)));
        }
    }

    #[test]
    fn rfc3339_timestamps_parse_with_fractions_and_offsets() {
        let at = |secs: u64, nanos: u32| Some(UNIX_EPOCH + Duration::new(secs, nanos));
        assert_eq!(parse_rfc3339("1970-01-01T00:00:00Z"), at(0, 0));
        assert_eq!(parse_rfc3339("2024-02-29T12:34:56Z"), at(1_709_210_096, 0));
        assert_eq!(
            parse_rfc3339("2024-02-29T14:34:56.5+02:00"),
            at(1_709_210_096, 500_000_000)
        );
        assert_eq!(
            parse_rfc3339("2024-02-29t12:34:56.123456789z"),
            at(1_709_210_096, 123_456_789)
        );
        assert_eq!(
            parse_rfc3339("2024-02-29T07:04:56-05:30"),
            at(1_709_210_096, 0)
        );
        assert_eq!(
            parse_rfc3339("1969-12-31T23:59:59Z"),
            Some(UNIX_EPOCH - Duration::from_secs(1))
        );
        for bad in [
            "",
            "tomorrow",
            "2024-02-29",
            "2024-02-29T12:34:56",
            "2024-13-01T00:00:00Z",
            "2024-02-29T12:34:56+0200",
            "2024-02-29T12:34:56.Z",
            "2024-02-29T12:34Z",
            "20240229T123456Z",
            "2024-02-29T12:34:56+02",
            "2024-02-29T12:34:56+02:00[Europe/Paris]",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
        }
        let now = SystemTime::now();
        let whole =
            UNIX_EPOCH + Duration::from_secs(now.duration_since(UNIX_EPOCH).unwrap().as_secs());
        assert_eq!(parse_rfc3339(&rfc3339(now)), Some(whole));
    }
}
