//! The pod's own service account: the configuration of an operator running in its cluster.

use super::*;

/// The pod's own service account, as client-go's `rest.InClusterConfig` builds it.
pub(super) fn in_cluster(
    host: &str,
    port: &str,
    sa_dir: &Path,
) -> Result<ClusterConfig, ConfigError> {
    // An IPv6 service host (dual-stack clusters) needs brackets in a URL.
    let host = if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]")
    } else {
        host.to_string()
    };
    let server = format!("https://{host}:{port}");
    let what = "in-cluster service account token".to_string();
    let credentials = Credentials::token_file(sa_dir.join("token"), what)?;
    let ca_path = sa_dir.join("ca.crt");
    let ca = read_file(&ca_path, "in-cluster service account CA")?;
    // The namespace file is optional: without it objects must name their namespace.
    let namespace = std::fs::read_to_string(sa_dir.join("namespace"))
        .ok()
        .map(|ns| ns.trim().to_string())
        .filter(|ns| !ns.is_empty());
    let ca_origin = format!("in-cluster service account CA {}", ca_path.display());
    let settings = TlsSettings {
        ca: Some((ca, ca_origin)),
        ..TlsSettings::default()
    };
    let source = "in-cluster".to_string();
    finish(server, namespace, source, credentials, settings)
}
