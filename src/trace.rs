//! `immortal-operator trace NAMESPACE/NAME`: one object's reconciliation history, read back from
//! the operator's logs (text or JSON): what triggered each reconcile, its writes and outcome.

use crate::cli::TraceArgs;
use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, IsTerminal, Write};
use std::process::ExitCode;

/// Exit code when no line of the log is about the object (2 is for bad flags).
const EXIT_NOTHING_FOUND: u8 = 1;
/// Exit code when the log file cannot be read: a wrong path, not a wrong command line.
const EXIT_CANNOT_READ: u8 = 3;

pub fn run(args: &TraceArgs) -> ExitCode {
    let (input, source): (Box<dyn BufRead>, String) = match &args.log {
        Some(path) => match std::fs::File::open(path) {
            Ok(f) => (Box::new(BufReader::new(f)), path.display().to_string()),
            Err(e) => {
                let path = path.display();
                eprintln!("immortal-operator trace: cannot open {path}: {e}");
                return ExitCode::from(EXIT_CANNOT_READ);
            }
        },
        None => {
            let stdin = std::io::stdin();
            // A person who typed the command without --log would otherwise see nothing happen.
            if stdin.is_terminal() {
                eprintln!(
                    "immortal-operator trace: reading the operator's log from standard input \
                     (end it with Ctrl-D); to read a file, pass --log FILE"
                );
            }
            (Box::new(stdin.lock()), "standard input".into())
        }
    };
    let t = timeline(input, &args.object);
    let _ = std::io::stdout().lock().write_all(t.text.as_bytes());
    if t.found > 0 {
        return ExitCode::SUCCESS;
    }
    if t.understood == 0 {
        eprintln!(
            "immortal-operator trace: no log line mentions {}: {source} holds no operator log \
             lines ({} lines read; trace reads what immortal-operator writes, text or JSON)",
            args.object, t.read
        );
    } else {
        eprintln!(
            "immortal-operator trace: no log line mentions {} ({} operator log lines read from \
             {source}, none about it; is the namespace right?)",
            args.object, t.understood
        );
    }
    ExitCode::from(EXIT_NOTHING_FOUND)
}

/// What reading a log found.
#[derive(Debug, Default)]
struct Timeline {
    /// The timeline, one reconcile (or lone line) after another.
    text: String,
    /// Lines about the object.
    found: usize,
    /// Lines in a format the operator writes, about any object or none.
    understood: usize,
    read: usize,
}

/// A log line's fields by name: `ts`, `level`, `target`, `msg` and the line's own.
type Fields = BTreeMap<String, String>;

/// One reconcile being assembled.
#[derive(Default)]
struct Pending {
    id: String,
    started: String,
    trigger: String,
    /// One indented line per step.
    steps: String,
}

impl Pending {
    /// (when it began, its text, ending with `outcome`).
    fn finish(self, outcome: &str) -> (String, String) {
        let (id, started, trigger, steps) = (self.id, self.started, self.trigger, self.steps);
        let text =
            format!("{started}  reconcile {id}  triggered by: {trigger}\n{steps}    {outcome}\n");
        (started, text)
    }
}

