//! What one collective hands MPI: its *status word* and its data, two
//! non-blocking calls issued back to back in the communicator's issue
//! order (and, when a rank failed, that rank's message), and what
//! completes them.
//!
//! **The status word.** Every collective is two MPI calls on every rank:
//! first an `MPI_Iallreduce` (`MPI_MAX`) of four `i64`s, `[failure, len,
//! tag, !tag]`, then the data call (`MPI_Iallreduce`, `MPI_Ibcast`,
//! `MPI_Iallgather`). A rank whose op runs ([`Pending`]) sends `[0, its
//! length, tag, !tag]` and issues its buffer at once. A rank whose op did
//! not run, or refused the collective before issuing it ([`StandIn`]),
//! sends `[failure, 0, tag, !tag]`, where `failure`
//! encodes its rank and why; it issues its data call only when the status
//! word has come back, with a zeroed buffer of the length the others sent
//! (the maximum), and nothing else is issued on that rank meanwhile (the
//! caller holds the issue order). So every rank issues the same calls in
//! the same order, whatever failed where, and every rank learns from the
//! status word that some rank failed: the collective fails on every rank,
//! naming the lowest failing rank and why.
//!
//! **The tag.** The collective's tag (its op's, the same on every rank
//! for the same collective: a group's step number, say) comes back as its
//! maximum and, through `!tag` (`!` reverses the order of `i64`s), its
//! minimum: if they differ, the ranks paired collectives of different
//! tags (some rank skipped or added one before), and the collective fails
//! on every rank with that said, its result unused, rather than computing
//! with another collective's data. (The data call was issued meanwhile:
//! collectives of the same shape pair harmlessly; MPI may refuse, or wait
//! in, calls of different shapes.)
//!
//! **The failed rank's message.** Once its status word is back saying that
//! rank `r` failed (the lowest failing rank), every rank issues one more
//! call, its *message* part: an `MPI_Ibcast` from `r` of
//! [`MESSAGE_BYTES`] bytes, `r`'s own failure in words (its stand-in's:
//! the poisoned input's failure, the body's error), cut at a character
//! boundary with an ellipsis. It goes on the communicator's second
//! duplicate, in ticket order (`order.rs` says when), so every rank's
//! collective fails with `r`'s message; a collective that nothing failed
//! makes no such call.
//!
//! **The data call** is MPI's non-blocking collective, except an
//! all-reduce of [`RING_FROM`] bytes or more on 2 ranks or more: that is
//! the engine's own ring of point-to-point calls (`ring.rs`), several
//! requests in turn, which the progress thread steps through
//! ([`InFlight::advance`]).
//!
//! Owns the buffers MPI writes while a call is in flight; the issue order
//! and the lock every call is made under are `order.rs`'s, the progress
//! thread `progress.rs`'s.

// `unsafe`: the MPI calls, and the status words and buffers MPI writes
// while their calls are in flight; each block says why it is sound.
#![allow(unsafe_code)]

use std::cell::UnsafeCell;
use std::ffi::{c_int, c_void};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use mpi::ffi;
use mpi::traits::{AsRaw, Equivalence};

use super::ring::{RING_FROM, Ring, Step};
use super::{Collective, Shared};

/// Which of a collective's calls a request is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Part {
    Status,
    Data,
    /// The failed rank's message, only when the status word says a rank
    /// failed.
    Message,
}

/// The size of a failed rank's message (its [`Part::Message`]): its
/// failure in UTF-8, cut to fit, the rest zeros.
pub(crate) const MESSAGE_BYTES: usize = 256;

/// `why` as a message buffer of [`MESSAGE_BYTES`]: cut at a character
/// boundary with an ellipsis if longer, padded with zeros.
fn encode_message(why: &str) -> Vec<u8> {
    const MORE: &str = "…";
    let mut buf = vec![0u8; MESSAGE_BYTES];
    if why.len() <= MESSAGE_BYTES {
        buf[..why.len()].copy_from_slice(why.as_bytes());
    } else {
        let mut end = MESSAGE_BYTES - MORE.len();
        while !why.is_char_boundary(end) {
            end -= 1;
        }
        buf[..end].copy_from_slice(&why.as_bytes()[..end]);
        buf[end..end + MORE.len()].copy_from_slice(MORE.as_bytes());
    }
    buf
}

