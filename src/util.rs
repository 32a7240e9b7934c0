//! Small helpers several stages share: a random source for jitter, RFC 3339 timestamps, and a
//! lock that survives a panicked holder.

use std::cell::Cell;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

thread_local! {
    static RNG: Cell<u64> = Cell::new(seed());
}

fn seed() -> u64 {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let local = 0u8;
    // Time, process and the address of a stack slot: distinct per thread and per process.
    (nanos ^ ((std::process::id() as u64) << 32) ^ (&local as *const u8 as u64)) | 1
}

/// A pseudo-random u64 (xorshift64*). For jitter and identities, not for secrets.
pub fn rand_u64() -> u64 {
    RNG.with(|r| {
        let mut x = r.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        r.set(x);
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    })
}

/// Uniform in [0, 1).
pub fn rand_f64() -> f64 {
    (rand_u64() >> 11) as f64 / (1u64 << 53) as f64
}

/// Uniform in [lo, hi].
pub fn rand_range(lo: u64, hi: u64) -> u64 {
    lo + rand_u64() % (hi - lo + 1)
}

/// `t` as RFC 3339 UTC with seconds precision (`2026-11-22T12:58:43Z`), the form Kubernetes
/// uses in `metav1.Time` fields.
pub fn rfc3339(t: SystemTime) -> String {
    let secs = t
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (y, mo, d, h, mi, s) = civil(secs);
    format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}Z")
}

/// `t` as RFC 3339 UTC with milliseconds, for log lines.
pub fn rfc3339_millis(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let (y, mo, day, h, mi, s) = civil(d.as_secs());
    format!(
        "{y:04}-{mo:02}-{day:02}T{h:02}:{mi:02}:{s:02}.{:03}Z",
        d.subsec_millis()
    )
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

/// Seconds since the epoch → (year, month, day, hour, minute, second), proleptic Gregorian.
/// Howard Hinnant's days-from-civil algorithm, inverted.
fn civil(secs: u64) -> (i64, u32, u32, u32, u32, u32) {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (
        y,
        m,
        d,
        (rem / 3600) as u32,
        (rem % 3600 / 60) as u32,
        (rem % 60) as u32,
    )
}

/// One shared copy of `s`, for strings many values repeat (the image most objects of a cluster
/// run). Copies no value uses any more are dropped whenever the set has doubled since it was
/// last swept, so it holds at most twice the strings in use.
pub fn intern(s: &str) -> std::sync::Arc<str> {
    use std::collections::BTreeSet;
    use std::sync::Arc;
    static SHARED: Mutex<(BTreeSet<Arc<str>>, usize)> = Mutex::new((BTreeSet::new(), 64));
    let mut guard = lock(&SHARED);
    let (set, sweep_at) = &mut *guard;
    if let Some(shared) = set.get(s) {
        return shared.clone();
    }
    if set.len() >= *sweep_at {
        set.retain(|v| Arc::strong_count(v) > 1);
        *sweep_at = (set.len() * 2).max(64);
    }
    let shared: Arc<str> = Arc::from(s);
    set.insert(shared.clone());
    shared
}

/// Parses an RFC 3339 timestamp (`2024-01-02T03:04:05Z`, optional fraction, `Z` or `±hh:mm`),
/// as Kubernetes writes `metav1.Time`. None if it is not one.
pub fn parse_rfc3339(text: &str) -> Option<SystemTime> {
    let b = text.as_bytes();
    let num = |range: std::ops::Range<usize>| -> Option<i64> {
        let digits = b.get(range)?;
        if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
            return None;
        }
        Some(digits.iter().fold(0, |n, d| n * 10 + i64::from(d - b'0')))
    };
    let sep = |i: usize, allowed: &[u8]| b.get(i).is_some_and(|c| allowed.contains(c));
    if !(sep(4, b"-") && sep(7, b"-") && sep(10, b"Tt ") && sep(13, b":") && sep(16, b":")) {
        return None;
    }
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    let mut i = 19;
    let mut nanos = 0u32;
    if sep(i, b".") {
        let start = i + 1;
        i = start;
        while b.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
        if i == start {
            return None;
        }
        let digits = &text[start..i.min(start + 9)];
        nanos = digits.parse::<u32>().ok()? * 10u32.pow(9 - digits.len() as u32);
    }
    let offset = match b.get(i)? {
        b'Z' | b'z' if b.len() == i + 1 => 0,
        sign @ (b'+' | b'-') if b.len() == i + 6 && sep(i + 3, b":") => {
            let minutes = num(i + 1..i + 3)? * 60 + num(i + 4..i + 6)?;
            if *sign == b'+' {
                minutes * 60
            } else {
                -minutes * 60
            }
        }
        _ => return None,
    };
    // A leap second (:60) is read as :59; a second early does not matter for expiry.
    let seconds =
        days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second.min(59)
            - offset;
    let whole = Duration::from_secs(seconds.unsigned_abs());
    let base = if seconds >= 0 {
        UNIX_EPOCH.checked_add(whole)?
    } else {
        UNIX_EPOCH.checked_sub(whole)?
    };
    base.checked_add(Duration::from_nanos(u64::from(nanos)))
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's `days_from_civil`).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let month_from_march = (month + 9) % 12;
    let day_of_year = (153 * month_from_march + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// Locks a mutex, recovering from poisoning: the data guarded with it (caches) stays valid if a
/// holder panicked, and the operator must not crash on it.
pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
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
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
        }
        let now = SystemTime::now();
        let whole =
            UNIX_EPOCH + Duration::from_secs(now.duration_since(UNIX_EPOCH).unwrap().as_secs());
        assert_eq!(parse_rfc3339(&rfc3339(now)), Some(whole));
    }
}
