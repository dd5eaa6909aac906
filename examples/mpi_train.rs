//! Data-parallel training across processes: a multi-layer perceptron on
//! UCI's 8x8 handwritten digits (shipped inside the `smartcore` crate, as
//! in `graph_mlp`), each rank computing the gradients of its share of every
//! batch, the gradients summed across ranks by the engine's all-reduce ops
//! ([`Communicator`]), and every rank applying the same update.
//!
//! ```text
//! cargo build --release --features mpi --example mpi_train
//! mpirun -np 2 target/release/examples/mpi_train            # as root: add --allow-run-as-root
//! mpirun -np 2 target/release/examples/mpi_train --epochs 20
//! ```
//!
//! Every op of a step is pushed to the engine: per layer a forward op, the
//! loss, per layer (last first) the weight gradients, their two
//! all-reduces, pushed right behind the op that writes them, so the
//! reduction of layer k runs while layer k-1's backward pass computes, the
//! input gradient and the update. Rank 0 prints the mean training loss per
//! epoch (over the global batch), the time per epoch, and the held-out
//! accuracy at the end. The program exits non-zero if the ranks' weights
//! differ at the end (a checksum of their bits, all-reduced as a maximum
//! and a minimum) or if the accuracy is below `MIN_ACCURACY`. With one
//! process (`cargo run --features mpi --example mpi_train`) it trains the
//! same model on the whole batch.

use std::sync::Arc;
use std::time::{Duration, Instant};

use depflow::{Communicator, Engine, ReduceOp, Var};

/// Layer widths: 64 pixels in, two ReLU layers, 10 classes out.
const DIMS: [usize; 4] = [64, 128, 64, 10];
const LAYERS: usize = DIMS.len() - 1;
/// The global batch, split evenly across ranks.
const BATCH: usize = 32;
const LEARNING_RATE: f32 = 0.1;
const EPOCHS: usize = 10;
const SEED: u64 = 13;
const TEST_SHARE: f64 = 0.2;
/// The final held-out accuracy below which the run fails.
const MIN_ACCURACY: f64 = 0.9;

type Tsr = Var<Vec<f32>>;

fn main() {
    let epochs = std::env::args()
        .skip_while(|a| a != "--epochs")
        .nth(1)
        .map_or(EPOCHS, |n| n.parse().expect("--epochs N"));
    let (universe, _) =
        mpi::initialize_with_threading(mpi::Threading::Multiple).expect("MPI initialises");
    let world = universe.world();
    let ok = train(&world, epochs);
    drop(world);
    drop(universe); // MPI_Finalize, after the engine and the communicator are gone
    if !ok {
        std::process::exit(1);
    }
}

