//! The case study of seed 000, for real: a two-layer network trained on two
//! devices (here two CPU devices, each with its own worker thread), one half
//! of every batch each. Every step (forward, loss gradient and backward per
//! device, gradient aggregation, SGD update, copy-back of the weights) is
//! pushed as a plain serial program; the engine runs it in parallel as the
//! dependencies allow. In particular the second layer's gradients are
//! aggregated while the devices still run the first layer's backward pass.
//!
//! ```text
//! cargo run --release --example two_device_net
//! cargo run --release --example two_device_net -- --trace target/net
//! ```
//!
//! It prints the loss as it falls, then runs the same program on the inline
//! executor (serially, on one thread) and checks that the results are
//! identical, and reports how much of the gradient aggregation overlapped
//! with backward compute.
//!
//! With `--trace PATH` it trains for only 4 iterations (a picture of 60
//! would be too dense to read), with the engine recording a trace, and
//! writes it as `PATH.json` (Chrome trace-event JSON: open it in
//! ui.perfetto.dev) and `PATH.svg` (a timeline to open in a browser);
//! an extension on `PATH` is replaced. Without the flag it trains for 60.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use depflow::{AnyVar, Device, Engine, Error, Executor, OpCtx, Tracing, Var};
use ndarray::{Array1, Array2, Axis, s};

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

type Matrix = Array2<f32>;

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

    fn matrix(&mut self, rows: usize, cols: usize, scale: f32) -> Matrix {
        Array2::from_shape_simple_fn((rows, cols), || self.uniform() * scale)
    }
}

/// Synthetic data: inputs, and labels from a fixed random linear teacher.
struct Dataset {
    inputs: Matrix,
    labels: Array1<usize>,
}

fn dataset(seed: u64) -> Dataset {
    let mut rng = Rng(seed);
    let inputs = rng.matrix(SAMPLES, INPUTS, 1.0);
    let teacher = rng.matrix(INPUTS, CLASSES, 1.0);
    let labels = inputs
        .dot(&teacher)
        .map_axis(Axis(1), |row| argmax(row.iter().copied()));
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

/// Which kind of step an op is, for the timeline.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Step {
    Forward,
    /// Backward pass of layer 1 or 2.
    Backward(u8),
    /// Gradient aggregation of layer 1 or 2.
    Aggregate(u8),
    Other,
}

/// When each op ran, for the overlap report.
#[derive(Default)]
struct Timeline {
    spans: Mutex<Vec<(usize, Step, Duration, Duration)>>,
    clock: Option<Instant>,
}

/// The variables one device works on: its half batch, its copy of the
/// weights, its activations and gradients.
struct Replica {
    device: Device,
    data: Var<Matrix>,
    labels: Var<Array1<usize>>,
    fc1_weight: Var<Matrix>,
    fc2_weight: Var<Matrix>,
    fc1: Var<Matrix>,
    fc2: Var<Matrix>,
    fc2_ograd: Var<Matrix>,
    fc1_ograd: Var<Matrix>,
    fc1_wgrad: Var<Matrix>,
    fc2_wgrad: Var<Matrix>,
    loss: Var<f32>,
}

/// The whole model: two replicas and the CPU's master copy.
struct Net {
    engine: Engine,
    cpu: Device,
    replicas: [Replica; 2],
    fc1_weight: Var<Matrix>,
    fc2_weight: Var<Matrix>,
    fc1_wgrad: Var<Matrix>,
    fc2_wgrad: Var<Matrix>,
    timeline: Arc<Timeline>,
}

impl Net {
    fn new(
        engine: Engine,
        devices: [Device; 2],
        cpu: Device,
        seed: u64,
        timeline: Arc<Timeline>,
    ) -> Self {
        let mut rng = Rng(seed ^ 0xDEAD_BEEF);
        let w1 = rng.matrix(INPUTS, HIDDEN, (6.0 / (INPUTS + HIDDEN) as f32).sqrt());
        let w2 = rng.matrix(HIDDEN, CLASSES, (6.0 / (HIDDEN + CLASSES) as f32).sqrt());
        let zeros = |r, c| Array2::<f32>::zeros((r, c));
        let replica = |device| Replica {
            device,
            data: engine.var(zeros(HALF, INPUTS)),
            labels: engine.var(Array1::zeros(HALF)),
            fc1_weight: engine.var(w1.clone()),
            fc2_weight: engine.var(w2.clone()),
            fc1: engine.var(zeros(HALF, HIDDEN)),
            fc2: engine.var(zeros(HALF, CLASSES)),
            fc2_ograd: engine.var(zeros(HALF, CLASSES)),
            fc1_ograd: engine.var(zeros(HALF, HIDDEN)),
            fc1_wgrad: engine.var(zeros(INPUTS, HIDDEN)),
            fc2_wgrad: engine.var(zeros(HIDDEN, CLASSES)),
            loss: engine.var(0.0),
        };
        Net {
            replicas: [replica(devices[0]), replica(devices[1])],
            fc1_weight: engine.var(w1),
            fc2_weight: engine.var(w2),
            fc1_wgrad: engine.var(zeros(INPUTS, HIDDEN)),
            fc2_wgrad: engine.var(zeros(HIDDEN, CLASSES)),
            engine,
            cpu,
            timeline,
        }
    }

