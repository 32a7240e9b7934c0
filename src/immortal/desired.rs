//! The pod an ImmortalContainer wants, built from the object alone (its image and template),
//! and whether a pod found under its name is it, judged on what we recorded on the pod.

use crate::immortal::types::{
    self as ic, ImmortalContainer, ImmortalOwner, ImmortalPod, Template, API_VERSION,
    CONTAINER_NAME, COUNT_FINALIZER, IMAGE_ANNOTATION, KIND, MANAGED_BY_LABEL, MANAGED_BY_VALUE,
    OWNER_UID_LABEL, SPEC_HASH_ANNOTATION,
};
use crate::kube::types::{Container, ObjectMeta, OwnerReference, Pod, PodSpec};
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// Pod spec fields a template may not set (docs/templates.md says why each): refused by the
/// CRD's rules, and dropped from a template stored before them.
pub const OPERATOR_FIELDS: [&str; 3] = ["restartPolicy", "nodeName", "ephemeralContainers"];

/// The pod we want for `ic`, carrying [`COUNT_FINALIZER`] while starts are counted.
pub fn desired_pod(ic: &ImmortalContainer, counted: bool) -> Pod {
    let m = &ic.metadata;
    let mut pod = Pod {
        api_version: "v1".into(),
        kind: "Pod".into(),
        metadata: ObjectMeta {
            name: ic::pod_name(&m.name),
            namespace: m.namespace.clone(),
            labels: desired_labels(ic),
            annotations: BTreeMap::from([(IMAGE_ANNOTATION.to_string(), ic.spec.image.clone())]),
            owner_references: vec![OwnerReference {
                api_version: API_VERSION.into(),
                kind: KIND.into(),
                name: m.name.clone(),
                uid: m.uid.clone(),
                controller: Some(true),
                // Foreground deletion of the object waits for its pod.
                block_owner_deletion: Some(true),
            }],
            finalizers: Vec::from_iter(counted.then(|| COUNT_FINALIZER.to_string())),
            ..Default::default()
        },
        spec: PodSpec {
            containers: vec![Container {
                name: CONTAINER_NAME.into(),
                image: ic.spec.image.clone(),
                ..Default::default()
            }],
            ..Default::default()
        },
        status: None,
    };
    if let (Some(t), Some(hash)) = (&ic.spec.template, spec_hash(ic)) {
        from_template(&mut pod, t);
        pod.metadata
            .annotations
            .insert(SPEC_HASH_ANNOTATION.to_string(), hash);
    }
    pod
}

/// Puts the template under our pod: its labels and annotations beside ours (ours win), its spec
/// but for [`OPERATOR_FIELDS`], `acontainer` running `spec.image` (first, if it is not named).
fn from_template(pod: &mut Pod, t: &Template) {
    let tv = t.value();
    for (field, ours) in [
        ("labels", &mut pod.metadata.labels),
        ("annotations", &mut pod.metadata.annotations),
    ] {
        for (k, v) in tv["metadata"][field].as_object().into_iter().flatten() {
            if let Some(v) = v.as_str() {
                ours.entry(k.clone()).or_insert_with(|| v.to_string());
            }
        }
    }
    let mut rest = tv["spec"].as_object().cloned().unwrap_or_default();
    let given = match rest.remove("containers") {
        Some(Value::Array(items)) => items,
        _ => Vec::new(),
    };
    for f in OPERATOR_FIELDS {
        rest.remove(f);
    }
    let ours = pod.spec.containers.remove(0);
    let mut containers: Vec<Container> = given.into_iter().map(container).collect();
    match containers.iter_mut().find(|c| c.name == CONTAINER_NAME) {
        Some(c) => c.image = ours.image,
        None => containers.insert(0, ours),
    }
    pod.spec.containers = containers;
    pod.spec.rest = rest;
}

/// A template's container, every field kept.
fn container(item: Value) -> Container {
    let Value::Object(mut rest) = item else {
        return Container::default();
    };
    let mut text = |k: &str| match rest.remove(k) {
        Some(Value::String(s)) => s,
        _ => String::new(),
    };
    Container {
        name: text("name"),
        image: text("image"),
        rest,
    }
}

