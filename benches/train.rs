//! Time per training step (issue 31): the digits MLP (64-128-64-10) and
//! SINGA's CNN of examples/nd_cnn.rs, at batch sizes 1, 64 and 256, in
//! depflow's three modes — eager, graph sequential (`Order::Sequential`)
//! and graph parallel (`nd::record`) — on an engine of `Executor::pool(T)`
//! (T = 2 by default). benches/torch_train.py runs the same models, batch
//! sizes, steps and batches in PyTorch's eager CPU mode; benches/README.md
//! has the method and the figures.
//!
//! ```text
//! cargo bench --features nd --bench train                    # the table (~1 min)
//! cargo bench --features nd --bench train -- --quick         # CI size (~3 s)
//! cargo bench --features nd --bench train -- --threads 2 1 --json out.json
//! cargo bench --features nd --bench train -- --sync          # wait for each step's loss
//! cargo bench --features nd --bench train -- --dump /tmp/digits.bin   # for torch_train.py
//! ```
//!
//! # What one row measures
//!
//! A fresh engine, model (seeded) and Adam (lr 3e-3) per row; the step is
//! `zero_grad`, forward, softmax cross-entropy (mean), the loss added into
//! a loss-sum array made outside the step, `backward`, `adam.step()` — the
//! same code eager or recorded (the recording is not timed). Each step
//! first feeds its batch with `set` into input arrays made outside the
//! step (the batches are cut from the shuffled digits before timing, as
//! in `--dump`'s order: epoch e shuffled with splitmix64 seeded
//! `SEED + 1 + e`, batch after batch, epochs as many as the steps need).
//!
//! `WARMUP` steps first, then `runs` runs of `steps` steps each; a run is
//! timed from its first `set` to the engine's `wait_all` after its last
//! step, and the row's figure is the median over runs of run time /
//! steps. By default no step is waited for inside a run (what
//! examples/nd_cnn.rs does, and what a user who reads the loss once an
//! epoch does): pushes run ahead of the workers, each `set` queued behind
//! the previous step's reads of the inputs. `--sync` reads the loss sum
//! after every step instead (PyTorch eager's own behaviour: its ops are
//! synchronous). After the runs the loss sum must be finite, or the bench
//! fails.

use std::time::{Duration, Instant};

#[allow(dead_code)]
#[path = "../examples/data_parallel/data.rs"]
mod data;

use data::{CLASSES, Data, FEATURES, Rng};
use depflow::nd::nn::{self, Conv2d, Flatten, Linear, MaxPool2d, Module, Relu, Sequential};
use depflow::nd::optim::Adam;
use depflow::{Engine, Error, Executor, Order, nd};

const SIDE: usize = 8;
const SEED: u64 = 13;
const LEARNING_RATE: f32 = 3e-3;
const BATCHES: [usize; 3] = [1, 64, 256];
const MODES: [&str; 3] = ["eager", "sequential", "parallel"];
const MODELS: [&str; 2] = ["mlp", "cnn"];
const WARMUP: usize = 5;

/// Steps per run for a batch size (torch_train.py has the same table).
fn steps_for(batch: usize, quick: bool) -> usize {
    match (batch, quick) {
        (1, false) => 200,
        (64, false) => 50,
        (_, false) => 20,
        (1, true) => 20,
        (_, true) => 3,
    }
}

struct Args {
    quick: bool,
    runs: usize,
    threads: Vec<usize>,
    batches: Vec<usize>,
    models: Vec<String>,
    sync: bool,
    json: Option<String>,
    dump: Option<String>,
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        quick: false,
        runs: 5,
        threads: vec![2],
        batches: BATCHES.to_vec(),
        models: MODELS.iter().map(|m| m.to_string()).collect(),
        sync: false,
        json: None,
        dump: None,
    };
    let raw: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    // The values after a flag, up to the next flag.
    let values = |i: &mut usize| -> Vec<String> {
        let mut v = Vec::new();
        while *i + 1 < raw.len() && !raw[*i + 1].starts_with("--") {
            *i += 1;
            v.push(raw[*i].clone());
        }
        v
    };
    let numbers = |flag: &str, v: Vec<String>| -> Result<Vec<usize>, String> {
        let n: Vec<usize> = v
            .iter()
            .map(|s| s.parse().map_err(|e| format!("{flag} {s}: {e}")))
            .collect::<Result<_, _>>()?;
        if n.is_empty() || n.contains(&0) {
            return Err(format!("{flag} needs numbers of at least 1"));
        }
        Ok(n)
    };
    let one = |flag: &str, mut v: Vec<String>| -> Result<String, String> {
        match v.len() {
            1 => Ok(v.remove(0)),
            _ => Err(format!("{flag} needs one value")),
        }
    };
    while i < raw.len() {
        let flag = raw[i].clone();
        match flag.as_str() {
            // cargo bench passes --bench to a harness = false target.
            "--bench" => {}
            "--quick" => a.quick = true,
            "--sync" => a.sync = true,
            "--runs" => a.runs = numbers(&flag, values(&mut i))?[0],
            "--threads" => a.threads = numbers(&flag, values(&mut i))?,
            "--batches" => a.batches = numbers(&flag, values(&mut i))?,
            "--models" => {
                a.models = values(&mut i);
                if a.models.is_empty() || a.models.iter().any(|m| !MODELS.contains(&m.as_str())) {
                    return Err("--models takes mlp and/or cnn".into());
                }
            }
            "--json" => a.json = Some(one(&flag, values(&mut i))?),
            "--dump" => a.dump = Some(one(&flag, values(&mut i))?),
            _ => {
                return Err(format!(
                    "unknown argument {flag}: use --quick, --sync, --runs N, --threads T.., \
                     --batches B.., --models mlp|cnn.., --json PATH, --dump PATH"
                ));
            }
        }
        i += 1;
    }
    if a.quick {
        a.runs = a.runs.min(2);
    }
    Ok(a)
}