    /// Pushes one op: `f` runs on `device` once the engine allows it.
    #[allow(clippy::too_many_arguments)]
    fn push(
        &self,
        name: &'static str,
        iteration: usize,
        step: Step,
        device: Device,
        reads: &[&dyn AnyVar],
        mutates: &[&dyn AnyVar],
        f: impl FnOnce(&OpCtx) -> Result<(), Error> + Send + 'static,
    ) -> Result<(), Error> {
        let timeline = self.timeline.clone();
        self.engine
            .op()
            .name(name)
            .on(device)
            .reads(reads)
            .mutates(mutates)
            .run(move |ctx| {
                let clock = timeline.clock.expect("clock");
                let start = clock.elapsed();
                f(ctx)?;
                let end = clock.elapsed();
                timeline
                    .spans
                    .lock()
                    .unwrap()
                    .push((iteration, step, start, end));
                Ok(())
            })?;
        Ok(())
    }

    /// Pushes one training iteration, exactly in the order of the seed's
    /// serial program.
    fn iteration(&self, data: &Arc<Dataset>, i: usize) -> Result<(), Error> {
        for (d, r) in self.replicas.iter().enumerate() {
            // data[gpu_d].copyfrom(data[...]): this device's half of the batch.
            let (dk, lk, data) = (r.data.key(), r.labels.key(), data.clone());
            let start = (i * BATCH + d * HALF) % SAMPLES;
            self.push(
                "load",
                i,
                Step::Other,
                r.device,
                &[],
                &[&r.data, &r.labels],
                move |ctx| {
                    ctx.write(dk)?
                        .assign(&data.inputs.slice(s![start..start + HALF, ..]));
                    ctx.write(lk)?
                        .assign(&data.labels.slice(s![start..start + HALF]));
                    Ok(())
                },
            )?;
            // fc1 = relu(data . W1)
            let (dk, w1k, h1k) = (r.data.key(), r.fc1_weight.key(), r.fc1.key());
            self.push(
                "fc1 forward",
                i,
                Step::Forward,
                r.device,
                &[&r.data, &r.fc1_weight],
                &[&r.fc1],
                move |ctx| {
                    let h = ctx.read(dk)?.dot(&*ctx.read(w1k)?);
                    *ctx.write(h1k)? = h.mapv_into(|x| x.max(0.0));
                    Ok(())
                },
            )?;
            // fc2 = fc1 . W2
            let (h1k, w2k, h2k) = (r.fc1.key(), r.fc2_weight.key(), r.fc2.key());
            self.push(
                "fc2 forward",
                i,
                Step::Forward,
                r.device,
                &[&r.fc1, &r.fc2_weight],
                &[&r.fc2],
                move |ctx| {
                    *ctx.write(h2k)? = ctx.read(h1k)?.dot(&*ctx.read(w2k)?);
                    Ok(())
                },
            )?;
            // fc2_ograd = LossGrad(fc2, labels): softmax cross-entropy.
            let (h2k, lk, gk, lossk) =
                (r.fc2.key(), r.labels.key(), r.fc2_ograd.key(), r.loss.key());
            self.push(
                "loss grad",
                i,
                Step::Forward,
                r.device,
                &[&r.fc2, &r.labels],
                &[&r.fc2_ograd, &r.loss],
                move |ctx| {
                    let logits = ctx.read(h2k)?;
                    let labels = ctx.read(lk)?;
                    let mut grad = ctx.write(gk)?;
                    let mut loss = 0.0;
                    for ((mut g, z), &y) in grad
                        .outer_iter_mut()
                        .zip(logits.outer_iter())
                        .zip(labels.iter())
                    {
                        let max = z.fold(f32::MIN, |m, &x| m.max(x));
                        let sum: f32 = z.iter().map(|&x| (x - max).exp()).sum();
                        for (k, (gk, &zk)) in g.iter_mut().zip(z.iter()).enumerate() {
                            let p = (zk - max).exp() / sum;
                            *gk = (p - if k == y { 1.0 } else { 0.0 }) / BATCH as f32;
                        }
                        loss -= ((z[y] - max).exp() / sum).ln();
                    }
                    *ctx.write(lossk)? = loss / HALF as f32;
                    Ok(())
                },
            )?;
            // fc1_ograd, fc2_wgrad = FullcBackward(fc2_ograd, W2)
            let (gk, h1k, w2k, wg2k, g1k) = (
                r.fc2_ograd.key(),
                r.fc1.key(),
                r.fc2_weight.key(),
                r.fc2_wgrad.key(),
                r.fc1_ograd.key(),
            );
            self.push(
                "fc2 backward",
                i,
                Step::Backward(2),
                r.device,
                &[&r.fc2_ograd, &r.fc1, &r.fc2_weight],
                &[&r.fc2_wgrad, &r.fc1_ograd],
                move |ctx| {
                    let g = ctx.read(gk)?;
                    let h1 = ctx.read(h1k)?;
                    *ctx.write(wg2k)? = h1.t().dot(&*g);
                    let mut g1 = g.dot(&ctx.read(w2k)?.t());
                    g1.zip_mut_with(&*h1, |g, &h| {
                        if h <= 0.0 {
                            *g = 0.0
                        }
                    });
                    *ctx.write(g1k)? = g1;
                    Ok(())
                },
            )?;
            // _, fc1_wgrad = FullcBackward(fc1_ograd, W1)
            let (g1k, dk, wg1k) = (r.fc1_ograd.key(), r.data.key(), r.fc1_wgrad.key());
            self.push(
                "fc1 backward",
                i,
                Step::Backward(1),
                r.device,
                &[&r.fc1_ograd, &r.data],
                &[&r.fc1_wgrad],
                move |ctx| {
                    *ctx.write(wg1k)? = ctx.read(dk)?.t().dot(&*ctx.read(g1k)?);
                    Ok(())
                },
            )?;
        }
        // Aggregate gradients and update, on the CPU; then copy the weights back.
        let [r0, r1] = &self.replicas;
        for layer in [0, 1] {
            let (cpu_grad, cpu_weight, grads, weights) = if layer == 0 {
                (
                    &self.fc1_wgrad,
                    &self.fc1_weight,
                    [&r0.fc1_wgrad, &r1.fc1_wgrad],
                    [&r0.fc1_weight, &r1.fc1_weight],
                )
            } else {
                (
                    &self.fc2_wgrad,
                    &self.fc2_weight,
                    [&r0.fc2_wgrad, &r1.fc2_wgrad],
                    [&r0.fc2_weight, &r1.fc2_weight],
                )
            };
            // fc_wgrad[cpu] = fc_wgrad[gpu0] + fc_wgrad[gpu1]
            let (a, b, sum) = (grads[0].key(), grads[1].key(), cpu_grad.key());
            let agg_name = if layer == 0 {
                "fc1 aggregate"
            } else {
                "fc2 aggregate"
            };
            self.push(
                agg_name,
                i,
                Step::Aggregate(layer + 1),
                self.cpu,
                &[grads[0], grads[1]],
                &[cpu_grad],
                move |ctx| {
                    let mut s = ctx.write(sum)?;
                    s.assign(&*ctx.read(a)?);
                    *s += &*ctx.read(b)?;
                    Ok(())
                },
            )?;
            // fc_weight[cpu] -= lr * fc_wgrad[cpu]
            let (g, w) = (cpu_grad.key(), cpu_weight.key());
            self.push(
                "sgd update",
                i,
                Step::Other,
                self.cpu,
                &[cpu_grad],
                &[cpu_weight],
                move |ctx| {
                    ctx.write(w)?.scaled_add(-LEARNING_RATE, &*ctx.read(g)?);
                    Ok(())
                },
            )?;
            // fc_weight[cpu].copyto(fc_weight[gpu0], fc_weight[gpu1])
            for (replica, target) in self.replicas.iter().zip(weights) {
                let (src, dst) = (cpu_weight.key(), target.key());
                self.push(
                    "copy back",
                    i,
                    Step::Other,
                    replica.device,
                    &[cpu_weight],
                    &[target],
                    move |ctx| {
                        ctx.write(dst)?.assign(&*ctx.read(src)?);
                        Ok(())
                    },
                )?;
            }
        }
        Ok(())
    }

