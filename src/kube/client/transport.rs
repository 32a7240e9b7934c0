//! The ureq agent every request goes through: ureq's TCP and CONNECT-proxy connectors, then TLS
//! with our rustls config (the server-certificate verifier of `kube::tls`, a client certificate
//! from the kubeconfig or an exec plugin), which ureq's own rustls connector cannot take; a
//! TLS connection's buffers, held only while a request needs them; and names resolved on the
//! calling thread.
//!
//! `ureq::unversioned` is outside ureq's semver promise: Cargo.toml pins ureq's minor version.

use std::fmt;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::kube::config::host_and_port;
use crate::util::lock;
use rustls::pki_types::ServerName;
use ureq::config::{Config, ConfigBuilder};
use ureq::http::Uri;
use ureq::typestate::AgentScope;
use ureq::unversioned::resolver::{ResolvedSocketAddrs, Resolver};
use ureq::unversioned::transport::{
    Buffers, ConnectProxyConnector, ConnectionDetails, Connector, Either, NextTimeout,
    TcpConnector, Transport, TransportAdapter,
};

/// The output buffer, which must hold a request's head (with its bearer token, 1 to 4 KiB), and
/// the buffers of a proxy's tunnel below TLS: 8 KiB, not ureq's 128 KiB, which would be 16 MiB
/// or more at our 32 connections or so (docs/benchmark.md, "ureq 3").
pub const BUFFER: usize = 8 * 1024;

/// How much room the input buffer gets for each read; an answer's head may span several (ureq
/// bounds it by its `max_response_header_size`).
const READ: usize = 4 * 1024;

/// How far past its deadline a read or write on our own socket may wait.
const DEADLINE_SLACK: Duration = Duration::from_millis(50);

/// How long a connection (TCP, and CONNECT through a proxy) may take to open.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The configuration of an agent that goes through `proxy` when given (and never through one
/// ureq would find in the environment: the caller decided), keeping up to `pool` idle
/// connections. Every status is an answer (`http_status_as_error(false)`), no redirect is
/// followed (one would strip our Authorization), and no timeout is set but the connect one:
/// each request sets its own (a caller may add one of its own).
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

/// An agent on `config` that speaks TLS with `tls`. Plain http (the test server) goes over
/// ureq's TCP connector, which [`Tls`] leaves to it.
pub fn agent_with(tls: Arc<rustls::ClientConfig>, config: Config) -> ureq::Agent {
    let connector =
        ().chain(ConnectProxyConnector::default())
            .chain(Tls(tls))
            .chain(TcpConnector::default());
    ureq::Agent::with_parts(config, connector, HereResolver)
}

/// Resolves a name on the calling thread. ureq's resolver, given a timeout, spawns a thread
/// for every lookup so as to give up on a slow one; ours are an IP address or a name the
/// system resolves in milliseconds, and the request's own timeout still bounds the rest.
#[derive(Debug)]
struct HereResolver;

impl Resolver for HereResolver {
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

/// Wraps an https connection in TLS with our config: a proxy's tunnel, opened by ureq's
/// CONNECT, or else a socket of ours that rustls reads and writes itself. (Over ureq's TCP
/// transport a second pair of buffers would hold TLS records only to hand them on, 16 KiB a
/// connection: docs/benchmark.md, "ureq 3".) The server name is the URL's host (an IP address
/// sends no SNI); `tls-server-name` is checked by the verifier in its place.
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
        if !details.needs_tls() || chained.as_ref().is_some_and(|t| t.is_tls()) {
            return Ok(chained.map(Either::A));
        }
        let sock: Box<dyn Lower> = match chained {
            Some(tunnel) => {
                let mut sock = TransportAdapter::new(tunnel.boxed(), details.current_time.clone());
                sock.set_timeout(details.timeout);
                Box::new(sock)
            }
            None => Box::new(Socket::connect(details)?),
        };
        Ok(Some(Either::B(handshake(&self.0, details, sock)?)))
    }
}

