//! A mock op for the loom models: it owns real chain edges and a real
//! `Trigger`, and records grants and releases so models can assert on them.
#![allow(dead_code)]

use depflow::__loom::{Chain, Countdown, Edge, Grant, Owner};
use loom::cell::UnsafeCell;
use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering::*};
use loom::sync::{Arc, Notify};

pub struct Op {
    countdown: Countdown<usize>,
    ready: AtomicBool,
    /// Wakes the one thread that waits for this op to be granted.
    notify: Notify,
    fired: AtomicUsize,
    released: AtomicUsize,
    edges: Vec<Edge<Op>>,
}

impl Owner for Op {
    unsafe fn release(this: *const Self) {
        // SAFETY: the models keep every op alive until the end.
        unsafe { (*this).released.fetch_add(1, AcqRel) };
    }
}

impl Grant<()> for Op {
    fn grant(&self, _: &()) {
        if self.countdown.release().is_some() {
            self.fire();
        }
    }
}

impl Op {
    /// An op with one edge per entry of `writes` (true: mutates).
    pub fn new(writes: &[bool]) -> Arc<Op> {
        let op = Arc::new(Op {
            countdown: Countdown::new(writes.len() as u32),
            ready: AtomicBool::new(false),
            notify: Notify::new(),
            fired: AtomicUsize::new(0),
            released: AtomicUsize::new(0),
            edges: writes.iter().map(|&w| Edge::new(w)).collect(),
        });
        let ptr: *const Op = &*op;
        for e in &op.edges {
            // SAFETY: not linked yet.
            unsafe { e.set_owner(ptr) };
        }
        // SAFETY: parked once, before the guard is released.
        unsafe { op.countdown.park(7) };
        op
    }

    fn fire(&self) {
        assert_eq!(self.fired.fetch_add(1, AcqRel), 0, "op scheduled twice");
        self.ready.store(true, Release);
        self.notify.notify();
    }

    /// Appends edge `i` to `chain`.
    pub fn append(&self, chain: &Chain<Op>, i: usize) {
        // SAFETY: the op outlives the model; each edge is linked once.
        unsafe { chain.append(&self.edges[i], &()) };
    }

    /// Links edge `i` into `chain` without granting; returns whether the token
    /// was taken (then call `advance`).
    pub fn link(&self, chain: &Chain<Op>, i: usize) -> bool {
        // SAFETY: as for `append`.
        unsafe { chain.link(&self.edges[i]) }
    }

    /// Grants from edge `i`, whose token `link` took.
    pub fn advance(&self, chain: &Chain<Op>, i: usize) {
        // SAFETY: `link` returned true for this edge.
        unsafe { chain.advance(&self.edges[i], &()) }
    }

    /// Releases the pusher's guard (after all edges are appended).
    pub fn launch(&self) {
        if self.countdown.release().is_some() {
            self.fire();
        }
    }

    /// Appends a single-edge op and launches it.
    pub fn push1(&self, chain: &Chain<Op>) {
        self.append(chain, 0);
        self.launch();
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Acquire)
    }

    /// Blocks until the op is granted (one waiting thread per op).
    pub fn wait_ready(&self) {
        while !self.is_ready() {
            self.notify.wait();
        }
    }

    /// Completes edge `i` in `chain`.
    pub fn complete(&self, chain: &Chain<Op>, i: usize) {
        assert!(self.is_ready(), "completing an op that was never granted");
        let e = &self.edges[i];
        // SAFETY: the op was granted; each edge is completed once.
        unsafe {
            if e.is_write() {
                chain.complete_write(e, &());
            } else {
                chain.complete_read(&());
            }
        }
    }

    /// Whether edge `i` mutates its variable.
    pub fn is_write(&self, i: usize) -> bool {
        self.edges[i].is_write()
    }

    pub fn released(&self) -> usize {
        self.released.load(Acquire)
    }

    pub fn edges(&self) -> usize {
        self.edges.len()
    }
}

/// The data a variable guards: loom flags any access not ordered by grants.
pub struct Data(UnsafeCell<u64>);

impl Data {
    pub fn new() -> Arc<Data> {
        Arc::new(Data(UnsafeCell::new(0)))
    }

    pub fn read(&self) -> u64 {
        self.0.with(|p| unsafe { *p })
    }

    pub fn write(&self, v: u64) {
        self.0.with_mut(|p| unsafe { *p = v })
    }
}

pub fn chain() -> Arc<Chain<Op>> {
    Arc::new(Chain::default())
}

/// After a model: every op fired once and every edge was released once.
pub fn assert_clean(ops: &[&Arc<Op>]) {
    for op in ops {
        assert!(op.is_ready(), "an op was never granted");
        assert_eq!(
            op.released(),
            op.edges(),
            "edges released {} times",
            op.released()
        );
    }
}
