//! The work-stealing CPU pool.
//!
//! - Each worker has a FIFO deque and a LIFO slot. An op made ready by a
//!   worker (typically by the op it just completed) goes to that worker's LIFO
//!   slot and runs next, hot in cache: a dependency chain is handed off without
//!   crossing threads. The slot's previous occupant moves to the deque, where
//!   other workers can steal it. A worker takes the LIFO slot at most
//!   `LIFO_STREAK` times in a row, so older work is not starved.
//! - An op made ready by a job *while its body runs* (pushed from inside an
//!   op, say) would wait in the slot for as long as that body keeps the
//!   worker (nobody else can take it from there): it goes to the deque
//!   instead, and a parked worker is woken to steal it (`Work::in_body`
//!   tells).
//! - Ops made ready on other threads (the pushing thread, a timer) go to the
//!   shared injector.
//! - Ops with a non-zero priority go to two shared heaps, by sign: positive
//!   priorities run before any other ready op, negative ones after. Within a
//!   heap, priorities age: an op's standing rises by one priority level for
//!   every `AGE` ops that enter the heaps after it, so equal priorities run
//!   in the order they became ready and a steady supply of higher ones
//!   cannot hold a lower one back forever. And negative ones are not starved
//!   by priority-0 work: when workers have passed the first of them over
//!   `NEGATIVE_PASSES` times (taking other work), the next worker to look
//!   takes it. Priorities only order *ready* ops; they never override
//!   dependencies.
//! - A worker without work spins a little (yielding the CPU), then parks.
//!   Making work available wakes a parked worker only when no worker is
//!   already searching; a searcher that finds work wakes the next one if work
//!   is left. So a steady producer does not pay a futex wake per op.
//! - A start hook, if given, runs first thing on each worker thread (to enter
//!   an async runtime there, say); the pool is built once every worker has
//!   run it, so a hook that panics fails the build instead of leaving the
//!   pool a worker short.

// `unsafe`: a worker's thread-local pointer to its own state; each block says why it is sound.
#![allow(unsafe_code)]

use std::cell::Cell;
use std::cmp::Ordering as CmpOrdering;
use std::collections::BinaryHeap;
use std::sync::{Arc, OnceLock};
use std::thread::{self, JoinHandle, Thread};

use crossbeam_deque::{Injector, Steal, Stealer, Worker};

use super::{Queue, Work};
use crate::loom::sync::Mutex;
use crate::loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering::*, fence};

/// A function run first thing on each worker thread.
pub(crate) type StartHook = Arc<dyn Fn() + Send + Sync>;

/// How many times in a row a worker may take its LIFO slot.
const LIFO_STREAK: u32 = 64;
/// How many yielding rounds an idle worker looks for work before parking.
const SPIN_ROUNDS: u32 = 64;
/// Every this many ops a worker looks at the shared queues first (fairness).
const GLOBAL_CHECK_INTERVAL: u32 = 61;
/// How many ops entering a priority heap after an op raise its standing
/// there by one priority level.
const AGE: i64 = 64;
/// How many times workers may take other work over the first ready op of
/// negative priority before one must take it.
const NEGATIVE_PASSES: u32 = 64;

