//! Data-parallel training with `depflow::parallel`: an MLP classifier on
//! UCI's handwritten digits (shipped in the `smartcore` crate), on 1, 2 and
//! 4 CPU devices.
//!
//! ```text
//! cargo run --release --example data_parallel
//! cargo run --release --example data_parallel -- --epochs 3
//! cargo run --release --example data_parallel -- --comm
//! cargo run --release --example data_parallel -- --simulated-gpus
//! cargo run --release --features cuda --example data_parallel -- --cuda
//! cargo run --release --example data_parallel -- --trace /tmp/dp
//! ```
//!
//! With `--trace PREFIX` each device count's trace of the second half of
//! the epochs is written as Chrome trace-event JSON to `PREFIX1.json`,
//! `PREFIX2.json`, `PREFIX4.json` (open them in Perfetto): which reduction
//! ran when, on which device, next to which backward op.
//!
//! With `--cuda` (built with `--features cuda`) device `d` is CUDA device
//! `d` (`Executor::cuda(d, 1)`), for the device counts the machine has
//! (one device per GPU: the engine refuses two on one GPU); the bodies are
//! the same host code, run on each device's launcher thread with its
//! context current, as on simulated GPUs.
//!
//! With `--simulated-gpus` the devices are simulated GPUs
//! (`Executor::simulated_gpu`): the splits go to their host-to-device lane,
//! and every op's body runs on the device's launcher thread (the buffers
//! are host memory: there is no kernel to enqueue). No overlap figure
//! then: a stream op's span in the trace runs until the device's poller
//! sees its completion, not only while its work ran.
//!
//! Each device count trains the same model from the same initial weights
//! on the same batches: every batch is split over the devices (the next
//! batch's split is loaded while the current step runs), each device
//! pushes its forward and backward ops, each layer's gradients are summed
//! across devices by a ring all-reduce pushed right behind the op that
//! writes them (on the device itself, or with `--comm` on a communication
//! device of its own per device, as NCCL has its own stream), and the SGD
//! update runs on every replica. It prints per device count the loss
//! of each epoch, held-out accuracy, time per epoch, whether all replicas
//! hold the same bits, and, from the engine's trace of the second half of
//! the epochs (per-op start and end), the share of the all-reduce ops' time during
//! which a backward op was running.

mod data;
mod model;
mod settings;

use std::process::ExitCode;
use std::time::Instant;

use data::{CLASSES, Data, FEATURES, Rng};
use depflow::parallel::{Group, Overlap};
use depflow::{Engine, Error, Executor, Tracing};
use model::Mlp;
use settings::{BATCH, CHECKED_FROM, HIDDEN, MIN_ACCURACY, SEED, layers, sgd};

const DEFAULT_EPOCHS: usize = 8;

struct Run {
    losses: Vec<f32>,
    accuracy: f64,
    epoch_ms: f64,
    identical: bool,
    overlap: Option<Overlap>,
}

/// What the command line asks for.
#[derive(Clone, Copy, PartialEq)]
enum Devices {
    Cpu,
    SimulatedGpus,
    Cuda,
}

struct Args {
    epochs: usize,
    /// Reductions on a communication device of their own per device.
    comm: bool,
    /// What each device is.
    devices: Devices,
    /// Where to write each device count's trace (Chrome JSON), if asked.
    trace: Option<String>,
}

