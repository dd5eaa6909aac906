//! The engine's own all-reduce for large buffers: a ring of point-to-point
//! calls (reduce-scatter, then all-gather), stepped by the progress thread.
//!
//! **Why.** Open MPI's non-blocking `MPI_Iallreduce` picks, by default, an
//! algorithm for 2 ranks that takes about twice its blocking
//! `MPI_Allreduce` from 64 KiB up (`benches/mpi_allreduce.rs`); its ring
//! (`--mca coll_libnbc_iallreduce_algorithm 1`) does not, but that choice
//! is the user's, made before `MPI_Init`. From [`RING_FROM`] bytes an
//! all-reduce is this ring instead, whatever MPI was started with.
//!
//! **The ring.** The buffer of `len` elements is cut into `size` chunks,
//! chunk `c` from `c * len / size` up to `(c + 1) * len / size`.
//! Reduce-scatter, step `s` in
//! `0..size-1`: rank `r` sends chunk `(r - s) mod size` to rank `r + 1` and
//! receives chunk `(r - s - 1) mod size` from rank `r - 1` into a scratch
//! chunk, which `MPI_Reduce_local` then folds into its own. After it, rank
//! `r` holds the whole reduction of chunk `(r + 1) mod size`. All-gather,
//! step `s`: rank `r` sends chunk `(r + 1 - s) mod size` and receives chunk
//! `(r - s) mod size` in place. Each rank sends and receives `2 (size - 1)
//! / size` of the buffer; every rank ends with the same bits (each chunk
//! is reduced once, by its last rank, then copied).
//!
//! **Stepping.** A step is two requests (receive, then send). The progress
//! thread hands each completion to [`Ring::advance`] under the state lock;
//! once both of a step's requests are done it folds the received chunk (a
//! reduce-scatter step) and posts the next step. Every rank decides alike
//! (same length, same rank count) whether a collective is a ring, and
//! issues its collectives in the same order, so a ring's messages carry a
//! tag of its own (its data call's number in the issue order) and never
//! match another collective's.
//!
//! The fold is an MPI call, so it runs under the state lock like every
//! other (`MPI_THREAD_SERIALIZED`): a collective submitted meanwhile waits
//! for it (a 64 MiB all-reduce on 2 ranks folds 32 MiB, a few ms).
//!
//! Owns the ring's scratch chunk and step; the buffer is its collective's
//! (`calls.rs`), lent by pointer until the ring is done.

// `unsafe`: point-to-point calls and a local reduction on the buffer MPI
// is lent; each block says why it is sound.
#![allow(unsafe_code)]

use std::ffi::{c_int, c_void};

use mpi::ffi;

use super::calls::Requests;
use super::order::Shared;

/// From this many bytes an all-reduce on 2 or more ranks is a [`Ring`].
/// Below it MPI's own algorithms (a few messages, no step through the
/// progress thread) are faster.
pub(super) const RING_FROM: usize = 64 << 10;

/// Tags a ring may use: `0..TAGS` (MPI guarantees at least 32767).
const TAGS: u64 = 1 << 15;

/// The tag of the ring whose data call is the `n`th issued.
pub(super) fn tag(n: u64) -> c_int {
    (n % TAGS) as c_int
}

/// One ring all-reduce in flight.
pub(super) struct Ring {
    /// The buffer: `len` elements of `elem` bytes, MPI's until done.
    buf: *mut u8,
    len: usize,
    elem: usize,
    datatype: ffi::MPI_Datatype,
    op: ffi::MPI_Op,
    rank: usize,
    size: usize,
    tag: c_int,
    /// Room (its capacity: MPI writes it, nothing reads it as a `Vec`) for
    /// the chunk received in a reduce-scatter step, in `u64`s (aligned for
    /// every basic type). The communicator's, lent for the ring: a fresh
    /// one, zeroed, cost some 10% of a 1 MiB all-reduce.
    scratch: Vec<u64>,
    /// The step whose requests are in flight: `0..size-1` reduce-scatter,
    /// then all-gather.
    step: usize,
    /// Requests of the step not done yet.
    left: u8,
    /// The first error of a request of the ring.
    error: Option<String>,
}

// SAFETY: `buf` is the heap block of a buffer its collective keeps, unread
// by anyone else, until the ring is done; the ring itself is touched only
// under the state lock (issue, then the progress thread).
unsafe impl Send for Ring {}

/// What a completed request means for its ring.
#[must_use]
pub(super) enum Step {
    /// The step's other request is still in flight.
    Waiting,
    /// The next step is posted: its requests.
    Posted(Requests),
    /// The ring is done (or failed). `leak`: a request was left posted
    /// (a step half issued), so MPI may still write the buffers.
    Done {
        outcome: Result<(), String>,
        leak: bool,
    },
}

impl Ring {
    /// A ring over `len` elements of `elem` bytes at `buf` on `shared`'s
    /// communicator (2 ranks or more).
    ///
    /// # Safety
    ///
    /// `buf` must hold `len` elements and stay valid and untouched by
    /// anyone else until the ring is done (or leaked).
    pub(super) unsafe fn new(
        shared: &Shared,
        buf: *mut c_void,
        len: usize,
        elem: usize,
        (datatype, op): (ffi::MPI_Datatype, ffi::MPI_Op),
        tag: c_int,
    ) -> Self {
        let (rank, size) = (shared.rank, shared.size);
        let mut scratch = std::mem::take(&mut *shared.scratch.lock());
        scratch.reserve((len.div_ceil(size) * elem).div_ceil(8));
        Self {
            buf: buf.cast(),
            len,
            elem,
            datatype,
            op,
            rank,
            size,
            tag,
            scratch,
            step: 0,
            left: 0,
            error: None,
        }
    }

