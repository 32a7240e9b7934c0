//! End-to-end scenarios of `spec.template`: the pod is built from it, a change to it replaces
//! the pod once, what others do to the live pod replaces nothing, a malformed one is refused
//! at admission, and restricted namespaces run a compliant one. Unchanged on a real cluster.

mod common;

use common::*;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::Duration;

fn ics_path(c: &Cluster) -> String {
    format!(
        "/apis/{GROUP_VERSION}/namespaces/{}/immortalcontainers",
        c.ns
    )
}

/// Creates `name` with `template`, answering the API server's refusal. Strict field
/// validation, as kubectl sends it, so an unknown field is refused rather than dropped.
fn try_create(
    c: &Cluster,
    name: &str,
    image: &str,
    template: Option<Value>,
) -> Result<Value, Error> {
    let mut spec = json!({"image": image});
    if let Some(t) = template {
        spec["template"] = t;
    }
    let body = json!({"apiVersion": GROUP_VERSION, "kind": KIND,
        "metadata": {"name": name, "namespace": c.ns}, "spec": spec});
    c.api.try_request(
        "POST",
        &format!("{}?fieldValidation=Strict", ics_path(c)),
        "application/json",
        Some(&body),
    )
}

fn create(c: &Cluster, name: &str, template: Value) -> Value {
    try_create(c, name, &image(), Some(template))
        .unwrap_or_else(|e| panic!("cannot create immortalcontainer {name}: {e}"))
}

/// What a real workload sets: args, env, resources, a port, a sidecar, labels and annotations.
fn workload(mode: &str) -> Value {
    json!({
        "metadata": {"labels": {"team": "web"}, "annotations": {"example.com/owner": "alice"}},
        "spec": {
            "terminationGracePeriodSeconds": 5,
            "containers": [
                {"name": "acontainer", "args": ["--mode", mode],
                 "env": [{"name": "MODE", "value": mode}],
                 "ports": [{"containerPort": 8080}],
                 "resources": {"requests": {"cpu": "10m", "memory": "16Mi"},
                               "limits": {"memory": "32Mi"}}},
                {"name": "sidecar", "image": image(),
                 "resources": {"requests": {"cpu": "5m", "memory": "8Mi"}}}
            ]
        }
    })
}

fn container<'a>(pod: &'a Value, name: &str) -> Option<&'a Value> {
    pod["spec"]["containers"]
        .as_array()?
        .iter()
        .find(|c| c["name"] == name)
}

fn runs_mode(pod: &Value, mode: &str) -> Result<(), String> {
    let ours = container(pod, CONTAINER).ok_or("no acontainer")?;
    if ours["env"][0]["value"] == mode {
        Ok(())
    } else {
        Err(format!("acontainer env {}, want MODE={mode}", ours["env"]))
    }
}

#[test]
fn a_templates_env_args_resources_sidecar_labels_and_annotations_show_on_the_pod() {
    let c = Cluster::new("template-fields");
    let _op = Operator::start(&c);
    create(&c, "web", workload("a"));
    let pod = c.wait_converged("web", 1, |p| runs_mode(p, "a"));
    let m = &pod["metadata"];
    assert_eq!(m["labels"]["team"], "web", "{m}");
    assert_eq!(m["labels"][MANAGED_BY], MANAGED_BY_VALUE, "{m}");
    assert_eq!(m["annotations"]["example.com/owner"], "alice", "{m}");
    assert!(m["annotations"][SPEC_HASH_ANNOTATION].is_string(), "{m}");
    let ours = container(&pod, CONTAINER).unwrap();
    assert_eq!(ours["image"], image().as_str());
    assert_eq!(ours["args"], json!(["--mode", "a"]));
    assert_eq!(ours["ports"][0]["containerPort"], 8080);
    assert_eq!(ours["resources"]["limits"]["memory"], "32Mi");
    assert_eq!(ours["resources"]["requests"]["cpu"], "10m");
    let sidecar = container(&pod, "sidecar").expect("the sidecar");
    assert_eq!(sidecar["image"], image().as_str());
    assert_eq!(pod["spec"]["terminationGracePeriodSeconds"], 5);
    // Requests and limits: no longer BestEffort, the first evicted under node pressure.
    if let Some(class) = pod["status"]["qosClass"].as_str() {
        assert_eq!(class, "Burstable");
    }
}

