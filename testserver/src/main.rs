//! `kube-testserver`: runs the in-memory API server until SIGTERM/SIGINT, for the local demo.

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
}

fn main() {
    let args = Args::parse();
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let opts = kube_testserver::Options {
        port: args.port,
        dir: Some(args.dir),
        crd_path: args.crd,
        install_crd: !args.no_crd,
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
