//! The counting steps of reconcile: count a pod not counted yet, and release it once the API
//! server holds its count. Why each keeps the invariant: `counting`.

use super::expectations::Expectations;
use super::*;
use crate::kube::types::Uid;

impl<A: Api> Run<'_, A> {
    /// Counts the pod with `uid` unless it is the one counted last. While the CRD prunes
    /// `lastCountedPodUID` nothing is counted: a count could not be told from a repeat.
    pub(super) fn count(&mut self, uid: &str) {
        if self.status.last_counted_pod_uid.as_deref() == Some(uid) {
            return;
        }
        if !self.ctx.counting.active() {
            if self.have.current_pod.is_some() && self.status.start_times == self.have.start_times {
                self.note(
                    true,
                    "StartsNotCounted",
                    "status.startTimes is not counted: the installed ImmortalContainer CRD is older than the operator \
                     and prunes status.lastCountedPodUID; apply config/crd (kubectl apply -k config/crd), and counting \
                     resumes by itself"
                        .to_string(),
                );
            }
            return;
        }
        if self.written_while_uncounted() {
            // Counted before L was lost, or started since: adopted, never counted twice.
            self.status.last_counted_pod_uid = Some(uid.to_string());
            self.note(
                false,
                "CountingResumed",
                format!(
                    "status.startTimes is counted again from pod {} (uid {uid}) on: the installed CRD keeps \
                     status.lastCountedPodUID now; pods started while counting was off are not in it",
                    self.pod_name
                ),
            );
            return;
        }
        *self.status.start_times.get_or_insert(0) += 1;
        self.status.last_counted_pod_uid = Some(uid.to_string());
        self.counting_now = Some(uid.to_string());
        // The status that counts a pod this process made says what its create answered.
        if self
            .ctx
            .expectations
            .made_here(self.trace.key, self.ctx.now())
            .is_some_and(|(made, _)| made == *uid)
        {
            self.report_dropped(uid);
        }
    }

    /// Whether this reconcile counted a pod that the API server's status does not count yet.
    pub(super) fn counted(&self) -> bool {
        self.status.start_times.unwrap_or(0) != self.have.start_times.unwrap_or(0)
            || self.status.last_counted_pod_uid != self.have.last_counted_pod_uid
    }

    /// Whether the status the API server holds was written while the CRD pruned L: it names a
    /// pod but no L, after counting resumed here, or with no observedGeneration either (every
    /// older CRD we know lacked both).
    fn written_while_uncounted(&self) -> bool {
        self.have.last_counted_pod_uid.is_none()
            && self.have.current_pod.is_some()
            && (self.ctx.counting.resumed() || self.have.observed_generation.is_none())
    }

    /// Releases our pod `uid`, once the status the API server holds counts it.
    pub(super) fn release(&self, uid: &str) -> Result<(), Error> {
        let counted = self.have.last_counted_pod_uid.as_deref() == Some(uid);
        if counted || !self.ctx.counting.active() {
            let answered = self.release_ours(uid, "its start is counted")?;
            if let Some(rv) = answered {
                self.ctx.expectations.released(uid, &rv);
            }
            self.ctx.counting.note_released(uid);
            self.ctx.forget_held(self.trace.key);
        }
        Ok(())
    }

    /// [`release_pod`] of the pod of our name with `uid`.
    pub(super) fn release_ours(&self, uid: &str, why: &str) -> Result<Option<String>, Error> {
        release_pod(self.api, self.trace, self.ns, &self.pod_name, uid, why)
    }

    /// Whether the release of `held`, just counted, may wait as routine work behind a backlog's
    /// creates and counts: a pod made here that nobody is deleting, within
    /// [`counting::RELEASE_WITHIN`] of its create.
    pub(super) fn release_may_wait(&self, held: &Held) -> bool {
        if held.deleting || self.counting_now.as_deref() != Some(held.uid.as_str()) {
            return false;
        }
        self.ctx
            .expectations
            .made_here(self.trace.key, self.ctx.now())
            .is_some_and(|(uid, ago)| uid == held.uid && !Expectations::is_overdue(ago))
    }

    /// Releases our pod `uid`, being deleted, although status could not be written to count it
    /// (`why`), and says so: a pod is never kept from going for a count.
    pub(super) fn release_uncounted(&self, uid: &str, why: &Error) -> Result<(), Error> {
        self.release_ours(uid, "it is being deleted and its start cannot be counted")?;
        self.ctx.counting.note_released(uid);
        self.ctx.forget_held(self.trace.key);
        let msg = format!(
            "pod {} (uid {uid}) was deleted before its start could be counted: writing status failed for {} ({why}); \
             it was let go uncounted, so status.startTimes misses one start",
            self.pod_name,
            util::human_duration(counting::HOLD_AT_MOST)
        );
        log::warn!(target: "reconcile", reconcile_id = self.trace.id, object = self.trace.key, reason = "StartsNotCounted"; "{msg}");
        self.note(true, "StartsNotCounted", msg);
        Ok(())
    }
}

