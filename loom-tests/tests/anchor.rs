//! Loom model of who frees an op: its pusher once every reference is out, or,
//! once the pusher orphaned it, whoever counts the last reference out.
#![cfg(loom)]

use depflow::__loom::Anchor;
use loom::cell::UnsafeCell;
use loom::sync::Arc;
use loom::sync::atomic::{AtomicUsize, Ordering::*};
use loom::thread;

/// The op's memory: one edge per chain, which that chain may touch until it
/// counts itself out.
struct Op {
    anchor: Anchor<Arc<AtomicUsize>>,
    edges: [UnsafeCell<u64>; 2],
}

fn op() -> (Arc<Op>, Arc<AtomicUsize>) {
    let freed = Arc::new(AtomicUsize::new(0));
    let op = Arc::new(Op {
        anchor: Anchor::new(2),
        edges: [UnsafeCell::new(0), UnsafeCell::new(0)],
    });
    // SAFETY: not shared yet.
    unsafe { op.anchor.set(freed.clone()) };
    (op, freed)
}

/// "Frees" the op: the last access, which must come after every other one.
fn free(op: &Op, anchor: Arc<AtomicUsize>) {
    for edge in &op.edges {
        edge.with_mut(|e| unsafe { *e = 99 });
    }
    anchor.fetch_add(1, AcqRel);
}

/// Chain `i` counts itself out after touching its edge.
fn chain_done(op: &Op, i: usize) {
    op.edges[i].with_mut(|e| unsafe { *e += 1 });
    if let Some(anchor) = op.anchor.unref() {
        free(op, anchor);
    }
}

/// Two chains, each counting itself out of `op` on its own thread.
fn spawn_chains(op: &Arc<Op>) -> Vec<thread::JoinHandle<()>> {
    (0..2)
        .map(|i| {
            let op = op.clone();
            thread::spawn(move || chain_done(&op, i))
        })
        .collect()
}

/// The pusher polls and frees once finished, racing the last two references.
#[test]
fn pusher_frees_once_finished() {
    loom::model(|| {
        let (op, freed) = op();
        let chains = spawn_chains(&op);
        loop {
            if op.anchor.is_finished() {
                // SAFETY: finished: the holder takes the anchor back.
                let anchor = unsafe { op.anchor.take() }.unwrap();
                free(&op, anchor);
                break;
            }
            loom::thread::yield_now();
        }
        for c in chains {
            c.join().unwrap();
        }
        assert_eq!(freed.load(Acquire), 1);
    });
}

/// The pusher orphans the op while the references are being counted out:
/// exactly one thread frees it, after every other access.
#[test]
fn orphan_races_last_unref() {
    loom::model(|| {
        let (op, freed) = op();
        let chains = spawn_chains(&op);
        // SAFETY: the holder orphans once, instead of taking.
        if let Some(anchor) = unsafe { op.anchor.orphan() } {
            free(&op, anchor);
        }
        for c in chains {
            c.join().unwrap();
        }
        assert_eq!(freed.load(Acquire), 1, "freed twice or never");
    });
}
