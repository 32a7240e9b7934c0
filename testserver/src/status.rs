//! API failures and the `Status` bodies a kube-apiserver answers them with (fixtures 06–27).

use serde::Serialize;
use serde_json::Value;

/// `details` of a `Status`: which object the failure is about. Field order is the real
/// server's (`name`, `group`, `kind`, ...), empty fields are left out as it does.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Details {
    #[serde(skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub group: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub kind: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub uid: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub causes: Vec<Cause>,
    #[serde(rename = "retryAfterSeconds", skip_serializing_if = "Option::is_none")]
    pub retry_after_seconds: Option<u64>,
}

/// One entry of `details.causes` (fixture 07, 13).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Cause {
    /// Empty ones are left out, as Go's `omitempty` on `StatusCause` does (an admission
    /// policy's cause has only a message).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub reason: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub message: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub field: String,
}

impl Cause {
    /// `FieldValueInvalid`: the field has a value, and it is wrong.
    pub fn invalid(field: &str, value: &str, detail: &str) -> Cause {
        Cause {
            reason: "FieldValueInvalid".into(),
            message: format!("Invalid value: {value}: {detail}"),
            field: field.into(),
        }
    }

    /// `FieldValueRequired`: the field is missing or empty.
    pub fn required(field: &str, detail: &str) -> Cause {
        let message = if detail.is_empty() {
            "Required value".to_string()
        } else {
            format!("Required value: {detail}")
        };
        Cause {
            reason: "FieldValueRequired".into(),
            message,
            field: field.into(),
        }
    }

    /// `FieldValueForbidden`: the field may not be set or changed.
    pub fn forbidden(field: &str, detail: &str) -> Cause {
        Cause {
            reason: "FieldValueForbidden".into(),
            message: format!("Forbidden: {detail}"),
            field: field.into(),
        }
    }

    /// `FieldValueNotSupported`: the value is not one of an enumeration.
    pub fn not_supported(field: &str, value: &str, supported: &str) -> Cause {
        Cause {
            reason: "FieldValueNotSupported".into(),
            message: format!("Unsupported value: {value}: supported values: {supported}"),
            field: field.into(),
        }
    }

    /// `FieldValueTooLong`: the value is over a size limit (all annotations together).
    pub fn too_long(field: &str, detail: &str) -> Cause {
        Cause {
            reason: "FieldValueTooLong".into(),
            message: format!("Too long: {detail}"),
            field: field.into(),
        }
    }

    /// `FieldValueNotFound`: the value names something that does not exist (a volume).
    pub fn not_found(field: &str, value: &str) -> Cause {
        Cause {
            reason: "FieldValueNotFound".into(),
            message: format!("Not found: {value}"),
            field: field.into(),
        }
    }

    /// `FieldValueDuplicate`: the value repeats one earlier in a list.
    pub fn duplicate(field: &str, value: &str) -> Cause {
        Cause {
            reason: "FieldValueDuplicate".into(),
            message: format!("Duplicate value: {value}"),
            field: field.into(),
        }
    }

    /// The cause as the top-level message quotes it: `field: message`.
    fn summary(&self) -> String {
        format!("{}: {}", self.field, self.message)
    }
}

