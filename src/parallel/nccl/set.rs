//! A set of NCCL communicators as their lifecycle sees it ([`Set`]): live
//! or aborted, and the order of the calls that end them, over a small
//! trait ([`Ranks`]) of the NCCL and CUDA calls involved, so that the order
//! is the same code for the real communicators (`comms.rs`) and for the
//! tests' fake.
//!
//! Invariants:
//!
//! - Every NCCL call on the communicators is made under the set's lock,
//!   while they are live: an abort frees them, so nothing may touch them
//!   after it (not even `ncclCommGetAsyncError`).
//! - On any NCCL error (a failed call, an asynchronous error, a stream that
//!   failed under NCCL's kernels), every communicator of the set is aborted
//!   (`ncclCommAbort`, rank after rank) **before** any stream is
//!   synchronised: a rank's kernel may wait forever for a peer whose part
//!   never ran, and only the abort makes it quit.
//! - Waiting for the streams ([`Set::settle`]) polls them and NCCL's
//!   asynchronous errors in turn, never a blocking synchronise on live
//!   communicators.
//! - A set is ended once ([`Set::close`]): the streams settled, then
//!   `ncclCommFinalize` on every rank between one `ncclGroupStart` and
//!   `ncclGroupEnd` (an intra-node collective: from one thread the ranks'
//!   calls must be grouped, or the first waits for the others), then
//!   `ncclCommDestroy` on each (purely local once finalised). An aborted
//!   set is not finalised nor destroyed: the abort freed it. A failed
//!   finalize aborts instead.
//!
//! Owns the communicators' state; the communicators are the [`Ranks`]'.

// `unsafe`: the trait's NCCL calls are unsafe (they need the lock and
// live communicators); each call says why its contract holds.
#![allow(unsafe_code)]

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

/// A rank's stream, as `cuStreamQuery` answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum StreamState {
    /// Everything enqueued on it is done.
    Idle,
    /// Work is still running (or waiting) on it.
    Busy,
    /// It failed: the driver's message.
    Failed(String),
}

/// The NCCL and CUDA calls a [`Set`] makes on its ranks (numbered in rank
/// order, `0..count()`).
pub(super) trait Ranks: Send + Sync + 'static {
    /// The number of ranks.
    fn count(&self) -> usize;

    /// Rank `rank`'s stream.
    fn stream(&self, rank: usize) -> StreamState;

    /// Waits for rank `rank`'s stream (its NCCL kernels quit or done).
    fn synchronize(&self, rank: usize);

    /// `ncclCommGetAsyncError` (and its own return) for rank `rank`: NCCL's
    /// message for an error, `None` while fine (or in progress).
    ///
    /// # Safety
    ///
    /// Under the set's lock, the communicators live.
    unsafe fn async_error(&self, rank: usize) -> Option<String>;

    /// `ncclCommAbort` of rank `rank` (best effort: nothing to do on its
    /// failure). The communicator is gone after it.
    ///
    /// # Safety
    ///
    /// As [`async_error`](Self::async_error); once per rank.
    unsafe fn abort(&self, rank: usize);

    /// `ncclGroupStart`.
    ///
    /// # Safety
    ///
    /// As [`async_error`](Self::async_error).
    unsafe fn group_start(&self) -> Result<(), String>;

    /// `ncclGroupEnd`.
    ///
    /// # Safety
    ///
    /// As [`async_error`](Self::async_error), after `group_start`.
    unsafe fn group_end(&self) -> Result<(), String>;

    /// `ncclCommFinalize` of rank `rank`.
    ///
    /// # Safety
    ///
    /// As [`async_error`](Self::async_error), inside a group, with nothing
    /// more enqueued on the communicator.
    unsafe fn finalize(&self, rank: usize) -> Result<(), String>;

    /// `ncclCommDestroy` of rank `rank`. The communicator is gone after it.
    ///
    /// # Safety
    ///
    /// As [`async_error`](Self::async_error), after a successful
    /// finalize of every rank; once per rank.
    unsafe fn destroy(&self, rank: usize);
}

