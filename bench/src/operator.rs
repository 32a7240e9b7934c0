//! The operator under test as a child process: spawn, readiness, its CPU and memory read from
//! /proc (never the bench's own), its request counts from its /metrics, and a SIGTERM stop.

use crate::Error;
use std::collections::BTreeMap;
use std::fs;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::thread;
use std::time::{Duration, Instant};

/// How long the operator gets to exit after SIGTERM before it is killed (and the run fails).
const STOP_GRACE: Duration = Duration::from_secs(10);

/// CPU time and memory of a process at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct Usage {
    /// utime + stime.
    pub cpu_seconds: f64,
    /// VmRSS: resident now.
    pub rss_kib: u64,
    /// VmHWM: the most it was ever resident.
    pub peak_rss_kib: u64,
}

/// A running operator. Dropping it without [`Operator::stop`] kills it.
pub struct Operator {
    child: Child,
    pub pid: u32,
    metrics: SocketAddr,
    probes: SocketAddr,
    /// Where its log (stderr, JSON lines) goes.
    pub log: PathBuf,
    /// Just before the spawn: the backlog is timed from here.
    pub spawned_at: Instant,
    stopped: bool,
}

impl Drop for Operator {
    fn drop(&mut self) {
        if !self.stopped {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A port free right now on 127.0.0.1. Another process could take it before the operator
/// binds it; the operator then exits with a clear error and the run says so.
fn free_port() -> Result<SocketAddr, Error> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| Error::Setup(format!("no free local port: {e}")))
}

impl Operator {
    /// Starts `binary` on `namespace` of the cluster in `kubeconfig`, logging JSON to `log`.
    pub fn spawn(
        binary: &Path,
        kubeconfig: &Path,
        namespace: &str,
        workers: usize,
        log: &Path,
    ) -> Result<Operator, Error> {
        let (metrics, probes) = (free_port()?, free_port()?);
        let log_file = fs::File::create(log)
            .map_err(|e| Error::Setup(format!("cannot create {}: {e}", log.display())))?;
        let mut cmd = Command::new(binary);
        cmd.arg("--kubeconfig")
            .arg(kubeconfig)
            // One namespace: the floor's objects live in others, and on a shared cluster the
            // operator must not touch anything but the bench's.
            .args(["--namespace", namespace])
            .args(["--workers", &workers.to_string()])
            .args(["--metrics-bind-address", &metrics.to_string()])
            // Plain HTTP: the bench reads the request counts from /metrics itself, without a
            // token the API server would have to vouch for.
            .arg("--metrics-secure=false")
            .args(["--health-probe-bind-address", &probes.to_string()])
            .args(["--log-format", "json"])
            // The operator's default level, whatever the bench was started with: logging is
            // part of its cost, so it must be the same from run to run.
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file);
        let spawned_at = Instant::now();
        let child = cmd
            .spawn()
            .map_err(|e| Error::Operator(format!("cannot start {}: {e}", binary.display())))?;
        Ok(Operator {
            pid: child.id(),
            child,
            metrics,
            probes,
            log: log.to_path_buf(),
            spawned_at,
            stopped: false,
        })
    }

