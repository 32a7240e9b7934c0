//! Tests of what watch events mean: recorded pods and events in, keys, hints and priorities out.

use super::*;
use crate::immortal::ic_state::IcState;
use crate::immortal::types::{self as ic, ImmortalContainer};
use crate::kube::types::{self, Pod};
use crate::runtime::queue::Priority;
use crate::runtime::watcher::{EventHandler, Listed, Reaction};
use crate::testutil::kubelet_events;
use std::sync::Arc;

/// The events of a watch recorded on a real cluster with a kubelet, each pod given the
/// controller reference our pods carry (the recorded pods were made with kubectl).
fn recorded(name: &str) -> Vec<(&'static str, Pod)> {
    kubelet_events(name)
        .iter()
        .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap())
        .filter(|e| e["type"] != "BOOKMARK")
        .map(|mut e| {
            e["object"]["metadata"]["ownerReferences"] = serde_json::json!([{
                "apiVersion": "immortalcontainer.flugel.it/v1alpha1",
                "kind": "ImmortalContainer", "name": "web", "uid": "ic-uid", "controller": true}]);
            let event = match e["type"].as_str() {
                Some("ADDED") => "ADDED",
                Some("MODIFIED") => "MODIFIED",
                _ => "DELETED",
            };
            (event, serde_json::from_value(e["object"].clone()).unwrap())
        })
        .collect()
}

/// What the pod watcher does with each recorded event: "-" for nothing, else the hint it
/// queues ("gone!", or the phase and reason the event showed), with "!" when it is queued
/// urgent. `seed`: the cached copy before the stream, as the event before it (the stream starts
/// mid-life) would have left it.
fn verdicts(name: &str, seed: Option<usize>) -> Vec<String> {
    verdicts_of(&recorded(name), seed)
}

