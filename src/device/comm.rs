//! MPI collectives as a backend (the `mpi` feature): a duplicated MPI
//! communicator, the order its collectives are issued in, and one progress
//! thread that tests their requests and wakes whoever awaits them. It knows
//! no op: the engine's collective ops (`engine::collective`) take a
//! [`Ticket`] when pushed and [`submit`](Comm::submit) their buffer when
//! they run, then await the [`Completion`]. What one collective hands MPI
//! (its status word and its data) is `calls.rs`'s.
//!
//! **Design.** A collective is an async op body: it moves its buffer out of
//! its variable into a [`Pending`] (one allocation), submits it and awaits.
//! The buffer belongs to the `Pending` until MPI is done with it, so an op
//! dropped mid-flight (shutdown, a cancelled task) cannot free memory MPI is
//! still writing: the progress thread holds the `Pending` until its
//! requests complete. This is the stream devices' shape (enqueue, then a
//! poller completes) without a launcher or fences: no stream orders
//! collectives other than MPI's own rule, below, and an async body already
//! gives an op that finishes when woken. One thread per communicator tests
//! the outstanding requests with `MPI_Testsome`; no thread blocks per
//! collective.
//!
//! **Progress.** Open MPI's non-blocking collectives progress only inside
//! MPI calls, so while anything is in flight the thread keeps testing: it
//! spins for [`SPIN_ROUNDS`] rounds without a completion, then yields for
//! [`YIELD_ROUNDS`], then sleeps between rounds, from [`NAP_MIN`] doubling
//! up to [`NAP_MAX`]; a completion or a newly issued request starts it
//! spinning again (an issue wakes a sleeping thread). With nothing in
//! flight it waits on a condition variable, using no CPU.
//!
//! **Issue order.** MPI requires every rank to issue the collectives of a
//! communicator in the same order. Each collective takes a ticket when it
//! is pushed (push order, which is the program's order when one thread
//! pushes them, as it must); its submission is held until every earlier
//! ticket was issued, so requests are issued in ticket order whatever
//! order the ops become ready in. Collectives still overlap each other and
//! computation: only the issue is ordered.
//!
//! **A failure on one rank.** A ticket dropped unsubmitted (its op skipped
//! on a poisoned or deleted input, cancelled, or refusing the collective in
//! its body) still takes its place: a *stand-in* issues the status word
//! saying this rank failed and why, and, once it came back, the data call
//! on a zeroed buffer of the other ranks' length (`calls.rs`). Nothing
//! later is issued on this rank until then. Every collective's status word
//! comes back as the maximum over the ranks, so every rank learns that
//! some rank failed, and its collective fails (poisoning its outputs) with
//! a message naming the lowest failing rank: a failure propagates to every
//! rank instead of leaving the others waiting forever in their calls, and
//! the ranks stay in step for the collectives after it.
//!
//! **Threads.** Every MPI call of this module is made under the state lock
//! (issuing on the thread that submits, testing on the progress thread),
//! so MPI needs `MPI_THREAD_SERIALIZED` at least (`Comm::new` refuses
//! less); a program that also calls MPI itself on other threads while a
//! communicator is alive needs `MPI_THREAD_MULTIPLE`.
//!
//! **What MPI recovers from.** The duplicated communicator has
//! `MPI_ERRORS_RETURN`, so an error code comes back instead of aborting
//! the job: a refused issue, or a request completing with an error, fails
//! that collective with MPI's message. That is all MPI (Open MPI 4.1, no
//! ULFM fault tolerance) offers; it recovers nothing:
//! - a process that crashes or exits mid-job makes `mpirun` abort the
//!   whole job (the other ranks are killed); no rank sees an error;
//! - errors are returned, not repaired: what a communicator is worth after
//!   one is undefined by the standard. An error MPI returns alike on every
//!   rank (a datatype or op it refuses, checked at issue) fails the
//!   collective everywhere and the ranks stay in step; an issue refused on
//!   one rank only leaves that rank's data call missing, so the others
//!   wait in theirs (their status words still say nothing failed);
//! - if `MPI_Testsome` itself fails, every outstanding collective fails,
//!   its buffer is leaked (MPI may still write to it) and the communicator
//!   is closed.
//!
//! What this module adds is the status word: failures of the *program* on
//! one rank (an op's error, a poisoned input, a skipped collective) reach
//! every rank as a failed collective rather than a hang.
//!
//! **Shutdown.** [`Comm::shutdown`] stops new issues (later submissions
//! fail), lets the progress thread complete what is in flight (which needs
//! the other ranks to take part), then frees the communicator; it waits
//! until a deadline and reports what was still outstanding. It must happen
//! before `MPI_Finalize` (rsmpi's `Universe` drop).

