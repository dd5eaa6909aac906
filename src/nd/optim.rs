//! Optimizers: [`Sgd`] (with momentum) and [`Adam`], as PyTorch defines
//! them. A step is one engine op per parameter that reads its gradient
//! and updates the parameter and the optimizer's state for it in place,
//! so it runs as soon as that gradient is done (overlapping the rest of
//! the backward pass) and is recorded like any op inside
//! [`record`](super::record). The state (velocities, moments, Adam's step
//! count) is arrays and variables of the engine's own, made with the
//! optimizer, so it outlives a recording.

use ndarray::{ArrayView1, ArrayViewMut1, Zip};

use super::shape::misfit;
use super::{Array, mode};
use crate::dep::Var;
use crate::error::Error;

/// The gradient of parameter `i`, or the error that says why it has none.
fn gradient(op: &'static str, i: usize, p: &Array) -> Result<Array, Error> {
    p.grad().ok_or_else(|| {
        misfit(
            op,
            format!(
                "parameter {i} (shape {:?}) has no gradient: it is not a leaf (with_grad), or no \
                 backward pass or zero_grad reached it yet",
                p.shape()
            ),
        )
    })
}

/// Stochastic gradient descent with momentum: `v = μ v + g`, `p −= lr v`
/// (`p −= lr g` without momentum).
///
/// ```
/// use depflow::{Engine, Error, nd};
///
/// let arrays = nd::Arrays::new(&Engine::new());
/// let w = arrays.from_vec(vec![1.0, -2.0], &[2])?.with_grad();
/// let sgd = nd::optim::Sgd::new(vec![w.clone()], 0.25);
/// for _ in 0..3 {
///     sgd.zero_grad()?;
///     w.square()?.sum()?.backward()?; // d(w²)/dw = 2w
///     sgd.step()?; // w ← w − 0.25·2w = w/2
/// }
/// assert_eq!(w.to_vec().wait()?, [0.125, -0.25]);
/// # Ok::<(), Error>(())
/// ```
#[derive(Debug)]
pub struct Sgd {
    params: Vec<Array>,
    velocities: Vec<Array>,
    lr: f32,
    momentum: f32,
}

impl Sgd {
    /// SGD of `params` with learning rate `lr`, no momentum.
    pub fn new(params: Vec<Array>, lr: f32) -> Sgd {
        Sgd {
            params,
            velocities: Vec::new(),
            lr,
            momentum: 0.0,
        }
    }

    /// With momentum `momentum` (μ).
    pub fn momentum(mut self, momentum: f32) -> Sgd {
        self.momentum = momentum;
        self.velocities = if momentum == 0.0 {
            Vec::new()
        } else {
            self.params.iter().map(Array::zeroed_like).collect()
        };
        self
    }

    /// Zeroes every parameter's gradient ([`Array::zero_grad`]).
    ///
    /// # Errors
    ///
    /// As for [`Array::zero_grad`].
    pub fn zero_grad(&self) -> Result<(), Error> {
        self.params.iter().try_for_each(Array::zero_grad)
    }

    /// One update of every parameter from its gradient: one op each.
    ///
    /// # Errors
    ///
    /// [`Error::Array`] for a parameter with no gradient;
    /// [`Error::ShutDown`] after shutdown.
    pub fn step(&self) -> Result<(), Error> {
        let (lr, momentum) = (self.lr, self.momentum);
        for (i, p) in self.params.iter().enumerate() {
            let g = gradient("sgd", i, p)?;
            let (pd, gd) = (p.buffer().clone(), g.buffer().clone());
            match self.velocities.get(i) {
                None => mode::submit(
                    p.engine(),
                    p.device(),
                    "sgd",
                    &[g.buffer()],
                    &[p.buffer()],
                    move |ctx| {
                        let (g, mut p) = (ctx.read(&gd)?, ctx.write(&pd)?);
                        Zip::from(ArrayViewMut1::from(&mut p[..]))
                            .and(ArrayView1::from(&g[..]))
                            .for_each(|p, &g| *p -= lr * g);
                        Ok(())
                    },
                )?,
                Some(v) => {
                    let vd = v.buffer().clone();
                    mode::submit(
                        p.engine(),
                        p.device(),
                        "sgd",
                        &[g.buffer()],
                        &[p.buffer(), v.buffer()],
                        move |ctx| {
                            let (g, mut p, mut v) =
                                (ctx.read(&gd)?, ctx.write(&pd)?, ctx.write(&vd)?);
                            Zip::from(ArrayViewMut1::from(&mut p[..]))
                                .and(ArrayViewMut1::from(&mut v[..]))
                                .and(ArrayView1::from(&g[..]))
                                .for_each(|p, v, &g| {
                                    *v = momentum * *v + g;
                                    *p -= lr * *v;
                                });
                            Ok(())
                        },
                    )?
                }
            }
        }
        Ok(())
    }
}