fn train(world: &mpi::topology::SimpleCommunicator, epochs: usize) -> bool {
    let engine = Engine::new();
    let comm = Communicator::new(&engine, world).expect("communicator");
    let (rank, size) = (comm.rank(), comm.size());
    if BATCH % size != 0 {
        eprintln!("the batch of {BATCH} does not split over {size} ranks");
        return false;
    }
    let rows = BATCH / size;
    let data = Arc::new(Data::load());
    let var = |n: usize| engine.var(vec![0.0f32; n]);

    // Parameters: the same seeded start on every rank.
    let mut rng = Rng(SEED);
    let w: Vec<Tsr> = (0..LAYERS)
        .map(|k| {
            let scale = (2.0 / DIMS[k] as f32).sqrt();
            engine.var(
                (0..DIMS[k] * DIMS[k + 1])
                    .map(|_| rng.uniform() * scale)
                    .collect(),
            )
        })
        .collect();
    let b: Vec<Tsr> = (0..LAYERS).map(|k| var(DIMS[k + 1])).collect();
    let gw: Vec<Tsr> = (0..LAYERS).map(|k| var(DIMS[k] * DIMS[k + 1])).collect();
    let gb: Vec<Tsr> = (0..LAYERS).map(|k| var(DIMS[k + 1])).collect();
    // Activations a[0] (the input) .. a[LAYERS] (the logits), and the
    // gradients of the pre-activations dz[1..=LAYERS].
    let a: Vec<Tsr> = (0..=LAYERS).map(|k| var(rows * DIMS[k])).collect();
    let dz: Vec<Tsr> = (0..=LAYERS).map(|k| var(rows * DIMS[k])).collect();
    let labels = var(rows);
    let loss = var(1);
    let epoch_loss = engine.var(0.0f64);

    if rank == 0 {
        println!("{size} rank(s), {rows} samples each per batch of {BATCH}");
    }
    let mut times = Vec::new();
    for epoch in 0..epochs {
        let start = Instant::now();
        let order = Arc::new(data.order(epoch));
        for batch in 0..data.batches() {
            // This rank's rows of the batch.
            let (x, y) = (a[0].key(), labels.key());
            let (d, o) = (data.clone(), order.clone());
            engine
                .push(&[], &[&a[0], &labels], move |ctx| {
                    let (mut x, mut y) = (ctx.write(x)?, ctx.write(y)?);
                    let ids = &o[batch * BATCH + rank * rows..][..rows];
                    d.load_rows(ids, &mut x, &mut y);
                    Ok(())
                })
                .unwrap();
            for k in 0..LAYERS {
                let (i, wk, bk, out) = (a[k].key(), w[k].key(), b[k].key(), a[k + 1].key());
                let relu = k + 1 < LAYERS;
                engine
                    .push(&[&a[k], &w[k], &b[k]], &[&a[k + 1]], move |ctx| {
                        linear(
                            &ctx.read(i)?,
                            &ctx.read(wk)?,
                            &ctx.read(bk)?,
                            &mut ctx.write(out)?,
                            relu,
                        );
                        Ok(())
                    })
                    .unwrap();
            }
            let (logits, y, dl, l) = (a[LAYERS].key(), labels.key(), dz[LAYERS].key(), loss.key());
            engine
                .push(&[&a[LAYERS], &labels], &[&dz[LAYERS], &loss], move |ctx| {
                    let sum = softmax_loss(&ctx.read(logits)?, &ctx.read(y)?, &mut ctx.write(dl)?);
                    ctx.write(l)?[0] = sum;
                    Ok(())
                })
                .unwrap();
            comm.all_reduce(&loss).name("loss").push().unwrap();
            let (l, acc) = (loss.key(), epoch_loss.key());
            engine
                .push(&[&loss], &[&epoch_loss], move |ctx| {
                    *ctx.write(acc)? += f64::from(ctx.read(l)?[0]);
                    Ok(())
                })
                .unwrap();
            for k in (0..LAYERS).rev() {
                let (i, g, gwk, gbk) = (a[k].key(), dz[k + 1].key(), gw[k].key(), gb[k].key());
                let (din, dout) = (DIMS[k], DIMS[k + 1]);
                engine
                    .push(&[&a[k], &dz[k + 1]], &[&gw[k], &gb[k]], move |ctx| {
                        grads(
                            &ctx.read(i)?,
                            &ctx.read(g)?,
                            din,
                            dout,
                            &mut ctx.write(gwk)?,
                            &mut ctx.write(gbk)?,
                        );
                        Ok(())
                    })
                    .unwrap();
                // Right behind the op that wrote them: reduced while the
                // layers below compute.
                comm.all_reduce(&gw[k]).name("grad w").push().unwrap();
                comm.all_reduce(&gb[k]).name("grad b").push().unwrap();
                if k > 0 {
                    let (wk, below) = (w[k].key(), dz[k].key());
                    engine
                        .push(&[&dz[k + 1], &w[k], &a[k]], &[&dz[k]], move |ctx| {
                            input_grad(
                                &ctx.read(g)?,
                                &ctx.read(wk)?,
                                &ctx.read(i)?,
                                din,
                                dout,
                                &mut ctx.write(below)?,
                            );
                            Ok(())
                        })
                        .unwrap();
                }
                let (wk, bk) = (w[k].key(), b[k].key());
                engine
                    .push(&[&gw[k], &gb[k]], &[&w[k], &b[k]], move |ctx| {
                        let step = LEARNING_RATE / BATCH as f32;
                        sgd(&mut ctx.write(wk)?, &ctx.read(gwk)?, step);
                        sgd(&mut ctx.write(bk)?, &ctx.read(gbk)?, step);
                        Ok(())
                    })
                    .unwrap();
            }
        }
        engine.wait_all().wait().expect("the epoch's ops");
        let time = start.elapsed();
        times.push(time);
        let total = engine.get(&epoch_loss).wait().unwrap();
        let acc = epoch_loss.key();
        engine
            .push(&[], &[&epoch_loss], move |ctx| {
                *ctx.write(acc)? = 0.0;
                Ok(())
            })
            .unwrap();
        if rank == 0 {
            let mean = total / (data.batches() * BATCH) as f64;
            println!("epoch {epoch:>2}: mean loss {mean:.4}, {:.1} ms", ms(time));
        }
    }

    // The ranks' weights: a checksum of their bits, its maximum and minimum
    // over the ranks.
    let params: Vec<Vec<f32>> = w
        .iter()
        .chain(&b)
        .map(|v| engine.get(v).wait().unwrap())
        .collect();
    let sum = checksum(&params);
    let hi = engine.var(vec![sum]);
    let lo = engine.var(vec![sum]);
    comm.all_reduce(&hi).reduce(ReduceOp::Max).push().unwrap();
    comm.all_reduce(&lo).reduce(ReduceOp::Min).push().unwrap();
    let (hi, lo) = (
        engine.get(&hi).wait().unwrap()[0],
        engine.get(&lo).wait().unwrap()[0],
    );
    let same = hi == lo;
    let accuracy = data.accuracy(&params[..LAYERS], &params[LAYERS..]);
    let ok = same && (epochs < 5 || accuracy >= MIN_ACCURACY);
    if rank == 0 {
        let mean = times.iter().skip(1).sum::<Duration>().as_secs_f64() * 1e3
            / times.len().saturating_sub(1).max(1) as f64;
        println!("held-out accuracy {:.1}%", accuracy * 100.0);
        println!("time per epoch: {mean:.1} ms (mean after the first)");
        println!(
            "weights identical on all {size} rank(s): {} (checksum {sum:016x})",
            if same { "yes" } else { "NO" }
        );
    }
    comm.shutdown().expect("collectives done");
    ok
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// out = in · W + b (row-major, W is din × dout), ReLU if `relu`.
fn linear(input: &[f32], w: &[f32], b: &[f32], out: &mut [f32], relu: bool) {
    let (din, dout) = (w.len() / b.len(), b.len());
    for (x, o) in input.chunks_exact(din).zip(out.chunks_exact_mut(dout)) {
        o.copy_from_slice(b);
        for (xi, wrow) in x.iter().zip(w.chunks_exact(dout)) {
            for (oj, wij) in o.iter_mut().zip(wrow) {
                *oj += xi * wij;
            }
        }
        if relu {
            o.iter_mut().for_each(|v| *v = v.max(0.0));
        }
    }
}

/// Softmax cross-entropy summed over the rows; `dz`: its gradient.
fn softmax_loss(logits: &[f32], labels: &[f32], dz: &mut [f32]) -> f32 {
    let c = DIMS[LAYERS];
    let mut total = 0.0;
    for ((z, g), &y) in logits
        .chunks_exact(c)
        .zip(dz.chunks_exact_mut(c))
        .zip(labels)
    {
        let max = z.iter().fold(f32::MIN, |m, &v| m.max(v));
        let sum: f32 = z.iter().map(|v| (v - max).exp()).sum();
        for (j, (gj, zj)) in g.iter_mut().zip(z).enumerate() {
            *gj = (zj - max).exp() / sum - if j == y as usize { 1.0 } else { 0.0 };
        }
        total += sum.ln() + max - z[y as usize];
    }
    total
}

/// gW = inᵀ · dz, gb = Σ rows of dz (sums over the rank's rows).
fn grads(input: &[f32], dz: &[f32], din: usize, dout: usize, gw: &mut [f32], gb: &mut [f32]) {
    gw.fill(0.0);
    gb.fill(0.0);
    for (x, g) in input.chunks_exact(din).zip(dz.chunks_exact(dout)) {
        for (xi, row) in x.iter().zip(gw.chunks_exact_mut(dout)) {
            for (r, gj) in row.iter_mut().zip(g) {
                *r += xi * gj;
            }
        }
        for (b, gj) in gb.iter_mut().zip(g) {
            *b += gj;
        }
    }
}

/// dz below = (dz · Wᵀ) ⊙ [a > 0] (the layer below's ReLU).
fn input_grad(dz: &[f32], w: &[f32], a: &[f32], din: usize, dout: usize, below: &mut [f32]) {
    for ((g, x), d) in dz
        .chunks_exact(dout)
        .zip(a.chunks_exact(din))
        .zip(below.chunks_exact_mut(din))
    {
        for ((di, wrow), xi) in d.iter_mut().zip(w.chunks_exact(dout)).zip(x) {
            *di = if *xi > 0.0 {
                wrow.iter().zip(g).map(|(w, g)| w * g).sum()
            } else {
                0.0
            };
        }
    }
}

fn sgd(p: &mut [f32], g: &[f32], step: f32) {
    p.iter_mut().zip(g).for_each(|(p, g)| *p -= step * g);
}

/// FNV-1a over the parameters' bits.
fn checksum(params: &[Vec<f32>]) -> u64 {
    params.iter().flatten().fold(0xcbf2_9ce4_8422_2325, |h, v| {
        v.to_bits()
            .to_le_bytes()
            .iter()
            .fold(h, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
    })
}

/// splitmix64: a seeded, reproducible shuffle and initialisation.
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
    fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            v.swap(i, (self.next() % (i as u64 + 1)) as usize);
        }
    }
}

