//! The built-in kinds the server stores without acting on them: ServiceAccount, Service,
//! Deployment, NetworkPolicy, Role, ClusterRole, RoleBinding and ClusterRoleBinding, what
//! `config/default` deploys. Their server defaults and validation are kube-apiserver's for the
//! fields kubectl sends; nothing else happens: no ReplicaSet or pod for a Deployment, no
//! cluster IP, endpoints or node port for a Service, no token for a ServiceAccount; the RBAC
//! objects act only through the authorizer (`rbac.rs`), with no aggregation, bootstrap roles
//! or escalation check.
//!
//! Where a message quotes an object, it prints it as Go's `%#v` does (`v1.LabelSelector{...}`),
//! since that is what a real server's `field.Invalid` writes.

use crate::names::{path_segment_errors, quote, subdomain_errors};
use crate::podspec::{default_pod_spec, validate_pod_spec};
use crate::resources::RBAC_GROUP;
use crate::selector::label_selector_matches;
use crate::status::Cause;
use crate::util::{obj_mut, set_default};
use serde_json::{json, Map, Value};

fn strings(v: &Value) -> Vec<&str> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect()
}

fn str_of<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key].as_str().unwrap_or("")
}

/// Whether a list (or map) field is unset or empty: Go's validation sees no difference.
fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Array(a) => a.is_empty(),
        Value::Object(m) => m.is_empty(),
        _ => false,
    }
}

/// `[]string{"a", "b"}`, or `[]string(nil)` for none.
fn go_strings(v: &Value) -> String {
    if is_empty(v) {
        return "[]string(nil)".to_string();
    }
    let items: Vec<String> = strings(v).into_iter().map(quote).collect();
    format!("[]string{{{}}}", items.join(", "))
}

/// `map[string]string{"a":"b", "c":"d"}` (keys sorted, as `fmt` prints maps), or
/// `map[string]string(nil)` for none.
fn go_string_map(v: &Value) -> String {
    let Some(m) = v.as_object().filter(|m| !m.is_empty()) else {
        return "map[string]string(nil)".to_string();
    };
    let mut pairs: Vec<(&String, &Value)> = m.iter().collect();
    pairs.sort_by_key(|(k, _)| *k);
    let items: Vec<String> = pairs
        .iter()
        .map(|(k, v)| format!("{}:{}", quote(k), quote(v.as_str().unwrap_or(""))))
        .collect();
    format!("map[string]string{{{}}}", items.join(", "))
}

/// A `metav1.LabelSelector` as `%#v` prints it.
fn go_label_selector(sel: &Value) -> String {
    let expressions = match sel["matchExpressions"].as_array().filter(|a| !a.is_empty()) {
        None => "[]v1.LabelSelectorRequirement(nil)".to_string(),
        Some(reqs) => {
            let items: Vec<String> = reqs
                .iter()
                .map(|r| {
                    format!(
                        "v1.LabelSelectorRequirement{{Key:{}, Operator:{}, Values:{}}}",
                        quote(str_of(r, "key")),
                        quote(str_of(r, "operator")),
                        go_strings(&r["values"])
                    )
                })
                .collect();
            format!("[]v1.LabelSelectorRequirement{{{}}}", items.join(", "))
        }
    };
    format!(
        "v1.LabelSelector{{MatchLabels:{}, MatchExpressions:{}}}",
        go_string_map(&sel["matchLabels"]),
        expressions
    )
}

