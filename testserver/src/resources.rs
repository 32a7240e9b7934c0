//! The resources the server serves: built-in kinds, custom resources made from CRDs, and the
//! per-kind write rules (server defaults, status handling, generation). The built-in kinds it
//! only stores (Service, Deployment, RBAC, ...) have their defaults in `inert.rs`.

use crate::inert;
use crate::status::{ApiError, Cause, Details};
use serde::Serialize;
use serde_json::{json, Map, Value};

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
            inert::RBAC_GROUP,
            "roles",
            "role",
            "Role",
            true,
            &[],
            Class::RbacRole,
        ),
        builtin(
            inert::RBAC_GROUP,
            "clusterroles",
            "clusterrole",
            "ClusterRole",
            false,
            &[],
            Class::RbacRole,
        ),
        builtin(
            inert::RBAC_GROUP,
            "rolebindings",
            "rolebinding",
            "RoleBinding",
            true,
            &[],
            Class::RbacBinding,
        ),
        builtin(
            inert::RBAC_GROUP,
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
    for v in listed {
        let vname = str_at(v, &["name"]).to_string();
        if v["served"].as_bool() != Some(true) {
            continue;
        }
        let storage = v["storage"].as_bool() == Some(true);
        if !v["schema"]["openAPIV3Schema"].is_object() {
            causes.push(Cause::required(
                &format!("spec.versions[{}].schema.openAPIV3Schema", versions.len()),
                "schemas are required",
            ));
        }
        let field = format!("spec.versions[{}].schema.openAPIV3Schema", versions.len());
        crate::cel::compile_rules(&v["schema"]["openAPIV3Schema"], &field, &mut causes);
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

/// The status a freshly accepted CRD has: names accepted and established at once (a real
/// server takes a moment; `kubectl wait --for condition=established` works on both).
pub fn crd_status(crd: &Value, now: &str) -> Value {
    let condition = |t: &str, reason: &str, message: &str| json!({"type": t, "status": "True", "lastTransitionTime": now, "reason": reason, "message": message});
    let stored: Vec<Value> = crd["spec"]["versions"]
        .as_array()
        .map(|vs| {
            vs.iter()
                .filter(|v| v["storage"].as_bool() == Some(true))
                .map(|v| v["name"].clone())
                .collect()
        })
        .unwrap_or_default();
    json!({
        "conditions": [
            condition("NamesAccepted", "NoConflicts", "no conflicts found"),
            condition("Established", "InitialNamesAccepted", "the initial names have been accepted"),
        ],
        "acceptedNames": crd["spec"]["names"].clone(),
        "storedVersions": stored,
    })
}

/// The object at `m[key]`, made an empty object first if it is missing or not an object.
pub fn obj_mut<'a>(m: &'a mut Map<String, Value>, key: &str) -> &'a mut Map<String, Value> {
    let slot = m
        .entry(key.to_string())
        .or_insert_with(|| Value::Object(Map::new()));
    if !slot.is_object() {
        *slot = Value::Object(Map::new());
    }
    match slot {
        Value::Object(o) => o,
        // Unreachable: replaced by an object just above.
        _ => unreachable!("slot was just made an object"),
    }
}

/// Sets `m[key]` to `v` unless it holds a value already (absent or null counts as unset).
pub fn set_default(m: &mut Map<String, Value>, key: &str, v: Value) {
    if m.get(key).is_none_or(Value::is_null) {
        m.insert(key.to_string(), v);
    }
}

/// Server-side defaults a real API server fills in on every write (fixture 11 for pods, 23
/// for events), applied to the object in place. Idempotent.
pub fn apply_defaults(def: &ResourceDef, obj: &mut Map<String, Value>) {
    match def.class {
        Class::Pod => default_pod(obj),
        Class::Namespace => {
            let name = obj
                .get("metadata")
                .and_then(|m| m.get("name"))
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            // Since 1.21 every namespace carries its name as an immutable label.
            let labels = obj_mut(obj_mut(obj, "metadata"), "labels");
            labels.insert("kubernetes.io/metadata.name".into(), Value::String(name));
            set_default(obj_mut(obj, "spec"), "finalizers", json!(["kubernetes"]));
        }
        Class::Event => {
            obj.entry("eventTime".to_string()).or_insert(Value::Null);
            set_default(obj, "reportingComponent", json!(""));
            set_default(obj, "reportingInstance", json!(""));
        }
        Class::AdmissionPolicy => crate::policy::default_policy(obj),
        Class::AdmissionPolicyBinding => crate::policy::default_binding(obj),
        Class::Service => inert::default_service(obj),
        Class::Deployment => inert::default_deployment(obj),
        Class::NetworkPolicy => inert::default_network_policy(obj),
        Class::RbacBinding => inert::default_binding(obj),
        Class::Node
        | Class::ResourceQuota
        | Class::Lease
        | Class::Crd
        | Class::ServiceAccount
        | Class::RbacRole
        | Class::Custom => {}
    }
}

