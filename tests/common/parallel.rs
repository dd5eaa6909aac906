//! Helpers shared by the data-parallel tests (`tests/parallel.rs`,
//! `tests/parallel_differential.rs`, `tests/nccl.rs`, `tests/mpi/group.rs`):
//! the reference sum in the ring's order, plain SGD, a step's backward op
//! of a linear model, devices held busy until the test lets them go.

use std::sync::mpsc::{Sender, channel};

use depflow::parallel::{DeviceStep, Param};
use depflow::{BoxError, Device, Engine, Error};

/// The ring's order, written out here independently of the crate: chunk
/// `c` (elements `c*len/n .. (c+1)*len/n` of the buffers) folds from device
/// `c`.
pub fn ring_order(buffers: &[Vec<f32>]) -> Vec<f32> {
    let (n, len) = (buffers.len(), buffers[0].len());
    let mut out = vec![0.0; len];
    for c in 0..n {
        for i in c * len / n..(c + 1) * len / n {
            let mut acc = buffers[c][i];
            for k in 1..n {
                acc += buffers[(c + k) % n][i];
            }
            out[i] = acc;
        }
    }
    out
}

/// Plain SGD, learning rate 1: `w -= g`.
pub fn sgd(w: &mut [f32], g: &[f32]) {
    w.iter_mut().zip(g).for_each(|(w, g)| *w -= g)
}

/// Pushes step `s`'s backward op for parameter `w` on its device, then
/// marks `w`'s gradient ready: the op reads the step's inputs 0 (`x`) and 1
/// (`y`) and the replica of `w`, and writes the gradient with
/// `f(x, y, w, gradient)`.
pub fn backward(
    s: &mut DeviceStep<'_>,
    w: Param,
    f: impl FnOnce(&[f32], &[f32], &[f32], &mut [f32]) -> Result<(), BoxError> + Send + 'static,
) -> Result<(), Error> {
    let (x, y, wv, g) = (s.input(0), s.input(1), s.replica(w), s.grad(w));
    let (xk, yk, wk, gk) = (x.key(), y.key(), wv.key(), g.key());
    s.engine()
        .op()
        .name("backward")
        .on(s.device())
        .reads(&[x, y, wv])
        .mutates(&[g])
        .run(move |ctx| {
            let (x, y, w) = (ctx.read(xk)?, ctx.read(yk)?, ctx.read(wk)?);
            f(&x, &y, &w, &mut ctx.write(gk)?)
        })?;
    s.grad_ready(w)
}

/// Holds one worker of each of `devices` busy (an op waiting on a channel)
/// until its sender sends or is dropped: what is pushed meanwhile is all
/// ready when they are let go.
pub fn hold(engine: &Engine, devices: &[Device]) -> Vec<Sender<()>> {
    devices
        .iter()
        .map(|&d| {
            let (open, gate) = channel::<()>();
            let held = engine.new_var();
            engine
                .op()
                .on(d)
                .mutates(&[&held])
                .run(move |_| {
                    gate.recv()?;
                    Ok(())
                })
                .unwrap();
            open
        })
        .collect()
}