/// The hash of a templated object's image and template in canonical JSON, recorded on its pod;
/// `None` without a template, whose pod records its image alone, as pods did before templates.
pub fn spec_hash(ic: &ImmortalContainer) -> Option<String> {
    let t = ic.spec.template.as_ref()?;
    // Kept beside the shared template: every reconcile asks, and the answer is the same.
    Some(t.hash_with(&ic.spec.image, || {
        // Canonical: serde_json's maps keep their keys sorted (see `types::Template`).
        let canonical = json!({"image": ic.spec.image, "template": t.value()}).to_string();
        let digest = ring::digest::digest(&ring::digest::SHA256, canonical.as_bytes());
        // 64 bits are plenty to tell one object's specs apart, and short enough to read.
        digest.as_ref()[..8]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }))
}

/// Why the pod made from `created_for` (its image annotation) and `hash` (its spec-hash
/// annotation) is not the pod `ic` wants, if it is not. Only what we recorded is compared: a
/// pod the API server defaulted or admission mutated would come back mutated, forever.
pub fn spec_change(
    created_for: &str,
    hash: Option<&str>,
    ic: &ImmortalContainer,
) -> Option<String> {
    let image = &ic.spec.image;
    if created_for != image {
        return Some(format!("image changed from {created_for} to {image}"));
    }
    let want = spec_hash(ic);
    (hash != want.as_deref()).then(|| match (hash, want) {
        (None, Some(_)) => "a template was added".to_string(),
        (Some(_), None) => "the template was removed".to_string(),
        _ => "the template changed".to_string(),
    })
}

/// The spec hash a pod records (see [`spec_hash`]).
pub fn recorded_hash(pod: &Pod) -> Option<&str> {
    pod.metadata
        .annotations
        .get(SPEC_HASH_ANNOTATION)
        .map(String::as_str)
}

/// The fields of `sent`'s spec the API server did not keep (`stored`: its answer to the create),
/// as paths such as `spec.containers[1].restartPolicyRules`: newer than the cluster, or behind a
/// feature gate it has off. Only presence is looked for (the server adds defaults, admission
/// rewrites values); a zero value is not, as Go's `omitempty` leaves it out.
pub fn dropped(sent: &Pod, stored: &Value) -> Vec<String> {
    let sent = serde_json::to_value(&sent.spec).unwrap_or_default();
    let mut out = Vec::new();
    missing(&sent, stored, "spec", &mut out);
    out
}

/// Adds to `out` what of `sent`, at `at`, `stored` lacks.
fn missing(sent: &Value, stored: &Value, at: &str, out: &mut Vec<String>) {
    match (sent, stored) {
        (Value::Object(sent), Value::Object(kept)) => {
            for (field, v) in sent.iter().filter(|(_, v)| !is_zero(v)) {
                let path = format!("{at}.{field}");
                match kept.get(field).filter(|k| !k.is_null()) {
                    Some(k) => missing(v, k, &path, out),
                    None => out.push(path),
                }
            }
        }
        (Value::Array(sent), Value::Array(kept)) => {
            for (i, v) in sent.iter().enumerate().filter(|(_, v)| !is_zero(v)) {
                // A named item by its name: admission may have added others before it.
                let k = match v["name"].as_str() {
                    Some(name) => kept.iter().find(|k| k["name"] == name),
                    None => kept.get(i),
                };
                let path = format!("{at}[{i}]");
                match k {
                    Some(k) => missing(v, k, &path, out),
                    None => out.push(path),
                }
            }
        }
        _ => {}
    }
}

fn is_zero(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
    }
}

/// The labels our pods carry: the pod watch selects on the first; the second names the owner.
pub fn desired_labels(ic: &ImmortalContainer) -> BTreeMap<String, String> {
    BTreeMap::from([
        (MANAGED_BY_LABEL.to_string(), MANAGED_BY_VALUE.to_string()),
        (OWNER_UID_LABEL.to_string(), ic.metadata.uid.clone()),
    ])
}

/// Whether `pod` is controlled by `ic` (its controller reference names this very object).
pub fn controlled_by(pod: &Pod, ic: &ImmortalContainer) -> bool {
    pod.metadata
        .controller()
        .is_some_and(|o| o.is_immortal_container() && o.uid == ic.metadata.uid)
}

/// The image `pod` was created for: our annotation, or else (a pod made by hand) its image.
pub fn created_for(pod: &Pod) -> &str {
    pod.metadata
        .annotations
        .get(IMAGE_ANNOTATION)
        .map(String::as_str)
        .or(pod.container_image())
        .unwrap_or("")
}