// `unsafe`: calls into the MPI library; each block says why it is sound.
#![allow(unsafe_code)]

mod calls;

use std::collections::VecDeque;
use std::ffi::c_int;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use mpi::ffi;
use mpi::traits::Equivalence;

pub(crate) use self::calls::{Completion, Reason, Spec};
use self::calls::{InFlight, Part, Pending};
use super::Threads;
use crate::loom::sync::{Condvar, Mutex, MutexGuard};

/// Rounds of `MPI_Testsome` without a completion spent spinning, then
/// yielding between rounds, before the progress thread naps.
const SPIN_ROUNDS: u32 = 256;
/// Rounds spent yielding after the spinning ones.
const YIELD_ROUNDS: u32 = 256;
/// The first nap between rounds; each next one is twice as long, up to
/// [`NAP_MAX`].
const NAP_MIN: Duration = Duration::from_micros(10);
/// The longest nap between two rounds of testing.
const NAP_MAX: Duration = Duration::from_micros(200);

/// The reduction of an all-reduce ([`CollectiveOp::reduce`](crate::CollectiveOp::reduce)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    /// Element-wise sum (`MPI_SUM`).
    Sum,
    /// Element-wise maximum (`MPI_MAX`).
    Max,
    /// Element-wise minimum (`MPI_MIN`).
    Min,
}

impl ReduceOp {
    fn raw(self) -> ffi::MPI_Op {
        // SAFETY: rsmpi's handles to MPI's predefined ops, valid once MPI
        // is initialised (a `Comm` exists only then).
        unsafe {
            match self {
                ReduceOp::Sum => ffi::RSMPI_SUM,
                ReduceOp::Max => ffi::RSMPI_MAX,
                ReduceOp::Min => ffi::RSMPI_MIN,
            }
        }
    }
}

/// What a submitted buffer takes part in.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Collective {
    /// Reduced in place across ranks.
    AllReduce(ReduceOp),
    /// Overwritten with rank `root`'s.
    Broadcast { root: c_int },
    /// The rank's block (the `len / size` elements at `rank * len / size`)
    /// is in place; the others are filled from the other ranks.
    AllGather,
}

/// A communicator's backend: the duplicated MPI communicator, the issue
/// order, the progress thread.
pub(crate) struct Comm {
    shared: Arc<Shared>,
    thread: Arc<Threads>,
}

struct Shared {
    raw: ffi::MPI_Comm,
    /// `MPI_IN_PLACE` of this MPI library (a macro, absent from rsmpi).
    in_place: usize,
    rank: usize,
    size: usize,
    next_ticket: AtomicU64,
    state: Mutex<State>,
    cv: Condvar,
}

// SAFETY: `raw` is an MPI handle (a pointer in Open MPI) used only under
// the state lock, or by the progress thread after the last submitter left.
unsafe impl Send for Shared {}
// SAFETY: as above.
unsafe impl Sync for Shared {}

/// One ticket's place in the issue order.
enum Slot {
    /// Not submitted yet.
    Open,
    /// Failed unissued (shut down): issues nothing.
    Void,
    /// Submitted: a rank's own buffer, or a stand-in for a failed one.
    Submitted(Arc<dyn InFlight>),
}