/// Whether the communicators may still be used.
#[derive(Debug)]
enum State {
    Live,
    /// Aborted (freed by NCCL), and why.
    Aborted(String),
    /// Finalised and destroyed.
    Closed,
}

/// What one look at the set ([`Set::check`]) found.
#[must_use]
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Round {
    /// Every stream is idle: nothing of NCCL's is in flight.
    Idle,
    /// Some stream still has work, and no error was seen.
    Busy,
    /// The set is aborted (now, or earlier), and why.
    Aborted(String),
}

/// A set of communicators and their state (module docs).
pub(super) struct Set<R> {
    ranks: R,
    state: Mutex<State>,
}

/// The set locked, its communicators live: for one thread to issue on.
pub(super) struct Locked<'a, R: Ranks> {
    ranks: &'a R,
    state: MutexGuard<'a, State>,
}

impl<R: Ranks> Locked<'_, R> {
    /// The ranks, to issue on.
    pub(super) fn ranks(&self) -> &R {
        self.ranks
    }

    /// An NCCL call failed while issuing (`why`): aborts every rank now,
    /// before anyone synchronises a stream, and fails every later use.
    pub(super) fn fail(&mut self, why: String) {
        abort(self.ranks, &mut self.state, why);
    }
}

/// Aborts every rank of a live set, recording `why` (module docs).
fn abort<R: Ranks>(ranks: &R, state: &mut State, why: String) {
    if !matches!(state, State::Live) {
        return;
    }
    // Rank after rank, not grouped: each call first raises its
    // communicator's abort flag (its kernels quit), and NCCL frees what the
    // process's ranks share at the last one.
    for r in 0..ranks.count() {
        // SAFETY: under the lock (`state` is its guard's), live (checked
        // above); each rank once, as the state is Aborted from here.
        unsafe { ranks.abort(r) };
    }
    *state = State::Aborted(why);
}

/// Sleeps between the rounds of a wait, from 20 µs doubling to 1 ms:
/// short for a collective about to end, cheap for a long one.
pub(super) struct Backoff(Duration);

impl Backoff {
    pub(super) fn new() -> Self {
        Self(Duration::from_micros(20))
    }

    pub(super) fn next(&mut self) -> Duration {
        let now = self.0;
        self.0 = (self.0 * 2).min(Duration::from_millis(1));
        now
    }
}

impl<R: Ranks> Set<R> {
    pub(super) fn new(ranks: R) -> Self {
        Self {
            ranks,
            state: Mutex::new(State::Live),
        }
    }

    /// The ranks (the tests' fake, to read its calls).
    #[cfg(test)]
    pub(super) fn ranks(&self) -> &R {
        &self.ranks
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The set, locked to issue on, unless it was aborted or closed.
    pub(super) fn lock(&self) -> Result<Locked<'_, R>, String> {
        let state = self.state();
        match &*state {
            State::Live => Ok(Locked {
                ranks: &self.ranks,
                state,
            }),
            State::Aborted(why) => Err(format!("the NCCL communicators were aborted: {why}")),
            State::Closed => Err("the NCCL communicators were closed".into()),
        }
    }

    /// Whether the set was aborted.
    pub(super) fn is_aborted(&self) -> bool {
        matches!(*self.state(), State::Aborted(_))
    }

    /// Why the set failed, if it did: aborted earlier, or an asynchronous
    /// error of NCCL's now (which aborts it).
    pub(super) fn failure(&self) -> Option<String> {
        let mut state = self.state();
        self.errors(&mut state)
    }

    /// The asynchronous errors, under the lock (`state`): the first one
    /// aborts the set.
    fn errors(&self, state: &mut State) -> Option<String> {
        match state {
            State::Aborted(why) => return Some(why.clone()),
            State::Closed => return Some("the NCCL communicators were closed".into()),
            State::Live => {}
        }
        for r in 0..self.ranks.count() {
            // SAFETY: under the lock, live (matched above).
            if let Some(m) = unsafe { self.ranks.async_error(r) } {
                let why = format!("rank {r}: {m}");
                abort(&self.ranks, state, why.clone());
                return Some(why);
            }
        }
        None
    }

