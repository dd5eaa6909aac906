//! The engine's all-reduce op against a direct blocking `MPI_Allreduce`
//! of the same size (both in place, f32 sums), 1 KiB to 64 MiB.
//!
//! ```text
//! cargo bench --features mpi --bench mpi_allreduce --no-run
//! mpirun -np 2 target/release/deps/mpi_allreduce-* [--quick] [--size BYTES]...   # as root: --allow-run-as-root
//! ```
//!
//! Per size, rank 0 prints the median over blocks of the mean time per
//! all-reduce, for each path, the engine's overhead relative to the direct
//! call, the algorithm bandwidth (bytes / time), and the time per
//! all-reduce when 8 are pushed back to back (up to 16 MiB, timed after the
//! others, in blocks of their own). The engine's time is
//! push to resolved handle: taking the buffer out of the variable, the
//! issue (`MPI_Iallreduce`, or from 64 KiB the first step of the engine's
//! own ring) and the progress thread's `MPI_Testsome` until done (posting
//! the ring's next steps), the task woken and the buffer put back. Blocks alternate
//! between the two paths, after a barrier, so both see the same machine.
//! The values are checked (every rank's sum) after each size.

use std::ffi::c_void;
use std::time::Instant;

use depflow::mpi::collective::CommunicatorCollectives;
use depflow::mpi::traits::{AsRaw, Communicator as _};
use depflow::mpi::{self, ffi};
use depflow::{Communicator, Engine, Executor};

const KIB: usize = 1024;
/// All-reduces in flight at once in the last column.
const IN_FLIGHT: usize = 8;
/// Open MPI's `MPI_IN_PLACE`, `(void *) 1` (a sentinel, not an address).
const IN_PLACE: *const c_void = std::ptr::without_provenance(1);

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let (universe, _) =
        mpi::initialize_with_threading(mpi::Threading::Multiple).expect("MPI initialises");
    let world = universe.world();
    let (rank, size) = (world.rank() as usize, world.size() as usize);
    // The collectives' bodies on an inline device: the progress thread
    // that sees a request complete finishes its op itself (no hop to a
    // pool worker); `--pool` runs them on the default pool instead.
    let pool = std::env::args().any(|a| a == "--pool");
    let engine = Engine::builder()
        .device("mpi", Executor::inline())
        .build()
        .expect("engine");
    let mut comm = Communicator::new(&engine, &world).expect("communicator");
    if !pool {
        comm = comm.on(engine.device("mpi").unwrap());
    }
    if rank == 0 {
        println!(
            "all-reduce (sum of f32, in place), {size} rank(s), engine ops on {}; median of blocks, mean per call",
            if pool { "the pool" } else { "an inline device" }
        );
        println!(
            "{:>9} {:>12} {:>12} {:>12} {:>9} {:>11} {:>11} {:>12}",
            "size", "direct", "Iallreduce", "engine", "engine/", "direct", "engine", "engine, 8"
        );
        println!(
            "{:>9} {:>12} {:>12} {:>12} {:>9} {:>11} {:>11} {:>12}",
            "", "µs", "+Wait µs", "µs", "direct", "GB/s", "GB/s", "in flight µs"
        );
    }
    // `--size BYTES` (repeatable): only those sizes.
    let args: Vec<String> = std::env::args().collect();
    let chosen: Vec<usize> = args
        .windows(2)
        .filter(|w| w[0] == "--size")
        .map(|w| w[1].parse().expect("--size takes a byte count"))
        .collect();
    let sizes: Vec<usize> = if chosen.is_empty() {
        (0..=8).map(|i| KIB << (2 * i)).collect() // 1 KiB .. 64 MiB
    } else {
        chosen
    };
    for bytes in sizes {
        let n = bytes / 4;
        // Enough calls per block for ~20 ms at 1 GB/s, 2 to 200 of them.
        let calls = (20_000_000 / bytes).clamp(2, 200);
        let blocks = if quick { 3 } else { 7 };
        // Zeros while timed (sums that stay finite), then one checked call.
        let mut direct_buf = vec![0.0f32; n];
        let mut nonblocking_buf = vec![0.0f32; n];
        let var = engine.var(vec![0.0f32; n]);
        // Eight buffers reduced back to back (as a training step's
        // gradients are), up to 16 MiB each: the time per all-reduce.
        let batch: Vec<_> = if bytes <= 16 * KIB * KIB {
            (0..IN_FLIGHT)
                .map(|_| engine.var(vec![0.0f32; n]))
                .collect()
        } else {
            Vec::new()
        };
        let (mut direct, mut nonblocking, mut through) = (Vec::new(), Vec::new(), Vec::new());
        let mut batched = Vec::new();
        // A warm-up of each path, then the blocks.
        for block in 0..=blocks {
            // Each path on a buffer of its own, first warmed by one call
            // that is not timed: a path timed right after another on the
            // same buffer would find it in cache, the next one not.
            world.barrier();
            direct_allreduce(&world, &mut direct_buf);
            let t = Instant::now();
            for _ in 0..calls {
                direct_allreduce(&world, &mut direct_buf);
            }
            let d = t.elapsed().as_secs_f64() / calls as f64;
            world.barrier();
            direct_iallreduce(&world, &mut nonblocking_buf);
            let t = Instant::now();
            for _ in 0..calls {
                direct_iallreduce(&world, &mut nonblocking_buf);
            }
            let i = t.elapsed().as_secs_f64() / calls as f64;
            world.barrier();
            comm.all_reduce(&var).push().unwrap().wait().unwrap();
            let t = Instant::now();
            for _ in 0..calls {
                comm.all_reduce(&var).push().unwrap().wait().unwrap();
            }
            let e = t.elapsed().as_secs_f64() / calls as f64;
            if block > 0 {
                nonblocking.push(i);
                direct.push(d);
                through.push(e);
            }
        }
        // The batches apart, after: in the blocks above, 8 large
        // collectives in flight slowed the direct call timed after them.
        for block in 0..=blocks {
            world.barrier();
            let rounds = calls.div_ceil(IN_FLIGHT);
            let t = Instant::now();
            for _ in 0..rounds {
                for v in &batch {
                    comm.all_reduce(v).push().unwrap();
                }
                engine.wait_all().wait().unwrap();
            }
            let b = t.elapsed().as_secs_f64() / (rounds * IN_FLIGHT) as f64;
            if block > 0 {
                batched.push(b);
            }
        }
        // Checks: each rank gives rank + 1 everywhere.
        let want = (size * (size + 1) / 2) as f32;
        direct_buf.fill(rank as f32 + 1.0);
        direct_allreduce(&world, &mut direct_buf);
        assert!(direct_buf.iter().all(|&v| v == want), "direct sum");
        let k = var.key();
        engine
            .push(&[], &[&var], move |ctx| {
                ctx.write(k)?.fill(rank as f32 + 1.0);
                Ok(())
            })
            .unwrap();
        comm.all_reduce(&var).push().unwrap().wait().unwrap();
        let got = engine.get(&var).wait().unwrap();
        assert!(got.iter().all(|&v| v == want), "the engine's sum");
        let d = median(&mut direct);
        let e = median(&mut through);
        let i = median(&mut nonblocking);
        let b = if batch.is_empty() {
            "-".to_string()
        } else {
            format!("{:.1}", median(&mut batched) * 1e6)
        };
        if rank == 0 {
            println!(
                "{:>9} {:>12.1} {:>12.1} {:>12.1} {:>9.3} {:>11.2} {:>11.2} {:>12}",
                human(bytes),
                d * 1e6,
                i * 1e6,
                e * 1e6,
                e / d,
                bytes as f64 / d / 1e9,
                bytes as f64 / e / 1e9,
                b
            );
        }
    }
    comm.shutdown().expect("nothing in flight");
    drop(comm);
    drop(engine);
}