/// Standardised features, row-major, and class indices as f32.
struct Data {
    train_x: Vec<f32>,
    train_y: Vec<f32>,
    test_x: Vec<f32>,
    test_y: Vec<f32>,
}

impl Data {
    /// Splits the digits (seeded shuffle) and standardises them with the
    /// training set's statistics.
    fn load() -> Self {
        let digits = smartcore::dataset::digits::load_dataset();
        let (f, n) = (digits.num_features, digits.num_samples);
        assert_eq!(f, DIMS[0]);
        let mut order: Vec<usize> = (0..n).collect();
        Rng(SEED).shuffle(&mut order);
        let (test, train) = order.split_at((n as f64 * TEST_SHARE).round() as usize);
        let rows = |ids: &[usize]| -> Vec<f32> {
            ids.iter()
                .flat_map(|&i| &digits.data[i * f..][..f])
                .copied()
                .collect()
        };
        let (mut train_x, mut test_x) = (rows(train), rows(test));
        for j in 0..f {
            let col = || train_x.iter().skip(j).step_by(f);
            let mean = col().sum::<f32>() / train.len() as f32;
            let var = col().map(|v| (v - mean) * (v - mean)).sum::<f32>() / train.len() as f32;
            let scale = if var > 0.0 { 1.0 / var.sqrt() } else { 1.0 };
            for v in train_x.iter_mut().chain(&mut test_x).skip(j).step_by(f) {
                *v = (*v - mean) * scale;
            }
        }
        let labels = |ids: &[usize]| ids.iter().map(|&i| digits.target[i]).collect();
        Data {
            train_x,
            train_y: labels(train),
            test_x,
            test_y: labels(test),
        }
    }

