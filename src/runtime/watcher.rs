//! Watcher threads: list, then watch from the list's resourceVersion, turning events into queue
//! keys.
//!
//! The state machine is kube-runtime's (`watcher.rs`): an empty start lists (in pages), then
//! watches from the list's `metadata.resourceVersion`; every event moves the version on,
//! BOOKMARK included; a clean end of stream re-watches from the last version; an in-stream
//! ERROR with code 410 (what a real server sends, see the `*-watch-expired-resource-version-410`
//! fixture) or an HTTP 410 relists; any other failure backs off (0.8 s doubling to 30 s, with
//! jitter, reset once the server talks to us again) and re-watches.
//!
//! A stream that says nothing for the idle limit ([`DEFAULT_IDLE_TIMEOUT`], `--watch-idle-timeout`)
//! is given up as dead, as is one whose answer does not come within it: a connection whose
//! node or load balancer vanished stays open without a word. The watch is resumed from the
//! last resourceVersion (no relist), with the same backoff as any other failure.
//!
//! This is machinery: what an event means (which key, whether it is worth a reconcile, what it
//! tells reconcile) is the policy's, a [`Watched`] (see `lifecycle`). A watcher keeps no
//! object: only the last resourceVersion and, per key, the small memo the policy asks it to
//! keep (a digest), which also gives a relist the keys that vanished while the watch was down.

use crate::kube::client::{self, Client, ListPage, ListParams, Resource, WatchParams};
use crate::kube::types::{ObjectMeta, Status};
use crate::runtime::metrics::{self, Restart};
use crate::runtime::queue::{Queue, Trigger};
use crate::util;
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::value::RawValue;
use std::collections::{HashMap, HashSet};
use std::io::BufRead;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Page size of a relist: bounds the memory a relist of 10,000 objects takes.
const LIST_PAGE: u32 = 500;
/// Watch `timeoutSeconds` is drawn from this range: below the ~4 minute idle timeout of common
/// load balancers, and random so that many operators do not re-watch in lockstep.
const WATCH_TIMEOUT_SECS: (u64, u64) = (170, 230);
/// A stream that ends cleanly this fast without saying anything is treated as a failure, so a
/// server that closes every watch at once cannot make us spin.
const MIN_HEALTHY_STREAM: Duration = Duration::from_secs(1);
/// How long a watch may say nothing before it is given up as dead. kube-apiserver's watch cache
/// sends a watch that asked for bookmarks (we do) a BOOKMARK about once a minute when nothing
/// else is sent (`defaultBookmarkFrequency`, dispatched by a timer that ticks every second), so
/// 75 s is that minute plus a quarter for a late timer or a slow network: a dead connection is
/// noticed little more than a quarter-minute after the bookmark that did not come, and a
/// healthy one is almost never given up (if it is, resuming from the last version costs one
/// request). A server that sends no bookmarks has its quiet watches re-opened at this pace.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(75);

/// What a watched resource's events mean: the policy half of a watcher.
pub trait Watched {
    /// What is decoded of each object: only the fields the policy decides on. Everything else
    /// is skipped while decoding, so memory does not grow with the size of the objects seen.
    type Object: DeserializeOwned;
    /// What a trigger carries beyond the key.
    type Hint;
    fn meta(o: &Self::Object) -> &ObjectMeta;
    /// The queue key the object stands for, or `None` when it is none of ours.
    fn key_of(&self, o: &Self::Object) -> Option<String>;
    /// What the watcher remembers of a listed object until its next event.
    fn memo(&self, o: &Self::Object) -> u64;
    /// Whether this ADDED, MODIFIED or DELETED event is worth a reconcile of its key, and with
    /// what hint. `memo` holds what was remembered from the key's previous event (`None`: no
    /// event seen since the last list) and is updated in place.
    fn on_event(
        &self,
        event: &'static str,
        o: &Self::Object,
        memo: &mut Option<u64>,
    ) -> Verdict<Self::Hint>;
}

