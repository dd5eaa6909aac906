//! Whether an op's body runs: its start and a handle's cancel, two
//! read-modify-writes on the op's `status` that decide it exactly.
//!
//! # The protocol
//!
//! - The start (`OpBlock::start`), once the op is about to run its body
//!   (its inputs checked: an op skipped on a poisoned or deleted input
//!   never starts), sets `STARTED` with one read-modify-write, and runs the body
//!   unless `CANCELLED` was set before it.
//! - A cancel (`OpBlock::cancel`) sets `CANCELLED` only while `STARTED` is
//!   clear (a compare-and-swap), and answers whether the body will not run.
//!
//! Both are read-modify-writes of one word, so they are totally ordered,
//! whatever the memory orderings (Relaxed: they order nothing else). If the
//! cancel comes first, the start sees `CANCELLED` and skips the op; if the
//! start comes first, the cancel sees `STARTED` and leaves the word alone.
//! So `CANCELLED` is set only ahead of any start, and the word says which
//! came first: the body ran iff `STARTED` is set and `CANCELLED` is not.
//! A second cancel reads the answer the first one decided. Retiring keeps
//! both bits (`OpBlock::mark_retired`), so the answer stands after the op
//! finished.
//!
//! # A cancel of an op parked for its units
//!
//! An op whose units are not free waits in its host's broker
//! (`core::tickets`), holding nothing; a cancel must not leave it there
//! until they free (they may never: a units deadlock is broken by
//! cancelling one of its ops). So the broker's questions to a request
//! (`Request::park`, `Request::unpark`) are read-modify-writes of this
//! same word, made under the broker's lock:
//!
//! - parking sets `PARKED` only while `CANCELLED` is clear; else the op
//!   does not park (the broker gives up its tickets and hands it back, and
//!   it runs, skipped as cancelled);
//! - a grant of a parked op clears `PARKED` only while `CANCELLED` is
//!   clear; else the op stays parked (*held*), taking nothing;
//! - a cancel that sets `CANCELLED` over `PARKED` has found the op
//!   parked, and held there from now on: it takes it out of the broker
//!   (`lifecycle::withdraw`), which gives up its tickets, clears `PARKED`
//!   and dispatches it: it finishes at once as cancelled, its variables
//!   handed on. A cancel that finds `PARKED` clear leaves the broker alone:
//!   the op has not parked yet (it will not: parking sees `CANCELLED`), or
//!   was granted (it will run, skipped as cancelled, and give its units
//!   back).
//!
//! The op's host is alive while it is withdrawn: the op is pending (parked
//! and held, it cannot finish before the withdrawal dispatches it).
//!
//! Only pushed ops start this way (`future`, `stream_op`): a recorded op
//! has no handle to cancel it (a resident task is marked cancelled only
//! when its graph goes, see `resident`), and runs without this step.

use super::block::{CANCELLED, OpBlock, PARKED, STARTED};
use crate::core::tickets::{Park, Unpark};
use crate::loom::sync::atomic::Ordering::{Acquire, Relaxed};

/// What an op's start decided.
#[must_use = "the body runs only on `Start::Run`"]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Start {
    /// No cancel came first: the body runs (to its end: it cannot be
    /// cancelled from now on).
    Run,
    /// A cancel came first: the op is skipped as cancelled.
    Cancelled,
}

/// What a cancel found.
#[must_use = "whether the op runs depends on it"]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Cancel {
    /// The body will not run: it had not started (now it never will), or it
    /// never does (skipped, or cancelled before).
    NotRun,
    /// The body had started: it runs to its end.
    Started,
}

impl OpBlock {
    /// The op is about to run its body: decides, with one read-modify-write
    /// that races only with a cancel, whether it does.
    #[inline]
    pub(super) fn start(&self) -> Start {
        // `fetch_add` sets the bit as `fetch_or` would (an op starts once:
        // it is clear, and the lease count below never carries into it),
        // in one instruction that returns the old word (x86's `lock xadd`;
        // a `fetch_or` whose result is used is a compare-and-swap loop).
        let before = self.status.fetch_add(STARTED, Relaxed);
        debug_assert_eq!(before & STARTED, 0, "an op starts once");
        match before & CANCELLED {
            0 => Start::Run,
            _ => Start::Cancelled,
        }
    }

    /// Asks the op not to run; says whether its body will not run (see the
    /// module docs).
    pub(crate) fn cancel(&self) -> Cancel {
        let mut status = self.status.load(Relaxed);
        loop {
            if status & CANCELLED != 0 {
                // Set ahead of any start: the start skips the op.
                return Cancel::NotRun;
            }
            if status & STARTED != 0 {
                return Cancel::Started;
            }
            match self
                .status
                .compare_exchange_weak(status, status | CANCELLED, Relaxed, Relaxed)
            {
                Ok(_) if status & PARKED != 0 => {
                    // Parked for its units, and held there from now on:
                    // this cancel takes it out (see the module docs).
                    self.withdraw();
                    return Cancel::NotRun;
                }
                Ok(_) => return Cancel::NotRun,
                Err(now) => status = now,
            }
        }
    }

    /// Takes the op, parked and held in its host's broker, out of it and
    /// dispatches it (see the module docs).
    #[cold]
    fn withdraw(&self) {
        let withdraw = self
            .units()
            .and_then(|units| units.withdraw)
            .expect("only a pushed op with units parks, and only it is cancelled there");
        withdraw(self);
    }

    /// The op is about to park in its host's broker (under its lock): it
    /// does unless a cancel came first.
    pub(super) fn park(&self) -> Park {
        let mut status = self.status.load(Relaxed);
        loop {
            if status & CANCELLED != 0 {
                return Park::Withdrawn;
            }
            match self
                .status
                .compare_exchange_weak(status, status | PARKED, Relaxed, Relaxed)
            {
                Ok(_) => return Park::Parked,
                Err(now) => status = now,
            }
        }
    }

    /// The parked op is about to be granted its units (under the broker's
    /// lock): it is unless a cancel came while it was parked (then it stays
    /// parked, held, until that cancel takes it out).
    pub(super) fn unpark(&self) -> Unpark {
        let mut status = self.status.load(Relaxed);
        loop {
            debug_assert_ne!(status & PARKED, 0, "granted a request not parked");
            if status & CANCELLED != 0 {
                return Unpark::Held;
            }
            match self
                .status
                .compare_exchange_weak(status, status & !PARKED, Relaxed, Relaxed)
            {
                Ok(_) => return Unpark::Granted,
                Err(now) => status = now,
            }
        }
    }

    /// The op was taken out of the broker by its cancel: no longer parked.
    pub(super) fn unmark_parked(&self) {
        self.status.fetch_and(!PARKED, Relaxed);
    }

    /// Whether a handle cancelled the op (before it started).
    #[inline]
    pub(crate) fn is_cancelled(&self) -> bool {
        self.status.load(Relaxed) & CANCELLED != 0
    }

    /// Whether the op's body started (and so runs, or ran, to its end); a
    /// snapshot, which stays true once it is.
    #[inline]
    pub(crate) fn is_started(&self) -> bool {
        self.status.load(Acquire) & (STARTED | CANCELLED) == STARTED
    }
}
