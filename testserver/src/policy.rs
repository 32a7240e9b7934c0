//! ValidatingAdmissionPolicy (`admissionregistration.k8s.io`, v1beta1 in 1.28 with the beta
//! enabled, v1 since 1.30): the checks made when a policy or binding is written, their server
//! defaults, and the admission plugin that enforces them on every create, update (the `/status`
//! subresource included) and delete that comes through the API, as kube-apiserver's
//! `validatingadmissionpolicy` plugin does (matching in `matching.Matcher`, evaluation in
//! `validator.Validate`, the refusal in `dispatcher.Dispatch`).
//!
//! Expressions are the CEL subset of `cel.rs`. A policy using what the test server does not
//! evaluate (an expression outside the subset, `paramKind`, `variables`, `auditAnnotations`) and
//! a binding with a `paramRef` are refused when written (422), never half-enforced.

use crate::cel::{self, Bindings, Expr, Val};
use crate::resources::{obj_mut, ResourceDef};
use crate::selector::label_selector_matches;
use crate::status::{ApiError, Cause, Details};
use crate::store::Store;
use serde_json::{json, Map, Value};

pub const GROUP: &str = "admissionregistration.k8s.io";
/// Storage keys of the two resources.
pub const POLICIES: &str = "validatingadmissionpolicies.admissionregistration.k8s.io";
pub const BINDINGS: &str = "validatingadmissionpolicybindings.admissionregistration.k8s.io";

/// The variables a policy's expressions may name.
const VARIABLES: [&str; 4] = ["object", "oldObject", "request", "namespaceObject"];

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

fn strings(v: &Value) -> Vec<&str> {
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

// ------------------------------------------------------------------------------------------
// Admission

/// One request as the admission plugin sees it.
pub struct Attempt<'a> {
    /// `CREATE`, `UPDATE` or `DELETE`.
    pub operation: &'static str,
    pub def: &'a ResourceDef,
    /// The version the request was made in.
    pub version: &'a str,
    pub subresource: Option<&'a str>,
    pub namespace: &'a str,
    /// The object's name (for a create, the name it is about to get).
    pub name: &'a str,
    /// The object as it would be stored (`None` for a delete).
    pub object: Option<&'a Value>,
    /// The object as it is stored (`None` for a create).
    pub old: Option<&'a Value>,
    /// The authenticated user.
    pub user: &'a str,
}

impl Attempt<'_> {
    /// The object as a client sees it, with `apiVersion` and `kind`.
    fn typed(&self, obj: Option<&Value>) -> Value {
        match obj {
            None => Value::Null,
            Some(o) => {
                let mut t = o.clone();
                t["apiVersion"] = json!(self.def.api_version(self.version));
                t["kind"] = json!(self.def.kind);
                t
            }
        }
    }

    /// `request` as CEL sees it (`cel.CreateAdmissionRequest`).
    fn request(&self) -> Value {
        let kind = json!({"group": self.def.group, "version": self.version, "kind": self.def.kind});
        let resource =
            json!({"group": self.def.group, "version": self.version, "resource": self.def.plural});
        let options = match self.operation {
            "CREATE" => "CreateOptions",
            "UPDATE" => "UpdateOptions",
            _ => "DeleteOptions",
        };
        let mut r = json!({
            "uid": "",
            "kind": kind,
            "resource": resource,
            "requestKind": kind,
            "requestResource": resource,
            "operation": self.operation,
            "userInfo": {"username": self.user, "groups": ["system:authenticated"]},
            "dryRun": false,
            "options": {"kind": options, "apiVersion": "meta.k8s.io/v1"},
        });
        if let Some(s) = self.subresource {
            r["subResource"] = json!(s);
            r["requestSubResource"] = json!(s);
        }
        if !self.name.is_empty() {
            r["name"] = json!(self.name);
        }
        if !self.namespace.is_empty() {
            r["namespace"] = json!(self.namespace);
        }
        r
    }

    /// The labels a namespace selector is checked against: the namespace's, or the object's
    /// own when the object is a namespace; `None` for other cluster-scoped objects, which a
    /// namespace selector never excludes.
    fn namespace_labels(&self, store: &Store) -> Option<Value> {
        if self.def.group.is_empty() && self.def.plural == "namespaces" {
            let o = self.object.or(self.old)?;
            return Some(o["metadata"]["labels"].clone());
        }
        if self.namespace.is_empty() {
            return None;
        }
        Some(
            store
                .get("namespaces", "", self.namespace)
                .map_or(Value::Null, |n| n["metadata"]["labels"].clone()),
        )
    }
}

