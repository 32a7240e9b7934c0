//! Log output: readable `key=value` text or one JSON object per line, from `log` records and
//! their fields; the level contract is in docs/operating.md ("Logs"). Never a header is logged,
//! so never a token.

use crate::util;
use log::kv::{Error as KvError, Key, Value, VisitSource, VisitValue};
use std::fmt::Write as _;
use std::io::Write;
use std::time::SystemTime;

/// Output format, from `--log-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Text,
    Json,
}

/// Installs the global logger: `RUST_LOG` (default `info`), ureq and rustls at `warn` unless named.
pub fn init(format: Format) {
    JSON.store(format == Format::Json, std::sync::atomic::Ordering::Relaxed);
    let mut b = env_logger::Builder::new();
    b.filter_level(log::LevelFilter::Info)
        .filter_module("ureq", log::LevelFilter::Warn)
        .filter_module("rustls", log::LevelFilter::Warn)
        .parse_default_env();
    b.format(move |buf, record| {
        let line = render(format, SystemTime::now(), record);
        buf.write_all(line.as_bytes())
    });
    // Tests may initialise twice; the first logger wins.
    let _ = b.try_init();
}

static JSON: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether logs are JSON (machines read them) rather than text (people do).
pub fn is_json() -> bool {
    JSON.load(std::sync::atomic::Ordering::Relaxed)
}

/// Formats one record as a line (newline included).
pub fn render(format: Format, now: SystemTime, record: &log::Record) -> String {
    let ts = util::rfc3339_millis(now);
    let target = short_target(record.target());
    let msg = record.args().to_string();
    let mut out = String::with_capacity(160);
    match format {
        Format::Text => {
            let _ = write!(out, "{ts} {:<5} {target}: {msg}", record.level());
            let _ = record.key_values().visit(&mut Fields(&mut out, format));
        }
        Format::Json => {
            let (level, target, msg) = (record.level(), json_str(target), json_str(&msg));
            let _ = write!(
                out,
                r#"{{"ts":"{ts}","level":"{level}","target":{target},"msg":{msg}"#
            );
            let _ = record.key_values().visit(&mut Fields(&mut out, format));
            out.push('}');
        }
    }
    out.push('\n');
    out
}

/// `immortal_operator::reconcile` → `reconcile`; explicit targets pass through.
fn short_target(t: &str) -> &str {
    t.rsplit("::").next().unwrap_or(t)
}

/// A field given as `None` is left out: it reads better absent than as `None`.
fn is_none(value: &Value) -> bool {
    struct Null(bool);
    impl VisitValue<'_> for Null {
        fn visit_any(&mut self, _: Value) -> Result<(), KvError> {
            Ok(())
        }
        fn visit_null(&mut self) -> Result<(), KvError> {
            self.0 = true;
            Ok(())
        }
    }
    let mut null = Null(false);
    let _ = value.visit(&mut null);
    null.0
}

/// Writes a record's fields after its message, in `.1`'s format.
struct Fields<'a>(&'a mut String, Format);

impl<'kvs> VisitSource<'kvs> for Fields<'_> {
    fn visit_pair(&mut self, key: Key<'kvs>, value: Value<'kvs>) -> Result<(), KvError> {
        if is_none(&value) {
            return Ok(());
        }
        let out = &mut *self.0;
        if self.1 == Format::Text {
            let v = value.to_string();
            // Quote values a reader (or `cut`) would otherwise split.
            if v.is_empty() || v.contains([' ', '"', '=']) {
                let _ = write!(out, " {key}={v:?}");
            } else {
                let _ = write!(out, " {key}={v}");
            }
            return Ok(());
        }
        let _ = write!(out, ",{}:", json_str(key.as_str()));
        if let Some(n) = value.to_i128() {
            let _ = write!(out, "{n}");
        } else if let Some(n) = value.to_f64().filter(|n| n.is_finite()) {
            // Rust prints a finite f64 without an exponent: always a JSON number.
            let _ = write!(out, "{n}");
        } else if let Some(b) = value.to_bool() {
            let _ = write!(out, "{b}");
        } else {
            out.push_str(&json_str(&value.to_string()));
        }
        Ok(())
    }
}

