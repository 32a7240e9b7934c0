//! The ImmortalContainer resource: its API coordinates, its types, and the names and labels its
//! pods carry. What the operator does with them lives next door ([`super::reconcile`]).

use crate::kube::client::Resource;
use crate::kube::types::{Condition, ObjectMeta, OwnerReference, Pod};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::value::RawValue;
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock, Weak};

/// API group of the custom resource.
pub const GROUP: &str = "immortalcontainer.flugel.it";
/// Served version of the custom resource.
pub const VERSION: &str = "v1alpha1";
/// `apiVersion` of the custom resource, as ownerReferences and events name it.
pub const API_VERSION: &str = "immortalcontainer.flugel.it/v1alpha1";
/// Kind of the custom resource.
pub const KIND: &str = "ImmortalContainer";
/// Plural resource name, as it appears in URLs.
pub const PLURAL: &str = "immortalcontainers";
/// The one container of every immortal pod.
pub const CONTAINER_NAME: &str = "acontainer";
/// Suffix appended to the object's name to name its pod.
pub const POD_SUFFIX: &str = "-immortalpod";
/// Label put on every pod the operator creates; the pod watcher selects on it so the operator
/// never streams the rest of the cluster's pods.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// Value of [`MANAGED_BY_LABEL`].
pub const MANAGED_BY_VALUE: &str = "immortal-operator";
/// Label carrying the owner's uid: always 36 characters, so it is a valid label value whatever
/// the length of the owner's name (names go to 253, label values stop at 63).
pub const OWNER_UID_LABEL: &str = "immortalcontainer.flugel.it/owner-uid";
/// Annotation recording the image the pod was created for, so the pod watcher can tell, from
/// the pod alone, that someone changed the pod's image behind our back.
pub const IMAGE_ANNOTATION: &str = "immortalcontainer.flugel.it/image";
/// Annotation recording which spec (image and template) the pod was made from, as a hash, as
/// Deployments' `pod-template-hash` label does: compared instead of live pod fields, which the
/// API server defaults and admission may change. Only pods of objects with a template have it.
pub const SPEC_HASH_ANNOTATION: &str = "immortalcontainer.flugel.it/spec-hash";
/// The finalizer every pod is created with and keeps until its start is counted, so that no pod
/// can vanish uncounted (see `counting`).
pub const COUNT_FINALIZER: &str = "immortalcontainer.flugel.it/count-start";
/// How the client addresses ImmortalContainers (see the test below for its parts).
pub const IMMORTAL_CONTAINERS: Resource = Resource::new(
    "/apis/immortalcontainer.flugel.it/v1alpha1",
    PLURAL,
    "immortalcontainer",
);

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImmortalContainer {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: ImmortalContainerSpec,
    #[serde(default)]
    pub status: ImmortalContainerStatus,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ImmortalContainerSpec {
    #[serde(default)]
    pub image: String,
    /// The pod to run, as a PodTemplateSpec; `None` for the bare pod of `image` alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<Template>,
}

/// `spec.template`, kept as the JSON the user wrote so that no field is lost (the operator
/// reads only a few), in one copy shared by every decoded object that has the same template:
/// a watch event or a list of 10,000 objects made from one manifest holds it once.
#[derive(Clone)]
pub struct Template(Arc<TemplateData>);

struct TemplateData {
    value: Value,
    /// The value in canonical JSON (object keys sorted, no whitespace): what "same template"
    /// means, and what the spec hash is made from.
    canonical: Arc<str>,
    /// The spec hash (`desired::spec_hash`) of this template with the first image it was
    /// hashed with: every reconcile of every object sharing the template asks for it, and
    /// they nearly all have that one image.
    hash: OnceLock<(String, String)>,
}

impl Template {
    /// The shared copy of `value`.
    pub fn new(value: Value) -> Template {
        // Weak, so that a template no object holds any more goes with its last object.
        type Shared = (BTreeMap<Arc<str>, Weak<TemplateData>>, usize);
        static SHARED: Mutex<Shared> = Mutex::new((BTreeMap::new(), 64));
        let canonical: Arc<str> = canonical_json(&value).into();
        let mut guard = crate::util::lock(&SHARED);
        let (shared, sweep_at) = &mut *guard;
        if let Some(held) = shared.get(&canonical).and_then(Weak::upgrade) {
            return Template(held);
        }
        sweep(shared, sweep_at);
        let data = Arc::new(TemplateData {
            value,
            canonical: canonical.clone(),
            hash: OnceLock::new(),
        });
        shared.insert(canonical, Arc::downgrade(&data));
        Template(data)
    }

    /// The shared copy of the template written as `raw`. Every watch event and status write's
    /// answer carries its object's template, in the text the API server wrote last time:
    /// found by that text, it is parsed and put into canonical form only the first time it is
    /// seen (that was 40 % of the operator's CPU with a 1 KB template per object).
    fn from_raw(raw: &str) -> serde_json::Result<Template> {
        type ByText = (BTreeMap<Arc<str>, Weak<TemplateData>>, usize);
        static BY_TEXT: Mutex<ByText> = Mutex::new((BTreeMap::new(), 64));
        if let Some(held) = crate::util::lock(&BY_TEXT)
            .0
            .get(raw)
            .and_then(Weak::upgrade)
        {
            return Ok(Template(held));
        }
        let t = Template::new(serde_json::from_str(raw)?);
        // The API server writes a custom resource's maps with their keys sorted, so the text
        // is most often the canonical one: then the key is that copy, not another.
        let key = if *t.0.canonical == *raw {
            t.0.canonical.clone()
        } else {
            raw.into()
        };
        let mut guard = crate::util::lock(&BY_TEXT);
        let (by_text, sweep_at) = &mut *guard;
        sweep(by_text, sweep_at);
        by_text.insert(key, Arc::downgrade(&t.0));
        Ok(t)
    }

    pub fn value(&self) -> &Value {
        &self.0.value
    }

    pub fn canonical(&self) -> &str {
        &self.0.canonical
    }

    /// The spec hash of this template with `image`, made by `hash` (`desired::spec_hash`)
    /// once for the first image asked for and kept.
    pub fn hash_with(&self, image: &str, hash: impl Fn() -> String) -> String {
        let (for_image, h) = self.0.hash.get_or_init(|| (image.to_string(), hash()));
        if for_image == image {
            h.clone()
        } else {
            hash()
        }
    }

    /// Whether `self` and `other` are one shared copy (for tests of the sharing).
    pub fn shares(&self, other: &Template) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// Drops the entries no object holds any more whenever a table has doubled (as
/// `util::intern` does), so it stays at most twice the templates in use.
fn sweep(table: &mut BTreeMap<Arc<str>, Weak<TemplateData>>, sweep_at: &mut usize) {
    if table.len() >= *sweep_at {
        table.retain(|_, w| w.strong_count() > 0);
        *sweep_at = (table.len() * 2).max(64);
    }
}

impl PartialEq for Template {
    fn eq(&self, other: &Template) -> bool {
        self.shares(other) || self.canonical() == other.canonical()
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
        if self.shares(other) {
            return std::cmp::Ordering::Equal;
        }
        self.canonical().cmp(other.canonical())
    }
}

impl std::fmt::Debug for Template {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.canonical())
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

/// `value` as canonical JSON: object keys in byte order at every level, whatever order the
/// map keeps them in, so that equal values give equal text.
pub fn canonical_json(value: &Value) -> String {
    fn write(v: &Value, out: &mut String) {
        match v {
            Value::Object(map) => {
                let mut keys: Vec<&String> = map.keys().collect();
                keys.sort();
                out.push('{');
                for (i, k) in keys.into_iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&Value::from(k.as_str()).to_string());
                    out.push(':');
                    write(&map[k], out);
                }
                out.push('}');
            }
            Value::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    write(item, out);
                }
                out.push(']');
            }
            other => out.push_str(&other.to_string()),
        }
    }
    let mut out = String::new();
    write(value, &mut out);
    out
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImmortalContainerStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_pod: Option<String>,
    /// `None` until the operator first writes status, so it can write an explicit 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_times: Option<i64>,
    /// UID of the last pod counted in `start_times`. A pod we control whose uid differs has not
    /// been counted yet: that is how a count lost to a crash or a 409 is repaired.
    #[serde(
        rename = "lastCountedPodUID",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub last_counted_pod_uid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The pod's phase, `Terminating` while it is being deleted (the PHASE column).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_phase: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// What an ownerReference says about us.
pub trait ImmortalOwner {
    /// Whether this reference points at an ImmortalContainer (any version of our group).
    fn is_immortal_container(&self) -> bool;
}

impl ImmortalOwner for OwnerReference {
    fn is_immortal_container(&self) -> bool {
        self.kind == KIND && self.api_version.split('/').next() == Some(GROUP)
    }
}

/// What a pod says about our container.
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

/// Name of the pod kept for the object called `name`.
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
        assert_eq!(first.canonical(), sorted);
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
