//! The load phase's flood (every pod made not ready from C connections), run by a child process
//! at a lower CPU priority so that the load generator does not starve what it loads.
//!
//! On a real cluster the clients that load an API server do not run on the operator's CPU. Run
//! as threads of the bench, the flood's connections shared the two cores of this machine with
//! the test server's watch streams, its kubelet and the operator, and the pod watch stream
//! paused for hundreds of milliseconds at a time (docs/benchmark.md, "Recovery under load").
//! The child is `immortal-bench --flood ...` under `nice -n 10`, and on the test server it is a
//! user of its own whose requests are served at nice 10 too. It reports on stdout, one line
//! each: `start` before its first request, `sent K` once a quarter is sent, `done SECONDS`, and
//! `counts JSON`, its requests by verb, so the parent can tell them from the operator's.

use crate::cluster::{Api, Counts};
use crate::{parallel, Error};
use immortal_operator::immortal::types::pod_name;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// The hidden flag of `immortal-bench` that runs the flood instead of a benchmark.
pub const FLAG: &str = "flood";

/// The flood's niceness by default: its requests still get the CPU the system under test
/// leaves over (at nice 10 a thread weighs about a tenth of one at 0), so it does the same
/// work, later if it must.
pub const NICE: u8 = 10;

/// Makes the pods of objects `ic-0` .. `ic-{n-1}` in `ns` not ready from `connections`
/// connections, counting each in `sent` and calling `quarter` once a quarter is sent.
fn unready_all(
    api: &Api,
    ns: &str,
    n: usize,
    connections: usize,
    deadline: Instant,
    sent: &AtomicUsize,
    quarter: &(dyn Fn(usize) + Sync),
) -> Result<(), Error> {
    parallel(n, connections, deadline, |i| {
        api.unready_pod(ns, &pod_name(&format!("ic-{i}")))?;
        let k = sent.fetch_add(1, Ordering::Relaxed) + 1;
        if k == (n / 4).max(1) {
            quarter(k);
        }
        Ok(())
    })
    .map(drop)
}

/// The child's side: `ARGS` are the kubeconfig, the namespace, N, C and the seconds left of
/// the run's budget. Exit code 0 when every pod was made not ready, 2 otherwise (said on stderr).
pub fn child(args: &[String]) -> ExitCode {
    let [kubeconfig, ns, n, connections, seconds] = args else {
        eprintln!("immortal-bench --{FLAG}: want KUBECONFIG NAMESPACE N CONNECTIONS SECONDS");
        return ExitCode::from(2);
    };
    let (Ok(n), Ok(connections), Ok(seconds)) =
        (n.parse(), connections.parse(), seconds.parse::<u64>())
    else {
        eprintln!("immortal-bench --{FLAG}: N, CONNECTIONS and SECONDS are numbers");
        return ExitCode::from(2);
    };
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let api = match Api::connect(Path::new(kubeconfig), connections) {
        Ok(api) => api,
        Err(e) => {
            eprintln!("immortal-bench --{FLAG}: {e}");
            return ExitCode::from(2);
        }
    };
    let sent = AtomicUsize::new(0);
    println!("start");
    let started = Instant::now();
    let flooded = unready_all(&api, ns, n, connections, deadline, &sent, &|k| {
        println!("sent {k}")
    });
    println!("done {}", started.elapsed().as_secs_f64());
    println!(
        "counts {}",
        serde_json::to_string(&api.own_counts()).unwrap_or_default()
    );
    match flooded {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("immortal-bench --{FLAG}: {e}");
            ExitCode::from(2)
        }
    }
}

/// What the flood has done so far, as the parent sees it.
#[derive(Default)]
struct Progress {
    sent: AtomicUsize,
    started: Mutex<Option<Instant>>,
    seconds: Mutex<Option<f64>>,
}

/// A flood under way.
pub struct Flood {
    progress: Arc<Progress>,
    running: Running,
    /// Where it runs, for the report.
    pub runs_in: String,
}

enum Running {
    Process {
        child: Child,
        reader: Option<JoinHandle<Option<Counts>>>,
    },
    Threads(Option<JoinHandle<(Result<(), Error>, Counts)>>),
}

