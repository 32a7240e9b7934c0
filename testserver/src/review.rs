//! TokenReview (authentication.k8s.io/v1) and SubjectAccessReview (authorization.k8s.io/v1):
//! what a server that delegates authentication and authorization to the API server (the
//! operator's metrics endpoint, kube-rbac-proxy) asks. Both are create-only and stored nowhere.
//!
//! Answered from the server's own users, honestly and simply: a TokenReview authenticates the
//! tokens `add_user` (and the admin) registered, and a SubjectAccessReview answers from the same
//! allow rules the server enforces on its own requests. A rule resource starting with `/` names
//! a non-resource URL (`Rule::new(&["get"], &["/metrics"])`), matched exactly or, ending in `*`,
//! as a prefix, as RBAC's `nonResourceURLs` are; `*` among resources does not match them, as in
//! RBAC. Users have no groups: `spec.groups` of a review is ignored.

use crate::auth::User;
use crate::http::Request;
use crate::reply::Reply;
use crate::route::Target;
use crate::shared::Shared;
use crate::status::{ApiError, Cause, Details};
use serde_json::{json, Value};

const AUTHENTICATION: &str = "authentication.k8s.io";
const AUTHORIZATION: &str = "authorization.k8s.io";

/// The group every authenticated user is in, which real TokenReviews report.
const AUTHENTICATED_GROUP: &str = "system:authenticated";

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
    let users = shared.users.read().unwrap_or_else(|e| e.into_inner());
    let (kind, status) = if t.group == AUTHENTICATION {
        ("TokenReview", token_review(&users, &spec))
    } else {
        ("SubjectAccessReview", access_review(&users, &spec)?)
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

/// `status` of a TokenReview. Unauthenticated: an empty user and an error, and no
/// `authenticated` field at all (Go leaves a false bool out).
fn token_review(users: &crate::auth::Users, spec: &Value) -> Value {
    let token = spec["token"].as_str().unwrap_or("");
    match users.authenticate(Some(&format!("Bearer {token}"))) {
        Some(user) if !token.is_empty() => json!({
            "authenticated": true,
            "user": {"username": user.name, "groups": [AUTHENTICATED_GROUP]},
        }),
        _ => json!({"user": {}, "error": "invalid bearer token"}),
    }
}

/// `status` of a SubjectAccessReview: allowed when any user of that name has a rule allowing
/// the verb on the resource or non-resource URL asked about.
fn access_review(users: &crate::auth::Users, spec: &Value) -> Result<Value, ApiError> {
    let name = spec["user"].as_str().unwrap_or("");
    let groups = spec["groups"].as_array().map_or(0, Vec::len);
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
    if name.is_empty() && groups == 0 {
        return Err(invalid(
            "spec.user",
            "\"\"",
            "at least one of user or group must be specified",
        ));
    }
    let resource = spec.get("resourceAttributes").filter(|v| v.is_object());
    let non_resource = spec.get("nonResourceAttributes").filter(|v| v.is_object());
    let allows: Box<dyn Fn(&User) -> bool> = match (resource, non_resource) {
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
        (Some(r), None) => {
            let verb = r["verb"].as_str().unwrap_or("").to_string();
            let resource = match r["subresource"].as_str().unwrap_or("") {
                "" => r["resource"].as_str().unwrap_or("").to_string(),
                sub => format!("{}/{sub}", r["resource"].as_str().unwrap_or("")),
            };
            Box::new(move |u: &User| u.allows(&verb, &resource))
        }
        (None, Some(n)) => {
            let verb = n["verb"].as_str().unwrap_or("").to_string();
            let path = n["path"].as_str().unwrap_or("").to_string();
            Box::new(move |u: &User| allows_non_resource(u, &verb, &path))
        }
    };
    let allowed = users.named(name).any(allows);
    Ok(if allowed {
        json!({"allowed": true, "reason": format!("allowed by the test server's rules for {name:?}")})
    } else {
        json!({"allowed": false})
    })
}

/// RBAC's non-resource rule matching over the test server's flat rules.
fn allows_non_resource(user: &User, verb: &str, path: &str) -> bool {
    let Some(rules) = &user.rules else {
        return true; // the admin, like cluster-admin (nonResourceURLs: ["*"])
    };
    rules.iter().any(|r| {
        r.verbs.iter().any(|v| v == "*" || v == verb)
            && r.resources.iter().any(|url| match url.strip_suffix('*') {
                _ if !url.starts_with('/') => false,
                Some(prefix) => path.starts_with(prefix),
                None => url == path,
            })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::{Rule, Users};

    fn users() -> Users {
        let mut users = Users::default();
        users.add(
            "t-prom",
            User {
                name: "prometheus".into(),
                rules: Some(vec![Rule::new(&["get"], &["/metrics"])]),
            },
        );
        users.add(
            "t-op",
            User {
                name: "operator".into(),
                rules: Some(vec![
                    Rule::new(&["*"], &["*"]),
                    Rule::new(&["get"], &["/debug/*"]),
                ]),
            },
        );
        users.add(
            "t-admin",
            User {
                name: "admin".into(),
                rules: None,
            },
        );
        users
    }

    fn non_resource(user: &str, verb: &str, path: &str) -> bool {
        let spec = json!({"user": user, "nonResourceAttributes": {"verb": verb, "path": path}});
        access_review(&users(), &spec).unwrap()["allowed"] == json!(true)
    }

    #[test]
    fn token_review_names_the_user_of_a_known_token_only() {
        let s = token_review(&users(), &json!({"token": "t-prom"}));
        assert_eq!(s["authenticated"], json!(true));
        assert_eq!(s["user"]["username"], "prometheus");
        assert_eq!(s["user"]["groups"], json!(["system:authenticated"]));
        for token in [json!({"token": "nope"}), json!({"token": ""}), json!({})] {
            let s = token_review(&users(), &token);
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
            access_review(&users(), &spec).unwrap()["allowed"] == json!(true)
        };
        assert!(review("operator", "delete", "pods", ""));
        assert!(review("operator", "patch", "immortalcontainers", "status"));
        assert!(!review("prometheus", "get", "pods", ""));
    }

    #[test]
    fn a_review_without_a_subject_or_with_both_kinds_of_attributes_is_invalid() {
        let e = access_review(
            &users(),
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
        assert_eq!(access_review(&users(), &both).unwrap_err().code(), 422);
    }
}