/// Builds the timeline of `object` from the operator's log lines; other lines are skipped.
fn timeline(input: impl BufRead, object: &str) -> Timeline {
    let mut t = Timeline::default();
    // (when it began, its text), sorted at the end: a reconcile is whole only at its outcome.
    let mut entries: Vec<(String, String)> = Vec::new();
    // Reconciles begun and not ended, in the order they began.
    let mut open: Vec<Pending> = Vec::new();
    for line in input.lines().map_while(Result::ok) {
        t.read += 1;
        let Some(mut f) = parse_line(&line) else {
            continue;
        };
        t.understood += 1;
        if f.remove("object").as_deref() != Some(object) {
            continue;
        }
        t.found += 1;
        // What is left in `f` once these are taken are the fields worth showing.
        let [ts, level, msg, trigger, _] =
            ["ts", "level", "msg", "trigger", "target"].map(|k| f.remove(k).unwrap_or_default());
        let action = f.remove("action");
        let Some(id) = f.remove("reconcile_id") else {
            // Not part of a reconcile (an Event, a watch decision): show it on its own.
            entries.push((ts.clone(), format!("{ts}  {level} {msg}{}\n", show(&f))));
            continue;
        };
        let i = open.iter().position(|p| p.id == id).unwrap_or_else(|| {
            open.push(Pending {
                id,
                started: ts,
                ..Default::default()
            });
            open.len() - 1
        });
        if open[i].trigger.is_empty() {
            open[i].trigger = trigger;
        }
        match msg.as_str() {
            "reconciling" => {}
            "reconciled" | "reconcile failed" => {
                let get = |k: &str| f.get(k).map_or("", String::as_str);
                let mut outcome = format!("→ {}", get("result"));
                if let Some(error) = f.get("error") {
                    let _ = write!(outcome, ": {error}");
                }
                if let Some(after) = f.get("requeue_after_ms") {
                    let _ = write!(outcome, "; next look in {after} ms");
                }
                let _ = write!(outcome, " ({} ms", get("elapsed_ms"));
                // Older lines have no queue wait: show it only when the line has one.
                if let (Some(queued), Some(band)) = (f.get("queued_ms"), f.get("priority")) {
                    let _ = write!(outcome, ", after {queued} ms queued {band}");
                }
                entries.push(open.remove(i).finish(&format!("{outcome})")));
            }
            msg => {
                let action = action.as_deref().unwrap_or(msg);
                // A request answered otherwise than asked: what was sent, then the answer.
                let answer = match (f.remove("result"), f.remove("error")) {
                    (Some(result), Some(error)) => format!(" → {result}: {error}"),
                    (Some(result), None) => format!(" → {result}"),
                    (None, Some(error)) => format!(" → {error}"),
                    (None, None) => String::new(),
                };
                let _ = writeln!(open[i].steps, "    {action}:{}{answer}", show(&f));
            }
        }
    }
    // Reconciles the log ends in the middle of (the operator was killed).
    for p in open {
        entries.push(p.finish("→ no outcome logged (the operator stopped during this reconcile)"));
    }
    // Stable: what began in the same millisecond stays in log order.
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    t.text = entries.into_iter().map(|(_, text)| text).collect();
    t
}

/// One log line's fields, if it is in a format the operator writes: a JSON object with `ts`
/// and `msg` (values that are no strings as JSON), or a text line.
fn parse_line(line: &str) -> Option<Fields> {
    let line = line.trim_end();
    if !line.starts_with('{') {
        return parse_text(line);
    }
    let v: BTreeMap<String, Value> = serde_json::from_str(line).ok()?;
    let f: Fields = v
        .into_iter()
        .map(|(k, v)| match v {
            Value::String(s) => (k, s),
            v => (k, v.to_string()),
        })
        .collect();
    (f.contains_key("ts") && f.contains_key("msg")).then_some(f)
}

/// A text line as `runtime/logging.rs` writes it: `TS LEVEL target: message key=value
/// key="quoted value"`, values quoted as Rust strings where they need it.
fn parse_text(line: &str) -> Option<Fields> {
    let (ts, rest) = line.trim_end_matches(['\n', '\r']).split_once(' ')?;
    crate::util::parse_rfc3339(ts)?;
    let (level, rest) = rest.trim_start().split_once(' ')?;
    if !matches!(level, "ERROR" | "WARN" | "INFO" | "DEBUG" | "TRACE") {
        return None;
    }
    let (target, rest) = rest.trim_start().split_once(": ")?;
    if target.is_empty() || target.contains(' ') {
        return None;
    }
    // The message is free text; the fields are the longest run of ` key=value` at its end.
    let (msg, fields) = rest
        .match_indices(' ')
        .find_map(|(i, _)| Some((&rest[..i], parse_fields(&rest[i..])?)))
        .unwrap_or((rest, Vec::new()));
    let head = [
        ("ts", ts),
        ("level", level),
        ("target", target),
        ("msg", msg),
    ];
    let head = head.map(|(k, v)| (k.to_string(), v.to_string()));
    Some(head.into_iter().chain(fields).collect())
}

