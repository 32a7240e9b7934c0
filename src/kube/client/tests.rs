//! Tests of the API client: paths and queries, errors as the server words them, retries, timeouts,
//! proxies and connections.

use super::verbs::WatchBody;
use super::*;
use crate::testutil::fixture;

impl Error {
    /// Worth retrying unchanged after a while: throttling, server errors, no answer at all.
    fn is_transient(&self) -> bool {
        match self {
            Error::Api(s) => s.code == 429 || s.code >= 500,
            Error::Transport(_) | Error::Tls(_) | Error::Decode(_) | Error::Fenced => true,
            Error::Proxy { status, .. } => !matches!(status, 401 | 403 | 407),
            Error::Credentials(_) => false,
        }
    }
}

/// A custom resource as the operator's own is addressed (the client knows none by name).
const IMMORTAL_CONTAINERS: Resource = Resource::new(
    "/apis/immortalcontainer.flugel.it/v1alpha1",
    "immortalcontainers",
    "immortalcontainer",
);

#[test]
fn builds_namespaced_and_cluster_wide_paths() {
    assert_eq!(
        object_path(IMMORTAL_CONTAINERS, "fixtures", "example"),
        "/apis/immortalcontainer.flugel.it/v1alpha1/namespaces/fixtures/immortalcontainers/example"
    );
    assert_eq!(collection_path(Resource::PODS, None), "/api/v1/pods");
    assert_eq!(
        collection_path(Resource::EVENTS, Some("ns")),
        "/api/v1/namespaces/ns/events"
    );
    assert_eq!(
        collection_path(Resource::LEASES, Some("op")),
        "/apis/coordination.k8s.io/v1/namespaces/op/leases"
    );
    assert_eq!(
        collection_path(IMMORTAL_CONTAINERS, None),
        "/apis/immortalcontainer.flugel.it/v1alpha1/immortalcontainers"
    );
    assert_eq!(
        collection_path(Resource::TOKEN_REVIEWS, None),
        "/apis/authentication.k8s.io/v1/tokenreviews"
    );
    assert_eq!(
        collection_path(Resource::SUBJECT_ACCESS_REVIEWS, None),
        "/apis/authorization.k8s.io/v1/subjectaccessreviews"
    );
}

#[test]
fn watch_query_encodes_selector_and_asks_for_bookmarks() {
    let q = watch_query(&WatchParams {
        label_selector: Some("app.kubernetes.io/managed-by=immortal-operator"),
        resource_version: "967",
        timeout_seconds: 231,
        idle_timeout: Duration::from_secs(75),
    });
    assert_eq!(
        q,
        "?watch=true&labelSelector=app.kubernetes.io%2Fmanaged-by%3Dimmortal-operator\
             &resourceVersion=967&allowWatchBookmarks=true&timeoutSeconds=231"
    );
    // No resourceVersion: the server replays every object as ADDED, which we never want
    // from a watch (we list first), so the parameter is simply absent, never "0".
    let q = watch_query(&WatchParams {
        label_selector: None,
        resource_version: "",
        timeout_seconds: 5,
        ..Default::default()
    });
    assert_eq!(q, "?watch=true&allowWatchBookmarks=true&timeoutSeconds=5");
}

#[test]
fn list_query_pages_with_limit_and_continue() {
    assert_eq!(list_query(&ListParams::default()), "");
    let q = list_query(&ListParams {
        label_selector: None,
        limit: Some(500),
        continue_token: Some("a+b="),
    });
    assert_eq!(q, "?limit=500&continue=a%2Bb%3D");
}

#[test]
fn delete_body_carries_uid_precondition() {
    let v: serde_json::Value = serde_json::from_str(&delete_body("u-1", Some(0))).unwrap();
    assert_eq!(v["preconditions"]["uid"], "u-1");
    assert_eq!(v["gracePeriodSeconds"], 0);
    let v: serde_json::Value = serde_json::from_str(&delete_body("u-1", None)).unwrap();
    assert!(v.get("gracePeriodSeconds").is_none());
}

