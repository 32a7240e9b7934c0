//! The rustls client configuration of the API client, from kubeconfig-style PEM inputs.

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};

/// Why a TLS configuration could not be built; never retried. Messages hold no key material.
#[derive(Debug)]
#[non_exhaustive]
pub enum TlsError {
    /// The CA bundle holds no usable certificate (not PEM, or every certificate is malformed).
    Ca(String),
    /// The client certificate PEM holds no usable certificate.
    ClientCertificate(String),
    /// The client key PEM holds no private key, or one rustls cannot sign with.
    ClientKey(String),
    /// The client key is valid but not the client certificate's (an EC key for an RSA one).
    KeyMismatch,
    /// The tls-server-name is neither a DNS name nor an IP address.
    ServerName(String),
    /// rustls refused the configuration itself (no usable protocol versions); a build problem.
    Config(String),
}

impl fmt::Display for TlsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TlsError::Ca(why) => write!(f, "bad certificate authority: {why}"),
            TlsError::ClientCertificate(why) => write!(f, "bad client certificate: {why}"),
            TlsError::ClientKey(why) => write!(f, "bad client key: {why}"),
            TlsError::KeyMismatch => f.write_str("client key does not match client certificate"),
            TlsError::ServerName(name) => write!(f, "invalid tls-server-name {name:?}"),
            TlsError::Config(why) => write!(f, "tls configuration rejected: {why}"),
        }
    }
}

impl std::error::Error for TlsError {}

/// A client configuration: `ca_pem` `None` trusts the system's, as client-go; `server_name` is
/// verified in place of the URL host, which stays the SNI (docs/design.md, "The API client").
pub fn client_config(
    ca_pem: Option<&[u8]>,
    insecure: bool,
    server_name: Option<&str>,
    client_auth: Option<(Vec<u8>, Vec<u8>)>,
) -> Result<Arc<ClientConfig>, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut verifier = Verifier {
        webpki: None,
        name: None,
        algorithms: provider.signature_verification_algorithms,
    };
    if !insecure {
        let roots = ca_pem.map_or_else(system_roots, root_store)?;
        let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
            .build()
            .map_err(|e| TlsError::Ca(e.to_string()))?;
        verifier.webpki = Some(webpki);
        if let Some(name) = server_name {
            let parsed = ServerName::try_from(name.to_string());
            verifier.name = Some(parsed.map_err(|_| TlsError::ServerName(name.to_string()))?);
        }
    }

    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier));

    let config = match client_auth {
        None => builder.with_no_client_auth(),
        Some((cert_pem, key_pem)) => {
            let chain = certificates(&cert_pem).map_err(TlsError::ClientCertificate)?;
            let key = PrivateKeyDer::from_pem_slice(&key_pem)
                .map_err(|e| TlsError::ClientKey(pem_problem(&e, "private key")))?;
            // rustls checks that the key is the certificate's.
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| match e {
                    rustls::Error::InconsistentKeys(_) => TlsError::KeyMismatch,
                    other => TlsError::ClientKey(other.to_string()),
                })?
        }
    };
    Ok(Arc::new(config))
}

/// All certificates in a PEM bundle, in order (leaf first for a client chain).
fn certificates(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_problem(&e, "certificate"))?;
    if certs.is_empty() {
        return Err("no certificate found in PEM".to_string());
    }
    Ok(certs)
}

/// A root store from a CA bundle, skipping certificates that do not parse, as Go does.
fn root_store(pem: &[u8]) -> Result<RootCertStore, TlsError> {
    let certs = certificates(pem).map_err(TlsError::Ca)?;
    let mut roots = RootCertStore::empty();
    let (added, _skipped) = roots.add_parsable_certificates(certs);
    if added == 0 {
        return Err(TlsError::Ca("no valid certificate in bundle".to_string()));
    }
    Ok(roots)
}

/// Where Go's crypto/x509 looks for the system CA bundle on Linux, in its order.
pub const SYSTEM_BUNDLES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt", // Debian, Ubuntu, distroless
    "/etc/pki/tls/certs/ca-bundle.crt",   // Fedora, RHEL 6
    "/etc/ssl/ca-bundle.pem",             // openSUSE
    "/etc/pki/tls/cacert.pem",            // OpenELEC
    "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem", // CentOS, RHEL 7
    "/etc/ssl/cert.pem",                  // Alpine
];

