//! Loom models of one variable's chain (`src/core/chain.rs`): appends,
//! grants and completions, with a minimal owner standing in for ops (the
//! real ops are modelled in `ops.rs`).
#![cfg(loom)]

use loom::thread;
use mock::{Data, Op, assert_clean, chain};

/// An append races the completion of the write ahead of it (the token
/// holder may go idle, find the new edge, or hand over via PASSED).
#[test]
fn append_races_write_completion() {
    loom::model(|| {
        let c = chain();
        let data = Data::new();
        let w1 = Op::new(true);
        w1.push(&c);
        assert!(
            w1.is_ready(),
            "a write on an idle variable is granted at once"
        );

        let t = thread::spawn({
            let (c, w1, data) = (c.clone(), w1.clone(), data.clone());
            move || {
                data.write(1);
                w1.complete(&c);
            }
        });
        let r2 = Op::new(false);
        r2.push(&c);
        r2.wait_ready();
        assert_eq!(data.read(), 1, "read granted before the write completed");
        r2.complete(&c);
        t.join().unwrap();
        assert_clean(&[&w1, &r2]);
    });
}

/// Read, read, then write: both reads run at once; the write waits for both,
/// and the last reader out grants it exactly once.
#[test]
fn read_read_then_write() {
    loom::model(|| {
        let c = chain();
        let data = Data::new();
        let (r1, r2, w3) = (Op::new(false), Op::new(false), Op::new(true));
        r1.push(&c);
        r2.push(&c);
        w3.push(&c);
        assert!(
            r1.is_ready() && r2.is_ready(),
            "reads on an idle variable run at once"
        );
        assert!(!w3.is_ready(), "the write must wait for the reads");

        let readers: Vec<_> = [r1.clone(), r2.clone()]
            .into_iter()
            .map(|r| {
                let (c, data) = (c.clone(), data.clone());
                thread::spawn(move || {
                    assert_eq!(data.read(), 0);
                    r.complete(&c);
                })
            })
            .collect();
        w3.wait_ready();
        data.write(3);
        w3.complete(&c);
        for r in readers {
            r.join().unwrap();
        }
        assert_clean(&[&r1, &r2, &w3]);
    });
}

/// Write, then read, read: the reads are granted together when the write
/// completes, and see its effect.
#[test]
fn write_then_read_read() {
    loom::model(|| {
        let c = chain();
        let data = Data::new();
        let (w1, r2, r3) = (Op::new(true), Op::new(false), Op::new(false));
        w1.push(&c);
        r2.push(&c);
        r3.push(&c);
        assert!(!r2.is_ready() && !r3.is_ready());

        let readers: Vec<_> = [r2.clone(), r3.clone()]
            .into_iter()
            .map(|r| {
                let (c, data) = (c.clone(), data.clone());
                thread::spawn(move || {
                    r.wait_ready();
                    assert_eq!(data.read(), 1);
                    r.complete(&c);
                })
            })
            .collect();
        data.write(1);
        w1.complete(&c);
        for r in readers {
            r.join().unwrap();
        }
        assert_clean(&[&w1, &r2, &r3]);
    });
}

/// The last reader releases a write that is appended (and parks) while the
/// reads are completing.
#[test]
fn last_reader_releases_parked_writer() {
    loom::model(|| {
        let c = chain();
        let data = Data::new();
        let (r1, r2) = (Op::new(false), Op::new(false));
        r1.push(&c);
        r2.push(&c);
        let t = thread::spawn({
            let (c, r1, data) = (c.clone(), r1.clone(), data.clone());
            move || {
                assert_eq!(data.read(), 0);
                r1.complete(&c);
            }
        });
        let w3 = Op::new(true);
        let t2 = thread::spawn({
            let (c, w3) = (c.clone(), w3.clone());
            move || w3.push(&c)
        });
        assert_eq!(data.read(), 0);
        r2.complete(&c);
        t.join().unwrap();
        t2.join().unwrap();
        w3.wait_ready();
        data.write(1);
        w3.complete(&c);
        assert_clean(&[&r1, &r2, &w3]);
    });
}

