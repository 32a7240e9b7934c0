//! The resources the server serves: built-in kinds, custom resources made from CRDs, and how
//! their objects are written out. The per-kind write rules (server defaults, status handling,
//! generation) are in `strategy.rs`; the built-in kinds it only stores (Service, Deployment,
//! RBAC, ...) have their defaults in `inert.rs`.

use crate::status::{ApiError, Cause, Details};
use serde::Serialize;
use serde_json::{json, Value};

pub const RBAC_GROUP: &str = "rbac.authorization.k8s.io";

/// Which storage rules a resource follows. Built-in kinds each have their own; every custom
/// resource follows the same generic ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    Pod,
    Event,
    Namespace,
    Node,
    ResourceQuota,
    Lease,
    Crd,
    /// ValidatingAdmissionPolicy (`policy.rs`).
    AdmissionPolicy,
    /// ValidatingAdmissionPolicyBinding.
    AdmissionPolicyBinding,
    /// The kinds `kubectl apply -k config/default` creates, stored and served with their
    /// defaults and validation but nothing acting on them (`inert.rs`).
    ServiceAccount,
    Service,
    Deployment,
    NetworkPolicy,
    /// Role and ClusterRole (`ResourceDef::namespaced` tells which).
    RbacRole,
    /// RoleBinding and ClusterRoleBinding (`ResourceDef::namespaced` tells which).
    RbacBinding,
    Custom,
}

/// An `additionalPrinterColumns` entry of a CRD, for `kubectl get` tables.
#[derive(Debug, Clone, PartialEq)]
pub struct PrinterColumn {
    pub name: String,
    pub type_: String,
    pub json_path: String,
    /// 0: shown by `kubectl get`; more: only with `-o wide`.
    pub priority: i64,
}

/// Everything the server needs to know to serve one resource.
#[derive(Debug, Clone, PartialEq)]
pub struct ResourceDef {
    /// API group, "" for core.
    pub group: String,
    /// Served versions, the storage (preferred) version first.
    pub versions: Vec<String>,
    pub plural: String,
    pub singular: String,
    pub kind: String,
    pub list_kind: String,
    pub namespaced: bool,
    pub short_names: Vec<String>,
    pub categories: Vec<String>,
    pub class: Class,
    /// Whether `/status` is a subresource: then the main endpoint ignores status and
    /// `/status` ignores everything else.
    pub status_subresource: bool,
    /// `openAPIV3Schema` per served version (custom resources only).
    pub schemas: Vec<(String, Value)>,
    /// `additionalPrinterColumns` of the storage version (custom resources only).
    pub columns: Vec<PrinterColumn>,
}

impl ResourceDef {
    /// The group-qualified resource name, `pods` or `immortalcontainers.immortalcontainer.flugel.it`:
    /// how the real server names the resource in messages, and our storage key.
    pub fn key(&self) -> String {
        qualified(&self.plural, &self.group)
    }

    /// `apiVersion` for `version`: `v1` or `group/version`.
    pub fn api_version(&self, version: &str) -> String {
        if self.group.is_empty() {
            version.to_string()
        } else {
            format!("{}/{}", self.group, version)
        }
    }

    /// The storage version.
    pub fn preferred_version(&self) -> &str {
        self.versions.first().map(String::as_str).unwrap_or("v1")
    }

    pub fn is_custom(&self) -> bool {
        self.class == Class::Custom
    }

    /// Whether a PUT without `metadata.resourceVersion` is accepted. Built-in strategies allow
    /// it; the custom resource strategy does not (`AllowUnconditionalUpdate() == false`).
    pub fn unconditional_update(&self) -> bool {
        !self.is_custom()
    }

    /// Whether DELETE answers with the deleted object (pods, namespaces, CRDs, services,
    /// service accounts: registries with `ReturnDeletedObject`) or with a `Status` of `Success`
    /// (everything else), as the real registries do.
    pub fn returns_deleted_object(&self) -> bool {
        matches!(
            self.class,
            Class::Pod | Class::Namespace | Class::Crd | Class::Service | Class::ServiceAccount
        )
    }

    /// How Invalid and precondition messages name the kind: `Pod`, or
    /// `ImmortalContainer.immortalcontainer.flugel.it` for grouped kinds (fixture 07).
    pub fn kind_label(&self) -> String {
        qualified(&self.kind, &self.group)
    }