fn json_str(s: &str) -> String {
    // A `&str` always serializes.
    serde_json::to_string(s).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    fn with_record(f: impl FnOnce(&log::Record) -> String) -> String {
        let kvs: [(&str, Value); 4] = [
            ("object", Value::from("ns/web")),
            ("reconcile_id", Value::from(7u64)),
            ("ready", Value::from(true)),
            ("error", Value::from("api error 500: \"boom\"")),
        ];
        let args = format_args!("reconciled");
        let record = log::Record::builder()
            .args(args)
            .level(log::Level::Info)
            .target("immortal_operator::reconcile")
            .key_values(&kvs)
            .build();
        f(&record)
    }

    #[test]
    fn json_lines_are_valid_json_with_typed_fields() {
        let t = UNIX_EPOCH + Duration::from_millis(1_795_352_323_042);
        let line = with_record(|r| render(Format::Json, t, r));
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["ts"], "2026-11-22T12:58:43.042Z");
        assert_eq!(v["level"], "INFO");
        assert_eq!(v["target"], "reconcile");
        assert_eq!(v["msg"], "reconciled");
        assert_eq!(v["object"], "ns/web");
        assert_eq!(v["reconcile_id"], 7);
        assert_eq!(v["ready"], true);
        assert_eq!(v["error"], "api error 500: \"boom\"");
    }

    #[test]
    fn json_lines_keep_control_characters_and_unicode_of_a_message() {
        let msg = "line one\nline two\t\u{1}\u{7f} é \\ \"q\"";
        // One statement: the record borrows the message's formatting arguments.
        let line = render(
            Format::Json,
            UNIX_EPOCH,
            &log::Record::builder()
                .args(format_args!("{msg}"))
                .level(log::Level::Warn)
                .target("reconcile")
                .build(),
        );
        assert_eq!(line.lines().count(), 1, "{line}");
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["msg"], msg);
    }

    #[test]
    fn durations_are_numbers_in_json_and_plain_in_text() {
        let kvs: [(&str, Value); 2] = [
            ("elapsed_ms", Value::from(3.1f64)),
            ("requeue_after_ms", Value::from(5000u64)),
        ];
        let record = log::Record::builder()
            .args(format_args!("reconciled"))
            .level(log::Level::Info)
            .target("reconcile")
            .key_values(&kvs)
            .build();
        let json = render(Format::Json, UNIX_EPOCH, &record);
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v["elapsed_ms"], 3.1);
        assert_eq!(v["requeue_after_ms"], 5000);
        let text = render(Format::Text, UNIX_EPOCH, &record);
        assert!(
            text.ends_with(" elapsed_ms=3.1 requeue_after_ms=5000\n"),
            "{text}"
        );
    }

    #[test]
    fn a_field_given_as_none_is_left_out_of_both_formats() {
        let (some, none): (Option<&str>, Option<&str>) = (Some("EvictionByEvictionAPI"), None);
        let kvs: [(&str, Value); 3] = [
            ("cause", Value::from("deleted")),
            ("reason", log::kv::ToValue::to_value(&some)),
            ("other", log::kv::ToValue::to_value(&none)),
        ];
        let record = log::Record::builder()
            .args(format_args!("created pod"))
            .level(log::Level::Info)
            .target("reconcile")
            .key_values(&kvs)
            .build();
        let text = render(Format::Text, UNIX_EPOCH, &record);
        assert!(
            text.ends_with("created pod cause=deleted reason=EvictionByEvictionAPI\n"),
            "{text}"
        );
        let json = render(Format::Json, UNIX_EPOCH, &record);
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v["reason"], "EvictionByEvictionAPI");
        assert!(v.get("other").is_none(), "{json}");
    }

    #[test]
    fn text_lines_are_key_value_and_quote_what_needs_it() {
        let line = with_record(|r| render(Format::Text, UNIX_EPOCH, r));
        assert_eq!(
            line,
            "1970-01-01T00:00:00.000Z INFO  reconcile: reconciled object=ns/web reconcile_id=7 ready=true \
             error=\"api error 500: \\\"boom\\\"\"\n"
        );
    }
}
