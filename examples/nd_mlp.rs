//! A multi-layer perceptron on UCI's 8x8 handwritten digits (shipped
//! inside the `smartcore` crate, as in examples/graph_mlp.rs), its training
//! step written once as a function of arrays (`depflow::nd`) and run both
//! ways: eagerly (the function called per batch, each array operation
//! pushed as it comes) and in graph mode (`nd::record` once, then
//! `graph.replay()` per batch, the intermediates planned buffers).
//!
//! ```text
//! cargo run --release --features nd --example nd_mlp
//! ```
//!
//! The parameters are arrays made outside the step and updated in place
//! by SGD; each batch is fed with `set` into input arrays made outside.
//! Both modes train from the same initial weights on the same batches. It
//! prints the loss per epoch, the time per step of each mode and the test
//! accuracy, and exits non-zero unless the two modes' weights are
//! bit-identical and the test accuracy is at least `MIN_ACCURACY`.

use std::time::{Duration, Instant};

// The digits split and splitmix64, shared with the data-parallel example.
#[allow(dead_code)]
#[path = "data_parallel/data.rs"]
mod data;

use data::{Data, FEATURES, Rng};
use depflow::{Engine, Error, nd};

/// Layer widths: 64 pixels in, two ReLU layers, 10 classes out.
const DIMS: [usize; 4] = [FEATURES, 128, 64, 10];
const LAYERS: usize = DIMS.len() - 1;
const BATCH: usize = 16;
const LEARNING_RATE: f32 = 0.05;
const EPOCHS: usize = 5;
const SEED: u64 = 13;
const MIN_ACCURACY: f32 = 0.90;

/// The parameters: arrays made outside the step, updated in place.
struct Model {
    w: Vec<nd::Array>,
    b: Vec<nd::Array>,
}

/// The batch and the loss sum: arrays made outside the step.
struct Inputs {
    x: nd::Array,
    /// Class indices, `[BATCH, 1]`.
    y: nd::Array,
    /// `[0, 1, ..., 9]`: `y.eq(classes)` is the one-hot labels.
    classes: nd::Array,
    loss: nd::Array,
}

/// Every layer's activation, the input first and the logits last.
fn forward(m: &Model, x: &nd::Array) -> Result<Vec<nd::Array>, Error> {
    let mut acts = vec![x.clone()];
    for k in 0..LAYERS {
        let z = acts[k].matmul(&m.w[k])? + &m.b[k];
        acts.push(if k + 1 < LAYERS { z.relu()? } else { z });
    }
    Ok(acts)
}

/// One SGD step on the batch: forward, softmax cross-entropy, backward,
/// update. The same code runs eagerly or recorded.
fn step(m: &Model, i: &Inputs) -> Result<(), Error> {
    let acts = forward(m, &i.x)?;
    let (logits, onehot) = (&acts[LAYERS], i.y.eq(&i.classes)?);
    let loss = -(logits.log_softmax(1)? * &onehot).sum()? / BATCH as f32;
    i.loss.add_assign(&loss)?;
    let mut dz = (logits.softmax(1)? - &onehot) / BATCH as f32;
    for k in (0..LAYERS).rev() {
        let dw = acts[k].t()?.matmul(&dz)?;
        let db = dz.sum_axis(0)?;
        // The previous layer's gradient reads W_k before SGD changes it.
        let below = (k > 0)
            .then(|| Ok::<_, Error>(dz.matmul(&m.w[k].t()?)? * acts[k].gt_scalar(0.0)?))
            .transpose()?;
        m.w[k].sub_assign(&(dw * LEARNING_RATE))?;
        m.b[k].sub_assign(&(db * LEARNING_RATE))?;
        dz = below.unwrap_or(dz);
    }
    Ok(())
}

fn model(arrays: &nd::Arrays) -> Result<Model, Error> {
    let mut rng = Rng(SEED);
    let mut w = Vec::new();
    for k in 0..LAYERS {
        let limit = (6.0 / DIMS[k] as f32).sqrt(); // He-uniform, for ReLU
        let values = (0..DIMS[k] * DIMS[k + 1]).map(|_| rng.uniform() * limit);
        w.push(arrays.from_vec(values.collect(), &[DIMS[k], DIMS[k + 1]])?);
    }
    let b = (1..=LAYERS).map(|k| arrays.zeros(&[DIMS[k]]));
    let b = b.collect::<Result<_, _>>()?;
    Ok(Model { w, b })
}

