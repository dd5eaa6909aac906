//! Collectives across processes (the `mpi` feature), with its own `main`
//! (MPI is initialised and finalised once per process).
//!
//! `cargo test --features mpi --test mpi` runs it as one rank (MPI's
//! singleton) and, where `mpirun` is on the PATH, first runs itself under
//! `mpirun -np 2`, `-np 3` (not a power of two) and `-np 4`
//! (oversubscribed; each bounded: a hang fails) and checks that every rank
//! passed and printed the same digest of its results as the 1-rank run on
//! the same global data. The data-parallel group across ranks
//! (`mpi/group.rs`, 2 local devices per rank) is checked the same way:
//! every rank's weights identical and equal to the 1-rank run's where the
//! sums are exact, and on 2 ranks to the serial reference in the group's
//! order of summation, which the 1-rank process computes too. A failure on
//! one rank (`one_rank_fails`) fails the collective on every rank, and the
//! ranks go on in step; the lowest failing rank's own message reaches
//! every rank (`failure_messages`).
//! Without `mpirun` it says so and runs the 1-rank checks only. Under
//! `mpirun` directly (`mpirun -np 2 target/debug/deps/mpi-*`) it runs the
//! checks on every rank.

mod common;
#[path = "mpi/group.rs"]
mod group;

use std::process::Command;
use std::sync::mpsc;
use std::time::Duration;

// rsmpi as depflow re-exports it (no `mpi` dependency of our own), its
// `Communicator` trait beside depflow's type.
use depflow::mpi::{self, traits::Communicator as _};
use depflow::{AnyVar, CollectiveOp, Communicator, Engine, Error, ReduceOp, Var};

/// Global data: `SHARDS` shards, rank `r` of `n` holds shards `r, r+n, ...`
/// (summed locally before the all-reduce). Values are small dyadic
/// rationals, so every summation order gives the same bits.
const SHARDS: usize = 12;
const LEN: usize = 1000;

fn shard(s: usize) -> Vec<f64> {
    (0..LEN)
        .map(|i| ((i * 7 + s * 13) % 97) as f64 * 0.125 - 3.0)
        .collect()
}

fn local_sum(rank: usize, size: usize) -> Vec<f64> {
    let mut acc = vec![0.0; LEN];
    for s in (rank..SHARDS).step_by(size) {
        for (a, x) in acc.iter_mut().zip(shard(s)) {
            *a += x;
        }
    }
    acc
}

