//! The case study of seed 000, for real: a two-layer network trained on two
//! devices (here two CPU devices, each with its own worker thread), one half
//! of every batch each, written with `depflow::parallel`. A [`Group`] splits
//! each batch over the devices, keeps a replica of the weights on each, and
//! after each layer's backward pass aggregates that layer's gradients on
//! the CPU, updates the CPU's weights and copies them back to both devices
//! (`Update::Host`: seed 000's program). The step pushes a plain serial
//! program per device; the engine runs it in parallel as the dependencies
//! allow. In particular the second layer's gradients are aggregated while
//! the devices still run the first layer's backward pass.
//!
//! ```text
//! cargo run --release --example two_device_net
//! cargo run --release --example two_device_net -- --trace target/net
//! ```
//!
//! It prints the loss as it falls, then runs the same program on the inline
//! executor (serially, on one thread) and checks that the results are
//! identical, and reports, from the engine's trace (per-op start and end),
//! how much of the gradient aggregation overlapped with backward compute.
//!
//! With `--trace PATH` it trains for only 4 iterations (a picture of 60
//! would be too dense to read) and writes the trace as `PATH.json` (Chrome
//! trace-event JSON: open it in ui.perfetto.dev) and `PATH.svg` (a timeline
//! to open in a browser); an extension on `PATH` is replaced. Without the
//! flag it trains for 60.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use depflow::parallel::{DeviceStep, Group, Overlap, Param, Update};
use depflow::{Engine, Error, Executor, Trace, Tracing, Var};
use ndarray::linalg::general_mat_mul;
use ndarray::{ArrayView2, ArrayViewMut2};

const SAMPLES: usize = 4096;
const INPUTS: usize = 256;
const HIDDEN: usize = 512;
const CLASSES: usize = 10;
const BATCH: usize = 512;
const HALF: usize = BATCH / 2;
const ITERATIONS: usize = 60;
/// Iterations of a traced run (`--trace`).
const TRACED_ITERATIONS: usize = 4;
const LEARNING_RATE: f32 = 0.5;

/// splitmix64, for reproducible synthetic data.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    fn uniform(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    fn matrix(&mut self, rows: usize, cols: usize, scale: f32) -> Vec<f32> {
        (0..rows * cols).map(|_| self.uniform() * scale).collect()
    }
}

fn view(v: &[f32], rows: usize, cols: usize) -> ArrayView2<'_, f32> {
    ArrayView2::from_shape((rows, cols), v).expect("shape")
}

fn view_mut(v: &mut [f32], rows: usize, cols: usize) -> ArrayViewMut2<'_, f32> {
    ArrayViewMut2::from_shape((rows, cols), v).expect("shape")
}

/// Synthetic data: inputs, and labels (as floats) from a fixed random
/// linear teacher.
struct Dataset {
    inputs: Vec<f32>,
    labels: Vec<f32>,
}

fn dataset(seed: u64) -> Dataset {
    let mut rng = Rng(seed);
    let inputs = rng.matrix(SAMPLES, INPUTS, 1.0);
    let teacher = rng.matrix(INPUTS, CLASSES, 1.0);
    let scores = view(&inputs, SAMPLES, INPUTS).dot(&view(&teacher, INPUTS, CLASSES));
    let labels = scores
        .rows()
        .into_iter()
        .map(|row| argmax(row.iter().copied()) as f32)
        .collect();
    Dataset { inputs, labels }
}

fn argmax(xs: impl Iterator<Item = f32>) -> usize {
    xs.enumerate()
        .fold(
            (0, f32::MIN),
            |best, (i, x)| if x > best.1 { (i, x) } else { best },
        )
        .0
}

impl Dataset {
    /// Batch `i`: inputs and labels (the group splits it in halves).
    fn batch(&self, i: usize) -> Vec<Vec<f32>> {
        let start = i * BATCH % SAMPLES;
        vec![
            self.inputs[start * INPUTS..(start + BATCH) * INPUTS].to_vec(),
            self.labels[start..start + BATCH].to_vec(),
        ]
    }
}

/// One device's activations and gradients (its weights and weight
/// gradients are the group's).
struct Scratch {
    fc1: Var<Vec<f32>>,
    fc2: Var<Vec<f32>>,
    fc2_ograd: Var<Vec<f32>>,
    fc1_ograd: Var<Vec<f32>>,
    loss: Var<f32>,
}

