//! The pod an ImmortalContainer wants, and how to tell whether a pod found under its name is
//! that pod: built from the object alone, compared on the fields we set.

use crate::immortal::types::{
    self as ic, ImmortalContainer, ImmortalOwner, ImmortalPod, API_VERSION, CONTAINER_NAME,
    COUNT_FINALIZER, IMAGE_ANNOTATION, KIND, MANAGED_BY_LABEL, MANAGED_BY_VALUE, OWNER_UID_LABEL,
};
use crate::kube::types::{Container, ObjectMeta, OwnerReference, Pod, PodSpec};
use std::collections::BTreeMap;

/// The pod we want for `ic`: built from the object alone, so it is the same every time. It is
/// born carrying [`COUNT_FINALIZER`] while starts are counted (see `counting`).
pub fn desired_pod(ic: &ImmortalContainer, counted: bool) -> Pod {
    let m = &ic.metadata;
    Pod {
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
            finalizers: if counted {
                vec![COUNT_FINALIZER.to_string()]
            } else {
                Vec::new()
            },
            ..Default::default()
        },
        spec: PodSpec {
            containers: vec![Container {
                name: CONTAINER_NAME.into(),
                image: ic.spec.image.clone(),
            }],
        },
        status: None,
    }
}

/// The labels our pods carry: the pod watch selects on the first; the second names the owner.
pub fn desired_labels(ic: &ImmortalContainer) -> BTreeMap<String, String> {
    BTreeMap::from([
        (MANAGED_BY_LABEL.to_string(), MANAGED_BY_VALUE.to_string()),
        // The uid, not the name: names go to 253 characters, label values stop at 63.
        (OWNER_UID_LABEL.to_string(), ic.metadata.uid.clone()),
    ])
}

/// Whether `pod` is controlled by `ic` (its controller reference names this very object).
pub fn controlled_by(pod: &Pod, ic: &ImmortalContainer) -> bool {
    pod.metadata
        .controller()
        .is_some_and(|o| o.is_immortal_container() && o.uid == ic.metadata.uid)
}

/// The image `pod` was created for: our annotation, or for a pod without it (made by hand
/// with our ownerReference) the image its container runs.
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
}
