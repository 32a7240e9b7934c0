//! Generates the CRD's schema of `spec.template` from the v1.28 API server's own OpenAPI
//! schema of PodTemplateSpec, and fails when config/crd/immortalcontainers.yaml has drifted
//! from it. `make generate` (IMMORTAL_REGENERATE_CRD=1) writes it instead.
//!
//! What a structural CRD schema cannot hold is turned into what it can, as controller-gen does
//! from the Go types: `$ref`s and their `allOf` wrappers inlined (the field's own description
//! kept), int-or-string and quantities as `x-kubernetes-int-or-string` (quantities with their
//! pattern, so `memory: lots` is refused at admission), embedded metadata reduced to labels and
//! annotations, defaults and strategic-merge hints dropped (a CRD has neither), list-map keys
//! kept where each key is required or has a default, as the API server requires.

use immortal_operator::immortal::desired::OPERATOR_FIELDS;
use serde_json::{json, Map, Value};
use std::path::PathBuf;

const OPENAPI: &str = "tests/fixtures/kube-1.28-kubelet/openapi/core-v1-podtemplatespec.json";
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

/// kube-openapi's pattern for a `resource.Quantity`, as controller-gen writes it.
const QUANTITY_PATTERN: &str = r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The schema of `spec.template`.
fn generate() -> Value {
    let openapi: Value =
        serde_json::from_str(&std::fs::read_to_string(root().join(OPENAPI)).unwrap()).unwrap();
    let schemas = openapi["components"]["schemas"].as_object().unwrap();
    let mut t = resolve(
        &json!({"$ref": "#/components/schemas/io.k8s.api.core.v1.PodTemplateSpec"}),
        schemas,
    );
    strip_defaults(&mut t, false);
    t["description"] = json!(
        "The pod to run, as a Deployment's pod template: its labels, annotations and spec. The \
         container named acontainer runs spec.image (added first if the template does not name \
         it); restartPolicy, nodeName and ephemeralContainers are the operator's."
    );
    let spec = t["properties"]["spec"]["properties"]
        .as_object_mut()
        .unwrap();
    for f in OPERATOR_FIELDS {
        assert!(spec.remove(f).is_some(), "{f} is no PodSpec field");
    }
    // A template may leave the containers out: acontainer is added.
    let pod_spec = &mut t["properties"]["spec"];
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

/// `node` with every `$ref` inlined and only what a CRD schema may hold.
fn resolve(node: &Value, schemas: &Map<String, Value>) -> Value {
    let reference = node["$ref"]
        .as_str()
        .or_else(|| node["allOf"][0]["$ref"].as_str());
    let mut out = match reference {
        Some(r) => {
            let name = r.trim_start_matches("#/components/schemas/");
            let mut inlined = special(name).unwrap_or_else(|| resolve(&schemas[name], schemas));
            // The field's own description says more than its type's.
            if let Some(d) = node.get("description") {
                inlined["description"] = d.clone();
            }
            return inlined;
        }
        None => Map::new(),
    };
    for (k, v) in node.as_object().unwrap() {
        let kept = match k.as_str() {
            "type"
            | "format"
            | "description"
            | "required"
            | "enum"
            | "x-kubernetes-list-type"
            | "x-kubernetes-list-map-keys"
            | "x-kubernetes-map-type"
            | "default" => v.clone(),
            "items" | "additionalProperties" if v.is_object() => resolve(v, schemas),
            "properties" => Value::Object(
                v.as_object()
                    .unwrap()
                    .iter()
                    .map(|(p, s)| (p.clone(), resolve(s, schemas)))
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

/// Drops every `default` (a CRD would apply them, where the API server leaves a pod field
/// unset), but those of list-map keys that are not required: the API server refuses a list
/// type `map` whose keys are neither. A list whose keys have neither stays atomic.
fn strip_defaults(node: &mut Value, keep_default: bool) {
    let o = node.as_object_mut().unwrap();
    if !keep_default {
        o.remove("default");
    }
    let mut keys: Vec<String> = Vec::new();
    if o.get("x-kubernetes-list-type") == Some(&json!("map")) {
        keys = o["x-kubernetes-list-map-keys"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| k.as_str().unwrap().to_string())
            .collect();
        let items = &o["items"];
        let usable = keys.iter().all(|k| {
            items["required"]
                .as_array()
                .is_some_and(|r| r.contains(&json!(k)))
                || items["properties"][k].get("default").is_some()
        });
        if !usable {
            o.remove("x-kubernetes-list-type");
            o.remove("x-kubernetes-list-map-keys");
            keys.clear();
        }
    }
    if let Some(items) = o.get_mut("items") {
        let io = items.as_object_mut().unwrap();
        io.remove("default");
        let required = io.get("required").cloned().unwrap_or(json!([]));
        for (p, s) in io
            .get_mut("properties")
            .and_then(Value::as_object_mut)
            .into_iter()
            .flatten()
        {
            strip_defaults(
                s,
                keys.contains(p) && !required.as_array().unwrap().contains(&json!(p)),
            );
        }
        for k in ["items", "additionalProperties"] {
            if let Some(s) = io.get_mut(k).filter(|s| s.is_object()) {
                strip_defaults(s, false);
            }
        }
    }
    for (_, s) in o
        .get_mut("properties")
        .and_then(Value::as_object_mut)
        .into_iter()
        .flatten()
    {
        strip_defaults(s, false);
    }
    if let Some(s) = o.get_mut("additionalProperties").filter(|s| s.is_object()) {
        strip_defaults(s, false);
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
        "{CRD} has drifted from the schema generated from {OPENAPI}: run `make generate`"
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
