//! The packaging: the manifests under config/ that `make deploy` and `make build-installer`
//! render, the one-file installer the Makefile writes, and the platforms the image builds for.
//!
//! Most of it is checked without kubectl (a fake one stands in where the Makefile calls it), so
//! it runs anywhere. One test renders the installer with the real `kubectl kustomize`, because
//! only kustomize can say what kustomize makes of config/; it fails, rather than skips, where
//! kubectl is missing (set `KUBECTL` to use another binary).

use serde::Deserialize;
use serde_yaml::Value;
use std::collections::BTreeSet;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
/// The CRD the operator serves: its group and version are fixed in the operator's code.
const CRD_NAME: &str = "immortalcontainers.immortalcontainer.flugel.it";
const GROUP: &str = "immortalcontainer.flugel.it";
/// Kinds that kustomize leaves without a namespace; every other kind here is namespaced.
const CLUSTER_SCOPED: [&str; 4] = [
    "Namespace",
    "CustomResourceDefinition",
    "ClusterRole",
    "ClusterRoleBinding",
];
/// A make run (and the kubectl it starts) ends well within this, or the test fails.
const MAKE_BOUND: Duration = Duration::from_secs(60);

fn root() -> &'static Path {
    Path::new(ROOT)
}

/// Every document of a YAML file, empty ones (a lone `---`) left out.
fn documents(path: &Path) -> Vec<Value> {
    let text = fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_yaml::Deserializer::from_str(&text)
        .map(|doc| Value::deserialize(doc).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        .filter(|v| !v.is_null())
        .collect()
}

fn str_at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a str> {
    path.iter().try_fold(v, |v, k| v.get(k))?.as_str()
}

fn seq_at<'a>(v: &'a Value, path: &[&str]) -> &'a [Value] {
    path.iter()
        .try_fold(v, |v, k| v.get(k))
        .and_then(Value::as_sequence)
        .map_or(&[], Vec::as_slice)
}

fn kind(o: &Value) -> &str {
    str_at(o, &["kind"]).unwrap_or("")
}

fn name(o: &Value) -> &str {
    str_at(o, &["metadata", "name"]).unwrap_or("")
}

fn id(o: &Value) -> (String, String) {
    (kind(o).to_string(), name(o).to_string())
}

/// The `resources:` of a kustomization, as written.
fn resources(kustomization: &Value) -> Vec<String> {
    seq_at(kustomization, &["resources"])
        .iter()
        .map(|r| r.as_str().expect("a resource is a path").to_string())
        .collect()
}

fn kustomization(dir: &Path) -> Value {
    let path = dir.join("kustomization.yaml");
    assert!(
        path.is_file(),
        "{} has no kustomization.yaml",
        dir.display()
    );
    let mut docs = documents(&path);
    assert_eq!(docs.len(), 1, "{}: one document", path.display());
    docs.remove(0)
}

/// The objects a kustomization directory renders, following directory resources, before any
/// transformation (namespace, images).
fn objects(dir: &Path) -> Vec<Value> {
    resources(&kustomization(dir))
        .iter()
        .flat_map(|r| {
            let path = dir.join(r);
            if path.is_dir() {
                objects(&path)
            } else {
                documents(&path)
            }
        })
        .collect()
}

/// The image's name as kustomize's `images:` transformer matches it: without tag or digest.
fn image_name(image: &str) -> &str {
    let image = image.split('@').next().unwrap_or(image);
    let last = image.rfind('/').map_or(0, |i| i + 1);
    match image[last..].rfind(':') {
        Some(i) => &image[..last + i],
        None => image,
    }
}

fn the_one<'a>(objs: &'a [Value], k: &str) -> &'a Value {
    let found: Vec<&Value> = objs.iter().filter(|o| kind(o) == k).collect();
    assert_eq!(found.len(), 1, "exactly one {k}, found {}", found.len());
    found[0]
}

fn containers(deployment: &Value) -> &[Value] {
    seq_at(deployment, &["spec", "template", "spec", "containers"])
}

