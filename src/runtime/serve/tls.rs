//! The metrics endpoint's TLS: the certificate mounted at `--metrics-cert-path`, or else a
//! self-signed one made at start, as controller-runtime's metrics server does.
//!
//! The self-signed certificate is an ECDSA P-256 key and a minimal X.509 v3 certificate (subject
//! `CN=immortal-operator`, SAN `localhost` and `127.0.0.1`) encoded here in DER over `ring`,
//! which rustls already links. This costs 8 KiB of the static release binary where rcgen (the
//! test server's choice) cost 56 KiB: rcgen brings its own DER writer, `time` and a general
//! certificate model for what is one fixed certificate here. Prometheus scrapes it with
//! `insecureSkipVerify`, as kubebuilder's default ServiceMonitor does; a verified setup mounts
//! a certificate instead (cert-manager).

use ring::rand::SystemRandom;
use ring::signature::{EcdsaKeyPair, KeyPair, ECDSA_P256_SHA256_ASN1_SIGNING};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::ServerConfig;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// File names inside `--metrics-cert-path`: those of a `kubernetes.io/tls` Secret, which is
/// what cert-manager writes and kubebuilder mounts.
pub const CERT_FILE: &str = "tls.crt";
pub const KEY_FILE: &str = "tls.key";

/// How long the self-signed certificate is valid: a year, as client-go's self-signed
/// certificates; it is made anew at every start. It starts an hour in the past so a client
/// whose clock is a little behind does not see it as not yet valid.
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
    /// The system's random source failed while making the self-signed key.
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

/// The server configuration for the metrics endpoint: the pair in `cert_dir` when given,
/// otherwise a fresh self-signed one.
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

/// A server configuration presenting `chain` with `key`.
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
    // No session resumption: a scrape every 15 s or more saves nothing by it, and rustls' default
    // cache holds up to 256 sessions (about 30 KiB allocated up front, more as clients come).
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

/// A new P-256 key and a certificate for it signed by itself, valid from `now` - 1 h for a
/// year.
pub fn self_signed(
    now: SystemTime,
) -> Result<(CertificateDer<'static>, PrivateKeyDer<'static>), Error> {
    let rng = SystemRandom::new();
    let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &rng)
        .map_err(|_| Error::Generate)?;
    let key = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, pkcs8.as_ref(), &rng)
        .map_err(|_| Error::Generate)?;
    let mut serial = [0u8; 16];
    ring::rand::SecureRandom::fill(&rng, &mut serial).map_err(|_| Error::Generate)?;
    let tbs = tbs_certificate(
        &serial,
        now - BACKDATE,
        now + VALIDITY,
        key.public_key().as_ref(),
    );
    let signature = key.sign(&rng, &tbs).map_err(|_| Error::Generate)?;
    let cert = der::seq(&[
        &tbs,
        &ecdsa_with_sha256(),
        &der::bit_string(signature.as_ref()),
    ]);
    Ok((
        CertificateDer::from(cert),
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(pkcs8.as_ref().to_vec())),
    ))
}

/// Object identifiers, DER content octets.
mod oid {
    /// ecdsa-with-SHA256, 1.2.840.10045.4.3.2 (RFC 5758).
    pub const ECDSA_WITH_SHA256: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x02];
    /// id-ecPublicKey, 1.2.840.10045.2.1 (RFC 5480).
    pub const EC_PUBLIC_KEY: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01];
    /// secp256r1 / prime256v1, 1.2.840.10045.3.1.7 (RFC 5480).
    pub const P256: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07];
    /// id-at-commonName, 2.5.4.3.
    pub const COMMON_NAME: &[u8] = &[0x55, 0x04, 0x03];
    /// id-ce-subjectAltName, 2.5.29.17.
    pub const SUBJECT_ALT_NAME: &[u8] = &[0x55, 0x1d, 0x11];
}

/// AlgorithmIdentifier of ecdsa-with-SHA256: parameters absent (RFC 5758 3.2).
fn ecdsa_with_sha256() -> Vec<u8> {
    der::seq(&[&der::oid(oid::ECDSA_WITH_SHA256)])
}