/// The model's parameters (in the group) and each device's scratch.
struct Model {
    fc1_weight: Param,
    fc2_weight: Param,
    scratch: Vec<Scratch>,
}

/// The whole net: the group (two replicas, the CPU's master copy) and the
/// model.
struct Net {
    group: Group,
    model: Model,
}

impl Net {
    fn new(engine: &Engine, seed: u64) -> Result<Self, Error> {
        let devices = ["gpu0", "gpu1"].map(|d| engine.device(d).expect("built with it"));
        let mut group = Group::builder(engine)
            .devices(devices)
            .input(INPUTS)
            .input(1)
            .update(Update::Host)
            // Each layer aggregated on its own, as soon as it can be.
            .bucket_bytes(0)
            .optimizer(|w, g| {
                w.iter_mut()
                    .zip(g)
                    .for_each(|(w, g)| *w -= LEARNING_RATE * g)
            })
            .build()?;
        let mut rng = Rng(seed ^ 0xDEAD_BEEF);
        let w1 = rng.matrix(INPUTS, HIDDEN, (6.0 / (INPUTS + HIDDEN) as f32).sqrt());
        let w2 = rng.matrix(HIDDEN, CLASSES, (6.0 / (HIDDEN + CLASSES) as f32).sqrt());
        let scratch = devices
            .iter()
            .map(|_| Scratch {
                fc1: engine.var(vec![0.0; HALF * HIDDEN]),
                fc2: engine.var(vec![0.0; HALF * CLASSES]),
                fc2_ograd: engine.var(vec![0.0; HALF * CLASSES]),
                fc1_ograd: engine.var(vec![0.0; HALF * HIDDEN]),
                loss: engine.var(0.0),
            })
            .collect();
        let model = Model {
            fc1_weight: group.param(&w1)?,
            fc2_weight: group.param(&w2)?,
            scratch,
        };
        Ok(Net { group, model })
    }

    /// The mean loss of the last iteration (waits only for the loss).
    fn loss(&self) -> Result<f32, Error> {
        let engine = self.group.engine();
        let (a, b) = (&self.model.scratch[0].loss, &self.model.scratch[1].loss);
        let keys = [a.key(), b.key()];
        let loss = engine.op().name("read loss").reads(&[a, b]);
        loss.run(move |ctx| Ok((*ctx.read(keys[0])? + *ctx.read(keys[1])?) / 2.0))?
            .wait()
    }

    /// Both devices' weights (they must be the same).
    fn weights(&self) -> Result<Vec<Vec<f32>>, Error> {
        let mut all = Vec::new();
        for d in 0..2 {
            all.push(self.group.weights(self.model.fc1_weight, d)?);
            all.push(self.group.weights(self.model.fc2_weight, d)?);
        }
        Ok(all)
    }
}

