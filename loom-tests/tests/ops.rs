//! Loom models of ops on several variables: multi-variable pushes, poison
//! passing down, delete after pending reads.
#![cfg(loom)]

mod common;

use common::{Data, Op, assert_clean, chain};
use loom::sync::{Arc, Mutex};
use loom::thread;

const LIVE: u64 = 0;
const POISONED: u64 = 99;
const DELETED: u64 = 77;

/// Two threads push ops on the same two variables in opposite roles,
/// `(read A, mutate B)` and `(mutate A, read B)`, linking under the engine's
/// push lock and granting after it. Whatever the interleaving, both run: no
/// wait-for cycle.
#[test]
fn concurrent_multi_variable_pushes() {
    loom::model(|| {
        let (a, b) = (chain(), chain());
        let lock = Arc::new(Mutex::new(()));
        let (da, db) = (Data::new(), Data::new());
        // Edge 0 on A, edge 1 on B.
        let m1 = Op::new(&[false, true]);
        let m2 = Op::new(&[true, false]);
        let push = |op: Arc<Op>| {
            let (a, b, lock, da, db) = (a.clone(), b.clone(), lock.clone(), da.clone(), db.clone());
            thread::spawn(move || {
                let (ta, tb) = {
                    let _order = lock.lock().unwrap();
                    (op.link(&a, 0), op.link(&b, 1))
                };
                if ta {
                    op.advance(&a, 0);
                }
                if tb {
                    op.advance(&b, 1);
                }
                op.launch();
                op.wait_ready();
                // Touch the data the way the declaration allows.
                let (writes_a, writes_b) = (op_writes(&op, 0), op_writes(&op, 1));
                if writes_a {
                    da.write(1)
                } else {
                    let _ = da.read();
                }
                if writes_b {
                    db.write(1)
                } else {
                    let _ = db.read();
                }
                op.complete(&a, 0);
                op.complete(&b, 1);
            })
        };
        let t1 = push(m1.clone());
        let t2 = push(m2.clone());
        t1.join().unwrap();
        t2.join().unwrap();
        assert_clean(&[&m1, &m2]);
    });
}

fn op_writes(op: &Op, i: usize) -> bool {
    op.is_write(i)
}

/// W1 on A fails and poisons A; X (read A, mutate B), pushed from another
/// thread, sees the poison and passes it to B; Y (read B) sees it too.
#[test]
fn poison_passes_down() {
    loom::model(|| {
        let (a, b) = (chain(), chain());
        let (state_a, state_b) = (Data::new(), Data::new());
        let w1 = Op::new(&[true]);
        w1.push1(&a);
        let x = Op::new(&[false, true]);
        let y = Op::new(&[false]);
        let pusher = thread::spawn({
            let (a, b, x, y) = (a.clone(), b.clone(), x.clone(), y.clone());
            move || {
                x.append(&a, 0);
                x.append(&b, 1);
                x.launch();
                y.push1(&b);
            }
        });
        let runner = thread::spawn({
            let (a, b, x, state_a, state_b) = (
                a.clone(),
                b.clone(),
                x.clone(),
                state_a.clone(),
                state_b.clone(),
            );
            move || {
                x.wait_ready();
                if state_a.read() == POISONED {
                    state_b.write(POISONED);
                }
                x.complete(&a, 0);
                x.complete(&b, 1);
            }
        });
        // W1 fails: it poisons what it mutates.
        state_a.write(POISONED);
        w1.complete(&a, 0);
        pusher.join().unwrap();
        y.wait_ready();
        assert_eq!(state_b.read(), POISONED, "poison did not pass down");
        y.complete(&b, 0);
        runner.join().unwrap();
        assert_clean(&[&w1, &x, &y]);
    });
}

/// Two reads are in flight when a delete (a write that marks the variable
/// deleted) is pushed, and another thread pushes a read behind it: the delete
/// waits for both reads, and the late read sees the variable deleted.
#[test]
fn delete_after_pending_reads() {
    loom::model(|| {
        let a = chain();
        let state = Data::new();
        let (r1, r2) = (Op::new(&[false]), Op::new(&[false]));
        r1.push1(&a);
        r2.push1(&a);
        let readers: Vec<_> = [r1.clone(), r2.clone()]
            .into_iter()
            .map(|r| {
                let (a, state) = (a.clone(), state.clone());
                thread::spawn(move || {
                    assert_eq!(state.read(), LIVE, "a read ran after the delete");
                    r.complete(&a, 0);
                })
            })
            .collect();
        let delete = Op::new(&[true]);
        delete.push1(&a);
        let late = Op::new(&[false]);
        let pusher = thread::spawn({
            let (a, late) = (a.clone(), late.clone());
            move || late.push1(&a)
        });
        delete.wait_ready();
        state.write(DELETED);
        delete.complete(&a, 0);
        pusher.join().unwrap();
        late.wait_ready();
        assert_eq!(state.read(), DELETED);
        late.complete(&a, 0);
        for r in readers {
            r.join().unwrap();
        }
        assert_clean(&[&r1, &r2, &delete, &late]);
    });
}
