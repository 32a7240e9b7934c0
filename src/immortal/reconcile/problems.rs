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

    /// The API server refused our pod, and no pod holds its name: say why in the server's words,
    /// and try again after the object's back-off, since a person may lift the policy any time.
    pub(super) fn refused(&mut self, e: client::Error) -> Result<Action, Error> {
        let (wait, _) = self.ctx.restarts.refused(self.trace.key, self.ctx.now());
        // Only a template can set the securityContext a PodSecurity level asks for: said in
        // fields, not by a file of this repository, which the one-file installer lacks.
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
        // What it dropped first may be why it refused (fixture kube-1.28-kubelet/51).
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

    /// The pod name is held by a pod we do not control: report it and leave it alone.
    pub(super) fn conflict(&mut self, pod: &Pod) -> Result<Action, Error> {
        // A pod of an earlier object of the name, deleted between the create and the count:
        // nothing can count it now, so our finalizer goes.
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

    /// Whether the object of our name that controls `pod` exists, as a read shows: our copy may
    /// be older (a lagging watch), and that object then counts the pod; the reconcile ends to
    /// look at it next.
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
