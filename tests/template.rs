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

/// A template's native sidecar: an init container with `restartPolicy: Always`, named `log`.
fn with_sidecar(image: &str) -> Value {
    json!({"spec": {"initContainers": [{"name": "log", "image": image, "restartPolicy": "Always"}]}})
}

/// Waits until `name`'s pod exists, scheduled, carrying the template's sidecar, and the
/// object counts it once; returns the pod. Ready is not asked for: see the callers.
fn wait_counted_with_sidecar(c: &Cluster, name: &str) -> Value {
    let what = format!(
        "{}/{name}'s pod scheduled with its sidecar and counted",
        c.ns
    );
    wait_until(c.timeout(Duration::from_secs(30)), &what, || {
        let ic = c
            .get_ic(name)
            .map_err(|e| e.to_string())?
            .ok_or("object gone")?;
        let pod = c
            .get_pod(&pod_name(name))
            .map_err(|e| e.to_string())?
            .ok_or("no pod yet")?;
        let sidecar = &pod["spec"]["initContainers"][0];
        if sidecar["name"] != "log" || sidecar["restartPolicy"] != "Always" {
            return Err(format!(
                "the pod's init containers: {}",
                pod["spec"]["initContainers"]
            ));
        }
        if pod["spec"]["nodeName"].as_str().unwrap_or("").is_empty() {
            return Err("not scheduled yet".into());
        }
        let st = &ic["status"];
        if st["startTimes"] != 1 || st["lastCountedPodUID"] != uid(&pod) {
            return Err(format!("status {st}"));
        }
        Ok(pod)
    })
}

