//! Request building and answer reading, pure functions over strings.

use super::*;
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

/// Where a kind of object lives in the API, as kube-rs's `ApiResource` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resource {
    api_path: &'static str,
    plural: &'static str,
    short: &'static str,
}

impl Resource {
    pub const PODS: Resource = Resource::new("/api/v1", "pods", "pod");
    pub const EVENTS: Resource = Resource::new("/api/v1", "events", "event");
    pub const LEASES: Resource = Resource::new("/apis/coordination.k8s.io/v1", "leases", "lease");
    /// Cluster-scoped and create-only: the metrics endpoint asks who a bearer token is.
    pub const TOKEN_REVIEWS: Resource = Resource::new(
        "/apis/authentication.k8s.io/v1",
        "tokenreviews",
        "tokenreview",
    );
    /// Cluster-scoped and create-only: the metrics endpoint asks whether a user may read it.
    pub const SUBJECT_ACCESS_REVIEWS: Resource = Resource::new(
        "/apis/authorization.k8s.io/v1",
        "subjectaccessreviews",
        "subjectaccessreview",
    );

    /// `api_path`: `/api/v1` for the core group, `/apis/GROUP/VERSION` for the others;
    /// `short`: the singular name logs and metrics labels use.
    pub const fn new(api_path: &'static str, plural: &'static str, short: &'static str) -> Self {
        Resource {
            api_path,
            plural,
            short,
        }
    }
    pub fn plural(self) -> &'static str {
        self.plural
    }
    pub fn short(self) -> &'static str {
        self.short
    }
}

/// `/api/v1/namespaces/NS/pods`, or the cluster-wide `/api/v1/pods` when `ns` is `None`.
pub fn collection_path(res: Resource, ns: Option<&str>) -> String {
    match ns {
        Some(ns) => format!("{}/namespaces/{}/{}", res.api_path, ns, res.plural),
        None => format!("{}/{}", res.api_path, res.plural),
    }
}

pub fn object_path(res: Resource, ns: &str, name: &str) -> String {
    format!("{}/{}", collection_path(res, Some(ns)), name)
}

#[derive(Debug, Clone, Default)]
pub struct ListParams<'a> {
    pub label_selector: Option<&'a str>,
    pub limit: Option<u32>,
    pub continue_token: Option<&'a str>,
}

#[derive(Debug, Clone, Default)]
pub struct WatchParams<'a> {
    pub label_selector: Option<&'a str>,
    pub resource_version: &'a str,
    pub timeout_seconds: u32,
    /// Not sent: how long the watch may be silent before it is given up (zero: no such limit).
    pub idle_timeout: Duration,
}

/// Query string of a LIST (with its leading `?`, or empty).
pub fn list_query(p: &ListParams) -> String {
    let limit = p.limit.map(|l| l.to_string());
    query(&[
        ("labelSelector", p.label_selector),
        ("limit", limit.as_deref()),
        ("continue", p.continue_token),
    ])
}

/// Query string of a WATCH. Bookmarks are always requested: they move our resourceVersion
/// forward while nothing we watch changes, so a restarted watch rarely falls out of history.
pub fn watch_query(p: &WatchParams) -> String {
    query(&[
        ("watch", Some("true")),
        ("labelSelector", p.label_selector),
        (
            "resourceVersion",
            Some(p.resource_version).filter(|v| !v.is_empty()),
        ),
        ("allowWatchBookmarks", Some("true")),
        ("timeoutSeconds", Some(&p.timeout_seconds.to_string())),
    ])
}

/// `?k=v&...` of the pairs that have a value, in order, each value percent-encoded.
fn query(pairs: &[(&str, Option<&str>)]) -> String {
    let mut q = String::new();
    for (k, v) in pairs {
        if let Some(v) = v {
            q.push(if q.is_empty() { '?' } else { '&' });
            q.push_str(k);
            q.push('=');
            q.extend(utf8_percent_encode(v, NOT_UNRESERVED));
        }
    }
    q
}

/// What a query value percent-encodes: all but RFC 3986's unreserved characters.
const NOT_UNRESERVED: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// A DELETE's body: a uid precondition, never to delete a pod that replaced the one we saw.
pub fn delete_body(uid: &str, grace_period_seconds: Option<u32>) -> String {
    let mut body = serde_json::json!({
        "apiVersion": "v1",
        "kind": "DeleteOptions",
        "preconditions": { "uid": uid },
        "propagationPolicy": "Background",
    });
    if let Some(g) = grace_period_seconds {
        body["gracePeriodSeconds"] = g.into();
    }
    body.to_string()
}