#[test]
fn parses_recorded_not_found() {
    let (code, body) = fixture("09-ic-get-not-found");
    let e = Error::Api(Box::new(parse_status(code, &body)));
    assert!(e.is_not_found());
    assert!(!e.is_transient());
    assert_eq!(e.to_string(), "api error 404 NotFound: immortalcontainers.immortalcontainer.flugel.it \"missing\" not found");
}

#[test]
fn tells_already_exists_from_conflict() {
    let (code, body) = fixture("12-pod-create-already-exists");
    let e = Error::Api(Box::new(parse_status(code, &body)));
    assert!(e.is_already_exists() && !e.is_conflict());
    let (code, body) = fixture("19-ic-status-merge-patch-stale-rv-conflict");
    let e = Error::Api(Box::new(parse_status(code, &body)));
    assert!(e.is_conflict() && !e.is_already_exists());
    let (code, body) = fixture("24-pod-delete-uid-precondition-mismatch");
    assert!(Error::Api(Box::new(parse_status(code, &body))).is_conflict());
}

#[test]
fn invalid_keeps_its_causes() {
    let (code, body) = fixture("13-pod-create-invalid-label-too-long");
    let e = Error::Api(Box::new(parse_status(code, &body)));
    assert!(e.is_invalid());
    let Error::Api(s) = &e else { unreachable!() };
    assert!(!s.details.as_ref().unwrap().causes.is_empty());
    assert!(e.to_string().contains("metadata.labels"), "{e}");
}

#[test]
fn a_patch_naming_a_replaced_objects_uid_is_told_from_other_refusals() {
    use crate::testutil::kubelet_fixture;
    let err = |(code, body): (u16, String)| Error::Api(Box::new(parse_status(code, &body)));
    let replaced = err(kubelet_fixture("18-pod-merge-patch-wrong-uid-invalid"));
    assert!(replaced.is_uid_changed() && !replaced.is_conflict());
    // A stale resourceVersion is the 409; an admission policy's 422 and one about another
    // field say nothing of the uid.
    let stale = err(kubelet_fixture(
        "19-pod-merge-patch-stale-resourceversion-conflict",
    ));
    assert!(stale.is_conflict() && !stale.is_uid_changed());
    let policy = err(kubelet_fixture("17-pod-create-denied-by-admission-policy"));
    assert!(policy.is_invalid() && !policy.is_uid_changed());
    let label = err(fixture("13-pod-create-invalid-label-too-long"));
    assert!(label.is_invalid() && !label.is_uid_changed());
    assert!(!err(fixture("24-pod-delete-uid-precondition-mismatch")).is_uid_changed());
}

#[test]
fn parses_forbidden_unauthorized_and_unsupported_media_type() {
    let (code, body) = fixture("26-forbidden-list-pods");
    assert!(Error::Api(Box::new(parse_status(code, &body))).is_forbidden());
    let (code, body) = fixture("27-unauthorized");
    assert!(Error::Api(Box::new(parse_status(code, &body))).is_unauthorized());
    let (code, body) = fixture("20-ic-strategic-merge-patch-unsupported");
    let s = parse_status(code, &body);
    assert_eq!((s.code, s.reason.as_str()), (415, "UnsupportedMediaType"));
}

#[test]
fn synthesises_status_from_a_body_that_is_not_one() {
    let s = parse_status(503, "<html>upstream unavailable</html>");
    assert_eq!((s.code, s.reason.as_str()), (503, "ServiceUnavailable"));
    assert!(Error::Api(Box::new(s)).is_transient());
    let s = parse_status(429, "");
    assert_eq!(s.message, "HTTP 429");
}

#[test]
fn reads_retry_after_seconds() {
    assert_eq!(retry_after(Some("3")), Some(Duration::from_secs(3)));
    assert_eq!(retry_after(Some("soon")), None);
    assert_eq!(retry_after(None), None);
}

