//! Where the benchmark runs (the in-process test API server or a kubeconfig's cluster) and the
//! bench's own API calls, counted so the operator's requests can be told apart from them.

use crate::Error;
use immortal_operator::immortal::types::{
    ImmortalContainer, API_VERSION, GROUP, IMMORTAL_CONTAINERS, KIND, VERSION,
};
use immortal_operator::kube::client::{self, Client, ListParams, Resource, WatchParams};
use immortal_operator::kube::config::{self, LoadOptions};
use immortal_operator::kube::types::Pod;
use kube_testserver::{CostModel, KubeletOptions, Options, TestServer};
use serde::de::DeserializeOwned;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Requests by `"verb resource"`, in the test server's vocabulary: `create pods`,
/// `patch immortalcontainers/status`, `watch pods`...
pub type Counts = BTreeMap<String, u64>;

/// Page size of the bench's LISTs: big enough to list 10,000 objects in 20 requests, small
/// enough that no single answer is huge.
const PAGE: u32 = 500;
/// `timeoutSeconds` of the bench's watches. Short, so that on a real cluster a watch thread
/// left behind at the end ends soon after; re-opening costs one request a minute.
const WATCH_SECONDS: u32 = 60;

/// The bench's typed API calls over the operator's own client (same HTTP stack, same TLS),
/// each counted in `own`. Cheap to clone; watch threads get a clone.
#[derive(Clone)]
pub struct Api {
    client: Client,
    own: Arc<Mutex<Counts>>,
}

impl Api {
    fn note(&self, verb: &str, resource: &str) {
        let mut own = self.own.lock().unwrap_or_else(|p| p.into_inner());
        *own.entry(format!("{verb} {resource}")).or_insert(0) += 1;
    }