fn verdicts_of(events: &[(&'static str, Pod)], seed: Option<usize>) -> Vec<String> {
    let mut cached = seed.map(|i| PodEventHandler.cached(&events[i].1));
    events
        .iter()
        .map(
            |(event, pod)| match PodEventHandler.on_event(event, pod, &mut cached) {
                Reaction::Ignore => "-".to_string(),
                Reaction::Queue(hint, priority) => {
                    let urgent = if priority == Priority::Urgent {
                        "!"
                    } else {
                        ""
                    };
                    let what = match hint {
                        Some(PodHint::Left(_)) => "gone".to_string(),
                        Some(PodHint::Seen(p)) => {
                            format!("{} {}", p.view.phase.as_str(), p.view.reason.as_str())
                        }
                        None => "queue".to_string(),
                    };
                    what + urgent
                }
            },
        )
        .collect()
}

#[test]
fn a_pod_starting_costs_one_reconcile_when_it_runs() {
    // ADDED, PodScheduled, ContainerCreating: what reconcile wrote after its create.
    assert_eq!(
        verdicts("03-watch-pod-scheduled-then-running", None),
        ["-", "-", "-", "Running PodRunning"]
    );
}

#[test]
fn a_pod_still_held_is_counted_at_once_released_with_its_next_event_and_at_once_when_deleted() {
    let held = |name: &str| {
        let mut events = recorded(name);
        for (_, pod) in &mut events {
            pod.metadata.finalizers.push(ic::COUNT_FINALIZER.into());
        }
        events
    };
    // Its ADDED event is what counts a pod we just made, so that its object's status names
    // it (urgent); each event after it may let it go (routine), its view changed or not.
    assert_eq!(
        verdicts_of(&held("03-watch-pod-scheduled-then-running"), None),
        [
            "Pending PodPending!",
            "Pending PodPending",
            "Pending PodPending",
            "Running PodRunning"
        ]
    );
    // Someone deleting it waits on us: urgent, each event while it is still held, however
    // little its view changed.
    let t = "Terminating PodTerminating!";
    assert_eq!(
        verdicts_of(&held("04-watch-graceful-delete-default-grace"), None),
        [t, t, t, t, "gone!"]
    );
}

#[test]
fn a_graceful_deletion_queues_the_owner_when_it_starts_and_when_the_pod_is_gone() {
    // MODIFIED deleting (Running), Succeeded while deleting, again, grace 0, DELETED with
    // phase Succeeded: the terminal phase during deletion changes nothing we report, and
    // the DELETED event is never dropped, whatever phase it carries.
    for name in [
        "04-watch-graceful-delete-default-grace",
        "05-watch-delete-grace-period-1",
    ] {
        assert_eq!(
            verdicts(name, None),
            ["Terminating PodTerminating", "-", "-", "-", "gone!"],
            "{name}"
        );
    }
}

#[test]
fn a_forced_delete_is_gone_while_the_phase_still_says_running() {
    assert_eq!(
        verdicts("06-watch-force-delete-grace-0", None),
        ["Terminating PodTerminating", "gone!"]
    );
}

#[test]
fn an_eviction_says_why_the_pod_is_going_and_queues_the_owner_when_it_is_gone() {
    // The DisruptionTarget condition alone changes nothing: the pod still runs and is ready.
    let v = verdicts("07-watch-eviction", Some(0));
    assert_eq!(
        v,
        [
            "-",
            "Terminating PodTerminating",
            "-",
            "-",
            "-",
            "-",
            "gone!"
        ]
    );
    let events = recorded("07-watch-eviction");
    assert_eq!(
        PodView::of(&events[1].1)
            .message
            .text(&events[1].1.metadata.name),
        "pod evicted is being deleted (EvictionByEvictionAPI: Eviction API: evicting)"
    );
}

#[test]
fn how_a_pod_ended_keeps_who_ended_it_an_eviction_the_kubelet_or_nobody_said() {
    let last = |name: &str| Ending::of(&recorded(name).last().unwrap().1).expect("it ended");
    let evicted = last("07-watch-eviction");
    assert_eq!(
        (evicted.how, evicted.reason()),
        (How::Deleted, Some("EvictionByEvictionAPI"))
    );
    let failed = last("09-watch-kubelet-fails-pod-deadline-exceeded");
    assert_eq!(
        (failed.how, failed.reason()),
        (How::Ended, Some("DeadlineExceeded"))
    );
    // `kubectl delete pod`: no condition, no reason.
    let deleted = last("04-watch-graceful-delete-default-grace");
    assert_eq!((deleted.how, deleted.reason()), (How::Deleted, None));
    for (ending, said) in [
        (&evicted, "was deleted (EvictionByEvictionAPI) "),
        (&failed, "ended (DeadlineExceeded) "),
        (&deleted, "was deleted "),
    ] {
        let text = ending.to_string();
        assert!(
            text.starts_with(said) && text.ends_with(" after it started"),
            "{text}"
        );
    }
}

#[test]
fn a_pod_the_kubelet_failed_is_reported_not_ready_then_terminal() {
    assert_eq!(
        verdicts("09-watch-kubelet-fails-pod-deadline-exceeded", Some(0)),
        ["-", "Running PodNotReady", "Failed PodTerminated!", "-"]
    );
    let events = recorded("09-watch-kubelet-fails-pod-deadline-exceeded");
    assert_eq!(
        PodView::of(&events[2].1).message.text(&events[2].1.metadata.name),
        "pod deadline ended in phase Failed: DeadlineExceeded: Pod was active on the node longer than the specified deadline"
    );
}

#[test]
fn a_phase_a_client_wrote_is_reported_and_so_is_the_kubelets_correction() {
    assert_eq!(
        verdicts("10-watch-client-writes-failed-kubelet-reverts", None),
        ["Failed PodTerminated!", "Running PodRunning"]
    );
}

#[test]
fn an_unschedulable_pod_is_reported_with_the_schedulers_words() {
    assert_eq!(
        verdicts("11-watch-unschedulable-node-cordoned", None),
        ["-", "Pending PodUnschedulable"]
    );
    let events = recorded("11-watch-unschedulable-node-cordoned");
    let view = PodView::of(&events[1].1);
    let message = view.message.text(&events[1].1.metadata.name);
    assert!(!view.ready);
    assert!(
        message
            .starts_with("pod unschedulable cannot be scheduled: 0/1 nodes are available: 1 node(s) were unschedulable."),
        "{}",
        message
    );
}

#[test]
fn a_pod_whose_label_was_removed_left_our_watch_and_queues_its_owner() {
    let v = verdicts("12-watch-label-removed-leaves-selected-watch", Some(0));
    assert_eq!(v, ["-", "gone!"]);
}

fn pod(phase: &str, status: serde_json::Value) -> Pod {
    let mut st = status;
    st["phase"] = phase.into();
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web-immortalpod"},
        "spec": {"containers": [{"name": "acontainer", "image": "nginx"}]},
        "status": st}))
    .unwrap()
}