/// A client of a fresh test API server.
#[test]
fn reads_the_texts_of_warning_headers() {
    // As fixture 25 sends them, one a header.
    assert_eq!(
        warning_texts(r#"299 - "unknown field \"spec.securityContext.appArmorProfile\"""#),
        [r#"unknown field "spec.securityContext.appArmorProfile""#]
    );
    // Joined into one, with a date, or not a warning at all.
    assert_eq!(
        warning_texts(
            r#"299 - "a, b", 299 kube-apiserver "c" "Sat, 01 Jan 2026 00:00:00 GMT", 299 - "d""#
        ),
        ["a, b", "c", "d"]
    );
    assert_eq!(warning_texts("nonsense"), Vec::<String>::new());
    assert_eq!(
        warning_texts(r#"299 - "unterminated"#),
        Vec::<String>::new()
    );
}

/// A pod field the server does not know is dropped with a warning (fixture 25): the stored
/// spec the create answers lacks it, and the warning is logged at WARN once however often it
/// comes, for this client and those made from it, within a bound.
#[test]
fn a_warning_is_logged_once_and_the_stored_spec_shows_what_was_dropped() {
    let (_server, client) = against_test_server();
    let mut pod = a_pod("p");
    pod.spec.rest.insert(
        "schedulingGroup".into(),
        serde_json::json!({"podGroupName": "g"}),
    );
    let created = client.create_pod_stored("default", &pod).unwrap();
    assert_eq!(created.pod.metadata.name, "p");
    assert_eq!(created.spec["containers"][0]["name"], "c");
    assert!(
        created.spec.get("schedulingGroup").is_none(),
        "{}",
        created.spec
    );
    let text = r#"unknown field "spec.schedulingGroup""#;
    assert!(
        !client.unpooled().first_warning(text),
        "logged with the create"
    );
    for i in 0..WARNED_AT_MOST {
        client.first_warning(&format!("text {i}"));
    }
    assert!(!client.first_warning("one more"), "past the bound: DEBUG");
}

fn against_test_server() -> (kube_testserver::TestServer, Client) {
    against(kube_testserver::Options::default())
}

fn against(options: kube_testserver::Options) -> (kube_testserver::TestServer, Client) {
    let server = kube_testserver::TestServer::start(options).unwrap();
    let client = crate::testutil::client_of(&server.kubeconfig_path());
    (server, client)
}

fn throttle(server: &kube_testserver::TestServer, status: u16, retry_after: u64) {
    server.fail_next(kube_testserver::FailRule {
        count: 1,
        status,
        retry_after: Some(retry_after),
        verb: Some("get".into()),
        path_contains: Some("/pods/x".into()),
    });
}

fn pod_gets(server: &kube_testserver::TestServer) -> u64 {
    server
        .request_counts()
        .get(&("get".to_string(), "pods".to_string()))
        .copied()
        .unwrap_or(0)
}

#[test]
fn a_short_retry_after_is_waited_out_and_the_request_retried() {
    let (server, client) = against_test_server();
    throttle(&server, 429, 1);
    // Retried after the throttle: the answer is the real one (no such pod).
    assert!(client.get_pod("default", "x").unwrap_err().is_not_found());
    assert_eq!(pod_gets(&server), 2);
}

#[test]
fn a_long_retry_after_is_handed_to_the_caller_instead_of_slept_on() {
    let (server, client) = against_test_server();
    throttle(&server, 429, 30);
    let e = client.get_pod("default", "x").unwrap_err();
    assert_eq!(e.code(), 429);
    // The caller's retry must wait at least this long.
    assert_eq!(e.retry_after(), Some(Duration::from_secs(30)));
    assert_eq!(pod_gets(&server), 1);
}

fn pod_creates(server: &kube_testserver::TestServer) -> u64 {
    server
        .request_counts()
        .get(&("create".to_string(), "pods".to_string()))
        .copied()
        .unwrap_or(0)
}

fn a_pod(name: &str) -> Pod {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"containers": [{"name": "c", "image": "pause"}]},
    }))
    .unwrap()
}

