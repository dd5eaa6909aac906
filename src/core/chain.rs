//! The dependency chain of one variable: the ops waiting on it, in push
//! order, and the *token* that grants them.
//!
//! # Model
//!
//! Every op that touches a variable contributes one [`Edge`] (a read or a
//! write) to that variable's chain. Edges are granted in push order: a run of
//! reads is granted together, a write is granted alone once every earlier read
//! has completed. This is MXNet's per-variable queue, without its mutex.
//!
//! # Protocol
//!
//! The chain is an intrusive MPSC list (Vyukov's) plus a token:
//!
//! - `tail` points at the newest edge, or is null when the chain is idle.
//!   Appending is one `swap` on `tail` and one `fetch_or` that links the
//!   previous edge to the new one: wait-free, no lock.
//! - Exactly one thread at a time holds the **token**: the right to grant the
//!   oldest edge not yet granted. A token holder grants reads one after the
//!   other; at a write it stops: the write is granted at once if no read is in
//!   flight, otherwise the token is *parked* on the write (`parked` plus the
//!   `WAITING` bit of `rw`) and the last reader to complete grants it.
//!   The token then stays with the write until that write completes.
//! - To move past an edge, the token holder looks for its successor. If there
//!   is none yet it either resets `tail` to null (the chain goes idle; the next
//!   appender finds null and takes the token) or, if an appender has already
//!   swapped itself in but not yet linked, it sets `PASSED` on the edge and
//!   leaves: the appender's `fetch_or` then sees `PASSED` and carries on as the
//!   token holder. Every hand-off is a single atomic read-modify-write whose
//!   result tells each side which one came second.
//!
//! `rw` counts granted reads that have not completed (in units of `READER`)
//! and carries `WAITING` while a write waits for them.
//!
//! # Memory reclamation: why no epoch
//!
//! An edge is reachable by at most two threads: the token holder, and the
//! appender that got it back from `swap` and will link a successor into it.
//! Whichever of the two finishes with it second (the side whose read-modify-
//! write observes the other's mark, or the holder whose `tail` reset succeeded
//! so that no appender can exist) calls [`Owner::release`], exactly once per
//! edge. No thread ever dereferences an edge it did not obtain this way, so
//! there is nothing for crossbeam-epoch to protect: the handshake *is* the
//! reclamation protocol, as in Vyukov's queue and tokio's intrusive lists.
//! Edges live inside their op's allocation; `release` drops the op's hold on
//! that allocation when its last edge is released.
//!
//! # Safety contract
//!
//! All pointer work of the engine's dependency tracking lives in this module.
//! Callers promise that an edge passed to [`Chain::link`] stays valid until
//! its owner's `release` is called for it, that it is linked into one chain
//! once, and that every granted edge is completed exactly once.
//!
//! # Who touches what
//!
//! | field | written by | read by |
//! | --- | --- | --- |
//! | `tail` | appenders (`swap`), the token holder going idle (CAS) | both |
//! | `Edge::link` | its appender (address, `fetch_or`), the token holder (`PASSED`) | both; `WRITE` is fixed at creation |
//! | `Edge::owner` | the pusher, before the edge is linked | the token holder |
//! | `rw` | the token holder (readers in, `WAITING`), completing readers | both |
//! | `parked` | the token holder, before it sets `WAITING` | the last reader out |

// `unsafe`: the chain's pointer protocol (all of the engine's); each block says why it is sound.
#![allow(unsafe_code)]

use std::ptr;

use crate::loom::cell::UnsafeCell;
use crate::loom::sync::atomic::{AtomicPtr, AtomicUsize, Ordering::*};

/// What the chain needs from the op that owns an edge: to let it go.
pub trait Owner {
    /// The chain will never touch one of the owner's edges again; called once
    /// per edge.
    ///
    /// # Safety
    ///
    /// `this` points to a live owner. The callee may free it, so the caller
    /// must not use `this` or the edge afterwards.
    unsafe fn release(this: *const Self);
}

/// How the chain grants an edge: `C` is what the granting thread passes
/// along (the engine, for ops), so that the grant is a static call however
/// deep in another op's completion it happens.
pub trait Grant<C: ?Sized>: Owner {
    /// One of the owner's edges has been granted; called once per edge.
    fn grant(&self, cx: &C);
}

/// `link` bit: the token holder has moved past this edge and left the rest to
/// the appender of the next edge.
const PASSED: usize = 0b01;
/// `link` bit, set at creation and never changed: the edge is a write.
const WRITE: usize = 0b10;
/// The `link` bits that are not the next edge's address.
const FLAGS: usize = PASSED | WRITE;

/// `rw` bit: a write holds the parked token and waits for the reads in flight.
const WAITING: usize = 0b1;
/// `rw` unit: one granted read in flight.
const READER: usize = 0b10;

/// One op's access to one variable.
pub struct Edge<O> {
    /// The next edge's address, or'ed with `PASSED` and `WRITE`.
    link: AtomicUsize,
    /// The op this edge belongs to; set once before the edge is linked.
    owner: UnsafeCell<*const O>,
}

