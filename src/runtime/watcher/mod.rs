//! Watcher threads, turning a resource's events into queue keys, with kube-runtime's state
//! machine: list, then watch from the list's resourceVersion; a clean end re-watches, a 410 or
//! a version the server has not reached relists, any other failure or a silent stream backs off
//! and re-watches (docs/design.md). What an event means is its [`EventHandler`]'s.

use crate::kube::client::{self, ListPage};
use crate::kube::types::{ObjectMeta, Status};
use crate::runtime::liveness::{self, Watch};
use crate::runtime::metrics::{self, Restart};
use crate::runtime::queue::{Priority, Queue, Trigger};
use crate::runtime::shutdown;
use crate::runtime::store::{Key, Store};
use crate::util;
use crossbeam_channel::{Receiver, Sender};
use serde::Deserialize;
use serde_json::value::RawValue;
use std::collections::HashMap;
use std::io::BufRead;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod event_handler;
mod source;

pub use event_handler::{EventHandler, Listed, Reaction};
pub use source::{Kind, Source};

/// Watch `timeoutSeconds`: under load balancers' idle timeouts, random against lockstep.
const WATCH_TIMEOUT_SECS: (u64, u64) = (170, 230);
/// A stream that ends this fast without a word is a failure, so that we cannot spin.
const MIN_HEALTHY_STREAM: Duration = Duration::from_secs(1);
/// How long a watch may say nothing: the API server's `defaultBookmarkFrequency` and some spare.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(75);

/// When a healthy watcher lists again, queueing every key: every `period` (jittered, so that
/// replicas do not line up) and whenever [`Relist::ask`]ed. Clones share the asks.
#[derive(Clone, Debug, Default)]
pub struct Relist {
    period: Option<Duration>,
    asked: Arc<AtomicU64>,
}

impl Relist {
    /// Every `period` (`None`: only when asked).
    pub fn every(period: Option<Duration>) -> Relist {
        Relist {
            period,
            asked: Arc::default(),
        }
    }

    /// Asks the watcher to list again after the next line its watch delivers, or when it ends.
    pub fn ask(&self) {
        self.asked.fetch_add(1, Ordering::Relaxed);
    }

    fn asked(&self) -> u64 {
        self.asked.load(Ordering::Relaxed)
    }

    /// When the next periodic relist is due after a list at `now`.
    fn next_after(&self, now: Instant) -> Option<Instant> {
        self.period
            .map(|p| now + p.mul_f64(0.9 + 0.2 * util::rand_f64()))
    }
}

/// One line of a watch stream, its object decoded once its type is known.
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

/// Exponential backoff with jitter, kube-runtime's default.
#[derive(Debug, Default)]
pub struct Backoff {
    failures: u32,
}