    /// The mean loss of the last iteration (waits only for the loss).
    fn loss(&self) -> Result<f32, Error> {
        let keys = [self.replicas[0].loss.key(), self.replicas[1].loss.key()];
        let losses: [&dyn AnyVar; 2] = [&self.replicas[0].loss, &self.replicas[1].loss];
        let loss = self.engine.op().name("read loss").reads(&losses);
        loss.run(move |ctx| Ok((*ctx.read(keys[0])? + *ctx.read(keys[1])?) / 2.0))?
            .wait()
    }

    fn weights(&self) -> Result<(Matrix, Matrix), Error> {
        let (k1, k2) = (self.fc1_weight.key(), self.fc2_weight.key());
        let weights = self.engine.op().name("read weights");
        let weights = weights.reads(&[&self.fc1_weight, &self.fc2_weight]);
        weights
            .run(move |ctx| Ok((ctx.read(k1)?.clone(), ctx.read(k2)?.clone())))?
            .wait()
    }
}

/// What a training run gives: the final weights, its duration, its timeline.
type Trained = ((Matrix, Matrix), Duration, Arc<Timeline>);

/// Trains for `iterations`.
fn train(engine: Engine, label: &str, verbose: bool, iterations: usize) -> Result<Trained, Error> {
    let devices = [
        engine.device("gpu0").unwrap(),
        engine.device("gpu1").unwrap(),
    ];
    let cpu = engine.default_device();
    let data = Arc::new(dataset(7));
    let timeline = Arc::new(Timeline {
        spans: Mutex::new(Vec::new()),
        clock: Some(Instant::now()),
    });
    let net = Net::new(engine, devices, cpu, 7, timeline.clone());
    let start = Instant::now();
    for i in 0..iterations {
        net.iteration(&data, i)?;
        if verbose && (i % 10 == 0 || i == iterations - 1) {
            println!("  iteration {i:>3}: loss {:.4}", net.loss()?);
        }
    }
    let weights = net.weights()?;
    net.engine.wait_all().wait()?;
    let elapsed = start.elapsed();
    if verbose {
        println!(
            "  {label}: {:.1} ms per iteration",
            elapsed.as_secs_f64() * 1e3 / iterations as f64
        );
    }
    Ok((weights, elapsed, timeline))
}

