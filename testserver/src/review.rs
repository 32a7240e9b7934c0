//! TokenReview (authentication.k8s.io/v1) and SubjectAccessReview (authorization.k8s.io/v1):
//! what a server that delegates authentication and authorization to the API server (the
//! operator's metrics endpoint, kube-rbac-proxy) asks. Both are create-only and stored nowhere.
//!
//! Answered from the server's own users, honestly and simply: a TokenReview authenticates the
//! tokens the server knows (the admin's, those of `add_user` and of TokenRequests), and a
//! SubjectAccessReview answers as the server authorizes its own requests: a user's allow rules,
//! then the stored RBAC objects (`rbac.rs`). A rule resource starting with `/` names a
//! non-resource URL (`Rule::new(&["get"], &["/metrics"])`), matched exactly or, ending in `*`,
//! as a prefix, as RBAC's `nonResourceURLs` are; `*` among resources does not match them, as in
//! RBAC. `spec.groups` of a review is what RBAC Group subjects match.

use crate::auth::{Grants, User};
use crate::http::Request;
use crate::rbac::{self, Ask, Subject};
use crate::reply::Reply;
use crate::route::Target;
use crate::shared::Shared;
use crate::status::{ApiError, Cause, Details};
use crate::store::Store;
use crate::util;
use serde_json::{json, Value};

const AUTHENTICATION: &str = "authentication.k8s.io";
const AUTHORIZATION: &str = "authorization.k8s.io";

/// Whether `t` is one of the reviews this module answers.
pub fn serves(t: &Target) -> bool {
    t.version == "v1"
        && t.namespace.is_none()
        && t.name.is_none()
        && t.sub.is_none()
        && matches!(
            (t.group.as_str(), t.resource.as_str()),
            (AUTHENTICATION, "tokenreviews") | (AUTHORIZATION, "subjectaccessreviews")
        )
}

/// Answers a review request (already authenticated, and authorized to `create` it).
pub fn handle(shared: &Shared, req: &Request, t: &Target, verb: &str) -> Result<Reply, ApiError> {
    if verb != "create" {
        return Err(ApiError::MethodNotAllowed(format!(
            "{verb} is not supported on {}: reviews are create-only",
            t.resource
        )));
    }
    let body: Value = serde_json::from_slice(&req.body).map_err(|e| {
        ApiError::BadRequest(format!("couldn't get version/kind; json parse error: {e}"))
    })?;
    let spec = body.get("spec").cloned().unwrap_or_else(|| json!({}));
    let users = shared
        .users
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let store = shared.read();
    let (kind, status) = if t.group == AUTHENTICATION {
        ("TokenReview", token_review(&users, &store, &spec))
    } else {
        ("SubjectAccessReview", access_review(&users, &store, &spec)?)
    };
    // 201 with the spec echoed back, as the real server answers (it echoes the token too).
    let answer = json!({
        "kind": kind,
        "apiVersion": format!("{}/v1", t.group),
        "metadata": {"creationTimestamp": null},
        "spec": spec,
        "status": status,
    });
    Ok(Reply::Json {
        code: 201,
        body: serde_json::to_vec(&answer).unwrap_or_default(),
        headers: Vec::new(),
    })
}

/// `status` of a TokenReview. Unauthenticated (unknown, expired, or its ServiceAccount gone):
/// an empty user and an error, and no `authenticated` field at all (Go leaves a false bool out).
fn token_review(users: &crate::auth::Users, store: &Store, spec: &Value) -> Value {
    let token = spec["token"].as_str().unwrap_or("");
    let user = users
        .authenticate(Some(&format!("Bearer {token}")))
        .filter(|u| !token.is_empty() && u.valid(util::unix_now(), || store));
    match user {
        Some(user) => {
            let mut user_info = json!({"username": user.name, "groups": user.groups()});
            if let Grants::ServiceAccount { uid, .. } = &user.grants {
                user_info["uid"] = json!(uid);
            }
            json!({"authenticated": true, "user": user_info})
        }
        None => json!({"user": {}, "error": "invalid bearer token"}),
    }
}

