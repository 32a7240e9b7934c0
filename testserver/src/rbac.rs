//! The RBAC authorizer over the Roles, ClusterRoles and their bindings stored in the server, as
//! kube-apiserver's (`plugin/pkg/auth/authorizer/rbac`) decides: a ClusterRoleBinding grants its
//! ClusterRole's rules everywhere, a RoleBinding grants its Role's (or ClusterRole's) rules in
//! its own namespace only; a subject is a User by name, a Group by name, or a ServiceAccount by
//! namespace and name. Allow rules only: nothing denies. A binding whose role does not exist
//! grants nothing.

use crate::resources::{qualified, RBAC_GROUP};
use crate::store::Store;
use serde_json::Value;

/// What a request asks, as the authorizer sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ask<'a> {
    Resource {
        verb: &'a str,
        group: &'a str,
        /// Plural name, without subresource.
        resource: &'a str,
        subresource: Option<&'a str>,
        /// `None` at the cluster scope.
        namespace: Option<&'a str>,
        /// `None` for a list, a watch of a collection, a create.
        name: Option<&'a str>,
    },
    NonResource {
        verb: &'a str,
        path: &'a str,
    },
}

/// Who asks: the user name and its groups.
#[derive(Debug, Clone, Copy)]
pub struct Subject<'a> {
    pub user: &'a str,
    pub groups: &'a [String],
}

/// The groups a ServiceAccount's token carries, as the token authenticator gives them.
pub fn service_account_groups(namespace: &str) -> Vec<String> {
    vec![
        "system:serviceaccounts".into(),
        format!("system:serviceaccounts:{namespace}"),
        "system:authenticated".into(),
    ]
}

/// The user name of a ServiceAccount: `system:serviceaccount:NS:NAME`.
pub fn service_account_user(namespace: &str, name: &str) -> String {
    format!("system:serviceaccount:{namespace}:{name}")
}

/// Whether any binding of the store grants `who` what `ask` asks.
pub fn allows(store: &Store, who: Subject, ask: &Ask) -> bool {
    let cluster_bindings = qualified("clusterrolebindings", RBAC_GROUP);
    let (clusterwide, _) = store.list(&cluster_bindings, None, None, 0, |b| binds(b, who));
    if clusterwide.iter().any(|b| role_allows(store, b, None, ask)) {
        return true;
    }
    let Ask::Resource {
        namespace: Some(ns),
        ..
    } = ask
    else {
        return false;
    };
    let bindings = qualified("rolebindings", RBAC_GROUP);
    let (local, _) = store.list(&bindings, Some(ns), None, 0, |b| binds(b, who));
    local.iter().any(|b| role_allows(store, b, Some(ns), ask))
}

/// Whether a binding names `who` among its subjects.
fn binds(binding: &Value, who: Subject) -> bool {
    let subjects = binding["subjects"]
        .as_array()
        .map_or(&[][..], Vec::as_slice);
    subjects.iter().any(|s| {
        let name = s["name"].as_str().unwrap_or("");
        match s["kind"].as_str().unwrap_or("") {
            "User" => name == who.user,
            "Group" => who.groups.iter().any(|g| g == name),
            "ServiceAccount" => {
                // A ServiceAccount in a RoleBinding may leave its namespace out: the binding's.
                let ns = s["namespace"]
                    .as_str()
                    .filter(|n| !n.is_empty())
                    .or(binding["metadata"]["namespace"].as_str())
                    .unwrap_or("");
                who.user == service_account_user(ns, name)
            }
            _ => false,
        }
    })
}

/// Whether the role a binding refers to has a rule allowing `ask`. `namespace` is the
/// RoleBinding's (`None` for a ClusterRoleBinding): a Role is looked up there.
fn role_allows(store: &Store, binding: &Value, namespace: Option<&str>, ask: &Ask) -> bool {
    let role_ref = &binding["roleRef"];
    let name = role_ref["name"].as_str().unwrap_or("");
    let role = match (role_ref["kind"].as_str(), namespace) {
        (Some("ClusterRole"), _) => store.get(&qualified("clusterroles", RBAC_GROUP), "", name),
        (Some("Role"), Some(ns)) => store.get(&qualified("roles", RBAC_GROUP), ns, name),
        _ => None,
    };
    let Some(role) = role else {
        return false;
    };
    let rules = role["rules"].as_array().map_or(&[][..], Vec::as_slice);
    rules.iter().any(|r| rule_allows(r, ask))
}

