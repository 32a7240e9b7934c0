//! Tests of the list/watch state machine, driven by scripted list pages and watch streams.

use super::script::{gone, page, pods, run, run_relisting, ByOwner, Script};
use super::*;
use crate::testutil::fixture_events;

#[test]
fn lists_then_watches_from_the_lists_resource_version() {
    let s = Script::default();
    s.lists
        .lock()
        .unwrap()
        .push_back(Ok(page("100", &[("ns", "a")], None)));
    let (calls, queued) = run(&s, ByOwner);
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
    let (calls, queued) = run(&s, ByOwner);
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
    let (calls, _) = run(&s, ByOwner);
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
    let (calls, queued) = run(&s, ByOwner);
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
    let (calls, _) = run(&s, ByOwner);
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
    let (calls, _) = run(&s, ByOwner);
    // Before it, the server's version is asked: one below the watch's would be a restore.
    assert_eq!(
        calls[..4],
        ["list continue=", "watch rv=5", "version", "watch rv=5"].map(String::from)
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
    let (calls, _) = run(&s, ByOwner);
    assert_eq!(
        calls,
        ["list continue=", "watch rv=5", "version", "watch rv=8"].map(String::from)
    );
    let text = metrics::render("h");
    let stalled = text
        .lines()
        .find_map(|l| {
            l.strip_prefix("immortal_watch_restarts_total{resource=\"pod\",reason=\"stalled\"} ")
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
    let mut w = Watcher::new(
        &s,
        pods(),
        ByOwner,
        Arc::new(Queue::new()),
        quit_rx,
        synced_tx,
        DEFAULT_IDLE_TIMEOUT,
    );
    let mut rv = "1".to_string();
    assert_eq!(w.handle_line(line, &mut rv), Err(StreamEnd::Expired));
    drop(quit_tx);
}

#[test]
fn a_periodic_relist_lists_again_and_queues_every_key_once_its_period_is_over() {
    let s = Script::default();
    s.lists
        .lock()
        .unwrap()
        .push_back(Ok(page("100", &[("ns", "a")], None)));
    s.lists
        .lock()
        .unwrap()
        .push_back(Ok(page("200", &[("ns", "a"), ("ns", "b")], None)));
    let bookmark = r#"{"type":"BOOKMARK","object":{"metadata":{"resourceVersion":"150"}}}"#;
    s.watches
        .lock()
        .unwrap()
        .push_back(Ok((format!("{bookmark}\n{bookmark}\n"), None)));
    // A period of zero: due as soon as the watch says anything.
    let (calls, queued) = run_relisting(&s, ByOwner, Relist::every(Some(Duration::ZERO)));
    assert_eq!(
        calls[..4],
        [
            "list continue=",
            "watch rv=100",
            "list continue=",
            "watch rv=200"
        ]
        .map(String::from)
    );
    assert_eq!(queued.len(), 2, "{queued:?}");
}

#[test]
fn without_a_period_nothing_relists_and_an_ask_is_answered_by_the_next_list() {
    let script = |s: &Script| {
        s.lists
            .lock()
            .unwrap()
            .push_back(Ok(page("100", &[("ns", "a")], None)));
        s.lists
            .lock()
            .unwrap()
            .push_back(Ok(page("200", &[("ns", "a")], None)));
        let bookmark = r#"{"type":"BOOKMARK","object":{"metadata":{"resourceVersion":"150"}}}"#;
        s.watches
            .lock()
            .unwrap()
            .push_back(Ok((format!("{bookmark}\n"), None)));
    };
    let s = Script::default();
    script(&s);
    let (calls, _) = run(&s, ByOwner);
    assert_eq!(
        calls[..3],
        ["list continue=", "watch rv=100", "watch rv=150"].map(String::from)
    );
    // Asked before the first list: that list answers it, no second one.
    let s = Script::default();
    script(&s);
    let relists = Relist::every(None);
    relists.ask();
    let (calls, _) = run_relisting(&s, ByOwner, relists.clone());
    assert_eq!(
        calls[..3],
        ["list continue=", "watch rv=100", "watch rv=150"].map(String::from)
    );
    // Asked again (after that list): the watch's next line ends it and the watcher lists.
    let s = Script::default();
    script(&s);
    let w = Watcher::new(
        &s,
        pods(),
        ByOwner,
        Arc::new(Queue::new()),
        crossbeam_channel::never(),
        crossbeam_channel::unbounded().0,
        DEFAULT_IDLE_TIMEOUT,
    )
    .relisting(relists.clone());
    let mut w = w;
    w.relist(None).unwrap();
    assert!(!w.relist_due());
    relists.ask();
    assert!(w.relist_due());
    w.relist(None).unwrap();
    assert!(!w.relist_due());
}

/// A watch event of pod `name` owned by `owner` at `rv`, with `status` as given.
fn pod_event(kind: &str, name: &str, owner: &str, rv: &str, status: &str) -> String {
    format!(
        r#"{{"type":"{kind}","object":{{"metadata":{{"name":"{name}","namespace":"ns","resourceVersion":"{rv}","ownerReferences":[{{"apiVersion":"immortalcontainer.flugel.it/v1alpha1","kind":"ImmortalContainer","name":"{owner}","uid":"u","controller":true}}]}},"status":{status}}}}}"#
    )
}

#[test]
fn an_event_that_does_not_decode_is_skipped_its_key_queued_and_the_watch_goes_on_past_it() {
    let s = Script::default();
    s.lists.lock().unwrap().push_back(Ok(page("5", &[], None)));
    let lines = [
        pod_event("MODIFIED", "a-immortalpod", "a", "10", r#"{"phase":7}"#),
        pod_event("MODIFIED", "a-immortalpod", "a", "11", r#"{"phase":["x"]}"#),
        pod_event(
            "MODIFIED",
            "b-immortalpod",
            "b",
            "12",
            r#"{"phase":"Running"}"#,
        ),
    ];
    s.watches
        .lock()
        .unwrap()
        .push_back(Ok((lines.join("\n") + "\n", None)));
    let (calls, queued) = run(&s, ByOwner);
    assert_eq!(
        calls,
        ["list continue=", "watch rv=5", "watch rv=12"].map(String::from),
        "resumed after the last event, not stuck before the bad one"
    );
    assert_eq!(
        queued,
        [
            ("ns/a".to_string(), "pod MODIFIED rv=11".to_string()),
            ("ns/b".to_string(), "pod MODIFIED rv=12".to_string()),
        ]
    );
}

#[test]
fn an_event_whose_key_cannot_be_read_lists_everything_again() {
    let s = Script::default();
    s.lists.lock().unwrap().push_back(Ok(page("5", &[], None)));
    s.lists
        .lock()
        .unwrap()
        .push_back(Ok(page("20", &[("ns", "a")], None)));
    let line = r#"{"type":"MODIFIED","object":{"metadata":{"name":7,"resourceVersion":"10"}}}"#;
    s.watches
        .lock()
        .unwrap()
        .push_back(Ok((format!("{line}\n"), None)));
    let (calls, queued) = run(&s, ByOwner);
    assert_eq!(
        calls,
        [
            "list continue=",
            "watch rv=5",
            "list continue=",
            "watch rv=20"
        ]
        .map(String::from)
    );
    assert_eq!(queued, [("ns/a".to_string(), "pod relist".to_string())]);
}

#[test]
fn a_watcher_of_one_namespace_relists_only_its_keys_of_a_shared_store() {
    // Two namespaces' watchers share one store; a relist of `a` must not take `b`'s keys for
    // vanished (which would forget them, and queue them for nothing).
    let store: Arc<Store<u64>> = Arc::new(Store::new());
    store.write().insert("b/x".into(), 7);
    store.write().insert("a/gone".into(), 1);
    let s = Script::default();
    s.lists
        .lock()
        .unwrap()
        .push_back(Ok(page("5", &[("a", "y")], None)));
    let queue = Arc::new(Queue::new());
    let (quit_tx, quit) = crossbeam_channel::bounded(0);
    *s.quit_tx.lock().unwrap() = Some(quit_tx);
    let (synced_tx, synced) = crossbeam_channel::unbounded();
    let kind = Kind {
        namespace: Some("a".into()),
        ..pods()
    };
    let w = Watcher::new(
        &s,
        kind,
        ByOwner,
        queue.clone(),
        quit,
        synced_tx,
        DEFAULT_IDLE_TIMEOUT,
    )
    .sharing(store.clone());
    std::thread::scope(|sc| sc.spawn(move || w.run()).join()).unwrap();
    let watch = synced.try_recv().expect("its first list is reported");
    assert_eq!((watch.resource, watch.namespace), ("pod", Some("a")));
    let mut keys: Vec<String> = store.read().keys().map(|k| k.to_string()).collect();
    keys.sort();
    assert_eq!(keys, ["a/y", "b/x"]);
    assert_eq!(store.get("b/x"), Some(7));
    queue.shutdown();
    let mut queued: Vec<String> = queue.lock_for_tests().0;
    queued.sort();
    assert_eq!(queued, ["a/gone", "a/y"]);
}

#[test]
fn a_watcher_sharing_another_stores_keys_keeps_their_copy_and_makes_one_only_for_the_rest() {
    // The pod watcher keeps its keys as the object store's copies: one allocation per object
    // where there were two (docs/benchmark.md, "One copy of each key").
    let objects: Arc<Store<u64>> = Arc::new(Store::new());
    objects.write().insert("ns/a".into(), 1);
    let theirs = objects.key("ns/a").unwrap();
    let s = Script::default();
    s.lists
        .lock()
        .unwrap()
        .push_back(Ok(page("5", &[("ns", "a"), ("ns", "c")], None)));
    let store: Arc<Store<u64>> = Arc::new(Store::new());
    let queue = Arc::new(Queue::new());
    let (quit_tx, quit) = crossbeam_channel::bounded(0);
    *s.quit_tx.lock().unwrap() = Some(quit_tx);
    let (synced_tx, _synced) = crossbeam_channel::unbounded();
    let shared = objects.clone();
    let w = Watcher::new(
        &s,
        pods(),
        ByOwner,
        queue.clone(),
        quit,
        synced_tx,
        DEFAULT_IDLE_TIMEOUT,
    )
    .sharing(store.clone())
    .keys_from(Box::new(move |key| shared.key(key)));
    std::thread::scope(|sc| sc.spawn(move || w.run()).join()).unwrap();
    let ours = store.key("ns/a").expect("listed");
    assert!(Arc::ptr_eq(&ours, &theirs), "the object store's copy");
    assert_eq!(
        store.key("ns/c").as_deref(),
        Some("ns/c"),
        "a key of its own"
    );
    queue.shutdown();
}

#[test]
fn a_watch_that_never_says_anything_asks_the_servers_version_and_lists_again_if_it_is_below() {
    // kube-apiserver 1.28 answers a watch from a resourceVersion it has not reached (etcd
    // restored from a snapshot without `--bump-revision`) with 200 and then nothing, not even a
    // bookmark, until its timeout (fixtures kube-1.28-kubelet/52, 55): resuming from there
    // would hear nothing for ever.
    let silent = || Ok((String::new(), Some(std::io::ErrorKind::TimedOut)));
    let s = Script::default();
    s.lists.lock().unwrap().push_back(Ok(page("5", &[], None)));
    s.lists.lock().unwrap().push_back(Ok(page("3", &[], None)));
    s.watches.lock().unwrap().push_back(silent());
    s.versions.lock().unwrap().push_back(Ok("3".into()));
    let (calls, _) = run(&s, ByOwner);
    assert_eq!(
        calls,
        [
            "list continue=",
            "watch rv=5",
            "version",
            "list continue=",
            "watch rv=3"
        ]
        .map(String::from)
    );
    // A watch of a resource nothing changes can be as quiet (its watch cache behind the list's
    // version): at the server's version or past it, it resumes, with no relist.
    let s = Script::default();
    s.lists.lock().unwrap().push_back(Ok(page("5", &[], None)));
    s.watches.lock().unwrap().push_back(silent());
    s.versions.lock().unwrap().push_back(Ok("9".into()));
    let (calls, _) = run(&s, ByOwner);
    assert_eq!(
        calls,
        ["list continue=", "watch rv=5", "version", "watch rv=5"].map(String::from)
    );
}

/// What newer API servers answer a watch from a version they have not reached, and what
/// client-go's reflector relists on (`isTooLargeResourceVersionError`).
fn too_large() -> serde_json::Value {
    serde_json::json!({
        "kind": "Status", "status": "Failure", "code": 504, "reason": "Timeout",
        "message": "Too large resource version: 275, current: 220",
        "details": {"causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
            "retryAfterSeconds": 1}
    })
}

#[test]
fn a_watch_refused_for_a_version_too_large_lists_again() {
    let s = Script::default();
    s.lists.lock().unwrap().push_back(Ok(page("5", &[], None)));
    s.lists.lock().unwrap().push_back(Ok(page("3", &[], None)));
    s.lists.lock().unwrap().push_back(Ok(page("4", &[], None)));
    s.watches
        .lock()
        .unwrap()
        .push_back(Err(client::Error::Api(Box::new(
            serde_json::from_value(too_large()).unwrap(),
        ))));
    let line = serde_json::json!({"type": "ERROR", "object": too_large()});
    s.watches
        .lock()
        .unwrap()
        .push_back(Ok((format!("{line}\n"), None)));
    let (calls, _) = run(&s, ByOwner);
    assert_eq!(
        calls,
        [
            "list continue=",
            "watch rv=5",
            "list continue=",
            "watch rv=3",
            "list continue=",
            "watch rv=4"
        ]
        .map(String::from)
    );
}

#[test]
fn after_the_server_was_unreachable_a_version_below_the_watchs_lists_again() {
    // The API server came back on etcd restored from a snapshot: its version is below the
    // watch's, whose resuming would hear nothing until etcd passes it (fixture
    // kube-1.28-kubelet/55), and never what happened before that.
    let s = Script::default();
    s.lists
        .lock()
        .unwrap()
        .push_back(Ok(page("275", &[], None)));
    s.lists
        .lock()
        .unwrap()
        .push_back(Ok(page("220", &[], None)));
    s.watches
        .lock()
        .unwrap()
        .push_back(Err(client::Error::Transport("connection refused".into())));
    s.versions.lock().unwrap().push_back(Ok("216".into()));
    let (calls, _) = run(&s, ByOwner);
    assert_eq!(
        calls,
        [
            "list continue=",
            "watch rv=275",
            "version",
            "list continue=",
            "watch rv=220"
        ]
        .map(String::from)
    );
    // Not below: the watch resumes.
    let s = Script::default();
    s.lists
        .lock()
        .unwrap()
        .push_back(Ok(page("275", &[], None)));
    s.watches
        .lock()
        .unwrap()
        .push_back(Err(client::Error::Transport("connection refused".into())));
    s.versions.lock().unwrap().push_back(Ok("280".into()));
    let (calls, _) = run(&s, ByOwner);
    assert_eq!(
        calls,
        ["list continue=", "watch rv=275", "version", "watch rv=275"].map(String::from)
    );
}