impl Model {
    /// Pushes one device's forward and backward ops, in the order of the
    /// seed's serial program; the helper pushes the aggregation, update and
    /// copy-back of each layer behind its backward op.
    fn device_step(&self, s: &mut DeviceStep<'_>) -> Result<(), Error> {
        let r = &self.scratch[s.index()];
        let (data, labels) = (s.input(0), s.input(1));
        let (w1, w2) = (s.replica(self.fc1_weight), s.replica(self.fc2_weight));
        let (wg1, wg2) = (s.grad(self.fc1_weight), s.grad(self.fc2_weight));
        let e = s.engine();
        // fc1 = relu(data . W1)
        let (dk, w1k, h1k) = (data.key(), w1.key(), r.fc1.key());
        let op = e.op().name("fc1 forward").on(s.device());
        op.reads(&[data, w1]).mutates(&[&r.fc1]).run(move |ctx| {
            let mut h = ctx.write(h1k)?;
            let (x, w) = (ctx.read(dk)?, ctx.read(w1k)?);
            let x = view(&x, HALF, INPUTS);
            general_mat_mul(
                1.0,
                &x,
                &view(&w, INPUTS, HIDDEN),
                0.0,
                &mut view_mut(&mut h, HALF, HIDDEN),
            );
            h.iter_mut().for_each(|v| *v = v.max(0.0));
            Ok(())
        })?;
        // fc2 = fc1 . W2
        let (h1k, w2k, h2k) = (r.fc1.key(), w2.key(), r.fc2.key());
        let op = e.op().name("fc2 forward").on(s.device());
        op.reads(&[&r.fc1, w2]).mutates(&[&r.fc2]).run(move |ctx| {
            let (h1, w) = (ctx.read(h1k)?, ctx.read(w2k)?);
            let mut out = ctx.write(h2k)?;
            let (h1, w) = (view(&h1, HALF, HIDDEN), view(&w, HIDDEN, CLASSES));
            general_mat_mul(1.0, &h1, &w, 0.0, &mut view_mut(&mut out, HALF, CLASSES));
            Ok(())
        })?;
        // fc2_ograd = LossGrad(fc2, labels): softmax cross-entropy.
        let (h2k, lk, gk, lossk) = (r.fc2.key(), labels.key(), r.fc2_ograd.key(), r.loss.key());
        let op = e.op().name("loss grad").on(s.device());
        let op = op
            .reads(&[&r.fc2, labels])
            .mutates(&[&r.fc2_ograd, &r.loss]);
        op.run(move |ctx| {
            let (logits, labels) = (ctx.read(h2k)?, ctx.read(lk)?);
            let mut grad = ctx.write(gk)?;
            let mut loss = 0.0;
            let rows = logits.chunks(CLASSES).zip(grad.chunks_mut(CLASSES));
            for ((z, g), &y) in rows.zip(labels.iter()) {
                let y = y as usize;
                let max = z.iter().fold(f32::MIN, |m, &x| m.max(x));
                let sum: f32 = z.iter().map(|&x| (x - max).exp()).sum();
                for (k, (gk, &zk)) in g.iter_mut().zip(z).enumerate() {
                    let p = (zk - max).exp() / sum;
                    *gk = (p - if k == y { 1.0 } else { 0.0 }) / BATCH as f32;
                }
                loss -= ((z[y] - max).exp() / sum).ln();
            }
            *ctx.write(lossk)? = loss / HALF as f32;
            Ok(())
        })?;
        // fc1_ograd, fc2_wgrad = FullcBackward(fc2_ograd, W2)
        let (gk, h1k, w2k, wg2k, g1k) = (
            r.fc2_ograd.key(),
            r.fc1.key(),
            w2.key(),
            wg2.key(),
            r.fc1_ograd.key(),
        );
        let op = e.op().name("fc2 backward").on(s.device());
        let op = op
            .reads(&[&r.fc2_ograd, &r.fc1, w2])
            .mutates(&[wg2, &r.fc1_ograd]);
        op.run(move |ctx| {
            let (g, h1, w) = (ctx.read(gk)?, ctx.read(h1k)?, ctx.read(w2k)?);
            let (g, h1v) = (view(&g, HALF, CLASSES), view(&h1, HALF, HIDDEN));
            general_mat_mul(
                1.0,
                &h1v.t(),
                &g,
                0.0,
                &mut view_mut(&mut ctx.write(wg2k)?, HIDDEN, CLASSES),
            );
            let mut g1 = ctx.write(g1k)?;
            let mut g1v = view_mut(&mut g1, HALF, HIDDEN);
            general_mat_mul(1.0, &g, &view(&w, HIDDEN, CLASSES).t(), 0.0, &mut g1v);
            g1v.zip_mut_with(&h1v, |g, &h| {
                if h <= 0.0 {
                    *g = 0.0
                }
            });
            Ok(())
        })?;
        s.grad_ready(self.fc2_weight)?;
        // _, fc1_wgrad = FullcBackward(fc1_ograd, W1)
        let (g1k, dk, wg1k) = (r.fc1_ograd.key(), data.key(), wg1.key());
        let op = e.op().name("fc1 backward").on(s.device());
        op.reads(&[&r.fc1_ograd, data])
            .mutates(&[wg1])
            .run(move |ctx| {
                let (g1, x) = (ctx.read(g1k)?, ctx.read(dk)?);
                let (g1, x) = (view(&g1, HALF, HIDDEN), view(&x, HALF, INPUTS));
                general_mat_mul(
                    1.0,
                    &x.t(),
                    &g1,
                    0.0,
                    &mut view_mut(&mut ctx.write(wg1k)?, INPUTS, HIDDEN),
                );
                Ok(())
            })?;
        s.grad_ready(self.fc1_weight)
    }
}

