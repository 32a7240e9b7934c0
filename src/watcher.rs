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
//! A watcher keeps no object: only the last resourceVersion and the set of keys it has seen,
//! which a relist needs to enqueue objects that vanished while the watch was down.

use crate::client::{self, Client, ListPage, ListParams, Resource, WatchParams};
use crate::metrics;
use crate::queue::{Queue, TerminatedPod, Trigger};
use crate::resources::{self, ObjectMeta, IMAGE_ANNOTATION};
use crate::util;
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use serde::Deserialize;
use std::collections::HashSet;
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

/// What a watch event carries that the operator looks at. Everything else is skipped while
/// decoding, so a watcher's memory does not grow with the size of the objects it sees.
#[derive(Debug, Default, Deserialize)]
pub struct Seen {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub status: SeenStatus,
    /// Set when the object is a `Status` (the object of an ERROR event).
    #[serde(default)]
    pub code: u16,
    #[serde(default)]
    pub reason: String,
    #[serde(default)]
    pub message: String,
}

/// A pod's or an ImmortalContainer's `status`, or the `"Failure"` string of a `Status`.
#[derive(Debug, Default, Deserialize)]
#[serde(untagged)]
pub enum SeenStatus {
    Object {
        #[serde(default)]
        phase: Option<String>,
        #[serde(default, rename = "observedGeneration")]
        observed_generation: Option<i64>,
    },
    Text(String),
    #[default]
    Missing,
}

impl Seen {
    fn phase(&self) -> Option<&str> {
        match &self.status {
            SeenStatus::Object { phase, .. } => phase.as_deref(),
            _ => None,
        }
    }
    /// In a terminal phase, which a pod never leaves (as [`resources::Pod::is_terminated`]).
    fn is_terminated(&self) -> bool {
        matches!(self.phase(), Some("Succeeded" | "Failed"))
    }
    fn observed_generation(&self) -> Option<i64> {
        match &self.status {
            SeenStatus::Object {
                observed_generation,
                ..
            } => *observed_generation,
            _ => None,
        }
    }
}

#[derive(Debug, Deserialize)]
struct WatchEvent {
    #[serde(rename = "type")]
    type_: String,
    #[serde(default)]
    object: Seen,
}

/// One watched resource: where it lives and how its objects map to queue keys.
#[derive(Clone)]
pub struct Kind {
    pub resource: Resource,
    /// Watch one namespace, or all when `None`.
    pub namespace: Option<String>,
    pub label_selector: Option<String>,
    /// The ImmortalContainer key an object stands for, or `None` when it is none of ours.
    pub key_of: fn(&Seen) -> Option<String>,
    /// Whether this event can change what a reconcile of that key would do.
    pub relevant: fn(&str, &Seen) -> bool,
    /// What the event tells reconcile beyond the key, as a more precise trigger.
    pub hint: fn(&str, &Seen) -> Option<TerminatedPod>,
}

impl Kind {
    /// ImmortalContainers: every object is its own key.
    pub fn immortal_containers(namespace: Option<String>) -> Kind {
        Kind {
            resource: Resource::ImmortalContainers,
            namespace,
            label_selector: None,
            key_of: |o| Some(resources::key(&o.metadata.namespace, &o.metadata.name)),
            relevant: ic_event_relevant,
            hint: |_, _| None,
        }
    }

    /// Pods: only those we created (selected by label server-side), mapped to the
    /// ImmortalContainer that controls them.
    pub fn pods(namespace: Option<String>) -> Kind {
        Kind {
            resource: Resource::Pods,
            namespace,
            label_selector: Some(format!(
                "{}={}",
                resources::MANAGED_BY_LABEL,
                resources::MANAGED_BY_VALUE
            )),
            key_of: pod_owner_key,
            relevant: pod_event_relevant,
            hint: terminated_pod,
        }
    }
}

