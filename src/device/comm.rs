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
//! **Files.** One idea each:
//! - here: the communicator ([`Comm`]: its duplication, tickets,
//!   submission, shutdown) and what a collective is ([`ReduceOp`],
//!   [`Collective`]);
//! - `order.rs`: the issue order (tickets, the line of submissions, a
//!   failed rank's stand-in holding it, the limit on data in flight) and
//!   the state every call is made under;
//! - `progress.rs`: the progress thread and its back-off;
//! - `calls.rs`: what one collective hands MPI (its status word, its data
//!   call, a stand-in's zeroed buffer);
//! - `ring.rs`: the data call of a large all-reduce, the engine's own ring
//!   of point-to-point calls;
//! - `library.rs`: what is asked of the MPI library itself (error
//!   messages, `MPI_IN_PLACE`).
//!
//! **Progress, issue order, a failure on one rank.** The progress thread
//! tests the requests in flight, backing off while nothing completes
//! (`progress.rs`). MPI requires every rank to issue a communicator's
//! collectives in the same order: each collective's ticket, taken at push,
//! fixes its place, and a ticket dropped unsubmitted (this rank failed)
//! still takes its place with a stand-in, so that every rank learns of the
//! failure instead of waiting forever (`order.rs`), and the failed rank's
//! own message, broadcast on a second duplicate of the communicator, in an
//! issue order of its own (`calls.rs`, `order.rs`).
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
//! **Shutdown.** [`Comm::shutdown`] issues what only the limit on data in
//! flight held back, stops new issues (later submissions fail), lets the
//! progress thread complete what is in flight (which needs the other ranks to
//! take part), then frees the communicator; it waits until a deadline and
//! reports what was still outstanding. It must happen before `MPI_Finalize`
//! (rsmpi's `Universe` drop).

// `unsafe`: calls into the MPI library; each block says why it is sound.
#![allow(unsafe_code)]

mod calls;
mod library;
mod order;
mod progress;
mod ring;

use std::ffi::c_int;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use mpi::ffi;
use mpi::traits::Equivalence;

pub(crate) use self::calls::{Completion, Reason, Spec};
use self::calls::{Part, Pending};
use self::library::{check, in_place};
pub(crate) use self::order::Ticket;
use self::order::{Failed, Shared, Slot, finish};
use self::progress::progress;
use super::Threads;

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
        let (mut raw, mut messages) = unsafe { (ffi::RSMPI_COMM_NULL, ffi::RSMPI_COMM_NULL) };
        let (mut size, mut rank) = (0, 0);
        // SAFETY: `comm` is a live communicator (the caller's); `raw`,
        // `messages`, `size` and `rank` are written by MPI.
        unsafe {
            check(ffi::MPI_Comm_dup(comm, &mut raw))?;
            check(ffi::MPI_Comm_set_errhandler(raw, ffi::RSMPI_ERRORS_RETURN))?;
            check(ffi::MPI_Comm_dup(comm, &mut messages))?;
            check(ffi::MPI_Comm_set_errhandler(
                messages,
                ffi::RSMPI_ERRORS_RETURN,
            ))?;
            check(ffi::MPI_Comm_size(raw, &mut size))?;
            check(ffi::MPI_Comm_rank(raw, &mut rank))?;
        }
        let shared = Arc::new(Shared::new(
            (raw, messages),
            in_place,
            rank as usize,
            size as usize,
        ));
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
    /// `what` on elements of `T`, tagged `tag` (every rank must tag the
    /// collective it pairs with alike: `calls.rs`).
    pub(crate) fn ticket<T: Equivalence>(&self, what: Collective, tag: u64) -> Ticket {
        Ticket {
            shared: self.shared.clone(),
            n: self.shared.next_ticket.fetch_add(1, Relaxed),
            tag,
            spec: Spec::of::<T>(what),
            reason: Reason::Skipped,
            why: None,
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
        let place = (ticket.n, ticket.tag);
        let pending = Arc::new(Pending::new(ticket.spec.what, place, self.size(), buf));
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
            // What only the limit on data in flight held back goes out: the
            // other ranks may have issued it.
            self.shared.issue_all_ready(&mut st, &mut failed);
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

impl Comm {
    /// Aborts the job: `MPI_Abort` on `MPI_COMM_WORLD` (valid whatever
    /// became of the duplicate), which takes every process of the job down
    /// (Open MPI's `mpirun` kills the others). Not
    /// under the issue lock: the thread aborting may be the one a lock
    /// holder waits for, and an abort is the end of every call in flight
    /// (MPI's own `MPI_ERRORS_ARE_FATAL` handler aborts from inside any
    /// call). Does not return.
    pub(crate) fn abort(&self, code: i32) -> ! {
        // SAFETY: rsmpi's world communicator, valid from MPI_Init on (a
        // `Comm` exists only while MPI is initialised); MPI_Abort may be
        // called at any time then.
        unsafe { ffi::MPI_Abort(ffi::RSMPI_COMM_WORLD, code) };
        // MPI_Abort does not return on Open MPI; if a library's did:
        std::process::abort()
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
