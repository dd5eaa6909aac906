//! MPI collectives as a backend (the `mpi` feature): a duplicated MPI
//! communicator, the order its collectives are issued in, and one progress
//! thread that tests their requests and wakes whoever awaits them. It knows
//! no op: the engine's collective ops (`engine::collective`) take a
//! [`Ticket`] when pushed and [`submit`](Comm::submit) their buffer when
//! they run, then await the [`Completion`].
//!
//! **Design.** A collective is an async op body: it moves its buffer out of
//! its variable into a [`Pending`] (one allocation), submits it and awaits.
//! The buffer belongs to the `Pending` until MPI is done with it, so an op
//! dropped mid-flight (shutdown, a cancelled task) cannot free memory MPI is
//! still writing: the progress thread holds the `Pending` until its request
//! completes. This is the stream devices' shape (enqueue, then a poller
//! completes) without a launcher or fences: no stream orders collectives
//! other than MPI's own rule, below, and an async body already gives an op
//! that finishes when woken. One thread per communicator tests the
//! outstanding requests with `MPI_Testsome`; no thread blocks per
//! collective. It never sleeps while a request is outstanding: Open MPI's
//! non-blocking collectives progress only inside MPI calls, so it spins
//! (then yields) while anything is in flight, and waits on a condition
//! variable when nothing is.
//!
//! **Issue order.** MPI requires every rank to issue the collectives of a
//! communicator in the same order. Each collective takes a ticket when it
//! is pushed (push order, which is the program's order when one thread
//! pushes them, as it must); its submission is held until every earlier
//! ticket was issued (or voided: a ticket dropped unsubmitted, e.g. by an
//! op skipped on a poisoned input), so requests are issued in ticket order
//! whatever order the ops become ready in. Collectives still overlap each
//! other and computation: only the issue is ordered.
//!
//! **Threads.** Every MPI call of this module is made under the state lock
//! (issuing on the thread that submits, testing on the progress thread),
//! so MPI needs `MPI_THREAD_SERIALIZED` at least (`Comm::new` refuses
//! less); a program that also calls MPI itself on other threads while a
//! communicator is alive needs `MPI_THREAD_MULTIPLE`.
//!
//! **Errors.** The duplicated communicator has `MPI_ERRORS_RETURN`, so an
//! error code comes back instead of aborting the job: a refused issue, or a
//! request completing with an error, fails that collective with MPI's
//! message. What MPI leaves behind after an error is undefined by the
//! standard (Open MPI 4.1 gives no fault tolerance: the other ranks may
//! hang in the collective or abort). If `MPI_Testsome` itself fails, every
//! outstanding collective fails and its buffer is leaked (MPI may still
//! write to it).
//!
//! **Shutdown.** [`Comm::shutdown`] stops new issues (later submissions
//! fail), lets the progress thread complete what is in flight (which needs
//! the other ranks to take part), then frees the communicator; it waits
//! until a deadline and reports what was still outstanding. It must happen
//! before `MPI_Finalize` (rsmpi's `Universe` drop).

// `unsafe`: calls into the MPI library, and the buffer MPI writes while it
// sits in its `Pending`; each block says why it is sound.
#![allow(unsafe_code)]

use std::collections::VecDeque;
use std::ffi::{c_int, c_void};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use mpi::ffi;
use mpi::traits::{AsRaw, Equivalence};

use super::Threads;
use crate::loom::sync::{Condvar, Mutex, MutexGuard};

/// Rounds of `MPI_Testsome` without progress spent spinning before
/// yielding between rounds.
const SPIN_ROUNDS: u32 = 256;

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
    rank: usize,
    size: usize,
}

struct Shared {
    raw: ffi::MPI_Comm,
    /// `MPI_IN_PLACE` of this MPI library (a macro, absent from rsmpi).
    in_place: usize,
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
    /// Dropped unsubmitted: issues nothing.
    Void,
    Submitted(Arc<dyn InFlight>),
}

struct State {
    /// The ticket issued next; `waiting[i]` is ticket `next_issue + i`.
    next_issue: u64,
    waiting: VecDeque<Slot>,
    /// Outstanding requests and their collectives, index for index.
    requests: Vec<ffi::MPI_Request>,
    in_flight: Vec<Arc<dyn InFlight>>,
    /// Why nothing more is issued (shut down).
    closed: Option<&'static str>,
}

/// Held by an op between its push and its submission; dropping it
/// unsubmitted lets the collectives behind it be issued.
pub(crate) struct Ticket {
    shared: Arc<Shared>,
    n: u64,
    used: bool,
}

