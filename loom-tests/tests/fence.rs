//! Loom models of the event-completion transitions of stream devices
//! (`src/core/fence.rs`, `src/device/sim.rs`): a fence completing while a
//! dependent registers on it, and a host waiter and a device waiter on one
//! write, both seeing the work that the write's event covers.
#![cfg(loom)]

use std::future::poll_fn;
use std::sync::Arc as StdArc;

use depflow::__loom::{Fence, SimEvent, VarFences};
use loom::sync::Arc;
use loom::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use loom::thread;

/// The poller completing a fence races a dependent that was just granted
/// the variable: the dependent reads the variable's fences and registers its
/// waker. It is never left waiting (loom reports a deadlock if the wake-up
/// is lost), and a failure is seen.
#[test]
fn fence_completing_while_a_dependent_registers() {
    loom::model(|| {
        let vars: Arc<VarFences<(), ()>> = Arc::new(VarFences::default());
        let fence = StdArc::new(Fence::<(), ()>::new(0, 0, ()));
        // The producer published its fence before giving the variable back.
        vars.set_write(fence.clone());
        let poller = thread::spawn({
            let fence = fence.clone();
            move || fence.complete(Ok(()))
        });
        // The dependent, a host op reading the variable.
        let mut pending = Vec::new();
        vars.for_each_pending(false, |f, write| {
            assert!(write);
            pending.push(f.clone());
        });
        for f in pending {
            let outcome = loom::future::block_on(poll_fn(|cx| f.poll_done(cx)));
            assert!(outcome.is_ok());
        }
        assert!(fence.is_done());
        poller.join().unwrap();
        assert!(vars.write_failure().is_none());
    });
}

/// A write on stream A; a host op and an op on stream B both read its
/// output. Stream A reaches the event after the work; the poller sees it and
/// completes the fence; stream B waits for the event on the device; the host
/// op waits for the fence. Both see the work (a relaxed store before the
/// event: only the event's happens-before edges make it visible), and
/// neither is left waiting.
#[test]
fn host_and_device_waiters_on_one_write() {
    // Four threads with two condvar waits: bounded tighter than the CI-wide
    // LOOM_MAX_PREEMPTIONS=4 (7.5 minutes on 2 cores) to stay affordable.
    let mut model = loom::model::Builder::new();
    model.preemption_bound = Some(3);
    model.check(|| {
        let memory = Arc::new(AtomicUsize::new(0));
        let event = StdArc::new(SimEvent::default());
        assert_eq!(event.next(), 1);
        let fence = StdArc::new(Fence::<_, ()>::new(0, 0, event.clone()));
        let vars: Arc<VarFences<StdArc<SimEvent>, ()>> = Arc::new(VarFences::default());
        vars.set_write(fence.clone());

        let stream_a = thread::spawn({
            let (memory, event) = (memory.clone(), event.clone());
            move || {
                memory.store(7, Relaxed); // the kernel
                event.signal(1); // the stream reaches the event's first use
            }
        });
        let poller = thread::spawn({
            let fence = fence.clone();
            move || {
                fence.event().wait(1);
                fence.complete(Ok(()));
            }
        });
        let stream_b = thread::spawn({
            let (memory, vars) = (memory.clone(), vars.clone());
            move || {
                // The launcher put a stream wait on B for the write's event.
                vars.for_each_pending(false, |f, _| f.event().wait(1));
                assert_eq!(memory.load(Relaxed), 7);
            }
        });
        // The host op.
        let mut pending = Vec::new();
        vars.for_each_pending(false, |f, _| pending.push(f.clone()));
        for f in pending {
            loom::future::block_on(poll_fn(|cx| f.poll_done(cx))).unwrap();
        }
        assert_eq!(memory.load(Relaxed), 7);
        stream_a.join().unwrap();
        poller.join().unwrap();
        stream_b.join().unwrap();
    });
}

/// Two device reads append their fences while the poller completes the
/// first; the next writer sees every read still in flight (and none is
/// lost to the pruning of done ones).
#[test]
fn reads_append_while_one_completes() {
    loom::model(|| {
        let vars: Arc<VarFences<(), ()>> = Arc::new(VarFences::default());
        let first = StdArc::new(Fence::<(), ()>::new(0, 0, ()));
        let second = StdArc::new(Fence::<(), ()>::new(0, 1, ()));
        let reader = thread::spawn({
            let (vars, first) = (vars.clone(), first.clone());
            move || vars.add_read(first)
        });
        let poller = thread::spawn({
            let first = first.clone();
            move || first.complete(Ok(()))
        });
        vars.add_read(second.clone());
        reader.join().unwrap();
        poller.join().unwrap();
        // The writer (granted after both reads released): it must wait for
        // the second read, which is not done.
        let mut seen = Vec::new();
        vars.for_each_pending(true, |f, write| {
            assert!(!write);
            seen.push(f.clone());
        });
        assert!(seen.iter().any(|f| StdArc::ptr_eq(f, &second)));
        assert!(seen.iter().all(|f| !f.is_done()));
    });
}

/// A reused simulated event: a stream wait made for its first use is
/// satisfied by that use, whatever the second use does; a wait for the
/// second use needs the second signal.
#[test]
fn a_reused_event_keeps_each_waits_generation() {
    loom::model(|| {
        let event = StdArc::new(SimEvent::default());
        let first = event.next();
        let second = event.next();
        let stream = thread::spawn({
            let event = event.clone();
            move || {
                event.signal(first);
                event.signal(second);
            }
        });
        let waiter = thread::spawn({
            let event = event.clone();
            move || event.wait(first)
        });
        event.wait(second);
        assert!(event.is_reached(first));
        waiter.join().unwrap();
        stream.join().unwrap();
    });
}

/// A waiter registering while the poller completes the fence: if the
/// waiter was left pending (and told the event of it), the poller, reading
/// `was_waited` after completing, sees it, so its count of waited fences
/// comes back to zero.
#[test]
fn a_first_waiter_is_seen_by_the_completion() {
    loom::model(|| {
        let fence = StdArc::new(Fence::<(), ()>::new(0, 0, ()));
        let poller = thread::spawn({
            let fence = fence.clone();
            move || {
                fence.complete(Ok(()));
                fence.was_waited()
            }
        });
        let waker = std::task::Waker::noop();
        let pending = fence
            .poll_done(&mut std::task::Context::from_waker(waker))
            .is_pending();
        let seen = poller.join().unwrap();
        if pending {
            assert!(seen, "a waiter left pending was not counted");
        }
    });
}
