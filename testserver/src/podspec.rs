//! Pod spec validation as kube-apiserver 1.28's `ValidatePodSpec` does it (volumes,
//! containers and init containers, ports, env, volume mounts, resources, restart policy), with
//! its messages and field paths, for pods and for the pod templates of other kinds; and the
//! defaults every pod spec gets (`SetDefaults_PodSpec`).

use crate::names::{label_errors, qualified_name_errors, quote};
use crate::status::Cause;
use crate::util::set_default;
use serde_json::{json, Map, Value};
use std::collections::BTreeSet;

const ENV_NAME_MSG: &str = "a valid environment variable name must consist of alphabetic characters, digits, '_', '-', or '.', and must not start with a digit (e.g. 'my.env-name',  or 'MY_ENV.NAME',  or 'MyEnvName1', regex used for validation is '[-._a-zA-Z][-._a-zA-Z0-9]*')";
const PORT_RANGE_MSG: &str = "must be between 1 and 65535, inclusive";

/// What a malformed quantity string is refused with when the pod is decoded (a 400, before
/// validation): `resource.ErrFormatWrong`.
pub const QUANTITY_FORMAT_MSG: &str =
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'";
/// `resource.ErrSuffix`: the number is fine, its suffix is not.
pub const QUANTITY_SUFFIX_MSG: &str = "unable to parse quantity's suffix";

/// The value of a quantity (`500m`, `1.5Gi`, `1e3`, or a JSON number), or why it does not
/// parse, in `resource.ParseQuantity`'s words. Approximated by an f64, enough to compare.
pub fn parse_quantity(v: &Value) -> Result<f64, &'static str> {
    let s = match v {
        Value::Number(n) => return n.as_f64().ok_or(QUANTITY_FORMAT_MSG),
        Value::String(s) => s.as_str(),
        _ => return Err(QUANTITY_FORMAT_MSG),
    };
    let b = s.as_bytes();
    let mut i = usize::from(matches!(b.first(), Some(b'+' | b'-')));
    let number_start = i;
    while i < b.len() && (b[i].is_ascii_digit() || b[i] == b'.') {
        i += 1;
    }
    let number = &s[number_start..i];
    let digits = number.bytes().filter(u8::is_ascii_digit).count();
    if digits == 0 || number.matches('.').count() > 1 {
        return Err(QUANTITY_FORMAT_MSG);
    }
    let suffix = &s[i..];
    // The suffix's shape (`[eEinumkKMGTP]*[-+]?[0-9]*`) before its meaning.
    let letters = suffix
        .bytes()
        .take_while(|c| b"eEinumkKMGTP".contains(c))
        .count();
    let rest = suffix[letters..].trim_start_matches(['+', '-']);
    if !rest.bytes().all(|c| c.is_ascii_digit()) || suffix[letters..].len() - rest.len() > 1 {
        return Err(QUANTITY_FORMAT_MSG);
    }
    let magnitude: f64 = number.parse().map_err(|_| QUANTITY_FORMAT_MSG)?;
    let scale = match suffix {
        "" => 1.0,
        "n" => 1e-9,
        "u" => 1e-6,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024f64,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        _ => {
            let exp = suffix
                .strip_prefix(['e', 'E'])
                .and_then(|e| e.parse::<i32>().ok())
                .ok_or(QUANTITY_SUFFIX_MSG)?;
            10f64.powi(exp)
        }
    };
    let sign = if b.first() == Some(&b'-') { -1.0 } else { 1.0 };
    Ok(sign * magnitude * scale)
}

/// The resource quantities of every container (`requests` and `limits`) that do not parse,
/// with why: a pod carrying one cannot be decoded at all (400, not 422).
pub fn quantity_error(spec: &Value) -> Option<&'static str> {
    ["containers", "initContainers"]
        .iter()
        .filter_map(|k| spec[*k].as_array())
        .flatten()
        .flat_map(|c| ["requests", "limits"].map(|k| &c["resources"][k]))
        .filter_map(Value::as_object)
        .flat_map(|m| m.values())
        .find_map(|q| parse_quantity(q).err())
}

