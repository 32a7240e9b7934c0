//! An https server through an HTTP proxy, with our own CONNECT so that tunnels are pooled
//! (ureq 2's proxy support never reuses one: see "The API client" in docs/design.md). ureq is
//! told nothing of the proxy: every host resolves to the proxy's address, and the TLS connector
//! asks the proxy to CONNECT to the server before the handshake.

use crate::kube::config::Proxy;
use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;

/// Longest CONNECT answer head read: a proxy's is a line or two.
const MAX_HEAD: usize = 8 * 1024;

/// `builder` connecting to `server` (`https://host:port[/prefix]`) through `proxy`.
pub(super) fn through(
    builder: ureq::AgentBuilder,
    tls: Arc<rustls::ClientConfig>,
    proxy: &Proxy,
    server: &str,
) -> ureq::AgentBuilder {
    let address = proxy.address.clone();
    let resolve =
        move |_: &str| -> io::Result<Vec<SocketAddr>> { Ok(address.to_socket_addrs()?.collect()) };
    let connector = Tunnel {
        tls,
        target: target(server),
        authorization: proxy.authorization.clone(),
        shown: proxy.shown.clone(),
    };
    builder.resolver(resolve).tls_connector(Arc::new(connector))
}

/// `host:port` of an https URL, as CONNECT names it (an IPv6 host keeps its brackets).
fn target(server: &str) -> String {
    let authority = server
        .trim_start_matches("https://")
        .split('/')
        .next()
        .unwrap_or_default();
    match authority.rsplit_once(':') {
        Some((_, port)) if !port.ends_with(']') => authority.to_string(),
        _ => format!("{authority}:443"),
    }
}

struct Tunnel {
    tls: Arc<rustls::ClientConfig>,
    target: String,
    /// Never logged: it holds the proxy's credentials.
    authorization: Option<String>,
    shown: String,
}

impl ureq::TlsConnector for Tunnel {
    fn connect(
        &self,
        dns_name: &str,
        mut io: Box<dyn ureq::ReadWrite>,
    ) -> Result<Box<dyn ureq::ReadWrite>, ureq::Error> {
        self.open(&mut io).map_err(ureq::Error::from)?;
        ureq::TlsConnector::connect(&self.tls, dns_name, io)
    }
}

impl Tunnel {
    /// Asks the proxy for a tunnel to the server on `io` (its timeouts bound the wait).
    fn open(&self, io: &mut dyn ureq::ReadWrite) -> io::Result<()> {
        let target = &self.target;
        let mut head = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n");
        if let Some(auth) = &self.authorization {
            head.push_str(&format!("Proxy-Authorization: {auth}\r\n"));
        }
        head.push_str("\r\n");
        io.write_all(head.as_bytes())?;
        io.flush()?;
        // Byte by byte up to the blank line: what follows it is the server's.
        let mut answer = Vec::new();
        let mut byte = [0u8; 1];
        while !answer.ends_with(b"\r\n\r\n") {
            if answer.len() >= MAX_HEAD || io.read(&mut byte)? == 0 {
                return Err(io::Error::other(format!(
                    "proxy {} closed the connection before answering CONNECT",
                    self.shown
                )));
            }
            answer.push(byte[0]);
        }
        let status = String::from_utf8_lossy(&answer);
        let status = status.lines().next().unwrap_or_default();
        match status.split(' ').nth(1) {
            Some(code) if code.starts_with('2') => Ok(()),
            _ => Err(io::Error::other(format!(
                "proxy {} refused CONNECT {target}: {status}",
                self.shown
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};

    /// A proxy that reads one request head and answers `answer`; returns its address and the
    /// head it read.
    fn proxy_answering(answer: &'static str) -> (SocketAddr, std::thread::JoinHandle<String>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let read = std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && conn.read(&mut byte).unwrap() == 1 {
                head.push(byte[0]);
            }
            conn.write_all(answer.as_bytes()).unwrap();
            String::from_utf8(head).unwrap()
        });
        (addr, read)
    }

    fn tunnel(authorization: Option<&str>) -> Tunnel {
        Tunnel {
            tls: crate::kube::tls::client_config(None, true, None, None).unwrap(),
            target: "api.corp:6443".into(),
            authorization: authorization.map(String::from),
            shown: "http://proxy:3128".into(),
        }
    }

    #[test]
    fn connect_names_the_server_and_sends_the_credentials_to_the_proxy_only() {
        let (addr, head) = proxy_answering("HTTP/1.1 200 Connection established\r\n\r\n");
        let mut conn = TcpStream::connect(addr).unwrap();
        tunnel(Some("Basic dTpw")).open(&mut conn).unwrap();
        let head = head.join().unwrap();
        assert!(
            head.starts_with("CONNECT api.corp:6443 HTTP/1.1\r\n"),
            "{head}"
        );
        assert!(
            head.contains("\r\nProxy-Authorization: Basic dTpw\r\n"),
            "{head}"
        );
    }

    #[test]
    fn a_refused_connect_says_what_the_proxy_answered_without_the_credentials() {
        let (addr, _) = proxy_answering("HTTP/1.1 407 Proxy Authentication Required\r\n\r\n");
        let mut conn = TcpStream::connect(addr).unwrap();
        let e = tunnel(Some("Basic c2VjcmV0"))
            .open(&mut conn)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("proxy http://proxy:3128 refused CONNECT api.corp:6443: HTTP/1.1 407"),
            "{e}"
        );
        assert!(!e.contains("c2VjcmV0"), "{e}");
    }

    #[test]
    fn the_connect_target_is_the_servers_host_and_port() {
        assert_eq!(target("https://api.corp:6443/prefix"), "api.corp:6443");
        assert_eq!(target("https://api.corp"), "api.corp:443");
        assert_eq!(target("https://[fd00::1]:6443"), "[fd00::1]:6443");
        assert_eq!(target("https://[fd00::1]"), "[fd00::1]:443");
    }
}