impl Backoff {
    pub fn new() -> Backoff {
        Backoff::default()
    }
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

/// How a watch stream ended.
#[derive(Debug, PartialEq)]
enum StreamEnd {
    /// The server closed it (its `timeoutSeconds`), or we stopped for shutdown or a relist.
    Clean,
    /// ERROR 410 in the stream: our version is too old; relist.
    Expired,
    /// ERROR 504 "Too large resource version": the server has not reached our version; relist.
    TooNew,
    /// Nothing heard for the idle limit: back off, re-watch.
    Stalled(String),
    /// An ERROR event of another kind, a read error or undecodable data: back off, re-watch.
    Failed(String),
    /// An object that did not decode and whose key could not be read: relist, to reconcile it.
    Unreadable,
}

enum State {
    /// List, after a watch that had reached `after` (`None`: the first list).
    List {
        after: Option<String>,
    },
    Watch {
        rv: String,
    },
}

pub struct Watcher<S: Source, W: EventHandler> {
    pub source: S,
    pub kind: Kind,
    pub handler: W,
    pub queue: Arc<Queue<W::Hint>>,
    /// Disconnected (its sender dropped) when the process shuts down.
    pub quit: Receiver<()>,
    /// Told of this watch's first list: once when it fails, and once when one completes.
    pub synced: Option<Sender<&'static Watch>>,
    /// Whether `synced` was told of a failed first list.
    told_failure: bool,
    /// The stream or the server failed since the last watch opened (see [`Watcher::behind`]).
    failed: bool,
    pub idle_timeout: Duration,
    pub relists: Relist,
    /// Every key seen since the last list, with its cached copy; watchers of several namespaces
    /// share it.
    known: Arc<Store<W::Cached>>,
    /// This watch's liveness, for `/readyz` and the metrics.
    live: &'static Watch,
    /// The asks of `relists` the last list answered, and when the next periodic one is due.
    relisted: (u64, Option<Instant>),
    /// Whether a WARN said this watch was failing: its working again is then said at INFO.
    warned: bool,
    /// Whether a WARN said the failures are 404s: one WARN for them, not one per retry.
    missing: bool,
    /// Events skipped since the last one that decoded (see [`Watcher::skip_undecodable`]).
    skipped: u64,
    /// Another store's copy of a key, for this one to share (see [`Watcher::keys_from`]).
    shared_key: Option<SharedKey>,
}

/// Finds another store's copy of a key.
pub type SharedKey = Box<dyn Fn(&str) -> Option<Key> + Send>;

impl<S: Source, W: EventHandler> Watcher<S, W>
where
    W::Hint: Clone,
{
    pub fn new(
        source: S,
        kind: Kind,
        handler: W,
        queue: Arc<Queue<W::Hint>>,
        quit: Receiver<()>,
        synced: Sender<&'static Watch>,
        idle_timeout: Duration,
    ) -> Self {
        let live = liveness::watch(kind.resource.short(), kind.namespace.as_deref());
        Watcher {
            source,
            live,
            kind,
            handler,
            queue,
            quit,
            synced: Some(synced),
            told_failure: false,
            failed: false,
            idle_timeout,
            relists: Relist::default(),
            known: Arc::new(Store::new()),
            relisted: (0, None),
            warned: false,
            missing: false,
            skipped: 0,
            shared_key: None,
        }
    }

    /// The same watcher, storing a key new to its store as the copy `shared` finds, if any.
    pub fn keys_from(mut self, shared: SharedKey) -> Self {
        self.shared_key = Some(shared);
        self
    }

    /// `key` as the store and the queue keep it: another store's copy where there is one.
    fn key_for(&self, key: String) -> Key {
        match &self.shared_key {
            Some(find) => find(&key).unwrap_or_else(|| key.into()),
            None => key.into(),
        }
    }

    /// The same watcher, keeping what it knows in `store`, which others may read.
    pub fn sharing(mut self, store: Arc<Store<W::Cached>>) -> Self {
        self.known = store;
        self
    }

    /// The same watcher, listing again as `relists` says.
    pub fn relisting(mut self, relists: Relist) -> Self {
        self.relists = relists;
        self
    }

    /// Whether a relist is due: asked for since the last list, or its period is over.
    fn relist_due(&self) -> bool {
        let (asks, next) = self.relisted;
        self.relists.asked() != asks || next.is_some_and(|t| Instant::now() >= t)
    }

    fn name(&self) -> &'static str {
        self.kind.resource.short()
    }

