//! The metrics endpoint's TLS: the certificate mounted at `--metrics-cert-path`, or else a
//! self-signed one made at start, as controller-runtime's metrics server does.

use rcgen::{CertificateParams, DnType, KeyPair, PKCS_ECDSA_P256_SHA256};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::ServerConfig;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// File names inside `--metrics-cert-path`: those of a `kubernetes.io/tls` Secret.
pub const CERT_FILE: &str = "tls.crt";
pub const KEY_FILE: &str = "tls.key";

/// The self-signed certificate's validity (client-go's), backdated for clients whose clock lags.
const VALIDITY: Duration = Duration::from_secs(365 * 24 * 3600);
const BACKDATE: Duration = Duration::from_secs(3600);

/// Why no TLS configuration could be built. Never retried: it ends the program at start.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// A file of the mounted certificate cannot be read.
    Read(PathBuf, std::io::Error),
    /// The mounted certificate or key is not usable PEM (the message never quotes the input).
    Pem(PathBuf, &'static str),
    /// rustls refused the pair: a key that is not the certificate's, or of an unsupported type.
    Rejected(String),
    /// rcgen could not make the self-signed key or certificate (no system random source).
    Generate,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Read(p, e) => write!(f, "cannot read {}: {e}", p.display()),
            Error::Pem(p, what) => write!(f, "{}: {what}", p.display()),
            Error::Rejected(why) => write!(f, "metrics certificate rejected: {why}"),
            Error::Generate => f.write_str("cannot generate the self-signed metrics certificate"),
        }
    }
}

impl std::error::Error for Error {}

/// The metrics endpoint's server configuration: the pair in `cert_dir`, or a new self-signed one.
pub fn config(cert_dir: Option<&Path>) -> Result<Arc<ServerConfig>, Error> {
    let (chain, key) = match cert_dir {
        Some(dir) => mounted(dir)?,
        None => {
            let (cert, key) = self_signed(SystemTime::now())?;
            (vec![cert], key)
        }
    };
    server_config(chain, key)
}

fn server_config(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<Arc<ServerConfig>, Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Rejected(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| Error::Rejected(e.to_string()))?;
    // No session resumption: scrapes are too rare to gain by it, and its cache costs memory.
    config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
    config.send_tls13_tickets = 0;
    Ok(Arc::new(config))
}

/// The certificate chain and key in `dir` (`tls.crt`, `tls.key`, PEM).
fn mounted(dir: &Path) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), Error> {
    let (cert_path, key_path) = (dir.join(CERT_FILE), dir.join(KEY_FILE));
    let cert_pem = std::fs::read(&cert_path).map_err(|e| Error::Read(cert_path.clone(), e))?;
    let key_pem = std::fs::read(&key_path).map_err(|e| Error::Read(key_path.clone(), e))?;
    let chain = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| Error::Pem(cert_path.clone(), "invalid PEM"))?;
    if chain.is_empty() {
        return Err(Error::Pem(cert_path, "no certificate found in PEM"));
    }
    // The error's own text may quote lines of the input, which is key material here.
    let key = PrivateKeyDer::from_pem_slice(&key_pem)
        .map_err(|_| Error::Pem(key_path, "no usable private key found in PEM"))?;
    Ok((chain, key))
}