/// The TLS handshake over `sock`, for the request's host, on a thread of its own that ends
/// with it. Why: building a ClientHello and checking the server's certificate reach about 20
/// KiB deeper into a stack than any request does, and a thread keeps every stack page it has
/// touched for as long as it lives: the 40 workers a backlog grows would each hold them, 0.8
/// MiB in all, for one handshake each (docs/benchmark.md, "Handshakes off the workers"). A
/// thread costs tens of microseconds; a handshake, a round trip to the server.
fn handshake(
    tls: &Arc<rustls::ClientConfig>,
    details: &ConnectionDetails,
    sock: Box<dyn Lower>,
) -> Result<TlsTransport, ureq::Error> {
    let (host, _) = host_and_port(details.uri);
    let name = ServerName::try_from(host.to_string())
        .map_err(|_| ureq::Error::Tls("the server's host is no DNS name or IP address"))?;
    let (tls, host) = (tls.clone(), host.to_string());
    let shaker = std::thread::Builder::new()
        .name("tls-handshake".into())
        .spawn(move || shake(tls, name, &host, sock))
        .map_err(|e| {
            ureq::Error::Io(std::io::Error::new(
                e.kind(),
                format!("cannot start a thread for the TLS handshake: {e}"),
            ))
        })?;
    // A panic aborts the process (Cargo.toml), so a join error cannot be seen; said all the same.
    shaker.join().unwrap_or_else(|_| {
        Err(ureq::Error::Io(std::io::Error::other(
            "the TLS handshake's thread ended early",
        )))
    })
}

/// The handshake itself, with the server called `name` at `host`.
fn shake(
    tls: Arc<rustls::ClientConfig>,
    name: ServerName<'static>,
    host: &str,
    sock: Box<dyn Lower>,
) -> Result<TlsTransport, ureq::Error> {
    // A rustls error goes on inside an io::Error, where the client finds it (`tls_failure`).
    let conn = rustls::ClientConnection::new(tls, name)
        .map_err(|e| ureq::Error::Io(std::io::Error::other(e)))?;
    // Boxed: moved back up ureq's chain of connectors, the connection's state (over a
    // kilobyte) took stack in each of their frames.
    let mut stream = Box::new(rustls::StreamOwned::new(conn, sock));
    while stream.conn.is_handshaking() {
        stream.conn.complete_io(&mut stream.sock).map_err(|e| {
            // Said as the server's silence: through a proxy, ureq's own Timeout::Connect
            // would read as the proxy's.
            match ureq::Error::from(e) {
                e if super::timed_out(&e) => ureq::Error::Io(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no answer to the TLS handshake from {host}"),
                )),
                e => e,
            }
        })?;
    }
    let buffers = Lean::default();
    Ok(TlsTransport { buffers, stream })
}

/// What TLS runs over: a socket of ours, or ureq's transport (a proxy's tunnel).
trait Lower: Read + Write + Send + Sync + 'static {
    /// Every read and write from now on ends by `timeout`.
    fn set_timeout(&mut self, timeout: NextTimeout) -> Result<(), ureq::Error>;
    /// Whether a pooled connection can still be used.
    fn is_open(&mut self) -> bool;
}

impl Lower for TransportAdapter {
    fn set_timeout(&mut self, timeout: NextTimeout) -> Result<(), ureq::Error> {
        TransportAdapter::set_timeout(self, timeout);
        Ok(())
    }

    fn is_open(&mut self) -> bool {
        self.get_mut().is_open()
    }
}

/// A TCP socket whose every read and write ends by a deadline, as ureq's `TransportAdapter`
/// bounds a proxy's tunnel: rustls reads and writes many times for one handshake or record, so
/// a timeout per syscall would let a server that trickles bytes hold a request far past its
/// deadline.
struct Socket {
    tcp: TcpStream,
    /// When the current read or write must end (`None`: never), and why.
    deadline: Option<(Instant, ureq::Timeout)>,
    /// What the socket's read and write timeouts are set to.
    read: Option<Duration>,
    write: Option<Duration>,
}

impl Socket {
    /// A connection to the first of the request's addresses that takes one, its handshake to
    /// end within what is left of the connect timeout.
    fn connect(details: &ConnectionDetails) -> Result<Socket, ureq::Error> {
        let started = Instant::now();
        let connect = details.timeout.not_zero().map(|t| *t);
        let mut last = None;
        for addr in &details.addrs {
            let tcp = match connect {
                Some(t) => TcpStream::connect_timeout(addr, t),
                None => TcpStream::connect(addr),
            };
            match tcp {
                Ok(tcp) => {
                    tcp.set_nodelay(true)?;
                    let mut sock = Socket {
                        tcp,
                        deadline: None,
                        read: None,
                        write: None,
                    };
                    sock.set_timeout_from(details.timeout, started)?;
                    return Ok(sock);
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.map_or(ureq::Error::HostNotFound, ureq::Error::Io))
    }

    /// Every read and write from now on ends within `timeout` of `started`.
    fn set_timeout_from(
        &mut self,
        timeout: NextTimeout,
        started: Instant,
    ) -> Result<(), ureq::Error> {
        // Reads and writes alike: rustls may write while it reads, and the other way round.
        let timeout = timeout.for_read().for_write();
        if timeout.after.is_zero() {
            return Err(ureq::Error::Timeout(timeout.reason));
        }
        self.deadline = timeout.not_zero().map(|t| (started + *t, timeout.reason));
        Ok(())
    }

    /// What is left before the deadline, for the socket timeout `set` (read's or write's),
    /// which it updates; a deadline passed is a timeout.
    fn bound(
        tcp: &TcpStream,
        deadline: Option<(Instant, ureq::Timeout)>,
        set: &mut Option<Duration>,
        apply: fn(&TcpStream, Option<Duration>) -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        let left = match deadline {
            None => None,
            Some((at, reason)) => match at.checked_duration_since(Instant::now()) {
                Some(left) if !left.is_zero() => Some(left),
                _ => return Err(ureq::Error::Timeout(reason).into_io()),
            },
        };
        // A timeout a little longer than what is left stands: one syscall per request, not
        // one per read.
        let stands = match (left, *set) {
            (Some(left), Some(set)) => left <= set && set <= left + DEADLINE_SLACK,
            (left, set) => left == set,
        };
        if !stands {
            apply(tcp, left)?;
            *set = left;
        }
        Ok(())
    }
}

impl Read for Socket {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        Socket::bound(
            &self.tcp,
            self.deadline,
            &mut self.read,
            TcpStream::set_read_timeout,
        )?;
        self.tcp.read(buf)
    }
}

impl Write for Socket {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        Socket::bound(
            &self.tcp,
            self.deadline,
            &mut self.write,
            TcpStream::set_write_timeout,
        )?;
        self.tcp.write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.tcp.flush()
    }
}

