//! What reconcile reports: `status` (the pod, its phase, the Ready condition with a reason a
//! user can act on), Events, and the one merge patch that writes a status that changed.

use super::*;

impl<A: Api> Run<'_, A> {
    /// Status reports `view` of our pod.
    pub(super) fn report(&mut self, view: &PodView) {
        self.status.current_pod = Some(self.pod_name.clone());
        self.status.pod_phase = Some(view.phase.as_str().to_string());
        let message = view.message.text(&self.pod_name);
        self.set_ready(view.ready, view.reason.as_str(), &message);
    }

    /// Our pod waits on its node: once past a step, the Ready message says how long and where to
    /// look (from the pod `read`); the next step is looked at when it comes.
    pub(super) fn waits(&mut self, waiting: Option<Waiting>, read: Option<&Pod>) {
        let Some(w) = waiting else {
            return;
        };
        if let (Some(over), Some(pod)) = (w.overdue(self.now), read) {
            let ready = self.status.conditions.iter().find(|c| c.type_ == READY);
            if let Some(c) = ready.cloned() {
                self.set_ready(false, &c.reason, &w.says(pod, &c.message, over));
            }
        }
        self.refresh = w.next_change(self.now);
    }

    /// Our pod is being deleted to make way for one made from the new spec (`why` says what changed).
    pub(super) fn replacing(&mut self, why: &str) {
        self.status.current_pod = Some(self.pod_name.clone());
        self.status.pod_phase = Some(Phase::Terminating.as_str().to_string());
        let msg = format!(
            "replacing pod {}: {why}; waiting for the old pod to go",
            self.pod_name
        );
        self.set_ready(false, "PodReplacing", &msg);
    }

    /// A replacement waits for the back-off: say so, once, on the object. No pod is named
    /// meanwhile: there is none.
    pub(super) fn back_off(&mut self, wait: crate::immortal::restarts::Wait) {
        use crate::immortal::restarts::{MAX, MIN_RUN};
        let at = util::rfc3339_after(wait.remaining);
        let how = wait.ending.map_or("ended".to_string(), |e| e.to_string());
        let [min_run, backoff, max] = [MIN_RUN, wait.backoff, MAX].map(util::human_duration);
        let msg = format!(
            "pod {} {how}: {} pods in a row ended within {min_run} of starting; the next one is created at {at} \
             (back-off {backoff}, doubling to {max}; a pod that runs {min_run} or more is replaced at once)",
            self.pod_name, wait.streak,
        );
        self.status.current_pod = None;
        self.status.pod_phase = None;
        if self.set_ready(false, "PodRestartBackOff", &msg) {
            log::info!(
                target: "reconcile",
                reconcile_id = self.trace.id, object = self.trace.key, action = "back_off",
                requeue_after_ms = wait.remaining.as_millis() as u64;
                "{msg}"
            );
            self.note(true, "PodRestartBackOff", msg);
        }
    }

    /// The `FieldsDropped` condition of the pod `uid` this process made: what the API server did
    /// not keep of it. Only the create's answer tells, so another process's pod leaves it as is.
    pub(super) fn report_dropped(&mut self, uid: &str) {
        let conditions = &mut self.status.conditions;
        let at = conditions.iter().position(|c| c.type_ == FIELDS_DROPPED);
        match (self.ctx.dropped_from(self.trace.key, uid), at) {
            (None, None) => {}
            (None, Some(i)) => {
                conditions.remove(i);
            }
            (Some(msg), Some(i)) => {
                conditions[i].message = msg.to_string();
                conditions[i].observed_generation = self.ic.metadata.generation;
            }
            (Some(msg), None) => conditions.push(Condition {
                type_: FIELDS_DROPPED.into(),
                status: "True".into(),
                observed_generation: self.ic.metadata.generation,
                last_transition_time: util::now_rfc3339(),
                reason: "DroppedByAPIServer".into(),
                message: msg.to_string(),
            }),
        }
    }

    /// What the Event and the condition say of the `fields` of our pod the API server did
    /// not keep, with the cluster's version when known.
    pub(super) fn dropped_message(&self, fields: &[String]) -> String {
        const SHOWN: usize = 8;
        let mut named = fields[..fields.len().min(SHOWN)].join(", ");
        if fields.len() > SHOWN {
            named.push_str(&format!(" and {} more", fields.len() - SHOWN));
        }
        format!(
            "the API server did not keep {named} of pod {}, which runs without them: they are newer than \
             {}, or behind a feature gate it has off (the operator's docs: Pod templates)",
            self.pod_name,
            self.cluster()
        )
    }

    /// The cluster, as messages name it: `Kubernetes v1.28.7` once its version is known.
    pub(super) fn cluster(&self) -> String {
        match self.ctx.version.get() {
            Some(v) => format!("Kubernetes {v}"),
            None => "the cluster's Kubernetes".to_string(),
        }
    }

    pub(super) fn ready_reason(&self) -> Option<&str> {
        self.status
            .conditions
            .iter()
            .find(|c| c.type_ == READY)
            .map(|c| c.reason.as_str())
    }

    /// Sets the Ready condition; returns whether its status or reason changed (the moments worth
    /// an Event). `lastTransitionTime` moves only when the status flips, per the API conventions.
    pub(super) fn set_ready(&mut self, ready: bool, reason: &str, message: &str) -> bool {
        let status = if ready { "True" } else { "False" };
        let generation = self.ic.metadata.generation;
        match self.status.conditions.iter_mut().find(|c| c.type_ == READY) {
            Some(c) => {
                let changed = c.status != status || c.reason != reason;
                if c.status != status {
                    c.last_transition_time = util::now_rfc3339();
                }
                c.status = status.into();
                c.reason = reason.into();
                c.message = message.into();
                c.observed_generation = generation;
                changed
            }
            // First, before any other: the condition every object has.
            None => {
                self.status.conditions.insert(
                    0,
                    Condition {
                        type_: READY.into(),
                        status: status.into(),
                        observed_generation: generation,
                        last_transition_time: util::now_rfc3339(),
                        reason: reason.into(),
                        message: message.into(),
                    },
                );
                true
            }
        }
    }

    /// A problem retrying cannot fix: a condition, a Warning Event when it is new, a WARN line
    /// (a person must act), and no requeue.
    pub(super) fn fail_permanently(
        &mut self,
        reason: &'static str,
        event_reason: &'static str,
        msg: String,
    ) {
        self.status.pod_phase = None;
        if self.set_ready(false, reason, &msg) {
            log::warn!(target: "reconcile", reconcile_id = self.trace.id, object = self.trace.key, reason = reason; "{msg}");
            self.note(true, event_reason, msg);
        }
    }

    pub(super) fn note(&self, warning: bool, reason: &'static str, message: String) {
        self.api.record(
            self.ic,
            Note {
                warning,
                reason,
                message,
            },
        );
    }

    /// Writes status if it differs from what the API server holds, as a merge patch carrying the
    /// resourceVersion it was computed from: a stale copy's write is refused with 409, since
    /// `/status` ignores a patch's uid (fixture kube-1.28-kubelet/21). What the answer lacks, the
    /// CRD prunes.
    pub(super) fn write_status(&mut self) -> Result<(), Error> {
        let counting = &self.ctx.counting;
        let Some(patch) = status_patch(&self.rv, &self.have, &self.status, |f| counting.prunes(f))
        else {
            return Ok(());
        };
        match self
            .api
            .patch_status(self.ns, &self.ic.metadata.name, &patch)
        {
            Ok(answered) => {
                let kept = serde_json::to_value(&answered.status).unwrap_or_default();
                let pruned = Counting::not_kept(&patch["status"], &kept);
                if !pruned.is_empty() {
                    let new = counting.learn_pruned(&pruned, "a status write did not keep it");
                    if new.contains(&"lastCountedPodUID") {
                        self.note(
                            true,
                            "StartsNotCounted",
                            "status.startTimes is no longer counted: the installed ImmortalContainer CRD is older than the \
                             operator and prunes status.lastCountedPodUID; apply config/crd (kubectl apply -k config/crd)"
                                .to_string(),
                        );
                    }
                }
                self.have = answered.status;
                self.rv = answered.metadata.resource_version;
                // What was pruned is not ours to write again: compare it as it is.
                for f in pruned {
                    match f {
                        "lastCountedPodUID" => {
                            self.status.last_counted_pod_uid =
                                self.have.last_counted_pod_uid.clone()
                        }
                        "observedGeneration" => {
                            self.status.observed_generation = self.have.observed_generation
                        }
                        _ => self.status.pod_phase = self.have.pod_phase.clone(),
                    }
                }
                log::info!(
                    target: "reconcile",
                    reconcile_id = self.trace.id, object = self.trace.key, action = "patch_status",
                    start_times = self.status.start_times.unwrap_or(0), ready = self.ready_reason().unwrap_or("");
                    "updated status"
                );
                Ok(())
            }
            // Gone meanwhile: nothing left to report on (see `reconcile` for its pod).
            Err(e) if e.is_not_found() => {
                self.gone = true;
                Ok(())
            }
            // Our copy is older than the object, or it is another object of the name. Read it,
            // so that the retry works from what the API server holds; the read's own failure is
            // left to the retry.
            Err(e) if e.is_conflict() => {
                let uid = &self.ic.metadata.uid;
                match self
                    .api
                    .get_immortal_container(self.ns, &self.ic.metadata.name)
                {
                    Err(read) if read.is_not_found() => self.gone = true,
                    Ok(now) if now.metadata.uid != *uid => {
                        self.gone = true;
                        self.replaced = true;
                    }
                    _ => {}
                }
                if self.gone {
                    return Ok(());
                }
                Err(Error::from_api("patch status", e))
            }
            Err(e) => Err(Error::from_api("patch status", e)),
        }
    }
}

/// The merge patch taking the status `have` (at resourceVersion `rv`) to `want`, or `None` when
/// nothing changed. Fields `pruned` says the CRD does not keep are left out.
pub fn status_patch(
    rv: &str,
    have: &ImmortalContainerStatus,
    want: &ImmortalContainerStatus,
    pruned: impl Fn(&str) -> bool,
) -> Option<Value> {
    let mut st = Map::new();
    macro_rules! changed {
        ($key:literal, $field:ident) => {
            if want.$field != have.$field && !pruned($key) {
                st.insert($key.into(), json!(want.$field));
            }
        };
    }
    changed!("currentPod", current_pod);
    changed!("startTimes", start_times);
    changed!("lastCountedPodUID", last_counted_pod_uid);
    changed!("observedGeneration", observed_generation);
    changed!("podPhase", pod_phase);
    // Merge patch replaces lists whole: send them all.
    changed!("conditions", conditions);
    if st.is_empty() {
        return None;
    }
    // The one precondition `/status` honours on a merge patch (fixture 24).
    Some(json!({ "metadata": { "resourceVersion": rv }, "status": st }))
}
