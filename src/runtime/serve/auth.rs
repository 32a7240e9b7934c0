//! Who may read `/metrics`: a TokenReview of the bearer token and a SubjectAccessReview for its
//! user, as controller-runtime's `WithAuthenticationAndAuthorization` filter does. Decisions are
//! cached by the token's digest, so that a scrape does not cost two API requests.

use crate::kube::client::{self, Client, Resource};
use crate::util;
use serde_json::{json, Value};
use std::fmt;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The path the reviews ask about, and the verb (controller-runtime: the lower-cased method).
pub const PATH: &str = "/metrics";
const VERB: &str = "get";

/// How long a decision is reused: controller-runtime's TTLs.
const ALLOW_TTL: Duration = Duration::from_secs(60);
const DENY_TTL: Duration = Duration::from_secs(30);
/// Tokens remembered at most: enough for the scrapers; made-up tokens the cache cannot help.
const CACHE_ENTRIES: usize = 64;

/// The answer to one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The API server authenticated the token and allows its user `get` on `/metrics`.
    Allowed { user: String },
    /// No bearer token, or one the API server does not authenticate: 401.
    Unauthenticated,
    /// Authenticated as `user`, who may not `get` `/metrics`: 403.
    Forbidden { user: String },
}

/// A review that got no answer: the request is answered 500 and nothing is cached.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The TokenReview failed: the API server is unreachable or slow, or refused us (RBAC).
    TokenReview(client::Error),
    /// The SubjectAccessReview for `user` failed, for the same reasons.
    AccessReview { user: String, error: client::Error },
    /// The request's deadline passed before a review could be sent.
    Deadline,
}

impl Error {
    /// The operator itself was refused the review: its RBAC is missing, not a passing fault.
    pub fn is_denied(&self) -> bool {
        match self {
            Error::TokenReview(e) | Error::AccessReview { error: e, .. } => {
                e.is_forbidden() || e.is_unauthorized()
            }
            Error::Deadline => false,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::TokenReview(e) => write!(f, "token review failed: {e}"),
            Error::AccessReview { user, error } => {
                write!(f, "access review for user {user:?} failed: {error}")
            }
            Error::Deadline => f.write_str("request deadline passed before the review"),
        }
    }
}

impl std::error::Error for Error {}

struct Entry {
    token_digest: [u8; 32],
    verdict: Verdict,
    expires: Instant,
}

/// Decides requests to the metrics endpoint. Shared by its connection threads.
pub struct MetricsAuth {
    client: Client,
    cache: Mutex<Vec<Entry>>,
}

impl MetricsAuth {
    pub fn new(client: Client) -> MetricsAuth {
        MetricsAuth {
            client,
            cache: Mutex::new(Vec::new()),
        }
    }

    /// The verdict for the `authorization` header: the API server's by `deadline`, or cached.
    pub fn check(&self, authorization: Option<&str>, deadline: Instant) -> Result<Verdict, Error> {
        let Some(token) = authorization.and_then(bearer_token) else {
            return Ok(Verdict::Unauthenticated);
        };
        let digest = token_digest(token);
        if let Some(v) = self.cached(&digest) {
            return Ok(v);
        }
        let verdict = self.review(token, deadline)?;
        let ttl = match verdict {
            Verdict::Allowed { .. } => ALLOW_TTL,
            _ => DENY_TTL,
        };
        self.remember(digest, verdict.clone(), ttl);
        Ok(verdict)
    }

    /// Asks the API server who this token is, and whether that user may `get` /metrics. The
    /// answers are read as JSON values: the same reading as derived types, in less binary.
    fn review(&self, token: &str, deadline: Instant) -> Result<Verdict, Error> {
        let token_review = json!({
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": { "token": token },
        });
        let answer: Value = self
            .within(deadline)?
            .create_cluster_scoped(Resource::TOKEN_REVIEWS, &token_review)
            .map_err(Error::TokenReview)?;
        // `authenticated` is left out of the answer when false, as Go's omitempty does.
        let status = &answer["status"];
        if status["authenticated"] != Value::Bool(true) {
            return Ok(Verdict::Unauthenticated);
        }
        let user = &status["user"];
        let username = user["username"].as_str().unwrap_or("").to_string();
        let mut access_review = json!({
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": user["username"],
                "uid": user["uid"],
                "groups": user["groups"],
                "extra": user["extra"],
                "nonResourceAttributes": { "path": PATH, "verb": VERB },
            },
        });
        // Who the token is (authentication.k8s.io/v1 UserInfo) passed on as is, less what it lacks.
        if let Some(spec) = access_review["spec"].as_object_mut() {
            spec.retain(|_, v| !v.is_null());
        }
        let answer: Value = self
            .within(deadline)?
            .create_cluster_scoped(Resource::SUBJECT_ACCESS_REVIEWS, &access_review)
            .map_err(|error| Error::AccessReview {
                user: username.clone(),
                error,
            })?;
        Ok(if answer["status"]["allowed"] == Value::Bool(true) {
            Verdict::Allowed { user: username }
        } else {
            Verdict::Forbidden { user: username }
        })
    }

    /// The client with what is left until `deadline` as its timeout, and no sleep on a 429.
    fn within(&self, deadline: Instant) -> Result<Client, Error> {
        if deadline <= Instant::now() {
            return Err(Error::Deadline);
        }
        Ok(self.client.until(deadline))
    }

    fn cached(&self, digest: &[u8; 32]) -> Option<Verdict> {
        let cache = util::lock(&self.cache);
        let now = Instant::now();
        cache
            .iter()
            .find(|e| &e.token_digest == digest && e.expires > now)
            .map(|e| e.verdict.clone())
    }

    fn remember(&self, token_digest: [u8; 32], verdict: Verdict, ttl: Duration) {
        let mut cache = util::lock(&self.cache);
        let now = Instant::now();
        cache.retain(|e| e.expires > now && e.token_digest != token_digest);
        if cache.len() >= CACHE_ENTRIES {
            // Full of live entries: drop the one that would expire first.
            if let Some(i) = (0..cache.len()).min_by_key(|&i| cache[i].expires) {
                cache.swap_remove(i);
            }
        }
        cache.push(Entry {
            token_digest,
            verdict,
            expires: now + ttl,
        });
    }
}

