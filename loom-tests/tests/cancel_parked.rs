//! Loom models of a cancel of an op parked for its units
//! (`src/dep/start.rs`, *A cancel of an op parked for its units*;
//! `src/core/tickets.rs`, *Withdrawing*), on the real ops through the
//! no-op host: the cancel races the grant that a release of the units
//! makes, or the op's parking as its variable is granted. Either way the
//! op is dispatched exactly once (a grant and a withdrawal of the same op
//! would dispatch it twice, or find nothing to withdraw and panic), it
//! finishes as cancelled without running its body, no unit is lost or
//! kept, and nothing is left parked.
#![cfg(loom)]

use depflow::__loom::{Harness, reclaim_finished};
use depflow::Error;
use loom::sync::Arc;
use loom::sync::atomic::{AtomicBool, Ordering::SeqCst};
use loom::thread;

/// `holder` holds the one unit; `parked` waits for it. A worker runs the
/// holder, whose end gives the unit back and grants `parked` (unless the
/// cancel holds it); the cancel races that.
#[test]
fn a_cancel_races_the_grant_of_a_parked_op() {
    loom::model(|| {
        let h = Harness::new();
        let slot = h.resource("slot", 1);
        let (a, b) = (h.var(()), h.var(()));
        let holder = h.push_using("holder", &[&a], &slot, 1, |_| Ok(())).unwrap();
        let ran = Arc::new(AtomicBool::new(false));
        let parked = h
            .push_using("parked", &[&b], &slot, 1, {
                let ran = ran.clone();
                move |_| {
                    ran.store(true, SeqCst);
                    Ok(())
                }
            })
            .unwrap();
        drop((a, b));
        assert_eq!(h.waiting_for_units(), 1);
        let worker = thread::spawn({
            let h = h.clone();
            move || h.run_next() // the holder
        });
        assert!(parked.cancel(), "it cannot have started");
        worker.join().unwrap();
        // Granted by the release or withdrawn by the cancel: dispatched
        // once, either way.
        assert!(h.run_one(), "the cancelled op was never dispatched");
        assert!(!h.run_one(), "an op dispatched twice");
        holder.wait().unwrap();
        assert!(matches!(parked.wait(), Err(Error::Cancelled)));
        assert!(!ran.load(SeqCst));
        assert_eq!(slot.in_use(), 0);
        assert_eq!(h.waiting_for_units(), 0);
        assert_eq!(h.retired(), 2);
        reclaim_finished();
    });
}

/// `parked` becomes ready (and asks for the unit the not-yet-run `holder`
/// has) when `first`, on its variable, ends on a worker; the cancel races
/// its parking: it parks and the cancel takes it out, or the cancel comes
/// first and it does not park.
#[test]
fn a_cancel_races_the_parking_of_an_op() {
    loom::model(|| {
        let h = Harness::new();
        let slot = h.resource("slot", 1);
        let (a, b) = (h.var(()), h.var(()));
        let first = h.push("first", &[], &[&b], |_| Ok(())).unwrap();
        let holder = h.push_using("holder", &[&a], &slot, 1, |_| Ok(())).unwrap();
        let ran = Arc::new(AtomicBool::new(false));
        let parked = h
            .push_using("parked", &[&b], &slot, 1, {
                let ran = ran.clone();
                move |_| {
                    ran.store(true, SeqCst);
                    Ok(())
                }
            })
            .unwrap();
        drop((a, b));
        let worker = thread::spawn({
            let h = h.clone();
            move || h.run_next() // `first`, dispatched before the holder
        });
        assert!(parked.cancel(), "it cannot have started");
        worker.join().unwrap();
        // Only the holder ran here after: the cancelled op was dispatched
        // without the unit, which the holder still has.
        let mut runs = 0;
        while h.run_one() {
            runs += 1;
        }
        assert_eq!(runs, 2, "the holder and the cancelled op, once each");
        first.wait().unwrap();
        holder.wait().unwrap();
        assert!(matches!(parked.wait(), Err(Error::Cancelled)));
        assert!(!ran.load(SeqCst));
        assert_eq!(slot.in_use(), 0);
        assert_eq!(h.waiting_for_units(), 0);
        assert_eq!(h.retired(), 3);
        reclaim_finished();
    });
}
