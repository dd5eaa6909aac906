//! After the reduction: the optimizer, on every replica or once on the
//! host ([`Update`]), pushed per bucket right behind its reduction.
//!
//! - [`Update::EveryReplica`] (seed 001's improved design): each device's
//!   replica is updated from its own copy of the summed gradient, on the
//!   device; no copy back. At a negative priority (`bucket.rs` says which):
//!   after the backward ops still to run on the device.
//! - [`Update::Host`] (seed 000's program): one op on the engine's default
//!   device sums the devices' gradients into the host's
//!   ([`serial_sum`](super::serial_sum), the ring's order), across ranks
//!   (feature `mpi`) one all-reduce per parameter of the host's sums, one
//!   op per parameter updates the host's weights, and one copy op per
//!   device writes them back into its replica (on a stream device, on its
//!   host-to-device lane).
//!
//! Both sum in the same order (a bucket's gradients concatenated in
//! parameter order, then [`serial_sum`](super::serial_sum): the host's sum
//! is per bucket too, not per parameter) and run the same optimizer on the
//! same values: the weights are the same bits.

use std::sync::Arc;

use super::group::{Group, HostVars, Member, ParamVars};
use super::ring::serial_sum_into;
use crate::dep::{Var, VarKey};
use crate::device::Lane;
use crate::engine::{Engine, OpBuilder};
use crate::error::Error;

/// Where a [`Group`]'s optimizer runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Update {
    /// On every device, on its replica, after an all-reduce of the
    /// gradients (the default).
    #[default]
    EveryReplica,
    /// Once on the host (of each rank, across ranks): gradients summed
    /// there (and across ranks, by an MPI all-reduce of the host's sums),
    /// weights updated there and copied back to every replica; no
    /// all-reduce between devices (the devices' gradients stay their own:
    /// the sum is the host's).
    Host,
}

/// The optimizer step, `f(weights, summed_gradient)`.
#[derive(Clone)]
pub(super) struct Optimizer(pub(super) Arc<OptimizerFn>);

type OptimizerFn = dyn Fn(&mut [f32], &[f32]) + Send + Sync;

impl std::fmt::Debug for Optimizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Optimizer(..)")
    }
}

type Key = VarKey<Vec<f32>>;

/// Pushes the update of `p` on every replica (each device reads its own
/// summed gradient).
pub(super) fn every_replica(
    engine: &Engine,
    members: &[Member],
    p: &ParamVars,
    opt: &Optimizer,
    priority: i32,
) -> Result<(), Error> {
    for (d, m) in members.iter().enumerate() {
        let (g, w) = (&p.grads[d], &p.replicas[d]);
        let op = engine.op().name("update").priority(priority).on(m.device);
        push_step(op, g, w, opt)?;
    }
    Ok(())
}

/// A bucket's host aggregation: its scratch (each device's gradients
/// concatenated, and the sum) and the keys its op captures.
#[derive(Debug)]
pub(super) struct HostSum {
    scratch: Var<Vec<Vec<f32>>>,
    /// `grads[d]`: device `d`'s gradients of the bucket's parameters.
    grads: Arc<[Arc<[Key]>]>,
    /// The host's gradient of each parameter.
    sums: Arc<[Key]>,
    /// The ranks the group spans: the host's sums are all-reduced there.
    #[cfg(feature = "mpi")]
    ranks: Option<crate::engine::Communicator>,
}

impl HostSum {
    pub(super) fn new(group: &Group, params: &[&ParamVars], n: usize) -> Self {
        let engine = &group.engine;
        let len = params.iter().map(|p| p.len).sum();
        Self {
            #[cfg(feature = "mpi")]
            ranks: group.ranks.clone(),
            scratch: engine.var(vec![vec![0.0; len]; n + 1]),
            grads: (0..n)
                .map(|d| params.iter().map(|p| p.grads[d].key()).collect())
                .collect(),
            sums: params.iter().map(|p| host(p).1.key()).collect(),
        }
    }

    /// Its scratch variable.
    pub(super) fn scratch(&self) -> &Var<Vec<Vec<f32>>> {
        &self.scratch
    }