    /// `details` naming an object by resource (NotFound, AlreadyExists, Conflict).
    pub fn details(&self, name: &str) -> Details {
        Details {
            name: name.to_string(),
            group: self.group.clone(),
            kind: self.plural.clone(),
            ..Details::default()
        }
    }

    /// `details` naming an object by kind (Invalid, precondition Conflicts).
    pub fn kind_details(&self, name: &str) -> Details {
        Details {
            name: name.to_string(),
            group: self.group.clone(),
            kind: self.kind.clone(),
            ..Details::default()
        }
    }

    pub fn not_found(&self, name: &str) -> ApiError {
        ApiError::NotFound(
            format!("{} {name:?} not found", self.key()),
            self.details(name),
        )
    }

    pub fn already_exists(&self, name: &str) -> ApiError {
        ApiError::AlreadyExists(
            format!("{} {name:?} already exists", self.key()),
            self.details(name),
        )
    }

    /// 409 for a stale `metadata.resourceVersion` (fixture 19).
    pub fn conflict_modified(&self, name: &str) -> ApiError {
        ApiError::Conflict(
            format!(
                "Operation cannot be fulfilled on {} {name:?}: the object has been modified; please apply your changes to the latest version and try again",
                self.key()
            ),
            self.details(name),
        )
    }

    pub fn invalid(&self, name: &str, causes: Vec<Cause>) -> ApiError {
        ApiError::invalid(&self.kind_label(), self.kind_details(name), causes)
    }

    /// Verbs for discovery, in the order the real server lists them (fixture 01).
    pub fn verbs(&self) -> Vec<&'static str> {
        let mut v = vec!["delete"];
        if self.class != Class::Namespace {
            v.push("deletecollection");
        }
        v.extend(["get", "list", "patch", "create", "update", "watch"]);
        v
    }

    /// The OpenAPI schema for `version`, if any.
    pub fn schema(&self, version: &str) -> Option<&Value> {
        self.schemas
            .iter()
            .find(|(v, _)| v == version)
            .map(|(_, s)| s)
    }
}

/// `plural` or `plural.group`, as `schema.GroupResource.String()` prints it.
pub fn qualified(name: &str, group: &str) -> String {
    if group.is_empty() {
        name.to_string()
    } else {
        format!("{name}.{group}")
    }
}

fn builtin(
    group: &str,
    plural: &str,
    singular: &str,
    kind: &str,
    namespaced: bool,
    short_names: &[&str],
    class: Class,
) -> ResourceDef {
    ResourceDef {
        group: group.to_string(),
        versions: vec!["v1".to_string()],
        plural: plural.to_string(),
        singular: singular.to_string(),
        kind: kind.to_string(),
        list_kind: format!("{kind}List"),
        namespaced,
        short_names: short_names.iter().map(|s| s.to_string()).collect(),
        // `kubectl get all` lists the kinds in the `all` category.
        categories: if matches!(class, Class::Pod | Class::Service | Class::Deployment) {
            vec!["all".to_string()]
        } else {
            Vec::new()
        },
        class,
        status_subresource: matches!(
            class,
            Class::Pod
                | Class::Namespace
                | Class::Node
                | Class::ResourceQuota
                | Class::Crd
                | Class::AdmissionPolicy
                | Class::Service
                | Class::Deployment
        ),
        schemas: Vec::new(),
        columns: Vec::new(),
    }
}

