//! Seed 001's program, PaddlePaddle's `parallel_do`, on arrays:
//!
//! ```text
//! pd = ParallelDo(gpu_places)
//! with pd.do(input=data):
//!     prediction = softmax(fc(fc(data, W1), W2))
//! ```
//!
//! The block (two fully connected layers, as the seed writes them: no
//! activation between them; the softmax inside the loss) runs on 1, 2 and
//! 4 CPU devices with `nd::DataParallel`: each batch split across the
//! devices, the backward pass pushed on each, and each parameter's
//! gradient handed to the group's all-reduce as soon as it is done (the
//! seed's "allreduce operators at parallel_do_grad", added by the group,
//! not by the program). Trained on the digits of examples/nd_mlp.rs.
//!
//! ```text
//! cargo run --release --features nd --example nd_parallel_do
//! ```
//!
//! It prints each run's test accuracy and time per step, and exits
//! non-zero unless every run reaches `MIN_ACCURACY`, every replica of a
//! run holds the same weights, and the 2- and 4-device weights are those
//! of the 1-device run within `TOLERANCE`: not bit for bit, since the
//! gradient of a batch is summed over shards of it, in another order than
//! one device's GEMM sums its rows (tests/nd_data_parallel.rs checks the
//! bits against a serial run in the group's order).

use std::time::Instant;

#[allow(dead_code)]
#[path = "data_parallel/data.rs"]
mod data;

use data::{CLASSES, Data, FEATURES, Rng};
use depflow::nd::nn::{self, Linear, Module, Sequential};
use depflow::nd::{self, Array, Arrays, DataParallel};
use depflow::parallel::Group;
use depflow::{Engine, Error, Executor};

const HIDDEN: usize = 64;
const BATCH: usize = 64;
const EPOCHS: usize = 4;
const LEARNING_RATE: f32 = 0.1;
const SEED: u64 = 13;
const MIN_ACCURACY: f32 = 0.93;
/// The largest difference accepted between a weight trained on 2 or 4
/// devices and on 1 (summation order only: about 1e-6 relative per sum).
const TOLERANCE: f32 = 1e-5;

/// `fc(fc(data, W1), W2)`.
fn block(arrays: &Arrays) -> Result<Sequential, Error> {
    Ok(Sequential::new()
        .push(Linear::new(arrays, FEATURES, HIDDEN)?)
        .push(Linear::new(arrays, HIDDEN, CLASSES)?))
}

/// What a run gives: the weights of every replica (per parameter), the
/// test accuracy, the seconds per step.
struct Run {
    weights: Vec<Vec<Vec<f32>>>,
    accuracy: f32,
    per_step: f64,
}

/// One run on `n` devices.
fn run(data: &Data, n: usize) -> Result<Run, Error> {
    let mut builder = Engine::builder();
    for d in 0..n {
        builder = builder.device(format!("gpu{d}"), Executor::pool(1));
    }
    let engine = builder.build()?;
    let places: Vec<_> = (0..n)
        .map(|d| engine.device(&format!("gpu{d}")).unwrap())
        .collect();
    let group = Group::builder(&engine)
        .devices(places.iter().copied())
        .input(FEATURES)
        .input(1) // labels
        .optimizer(|w, g| {
            w.iter_mut()
                .zip(g)
                .for_each(|(w, g)| *w -= LEARNING_RATE * g)
        })
        .build()?;
    let arrays = Arrays::new(&engine);
    arrays.seed(SEED)?;
    let mut pd = DataParallel::new(group, &arrays, block)?;
    // The classes 0..10 on every device: labels become one-hot rows by
    // comparing against them.
    let classes: Vec<Array> = places
        .iter()
        .map(|&p| arrays.on(p)?.arange(CLASSES))
        .collect::<Result<_, _>>()?;

    let rows = data.train_y.len();
    let mut order: Vec<usize> = (0..rows).collect();
    let mut rng = Rng(SEED);
    let (steps, start) = (EPOCHS * (rows / BATCH), Instant::now());
    for _ in 0..EPOCHS {
        rng.shuffle(&mut order);
        for b in 0..rows / BATCH {
            pd.step(data.batch(&order, b, BATCH), |block, inputs, batch_rows| {
                let (x, labels) = (&inputs[0], &inputs[1]);
                let d = places.iter().position(|&p| p == x.device()).unwrap();
                let onehot = labels.eq(&classes[d])?; // [rows, 1] against [10]
                let shard = x.shape()[0] as f32 / batch_rows as f32;
                nn::softmax_cross_entropy(&block.forward(x)?, &onehot)?.mul_scalar(shard)
            })?;
        }
    }
    let weights: Vec<Vec<Vec<f32>>> = (0..n)
        .map(|d| {
            pd.replica(d)
                .parameters()
                .iter()
                .map(|p| p.to_vec().wait())
                .collect::<Result<_, _>>()
        })
        .collect::<Result<_, _>>()?;
    let per_step = start.elapsed().as_secs_f64() / steps as f64;

    // Test accuracy, on replica 0.
    let test = data.test_y.len();
    let x = arrays
        .on(places[0])?
        .from_vec(data.test_x.clone(), &[test, FEATURES])?;
    let y = arrays
        .on(places[0])?
        .from_vec(data.test_y.clone(), &[test])?;
    let predicted = nd::no_grad(|| pd.replica(0).forward(&x)?.softmax(1)?.argmax(1))?;
    let accuracy = predicted.eq(&y)?.mean()?.item()?;
    Ok(Run {
        weights,
        accuracy,
        per_step,
    })
}

fn main() -> Result<(), Error> {
    let data = Data::load(SEED);
    let mut one_device = None;
    let mut ok = true;
    for n in [1, 2, 4] {
        let Run {
            weights,
            accuracy,
            per_step,
        } = run(&data, n)?;
        let alike = weights.iter().all(|w| *w == weights[0]);
        let from_one = one_device.get_or_insert_with(|| weights[0].clone());
        let diff = weights[0]
            .iter()
            .flatten()
            .zip(from_one.iter().flatten())
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        println!(
            "{n} device(s): test accuracy {:.1}%, {:.0} us per step, replicas identical: {alike}, \
             largest difference from 1 device: {diff:.2e}",
            accuracy * 100.0,
            per_step * 1e6
        );
        ok &= alike && accuracy >= MIN_ACCURACY && diff <= TOLERANCE;
    }
    if !ok {
        eprintln!(
            "FAILED: an accuracy under {:.0}%, replicas that differ, or weights off by more than {TOLERANCE}",
            MIN_ACCURACY * 100.0
        );
        std::process::exit(1);
    }
    Ok(())
}
