//! Bearer-token authentication and a small RBAC: each token has allow rules of verbs ×
//! resources. Discovery and /version are open to every authenticated user, as the
//! `system:discovery` role makes them on real clusters.

use crate::resources::qualified;
use crate::status::{ApiError, Details};
use std::collections::HashMap;

/// One allow rule: any of `verbs` on any of `resources`. `*` matches everything; resources
/// are plural names, with `/status` for the subresource (`immortalcontainers/status`). A
/// resource starting with `/` is a non-resource URL such as `/metrics`, which only
/// SubjectAccessReviews ask about (see review.rs).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Rule {
    pub verbs: Vec<String>,
    pub resources: Vec<String>,
}

impl Rule {
    /// A rule from string slices, for brevity in tests.
    pub fn new(verbs: &[&str], resources: &[&str]) -> Rule {
        Rule {
            verbs: verbs.iter().map(|s| s.to_string()).collect(),
            resources: resources.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn allows(&self, verb: &str, resource: &str) -> bool {
        let any = |list: &[String], x: &str| list.iter().any(|r| r == "*" || r == x);
        any(&self.verbs, verb) && any(&self.resources, resource)
    }
}

/// A known token's identity.
#[derive(Debug, Clone)]
pub struct User {
    pub name: String,
    /// `None` for the admin, who may do everything.
    pub rules: Option<Vec<Rule>>,
}

impl User {
    pub fn allows(&self, verb: &str, resource: &str) -> bool {
        match &self.rules {
            None => true,
            Some(rules) => rules.iter().any(|r| r.allows(verb, resource)),
        }
    }
}

/// Token to user.
#[derive(Debug, Default)]
pub struct Users {
    by_token: HashMap<String, User>,
}

impl Users {
    pub fn add(&mut self, token: &str, user: User) {
        self.by_token.insert(token.to_string(), user);
    }

    /// Replaces the allow rules of every token of user `name`, as editing the ClusterRole bound
    /// to that user does; returns how many tokens were changed (0: no such user).
    pub fn set_rules(&mut self, name: &str, rules: &[Rule]) -> usize {
        let mut changed = 0;
        for user in self.by_token.values_mut().filter(|u| u.name == name) {
            user.rules = Some(rules.to_vec());
            changed += 1;
        }
        changed
    }

    /// Every user called `name` (several tokens may share one), for SubjectAccessReviews.
    pub fn named<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a User> + 'a {
        self.by_token.values().filter(move |u| u.name == name)
    }

    /// The user an `Authorization` header names; `None` answers 401 (fixture 27).
    pub fn authenticate(&self, authorization: Option<&str>) -> Option<&User> {
        let header = authorization?.trim();
        let (scheme, token) = header.split_once(' ')?;
        if !scheme.eq_ignore_ascii_case("bearer") {
            return None;
        }
        self.by_token.get(token.trim())
    }
}

/// What a resource request asks to do, for the authorizer and its 403 message.
pub struct Attributes<'a> {
    pub verb: &'a str,
    pub group: &'a str,
    /// Plural name, without subresource.
    pub resource: &'a str,
    pub subresource: Option<&'a str>,
    pub namespace: Option<&'a str>,
    pub name: Option<&'a str>,
}

impl Attributes<'_> {
    /// `pods` or `immortalcontainers/status`: what rules name.
    pub fn rule_resource(&self) -> String {
        match self.subresource {
            Some(s) => format!("{}/{s}", self.resource),
            None => self.resource.to_string(),
        }
    }

    /// The 403 a real RBAC authorizer answers (fixture 26).
    pub fn forbidden(&self, user: &str) -> ApiError {
        let target = qualified(self.resource, self.group);
        let subject = match self.name {
            Some(n) => format!("{target} {n:?}"),
            None => target,
        };
        let scope = match self.namespace {
            Some(ns) => format!("in the namespace {ns:?}"),
            None => "at the cluster scope".to_string(),
        };
        let message = format!(
            "{subject} is forbidden: User {user:?} cannot {} resource {:?} in API group {:?} {scope}",
            self.verb,
            self.rule_resource(),
            self.group
        );
        let details = Details {
            name: self.name.unwrap_or("").to_string(),
            group: self.group.to_string(),
            kind: self.resource.to_string(),
            ..Details::default()
        };
        ApiError::Forbidden(message, details)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_token_selects_user_and_others_are_unknown() {
        let mut users = Users::default();
        users.add(
            "t1",
            User {
                name: "op".into(),
                rules: Some(vec![Rule::new(&["get", "list"], &["pods"])]),
            },
        );
        assert_eq!(
            users
                .authenticate(Some("Bearer t1"))
                .map(|u| u.name.as_str()),
            Some("op")
        );
        assert!(users.authenticate(Some("Bearer nope")).is_none());
        assert!(users.authenticate(Some("Basic t1")).is_none());
        assert!(users.authenticate(None).is_none());
    }

    #[test]
    fn rules_match_verb_and_resource_with_wildcards() {
        let u = User {
            name: "op".into(),
            rules: Some(vec![
                Rule::new(&["get", "list"], &["pods"]),
                Rule::new(&["*"], &["immortalcontainers/status"]),
            ]),
        };
        assert!(u.allows("list", "pods"));
        assert!(!u.allows("delete", "pods"));
        assert!(u.allows("patch", "immortalcontainers/status"));
        assert!(!u.allows("patch", "immortalcontainers"));
    }

    #[test]
    fn set_rules_replaces_the_rules_of_every_token_of_the_user() {
        let mut users = Users::default();
        for t in ["t1", "t2"] {
            users.add(
                t,
                User {
                    name: "op".into(),
                    rules: Some(vec![Rule::new(&["*"], &["pods"])]),
                },
            );
        }
        assert_eq!(
            users.set_rules("op", &[Rule::new(&["get"], &["leases"])]),
            2
        );
        assert_eq!(users.set_rules("nobody", &[]), 0);
        for t in ["Bearer t1", "Bearer t2"] {
            let u = users.authenticate(Some(t)).expect("known token");
            assert!(!u.allows("list", "pods"));
            assert!(u.allows("get", "leases"));
        }
    }

    #[test]
    fn forbidden_message_matches_fixture_26() {
        let a = Attributes {
            verb: "list",
            group: "",
            resource: "pods",
            subresource: None,
            namespace: None,
            name: None,
        };
        let v = a.forbidden("nobody").to_value();
        assert_eq!(
            v["message"],
            "pods is forbidden: User \"nobody\" cannot list resource \"pods\" in API group \"\" at the cluster scope"
        );
        assert_eq!(v["details"], serde_json::json!({"kind": "pods"}));
    }
}
