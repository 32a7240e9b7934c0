//! A pod of ours waiting on its node longer than it should (being deleted past its grace
//! period, or pending with nothing to show for it): how long, in coarse steps, and where to
//! look. Status is written whenever what a user sees changes, so once a step, not a second.

use super::view::{container, grace_period};
use super::{Message, Phase, PodView};
use crate::kube::types::Pod;
use crate::util;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Past the end of its grace period, when a pod being deleted is said to wait (seconds): the
/// kubelet kills it then and confirms within seconds, so by the first step its node has not.
const STOPPING: [u32; 4] = [10, 60, 600, 3600];

/// Since its creation, when a pod pending with nothing unusual to say is (seconds): a minute
/// covers scheduling and a start from an image at hand.
const STARTING: [u32; 3] = [60, 600, 3600];

/// How long a pod whose kubelet is creating its container may take before that is said: an
/// image pull of some minutes is no news, a volume that never mounts is.
const CREATING: Duration = Duration::from_secs(600);

/// When our pod began to wait on its node, to the second of the API server's clock: the end of
/// its grace period (`deletionTimestamp`) once it is being deleted, else its creation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Waiting {
    stopping: bool,
    since: u32,
}

impl Waiting {
    /// How `pod`, whose status says `view`, waits on its node, if it does.
    pub fn of(pod: &Pod, view: &PodView) -> Option<Waiting> {
        let (stopping, since) = match view.phase {
            Phase::Terminating => (true, pod.metadata.deletion_timestamp.as_ref()?),
            Phase::Pending if view.message == Message::Pending => {
                (false, pod.metadata.creation_timestamp.as_ref()?)
            }
            _ => return None,
        };
        let since = util::parse_rfc3339(since)?
            .duration_since(UNIX_EPOCH)
            .ok()?;
        Some(Waiting {
            stopping,
            since: u32::try_from(since.as_secs()).ok()?,
        })
    }

