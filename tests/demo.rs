//! The README's demo, run as a newcomer runs it: every command of its demo block, in order,
//! as written (in a directory of the test's own instead of `.demo/`), each checked to do what
//! the README says; `make run` after it, which builds nothing more; then `make run` without a
//! kubeconfig, which the README says runs the demo.
//!
//! It builds the release binaries (`make demo` does), so it is slow the first time; every
//! command is bounded, so a demo that hangs fails the test instead. Whatever it started is
//! stopped when it ends, passed or failed.

use std::fs;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The first `make demo` builds the release binaries.
const BUILD_BOUND: Duration = Duration::from_secs(20 * 60);
/// Any other command of the demo.
const STEP_BOUND: Duration = Duration::from_secs(120);

/// The commands of the README's demo block, as the README writes them. If the README changes,
/// so must this test, which runs each of them and checks what it does.
const README_DEMO: [&str; 5] = [
    "make demo",
    "kubectl --kubeconfig .demo/kubeconfig get ic,pods",
    "kubectl --kubeconfig .demo/kubeconfig delete pod example-immortalpod",
    "target/release/immortal-operator trace default/example --log .demo/operator.log",
    "make demo-stop",
];

/// A demo directory of the test's own; stops whatever demo runs there when dropped.
struct DemoDir {
    dir: PathBuf,
}

impl DemoDir {
    fn new(name: &str) -> DemoDir {
        let dir = std::env::temp_dir().join(format!("immortal-demo-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        DemoDir { dir }
    }

    /// A README command, run in the repository with the demo in this directory.
    fn command(&self, readme: &str) -> String {
        let target = target_dir();
        let cmd = readme
            .replace(".demo/", &format!("{}/", self.dir.display()))
            .replace("target/release/", &format!("{}/release/", target.display()));
        match cmd.strip_prefix("make ") {
            Some(rest) => format!("make {rest} DEMO_DIR={}", self.dir.display()),
            None => cmd,
        }
    }

    fn pid(&self, which: &str) -> Option<u32> {
        fs::read_to_string(self.dir.join(format!("{which}.pid")))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    fn kubectl(&self, args: &[&str]) -> (bool, String) {
        let kubeconfig = self.dir.join("kubeconfig");
        let mut cmd = Command::new("kubectl");
        cmd.arg("--kubeconfig").arg(&kubeconfig).args(args);
        run(&mut cmd, STEP_BOUND)
    }
}

impl Drop for DemoDir {
    fn drop(&mut self) {
        let pids: Vec<u32> = ["operator", "server"]
            .iter()
            .filter_map(|p| self.pid(p))
            .collect();
        let _ = run(
            &mut sh(&format!("make demo-stop DEMO_DIR={}", self.dir.display())),
            STEP_BOUND,
        );
        for pid in pids {
            if alive(pid) {
                let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            }
        }
        if !std::thread::panicking() {
            let _ = fs::remove_dir_all(&self.dir);
        } else {
            eprintln!("the demo's files are kept in {}", self.dir.display());
        }
    }
}

/// Where cargo puts the release binaries, as the Makefile reckons it.
fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR").filter(|d| !d.is_empty()) {
        Some(d) => Path::new(ROOT).join(d),
        None => Path::new(ROOT).join("target"),
    }
}

/// `sh -c cmd` in the repository, with none of an outer make's flags (under `make test`
/// they would reach this make).
fn sh(cmd: &str) -> Command {
    let mut c = Command::new("sh");
    c.args(["-c", cmd])
        .current_dir(ROOT)
        .env_remove("MAKEFLAGS")
        .env_remove("MFLAGS")
        .env_remove("MAKELEVEL");
    c
}

/// Runs `cmd` to its end within `bound` (else kills it and fails the test): whether it
/// succeeded, and what it printed, stdout then stderr. Output goes through files: a pipe
/// nobody reads while it runs could fill and stall it.
fn run(cmd: &mut Command, bound: Duration) -> (bool, String) {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let base = std::env::temp_dir().join(format!("immortal-demo-out-{}-{n}", std::process::id()));
    let (out, err) = (base.with_extension("out"), base.with_extension("err"));
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(fs::File::create(&out).unwrap())
        .stderr(fs::File::create(&err).unwrap())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    let deadline = Instant::now() + bound;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{cmd:?} did not finish within {bound:?}; it printed:\n{}{}",
                fs::read_to_string(&out).unwrap_or_default(),
                fs::read_to_string(&err).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let text = fs::read_to_string(&out).unwrap_or_default()
        + &fs::read_to_string(&err).unwrap_or_default();
    let _ = fs::remove_file(&out);
    let _ = fs::remove_file(&err);
    (status.success(), text)
}

/// Whether process `pid` runs (a zombie does not).
fn alive(pid: u32) -> bool {
    Command::new("ps")
        .args(["-o", "stat=", "-p", &pid.to_string()])
        .output()
        .map(|o| {
            let stat = String::from_utf8_lossy(&o.stdout);
            let stat = stat.trim();
            !stat.is_empty() && !stat.starts_with('Z')
        })
        .unwrap_or(false)
}

/// Processes whose command line names `dir`: what a demo there left running.
fn processes_in(dir: &Path) -> Vec<String> {
    let out = Command::new("ps")
        .args(["-eo", "pid=,stat=,args="])
        .output()
        .expect("ps");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains(&*dir.to_string_lossy()))
        .filter(|l| {
            l.split_whitespace()
                .nth(1)
                .is_some_and(|s| !s.starts_with('Z'))
        })
        .map(str::to_string)
        .collect()
}