/// The system's trust store, read when the kubeconfig names no certificate authority.
fn system_roots() -> Result<RootCertStore, TlsError> {
    match std::env::var_os("SSL_CERT_FILE") {
        Some(file) if !file.is_empty() => first_bundle(&[Path::new(&file)]),
        _ => first_bundle(&SYSTEM_BUNDLES.iter().map(Path::new).collect::<Vec<_>>()),
    }
}

/// Roots from the first of `candidates` that exists, as Go reads them: a bad one is an error.
fn first_bundle(candidates: &[&Path]) -> Result<RootCertStore, TlsError> {
    for path in candidates {
        let roots = match std::fs::read(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => Err(e.to_string()),
            Ok(pem) => root_store(&pem).map_err(|e| e.to_string()),
        };
        return roots
            .map_err(|e| TlsError::Ca(format!("system trust store {}: {e}", path.display())));
    }
    let tried: Vec<String> = candidates.iter().map(|p| p.display().to_string()).collect();
    Err(TlsError::Ca(format!(
        "no certificate-authority configured and no system trust store found (looked for {}); \
         set certificate-authority in the kubeconfig or SSL_CERT_FILE",
        tried.join(", ")
    )))
}

/// A PEM problem in our words: the error's Display may quote the input, key material too.
fn pem_problem(error: &rustls::pki_types::pem::Error, wanted: &str) -> String {
    use rustls::pki_types::pem::Error;
    match error {
        Error::NoItemsFound => format!("no {wanted} found in PEM"),
        Error::MissingSectionEnd { .. } => "unterminated PEM block".to_string(),
        Error::IllegalSectionStart { .. } => "malformed PEM header line".to_string(),
        Error::Base64Decode(_) => "invalid base64 inside PEM block".to_string(),
        _ => "invalid PEM".to_string(),
    }
}

