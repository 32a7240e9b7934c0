//! Kubernetes Events about any object, written by a thread of their own as client-go's recorder
//! writes them: repeats bump `count`, a per-object token bucket keeps a hot error from flooding
//! the API server, a failed write is dropped. Warnings go first, never crowded out.

use crate::kube::client::{Client, Error, Resource};
use crate::kube::types::{Event, EventSource, ObjectMeta, ObjectReference, MAX_NAME_LEN};
use crate::util;
use crossbeam_channel::{Receiver, Sender};
use serde::de::IgnoredAny;
use serde_json::json;
use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A repeat within this window bumps the Event already written.
pub const DEDUP_WINDOW: Duration = Duration::from_secs(600);
/// Each object's token bucket: this many Events at once, then one more every `REFILL_EVERY`.
const BURST: f64 = 25.0;
const REFILL_EVERY: Duration = Duration::from_secs(300);
/// Objects the dedupe and rate-limit books remember at most, as client-go's EventCorrelator.
pub const MAX_REMEMBERED: usize = 4096;
/// Events of each type waiting to be written; beyond this they are dropped.
pub const BACKLOG: usize = 1024;
/// An Event to record: Normal or Warning, a CamelCase reason, a sentence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    pub warning: bool,
    pub reason: &'static str,
    pub message: String,
}

/// The kind of object Events are about, as `involvedObject` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kind {
    pub api_version: &'static str,
    pub kind: &'static str,
}

/// What the reconcile thread hands over: the object reference and the note.
#[derive(Debug, Clone)]
pub struct Pending {
    pub kind: Kind,
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub note: Note,
}

/// The writer's side of a [`Recorder`]: Warnings, then Normal Events.
pub struct Inbox {
    warnings: Receiver<Pending>,
    normal: Receiver<Pending>,
}

impl Inbox {
    /// The next Event to write, a Warning first; `None` once every recorder is gone.
    fn next(&self) -> Option<Pending> {
        if let Ok(p) = self.warnings.try_recv() {
            return Some(p);
        }
        crossbeam_channel::select! {
            recv(self.warnings) -> p => p.ok().or_else(|| self.normal.recv().ok()),
            recv(self.normal) -> p => p.ok().or_else(|| self.warnings.recv().ok()),
        }
    }
}

/// Called with the running total each time an Event is dropped because the queue is full.
pub type DropHook = fn(u64);

/// Cheap handle the reconcile side records through.
#[derive(Clone)]
pub struct Recorder {
    warnings: Sender<Pending>,
    normal: Sender<Pending>,
    kind: Kind,
    dropped: Arc<AtomicU64>,
    /// Whether Events are being dropped: one line when it starts and one when it ends.
    dropping: Arc<AtomicBool>,
    on_drop: DropHook,
}

impl Recorder {
    /// A recorder of Events about objects of `kind`, and the inbox [`run`] drains.
    pub fn channel(kind: Kind) -> (Recorder, Inbox) {
        // Unbounded with a length check, as bounded(BACKLOG) allocates all its slots up front.
        let (warnings, warnings_rx) = crossbeam_channel::unbounded();
        let (normal, normal_rx) = crossbeam_channel::unbounded();
        let inbox = Inbox {
            warnings: warnings_rx,
            normal: normal_rx,
        };
        let recorder = Recorder {
            warnings,
            normal,
            kind,
            dropped: Arc::default(),
            dropping: Arc::default(),
            on_drop: |_| {},
        };
        (recorder, inbox)
    }

    pub fn reporting_drops(mut self, hook: DropHook) -> Recorder {
        self.on_drop = hook;
        self
    }

    /// Queues `note` about the object `meta` describes; never waits. Behind a full backlog it
    /// is dropped and counted, as client-go's broadcaster drops on a full channel.
    pub fn record(&self, meta: &ObjectMeta, note: Note) {
        let tx = match note.warning {
            true => &self.warnings,
            false => &self.normal,
        };
        let waiting = tx.len();
        if waiting >= BACKLOG {
            let object = format!("{}/{}", meta.namespace, meta.name);
            (self.on_drop)(self.dropped.fetch_add(1, Ordering::Relaxed) + 1);
            if !self.dropping.swap(true, Ordering::Relaxed) {
                log::warn!(target: "events", object = object.as_str(), reason = note.reason, waiting = waiting as u64;
                    "the Event queue is full: Events are dropped until the writer catches up (best effort, as client-go's recorder)");
            }
            log::debug!(target: "events", object = object.as_str(), reason = note.reason; "event backlog full, dropped");
            return;
        }
        // One episode for both inboxes: it ends once neither is more than half full.
        let room = self.warnings.len().max(self.normal.len()) <= BACKLOG / 2;
        if room && self.dropping.swap(false, Ordering::Relaxed) {
            log::info!(target: "events", dropped_total = self.dropped.load(Ordering::Relaxed);
                "the Event queue has room again; Events are written again");
        }
        // A send fails only once the writer is gone (shutdown).
        let _ = tx.send(Pending {
            kind: self.kind,
            namespace: meta.namespace.clone(),
            name: meta.name.clone(),
            uid: meta.uid.clone(),
            note,
        });
    }
}