/// The built-in resources this server serves.
pub fn builtins() -> Vec<ResourceDef> {
    vec![
        builtin("", "pods", "pod", "Pod", true, &["po"], Class::Pod),
        builtin("", "events", "event", "Event", true, &["ev"], Class::Event),
        builtin(
            "",
            "namespaces",
            "namespace",
            "Namespace",
            false,
            &["ns"],
            Class::Namespace,
        ),
        builtin("", "nodes", "node", "Node", false, &["no"], Class::Node),
        builtin(
            "",
            "resourcequotas",
            "resourcequota",
            "ResourceQuota",
            true,
            &["quota"],
            Class::ResourceQuota,
        ),
        builtin(
            "coordination.k8s.io",
            "leases",
            "lease",
            "Lease",
            true,
            &[],
            Class::Lease,
        ),
        builtin(
            "apiextensions.k8s.io",
            "customresourcedefinitions",
            "customresourcedefinition",
            "CustomResourceDefinition",
            false,
            &["crd", "crds"],
            Class::Crd,
        ),
        builtin(
            "",
            "serviceaccounts",
            "serviceaccount",
            "ServiceAccount",
            true,
            &["sa"],
            Class::ServiceAccount,
        ),
        builtin(
            "",
            "services",
            "service",
            "Service",
            true,
            &["svc"],
            Class::Service,
        ),
        builtin(
            "apps",
            "deployments",
            "deployment",
            "Deployment",
            true,
            &["deploy"],
            Class::Deployment,
        ),
        builtin(
            "networking.k8s.io",
            "networkpolicies",
            "networkpolicy",
            "NetworkPolicy",
            true,
            &["netpol"],
            Class::NetworkPolicy,
        ),
        builtin(
            RBAC_GROUP,
            "roles",
            "role",
            "Role",
            true,
            &[],
            Class::RbacRole,
        ),
        builtin(
            RBAC_GROUP,
            "clusterroles",
            "clusterrole",
            "ClusterRole",
            false,
            &[],
            Class::RbacRole,
        ),
        builtin(
            RBAC_GROUP,
            "rolebindings",
            "rolebinding",
            "RoleBinding",
            true,
            &[],
            Class::RbacBinding,
        ),
        builtin(
            RBAC_GROUP,
            "clusterrolebindings",
            "clusterrolebinding",
            "ClusterRoleBinding",
            false,
            &[],
            Class::RbacBinding,
        ),
        admission_policy_resource(
            "validatingadmissionpolicies",
            "validatingadmissionpolicy",
            "ValidatingAdmissionPolicy",
            Class::AdmissionPolicy,
        ),
        admission_policy_resource(
            "validatingadmissionpolicybindings",
            "validatingadmissionpolicybinding",
            "ValidatingAdmissionPolicyBinding",
            Class::AdmissionPolicyBinding,
        ),
    ]
}

/// A ValidatingAdmissionPolicy resource: served in `v1beta1`, as a 1.28 cluster with the beta
/// enabled serves it, and in `v1`, as 1.30 does (the same shape; `v1` preferred, as for the
/// rest of the group on a real server).
fn admission_policy_resource(
    plural: &str,
    singular: &str,
    kind: &str,
    class: Class,
) -> ResourceDef {
    let mut def = builtin(
        crate::policy::GROUP,
        plural,
        singular,
        kind,
        false,
        &[],
        class,
    );
    def.versions = vec!["v1".to_string(), "v1beta1".to_string()];
    def.categories = vec!["api-extensions".to_string()];
    def
}

fn str_at<'a>(v: &'a Value, path: &[&str]) -> &'a str {
    let mut cur = v;
    for p in path {
        cur = &cur[*p];
    }
    cur.as_str().unwrap_or("")
}