/// A policy's answer to one event.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict<H> {
    /// Nothing reconcile would do differently.
    Ignore,
    /// Queue the key, with what the event tells reconcile, if anything.
    Queue(Option<H>),
}

/// Where one watched resource lives.
#[derive(Clone, Debug)]
pub struct Kind {
    pub resource: Resource,
    /// Watch one namespace, or all when `None`.
    pub namespace: Option<String>,
    pub label_selector: Option<String>,
}

/// One line of a watch stream, with the object left undecoded until its type is known: an
/// ERROR carries a `Status`, the others an object of the watched kind.
#[derive(Deserialize)]
struct RawEvent<'a> {
    #[serde(rename = "type")]
    type_: &'a str,
    #[serde(borrow)]
    object: &'a RawValue,
}

/// A BOOKMARK carries only `metadata.resourceVersion`.
#[derive(Deserialize)]
struct Bookmark {
    #[serde(default)]
    metadata: ObjectMeta,
}

/// Where a watcher gets its lists and streams: the API client, or a script in tests.
pub trait Source {
    fn list_page<T: DeserializeOwned>(
        &self,
        kind: &Kind,
        continue_token: Option<&str>,
    ) -> Result<ListPage<T>, client::Error>;
    /// A stream that hears nothing for `idle` must fail its read with `TimedOut`.
    fn watch(
        &self,
        kind: &Kind,
        rv: &str,
        timeout_secs: u32,
        idle: Duration,
    ) -> Result<Box<dyn BufRead + Send>, client::Error>;
}

impl Source for Client {
    fn list_page<T: DeserializeOwned>(
        &self,
        kind: &Kind,
        continue_token: Option<&str>,
    ) -> Result<ListPage<T>, client::Error> {
        let params = ListParams {
            label_selector: kind.label_selector.as_deref(),
            limit: Some(LIST_PAGE),
            continue_token,
        };
        self.list(kind.resource, kind.namespace.as_deref(), &params)
    }

    fn watch(
        &self,
        kind: &Kind,
        rv: &str,
        timeout_secs: u32,
        idle: Duration,
    ) -> Result<Box<dyn BufRead + Send>, client::Error> {
        let params = WatchParams {
            label_selector: kind.label_selector.as_deref(),
            resource_version: rv,
            timeout_seconds: timeout_secs,
            idle_timeout: idle,
        };
        Client::watch(self, kind.resource, kind.namespace.as_deref(), &params)
    }
}

/// Exponential backoff with jitter: 0.8 s doubling to 30 s, as kube-runtime's default.
#[derive(Debug)]
pub struct Backoff {
    failures: u32,
}

impl Backoff {
    pub fn new() -> Backoff {
        Backoff { failures: 0 }
    }
    /// The next delay: 0.8 s · 2^failures, capped at 30 s, scaled by a random 0.8–1.2.
    pub fn next_delay(&mut self) -> Duration {
        let base = (800u64 << self.failures.min(10)).min(30_000) as f64;
        self.failures += 1;
        let jitter = 0.8 + 0.4 * util::rand_f64();
        Duration::from_millis((base * jitter).min(30_000.0) as u64)
    }
    pub fn reset(&mut self) {
        self.failures = 0;
    }
    pub fn failures(&self) -> u32 {
        self.failures
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff::new()
    }
}

/// How a watch stream ended.
#[derive(Debug, PartialEq)]
enum StreamEnd {
    /// The server closed it cleanly (its `timeoutSeconds` elapsed): re-watch from `rv`.
    Clean,
    /// ERROR 410 in the stream: our version is too old; relist.
    Expired,
    /// Nothing heard for the idle limit: the connection is given up; back off, re-watch.
    Stalled(String),
    /// An ERROR event of another kind, a read error or undecodable data: back off, re-watch.
    Failed(String),
}

enum State {
    List,
    Watch { rv: String },
}

