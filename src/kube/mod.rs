//! Kubernetes access, knowing nothing of ImmortalContainers (kube-rs's `kube-client`): finding
//! the cluster, credentials, TLS, the typed client and its write fence, the core types, Events.
//! What to do with any of it (queues, watch loops, leader election) is `runtime`'s.

pub mod auth;
pub mod client;
pub mod config;
pub mod events;
pub mod fence;
pub mod tls;
pub mod types;
