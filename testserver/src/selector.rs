//! Label and field selectors (`labelSelector`, `fieldSelector` query parameters) and matching.

use crate::resources::Class;
use serde_json::Value;

/// How one requirement compares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Eq,
    NotEq,
    In,
    NotIn,
    Exists,
    NotExists,
}

/// One comma-separated term of a selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requirement {
    pub key: String,
    pub op: Op,
    pub values: Vec<String>,
}

/// A parsed selector: every requirement must hold (AND). Empty matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selector {
    reqs: Vec<Requirement>,
}

/// Splits on commas outside parentheses (`a in (x,y),b=c` is two terms).
fn split_terms(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut depth = 0;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

fn parse_set(key: &str, rest: &str, op: Op) -> Result<Requirement, String> {
    let inner = rest
        .trim()
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| {
            format!("unable to parse requirement: expected a parenthesized list after {key:?}")
        })?;
    let values = inner.split(',').map(|v| v.trim().to_string()).collect();
    Ok(Requirement {
        key: key.to_string(),
        op,
        values,
    })
}

fn check_key(key: &str) -> Result<(), String> {
    if key.is_empty() || key.contains(char::is_whitespace) {
        return Err(format!(
            "unable to parse requirement: invalid label key {key:?}"
        ));
    }
    Ok(())
}

impl Selector {
    /// Parses a label selector: `k=v`, `k==v`, `k!=v`, `k in (a,b)`, `k notin (a)`, `k`, `!k`.
    pub fn parse_labels(s: &str) -> Result<Selector, String> {
        let mut reqs = Vec::new();
        for term in split_terms(s) {
            let t = term.trim();
            if t.is_empty() {
                continue;
            }
            let req = if let Some(k) = t.strip_prefix('!') {
                Requirement {
                    key: k.trim().to_string(),
                    op: Op::NotExists,
                    values: Vec::new(),
                }
            } else if let Some((k, v)) = t.split_once("!=") {
                Requirement {
                    key: k.trim().to_string(),
                    op: Op::NotEq,
                    values: vec![v.trim().to_string()],
                }
            } else if let Some((k, v)) = t.split_once("==").or_else(|| t.split_once('=')) {
                Requirement {
                    key: k.trim().to_string(),
                    op: Op::Eq,
                    values: vec![v.trim().to_string()],
                }
            } else if let Some((k, rest)) = t.split_once(" notin ") {
                parse_set(k.trim(), rest, Op::NotIn)?
            } else if let Some((k, rest)) = t.split_once(" in ") {
                parse_set(k.trim(), rest, Op::In)?
            } else if t.contains(['<', '>', '(', ')', ' ']) {
                return Err(format!("unable to parse requirement: {t:?}"));
            } else {
                Requirement {
                    key: t.to_string(),
                    op: Op::Exists,
                    values: Vec::new(),
                }
            };
            check_key(&req.key)?;
            reqs.push(req);
        }
        Ok(Selector { reqs })
    }

    /// Parses a field selector (`k=v`, `k==v`, `k!=v`), checking the field is one the
    /// resource class supports, as the real server answers `field label not supported`.
    pub fn parse_fields(s: &str, class: Class) -> Result<Selector, String> {
        let mut reqs = Vec::new();
        for t in s.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let (key, op, value) = if let Some((k, v)) = t.split_once("!=") {
                (k, Op::NotEq, v)
            } else if let Some((k, v)) = t.split_once("==").or_else(|| t.split_once('=')) {
                (k, Op::Eq, v)
            } else {
                return Err(format!("invalid selector: '{s}'; can't understand '{t}'"));
            };
            let key = key.trim();
            if !field_supported(class, key) {
                return Err(format!("field label not supported: {key}"));
            }
            reqs.push(Requirement {
                key: key.to_string(),
                op,
                values: vec![value.trim().to_string()],
            });
        }
        Ok(Selector { reqs })
    }

    /// Whether the object's `metadata.labels` satisfy every requirement.
    pub fn matches_labels(&self, obj: &Value) -> bool {
        let labels = &obj["metadata"]["labels"];
        self.reqs.iter().all(|r| {
            let v = labels.get(&r.key).and_then(Value::as_str);
            matches(r, v)
        })
    }

    /// Whether the object's fields (dotted paths) satisfy every requirement. A missing field
    /// compares as "".
    pub fn matches_fields(&self, obj: &Value) -> bool {
        self.reqs.iter().all(|r| {
            let mut cur = obj;
            for part in r.key.split('.') {
                cur = &cur[part];
            }
            let text = match cur {
                Value::String(s) => s.clone(),
                Value::Null => String::new(),
                other => other.to_string(),
            };
            matches(r, Some(&text))
        })
    }
}

fn matches(r: &Requirement, v: Option<&str>) -> bool {
    match r.op {
        Op::Exists => v.is_some(),
        Op::NotExists => v.is_none(),
        Op::Eq | Op::In => v.is_some_and(|v| r.values.iter().any(|x| x == v)),
        Op::NotEq | Op::NotIn => v.is_none_or(|v| !r.values.iter().any(|x| x == v)),
    }
}