    /// An error if the operator has exited (it must run until stopped).
    pub fn check_alive(&mut self) -> Result<(), Error> {
        match self.child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => {
                self.stopped = true;
                Err(Error::Operator(format!(
                    "the operator exited early ({status}); its log: {}",
                    self.log.display()
                )))
            }
            Err(e) => Err(Error::Operator(format!("cannot check the operator: {e}"))),
        }
    }

    /// Waits until `/readyz` answers 200: both its watches have completed their first list.
    pub fn wait_ready(&mut self, deadline: Instant) -> Result<(), Error> {
        loop {
            self.check_alive()?;
            if matches!(http_get(self.probes, "/readyz"), Ok((200, _))) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(Error::Timeout(
                    "gave up waiting for the operator's /readyz".into(),
                ));
            }
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// Its CPU time and memory now, from /proc.
    pub fn usage(&self) -> Result<Usage, Error> {
        read_usage(self.pid)
    }

    /// Its /metrics text.
    fn metrics(&self) -> Result<String, Error> {
        match http_get(self.metrics, "/metrics") {
            Ok((200, body)) => Ok(body),
            Ok((code, _)) => Err(Error::Operator(format!("/metrics answered {code}"))),
            Err(e) => Err(Error::Operator(format!("/metrics: {e}"))),
        }
    }

    /// Its `rest_client_requests_total`, summed over codes, by HTTP method.
    pub fn requests_by_method(&self) -> Result<BTreeMap<String, u64>, Error> {
        Ok(parse_requests(&self.metrics()?))
    }

    /// Requests of its that the API server answered 409 (Conflict or AlreadyExists): the
    /// price of its preconditions.
    pub fn conflicts(&self) -> Result<u64, Error> {
        Ok(parse_conflicts(&self.metrics()?))
    }

    /// Keys its queue holds ready now (`workqueue_depth` of its /metrics).
    pub fn queue_depth(&self) -> Result<u64, Error> {
        Ok(parse_gauge(&self.metrics()?, "workqueue_depth"))
    }

    /// Keys its queue holds now and its requests so far, from one read of /metrics, so that
    /// the two describe the same moment.
    pub fn queue_and_requests(&self) -> Result<(u64, u64), Error> {
        let text = self.metrics()?;
        let requests = parse_requests(&text).values().sum();
        Ok((parse_gauge(&text, "workqueue_depth"), requests))
    }

    /// SIGTERM, then waits for it to exit. Returns its exit code (`None`: killed by a signal).
    pub fn stop(mut self) -> Result<Option<i32>, Error> {
        self.check_alive()?;
        // std can only SIGKILL a child; kill(1) sends the SIGTERM the operator handles.
        let sent = Command::new("kill")
            .args(["-TERM", &self.pid.to_string()])
            .status()
            .map_err(|e| Error::Operator(format!("cannot run kill: {e}")))?;
        if !sent.success() {
            return Err(Error::Operator(format!("kill -TERM {} failed", self.pid)));
        }
        let give_up = Instant::now() + STOP_GRACE;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => {
                    self.stopped = true;
                    return Ok(status.code());
                }
                Ok(None) if Instant::now() < give_up => thread::sleep(Duration::from_millis(10)),
                Ok(None) => {
                    return Err(Error::Operator(format!(
                        "the operator did not exit within {}s of SIGTERM",
                        STOP_GRACE.as_secs()
                    )))
                }
                Err(e) => {
                    return Err(Error::Operator(format!(
                        "cannot wait for the operator: {e}"
                    )))
                }
            }
        }
    }
}

/// One HTTP/1.1 GET to the operator's plain-HTTP endpoints; it closes after each answer.
fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let mut conn = TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
    conn.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        conn,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut text = String::new();
    conn.read_to_string(&mut text)?;
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((code, body))
}

/// Sums `rest_client_requests_total{code=..,host=..,method="M"} N` lines by method.
pub fn parse_requests(metrics: &str) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix("rest_client_requests_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let method = labels
            .split(',')
            .find_map(|l| l.strip_prefix("method=\""))
            .map(|m| m.trim_end_matches('"'));
        // Counters are integers, rendered without a fraction by the operator.
        if let (Some(m), Ok(n)) = (method, value.trim().parse::<f64>()) {
            *out.entry(m.to_string()).or_insert(0) += n as u64;
        }
    }
    out
}

/// The requests `rest_client_requests_total` counts with `code="409"`.
pub fn parse_conflicts(metrics: &str) -> u64 {
    metrics
        .lines()
        .filter_map(|l| l.strip_prefix("rest_client_requests_total{"))
        .filter_map(|rest| rest.rsplit_once("} "))
        .filter(|(labels, _)| labels.split(',').any(|l| l == "code=\"409\""))
        .filter_map(|(_, v)| v.trim().parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
}

/// The value of the gauge `name` (with any labels), 0 if absent.
pub fn parse_gauge(metrics: &str, name: &str) -> u64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter_map(|l| l.rsplit_once(' ')?.1.trim().parse::<f64>().ok())
        .map(|v| v as u64)
        .next()
        .unwrap_or(0)
}

