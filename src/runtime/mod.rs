//! Controller machinery, generic over the resource, in the shape of kube-rs's `kube-runtime`:
//! [`watcher`] turns events into keys for the [`queue`] and keeps a [`store`]; [`controller`]
//! runs the threads, [`pool`] sizes the workers, [`leader`] elects one writing replica;
//! [`liveness`], [`metrics`], [`serve`] and [`logging`] make it observable. What events and
//! reconciles mean is the policy's (`immortal`).

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
