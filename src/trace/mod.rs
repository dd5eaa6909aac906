//! What the engine can tell about its ops: the [`Diagnostics`] of a stuck
//! engine (`diag`) and the registry of unfinished ops behind them
//! (`track`), fed by the lifecycle hooks of `dep::Host`. The coming trace
//! timelines and hang watchdog belong here, on the same hooks.
//!
//! May import: `crate::loom`, `crate::error`, `crate::dep`.

mod chrome;
mod diag;
mod observe;
mod record;
#[cfg(feature = "tracing")]
mod spans;
mod svg;
mod timeline;
mod track;

pub use self::diag::{Diagnostics, OpReport, OpState, ResourceReport};
pub(crate) use self::observe::Observer;
pub(crate) use self::record::{DEFAULT_EVENTS_PER_THREAD, Recorder};
#[cfg(feature = "tracing")]
pub(crate) use self::spans::Spans;
pub(crate) use self::timeline::{EngineInfo, assemble};
pub use self::timeline::{ResourceTrack, Slice, Trace, TracedOp, Track};
pub(crate) use self::track::Tracker;