/// `SetDefaults_Service`: type ClusterIP, session affinity None, each port TCP and targeting
/// its own number, the traffic policies. No cluster IP, `ipFamilies` or node port is
/// allocated: those come from the registry's allocators, which this server does not run.
pub fn default_service(obj: &mut Map<String, Value>) {
    let spec = obj_mut(obj, "spec");
    set_default(spec, "type", json!("ClusterIP"));
    set_default(spec, "sessionAffinity", json!("None"));
    match spec.get("sessionAffinity").and_then(Value::as_str) {
        Some("None") => {
            spec.remove("sessionAffinityConfig");
        }
        Some("ClientIP") => {
            let client_ip = obj_mut(obj_mut(spec, "sessionAffinityConfig"), "clientIP");
            set_default(client_ip, "timeoutSeconds", json!(10800));
        }
        _ => {}
    }
    if let Some(Value::Array(ports)) = spec.get_mut("ports") {
        for port in ports.iter_mut().filter_map(Value::as_object_mut) {
            set_default(port, "protocol", json!("TCP"));
            let unset = match port.get("targetPort") {
                None | Some(Value::Null) => true,
                Some(t) => t == &json!(0) || t == &json!(""),
            };
            if unset {
                let number = port.get("port").cloned().unwrap_or(Value::Null);
                port.insert("targetPort".into(), number);
            }
        }
    }
    let kind = spec
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    if matches!(kind.as_str(), "NodePort" | "LoadBalancer") {
        set_default(spec, "externalTrafficPolicy", json!("Cluster"));
    }
    if matches!(kind.as_str(), "ClusterIP" | "NodePort" | "LoadBalancer") {
        set_default(spec, "internalTrafficPolicy", json!("Cluster"));
    }
    if kind == "LoadBalancer" {
        set_default(spec, "allocateLoadBalancerNodePorts", json!(true));
    }
}

/// `SetDefaults_Deployment` (apps/v1): one replica, a RollingUpdate of 25 % / 25 %, ten old
/// ReplicaSets kept, a 600 s progress deadline; and the template's pod spec gets what every pod
/// spec does. Go writes the template's empty `creationTimestamp` as null.
pub fn default_deployment(obj: &mut Map<String, Value>) {
    let spec = obj_mut(obj, "spec");
    set_default(spec, "replicas", json!(1));
    let strategy = obj_mut(spec, "strategy");
    set_default(strategy, "type", json!("RollingUpdate"));
    if strategy.get("type").and_then(Value::as_str) == Some("RollingUpdate") {
        let rolling = obj_mut(strategy, "rollingUpdate");
        set_default(rolling, "maxUnavailable", json!("25%"));
        set_default(rolling, "maxSurge", json!("25%"));
    }
    set_default(spec, "revisionHistoryLimit", json!(10));
    set_default(spec, "progressDeadlineSeconds", json!(600));
    let template = obj_mut(spec, "template");
    obj_mut(template, "metadata")
        .entry("creationTimestamp")
        .or_insert(Value::Null);
    default_pod_spec(obj_mut(template, "spec"));
}

/// `SetDefaults_NetworkPolicy`: `policyTypes` Ingress, and Egress when egress rules are given;
/// ports TCP. An absent `podSelector` is the empty one (it is not a pointer in Go).
pub fn default_network_policy(obj: &mut Map<String, Value>) {
    let spec = obj_mut(obj, "spec");
    set_default(spec, "podSelector", json!({}));
    if spec.get("policyTypes").is_none_or(is_empty) {
        let mut types = vec![json!("Ingress")];
        if !spec.get("egress").is_none_or(is_empty) {
            types.push(json!("Egress"));
        }
        spec.insert("policyTypes".into(), Value::Array(types));
    }
    for direction in ["ingress", "egress"] {
        let Some(Value::Array(rules)) = spec.get_mut(direction) else {
            continue;
        };
        for rule in rules.iter_mut() {
            let Some(Value::Array(ports)) = rule.get_mut("ports") else {
                continue;
            };
            for port in ports.iter_mut().filter_map(Value::as_object_mut) {
                set_default(port, "protocol", json!("TCP"));
            }
        }
    }
}

