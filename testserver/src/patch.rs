//! PATCH bodies: JSON merge patch (RFC 7386), JSON patch (RFC 6902), and strategic merge
//! patch for built-in kinds with the merge keys of the lists we serve.

use serde_json::{Map, Value};

/// Why a patch could not be applied. Answered 422 (JSON patch `test` failures and bad paths)
/// or 400 (malformed bodies) by the caller; never retried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PatchError {
    /// The body is not the JSON the patch type needs.
    Malformed(String),
    /// A JSON patch operation could not be applied (missing path, failed `test`).
    Failed(String),
}

/// Applies an RFC 7386 merge patch: objects merge key by key, `null` deletes, anything else
/// replaces.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    if let Value::Object(t) = target {
        for (k, v) in p {
            if v.is_null() {
                t.remove(k);
            } else {
                merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
    }
}

/// Merge keys of the lists in the built-in kinds we serve (`patchMergeKey` in their Go
/// types), by the list's field name and the name of the field or list holding it; other lists
/// are replaced whole, as in a merge patch. `ports` is the one name with two keys: a Service's
/// `spec.ports` merge by `port`, a container's `ports` by `containerPort`.
fn merge_key(parent: &str, field: &str) -> Option<&'static str> {
    match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "volumes"
        | "env"
        | "imagePullSecrets"
        | "secrets" => Some("name"),
        "volumeMounts" => Some("mountPath"),
        "volumeDevices" => Some("devicePath"),
        "ports" if parent == "spec" => Some("port"),
        "ports" => Some("containerPort"),
        "ownerReferences" => Some("uid"),
        "conditions" => Some("type"),
        _ => None,
    }
}

/// Applies a strategic merge patch: a merge patch in which lists with a merge key are merged
/// element by element (`$patch: delete` removes one), `finalizers` merge as a set, and other
/// directives (`$setElementOrder`, `$retainKeys`) are ignored.
pub fn strategic_merge(target: &mut Value, patch: &Value) {
    merge_object(target, patch, "");
}

/// [`strategic_merge`] of the object held by the field (or list) `parent`.
fn merge_object(target: &mut Value, patch: &Value, parent: &str) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Value::Object(t) = target else { return };
    for (k, v) in p {
        if k.starts_with('$') {
            continue;
        }
        match (v, t.get_mut(k), merge_key(parent, k)) {
            (Value::Null, _, _) => {
                t.remove(k);
            }
            (Value::Array(items), Some(Value::Array(cur)), Some(key)) => {
                merge_list(cur, items, key, k)
            }
            (Value::Array(items), Some(Value::Array(cur)), None) if k == "finalizers" => {
                for f in items {
                    if !cur.contains(f) {
                        cur.push(f.clone());
                    }
                }
            }
            (Value::Object(_), Some(existing), _) => merge_object(existing, v, k),
            (Value::Object(_), _, _) => {
                let mut fresh = Value::Null;
                merge_object(&mut fresh, v, k);
                t.insert(k.clone(), fresh);
            }
            _ => {
                t.insert(k.clone(), strip_directives(v));
            }
        }
    }
    // `$deleteFromPrimitiveList/...` keys were skipped with the other directives; apply them
    // now that the lists they edit are merged.
    for (k, v) in p {
        if let (Some(list), Value::Array(gone)) = (k.strip_prefix("$deleteFromPrimitiveList/"), v) {
            if let Some(Value::Array(cur)) = t.get_mut(list) {
                cur.retain(|x| !gone.contains(x));
            }
        }
    }
}

/// Merges the items of the list `list` element by element, matched by `key`.
fn merge_list(cur: &mut Vec<Value>, items: &[Value], key: &str, list: &str) {
    for item in items {
        let id = &item[key];
        let pos = cur.iter().position(|c| &c[key] == id && !id.is_null());
        let delete = item["$patch"] == "delete";
        match (pos, delete) {
            (Some(i), true) => {
                cur.remove(i);
            }
            (None, true) => {}
            (Some(i), false) => merge_object(&mut cur[i], item, list),
            (None, false) => cur.push(strip_directives(item)),
        }
    }
}