/// The pod stays the one counted, and the count stays, for `hold`: a sidecar's restarts, or a
/// pod lacking fields the cluster dropped, never make another.
fn assert_stays_counted_once(c: &Cluster, name: &str, pod: &Value, hold: Duration) {
    let end = std::time::Instant::now() + hold;
    while std::time::Instant::now() < end {
        let ic = c.ic(name);
        let now = c.get_pod(&pod_name(name)).ok().flatten();
        assert_eq!(ic["status"]["startTimes"], 1, "{}", ic["status"]);
        assert_eq!(
            now.as_ref().map(uid),
            Some(uid(pod)),
            "the pod was replaced"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    if let Some(creates) = c.accepted_pod_creates() {
        assert_eq!(creates, 1, "pod creates the API server accepted");
    }
}

/// Native sidecars (KEP-753: on by default since 1.29; `tests/real-cluster.sh` gives v1.28
/// the gate): the sidecar reaches the pod, which is scheduled and counted once, and is Ready
/// as Kubernetes counts it with its sidecar.
#[test]
fn a_native_sidecar_reaches_the_pod_which_is_counted_once_and_ready_with_it() {
    let c = Cluster::new("template-sidecar");
    c.record_pod_creates();
    let _op = Operator::start(&c);
    create(&c, "web", with_sidecar(&image()));
    let pod = wait_counted_with_sidecar(&c, "web");
    // kubemark's hollow node never reports a sidecar started, so its pod is never Ready there.
    if c.real_containers_or_skip("a pod's Ready with its sidecar started") {
        c.wait_converged("web", 1, |_| Ok(()));
    }
    assert_stays_counted_once(&c, "web", &pod, c.timeout(Duration::from_secs(2)));
}

/// A sidecar that exits again and again (busybox, with no terminal): reported as a crash-looping
/// acontainer is, its restarts its own, the pod never replaced or counted again.
#[test]
fn a_sidecar_that_keeps_exiting_is_crash_looping_and_its_restarts_count_no_start() {
    let c = Cluster::new("template-sidecar-loop");
    if !c.real_containers_or_skip("a sidecar that exits") {
        return;
    }
    c.record_pod_creates();
    let _op = Operator::start(&c);
    create(&c, "web", with_sidecar("busybox:1.36"));
    let pod = wait_counted_with_sidecar(&c, "web");
    let looping = c.wait_ready("web", "False", "PodCrashLooping");
    let msg = reason_message(&looping);
    assert!(msg.starts_with("sidecar log of pod "), "{msg}");
    assert!(msg.contains("keeps exiting: back-off"), "{msg}");
    let restarts = c.get_pod(&pod_name("web")).unwrap().unwrap()["status"]["initContainerStatuses"]
        [0]["restartCount"]
        .as_i64()
        .unwrap_or(0);
    assert!(restarts >= 1, "the sidecar restarted");
    assert_stays_counted_once(&c, "web", &pod, c.timeout(Duration::from_secs(2)));
}

/// What a template written for a newer Kubernetes asks of one older than the fields: the
/// object keeps every field (the CRD's schema is 1.37's), the pod is made once without those
/// the cluster does not know, and the object says which (FieldsDropped, an Event, and
/// `kubectl describe ic`); a hook left without a handler is the cluster's refusal, naming the
/// field it dropped first.
#[test]
fn fields_an_older_cluster_does_not_know_are_reported_dropped_and_the_pod_made_once() {
    let c = Cluster::new("template-dropped");
    if c.knows_pod_field("PodSecurityContext", "appArmorProfile") {
        common::skipped(
            "the cluster knows appArmorProfile (1.30+): nothing of the template is dropped",
        );
        return;
    }
    c.record_pod_creates();
    let _op = Operator::start(&c);
    let mut t = with_sidecar(&image());
    t["spec"]["securityContext"] = json!({"appArmorProfile": {"type": "RuntimeDefault"}});
    t["spec"]["resources"] = json!({"requests": {"cpu": "10m", "memory": "16Mi"}});
    t["spec"]["containers"] = json!([{"name": "acontainer",
        "restartPolicyRules": [{"action": "Restart", "exitCodes": {"operator": "In", "values": [42]}}]}]);
    let stored = create(&c, "modern", t.clone());
    assert_eq!(
        stored["spec"]["template"], t,
        "the object keeps every field"
    );
    let pod = wait_counted_with_sidecar(&c, "modern");
    for gone in ["appArmorProfile", "resources"] {
        let kept = if gone == "resources" {
            &pod["spec"]["resources"]
        } else {
            &pod["spec"]["securityContext"][gone]
        };
        assert!(kept.is_null(), "{gone} reached the pod: {kept}");
    }
    let ic = wait_until(c.timeout(Duration::from_secs(10)), "FieldsDropped", || {
        let ic = c.ic("modern");
        condition(&ic, "FieldsDropped")
            .is_some()
            .then_some(ic)
            .ok_or("no FieldsDropped condition".to_string())
    });
    let dropped = condition(&ic, "FieldsDropped").unwrap();
    let msg = dropped["message"].as_str().unwrap_or("");
    assert_eq!(
        (&dropped["status"], &dropped["reason"]),
        (&json!("True"), &json!("DroppedByAPIServer"))
    );
    for field in [
        "spec.securityContext.appArmorProfile",
        "spec.resources",
        "spec.containers[0].restartPolicyRules",
    ] {
        assert!(msg.contains(field), "{field} not named: {msg}");
    }
    assert!(msg.contains("newer than Kubernetes v1."), "{msg}");
    let events = c
        .api
        .get(&format!("/api/v1/namespaces/{}/events", c.ns))
        .unwrap();
    let said = events["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["reason"] == "FieldsDropped" && e["involvedObject"]["name"] == "modern");
    assert_eq!(said.count(), 1, "one FieldsDropped Event");
    assert_stays_counted_once(&c, "modern", &pod, c.timeout(Duration::from_secs(3)));

    // The sleep action is 1.29's (alpha there, kept only with its gate): the schema says.
    if !c.knows_pod_field("LifecycleHandler", "sleep") {
        let sleepy = json!({"spec": {"containers": [{"name": "acontainer",
            "lifecycle": {"preStop": {"sleep": {"seconds": 5}}}}]}});
        create(&c, "sleepy", sleepy);
        let refused = c.wait_ready("sleepy", "False", "PodCreateFailed");
        let msg = reason_message(&refused);
        assert!(msg.contains("must specify a handler type"), "{msg}");
        let named =
            "it dropped first what it does not know, spec.containers[0].lifecycle.preStop.sleep";
        assert!(msg.contains(named), "{msg}");
    }
}
