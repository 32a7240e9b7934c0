//! What a write does to an object beyond storing it, kind by kind, as kube-apiserver's
//! defaulting and registry strategies do: server defaults, status handling, generation.

use crate::inert;
use crate::podspec::default_pod_spec;
use crate::resources::{Class, ResourceDef};
use crate::util::{obj_mut, set_default};
use serde_json::{json, Map, Value};

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::builtins;
    use crate::resources::tests::ic_def;

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
}
