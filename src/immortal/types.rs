//! The ImmortalContainer resource: its API coordinates, its types, its pods' names and labels.

use crate::kube::client::Resource;
use crate::kube::types::{Condition, ObjectMeta, OwnerReference, Pod};
use crate::util::lock;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::value::RawValue;
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock, Weak};

pub const GROUP: &str = "immortalcontainer.flugel.it";
pub const VERSION: &str = "v1alpha1";
/// `apiVersion` of the custom resource, as ownerReferences and events name it.
pub const API_VERSION: &str = "immortalcontainer.flugel.it/v1alpha1";
pub const KIND: &str = "ImmortalContainer";
pub const PLURAL: &str = "immortalcontainers";
/// The one container of every immortal pod.
pub const CONTAINER_NAME: &str = "acontainer";
pub const POD_SUFFIX: &str = "-immortalpod";
/// Label on every pod the operator creates: the pod watch selects on it.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
pub const MANAGED_BY_VALUE: &str = "immortal-operator";
/// Label carrying the owner's uid, not its name: names go to 253 characters, label values to 63.
pub const OWNER_UID_LABEL: &str = "immortalcontainer.flugel.it/owner-uid";
/// The image the pod was created for, so that the pod watch can tell a changed image.
pub const IMAGE_ANNOTATION: &str = "immortalcontainer.flugel.it/image";
/// A hash of the spec the pod was made from, as Deployments' `pod-template-hash` (templates only).
pub const SPEC_HASH_ANNOTATION: &str = "immortalcontainer.flugel.it/spec-hash";
/// Every pod keeps it until its start is counted, so none vanishes uncounted (see `counting`).
pub const COUNT_FINALIZER: &str = "immortalcontainer.flugel.it/count-start";
/// How the client addresses ImmortalContainers (see the test below for its parts).
pub const IMMORTAL_CONTAINERS: Resource = Resource::new(
    "/apis/immortalcontainer.flugel.it/v1alpha1",
    PLURAL,
    "immortalcontainer",
);

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ImmortalContainer {
    pub metadata: ObjectMeta,
    pub spec: ImmortalContainerSpec,
    pub status: ImmortalContainerStatus,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ImmortalContainerSpec {
    pub image: String,
    /// The pod to run, as a PodTemplateSpec; `None` for the bare pod of `image` alone.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub template: Option<Template>,
}

/// `spec.template`, kept as the JSON the user wrote so that no field is lost (the operator
/// reads only a few), in one copy shared by every decoded object that has the same template.
#[derive(Clone)]
pub struct Template(Arc<TemplateData>);

struct TemplateData {
    value: Value,
    /// The value in canonical JSON: what "same template" means, and what the spec hash hashes.
    canonical: Arc<str>,
    /// The spec hash with the first image it was asked for, which nearly every sharer has.
    hash: OnceLock<(String, String)>,
}

/// Templates by their canonical text and by every other text they were decoded from. Weak, so
/// that a template goes with its last object; swept whenever the table has doubled.
static SHARED: Mutex<(Table, usize)> = Mutex::new((BTreeMap::new(), 64));
type Table = BTreeMap<Arc<str>, Weak<TemplateData>>;

impl Template {
    /// The shared copy of the template written as `raw`, found by that text: parsed and made
    /// canonical only the first time it is seen, since every event carries its object's template.
    fn from_raw(raw: &str) -> serde_json::Result<Template> {
        if let Some(held) = lock(&SHARED).0.get(raw).and_then(Weak::upgrade) {
            return Ok(Template(held));
        }
        let value: Value = serde_json::from_str(raw)?;
        // serde_json's maps keep their keys sorted (no `preserve_order`): its text is canonical.
        let canonical: Arc<str> = value.to_string().into();
        let mut guard = lock(&SHARED);
        let (table, sweep_at) = &mut *guard;
        if table.len() >= *sweep_at {
            table.retain(|_, w| w.strong_count() > 0);
            *sweep_at = (table.len() * 2).max(64);
        }
        let data = match table.get(&canonical).and_then(Weak::upgrade) {
            Some(held) => held,
            None => {
                let data = Arc::new(TemplateData {
                    value,
                    canonical: canonical.clone(),
                    hash: OnceLock::new(),
                });
                table.insert(canonical.clone(), Arc::downgrade(&data));
                data
            }
        };
        // The API server sorts a custom resource's map keys: the text is most often canonical.
        if *canonical != *raw {
            table.insert(raw.into(), Arc::downgrade(&data));
        }
        Ok(Template(data))
    }

    pub fn value(&self) -> &Value {
        &self.0.value
    }

    /// The spec hash of this template with `image`, made by `hash`; kept for the first image.
    pub fn hash_with(&self, image: &str, hash: impl Fn() -> String) -> String {
        let (for_image, h) = self.0.hash.get_or_init(|| (image.to_string(), hash()));
        if for_image == image {
            h.clone()
        } else {
            hash()
        }
    }

    /// Whether `self` and `other` are one shared copy.
    pub fn shares(&self, other: &Template) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl PartialEq for Template {
    fn eq(&self, other: &Template) -> bool {
        self.shares(other) || self.0.canonical == other.0.canonical
    }
}

impl Eq for Template {}

impl PartialOrd for Template {
    fn partial_cmp(&self, other: &Template) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Template {
    fn cmp(&self, other: &Template) -> std::cmp::Ordering {
        self.0.canonical.cmp(&other.0.canonical)
    }
}

impl std::fmt::Debug for Template {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0.canonical)
    }
}

impl Serialize for Template {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.value().serialize(s)
    }
}

