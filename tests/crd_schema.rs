//! Generates the CRD's schema of `spec.template` from Kubernetes 1.37's PodTemplateSpec (JSON
//! Schema, tests/fixtures/openapi-1.37/), and fails when config/crd/immortalcontainers.yaml has
//! drifted from it. `make generate` (IMMORTAL_REGENERATE_CRD=1) writes it instead.
//!
//! What a structural CRD schema cannot hold is turned into what it can, as controller-gen does
//! from the Go types: `$ref`s inlined (the field's own description kept), `["object", "null"]`
//! types as their one type, int-or-string and quantities as `x-kubernetes-int-or-string`
//! (quantities with their pattern, so `memory: lots` is refused at admission), embedded
//! metadata reduced to labels and annotations, strategic-merge hints and unions dropped (a CRD
//! has neither), list-map keys kept where each key is required or has a default, as the API
//! server requires. The fields the operator keeps are declared only to be refused with a reason.

use immortal_operator::immortal::desired::OPERATOR_FIELDS;
use serde_json::{json, Map, Value};
use std::path::PathBuf;

const SCHEMA: &str = "tests/fixtures/openapi-1.37/podtemplatespec.json";
const CRD: &str = "config/crd/immortalcontainers.yaml";
const BEGIN: &str = "# BEGIN generated spec.template";
const END: &str = "# END generated spec.template";
/// Where `template:` sits in the CRD: under spec's properties.
const INDENT: usize = 16;
/// Bounds the CEL rule that walks the containers (config/crd): without one the API server
/// estimates the rule's cost for a list as long as a 3 MiB request allows, and refuses the CRD.
const MAX_CONTAINERS: u64 = 64;
/// Client-side `kubectl apply` keeps the whole object in an annotation, and annotations stop
/// at 256 KiB altogether; the CRD must stay well under that.
const APPLY_LIMIT: usize = 256 * 1024;
/// The longest description the template's schema keeps from Kubernetes' (controller-gen's
/// `maxDescLen`): longer ones are cut to the whole sentences that fit, and end with [`CUT`].
/// 1.37's descriptions whole would take the CRD past [`APPLY_LIMIT`]; at 400 it keeps a tenth
/// of it free for the fields later releases add.
const MAX_DESC: usize = 400;
/// What ends a description [`shorten`] cut.
const CUT: &str = " …";

/// kube-openapi's pattern for a `resource.Quantity`, as controller-gen writes it.
const QUANTITY_PATTERN: &str = r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The schema of `spec.template`.
fn generate() -> Value {
    let doc: Value =
        serde_json::from_str(&std::fs::read_to_string(root().join(SCHEMA)).unwrap()).unwrap();
    let defs = doc["$defs"].as_object().unwrap();
    let mut t = resolve(
        &json!({"$ref": "#/$defs/io.k8s.api.core.v1.PodTemplateSpec"}),
        defs,
    );
    list_maps(&mut t, "template");
    reword(&mut t);
    shorten(&mut t);
    t["description"] = json!(
        "The pod to run, as a Deployment's pod template: its labels, annotations and spec. The \
         container named acontainer runs spec.image (added first if the template does not name \
         it); restartPolicy, nodeName and ephemeralContainers are the operator's. A change to \
         it replaces the pod, once."
    );
    t["properties"]["metadata"]["description"] = json!(
        "The pod's labels and annotations; its name (NAME-immortalpod) and namespace are the \
         object's."
    );
    t["properties"]["spec"]["description"] = json!(
        "The pod's spec, as a pod's but for restartPolicy, nodeName and ephemeralContainers. Any \
         field may change: the pod is then replaced. Fields newer than the cluster are dropped \
         from the pod by its API server, which the object's FieldsDropped condition reports."
    );
    // The one field the schema leaves undescribed.
    let option = &mut t["properties"]["spec"]["properties"]["dnsConfig"]["properties"]["options"];
    option["items"]["properties"]["value"]["description"] =
        json!("The option's value, for an option that takes one (ndots: \"2\").");
    t["properties"]["spec"]["properties"]["containers"]["description"] = json!(
        "The pod's containers, each name once. The one named acontainer runs spec.image, and is \
         added first when it is not named here; every other one needs its image. Containers may \
         be added, removed or changed: the pod is then replaced."
    );
    let pod_spec = &mut t["properties"]["spec"];
    for f in OPERATOR_FIELDS {
        let (schema, why) = operator_field(f);
        let field = &mut pod_spec["properties"][f];
        assert!(field.is_object(), "{f} is no PodSpec field");
        *field = schema;
        field["description"] = json!(format!("Not in a template: {why}."));
        // On the field itself, which is checked only when it is set: rules with a fieldPath
        // on one node have their paths run together on v1.28 when several fail (fixture 46).
        field["x-kubernetes-validations"] = json!([{
            "rule": "false",
            "reason": "FieldValueForbidden",
            "message": why,
        }]);
    }
    // A template may leave the containers out: acontainer is added.
    pod_spec.as_object_mut().unwrap().remove("required");
    pod_spec["properties"]["containers"]["maxItems"] = json!(MAX_CONTAINERS);
    // Every container but acontainer needs its image; acontainer's is spec.image. Bounded as
    // spec.image is, for the cost of the CEL rule that compares the two.
    let container = &mut pod_spec["properties"]["containers"]["items"];
    container["properties"]["image"]["maxLength"] = json!(4096);
    container["x-kubernetes-validations"] = json!([{
        "rule": "self.name == 'acontainer' || has(self.image)",
        "fieldPath": ".image",
        "reason": "FieldValueRequired",
        "message": "every container but acontainer needs an image (acontainer runs spec.image)"
    }]);
    t
}

