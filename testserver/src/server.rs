//! Listening and connections: an accept thread, a thread per TLS connection serving
//! keep-alive HTTP/1.1 requests (the state all of them share is in `shared.rs`).

use crate::api;
use crate::http::{Conn, HttpError};
use crate::reply::{Reply, Start};
use crate::shared::{lock, Shared, Tracked};
use crate::status::ApiError;
use crate::watch::{self, Ended};
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

/// The socket under TLS. Once its connection is black-holed it reads and writes nothing more,
/// TLS records and alerts included, as a proxy that stops forwarding without closing: every
/// call fails at once and no system call reaches the socket.
struct Gated {
    tcp: TcpStream,
    silent: Arc<AtomicBool>,
}

impl Gated {
    fn check(&self) -> io::Result<()> {
        if self.silent.load(Ordering::SeqCst) {
            Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "connection black-holed",
            ))
        } else {
            Ok(())
        }
    }
}

impl Read for Gated {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.check()?;
        self.tcp.read(buf)
    }
}

impl Write for Gated {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.check()?;
        self.tcp.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.check()?;
        self.tcp.flush()
    }
}

/// A running accept loop.
pub struct Listener {
    stop: Arc<AtomicBool>,
    addr: SocketAddr,
    thread: Option<JoinHandle<()>>,
}

impl Listener {
    /// Binds `127.0.0.1:port` (0 = any free port). std sets SO_REUSEADDR, so the same port
    /// can be bound again right after `stop`.
    pub fn bind(port: u16) -> io::Result<(TcpListener, u16)> {
        let l = TcpListener::bind(("127.0.0.1", port))?;
        let port = l.local_addr()?.port();
        Ok((l, port))
    }

    /// Starts accepting on `listener`.
    pub fn start(shared: Arc<Shared>, listener: TcpListener) -> io::Result<Listener> {
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = thread::Builder::new()
            .name("kube-testserver-accept".into())
            .spawn(move || accept_loop(shared, listener, flag))?;
        Ok(Listener {
            stop,
            addr,
            thread: Some(thread),
        })
    }

    /// Stops accepting and closes the listening socket (joins the accept thread).
    pub fn stop(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // accept() does not return when another thread closes the socket; a connection
        // does wake it, and it then sees the flag.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn accept_loop(shared: Arc<Shared>, listener: TcpListener, stop: Arc<AtomicBool>) {
    for incoming in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            break;
        }
        let tcp = match incoming {
            Ok(t) => t,
            Err(e) => {
                log::debug!("accept failed: {e}");
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let id = shared.next_conn.fetch_add(1, Ordering::Relaxed);
        let silent = Arc::new(AtomicBool::new(false));
        match tcp.try_clone() {
            Ok(c) => {
                let tracked = Tracked {
                    tcp: c,
                    user: None,
                    silent: silent.clone(),
                    watch: None,
                };
                lock(&shared.conns).insert(id, tracked);
            }
            Err(e) => {
                log::debug!("cannot track connection: {e}");
                continue;
            }
        }
        let s = shared.clone();
        let spawned = thread::Builder::new()
            .name(format!("kube-testserver-conn-{id}"))
            .spawn(move || {
                let gated = Gated {
                    tcp,
                    silent: silent.clone(),
                };
                serve_connection(&s, id, gated);
                // A black-holed connection stays open (its tracked handle is kept) until the
                // server closes every connection.
                if !silent.load(Ordering::SeqCst) {
                    lock(&s.conns).remove(&id);
                }
            });
        if let Err(e) = spawned {
            log::debug!("cannot spawn connection thread: {e}");
            if let Some(t) = lock(&shared.conns).remove(&id) {
                let _ = t.tcp.shutdown(Shutdown::Both);
            }
        }
    }
}

/// Lowers the CPU priority of the calling thread to niceness `nice` (Linux: `renice` on its
/// thread id; std has no call for it). Best effort: a failure is logged and the thread goes on.
fn lower_priority(nice: u8) {
    let tid = std::fs::read_link("/proc/thread-self")
        .ok()
        .and_then(|p| p.file_name().map(|t| t.to_string_lossy().into_owned()));
    let Some(tid) = tid else {
        log::debug!("cannot renice: no /proc/thread-self");
        return;
    };
    let done = std::process::Command::new("renice")
        .args(["-n", &nice.to_string(), "-p", &tid])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status();
    if !done.is_ok_and(|s| s.success()) {
        log::debug!(tid = tid.as_str(); "cannot renice the connection thread");
    }
}

/// Serves requests on one connection until the client closes it, a watch is dropped, an
/// error makes the stream unusable, or the connection is black-holed.
fn serve_connection(shared: &Shared, id: u64, tcp: Gated) {
    let tls = match rustls::ServerConnection::new(shared.tls.clone()) {
        Ok(t) => t,
        Err(e) => {
            log::debug!("tls setup failed: {e}");
            return;
        }
    };
    let mut conn = Conn::new(rustls::StreamOwned::new(tls, tcp));
    let mut reniced = false;
    loop {
        let req = match conn.read_request() {
            Ok(Some(r)) => r,
            Ok(None) => return,
            Err(HttpError::Io(e)) => {
                log::debug!("connection error: {e}");
                return;
            }
            Err(HttpError::Malformed(why)) => {
                log::debug!("malformed request: {why}");
                let body = ApiError::BadRequest(why.to_string()).to_json();
                let _ = conn.write_response(400, &[], &body, true);
                return;
            }
            Err(HttpError::TooLarge) => {
                let _ = conn.write_response(413, &[], &ApiError::TooLarge.to_json(), true);
                return;
            }
        };
        let latency = shared.faults().latency;
        if !latency.is_zero() {
            thread::sleep(latency);
        }
        log::trace!(method = req.method.as_str(), path = req.path.as_str(); "request");
        let user = {
            let users = shared.users.read().unwrap_or_else(|e| e.into_inner());
            users
                .authenticate(req.header("authorization"))
                .map(|u| u.name.clone())
        };
        if !reniced {
            let nice = user
                .as_ref()
                .and_then(|u| lock(&shared.niceness).get(u).copied());
            if let Some(nice) = nice {
                lower_priority(nice);
                reniced = true;
            }
        }
        shared.track(id, |t| t.user = user);
        let keep_alive = req.keep_alive();
        match api::handle(shared, &req) {
            Reply::Json {
                code,
                body,
                headers,
            } => {
                if conn
                    .write_response(code, &headers, &body, !keep_alive)
                    .is_err()
                {
                    return;
                }
            }
            Reply::Watch(plan, key) => {
                if let Start::Started { id: watch, .. } = &plan.start {
                    let watch = (key.clone(), *watch);
                    shared.track(id, |t| t.watch = Some(watch));
                }
                let ended = watch::serve(shared, &mut conn, *plan, key);
                shared.track(id, |t| t.watch = None);
                if ended == Ended::Dropped {
                    return;
                }
            }
        }
        if !keep_alive {
            return;
        }
    }
}