/// The message in a buffer [`encode_message`] made (trailing zeros
/// dropped).
fn decode_message(buf: &[u8]) -> String {
    let end = buf.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// Why a rank did not take part with its own buffer (the low byte of the
/// status word's `failure`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reason {
    /// Its op did not run: a poisoned or deleted input, cancelled, a
    /// failed push (the ticket was dropped unsubmitted).
    Skipped = 1,
    /// Its op ran and refused the collective before issuing it (an
    /// all-gather's output of the wrong length).
    Refused = 2,
}

impl Reason {
    /// What the failed rank did (`code`: the status word's low byte).
    fn from_code(code: i64) -> &'static str {
        match code {
            1 => "its op did not run",
            2 => "its op refused the collective before issuing it",
            _ => "an unknown reason",
        }
    }

    /// Why, when the failed rank said nothing more.
    pub(super) fn detail(self) -> &'static str {
        match self {
            Reason::Skipped => "a poisoned or deleted input, cancelled, or not pushed",
            Reason::Refused => "e.g. an all-gather output of the wrong length",
        }
    }
}

/// The status word's `failure` for rank `rank` of `size` failing for
/// `reason`: the lowest failing rank has the largest, so `MPI_MAX` keeps
/// it.
fn failure_word(rank: usize, size: usize, reason: Reason) -> i64 {
    ((size - rank) as i64) << 8 | reason as i64
}

/// The failing rank a status word names (the root of the message part),
/// if it names one of the communicator's `size` ranks.
fn failed_root(word: i64, size: usize) -> Option<usize> {
    let rank = size as i64 - (word >> 8);
    (word > 0 && (0..size as i64).contains(&rank)).then_some(rank as usize)
}

/// The message for a status word whose tags differ across ranks (their
/// maximum `word[2]` and, as `!tag`, their minimum `word[3]`), or `None`.
fn mismatched(word: &[i64; 4]) -> Option<String> {
    let (hi, lo) = (word[2], !word[3]);
    (hi != lo).then(|| {
        let (a, b) = ((lo as u64).min(hi as u64), (lo as u64).max(hi as u64));
        format!(
            "the ranks are out of step: they paired collectives of different tags ({a} and {b} at \
             least): some rank skipped or added a collective before this one; the result is not used"
        )
    })
}

/// The status word a rank sends: `failure` (0: none), its length, and its
/// tag and `!tag` (so that `MPI_MAX` gives both the largest and the
/// smallest tag).
fn status_word(failure: i64, len: usize, tag: u64) -> [i64; 4] {
    let tag = tag as i64;
    [failure, len as i64, tag, !tag]
}

/// The message for a status word that says some rank failed, with that
/// rank's own words (`why`, empty if they did not come), or `None`.
fn failed_rank(word: i64, size: usize, why: &str) -> Option<String> {
    (word != 0).then(|| {
        let rank = size as i64 - (word >> 8);
        let what = Reason::from_code(word & 0xff);
        if why.is_empty() {
            format!("rank {rank} failed its part ({what}): the collective's result is not valid")
        } else {
            format!(
                "rank {rank} failed its part ({what}: {why}): the collective's result is not valid"
            )
        }
    })
}

/// The requests one issue starts: one, or a ring step's two.
pub(super) struct Requests {
    list: [ffi::MPI_Request; 2],
    len: usize,
}

impl Default for Requests {
    fn default() -> Self {
        // SAFETY: rsmpi's null request, a plain value.
        let null = unsafe { ffi::RSMPI_REQUEST_NULL };
        Self {
            list: [null; 2],
            len: 0,
        }
    }
}

impl Requests {
    /// Where the next call writes its request.
    ///
    /// # Panics
    ///
    /// Past two requests.
    pub(super) fn slot(&mut self) -> &mut ffi::MPI_Request {
        self.len += 1;
        &mut self.list[self.len - 1]
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = ffi::MPI_Request> + '_ {
        self.list[..self.len].iter().copied()
    }
}