/// What the template declares of a field the operator keeps (see [`OPERATOR_FIELDS`]), and
/// why a template may not set it: declared so that a template setting it is refused with that
/// reason, not as a field the schema does not know.
fn operator_field(f: &str) -> (Value, &'static str) {
    let string = json!({"type": "string"});
    match f {
        "restartPolicy" => (
            string,
            "the operator keeps the pod's restartPolicy Always, so that the kubelet restarts an \
             exiting container in its pod; Never or OnFailure would end the pod at every exit, \
             and each exit would be a replacement and a count",
        ),
        "nodeName" => (
            string,
            "the scheduler places the pod, so that a replacement is not bound to the node its \
             predecessor was lost with; nodeSelector or affinity say the same through the \
             scheduler",
        ),
        // Any items: whatever an item holds, the field is refused.
        "ephemeralContainers" => (
            json!({"type": "array", "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}),
            "ephemeral containers are added to a running pod (kubectl debug), and the API \
             server refuses them in a pod it creates",
        ),
        _ => panic!("{f}: say why a template may not set it"),
    }
}

/// Every description of `node` and below cut to [`MAX_DESC`] (see there).
fn shorten(node: &mut Value) {
    let Some(o) = node.as_object_mut() else {
        return;
    };
    if let Some(Value::String(d)) = o.get_mut("description") {
        if d.len() > MAX_DESC {
            let end = sentences_within(d, MAX_DESC);
            d.truncate(end);
            d.push_str(CUT);
        }
    }
    for (_, child) in o.iter_mut() {
        match child {
            Value::Object(_) => shorten(child),
            Value::Array(items) => items.iter_mut().for_each(shorten),
            _ => {}
        }
    }
}

/// Where `d` ends when cut to the whole sentences within `max` bytes: after the last full stop
/// that a space and a capital, a quote or a backquote follow (so not in "e.g. the"), or else at
/// the last space.
fn sentences_within(d: &str, max: usize) -> usize {
    let max = (0..=max).rev().find(|&i| d.is_char_boundary(i)).unwrap();
    let b = d.as_bytes();
    let sentence = (1..max.min(b.len().saturating_sub(2))).rev().find(|&i| {
        b[i] == b'.'
            && b[i + 1].is_ascii_whitespace()
            && (b[i + 2].is_ascii_uppercase() || b"`\"'(".contains(&b[i + 2]))
    });
    match sentence {
        Some(i) => i + 1,
        None => d[..max].rfind(' ').unwrap_or(max),
    }
}

/// What a pod's schema says of updating a live pod, untrue of a template (a change to it
/// replaces the pod): dropped from every description.
const LIVE_POD_ONLY: [&str; 5] = [
    "This cannot be updated.",
    "Cannot be updated.",
    "Containers cannot currently be added or removed.",
    "Init containers cannot currently be added or removed.",
    "This field is immutable.",
];

/// Every description of `node` and below without what holds only of a live pod.
fn reword(node: &mut Value) {
    let Some(o) = node.as_object_mut() else {
        return;
    };
    if let Some(Value::String(d)) = o.get_mut("description") {
        for sentence in LIVE_POD_ONLY {
            while let Some(i) = d.find(sentence) {
                // The space after it goes with it; the text before it loses its trailing space
                // only when nothing follows.
                let mut end = i + sentence.len();
                if d[end..].starts_with(' ') {
                    end += 1;
                }
                let start = if end == d.len() {
                    d[..i].trim_end().len()
                } else {
                    i
                };
                d.replace_range(start..end, "");
            }
        }
        *d = d.replace("This field is immutable and no changes", "No changes");
    }
    for (_, child) in o.iter_mut() {
        match child {
            Value::Object(_) => reword(child),
            Value::Array(items) => items.iter_mut().for_each(reword),
            _ => {}
        }
    }
}

/// `node` with every `$ref` inlined and only what a CRD schema may hold.
fn resolve(node: &Value, defs: &Map<String, Value>) -> Value {
    if let Some(r) = node["$ref"].as_str() {
        let name = r.trim_start_matches("#/$defs/");
        let mut inlined = special(name).unwrap_or_else(|| resolve(&defs[name], defs));
        // The field's own description says more than its type's.
        if let Some(d) = node.get("description") {
            inlined["description"] = d.clone();
        }
        return inlined;
    }
    let mut out = Map::new();
    for (k, v) in node.as_object().unwrap() {
        let kept = match k.as_str() {
            // JSON Schema's `["string", "null"]`: a CRD's type is one, and null is pruned.
            "type" => match v {
                Value::Array(types) => types.iter().find(|t| *t != "null").unwrap().clone(),
                one => one.clone(),
            },
            "format"
            | "description"
            | "required"
            | "x-kubernetes-list-type"
            | "x-kubernetes-list-map-keys"
            | "x-kubernetes-map-type" => v.clone(),
            "items" | "additionalProperties" if v.is_object() => resolve(v, defs),
            "properties" => Value::Object(
                v.as_object()
                    .unwrap()
                    .iter()
                    .map(|(p, s)| (p.clone(), resolve(s, defs)))
                    .collect(),
            ),
            // Strategic-merge hints, unions: nothing a CRD schema knows.
            _ => continue,
        };
        out.insert(k.clone(), kept);
    }
    Value::Object(out)
}

/// The schemas a CRD writes its own way.
fn special(name: &str) -> Option<Value> {
    let int_or_string = json!({
        "anyOf": [{"type": "integer"}, {"type": "string"}],
        "x-kubernetes-int-or-string": true
    });
    match name {
        "io.k8s.apimachinery.pkg.util.intstr.IntOrString" => Some(int_or_string),
        "io.k8s.apimachinery.pkg.api.resource.Quantity" => {
            let mut q = int_or_string;
            q["pattern"] = json!(QUANTITY_PATTERN);
            Some(q)
        }
        // Embedded metadata: the API server keeps only what the schema names, and of a pod
        // template the operator uses labels and annotations (its name and namespace are ours).
        "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta" => {
            let map = |what: &str| {
                json!({"type": "object", "additionalProperties": {"type": "string"},
                       "description": what})
            };
            Some(json!({"type": "object", "properties": {
                "labels": map("Labels for the pod; the operator's own labels win where they collide."),
                "annotations": map("Annotations for the pod; the operator's own annotations win where they collide."),
            }}))
        }
        _ => None,
    }
}

/// List-map keys that are not required and that Kubernetes defaults, as (list, key, default):
/// a port's protocol is TCP (`SetDefaults_ContainerPort`). 1.37's JSON Schema has no defaults,
/// and a CRD's list-map key must be required or defaulted; a default here is applied to the
/// stored object, as the API server applies it to a pod.
const KEY_DEFAULTS: [(&str, &str, &str); 1] = [("ports", "protocol", "TCP")];

/// Keeps a list's `x-kubernetes-list-type: map` where the API server allows it on a CRD, each
/// key required or defaulted (with [`KEY_DEFAULTS`]), and makes any other list atomic, as
/// before: duplicates of a kept one's keys are refused at admission, where a pod would be
/// refused at every create. `at` is the node's property name.
fn list_maps(node: &mut Value, at: &str) {
    let o = node.as_object_mut().unwrap();
    if o.get("x-kubernetes-list-type") == Some(&json!("map")) {
        let keys: Vec<String> = o["x-kubernetes-list-map-keys"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| k.as_str().unwrap().to_string())
            .collect();
        let items = o.get_mut("items").unwrap();
        let mut usable = true;
        for k in &keys {
            let required = items["required"]
                .as_array()
                .is_some_and(|r| r.contains(&json!(k)));
            let default = KEY_DEFAULTS
                .iter()
                .find(|(list, key, _)| *list == at && key == k);
            match (required, default) {
                (true, _) => {}
                (false, Some((_, _, d))) => items["properties"][k]["default"] = json!(d),
                (false, None) => usable = false,
            }
        }
        if !usable {
            o.remove("x-kubernetes-list-type");
            o.remove("x-kubernetes-list-map-keys");
        }
    }
    for (p, s) in o
        .get_mut("properties")
        .and_then(Value::as_object_mut)
        .into_iter()
        .flatten()
    {
        list_maps(s, p);
    }
    for k in ["items", "additionalProperties"] {
        if let Some(s) = o.get_mut(k).filter(|s| s.is_object()) {
            list_maps(s, at);
        }
    }
}

/// The generated schema as YAML lines under `template:`, at the CRD's indentation.
fn render(schema: &Value) -> String {
    let yaml = serde_yaml::to_string(&sorted(schema)).unwrap();
    let pad = " ".repeat(INDENT);
    let mut out = format!(
        "{pad}{BEGIN}: do not edit, run `make generate` (tests/crd_schema.rs)\n{pad}template:\n"
    );
    for line in yaml.lines() {
        out.push_str(&format!("{pad}  {line}\n"));
    }
    out.push_str(&format!("{pad}{END}\n"));
    out
}

/// `v` as YAML with its keys in order, whatever order the JSON map keeps.
fn sorted(v: &Value) -> serde_yaml::Value {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            let mut out = serde_yaml::Mapping::new();
            for k in keys {
                out.insert(serde_yaml::Value::from(k.as_str()), sorted(&m[k]));
            }
            serde_yaml::Value::Mapping(out)
        }
        Value::Array(items) => serde_yaml::Value::Sequence(items.iter().map(sorted).collect()),
        other => serde_yaml::to_value(other).unwrap(),
    }
}