impl std::fmt::Debug for Ticket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ticket").field("n", &self.n).finish()
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if !self.used {
            let done = self.shared.fill(self.n, Slot::Void);
            finish(done);
        }
    }
}

/// A collective MPI works on: issued once, completed once.
trait InFlight: Send + Sync {
    /// Issues the collective; `Err`: MPI's error code.
    fn issue(&self, shared: &Shared) -> Result<ffi::MPI_Request, c_int>;
    /// MPI is done with the buffer (`leak`: it may not be).
    fn complete(&self, outcome: Result<(), String>, leak: bool);
}

/// A submitted buffer, owned here until MPI is done with it.
pub(crate) struct Pending<T> {
    what: Collective,
    /// The communicator's size (an all-gather's blocks).
    size: usize,
    slot: std::sync::Mutex<Outcome<T>>,
}

struct Outcome<T> {
    buf: Vec<T>,
    result: Option<Result<(), String>>,
    waker: Option<Waker>,
}

impl<T: Equivalence + Send + 'static> InFlight for Pending<T> {
    fn issue(&self, shared: &Shared) -> Result<ffi::MPI_Request, c_int> {
        let mut slot = self.slot.lock().unwrap_or_else(|p| p.into_inner());
        let len = slot.buf.len();
        let ptr = slot.buf.as_mut_ptr().cast::<c_void>();
        drop(slot);
        let count = c_int::try_from(len).map_err(|_| MPI_ERR_COUNT)?;
        let datatype = T::equivalent_datatype().as_raw();
        // SAFETY: rsmpi's null request, a plain value.
        let mut request = unsafe { ffi::RSMPI_REQUEST_NULL };
        // SAFETY: `ptr` is the heap block of `buf`, `len` elements of `T`
        // (the datatype MPI is told), which stays where it is and unread by
        // anyone until `complete` (the `Pending` is kept alive by the
        // progress thread until then, and its owner looks at `buf` only
        // once `result` is set). `raw` is a live communicator, called under
        // the state lock.
        let rc = unsafe {
            match self.what {
                Collective::AllReduce(op) => ffi::MPI_Iallreduce(
                    std::ptr::without_provenance(shared.in_place),
                    ptr,
                    count,
                    datatype,
                    op.raw(),
                    shared.raw,
                    &mut request,
                ),
                Collective::Broadcast { root } => {
                    ffi::MPI_Ibcast(ptr, count, datatype, root, shared.raw, &mut request)
                }
                Collective::AllGather => ffi::MPI_Iallgather(
                    std::ptr::without_provenance(shared.in_place),
                    0,
                    datatype,
                    ptr,
                    count / self.size.max(1) as c_int,
                    datatype,
                    shared.raw,
                    &mut request,
                ),
            }
        };
        if rc == ffi::MPI_SUCCESS as c_int {
            Ok(request)
        } else {
            Err(rc)
        }
    }

    fn complete(&self, outcome: Result<(), String>, leak: bool) {
        let mut slot = self.slot.lock().unwrap_or_else(|p| p.into_inner());
        if leak {
            std::mem::forget(std::mem::take(&mut slot.buf));
        }
        slot.result = Some(outcome);
        let waker = slot.waker.take();
        drop(slot);
        if let Some(w) = waker {
            w.wake();
        }
    }
}

/// `MPI_ERR_COUNT`, for a buffer longer than MPI's `int` counts.
const MPI_ERR_COUNT: c_int = ffi::MPI_ERR_COUNT as c_int;

/// Resolves to the buffer and the collective's outcome, once MPI is done.
pub(crate) struct Completion<T>(Arc<Pending<T>>);

impl<T> std::fmt::Debug for Completion<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Completion").finish_non_exhaustive()
    }
}