    /// The bench's requests so far.
    pub fn own_counts(&self) -> Counts {
        self.own.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// An API of its own over `kubeconfig`, counting from zero: the load phase's flood
    /// process. Asks nothing of the server.
    pub fn connect(kubeconfig: &Path, connections: usize) -> Result<Api, Error> {
        let opts = LoadOptions {
            kubeconfig: Some(kubeconfig.to_path_buf()),
            context: None,
        };
        let at = kubeconfig.display();
        let config =
            config::load(&opts).map_err(|e| Error::Setup(format!("kubeconfig {at}: {e}")))?;
        let client = Client::new(config, connections)
            .map_err(|e| Error::Setup(format!("kubeconfig {at}: {e}")))?;
        Ok(Api {
            client,
            own: Arc::default(),
        })
    }

    /// Adds requests that another process of the bench sent (the flood's), so that they are
    /// not taken for the operator's.
    pub fn add_counts(&self, counts: &Counts) {
        let mut own = self.own.lock().unwrap_or_else(|p| p.into_inner());
        for (k, n) in counts {
            *own.entry(k.clone()).or_insert(0) += n;
        }
    }

    pub fn create_immortal_container(
        &self,
        ns: &str,
        name: &str,
        image: &str,
        template: Option<&Value>,
    ) -> Result<ImmortalContainer, Error> {
        self.note("create", "immortalcontainers");
        let mut body = json!({
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": { "name": name },
            "spec": { "image": image },
        });
        if let Some(t) = template {
            body["spec"]["template"] = t.clone();
        }
        self.client
            .create(IMMORTAL_CONTAINERS, ns, &body)
            .map_err(|e| Error::api("create immortalcontainer", e))
    }

    pub fn create_pod(&self, ns: &str, pod: &Pod) -> Result<Pod, Error> {
        self.note("create", "pods");
        self.client
            .create_pod(ns, pod)
            .map_err(|e| Error::api("create pod", e))
    }

    pub fn patch_status(
        &self,
        ns: &str,
        name: &str,
        patch: &Value,
    ) -> Result<ImmortalContainer, Error> {
        self.note("patch", "immortalcontainers/status");
        self.client
            .patch_status(IMMORTAL_CONTAINERS, ns, name, patch)
            .map_err(|e| Error::api("patch immortalcontainer status", e))
    }

    /// Deletes the pod with `uid`, grace period 0: the recovery measures the operator, not how
    /// long a kubelet takes to stop a container (with a grace period the pod lingers,
    /// terminating, and its name cannot be reused until it is gone).
    pub fn delete_pod(&self, ns: &str, name: &str, uid: &str) -> Result<(), Error> {
        self.note("delete", "pods");
        self.client
            .delete_pod(ns, name, uid, Some(0))
            .map(drop)
            .map_err(|e| Error::api("delete pod", e))
    }

    /// Marks a pod Failed, as a kubelet reports a container that exited for good: a merge
    /// patch of `pods/NAME/status` (the `*-pod-status-patch-phase-failed` fixture).
    pub fn fail_pod(&self, ns: &str, name: &str) -> Result<(), Error> {
        self.note("patch", "pods/status");
        // The client's object path is `.../pods/{name}`; the subresource rides on the name.
        let sub = format!("{name}/status");
        self.client
            .merge_patch::<_, Value>(
                Resource::PODS,
                ns,
                &sub,
                &json!({ "status": { "phase": "Failed" } }),
            )
            .map(|_| ())
            .map_err(|e| Error::api("patch pod status", e))
    }

    /// Turns a pod's Ready condition False, as a failing readiness probe would: a merge patch
    /// of `pods/NAME/status` (the kubelet writes its own conditions back soon after, on a
    /// cluster with one: a second change).
    pub fn unready_pod(&self, ns: &str, name: &str) -> Result<(), Error> {
        self.note("patch", "pods/status");
        let sub = format!("{name}/status");
        let unready = json!({"status": {"conditions": [{"type": "Ready", "status": "False",
            "reason": "BenchLoad", "message": "made not ready by the bench"}]}});
        match self
            .client
            .merge_patch::<_, Value>(Resource::PODS, ns, &sub, &unready)
        {
            // Deleted by the same phase and not replaced yet: nothing to make not ready.
            Err(e) if e.is_not_found() => Ok(()),
            r => r.map(|_| ()).map_err(|e| Error::api("patch pod status", e)),
        }
    }

    /// Every object of `res` in `ns`, page by page, and the resourceVersion to watch from.
    pub fn list_all<T: DeserializeOwned>(
        &self,
        res: Resource,
        ns: &str,
    ) -> Result<(Vec<T>, String), Error> {
        let mut items = Vec::new();
        let mut token: Option<String> = None;
        loop {
            self.note("list", res.plural());
            let params = ListParams {
                label_selector: None,
                limit: Some(PAGE),
                continue_token: token.as_deref(),
            };
            let page = self
                .client
                .list::<T>(res, Some(ns), &params)
                .map_err(|e| Error::api("list", e))?;
            items.extend(page.items);
            match page.metadata.continue_token.filter(|t| !t.is_empty()) {
                Some(t) => token = Some(t),
                None => return Ok((items, page.metadata.resource_version)),
            }
        }
    }

    /// Opens a watch of `res` in `ns` from `rv`; one JSON event per line.
    pub fn watch(
        &self,
        res: Resource,
        ns: &str,
        rv: &str,
    ) -> Result<Box<dyn BufRead + Send>, client::Error> {
        self.note("watch", res.plural());
        let params = WatchParams {
            label_selector: None,
            resource_version: rv,
            timeout_seconds: WATCH_SECONDS,
            idle_timeout: immortal_operator::runtime::watcher::DEFAULT_IDLE_TIMEOUT,
        };
        self.client.watch(res, Some(ns), &params)
    }

    /// A request the typed client has no call for (namespaces are cluster-scoped): same TLS
    /// configuration and credentials, answer body ignored.
    fn raw(&self, method: &str, path: &str, body: Option<&Value>) -> Result<(), Error> {
        let cfg = self.client.config();
        let tls = cfg
            .tls_config()
            .map_err(|e| Error::Setup(format!("cluster tls: {e}")))?;
        let config = client::transport::config(None, 0)
            .timeout_global(Some(client::REQUEST_TIMEOUT))
            .build();
        let agent = client::transport::agent_with(tls, config);
        let mut req = ureq::http::Request::builder()
            .method(method)
            .uri(format!("{}{path}", cfg.server))
            .header("Accept", "application/json");
        match cfg.credentials.authorization() {
            Ok(Some(auth)) => req = req.header("Authorization", auth),
            Ok(None) => {}
            Err(e) => return Err(Error::Setup(format!("credentials: {e}"))),
        }
        let answer = match body {
            Some(b) => req
                .header("Content-Type", "application/json")
                .body(b.to_string())
                .map(|r| agent.run(r)),
            None => req.body(()).map(|r| agent.run(r)),
        };
        let action = format!("{} {path}", method.to_lowercase());
        let transport = |e: String| Error::Api {
            action: action.clone(),
            source: client::Error::Transport(e),
        };
        let mut resp = answer
            .map_err(|e| transport(e.to_string()))?
            .map_err(|e| transport(e.to_string()))?;
        let code = resp.status().as_u16();
        if code < 400 {
            return Ok(());
        }
        let text = resp.body_mut().read_to_string().unwrap_or_default();
        let status = client::parse_status(code, &text);
        Err(Error::Api {
            action,
            source: client::Error::Api(Box::new(status)),
        })
    }
}

/// The API server the run talks to, and the namespaces it made there.
pub struct Cluster {
    /// The in-process server; `None` for a kubeconfig's cluster. Dropping it closes every
    /// connection, which also ends the watch threads still reading from it.
    server: Option<TestServer>,
    kubeconfig: PathBuf,
    pub api: Api,
    /// Prefix of every namespace this run creates, unique per run.
    prefix: String,
    namespaces: Mutex<Vec<String>>,
}

impl Cluster {
    /// Starts the test API server (no kubeconfig), or loads `kubeconfig` and checks that the
    /// ImmortalContainer CRD is served there. `connections`: how many requests may run at once.
    pub fn connect(kubeconfig: Option<&Path>, connections: usize) -> Result<Cluster, Error> {
        match kubeconfig {
            Some(p) => Cluster::with(None, p.to_path_buf(), connections),
            None => Cluster::start(Options::default(), connections),
        }
    }

