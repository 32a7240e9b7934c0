//! Bearer-token authentication and authorization. Each token is the admin's (everything), a
//! user's of `add_user` (allow rules of verbs × resources, and whatever the stored RBAC objects
//! grant that user), or a ServiceAccount's, issued by a TokenRequest (what the stored Roles and
//! ClusterRoles bound to it grant: `rbac.rs`). Discovery and /version are open to every
//! authenticated user, as the `system:discovery` role makes them on real clusters.

use crate::rbac::{self, Ask, Subject};
use crate::resources::qualified;
use crate::status::{ApiError, Details};
use crate::store::Store;
use std::collections::HashMap;
use std::ops::Deref;

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

    /// Whether the rule allows what `ask` asks: `pods/status` names a subresource; a
    /// non-resource URL matches exactly or, ending in `*`, as a prefix (`*` among resources
    /// does not cover URLs, as in RBAC).
    fn allows(&self, ask: &Ask) -> bool {
        let any = |list: &[String], x: &str| list.iter().any(|r| r == "*" || r == x);
        match ask {
            Ask::Resource {
                verb,
                resource,
                subresource,
                ..
            } => {
                let resource = match subresource {
                    Some(sub) => format!("{resource}/{sub}"),
                    None => resource.to_string(),
                };
                any(&self.verbs, verb) && any(&self.resources, &resource)
            }
            Ask::NonResource { verb, path } => {
                any(&self.verbs, verb)
                    && self
                        .resources
                        .iter()
                        .any(|url| match url.strip_suffix('*') {
                            _ if !url.starts_with('/') => false,
                            Some(prefix) => path.starts_with(prefix),
                            None => url == path,
                        })
            }
        }
    }
}

/// What a token may do.
#[derive(Debug, Clone)]
pub enum Grants {
    /// The admin, as cluster-admin: everything.
    All,
    /// `add_user`'s allow rules (as a ClusterRole bound to the user would), and what the stored
    /// RBAC objects grant the user besides.
    Rules(Vec<Rule>),
    /// A ServiceAccount's token (TokenRequest): what the stored RBAC objects grant it, while
    /// the account exists with this uid and until the token expires.
    ServiceAccount {
        namespace: String,
        name: String,
        uid: String,
        /// Unix seconds.
        expires: i64,
    },
}

/// A known token's identity.
#[derive(Debug, Clone)]
pub struct User {
    pub name: String,
    pub grants: Grants,
}

impl User {
    /// The user's groups, as a TokenReview reports them.
    pub fn groups(&self) -> Vec<String> {
        match &self.grants {
            Grants::ServiceAccount { namespace, .. } => rbac::service_account_groups(namespace),
            _ => vec!["system:authenticated".into()],
        }
    }

    /// Whether the token is still good: a ServiceAccount's dies with its account (a bound
    /// token names the account's uid) and when it expires; the others never do. `store` is
    /// read only for a ServiceAccount's.
    pub fn valid<S: Deref<Target = Store>>(&self, now: i64, store: impl FnOnce() -> S) -> bool {
        let Grants::ServiceAccount {
            namespace,
            name,
            uid,
            expires,
        } = &self.grants
        else {
            return true;
        };
        now < *expires
            && store()
                .get("serviceaccounts", namespace, name)
                .is_some_and(|sa| sa["metadata"]["uid"].as_str() == Some(uid))
    }

    /// Whether the user may do what `ask` asks: the admin anything; a user of `add_user` what
    /// its own rules allow, or else what RBAC objects grant it; a ServiceAccount what they
    /// grant it. `store` is read only when the RBAC objects decide.
    pub fn allows<S: Deref<Target = Store>>(&self, ask: &Ask, store: impl FnOnce() -> S) -> bool {
        match &self.grants {
            Grants::All => true,
            Grants::Rules(rules) if rules.iter().any(|r| r.allows(ask)) => true,
            _ => {
                let groups = self.groups();
                let who = Subject {
                    user: &self.name,
                    groups: &groups,
                };
                rbac::allows(&store(), who, ask)
            }
        }
    }
}

/// Token to user.
#[derive(Debug, Default, Clone)]
pub struct Users {
    by_token: HashMap<String, User>,
}

impl Users {
    pub fn add(&mut self, token: &str, user: User) {
        self.by_token.insert(token.to_string(), user);
    }

    /// Replaces the allow rules of every token of user `name` (`add_user`'s), as editing the
    /// ClusterRole bound to that user does; returns how many tokens were changed (0: none).
    pub fn set_rules(&mut self, name: &str, rules: &[Rule]) -> usize {
        let mut changed = 0;
        for user in self.by_token.values_mut().filter(|u| u.name == name) {
            if let Grants::Rules(r) = &mut user.grants {
                *r = rules.to_vec();
                changed += 1;
            }
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

impl<'a> Attributes<'a> {
    /// What the authorizer is asked.
    pub fn ask(&self) -> Ask<'a> {
        Ask::Resource {
            verb: self.verb,
            group: self.group,
            resource: self.resource,
            subresource: self.subresource,
            namespace: self.namespace,
            name: self.name,
        }
    }

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

    fn rules(rules: Vec<Rule>) -> Grants {
        Grants::Rules(rules)
    }

    /// Whether `u`'s own rules allow `verb` on `resource` (`x/sub` for a subresource), no RBAC
    /// object stored.
    fn may(u: &User, verb: &str, resource: &str) -> bool {
        let (resource, subresource) = match resource.split_once('/') {
            Some((r, s)) => (r, Some(s)),
            None => (resource, None),
        };
        let ask = Ask::Resource {
            verb,
            group: "",
            resource,
            subresource,
            namespace: Some("ns"),
            name: None,
        };
        let (gc, _) = std::sync::mpsc::channel();
        let store = Store::new(10, gc);
        u.allows(&ask, || &store)
    }

    #[test]
    fn bearer_token_selects_user_and_others_are_unknown() {
        let mut users = Users::default();
        users.add(
            "t1",
            User {
                name: "op".into(),
                grants: rules(vec![Rule::new(&["get", "list"], &["pods"])]),
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
            grants: rules(vec![
                Rule::new(&["get", "list"], &["pods"]),
                Rule::new(&["*"], &["immortalcontainers/status"]),
            ]),
        };
        assert!(may(&u, "list", "pods"));
        assert!(!may(&u, "delete", "pods"));
        assert!(may(&u, "patch", "immortalcontainers/status"));
        assert!(!may(&u, "patch", "immortalcontainers"));
    }

    #[test]
    fn set_rules_replaces_the_rules_of_every_token_of_the_user() {
        let mut users = Users::default();
        for t in ["t1", "t2"] {
            users.add(
                t,
                User {
                    name: "op".into(),
                    grants: rules(vec![Rule::new(&["*"], &["pods"])]),
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
            assert!(!may(u, "list", "pods"));
            assert!(may(u, "get", "leases"));
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