fn inputs(arrays: &nd::Arrays) -> Result<Inputs, Error> {
    Ok(Inputs {
        x: arrays.zeros(&[BATCH, FEATURES])?,
        y: arrays.zeros(&[BATCH, 1])?,
        classes: arrays.arange(DIMS[LAYERS])?,
        loss: arrays.zeros(&[])?,
    })
}

/// Trains `EPOCHS` epochs, `run` doing one step on the batch in `i`; the
/// time per step.
fn train(
    mode: &str,
    data: &Data,
    engine: &Engine,
    i: &Inputs,
    run: &mut dyn FnMut() -> Result<(), Error>,
) -> Result<Duration, Error> {
    let batches = data.train_y.len() / BATCH;
    let start = Instant::now();
    for epoch in 0..EPOCHS {
        let mut order: Vec<usize> = (0..data.train_y.len()).collect();
        Rng(SEED + 1 + epoch as u64).shuffle(&mut order);
        for b in 0..batches {
            let [x, y]: [Vec<f32>; 2] = data.batch(&order, b, BATCH).try_into().expect("2");
            i.x.set(x)?;
            i.y.set(y)?;
            run()?;
        }
        let loss = i.loss.item()? / batches as f32;
        i.loss.fill(0.0)?;
        println!("{mode} epoch {}: training loss {loss:.4}", epoch + 1);
    }
    engine.wait_all().wait()?;
    Ok(start.elapsed() / (EPOCHS * batches) as u32)
}

fn bits(m: &Model) -> Result<Vec<u32>, Error> {
    let mut all = Vec::new();
    for p in m.w.iter().chain(&m.b) {
        all.extend(p.to_vec().wait()?.into_iter().map(f32::to_bits));
    }
    Ok(all)
}

fn main() -> Result<(), Error> {
    let data = Data::load(SEED);
    let (train_n, test_n) = (data.train_y.len(), data.test_y.len());
    println!("digits: {train_n} training, {test_n} test samples; MLP {DIMS:?}, batch {BATCH}");
    let engine = Engine::new();
    let arrays = nd::Arrays::new(&engine);

    let (eager, eager_in) = (model(&arrays)?, inputs(&arrays)?);
    let eager_time = train("eager", &data, &engine, &eager_in, &mut || {
        step(&eager, &eager_in)
    })?;

    let (graphed, graph_in) = (model(&arrays)?, inputs(&arrays)?);
    let graph = nd::record(&engine, || step(&graphed, &graph_in))?;
    println!("recorded the step: {} ops", graph.ops().len());
    let graph_time = train("graph", &data, &engine, &graph_in, &mut || {
        drop(graph.replay()); // not waited for: the next `set` queues behind it
        Ok(())
    })?;

    let same = bits(&eager)? == bits(&graphed)?;
    let test_x = arrays.from_vec(data.test_x.clone(), &[test_n, FEATURES])?;
    let test_y = arrays.from_vec(data.test_y.clone(), &[test_n])?;
    let logits = forward(&graphed, &test_x)?.pop().expect("logits");
    let accuracy = logits.argmax(1)?.eq(&test_y)?.mean()?.item()?;
    let us = |t: Duration| t.as_secs_f64() * 1e6;
    println!(
        "time per step: eager {:.1} us, graph {:.1} us",
        us(eager_time),
        us(graph_time)
    );
    println!("eager and graph weights bit-identical after {EPOCHS} epochs: {same}");
    println!(
        "test accuracy: {:.1}% (the least accepted: {:.0}%)",
        accuracy * 100.0,
        MIN_ACCURACY * 100.0
    );
    assert!(same, "eager and graph mode trained different weights");
    assert!(
        accuracy >= MIN_ACCURACY,
        "test accuracy {accuracy} below {MIN_ACCURACY}"
    );
    Ok(())
}