#[test]
fn ready_is_true_only_for_a_running_pod_whose_own_ready_condition_is_true() {
    let ready = serde_json::json!({"conditions": [{"type": "Ready", "status": "True"}]});
    let running = PodView::of(&pod("Running", ready.clone()));
    assert!(running.ready);
    assert_eq!(
        (
            running.reason.as_str(),
            running.message.text("web-immortalpod").as_str()
        ),
        ("PodRunning", "pod web-immortalpod runs nginx")
    );
    // The recorded fake kubelet says Ready while still Pending: not running, not ready.
    assert!(!PodView::of(&pod("Pending", ready.clone())).ready);
    let mut deleting = pod("Running", ready);
    deleting.metadata.deletion_timestamp = Some("2026-01-01T00:00:00Z".into());
    assert!(!PodView::of(&deleting).ready);
    let not_ready = PodView::of(&pod(
        "Running",
        serde_json::json!({"conditions": [{"type": "Ready", "status": "False",
            "reason": "ContainersNotReady", "message": "containers with unready status: [acontainer]"}]}),
    ));
    assert_eq!(
        (not_ready.ready, not_ready.reason.as_str(), not_ready.message.text("web-immortalpod").as_str()),
        (
            false,
            "PodNotReady",
            "pod web-immortalpod is running but not ready (ContainersNotReady: containers with unready status: [acontainer])"
        )
    );
}

