//! Reconcile one key: make the world hold exactly one pod for the ImmortalContainer, and make
//! its status say truthfully what that pod is doing, counting every pod started exactly once.
//!
//! Level-based, as sample-controller's `syncHandler`: re-read the object by key (NotFound is
//! success: the garbage collector removes its pod), learn the pod's state (a watch event's
//! hint may save the read: `first_look`), act, then write status through `/status` only if it
//! changed. Why every pod started is counted exactly once: `counting`.
//!
//! Here: the decisions (`sync`, this file), the API they call (`api.rs`), the pod writes
//! (`pod.rs`), the counting steps (`starts.rs`), what it does when the pod cannot be
//! (`problems.rs`), the status, conditions and Events (`status.rs`), what reconciles share
//! (`context.rs`, `expectations.rs`), and their errors (`error.rs`).

use crate::immortal::counting::{self, Counting};
use crate::immortal::desired::{controlled_by, created_for, holder, recorded_hash, spec_change};
use crate::immortal::lifecycle::{
    Ending, Phase, PodHint, PodView, SeenPod, Waiting, FIELDS_DROPPED, READY,
};
use crate::immortal::types::{
    self as ic, ImmortalContainer, ImmortalContainerStatus, ImmortalOwner,
};
use crate::kube::client;
use crate::kube::events::Note;
use crate::kube::types::{self, Condition, Pod, MAX_NAME_LEN};
use crate::runtime::controller::{Action, LogContext};
use crate::runtime::queue::Priority;
use crate::util;
use serde_json::{json, Map, Value};
use std::time::{Duration, SystemTime};

mod api;
mod context;
mod error;
mod expectations;
mod pod;
mod problems;
mod starts;
mod status;

use starts::release_orphan;

pub use api::{Api, LiveApi};
pub use context::Context;
pub use error::Error;
use pod::{Created, Deleted, Relabeled};

pub use status::status_patch;

/// When to look again at a pod name held by a pod not ours: our pod watch cannot see it (it
/// lacks our label), so only a timer notices it leaving.
pub const CONFLICT_RETRY: Duration = Duration::from_secs(30);

/// Rounds of look-and-act one reconcile makes before it leaves the key to the queue's backoff.
const MAX_ROUNDS: usize = 4;

/// Why the pod we are about to create replaces another; also the metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cause {
    /// The first pod of this object.
    New,
    /// The previous pod disappeared.
    Deleted,
    /// The previous pod ended (phase Succeeded or Failed).
    Terminated,
    /// `spec.image` or `spec.template` changed; the previous pod was deleted for it.
    SpecChanged,
}

impl Cause {
    fn label(self) -> &'static str {
        match self {
            Cause::New => "new",
            Cause::Deleted => "deleted",
            Cause::Terminated => "terminated",
            Cause::SpecChanged => "spec_changed",
        }
    }

    /// The previous pod ended without anyone asking for a new one: subject to the back-off.
    fn is_restart(self) -> bool {
        matches!(self, Cause::Deleted | Cause::Terminated)
    }
}

/// How the next round learns about the pod.
enum Look<'h> {
    /// Read it.
    Get,
    /// It is probably absent: create, and read it only if the name is taken.
    AssumeAbsent,
    /// A watch event showed it, and it is the pod already counted: act on that.
    Seen(&'h SeenPod),
    /// A watch event showed this pod (uid) terminal: delete it without reading it.
    DeleteTerminated(String),
}

/// What one round decided.
enum Step<'h> {
    /// Look at the name again, this way.
    Again(Look<'h>),
    Done(Action),
}

/// What the rounds of one reconcile carry from one to the next.
#[derive(Default)]
struct Rounds {
    /// Why the pod about to be made replaces another, when a round removed that one.
    cause: Option<Cause>,
    /// A create refused while the name was only assumed free: it stands once a look finds
    /// the name free.
    refused: Option<client::Error>,
}

/// Our pod as a round found it, read or seen in a watch event.
struct OurPod<'p> {
    uid: String,
    /// Why it is not made from the object's spec any more, if it is not.
    change: Option<String>,
    view: PodView,
    /// It still carries our finalizer: it is held.
    held: bool,
    ending: Option<Ending>,
    waiting: Option<Waiting>,
    /// The pod as read, when it was: what a message about its node needs, which no hint
    /// carries (see `first_look`).
    read: Option<&'p Pod>,
}