/// `s` as a sequence of ` key=value` pairs and nothing else.
fn parse_fields(mut s: &str) -> Option<Vec<(String, String)>> {
    let mut out = Vec::new();
    while !s.is_empty() {
        let (key, rest) = s.strip_prefix(' ')?.split_once('=')?;
        let key_ok = key.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !key_ok {
            return None;
        }
        let value;
        (value, s) = if rest.starts_with('"') {
            unquote(rest)?
        } else {
            let (v, after) = rest.split_at(rest.find(' ').unwrap_or(rest.len()));
            if v.is_empty() || v.contains(['"', '=']) {
                return None;
            }
            (v.to_string(), after)
        };
        out.push((key.to_string(), value));
    }
    Some(out)
}

/// A Rust-quoted string (`{:?}` of a `str`) at the start of `s`: its value and what follows.
fn unquote(s: &str) -> Option<(String, &str)> {
    let mut out = String::new();
    let mut chars = s.char_indices().skip(1);
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return Some((out, &s[i + 1..])),
            '\\' => match chars.next()?.1 {
                'n' => out.push('\n'),
                'r' => out.push('\r'),
                't' => out.push('\t'),
                '0' => out.push('\0'),
                'u' => {
                    // \u{1f}
                    let rest = &s[chars.next()?.0..];
                    let close = rest.find('}')?;
                    let code = u32::from_str_radix(rest.get(1..close)?, 16).ok()?;
                    out.push(char::from_u32(code)?);
                    for _ in 0..close {
                        chars.next();
                    }
                }
                other => out.push(other),
            },
            c => out.push(c),
        }
    }
    None
}

