//! Discovery documents (/api, /api/v1, /apis, /apis/GROUP, /apis/GROUP/VERSION) in the
//! legacy shapes of fixtures 01–04, and /version (fixture 02), for what this server serves.

use crate::openapi;
use crate::resources::{Class, ResourceDef};
use serde_json::{json, Value};
use std::sync::Arc;

/// `/version`: a plausible recent release, so kubectl prints no version-skew warning.
pub fn version() -> Value {
    json!({
        "major": "1",
        "minor": "31",
        "gitVersion": "v1.31.0+kube-testserver",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2024-08-13T00:00:00Z",
        "goVersion": "go1.22.5",
        "compiler": "gc",
        "platform": "linux/amd64"
    })
}

/// `/api` (fixture 03).
pub fn core_versions(port: u16) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": format!("127.0.0.1:{port}")}]
    })
}

fn group_entry(group: &str, defs: &[Arc<ResourceDef>]) -> Value {
    let mut versions: Vec<String> = Vec::new();
    for d in defs.iter().filter(|d| d.group == group) {
        for v in &d.versions {
            if !versions.contains(v) {
                versions.push(v.clone());
            }
        }
    }
    let gv = |v: &str| json!({"groupVersion": format!("{group}/{v}"), "version": v});
    json!({
        "name": group,
        "versions": versions.iter().map(|v| gv(v)).collect::<Vec<_>>(),
        "preferredVersion": versions.first().map(|v| gv(v)).unwrap_or(Value::Null),
    })
}

/// Named groups, built-in ones first as the real server lists them.
fn groups(defs: &[Arc<ResourceDef>]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for d in defs.iter().filter(|d| !d.group.is_empty()) {
        if !out.contains(&d.group) {
            out.push(d.group.clone());
        }
    }
    out
}

/// `/apis` (fixture 04).
pub fn group_list(defs: &[Arc<ResourceDef>]) -> Value {
    let entries: Vec<Value> = groups(defs).iter().map(|g| group_entry(g, defs)).collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": entries})
}

/// `/apis/GROUP`, or `None` when nothing is served in it.
pub fn group(name: &str, defs: &[Arc<ResourceDef>]) -> Option<Value> {
    if !defs.iter().any(|d| d.group == name) {
        return None;
    }
    let mut g = group_entry(name, defs);
    g["kind"] = json!("APIGroup");
    g["apiVersion"] = json!("v1");
    Some(g)
}

/// `/api/v1` or `/apis/GROUP/VERSION` (fixture 01), or `None` when nothing is served there.
pub fn resource_list(group: &str, version: &str, defs: &[Arc<ResourceDef>]) -> Option<Value> {
    let mut resources = Vec::new();
    for d in defs
        .iter()
        .filter(|d| d.group == group && d.versions.iter().any(|v| v == version))
    {
        let mut r = json!({
            "name": d.plural,
            "singularName": d.singular,
            "namespaced": d.namespaced,
            "kind": d.kind,
            "verbs": d.verbs(),
        });
        if !d.short_names.is_empty() {
            r["shortNames"] = json!(d.short_names);
        }
        if !d.categories.is_empty() {
            r["categories"] = json!(d.categories);
        }
        resources.push(r);
        if d.class == Class::Pod {
            // How kubectl drain finds the Eviction API: the subresource names its own group
            // and version, as kube-apiserver lists it.
            resources.push(json!({
                "name": "pods/eviction",
                "singularName": "",
                "namespaced": true,
                "group": "policy",
                "version": "v1",
                "kind": "Eviction",
                "verbs": ["create"],
            }));
        }
        if d.class == Class::ServiceAccount {
            // `kubectl create token`'s TokenRequest, of its own group and version.
            resources.push(json!({
                "name": "serviceaccounts/token",
                "singularName": "",
                "namespaced": true,
                "group": "authentication.k8s.io",
                "version": "v1",
                "kind": "TokenRequest",
                "verbs": ["create"],
            }));
        }
        if d.status_subresource {
            resources.push(json!({
                "name": format!("{}/status", d.plural),
                "singularName": "",
                "namespaced": d.namespaced,
                "kind": d.kind,
                "verbs": ["get", "patch", "update"],
            }));
        }
    }
    if resources.is_empty() {
        return None;
    }
    let group_version = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    let mut list =
        json!({"kind": "APIResourceList", "groupVersion": group_version, "resources": resources});
    if !group.is_empty() {
        list["apiVersion"] = json!("v1");
    }
    Some(list)
}