/// Checks a pod spec at `path` (`spec` of a pod, `spec.template.spec` of a Deployment), in
/// `ValidatePodSpec`'s order: volumes, containers, init containers, restart policy.
pub fn validate_pod_spec(spec: &Value, path: &str) -> Vec<Cause> {
    let mut causes = Vec::new();
    let volumes = validate_volumes(spec, path, &mut causes);
    let containers = list(spec, "containers");
    if containers.is_empty() {
        causes.push(Cause::required(&format!("{path}.containers"), ""));
    }
    let mut names = BTreeSet::new();
    for (i, c) in containers.iter().enumerate() {
        let at = format!("{path}.containers[{i}]");
        validate_container(c, &at, &volumes, &mut causes);
        let name = c["name"].as_str().unwrap_or("");
        if !names.insert(name) {
            causes.push(Cause::duplicate(&format!("{at}.name"), &quote(name)));
        }
        if !c["restartPolicy"].is_null() {
            causes.push(Cause::forbidden(
                &format!("{at}.restartPolicy"),
                "may not be set for non-init containers",
            ));
        }
    }
    // Init containers' names must be unique among the containers' too.
    for (i, c) in list(spec, "initContainers").iter().enumerate() {
        let at = format!("{path}.initContainers[{i}]");
        validate_container(c, &at, &volumes, &mut causes);
        let name = c["name"].as_str().unwrap_or("");
        if names.contains(name) {
            causes.push(Cause::duplicate(&format!("{at}.name"), &quote(name)));
        } else if !name.is_empty() {
            names.insert(name);
        }
        // A sidecar (KEP-753) may have what a container has; any other policy is refused.
        let sidecar = match &c["restartPolicy"] {
            Value::Null => false,
            Value::String(p) if p == "Always" => true,
            other => {
                let shown = other.as_str().map_or(other.to_string(), quote);
                causes.push(Cause::not_supported(
                    &format!("{at}.restartPolicy"),
                    &shown,
                    "\"Always\"",
                ));
                false
            }
        };
        for field in [
            "lifecycle",
            "livenessProbe",
            "readinessProbe",
            "startupProbe",
        ] {
            if !sidecar && !c[field].is_null() {
                causes.push(Cause::forbidden(
                    &format!("{at}.{field}"),
                    "may not be set for init containers",
                ));
            }
        }
    }
    let policy = spec["restartPolicy"].as_str().unwrap_or("Always");
    if !matches!(policy, "Always" | "OnFailure" | "Never") {
        causes.push(Cause::not_supported(
            &format!("{path}.restartPolicy"),
            &quote(policy),
            "\"Always\", \"OnFailure\", \"Never\"",
        ));
    }
    causes
}

fn list<'a>(v: &'a Value, key: &str) -> &'a [Value] {
    v[key].as_array().map(Vec::as_slice).unwrap_or(&[])
}

/// The fields of a volume that are not its source.
const VOLUME_NON_SOURCE: [&str; 1] = ["name"];

/// `ValidateVolumes`: names are unique DNS-1123 labels, each volume has exactly one source.
/// Returns the names of the valid volumes, which mounts may name.
fn validate_volumes<'a>(spec: &'a Value, path: &str, causes: &mut Vec<Cause>) -> BTreeSet<&'a str> {
    let mut names = BTreeSet::new();
    for (i, v) in list(spec, "volumes").iter().enumerate() {
        let at = format!("{path}.volumes[{i}]");
        let mut found = Vec::new();
        let sources = v.as_object().map_or(0, |m| {
            m.keys()
                .filter(|k| !VOLUME_NON_SOURCE.contains(&k.as_str()))
                .count()
        });
        if sources == 0 {
            found.push(Cause::required(&at, "must specify a volume type"));
        } else if sources > 1 {
            found.push(Cause::forbidden(
                &at,
                "may not specify more than 1 volume type",
            ));
        }
        let name = v["name"].as_str().unwrap_or("");
        let name_at = format!("{at}.name");
        if name.is_empty() {
            found.push(Cause::required(&name_at, ""));
        } else {
            for e in label_errors(name) {
                found.push(Cause::invalid(&name_at, &quote(name), &e));
            }
        }
        if names.contains(name) {
            found.push(Cause::duplicate(&name_at, &quote(name)));
        }
        if found.is_empty() {
            names.insert(name);
        }
        causes.extend(found);
    }
    names
}