/// `SetDefaults_RoleBinding` / `_ClusterRoleBinding` and `SetDefaults_Subject`: the RBAC group
/// for `roleRef` and for User and Group subjects.
pub fn default_binding(obj: &mut Map<String, Value>) {
    let role_ref = obj_mut(obj, "roleRef");
    if role_ref
        .get("apiGroup")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
    {
        role_ref.insert("apiGroup".into(), json!(RBAC_GROUP));
    }
    if let Some(Value::Array(subjects)) = obj.get_mut("subjects") {
        for s in subjects.iter_mut().filter_map(Value::as_object_mut) {
            let unset = s
                .get("apiGroup")
                .and_then(Value::as_str)
                .is_none_or(str::is_empty);
            let kind = s.get("kind").and_then(Value::as_str);
            if unset && matches!(kind, Some("User" | "Group")) {
                s.insert("apiGroup".into(), json!(RBAC_GROUP));
            }
        }
    }
}

const SERVICE_TYPES: [&str; 4] = ["ClusterIP", "ExternalName", "LoadBalancer", "NodePort"];
const PROTOCOLS: [&str; 3] = ["SCTP", "TCP", "UDP"];

/// `"A", "B"`: the supported values as `field.NotSupported` lists them.
fn supported(values: &[&str]) -> String {
    values
        .iter()
        .map(|v| quote(v))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `ValidateService`, for type, ports (required unless headless or ExternalName; numbers,
/// protocols, names when there are several) and `externalName`.
pub fn validate_service(obj: &Value) -> Vec<Cause> {
    let spec = &obj["spec"];
    let mut causes = Vec::new();
    let kind = str_of(spec, "type");
    if !SERVICE_TYPES.contains(&kind) {
        causes.push(Cause::not_supported(
            "spec.type",
            &quote(kind),
            &supported(&SERVICE_TYPES),
        ));
    }
    let headless = str_of(spec, "clusterIP") == "None";
    let ports = spec["ports"].as_array().map(Vec::as_slice).unwrap_or(&[]);
    if ports.is_empty() && !headless && kind != "ExternalName" {
        causes.push(Cause::required("spec.ports", ""));
    }
    for (i, p) in ports.iter().enumerate() {
        let at = format!("spec.ports[{i}]");
        if ports.len() > 1 && str_of(p, "name").is_empty() {
            causes.push(Cause::required(&format!("{at}.name"), ""));
        }
        let number = p["port"].as_i64().unwrap_or(0);
        if !(1..=65535).contains(&number) {
            causes.push(Cause::invalid(
                &format!("{at}.port"),
                &number.to_string(),
                "must be between 1 and 65535, inclusive",
            ));
        }
        let protocol = str_of(p, "protocol");
        if !PROTOCOLS.contains(&protocol) {
            causes.push(Cause::not_supported(
                &format!("{at}.protocol"),
                &quote(protocol),
                &supported(&PROTOCOLS),
            ));
        }
    }
    if kind == "ExternalName" && str_of(spec, "externalName").is_empty() {
        causes.push(Cause::required("spec.externalName", ""));
    }
    causes
}

/// `ValidateDeploymentSpec`: replicas, a selector that is set, not empty and matches the
/// template's labels, and the template's pod spec (`ValidatePodTemplateSpecForReplicaSet`:
/// restart policy Always, no `activeDeadlineSeconds`).
pub fn validate_deployment(obj: &Value) -> Vec<Cause> {
    let spec = &obj["spec"];
    let mut causes = Vec::new();
    if let Some(n) = spec["replicas"].as_i64().filter(|n| *n < 0) {
        causes.push(Cause::invalid(
            "spec.replicas",
            &n.to_string(),
            "must be greater than or equal to 0",
        ));
    }
    let selector = &spec["selector"];
    let template = &spec["template"];
    let labels = &template["metadata"]["labels"];
    if selector.is_null() {
        causes.push(Cause::required("spec.selector", ""));
    } else if is_empty(&selector["matchLabels"]) && is_empty(&selector["matchExpressions"]) {
        causes.push(Cause::invalid(
            "spec.selector",
            &go_label_selector(selector),
            "empty selector is invalid for deployment",
        ));
    } else if !label_selector_matches(selector, labels) {
        causes.push(Cause::invalid(
            "spec.template.metadata.labels",
            &go_string_map(labels),
            "`selector` does not match template `labels`",
        ));
    }
    let pod = &template["spec"];
    causes.extend(validate_pod_spec(pod, "spec.template.spec"));
    let policy = str_of(pod, "restartPolicy");
    if policy != "Always" {
        causes.push(Cause::not_supported(
            "spec.template.spec.restartPolicy",
            &quote(policy),
            "\"Always\"",
        ));
    }
    if let Some(deadline) = pod["activeDeadlineSeconds"].as_i64() {
        causes.push(Cause::invalid(
            "spec.template.spec.activeDeadlineSeconds",
            &deadline.to_string(),
            "activeDeadlineSeconds in ReplicaSet is not Supported",
        ));
    }
    causes
}

/// A selector with empty parts dropped: Go's semantic equality does not tell a nil map or list
/// from an empty one.
fn normalized_selector(sel: &Value) -> Value {
    match sel.as_object() {
        Some(m) => Value::Object(
            m.iter()
                .filter(|(_, v)| !is_empty(v))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        ),
        None => sel.clone(),
    }
}

/// apps/v1 Deployments may not change their selector (`ValidateImmutableField`).
pub fn validate_deployment_update(old: &Value, new: &Value) -> Vec<Cause> {
    let (was, is) = (&old["spec"]["selector"], &new["spec"]["selector"]);
    if normalized_selector(was) == normalized_selector(is) {
        return Vec::new();
    }
    vec![Cause::invalid(
        "spec.selector",
        &go_label_selector(is),
        "field is immutable",
    )]
}

/// `ValidateNetworkPolicySpec`, for `policyTypes` only.
pub fn validate_network_policy(obj: &Value) -> Vec<Cause> {
    strings(&obj["spec"]["policyTypes"])
        .into_iter()
        .enumerate()
        .filter(|(_, t)| !matches!(*t, "Ingress" | "Egress"))
        .map(|(i, t)| {
            Cause::not_supported(
                &format!("spec.policyTypes[{i}]"),
                &quote(t),
                "\"Ingress\", \"Egress\"",
            )
        })
        .collect()
}

/// `validatePolicyRule` for every rule of a Role (`namespaced`) or ClusterRole.
pub fn validate_role(obj: &Value, namespaced: bool) -> Vec<Cause> {
    let mut causes = Vec::new();
    for (i, rule) in obj["rules"].as_array().into_iter().flatten().enumerate() {
        let at = format!("rules[{i}]");
        if is_empty(&rule["verbs"]) {
            causes.push(Cause::required(
                &format!("{at}.verbs"),
                "verbs must contain at least one value",
            ));
        }
        let urls = &rule["nonResourceURLs"];
        if !is_empty(urls) {
            let field = format!("{at}.nonResourceURLs");
            if namespaced {
                causes.push(Cause::invalid(
                    &field,
                    &go_strings(urls),
                    "namespaced rules cannot apply to non-resource URLs",
                ));
            }
            if ["apiGroups", "resources", "resourceNames"]
                .iter()
                .any(|k| !is_empty(&rule[*k]))
            {
                causes.push(Cause::invalid(
                    &field,
                    &go_strings(urls),
                    "rules cannot apply to both regular resources and non-resource URLs",
                ));
            }
            continue;
        }
        if is_empty(&rule["apiGroups"]) {
            causes.push(Cause::required(
                &format!("{at}.apiGroups"),
                "resource rules must supply at least one api group",
            ));
        }
        if is_empty(&rule["resources"]) {
            causes.push(Cause::required(
                &format!("{at}.resources"),
                "resource rules must supply at least one resource",
            ));
        }
        if !is_empty(&rule["resourceNames"]) && strings(&rule["resources"]).len() > 1 {
            causes.push(Cause::required(
                &format!("{at}.resourceNames"),
                "resource names cannot apply to multiple resources",
            ));
        }
    }
    causes
}

/// `ValidateRoleBinding` (`namespaced`) or `ValidateClusterRoleBinding`: the `roleRef` and
/// every subject.
pub fn validate_binding(obj: &Value, namespaced: bool) -> Vec<Cause> {
    let mut causes = Vec::new();
    let role_ref = &obj["roleRef"];
    let group = str_of(role_ref, "apiGroup");
    if group != RBAC_GROUP {
        causes.push(Cause::not_supported(
            "roleRef.apiGroup",
            &quote(group),
            &quote(RBAC_GROUP),
        ));
    }
    let kinds: &[&str] = if namespaced {
        &["Role", "ClusterRole"]
    } else {
        &["ClusterRole"]
    };
    let kind = str_of(role_ref, "kind");
    if !kinds.contains(&kind) {
        causes.push(Cause::not_supported(
            "roleRef.kind",
            &quote(kind),
            &supported(kinds),
        ));
    }
    let name = str_of(role_ref, "name");
    if name.is_empty() {
        causes.push(Cause::required("roleRef.name", ""));
    }
    for e in path_segment_errors(name) {
        causes.push(Cause::invalid("roleRef.name", &quote(name), &e));
    }
    for (i, s) in obj["subjects"].as_array().into_iter().flatten().enumerate() {
        causes.extend(subject_causes(s, namespaced, &format!("subjects[{i}]")));
    }
    causes
}

/// `validateRoleBindingSubject`.
fn subject_causes(s: &Value, namespaced: bool, at: &str) -> Vec<Cause> {
    let mut causes = Vec::new();
    let name = str_of(s, "name");
    let group = str_of(s, "apiGroup");
    if name.is_empty() {
        causes.push(Cause::required(&format!("{at}.name"), ""));
    }
    match str_of(s, "kind") {
        "ServiceAccount" => {
            if !name.is_empty() {
                for e in subdomain_errors(name) {
                    causes.push(Cause::invalid(&format!("{at}.name"), &quote(name), &e));
                }
            }
            if !group.is_empty() {
                causes.push(Cause::not_supported(
                    &format!("{at}.apiGroup"),
                    &quote(group),
                    "\"\"",
                ));
            }
            if !namespaced && str_of(s, "namespace").is_empty() {
                causes.push(Cause::required(&format!("{at}.namespace"), ""));
            }
        }
        kind @ ("User" | "Group") => {
            if name.is_empty() {
                causes.push(Cause::invalid(
                    &format!("{at}.name"),
                    "\"\"",
                    &format!("{} name cannot be empty", kind.to_lowercase()),
                ));
            }
            if group != RBAC_GROUP {
                causes.push(Cause::not_supported(
                    &format!("{at}.apiGroup"),
                    &quote(group),
                    &quote(RBAC_GROUP),
                ));
            }
        }
        other => causes.push(Cause::not_supported(
            &format!("{at}.kind"),
            &quote(other),
            "\"ServiceAccount\", \"User\", \"Group\"",
        )),
    }
    causes
}

/// A binding's `roleRef` cannot change: binding to another role means a new binding.
pub fn validate_binding_update(old: &Value, new: &Value) -> Vec<Cause> {
    let (was, is) = (&old["roleRef"], &new["roleRef"]);
    let fields = ["apiGroup", "kind", "name"];
    if fields.iter().all(|f| str_of(was, f) == str_of(is, f)) {
        return Vec::new();
    }
    vec![Cause::invalid(
        "roleRef",
        &format!(
            "rbac.RoleRef{{APIGroup:{}, Kind:{}, Name:{}}}",
            quote(str_of(is, "apiGroup")),
            quote(str_of(is, "kind")),
            quote(str_of(is, "name"))
        ),
        "cannot change roleRef",
    )]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn defaulted(f: fn(&mut Map<String, Value>), mut v: Value) -> Value {
        f(v.as_object_mut().expect("object"));
        v
    }

    fn fields(causes: &[Cause]) -> Vec<(&str, &str)> {
        causes
            .iter()
            .map(|c| (c.field.as_str(), c.message.as_str()))
            .collect()
    }

    #[test]
    fn service_ports_default_to_tcp_and_their_own_number() {
        let svc = defaulted(
            default_service,
            json!({"spec": {"ports": [{"name": "metrics", "port": 8443, "targetPort": "metrics"},
                {"name": "http", "port": 80}]}}),
        );
        assert_eq!(
            svc["spec"],
            json!({"type": "ClusterIP", "sessionAffinity": "None", "internalTrafficPolicy": "Cluster",
                "ports": [{"name": "metrics", "port": 8443, "targetPort": "metrics", "protocol": "TCP"},
                    {"name": "http", "port": 80, "targetPort": 80, "protocol": "TCP"}]})
        );
        assert!(validate_service(&svc).is_empty());
    }

    #[test]
    fn a_service_without_ports_or_with_a_bad_one_is_invalid() {
        let none = defaulted(default_service, json!({"spec": {}}));
        assert_eq!(
            fields(&validate_service(&none)),
            [("spec.ports", "Required value")]
        );
        let headless = defaulted(default_service, json!({"spec": {"clusterIP": "None"}}));
        assert!(validate_service(&headless).is_empty());
        let bad = defaulted(
            default_service,
            json!({"spec": {"ports": [{"port": 0, "protocol": "HTTP"}, {"name": "b", "port": 1}]}}),
        );
        assert_eq!(
            fields(&validate_service(&bad)),
            [
                ("spec.ports[0].name", "Required value"),
                (
                    "spec.ports[0].port",
                    "Invalid value: 0: must be between 1 and 65535, inclusive"
                ),
                (
                    "spec.ports[0].protocol",
                    "Unsupported value: \"HTTP\": supported values: \"SCTP\", \"TCP\", \"UDP\""
                ),
            ]
        );
    }

    fn deployment(selector: Value, labels: Value) -> Value {
        defaulted(
            default_deployment,
            json!({"spec": {"selector": selector, "template": {"metadata": {"labels": labels},
                "spec": {"containers": [{"name": "c", "image": "nginx:1.27"}]}}}}),
        )
    }

    #[test]
    fn a_deployment_gets_apps_v1_defaults_and_its_template_pod_spec_defaults() {
        let d = deployment(json!({"matchLabels": {"app": "x"}}), json!({"app": "x"}));
        let spec = &d["spec"];
        assert_eq!(spec["replicas"], 1);
        assert_eq!(
            spec["strategy"],
            json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": "25%"}})
        );
        assert_eq!(spec["revisionHistoryLimit"], 10);
        assert_eq!(spec["progressDeadlineSeconds"], 600);
        let template = &spec["template"];
        assert!(template["metadata"]["creationTimestamp"].is_null());
        assert_eq!(template["spec"]["restartPolicy"], "Always");
        assert_eq!(template["spec"]["dnsPolicy"], "ClusterFirst");
        assert_eq!(
            template["spec"]["containers"][0]["imagePullPolicy"],
            "IfNotPresent"
        );
        assert!(
            template["spec"].get("tolerations").is_none(),
            "admission plugins do not touch templates"
        );
        assert!(validate_deployment(&d).is_empty());
    }

    #[test]
    fn a_deployment_whose_selector_misses_its_template_is_invalid_with_go_values() {
        let d = deployment(json!({"matchLabels": {"app": "x"}}), json!({"app": "y"}));
        assert_eq!(
            fields(&validate_deployment(&d)),
            [(
                "spec.template.metadata.labels",
                "Invalid value: map[string]string{\"app\":\"y\"}: `selector` does not match template `labels`"
            )]
        );
        let none = deployment(Value::Null, json!({"app": "y"}));
        assert_eq!(
            fields(&validate_deployment(&none)),
            [("spec.selector", "Required value")]
        );
        let moved = deployment(json!({"matchLabels": {"app": "y"}}), json!({"app": "y"}));
        let old = deployment(json!({"matchLabels": {"app": "x"}}), json!({"app": "x"}));
        assert_eq!(
            fields(&validate_deployment_update(&old, &moved)),
            [(
                "spec.selector",
                "Invalid value: v1.LabelSelector{MatchLabels:map[string]string{\"app\":\"y\"}, \
                 MatchExpressions:[]v1.LabelSelectorRequirement(nil)}: field is immutable"
            )]
        );
        let same = deployment(
            json!({"matchLabels": {"app": "x"}, "matchExpressions": []}),
            json!({"app": "x"}),
        );
        assert!(validate_deployment_update(&old, &same).is_empty());
    }

    #[test]
    fn a_network_policy_defaults_its_policy_types_from_its_rules() {
        let ingress_only = defaulted(
            default_network_policy,
            json!({"spec": {"ingress": [{"ports": [{"port": "metrics"}]}]}}),
        );
        assert_eq!(
            ingress_only["spec"],
            json!({"podSelector": {}, "policyTypes": ["Ingress"],
                "ingress": [{"ports": [{"port": "metrics", "protocol": "TCP"}]}]})
        );
        let both = defaulted(default_network_policy, json!({"spec": {"egress": [{}]}}));
        assert_eq!(both["spec"]["policyTypes"], json!(["Ingress", "Egress"]));
        let bad = json!({"spec": {"policyTypes": ["Sideways"]}});
        assert_eq!(validate_network_policy(&bad).len(), 1);
    }

    #[test]
    fn rules_need_verbs_and_either_resources_or_urls_and_urls_only_cluster_wide() {
        let role = json!({"rules": [
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
            {"nonResourceURLs": ["/metrics"], "verbs": ["get"]},
            {"resources": ["pods"]}
        ]});
        assert_eq!(
            fields(&validate_role(&role, false)),
            [
                (
                    "rules[2].verbs",
                    "Required value: verbs must contain at least one value"
                ),
                (
                    "rules[2].apiGroups",
                    "Required value: resource rules must supply at least one api group"
                ),
            ]
        );
        assert_eq!(
            fields(&validate_role(&role, true))[0],
            (
                "rules[1].nonResourceURLs",
                "Invalid value: []string{\"/metrics\"}: namespaced rules cannot apply to non-resource URLs"
            )
        );
    }

    #[test]
    fn bindings_default_their_groups_and_may_not_change_their_role() {
        let binding = defaulted(
            default_binding,
            json!({"roleRef": {"kind": "ClusterRole", "name": "view"},
                "subjects": [{"kind": "ServiceAccount", "name": "sa", "namespace": "ns"},
                    {"kind": "User", "name": "jane"}]}),
        );
        assert_eq!(binding["roleRef"]["apiGroup"], RBAC_GROUP);
        assert!(binding["subjects"][0].get("apiGroup").is_none());
        assert_eq!(binding["subjects"][1]["apiGroup"], RBAC_GROUP);
        assert!(validate_binding(&binding, false).is_empty());
        let mut other = binding.clone();
        other["roleRef"]["name"] = json!("edit");
        assert_eq!(
            fields(&validate_binding_update(&binding, &other)),
            [(
                "roleRef",
                "Invalid value: rbac.RoleRef{APIGroup:\"rbac.authorization.k8s.io\", \
                 Kind:\"ClusterRole\", Name:\"edit\"}: cannot change roleRef"
            )]
        );
        let role_in_cluster = json!({"roleRef": {"apiGroup": RBAC_GROUP, "kind": "Role", "name": "r"},
            "subjects": [{"kind": "ServiceAccount", "name": "sa"}]});
        assert_eq!(
            fields(&validate_binding(&role_in_cluster, false)),
            [
                (
                    "roleRef.kind",
                    "Unsupported value: \"Role\": supported values: \"ClusterRole\""
                ),
                ("subjects[0].namespace", "Required value"),
            ]
        );
        assert!(validate_binding(&role_in_cluster, true).is_empty());
    }
}
