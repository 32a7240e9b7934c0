//! What a read answers in, from its `Accept` header, as kube-apiserver negotiates it
//! (`negotiation.NegotiateOutputMediaType`, then `transformResponseObject`): the object itself,
//! a Table (`kubectl get`), or only metadata (`PartialObjectMetadata[List]`, what client-go's
//! metadata client and metadata informers ask for). The first media type of the header that
//! the server serves wins.

use crate::resources::{Class, ResourceDef};
use crate::status::ApiError;
use crate::store::Obj;
use serde_json::{json, Value};

/// The group of the server-side transforms (Table, PartialObjectMetadata).
const META_GROUP: &str = "meta.k8s.io";

/// The form of an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// The object or list as stored (JSON).
    Object,
    /// `as=Table` (either version of meta.k8s.io).
    Table,
    /// `as=PartialObjectMetadata` (`list: false`) or `as=PartialObjectMetadataList`
    /// (`list: true`) in meta.k8s.io `version` (`v1` or `v1beta1`).
    Metadata { list: bool, version: &'static str },
}

/// The format of the first media type in `accept` that this server serves. Protobuf, YAML and
/// transforms it does not know are passed over; with none left (or no header) the answer is
/// plain JSON, where kube-apiserver would answer 406 to a header naming only unserved types.
pub fn negotiate(accept: Option<&str>) -> Format {
    for clause in accept.unwrap_or("").split(',') {
        let mut parts = clause.split(';').map(str::trim);
        let media = parts.next().unwrap_or("").to_ascii_lowercase();
        if !matches!(media.as_str(), "application/json" | "application/*" | "*/*") {
            continue;
        }
        let (mut as_, mut group, mut version) = (None, None, None);
        for p in parts {
            let Some((k, v)) = p.split_once('=') else {
                continue;
            };
            let v = v.trim().trim_matches('"');
            match k.trim() {
                "as" => as_ = Some(v),
                "g" => group = Some(v),
                "v" => version = Some(v),
                _ => {}
            }
        }
        let Some(as_) = as_ else {
            return Format::Object;
        };
        let version = match version {
            Some("v1") => "v1",
            Some("v1beta1") => "v1beta1",
            _ => continue,
        };
        if group != Some(META_GROUP) {
            continue;
        }
        match as_ {
            "Table" => return Format::Table,
            "PartialObjectMetadata" => {
                return Format::Metadata {
                    list: false,
                    version,
                }
            }
            "PartialObjectMetadataList" => {
                return Format::Metadata {
                    list: true,
                    version,
                }
            }
            _ => {}
        }
    }
    Format::Object
}

/// The Go type kube-apiserver names in its 406 (`%T` of what the registry returned: the
/// internal type of a built-in kind, unstructured for custom resources).
fn go_type(def: &ResourceDef, list: bool) -> String {
    if def.class == Class::Custom {
        let t = if list {
            "UnstructuredList"
        } else {
            "Unstructured"
        };
        return format!("*unstructured.{t}");
    }
    let package = match def.group.split('.').next() {
        None | Some("") => "core",
        Some(p) => p,
    };
    let kind = if list { &def.list_kind } else { &def.kind };
    format!("*{package}.{kind}")
}

/// 406 for a metadata form that does not fit the request: a list asked for as one object, or
/// one object as a list (`asPartialObjectMetadata[List]`).
pub fn mismatch(def: &ResourceDef, asked_list: bool) -> ApiError {
    ApiError::NotAcceptable(if asked_list {
        format!(
            "you requested PartialObjectMetadataList, but the requested object is not a list ({})",
            go_type(def, false)
        )
    } else {
        format!(
            "you requested PartialObjectMetadata, but the requested object is a list ({})",
            go_type(def, true)
        )
    })
}

/// One object as `PartialObjectMetadata`: its whole metadata, nothing else.
pub fn partial(version: &str, obj: &Value) -> Value {
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": format!("{META_GROUP}/{version}"),
        "metadata": obj["metadata"],
    })
}

/// A `PartialObjectMetadataList`. Its list metadata is typed (`continue` left out when empty,
/// custom resources included), and an empty list has `"items": null`: the server builds the
/// list by appending to a nil slice, which Go's JSON encoder writes as null.
pub fn partial_list(version: &str, items: &[Obj], rv: u64, cont: Option<&str>) -> Value {
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if let Some(c) = cont {
        meta["continue"] = json!(c);
    }
    let items: Vec<Value> = items.iter().map(|o| partial(version, o)).collect();
    json!({
        "kind": "PartialObjectMetadataList",
        "apiVersion": format!("{META_GROUP}/{version}"),
        "metadata": meta,
        "items": if items.is_empty() { Value::Null } else { Value::Array(items) },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::builtins;

    #[test]
    fn the_first_served_media_type_wins() {
        let list_v1 = Format::Metadata {
            list: true,
            version: "v1",
        };
        // What client-go's metadata client sends for a list: protobuf first, JSON fallbacks.
        assert_eq!(
            negotiate(Some("application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json")),
            list_v1
        );
        assert_eq!(
            negotiate(Some(
                "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1beta1"
            )),
            Format::Metadata {
                list: false,
                version: "v1beta1"
            }
        );
        // kubectl get.
        assert_eq!(
            negotiate(Some("application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json")),
            Format::Table
        );
        // An unknown transform or group is passed over for the next type.
        assert_eq!(
            negotiate(Some(
                "application/json;as=Other;g=meta.k8s.io;v=v1,application/json"
            )),
            Format::Object
        );
        assert_eq!(
            negotiate(Some(
                "application/json;as=PartialObjectMetadataList;g=x;v=v1"
            )),
            Format::Object
        );
        assert_eq!(negotiate(None), Format::Object);
        assert_eq!(negotiate(Some("*/*")), Format::Object);
    }

    #[test]
    fn mismatched_forms_name_the_registry_type_as_kube_apiserver_does() {
        let pods = &builtins()[0];
        assert_eq!(
            mismatch(pods, true).to_value()["message"],
            "you requested PartialObjectMetadataList, but the requested object is not a list (*core.Pod)"
        );
        let v = mismatch(pods, false).to_value();
        assert_eq!(
            v["message"],
            "you requested PartialObjectMetadata, but the requested object is a list (*core.PodList)"
        );
        assert_eq!(
            (v["code"].as_u64(), v["reason"].as_str()),
            (Some(406), Some("NotAcceptable"))
        );
    }

    #[test]
    fn partial_objects_carry_all_metadata_and_an_empty_list_null_items() {
        let pod = std::sync::Arc::new(json!({"metadata": {"name": "p", "labels": {"a": "b"}},
            "spec": {"containers": []}, "status": {"phase": "Pending"}}));
        let l = partial_list("v1", &[pod], 7, Some("tok"));
        assert_eq!(
            l,
            json!({"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1",
                "metadata": {"resourceVersion": "7", "continue": "tok"},
                "items": [{"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                    "metadata": {"name": "p", "labels": {"a": "b"}}}]})
        );
        assert_eq!(partial_list("v1", &[], 7, None)["items"], Value::Null);
        assert_eq!(
            partial_list("v1", &[], 7, None)["metadata"],
            json!({"resourceVersion": "7"})
        );
    }
}