/// `validateContainerCommon`: name, image, ports, env, volume mounts, pull policy, resources.
fn validate_container(c: &Value, at: &str, volumes: &BTreeSet<&str>, causes: &mut Vec<Cause>) {
    let name = c["name"].as_str().unwrap_or("");
    let name_at = format!("{at}.name");
    if name.is_empty() {
        causes.push(Cause::required(&name_at, ""));
    } else {
        for e in label_errors(name) {
            causes.push(Cause::invalid(&name_at, &quote(name), &e));
        }
    }
    if c["image"].as_str().unwrap_or("").trim().is_empty() {
        causes.push(Cause::required(&format!("{at}.image"), ""));
    }
    validate_ports(c, at, causes);
    validate_env(c, at, causes);
    validate_mounts(c, at, volumes, causes);
    if let Some(p) = c["imagePullPolicy"].as_str() {
        if !matches!(p, "Always" | "IfNotPresent" | "Never") {
            causes.push(Cause::not_supported(
                &format!("{at}.imagePullPolicy"),
                &quote(p),
                "\"Always\", \"IfNotPresent\", \"Never\"",
            ));
        }
    }
    validate_resources(&c["resources"], &format!("{at}.resources"), causes);
    validate_lifecycle(&c["lifecycle"], &format!("{at}.lifecycle"), causes);
}

/// `validateLifecycle`: each hook says exactly one of v1.28's handlers. A `sleep` action it
/// does not know is dropped before, leaving none (fixture 51).
fn validate_lifecycle(lifecycle: &Value, at: &str, causes: &mut Vec<Cause>) {
    for hook in ["postStart", "preStop"] {
        let Some(h) = lifecycle[hook].as_object() else {
            continue;
        };
        let handlers = ["exec", "httpGet", "tcpSocket"]
            .iter()
            .filter(|k| h.get(**k).is_some_and(|v| !v.is_null()))
            .count();
        let path = format!("{at}.{hook}");
        match handlers {
            0 => causes.push(Cause::required(&path, "must specify a handler type")),
            1 => {}
            _ => causes.push(Cause::forbidden(
                &path,
                "may not specify more than 1 handler type",
            )),
        }
    }
}

/// `IsValidPortName`: at most 15 characters of `[-a-z0-9]`, a letter, no `--`, no hyphen at
/// either end.
fn port_name_errors(n: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if n.len() > 15 {
        errs.push("must be no more than 15 characters".to_string());
    }
    if !n
        .bytes()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
    {
        errs.push("must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)".into());
    }
    if !n.bytes().any(|c| c.is_ascii_lowercase()) {
        errs.push("must contain at least one letter (a-z)".into());
    }
    if n.contains("--") {
        errs.push("must not contain consecutive hyphens".into());
    }
    if n.starts_with('-') || n.ends_with('-') {
        errs.push("must not begin or end with a hyphen".into());
    }
    errs
}

