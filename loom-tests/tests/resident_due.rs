//! Loom model of a slow recorded step woken by two fences (issue 35, item
//! 13; `src/core/due.rs`, as `src/dep/resident.rs` and
//! `src/graph/run_slow.rs` drive it): a stream op skipped on a poisoned
//! input waits, through its resident task's waker, for two other lanes'
//! fences on what it mutates, which two threads complete. Each fence wakes
//! the task; the second wake may come after the step has ended, or once
//! the next replay has armed. The step's due bit must make it end once per
//! replay: its successor (a host op) satisfied once, the replay over once,
//! after its end, and no leftover wake running it again.
//!
//! The fences, the countdowns and the due bit are the engine's own; the
//! resident task is a stand-in with async-task's rules that matter here:
//! a wake schedules it unless it is scheduled already, a wake while it
//! runs schedules it again after the run, runs never overlap.
//!
//! Seen failing: with `on_wake` made to return `Due` always, loom finds the
//! step ending twice.
#![cfg(loom)]

use std::future::poll_fn;
use std::sync::Arc as StdArc;
use std::task::{Context, Poll, Wake, Waker};

use depflow::__loom::{Countdowns, Fence, Satisfied, Wake as DueWake, end_due, make_due, on_wake};
use loom::sync::atomic::{AtomicU8, AtomicUsize, Ordering::AcqRel};
use loom::sync::{Arc, Condvar, Mutex};
use loom::thread;

/// The step's successor, the host op (the step is op 0).
const HOST: u32 = 1;

/// The resident task's run queue: whether it is scheduled, and whether the
/// model is over (its thread then stops).
#[derive(Default)]
struct Queue {
    scheduled: bool,
    shut: bool,
}

/// What the task's thread and the wakers share.
struct Task {
    queue: Mutex<Queue>,
    woken: Condvar,
}

impl Wake for Task {
    fn wake(self: StdArc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &StdArc<Self>) {
        self.queue.lock().unwrap().scheduled = true;
        self.woken.notify_one();
    }
}

/// One graph: the step's status word, two fences it waits for, the
/// countdowns, and what ran.
struct Graph {
    status: AtomicU8,
    fences: [StdArc<Fence<(), ()>>; 2],
    countdowns: Countdowns,
    /// The step's ends (a skip: it counts its versions, as the engine's).
    ends: AtomicUsize,
    /// Runs of the host op after it (it must run once per replay here: the
    /// model's skip does not poison).
    host_runs: AtomicUsize,
    /// Runs of the task that found the step not due.
    stale: AtomicUsize,
}

impl Graph {
    /// One run of the step's task (`ResidentFuture::poll`, then
    /// `run_slow`'s skip path): gated by the due bit, then waiting for both
    /// fences (registering `waker` on each pending one), then ending.
    fn run_step(&self, waker: &Waker) {
        if on_wake(&self.status) == DueWake::Stale {
            self.stale.fetch_add(1, AcqRel);
            return;
        }
        let mut cx = Context::from_waker(waker);
        let mut waiting = false;
        for f in &self.fences {
            if f.poll_done(&mut cx).is_pending() {
                waiting = true;
            }
        }
        if waiting {
            return;
        }
        self.ends.fetch_add(1, AcqRel);
        end_due(&self.status);
        if self.countdowns.satisfy(HOST) == Satisfied::Ready {
            // Woken onto another thread in the engine; run here (its
            // count-out is this thread's too, after the step's).
            self.host_runs.fetch_add(1, AcqRel);
            let _ = self.countdowns.op_done();
        }
        // The last thing touched.
        let _ = self.countdowns.op_done();
    }
}

/// Runs the task each time it is scheduled, until the model shuts it.
fn task_thread(graph: Arc<Graph>, task: StdArc<Task>) {
    let waker = Waker::from(task.clone());
    loop {
        {
            let mut q = task.queue.lock().unwrap();
            while !q.scheduled && !q.shut {
                q = task.woken.wait(q).unwrap();
            }
            if !q.scheduled {
                return;
            }
            q.scheduled = false;
        }
        graph.run_step(&waker);
    }
}

/// The step is made ready as the replay arms; the main thread and a poller
/// complete the two fences it waits for. The replay is over once, after
/// the step's only end and the host op's only run; then the next replay
/// arms (the step not yet ready there) and the task is shut: whatever
/// wakes were left ran nothing.
#[test]
fn a_step_woken_by_two_fences_ends_once_per_replay() {
    loom::model(|| {
        let graph = Arc::new(Graph {
            status: AtomicU8::new(0),
            fences: [
                StdArc::new(Fence::new(0, 0, ())),
                StdArc::new(Fence::new(0, 1, ())),
            ],
            countdowns: Countdowns::new(2),
            ends: AtomicUsize::new(0),
            host_runs: AtomicUsize::new(0),
            stale: AtomicUsize::new(0),
        });
        let task = StdArc::new(Task {
            queue: Mutex::new(Queue::default()),
            woken: Condvar::new(),
        });
        let runner = {
            let (graph, task) = (graph.clone(), task.clone());
            thread::spawn(move || task_thread(graph, task))
        };
        // Arms: the step is a root, the host op waits for it.
        assert!(graph.countdowns.arm(&[0, 1]));
        make_due(&graph.status);
        task.wake_by_ref();
        let poller = {
            let fence = graph.fences[1].clone();
            thread::spawn(move || fence.complete(Ok(())))
        };
        graph.fences[0].complete(Ok(()));
        loom::future::block_on(poll_fn(|cx| graph.countdowns.poll_done(cx)));
        assert_eq!(graph.ends.load(AcqRel), 1, "the step ended once");
        assert_eq!(graph.host_runs.load(AcqRel), 1, "its successor ran once");
        // The next replay arms while a fence's wake may still be on its
        // way: the step is not ready there (its predecessor, say, runs).
        assert!(graph.countdowns.arm(&[1, 1]));
        poller.join().unwrap();
        {
            task.queue.lock().unwrap().shut = true;
            task.woken.notify_one();
        }
        runner.join().unwrap();
        assert_eq!(graph.ends.load(AcqRel), 1, "no leftover wake ran the step");
        assert_eq!(graph.host_runs.load(AcqRel), 1);
        assert!(
            graph
                .countdowns
                .poll_done(&mut Context::from_waker(Waker::noop()))
                == Poll::Pending,
            "the next replay is not over"
        );
    });
}