/// Why a request failed. Each variant is answered as a `Status` with the HTTP code and
/// `reason` a real kube-apiserver uses; "retried" says what a well-behaved client does.
#[derive(Debug, Clone, PartialEq)]
pub enum ApiError {
    /// 400 BadRequest: the request cannot be understood (malformed JSON, a name or namespace
    /// in the body that differs from the URL, a bad selector). Not retried.
    BadRequest(String),
    /// 401 Unauthorized: no bearer token, or one the server does not know (fixture 27).
    /// Not retried.
    Unauthorized,
    /// 403 Forbidden: the token's rules do not allow the verb on the resource (fixture 26),
    /// or the namespace is terminating. Not retried.
    Forbidden(String, Details),
    /// 404 NotFound: no such object, namespace or resource (fixtures 09, 15). Not retried.
    NotFound(String, Details),
    /// 409 AlreadyExists: create of a name that exists (fixtures 06, 12). Not retried.
    AlreadyExists(String, Details),
    /// 409 Conflict: a resourceVersion or uid precondition does not hold (fixtures 19, 24).
    /// Retried after re-reading the object.
    Conflict(String, Details),
    /// 422 Invalid: the object fails validation; `details.causes` says where (fixtures 07,
    /// 13). Not retried.
    Invalid(String, Details),
    /// 410 Expired: a resourceVersion older than the retained history (fixture 28, sent
    /// in-stream for watches). Retried by relisting.
    Expired(String),
    /// 415 UnsupportedMediaType: a patch type the resource does not take (fixture 20). Not
    /// retried.
    UnsupportedMediaType(String),
    /// 405 MethodNotAllowed: a verb the resource does not serve. Not retried.
    MethodNotAllowed(String),
    /// 406 NotAcceptable: the `Accept` header asks for a form the answer cannot take (a
    /// metadata list of one object). Not retried.
    NotAcceptable(String),
    /// 413 RequestEntityTooLarge: a body over the 3 MiB limit of kube-apiserver. Not retried.
    TooLarge,
    /// Any status injected with `TestServer::fail_next` (500, 503, 429, ...), with an optional
    /// `Retry-After`. Retried, after `Retry-After` when given.
    Injected { code: u16, retry_after: Option<u64> },
    /// 500 InternalError: what the real server answers to, e.g., a create that carries a
    /// resourceVersion. Retried with backoff by clients, fails again here.
    Internal(String),
    /// A refusal by a ValidatingAdmissionPolicy: the message says "is forbidden", while the
    /// reason and code are the validation's (`Invalid` 422 unless it names another; fixture
    /// kube-1.28-kubelet/17). Not retried: it lasts until the policy or binding changes.
    Admission {
        code: u16,
        reason: String,
        message: String,
        details: Details,
    },
}

#[derive(Serialize)]
struct StatusBody<'a> {
    kind: &'static str,
    #[serde(rename = "apiVersion")]
    api_version: &'static str,
    metadata: serde_json::Map<String, Value>,
    status: &'static str,
    message: &'a str,
    reason: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    details: Option<&'a Details>,
    code: u16,
}

impl ApiError {
    /// 422 Invalid for `kind_label` (`Pod`, `ImmortalContainer.immortalcontainer.flugel.it`)
    /// named `name`: the message quotes one cause, or several in brackets (fixture 07), each
    /// once however often it repeats in `causes`, as Go's `ErrorList.ToAggregate` does
    /// (fixture kube-1.28-kubelet/18).
    pub fn invalid(kind_label: &str, mut details: Details, causes: Vec<Cause>) -> ApiError {
        let mut said: Vec<String> = Vec::new();
        for summary in causes.iter().map(Cause::summary) {
            if !said.contains(&summary) {
                said.push(summary);
            }
        }
        let summary = match said.as_slice() {
            [one] => one.clone(),
            many => format!("[{}]", many.join(", ")),
        };
        let message = format!("{kind_label} {:?} is invalid: {summary}", details.name);
        details.causes = causes;
        ApiError::Invalid(message, details)
    }

    /// The HTTP status code.
    pub fn code(&self) -> u16 {
        match self {
            ApiError::BadRequest(_) => 400,
            ApiError::Unauthorized => 401,
            ApiError::Forbidden(..) => 403,
            ApiError::NotFound(..) => 404,
            ApiError::MethodNotAllowed(_) => 405,
            ApiError::NotAcceptable(_) => 406,
            ApiError::AlreadyExists(..) | ApiError::Conflict(..) => 409,
            ApiError::Expired(_) => 410,
            ApiError::TooLarge => 413,
            ApiError::UnsupportedMediaType(_) => 415,
            ApiError::Invalid(..) => 422,
            ApiError::Injected { code, .. } => *code,
            ApiError::Internal(_) => 500,
            ApiError::Admission { code, .. } => *code,
        }
    }