/// A collective MPI works on: its two parts (three when its status word
/// says a rank failed: the message), each issued once and completed once.
/// The data part may be several requests, in turn.
pub(super) trait InFlight: Send + Sync {
    /// Issues `part` (`tag`: the data call's own tag, for a ring); `Err`:
    /// MPI's error code, nothing left in flight.
    fn issue(&self, shared: &Shared, part: Part, tag: c_int) -> Result<Requests, c_int>;
    /// One request of the data part completed with `outcome` (called
    /// under the state lock): whether the part waits for another, goes on
    /// with more requests, or is done.
    fn advance(&self, shared: &Shared, outcome: Result<(), String>) -> Step {
        let _ = shared;
        Step::Done {
            outcome,
            leak: false,
        }
    }
    /// MPI is done with `part` (`leak`: it may not be; its buffer is
    /// leaked).
    fn done(&self, part: Part, outcome: Result<(), String>, leak: bool);
    /// Whether the data call waits for the status word to come back (a
    /// stand-in: it learns its length from it), holding the issue order.
    fn data_after_status(&self) -> bool {
        false
    }
    /// The size of its data call on this rank, in bytes, for the issue
    /// order's limit on data in flight (`order.rs`): the same from before
    /// its issue until its data part is done. (A message part is not
    /// data: it does not count.)
    fn bytes(&self) -> usize;
    /// Its ticket: its place in the issue order.
    fn ticket(&self) -> u64;
    /// Once its status word is back without an error: the failing rank it
    /// names, whose message the [`Part::Message`] then broadcasts; `None`
    /// if nothing failed.
    fn failed_root(&self) -> Option<usize>;
}

/// The status word's datatype and the call every collective makes first.
///
/// # Safety
///
/// `word` must stay valid and untouched by anyone else until the request
/// completes; called under the state lock.
unsafe fn issue_status(shared: &Shared, word: *mut [i64; 4]) -> Result<Requests, c_int> {
    start(|request| {
        // SAFETY: `word` points to four i64s (the caller's promise),
        // MPI_INT64_T and MPI_MAX are predefined, `raw` is live and called
        // under the lock.
        unsafe {
            ffi::MPI_Iallreduce(
                std::ptr::without_provenance(shared.in_place),
                word.cast::<c_void>(),
                4,
                ffi::RSMPI_INT64_T,
                ffi::RSMPI_MAX,
                shared.raw,
                request,
            )
        }
    })
}

/// Broadcasts a failed rank's message, [`MESSAGE_BYTES`] at `buf`, from
/// rank `root` on the messages' communicator.
///
/// # Safety
///
/// `buf` must hold [`MESSAGE_BYTES`] bytes and stay valid and untouched
/// until the request completes; called under the state lock.
unsafe fn issue_message(shared: &Shared, root: usize, buf: *mut u8) -> Result<Requests, c_int> {
    start(|request| {
        // SAFETY: the caller's promise on `buf`; `messages` is live (freed
        // with `raw`), `root` one of its ranks (`failed_root`), called
        // under the lock.
        unsafe {
            ffi::MPI_Ibcast(
                buf.cast::<c_void>(),
                MESSAGE_BYTES as c_int,
                ffi::RSMPI_UINT8_T,
                root as c_int,
                shared.messages,
                request,
            )
        }
    })
}

/// Starts a non-blocking call: `call` makes it, writing its request, and
/// returns MPI's code. `Err`: the code, when not `MPI_SUCCESS`.
fn start(call: impl FnOnce(&mut ffi::MPI_Request) -> c_int) -> Result<Requests, c_int> {
    let mut requests = Requests::default();
    match call(requests.slot()) {
        rc if rc == ffi::MPI_SUCCESS as c_int => Ok(requests),
        rc => Err(rc),
    }
}

/// A data call's buffer: `len` elements of `elem` bytes of `datatype` at
/// `ptr`.
struct Buffer {
    ptr: *mut c_void,
    len: usize,
    elem: usize,
    datatype: ffi::MPI_Datatype,
}