/// The token of `Bearer TOKEN` (scheme case-insensitive, as the API server reads it).
fn bearer_token(header: &str) -> Option<&str> {
    let (scheme, token) = header.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

fn token_digest(token: &str) -> [u8; 32] {
    let d = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
    d.as_ref().try_into().expect("a SHA-256 digest is 32 bytes")
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube_testserver::{Rule, TestServer};

    /// A test server where `reader` may get /metrics and `nobody` may do nothing, and the
    /// operator's client (the admin: it may create both reviews).
    fn cluster() -> (TestServer, MetricsAuth) {
        let server = crate::testutil::server_with_metrics_reader();
        let client = crate::testutil::client_of(&server.kubeconfig_path());
        (server, MetricsAuth::new(client))
    }

    fn reviews(server: &TestServer) -> (u64, u64) {
        let counts = server.request_counts();
        let n = |r: &str| {
            counts
                .get(&("create".to_string(), r.to_string()))
                .copied()
                .unwrap_or(0)
        };
        (n("tokenreviews"), n("subjectaccessreviews"))
    }

    fn soon() -> Instant {
        Instant::now() + Duration::from_secs(10)
    }

    #[test]
    fn a_reader_is_allowed_a_stranger_forbidden_and_an_unknown_token_unauthenticated() {
        let (server, auth) = cluster();
        assert_eq!(
            auth.check(Some("Bearer reader"), soon()).unwrap(),
            Verdict::Allowed {
                user: "prometheus".into()
            }
        );
        assert_eq!(
            auth.check(Some("bearer nobody"), soon()).unwrap(),
            Verdict::Forbidden {
                user: "nobody".into()
            }
        );
        assert_eq!(
            auth.check(Some("Bearer made-up"), soon()).unwrap(),
            Verdict::Unauthenticated
        );
        // An unknown token is not asked about access at all.
        assert_eq!(reviews(&server), (3, 2));
    }

    #[test]
    fn requests_without_a_bearer_token_are_refused_without_asking_the_api_server() {
        let (server, auth) = cluster();
        for header in [
            None,
            Some(""),
            Some("Basic cmVhZGVy"),
            Some("Bearer "),
            Some("Bearer"),
        ] {
            assert_eq!(
                auth.check(header, soon()).unwrap(),
                Verdict::Unauthenticated,
                "{header:?}"
            );
        }
        assert_eq!(reviews(&server), (0, 0));
    }

    #[test]
    fn a_decision_is_reused_for_the_same_token_within_its_ttl() {
        let (server, auth) = cluster();
        for _ in 0..3 {
            assert!(matches!(
                auth.check(Some("Bearer reader"), soon()),
                Ok(Verdict::Allowed { .. })
            ));
            assert!(matches!(
                auth.check(Some("Bearer nobody"), soon()),
                Ok(Verdict::Forbidden { .. })
            ));
        }
        assert_eq!(reviews(&server), (2, 2));
    }

    #[test]
    fn a_failed_review_is_a_500_not_a_cached_denial() {
        let (server, auth) = cluster();
        server.fail_next(kube_testserver::FailRule {
            count: 1,
            status: 500,
            retry_after: None,
            verb: Some("create".into()),
            path_contains: Some("tokenreviews".into()),
        });
        let err = auth.check(Some("Bearer reader"), soon()).unwrap_err();
        assert!(
            matches!(err, Error::TokenReview(_)) && !err.is_denied(),
            "{err}"
        );
        // Asked again, and this time answered.
        assert!(matches!(
            auth.check(Some("Bearer reader"), soon()),
            Ok(Verdict::Allowed { .. })
        ));
    }

    #[test]
    fn an_operator_without_rbac_for_reviews_gets_an_error_that_says_so() {
        let (server, _) = cluster();
        server.add_user("operator", "op", vec![Rule::new(&["*"], &["pods"])]);
        let path =
            std::env::temp_dir().join(format!("metrics-auth-{}.kubeconfig", std::process::id()));
        server.write_kubeconfig(&path, "op").unwrap();
        let auth = MetricsAuth::new(crate::testutil::client_of(&path));
        let _ = std::fs::remove_file(&path);
        let err = auth.check(Some("Bearer reader"), soon()).unwrap_err();
        assert!(err.is_denied(), "{err}");
    }

    #[test]
    fn a_passed_deadline_sends_no_review() {
        let (server, auth) = cluster();
        let err = auth
            .check(Some("Bearer reader"), Instant::now())
            .unwrap_err();
        assert!(matches!(err, Error::Deadline), "{err}");
        assert_eq!(reviews(&server), (0, 0));
    }

    #[test]
    fn the_cache_stays_bounded_under_made_up_tokens() {
        let auth = MetricsAuth::new(cluster().1.client);
        for i in 0..(CACHE_ENTRIES * 3) {
            auth.remember(
                token_digest(&i.to_string()),
                Verdict::Unauthenticated,
                DENY_TTL,
            );
        }
        assert_eq!(auth.cache.lock().unwrap().len(), CACHE_ENTRIES);
        // The newest is kept.
        let last = token_digest(&(CACHE_ENTRIES * 3 - 1).to_string());
        assert_eq!(auth.cached(&last), Some(Verdict::Unauthenticated));
    }
}