/// The digits MLP: 64-128-64-10, ReLU.
fn mlp(arrays: &nd::Arrays) -> Result<Sequential, Error> {
    Ok(Sequential::new()
        .push(Linear::new(arrays, FEATURES, 128)?)
        .push(Relu)
        .push(Linear::new(arrays, 128, 64)?)
        .push(Relu)
        .push(Linear::new(arrays, 64, CLASSES)?))
}

/// examples/nd_cnn.rs's model: SINGA's CNN, its convolutions padded for
/// 8x8 digits (8x8 → 4x4 → 2x2, so 2·2·50 inputs to the first linear).
fn cnn(arrays: &nd::Arrays) -> Result<Sequential, Error> {
    Ok(Sequential::new()
        .push(Conv2d::new(arrays, 1, 20, 5, 2)?)
        .push(Relu)
        .push(MaxPool2d(2))
        .push(Conv2d::new(arrays, 20, 50, 5, 2)?)
        .push(Relu)
        .push(MaxPool2d(2))
        .push(Flatten)
        .push(Linear::new(arrays, 50 * 2 * 2, 500)?)
        .push(Relu)
        .push(Linear::new(arrays, 500, CLASSES)?))
}

/// The batch and the loss sum: arrays made outside the step.
struct Inputs {
    x: nd::Array,
    y: nd::Array,
    loss: nd::Array,
}

fn step(model: &Sequential, adam: &Adam, i: &Inputs) -> Result<(), Error> {
    adam.zero_grad()?;
    let loss = nn::softmax_cross_entropy(&model.forward(&i.x)?, &i.y)?;
    i.loss.add_assign(&loss.detach())?;
    loss.backward()?;
    adam.step()
}

/// `count` batches of `rows` (pixels, one-hot labels), in `--dump`'s order.
fn batches(data: &Data, rows: usize, count: usize) -> Vec<(Vec<f32>, Vec<f32>)> {
    let per_epoch = data.train_y.len() / rows;
    let mut order: Vec<usize> = Vec::new();
    (0..count)
        .map(|k| {
            let (epoch, b) = (k / per_epoch, k % per_epoch);
            if b == 0 {
                order = (0..data.train_y.len()).collect();
                Rng(SEED + 1 + epoch as u64).shuffle(&mut order);
            }
            let [x, labels]: [Vec<f32>; 2] = data.batch(&order, b, rows).try_into().expect("2");
            let mut onehot = vec![0.0; rows * CLASSES];
            for (row, &label) in labels.iter().enumerate() {
                onehot[row * CLASSES + label as usize] = 1.0;
            }
            (x, onehot)
        })
        .collect()
}

struct Row {
    model: String,
    batch: usize,
    threads: usize,
    mode: &'static str,
    steps: usize,
    /// Median over runs of run time / steps.
    per_step: Duration,
    runs: Vec<Duration>,
}

