//! The ureq agent every request goes through, with TLS of our rustls config, which ureq's own
//! connector cannot take. `ureq::unversioned` is outside semver: Cargo.toml pins ureq's minor.

use std::fmt;
use std::io::{Read, Write};
use std::net::ToSocketAddrs;
use std::sync::Arc;
use std::time::Duration;

use crate::kube::config::host_and_port;
use rustls::pki_types::ServerName;
use ureq::config::{Config, ConfigBuilder};
use ureq::http::Uri;
use ureq::typestate::AgentScope;
use ureq::unversioned::resolver::{ResolvedSocketAddrs, Resolver};
use ureq::unversioned::transport::time;
use ureq::unversioned::transport::{
    Buffers, ConnectProxyConnector, ConnectionDetails, Connector, Either, NextTimeout,
    TcpConnector, Transport, TransportAdapter,
};

/// A connection's buffers: smaller than ureq's, as one is kept for each worker and watcher.
pub const BUFFER: usize = 8 * 1024;

/// How long a connection (TCP, and CONNECT through a proxy) may take to open.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// An agent's configuration: `proxy` only, `pool` idle connections, every status an answer, no
/// redirect (one would strip our Authorization), no timeout but connecting's.
pub fn config(proxy: Option<ureq::Proxy>, pool: usize) -> ConfigBuilder<AgentScope> {
    Config::builder()
        .http_status_as_error(false)
        .max_redirects(0)
        .proxy(proxy)
        .timeout_connect(Some(CONNECT_TIMEOUT))
        .max_idle_connections(pool)
        .max_idle_connections_per_host(pool)
        .input_buffer_size(BUFFER)
        .output_buffer_size(BUFFER)
}

/// An agent on `config` that speaks TLS with `tls`, in ureq's own order of connectors.
pub fn agent_with(tls: Arc<rustls::ClientConfig>, config: Config) -> ureq::Agent {
    let connector =
        ().chain(ConnectProxyConnector::default())
            .chain(TcpConnector::default())
            .chain(Tls(tls));
    ureq::Agent::with_parts(config, connector, SyncResolver)
}

/// Resolves a name on the calling thread, where ureq's spawns one per request with a timeout.
#[derive(Debug)]
struct SyncResolver;

impl Resolver for SyncResolver {
    fn resolve(
        &self,
        uri: &Uri,
        _config: &Config,
        _timeout: NextTimeout,
    ) -> Result<ResolvedSocketAddrs, ureq::Error> {
        uri.authority()
            .ok_or_else(|| ureq::Error::BadUri(uri.to_string()))?;
        let mut addrs = self.empty();
        for addr in host_and_port(uri).to_socket_addrs()?.take(16) {
            addrs.push(addr);
        }
        if addrs.is_empty() {
            return Err(ureq::Error::HostNotFound);
        }
        Ok(addrs)
    }
}

/// Wraps an https connection, a socket or a proxy's tunnel, in TLS with our config. The SNI is
/// the URL's host; `tls-server-name` is checked by the verifier in its place.
struct Tls(Arc<rustls::ClientConfig>);

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Tls")
    }
}

impl<In: Transport> Connector<In> for Tls {
    type Out = Either<In, TlsTransport>;

    fn connect(
        &self,
        details: &ConnectionDetails,
        chained: Option<In>,
    ) -> Result<Option<Self::Out>, ureq::Error> {
        let Some(lower) = chained else {
            return Ok(None);
        };
        if !details.needs_tls() || lower.is_tls() {
            return Ok(Some(Either::A(lower)));
        }
        let (host, _) = host_and_port(details.uri);
        let name = ServerName::try_from(host.to_string())
            .map_err(|_| ureq::Error::Tls("the server's host is no DNS name or IP address"))?;
        let conn = rustls::ClientConnection::new(self.0.clone(), name)
            .map_err(|e| ureq::Error::Io(std::io::Error::other(e)))?;
        // A deadline for the whole handshake, which takes rustls many reads.
        let mut sock = TransportAdapter::new(lower.boxed(), details.current_time.clone());
        sock.set_timeout(left(details));
        let mut stream = rustls::StreamOwned::new(conn, sock);
        while stream.conn.is_handshaking() {
            stream.conn.complete_io(&mut stream.sock).map_err(|e| {
                // The server's silence, not a Timeout::Connect, which would read as a proxy's.
                match ureq::Error::from(e) {
                    e if super::timed_out(&e) => ureq::Error::Io(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("no answer to the TLS handshake from {host}"),
                    )),
                    e => e,
                }
            })?;
        }
        let buffers = TlsBuffers::default();
        Ok(Some(Either::B(TlsTransport { buffers, stream })))
    }
}

