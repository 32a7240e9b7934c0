//! Server-side printing (`Accept: application/json;as=Table;g=meta.k8s.io;v=v1`), which
//! `kubectl get` asks for: pod, namespace, event and lease columns as the real printers
//! have them, and a CRD's `additionalPrinterColumns` evaluated with a small JSONPath subset.

use crate::resources::{self, Class, ResourceDef};
use crate::store::Obj;
use crate::util;
use serde_json::{json, Value};
use std::time::Duration;

/// Whether the request's Accept header asks for a Table.
pub fn wants_table(accept: Option<&str>) -> bool {
    accept.is_some_and(|a| a.contains("as=Table"))
}

fn column(name: &str, type_: &str, format: &str) -> Value {
    json!({"name": name, "type": type_, "format": format, "description": "", "priority": 0})
}

/// A column kubectl shows only with `-o wide`.
fn wide(mut c: Value) -> Value {
    c["priority"] = json!(1);
    c
}

/// `5m`-style age of an RFC 3339 time stamp, `<unknown>` when absent or unparsable.
fn age(ts: &Value) -> Value {
    match ts.as_str().and_then(util::parse_rfc3339) {
        Some(t) => {
            let secs = (util::unix_now() - t).max(0) as u64;
            json!(util::human_duration(Duration::from_secs(secs)))
        }
        None => json!("<unknown>"),
    }
}

/// Evaluates the JSONPath forms printer columns use: `.a.b`, `.a[0].b`, `.a[*].b` and
/// `.a[?(@.k=="v")].b`. Returns every match.
pub fn json_path<'a>(root: &'a Value, path: &str) -> Vec<&'a Value> {
    let path = path
        .trim()
        .trim_start_matches('{')
        .trim_end_matches('}')
        .trim_start_matches('$');
    let mut cur: Vec<&Value> = vec![root];
    let mut rest = path;
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix('.') {
            let end = r.find(['.', '[']).unwrap_or(r.len());
            let field = &r[..end];
            cur = cur.into_iter().filter_map(|v| v.get(field)).collect();
            rest = &r[end..];
        } else if let Some(r) = rest.strip_prefix('[') {
            let Some(end) = r.find(']') else {
                return Vec::new();
            };
            let inner = &r[..end];
            rest = &r[end + 1..];
            let items = cur.into_iter().filter_map(Value::as_array).flatten();
            cur = if inner == "*" {
                items.collect()
            } else if let Some(filter) =
                inner.strip_prefix("?(@.").and_then(|f| f.strip_suffix(')'))
            {
                let Some((key, want)) = filter.split_once("==") else {
                    return Vec::new();
                };
                let want = want.trim().trim_matches('"').trim_matches('\'');
                let key = key.trim();
                // Non-string values compare as the JSON they are written as (`@.n==1`).
                let parsed: Option<Value> = serde_json::from_str(want).ok();
                items
                    .filter(|v| v[key].as_str() == Some(want) || parsed.as_ref() == Some(&v[key]))
                    .collect()
            } else if let Ok(i) = inner.parse::<usize>() {
                let all: Vec<&Value> = items.collect();
                all.get(i).copied().into_iter().collect()
            } else {
                return Vec::new();
            };
        } else {
            return Vec::new();
        }
    }
    cur
}

fn cell(type_: &str, v: Option<&Value>) -> Value {
    match (type_, v) {
        (_, None) | (_, Some(Value::Null)) => Value::Null,
        ("date", Some(v)) => age(v),
        ("string", Some(Value::String(s))) => json!(s),
        ("string", Some(other)) => json!(other.to_string()),
        (_, Some(v)) => v.clone(),
    }
}

