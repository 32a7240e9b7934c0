//! End-to-end tests of how the operator reaches the API server and what it says when it cannot:
//! through a proxy, with wrong TLS settings or server address, and while the API server stops
//! serving our resource. They run against the test API server, or a real cluster with
//! IMMORTAL_E2E_KUBECONFIG: the kubeconfigs are edited copies of its own.

mod common;

use common::{image, name, uid, wait_until, Cluster, Operator};
use serde_json::Value;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

const TLS_FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/tls");

/// How long a configuration error may take to end the operator: well under the 30 s for which
/// start-up retries a server it cannot reach, which is what these were taken for before.
const AT_ONCE: Duration = Duration::from_secs(20);

/// Starts the operator on `kubeconfig` and waits for it to exit: its exit code, and its log.
fn exit_of(c: &Cluster, kubeconfig: &std::path::Path) -> (Option<i32>, String) {
    let mut op = Operator::start_as(c, kubeconfig, &[], "operator.log");
    let status = op
        .wait_exit(c.timeout(AT_ONCE))
        .unwrap_or_else(|| panic!("still running:\n{}", op.log_tail(20)));
    (status.code(), op.log_tail(20))
}

#[test]
fn a_certificate_authority_that_does_not_verify_the_server_ends_the_operator_naming_the_field() {
    let c = Cluster::new("wrong-ca");
    let kubeconfig = c.edited_kubeconfig("wrong-ca.kubeconfig", |cluster| {
        cluster.remove("certificate-authority-data");
        cluster.remove("insecure-skip-tls-verify");
        let ca = format!("{TLS_FIXTURES}/other-ca.crt");
        cluster.insert("certificate-authority".into(), ca.into());
    });
    let (code, log) = exit_of(&c, &kubeconfig);
    assert_eq!(code, Some(1), "{log}");
    assert!(
        log.contains("certificate-authority ")
            && log.contains("other-ca.crt")
            && log.contains("does not verify"),
        "{log}"
    );
    assert!(!log.contains("cannot reach"), "{log}");
}

#[test]
fn a_malformed_server_url_ends_the_operator_naming_the_field() {
    let c = Cluster::new("bad-server-url");
    let kubeconfig = c.edited_kubeconfig("bad-server.kubeconfig", |cluster| {
        cluster.insert("server".into(), "https://exa mple.invalid:6443".into());
    });
    let (code, log) = exit_of(&c, &kubeconfig);
    assert_eq!(code, Some(1), "{log}");
    assert!(
        log.contains("server \"https://exa mple.invalid:6443\" is not a valid URL"),
        "{log}"
    );
}

#[test]
fn a_server_without_its_scheme_separator_ends_the_operator_at_once_naming_the_field() {
    // client-go reads `htps//HOST` as host `htps` with a path, and refuses it; we used to try
    // https://htps//... for 30 s as an unreachable server.
    let c = Cluster::new("no-scheme-server");
    let kubeconfig = c.edited_kubeconfig("no-scheme.kubeconfig", |cluster| {
        cluster.insert("server".into(), "htps//127.0.0.1:6443".into());
    });
    let started = std::time::Instant::now();
    let (code, log) = exit_of(&c, &kubeconfig);
    assert_eq!(code, Some(1), "{log}");
    assert!(
        started.elapsed() < c.timeout(Duration::from_secs(5)),
        "{log}"
    );
    assert!(
        log.contains("no-scheme.kubeconfig")
            && log.contains("server \"htps//127.0.0.1:6443\" is not a valid URL"),
        "{log}"
    );
}

/// A proxy on 127.0.0.1 that answers every CONNECT with `answer`; its port.
fn proxy_answering(answer: &'static str) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
    let port = listener.local_addr().unwrap().port();
    thread::spawn(move || {
        for mut client in listener.incoming().flatten() {
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && client.read(&mut byte).is_ok_and(|n| n == 1) {
                head.push(byte[0]);
            }
            let _ = client.write_all(answer.as_bytes());
        }
    });
    port
}

#[test]
fn a_proxy_that_wants_credentials_ends_the_operator_at_once_naming_its_answer() {
    let c = Cluster::new("proxy-407");
    let port =
        proxy_answering("HTTP/1.1 407 Proxy Authentication Required\r\nContent-Length: 0\r\n\r\n");
    let kubeconfig = c.edited_kubeconfig("proxy-407.kubeconfig", |cluster| {
        cluster.insert(
            "proxy-url".into(),
            format!("http://127.0.0.1:{port}").into(),
        );
    });
    let (code, log) = exit_of(&c, &kubeconfig);
    assert_eq!(code, Some(1), "{log}");
    assert!(
        log.contains(&format!(
            "the proxy http://127.0.0.1:{port} answered CONNECT"
        )) && log.contains("407 Proxy Authentication Required"),
        "{log}"
    );
}

