//! The order the test server's modules are layered in, top-down, and the test that keeps it:
//! a module imports only modules below it, so no two import each other and the folder reads
//! top-down, handlers first, plain types last. A new file gets its place here.

/// Every module but `lib.rs`, top-down, in groups. A module may name (`crate::m`) only modules
/// listed after it: those of the groups below, and those after it in its own.
const LAYERS: &[&[&str]] = &[
    // Serving requests: connections, routing and verbs, then one kind of request each.
    &["server", "api", "review", "token", "watch"],
    // What the handlers pass each other.
    &["reply", "route"],
    // The simulated cluster.
    &[
        "cluster",
        "kubelet",
        "runtime",
        "scheduler",
        "lifecycle",
        "nodes",
        "taints",
    ],
    // The state connections, the cluster and `TestServer` share.
    &["shared"],
    // Request machinery.
    &[
        "accept",
        "admission",
        "policy_admission",
        "table",
        "discovery",
        "openapi",
        "auth",
        "rbac",
        "faults",
        "cost",
        "http",
        "tls",
        "patch",
    ],
    // Objects: the store, what a write does, validation, the stored-only kinds, selectors.
    &["store", "strategy", "validate", "inert", "selector"],
    // The kinds, and the rules of the pod spec, of admission policies and of CRD schemas.
    &["resources", "policy", "podspec", "structural"],
    // Plain helpers.
    &["cel", "names", "regex", "status", "util"],
];

/// The modules a source file names through `crate::` (`use crate::a::b`, `crate::a::f()`,
/// `use crate::{a, b}`), comments left out.
fn named_modules(source: &str) -> Vec<String> {
    let mut names = Vec::new();
    for line in source.lines() {
        // Cuts a URL inside a string too; that only skips the rest of such a line.
        let code = line.split("//").next().unwrap_or("");
        for (i, _) in code.match_indices("crate::") {
            let rest = &code[i + "crate::".len()..];
            let segments = match rest.strip_prefix('{') {
                Some(group) => group.split('}').next().unwrap_or("").split(',').collect(),
                None => vec![rest],
            };
            for s in segments {
                let name: String = s
                    .trim()
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                    .collect();
                if !name.is_empty() {
                    names.push(name);
                }
            }
        }
    }
    names
}

#[test]
fn every_module_imports_only_modules_below_it() {
    let order: Vec<&str> = LAYERS.iter().flat_map(|l| l.iter().copied()).collect();
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    for entry in std::fs::read_dir(&src).expect("src readable") {
        let path = entry.expect("dir entry").path();
        let Some(stem) = path.file_stem().and_then(|s| s.to_str()) else {
            continue;
        };
        if path.extension().is_some_and(|e| e == "rs") && !["lib", "main", "layers"].contains(&stem)
        {
            files.push((stem.to_string(), path.clone()));
        }
    }
    let mut wrong = Vec::new();
    for (module, path) in &files {
        let Some(at) = order.iter().position(|m| m == module) else {
            wrong.push(format!(
                "{module}.rs is not in LAYERS (src/layers.rs): place it"
            ));
            continue;
        };
        let source = std::fs::read_to_string(path).expect("source readable");
        for named in named_modules(&source) {
            match order.iter().position(|m| *m == named) {
                Some(below) if below > at => {}
                Some(_) if named == *module => {}
                Some(_) => wrong.push(format!("{module}.rs names {named}, which is above it")),
                // `crate::TestServer` and the like: lib.rs, the top.
                None => {}
            }
        }
    }
    for listed in &order {
        if !files.iter().any(|(m, _)| m == listed) {
            wrong.push(format!("LAYERS lists {listed}, which has no file"));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

#[test]
fn named_modules_reads_paths_groups_and_skips_comments() {
    let source = "use crate::store::{Obj, Store};\nuse crate::{api, http::Conn};\n\
                  // crate::server is named in a comment only\nlet x = crate::util::hex(b);";
    assert_eq!(named_modules(source), ["store", "api", "http", "util"]);
}