/// The CRD with its generated part replaced by `generated`.
fn spliced(crd: &str, generated: &str) -> String {
    let start = crd
        .find(&format!("{}{BEGIN}", " ".repeat(INDENT)))
        .expect("the CRD has no generated part");
    let end = crd[start..].find(END).unwrap() + start + END.len() + 1;
    format!("{}{generated}{}", &crd[..start], &crd[end..])
}

#[test]
fn the_crds_template_schema_is_the_one_generated_from_the_api_servers() {
    let path = root().join(CRD);
    let crd = std::fs::read_to_string(&path).unwrap();
    let want = spliced(&crd, &render(&generate()));
    if std::env::var_os("IMMORTAL_REGENERATE_CRD").is_some() {
        std::fs::write(&path, &want).unwrap();
        return;
    }
    assert!(
        crd == want,
        "{CRD} has drifted from the schema generated from {SCHEMA}: run `make generate`"
    );
}

#[test]
fn the_crd_fits_a_client_side_apply() {
    let crd: Value = serde_yaml::from_str(&std::fs::read_to_string(root().join(CRD)).unwrap())
        .expect("the CRD is YAML");
    let size = serde_json::to_vec(&crd).unwrap().len();
    println!("CRD as JSON (what kubectl's last-applied annotation holds): {size} bytes");
    assert!(size < APPLY_LIMIT, "{size} bytes");
}