/// Drops metadata maps and lists left empty (`labels`, `annotations`, `finalizers`,
/// `ownerReferences`): Go's `omitempty` leaves them out, so an object whose last label was
/// removed has no `labels` at all (fixture kube-1.28-kubelet/13).
pub fn omit_empty_metadata(obj: &mut Map<String, Value>) {
    if let Some(Value::Object(meta)) = obj.get_mut("metadata") {
        meta.retain(|k, v| {
            let listed = matches!(
                k.as_str(),
                "labels" | "annotations" | "finalizers" | "ownerReferences"
            );
            let empty = match v {
                Value::Object(m) => m.is_empty(),
                Value::Array(a) => a.is_empty(),
                Value::Null => true,
                _ => false,
            };
            !(listed && empty)
        });
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

/// What a pod gets beyond [`default_pod_spec`]: `enableServiceLinks` (`SetDefaults_Pod`), the
/// `default` service account (the ServiceAccount admission plugin), priority and preemption
/// policy (the Priority plugin) and DefaultTolerationSeconds: none of them reach a pod
/// template, where kube-apiserver does not apply them either.
fn default_pod(obj: &mut Map<String, Value>) {
    let spec = obj_mut(obj, "spec");
    set_default(spec, "serviceAccountName", json!("default"));
    set_default(spec, "priority", json!(0));
    set_default(spec, "enableServiceLinks", json!(true));
    set_default(spec, "preemptionPolicy", json!("PreemptLowerPriority"));
    default_toleration_seconds(spec);
    default_pod_spec(spec);
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

/// The DefaultTolerationSeconds admission plugin: a pod that does not tolerate the
/// `node.kubernetes.io/not-ready` (resp. `unreachable`) NoExecute taint gets a toleration of it
/// for 300 s, appended to its own tolerations (a toleration with no key, or no effect, counts).
fn default_toleration_seconds(spec: &mut Map<String, Value>) {
    let slot = spec
        .entry("tolerations".to_string())
        .or_insert_with(|| json!([]));
    if !slot.is_array() {
        *slot = json!([]);
    }
    let Some(tolerations) = slot.as_array_mut() else {
        return;
    };
    for key in [
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
    ] {
        let tolerated = tolerations.iter().any(|t| {
            let k = t["key"].as_str().unwrap_or("");
            let effect = t["effect"].as_str().unwrap_or("");
            (k == key || k.is_empty()) && (effect == "NoExecute" || effect.is_empty())
        });
        if !tolerated {
            tolerations.push(
                json!({"key": key, "operator": "Exists", "effect": "NoExecute",
                "tolerationSeconds": 300}),
            );
        }
    }
}

/// QoS class from the containers' and init containers' resources, as the pod status reports
/// it (`GetPodQOS`): quantities compared by value, so `1` and `1000m` are the same CPU.
fn qos_class(obj: &Map<String, Value>) -> &'static str {
    let spec = obj.get("spec");
    let containers: Vec<&Value> = ["containers", "initContainers"]
        .iter()
        .filter_map(|k| spec.and_then(|s| s.get(*k)).and_then(Value::as_array))
        .flatten()
        .collect();
    if containers.is_empty() {
        return "BestEffort";
    }
    let same = |a: &Value, b: &Value| {
        a == b
            || matches!(
                (crate::podspec::parse_quantity(a), crate::podspec::parse_quantity(b)),
                (Ok(x), Ok(y)) if x == y
            )
    };
    let mut any = false;
    let mut guaranteed = true;
    for c in containers {
        let requests = &c["resources"]["requests"];
        let limits = &c["resources"]["limits"];
        let has = |v: &Value| v.as_object().is_some_and(|m| !m.is_empty());
        any |= has(requests) || has(limits);
        for r in ["cpu", "memory"] {
            let limit = &limits[r];
            let request = if requests[r].is_null() {
                limit
            } else {
                &requests[r]
            };
            if limit.is_null() || !same(request, limit) {
                guaranteed = false;
            }
        }
    }
    match (any, guaranteed) {
        (false, _) => "BestEffort",
        (true, true) => "Guaranteed",
        (true, false) => "Burstable",
    }
}

/// What a create does to the object beyond defaults: status reset as the kind's strategy
/// does (`PrepareForCreate`), and `generation` 1 where the kind tracks it.
pub fn prepare_create(def: &ResourceDef, obj: &mut Map<String, Value>, now: &str) {
    match def.class {
        Class::Pod => {
            let qos = qos_class(obj);
            obj.insert(
                "status".into(),
                json!({"phase": "Pending", "qosClass": qos}),
            );
        }
        Class::Namespace => {
            obj.insert("status".into(), json!({"phase": "Active"}));
        }
        Class::ResourceQuota => {
            // What the quota controller writes at once: `status.hard` mirrors the spec
            // (`status.used` is filled in by admission, which can count the pods).
            let hard = obj
                .get("spec")
                .and_then(|s| s.get("hard"))
                .cloned()
                .unwrap_or_else(|| json!({}));
            obj.insert("status".into(), json!({"hard": hard}));
        }
        Class::Crd => {
            let status = crd_status(&Value::Object(obj.clone()), now);
            obj.insert("status".into(), status);
        }
        // The policy's status is the type checker's to write (this server has none).
        Class::AdmissionPolicy => {
            obj.remove("status");
        }
        Class::Custom if def.status_subresource => {
            obj.remove("status");
        }
        // The empty statuses their strategies reset to, as Go writes them.
        Class::Service => {
            obj.insert("status".into(), json!({"loadBalancer": {}}));
        }
        Class::Deployment => {
            obj.insert("status".into(), json!({}));
        }
        // A node's status is what its kubelet registers it with: kept as written. The other
        // kinds have no status.
        Class::Node
        | Class::Event
        | Class::Lease
        | Class::Custom
        | Class::AdmissionPolicyBinding
        | Class::ServiceAccount
        | Class::NetworkPolicy
        | Class::RbacRole
        | Class::RbacBinding => {}
    }
    if tracks_generation(def.class) {
        obj_mut(obj, "metadata").insert("generation".into(), json!(1));
    }
}

/// An update through the main endpoint: status is kept from `old` when the resource has a
/// status subresource, and `generation` moves when anything but metadata and status changed.
pub fn prepare_update(def: &ResourceDef, old: &Value, new: &mut Map<String, Value>) {
    if def.status_subresource {
        match old.get("status") {
            Some(s) => {
                new.insert("status".into(), s.clone());
            }
            None => {
                new.remove("status");
            }
        }
    }
    bump_generation(def, old, new);
}

/// An update through `/status`: everything but status comes from `old` (the custom
/// resource status strategy copies the old object and sets only `status`).
pub fn prepare_status_update(old: &Value, new: &mut Map<String, Value>) {
    let status = new.remove("status");
    let mut merged = old.as_object().cloned().unwrap_or_default();
    match status {
        Some(s) => {
            merged.insert("status".into(), s);
        }
        None => {
            merged.remove("status");
        }
    }
    *new = merged;
}

/// Kinds whose strategy sets `metadata.generation` and moves it on spec changes.
fn tracks_generation(class: Class) -> bool {
    matches!(
        class,
        Class::Custom
            | Class::Crd
            | Class::AdmissionPolicy
            | Class::AdmissionPolicyBinding
            | Class::Deployment
            | Class::NetworkPolicy
    )
}

fn bump_generation(def: &ResourceDef, old: &Value, new: &mut Map<String, Value>) {
    if !tracks_generation(def.class) {
        return;
    }
    let old_gen = old["metadata"]["generation"].as_i64().unwrap_or(1);
    let changed = old
        .as_object()
        .map(|o| {
            let keys = o
                .keys()
                .chain(new.keys())
                .filter(|k| *k != "metadata" && *k != "status");
            keys.into_iter().any(|k| o.get(k) != new.get(k))
        })
        .unwrap_or(true);
    // The Deployment strategy counts annotations too: they are copied to its ReplicaSets. So
    // every `kubectl apply` that changes anything (it rewrites its last-applied annotation)
    // moves a Deployment's generation.
    let annotations = |meta: Option<&Value>| {
        meta.and_then(|m| m.get("annotations"))
            .and_then(Value::as_object)
            .filter(|a| !a.is_empty())
            .cloned()
    };
    let changed = changed
        || (def.class == Class::Deployment
            && annotations(old.get("metadata")) != annotations(new.get("metadata")));
    let generation = if changed { old_gen + 1 } else { old_gen };
    obj_mut(new, "metadata").insert("generation".into(), json!(generation));
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
mod tests {
    use super::*;

    #[test]
    fn qos_compares_quantities_by_value_and_counts_init_containers() {
        let pod = |c: Value, init: Value| -> Map<String, Value> {
            json!({"spec": {"containers": [c], "initContainers": init}})
                .as_object()
                .cloned()
                .unwrap_or_default()
        };
        let same = json!({"resources": {"limits": {"cpu": "1", "memory": "1Gi"},
            "requests": {"cpu": "1000m", "memory": "1024Mi"}}});
        assert_eq!(qos_class(&pod(same.clone(), json!([]))), "Guaranteed");
        assert_eq!(
            qos_class(&pod(same, json!([{"resources": {}}]))),
            "Burstable"
        );
        assert_eq!(qos_class(&pod(json!({}), json!([]))), "BestEffort");
    }

    fn ic_def() -> ResourceDef {
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

    #[test]
    fn empty_metadata_maps_and_lists_are_left_out() {
        let mut o = json!({"metadata": {"name": "p", "labels": {}, "annotations": {"a": "b"},
            "finalizers": [], "ownerReferences": null}});
        let m = o.as_object_mut().expect("object");
        omit_empty_metadata(m);
        assert_eq!(
            o,
            json!({"metadata": {"name": "p", "annotations": {"a": "b"}}})
        );
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
    fn spec_change_bumps_generation_status_change_does_not() {
        let d = ic_def();
        let old =
            json!({"metadata": {"generation": 1}, "spec": {"image": "a"}, "status": {"x": 1}});
        let mut new =
            json!({"metadata": {"generation": 1}, "spec": {"image": "b"}, "status": {"x": 2}});
        let m = new.as_object_mut().expect("object");
        prepare_update(&d, &old, m);
        assert_eq!(m["metadata"]["generation"], 2);
        assert_eq!(m["status"], json!({"x": 1}));
        let mut same = json!({"metadata": {"generation": 1}, "spec": {"image": "a"}});
        let m = same.as_object_mut().expect("object");
        prepare_update(&d, &old, m);
        assert_eq!(m["metadata"]["generation"], 1);
    }

    #[test]
    fn default_toleration_seconds_adds_only_the_tolerations_a_pod_lacks() {
        let defaulted = |tolerations: Value| {
            let mut spec = json!({"tolerations": tolerations});
            default_toleration_seconds(spec.as_object_mut().expect("object"));
            spec["tolerations"].clone()
        };
        let own = json!({"key": "node.kubernetes.io/unreachable", "operator": "Exists",
            "effect": "NoExecute", "tolerationSeconds": 5});
        let t = defaulted(json!([own.clone()]));
        assert_eq!(t.as_array().map(Vec::len), Some(2));
        assert_eq!(t[0], own, "the pod's own toleration is kept first");
        assert_eq!(t[1]["key"], "node.kubernetes.io/not-ready");
        assert_eq!(t[1]["tolerationSeconds"], 300);
        let everything = json!([{"operator": "Exists"}]);
        assert_eq!(defaulted(everything.clone()), everything);
        let other = json!([{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]);
        assert_eq!(defaulted(other).as_array().map(Vec::len), Some(3));
    }

    #[test]
    fn pod_create_gets_server_defaults_and_pending_status() {
        let defs = builtins();
        let mut pod = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "nginx:latest"}]}, "status": {"phase": "Running"}});
        let m = pod.as_object_mut().expect("object");
        apply_defaults(&defs[0], m);
        prepare_create(&defs[0], m, "2026-01-01T00:00:00Z");
        assert_eq!(m["spec"]["restartPolicy"], "Always");
        assert_eq!(m["spec"]["containers"][0]["imagePullPolicy"], "Always");
        assert_eq!(m["spec"]["tolerations"].as_array().map(Vec::len), Some(2));
        assert_eq!(
            m["status"],
            json!({"phase": "Pending", "qosClass": "BestEffort"})
        );
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
