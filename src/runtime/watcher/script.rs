//! A scripted API server for watcher tests: lists and watch streams answered from a script, and
//! a pod watcher run over it until the script runs out. Policies' tests use it too, to run
//! their [`EventHandler`] over recorded streams.

use super::*;
use crate::kube::client::Resource;
use serde::de::DeserializeOwned;
use std::collections::VecDeque;
use std::fmt;
use std::io::Cursor;
use std::sync::Mutex;

/// A scripted watch: its lines, and how its stream ends (cleanly, or with a read error).
pub type ScriptedWatch = Result<(String, Option<std::io::ErrorKind>), client::Error>;

/// A scripted API: each call pops the next answer and records what was asked. Pages are
/// JSON, decoded into whatever the watcher asks for, as the client does.
#[derive(Default)]
pub struct Script {
    pub lists: Mutex<VecDeque<Result<serde_json::Value, client::Error>>>,
    pub watches: Mutex<VecDeque<ScriptedWatch>>,
    /// Answers to [`Source::version`]; none left: a version that cannot be compared.
    pub versions: Mutex<VecDeque<Result<String, client::Error>>>,
    pub calls: Mutex<Vec<String>>,
    pub quit_tx: Mutex<Option<Sender<()>>>,
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
        let page = next.unwrap_or_else(|| Err(client::Error::Transport("no more lists".into())))?;
        Ok(serde_json::from_value(page).expect("a scripted page decodes"))
    }
    fn version(&self, _: &Kind) -> Result<String, client::Error> {
        self.calls.lock().unwrap().push("version".into());
        let next = self.versions.lock().unwrap().pop_front();
        next.unwrap_or_else(|| Ok(String::new()))
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
pub fn page(rv: &str, pods: &[(&str, &str)], cont: Option<&str>) -> serde_json::Value {
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

pub fn gone() -> client::Error {
    client::Error::Api(Box::new(Status {
        code: 410,
        reason: "Expired".into(),
        ..Default::default()
    }))
}

/// The pods' watch as the watcher is given it: no selector, all namespaces.
pub fn pods() -> Kind {
    Kind {
        resource: Resource::PODS,
        namespace: None,
        label_selector: None,
        if_missing: None,
    }
}

/// An event handler that knows nothing: every event queues the pod's controller, with no hint.
pub struct ByOwner;

impl EventHandler for ByOwner {
    type Object = crate::kube::types::Pod;
    type Hint = String;
    type Cached = u64;
    fn meta(o: &Self::Object) -> &ObjectMeta {
        &o.metadata
    }
    fn key_of_meta(&self, meta: &ObjectMeta) -> Option<String> {
        let owner = meta.controller()?;
        Some(crate::kube::types::key(&meta.namespace, &owner.name))
    }
    fn cached(&self, _: &Self::Object) -> u64 {
        0
    }
    fn on_event(&self, _: &'static str, _: &Self::Object, _: &mut Option<u64>) -> Reaction<String> {
        Reaction::Queue(None, crate::runtime::queue::Priority::Routine)
    }
}

/// Runs a pod watcher with `handler` over `script` until the script runs out; returns the calls
/// it made and the keys it queued with their triggers, in order.
pub fn run<W>(script: &Script, handler: W) -> (Vec<String>, Vec<(String, String)>)
where
    W: EventHandler + Send,
    W::Hint: fmt::Display + Clone + Send,
{
    run_relisting(script, handler, Relist::default())
}

/// [`run`], the watcher listing again as `relists` says.
pub fn run_relisting<W>(
    script: &Script,
    handler: W,
    relists: Relist,
) -> (Vec<String>, Vec<(String, String)>)
where
    W: EventHandler + Send,
    W::Hint: fmt::Display + Clone + Send,
{
    let queue = Arc::new(Queue::new());
    let (quit_tx, quit_rx) = crossbeam_channel::bounded(0);
    *script.quit_tx.lock().unwrap() = Some(quit_tx);
    let (synced_tx, synced_rx) = crossbeam_channel::unbounded();
    let w = Watcher::new(
        script,
        pods(),
        handler,
        queue.clone(),
        quit_rx,
        synced_tx,
        DEFAULT_IDLE_TIMEOUT,
    )
    .relisting(relists);
    let handle = std::thread::scope(|s| s.spawn(move || w.run()).join());
    handle.unwrap();
    assert_eq!(
        synced_rx.try_recv().ok().map(|w| w.resource),
        Some("pod"),
        "watcher must report its first list"
    );
    let mut queued = Vec::new();
    queue.shutdown();
    let st = queue.lock_for_tests();
    for k in st.0 {
        let t: Option<&Trigger<W::Hint>> = st.1.get(&k);
        queued.push((k.clone(), t.map(|t| t.to_string()).unwrap_or_default()));
    }
    (script.calls.lock().unwrap().clone(), queued)
}