/// Verifies the server certificate with webpki, against `name` when set, or not at all
/// (insecure); the handshake signature always, so the peer holds the key it shows.
#[derive(Debug)]
struct Verifier {
    /// `None`: insecure-skip-tls-verify.
    webpki: Option<Arc<WebPkiServerVerifier>>,
    name: Option<ServerName<'static>>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for Verifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some(webpki) = &self.webpki else {
            return Ok(ServerCertVerified::assertion());
        };
        let name = self.name.as_ref().unwrap_or(server_name);
        webpki.verify_server_cert(end_entity, intermediates, name, ocsp_response, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpListener;
    use std::path::PathBuf;
    use std::sync::mpsc;
    use std::time::Duration;

    pub(crate) fn fixture(name: &str) -> Vec<u8> {
        let path = fixture_path(name);
        std::fs::read(&path).unwrap_or_else(|e| panic!("read fixture {}: {e}", path.display()))
    }

    pub(crate) fn fixture_path(name: &str) -> PathBuf {
        PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/tls")).join(name)
    }

    /// What the test server saw: the client's certificate, if it sent one.
    pub(crate) type ServerOutcome = Result<Option<Vec<u8>>, String>;

    /// Serves one HTTPS request on 127.0.0.1 with `cert`/`key`, optionally requiring a client
    /// certificate signed by the test CA. Returns the port and a channel with the outcome.
    pub(crate) fn one_shot_server(
        cert: &str,
        key: &str,
        require_client_cert: bool,
    ) -> (u16, mpsc::Receiver<ServerOutcome>) {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&fixture(cert))
            .map(|c| c.unwrap())
            .collect();
        let key = PrivateKeyDer::from_pem_slice(&fixture(key)).unwrap();
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .unwrap();
        let builder = if require_client_cert {
            let mut roots = RootCertStore::empty();
            roots.add_parsable_certificates(
                CertificateDer::pem_slice_iter(&fixture("ca.crt")).map(|c| c.unwrap()),
            );
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .build()
            .unwrap();
            builder.with_client_cert_verifier(verifier)
        } else {
            builder.with_no_client_auth()
        };
        let config = Arc::new(builder.with_single_cert(chain, key).unwrap());

        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let outcome = (|| -> ServerOutcome {
                let (tcp, _) = listener.accept().map_err(|e| e.to_string())?;
                tcp.set_read_timeout(Some(Duration::from_secs(5))).ok();
                tcp.set_write_timeout(Some(Duration::from_secs(5))).ok();
                let conn = rustls::ServerConnection::new(config).map_err(|e| e.to_string())?;
                let mut tls = rustls::StreamOwned::new(conn, tcp);
                let mut buf = [0u8; 4096];
                let mut request = Vec::new();
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    let n = tls.read(&mut buf).map_err(|e| e.to_string())?;
                    if n == 0 {
                        return Err("client closed".into());
                    }
                    request.extend_from_slice(&buf[..n]);
                }
                let peer = tls
                    .conn
                    .peer_certificates()
                    .and_then(|c| c.first())
                    .map(|c| c.as_ref().to_vec());
                tls.write_all(
                    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok",
                )
                .map_err(|e| e.to_string())?;
                tls.conn.send_close_notify();
                tls.flush().ok();
                Ok(peer)
            })();
            let _ = tx.send(outcome);
        });
        (port, rx)
    }

    /// GETs https://{host}:{port}/ with an agent built on `config`; bounded by a 5 s timeout.
    pub(crate) fn get(config: Arc<ClientConfig>, host: &str, port: u16) -> Result<String, String> {
        let agent_config = crate::kube::client::transport::config(None, 0)
            .timeout_global(Some(Duration::from_secs(5)))
            .build();
        let agent = crate::kube::client::transport::agent_with(config, agent_config);
        let request = ureq::http::Request::get(format!("https://{host}:{port}/"));
        let mut response = agent
            .run(request.body(()).map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
        response
            .body_mut()
            .read_to_string()
            .map_err(|e| e.to_string())
    }

    fn server_outcome(rx: &mpsc::Receiver<ServerOutcome>) -> ServerOutcome {
        rx.recv_timeout(Duration::from_secs(10))
            .unwrap_or_else(|_| Err("server did not finish".into()))
    }

    fn der_of(pem_name: &str) -> Vec<u8> {
        CertificateDer::from_pem_slice(&fixture(pem_name))
            .unwrap()
            .as_ref()
            .to_vec()
    }

    #[test]
    fn connects_by_ip_to_server_signed_by_configured_ca() {
        let (port, rx) = one_shot_server("server.crt", "server.key", false);
        let config = client_config(Some(&fixture("ca.crt")), false, None, None).unwrap();
        assert_eq!(get(config, "127.0.0.1", port).unwrap(), "ok");
        assert_eq!(server_outcome(&rx).unwrap(), None);
    }

    #[test]
    fn rejects_server_signed_by_another_ca() {
        let (port, _rx) = one_shot_server("server.crt", "server.key", false);
        let config = client_config(Some(&fixture("other-ca.crt")), false, None, None).unwrap();
        let err = get(config, "127.0.0.1", port).unwrap_err();
        assert!(err.contains("UnknownIssuer"), "{err}");
    }

    #[test]
    fn the_first_existing_system_bundle_is_used() {
        let missing = Path::new("/nonexistent/ca-bundle.crt");
        let other = fixture_path("other-ca.crt");
        let ca = fixture_path("ca.crt");
        let roots = first_bundle(&[missing, other.as_path(), ca.as_path()]).unwrap();
        assert_eq!(roots.len(), 1);
        // That bundle is other-ca, so the test server's certificate (signed by ca) is refused.
        let (port, _rx) = one_shot_server("server.crt", "server.key", false);
        let verifier = WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots),
            Arc::new(rustls::crypto::ring::default_provider()),
        )
        .build()
        .unwrap();
        let config =
            ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .unwrap()
                .dangerous()
                .with_custom_certificate_verifier(verifier)
                .with_no_client_auth();
        let err = get(Arc::new(config), "127.0.0.1", port).unwrap_err();
        assert!(err.contains("UnknownIssuer"), "{err}");
    }

    #[test]
    fn no_system_bundle_is_a_clear_error_naming_what_was_tried() {
        let err = first_bundle(&[
            Path::new("/nonexistent/a.crt"),
            Path::new("/nonexistent/b.pem"),
        ])
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("/nonexistent/a.crt, /nonexistent/b.pem"),
            "{err}"
        );
        assert!(err.contains("SSL_CERT_FILE"), "{err}");
    }

    #[test]
    fn a_system_bundle_without_certificates_is_an_error_not_skipped() {
        let dir = std::env::temp_dir().join(format!("tls-empty-bundle-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let empty = dir.join("ca.crt");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let ca = fixture_path("ca.crt");
        let err = first_bundle(&[empty.as_path(), ca.as_path()])
            .unwrap_err()
            .to_string();
        assert!(err.contains(&empty.display().to_string()), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn without_ca_the_system_roots_do_not_trust_a_private_ca() {
        if SYSTEM_BUNDLES.iter().all(|p| !Path::new(p).exists()) {
            // Covered by the tests above through first_bundle; nothing to load here.
            eprintln!("SKIPPED: this machine has no system CA bundle");
            return;
        }
        let (port, _rx) = one_shot_server("server.crt", "server.key", false);
        let config = client_config(None, false, None, None).unwrap();
        let err = get(config, "127.0.0.1", port).unwrap_err();
        assert!(err.contains("UnknownIssuer"), "{err}");
    }

    #[test]
    fn dns_only_certificate_fails_by_ip_without_tls_server_name() {
        let (port, _rx) = one_shot_server("server-dns-only.crt", "server-dns-only.key", false);
        let config = client_config(Some(&fixture("ca.crt")), false, None, None).unwrap();
        let err = get(config, "127.0.0.1", port).unwrap_err();
        assert!(err.contains("not valid for name"), "{err}");
    }

    #[test]
    fn tls_server_name_verifies_dns_only_certificate_reached_by_ip() {
        let (port, rx) = one_shot_server("server-dns-only.crt", "server-dns-only.key", false);
        let config = client_config(
            Some(&fixture("ca.crt")),
            false,
            Some("kubernetes.test"),
            None,
        )
        .unwrap();
        assert_eq!(get(config, "127.0.0.1", port).unwrap(), "ok");
        assert!(server_outcome(&rx).is_ok());
    }

    #[test]
    fn tls_server_name_that_the_certificate_lacks_is_rejected() {
        let (port, _rx) = one_shot_server("server.crt", "server.key", false);
        let config = client_config(
            Some(&fixture("ca.crt")),
            false,
            Some("kubernetes.test"),
            None,
        )
        .unwrap();
        let err = get(config, "127.0.0.1", port).unwrap_err();
        assert!(
            err.contains("not valid for name \"kubernetes.test\""),
            "{err}"
        );
    }

    #[test]
    fn insecure_accepts_a_server_from_an_unknown_ca() {
        let (port, rx) = one_shot_server("server-dns-only.crt", "server-dns-only.key", false);
        let config = client_config(None, true, None, None).unwrap();
        assert_eq!(get(config, "127.0.0.1", port).unwrap(), "ok");
        assert!(server_outcome(&rx).is_ok());
    }

    fn presents_client_certificate(cert: &str, key: &str) {
        let (port, rx) = one_shot_server("server.crt", "server.key", true);
        let config = client_config(
            Some(&fixture("ca.crt")),
            false,
            None,
            Some((fixture(cert), fixture(key))),
        )
        .unwrap();
        assert_eq!(get(config, "127.0.0.1", port).unwrap(), "ok");
        assert_eq!(server_outcome(&rx).unwrap(), Some(der_of(cert)));
    }

    #[test]
    fn presents_rsa_pkcs1_client_certificate() {
        presents_client_certificate("client-rsa.crt", "client-rsa.key");
    }

    #[test]
    fn presents_ec_sec1_client_certificate() {
        presents_client_certificate("client-ec.crt", "client-ec.key");
    }

    #[test]
    fn presents_pkcs8_client_certificate() {
        presents_client_certificate("client-pkcs8.crt", "client-pkcs8.key");
    }

    #[test]
    fn server_requiring_client_certificate_refuses_client_without_one() {
        let (port, rx) = one_shot_server("server.crt", "server.key", true);
        let config = client_config(Some(&fixture("ca.crt")), false, None, None).unwrap();
        assert!(get(config, "127.0.0.1", port).is_err());
        assert!(server_outcome(&rx).is_err());
    }

    #[test]
    fn ec_key_with_rsa_certificate_is_a_key_mismatch() {
        let err = client_config(
            Some(&fixture("ca.crt")),
            false,
            None,
            Some((fixture("client-rsa.crt"), fixture("client-ec.key"))),
        )
        .unwrap_err();
        assert!(matches!(err, TlsError::KeyMismatch), "{err}");
    }

    #[test]
    fn certificate_given_as_key_reports_missing_key_without_echoing_it() {
        let err = client_config(
            None,
            false,
            None,
            Some((fixture("client-rsa.crt"), fixture("client-rsa.crt"))),
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "bad client key: no private key found in PEM"
        );
    }

    #[test]
    fn ca_that_is_not_pem_is_rejected() {
        let err = client_config(Some(b"not a certificate"), false, None, None).unwrap_err();
        assert_eq!(
            err.to_string(),
            "bad certificate authority: no certificate found in PEM"
        );
    }

    #[test]
    fn invalid_tls_server_name_is_rejected() {
        let err =
            client_config(Some(&fixture("ca.crt")), false, Some("bad name!"), None).unwrap_err();
        assert!(matches!(err, TlsError::ServerName(_)), "{err}");
    }
}