/// `validateContainerPorts`: names, numbers in range, protocols.
fn validate_ports(c: &Value, at: &str, causes: &mut Vec<Cause>) {
    let mut names = BTreeSet::new();
    for (i, p) in list(c, "ports").iter().enumerate() {
        let at = format!("{at}.ports[{i}]");
        if let Some(n) = p["name"].as_str().filter(|n| !n.is_empty()) {
            let errs = port_name_errors(n);
            if !errs.is_empty() {
                for e in errs {
                    causes.push(Cause::invalid(&format!("{at}.name"), &quote(n), &e));
                }
            } else if !names.insert(n) {
                causes.push(Cause::duplicate(&format!("{at}.name"), &quote(n)));
            }
        }
        match p["containerPort"].as_i64().unwrap_or(0) {
            0 => causes.push(Cause::required(&format!("{at}.containerPort"), "")),
            n if !(1..=65535).contains(&n) => causes.push(Cause::invalid(
                &format!("{at}.containerPort"),
                &n.to_string(),
                PORT_RANGE_MSG,
            )),
            _ => {}
        }
        match p["hostPort"].as_i64().unwrap_or(0) {
            0 => {}
            n if !(1..=65535).contains(&n) => causes.push(Cause::invalid(
                &format!("{at}.hostPort"),
                &n.to_string(),
                PORT_RANGE_MSG,
            )),
            _ => {}
        }
        match p["protocol"].as_str().unwrap_or("") {
            "" => causes.push(Cause::required(&format!("{at}.protocol"), "")),
            "TCP" | "UDP" | "SCTP" => {}
            other => causes.push(Cause::not_supported(
                &format!("{at}.protocol"),
                &quote(other),
                "\"SCTP\", \"TCP\", \"UDP\"",
            )),
        }
    }
}

/// `IsEnvVarName`: `[-._a-zA-Z][-._a-zA-Z0-9]*`, and not `.`, `..` or starting with `..`.
fn env_name_errors(n: &str) -> Vec<String> {
    let b = n.as_bytes();
    let ok_first = |c: u8| c.is_ascii_alphabetic() || matches!(c, b'-' | b'.' | b'_');
    let mut errs = Vec::new();
    if !(ok_first(b[0]) && b.iter().all(|c| ok_first(*c) || c.is_ascii_digit())) {
        errs.push(ENV_NAME_MSG.to_string());
    }
    if n == "." {
        errs.push("must not be '.'".into());
    } else if n == ".." {
        errs.push("must not be '..'".into());
    } else if n.starts_with("..") {
        errs.push("must not start with '..'".into());
    }
    errs
}

/// `ValidateEnv`: names, and `value` with `valueFrom`.
fn validate_env(c: &Value, at: &str, causes: &mut Vec<Cause>) {
    for (i, e) in list(c, "env").iter().enumerate() {
        let at = format!("{at}.env[{i}]");
        match e["name"].as_str().unwrap_or("") {
            "" => causes.push(Cause::required(&format!("{at}.name"), "")),
            n => {
                for err in env_name_errors(n) {
                    causes.push(Cause::invalid(&format!("{at}.name"), &quote(n), &err));
                }
            }
        }
        let has_value = !e["value"].as_str().unwrap_or("").is_empty();
        if has_value && e["valueFrom"].is_object() {
            causes.push(Cause::invalid(
                &format!("{at}.valueFrom"),
                "\"\"",
                "may not be specified when `value` is not empty",
            ));
        }
    }
}

/// `ValidateVolumeMounts`: each names a volume of the pod, at a unique path.
fn validate_mounts(c: &Value, at: &str, volumes: &BTreeSet<&str>, causes: &mut Vec<Cause>) {
    let mut paths = BTreeSet::new();
    for (i, m) in list(c, "volumeMounts").iter().enumerate() {
        let at = format!("{at}.volumeMounts[{i}]");
        let name = m["name"].as_str().unwrap_or("");
        if name.is_empty() {
            causes.push(Cause::required(&format!("{at}.name"), ""));
        }
        if !volumes.contains(name) {
            causes.push(Cause::not_found(&format!("{at}.name"), &quote(name)));
        }
        let path = m["mountPath"].as_str().unwrap_or("");
        if path.is_empty() {
            causes.push(Cause::required(&format!("{at}.mountPath"), ""));
        }
        if !paths.insert(path) {
            causes.push(Cause::invalid(
                &format!("{at}.mountPath"),
                &quote(path),
                "must be unique",
            ));
        }
    }
}

/// Resources the kubelet may overcommit (requests below limits): native ones but hugepages.
fn overcommit_allowed(name: &str) -> bool {
    native(name) && !name.starts_with("hugepages-")
}