fn strings_at(v: &Value, path: &[&str]) -> Vec<String> {
    let mut cur = v;
    for p in path {
        cur = &cur[*p];
    }
    cur.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// Checks an `apiextensions.k8s.io/v1` CRD the way the real server does for the fields we
/// rely on, and returns the resource it defines. `Err` holds the Invalid causes.
pub fn from_crd(crd: &Value) -> Result<ResourceDef, Vec<Cause>> {
    let spec = &crd["spec"];
    let group = str_at(spec, &["group"]);
    let plural = str_at(spec, &["names", "plural"]);
    let kind = str_at(spec, &["names", "kind"]);
    let scope = str_at(spec, &["scope"]);
    let mut causes = Vec::new();
    if group.is_empty() {
        causes.push(Cause::required("spec.group", ""));
    }
    if plural.is_empty() {
        causes.push(Cause::required("spec.names.plural", ""));
    }
    if kind.is_empty() {
        causes.push(Cause::required("spec.names.kind", ""));
    }
    if scope != "Namespaced" && scope != "Cluster" {
        causes.push(Cause::not_supported(
            "spec.scope",
            &format!("{scope:?}"),
            "\"Cluster\", \"Namespaced\"",
        ));
    }
    let name = str_at(crd, &["metadata", "name"]);
    if !plural.is_empty() && !group.is_empty() && name != format!("{plural}.{group}") {
        causes.push(Cause::invalid(
            "metadata.name",
            &format!("{name:?}"),
            "must be spec.names.plural+\".\"+spec.group",
        ));
    }
    let mut versions = Vec::new();
    let mut schemas = Vec::new();
    let mut columns = Vec::new();
    let mut status_subresource = false;
    let empty = Vec::new();
    let listed = spec["versions"].as_array().unwrap_or(&empty);
    if listed.is_empty() {
        causes.push(Cause::required(
            "spec.versions",
            "must have exactly one version marked as storage version",
        ));
    }
    // The API server validates its internal form, where a schema every version shares is
    // `spec.validation`'s (fixture 27), and the causes name it so.
    let shared = listed.windows(2).all(|w| w[0]["schema"] == w[1]["schema"]);
    for (i, v) in listed.iter().enumerate() {
        let vname = str_at(v, &["name"]).to_string();
        let field = if shared {
            "spec.validation.openAPIV3Schema".to_string()
        } else {
            format!("spec.versions[{i}].schema.openAPIV3Schema")
        };
        let schema = &v["schema"]["openAPIV3Schema"];
        if schema.is_object() && (i == 0 || !shared) {
            crate::structural::check(schema, &field, &mut causes);
        }
        if v["served"].as_bool() != Some(true) {
            continue;
        }
        let storage = v["storage"].as_bool() == Some(true);
        if !schema.is_object() {
            causes.push(Cause::required(
                &format!("spec.versions[{i}].schema.openAPIV3Schema"),
                "schemas are required",
            ));
        }
        crate::cel::compile_rules(schema, &field, &mut causes);
        schemas.push((vname.clone(), v["schema"]["openAPIV3Schema"].clone()));
        if storage {
            versions.insert(0, vname);
            status_subresource = v["subresources"]["status"].is_object();
            columns = v["additionalPrinterColumns"]
                .as_array()
                .unwrap_or(&empty)
                .iter()
                .map(|c| PrinterColumn {
                    name: str_at(c, &["name"]).to_string(),
                    type_: str_at(c, &["type"]).to_string(),
                    json_path: str_at(c, &["jsonPath"]).to_string(),
                    priority: c["priority"].as_i64().unwrap_or(0),
                })
                .collect();
        } else {
            versions.push(vname);
        }
    }
    if !causes.is_empty() {
        return Err(causes);
    }
    let singular = match str_at(spec, &["names", "singular"]) {
        "" => kind.to_lowercase(),
        s => s.to_string(),
    };
    let list_kind = match str_at(spec, &["names", "listKind"]) {
        "" => format!("{kind}List"),
        s => s.to_string(),
    };
    Ok(ResourceDef {
        group: group.to_string(),
        versions,
        plural: plural.to_string(),
        singular,
        kind: kind.to_string(),
        list_kind,
        namespaced: scope == "Namespaced",
        short_names: strings_at(spec, &["names", "shortNames"]),
        categories: strings_at(spec, &["names", "categories"]),
        class: Class::Custom,
        status_subresource,
        schemas,
        columns,
    })
}

/// An object as written out: `kind` and `apiVersion` first, then the stored fields.
#[derive(Serialize)]
struct Typed<'a> {
    kind: &'a str,
    #[serde(rename = "apiVersion")]
    api_version: &'a str,
    #[serde(flatten)]
    object: &'a Value,
}

/// Appends `obj` as JSON with `kind` and `apiVersion` for `version`.
pub fn write_object(out: &mut Vec<u8>, def: &ResourceDef, version: &str, obj: &Value) {
    let api_version = def.api_version(version);
    let typed = Typed {
        kind: &def.kind,
        api_version: &api_version,
        object: obj,
    };
    // Serializing a Value into a Vec cannot fail (string keys, no I/O).
    let _ = serde_json::to_writer(&mut *out, &typed);
}

/// `obj` as JSON with `kind` and `apiVersion` for `version`.
pub fn encode_object(def: &ResourceDef, version: &str, obj: &Value) -> Vec<u8> {
    let mut out = Vec::with_capacity(2048);
    write_object(&mut out, def, version, obj);
    out
}

