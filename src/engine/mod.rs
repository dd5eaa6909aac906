//! The engine, on top: the facade users call ([`Engine`]), its
//! configuration ([`EngineBuilder`], [`Executor`]), the ops it builds
//! ([`OpBuilder`]), the futures it hands out ([`OpHandle`], [`Wait`]), and
//! its shared state, which serves its ops as their `dep::Host` (`shared`).
//!
//! | module | owns |
//! | --- | --- |
//! | `facade` | [`Engine`]: variables, resources, pushes, waits, devices |
//! | `builder` | [`EngineBuilder`]: checking and starting an engine |
//! | `executor` | [`Executor`], [`Job`]: how each device runs its ops |
//! | `op_builder` | [`OpBuilder`]: describing an op, checked into an `OpSpec`, and its [`WhenRoom`]; [`Ops`], where ops go: an engine pushes them, a recorder records them |
//! | `when_room` | the rule of producers' waits for room under the bound on ops in flight, one for all ([`WhenRoom`], [`ReplayRoom`]) |
//! | `typed_op` | [`TypedOp`], [`TypedCtx`]: typed access, declarations that give the body its values |
//! | `handle` | [`OpHandle`], [`Wait`]: futures, and blocking on them |
//! | `record` | [`Engine::record`](crate::Engine::record), [`Recorder`], [`Graph`] and its [`Replay`]s: the entry to `crate::graph` |
//! | `shared` | the state shared by handles and ops; the `Host` and `Ledger` implementations |
//! | `shutdown` | shutting down when the last handle drops |
//! | `diagnostics` | assembling [`Diagnostics`](crate::Diagnostics) |
//! | `collective` | [`Communicator`], [`CollectiveOp`]: MPI collectives pushed as ops (feature `mpi`; the backend is `device::comm`) |
//! | `trace_window` | [`Tracing`], and the calls that open a trace window and take the [`Trace`](crate::Trace) |
//!
//! May import every layer below: `loom`, `core`, `error`, `exec`,
//! `resource`, `device`, `dep`, `trace`, `graph`. Data-parallel helpers (`parallel/`) will
//! sit above, on the public API.

mod builder;
#[cfg(feature = "mpi")]
mod collective;
mod diagnostics;
mod executor;
mod facade;
mod handle;
mod op_builder;
mod record;
mod shared;
mod shutdown;
mod trace_window;
mod typed_op;
mod when_room;

pub use self::builder::{DEFAULT_DEVICE, EngineBuilder};
#[cfg(feature = "mpi")]
pub use self::collective::{CollectiveOp, Communicator, ReduceOp};
pub use self::executor::{Executor, Job};
pub use self::facade::Engine;
pub use self::handle::{OpHandle, Wait};
pub use self::op_builder::{Once, OpBuilder, Ops, Reusable, WhenRoom};
pub use self::record::{Graph, RecordOp, Recorder, Replay, ReplayRoom};
pub use self::trace_window::Tracing;
pub use self::typed_op::{
    Access, AccessKeys, Accesses, Read, ReadKey, TypedCtx, TypedOp, Write, WriteKey, read, write,
};