struct State {
    /// The ticket issued next; `waiting[i]` is ticket `next_issue + i`.
    next_issue: u64,
    waiting: VecDeque<Slot>,
    /// Outstanding requests and the part of which collective each is,
    /// index for index.
    requests: Vec<ffi::MPI_Request>,
    in_flight: Vec<(Arc<dyn InFlight>, Part)>,
    /// A stand-in's status word is in flight: nothing is issued until it
    /// comes back and the stand-in's data call is issued.
    held: bool,
    /// Requests issued so far (the progress thread starts spinning again
    /// when it changes).
    issued: u64,
    /// Why nothing more is issued (shut down, or MPI broken).
    closed: Option<&'static str>,
}

/// What failed without reaching MPI (or whose part MPI refused), to be
/// completed outside the state lock.
type Failed = Vec<(Arc<dyn InFlight>, Part, String)>;

/// Held by an op between its push and its submission; dropping it
/// unsubmitted issues a stand-in in its place (this rank failed).
pub(crate) struct Ticket {
    shared: Arc<Shared>,
    n: u64,
    spec: Spec,
    /// Why the stand-in stands in, if dropped unsubmitted.
    reason: Reason,
    used: bool,
}

impl std::fmt::Debug for Ticket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ticket").field("n", &self.n).finish()
    }
}

impl Ticket {
    /// Gives the place up because the op refused the collective before
    /// submitting: a stand-in takes part, saying so.
    pub(crate) fn refuse(mut self) {
        self.reason = Reason::Refused;
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if !self.used {
            let s = &self.shared;
            let stand_in = Arc::new(self.spec.stand_in(s.rank, s.size, self.reason));
            let failed = s.fill(self.n, Slot::Submitted(stand_in));
            finish(failed);
        }
    }
}

/// Completes what failed outside the state lock (a waker may run its op
/// right here, and that op may submit).
fn finish(failed: Failed) {
    for (p, part, message) in failed {
        p.done(part, Err(message), false);
    }
}