#[test]
fn a_failing_image_pull_and_a_crash_loop_are_named_with_the_kubelets_words() {
    let pull = PodView::of(&pod(
        "Pending",
        serde_json::json!({"containerStatuses": [{"name": "acontainer", "state": {"waiting": {
            "reason": "ImagePullBackOff", "message": "Back-off pulling image \"nope\""}}}]}),
    ));
    assert_eq!(
        (pull.reason.as_str(), pull.message.text("web-immortalpod").as_str()),
        (
            "ImagePullFailed",
            "pod web-immortalpod cannot pull its image: ImagePullBackOff: Back-off pulling image \"nope\""
        )
    );
    let crash = PodView::of(&pod(
        "Running",
        serde_json::json!({"conditions": [{"type": "Ready", "status": "False"}],
            "containerStatuses": [{"name": "acontainer", "restartCount": 3,
            "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s restarting failed container=acontainer"}},
            "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}}}]}),
    ));
    assert_eq!(
        (crash.reason.as_str(), crash.message.text("web-immortalpod").as_str()),
        (
            "PodCrashLooping",
            "container of pod web-immortalpod keeps exiting: back-off 40s restarting failed container=acontainer; it last exited with code 1 (Error)"
        )
    );
    // A pod starting as it should is plainly pending: nothing for a user to act on.
    let creating = PodView::of(&pod(
        "Pending",
        serde_json::json!({"containerStatuses": [{"name": "acontainer", "state": {"waiting": {
            "reason": "ContainerCreating"}}}]}),
    ));
    assert_eq!(creating, PodView::pending());
}

/// A native sidecar is an init container: its state is in `initContainerStatuses`, it keeps
/// the pod not ready while it restarts (Kubernetes' own Ready says so), and a crash loop of it
/// is named as acontainer's is; so is an init container's that holds the pod Pending.
#[test]
fn a_crash_looping_sidecar_or_init_container_is_named_as_acontainers_is() {
    let running = serde_json::json!({"name": "acontainer", "state": {"running": {}}});
    let looping = |name: &str| {
        serde_json::json!({"name": name, "restartCount": 4,
            "state": {"waiting": {"reason": "CrashLoopBackOff",
                "message": format!("back-off 1m20s restarting failed container={name}")}},
            "lastState": {"terminated": {"exitCode": 0, "reason": "Completed"}}})
    };
    let sidecar = PodView::of(&pod(
        "Running",
        serde_json::json!({"conditions": [{"type": "Ready", "status": "False",
            "reason": "ContainersNotReady", "message": "containers with unready status: [log]"}],
            "initContainerStatuses": [looping("log")], "containerStatuses": [running]}),
    ));
    assert_eq!(
        (sidecar.ready, sidecar.reason.as_str(), sidecar.message.text("web-immortalpod").as_str()),
        (
            false,
            "PodCrashLooping",
            "sidecar log of pod web-immortalpod keeps exiting: back-off 1m20s restarting failed container=log; it last exited with code 0 (Completed)"
        )
    );
    let init = PodView::of(&pod(
        "Pending",
        serde_json::json!({"initContainerStatuses": [looping("setup")],
            "containerStatuses": [{"name": "acontainer", "state": {"waiting": {"reason": "PodInitializing"}}}]}),
    ));
    assert_eq!(
        (init.reason.as_str(), init.message.text("web-immortalpod").as_str()),
        (
            "PodCrashLooping",
            "init container setup of pod web-immortalpod keeps exiting: back-off 1m20s restarting failed container=setup; it last exited with code 0 (Completed)"
        )
    );
    // A sidecar running and ready: the pod's own Ready condition says the rest.
    let ready = PodView::of(&pod(
        "Running",
        serde_json::json!({"conditions": [{"type": "Ready", "status": "True"}],
            "initContainerStatuses": [{"name": "log", "ready": true, "state": {"running": {}}}],
            "containerStatuses": [running]}),
    ));
    assert!(ready.ready);
}

#[test]
fn a_changed_view_queues_its_owner_once_and_a_repeat_does_not() {
    let ready = pod(
        "Running",
        serde_json::json!({"conditions": [{"type": "Ready", "status": "True"}]}),
    );
    let mut p = ready.clone();
    p.metadata.owner_references = vec![types::OwnerReference {
        api_version: ic::API_VERSION.into(),
        kind: ic::KIND.into(),
        name: "web".into(),
        uid: "ic-uid".into(),
        controller: Some(true),
        block_owner_deletion: None,
    }];
    let mut cached = None;
    assert!(matches!(
        PodEventHandler.on_event("MODIFIED", &p, &mut cached),
        Reaction::Queue(Some(PodHint::Seen(_)), Priority::Routine)
    ));
    assert_eq!(
        PodEventHandler.on_event("MODIFIED", &p, &mut cached),
        Reaction::Ignore
    );
    assert_eq!(PodEventHandler.key_of(&p).as_deref(), Some("/web"));
    // Not ours (no controller reference to an ImmortalContainer): no key at all.
    assert_eq!(PodEventHandler.key_of(&ready), None);
}

#[test]
fn an_object_is_queued_when_it_needs_a_pod_or_a_look_and_not_for_our_own_writes() {
    let ic = |rv: &str, generation: i64, starts: i64| -> ImmortalContainer {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "ns", "uid": "u",
                "resourceVersion": rv, "generation": generation},
            "status": {"startTimes": starts}}))
        .unwrap()
    };
    // New: a pod to make.
    let mut cached = None;
    assert_eq!(
        IcEventHandler.on_event("ADDED", &ic("10", 1, 0), &mut cached),
        Reaction::Queue(None, Priority::Urgent)
    );
    // Our status write: its answer is remembered (as reconcile does, see `ic_state::saw`),
    // so its event, and any older copy, is nothing new.
    cached = Some(Arc::new(IcState::of(&ic("11", 1, 1))));
    for older in [ic("11", 1, 1), ic("10", 1, 0)] {
        assert_eq!(
            IcEventHandler.on_event("MODIFIED", &older, &mut cached),
            Reaction::Ignore
        );
    }
    assert_eq!(cached.as_ref().unwrap().resource_version(), "11");
    // Our write's event before its answer: only status changed, nothing to do, but
    // remembered.
    assert_eq!(
        IcEventHandler.on_event("MODIFIED", &ic("12", 1, 7), &mut cached),
        Reaction::Ignore
    );
    assert_eq!(
        cached
            .as_ref()
            .unwrap()
            .to_object("ns", "web")
            .status
            .start_times,
        Some(7)
    );
    // A spec change: a pod to replace, urgent.
    assert_eq!(
        IcEventHandler.on_event("MODIFIED", &ic("13", 2, 7), &mut cached),
        Reaction::Queue(None, Priority::Urgent)
    );
    // A deletion is looked at (its pod may hold our finalizer), and forgotten.
    assert_eq!(
        IcEventHandler.on_event("DELETED", &ic("14", 2, 7), &mut cached),
        Reaction::Queue(None, Priority::Routine)
    );
    assert!(cached.is_none());
}

