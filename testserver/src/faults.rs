//! Fault injection (failing the next matching requests, added latency) and request counters.

use crate::status::ApiError;
use std::collections::BTreeMap;
use std::time::Duration;

/// Makes the next `count` requests that match fail with `status` (and a `Status` body with
/// the reason the real server uses for it: InternalError, ServiceUnavailable,
/// TooManyRequests...), with a `Retry-After` header when `retry_after` is set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailRule {
    pub count: u32,
    pub status: u16,
    pub retry_after: Option<u64>,
    /// Only requests with this verb: get, list, watch, create, update, patch, delete.
    pub verb: Option<String>,
    /// Only requests whose path (with query) contains this.
    pub path_contains: Option<String>,
}

impl Default for FailRule {
    /// One request, any verb and path, answered 500.
    fn default() -> Self {
        FailRule {
            count: 1,
            status: 500,
            retry_after: None,
            verb: None,
            path_contains: None,
        }
    }
}

/// Pending failures and latency, behind one mutex in the server.
#[derive(Debug, Default)]
pub struct Faults {
    rules: Vec<FailRule>,
    pub latency: Duration,
}

impl Faults {
    pub fn add(&mut self, rule: FailRule) {
        if rule.count > 0 {
            self.rules.push(rule);
        }
    }

    /// The injected failure for this request, if a rule matches; uses up one of its count.
    /// Rules are tried in the order they were added.
    pub fn take(&mut self, verb: &str, target: &str) -> Option<ApiError> {
        let i = self.rules.iter().position(|r| {
            r.verb.as_deref().map_or(true, |v| v == verb)
                && r.path_contains
                    .as_deref()
                    .map_or(true, |p| target.contains(p))
        })?;
        let rule = &mut self.rules[i];
        let err = ApiError::Injected {
            code: rule.status,
            retry_after: rule.retry_after,
        };
        rule.count -= 1;
        if rule.count == 0 {
            self.rules.remove(i);
        }
        Some(err)
    }
}

/// Handled requests by `(verb, resource)`.
pub type Counts = BTreeMap<(String, String), u64>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rule_fails_exactly_count_matching_requests() {
        let mut f = Faults::default();
        f.add(FailRule {
            count: 2,
            status: 503,
            verb: Some("list".into()),
            ..FailRule::default()
        });
        assert!(f.take("get", "/api/v1/pods").is_none());
        assert_eq!(f.take("list", "/api/v1/pods").map(|e| e.code()), Some(503));
        assert!(f.take("list", "/api/v1/pods").is_some());
        assert!(f.take("list", "/api/v1/pods").is_none());
    }

    #[test]
    fn path_filter_and_retry_after_carry_through() {
        let mut f = Faults::default();
        f.add(FailRule {
            status: 429,
            retry_after: Some(2),
            path_contains: Some("leases".into()),
            ..FailRule::default()
        });
        assert!(f.take("get", "/api/v1/pods").is_none());
        let e = f
            .take(
                "get",
                "/apis/coordination.k8s.io/v1/namespaces/default/leases/x",
            )
            .expect("fails");
        assert_eq!(e.retry_after(), Some(2));
    }
}
