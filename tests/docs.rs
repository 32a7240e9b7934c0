//! The docs name only what exists: every repository path, `make` target, flag and metric that
//! README.md, docs/*.md and testserver/README.md mention, checked against the tree, the
//! Makefile, the programs' own flags and the metrics the operator exports; and every link
//! between them leads to a file and a heading that exist. (That the README's demo commands do
//! what it says is `tests/demo.rs`.)
//!
//! Where a flag belongs is read from its surroundings: a line or code span that runs kubectl,
//! docker, cargo or git speaks of that tool's flags and is not checked; docs/benchmark.md, a
//! Benchmark section and `BENCH_ARGS` speak of the bench's, `testserver/README.md` of the test
//! server's, and the rest of the operator's.

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;
use std::process::Command;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// One piece of code a README shows: a line of a code block, or an inline code span.
struct Code {
    text: String,
    /// The `## ` section it is in.
    section: String,
}

fn read(rel: &str) -> String {
    fs::read_to_string(Path::new(ROOT).join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// The operator's docs, as paths from the repository root: README.md and every docs/*.md.
fn operator_docs() -> Vec<String> {
    let mut docs: Vec<String> = fs::read_dir(Path::new(ROOT).join("docs"))
        .expect("docs/")
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("docs/{n}"))
        .collect();
    docs.sort();
    assert!(docs.len() >= 5, "only {docs:?} in docs/");
    docs.insert(0, "README.md".to_string());
    docs
}

/// The code of a Markdown text: each line of its fenced blocks, and each inline span (which
/// may run over a line break).
fn code_of(markdown: &str) -> Vec<Code> {
    let mut out = Vec::new();
    let mut section = String::new();
    let mut in_block = false;
    let mut prose = String::new();
    let mut continued = String::new();
    let flush = |prose: &mut String, section: &str, out: &mut Vec<Code>| {
        for (i, part) in prose.split('`').enumerate() {
            if i % 2 == 1 {
                out.push(Code {
                    text: part.to_string(),
                    section: section.to_string(),
                });
            }
        }
        prose.clear();
    };
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            flush(&mut prose, &section, &mut out);
            in_block = !in_block;
            continue;
        }
        if in_block {
            // A shell line continued with `\` is one command.
            continued.push_str(line.trim_end_matches('\\'));
            if !line.ends_with('\\') {
                out.push(Code {
                    text: std::mem::take(&mut continued),
                    section: section.clone(),
                });
            }
            continue;
        }
        if let Some(title) = line.strip_prefix("## ") {
            flush(&mut prose, &section, &mut out);
            section = title.trim().to_string();
        }
        // A blank line ends a paragraph, and no span runs past one.
        if line.trim().is_empty() {
            flush(&mut prose, &section, &mut out);
        } else {
            prose.push_str(line);
            prose.push('\n');
        }
    }
    flush(&mut prose, &section, &mut out);
    out
}

/// `--flag` names in `text` (what follows `=` dropped); short flags are not looked at.
fn flags_in(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let b = text.as_bytes();
    let mut i = 0;
    while let Some(at) = text[i..].find("--") {
        let start = i + at;
        let before_ok =
            start == 0 || !(b[start - 1].is_ascii_alphanumeric() || b[start - 1] == b'-');
        let name: String = text[start + 2..]
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-')
            .collect();
        if before_ok && name.starts_with(|c: char| c.is_ascii_lowercase()) {
            out.push(format!("--{}", name.trim_end_matches('-')));
        }
        i = start + 2 + name.len();
    }
    out
}

/// Whether a piece of code runs another tool (the local clusters' included), whose flags are
/// that tool's business.
fn runs_another_tool(code: &str) -> bool {
    // `RUN` is the Dockerfile's instruction.
    [
        "kubectl",
        "docker",
        "cargo",
        "valgrind",
        "drain ",
        "git ",
        "RUN ",
        "kind load",
        "k3d ",
        "minikube ",
        "kubemark ",
        "etcdctl ",
    ]
    .iter()
    .any(|tool| code.contains(tool))
}

/// The long flags a program's `--help` defines (at the start of a help line).
fn help_flags(program: &str, args: &[&str]) -> BTreeSet<String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program} {args:?}: {e}"));
    assert!(out.status.success(), "{program} {args:?} failed");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let l = l.trim_start();
            let l = l
                .strip_prefix("-")
                .filter(|r| r.chars().nth(1) == Some(','))
                .map_or(l, |r| r[2..].trim_start());
            l.starts_with("--")
                .then(|| flags_in(l).into_iter().next())
                .flatten()
        })
        .collect()
}

