//! The structural-schema rules apiextensions enforces on a CRD's `openAPIV3Schema`, the ones a
//! CRD author (or a generator) can plausibly break, with the real server's fields and messages
//! (tests/fixtures/kube-1.28-kubelet/27 and 29-45).
//!
//! Checked: a type on every node (but int-or-string and preserve-unknown-fields ones); no
//! `additionalProperties` beside `properties`; `items` on every array; nothing said of the
//! root's `metadata` but `name` and `generateName`; `x-kubernetes-preserve-unknown-fields` only
//! `true`; list types (`atomic`, `set` of scalars, `map` of objects with keys that are required
//! or defaulted). Not checked: embedded resources, value validations under `allOf`/`anyOf`/
//! `oneOf`/`not`, defaults against the schema, formats and CEL cost (beyond `cel.rs`).

use crate::status::Cause;
use serde_json::Value;

/// Every structural problem of `schema`, the root's field path being `root`
/// (`spec.validation.openAPIV3Schema`).
pub fn check(schema: &Value, root: &str, causes: &mut Vec<Cause>) {
    if schema["type"].as_str().unwrap_or("").is_empty() {
        causes.push(Cause::required(
            &format!("{root}.type"),
            "must not be empty at the root",
        ));
    }
    if let Some(metadata) = schema["properties"].get("metadata") {
        if !only_names(metadata) {
            causes.push(Cause::forbidden(
                &format!("{root}.properties[metadata]"),
                "must not specify anything other than name and generateName, but metadata is implicitly specified",
            ));
        }
    }
    node(schema, root, None, causes);
}

/// `metadata` says no more than `type: object` and the schemas of `name` and `generateName`.
fn only_names(metadata: &Value) -> bool {
    let Some(o) = metadata.as_object() else {
        return false;
    };
    o.iter().all(|(k, v)| match k.as_str() {
        "type" => v == "object",
        "properties" => v
            .as_object()
            .is_some_and(|p| p.keys().all(|k| k == "name" || k == "generateName")),
        _ => false,
    })
}

/// Where a node sits, for the message of a missing type.
#[derive(Clone, Copy)]
enum Under {
    Field,
    Items,
}

fn node(s: &Value, at: &str, under: Option<Under>, causes: &mut Vec<Cause>) {
    let Some(o) = s.as_object() else {
        return;
    };
    let ty = o.get("type").and_then(Value::as_str).unwrap_or("");
    let untyped_ok = o.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true))
        || o.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true));
    if let Some(under) = under.filter(|_| ty.is_empty() && !untyped_ok) {
        let what = match under {
            Under::Field => "must not be empty for specified object fields",
            Under::Items => "must not be empty for specified array items",
        };
        causes.push(Cause::required(&format!("{at}.type"), what));
    }
    if let Some(p) = o.get("x-kubernetes-preserve-unknown-fields") {
        if p != &Value::Bool(true) {
            causes.push(Cause::invalid(
                &format!("{at}.x-kubernetes-preserve-unknown-fields"),
                &p.to_string(),
                "must be true or undefined",
            ));
        }
    }
    if o.contains_key("properties") && o.contains_key("additionalProperties") {
        causes.push(Cause::forbidden(
            &format!("{at}.additionalProperties"),
            "additionalProperties and properties are mutual exclusive",
        ));
    }
    if ty == "array" && !o.contains_key("items") {
        causes.push(Cause::required(&format!("{at}.items"), "must be specified"));
    }
    list_type(o, at, causes);
    for (name, child) in o
        .get("properties")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
    {
        node(
            child,
            &format!("{at}.properties[{name}]"),
            Some(Under::Field),
            causes,
        );
    }
    if let Some(child) = o.get("additionalProperties").filter(|v| v.is_object()) {
        node(
            child,
            &format!("{at}.additionalProperties"),
            Some(Under::Field),
            causes,
        );
    }
    if let Some(child) = o.get("items").filter(|v| v.is_object()) {
        node(child, &format!("{at}.items"), Some(Under::Items), causes);
    }
}