/// For each layer's gradient aggregation: in how many iterations it started
/// while a backward op of the same iteration was still running, and which
/// fraction of its time overlapped with backward compute.
fn overlap(timeline: &Timeline, layer: u8) -> (usize, f64) {
    let spans = timeline.spans.lock().unwrap();
    let (mut early, mut total, mut covered) = (0, 0.0, 0.0);
    for &(i, _, start, end) in spans.iter().filter(|s| s.1 == Step::Aggregate(layer)) {
        let mut backward: Vec<(Duration, Duration)> = spans
            .iter()
            .filter(|b| matches!(b.1, Step::Backward(_)) && b.0 == i)
            .map(|b| (b.2, b.3))
            .collect();
        if backward.iter().any(|&(_, e)| e > start) {
            early += 1;
        }
        // The part of [start, end) during which some backward op ran.
        backward.sort();
        let mut cursor = start;
        for (s, e) in backward {
            let (s, e) = (s.max(cursor), e.min(end));
            if s < e {
                covered += (e - s).as_secs_f64();
                cursor = e;
            }
        }
        total += (end - start).as_secs_f64();
    }
    (early, if total > 0.0 { covered / total } else { 0.0 })
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
    let tracing = if trace.is_some() {
        Tracing::On
    } else {
        Tracing::Off
    };
    let engine = Engine::builder()
        .executor(Executor::pool(1))
        .device("gpu0", Executor::pool(1))
        .device("gpu1", Executor::pool(1))
        .tracing(tracing)
        .build()?;
    let (parallel, parallel_time, timeline) = train(
        engine.clone(),
        "engine (three devices, one thread each)",
        true,
        iterations,
    )?;

    let serial_engine = Engine::builder()
        .executor(Executor::inline())
        .device("gpu0", Executor::inline())
        .device("gpu1", Executor::inline())
        .build()?;
    let (serial, serial_time, _) =
        train(serial_engine, "serial (inline executor)", false, iterations)?;
    println!(
        "  serial (inline executor): {:.1} ms per iteration; the engine ran {:.2}x faster",
        serial_time.as_secs_f64() * 1e3 / iterations as f64,
        serial_time.as_secs_f64() / parallel_time.as_secs_f64()
    );
    println!(
        "  weights identical to the serial run: {}",
        parallel == serial
    );

    println!("  overlap of gradient aggregation with backward compute:");
    for (layer, note) in [
        (2, "can start as soon as fc2's backward is done"),
        (1, "needs fc1's backward first"),
    ] {
        let (early, fraction) = overlap(&timeline, layer);
        println!(
            "    fc{layer} ({note}): started while backward ops still ran in {early} of {iterations} \
             iterations; {:.0}% of its time overlapped",
            fraction * 100.0
        );
    }
    if let Some(path) = trace {
        let trace = engine.trace()?;
        let (json, svg) = (path.with_extension("json"), path.with_extension("svg"));
        trace.write_chrome_json(&json)?;
        trace.write_svg(&svg)?;
        println!(
            "  trace of {} ops: {} (open in ui.perfetto.dev) and {}",
            trace.ops().len(),
            json.display(),
            svg.display()
        );
    }
    assert!(
        parallel == serial,
        "the engine must give the serial program's results"
    );
    Ok(())
}
