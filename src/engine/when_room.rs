//! Producers waiting for room under the engine's bound on ops in flight
//! ([`EngineBuilder::max_in_flight`](crate::EngineBuilder::max_in_flight)):
//! the rule every such wait follows (`poll_room`). Its futures are their
//! builders' neighbours: an op's ([`WhenRoom`](crate::WhenRoom), from
//! [`OpBuilder::when_room`](crate::OpBuilder::when_room)) is
//! `op_builder`'s, a replay's ([`ReplayRoom`](crate::ReplayRoom), from
//! [`Graph::when_room`](crate::Graph::when_room)) is `record`'s; a
//! data-parallel group's step waits through `WhenRoom`
//! (`parallel::StepRoom`), on the public API.
//!
//! The rule: ready once fewer ops than the bound are in flight (at once
//! without a bound); inside an op of this engine, never pending, because the
//! calling op counts itself in flight and the ops that would make room may
//! wait for it. There it resolves at once: to room if there is some besides
//! the calling op, else to [`Error::WaitsForItself`]. The wait hands back
//! what to push with; the push itself never waits, so `n` producers each
//! waiting then pushing one op exceed the bound by at most `n - 1`.

use std::task::{Context, Poll};

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
