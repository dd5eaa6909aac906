//! Loom models of the real ops (`src/dep/`): pushed through a no-op host
//! (`Harness`), run on model threads, with the engine's own blocks, chains,
//! countdowns, anchors, lifecycle, poison and reclamation lists. Only the
//! host is a stand-in: it queues what the ops dispatch until a model thread
//! runs it.
//!
//! The variables hold a loom cell, so that loom checks every access the
//! grants are meant to order; and a drop counter, so that a model sees its
//! ops freed (the last reference to a variable whose handle was dropped is
//! its last op's): exactly once, after every access.
//!
//! A thread that pushed ops ends with `exit_thread()`, what its exit does to
//! the ops it has not freed (`Adopted`'s destructor): loom does not order a
//! thread-local's destructor before `join`, so a model could not see those
//! frees otherwise.
#![cfg(loom)]

use depflow::__loom::{Harness, exit_thread, holds_pushed_ops, reclaim_finished};
use depflow::Error;
use loom::cell::UnsafeCell;
use loom::sync::atomic::{AtomicUsize, Ordering::AcqRel};
use loom::sync::{Arc, Mutex};
use loom::thread;

/// A variable's value: a cell loom watches, and a count of drops.
struct Cell {
    value: UnsafeCell<u64>,
    drops: Arc<AtomicUsize>,
}

// SAFETY: the value is reached only through an op's context, under the
// grants the models check; loom flags any access they do not order.
unsafe impl Sync for Cell {}

impl Cell {
    fn new(value: u64, drops: &Arc<AtomicUsize>) -> Self {
        Self {
            value: UnsafeCell::new(value),
            drops: drops.clone(),
        }
    }

    fn get(&self) -> u64 {
        // SAFETY: see `Sync` above.
        self.value.with(|p| unsafe { *p })
    }

    fn set(&self, v: u64) {
        // SAFETY: see `Sync` above.
        self.value.with_mut(|p| unsafe { *p = v })
    }
}

impl Drop for Cell {
    fn drop(&mut self) {
        self.drops.fetch_add(1, AcqRel);
    }
}

fn drops() -> Arc<AtomicUsize> {
    Arc::new(AtomicUsize::new(0))
}

/// Runs a model of three or more threads over two chains, bounded tighter
/// than the CI-wide LOOM_MAX_PREEMPTIONS=4: at 3 such a model takes about a
/// minute on 2 cores, at 4 over 8.
fn model_with_three_preemptions(model: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(3);
    builder.check(model);
}

/// Two variables of `h`, counting their drops in `dropped`.
fn two_vars(h: &Harness, dropped: &Arc<AtomicUsize>) -> (depflow::Var<Cell>, depflow::Var<Cell>) {
    (h.var(Cell::new(0, dropped)), h.var(Cell::new(0, dropped)))
}

/// A worker thread that runs the next `ops` ops the host dispatches.
fn spawn_worker(h: &Harness, ops: usize) -> thread::JoinHandle<()> {
    let h = h.clone();
    thread::spawn(move || {
        for _ in 0..ops {
            h.run_next();
        }
    })
}

/// Ends a model: every variable was freed when its last op retired (before
/// any pusher frees its ops' memory); then the main thread frees the ops it
/// pushed (other threads freed theirs when they exited, joined before).
fn finish_model(h: &Harness, ops: usize, drops: &AtomicUsize, vars: usize) {
    assert_eq!(h.retired(), ops, "every op retires once");
    assert_eq!(
        drops.load(AcqRel),
        vars,
        "every variable freed once, when the last op on it retired"
    );
    reclaim_finished();
    assert!(!holds_pushed_ops(), "the main thread freed all it pushed");
}

/// A write is running on a worker while another thread pushes a read of its
/// variable (appending behind it as it completes). The read runs after the
/// write, sees its value; each pusher frees its op (the main thread after
/// the write, the other thread once its read finished).
#[test]
fn a_read_appended_while_the_write_ahead_completes() {
    loom::model(|| {
        let h = Harness::new();
        let dropped = drops();
        let a = h.var(Cell::new(0, &dropped));
        let ka = a.key();
        let write = h
            .push("write", &[], &[&a], move |ctx| {
                ctx.write(ka)?.set(1);
                Ok(())
            })
            .unwrap();
        let worker = spawn_worker(&h, 2);
        let reader = thread::spawn({
            let (h, a) = (h.clone(), a.clone());
            move || {
                let read = h
                    .push("read", &[&a], &[], move |ctx| Ok(ctx.read(ka)?.get()))
                    .unwrap();
                assert_eq!(read.wait().unwrap(), 1, "the read ran before the write");
                exit_thread();
            }
        });
        drop(a);
        write.wait().unwrap();
        worker.join().unwrap();
        reader.join().unwrap();
        finish_model(&h, 2, &dropped, 1);
    });
}

