//! Who frees an op's memory: the thread that pushed it.
//!
//! Only the memory: what the op declared (its variables, their values and
//! the units they hold) it gives up when it retires, on the thread that
//! completes it (see `lifecycle::retire`). What is left to free here is the
//! task allocation itself: the block, and the slot that held the body and
//! then its output (already dropped unless a handle still holds it). Freeing
//! it runs no user code.
//!
//! An op's allocation (its `async-task` task) must outlive both its run and
//! the last time a variable's chain touches one of its edges (an appender may
//! link behind an edge after its op finished). The op's *anchor*, a waker of
//! its own task, keeps it alive until then.
//!
//! If the anchor were dropped by whichever thread released the last edge (a
//! worker, usually), every op would be allocated on the pushing thread and
//! freed on a worker. With glibc's allocator that makes the two contend on one
//! arena lock per op (futex calls showed in the profile), and it bounces the
//! op's and its variables' cache lines (reference counts) between cores.
//! Freeing on the pusher roughly halved the time per op of the `chain` and
//! `round_robin` workloads at two workers (374 and 479 ns to 183 and 285).
//!
//! So the pushing thread *adopts* each op it pushes into a thread-local FIFO,
//! threaded through the ops themselves. Each push reclaims up to
//! [`RECLAIM_PER_PUSH`] finished ops from the head (an op is finished when its
//! `refs` count, one per edge plus one for the run, reaches zero), and waits on
//! the engine drain the list. An op that stays unfinished at the head is
//! *orphaned* once the list grows past [`MAX_ADOPTED`], and so is every op of
//! a thread that exits: the `ORPHAN` bit in `refs` hands the anchor to the
//! thread whose decrement brings the count to zero. Both sides meet on that
//! one word, so exactly one of them drops the anchor.
//!
//! The cost: a completed op's memory stays allocated until its pusher
//! pushes or waits again, or exits. It is bounded: a thread keeps at most
//! [`MAX_ADOPTED`] ops, and adopts only ops whose body fits in
//! [`MAX_ADOPTED_BODY`] bytes (bigger ones are orphaned at once), so at most
//! `MAX_ADOPTED * (MAX_ADOPTED_BODY + 256)` bytes, 80 MiB, per thread, and
//! 16 MiB for typical ops (a block and a small closure, 256 bytes).
//! A thread that pushes a burst and then never touches the engine again holds
//! that much until it exits.

// `unsafe`: the pushing thread's list of the ops it must free; each block says why it is sound.
#![allow(unsafe_code)]

use std::cell::RefCell;
use std::ptr;

use super::block::OpBlock;

/// Finished ops reclaimed per push, at most: more than one, so that the list
/// shrinks when ops finish as fast as they are pushed.
pub(crate) const RECLAIM_PER_PUSH: usize = 2;
/// Beyond this many adopted ops, the head is orphaned if it is not finished;
/// so a thread holds at most this many finished ops.
pub(crate) const MAX_ADOPTED: usize = 1 << 16;
/// Ops whose future (body and context) is bigger than this are not adopted:
/// so that the memory a thread keeps is bounded in bytes, not only in ops.
pub(crate) const MAX_ADOPTED_BODY: usize = 1024;

/// The ops a thread pushed and has not freed yet, oldest first.
struct Adopted {
    head: *const OpBlock,
    tail: *const OpBlock,
    len: usize,
}

impl Adopted {
    /// Adds `op` at the back.
    #[inline]
    fn push(&mut self, op: &OpBlock) {
        // SAFETY: `op` is alive (its anchor is held until this list lets go)
        // and only this thread touches the adoption links.
        unsafe { op.set_next_adopted(ptr::null()) };
        if self.tail.is_null() {
            self.head = op;
        } else {
            // SAFETY: as above, for the current tail.
            unsafe { (*self.tail).set_next_adopted(op) };
        }
        self.tail = op;
        self.len += 1;
    }

    /// Removes the head, which the caller then reclaims or orphans.
    #[inline]
    fn pop(&mut self) -> Option<*const OpBlock> {
        if self.head.is_null() {
            return None;
        }
        let op = self.head;
        // SAFETY: the head is alive and its link is ours.
        self.head = unsafe { (*op).next_adopted() };
        if self.head.is_null() {
            self.tail = ptr::null();
        }
        self.len -= 1;
        Some(op)
    }

    /// Pops the head if it should go now: finished, or unfinished while the
    /// list is too long.
    #[inline]
    fn pop_due(&mut self) -> Option<Popped> {
        let head = self.head;
        if head.is_null() {
            return None;
        }
        // SAFETY: adopted ops are alive until reclaimed or orphaned.
        let finished = unsafe { (*head).is_finished() };
        if !finished && self.len <= MAX_ADOPTED {
            return None;
        }
        self.pop();
        Some(if finished {
            Popped::Finished(head)
        } else {
            Popped::Overdue(head)
        })
    }
}

