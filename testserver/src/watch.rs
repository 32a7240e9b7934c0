//! Serving one watch: a chunked stream of JSON events, one per line, with selector
//! transitions, bookmarks and the timeout as kube-apiserver's watch cache does them.

use crate::accept;
use crate::faults;
use crate::http::{self, Conn};
use crate::reply::{Start, WatchPlan};
use crate::resources;
use crate::shared::Shared;
use crate::store::{Event, EventType};
use crate::table;
use serde_json::Value;
use std::io::{Read, Write};
use std::sync::mpsc::RecvTimeoutError;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How a watch stream ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Ended {
    /// The timeout elapsed (or the start was Expired): the last chunk was sent and the
    /// connection can serve the next request.
    Clean,
    /// The watch was dropped (fault injection, server stop) or the client went away: the
    /// connection must be closed without the last chunk.
    Dropped,
}

/// Forgets the watch in the store when the stream ends, however it ends.
struct Registration<'a> {
    shared: &'a Shared,
    key: String,
    id: u64,
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        self.shared.write().unwatch(&self.key, self.id);
    }
}

fn frame(typ: &str, object: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(object.len() + 32);
    out.extend_from_slice(b"{\"type\":\"");
    out.extend_from_slice(typ.as_bytes());
    out.extend_from_slice(b"\",\"object\":");
    out.extend_from_slice(object);
    out.extend_from_slice(b"}\n");
    out
}

/// How many bytes of events a stream gathers before it writes them: bounds its buffer, and
/// how long the first event of a burst waits for the others to be encoded.
const BATCH_BYTES: usize = 64 * 1024;

struct Stream<'a, S: Read + Write> {
    conn: &'a mut Conn<S>,
    plan: &'a WatchPlan,
    last_rv: u64,
    /// Events up to this version are not sent: the watch's own, once its backlog is out.
    after: u64,
    sent_columns: bool,
    /// Framed chunks not written yet: see [`Stream::flush`].
    out: Vec<u8>,
}

impl<S: Read + Write> Stream<'_, S> {
    fn matches(&self, obj: &Value) -> bool {
        self.plan.labels.matches_labels(obj) && self.plan.fields.matches_fields(obj)
    }

    /// Queues `ev` as this watch sees it, for the next [`Stream::flush`]. With selectors, an
    /// update that makes an object match is ADDED and one that makes it stop matching is
    /// DELETED with the previous content at the new version (the watch cache's
    /// `convertToWatchEvent`).
    fn push(&mut self, ev: &Event) -> std::io::Result<()> {
        // A watch from a version not reached yet (etcd restored from a snapshot) hears only
        // what comes after it, as the watch cache's `cacheWatcher` sends it.
        if ev.rv <= self.after {
            return Ok(());
        }
        self.last_rv = self.last_rv.max(ev.rv);
        let cur = self.matches(&ev.object);
        let prev = ev.prev.as_ref().is_some_and(|p| self.matches(p));
        let (typ, object) = match ev.typ {
            EventType::Added | EventType::Deleted if cur => (ev.typ.as_str(), ev.object.clone()),
            EventType::Modified if cur && prev => ("MODIFIED", ev.object.clone()),
            EventType::Modified if cur => ("ADDED", ev.object.clone()),
            EventType::Modified if prev => {
                let Some(p) = &ev.prev else { return Ok(()) };
                let mut old = (**p).clone();
                old["metadata"]["resourceVersion"] = Value::String(ev.rv.to_string());
                ("DELETED", Arc::new(old))
            }
            _ => return Ok(()),
        };
        let bytes = match &self.plan.table {
            Some(include) => {
                let mut t = table::render(
                    &self.plan.def,
                    &self.plan.version,
                    &[object],
                    ev.rv,
                    None,
                    include.as_deref(),
                );
                // Column definitions only once, as the real server sends them.
                if self.sent_columns {
                    t["columnDefinitions"] = Value::Array(Vec::new());
                }
                self.sent_columns = true;
                serde_json::to_vec(&t).unwrap_or_default()
            }
            None if self.plan.metadata.is_some() => {
                let version = self.plan.metadata.unwrap_or("v1");
                serde_json::to_vec(&accept::partial(version, &object)).unwrap_or_default()
            }
            None if Arc::ptr_eq(&object, &ev.object)
                && self.plan.version == self.plan.def.preferred_version() =>
            {
                ev.encoded(&self.plan.def).to_vec()
            }
            None => resources::encode_object(&self.plan.def, &self.plan.version, &object),
        };
        self.push_frame(&frame(typ, &bytes))
    }

    fn push_frame(&mut self, frame: &[u8]) -> std::io::Result<()> {
        http::push_chunk(&mut self.out, frame);
        if self.out.len() >= BATCH_BYTES {
            self.flush()?;
        }
        Ok(())
    }

    /// Writes what was queued in one write. The stream queues every event already waiting
    /// before it writes, as kube-apiserver's watch handler flushes only when its channel is
    /// empty: a stream behind a burst catches up in a few writes instead of one per event.
    fn flush(&mut self) -> std::io::Result<()> {
        let out = std::mem::take(&mut self.out);
        let written = self.conn.write_chunks(&out);
        self.out = out;
        self.out.clear();
        written
    }

    /// Queues every event in `events`, then writes them.
    fn send_all<'e>(
        &mut self,
        events: impl IntoIterator<Item = &'e Arc<Event>>,
    ) -> std::io::Result<()> {
        for ev in events {
            self.push(ev)?;
        }
        self.flush()
    }

    fn push_bookmark(&mut self, rv: u64) -> std::io::Result<()> {
        // Nor a bookmark before it: such a watch says nothing at all until the store passes
        // its version (fixtures kube-1.28-kubelet/52, 55).
        if rv < self.plan.from {
            return Ok(());
        }
        let rv = rv.max(self.last_rv);
        self.last_rv = rv;
        let mut obj = resources::bookmark_object(&self.plan.def, &self.plan.version, rv);
        if let Some(version) = self.plan.metadata {
            // The bookmark's metadata as a typed ObjectMeta writes it (a zero time is null).
            obj["metadata"]["creationTimestamp"] = Value::Null;
            obj = accept::partial(version, &obj);
        }
        let bytes = serde_json::to_vec(&obj).unwrap_or_default();
        self.push_frame(&frame("BOOKMARK", &bytes))
    }
}