pub(crate) struct Pool<W> {
    shared: Arc<PoolShared<W>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

/// What the pool's workers and schedulers share.
struct PoolShared<W> {
    injector: Injector<W>,
    stealers: Box<[Stealer<W>]>,
    sleepers: Box<[Sleeper]>,
    /// Parked workers.
    idle: Mutex<Vec<usize>>,
    num_idle: AtomicUsize,
    /// Workers awake and looking for work.
    searching: AtomicUsize,
    prio: Mutex<PrioHeaps<W>>,
    /// Ops in both heaps.
    prio_len: AtomicUsize,
    stop: AtomicBool,
}

#[derive(Default)]
struct Sleeper {
    notified: AtomicBool,
    thread: OnceLock<Thread>,
}

/// Ready ops of non-zero priority.
struct PrioHeaps<W> {
    /// Positive priorities: run before any other ready op.
    ahead: BinaryHeap<Prioritized<W>>,
    /// Negative priorities: run when there is nothing else, or when passed
    /// over `NEGATIVE_PASSES` times.
    behind: BinaryHeap<Prioritized<W>>,
    /// How many ops entered a heap so far: the next one's `seq`.
    seq: u64,
    /// How many times workers took other work over the first of `behind`
    /// since one of it last ran.
    passes: u32,
}

struct Prioritized<W> {
    /// Its standing: its priority, aged by how many ops entered the heaps
    /// before it (`priority * AGE - seq`: higher first; fixed, since all
    /// age alike).
    rank: i64,
    job: W,
}

impl<W> PartialEq for Prioritized<W> {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == CmpOrdering::Equal
    }
}
impl<W> Eq for Prioritized<W> {}
impl<W> PartialOrd for Prioritized<W> {
    fn partial_cmp(&self, other: &Self) -> Option<CmpOrdering> {
        Some(self.cmp(other))
    }
}
impl<W> Ord for Prioritized<W> {
    fn cmp(&self, other: &Self) -> CmpOrdering {
        // Higher standing first; among equal priorities, the one that became
        // ready first (its `seq` is lower).
        self.rank.cmp(&other.rank)
    }
}

/// A worker's own state, on its thread's stack while it works.
struct Local<W> {
    index: usize,
    deque: Worker<W>,
    lifo: Cell<Option<W>>,
    streak: Cell<u32>,
    tick: Cell<u32>,
}

crate::loom::thread::thread_local! {
    /// The pool this thread works for: its `PoolShared`'s address (0 if
    /// none; never dereferenced) and the worker's `Local` of that pool's job
    /// type. (A thread-local cannot be generic, hence the erased pointer.)
    static WORKER: Cell<(usize, *const ())> = const { Cell::new((0, std::ptr::null())) };
}

impl<W: Work> Pool<W> {
    /// Starts `threads` workers, named after `name`, each running `on_start`
    /// first if given (then this returns once every worker has run it).
    /// Errs with a message if a thread cannot be spawned or a hook panics.
    pub(crate) fn new(
        name: &str,
        threads: usize,
        on_start: Option<&StartHook>,
    ) -> Result<Self, String> {
        let deques: Vec<Worker<W>> = (0..threads).map(|_| Worker::new_fifo()).collect();
        let shared = Arc::new(PoolShared {
            injector: Injector::new(),
            stealers: deques.iter().map(Worker::stealer).collect(),
            sleepers: (0..threads).map(|_| Sleeper::default()).collect(),
            idle: Mutex::new(Vec::with_capacity(threads)),
            num_idle: AtomicUsize::new(0),
            searching: AtomicUsize::new(0),
            prio: Mutex::new(PrioHeaps {
                ahead: BinaryHeap::new(),
                behind: BinaryHeap::new(),
                seq: 0,
                passes: 0,
            }),
            prio_len: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
        });
        let pool = Pool {
            shared: shared.clone(),
            threads: Mutex::new(Vec::with_capacity(threads)),
        };
        let (started, starts) = std::sync::mpsc::channel::<Result<(), String>>();
        for (index, deque) in deques.into_iter().enumerate() {
            let shared = shared.clone();
            let start = on_start.map(|hook| (hook.clone(), started.clone()));
            let handle = thread::Builder::new()
                .name(format!("depflow-{name}-{index}"))
                .spawn(move || shared.work(index, deque, start))
                // On error `pool` drops: stops the others.
                .map_err(|e| format!("cannot spawn its threads: {e}"))?;
            pool.threads.lock().push(handle);
        }
        drop(started);
        if on_start.is_some() {
            for _ in 0..threads {
                // A worker that dies before reporting closes the channel.
                match starts.recv() {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => return Err(e),
                    Err(_) => return Err("a thread start hook did not return".into()),
                }
            }
        }
        Ok(pool)
    }
}

