//! Watches one namespace's ImmortalContainers and pods and timestamps what the operator does:
//! when every object has converged, and when a replacement pod appeared.
//!
//! Two threads (list, then watch from the list's resourceVersion, as every Kubernetes client
//! does) apply events to one shared [`State`] and wake waiters through a condition variable.
//! Each event is stamped when its line is read, before the lock is taken, so waiting never
//! skews a timestamp.

use crate::cluster::{Api, RETRY_PAUSE};
use crate::Error;
use immortal_operator::immortal::types::IMMORTAL_CONTAINERS;
use immortal_operator::kube::client::Resource;
use serde::Deserialize;
use serde_json::Value;
use std::collections::HashMap;
use std::io::BufRead;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

/// A pod as the bench last saw it.
#[derive(Debug, Clone)]
pub struct PodSeen {
    pub uid: String,
    /// When the ADDED event of this uid arrived (for pods found by the first list: when the
    /// list answered).
    pub added_at: Instant,
    pub deleting: bool,
}

/// An ImmortalContainer's status as the bench last saw it.
#[derive(Debug, Clone, Default)]
pub struct IcSeen {
    pub start_times: i64,
    pub current_pod: bool,
    /// `lastCountedPodUID`: which pod its `startTimes` last counted.
    pub last_counted_uid: String,
    /// Its Ready condition is True: the pod runs and the status says so.
    pub ready: bool,
}

impl IcSeen {
    /// Its status shows a first pod: what "converged" asks of every object.
    fn started(&self) -> bool {
        self.start_times >= 1 && self.current_pod
    }
}

/// Everything the watch threads learnt, by object name.
#[derive(Debug)]
pub struct State {
    pub pods: HashMap<String, PodSeen>,
    /// When the last DELETED event of each pod name arrived: the moment the operator could
    /// first have known that the name is free.
    pub gone: HashMap<String, Instant>,
    pub ics: HashMap<String, IcSeen>,
    /// How many of `ics` are [`IcSeen::started`], kept up to date event by event.
    pub started: usize,
    /// How many of `ics` say Ready, kept up to date event by event.
    pub ready: usize,
    /// Watches whose first list is done and whose watch is open (2: both).
    synced: usize,
    /// When the last event (of either kind) arrived.
    pub last_event: Instant,
    /// Convergence being waited for: this many pods and started objects.
    target: Option<usize>,
    /// Set by the event that first brought the pods to `target`: every pod exists.
    pub pods_at: Option<Instant>,
    /// Set by the event that first brought the started objects to `target`: every status
    /// names its pod.
    pub status_at: Option<Instant>,
    /// Set by the event that first met `target` on both counts.
    pub converged_at: Option<Instant>,
}

impl State {
    fn new() -> State {
        State {
            pods: HashMap::new(),
            gone: HashMap::new(),
            ics: HashMap::new(),
            started: 0,
            ready: 0,
            synced: 0,
            last_event: Instant::now(),
            target: None,
            pods_at: None,
            status_at: None,
            converged_at: None,
        }
    }

    fn check_converged(&mut self, now: Instant) {
        let Some(n) = self.target else { return };
        if self.pods_at.is_none() && self.pods.len() >= n {
            self.pods_at = Some(now);
        }
        if self.status_at.is_none() && self.started >= n {
            self.status_at = Some(now);
        }
        if self.converged_at.is_none() && self.pods.len() >= n && self.started >= n {
            self.converged_at = Some(now);
        }
    }

    fn put_ic(&mut self, name: String, seen: Option<IcSeen>) {
        let was = match seen {
            Some(s) => {
                self.started += usize::from(s.started());
                self.ready += usize::from(s.ready);
                self.ics.insert(name, s)
            }
            None => self.ics.remove(&name),
        };
        if let Some(o) = was {
            self.started -= usize::from(o.started());
            self.ready -= usize::from(o.ready);
        }
    }
}

/// One line of a watch stream.
#[derive(Deserialize)]
struct WatchEvent {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    object: Value,
}

type Shared = (Mutex<State>, Condvar);

