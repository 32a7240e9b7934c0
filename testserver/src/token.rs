//! TokenRequest (`POST /api/v1/namespaces/NS/serviceaccounts/NAME/token`, a
//! `authentication.k8s.io/v1` TokenRequest): a token for a ServiceAccount, as `kubectl create
//! token` asks for one. The token authenticates as `system:serviceaccount:NS:NAME` (groups
//! `system:serviceaccounts`, `system:serviceaccounts:NS`, `system:authenticated`), is authorized
//! by the Roles and ClusterRoles bound to it (`rbac.rs`), and stops working when it expires or
//! its ServiceAccount is deleted, as a bound token does. Tokens are opaque here, not JWTs.

use crate::auth::{Grants, User};
use crate::http::Request;
use crate::rbac;
use crate::reply::Reply;
use crate::route::Target;
use crate::shared::Shared;
use crate::status::{ApiError, Cause, Details};
use crate::util;
use serde_json::{json, Value};

/// The API server's own audience: a token asked for other audiences only is not for it.
pub const API_AUDIENCE: &str = "https://kubernetes.default.svc.cluster.local";
/// kube-apiserver's default and bounds for `spec.expirationSeconds`.
const DEFAULT_SECONDS: i64 = 3600;
const MIN_SECONDS: i64 = 600;
const MAX_SECONDS: i64 = 1 << 32;

/// Whether `t` is a ServiceAccount's token subresource.
pub fn serves(t: &Target) -> bool {
    t.group.is_empty() && t.resource == "serviceaccounts" && t.sub.as_deref() == Some("token")
}

/// Answers a TokenRequest (already authorized to `create` `serviceaccounts/token`).
pub fn request(shared: &Shared, req: &Request, t: &Target, verb: &str) -> Result<Reply, ApiError> {
    if verb != "create" {
        return Err(ApiError::MethodNotAllowed(
            "the server does not allow this method on the requested resource".into(),
        ));
    }
    let (namespace, name) = (
        t.namespace.as_deref().unwrap_or(""),
        t.name.as_deref().unwrap_or(""),
    );
    let body: Value = if req.body.is_empty() {
        json!({})
    } else {
        serde_json::from_slice(&req.body).map_err(|e| {
            ApiError::BadRequest(format!("couldn't get version/kind; json parse error: {e}"))
        })?
    };
    let spec = &body["spec"];
    let seconds = spec["expirationSeconds"]
        .as_i64()
        .unwrap_or(DEFAULT_SECONDS);
    let too = match seconds {
        s if s < MIN_SECONDS => Some("may not specify a duration less than 10 minutes"),
        s if s > MAX_SECONDS => Some("may not specify a duration larger than 2^32 seconds"),
        _ => None,
    };
    if let Some(detail) = too {
        let details = Details {
            name: name.into(),
            group: "authentication.k8s.io".into(),
            kind: "TokenRequest".into(),
            ..Details::default()
        };
        let cause = Cause::invalid("spec.expirationSeconds", &seconds.to_string(), detail);
        return Err(ApiError::invalid(
            "TokenRequest.authentication.k8s.io",
            details,
            vec![cause],
        ));
    }
    let audiences: Vec<String> = match spec["audiences"].as_array() {
        Some(a) if !a.is_empty() => a
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_string)
            .collect(),
        _ => vec![API_AUDIENCE.into()],
    };
    let uid = {
        let store = shared.read();
        let sa = store
            .get("serviceaccounts", namespace, name)
            .ok_or_else(|| {
                ApiError::NotFound(
                    format!("serviceaccounts {name:?} not found"),
                    Details {
                        name: name.into(),
                        kind: "serviceaccounts".into(),
                        ..Details::default()
                    },
                )
            })?;
        sa["metadata"]["uid"].as_str().unwrap_or("").to_string()
    };
    let token = util::new_token();
    let expires = util::unix_now() + seconds;
    if audiences.iter().any(|a| a == API_AUDIENCE) {
        let user = User {
            name: rbac::service_account_user(namespace, name),
            grants: Grants::ServiceAccount {
                namespace: namespace.into(),
                name: name.into(),
                uid,
                expires,
            },
        };
        let mut users = shared.users.write().unwrap_or_else(|e| e.into_inner());
        users.add(&token, user);
    }
    let answer = json!({
        "kind": "TokenRequest",
        "apiVersion": "authentication.k8s.io/v1",
        "metadata": {"name": name, "namespace": namespace, "creationTimestamp": null},
        "spec": {
            "audiences": audiences,
            "expirationSeconds": seconds,
            "boundObjectRef": spec.get("boundObjectRef").cloned().unwrap_or(Value::Null),
        },
        "status": {"token": token, "expirationTimestamp": util::format_rfc3339(expires)},
    });
    Ok(Reply::Json {
        code: 201,
        body: serde_json::to_vec(&answer).unwrap_or_default(),
        headers: Vec::new(),
    })
}