#[test]
fn a_listed_object_that_needs_a_pod_is_urgent_and_one_that_has_its_pod_is_routine() {
    let listed = |status: serde_json::Value, generation: i64| {
        let ic: ImmortalContainer = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "ns", "uid": "u",
                "resourceVersion": "10", "generation": generation},
            "spec": {"image": "nginx"},
            "status": status}))
        .unwrap();
        IcEventHandler.relist_priority(&IcEventHandler.cached(&ic))
    };
    let has_pod = serde_json::json!({"startTimes": 1, "currentPod": "web-immortalpod",
        "lastCountedPodUID": "p1", "observedGeneration": 1});
    // Made while the operator was away: its pod goes before any refresh.
    assert_eq!(listed(serde_json::json!({}), 1), Priority::Urgent);
    // Its spec changed while the operator was away: a pod to replace.
    assert_eq!(listed(has_pod.clone(), 2), Priority::Urgent);
    // Running as status says: a refresh.
    assert_eq!(listed(has_pod, 1), Priority::Routine);
}

/// The ImmortalContainer watcher, run over `script` until it runs out: what its store
/// holds of `ns/web` then.
fn watched_ic(script: &crate::runtime::watcher::script::Script) -> ImmortalContainer {
    use crate::runtime::store::Store;
    use crate::runtime::watcher::Watcher;
    let store = Arc::new(Store::new());
    let (quit_tx, quit) = crossbeam_channel::bounded(0);
    *script.quit_tx.lock().unwrap() = Some(quit_tx);
    let (synced, _synced_rx) = crossbeam_channel::unbounded();
    let w = Watcher::new(
        script,
        immortal_containers_kind(None),
        IcEventHandler,
        Arc::new(crate::runtime::queue::Queue::new()),
        quit,
        synced,
        crate::runtime::watcher::DEFAULT_IDLE_TIMEOUT,
    )
    .sharing(store.clone());
    std::thread::scope(|s| s.spawn(move || w.run()).join()).unwrap();
    let held = store.get("ns/web").expect("the store knows ns/web");
    held.to_object("ns", "web")
}

fn ic_json(uid: &str, rv: &str, image: &str, starts: i64) -> serde_json::Value {
    serde_json::json!({
        "metadata": {"name": "web", "namespace": "ns", "uid": uid, "resourceVersion": rv,
            "generation": 1},
        "spec": {"image": image}, "status": {"startTimes": starts}})
}

fn ic_list(rv: &str, item: serde_json::Value) -> serde_json::Value {
    serde_json::json!({"metadata": {"resourceVersion": rv}, "items": [item]})
}

#[test]
fn a_relist_after_410_takes_the_object_made_again_under_the_same_name() {
    use crate::runtime::watcher::script::{gone, Script};
    // Deleted and made again while the watch was down; the watch resumes with a version
    // too old (410) and lists: the store must hold the new object, or its pod is made for
    // the old uid (and removed by the garbage collector) and every count is refused. (Made
    // after the old one, the new object has the later version, where versions are numbers.)
    for (old_rv, new_rv) in [("10", "20"), ("opaque-2", "opaque-1")] {
        let s = Script::default();
        let mut lists = s.lists.lock().unwrap();
        lists.push_back(Ok(ic_list(old_rv, ic_json("old-uid", old_rv, "nginx", 3))));
        lists.push_back(Ok(ic_list(new_rv, ic_json("new-uid", new_rv, "nginx", 0))));
        drop(lists);
        s.watches.lock().unwrap().push_back(Err(gone()));
        let held = watched_ic(&s);
        assert_eq!(
            (held.metadata.uid.as_str(), held.status.start_times),
            ("new-uid", Some(0)),
            "{old_rv} then {new_rv}"
        );
    }
}