/// Issues `what` on `buf`: a [`Ring`] (kept in `ring`) for a large
/// all-reduce on several ranks, else MPI's non-blocking collective.
///
/// # Safety
///
/// `buf.ptr` must hold `buf.len` elements of `buf.datatype` and stay valid
/// and untouched until the data part is done; called under the state lock.
unsafe fn issue_data(
    shared: &Shared,
    what: Collective,
    buf: Buffer,
    tag: c_int,
    ring: &Mutex<Option<Ring>>,
) -> Result<Requests, c_int> {
    let Buffer {
        ptr,
        len,
        elem,
        datatype,
    } = buf;
    let size = shared.size;
    let count = c_int::try_from(len).map_err(|_| MPI_ERR_COUNT)?;
    // An empty `Vec`'s pointer is dangling at its alignment: 1 for bytes,
    // which is Open MPI's `MPI_IN_PLACE`, refused as a receive buffer
    // (MPI_ERR_BUFFER, through a handler that aborts the job). MPI reads
    // and writes nothing of a count of 0: any other address does.
    let ptr = if len == 0 { empty_buffer() } else { ptr };
    if let Collective::AllReduce(op) = what
        && size > 1
        && len * elem >= RING_FROM
    {
        // SAFETY: the caller's promise on `ptr`, for as long as the ring
        // runs (the data part is done only when the ring is).
        let mut r = unsafe { Ring::new(shared, ptr, len, elem, (datatype, op.raw()), tag) };
        return match r.post(shared) {
            Ok(requests) => {
                *ring.lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
                Ok(requests)
            }
            Err((rc, posted)) => {
                if posted {
                    // MPI may still write its scratch.
                    std::mem::forget(r);
                }
                Err(rc)
            }
        };
    }
    start(|request| {
        // SAFETY: the caller's promise on `ptr`; `raw` is a live
        // communicator, called under the state lock.
        unsafe {
            match what {
                Collective::AllReduce(op) => ffi::MPI_Iallreduce(
                    std::ptr::without_provenance(shared.in_place),
                    ptr,
                    count,
                    datatype,
                    op.raw(),
                    shared.raw,
                    request,
                ),
                Collective::Broadcast { root } => {
                    ffi::MPI_Ibcast(ptr, count, datatype, root, shared.raw, request)
                }
                Collective::AllGather => ffi::MPI_Iallgather(
                    std::ptr::without_provenance(shared.in_place),
                    0,
                    datatype,
                    ptr,
                    count / size.max(1) as c_int,
                    datatype,
                    shared.raw,
                    request,
                ),
            }
        }
    })
}

/// The address an empty data call hands MPI: a real one, never
/// `MPI_IN_PLACE` (which an empty `Vec<u8>`'s dangling pointer equals
/// under Open MPI). MPI touches no byte of it (the count is 0).
fn empty_buffer() -> *mut c_void {
    static EMPTY: AtomicU64 = AtomicU64::new(0);
    EMPTY.as_ptr().cast::<c_void>()
}

/// `MPI_ERR_COUNT`, for a buffer longer than MPI's `int` counts.
const MPI_ERR_COUNT: c_int = ffi::MPI_ERR_COUNT as c_int;

/// A submitted buffer, owned here until MPI is done with it, and its
/// status word.
pub(crate) struct Pending<T> {
    what: Collective,
    /// Its ticket.
    n: u64,
    /// The communicator's size (an all-gather's blocks, the status word).
    size: usize,
    /// Its tag (the status word's: see the module docs).
    tag: u64,
    /// `[0, len, tag, !tag]` when issued; the maximum over the ranks once
    /// the status call completes. Written by MPI between the status call's issue and
    /// its completion, read only after (in `done`, on the progress thread).
    word: UnsafeCell<[i64; 4]>,
    /// The buffer's size in bytes, for the limit on data in flight: taken
    /// when made (the buffer keeps its length until the data call is done),
    /// so that the issue order reads it without the lock.
    bytes: usize,
    slot: Mutex<Outcome<T>>,
    /// The data call's ring, if it is one (set at its issue).
    ring: Mutex<Option<Ring>>,
    /// The failed rank's message, received by its message part (allocated
    /// only when some rank failed).
    message: Mutex<Vec<u8>>,
}