fn gv_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

/// `/openapi/v3`: the group-versions with a document each. A hash of what is served lets
/// clients cache documents until a CRD changes.
pub fn openapi_root(defs: &[Arc<ResourceDef>]) -> Value {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for d in defs {
        (&d.group, &d.versions, &d.plural, &d.kind).hash(&mut h);
        // A CRD's schema edited in place is a new document too (`kubectl explain` caches).
        for v in &d.versions {
            d.schema(v).map(Value::to_string).hash(&mut h);
        }
    }
    let hash = format!("{:016X}", h.finish());
    let mut paths = serde_json::Map::new();
    for d in defs {
        for v in &d.versions {
            let p = gv_path(&d.group, v);
            paths.insert(
                p.clone(),
                json!({"serverRelativeURL": format!("/openapi/v3/{p}?hash={hash}")}),
            );
        }
    }
    json!({"paths": paths})
}

/// `/openapi/v3/api/v1` or `/openapi/v3/apis/GROUP/VERSION`: what kubectl reads to decide on
/// server-side field validation (each resource's PATCH operation with its group-version-kind
/// and the `fieldValidation` parameter), so `kubectl create` and `kubectl apply` validate on
/// the server, and the schemas `kubectl explain` walks: every custom resource's (from its
/// CRD) and the Pod's (recorded from v1.28), with the core/v1 schemas they refer to. Other
/// built-in kinds have none.
pub fn openapi_group_version(
    group: &str,
    version: &str,
    defs: &[Arc<ResourceDef>],
) -> Option<Value> {
    let mut paths = serde_json::Map::new();
    for d in defs
        .iter()
        .filter(|d| d.group == group && d.versions.iter().any(|v| v == version))
    {
        let scope = if d.namespaced {
            "namespaces/{namespace}/"
        } else {
            ""
        };
        let item = format!("/{}/{scope}{}/{{name}}", gv_path(group, version), d.plural);
        paths.insert(
            item,
            json!({
                "parameters": [
                    {"name": "name", "in": "path", "required": true, "schema": {"type": "string", "uniqueItems": true}}
                ],
                "patch": {
                    "operationId": format!("patch{}", d.kind),
                    // kubectl looks for the parameter on the operation itself.
                    "parameters": [
                        {"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": true}}
                    ],
                    "x-kubernetes-action": "patch",
                    "x-kubernetes-group-version-kind": {"group": group, "version": version, "kind": d.kind},
                    "responses": {"200": {"description": "OK"}}
                }
            }),
        );
    }
    if paths.is_empty() {
        return None;
    }
    let mut schemas = openapi::shared_schemas().clone();
    for d in defs
        .iter()
        .filter(|d| d.group == group && d.versions.iter().any(|v| v == version))
    {
        if let Some(s) = d.schema(version).filter(|_| d.is_custom()) {
            schemas.insert(
                openapi::custom_schema_name(group, version, &d.kind),
                openapi::custom_schema(s, group, version, &d.kind),
            );
        } else if d.class == Class::Pod {
            schemas.insert("io.k8s.api.core.v1.Pod".into(), openapi::pod_schema());
        }
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.31.0"},
        "paths": paths,
        "components": {"schemas": schemas}
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::{builtins, from_crd};

    fn defs() -> Vec<Arc<ResourceDef>> {
        let crd: Value =
            serde_yaml::from_str(include_str!("../../config/crd/immortalcontainers.yaml"))
                .expect("crd yaml");
        let mut d: Vec<Arc<ResourceDef>> = builtins().into_iter().map(Arc::new).collect();
        d.push(Arc::new(from_crd(&crd).expect("crd")));
        d
    }

    #[test]
    fn custom_group_version_lists_resource_and_status_like_fixture_01() {
        let l = resource_list("immortalcontainer.flugel.it", "v1alpha1", &defs()).expect("served");
        assert_eq!(l["resources"][0]["name"], "immortalcontainers");
        assert_eq!(
            l["resources"][0]["verbs"],
            json!([
                "delete",
                "deletecollection",
                "get",
                "list",
                "patch",
                "create",
                "update",
                "watch"
            ])
        );
        assert_eq!(l["resources"][1]["name"], "immortalcontainers/status");
        assert_eq!(
            l["resources"][1]["verbs"],
            json!(["get", "patch", "update"])
        );
    }

    #[test]
    fn openapi_v3_advertises_field_validation_on_patch() {
        let root = openapi_root(&defs());
        assert!(
            root["paths"]["apis/immortalcontainer.flugel.it/v1alpha1"]["serverRelativeURL"]
                .is_string()
        );
        let doc = openapi_group_version("immortalcontainer.flugel.it", "v1alpha1", &defs())
            .expect("served");
        let p = &doc["paths"]["/apis/immortalcontainer.flugel.it/v1alpha1/namespaces/{namespace}/immortalcontainers/{name}"];
        assert_eq!(p["patch"]["parameters"][0]["name"], "fieldValidation");
        assert_eq!(
            p["patch"]["x-kubernetes-group-version-kind"]["kind"],
            "ImmortalContainer"
        );
    }

    #[test]
    fn deployed_kinds_are_listed_with_scope_short_names_and_subresources() {
        let entry = |group: &str, name: &str| -> Value {
            let list = resource_list(group, "v1", &defs()).expect("served");
            list["resources"]
                .as_array()
                .and_then(|rs| rs.iter().find(|r| r["name"] == name).cloned())
                .unwrap_or(Value::Null)
        };
        let svc = entry("", "services");
        assert_eq!(
            (&svc["kind"], &svc["namespaced"], &svc["shortNames"]),
            (&json!("Service"), &json!(true), &json!(["svc"]))
        );
        assert_eq!(svc["categories"], json!(["all"]));
        assert_eq!(
            entry("", "services/status")["verbs"],
            json!(["get", "patch", "update"])
        );
        assert_eq!(entry("", "serviceaccounts")["shortNames"], json!(["sa"]));
        assert_eq!(
            entry("apps", "deployments")["shortNames"],
            json!(["deploy"])
        );
        assert!(entry("apps", "deployments/status").is_object());
        assert_eq!(
            entry("networking.k8s.io", "networkpolicies")["shortNames"],
            json!(["netpol"])
        );
        let rbac = crate::resources::RBAC_GROUP;
        for (name, namespaced) in [
            ("roles", true),
            ("rolebindings", true),
            ("clusterroles", false),
            ("clusterrolebindings", false),
        ] {
            let r = entry(rbac, name);
            assert_eq!(r["namespaced"], json!(namespaced), "{name}");
            assert!(r["verbs"]
                .as_array()
                .is_some_and(|v| v.contains(&json!("deletecollection"))));
        }
    }

    #[test]
    fn group_list_has_served_groups_only() {
        let g = group_list(&defs());
        let names: Vec<&str> = g["groups"]
            .as_array()
            .expect("groups")
            .iter()
            .filter_map(|x| x["name"].as_str())
            .collect();
        assert_eq!(
            names,
            vec![
                "coordination.k8s.io",
                "apiextensions.k8s.io",
                "apps",
                "networking.k8s.io",
                "rbac.authorization.k8s.io",
                "admissionregistration.k8s.io",
                "immortalcontainer.flugel.it"
            ]
        );
        assert!(resource_list("batch", "v1", &defs()).is_none());
    }
}