/// `IsNativeResource`: no domain, or a `kubernetes.io` one.
fn native(name: &str) -> bool {
    !name.contains('/') || name.contains("kubernetes.io/")
}

/// `validateContainerResourceName` and `ValidateResourceQuantityValue` for one entry.
fn resource_entry_causes(name: &str, q: &Value, at: &str, causes: &mut Vec<Cause>) {
    for e in qualified_name_errors(name) {
        causes.push(Cause::invalid(at, &quote(name), &e));
    }
    let standard =
        matches!(name, "cpu" | "memory" | "ephemeral-storage") || name.starts_with("hugepages-");
    if !name.contains('/') && !standard {
        causes.push(Cause::invalid(
            at,
            &quote(name),
            "must be a standard resource for containers",
        ));
    }
    let shown = quantity_text(q);
    let Ok(v) = parse_quantity(q) else {
        return;
    };
    if v < 0.0 {
        causes.push(Cause::invalid(
            at,
            &quote(&shown),
            "must be greater than or equal to 0",
        ));
    }
    // Extended resources (a domain outside kubernetes.io) are counted in whole units.
    if !native(name) && v.fract() != 0.0 {
        causes.push(Cause::invalid(at, &quote(&shown), "must be an integer"));
    }
}

fn quantity_text(q: &Value) -> String {
    q.as_str().map_or_else(|| q.to_string(), str::to_string)
}

/// `ValidateResourceRequirements`: names and quantities of limits and requests, and every
/// request at most its limit (equal to it where overcommit is not allowed).
fn validate_resources(r: &Value, at: &str, causes: &mut Vec<Cause>) {
    let limits = r["limits"].as_object();
    for (name, q) in limits.into_iter().flatten() {
        resource_entry_causes(name, q, &format!("{at}.limits[{name}]"), causes);
    }
    let requests_at = format!("{at}.requests");
    for (name, q) in r["requests"].as_object().into_iter().flatten() {
        resource_entry_causes(name, q, &format!("{requests_at}[{name}]"), causes);
        let limit = limits.and_then(|l| l.get(name));
        let (Ok(req), Some(Ok(lim))) = (parse_quantity(q), limit.map(parse_quantity)) else {
            if limit.is_none() && !overcommit_allowed(name) {
                causes.push(Cause::required(
                    &format!("{at}.limits"),
                    "Limit must be set for non overcommitable resources",
                ));
            }
            continue;
        };
        let (shown, limit_shown) = (
            quantity_text(q),
            limit.map(quantity_text).unwrap_or_default(),
        );
        if req != lim && !overcommit_allowed(name) {
            causes.push(Cause::invalid(
                &requests_at,
                &quote(&shown),
                &format!("must be equal to {name} limit of {limit_shown}"),
            ));
        } else if req > lim {
            causes.push(Cause::invalid(
                &requests_at,
                &quote(&shown),
                &format!("must be less than or equal to {name} limit of {limit_shown}"),
            ));
        }
    }
}

/// Image pull policy default: `Always` for `:latest` or no tag, else `IfNotPresent`.
fn pull_policy(image: &str) -> &'static str {
    let last = image.rsplit('/').next().unwrap_or(image);
    // A digest-pinned image has no tag, and only the tag `latest` (or none at all) means Always.
    if last.contains('@') {
        return "IfNotPresent";
    }
    match last.rsplit_once(':') {
        None | Some((_, "latest")) => "Always",
        Some(_) => "IfNotPresent",
    }
}