#[test]
fn a_write_outside_the_fence_is_refused_before_it_reaches_the_server() {
    let (server, client) = against_test_server();
    let fence = Arc::new(Fence::closed());
    let fenced = client.fenced(fence.clone());
    let e = fenced.create_pod("default", &a_pod("p")).unwrap_err();
    assert!(matches!(e, Error::Fenced) && e.is_transient(), "{e}");
    assert_eq!(pod_creates(&server), 0, "never sent");
    // Reads are not fenced.
    assert!(fenced.get_pod("default", "p").unwrap_err().is_not_found());
    fence.open_until(Instant::now() + Duration::from_secs(10));
    fenced.create_pod("default", &a_pod("p")).unwrap();
    fence.close();
    assert!(matches!(
        fenced.create_pod("default", &a_pod("q")),
        Err(Error::Fenced)
    ));
    assert_eq!(pod_creates(&server), 1);
}

#[test]
fn a_write_the_server_never_answers_is_given_up_when_the_fence_closes() {
    let (server, client) = against_test_server();
    server.stall(kube_testserver::StallRule {
        verb: Some("create".into()),
        ..Default::default()
    });
    let fence = Arc::new(Fence::closed());
    fence.open_until(Instant::now() + Duration::from_millis(600));
    let fenced = client.fenced(fence.clone());
    let started = Instant::now();
    let write = std::thread::spawn(move || fenced.create_pod("default", &a_pod("p")));
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(fence.writes_in_flight(), 1, "counted while it waits");
    let result = write.join().unwrap();
    let took = started.elapsed();
    assert!(matches!(result, Err(Error::Transport(_))), "{result:?}");
    assert!(
        took >= Duration::from_millis(550) && took < Duration::from_millis(1500),
        "ended with the fence, not after the 30 s request timeout: {took:?}"
    );
    assert_eq!(fence.writes_in_flight(), 0);
}

fn pod_watch(idle: Duration) -> WatchParams<'static> {
    WatchParams {
        label_selector: None,
        resource_version: "",
        timeout_seconds: 60,
        idle_timeout: idle,
    }
}

/// Runs `f` on a thread and gives up after `bound`: a read that waits forever must fail
/// the test, not hang it.
fn bounded<T: Send + 'static>(bound: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(bound)
        .expect("still waiting: the idle timeout did not fire")
}

#[test]
fn a_watch_that_goes_silent_on_an_open_connection_fails_after_its_idle_timeout() {
    let (server, client) = against(kube_testserver::Options {
        bookmark_interval: Duration::from_millis(200),
        ..Default::default()
    });
    let idle = Duration::from_millis(800);
    let mut stream = client
        .watch(Resource::PODS, Some("default"), &pod_watch(idle))
        .unwrap();
    // Bookmarks every 0.2 s keep a watch with a 0.8 s idle limit going.
    let talking = Instant::now();
    while talking.elapsed() < Duration::from_millis(1500) {
        let mut line = String::new();
        let n = stream
            .read_line(&mut line)
            .expect("bookmarks keep it alive");
        assert!(n > 0 && line.contains("BOOKMARK"), "{line:?}");
    }
    server.freeze_watches();
    let frozen = Instant::now();
    let (err, took) = bounded(Duration::from_secs(20), move || {
        let mut line = String::new();
        loop {
            line.clear();
            // Bookmarks the server had sent before the freeze may still be on their way.
            if let Err(e) = stream.read_line(&mut line) {
                return (e, frozen.elapsed());
            }
        }
    });
    assert_eq!(err.kind(), std::io::ErrorKind::TimedOut, "{err}");
    assert!(
        took >= Duration::from_millis(500) && took < Duration::from_secs(5),
        "{took:?}"
    );
    assert_eq!(server.open_watches(), 1, "the server never closed it");
}

#[test]
fn a_watch_whose_answer_never_comes_fails_after_its_idle_timeout_even_after_other_requests() {
    let (server, client) = against_test_server();
    // A pooled connection now exists; a watch must not read its head there without a limit.
    assert!(client.get_pod("default", "x").unwrap_err().is_not_found());
    server.stall(kube_testserver::StallRule {
        verb: Some("watch".into()),
        ..Default::default()
    });
    let started = Instant::now();
    let idle = Duration::from_millis(500);
    let result = bounded(Duration::from_secs(20), move || {
        client
            .watch(Resource::PODS, Some("default"), &pod_watch(idle))
            .map(drop)
    });
    let took = started.elapsed();
    assert!(matches!(result, Err(Error::Transport(_))), "{result:?}");
    assert!(
        took >= Duration::from_millis(400) && took < Duration::from_secs(5),
        "{took:?}"
    );
}

