//! What a reconcile does when its pod cannot be: a spec no retry can fix, a create the API
//! server refuses, a pod not ours on the pod's name. Each is said on the object, in its Ready
//! condition and an Event.

use super::*;

impl<A: Api> Run<'_, A> {
    /// What no retry can fix: a name too long for its pod's, an empty image.
    pub(super) fn invalid_spec(&mut self) -> Option<Action> {
        if self.pod_name.len() > MAX_NAME_LEN {
            let msg = format!(
                "pod name {}… would be {} characters, over the Kubernetes limit of {MAX_NAME_LEN}; \
                 rename the ImmortalContainer to at most {} characters",
                &self.pod_name[..40],
                self.pod_name.len(),
                MAX_NAME_LEN - ic::POD_SUFFIX.len()
            );
            self.fail_permanently("PodNameTooLong", "InvalidSpec", msg);
            return Some(Action::await_change());
        }
        if self.ic.spec.image.trim().is_empty() {
            self.fail_permanently("InvalidSpec", "InvalidSpec", "spec.image is empty".into());
            return Some(Action::await_change());
        }
        None
    }

    /// The API server refused our pod, and no pod holds its name: say why on the object in the
    /// server's words (a retry refused again writes nothing), and try again after the object's
    /// back-off, since a person may lift the policy at any time (docs/design.md, "Restarts and
    /// refusals").
    pub(super) fn refused(&mut self, e: client::Error) -> Result<Action, Error> {
        let (wait, _) = self.ctx.restarts.refused(self.trace.key, self.ctx.now());
        // A bare pod cannot meet a namespace's Pod Security level: only a template can set
        // the securityContext that PodSecurity's message asks for. Said in fields, not by a
        // file of this repository, which someone who installed the one-file installer lacks.
        let refusal = e.to_string();
        let hint = match self.ic.spec.template {
            None if refusal.contains("violates PodSecurity \"restricted") => {
                "; give the object a spec.template that sets what the message lists: \
                 template.spec.securityContext {runAsNonRoot: true, seccompProfile: {type: RuntimeDefault}} \
                 and, in template.spec.containers, for the container named acontainer, \
                 securityContext {allowPrivilegeEscalation: false, capabilities: {drop: [ALL]}}, \
                 with an image that runs as a non-root user (the operator's docs: Pod templates)"
            }
            None if refusal.contains("violates PodSecurity") => {
                "; give the object a spec.template whose pod sets what the message lists \
                 (the operator's docs: Pod templates)"
            }
            _ => "",
        };
        // What it dropped first may be what it refused the pod for (a hook whose only
        // handler it did not know, fixture kube-1.28-kubelet/51): said, as the cause.
        let unknown = e.unknown_fields();
        let dropped = match unknown.is_empty() {
            true => String::new(),
            false => format!(
                "; it dropped first what it does not know, {}: newer than {}, or behind a \
                 feature gate it has off (the operator's docs: Pod templates)",
                unknown.join(", "),
                self.cluster()
            ),
        };
        let msg = format!(
            "the API server refused pod {}: {e}{dropped}{hint}; the operator tries again after {}, doubling to {}",
            self.pod_name,
            util::human_duration(crate::immortal::restarts::BASE),
            util::human_duration(crate::immortal::restarts::MAX)
        );
        self.status.current_pod = None;
        self.status.pod_phase = None;
        if self.set_ready(false, "PodCreateFailed", &msg) {
            log::warn!(target: "reconcile", reconcile_id = self.trace.id, object = self.trace.key, reason = "PodCreateFailed"; "{msg}");
            self.note(true, "PodCreateFailed", msg);
        }
        Ok(Action::requeue(wait))
    }

    /// The pod name is held by a pod we do not control: report it and leave it alone. A pod of
    /// an earlier object of the same name goes with it; if it still carries our finalizer (that
    /// object was deleted in the moment between its pod's create and its count), let it go.
    pub(super) fn conflict(&mut self, pod: &Pod) -> Result<Action, Error> {
        // Not ours to count, and no other object can count a pod under our name once the object
        // that controls it is gone: then our finalizer goes.
        if counting::is_held(&pod.metadata.finalizers) {
            if self.controller_exists(pod)? {
                return Ok(Action::await_change());
            }
            self.release_ours(&pod.metadata.uid, "no ImmortalContainer counts it")?;
        }
        let msg = format!(
            "pod {} already exists and is not controlled by this ImmortalContainer: {}; it is left untouched",
            self.pod_name,
            holder(pod, self.ic)
        );
        self.status.pod_phase = None;
        if self.set_ready(false, "PodNameConflict", &msg) {
            log::warn!(target: "reconcile", reconcile_id = self.trace.id, object = self.trace.key, reason = "PodNameConflict"; "{msg}");
            self.note(true, "PodNameConflict", msg);
        }
        Ok(Action::requeue(CONFLICT_RETRY))
    }

    /// Whether the object of our name that controls `pod` exists, as a read shows: our copy
    /// may be older than the object (a lagging watch after a failover), and the pod then
    /// belongs to the one made after it, which counts it. So it is, and the reconcile ends,
    /// to look at that object next (the read put it in the store). A pod with no such
    /// controller, or whose controller the read does not show, no object will count.
    fn controller_exists(&mut self, pod: &Pod) -> Result<bool, Error> {
        let Some(controller) = pod
            .metadata
            .controller()
            .filter(|o| o.is_immortal_container() && o.name == self.ic.metadata.name)
        else {
            return Ok(false);
        };
        let now = match self
            .api
            .get_immortal_container(self.ns, &self.ic.metadata.name)
        {
            Ok(now) => now,
            Err(e) if e.is_not_found() => {
                self.gone = true;
                return Ok(false);
            }
            Err(e) => return Err(Error::from_api("get immortalcontainer", e)),
        };
        if now.metadata.uid != controller.uid {
            return Ok(false);
        }
        self.gone = true;
        self.replaced = true;
        Ok(true)
    }
}
