//! Controller machinery, generic over the resource: the shape of kube-rs's `kube-runtime` and
//! of controller-runtime.
//!
//! [`controller`] runs watcher and worker threads and holds the worker's contract with the
//! queue, and [`pool`] says how many workers run; [`watcher`] lists and watches any resource
//! and turns its events into keys for the [`queue`] (deduplicating, with per-key back-off and
//! an overall failure budget), and keeps what it knows of each key in a [`store`] others may
//! read;
//! [`leader`] elects one active replica through a Lease and fences the client's writes;
//! [`liveness`] (what `/readyz` reads of the watches), [`metrics`], [`serve`] (probes, and
//! metrics over HTTPS with TokenReview and SubjectAccessReview) and [`logging`] make a running
//! operator observable; [`allocator`] is
//! the binary's global allocator.
//!
//! Not here: which events matter, or what a reconcile does. A resource's policy implements
//! [`watcher::Watched`] and drains the queue (see `immortal`); requests go through `kube`.

pub mod allocator;
pub mod controller;
pub mod leader;
pub mod liveness;
pub mod logging;
pub mod metrics;
pub mod pool;
pub mod queue;
pub mod serve;
pub mod store;
pub mod watcher;
