//! Collectives across processes (the `mpi` feature), with its own `main`
//! (MPI is initialised and finalised once per process).
//!
//! `cargo test --features mpi --test mpi` runs it as one rank (MPI's
//! singleton) and, where `mpirun` is on the PATH, first runs itself under
//! `mpirun -np 2` and checks that both ranks passed and printed the same
//! digest of their results as the 1-rank run on the same global data. The
//! data-parallel group across ranks (`mpi/group.rs`, 2 local devices per
//! rank) is checked the same way: both ranks' weights identical and equal
//! to the serial reference in the group's order of summation, which the
//! 1-rank process computes too.
//! Without `mpirun` it says so and runs the 1-rank checks only. Under
//! `mpirun` directly (`mpirun -np 2 target/debug/deps/mpi-*`) it runs the
//! checks on every rank.

#[path = "mpi/group.rs"]
mod group;

use std::process::Command;
use std::sync::mpsc;
use std::time::Duration;

use depflow::{Communicator, Engine, Error, ReduceOp, Var};
use mpi::traits::Communicator as _;

/// Global data: `SHARDS` shards, rank `r` of `n` holds shards `r, r+n, ...`
/// (summed locally before the all-reduce). Values are small dyadic
/// rationals, so every summation order gives the same bits.
const SHARDS: usize = 2;
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
    errors(&engine, &comm);

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

fn collective_failure<T: std::fmt::Debug>(r: &Result<T, Error>) -> bool {
    match r {
        Err(e @ Error::Failed(_)) => matches!(
            std::error::Error::source(e).and_then(|s| s.downcast_ref::<Error>()),
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
    let r = comm
        .all_gather(&input, &output)
        .name("bad gather")
        .push()
        .unwrap()
        .wait();
    assert!(collective_failure(&r), "{r:?}");
    let after = engine.push(&[&output], &[], |_| Ok(())).unwrap().wait();
    assert!(
        matches!(after, Err(Error::Poisoned(_))),
        "output not poisoned: {after:?}"
    );

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
        Err(Error::Poisoned(cause)) => assert_eq!(cause.op_name(), Some("load")),
        other => panic!("{other:?}"),
    }

    // MPI's own error (a sum of booleans: MPI_ERR_OP), returned, not fatal.
    let flags = engine.var(vec![true, false]);
    let r = comm
        .all_reduce(&flags)
        .name("bool sum")
        .push()
        .unwrap()
        .wait();
    assert!(collective_failure(&r), "{r:?}");
    let after = engine.push(&[&flags], &[], |_| Ok(())).unwrap().wait();
    assert!(matches!(after, Err(Error::Poisoned(_))), "{after:?}");

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

/// Runs this binary under `mpirun -np 2`; returns the digests its ranks
/// printed (`digest:` and `group digest:` lines), or `None` without `mpirun`.
fn two_ranks() -> Option<Vec<String>> {
    let version = Command::new("mpirun").arg("--version").output();
    let Ok(version) = version else {
        println!("mpi: SKIPPED the 2-rank checks: no mpirun on the PATH");
        return None;
    };
    if !String::from_utf8_lossy(&version.stdout).contains("Open MPI") {
        // The flags below are Open MPI's.
        println!("mpi: SKIPPED the 2-rank checks: mpirun is not Open MPI's");
        return None;
    }
    let exe = std::env::current_exe().unwrap();
    let out = Command::new("mpirun")
        .args(["--allow-run-as-root", "--oversubscribe", "-np", "2"])
        .arg(exe)
        .output()
        .expect("mpirun");
    let stdout = String::from_utf8_lossy(&out.stdout);
    print!("{stdout}");
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "mpirun -np 2 failed: {}", out.status);
    assert_eq!(stdout.matches("all MPI checks passed").count(), 2);
    assert_eq!(stdout.matches("group checks passed").count(), 2);
    Some(
        stdout
            .lines()
            .filter(|l| l.starts_with("digest:") || l.starts_with("group digest:"))
            .map(str::to_string)
            .collect(),
    )
}

fn main() {
    let under_mpirun = std::env::var_os("OMPI_COMM_WORLD_SIZE").is_some()
        || std::env::var_os("PMI_SIZE").is_some();
    // Flags libtest passes (`--list` for discovery): nothing to list.
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let multi = if under_mpirun { None } else { two_ranks() };
    let (universe, level) =
        mpi::initialize_with_threading(mpi::Threading::Multiple).expect("MPI initialises");
    assert!(level >= mpi::Threading::Serialized, "{level:?}");
    let world = universe.world();
    checks(&world);
    group::checks(&world);
    if let Some(digests) = multi {
        let here = format!("digest: {:016x}", digest(&local_sum(0, 1)));
        let (plain, groups): (Vec<_>, Vec<_>) =
            digests.iter().partition(|d| d.starts_with("digest:"));
        assert_eq!(plain.len(), 2);
        assert!(
            plain.iter().all(|d| **d == here),
            "{plain:?} vs the 1-rank {here}"
        );
        println!("mpi: 2 ranks agree with the 1-rank run ({here})");
        // The 2-rank group's weights: the reference of 2 ranks x 2
        // devices, computed here.
        let want = format!("group digest: {:016x}", digest32(&group::reference(2, 2)));
        assert_eq!(groups.len(), 2);
        assert!(groups.iter().all(|d| **d == want), "{groups:?} vs {want}");
        println!("mpi: the 2-rank group's weights are the reference's ({want})");
    }
}