fn run_row(
    a: &Args,
    data: &Data,
    model_name: &str,
    batch: usize,
    threads: usize,
    mode: &'static str,
) -> Result<Row, Box<dyn std::error::Error>> {
    let engine = Engine::builder()
        .executor(Executor::pool(threads))
        .build()?;
    let arrays = nd::Arrays::new(&engine);
    arrays.seed(SEED)?;
    let (model, x_shape) = match model_name {
        "mlp" => (mlp(&arrays)?, vec![batch, FEATURES]),
        _ => (cnn(&arrays)?, vec![batch, 1, SIDE, SIDE]),
    };
    let adam = Adam::new(model.parameters(), LEARNING_RATE)?;
    let i = Inputs {
        x: arrays.zeros(&x_shape)?,
        y: arrays.zeros(&[batch, CLASSES])?,
        loss: arrays.zeros(&[])?,
    };
    let graph = match mode {
        "eager" => None,
        "sequential" => Some(engine.record(|rec| {
            rec.order(Order::Sequential);
            nd::recording(rec, || step(&model, &adam, &i))
        })?),
        _ => Some(nd::record(&engine, || step(&model, &adam, &i))?),
    };
    let steps = steps_for(batch, a.quick);
    let feed = batches(data, batch, WARMUP + a.runs * steps);
    let mut feed = feed.into_iter();
    let mut one_step = || -> Result<(), Error> {
        let (x, y) = feed.next().expect("enough batches");
        i.x.set(x)?;
        i.y.set(y)?;
        match &graph {
            None => step(&model, &adam, &i)?,
            // Not waited for: the next `set` queues behind its reads.
            Some(g) => drop(g.replay()),
        }
        if a.sync {
            i.loss.wait_to_read()?;
        }
        Ok(())
    };
    for _ in 0..WARMUP {
        one_step()?;
    }
    engine.wait_all().wait()?;
    let mut runs = Vec::with_capacity(a.runs);
    for _ in 0..a.runs {
        let start = Instant::now();
        for _ in 0..steps {
            one_step()?;
        }
        engine.wait_all().wait()?;
        runs.push(start.elapsed() / steps as u32);
    }
    let loss = i.loss.item()?;
    if !loss.is_finite() {
        return Err(format!("the loss sum is {loss}").into());
    }
    let mut sorted = runs.clone();
    sorted.sort();
    Ok(Row {
        model: model_name.into(),
        batch,
        threads,
        mode,
        steps,
        per_step: sorted[sorted.len() / 2],
        runs,
    })
}

/// Writes the split digits in examples/nd_cnn.rs's `--dump` format.
fn dump(path: &str, data: &Data) -> std::io::Result<()> {
    let mut bytes = Vec::new();
    for n in [data.train_y.len(), data.test_y.len(), FEATURES] {
        bytes.extend((n as u32).to_le_bytes());
    }
    for part in [&data.train_x, &data.train_y, &data.test_x, &data.test_y] {
        bytes.extend(part.iter().flat_map(|v| v.to_le_bytes()));
    }
    std::fs::write(path, bytes)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() -> std::process::ExitCode {
    let a = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("train: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let data = Data::load(SEED);
    if let Some(path) = &a.dump {
        if let Err(e) = dump(path, &data) {
            eprintln!("train: --dump {path}: {e}");
            return std::process::ExitCode::FAILURE;
        }
        println!("wrote {path}");
        return std::process::ExitCode::SUCCESS;
    }
    println!(
        "depflow nd: time per training step (Adam lr {LEARNING_RATE}), median of {} runs, \
         {WARMUP} warm-up steps; {}",
        a.runs,
        if a.sync {
            "the loss read after every step (--sync)"
        } else {
            "no step waited for inside a run"
        }
    );
    println!(
        "{:<5} {:>5} {:>7} {:>6} {:>10} {:>10} {:>10}",
        "model", "batch", "threads", "steps", "eager ms", "seq ms", "par ms"
    );
    let mut rows = Vec::new();
    for model in &a.models {
        for &batch in &a.batches {
            for &threads in &a.threads {
                let mut cells = Vec::new();
                for mode in MODES {
                    match run_row(&a, &data, model, batch, threads, mode) {
                        Ok(r) => {
                            cells.push(ms(r.per_step));
                            rows.push(r);
                        }
                        Err(e) => {
                            eprintln!("train: {model} batch {batch} {mode}: {e}");
                            return std::process::ExitCode::FAILURE;
                        }
                    }
                }
                println!(
                    "{model:<5} {batch:>5} {threads:>7} {:>6} {:>10.3} {:>10.3} {:>10.3}",
                    steps_for(batch, a.quick),
                    cells[0],
                    cells[1],
                    cells[2]
                );
            }
        }
    }
    if let Some(path) = &a.json {
        let items: Vec<String> = rows
            .iter()
            .map(|r| {
                let runs: Vec<String> = r.runs.iter().map(|d| format!("{:.6}", ms(*d))).collect();
                format!(
                    "{{\"side\":\"depflow\",\"model\":\"{}\",\"batch\":{},\"threads\":{},\
                     \"mode\":\"{}\",\"steps\":{},\"sync\":{},\"ms_per_step\":{:.6},\
                     \"runs_ms_per_step\":[{}]}}",
                    r.model,
                    r.batch,
                    r.threads,
                    r.mode,
                    r.steps,
                    a.sync,
                    ms(r.per_step),
                    runs.join(",")
                )
            })
            .collect();
        if let Err(e) = std::fs::write(path, format!("[\n{}\n]\n", items.join(",\n"))) {
            eprintln!("train: --json {path}: {e}");
            return std::process::ExitCode::FAILURE;
        }
    }
    std::process::ExitCode::SUCCESS
}