impl<'p> OurPod<'p> {
    fn read(pod: &'p Pod, ic: &ImmortalContainer) -> OurPod<'p> {
        let view = PodView::of(pod);
        OurPod {
            uid: pod.metadata.uid.clone(),
            change: spec_change(created_for(pod), recorded_hash(pod), ic),
            held: counting::is_held(&pod.metadata.finalizers),
            ending: Ending::of(pod),
            waiting: Waiting::of(pod, &view),
            view,
            read: Some(pod),
        }
    }

    fn seen(p: &SeenPod, ic: &ImmortalContainer, ctx: &Context) -> OurPod<'static> {
        OurPod {
            uid: p.uid.to_string(),
            change: spec_change(&p.created_for, p.spec_hash.as_deref(), ic),
            view: p.view.clone(),
            // An event from before our own release still shows our finalizer. Releasing again
            // on it would cost a write per pod for nothing.
            held: p.held && !ctx.expectations.released_after(&p.uid, p.rv),
            ending: p.ending.as_deref().cloned(),
            waiting: p.waiting,
            read: None,
        }
    }
}

/// One reconcile. Holds what it has decided about the object's status so far.
struct Run<'a, A: Api> {
    api: &'a A,
    ctx: &'a Context,
    trace: &'a LogContext<'a>,
    ic: &'a ImmortalContainer,
    ns: &'a str,
    pod_name: String,
    /// The object's status and resourceVersion as the API server last answered them.
    have: ImmortalContainerStatus,
    rv: String,
    /// The status this reconcile wants.
    status: ImmortalContainerStatus,
    /// The pod to release once the status that counts it is written.
    release: Option<Held>,
    /// The object was deleted or replaced by another of its name while we worked.
    gone: bool,
    /// Replaced: the new object was read, so its watch event may bring nothing new.
    replaced: bool,
    /// `ic` was read from the API server in this reconcile, not taken from the store.
    fresh: bool,
    /// A read showed `ic` older than the object (see `confirmed`).
    stale: bool,
    /// Putting our labels back failed: returned once the pod is counted and released, so that a
    /// pod being deleted never waits on a relabel.
    relabel: Option<Error>,
    /// Our pod (uid) this reconcile saw removed: the pod it creates replaces it.
    removed: Option<String>,
    /// It made a pod, whose count and status are the next reconcile's (see `create`).
    made: bool,
    /// The pod it counts (`startTimes` + 1), if any.
    counting_now: Option<String>,
    /// The time of day, for how long our pod has waited on its node.
    now: SystemTime,
    /// When what status says of our pod changes with time alone.
    refresh: Option<Duration>,
}

/// A pod of ours still holding our finalizer.
struct Held {
    uid: String,
    /// Someone is deleting it: it waits on our count (see `counting::HOLD_AT_MOST`).
    deleting: bool,
}