    /// The namespace its log lines name: its own, or `(all)`.
    fn ns(&self) -> &'static str {
        self.live.namespace.unwrap_or("(all)")
    }

    /// Runs until shutdown; every wait ends early when it comes.
    pub fn run(mut self) {
        let mut state = State::List { after: None };
        let mut backoff = Backoff::new();
        while !shutdown::is_quitting(&self.quit) {
            state = match state {
                State::List { after } => self.list(after, &mut backoff),
                State::Watch { rv } => self.watch(rv, &mut backoff),
            };
        }
    }

    /// Lists, telling `synced` how the first list went.
    fn list(&mut self, after: Option<String>, backoff: &mut Backoff) -> State {
        match self.relist(after.as_deref()) {
            Ok(rv) => {
                // The list's version is the server's: nothing to ask before its watch.
                self.failed = false;
                self.working();
                self.live.listed();
                if let Some(tx) = self.synced.take() {
                    let _ = tx.send(self.live);
                }
                State::Watch { rv }
            }
            Err(e) => {
                self.live.list_failed(e.to_string());
                if let (Some(tx), false) = (&self.synced, self.told_failure) {
                    self.told_failure = true;
                    let _ = tx.send(self.live);
                }
                self.fail_and_wait("list", &e, backoff);
                State::List { after }
            }
        }
    }

    /// Whether the server, back after a failure, is at a version below `rv` (etcd restored from
    /// a snapshot): a watch from `rv` would hear nothing. `Err`: it could not say.
    fn behind(&mut self, rv: &str) -> Result<bool, client::Error> {
        if !std::mem::take(&mut self.failed) {
            return Ok(false);
        }
        let now = self
            .source
            .version(&self.kind)
            .inspect_err(|_| self.failed = true)?;
        let below = now.parse::<u64>().ok().zip(rv.parse::<u64>().ok());
        Ok(below.is_some_and(|(now, rv)| now < rv))
    }

    fn watch(&mut self, mut rv: String, backoff: &mut Backoff) -> State {
        let (name, ns, started) = (self.name(), self.ns(), Instant::now());
        match self.behind(&rv) {
            Ok(true) => {
                log::debug!(target: "watcher", resource = name, namespace = ns, rv = rv.as_str(); "the server is back at a version below the watch's, relisting");
                return State::List { after: Some(rv) };
            }
            Ok(false) => {}
            Err(e) => {
                self.fail_and_wait("watch", &e, backoff);
                return State::Watch { rv };
            }
        }
        let secs = util::rand_range(WATCH_TIMEOUT_SECS.0, WATCH_TIMEOUT_SECS.1) as u32;
        let stream = match self.source.watch(&self.kind, &rv, secs, self.idle_timeout) {
            Ok(stream) => stream,
            Err(e) => {
                self.live.closed();
                if e.is_gone() {
                    log::debug!(target: "watcher", resource = name, namespace = ns, rv = rv.as_str(); "watch answered 410, relisting");
                    return State::List { after: Some(rv) };
                }
                if e.is_resource_version_too_large() {
                    log::debug!(target: "watcher", resource = name, namespace = ns, rv = rv.as_str(); "watch answered that the server has not reached its version, relisting");
                    return State::List { after: Some(rv) };
                }
                self.failed = true;
                self.fail_and_wait("watch", &e, backoff);
                return State::Watch { rv };
            }
        };
        // The server accepted the watch: it is alive.
        self.live.opened();
        self.working();
        let (end, heard) = self.consume(stream, &mut rv);
        self.live.closed();
        if heard {
            backoff.reset();
        }
        let why = match &end {
            StreamEnd::Clean => Restart::Closed,
            StreamEnd::Expired => Restart::Expired,
            StreamEnd::TooNew => Restart::Error,
            StreamEnd::Stalled(_) => Restart::Stalled,
            StreamEnd::Failed(_) | StreamEnd::Unreadable => Restart::Error,
        };
        metrics::watch_restarted(self.live, why);
        self.failed = matches!(end, StreamEnd::Stalled(_) | StreamEnd::Failed(_));
        let after = Some(rv.clone());
        match end {
            StreamEnd::Expired | StreamEnd::TooNew | StreamEnd::Unreadable => {
                let why = match end {
                    StreamEnd::Expired => "resourceVersion expired",
                    StreamEnd::TooNew => "the server has not reached the watch's version",
                    _ => "an event's object could not be read",
                };
                log::debug!(target: "watcher", resource = name, namespace = ns, rv = rv.as_str(); "{why}, relisting");
                return State::List { after };
            }
            StreamEnd::Clean if self.relist_due() => {
                log::info!(target: "watcher", resource = name, namespace = ns, rv = rv.as_str(); "relist: listing again, every object is reconciled");
                return State::List { after };
            }
            StreamEnd::Clean if heard || started.elapsed() >= MIN_HEALTHY_STREAM => {
                log::debug!(target: "watcher", resource = name, namespace = ns, rv = rv.as_str(); "watch ended, re-watching");
                return State::Watch { rv };
            }
            StreamEnd::Clean => {
                log::debug!(target: "watcher", resource = name, namespace = ns, rv = rv.as_str(); "watch ended at once, backing off");
            }
            StreamEnd::Stalled(error) => {
                // Said every time: a silent dead connection is worth a person's look.
                self.warned = true;
                log::warn!(
                    target: "watcher",
                    resource = name, namespace = ns, rv = rv.as_str(), error = error.as_str(),
                    idle_ms = self.idle_timeout.as_millis() as u64;
                    "watch said nothing for {}s: given up as dead, with every pooled connection to the server; resuming",
                    self.idle_timeout.as_secs()
                );
                self.source.connections_dead();
            }
            StreamEnd::Failed(error) if backoff.failures() >= 3 => {
                self.warned = true;
                log::warn!(target: "watcher", resource = name, namespace = ns, rv = rv.as_str(), error = error.as_str(), attempts = backoff.failures() + 1; "watch failed again; resuming after a backoff");
            }
            StreamEnd::Failed(error) => {
                log::debug!(target: "watcher", resource = name, namespace = ns, rv = rv.as_str(), error = error.as_str(); "watch failed; resuming after a backoff");
            }
        }
        let _ = self.quit.recv_timeout(backoff.next_delay());
        State::Watch { rv }
    }

    /// Logs a failed list or watch request, then waits out the backoff or `Retry-After`.
    fn fail_and_wait(&mut self, what: &str, e: &client::Error, backoff: &mut Backoff) {
        let error = e.to_string();
        if e.is_not_found() && !self.missing {
            // Said once: every retry answers the same until someone installs it again.
            let why = self
                .kind
                .if_missing
                .unwrap_or("the API server does not serve this resource");
            log::warn!(target: "watcher", resource = self.name(), namespace = self.ns(), error = error.as_str(); "{what} answered 404: {why}; retrying until it is served");
            self.missing = true;
            self.warned = true;
        } else if e.is_forbidden() || e.is_unauthorized() {
            // A person must fix RBAC or credentials; say so every time.
            self.warned = true;
            log::warn!(target: "watcher", resource = self.name(), namespace = self.ns(), error = error.as_str(); "{what} denied; check the operator's RBAC and credentials");
        } else if !e.is_not_found() && backoff.failures() >= 3 {
            self.warned = true;
            log::warn!(target: "watcher", resource = self.name(), namespace = self.ns(), error = error.as_str(), attempts = backoff.failures() + 1; "{what} keeps failing");
        } else {
            log::debug!(target: "watcher", resource = self.name(), namespace = self.ns(), error = error.as_str(); "{what} failed, backing off");
        }
        let (delay, retry_after) = (backoff.next_delay(), e.retry_after().unwrap_or_default());
        let _ = self.quit.recv_timeout(delay.max(retry_after));
    }

    /// A list or watch was answered: says so at INFO if its failing was said at WARN.
    fn working(&mut self) {
        if self.warned {
            log::info!(target: "watcher", resource = self.name(), namespace = self.ns(); "watch works again");
        }
        self.warned = false;
        self.missing = false;
    }

    /// Lists, queues every listed key and (urgent) every known key that is gone, and returns
    /// the list's resourceVersion. `after`: the version the watch before it had reached.
    fn relist(&mut self, after: Option<&str>) -> Result<String, client::Error> {
        metrics::watch_relisted(self.live);
        // What was asked before this list is answered by it.
        let asks = self.relists.asked();
        let (listed, rv) = self.list_pages()?;
        let version = rv.parse::<u64>().ok();
        let seen = after.and_then(|a| a.parse::<u64>().ok());
        // A list's version falls below a watch's only when etcd's history went back.
        let rewound = version.zip(seen).is_some_and(|(v, seen)| v < seen);
        if rewound {
            log::warn!(
                target: "watcher",
                resource = self.name(), namespace = self.ns(), rv = rv.as_str(), after = after.unwrap_or("");
                "the API server's resourceVersion went back, from {} to {rv}: etcd was restored from a snapshot; what it lists now replaces everything known before",
                after.unwrap_or("")
            );
        }
        let listed_as = Listed { version, rewound };
        let mut listed_keys: Vec<(Key, Priority)> = Vec::with_capacity(listed.len());
        // The list replaces what was known; what is left of that vanished.
        let vanished: Vec<Key> = {
            let mut known = self.known.write();
            let mut before: HashMap<Key, W::Cached> = match &self.kind.namespace {
                None => std::mem::replace(&mut *known, HashMap::with_capacity(listed.len())),
                // The other namespaces' keys are their watchers' to keep.
                Some(ns) => known
                    .extract_if(|key, _| key.split_once('/').is_some_and(|(n, _)| n == ns))
                    .collect(),
            };
            for (key, new) in listed {
                let (key, cached) = match before.remove_entry(key.as_str()) {
                    Some((key, old)) => (key, self.handler.relisted(old, new, &listed_as)),
                    None => (self.key_for(key), new),
                };
                listed_keys.push((key.clone(), self.handler.relist_priority(&cached)));
                known.insert(key, cached);
            }
            before.into_keys().collect()
        };
        let (resource, listed, count) = (self.name(), listed_keys.len(), vanished.len());
        let relist = Trigger::Relist { resource };
        for (key, priority) in listed_keys {
            self.queue.add(key, relist.clone(), priority);
        }
        for key in vanished {
            self.queue.add(key, relist.clone(), Priority::Urgent);
        }
        log::debug!(target: "watcher", resource = resource, namespace = self.ns(), rv = rv.as_str(), listed = listed, vanished = count; "listed");
        self.relisted = (asks, self.relists.next_after(Instant::now()));
        self.live.heard();
        Ok(rv)
    }

    /// Every page of a list, each key with its cached copy, and the list's resourceVersion; an
    /// expired continue token (410) restarts it, three times at most.
    fn list_pages(&self) -> Result<(HashMap<String, W::Cached>, String), client::Error> {
        let (mut listed, mut token, mut restarts) = (HashMap::new(), None::<String>, 0);
        loop {
            let page: ListPage<W::Object> =
                match self.source.list_page(&self.kind, token.as_deref()) {
                    Ok(p) => p,
                    Err(e) if e.is_gone() && token.is_some() && restarts < 3 => {
                        (listed, token, restarts) = (HashMap::new(), None, restarts + 1);
                        continue;
                    }
                    Err(e) => return Err(e),
                };
            for o in &page.items {
                if let Some(key) = self.handler.key_of(o) {
                    listed.insert(key, self.handler.cached(o));
                }
            }
            match page.metadata.continue_token.filter(|t| !t.is_empty()) {
                Some(t) => token = Some(t),
                None => return Ok((listed, page.metadata.resource_version)),
            }
        }
    }

    /// Reads a stream to its end, `rv` following every event: how it ended, and if anything came.
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
            self.live.heard();
            if let Err(end) = self.handle_line(&line, rv) {
                return (end, heard);
            }
            if shutdown::is_quitting(&self.quit) || self.relist_due() {
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
                if st.is_resource_version_too_large() {
                    return Err(StreamEnd::TooNew);
                }
                let why = format!("watch error {} {}: {}", st.code, st.reason, st.message);
                return Err(StreamEnd::Failed(why));
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
        let o: W::Object = match serde_json::from_str(ev.object.get()) {
            Ok(o) => o,
            Err(e) => return self.skip_undecodable(event, ev.object.get(), &e, rv),
        };
        if self.skipped > 0 {
            log::info!(target: "watcher", resource = self.name(), namespace = self.ns(), skipped = self.skipped; "watch events decode again");
            self.skipped = 0;
        }
        let meta = W::meta(&o);
        if !meta.resource_version.is_empty() {
            rv.clone_from(&meta.resource_version);
        }
        let Some(key) = self.handler.key_of(&o) else {
            return Ok(());
        };
        let (verdict, key) = self.known.entry(self.key_for(key), |cached| {
            self.handler.on_event(event, &o, cached)
        });
        let queued = matches!(verdict, Reaction::Queue(..));
        log::trace!(
            target: "watcher",
            resource = self.name(), event = event, object = &*key, rv = rv.as_str(), enqueue = queued;
            "event"
        );
        if let Reaction::Queue(hint, priority) = verdict {
            self.queue.add(key, self.trigger(event, rv, hint), priority);
        }
        Ok(())
    }

    fn trigger(&self, event: &'static str, rv: &str, hint: Option<W::Hint>) -> Trigger<W::Hint> {
        Trigger::Watch {
            resource: self.name(),
            event,
            rv: rv.parse().unwrap_or(0),
            hint,
        }
    }

    /// An object that does not decode is skipped, not the watch stopped: its key is queued
    /// (urgent), or with no key to be had, everything is listed again. One WARN an episode.
    fn skip_undecodable(
        &mut self,
        event: &'static str,
        raw: &str,
        error: &serde_json::Error,
        rv: &mut String,
    ) -> Result<(), StreamEnd> {
        self.skipped += 1;
        // Loosely: a version may be had where the metadata does not decode.
        let object: serde_json::Value = serde_json::from_str(raw).unwrap_or_default();
        let version = object["metadata"]["resourceVersion"].as_str().unwrap_or("");
        if !version.is_empty() {
            *rv = version.to_string();
        }
        let meta = serde_json::from_str::<Bookmark>(raw).map(|b| b.metadata);
        let key = meta.ok().and_then(|m| self.handler.key_of_meta(&m));
        let object = key.as_deref().unwrap_or("unknown");
        let error = error.to_string();
        if self.skipped == 1 {
            log::warn!(
                target: "watcher",
                resource = self.name(), event = event, object = object, rv = rv.as_str(), error = error.as_str();
                "a watch event's object does not decode: skipped, its object queued (or everything listed again); later ones are counted until one decodes"
            );
        } else {
            log::debug!(target: "watcher", resource = self.name(), event = event, object = object, rv = rv.as_str(), error = error.as_str(); "undecodable event skipped");
        }
        let Some(key) = key else {
            return Err(StreamEnd::Unreadable);
        };
        self.queue
            .add(key.into(), self.trigger(event, rv, None), Priority::Urgent);
        Ok(())
    }
}

#[cfg(test)]
pub mod script;
#[cfg(test)]
mod tests;