impl<'de> Deserialize<'de> for Template {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Template, D::Error> {
        let raw = Box::<RawValue>::deserialize(d)?;
        Template::from_raw(raw.get()).map_err(serde::de::Error::custom)
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ImmortalContainerStatus {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub current_pod: Option<String>,
    /// `None` until the operator first writes status, so it can write an explicit 0.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_times: Option<i64>,
    /// UID of the last pod counted in `start_times`: a pod we control whose uid differs has not
    /// been counted yet, which repairs a count lost to a crash or a 409.
    #[serde(rename = "lastCountedPodUID", skip_serializing_if = "Option::is_none")]
    pub last_counted_pod_uid: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The pod's phase, `Terminating` while it is being deleted (the PHASE column).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod_phase: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

pub trait ImmortalOwner {
    /// Whether this reference points at an ImmortalContainer (any version of our group).
    fn is_immortal_container(&self) -> bool;
}

impl ImmortalOwner for OwnerReference {
    fn is_immortal_container(&self) -> bool {
        self.kind == KIND && self.api_version.split('/').next() == Some(GROUP)
    }
}

pub trait ImmortalPod {
    /// Image of our container, if the pod has it.
    fn container_image(&self) -> Option<&str>;
}

impl ImmortalPod for Pod {
    fn container_image(&self) -> Option<&str> {
        self.spec
            .containers
            .iter()
            .find(|c| c.name == CONTAINER_NAME)
            .map(|c| c.image.as_str())
    }
}

pub fn pod_name(name: &str) -> String {
    format!("{name}{POD_SUFFIX}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_recorded_pod_keeping_only_the_fields_we_use() {
        let pod: Pod = serde_json::from_str(&crate::testutil::fixture("14-pod-get").1).unwrap();
        assert_eq!(pod.metadata.name, "example-immortalpod");
        assert_eq!(pod.container_image(), Some("nginx:latest"));
        let owner = pod.metadata.controller().unwrap();
        assert!(owner.is_immortal_container());
        assert_eq!(owner.name, "example");
        assert!(!pod.is_terminated());
    }

    #[test]
    fn the_resource_path_is_the_group_and_version() {
        assert_eq!(
            crate::kube::client::collection_path(IMMORTAL_CONTAINERS, Some("ns")),
            format!("/apis/{GROUP}/{VERSION}/namespaces/ns/{PLURAL}")
        );
    }

    /// Found by its text or by its canonical form, a template is one shared copy, and what
    /// decodes is the template as written, whatever text it came in.
    #[test]
    fn a_template_decoded_from_any_text_of_it_is_the_one_shared_copy() {
        let decode = |text: &str| serde_json::from_str::<Template>(text).unwrap();
        let sorted = r#"{"metadata":{"labels":{"a":"1"}},"spec":{"containers":[{"name":"x"}]}}"#;
        let first = decode(sorted);
        let again = decode(sorted);
        let reordered = decode(
            r#"{ "spec": {"containers": [{"name": "x"}]}, "metadata": {"labels": {"a": "1"}} }"#,
        );
        assert!(first.shares(&again) && first.shares(&reordered));
        assert_eq!(&*first.0.canonical, sorted);
        assert_eq!(
            reordered.value(),
            &serde_json::from_str::<Value>(sorted).unwrap()
        );
        let other = decode(r#"{"metadata":{"labels":{"a":"2"}}}"#);
        assert!(!first.shares(&other) && first != other);
        // Decoded inside an object, as a watch event's object is.
        let ic: ImmortalContainer = serde_json::from_str(&format!(
            r#"{{"metadata":{{"name":"web"}},"spec":{{"image":"nginx","template":{sorted}}}}}"#
        ))
        .unwrap();
        assert!(ic.spec.template.unwrap().shares(&first));
    }

    #[test]
    fn a_template_hash_is_kept_for_its_first_image_and_made_afresh_for_another() {
        let t: Template =
            serde_json::from_str(r#"{"metadata":{"labels":{"kept":"hash"}}}"#).unwrap();
        let made = std::sync::atomic::AtomicUsize::new(0);
        let hash = |image: &str| {
            t.hash_with(image, || {
                made.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                format!("hash of {image}")
            })
        };
        assert_eq!(hash("a"), "hash of a");
        assert_eq!(hash("b"), "hash of b");
        assert_eq!(hash("a"), "hash of a");
        assert_eq!(made.load(std::sync::atomic::Ordering::Relaxed), 2);
    }

    #[test]
    fn decodes_a_recorded_custom_resource_list_page() {
        let (_, body) = crate::testutil::fixture("10-ic-list-all-namespaces");
        let page: crate::kube::client::ListPage<ImmortalContainer> =
            serde_json::from_str(&body).unwrap();
        assert!(!page.metadata.resource_version.is_empty());
        assert_eq!(page.items[0].spec.image, "nginx:latest");
    }
}
