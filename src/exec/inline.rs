//! The inline executor: runs each ready job on the thread that made it ready;
//! and the *trampoline* it runs on, which custom executors' jobs share.
//!
//! Running a job can make others ready (an op's completion grants the next),
//! and those would run inside it, nesting without bound along a long chain.
//! So the first job on a thread runs a trampoline: jobs made ready while it
//! runs queue up on that thread and run one after the other once it returns.
//!
//! A custom executor's function may run its jobs where it gets them (or drop
//! them, which fails their ops and releases what they hold: more jobs made
//! ready). So its calls run on the trampoline too ([`on_trampoline`]), and
//! jobs it runs ([`run_here`]) or drops ([`drop_here`]) while one is active
//! queue up behind the current one instead of nesting.

use std::any::Any;
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::marker::PhantomData;

use super::{Queue, Work};

#[derive(Debug)]
pub(crate) struct Inline;

/// What the trampoline does with a queued job.
enum Step<W> {
    Run(W),
    Drop(W),
}

/// A thread's trampoline.
struct Trampoline {
    /// A trampoline is running on this thread.
    active: Cell<bool>,
    /// The jobs made ready while it runs: a `VecDeque<Step<W>>` of the
    /// executor's job type, kept (empty) between runs so that starting one
    /// does not allocate.
    queue: RefCell<Option<Box<dyn Any>>>,
}

/// A queue that grew past this many jobs is freed when its run ends, so that
/// a thread does not keep the memory of a burst for its life.
const KEEP_CAPACITY: usize = 1024;

crate::loom::thread::thread_local! {
    static TRAMPOLINE: Trampoline = const {
        Trampoline { active: Cell::new(false), queue: RefCell::new(None) }
    };
}

/// Ends the trampoline, even if a job panics through `run` (op bodies'
/// panics, and the drops the engine does, are caught, so it should not
/// happen): jobs still queued are dropped then.
struct Active<W: Work>(PhantomData<W>);

impl<W: Work> Drop for Active<W> {
    fn drop(&mut self) {
        let rest = TRAMPOLINE.try_with(|t| {
            t.active.set(false);
            let mut queue = t.queue.borrow_mut();
            let keep = queue
                .as_ref()
                .and_then(|q| q.downcast_ref::<VecDeque<Step<W>>>())
                .is_some_and(|q| q.is_empty() && q.capacity() <= KEEP_CAPACITY);
            if keep { None } else { queue.take() }
        });
        drop(rest.ok().flatten());
    }
}

/// Queues `step` on this thread's trampoline if one is running; gives it back
/// if none is (or the thread's locals are gone: it is exiting).
#[inline]
fn queue<W: Work>(step: Step<W>) -> Result<(), Step<W>> {
    let mut step = Some(step);
    let queued = TRAMPOLINE.try_with(|t| {
        if !t.active.get() {
            return false;
        }
        let mut queue = t.queue.borrow_mut();
        if queue.as_ref().is_none_or(|q| !q.is::<VecDeque<Step<W>>>()) {
            *queue = Some(Box::new(VecDeque::<Step<W>>::new()));
        }
        let q = queue
            .as_mut()
            .and_then(|q| q.downcast_mut::<VecDeque<Step<W>>>())
            .expect("just made");
        q.extend(step.take());
        true
    });
    match (queued, step) {
        (Ok(true), _) => Ok(()),
        (_, Some(step)) => Err(step),
        (_, None) => unreachable!("queued or given back"),
    }
}

/// The next queued step, if any.
#[inline]
fn next<W: Work>() -> Option<Step<W>> {
    TRAMPOLINE
        .try_with(|t| {
            t.queue
                .borrow_mut()
                .as_mut()
                .and_then(|q| q.downcast_mut::<VecDeque<Step<W>>>())
                .and_then(VecDeque::pop_front)
        })
        .ok()
        .flatten()
}

/// Runs `first` as the trampoline of this thread (none runs here), then
/// every step queued meanwhile; returns what `first` returned. (On a thread
/// whose locals are gone, `first` just runs.)
#[inline]
fn trampoline<W: Work, R>(first: impl FnOnce() -> R) -> R {
    if TRAMPOLINE.try_with(|t| t.active.set(true)).is_err() {
        return first();
    }
    let _active = Active::<W>(PhantomData);
    let out = first();
    while let Some(step) = next::<W>() {
        match step {
            Step::Run(job) => {
                job.run();
            }
            Step::Drop(job) => drop(job),
        }
    }
    out
}

/// Whether a trampoline runs on this thread (it is running a job of an
/// inline or custom executor).
#[inline]
pub(crate) fn on_trampoline_thread() -> bool {
    TRAMPOLINE.try_with(|t| t.active.get()).unwrap_or(false)
}

/// Runs `job` on this thread: now, or if a trampoline already runs here,
/// once the job it is running returns (then `false`: it has not run yet).
#[inline]
pub(crate) fn run_here<W: Work>(job: W) -> bool {
    match queue(Step::Run(job)) {
        Ok(()) => false,
        Err(Step::Run(job)) => trampoline::<W, _>(|| job.run()),
        Err(Step::Drop(_)) => unreachable!("given back as it was"),
    }
}

/// Drops `job` on this thread, as [`run_here`] runs it: what dropping it
/// makes ready (its op fails and lets its variables go) runs after it, not
/// inside the caller.
pub(crate) fn drop_here<W: Work>(job: W) {
    match queue(Step::Drop(job)) {
        Ok(()) => {}
        Err(step) => trampoline::<W, _>(|| drop(step)),
    }
}

/// Runs `f` (a custom executor's function) on this thread's trampoline:
/// jobs it runs or drops here go after it.
pub(crate) fn on_trampoline<W: Work>(f: impl FnOnce()) {
    if on_trampoline_thread() {
        f();
    } else {
        trampoline::<W, _>(f);
    }
}

impl<W: Work> Queue<W> for Inline {
    #[inline]
    fn schedule(&self, job: W, _yielded: bool) {
        run_here(job);
    }

    fn shutdown(&self) {}
}
