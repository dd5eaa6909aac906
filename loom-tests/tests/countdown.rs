//! Loom model of an op's countdown and the hand-off of its parked runnable.
#![cfg(loom)]

use depflow::__loom::Countdown;
use loom::sync::Arc;
use loom::sync::atomic::{AtomicUsize, Ordering::*};
use loom::thread;

/// Grants arrive on two threads, possibly before the pusher has parked the
/// runnable; the pusher's guard makes sure exactly one thread takes it, once,
/// after it was parked.
#[test]
fn parked_runnable_hand_off() {
    loom::model(|| {
        let countdown = Arc::new(Countdown::<Arc<AtomicUsize>>::new(2));
        let runs = Arc::new(AtomicUsize::new(0));
        let granters: Vec<_> = (0..2)
            .map(|_| {
                let countdown = countdown.clone();
                thread::spawn(move || {
                    if let Some(r) = countdown.release() {
                        r.fetch_add(1, AcqRel);
                    }
                })
            })
            .collect();
        // SAFETY: parked once, before the guard below is released.
        unsafe { countdown.park(runs.clone()) };
        if let Some(r) = countdown.release() {
            r.fetch_add(1, AcqRel);
        }
        for g in granters {
            g.join().unwrap();
        }
        assert_eq!(runs.load(Acquire), 1, "the runnable must run exactly once");
    });
}
