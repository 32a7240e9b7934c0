//! Server-side printing (`Accept: application/json;as=Table;g=meta.k8s.io;v=v1`), which
//! `kubectl get` asks for: the columns of every built-in kind as kube-apiserver's printers have
//! them (its default table, name and creation time, for kinds without one: CRDs, roles), and a
//! CRD's `additionalPrinterColumns` evaluated with a small JSONPath subset.

use crate::resources::{self, Class, ResourceDef};
use crate::store::Obj;
use crate::util;
use serde_json::{json, Value};
use std::time::Duration;

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

/// While the pod is initializing, the STATUS of its first init container not done: `Init:N/M`,
/// or `Init:` and its waiting or terminated reason; `None` once every one exited 0.
fn init_status(o: &Value) -> Option<String> {
    let total = o["spec"]["initContainers"].as_array().map_or(0, Vec::len);
    let statuses = o["status"]["initContainerStatuses"].as_array()?;
    for (i, c) in statuses.iter().enumerate() {
        let state = &c["state"];
        let terminated = state["terminated"].as_object();
        if terminated.is_some_and(|t| t.get("exitCode").and_then(Value::as_i64) == Some(0)) {
            continue;
        }
        let waiting = state["waiting"]["reason"]
            .as_str()
            .filter(|r| !r.is_empty() && *r != "PodInitializing");
        return Some(match (terminated, waiting) {
            (Some(t), _) => match t.get("reason").and_then(Value::as_str) {
                Some(r) if !r.is_empty() => format!("Init:{r}"),
                _ => format!(
                    "Init:ExitCode:{}",
                    t.get("exitCode").and_then(Value::as_i64).unwrap_or(0)
                ),
            },
            (None, Some(w)) => format!("Init:{w}"),
            (None, None) => format!("Init:{i}/{total}"),
        });
    }
    None
}

/// Whether the pod's Initialized condition is True.
fn initialized(o: &Value) -> bool {
    o["status"]["conditions"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| c["type"] == "Initialized" && c["status"] == "True")
    })
}

/// The pod STATUS column as kubectl's printer derives it (`printPod`): the phase, or the
/// pod's reason, or the first unfinished init container's, or a container's waiting or
/// terminated reason; `Terminating` once deleted.
fn pod_status(o: &Value) -> String {
    let status = &o["status"];
    let mut reason = status["phase"].as_str().unwrap_or("Unknown").to_string();
    if let Some(r) = status["reason"].as_str().filter(|r| !r.is_empty()) {
        reason = r.to_string();
    }
    let initializing = init_status(o);
    if let Some(init) = &initializing {
        reason = init.clone();
    }
    let statuses = if initializing.is_none() || initialized(o) {
        status["containerStatuses"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or(&[])
    } else {
        &[]
    };
    let mut running = false;
    for c in statuses.iter().rev() {
        let state = &c["state"];
        if let Some(w) = state["waiting"]["reason"]
            .as_str()
            .filter(|r| !r.is_empty())
        {
            reason = w.to_string();
        } else if let Some(t) = state["terminated"].as_object() {
            reason = match t
                .get("reason")
                .and_then(Value::as_str)
                .filter(|r| !r.is_empty())
            {
                Some(r) => r.to_string(),
                None => format!(
                    "ExitCode:{}",
                    t.get("exitCode").and_then(Value::as_i64).unwrap_or(0)
                ),
            };
        } else if c["ready"].as_bool() == Some(true) && state["running"].is_object() {
            running = true;
        }
    }
    if reason == "Completed" && running {
        let ready = status["conditions"].as_array().is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        });
        reason = if ready { "Running" } else { "NotReady" }.to_string();
    }
    if !o["metadata"]["deletionTimestamp"].is_null() {
        reason = "Terminating".to_string();
    }
    reason
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
    // While initializing, the restarts shown are the init containers'.
    let counted = if init_status(o).is_some() && !initialized(o) {
        o["status"]["initContainerStatuses"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    } else {
        statuses.clone()
    };
    let restarts: i64 = counted
        .iter()
        .filter_map(|s| s["restartCount"].as_i64())
        .sum();
    let or_none = |v: &Value| match v.as_str() {
        Some(s) if !s.is_empty() => json!(s),
        _ => json!("<none>"),
    };
    vec![
        o["metadata"]["name"].clone(),
        json!(format!("{ready}/{total}")),
        json!(pod_status(o)),
        json!(restarts),
        age(&o["metadata"]["creationTimestamp"]),
        or_none(&o["status"]["podIP"]),
        or_none(&o["spec"]["nodeName"]),
        json!("<none>"),
        json!("<none>"),
    ]
}

