//! Pod creates as a v1.28 API server decodes, validates and admits them (unknown fields,
//! quantities, the fields of every container, PodSecurity levels), and `kubectl explain` of
//! pods and custom resources from the served OpenAPI v3 schemas.

mod common;

use common::{bounded, kubectl, Client};
use kube_testserver::{Options, TestServer};
use serde_json::{json, Value};

const PODS: &str = "/api/v1/namespaces/default/pods";

fn start() -> (TestServer, Client) {
    let server = TestServer::start(Options::default()).expect("server starts");
    let admin = Client::admin(&server);
    (server, admin)
}

fn pod(name: &str, container: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"containers": [container]}})
}

fn causes(body: &Value) -> Vec<String> {
    body["details"]["causes"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            format!(
                "{}: {}",
                c["field"].as_str().unwrap_or(""),
                c["message"].as_str().unwrap_or("")
            )
        })
        .collect()
}

#[test]
fn invalid_container_fields_are_refused_with_422_and_their_paths() {
    bounded(20, || {
        let (_server, admin) = start();
        let mut body = pod(
            "bad",
            json!({"name": "acontainer", "image": "nginx",
                "ports": [{"containerPort": 70000}],
                "env": [{"name": "1BAD", "value": "x"}],
                "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                "resources": {"requests": {"memory": "2Gi"}, "limits": {"memory": "1Gi"}}}),
        );
        body["spec"]["initContainers"] = json!([{"name": "acontainer", "image": "busybox"}]);
        let r = admin.post(PODS, &body);
        assert_eq!(r.code, 422, "{}", r.body);
        assert_eq!(r.body["reason"], "Invalid");
        assert_eq!(
            r.body["details"],
            json!({"name": "bad", "kind": "Pod", "causes": r.body["details"]["causes"]})
        );
        let got = causes(&r.body);
        assert_eq!(
            got,
            [
                "spec.containers[0].ports[0].containerPort: Invalid value: 70000: must be between 1 and 65535, inclusive",
                "spec.containers[0].env[0].name: Invalid value: \"1BAD\": a valid environment variable name must consist of alphabetic characters, digits, '_', '-', or '.', and must not start with a digit (e.g. 'my.env-name',  or 'MY_ENV.NAME',  or 'MyEnvName1', regex used for validation is '[-._a-zA-Z][-._a-zA-Z0-9]*')",
                "spec.containers[0].volumeMounts[0].name: Not found: \"data\"",
                "spec.containers[0].resources.requests: Invalid value: \"2Gi\": must be less than or equal to memory limit of 1Gi",
                "spec.initContainers[0].name: Duplicate value: \"acontainer\"",
            ]
        );
        let message = r.body["message"].as_str().unwrap_or("");
        assert!(message.starts_with("Pod \"bad\" is invalid: [spec.containers[0].ports[0].containerPort: Invalid value: 70000"), "{message}");
        assert!(
            admin.get(&format!("{PODS}/bad")).code == 404,
            "nothing stored"
        );
    });
}

#[test]
fn malformed_quantities_and_strict_unknown_fields_are_400_and_default_unknowns_are_dropped_with_a_warning(
) {
    bounded(20, || {
        let (_server, admin) = start();
        let lots = pod(
            "lots",
            json!({"name": "a", "image": "nginx", "resources": {"limits": {"memory": "lots"}}}),
        );
        let r = admin.post(PODS, &lots);
        assert_eq!(
            (r.code, r.body["reason"].as_str()),
            (400, Some("BadRequest")),
            "{}",
            r.body
        );
        assert_eq!(
            r.body["message"],
            "Pod in version \"v1\" cannot be handled as a Pod: quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
        );

        let extra = pod(
            "extra",
            json!({"name": "a", "image": "nginx", "colour": "blue"}),
        );
        let strict = admin.post(&format!("{PODS}?fieldValidation=Strict"), &extra);
        assert_eq!(strict.code, 400, "{}", strict.body);
        assert_eq!(
            strict.body["message"],
            "Pod in version \"v1\" cannot be handled as a Pod: strict decoding error: unknown field \"spec.containers[0].colour\""
        );
        let lenient = admin.post(PODS, &extra);
        assert_eq!(lenient.code, 201, "{}", lenient.body);
        assert_eq!(
            lenient.warnings,
            ["299 - \"unknown field \\\"spec.containers[0].colour\\\"\""]
        );
        assert!(lenient.body["spec"]["containers"][0]
            .get("colour")
            .is_none());
    });
}

#[test]
fn a_valid_pod_with_every_checked_field_is_created() {
    bounded(20, || {
        let (_server, admin) = start();
        let mut body = pod(
            "full",
            json!({"name": "acontainer", "image": "nginx:1.27",
                "ports": [{"name": "http", "containerPort": 80}],
                "env": [{"name": "MODE", "value": "prod"}],
                "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"cpu": "1", "memory": "128Mi"}}}),
        );
        body["spec"]["volumes"] = json!([{"name": "data", "emptyDir": {}}]);
        body["spec"]["initContainers"] = json!([{"name": "setup", "image": "busybox:1.36"}]);
        let r = admin.post(PODS, &body);
        assert_eq!(r.code, 201, "{}", r.body);
        assert!(r.warnings.is_empty(), "{:?}", r.warnings);
    });
}

fn restricted_namespace(admin: &Client, name: &str, level: &str) {
    let ns = json!({"metadata": {"name": name, "labels": {"pod-security.kubernetes.io/enforce": level}}});
    assert_eq!(admin.post("/api/v1/namespaces", &ns).code, 201);
}

#[test]
fn pod_security_levels_evaluate_the_pod() {
    bounded(20, || {
        let (_server, admin) = start();
        restricted_namespace(&admin, "locked", "restricted");
        restricted_namespace(&admin, "base", "baseline");
        let compliant = json!({"name": "acontainer", "image": "nginx",
            "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"},
                "allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}}});
        let r = admin.post(
            "/api/v1/namespaces/locked/pods",
            &pod("ok", compliant.clone()),
        );
        assert_eq!(r.code, 201, "{}", r.body);

        let mut host = pod("host", compliant);
        host["spec"]["containers"][0]["ports"] = json!([{"containerPort": 80, "hostPort": 8080}]);
        host["spec"]["containers"][0]["securityContext"]["capabilities"]["add"] =
            json!(["SYS_ADMIN"]);
        host["spec"]["volumes"] = json!([{"name": "root", "hostPath": {"path": "/"}}]);
        let r = admin.post("/api/v1/namespaces/locked/pods", &host);
        assert_eq!(r.code, 403, "{}", r.body);
        assert_eq!(
            r.body["message"],
            "pods \"host\" is forbidden: violates PodSecurity \"restricted:latest\": unrestricted capabilities (container \"acontainer\" must not include \"SYS_ADMIN\" in securityContext.capabilities.add), hostPort (container \"acontainer\" uses hostPort 8080), restricted volume types (volume \"root\" uses restricted volume type \"hostPath\")"
        );
        let r = admin.post("/api/v1/namespaces/base/pods", &host);
        assert_eq!(r.code, 403, "{}", r.body);
        assert_eq!(
            r.body["message"],
            "pods \"host\" is forbidden: violates PodSecurity \"baseline:latest\": non-default capabilities (container \"acontainer\" must not include \"SYS_ADMIN\" in securityContext.capabilities.add), hostPath volumes (volume \"root\"), hostPort (container \"acontainer\" uses hostPort 8080)"
        );
        // Baseline lets through what restricted refuses: no securityContext at all.
        let plain = pod("plain", json!({"name": "acontainer", "image": "nginx"}));
        assert_eq!(admin.post("/api/v1/namespaces/base/pods", &plain).code, 201);
        assert_eq!(
            admin.post("/api/v1/namespaces/locked/pods", &plain).code,
            403
        );
    });
}

/// A CRD whose spec embeds a pod template, as an operator's does, with descriptions.
fn template_crd() -> Value {
    let resources = json!({"type": "object", "description": "Compute Resources required by this container.",
        "properties": {
            "limits": {"type": "object", "description": "Limits describes the maximum amount of compute resources allowed.",
                "additionalProperties": {"anyOf": [{"type": "integer"}, {"type": "string"}], "x-kubernetes-int-or-string": true}},
            "requests": {"type": "object", "description": "Requests describes the minimum amount of compute resources required.",
                "additionalProperties": {"anyOf": [{"type": "integer"}, {"type": "string"}], "x-kubernetes-int-or-string": true}}}});
    json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {"group": "example.com", "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
            "versions": [{"name": "v1", "served": true, "storage": true, "schema": {"openAPIV3Schema": {
                "type": "object", "description": "Widget runs a pod from a template.",
                "properties": {"spec": {"type": "object", "properties": {
                    "template": {"type": "object", "description": "The pod to run.", "properties": {
                        "spec": {"type": "object", "properties": {
                            "containers": {"type": "array", "items": {"type": "object", "properties": {
                                "name": {"type": "string"},
                                "resources": resources}}}}}}}}}}}}}]}})
}

#[test]
fn kubectl_explain_documents_custom_resources_and_pods() {
    bounded(60, || {
        let (server, admin) = start();
        let r = admin.post(
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
            &template_crd(),
        );
        assert_eq!(r.code, 201, "{}", r.body);

        // What kubectl reads: the group-version's document, the schema found by its kind.
        let root = admin.get("/openapi/v3").body;
        let url = root["paths"]["apis/example.com/v1"]["serverRelativeURL"]
            .as_str()
            .expect("listed")
            .to_string();
        let doc = admin.get(&url).body;
        let widget = &doc["components"]["schemas"]["com.example.v1.Widget"];
        assert_eq!(
            widget["x-kubernetes-group-version-kind"],
            json!([{"group": "example.com", "kind": "Widget", "version": "v1"}])
        );
        assert!(
            doc["components"]["schemas"]["io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"]
                .is_object()
        );
        let core = admin.get("/openapi/v3/api/v1").body;
        assert!(core["components"]["schemas"]["io.k8s.api.core.v1.Pod"].is_object());

        let Some((ok, out)) = kubectl(
            &server,
            &["explain", "widget.spec.template.spec.containers.resources"],
            None,
        ) else {
            eprintln!("SKIPPED: kubectl is not installed");
            return;
        };
        assert!(ok, "{out}");
        assert!(out.contains("FIELD: resources <Object>"), "{out}");
        assert!(
            out.contains("Compute Resources required by this container."),
            "{out}"
        );
        assert!(out.contains("limits\t<map[string]"), "{out}");
        let (ok, out) = kubectl(
            &server,
            &["explain", "pods.spec.containers.resources.limits"],
            None,
        )
        .expect("installed");
        assert!(ok, "{out}");
        assert!(
            out.contains("Limits describes the maximum amount of compute resources allowed."),
            "{out}"
        );
        let (ok, out) =
            kubectl(&server, &["explain", "widget.metadata.labels"], None).expect("installed");
        assert!(
            ok && out.contains("FIELD: labels <map[string]string>"),
            "{out}"
        );
    });
}

#[test]
fn a_crd_pattern_and_a_matches_rule_refuse_a_malformed_template_with_its_field_path() {
    bounded(20, || {
        let (_server, admin) = start();
        let quantity = r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$";
        let mut crd = template_crd();
        let version =
            &mut crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
        let container = &mut version["properties"]["template"]["properties"]["spec"]["properties"]
            ["containers"]["items"];
        container["properties"]["resources"]["properties"]["limits"]["additionalProperties"]
            ["pattern"] = json!(quantity);
        container["properties"]["image"] = json!({"type": "string"});
        container["x-kubernetes-validations"] = json!([{"rule": "!has(self.image) || self.image.matches('^[a-z0-9./:@-]+$')",
            "message": "image must be a lowercase reference"}]);
        let r = admin.post(
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
            &crd,
        );
        assert_eq!(r.code, 201, "{}", r.body);
        let widgets = "/apis/example.com/v1/namespaces/default/widgets";
        let widget = |name: &str, container: Value| {
            json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": name},
                "spec": {"template": {"spec": {"containers": [container]}}}})
        };
        let ok = admin.post(widgets, &widget("ok", json!({"name": "a", "image": "nginx:1.27", "resources": {"limits": {"memory": "128Mi", "cpu": 1}}})));
        assert_eq!(ok.code, 201, "{}", ok.body);
        let lots = admin.post(
            widgets,
            &widget(
                "lots",
                json!({"name": "a", "resources": {"limits": {"memory": "lots"}}}),
            ),
        );
        assert_eq!(lots.code, 422, "{}", lots.body);
        assert_eq!(
            causes(&lots.body),
            [format!("spec.template.spec.containers[0].resources.limits.memory: Invalid value: \"lots\": spec.template.spec.containers[0].resources.limits.memory in body should match '{quantity}'")]
        );
        let upper = admin.post(
            widgets,
            &widget("upper", json!({"name": "a", "image": "NGINX:::Latest@@"})),
        );
        assert_eq!(upper.code, 422, "{}", upper.body);
        assert_eq!(
            causes(&upper.body),
            ["spec.template.spec.containers[0]: Invalid value: \"object\": image must be a lowercase reference"]
        );
    });
}