#[test]
fn a_proxy_that_refuses_connections_is_named_as_the_proxy_while_the_server_is_up() {
    let c = Cluster::new("proxy-down");
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let kubeconfig = c.edited_kubeconfig("proxy-down.kubeconfig", |cluster| {
        cluster.insert(
            "proxy-url".into(),
            format!("http://127.0.0.1:{port}").into(),
        );
    });
    let op = Operator::start_as(&c, &kubeconfig, &[], "operator.log");
    let want = format!("cannot reach the proxy http://127.0.0.1:{port}");
    wait_until(c.timeout(Duration::from_secs(10)), &want, || {
        match op.log_says(&want) {
            true => Ok(()),
            false => Err(op.log_tail(5)),
        }
    });
    assert!(
        !op.log_says("cannot reach the API server"),
        "{}",
        op.log_tail(5)
    );
}

/// What a [`ConnectProxy`] saw of one tunnel: its target and its `Proxy-Authorization`.
#[derive(Clone, Debug)]
struct Tunnel {
    target: String,
    authorization: Option<String>,
}

/// A CONNECT-only HTTP proxy on 127.0.0.1, as a corporate network puts between a user and the
/// cluster: each connection must open with `CONNECT host:port`; it dials the target, answers
/// 200 and copies bytes both ways until either side closes, and records every tunnel.
struct ConnectProxy {
    addr: SocketAddr,
    tunnels: Arc<Mutex<Vec<Tunnel>>>,
}

impl ConnectProxy {
    fn start() -> ConnectProxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let addr = listener.local_addr().unwrap();
        let tunnels = Arc::new(Mutex::new(Vec::new()));
        let seen = tunnels.clone();
        // Runs until the test process ends: a test's proxy is not reused by another.
        thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let seen = seen.clone();
                thread::spawn(move || {
                    let _ = tunnel(client, &seen);
                });
            }
        });
        ConnectProxy { addr, tunnels }
    }

    fn tunnels(&self) -> Vec<Tunnel> {
        self.tunnels.lock().unwrap().clone()
    }
}

/// Serves one proxy connection.
fn tunnel(mut client: TcpStream, seen: &Mutex<Vec<Tunnel>>) -> io::Result<()> {
    client.set_read_timeout(Some(Duration::from_secs(10)))?;
    // Byte by byte up to the blank line: what follows it belongs to the tunnel.
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && head.len() < 8192 {
        if client.read(&mut byte)? == 0 {
            return Ok(());
        }
        head.push(byte[0]);
    }
    client.set_read_timeout(None)?;
    let head = String::from_utf8_lossy(&head).into_owned();
    let mut lines = head.lines();
    let target = match lines
        .next()
        .unwrap_or_default()
        .split(' ')
        .collect::<Vec<_>>()[..]
    {
        ["CONNECT", target, _] => target.to_string(),
        _ => {
            client.write_all(b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n")?;
            return Ok(());
        }
    };
    let authorization = lines.find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case("proxy-authorization")
            .then(|| v.trim().to_string())
    });
    seen.lock().unwrap().push(Tunnel {
        target: target.clone(),
        authorization,
    });
    let server = match TcpStream::connect(&target) {
        Ok(s) => s,
        Err(_) => {
            client.write_all(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")?;
            return Ok(());
        }
    };
    client.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")?;
    let (mut from_client, mut to_server) = (client.try_clone()?, server.try_clone()?);
    let up = thread::spawn(move || {
        let _ = io::copy(&mut from_client, &mut to_server);
        let _ = to_server.shutdown(Shutdown::Write);
    });
    let (mut from_server, mut to_client) = (server, client);
    let _ = io::copy(&mut from_server, &mut to_client);
    let _ = to_client.shutdown(Shutdown::Write);
    let _ = up.join();
    Ok(())
}

