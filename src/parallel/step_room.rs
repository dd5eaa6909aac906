//! Waiting for room before a step: [`StepRoom`], from [`Group::when_room`].
//!
//! A step pushes many ops (the closure's, then the group's reductions and
//! updates) and never waits in the middle: a step half pushed would hold
//! its reductions back behind the very room it waits for. So room for a
//! step is room for its first op, the engine's own rule
//! ([`OpBuilder::when_room`](crate::OpBuilder::when_room): fewer ops in
//! flight than the bound, and never a wait inside one of the engine's
//! ops), which this wait reaches through the public API as any producer
//! would.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use super::group::Group;
use crate::error::Error;

impl Group {
    /// Waits for room under the engine's bound on ops in flight
    /// ([`EngineBuilder::max_in_flight`](crate::EngineBuilder::max_in_flight)),
    /// then gives the group back to [`step`](Self::step).
    ///
    /// Room for a step is room for one op: fewer ops than the bound in
    /// flight. The step then pushes all its ops without waiting (the
    /// closure's, and the group's reductions and updates: a step is never
    /// left half pushed). So a producer that steps this way has fewer ops
    /// than the bound in flight when each step starts, and at most the
    /// bound plus one step's ops, less one, at any time (plus one op per
    /// other producer between its wait and its push). Choose the bound in
    /// ops: a bound below one step's ops lets one step run ahead.
    ///
    /// Inside an op of the engine it never waits, as
    /// [`OpBuilder::when_room`](crate::OpBuilder::when_room): it resolves
    /// at once, to [`Error::WaitsForItself`] if there is no room besides
    /// the calling op. Ready at once without a bound.
    ///
    /// `.await` it in async code, or block with [`StepRoom::wait`].
    ///
    /// ```
    /// use depflow::parallel::Group;
    /// use depflow::{Engine, Error, Executor};
    ///
    /// let engine = Engine::builder()
    ///     .device("cpu0", Executor::pool(1))
    ///     .device("cpu1", Executor::pool(1))
    ///     .max_in_flight(16)
    ///     .build()?;
    /// let devices = ["cpu0", "cpu1"].map(|d| engine.device(d).unwrap());
    /// let mut group = Group::builder(&engine).devices(devices).build()?;
    /// let w = group.param(&[1.0; 4])?;
    /// for _ in 0..50 {
    ///     group.when_room().wait()?.step(|s| {
    ///         let g = s.grad(w).clone();
    ///         s.engine().op().on(s.device()).mutates(&[&g]).run({
    ///             let g = g.key();
    ///             move |ctx| Ok(ctx.write(g)?.fill(1.0))
    ///         })?;
    ///         s.grad_ready(w)
    ///     })?;
    /// }
    /// # futures::executor::block_on(async {
    /// group.when_room().await?.step(|_| Ok(()))?; // the same, in async code
    /// # Ok::<(), Error>(()) })?;
    /// assert_eq!(group.weights(w, 1)?, [1.0; 4]); // no optimizer: summed only
    /// # Ok::<(), Error>(())
    /// ```
    pub fn when_room(&mut self) -> StepRoom<'_> {
        StepRoom { group: Some(self) }
    }
}

/// Waits for room under the engine's bound on ops in flight for one step of
/// a [`Group`]; resolves to the group, to [`step`](Group::step). Made by
/// [`Group::when_room`].
#[must_use = "a StepRoom does nothing unless awaited or waited on"]
#[derive(Debug)]
pub struct StepRoom<'g> {
    group: Option<&'g mut Group>,
}

impl<'g> StepRoom<'g> {
    /// Blocks the calling thread until there is room.
    ///
    /// # Errors
    ///
    /// As for [`WhenRoom::wait`](crate::WhenRoom::wait): while there is no
    /// room, [`Error::WaitsForItself`] inside an op of the engine,
    /// [`Error::BlockingInOp`] inside another engine's op, and
    /// [`Error::BlockingInRuntime`] inside a tokio runtime.
    pub fn wait(mut self) -> Result<&'g mut Group, Error> {
        let group = self.group.take().expect("a StepRoom resolves once");
        // The op's wait, for an op never pushed: its rules are the step's.
        drop(group.engine.op().when_room().wait()?);
        Ok(group)
    }
}

impl<'g> Future for StepRoom<'g> {
    type Output = Result<&'g mut Group, Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let group = self
            .group
            .as_deref()
            .expect("StepRoom polled after it resolved");
        // A fresh wait each poll: it holds nothing but the builder, and
        // registers `cx`'s waker with the engine's room while pending.
        let room = Pin::new(&mut group.engine.op().when_room())
            .poll(cx)
            .map(|r| r.map(drop));
        let room = std::task::ready!(room);
        let group = self.group.take().expect("checked above");
        Poll::Ready(room.map(|()| group))
    }
}