/// The defaults of every pod spec, a pod's or a template's (`SetDefaults_PodSpec`,
/// `SetDefaults_Container`, `SetDefaults_ContainerPort`), and `serviceAccount`, the deprecated
/// field v1 fills from `serviceAccountName` when it converts a spec for output.
pub fn default_pod_spec(spec: &mut Map<String, Value>) {
    set_default(spec, "restartPolicy", json!("Always"));
    set_default(spec, "terminationGracePeriodSeconds", json!(30));
    set_default(spec, "dnsPolicy", json!("ClusterFirst"));
    set_default(spec, "securityContext", json!({}));
    set_default(spec, "schedulerName", json!("default-scheduler"));
    if let Some(account) = spec.get("serviceAccountName").cloned() {
        set_default(spec, "serviceAccount", account);
    }
    for list in ["containers", "initContainers"] {
        if let Some(Value::Array(cs)) = spec.get_mut(list) {
            for c in cs.iter_mut().filter_map(Value::as_object_mut) {
                let image = c
                    .get("image")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string();
                set_default(c, "resources", json!({}));
                set_default(c, "terminationMessagePath", json!("/dev/termination-log"));
                set_default(c, "terminationMessagePolicy", json!("File"));
                set_default(c, "imagePullPolicy", json!(pull_policy(&image)));
                if let Some(Value::Array(ports)) = c.get_mut("ports") {
                    for port in ports.iter_mut().filter_map(Value::as_object_mut) {
                        set_default(port, "protocol", json!("TCP"));
                    }
                }
                for probe in ["livenessProbe", "readinessProbe", "startupProbe"] {
                    if let Some(Value::Object(p)) = c.get_mut(probe) {
                        default_probe(p);
                    }
                }
            }
        }
    }
}

