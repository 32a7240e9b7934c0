//! Validation as kube-apiserver does it on what clients send: names, labels, owner
//! references, pods, and custom resources against their CRD's `openAPIV3Schema` (the kinds of
//! `inert.rs` have their rules there).
//!
//! Messages are apimachinery's, so clients that match on them behave the same here and there.

use crate::inert;
use crate::names::{
    dns1035_errors, label_errors, label_value_errors, path_segment_errors, qualified_name_errors,
    quote, subdomain_errors,
};
use crate::podspec::validate_pod_spec;
use crate::resources::{Class, ResourceDef};
use crate::status::Cause;
use serde_json::{Map, Value};

const POD_UPDATE_MSG: &str = "pod updates may not change fields other than `spec.containers[*].image`, `spec.initContainers[*].image`, `spec.activeDeadlineSeconds`, `spec.tolerations` (only additions to existing tolerations) or `spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)";

/// Checks `metadata`: name, labels, annotations, ownerReferences.
pub fn validate_metadata(def: &ResourceDef, meta: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    let name = meta["name"].as_str().unwrap_or("");
    if name.is_empty() {
        causes.push(Cause::required(
            "metadata.name",
            "name or generateName is required",
        ));
    } else {
        // Each kind's `ValidateXName`: most names are DNS subdomains.
        let errs = match def.class {
            Class::Namespace => label_errors(name),
            Class::Service => dns1035_errors(name),
            Class::RbacRole | Class::RbacBinding => path_segment_errors(name),
            _ => subdomain_errors(name),
        };
        for e in errs {
            causes.push(Cause::invalid("metadata.name", &quote(name), &e));
        }
    }
    if let Some(labels) = meta["labels"].as_object() {
        for (k, v) in labels {
            for e in qualified_name_errors(k) {
                causes.push(Cause::invalid("metadata.labels", &quote(k), &e));
            }
            match v.as_str() {
                Some(s) => {
                    for e in label_value_errors(s) {
                        causes.push(Cause::invalid("metadata.labels", &quote(s), &e));
                    }
                }
                None => causes.push(Cause::invalid(
                    "metadata.labels",
                    &v.to_string(),
                    "must be a string",
                )),
            }
        }
    }
    if let Some(annotations) = meta["annotations"].as_object() {
        let mut total = 0;
        for (k, v) in annotations {
            for e in qualified_name_errors(&k.to_lowercase()) {
                causes.push(Cause::invalid("metadata.annotations", &quote(k), &e));
            }
            total += k.len() + v.as_str().map_or(0, str::len);
        }
        if total > 256 * 1024 {
            // `field.TooLong`: what `kubectl apply` of a CRD over 256 KiB meets, its
            // last-applied annotation holding the whole CRD.
            causes.push(Cause::too_long(
                "metadata.annotations",
                "must have at most 262144 bytes",
            ));
        }
    }
    if let Some(refs) = meta["ownerReferences"].as_array() {
        let mut controllers = Vec::new();
        for r in refs {
            for (field, what) in [
                ("apiVersion", "version"),
                ("kind", "kind"),
                ("name", "name"),
                ("uid", "uid"),
            ] {
                let v = r[field].as_str().unwrap_or("");
                if v.is_empty() {
                    causes.push(Cause::invalid(
                        &format!("metadata.ownerReferences.{field}"),
                        "\"\"",
                        &format!("{what} must not be empty"),
                    ));
                }
            }
            if r["controller"].as_bool() == Some(true) {
                controllers.push(r["name"].as_str().unwrap_or("").to_string());
            }
        }
        if controllers.len() > 1 {
            causes.push(Cause::invalid(
                "metadata.ownerReferences",
                &Value::Array(refs.clone()).to_string(),
                &format!(
                    "Only one reference can have Controller set to true. Found \"true\" in references for {}",
                    controllers.join(" and ")
                ),
            ));
        }
    }
    causes
}