/// The long flags of a clap-derive `struct Args` in `rel` (the bench's and the test server's
/// binaries are not built for this package's tests): each field under `#[arg(long...)]`, as
/// clap names it.
fn derived_flags(rel: &str) -> BTreeSet<String> {
    let text = read(rel);
    let mut out = BTreeSet::new();
    let mut long: Option<Option<String>> = None;
    for line in text.lines().map(str::trim) {
        if line.starts_with("#[arg(") && line.contains("long") {
            // `long = "name"` renames it.
            let renamed = line
                .split("long = \"")
                .nth(1)
                .and_then(|r| r.split('"').next())
                .map(str::to_string);
            long = Some(renamed);
        } else if let Some(renamed) = long.take() {
            if line.starts_with("#[") || line.starts_with("///") {
                long = Some(renamed);
                continue;
            }
            let field = line
                .split(':')
                .next()
                .unwrap_or("")
                .trim_start_matches("pub ");
            out.insert(format!(
                "--{}",
                renamed.unwrap_or_else(|| field.replace('_', "-"))
            ));
        }
    }
    assert!(!out.is_empty(), "no flags found in {rel}");
    out
}

#[test]
fn every_operator_flag_the_readme_names_exists_and_the_usage_lists_them_all() {
    let operator = env!("CARGO_BIN_EXE_immortal-operator");
    let mut known = help_flags(operator, &["--help"]);
    known.extend(help_flags(operator, &["trace", "--help"]));
    let bench = derived_flags("bench/src/main.rs");
    let mut unknown = BTreeSet::new();
    for doc in operator_docs() {
        for code in code_of(&read(&doc)) {
            if runs_another_tool(&code.text) {
                continue;
            }
            let is_bench = doc == "docs/benchmark.md"
                || code.section == "Benchmark"
                || code.text.contains("BENCH_ARGS");
            for flag in flags_in(&code.text) {
                let ok = if is_bench {
                    bench.contains(&flag)
                } else {
                    known.contains(&flag)
                };
                if !ok {
                    let whose = if is_bench {
                        "immortal-bench"
                    } else {
                        "immortal-operator"
                    };
                    unknown.insert(format!(
                        "{flag} ({whose}, in {doc}: `{}`)",
                        code.text.trim()
                    ));
                }
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "the docs name flags the program does not have:\n  {}",
        unknown.into_iter().collect::<Vec<_>>().join("\n  ")
    );

    // The usage block under "Running it" lists every flag the operator has.
    let operating = read("docs/operating.md");
    let usage = operating
        .split("## Running it")
        .nth(1)
        .and_then(|s| s.split("```").nth(1))
        .expect("a code block under ## Running it in docs/operating.md");
    let listed: BTreeSet<String> = flags_in(usage).into_iter().collect();
    let missing: Vec<_> = known
        .iter()
        .filter(|f| !matches!(f.as_str(), "--help" | "--version") && !listed.contains(*f))
        .collect();
    assert!(
        missing.is_empty(),
        "the usage under ## Running it lacks {missing:?}"
    );
}

#[test]
fn every_test_server_flag_its_readme_names_exists() {
    let known = derived_flags("testserver/src/main.rs");
    let mut unknown = BTreeSet::new();
    for code in code_of(&read("testserver/README.md")) {
        // The server's own command line is a cargo command; other cargo and kubectl lines
        // are those tools'.
        if runs_another_tool(&code.text) && !code.text.contains("kube-testserver") {
            continue;
        }
        let text = code.text.split(" -- ").last().unwrap_or(&code.text);
        for flag in flags_in(text) {
            if !known.contains(&flag) {
                unknown.insert(format!("{flag} (in `{}`)", code.text.trim()));
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "testserver/README.md names flags kube-testserver does not have ({known:?}):\n  {}",
        unknown.into_iter().collect::<Vec<_>>().join("\n  ")
    );
}

#[test]
fn every_path_the_readmes_name_exists_or_is_one_the_tools_make_and_git_ignores() {
    let gitignore = read(".gitignore");
    // Made by make, cargo or the demo, never committed: each must be ignored.
    let made = [".demo", "dist", "target", "bench-results.json"];
    for m in made {
        assert!(
            gitignore.lines().any(|l| l.trim_start_matches('/') == m),
            ".gitignore does not ignore {m}, which the READMEs say the tools make"
        );
    }
    let mut missing = BTreeSet::new();
    let mut checked = 0;
    let docs = operator_docs();
    let with_base = docs
        .iter()
        .map(|d| (d.as_str(), ""))
        .chain([("testserver/README.md", "testserver/")]);
    for (readme, base) in with_base {
        let text = read(readme);
        let mut candidates: Vec<String> = code_of(&text)
            .into_iter()
            .flat_map(|c| {
                c.text
                    .split_whitespace()
                    .map(str::to_string)
                    .collect::<Vec<_>>()
            })
            .collect();
        // Links: [text](path). Those of the operator's docs are relative to their own file,
        // with anchors: the link test checks them.
        if readme == "testserver/README.md" {
            candidates.extend(
                text.split("](")
                    .skip(1)
                    .filter_map(|r| r.split(')').next().map(str::to_string)),
            );
        }
        for word in candidates {
            let word = word.trim_matches(|c: char| matches!(c, '(' | ')' | ',' | ';' | '"' | '\''));
            let repo_path = [
                "src/",
                "config/",
                "tests/",
                "testserver/",
                "bench/",
                "docs/",
                ".ci/",
                "../",
            ]
            .iter()
            .any(|p| word.starts_with(p))
                || [
                    "Makefile",
                    "Dockerfile",
                    "Cargo.toml",
                    "Cargo.lock",
                    ".gitignore",
                    "LICENSE",
                ]
                .contains(&word);
            if !repo_path || word.contains(['*', '<', '$']) || word.starts_with("http") {
                continue;
            }
            let rel = Path::new(base).join(word);
            let first = rel
                .components()
                .find(|c| !matches!(c, std::path::Component::ParentDir))
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .unwrap_or_default();
            checked += 1;
            if made.contains(&first.as_str()) {
                continue;
            }
            if !Path::new(ROOT).join(&rel).exists() {
                missing.insert(format!("{word} (in {readme})"));
            }
        }
    }
    assert!(
        checked > 30,
        "only {checked} paths found: is the extraction broken?"
    );
    assert!(
        missing.is_empty(),
        "the READMEs name paths that do not exist:\n  {}",
        missing.into_iter().collect::<Vec<_>>().join("\n  ")
    );
}

#[test]
fn every_make_target_the_readmes_name_is_in_the_makefile() {
    let makefile = read("Makefile");
    let targets: BTreeSet<&str> = makefile
        .lines()
        .filter_map(|l| l.split_once(':').map(|(t, _)| t))
        .filter(|t| !t.is_empty() && t.chars().all(|c| c.is_ascii_lowercase() || c == '-'))
        .collect();
    let mut named = BTreeSet::new();
    let docs = operator_docs();
    for readme in docs
        .iter()
        .map(String::as_str)
        .chain(["testserver/README.md"])
    {
        for code in code_of(&read(readme)) {
            let words: Vec<&str> = code.text.split_whitespace().collect();
            for (i, w) in words.iter().enumerate() {
                // `make` as a command: first in the code, or after a prompt or a separator.
                let command = i == 0 || matches!(words[i - 1], "$" | ";" | "&&" | "||");
                if *w != "make" || !command {
                    continue;
                }
                if let Some(t) = words
                    .get(i + 1)
                    .filter(|t| !t.contains('=') && !t.starts_with('-'))
                {
                    named.insert((t.to_string(), readme.to_string()));
                }
            }
        }
    }
    assert!(named.len() >= 10, "only {named:?} found");
    let unknown: Vec<_> = named
        .iter()
        .filter(|(t, _)| !targets.contains(t.as_str()))
        .collect();
    assert!(
        unknown.is_empty(),
        "the READMEs name make targets the Makefile lacks: {unknown:?} (targets: {targets:?})"
    );
}

#[test]
fn every_metric_the_readme_names_is_exported() {
    let exported: BTreeSet<String> = immortal_operator::runtime::metrics::render("docs")
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect();
    let readme: String = operator_docs().iter().map(|d| read(d)).collect();
    let prefixes = [
        "controller_runtime_",
        "workqueue_",
        "rest_client_",
        "immortal_",
        "leader_election_",
    ];
    let mut named = BTreeSet::new();
    // Paths (config/rbac/leader_election_role.yaml) name files, not metrics.
    let words = readme
        .split_whitespace()
        .filter(|w| !w.contains('/'))
        .flat_map(|w| w.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')));
    for word in words {
        if prefixes
            .iter()
            .any(|p| word.starts_with(p) && word.len() > p.len())
        {
            named.insert(word.to_string());
        }
    }
    // Names that are not metrics: the crate, the bench's package, the ClusterRole.
    named.retain(|n| !matches!(n.as_str(), "immortal_operator" | "immortal_bench"));
    assert!(named.len() >= 10, "only {named:?} found");
    let unknown: Vec<_> = named.difference(&exported).collect();
    assert!(
        unknown.is_empty(),
        "the docs name metrics /metrics does not export: {unknown:?} (exported: {exported:?})"
    );
}

#[test]
fn flags_and_code_are_found_as_a_reader_sees_them() {
    assert_eq!(
        flags_in("a --b-c=1 x--y --metrics-secure[=BOOL] --d-"),
        ["--b-c", "--metrics-secure", "--d"]
    );
    let code = code_of("## One\ntext `a\nb` and `c`\n\n```sh\nd --e\n```\n## Two\n`f`\n");
    let seen: Vec<_> = code
        .iter()
        .map(|c| (c.text.as_str(), c.section.as_str()))
        .collect();
    assert_eq!(
        seen,
        [
            ("a\nb", "One"),
            ("c", "One"),
            ("d --e", "One"),
            ("f", "Two")
        ]
    );
}

/// A heading's anchor as GitHub makes it: lowercase, punctuation dropped, spaces to hyphens.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

#[test]
fn every_link_between_the_docs_leads_to_a_file_and_a_heading_that_exist() {
    let mut broken = BTreeSet::new();
    let mut checked = 0;
    for doc in operator_docs()
        .into_iter()
        .chain(["testserver/README.md".to_string()])
    {
        let text = read(&doc);
        let dir = Path::new(&doc).parent().unwrap_or(Path::new(""));
        for link in text.split("](").skip(1).filter_map(|r| r.split(')').next()) {
            if link.starts_with("http") || link.contains(' ') {
                continue;
            }
            let (file, fragment) = link.split_once('#').unwrap_or((link, ""));
            let target = if file.is_empty() {
                Path::new(&doc).to_path_buf()
            } else {
                dir.join(file)
            };
            checked += 1;
            let Ok(target_text) = fs::read_to_string(Path::new(ROOT).join(&target)) else {
                broken.insert(format!("{link} (in {doc}): no such file"));
                continue;
            };
            if fragment.is_empty() {
                continue;
            }
            let mut in_block = false;
            let found = target_text.lines().any(|l| {
                if l.trim_start().starts_with("```") {
                    in_block = !in_block;
                }
                !in_block && l.starts_with('#') && anchor(l.trim_start_matches('#')) == fragment
            });
            if !found {
                broken.insert(format!("{link} (in {doc}): no such heading"));
            }
        }
    }
    assert!(
        checked > 20,
        "only {checked} links found: is the extraction broken?"
    );
    assert!(
        broken.is_empty(),
        "broken links:\n  {}",
        broken.into_iter().collect::<Vec<_>>().join("\n  ")
    );
}

#[test]
fn the_readme_is_a_five_minute_read() {
    let lines = read("README.md").lines().count();
    assert!(
        lines < 250,
        "README.md has {lines} lines: move what a first visit does not need to docs/"
    );
}

#[test]
fn anchors_are_made_as_github_makes_them() {
    assert_eq!(anchor(" What is missed, and why"), "what-is-missed-and-why");
    assert_eq!(
        anchor("Logs and following one object"),
        "logs-and-following-one-object"
    );
    assert_eq!(anchor("ImmortalOperatorDown"), "immortaloperatordown");
}

/// The code spans of a Markdown table cell.
fn spans(cell: &str) -> Vec<&str> {
    cell.split('`').skip(1).step_by(2).collect()
}

#[test]
fn the_source_map_names_every_module_in_the_folder_it_is_in() {
    let design = read("docs/design.md");
    let table = design
        .split("## The source")
        .nth(1)
        .expect("## The source in docs/design.md");
    let mut folder: Option<String> = None;
    let mut named: BTreeSet<String> = BTreeSet::new();
    let mut wrong = Vec::new();
    for row in table.lines().filter(|l| l.starts_with("| ")) {
        let first = row.split('|').nth(1).unwrap_or("");
        for name in spans(first) {
            if first.contains("**") {
                folder = Some(name.to_string());
                continue;
            }
            let path = if name.starts_with("src/") {
                name.to_string()
            } else {
                match &folder {
                    Some(f) => format!("{f}{name}"),
                    None => continue,
                }
            };
            if !Path::new(ROOT).join(&path).exists() {
                wrong.push(path.clone());
            }
            named.insert(path.trim_end_matches('/').to_string());
        }
    }
    assert!(
        wrong.is_empty(),
        "the source map names what is not there: {wrong:?}"
    );
    // Every file and folder of the three layers, but their mod.rs and tests.
    let mut missing = Vec::new();
    for layer in ["src/immortal", "src/runtime", "src/kube"] {
        for entry in fs::read_dir(Path::new(ROOT).join(layer)).unwrap() {
            let name = entry.unwrap().file_name().to_string_lossy().into_owned();
            if matches!(name.as_str(), "mod.rs" | "tests.rs") {
                continue;
            }
            let path = format!("{layer}/{name}");
            if !named.contains(&path) {
                missing.push(path);
            }
        }
    }
    missing.sort();
    assert!(
        missing.is_empty(),
        "docs/design.md's source map leaves out {missing:?}"
    );
}

#[test]
fn no_table_cell_starts_with_a_stray_colon() {
    let mut stray = Vec::new();
    for doc in operator_docs() {
        for row in read(&doc).lines().filter(|l| l.starts_with("| ")) {
            if row
                .split('|')
                .any(|cell| cell.trim_start().starts_with(": "))
            {
                stray.push(format!("{doc}: {row}"));
            }
        }
    }
    assert!(stray.is_empty(), "{stray:#?}");
}

/// The README's set-up section promises no timings or test counts: they were measured once and
/// went stale ("76 s", "6 min 41 s for 592 tests"). Figures live with what measures them.
#[test]
fn the_readme_set_up_names_no_measured_figures() {
    let readme = read("README.md");
    let setup = readme
        .split("## Set up")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("## Set up in README.md");
    let words: Vec<&str> = setup.split_whitespace().collect();
    let mut figures = Vec::new();
    for pair in words.windows(2) {
        let number = pair[0].trim_start_matches(['(', '~']);
        let unit = pair[1].trim_end_matches([',', '.', ';', ')', ':']);
        let is_number =
            !number.is_empty() && number.chars().all(|c| c.is_ascii_digit() || c == '.');
        if is_number && ["s", "min", "minutes", "seconds", "tests"].contains(&unit) {
            figures.push(format!("{} {}", pair[0], pair[1]));
        }
    }
    assert!(
        figures.is_empty(),
        "README's Set up names figures no test keeps true: {figures:?}"
    );
}

/// The commands docs/operating.md shows for loading an image into kind, k3d and minikube by
/// hand are the ones `make load-image` runs.
#[test]
fn the_local_cluster_commands_the_docs_show_are_the_ones_make_load_image_runs() {
    let operating = read("docs/operating.md");
    let section = operating
        .split("## Deploying to a local cluster")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("## Deploying to a local cluster in docs/operating.md");
    for (tool, cluster, name) in [
        ("kind", "kind", "kind"),
        ("k3d", "k3d", "k3s-default"),
        ("minikube", "minikube", "minikube"),
    ] {
        let shown = section
            .lines()
            .find(|l| l.starts_with(&format!("{tool} ")))
            .unwrap_or_else(|| panic!("no {tool} command in the section"));
        let out = Command::new("make")
            .env_remove("MAKEFLAGS")
            .env_remove("MFLAGS")
            .env_remove("MAKELEVEL")
            .args(["--no-print-directory", "-s", "-C", ROOT, "load-image"])
            .args([
                "IMG=immortal-operator:dev",
                &format!("LOCAL_CLUSTER={cluster}"),
            ])
            .arg(format!("LOCAL_CLUSTER_NAME={name}"))
            .args(["KIND=kind", "K3D=k3d", "MINIKUBE=minikube"])
            // Printed, not run: the tools are `true` here.
            .arg(format!("{}=true", tool.to_uppercase()))
            .output()
            .expect("make runs");
        let printed = String::from_utf8_lossy(&out.stdout);
        let ran = printed
            .lines()
            .next()
            .unwrap_or("")
            .replacen("true", tool, 1);
        assert_eq!(
            shown.trim(),
            ran,
            "docs/operating.md and make load-image differ"
        );
    }
}

/// The kubectl lines that remove only the operator name every ClusterRole and
/// ClusterRoleBinding config/rbac installs for it, and nothing people use the kind with.
#[test]
fn the_commands_that_remove_only_the_operator_name_its_cluster_wide_objects() {
    let operating = read("docs/operating.md");
    let named = |kind: &str| -> BTreeSet<String> {
        operating
            .lines()
            .filter(|l| l.starts_with(&format!("kubectl delete {kind} ")))
            .flat_map(|l| l.split_whitespace().skip(3).map(str::to_string))
            .filter(|w| !w.starts_with('-'))
            .collect()
    };
    let mut installed: BTreeSet<(String, String)> = BTreeSet::new();
    for entry in fs::read_dir(Path::new(ROOT).join("config/rbac")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "yaml") {
            continue;
        }
        let text = fs::read_to_string(&path).unwrap();
        let doc: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
        let kind = doc["kind"].as_str().unwrap_or("").to_lowercase();
        let name = doc["metadata"]["name"].as_str().unwrap_or("").to_string();
        if kind.starts_with("cluster") && !name.starts_with("immortalcontainer-") {
            installed.insert((kind, name));
        }
    }
    assert!(installed.len() >= 4, "{installed:?}");
    for (kind, name) in &installed {
        assert!(
            named(kind).contains(name),
            "docs/operating.md's removal of the operator leaves {kind} {name}"
        );
    }
    for kind in ["clusterrole", "clusterrolebinding"] {
        for name in named(kind) {
            assert!(
                installed.contains(&(kind.to_string(), name.clone())),
                "docs/operating.md deletes {kind} {name}, which config/rbac does not install"
            );
        }
    }
}

/// `make run` serves what the operator serves with no `--namespace`, every namespace; the
/// README says so where it shows `make run`, and how to narrow it.
#[test]
fn the_readme_says_make_run_serves_every_namespace_and_how_to_narrow_it() {
    let help = Command::new(env!("CARGO_BIN_EXE_immortal-operator"))
        .arg("--help")
        .output()
        .expect("immortal-operator --help");
    let help = String::from_utf8_lossy(&help.stdout);
    let namespace = help
        .split("--namespace")
        .nth(1)
        .expect("--namespace in --help");
    assert!(
        namespace
            .lines()
            .take(3)
            .any(|l| l.contains("default: all namespaces")),
        "--help no longer says --namespace defaults to every namespace:\n{namespace}"
    );
    let readme = read("README.md");
    let run = readme
        .split("make run\n```")
        .nth(1)
        .and_then(|s| s.split("```").next())
        .expect("a make run block in README.md");
    assert!(
        run.contains("every namespace") && run.contains("make run ARGS=\"--namespace "),
        "README's make run does not say it serves every namespace and how to narrow it:\n{run}"
    );
}

/// The text of `markdown`'s section `heading` (to the next heading of its level), its lines
/// joined as a reader reads them.
fn section(markdown: &str, heading: &str) -> String {
    let start = markdown
        .find(&format!("\n{heading}\n"))
        .unwrap_or_else(|| panic!("no section {heading:?}"));
    let level = heading.split(' ').next().unwrap_or("##");
    let body = &markdown[start + heading.len() + 2..];
    let end = body.find(&format!("\n{level} ")).unwrap_or(body.len());
    body[..end].split_whitespace().collect::<Vec<_>>().join(" ")
}

#[test]
fn what_the_docs_say_an_operator_that_can_list_nothing_does_is_what_it_does() {
    // It waits for one served namespace as long as the operator's constant says, then exits
    // 1 (tests/e2e.rs, `an_operator_that_may_list_nothing_exits_naming_each_namespace_and_why`).
    let source = read("src/operator.rs");
    let secs = source
        .lines()
        .find(|l| l.contains("const SERVE_PATIENCE"))
        .and_then(|l| l.split("from_secs(").nth(1))
        .and_then(|r| r.split(')').next())
        .expect("SERVE_PATIENCE in src/operator.rs");
    let ops = read("docs/operating.md");
    let running = section(&ops, "## Running it");
    for says in [
        format!("waits {secs} seconds for one namespace, then exits 1"),
        "CrashLoopBackOff".to_string(),
        "a 403 to that check end the program at once".to_string(),
    ] {
        assert!(running.contains(&says), "Running it does not say {says:?}");
    }
    let served = section(&ops, "## Serving a set of namespaces");
    for says in [
        format!(
            "Only when no served namespace can be listed within {secs} s does the operator exit"
        ),
        "never `/livez`".to_string(),
    ] {
        assert!(
            served.contains(&says),
            "Serving a set of namespaces does not say {says:?}"
        );
    }
    let exits = section(&ops, "## Exit codes");
    assert!(
        exits.contains(&format!("no served namespace listed within {secs} s")),
        "the exit codes do not list it: {exits}"
    );
}