/// One rule of `resourceRules` against the request (`rules.Matcher`): operation, group,
/// version, resource with subresource (`*` is every resource but no subresource, `*/*`
/// everything, `pods/*` every subresource of pods), scope and resource names.
fn rule_matches(rule: &Value, a: &Attempt, equivalent: bool) -> bool {
    let any = |list: &str, want: &str| {
        strings(&rule[list])
            .into_iter()
            .any(|x| x == "*" || x == want)
    };
    // With matchPolicy Equivalent a request in another served version of the same resource
    // matches: every version served here has the same shape.
    let version_ok = strings(&rule["apiVersions"]).into_iter().any(|v| {
        v == "*" || v == a.version || (equivalent && a.def.versions.iter().any(|s| s == v))
    });
    let sub = a.subresource.unwrap_or("");
    let resource_ok = strings(&rule["resources"]).into_iter().any(|r| {
        let (res, rsub) = r.split_once('/').unwrap_or((r, ""));
        (res == "*" || res == a.def.plural) && (rsub == "*" || rsub == sub)
    });
    let scope_ok = match rule["scope"].as_str().unwrap_or("*") {
        "Cluster" => !a.def.namespaced,
        "Namespaced" => a.def.namespaced,
        _ => true,
    };
    let names = strings(&rule["resourceNames"]);
    any("operations", a.operation)
        && any("apiGroups", &a.def.group)
        && version_ok
        && resource_ok
        && scope_ok
        && (names.is_empty() || names.contains(&a.name))
}

/// Whether a policy's `matchConstraints` or a binding's `matchResources` select the request.
/// A binding without `resourceRules` selects whatever its policy does.
fn matches(m: &Value, a: &Attempt, ns_labels: &Option<Value>) -> bool {
    if let Some(labels) = ns_labels {
        if !label_selector_matches(&m["namespaceSelector"], labels) {
            return false;
        }
    }
    let object_labels = |o: Option<&Value>| o.map(|o| o["metadata"]["labels"].clone());
    let sel = &m["objectSelector"];
    let empty = sel.as_object().is_none_or(|s| {
        s.values().all(|v| match v {
            Value::Object(o) => o.is_empty(),
            Value::Array(a) => a.is_empty(),
            _ => v.is_null(),
        })
    });
    if !empty
        && ![object_labels(a.object), object_labels(a.old)]
            .iter()
            .flatten()
            .any(|l| label_selector_matches(sel, l))
    {
        return false;
    }
    let equivalent = m["matchPolicy"].as_str() != Some("Exact");
    let rules = |k: &str| m[k].as_array().map(Vec::as_slice).unwrap_or(&[]);
    if rules("excludeResourceRules")
        .iter()
        .any(|r| rule_matches(r, a, equivalent))
    {
        return false;
    }
    rules("resourceRules").is_empty()
        || rules("resourceRules")
            .iter()
            .any(|r| rule_matches(r, a, equivalent))
}

/// A failed validation: its reason (`None`: Invalid) and message.
struct Failure {
    reason: Option<String>,
    message: String,
}

/// `expression 'X' resulted in error: E`, as the CEL filter reports a failed evaluation.
fn eval_error(expr: &str, e: &str) -> String {
    format!("expression '{expr}' resulted in error: {e}")
}

fn evaluate(expr: &str, env: &mut Bindings) -> Result<Val, String> {
    let parsed: Expr = cel::parse_with(expr, &VARIABLES)?;
    cel::eval(&parsed, env)
}