#[test]
fn a_watch_body_ends_at_its_deadline_however_much_it_is_sent() {
    let mut body = WatchBody {
        inner: Box::new(std::io::repeat(b'x')),
        deadline: Instant::now() + Duration::from_millis(100),
        idle: Duration::from_secs(60),
    };
    let mut buf = [0u8; 64];
    assert_eq!(body.read(&mut buf).unwrap(), 64);
    std::thread::sleep(Duration::from_millis(150));
    let e = body.read(&mut buf).unwrap_err();
    assert_ne!(
        e.kind(),
        std::io::ErrorKind::TimedOut,
        "not taken for silence"
    );
    assert!(e.to_string().contains("outlived"), "{e}");
}

/// A TCP relay to `port` on 127.0.0.1 that counts the connections made through it and
/// those still open.
fn relay(
    port: u16,
) -> (
    u16,
    Arc<std::sync::atomic::AtomicUsize>,
    Arc<std::sync::atomic::AtomicUsize>,
) {
    use std::net::{Shutdown, TcpListener, TcpStream};
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let local = listener.local_addr().unwrap().port();
    let (made, open) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (m, o) = (made.clone(), open.clone());
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(client) = conn else { return };
            let Ok(server) = TcpStream::connect(("127.0.0.1", port)) else {
                return;
            };
            m.fetch_add(1, SeqCst);
            o.fetch_add(1, SeqCst);
            let (mut c2, mut s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut s2, &mut c2);
                let _ = c2.shutdown(Shutdown::Write);
            });
            let o = o.clone();
            std::thread::spawn(move || {
                let (mut client, mut server) = (client, server);
                // The client closing its side is what this counts.
                let _ = std::io::copy(&mut client, &mut server);
                let _ = server.shutdown(Shutdown::Write);
                o.fetch_sub(1, SeqCst);
            });
        }
    });
    (local, made, open)
}

#[test]
fn an_unpooled_client_closes_each_connection_and_a_pooled_one_keeps_one() {
    use std::sync::atomic::Ordering::SeqCst;
    let server = kube_testserver::TestServer::start(kube_testserver::Options::default()).unwrap();
    let (port, made, open) = relay(server.port());
    let opts = crate::kube::config::LoadOptions {
        kubeconfig: Some(server.kubeconfig_path()),
        context: None,
    };
    let mut config = crate::kube::config::load(&opts).unwrap();
    config.server = format!("https://127.0.0.1:{port}");
    let client = Client::new(config, 2).unwrap();
    let settled = |want_open: usize| {
        let deadline = Instant::now() + Duration::from_secs(5);
        while open.load(SeqCst) != want_open && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        (made.load(SeqCst), open.load(SeqCst))
    };
    for _ in 0..3 {
        assert!(client
            .unpooled()
            .get_pod("default", "x")
            .unwrap_err()
            .is_not_found());
    }
    assert_eq!(settled(0), (3, 0), "one connection each, none left open");
    for _ in 0..3 {
        assert!(client.get_pod("default", "x").unwrap_err().is_not_found());
    }
    assert_eq!(
        settled(1),
        (4, 1),
        "one connection, kept for the next request"
    );
}

#[test]
fn a_request_with_no_time_left_before_its_deadline_is_not_sent() {
    let (server, client) = against_test_server();
    let e = client
        .until(Instant::now())
        .create_pod("default", &a_pod("p"))
        .unwrap_err();
    assert!(e.to_string().contains("no time left"), "{e}");
    assert_eq!(pod_creates(&server), 0);
}

#[test]
fn a_client_with_a_deadline_does_not_retry_throttling() {
    let (server, client) = against_test_server();
    throttle(&server, 503, 1);
    let e = client
        .until(Instant::now() + Duration::from_secs(1))
        .get_pod("default", "x")
        .unwrap_err();
    assert_eq!(e.code(), 503);
    assert_eq!(pod_gets(&server), 1);
}