/// Watches of one namespace. Dropping it asks the threads to stop; they notice when their
/// stream next yields a line or ends (at the latest when the test server is dropped or the
/// watch's `timeoutSeconds` runs out).
pub struct Observer {
    shared: Arc<Shared>,
    quit: Arc<AtomicBool>,
}

impl Drop for Observer {
    fn drop(&mut self) {
        self.quit.store(true, Ordering::Relaxed);
    }
}

impl Observer {
    /// Starts watching `ns` and returns once both first lists are in and both watches open.
    pub fn start(api: &Api, ns: &str, deadline: Instant) -> Result<Observer, Error> {
        let obs = Observer {
            shared: Arc::new((Mutex::new(State::new()), Condvar::new())),
            quit: Arc::new(AtomicBool::new(false)),
        };
        for res in [IMMORTAL_CONTAINERS, Resource::PODS] {
            let (api, ns, shared, quit) = (
                api.clone(),
                ns.to_string(),
                obs.shared.clone(),
                obs.quit.clone(),
            );
            thread::Builder::new()
                .name(format!("bench-watch-{}", res.short()))
                .spawn(move || watch_loop(&api, res, &ns, &shared, &quit))
                .map_err(|e| Error::Setup(format!("cannot spawn a watch thread: {e}")))?;
        }
        obs.wait_until(
            deadline,
            "the bench's first lists",
            || Ok(()),
            |s| s.synced >= 2,
        )?;
        Ok(obs)
    }

    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.shared.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The uid of the pod `pod` as the watch last showed it, or why there is none to act on
    /// (`phase` names the bench phase in the error).
    pub fn uid_of(&self, pod: &str, phase: &str) -> Result<String, Error> {
        let uid = self.lock().pods.get(pod).map(|p| p.uid.clone());
        uid.ok_or_else(|| Error::Timeout(format!("{phase}: pod {pod} is not there to remove")))
    }

    /// Waits for the first `n` pods and started objects; convergence is stamped from now on.
    pub fn expect(&self, n: usize) {
        let mut s = self.lock();
        s.target = Some(n);
        s.pods_at = None;
        s.status_at = None;
        s.converged_at = None;
        let now = Instant::now();
        s.check_converged(now);
    }

    /// Blocks until `done` holds, `alive` fails (the operator died) or `deadline` passes.
    /// `what` names the wait in the timeout error.
    pub fn wait_until(
        &self,
        deadline: Instant,
        what: &str,
        mut alive: impl FnMut() -> Result<(), Error>,
        mut done: impl FnMut(&State) -> bool,
    ) -> Result<(), Error> {
        let mut s = self.lock();
        loop {
            if done(&s) {
                return Ok(());
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::Timeout(format!("gave up waiting for {what}")));
            }
            // Wake at least every 100 ms to notice an operator that died.
            let nap = (deadline - now).min(Duration::from_millis(100));
            s = self
                .shared
                .1
                .wait_timeout(s, nap)
                .unwrap_or_else(|p| p.into_inner())
                .0;
            drop(s);
            alive()?;
            s = self.lock();
        }
    }

    /// Waits until no event has arrived for `quiet` (at most until `limit`): whatever the
    /// operator was still doing shows up before the state is checked.
    pub fn wait_quiet(&self, quiet: Duration, limit: Instant) {
        loop {
            let since = self.lock().last_event.elapsed();
            if since >= quiet || Instant::now() >= limit {
                return;
            }
            thread::sleep(quiet - since);
        }
    }
}