/// The failures of one policy for the request (`validator.Validate`): none when its
/// matchConditions do not all hold. An evaluation error fails under `failurePolicy: Fail`
/// (the default) and is ignored under `Ignore`.
fn failures(policy: &Value, env: &mut Bindings) -> Vec<Failure> {
    let spec = &policy["spec"];
    let fail_closed = spec["failurePolicy"].as_str() != Some("Ignore");
    let mut errors = Vec::new();
    for c in spec["matchConditions"].as_array().into_iter().flatten() {
        let expr = c["expression"].as_str().unwrap_or("");
        match evaluate(expr, env) {
            Ok(Val::Bool(true)) => {}
            Ok(_) => return Vec::new(),
            Err(e) => errors.push(eval_error(expr, &e)),
        }
    }
    if !errors.is_empty() {
        if !fail_closed {
            return Vec::new();
        }
        // An aggregate of the errors, as `utilerrors.NewAggregate` prints it.
        let message = match errors.as_slice() {
            [one] => one.clone(),
            many => format!("[{}]", many.join(", ")),
        };
        return vec![Failure {
            reason: None,
            message,
        }];
    }
    let mut out = Vec::new();
    for v in spec["validations"].as_array().into_iter().flatten() {
        let expr = v["expression"].as_str().unwrap_or("");
        match evaluate(expr, env) {
            Ok(Val::Bool(true)) => {}
            Err(e) => {
                if fail_closed {
                    out.push(Failure {
                        reason: None,
                        message: eval_error(expr, &e),
                    });
                }
            }
            // Anything but true denies, as `EvalResult != celtypes.True` does.
            Ok(_) => {
                let from_expression = v["messageExpression"]
                    .as_str()
                    .and_then(|m| match evaluate(m, env) {
                        Ok(Val::Str(s)) => Some(s.trim().to_string()),
                        _ => None,
                    })
                    .filter(|s| !s.is_empty() && !s.contains('\n'));
                let message = from_expression
                    .or_else(|| {
                        v["message"]
                            .as_str()
                            .map(|m| m.trim().to_string())
                            .filter(|m| !m.is_empty())
                    })
                    .unwrap_or_else(|| format!("failed expression: {}", expr.trim()));
                out.push(Failure {
                    reason: v["reason"].as_str().map(String::from),
                    message,
                });
            }
        }
    }
    out
}

/// The HTTP code of a denial's reason (`reasonToCode`).
fn code_of(reason: &str) -> u16 {
    match reason {
        "Forbidden" => 403,
        "Unauthorized" => 401,
        "RequestEntityTooLarge" => 413,
        _ => 422,
    }
}

/// Runs every binding whose policy exists and matches the request. Policies are taken in name
/// order, each policy's bindings in name order. A failure under a binding with `Deny` refuses
/// the request with the first such failure (`admission.NewForbidden` with the reason and code
/// of the validation, Invalid 422 by default, and the message again as the one cause); under
/// `Warn` it becomes a warning (returned, for `Warning` headers); `Audit` records nothing
/// here (there is no audit log).
pub fn admit(store: &Store, a: &Attempt) -> Result<Vec<String>, ApiError> {
    let (bindings, _) = store.list(BINDINGS, None, None, 0, |_| true);
    if bindings.is_empty() {
        return Ok(Vec::new());
    }
    let (policies, _) = store.list(POLICIES, None, None, 0, |_| true);
    let ns_labels = a.namespace_labels(store);
    let mut env: Option<Bindings> = None;
    let mut warnings = Vec::new();
    for policy in &policies {
        let policy_name = policy["metadata"]["name"].as_str().unwrap_or("");
        if !matches(&policy["spec"]["matchConstraints"], a, &ns_labels) {
            continue;
        }
        for binding in bindings
            .iter()
            .filter(|b| b["spec"]["policyName"].as_str() == Some(policy_name))
        {
            let spec = &binding["spec"];
            if !spec["matchResources"].is_null() && !matches(&spec["matchResources"], a, &ns_labels)
            {
                continue;
            }
            let env = env.get_or_insert_with(|| variables(store, a));
            let found = failures(policy, env);
            let Some(first) = found.first() else {
                continue;
            };
            let binding_name = binding["metadata"]["name"].as_str().unwrap_or("");
            let actions = strings(&spec["validationActions"]);
            if actions.contains(&"Warn") {
                warnings.extend(found.iter().map(|f| {
                    format!(
                        "Validation failed for ValidatingAdmissionPolicy '{policy_name}' with binding '{binding_name}': {}",
                        f.message
                    )
                }));
            }
            if actions.contains(&"Deny") {
                return Err(denial(a, policy_name, binding_name, first));
            }
        }
    }
    Ok(warnings)
}

/// The variables of the request's expressions.
fn variables(store: &Store, a: &Attempt) -> Bindings {
    let namespace_object = if a.def.namespaced && !a.namespace.is_empty() {
        store
            .get("namespaces", "", a.namespace)
            .map_or(Value::Null, |n| {
                let mut n = (*n).clone();
                n["apiVersion"] = json!("v1");
                n["kind"] = json!("Namespace");
                n
            })
    } else {
        Value::Null
    };
    vec![
        ("object".to_string(), cel::from_json(&a.typed(a.object))),
        ("oldObject".to_string(), cel::from_json(&a.typed(a.old))),
        ("request".to_string(), cel::from_json(&a.request())),
        (
            "namespaceObject".to_string(),
            cel::from_json(&namespace_object),
        ),
    ]
}

