//! The state the accept thread, connection threads, the GC thread and `TestServer` share:
//! the store behind its lock, users, faults, counters and the open connections.
//!
//! Requests are split as kube-apiserver and etcd split them. Each one's work (TLS, parsing,
//! decoding, defaulting, validation, patching, encoding answers and watch events) is done on
//! its own thread with no lock held. Reads (GET, LIST, discovery, a write's lookups, and the
//! admission that need not be atomic with the write: PodSecurity and ValidatingAdmissionPolicy,
//! as kube-apiserver's plugins read their informers' caches) share the store's read lock, take
//! `Arc`s of its immutable objects and encode after letting it go. The write lock is held only
//! for what etcd serializes: what must hold at the commit, the next resourceVersion, storing,
//! the owner index, the watch history and the fan-out. Registering a watch, DELETE, eviction,
//! deletecollection, garbage collection, namespace deletion and `TestServer`'s direct changes
//! (rare, or touching many objects) hold it throughout. Counters, the request log and the fault
//! rules have short mutexes of their own. Measured with the bench's floor (2,000 pod creates and
//! 2,000 status patches, 2 cores): one mutex for everything served 7,000–8,300 requests/s at 1
//! connection and 9,900–10,700 at 64; this split, 9,600–11,700 and 16,400–18,900, at about
//! 60 µs of server CPU a request where contention made it 100 µs.

use crate::auth::Users;
use crate::cost::Costs;
use crate::faults::{Counts, Faults, Logged};
use crate::store::Store;
use std::collections::HashMap;
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

/// State shared by the accept thread, connection threads, the GC thread and `TestServer`.
pub struct Shared {
    /// Reads (GET, LIST, discovery, admission's lookups) share it; a write holds it
    /// exclusively only to commit (see [`Shared::write`] and the module docs).
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
    /// The SidecarContainers feature gate (`Options::sidecar_containers`).
    pub sidecar_containers: bool,
    pub port: u16,
    pub tls: Arc<rustls::ServerConfig>,
    /// Open connections, so `stop_listening` can close them and `blackhole` silence them; a
    /// black-holed one stays here, open, after its thread has ended.
    pub conns: Mutex<HashMap<u64, Tracked>>,
    pub next_conn: AtomicU64,
    /// Users whose requests are served on threads of lower CPU priority, and their niceness
    /// (`TestServer::set_user_nice`).
    pub niceness: Mutex<HashMap<String, u8>>,
}

/// One open connection, as `stop_listening` and `blackhole` reach it.
pub struct Tracked {
    /// A second handle on the socket: the connection closes when both this and its thread's
    /// handle are gone, so keeping this one holds a black-holed connection open.
    pub tcp: TcpStream,
    /// The user of the last request it carried; `None` before its first request, or when that
    /// request's token was unknown.
    pub user: Option<String>,
    /// Set once the connection is black-holed: see `Gated` in `server.rs`.
    pub silent: Arc<AtomicBool>,
    /// The watch it streams now (resource key, watch id), so a black hole can end its wait.
    pub watch: Option<(String, u64)>,
}

/// Locks a mutex even if a thread panicked while holding it: the data are plain maps that a
/// panic cannot leave half-written in a way that matters to a test server.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
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
            sidecar_containers: true,
            port,
            tls,
            conns: Mutex::new(HashMap::new()),
            next_conn: AtomicU64::new(1),
            niceness: Mutex::new(HashMap::new()),
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
    pub fn track(&self, id: u64, f: impl FnOnce(&mut Tracked)) {
        if let Some(t) = lock(&self.conns).get_mut(&id) {
            f(t);
        }
    }
}