    /// One look at the set: NCCL's asynchronous errors, then the streams; a
    /// failure of either aborts it.
    pub(super) fn check(&self) -> Round {
        let mut state = self.state();
        if let Some(why) = self.errors(&mut state) {
            return Round::Aborted(why);
        }
        let mut busy = false;
        for r in 0..self.ranks.count() {
            match self.ranks.stream(r) {
                StreamState::Idle => {}
                StreamState::Busy => busy = true,
                StreamState::Failed(m) => {
                    let why = format!("rank {r}: CUDA: {m}");
                    abort(&self.ranks, &mut state, why.clone());
                    return Round::Aborted(why);
                }
            }
        }
        if busy { Round::Busy } else { Round::Idle }
    }

    /// Waits until nothing of NCCL's runs on the streams: polls
    /// ([`check`](Self::check)) until they are idle, or, on an error,
    /// aborts every rank and only then synchronises the streams (whatever
    /// the aborted kernels left, the copies around them, drains). Blocks
    /// the calling thread: for an error path, a drop, or the keeper.
    pub(super) fn settle(&self) -> Result<(), String> {
        let mut backoff = Backoff::new();
        loop {
            match self.check() {
                Round::Idle => return Ok(()),
                Round::Busy => std::thread::sleep(backoff.next()),
                Round::Aborted(why) => {
                    for r in 0..self.ranks.count() {
                        self.ranks.synchronize(r);
                    }
                    return Err(why);
                }
            }
        }
    }

    /// Ends the set (module docs): settled, then finalised as one group and
    /// destroyed rank by rank; or, once aborted, nothing more. Once.
    pub(super) fn close(&self) {
        let _ = self.settle();
        let mut state = self.state();
        if !matches!(*state, State::Live) {
            return;
        }
        // SAFETY: under the lock, live (checked above), nothing enqueued
        // any more (settled; the set's owner is gone, so no one issues).
        let finalized = unsafe { self.finalize() };
        if let Err(why) = finalized {
            abort(&self.ranks, &mut state, why);
            return;
        }
        for r in 0..self.ranks.count() {
            // SAFETY: under the lock, every rank finalised, each once (the
            // state is Closed from here).
            unsafe { self.ranks.destroy(r) };
        }
        *state = State::Closed;
    }

