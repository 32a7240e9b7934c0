//! Kubernetes access, knowing nothing of ImmortalContainers (kube-rs's `kube-client`): the
//! cluster's configuration, credentials, TLS, the typed client, core types, Events.

pub mod auth;
pub mod client;
pub mod config;
pub mod events;
pub mod fence;
pub mod tls;
pub mod types;
