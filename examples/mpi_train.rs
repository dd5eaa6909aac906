//! Data-parallel training across processes and devices: the multi-layer
//! perceptron of the `data_parallel` example (UCI's 8x8 handwritten digits,
//! shipped inside the `smartcore` crate) in a [`Group`] that spans every
//! rank's local devices ([`GroupBuilder::across_ranks`]): each rank takes
//! its share of every global batch and splits it over its devices; each
//! bucket of gradients is reduced over the local devices (the ring's
//! reduce-scatter), all-reduced across ranks (one MPI collective per
//! chunk, pushed as an op), and spread back to the local devices (the
//! ring's all-gather), right behind the backward op that writes it, while
//! the layers below still compute; every replica on every rank then
//! applies the same update.
//!
//! ```text
//! cargo build --release --features mpi --example mpi_train
//! mpirun -np 2 target/release/examples/mpi_train              # as root: add --allow-run-as-root
//! mpirun -np 2 target/release/examples/mpi_train --epochs 20 --devices 1
//! ```
//!
//! Rank 0 prints the mean training loss per epoch (over the global batch,
//! the ranks' losses all-reduced), the time per epoch, and at the end the
//! held-out accuracy and whether the weights are identical on every
//! replica of every rank (a checksum of their bits, all-reduced as a
//! maximum and a minimum). The program exits non-zero if they are not, or
//! if the accuracy is below `MIN_ACCURACY` (after 5 epochs or more). With
//! one process (`cargo run --features mpi --example mpi_train`) it trains
//! the same model on the whole batch, over its local devices.
//!
//! [`Group`]: depflow::parallel::Group
//! [`GroupBuilder::across_ranks`]: depflow::parallel::GroupBuilder::across_ranks

#[path = "data_parallel/data.rs"]
mod data;
#[path = "data_parallel/model.rs"]
mod model;
#[path = "data_parallel/settings.rs"]
mod settings;

use std::process::ExitCode;
use std::time::{Duration, Instant};

use data::{Data, FEATURES, Rng};
use depflow::mpi; // rsmpi, as depflow re-exports it
use depflow::parallel::Group;
use depflow::{Communicator, Engine, Error, Executor, ReduceOp};
use model::{Mlp, Weights};
use settings::{BATCH, CHECKED_FROM, MIN_ACCURACY, SEED, layers, sgd};

const EPOCHS: usize = 10;
/// Local devices per rank unless `--devices N`.
const DEVICES: usize = 2;

fn main() -> ExitCode {
    let Some((epochs, devices)) = args() else {
        eprintln!("usage: mpi_train [--epochs N] [--devices N]");
        return ExitCode::FAILURE;
    };
    let (universe, _) =
        mpi::initialize_with_threading(mpi::Threading::Multiple).expect("MPI initialises");
    let world = universe.world();
    let result = train(&world, epochs, devices);
    drop(world);
    drop(universe); // MPI_Finalize, after the engine and the communicator are gone
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("check failed: weights differ, or accuracy below {MIN_ACCURACY}");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn args() -> Option<(usize, usize)> {
    let (mut epochs, mut devices) = (EPOCHS, DEVICES);
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let n = it.next()?.parse().ok().filter(|&n| n > 0)?;
        match arg.as_str() {
            "--epochs" => epochs = n,
            "--devices" => devices = n,
            _ => return None,
        }
    }
    Some((epochs, devices))
}

fn train(
    world: &mpi::topology::SimpleCommunicator,
    epochs: usize,
    devices: usize,
) -> Result<bool, Error> {
    let mut b = Engine::builder().threads(1);
    for d in 0..devices {
        b = b.device(format!("cpu{d}"), Executor::pool(1));
    }
    let engine = b.build()?;
    let comm = Communicator::new(&engine, world)?;
    let (rank, size) = (comm.rank(), comm.size());
    if BATCH % (size * devices) != 0 {
        return Err(Error::Parallel(format!(
            "the batch of {BATCH} does not split over {size} rank(s) x {devices} device(s)"
        )));
    }
    let rows = BATCH / size;
    let data = Data::load(SEED);
    let mut group = Group::builder(&engine)
        .devices((0..devices).map(|d| engine.device(&format!("cpu{d}")).expect("built above")))
        .input(FEATURES)
        .input(1)
        .optimizer(sgd)
        .across_ranks(&comm)
        .build()?;
    let dims = layers();
    // The same seeded start on every rank.
    let mlp = Mlp::new(&mut group, &engine, &dims, SEED)?;

    if rank == 0 {
        println!(
            "{size} rank(s) x {devices} device(s), {} samples each per batch of {BATCH}",
            BATCH / size / devices
        );
    }
    let steps = data.train_y.len() / BATCH;
    // This rank's rows of global batch `step`.
    let share =
        |order: &[usize], step: usize| data.batch(&order[step * BATCH + rank * rows..], 0, rows);
    let mut times = Vec::new();
    for epoch in 0..epochs {
        let mut order: Vec<usize> = (0..data.train_y.len()).collect();
        Rng(SEED + 1 + epoch as u64).shuffle(&mut order);
        let start = Instant::now();
        mlp.epoch(&mut group, steps, |step| share(&order, step))?;
        // The epoch's losses on this rank, then over every rank (pushed
        // from this thread, after the steps' collectives, as on every rank).
        let total = mlp.take_losses(&engine)?;
        let loss = engine.var(vec![total]);
        comm.all_reduce(&loss).name("loss").push()?.wait()?;
        engine.wait_all().wait()?;
        times.push(start.elapsed());
        if rank == 0 {
            let mean = engine.get(&loss).wait()?[0] / (steps * BATCH) as f32;
            println!(
                "epoch {epoch:>2}: mean loss {mean:.4}, {:.1} ms",
                ms(times[epoch])
            );
        }
    }

    // Every local replica, then every rank: a checksum of the weights'
    // bits, its maximum and minimum over the ranks.
    let replica = |d: usize| mlp.replica(&group, d);
    let first = replica(0)?;
    let mut local = true;
    for d in 1..devices {
        local &= replica(d)? == first;
    }
    let sum = checksum(&first);
    let (hi, lo) = (engine.var(vec![sum]), engine.var(vec![sum]));
    comm.all_reduce(&hi).reduce(ReduceOp::Max).push()?;
    comm.all_reduce(&lo).reduce(ReduceOp::Min).push()?;
    let same = local && engine.get(&hi).wait()?[0] == engine.get(&lo).wait()?[0];
    let accuracy = mlp.accuracy(&first, &data.test_x, &data.test_y);
    if rank == 0 {
        let mean = times.iter().skip(1).sum::<Duration>().as_secs_f64() * 1e3
            / times.len().saturating_sub(1).max(1) as f64;
        println!("held-out accuracy {:.1}%", accuracy * 100.0);
        println!("time per epoch: {mean:.1} ms (mean after the first)");
        println!(
            "weights identical on all {devices} replica(s) of all {size} rank(s): {} (checksum {sum:016x})",
            if same { "yes" } else { "NO" }
        );
    }
    comm.shutdown()?;
    Ok(same && (epochs < CHECKED_FROM || accuracy >= MIN_ACCURACY))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// FNV-1a over the weights' bits.
fn checksum(weights: &Weights) -> u64 {
    weights
        .iter()
        .flat_map(|(w, b)| w.iter().chain(b))
        .fold(0xcbf2_9ce4_8422_2325, |h, v| {
            v.to_bits()
                .to_le_bytes()
                .iter()
                .fold(h, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
        })
}