fn pod_cells(o: &Value) -> Vec<Value> {
    let total = o["spec"]["containers"].as_array().map_or(0, Vec::len);
    let statuses = o["status"]["containerStatuses"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let ready = statuses
        .iter()
        .filter(|s| s["ready"].as_bool() == Some(true))
        .count();
    let restarts: i64 = statuses
        .iter()
        .filter_map(|s| s["restartCount"].as_i64())
        .sum();
    let waiting = statuses
        .iter()
        .find_map(|s| s["state"]["waiting"]["reason"].as_str());
    let status = if !o["metadata"]["deletionTimestamp"].is_null() {
        "Terminating".to_string()
    } else if let Some(w) = waiting {
        w.to_string()
    } else {
        o["status"]["phase"]
            .as_str()
            .unwrap_or("Unknown")
            .to_string()
    };
    vec![
        o["metadata"]["name"].clone(),
        json!(format!("{ready}/{total}")),
        json!(status),
        json!(restarts),
        age(&o["metadata"]["creationTimestamp"]),
    ]
}

/// Builds a row's cells from an object.
type RowFn<'a> = Box<dyn Fn(&Value) -> Vec<Value> + 'a>;

/// Column definitions and a row-builder for the resource.
fn layout(def: &ResourceDef) -> (Vec<Value>, RowFn<'_>) {
    let name = || column("Name", "string", "name");
    match def.class {
        Class::Pod => (
            vec![
                name(),
                column("Ready", "string", ""),
                column("Status", "string", ""),
                column("Restarts", "integer", ""),
                column("Age", "string", ""),
            ],
            Box::new(pod_cells),
        ),
        Class::Namespace => (
            vec![
                name(),
                column("Status", "string", ""),
                column("Age", "string", ""),
            ],
            Box::new(|o: &Value| {
                vec![
                    o["metadata"]["name"].clone(),
                    o["status"]["phase"].clone(),
                    age(&o["metadata"]["creationTimestamp"]),
                ]
            }),
        ),
        Class::Event => (
            vec![
                column("Last Seen", "string", ""),
                column("Type", "string", ""),
                column("Reason", "string", ""),
                column("Object", "string", ""),
                column("Message", "string", ""),
                wide(column("Name", "string", "name")),
            ],
            Box::new(|o: &Value| {
                let seen = if o["lastTimestamp"].is_null() {
                    &o["eventTime"]
                } else {
                    &o["lastTimestamp"]
                };
                let obj = format!(
                    "{}/{}",
                    o["involvedObject"]["kind"]
                        .as_str()
                        .unwrap_or("")
                        .to_lowercase(),
                    o["involvedObject"]["name"].as_str().unwrap_or("")
                );
                vec![
                    age(seen),
                    o["type"].clone(),
                    o["reason"].clone(),
                    json!(obj),
                    o["message"].clone(),
                    o["metadata"]["name"].clone(),
                ]
            }),
        ),
        Class::Lease => (
            vec![
                name(),
                column("Holder", "string", ""),
                column("Age", "string", ""),
            ],
            Box::new(|o: &Value| {
                vec![
                    o["metadata"]["name"].clone(),
                    o["spec"]["holderIdentity"].clone(),
                    age(&o["metadata"]["creationTimestamp"]),
                ]
            }),
        ),
        Class::Crd => (
            vec![name(), column("Created At", "date", "")],
            Box::new(|o: &Value| {
                vec![
                    o["metadata"]["name"].clone(),
                    o["metadata"]["creationTimestamp"].clone(),
                ]
            }),
        ),
        Class::Custom if def.columns.is_empty() => (
            vec![name(), column("Age", "date", "")],
            Box::new(|o: &Value| {
                vec![
                    o["metadata"]["name"].clone(),
                    age(&o["metadata"]["creationTimestamp"]),
                ]
            }),
        ),
        Class::Custom => {
            let mut cols = vec![name()];
            cols.extend(def.columns.iter().map(|c| {
                let mut col = column(&c.name, &c.type_, "");
                col["priority"] = json!(c.priority);
                col
            }));
            (
                cols,
                Box::new(move |o: &Value| {
                    let mut cells = vec![o["metadata"]["name"].clone()];
                    for c in &def.columns {
                        cells.push(cell(&c.type_, json_path(o, &c.json_path).first().copied()));
                    }
                    cells
                }),
            )
        }
    }
}

/// A `meta.k8s.io/v1` Table of `objs`. `include` is the `includeObject` parameter: `None`,
/// `Object` (the full object) or, by default, `Metadata` (a PartialObjectMetadata).
pub fn render(
    def: &ResourceDef,
    version: &str,
    objs: &[Obj],
    rv: u64,
    cont: Option<&str>,
    include: Option<&str>,
) -> Value {
    let (columns, cells) = layout(def);
    let rows: Vec<Value> = objs
        .iter()
        .map(|o| {
            let mut row = json!({"cells": cells(o)});
            match include {
                Some("None") => {}
                Some("Object") => {
                    let bytes = resources::encode_object(def, version, o);
                    row["object"] = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
                }
                _ => {
                    row["object"] = json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": o["metadata"]});
                }
            }
            row
        })
        .collect();
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if let Some(c) = cont {
        meta["continue"] = json!(c);
    }
    json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": meta, "columnDefinitions": columns, "rows": rows})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_path_handles_printer_column_forms() {
        let o = json!({"spec": {"image": "nginx"}, "status": {"conditions": [
            {"type": "Other", "status": "False"}, {"type": "Ready", "status": "True"}]}});
        assert_eq!(json_path(&o, ".spec.image"), vec![&json!("nginx")]);
        assert_eq!(
            json_path(&o, ".status.conditions[?(@.type==\"Ready\")].status"),
            vec![&json!("True")]
        );
        assert_eq!(
            json_path(&o, ".status.conditions[0].type"),
            vec![&json!("Other")]
        );
        assert_eq!(json_path(&o, ".status.conditions[*].type").len(), 2);
        assert!(json_path(&o, ".status.currentPod").is_empty());
    }

    #[test]
    fn custom_resource_table_uses_printer_columns() {
        let crd: Value =
            serde_yaml::from_str(include_str!("../../config/crd/immortalcontainers.yaml"))
                .expect("crd yaml");
        let def = resources::from_crd(&crd).expect("crd");
        let o: Obj = std::sync::Arc::new(
            json!({"metadata": {"name": "x", "creationTimestamp": util::now_rfc3339()},
            "spec": {"image": "nginx"}, "status": {"currentPod": "x-immortalpod", "startTimes": 2,
                "podPhase": "Running", "conditions": [{"type": "Ready", "status": "True", "reason": "PodRunning"}]}}),
        );
        let t = render(&def, "v1alpha1", &[o], 7, None, None);
        let cols: Vec<(&str, i64)> = t["columnDefinitions"]
            .as_array()
            .expect("cols")
            .iter()
            .filter_map(|c| Some((c["name"].as_str()?, c["priority"].as_i64()?)))
            .collect();
        // Pod is a wide column (priority 1): kubectl shows it only with -o wide.
        assert_eq!(
            cols,
            vec![
                ("Name", 0),
                ("Image", 0),
                ("Pod", 1),
                ("Phase", 0),
                ("Ready", 0),
                ("Reason", 0),
                ("Starts", 0),
                ("Age", 0)
            ]
        );
        assert_eq!(
            t["rows"][0]["cells"],
            json!(["x", "nginx", "x-immortalpod", "Running", "True", "PodRunning", 2, "0s"])
        );
        assert_eq!(t["rows"][0]["object"]["kind"], "PartialObjectMetadata");
    }
}