/// Reconciles the object called `key`, with what its trigger says about the pod.
pub fn reconcile<A: Api>(
    api: &A,
    ctx: &Context,
    trace: &LogContext,
    hint: Option<&PodHint>,
) -> Result<Action, Error> {
    let Some((ns, name)) = types::split_key(trace.key) else {
        log::warn!(target: "reconcile", reconcile_id = trace.id, object = trace.key; "malformed key, dropped");
        return Ok(Action::await_change());
    };
    let ic = match api.cached_immortal_container(ns, name) {
        Ok(ic) => ic,
        Err(e) if e.is_not_found() => return object_gone(api, ctx, trace, ns, name, hint),
        Err(e) => return Err(Error::from_api("get immortalcontainer", e)),
    };
    if let Some(PodHint::Left(g)) = hint {
        // The late DELETED event of a pod this process replaced: nothing is new. Acting on it
        // would report a back-off for a replacement that exists.
        if !g.held && ctx.expectations.was_replaced(trace.key, &g.uid.to_string()) {
            log::debug!(target: "reconcile", reconcile_id = trace.id, object = trace.key; "the pod that left was replaced already");
            return Ok(Action::await_change());
        }
    }
    // Another pod left than the one our copy counted last: the copy may predate a count (a
    // failover), or the pod was never counted. Read the object; a hint may save a request, never
    // be the only ground for "nothing to do".
    let doubt = matches!(hint, Some(PodHint::Left(g)) if !g.held
        && ic.status.last_counted_pod_uid.as_deref().is_some_and(|l| g.uid != *l));
    let ic = if doubt {
        match api.get_immortal_container(ns, name) {
            Ok(ic) => ic,
            Err(e) if e.is_not_found() => return object_gone(api, ctx, trace, ns, name, hint),
            Err(e) => return Err(Error::from_api("get immortalcontainer", e)),
        }
    } else {
        ic
    };
    if ic.metadata.deletion_timestamp.is_some() {
        // Foreground deletion waits for the pod (blockOwnerDeletion): let it go.
        release_orphan(api, trace, ns, name, Some(&ic.metadata.uid), hint)?;
        return Ok(Action::await_change());
    }
    let mut run = Run {
        api,
        ctx,
        trace,
        ic: &ic,
        ns,
        pod_name: ic::pod_name(name),
        have: ic.status.clone(),
        rv: ic.metadata.resource_version.clone(),
        status: ic.status.clone(),
        release: None,
        gone: false,
        replaced: false,
        fresh: doubt,
        stale: false,
        relabel: None,
        removed: None,
        made: false,
        counting_now: None,
        now: ctx.wall_now(),
        refresh: None,
    };
    run.status.observed_generation = ic.metadata.generation;
    // Written as 0 on the first status write, so `kubectl get` shows STARTS from the start.
    run.status.start_times.get_or_insert(0);
    let synced = run.sync(hint);
    if run.stale {
        // Nothing written from a stale copy; the next reconcile reads the store, now current.
        synced?;
        return Ok(Action::requeue(Duration::ZERO));
    }
    // Status says what this reconcile learned even when it then failed. One that failed before
    // learning anything worth keeping writes nothing: a failing reconcile costs one request, so
    // the queue's failure budget bounds a herd. A pod made here is counted by the reconcile its
    // ADDED event brings (see `create`).
    let written = if run.gone || ((synced.is_err() || run.made) && !run.counted()) {
        Ok(())
    } else {
        run.write_status()
    };
    if run.gone {
        // Nothing will count its pod now: let it go, for the garbage collector to remove.
        ctx.restarts.forget(trace.key);
        ctx.forget_held(trace.key);
        if let Some(held) = run.release.take() {
            run.release_ours(&held.uid, "its ImmortalContainer is gone")?;
        }
        // The object that took its name may have its event ignored as nothing new: look now.
        return Ok(match run.replaced {
            true => Action::requeue(Duration::ZERO),
            false => Action::await_change(),
        });
    }
    if let Err(e) = written {
        if let Some(held) = run.release.take() {
            // The count cannot be written: a pod someone is deleting is held only so long, then
            // let go uncounted; any other is tried again within a bound, whatever the back-off.
            let within = if held.deleting {
                let now = ctx.now();
                ctx.counting.note_held(&held.uid, now);
                counting::HOLD_AT_MOST.saturating_sub(ctx.counting.held_for(&held.uid, now))
            } else {
                counting::RECOUNT_AT_MOST
            };
            if !within.is_zero() {
                return Err(Error::Holding {
                    pod: run.pod_name,
                    deleting: held.deleting,
                    within,
                    source: Box::new(e),
                });
            }
            run.release_uncounted(&held.uid, &e)?;
        }
        synced?;
        return Err(e);
    }
    let mut next = synced?;
    // A pod found held is counted in the status just written: it goes now, or, made here,
    // after the urgent work queued behind it.
    if let Some(held) = run.release.take() {
        match run.release_may_wait(&held) {
            true if next == Action::await_change() => {
                next = Action::requeue(Duration::ZERO).at(Priority::Routine)
            }
            _ => run.release(&held.uid)?,
        }
    }
    if let Some(e) = run.relabel.take() {
        return Err(e);
    }
    // Look again, as routine work, when what status says of a waiting pod changes.
    if let (None, Some(after)) = (next.requeue_after(), run.refresh) {
        next = Action::requeue(after).at(Priority::Routine);
    }
    Ok(next)
}