impl Lower for Socket {
    fn set_timeout(&mut self, timeout: NextTimeout) -> Result<(), ureq::Error> {
        self.set_timeout_from(timeout, Instant::now())
    }

    /// As ureq's TCP transport asks: nothing waiting to be read, and not closed.
    fn is_open(&mut self) -> bool {
        let mut byte = [0];
        let open = self.tcp.set_nonblocking(true).is_ok()
            && matches!(self.tcp.read(&mut byte), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock);
        open && self.tcp.set_nonblocking(false).is_ok()
    }
}

/// ureq's buffers of one connection: an input of [`READ`] (ureq's own grows to 10 KiB for any
/// body sent), and an output held only from a request's writing to its sending. A connection
/// waiting for its answer, or pooled, holds 4 KiB where ureq's held 18 (docs/benchmark.md,
/// "ureq 3").
#[derive(Default)]
struct Lean {
    output: Vec<u8>,
    input: Vec<u8>,
    filled: usize,
    consumed: usize,
    /// Whether the last consume took anything (see [`Buffers::can_use_input`]).
    progress: bool,
}

impl Buffers for Lean {
    fn output(&mut self) -> &mut [u8] {
        if self.output.is_empty() {
            self.output = lock(&SPARE).pop().unwrap_or_else(|| vec![0; BUFFER]);
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
        if self.input.len() - self.filled < READ / 2 {
            self.input.resize(self.filled + READ, 0);
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
            // Grown for a long head: back to one read's room.
            if self.input.len() > READ {
                self.input = vec![0; READ];
            }
        }
    }

    /// Our bodies have a length, which ureq writes straight to the output: `tmp` is used only
    /// for a chunked one.
    fn tmp_and_output(&mut self) -> (&mut [u8], &mut [u8]) {
        self.output();
        self.input_append_buf();
        (&mut self.input[self.filled..], &mut self.output)
    }

    fn can_use_input(&self) -> bool {
        self.consumed < self.filled && self.progress
    }
}

/// Output buffers between requests, shared by every connection: few are being written at any
/// moment. Reused rather than handed back to the system allocator each time, which cost the
/// backlog of 1,000 objects a quarter more CPU.
static SPARE: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());
const SPARES: usize = 8;

pub struct TlsTransport {
    buffers: Lean,
    stream: Box<rustls::StreamOwned<rustls::ClientConnection, Box<dyn Lower>>>,
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
        self.stream.get_mut().set_timeout(timeout)?;
        let output = std::mem::take(&mut self.buffers.output);
        let sent = self.stream.write_all(&output[..amount]);
        // Only a whole buffer goes back: an empty one would be handed out as if it were.
        let mut spare = lock(&SPARE);
        if output.len() == BUFFER && spare.len() < SPARES {
            spare.push(output);
        }
        drop(spare);
        sent?;
        self.stream.flush()?;
        Ok(())
    }

    fn await_input(&mut self, timeout: NextTimeout) -> Result<bool, ureq::Error> {
        self.stream.get_mut().set_timeout(timeout)?;
        let input = self.buffers.input_append_buf();
        let amount = self.stream.read(input)?;
        self.buffers.input_appended(amount);
        Ok(amount > 0)
    }

    fn is_open(&mut self) -> bool {
        self.stream.get_mut().is_open()
    }

    fn is_tls(&self) -> bool {
        true
    }
}