// SAFETY: `word` is written by this rank's issue (under the state lock),
// then by MPI, and read by the progress thread once the request completed:
// never two at once. The rest is behind the mutexes.
unsafe impl<T: Send> Sync for Pending<T> {}

struct Outcome<T> {
    buf: Vec<T>,
    /// Parts not done yet: the status word and the data, and the message
    /// once the status word says some rank failed.
    left: u8,
    /// The first part's failure.
    error: Option<String>,
    result: Option<Result<(), String>>,
    waker: Option<Waker>,
}

impl<T> Pending<T> {
    pub(super) fn new(what: Collective, (n, tag): (u64, u64), size: usize, buf: Vec<T>) -> Self {
        Self {
            what,
            n,
            size,
            tag,
            word: UnsafeCell::new([0; 4]),
            bytes: std::mem::size_of_val(buf.as_slice()),
            slot: Mutex::new(Outcome {
                buf,
                left: 2,
                error: None,
                result: None,
                waker: None,
            }),
            ring: Mutex::new(None),
            message: Mutex::new(Vec::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Outcome<T>> {
        self.slot.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// [`InFlight::advance`] for a data call that may be a ring.
fn advance(ring: &Mutex<Option<Ring>>, shared: &Shared, outcome: Result<(), String>) -> Step {
    match ring.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
        Some(ring) => ring.advance(shared, outcome),
        None => Step::Done {
            outcome,
            leak: false,
        },
    }
}

/// A data call MPI may still write after its part is done (`leak`): its
/// ring's scratch chunk is leaked with its buffer.
fn leak_ring(ring: &Mutex<Option<Ring>>) {
    std::mem::forget(ring.lock().unwrap_or_else(|p| p.into_inner()).take());
}

/// Issues a message part into `message`, which holds `fill` (the root's
/// own message) or zeros, from the rank `word` names.
///
/// # Safety
///
/// `word`'s status call has completed (MPI no longer writes it); called
/// under the state lock.
unsafe fn issue_message_into(
    shared: &Shared,
    word: *const [i64; 4],
    message: &Mutex<Vec<u8>>,
    fill: impl FnOnce(usize) -> Vec<u8>,
) -> Result<Requests, c_int> {
    // SAFETY: the caller's promise.
    let root = failed_root(unsafe { (*word)[0] }, shared.size).ok_or(MPI_ERR_ROOT)?;
    let mut buf = message.lock().unwrap_or_else(|p| p.into_inner());
    *buf = fill(root);
    buf.resize(MESSAGE_BYTES, 0);
    let ptr = buf.as_mut_ptr();
    drop(buf);
    // SAFETY: `buf` holds MESSAGE_BYTES bytes and stays in its owner,
    // untouched, until the message part is done (the progress thread keeps
    // the owner).
    unsafe { issue_message(shared, root, ptr) }
}

/// `MPI_ERR_ROOT`, for a status word that names no rank.
const MPI_ERR_ROOT: c_int = ffi::MPI_ERR_ROOT as c_int;

impl<T: Equivalence + Send + 'static> InFlight for Pending<T> {
    fn issue(&self, shared: &Shared, part: Part, tag: c_int) -> Result<Requests, c_int> {
        let mut slot = self.lock();
        let len = slot.buf.len();
        let ptr = slot.buf.as_mut_ptr().cast::<c_void>();
        drop(slot);
        match part {
            Part::Status => {
                let word = self.word.get();
                // SAFETY: no call on `word` is in flight yet (the status is
                // issued first, once); then it is MPI's until the request
                // completes (see the field).
                unsafe {
                    *word = status_word(0, len, self.tag);
                    issue_status(shared, word)
                }
            }
            // SAFETY: `ptr` is the heap block of `buf`, `len` elements of
            // `T` (the datatype MPI is told), which stays where it is and
            // unread by anyone until its part is done (the `Pending` is
            // kept alive by the progress thread until then, and its owner
            // looks at `buf` only once `result` is set).
            Part::Data => unsafe {
                let buf = Buffer {
                    ptr,
                    len,
                    elem: std::mem::size_of::<T>(),
                    datatype: T::equivalent_datatype().as_raw(),
                };
                issue_data(shared, self.what, buf, tag, &self.ring)
            },
            // SAFETY: the message part is issued once the status call
            // completed; `message` is this collective's own.
            Part::Message => unsafe {
                issue_message_into(shared, self.word.get(), &self.message, |_| {
                    vec![0; MESSAGE_BYTES]
                })
            },
        }
    }

    fn advance(&self, shared: &Shared, outcome: Result<(), String>) -> Step {
        advance(&self.ring, shared, outcome)
    }

    fn done(&self, part: Part, outcome: Result<(), String>, leak: bool) {
        let mut slot = self.lock();
        if leak && part == Part::Data {
            std::mem::forget(std::mem::take(&mut slot.buf));
            leak_ring(&self.ring);
        }
        if leak && part == Part::Message {
            let mut message = self.message.lock().unwrap_or_else(|p| p.into_inner());
            std::mem::forget(std::mem::take(&mut *message));
        }
        if part == Part::Status && outcome.is_ok() && self.failed_root().is_some() {
            // The progress thread issues (or fails) the message part: the
            // collective waits for it too.
            slot.left += 1;
        }
        match outcome {
            // A lost message leaves the failure without its words (below).
            Err(_) if part == Part::Message => {}
            Err(e) => {
                slot.error.get_or_insert(e);
            }
            Ok(()) => {}
        }
        slot.left -= 1;
        if slot.left > 0 {
            return;
        }
        let result = match slot.error.take() {
            Some(e) => Err(e),
            None => {
                let why = decode_message(&self.message.lock().unwrap_or_else(|p| p.into_inner()));
                // SAFETY: every part is done: MPI no longer writes `word`.
                let word = unsafe { &*self.word.get() };
                match mismatched(word).or_else(|| failed_rank(word[0], self.size, &why)) {
                    Some(e) => Err(e),
                    None => Ok(()),
                }
            }
        };
        slot.result = Some(result);
        let waker = slot.waker.take();
        drop(slot);
        if let Some(w) = waker {
            w.wake();
        }
    }

    fn bytes(&self) -> usize {
        self.bytes
    }

    fn ticket(&self) -> u64 {
        self.n
    }

    fn failed_root(&self) -> Option<usize> {
        // SAFETY: called once the status call completed (the trait's
        // promise): MPI no longer writes `word`.
        failed_root(unsafe { (*self.word.get())[0] }, self.size)
    }
}

/// What a rank issues in place of a collective it has no buffer for: the
/// status word saying it failed, then (once that came back) a zeroed
/// buffer of the others' length. Made only on failure.
pub(super) struct StandIn {
    what: Collective,
    /// Its ticket.
    n: u64,
    /// This rank, and the communicator's size.
    rank: usize,
    size: usize,
    /// Why this rank failed, in words: the message it broadcasts if it is
    /// the lowest failing rank.
    why: String,
    datatype: fn() -> ffi::MPI_Datatype,
    /// `size_of` the element type.
    elem: usize,
    /// `[failure, 0, tag, !tag]` when issued; the maximum over the ranks
    /// once the status call completes (as [`Pending`]'s).
    word: UnsafeCell<[i64; 4]>,
    /// The zeroed buffer of the data call (in `u64`s: aligned for every
    /// basic type), allocated when it is issued.
    buf: Mutex<Vec<u64>>,
    /// The data call's ring, if it is one (as [`Pending`]'s).
    ring: Mutex<Option<Ring>>,
    /// The message part's buffer: its own message if it is the failing
    /// rank the status word names, else zeros that the root's overwrite.
    message: Mutex<Vec<u8>>,
}

// SAFETY: as `Pending`'s `word`: written at issue, by MPI, then read by
// the progress thread (which issues the data call) once the status call
// completed; `buf` is behind its mutex.
unsafe impl Sync for StandIn {}

/// What a stand-in needs to know of the collective it stands in for,
/// carried by its ticket (no allocation until it is needed).
#[derive(Clone, Copy)]
pub(crate) struct Spec {
    pub(super) what: Collective,
    pub(super) datatype: fn() -> ffi::MPI_Datatype,
    pub(super) elem: usize,
}

impl std::fmt::Debug for Spec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Spec").field("what", &self.what).finish()
    }
}

impl Spec {
    /// The spec of collective `what` on elements of `T`.
    pub(crate) fn of<T: Equivalence>(what: Collective) -> Self {
        Self {
            what,
            datatype: || T::equivalent_datatype().as_raw(),
            elem: std::mem::size_of::<T>(),
        }
    }