#[test]
fn a_template_change_replaces_the_pod_once_and_counts_one_start() {
    let c = Cluster::new("template-change");
    let _op = Operator::start(&c);
    create(&c, "web", workload("a"));
    let first = c.wait_converged("web", 1, |p| runs_mode(p, "a"));
    c.api
        .merge_patch(
            &format!("{}/web", ics_path(&c)),
            &json!({"spec": {"template": workload("b")}}),
        )
        .unwrap_or_else(|e| panic!("cannot change the template: {e}"));
    let second = c.wait_converged("web", 2, |p| runs_mode(p, "b"));
    assert_ne!(uid(&first), uid(&second));
    // Once: no second replacement, no extra count.
    c.assert_stays_converged(
        &BTreeMap::from([("web".to_string(), 2)]),
        c.timeout(Duration::from_secs(3)),
    );
    // The object's own labels are not the template: they replace nothing.
    c.api
        .merge_patch(
            &format!("{}/web", ics_path(&c)),
            &json!({"metadata": {"labels": {"tier": "frontend"}}}),
        )
        .unwrap_or_else(|e| panic!("cannot label the object: {e}"));
    c.assert_stays_converged(
        &BTreeMap::from([("web".to_string(), 2)]),
        c.timeout(Duration::from_secs(3)),
    );
    assert_eq!(uid(&c.assert_converged("web", 2)), uid(&second));
}

/// As a mutating webhook does (a service mesh's injector, a policy engine's labels): what it
/// adds to the live pod is not a template change and must not start a replacement loop.
#[test]
fn a_label_or_annotation_added_to_the_live_pod_replaces_nothing() {
    let c = Cluster::new("template-mutated");
    let _op = Operator::start(&c);
    create(&c, "web", workload("a"));
    let pod = c.wait_converged("web", 1, |p| runs_mode(p, "a"));
    c.patch_pod(
        name(&pod),
        &json!({"metadata": {
            "labels": {"team": "someone-else", "injected": "true"},
            "annotations": {"sidecar.example.com/status": "injected", "example.com/owner": "bob"}
        }}),
    );
    c.assert_stays_converged(
        &BTreeMap::from([("web".to_string(), 1)]),
        c.timeout(Duration::from_secs(3)),
    );
    assert_eq!(uid(&c.assert_converged("web", 1)), uid(&pod));
}

#[test]
fn an_object_without_a_template_gets_the_pod_it_got_before_templates() {
    let c = Cluster::new("template-none");
    let _op = Operator::start(&c);
    c.create_ic("bare", &image());
    // check_converged: one container, acontainer, spec.image, our labels and annotation.
    let pod = c.wait_converged("bare", 1, |_| Ok(()));
    let m = &pod["metadata"];
    assert!(m["annotations"][SPEC_HASH_ANNOTATION].is_null(), "{m}");
    let ours = container(&pod, CONTAINER).unwrap();
    for field in ["args", "command", "env", "ports"] {
        assert!(ours[field].is_null(), "acontainer has {field}: {ours}");
    }
    // The API server's default, as before: the kubelet restarts the container in its pod.
    assert_eq!(pod["spec"]["restartPolicy"], "Always");
}

