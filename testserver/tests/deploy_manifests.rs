//! The kinds `config/default` holds (what `make deploy` applies and `make undeploy` deletes):
//! kubectl renders, applies, lists and deletes the real manifests against the test server, and
//! over HTTPS the stored kinds keep the metadata rules of every kind (generation, status
//! subresource, owner references and the garbage collector, namespace deletion), with no
//! behaviour but this: their RBAC objects grant what they say (`rbac.rs` tests the authorizer).

mod common;

use common::{bounded, kubectl, wait_for, Client};
use kube_testserver::{Options, Rule, TestServer};
use serde::Deserialize;
use serde_json::{json, Value};

const NS: &str = "immortalcontainers-operator";
const RBAC: &str = "/apis/rbac.authorization.k8s.io/v1";
const APPS: &str = "/apis/apps/v1";

fn config_default() -> String {
    concat!(env!("CARGO_MANIFEST_DIR"), "/../config/default").to_string()
}

/// `config/default` rendered by `kubectl kustomize`, or `None` when kubectl is not installed.
fn rendered(server: &TestServer) -> Option<String> {
    let (ok, out) = kubectl(server, &["kustomize", &config_default()], None)?;
    assert!(ok, "kubectl kustomize: {out}");
    Some(out)
}

fn documents(yaml: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(yaml)
        .map(|d| Value::deserialize(d).expect("manifest yaml"))
        .filter(|v| v.is_object())
        .collect()
}

/// The API path of a manifest's object. A kind missing here is one `make deploy` would need
/// the test server to serve first.
fn object_path(doc: &Value) -> String {
    let api_version = doc["apiVersion"].as_str().unwrap_or("");
    let kind = doc["kind"].as_str().unwrap_or("");
    let name = doc["metadata"]["name"].as_str().unwrap_or("");
    let ns = doc["metadata"]["namespace"].as_str();
    let plural = match kind {
        "Namespace" => "namespaces",
        "ServiceAccount" => "serviceaccounts",
        "Service" => "services",
        "CustomResourceDefinition" => "customresourcedefinitions",
        "ClusterRole" => "clusterroles",
        "ClusterRoleBinding" => "clusterrolebindings",
        "Role" => "roles",
        "RoleBinding" => "rolebindings",
        "Deployment" => "deployments",
        "NetworkPolicy" => "networkpolicies",
        other => panic!("config/default holds {other}, which this test does not know"),
    };
    let root = if api_version.contains('/') {
        format!("/apis/{api_version}")
    } else {
        format!("/api/{api_version}")
    };
    match ns {
        Some(ns) => format!("{root}/namespaces/{ns}/{plural}/{name}"),
        None => format!("{root}/{plural}/{name}"),
    }
}

fn start(install_crd: bool) -> TestServer {
    TestServer::start(Options {
        install_crd,
        ..Options::default()
    })
    .expect("server starts")
}

