//! `immortal-operator trace NAMESPACE/NAME`: one object's reconciliation history, read back from
//! the operator's JSON logs, as a timeline a person can read.
//!
//! Every log line about an object carries `object=NAMESPACE/NAME`, and every line of one
//! reconcile carries its `reconcile_id`; this groups them: what triggered each reconcile, the
//! API writes it made, its outcome and the next requeue.

use crate::cli::TraceArgs;
use serde_json::Value;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write};
use std::process::ExitCode;

/// Runs the subcommand.
pub fn run(args: &TraceArgs) -> ExitCode {
    let input: Box<dyn BufRead> = match &args.log {
        Some(path) => match std::fs::File::open(path) {
            Ok(f) => Box::new(BufReader::new(f)),
            Err(e) => {
                eprintln!(
                    "immortal-operator trace: cannot open {}: {e}",
                    path.display()
                );
                return ExitCode::from(2);
            }
        },
        None => Box::new(BufReader::new(std::io::stdin().lock())),
    };
    let (text, found) = timeline(input, &args.object);
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes());
    if found == 0 {
        eprintln!(
            "immortal-operator trace: no log line mentions {} (the operator must log with --log-format json)",
            args.object
        );
        return ExitCode::from(1);
    }
    ExitCode::SUCCESS
}

/// One reconcile being assembled.
struct Pending {
    started: String,
    trigger: String,
    steps: Vec<String>,
}

/// Builds the timeline of `object` from JSON log lines; returns it and how many lines matched.
/// Lines that are not JSON, or about other objects, are skipped.
pub fn timeline(input: impl BufRead, object: &str) -> (String, usize) {
    let mut out = String::new();
    let mut open: HashMap<String, Pending> = HashMap::new();
    let mut order: Vec<String> = Vec::new();
    let mut found = 0;
    for line in input.lines().map_while(Result::ok) {
        let Ok(v) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        if v.get("object").and_then(Value::as_str) != Some(object) {
            continue;
        }
        found += 1;
        let s = |k: &str| v.get(k).map(render).unwrap_or_default();
        let ts = s("ts");
        let Some(id) = v.get("reconcile_id").map(render) else {
            // Not part of a reconcile (an Event, a watch decision): show it on its own.
            let _ = writeln!(out, "{ts}  {} {}{}", s("level"), s("msg"), fields(&v));
            continue;
        };
        let p = open.entry(id.clone()).or_insert_with(|| {
            order.push(id.clone());
            Pending {
                started: ts.clone(),
                trigger: String::new(),
                steps: Vec::new(),
            }
        });
        if p.trigger.is_empty() {
            p.trigger = s("trigger");
        }
        match s("msg").as_str() {
            "reconciling" => {}
            "reconciled" | "reconcile failed" => {
                let p = open.remove(&id).expect("entry exists");
                order.retain(|o| o != &id);
                let trigger = if p.trigger.is_empty() {
                    s("trigger")
                } else {
                    p.trigger
                };
                let _ = writeln!(
                    out,
                    "{}  reconcile {id}  triggered by: {trigger}",
                    p.started
                );
                for step in &p.steps {
                    let _ = writeln!(out, "    {step}");
                }
                let mut outcome = format!("→ {}", s("result"));
                if v.get("error").is_some() {
                    let _ = write!(outcome, ": {}", s("error"));
                }
                if v.get("requeue_after_ms").is_some() {
                    let _ = write!(outcome, "; next look in {} ms", s("requeue_after_ms"));
                }
                let _ = writeln!(out, "    {outcome} ({} ms)", s("elapsed_ms"));
            }
            msg => {
                let action = v
                    .get("action")
                    .map(render)
                    .unwrap_or_else(|| msg.to_string());
                let detail = fields(&v);
                p.steps.push(format!("{action}:{detail}"));
            }
        }
    }
    // Reconciles the log ends in the middle of (the operator was killed).
    for id in order {
        if let Some(p) = open.remove(&id) {
            let _ = writeln!(
                out,
                "{}  reconcile {id}  triggered by: {}",
                p.started, p.trigger
            );
            for step in &p.steps {
                let _ = writeln!(out, "    {step}");
            }
            let _ = writeln!(
                out,
                "    → no outcome logged (the operator stopped during this reconcile)"
            );
        }
    }
    (out, found)
}

/// The fields worth showing in a step: everything but the bookkeeping ones.
fn fields(v: &Value) -> String {
    let mut s = String::new();
    if let Some(m) = v.as_object() {
        for (k, val) in m {
            if matches!(
                k.as_str(),
                "ts" | "level"
                    | "target"
                    | "msg"
                    | "object"
                    | "reconcile_id"
                    | "trigger"
                    | "action"
            ) {
                continue;
            }
            let _ = write!(s, " {k}={}", render(val));
        }
    }
    s
}

fn render(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
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
        let (text, found) = timeline(LOG.as_bytes(), "demo/web");
        assert_eq!(found, 5);
        assert_eq!(
            text,
            "2026-11-22T03:12:00.001Z  reconcile ab-7  triggered by: pod DELETED rv=970\n\
             \x20   create_pod: cause=deleted pod=web-immortalpod uid=u2\n\
             \x20   patch_status: start_times=2\n\
             \x20   → success (3.1 ms)\n\
             2026-11-22T03:13:00.000Z  reconcile ab-9  triggered by: immortalcontainer MODIFIED rv=990\n\
             \x20   → no outcome logged (the operator stopped during this reconcile)\n"
        );
    }

    #[test]
    fn an_object_never_logged_yields_nothing() {
        assert_eq!(timeline(LOG.as_bytes(), "demo/none").1, 0);
    }
}