/// FNV-1a over the values' bits.
fn digest(values: &[f64]) -> u64 {
    values.iter().fold(0xcbf2_9ce4_8422_2325, |h, v| {
        v.to_bits()
            .to_le_bytes()
            .iter()
            .fold(h, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
    })
}

/// FNV-1a over `f32` values' bits.
fn digest32(values: &[f32]) -> u64 {
    let wide: Vec<f64> = values
        .iter()
        .map(|&v| f64::from_bits(u64::from(v.to_bits())))
        .collect();
    digest(&wide)
}

/// Every rank's value of `x`, through an all-gather.
fn gathered(engine: &Engine, comm: &Communicator, x: u64) -> Vec<u64> {
    let input = engine.var(vec![x]);
    let output: Var<Vec<u64>> = engine.var(Vec::new());
    comm.all_gather(&input, &output)
        .push()
        .unwrap()
        .wait()
        .unwrap();
    engine.get(&output).wait().unwrap()
}

fn checks(world: &mpi::topology::SimpleCommunicator) {
    let engine = Engine::new();
    let comm = Communicator::new(&engine, world).expect("communicator");
    let (rank, size) = (comm.rank(), comm.size());
    assert_eq!((rank, size), (world.rank() as usize, world.size() as usize));

    // All-reduce: equal on every rank, and to the global sum.
    let v = engine.var(local_sum(rank, size));
    comm.all_reduce(&v)
        .name("sum")
        .push()
        .unwrap()
        .wait()
        .unwrap();
    let got = engine.get(&v).wait().unwrap();
    assert_eq!(got, local_sum(0, 1), "rank {rank}: not the global sum");
    let d = digest(&got);
    assert!(
        gathered(&engine, &comm, d).iter().all(|&x| x == d),
        "ranks differ"
    );
    println!("digest: {d:016x}");

    // Max and min.
    let m = engine.var(vec![rank as i64, -(rank as i64)]);
    comm.all_reduce(&m)
        .reduce(ReduceOp::Max)
        .push()
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(engine.get(&m).wait().unwrap(), vec![size as i64 - 1, 0]);

    // Broadcast from the last rank.
    let b = engine.var(vec![rank as f32; 5]);
    comm.broadcast(&b, size - 1).push().unwrap().wait().unwrap();
    assert_eq!(engine.get(&b).wait().unwrap(), vec![(size - 1) as f32; 5]);

    // All-gather, rank order.
    let input = engine.var(vec![rank as i32; 3]);
    let output = engine.var(Vec::new());
    comm.all_gather(&input, &output)
        .push()
        .unwrap()
        .wait()
        .unwrap();
    let want: Vec<i32> = (0..size as i32).flat_map(|r| [r; 3]).collect();
    assert_eq!(engine.get(&output).wait().unwrap(), want);

    issue_order_is_push_order(&engine, &comm);
    many_in_flight(&engine, &comm);
    large_all_reduces(&engine, &comm);
    errors(&engine, &comm);
    one_rank_fails(&engine, &comm);
    failure_messages(&engine, &comm);
    empty_collectives(&engine, &comm);
    mismatched_tags(&engine, &comm);
    waiting_costs_no_core(&engine, &comm);

    // A collective pushed but not issued when the communicator shuts down
    // fails (on every rank, without an MPI call), as does one pushed after.
    let gated = engine.var(vec![1.0f64; 4]);
    let (open, gate) = mpsc::channel::<()>();
    engine
        .push(&[], &[&gated], move |_| {
            let _ = gate.recv_timeout(Duration::from_secs(10));
            Ok(())
        })
        .unwrap();
    let mut waiting = comm.all_reduce(&gated).push().unwrap();
    comm.shutdown().expect("nothing in flight");
    open.send(()).unwrap();
    let r = waiting.wait_timeout(Duration::from_secs(60));
    assert!(collective_failure(&r), "{r:?}");
    let late = engine.var(vec![1.0f64]);
    let r = comm.all_reduce(&late).push().unwrap().wait();
    assert!(collective_failure(&r), "{r:?}");
    engine.wait_all().wait().ok();
    println!("rank {rank} of {size}: all MPI checks passed");
}

/// Two collectives whose inputs become ready in opposite orders on even
/// and odd ranks are still issued in push order: each sums its own
/// variable (issued in readiness order, `x` of one rank would be summed
/// with `y` of another).
fn issue_order_is_push_order(engine: &Engine, comm: &Communicator) {
    let (rank, size) = (comm.rank(), comm.size());
    let x = engine.var(vec![1.0f64; 4]);
    let y = engine.var(vec![100.0f64; 4]);
    let (open, gate) = mpsc::channel::<()>();
    // The gated variable: `x` on even ranks, `y` on odd ones.
    let gated = if rank % 2 == 0 { &x } else { &y };
    let k = gated.key();
    engine
        .push(&[], &[gated], move |ctx| {
            let _ = gate.recv_timeout(Duration::from_secs(10));
            ctx.write(k)?.iter_mut().for_each(|v| *v *= 2.0);
            Ok(())
        })
        .unwrap();
    let hx = comm.all_reduce(&x).name("x").push().unwrap();
    let hy = comm.all_reduce(&y).name("y").push().unwrap();
    // Give the ungated collective time to become ready and submit first
    // (the check holds however long this is).
    std::thread::sleep(Duration::from_millis(50));
    open.send(()).unwrap();
    hx.wait().unwrap();
    hy.wait().unwrap();
    let n = size as f64;
    let evens = size.div_ceil(2) as f64;
    let odds = n - evens;
    assert_eq!(engine.get(&x).wait().unwrap(), vec![2.0 * evens + odds; 4]);
    assert_eq!(
        engine.get(&y).wait().unwrap(),
        vec![100.0 * (evens + 2.0 * odds); 4]
    );
}

/// 64 collectives in flight at once, on variables of different lengths.
fn many_in_flight(engine: &Engine, comm: &Communicator) {
    let (rank, size) = (comm.rank(), comm.size());
    let vars: Vec<Var<Vec<u64>>> = (0..64)
        .map(|i| engine.var(vec![(rank + i) as u64; 1 + i * 37]))
        .collect();
    let handles: Vec<_> = vars
        .iter()
        .map(|v| comm.all_reduce(v).push().unwrap())
        .collect();
    for (i, (v, h)) in vars.iter().zip(handles).enumerate() {
        h.wait().unwrap();
        let want: u64 = (0..size).map(|r| (r + i) as u64).sum();
        assert_eq!(engine.get(v).wait().unwrap(), vec![want; 1 + i * 37]);
    }
}

/// All-reduces of 64 KiB and more (the engine's own ring on 2 ranks or
/// more): lengths that no rank count divides, sums, maxima and minima of
/// several types, several in flight, inexact sums that must give every
/// rank the same bits, and a ring skipped on one rank, which fails on
/// every rank and leaves them in step.
fn large_all_reduces(engine: &Engine, comm: &Communicator) {
    let (rank, size) = (comm.rank(), comm.size());
    let limit = Duration::from_secs(60);
    let ranks = 0..size;

    // f32 sums of exact values, 16 411 elements (just over 64 KiB).
    let n = 16_411;
    let v = engine.var((0..n).map(|i| ((rank + 1) * (i % 7)) as f32).collect());
    comm.all_reduce(&v).push().unwrap().wait().unwrap();
    let want: Vec<f32> = (0..n)
        .map(|i| ((i % 7) * size * (size + 1) / 2) as f32)
        .collect();
    same(
        &engine.get(&v).wait().unwrap(),
        &want,
        &format!("rank {rank}: f32 sum"),
    );

    // i32 maxima and minima, 40 009 elements.
    let n = 40_009;
    let value = |r: usize, i: usize| ((r * 7 + i * 3) % 13) as i32 - 6;
    for (op, pick) in [
        (ReduceOp::Max, i32::max as fn(i32, i32) -> i32),
        (ReduceOp::Min, i32::min),
    ] {
        let v = engine.var((0..n).map(|i| value(rank, i)).collect());
        comm.all_reduce(&v)
            .reduce(op)
            .push()
            .unwrap()
            .wait()
            .unwrap();
        let want: Vec<i32> = (0..n)
            .map(|i| ranks.clone().map(|r| value(r, i)).reduce(pick).unwrap())
            .collect();
        same(
            &engine.get(&v).wait().unwrap(),
            &want,
            &format!("rank {rank}: {op:?}"),
        );
    }

    // Four f64 sums in flight at once, of different lengths.
    let vars: Vec<Var<Vec<f64>>> = (0..4)
        .map(|k| engine.var(vec![(rank + k) as f64; 9_000 + 1_001 * k]))
        .collect();
    let handles: Vec<_> = vars
        .iter()
        .map(|v| comm.all_reduce(v).push().unwrap())
        .collect();
    for (k, (v, mut h)) in vars.iter().zip(handles).enumerate() {
        h.wait_timeout(limit).unwrap();
        let want = ranks.clone().map(|r| (r + k) as f64).sum::<f64>();
        let want = vec![want; 9_000 + 1_001 * k];
        same(
            &engine.get(v).wait().unwrap(),
            &want,
            &format!("rank {rank}: sum {k}"),
        );
    }

    // Inexact sums (thirds of different sizes): the same bits everywhere.
    let v = engine.var(
        (0..30_000)
            .map(|i| (i + rank * 977) as f32 / 3.0)
            .collect::<Vec<f32>>(),
    );
    comm.all_reduce(&v).push().unwrap().wait().unwrap();
    let d = digest32(&engine.get(&v).wait().unwrap());
    assert!(
        gathered(engine, comm, d).iter().all(|&x| x == d),
        "rank {rank}: the ranks' sums differ"
    );

    // Skipped on the last rank (a poisoned input): its stand-in takes part
    // in the ring with zeros, every other rank fails naming it, and the
    // next ring succeeds everywhere.
    if size < 2 {
        return;
    }
    let last = size - 1;
    let v = engine.var(vec![1.0f64; 20_000]);
    if rank == last {
        engine
            .op()
            .mutates(&[&v])
            .run(|_| Err::<(), _>("no gradient here".into()))
            .unwrap();
    }
    let r = comm
        .all_reduce(&v)
        .name("big")
        .push()
        .unwrap()
        .wait_timeout(limit);
    if rank == last {
        assert!(matches!(r, Err(Error::Poisoned { .. })), "{r:?}");
    } else {
        let m = collective_message(&r).unwrap_or_else(|| panic!("rank {rank}: {r:?}"));
        assert!(
            m.starts_with(&format!("big: rank {last} failed its part")),
            "{m}"
        );
    }
    let w = engine.var(vec![2.0f64; 20_000]);
    comm.all_reduce(&w)
        .push()
        .unwrap()
        .wait_timeout(limit)
        .unwrap();
    let want = vec![2.0 * size as f64; 20_000];
    same(
        &engine.get(&w).wait().unwrap(),
        &want,
        &format!("rank {rank}: after"),
    );
    engine.wait_all().wait().ok(); // the failure above, recorded
}

/// `got == want`, or a panic naming the first element that differs (not
/// the whole of two long vectors).
fn same<T: PartialEq + std::fmt::Debug>(got: &[T], want: &[T], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    if let Some(i) = (0..got.len()).find(|&i| got[i] != want[i]) {
        panic!("{what}: element {i} is {:?}, not {:?}", got[i], want[i]);
    }
}

/// `v` is poisoned: an op reading it fails so.
fn assert_poisoned(engine: &Engine, v: &dyn AnyVar) {
    let after = engine.push(&[v], &[], |_| Ok(())).unwrap().wait();
    assert!(
        matches!(after, Err(Error::Poisoned { .. })),
        "not poisoned: {after:?}"
    );
}

/// Collective `c` fails as a collective does, poisoning `out`.
fn fails_poisoning<T>(engine: &Engine, c: CollectiveOp<'_, T>, out: &dyn AnyVar)
where
    T: mpi::traits::Equivalence + Copy + Send + Sync + 'static,
{
    let r = c.push().unwrap().wait();
    assert!(collective_failure(&r), "{r:?}");
    assert_poisoned(engine, out);
}

fn collective_failure<T: std::fmt::Debug>(r: &Result<T, Error>) -> bool {
    match r {
        Err(e @ Error::Failed(_)) => matches!(
            e.failure()
                .and_then(|f| f.op_error())
                .and_then(|s| s.downcast_ref::<Error>()),
            Some(Error::Collective(_))
        ),
        _ => false,
    }
}

/// Failures become the op's and poison its outputs; the collectives after
/// them still run (every rank fails the same way, so they stay in step).
fn errors(engine: &Engine, comm: &Communicator) {
    let size = comm.size();
    // Caught at push: a root that is not a rank.
    let v = engine.var(vec![0.0f32; 2]);
    let r = comm.broadcast(&v, size).push();
    assert!(matches!(r, Err(Error::Collective(_))), "{r:?}");
    let r = comm.all_gather(&v, &v).push();
    assert!(matches!(r, Err(Error::Collective(_))), "{r:?}");

    // Caught before issuing: an all-gather output of the wrong length.
    let input = engine.var(vec![1u8; 3]);
    let output = engine.var(vec![0u8; 3 * size + 1]);
    let bad = comm.all_gather(&input, &output).name("bad gather");
    fails_poisoning(engine, bad, &output);

    // A poisoned input: skipped, its output poisoned by the same failure.
    let p = engine.var(vec![1.0f64; 8]);
    engine
        .op()
        .name("load")
        .mutates(&[&p])
        .run(|_| Err::<(), _>("no data".into()))
        .unwrap();
    let r = comm.all_reduce(&p).push().unwrap().wait();
    match &r {
        Err(Error::Poisoned { cause, .. }) => assert_eq!(cause.op_name(), Some("load")),
        other => panic!("{other:?}"),
    }

    // MPI's own error (a sum of booleans: MPI_ERR_OP), returned, not fatal.
    let flags = engine.var(vec![true, false]);
    fails_poisoning(engine, comm.all_reduce(&flags).name("bool sum"), &flags);

    // The issue order went on past the skipped and failed ones (a place
    // not given up would hang here: bounded).
    let w = engine.var(vec![1u32; 16]);
    comm.all_reduce(&w)
        .push()
        .unwrap()
        .wait_timeout(Duration::from_secs(60))
        .unwrap();
    assert_eq!(engine.get(&w).wait().unwrap(), vec![size as u32; 16]);
    engine.wait_all().wait().ok(); // the failures above, recorded
}

/// The message of a collective's own failure (`Error::Collective`).
fn collective_message<T: std::fmt::Debug>(r: &Result<T, Error>) -> Option<String> {
    match r {
        Err(e @ Error::Failed(_)) => match e.failure()?.op_error()?.downcast_ref::<Error>() {
            Some(Error::Collective(m)) => Some(m.clone()),
            _ => None,
        },
        _ => None,
    }
}

/// A failure on one rank reaches the others: a collective skipped or
/// refused on one rank fails on every rank (naming that rank), instead of
/// leaving the others waiting in MPI; the collectives after it still run,
/// in step. Waits are bounded: a hang fails the check.
fn one_rank_fails(engine: &Engine, comm: &Communicator) {
    let (rank, size) = (comm.rank(), comm.size());
    if size < 2 {
        return;
    }
    let limit = Duration::from_secs(60);
    let last = size - 1;

    // The last rank's input is poisoned by a failed op: its all-reduce is
    // skipped there; every other rank's fails, naming it.
    let v = engine.var(vec![1.0f64; 64]);
    if rank == last {
        engine
            .op()
            .name("load")
            .mutates(&[&v])
            .run(|_| Err::<(), _>("no data on this rank".into()))
            .unwrap();
    }
    let r = comm
        .all_reduce(&v)
        .name("grad")
        .push()
        .unwrap()
        .wait_timeout(limit);
    if rank == last {
        assert!(
            matches!(&r, Err(Error::Poisoned { cause: c, .. }) if c.op_name() == Some("load")),
            "{r:?}"
        );
    } else {
        let m = collective_message(&r).unwrap_or_else(|| panic!("rank {rank}: {r:?}"));
        assert!(
            m.starts_with(&format!(
                "grad: rank {last} failed its part (its op did not run"
            )),
            "{m}"
        );
        // Its output is poisoned by that failure.
        assert_poisoned(engine, &v);
    }

    // Rank 0 refuses an all-gather (its output has the wrong length there
    // only): every rank fails it, the others naming rank 0.
    let input = engine.var(vec![rank as u16; 2]);
    let len = if rank == 0 { 2 * size + 1 } else { 2 * size };
    let output = engine.var(vec![0u16; len]);
    let r = comm
        .all_gather(&input, &output)
        .name("gather")
        .push()
        .unwrap()
        .wait_timeout(limit);
    let m = collective_message(&r).unwrap_or_else(|| panic!("rank {rank}: {r:?}"));
    if rank == 0 {
        assert!(m.contains("the output holds"), "{m}");
    } else {
        assert!(
            m.starts_with("gather: rank 0 failed its part (its op refused"),
            "{m}"
        );
        // With rank 0's own words.
        assert!(m.contains("the output holds"), "{m}");
    }

    // A broadcast whose root's value is poisoned fails on every rank.
    let b = engine.var(vec![rank as i32; 3]);
    if rank == 0 {
        engine
            .op()
            .mutates(&[&b])
            .run(|_| Err::<(), _>("bad root".into()))
            .unwrap();
    }
    let r = comm.broadcast(&b, 0).push().unwrap().wait_timeout(limit);
    if rank != 0 {
        let m = collective_message(&r).unwrap_or_else(|| panic!("rank {rank}: {r:?}"));
        assert!(m.contains("rank 0 failed its part"), "{m}");
    } else {
        assert!(matches!(r, Err(Error::Poisoned { .. })), "{r:?}");
    }

    // Several in flight, one of them skipped on one rank: only that one
    // fails, and the ranks stay in step for the others and those after.
    let vars: Vec<Var<Vec<u32>>> = (0..8)
        .map(|i| engine.var(vec![i; 100 + i as usize]))
        .collect();
    if rank == last {
        engine
            .op()
            .mutates(&[&vars[3]])
            .run(|_| Err::<(), _>("late".into()))
            .unwrap();
    }
    let handles: Vec<_> = vars
        .iter()
        .map(|v| comm.all_reduce(v).push().unwrap())
        .collect();
    for (i, mut h) in handles.into_iter().enumerate() {
        let r = h.wait_timeout(limit);
        if i == 3 {
            assert!(r.is_err(), "rank {rank}: {r:?}");
        } else {
            r.unwrap_or_else(|e| panic!("rank {rank}, collective {i}: {e:?}"));
            let want = vec![i as u32 * size as u32; 100 + i];
            assert_eq!(engine.get(&vars[i]).wait().unwrap(), want);
        }
    }
    engine.wait_all().wait().ok(); // the failures above, recorded
}

/// `e` and its sources, as a chain printer shows them.
fn chain(e: &Error) -> String {
    let mut s = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        s += &format!(": {cause}");
        source = cause.source();
    }
    s
}

/// Poisons `v` with an op `load` failing with `why`.
fn poison(engine: &Engine, v: &dyn AnyVar, why: String) {
    engine
        .op()
        .name("load")
        .mutates(&[v])
        .run(move |_| Err::<(), _>(why.into()))
        .unwrap();
}

/// A collective that fails because of another rank says that rank's own
/// failure: rank 1's input poisoned by "NaN on rank 1" fails the
/// all-reduce on every rank with those words; a long message is cut to
/// its bound; with several in flight, each failed collective carries its
/// own rank 1's message (the messages stay matched to their collectives),
/// rank 1's rather than that of rank 2, failing too; the ranks stay in
/// step.
fn failure_messages(engine: &Engine, comm: &Communicator) {
    let (rank, size) = (comm.rank(), comm.size());
    if size < 2 {
        return;
    }
    let limit = Duration::from_secs(60);

    // Rank 1's input is poisoned: its words reach every rank.
    let v = engine.var_named("fc1.grad", vec![1.0f64; 32]);
    if rank == 1 {
        poison(engine, &v, "NaN on rank 1".into());
    }
    let r = comm
        .all_reduce(&v)
        .name("grad")
        .push()
        .unwrap()
        .wait_timeout(limit);
    let e = r.expect_err("failed on every rank");
    assert!(chain(&e).contains("NaN on rank 1"), "rank {rank}: {e:?}");
    if rank != 1 {
        let m = collective_message(&Err::<(), _>(e)).unwrap();
        // Rank 1's own words, its variable's id included.
        let (head, tail) = m.split_once(" (var#").expect(&m);
        assert_eq!(
            head,
            "grad: rank 1 failed its part (its op did not run: input `fc1.grad`"
        );
        assert!(
            tail.ends_with(
                ") was poisoned because op `load` failed: NaN on rank 1): the collective's \
                 result is not valid"
            ),
            "{m}"
        );
    }

    // A very long message is cut to 256 bytes at a character boundary.
    let v = engine.var(vec![1u8; 8]);
    let long = format!("NaN on rank 1 {}", "é".repeat(400));
    if rank == 1 {
        poison(engine, &v, long.clone());
    }
    let r = comm.all_reduce(&v).push().unwrap().wait_timeout(limit);
    if rank != 1 {
        let m = collective_message(&r).unwrap_or_else(|| panic!("rank {rank}: {r:?}"));
        let start = m.find("input var#").expect(&m);
        let end = m.find("…)").expect(&m) + "…".len();
        let words = &m[start..end];
        assert!(words.len() <= 256, "{} bytes: {words}", words.len());
        assert!(words.len() > 250, "cut short: {} bytes", words.len());
        assert!(words.contains("NaN on rank 1 éé"), "{words}");
        assert!(long.starts_with(&words[words.find("NaN").unwrap()..end - start - "…".len()]));
    }

    // Eight in flight; rank 1 fails collectives 2 and 5 with words of
    // their own, rank 2 (if any) fails 5 too.
    let vars: Vec<Var<Vec<u32>>> = (0..8).map(|i| engine.var(vec![i; 50])).collect();
    for i in [2, 5] {
        if rank == 1 || (rank == 2 && i == 5) {
            poison(engine, &vars[i], format!("NaN in {i} on rank {rank}"));
        }
    }
    let handles: Vec<_> = vars
        .iter()
        .map(|v| comm.all_reduce(v).push().unwrap())
        .collect();
    for (i, mut h) in handles.into_iter().enumerate() {
        let r = h.wait_timeout(limit);
        if i == 2 || i == 5 {
            let e = r.expect_err("failed on every rank");
            let own = rank == 2 && i == 5;
            let want = format!("NaN in {i} on rank {}", if own { 2 } else { 1 });
            assert!(chain(&e).contains(&want), "rank {rank}, {i}: {e:?}");
        } else {
            r.unwrap_or_else(|e| panic!("rank {rank}, collective {i}: {e:?}"));
            let want = vec![i as u32 * size as u32; 50];
            assert_eq!(engine.get(&vars[i]).wait().unwrap(), want);
        }
    }

    // In step after: a plain all-reduce, and a ring (64 KiB and more).
    for n in [16, 20_000] {
        let w = engine.var(vec![3.0f64; n]);
        comm.all_reduce(&w)
            .push()
            .unwrap()
            .wait_timeout(limit)
            .unwrap();
        assert_eq!(engine.get(&w).wait().unwrap(), vec![3.0 * size as f64; n]);
    }
    engine.wait_all().wait().ok(); // the failures above, recorded
}

/// Collectives of empty vectors complete, of every basic type: an empty
/// `Vec<u8>`'s pointer (1, dangling) is Open MPI's `MPI_IN_PLACE`, which
/// made `MPI_Iallreduce` fail with `MPI_ERR_BUFFER` and its default error
/// handler abort every rank.
fn empty_collectives(engine: &Engine, comm: &Communicator) {
    fn each<T>(engine: &Engine, comm: &Communicator)
    where
        T: mpi::traits::Equivalence + Copy + Send + Sync + PartialEq + std::fmt::Debug + 'static,
    {
        let limit = Duration::from_secs(60);
        let v: Var<Vec<T>> = engine.var(Vec::new());
        comm.all_reduce(&v)
            .push()
            .unwrap()
            .wait_timeout(limit)
            .unwrap();
        comm.broadcast(&v, 0)
            .push()
            .unwrap()
            .wait_timeout(limit)
            .unwrap();
        let out: Var<Vec<T>> = engine.var(Vec::new());
        comm.all_gather(&v, &out)
            .push()
            .unwrap()
            .wait_timeout(limit)
            .unwrap();
        assert!(engine.get(&v).wait().unwrap().is_empty());
        assert!(engine.get(&out).wait().unwrap().is_empty());
    }
    each::<u8>(engine, comm);
    each::<i8>(engine, comm);
    each::<u16>(engine, comm);
    each::<i32>(engine, comm);
    each::<u64>(engine, comm);
    each::<f32>(engine, comm);
    each::<f64>(engine, comm);
    // Skipped on the last rank (a stand-in of length 0): fails everywhere,
    // no MPI abort.
    let size = comm.size();
    let v: Var<Vec<u8>> = engine.var(Vec::new());
    if comm.rank() == size - 1 {
        poison(engine, &v, "nothing here".into());
    }
    let r = comm
        .all_reduce(&v)
        .push()
        .unwrap()
        .wait_timeout(Duration::from_secs(60));
    assert!(r.is_err() || size == 1, "{r:?}");
    engine.wait_all().wait().ok(); // the failure above, recorded
}

/// Collectives tagged differently across ranks (a rank skipped one, so
/// the ranks pair collectives of different steps) fail on every rank,
/// their results unused and their outputs poisoned, rather than computing
/// with another collective's data. The last rank skips tag 1 and adds tag
/// 4: three mismatched pairs.
fn mismatched_tags(engine: &Engine, comm: &Communicator) {
    let (rank, size) = (comm.rank(), comm.size());
    let limit = Duration::from_secs(60);
    // Matching tags: a plain sum.
    let v = engine.var(vec![1.0f64; 8]);
    comm.all_reduce(&v)
        .tag(7)
        .push()
        .unwrap()
        .wait_timeout(limit)
        .unwrap();
    assert_eq!(engine.get(&v).wait().unwrap(), vec![size as f64; 8]);
    if size < 2 {
        return;
    }
    let tags: Vec<u64> = if rank == size - 1 {
        vec![2, 3, 4]
    } else {
        vec![1, 2, 3]
    };
    let vars: Vec<Var<Vec<f64>>> = (0..3).map(|_| engine.var(vec![1.0f64; 8])).collect();
    let handles: Vec<_> = vars
        .iter()
        .zip(&tags)
        .map(|(v, &t)| comm.all_reduce(v).name("step").tag(t).push().unwrap())
        .collect();
    for (v, mut h) in vars.iter().zip(handles) {
        let m = collective_message(&h.wait_timeout(limit))
            .unwrap_or_else(|| panic!("rank {rank}: not failed"));
        assert!(m.starts_with("step: the ranks are out of step"), "{m}");
        assert_poisoned(engine, v);
    }
    // In step again: a plain sum.
    let w = engine.var(vec![2u32; 4]);
    comm.all_reduce(&w)
        .push()
        .unwrap()
        .wait_timeout(limit)
        .unwrap();
    assert_eq!(engine.get(&w).wait().unwrap(), vec![2 * size as u32; 4]);
    engine.wait_all().wait().ok(); // the failures above, recorded
}

/// Whether `mpirun` is Open MPI's (the flags below are), saying why not.
fn have_mpirun() -> bool {
    let version = Command::new("mpirun").arg("--version").output();
    let Ok(version) = version else {
        println!("mpi: SKIPPED the multi-rank checks: no mpirun on the PATH");
        return false;
    };
    if !String::from_utf8_lossy(&version.stdout).contains("Open MPI") {
        println!("mpi: SKIPPED the multi-rank checks: mpirun is not Open MPI's");
        return false;
    }
    true
}

/// This process's CPU time (user + system), in seconds, from
/// `/proc/self/stat` (clock ticks of 1/100 s on Linux).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    // utime and stime: fields 14 and 15, the 12th and 13th after the name.
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    ticks as f64 / 100.0
}