#[test]
fn a_failed_request_is_sent_again_only_after_a_first_401_or_a_short_throttle() {
    let secs = |s| Some(Duration::from_secs(s));
    // One credential refresh per request, then the 401 is the caller's.
    assert_eq!(after_failure(401, 1, 4, false, None), Again::Refreshed);
    assert_eq!(after_failure(401, 2, 4, true, None), Again::No);
    // 429/503: the back-off grows from 400 ms and never undercuts the server's Retry-After.
    assert_eq!(
        after_failure(429, 1, 4, false, None),
        Again::After(Duration::from_millis(400))
    );
    assert_eq!(
        after_failure(503, 2, 4, false, secs(3)),
        Again::After(Duration::from_secs(3))
    );
    // Too long to wait in the caller's thread, the last attempt, or a client that may try
    // only once (`until`): the error goes back with its Retry-After.
    assert_eq!(after_failure(429, 1, 4, false, secs(30)), Again::No);
    assert_eq!(after_failure(503, 4, 4, false, None), Again::No);
    assert_eq!(after_failure(429, 1, 1, false, None), Again::No);
    // Anything else is never retried here.
    assert_eq!(after_failure(500, 1, 4, false, None), Again::No);
    assert_eq!(after_failure(409, 1, 4, false, None), Again::No);
}

#[test]
fn an_empty_metadata_list_with_null_items_reads_as_empty() {
    let page: ListPage<crate::kube::types::PartialObjectMetadata> = serde_json::from_str(
        r#"{"kind":"PartialObjectMetadataList","apiVersion":"meta.k8s.io/v1","metadata":{"resourceVersion":"7"},"items":null}"#,
    )
    .unwrap();
    assert!(page.items.is_empty());
    assert_eq!(page.metadata.resource_version, "7");
}

/// A client of a test API server whose connections go to `server` (if given) and through a
/// proxy at 127.0.0.1:`proxy_port` (if given).
fn client_via(
    server: Option<String>,
    proxy_port: Option<u16>,
) -> (kube_testserver::TestServer, Client) {
    let test_server = kube_testserver::TestServer::start(Default::default()).unwrap();
    let opts = crate::kube::config::LoadOptions {
        kubeconfig: Some(test_server.kubeconfig_path()),
        context: None,
    };
    let mut config = crate::kube::config::load(&opts).unwrap();
    if let Some(server) = server {
        config.server = server;
    }
    let proxy = proxy_port.map(|p| format!("http://op:pw@127.0.0.1:{p}"));
    config.proxy = proxy.map(|url| crate::kube::config::tests::proxy_for_test(&url));
    (test_server, Client::new(config, 2).unwrap())
}

/// A proxy that answers every CONNECT with `answer`.
fn proxy_answering(answer: &'static str) -> u16 {
    use std::io::Write;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && conn.read(&mut byte).is_ok_and(|n| n == 1) {
                head.push(byte[0]);
            }
            let _ = conn.write_all(answer.as_bytes());
        }
    });
    port
}

#[test]
fn a_connect_answered_with_anything_but_200_is_the_proxys_failure_with_its_status() {
    for (answer, code, reason) in [
        (
            "HTTP/1.1 407 Proxy Authentication Required\r\nContent-Length: 0\r\n\r\n",
            407,
            "Proxy Authentication Required",
        ),
        (
            "HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n",
            403,
            "Forbidden",
        ),
        (
            "HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n",
            502,
            "Bad Gateway",
        ),
    ] {
        let port = proxy_answering(answer);
        let (_server, client) = client_via(None, Some(port));
        let e = bounded(Duration::from_secs(20), move || {
            client.get_pod("default", "x")
        })
        .unwrap_err();
        let Error::Proxy { status, message } = &e else {
            panic!("{e:?}")
        };
        assert_eq!(*status, code, "{e}");
        let want = format!("the proxy http://127.0.0.1:{port} answered CONNECT");
        assert!(
            message.contains(&want) && message.contains(&format!("{code} {reason}")),
            "{e}"
        );
        assert!(!message.contains("pw"), "{e}");
    }
}