/// Describes who holds a pod name that is not ours, for the condition message.
pub fn holder(pod: &Pod, ic: &ImmortalContainer) -> String {
    match pod.metadata.controller() {
        None => "it has no controller".to_string(),
        Some(o) if o.is_immortal_container() && o.name == ic.metadata.name => format!(
            "it belongs to an earlier ImmortalContainer of the same name (uid {}) and will go once the garbage collector removes it",
            o.uid
        ),
        Some(o) => format!("it is controlled by {} {} (uid {})", o.kind, o.name, o.uid),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ic(image: &str) -> ImmortalContainer {
        let mut ic = ImmortalContainer::default();
        ic.metadata.name = "web".into();
        ic.metadata.namespace = "ns".into();
        ic.metadata.uid = "6c1e8a2b-3f4d-4e5f-8a9b-0c1d2e3f4a5b".into();
        ic.spec.image = image.into();
        ic
    }

    /// The pod of an object without a template, to the byte, as the operator sent it before
    /// templates existed: such objects must keep getting exactly this pod.
    #[test]
    fn an_object_without_a_template_gets_the_same_pod_body_as_before_templates() {
        let body = serde_json::to_string(&desired_pod(&ic("nginx:1.27"), true)).unwrap();
        assert_eq!(
            body,
            r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"web-immortalpod","namespace":"ns","finalizers":["immortalcontainer.flugel.it/count-start"],"labels":{"app.kubernetes.io/managed-by":"immortal-operator","immortalcontainer.flugel.it/owner-uid":"6c1e8a2b-3f4d-4e5f-8a9b-0c1d2e3f4a5b"},"annotations":{"immortalcontainer.flugel.it/image":"nginx:1.27"},"ownerReferences":[{"apiVersion":"immortalcontainer.flugel.it/v1alpha1","kind":"ImmortalContainer","name":"web","uid":"6c1e8a2b-3f4d-4e5f-8a9b-0c1d2e3f4a5b","controller":true,"blockOwnerDeletion":true}]},"spec":{"containers":[{"name":"acontainer","image":"nginx:1.27"}]}}"#
        );
        let body = serde_json::to_string(&desired_pod(&ic("nginx"), false)).unwrap();
        assert!(!body.contains("finalizers"), "{body}");
    }

    fn templated(image: &str, template: &str) -> ImmortalContainer {
        let mut o = ic(image);
        o.spec.template = Some(serde_json::from_str(template).unwrap());
        o
    }

    const FULL: &str = r#"{
        "metadata": {"labels": {"team": "a", "app.kubernetes.io/managed-by": "me"},
                     "annotations": {"note": "x", "immortalcontainer.flugel.it/image": "other"}},
        "spec": {
            "serviceAccountName": "runner",
            "restartPolicy": "Never",
            "nodeName": "node-1",
            "volumes": [{"name": "data", "emptyDir": {}}],
            "initContainers": [{"name": "init", "image": "busybox", "command": ["true"]}],
            "containers": [
                {"name": "sidecar", "image": "envoy:1.30", "ports": [{"containerPort": 9901}]},
                {"name": "acontainer", "args": ["--port", "80"],
                 "env": [{"name": "MODE", "value": "prod"}],
                 "resources": {"requests": {"memory": "64Mi", "cpu": "100m"}, "limits": {"memory": "128Mi"}}}
            ]
        }
    }"#;

    #[test]
    fn a_template_gives_the_pod_its_fields_with_our_name_labels_and_image_on_top() {
        let o = templated("nginx:1.27", FULL);
        let pod = serde_json::to_value(desired_pod(&o, true)).unwrap();
        let m = &pod["metadata"];
        assert_eq!(m["name"], "web-immortalpod");
        assert_eq!(m["labels"]["team"], "a");
        // Ours win: the pod watch selects on it.
        assert_eq!(
            m["labels"]["app.kubernetes.io/managed-by"],
            "immortal-operator"
        );
        assert_eq!(m["annotations"]["note"], "x");
        assert_eq!(
            m["annotations"]["immortalcontainer.flugel.it/image"],
            "nginx:1.27"
        );
        assert_eq!(
            m["annotations"][SPEC_HASH_ANNOTATION].as_str(),
            spec_hash(&o).as_deref()
        );
        assert_eq!(m["finalizers"][0], COUNT_FINALIZER);
        assert_eq!(m["ownerReferences"][0]["uid"], o.metadata.uid);
        let spec = &pod["spec"];
        assert_eq!(spec["serviceAccountName"], "runner");
        assert_eq!(spec["volumes"][0]["name"], "data");
        assert_eq!(spec["initContainers"][0]["command"][0], "true");
        // Kept out of the user's hands: the pod defaults apply.
        assert!(spec.get("restartPolicy").is_none(), "{spec}");
        assert!(spec.get("nodeName").is_none(), "{spec}");
        // The template's order, the sidecar as given, acontainer running spec.image.
        let c = spec["containers"].as_array().unwrap();
        assert_eq!(c.len(), 2);
        assert_eq!(c[0]["name"], "sidecar");
        assert_eq!(c[0]["image"], "envoy:1.30");
        assert_eq!(c[0]["ports"][0]["containerPort"], 9901);
        assert_eq!(c[1]["name"], "acontainer");
        assert_eq!(c[1]["image"], "nginx:1.27");
        assert_eq!(c[1]["args"][1], "80");
        assert_eq!(c[1]["env"][0]["value"], "prod");
        assert_eq!(c[1]["resources"]["requests"]["memory"], "64Mi");
    }

    #[test]
    fn a_template_without_acontainer_gets_it_first() {
        let o = templated(
            "nginx",
            r#"{"spec":{"containers":[{"name":"log","image":"busybox"}],"priorityClassName":"high"}}"#,
        );
        let pod = desired_pod(&o, false);
        let names: Vec<&str> = pod
            .spec
            .containers
            .iter()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(names, ["acontainer", "log"]);
        assert_eq!(pod.container_image(), Some("nginx"));
        assert_eq!(pod.spec.rest["priorityClassName"], "high");
        // An empty template is a template: it is recorded, and the pod is otherwise today's.
        let empty = desired_pod(&templated("nginx", "{}"), false);
        assert_eq!(empty.spec.containers.len(), 1);
        assert!(empty
            .metadata
            .annotations
            .contains_key(SPEC_HASH_ANNOTATION));
    }

    #[test]
    fn the_spec_hash_follows_image_and_template_and_not_key_order_or_status() {
        let a = templated(
            "nginx",
            r#"{"spec":{"containers":[{"name":"acontainer","args":["a"]}],"hostname":"h"}}"#,
        );
        let reordered = templated(
            "nginx",
            r#"{"spec":{"hostname":"h","containers":[{"args":["a"],"name":"acontainer"}]}}"#,
        );
        assert_eq!(spec_hash(&a), spec_hash(&reordered));
        let mut labelled = a.clone();
        labelled.metadata.labels.insert("team".into(), "b".into());
        labelled.status.start_times = Some(9);
        assert_eq!(spec_hash(&a), spec_hash(&labelled));
        let args = templated(
            "nginx",
            r#"{"spec":{"containers":[{"name":"acontainer","args":["b"]}],"hostname":"h"}}"#,
        );
        assert_ne!(spec_hash(&a), spec_hash(&args));
        let image = templated(
            "nginx:2",
            r#"{"spec":{"containers":[{"name":"acontainer","args":["a"]}],"hostname":"h"}}"#,
        );
        assert_ne!(spec_hash(&a), spec_hash(&image));
        assert_eq!(spec_hash(&ic("nginx")), None);
    }

    /// The hash kept beside a shared template is the one made afresh, for whichever of the
    /// objects sharing it asks first and whatever image each has (values as before it was kept:
    /// pods already running carry them).
    #[test]
    fn the_spec_hash_of_a_shared_template_is_each_image_own() {
        let t = r#"{"spec":{"containers":[{"name":"acontainer","args":["pinned"]}]}}"#;
        let (two, one) = (templated("nginx:2", t), templated("nginx:1", t));
        assert!(one
            .spec
            .template
            .as_ref()
            .unwrap()
            .shares(two.spec.template.as_ref().unwrap()));
        for _ in 0..2 {
            assert_eq!(spec_hash(&two).as_deref(), Some("dea503e90fa23198"));
            assert_eq!(spec_hash(&one).as_deref(), Some("621a4d11e5b8a110"));
        }
    }

    #[test]
    fn same_spec_or_not_is_decided_on_what_the_pod_records_never_on_what_it_runs() {
        let o = templated(
            "nginx",
            r#"{"spec":{"containers":[{"name":"acontainer","args":["a"]}]}}"#,
        );
        let mut pod = desired_pod(&o, true);
        let same =
            |pod: &Pod, o: &ImmortalContainer| spec_change(created_for(pod), recorded_hash(pod), o);
        assert_eq!(same(&pod, &o), None);
        // What admission or the API server does to the live pod changes nothing: a sidecar
        // injected, a label and an annotation added, the image rewritten to a mirror.
        pod.spec.containers.push(Container {
            name: "istio-proxy".into(),
            image: "istio/proxyv2".into(),
            ..Default::default()
        });
        pod.metadata.labels.insert("injected".into(), "true".into());
        pod.metadata
            .annotations
            .insert("sidecar.istio.io/status".into(), "{}".into());
        pod.spec.containers[0].image = "mirror.example/nginx".into();
        assert_eq!(same(&pod, &o), None);
        // A template change is a change, and so is the image.
        let changed = templated(
            "nginx",
            r#"{"spec":{"containers":[{"name":"acontainer","args":["b"]}]}}"#,
        );
        assert_eq!(
            same(&pod, &changed).as_deref(),
            Some("the template changed")
        );
        let mut image = o.clone();
        image.spec.image = "nginx:2".into();
        assert_eq!(
            same(&pod, &image).as_deref(),
            Some("image changed from nginx to nginx:2")
        );
        let mut dropped = o.clone();
        dropped.spec.template = None;
        assert_eq!(
            same(&pod, &dropped).as_deref(),
            Some("the template was removed")
        );
    }

    /// What fixture 25 shows a v1.28 API server doing with fields it does not know, and what it
    /// does with a sidecar's restartPolicy without the gate: gone from the stored spec. What it
    /// adds (defaults, a token volume), rewrites or leaves out as zero is not dropped.
    #[test]
    fn dropped_names_what_the_stored_spec_lacks_of_what_was_sent() {
        let o = templated(
            "nginx",
            r#"{"spec": {"securityContext": {"appArmorProfile": {"type": "RuntimeDefault"}, "runAsNonRoot": true},
                "hostNetwork": false, "volumes": [{"name": "data", "emptyDir": {}}],
                "initContainers": [{"name": "log", "image": "busybox", "restartPolicy": "Always"}],
                "containers": [{"name": "acontainer", "restartPolicyRules": [{"action": "Restart"}],
                                "resources": {"limits": {"cpu": "1000m"}}}]}}"#,
        );
        let sent = desired_pod(&o, true);
        let mut stored = serde_json::to_value(&sent.spec).unwrap();
        assert_eq!(dropped(&sent, &stored), Vec::<String>::new());
        stored["securityContext"]
            .as_object_mut()
            .unwrap()
            .remove("appArmorProfile");
        stored["initContainers"][0]
            .as_object_mut()
            .unwrap()
            .remove("restartPolicy");
        let c = &mut stored["containers"][0];
        c.as_object_mut().unwrap().remove("restartPolicyRules");
        c["resources"]["limits"]["cpu"] = json!("1");
        c["terminationMessagePath"] = json!("/dev/termination-log");
        // An injected container first, and defaults.
        stored["containers"]
            .as_array_mut()
            .unwrap()
            .insert(0, json!({"name": "istio-proxy", "image": "proxy"}));
        stored["dnsPolicy"] = json!("ClusterFirst");
        stored.as_object_mut().unwrap().remove("hostNetwork");
        assert_eq!(
            dropped(&sent, &stored),
            [
                "spec.containers[0].restartPolicyRules",
                "spec.initContainers[0].restartPolicy",
                "spec.securityContext.appArmorProfile"
            ]
        );
    }

    /// A pod made before templates records its image alone: an object without a template keeps
    /// it on upgrade, and one given a template replaces it.
    #[test]
    fn a_pod_made_before_templates_is_kept_for_an_object_without_one() {
        let old = desired_pod(&ic("nginx"), true);
        assert_eq!(recorded_hash(&old), None);
        assert_eq!(
            spec_change(created_for(&old), recorded_hash(&old), &ic("nginx")),
            None
        );
        let t = templated("nginx", r#"{"spec":{}}"#);
        assert_eq!(
            spec_change(created_for(&old), recorded_hash(&old), &t).as_deref(),
            Some("a template was added")
        );
    }
}