#[test]
fn the_template_schema_is_structural() {
    fn check(node: &Value, path: &str, problems: &mut Vec<String>) {
        let o = node.as_object().unwrap();
        let typed = o.contains_key("type") || o.contains_key("x-kubernetes-int-or-string");
        if !typed {
            problems.push(format!("{path}: no type"));
        }
        for k in o.keys() {
            if k.starts_with('$') || k == "allOf" || k == "oneOf" || k.contains("patch") {
                problems.push(format!("{path}: {k}"));
            }
        }
        if o.contains_key("properties") && o.contains_key("additionalProperties") {
            problems.push(format!("{path}: properties and additionalProperties"));
        }
        if o.get("x-kubernetes-list-type") == Some(&json!("map")) {
            let items = &o["items"];
            for k in o["x-kubernetes-list-map-keys"].as_array().unwrap() {
                let required = items["required"].as_array().is_some_and(|r| r.contains(k));
                let defaulted = items["properties"][k.as_str().unwrap()]
                    .get("default")
                    .is_some();
                if !(required || defaulted) {
                    problems.push(format!(
                        "{path}: list-map key {k} neither required nor defaulted"
                    ));
                }
            }
        }
        for (p, s) in o
            .get("properties")
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
        {
            check(s, &format!("{path}.properties.{p}"), problems);
        }
        for k in ["items", "additionalProperties"] {
            if let Some(s) = o.get(k).filter(|s| s.is_object()) {
                check(s, &format!("{path}.{k}"), problems);
            }
        }
    }
    let mut problems = Vec::new();
    check(&generate(), "template", &mut problems);
    assert!(problems.is_empty(), "{problems:#?}");
}

