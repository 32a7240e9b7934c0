//! The ImmortalContainer policy, all of it together.
//!
//! [`types`] is the resource and the names its pods carry; [`lifecycle`] decides what each pod
//! and object event means for its owner, and the hint it carries to the reconcile;
//! [`desired`] is the pod an object wants; [`reconcile`] makes the decisions (creating,
//! deleting, waiting, and the status, conditions and Events it reports); [`counting`] holds the exactly-once invariant of
//! `status.startTimes`; [`restarts`] backs off an object whose pods keep ending; [`sweep`]
//! finds, once at start, pods holding our finalizer that the pod watch cannot see; [`store`]
//! is what the operator knows of every object, so that reconcile need not read it.
//!
//! Not here: how requests are sent (`kube`) or how keys are queued and workers run
//! (`runtime`). Imports from here go down to those two, never the other way.

pub mod counting;
pub mod desired;
pub mod lifecycle;
pub mod reconcile;
pub mod restarts;
pub mod store;
pub mod sweep;
pub mod types;