#[test]
fn kubectl_applies_lists_and_deletes_config_default_and_a_second_delete_is_a_no_op() {
    bounded(120, || {
        // A fresh cluster: the CRD comes with the manifests, as `make deploy` installs it.
        let server = start(false);
        let Some(yaml) = rendered(&server) else {
            eprintln!("kubectl not installed; skipping");
            return;
        };
        let docs = documents(&yaml);
        assert!(docs.len() >= 10, "{yaml}");

        let (ok, out) = kubectl(&server, &["apply", "-f", "-"], Some(&yaml)).expect("kubectl");
        assert!(ok, "{out}");
        assert_eq!(out.matches(" created").count(), docs.len(), "{out}");
        for doc in &docs {
            let path = object_path(doc);
            let obj = server
                .get_json(&path)
                .unwrap_or_else(|| panic!("{path} exists"));
            let meta = &obj["metadata"];
            assert!(meta["uid"].is_string() && meta["creationTimestamp"].is_string());
            assert!(
                meta["annotations"]["kubectl.kubernetes.io/last-applied-configuration"].is_string()
            );
            for (k, v) in doc["metadata"]["labels"].as_object().into_iter().flatten() {
                assert_eq!(&meta["labels"][k], v, "{path} label {k}");
            }
        }
        let deploy = server
            .get_json(&format!(
                "{APPS}/namespaces/{NS}/deployments/immortal-operator"
            ))
            .expect("deployment");
        assert_eq!(deploy["metadata"]["generation"], 1);
        assert_eq!(deploy["status"], json!({}), "no controller reports on it");

        let (ok, out) = kubectl(&server, &["apply", "-f", "-"], Some(&yaml)).expect("kubectl");
        assert!(ok, "{out}");
        assert_eq!(out.matches(" unchanged").count(), docs.len(), "{out}");

        let (ok, out) = kubectl(
            &server,
            &["get", "deploy,sa,svc,netpol,role,rolebinding", "-n", NS],
            None,
        )
        .expect("kubectl");
        assert!(ok, "{out}");
        for expected in [
            "deployment.apps/immortal-operator   0/2",
            "serviceaccount/immortal-operator   0",
            "service/immortal-operator-metrics   ClusterIP   <none>       <none>        8443/TCP",
            "networkpolicy.networking.k8s.io/immortal-operator   app.kubernetes.io/name=immortal-operator",
            "role.rbac.authorization.k8s.io/immortal-operator-leader-election",
            "Role/immortal-operator-leader-election",
            "CREATED AT",
        ] {
            assert!(out.contains(expected), "{expected:?} in:\n{out}");
        }
        let (ok, out) =
            kubectl(&server, &["get", "clusterrole,clusterrolebinding"], None).expect("kubectl");
        assert!(ok, "{out}");
        for doc in docs.iter().filter(|d| {
            matches!(
                d["kind"].as_str(),
                Some("ClusterRole" | "ClusterRoleBinding")
            )
        }) {
            let name = doc["metadata"]["name"].as_str().unwrap_or("");
            assert!(out.contains(&format!("/{name} ")), "{name} in:\n{out}");
        }

        let delete = ["delete", "-k", &config_default(), "--ignore-not-found"];
        let (ok, out) = kubectl(&server, &delete, None).expect("kubectl");
        assert!(ok, "{out}");
        for doc in &docs {
            let path = object_path(doc);
            wait_for(
                10,
                &format!("{path} to go"),
                || server.get_json(&path).unwrap_or(Value::Null),
                Value::is_null,
            );
        }
        let (ok, out) = kubectl(&server, &delete, None).expect("kubectl");
        assert!(ok && out.trim().is_empty(), "nothing left to delete: {out}");
    });
}

#[test]
fn a_changed_manifest_reapplied_patches_the_deployment_and_service_in_place() {
    bounded(60, || {
        let server = start(true);
        let Some(yaml) = rendered(&server) else {
            eprintln!("kubectl not installed; skipping");
            return;
        };
        // With the CRD already installed (the library's default) apply patches it.
        let (ok, out) = kubectl(&server, &["apply", "-f", "-"], Some(&yaml)).expect("kubectl");
        assert!(ok, "{out}");
        assert!(
            out.contains("immortalcontainer.flugel.it configured"),
            "{out}"
        );
        let changed = yaml
            .replace(
                "image: immortal-operator:latest",
                "image: immortal-operator:v2",
            )
            .replace("    port: 8443\n", "    port: 9443\n");
        assert_ne!(changed, yaml);
        let (ok, out) = kubectl(&server, &["apply", "-f", "-"], Some(&changed)).expect("kubectl");
        assert!(ok, "{out}");
        assert!(
            out.contains("deployment.apps/immortal-operator configured")
                && out.contains("service/immortal-operator-metrics configured"),
            "{out}"
        );
        let deploy = server
            .get_json(&format!(
                "{APPS}/namespaces/{NS}/deployments/immortal-operator"
            ))
            .expect("deployment");
        assert_eq!(deploy["metadata"]["generation"], 2);
        let container = &deploy["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(container["image"], "immortal-operator:v2");
        assert_eq!(
            container["ports"].as_array().map(Vec::len),
            Some(2),
            "merged by containerPort"
        );
        let svc = server
            .get_json(&format!(
                "/api/v1/namespaces/{NS}/services/immortal-operator-metrics"
            ))
            .expect("service");
        assert_eq!(
            svc["spec"]["ports"],
            json!([{"name": "metrics", "port": 9443, "protocol": "TCP", "targetPort": "metrics"}]),
            "the changed port replaced, not appended"
        );
    });
}

fn deployment(name: &str) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "c", "image": "nginx:1.27"}]}}}})
}