    fn steps(&self) -> &'static [u32] {
        match self.stopping {
            true => &STOPPING,
            false => &STARTING,
        }
    }

    fn waited(&self, now: SystemTime) -> u64 {
        let now = now.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
        now.saturating_sub(self.since.into())
    }

    /// The last step it has passed at `now`: how long it is said to have waited.
    pub fn overdue(&self, now: SystemTime) -> Option<Duration> {
        let waited = self.waited(now);
        let step = self.steps().iter().rfind(|&&s| u64::from(s) <= waited)?;
        Some(Duration::from_secs((*step).into()))
    }

    /// How long after `now` what it says changes next, if it does.
    pub fn next_change(&self, now: SystemTime) -> Option<Duration> {
        let waited = self.waited(now);
        let step = self.steps().iter().find(|&&s| u64::from(s) > waited)?;
        let at = UNIX_EPOCH + Duration::from_secs(u64::from(self.since) + u64::from(*step));
        Some(at.duration_since(now).unwrap_or_default())
    }

    /// The Ready message of `pod`, whose status says `said`, once it has waited `over`.
    pub fn says(&self, pod: &Pod, said: &str, over: Duration) -> String {
        let name = &pod.metadata.name;
        let node = pod.spec.node_name.as_str();
        let started = pod.status.as_ref().and_then(container).is_some();
        if !self.stopping && started && over < CREATING {
            return said.to_string();
        }
        let over = util::human_duration(over);
        let look = format!(
            "see kubectl describe pod {name} and the node's status (kubectl describe node {node})"
        );
        // docs/operating.md, "Known limits": the operator never force-deletes a pod.
        let lost = "a node that is lost keeps its pods until the Node is deleted or tainted \
                    node.kubernetes.io/out-of-service (the operator's docs: Known limits)";
        if !self.stopping {
            return match (node, started) {
                ("", _) => format!(
                    "pod {name} has been pending for over {over}, not scheduled to a node yet: \
                     see kubectl describe pod {name}"
                ),
                (_, false) => format!(
                    "pod {name} has been pending for over {over} on node {node}, whose kubelet \
                     has not reported starting it: {look}; {lost}"
                ),
                (_, true) => format!(
                    "pod {name} has been pending for over {over} on node {node}, its container \
                     still starting: see kubectl describe pod {name} (an image pull, a volume)"
                ),
            };
        }
        let grace = util::human_duration(grace_period(pod));
        // Its kubelet writes a terminal phase once its containers stopped (1.27 and later); a
        // pod with no node had none to stop. Either way only finalizers keep it.
        let stopped = node.is_empty() || matches!(pod.phase(), "Succeeded" | "Failed");
        match stopped {
            false => format!(
                "{said}; its {grace} grace period ended over {over} ago and node {node} has not \
                 confirmed that the pod stopped: {look}; {lost}"
            ),
            true => format!(
                "{said}; its {grace} grace period ended over {over} ago: nothing runs, and its \
                 finalizers {:?} keep it until whoever added them removes them (kubectl describe pod {name})",
                pod.metadata.finalizers
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube::types::{ContainerState, ContainerStatus, PodStatus};

    const T0: u64 = 1_795_352_323;

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(T0 + secs)
    }

    /// Our pod on `node`, being deleted with a 30 s grace period asked for at `T0` when
    /// `deleted`, else pending since `T0`.
    fn pod(node: &str, deleted: bool) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = "web-immortalpod".into();
        p.metadata.creation_timestamp = Some(util::rfc3339(at(0)));
        p.spec.node_name = node.into();
        if deleted {
            p.metadata.deletion_timestamp = Some(util::rfc3339(at(30)));
            p.metadata.deletion_grace_period_seconds = Some(30);
            p.status = Some(PodStatus {
                phase: Some("Running".into()),
                ..Default::default()
            });
        }
        p
    }

    fn waiting(p: &Pod) -> Waiting {
        Waiting::of(p, &PodView::of(p)).expect("it waits on its node")
    }

    #[test]
    fn a_pod_being_deleted_is_overdue_only_past_its_grace_period_in_coarse_steps() {
        let w = waiting(&pod("node-1", true));
        // Its grace period ends at 30 s: nothing to say before 40 s, and a look asked for then.
        assert_eq!(w.overdue(at(39)), None);
        assert_eq!(w.next_change(at(29)), Some(Duration::from_secs(11)));
        assert_eq!(w.overdue(at(40)), Some(Duration::from_secs(10)));
        // 4 min 30 s past its grace period, it says "over 1 min" until 10 min.
        assert_eq!(w.overdue(at(300)), Some(Duration::from_secs(60)));
        assert_eq!(w.next_change(at(300)), Some(Duration::from_secs(330)));
        // Past an hour it says so for good, and asks for no look.
        assert_eq!(w.overdue(at(30 + 86_400)), Some(Duration::from_secs(3600)));
        assert_eq!(w.next_change(at(30 + 3600)), None);
    }

    #[test]
    fn a_pod_whose_node_has_not_confirmed_its_deletion_says_where_to_look() {
        let p = pod("node-1", true);
        let said = "pod web-immortalpod is being deleted (DeletionByTaintManager: Taint manager: deleting due to NoExecute taint)";
        assert_eq!(
            waiting(&p).says(&p, said, Duration::from_secs(60)),
            "pod web-immortalpod is being deleted (DeletionByTaintManager: Taint manager: deleting due to NoExecute taint); \
             its 30 s grace period ended over 1 min ago and node node-1 has not confirmed that the pod stopped: \
             see kubectl describe pod web-immortalpod and the node's status (kubectl describe node node-1); \
             a node that is lost keeps its pods until the Node is deleted or tainted node.kubernetes.io/out-of-service \
             (the operator's docs: Known limits)"
        );
    }

    #[test]
    fn a_stopped_pod_kept_by_a_finalizer_names_the_finalizer_not_the_node() {
        let mut p = pod("node-1", true);
        p.status.as_mut().unwrap().phase = Some("Succeeded".into());
        p.metadata.finalizers = vec!["example.com/backup".into()];
        let text = waiting(&p).says(
            &p,
            "pod web-immortalpod is being deleted",
            Duration::from_secs(600),
        );
        assert_eq!(
            text,
            "pod web-immortalpod is being deleted; its 30 s grace period ended over 10 min ago: nothing runs, \
             and its finalizers [\"example.com/backup\"] keep it until whoever added them removes them \
             (kubectl describe pod web-immortalpod)"
        );
    }

    #[test]
    fn a_pending_pod_says_how_long_and_whether_its_node_took_it() {
        let unscheduled = pod("", false);
        let w = waiting(&unscheduled);
        assert_eq!(w.overdue(at(59)), None);
        assert_eq!(w.next_change(at(0)), Some(Duration::from_secs(60)));
        assert_eq!(w.overdue(at(90)), Some(Duration::from_secs(60)));
        assert_eq!(
            w.says(
                &unscheduled,
                "pod web-immortalpod is pending",
                Duration::from_secs(60)
            ),
            "pod web-immortalpod has been pending for over 1 min, not scheduled to a node yet: \
             see kubectl describe pod web-immortalpod"
        );
        let bound = pod("node-1", false);
        assert_eq!(
            waiting(&bound).says(&bound, "", Duration::from_secs(60)),
            "pod web-immortalpod has been pending for over 1 min on node node-1, whose kubelet has not \
             reported starting it: see kubectl describe pod web-immortalpod and the node's status (kubectl describe \
             node node-1); a node that is lost keeps its pods until the Node is deleted or tainted \
             node.kubernetes.io/out-of-service (the operator's docs: Known limits)"
        );
        let mut creating = pod("node-1", false);
        creating.status = Some(PodStatus {
            phase: Some("Pending".into()),
            container_statuses: vec![ContainerStatus {
                name: crate::immortal::types::CONTAINER_NAME.into(),
                state: ContainerState::default(),
                ..Default::default()
            }],
            ..Default::default()
        });
        // An image pull of some minutes is no news.
        let said = "pod web-immortalpod is pending";
        assert_eq!(
            waiting(&creating).says(&creating, said, Duration::from_secs(60)),
            said
        );
        assert_eq!(
            waiting(&creating).says(&creating, said, Duration::from_secs(600)),
            "pod web-immortalpod has been pending for over 10 min on node node-1, its container still \
             starting: see kubectl describe pod web-immortalpod (an image pull, a volume)"
        );
    }

    #[test]
    fn a_pod_with_something_to_say_or_running_does_not_wait() {
        let mut p = pod("node-1", false);
        p.status = Some(PodStatus {
            phase: Some("Running".into()),
            ..Default::default()
        });
        assert_eq!(Waiting::of(&p, &PodView::of(&p)), None);
    }
}