/// `x-kubernetes-list-type` and `x-kubernetes-list-map-keys` of an array node.
fn list_type(o: &serde_json::Map<String, Value>, at: &str, causes: &mut Vec<Cause>) {
    let list_type = o.get("x-kubernetes-list-type").and_then(Value::as_str);
    let keys: Vec<&str> = o
        .get("x-kubernetes-list-map-keys")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let items = o.get("items").unwrap_or(&Value::Null);
    let item_type = items["type"].as_str().unwrap_or("");
    match list_type {
        None | Some("atomic") => {}
        Some("set") => {
            if item_type == "object" || item_type == "array" {
                causes.push(Cause::invalid(
                    &format!("{at}.items.x-kubernetes-map-type"),
                    "\"null\"",
                    "must be atomic as item of a list with x-kubernetes-list-type=set",
                ));
            }
        }
        Some("map") => {
            if keys.is_empty() {
                causes.push(Cause::required(
                    &format!("{at}.x-kubernetes-list-map-keys"),
                    "must not be empty if x-kubernetes-list-type is map",
                ));
            }
            if item_type != "object" {
                causes.push(Cause::invalid(
                    &format!("{at}.items.type"),
                    &format!("{item_type:?}"),
                    "must be object if parent array's x-kubernetes-list-type is map",
                ));
            } else {
                for k in &keys {
                    let required = items["required"]
                        .as_array()
                        .is_some_and(|r| r.iter().any(|r| r == k));
                    if !required && items["properties"][k].get("default").is_none() {
                        causes.push(Cause::required(
                            &format!("{at}.items.properties[{k}].default"),
                            "this property is in x-kubernetes-list-map-keys, so it must have a default or be a required property",
                        ));
                    }
                }
            }
        }
        Some(other) => causes.push(Cause::not_supported(
            &format!("{at}.x-kubernetes-list-type"),
            &format!("{other:?}"),
            "\"atomic\", \"set\", \"map\"",
        )),
    }
    if !keys.is_empty() && list_type != Some("map") {
        causes.push(Cause::required(
            &format!("{at}.x-kubernetes-list-type"),
            "must be map if x-kubernetes-list-map-keys is non-empty",
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn fields(schema: Value) -> Vec<String> {
        let mut causes = Vec::new();
        check(&schema, "s", &mut causes);
        causes
            .into_iter()
            .map(|c| format!("{}: {}", c.field, c.message))
            .collect()
    }

    #[test]
    fn the_projects_crd_is_structural() {
        let crd: Value =
            serde_yaml::from_str(include_str!("../../config/crd/immortalcontainers.yaml")).unwrap();
        let schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
        assert_eq!(fields(schema.clone()), Vec::<String>::new());
    }

    #[test]
    fn a_nested_metadata_may_say_anything_and_the_roots_only_name_and_generate_name() {
        let nested = json!({"type": "object", "properties": {
            "metadata": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 9}}},
            "spec": {"type": "object", "properties": {"metadata": {"type": "object",
                "description": "fine", "properties": {"labels": {"type": "object",
                    "additionalProperties": {"type": "string"}}}}}}}});
        assert_eq!(fields(nested), Vec::<String>::new());
        let described = json!({"type": "object", "properties": {
            "metadata": {"type": "object", "description": "refused"}}});
        assert_eq!(
            fields(described),
            ["s.properties[metadata]: Forbidden: must not specify anything other than name and generateName, but metadata is implicitly specified"]
        );
    }

    #[test]
    fn int_or_string_and_preserved_nodes_need_no_type_and_a_type_does_not_hurt() {
        let s = json!({"type": "object", "properties": {
            "a": {"x-kubernetes-int-or-string": true},
            "b": {"type": "string", "x-kubernetes-int-or-string": true},
            "c": {"x-kubernetes-preserve-unknown-fields": true}}});
        assert_eq!(fields(s), Vec::<String>::new());
    }
}