/// `status` of a SubjectAccessReview: allowed when a user of that name has a rule allowing
/// the verb on the resource or non-resource URL asked about, or the stored RBAC objects grant
/// it to that user or one of the review's groups.
fn access_review(
    users: &crate::auth::Users,
    store: &Store,
    spec: &Value,
) -> Result<Value, ApiError> {
    let name = spec["user"].as_str().unwrap_or("");
    let groups: Vec<String> = spec["groups"]
        .as_array()
        .map(|g| {
            g.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    let invalid = |field: &str, value: &str, detail: &str| {
        let details = Details {
            group: AUTHORIZATION.into(),
            kind: "SubjectAccessReview".into(),
            ..Details::default()
        };
        ApiError::invalid(
            "SubjectAccessReview.authorization.k8s.io",
            details,
            vec![Cause::invalid(field, value, detail)],
        )
    };
    if name.is_empty() && groups.is_empty() {
        return Err(invalid(
            "spec.user",
            "\"\"",
            "at least one of user or group must be specified",
        ));
    }
    let resource = spec.get("resourceAttributes").filter(|v| v.is_object());
    let non_resource = spec.get("nonResourceAttributes").filter(|v| v.is_object());
    let str_of = |v: &Value, field: &str| v[field].as_str().unwrap_or("").to_string();
    // Owned copies the `Ask` borrows from.
    let (verb, a, b, c, d, e) = match (resource, non_resource) {
        (Some(_), Some(_)) => {
            return Err(invalid(
                "spec.nonResourceAttributes",
                "{}",
                "cannot be specified in combination with resourceAttributes",
            ))
        }
        (None, None) => {
            return Err(invalid(
                "spec.resourceAttributes",
                "null",
                "exactly one of nonResourceAttributes or resourceAttributes must be specified",
            ))
        }
        (Some(r), None) => (
            str_of(r, "verb"),
            str_of(r, "group"),
            str_of(r, "resource"),
            str_of(r, "subresource"),
            str_of(r, "namespace"),
            str_of(r, "name"),
        ),
        (None, Some(n)) => (
            str_of(n, "verb"),
            str_of(n, "path"),
            String::new(),
            String::new(),
            String::new(),
            String::new(),
        ),
    };
    fn some(s: &str) -> Option<&str> {
        (!s.is_empty()).then_some(s)
    }
    let ask = match resource {
        Some(_) => Ask::Resource {
            verb: &verb,
            group: &a,
            resource: &b,
            subresource: some(&c),
            namespace: some(&d),
            name: some(&e),
        },
        None => Ask::NonResource {
            verb: &verb,
            path: &a,
        },
    };
    let by_rules = users.named(name).any(|u: &User| u.allows(&ask, || store));
    let who = Subject {
        user: name,
        groups: &groups,
    };
    let allowed = by_rules || rbac::allows(store, who, &ask);
    Ok(if allowed {
        json!({"allowed": true, "reason": format!("allowed by the test server's rules for {name:?}")})
    } else {
        json!({"allowed": false})
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::{Rule, Users};

    fn store() -> Store {
        let (gc, _) = std::sync::mpsc::channel();
        Store::new(10, gc)
    }

    fn users() -> Users {
        let mut users = Users::default();
        users.add(
            "t-prom",
            User {
                name: "prometheus".into(),
                grants: Grants::Rules(vec![Rule::new(&["get"], &["/metrics"])]),
            },
        );
        users.add(
            "t-op",
            User {
                name: "operator".into(),
                grants: Grants::Rules(vec![
                    Rule::new(&["*"], &["*"]),
                    Rule::new(&["get"], &["/debug/*"]),
                ]),
            },
        );
        users.add(
            "t-admin",
            User {
                name: "admin".into(),
                grants: Grants::All,
            },
        );
        users
    }

    fn non_resource(user: &str, verb: &str, path: &str) -> bool {
        let spec = json!({"user": user, "nonResourceAttributes": {"verb": verb, "path": path}});
        access_review(&users(), &store(), &spec).unwrap()["allowed"] == json!(true)
    }

    #[test]
    fn token_review_names_the_user_of_a_known_token_only() {
        let s = token_review(&users(), &store(), &json!({"token": "t-prom"}));
        assert_eq!(s["authenticated"], json!(true));
        assert_eq!(s["user"]["username"], "prometheus");
        assert_eq!(s["user"]["groups"], json!(["system:authenticated"]));
        for token in [json!({"token": "nope"}), json!({"token": ""}), json!({})] {
            let s = token_review(&users(), &store(), &token);
            assert!(s.get("authenticated").is_none(), "{s}");
            assert_eq!(s["user"], json!({}));
        }
    }

    #[test]
    fn non_resource_urls_match_exactly_or_by_prefix_and_not_through_resource_wildcards() {
        assert!(non_resource("prometheus", "get", "/metrics"));
        assert!(!non_resource("prometheus", "post", "/metrics"));
        assert!(!non_resource("prometheus", "get", "/metrics/extra"));
        // `*` resources grant every resource, but no non-resource URL.
        assert!(!non_resource("operator", "get", "/metrics"));
        assert!(non_resource("operator", "get", "/debug/pprof"));
        assert!(non_resource("admin", "get", "/metrics"));
        assert!(!non_resource("stranger", "get", "/metrics"));
    }

    #[test]
    fn resource_attributes_answer_from_the_same_rules_as_requests() {
        let review = |user: &str, verb: &str, resource: &str, sub: &str| {
            let spec = json!({"user": user, "resourceAttributes": {
                "verb": verb, "resource": resource, "subresource": sub, "namespace": "x"}});
            access_review(&users(), &store(), &spec).unwrap()["allowed"] == json!(true)
        };
        assert!(review("operator", "delete", "pods", ""));
        assert!(review("operator", "patch", "immortalcontainers", "status"));
        assert!(!review("prometheus", "get", "pods", ""));
    }

    #[test]
    fn a_review_without_a_subject_or_with_both_kinds_of_attributes_is_invalid() {
        let e = access_review(
            &users(),
            &store(),
            &json!({"nonResourceAttributes": {"path": "/metrics"}}),
        )
        .unwrap_err();
        assert_eq!(e.code(), 422);
        let v = e.to_value();
        assert_eq!(
            v["message"],
            "SubjectAccessReview.authorization.k8s.io \"\" is invalid: spec.user: Invalid value: \"\": at least one of user or group must be specified"
        );
        let both = json!({"user": "admin", "resourceAttributes": {}, "nonResourceAttributes": {}});
        assert_eq!(
            access_review(&users(), &store(), &both).unwrap_err().code(),
            422
        );
    }
}