/// Whether `labels` satisfy a `metav1.LabelSelector` object (`matchLabels`, `matchExpressions`;
/// an empty selector matches all), as admission policies' selectors and a Deployment's
/// `spec.selector` use it.
pub fn label_selector_matches(sel: &Value, labels: &Value) -> bool {
    let get = |k: &str| labels.get(k).and_then(Value::as_str);
    let by_labels = sel["matchLabels"]
        .as_object()
        .into_iter()
        .flatten()
        .all(|(k, v)| get(k) == v.as_str());
    let by_expressions = sel["matchExpressions"]
        .as_array()
        .into_iter()
        .flatten()
        .all(|e| {
            let key = e["key"].as_str().unwrap_or("");
            let values: Vec<&str> = e["values"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            match e["operator"].as_str().unwrap_or("") {
                "In" => get(key).is_some_and(|v| values.contains(&v)),
                "NotIn" => get(key).is_none_or(|v| !values.contains(&v)),
                "Exists" => get(key).is_some(),
                "DoesNotExist" => get(key).is_none(),
                _ => false,
            }
        });
    by_labels && by_expressions
}

/// Field selectors each kind supports (its registry's `GetAttrs`); every kind has
/// `metadata.name` and `metadata.namespace`.
fn field_supported(class: Class, key: &str) -> bool {
    if key == "metadata.name" || key == "metadata.namespace" {
        return true;
    }
    match class {
        Class::Pod => matches!(
            key,
            "spec.nodeName"
                | "spec.restartPolicy"
                | "spec.schedulerName"
                | "spec.serviceAccountName"
                | "status.phase"
                | "status.podIP"
                | "status.nominatedNodeName"
        ),
        Class::Event => matches!(
            key,
            "involvedObject.kind"
                | "involvedObject.namespace"
                | "involvedObject.name"
                | "involvedObject.uid"
                | "involvedObject.apiVersion"
                | "involvedObject.resourceVersion"
                | "involvedObject.fieldPath"
                | "reason"
                | "source"
                | "type"
        ),
        Class::Namespace => key == "status.phase",
        Class::Node => key == "spec.unschedulable",
        Class::ResourceQuota
        | Class::Lease
        | Class::Crd
        | Class::AdmissionPolicy
        | Class::AdmissionPolicyBinding
        | Class::ServiceAccount
        | Class::Service
        | Class::Deployment
        | Class::NetworkPolicy
        | Class::RbacRole
        | Class::RbacBinding
        | Class::Custom => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(labels: Value) -> Value {
        json!({"metadata": {"name": "p", "labels": labels}, "status": {"phase": "Running"}})
    }

    #[test]
    fn equality_terms_are_anded() {
        let s = Selector::parse_labels("app=web,tier==front,env!=prod").expect("parse");
        assert!(s.matches_labels(&pod(json!({"app": "web", "tier": "front"}))));
        assert!(!s.matches_labels(&pod(json!({"app": "web", "tier": "front", "env": "prod"}))));
        assert!(!s.matches_labels(&pod(json!({"app": "web"}))));
    }

    #[test]
    fn set_and_existence_terms() {
        let s = Selector::parse_labels("app in (a, b),!legacy,zone notin (x),team").expect("parse");
        assert!(s.matches_labels(&pod(json!({"app": "b", "team": "t"}))));
        assert!(!s.matches_labels(&pod(json!({"app": "c", "team": "t"}))));
        assert!(!s.matches_labels(&pod(json!({"app": "a", "team": "t", "legacy": "1"}))));
        assert!(Selector::parse_labels("")
            .expect("empty")
            .matches_labels(&pod(json!({}))));
    }

    #[test]
    fn selectors_match_labels_and_expressions() {
        let labels = json!({"team": "a", "env": "prod"});
        assert!(label_selector_matches(&json!({}), &labels));
        assert!(label_selector_matches(
            &json!({"matchLabels": {"team": "a"}}),
            &labels
        ));
        assert!(!label_selector_matches(
            &json!({"matchLabels": {"team": "b"}}),
            &labels
        ));
        let expr = |op: &str, values: &[&str]| json!({"matchExpressions": [{"key": "env", "operator": op, "values": values}]});
        assert!(label_selector_matches(
            &expr("In", &["prod", "dev"]),
            &labels
        ));
        assert!(!label_selector_matches(&expr("NotIn", &["prod"]), &labels));
        assert!(label_selector_matches(&expr("Exists", &[]), &labels));
        assert!(!label_selector_matches(&expr("DoesNotExist", &[]), &labels));
        assert!(label_selector_matches(
            &expr("NotIn", &["prod"]),
            &Value::Null
        ));
    }

    #[test]
    fn malformed_selector_is_an_error() {
        assert!(Selector::parse_labels("app in a,b").is_err());
        assert!(Selector::parse_labels("a b").is_err());
    }

    #[test]
    fn field_selector_matches_paths_and_rejects_unknown_fields() {
        let s = Selector::parse_fields("metadata.name=p,status.phase!=Failed", Class::Pod)
            .expect("parse");
        assert!(s.matches_fields(&pod(json!({}))));
        assert_eq!(
            Selector::parse_fields("spec.image=x", Class::Custom),
            Err("field label not supported: spec.image".to_string())
        );
    }
}