impl Drop for Adopted {
    fn drop(&mut self) {
        // A failing loom model drops its threads' lists while unwinding,
        // outside the model, where the ops' loom atomics cannot be touched:
        // leave them be, so that the panic reports the failure instead of
        // aborting the whole test run.
        #[cfg(loom)]
        if std::thread::panicking() {
            return;
        }
        // The thread is exiting: nobody will poll these ops any more (see
        // `orphan_all`, which does the same while the thread lives).
        while let Some(op) = self.pop() {
            // SAFETY: popped; `orphan` hands our anchor to the op's last
            // releaser, or drops it now if the op is finished.
            unsafe { release(Popped::Overdue(op)) };
        }
    }
}

crate::loom::thread::thread_local! {
    static ADOPTED: RefCell<Adopted> = const {
        RefCell::new(Adopted { head: ptr::null(), tail: ptr::null(), len: 0 })
    };
}

/// An op taken off the list, to let go of.
enum Popped {
    /// It is finished: reclaim it.
    Finished(*const OpBlock),
    /// It is not finished but must go (the list is too long, or the op was
    /// never adopted): orphan it.
    Overdue(*const OpBlock),
}

/// Reclaims or orphans a popped op. Called with the list not borrowed:
/// freeing an op drops user values, whose destructors may push.
///
/// # Safety
///
/// The op was popped from this thread's list (or never adopted).
unsafe fn release(popped: Popped) {
    // SAFETY: forwarded; the list no longer refers to the op.
    unsafe {
        match popped {
            Popped::Finished(op) => OpBlock::reclaim(op),
            Popped::Overdue(op) => OpBlock::orphan(op),
        }
    }
}

/// Makes the calling thread responsible for freeing `op`, and reclaims a few
/// finished ops it pushed before. `body_size`: the size of the op's future;
/// a big one is not adopted (see [`MAX_ADOPTED_BODY`]).
#[inline]
pub(crate) fn adopt(op: &OpBlock, body_size: usize) {
    if body_size > MAX_ADOPTED_BODY {
        // SAFETY: the op was never adopted.
        unsafe { release(Popped::Overdue(op)) };
        return;
    }
    let adopted = ADOPTED.try_with(|a| match a.try_borrow_mut() {
        Ok(mut a) => {
            a.push(op);
            true
        }
        Err(_) => false,
    });
    if !matches!(adopted, Ok(true)) {
        // No list to join (pushing from a thread-local destructor, say): let
        // the op's last releaser free it.
        // SAFETY: the op was never adopted.
        unsafe { release(Popped::Overdue(op)) };
        return;
    }
    for _ in 0..RECLAIM_PER_PUSH {
        let due = ADOPTED.with(|a| a.try_borrow_mut().ok().and_then(|mut a| a.pop_due()));
        let Some(popped) = due else { return };
        // SAFETY: just popped from this thread's list.
        unsafe { release(popped) };
    }
}

/// Frees the finished ops at the head of the calling thread's list, up to the
/// first unfinished one (amortised constant time per op).
pub(crate) fn collect() {
    collect_at_most(usize::MAX);
}

/// As [`collect`], freeing at most `budget` ops; returns how many it freed.
pub(crate) fn collect_at_most(budget: usize) -> usize {
    let mut freed = 0;
    while freed < budget {
        let due = ADOPTED.try_with(|a| {
            let mut a = a.try_borrow_mut().ok()?;
            // SAFETY: adopted ops are alive until reclaimed or orphaned.
            if a.head.is_null() || !unsafe { (*a.head).is_finished() } {
                return None;
            }
            a.pop()
        });
        let Ok(Some(op)) = due else { break };
        // SAFETY: just popped from this thread's list.
        unsafe { release(Popped::Finished(op)) };
        freed += 1;
    }
    freed
}

/// Gives up every op the calling thread pushed and has not freed, as its
/// exit does (see `Adopted`'s `Drop`): the finished are freed now, the others
/// by whoever finishes them. For the loom models, which cannot wait for a
/// thread's exit to do it.
#[cfg(any(test, loom))]
pub(crate) fn orphan_all() {
    loop {
        let Ok(Some(op)) = ADOPTED.try_with(|a| a.try_borrow_mut().ok().and_then(|mut a| a.pop()))
        else {
            return;
        };
        // SAFETY: just popped from this thread's list.
        unsafe { release(Popped::Overdue(op)) };
    }
}

/// Whether the calling thread has adopted ops it has not freed yet.
pub(crate) fn has_adopted() -> bool {
    ADOPTED
        .try_with(|a| a.try_borrow().is_ok_and(|a| a.len > 0))
        .unwrap_or(false)
}

/// Blocks the calling thread on `fut`, freeing the ops it pushed as they
/// finish while it waits: the frees then overlap with the workers' run
/// instead of piling up after it.
pub(crate) fn block_on<F: std::future::Future>(fut: F) -> F::Output {
    let fut = std::pin::pin!(fut);
    block_on_until(fut, None).expect("no deadline")
}

