//! The work-stealing CPU pool.
//!
//! - Each worker has a FIFO deque and a LIFO slot. An op made ready by a
//!   worker (typically by the op it just completed) goes to that worker's LIFO
//!   slot and runs next, hot in cache: a dependency chain is handed off without
//!   crossing threads. The slot's previous occupant moves to the deque, where
//!   other workers can steal it. A worker takes the LIFO slot at most
//!   `LIFO_STREAK` times in a row, so older work is not starved.
//! - Ops made ready on other threads (the pushing thread, a timer) go to the
//!   shared injector.
//! - Ops with a non-zero priority go to a shared heap: positive priorities run
//!   before any other ready op, negative ones after; equal priorities in the
//!   order they became ready. Priorities only order *ready* ops; they never
//!   override dependencies.
//! - A worker without work spins a little (yielding the CPU), then parks.
//!   Making work available wakes a parked worker only when no worker is
//!   already searching; a searcher that finds work wakes the next one if work
//!   is left. So a steady producer does not pay a futex wake per op.

use std::cell::{Cell, OnceCell};
use std::cmp::Ordering as CmpOrdering;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::*, fence};
use std::sync::{Arc, OnceLock};

use crate::loom::sync::Mutex;
use std::thread::{self, JoinHandle, Thread};

use crossbeam_deque::{Injector, Steal, Stealer, Worker};

use super::Queue;
use crate::op::Runner;

/// How many times in a row a worker may take its LIFO slot.
const LIFO_STREAK: u32 = 64;
/// How many yielding rounds an idle worker looks for work before parking.
const SPIN_ROUNDS: u32 = 64;
/// Every this many ops a worker looks at the shared queues first (fairness).
const GLOBAL_CHECK_INTERVAL: u32 = 61;

pub(crate) struct Pool {
    inner: Arc<Inner>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

struct Inner {
    injector: Injector<Runner>,
    stealers: Box<[Stealer<Runner>]>,
    sleepers: Box<[Sleeper]>,
    /// Parked workers.
    idle: Mutex<Vec<usize>>,
    num_idle: AtomicUsize,
    /// Workers awake and looking for work.
    searching: AtomicUsize,
    prio: Mutex<PrioHeap>,
    prio_len: AtomicUsize,
    stop: AtomicBool,
}

#[derive(Default)]
struct Sleeper {
    notified: AtomicBool,
    thread: OnceLock<Thread>,
}

#[derive(Default)]
struct PrioHeap {
    heap: BinaryHeap<Prioritized>,
    seq: u64,
}

struct Prioritized {
    priority: i32,
    seq: u64,
    runner: Runner,
}

impl PartialEq for Prioritized {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == CmpOrdering::Equal
    }
}
impl Eq for Prioritized {}
impl PartialOrd for Prioritized {
    fn partial_cmp(&self, other: &Self) -> Option<CmpOrdering> {
        Some(self.cmp(other))
    }
}
impl Ord for Prioritized {
    fn cmp(&self, other: &Self) -> CmpOrdering {
        // Higher priority first; among equals, the one that became ready first.
        self.priority
            .cmp(&other.priority)
            .then_with(|| other.seq.cmp(&self.seq))
    }
}

/// A worker's own state, in its thread's `LOCAL`.
struct Local {
    /// The address of its pool, to recognise it (never dereferenced).
    pool: usize,
    index: usize,
    deque: Worker<Runner>,
    lifo: Cell<Option<Runner>>,
    streak: Cell<u32>,
    tick: Cell<u32>,
}

crate::loom::thread::thread_local! {
    /// The pool worker running on this thread, if any.
    static LOCAL: OnceCell<Local> = const { OnceCell::new() };
}