impl<W> Drop for Pool<W> {
    fn drop(&mut self) {
        self.stop();
    }
}

impl<W> std::fmt::Debug for Pool<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("threads", &self.shared.sleepers.len())
            .field("idle", &self.shared.num_idle.load(Relaxed))
            .finish()
    }
}

impl<W: Work> Pool<W> {
    /// How many of the ready jobs that a job running on this thread keeps
    /// for itself it should hand to the pool now (`Host::wanted`): none in
    /// a pool of one, or while jobs it handed over wait in this worker's
    /// deque; else one per idle worker (parked, or awake and looking), and
    /// at least one: a worker about to park or just done with a job is not
    /// counted idle, and would otherwise wait for this job's end. A hint:
    /// it may change at once.
    #[inline]
    pub(crate) fn wanted(&self) -> usize {
        let shared = &*self.shared;
        if shared.sleepers.len() < 2 {
            return 0;
        }
        let (pool, local) = WORKER.with(Cell::get);
        if pool == shared.address() {
            // SAFETY: as in `schedule`: this thread is one of this pool's
            // workers, running a job, and `local` its own `Local<W>`.
            let local = unsafe { &*local.cast::<Local<W>>() };
            if !local.deque.is_empty() {
                return 0;
            }
        }
        (shared.searching.load(Relaxed) + shared.num_idle.load(Relaxed)).max(1)
    }
}

impl<W: Work> Queue<W> for Pool<W> {
    #[inline]
    fn schedule(&self, job: W, yielded: bool) {
        let shared = &*self.shared;
        let priority = job.priority();
        if priority != 0 {
            shared.push_prio(job, priority);
            shared.notify();
            return;
        }
        let (pool, local) = WORKER.with(Cell::get);
        if pool != shared.address() {
            shared.injector.push(job);
            shared.notify();
            return;
        }
        // SAFETY: only this pool's workers record its address in `WORKER`,
        // each with a pointer to its own `Local<W>` (this pool's `W`), which
        // lives on its stack for as long as it runs jobs; this call comes
        // from one of those jobs, on that thread.
        let local = unsafe { &*local.cast::<Local<W>>() };
        if yielded || W::in_body() {
            // A yielding job goes behind the others; one made ready by a body
            // that goes on running must not wait for it in the slot, where
            // no other worker can take it.
            local.deque.push(job);
        } else if let Some(previous) = local.lifo.replace(Some(job)) {
            local.deque.push(previous);
        } else {
            return; // this worker runs it next
        }
        shared.notify();
    }

    fn shutdown(&self) {
        self.stop();
    }
}

impl<W> Pool<W> {
    fn stop(&self) {
        let shared = &*self.shared;
        shared.stop.store(true, SeqCst);
        for sleeper in shared.sleepers.iter() {
            sleeper.notified.store(true, Release);
            if let Some(thread) = sleeper.thread.get() {
                thread.unpark();
            }
        }
        let handles = std::mem::take(&mut *self.threads.lock());
        let me = thread::current().id();
        for handle in handles {
            // A worker cannot join itself (the engine was dropped from inside
            // an op's output, say): it exits on its own once it returns.
            if handle.thread().id() != me {
                let _ = handle.join();
            }
        }
    }
}

impl<W> PoolShared<W> {
    /// The pool's identity, as workers record it in `WORKER`.
    fn address(&self) -> usize {
        std::ptr::from_ref(self) as usize
    }
}

