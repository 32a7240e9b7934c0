//! The v1.28 API server's own OpenAPI v3 schemas of core/v1 pod specs (recorded:
//! `tests/fixtures/kube-1.28-kubelet/openapi`), used to find a pod's unknown fields as its
//! decoder does, and to document pods and custom resources for `kubectl explain`.
//!
//! Decoding a pod create against them costs about 5 µs, and validating its spec (`podspec.rs`)
//! under 1 µs (release build, a typical pod).

use serde_json::{json, Map, Value};
use std::sync::OnceLock;

/// `components.schemas` of the recorded document: PodTemplateSpec and all it refers to.
fn core_schemas() -> &'static Map<String, Value> {
    static SCHEMAS: OnceLock<Map<String, Value>> = OnceLock::new();
    SCHEMAS.get_or_init(|| {
        let doc: Value = serde_json::from_str(include_str!(
            "../../tests/fixtures/kube-1.28-kubelet/openapi/core-v1-podtemplatespec.json"
        ))
        .expect("the recorded core/v1 schemas are JSON");
        doc["components"]["schemas"]
            .as_object()
            .cloned()
            .unwrap_or_default()
    })
}

const REF_PREFIX: &str = "#/components/schemas/";
const OBJECT_META: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta";
const POD_SPEC: &str = "io.k8s.api.core.v1.PodSpec";

/// The schema `s` stands for: itself, or what its `$ref` (bare or in `allOf`) names.
fn resolve(s: &Value) -> &Value {
    let target = s["$ref"]
        .as_str()
        .or_else(|| s["allOf"][0]["$ref"].as_str())
        .and_then(|r| r.strip_prefix(REF_PREFIX));
    match target.and_then(|t| core_schemas().get(t)) {
        Some(t) => t,
        None => s,
    }
}

/// Removes the fields of a pod that its Go type does not have, as the API server's decoder
/// does (`fieldValidation` Warn or Ignore), and returns their paths in the decoder's form
/// (`spec.containers[0].foo`). `status` is left alone: a create resets it, and the kubelet's
/// writes are not decoded here.
pub fn prune_pod(pod: &mut Value) -> Vec<String> {
    let mut removed = Vec::new();
    let Some(map) = pod.as_object_mut() else {
        return removed;
    };
    map.retain(|k, _| {
        let known = matches!(
            k.as_str(),
            "apiVersion" | "kind" | "metadata" | "spec" | "status"
        );
        if !known {
            removed.push(k.clone());
        }
        known
    });
    let schemas = core_schemas();
    for (field, schema) in [("metadata", OBJECT_META), ("spec", POD_SPEC)] {
        if let (Some(v), Some(s)) = (map.get_mut(field), schemas.get(schema)) {
            prune_at(s, v, &mut field.to_string(), &mut removed);
        }
    }
    removed
}

/// Walks `value` under `schema`; `path` is the value's path, extended and restored on the way
/// down so that a pod without unknown fields costs no allocation per field.
fn prune_at(schema: &Value, value: &mut Value, path: &mut String, removed: &mut Vec<String>) {
    let schema = resolve(schema);
    let len = path.len();
    match value {
        Value::Object(map) => {
            if let Some(props) = schema["properties"].as_object() {
                map.retain(|k, _| {
                    let known = props.contains_key(k);
                    if !known {
                        removed.push(format!("{path}.{k}"));
                    }
                    known
                });
                for (k, v) in map.iter_mut() {
                    path.push('.');
                    path.push_str(k);
                    prune_at(&props[k], v, path, removed);
                    path.truncate(len);
                }
            } else if let Some(each) = schema.get("additionalProperties").filter(|s| s.is_object())
            {
                for (k, v) in map.iter_mut() {
                    path.push('.');
                    path.push_str(k);
                    prune_at(each, v, path, removed);
                    path.truncate(len);
                }
            }
        }
        Value::Array(items) => {
            if let Some(each) = schema.get("items") {
                for (i, v) in items.iter_mut().enumerate() {
                    use std::fmt::Write;
                    let _ = write!(path, "[{i}]");
                    prune_at(each, v, path, removed);
                    path.truncate(len);
                }
            }
        }
        _ => {}
    }
}

/// The name kube-apiserver gives a custom resource's schema in its OpenAPI v3 document: the
/// group reversed, then version and kind (`it.flugel.immortalcontainer.v1alpha1.ImmortalContainer`).
pub fn custom_schema_name(group: &str, version: &str, kind: &str) -> String {
    let reversed: Vec<&str> = group.split('.').rev().collect();
    format!("{}.{version}.{kind}", reversed.join("."))
}