#[test]
fn a_relist_takes_a_changed_object_whose_versions_cannot_be_compared() {
    use crate::runtime::watcher::script::{gone, Script};
    let s = Script::default();
    let mut lists = s.lists.lock().unwrap();
    lists.push_back(Ok(ic_list("a", ic_json("u", "a", "nginx:1", 1))));
    lists.push_back(Ok(ic_list("b", ic_json("u", "b", "nginx:2", 1))));
    drop(lists);
    s.watches.lock().unwrap().push_back(Err(gone()));
    assert_eq!(watched_ic(&s).spec.image, "nginx:2");
}

#[test]
fn a_relist_keeps_a_later_copy_of_the_same_object() {
    use crate::runtime::watcher::script::{gone, Script};
    // Our status write's answer (rv 12) went in while a list served at rv 11 was read.
    let old = Arc::new(IcState::of(
        &serde_json::from_value(ic_json("u", "12", "nginx", 2)).unwrap(),
    ));
    let listed = Arc::new(IcState::of(
        &serde_json::from_value(ic_json("u", "11", "nginx", 1)).unwrap(),
    ));
    let served = Listed {
        version: Some(11),
        rewound: false,
    };
    assert_eq!(IcEventHandler.relisted(old.clone(), listed, &served), old);
    // The watcher's own path: the same object listed again, unchanged.
    let s = Script::default();
    let mut lists = s.lists.lock().unwrap();
    lists.push_back(Ok(ic_list("12", ic_json("u", "12", "nginx", 2))));
    lists.push_back(Ok(ic_list("13", ic_json("u", "12", "nginx", 2))));
    drop(lists);
    s.watches.lock().unwrap().push_back(Err(gone()));
    assert_eq!(watched_ic(&s).status.start_times, Some(2));
}

#[test]
fn the_deleted_event_of_an_object_forgets_its_copy_and_not_a_later_objects() {
    let ic = |uid: &str, rv: &str| -> ImmortalContainer {
        serde_json::from_value(ic_json(uid, rv, "nginx", 0)).unwrap()
    };
    let mut cached = Some(Arc::new(IcState::of(&ic("new-uid", "20"))));
    assert_eq!(
        IcEventHandler.on_event("DELETED", &ic("old-uid", "15"), &mut cached),
        Reaction::Queue(None, Priority::Routine)
    );
    assert_eq!(cached.as_ref().unwrap().uid(), "new-uid");
    IcEventHandler.on_event("DELETED", &ic("new-uid", "21"), &mut cached);
    assert!(cached.is_none());
    // A copy older than the object deleted went before it was made: forgotten too.
    let mut cached = Some(Arc::new(IcState::of(&ic("older-uid", "5"))));
    IcEventHandler.on_event("DELETED", &ic("old-uid", "15"), &mut cached);
    assert!(cached.is_none());
}

#[test]
fn a_late_event_of_an_object_deleted_since_never_replaces_the_one_made_after_it() {
    let ic = |uid: &str, rv: &str| -> ImmortalContainer {
        serde_json::from_value(ic_json(uid, rv, "nginx", 0)).unwrap()
    };
    // The new object was read (a status write refused, then a read) before the watch
    // brought the old object's last events.
    let mut cached = Some(Arc::new(IcState::of(&ic("new-uid", "20"))));
    assert_eq!(
        IcEventHandler.on_event("MODIFIED", &ic("old-uid", "15"), &mut cached),
        Reaction::Ignore
    );
    assert_eq!(cached.as_ref().unwrap().uid(), "new-uid");
    // Listed, the same: a list served before the read cannot undo it.
    let listed = Arc::new(IcState::of(&ic("old-uid", "15")));
    let served = Listed {
        version: Some(15),
        rewound: false,
    };
    let kept = IcEventHandler.relisted(cached.clone().unwrap(), listed, &served);
    assert_eq!(kept.uid(), "new-uid");
}

