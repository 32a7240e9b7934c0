//! Small helpers with no better home: time stamps, randomness, base64, URL query decoding,
//! filling JSON maps.

use serde_json::{Map, Value};
use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Seconds since the Unix epoch, now.
pub fn unix_now() -> i64 {
    match SystemTime::now().duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_secs() as i64,
        Err(_) => 0,
    }
}

/// Now as RFC 3339 UTC with whole seconds, the precision of `metav1.Time`
/// (`creationTimestamp`, `deletionTimestamp`).
pub fn now_rfc3339() -> String {
    format_rfc3339(unix_now())
}

/// Formats Unix seconds as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn format_rfc3339(secs: i64) -> String {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

/// Parses the `YYYY-MM-DDTHH:MM:SS` prefix of an RFC 3339 UTC time stamp (fractions and the
/// zone suffix are ignored: every time stamp this server writes is UTC).
pub fn parse_rfc3339(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    if b.len() < 19 || b[4] != b'-' || b[7] != b'-' || b[10] != b'T' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| s.get(r)?.parse::<i64>().ok();
    let days = days_from_civil(num(0..4)?, num(5..7)?, num(8..10)?);
    Some(days * 86_400 + num(11..13)? * 3600 + num(14..16)? * 60 + num(17..19)?)
}

/// Howard Hinnant's `civil_from_days`: days since 1970-01-01 to (year, month, day).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// Howard Hinnant's `days_from_civil`, the inverse of [`civil_from_days`].
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The short age kubectl prints (`5s`, `3m`, `2h`, `4d`), as apimachinery's
/// `duration.HumanDuration` does for the common ranges.
pub fn human_duration(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..=119 => format!("{s}s"),
        120..=7_199 => format!("{}m", s / 60),
        7_200..=172_799 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86_400),
    }
}

/// The process-wide cryptographic random source rustls already carries (ring's), so the
/// crate needs no extra dependency for uids and tokens.
fn random_source() -> &'static dyn rustls::crypto::SecureRandom {
    static SOURCE: OnceLock<&'static dyn rustls::crypto::SecureRandom> = OnceLock::new();
    *SOURCE.get_or_init(|| rustls::crypto::ring::default_provider().secure_random)
}

/// Fills `buf` with random bytes. If the OS refuses (it does not on Linux), falls back to
/// bytes derived from the clock and a counter: uniqueness is all that callers rely on.
pub fn random_bytes(buf: &mut [u8]) {
    if random_source().fill(buf).is_ok() {
        return;
    }
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let mut x = nanos
        ^ COUNTER
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            .rotate_left(32);
    for b in buf.iter_mut() {
        // splitmix64 step
        x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        *b = (z ^ (z >> 31)) as u8;
    }
}

/// A random version-4 UUID in its canonical text form, like `metadata.uid`.
pub fn new_uid() -> String {
    let mut b = [0u8; 16];
    random_bytes(&mut b);
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h = hex(&b);
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// A random bearer token (32 hex characters).
pub fn new_token() -> String {
    let mut b = [0u8; 16];
    random_bytes(&mut b);
    hex(&b)
}

/// The 5-character suffix `generateName` gets, from the same alphabet as apimachinery's
/// `utilrand.String` (no vowels, so no words).
pub fn name_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut b = [0u8; 5];
    random_bytes(&mut b);
    b.iter()
        .map(|x| ALPHABET[*x as usize % ALPHABET.len()] as char)
        .collect()
}

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 15) as usize] as char);
    }
    s
}

/// Decodes [`hex`] output; `None` on anything else.
pub fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// Standard base64 with padding (kubeconfig's `certificate-authority-data`).
pub fn base64(data: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Decodes `%XX` escapes and, as Go's `url.ParseQuery` does in query strings, `+` as a space.
/// Malformed escapes are kept as they are.
pub fn percent_decode(s: &str, plus_is_space: bool) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                match s
                    .get(i + 1..i + 3)
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                {
                    Some(v) => {
                        out.push(v);
                        i += 3;
                    }
                    None => {
                        out.push(b'%');
                        i += 1;
                    }
                }
            }
            b'+' if plus_is_space => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Splits a query string into decoded `(key, value)` pairs, in order.
pub fn parse_query(q: &str) -> Vec<(String, String)> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('=') {
            Some((k, v)) => (percent_decode(k, true), percent_decode(v, true)),
            None => (percent_decode(p, true), String::new()),
        })
        .collect()
}

/// An object's namespace and name, empty where it has none.
pub fn namespace_and_name(obj: &serde_json::Value) -> (String, String) {
    let field = |f: &str| obj["metadata"][f].as_str().unwrap_or("").to_string();
    (field("namespace"), field("name"))
}

/// The object at `m[key]`, made an empty object first if it is missing or not an object.
pub fn obj_mut<'a>(m: &'a mut Map<String, Value>, key: &str) -> &'a mut Map<String, Value> {
    let slot = m
        .entry(key.to_string())
        .or_insert_with(|| Value::Object(Map::new()));
    if !slot.is_object() {
        *slot = Value::Object(Map::new());
    }
    match slot {
        Value::Object(o) => o,
        // Unreachable: replaced by an object just above.
        _ => unreachable!("slot was just made an object"),
    }
}

/// Sets `m[key]` to `v` unless it holds a value already (absent or null counts as unset).
pub fn set_default(m: &mut Map<String, Value>, key: &str, v: Value) {
    if m.get(key).is_none_or(Value::is_null) {
        m.insert(key.to_string(), v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_round_trips_known_instants() {
        assert_eq!(format_rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(format_rfc3339(1_795_352_323), "2026-11-22T12:58:43Z");
        assert_eq!(parse_rfc3339("2026-11-22T12:58:43Z"), Some(1_795_352_323));
        assert_eq!(
            parse_rfc3339("2024-02-29T00:00:00.000000Z"),
            Some(1_709_164_800)
        );
        assert_eq!(parse_rfc3339("garbage"), None);
    }

    #[test]
    fn uid_looks_like_uuid_v4() {
        let u = new_uid();
        assert_eq!(u.len(), 36);
        assert_eq!(&u[14..15], "4");
        assert_ne!(u, new_uid());
    }

    #[test]
    fn base64_matches_rfc4648_vectors() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
    }

    #[test]
    fn query_decoding_handles_escapes_and_plus() {
        let q = parse_query("labelSelector=app%3Dweb%2Ctier%21%3Ddb&watch=1&x=a+b&bad=%zz");
        assert_eq!(q[0], ("labelSelector".into(), "app=web,tier!=db".into()));
        assert_eq!(q[1], ("watch".into(), "1".into()));
        assert_eq!(q[2], ("x".into(), "a b".into()));
        assert_eq!(q[3], ("bad".into(), "%zz".into()));
    }

    #[test]
    fn hex_round_trips() {
        assert_eq!(unhex(&hex(b"ns\0name")), Some(b"ns\0name".to_vec()));
        assert_eq!(unhex("zz"), None);
    }
}