/// A collective in flight while its peer is late costs no core: the
/// progress thread backs off to naps instead of spinning. Rank 1 comes to
/// the all-reduce a second late; rank 0 measures its own CPU time over its
/// wait. Spinning (or yielding) would use one core, about the whole wait;
/// the bound is half of it (generous: a loaded machine only lowers it).
fn waiting_costs_no_core(engine: &Engine, comm: &Communicator) {
    let (rank, size) = (comm.rank(), comm.size());
    if size < 2 {
        return;
    }
    let v = engine.var(vec![1.0f32; 16]);
    gathered(engine, comm, 0); // the ranks start together
    if rank == 1 {
        std::thread::sleep(Duration::from_secs(1));
    }
    let (cpu, start) = (cpu_seconds(), std::time::Instant::now());
    comm.all_reduce(&v).push().unwrap().wait().unwrap();
    let (cpu, wall) = (cpu_seconds() - cpu, start.elapsed().as_secs_f64());
    if rank == 0 {
        println!("rank 0 waited {wall:.3} s for a late rank, using {cpu:.2} s of CPU");
        assert!(wall > 0.5, "rank 1 was not late ({wall} s)");
        assert!(
            cpu < 0.5 * wall,
            "the progress thread used {cpu:.2} s of CPU over a {wall:.2} s wait"
        );
    }
}