impl Flood {
    /// Starts making every pod of `ns` not ready, as the user of `kubeconfig`: in a child
    /// process, `exe --flood ...` under `nice -n NICE` (none for 0), when `exe` is given (the
    /// `immortal-bench` binary); otherwise on threads of this process (as the library's tests
    /// run it, with no such binary at hand).
    pub fn start(
        exe: Option<&Path>,
        nice: u8,
        kubeconfig: &Path,
        ns: &str,
        n: usize,
        connections: usize,
        deadline: Instant,
    ) -> Result<Flood, Error> {
        let progress = Arc::new(Progress::default());
        let Some(exe) = exe else {
            let api = Api::connect(kubeconfig, connections)?;
            *lock(&progress.started) = Some(Instant::now());
            let (ns, p) = (ns.to_string(), progress.clone());
            let handle = thread::Builder::new()
                .name("flood".into())
                .spawn(move || {
                    let started = Instant::now();
                    let r = unready_all(&api, &ns, n, connections, deadline, &p.sent, &|_| {});
                    *lock(&p.seconds) = Some(started.elapsed().as_secs_f64());
                    (r, api.own_counts())
                })
                .map_err(|e| Error::Setup(format!("cannot spawn the flood thread: {e}")))?;
            return Ok(Flood {
                progress,
                running: Running::Threads(Some(handle)),
                runs_in: format!("{connections} threads of the bench"),
            });
        };
        let seconds = deadline.saturating_duration_since(Instant::now()).as_secs();
        let mut command = if nice > 0 {
            let mut c = Command::new("nice");
            c.args(["-n", &nice.to_string()]).arg(exe);
            c
        } else {
            Command::new(exe)
        };
        let mut child = command
            .arg(format!("--{FLAG}"))
            .arg(kubeconfig)
            .args([ns, &n.to_string(), &connections.to_string()])
            .arg(seconds.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| {
                let how = if nice > 0 { "nice (coreutils) or " } else { "" };
                Error::Setup(format!("cannot run {how}{}: {e}", exe.display()))
            })?;
        let stdout = child.stdout.take();
        let p = progress.clone();
        let reader = thread::Builder::new()
            .name("flood-reader".into())
            .spawn(move || stdout.and_then(|out| read_reports(BufReader::new(out), &p)))
            .map_err(|e| Error::Setup(format!("cannot spawn the flood's reader: {e}")))?;
        Ok(Flood {
            progress,
            running: Running::Process {
                child,
                reader: Some(reader),
            },
            runs_in: format!("a child process at nice {nice}, {connections} connections"),
        })
    }

    /// Pods made not ready so far, as far as the parent knows: exact until the first quarter,
    /// which is all the load phase waits for.
    pub fn sent(&self) -> usize {
        self.progress.sent.load(Ordering::Relaxed)
    }

    /// When the first request was about to be sent (`None` before).
    pub fn started(&self) -> Option<Instant> {
        *lock(&self.progress.started)
    }

    pub fn is_finished(&mut self) -> bool {
        match &mut self.running {
            Running::Process { child, .. } => !matches!(child.try_wait(), Ok(None)),
            Running::Threads(h) => h.as_ref().is_none_or(|h| h.is_finished()),
        }
    }

    /// Waits for the flood to end (at most until `deadline`, then ends it); returns how long it
    /// took from its first request to its last answer. The flood's requests are added to
    /// `api`'s own counts, so that they are not taken for the operator's.
    pub fn finish(mut self, api: &Api, deadline: Instant) -> Result<f64, Error> {
        match &mut self.running {
            Running::Threads(h) => match h.take().map(|h| h.join()) {
                Some(Ok((r, counts))) => {
                    api.add_counts(&counts);
                    r?
                }
                _ => return Err(Error::Operator("the flood thread panicked".into())),
            },
            Running::Process { child, reader } => {
                let status = loop {
                    match child.try_wait() {
                        Ok(Some(status)) => break status,
                        Ok(None) if Instant::now() < deadline => {
                            thread::sleep(Duration::from_millis(5))
                        }
                        Ok(None) => {
                            return Err(Error::Timeout("the flood process never ended".into()))
                        }
                        Err(e) => {
                            return Err(Error::Setup(format!("cannot wait for the flood: {e}")))
                        }
                    }
                };
                let counts = reader.take().and_then(|r| r.join().ok()).flatten();
                if let Some(c) = &counts {
                    api.add_counts(c);
                }
                if !status.success() || counts.is_none() {
                    return Err(Error::Setup(format!(
                        "the flood process ended with {status} (its stderr above says why)"
                    )));
                }
            }
        }
        Ok(lock(&self.progress.seconds).unwrap_or(f64::NAN))
    }
}

impl Drop for Flood {
    /// A flood the load phase gave up on (an error before `finish`) must not outlive the run.
    fn drop(&mut self) {
        if let Running::Process { child, .. } = &mut self.running {
            if matches!(child.try_wait(), Ok(None)) {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// Reads the child's report lines into `p` until its stdout closes; returns its counts.
fn read_reports(out: impl BufRead, p: &Progress) -> Option<Counts> {
    let mut counts = None;
    for line in out.lines().map_while(Result::ok) {
        let (word, rest) = line.split_once(' ').unwrap_or((line.as_str(), ""));
        match word {
            "start" => *lock(&p.started) = Some(Instant::now()),
            "sent" => p.sent.store(rest.parse().unwrap_or(0), Ordering::Relaxed),
            "done" => *lock(&p.seconds) = rest.parse().ok(),
            "counts" => counts = serde_json::from_str(rest).ok(),
            _ => {}
        }
    }
    counts
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_childs_report_lines_give_its_start_progress_time_and_counts() {
        let p = Progress::default();
        let out = "start\nsent 2500\ndone 1.5\ncounts {\"patch pods/status\":10000}\n";
        let counts = read_reports(out.as_bytes(), &p).expect("counts");
        assert!(lock(&p.started).is_some());
        assert_eq!(p.sent.load(Ordering::Relaxed), 2500);
        assert_eq!(*lock(&p.seconds), Some(1.5));
        assert_eq!(counts.get("patch pods/status"), Some(&10000));
    }

    #[test]
    fn a_child_that_died_before_reporting_its_counts_gives_none() {
        let p = Progress::default();
        assert_eq!(read_reports("start\nsent 3\n".as_bytes(), &p), None);
    }
}