#[test]
fn malformed_templates_and_a_second_image_for_acontainer_are_refused_at_admission() {
    let c = Cluster::new("template-refused");
    let cases = [
        (
            json!({"spec": {"containers": [{"name": "acontainer",
                "resources": {"limits": {"memory": "lots"}}}]}}),
            "spec.template.spec.containers[0].resources.limits.memory",
        ),
        // A list map's key once (Kubernetes 1.37's markers): a pod would be refused at every
        // create.
        (
            json!({"spec": {"containers": [{"name": "side", "image": "busybox"},
                                           {"name": "side", "image": "busybox"}]}}),
            "spec.template.spec.containers[1]: Duplicate value",
        ),
        (
            json!({"spec": {"containers": [{"name": "acontainer",
                "env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]}]}}),
            "spec.template.spec.containers[0].env[1]: Duplicate value",
        ),
        // The operator's fields, with the reason.
        (
            json!({"spec": {"restartPolicy": "Never"}}),
            "spec.template.spec.restartPolicy: Forbidden: the operator keeps the pod's restartPolicy Always",
        ),
        (
            json!({"spec": {"nodeName": "node-1"}}),
            "spec.template.spec.nodeName: Forbidden: the scheduler places the pod",
        ),
        (
            json!({"spec": {"containers": [{"name": "acontainer", "image": "nginx:0.1"}]}}),
            "spec.template.spec.containers: Forbidden: the container named acontainer runs spec.image",
        ),
        (
            json!({"metadata": {"labels": {MANAGED_BY: "me"}}}),
            "spec.template.metadata.labels: Forbidden: must not set app.kubernetes.io/managed-by",
        ),
        (
            json!({"spec": {"containers": [{"name": "log"}]}}),
            "spec.template.spec.containers[0].image: Required value",
        ),
    ];
    for (i, (template, why)) in cases.into_iter().enumerate() {
        match try_create(&c, &format!("bad-{i}"), &image(), Some(template.clone())) {
            Err(e) if e.code() == Some(422) => {
                assert!(e.to_string().contains(why), "{template}: {e}")
            }
            other => panic!("{template} was not refused: {other:?}"),
        }
    }
    // An unknown field: kubectl's strict field validation refuses it, naming it.
    let unknown = json!({"spec": {"containers": [{"name": "acontainer", "bogus": 1}]}});
    match try_create(&c, "unknown", &image(), Some(unknown)) {
        Err(e) if e.code() == Some(400) || e.code() == Some(422) => {
            let text = e.to_string();
            assert!(
                text.contains("bogus") && text.contains("unknown field"),
                "{text}"
            )
        }
        other => panic!("an unknown field was not refused: {other:?}"),
    }
    // The same container given spec.image, or no image at all, is fine.
    let same = json!({"spec": {"containers": [{"name": "acontainer", "image": image()}]}});
    try_create(&c, "same", &image(), Some(same)).expect("acontainer with spec.image");
}

#[test]
fn image_references_are_checked_against_the_reference_grammar_at_admission() {
    let c = Cluster::new("image-grammar");
    let digest = format!("x@sha256:{}", "0123456789abcdef".repeat(4));
    for (i, good) in [
        "nginx",
        "nginx:1.27",
        "registry:5000/a/b:tag",
        digest.as_str(),
    ]
    .into_iter()
    .enumerate()
    {
        try_create(&c, &format!("good-{i}"), good, None)
            .unwrap_or_else(|e| panic!("{good} was refused: {e}"));
    }
    for bad in ["NGINX:::Latest@@", "nginx:", "x@sha256:abc", "-nginx"] {
        match try_create(&c, "bad", bad, None) {
            Err(e) if e.code() == Some(422) => assert!(
                e.to_string()
                    .contains("spec.image: Forbidden: must be an image reference such as"),
                "{bad}: {e}"
            ),
            other => panic!("{bad} was not refused: {other:?}"),
        }
    }
}

/// A pod the `restricted` level refuses: PodSecurity (or its stand-in) is on when this is.
fn restricted_is_enforced(c: &Cluster) -> bool {
    let probe = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "psa-probe", "namespace": c.ns},
        "spec": {"containers": [{"name": "probe", "image": image()}]}});
    match c.api.try_request(
        "POST",
        &format!("/api/v1/namespaces/{}/pods", c.ns),
        "application/json",
        Some(&probe),
    ) {
        Err(e) if e.code() == Some(403) => true,
        Err(e) => panic!("the probe pod failed otherwise: {e}"),
        Ok(pod) => {
            let _ = c.api.delete(
                &format!("/api/v1/namespaces/{}/pods/psa-probe", c.ns),
                Some(&json!({"gracePeriodSeconds": 0, "preconditions": {"uid": uid(&pod)}})),
            );
            false
        }
    }
}

/// What `restricted` asks of every container, with requests and limits (the sample's pod).
fn restricted() -> Value {
    json!({"spec": {
        "securityContext": {"runAsNonRoot": true, "runAsUser": 65535,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{"name": "acontainer",
            "securityContext": {"allowPrivilegeEscalation": false,
                                "capabilities": {"drop": ["ALL"]}},
            "resources": {"requests": {"cpu": "10m", "memory": "16Mi"},
                          "limits": {"cpu": "100m", "memory": "32Mi"}}}]
    }})
}

#[test]
fn a_restricted_namespace_runs_a_compliant_template_and_reports_pod_securitys_refusal() {
    let c = Cluster::new("template-restricted");
    c.label_namespace("pod-security.kubernetes.io/enforce", Some("restricted"));
    if !restricted_is_enforced(&c) {
        common::skipped("this API server does not enforce the restricted Pod Security level");
        return;
    }
    let _op = Operator::start(&c);
    create(&c, "compliant", restricted());
    c.create_ic("bare", &image());
    c.wait_converged("compliant", 1, |_| Ok(()));
    let refused = c.wait_ready("bare", "False", "PodCreateFailed");
    let msg = reason_message(&refused);
    assert!(msg.contains("violates PodSecurity \"restricted"), "{msg}");
    assert!(msg.contains("give the object a spec.template"), "{msg}");
}