/// Frees every finished op the calling thread pushed, keeping the others
/// (a full scan: for after `wait_all`, when most have finished).
pub(crate) fn drain() {
    let Ok(count) = ADOPTED.try_with(|a| a.try_borrow().map_or(0, |a| a.len)) else {
        return;
    };
    for _ in 0..count {
        let next = ADOPTED.with(|a| {
            let mut a = a.try_borrow_mut().ok()?;
            let op = a.pop()?;
            // SAFETY: adopted ops are alive until reclaimed or orphaned.
            if unsafe { (*op).is_finished() } {
                Some(op)
            } else {
                // SAFETY: still alive; back to the end of the line.
                a.push(unsafe { &*op });
                None
            }
        });
        if let Some(op) = next {
            // SAFETY: just popped from this thread's list.
            unsafe { release(Popped::Finished(op)) };
        }
    }
}

/// How long a blocking wait yields and looks again before it parks: about
/// what a park and an unpark (a futex wait and wake, a context switch)
/// cost on a loaded machine. `benches/mpi_allreduce.rs`, 2 ranks on 2
/// cores: an all-reduce of 1 KiB took 15 to 25 µs with the caller parking
/// at once, 8 with this (the same with 50 µs).
const SPIN_BEFORE_PARK: std::time::Duration = std::time::Duration::from_micros(20);

/// As [`block_on`], giving up at `deadline` if there is one: `None` if `fut`
/// was not ready by then (it is left as it was, to be polled again).
///
/// It looks again, yielding its core in between, for [`SPIN_BEFORE_PARK`]
/// before it first parks: a result due within microseconds (an op on
/// another thread, a collective completed by a progress thread) is then
/// seen without a park and an unpark, which cost more than that wait.
///
/// While ops this thread pushed are unfinished it wakes to free those that
/// finished (its wakes do not say when they do), 100 µs after it parks,
/// and again 100 µs later as long as each such look finds some to free: so
/// the frees of a stream of ops overlap with the workers' run instead of
/// piling up after it. A look that finds none ends the looks: from then on
/// the thread sleeps until what it waits for wakes it (or its deadline
/// passes), and frees the rest after. So a wait on a long op wakes twice,
/// not every few milliseconds (issue 35: about 105 times a second before).
pub(crate) fn block_on_until<F: std::future::Future + Unpin>(
    mut fut: F,
    deadline: Option<std::time::Instant>,
) -> Option<F::Output> {
    UNPARK
        .try_with(|waker| wait_until(&mut fut, deadline, waker.get_or_init(unpark_current)))
        // The thread is exiting (a thread-local's destructor waits): a waker
        // of its own then.
        .unwrap_or_else(|_| wait_until(&mut fut, deadline, &unpark_current()))
}

crate::loom::thread::thread_local! {
    /// The calling thread's waker for blocking waits, made by its first
    /// one: a wait then allocates nothing (the waker is an `Arc`, and
    /// `thread::current()` one more reference count).
    static UNPARK: std::cell::OnceCell<std::task::Waker> = const { std::cell::OnceCell::new() };
}

/// A waker that unparks the calling thread.
fn unpark_current() -> std::task::Waker {
    struct Unpark(std::thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: std::sync::Arc<Self>) {
            self.0.unpark();
        }
        fn wake_by_ref(self: &std::sync::Arc<Self>) {
            self.0.unpark();
        }
    }
    std::task::Waker::from(std::sync::Arc::new(Unpark(std::thread::current())))
}

/// [`block_on_until`]'s loop, with the thread's waker.
fn wait_until<F: std::future::Future + Unpin>(
    fut: &mut F,
    deadline: Option<std::time::Instant>,
    waker: &std::task::Waker,
) -> Option<F::Output> {
    use std::task::{Context, Poll};
    use std::time::{Duration, Instant};

    /// How long a park lasts while looking for finished ops to free.
    const LOOK: Duration = Duration::from_micros(100);
    let mut cx = Context::from_waker(waker);
    // Whether the next park is a look; a look that frees nothing ends them,
    // one that does renews them.
    let mut looking = true;
    // Read the clock only once the future is found pending.
    let mut spin_until = None;
    loop {
        if let Poll::Ready(out) = std::pin::Pin::new(&mut *fut).poll(&mut cx) {
            return Some(out);
        }
        let now = Instant::now();
        if now < *spin_until.get_or_insert(now + SPIN_BEFORE_PARK)
            && deadline.is_none_or(|d| now < d)
        {
            std::thread::yield_now();
            continue;
        }
        if collect_at_most(256) > 0 {
            looking = true;
            continue;
        }
        let left = match deadline {
            Some(deadline) => match deadline.checked_duration_since(Instant::now()) {
                Some(left) if !left.is_zero() => Some(left),
                _ => return None,
            },
            None => None,
        };
        if looking && has_adopted() {
            // Ops of ours are still running: look once more; if that frees
            // nothing, sleep until woken.
            std::thread::park_timeout(left.map_or(LOOK, |left| left.min(LOOK)));
            looking = false;
        } else {
            match left {
                Some(left) => std::thread::park_timeout(left),
                None => std::thread::park(),
            }
        }
    }
}
