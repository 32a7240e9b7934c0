//! The pod writes reconcile makes (create, delete, relabel), and what each answer means.

use super::{Api, Cause, Error, Run};
use crate::immortal::desired::{desired_labels, desired_pod, dropped};
use crate::immortal::lifecycle::{Ending, PodView, Waiting};
use crate::kube::client;
use crate::kube::types::{self, Pod};
use serde_json::{json, Map, Value};

impl<A: Api> Run<'_, A> {
    pub(super) fn create(&mut self, cause: Cause) -> Result<Created, Error> {
        let counted = self.ctx.counting.active();
        let pod = desired_pod(self.ic, counted);
        match self.api.create_pod(self.ns, &pod) {
            Ok(client::CreatedPod {
                pod: created,
                spec: stored,
            }) => {
                // How the pod it replaces ended, if that was seen (a person, an eviction...).
                let ending = match cause.is_restart() {
                    true => self.ctx.restarts.ending(self.trace.key),
                    false => None,
                };
                log::info!(
                    target: "reconcile",
                    reconcile_id = self.trace.id, object = self.trace.key, action = "create_pod",
                    pod = created.metadata.name.as_str(), uid = created.metadata.uid.as_str(),
                    image = self.ic.spec.image.as_str(), cause = cause.label(),
                    reason = ending.as_ref().and_then(Ending::reason);
                    "created pod"
                );
                crate::runtime::metrics::record_pod_created(cause.label());
                let uid = &created.metadata.uid;
                let lost = dropped(&pod, &stored);
                let lost = (!lost.is_empty()).then(|| self.dropped_message(&lost));
                if let Some(msg) = &lost {
                    log::warn!(
                        target: "reconcile",
                        reconcile_id = self.trace.id, object = self.trace.key, pod = self.pod_name.as_str(), uid = uid.as_str();
                        "{msg}"
                    );
                    self.note(true, "FieldsDropped", msg.clone());
                }
                self.ctx.dropped(self.trace.key, uid, lost);
                if counted {
                    // Pods first: its ADDED event's reconcile counts it, and this worker goes on
                    // to the next pod to make. Our finalizer keeps the count from being lost.
                    self.ctx.expectations.made(
                        self.trace.key,
                        &created.metadata.uid,
                        self.ctx.now(),
                    );
                    self.made = true;
                } else {
                    self.count(&created.metadata.uid);
                    self.report_dropped(&created.metadata.uid);
                    let view = PodView::of(&created);
                    self.report(&view);
                    self.waits(Waiting::of(&created, &view), Some(&created));
                }
                let (pod, image) = (&self.pod_name, &self.ic.spec.image);
                let (reason, message) = match cause {
                    Cause::New => (
                        "PodCreated",
                        format!("Created pod {pod} with image {image}"),
                    ),
                    Cause::Deleted | Cause::Terminated => {
                        let previous = match ending {
                            Some(e) => e.to_string(),
                            None if cause == Cause::Deleted => "was deleted".to_string(),
                            None => "terminated".to_string(),
                        };
                        let message = format!("Created pod {pod}: the previous one {previous}");
                        ("PodReplaced", message)
                    }
                    Cause::SpecChanged => {
                        let what = match self.ic.spec.template {
                            Some(_) => "image or template",
                            None => "image",
                        };
                        let message =
                            format!("Created pod {pod} with image {image}: the {what} changed");
                        ("PodReplaced", message)
                    }
                };
                self.note(false, reason, message);
                Ok(Created::Yes)
            }
            Err(e) if e.is_already_exists() => Ok(Created::NameTaken),
            Err(e) if e.is_invalid() || e.is_forbidden() => {
                // One line per try: the condition is written only when it changes.
                log::info!(
                    target: "reconcile",
                    reconcile_id = self.trace.id, object = self.trace.key, action = "create_pod",
                    pod = self.pod_name.as_str(), image = self.ic.spec.image.as_str(),
                    cause = cause.label(), result = "refused", error = e.to_string().as_str();
                    "create refused"
                );
                Ok(Created::Refused(e))
            }
            Err(e) => Err(Error::from_api("create pod", e)),
        }
    }

    /// Deletes our pod with `uid` and says what became of it.
    pub(super) fn delete(&mut self, uid: &str, why: &str) -> Result<Deleted, Error> {
        match self.api.delete_pod(self.ns, &self.pod_name, uid, None) {
            Ok(left) => {
                log::info!(
                    target: "reconcile",
                    reconcile_id = self.trace.id, object = self.trace.key, action = "delete_pod",
                    pod = self.pod_name.as_str(), uid = uid, reason = why;
                    "deleted pod"
                );
                if left.is_removed() {
                    self.removed = Some(uid.to_string());
                    Ok(Deleted::Removed { existed: true })
                } else {
                    Ok(Deleted::Pending)
                }
            }
            // Someone beat us to it, which is what we wanted.
            Err(e) if e.is_not_found() => {
                self.removed = Some(uid.to_string());
                Ok(Deleted::Removed { existed: false })
            }
            // The uid precondition failed: another pod holds the name now.
            Err(e) if e.is_conflict() => Ok(Deleted::OtherPod),
            Err(e) => Err(Error::from_api("delete pod", e)),
        }
    }

    /// Puts back the labels of ours that someone removed: without them our label-selected watch
    /// reports the pod DELETED (the `*-label-removed-*` fixtures) and misses its end.
    pub(super) fn restore_labels(&mut self, pod: &Pod) -> Result<Relabeled, Error> {
        let want = desired_labels(self.ic);
        let missing: Map<String, Value> = want
            .iter()
            .filter(|(k, v)| pod.metadata.labels.get(*k) != Some(*v))
            .map(|(k, v)| (k.clone(), json!(v)))
            .collect();
        if missing.is_empty() {
            return Ok(Relabeled::Kept);
        }
        let names: Vec<&String> = missing.keys().collect();
        let patch = json!({"metadata": {"uid": pod.metadata.uid, "labels": missing}});
        match self.api.patch_pod(self.ns, &self.pod_name, &patch) {
            Ok(_) => {
                log::info!(
                    target: "reconcile",
                    reconcile_id = self.trace.id, object = self.trace.key, action = "patch_pod",
                    pod = self.pod_name.as_str(), uid = pod.metadata.uid.as_str();
                    "restored labels {names:?}"
                );
                self.note(
                    false,
                    "PodLabelsRestored",
                    format!(
                        "Restored labels {names:?} on pod {}: the operator follows its pods by them",
                        self.pod_name
                    ),
                );
                Ok(Relabeled::Kept)
            }
            // Gone or replaced meanwhile.
            Err(e) if e.is_not_found() || e.is_conflict() || e.is_uid_changed() => {
                Ok(Relabeled::Moved)
            }
            Err(e) => Err(Error::from_api("patch pod", e)),
        }
    }

    pub(super) fn appeared(&self) -> Error {
        Error::Transient {
            action: "create pod",
            source: client::Error::Api(Box::new(types::Status {
                code: 409,
                reason: "AlreadyExists".into(),
                message: format!("pod {} appeared while we created it", self.pod_name),
                ..Default::default()
            })),
        }
    }
}

/// What became of the pod a relabel was for.
pub(super) enum Relabeled {
    /// It carries our labels (now, or it did already).
    Kept,
    /// It left since we read it: gone, or another pod holds its name.
    Moved,
}

pub(super) enum Created {
    Yes,
    /// AlreadyExists.
    NameTaken,
    /// 422 or 403: the server will not take this pod.
    Refused(client::Error),
}

/// What a DELETE of our pod did.
pub(super) enum Deleted {
    /// The pod is gone: removed now (`existed`), or it was already gone (404).
    Removed { existed: bool },
    /// It is being deleted gracefully, or a finalizer holds it: its DELETED event follows.
    Pending,
    /// The uid precondition failed: the name holds another pod.
    OtherPod,
}