    /// Pushes the sum of the bucket's gradients into the host's, then per
    /// parameter the update and the copies back, at `priority` (across
    /// ranks, the collectives tagged `tag`).
    pub(super) fn push<'p>(
        &self,
        engine: &Engine,
        members: &[Member],
        params: impl Iterator<Item = &'p ParamVars> + Clone,
        opt: Option<&Optimizer>,
        (priority, tag): (i32, u64),
    ) -> Result<(), Error> {
        #[cfg(not(feature = "mpi"))]
        let _ = tag;
        let mut op = engine
            .op()
            .name("host sum")
            .priority(priority)
            .mutates(&[&self.scratch]);
        for p in params.clone() {
            op = op.reads_each(&p.grads).mutates(&[&host(p).1]);
        }
        let (scratch, grads, sums) = (self.scratch.key(), self.grads.clone(), self.sums.clone());
        op.run(move |ctx| {
            let mut scratch = ctx.write(scratch)?;
            let (out, each) = scratch.split_last_mut().expect("n + 1 buffers");
            for (buf, keys) in each.iter_mut().zip(grads.iter()) {
                let mut at = 0;
                for &k in keys.iter() {
                    let g = ctx.read(k)?;
                    let end = at + g.len();
                    if end > buf.len() {
                        return Err(Error::Parallel("a gradient changed length".into()).into());
                    }
                    buf[at..end].copy_from_slice(&g);
                    at = end;
                }
            }
            serial_sum_into(each, out);
            let mut at = 0;
            for &k in sums.iter() {
                let mut s = ctx.write(k)?;
                let len = s.len();
                s.copy_from_slice(&out[at..at + len]);
                at += len;
            }
            Ok(())
        })?;
        #[cfg(feature = "mpi")]
        if let Some(ranks) = &self.ranks {
            let sums = params.clone().map(|p| &host(p).1);
            super::ranks::sum_host(ranks, sums, (priority, tag))?;
        }
        let Some(opt) = opt else { return Ok(()) };
        for p in params {
            let (w, g) = host(p);
            push_step(
                engine.op().name("host update").priority(priority),
                g,
                w,
                opt,
            )?;
            for (d, m) in members.iter().enumerate() {
                let r = &p.replicas[d];
                let (src, dst) = (w.key(), r.key());
                let mut op = engine
                    .op()
                    .name("copy back")
                    .priority(priority)
                    .on(m.device);
                if m.stream {
                    op = op.lane(Lane::HostToDevice);
                }
                op.reads(&[w]).mutates(&[r]).run(move |ctx| {
                    ctx.write(dst)?.copy_from_slice(&ctx.read(src)?);
                    Ok(())
                })?;
            }
        }
        Ok(())
    }
}

/// Pushes `op` (named and placed by the caller) as the optimizer step of
/// weights `w` with the summed gradient `g`.
fn push_step<'a>(
    op: OpBuilder<'a>,
    g: &'a Var<Vec<f32>>,
    w: &'a Var<Vec<f32>>,
    opt: &Optimizer,
) -> Result<(), Error> {
    let (gk, wk, opt) = (g.key(), w.key(), opt.clone());
    op.reads(&[g]).mutates(&[w]).run(move |ctx| {
        (opt.0)(&mut ctx.write(wk)?, &ctx.read(gk)?);
        Ok(())
    })?;
    Ok(())
}

/// The host's weights and gradient of `p` (it has them under
/// [`Update::Host`]).
fn host(p: &ParamVars) -> &HostVars {
    p.host.as_ref().expect("host variables under Update::Host")
}

/// Declaring each variable of a slice (the builder takes `&[&dyn AnyVar]`).
trait ReadsEach<'a> {
    fn reads_each(self, vars: &'a [Var<Vec<f32>>]) -> Self;
}

impl<'a> ReadsEach<'a> for OpBuilder<'a> {
    fn reads_each(mut self, vars: &'a [Var<Vec<f32>>]) -> Self {
        for v in vars {
            self = self.reads(&[v]);
        }
        self
    }
}
