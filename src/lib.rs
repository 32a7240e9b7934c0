//! immortal-operator: keeps exactly one pod alive for every ImmortalContainer.
//!
//! Three layers, imports running only downwards: [`immortal`] (the ImmortalContainer policy) →
//! [`runtime`] (controller machinery, generic over the resource) → [`kube`] (Kubernetes access).
//! On top, [`cli`] and [`operator`] wire them into a running operator; [`trace`] reads its logs
//! back. Where each part lives: docs/design.md, "The source".

#![forbid(unsafe_code)]

pub mod cli;
pub mod immortal;
pub mod kube;
pub mod operator;
pub mod runtime;
#[cfg(test)]
mod testutil;
pub mod trace;
pub mod util;
