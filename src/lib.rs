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
//!     move |ctx| -> Result<(), Error> { *ctx.write(&b)? = *ctx.read(&a)? + 1; Ok(()) }
//! })?;
//! engine.push(&[&a], &[&c], {
//!     let (a, c) = (a.clone(), c.clone());
//!     move |ctx| -> Result<(), Error> { *ctx.write(&c)? = *ctx.read(&a)? + 2; Ok(()) }
//! })?;
//! // A = C * 2 mutates A: it waits for both reads of A above.
//! engine.push(&[&c], &[&a], {
//!     let (a, c) = (a.clone(), c.clone());
//!     move |ctx| -> Result<(), Error> { *ctx.write(&a)? = *ctx.read(&c)? * 2; Ok(()) }
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
//! device.
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
//! [`Error::Poisoned`], which names the original failure ([`OpFailure`]: op
//! name and message), and poison what they mutate in turn. The engine keeps
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
//! ([`Executor::custom`], e.g. spawning onto tokio). An engine may have several
//! named devices, each with its own executor ([`EngineBuilder::device`]).
//! A *stream device* (a GPU with `--features cuda`, or a simulated one) runs
//! ops that enqueue work on its streams and complete when that work does;
//! see [`stream`].
//!
//! # How it works
//!
//! Each variable is an atomic chain of waiting ops (see `src/chain.rs`): an
//! append is a `swap` and a `fetch_or`; a single token walks the chain and
//! grants runs of reads, or one write, in push order. Each op is one
//! `async-task` task whose runnable stays parked until its last dependency is
//! granted. No lock is taken on the push or completion path of a
//! single-variable op; multi-variable pushes take a short lock to agree on one
//! global order (see [`Engine`]'s module docs). The transitions are
//! model-checked with loom (`loom-tests/`).
//!
//! `unsafe` code lives in four places, each block with a `SAFETY` comment:
//! the chains' pointer protocol (`src/chain.rs`), the type-erased variables
//! (`src/var.rs`), an op's lifetime and its access to variables
//! (`src/op/`), and the CUDA driver calls (`src/stream/cuda.rs`). Every other module denies `unsafe_code`.

#![warn(missing_docs)]
#![doc(test(attr(deny(warnings))))]

mod broker;
mod chain;
mod diag;
mod engine;
mod error;
mod exec;
mod handle;
mod loom;
mod op;
mod pending;
mod resource;
mod room;
pub mod stream;
mod var;

pub use diag::{Diagnostics, OpReport, OpState, ResourceReport};
pub use engine::{DEFAULT_DEVICE, Engine, EngineBuilder, OpBuilder, WhenRoom};
pub use error::{BoxError, Error, OpFailure};
pub use exec::{Device, Executor, Job};
pub use handle::{OpHandle, Wait};
pub use op::ctx::{OpCtx, VarMut, VarRef};
pub use resource::Resource;
pub use stream::{Lane, Stream};
pub use var::{AnyVar, Var, VarId, VarKey};

/// The code in README.md, compiled and run as doctests.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

/// Internals exposed to the loom models in `loom-tests/` (built with
/// `--cfg loom`). Not part of the API.
#[cfg(loom)]
#[doc(hidden)]
pub mod __loom {
    pub use crate::broker::{Broker, Demand, Granted, Request};
    pub use crate::chain::{Chain, Edge, Owner};
    pub use crate::op::anchor::Anchor;
    pub use crate::op::trigger::Trigger;
    pub use crate::pending::{Pending, Signal};
    pub use crate::room::Room;
    pub use crate::stream::fence::{Fence, VarFences};
    pub use crate::stream::sim::SimEvent;
}
