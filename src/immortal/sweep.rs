//! The start-up sweep: pods that still carry our counting finalizer but that our pod watch
//! cannot see (their label went while the operator was down), found by reading the metadata of
//! every pod once. Why and what it costs: docs/design.md, "The finalizer".

use crate::immortal::counting;
use crate::immortal::types::{MANAGED_BY_LABEL, POD_SUFFIX};
use crate::kube::client::{self, Client, ListParams, Resource};
use crate::kube::types;
use crate::runtime::queue::{Hint, Priority, Queue, Trigger};
use crate::runtime::watcher::Backoff;
use crossbeam_channel::{Receiver, RecvTimeoutError};
use std::time::Instant;

/// Pods per page, as client-go's pager reads them.
const PAGE: u32 = 500;
/// Attempts per page before the sweep is given up (until the next start).
const ATTEMPTS: u32 = 5;

/// What one sweep read and found.
#[derive(Debug, Default)]
pub struct Swept {
    pub pages: usize,
    pub pods: usize,
    /// Pods holding our finalizer without our label: their objects were queued.
    pub found: usize,
}

/// The key of the object a pod holding our finalizer but not our label was made for.
fn unseen_holder(meta: &types::ObjectMeta) -> Option<String> {
    if !counting::is_held(&meta.finalizers) || meta.labels.contains_key(MANAGED_BY_LABEL) {
        return None;
    }
    let name = meta.name.strip_suffix(POD_SUFFIX)?;
    Some(types::key(&meta.namespace, name))
}

/// [`sweep`] of one namespace (or all), and one log line saying how it went.
pub fn run<H: Hint>(
    client: &Client,
    namespace: Option<&str>,
    queue: &Queue<H>,
    quit: &Receiver<()>,
) {
    let started = Instant::now();
    let shown = namespace.unwrap_or("(all)");
    match sweep(client, namespace, queue, quit) {
        Ok(s) => log::info!(
            target: "sweep",
            namespace = shown, pods = s.pods as u64, pages = s.pages as u64, found = s.found as u64,
            elapsed_ms = started.elapsed().as_millis() as u64;
            "swept every pod's metadata for our finalizer"
        ),
        Err(e) => log::warn!(
            target: "sweep", namespace = shown, error = e.to_string().as_str();
            "cannot sweep pods for our finalizer (a pod that lost our label while the operator was down may stay Terminating; the next start sweeps again)"
        ),
    }
}

/// Sweeps the pods of `namespace` (all when `None`) a page at a time, queueing the object of
/// every pod that holds our finalizer unseen; a page that keeps failing ends it with its error.
pub fn sweep<H: Hint>(
    client: &Client,
    namespace: Option<&str>,
    queue: &Queue<H>,
    quit: &Receiver<()>,
) -> Result<Swept, client::Error> {
    let mut swept = Swept::default();
    let mut token: Option<String> = None;
    loop {
        let mut backoff = Backoff::new();
        let page = loop {
            let params = ListParams {
                label_selector: None,
                limit: Some(PAGE),
                continue_token: token.as_deref(),
            };
            match client.list_metadata(Resource::PODS, namespace, &params) {
                Ok(p) => break p,
                // The continue token expired (410): start over; the pods seen stay swept.
                Err(e) if e.is_gone() && token.is_some() => token = None,
                Err(e) if backoff.failures() + 1 < ATTEMPTS => {
                    log::debug!(target: "sweep", error = e.to_string().as_str(); "listing pod metadata failed, retrying");
                    // Anything but the wait running out means quit.
                    if quit.recv_timeout(backoff.next_delay()) != Err(RecvTimeoutError::Timeout) {
                        return Ok(swept);
                    }
                }
                Err(e) => return Err(e),
            }
        };
        swept.pages += 1;
        swept.pods += page.items.len();
        for item in &page.items {
            if let Some(key) = unseen_holder(&item.metadata) {
                log::info!(
                    target: "sweep",
                    object = key.as_str(), pod = item.metadata.name.as_str(), uid = item.metadata.uid.as_str();
                    "found a pod holding our finalizer without our label; reconciling its object"
                );
                swept.found += 1;
                // A pod someone may be waiting on to go: urgent.
                queue.add(
                    key.into(),
                    Trigger::Sweep { resource: "pod" },
                    Priority::Urgent,
                );
            }
        }
        match page.metadata.continue_token.filter(|t| !t.is_empty()) {
            Some(t) => token = Some(t),
            None => return Ok(swept),
        }
        if crate::runtime::shutdown::is_quitting(quit) {
            return Ok(swept);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::immortal::types::{COUNT_FINALIZER, MANAGED_BY_VALUE};

    fn meta(name: &str, finalizer: bool, label: bool) -> types::ObjectMeta {
        let mut m = types::ObjectMeta {
            name: name.into(),
            namespace: "ns".into(),
            ..Default::default()
        };
        if finalizer {
            m.finalizers = vec!["other".into(), COUNT_FINALIZER.into()];
        }
        if label {
            m.labels
                .insert(MANAGED_BY_LABEL.into(), MANAGED_BY_VALUE.into());
        }
        m
    }

    #[test]
    fn only_pods_holding_our_finalizer_that_our_watch_cannot_see_are_queued() {
        assert_eq!(
            unseen_holder(&meta("web-immortalpod", true, false)).as_deref(),
            Some("ns/web")
        );
        // Our watch sees it: its own events and the relist take care of it.
        assert_eq!(unseen_holder(&meta("web-immortalpod", true, true)), None);
        // Not ours to release.
        assert_eq!(unseen_holder(&meta("web-immortalpod", false, false)), None);
        assert_eq!(unseen_holder(&meta("web-other", true, false)), None);
    }

    #[test]
    fn a_sweep_reads_every_page_of_metadata_and_queues_what_it_finds() {
        use crate::kube::types::{Container, Pod, PodSpec};
        let server =
            kube_testserver::TestServer::start(kube_testserver::Options::default()).unwrap();
        let client = crate::testutil::client_of(&server.kubeconfig_path());
        let pod = |name: &str, finalizer: bool| Pod {
            metadata: types::ObjectMeta {
                name: name.into(),
                finalizers: if finalizer {
                    vec![COUNT_FINALIZER.into()]
                } else {
                    vec![]
                },
                ..Default::default()
            },
            spec: PodSpec {
                containers: vec![Container {
                    name: "acontainer".into(),
                    image: "nginx".into(),
                    ..Default::default()
                }],
                ..Default::default()
            },
            ..Default::default()
        };
        // A pod of ours whose label went while the operator was down, and others.
        client
            .create_pod("default", &pod("web-immortalpod", true))
            .unwrap();
        for i in 0..3 {
            client
                .create_pod("default", &pod(&format!("other-{i}"), false))
                .unwrap();
        }
        let queue: Queue<String> = Queue::new();
        let (_quit_tx, quit) = crossbeam_channel::bounded::<()>(0);
        let swept = sweep(&client, Some("default"), &queue, &quit).unwrap();
        assert_eq!((swept.pods, swept.found), (4, 1));
        assert_eq!(queue.lock_for_tests().0, ["default/web"]);
    }
}
