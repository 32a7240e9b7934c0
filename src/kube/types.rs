//! The core Kubernetes objects reduced to the fields the operator uses; desired and actual
//! state are compared on the fields we set, never on whole objects.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Longest object name Kubernetes accepts (DNS-1123 subdomain).
pub const MAX_NAME_LEN: usize = 253;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectMeta {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uid: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub resource_version: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creation_timestamp: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deletion_timestamp: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deletion_grace_period_seconds: Option<i64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub finalizers: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub owner_references: Vec<OwnerReference>,
}

impl ObjectMeta {
    /// The ownerReference marked `controller: true`, if any (there is at most one).
    pub fn controller(&self) -> Option<&OwnerReference> {
        self.owner_references
            .iter()
            .find(|o| o.controller == Some(true))
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OwnerReference {
    pub api_version: String,
    pub kind: String,
    pub name: String,
    pub uid: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub controller: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_owner_deletion: Option<bool>,
}

/// A status condition in the shape the API conventions (and `metav1.Condition`) give it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default)]
    pub last_transition_time: String,
    #[serde(default)]
    pub reason: String,
    #[serde(default)]
    pub message: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Pod {
    #[serde(skip_serializing_if = "String::is_empty")]
    pub api_version: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub kind: String,
    pub metadata: ObjectMeta,
    pub spec: PodSpec,
    /// Set by the kubelet, never sent.
    #[serde(skip_serializing)]
    pub status: Option<PodStatus>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSpec {
    #[serde(default)]
    pub containers: Vec<Container>,
    /// Other fields of a pod we create, sent as given; never filled on decode.
    #[serde(flatten, skip_deserializing)]
    pub rest: serde_json::Map<String, serde_json::Value>,
    /// The node the scheduler bound it to (`spec.nodeName`): read, never sent.
    #[serde(default, skip_serializing)]
    pub node_name: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Container {
    pub name: String,
    #[serde(default)]
    pub image: String,
    /// Other fields of a container we create, sent as given (see [`PodSpec::rest`]).
    #[serde(flatten, skip_deserializing)]
    pub rest: serde_json::Map<String, serde_json::Value>,
}

/// A pod's `status`, reduced to what tells a user whether the pod runs and, if not, why.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct PodStatus {
    pub phase: Option<String>,
    /// Why the pod is in this phase, when the kubelet says (e.g. `DeadlineExceeded`, `Evicted`).
    pub reason: String,
    pub message: String,
    pub conditions: Vec<PodCondition>,
    pub container_statuses: Vec<ContainerStatus>,
    /// The init containers', native sidecars (`restartPolicy: Always`) among them.
    pub init_container_statuses: Vec<ContainerStatus>,
}

/// One of a pod's conditions (`PodScheduled`, `Ready`, ...).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct PodCondition {
    #[serde(rename = "type")]
    pub type_: String,
    #[serde(default)]
    pub status: String,
    #[serde(default)]
    pub reason: String,
    #[serde(default)]
    pub message: String,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ContainerStatus {
    pub name: String,
    pub ready: bool,
    pub state: ContainerState,
    pub last_state: ContainerState,
}

/// At most one of the three is set.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct ContainerState {
    pub waiting: Option<StateDetail>,
    pub running: Option<Running>,
    pub terminated: Option<StateDetail>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Running {
    pub started_at: Option<String>,
}

/// A container's `waiting` or `terminated` state.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct StateDetail {
    pub reason: String,
    pub message: String,
    pub exit_code: Option<i32>,
    pub started_at: Option<String>,
    pub finished_at: Option<String>,
}

impl Pod {
    pub fn phase(&self) -> &str {
        self.status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .unwrap_or("")
    }

    /// Whether this pod, as a DELETE answered it, is gone: no grace period (the API server's
    /// `CheckGracefulDelete`) and no finalizer.
    pub fn is_removed(&self) -> bool {
        self.metadata.deletion_grace_period_seconds == Some(0)
            && self.metadata.finalizers.is_empty()
    }
}

/// An object's uid, in 16 bytes when it is a UUID: the operator keeps one per object it knows.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Uid {
    Uuid([u8; 16]),
    Other(Box<str>),
}

impl Uid {
    pub fn new(s: &str) -> Uid {
        match parse_uuid(s) {
            Some(b) => Uid::Uuid(b),
            None => Uid::Other(s.into()),
        }
    }
}

impl PartialEq<str> for Uid {
    fn eq(&self, other: &str) -> bool {
        match self {
            Uid::Uuid(b) => parse_uuid(other).is_some_and(|o| o == *b),
            Uid::Other(s) => **s == *other,
        }
    }
}

impl PartialEq<String> for Uid {
    fn eq(&self, other: &String) -> bool {
        *self == *other.as_str()
    }
}

impl std::fmt::Display for Uid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Uid::Uuid(b) => f.write_str(&format_uuid(b)),
            Uid::Other(s) => f.write_str(s),
        }
    }
}