/// Releases the pod of a deleted object (or of one being deleted, `owner_uid`), for the garbage
/// collector to remove: whoever controls it now (nobody, after `--cascade=orphan`), except a pod
/// another object of the name controls while this one is being deleted. Reads the pod only when
/// the trigger did not say it is free.
pub(super) fn release_orphan<A: Api>(
    api: &A,
    trace: &LogContext,
    ns: &str,
    name: &str,
    owner_uid: Option<&str>,
    hint: Option<&PodHint>,
) -> Result<(), Error> {
    let pod_name = ic::pod_name(name);
    let other_owner =
        |controller: &str| owner_uid.is_some_and(|o| !controller.is_empty() && controller != o);
    let uid = match hint {
        Some(PodHint::Seen(p)) if p.named_for_owner => {
            let controller = p.owner_uid.as_ref().map(Uid::to_string).unwrap_or_default();
            if !p.held || other_owner(&controller) {
                return Ok(());
            }
            p.uid.to_string()
        }
        // Removed from storage, so it held no finalizer any more.
        Some(PodHint::Left(g)) if !g.held => return Ok(()),
        Some(PodHint::Seen(_)) => return Ok(()),
        // It left our label selector still holding our finalizer, or nothing was said: look.
        Some(PodHint::Left(_)) | None => match api.get_pod(ns, &pod_name) {
            Ok(p) => {
                let controller = p
                    .metadata
                    .controller()
                    .filter(|o| o.is_immortal_container())
                    .map_or("", |o| o.uid.as_str());
                if !counting::is_held(&p.metadata.finalizers) || other_owner(controller) {
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
    )?;
    Ok(())
}

/// Takes our finalizer off the pod with `uid`, and answers the resourceVersion from which it
/// is off (`None`: the pod is gone). The name refusing our uid (422) means that pod is gone, as
/// `ReleasePod` (controller_ref_manager.go) concludes; a 409 is left to the retry's read.
pub(super) fn release_pod<A: Api>(
    api: &A,
    trace: &LogContext,
    ns: &str,
    pod: &str,
    uid: &str,
    why: &str,
) -> Result<Option<String>, Error> {
    match api.patch_pod(ns, pod, &counting::release_patch(uid)) {
        Ok(released) => {
            log::info!(
                target: "reconcile",
                reconcile_id = trace.id, object = trace.key, action = "release_pod",
                pod = pod, uid = uid, reason = why;
                "released pod"
            );
            Ok(Some(released.metadata.resource_version))
        }
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) if e.is_uid_changed() => {
            log::debug!(
                target: "reconcile",
                reconcile_id = trace.id, object = trace.key, action = "release_pod",
                pod = pod, uid = uid;
                "not released: the pod is gone, its name holds another"
            );
            Ok(None)
        }
        Err(e) => Err(Error::from_api("release pod", e)),
    }
}