// SAFETY: an edge is shared between the threads of the chain protocol; its
// only mutable state is the atomic `link`, and `owner` is written once before
// the edge is published and only read afterwards.
unsafe impl<O: Sync> Send for Edge<O> {}
// SAFETY: as above.
unsafe impl<O: Sync> Sync for Edge<O> {}

impl<O> Edge<O> {
    /// A fresh edge, not yet owned or linked.
    pub fn new(write: bool) -> Self {
        Self {
            link: AtomicUsize::new(if write { WRITE } else { 0 }),
            owner: UnsafeCell::new(ptr::null()),
        }
    }

    /// Whether this edge mutates its variable.
    #[inline]
    pub fn is_write(&self) -> bool {
        // WRITE is set before the edge is shared and never changes, so any
        // load sees it.
        self.link.load(Relaxed) & WRITE != 0
    }

    /// Records the op that owns this edge.
    ///
    /// # Safety
    ///
    /// The edge is not linked yet and no other thread can see it.
    pub unsafe fn set_owner(&self, owner: *const O) {
        // SAFETY: the caller guarantees exclusive access.
        self.owner.with_mut(|p| unsafe { *p = owner });
    }

    #[inline]
    fn owner(&self) -> *const O {
        // SAFETY: written once before the edge was published (see `set_owner`);
        // publication through `tail`/`link` orders that write before this read.
        self.owner.with(|p| unsafe { *p })
    }
}

impl<O> std::fmt::Debug for Edge<O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Edge")
            .field("write", &self.is_write())
            .finish_non_exhaustive()
    }
}

/// One variable's chain of edges.
///
/// Laid out on two cache lines: pushers swap `tail`; token holders and
/// completing ops work on `rw` and `parked`. Keeping them apart means a pusher
/// running ahead of the workers does not steal their line on every push. The
/// grant line also carries a payload `P`: what the ops holding grants read
/// and write besides (a variable's version and state), so that they touch one
/// line per variable, not two.
#[repr(C, align(64))]
pub struct Chain<O, P = ()> {
    tail: AtomicPtr<Edge<O>>,
    granted: Granted<O, P>,
}

/// The grant side of a chain, on its own cache line.
#[repr(C, align(64))]
struct Granted<O, P> {
    rw: AtomicUsize,
    /// The write the token is parked on while `rw` carries `WAITING`.
    parked: UnsafeCell<*const Edge<O>>,
    payload: P,
}

// SAFETY: all shared state is atomic except `parked`, which only the token
// holder writes and only the reader that takes the parked token reads, with
// the `rw` read-modify-writes ordering the two (see `advance`); the payload
// is shared only if it is `Send + Sync`.
unsafe impl<O: Sync, P: Send + Sync> Send for Chain<O, P> {}
// SAFETY: as above.
unsafe impl<O: Sync, P: Send + Sync> Sync for Chain<O, P> {}

impl<O, P: Default> Default for Chain<O, P> {
    fn default() -> Self {
        Self::new(P::default())
    }
}

impl<O, P> Chain<O, P> {
    /// An idle chain carrying `payload` on its grant line.
    pub fn new(payload: P) -> Self {
        Self {
            tail: AtomicPtr::new(ptr::null_mut()),
            granted: Granted {
                rw: AtomicUsize::new(0),
                parked: UnsafeCell::new(ptr::null()),
                payload,
            },
        }
    }

    /// The payload on the grant line.
    #[inline]
    pub fn payload(&self) -> &P {
        &self.granted.payload
    }
}

impl<O, P> std::fmt::Debug for Chain<O, P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let rw = self.granted.rw.load(Relaxed);
        f.debug_struct("Chain")
            .field("idle", &self.tail.load(Relaxed).is_null())
            .field("reads_in_flight", &(rw / READER))
            .field("write_waiting", &(rw & WAITING != 0))
            .finish()
    }
}

impl<O: Owner, P> Chain<O, P> {
    /// Whether no edge is queued or in flight (a snapshot, for diagnostics).
    pub fn is_idle(&self) -> bool {
        self.tail.load(Acquire).is_null() && self.granted.rw.load(Acquire) == 0
    }

    /// Appends `e` and, if that hands this thread the token, grants what can
    /// be granted.
    ///
    /// # Safety
    ///
    /// See the module's safety contract; `e` has its owner set.
    #[inline]
    pub unsafe fn append<C: ?Sized>(&self, e: *const Edge<O>, cx: &C)
    where
        O: Grant<C>,
    {
        // SAFETY: forwarded contract.
        unsafe {
            if self.link(e) {
                self.advance(e, cx);
            }
        }
    }