/// Checks the kind-specific part of an object about to be stored (`version` picks the CRD
/// schema for custom resources).
pub fn validate_object(def: &ResourceDef, obj: &Value, version: &str) -> Vec<Cause> {
    match def.class {
        Class::Pod => validate_pod(obj),
        Class::Custom => match def.schema(version) {
            Some(schema) => {
                let mut causes = Vec::new();
                if let (Some(props), Some(map)) =
                    (schema["properties"].as_object(), obj.as_object())
                {
                    for req in required_of(schema) {
                        if map.get(req).is_none_or(Value::is_null) {
                            causes.push(Cause::required(req, ""));
                        }
                    }
                    for (k, v) in map {
                        if k == "metadata" || k == "apiVersion" || k == "kind" {
                            continue;
                        }
                        if let Some(s) = props.get(k) {
                            schema_walk(s, v, k, &mut causes);
                        }
                    }
                }
                // The root's rules see the whole object, metadata included (the
                // `*-cel-rule-rejects-long-name` fixture), and without a fieldPath name no
                // field: `<nil>`.
                if causes.is_empty() {
                    crate::cel::rule_causes(schema, obj, "<nil>", &mut causes);
                }
                causes
            }
            None => Vec::new(),
        },
        Class::Event => {
            // core/v1 events of a namespaced object live in that object's namespace.
            let involved = obj["involvedObject"]["namespace"].as_str().unwrap_or("");
            let ns = obj["metadata"]["namespace"].as_str().unwrap_or("");
            if !involved.is_empty() && involved != ns {
                vec![Cause::invalid(
                    "involvedObject.namespace",
                    &quote(involved),
                    "does not match event.namespace",
                )]
            } else {
                Vec::new()
            }
        }
        Class::AdmissionPolicy => crate::policy::validate_policy(obj),
        Class::AdmissionPolicyBinding => crate::policy::validate_binding(obj),
        Class::Service => inert::validate_service(obj),
        Class::Deployment => inert::validate_deployment(obj),
        Class::NetworkPolicy => inert::validate_network_policy(obj),
        Class::RbacRole => inert::validate_role(obj, def.namespaced),
        Class::RbacBinding => inert::validate_binding(obj, def.namespaced),
        Class::Namespace
        | Class::Node
        | Class::ResourceQuota
        | Class::Lease
        | Class::Crd
        | Class::ServiceAccount => Vec::new(),
    }
}

/// What an update may not change, beyond what [`validate_object`] checks of any object: a pod's
/// spec but for a few fields, a Deployment's selector, a binding's `roleRef`.
pub fn validate_update(def: &ResourceDef, old: &Value, new: &Value) -> Vec<Cause> {
    match def.class {
        Class::Pod => validate_pod_update(old, new),
        Class::Deployment => inert::validate_deployment_update(old, new),
        Class::RbacBinding => inert::validate_binding_update(old, new),
        _ => Vec::new(),
    }
}

fn validate_pod(obj: &Value) -> Vec<Cause> {
    validate_pod_spec(&obj["spec"], "spec")
}

/// Pod spec is immutable but for images, `activeDeadlineSeconds` and added tolerations.
fn validate_pod_update(old: &Value, new: &Value) -> Vec<Cause> {
    let mut a = old["spec"].clone();
    let mut b = new["spec"].clone();
    for list in ["containers", "initContainers"] {
        // `get_mut`, not `[]`: indexing a Value mutably inserts a null for a missing key.
        if let (Some(ac), Some(bc)) = (
            a.get_mut(list).and_then(Value::as_array_mut),
            b.get(list).and_then(Value::as_array),
        ) {
            for (x, y) in ac.iter_mut().zip(bc.iter()) {
                if x.is_object() {
                    x["image"] = y["image"].clone();
                }
            }
        }
    }
    let old_tolerations = a["tolerations"].as_array().cloned().unwrap_or_default();
    let new_tolerations = b["tolerations"].as_array().cloned().unwrap_or_default();
    let tolerations_ok = old_tolerations.iter().all(|t| new_tolerations.contains(t));
    for spec in [&mut a, &mut b] {
        if let Some(m) = spec.as_object_mut() {
            m.remove("activeDeadlineSeconds");
            m.remove("tolerations");
        }
    }
    if a != b || !tolerations_ok {
        vec![Cause::forbidden("spec", POD_UPDATE_MSG)]
    } else {
        Vec::new()
    }
}