/// `RuleAllows`: the verb, and the API group, resource (with `*`, or `*/SUB` for a
/// subresource) and resource name, or the non-resource URL (exact, `*`, or a `PREFIX*`).
fn rule_allows(rule: &Value, ask: &Ask) -> bool {
    let list = |field: &str| -> Vec<&str> {
        rule[field]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default()
    };
    let verb = match ask {
        Ask::Resource { verb, .. } | Ask::NonResource { verb, .. } => *verb,
    };
    if !list("verbs").iter().any(|v| *v == "*" || *v == verb) {
        return false;
    }
    match ask {
        Ask::NonResource { path, .. } => list("nonResourceURLs").iter().any(|url| {
            *url == "*"
                || url == path
                || url
                    .strip_suffix('*')
                    .is_some_and(|prefix| path.starts_with(prefix))
        }),
        Ask::Resource {
            group,
            resource,
            subresource,
            name,
            ..
        } => {
            let combined = match subresource {
                Some(sub) => format!("{resource}/{sub}"),
                None => resource.to_string(),
            };
            let names = list("resourceNames");
            list("apiGroups").iter().any(|g| *g == "*" || g == group)
                && list("resources").iter().any(|r| {
                    *r == "*"
                        || *r == combined
                        || subresource.is_some_and(|sub| r.strip_prefix("*/") == Some(sub))
                })
                && (names.is_empty() || name.is_some_and(|n| names.contains(&n)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn resource<'a>(verb: &'a str, resource: &'a str, ns: Option<&'a str>) -> Ask<'a> {
        Ask::Resource {
            verb,
            group: "",
            resource,
            subresource: None,
            namespace: ns,
            name: None,
        }
    }

    #[test]
    fn rules_match_verbs_groups_resources_subresources_and_names_as_rbac_does() {
        let rule = json!({"apiGroups": [""], "resources": ["pods", "*/status"],
            "verbs": ["get", "list"]});
        assert!(rule_allows(&rule, &resource("list", "pods", Some("a"))));
        assert!(!rule_allows(&rule, &resource("delete", "pods", Some("a"))));
        assert!(!rule_allows(&rule, &resource("get", "services", Some("a"))));
        let status = Ask::Resource {
            verb: "get",
            group: "",
            resource: "services",
            subresource: Some("status"),
            namespace: None,
            name: Some("x"),
        };
        assert!(rule_allows(&rule, &status));
        // `pods` does not cover `pods/log`.
        let log = Ask::Resource {
            verb: "get",
            group: "",
            resource: "pods",
            subresource: Some("log"),
            namespace: None,
            name: Some("x"),
        };
        assert!(!rule_allows(&rule, &log));
        let other_group = Ask::Resource {
            verb: "get",
            group: "apps",
            resource: "pods",
            subresource: None,
            namespace: None,
            name: None,
        };
        assert!(!rule_allows(&rule, &other_group));
        let named = json!({"apiGroups": ["*"], "resources": ["leases"],
            "resourceNames": ["mine"], "verbs": ["*"]});
        let lease = |name| Ask::Resource {
            verb: "update",
            group: "coordination.k8s.io",
            resource: "leases",
            subresource: None,
            namespace: Some("a"),
            name,
        };
        assert!(rule_allows(&named, &lease(Some("mine"))));
        assert!(!rule_allows(&named, &lease(Some("theirs"))));
        // A create names nothing yet, so a rule limited to names never allows it.
        assert!(!rule_allows(&named, &lease(None)));
        let urls = json!({"nonResourceURLs": ["/metrics", "/debug/*"], "verbs": ["get"]});
        let url = |path| Ask::NonResource { verb: "get", path };
        assert!(rule_allows(&urls, &url("/metrics")));
        assert!(rule_allows(&urls, &url("/debug/pprof")));
        assert!(!rule_allows(&urls, &url("/metrics/x")));
        assert!(!rule_allows(&urls, &resource("get", "pods", None)));
    }

    #[test]
    fn subjects_are_users_groups_or_service_accounts_of_a_namespace() {
        let groups = service_account_groups("op");
        let sa = Subject {
            user: "system:serviceaccount:op:robot",
            groups: &groups,
        };
        let binding =
            |subject: Value| json!({"metadata": {"namespace": "op"}, "subjects": [subject]});
        assert!(binds(
            &binding(json!({"kind": "ServiceAccount", "name": "robot", "namespace": "op"})),
            sa
        ));
        // Left out, a RoleBinding's ServiceAccount is of the binding's namespace.
        assert!(binds(
            &binding(json!({"kind": "ServiceAccount", "name": "robot"})),
            sa
        ));
        assert!(!binds(
            &binding(json!({"kind": "ServiceAccount", "name": "robot", "namespace": "x"})),
            sa
        ));
        assert!(binds(
            &binding(json!({"kind": "Group", "name": "system:serviceaccounts:op"})),
            sa
        ));
        assert!(binds(
            &binding(json!({"kind": "User", "name": "system:serviceaccount:op:robot"})),
            sa
        ));
        assert!(!binds(
            &binding(json!({"kind": "User", "name": "robot"})),
            sa
        ));
    }
}