    /// Links `e` at the tail. Returns `true` when this call took the token;
    /// the caller must then call [`advance`](Self::advance)`(e)`, possibly
    /// later (multi-variable pushes link under a lock and advance after it).
    ///
    /// # Safety
    ///
    /// As for [`append`](Self::append).
    #[inline]
    pub unsafe fn link(&self, e: *const Edge<O>) -> bool {
        // AcqRel: publishes `e`'s initialisation to the next appender, and
        // takes the idle token's history from the last holder.
        let prev = self.tail.swap(e.cast_mut(), AcqRel);
        if prev.is_null() {
            return true;
        }
        // SAFETY: `prev` came from our swap: until we mark it, the token
        // holder cannot release it (it either sees our link or sets PASSED and
        // leaves the release to us).
        unsafe {
            let old = (*prev).link.fetch_or(e as usize, AcqRel);
            debug_assert_eq!(old & !FLAGS, 0, "edge linked twice");
            if old & PASSED == 0 {
                return false;
            }
            // The holder passed `prev` before we linked: we are the last to
            // touch it, and the token is ours.
            O::release((*prev).owner());
        }
        true
    }

    /// Grants from `e`, which holds the token, as far as the rules allow.
    ///
    /// # Safety
    ///
    /// The calling thread holds the token at `e`.
    pub unsafe fn advance<C: ?Sized>(&self, mut e: *const Edge<O>, cx: &C)
    where
        O: Grant<C>,
    {
        loop {
            // SAFETY: we hold the token at `e`, so `e` is not released.
            let (owner, write) = unsafe { ((*e).owner(), (*e).is_write()) };
            if write {
                // Park the token here first: if readers are in flight, the last
                // one reads `parked` after our CAS below publishes it.
                // SAFETY: only the token holder writes `parked`.
                self.granted.parked.with_mut(|p| unsafe { *p = e });
                let mut cur = self.granted.rw.load(Acquire);
                loop {
                    if cur == 0 {
                        // SAFETY: the owner is alive until its edges complete.
                        unsafe { (*owner).grant(cx) };
                        return;
                    }
                    match self
                        .granted
                        .rw
                        .compare_exchange(cur, cur | WAITING, AcqRel, Acquire)
                    {
                        Ok(_) => return,
                        Err(actual) => cur = actual,
                    }
                }
            }
            self.granted.rw.fetch_add(READER, AcqRel);
            // SAFETY: the owner is alive until its edges complete.
            unsafe { (*owner).grant(cx) };
            // SAFETY: we still hold the token at `e`.
            match unsafe { self.pass(e) } {
                Some(next) => e = next,
                None => return,
            }
        }
    }

    /// Completes a granted read of this variable.
    ///
    /// # Safety
    ///
    /// One granted, not yet completed read edge of this chain is completed
    /// by this call.
    #[inline]
    pub unsafe fn complete_read<C: ?Sized>(&self, cx: &C)
    where
        O: Grant<C>,
    {
        let prev = self.granted.rw.fetch_sub(READER, AcqRel);
        debug_assert!(prev >= READER, "read completed twice");
        if prev == READER | WAITING {
            // Last reader out, a write waits: the parked token is ours. Nobody
            // else touches `rw` now (no reads in flight, the token is here).
            self.granted.rw.store(0, Relaxed);
            // SAFETY: `parked` was written before the CAS that set WAITING,
            // which our fetch_sub (Acquire) read; the parked edge holds the
            // token so it is not released.
            unsafe {
                let w = self.granted.parked.with(|p| *p);
                (*(*w).owner()).grant(cx);
            }
        }
    }

    /// Completes the granted write `e` and hands the token on.
    ///
    /// # Safety
    ///
    /// `e` is this chain's granted write, completed once.
    #[inline]
    pub unsafe fn complete_write<C: ?Sized>(&self, e: *const Edge<O>, cx: &C)
    where
        O: Grant<C>,
    {
        // SAFETY: a granted write holds the token until it completes.
        unsafe {
            if let Some(next) = self.pass(e) {
                self.advance(next, cx);
            }
        }
    }

    /// Moves the token past `e`. Returns the next edge (now holding the token),
    /// or `None` when the chain went idle or an appender takes over.
    ///
    /// # Safety
    ///
    /// The calling thread holds the token at `e`; `e` must not be used after.
    #[inline]
    unsafe fn pass(&self, e: *const Edge<O>) -> Option<*const Edge<O>> {
        // SAFETY: we hold the token at `e`, so it is live until we release it.
        unsafe {
            let owner = (*e).owner();
            let mut link = (*e).link.load(Acquire);
            if link & !FLAGS == 0 {
                // No successor linked yet. If none was appended, go idle.
                if self
                    .tail
                    .compare_exchange(e.cast_mut(), ptr::null_mut(), AcqRel, Relaxed)
                    .is_ok()
                {
                    O::release(owner);
                    return None;
                }
                // An appender swapped itself in and is about to link: whoever of
                // us marks `link` second carries on.
                link = (*e).link.fetch_or(PASSED, AcqRel);
                if link & !FLAGS == 0 {
                    return None;
                }
            }
            O::release(owner);
            Some((link & !FLAGS) as *const Edge<O>)
        }
    }
}