/// Trains for `iterations`; the final weights, the time it took.
fn train(
    engine: &Engine,
    label: &str,
    verbose: bool,
    iterations: usize,
) -> Result<(Net, Duration), Error> {
    let data = dataset(7);
    let mut net = Net::new(engine, 7)?;
    let start = Instant::now();
    net.group.load(data.batch(0))?;
    for i in 0..iterations {
        if i + 1 < iterations {
            net.group.load(data.batch(i + 1))?; // the next batch's split overlaps this step
        }
        net.group.step(|s| net.model.device_step(s))?;
        if verbose && (i % 10 == 0 || i == iterations - 1) {
            println!("  iteration {i:>3}: loss {:.4}", net.loss()?);
        }
    }
    engine.wait_all().wait()?;
    let elapsed = start.elapsed();
    if verbose {
        println!(
            "  {label}: {:.1} ms per iteration",
            elapsed.as_secs_f64() * 1e3 / iterations as f64
        );
    }
    Ok((net, elapsed))
}

/// Layer `layer`'s gradient aggregations (`host sum` ops reading its
/// gradient) against the backward ops, from the trace.
fn overlap(trace: &Trace, net: &Net, layer: u8) -> Overlap {
    let p = if layer == 1 {
        net.model.fc1_weight
    } else {
        net.model.fc2_weight
    };
    let grad = net.group.grad(p, 0).id();
    Overlap::between(
        trace,
        |op| op.name() == Some("host sum") && op.reads().contains(&grad),
        |op| op.name().is_some_and(|n| n.ends_with("backward")),
    )
}

/// The `--trace PATH` argument, if given.
fn trace_path() -> Result<Option<PathBuf>, Error> {
    let mut args = std::env::args().skip(1);
    match (args.next().as_deref(), args.next(), args.next()) {
        (None, _, _) => Ok(None),
        (Some("--trace"), Some(path), None) => Ok(Some(PathBuf::from(path))),
        _ => Err(Error::Config(
            "usage: two_device_net [--trace PATH]  (writes PATH.json and PATH.svg)".into(),
        )),
    }
}

fn main() -> Result<(), Error> {
    let trace = trace_path()?;
    let iterations = if trace.is_some() {
        TRACED_ITERATIONS
    } else {
        ITERATIONS
    };
    println!(
        "Two-layer net ({INPUTS}-{HIDDEN}-{CLASSES}), batch {BATCH} split over two CPU devices, {iterations} iterations"
    );
    // Traced always: the overlap report reads the ops' start and end.
    let engine = Engine::builder()
        .executor(Executor::pool(1))
        .device("gpu0", Executor::pool(1))
        .device("gpu1", Executor::pool(1))
        .tracing(Tracing::On)
        .build()?;
    let (net, parallel_time) = train(
        &engine,
        "engine (three devices, one thread each)",
        true,
        iterations,
    )?;
    let parallel = net.weights()?;

    let serial_engine = Engine::builder()
        .executor(Executor::inline())
        .device("gpu0", Executor::inline())
        .device("gpu1", Executor::inline())
        .build()?;
    let (serial_net, serial_time) = train(
        &serial_engine,
        "serial (inline executor)",
        false,
        iterations,
    )?;
    let serial = serial_net.weights()?;
    println!(
        "  serial (inline executor): {:.1} ms per iteration; the engine ran {:.2}x faster",
        serial_time.as_secs_f64() * 1e3 / iterations as f64,
        serial_time.as_secs_f64() / parallel_time.as_secs_f64()
    );
    let replicas_agree = parallel[0..2] == parallel[2..4];
    println!(
        "  weights identical to the serial run: {}; both replicas identical: {replicas_agree}",
        parallel == serial
    );

    let recorded = engine.trace()?;
    println!("  overlap of gradient aggregation with backward compute:");
    for (layer, note) in [
        (2, "can start as soon as fc2's backward is done"),
        (1, "needs fc1's backward first"),
    ] {
        let o = overlap(&recorded, &net, layer);
        println!(
            "    fc{layer} ({note}): started while backward ops still ran in {} of {} \
             iterations; {:.0}% of its time overlapped",
            o.started_under,
            o.ops,
            o.fraction() * 100.0
        );
    }
    if let Some(path) = trace {
        let (json, svg) = (path.with_extension("json"), path.with_extension("svg"));
        recorded.write_chrome_json(&json)?;
        recorded.write_svg(&svg)?;
        println!(
            "  trace of {} ops: {} (open in ui.perfetto.dev) and {}",
            recorded.ops().len(),
            json.display(),
            svg.display()
        );
    }
    assert!(
        parallel == serial && replicas_agree,
        "the engine must give the serial program's results"
    );
    Ok(())
}
