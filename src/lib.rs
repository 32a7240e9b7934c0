//! immortal-operator: keeps exactly one pod alive for every ImmortalContainer.
//!
//! Three layers, each in its own folder, and imports run one way only, from the top down:
//!
//! - [`immortal`]: the ImmortalContainer policy, all of it: the resource's types, what each
//!   watch event means for its owner, the desired pod, the reconcile decisions, the counting
//!   invariant and the conditions.
//! - [`runtime`]: controller machinery that knows no resource in particular: the work queue and
//!   its rate limits, watchers, leader election, metrics, the probe and metrics server,
//!   logging and the allocator.
//! - [`kube`]: Kubernetes access: configuration (kubeconfig, in-cluster, exec plugins),
//!   credentials, TLS, the typed REST client, the core object types and the Event recorder.
//!
//! On top: [`cli`] (flags) and [`operator`] (wires the layers into a running operator and
//! takes it down in order); `main.rs` only calls them. [`trace`] reads the logs back and
//! [`util`] holds the few helpers every layer uses (jitter, RFC 3339 time, poison-tolerant
//! locks).

// No unsafe code but the global allocator (`runtime::allocator`, which allows it, and why).
#![deny(unsafe_code)]

pub mod cli;
pub mod immortal;
pub mod kube;
pub mod operator;
pub mod runtime;
#[cfg(test)]
mod testutil;
pub mod trace;
pub mod util;