impl<T> Future for Completion<T> {
    type Output = (Vec<T>, Result<(), String>);

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut slot = self.0.slot.lock().unwrap_or_else(|p| p.into_inner());
        match slot.result.take() {
            Some(r) => Poll::Ready((std::mem::take(&mut slot.buf), r)),
            None => {
                slot.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

/// Wakes what completed outside the state lock (a waker may run its op
/// right here, and that op may submit).
fn finish(done: Vec<(Arc<dyn InFlight>, String)>) {
    for (p, message) in done {
        p.complete(Err(message), false);
    }
}

impl Shared {
    /// The state of communicator `raw`, nothing issued yet.
    fn new(raw: ffi::MPI_Comm, in_place: usize) -> Self {
        Self {
            raw,
            in_place,
            next_ticket: AtomicU64::new(0),
            state: Mutex::new(State {
                next_issue: 0,
                waiting: VecDeque::new(),
                requests: Vec::new(),
                in_flight: Vec::new(),
                closed: None,
            }),
            cv: Condvar::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock()
    }

    /// Puts `slot` at ticket `n` and issues what is now first in line;
    /// returns the collectives that failed to issue, to complete unlocked.
    fn fill(&self, n: u64, slot: Slot) -> Vec<(Arc<dyn InFlight>, String)> {
        let mut failed = Vec::new();
        let mut st = self.lock();
        let i = (n - st.next_issue) as usize;
        while st.waiting.len() <= i {
            st.waiting.push_back(Slot::Open);
        }
        st.waiting[i] = slot;
        let before = st.requests.len();
        while matches!(st.waiting.front(), Some(Slot::Void | Slot::Submitted(_))) {
            let Some(Slot::Submitted(p)) = st.waiting.pop_front() else {
                st.next_issue += 1;
                continue;
            };
            st.next_issue += 1;
            if let Some(why) = st.closed {
                failed.push((p, why.to_string()));
                continue;
            }
            match p.issue(self) {
                Ok(request) => {
                    st.requests.push(request);
                    st.in_flight.push(p);
                }
                Err(rc) => failed.push((p, error_string(rc))),
            }
        }
        let issued = st.requests.len() > before;
        drop(st);
        if issued {
            self.cv.notify_one();
        }
        failed
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
        let shared = Arc::new(Shared::new(raw, in_place));
        let thread = Arc::new(Threads::default());
        thread
            .spawn(format!("{name}-mpi"), {
                let shared = shared.clone();
                move || progress(&shared)
            })
            .map_err(|e| format!("cannot start the progress thread: {e}"))?;
        Ok(Self {
            shared,
            thread,
            rank: rank as usize,
            size: size as usize,
        })
    }

    pub(crate) fn rank(&self) -> usize {
        self.rank
    }

    pub(crate) fn size(&self) -> usize {
        self.size
    }

    /// The next place in the issue order (push order).
    pub(crate) fn ticket(&self) -> Ticket {
        Ticket {
            shared: self.shared.clone(),
            n: self.shared.next_ticket.fetch_add(1, Relaxed),
            used: false,
        }
    }

    /// Submits `buf` for `what` at `ticket`'s place: issued once every
    /// earlier ticket was; the completion resolves when MPI is done.
    pub(crate) fn submit<T: Equivalence + Send + 'static>(
        &self,
        mut ticket: Ticket,
        what: Collective,
        buf: Vec<T>,
    ) -> Completion<T> {
        let pending = Arc::new(Pending {
            what,
            size: self.size,
            slot: std::sync::Mutex::new(Outcome {
                buf,
                result: None,
                waker: None,
            }),
        });
        ticket.used = true;
        let done = self.shared.fill(ticket.n, Slot::Submitted(pending.clone()));
        finish(done);
        Completion(pending)
    }

    /// Stops issuing (what waits to be issued fails), lets the progress
    /// thread complete what is in flight and free the communicator, and
    /// waits for it until `deadline`. `Err`: how many collectives were
    /// still outstanding then (their buffers stay with the thread).
    pub(crate) fn shutdown(&self, deadline: Instant) -> Result<(), usize> {
        const CLOSED: &str = "the communicator was shut down before this collective was issued";
        let failed: Vec<_> = {
            let mut st = self.shared.lock();
            st.closed = Some(CLOSED);
            st.waiting
                .iter_mut()
                .filter_map(|s| match std::mem::replace(s, Slot::Void) {
                    Slot::Submitted(p) => Some((p, CLOSED.to_string())),
                    _ => None,
                })
                .collect()
        };
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
            .field("rank", &self.rank)
            .field("size", &self.size)
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

/// The progress thread: tests the outstanding requests, completes those
/// done, and frees the communicator once closed with nothing in flight.
fn progress(shared: &Shared) {
    let mut indices: Vec<c_int> = Vec::new();
    let mut statuses: Vec<ffi::MPI_Status> = Vec::new();
    // What completed this round: the collective, its outcome, whether its
    // buffer must be leaked.
    type Done = (Arc<dyn InFlight>, Result<(), String>, bool);
    let mut done: Vec<Done> = Vec::new();
    let mut hit: Vec<(usize, c_int)> = Vec::new();
    let mut idle = 0u32;
    loop {
        let mut st = shared.lock();
        while st.requests.is_empty() {
            if st.closed.is_some() {
                drop(st);
                free(shared.raw);
                return;
            }
            st = shared.cv.wait(st);
            idle = 0;
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
            // buffers from being freed.
            let message = format!("MPI_Testsome failed: {}", error_string(rc));
            st.requests.clear();
            done.extend(
                st.in_flight
                    .drain(..)
                    .map(|p| (p, Err(message.clone()), true)),
            );
        } else if outcount > 0 {
            // (MPI_UNDEFINED, negative, only when no request is active.)
            let k = outcount as usize;
            hit.extend((0..k).map(|j| (indices[j] as usize, statuses[j].MPI_ERROR)));
            // From the last index down, so that `swap_remove` keeps the
            // others' indices.
            hit.sort_unstable_by_key(|h| std::cmp::Reverse(h.0));
            for (i, err) in hit.drain(..) {
                st.requests.swap_remove(i);
                let p = st.in_flight.swap_remove(i);
                let outcome = if in_status && err != ffi::MPI_SUCCESS as c_int {
                    Err(error_string(err))
                } else {
                    Ok(())
                };
                done.push((p, outcome, false));
            }
        }
        drop(st);
        if done.is_empty() {
            idle = idle.saturating_add(1);
            if idle < SPIN_ROUNDS {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        } else {
            idle = 0;
            for (p, outcome, leak) in done.drain(..) {
                p.complete(outcome, leak);
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

    /// Records the order it is issued in; MPI is never called.
    struct Fake {
        id: u32,
        log: Arc<StdMutex<Vec<u32>>>,
        outcome: StdMutex<Option<Result<(), String>>>,
    }

    impl InFlight for Fake {
        fn issue(&self, _: &Shared) -> Result<ffi::MPI_Request, c_int> {
            self.log.lock().unwrap().push(self.id);
            // SAFETY: rsmpi's null request, a plain value.
            Ok(unsafe { ffi::RSMPI_REQUEST_NULL })
        }
        fn complete(&self, outcome: Result<(), String>, _: bool) {
            *self.outcome.lock().unwrap() = Some(outcome);
        }
    }

    fn shared() -> Arc<Shared> {
        // SAFETY: rsmpi's null communicator, a plain value (unused).
        Arc::new(Shared::new(unsafe { ffi::RSMPI_COMM_NULL }, 1))
    }

    fn ticket(shared: &Arc<Shared>) -> Ticket {
        Ticket {
            shared: shared.clone(),
            n: shared.next_ticket.fetch_add(1, Relaxed),
            used: false,
        }
    }

    fn fake(id: u32, log: &Arc<StdMutex<Vec<u32>>>) -> Arc<Fake> {
        Arc::new(Fake {
            id,
            log: log.clone(),
            outcome: StdMutex::new(None),
        })
    }

    fn submit(t: Ticket, f: &Arc<Fake>) {
        let mut t = t;
        t.used = true;
        finish(t.shared.fill(t.n, Slot::Submitted(f.clone())));
    }

    #[test]
    fn collectives_are_issued_in_ticket_order_and_dropped_tickets_give_way() {
        let s = shared();
        let log = Arc::new(StdMutex::new(Vec::new()));
        let (t0, t1, t2, t3) = (ticket(&s), ticket(&s), ticket(&s), ticket(&s));
        let (f1, f2, f3) = (fake(1, &log), fake(2, &log), fake(3, &log));
        submit(t3, &f3);
        submit(t1, &f1);
        assert!(log.lock().unwrap().is_empty(), "issued before ticket 0");
        drop(t0); // skipped: gives its place up
        assert_eq!(*log.lock().unwrap(), [1]);
        submit(t2, &f2);
        assert_eq!(*log.lock().unwrap(), [1, 2, 3]);
        let st = s.lock();
        assert_eq!((st.next_issue, st.requests.len()), (4, 3));
        assert!(st.waiting.is_empty());
    }

    #[test]
    fn after_closing_submissions_fail_without_being_issued() {
        let s = shared();
        let log = Arc::new(StdMutex::new(Vec::new()));
        let (t0, t1) = (ticket(&s), ticket(&s));
        let f1 = fake(1, &log);
        submit(t1, &f1); // waits for ticket 0
        s.lock().closed = Some("closed");
        drop(t0);
        assert!(log.lock().unwrap().is_empty());
        assert_eq!(*f1.outcome.lock().unwrap(), Some(Err("closed".to_string())));
    }
}
