//! The synchronisation primitives, at std's paths: `std` in normal builds,
//! loom's under `cfg(loom)`, so that the models in `loom-tests/` explore every
//! interleaving of the very code the engine runs. Every module of the crate
//! takes its atomics, locks, cells and thread-locals from here.
//!
//! Locks never poison (`sync`): a panic while holding one (only user code
//! panics, and never under an engine lock) leaves state that is consistent
//! between statements, so `lock` hands the guard back either way.

#[cfg(not(loom))]
mod std;
#[cfg(not(loom))]
pub(crate) use self::std::{cell, future, thread};

#[cfg(loom)]
mod mocked;
#[cfg(loom)]
pub(crate) use self::mocked::{cell, future, thread};

pub(crate) mod sync;