    /// `Retry-After` seconds to send as a header, if any.
    pub fn retry_after(&self) -> Option<u64> {
        match self {
            ApiError::Injected { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// The `Status` object, serialized.
    pub fn to_json(&self) -> Vec<u8> {
        let empty = Details::default();
        let injected_details;
        let (message, reason, details): (String, &str, Option<&Details>) = match self {
            ApiError::BadRequest(m) => (m.clone(), "BadRequest", None),
            ApiError::Unauthorized => ("Unauthorized".into(), "Unauthorized", None),
            ApiError::Forbidden(m, d) => (m.clone(), "Forbidden", Some(d)),
            ApiError::NotFound(m, d) => (m.clone(), "NotFound", Some(d)),
            ApiError::AlreadyExists(m, d) => (m.clone(), "AlreadyExists", Some(d)),
            ApiError::Conflict(m, d) => (m.clone(), "Conflict", Some(d)),
            ApiError::Invalid(m, d) => (m.clone(), "Invalid", Some(d)),
            ApiError::Expired(m) => (m.clone(), "Expired", None),
            ApiError::UnsupportedMediaType(m) => (m.clone(), "UnsupportedMediaType", None),
            ApiError::MethodNotAllowed(m) => (m.clone(), "MethodNotAllowed", None),
            ApiError::NotAcceptable(m) => (m.clone(), "NotAcceptable", None),
            ApiError::TooLarge => (
                "the request is too large".into(),
                "RequestEntityTooLarge",
                None,
            ),
            ApiError::Injected { code, retry_after } => {
                let (reason, message) = injected_reason(*code);
                injected_details = Details {
                    retry_after_seconds: *retry_after,
                    ..empty.clone()
                };
                let details = retry_after.map(|_| &injected_details);
                (message.to_string(), reason, details)
            }
            ApiError::Internal(m) => (
                format!("Internal error occurred: {m}"),
                "InternalError",
                None,
            ),
            ApiError::Admission {
                reason,
                message,
                details,
                ..
            } => (message.clone(), reason.as_str(), Some(details)),
        };
        let body = StatusBody {
            kind: "Status",
            api_version: "v1",
            metadata: serde_json::Map::new(),
            status: "Failure",
            message: &message,
            reason,
            details,
            code: self.code(),
        };
        serde_json::to_vec(&body).unwrap_or_default()
    }

    /// The `Status` as a JSON value, for in-stream watch `ERROR` events (fixture 28).
    pub fn to_value(&self) -> Value {
        serde_json::from_slice(&self.to_json()).unwrap_or(Value::Null)
    }
}

/// The `reason` and message kube-apiserver uses with an HTTP status it can produce on its own.
fn injected_reason(code: u16) -> (&'static str, &'static str) {
    match code {
        429 => ("TooManyRequests", "Too many requests, please try again later."),
        503 => ("ServiceUnavailable", "the server is currently unable to handle the request"),
        504 => ("Timeout", "the server was unable to return a response in the time allotted"),
        409 => ("Conflict", "the object has been modified; please apply your changes to the latest version and try again"),
        404 => ("NotFound", "the server could not find the requested resource"),
        410 => ("Expired", "the resource version is too old"),
        _ => ("InternalError", "Internal error occurred: injected failure"),
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", String::from_utf8_lossy(&self.to_json()))
    }
}

impl std::error::Error for ApiError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_with_two_causes_brackets_them_like_fixture_07() {
        let d = Details {
            name: "bad".into(),
            group: "immortalcontainer.flugel.it".into(),
            kind: "ImmortalContainer".into(),
            ..Details::default()
        };
        let e = ApiError::invalid(
            "ImmortalContainer.immortalcontainer.flugel.it",
            d,
            vec![
                Cause::invalid(
                    "spec.image",
                    "\"null\"",
                    "spec.image in body must be of type string: \"null\"",
                ),
                Cause::invalid(
                    "spec.image",
                    "\"\"",
                    "spec.image in body should be at least 1 chars long",
                ),
            ],
        );
        let v = e.to_value();
        assert_eq!(v["code"], 422);
        assert_eq!(v["reason"], "Invalid");
        assert_eq!(
            v["message"],
            "ImmortalContainer.immortalcontainer.flugel.it \"bad\" is invalid: [spec.image: Invalid value: \"null\": spec.image in body must be of type string: \"null\", spec.image: Invalid value: \"\": spec.image in body should be at least 1 chars long]"
        );
        assert_eq!(v["details"]["causes"].as_array().map(Vec::len), Some(2));
    }

    #[test]
    fn injected_429_carries_retry_after_in_details() {
        let v = ApiError::Injected {
            code: 429,
            retry_after: Some(3),
        }
        .to_value();
        assert_eq!(v["reason"], "TooManyRequests");
        assert_eq!(v["details"]["retryAfterSeconds"], 3);
        assert_eq!(v["metadata"], serde_json::json!({}));
    }
}