/// When the next bookmark is due: every `interval`, but also ~2 s before the deadline so the
/// client can resume from a fresh version; none when that moment has passed (kube-apiserver's
/// `cacheWatcher.nextBookmarkTime`).
fn next_bookmark(now: Instant, interval: Duration, deadline: Instant) -> Option<Instant> {
    let periodic = now + interval;
    let pre_timeout = deadline.checked_sub(Duration::from_secs(2)).unwrap_or(now);
    let at = periodic.min(pre_timeout);
    (at > now).then_some(at)
}

/// How often a frozen stream checks whether it was dropped (its channel closed).
const FROZEN_POLL: Duration = Duration::from_millis(100);

/// The most events a stream takes off its channel at once.
const BATCH_EVENTS: usize = 1024;

/// Streams the watch on `conn` until it times out, is dropped, or the client goes away.
/// While frozen (`TestServer::freeze_watches`) it sends nothing at all, its end included, and
/// keeps what arrives for after the thaw.
pub fn serve<S: Read + Write>(
    shared: &Shared,
    conn: &mut Conn<S>,
    plan: WatchPlan,
    key: String,
) -> Ended {
    if conn.start_chunked(200).is_err() {
        return Ended::Dropped;
    }
    let (id, rx, backlog) = match &plan.start {
        Start::Expired(err) => {
            let status = serde_json::to_vec(&err.to_value()).unwrap_or_default();
            let ok = conn
                .write_chunk(&frame("ERROR", &status))
                .and_then(|_| conn.end_chunked());
            return if ok.is_ok() {
                Ended::Clean
            } else {
                Ended::Dropped
            };
        }
        Start::Started { id, rx, backlog } => (*id, rx, backlog),
    };
    let _registration = Registration { shared, key, id };
    let epoch = plan.epoch;
    let mut held: Vec<Arc<Event>> = Vec::new();
    let started = Instant::now();
    let deadline = started + plan.timeout;
    let mut stream = Stream {
        conn,
        plan: &plan,
        last_rv: plan.from,
        after: 0,
        sent_columns: false,
        out: Vec::new(),
    };
    if stream.send_all(backlog).is_err() {
        return Ended::Dropped;
    }
    stream.after = plan.from;
    let mut bookmark_at = if plan.bookmarks {
        next_bookmark(started, shared.bookmark_interval, deadline)
    } else {
        None
    };
    loop {
        if shared.faults().is_frozen(epoch) {
            loop {
                match rx.try_recv() {
                    Ok(ev) => held.push(ev),
                    Err(std::sync::mpsc::TryRecvError::Empty) => break,
                    Err(std::sync::mpsc::TryRecvError::Disconnected) => return Ended::Dropped,
                }
            }
            faults::wait_while_frozen(&shared.faults, &shared.stall_lifted, epoch, FROZEN_POLL);
            continue;
        }
        if stream.send_all(&held).is_err() {
            return Ended::Dropped;
        }
        held.clear();
        let now = Instant::now();
        if now >= deadline {
            return match stream.conn.end_chunked() {
                Ok(()) => Ended::Clean,
                Err(_) => Ended::Dropped,
            };
        }
        let wake = bookmark_at.map_or(deadline, |b| b.min(deadline));
        match rx.recv_timeout(wake.saturating_duration_since(now)) {
            Ok(ev) => {
                let mut batch = vec![ev];
                while batch.len() < BATCH_EVENTS {
                    match rx.try_recv() {
                        Ok(ev) => batch.push(ev),
                        // A closed channel is seen by the next wait.
                        Err(_) => break,
                    }
                }
                if shared.faults().is_frozen(epoch) {
                    held.extend(batch);
                } else if stream.send_all(&batch).is_err() {
                    return Ended::Dropped;
                }
            }
            Err(RecvTimeoutError::Timeout) => {
                let now = Instant::now();
                if shared.faults().is_frozen(epoch) {
                    continue;
                }
                if bookmark_at.is_some_and(|b| b <= now) {
                    // Every commit up to the version read here is already in the channel
                    // (commits send under the write lock, which excludes this read), so send
                    // those first: a bookmark must never skip an event the client has not
                    // seen.
                    let rv = shared.read().rv();
                    let waiting: Vec<Arc<Event>> = rx.try_iter().collect();
                    if waiting.iter().try_for_each(|ev| stream.push(ev)).is_err()
                        || stream.push_bookmark(rv).is_err()
                        || stream.flush().is_err()
                    {
                        return Ended::Dropped;
                    }
                    bookmark_at = next_bookmark(now, shared.bookmark_interval, deadline);
                }
            }
            Err(RecvTimeoutError::Disconnected) => return Ended::Dropped,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::Users;
    use crate::selector::Selector;
    use crate::store::{Store, WatchStart};
    use std::sync::{mpsc, Mutex};

    /// A client's end of the connection: what it received, and in how many writes.
    #[derive(Clone, Default)]
    struct Client(Arc<Mutex<(Vec<u8>, usize)>>);

    impl Read for Client {
        fn read(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
            Ok(0)
        }
    }

    impl Write for Client {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            let mut got = self.0.lock().expect("lock");
            got.0.extend_from_slice(buf);
            got.1 += 1;
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn events_waiting_for_a_stream_reach_the_client_in_one_write() {
        let (gc, _gc) = mpsc::channel();
        let certs = crate::tls::generate().expect("certificates");
        let shared = Shared::new(
            Store::new(100, gc),
            Users::default(),
            Duration::from_secs(60),
            0,
            certs.config,
        );
        // A burst committed while the stream was busy elsewhere: 50 events in its channel.
        let (def, start, from) = {
            let mut store = shared.write();
            let def = store.resolve("", "v1", "namespaces").expect("namespaces");
            let from = store.rv();
            let start = store.watch(&def.key(), None, Some(from));
            for i in 0..50 {
                let ns = serde_json::json!({"metadata": {"name": format!("burst-{i}"), "uid": format!("u{i}")}});
                store.commit(&def.key(), EventType::Added, ns, None);
            }
            (def, start, from)
        };
        let WatchStart::Started { id, rx, backlog } = start else {
            panic!("the watch did not start");
        };
        let key = def.key();
        let plan = WatchPlan {
            def,
            version: "v1".into(),
            start: Start::Started { id, rx, backlog },
            labels: Selector::default(),
            fields: Selector::default(),
            timeout: Duration::from_millis(200),
            bookmarks: false,
            from,
            table: None,
            metadata: None,
            epoch: 0,
        };
        let client = Client::default();
        let mut conn = Conn::new(client.clone());
        assert_eq!(serve(&shared, &mut conn, plan, key), Ended::Clean);
        let (bytes, writes) = client.0.lock().expect("lock").clone();
        let text = String::from_utf8(bytes).expect("utf-8");
        assert_eq!(text.matches("\"type\":\"ADDED\"").count(), 50, "{text}");
        // The response head, the 50 events, the last chunk.
        assert_eq!(writes, 3, "{text}");
    }

    #[test]
    fn bookmarks_come_periodically_and_two_seconds_before_the_deadline() {
        let now = Instant::now();
        let deadline = now + Duration::from_secs(5);
        assert_eq!(
            next_bookmark(now, Duration::from_secs(60), deadline),
            Some(now + Duration::from_secs(3))
        );
        assert_eq!(
            next_bookmark(now, Duration::from_secs(1), deadline),
            Some(now + Duration::from_secs(1))
        );
        assert_eq!(
            next_bookmark(
                now + Duration::from_secs(3),
                Duration::from_secs(60),
                deadline
            ),
            None
        );
    }

    #[test]
    fn frame_is_one_json_line() {
        let f = frame("ADDED", b"{\"a\":1}");
        assert_eq!(f, b"{\"type\":\"ADDED\",\"object\":{\"a\":1}}\n");
    }
}