/// The pod event handler over a recorded stream, run by a real watcher.
#[test]
fn recorded_stream_moves_the_version_through_bookmarks_and_rewatches_after_a_clean_end() {
    use crate::runtime::watcher::script::{page, run, Script};
    use crate::testutil::fixture_events;
    // The recorded stream: MODIFIED (Failed), MODIFIED (deleting), DELETED, BOOKMARK rv 970.
    let events = fixture_events("30-watch-pods-from-list-rv").join("\n") + "\n";
    let s = Script::default();
    s.lists
        .lock()
        .unwrap()
        .push_back(Ok(page("967", &[], None)));
    s.watches.lock().unwrap().push_back(Ok((events, None)));
    let (calls, queued) = run(&s, PodEventHandler);
    assert_eq!(
        calls[..3],
        ["list continue=", "watch rv=967", "watch rv=970"].map(String::from)
    );
    // Each event queued the owner, each replacing the last trigger; the pod is gone in the
    // end, which is what the reconcile that follows is told.
    assert_eq!(
        queued,
        vec![(
            "fixtures/example".to_string(),
            "pod DELETED rv=970 left uid=c6f0852f-487c-4a9a-9867-b6cc2e7718f3".to_string()
        )]
    );
}

#[test]
fn a_message_is_kept_without_its_pods_name_and_read_back_for_it() {
    let a = Message::of_text("pod a-immortalpod is pending: Blocked", "a-immortalpod");
    let b = Message::of_text("pod b-immortalpod is pending: Blocked", "b-immortalpod");
    assert_eq!(a, b, "one text for both pods");
    assert_eq!(
        a.text("a-immortalpod"),
        "pod a-immortalpod is pending: Blocked"
    );
    assert_eq!(
        b.text("b-immortalpod"),
        "pod b-immortalpod is pending: Blocked"
    );
    // A text that names no pod, or the pod at its very start, reads back as it was.
    let none = Message::of_text("the node stopped reporting", "a-immortalpod");
    assert_eq!(none.text("a-immortalpod"), "the node stopped reporting");
    let first = Message::of_text("a-immortalpod: gone", "a-immortalpod");
    assert_eq!(first.text("a-immortalpod"), "a-immortalpod: gone");
}

#[test]
fn after_etcd_is_restored_a_relist_takes_the_servers_copies_though_their_versions_are_lower() {
    use crate::runtime::watcher::script::{gone, Script};
    // The watch had reached 275 when etcd was restored from a snapshot taken at 220, without
    // `--bump-revision`: every version the server answers from then on is lower than those
    // before (fixtures kube-1.28-kubelet/53-56). The list is the truth all the same.
    let s = Script::default();
    let mut lists = s.lists.lock().unwrap();
    lists.push_back(Ok(ic_list("275", ic_json("u", "275", "nginx:1.28", 4))));
    lists.push_back(Ok(ic_list("220", ic_json("u", "220", "nginx:1.27", 1))));
    drop(lists);
    s.watches.lock().unwrap().push_back(Err(gone()));
    let held = watched_ic(&s);
    assert_eq!(
        (
            held.metadata.resource_version.as_str(),
            held.spec.image.as_str(),
            held.status.start_times
        ),
        ("220", "nginx:1.27", Some(1))
    );
}

#[test]
fn a_spec_change_is_seen_though_the_copy_held_has_its_generation_already() {
    // Restored from a snapshot, etcd hands out generations again: the held copy, from before
    // the restore, had its spec changed once (generation 2); the object as restored had not,
    // and its first change since is generation 2 as well.
    let ic = |rv: &str, image: &str| -> ImmortalContainer {
        let mut o: ImmortalContainer = serde_json::from_value(ic_json("u", rv, image, 1)).unwrap();
        o.metadata.generation = Some(2);
        o
    };
    let mut cached = Some(Arc::new(IcState::of(&ic("275", "nginx:1.28"))));
    assert_eq!(
        IcEventHandler.on_event("MODIFIED", &ic("318", "nginx:1.29"), &mut cached),
        Reaction::Queue(None, Priority::Urgent)
    );
}
