//! Controller machinery, generic over the resource, in the shape of kube-rs's `kube-runtime`:
//! [`watcher`] turns a resource's events into keys for the [`queue`], each with its
//! [`trigger`], and keeps what it knows of each key in a [`store`]; [`controller`] runs the
//! watcher and worker threads, and [`pool`] says how many workers run; [`leader`] elects one
//! active replica through a Lease and fences the client's writes; [`liveness`], [`metrics`],
//! [`serve`] (probes and metrics) and [`logging`] make a running operator observable. Which
//! events matter and what a reconcile does are a resource's policy's (see `immortal`).

pub mod controller;
pub mod leader;
pub mod liveness;
pub mod logging;
pub mod metrics;
pub mod pool;
pub mod queue;
pub mod serve;
pub mod shutdown;
pub mod store;
pub mod trigger;
pub mod watcher;