/// Waits for `child` until `deadline` after `start`; `None` (the child
/// killed) if it is still running then.
fn wait_within(
    child: &mut std::process::Child,
    start: std::time::Instant,
    deadline: Duration,
) -> Option<std::process::ExitStatus> {
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        if start.elapsed() > deadline {
            child.kill().ok();
            child.wait().ok();
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Runs this binary under `mpirun -np {ranks}` (oversubscribed: this
/// machine may have fewer cores), at most `DEADLINE` (a hang fails);
/// returns the digest lines its ranks printed (`digest:`, `group digest:`,
/// `quantized digest:`).
fn run_ranks(ranks: usize) -> Vec<String> {
    const DEADLINE: Duration = Duration::from_secs(300);
    let exe = std::env::current_exe().unwrap();
    let mut child = Command::new("mpirun")
        .args(["--allow-run-as-root", "--oversubscribe", "-np"])
        .arg(ranks.to_string())
        .arg(exe)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("mpirun");
    // Read the pipes on threads (a full pipe would stall the ranks).
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut stdout, &mut s).ok();
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut stderr, &mut s).ok();
        s
    });
    let status = wait_within(&mut child, std::time::Instant::now(), DEADLINE);
    let stdout = out.join().unwrap();
    print!("{stdout}");
    eprint!("{}", err.join().unwrap());
    let status =
        status.unwrap_or_else(|| panic!("mpirun -np {ranks} hung: killed after {DEADLINE:?}"));
    assert!(status.success(), "mpirun -np {ranks} failed: {status}");
    assert_eq!(stdout.matches("all MPI checks passed").count(), ranks);
    assert_eq!(stdout.matches("group checks passed").count(), ranks);
    stdout
        .lines()
        .filter(|l| l.contains("digest:"))
        .map(str::to_string)
        .collect()
}

