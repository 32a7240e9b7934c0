//! Kubernetes access, knowing nothing of ImmortalContainers: the shape of kube-rs's
//! `kube-client` and of client-go below its informers.
//!
//! [`config`] finds the cluster (kubeconfig files, in-cluster service account) and [`auth`]
//! keeps its credentials fresh (token files, exec plugins) over [`tls`]; [`client`] is the typed
//! REST client every request goes through, LIST and WATCH included, honouring a write
//! [`fence`]; [`types`] holds the core objects reduced to the fields we use; [`events`] records
//! Kubernetes Events off the caller's thread.
//!
//! Not here: what to do with any of it. Work queues, watch loops and leader election are in
//! `runtime`; everything about ImmortalContainers is in `immortal`.

pub mod auth;
pub mod client;
pub mod config;
pub mod events;
pub mod fence;
pub mod tls;
pub mod types;
