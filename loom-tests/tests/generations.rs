//! Loom models of `wait_all`'s generations: waits racing the ops they wait
//! for, and other pushes.
#![cfg(loom)]

use std::future::poll_fn;

use depflow::__loom::{Generations, Signal};
use loom::sync::Arc;
use loom::sync::atomic::{AtomicBool, Ordering::*};
use loom::thread;

fn block_on(signal: &Signal) {
    loom::future::block_on(poll_fn(|cx| signal.poll_fired(cx)));
}

/// A wait started after an op was counted in returns only after that op is
/// counted out, on whatever thread.
#[test]
fn wait_sees_op_pushed_before() {
    loom::model(|| {
        let pending = Arc::new(Generations::default());
        let done = Arc::new(AtomicBool::new(false));
        let g = pending.enter();
        let op = thread::spawn({
            let (pending, done) = (pending.clone(), done.clone());
            move || {
                done.store(true, Release);
                pending.leave(g);
            }
        });
        let signal = pending.wait();
        block_on(&signal);
        assert!(done.load(Acquire), "wait returned before the op finished");
        op.join().unwrap();
    });
}

/// A push racing the wait's flip either counts in the closed generation
/// (and is waited for) or in the open one; no lost wake-up either way.
#[test]
fn push_races_wait() {
    loom::model(|| {
        let pending = Arc::new(Generations::default());
        let g0 = pending.enter();
        let pusher = thread::spawn({
            let pending = pending.clone();
            move || {
                let g = pending.enter();
                pending.leave(g);
            }
        });
        let finisher = thread::spawn({
            let pending = pending.clone();
            move || pending.leave(g0)
        });
        block_on(&pending.wait());
        pusher.join().unwrap();
        finisher.join().unwrap();
        assert_eq!(pending.in_flight(), 0);
    });
}

/// Two waiters, one arriving while the other's drain is in progress, both
/// return once the op they wait for is out.
#[test]
fn two_waiters() {
    loom::model(|| {
        let pending = Arc::new(Generations::default());
        let g = pending.enter();
        let waiters: Vec<_> = (0..2)
            .map(|_| {
                let pending = pending.clone();
                thread::spawn(move || block_on(&pending.wait()))
            })
            .collect();
        pending.leave(g);
        for w in waiters {
            w.join().unwrap();
        }
    });
}

/// A push that straddles one wait (counted in just as the wait closes its
/// generation) must be covered by the next wait, even though it was not
/// necessarily covered by the first.
#[test]
fn straddling_push_is_covered_by_next_wait() {
    loom::model(|| {
        let pending = Arc::new(Generations::default());
        let entered = Arc::new(AtomicBool::new(false));
        let finished = Arc::new(AtomicBool::new(false));
        let pusher = thread::spawn({
            let (pending, entered, finished) = (pending.clone(), entered.clone(), finished.clone());
            move || {
                let g = pending.enter();
                entered.store(true, Release);
                finished.store(true, Release);
                pending.leave(g);
            }
        });
        block_on(&pending.wait());
        if entered.load(Acquire) {
            block_on(&pending.wait());
            assert!(
                finished.load(Acquire),
                "a wait missed an op counted in before it"
            );
        }
        pusher.join().unwrap();
    });
}
