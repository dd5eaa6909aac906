//! Producers waiting for room under the engine's bound on ops in flight
//! ([`EngineBuilder::max_in_flight`](crate::EngineBuilder::max_in_flight)):
//! the rule every such wait follows (`poll_room`), and its futures: an op's
//! ([`WhenRoom`], from [`OpBuilder::when_room`]) and a replay's
//! ([`ReplayRoom`], from [`Graph::when_room`]). A data-parallel group's
//! step waits through `WhenRoom` (`parallel::StepRoom`), on the public API.
//!
//! The rule: ready once fewer ops than the bound are in flight (at once
//! without a bound); inside an op of this engine, never pending, because the
//! calling op counts itself in flight and the ops that would make room may
//! wait for it. There it resolves at once: to room if there is some besides
//! the calling op, else to [`Error::WaitsForItself`]. The wait hands back
//! what to push with; the push itself never waits, so `n` producers each
//! waiting then pushing one op exceed the bound by at most `n - 1`.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use super::handle::block_outside_ops;
use super::op_builder::OpBuilder;
use super::record::Graph;
use super::shared::Shared;
use crate::dep::in_op_of;
use crate::error::Error;

/// The wait for room every producer makes under `shared`'s bound (see the
/// module docs): ready with `Ok` once there is room, or at once inside an op
/// of this engine (then `Err(WaitsForItself)` if there is no room besides
/// the op); else registers `cx`'s waker for the next op that makes room.
pub(super) fn poll_room(shared: &Shared, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
    if shared.room.is_bounded() && in_op_of(shared) {
        // Never waits inside one of its own ops (see `OpBuilder::when_room`).
        return Poll::Ready(match shared.room.has_room_besides(1) {
            true => Ok(()),
            false => Err(Error::WaitsForItself),
        });
    }
    shared.room.poll_room(cx).map(Ok)
}

/// Waits for room under the engine's bound on ops in flight; resolves to the
/// [`OpBuilder`] to push with. Made by [`OpBuilder::when_room`].
#[must_use = "a WhenRoom does nothing unless awaited or waited on"]
#[derive(Debug)]
pub struct WhenRoom<'a> {
    builder: Option<OpBuilder<'a>>,
}

impl<'a> WhenRoom<'a> {
    pub(super) fn new(builder: OpBuilder<'a>) -> Self {
        Self {
            builder: Some(builder),
        }
    }

    /// Blocks the calling thread until there is room.
    ///
    /// # Errors
    ///
    /// While there is no room: [`Error::WaitsForItself`] inside an op of
    /// this engine (see [`OpBuilder::when_room`]), [`Error::BlockingInOp`]
    /// inside another engine's op, and [`Error::BlockingInRuntime`] inside a
    /// tokio runtime (with the `tokio` feature); `.await` it there instead.
    pub fn wait(self) -> Result<OpBuilder<'a>, Error> {
        block_outside_ops(false, self)
    }
}

impl<'a> Future for WhenRoom<'a> {
    type Output = Result<OpBuilder<'a>, Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let builder = self
            .builder
            .as_ref()
            .expect("WhenRoom polled after it resolved");
        let room = std::task::ready!(poll_room(builder.engine.shared(), cx));
        let builder = self.builder.take();
        Poll::Ready(room.map(|()| builder.expect("checked above")))
    }
}

// An `OpBuilder` holds only shared references and owned data.
impl Unpin for WhenRoom<'_> {}

/// Waits for room under the engine's bound on ops in flight for one replay
/// of a graph; resolves to the [`Graph`], to [`replay`](Graph::replay).
/// Made by [`Graph::when_room`].
#[must_use = "a ReplayRoom does nothing unless awaited or waited on"]
#[derive(Debug)]
pub struct ReplayRoom<'g> {
    graph: Option<&'g Graph>,
}

impl<'g> ReplayRoom<'g> {
    pub(super) fn new(graph: &'g Graph) -> Self {
        Self { graph: Some(graph) }
    }

    /// Blocks the calling thread until there is room.
    ///
    /// # Errors
    ///
    /// As for [`WhenRoom::wait`]: while there is no room,
    /// [`Error::WaitsForItself`] inside an op of this engine,
    /// [`Error::BlockingInOp`] inside another engine's op, and
    /// [`Error::BlockingInRuntime`] inside a tokio runtime.
    pub fn wait(self) -> Result<&'g Graph, Error> {
        block_outside_ops(false, self)
    }
}

impl<'g> Future for ReplayRoom<'g> {
    type Output = Result<&'g Graph, Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let graph = self.graph.expect("ReplayRoom polled after it resolved");
        let room = std::task::ready!(poll_room(graph.shared(), cx));
        self.graph = None;
        Poll::Ready(room.map(|()| graph))
    }
}
