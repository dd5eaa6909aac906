//! The classifier: an MLP (ReLU between layers, softmax cross-entropy),
//! its parameters in a data-parallel group, and the ops one device pushes
//! for one step: a forward op per layer, the loss, a backward op per layer
//! (last layer first), each marking its gradient ready so that its
//! all-reduce starts behind it.
//!
//! Each layer's weights and bias are one parameter of the group (one
//! buffer: the `in x out` weights, then the `out` biases), as frameworks
//! keep flat parameter buffers: the group's buckets, cut by size, then
//! never tie one layer's bias to the next layer's weights (a bucket holding
//! both could be reduced only once the earlier layer's backward op ran).

use depflow::parallel::{DeviceStep, Group, Param};
use depflow::{Engine, Error, Var};
use ndarray::linalg::general_mat_mul;
use ndarray::{ArrayView2, ArrayViewMut2};

use crate::data::{CLASSES, Rng};

/// A device's own variables: activations (`acts[0]` unused: the shard is
/// the input), their gradients, and the losses of its steps.
pub struct Scratch {
    acts: Vec<Var<Vec<f32>>>,
    grads: Vec<Var<Vec<f32>>>,
    pub losses: Var<Vec<f32>>,
}

/// A model's weights, read back: per layer, weights and bias.
pub type Weights = Vec<(Vec<f32>, Vec<f32>)>;

pub struct Mlp {
    pub dims: Vec<usize>,
    /// Per layer: weights (in x out) then bias, in one buffer.
    pub params: Vec<Param>,
    pub scratch: Vec<Scratch>,
}

fn view(v: &[f32], rows: usize, cols: usize) -> ArrayView2<'_, f32> {
    ArrayView2::from_shape((rows, cols), v).expect("shape")
}

fn view_mut(v: &mut [f32], rows: usize, cols: usize) -> ArrayViewMut2<'_, f32> {
    ArrayViewMut2::from_shape((rows, cols), v).expect("shape")
}

impl Mlp {
    /// Glorot-uniform weights, zero biases, the same on every replica.
    pub fn new(
        group: &mut Group,
        engine: &Engine,
        dims: &[usize],
        seed: u64,
    ) -> Result<Self, Error> {
        let mut rng = Rng(seed);
        let mut params = Vec::new();
        for l in 0..dims.len() - 1 {
            let (i, o) = (dims[l], dims[l + 1]);
            let scale = (6.0 / (i + o) as f32).sqrt();
            let mut wb: Vec<f32> = (0..i * o).map(|_| rng.uniform() * scale).collect();
            wb.resize(i * o + o, 0.0);
            params.push(group.param(&wb)?);
        }
        let scratch = group
            .devices()
            .map(|_| Scratch {
                acts: dims.iter().map(|_| engine.var(Vec::new())).collect(),
                grads: dims.iter().map(|_| engine.var(Vec::new())).collect(),
                losses: engine.var(Vec::new()),
            })
            .collect();
        Ok(Self {
            dims: dims.to_vec(),
            params,
            scratch,
        })
    }