/// Polls `check` every 200 ms until it answers `Some`, for at most `bound`.
fn wait_for<T>(what: &str, bound: Duration, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + bound;
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "gave up waiting for {what} after {bound:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `GET path` over plain HTTP from `addr`: the status line and body.
fn http_get(addr: &str, path: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

/// The address a line of `make demo`'s output names after `label` (`Probes: curl http://ADDR/...`).
fn printed_addr<'a>(output: &'a str, label: &str) -> &'a str {
    output
        .lines()
        .find_map(|l| l.strip_prefix(label))
        .and_then(|l| l.trim().strip_prefix("curl http://"))
        .and_then(|l| l.split('/').next())
        .unwrap_or_else(|| panic!("make demo printed no {label:?} line:\n{output}"))
}

/// The demo block of the README: the fenced block that ends with `make demo-stop`, its
/// commands without their comments.
fn readme_demo_block() -> Vec<String> {
    let readme = fs::read_to_string(Path::new(ROOT).join("README.md")).unwrap();
    let block = readme
        .split("```")
        .find(|b| b.contains("make demo-stop"))
        .expect("a code block with make demo-stop in README.md");
    block
        .lines()
        .skip(1) // the fence's language
        .map(|l| l.split(" #").next().unwrap_or("").trim().to_string())
        .filter(|l| !l.is_empty())
        .collect()
}

