//! Whether a recorded op's run is due in the replay in flight: the gate
//! that makes a *slow step* (`graph::run_slow`: an op on a stream device,
//! or with units) run once per replay however often its task is woken.
//!
//! A slow step's task is woken by whoever made it ready, and then by what
//! it waits for: other devices' fences, the poller, the broker. A fence
//! wakes every waker registered on it, and a step that waited for two
//! fences registered on both: the second one's wake may come after the
//! step has ended (skipped once both were done), or in a later replay,
//! before the step is ready there. Such a *stale* wake must not run the
//! step again: it would end twice, satisfying its successors and counting
//! itself out twice (a replay resolved before its ops ran).
//!
//! So the step's status word carries one bit, [`DUE`]:
//!
//! - [`make_due`]: the thread that made the step ready (its countdown
//!   reached zero: exactly one per replay) sets it, then wakes the task;
//! - [`on_wake`]: each run of the task reads it first, and does nothing
//!   but return on [`Wake::Stale`] (touching nothing of the graph, which a
//!   stale wake may outlive); on [`Wake::Due`] it runs the step, which is
//!   idempotent until it ends (it re-checks its fences and its work in
//!   flight);
//! - [`end`]: the step clears it as it ends, inside its task's run and
//!   before it counts itself out, so that no later wake runs it again
//!   until the next replay makes it due.
//!
//! A wake that finds the bit clear while the maker is setting it is not
//! lost: the maker wakes the task after setting it, and a task woken while
//! it runs is run again.
//!
//! | bit | set by | cleared by | read by |
//! | --- | --- | --- | --- |
//! | [`DUE`] | the thread that made the step ready (`Release`, after its countdown's `AcqRel`) | the step's own end (before its count-out, whose `AcqRel` orders it before the next replay's `make_due`) | each run of its task (`Acquire`: a stale run that finds it set sees what the maker saw) |

use crate::loom::sync::atomic::AtomicU8;
use crate::loom::sync::atomic::Ordering::{Acquire, Relaxed, Release};

/// The bit of a slow step's status word (its block's `status`) that says
/// its run is due in the replay in flight. The other bits are the block's
/// own; only read-modify-writes touch the word, so none is lost.
pub const DUE: u8 = 0b1000_0000;

/// What a wake of a slow step's task found.
#[must_use]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wake {
    /// The step is due in this replay: run it (again, if it waits).
    Due,
    /// The step is not due (it ended, or is not ready yet in this
    /// replay): a leftover wake, to ignore.
    Stale,
}

/// The step whose status word is `status` became ready in this replay:
/// its next run is due. Called by the one thread that made it ready,
/// before it wakes the step's task.
#[inline]
pub fn make_due(status: &AtomicU8) {
    let before = status.fetch_or(DUE, Release);
    debug_assert_eq!(before & DUE, 0, "a step made ready twice in one replay");
}

/// Whether the run of a task woken now is due (see the module docs).
#[inline]
pub fn on_wake(status: &AtomicU8) -> Wake {
    if status.load(Acquire) & DUE != 0 {
        Wake::Due
    } else {
        Wake::Stale
    }
}

/// The step ended in this replay: later wakes are stale until it is made
/// due again. Called inside its task's run, before it counts itself out.
#[inline]
pub fn end(status: &AtomicU8) {
    let before = status.fetch_and(!DUE, Relaxed);
    debug_assert_ne!(before & DUE, 0, "a step ended that was not due");
}