/// An Event already written, for deduplication.
struct Written {
    name: String,
    count: i64,
    first: String,
    at: Instant,
}

struct Bucket {
    tokens: f64,
    at: Instant,
}

/// Decides, for each event, whether to create, bump or drop it.
#[derive(Default)]
pub struct Book {
    written: HashMap<u64, Written>,
    buckets: HashMap<String, Bucket>,
    last_prune: Option<Instant>,
}

#[derive(Debug, PartialEq)]
pub enum Decision {
    /// Write a new Event; [`Book::created`] once it exists.
    Create {
        name: String,
    },
    /// Bump the Event already written; [`Book::gone`] if it is not there any more.
    Bump {
        name: String,
        count: i64,
        first: String,
    },
    Drop,
}

impl Book {
    pub fn decide(&mut self, p: &Pending, now: Instant) -> Decision {
        self.prune(now);
        trim(&mut self.written, |w| w.at);
        trim(&mut self.buckets, |b| b.at);
        let b = self.buckets.entry(p.uid.clone()).or_insert(Bucket {
            tokens: BURST,
            at: now,
        });
        b.tokens = (b.tokens + now.duration_since(b.at).as_secs_f64() / REFILL_EVERY.as_secs_f64())
            .min(BURST);
        b.at = now;
        if b.tokens < 1.0 {
            return Decision::Drop;
        }
        b.tokens -= 1.0;
        let key = dedup_key(p);
        match self.written.get_mut(&key) {
            Some(w) if now.duration_since(w.at) < DEDUP_WINDOW => {
                w.count += 1;
                w.at = now;
                Decision::Bump {
                    name: w.name.clone(),
                    count: w.count,
                    first: w.first.clone(),
                }
            }
            _ => Decision::Create {
                name: event_name(&p.name),
            },
        }
    }

    /// The Event of `p` exists now as `name`, with `count` and `first`: its repeats bump it.
    pub fn created(&mut self, p: &Pending, name: String, count: i64, first: String, now: Instant) {
        self.written.insert(
            dedup_key(p),
            Written {
                name,
                count,
                first,
                at: now,
            },
        );
    }

    /// The Event of `p` is not there to bump: the next repeat creates a new one.
    pub fn gone(&mut self, p: &Pending) {
        self.written.remove(&dedup_key(p));
    }

    /// Forgets what left the window, so memory follows recent activity, not the object count.
    fn prune(&mut self, now: Instant) {
        if self
            .last_prune
            .is_some_and(|t| now.duration_since(t) < Duration::from_secs(60))
        {
            return;
        }
        self.last_prune = Some(now);
        self.written
            .retain(|_, w| now.duration_since(w.at) < DEDUP_WINDOW);
        self.buckets
            .retain(|_, b| b.tokens < BURST || now.duration_since(b.at) < REFILL_EVERY);
    }
}

/// When `map` is full, forgets its older half (by last use), as client-go's LRU would.
fn trim<K, V>(map: &mut HashMap<K, V>, at: impl Fn(&V) -> Instant) {
    if map.len() < MAX_REMEMBERED {
        return;
    }
    let mut ages: Vec<Instant> = map.values().map(&at).collect();
    let mid = ages.len() / 2;
    let cut = *ages.select_nth_unstable(mid).1;
    map.retain(|_, v| at(v) > cut);
}

fn dedup_key(p: &Pending) -> u64 {
    let mut h = DefaultHasher::new();
    (&p.uid, p.note.reason, &p.note.message, p.note.warning).hash(&mut h);
    h.finish()
}

/// `<object>.<16 hex digits>`, as client-go names events, the object part shortened to fit.
pub fn event_name(object: &str) -> String {
    let suffix = format!("{:016x}", util::rand_u64());
    let room = MAX_NAME_LEN - suffix.len() - 1;
    let base = object
        .get(..room.min(object.len()))
        .unwrap_or(object)
        .trim_end_matches(['.', '-']);
    format!("{base}.{suffix}")
}