#[test]
fn a_proxy_that_refuses_connections_is_named_as_the_proxy() {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let (_server, client) = client_via(None, Some(port));
    let e = bounded(Duration::from_secs(20), move || {
        client.get_pod("default", "x")
    })
    .unwrap_err();
    let Error::Proxy { status: 0, message } = &e else {
        panic!("{e:?}")
    };
    let want = format!("cannot connect to the proxy http://127.0.0.1:{port}");
    assert!(
        message.contains(&want) && message.contains("refused"),
        "{e}"
    );
}

#[test]
fn a_server_that_accepts_and_never_answers_is_said_to_give_no_answer() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    // Accepts, and keeps every connection open without a word.
    std::thread::spawn(move || {
        let held: Vec<_> = listener.incoming().collect();
        drop(held);
    });
    let (_server, client) = client_via(Some(format!("https://127.0.0.1:{port}")), None);
    let started = Instant::now();
    let client = client.until(Instant::now() + Duration::from_secs(1));
    let e = bounded(Duration::from_secs(20), move || {
        client.get_pod("default", "x")
    })
    .unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(5), "{e}");
    let Error::Transport(message) = &e else {
        panic!("{e:?}")
    };
    assert!(message.ends_with("no answer in 1 s"), "{e}");
}

#[test]
fn a_server_that_trickles_its_handshake_a_byte_at_a_time_is_given_up_at_the_requests_deadline() {
    use std::io::Write;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    // Answers a ClientHello with a handshake record of 16 KiB, a byte every 400 ms: each read
    // is answered well within any per-read limit, and the handshake never ends.
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            std::thread::spawn(move || {
                let record = [0x16, 0x03, 0x03, 0x40, 0x00].into_iter();
                for byte in record.chain(std::iter::repeat_n(0, 100)) {
                    std::thread::sleep(Duration::from_millis(400));
                    if conn.write_all(&[byte]).is_err() {
                        return;
                    }
                }
            });
        }
    });
    let (_server, client) = client_via(Some(format!("https://127.0.0.1:{port}")), None);
    let started = Instant::now();
    let client = client.until(Instant::now() + Duration::from_secs(1));
    let e = bounded(Duration::from_secs(30), move || {
        client.get_pod("default", "x")
    })
    .unwrap_err();
    let took = started.elapsed();
    assert!(took < Duration::from_millis(2500), "{took:?}: {e}");
    let Error::Transport(message) = &e else {
        panic!("{e:?}")
    };
    assert!(message.ends_with("no answer in 1 s"), "{e}");
}

#[test]
fn no_debug_output_of_a_client_shows_its_proxys_password() {
    let server = kube_testserver::TestServer::start(Default::default()).unwrap();
    let opts = crate::kube::config::LoadOptions {
        kubeconfig: Some(server.kubeconfig_path()),
        context: None,
    };
    let mut config = crate::kube::config::load(&opts).unwrap();
    let url = "http://op:s3cret%40pw@127.0.0.1:3128";
    config.proxy = Some(crate::kube::config::tests::proxy_for_test(url));
    let client = Client::new(config, 2).unwrap();
    let shown = format!("{client:?}");
    assert!(shown.contains("127.0.0.1:3128"), "{shown}");
    for secret in ["s3cret", "s3cret%40pw"] {
        assert!(!shown.contains(secret), "{shown}");
    }
}

