//! ServiceAccount tokens (TokenRequest) and the RBAC authorizer over the stored Roles,
//! ClusterRoles and bindings, over HTTPS: what a token may do is what its bindings grant, where
//! they grant it, as a real API server decides; a token dies with its ServiceAccount.

mod common;

use common::{bounded, kubectl, pod_body, start_without_kubelet, Client};
use serde_json::{json, Value};

const RBAC: &str = "/apis/rbac.authorization.k8s.io/v1";
const ROBOT: &str = "system:serviceaccount:op:robot";

fn namespace(admin: &Client, name: &str) {
    let r = admin.post(
        "/api/v1/namespaces",
        &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}),
    );
    assert_eq!(r.code, 201, "{:?}", r.body);
}

fn service_account(admin: &Client, ns: &str, name: &str) -> Value {
    let r = admin.post(
        &format!("/api/v1/namespaces/{ns}/serviceaccounts"),
        &json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}}),
    );
    assert_eq!(r.code, 201, "{:?}", r.body);
    r.body
}

fn token_request(client: &Client, ns: &str, name: &str, spec: Value) -> common::Resp {
    client.post(
        &format!("/api/v1/namespaces/{ns}/serviceaccounts/{name}/token"),
        &json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}),
    )
}

fn token(admin: &Client, ns: &str, name: &str) -> String {
    let r = token_request(admin, ns, name, json!({}));
    assert_eq!(r.code, 201, "{:?}", r.body);
    r.body["status"]["token"].as_str().unwrap().to_string()
}

/// A Role (or ClusterRole, `ns` None) `name` with one rule.
fn role(admin: &Client, ns: Option<&str>, name: &str, rule: Value) {
    let (kind, path) = match ns {
        Some(ns) => ("Role", format!("{RBAC}/namespaces/{ns}/roles")),
        None => ("ClusterRole", format!("{RBAC}/clusterroles")),
    };
    let body = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind,
        "metadata": {"name": name}, "rules": [rule]});
    let r = admin.post(&path, &body);
    assert_eq!(r.code, 201, "{:?}", r.body);
}

/// A RoleBinding in `ns` (or ClusterRoleBinding, `ns` None) `name` of `role_kind` `role` to
/// `subject`.
fn bind(admin: &Client, ns: Option<&str>, name: &str, role_kind: &str, role: &str, subject: Value) {
    let (kind, path) = match ns {
        Some(ns) => (
            "RoleBinding",
            format!("{RBAC}/namespaces/{ns}/rolebindings"),
        ),
        None => ("ClusterRoleBinding", format!("{RBAC}/clusterrolebindings")),
    };
    let body = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind,
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role},
        "subjects": [subject]});
    let r = admin.post(&path, &body);
    assert_eq!(r.code, 201, "{:?}", r.body);
}

fn robot_subject() -> Value {
    json!({"kind": "ServiceAccount", "name": "robot", "namespace": "op"})
}

#[test]
fn a_service_account_token_may_do_what_its_role_grants_in_that_namespace_only() {
    bounded(30, || {
        let (server, admin) = start_without_kubelet();
        for ns in ["op", "a", "b"] {
            namespace(&admin, ns);
        }
        service_account(&admin, "op", "robot");
        role(
            &admin,
            Some("a"),
            "pods",
            json!({"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}),
        );
        bind(
            &admin,
            Some("a"),
            "robot-pods",
            "Role",
            "pods",
            robot_subject(),
        );

        let r = token_request(&admin, "op", "robot", json!({}));
        assert_eq!(r.code, 201, "{:?}", r.body);
        assert_eq!(r.body["kind"], "TokenRequest");
        assert_eq!(r.body["apiVersion"], "authentication.k8s.io/v1");
        assert_eq!(r.body["spec"]["expirationSeconds"], 3600);
        assert!(r.body["status"]["expirationTimestamp"].is_string());
        let robot_token = r.body["status"]["token"].as_str().unwrap().to_string();
        let robot = Client::new(&server, &robot_token);

        assert_eq!(robot.get("/api/v1/namespaces/a/pods").code, 200);
        assert_eq!(robot.get("/apis").code, 200, "discovery is open");
        let r = robot.get("/api/v1/namespaces/b/pods");
        assert_eq!(r.code, 403);
        assert_eq!(
            r.body["message"],
            format!("pods is forbidden: User \"{ROBOT}\" cannot list resource \"pods\" in API group \"\" in the namespace \"b\"")
        );
        let r = robot.get("/api/v1/pods");
        assert_eq!(r.code, 403);
        assert!(
            r.body["message"]
                .as_str()
                .unwrap()
                .ends_with("at the cluster scope"),
            "{:?}",
            r.body
        );
        // Only the verbs granted.
        let r = robot.post("/api/v1/namespaces/a/pods", &pod_body("x", None));
        assert_eq!(r.code, 403, "{:?}", r.body);

        // A ClusterRoleBinding to the account's group grants everywhere.
        role(
            &admin,
            None,
            "pod-lister",
            json!({"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}),
        );
        bind(
            &admin,
            None,
            "op-accounts-list-pods",
            "ClusterRole",
            "pod-lister",
            json!({"kind": "Group", "name": "system:serviceaccounts:op",
                "apiGroup": "rbac.authorization.k8s.io"}),
        );
        assert_eq!(robot.get("/api/v1/pods").code, 200);
        assert_eq!(robot.get("/api/v1/namespaces/b/pods").code, 200);
        // Deleting a binding revokes what it granted from the next request on.
        let r = admin.delete(
            &format!("{RBAC}/clusterrolebindings/op-accounts-list-pods"),
            None,
        );
        assert_eq!(r.code, 200);
        assert_eq!(robot.get("/api/v1/namespaces/b/pods").code, 403);
        assert_eq!(robot.get("/api/v1/namespaces/a/pods").code, 200);

        // The reviews answer as the server authorizes.
        let review = admin.post(
            "/apis/authentication.k8s.io/v1/tokenreviews",
            &json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                "spec": {"token": robot_token}}),
        );
        assert_eq!(review.body["status"]["authenticated"], true);
        assert_eq!(review.body["status"]["user"]["username"], ROBOT);
        let groups = &review.body["status"]["user"]["groups"];
        assert_eq!(
            groups,
            &json!([
                "system:serviceaccounts",
                "system:serviceaccounts:op",
                "system:authenticated"
            ])
        );
        let may = |ns: &str| {
            let r = admin.post(
                "/apis/authorization.k8s.io/v1/subjectaccessreviews",
                &json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                    "spec": {"user": ROBOT, "groups": groups,
                        "resourceAttributes": {"verb": "list", "resource": "pods", "namespace": ns}}}),
            );
            assert_eq!(r.code, 201, "{:?}", r.body);
            r.body["status"]["allowed"] == true
        };
        assert!(may("a"));
        assert!(!may("b"));
        drop(server);
    });
}