impl Shared {
    /// The state of communicator `raw`, nothing issued yet.
    fn new(raw: ffi::MPI_Comm, in_place: usize, rank: usize, size: usize) -> Self {
        Self {
            raw,
            in_place,
            rank,
            size,
            next_ticket: AtomicU64::new(0),
            state: Mutex::new(State {
                next_issue: 0,
                waiting: VecDeque::new(),
                requests: Vec::new(),
                in_flight: Vec::new(),
                held: false,
                issued: 0,
                closed: None,
            }),
            cv: Condvar::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock()
    }

    /// Puts `slot` at ticket `n` and issues what is now first in line;
    /// returns what failed, to complete unlocked.
    fn fill(&self, n: u64, slot: Slot) -> Failed {
        let mut failed = Vec::new();
        let mut st = self.lock();
        let i = (n - st.next_issue) as usize;
        while st.waiting.len() <= i {
            st.waiting.push_back(Slot::Open);
        }
        st.waiting[i] = slot;
        let before = st.issued;
        self.issue_ready(&mut st, &mut failed);
        let issued = st.issued != before;
        drop(st);
        if issued {
            self.cv.notify_one();
        }
        failed
    }

    /// Issues the submitted collectives at the front of the line, in
    /// ticket order, until an open ticket or a stand-in's status word in
    /// flight; what fails goes to `failed`.
    fn issue_ready(&self, st: &mut State, failed: &mut Failed) {
        while !st.held && matches!(st.waiting.front(), Some(Slot::Submitted(_) | Slot::Void)) {
            let Some(Slot::Submitted(p)) = st.waiting.pop_front() else {
                st.next_issue += 1;
                continue;
            };
            st.next_issue += 1;
            if let Some(why) = st.closed {
                // On every rank alike (a shutdown at the same point of the
                // program): nothing is issued.
                failed.push((p.clone(), Part::Status, why.to_string()));
                failed.push((p, Part::Data, why.to_string()));
                continue;
            }
            match p.issue(self, Part::Status) {
                Ok(request) => st.push(request, p.clone(), Part::Status),
                Err(rc) => {
                    // MPI refused a status word of two i64s: refused alike
                    // on every rank, so none issues the data call either.
                    let m = error_string(rc);
                    failed.push((p.clone(), Part::Status, m.clone()));
                    failed.push((p, Part::Data, m));
                    continue;
                }
            }
            if p.data_after_status() {
                st.held = true;
            } else {
                self.issue_data(st, p, failed);
            }
        }
    }

    /// A stand-in's status word came back (`ok`: without an error): its
    /// data call goes out now (even if shut down since: the other ranks
    /// wait for it), then the line behind it.
    fn status_back(&self, st: &mut State, p: &Arc<dyn InFlight>, ok: bool, failed: &mut Failed) {
        st.held = false;
        if ok {
            self.issue_data(st, p.clone(), failed);
        }
        self.issue_ready(st, failed);
    }

    fn issue_data(&self, st: &mut State, p: Arc<dyn InFlight>, failed: &mut Failed) {
        match p.issue(self, Part::Data) {
            Ok(request) => st.push(request, p, Part::Data),
            Err(rc) => failed.push((p, Part::Data, error_string(rc))),
        }
    }
}

impl State {
    fn push(&mut self, request: ffi::MPI_Request, p: Arc<dyn InFlight>, part: Part) {
        self.requests.push(request);
        self.in_flight.push((p, part));
        self.issued += 1;
    }
}

/// MPI's message for an error code.
fn error_string(rc: c_int) -> String {
    let mut buf = [0 as std::ffi::c_char; ffi::MPI_MAX_ERROR_STRING as usize + 1];
    let mut len: c_int = 0;
    // SAFETY: `buf` holds MPI_MAX_ERROR_STRING characters and the nul, as
    // MPI_Error_string requires; callable at any time after init.
    let ok = unsafe { ffi::MPI_Error_string(rc, buf.as_mut_ptr(), &mut len) };
    if ok != ffi::MPI_SUCCESS as c_int {
        return format!("MPI error {rc}");
    }
    let bytes: Vec<u8> = buf[..len.max(0) as usize]
        .iter()
        .map(|&c| c as u8)
        .collect();
    format!("MPI error {rc}: {}", String::from_utf8_lossy(&bytes))
}

/// `MPI_IN_PLACE` of the MPI library this process runs, from its version
/// string: a macro in `mpi.h`, which rsmpi does not export.
fn in_place() -> Result<usize, String> {
    let mut buf = [0 as std::ffi::c_char; 8192];
    let mut len: c_int = 0;
    // SAFETY: `buf` is larger than MPI_MAX_LIBRARY_VERSION_STRING (Open
    // MPI: 256, MPICH: 8192).
    let rc = unsafe { ffi::MPI_Get_library_version(buf.as_mut_ptr(), &mut len) };
    if rc != ffi::MPI_SUCCESS as c_int {
        return Err(error_string(rc));
    }
    let bytes: Vec<u8> = buf[..len.max(0) as usize]
        .iter()
        .map(|&c| c as u8)
        .collect();
    let version = String::from_utf8_lossy(&bytes);
    if version.contains("Open MPI") {
        Ok(1) // ((void *) 1)
    } else if version.contains("MPICH") || version.contains("Intel") {
        Ok(usize::MAX) // ((void *) -1)
    } else {
        Err(format!(
            "unknown MPI library ({}): its MPI_IN_PLACE is not known",
            version.lines().next().unwrap_or("")
        ))
    }
}

impl Comm {
    /// Duplicates `comm` (so that the engine's collectives never mix with
    /// the program's own on it), sets `MPI_ERRORS_RETURN` on the duplicate
    /// and starts its progress thread.
    pub(crate) fn new(name: &str, comm: ffi::MPI_Comm) -> Result<Self, String> {
        if !mpi::environment::is_initialized() || mpi::environment::is_finalized() {
            return Err("MPI is not initialised (or already finalised)".into());
        }
        let level = mpi::environment::threading_support();
        if level < mpi::Threading::Serialized {
            return Err(format!(
                "MPI was initialised with {level:?} threading: collectives need Serialized or Multiple (mpi::initialize_with_threading)"
            ));
        }
        let in_place = in_place()?;
        // SAFETY: rsmpi's null communicator, a plain value.
        let mut raw = unsafe { ffi::RSMPI_COMM_NULL };
        let (mut size, mut rank) = (0, 0);
        // SAFETY: `comm` is a live communicator (the caller's); `raw`,
        // `size` and `rank` are written by MPI.
        unsafe {
            check(ffi::MPI_Comm_dup(comm, &mut raw))?;
            check(ffi::MPI_Comm_set_errhandler(raw, ffi::RSMPI_ERRORS_RETURN))?;
            check(ffi::MPI_Comm_size(raw, &mut size))?;
            check(ffi::MPI_Comm_rank(raw, &mut rank))?;
        }
        let shared = Arc::new(Shared::new(raw, in_place, rank as usize, size as usize));
        let thread = Arc::new(Threads::default());
        thread
            .spawn(format!("{name}-mpi"), {
                let shared = shared.clone();
                move || progress(&shared)
            })
            .map_err(|e| format!("cannot start the progress thread: {e}"))?;
        Ok(Self { shared, thread })
    }