/// The refusal (`admission.NewForbidden`, then the dispatcher's reason, code and cause).
fn denial(a: &Attempt, policy: &str, binding: &str, f: &Failure) -> ApiError {
    let message = format!(
        "ValidatingAdmissionPolicy '{policy}' with binding '{binding}' denied request: {}",
        f.message
    );
    let name = if a.name.is_empty() { "Unknown" } else { a.name };
    let details = Details {
        name: name.to_string(),
        group: a.def.group.clone(),
        kind: a.def.plural.clone(),
        causes: vec![Cause {
            reason: String::new(),
            message: message.clone(),
            field: String::new(),
        }],
        ..Details::default()
    };
    let reason = f.reason.clone().unwrap_or_else(|| "Invalid".to_string());
    ApiError::Admission {
        code: code_of(&reason),
        reason,
        message: format!("{} {name:?} is forbidden: {message}", a.def.key()),
        details,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::builtins;

    fn pods() -> ResourceDef {
        builtins().into_iter().next().expect("pods")
    }

    fn attempt<'a>(def: &'a ResourceDef, op: &'static str, sub: Option<&'a str>) -> Attempt<'a> {
        Attempt {
            operation: op,
            def,
            version: "v1",
            subresource: sub,
            namespace: "ns",
            name: "p",
            object: None,
            old: None,
            user: "op",
        }
    }

    #[test]
    fn resource_rules_match_subresources_only_when_named() {
        let def = pods();
        let rule = |res: &[&str]| json!({"apiGroups": [""], "apiVersions": ["v1"], "operations": ["*"], "resources": res});
        let main = attempt(&def, "UPDATE", None);
        let status = attempt(&def, "UPDATE", Some("status"));
        assert!(rule_matches(&rule(&["pods"]), &main, true));
        assert!(!rule_matches(&rule(&["pods"]), &status, true));
        assert!(rule_matches(&rule(&["pods/status"]), &status, true));
        assert!(rule_matches(&rule(&["pods/*"]), &status, true));
        assert!(rule_matches(&rule(&["*"]), &main, true));
        assert!(!rule_matches(&rule(&["*"]), &status, true));
        assert!(rule_matches(&rule(&["*/*"]), &status, true));
        assert!(rule_matches(&rule(&["*/status"]), &status, true));
        let create_only = json!({"apiGroups": ["*"], "apiVersions": ["*"],
            "operations": ["CREATE"], "resources": ["pods"], "scope": "Cluster"});
        assert!(!rule_matches(
            &create_only,
            &attempt(&def, "CREATE", None),
            true
        ));
    }

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

    #[test]
    fn failures_take_message_expression_then_message_then_the_expression() {
        let policy = |v: Value, failure: &str| json!({"spec": {"failurePolicy": failure, "validations": [v]}});
        let mut env: Bindings = vec![(
            "object".into(),
            cel::from_json(&json!({"metadata": {"name": "p"}})),
        )];
        let f = failures(
            &policy(
                json!({"expression": "false", "message": "m", "messageExpression": "'from ' + 'x'"}),
                "Fail",
            ),
            &mut env,
        );
        assert_eq!(
            f[0].message, "m",
            "a messageExpression that fails falls back"
        );
        let f = failures(
            &policy(
                json!({"expression": "false", "message": "m", "messageExpression": "object.metadata.name"}),
                "Fail",
            ),
            &mut env,
        );
        assert_eq!(f[0].message, "p");
        let f = failures(&policy(json!({"expression": " false "}), "Fail"), &mut env);
        assert_eq!(f[0].message, "failed expression: false");
        let broken = json!({"expression": "object.spec.x == 1", "reason": "Forbidden"});
        let f = failures(&policy(broken.clone(), "Fail"), &mut env);
        assert_eq!(
            (f[0].message.as_str(), f[0].reason.as_deref()),
            (
                "expression 'object.spec.x == 1' resulted in error: no such key: spec",
                None
            )
        );
        assert!(failures(&policy(broken, "Ignore"), &mut env).is_empty());
    }
}
