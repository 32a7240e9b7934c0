//! Test helpers: an HTTPS client (ureq trusting the server's CA), watch readers, and a
//! time bound for every test.

#![allow(dead_code)]

pub mod http_fixture;

use kube_testserver::TestServer;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;
use serde_json::Value;
use std::io::{BufRead, BufReader, Read};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

/// Runs `f` on a thread and fails the test if it takes longer than `secs`.
pub fn bounded<T: Send + 'static>(secs: u64, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    let handle = std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(v) => {
            let _ = handle.join();
            v
        }
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("test did not finish within {secs}s"),
        Err(mpsc::RecvTimeoutError::Disconnected) => match handle.join() {
            Err(panic) => std::panic::resume_unwind(panic),
            Ok(()) => panic!("test thread ended without a result"),
        },
    }
}

/// A response: status, headers we look at, body as JSON (Null if not JSON).
#[derive(Debug, Clone)]
pub struct Resp {
    pub code: u16,
    pub body: Value,
    pub content_type: String,
    pub retry_after: Option<String>,
    /// `Warning` headers, as sent.
    pub warnings: Vec<String>,
}

/// An HTTPS client for one server and one token.
#[derive(Clone)]
pub struct Client {
    agent: ureq::Agent,
    base: String,
    token: String,
}

pub fn tls_config(ca_pem: &str) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.expect("ca pem")).expect("add ca");
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    Arc::new(config)
}

impl Client {
    pub fn new(server: &TestServer, token: &str) -> Client {
        use ureq::tls::{Certificate, RootCerts, TlsConfig};
        let ca = server.ca_pem();
        let roots = CertificateDer::pem_slice_iter(ca.as_bytes())
            .map(|c| Certificate::from_der(c.expect("ca pem").as_ref()).to_owned())
            .collect::<Vec<_>>();
        let tls = TlsConfig::builder()
            .root_certs(RootCerts::new_with_certs(&roots))
            .unversioned_rustls_crypto_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .build();
        let agent = ureq::Agent::config_builder()
            .tls_config(tls)
            // Every status is an answer; the proxy of the environment is not the tests'.
            .http_status_as_error(false)
            .proxy(None)
            .timeout_connect(Some(Duration::from_secs(5)))
            .timeout_per_read(Some(Duration::from_secs(10)))
            .timeout_per_write(Some(Duration::from_secs(10)))
            .build()
            .new_agent();
        Client {
            agent,
            base: server.url(),
            token: token.to_string(),
        }
    }

    pub fn admin(server: &TestServer) -> Client {
        Client::new(server, &server.admin_token())
    }

    fn req(&self, method: &str, path: &str) -> ureq::http::request::Builder {
        let r = ureq::http::Request::builder()
            .method(method)
            .uri(format!("{}{}", self.base, path));
        if self.token.is_empty() {
            r
        } else {
            r.header("Authorization", format!("Bearer {}", self.token))
        }
    }

    /// Sends `r` with `body`, if any.
    fn run(
        &self,
        r: ureq::http::request::Builder,
        body: Option<&str>,
    ) -> Result<ureq::http::Response<ureq::Body>, String> {
        let sent = match body {
            Some(b) => r.body(b.to_string()).map(|r| self.agent.run(r)),
            None => r.body(()).map(|r| self.agent.run(r)),
        };
        sent.map_err(|e| e.to_string())?.map_err(|e| e.to_string())
    }

    /// Sends a request; transport errors are returned as `Err`.
    pub fn try_send(
        &self,
        method: &str,
        path: &str,
        content_type: Option<&str>,
        body: Option<&str>,
    ) -> Result<Resp, String> {
        self.try_send_accepting(method, path, content_type, body, None)
    }

    /// As [`Client::try_send`], with an `Accept` header when one is given.
    pub fn try_send_accepting(
        &self,
        method: &str,
        path: &str,
        content_type: Option<&str>,
        body: Option<&str>,
        accept: Option<&str>,
    ) -> Result<Resp, String> {
        let mut r = self.req(method, path);
        if let Some(a) = accept {
            r = r.header("Accept", a);
        }
        if let Some(ct) = content_type {
            r = r.header("Content-Type", ct);
        }
        let mut resp = self.run(r, body)?;
        let code = resp.status().as_u16();
        let content_type = header(&resp, "content-type");
        let retry_after = resp
            .headers()
            .get("retry-after")
            .map(|_| header(&resp, "retry-after"));
        let warnings = resp.headers().get_all("warning").iter();
        let warnings = warnings
            .map(|v| v.to_str().unwrap_or("").to_string())
            .collect();
        // Lists of many objects are more than ureq's default limit of 10 MB.
        let text = resp
            .body_mut()
            .with_config()
            .limit(1 << 30)
            .read_to_string();
        let text = text.map_err(|e| e.to_string())?;
        let body = serde_json::from_str(&text).unwrap_or(Value::Null);
        Ok(Resp {
            code,
            body,
            content_type,
            retry_after,
            warnings,
        })
    }