/// A spec change (generation ahead of what status says we observed) or a new object needs a
/// reconcile; our own status writes come back as MODIFIED events too, and do not. Deletions
/// need nothing: the garbage collector removes the pod.
pub fn ic_event_relevant(event: &str, o: &Seen) -> bool {
    match event {
        "ADDED" => true,
        "MODIFIED" => o.metadata.generation != o.observed_generation(),
        _ => false,
    }
}

/// A pod needs its owner reconciled when it is gone or terminated. A pod that is merely
/// starting, or already being deleted (its DELETED event follows), does not: skipping those
/// keeps a pod's start-up from costing API calls. Nor does a pod whose running image differs
/// from the one it was created for: that is an admission webhook's or a person's doing, and
/// reconcile leaves it (see `reconcile`); a change of `spec.image` arrives as an
/// ImmortalContainer event.
///
/// The deletion of a pod that had terminated needs nothing either: the event saying it
/// terminated came first on this stream and queued its owner, whose reconcile replaces it
/// (usually by deleting it itself). A gap in the stream is covered by the relist that follows.
pub fn pod_event_relevant(event: &str, o: &Seen) -> bool {
    let terminated = o.is_terminated();
    if event == "DELETED" {
        return !terminated;
    }
    if o.metadata.deletion_timestamp.is_some() {
        return false;
    }
    // Not shaped as we create pods (no image annotation): let reconcile look at it.
    terminated || !o.metadata.annotations.contains_key(IMAGE_ANNOTATION)
}

/// A live pod in a terminal phase, named for the reconcile that replaces it: it may delete
/// the pod by uid instead of reading it first (one request less per replaced pod).
pub fn terminated_pod(event: &str, o: &Seen) -> Option<TerminatedPod> {
    if event == "DELETED" || !o.is_terminated() || o.metadata.uid.is_empty() {
        return None;
    }
    let owner = o.metadata.controller()?;
    Some(TerminatedPod {
        name: o.metadata.name.clone(),
        uid: o.metadata.uid.clone(),
        owner_uid: owner.uid.clone(),
    })
}

/// The key of the ImmortalContainer controlling a pod.
pub fn pod_owner_key(o: &Seen) -> Option<String> {
    let owner = o
        .metadata
        .controller()
        .filter(|r| r.is_immortal_container())?;
    Some(resources::key(&o.metadata.namespace, &owner.name))
}

/// Where a watcher gets its lists and streams: the API client, or a script in tests.
pub trait Source {
    fn list_page(
        &self,
        kind: &Kind,
        continue_token: Option<&str>,
    ) -> Result<ListPage<Seen>, client::Error>;
    fn watch(
        &self,
        kind: &Kind,
        rv: &str,
        timeout_secs: u32,
    ) -> Result<Box<dyn BufRead + Send>, client::Error>;
}