#[test]
fn through_a_kubeconfig_proxy_url_the_operator_converges_and_keeps_the_password_out_of_its_log() {
    let c = Cluster::new("proxy-url");
    let proxy = ConnectProxy::start();
    let server = c.api_server();
    // On the test server the operator has a user of its own, so its requests can be counted.
    let base = match c.test_server() {
        Some(server) => {
            server.record_requests();
            c.user_kubeconfig(server, "proxied")
        }
        None => c.kubeconfig().to_path_buf(),
    };
    let kubeconfig = c.edited_copy(&base, "proxied.kubeconfig", |cluster| {
        // Percent-encoded, as a URL's password must be: the proxy gets `s3cret@pw`.
        let url = format!("http://op:s3cret%40pw@{}", proxy.addr);
        cluster.insert("proxy-url".into(), url.into());
    });
    let op = Operator::start_as(&c, &kubeconfig, &[], "operator.log");
    c.create_ic("web", &image());
    let first = c.wait_converged("web", 1, |_| Ok(()));
    // A replacement needs the pod watch's DELETED event: the watches go through it too.
    assert!(
        c.delete_pod(name(&first), uid(&first)),
        "the pod was already gone"
    );
    let old = uid(&first).to_string();
    c.wait_converged("web", 2, |p| match uid(p) != old {
        true => Ok(()),
        false => Err("still the old pod".into()),
    });

    let tunnels = proxy.tunnels();
    // The start-up checks, a list and a watch for each resource, the writes: all tunnelled.
    assert!(tunnels.len() >= 3, "{tunnels:?}");
    for t in &tunnels {
        assert_eq!(t.target, server, "{tunnels:?}");
        // base64("op:s3cret@pw")
        assert_eq!(
            t.authorization.as_deref().map(|a| a.to_ascii_lowercase()),
            Some("basic b3a6cznjcmv0qhb3".to_string()),
            "{tunnels:?}"
        );
    }
    assert!(
        op.log_says(&format!("http://{}", proxy.addr)),
        "{}",
        op.log_tail(20)
    );
    for secret in ["s3cret", "b3A6czNjcmV0QHB3"] {
        assert!(!op.log_says(secret), "{}", op.log_tail(20));
    }
    if let Some(server) = c.test_server() {
        // Pooled connections are tunnels kept open: fewer tunnels than requests.
        let requests = server
            .request_log()
            .iter()
            .filter(|r| r.user == "proxied")
            .count();
        assert!(
            tunnels.len() < requests,
            "{} tunnels for {requests} requests",
            tunnels.len()
        );
    }
}

/// The operator's JSON log lines from `resource`'s watcher.
fn watcher_lines(op: &Operator, resource: &str) -> Vec<Value> {
    std::fs::read_to_string(op.log_path())
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["target"] == "watcher" && v["resource"] == resource)
        .collect()
}

#[test]
fn a_deleted_crd_is_named_in_one_warn_and_its_return_said_at_info() {
    let c = Cluster::new("crd-deleted");
    let Some(_server) = c.test_server_or_skip("crd-deleted deletes the cluster-wide CRD") else {
        return;
    };
    let op = Operator::start(&c);
    c.create_ic("web", &image());
    c.wait_converged("web", 1, |_| Ok(()));

    let crd = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/immortalcontainers.immortalcontainer.flugel.it";
    c.api.delete(crd, None).expect("delete the CRD");
    // Four failed watches: the fourth is where a WARN per retry began.
    let failed = |v: &Value| v["error"].as_str().is_some_and(|e| e.contains("404"));
    wait_until(
        c.timeout(Duration::from_secs(30)),
        "four watches answered 404",
        || {
            let n = watcher_lines(&op, "immortalcontainer")
                .iter()
                .filter(|v| failed(v))
                .count();
            (n >= 4).then_some(()).ok_or(format!("{n} so far"))
        },
    );
    let warns: Vec<Value> = watcher_lines(&op, "immortalcontainer")
        .into_iter()
        .filter(|v| v["level"] == "WARN")
        .collect();
    assert_eq!(warns.len(), 1, "{warns:#?}");
    let said = warns[0]["msg"].as_str().unwrap_or_default();
    assert!(
        said.contains("ImmortalContainer CRD is not installed") && said.contains("make install"),
        "{said}"
    );

    c.create_crd();
    wait_until(
        c.timeout(Duration::from_secs(30)),
        "the watch to say it works again",
        || {
            let lines = watcher_lines(&op, "immortalcontainer");
            lines
                .iter()
                .any(|v| v["level"] == "INFO" && v["msg"] == "watch works again")
                .then_some(())
                .ok_or_else(|| op.log_tail(5))
        },
    );
    // Deleting the CRD deleted its objects; a new one is served as before.
    c.create_ic("again", &image());
    c.wait_converged("again", 1, |_| Ok(()));
}