#[test]
fn a_watched_deployment_moves_its_generation_on_spec_and_annotation_changes_and_keeps_status_apart()
{
    bounded(30, || {
        let server = start(false);
        let admin = Client::admin(&server);
        let path = format!("{APPS}/namespaces/default/deployments");
        let r = admin.post(&path, &deployment("web"));
        assert_eq!(r.code, 201, "{}", r.body);
        assert_eq!(r.body["metadata"]["generation"], 1);
        assert_eq!(r.body["status"], json!({}));
        let web = format!("{path}/web");
        let rv = r.body["metadata"]["resourceVersion"].as_str().unwrap_or("");
        let events = admin
            .watch(&format!("{path}?watch=true&resourceVersion={rv}"))
            .spawn();
        let generation = |patch: Value| {
            let r = admin.merge_patch(&web, &patch);
            assert_eq!(r.code, 200, "{}", r.body);
            r.body["metadata"]["generation"].clone()
        };
        assert_eq!(generation(json!({"spec": {"replicas": 3}})), 2);
        let seen = events.take(1, std::time::Duration::from_secs(5));
        assert_eq!(seen[0]["type"], "MODIFIED");
        assert_eq!(seen[0]["object"]["kind"], "Deployment");
        assert_eq!(seen[0]["object"]["spec"]["replicas"], 3);
        assert_eq!(generation(json!({"metadata": {"labels": {"a": "b"}}})), 2);
        assert_eq!(
            generation(json!({"metadata": {"annotations": {"a": "b"}}})),
            3
        );
        assert_eq!(
            generation(json!({"status": {"readyReplicas": 3}})),
            3,
            "status through the main endpoint is ignored"
        );
        let r = admin.merge_patch(
            &format!("{web}/status"),
            &json!({"status": {"readyReplicas": 3}}),
        );
        assert_eq!(r.code, 200, "{}", r.body);
        assert_eq!(r.body["status"]["readyReplicas"], 3);
        assert_eq!(r.body["metadata"]["generation"], 3);

        let r = admin.merge_patch(
            &web,
            &json!({"spec": {"selector": {"matchLabels": {"app": "other"}},
                "template": {"metadata": {"labels": {"app": "other"}}}}}),
        );
        assert_eq!(r.code, 422, "{}", r.body);
        assert_eq!(
            r.body["details"]["causes"][0]["message"],
            "Invalid value: v1.LabelSelector{MatchLabels:map[string]string{\"app\":\"other\"}, \
             MatchExpressions:[]v1.LabelSelectorRequirement(nil)}: field is immutable"
        );
    });
}

#[test]
fn owned_stored_kinds_are_collected_and_namespace_deletion_removes_them() {
    bounded(30, || {
        let server = start(false);
        let admin = Client::admin(&server);
        let r = admin.post(
            "/api/v1/namespaces",
            &json!({"metadata": {"name": "apps-a"}}),
        );
        assert_eq!(r.code, 201, "{}", r.body);
        let r = admin.post(
            &format!("{APPS}/namespaces/apps-a/deployments"),
            &deployment("owner"),
        );
        assert_eq!(r.code, 201, "{}", r.body);
        let owner = json!([{"apiVersion": "apps/v1", "kind": "Deployment", "name": "owner",
            "uid": r.body["metadata"]["uid"], "controller": true}]);
        let owned = [
            ("/api/v1/namespaces/apps-a/serviceaccounts", json!({})),
            (
                "/api/v1/namespaces/apps-a/services",
                json!({"spec": {"ports": [{"port": 80}]}}),
            ),
            (
                "/apis/networking.k8s.io/v1/namespaces/apps-a/networkpolicies",
                json!({"spec": {}}),
            ),
            (
                &format!("{RBAC}/namespaces/apps-a/roles"),
                json!({"rules": []}),
            ),
            (
                &format!("{RBAC}/namespaces/apps-a/rolebindings"),
                json!({"roleRef": {"kind": "Role", "name": "owned"}}),
            ),
        ];
        for (collection, body) in &owned {
            let mut body = body.clone();
            body["metadata"] = json!({"name": "owned", "ownerReferences": owner});
            let r = admin.post(collection, &body);
            assert_eq!(r.code, 201, "{collection}: {}", r.body);
            assert_eq!(admin.get(&format!("{collection}/owned")).code, 200);
        }
        let r = admin.delete(&format!("{APPS}/namespaces/apps-a/deployments/owner"), None);
        assert_eq!(r.code, 200, "{}", r.body);
        assert_eq!(r.body["kind"], "Status", "deployments answer a Status");
        for (collection, _) in &owned {
            let path = format!("{collection}/owned");
            wait_for(
                10,
                &format!("{path} to be collected"),
                || json!(admin.get(&path).code),
                |c| c == 404,
            );
        }

        for (collection, body) in &owned {
            let mut body = body.clone();
            body["metadata"] = json!({"name": "kept"});
            assert_eq!(admin.post(collection, &body).code, 201, "{collection}");
        }
        let r = admin.delete("/api/v1/namespaces/apps-a", None);
        assert_eq!(r.code, 200, "{}", r.body);
        wait_for(
            10,
            "the namespace to go",
            || json!(admin.get("/api/v1/namespaces/apps-a").code),
            |c| c == 404,
        );
        for (collection, _) in &owned {
            let r = admin.get(collection);
            assert_eq!(r.body["items"], json!([]), "{collection}");
        }
    });
}

