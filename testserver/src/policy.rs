//! ValidatingAdmissionPolicy (`admissionregistration.k8s.io`, v1beta1 in 1.28 with the beta
//! enabled, v1 since 1.30): the checks made when a policy or binding is written and their
//! server defaults. The admission plugin that enforces them is `policy_admission.rs`.
//!
//! Expressions are the CEL subset of `cel.rs`. A policy using what the test server does not
//! evaluate (an expression outside the subset, `paramKind`, `variables`, `auditAnnotations`) and
//! a binding with a `paramRef` are refused when written (422), never half-enforced.

use crate::cel;
use crate::status::Cause;
use crate::util::obj_mut;
use serde_json::{json, Map, Value};

pub const GROUP: &str = "admissionregistration.k8s.io";
/// Storage keys of the two resources.
pub const POLICIES: &str = "validatingadmissionpolicies.admissionregistration.k8s.io";
pub const BINDINGS: &str = "validatingadmissionpolicybindings.admissionregistration.k8s.io";

/// The variables a policy's expressions may name.
pub const VARIABLES: [&str; 4] = ["object", "oldObject", "request", "namespaceObject"];

const OPERATIONS: [&str; 5] = ["*", "CONNECT", "CREATE", "DELETE", "UPDATE"];
/// The `reason` a validation may give: what `reasonToCode` maps to a status code.
const REASONS: [&str; 4] = [
    "Forbidden",
    "Invalid",
    "RequestEntityTooLarge",
    "Unauthorized",
];
const ACTIONS: [&str; 3] = ["Audit", "Deny", "Warn"];

/// The refusal of a feature the test server does not evaluate.
fn unsupported(field: &str, what: &str) -> Cause {
    Cause::forbidden(
        field,
        &format!("{what} is not supported by the test server (testserver/src/policy.rs)"),
    )
}

fn quoted(v: &str) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

fn supported_list(values: &[&str]) -> String {
    values
        .iter()
        .map(|v| quoted(v))
        .collect::<Vec<_>>()
        .join(", ")
}