impl Pool {
    pub(crate) fn new(name: &str, threads: usize) -> std::io::Result<Self> {
        let deques: Vec<Worker<Runner>> = (0..threads).map(|_| Worker::new_fifo()).collect();
        let inner = Arc::new(Inner {
            injector: Injector::new(),
            stealers: deques.iter().map(Worker::stealer).collect(),
            sleepers: (0..threads).map(|_| Sleeper::default()).collect(),
            idle: Mutex::new(Vec::with_capacity(threads)),
            num_idle: AtomicUsize::new(0),
            searching: AtomicUsize::new(0),
            prio: Mutex::new(PrioHeap::default()),
            prio_len: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
        });
        let pool = Pool {
            inner: inner.clone(),
            threads: Mutex::new(Vec::with_capacity(threads)),
        };
        for (index, deque) in deques.into_iter().enumerate() {
            let inner = inner.clone();
            let handle = thread::Builder::new()
                .name(format!("depflow-{name}-{index}"))
                .spawn(move || inner.work(index, deque))?; // on error `pool` drops: stops the others
            pool.threads.lock().push(handle);
        }
        Ok(pool)
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("threads", &self.inner.sleepers.len())
            .field("idle", &self.inner.num_idle.load(Relaxed))
            .finish()
    }
}

impl Queue for Pool {
    #[inline]
    fn schedule(&self, runner: Runner, yielded: bool) {
        let inner = &*self.inner;
        let priority = runner.metadata().priority();
        if priority != 0 {
            inner.push_prio(runner, priority);
            inner.notify();
            return;
        }
        let foreign = LOCAL.with(|cell| match cell.get() {
            Some(local) if local.pool == inner as *const Inner as usize => {
                if yielded {
                    // A yielding op goes behind the others.
                    local.deque.push(runner);
                } else if let Some(previous) = local.lifo.replace(Some(runner)) {
                    local.deque.push(previous);
                } else {
                    return None; // this worker runs it next
                }
                inner.notify();
                None
            }
            _ => Some(runner),
        });
        if let Some(runner) = foreign {
            inner.injector.push(runner);
            inner.notify();
        }
    }

    fn shutdown(&self) {
        let inner = &*self.inner;
        inner.stop.store(true, SeqCst);
        for sleeper in inner.sleepers.iter() {
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

impl Inner {
    /// A worker thread's main loop.
    fn work(&self, index: usize, deque: Worker<Runner>) {
        let _ = self.sleepers[index].thread.set(thread::current());
        LOCAL.with(|cell| {
            let local = cell.get_or_init(|| Local {
                pool: self as *const Inner as usize,
                index,
                deque,
                lifo: Cell::new(None),
                streak: Cell::new(0),
                tick: Cell::new(0),
            });
            self.run(local);
        });
    }

    fn run(&self, local: &Local) {
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
                    crate::op::reclaim::collect();
                    if self.stop.load(SeqCst) && !self.has_work() {
                        return;
                    }
                    searching = self.park(local.index);
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
            // Before idling, free what ops run here pushed and have finished.
            crate::op::reclaim::collect();
            if self.stop.load(SeqCst) && !self.has_work() {
                return;
            }
            searching = self.park(local.index);
        }
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
    fn next(&self, local: &Local) -> Option<Runner> {
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

    fn steal_injector(&self, local: &Local) -> Option<Runner> {
        loop {
            match self.injector.steal_batch_and_pop(&local.deque) {
                Steal::Success(job) => return Some(job),
                Steal::Empty => return None,
                Steal::Retry => {}
            }
        }
    }

    fn push_prio(&self, runner: Runner, priority: i32) {
        let mut prio = self.prio.lock();
        prio.seq += 1;
        let seq = prio.seq;
        prio.heap.push(Prioritized {
            priority,
            seq,
            runner,
        });
        self.prio_len.fetch_add(1, SeqCst);
    }

    /// Pops the highest-priority op; with `positive_only`, only if its
    /// priority is above the default (0).
    fn pop_prio(&self, positive_only: bool) -> Option<Runner> {
        let mut prio = self.prio.lock();
        if positive_only && prio.heap.peek()?.priority <= 0 {
            return None;
        }
        let job = prio.heap.pop()?;
        self.prio_len.fetch_sub(1, SeqCst);
        Some(job.runner)
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