/// The connect timeout less what connecting took so far, as ureq's own rustls connector counts.
fn left(details: &ConnectionDetails) -> NextTimeout {
    let mut timeout = details.timeout;
    if let (time::Duration::Exact(after), time::Instant::Exact(then), time::Instant::Exact(now)) =
        (timeout.after, details.now, (details.current_time)())
    {
        let spent = now.saturating_duration_since(then);
        timeout.after = time::Duration::Exact(after.saturating_sub(spent));
    }
    timeout
}

/// The buffers of a TLS connection, as ureq's `LazyBuffers` but with an input that grows while an
/// answer's head is longer (admission webhooks' Warnings), where `LazyBuffers` fails the request.
#[derive(Default)]
struct TlsBuffers {
    output: Vec<u8>,
    input: Vec<u8>,
    filled: usize,
    consumed: usize,
    /// Whether the last consume took anything (see [`Buffers::can_use_input`]).
    progress: bool,
}

impl Buffers for TlsBuffers {
    fn output(&mut self) -> &mut [u8] {
        if self.output.is_empty() {
            self.output = vec![0; BUFFER];
        }
        &mut self.output
    }

    fn input(&self) -> &[u8] {
        &self.input[self.consumed..self.filled]
    }

    fn input_append_buf(&mut self) -> &mut [u8] {
        if self.consumed > 0 {
            self.input.copy_within(self.consumed..self.filled, 0);
            self.filled -= self.consumed;
            self.consumed = 0;
        }
        if self.input.len() - self.filled < BUFFER / 2 {
            self.input.resize(self.filled + BUFFER, 0);
        }
        &mut self.input[self.filled..]
    }

    fn input_appended(&mut self, amount: usize) {
        self.filled += amount;
    }

    fn input_consume(&mut self, amount: usize) {
        self.progress = amount > 0;
        self.consumed += amount;
        if self.consumed == self.filled {
            (self.consumed, self.filled) = (0, 0);
            // Grown for a long head: back to one buffer.
            self.input.truncate(BUFFER);
            self.input.shrink_to(BUFFER);
        }
    }

    /// `tmp` is used only for a chunked body, which ours never are.
    fn tmp_and_output(&mut self) -> (&mut [u8], &mut [u8]) {
        self.output();
        self.input_append_buf();
        (&mut self.input[self.filled..], &mut self.output)
    }

    fn can_use_input(&self) -> bool {
        self.consumed < self.filled && self.progress
    }
}

pub struct TlsTransport {
    buffers: TlsBuffers,
    stream: rustls::StreamOwned<rustls::ClientConnection, TransportAdapter>,
}

impl fmt::Debug for TlsTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsTransport").finish_non_exhaustive()
    }
}

impl Transport for TlsTransport {
    fn buffers(&mut self) -> &mut dyn Buffers {
        &mut self.buffers
    }

    fn transmit_output(&mut self, amount: usize, timeout: NextTimeout) -> Result<(), ureq::Error> {
        self.stream.get_mut().set_timeout(timeout);
        let output = &self.buffers.output()[..amount];
        self.stream.write_all(output)?;
        self.stream.flush()?;
        Ok(())
    }

    fn await_input(&mut self, timeout: NextTimeout) -> Result<bool, ureq::Error> {
        self.stream.get_mut().set_timeout(timeout);
        let input = self.buffers.input_append_buf();
        let amount = self.stream.read(input)?;
        self.buffers.input_appended(amount);
        Ok(amount > 0)
    }

    fn is_open(&mut self) -> bool {
        self.stream.get_mut().get_mut().is_open()
    }

    fn is_tls(&self) -> bool {
        true
    }
}