    pub(crate) fn rank(&self) -> usize {
        self.shared.rank
    }

    pub(crate) fn size(&self) -> usize {
        self.shared.size
    }

    /// The next place in the issue order (push order), for collective
    /// `what` on elements of `T`.
    pub(crate) fn ticket<T: Equivalence>(&self, what: Collective) -> Ticket {
        Ticket {
            shared: self.shared.clone(),
            n: self.shared.next_ticket.fetch_add(1, Relaxed),
            spec: Spec::of::<T>(what),
            reason: Reason::Skipped,
            used: false,
        }
    }

    /// Submits `buf` for the ticket's collective at its place: issued once
    /// every earlier ticket was; the completion resolves when MPI is done
    /// with it and its status word.
    pub(crate) fn submit<T: Equivalence + Send + 'static>(
        &self,
        mut ticket: Ticket,
        buf: Vec<T>,
    ) -> Completion<T> {
        let pending = Arc::new(Pending::new(ticket.spec.what, self.size(), buf));
        ticket.used = true;
        let failed = self.shared.fill(ticket.n, Slot::Submitted(pending.clone()));
        finish(failed);
        Completion(pending)
    }

    /// Stops issuing (what waits to be issued fails), lets the progress
    /// thread complete what is in flight and free the communicator, and
    /// waits for it until `deadline`. `Err`: how many requests were
    /// still outstanding then (their buffers stay with the thread).
    pub(crate) fn shutdown(&self, deadline: Instant) -> Result<(), usize> {
        const CLOSED: &str = "the communicator was shut down before this collective was issued";
        let mut failed: Failed = Vec::new();
        {
            let mut st = self.shared.lock();
            st.closed.get_or_insert(CLOSED);
            // (A stand-in's status word in flight still gets its data call:
            // the progress thread issues it, the other ranks wait for it.)
            let submitted = st.waiting.iter_mut();
            for s in submitted.filter(|s| matches!(s, Slot::Submitted(_))) {
                if let Slot::Submitted(p) = std::mem::replace(s, Slot::Void) {
                    failed.push((p.clone(), Part::Status, CLOSED.to_string()));
                    failed.push((p, Part::Data, CLOSED.to_string()));
                }
            }
        }
        finish(failed);
        self.shared.cv.notify_one();
        self.thread.join(Some(deadline));
        let outstanding = self.shared.lock().requests.len();
        if outstanding == 0 {
            Ok(())
        } else {
            Err(outstanding)
        }
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        let _ = self.shutdown(Instant::now() + super::SHUTDOWN_DEADLINE);
    }
}