#[test]
fn a_server_at_an_ipv6_literal_is_reached() {
    use std::net::{TcpListener, TcpStream};
    let Ok(listener) = TcpListener::bind("[::1]:0") else {
        return; // no IPv6 loopback here
    };
    let server = kube_testserver::TestServer::start(Default::default()).unwrap();
    let (v6, v4) = (listener.local_addr().unwrap().port(), server.port());
    // [::1]:v6 relayed to the test server, which listens on 127.0.0.1 only.
    std::thread::spawn(move || {
        for client in listener.incoming().flatten() {
            let Ok(upstream) = TcpStream::connect(("127.0.0.1", v4)) else {
                return;
            };
            let (mut c, mut u) = (client.try_clone().unwrap(), upstream.try_clone().unwrap());
            std::thread::spawn(move || std::io::copy(&mut u, &mut c));
            std::thread::spawn(move || std::io::copy(&mut { client }, &mut { upstream }));
        }
    });
    let text = std::fs::read_to_string(server.kubeconfig_path()).unwrap();
    let mut kubeconfig: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
    let cluster = &mut kubeconfig["clusters"][0]["cluster"];
    cluster["server"] = format!("https://[::1]:{v6}").into();
    // The test server's certificate names 127.0.0.1 and localhost, not ::1.
    cluster["tls-server-name"] = "localhost".into();
    let dir = crate::kube::config::tests::TempDir::new("ipv6");
    let path = dir.write("config", serde_yaml::to_string(&kubeconfig).unwrap());
    let client = crate::testutil::client_of(&path);
    assert_eq!(client.config().server, format!("https://[::1]:{v6}"));
    let e = bounded(Duration::from_secs(20), move || {
        client.get_pod("default", "x")
    });
    assert!(e.unwrap_err().is_not_found());
}

/// Serves one HTTPS request on 127.0.0.1, answering with a head of at least `head_bytes`
/// (Warning headers, as admission webhooks' warnings make one) and a body saying how many body
/// bytes the request carried.
fn long_head_server(head_bytes: usize) -> u16 {
    use crate::kube::tls::tests::fixture;
    use rustls::pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer};
    use std::io::Write;
    let pem = fixture("server.crt");
    let chain = CertificateDer::pem_slice_iter(&pem)
        .map(|c| c.unwrap())
        .collect();
    let key = PrivateKeyDer::from_pem_slice(&fixture("server.key")).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let (tcp, _) = listener.accept().unwrap();
        let conn = rustls::ServerConnection::new(Arc::new(config)).unwrap();
        let mut tls = rustls::StreamOwned::new(conn, tcp);
        let (mut got, mut buf) = (Vec::new(), [0u8; 4096]);
        let body_len = loop {
            let n = tls.read(&mut buf).unwrap();
            assert!(n > 0, "the client closed before its request was whole");
            got.extend_from_slice(&buf[..n]);
            let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") else {
                continue;
            };
            let head = String::from_utf8_lossy(&got[..end]).to_ascii_lowercase();
            let len = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length: "));
            let len: usize = len.map_or(0, |v| v.trim().parse().unwrap());
            if got.len() >= end + 4 + len {
                break len;
            }
        };
        let mut answer = String::from("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n");
        while answer.len() < head_bytes {
            let words = "a webhook has something to say about this pod; ".repeat(6);
            answer.push_str(&format!("Warning: 299 - \"{words}\"\r\n"));
        }
        let body = format!(r#"{{"kind":"Status","code":200,"message":"{body_len}"}}"#);
        let len = body.len();
        answer.push_str(&format!(
            "Content-Length: {len}\r\nConnection: close\r\n\r\n{body}"
        ));
        tls.write_all(answer.as_bytes()).unwrap();
        tls.conn.send_close_notify();
        tls.flush().unwrap();
    });
    port
}

#[test]
fn an_answer_whose_head_is_long_is_read_and_a_body_longer_than_a_buffer_is_sent_whole() {
    let port = long_head_server(16 * 1024);
    let ca = crate::kube::tls::tests::fixture("ca.crt");
    let tls = crate::kube::tls::client_config(Some(&ca), false, None, None).unwrap();
    let config = transport::config(None, 1)
        .timeout_global(Some(Duration::from_secs(5)))
        .build();
    let agent = transport::agent_with(tls, config);
    let body = vec![b'x'; 3 * transport::BUFFER + 100];
    let request = ureq::http::Request::post(format!("https://127.0.0.1:{port}/api/v1/pods"))
        .header("Content-Type", "application/json")
        .body(&body[..])
        .unwrap();
    let mut answer = agent.run(request).expect("the answer is read");
    let warnings = answer.headers().get_all("Warning").iter().count();
    assert!(warnings > 50, "every warning is read: {warnings}");
    let status: Status =
        serde_json::from_str(&answer.body_mut().read_to_string().unwrap()).unwrap();
    assert_eq!(
        status.message,
        body.len().to_string(),
        "the server got the body whole"
    );
}