/// The 16 bytes of a UUID written as Kubernetes writes them, or `None` for any other form.
pub fn parse_uuid(s: &str) -> Option<[u8; 16]> {
    let b = s.as_bytes();
    if b.len() != 36 || [8, 13, 18, 23].iter().any(|&i| b[i] != b'-') {
        return None;
    }
    let mut digits = b.iter().filter(|&&c| c != b'-').map(|&c| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    });
    let mut out = [0u8; 16];
    for byte in &mut out {
        *byte = digits.next()?? * 16 + digits.next()??;
    }
    Some(out)
}

pub fn format_uuid(u: &[u8; 16]) -> String {
    let mut s = format!("{:032x}", u128::from_be_bytes(*u));
    for at in [20, 16, 12, 8] {
        s.insert(at, '-');
    }
    s
}

/// Any object reduced to its `metadata` (`PartialObjectMetadata`).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct PartialObjectMetadata {
    #[serde(default)]
    pub metadata: ObjectMeta,
}

/// A core/v1 Event, only ever written.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    pub involved_object: ObjectReference,
    pub reason: String,
    pub message: String,
    #[serde(rename = "type")]
    pub type_: String,
    pub source: EventSource,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_timestamp: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_timestamp: Option<String>,
    pub count: i64,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub reporting_component: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub reporting_instance: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectReference {
    pub api_version: String,
    pub kind: String,
    pub name: String,
    pub namespace: String,
    pub uid: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct EventSource {
    pub component: String,
}

/// The `Status` object the API server answers errors with (and puts in watch ERROR events).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct Status {
    pub status: String,
    pub message: String,
    pub reason: String,
    pub code: u16,
    pub details: Option<StatusDetails>,
    /// The answer's `Warning` texts: only they name unknown fields dropped from a refused pod.
    #[serde(skip)]
    pub warnings: Vec<String>,
}

impl Status {
    /// A read or watch from a resourceVersion the server has not reached: 504 with the cause
    /// `ResourceVersionTooLarge` or its older message, as client-go's reflector reads it.
    pub fn is_resource_version_too_large(&self) -> bool {
        let mut causes = self.details.iter().flat_map(|d| &d.causes);
        self.code == 504
            && (causes.any(|c| {
                c.reason == "ResourceVersionTooLarge" || c.message == "Too large resource version"
            }) || self.message.contains("Too large resource version"))
    }
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct StatusDetails {
    pub name: String,
    pub kind: String,
    pub causes: Vec<StatusCause>,
    pub retry_after_seconds: Option<u64>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct StatusCause {
    pub reason: String,
    pub message: String,
    pub field: String,
}

/// `namespace/name`, the key that crosses threads.
pub fn key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

pub fn split_key(key: &str) -> Option<(&str, &str)> {
    key.split_once('/')
}

#[cfg(test)]
mod tests {
    use super::*;

    // For other modules' tests: `"uid".into()`, and whether a pod has ended for good.
    impl From<&str> for Uid {
        fn from(s: &str) -> Uid {
            Uid::new(s)
        }
    }

    impl Pod {
        /// A pod in phase Succeeded or Failed never runs again (restartPolicy aside, the
        /// kubelet does not restart a terminated pod): it has to be replaced.
        pub fn is_terminated(&self) -> bool {
            matches!(self.phase(), "Succeeded" | "Failed")
        }
    }

    #[test]
    fn splits_keys_at_the_first_slash() {
        assert_eq!(split_key("ns/name"), Some(("ns", "name")));
        assert_eq!(split_key("nokey"), None);
        assert_eq!(key("a", "b"), "a/b");
    }

    #[test]
    fn a_pods_other_fields_are_sent_beside_the_typed_ones_but_never_kept_on_decode() {
        let mut pod = Pod::default();
        pod.spec
            .rest
            .insert("priorityClassName".into(), "high".into());
        let mut container = Container {
            name: "c".into(),
            image: "nginx".into(),
            ..Container::default()
        };
        container
            .rest
            .insert("args".into(), serde_json::json!(["-v"]));
        pod.spec.containers.push(container);
        let sent = serde_json::to_value(&pod).unwrap();
        assert_eq!(
            sent,
            serde_json::json!({"metadata": {}, "spec": {"priorityClassName": "high",
                "containers": [{"name": "c", "image": "nginx", "args": ["-v"]}]}})
        );
        let read: Pod = serde_json::from_value(sent).unwrap();
        assert!(read.spec.rest.is_empty() && read.spec.containers[0].rest.is_empty());
        assert_eq!(read.spec.containers[0].image, "nginx");
    }
}