/// Two threads append to one chain concurrently while a third completes the
/// op ahead of them: each append is granted once, in some valid order, and
/// the write never overlaps a read.
#[test]
fn concurrent_appends_and_completion() {
    loom::model(|| {
        let c = chain();
        let data = Data::new();
        let w0 = Op::new(true);
        w0.push(&c);
        let (r, w) = (Op::new(false), Op::new(true));
        let tr = thread::spawn({
            let (c, r, data) = (c.clone(), r.clone(), data.clone());
            move || {
                r.push(&c);
                r.wait_ready();
                let _ = data.read();
                r.complete(&c);
            }
        });
        let tw = thread::spawn({
            let (c, w, data) = (c.clone(), w.clone(), data.clone());
            move || {
                w.push(&c);
                w.wait_ready();
                data.write(2);
                w.complete(&c);
            }
        });
        data.write(1);
        w0.complete(&c);
        tr.join().unwrap();
        tw.join().unwrap();
        assert_clean(&[&w0, &r, &w]);
    });
}

/// A minimal owner for the chain (its no-op host): one edge, a real
/// countdown, and counts of grants and releases that the models assert on.
mod mock {
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
        edge: Edge<Op>,
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
        /// An op on one variable, mutating it if `write`.
        pub fn new(write: bool) -> Arc<Op> {
            let op = Arc::new(Op {
                countdown: Countdown::new(1),
                ready: AtomicBool::new(false),
                notify: Notify::new(),
                fired: AtomicUsize::new(0),
                released: AtomicUsize::new(0),
                edge: Edge::new(write),
            });
            // SAFETY: not linked yet.
            unsafe { op.edge.set_owner(&*op) };
            // SAFETY: parked once, before the guard is released.
            unsafe { op.countdown.park(7) };
            op
        }

        fn fire(&self) {
            assert_eq!(self.fired.fetch_add(1, AcqRel), 0, "op scheduled twice");
            self.ready.store(true, Release);
            self.notify.notify();
        }

        /// Appends the op to `chain` and releases the pusher's guard.
        pub fn push(&self, chain: &Chain<Op>) {
            // SAFETY: the op outlives the model; its edge is linked once.
            unsafe { chain.append(&self.edge, &()) };
            if self.countdown.release().is_some() {
                self.fire();
            }
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

        /// Completes the op's edge in `chain`.
        pub fn complete(&self, chain: &Chain<Op>) {
            assert!(self.is_ready(), "completing an op that was never granted");
            // SAFETY: the op was granted; its edge is completed once.
            unsafe {
                if self.edge.is_write() {
                    chain.complete_write(&self.edge, &());
                } else {
                    chain.complete_read(&());
                }
            }
        }

        pub fn released(&self) -> usize {
            self.released.load(Acquire)
        }
    }

    /// The data a variable guards: loom flags any access not ordered by grants.
    pub struct Data(UnsafeCell<u64>);

    impl Data {
        pub fn new() -> Arc<Data> {
            Arc::new(Data(UnsafeCell::new(0)))
        }

        pub fn read(&self) -> u64 {
            // SAFETY: loom checks that the grants order the accesses.
            self.0.with(|p| unsafe { *p })
        }

        pub fn write(&self, v: u64) {
            // SAFETY: as above.
            self.0.with_mut(|p| unsafe { *p = v })
        }
    }

    pub fn chain() -> Arc<Chain<Op>> {
        Arc::new(Chain::default())
    }

    /// After a model: every op fired once and its edge was released once.
    pub fn assert_clean(ops: &[&Arc<Op>]) {
        for op in ops {
            assert!(op.is_ready(), "an op was never granted");
            assert_eq!(op.released(), 1, "edge released {} times", op.released());
        }
    }
}
