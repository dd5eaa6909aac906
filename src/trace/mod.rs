//! What the engine can tell about its ops, all fed by the lifecycle hooks
//! of `dep::Host` through one [`Observer`] (`observe`):
//!
//! | module | owns |
//! | --- | --- |
//! | `diag`, `waits`, `stuck`, `track` | the [`Diagnostics`] of a stuck engine, who waits for whom, which ops can never go on and the cycles among them, and the registry of unfinished ops behind them |
//! | `watchdog` | the hang watchdog's state, which reads the registry's progress |
//! | `record` | the trace recorder: per-thread rings of fixed-size events |
//! | `timeline`, `chrome`, `svg` | the [`Trace`] put together from the events, as Chrome JSON and as an SVG timeline |
//! | `spans` | `tracing` spans per op (feature `tracing`) |
//!
//! May import: `crate::loom`, `crate::error`, `crate::dep`.

mod chrome;
mod diag;
mod observe;
mod record;
#[cfg(feature = "tracing")]
mod spans;
mod stuck;
mod svg;
mod timeline;
mod track;
mod waits;
mod watchdog;

pub use self::diag::{Diagnostics, OpReport, OpState, ResourceReport};
pub(crate) use self::observe::Observer;
pub(crate) use self::record::{DEFAULT_EVENTS_PER_THREAD, Recorder};
#[cfg(feature = "tracing")]
pub(crate) use self::spans::Spans;
pub(crate) use self::timeline::{EngineInfo, assemble};
pub use self::timeline::{ReplayedOp, ResourceTrack, Slice, Trace, TracedOp, Track};
pub(crate) use self::track::{Tracker, note_awaited};
pub use self::waits::{Cycle, Needs};
pub(crate) use self::waits::{STUCK_AFTER, analyse};
pub(crate) use self::watchdog::{OnHang, Stall, Watchdog};