    /// The stand-in for ticket `n` (tagged `tag`) of rank `rank` of
    /// `size`, failing for `reason`, `why` in words.
    pub(super) fn stand_in(
        &self,
        (n, tag): (u64, u64),
        (rank, size): (usize, usize),
        reason: Reason,
        why: String,
    ) -> StandIn {
        StandIn {
            what: self.what,
            n,
            rank,
            size,
            why,
            datatype: self.datatype,
            elem: self.elem,
            word: UnsafeCell::new(status_word(failure_word(rank, size, reason), 0, tag)),
            buf: Mutex::new(Vec::new()),
            ring: Mutex::new(None),
            message: Mutex::new(Vec::new()),
        }
    }
}

impl InFlight for StandIn {
    fn issue(&self, shared: &Shared, part: Part, tag: c_int) -> Result<Requests, c_int> {
        match part {
            // SAFETY: issued once; `word` is MPI's until it completes.
            Part::Status => unsafe { issue_status(shared, self.word.get()) },
            Part::Data => {
                // SAFETY: the status call completed (the caller issues the
                // data call only then): MPI no longer writes `word`.
                let len = unsafe { (*self.word.get())[1] }.max(0) as usize;
                let mut buf = self.buf.lock().unwrap_or_else(|p| p.into_inner());
                *buf = vec![0u64; (len * self.elem).div_ceil(8)];
                let ptr = buf.as_mut_ptr().cast::<c_void>();
                drop(buf);
                // SAFETY: `buf` holds at least `len` elements of `elem`
                // bytes, aligned to 8; it stays in `self`, untouched, until
                // the data part is done (the progress thread keeps `self`).
                unsafe {
                    let buf = Buffer {
                        ptr,
                        len,
                        elem: self.elem,
                        datatype: (self.datatype)(),
                    };
                    issue_data(shared, self.what, buf, tag, &self.ring)
                }
            }
            // SAFETY: the message part is issued once the status call
            // completed; `message` is this stand-in's own.
            Part::Message => unsafe {
                issue_message_into(shared, self.word.get(), &self.message, |root| {
                    if root == self.rank {
                        encode_message(&self.why)
                    } else {
                        vec![0; MESSAGE_BYTES]
                    }
                })
            },
        }
    }

