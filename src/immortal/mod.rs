//! The ImmortalContainer policy, all of it together (docs/design.md, "The source", lists its
//! modules). Imports from here go down to `runtime` and `kube`, never the other way.

pub mod counting;
pub mod desired;
pub mod ic_state;
pub mod lifecycle;
pub mod reconcile;
pub mod restarts;
pub mod sweep;
pub mod types;