/// A new ECDSA P-256 key and a certificate for it signed by itself, valid from a little before
/// `now`, subject `CN=immortal-operator`, SAN `localhost` and `127.0.0.1`.
pub fn self_signed(
    now: SystemTime,
) -> Result<(CertificateDer<'static>, PrivateKeyDer<'static>), Error> {
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).map_err(|_| Error::Generate)?;
    let mut params = CertificateParams::new(vec!["localhost".into(), "127.0.0.1".into()])
        .map_err(|_| Error::Generate)?;
    params
        .distinguished_name
        .push(DnType::CommonName, "immortal-operator");
    params.not_before = (now - BACKDATE).into();
    params.not_after = (now + VALIDITY).into();
    let cert = params.self_signed(&key).map_err(|_| Error::Generate)?;
    Ok((
        cert.der().clone(),
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpListener;

    /// `cert` as PEM, for a client that trusts exactly it.
    fn pem_of(cert: &CertificateDer<'_>) -> String {
        format!(
            "-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n",
            crate::kube::config::base64_encode(cert.as_ref())
        )
    }

    /// Serves one TLS handshake with `config` and answers "ok".
    fn serve_once(config: Arc<ServerConfig>) -> u16 {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            let (tcp, _) = listener.accept().unwrap();
            tcp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut tls =
                rustls::StreamOwned::new(rustls::ServerConnection::new(config).unwrap(), tcp);
            let mut buf = [0u8; 1024];
            let _ = tls.read(&mut buf);
            let _ = tls
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok");
            tls.conn.send_close_notify();
            let _ = tls.flush();
        });
        port
    }

    /// The strongest check of the DER at hand: a client that trusts only this certificate
    /// verifies it (structure, signature, validity period, subject alternative names) the way
    /// webpki verifies any server.
    #[test]
    fn a_client_trusting_the_self_signed_certificate_verifies_it_for_localhost_and_127_0_0_1() {
        let (cert, key) = self_signed(SystemTime::now()).unwrap();
        let pem = pem_of(&cert);
        let config = server_config(vec![cert], key).unwrap();
        let client =
            crate::kube::tls::client_config(Some(pem.as_bytes()), false, None, None).unwrap();
        for host in ["localhost", "127.0.0.1"] {
            let port = serve_once(config.clone());
            assert_eq!(
                crate::kube::tls::tests::get(client.clone(), host, port).unwrap(),
                "ok"
            );
        }
        // And only for those names.
        let port = serve_once(config.clone());
        let client = crate::kube::tls::client_config(
            Some(pem.as_bytes()),
            false,
            Some("metrics.example"),
            None,
        )
        .unwrap();
        let err = crate::kube::tls::tests::get(client, "localhost", port).unwrap_err();
        assert!(err.contains("not valid for name"), "{err}");
    }

    #[test]
    fn the_self_signed_certificate_is_p256_and_names_the_operator() {
        let (cert, key) = self_signed(SystemTime::now()).unwrap();
        let der = cert.as_ref();
        assert!(der.windows(17).any(|w| w == b"immortal-operator"));
        // id-ecPublicKey with the prime256v1 curve, as before rcgen made it.
        let p256 = [0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07];
        assert!(der.windows(p256.len()).any(|w| w == p256));
        assert!(matches!(key, PrivateKeyDer::Pkcs8(_)));
    }

    #[test]
    fn a_certificate_made_long_ago_is_refused_as_expired() {
        let long_ago = SystemTime::now() - VALIDITY - Duration::from_secs(7 * 24 * 3600);
        let (cert, key) = self_signed(long_ago).unwrap();
        let pem = pem_of(&cert);
        let config = server_config(vec![cert], key).unwrap();
        let client =
            crate::kube::tls::client_config(Some(pem.as_bytes()), false, None, None).unwrap();
        let port = serve_once(config);
        let err = crate::kube::tls::tests::get(client, "localhost", port).unwrap_err();
        assert!(err.to_lowercase().contains("expired"), "{err}");
    }

    #[test]
    fn a_mounted_certificate_is_served_and_a_mismatched_key_refused() {
        let dir = std::env::temp_dir().join(format!("metrics-cert-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fixture = crate::kube::tls::tests::fixture;
        std::fs::write(dir.join(CERT_FILE), fixture("server.crt")).unwrap();
        std::fs::write(dir.join(KEY_FILE), fixture("server.key")).unwrap();
        let config = config(Some(&dir)).unwrap();
        let client =
            crate::kube::tls::client_config(Some(&fixture("ca.crt")), false, None, None).unwrap();
        let port = serve_once(config);
        assert_eq!(
            crate::kube::tls::tests::get(client, "127.0.0.1", port).unwrap(),
            "ok"
        );

        std::fs::write(dir.join(KEY_FILE), fixture("client-ec.key")).unwrap();
        let err = super::config(Some(&dir)).unwrap_err();
        assert!(matches!(err, Error::Rejected(_)), "{err}");
        std::fs::write(dir.join(KEY_FILE), fixture("server.crt")).unwrap();
        let err = super::config(Some(&dir)).unwrap_err().to_string();
        assert!(
            err.ends_with("tls.key: no usable private key found in PEM"),
            "{err}"
        );
        std::fs::remove_file(dir.join(CERT_FILE)).unwrap();
        let err = super::config(Some(&dir)).unwrap_err().to_string();
        assert!(
            err.starts_with("cannot read") && err.contains("tls.crt"),
            "{err}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