/// `SetDefaults_Probe` and `SetDefaults_HTTPGetAction`: a probe's zero numbers are the
/// defaults (1 s timeout, every 10 s, 1 success, 3 failures); an HTTP probe is `GET /` over HTTP.
fn default_probe(probe: &mut Map<String, Value>) {
    for (field, default) in [
        ("timeoutSeconds", 1),
        ("periodSeconds", 10),
        ("successThreshold", 1),
        ("failureThreshold", 3),
    ] {
        if probe.get(field).and_then(Value::as_i64).unwrap_or(0) == 0 {
            probe.insert(field.into(), json!(default));
        }
    }
    if let Some(Value::Object(get)) = probe.get_mut("httpGet") {
        for (field, default) in [("path", "/"), ("scheme", "HTTP")] {
            if get
                .get(field)
                .and_then(Value::as_str)
                .unwrap_or("")
                .is_empty()
            {
                get.insert(field.into(), json!(default));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn messages(spec: Value) -> Vec<String> {
        validate_pod_spec(&spec, "spec")
            .into_iter()
            .map(|c| format!("{}: {}", c.field, c.message))
            .collect()
    }

    #[test]
    fn quantities_parse_as_kubernetes_writes_them() {
        assert_eq!(parse_quantity(&json!("500m")), Ok(0.5));
        assert_eq!(parse_quantity(&json!("1Gi")), Ok(1073741824.0));
        assert_eq!(parse_quantity(&json!("1e3")), Ok(1000.0));
        assert_eq!(parse_quantity(&json!(2)), Ok(2.0));
        assert_eq!(parse_quantity(&json!(".5")), Ok(0.5));
        assert_eq!(parse_quantity(&json!("lots")), Err(QUANTITY_FORMAT_MSG));
        assert_eq!(parse_quantity(&json!("1Gb")), Err(QUANTITY_FORMAT_MSG));
        assert_eq!(parse_quantity(&json!("1iG")), Err(QUANTITY_SUFFIX_MSG));
        assert_eq!(parse_quantity(&json!("")), Err(QUANTITY_FORMAT_MSG));
    }

    #[test]
    fn a_valid_spec_has_no_causes() {
        let spec = json!({
            "volumes": [{"name": "data", "emptyDir": {}}],
            "initContainers": [{"name": "init", "image": "busybox"}],
            "containers": [{"name": "a", "image": "nginx",
                "ports": [{"name": "http", "containerPort": 80, "protocol": "TCP"}],
                "env": [{"name": "MY_ENV.NAME", "value": "x"}],
                "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                "resources": {"requests": {"cpu": "100m", "memory": "64Mi"},
                    "limits": {"cpu": 1, "memory": "128Mi"}}}]});
        assert_eq!(messages(spec), Vec::<String>::new());
    }

    #[test]
    fn each_container_field_is_refused_with_its_path() {
        let spec = json!({
            "volumes": [{"name": "data", "emptyDir": {}}, {"name": "data", "emptyDir": {}}, {"name": "none"}],
            "initContainers": [{"name": "a", "image": "busybox", "livenessProbe": {"exec": {}}}],
            "containers": [{"name": "a", "image": "nginx",
                "ports": [{"containerPort": 70000, "protocol": "HTTP"}, {"name": "Web", "containerPort": 0, "protocol": "TCP"}],
                "env": [{"name": "1BAD", "value": "x"}],
                "volumeMounts": [{"name": "missing", "mountPath": "/m"}],
                "resources": {"requests": {"memory": "2Gi", "cpuu": "1"}, "limits": {"memory": "1Gi"}}},
                {"name": "Bad_Name", "image": ""}],
            "restartPolicy": "Sometimes"});
        let got = messages(spec);
        let want = [
            "spec.volumes[1].name: Duplicate value: \"data\"",
            "spec.volumes[2]: Required value: must specify a volume type",
            "spec.containers[0].ports[0].containerPort: Invalid value: 70000: must be between 1 and 65535, inclusive",
            "spec.containers[0].ports[0].protocol: Unsupported value: \"HTTP\": supported values: \"SCTP\", \"TCP\", \"UDP\"",
            "spec.containers[0].ports[1].name: Invalid value: \"Web\": must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)",
            "spec.containers[0].ports[1].containerPort: Required value",
            &format!("spec.containers[0].env[0].name: Invalid value: \"1BAD\": {ENV_NAME_MSG}"),
            "spec.containers[0].volumeMounts[0].name: Not found: \"missing\"",
            "spec.containers[0].resources.requests[cpuu]: Invalid value: \"cpuu\": must be a standard resource for containers",
            "spec.containers[0].resources.requests: Invalid value: \"2Gi\": must be less than or equal to memory limit of 1Gi",
            "spec.containers[1].image: Required value",
            "spec.initContainers[0].name: Duplicate value: \"a\"",
            "spec.initContainers[0].livenessProbe: Forbidden: may not be set for init containers",
            "spec.restartPolicy: Unsupported value: \"Sometimes\": supported values: \"Always\", \"OnFailure\", \"Never\"",
        ];
        for w in want {
            assert!(got.iter().any(|g| g == w), "missing {w}\ngot {got:#?}");
        }
        assert!(got
            .iter()
            .any(|g| g.starts_with("spec.containers[1].name: Invalid value: \"Bad_Name\"")));
    }

    #[test]
    fn pull_policy_follows_tag() {
        assert_eq!(pull_policy("nginx"), "Always");
        assert_eq!(pull_policy("nginx:latest"), "Always");
        assert_eq!(pull_policy("nginx:1.27"), "IfNotPresent");
        assert_eq!(pull_policy("localhost:5000/nginx"), "Always");
        assert_eq!(pull_policy("nginx@sha256:abc"), "IfNotPresent");
    }

    #[test]
    fn every_pod_spec_gets_port_probe_and_service_account_defaults() {
        let mut spec = json!({"serviceAccountName": "op", "containers": [{"name": "c", "image": "i",
            "ports": [{"containerPort": 80}],
            "livenessProbe": {"httpGet": {"port": 80}, "periodSeconds": 5}}]});
        default_pod_spec(spec.as_object_mut().expect("object"));
        let c = &spec["containers"][0];
        assert_eq!(c["ports"][0]["protocol"], "TCP");
        assert_eq!(
            c["livenessProbe"],
            json!({"httpGet": {"port": 80, "path": "/", "scheme": "HTTP"}, "periodSeconds": 5,
                "timeoutSeconds": 1, "successThreshold": 1, "failureThreshold": 3})
        );
        assert_eq!(
            spec["serviceAccount"], "op",
            "v1 mirrors the deprecated field"
        );
    }
}