/// Drains `inbox` until every recorder is gone, writing Events as `component` from `instance`.
pub fn run(client: Client, inbox: Inbox, component: &'static str, instance: String) {
    let mut writer = Writer {
        client,
        component,
        instance,
        book: Book::default(),
    };
    while let Some(p) = inbox.next() {
        writer.write(&p);
    }
}

struct Writer {
    client: Client,
    component: &'static str,
    instance: String,
    book: Book,
}

impl Writer {
    /// Creates, bumps or drops the Event of `p`, and logs which and how it went.
    fn write(&mut self, p: &Pending) {
        let now = util::now_rfc3339();
        let object = format!("{}/{}", p.namespace, p.name);
        let (action, result) = match self.book.decide(p, Instant::now()) {
            Decision::Drop => {
                log::debug!(target: "events", object = object.as_str(), reason = p.note.reason; "event rate-limited, dropped");
                return;
            }
            Decision::Create { name } => {
                ("create_event", self.create(p, name, 1, now.clone(), &now))
            }
            Decision::Bump { name, count, first } => {
                let patch =
                    json!({ "count": count, "lastTimestamp": now, "firstTimestamp": first });
                let events = Resource::EVENTS;
                match self
                    .client
                    .merge_patch::<_, IgnoredAny>(events, &p.namespace, &name, &patch)
                {
                    // Deleted, or past its TTL: written anew with its count, as client-go does.
                    Err(e) if e.is_not_found() => {
                        self.book.gone(p);
                        ("create_event", self.create(p, name, count, first, &now))
                    }
                    result => ("bump_event", result.map(drop)),
                }
            }
        };
        let kind = if p.note.warning { "Warning" } else { "Normal" };
        match result {
            Ok(()) => {
                log::info!(target: "events", object = object.as_str(), action = action, reason = p.note.reason, type = kind, result = "success"; "recorded event")
            }
            Err(e) => {
                let level = if e.is_forbidden() {
                    log::Level::Warn
                } else {
                    log::Level::Info
                };
                log::log!(target: "events", level, object = object.as_str(), action = action, reason = p.note.reason, type = kind, result = "error", error = e.to_string().as_str(); "event not recorded")
            }
        }
    }