impl Source for Client {
    fn list_page(
        &self,
        kind: &Kind,
        continue_token: Option<&str>,
    ) -> Result<ListPage<Seen>, client::Error> {
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
    ) -> Result<Box<dyn BufRead + Send>, client::Error> {
        let params = WatchParams {
            label_selector: kind.label_selector.as_deref(),
            resource_version: rv,
            timeout_seconds: timeout_secs,
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
    /// An ERROR event of another kind, a read error or undecodable data: back off, re-watch.
    Failed(String),
}

enum State {
    List,
    Watch { rv: String },
}

/// One watcher thread's state.
pub struct Watcher<S: Source> {
    pub source: S,
    pub kind: Kind,
    pub queue: Arc<Queue>,
    /// Disconnected (its sender dropped) when the process shuts down.
    pub quit: Receiver<()>,
    /// Told once, after the first complete list.
    pub synced: Option<Sender<&'static str>>,
    known: HashSet<String>,
}

impl<S: Source> Watcher<S> {
    pub fn new(
        source: S,
        kind: Kind,
        queue: Arc<Queue>,
        quit: Receiver<()>,
        synced: Sender<&'static str>,
    ) -> Self {
        Watcher {
            source,
            kind,
            queue,
            quit,
            synced: Some(synced),
            known: HashSet::new(),
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
                    match self.source.watch(&self.kind, &rv, timeout) {
                        Err(e) if e.is_gone() => {
                            log::debug!(target: "watcher", resource = self.name(), rv = rv.as_str(); "watch answered 410, relisting");
                            State::List
                        }
                        Err(e) => {
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
                            metrics::watch_heard(self.name());
                            let (end, heard) = self.consume(stream, &mut rv);
                            if heard {
                                backoff.reset();
                            }
                            metrics::watch_restarted(self.name());
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
                                StreamEnd::Failed(error) => {
                                    log::debug!(target: "watcher", resource = self.name(), rv = rv.as_str(), error = error.as_str(); "watch failed, backing off");
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
            let mut listed = HashSet::new();
            let mut token: Option<String> = None;
            loop {
                let page = match self.source.list_page(&self.kind, token.as_deref()) {
                    Ok(p) => p,
                    Err(e) if e.is_gone() && token.is_some() && restarts < 3 => {
                        restarts += 1;
                        continue 'again;
                    }
                    Err(e) => return Err(e),
                };
                listed.extend(page.items.iter().filter_map(|o| (self.kind.key_of)(o)));
                match page.metadata.continue_token.filter(|t| !t.is_empty()) {
                    Some(t) => token = Some(t),
                    None => {
                        let rv = page.metadata.resource_version;
                        let vanished = self.known.difference(&listed).count();
                        for key in listed.iter().chain(self.known.difference(&listed)) {
                            self.queue.add(
                                key.clone(),
                                Trigger::Relist {
                                    resource: self.name(),
                                },
                            );
                        }
                        log::debug!(
                            target: "watcher",
                            resource = self.name(), rv = rv.as_str(), listed = listed.len(), vanished = vanished;
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
        let ev: WatchEvent = serde_json::from_str(line)
            .map_err(|e| StreamEnd::Failed(format!("undecodable event: {e}")))?;
        match ev.type_.as_str() {
            "ERROR" => {
                let o = &ev.object;
                if o.code == 410 {
                    return Err(StreamEnd::Expired);
                }
                Err(StreamEnd::Failed(format!(
                    "watch error {} {}: {}",
                    o.code, o.reason, o.message
                )))
            }
            "BOOKMARK" => {
                if !ev.object.metadata.resource_version.is_empty() {
                    *rv = ev.object.metadata.resource_version;
                }
                Ok(())
            }
            event @ ("ADDED" | "MODIFIED" | "DELETED") => {
                // A static name, so a queued key's trigger costs no allocation for it.
                let event = match event {
                    "ADDED" => "ADDED",
                    "MODIFIED" => "MODIFIED",
                    _ => "DELETED",
                };
                let o = &ev.object;
                if !o.metadata.resource_version.is_empty() {
                    rv.clone_from(&o.metadata.resource_version);
                }
                let Some(key) = (self.kind.key_of)(o) else {
                    return Ok(());
                };
                let relevant = (self.kind.relevant)(event, o);
                log::trace!(
                    target: "watcher",
                    resource = self.name(), event = event, object = key.as_str(), rv = rv.as_str(), enqueue = relevant;
                    "event"
                );
                if event == "DELETED" {
                    self.known.remove(&key);
                } else if !self.known.contains(&key) {
                    self.known.insert(key.clone());
                }
                if relevant {
                    let trigger = match (self.kind.hint)(event, o) {
                        Some(pod) => Trigger::PodTerminated {
                            event,
                            rv: rv.clone(),
                            pod,
                        },
                        None => Trigger::Watch {
                            resource: self.name(),
                            event,
                            rv: rv.clone(),
                        },
                    };
                    self.queue.add(key, trigger);
                }
                Ok(())
            }
            other => Err(StreamEnd::Failed(format!(
                "unknown watch event type {other:?}"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::Status;
    use crate::testutil::fixture_events;
    use std::collections::VecDeque;
    use std::io::Cursor;
    use std::sync::Mutex;

    /// A scripted API: each call pops the next answer and records what was asked.
    #[derive(Default)]
    struct Script {
        lists: Mutex<VecDeque<Result<ListPage<Seen>, client::Error>>>,
        watches: Mutex<VecDeque<Result<String, client::Error>>>,
        calls: Mutex<Vec<String>>,
        quit_tx: Mutex<Option<Sender<()>>>,
    }

    impl Source for &Script {
        fn list_page(
            &self,
            _: &Kind,
            token: Option<&str>,
        ) -> Result<ListPage<Seen>, client::Error> {
            self.calls
                .lock()
                .unwrap()
                .push(format!("list continue={}", token.unwrap_or("")));
            self.next_list()
        }
        fn watch(
            &self,
            _: &Kind,
            rv: &str,
            _: u32,
        ) -> Result<Box<dyn BufRead + Send>, client::Error> {
            self.calls.lock().unwrap().push(format!("watch rv={rv}"));
            let next = self.watches.lock().unwrap().pop_front();
            match next {
                Some(r) => r.map(|body| {
                    Box::new(Cursor::new(body.into_bytes())) as Box<dyn BufRead + Send>
                }),
                None => {
                    // Script exhausted: shut the watcher down.
                    self.quit_tx.lock().unwrap().take();
                    Ok(Box::new(Cursor::new(Vec::new())))
                }
            }
        }
    }

    impl Script {
        fn next_list(&self) -> Result<ListPage<Seen>, client::Error> {
            self.lists
                .lock()
                .unwrap()
                .pop_front()
                .unwrap_or_else(|| Err(client::Error::Transport("no more lists".into())))
        }
    }

    fn page(rv: &str, pods: &[(&str, &str)], cont: Option<&str>) -> ListPage<Seen> {
        let items = pods
            .iter()
            .map(|(ns, owner)| {
                serde_json::from_value(serde_json::json!({
                    "metadata": {"name": format!("{owner}-immortalpod"), "namespace": ns,
                        "ownerReferences": [{"apiVersion": "immortalcontainer.flugel.it/v1alpha1",
                            "kind": "ImmortalContainer", "name": owner, "uid": "u", "controller": true}]}
                }))
                .unwrap()
            })
            .collect();
        ListPage {
            metadata: client::ListMeta {
                resource_version: rv.into(),
                continue_token: cont.map(String::from),
            },
            items,
        }
    }

    fn gone() -> client::Error {
        client::Error::Api(Box::new(Status {
            code: 410,
            reason: "Expired".into(),
            ..Default::default()
        }))
    }

    /// Runs a pod watcher over `script` until the script runs out; returns the calls it made
    /// and the keys it queued, in order.
    fn run(script: &Script) -> (Vec<String>, Vec<(String, String)>) {
        let queue = Arc::new(Queue::new());
        let (quit_tx, quit_rx) = crossbeam_channel::bounded(0);
        *script.quit_tx.lock().unwrap() = Some(quit_tx);
        let (synced_tx, synced_rx) = crossbeam_channel::unbounded();
        let w = Watcher::new(script, Kind::pods(None), queue.clone(), quit_rx, synced_tx);
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
            queued.push((
                k.clone(),
                st.1.get(&k).map(|t| t.to_string()).unwrap_or_default(),
            ));
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
        s.watches.lock().unwrap().push_back(Ok(events));
        let (calls, queued) = run(&s);
        assert_eq!(
            calls[..3],
            ["list continue=", "watch rv=967", "watch rv=970"].map(String::from)
        );
        // The pod turning Failed queues its owner, naming the pod's uid so reconcile can
        // delete it without reading it; its deletion that follows (a Failed pod's) and the
        // "deleting" MODIFIED do not queue it again.
        assert_eq!(
            queued,
            vec![(
                "fixtures/example".to_string(),
                "pod MODIFIED rv=968 terminated uid=c6f0852f-487c-4a9a-9867-b6cc2e7718f3"
                    .to_string()
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
        s.watches.lock().unwrap().push_back(Ok(expired));
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
    fn a_terminated_pod_names_its_uid_and_owner_for_reconcile() {
        let pod = |phase: &str, controller: bool| -> Seen {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "web-immortalpod", "uid": "p1", "ownerReferences": [{
                    "apiVersion": "immortalcontainer.flugel.it/v1alpha1", "kind": "ImmortalContainer",
                    "name": "web", "uid": "ic1", "controller": controller}]},
                "status": {"phase": phase}}))
            .unwrap()
        };
        let want = TerminatedPod {
            name: "web-immortalpod".into(),
            uid: "p1".into(),
            owner_uid: "ic1".into(),
        };
        assert_eq!(
            terminated_pod("MODIFIED", &pod("Failed", true)),
            Some(want.clone())
        );
        assert_eq!(terminated_pod("ADDED", &pod("Succeeded", true)), Some(want));
        // Running, already deleted, or with no controller: nothing to say.
        assert_eq!(terminated_pod("MODIFIED", &pod("Running", true)), None);
        assert_eq!(terminated_pod("DELETED", &pod("Failed", true)), None);
        assert_eq!(terminated_pod("MODIFIED", &pod("Failed", false)), None);
    }

    #[test]
    fn pod_events_that_need_no_reconcile_are_skipped() {
        let seen = |v: serde_json::Value| -> Seen { serde_json::from_value(v).unwrap() };
        let healthy = seen(serde_json::json!({
            "metadata": {"annotations": {IMAGE_ANNOTATION: "nginx"}},
            "spec": {"containers": [{"name": "acontainer", "image": "nginx"}]},
            "status": {"phase": "Running"}}));
        assert!(!pod_event_relevant("ADDED", &healthy));
        assert!(!pod_event_relevant("MODIFIED", &healthy));
        assert!(pod_event_relevant("DELETED", &healthy));
        let failed = seen(serde_json::json!({
            "metadata": {"annotations": {IMAGE_ANNOTATION: "nginx"}},
            "spec": {"containers": [{"name": "acontainer", "image": "nginx"}]},
            "status": {"phase": "Failed"}}));
        assert!(pod_event_relevant("MODIFIED", &failed));
        // Its deletion (usually ours, replacing it) adds nothing.
        assert!(!pod_event_relevant("DELETED", &failed));
        // Its image rewritten after creation (an admission webhook, a person): not ours to
        // fight, so not worth a reconcile.
        let retagged = seen(serde_json::json!({
            "metadata": {"annotations": {IMAGE_ANNOTATION: "nginx"}},
            "spec": {"containers": [{"name": "acontainer", "image": "mirror.example/nginx"}]}}));
        assert!(!pod_event_relevant("MODIFIED", &retagged));
        let unlabelled = seen(serde_json::json!({"metadata": {}}));
        assert!(pod_event_relevant("ADDED", &unlabelled));
        let deleting = seen(
            serde_json::json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"},
            "status": {"phase": "Failed"}}),
        );
        assert!(!pod_event_relevant("MODIFIED", &deleting));
    }

    #[test]
    fn our_own_status_writes_do_not_requeue_an_immortal_container() {
        let seen = |v: serde_json::Value| -> Seen { serde_json::from_value(v).unwrap() };
        let written = seen(
            serde_json::json!({"metadata": {"generation": 2}, "status": {"observedGeneration": 2}}),
        );
        assert!(!ic_event_relevant("MODIFIED", &written));
        let edited = seen(
            serde_json::json!({"metadata": {"generation": 3}, "status": {"observedGeneration": 2}}),
        );
        assert!(ic_event_relevant("MODIFIED", &edited));
        assert!(ic_event_relevant("ADDED", &written));
    }

    #[test]
    fn decodes_a_status_object_in_an_error_event() {
        let line = &fixture_events("28-watch-expired-resource-version-410")[0];
        let ev: WatchEvent = serde_json::from_str(line).unwrap();
        assert_eq!(
            (ev.type_.as_str(), ev.object.code, ev.object.reason.as_str()),
            ("ERROR", 410, "Expired")
        );
    }
}