    pub fn send(
        &self,
        method: &str,
        path: &str,
        content_type: Option<&str>,
        body: Option<&str>,
    ) -> Resp {
        self.try_send(method, path, content_type, body)
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
    }

    pub fn get(&self, path: &str) -> Resp {
        self.send("GET", path, None, None)
    }

    /// A GET with an `Accept` header (Table, PartialObjectMetadata...).
    pub fn get_accepting(&self, path: &str, accept: &str) -> Resp {
        self.try_send_accepting("GET", path, None, None, Some(accept))
            .unwrap_or_else(|e| panic!("GET {path}: {e}"))
    }

    pub fn post(&self, path: &str, body: &Value) -> Resp {
        self.send(
            "POST",
            path,
            Some("application/json"),
            Some(&body.to_string()),
        )
    }

    pub fn put(&self, path: &str, body: &Value) -> Resp {
        self.send(
            "PUT",
            path,
            Some("application/json"),
            Some(&body.to_string()),
        )
    }

    pub fn merge_patch(&self, path: &str, body: &Value) -> Resp {
        self.send(
            "PATCH",
            path,
            Some("application/merge-patch+json"),
            Some(&body.to_string()),
        )
    }

    pub fn json_patch(&self, path: &str, body: &Value) -> Resp {
        self.send(
            "PATCH",
            path,
            Some("application/json-patch+json"),
            Some(&body.to_string()),
        )
    }

    pub fn delete(&self, path: &str, body: Option<&Value>) -> Resp {
        let text = body.map(Value::to_string);
        self.send("DELETE", path, Some("application/json"), text.as_deref())
    }

    /// Opens a watch (the path must carry `watch=true`); panics unless it answers 200.
    pub fn watch(&self, path: &str) -> Watch {
        self.watch_accepting(path, "application/json")
    }

    /// Opens a watch with an `Accept` header; panics unless it answers 200.
    pub fn watch_accepting(&self, path: &str, accept: &str) -> Watch {
        let resp = match self.run(self.req("GET", path).header("Accept", accept), None) {
            Ok(r) => r,
            Err(e) => panic!("watch {path}: {e}"),
        };
        assert_eq!(resp.status(), 200, "watch {path}");
        let chunked = header(&resp, "transfer-encoding");
        let content_type = header(&resp, "content-type");
        Watch {
            reader: BufReader::new(Box::new(resp.into_body().into_reader())),
            chunked,
            content_type,
        }
    }
}

/// A header's value, or empty.
fn header(resp: &ureq::http::Response<ureq::Body>, name: &str) -> String {
    let value = resp.headers().get(name).and_then(|v| v.to_str().ok());
    value.unwrap_or("").to_string()
}

/// An open watch stream.
pub struct Watch {
    reader: BufReader<Box<dyn Read + Send + Sync + 'static>>,
    pub chunked: String,
    pub content_type: String,
}

/// How reading a watch stream ended.
#[derive(Debug, PartialEq, Eq)]
pub enum End {
    /// The final chunk arrived: the server closed the stream cleanly.
    Clean,
    /// The connection broke mid-stream (no final chunk).
    Broken(String),
}

impl Watch {
    /// The next event, `Ok(None)` at a clean end, `Err` when the stream broke.
    pub fn next(&mut self) -> Result<Option<Value>, String> {
        let mut line = String::new();
        match self.reader.read_line(&mut line) {
            Ok(0) => Ok(None),
            Ok(_) => serde_json::from_str(&line)
                .map(Some)
                .map_err(|e| format!("bad event {line:?}: {e}")),
            Err(e) => Err(e.to_string()),
        }
    }

    /// The next event's `type` without decoding the rest of it (for streams too long to
    /// decode in a debug build); `Ok(None)` at a clean end.
    pub fn next_type(&mut self) -> Result<Option<String>, String> {
        let mut line = String::new();
        match self.reader.read_line(&mut line) {
            Ok(0) => Ok(None),
            Ok(_) => {
                let rest = line
                    .strip_prefix("{\"type\":\"")
                    .ok_or_else(|| format!("bad event {line:?}"))?;
                Ok(rest.split('"').next().map(String::from))
            }
            Err(e) => Err(e.to_string()),
        }
    }

    /// Reads events until the stream ends; returns them and how it ended.
    pub fn collect(mut self) -> (Vec<Value>, End) {
        let mut events = Vec::new();
        loop {
            match self.next() {
                Ok(Some(e)) => events.push(e),
                Ok(None) => return (events, End::Clean),
                Err(e) => return (events, End::Broken(e)),
            }
        }
    }
}