    fn batches(&self) -> usize {
        self.train_y.len() / BATCH
    }

    fn order(&self, epoch: usize) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.train_y.len()).collect();
        Rng(SEED + 1 + epoch as u64).shuffle(&mut order);
        order
    }

    fn load_rows(&self, ids: &[usize], x: &mut [f32], y: &mut [f32]) {
        let f = DIMS[0];
        for (r, &i) in ids.iter().enumerate() {
            x[r * f..][..f].copy_from_slice(&self.train_x[i * f..][..f]);
            y[r] = self.train_y[i];
        }
    }

    fn accuracy(&self, w: &[Vec<f32>], b: &[Vec<f32>]) -> f64 {
        let mut act = self.test_x.clone();
        for k in 0..LAYERS {
            let mut out = vec![0.0; act.len() / DIMS[k] * DIMS[k + 1]];
            linear(&act, &w[k], &b[k], &mut out, k + 1 < LAYERS);
            act = out;
        }
        let argmax = |z: &[f32]| (0..z.len()).fold(0, |m, c| if z[c] > z[m] { c } else { m });
        let right = act
            .chunks_exact(DIMS[LAYERS])
            .map(argmax)
            .zip(&self.test_y)
            .filter(|&(p, &y)| p == y as usize)
            .count();
        right as f64 / self.test_y.len() as f64
    }
}
