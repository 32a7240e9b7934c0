//! Listening and connections: an accept thread, a thread per TLS connection serving
//! keep-alive HTTP/1.1 requests, and the state all of them share.

use crate::api::{self, Reply};
use crate::auth::Users;
use crate::cost::Costs;
use crate::faults::{Counts, Faults, Logged};
use crate::http::{Conn, HttpError};
use crate::status::ApiError;
use crate::store::Store;
use crate::watch::{self, Ended, Start};
use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::thread::{self, JoinHandle};
use std::time::Duration;

/// State shared by the accept thread, connection threads, the GC thread and `TestServer`.
pub struct Shared {
    /// Reads (GET, LIST, discovery, admission's lookups) share it; a write holds it
    /// exclusively only to commit (see [`Shared::write`] and the README's concurrency model).
    store: RwLock<Store>,
    pub users: RwLock<Users>,
    pub faults: Mutex<Faults>,
    /// Notified when a stall rule is lifted or watches are thawed, waking what they held.
    pub stall_lifted: Condvar,
    pub counts: Mutex<Counts>,
    /// Every request, once `TestServer::record_requests` turned the log on (`None`: off, so
    /// long benchmark runs do not grow it).
    pub log: Mutex<Option<Vec<Logged>>>,
    /// Strategic merge patches applied to every pod created through the API, as mutating
    /// admission webhooks patch them (`TestServer::mutate_pods`).
    pub pod_mutations: Mutex<Vec<serde_json::Value>>,
    /// The modeled control plane's costs (off unless set) and the requests in flight.
    pub costs: Costs,
    pub bookmark_interval: Duration,
    pub port: u16,
    pub tls: Arc<rustls::ServerConfig>,
    /// Open connections, so `stop_listening` can close them and `blackhole` silence them; a
    /// black-holed one stays here, open, after its thread has ended.
    conns: Mutex<HashMap<u64, Tracked>>,
    next_conn: AtomicU64,
}

/// One open connection, as `stop_listening` and `blackhole` reach it.
struct Tracked {
    /// A second handle on the socket: the connection closes when both this and its thread's
    /// handle are gone, so keeping this one holds a black-holed connection open.
    tcp: TcpStream,
    /// The user of the last request it carried; `None` before its first request, or when that
    /// request's token was unknown.
    user: Option<String>,
    /// Set once the connection is black-holed: see [`Gated`].
    silent: Arc<AtomicBool>,
    /// The watch it streams now (resource key, watch id), so a black hole can end its wait.
    watch: Option<(String, u64)>,
}

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

/// Locks a mutex even if a thread panicked while holding it: the data are plain maps that a
/// panic cannot leave half-written in a way that matters to a test server.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    pub fn new(
        store: Store,
        users: Users,
        bookmark_interval: Duration,
        port: u16,
        tls: Arc<rustls::ServerConfig>,
    ) -> Shared {
        Shared {
            store: RwLock::new(store),
            users: RwLock::new(users),
            faults: Mutex::new(Faults::default()),
            stall_lifted: Condvar::new(),
            counts: Mutex::new(Counts::new()),
            log: Mutex::new(None),
            pod_mutations: Mutex::new(Vec::new()),
            costs: Costs::default(),
            bookmark_interval,
            port,
            tls,
            conns: Mutex::new(HashMap::new()),
            next_conn: AtomicU64::new(1),
        }
    }

    /// The store for reading: any number of readers at once, none while a write commits.
    /// Hold it briefly: take what the request needs (objects are shared `Arc`s) and encode
    /// after letting it go.
    pub fn read(&self) -> RwLockReadGuard<'_, Store> {
        self.store.read().unwrap_or_else(|e| e.into_inner())
    }

    /// The store for writing, alone: what etcd serializes (the next resourceVersion,
    /// preconditions checked against the stored object, storing, the watch history and
    /// fan-out). The API holds it only to commit what it prepared outside; the simulated
    /// cluster and the garbage collector hold it to do their (short) work.
    pub fn write(&self) -> RwLockWriteGuard<'_, Store> {
        self.store.write().unwrap_or_else(|e| e.into_inner())
    }

    pub fn faults(&self) -> MutexGuard<'_, Faults> {
        lock(&self.faults)
    }

    pub fn counts(&self) -> MutexGuard<'_, Counts> {
        lock(&self.counts)
    }

    pub fn log(&self) -> MutexGuard<'_, Option<Vec<Logged>>> {
        lock(&self.log)
    }

    /// Closes every open connection (both directions), black-holed ones included, so their
    /// threads end.
    pub fn close_connections(&self) {
        for (_, t) in lock(&self.conns).drain() {
            let _ = t.tcp.shutdown(Shutdown::Both);
        }
    }

    /// Black-holes every open connection whose last request came from `user` (any connection
    /// when `None`): from now on nothing is read from it or written to it, and it stays open
    /// until the server closes its connections. Returns how many connections this silenced.
    pub fn blackhole(&self, user: Option<&str>) -> usize {
        let mut watches = Vec::new();
        let mut silenced = 0;
        {
            let mut conns = lock(&self.conns);
            for t in conns.values_mut() {
                let chosen = user.is_none_or(|u| t.user.as_deref() == Some(u));
                if !chosen || t.silent.swap(true, Ordering::SeqCst) {
                    continue;
                }
                // Wakes a thread blocked reading the next request of an idle keep-alive
                // connection. Shutting down the read side sends nothing to the peer (no FIN,
                // no reset); what the peer sends later is left unread.
                let _ = t.tcp.shutdown(Shutdown::Read);
                watches.extend(t.watch.take());
                silenced += 1;
            }
        }
        // A watch waiting for its next event learns it is over when its channel closes; it
        // then ends without writing (its socket is gated), leaving the connection open.
        let mut store = self.write();
        for (key, id) in watches {
            store.unwatch(&key, id);
        }
        silenced
    }

    /// Connections black-holed and held open now.
    pub fn blackholed(&self) -> usize {
        lock(&self.conns)
            .values()
            .filter(|t| t.silent.load(Ordering::SeqCst))
            .count()
    }

    /// Records what a connection carries now, for `blackhole`.
    fn track(&self, id: u64, f: impl FnOnce(&mut Tracked)) {
        if let Some(t) = lock(&self.conns).get_mut(&id) {
            f(t);
        }
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