    fn advance(&self, shared: &Shared, outcome: Result<(), String>) -> Step {
        advance(&self.ring, shared, outcome)
    }

    fn done(&self, part: Part, _: Result<(), String>, leak: bool) {
        if leak && part == Part::Data {
            let mut buf = self.buf.lock().unwrap_or_else(|p| p.into_inner());
            std::mem::forget(std::mem::take(&mut *buf));
            leak_ring(&self.ring);
        }
        if leak && part == Part::Message {
            let mut message = self.message.lock().unwrap_or_else(|p| p.into_inner());
            std::mem::forget(std::mem::take(&mut *message));
        }
    }

    fn data_after_status(&self) -> bool {
        true
    }

    /// 0: its length comes with its status word, and it holds the line
    /// until then anyway (and failures are rare).
    fn bytes(&self) -> usize {
        0
    }

    fn ticket(&self) -> u64 {
        self.n
    }

    fn failed_root(&self) -> Option<usize> {
        // SAFETY: as `Pending`'s.
        failed_root(unsafe { (*self.word.get())[0] }, self.size)
    }
}

/// Resolves to the buffer and the collective's outcome, once MPI is done
/// with all its calls.
pub(crate) struct Completion<T>(pub(super) Arc<Pending<T>>);

impl<T> std::fmt::Debug for Completion<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Completion").finish_non_exhaustive()
    }
}