    /// `ncclCommFinalize` on every rank, grouped; the ranks' states
    /// checked after.
    ///
    /// # Safety
    ///
    /// As [`Ranks::finalize`]'s, but for the group (made here).
    unsafe fn finalize(&self) -> Result<(), String> {
        let n = self.ranks.count();
        // SAFETY: the caller's.
        unsafe { self.ranks.group_start() }.map_err(|m| format!("ncclGroupStart: {m}"))?;
        let mut called = Ok(());
        for r in 0..n {
            // SAFETY: the caller's, inside the group just started.
            if let Err(m) = unsafe { self.ranks.finalize(r) } {
                called = Err(format!("rank {r}: ncclCommFinalize: {m}"));
                break;
            }
        }
        // Always closed: an open group swallows every later call.
        // SAFETY: the caller's, after `group_start`.
        let ended = unsafe { self.ranks.group_end() }.map_err(|m| format!("ncclGroupEnd: {m}"));
        called.and(ended)?;
        for r in 0..n {
            // SAFETY: the caller's. NCCL wants the state ncclSuccess before
            // the destroy.
            if let Some(m) = unsafe { self.ranks.async_error(r) } {
                return Err(format!("rank {r}: after ncclCommFinalize: {m}"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
pub(super) mod fake {
    //! A fake set of ranks that records the calls made on it, in order.

    use super::*;
    use std::sync::Arc;

    /// One call on the fake.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub(crate) enum Call {
        Stream(usize),
        Synchronize(usize),
        AsyncError(usize),
        Abort(usize),
        GroupStart,
        GroupEnd,
        Finalize(usize),
        /// With the name of the thread that destroyed it.
        Destroy(usize, String),
    }

    /// What the fake answers.
    #[derive(Default)]
    pub(crate) struct Script {
        /// Streams busy for this many queries each (then idle).
        pub(crate) busy_for: usize,
        /// Rank whose asynchronous error shows at its `n`th query.
        pub(crate) async_error: Option<(usize, usize, &'static str)>,
        /// Rank whose stream fails at its first query.
        pub(crate) stream_fails: Option<usize>,
        /// Rank whose finalize fails.
        pub(crate) finalize_fails: Option<usize>,
    }

    #[derive(Default)]
    pub(crate) struct Fake {
        pub(crate) n: usize,
        pub(crate) script: Script,
        pub(crate) calls: Arc<Mutex<Vec<Call>>>,
    }

    impl Fake {
        pub(crate) fn new(n: usize, script: Script) -> Self {
            Self {
                n,
                script,
                calls: Arc::default(),
            }
        }

        fn record(&self, c: Call) -> usize {
            let mut calls = self.calls.lock().unwrap();
            calls.push(c.clone());
            calls.iter().filter(|&d| *d == c).count()
        }
    }

    impl Ranks for Fake {
        fn count(&self) -> usize {
            self.n
        }
        fn stream(&self, rank: usize) -> StreamState {
            let nth = self.record(Call::Stream(rank));
            if self.script.stream_fails == Some(rank) {
                return StreamState::Failed("CUDA_ERROR_ILLEGAL_ADDRESS".into());
            }
            if nth <= self.script.busy_for {
                StreamState::Busy
            } else {
                StreamState::Idle
            }
        }
        fn synchronize(&self, rank: usize) {
            self.record(Call::Synchronize(rank));
        }
        unsafe fn async_error(&self, rank: usize) -> Option<String> {
            let nth = self.record(Call::AsyncError(rank));
            match self.script.async_error {
                Some((r, at, m)) if r == rank && nth >= at => Some(m.to_string()),
                _ => None,
            }
        }
        unsafe fn abort(&self, rank: usize) {
            self.record(Call::Abort(rank));
        }
        unsafe fn group_start(&self) -> Result<(), String> {
            self.record(Call::GroupStart);
            Ok(())
        }
        unsafe fn group_end(&self) -> Result<(), String> {
            self.record(Call::GroupEnd);
            Ok(())
        }
        unsafe fn finalize(&self, rank: usize) -> Result<(), String> {
            self.record(Call::Finalize(rank));
            match self.script.finalize_fails {
                Some(r) if r == rank => Err("ncclInternalError: internal error".into()),
                _ => Ok(()),
            }
        }
        unsafe fn destroy(&self, rank: usize) {
            let name = std::thread::current().name().unwrap_or("?").to_string();
            self.record(Call::Destroy(rank, name));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fake::{Call, Fake, Script};
    use super::*;

    /// The calls other than the polls (queries of the streams and of the
    /// asynchronous errors), in order.
    fn actions(calls: &[Call]) -> Vec<Call> {
        calls
            .iter()
            .filter(|c| !matches!(c, Call::Stream(_) | Call::AsyncError(_)))
            .cloned()
            .collect()
    }

    fn index(calls: &[Call], c: &Call) -> usize {
        calls.iter().position(|d| d == c).unwrap_or(usize::MAX)
    }

    #[test]
    fn a_failed_issue_aborts_every_rank_before_any_synchronise() {
        let set = Set::new(Fake::new(3, Script::default()));
        let calls = set.ranks().calls.clone();
        {
            let mut locked = set.lock().unwrap();
            locked.fail("ncclAllReduce: ncclInvalidUsage: invalid usage".into());
        }
        let got = set.settle().unwrap_err();
        assert!(got.contains("ncclInvalidUsage"), "{got}");
        assert_eq!(
            actions(&calls.lock().unwrap()),
            [
                Call::Abort(0),
                Call::Abort(1),
                Call::Abort(2),
                Call::Synchronize(0),
                Call::Synchronize(1),
                Call::Synchronize(2),
            ]
        );
        // Nothing of NCCL's is called on the aborted (freed) communicators.
        let m = set.lock().err().unwrap();
        assert!(
            m.contains("aborted") && m.contains("ncclInvalidUsage"),
            "{m}"
        );
        assert_eq!(set.failure().unwrap(), got);
        let before = calls.lock().unwrap().len();
        set.close();
        let after = calls.lock().unwrap()[before..].to_vec();
        assert!(
            after.iter().all(|c| matches!(c, Call::Synchronize(_))),
            "only the streams drained: no finalize, no destroy, no NCCL call: {after:?}"
        );
    }

    #[test]
    fn an_async_error_while_waiting_aborts_then_names_the_rank_and_nccls_message() {
        // Rank 1's stream never drains (its kernel waits for a peer), and
        // its asynchronous error shows at the third look.
        let script = Script {
            busy_for: usize::MAX,
            async_error: Some((
                1,
                3,
                "ncclRemoteError: remote process exited or there was a network error",
            )),
            ..Script::default()
        };
        let set = Set::new(Fake::new(2, script));
        let calls = set.ranks().calls.clone();
        let got = set.settle().unwrap_err();
        assert!(
            got.starts_with("rank 1: ncclRemoteError: remote process exited"),
            "{got}"
        );
        let calls = calls.lock().unwrap();
        // Polled (the errors, the streams) while waiting, never synchronised
        // before the abort; every rank aborted, then synchronised.
        assert!(calls.iter().filter(|c| **c == Call::AsyncError(1)).count() == 3);
        assert_eq!(
            actions(&calls),
            [
                Call::Abort(0),
                Call::Abort(1),
                Call::Synchronize(0),
                Call::Synchronize(1)
            ]
        );
    }

    #[test]
    fn a_failed_stream_aborts_every_rank_too() {
        let script = Script {
            stream_fails: Some(1),
            ..Script::default()
        };
        let set = Set::new(Fake::new(2, script));
        let got = set.settle().unwrap_err();
        assert!(
            got.starts_with("rank 1: CUDA: CUDA_ERROR_ILLEGAL_ADDRESS"),
            "{got}"
        );
        let calls = set.ranks().calls.lock().unwrap().clone();
        assert!(index(&calls, &Call::Abort(1)) < index(&calls, &Call::Synchronize(0)));
    }

    #[test]
    fn a_close_settles_then_finalizes_as_one_group_then_destroys() {
        let script = Script {
            busy_for: 2,
            ..Script::default()
        };
        let set = Set::new(Fake::new(2, script));
        set.close();
        let calls = set.ranks().calls.lock().unwrap().clone();
        let here = std::thread::current().name().unwrap_or("?").to_string();
        assert_eq!(
            actions(&calls),
            [
                Call::GroupStart,
                Call::Finalize(0),
                Call::Finalize(1),
                Call::GroupEnd,
                Call::Destroy(0, here.clone()),
                Call::Destroy(1, here),
            ]
        );
        // The streams were idle before the finalize.
        let finalize = index(&calls, &Call::GroupStart);
        let last_busy = calls.iter().rposition(|c| *c == Call::Stream(1)).unwrap();
        assert!(last_busy < finalize);
        assert!(set.lock().is_err(), "closed");
    }

    #[test]
    fn a_failed_finalize_aborts_instead_of_destroying() {
        let script = Script {
            finalize_fails: Some(0),
            ..Script::default()
        };
        let set = Set::new(Fake::new(2, script));
        set.close();
        let calls = set.ranks().calls.lock().unwrap().clone();
        assert_eq!(
            actions(&calls),
            [
                Call::GroupStart,
                Call::Finalize(0),
                Call::GroupEnd,
                Call::Abort(0),
                Call::Abort(1),
            ]
        );
        assert!(set.is_aborted());
    }
}