/// A watch read on a thread of its own, so a test can wait for events with a time bound.
pub struct Events {
    rx: mpsc::Receiver<Value>,
}

impl Watch {
    /// Reads the stream on a thread; events arrive through [`Events`].
    pub fn spawn(mut self) -> Events {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            while let Ok(Some(e)) = self.next() {
                if tx.send(e).is_err() {
                    break;
                }
            }
        });
        Events { rx }
    }
}

impl Events {
    /// Events other than BOOKMARK until `n` have arrived or `timeout` passed.
    pub fn take(&self, n: usize, timeout: Duration) -> Vec<Value> {
        let deadline = std::time::Instant::now() + timeout;
        let mut out = Vec::new();
        while out.len() < n {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(e) if e["type"] == "BOOKMARK" => {}
                Ok(e) => out.push(e),
                Err(_) => break,
            }
        }
        out
    }

    /// The next event of any type, BOOKMARK included, if one arrives within `timeout`.
    pub fn any(&self, timeout: Duration) -> Option<Value> {
        self.rx.recv_timeout(timeout).ok()
    }

    /// Events other than BOOKMARK that arrive within `quiet`.
    pub fn more(&self, quiet: Duration) -> Vec<Value> {
        self.take(usize::MAX, quiet)
    }

    /// Events until one satisfies `done` (included) or `timeout` passed.
    pub fn until(&self, timeout: Duration, done: impl Fn(&Value) -> bool) -> Vec<Value> {
        let deadline = std::time::Instant::now() + timeout;
        let mut out = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(e) if e["type"] == "BOOKMARK" => {}
                Ok(e) => {
                    let stop = done(&e);
                    out.push(e);
                    if stop {
                        return out;
                    }
                }
                Err(_) => return out,
            }
        }
    }
}

/// A server with no scheduler or kubelet, for scenarios about the API server's own machinery
/// (watch history, bookmarks, optimistic concurrency, versions and events counted exactly):
/// only the test's own writes change objects. On a cluster with nodes the kubelet's status
/// writes would interleave, as they do on a real one.
pub fn start_without_kubelet() -> (TestServer, Client) {
    let server = TestServer::start(kube_testserver::Options {
        kubelet: None,
        ..kube_testserver::Options::default()
    })
    .expect("server starts");
    let admin = Client::admin(&server);
    (server, admin)
}

/// Runs kubectl against `server` with the admin kubeconfig, `stdin` piped in: whether it
/// succeeded, and its stdout and stderr. `None` when kubectl is not installed.
pub fn kubectl(server: &TestServer, args: &[&str], stdin: Option<&str>) -> Option<(bool, String)> {
    use std::io::Write;
    let installed = std::process::Command::new("kubectl")
        .args(["version", "--client"])
        .output()
        .is_ok();
    if !installed {
        return None;
    }
    let mut child = std::process::Command::new("kubectl")
        .args(args)
        .arg("--request-timeout=10s")
        .env("KUBECONFIG", server.kubeconfig_path())
        .env("HOME", server.kubeconfig_path().parent().expect("dir"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("kubectl runs");
    if let (Some(text), Some(mut input)) = (stdin, child.stdin.take()) {
        input.write_all(text.as_bytes()).expect("stdin");
    }
    let out = child.wait_with_output().expect("kubectl output");
    Some((
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr),
    ))
}

/// Polls `get` until `ok` holds for its answer (returned) or `secs` pass (panics with `what`).
pub fn wait_for(
    secs: u64,
    what: &str,
    mut get: impl FnMut() -> Value,
    ok: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = std::time::Instant::now() + Duration::from_secs(secs);
    loop {
        let v = get();
        if ok(&v) {
            return v;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}: {v}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The `type` of each event.
pub fn types(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .map(|e| e["type"].as_str().unwrap_or("?").to_string())
        .collect()
}

pub const IC: &str = "/apis/immortalcontainer.flugel.it/v1alpha1";

pub fn ic_body(name: &str, image: &str) -> Value {
    serde_json::json!({"apiVersion": "immortalcontainer.flugel.it/v1alpha1", "kind": "ImmortalContainer",
        "metadata": {"name": name}, "spec": {"image": image}})
}

pub fn pod_body(name: &str, owner: Option<(&str, &str)>) -> Value {
    let mut p = serde_json::json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"containers": [{"name": "acontainer", "image": "nginx:latest"}]}});
    if let Some((owner_name, uid)) = owner {
        p["metadata"]["ownerReferences"] = serde_json::json!([{"apiVersion": "immortalcontainer.flugel.it/v1alpha1",
            "kind": "ImmortalContainer", "name": owner_name, "uid": uid, "controller": true, "blockOwnerDeletion": true}]);
    }
    p
}