    /// Starts a test API server of its own, modeling a real control plane's costs (`model`)
    /// from the start, with a kubelet that takes `start_delay` to start a container.
    pub fn start_modeled(
        model: CostModel,
        start_delay: Duration,
        connections: usize,
    ) -> Result<Cluster, Error> {
        let opts = Options {
            kubelet: Some(KubeletOptions {
                start_delay,
                ..KubeletOptions::default()
            }),
            ..Options::default()
        };
        let cluster = Cluster::start(opts, connections)?;
        if let Some(s) = cluster.test_server() {
            s.set_cost_model(model);
        }
        Ok(cluster)
    }

    fn start(opts: Options, connections: usize) -> Result<Cluster, Error> {
        let s = TestServer::start(opts)
            .map_err(|e| Error::Setup(format!("cannot start the test API server: {e}")))?;
        let p = s.kubeconfig_path();
        Cluster::with(Some(s), p, connections)
    }

    fn with(
        server: Option<TestServer>,
        path: PathBuf,
        connections: usize,
    ) -> Result<Cluster, Error> {
        let api = Api::connect(&path, connections)?;
        // The CRD must be there (the bench installs nothing on a real cluster): its group
        // version's discovery document answers 404 otherwise.
        api.note("get", &format!("/apis/{GROUP}/{VERSION}"));
        match api
            .client
            .get_path::<Value>(&format!("/apis/{GROUP}/{VERSION}"))
        {
            Ok(_) => {}
            Err(e) if e.is_not_found() => {
                return Err(Error::Setup(format!(
                    "{GROUP}/{VERSION} is not served: install the CRD first (make install)"
                )))
            }
            Err(e) => return Err(Error::api("discovery", e)),
        }
        let rnd = immortal_operator::util::rand_u64() & 0xff_ffff;
        Ok(Cluster {
            server,
            kubeconfig: path,
            api,
            prefix: format!("immortal-bench-{rnd:06x}"),
            namespaces: Mutex::new(Vec::new()),
        })
    }

    /// For the report: what the bench ran against.
    pub fn describe(&self) -> String {
        match &self.server {
            Some(_) => "test API server (in-process)".to_string(),
            None => format!("cluster of kubeconfig {}", self.kubeconfig.display()),
        }
    }

    pub fn is_test_server(&self) -> bool {
        self.server.is_some()
    }

    /// The in-process test server, for phases that inject faults; `None` on a real cluster.
    pub fn test_server(&self) -> Option<&TestServer> {
        self.server.as_ref()
    }

