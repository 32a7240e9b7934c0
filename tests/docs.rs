//! The READMEs name only what exists: every repository path, `make` target, flag and metric
//! they mention, checked against the tree, the Makefile, the programs' own flags and the
//! metrics the operator exports. (That the README's demo commands do what it says is
//! `tests/demo.rs`.)
//!
//! Where a flag belongs is read from its surroundings: a line or code span that runs kubectl,
//! docker or cargo speaks of that tool's flags and is not checked; the Benchmark section and
//! `BENCH_ARGS` speak of the bench's, `testserver/README.md` of the test server's, and the rest
//! of `README.md` of the operator's.

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

/// Whether a piece of code runs another tool, whose flags are that tool's business.
fn runs_another_tool(code: &str) -> bool {
    ["kubectl", "docker", "cargo", "valgrind", "drain "]
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
    for code in code_of(&read("README.md")) {
        if runs_another_tool(&code.text) {
            continue;
        }
        let is_bench = code.section == "Benchmark" || code.text.contains("BENCH_ARGS");
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
                unknown.insert(format!("{flag} ({whose}, in `{}`)", code.text.trim()));
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "README.md names flags the program does not have:\n  {}",
        unknown.into_iter().collect::<Vec<_>>().join("\n  ")
    );

    // The usage block under "Running it" lists every flag the operator has.
    let readme = read("README.md");
    let usage = readme
        .split("## Running it")
        .nth(1)
        .and_then(|s| s.split("```").nth(1))
        .expect("a code block under ## Running it");
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
    for (readme, base) in [("README.md", ""), ("testserver/README.md", "testserver/")] {
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
        // Links: [text](path).
        candidates.extend(
            text.split("](")
                .skip(1)
                .filter_map(|r| r.split(')').next().map(str::to_string)),
        );
        for word in candidates {
            let word = word.trim_matches(|c: char| matches!(c, '(' | ')' | ',' | ';' | '"' | '\''));
            let repo_path = [
                "src/",
                "config/",
                "tests/",
                "testserver/",
                "bench/",
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
    for readme in ["README.md", "testserver/README.md"] {
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
                    named.insert((t.to_string(), readme));
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
    let readme = read("README.md");
    let prefixes = [
        "controller_runtime_",
        "workqueue_",
        "rest_client_",
        "immortal_",
        "leader_election_",
    ];
    let mut named = BTreeSet::new();
    for word in readme.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
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
        "README.md names metrics /metrics does not export: {unknown:?} (exported: {exported:?})"
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
