//! Kubernetes access, knowing nothing of ImmortalContainers (kube-rs's `kube-client`):
//! [`config`] finds the cluster and [`auth`] keeps its credentials fresh over [`tls`]; [`client`]
//! is the typed REST client every request goes through, honouring a write [`fence`]; [`types`]
//! holds the core objects reduced to the fields we use; [`events`] records Events off the
//! caller's thread.
//!
//! Not here: what to do with any of it (work queues, watch loops, leader election: `runtime`).

pub mod auth;
pub mod client;
pub mod config;
pub mod events;
pub mod fence;
pub mod tls;
pub mod types;
