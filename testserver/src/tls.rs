//! Certificates (a fresh CA and a server certificate for 127.0.0.1/localhost), the rustls
//! server configuration, and kubeconfig files that point clients at the server.

use crate::util;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use std::io;
use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::sync::Arc;

/// The generated key material.
pub struct Certs {
    pub ca_pem: String,
    pub server_cert_pem: String,
    pub server_key_pem: String,
    pub config: Arc<rustls::ServerConfig>,
}

fn other(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

/// Generates a CA and a server certificate signed by it, valid for IP 127.0.0.1 and DNS
/// localhost (what kubeconfig's `server: https://127.0.0.1:PORT` is checked against).
pub fn generate() -> io::Result<Certs> {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose, SanType,
    };
    let ca_key = KeyPair::generate().map_err(other)?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(other)?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "kube-testserver-ca");
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca = ca_params.self_signed(&ca_key).map_err(other)?;
    let issuer = rcgen::Issuer::new(ca_params, ca_key);

    let key = KeyPair::generate().map_err(other)?;
    let mut params = CertificateParams::new(vec!["localhost".to_string()]).map_err(other)?;
    params
        .subject_alt_names
        .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
    params
        .distinguished_name
        .push(DnType::CommonName, "kube-apiserver");
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let cert = params.signed_by(&key, &issuer).map_err(other)?;

    let chain: Vec<CertificateDer<'static>> = vec![cert.der().clone()];
    let private = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(other)?
        .with_no_client_auth()
        .with_single_cert(chain, private)
        .map_err(other)?;
    // kubectl and client-go offer h2 first; we speak only HTTP/1.1, so say so in ALPN.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Certs {
        ca_pem: ca.pem(),
        server_cert_pem: cert.pem(),
        server_key_pem: key.serialize_pem(),
        config: Arc::new(config),
    })
}

/// A kubeconfig for `server` trusting `ca_pem`, authenticating with bearer `token` as
/// `user`, with one context (namespace `default`) made current.
pub fn kubeconfig(server: &str, ca_pem: &str, user: &str, token: &str) -> String {
    let ca = util::base64(ca_pem.as_bytes());
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: kube-testserver
  cluster:
    server: {server}
    certificate-authority-data: {ca}
users:
- name: {user}
  user:
    token: {token}
contexts:
- name: kube-testserver
  context:
    cluster: kube-testserver
    user: {user}
    namespace: default
current-context: kube-testserver
preferences: {{}}
"
    )
}

/// Writes `contents` to `path`, readable by the owner only (it holds a bearer token or key).
pub fn write_private(path: &Path, contents: &str) -> io::Result<()> {
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    let mut f = opts.open(path)?;
    io::Write::write_all(&mut f, contents.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubeconfig_names_server_token_and_current_context() {
        let k = kubeconfig("https://127.0.0.1:1234", "PEM", "admin", "tok");
        let v: serde_yaml::Value = serde_yaml::from_str(&k).expect("yaml");
        assert_eq!(
            v["clusters"][0]["cluster"]["server"].as_str(),
            Some("https://127.0.0.1:1234")
        );
        assert_eq!(
            v["clusters"][0]["cluster"]["certificate-authority-data"].as_str(),
            Some("UEVN")
        );
        assert_eq!(v["users"][0]["user"]["token"].as_str(), Some("tok"));
        assert_eq!(v["current-context"].as_str(), Some("kube-testserver"));
        assert_eq!(
            v["contexts"][0]["context"]["namespace"].as_str(),
            Some("default")
        );
    }

    #[test]
    fn generated_certificates_are_pem() {
        let c = generate().expect("certs");
        assert!(c.ca_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(c.server_key_pem.contains("PRIVATE KEY"));
    }
}