/// One watcher thread's state.
pub struct Watcher<S: Source, W: Watched> {
    pub source: S,
    pub kind: Kind,
    pub policy: W,
    pub queue: Arc<Queue<W::Hint>>,
    /// Disconnected (its sender dropped) when the process shuts down.
    pub quit: Receiver<()>,
    /// Told once, after the first complete list.
    pub synced: Option<Sender<&'static str>>,
    /// How long a stream may say nothing before it is given up.
    pub idle_timeout: Duration,
    /// Every key seen since the last list, with the policy's memo of its last event.
    known: HashMap<String, u64>,
}

impl<S: Source, W: Watched> Watcher<S, W>
where
    W::Hint: Clone,
{
    pub fn new(
        source: S,
        kind: Kind,
        policy: W,
        queue: Arc<Queue<W::Hint>>,
        quit: Receiver<()>,
        synced: Sender<&'static str>,
        idle_timeout: Duration,
    ) -> Self {
        Watcher {
            source,
            kind,
            policy,
            queue,
            quit,
            synced: Some(synced),
            idle_timeout,
            known: HashMap::new(),
        }
    }

    fn name(&self) -> &'static str {
        self.kind.resource.short()
    }

    /// Runs until shutdown.
    pub fn run(mut self) {
        let mut state = State::List;
        let mut backoff = Backoff::new();
        loop {
            if self.quitting() {
                return;
            }
            state = match state {
                State::List => match self.relist() {
                    Ok(rv) => {
                        if let Some(tx) = self.synced.take() {
                            let _ = tx.send(self.name());
                        }
                        State::Watch { rv }
                    }
                    Err(e) => {
                        self.report_failure("list", &e, &backoff);
                        if !self.sleep(
                            backoff
                                .next_delay()
                                .max(e.retry_after().unwrap_or_default()),
                        ) {
                            return;
                        }
                        State::List
                    }
                },
                State::Watch { mut rv } => {
                    let started = Instant::now();
                    let timeout =
                        util::rand_range(WATCH_TIMEOUT_SECS.0, WATCH_TIMEOUT_SECS.1) as u32;
                    match self
                        .source
                        .watch(&self.kind, &rv, timeout, self.idle_timeout)
                    {
                        Err(e) if e.is_gone() => {
                            metrics::watch_closed(self.name());
                            log::debug!(target: "watcher", resource = self.name(), rv = rv.as_str(); "watch answered 410, relisting");
                            State::List
                        }
                        Err(e) => {
                            metrics::watch_closed(self.name());
                            self.report_failure("watch", &e, &backoff);
                            if !self.sleep(
                                backoff
                                    .next_delay()
                                    .max(e.retry_after().unwrap_or_default()),
                            ) {
                                return;
                            }
                            State::Watch { rv }
                        }
                        Ok(stream) => {
                            // The server accepted the watch: it is alive.
                            metrics::watch_opened(self.name());
                            let (end, heard) = self.consume(stream, &mut rv);
                            metrics::watch_closed(self.name());
                            if heard {
                                backoff.reset();
                            }
                            let why = match &end {
                                StreamEnd::Clean => Restart::Closed,
                                StreamEnd::Expired => Restart::Expired,
                                StreamEnd::Stalled(_) => Restart::Stalled,
                                StreamEnd::Failed(_) => Restart::Error,
                            };
                            metrics::watch_restarted(self.name(), why);
                            match end {
                                StreamEnd::Expired => {
                                    log::debug!(target: "watcher", resource = self.name(), rv = rv.as_str(); "resourceVersion expired, relisting");
                                    State::List
                                }
                                StreamEnd::Clean
                                    if heard || started.elapsed() >= MIN_HEALTHY_STREAM =>
                                {
                                    log::debug!(target: "watcher", resource = self.name(), rv = rv.as_str(); "watch ended, re-watching");
                                    State::Watch { rv }
                                }
                                StreamEnd::Clean => {
                                    log::debug!(target: "watcher", resource = self.name(), rv = rv.as_str(); "watch ended at once, backing off");
                                    if !self.sleep(backoff.next_delay()) {
                                        return;
                                    }
                                    State::Watch { rv }
                                }
                                StreamEnd::Stalled(error) | StreamEnd::Failed(error) => {
                                    let what = match why {
                                        Restart::Stalled => "watch went silent",
                                        _ => "watch failed",
                                    };
                                    if backoff.failures() >= 3 {
                                        log::warn!(target: "watcher", resource = self.name(), rv = rv.as_str(), error = error.as_str(), attempts = backoff.failures() + 1; "{what} again; resuming after a backoff");
                                    } else {
                                        log::debug!(target: "watcher", resource = self.name(), rv = rv.as_str(), error = error.as_str(); "{what}; resuming after a backoff");
                                    }
                                    if !self.sleep(backoff.next_delay()) {
                                        return;
                                    }
                                    State::Watch { rv }
                                }
                            }
                        }
                    }
                }
            };
        }
    }

    fn quitting(&self) -> bool {
        matches!(
            self.quit.try_recv(),
            Ok(()) | Err(crossbeam_channel::TryRecvError::Disconnected)
        )
    }

    /// Waits `d` unless shutdown comes first; returns whether to go on.
    fn sleep(&self, d: Duration) -> bool {
        matches!(self.quit.recv_timeout(d), Err(RecvTimeoutError::Timeout))
    }

    fn report_failure(&self, what: &str, e: &client::Error, backoff: &Backoff) {
        let error = e.to_string();
        if e.is_forbidden() || e.is_unauthorized() {
            // A person must fix RBAC or credentials; say so every time.
            log::warn!(target: "watcher", resource = self.name(), error = error.as_str(); "{what} denied; check the operator's RBAC and credentials");
        } else if backoff.failures() >= 3 {
            log::warn!(target: "watcher", resource = self.name(), error = error.as_str(), attempts = backoff.failures() + 1; "{what} keeps failing");
        } else {
            log::debug!(target: "watcher", resource = self.name(), error = error.as_str(); "{what} failed, backing off");
        }
    }

    /// Lists every page; enqueues every listed key and every known key that is gone; returns
    /// the list's resourceVersion. An expired continue token (410) restarts from the first page.
    fn relist(&mut self) -> Result<String, client::Error> {
        metrics::watch_relisted(self.name());
        let mut restarts = 0;
        'again: loop {
            let mut listed = HashMap::new();
            let mut token: Option<String> = None;
            loop {
                let page: ListPage<W::Object> =
                    match self.source.list_page(&self.kind, token.as_deref()) {
                        Ok(p) => p,
                        Err(e) if e.is_gone() && token.is_some() && restarts < 3 => {
                            restarts += 1;
                            continue 'again;
                        }
                        Err(e) => return Err(e),
                    };
                for o in &page.items {
                    if let Some(key) = self.policy.key_of(o) {
                        listed.insert(key, self.policy.memo(o));
                    }
                }
                match page.metadata.continue_token.filter(|t| !t.is_empty()) {
                    Some(t) => token = Some(t),
                    None => {
                        let rv = page.metadata.resource_version;
                        let vanished: HashSet<&String> = self
                            .known
                            .keys()
                            .filter(|k| !listed.contains_key(*k))
                            .collect();
                        let count = vanished.len();
                        for key in listed.keys().chain(vanished) {
                            self.queue.add(
                                key.clone(),
                                Trigger::Relist {
                                    resource: self.name(),
                                },
                            );
                        }
                        log::debug!(
                            target: "watcher",
                            resource = self.name(), rv = rv.as_str(), listed = listed.len(), vanished = count;
                            "listed"
                        );
                        self.known = listed;
                        metrics::watch_heard(self.name());
                        return Ok(rv);
                    }
                }
            }
        }
    }

    /// Reads a stream to its end, enqueuing keys; `rv` follows every event. Returns how the
    /// stream ended and whether the server said anything at all.
    fn consume(
        &mut self,
        mut stream: Box<dyn BufRead + Send>,
        rv: &mut String,
    ) -> (StreamEnd, bool) {
        let mut line = String::new();
        let mut heard = false;
        loop {
            line.clear();
            match stream.read_line(&mut line) {
                Ok(0) => return (StreamEnd::Clean, heard),
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
                    return (StreamEnd::Stalled(e.to_string()), heard)
                }
                Err(e) => return (StreamEnd::Failed(e.to_string()), heard),
            }
            if line.trim().is_empty() {
                continue;
            }
            heard = true;
            metrics::watch_heard(self.name());
            match self.handle_line(&line, rv) {
                Ok(()) => {}
                Err(end) => return (end, heard),
            }
            if self.quitting() {
                return (StreamEnd::Clean, heard);
            }
        }
    }

    /// Applies one event line. `Err` ends the stream.
    fn handle_line(&mut self, line: &str, rv: &mut String) -> Result<(), StreamEnd> {
        let undecodable =
            |e: serde_json::Error| StreamEnd::Failed(format!("undecodable event: {e}"));
        let ev: RawEvent = serde_json::from_str(line).map_err(undecodable)?;
        let event = match ev.type_ {
            "ERROR" => {
                let st: Status = serde_json::from_str(ev.object.get()).map_err(undecodable)?;
                if st.code == 410 {
                    return Err(StreamEnd::Expired);
                }
                return Err(StreamEnd::Failed(format!(
                    "watch error {} {}: {}",
                    st.code, st.reason, st.message
                )));
            }
            "BOOKMARK" => {
                let b: Bookmark = serde_json::from_str(ev.object.get()).map_err(undecodable)?;
                if !b.metadata.resource_version.is_empty() {
                    *rv = b.metadata.resource_version;
                }
                return Ok(());
            }
            // A static name, so a queued key's trigger costs no allocation for it.
            "ADDED" => "ADDED",
            "MODIFIED" => "MODIFIED",
            "DELETED" => "DELETED",
            other => {
                return Err(StreamEnd::Failed(format!(
                    "unknown watch event type {other:?}"
                )))
            }
        };
        let o: W::Object = serde_json::from_str(ev.object.get()).map_err(undecodable)?;
        let meta = W::meta(&o);
        if !meta.resource_version.is_empty() {
            rv.clone_from(&meta.resource_version);
        }
        let Some(key) = self.policy.key_of(&o) else {
            return Ok(());
        };
        let mut memo = self.known.get(&key).copied();
        let verdict = self.policy.on_event(event, &o, &mut memo);
        let queued = matches!(verdict, Verdict::Queue(_));
        log::trace!(
            target: "watcher",
            resource = self.name(), event = event, object = key.as_str(), rv = rv.as_str(), enqueue = queued;
            "event"
        );
        if event == "DELETED" {
            self.known.remove(&key);
        } else if let Some(m) = self.known.get_mut(&key) {
            *m = memo.unwrap_or_default();
        } else {
            self.known.insert(key.clone(), memo.unwrap_or_default());
        }
        if let Verdict::Queue(hint) = verdict {
            self.queue.add(
                key,
                Trigger::Watch {
                    resource: self.name(),
                    event,
                    rv: rv.clone(),
                    hint,
                },
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::immortal::lifecycle::{PodEvents, PodHint};
    use crate::testutil::fixture_events;
    use std::collections::VecDeque;
    use std::io::Cursor;
    use std::sync::Mutex;

    /// A scripted API: each call pops the next answer and records what was asked. Pages are
    /// JSON, decoded into whatever the watcher asks for, as the client does.
    /// A scripted watch: its lines, and how its stream ends (cleanly, or with a read error).
    type ScriptedWatch = Result<(String, Option<std::io::ErrorKind>), client::Error>;

    #[derive(Default)]
    struct Script {
        lists: Mutex<VecDeque<Result<serde_json::Value, client::Error>>>,
        watches: Mutex<VecDeque<ScriptedWatch>>,
        calls: Mutex<Vec<String>>,
        quit_tx: Mutex<Option<Sender<()>>>,
    }

    impl Source for &Script {
        fn list_page<T: DeserializeOwned>(
            &self,
            _: &Kind,
            token: Option<&str>,
        ) -> Result<ListPage<T>, client::Error> {
            self.calls
                .lock()
                .unwrap()
                .push(format!("list continue={}", token.unwrap_or("")));
            let next = self.lists.lock().unwrap().pop_front();
            let page =
                next.unwrap_or_else(|| Err(client::Error::Transport("no more lists".into())))?;
            Ok(serde_json::from_value(page).expect("a scripted page decodes"))
        }
        fn watch(
            &self,
            _: &Kind,
            rv: &str,
            _: u32,
            _: Duration,
        ) -> Result<Box<dyn BufRead + Send>, client::Error> {
            self.calls.lock().unwrap().push(format!("watch rv={rv}"));
            let next = self.watches.lock().unwrap().pop_front();
            match next {
                Some(r) => r.map(|(body, fails)| {
                    let stream = Scripted {
                        body: Cursor::new(body.into_bytes()),
                        fails,
                    };
                    Box::new(std::io::BufReader::new(stream)) as Box<dyn BufRead + Send>
                }),
                None => {
                    // Script exhausted: shut the watcher down.
                    self.quit_tx.lock().unwrap().take();
                    Ok(Box::new(Cursor::new(Vec::new())))
                }
            }
        }
    }

    /// A scripted stream body: its lines, then a clean end or a read error of kind `fails`.
    struct Scripted {
        body: Cursor<Vec<u8>>,
        fails: Option<std::io::ErrorKind>,
    }

    impl std::io::Read for Scripted {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            match (self.body.read(buf)?, self.fails) {
                (0, Some(kind)) => Err(std::io::Error::new(kind, "scripted")),
                (n, _) => Ok(n),
            }
        }
    }

    /// A PodList page of our pods, one per `(namespace, owner)`.
    fn page(rv: &str, pods: &[(&str, &str)], cont: Option<&str>) -> serde_json::Value {
        let items: Vec<serde_json::Value> = pods
            .iter()
            .map(|(ns, owner)| {
                serde_json::json!({
                    "metadata": {"name": format!("{owner}-immortalpod"), "namespace": ns,
                        "ownerReferences": [{"apiVersion": "immortalcontainer.flugel.it/v1alpha1",
                            "kind": "ImmortalContainer", "name": owner, "uid": "u", "controller": true}]}
                })
            })
            .collect();
        serde_json::json!({"metadata": {"resourceVersion": rv, "continue": cont}, "items": items})
    }

    fn gone() -> client::Error {
        client::Error::Api(Box::new(Status {
            code: 410,
            reason: "Expired".into(),
            ..Default::default()
        }))
    }

    /// Runs a pod watcher over `script` until the script runs out; returns the calls it made
    /// and the keys it queued with their triggers, in order.
    fn run(script: &Script) -> (Vec<String>, Vec<(String, String)>) {
        let queue = Arc::new(Queue::new());
        let (quit_tx, quit_rx) = crossbeam_channel::bounded(0);
        *script.quit_tx.lock().unwrap() = Some(quit_tx);
        let (synced_tx, synced_rx) = crossbeam_channel::unbounded();
        let kind = crate::immortal::lifecycle::pods_kind(None);
        let w = Watcher::new(
            script,
            kind,
            PodEvents,
            queue.clone(),
            quit_rx,
            synced_tx,
            DEFAULT_IDLE_TIMEOUT,
        );
        let handle = std::thread::scope(|s| s.spawn(move || w.run()).join());
        handle.unwrap();
        assert_eq!(
            synced_rx.try_recv().ok(),
            Some("pod"),
            "watcher must report its first list"
        );
        let mut queued = Vec::new();
        queue.shutdown();
        let st = queue.lock_for_tests();
        for k in st.0 {
            let t: Option<&Trigger<PodHint>> = st.1.get(&k);
            queued.push((k.clone(), t.map(|t| t.to_string()).unwrap_or_default()));
        }
        (script.calls.lock().unwrap().clone(), queued)
    }

    #[test]
    fn lists_then_watches_from_the_lists_resource_version() {
        let s = Script::default();
        s.lists
            .lock()
            .unwrap()
            .push_back(Ok(page("100", &[("ns", "a")], None)));
        let (calls, queued) = run(&s);
        assert_eq!(
            calls[..2],
            ["list continue=".to_string(), "watch rv=100".to_string()]
        );
        assert_eq!(queued, vec![("ns/a".to_string(), "pod relist".to_string())]);
    }

    #[test]
    fn follows_list_pages_with_continue() {
        let s = Script::default();
        s.lists
            .lock()
            .unwrap()
            .push_back(Ok(page("", &[("ns", "a")], Some("tok"))));
        s.lists
            .lock()
            .unwrap()
            .push_back(Ok(page("120", &[("ns", "b")], None)));
        let (calls, queued) = run(&s);
        assert_eq!(
            calls[..3],
            ["list continue=", "list continue=tok", "watch rv=120"].map(String::from)
        );
        assert_eq!(queued.len(), 2);
    }

    #[test]
    fn an_expired_continue_token_restarts_the_list_from_the_first_page() {
        let s = Script::default();
        s.lists
            .lock()
            .unwrap()
            .push_back(Ok(page("", &[("ns", "a")], Some("tok"))));
        s.lists.lock().unwrap().push_back(Err(gone()));
        s.lists
            .lock()
            .unwrap()
            .push_back(Ok(page("130", &[("ns", "a")], None)));
        let (calls, _) = run(&s);
        assert_eq!(
            calls[..4],
            [
                "list continue=",
                "list continue=tok",
                "list continue=",
                "watch rv=130"
            ]
            .map(String::from)
        );
    }

    #[test]
    fn recorded_stream_moves_the_version_through_bookmarks_and_rewatches_after_a_clean_end() {
        // The recorded stream: MODIFIED (Failed), MODIFIED (deleting), DELETED, BOOKMARK rv 970.
        let events = fixture_events("30-watch-pods-from-list-rv").join("\n") + "\n";
        let s = Script::default();
        s.lists
            .lock()
            .unwrap()
            .push_back(Ok(page("967", &[], None)));
        s.watches.lock().unwrap().push_back(Ok((events, None)));
        let (calls, queued) = run(&s);
        assert_eq!(
            calls[..3],
            ["list continue=", "watch rv=967", "watch rv=970"].map(String::from)
        );
        // Each event queued the owner, each replacing the last trigger; the pod is gone in the
        // end, which is what the reconcile that follows is told.
        assert_eq!(
            queued,
            vec![(
                "fixtures/example".to_string(),
                "pod DELETED rv=970 gone uid=c6f0852f-487c-4a9a-9867-b6cc2e7718f3".to_string()
            )]
        );
    }

    #[test]
    fn in_stream_410_relists_and_enqueues_objects_that_vanished() {
        let expired = fixture_events("28-watch-expired-resource-version-410").join("\n");
        let s = Script::default();
        s.lists
            .lock()
            .unwrap()
            .push_back(Ok(page("963", &[("ns", "a"), ("ns", "b")], None)));
        s.lists
            .lock()
            .unwrap()
            .push_back(Ok(page("990", &[("ns", "a")], None)));
        s.watches.lock().unwrap().push_back(Ok((expired, None)));
        let (calls, queued) = run(&s);
        assert_eq!(
            calls[..4],
            [
                "list continue=",
                "watch rv=963",
                "list continue=",
                "watch rv=990"
            ]
            .map(String::from)
        );
        let mut keys: Vec<_> = queued.into_iter().map(|(k, _)| k).collect();
        keys.sort();
        // ns/b's pod vanished while the watch was down: its owner is reconciled too.
        assert_eq!(keys, ["ns/a", "ns/b"]);
    }

    #[test]
    fn http_410_on_watch_relists() {
        let s = Script::default();
        s.lists.lock().unwrap().push_back(Ok(page("5", &[], None)));
        s.lists.lock().unwrap().push_back(Ok(page("9", &[], None)));
        s.watches.lock().unwrap().push_back(Err(gone()));
        let (calls, _) = run(&s);
        assert_eq!(
            calls[..4],
            [
                "list continue=",
                "watch rv=5",
                "list continue=",
                "watch rv=9"
            ]
            .map(String::from)
        );
    }

    #[test]
    fn a_failed_watch_backs_off_and_rewatches_from_the_same_version() {
        let s = Script::default();
        s.lists.lock().unwrap().push_back(Ok(page("5", &[], None)));
        s.watches
            .lock()
            .unwrap()
            .push_back(Err(client::Error::Transport("connection reset".into())));
        let start = Instant::now();
        let (calls, _) = run(&s);
        assert_eq!(
            calls[..3],
            ["list continue=", "watch rv=5", "watch rv=5"].map(String::from)
        );
        // The first backoff step is 0.8 s ± 20 %.
        assert!(
            start.elapsed() >= Duration::from_millis(640),
            "{:?}",
            start.elapsed()
        );
    }

    #[test]
    fn a_stream_gone_silent_is_resumed_from_its_last_version_without_a_relist() {
        let bookmark = r#"{"type":"BOOKMARK","object":{"kind":"Pod","apiVersion":"v1","metadata":{"resourceVersion":"8"}}}"#;
        let s = Script::default();
        s.lists.lock().unwrap().push_back(Ok(page("5", &[], None)));
        s.watches.lock().unwrap().push_back(Ok((
            format!("{bookmark}\n"),
            Some(std::io::ErrorKind::TimedOut),
        )));
        let (calls, _) = run(&s);
        assert_eq!(
            calls,
            ["list continue=", "watch rv=5", "watch rv=8"].map(String::from)
        );
        let text = metrics::render("h");
        let stalled = text
            .lines()
            .find_map(|l| {
                l.strip_prefix(
                    "immortal_watch_restarts_total{resource=\"pod\",reason=\"stalled\"} ",
                )
            })
            .and_then(|n| n.parse::<u64>().ok());
        assert!(stalled >= Some(1), "counted as stalled: {stalled:?}");
    }

    #[test]
    fn backoff_doubles_from_800ms_to_30s_with_jitter_and_resets() {
        let mut b = Backoff::new();
        let d: Vec<_> = (0..8).map(|_| b.next_delay().as_millis() as f64).collect();
        for (i, want) in [
            800.0, 1600.0, 3200.0, 6400.0, 12800.0, 25600.0, 30000.0, 30000.0,
        ]
        .iter()
        .enumerate()
        {
            assert!(
                d[i] >= want * 0.8 - 1.0 && d[i] <= (want * 1.2f64).min(30000.0),
                "step {i}: {}",
                d[i]
            );
        }
        b.reset();
        assert!(b.next_delay() <= Duration::from_millis(960));
    }

    #[test]
    fn an_error_event_carrying_410_ends_the_stream_for_a_relist() {
        let line = &fixture_events("28-watch-expired-resource-version-410")[0];
        let (quit_tx, quit_rx) = crossbeam_channel::bounded(0);
        let (synced_tx, _) = crossbeam_channel::unbounded();
        let s = Script::default();
        let kind = crate::immortal::lifecycle::pods_kind(None);
        let mut w = Watcher::new(
            &s,
            kind,
            PodEvents,
            Arc::new(Queue::new()),
            quit_rx,
            synced_tx,
            DEFAULT_IDLE_TIMEOUT,
        );
        let mut rv = "1".to_string();
        assert_eq!(w.handle_line(line, &mut rv), Err(StreamEnd::Expired));
        drop(quit_tx);
    }
}
