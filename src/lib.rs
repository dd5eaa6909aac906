//! depflow: a lock-free, async-native dependency engine, after MXNet's.
//!
//! You write a serial program; the engine runs it in parallel. Every resource
//! (a tensor's memory, an RNG, a stream, a file) gets a *variable*. You push
//! each op with the variables it reads and those it mutates, and the engine
//! runs ops as soon as their dependencies allow:
//!
//! - per variable, ops take effect in **push order**;
//! - **reads** of one variable run concurrently; a **mutation** runs alone;
//! - an op starts once **all** its variables allow it.
//!
//! ```
//! use depflow::{Engine, Error};
//!
//! let engine = Engine::new();
//! let a = engine.var(2);
//! let b = engine.var(0);
//! let c = engine.var(0);
//!
//! // B = A + 1 and C = A + 2 only read A: they may run in parallel.
//! engine.push(&[&a], &[&b], {
//!     let (a, b) = (a.clone(), b.clone());
//!     move |ctx| { *ctx.write(&b)? = *ctx.read(&a)? + 1; Ok(()) }
//! })?;
//! engine.push(&[&a], &[&c], {
//!     let (a, c) = (a.clone(), c.clone());
//!     move |ctx| { *ctx.write(&c)? = *ctx.read(&a)? + 2; Ok(()) }
//! })?;
//! // A = C * 2 mutates A: it waits for both reads of A above.
//! engine.push(&[&c], &[&a], {
//!     let (a, c) = (a.clone(), c.clone());
//!     move |ctx| { *ctx.write(&a)? = *ctx.read(&c)? * 2; Ok(()) }
//! })?;
//! engine.wait_for_var(&a).wait()?;
//! assert_eq!(a.version(), 1);
//! # Ok::<(), Error>(())
//! ```
//!
//! # Ops
//!
//! [`Engine::push`] takes a closure that gets an [`OpCtx`], through which it
//! borrows the values of the variables it declared ([`OpCtx::read`],
//! [`OpCtx::write`]); [`Engine::push_async`] takes one that returns a future,
//! which may await while holding its variables. Both return an [`OpHandle`]:
//! a future of the op's result, with a blocking [`OpHandle::wait`]. Dropping a
//! handle never cancels the op. [`Engine::op`] adds a name, a priority and a
//! device, and typed access ([`OpBuilder::with`], [`read()`], [`write()`]): the
//! body gets the declared values themselves.
//!
//! [`Engine::record`] records ops once into a [`Graph`], whose replays cost
//! a fraction of the pushes, with its intermediates in planned memory
//! ([`Recorder::buffer`]). A function written against [`Ops`], which both
//! [`Engine`] and [`Recorder`] implement, declares a step once and runs it
//! either way.
//!
//! With the `nd` feature, `depflow::nd` gives arrays on the engine
//! (MXNet's NDArray): every array operation is an op whose reads and
//! mutations come from its operands, and `nd::record` records the same
//! array code into a graph.
//!
//! # Waiting, deleting
//!
//! [`Engine::wait_for_var`] waits for every mutation pushed on a variable so
//! far, [`Engine::wait_all`] for every op pushed so far; both are futures with
//! a blocking [`Wait::wait`]. [`Engine::delete_var`] runs a function after
//! every op already pushed on a variable (to recycle its memory) and refuses
//! later pushes on it.
//!
//! # Errors and poison
//!
//! An op whose body returns an error or panics **poisons** the variables it
//! mutates. Later ops touching a poisoned variable do not run: they resolve to
//! [`Error::Poisoned`], which names the poisoned input and the original
//! failure ([`OpFailure`]: op name and message), and poison what they mutate
//! in turn. The engine keeps
//! running. A variable stays poisoned until [`Engine::clear_poison`] (pushed
//! like any op) clears it; [`Engine::wait_for_var`] reports the poison, and
//! [`Engine::wait_all`] reports every failure once. Every pushed op's handle
//! resolves exactly once.
//!
//! # Executors
//!
//! Where ready ops run is separate from dependency tracking: a work-stealing
//! CPU pool ([`Executor::pool`], the default), the caller's thread
//! ([`Executor::inline`], for debugging), or any function of yours
//! ([`Executor::custom`]), or a tokio runtime (`Executor::tokio`, with the
//! `tokio` feature), whose async ops can await tokio's timers and files. An
//! engine may have several named devices, each with its own executor
//! ([`EngineBuilder::device`]); [`Executor`] says which futures work on
//! which, and [`Executor::on_thread_start`] lets a pool's threads enter a
//! runtime. `DEPFLOW_EXECUTOR=inline` switches the default device to the
//! inline executor without touching the code ([`EngineBuilder`]).
//! A *stream device* (a GPU with `--features cuda`, or a simulated one) runs
//! ops that enqueue work on its streams and complete when that work does;
//! see [`stream`].
//!
//! # How it works
//!
//! Each variable is an atomic chain of waiting ops (`src/core/chain.rs`): an
//! append is a `swap` and a `fetch_or`; a single token walks the chain and
//! grants runs of reads, or one write, in push order. Each op is one
//! `async-task` task whose runnable stays parked until its last dependency is
//! granted. No lock is taken on the push or completion path of a
//! single-variable op; multi-variable pushes take a short lock to agree on one
//! global order (`src/engine/shared.rs`). The transitions are model-checked
//! with loom (`loom-tests/`), on the engine's own code.
//!
//! The crate is built in layers, each a folder that imports only the ones
//! below it: `core` (state machines), `exec`, `resource`, `device`, `dep`
//! (variables and ops), `trace`, `engine`. `ARCHITECTURE.md` draws them and
//! follows one op through them, and says where `unsafe` lives: every module
//! denies it but the few that say why they need it, and every `unsafe` block
//! carries a `SAFETY` comment (enforced by clippy).