/// Parses an error body into a `Status`, or makes one from the code when it is not one.
pub fn parse_status(code: u16, body: &str) -> Status {
    match serde_json::from_str::<Status>(body) {
        Ok(mut s) if !s.reason.is_empty() || s.code != 0 => {
            s.code = if s.code == 0 { code } else { s.code };
            s
        }
        _ => {
            let mut message: String = body.trim().chars().take(200).collect();
            if message.is_empty() {
                message = format!("HTTP {code}");
            }
            Status {
                status: "Failure".into(),
                message,
                reason: reason_for(code).into(),
                code,
                ..Default::default()
            }
        }
    }
}

/// The `StatusReason` Kubernetes uses for an HTTP code.
pub(super) fn reason_for(code: u16) -> &'static str {
    match code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        405 => "MethodNotAllowed",
        409 => "Conflict",
        410 => "Expired",
        415 => "UnsupportedMediaType",
        422 => "Invalid",
        429 => "TooManyRequests",
        500 => "InternalError",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "Unknown",
    }
}

/// `Retry-After` in seconds (the API server only sends the delta-seconds form).
pub(super) fn retry_after(header: Option<&str>) -> Option<Duration> {
    header
        .and_then(|h| h.trim().parse::<u64>().ok())
        .map(Duration::from_secs)
}

/// The texts of a `Warning` header (RFC 7234: `299 - "text"`, several possibly joined by
/// commas), such as `unknown field "spec.x"`; a value that is not one is skipped.
pub fn warning_texts(header: &str) -> Vec<String> {
    let mut texts = Vec::new();
    let mut rest = header;
    // `CODE AGENT "TEXT" ["DATE"]`.
    while let Some(open) = rest.find('"') {
        let head = rest[..open].trim_start_matches([',', ' ']);
        let coded = head
            .split_whitespace()
            .next()
            .is_some_and(|c| c.len() == 3 && c.parse::<u16>().is_ok());
        let Some((text, after)) = quoted(&rest[open..]) else {
            break;
        };
        if coded {
            texts.push(text);
        }
        rest = after.trim_start();
        if rest.starts_with('"') {
            rest = quoted(rest).map_or("", |(_, after)| after);
        }
    }
    texts
}

/// The quoted string `s` starts with, unescaped, and what follows it.
fn quoted(s: &str) -> Option<(String, &str)> {
    let mut text = String::new();
    let mut chars = s.char_indices().skip(1);
    while let Some((i, c)) = chars.next() {
        match c {
            '\\' => text.extend(chars.next().map(|(_, c)| c)),
            '"' => return Some((text, &s[i + 1..])),
            c => text.push(c),
        }
    }
    None
}

#[derive(Debug, Deserialize)]
#[serde(bound(deserialize = "T: Deserialize<'de>"))]
pub struct ListPage<T> {
    #[serde(default)]
    pub metadata: ListMeta,
    /// kube-apiserver answers an empty metadata-only list with `"items": null`.
    #[serde(default = "Vec::new", deserialize_with = "null_as_empty")]
    pub items: Vec<T>,
}

fn null_as_empty<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Ok(Option::<Vec<T>>::deserialize(d)?.unwrap_or_default())
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ListMeta {
    pub resource_version: String,
    #[serde(rename = "continue")]
    pub continue_token: Option<String>,
}

/// Whether a request answered with an error is sent again, and how.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Again {
    /// Once, after a 401, with fresh credentials, which may have expired early (as client-go).
    Refreshed,
    /// After a growing backoff or the server's longer `Retry-After`, for a 429 or 503.
    After(Duration),
    /// No: the error goes back to the caller, whose own back-off takes over.
    No,
}

/// What to do after attempt number `attempt` (from 1) of at most `attempts` was answered with
/// `code` and, maybe, a `Retry-After` of `wait`; `refreshed`: credentials were refreshed once.
pub(super) fn after_failure(
    code: u16,
    attempt: u32,
    attempts: u32,
    refreshed: bool,
    wait: Option<Duration>,
) -> Again {
    if code == 401 && !refreshed {
        return Again::Refreshed;
    }
    if (code == 429 || code == 503) && attempt < attempts {
        let backoff = Duration::from_millis(200 << attempt);
        let wait = wait
            .unwrap_or(backoff)
            .max(backoff.min(Duration::from_secs(1)));
        if wait <= super::MAX_RETRY_AFTER {
            return Again::After(wait);
        }
    }
    Again::No
}
