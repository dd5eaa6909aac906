//! The core: the engine's generic state machines, each a small lock-free
//! (or short-lock) protocol with its own loom models.
//!
//! | module | what it decides |
//! | --- | --- |
//! | [`chain`] | one variable's waiting ops, granted in push order (reads together, a write alone) |
//! | [`countdown`] | when the last dependency of an op is met, and who takes its runnable |
//! | [`anchor`] | who frees an op's allocation, once nothing can touch it |
//! | [`generations`] | when every op pushed before a wait has finished |
//! | [`replay`] | when each op of a recorded graph's replay may run, and when the replay is over |
//! | [`due`] | whether a wake of a recorded op's task is due in the replay in flight, or a leftover to ignore |
//! | [`room`] | when a producer may push again under a bound on ops in flight |
//! | [`tickets`] | who gets counted units, in which order, without deadlock |
//! | [`fence`] | when device work is done, and who waits for it |
//! | [`arrivals`] | when the last of `n` parties (a GPU's callback, each) has arrived, and the first failure among them |
//! | [`few`] | (plain data) the small inline list the other layers share |
//!
//! May import: `crate::loom` only. Knows no op, executor, device, resource
//! or engine: what it grants, counts or parks is a type parameter, so the
//! loom models in `loom-tests/` drive these very types with their own.

pub(crate) mod anchor;
#[cfg(any(feature = "cuda", loom, test))]
pub(crate) mod arrivals;
pub(crate) mod chain;
pub(crate) mod countdown;
pub(crate) mod due;
pub(crate) mod fence;
pub(crate) mod few;
pub(crate) mod generations;
pub(crate) mod replay;
pub(crate) mod room;
pub(crate) mod tickets;