/// ` key=value` for each of `fields`.
fn show(fields: &Fields) -> String {
    fields.iter().map(|(k, v)| format!(" {k}={v}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = r#"{"ts":"2026-11-22T03:12:00.001Z","level":"DEBUG","target":"reconcile","msg":"reconciling","reconcile_id":"ab-7","object":"demo/web","trigger":"pod DELETED rv=970"}
{"ts":"2026-11-22T03:12:00.002Z","level":"INFO","target":"reconcile","msg":"created pod","reconcile_id":"ab-7","object":"demo/web","action":"create_pod","pod":"web-immortalpod","uid":"u2","cause":"deleted"}
not json at all
{"ts":"2026-11-22T03:12:00.002Z","level":"INFO","target":"reconcile","msg":"reconciled","reconcile_id":"ab-8","object":"demo/other","trigger":"relist","result":"success","elapsed_ms":"1.0"}
{"ts":"2026-11-22T03:12:00.003Z","level":"INFO","target":"reconcile","msg":"updated status","reconcile_id":"ab-7","object":"demo/web","action":"patch_status","start_times":2}
{"ts":"2026-11-22T03:12:00.004Z","level":"INFO","target":"reconcile","msg":"reconciled","reconcile_id":"ab-7","object":"demo/web","trigger":"pod DELETED rv=970","result":"success","elapsed_ms":"3.1"}
{"ts":"2026-11-22T03:13:00.000Z","level":"DEBUG","target":"reconcile","msg":"reconciling","reconcile_id":"ab-9","object":"demo/web","trigger":"immortalcontainer MODIFIED rv=990"}
"#;

    #[test]
    fn groups_one_objects_lines_by_reconcile_with_trigger_writes_and_outcome() {
        let t = timeline(LOG.as_bytes(), "demo/web");
        assert_eq!((t.found, t.understood, t.read), (5, 6, 7));
        assert_eq!(
            t.text,
            "2026-11-22T03:12:00.001Z  reconcile ab-7  triggered by: pod DELETED rv=970\n\
             \x20   create_pod: cause=deleted pod=web-immortalpod uid=u2\n\
             \x20   patch_status: start_times=2\n\
             \x20   → success (3.1 ms)\n\
             2026-11-22T03:13:00.000Z  reconcile ab-9  triggered by: immortalcontainer MODIFIED rv=990\n\
             \x20   → no outcome logged (the operator stopped during this reconcile)\n"
        );
    }

    /// The same story as `LOG`, as the operator writes it by default (`--log-format text`).
    const TEXT_LOG: &str = r#"2026-11-22T03:12:00.001Z DEBUG reconcile: reconciling reconcile_id=ab-7 object=demo/web trigger="pod DELETED rv=970"
2026-11-22T03:12:00.002Z INFO  reconcile: created pod reconcile_id=ab-7 object=demo/web action=create_pod pod=web-immortalpod uid=u2 cause=deleted
immortal-operator: a line that is not a log line
2026-11-22T03:12:00.002Z INFO  reconcile: reconciled reconcile_id=ab-8 object=demo/other trigger=relist result=success elapsed_ms=1
2026-11-22T03:12:00.003Z INFO  reconcile: updated status reconcile_id=ab-7 object=demo/web action=patch_status start_times=2
2026-11-22T03:12:00.004Z INFO  reconcile: reconciled reconcile_id=ab-7 object=demo/web trigger="pod DELETED rv=970" result=success elapsed_ms=3.1
2026-11-22T03:13:00.000Z DEBUG reconcile: reconciling reconcile_id=ab-9 object=demo/web trigger="immortalcontainer MODIFIED rv=990"
"#;

    #[test]
    fn the_default_text_format_traces_as_json_does() {
        let text = timeline(TEXT_LOG.as_bytes(), "demo/web");
        let json = timeline(LOG.as_bytes(), "demo/web");
        assert_eq!(text.text, json.text);
        assert_eq!((text.found, text.understood, text.read), (5, 6, 7));
    }

    #[test]
    fn a_text_line_at_info_alone_still_makes_a_reconcile() {
        // The default level: no DEBUG "reconciling" line; the outcome carries the trigger.
        let log = "2026-11-22T03:12:00.004Z INFO  reconcile: reconciled reconcile_id=1-2 object=ns/a trigger=\"immortalcontainer ADDED rv=7\" result=success elapsed_ms=0.4\n\
                   2026-11-22T03:12:00.005Z INFO  events: recorded event object=ns/a action=create_event reason=PodCreated type=Normal result=success\n";
        let t = timeline(log.as_bytes(), "ns/a");
        assert_eq!(
            t.text,
            "2026-11-22T03:12:00.004Z  reconcile 1-2  triggered by: immortalcontainer ADDED rv=7\n\
             \x20   → success (0.4 ms)\n\
             2026-11-22T03:12:00.005Z  INFO recorded event reason=PodCreated result=success type=Normal\n"
        );
    }

    #[test]
    fn the_timeline_says_how_long_the_key_waited_and_in_which_band() {
        let log = "2026-11-22T03:12:00.004Z INFO  reconcile: reconciled reconcile_id=1-2 object=ns/a trigger=\"pod DELETED rv=9\" result=success elapsed_ms=0.4 queued_ms=12.5 priority=urgent\n";
        let t = timeline(log.as_bytes(), "ns/a");
        assert!(
            t.text
                .contains("→ success (0.4 ms, after 12.5 ms queued urgent)"),
            "{}",
            t.text
        );
    }

    #[test]
    fn a_line_logged_during_a_reconcile_comes_after_it_in_the_timeline() {
        let log = "2026-11-22T03:12:00.001Z INFO  reconcile: created pod reconcile_id=1-4 object=ns/a action=create_pod cause=deleted\n\
                   2026-11-22T03:12:00.002Z INFO  events: recorded event object=ns/a action=create_event reason=PodReplaced type=Normal result=success\n\
                   2026-11-22T03:12:00.002Z INFO  reconcile: reconciled reconcile_id=1-4 object=ns/a trigger=\"pod DELETED rv=21\" result=success elapsed_ms=0.9\n";
        let text = timeline(log.as_bytes(), "ns/a").text;
        let reconcile = text.find("reconcile 1-4").expect("the reconcile");
        let event = text.find("recorded event").expect("the event");
        assert!(reconcile < event, "{text}");
    }

    #[test]
    fn each_retry_of_a_refused_create_says_what_it_sent_and_what_the_server_answered() {
        let refused = |id: &str, ts: &str, trigger: &str, next: u32| {
            format!(
                "{ts}1Z INFO  reconcile: create refused reconcile_id={id} object=ns/web action=create_pod pod=web-immortalpod image=nginx:1.27 cause=deleted result=refused error=\"api error 403 Forbidden: pods \\\"web-immortalpod\\\" is forbidden: violates PodSecurity\"\n\
                 {ts}2Z INFO  reconcile: reconciled reconcile_id={id} object=ns/web trigger=\"{trigger}\" result=requeue_after requeue_after_ms={next} elapsed_ms=0.8\n"
            )
        };
        let log = [
            refused(
                "1-1",
                "2026-11-22T03:12:00.00",
                "pod DELETED rv=9 left uid=u1",
                1000,
            ),
            refused("1-2", "2026-11-22T03:12:01.00", "scheduled requeue", 2000),
        ]
        .concat();
        let t = timeline(log.as_bytes(), "ns/web");
        let step = "    create_pod: cause=deleted image=nginx:1.27 pod=web-immortalpod → refused: \
                    api error 403 Forbidden: pods \"web-immortalpod\" is forbidden: violates PodSecurity\n";
        assert_eq!(
            t.text,
            format!(
                "2026-11-22T03:12:00.001Z  reconcile 1-1  triggered by: pod DELETED rv=9 left uid=u1\n\
                 {step}\
                 \x20   → requeue_after; next look in 1000 ms (0.8 ms)\n\
                 2026-11-22T03:12:01.001Z  reconcile 1-2  triggered by: scheduled requeue\n\
                 {step}\
                 \x20   → requeue_after; next look in 2000 ms (0.8 ms)\n"
            )
        );
    }

    #[test]
    fn text_fields_are_read_back_as_the_logger_quoted_them() {
        let line = r#"2026-11-22T03:12:00.004Z WARN  reconcile: reconcile failed: see error reconcile_id=1-2 object=ns/a error="api error 500: \"boom\" at a=b\ttab" empty="" n=3"#;
        let m = parse_text(line).expect("a text line");
        assert_eq!(m["level"], "WARN");
        assert_eq!(m["target"], "reconcile");
        assert_eq!(m["msg"], "reconcile failed: see error");
        assert_eq!(m["error"], "api error 500: \"boom\" at a=b\ttab");
        assert_eq!(m["empty"], "");
        assert_eq!(m["n"], "3");
        // A line without fields is all message.
        let m = parse_text("2026-11-22T03:12:00.004Z INFO  controller: stopped").unwrap();
        assert_eq!(m["msg"], "stopped");
        assert!(parse_text("not a log line").is_none());
        assert!(parse_text("2026-11-22T03:12:00.004Z NOTICE x: y").is_none());
    }

    #[test]
    fn the_logger_s_own_text_lines_parse_back_to_their_fields() {
        use crate::runtime::logging::{render, Format};
        use log::kv::Value as Kv;
        let kvs: [(&str, Kv); 4] = [
            ("object", Kv::from("ns/web")),
            ("trigger", Kv::from("pod DELETED rv=9 gone")),
            (
                "error",
                Kv::from("quote \" backslash \\ newline \n bell \u{7}"),
            ),
            ("elapsed_ms", Kv::from(2.5f64)),
        ];
        let record = log::Record::builder()
            .args(format_args!("reconcile failed"))
            .level(log::Level::Info)
            .target("immortal_operator::reconcile")
            .key_values(&kvs)
            .build();
        let line = render(Format::Text, std::time::SystemTime::now(), &record);
        let m = parse_text(&line).unwrap_or_else(|| panic!("not parsed: {line}"));
        assert_eq!(m["msg"], "reconcile failed");
        assert_eq!(m["object"], "ns/web");
        assert_eq!(m["trigger"], "pod DELETED rv=9 gone");
        assert_eq!(m["error"], "quote \" backslash \\ newline \n bell \u{7}");
        assert_eq!(m["elapsed_ms"], "2.5");
    }

    #[test]
    fn an_object_never_logged_yields_nothing_but_the_lines_are_counted() {
        let t = timeline(LOG.as_bytes(), "demo/none");
        assert_eq!((t.found, t.understood), (0, 6));
        assert!(t.text.is_empty());
    }

    #[test]
    fn a_file_that_is_no_operator_log_is_told_apart() {
        let t = timeline("hello\n{\"not\": \"ours\"}\n".as_bytes(), "demo/web");
        assert_eq!((t.found, t.understood, t.read), (0, 0, 2));
    }
}
