//! `kube-testserver`: runs the in-memory API server, with its simulated nodes, until
//! SIGTERM/SIGINT, for the local demo.

use clap::Parser;
use std::path::PathBuf;

/// An in-memory Kubernetes API server for trying immortal-operator without a cluster.
#[derive(Debug, Parser)]
#[command(name = "kube-testserver", version)]
struct Args {
    /// Port on 127.0.0.1 (0 picks a free one).
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// Directory for the kubeconfig and certificates.
    #[arg(long, default_value = ".demo")]
    dir: PathBuf,
    /// CRD YAML to pre-install instead of the built-in ImmortalContainer CRD.
    #[arg(long)]
    crd: Option<PathBuf>,
    /// Do not pre-install any CRD.
    #[arg(long)]
    no_crd: bool,
    /// Nodes to register at start (node-0, node-1, ...).
    #[arg(long, default_value_t = 1)]
    nodes: usize,
    /// No scheduler and no kubelet: pods stay Pending and every pod deletion is immediate.
    #[arg(long)]
    no_kubelet: bool,
    /// Multiplies the kubelet's waits on grace periods and the node controllers' waits (1 =
    /// real time; 0.01 makes 30 s of grace 300 ms). The pods still show the grace period that
    /// was asked for.
    #[arg(long, default_value_t = 1.0)]
    grace_scale: f64,
    /// Multiplies the kubelet's restart and image-pull back-offs (10 s doubling to 5 min; 1 =
    /// real time). Their messages ("back-off 10s restarting failed container") always name the
    /// unscaled back-off, so only at 1 do they say what a person sees happen.
    #[arg(long, default_value_t = 1.0)]
    backoff_scale: f64,
}

fn main() {
    let args = Args::parse();
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    for (flag, scale) in [
        ("--grace-scale", args.grace_scale),
        ("--backoff-scale", args.backoff_scale),
    ] {
        if !(scale.is_finite() && scale >= 0.0) {
            eprintln!("kube-testserver: {flag} must be a number >= 0, not {scale}");
            std::process::exit(2);
        }
    }
    // A person watching the demo sees grace periods and back-offs in real time, unlike the
    // tests: a crash-looping pod that says "back-off 5m0s" has waited five minutes.
    let kubelet = (!args.no_kubelet).then(|| kube_testserver::KubeletOptions {
        grace_scale: args.grace_scale,
        backoff_scale: args.backoff_scale,
        ..kube_testserver::KubeletOptions::default()
    });
    let opts = kube_testserver::Options {
        port: args.port,
        dir: Some(args.dir),
        crd_path: args.crd,
        install_crd: !args.no_crd,
        nodes: args.nodes,
        kubelet,
        ..kube_testserver::Options::default()
    };
    let server = match kube_testserver::TestServer::start(opts) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("kube-testserver: cannot start: {e}");
            std::process::exit(1);
        }
    };
    let kubeconfig = server.kubeconfig_path();
    let shown = std::fs::canonicalize(&kubeconfig).unwrap_or(kubeconfig);
    println!(
        "kube-testserver serving {}; kubeconfig at {} (try: KUBECONFIG={} kubectl get ic)",
        server.url(),
        shown.display(),
        shown.display()
    );
    let mut signals = match signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGINT,
    ]) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("kube-testserver: cannot handle signals: {e}");
            std::process::exit(1);
        }
    };
    // Blocks until the first SIGTERM or SIGINT; dropping the server then closes everything.
    let _ = signals.forever().next();
    drop(server);
}