impl std::fmt::Debug for Comm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Comm")
            .field("rank", &self.shared.rank)
            .field("size", &self.shared.size)
            .finish_non_exhaustive()
    }
}

fn check(rc: c_int) -> Result<(), String> {
    if rc == ffi::MPI_SUCCESS as c_int {
        Ok(())
    } else {
        Err(error_string(rc))
    }
}

/// How long the progress thread waits before its next round of testing:
/// spin, then yield, then naps growing to [`NAP_MAX`] (see the module
/// docs). `reset` when something completed or was issued.
#[derive(Debug, Default)]
struct Backoff {
    idle: u32,
    nap: Duration,
}

/// What the progress thread does before its next round.
#[derive(Debug, PartialEq, Eq)]
enum Pause {
    Spin,
    Yield,
    Nap(Duration),
}

impl Backoff {
    fn reset(&mut self) {
        self.idle = 0;
        self.nap = Duration::ZERO;
    }

    /// A round completed nothing: what to do before the next one.
    fn next(&mut self) -> Pause {
        self.idle = self.idle.saturating_add(1);
        if self.idle <= SPIN_ROUNDS {
            Pause::Spin
        } else if self.idle <= SPIN_ROUNDS + YIELD_ROUNDS {
            Pause::Yield
        } else {
            self.nap = (self.nap * 2).clamp(NAP_MIN, NAP_MAX);
            Pause::Nap(self.nap)
        }
    }
}

/// The progress thread: tests the outstanding requests, completes those
/// done, issues a stand-in's data call once its status word came back,
/// and frees the communicator once closed with nothing in flight.
fn progress(shared: &Shared) {
    let mut indices: Vec<c_int> = Vec::new();
    let mut statuses: Vec<ffi::MPI_Status> = Vec::new();
    // What completed this round: the collective, its part, its outcome,
    // whether its buffer must be leaked.
    type Done = (Arc<dyn InFlight>, Part, Result<(), String>, bool);
    let mut done: Vec<Done> = Vec::new();
    let mut failed: Failed = Vec::new();
    let mut hit: Vec<(usize, c_int)> = Vec::new();
    let mut backoff = Backoff::default();
    let mut seen = 0u64; // requests issued as of the last round
    let mut pause = Pause::Spin;
    loop {
        let mut st = shared.lock();
        if let Pause::Nap(nap) = pause {
            // Woken early by an issue (`fill` notifies).
            if st.issued == seen && !st.requests.is_empty() {
                st = shared.cv.wait_timeout(st, nap).0;
            }
        }
        while st.requests.is_empty() {
            if st.closed.is_some() {
                drop(st);
                free(shared.raw);
                return;
            }
            st = shared.cv.wait(st);
        }
        if st.issued != seen {
            seen = st.issued;
            backoff.reset();
        }
        let n = st.requests.len();
        indices.resize(n, 0);
        // SAFETY: MPI_Status is plain data; zero is a valid value.
        statuses.resize(n, unsafe { std::mem::zeroed() });
        let mut outcount: c_int = 0;
        // SAFETY: the arrays hold `n` elements each, as MPI_Testsome needs;
        // every request is an outstanding one of `raw`, called under the
        // state lock.
        let rc = unsafe {
            ffi::MPI_Testsome(
                n as c_int,
                st.requests.as_mut_ptr(),
                &mut outcount,
                indices.as_mut_ptr(),
                statuses.as_mut_ptr(),
            )
        };
        let in_status = rc == ffi::MPI_ERR_IN_STATUS as c_int;
        if rc != ffi::MPI_SUCCESS as c_int && !in_status {
            // The requests' state is unknown: fail them all, keep their
            // buffers from being freed, issue nothing more.
            let message = format!("MPI_Testsome failed: {}", error_string(rc));
            st.requests.clear();
            st.held = false;
            st.closed = Some("MPI_Testsome failed: the communicator is unusable");
            done.extend(
                st.in_flight
                    .drain(..)
                    .map(|(p, part)| (p, part, Err(message.clone()), true)),
            );
            shared.issue_ready(&mut st, &mut failed);
        } else if outcount > 0 {
            // (MPI_UNDEFINED, negative, only when no request is active.)
            let k = outcount as usize;
            hit.extend((0..k).map(|j| (indices[j] as usize, statuses[j].MPI_ERROR)));
            // From the last index down, so that `swap_remove` keeps the
            // others' indices.
            hit.sort_unstable_by_key(|h| std::cmp::Reverse(h.0));
            for (i, err) in hit.drain(..) {
                st.requests.swap_remove(i);
                let (p, part) = st.in_flight.swap_remove(i);
                let outcome = if in_status && err != ffi::MPI_SUCCESS as c_int {
                    Err(error_string(err))
                } else {
                    Ok(())
                };
                if part == Part::Status && p.data_after_status() {
                    shared.status_back(&mut st, &p, outcome.is_ok(), &mut failed);
                }
                done.push((p, part, outcome, false));
            }
        }
        drop(st);
        if done.is_empty() && failed.is_empty() {
            pause = backoff.next();
            match pause {
                Pause::Spin => std::hint::spin_loop(),
                Pause::Yield => std::thread::yield_now(),
                Pause::Nap(_) => {} // at the top, under the lock
            }
        } else {
            backoff.reset();
            pause = Pause::Spin;
            for (p, part, outcome, leak) in done.drain(..) {
                p.done(part, outcome, leak);
            }
            for (p, part, message) in failed.drain(..) {
                p.done(part, Err(message), false);
            }
        }
    }
}

