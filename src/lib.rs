//! immortal-operator: keeps exactly one pod alive for every ImmortalContainer.
//!
//! The data flow, one module per stage: [`cli`] flags → [`kubeconfig`] (with [`tls`] and
//! [`auth`]) → [`client`] → two [`watcher`] threads pushing `namespace/name` keys into the
//! [`queue`] → [`reconcile`] workers, wired together and shut down by [`controller`].
//! [`resources`] holds the API types; [`events`], [`leader`], [`metrics`] and [`serve`] (with
//! [`metrics_auth`] and [`server_tls`] for HTTPS metrics) are what running in production adds;
//! [`trace`] reads the logs back. [`allocator`] is the binary's global allocator.

pub mod allocator;
pub mod auth;
pub mod cli;
pub mod client;
pub mod controller;
pub mod counting;
pub mod events;
pub mod fence;
pub mod kubeconfig;
pub mod leader;
pub mod lifecycle;
pub mod logging;
pub mod metrics;
pub mod metrics_auth;
pub mod queue;
pub mod reconcile;
pub mod resources;
pub mod restarts;
pub mod serve;
pub mod server_tls;
#[cfg(test)]
mod testutil;
pub mod tls;
pub mod trace;
pub mod util;
pub mod watcher;
