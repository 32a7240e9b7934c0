//! The `immortal-bench` binary (`make bench`): flags → run → table on stdout, JSON to a file.

use clap::Parser;
use immortal_bench::{run, Config, DEFAULT_IMAGE};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// Benchmarks immortal-operator against a bare-client floor on the same API server.
///
/// Runs against an in-process test API server, or with --kubeconfig against a cluster that has
/// the ImmortalContainer CRD installed (the bench works in fresh namespaces and deletes them).
/// Exit code: 0 all correct, 1 a correctness check failed, 2 the run could not finish.
#[derive(Debug, Parser)]
#[command(name = "immortal-bench", version)]
struct Args {
    /// Benchmark this cluster instead of the in-process test API server.
    #[arg(long, value_name = "PATH")]
    kubeconfig: Option<PathBuf>,
    /// The operator binary [default: $CARGO_TARGET_DIR/release/immortal-operator, else the one
    /// next to this binary, else target/release/immortal-operator].
    #[arg(long, value_name = "PATH")]
    operator: Option<PathBuf>,
    /// ImmortalContainers per phase.
    #[arg(long, default_value_t = 1000, value_name = "N")]
    objects: usize,
    /// Parallel connections of the floor and of the bulk creates.
    #[arg(long, default_value_t = 64, value_name = "C")]
    connections: usize,
    /// Pods deleted, then pods marked Failed, one at a time.
    #[arg(long, default_value_t = 50, value_name = "K")]
    recovery: usize,
    /// Reconcile workers of the operator (--workers) [default: the operator's own default].
    #[arg(long, default_value_t = immortal_operator::cli::DEFAULT_WORKERS, value_name = "N")]
    workers: usize,
    /// Where to write the results as JSON.
    #[arg(long, default_value = "bench-results.json", value_name = "FILE")]
    json: PathBuf,
    /// Image of every ImmortalContainer.
    #[arg(long, default_value = DEFAULT_IMAGE, value_name = "IMAGE")]
    image: String,
    /// Give every ImmortalContainer a typical pod template (about 1 KB: labels, annotations,
    /// securityContext, args, env, port, resources, a probe), to measure what templates cost.
    #[arg(long)]
    template: bool,
    /// Herd phase (test server only): how long every request of its namespace fails, in
    /// seconds; 0 skips the phase.
    #[arg(long, default_value_t = 10, value_name = "SECONDS")]
    burst_seconds: u64,
    /// Herd phase: the HTTP status of the burst's answers (503, 500, 429...).
    #[arg(long, default_value_t = 503, value_name = "CODE")]
    burst_status: u16,
    /// Herd phase: objects queued when the burst starts [default: --objects].
    #[arg(long, value_name = "N")]
    burst_objects: Option<usize>,
    /// Restart-after-drain phase: objects converged under one operator, which is then stopped
    /// while --drain-pods of their pods are force-deleted, and a fresh one started [default:
    /// --objects]; 0 skips the phase.
    #[arg(long, value_name = "N")]
    drain_objects: Option<usize>,
    /// Restart-after-drain phase: pods force-deleted while no operator runs (at most
    /// --drain-objects).
    #[arg(long, default_value_t = 50, value_name = "K")]
    drain_pods: usize,
    /// Test server only: milliseconds added to every answer, as a real API server's round trip
    /// adds them; with it, the floor at N connections and the operator at N workers show what
    /// concurrency buys when the server has cores to spare.
    #[arg(long, default_value_t = 0, value_name = "MS")]
    latency_ms: u64,
    /// Test server only: objects of the modeled phase (at most --objects), where the test server
    /// models a real control plane's costs (testserver/README.md) and the backlog is held to a
    /// kube-rs-style floor, 2 writes a pod with hundreds in flight; 0 skips it.
    #[arg(long, default_value_t = 1000, value_name = "N")]
    model_objects: usize,

    /// Niceness (0-19) of the load phase's flood, its process and (test server only) the threads
    /// that serve its requests, so that it takes only the CPU the operator leaves over; 0 runs it
    /// at the operator's priority.
    #[arg(long, default_value_t = immortal_bench::flood::NICE, value_name = "N")]
    flood_nice: u8,

    /// Give up (exit 2) when the whole run takes longer, in seconds.
    #[arg(long, default_value_t = 3600, value_name = "SECONDS")]
    timeout: u64,
    /// Keep the operators' logs (operator-<phase>.log) when the run passes too, and print
    /// where; `immortal-operator trace` reads them.
    #[arg(long)]
    keep_logs: bool,
    /// The load phase's flood process (run by the bench itself): KUBECONFIG NAMESPACE N
    /// CONNECTIONS SECONDS.
    #[arg(long = immortal_bench::flood::FLAG, hide = true, num_args = 5)]
    flood: Option<Vec<String>>,
}

/// Where `cargo build --release` put the operator.
fn default_operator() -> PathBuf {
    if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir).join("release").join("immortal-operator");
    }
    // `cargo run --release -p immortal-bench` runs target/release/immortal-bench.
    if let Some(sibling) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(|d| d.join("immortal-operator")))
        .filter(|p| p.is_file())
    {
        return sibling;
    }
    PathBuf::from("target/release/immortal-operator")
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(flood) = &args.flood {
        return immortal_bench::flood::child(flood);
    }
    let cfg = Config {
        kubeconfig: args.kubeconfig,
        operator: args.operator.unwrap_or_else(default_operator),
        objects: args.objects,
        connections: args.connections,
        recovery: args.recovery,
        workers: args.workers,
        image: args.image,
        template: args.template.then(immortal_bench::typical_template),
        latency: Duration::from_millis(args.latency_ms),
        model_objects: args.model_objects,
        burst: Duration::from_secs(args.burst_seconds),
        burst_status: args.burst_status,
        burst_objects: args.burst_objects,
        drain_objects: args.drain_objects,
        drain_pods: args.drain_pods,
        timeout: Duration::from_secs(args.timeout),
        keep_logs: args.keep_logs,
        flood_exe: std::env::current_exe().ok(),
        flood_nice: args.flood_nice,
        progress: true,
    };
    let report = match run(&cfg) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("immortal-bench: {e}");
            return ExitCode::from(2);
        }
    };
    print!("{}", report.table());
    match serde_json::to_string_pretty(&report) {
        Ok(json) => match std::fs::write(&args.json, json + "\n") {
            Ok(()) => println!("results: {}", args.json.display()),
            Err(e) => {
                eprintln!("immortal-bench: cannot write {}: {e}", args.json.display());
                return ExitCode::from(2);
            }
        },
        Err(e) => {
            eprintln!("immortal-bench: cannot encode the results: {e}");
            return ExitCode::from(2);
        }
    }
    if report.failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