/// List, then watch from the list's resourceVersion; relist on 410 Gone, re-watch from the
/// last version seen when a stream ends or breaks (the kube-runtime watcher's state machine).
fn watch_loop(api: &Api, res: Resource, ns: &str, shared: &Shared, quit: &AtomicBool) {
    let mut first = true;
    'relist: while !quit.load(Ordering::Relaxed) {
        let (items, mut rv) = match api.list_all::<Value>(res, ns) {
            Ok(x) => x,
            Err(_) => {
                thread::sleep(RETRY_PAUSE);
                continue;
            }
        };
        {
            let mut s = shared.0.lock().unwrap_or_else(|p| p.into_inner());
            let now = Instant::now();
            match res {
                Resource::PODS => s.pods.clear(),
                _ => {
                    s.ics.clear();
                    s.started = 0;
                }
            }
            for item in &items {
                apply(&mut s, res, "ADDED", item, now);
            }
            shared.1.notify_all();
        }
        while !quit.load(Ordering::Relaxed) {
            let mut stream = match api.watch(res, ns, &rv) {
                Ok(s) => s,
                Err(e) if e.is_gone() => continue 'relist,
                Err(_) => {
                    thread::sleep(RETRY_PAUSE);
                    continue;
                }
            };
            // Synced once the watch is open, not just listed: the server has then counted
            // the watch request, so a snapshot taken next cannot blame it on the operator.
            if first {
                first = false;
                let mut s = shared.0.lock().unwrap_or_else(|p| p.into_inner());
                s.synced += 1;
                shared.1.notify_all();
            }
            let mut line = String::new();
            loop {
                line.clear();
                // End of stream (the server's timeout) or a broken one: re-watch from the
                // last version seen.
                let got = stream.read_line(&mut line);
                if quit.load(Ordering::Relaxed) {
                    return;
                }
                if !matches!(got, Ok(n) if n > 0) {
                    break;
                }
                let now = Instant::now();
                let Ok(ev) = serde_json::from_str::<WatchEvent>(&line) else {
                    continue;
                };
                match ev.kind.as_str() {
                    "ADDED" | "MODIFIED" | "DELETED" => {
                        let mut s = shared.0.lock().unwrap_or_else(|p| p.into_inner());
                        apply(&mut s, res, &ev.kind, &ev.object, now);
                        s.last_event = now;
                        s.check_converged(now);
                        shared.1.notify_all();
                    }
                    "BOOKMARK" => {}
                    // In-stream ERROR: a 410 (too old resource version) means relist; any
                    // other error, re-watch.
                    _ => {
                        if ev.object["code"].as_u64() == Some(410) {
                            continue 'relist;
                        }
                        break;
                    }
                }
                if let Some(v) = ev.object["metadata"]["resourceVersion"].as_str() {
                    rv = v.to_string();
                }
            }
        }
    }
}