/// Clock ticks per second of /proc/PID/stat's times: `getconf CLK_TCK`, read once; 100 (what
/// Linux uses on every common architecture) if it cannot be run.
fn clk_tck() -> f64 {
    static TCK: OnceLock<f64> = OnceLock::new();
    *TCK.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse::<f64>().ok())
            .filter(|t| *t > 0.0)
            .unwrap_or(100.0)
    })
}

/// CPU time and memory of `pid`, from /proc/PID/stat and /proc/PID/status.
pub fn read_usage(pid: u32) -> Result<Usage, Error> {
    let read = |f: &str| {
        fs::read_to_string(format!("/proc/{pid}/{f}"))
            .map_err(|e| Error::Operator(format!("cannot read /proc/{pid}/{f}: {e}")))
    };
    let stat = read("stat")?;
    let status = read("status")?;
    let bad = |what: &str| Error::Operator(format!("/proc/{pid}/{what} not understood"));
    Ok(Usage {
        cpu_seconds: parse_cpu_ticks(&stat).ok_or_else(|| bad("stat"))? as f64 / clk_tck(),
        rss_kib: parse_status_kib(&status, "VmRSS:").ok_or_else(|| bad("status"))?,
        peak_rss_kib: parse_status_kib(&status, "VmHWM:").ok_or_else(|| bad("status"))?,
    })
}

/// utime + stime in clock ticks: fields 14 and 15 of /proc/PID/stat. The command name (field 2)
/// is in parentheses and may hold spaces, so fields are counted from the last `)`.
pub fn parse_cpu_ticks(stat: &str) -> Option<u64> {
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state): field N is at index N - 3.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// A `Name:   1234 kB` line of /proc/PID/status, in KiB.
pub fn parse_status_kib(status: &str, field: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|n| n.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_ticks_are_counted_past_a_command_name_with_spaces_and_parens() {
        let stat = "4242 (immortal (op) x) S 1 4242 4242 0 -1 4194560 500 0 0 0 \
                    37 5 0 0 20 0 9 0 123456 8000000 600 18446744073709551615";
        assert_eq!(parse_cpu_ticks(stat), Some(42));
    }

    #[test]
    fn a_truncated_stat_line_is_not_understood() {
        assert_eq!(parse_cpu_ticks("4242 (op) S 1 2"), None);
    }

    #[test]
    fn rss_and_peak_come_from_their_status_lines() {
        let status = "Name:\timmortal-operator\nVmHWM:\t    5120 kB\nVmRSS:\t    2048 kB\n";
        assert_eq!(parse_status_kib(status, "VmRSS:"), Some(2048));
        assert_eq!(parse_status_kib(status, "VmHWM:"), Some(5120));
        assert_eq!(parse_status_kib(status, "VmSwap:"), None);
    }

    #[test]
    fn a_gauge_is_read_by_its_name_with_or_without_labels() {
        let text = "# HELP workqueue_depth x\nworkqueue_depth{name=\"immortalcontainer\"} 42\n\
                    workqueue_depth_other 7\n";
        assert_eq!(parse_gauge(text, "workqueue_depth"), 42);
        assert_eq!(parse_gauge("up 1\n", "up"), 1);
        assert_eq!(parse_gauge(text, "absent"), 0);
    }

    #[test]
    fn request_counts_are_summed_over_codes_by_method() {
        let text = "# HELP rest_client_requests_total x\n\
            rest_client_requests_total{code=\"200\",host=\"127.0.0.1:6443\",method=\"GET\"} 7\n\
            rest_client_requests_total{code=\"404\",host=\"127.0.0.1:6443\",method=\"GET\"} 2\n\
            rest_client_requests_total{code=\"201\",host=\"127.0.0.1:6443\",method=\"POST\"} 5\n\
            workqueue_adds_total{name=\"immortalcontainer\"} 99\n";
        let got = parse_requests(text);
        assert_eq!(got.get("GET"), Some(&9));
        assert_eq!(got.get("POST"), Some(&5));
        assert_eq!(got.len(), 2);
    }

    #[test]
    fn our_own_process_usage_reads_from_proc() {
        let u = read_usage(std::process::id()).expect("own /proc");
        assert!(u.rss_kib > 0 && u.peak_rss_kib >= u.rss_kib, "{u:?}");
    }
}