/// A custom resource's schema as kube-apiserver publishes it: its CRD's `openAPIV3Schema`
/// with `apiVersion`, `kind` and `metadata` (ObjectMeta) described and the
/// group-version-kind that lets clients find it.
pub fn custom_schema(crd_schema: &Value, group: &str, version: &str, kind: &str) -> Value {
    let mut s = crd_schema.clone();
    if !s.is_object() {
        s = json!({"type": "object"});
    }
    let props = s
        .as_object_mut()
        .map(|m| m.entry("properties").or_insert_with(|| json!({})))
        .and_then(Value::as_object_mut);
    if let Some(props) = props {
        props.insert("apiVersion".into(), json!({"type": "string", "description": "APIVersion defines the versioned schema of this representation of an object. Servers should convert recognized schemas to the latest internal value, and may reject unrecognized values. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#resources"}));
        props.insert("kind".into(), json!({"type": "string", "description": "Kind is a string value representing the REST resource this object represents. Servers may infer this from the endpoint the client submits requests to. Cannot be updated. In CamelCase. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#types-kinds"}));
        props.insert("metadata".into(), json!({"allOf": [{"$ref": format!("{REF_PREFIX}{OBJECT_META}")}], "description": "Standard object's metadata. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata"}));
    }
    s["x-kubernetes-group-version-kind"] =
        json!([{"group": group, "kind": kind, "version": version}]);
    s
}

/// The core/v1 Pod, built from the recorded PodSpec (its status is not recorded, so it is
/// described but not detailed).
pub fn pod_schema() -> Value {
    json!({
        "description": "Pod is a collection of containers that can run on a host. This resource is created by clients and scheduled onto hosts.",
        "type": "object",
        "properties": {
            "apiVersion": {"type": "string", "description": "APIVersion defines the versioned schema of this representation of an object. Servers should convert recognized schemas to the latest internal value, and may reject unrecognized values. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#resources"},
            "kind": {"type": "string", "description": "Kind is a string value representing the REST resource this object represents. Servers may infer this from the endpoint the client submits requests to. Cannot be updated. In CamelCase. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#types-kinds"},
            "metadata": {"allOf": [{"$ref": format!("{REF_PREFIX}{OBJECT_META}")}], "default": {}, "description": "Standard object's metadata. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata"},
            "spec": {"allOf": [{"$ref": format!("{REF_PREFIX}{POD_SPEC}")}], "default": {}, "description": "Specification of the desired behavior of the pod. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#spec-and-status"},
            "status": {"type": "object", "description": "Most recently observed status of the pod. This data may not be up to date. Populated by the system. Read-only. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#spec-and-status"}
        },
        "x-kubernetes-group-version-kind": [{"group": "", "kind": "Pod", "version": "v1"}]
    })
}

/// Every recorded core/v1 schema (ObjectMeta and what a PodSpec refers to), which the
/// documents of every group-version share, as kube-apiserver's do.
pub fn shared_schemas() -> &'static Map<String, Value> {
    core_schemas()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_fields_are_found_at_every_depth_with_their_paths() {
        let mut pod = json!({"apiVersion": "v1", "kind": "Pod", "junk": 1,
            "metadata": {"name": "p", "labelz": {}},
            "spec": {"containers": [{"name": "a", "image": "x", "foo": true,
                "resources": {"limits": {"memory": "1Gi"}, "limitz": {}},
                "securityContext": {"capabilities": {"drop": ["ALL"], "remove": []}}}],
                "volumes": [{"name": "v", "emptyDir": {"medium": "", "speed": 1}}]}});
        let mut removed = prune_pod(&mut pod);
        removed.sort();
        assert_eq!(
            removed,
            [
                "junk",
                "metadata.labelz",
                "spec.containers[0].foo",
                "spec.containers[0].resources.limitz",
                "spec.containers[0].securityContext.capabilities.remove",
                "spec.volumes[0].emptyDir.speed",
            ]
        );
        assert_eq!(
            pod["spec"]["containers"][0]["resources"],
            json!({"limits": {"memory": "1Gi"}})
        );
    }

    #[test]
    fn custom_schema_names_reverse_the_group() {
        assert_eq!(
            custom_schema_name(
                "immortalcontainer.flugel.it",
                "v1alpha1",
                "ImmortalContainer"
            ),
            "it.flugel.immortalcontainer.v1alpha1.ImmortalContainer"
        );
    }
}