impl<W: Work> PoolShared<W> {
    /// A worker thread's main loop, after its start hook (which reports to
    /// the pool's builder).
    fn work(
        &self,
        index: usize,
        deque: Worker<W>,
        start: Option<(StartHook, std::sync::mpsc::Sender<Result<(), String>>)>,
    ) {
        let _ = self.sleepers[index].thread.set(thread::current());
        if let Some((hook, report)) = start {
            let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| hook()));
            let failed = ran.is_err();
            let _ = report.send(ran.map_err(|payload| {
                format!(
                    "its thread start hook panicked: {}",
                    crate::error::panic_message(&*payload)
                )
            }));
            if failed {
                return; // the build fails and stops the pool
            }
        }
        let local = Local {
            index,
            deque,
            lifo: Cell::new(None),
            streak: Cell::new(0),
            tick: Cell::new(0),
        };
        WORKER.with(|w| w.set((self.address(), std::ptr::from_ref(&local).cast())));
        self.run(&local);
        WORKER.with(|w| w.set((0, std::ptr::null())));
    }

    fn run(&self, local: &Local<W>) {
        let mut searching = false;
        'work: loop {
            if let Some(job) = self.next(local) {
                self.found(&mut searching);
                job.run();
                continue;
            }
            if !searching {
                // At most half the workers search at once (as in tokio): the
                // others park at once instead of taking CPU from the threads
                // that push and run ops.
                if 2 * self.searching.load(SeqCst) >= self.sleepers.len().max(2) {
                    match self.idle(local.index) {
                        Some(woken_searching) => searching = woken_searching,
                        None => return,
                    }
                    continue;
                }
                searching = true;
                self.searching.fetch_add(1, SeqCst);
            }
            for _ in 0..SPIN_ROUNDS {
                thread::yield_now();
                if let Some(job) = self.next(local) {
                    self.found(&mut searching);
                    job.run();
                    continue 'work;
                }
            }
            self.searching.fetch_sub(1, SeqCst);
            match self.idle(local.index) {
                Some(woken_searching) => searching = woken_searching,
                None => return,
            }
        }
    }

    /// Nothing to run: lets the jobs tidy up (the engine frees the ops run
    /// here pushed and that have finished), then parks. `None` when the pool
    /// stops instead; else whether the worker wakes as a searcher.
    fn idle(&self, index: usize) -> Option<bool> {
        W::before_park();
        if self.stop.load(SeqCst) && !self.has_work() {
            return None;
        }
        Some(self.park(index))
    }

    /// A searching worker found work: stop counting it as searching, and if it
    /// was the last searcher and work is left, wake someone to look for it.
    fn found(&self, searching: &mut bool) {
        if std::mem::take(searching) && self.searching.fetch_sub(1, SeqCst) == 1 && self.has_work()
        {
            self.notify();
        }
    }

    /// The next op for this worker, if any.
    fn next(&self, local: &Local<W>) -> Option<W> {
        let tick = local.tick.get().wrapping_add(1);
        local.tick.set(tick);
        if tick % GLOBAL_CHECK_INTERVAL == 0
            && let Some(job) = self.steal_injector(local)
        {
            local.streak.set(0);
            return Some(job);
        }
        if self.prio_len.load(Relaxed) != 0
            && let Some(job) = self.pop_prio(true)
        {
            return Some(job);
        }
        if let Some(job) = local.lifo.take() {
            let streak = local.streak.get();
            if streak < LIFO_STREAK {
                local.streak.set(streak + 1);
                return Some(job);
            }
            local.deque.push(job);
        }
        local.streak.set(0);
        if let Some(job) = local.deque.pop() {
            return Some(job);
        }
        if let Some(job) = self.steal_injector(local) {
            return Some(job);
        }
        let n = self.stealers.len();
        for k in 1..n {
            let victim = &self.stealers[(local.index + k) % n];
            loop {
                match victim.steal_batch_and_pop(&local.deque) {
                    Steal::Success(job) => return Some(job),
                    Steal::Empty => break,
                    Steal::Retry => {}
                }
            }
        }
        if self.prio_len.load(Relaxed) != 0 {
            return self.pop_prio(false);
        }
        None
    }

    fn steal_injector(&self, local: &Local<W>) -> Option<W> {
        loop {
            match self.injector.steal_batch_and_pop(&local.deque) {
                Steal::Success(job) => return Some(job),
                Steal::Empty => return None,
                Steal::Retry => {}
            }
        }
    }

    fn push_prio(&self, job: W, priority: i32) {
        let mut prio = self.prio.lock();
        let seq = prio.seq;
        prio.seq += 1;
        // Saturating: a heap that saw 2^63 ops keeps its order roughly.
        let rank = (i64::from(priority) * AGE).saturating_sub(seq.min(i64::MAX as u64) as i64);
        let entry = Prioritized { rank, job };
        if priority > 0 {
            prio.ahead.push(entry);
        } else {
            prio.behind.push(entry);
        }
        self.prio_len.fetch_add(1, SeqCst);
    }

    /// Pops the first op of positive priority. With `first`, the worker has
    /// not looked for other work yet: then, if there is none of positive
    /// priority, it passes the first negative one over, unless that one was
    /// passed over `NEGATIVE_PASSES` times already (then it pops it). Without
    /// `first` (the worker found nothing else), pops the first of either.
    fn pop_prio(&self, first: bool) -> Option<W> {
        let mut prio = self.prio.lock();
        let job = match prio.ahead.pop() {
            Some(job) => job,
            None if prio.behind.is_empty() => return None,
            None if first && prio.passes < NEGATIVE_PASSES => {
                prio.passes += 1;
                return None;
            }
            None => {
                prio.passes = 0;
                prio.behind.pop()?
            }
        };
        self.prio_len.fetch_sub(1, SeqCst);
        Some(job.job)
    }

    fn has_work(&self) -> bool {
        !self.injector.is_empty()
            || self.prio_len.load(SeqCst) != 0
            || self.stealers.iter().any(|s| !s.is_empty())
    }

    /// Work was made available: wake a parked worker unless one is already
    /// searching. The fence pairs with the one in `park` (a Dekker pair): a
    /// worker going to sleep either sees the new work or is seen as idle.
    fn notify(&self) {
        fence(SeqCst);
        if self.searching.load(SeqCst) != 0 || self.num_idle.load(SeqCst) == 0 {
            return;
        }
        let mut idle = self.idle.lock();
        let Some(index) = idle.pop() else { return };
        self.num_idle.fetch_sub(1, SeqCst);
        // The woken worker counts as searching from now on, so that a burst of
        // work wakes workers one at a time rather than all at once.
        self.searching.fetch_add(1, SeqCst);
        drop(idle);
        let sleeper = &self.sleepers[index];
        sleeper.notified.store(true, Release);
        if let Some(thread) = sleeper.thread.get() {
            thread.unpark();
        }
    }

    /// Parks the worker until notified. Returns whether it wakes as a
    /// searcher (counted by its waker).
    fn park(&self, index: usize) -> bool {
        {
            let mut idle = self.idle.lock();
            idle.push(index);
            self.num_idle.fetch_add(1, SeqCst);
        }
        fence(SeqCst);
        if self.has_work() || self.stop.load(SeqCst) {
            let mut idle = self.idle.lock();
            if let Some(pos) = idle.iter().position(|&i| i == index) {
                idle.swap_remove(pos);
                self.num_idle.fetch_sub(1, SeqCst);
                return false;
            }
            // A notifier popped us meanwhile and is about to unpark us.
        }
        let sleeper = &self.sleepers[index];
        loop {
            if sleeper.notified.swap(false, Acquire) {
                return !self.stop.load(SeqCst);
            }
            thread::park();
        }
    }
}

/// Whether the calling thread is a worker of some pool.
pub(crate) fn on_worker_thread() -> bool {
    WORKER.try_with(|w| w.get().0 != 0).unwrap_or(false)
}