/// The object of a BOOKMARK event: only `metadata.resourceVersion` is meaningful. Built-in
/// kinds serialize their empty typed structs (fixture 30); custom resources are unstructured
/// and carry just kind, apiVersion and metadata (fixture 31).
pub fn bookmark_object(def: &ResourceDef, version: &str, rv: u64) -> Value {
    let rv = rv.to_string();
    if def.is_custom() {
        return json!({
            "apiVersion": def.api_version(version),
            "kind": def.kind,
            "metadata": {"resourceVersion": rv},
        });
    }
    let mut v = json!({
        "kind": def.kind,
        "apiVersion": def.api_version(version),
        "metadata": {"resourceVersion": rv, "creationTimestamp": null},
    });
    match def.class {
        Class::Pod => {
            v["spec"] = json!({"containers": null});
            v["status"] = json!({});
        }
        Class::Namespace | Class::Lease | Class::ResourceQuota => {
            v["spec"] = json!({});
            if def.class != Class::Lease {
                v["status"] = json!({});
            }
        }
        Class::Node => {
            v["spec"] = json!({});
            v["status"] = json!({
                "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
                "nodeInfo": {"machineID": "", "systemUUID": "", "bootID": "", "kernelVersion": "",
                    "osImage": "", "containerRuntimeVersion": "", "kubeletVersion": "",
                    "kubeProxyVersion": "", "operatingSystem": "", "architecture": ""},
            });
        }
        Class::Event => {
            v["involvedObject"] = json!({});
            v["source"] = json!({});
            v["firstTimestamp"] = Value::Null;
            v["lastTimestamp"] = Value::Null;
            v["eventTime"] = Value::Null;
            v["reportingComponent"] = json!("");
            v["reportingInstance"] = json!("");
        }
        Class::AdmissionPolicy => {
            v["spec"] = json!({});
            v["status"] = json!({});
        }
        Class::AdmissionPolicyBinding => {
            v["spec"] = json!({});
        }
        Class::Crd => {
            v["spec"] = json!({"group": "", "names": {"plural": "", "kind": ""}, "scope": "", "versions": null});
            v["status"] = json!({"conditions": null, "acceptedNames": {"plural": "", "kind": ""}, "storedVersions": null});
        }
        // What Go writes for the empty structs (not recorded): fields without `omitempty`
        // come out as null or empty.
        Class::ServiceAccount => {}
        Class::Service => {
            v["spec"] = json!({});
            v["status"] = json!({"loadBalancer": {}});
        }
        Class::Deployment => {
            v["spec"] = json!({"selector": null, "template": {"metadata": {"creationTimestamp": null},
                "spec": {"containers": null}}, "strategy": {}});
            v["status"] = json!({});
        }
        Class::NetworkPolicy => {
            v["spec"] = json!({"podSelector": {}});
        }
        Class::RbacRole => {
            v["rules"] = Value::Null;
        }
        Class::RbacBinding => {
            v["roleRef"] = json!({"apiGroup": "", "kind": "", "name": ""});
        }
        Class::Custom => {}
    }
    v
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The ImmortalContainer kind as the CRD in config/ defines it (the strategy's tests use
    /// it too).
    pub(crate) fn ic_def() -> ResourceDef {
        let yaml = include_str!("../../config/crd/immortalcontainers.yaml");
        let crd: Value = serde_yaml::from_str(yaml).expect("crd yaml");
        from_crd(&crd).expect("valid crd")
    }

    #[test]
    fn immortalcontainer_crd_defines_namespaced_resource_with_status() {
        let d = ic_def();
        assert_eq!(d.key(), "immortalcontainers.immortalcontainer.flugel.it");
        assert_eq!(d.versions, vec!["v1alpha1"]);
        assert!(d.namespaced && d.status_subresource);
        assert_eq!(d.short_names, vec!["ic"]);
        assert_eq!(d.columns.len(), 7);
        assert_eq!(d.list_kind, "ImmortalContainerList");
    }

    #[test]
    fn crd_with_wrong_name_is_invalid() {
        let crd = json!({"metadata": {"name": "x"}, "spec": {"group": "g.io", "scope": "Namespaced",
            "names": {"plural": "things", "kind": "Thing"},
            "versions": [{"name": "v1", "served": true, "storage": true, "schema": {"openAPIV3Schema": {"type": "object"}}}]}});
        let causes = from_crd(&crd).expect_err("invalid");
        assert_eq!(causes[0].field, "metadata.name");
    }
}
