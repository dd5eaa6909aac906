//! Recorded graphs (seed 004, SINGA's computational graph): a sequence of
//! ops recorded once ([`Engine::record`](crate::Engine::record)), analysed
//! once, and replayed many times through the same blocks and lifecycle as
//! pushed ops.
//!
//! | module | owns |
//! | --- | --- |
//! | `analysis` | a recording, and its analysis into what replays and inspections need |
//! | `dag` | the dependency DAG of a recording (read-after-write, write-after-read, write-after-write edges, as SINGA builds them), and happens-before between its ops |
//! | `plan` | the memory plan: offsets of the planned buffers in one arena, shared by buffers never live at once |
//! | `dot` | the graph in Graphviz's DOT |
//! | `run` | the runtime: resident tasks, the replay's countdowns, the replay's own op |
//! | `capture` | captured graphs: one launch op per replay, on one stream device, its body capturing the recorded bodies once and launching the device graph |
//! | `testing` | (tests and loom) graphs recorded on the no-op host of `dep::testing` |
//! | `info` | what a [`Graph`](crate::Graph) shows of itself: [`GraphOp`], [`GraphEdge`], [`MemoryPlan`] |
//!
//! May import: `crate::loom`, `crate::core`, `crate::error`,
//! `crate::exec`, `crate::resource`, `crate::device`, `crate::dep`. The
//! engine (floor 5) records and replays through this layer, and is its
//! `dep::Host`.

pub(crate) mod analysis;
pub(crate) mod capture;
pub(crate) mod dag;
pub(crate) mod dot;
mod info;
mod long_ops;
pub(crate) mod plan;
pub(crate) mod run;
#[cfg(any(test, loom))]
pub(crate) mod testing;

pub use self::dag::EdgeKind;
pub use self::info::{GraphEdge, GraphOp, MemoryPlan, Order, PlannedBuffer};