impl<T> Future for Completion<T> {
    type Output = (Vec<T>, Result<(), String>);

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut slot = self.0.lock();
        match slot.result.take() {
            Some(r) => Poll::Ready((std::mem::take(&mut slot.buf), r)),
            None => {
                slot.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_word_names_the_lowest_failing_rank() {
        let size = 5;
        let words = [
            0,
            failure_word(3, size, Reason::Skipped),
            failure_word(1, size, Reason::Refused),
        ];
        let max = words.into_iter().max().unwrap();
        assert_eq!(failed_root(max, size), Some(1));
        let m = failed_rank(max, size, "").unwrap();
        assert!(
            m.starts_with("rank 1 failed its part (its op refused"),
            "{m}"
        );
        assert_eq!(failed_rank(0, size, ""), None);
        assert_eq!(failed_root(0, size), None);
        let word = failure_word(4, size, Reason::Skipped);
        assert_eq!(failed_root(word, size), Some(4));
        let m = failed_rank(word, size, "NaN on rank 4").unwrap();
        assert_eq!(
            m,
            "rank 4 failed its part (its op did not run: NaN on rank 4): the collective's result is not valid"
        );
    }

    /// The element-wise maximum of the ranks' status words, as `MPI_MAX`.
    fn max(words: &[[i64; 4]]) -> [i64; 4] {
        let mut m = [i64::MIN; 4];
        for w in words {
            m.iter_mut().zip(w).for_each(|(m, &x)| *m = (*m).max(x));
        }
        m
    }

    #[test]
    fn tags_that_differ_across_ranks_are_a_mismatch_whatever_the_failures() {
        let size = 3;
        let failed = failure_word(1, size, Reason::Skipped);
        // The same tag everywhere (a stand-in's too): no mismatch.
        for tag in [0, 7, u64::MAX, 1 << 63] {
            let words = [status_word(0, 5, tag), status_word(failed, 0, tag)];
            let word = max(&words);
            assert_eq!(mismatched(&word), None, "{tag}");
            assert_eq!((word[1], failed_root(word[0], size)), (5, Some(1)));
        }
        // Any tag that differs, above or below, large or small.
        for (a, b) in [(1, 2), (3, 2), (0, u64::MAX), (1 << 63, 5)] {
            let word = max(&[
                status_word(0, 5, 9),
                status_word(0, 5, a),
                status_word(0, 5, b),
            ]);
            let m = mismatched(&word).unwrap_or_else(|| panic!("{a}, {b}"));
            assert!(m.starts_with("the ranks are out of step"), "{m}");
        }
        let m = mismatched(&max(&[status_word(0, 1, 2), status_word(failed, 0, 3)])).unwrap();
        assert!(m.contains("(2 and 3 at least)"), "{m}");
    }

    #[test]
    fn a_message_is_cut_to_its_bound_at_a_character_boundary() {
        let short = "NaN on rank 1";
        let buf = encode_message(short);
        assert_eq!(buf.len(), MESSAGE_BYTES);
        assert_eq!(decode_message(&buf), short);
        // 2-byte characters: the cut falls inside one and moves back.
        let long = "é".repeat(MESSAGE_BYTES);
        let buf = encode_message(&long);
        assert_eq!(buf.len(), MESSAGE_BYTES);
        let got = decode_message(&buf);
        assert!(got.len() <= MESSAGE_BYTES, "{}", got.len());
        assert!(got.ends_with("é…"), "{got}");
        assert_eq!(got.trim_end_matches('…'), "é".repeat(126));
        // Exactly the bound: kept whole.
        let full = "x".repeat(MESSAGE_BYTES);
        assert_eq!(decode_message(&encode_message(&full)), full);
        assert_eq!(decode_message(&[0; MESSAGE_BYTES]), "");
    }
}