/// Two threads push `(read A, mutate B)` and `(mutate A, read B)` at once:
/// both link under the push lock, so every chain sees them in one order, and
/// both run (no wait-for cycle), with the results of one serial order.
#[test]
fn ops_on_two_variables_pushed_at_once_agree_on_an_order() {
    // Two pushers and a worker over two chains.
    model_with_three_preemptions(|| {
        let h = Harness::new();
        let dropped = drops();
        let (a, b) = two_vars(&h, &dropped);
        let (ka, kb) = (a.key(), b.key());
        let pushers: Vec<_> = [true, false]
            .into_iter()
            .map(|a_to_b| {
                let (h, a, b) = (h.clone(), a.clone(), b.clone());
                thread::spawn(move || {
                    let (from, to): (&dyn depflow::AnyVar, &dyn depflow::AnyVar) =
                        if a_to_b { (&a, &b) } else { (&b, &a) };
                    h.push("cross", &[from], &[to], move |ctx| {
                        if a_to_b {
                            let v = ctx.read(ka)?.get();
                            ctx.write(kb)?.set(v + 10);
                        } else {
                            let v = ctx.read(kb)?.get();
                            ctx.write(ka)?.set(v + 100);
                        }
                        Ok(())
                    })
                    .unwrap()
                    .detach();
                    exit_thread();
                })
            })
            .collect();
        let worker = spawn_worker(&h, 2);
        for p in pushers {
            p.join().unwrap();
        }
        worker.join().unwrap();
        let check = h
            .push("check", &[&a, &b], &[], move |ctx| {
                Ok((ctx.read(ka)?.get(), ctx.read(kb)?.get()))
            })
            .unwrap();
        assert!(h.run_one());
        let values = check.wait().unwrap();
        assert!(
            values == (110, 10) || values == (100, 110),
            "not a serial order: {values:?}"
        );
        drop((a, b));
        finish_model(&h, 3, &dropped, 2);
    });
}

/// A write of A fails on a worker while another thread pushes X (read A,
/// mutate B) and Y (read B): neither body runs; both resolve to the write's
/// failure, which poisons B in turn and is reported once.
#[test]
fn poison_passes_down_while_ops_are_pushed() {
    // Three ops over two chains on three threads.
    model_with_three_preemptions(|| {
        let h = Harness::new();
        let dropped = drops();
        let (a, b) = two_vars(&h, &dropped);
        let failing = h
            .push("load", &[], &[&a], |_| Err::<(), _>("disk full".into()))
            .unwrap();
        let pusher = thread::spawn({
            let (h, a, b) = (h.clone(), a.clone(), b.clone());
            move || {
                let never = |_: &depflow::OpCtx| -> Result<(), depflow::BoxError> {
                    panic!("a skipped op's body ran")
                };
                let x = h.push("x", &[&a], &[&b], never).unwrap();
                let y = h.push("y", &[&b], &[], never).unwrap();
                for skipped in [x, y] {
                    match skipped.wait() {
                        Err(Error::Poisoned { cause, .. }) => {
                            assert_eq!(cause.op_name(), Some("load"))
                        }
                        other => panic!("{other:?}"),
                    }
                }
                exit_thread();
            }
        });
        let worker = spawn_worker(&h, 3);
        drop((a, b));
        assert!(matches!(failing.wait(), Err(Error::Failed(_))));
        pusher.join().unwrap();
        worker.join().unwrap();
        assert_eq!(h.failures(), [Some("load".to_string())]);
        finish_model(&h, 3, &dropped, 2);
    });
}

/// Two reads of A are in flight when A is deleted, while another thread
/// pushes a late read. The delete runs after both reads and recycles the
/// value; the late read is refused at push, or runs before the delete, or
/// resolves to `Deleted` without running.
#[test]
fn delete_after_reads_in_flight_and_a_late_read() {
    loom::model(|| {
        let h = Harness::new();
        let dropped = drops();
        let a = h.var(Cell::new(7, &dropped));
        let ka = a.key();
        let read = move |ctx: &depflow::OpCtx| Ok(ctx.read(ka)?.get());
        let reads = [
            h.push("r1", &[&a], &[], read).unwrap(),
            h.push("r2", &[&a], &[], read).unwrap(),
        ];
        let readers = spawn_worker(&h, 2);
        let late = thread::spawn({
            let (h, a) = (h.clone(), a.clone());
            move || {
                let late = h.push("late", &[&a], &[], read);
                let pushed = late.is_ok();
                if let Ok(late) = late {
                    match late.wait() {
                        Ok(v) => assert_eq!(v, 7, "read after the value was recycled"),
                        Err(Error::Deleted(_)) => {}
                        Err(e) => panic!("{e}"),
                    }
                }
                exit_thread();
                pushed
            }
        });
        let recycled = Arc::new(Mutex::new(None));
        let delete = h
            .delete(&a, {
                let recycled = recycled.clone();
                move |cell: Cell| {
                    cell.set(0); // recycled: after every read
                    *recycled.lock().unwrap() = Some(cell);
                }
            })
            .unwrap();
        let late_pushed = late.join().unwrap();
        // The worker runs two of the reads; the delete (and a late read
        // that got in) run here.
        for _ in 0..1 + usize::from(late_pushed) {
            h.run_next();
        }
        readers.join().unwrap();
        for r in reads {
            assert_eq!(r.wait().unwrap(), 7);
        }
        delete.wait().unwrap();
        drop(a);
        drop(recycled.lock().unwrap().take());
        finish_model(&h, 3 + usize::from(late_pushed), &dropped, 1);
    });
}

