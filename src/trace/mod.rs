//! What the engine can tell about its ops: the [`Diagnostics`] of a stuck
//! engine (`diag`) and the registry of unfinished ops behind them
//! (`track`), fed by the lifecycle hooks of `dep::Host`. The coming trace
//! timelines and hang watchdog belong here, on the same hooks.
//!
//! May import: `crate::loom`, `crate::error`, `crate::dep`.

mod diag;
mod track;

pub use self::diag::{Diagnostics, OpReport, OpState, ResourceReport};
pub(crate) use self::track::Tracker;