    /// Pushes device `s`'s forward, loss and backward ops.
    pub fn step(&self, s: &mut DeviceStep<'_>) -> Result<(), Error> {
        let (r, batch, layers) = (s.rows(), s.batch_rows(), self.dims.len() - 1);
        let sc = &self.scratch[s.index()];
        let shard = s.input(0);
        let input = |l: usize| if l == 0 { shard } else { &sc.acts[l] };
        for l in 0..layers {
            let (i, o) = (self.dims[l], self.dims[l + 1]);
            let (x, wv, y) = (input(l), s.replica(self.params[l]), &sc.acts[l + 1]);
            let (xk, wk, yk) = (x.key(), wv.key(), y.key());
            let relu = l + 1 < layers;
            s.engine()
                .op()
                .name("forward")
                .on(s.device())
                .reads(&[x, wv])
                .mutates(&[y])
                .run(move |ctx| {
                    let mut y = ctx.write(yk)?;
                    y.resize(r * o, 0.0);
                    let mut out = view_mut(&mut y, r, o);
                    let wb = ctx.read(wk)?;
                    let (w, bias) = wb.split_at(i * o);
                    for mut row in out.rows_mut() {
                        row.iter_mut().zip(bias).for_each(|(v, b)| *v = *b);
                    }
                    general_mat_mul(
                        1.0,
                        &view(&ctx.read(xk)?, r, i),
                        &view(w, i, o),
                        1.0,
                        &mut out,
                    );
                    if relu {
                        y.iter_mut().for_each(|v| *v = v.max(0.0));
                    }
                    Ok(())
                })?;
        }
        // Softmax cross-entropy: the logits' gradient (of the batch's mean
        // loss) and this shard's summed loss.
        let (logits, dlogits, labels) = (&sc.acts[layers], &sc.grads[layers], s.input(1));
        let (zk, gk, lk, lossk) = (logits.key(), dlogits.key(), labels.key(), sc.losses.key());
        s.engine()
            .op()
            .name("loss")
            .on(s.device())
            .reads(&[logits, labels])
            .mutates(&[dlogits, &sc.losses])
            .run(move |ctx| {
                let (z, labels) = (ctx.read(zk)?, ctx.read(lk)?);
                let mut g = ctx.write(gk)?;
                g.resize(r * CLASSES, 0.0);
                let mut loss = 0.0;
                for ((z, g), &y) in z
                    .chunks(CLASSES)
                    .zip(g.chunks_mut(CLASSES))
                    .zip(labels.iter())
                {
                    let max = z.iter().fold(f32::MIN, |m, &v| m.max(v));
                    let sum: f32 = z.iter().map(|v| (v - max).exp()).sum();
                    for (k, (g, v)) in g.iter_mut().zip(z).enumerate() {
                        let p = (v - max).exp() / sum;
                        *g = (p - if k == y as usize { 1.0 } else { 0.0 }) / batch as f32;
                    }
                    loss -= ((z[y as usize] - max).exp() / sum).ln();
                }
                ctx.write(lossk)?.push(loss);
                Ok(())
            })?;
        for l in (0..layers).rev() {
            let (i, o) = (self.dims[l], self.dims[l + 1]);
            let p = self.params[l];
            let (x, dy, wv) = (input(l), &sc.grads[l + 1], s.replica(p));
            let (g, dx) = (s.grad(p), &sc.grads[l]);
            let (xk, dyk, wk, gk, dxk) = (x.key(), dy.key(), wv.key(), g.key(), dx.key());
            let first = l == 0;
            let mut op = s
                .engine()
                .op()
                .name("backward")
                .on(s.device())
                .reads(&[x, dy, wv])
                .mutates(&[g]);
            if !first {
                op = op.mutates(&[dx]);
            }
            op.run(move |ctx| {
                let (x, dy) = (ctx.read(xk)?, ctx.read(dyk)?);
                let (xv, dyv) = (view(&x, r, i), view(&dy, r, o));
                let mut g = ctx.write(gk)?;
                let (gw, gb) = g.split_at_mut(i * o);
                general_mat_mul(1.0, &xv.t(), &dyv, 0.0, &mut view_mut(gw, i, o));
                gb.fill(0.0);
                for row in dyv.rows() {
                    gb.iter_mut().zip(row).for_each(|(g, d)| *g += d);
                }
                if !first {
                    // dx = dy . W^T, through the ReLU that made x.
                    let mut dx = ctx.write(dxk)?;
                    dx.resize(r * i, 0.0);
                    let mut dxv = view_mut(&mut dx, r, i);
                    let wb = ctx.read(wk)?;
                    general_mat_mul(1.0, &dyv, &view(&wb[..i * o], i, o).t(), 0.0, &mut dxv);
                    dxv.zip_mut_with(&xv, |d, &x| {
                        if x <= 0.0 {
                            *d = 0.0
                        }
                    });
                }
                Ok(())
            })?;
            s.grad_ready(p)?;
        }
        Ok(())
    }

    /// Pushes an epoch of `steps` steps on `batch(step)`, each batch loaded
    /// (split over the devices) while the step before it runs.
    pub fn epoch(
        &self,
        group: &mut Group,
        steps: usize,
        batch: impl Fn(usize) -> Vec<Vec<f32>>,
    ) -> Result<(), Error> {
        group.load(batch(0))?;
        for step in 0..steps {
            if step + 1 < steps {
                group.load(batch(step + 1))?;
            }
            group.step(|s| self.step(s))?;
        }
        Ok(())
    }

    /// The sum of every device's losses since the last call, once every
    /// step's have been written (and the devices' losses emptied).
    pub fn take_losses(&self, engine: &Engine) -> Result<f32, Error> {
        let mut total = 0.0;
        for sc in &self.scratch {
            let k = sc.losses.key();
            total += engine
                .op()
                .mutates(&[&sc.losses])
                .run(move |ctx| Ok(std::mem::take(&mut *ctx.write(k)?).iter().sum::<f32>()))?
                .wait()?;
        }
        Ok(total)
    }

    /// Device `d`'s replica of every parameter.
    pub fn replica(&self, group: &Group, d: usize) -> Result<Weights, Error> {
        self.params
            .iter()
            .zip(self.dims.windows(2))
            .map(|(&p, io)| {
                let mut w = group.weights(p, d)?;
                let b = w.split_off(io[0] * io[1]);
                Ok((w, b))
            })
            .collect()
    }

    pub fn accuracy(&self, weights: &Weights, x: &[f32], y: &[f32]) -> f64 {
        let rows = y.len();
        let mut h =
            ndarray::Array2::from_shape_vec((rows, self.dims[0]), x.to_vec()).expect("shape");
        for (l, (w, b)) in weights.iter().enumerate() {
            let (i, o) = (self.dims[l], self.dims[l + 1]);
            let mut next = h.dot(&view(w, i, o));
            for mut row in next.rows_mut() {
                row.iter_mut().zip(b).for_each(|(v, b)| *v += b);
            }
            if l + 1 < weights.len() {
                next.mapv_inplace(|v| v.max(0.0));
            }
            h = next;
        }
        let right = h
            .rows()
            .into_iter()
            .zip(y)
            .filter(|(row, y)| {
                let best = row
                    .iter()
                    .enumerate()
                    .fold((0, f32::MIN), |m, (k, &v)| if v > m.1 { (k, v) } else { m });
                best.0 == **y as usize
            })
            .count();
        right as f64 / rows as f64
    }
}