/// `v` without `$`-prefixed directive keys, at any depth.
fn strip_directives(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| !k.starts_with('$'))
                .map(|(k, x)| (k.clone(), strip_directives(x)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(strip_directives).collect()),
        other => other.clone(),
    }
}

/// Splits an RFC 6901 JSON pointer into unescaped tokens.
fn pointer_tokens(p: &str) -> Result<Vec<String>, PatchError> {
    if p.is_empty() {
        return Ok(Vec::new());
    }
    let rest = p
        .strip_prefix('/')
        .ok_or_else(|| PatchError::Malformed(format!("invalid JSON pointer {p:?}")))?;
    Ok(rest
        .split('/')
        .map(|t| t.replace("~1", "/").replace("~0", "~"))
        .collect())
}

/// The container that holds the pointer's last token, and that token.
fn parent_mut<'a>(doc: &'a mut Value, path: &str) -> Result<(&'a mut Value, String), PatchError> {
    let mut tokens = pointer_tokens(path)?;
    let last = tokens
        .pop()
        .ok_or_else(|| PatchError::Failed("cannot operate on the whole document".into()))?;
    let mut cur = doc;
    for t in &tokens {
        cur = match cur {
            Value::Object(m) => m.get_mut(t),
            Value::Array(a) => t.parse::<usize>().ok().and_then(|i| a.get_mut(i)),
            _ => None,
        }
        .ok_or_else(|| PatchError::Failed(format!("doc is missing path: {path:?}")))?;
    }
    Ok((cur, last))
}

fn get_at(doc: &Value, path: &str) -> Result<Value, PatchError> {
    doc.pointer(path)
        .cloned()
        .ok_or_else(|| PatchError::Failed(format!("doc is missing path: {path:?}")))
}

fn remove_at(doc: &mut Value, path: &str) -> Result<Value, PatchError> {
    let (parent, last) = parent_mut(doc, path)?;
    let missing = || PatchError::Failed(format!("doc is missing path: {path:?}"));
    match parent {
        Value::Object(m) => m.remove(&last).ok_or_else(missing),
        Value::Array(a) => match last.parse::<usize>() {
            Ok(i) if i < a.len() => Ok(a.remove(i)),
            _ => Err(missing()),
        },
        _ => Err(missing()),
    }
}

fn add_at(doc: &mut Value, path: &str, value: Value) -> Result<(), PatchError> {
    let (parent, last) = parent_mut(doc, path)?;
    match parent {
        Value::Object(m) => {
            m.insert(last, value);
            Ok(())
        }
        Value::Array(a) => {
            let i = if last == "-" {
                a.len()
            } else {
                last.parse::<usize>().unwrap_or(usize::MAX)
            };
            if i > a.len() {
                return Err(PatchError::Failed(format!(
                    "index out of range in {path:?}"
                )));
            }
            a.insert(i, value);
            Ok(())
        }
        _ => Err(PatchError::Failed(format!("doc is missing path: {path:?}"))),
    }
}