/// Runs a command to completion within `bound`, output captured through files (a pipe could
/// fill and stall it); kills it and fails the test if it takes longer. Err: it could not start.
fn run_bounded(cmd: &mut Command, bound: Duration) -> std::io::Result<(bool, String, String)> {
    let scratch = tempdir("run");
    let out = scratch.join("stdout");
    let err = scratch.join("stderr");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(fs::File::create(&out).unwrap())
        .stderr(fs::File::create(&err).unwrap())
        .spawn()?;
    let deadline = Instant::now() + bound;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{cmd:?} did not finish within {bound:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let read = |p: &Path| fs::read_to_string(p).unwrap_or_default();
    let result = (status.success(), read(&out), read(&err));
    let _ = fs::remove_dir_all(&scratch);
    Ok(result)
}

/// A fresh directory of this test process's own under the system temp dir.
fn tempdir(what: &str) -> PathBuf {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "immortal-packaging-{}-{what}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    dir
}

/// A directory to run the Makefile in, away from the source tree (build-installer writes
/// dist/ into the directory make runs in): a copy of the Makefile (its targets call make again
/// on the Makefile of the directory they run in) and config/ through a symlink, as the
/// Makefile's own render overlay reaches it.
fn make_dir() -> PathBuf {
    let dir = tempdir("make");
    fs::copy(root().join("Makefile"), dir.join("Makefile")).unwrap();
    std::os::unix::fs::symlink(root().join("config"), dir.join("config")).unwrap();
    dir
}

/// `make ARGS...` in `dir`, with `env` added: whether it succeeded, its stdout and stderr.
fn make_in(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> (bool, String, String) {
    let mut cmd = Command::new("make");
    // Under `make test` the outer make's flags and variables would reach this one.
    cmd.env_remove("MAKEFLAGS")
        .env_remove("MFLAGS")
        .env_remove("MAKELEVEL")
        .envs(env.iter().copied())
        .arg("--no-print-directory")
        .arg("-C")
        .arg(dir)
        .args(args);
    run_bounded(&mut cmd, MAKE_BOUND).expect("cannot run make")
}

fn make_build_installer(dir: &Path, img: &str, kubectl: &str) -> (bool, String, String) {
    make_in(
        dir,
        &[
            "build-installer",
            &format!("IMG={img}"),
            &format!("KUBECTL={kubectl}"),
            // The tag-less and :latest cases are meant here; the refusal has its own test.
            "ALLOW_LATEST=1",
        ],
        &[],
    )
}

/// A stand-in for kubectl, as the KUBECTL command: `kustomize DIR` keeps a copy of
/// DIR/kustomization.yaml (the overlay render writes) beside the script and prints `output`,
/// then exits with `code`. Run through sh, not executed itself: exec of a file just written can
/// fail with ETXTBSY while another test thread forks.
fn fake_kubectl(dir: &Path, output: &str, code: i32) -> String {
    let script = dir.join("fake-kubectl");
    let body = format!(
        "#!/bin/sh\n\
         [ \"$1\" = kustomize ] || {{ echo \"fake kubectl: unexpected $*\" >&2; exit 2; }}\n\
         cp \"$2/kustomization.yaml\" '{overlay}'\n\
         cat <<'EOF'\n{output}EOF\n\
         exit {code}\n",
        overlay = dir.join("overlay.yaml").display(),
    );
    fs::write(&script, body).unwrap();
    format!("sh {}", script.display())
}

fn dist_leftovers(dir: &Path) -> Vec<String> {
    fs::read_dir(dir.join("dist"))
        .map(|entries| {
            entries
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|n| n != "install.yaml")
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn every_kustomization_lists_files_that_exist_and_every_manifest_is_listed() {
    let mut dirs = vec![root().join("config")];
    let mut checked = 0;
    while let Some(dir) = dirs.pop() {
        let mut manifests = BTreeSet::new();
        for entry in fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "yaml")
                && path.file_name().unwrap() != "kustomization.yaml"
            {
                manifests.insert(path.file_name().unwrap().to_string_lossy().into_owned());
            }
        }
        if !dir.join("kustomization.yaml").exists() {
            // A manifest outside any kustomization is never deployed by anything.
            assert!(
                manifests.is_empty(),
                "{} holds {manifests:?} but no kustomization.yaml",
                dir.display()
            );
            continue;
        }
        let listed = resources(&kustomization(&dir));
        for r in &listed {
            let path = dir.join(r);
            assert!(
                path.exists(),
                "{}/kustomization.yaml lists {r}, which does not exist",
                dir.display()
            );
            if path.is_dir() {
                kustomization(&path);
                continue;
            }
            let docs = documents(&path);
            assert!(!docs.is_empty(), "{} is empty", path.display());
            for doc in &docs {
                assert!(
                    str_at(doc, &["apiVersion"]).is_some() && !kind(doc).is_empty(),
                    "{}: a document without apiVersion or kind",
                    path.display()
                );
                assert!(
                    !name(doc).is_empty(),
                    "{}: a {} without a name",
                    path.display(),
                    kind(doc)
                );
            }
            checked += 1;
        }
        for m in &manifests {
            assert!(
                listed.contains(m),
                "{}/{m} is in no kustomization's resources, so nothing deploys it",
                dir.display()
            );
        }
    }
    assert!(
        checked >= 10,
        "only {checked} manifests found under config/"
    );
}

#[test]
fn config_default_holds_every_object_the_operator_needs_and_their_references_resolve() {
    let default = root().join("config/default");
    let namespace = str_at(&kustomization(&default), &["namespace"])
        .expect("config/default sets the namespace")
        .to_string();
    let objs = objects(&default);
    let has = |k: &str, n: &str| objs.iter().any(|o| kind(o) == k && name(o) == n);

    assert!(has("Namespace", &namespace), "no Namespace {namespace}");
    let crd = objs
        .iter()
        .find(|o| kind(o) == "CustomResourceDefinition" && name(o) == CRD_NAME)
        .expect("the ImmortalContainer CRD");
    assert_eq!(str_at(crd, &["spec", "group"]), Some(GROUP));
    assert!(
        seq_at(crd, &["spec", "versions"])
            .iter()
            .any(|v| str_at(v, &["name"]) == Some("v1alpha1")
                && v.get("served").and_then(Value::as_bool) == Some(true)),
        "the CRD serves no v1alpha1"
    );

    let deployment = the_one(&objs, "Deployment");
    let account = str_at(
        deployment,
        &["spec", "template", "spec", "serviceAccountName"],
    )
    .expect("the Deployment names its ServiceAccount");
    assert!(
        has("ServiceAccount", account),
        "no ServiceAccount {account}"
    );

    // What is granted to the ServiceAccount: every binding must resolve, and the roles bound to
    // the operator's account must cover every resource it calls.
    let mut granted = BTreeSet::new();
    for binding in objs
        .iter()
        .filter(|o| matches!(kind(o), "RoleBinding" | "ClusterRoleBinding"))
    {
        let role_kind = str_at(binding, &["roleRef", "kind"]).unwrap_or("");
        let role_name = str_at(binding, &["roleRef", "name"]).unwrap_or("");
        let role = objs
            .iter()
            .find(|o| kind(o) == role_kind && name(o) == role_name)
            .unwrap_or_else(|| {
                panic!(
                    "{} {} binds {role_kind} {role_name}, which is not deployed",
                    kind(binding),
                    name(binding)
                )
            });
        let mut binds_operator = false;
        for subject in seq_at(binding, &["subjects"]) {
            if str_at(subject, &["kind"]) != Some("ServiceAccount") {
                continue;
            }
            let sa = str_at(subject, &["name"]).unwrap_or("");
            assert!(
                has("ServiceAccount", sa),
                "{} binds unknown ServiceAccount {sa}",
                name(binding)
            );
            assert_eq!(
                str_at(subject, &["namespace"]),
                Some(namespace.as_str()),
                "{} binds ServiceAccount {sa} of another namespace",
                name(binding)
            );
            binds_operator |= sa == account;
        }
        if binds_operator {
            for rule in seq_at(role, &["rules"]) {
                for group in seq_at(rule, &["apiGroups"]) {
                    for resource in seq_at(rule, &["resources"]) {
                        granted.insert((
                            group.as_str().unwrap_or("").to_string(),
                            resource.as_str().unwrap_or("").to_string(),
                        ));
                    }
                }
            }
        }
    }
    let mut needed = vec![
        (GROUP, "immortalcontainers"),
        (GROUP, "immortalcontainers/status"),
        ("", "pods"),
        ("", "events"),
    ];
    let args = containers(deployment)
        .iter()
        .flat_map(|c| seq_at(c, &["args"]))
        .filter_map(Value::as_str)
        .collect::<Vec<_>>();
    if args.contains(&"--leader-elect") {
        needed.push(("coordination.k8s.io", "leases"));
    }
    for (group, resource) in needed {
        assert!(
            granted.contains(&(group.to_string(), resource.to_string())),
            "nothing bound to ServiceAccount {account} grants {resource} in group {group:?}"
        );
    }
}

#[test]
fn the_deployment_image_is_the_name_the_images_transformer_rewrites() {
    let default = root().join("config/default");
    let deployment = the_one(&objects(&default), "Deployment").clone();
    let image = str_at(&containers(&deployment)[0], &["image"]).expect("an image");
    let overlay = kustomization(&default);
    let rewritten: Vec<&str> = seq_at(&overlay, &["images"])
        .iter()
        .filter_map(|i| str_at(i, &["name"]))
        .collect();
    // kustomize rewrites only images whose name matches; any other name would ship unchanged
    // whatever IMG says.
    assert!(
        rewritten.contains(&image_name(image)),
        "the Deployment runs {image}, but config/default's images: rewrite only {rewritten:?}"
    );
}

#[test]
fn image_names_lose_their_tag_or_digest_but_keep_a_registry_port() {
    assert_eq!(image_name("immortal-operator:latest"), "immortal-operator");
    assert_eq!(image_name("immortal-operator"), "immortal-operator");
    assert_eq!(image_name("registry:5000/x/op:v1"), "registry:5000/x/op");
    assert_eq!(image_name("registry:5000/op"), "registry:5000/op");
    assert_eq!(image_name("ghcr.io/me/op@sha256:ab"), "ghcr.io/me/op");
}

#[test]
fn build_installer_writes_the_render_of_an_overlay_that_sets_img() {
    let default = root().join("config/default");
    let deployment = the_one(&objects(&default), "Deployment").clone();
    let deployed_name =
        image_name(str_at(&containers(&deployment)[0], &["image"]).unwrap()).to_string();
    let digest = format!("sha256:{}", "ab".repeat(32));
    let cases = [
        (
            "registry.example.com:5000/team/immortal-operator:v1.2.3".to_string(),
            "registry.example.com:5000/team/immortal-operator",
            ("newTag", "v1.2.3".to_string()),
        ),
        (
            "registry.example.com:5000/immortal-operator".to_string(),
            "registry.example.com:5000/immortal-operator",
            ("newTag", "latest".to_string()),
        ),
        // A tag YAML would read as a number must stay a string (kustomize refuses a number).
        (
            "registry.example.com/team/immortal-operator:1".to_string(),
            "registry.example.com/team/immortal-operator",
            ("newTag", "1".to_string()),
        ),
        (
            format!("ghcr.io/me/immortal-operator@{digest}"),
            "ghcr.io/me/immortal-operator",
            ("digest", digest.clone()),
        ),
    ];
    for (img, new_name, (pin, value)) in cases {
        let dir = make_dir();
        let rendered = "kind: Namespace\nmetadata:\n  name: rendered-for-test\n";
        let kubectl = fake_kubectl(&dir, rendered, 0);
        let (ok, out, err) = make_build_installer(&dir, &img, &kubectl);
        assert!(ok, "make build-installer IMG={img} failed:\n{out}{err}");
        assert_eq!(
            fs::read_to_string(dir.join("dist/install.yaml")).unwrap(),
            rendered,
            "dist/install.yaml is not what the render printed"
        );
        assert!(
            dist_leftovers(&dir).is_empty(),
            "left in dist/: {:?}",
            dist_leftovers(&dir)
        );

        let overlay = documents(&dir.join("overlay.yaml")).remove(0);
        assert_eq!(resources(&overlay), ["config/default"], "IMG={img}");
        let images = seq_at(&overlay, &["images"]);
        assert_eq!(images.len(), 1, "IMG={img}: {images:?}");
        assert_eq!(
            str_at(&images[0], &["name"]),
            Some(deployed_name.as_str()),
            "the overlay rewrites another image than the Deployment's"
        );
        assert_eq!(
            str_at(&images[0], &["newName"]),
            Some(new_name),
            "IMG={img}"
        );
        assert_eq!(
            str_at(&images[0], &[pin]),
            Some(value.as_str()),
            "IMG={img}"
        );
        let _ = fs::remove_dir_all(&dir);
    }
}

#[test]
fn build_installer_leaves_the_previous_installer_when_the_render_fails() {
    let dir = make_dir();
    fs::create_dir_all(dir.join("dist")).unwrap();
    fs::write(dir.join("dist/install.yaml"), "previous\n").unwrap();
    // A render that dies half way: some output, then an error.
    let kubectl = fake_kubectl(&dir, "kind: Namespace\n", 1);
    let (ok, out, err) = make_build_installer(&dir, "example/op:v1", &kubectl);
    assert!(
        !ok,
        "make build-installer succeeded with a failing render:\n{out}{err}"
    );
    assert_eq!(
        fs::read_to_string(dir.join("dist/install.yaml")).unwrap(),
        "previous\n"
    );
    assert!(
        dist_leftovers(&dir).is_empty(),
        "left in dist/: {:?}",
        dist_leftovers(&dir)
    );
    let _ = fs::remove_dir_all(&dir);
}

/// Renders with the real kubectl: what `kubectl apply -f dist/install.yaml` would get.
#[test]
fn the_installer_holds_every_object_of_config_default_in_apply_order_with_the_image_set() {
    let kubectl = std::env::var("KUBECTL").unwrap_or_else(|_| "kubectl".into());
    let probe = run_bounded(
        Command::new(&kubectl).args(["version", "--client"]),
        MAKE_BOUND,
    );
    assert!(
        probe.is_ok_and(|(ok, _, _)| ok),
        "`{kubectl} version --client` failed: this test renders config/ with kubectl's built-in \
         kustomize; install kubectl or point KUBECTL at it"
    );
    let img = "registry.example.com:5000/team/immortal-operator:v9.8.7";
    let dir = make_dir();
    let (ok, out, err) = make_build_installer(&dir, img, &kubectl);
    assert!(ok, "make build-installer failed:\n{out}{err}");
    let objs = documents(&dir.join("dist/install.yaml"));

    let want: BTreeSet<_> = objects(&root().join("config/default"))
        .iter()
        .map(id)
        .collect();
    let got: BTreeSet<_> = objs.iter().map(id).collect();
    assert_eq!(
        got, want,
        "the installer's objects differ from config/default's"
    );

    let namespace = str_at(
        &kustomization(&root().join("config/default")),
        &["namespace"],
    )
    .unwrap()
    .to_string();
    for o in &objs {
        let ns = str_at(o, &["metadata", "namespace"]);
        if CLUSTER_SCOPED.contains(&kind(o)) {
            assert_eq!(
                ns,
                None,
                "{:?} is cluster-scoped but has a namespace",
                id(o)
            );
        } else {
            assert_eq!(ns, Some(namespace.as_str()), "{:?}", id(o));
        }
    }
    // kubectl apply -f creates in file order: on a fresh cluster a namespaced object before its
    // Namespace, or a custom resource before its CRD, would be refused.
    let first_namespaced = objs
        .iter()
        .position(|o| !CLUSTER_SCOPED.contains(&kind(o)))
        .expect("namespaced objects");
    for k in ["Namespace", "CustomResourceDefinition"] {
        let at = objs.iter().position(|o| kind(o) == k).unwrap();
        assert!(
            at < first_namespaced,
            "the {k} comes after {:?}",
            id(&objs[first_namespaced])
        );
    }

    let deployment = the_one(&objs, "Deployment");
    assert_eq!(str_at(&containers(deployment)[0], &["image"]), Some(img));
    assert!(
        out.contains(&format!("wrote dist/install.yaml with image {img}\n")),
        "{out}"
    );

    // An IMG without a tag, when allowed, gets :latest, and the message says the image written, not IMG.
    let (ok, out, err) = make_build_installer(&dir, "registry.example.com/op", &kubectl);
    assert!(ok, "make build-installer failed:\n{out}{err}");
    let objs = documents(&dir.join("dist/install.yaml"));
    let image = str_at(&containers(the_one(&objs, "Deployment"))[0], &["image"]);
    assert_eq!(image, Some("registry.example.com/op:latest"));
    assert!(
        out.contains("wrote dist/install.yaml with image registry.example.com/op:latest\n"),
        "{out}"
    );
    let _ = fs::remove_dir_all(&dir);
}

/// The Makefile's docker-buildx builds each platform natively (see the Dockerfile), so every
/// platform in PLATFORMS must be an architecture the Dockerfile accepts and names a C compiler
/// for (the cc crate compiles ring's C and assembly with it).
#[test]
fn every_platform_docker_buildx_builds_is_one_the_dockerfile_builds() {
    let makefile = fs::read_to_string(root().join("Makefile")).unwrap();
    let platforms = makefile
        .lines()
        .find_map(|l| l.strip_prefix("PLATFORMS ?="))
        .expect("PLATFORMS ?= in the Makefile")
        .trim()
        .split(',')
        .map(str::to_string)
        .collect::<Vec<_>>();
    assert!(platforms.len() >= 2, "PLATFORMS = {platforms:?}");
    let dockerfile = fs::read_to_string(root().join("Dockerfile")).unwrap();
    // The builder stage's architecture check: `x86_64|aarch64) ;;`.
    let accepted = dockerfile
        .lines()
        .find_map(|l| l.trim().strip_suffix(") ;; \\"))
        .expect("the Dockerfile's architecture check")
        .split('|')
        .collect::<Vec<_>>();
    for platform in &platforms {
        // `uname -m` in a container of this platform (natively or under QEMU).
        let arch = match platform.as_str() {
            "linux/amd64" => "x86_64",
            "linux/arm64" => "aarch64",
            other => panic!("PLATFORMS has {other}, which the Dockerfile does not build"),
        };
        assert!(
            accepted.contains(&arch),
            "the Dockerfile refuses {arch}: {accepted:?}"
        );
        let cc = format!("CC_{arch}_unknown_linux_musl=musl-gcc");
        assert!(dockerfile.contains(&cc), "the Dockerfile does not set {cc}");
    }
}

#[test]
fn build_installer_refuses_an_image_without_a_fixed_tag_unless_told() {
    let dir = make_dir();
    let kubectl = fake_kubectl(&dir, "kind: Namespace\n", 0);
    let kubectl_arg = format!("KUBECTL={kubectl}");
    for img in [
        None,
        Some("registry.example.com/op"),
        Some("registry.example.com:5000/op:latest"),
    ] {
        let img_arg = img.map(|i| format!("IMG={i}"));
        let mut args = vec!["build-installer", kubectl_arg.as_str()];
        args.extend(img_arg.as_deref());
        let (ok, out, err) = make_in(&dir, &args, &[]);
        assert!(!ok, "IMG={img:?} was written:\n{out}{err}");
        assert!(
            err.contains("has no fixed tag") && err.contains("ALLOW_LATEST=1"),
            "IMG={img:?}: {err}"
        );
        assert!(
            !dir.join("dist/install.yaml").exists(),
            "IMG={img:?} left an installer"
        );
    }
    // A tag or a digest is written without being told.
    let digest = format!("IMG=ghcr.io/me/op@sha256:{}", "ab".repeat(32));
    for img in ["IMG=registry.example.com/op:v1.2.3", digest.as_str()] {
        let (ok, out, err) = make_in(&dir, &["build-installer", img, &kubectl_arg], &[]);
        assert!(ok, "{img}: {out}{err}");
    }
    let _ = fs::remove_dir_all(&dir);
}

/// A stand-in for a program the Makefile calls, run through sh (see [`fake_kubectl`]): `body`
/// is its script.
fn fake_program(dir: &Path, name: &str, body: &str) -> String {
    let script = dir.join(name);
    fs::write(&script, format!("#!/bin/sh\n{body}\n")).unwrap();
    format!("sh {}", script.display())
}

/// A cargo that prints how it was called.
fn fake_cargo(dir: &Path) -> String {
    fake_program(dir, "cargo", "echo \"cargo $*\"")
}

#[test]
fn build_static_says_what_to_install_before_cargo_runs() {
    let dir = make_dir();
    let cargo = fake_cargo(&dir);
    let cargo_arg = format!("CARGO={cargo}");
    // A toolchain whose sysroot holds no musl standard library.
    let sysroot = dir.join("sysroot");
    fs::create_dir_all(sysroot.join("lib/rustlib")).unwrap();
    let rustc = fake_program(&dir, "rustc", &format!("echo '{}'", sysroot.display()));
    let (ok, out, err) = make_in(
        &dir,
        &["build-static", &cargo_arg, &format!("RUSTC={rustc}")],
        &[],
    );
    assert!(!ok, "{out}{err}");
    assert!(err.contains("rustup target add"), "{err}");
    assert!(!out.contains("cargo build"), "cargo ran: {out}");

    // The target there, but no musl C compiler.
    let arch = std::env::consts::ARCH;
    fs::create_dir_all(sysroot.join(format!("lib/rustlib/{arch}-unknown-linux-musl"))).unwrap();
    let cc_var = format!("CC_{arch}_unknown_linux_musl");
    let (ok, out, err) = make_in(
        &dir,
        &["build-static", &cargo_arg, &format!("RUSTC={rustc}")],
        &[(&cc_var, "no-such-musl-gcc")],
    );
    assert!(!ok, "{out}{err}");
    assert!(
        err.contains("no C compiler no-such-musl-gcc") && err.contains("musl-tools"),
        "{err}"
    );
    assert!(!out.contains("cargo build"), "cargo ran: {out}");

    // Both there: cargo builds.
    let (ok, out, err) = make_in(
        &dir,
        &["build-static", &cargo_arg, &format!("RUSTC={rustc}")],
        &[(&cc_var, "sh")],
    );
    assert!(ok, "{out}{err}");
    assert!(
        out.contains(&format!(
            "cargo build --release --target {arch}-unknown-linux-musl"
        )),
        "{out}"
    );
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn make_run_against_a_cluster_binds_probes_and_metrics_to_loopback_unless_args_say() {
    let dir = make_dir();
    let cargo = fake_cargo(&dir);
    let cargo_arg = format!("CARGO={cargo}");
    let kubeconfig = dir.join("kubeconfig").display().to_string();
    let env = [("KUBECONFIG", kubeconfig.as_str())];
    let (ok, out, err) = make_in(&dir, &["run", &cargo_arg], &env);
    // The fake cargo builds nothing, so the operator it names is not there to run.
    assert!(!ok, "{out}{err}");
    // The one release build make demo and the tests make too: neither rebuilds the other's.
    let (_, demo_build, _) = make_in(&dir, &["-n", "demo", &cargo_arg], &env);
    let built = out
        .lines()
        .find(|l| l.starts_with("cargo build"))
        .unwrap_or_else(|| panic!("cargo was not run: {out}"));
    assert_eq!(
        built, "cargo build --release -p immortal-operator -p kube-testserver",
        "{out}"
    );
    assert!(
        demo_build.contains(&format!(
            "{cargo} build --release -p immortal-operator -p kube-testserver"
        )),
        "make demo builds otherwise:\n{demo_build}"
    );
    let ran = out
        .lines()
        .find(|l| l.starts_with("target/release/immortal-operator "))
        .unwrap_or_else(|| panic!("the operator was not run: {out}"));
    assert!(
        ran.contains("--health-probe-bind-address 127.0.0.1:8081")
            && ran.contains("--metrics-bind-address 127.0.0.1:8443"),
        "{ran}"
    );
    // A flag in ARGS wins, and is not given twice.
    let (ok, out, err) = make_in(
        &dir,
        &["run", &cargo_arg, "ARGS=--metrics-bind-address :9443"],
        &env,
    );
    assert!(!ok, "{out}{err}");
    let ran = out
        .lines()
        .find(|l| l.starts_with("target/release/immortal-operator "))
        .unwrap();
    assert_eq!(ran.matches("--metrics-bind-address").count(), 1, "{ran}");
    assert!(
        ran.contains("--metrics-bind-address :9443")
            && ran.contains("--health-probe-bind-address 127.0.0.1:8081"),
        "{ran}"
    );
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn demo_stop_says_only_what_it_did_and_a_demo_elsewhere_names_its_own_dir() {
    let dir = make_dir();
    let demo = dir.join("elsewhere");
    fs::create_dir_all(&demo).unwrap();
    let demo_arg = format!("DEMO_DIR={}", demo.display());
    // Nothing running, nothing to remove.
    let (ok, out, err) = make_in(&dir, &["demo-stop", &demo_arg], &[]);
    assert!(ok, "{out}{err}");
    assert!(out.contains("no demo was running"), "{out}");
    assert!(!out.contains("removed"), "{out}");

    // A demo that runs there (this test's own pid stands in for its server): make demo
    // refuses, and names the demo-stop that stops that demo, not the one in .demo.
    fs::write(demo.join("server.pid"), std::process::id().to_string()).unwrap();
    let (ok, out, err) = make_in(&dir, &["demo", &demo_arg], &[]);
    assert!(!ok, "{out}{err}");
    assert!(
        out.contains(&format!(
            "a demo is already running in {0}: make demo-stop DEMO_DIR={0} first",
            demo.display()
        )),
        "{out}"
    );
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn the_license_file_is_the_one_cargo_toml_names() {
    let manifest = fs::read_to_string(root().join("Cargo.toml")).unwrap();
    assert!(
        manifest.contains("license = \"Apache-2.0\""),
        "Cargo.toml's license changed: change LICENSE with it"
    );
    let license = fs::read_to_string(root().join("LICENSE")).expect("a LICENSE file");
    assert!(
        license.contains("Apache License") && license.contains("Version 2.0, January 2004"),
        "LICENSE is not the Apache License 2.0"
    );
}

/// The builder image is pinned to the Rust that Cargo.toml declares (tests/msrv.rs checks that
/// the lock builds with it), so an image build neither floats nor lags behind the code.
#[test]
fn the_dockerfile_builds_with_the_rust_version_cargo_toml_declares() {
    let manifest = fs::read_to_string(root().join("Cargo.toml")).unwrap();
    let rust_version = manifest
        .lines()
        .find_map(|l| l.strip_prefix("rust-version = \""))
        .and_then(|l| l.strip_suffix('"'))
        .expect("rust-version in Cargo.toml");
    let dockerfile = fs::read_to_string(root().join("Dockerfile")).unwrap();
    let bases: Vec<&str> = dockerfile
        .lines()
        .filter_map(|l| l.strip_prefix("FROM "))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert!(
        bases.contains(&format!("rust:{rust_version}-bookworm").as_str()),
        "the builder is not rust:{rust_version}-bookworm: {bases:?}"
    );
    for base in bases {
        let tag = base.rsplit(':').next().unwrap_or("");
        assert!(
            !matches!(tag, "latest" | "1-bookworm" | "1") && base.contains(':'),
            "{base} floats"
        );
    }
}

/// `text` without what lies between each `open` and the next `close`, both included.
fn without_spans(text: &str, open: char, close: char) -> String {
    let mut out = String::new();
    let mut inside = false;
    for c in text.chars() {
        match (inside, c) {
            (false, c) if c == open => inside = true,
            (true, c) if c == close => inside = false,
            (false, c) => out.push(c),
            (true, _) => {}
        }
    }
    out
}

/// The metric names a PromQL expression reads: its identifiers, less quoted strings, label
/// matchers, range durations, the label lists of `by (...)` and its kin, functions and
/// keywords.
fn metrics_in_promql(expr: &str) -> BTreeSet<String> {
    const NOT_METRICS: [&str; 12] = [
        "sum", "max", "min", "avg", "count", "rate", "irate", "increase", "absent", "and", "or",
        "unless",
    ];
    const LABEL_LISTS: [&str; 6] = [
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
    ];
    let mut plain = without_spans(expr, '"', '"');
    plain = without_spans(&plain, '{', '}');
    plain = without_spans(&plain, '[', ']');
    let words: Vec<String> = plain
        .replace('(', " ( ")
        .replace(')', " ) ")
        .split(|c: char| !(c.is_ascii_alphanumeric() || "_:()".contains(c)))
        .filter(|w| !w.is_empty())
        .map(str::to_string)
        .collect();
    let mut out = BTreeSet::new();
    let mut i = 0;
    while i < words.len() {
        let w = words[i].as_str();
        if LABEL_LISTS.contains(&w) && words.get(i + 1).is_some_and(|n| n == "(") {
            // Skip to the list's closing parenthesis.
            while i < words.len() && words[i] != ")" {
                i += 1;
            }
        } else if w.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            && !NOT_METRICS.contains(&w)
        {
            out.insert(w.to_string());
        }
        i += 1;
    }
    out
}

#[test]
fn promql_metric_names_are_found_and_nothing_else() {
    let found = metrics_in_promql(
        "sum by (pod, code) (rate(rest_client_requests_total{job=\"x\", code!~\"2..\"}[5m])) \
         / sum without (le) (a_total) > 0.05 and absent(up{job=\"y\"} == 1)",
    );
    let want: BTreeSet<String> = ["rest_client_requests_total", "a_total", "up"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(found, want);
}

#[test]
fn every_metric_an_alert_reads_is_one_the_operator_exports() {
    let exported: BTreeSet<String> = immortal_operator::runtime::metrics::render("alerts")
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect();
    let path = root().join("config/prometheus/rules.yaml");
    let rules = documents(&path);
    let rule = the_one(&rules, "PrometheusRule");
    let mut alerts = BTreeSet::new();
    for group in seq_at(rule, &["spec", "groups"]) {
        for r in seq_at(group, &["rules"]) {
            let alert = str_at(r, &["alert"]).expect("every rule is an alert");
            let expr = str_at(r, &["expr"]).unwrap_or_else(|| panic!("{alert} has no expr"));
            assert!(
                str_at(r, &["annotations", "summary"]).is_some(),
                "{alert} has no summary"
            );
            let used = metrics_in_promql(expr);
            assert!(!used.is_empty(), "{alert} reads no metric: {expr}");
            for m in used {
                // `up` is Prometheus' own series for every scrape target.
                assert!(
                    m == "up" || exported.contains(&m),
                    "{alert} reads {m}, which /metrics does not export: {exported:?}"
                );
            }
            alerts.insert(alert.to_string());
        }
    }
    // Each alert has its meaning and first step in docs/alerts.md.
    let doc = fs::read_to_string(root().join("docs/alerts.md")).expect("docs/alerts.md");
    for alert in &alerts {
        assert!(
            doc.contains(&format!("## {alert}")),
            "docs/alerts.md has no section for {alert}"
        );
    }
    assert!(alerts.len() >= 5, "{alerts:?}");
    // Optional, as the ServiceMonitor: the PrometheusRule CRD may not exist on a cluster.
    let default = kustomization(&root().join("config/default"));
    assert!(!resources(&default).iter().any(|r| r.contains("prometheus")));
    assert!(resources(&kustomization(&root().join("config/prometheus")))
        .contains(&"rules.yaml".to_string()));
}

/// The real kubectl, or a failing test saying how to get one (as the installer test does).
fn real_kubectl() -> String {
    let kubectl = std::env::var("KUBECTL").unwrap_or_else(|_| "kubectl".into());
    let probe = run_bounded(
        Command::new(&kubectl).args(["version", "--client"]),
        MAKE_BOUND,
    );
    assert!(
        probe.is_ok_and(|(ok, _, _)| ok),
        "`{kubectl} version --client` failed: this test renders config/ with kubectl's built-in \
         kustomize; install kubectl or point KUBECTL at it"
    );
    kubectl
}

/// The rules of a role, each as (apiGroups, resources, verbs, resourceNames), sorted.
fn rules(role: &Value) -> BTreeSet<String> {
    seq_at(role, &["rules"])
        .iter()
        .map(|r| serde_yaml::to_string(r).unwrap())
        .collect()
}

fn find<'a>(objs: &'a [Value], k: &str, n: &str, ns: Option<&str>) -> Option<&'a Value> {
    objs.iter()
        .find(|o| kind(o) == k && name(o) == n && str_at(o, &["metadata", "namespace"]) == ns)
}

/// Renders with the real kubectl: the namespaced mode grants in each served namespace what
/// the ClusterRole grants cluster-wide, but for the CRD read no Role can grant, and nothing
/// cluster-wide of pods or ImmortalContainers.
#[test]
fn a_render_for_a_set_of_namespaces_grants_the_cluster_roles_rules_in_each_and_nowhere_else() {
    let kubectl = real_kubectl();
    let dir = make_dir();
    let render = |namespaces: &str| {
        let nss = format!("NAMESPACES={namespaces}");
        let (ok, out, err) = make_in(
            &dir,
            &[
                "-s",
                "render",
                "IMG=example/op:v1",
                &nss,
                &format!("KUBECTL={kubectl}"),
            ],
            &[],
        );
        assert!(ok, "make render {nss} failed:\n{out}{err}");
        let path = dir.join("rendered.yaml");
        fs::write(&path, out).unwrap();
        documents(&path)
    };
    let all = render("");
    let some = render("team-a,team-b");
    let cluster_role = find(&all, "ClusterRole", "immortal-operator", None).expect("ClusterRole");
    // Left out of a Role: the CRD, cluster-scoped, and the namespace, whose existence a Role
    // there already proves (config/rbac/namespaced/role.yaml).
    let want: BTreeSet<String> = rules(cluster_role)
        .into_iter()
        .filter(|r| !r.contains("customresourcedefinitions") && !r.contains("namespaces"))
        .collect();
    assert!(want.len() >= 5, "{want:?}");

    for gone in ["ClusterRole", "ClusterRoleBinding"] {
        assert!(
            find(&some, gone, "immortal-operator", None).is_none(),
            "the namespaced render keeps the {gone} immortal-operator"
        );
    }
    let operator_ns = str_at(
        &kustomization(&root().join("config/default")),
        &["namespace"],
    )
    .unwrap()
    .to_string();
    for ns in ["team-a", "team-b"] {
        let role = find(&some, "Role", "immortal-operator", Some(ns))
            .unwrap_or_else(|| panic!("no Role immortal-operator in {ns}"));
        assert_eq!(rules(role), want, "the Role in {ns}");
        let binding = find(&some, "RoleBinding", "immortal-operator", Some(ns))
            .unwrap_or_else(|| panic!("no RoleBinding immortal-operator in {ns}"));
        assert_eq!(str_at(binding, &["roleRef", "kind"]), Some("Role"));
        assert_eq!(
            str_at(binding, &["roleRef", "name"]),
            Some("immortal-operator")
        );
        let subjects = seq_at(binding, &["subjects"]);
        assert_eq!(subjects.len(), 1, "{subjects:?}");
        assert_eq!(str_at(&subjects[0], &["name"]), Some("immortal-operator"));
        assert_eq!(
            str_at(&subjects[0], &["namespace"]),
            Some(operator_ns.as_str()),
            "the binding in {ns} must name the operator's own ServiceAccount"
        );
    }
    // Everything else is the same, and the Deployment serves exactly those namespaces.
    let ids = |objs: &[Value]| -> BTreeSet<(String, String, Option<String>)> {
        objs.iter()
            .map(|o| {
                let ns = str_at(o, &["metadata", "namespace"]).map(str::to_string);
                (kind(o).to_string(), name(o).to_string(), ns)
            })
            .collect()
    };
    let mut expected = ids(&all);
    expected.retain(|(k, n, _)| !(k.starts_with("ClusterRole") && n == "immortal-operator"));
    for ns in ["team-a", "team-b"] {
        for k in ["Role", "RoleBinding"] {
            expected.insert((k.into(), "immortal-operator".into(), Some(ns.into())));
        }
    }
    assert_eq!(ids(&some), expected);
    let args: Vec<&str> = seq_at(&containers(the_one(&some, "Deployment"))[0], &["args"])
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(args.contains(&"--namespace=team-a,team-b"), "{args:?}");
    let args_all: Vec<&str> = seq_at(&containers(the_one(&all, "Deployment"))[0], &["args"])
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        !args_all.iter().any(|a| a.starts_with("--namespace")),
        "{args_all:?}"
    );
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn render_refuses_namespaces_the_operator_would_refuse_naming_the_variable() {
    let dir = make_dir();
    let kubectl = fake_kubectl(&dir, "kind: Namespace\n", 0);
    for (namespaces, says) in [
        ("a,,b", "empty entry"),
        ("a,", "empty entry"),
        ("Team_A", "is not a namespace name"),
        ("a,b,a", "names 'a' twice"),
    ] {
        let (ok, out, err) = make_in(
            &dir,
            &[
                "render",
                &format!("NAMESPACES={namespaces}"),
                &format!("KUBECTL={kubectl}"),
            ],
            &[],
        );
        assert!(!ok, "NAMESPACES={namespaces} rendered:\n{out}");
        assert!(
            err.contains("NAMESPACES") && err.contains(says),
            "{namespaces}: {err}"
        );
        assert!(
            !dir.join("overlay.yaml").exists(),
            "kubectl ran for {namespaces}"
        );
    }
    let _ = fs::remove_dir_all(&dir);
}

/// A kubectl that records every call in `calls` and answers: `kustomize` with one object, `get`
/// of the CRD as found, of ImmortalContainers with two of them, `get -f` with the names,
/// `config current-context` with `test`; everything else (delete, patch) says nothing.
fn recording_kubectl(dir: &Path) -> (String, PathBuf) {
    let calls = dir.join("calls");
    let body = format!(
        "echo \"$*\" >> '{calls}'\n\
         case \"$*\" in\n\
         kustomize*) printf 'kind: Namespace\\nmetadata:\\n  name: immortalcontainers-operator\\n' ;;\n\
         'config current-context') echo test ;;\n\
         *'get crd'*) ;;\n\
         *'get immortalcontainers'*'--no-headers'*) printf 'default a\\ndefault b\\n' ;;\n\
         *'get immortalcontainers'*) printf 'NAMESPACE NAME\\ndefault a\\ndefault b\\n' ;;\n\
         *'get -f'*) echo namespace/immortalcontainers-operator ;;\n\
         esac",
        calls = calls.display()
    );
    (fake_program(dir, "kubectl", &body), calls)
}

#[test]
fn undeploy_and_uninstall_say_what_goes_and_delete_only_when_told() {
    for target in ["undeploy", "uninstall", "undeploy-operator"] {
        let dir = make_dir();
        let (kubectl, calls) = recording_kubectl(&dir);
        let kubectl_arg = format!("KUBECTL={kubectl}");
        // No terminal (the test's stdin is /dev/null) and no YES=1: nothing is deleted.
        let (ok, out, err) = make_in(&dir, &[target, &kubectl_arg], &[]);
        assert!(!ok, "make {target} went on unasked:\n{out}{err}");
        assert!(out.contains("context 'test'"), "{out}");
        if target == "undeploy-operator" {
            assert!(
                out.contains("namespace/immortalcontainers-operator")
                    && out.contains("keeps the CRD, every ImmortalContainer"),
                "make {target} did not say what goes and what stays:\n{out}"
            );
        } else {
            assert!(
                out.contains("every ImmortalContainer in every namespace (2)")
                    && out.contains("default b"),
                "make {target} did not say what goes:\n{out}"
            );
        }
        assert!(
            err.contains("nothing deleted") && err.contains("YES=1"),
            "{err}"
        );
        let made = fs::read_to_string(&calls).unwrap_or_default();
        assert!(!made.contains("delete"), "make {target} deleted:\n{made}");
        if target == "undeploy" {
            assert!(out.contains("make undeploy-operator"), "{out}");
        }

        let (ok, out, err) = make_in(&dir, &[target, &kubectl_arg, "YES=1"], &[]);
        assert!(ok, "make {target} YES=1:\n{out}{err}");
        let made = fs::read_to_string(&calls).unwrap_or_default();
        assert!(
            made.contains("delete"),
            "make {target} YES=1 deleted nothing:\n{made}"
        );
        // No served namespace's Role was found, so none is deleted by selector: that would
        // end a successful undeploy with kubectl's "No resources found".
        assert!(
            !made.contains("delete roles,rolebindings"),
            "make {target} deleted the served namespaces' RBAC that is not there:\n{made}"
        );
        let _ = fs::remove_dir_all(&dir);
    }
}

/// A person who answers no on a terminal is told so, and make ends without an error of its
/// own (`script` gives the recipe a terminal).
#[test]
fn answering_no_at_the_undeploy_prompt_deletes_nothing_and_is_no_error() {
    for target in ["undeploy", "uninstall", "undeploy-operator"] {
        let dir = make_dir();
        let (kubectl, calls) = recording_kubectl(&dir);
        let make = format!(
            "make --no-print-directory -C '{}' {target} 'KUBECTL={kubectl}'",
            dir.display()
        );
        let mut cmd = Command::new("script");
        cmd.args(["-qec", &make, "/dev/null"])
            .env_remove("MAKEFLAGS")
            .env_remove("MFLAGS")
            .env_remove("MAKELEVEL")
            .stdin(Stdio::piped());
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("cannot run script (util-linux)");
        child.stdin.take().unwrap().write_all(b"n\n").unwrap();
        let out = child.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "make {target}, answered n:\n{text}");
        assert!(
            text.contains("[y/N]") && text.contains("nothing deleted"),
            "{text}"
        );
        assert!(!text.contains("Error"), "{text}");
        let made = fs::read_to_string(&calls).unwrap_or_default();
        assert!(!made.contains("delete"), "make {target} deleted:\n{made}");
        let _ = fs::remove_dir_all(&dir);
    }
}

#[test]
fn undeploy_operator_keeps_the_crd_the_objects_and_the_roles_people_use_them_with() {
    let real = real_kubectl();
    let dir = make_dir();
    // The real kubectl renders; the delete's file is kept for the test to read.
    let kept = dir.join("deleted.yaml");
    let body = format!(
        "case \"$1\" in\n\
         kustomize) exec {real} \"$@\" ;;\n\
         delete) [ \"$2\" = -f ] && cp \"$3\" '{kept}'; echo \"delete $*\" >> '{calls}' ;;\n\
         get) case \"$*\" in *roles,rolebindings*'-o name'*) echo role.rbac.authorization.k8s.io/immortal-operator ;; esac ;;\n\
         esac",
        kept = kept.display(),
        calls = dir.join("calls").display(),
    );
    let kubectl = fake_program(&dir, "kubectl", &body);
    let (ok, out, err) = make_in(
        &dir,
        &["undeploy-operator", &format!("KUBECTL={kubectl}"), "YES=1"],
        &[],
    );
    assert!(ok, "make undeploy-operator:\n{out}{err}");
    let deleted = documents(&kept);
    let all = objects(&root().join("config/default"));
    for o in &all {
        let kept_here =
            kind(o) == "CustomResourceDefinition" || name(o).starts_with("immortalcontainer-");
        let gone = deleted.iter().any(|d| id(d) == id(o));
        assert_eq!(gone, !kept_here, "{:?}: deleted {gone}", id(o));
    }
    let calls = fs::read_to_string(dir.join("calls")).unwrap();
    assert!(
        calls.contains("roles,rolebindings") && calls.contains("metadata.name=immortal-operator"),
        "the served namespaces' Roles are not removed: {calls}"
    );
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn load_image_runs_each_local_cluster_tool_as_its_documentation_says() {
    let dir = make_dir();
    let echo = fake_program(&dir, "tool", "echo \"ran: $*\"");
    for (cluster, name, want) in [
        ("kind", "", "ran: load docker-image example/op:dev"),
        (
            "kind",
            "dev",
            "ran: load docker-image example/op:dev --name dev",
        ),
        ("k3d", "", "ran: image import example/op:dev"),
        (
            "k3d",
            "dev",
            "ran: image import example/op:dev --cluster dev",
        ),
        ("minikube", "", "ran: image load example/op:dev"),
        (
            "minikube",
            "dev",
            "ran: image load example/op:dev --profile dev",
        ),
    ] {
        let (ok, out, err) = make_in(
            &dir,
            &[
                "load-image",
                "IMG=example/op:dev",
                &format!("LOCAL_CLUSTER={cluster}"),
                &format!("LOCAL_CLUSTER_NAME={name}"),
                &format!("KIND={echo}"),
                &format!("K3D={echo}"),
                &format!("MINIKUBE={echo}"),
            ],
            &[],
        );
        assert!(ok, "{cluster}: {out}{err}");
        assert!(out.lines().any(|l| l == want), "{cluster} {name:?}: {out}");
    }
    let (ok, _, err) = make_in(&dir, &["load-image", "LOCAL_CLUSTER=docker-desktop"], &[]);
    assert!(!ok && err.contains("none of kind, k3d, minikube"), "{err}");
    let _ = fs::remove_dir_all(&dir);
}