/// The node STATUS column: the Ready condition, and `SchedulingDisabled` when cordoned.
fn node_status(o: &Value) -> String {
    let ready = o["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
        .map(|c| match c["status"].as_str() {
            Some("True") => "Ready",
            Some("False") => "NotReady",
            _ => "Unknown",
        })
        .unwrap_or("Unknown");
    if o["spec"]["unschedulable"].as_bool() == Some(true) {
        format!("{ready},SchedulingDisabled")
    } else {
        ready.to_string()
    }
}

fn node_cells(o: &Value) -> Vec<Value> {
    let labels = o["metadata"]["labels"].as_object();
    let mut roles: Vec<&str> = labels
        .map(|l| {
            l.keys()
                .filter_map(|k| k.strip_prefix("node-role.kubernetes.io/"))
                .collect()
        })
        .unwrap_or_default();
    roles.sort_unstable();
    let address = |kind: &str| {
        o["status"]["addresses"]
            .as_array()
            .and_then(|a| a.iter().find(|x| x["type"] == kind))
            .and_then(|x| x["address"].as_str())
            .unwrap_or("<none>")
            .to_string()
    };
    let info = &o["status"]["nodeInfo"];
    vec![
        o["metadata"]["name"].clone(),
        json!(node_status(o)),
        json!(if roles.is_empty() {
            "<none>".to_string()
        } else {
            roles.join(",")
        }),
        age(&o["metadata"]["creationTimestamp"]),
        info["kubeletVersion"].clone(),
        json!(address("InternalIP")),
        json!(address("ExternalIP")),
        info["osImage"].clone(),
        info["kernelVersion"].clone(),
        info["containerRuntimeVersion"].clone(),
    ]
}

/// `pods: 2/5`-style usage of a quota's counted resources, as `kubectl get quota` shows it.
fn quota_cells(o: &Value) -> Vec<Value> {
    let hard = o["status"]["hard"].as_object();
    let used = &o["status"]["used"];
    let mut request = Vec::new();
    let mut limit = Vec::new();
    for (k, v) in hard.into_iter().flatten() {
        let text = format!(
            "{k}: {}/{}",
            used[k].as_str().unwrap_or("0"),
            v.as_str().map_or_else(|| v.to_string(), String::from)
        );
        if k.starts_with("limits.") {
            limit.push(text);
        } else {
            request.push(text);
        }
    }
    vec![
        o["metadata"]["name"].clone(),
        age(&o["metadata"]["creationTimestamp"]),
        json!(request.join(", ")),
        json!(limit.join(", ")),
    ]
}

/// `a=1,b=2` (sorted), `<none>` for no labels: `labels.FormatLabels`.
fn format_labels(labels: &Value) -> String {
    let mut pairs: Vec<String> = labels
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
        .collect();
    if pairs.is_empty() {
        return "<none>".to_string();
    }
    pairs.sort();
    pairs.join(",")
}

/// A `metav1.LabelSelector` as `LabelSelectorAsSelector(..).String()` writes it: requirements
/// sorted by key, `k=v`, `k in (a,b)`, `k notin (a,b)`, `k`, `!k`; "" when empty.
fn selector_string(sel: &Value) -> String {
    let mut reqs: Vec<(String, String)> = sel["matchLabels"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| (k.clone(), format!("{k}={}", v.as_str().unwrap_or(""))))
        .collect();
    for e in sel["matchExpressions"].as_array().into_iter().flatten() {
        let key = e["key"].as_str().unwrap_or("").to_string();
        let mut values: Vec<&str> = e["values"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        values.sort_unstable();
        let text = match e["operator"].as_str().unwrap_or("") {
            "In" => format!("{key} in ({})", values.join(",")),
            "NotIn" => format!("{key} notin ({})", values.join(",")),
            "Exists" => key.clone(),
            "DoesNotExist" => format!("!{key}"),
            _ => continue,
        };
        reqs.push((key, text));
    }
    reqs.sort();
    reqs.into_iter()
        .map(|(_, t)| t)
        .collect::<Vec<_>>()
        .join(",")
}

/// `80/TCP,30080:8443/TCP`-style ports of a Service (`makePortString`), `<none>` for none.
fn service_ports(o: &Value) -> String {
    let ports: Vec<String> = o["spec"]["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            let protocol = p["protocol"].as_str().unwrap_or("");
            match p["nodePort"].as_i64().filter(|n| *n > 0) {
                Some(node) => format!("{}:{node}/{protocol}", p["port"]),
                None => format!("{}/{protocol}", p["port"]),
            }
        })
        .collect();
    if ports.is_empty() {
        "<none>".to_string()
    } else {
        ports.join(",")
    }
}

fn service_cells(o: &Value) -> Vec<Value> {
    let spec = &o["spec"];
    let cluster_ip = spec["clusterIPs"][0]
        .as_str()
        .or(spec["clusterIP"].as_str())
        .filter(|ip| !ip.is_empty())
        .unwrap_or("<none>");
    let external_ips: Vec<&str> = spec["externalIPs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    // `getServiceExternalIP`: a LoadBalancer without an address (no cloud here) is pending.
    let external = match spec["type"].as_str().unwrap_or("") {
        "ExternalName" => spec["externalName"].as_str().unwrap_or("").to_string(),
        "ClusterIP" | "NodePort" | "LoadBalancer" if !external_ips.is_empty() => {
            external_ips.join(",")
        }
        "ClusterIP" | "NodePort" => "<none>".to_string(),
        "LoadBalancer" => "<pending>".to_string(),
        _ => "<unknown>".to_string(),
    };
    vec![
        o["metadata"]["name"].clone(),
        spec["type"].clone(),
        json!(cluster_ip),
        json!(external),
        json!(service_ports(o)),
        age(&o["metadata"]["creationTimestamp"]),
        json!(format_labels(&spec["selector"])),
    ]
}

fn deployment_cells(o: &Value) -> Vec<Value> {
    let spec = &o["spec"];
    let status = &o["status"];
    let count = |v: &Value| v.as_i64().unwrap_or(0);
    let containers = spec["template"]["spec"]["containers"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    let column = |field: &str| -> String {
        containers
            .iter()
            .map(|c| c[field].as_str().unwrap_or(""))
            .collect::<Vec<_>>()
            .join(",")
    };
    vec![
        o["metadata"]["name"].clone(),
        json!(format!(
            "{}/{}",
            count(&status["readyReplicas"]),
            count(&spec["replicas"])
        )),
        json!(count(&status["updatedReplicas"])),
        json!(count(&status["availableReplicas"])),
        age(&o["metadata"]["creationTimestamp"]),
        json!(column("name")),
        json!(column("image")),
        json!(selector_string(&spec["selector"])),
    ]
}

/// A binding's cells: `Role/NAME`, and its subjects by kind (`rbac.SubjectsStrings`).
fn binding_cells(o: &Value) -> Vec<Value> {
    let role_ref = &o["roleRef"];
    let subjects = o["subjects"].as_array().map(Vec::as_slice).unwrap_or(&[]);
    let of_kind = |kind: &str| -> String {
        subjects
            .iter()
            .filter(|s| s["kind"] == kind)
            .map(|s| {
                let name = s["name"].as_str().unwrap_or("");
                if kind == "ServiceAccount" {
                    format!("{}/{name}", s["namespace"].as_str().unwrap_or(""))
                } else {
                    name.to_string()
                }
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    vec![
        o["metadata"]["name"].clone(),
        json!(format!(
            "{}/{}",
            role_ref["kind"].as_str().unwrap_or(""),
            role_ref["name"].as_str().unwrap_or("")
        )),
        age(&o["metadata"]["creationTimestamp"]),
        json!(of_kind("User")),
        json!(of_kind("Group")),
        json!(of_kind("ServiceAccount")),
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
                wide(column("IP", "string", "")),
                wide(column("Node", "string", "")),
                wide(column("Nominated Node", "string", "")),
                wide(column("Readiness Gates", "string", "")),
            ],
            Box::new(pod_cells),
        ),
        Class::Node => (
            vec![
                name(),
                column("Status", "string", ""),
                column("Roles", "string", ""),
                column("Age", "string", ""),
                column("Version", "string", ""),
                wide(column("Internal-IP", "string", "")),
                wide(column("External-IP", "string", "")),
                wide(column("OS-Image", "string", "")),
                wide(column("Kernel-Version", "string", "")),
                wide(column("Container-Runtime", "string", "")),
            ],
            Box::new(node_cells),
        ),
        Class::ResourceQuota => (
            vec![
                name(),
                column("Age", "string", ""),
                column("Request", "string", ""),
                column("Limit", "string", ""),
            ],
            Box::new(quota_cells),
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
        Class::AdmissionPolicy => (
            vec![
                name(),
                column("Validations", "integer", ""),
                column("ParamKind", "string", ""),
                column("Age", "string", ""),
            ],
            Box::new(|o: &Value| {
                vec![
                    o["metadata"]["name"].clone(),
                    json!(o["spec"]["validations"].as_array().map_or(0, Vec::len)),
                    json!("<unset>"),
                    age(&o["metadata"]["creationTimestamp"]),
                ]
            }),
        ),
        Class::AdmissionPolicyBinding => (
            vec![
                name(),
                column("PolicyName", "string", ""),
                column("ParamRef", "string", ""),
                column("Age", "string", ""),
            ],
            Box::new(|o: &Value| {
                vec![
                    o["metadata"]["name"].clone(),
                    o["spec"]["policyName"].clone(),
                    json!("<unset>"),
                    age(&o["metadata"]["creationTimestamp"]),
                ]
            }),
        ),
        // No printer of their own: kube-apiserver's default table, name and creation time.
        Class::Crd | Class::RbacRole => (
            vec![name(), column("Created At", "date", "")],
            Box::new(|o: &Value| {
                vec![
                    o["metadata"]["name"].clone(),
                    o["metadata"]["creationTimestamp"].clone(),
                ]
            }),
        ),
        Class::ServiceAccount => (
            vec![
                name(),
                column("Secrets", "string", ""),
                column("Age", "string", ""),
            ],
            Box::new(|o: &Value| {
                vec![
                    o["metadata"]["name"].clone(),
                    json!(o["secrets"].as_array().map_or(0, Vec::len)),
                    age(&o["metadata"]["creationTimestamp"]),
                ]
            }),
        ),
        Class::Service => (
            vec![
                name(),
                column("Type", "string", ""),
                column("Cluster-IP", "string", ""),
                column("External-IP", "string", ""),
                column("Port(s)", "string", ""),
                column("Age", "string", ""),
                wide(column("Selector", "string", "")),
            ],
            Box::new(service_cells),
        ),
        Class::Deployment => (
            vec![
                name(),
                column("Ready", "string", ""),
                column("Up-to-date", "string", ""),
                column("Available", "string", ""),
                column("Age", "string", ""),
                wide(column("Containers", "string", "")),
                wide(column("Images", "string", "")),
                wide(column("Selector", "string", "")),
            ],
            Box::new(deployment_cells),
        ),
        Class::NetworkPolicy => (
            vec![
                name(),
                column("Pod-Selector", "string", ""),
                column("Age", "string", ""),
            ],
            Box::new(|o: &Value| {
                // `metav1.FormatLabelSelector`: the selector, `<none>` when it selects all.
                let selector = match selector_string(&o["spec"]["podSelector"]) {
                    s if s.is_empty() => "<none>".to_string(),
                    s => s,
                };
                vec![
                    o["metadata"]["name"].clone(),
                    json!(selector),
                    age(&o["metadata"]["creationTimestamp"]),
                ]
            }),
        ),
        Class::RbacBinding => (
            vec![
                name(),
                column("Role", "string", ""),
                column("Age", "string", ""),
                wide(column("Users", "string", "")),
                wide(column("Groups", "string", "")),
                wide(column("ServiceAccounts", "string", "")),
            ],
            Box::new(binding_cells),
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
    fn pod_status_shows_init_progress_then_the_containers() {
        let pod = |init: Value, initialized: &str, containers: Value| {
            json!({"metadata": {}, "spec": {"initContainers": [{"name": "a"}, {"name": "b"}]},
                "status": {"phase": "Pending", "initContainerStatuses": init, "containerStatuses": containers,
                    "conditions": [{"type": "Initialized", "status": initialized}]}})
        };
        let waiting = json!([{"state": {"waiting": {"reason": "PodInitializing"}}}]);
        let done = json!({"state": {"terminated": {"exitCode": 0, "reason": "Completed"}}});
        let running = json!({"state": {"running": {}}});
        assert_eq!(
            pod_status(&pod(json!([done, running]), "False", waiting.clone())),
            "Init:1/2"
        );
        assert_eq!(
            pod_status(&pod(
                json!([{"state": {"waiting": {"reason": "CrashLoopBackOff"}}, "restartCount": 2}, running]),
                "False",
                waiting.clone()
            )),
            "Init:CrashLoopBackOff"
        );
        assert_eq!(
            pod_status(&pod(
                json!([{"state": {"terminated": {"exitCode": 3, "reason": "Error"}}}, running]),
                "False",
                waiting
            )),
            "Init:Error"
        );
        let invalid = json!([{"state": {"waiting": {"reason": "InvalidImageName"}}}]);
        assert_eq!(
            pod_status(&pod(json!([done, done]), "True", invalid)),
            "InvalidImageName"
        );
    }

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

    fn cells_of(class: Class, o: Value) -> Value {
        let def = resources::builtins()
            .into_iter()
            .find(|d| d.class == class)
            .expect("built-in");
        render(&def, "v1", &[std::sync::Arc::new(o)], 1, None, None)["rows"][0]["cells"].clone()
    }

    #[test]
    fn service_deployment_and_binding_rows_read_as_kubectl_prints_them() {
        let now = util::now_rfc3339();
        let svc = json!({"metadata": {"name": "s", "creationTimestamp": now}, "spec": {"type": "ClusterIP",
            "ports": [{"port": 8443, "protocol": "TCP"}, {"port": 80, "nodePort": 30080, "protocol": "TCP"}],
            "selector": {"b": "2", "a": "1"}}});
        assert_eq!(
            cells_of(Class::Service, svc),
            json!([
                "s",
                "ClusterIP",
                "<none>",
                "<none>",
                "8443/TCP,80:30080/TCP",
                "0s",
                "a=1,b=2"
            ])
        );
        let deploy = json!({"metadata": {"name": "d", "creationTimestamp": now},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "x"},
                "matchExpressions": [{"key": "tier", "operator": "In", "values": ["web", "api"]}]},
                "template": {"spec": {"containers": [{"name": "a", "image": "i:1"}, {"name": "b", "image": "j:2"}]}}},
            "status": {"readyReplicas": 1, "updatedReplicas": 2}});
        assert_eq!(
            cells_of(Class::Deployment, deploy),
            json!([
                "d",
                "1/2",
                2,
                0,
                "0s",
                "a,b",
                "i:1,j:2",
                "app=x,tier in (api,web)"
            ])
        );
        let binding = json!({"metadata": {"name": "b", "creationTimestamp": now},
            "roleRef": {"kind": "ClusterRole", "name": "view"},
            "subjects": [{"kind": "ServiceAccount", "name": "sa", "namespace": "ns"},
                {"kind": "User", "name": "jane"}, {"kind": "User", "name": "joe"}]});
        assert_eq!(
            cells_of(Class::RbacBinding, binding),
            json!(["b", "ClusterRole/view", "0s", "jane, joe", "", "ns/sa"])
        );
        let policy = json!({"metadata": {"name": "p", "creationTimestamp": now}, "spec": {"podSelector": {}}});
        assert_eq!(cells_of(Class::NetworkPolicy, policy)[1], "<none>");
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
            json!([
                "x",
                "nginx",
                "x-immortalpod",
                "Running",
                "True",
                "PodRunning",
                2,
                "0s"
            ])
        );
        assert_eq!(t["rows"][0]["object"]["kind"], "PartialObjectMetadata");
    }
}