/// The object is deleted: Kubernetes' garbage collector removes the pod through its
/// ownerReference, once nothing of ours holds it.
fn object_gone<A: Api>(
    api: &A,
    ctx: &Context,
    trace: &LogContext,
    ns: &str,
    name: &str,
    hint: Option<&PodHint>,
) -> Result<Action, Error> {
    ctx.restarts.forget(trace.key);
    ctx.forget_held(trace.key);
    release_orphan(api, trace, ns, name, None, hint)?;
    Ok(Action::await_change())
}

impl<A: Api> Run<'_, A> {
    /// The decisions of one reconcile, a round at a time: each round learns about the pod (as
    /// `first_look` says, then by reading it) and acts, or says how to look again.
    fn sync(&mut self, hint: Option<&PodHint>) -> Result<Action, Error> {
        if let Some(next) = self.invalid_spec() {
            return Ok(next);
        }
        let mut look = self.first_look(hint);
        let mut rounds = Rounds::default();
        // Normally two rounds at most. A name taken, freed and retaken between our calls gets
        // the queue's backoff instead of a spin here.
        for _ in 0..MAX_ROUNDS {
            let step = match look {
                Look::DeleteTerminated(uid) => {
                    Step::Again(self.delete_terminated(&uid, &mut rounds)?)
                }
                Look::AssumeAbsent => self.absent(true, &mut rounds)?,
                Look::Seen(p) => self.ours(OurPod::seen(p, self.ic, self.ctx), &mut rounds)?,
                Look::Get => match self.api.get_pod(self.ns, &self.pod_name) {
                    Ok(pod) => self.read(&pod, &mut rounds)?,
                    Err(e) if e.is_not_found() => self.absent(false, &mut rounds)?,
                    Err(e) => return Err(Error::from_api("get pod", e)),
                },
            };
            match step {
                Step::Again(next) => look = next,
                Step::Done(next) => return Ok(next),
            }
        }
        Err(Error::Unsettled {
            pod: self.pod_name.clone(),
        })
    }

    /// A watch event showed our pod `uid` terminal: delete it without reading it.
    fn delete_terminated(
        &mut self,
        uid: &str,
        rounds: &mut Rounds,
    ) -> Result<Look<'static>, Error> {
        Ok(match self.delete(uid, "it terminated")? {
            Deleted::Removed { existed } => {
                // It existed until now, so no later pod was started: count it as a read would
                // have. (Not on 404: a later pod may have come and gone.)
                if existed {
                    self.count(uid);
                }
                rounds.cause = Some(Cause::Terminated);
                Look::AssumeAbsent
            }
            Deleted::Pending => {
                self.count(uid);
                Look::Get
            }
            Deleted::OtherPod => Look::Get,
        })
    }

    /// No pod holds the name (or we assume so, `assumed`): make one, unless the back-off says
    /// wait or the server refuses it.
    fn absent(&mut self, assumed: bool, rounds: &mut Rounds) -> Result<Step<'static>, Error> {
        if let Some(e) = rounds.refused.take() {
            // Looked: the name is free, the refusal stands.
            return self.refused(e).map(Step::Done);
        }
        let cause = rounds.cause.unwrap_or_else(|| self.absent_cause());
        if cause.is_restart() {
            if let Some(wait) = self.ctx.restarts.wait(self.trace.key, self.ctx.now()) {
                let remaining = wait.remaining;
                self.back_off(wait);
                return Ok(Step::Done(Action::requeue(remaining)));
            }
        }
        match self.create(cause)? {
            Created::Yes => {
                if let Some(old) = self.removed.take() {
                    self.ctx.expectations.replaced(self.trace.key, &old);
                }
                if cause.is_restart() {
                    self.ctx.restarts.replaced(self.trace.key, self.ctx.now());
                } else {
                    self.ctx.restarts.created(self.trace.key);
                }
                // Counted by its ADDED event's reconcile; this look releases it if none did.
                Ok(Step::Done(Action::requeue(counting::RELEASE_WITHIN)))
            }
            Created::NameTaken if assumed => Ok(Step::Again(Look::Get)),
            // Taken although we just saw it free: the next look, paced by the backoff, shows who.
            Created::NameTaken => Err(self.appeared()),
            // Refused while the name was only assumed free: a pod of ours may hold it (its create
            // answer lost). Look first; a second refusal stands.
            Created::Refused(e) if assumed && rounds.refused.is_none() => {
                rounds.refused = Some(e);
                Ok(Step::Again(Look::Get))
            }
            Created::Refused(e) => self.refused(e).map(Step::Done),
        }
    }

    /// A pod holds the name, as read: not ours is left alone; ours gets our labels back.
    fn read(&mut self, pod: &Pod, rounds: &mut Rounds) -> Result<Step<'static>, Error> {
        if !controlled_by(pod, self.ic) {
            return self.conflict(pod).map(Step::Done);
        }
        match self.restore_labels(pod) {
            Ok(Relabeled::Kept) => {}
            // It was ours and started, so it counts; where it went, only a look can say.
            Ok(Relabeled::Moved) => {
                self.count(&pod.metadata.uid);
                return Ok(Step::Again(Look::Get));
            }
            // Retried after, not before, the count and the release below.
            Err(e) => self.relabel = Some(e),
        }
        self.ours(OurPod::read(pod, self.ic), rounds)
    }

    /// Our pod, read or seen in an event: count it, release it once counted, and replace it if
    /// it ended or its spec changed; else report what it does.
    fn ours(&mut self, pod: OurPod, rounds: &mut Rounds) -> Result<Step<'static>, Error> {
        let OurPod {
            uid,
            change,
            view,
            held,
            ending,
            waiting,
            read,
        } = pod;
        // Ours: it was started, so it counts, once.
        self.count(&uid);
        if let Some(e) = ending {
            self.ended(&uid, &e);
        }
        if held {
            // Released once the status write that ends this reconcile counts it.
            self.release = Some(Held {
                uid: uid.clone(),
                deleting: view.phase == Phase::Terminating,
            });
        } else {
            // Released by someone else (a person, a mutating policy): nothing to release by then.
            self.ctx
                .expectations
                .released_elsewhere(self.trace.key, &uid);
        }
        if view.phase == Phase::Terminating {
            // Its DELETED event brings us back; creating now would only earn AlreadyExists.
            match &change {
                Some(why) => self.replacing(why),
                None => self.report(&view),
            }
            self.waits(waiting, read);
            return Ok(Step::Done(Action::await_change()));
        }
        if view.phase.is_terminal() {
            // The API server deletes a terminal pod at once, whatever the grace period.
            let why = format!("it ended in phase {}", view.phase.as_str());
            // Held by someone's finalizer, it stays: its DELETED event brings us back.
            let pending = |run: &mut Self| run.report(&view);
            return self.replace(&uid, &why, Cause::Terminated, rounds, pending);
        }
        // Compared on what the pod records it was made from (our annotations), not on what it
        // runs: a webhook that rewrites images or adds a sidecar would otherwise cost a
        // replacement forever.
        if let Some(why) = change {
            if !self.confirmed()? {
                return Ok(Step::Done(Action::requeue(Duration::ZERO)));
            }
            // Graceful: the container may be running. Its DELETED event brings us back, unless
            // the server removed it at once.
            let pending = |run: &mut Self| run.replacing(&why);
            return self.replace(&uid, &why, Cause::SpecChanged, rounds, pending);
        }
        self.report(&view);
        self.waits(waiting, read);
        Ok(Step::Done(Action::await_change()))
    }

    /// Whether the copy this reconcile works from is the object as the API server holds it, read
    /// now if it was not: a pod is deleted for a spec change only on the server's word (a copy may
    /// predate an etcd restore, or lag on a standby). A copy found older ends the reconcile.
    fn confirmed(&mut self) -> Result<bool, Error> {
        if self.fresh {
            return Ok(true);
        }
        let m = &self.ic.metadata;
        match self.api.get_immortal_container(self.ns, &m.name) {
            Ok(now)
                if now.metadata.uid == m.uid
                    && now.metadata.resource_version == m.resource_version =>
            {
                self.fresh = true;
                Ok(true)
            }
            Ok(_) => {
                self.stale = true;
                Ok(false)
            }
            Err(e) if e.is_not_found() => {
                self.stale = true;
                Ok(false)
            }
            Err(e) => Err(Error::from_api("get immortalcontainer", e)),
        }
    }

    /// Deletes our pod `uid` to replace it (`why`, `cause`): the name is free now, or the
    /// deletion is `pending` (its DELETED event brings us back), or another pod holds it.
    fn replace(
        &mut self,
        uid: &str,
        why: &str,
        cause: Cause,
        rounds: &mut Rounds,
        pending: impl FnOnce(&mut Self),
    ) -> Result<Step<'static>, Error> {
        Ok(match self.delete(uid, why)? {
            Deleted::Removed { .. } => {
                rounds.cause = Some(cause);
                Step::Again(Look::AssumeAbsent)
            }
            Deleted::Pending => {
                pending(self);
                Step::Done(Action::await_change())
            }
            Deleted::OtherPod => Step::Again(Look::Get),
        })
    }

    /// What the trigger lets the first round skip. A hint is only for this object's own pod
    /// (name and controller uid); a pod it shows alive is acted on without a read only when it
    /// is the pod already counted, so a count always rests on a pod known to exist at that
    /// moment (a watch may lag behind a replacement we made).
    fn first_look<'h>(&self, hint: Option<&'h PodHint>) -> Look<'h> {
        let ours = |p: &SeenPod| {
            p.named_for_owner
                && p.owner_uid
                    .as_ref()
                    .is_some_and(|o| *o == self.ic.metadata.uid)
        };
        match hint {
            Some(PodHint::Left(g)) => {
                if let Some(e) = &g.ending {
                    self.ended(&g.uid.to_string(), e);
                }
                // The pod counted last left, or none was counted: the name is probably free.
                // Any other: look, since a pod may stand that a create would find taken.
                return match self.status.last_counted_pod_uid.as_deref() {
                    Some(counted) if g.uid != *counted => Look::Get,
                    _ => Look::AssumeAbsent,
                };
            }
            Some(PodHint::Seen(p)) if ours(p) => {
                let uid = p.uid.to_string();
                if p.view.phase.is_terminal() {
                    if let Some(e) = &p.ending {
                        self.ended(&uid, e);
                    }
                    return Look::DeleteTerminated(uid);
                }
                // Counted already, or made here and not released: it exists, and nothing after
                // it was counted. Or held while no pod was ever counted: a stale copy is refused
                // at the count's write.
                let made = self
                    .ctx
                    .expectations
                    .made_here(self.trace.key, self.ctx.now());
                let first = self.status.last_counted_pod_uid.is_none()
                    && self.status.current_pod.is_none()
                    && p.held;
                // A pod overdue on its node is read: status then names its node, which no hint
                // carries.
                let overdue = p.waiting.is_some_and(|w| w.overdue(self.now).is_some());
                if (self.status.last_counted_pod_uid.as_deref() == Some(uid.as_str())
                    || made.is_some_and(|(m, _)| m == p.uid)
                    || first)
                    && !overdue
                {
                    return Look::Seen(p);
                }
            }
            _ => {}
        }
        // An object that never had a pod (currentPod too: an older CRD may prune
        // lastCountedPodUID) most likely has none: create first, unless this process made one.
        if self.status.last_counted_pod_uid.is_none()
            && self.status.current_pod.is_none()
            && self
                .ctx
                .expectations
                .made_here(self.trace.key, self.ctx.now())
                .is_none()
        {
            Look::AssumeAbsent
        } else {
            Look::Get
        }
    }

    /// Records how our pod `uid` ended, for the back-off of its replacement: unless a later
    /// pod of ours was counted already (the event is about an older one).
    fn ended(&self, uid: &str, ending: &Ending) {
        let last = self.status.last_counted_pod_uid.as_deref();
        if last.is_none_or(|l| l == uid) {
            self.ctx.restarts.ended(self.trace.key, ending.clone());
        }
    }

    /// Why the pod is absent, judged from status: no pod counted yet means this is the first;
    /// a replacement in progress, or a spec not yet observed, means the spec changed (a person
    /// asked for the new pod: it is never held back); otherwise it was deleted.
    fn absent_cause(&self) -> Cause {
        let spec_changed = self.ic.status.observed_generation.is_some()
            && self.ic.status.observed_generation != self.ic.metadata.generation;
        if self.status.start_times.unwrap_or(0) == 0 && self.status.last_counted_pod_uid.is_none() {
            Cause::New
        } else if spec_changed || self.ready_reason() == Some("PodReplacing") {
            Cause::SpecChanged
        } else {
            Cause::Deleted
        }
    }
}

#[cfg(test)]
mod tests;