    /// The kubeconfig the operator is given.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// Creates the fresh namespace `PREFIX-suffix` and remembers it for [`Cluster::cleanup`].
    pub fn create_namespace(&self, suffix: &str) -> Result<String, Error> {
        let name = format!("{}-{suffix}", self.prefix);
        self.api.note("create", "namespaces");
        let body = json!({ "apiVersion": "v1", "kind": "Namespace", "metadata": { "name": name } });
        self.api.raw("POST", "/api/v1/namespaces", Some(&body))?;
        self.namespaces
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(name.clone());
        Ok(name)
    }

    /// Deletes the namespaces this run created (with everything in them). Errors are returned
    /// as messages: cleanup goes on past one that fails.
    pub fn cleanup(&self) -> Vec<String> {
        let names = std::mem::take(&mut *self.namespaces.lock().unwrap_or_else(|p| p.into_inner()));
        if self.server.is_some() {
            // The in-process server and its data go away with the run.
            return Vec::new();
        }
        let mut errors = Vec::new();
        for ns in names {
            self.api.note("delete", "namespaces");
            if let Err(e) = self
                .api
                .raw("DELETE", &format!("/api/v1/namespaces/{ns}"), None)
            {
                errors.push(format!("cannot delete namespace {ns}: {e}"));
            }
        }
        errors
    }

    /// Requests the server has handled, by `"verb resource"`; `None` on a real cluster (its
    /// counts are not ours to read; the operator's /metrics are used there).
    pub fn server_counts(&self) -> Option<Counts> {
        let server = self.server.as_ref()?;
        Some(
            server
                .request_counts()
                .into_iter()
                .map(|((verb, res), n)| (format!("{verb} {res}"), n))
                .collect(),
        )
    }

    /// A point to measure the operator's requests from.
    pub fn snapshot(&self) -> Snapshot {
        // Own counts first: a bench request noted after the server counted it would be
        // subtracted without having been counted.
        let own = self.api.own_counts();
        Snapshot {
            server: self.server_counts(),
            own,
        }
    }
}

/// Server and bench request counts at one moment.
#[derive(Debug, Clone)]
pub struct Snapshot {
    server: Option<Counts>,
    own: Counts,
}

/// What the server handled between `before` and `after` that the bench did not send: the
/// operator's requests. `None` when the server's counts are not available.
pub fn operator_requests(before: &Snapshot, after: &Snapshot) -> Option<Counts> {
    let (b, a) = (before.server.as_ref()?, after.server.as_ref()?);
    let server = diff(a, b);
    let own = diff(&after.own, &before.own);
    Some(
        server
            .into_iter()
            .map(|(k, n)| {
                let mine = own.get(&k).copied().unwrap_or(0);
                (k, n.saturating_sub(mine))
            })
            .filter(|(_, n)| *n > 0)
            .collect(),
    )
}

/// `after - before`, key by key.
pub fn diff(after: &Counts, before: &Counts) -> Counts {
    after
        .iter()
        .map(|(k, n)| {
            (
                k.clone(),
                n.saturating_sub(before.get(k).copied().unwrap_or(0)),
            )
        })
        .filter(|(_, n)| *n > 0)
        .collect()
}

/// Keeps a watch thread from hammering a server that refuses it.
pub const RETRY_PAUSE: Duration = Duration::from_millis(100);

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(pairs: &[(&str, u64)]) -> Counts {
        pairs.iter().map(|(k, n)| (k.to_string(), *n)).collect()
    }

    #[test]
    fn operator_requests_are_the_servers_minus_the_benchs_own() {
        let before = Snapshot {
            server: Some(counts(&[("create pods", 10), ("watch pods", 1)])),
            own: counts(&[("create pods", 10), ("watch pods", 1)]),
        };
        let after = Snapshot {
            server: Some(counts(&[
                ("create pods", 25),
                ("watch pods", 3),
                ("create immortalcontainers", 5),
            ])),
            own: counts(&[
                ("create pods", 10),
                ("watch pods", 2),
                ("create immortalcontainers", 5),
            ]),
        };
        let op = operator_requests(&before, &after).expect("server counts");
        assert_eq!(op, counts(&[("create pods", 15), ("watch pods", 1)]));
    }

    #[test]
    fn no_server_counts_means_no_operator_counts() {
        let s = Snapshot {
            server: None,
            own: Counts::new(),
        };
        assert!(operator_requests(&s, &s).is_none());
    }
}