/// Applies an RFC 6902 JSON patch (add, remove, replace, move, copy, test).
pub fn json_patch(doc: &mut Value, patch: &Value) -> Result<(), PatchError> {
    let ops = patch.as_array().ok_or_else(|| {
        PatchError::Malformed("a JSON patch must be an array of operations".into())
    })?;
    for op in ops {
        let path = op["path"].as_str().unwrap_or("");
        let value = || {
            op.get("value")
                .cloned()
                .ok_or_else(|| PatchError::Malformed(format!("missing value for {path:?}")))
        };
        let from = op["from"].as_str().unwrap_or("");
        match op["op"].as_str().unwrap_or("") {
            "add" => add_at(doc, path, value()?)?,
            "remove" => {
                remove_at(doc, path)?;
            }
            "replace" => {
                remove_at(doc, path)?;
                add_at(doc, path, value()?)?;
            }
            "move" => {
                let v = remove_at(doc, from)?;
                add_at(doc, path, v)?;
            }
            "copy" => {
                let v = get_at(doc, from)?;
                add_at(doc, path, v)?;
            }
            "test" => {
                if get_at(doc, path)? != value()? {
                    return Err(PatchError::Failed(format!("testing value {path:?} failed")));
                }
            }
            other => return Err(PatchError::Malformed(format!("unexpected kind: {other:?}"))),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patch_follows_rfc7386_examples() {
        let mut t = json!({"a": "b", "c": {"d": "e", "f": "g"}});
        merge_patch(&mut t, &json!({"a": "z", "c": {"f": null}}));
        assert_eq!(t, json!({"a": "z", "c": {"d": "e"}}));
        let mut t = json!({"a": [1, 2]});
        merge_patch(&mut t, &json!({"a": [3]}));
        assert_eq!(t, json!({"a": [3]}));
        let mut t = json!("x");
        merge_patch(&mut t, &json!({"a": {"b": null}}));
        assert_eq!(t, json!({"a": {}}));
    }

    #[test]
    fn strategic_merge_merges_containers_by_name() {
        let mut pod = json!({"metadata": {"labels": {"a": "1"}, "finalizers": ["x"]}, "spec": {"containers": [
            {"name": "c", "image": "nginx", "imagePullPolicy": "Always"}, {"name": "d", "image": "busybox"}]}});
        let patch = json!({"$setElementOrder/containers": [{"name": "c"}], "metadata": {"labels": {"b": "2"}, "finalizers": ["y"]},
            "spec": {"containers": [{"name": "c", "image": "nginx:2"}, {"name": "d", "$patch": "delete"}, {"name": "e", "image": "e"}]}});
        strategic_merge(&mut pod, &patch);
        assert_eq!(
            pod,
            json!({"metadata": {"labels": {"a": "1", "b": "2"}, "finalizers": ["x", "y"]}, "spec": {"containers": [
            {"name": "c", "image": "nginx:2", "imagePullPolicy": "Always"}, {"name": "e", "image": "e"}]}})
        );
    }

    #[test]
    fn service_ports_merge_by_port_and_container_ports_by_container_port() {
        let mut svc =
            json!({"spec": {"ports": [{"name": "a", "port": 80}, {"name": "b", "port": 443}]}});
        strategic_merge(
            &mut svc,
            &json!({"spec": {"ports": [{"port": 443, "targetPort": 8443}]}}),
        );
        assert_eq!(
            svc["spec"]["ports"],
            json!([{"name": "a", "port": 80}, {"name": "b", "port": 443, "targetPort": 8443}])
        );
        let mut deploy = json!({"spec": {"template": {"spec": {"containers": [{"name": "c",
            "ports": [{"containerPort": 80, "name": "http"}]}]}}}});
        strategic_merge(
            &mut deploy,
            &json!({"spec": {"template": {"spec": {"containers": [{"name": "c",
                "ports": [{"containerPort": 80, "protocol": "TCP"}]}]}}}}),
        );
        assert_eq!(
            deploy["spec"]["template"]["spec"]["containers"][0]["ports"],
            json!([{"containerPort": 80, "name": "http", "protocol": "TCP"}])
        );
    }

    #[test]
    fn strategic_merge_deletes_from_primitive_lists_and_nulls() {
        let mut o = json!({"metadata": {"finalizers": ["x", "y"], "labels": {"a": "1"}}});
        strategic_merge(
            &mut o,
            &json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["x"], "labels": {"a": null}}}),
        );
        assert_eq!(o, json!({"metadata": {"finalizers": ["y"], "labels": {}}}));
    }

    #[test]
    fn json_patch_add_replace_remove_test() {
        let mut d = json!({"metadata": {"labels": {"a": "1"}}, "list": [1, 2]});
        let p = json!([
            {"op": "test", "path": "/metadata/labels/a", "value": "1"},
            {"op": "add", "path": "/metadata/labels/b~1c", "value": "2"},
            {"op": "replace", "path": "/list/0", "value": 9},
            {"op": "add", "path": "/list/-", "value": 3},
            {"op": "remove", "path": "/metadata/labels/a"}
        ]);
        json_patch(&mut d, &p).expect("applies");
        assert_eq!(
            d,
            json!({"metadata": {"labels": {"b/c": "2"}}, "list": [9, 2, 3]})
        );
        let failing = json!([{"op": "test", "path": "/list/0", "value": 1}]);
        assert!(matches!(
            json_patch(&mut d, &failing),
            Err(PatchError::Failed(_))
        ));
    }
}