/// The environment variable that makes this binary, under `mpirun`, the
/// rank-panics case of [`a_panicking_rank_aborts_the_job`].
const PANIC_CASE: &str = "DEPFLOW_MPI_PANIC_CASE";

/// Under `mpirun -np 2` with [`PANIC_CASE`] set: rank 1 panics holding a
/// communicator made with `abort_on_panic`, while rank 0 waits in an
/// all-reduce that rank 1 never joins.
fn panic_case() {
    let (universe, _) =
        mpi::initialize_with_threading(mpi::Threading::Multiple).expect("MPI initialises");
    let world = universe.world();
    let engine = Engine::new();
    let comm = Communicator::new(&engine, &world).unwrap().abort_on_panic();
    let grad = engine.var(vec![1.0f32; 4]);
    if world.rank() == 1 {
        panic!("rank 1 gives up before its all-reduce");
    }
    let _ = comm.all_reduce(&grad).push().unwrap().wait();
    println!("rank 0's all-reduce returned: the job was not aborted");
}

/// A rank that panics with `abort_on_panic` takes the job down at once
/// (without it, the other rank waits in its all-reduce for ever: this
/// runner's deadline would fail the check).
fn a_panicking_rank_aborts_the_job() {
    const DEADLINE: Duration = Duration::from_secs(60);
    let start = std::time::Instant::now();
    let mut child = Command::new("mpirun")
        .args(["--allow-run-as-root", "--oversubscribe", "-np", "2"])
        .arg(std::env::current_exe().unwrap())
        .env(PANIC_CASE, "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("mpirun");
    let status = wait_within(&mut child, start, DEADLINE);
    let output = child.wait_with_output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
    let status = status.unwrap_or_else(|| {
        panic!("a rank panicked and the job was not aborted within {DEADLINE:?}:\n{stdout}{stderr}")
    });
    assert!(!status.success(), "the job succeeded:\n{stdout}{stderr}");
    assert!(
        stderr.contains("rank 1 gives up") && stderr.contains("aborting the MPI job"),
        "{stdout}{stderr}"
    );
    assert!(!stdout.contains("was not aborted"), "{stdout}");
    println!(
        "mpi: a panicking rank aborted the 2-rank job in {:.1} s",
        start.elapsed().as_secs_f64()
    );
}

fn main() {
    let under_mpirun = std::env::var_os("OMPI_COMM_WORLD_SIZE").is_some()
        || std::env::var_os("PMI_SIZE").is_some();
    // Flags libtest passes (`--list` for discovery): nothing to list.
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    if under_mpirun && std::env::var_os(PANIC_CASE).is_some() {
        return panic_case();
    }
    // Ranks other than 2 too: 3 (not a power of two) and 4, oversubscribed.
    let multi: Vec<(usize, Vec<String>)> = if !under_mpirun && have_mpirun() {
        a_panicking_rank_aborts_the_job();
        [2, 3, 4].into_iter().map(|n| (n, run_ranks(n))).collect()
    } else {
        Vec::new()
    };
    let (universe, level) =
        mpi::initialize_with_threading(mpi::Threading::Multiple).expect("MPI initialises");
    assert!(level >= mpi::Threading::Serialized, "{level:?}");
    let world = universe.world();
    checks(&world);
    group::checks(&world);
    let here = format!("digest: {:016x}", digest(&local_sum(0, 1)));
    for (n, digests) in multi {
        // The 1-rank run on the same global batches over as many devices
        // (2 per rank: the same rows on each).
        let single = format!("quantized digest: {:016x}", group::single(2 * n));
        let of = |prefix: &str| -> Vec<&String> {
            digests.iter().filter(|d| d.starts_with(prefix)).collect()
        };
        let plain = of("digest:");
        assert_eq!(plain.len(), n);
        assert!(
            plain.iter().all(|d| **d == here),
            "{plain:?} vs the 1-rank {here}"
        );
        let quantized = of("quantized digest:");
        assert_eq!(quantized.len(), n);
        assert!(
            quantized.iter().all(|d| **d == single),
            "{quantized:?} vs the 1-rank {single}"
        );
        println!("mpi: {n} ranks agree with the 1-rank run ({here}; the group's {single})");
        if n == 2 {
            // The 2-rank group's weights: the reference of 2 ranks x 2
            // devices, computed here.
            let want = format!("group digest: {:016x}", digest32(&group::reference(2, 2)));
            let groups = of("group digest:");
            assert_eq!(groups.len(), 2);
            assert!(groups.iter().all(|d| **d == want), "{groups:?} vs {want}");
            println!("mpi: the 2-rank group's weights are the reference's ({want})");
        }
    }
}
