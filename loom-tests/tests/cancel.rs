//! Loom models of a cancel racing an op's start (`src/dep/start.rs`), on
//! the real ops through the no-op host (`Harness`, as in `ops.rs`): what
//! `cancel` answers always matches whether the body ran, and so do
//! `is_started` and the op's result, for sync and async bodies and for two
//! cancels at once.
#![cfg(loom)]

use depflow::__loom::{Harness, reclaim_finished};
use depflow::{BoxError, Error};
use loom::sync::Arc;
use loom::sync::atomic::{AtomicBool, Ordering::SeqCst};
use loom::thread;

/// A worker thread that runs the next `ops` ops the host dispatches.
fn spawn_worker(h: &Harness, ops: usize) -> thread::JoinHandle<()> {
    let h = h.clone();
    thread::spawn(move || {
        for _ in 0..ops {
            h.run_next();
        }
    })
}

/// The op's result agrees with `ran`, and so does `is_started` after it.
fn check_result(result: Result<(), Error>, ran: bool, started: bool) {
    match result {
        Ok(()) => assert!(ran, "succeeded without running its body"),
        Err(Error::Cancelled) => assert!(!ran, "cancelled, but its body ran"),
        Err(e) => panic!("{e:?}"),
    }
    assert_eq!(started, ran, "is_started says otherwise than the body");
}

/// A handle cancels a sync op while a worker starts it: `cancel` answers
/// true exactly when the body never ran (then the op is cancelled), false
/// exactly when it ran (then it succeeded).
#[test]
fn cancels_answer_matches_whether_the_body_ran() {
    loom::model(|| {
        let h = Harness::new();
        let v = h.var(());
        let ran = Arc::new(AtomicBool::new(false));
        let op = h
            .push("op", &[], &[&v], {
                let ran = ran.clone();
                move |_| {
                    ran.store(true, SeqCst);
                    Ok(())
                }
            })
            .unwrap();
        drop(v);
        let worker = spawn_worker(&h, 1);
        let not_run = op.cancel();
        worker.join().unwrap();
        let ran = ran.load(SeqCst);
        assert_eq!(
            not_run, !ran,
            "cancel answered {not_run}, the body ran: {ran}"
        );
        // Asked again after the end, it answers the same.
        assert_eq!(op.cancel(), not_run);
        let started = op.is_started();
        check_result(op.wait(), ran, started);
        assert_eq!(h.retired(), 1);
        reclaim_finished();
    });
}

/// The same for an async body, which starts at its first poll: a cancel
/// after that answers false, and the body runs to its end (across its
/// await point, a yield that wakes it again).
#[test]
fn cancels_answer_matches_whether_an_async_body_ran() {
    loom::model(|| {
        let h = Harness::new();
        let v = h.var(());
        let (began, ended) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicBool::new(false)),
        );
        let op = h
            .push_async("op", &[], &[&v], {
                let (began, ended) = (began.clone(), ended.clone());
                move |_ctx| async move {
                    began.store(true, SeqCst);
                    yield_once().await;
                    ended.store(true, SeqCst);
                    Ok::<_, BoxError>(())
                }
            })
            .unwrap();
        drop(v);
        // Two polls if it starts; one if it is cancelled first.
        let worker = thread::spawn({
            let h = h.clone();
            move || {
                h.run_next();
                while h.run_one() {}
            }
        });
        let not_run = op.cancel();
        worker.join().unwrap();
        let began = began.load(SeqCst);
        assert_eq!(not_run, !began, "cancel answered {not_run}, began: {began}");
        assert_eq!(ended.load(SeqCst), began, "a started body runs to its end");
        let started = op.is_started();
        check_result(op.wait(), began, started);
        reclaim_finished();
    });
}

/// Two handles' cancels race the start (from two threads): both answer
/// the same, and that answer matches the body.
#[test]
fn two_cancels_agree_with_the_start() {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(3);
    builder.check(|| {
        let h = Harness::new();
        let v = h.var(());
        let ran = Arc::new(AtomicBool::new(false));
        let op = Arc::new(
            h.push("op", &[], &[&v], {
                let ran = ran.clone();
                move |_| {
                    ran.store(true, SeqCst);
                    Ok(())
                }
            })
            .unwrap(),
        );
        drop(v);
        let worker = spawn_worker(&h, 1);
        let other = thread::spawn({
            let op = op.clone();
            move || op.cancel()
        });
        let mine = op.cancel();
        let theirs = other.join().unwrap();
        worker.join().unwrap();
        let ran = ran.load(SeqCst);
        assert_eq!((mine, theirs), (!ran, !ran), "the body ran: {ran}");
        let op = Arc::try_unwrap(op).expect("the other thread dropped its clone");
        let started = op.is_started();
        check_result(op.wait(), ran, started);
        reclaim_finished();
    });
}

/// Pending once (waking itself at once), then ready: an await point.
async fn yield_once() {
    let mut yielded = false;
    std::future::poll_fn(|cx| {
        if yielded {
            std::task::Poll::Ready(())
        } else {
            yielded = true;
            cx.waker().wake_by_ref();
            std::task::Poll::Pending
        }
    })
    .await
}