#![warn(missing_docs)]
#![deny(unsafe_code)]
#![warn(clippy::undocumented_unsafe_blocks)]
#![doc(test(attr(deny(warnings))))]

// The layers, from the bottom up (see ARCHITECTURE.md).
mod loom;

mod core;
mod error;

mod device;
mod exec;
mod resource;

mod dep;

mod graph;
mod trace;

mod engine;

pub mod parallel;

#[cfg(feature = "nd")]
pub mod nd;

pub use crate::dep::{
    AnyVar, Buffer, Device, DeviceBuffer, Element, OpCtx, Operand, TypedVar, Var, VarKey, VarMut,
    VarRef,
};
#[cfg(feature = "mpi")]
pub use crate::engine::{CollectiveOp, Communicator, ReduceOp};
pub use crate::engine::{
    DEFAULT_DEVICE, Engine, EngineBuilder, Executor, Graph, Job, Once, OpBuilder, OpHandle, Ops,
    RecordOp, Recorder, Replay, ReplayRoom, Reusable, Tracing, TypedCtx, TypedOp, Wait, WhenRoom,
    read, write,
};
pub use crate::error::{BoxError, Error, OpFailure, VarId};
pub use crate::graph::{EdgeKind, GraphEdge, GraphOp, MemoryPlan, Order, PlannedBuffer};
pub use crate::resource::Resource;
pub use crate::stream::{Lane, Stream};
pub use crate::trace::{
    Cycle, Diagnostics, Needs, OpReport, OpState, ReplayedOp, ResourceReport, ResourceTrack, Slice,
    Trace, TracedOp, Track,
};
/// The rsmpi crate (`mpi` 0.8.2) that [`Communicator`] is built on (the
/// `mpi` feature): initialise MPI and make communicators with it, so that
/// their types are the ones depflow takes, without a dependency of your
/// own on `mpi` at exactly this version. Its `Communicator` trait shares
/// depflow's type's name: see [`Communicator`] for how to import both.
#[cfg(feature = "mpi")]
pub use mpi;

pub mod typed {
    //! Typed access ([`OpBuilder::with`](crate::OpBuilder::with)): the
    //! accesses [`read`](crate::read) and [`write`](crate::write) declare,
    //! and the traits that turn them into what the body gets. The traits
    //! are sealed: only this module's types implement them.

    pub use crate::engine::{Access, AccessKeys, Accesses, Read, ReadKey, Write, WriteKey};
}

