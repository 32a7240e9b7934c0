//! The steps by which reconcile counts every pod started exactly once: count a pod not counted
//! yet, and let a pod go once the API server holds its count. Why each step keeps the invariant
//! is written down in `counting`; the create that starts a pod and the delete that ends one are
//! in `mod.rs`.

use super::*;

impl<A: Api> Run<'_, A> {
    /// Counts the pod with `uid` unless it is the one counted last (see `counting`). While
    /// the CRD prunes `lastCountedPodUID` nothing is counted: without it a count cannot be told
    /// from a repeat.
    pub(super) fn count(&mut self, uid: &str) {
        if self.status.last_counted_pod_uid.as_deref() == Some(uid) {
            return;
        }
        if !self.books.counting.active() {
            if self.have.current_pod.is_some() && self.status.start_times == self.have.start_times {
                self.note(
                    true,
                    "StartsNotCounted",
                    "status.startTimes is not counted: the installed ImmortalContainer CRD is older than the operator \
                     and prunes status.lastCountedPodUID; apply config/crd (kubectl apply -k config/crd)"
                        .to_string(),
                );
            }
            return;
        }
        *self.status.start_times.get_or_insert(0) += 1;
        self.status.last_counted_pod_uid = Some(uid.to_string());
    }

    /// Lets our pod with `uid` go (see `counting`: only once the status the API server holds
    /// counts it).
    pub(super) fn release(&self, uid: &str) -> Result<(), Error> {
        let counted = self.have.last_counted_pod_uid.as_deref() == Some(uid);
        if counted || !self.books.counting.active() {
            release_pod(
                self.api,
                self.trace,
                self.ns,
                &self.pod_name,
                uid,
                "its start is counted",
            )?;
        }
        Ok(())
    }
}

/// Lets the pod of a deleted object (or of one being deleted, with `owner_uid`) go: takes our
/// finalizer off it if it still carries it, so the garbage collector can remove it. Nothing is
/// left to count for an object that is gone. Costs a request only when the trigger said the pod
/// holds our finalizer, or said nothing (a relist, a retry).
pub(super) fn release_orphan<A: Api>(
    api: &A,
    trace: &Trace,
    ns: &str,
    name: &str,
    owner_uid: Option<&str>,
    hint: Option<&PodHint>,
) -> Result<(), Error> {
    let pod_name = ic::pod_name(name);
    let uid = match hint {
        Some(PodHint::Seen(p)) if p.name == pod_name => {
            if !p.holds_count || owner_uid.is_some_and(|o| o != p.owner_uid) {
                return Ok(());
            }
            p.uid.clone()
        }
        Some(_) => return Ok(()),
        None => match api.get_pod(ns, &pod_name) {
            Ok(p) => {
                let ours = p.metadata.controller().is_some_and(|o| {
                    o.is_immortal_container()
                        && o.name == name
                        && owner_uid.map_or(true, |u| u == o.uid)
                });
                if !ours || !counting::holds(&p.metadata.finalizers) {
                    return Ok(());
                }
                p.metadata.uid
            }
            Err(e) if e.is_not_found() => return Ok(()),
            Err(e) => return Err(Error::from_api("get pod", e)),
        },
    };
    release_pod(
        api,
        trace,
        ns,
        &pod_name,
        &uid,
        "its ImmortalContainer is gone",
    )
}

/// Takes our finalizer off the pod with `uid`. Gone meanwhile is as good. A 409 is not
/// assumed to mean "replaced": the retry reads the pod and decides.
pub(super) fn release_pod<A: Api>(
    api: &A,
    trace: &Trace,
    ns: &str,
    pod: &str,
    uid: &str,
    why: &str,
) -> Result<(), Error> {
    match api.patch_pod(ns, pod, &counting::release_patch(uid)) {
        Ok(_) => {
            log::debug!(
                target: "reconcile",
                reconcile_id = trace.id, object = trace.key, action = "release_pod",
                pod = pod, uid = uid, reason = why;
                "released pod"
            );
            Ok(())
        }
        Err(e) if e.is_not_found() => Ok(()),
        Err(e) => Err(Error::from_api("release pod", e)),
    }
}