/// Frees the duplicated communicator, unless MPI was finalised already.
fn free(mut raw: ffi::MPI_Comm) {
    let mut finalized: c_int = 0;
    // SAFETY: MPI_Finalized may be called at any time; MPI_Comm_free on
    // the communicator this module duplicated, with no request left on it.
    unsafe {
        ffi::MPI_Finalized(&mut finalized);
        if finalized == 0 {
            ffi::MPI_Comm_free(&mut raw);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex as StdMutex;

    use super::*;

    type Log = Arc<StdMutex<Vec<(u32, Part)>>>;

    /// Records the order its parts are issued in; MPI is never called.
    struct Fake {
        id: u32,
        stand_in: bool,
        log: Log,
        outcomes: StdMutex<Vec<(Part, Result<(), String>)>>,
    }

    impl InFlight for Fake {
        fn issue(&self, _: &Shared, part: Part) -> Result<ffi::MPI_Request, c_int> {
            self.log.lock().unwrap().push((self.id, part));
            // SAFETY: rsmpi's null request, a plain value.
            Ok(unsafe { ffi::RSMPI_REQUEST_NULL })
        }
        fn done(&self, part: Part, outcome: Result<(), String>, _: bool) {
            self.outcomes.lock().unwrap().push((part, outcome));
        }
        fn data_after_status(&self) -> bool {
            self.stand_in
        }
    }

    fn shared() -> Arc<Shared> {
        // SAFETY: rsmpi's null communicator, a plain value (unused).
        Arc::new(Shared::new(unsafe { ffi::RSMPI_COMM_NULL }, 1, 0, 2))
    }

    /// A ticket's place, filled by hand (a dropped `Ticket` would make a
    /// real stand-in, which calls MPI).
    fn place(shared: &Arc<Shared>) -> u64 {
        shared.next_ticket.fetch_add(1, Relaxed)
    }

    fn fake(id: u32, stand_in: bool, log: &Log) -> Arc<Fake> {
        Arc::new(Fake {
            id,
            stand_in,
            log: log.clone(),
            outcomes: StdMutex::new(Vec::new()),
        })
    }

    fn submit(s: &Shared, n: u64, f: &Arc<Fake>) {
        finish(s.fill(n, Slot::Submitted(f.clone())));
    }

    use Part::{Data, Status};

    #[test]
    fn collectives_are_issued_in_ticket_order_status_word_first() {
        let s = shared();
        let log = Log::default();
        let (t0, t1, t2) = (place(&s), place(&s), place(&s));
        let (f0, f1, f2) = (
            fake(0, false, &log),
            fake(1, false, &log),
            fake(2, false, &log),
        );
        submit(&s, t2, &f2);
        submit(&s, t1, &f1);
        assert!(log.lock().unwrap().is_empty(), "issued before ticket 0");
        submit(&s, t0, &f0);
        let want = [
            (0, Status),
            (0, Data),
            (1, Status),
            (1, Data),
            (2, Status),
            (2, Data),
        ];
        assert_eq!(*log.lock().unwrap(), want);
        let st = s.lock();
        assert_eq!((st.next_issue, st.requests.len(), st.issued), (3, 6, 6));
        assert!(st.waiting.is_empty() && !st.held);
    }

    #[test]
    fn a_stand_in_holds_the_line_until_its_status_word_is_back() {
        let s = shared();
        let log = Log::default();
        let (t0, t1, t2) = (place(&s), place(&s), place(&s));
        let (f1, f2) = (fake(1, false, &log), fake(2, false, &log));
        let stand_in = fake(0, true, &log);
        submit(&s, t1, &f1);
        submit(&s, t0, &stand_in); // its op failed: a stand-in takes part
        assert_eq!(*log.lock().unwrap(), [(0, Status)]);
        submit(&s, t2, &f2);
        assert_eq!(log.lock().unwrap().len(), 1, "issued past a held line");
        // What the progress thread does when the status word comes back.
        let mut failed = Vec::new();
        let p: Arc<dyn InFlight> = stand_in.clone();
        s.status_back(&mut s.lock(), &p, true, &mut failed);
        assert!(failed.is_empty());
        let want = [
            (0, Status),
            (0, Data),
            (1, Status),
            (1, Data),
            (2, Status),
            (2, Data),
        ];
        assert_eq!(*log.lock().unwrap(), want);
        assert!(!s.lock().held);
    }

    #[test]
    fn after_closing_submissions_fail_without_being_issued() {
        let s = shared();
        let log = Log::default();
        let (t0, t1) = (place(&s), place(&s));
        let f1 = fake(1, false, &log);
        submit(&s, t1, &f1); // waits for ticket 0
        s.lock().closed = Some("closed");
        submit(&s, t0, &fake(0, true, &log));
        assert!(log.lock().unwrap().is_empty());
        let closed = Err("closed".to_string());
        assert_eq!(
            *f1.outcomes.lock().unwrap(),
            [(Status, closed.clone()), (Data, closed)]
        );
    }

    #[test]
    fn the_progress_thread_spins_then_yields_then_naps_longer_up_to_a_bound() {
        let mut b = Backoff::default();
        let pauses: Vec<Pause> = (0..SPIN_ROUNDS + YIELD_ROUNDS + 8)
            .map(|_| b.next())
            .collect();
        assert!(
            pauses[..SPIN_ROUNDS as usize]
                .iter()
                .all(|p| *p == Pause::Spin)
        );
        let yields = &pauses[SPIN_ROUNDS as usize..(SPIN_ROUNDS + YIELD_ROUNDS) as usize];
        assert!(yields.iter().all(|p| *p == Pause::Yield));
        let naps = &pauses[(SPIN_ROUNDS + YIELD_ROUNDS) as usize..];
        assert_eq!(naps[0], Pause::Nap(NAP_MIN));
        assert_eq!(naps[1], Pause::Nap(NAP_MIN * 2));
        assert_eq!(naps[7], Pause::Nap(NAP_MAX));
        b.reset();
        assert_eq!(b.next(), Pause::Spin);
    }
}
