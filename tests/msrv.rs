//! The minimum Rust version the workspace states (`rust-version`, and the README's set-up) is
//! one the locked dependencies build with: a `cargo update` that pulls in a crate needing a
//! newer Rust fails here, naming the crate, instead of on a user's older toolchain.
//!
//! `cargo metadata` lists, for every locked package, the `rust-version` its manifest declares;
//! what the workspace needs is the highest of those over what its members build (their
//! dependencies, build dependencies, and the development dependencies `make test` builds).

use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// `cargo metadata` ends well within this, or the test fails.
const BOUND: Duration = Duration::from_secs(120);

/// `1.88`, `1.88.0` → (1, 88, 0).
fn version(v: &str) -> (u64, u64, u64) {
    let mut parts = v.trim().split('.').map(|p| {
        p.parse::<u64>()
            .unwrap_or_else(|_| panic!("not a Rust version: {v:?}"))
    });
    let mut next = || parts.next().unwrap_or(0);
    (next(), next(), next())
}

/// Runs `cargo metadata` with `extra` arguments within [`BOUND`]; its JSON, or why not.
fn metadata(extra: &[&str]) -> Result<Value, String> {
    let dir = std::env::temp_dir().join(format!("immortal-msrv-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out_path = dir.join(format!("out-{}", extra.len()));
    let err_path = dir.join(format!("err-{}", extra.len()));
    let mut child = Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--locked"])
        .args(extra)
        .current_dir(ROOT)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    let deadline = Instant::now() + BOUND;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("cargo metadata {extra:?} took over {BOUND:?}"));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = std::fs::read_to_string(&out_path).unwrap_or_default();
    let err = std::fs::read_to_string(&err_path).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    if !status.success() {
        return Err(format!("cargo metadata {extra:?}: {status}: {err}"));
    }
    serde_json::from_str(&out).map_err(|e| format!("cargo metadata {extra:?}: {e}"))
}

/// The host's target triple, from `rustc -vV`.
fn host() -> Option<String> {
    let out = Command::new("rustc").arg("-vV").output().ok()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_string))
}

/// The workspace's metadata: offline first (a built workspace has every crate it builds on
/// this machine, and tests should not need the network); every platform's crates when they
/// are all downloaded, else this host's, else asking the registry.
fn workspace_metadata() -> Value {
    let mut errors = Vec::new();
    let host = host();
    let mut attempts: Vec<Vec<&str>> = vec![vec!["--offline"]];
    if let Some(h) = host.as_deref() {
        attempts.push(vec!["--offline", "--filter-platform", h]);
    }
    attempts.push(vec![]);
    for extra in attempts {
        match metadata(&extra) {
            Ok(v) => return v,
            Err(e) => errors.push(e),
        }
    }
    panic!("cargo metadata failed:\n{}", errors.join("\n"));
}

#[test]
fn no_locked_dependency_needs_a_newer_rust_than_the_workspace_states() {
    let meta = workspace_metadata();
    let packages: BTreeMap<&str, &Value> = meta["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .map(|p| (p["id"].as_str().expect("id"), p))
        .collect();
    let members: BTreeSet<&str> = meta["workspace_members"]
        .as_array()
        .expect("workspace_members")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let nodes: BTreeMap<&str, &Value> = meta["resolve"]["nodes"]
        .as_array()
        .expect("resolve.nodes")
        .iter()
        .map(|n| (n["id"].as_str().expect("id"), n))
        .collect();

    // Every member states the same version; it is what the workspace promises.
    let stated: BTreeSet<&str> = members
        .iter()
        .map(|m| {
            packages[m]["rust_version"]
                .as_str()
                .unwrap_or_else(|| panic!("{m} states no rust-version"))
        })
        .collect();
    assert_eq!(
        stated.len(),
        1,
        "the workspace members state different rust-versions: {stated:?}"
    );
    let stated = *stated.first().unwrap();

    // What is built: from each member, its normal, build and dev dependencies; from there on,
    // normal and build dependencies only (a dependency's own dev-dependencies are not built).
    let mut built = BTreeSet::new();
    let mut todo: Vec<&str> = members.iter().copied().collect();
    while let Some(id) = todo.pop() {
        if !built.insert(id) {
            continue;
        }
        for dep in nodes[id]["deps"].as_array().into_iter().flatten() {
            let builds = dep["dep_kinds"].as_array().into_iter().flatten().any(|k| {
                match k["kind"].as_str() {
                    None | Some("build") => true,
                    Some("dev") => members.contains(id),
                    Some(_) => false,
                }
            });
            if builds {
                todo.push(dep["pkg"].as_str().expect("pkg"));
            }
        }
    }
    assert!(built.len() > members.len(), "no dependencies found");

    let mut too_new: Vec<String> = built
        .iter()
        .filter_map(|id| {
            let p = packages[id];
            let needs = p["rust_version"].as_str()?;
            let (name, v) = (p["name"].as_str()?, p["version"].as_str()?);
            (version(needs) > version(stated)).then(|| format!("{name} {v} needs Rust {needs}"))
        })
        .collect();
    too_new.sort();
    assert!(
        too_new.is_empty(),
        "Cargo.lock holds crates that need a newer Rust than the rust-version {stated} the \
         workspace states; raise rust-version (and the README's set-up), or pin them older \
         (cargo update -p NAME --precise VERSION):\n  {}",
        too_new.join("\n  ")
    );

    // And the stated version is what they need, not older: the highest among them.
    let needed = built
        .iter()
        .filter(|id| !members.contains(*id))
        .filter_map(|id| packages[id]["rust_version"].as_str())
        .map(version)
        .max()
        .unwrap_or((0, 0, 0));
    assert_eq!(
        version(stated),
        needed,
        "rust-version {stated} is higher than any locked dependency needs ({needed:?}): state \
         what the lock really needs"
    );
}

#[test]
fn the_readme_states_the_workspace_rust_version() {
    let manifest = std::fs::read_to_string(format!("{ROOT}/Cargo.toml")).unwrap();
    let stated = manifest
        .lines()
        .find_map(|l| l.strip_prefix("rust-version = "))
        .expect("rust-version in Cargo.toml")
        .trim_matches('"');
    let readme = std::fs::read_to_string(format!("{ROOT}/README.md")).unwrap();
    let want = format!("Rust {stated} or newer");
    assert!(
        readme.contains(&want),
        "the README's set-up should say {want:?}, as Cargo.toml's rust-version does"
    );
}

#[test]
fn versions_compare_as_numbers() {
    assert!(version("1.88") > version("1.80.1"));
    assert!(version("1.100") > version("1.99.9"));
    assert_eq!(version("1.88"), version("1.88.0"));
}