    /// POSTs the Event `name` of `p`; only once it exists do its repeats bump it.
    fn create(
        &mut self,
        p: &Pending,
        name: String,
        count: i64,
        first: String,
        last: &str,
    ) -> Result<(), Error> {
        let event = Event {
            api_version: "v1".into(),
            kind: "Event".into(),
            metadata: ObjectMeta {
                name: name.clone(),
                namespace: p.namespace.clone(),
                ..Default::default()
            },
            involved_object: ObjectReference {
                api_version: p.kind.api_version.into(),
                kind: p.kind.kind.into(),
                name: p.name.clone(),
                namespace: p.namespace.clone(),
                uid: p.uid.clone(),
            },
            reason: p.note.reason.into(),
            message: p.note.message.clone(),
            type_: if p.note.warning { "Warning" } else { "Normal" }.into(),
            source: EventSource {
                component: self.component.into(),
            },
            first_timestamp: Some(first.clone()),
            last_timestamp: Some(last.into()),
            count,
            reporting_component: self.component.into(),
            reporting_instance: self.instance.clone(),
        };
        // The answer is not needed: IgnoredAny checks it is JSON without building it.
        self.client
            .create::<_, IgnoredAny>(Resource::EVENTS, &p.namespace, &event)?;
        self.book.created(p, name, count, first, Instant::now());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending(uid: &str, reason: &'static str, message: &str) -> Pending {
        Pending {
            kind: Kind {
                api_version: "example.com/v1",
                kind: "Example",
            },
            namespace: "default".into(),
            name: "web".into(),
            uid: uid.into(),
            note: Note {
                warning: true,
                reason,
                message: message.into(),
            },
        }
    }

    /// Decides, and when that is a create, records that it succeeded, as `run` does.
    fn write(book: &mut Book, p: &Pending, now: Instant) -> Decision {
        let d = book.decide(p, now);
        if let Decision::Create { name } = &d {
            book.created(p, name.clone(), 1, "first".into(), now);
        }
        d
    }

    #[test]
    fn a_repeat_within_the_window_bumps_the_first_event() {
        let mut book = Book::default();
        let t = Instant::now();
        let Decision::Create { name } = write(&mut book, &pending("u", "PodNameConflict", "m"), t)
        else {
            panic!()
        };
        match write(
            &mut book,
            &pending("u", "PodNameConflict", "m"),
            t + Duration::from_secs(30),
        ) {
            Decision::Bump { name: n, count, .. } => assert_eq!((n, count), (name, 2)),
            d => panic!("{d:?}"),
        }
        // Another message is another event.
        assert!(matches!(
            write(&mut book, &pending("u", "PodNameConflict", "other"), t),
            Decision::Create { .. }
        ));
        // After the window, a new event.
        assert!(matches!(
            write(
                &mut book,
                &pending("u", "PodNameConflict", "m"),
                t + DEDUP_WINDOW + Duration::from_secs(31)
            ),
            Decision::Create { .. }
        ));
    }

    #[test]
    fn the_books_stay_bounded_and_keep_the_most_recent_objects() {
        let mut book = Book::default();
        let t = Instant::now();
        let n = MAX_REMEMBERED * 3;
        for i in 0..n {
            let p = pending(&format!("uid-{i}"), "Created", "m");
            let at = t + Duration::from_millis(i as u64);
            assert!(matches!(write(&mut book, &p, at), Decision::Create { .. }));
            assert!(book.written.len() <= MAX_REMEMBERED && book.buckets.len() <= MAX_REMEMBERED);
        }
        // The newest object is still remembered: its repeat bumps the event it already has.
        let last = pending(&format!("uid-{}", n - 1), "Created", "m");
        let at = t + Duration::from_millis(n as u64);
        assert!(matches!(
            book.decide(&last, at),
            Decision::Bump { count: 2, .. }
        ));
    }

    #[test]
    fn only_an_event_that_exists_is_bumped() {
        let mut book = Book::default();
        let t = Instant::now();
        let p = pending("u", "StartsNotCounted", "m");
        // The create failed (nothing recorded): the repeat creates, it does not bump.
        assert!(matches!(book.decide(&p, t), Decision::Create { .. }));
        let Decision::Create { name } = book.decide(&p, t + Duration::from_secs(1)) else {
            panic!("a repeat of an Event never written is created")
        };
        book.created(&p, name.clone(), 1, "first".into(), t);
        assert!(matches!(
            book.decide(&p, t + Duration::from_secs(2)),
            Decision::Bump { count: 2, .. }
        ));
        // Its bump found it deleted: the next repeat creates it again.
        book.gone(&p);
        assert!(matches!(
            book.decide(&p, t + Duration::from_secs(3)),
            Decision::Create { .. }
        ));
    }

    #[test]
    fn an_event_deleted_meanwhile_is_written_again_by_its_next_repeat() {
        let server =
            kube_testserver::TestServer::start(kube_testserver::Options::default()).unwrap();
        let client = crate::testutil::client_of(&server.kubeconfig_path());
        let (recorder, inbox) = Recorder::channel(kind());
        let writer = std::thread::spawn(move || run(client, inbox, "test", "here".into()));
        let events = "/api/v1/namespaces/default/events";
        let listed = || -> Vec<serde_json::Value> {
            let list = server.get_json(events).expect("events listed");
            list["items"].as_array().cloned().unwrap_or_default()
        };
        let wait_for = |what: &str, f: &dyn Fn(&[serde_json::Value]) -> bool| {
            let t = Instant::now();
            while !f(&listed()) {
                assert!(
                    t.elapsed() < Duration::from_secs(5),
                    "{what}: {:?}",
                    listed()
                );
                std::thread::sleep(Duration::from_millis(10));
            }
        };
        recorder.record(&meta(), note(true));
        wait_for("the first Event", &|l| l.len() == 1);
        // Someone deletes it (or the API server's Event TTL ends it).
        let name = listed()[0]["metadata"]["name"]
            .as_str()
            .unwrap()
            .to_string();
        let tls =
            crate::kube::tls::client_config(Some(server.ca_pem().as_bytes()), false, None, None)
                .unwrap();
        let request = ureq::http::Request::delete(format!("{}{events}/{name}", server.url()))
            .header("Authorization", format!("Bearer {}", server.admin_token()))
            .body(())
            .unwrap();
        let config = crate::kube::client::transport::config(None, 0).build();
        let answer = crate::kube::client::transport::agent_with(tls, config)
            .run(request)
            .expect("the Event deleted");
        assert_eq!(answer.status(), 200);
        recorder.record(&meta(), note(true));
        wait_for("the Event written again, counting both", &|l| {
            l.len() == 1 && l[0]["count"] == 2
        });
        drop(recorder);
        writer.join().unwrap();
    }

    #[test]
    fn an_event_whose_create_failed_is_created_by_its_next_repeat() {
        let server =
            kube_testserver::TestServer::start(kube_testserver::Options::default()).unwrap();
        let client = crate::testutil::client_of(&server.kubeconfig_path());
        server.fail_next(kube_testserver::FailRule {
            count: 1,
            status: 500,
            retry_after: None,
            verb: Some("create".into()),
            path_contains: Some("/events".into()),
        });
        let (recorder, inbox) = Recorder::channel(kind());
        let writer = std::thread::spawn(move || run(client, inbox, "test", "here".into()));
        recorder.record(&meta(), note(true));
        recorder.record(&meta(), note(true));
        drop(recorder);
        writer.join().unwrap();
        let list = server
            .get_json("/api/v1/namespaces/default/events")
            .unwrap();
        let items = list["items"].as_array().unwrap();
        assert_eq!(items.len(), 1, "the repeat is written: {items:?}");
    }

    #[test]
    fn a_hot_object_is_rate_limited_after_its_burst() {
        let mut book = Book::default();
        let t = Instant::now();
        let decisions: Vec<_> = (0..30)
            .map(|i| book.decide(&pending("hot", "X", &i.to_string()), t))
            .collect();
        assert_eq!(
            decisions.iter().filter(|d| **d == Decision::Drop).count(),
            5
        );
        // Another object is not affected.
        assert!(matches!(
            book.decide(&pending("calm", "X", "m"), t),
            Decision::Create { .. }
        ));
        // One token comes back every five minutes.
        assert!(matches!(
            book.decide(&pending("hot", "X", "later"), t + REFILL_EVERY),
            Decision::Create { .. }
        ));
    }

    #[test]
    fn event_names_stay_valid_for_the_longest_object_names() {
        let n = event_name(&"a".repeat(253));
        assert!(n.len() <= MAX_NAME_LEN, "{}", n.len());
        assert!(event_name("web").starts_with("web."));
    }

    fn kind() -> Kind {
        Kind {
            api_version: "v1",
            kind: "Pod",
        }
    }

    fn meta() -> ObjectMeta {
        ObjectMeta {
            namespace: "default".into(),
            name: "web".into(),
            uid: "u".into(),
            ..ObjectMeta::default()
        }
    }

    fn note(warning: bool) -> Note {
        Note {
            warning,
            reason: "Created",
            message: "m".into(),
        }
    }

    #[test]
    fn a_full_queue_drops_and_counts_instead_of_waiting_and_recovers_once_drained() {
        static SEEN: AtomicU64 = AtomicU64::new(0);
        let (recorder, inbox) = Recorder::channel(kind());
        let recorder = recorder.reporting_drops(|total| SEEN.store(total, Ordering::Relaxed));
        for _ in 0..BACKLOG + 3 {
            recorder.record(&meta(), note(false));
        }
        assert_eq!(inbox.normal.len(), BACKLOG, "the queue stops at its bound");
        assert_eq!(SEEN.load(Ordering::Relaxed), 3, "each drop is counted");
        assert!(recorder.dropping.load(Ordering::Relaxed));
        // The writer catches up: the next Event is queued and the episode ends.
        while inbox.normal.len() > BACKLOG / 2 {
            inbox.next().unwrap();
        }
        recorder.record(&meta(), note(false));
        assert!(!recorder.dropping.load(Ordering::Relaxed));
        assert_eq!(inbox.normal.len(), BACKLOG / 2 + 1);
        assert_eq!(SEEN.load(Ordering::Relaxed), 3);
    }

    #[test]
    fn a_warning_is_never_dropped_for_normal_events_and_is_written_first() {
        let (recorder, inbox) = Recorder::channel(kind());
        for _ in 0..BACKLOG + 3 {
            recorder.record(&meta(), note(false));
        }
        recorder.record(&meta(), note(true));
        assert!(inbox.next().unwrap().note.warning, "the Warning goes first");
        assert!(!inbox.next().unwrap().note.warning);
        drop(recorder);
        let mut left = 1;
        while inbox.next().is_some() {
            left += 1;
        }
        assert_eq!(
            left, BACKLOG,
            "what the recorder took is all drained at the end"
        );
    }
}