fn train(data: &Data, n: usize, args: &Args) -> Result<Run, Error> {
    let (epochs, comm) = (args.epochs, args.comm);
    let mut b = Engine::builder().threads(1).tracing(Tracing::Paused);
    for d in 0..n {
        let exec = match args.devices {
            Devices::Cpu => Executor::pool(1),
            Devices::SimulatedGpus => Executor::simulated_gpu(1),
            #[cfg(feature = "cuda")]
            Devices::Cuda => Executor::cuda(d, 1),
            // run() refuses --cuda where there is no CUDA device, which is
            // always without the feature.
            #[cfg(not(feature = "cuda"))]
            Devices::Cuda => unreachable!("--cuda without the cuda feature"),
        };
        b = b.device(format!("cpu{d}"), exec);
        if comm {
            b = b.device(format!("comm{d}"), Executor::pool(1));
        }
    }
    let engine = b.build()?;
    let mut gb = Group::builder(&engine).input(FEATURES).input(1);
    for d in 0..n {
        let dev = |name: String| engine.device(&name).expect("built above");
        gb = if comm {
            gb.device_with_comm(dev(format!("cpu{d}")), dev(format!("comm{d}")))
        } else {
            gb.device(dev(format!("cpu{d}")))
        };
    }
    let mut group = gb.optimizer(sgd).build()?;
    let dims = layers();
    let mlp = Mlp::new(&mut group, &engine, &dims, SEED)?;

    let steps = data.train_y.len() / BATCH;
    let (mut losses, mut elapsed) = (Vec::new(), 0.0);
    for epoch in 0..epochs {
        if epoch == epochs / 2 {
            engine.start_trace()?; // the second half: warmed up
        }
        let mut order: Vec<usize> = (0..data.train_y.len()).collect();
        Rng(SEED + 1 + epoch as u64).shuffle(&mut order);
        let start = Instant::now();
        mlp.epoch(&mut group, steps, |step| data.batch(&order, step, BATCH))?;
        // The epoch's losses, once every step's have been written.
        let total = mlp.take_losses(&engine)?;
        engine.wait_all().wait()?;
        elapsed += start.elapsed().as_secs_f64();
        losses.push(total / (steps * BATCH) as f32);
    }
    engine.stop_trace()?;
    let trace = engine.trace()?;
    if let Some(prefix) = &args.trace {
        trace.write_chrome_json(format!("{prefix}{n}.json"))?;
    }
    // On a stream device an op's span runs from its launch until the
    // poller sees its event: not the time its work ran. No figure there.
    let overlap = (n > 1 && args.devices == Devices::Cpu)
        .then(|| Overlap::measure(&trace, |op| op.name() == Some("backward")));
    let replica = |d: usize| mlp.replica(&group, d);
    let first = replica(0)?;
    let mut identical = true;
    for d in 1..n {
        identical &= replica(d)? == first;
    }
    Ok(Run {
        losses,
        accuracy: mlp.accuracy(&first, &data.test_x, &data.test_y),
        epoch_ms: elapsed * 1e3 / epochs as f64,
        identical,
        overlap,
    })
}

fn args() -> Result<Args, Error> {
    let usage = || {
        Error::Config(
            "usage: data_parallel [--epochs N] [--comm] [--simulated-gpus | --cuda] [--trace PREFIX]".into(),
        )
    };
    let mut args = Args {
        epochs: DEFAULT_EPOCHS,
        comm: false,
        devices: Devices::Cpu,
        trace: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--epochs" => {
                args.epochs = it
                    .next()
                    .and_then(|n| n.parse().ok())
                    .filter(|&n| n > 0)
                    .ok_or_else(usage)?
            }
            "--comm" => args.comm = true,
            "--simulated-gpus" => args.devices = Devices::SimulatedGpus,
            "--cuda" => args.devices = Devices::Cuda,
            "--trace" => args.trace = Some(it.next().ok_or_else(usage)?),
            _ => return Err(usage()),
        }
    }
    Ok(args)
}

fn run() -> Result<bool, Error> {
    let args = args()?;
    let epochs = args.epochs;
    let data = Data::load(SEED);
    let kind = match args.devices {
        Devices::Cpu => "CPU devices",
        Devices::SimulatedGpus => "simulated GPUs",
        Devices::Cuda => "CUDA devices",
    };
    let counts: Vec<usize> = match args.devices {
        Devices::Cuda => {
            let gpus = depflow::stream::cuda_devices()
                .map_err(|why| Error::Config(format!("--cuda: {why}")))?;
            [1, 2, 4].into_iter().filter(|&n| n <= gpus).collect()
        }
        _ => vec![1, 2, 4],
    };
    println!(
        "digits: {} training, {} held-out samples; MLP {FEATURES}-{:?}-{CLASSES}; batch {} split over the devices ({kind}), {epochs} epochs",
        data.train_y.len(),
        data.test_y.len(),
        HIDDEN,
        BATCH,
    );
    let mut ok = true;
    for n in counts {
        let r = train(&data, n, &args)?;
        let losses: Vec<String> = r.losses.iter().map(|l| format!("{l:.3}")).collect();
        println!("{n} device(s): loss by epoch [{}]", losses.join(", "));
        println!(
            "  held-out accuracy {:.1}%, {:.1} ms per epoch, replicas identical: {}",
            r.accuracy * 100.0,
            r.epoch_ms,
            r.identical
        );
        if let Some(o) = r.overlap {
            println!(
                "  all-reduce (second half of the epochs, {} ops): {:.2} ms, of which {:.2} ms ({:.0}%) under backward compute",
                o.ops,
                o.reduce.as_secs_f64() * 1e3,
                o.hidden.as_secs_f64() * 1e3,
                o.fraction() * 100.0
            );
        }
        ok &= r.identical && (epochs < CHECKED_FROM || r.accuracy >= MIN_ACCURACY);
    }
    Ok(ok)
}

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("check failed: replicas differ, or accuracy below {MIN_ACCURACY}");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