/// Every property of `node` and below, with its path (`spec.template.spec.containers`).
fn properties<'a>(node: &'a Value, path: &str, out: &mut Vec<(String, &'a Value)>) {
    for (p, s) in node["properties"].as_object().into_iter().flatten() {
        let at = if path.is_empty() {
            p.clone()
        } else {
            format!("{path}.{p}")
        };
        properties(s, &at, out);
        out.push((at, s));
    }
    for k in ["items", "additionalProperties"] {
        if let Some(s) = node.get(k).filter(|s| s.is_object()) {
            properties(s, path, out);
        }
    }
}

/// What `kubectl explain immortalcontainer.FIELD` shows: every property says what it is, as it
/// behaves here; none says "Cannot be updated", which a pod's schema says of a live pod while
/// a change to a template replaces the pod.
#[test]
fn every_property_of_the_crd_has_a_description_and_none_says_it_cannot_be_updated() {
    let crd: Value = serde_yaml::from_str(&std::fs::read_to_string(root().join(CRD)).unwrap())
        .expect("the CRD is YAML");
    let mut checked = 0;
    let mut problems = Vec::new();
    for version in crd["spec"]["versions"].as_array().unwrap() {
        let schema = &version["schema"]["openAPIV3Schema"];
        let mut all = vec![(String::new(), schema)];
        properties(schema, "", &mut all);
        for (path, node) in all {
            checked += 1;
            let d = node["description"].as_str().unwrap_or("").trim();
            let lower = d.to_lowercase();
            // The object's metadata may carry nothing but name and generateName, no
            // description: a real API server refuses the CRD (fixture 27). kubectl explain
            // shows ObjectMeta's own documentation there.
            if path == "metadata" {
                if !d.is_empty() {
                    problems.push(format!(
                        "{path}: a description, which the API server refuses"
                    ));
                }
                continue;
            }
            if d.is_empty() {
                problems.push(format!("{path}: no description"));
            } else if lower.contains("cannot be updated")
                || lower.contains("cannot currently be added or removed")
                || lower.contains("this field is immutable")
            {
                problems.push(format!("{path}: {d}"));
            }
        }
    }
    assert!(checked > 500, "only {checked} properties found");
    assert!(problems.is_empty(), "{problems:#?}");
}

/// The template's descriptions are Kubernetes' own, cut as controller-gen's `maxDescLen` cuts
/// them where they are long: a cut one keeps its first whole sentences and says it was cut.
#[test]
fn long_descriptions_in_the_template_are_cut_to_whole_sentences_and_marked() {
    let t = generate();
    let mut all = vec![(String::from("template"), &t)];
    properties(&t, "template", &mut all);
    let mut cut = 0;
    for (path, node) in all {
        let d = node["description"].as_str().unwrap_or("");
        assert!(d.len() <= MAX_DESC + CUT.len(), "{path}: {} bytes", d.len());
        if let Some(kept) = d.strip_suffix(CUT) {
            cut += 1;
            assert!(kept.ends_with('.') || !kept.ends_with(' '), "{path}: {d}");
        }
    }
    assert!(cut > 50, "only {cut} cut: is MAX_DESC still needed?");
    assert_eq!(
        sentences_within("One. Two, e.g. three. Four.", 24),
        "One. Two, e.g. three.".len()
    );
}

/// The Ready condition's reasons the CRD lists are the README's, the table users read.
#[test]
fn the_crd_names_the_ready_reasons_the_readme_explains() {
    let crd: Value =
        serde_yaml::from_str(&std::fs::read_to_string(root().join(CRD)).unwrap()).unwrap();
    let reason = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
        ["properties"]["conditions"]["items"]["properties"]["reason"]["description"]
        .as_str()
        .expect("a description of status.conditions[].reason")
        .to_string();
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let table = readme
        .split("## What the status says")
        .nth(1)
        .expect("README: What the status says");
    let mut readme_reasons: Vec<&str> = table
        .lines()
        .take_while(|l| !l.starts_with("## "))
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .filter(|r| r.chars().next().is_some_and(|c| c.is_ascii_uppercase()))
        .collect();
    // PodRunning is named in the text above the table, as the True reason.
    readme_reasons.push("PodRunning");
    readme_reasons.sort();
    let mut crd_reasons: Vec<&str> = reason
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| readme_reasons.contains(w) || w.starts_with("Pod") && w.len() > 3)
        .collect();
    crd_reasons.sort();
    crd_reasons.dedup();
    assert_eq!(crd_reasons, readme_reasons, "in the CRD: {reason}");
}