/// Adam: `m = β₁ m + (1 − β₁) g`, `v = β₂ v + (1 − β₂) g²`,
/// `p −= lr m̂ / (√v̂ + ε)` with `m̂ = m / (1 − β₁ᵗ)`, `v̂ = v / (1 − β₂ᵗ)`
/// at step `t` (from 1).
#[derive(Debug)]
pub struct Adam {
    params: Vec<Array>,
    moments: Vec<(Array, Array)>,
    /// The step count, which each step's first op advances and its
    /// parameters' ops read.
    t: Var<u64>,
    lr: f32,
    betas: (f32, f32),
    eps: f32,
}

impl Adam {
    /// Adam of `params` with learning rate `lr`, β = (0.9, 0.999) and
    /// ε = 1e-8, PyTorch's defaults.
    ///
    /// # Errors
    ///
    /// [`Error::Array`] if `params` is empty.
    pub fn new(params: Vec<Array>, lr: f32) -> Result<Adam, Error> {
        let Some(first) = params.first() else {
            return Err(misfit("adam", "no parameters"));
        };
        let engine = first.engine().clone();
        Ok(Adam {
            moments: params
                .iter()
                .map(|p| (p.zeroed_like(), p.zeroed_like()))
                .collect(),
            params,
            t: engine.var_named("adam step", 0u64),
            lr,
            betas: (0.9, 0.999),
            eps: 1e-8,
        })
    }

    /// With β₁, β₂ `betas` and ε `eps`.
    pub fn with(mut self, betas: (f32, f32), eps: f32) -> Adam {
        self.betas = betas;
        self.eps = eps;
        self
    }

    /// Zeroes every parameter's gradient ([`Array::zero_grad`]).
    ///
    /// # Errors
    ///
    /// As for [`Array::zero_grad`].
    pub fn zero_grad(&self) -> Result<(), Error> {
        self.params.iter().try_for_each(Array::zero_grad)
    }

    /// One update of every parameter from its gradient: an op advancing
    /// the step count, then one op per parameter.
    ///
    /// # Errors
    ///
    /// [`Error::Array`] for a parameter with no gradient;
    /// [`Error::ShutDown`] after shutdown.
    pub fn step(&self) -> Result<(), Error> {
        let grads = self
            .params
            .iter()
            .enumerate()
            .map(|(i, p)| gradient("adam", i, p))
            .collect::<Result<Vec<_>, _>>()?;
        let first = &self.params[0];
        let t = self.t.clone();
        mode::submit(
            first.engine(),
            first.device(),
            "adam step",
            &[],
            &[&self.t],
            move |ctx| {
                *ctx.write(&t)? += 1;
                Ok(())
            },
        )?;
        let (lr, (b1, b2), eps) = (self.lr, self.betas, self.eps);
        for ((p, (m, v)), g) in self.params.iter().zip(&self.moments).zip(&grads) {
            let (pd, md, vd, gd, t) = (
                p.buffer().clone(),
                m.buffer().clone(),
                v.buffer().clone(),
                g.buffer().clone(),
                self.t.clone(),
            );
            mode::submit(
                p.engine(),
                p.device(),
                "adam",
                &[g.buffer(), &self.t],
                &[p.buffer(), m.buffer(), v.buffer()],
                move |ctx| {
                    let step = *ctx.read(&t)? as i32;
                    let (c1, c2) = (1.0 - b1.powi(step), 1.0 - b2.powi(step));
                    let g = ctx.read(&gd)?;
                    let (mut p, mut m, mut v) = (ctx.write(&pd)?, ctx.write(&md)?, ctx.write(&vd)?);
                    Zip::from(ArrayViewMut1::from(&mut p[..]))
                        .and(ArrayViewMut1::from(&mut m[..]))
                        .and(ArrayViewMut1::from(&mut v[..]))
                        .and(ArrayView1::from(&g[..]))
                        .for_each(|p, m, v, &g| {
                            *m = b1 * *m + (1.0 - b1) * g;
                            *v = b2 * *v + (1.0 - b2) * g * g;
                            *p -= lr * (*m / c1) / ((*v / c2).sqrt() + eps);
                        });
                    Ok(())
                },
            )?;
        }
        Ok(())
    }
}
