//! The ImmortalContainer policy, all of it together: the resource's types, what each pod and
//! object event means for its owner, the desired pod, the reconcile decisions, the counting
//! invariant, the back-off, the start-up sweep and the store reconcile reads. Each module says
//! what it is for; docs/design.md, "The source", lists them. Imports from here go down to
//! `runtime` and `kube`, never the other way.

pub mod counting;
pub mod desired;
pub mod ic_state;
pub mod lifecycle;
pub mod reconcile;
pub mod restarts;
pub mod sweep;
pub mod types;