/// The TBSCertificate of RFC 5280 4.1, issuer = subject.
fn tbs_certificate(
    serial: &[u8; 16],
    not_before: SystemTime,
    not_after: SystemTime,
    public_point: &[u8],
) -> Vec<u8> {
    // A positive serial of at most 20 octets whose first octet needs no leading zero.
    let mut serial = *serial;
    serial[0] = (serial[0] & 0x7f) | 0x40;
    let name = der::seq(&[&der::set(&[&der::seq(&[
        &der::oid(oid::COMMON_NAME),
        &der::utf8_string("immortal-operator"),
    ])])]);
    let spki = der::seq(&[
        &der::seq(&[&der::oid(oid::EC_PUBLIC_KEY), &der::oid(oid::P256)]),
        &der::bit_string(public_point),
    ]);
    // GeneralNames: dNSName [2] "localhost", iPAddress [7] 127.0.0.1 (both IMPLICIT).
    let alt_names = der::seq(&[
        &der::tlv(0x82, b"localhost"),
        &der::tlv(0x87, &[127, 0, 0, 1]),
    ]);
    let extensions = der::seq(&[&der::seq(&[
        &der::oid(oid::SUBJECT_ALT_NAME),
        &der::tlv(der::OCTET_STRING, &alt_names),
    ])]);
    der::seq(&[
        // version [0] EXPLICIT v3 (2): extensions need it.
        &der::tlv(0xa0, &der::tlv(der::INTEGER, &[2])),
        &der::tlv(der::INTEGER, &serial),
        &ecdsa_with_sha256(),
        &name,
        &der::seq(&[&der::time(not_before), &der::time(not_after)]),
        &name,
        &spki,
        // extensions [3] EXPLICIT.
        &der::tlv(0xa3, &extensions),
    ])
}

/// The handful of DER encodings a certificate needs (X.690).
mod der {
    use std::time::SystemTime;

    pub const INTEGER: u8 = 0x02;
    const BIT_STRING: u8 = 0x03;
    pub const OCTET_STRING: u8 = 0x04;
    const OID: u8 = 0x06;
    const UTF8_STRING: u8 = 0x0c;
    const UTC_TIME: u8 = 0x17;
    const GENERALIZED_TIME: u8 = 0x18;
    const SEQUENCE: u8 = 0x30;
    const SET: u8 = 0x31;

    /// Tag, definite length (short form below 128, else long form), content.
    pub fn tlv(tag: u8, content: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(content.len() + 4);
        out.push(tag);
        let len = content.len();
        if len < 0x80 {
            out.push(len as u8);
        } else {
            let bytes = len.to_be_bytes();
            let skip = bytes.iter().take_while(|b| **b == 0).count();
            out.push(0x80 | (bytes.len() - skip) as u8);
            out.extend_from_slice(&bytes[skip..]);
        }
        out.extend_from_slice(content);
        out
    }

    pub fn seq(parts: &[&[u8]]) -> Vec<u8> {
        tlv(SEQUENCE, &parts.concat())
    }

    /// A SET of one element or of elements already in DER order.
    pub fn set(parts: &[&[u8]]) -> Vec<u8> {
        tlv(SET, &parts.concat())
    }

    pub fn oid(content: &[u8]) -> Vec<u8> {
        tlv(OID, content)
    }

    pub fn utf8_string(s: &str) -> Vec<u8> {
        tlv(UTF8_STRING, s.as_bytes())
    }

    /// A BIT STRING of whole octets (no unused bits).
    pub fn bit_string(bytes: &[u8]) -> Vec<u8> {
        tlv(BIT_STRING, &[&[0u8][..], bytes].concat())
    }

    /// RFC 5280 4.1.2.5: UTCTime (YYMMDDHHMMSSZ) through 2049, GeneralizedTime from 2050.
    pub fn time(t: SystemTime) -> Vec<u8> {
        // "2026-11-22T12:58:43Z" -> "20261122125843"
        let digits: String = crate::util::rfc3339(t)
            .chars()
            .filter(char::is_ascii_digit)
            .collect();
        if digits.as_str() < "2050" {
            tlv(UTC_TIME, format!("{}Z", &digits[2..]).as_bytes())
        } else {
            tlv(GENERALIZED_TIME, format!("{digits}Z").as_bytes())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpListener;

    #[test]
    fn der_lengths_use_the_long_form_from_128_octets() {
        assert_eq!(der::tlv(0x04, &[7; 3]), [&[0x04, 3][..], &[7; 3]].concat());
        let long = der::tlv(0x04, &[0; 200]);
        assert_eq!(&long[..3], &[0x04, 0x81, 200]);
        let longer = der::tlv(0x04, &[0; 300]);
        assert_eq!(&longer[..4], &[0x04, 0x82, 0x01, 0x2c]);
    }

    #[test]
    fn times_switch_from_utctime_to_generalizedtime_in_2050() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_795_352_323); // 2026-11-22T12:58:43Z
        assert_eq!(der::time(t), der::tlv(0x17, b"261122125843Z"));
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(2_556_143_999); // 2050-12-31T23:59:59Z
        assert_eq!(der::time(t), der::tlv(0x18, b"20501231235959Z"));
    }

    /// Serves one TLS handshake with `config` and answers "ok".
    /// `cert` as PEM, for a client that trusts exactly it.
    fn pem_of(cert: &CertificateDer<'_>) -> String {
        format!(
            "-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n",
            crate::kube::config::base64_encode(cert.as_ref())
        )
    }

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