    /// One of the current step's requests completed with `outcome`.
    pub(super) fn advance(&mut self, shared: &Shared, outcome: Result<(), String>) -> Step {
        if let Err(e) = outcome {
            self.error.get_or_insert(e);
        }
        self.left -= 1;
        if self.left > 0 {
            return Step::Waiting;
        }
        if let Some(e) = self.error.take() {
            return self.done(shared, Err(e));
        }
        if self.step < self.size - 1 {
            let c = self.chunk(self.rank + self.size - 1 + self.size - self.step);
            // SAFETY: the step's requests are done, so MPI no longer
            // writes `scratch` or reads the buffer; `scratch` holds the
            // chunk `c` received, as many elements as the chunk.
            let rc = unsafe { self.fold(c) };
            if rc != ffi::MPI_SUCCESS as c_int {
                return self.done(shared, Err(super::library::error_string(rc)));
            }
        }
        self.step += 1;
        if self.step == 2 * (self.size - 1) {
            return self.done(shared, Ok(()));
        }
        match self.post(shared) {
            Ok(requests) => Step::Posted(requests),
            Err((rc, leak)) => Step::Done {
                outcome: Err(super::library::error_string(rc)),
                leak,
            },
        }
    }

    /// The ring is over, nothing of it in flight: its scratch goes back to
    /// the communicator.
    fn done(&mut self, shared: &Shared, outcome: Result<(), String>) -> Step {
        let mut kept = shared.scratch.lock();
        if self.scratch.capacity() > kept.capacity() {
            *kept = std::mem::take(&mut self.scratch);
        }
        Step::Done {
            outcome,
            leak: false,
        }
    }

    /// Chunk `c mod size`'s elements.
    fn chunk(&self, c: usize) -> std::ops::Range<usize> {
        let (c, n) = (c % self.size, self.size);
        c * self.len / n..(c + 1) * self.len / n
    }

    /// Posts the current step's receive, then its send (the first step,
    /// when the ring is issued; the next ones from [`advance`](Self::advance)).
    /// `Err`: MPI's code, and whether the receive was left posted (MPI may
    /// then still write the buffer or the scratch: the ring must be leaked).
    pub(super) fn post(&mut self, shared: &Shared) -> Result<Requests, (c_int, bool)> {
        let (r, n, s) = (self.rank, self.size, self.step);
        let (send, recv, into_scratch) = if s < n - 1 {
            (self.chunk(r + n - s), self.chunk(r + 2 * n - s - 1), true)
        } else {
            let s = s - (n - 1);
            (self.chunk(r + 1 + n - s), self.chunk(r + n - s), false)
        };
        let (right, left) = ((r + 1) % n, (r + n - 1) % n);
        let at = |range: &std::ops::Range<usize>| {
            // SAFETY: `range` lies within the buffer's `len` elements.
            unsafe { self.buf.add(range.start * self.elem) }.cast::<c_void>()
        };
        let into = if into_scratch {
            self.scratch.as_mut_ptr().cast::<c_void>()
        } else {
            at(&recv)
        };
        let from = at(&send);
        let mut requests = Requests::default();
        // SAFETY: `into` has room for `recv.len()` elements (the scratch's
        // capacity is the longest chunk's; a chunk of the buffer lies in
        // it), `from` holds `send.len()`; both stay valid and are touched
        // by no one else until the requests complete (the ring's owner
        // keeps them, and the scratch is not resized while lent);
        // `raw` is live, called under the state lock. The chunks sent and
        // received in one step differ, and no step reads what the step
        // before it still writes (the steps go one after the other).
        let rc = unsafe {
            ffi::MPI_Irecv(
                into,
                recv.len() as c_int,
                self.datatype,
                left as c_int,
                self.tag,
                shared.raw,
                requests.slot(),
            )
        };
        if rc != ffi::MPI_SUCCESS as c_int {
            return Err((rc, false));
        }
        // SAFETY: as above.
        let rc = unsafe {
            ffi::MPI_Isend(
                from,
                send.len() as c_int,
                self.datatype,
                right as c_int,
                self.tag,
                shared.raw,
                requests.slot(),
            )
        };
        if rc != ffi::MPI_SUCCESS as c_int {
            return Err((rc, true));
        }
        self.left = 2;
        Ok(requests)
    }

    /// Folds the scratch chunk into chunk `c` of the buffer (the reduction
    /// is `scratch op buf`, the order `MPI_Reduce_local` defines).
    ///
    /// # Safety
    ///
    /// No request of the ring may be in flight.
    unsafe fn fold(&mut self, c: std::ops::Range<usize>) -> c_int {
        // SAFETY: the caller's promise; `scratch` and the buffer's chunk
        // hold `c.len()` elements each.
        unsafe {
            ffi::MPI_Reduce_local(
                self.scratch.as_ptr().cast::<c_void>(),
                self.buf.add(c.start * self.elem).cast::<c_void>(),
                c.len() as c_int,
                self.datatype,
                self.op,
            )
        }
    }
}