pub fn strings(v: &Value) -> Vec<&str> {
    v.as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

fn compile(expr: &str, field: &str, causes: &mut Vec<Cause>) {
    if expr.trim().is_empty() {
        causes.push(Cause::required(field, "expression is not specified"));
    } else if let Err(e) = cel::parse_with(expr, &VARIABLES) {
        causes.push(Cause::invalid(
            field,
            &quoted(expr),
            &format!("compilation failed: the test server evaluates a small CEL subset only (testserver/src/cel.rs): {e}"),
        ));
    }
}

/// `matchConstraints` of a policy, `matchResources` of a binding.
fn validate_match(m: &Value, field: &str, rules_required: bool, causes: &mut Vec<Cause>) {
    for (key, required) in [
        ("resourceRules", rules_required),
        ("excludeResourceRules", false),
    ] {
        let rules = m[key].as_array().map(Vec::as_slice).unwrap_or(&[]);
        if rules.is_empty() && required {
            causes.push(Cause::required(&format!("{field}.{key}"), ""));
        }
        for (i, r) in rules.iter().enumerate() {
            let at = format!("{field}.{key}[{i}]");
            for list in ["operations", "apiGroups", "apiVersions", "resources"] {
                if strings(&r[list]).is_empty() {
                    causes.push(Cause::required(&format!("{at}.{list}"), ""));
                }
            }
            for (j, op) in strings(&r["operations"]).into_iter().enumerate() {
                if !OPERATIONS.contains(&op) {
                    causes.push(Cause::not_supported(
                        &format!("{at}.operations[{j}]"),
                        &quoted(op),
                        &supported_list(&OPERATIONS),
                    ));
                }
            }
            if let Some(scope) = r["scope"].as_str() {
                if !matches!(scope, "*" | "Cluster" | "Namespaced") {
                    causes.push(Cause::not_supported(
                        &format!("{at}.scope"),
                        &quoted(scope),
                        "\"*\", \"Cluster\", \"Namespaced\"",
                    ));
                }
            }
        }
    }
    if let Some(p) = m["matchPolicy"].as_str() {
        if !matches!(p, "Exact" | "Equivalent") {
            causes.push(Cause::not_supported(
                &format!("{field}.matchPolicy"),
                &quoted(p),
                "\"Equivalent\", \"Exact\"",
            ));
        }
    }
    for sel in ["namespaceSelector", "objectSelector"] {
        for (i, e) in m[sel]["matchExpressions"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            let op = e["operator"].as_str().unwrap_or("");
            if !matches!(op, "In" | "NotIn" | "Exists" | "DoesNotExist") {
                causes.push(Cause::not_supported(
                    &format!("{field}.{sel}.matchExpressions[{i}].operator"),
                    &quoted(op),
                    "\"DoesNotExist\", \"Exists\", \"In\", \"NotIn\"",
                ));
            }
        }
    }
}

/// What kube-apiserver's validation says of a ValidatingAdmissionPolicy, for the fields this
/// server relies on, plus the refusal of what it does not evaluate.
pub fn validate_policy(obj: &Value) -> Vec<Cause> {
    let spec = &obj["spec"];
    let mut causes = Vec::new();
    for (key, what) in [
        ("paramKind", "spec.paramKind (policy parameters)"),
        ("variables", "spec.variables"),
        ("auditAnnotations", "spec.auditAnnotations"),
    ] {
        let set = match &spec[key] {
            Value::Null => false,
            Value::Array(a) => !a.is_empty(),
            _ => true,
        };
        if set {
            causes.push(unsupported(&format!("spec.{key}"), what));
        }
    }
    match &spec["matchConstraints"] {
        Value::Null => causes.push(Cause::required("spec.matchConstraints", "")),
        m => validate_match(m, "spec.matchConstraints", true, &mut causes),
    }
    if let Some(f) = spec["failurePolicy"].as_str() {
        if !matches!(f, "Fail" | "Ignore") {
            causes.push(Cause::not_supported(
                "spec.failurePolicy",
                &quoted(f),
                "\"Fail\", \"Ignore\"",
            ));
        }
    }
    let validations = spec["validations"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    if validations.is_empty() {
        causes.push(Cause::required(
            "spec.validations",
            "validations or auditAnnotations must contain at least one item",
        ));
    }
    for (i, v) in validations.iter().enumerate() {
        let at = format!("spec.validations[{i}]");
        compile(
            v["expression"].as_str().unwrap_or(""),
            &format!("{at}.expression"),
            &mut causes,
        );
        if let Some(m) = v["messageExpression"].as_str() {
            compile(m, &format!("{at}.messageExpression"), &mut causes);
        }
        if let Some(r) = v["reason"].as_str() {
            if !REASONS.contains(&r) {
                causes.push(Cause::not_supported(
                    &format!("{at}.reason"),
                    &quoted(r),
                    &supported_list(&REASONS),
                ));
            }
        }
    }
    for (i, c) in spec["matchConditions"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let at = format!("spec.matchConditions[{i}]");
        if c["name"].as_str().unwrap_or("").is_empty() {
            causes.push(Cause::required(&format!("{at}.name"), ""));
        }
        compile(
            c["expression"].as_str().unwrap_or(""),
            &format!("{at}.expression"),
            &mut causes,
        );
    }
    causes
}

/// What kube-apiserver's validation says of a ValidatingAdmissionPolicyBinding.
pub fn validate_binding(obj: &Value) -> Vec<Cause> {
    let spec = &obj["spec"];
    let mut causes = Vec::new();
    if spec["policyName"].as_str().unwrap_or("").is_empty() {
        causes.push(Cause::required("spec.policyName", ""));
    }
    if !spec["paramRef"].is_null() {
        causes.push(unsupported(
            "spec.paramRef",
            "spec.paramRef (policy parameters)",
        ));
    }
    let actions = strings(&spec["validationActions"]);
    if actions.is_empty() {
        causes.push(Cause::required(
            "spec.validationActions",
            "at least one validation action is required",
        ));
    }
    for (i, a) in actions.iter().enumerate() {
        let at = format!("spec.validationActions[{i}]");
        if !ACTIONS.contains(a) {
            causes.push(Cause::not_supported(
                &at,
                &quoted(a),
                &supported_list(&ACTIONS),
            ));
        } else if actions[..i].contains(a) {
            causes.push(Cause::duplicate(&at, &quoted(a)));
        }
    }
    if actions.contains(&"Deny") && actions.contains(&"Warn") {
        causes.push(Cause::invalid(
            "spec.validationActions",
            &format!("{:?}", actions),
            "must not contain both Deny and Warn (repeating the same validation failure information in the API response and headers serves no purpose)",
        ));
    }
    if !spec["matchResources"].is_null() {
        validate_match(
            &spec["matchResources"],
            "spec.matchResources",
            false,
            &mut causes,
        );
    }
    causes
}

/// `SetDefaults_MatchResources`: `Equivalent`, empty selectors, and scope `*` on each rule.
fn default_match(m: &mut Map<String, Value>) {
    m.entry("matchPolicy").or_insert(json!("Equivalent"));
    m.entry("namespaceSelector").or_insert(json!({}));
    m.entry("objectSelector").or_insert(json!({}));
    for key in ["resourceRules", "excludeResourceRules"] {
        if let Some(Value::Array(rules)) = m.get_mut(key) {
            for r in rules.iter_mut().filter_map(Value::as_object_mut) {
                r.entry("scope").or_insert(json!("*"));
            }
        }
    }
}

/// Server defaults of a policy: `failurePolicy: Fail` and the match defaults.
pub fn default_policy(obj: &mut Map<String, Value>) {
    let spec = obj_mut(obj, "spec");
    spec.entry("failurePolicy").or_insert(json!("Fail"));
    if let Some(Value::Object(m)) = spec.get_mut("matchConstraints") {
        default_match(m);
    }
}

/// Server defaults of a binding: the match defaults when it has `matchResources`.
pub fn default_binding(obj: &mut Map<String, Value>) {
    if let Some(Value::Object(m)) = obj_mut(obj, "spec").get_mut("matchResources") {
        default_match(m);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_policy_outside_what_the_server_evaluates_is_refused_with_the_field() {
        let policy = json!({"spec": {
            "paramKind": {"apiVersion": "v1", "kind": "ConfigMap"},
            "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                "operations": ["CREATE", "PATCH"], "resources": ["pods"]}]},
            "validations": [{"expression": "object.metadata.name.lowerAscii() == 'a'"},
                {"expression": "true", "reason": "Teapot"}]}});
        let fields: Vec<String> = validate_policy(&policy)
            .into_iter()
            .map(|c| format!("{}: {}", c.field, c.message))
            .collect();
        assert_eq!(fields.len(), 4, "{fields:#?}");
        assert!(fields[0].starts_with("spec.paramKind: Forbidden: spec.paramKind"));
        assert!(fields[1].starts_with(
            "spec.matchConstraints.resourceRules[0].operations[1]: Unsupported value: \"PATCH\""
        ));
        assert!(fields[2].starts_with(
            "spec.validations[0].expression: Invalid value: \"object.metadata.name.lowerAscii() == 'a'\": compilation failed"
        ));
        assert_eq!(
            fields[3],
            "spec.validations[1].reason: Unsupported value: \"Teapot\": supported values: \"Forbidden\", \"Invalid\", \"RequestEntityTooLarge\", \"Unauthorized\""
        );
        let binding = json!({"spec": {"validationActions": ["Deny", "Warn", "Deny"]}});
        let fields: Vec<String> = validate_binding(&binding)
            .into_iter()
            .map(|c| c.field)
            .collect();
        assert_eq!(
            fields,
            [
                "spec.policyName",
                "spec.validationActions[2]",
                "spec.validationActions"
            ]
        );
    }
}
