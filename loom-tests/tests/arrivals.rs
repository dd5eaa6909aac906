//! Loom models of `core::arrivals`: parties arriving on other threads while
//! the task registers its waker (the NCCL all-reduce's GPU callbacks racing
//! its body).
#![cfg(loom)]

use std::future::poll_fn;

use depflow::__loom::Arrivals;
use loom::sync::Arc;
use loom::sync::atomic::{AtomicUsize, Ordering::*};
use loom::thread;

/// Two parties on two threads, one failing: the task returns (no lost
/// wake-up) only after both arrived, sees what each wrote before arriving,
/// and gets the failure.
#[test]
fn the_task_wakes_after_every_party_with_the_failure() {
    loom::model(|| {
        let arrivals = Arc::new(Arrivals::new(2));
        let written = Arc::new(AtomicUsize::new(0));
        let parties: Vec<_> = [None, Some(7u32)]
            .into_iter()
            .map(|failure| {
                let (arrivals, written) = (arrivals.clone(), written.clone());
                thread::spawn(move || {
                    // The party's work (a device's copy back), then its arrival.
                    written.fetch_add(1, Relaxed);
                    arrivals.arrive(failure);
                })
            })
            .collect();
        let failed = loom::future::block_on(poll_fn(|cx| arrivals.poll_arrived(cx)));
        assert_eq!(written.load(Relaxed), 2, "woken before every party arrived");
        assert_eq!(failed, Some(7));
        for p in parties {
            p.join().unwrap();
        }
    });
}

/// Both parties fail: the first failure to be stored is the one returned,
/// and it is one of the two.
#[test]
fn one_of_the_failures_is_returned() {
    loom::model(|| {
        let arrivals = Arc::new(Arrivals::new(2));
        let other = thread::spawn({
            let arrivals = arrivals.clone();
            move || arrivals.arrive(Some(1u32))
        });
        arrivals.arrive(Some(2));
        let failed = loom::future::block_on(poll_fn(|cx| arrivals.poll_arrived(cx)));
        assert!(matches!(failed, Some(1 | 2)), "{failed:?}");
        other.join().unwrap();
    });
}