/// Applies one event (or listed item, as ADDED) to the state.
fn apply(s: &mut State, res: Resource, kind: &str, obj: &Value, now: Instant) {
    let meta = &obj["metadata"];
    let Some(name) = meta["name"].as_str() else {
        return;
    };
    match res {
        Resource::PODS => {
            if kind == "DELETED" {
                s.pods.remove(name);
                s.gone.insert(name.to_string(), now);
                return;
            }
            let uid = meta["uid"].as_str().unwrap_or_default();
            let added_at = match s.pods.get(name) {
                Some(p) if p.uid == uid => p.added_at,
                _ => now,
            };
            s.pods.insert(
                name.to_string(),
                PodSeen {
                    uid: uid.to_string(),
                    added_at,
                    deleting: !meta["deletionTimestamp"].is_null(),
                },
            );
        }
        _ => {
            let seen = (kind != "DELETED").then(|| IcSeen {
                start_times: obj["status"]["startTimes"].as_i64().unwrap_or(0),
                current_pod: obj["status"]["currentPod"]
                    .as_str()
                    .is_some_and(|p| !p.is_empty()),
                last_counted_uid: obj["status"]["lastCountedPodUID"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                ready: obj["status"]["conditions"].as_array().is_some_and(|cs| {
                    cs.iter()
                        .any(|c| c["type"] == "Ready" && c["status"] == "True")
                }),
            });
            s.put_ic(name.to_string(), seen);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ic(name: &str, starts: Option<i64>) -> Value {
        let mut v = json!({ "metadata": { "name": name } });
        if let Some(n) = starts {
            v["status"] = json!({ "startTimes": n, "currentPod": format!("{name}-immortalpod") });
        }
        v
    }

    fn pod(name: &str, uid: &str) -> Value {
        json!({ "metadata": { "name": name, "uid": uid } })
    }

    #[test]
    fn converges_on_the_event_that_completes_the_last_object() {
        let mut s = State::new();
        s.target = Some(2);
        let t0 = Instant::now();
        for (i, name) in ["a", "b"].iter().enumerate() {
            let at = t0 + Duration::from_millis(i as u64);
            apply(&mut s, IMMORTAL_CONTAINERS, "ADDED", &ic(name, None), at);
            apply(
                &mut s,
                Resource::PODS,
                "ADDED",
                &pod(&format!("{name}-immortalpod"), "u"),
                at,
            );
            s.check_converged(at);
        }
        assert_eq!(s.converged_at, None, "no status written yet");
        assert_eq!(
            (s.pods_at, s.status_at),
            (Some(t0 + Duration::from_millis(1)), None),
            "every pod exists from b's"
        );
        let a = t0 + Duration::from_millis(5);
        apply(
            &mut s,
            IMMORTAL_CONTAINERS,
            "MODIFIED",
            &ic("a", Some(1)),
            a,
        );
        s.check_converged(a);
        assert_eq!(s.converged_at, None, "b has no status yet");
        let b = t0 + Duration::from_millis(7);
        apply(
            &mut s,
            IMMORTAL_CONTAINERS,
            "MODIFIED",
            &ic("b", Some(1)),
            b,
        );
        s.check_converged(b);
        assert_eq!((s.status_at, s.converged_at), (Some(b), Some(b)));
        // A later write does not move the stamp.
        apply(
            &mut s,
            IMMORTAL_CONTAINERS,
            "MODIFIED",
            &ic("b", Some(1)),
            b + Duration::from_millis(1),
        );
        s.check_converged(b + Duration::from_millis(1));
        assert_eq!(s.converged_at, Some(b));
        assert_eq!(s.pods_at, Some(t0 + Duration::from_millis(1)));
        assert_eq!(s.started, 2);
    }

    #[test]
    fn a_modified_pod_keeps_its_added_stamp_and_a_new_uid_gets_a_new_one() {
        let mut s = State::new();
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_millis(3);
        let t2 = t0 + Duration::from_millis(9);
        apply(&mut s, Resource::PODS, "ADDED", &pod("p", "old"), t0);
        apply(&mut s, Resource::PODS, "MODIFIED", &pod("p", "old"), t1);
        assert_eq!(s.pods["p"].added_at, t0);
        apply(&mut s, Resource::PODS, "DELETED", &pod("p", "old"), t1);
        assert!(!s.pods.contains_key("p"));
        apply(&mut s, Resource::PODS, "ADDED", &pod("p", "new"), t2);
        assert_eq!(
            (s.pods["p"].uid.as_str(), s.pods["p"].added_at),
            ("new", t2)
        );
    }

    #[test]
    fn a_deleted_started_object_no_longer_counts() {
        let mut s = State::new();
        let now = Instant::now();
        apply(&mut s, IMMORTAL_CONTAINERS, "ADDED", &ic("a", Some(1)), now);
        assert_eq!(s.started, 1);
        apply(
            &mut s,
            IMMORTAL_CONTAINERS,
            "DELETED",
            &ic("a", Some(1)),
            now,
        );
        assert_eq!(s.started, 0);
    }

    #[test]
    fn ready_counts_objects_whose_status_says_ready_until_it_says_otherwise() {
        let mut s = State::new();
        let now = Instant::now();
        let mut a = ic("a", Some(1));
        apply(&mut s, IMMORTAL_CONTAINERS, "ADDED", &a, now);
        assert_eq!((s.started, s.ready), (1, 0), "started, not yet ready");
        a["status"]["conditions"] = json!([{"type": "Ready", "status": "True"}]);
        apply(&mut s, IMMORTAL_CONTAINERS, "MODIFIED", &a, now);
        apply(&mut s, IMMORTAL_CONTAINERS, "MODIFIED", &a, now);
        assert_eq!(s.ready, 1, "a repeated event counts once");
        a["status"]["conditions"] = json!([{"type": "Ready", "status": "False"}]);
        apply(&mut s, IMMORTAL_CONTAINERS, "MODIFIED", &a, now);
        assert_eq!(s.ready, 0);
        a["status"]["conditions"] = json!([{"type": "Ready", "status": "True"}]);
        apply(&mut s, IMMORTAL_CONTAINERS, "MODIFIED", &a, now);
        apply(&mut s, IMMORTAL_CONTAINERS, "DELETED", &a, now);
        assert_eq!((s.started, s.ready), (0, 0));
    }
}