#[test]
fn the_readme_s_demo_commands_do_what_it_says_and_make_run_without_a_kubeconfig_runs_it() {
    assert_eq!(
        readme_demo_block(),
        README_DEMO,
        "the README's demo block changed: run its new commands in this test"
    );
    let demo = DemoDir::new("readme");

    // make demo: both processes up, the sample's pod made, the listeners on loopback.
    let (ok, out) = run(&mut sh(&demo.command(README_DEMO[0])), BUILD_BOUND);
    assert!(ok, "make demo failed:\n{out}");
    assert!(out.contains("The demo is running"), "{out}");
    // make run, against the demo's cluster, builds nothing make demo has not built.
    let (ran, run_out) = run(
        &mut sh(&format!(
            "make run ARGS='--kubeconfig {} --version'",
            demo.dir.join("kubeconfig").display()
        )),
        BUILD_BOUND,
    );
    assert!(ran, "make run failed:\n{run_out}");
    assert!(
        run_out.contains("immortal-operator ") && !run_out.contains("Compiling"),
        "make run rebuilt what make demo built:\n{run_out}"
    );
    // A demo outside .demo is stopped with its own DEMO_DIR, and says so.
    assert!(
        out.contains(&format!(
            "Stop it: make demo-stop DEMO_DIR={}",
            demo.dir.display()
        )),
        "{out}"
    );
    let (server, operator) = (demo.pid("server").unwrap(), demo.pid("operator").unwrap());
    assert!(alive(server) && alive(operator), "{out}");
    let probes = printed_addr(&out, "Probes:");
    let metrics = printed_addr(&out, "Metrics:");
    for addr in [probes, metrics] {
        assert!(
            addr.starts_with("127.0.0.1:"),
            "{addr} is not loopback:\n{out}"
        );
    }
    assert!(http_get(probes, "/healthz").starts_with("HTTP/1.1 200"));
    assert!(http_get(metrics, "/metrics").contains("controller_runtime_reconcile_total"));

    // kubectl get ic,pods: the sample and its pod.
    let (ok, out) = run(&mut sh(&demo.command(README_DEMO[1])), STEP_BOUND);
    assert!(
        ok && out.contains("example") && out.contains("example-immortalpod"),
        "{out}"
    );

    // Deleting the pod: it comes back, and STARTS goes up.
    let (_, uid) = demo.kubectl(&[
        "get",
        "pod",
        "example-immortalpod",
        "-o",
        "jsonpath={.metadata.uid}",
    ]);
    let (ok, out) = run(&mut sh(&demo.command(README_DEMO[2])), STEP_BOUND);
    assert!(ok, "{out}");
    wait_for(
        "the replacement pod and startTimes 2",
        Duration::from_secs(60),
        || {
            let (_, starts) = demo.kubectl(&[
                "get",
                "ic",
                "example",
                "-o",
                "jsonpath={.status.startTimes}",
            ]);
            let (ok, new_uid) = demo.kubectl(&[
                "get",
                "pod",
                "example-immortalpod",
                "-o",
                "jsonpath={.metadata.uid}",
            ]);
            (starts.trim() == "2" && ok && !new_uid.trim().is_empty() && new_uid != uid)
                .then_some(())
        },
    );

    // trace on the demo's own log (text): both reconciles, with what they did.
    let (ok, out) = run(&mut sh(&demo.command(README_DEMO[3])), STEP_BOUND);
    assert!(ok, "trace failed:\n{out}");
    for says in [
        "triggered by: immortalcontainer",
        "create_pod: cause=new",
        "triggered by: pod DELETED",
        "create_pod: cause=deleted",
        "release_pod:",
        "start_times=2",
        "→ success",
    ] {
        assert!(out.contains(says), "trace says no {says:?}:\n{out}");
    }

    // make demo-stop: nothing left running, the kubeconfig gone, the logs kept.
    let (ok, out) = run(&mut sh(&demo.command(README_DEMO[4])), STEP_BOUND);
    assert!(ok, "{out}");
    assert!(
        out.contains(&format!("stopped operator (pid {operator})")),
        "{out}"
    );
    assert!(
        out.contains(&format!("stopped server (pid {server})")),
        "{out}"
    );
    assert!(!alive(server) && !alive(operator), "{out}");
    assert_eq!(processes_in(&demo.dir), Vec::<String>::new());
    assert!(!demo.dir.join("kubeconfig").exists());
    assert!(demo.dir.join("operator.log").exists());

    // make run with no kubeconfig anywhere runs the same demo.
    let home = demo.dir.join("home");
    fs::create_dir_all(&home).unwrap();
    let real_home = PathBuf::from(std::env::var_os("HOME").unwrap_or_default());
    let mut make_run = sh(&format!("make run DEMO_DIR={}", demo.dir.display()));
    make_run.env_remove("KUBECONFIG").env("HOME", &home);
    // cargo and rustup find their homes through HOME unless told; keep them where they are.
    for (var, default) in [("CARGO_HOME", ".cargo"), ("RUSTUP_HOME", ".rustup")] {
        let at = std::env::var_os(var).map_or_else(|| real_home.join(default), PathBuf::from);
        if at.exists() {
            make_run.env(var, at);
        }
    }
    let (ok, out) = run(&mut make_run, BUILD_BOUND);
    assert!(ok, "make run failed:\n{out}");
    assert!(
        out.contains("no kubeconfig") && out.contains("The demo is running"),
        "{out}"
    );
    let (ok, out) = demo.kubectl(&["get", "pod", "example-immortalpod"]);
    assert!(ok, "{out}");
    // The first demo's logs are kept one run back, not overwritten.
    for p in ["operator", "server"] {
        let previous = fs::read_to_string(demo.dir.join(format!("{p}.log.1"))).unwrap_or_default();
        assert!(!previous.is_empty(), "no {p}.log.1 after a second demo");
    }
    let first = fs::read_to_string(demo.dir.join("operator.log.1")).unwrap();
    assert!(
        first.contains("shutting down"),
        "operator.log.1 is not the stopped run's:
{first}"
    );
    let (ok, out) = run(&mut sh(&demo.command("make demo-stop")), STEP_BOUND);
    assert!(ok && out.contains("stopped operator"), "{out}");
    assert_eq!(processes_in(&demo.dir), Vec::<String>::new());
}

#[test]
fn make_demo_fails_with_the_reason_when_the_operator_cannot_start() {
    // A probe port another program holds: the operator exits at start, and the demo must say
    // so and stop the server, not report a running demo.
    let holder = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = holder.local_addr().unwrap();
    let demo = DemoDir::new("taken");
    let (ok, out) = run(
        &mut sh(&format!(
            "make demo DEMO_DIR={} DEMO_PROBE_ADDR={taken}",
            demo.dir.display()
        )),
        BUILD_BOUND,
    );
    assert!(!ok, "make demo succeeded with its probe port taken:\n{out}");
    assert!(!out.contains("The demo is running"), "{out}");
    assert!(out.contains("the demo's operator exited"), "{out}");
    assert!(
        out.contains(&format!("cannot serve probes on {taken}")),
        "{out}"
    );
    assert_eq!(processes_in(&demo.dir), Vec::<String>::new(), "{out}");
    assert!(!demo.dir.join("kubeconfig").exists());
    drop(holder);
}