#[test]
fn rbac_objects_grant_what_they_say_and_a_binding_outlives_its_role_granting_nothing() {
    bounded(30, || {
        let server = start(false);
        let admin = Client::admin(&server);
        server.add_user("dev", "dev-token", vec![Rule::new(&["*"], &["pods"])]);
        let dev = Client::new(&server, "dev-token");
        // `system:` names with colons are valid RBAC names (path segments, not DNS names).
        let r = admin.post(
            &format!("{RBAC}/clusterroles"),
            &json!({"metadata": {"name": "system:everything", "labels": {"t": "x"}},
                "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]}),
        );
        assert_eq!(r.code, 201, "{}", r.body);
        let r = admin.post(
            &format!("{RBAC}/clusterrolebindings"),
            &json!({"metadata": {"name": "dev-everything", "labels": {"t": "x"}},
                "roleRef": {"kind": "ClusterRole", "name": "system:everything"},
                "subjects": [{"kind": "User", "name": "dev"}]}),
        );
        assert_eq!(r.code, 201, "{}", r.body);
        assert_eq!(r.body["roleRef"]["apiGroup"], "rbac.authorization.k8s.io");
        let leases = "/apis/coordination.k8s.io/v1/namespaces/default/leases";
        assert_eq!(
            dev.get(leases).code,
            200,
            "a ClusterRoleBinding grants its role's rules to the user it names, beyond add_user's"
        );

        let r = admin.merge_patch(
            &format!("{RBAC}/clusterrolebindings/dev-everything"),
            &json!({"roleRef": {"name": "view"}}),
        );
        assert_eq!(r.code, 422, "{}", r.body);
        assert_eq!(r.body["details"]["causes"][0]["field"], "roleRef");
        let r = admin.post(
            &format!("{RBAC}/clusterroles"),
            &json!({"metadata": {"name": "no-verbs"}, "rules": [{"apiGroups": [""], "resources": ["pods"]}]}),
        );
        assert_eq!(r.code, 422, "{}", r.body);
        assert_eq!(
            r.body["message"],
            "ClusterRole.rbac.authorization.k8s.io \"no-verbs\" is invalid: rules[0].verbs: \
             Required value: verbs must contain at least one value"
        );

        let r = admin.delete(&format!("{RBAC}/clusterroles?labelSelector=t%3Dx"), None);
        assert_eq!(r.code, 200, "{}", r.body);
        assert_eq!(r.body["items"].as_array().map(Vec::len), Some(1));
        assert_eq!(
            admin
                .get(&format!("{RBAC}/clusterrolebindings/dev-everything"))
                .code,
            200,
            "a binding outlives its role, as on a real cluster"
        );
        assert_eq!(dev.get(leases).code, 403, "and then grants nothing");
    });
}

/// The project's CRD with a description long enough to take it over 256 KiB, as a CRD
/// embedding a whole pod template with its descriptions can be.
fn crd_over_256_kib() -> String {
    let mut crd: Value =
        serde_yaml::from_str(include_str!("../../config/crd/immortalcontainers.yaml"))
            .expect("crd yaml");
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
        ["image"]["description"] = json!("x".repeat(300 * 1024));
    crd.to_string()
}

#[test]
fn a_crd_over_256_kib_is_refused_by_client_side_apply_and_installed_by_server_side_apply() {
    bounded(60, || {
        let server = start(false);
        let big = crd_over_256_kib();
        let Some((ok, out)) = kubectl(&server, &["apply", "-f", "-"], Some(&big)) else {
            eprintln!("SKIPPED: kubectl is not installed");
            return;
        };
        assert!(!ok, "{out}");
        assert!(
            out.contains("metadata.annotations: Too long: must have at most 262144 bytes"),
            "{out}"
        );
        for _ in 0..2 {
            let (ok, out) = kubectl(&server, &["apply", "--server-side", "-f", "-"], Some(&big))
                .expect("installed");
            assert!(ok && out.contains("serverside-applied"), "{out}");
        }
        let ic = "apiVersion: immortalcontainer.flugel.it/v1alpha1\nkind: ImmortalContainer\nmetadata:\n  name: a\n  namespace: default\nspec:\n  image: nginx\n";
        let (ok, out) =
            kubectl(&server, &["apply", "--server-side", "-f", "-"], Some(ic)).expect("installed");
        assert!(ok, "{out}");
        let (ok, out) = kubectl(&server, &["explain", "immortalcontainer.spec.image"], None)
            .expect("installed");
        assert!(
            ok && out.contains("xxxxxxxx"),
            "the long description is served"
        );
    });
}