/// An async op's context escapes its future to another thread, which
/// writes through it and then drops it, racing the future's completion.
/// The next op on the variable waits for both: it sees the late write.
#[test]
fn a_leased_context_holds_the_grants_until_dropped() {
    loom::model(|| {
        let h = Harness::new();
        let dropped = drops();
        let a = h.var(Cell::new(0, &dropped));
        let ka = a.key();
        let stash = Arc::new(Mutex::new(None));
        h.push_async("lease", &[], &[&a], {
            let stash = stash.clone();
            move |ctx| async move {
                ctx.write(ka)?.set(1);
                *stash.lock().unwrap() = Some(ctx);
                Ok::<_, depflow::BoxError>(())
            }
        })
        .unwrap()
        .detach();
        let next = h
            .push("next", &[&a], &[], move |ctx| Ok(ctx.read(ka)?.get()))
            .unwrap();
        let holder = thread::spawn({
            let stash = stash.clone();
            move || {
                let ctx = loop {
                    if let Some(ctx) = stash.lock().unwrap().take() {
                        break ctx;
                    }
                    thread::yield_now();
                };
                ctx.write(ka).unwrap().set(2);
                drop(ctx);
            }
        });
        let worker = spawn_worker(&h, 2);
        assert_eq!(
            next.wait().unwrap(),
            2,
            "granted before the lease was dropped"
        );
        holder.join().unwrap();
        worker.join().unwrap();
        drop(a);
        finish_model(&h, 2, &dropped, 1);
    });
}

/// A thread pushes an op and exits while a worker runs it: the thread's
/// reclamation list orphans the op (or frees it, if already finished), and
/// the op is freed exactly once, after its last access, by whoever is last.
#[test]
fn a_pusher_exits_while_its_op_runs() {
    loom::model(|| {
        let h = Harness::new();
        let dropped = drops();
        let a = h.var(Cell::new(0, &dropped));
        let ka = a.key();
        let pusher = thread::spawn({
            let h = h.clone();
            move || {
                h.push("orphan", &[], &[&a], move |ctx| {
                    ctx.write(ka)?.set(1);
                    Ok(())
                })
                .unwrap()
                .detach();
                // Exits with the op in its list, perhaps unfinished; `a`
                // goes with it.
                exit_thread();
            }
        });
        let worker = spawn_worker(&h, 1);
        pusher.join().unwrap();
        worker.join().unwrap();
        finish_model(&h, 1, &dropped, 1);
    });
}

/// A handle cancels an op while a worker starts it. Either the op ran (its
/// write is seen, nothing is poisoned) or it was cancelled (its body never
/// ran, its output is poisoned, and the op pushed after it is skipped with
/// that cause); never a mix. Both ops retire and free the variable once.
#[test]
fn cancel_races_with_the_start() {
    loom::model(|| {
        let h = Harness::new();
        let dropped = drops();
        let a = h.var(Cell::new(0, &dropped));
        let ka = a.key();
        let write = h
            .push("write", &[], &[&a], move |ctx| {
                ctx.write(ka)?.set(1);
                Ok(())
            })
            .unwrap();
        let read = h
            .push("read", &[&a], &[], move |ctx| Ok(ctx.read(ka)?.get()))
            .unwrap();
        drop(a);
        let worker = spawn_worker(&h, 2);
        write.cancel();
        match (write.wait(), read.wait()) {
            (Ok(()), Ok(value)) => assert_eq!(value, 1),
            (Err(Error::Cancelled), Err(Error::Poisoned { cause, .. })) => {
                assert_eq!(cause.op_name(), Some("write"));
            }
            other => panic!("a mixed outcome: {other:?}"),
        }
        worker.join().unwrap();
        finish_model(&h, 2, &dropped, 1);
    });
}