/// A blocking in-place `MPI_Allreduce` (sum) over `world`.
fn direct_allreduce(world: &mpi::topology::SimpleCommunicator, buf: &mut [f32]) {
    // SAFETY: `IN_PLACE` is Open MPI's (this bench runs on Open MPI); `buf` holds `len` f32s; the world communicator is live.
    let rc = unsafe {
        ffi::MPI_Allreduce(
            IN_PLACE,
            buf.as_mut_ptr().cast(),
            buf.len() as i32,
            ffi::RSMPI_FLOAT,
            ffi::RSMPI_SUM,
            world.as_raw(),
        )
    };
    assert_eq!(rc, 0, "MPI_Allreduce");
}

/// `MPI_Iallreduce` then `MPI_Wait`: the non-blocking algorithm the
/// engine issues, completed by blocking.
fn direct_iallreduce(world: &mpi::topology::SimpleCommunicator, buf: &mut [f32]) {
    // SAFETY: as in `direct_allreduce`; the request is waited for before
    // `buf` is touched again.
    unsafe {
        let mut request = ffi::RSMPI_REQUEST_NULL;
        let rc = ffi::MPI_Iallreduce(
            IN_PLACE,
            buf.as_mut_ptr().cast(),
            buf.len() as i32,
            ffi::RSMPI_FLOAT,
            ffi::RSMPI_SUM,
            world.as_raw(),
            &mut request,
        );
        assert_eq!(rc, 0, "MPI_Iallreduce");
        let rc = ffi::MPI_Wait(&mut request, ffi::RSMPI_STATUS_IGNORE);
        assert_eq!(rc, 0, "MPI_Wait");
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn human(bytes: usize) -> String {
    if bytes >= KIB * KIB {
        format!("{} MiB", bytes / KIB / KIB)
    } else {
        format!("{} KiB", bytes / KIB)
    }
}