#[test]
fn a_token_dies_with_its_service_account_and_is_refused_for_other_audiences() {
    bounded(30, || {
        let (server, admin) = start_without_kubelet();
        namespace(&admin, "op");
        service_account(&admin, "op", "robot");
        let old = Client::new(&server, &token(&admin, "op", "robot"));
        assert_eq!(old.get("/apis").code, 200);
        let r = admin.delete("/api/v1/namespaces/op/serviceaccounts/robot", None);
        assert_eq!(r.code, 200);
        assert_eq!(old.get("/apis").code, 401);
        // An account made again under the name is another account: the old token stays dead.
        service_account(&admin, "op", "robot");
        assert_eq!(old.get("/apis").code, 401);
        let new = Client::new(&server, &token(&admin, "op", "robot"));
        assert_eq!(new.get("/apis").code, 200);

        // A token for another audience is not one for the API server.
        let r = token_request(&admin, "op", "robot", json!({"audiences": ["vault"]}));
        assert_eq!(r.code, 201);
        assert_eq!(r.body["spec"]["audiences"], json!(["vault"]));
        let vault = Client::new(&server, r.body["status"]["token"].as_str().unwrap());
        assert_eq!(vault.get("/apis").code, 401);

        let r = token_request(&admin, "op", "ghost", json!({}));
        assert_eq!(r.code, 404);
        assert_eq!(r.body["message"], "serviceaccounts \"ghost\" not found");
        let r = token_request(&admin, "op", "robot", json!({"expirationSeconds": 599}));
        assert_eq!(r.code, 422);
        assert_eq!(
            r.body["message"],
            "TokenRequest.authentication.k8s.io \"robot\" is invalid: spec.expirationSeconds: Invalid value: 599: may not specify a duration less than 10 minutes"
        );
        // Asking for a token is itself authorized: create on serviceaccounts/token.
        let r = token_request(&new, "op", "robot", json!({}));
        assert_eq!(r.code, 403);
        assert_eq!(
            r.body["message"],
            format!("serviceaccounts \"robot\" is forbidden: User \"{ROBOT}\" cannot create resource \"serviceaccounts/token\" in API group \"\" in the namespace \"op\"")
        );
    });
}

#[test]
fn kubectl_create_token_gets_a_token_that_authenticates_as_the_account() {
    bounded(60, || {
        let (server, admin) = start_without_kubelet();
        namespace(&admin, "op");
        service_account(&admin, "op", "robot");
        let Some((ok, out)) = kubectl(&server, &["create", "token", "robot", "-n", "op"], None)
        else {
            eprintln!("SKIPPED: kubectl is not installed");
            return;
        };
        assert!(ok, "{out}");
        let robot = Client::new(&server, out.trim());
        let r = robot.get("/api/v1/namespaces/op/pods");
        assert_eq!(r.code, 403);
        assert!(
            r.body["message"].as_str().unwrap().contains(ROBOT),
            "{:?}",
            r.body
        );
    });
}
