//! What the dependency layer needs from the world above: the [`Host`] an op
//! is pushed to (the engine), as tokio's tasks know their scheduler only as
//! `Schedule`.
//!
//! The layer is generic over its host where it runs (an op's future, its
//! push, its grants), so that the engine's implementation is called
//! statically, monomorphised once; an op keeps its host erased (see
//! `lifecycle::host`). The loom models drive the real ops through a no-op
//! host (`testing`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use super::block::{OpBlock, Runner};
use crate::core::few::Few;
use crate::core::tickets::{Broker, Demand};
use crate::device::StreamDevice;
use crate::error::OpFailure;
use crate::loom::sync::Mutex;

/// A new host id, unique in the process (whatever the host's type): a
/// variable carries its host's, and ops may declare only their own host's
/// variables (`decl`), so that all ops in one chain share one host.
pub(crate) fn new_host_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Relaxed)
}

/// What let an op have its units (`Host::on_granted`).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Units<'a> {
    /// They were free when it asked, or its own ticket let it through.
    Free,
    /// This op gave units (or its tickets) back.
    Op(&'a OpBlock),
    /// A variable let units go (deleted, or dropped by its user).
    Var,
}

/// Where a recorded op of a replay is (`Host::on_recorded`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RecordedRun {
    /// Its run starts on this thread (its body, or a stream op's enqueue).
    Started,
    /// Its run ended on this thread (body returned, work enqueued, or it
    /// was skipped).
    Ended,
    /// Its run stopped before its body: it waits for device work and runs
    /// again later (a stream op).
    Deferred,
}

/// What an op needs from the engine it was pushed to.
///
/// Calls come from any thread: the pusher, the threads that complete ops,
/// executors. None of them may block or run an op inline unless the
/// executor is built for that; the lifecycle hooks are called on the hot
/// path, so a host that records nothing leaves them empty.
pub(crate) trait Host: Send + Sync + Sized + 'static {
    /// The host's identity, from [`new_host_id`]: the variables it made
    /// carry it, and ops may only declare those.
    fn id(&self) -> u64;

    /// The lock under which an op on several variables links its edges, so
    /// that every chain sees such ops in one global order.
    fn push_lock(&self) -> &Mutex<()>;

    /// Whether some device is a stream device (then ops mind the device
    /// work on their variables).
    fn has_streams(&self) -> bool;

    /// The device with index `device_index`, if it is a stream device.
    fn stream_device(&self, device_index: u16) -> Option<&StreamDevice>;

    /// Hands a ready op to its device's executor. `yielded`: the op woke
    /// itself while running.
    fn dispatch(&self, op: Runner, yielded: bool);

    /// How many of the ready ops that a thread running ops of device
    /// `device_index` keeps for itself (a replay's, in `graph::run`) it
    /// should hand to the device's executor now, so that no worker idles
    /// while it holds them (a hint). A host that cannot tell says
    /// `usize::MAX`: hand everything over.
    fn wanted(&self, device_index: u16) -> usize;

    /// The broker of the host's counted units (one pool per resource), and
    /// the ops waiting for them.
    fn broker(&self) -> &Broker<Runner>;

    /// Asks for the units of an op whose variables granted it: dispatches it
    /// once they are free (perhaps at once), or at once, holding none, if
    /// it was cancelled before it could park (see `start`).
    #[inline]
    fn request_units(&self, op: Runner) {
        let asked = self.broker().request(op);
        match asked.withdrawn {
            None => self.dispatch_granted(asked.granted, Units::Free),
            Some(op) => {
                self.dispatch_granted(asked.granted, Units::Op(op.metadata()));
                self.dispatch(op, false);
            }
        }
    }

    /// Gives up the tickets of `op`, which will not ask for its units (it
    /// will be skipped), and dispatches what that lets through.
    #[inline]
    fn retire_tickets(&self, demands: &[Demand], op: &OpBlock) {
        self.dispatch_granted(self.broker().retire(demands), Units::Op(op));
    }

    /// Gives units back, (pool, amount) pairs, from `by` (an op that ends,
    /// or a variable that let them go), and dispatches the ops that now fit.
    #[inline]
    fn give_back_units(&self, returns: &[(usize, u64)], by: Units<'_>) {
        self.dispatch_granted(self.broker().release(returns.iter().copied()), by);
        self.on_units(returns.iter().map(|&(pool, _)| pool));
    }

    /// Dispatches the ops the broker granted their units (`on_granted`),
    /// let through by `by`.
    #[inline]
    fn dispatch_granted(&self, granted: Few<Runner>, by: Units<'_>) {
        granted.for_each(|op| {
            let block = op.metadata();
            if let Some(units) = block.units() {
                units.mark_held();
                self.on_units(units.demands().map(|(resource, _)| resource.pool()));
            }
            self.on_granted(block, by);
            self.dispatch(op, false);
        });
    }

    /// Records the failure of an op (reported by `wait_all`).
    fn record_failure(&self, failure: Arc<OpFailure>);

    /// Counts a finished op out: it never reaches the host again.
    fn retire(&self, op: &OpBlock);

    /// Hook: the op was pushed (before it can run).
    #[inline]
    fn on_pushed(&self, _op: &OpBlock) {}

    /// Hook: every variable granted the op, the last one because `by`
    /// completed (none: at its push, or a grant that raced it).
    #[inline]
    fn on_ready(&self, _op: &OpBlock, _by: Option<&OpBlock>) {}

    /// Hook: the op got its units, let through by `by`.
    #[inline]
    fn on_granted(&self, _op: &OpBlock, _by: Units<'_>) {}

    /// Hook: units of `pools` were taken or given back. The pools are
    /// computed only by a host that looks at them.
    #[inline]
    fn on_units(&self, _pools: impl Iterator<Item = usize>) {}

    /// Hook: the op's body is about to run for the first time.
    #[inline]
    fn on_started(&self, _op: &OpBlock) {}

    /// Hook: the op's async body returned `Pending` (it awaits). Never
    /// called for a body that completes in one poll.
    #[inline]
    fn on_suspended(&self, _op: &OpBlock) {}

    /// Hook: the op's async body, suspended before, is about to be polled
    /// again.
    #[inline]
    fn on_resumed(&self, _op: &OpBlock) {}

    /// Hook: an op on a stream device enqueued its device work (its body
    /// returned) and is about to hand its variables on; it ends when the
    /// device has done that work.
    #[inline]
    fn on_enqueued(&self, _op: &OpBlock) {}

    /// Hook: the op ended (its body ran or failed, it was skipped, or its
    /// device work is done) and is about to release what it holds and
    /// retire: the ops it unblocks become ready after this. It is still
    /// alive.
    #[inline]
    fn on_ended(&self, _op: &OpBlock) {}

    /// Whether the host watches the runs of recorded ops
    /// ([`on_recorded`](Self::on_recorded)). Asked once per recorded op
    /// run, before it: a host that watches nothing pays that one branch.
    #[inline]
    fn watches_recorded(&self) -> bool {
        false
    }

    /// Hook (only if [`watches_recorded`](Self::watches_recorded)):
    /// recorded op `op` of the replay whose op is at address `replay` (an
    /// identity, never dereferenced) is at `run`, on this thread.
    #[inline]
    fn on_recorded(&self, _op: &OpBlock, _replay: usize, _run: RecordedRun) {}
}