pub mod stream {
    //! Stream devices: ops that enqueue work on a GPU's streams, and complete
    //! when that work is done.
    //!
    //! A stream device (`Executor::cuda` with the `cuda` feature, or
    //! [`Executor::simulated_gpu`](crate::Executor::simulated_gpu) for machines
    //! without one) has *lanes*: compute streams, and one stream each for
    //! host-to-device and device-to-host copies (MXNet's copy workers), so that
    //! copies overlap compute. An op pushed to it runs on the device's launcher
    //! thread; its body gets the [`Stream`] of its lane ([`OpCtx::stream`]),
    //! enqueues work and returns. Then:
    //!
    //! 1. The engine records an event after the work (the op's *fence*) and
    //!    gives the op's variables back at once. A consumer on the
    //!    same device is enqueued behind the event (a stream wait, no host round
    //!    trip, even before the producer has finished); a consumer on the host or
    //!    another device waits for the event first, parked, blocking no thread.
    //! 2. The device's *poller* thread sees the event complete; only then is the
    //!    op finished, on the poller's thread (so a body that blocks the
    //!    launcher delays no completion): its handle resolves, `wait_all`
    //!    counts it out and its resource units go back.
    //!
    //! So a device costs two host threads (launcher, poller) however many ops are
    //! in flight. The poller queries only the oldest event of each lane (a lane
    //! completes in order), sleeping between rounds from 5 µs up to 200 µs;
    //! while a host consumer waits for a fence it spins, then yields, first,
    //! and a new op or a consumer's arrival starts the backoff again (a
    //! simulated device also wakes it when an event is reached). Completion
    //! latency matters only to host consumers: device consumers never wait
    //! for the poller. Debug builds warn (once) about a body that ran 20 ms
    //! or more on the launcher: bodies there should only enqueue.
    //!
    //! Errors: a failed launch (the body's `Err`), a host function's error or
    //! an error reported with the event fails the op ([`Error::Failed`](crate::Error::Failed))
    //! and poisons what it mutates, but unlike a failure on the host, only
    //! once the lane's work before its fence is over (the poller
    //! synchronises it first): the op hands its variables on when its body
    //! returns, whatever it returned, as every stream op does. So a
    //! consumer on the same device may be enqueued before the failure is
    //! known: its body runs (its work is enqueued behind the failed op's
    //! fence), and it resolves to [`Error::Poisoned`](crate::Error::Poisoned)
    //! with the original failure, and passes the poison on. A consumer that
    //! starts once the failure is known (any host op, which waits for the
    //! fence first) is skipped, its body not run, as on the host. A sticky error
    //! (an illegal address, a trap: the context runs nothing more) kills the
    //! device: every op in flight fails with it, and later ops fail at once
    //! with it, without running their bodies. Shutting a device down waits
    //! for its streams 10 s at most, and for a dead device not at all.
    //!
    //! A recorded graph's device buffers
    //! ([`Recorder::device_buffer`](crate::Recorder::device_buffer)) live in
    //! the device's memory; a body hands its device work a [`DeviceSlice`]
    //! of one ([`OpCtx::device_buffer`](crate::OpCtx::device_buffer)).
    //!
    //! [`OpCtx::stream`]: crate::OpCtx::stream

    pub use crate::device::{
        DeviceSlice, Lane, SimMemory, SimView, Stream, cuda_device_count, cuda_devices,
    };
}

// The public types cross threads as their docs promise (checked at compile
// time: a change that loses one of these fails to build).
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    const fn send<T: Send>() {}
    send_sync::<Engine>();
    send_sync::<EngineBuilder>();
    send_sync::<Executor>();
    send_sync::<Var<u64>>();
    send_sync::<VarKey<u64>>();
    send_sync::<Resource>();
    send_sync::<Device>();
    send_sync::<OpCtx>();
    send_sync::<Stream>();
    send_sync::<Error>();
    send_sync::<OpFailure>();
    send_sync::<Diagnostics>();
    send_sync::<Graph>();
    send_sync::<Buffer<f32>>();
    send_sync::<DeviceBuffer<f32>>();
    send_sync::<stream::DeviceSlice<f32>>();
    send::<Replay>();
    send::<OpHandle<u64>>();
    send::<Wait>();
    send::<Job>();
    #[cfg(feature = "nd")]
    send_sync::<nd::Array>();
    #[cfg(feature = "nd")]
    send_sync::<nd::Arrays>();
};

/// The code in README.md, compiled and run as doctests.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

/// What the loom models in `loom-tests/` drive (built with `--cfg loom`):
/// the core state machines, and the real ops through a no-op host. Not part
/// of the API.
#[cfg(loom)]
#[doc(hidden)]
pub mod __loom {
    pub use crate::core::anchor::Anchor;
    pub use crate::core::arrivals::Arrivals;
    pub use crate::core::chain::{Chain, Edge, Grant, Owner};
    pub use crate::core::countdown::Countdown;
    pub use crate::core::due::{Wake, end as end_due, make_due, on_wake};
    pub use crate::core::fence::{Fence, VarFences};
    pub use crate::core::generations::{Generations, Signal};
    pub use crate::core::replay::{Countdowns, Left, Satisfied};
    pub use crate::core::room::Room;
    pub use crate::core::tickets::{
        Asked, Broker, Demand, Granted, Park, Request, Unpark, Withdrawn,
    };
    pub use crate::dep::testing::{
        Handle, Harness, Hook, exit_thread, holds_pushed_ops, reclaim_finished,
    };
    pub use crate::device::sim::SimEvent;
    pub use crate::graph::testing::{HarnessGraph, HarnessRecorder, record};
}