fn required_of(schema: &Value) -> Vec<&str> {
    schema["required"]
        .as_array()
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// The Go type name kube-openapi reports for a JSON value.
fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn type_matches(want: &str, v: &Value) -> bool {
    match want {
        "" => true,
        "number" => v.is_number(),
        "integer" => v.is_i64() || v.is_u64(),
        "string" => v.is_string(),
        "boolean" => v.is_boolean(),
        "object" => v.is_object(),
        "array" => v.is_array(),
        _ => true,
    }
}

/// Walks `value` against `schema` (type, required, minLength, maxLength, minimum, maximum,
/// enum, items, properties, map-list keys, and the CEL subset of `cel` in
/// `x-kubernetes-validations`), the subset our CRDs use, with kube-openapi's messages. A node's
/// rules are evaluated once its schema holds (kube-apiserver skips CEL after blocking errors).
pub fn schema_walk(schema: &Value, value: &Value, path: &str, causes: &mut Vec<Cause>) {
    let before = causes.len();
    schema_walk_node(schema, value, path, causes);
    if causes.len() == before {
        crate::cel::rule_causes(schema, value, path, causes);
    }
}

fn schema_walk_node(schema: &Value, value: &Value, path: &str, causes: &mut Vec<Cause>) {
    let want = schema["type"].as_str().unwrap_or("");
    if value.is_null() && schema["nullable"].as_bool() == Some(true) {
        return;
    }
    if !type_matches(want, value) {
        let got = type_name(value);
        causes.push(Cause::invalid(
            path,
            &quote(got),
            &format!("{path} in body must be of type {want}: {}", quote(got)),
        ));
        return;
    }
    if let Value::String(s) = value {
        let len = s.chars().count() as u64;
        if let Some(min) = schema["minLength"].as_u64() {
            if len < min {
                if s.is_empty() {
                    // kube-apiserver reports an empty string under minLength twice, once as a
                    // null of the wrong type (fixture 07): mirror it so clients see the same.
                    causes.push(Cause::invalid(
                        path,
                        "\"null\"",
                        &format!("{path} in body must be of type {want}: \"null\""),
                    ));
                }
                causes.push(Cause::invalid(
                    path,
                    &quote(s),
                    &format!("{path} in body should be at least {min} chars long"),
                ));
            }
        }
        if let Some(max) = schema["maxLength"].as_u64() {
            if len > max {
                causes.push(Cause::invalid(
                    path,
                    &quote(s),
                    &format!("{path} in body should be at most {max} chars long"),
                ));
            }
        }
        // A pattern outside the matcher's RE2 subset is not checked (see the README).
        let pattern = schema["pattern"].as_str();
        if let Some((p, re)) = pattern.and_then(|p| Some((p, crate::regex::Regex::new(p).ok()?))) {
            if !re.is_match(s) {
                causes.push(Cause::invalid(
                    path,
                    &quote(s),
                    &format!("{path} in body should match '{p}'"),
                ));
            }
        }
    }
    if let Some(n) = value.as_f64() {
        if let Some(min) = schema["minimum"].as_f64() {
            if n < min {
                causes.push(Cause::invalid(
                    path,
                    &value.to_string(),
                    &format!(
                        "{path} in body should be greater than or equal to {}",
                        schema["minimum"]
                    ),
                ));
            }
        }
        if let Some(max) = schema["maximum"].as_f64() {
            if n > max {
                causes.push(Cause::invalid(
                    path,
                    &value.to_string(),
                    &format!(
                        "{path} in body should be less than or equal to {}",
                        schema["maximum"]
                    ),
                ));
            }
        }
    }
    if let Some(allowed) = schema["enum"].as_array() {
        if !allowed.contains(value) {
            let list: Vec<String> = allowed.iter().map(Value::to_string).collect();
            causes.push(Cause::not_supported(
                path,
                &value.to_string(),
                &list.join(", "),
            ));
        }
    }
    match value {
        Value::Object(map) => {
            for req in required_of(schema) {
                if map.get(req).is_none_or(Value::is_null) {
                    causes.push(Cause::required(&format!("{path}.{req}"), ""));
                }
            }
            if let Some(props) = schema["properties"].as_object() {
                for (k, v) in map {
                    if let Some(s) = props.get(k) {
                        schema_walk(s, v, &format!("{path}.{k}"), causes);
                    }
                }
            }
            if let Some(s) = schema.get("additionalProperties").filter(|s| s.is_object()) {
                for (k, v) in map {
                    schema_walk(s, v, &format!("{path}.{k}"), causes);
                }
            }
        }
        Value::Array(items) => {
            if let Some(s) = schema.get("items") {
                for (i, v) in items.iter().enumerate() {
                    schema_walk(s, v, &format!("{path}[{i}]"), causes);
                }
            }
            if schema["x-kubernetes-list-type"] == "map" {
                let keys: Vec<&str> = schema["x-kubernetes-list-map-keys"]
                    .as_array()
                    .map(|k| k.iter().filter_map(Value::as_str).collect())
                    .unwrap_or_default();
                let mut seen: Vec<Map<String, Value>> = Vec::new();
                for (i, v) in items.iter().enumerate() {
                    let key: Map<String, Value> = keys
                        .iter()
                        .map(|k| (k.to_string(), v[*k].clone()))
                        .collect();
                    if seen.contains(&key) {
                        causes.push(Cause::duplicate(&format!("{path}[{i}]"), &go_map(&key)));
                    } else {
                        seen.push(key);
                    }
                }
            }
        }
        _ => {}
    }
}

/// A list-map item's keys as kube-apiserver prints them in a duplicate's message, Go's `%#v`
/// of a `map[string]interface {}` (keys in order): `map[string]interface {}{"name":"side"}`
/// (fixture 47); a key the item leaves out is not in it.
fn go_map(keys: &Map<String, Value>) -> String {
    let entries: Vec<String> = keys
        .iter()
        .filter(|(_, v)| !v.is_null())
        .map(|(k, v)| format!("{k:?}:{v}"))
        .collect();
    format!("map[string]interface {{}}{{{}}}", entries.join(", "))
}

/// Drops fields the schema does not know, as structural-schema pruning does on every write
/// to a custom resource; `metadata`, `apiVersion` and `kind` at the root (`path` "") are
/// never pruned. The dropped fields' paths are added to `removed` (for
/// `fieldValidation=Strict`).
pub fn prune(schema: &Value, value: &mut Value, path: &str, removed: &mut Vec<String>) {
    if schema["x-kubernetes-preserve-unknown-fields"].as_bool() == Some(true) {
        return;
    }
    let root = path.is_empty();
    let child = |k: &str| {
        if root {
            k.to_string()
        } else {
            format!("{path}.{k}")
        }
    };
    match value {
        Value::Object(map) => {
            let props = schema["properties"].as_object();
            let additional = schema
                .get("additionalProperties")
                .filter(|s| s.is_object() || s.as_bool() == Some(true));
            map.retain(|k, _| {
                let keep = (root && (k == "metadata" || k == "apiVersion" || k == "kind"))
                    || props.is_some_and(|p| p.contains_key(k))
                    || additional.is_some();
                if !keep {
                    removed.push(child(k));
                }
                keep
            });
            for (k, v) in map.iter_mut() {
                if root && k == "metadata" {
                    continue;
                }
                if let Some(s) = props.and_then(|p| p.get(k)) {
                    prune(s, v, &child(k), removed);
                } else if let Some(s) = additional.filter(|s| s.is_object()) {
                    prune(s, v, &child(k), removed);
                }
            }
        }
        Value::Array(items) => {
            if let Some(s) = schema.get("items") {
                for (i, v) in items.iter_mut().enumerate() {
                    prune(s, v, &format!("{path}[{i}]"), removed);
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ic_schema() -> Value {
        let crd: Value =
            serde_yaml::from_str(include_str!("../../config/crd/immortalcontainers.yaml"))
                .expect("crd yaml");
        crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone()
    }

    #[test]
    fn empty_image_gives_both_causes_of_fixture_07() {
        let schema = ic_schema();
        let mut causes = Vec::new();
        schema_walk(
            &schema["properties"]["spec"],
            &json!({"image": ""}),
            "spec",
            &mut causes,
        );
        assert_eq!(causes.len(), 2);
        assert_eq!(
            causes[0].message,
            "Invalid value: \"null\": spec.image in body must be of type string: \"null\""
        );
        assert_eq!(
            causes[1].message,
            "Invalid value: \"\": spec.image in body should be at least 1 chars long"
        );
    }

    #[test]
    fn missing_image_is_required() {
        let schema = ic_schema();
        let mut causes = Vec::new();
        schema_walk(
            &schema["properties"]["spec"],
            &json!({}),
            "spec",
            &mut causes,
        );
        assert_eq!(causes, vec![Cause::required("spec.image", "")]);
    }

    #[test]
    fn status_enum_minimum_and_map_list_keys_are_checked() {
        let schema = ic_schema();
        let status = json!({"startTimes": -1, "conditions": [
            {"type": "Ready", "status": "Maybe", "lastTransitionTime": "t", "reason": "r", "message": "m"},
            {"type": "Ready", "status": "True", "lastTransitionTime": "t", "reason": "r", "message": "m"}]});
        let mut causes = Vec::new();
        schema_walk(
            &schema["properties"]["status"],
            &status,
            "status",
            &mut causes,
        );
        let mut reasons: Vec<&str> = causes.iter().map(|c| c.reason.as_str()).collect();
        reasons.sort();
        assert_eq!(
            reasons,
            vec![
                "FieldValueDuplicate",
                "FieldValueInvalid",
                "FieldValueNotSupported"
            ]
        );
    }

    #[test]
    fn unknown_fields_are_pruned_but_metadata_kept() {
        let schema = ic_schema();
        let mut v = json!({"metadata": {"name": "x", "whatever": 1}, "spec": {"image": "a", "extra": 1}, "junk": true});
        let mut removed = Vec::new();
        prune(&schema, &mut v, "", &mut removed);
        assert_eq!(
            v,
            json!({"metadata": {"name": "x", "whatever": 1}, "spec": {"image": "a"}})
        );
        assert_eq!(removed, vec!["junk".to_string(), "spec.extra".to_string()]);
    }

    #[test]
    fn pod_update_may_change_image_only() {
        let old = json!({"spec": {"containers": [{"name": "c", "image": "a"}], "restartPolicy": "Always"}});
        let img = json!({"spec": {"containers": [{"name": "c", "image": "b"}], "restartPolicy": "Always"}});
        let other = json!({"spec": {"containers": [{"name": "c", "image": "a"}], "restartPolicy": "Never"}});
        assert!(validate_pod_update(&old, &img).is_empty());
        assert_eq!(validate_pod_update(&old, &other).len(), 1);
    }

    #[test]
    fn strings_are_checked_against_their_pattern() {
        let schema = json!({"type": "object", "properties": {"memory": {
            "anyOf": [{"type": "integer"}, {"type": "string"}], "x-kubernetes-int-or-string": true,
            "pattern": "^(\\+|-)?(([0-9]+(\\.[0-9]*)?)|(\\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\\+|-)?(([0-9]+(\\.[0-9]*)?)|(\\.[0-9]+))))?$"}}});
        let mut causes = Vec::new();
        schema_walk(&schema, &json!({"memory": "128Mi"}), "limits", &mut causes);
        schema_walk(&schema, &json!({"memory": 1}), "limits", &mut causes);
        assert!(causes.is_empty(), "{causes:?}");
        schema_walk(&schema, &json!({"memory": "lots"}), "limits", &mut causes);
        assert_eq!(causes.len(), 1);
        assert_eq!(causes[0].field, "limits.memory");
        assert!(causes[0]
            .message
            .starts_with("Invalid value: \"lots\": limits.memory in body should match '^(\\+|-)?"));
    }

    #[test]
    fn annotations_over_256_kib_are_too_long() {
        let defs = crate::resources::builtins();
        let meta = json!({"name": "p", "annotations": {"big": "x".repeat(256 * 1024)}});
        let causes = validate_metadata(&defs[0], &meta);
        assert_eq!(
            causes,
            vec![Cause::too_long(
                "metadata.annotations",
                "must have at most 262144 bytes"
            )]
        );
        assert_eq!(
            causes[0].message,
            "Too long: must have at most 262144 bytes"
        );
        assert_eq!(causes[0].reason, "FieldValueTooLong");
    }

    #[test]
    fn two_controller_owner_references_are_invalid() {
        let defs = crate::resources::builtins();
        let meta = json!({"name": "p", "ownerReferences": [
            {"apiVersion": "v1", "kind": "K", "name": "a", "uid": "1", "controller": true},
            {"apiVersion": "v1", "kind": "K", "name": "b", "uid": "2", "controller": true}]});
        let causes = validate_metadata(&defs[0], &meta);
        assert_eq!(causes.len(), 1);
        assert_eq!(causes[0].field, "metadata.ownerReferences");
    }
}
