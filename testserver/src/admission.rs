//! Validating admission that refuses pods with 403 Forbidden (not 422): PodSecurity, by the
//! namespace's `pod-security.kubernetes.io/enforce` label (fixture 14), and ResourceQuota's
//! pod count (fixture 15). Messages are built as the real plugins build them.

use crate::status::{ApiError, Details};
use crate::store::{Obj, Store};
use crate::util;
use serde_json::{json, Value};

/// `"a", "b"`: names quoted and joined as pod-security-admission's `joinQuote` does.
fn join_quote(items: &[String]) -> String {
    items
        .iter()
        .map(|i| format!("{i:?}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `container "a"` or `containers "a", "b"`: how the plugin names the containers of a check.
fn containers_named(names: &[String]) -> String {
    format!("{} {}", containers_word(names.len()), join_quote(names))
}

/// Who set a field to a bad value: `pod`, the containers named, or `pod and container "a"`;
/// `None` when nobody did.
fn setters(pod: bool, containers: &[String]) -> Option<String> {
    match (pod, containers.is_empty()) {
        (false, true) => None,
        (true, true) => Some("pod".into()),
        (false, false) => Some(containers_named(containers)),
        (true, false) => Some(format!("pod and {}", containers_named(containers))),
    }
}

fn containers_word(n: usize) -> &'static str {
    if n == 1 {
        "container"
    } else {
        "containers"
    }
}

/// Every container of the pod, in `visitContainers` order: init, regular, ephemeral.
fn containers(pod: &Value) -> Vec<&Value> {
    ["initContainers", "containers", "ephemeralContainers"]
        .iter()
        .filter_map(|k| pod["spec"][*k].as_array())
        .flatten()
        .collect()
}

fn name_of(c: &Value) -> String {
    c["name"].as_str().unwrap_or("").to_string()
}

/// One failed check: its reason and what must change.
struct Violation {
    reason: &'static str,
    detail: String,
}

/// `runAsNonRoot` and `seccompProfile` share a shape: set to a bad value by the pod or some
/// containers, or left unset by containers while the pod does not set a good value.
fn pod_or_container_check(
    pod: &Value,
    field: &str,
    good: impl Fn(&Value) -> bool,
) -> (Vec<String>, Vec<String>, bool, bool) {
    let pod_value = &pod["spec"]["securityContext"][field];
    let pod_bad = !pod_value.is_null() && !good(pod_value);
    let pod_good = !pod_value.is_null() && good(pod_value);
    let mut explicit = Vec::new();
    let mut implicit = Vec::new();
    for c in containers(pod) {
        let v = &c["securityContext"][field];
        if !v.is_null() {
            if !good(v) {
                explicit.push(name_of(c));
            }
        } else if !pod_good {
            implicit.push(name_of(c));
        }
    }
    (explicit, implicit, pod_bad, pod_good)
}

/// Capabilities a container may add under `baseline` (the container runtimes' defaults).
const DEFAULT_CAPABILITIES: [&str; 13] = [
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];

/// Volume sources `restricted` allows.
const RESTRICTED_VOLUMES_ALLOWED: [&str; 8] = [
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
];

/// `one` or `many`, as the plugin's `pluralize` picks.
fn pluralize(one: &'static str, many: &'static str, n: usize) -> &'static str {
    if n == 1 {
        one
    } else {
        many
    }
}

/// The checks of the `baseline` level this server makes (privileged containers, host
/// namespaces, host ports, hostPath volumes, added capabilities), by check ID. Under
/// `restricted` its own checks of capabilities and volumes replace baseline's.
fn baseline(pod: &Value, restricted: bool, out: &mut Vec<(&'static str, Violation)>) {
    let spec = &pod["spec"];
    if !restricted {
        let mut adding = Vec::new();
        let mut added = std::collections::BTreeSet::new();
        for c in containers(pod) {
            let extra: Vec<&str> = c["securityContext"]["capabilities"]["add"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .filter(|a| !DEFAULT_CAPABILITIES.contains(a))
                .collect();
            if !extra.is_empty() {
                adding.push(name_of(c));
                added.extend(extra.into_iter().map(String::from));
            }
        }
        if !adding.is_empty() {
            let added: Vec<String> = added.into_iter().collect();
            out.push((
                "capabilities_baseline",
                Violation {
                    reason: "non-default capabilities",
                    detail: format!(
                        "{} must not include {} in securityContext.capabilities.add",
                        containers_named(&adding),
                        join_quote(&added)
                    ),
                },
            ));
        }
        // Baseline forbids only `Unconfined`; restricted's own check replaces this one.
        let unconfined = |v: &Value| v["type"] != "Unconfined";
        let (explicit, _, pod_bad, _) = pod_or_container_check(pod, "seccompProfile", unconfined);
        if let Some(who) = setters(pod_bad, &explicit) {
            out.push((
                "seccompProfile_baseline",
                Violation {
                    reason: "seccompProfile",
                    detail: format!(
                        "{who} must not set securityContext.seccompProfile.type to \"Unconfined\""
                    ),
                },
            ));
        }
        let host_paths: Vec<String> = volumes(pod)
            .filter(|v| !v["hostPath"].is_null())
            .map(name_of)
            .collect();
        if !host_paths.is_empty() {
            out.push((
                "hostPathVolumes",
                Violation {
                    reason: "hostPath volumes",
                    detail: format!(
                        "{} {}",
                        pluralize("volume", "volumes", host_paths.len()),
                        join_quote(&host_paths)
                    ),
                },
            ));
        }
    }
    let mut port_users = Vec::new();
    let mut host_ports = std::collections::BTreeSet::new();
    for c in containers(pod) {
        let ports: Vec<String> = c["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| p["hostPort"].as_i64())
            .filter(|p| *p != 0)
            .map(|p| p.to_string())
            .collect();
        if !ports.is_empty() {
            port_users.push(name_of(c));
            host_ports.extend(ports);
        }
    }
    if !port_users.is_empty() {
        let ports: Vec<String> = host_ports.into_iter().collect();
        out.push((
            "hostPorts",
            Violation {
                reason: "hostPort",
                detail: format!(
                    "{} {} {} {} {}",
                    containers_word(port_users.len()),
                    join_quote(&port_users),
                    pluralize("uses", "use", port_users.len()),
                    pluralize("hostPort", "hostPorts", ports.len()),
                    ports.join(", ")
                ),
            },
        ));
    }
    let host: Vec<&str> = [
        ("hostNetwork", "hostNetwork=true"),
        ("hostPID", "hostPID=true"),
        ("hostIPC", "hostIPC=true"),
    ]
    .iter()
    .filter(|(k, _)| spec[*k].as_bool() == Some(true))
    .map(|(_, text)| *text)
    .collect();
    if !host.is_empty() {
        out.push((
            "hostNamespaces",
            Violation {
                reason: "host namespaces",
                detail: host.join(", "),
            },
        ));
    }
    let privileged: Vec<String> = containers(pod)
        .into_iter()
        .filter(|c| c["securityContext"]["privileged"].as_bool() == Some(true))
        .map(name_of)
        .collect();
    if !privileged.is_empty() {
        out.push((
            "privileged",
            Violation {
                reason: "privileged",
                detail: format!(
                    "{} must not set securityContext.privileged=true",
                    containers_named(&privileged)
                ),
            },
        ));
    }
}

/// The pod's volumes.
fn volumes(pod: &Value) -> impl Iterator<Item = &Value> {
    pod["spec"]["volumes"].as_array().into_iter().flatten()
}

/// The checks the `restricted` level adds, by check ID.
fn restricted(pod: &Value, out: &mut Vec<(&'static str, Violation)>) {
    let mut bad_volumes = Vec::new();
    let mut bad_types = std::collections::BTreeSet::new();
    for v in volumes(pod) {
        let types: Vec<&String> = v
            .as_object()
            .into_iter()
            .flat_map(|m| m.keys())
            .filter(|k| *k != "name" && !RESTRICTED_VOLUMES_ALLOWED.contains(&k.as_str()))
            .collect();
        if !types.is_empty() {
            bad_volumes.push(name_of(v));
            bad_types.extend(types.into_iter().cloned());
        }
    }
    if !bad_volumes.is_empty() {
        let types: Vec<String> = bad_types.into_iter().collect();
        out.push((
            "restrictedVolumes",
            Violation {
                reason: "restricted volume types",
                detail: format!(
                    "{} {} {} {} {}",
                    pluralize("volume", "volumes", bad_volumes.len()),
                    join_quote(&bad_volumes),
                    pluralize("uses", "use", bad_volumes.len()),
                    pluralize(
                        "restricted volume type",
                        "restricted volume types",
                        types.len()
                    ),
                    join_quote(&types)
                ),
            },
        ));
    }
    let all = containers(pod);
    let escalating: Vec<String> = all
        .iter()
        .filter(|c| c["securityContext"]["allowPrivilegeEscalation"].as_bool() != Some(false))
        .map(|c| name_of(c))
        .collect();
    if !escalating.is_empty() {
        out.push((
            "allowPrivilegeEscalation",
            Violation {
                reason: "allowPrivilegeEscalation != false",
                detail: format!(
                    "{} must set securityContext.allowPrivilegeEscalation=false",
                    containers_named(&escalating)
                ),
            },
        ));
    }

    let mut missing_drop = Vec::new();
    let mut adding = Vec::new();
    let mut added = std::collections::BTreeSet::new();
    for c in &all {
        let caps = &c["securityContext"]["capabilities"];
        if caps.is_null() {
            missing_drop.push(name_of(c));
            continue;
        }
        let drops_all = caps["drop"]
            .as_array()
            .is_some_and(|d| d.iter().any(|x| x == "ALL"));
        if !drops_all {
            missing_drop.push(name_of(c));
        }
        let forbidden: Vec<&str> = caps["add"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .filter(|a| *a != "NET_BIND_SERVICE")
            .collect();
        if !forbidden.is_empty() {
            adding.push(name_of(c));
            added.extend(forbidden.into_iter().map(String::from));
        }
    }
    let mut details = Vec::new();
    if !missing_drop.is_empty() {
        details.push(format!(
            "{} must set securityContext.capabilities.drop=[\"ALL\"]",
            containers_named(&missing_drop)
        ));
    }
    if !adding.is_empty() {
        let added: Vec<String> = added.into_iter().collect();
        details.push(format!(
            "{} must not include {} in securityContext.capabilities.add",
            containers_named(&adding),
            join_quote(&added)
        ));
    }
    if !details.is_empty() {
        out.push((
            "capabilities_restricted",
            Violation {
                reason: "unrestricted capabilities",
                detail: details.join("; "),
            },
        ));
    }

    let (explicit, implicit, pod_bad, _) =
        pod_or_container_check(pod, "runAsNonRoot", |v| v.as_bool() == Some(true));
    if let Some(who) = setters(pod_bad, &explicit) {
        out.push((
            "runAsNonRoot",
            Violation {
                reason: "runAsNonRoot != true",
                detail: format!("{who} must not set securityContext.runAsNonRoot=false"),
            },
        ));
    } else if !implicit.is_empty() {
        out.push((
            "runAsNonRoot",
            Violation {
                reason: "runAsNonRoot != true",
                detail: format!(
                    "pod or {} must set securityContext.runAsNonRoot=true",
                    containers_named(&implicit)
                ),
            },
        ));
    }

    let pod_root = pod["spec"]["securityContext"]["runAsUser"].as_i64() == Some(0);
    let root_containers: Vec<String> = all
        .iter()
        .filter(|c| c["securityContext"]["runAsUser"].as_i64() == Some(0))
        .map(|c| name_of(c))
        .collect();
    if let Some(who) = setters(pod_root, &root_containers) {
        out.push((
            "runAsUser",
            Violation {
                reason: "runAsUser=0",
                detail: format!("{who} must not set runAsUser=0"),
            },
        ));
    }

    let good_seccomp =
        |v: &Value| matches!(v["type"].as_str(), Some("RuntimeDefault" | "Localhost"));
    let (explicit, implicit, pod_bad, _) =
        pod_or_container_check(pod, "seccompProfile", good_seccomp);
    let mut bad_values = std::collections::BTreeSet::new();
    if pod_bad {
        bad_values.insert(
            pod["spec"]["securityContext"]["seccompProfile"]["type"]
                .as_str()
                .unwrap_or("")
                .to_string(),
        );
    }
    for c in &all {
        let v = &c["securityContext"]["seccompProfile"];
        if !v.is_null() && !good_seccomp(v) {
            bad_values.insert(v["type"].as_str().unwrap_or("").to_string());
        }
    }
    if let Some(who) = setters(pod_bad, &explicit) {
        let values: Vec<String> = bad_values.into_iter().collect();
        out.push((
            "seccompProfile_restricted",
            Violation {
                reason: "seccompProfile",
                detail: format!(
                    "{who} must not set securityContext.seccompProfile.type to {}",
                    join_quote(&values)
                ),
            },
        ));
    } else if !implicit.is_empty() {
        out.push((
            "seccompProfile_restricted",
            Violation {
                reason: "seccompProfile",
                detail: format!(
                    "pod or {} must set securityContext.seccompProfile.type to \"RuntimeDefault\" or \"Localhost\"",
                    containers_named(&implicit)
                ),
            },
        ));
    }
}

/// The PodSecurity admission plugin in enforce mode: 403 when the namespace enforces
/// `baseline` or `restricted` and the pod breaks a check of that level. Only a subset of the
/// checks is made (see the README); updates are not checked.
pub fn pod_security(store: &Store, ns: &str, name: &str, pod: &Value) -> Result<(), ApiError> {
    let Some(namespace) = store.get("namespaces", "", ns) else {
        return Ok(());
    };
    let labels = &namespace["metadata"]["labels"];
    let level = labels["pod-security.kubernetes.io/enforce"]
        .as_str()
        .unwrap_or("privileged");
    let mut found = Vec::new();
    match level {
        "baseline" => baseline(pod, false, &mut found),
        "restricted" => {
            baseline(pod, true, &mut found);
            restricted(pod, &mut found);
        }
        _ => return Ok(()),
    }
    if found.is_empty() {
        return Ok(());
    }
    // The policy evaluates its checks in ID order.
    found.sort_by_key(|(id, _)| *id);
    let version = labels["pod-security.kubernetes.io/enforce-version"]
        .as_str()
        .unwrap_or("latest");
    let reasons: Vec<String> = found
        .iter()
        .map(|(_, v)| format!("{} ({})", v.reason, v.detail))
        .collect();
    Err(ApiError::Forbidden(
        format!(
            "pods {name:?} is forbidden: violates PodSecurity \"{level}:{version}\": {}",
            reasons.join(", ")
        ),
        Details {
            name: name.to_string(),
            kind: "pods".into(),
            ..Details::default()
        },
    ))
}

/// The resources of a quota this server counts: pods.
const POD_COUNTS: [&str; 2] = ["count/pods", "pods"];

/// Whether a pod counts against quota (`QuotaV1Pod`): not terminal, and not past its
/// deletion grace period (a pod stuck terminating on a lost node is not charged).
fn charged(pod: &Value, now: i64) -> bool {
    if matches!(
        pod["status"]["phase"].as_str(),
        Some("Succeeded" | "Failed")
    ) {
        return false;
    }
    let deletion = pod["metadata"]["deletionTimestamp"]
        .as_str()
        .and_then(util::parse_rfc3339);
    match (
        deletion,
        pod["metadata"]["deletionGracePeriodSeconds"].as_i64(),
    ) {
        (Some(at), Some(grace)) => now <= at + grace,
        _ => true,
    }
}

/// Pods of the namespace that count against quota.
fn pods_used(store: &Store, ns: &str) -> u64 {
    let now = util::unix_now();
    store
        .list("pods", Some(ns), None, 0, |p| charged(p, now))
        .0
        .len() as u64
}

fn quantity(v: &Value) -> Option<u64> {
    match v {
        Value::String(s) => s.trim().parse().ok(),
        Value::Number(n) => n.as_u64(),
        _ => None,
    }
}

/// The namespace's quotas that count pods, with their pod limits.
fn pod_quotas(store: &Store, ns: &str) -> Vec<(Obj, Vec<(&'static str, u64)>)> {
    store
        .list("resourcequotas", Some(ns), None, 0, |_| true)
        .0
        .into_iter()
        .filter_map(|q| {
            let limits: Vec<(&'static str, u64)> = POD_COUNTS
                .iter()
                .filter_map(|k| quantity(&q["spec"]["hard"][*k]).map(|l| (*k, l)))
                .collect();
            (!limits.is_empty()).then_some((q, limits))
        })
        .collect()
}

/// ResourceQuota admission of one more pod in `ns`: 403 `exceeded quota` when a quota's pod
/// count would go over its limit (fixture 15). On success, returns the quotas to update.
pub fn quota(store: &Store, ns: &str, name: &str) -> Result<Vec<Obj>, ApiError> {
    let quotas = pod_quotas(store, ns);
    if quotas.is_empty() {
        return Ok(Vec::new());
    }
    let used = pods_used(store, ns);
    for (q, limits) in &quotas {
        let over: Vec<&(&str, u64)> = limits.iter().filter(|(_, l)| used + 1 > *l).collect();
        if over.is_empty() {
            continue;
        }
        let list = |f: &dyn Fn(u64) -> u64| {
            over.iter()
                .map(|(k, l)| format!("{k}={}", f(*l)))
                .collect::<Vec<_>>()
                .join(",")
        };
        return Err(ApiError::Forbidden(
            format!(
                "pods {name:?} is forbidden: exceeded quota: {}, requested: {}, used: {}, limited: {}",
                q["metadata"]["name"].as_str().unwrap_or(""),
                list(&|_| 1),
                list(&|_| used),
                list(&|l| l),
            ),
            Details {
                name: name.to_string(),
                kind: "pods".into(),
                ..Details::default()
            },
        ));
    }
    Ok(quotas.into_iter().map(|(q, _)| q).collect())
}

/// `status.used` of a quota counting pods in its namespace, as the quota controller keeps it
/// (recomputed here when a quota is created and when admission admits a pod).
pub fn with_usage(store: &Store, quota: &Value) -> Value {
    let ns = quota["metadata"]["namespace"].as_str().unwrap_or("");
    let used = pods_used(store, ns);
    let mut next = quota.clone();
    next["status"]["hard"] = quota["spec"]["hard"].clone();
    let mut usage = serde_json::Map::new();
    for k in POD_COUNTS {
        if !quota["spec"]["hard"][k].is_null() {
            usage.insert(k.to_string(), json!(used.to_string()));
        }
    }
    next["status"]["used"] = Value::Object(usage);
    next
}

#[cfg(test)]
mod tests {
    use super::*;

    fn violations(pod: &Value) -> String {
        let mut found = Vec::new();
        baseline(pod, true, &mut found);
        restricted(pod, &mut found);
        found.sort_by_key(|(id, _)| *id);
        found
            .iter()
            .map(|(_, v)| format!("{} ({})", v.reason, v.detail))
            .collect::<Vec<_>>()
            .join(", ")
    }

    #[test]
    fn plain_pod_breaks_four_restricted_checks_like_fixture_14() {
        let pod = json!({"spec": {"containers": [{"name": "acontainer", "image": "x"}]}});
        assert_eq!(
            violations(&pod),
            "allowPrivilegeEscalation != false (container \"acontainer\" must set securityContext.allowPrivilegeEscalation=false), unrestricted capabilities (container \"acontainer\" must set securityContext.capabilities.drop=[\"ALL\"]), runAsNonRoot != true (pod or container \"acontainer\" must set securityContext.runAsNonRoot=true), seccompProfile (pod or container \"acontainer\" must set securityContext.seccompProfile.type to \"RuntimeDefault\" or \"Localhost\")"
        );
    }

    #[test]
    fn restricted_pod_passes_with_pod_level_settings() {
        let pod = json!({"spec": {
            "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{"name": "a", "image": "x", "securityContext": {
                "allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}}}]}});
        assert_eq!(violations(&pod), "");
    }

    #[test]
    fn explicit_bad_values_are_named_with_their_setters() {
        let pod = json!({"spec": {
            "hostNetwork": true,
            "securityContext": {"runAsNonRoot": false, "runAsUser": 0, "seccompProfile": {"type": "Unconfined"}},
            "containers": [
                {"name": "a", "securityContext": {"privileged": true, "allowPrivilegeEscalation": false,
                    "capabilities": {"drop": ["ALL"], "add": ["SYS_ADMIN"]}, "runAsNonRoot": false}},
                {"name": "b", "securityContext": {"allowPrivilegeEscalation": false,
                    "capabilities": {"drop": ["ALL"]}, "runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}}}]}});
        assert_eq!(
            violations(&pod),
            "unrestricted capabilities (container \"a\" must not include \"SYS_ADMIN\" in securityContext.capabilities.add), host namespaces (hostNetwork=true), privileged (container \"a\" must not set securityContext.privileged=true), runAsNonRoot != true (pod and container \"a\" must not set securityContext.runAsNonRoot=false), runAsUser=0 (pod must not set runAsUser=0), seccompProfile (pod must not set securityContext.seccompProfile.type to \"Unconfined\")"
        );
    }

    #[test]
    fn baseline_refuses_an_unconfined_seccomp_profile_only() {
        let pod = json!({"spec": {"securityContext": {"seccompProfile": {"type": "Unconfined"}},
            "containers": [{"name": "a", "securityContext": {"seccompProfile": {"type": "Unconfined"}}},
                {"name": "b", "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}}}]}});
        let mut found = Vec::new();
        baseline(&pod, false, &mut found);
        let text: Vec<String> = found
            .iter()
            .map(|(id, v)| format!("{id}: {} ({})", v.reason, v.detail))
            .collect();
        assert_eq!(
            text,
            ["seccompProfile_baseline: seccompProfile (pod and container \"a\" must not set securityContext.seccompProfile.type to \"Unconfined\")"]
        );
    }

    #[test]
    fn terminal_and_expired_terminating_pods_are_not_charged() {
        let now = 1_000;
        assert!(charged(&json!({"status": {"phase": "Running"}}), now));
        assert!(!charged(&json!({"status": {"phase": "Failed"}}), now));
        let terminating = |at: &str| {
            json!({"metadata": {"deletionTimestamp": at, "deletionGracePeriodSeconds": 30},
                "status": {"phase": "Running"}})
        };
        assert!(charged(&terminating(&util::format_rfc3339(990)), now));
        assert!(!charged(&terminating(&util::format_rfc3339(900)), now));
    }
}
