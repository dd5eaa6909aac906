//! [`Group`]: a data-parallel group over a list of devices, and its
//! [`GroupBuilder`]; parameters and their replicas ([`Param`]).
//!
//! The group owns, per device: its inputs' shard variables (`split.rs`),
//! one replica and one gradient variable per parameter, and, once the
//! first step runs, the buckets' all-reduces (`bucket.rs`). The user's ops
//! touch replicas, gradients and shards only through the variables the
//! group hands out; the group's own ops are the splits, the all-reduces
//! and the updates.

use std::sync::Arc;

use super::allreduce::Backend;
use super::bucket::Buckets;
use super::split::Inputs;
use super::update::{Optimizer, Update};
use crate::dep::{Device, Var};
use crate::device::Lane;
#[cfg(feature = "mpi")]
use crate::engine::Communicator;
use crate::engine::Engine;
use crate::error::Error;

/// One device of a group.
#[derive(Clone, Copy, Debug)]
pub(super) struct Member {
    /// Where the user's step and the split run.
    pub(super) device: Device,
    /// Where the device's reduction ops run (by default `device`).
    pub(super) comm: Device,
    /// Whether `device` is a stream device (its split goes on its
    /// host-to-device lane).
    pub(super) stream: bool,
}

/// A parameter of a [`Group`]: an index into its parameters, in the order
/// they were added (the first layer's first, so that its reduction is
/// given the highest priority).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Param(pub(super) usize);

/// The host's weights and gradient sum of a parameter.
pub(super) type HostVars = (Var<Vec<f32>>, Var<Vec<f32>>);

/// A parameter's variables.
#[derive(Debug)]
pub(super) struct ParamVars {
    pub(super) len: usize,
    /// `replicas[d]`, `grads[d]`: on device `d`.
    pub(super) replicas: Vec<Var<Vec<f32>>>,
    pub(super) grads: Vec<Var<Vec<f32>>>,
    /// Host aggregation ([`Update::Host`]): the host's weights and
    /// gradient sum.
    pub(super) host: Option<HostVars>,
}

/// A data-parallel group: the same model replicated on several devices,
/// each step on one shard of the batch per device, gradients summed across
/// devices, every replica updated alike. See the [module
/// docs](crate::parallel) for a whole training step.
#[derive(Debug)]
pub struct Group {
    pub(super) engine: Engine,
    pub(super) members: Vec<Member>,
    pub(super) backend: Backend,
    pub(super) update: Update,
    pub(super) optimizer: Option<Optimizer>,
    pub(super) bucket_bytes: usize,
    pub(super) params: Vec<ParamVars>,
    pub(super) inputs: Inputs,
    /// Set up by the first step: no parameter may be added after it.
    pub(super) buckets: Option<Buckets>,
    /// How many ranks the group spans (1: this process only).
    pub(super) rank_count: usize,
    /// Steps begun so far (each [`step`](Group::step) call, whatever its
    /// outcome): step `k` tags its collectives across ranks `k + 1`.
    pub(super) steps: u64,
    /// The ranks the group spans ([`GroupBuilder::across_ranks`]).
    #[cfg(feature = "mpi")]
    pub(super) ranks: Option<Communicator>,
}

/// Configures a [`Group`]: its devices, inputs, update and bucket size.
#[derive(Debug)]
#[must_use = "a GroupBuilder does nothing until `build`"]
pub struct GroupBuilder {
    engine: Engine,
    devices: Vec<(Device, Option<Device>)>,
    widths: Vec<usize>,
    backend: Backend,
    update: Update,
    optimizer: Option<Optimizer>,
    bucket_bytes: usize,
    #[cfg(feature = "mpi")]
    ranks: Option<Communicator>,
}

/// Gradients smaller than this are reduced together, in buckets of at most
/// this many bytes (DDP's idea; its default is 25 MiB for GPUs, but here a
/// bucket is the unit that overlaps backward, and CPU models are small).
pub const DEFAULT_BUCKET_BYTES: usize = 256 << 10;

impl Group {
    /// A builder for a group on `engine`.
    pub fn builder(engine: &Engine) -> GroupBuilder {
        GroupBuilder {
            engine: engine.clone(),
            devices: Vec::new(),
            widths: Vec::new(),
            backend: Backend::Ring,
            update: Update::EveryReplica,
            optimizer: None,
            bucket_bytes: DEFAULT_BUCKET_BYTES,
            #[cfg(feature = "mpi")]
            ranks: None,
        }
    }

    /// How many ranks (processes) the group spans: 1 unless built
    /// `across_ranks` (feature `mpi`).
    pub fn rank_count(&self) -> usize {
        self.rank_count
    }

    /// How many parameters the group has ([`param`](Self::param)).
    pub fn param_count(&self) -> usize {
        self.params.len()
    }

    /// The group's devices, in order.
    pub fn devices(&self) -> impl ExactSizeIterator<Item = Device> + '_ {
        self.members.iter().map(|m| m.device)
    }

    /// The engine the group pushes to.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Adds a parameter, replicated on every device from `init` (seed
    /// 001's start program, run on all devices), with a gradient of the
    /// same length per device (zeros).
    ///
    /// # Errors
    ///
    /// [`Error::Parallel`] after the first step (buckets are fixed then).
    pub fn param(&mut self, init: &[f32]) -> Result<Param, Error> {
        self.param_replicas(vec![init.to_vec(); self.members.len()])
    }

    /// Adds a parameter from one replica per device (initialised on each
    /// device by the caller, identically: the group checks the shapes, not
    /// the values).
    ///
    /// # Errors
    ///
    /// [`Error::Parallel`] if the count is not one per device, if the
    /// replicas differ in length, or after the first step.
    pub fn param_replicas(&mut self, replicas: Vec<Vec<f32>>) -> Result<Param, Error> {
        if self.buckets.is_some() {
            return Err(Error::Parallel(
                "parameters are added before the first step".into(),
            ));
        }
        let n = self.members.len();
        if replicas.len() != n {
            return Err(Error::Parallel(format!(
                "{} replicas for {n} devices",
                replicas.len()
            )));
        }
        let len = replicas[0].len();
        if let Some(d) = replicas.iter().position(|r| r.len() != len) {
            return Err(Error::Parallel(format!(
                "replicas of different shapes: device 0's has {len} floats, device {d}'s {}",
                replicas[d].len()
            )));
        }
        let host = match self.update {
            Update::Host => Some((
                self.engine.var(replicas[0].clone()),
                self.engine.var(vec![0.0; len]),
            )),
            Update::EveryReplica => None,
        };
        let e = &self.engine;
        self.params.push(ParamVars {
            len,
            grads: (0..n).map(|_| e.var(vec![0.0; len])).collect(),
            replicas: replicas.into_iter().map(|r| e.var(r)).collect(),
            host,
        });
        Ok(Param(self.params.len() - 1))
    }

    /// Device `d`'s replica of `p`.
    ///
    /// # Panics
    ///
    /// If `p` is not this group's or `d` is out of range.
    pub fn replica(&self, p: Param, d: usize) -> &Var<Vec<f32>> {
        &self.params[p.0].replicas[d]
    }

    /// Device `d`'s gradient of `p` (after a step: the sum over devices).
    ///
    /// # Panics
    ///
    /// If `p` is not this group's or `d` is out of range.
    pub fn grad(&self, p: Param, d: usize) -> &Var<Vec<f32>> {
        &self.params[p.0].grads[d]
    }

    /// Pushes the split of a host batch (one buffer per declared input,
    /// whole rows of its width) into per-device shards, one copy op per
    /// device: the next [`step`](Self::step) reads them. Load batch `k + 1`
    /// before stepping on batch `k`, and its copies overlap step `k`.
    ///
    /// # Errors
    ///
    /// [`Error::Parallel`] for an empty batch, one that does not split
    /// evenly over the devices, a buffer count other than the inputs', a
    /// buffer of partial rows or of another row count, or when two batches
    /// are already loaded ahead. Across ranks, a batch refused for its
    /// content still takes its place: the step that would have stepped on
    /// it fails with this error (on every rank: see
    /// [`step`](Self::step)), so the ranks stay in step.
    pub fn load(&mut self, batch: Vec<Vec<f32>>) -> Result<(), Error> {
        self.inputs.load(&self.engine, &self.members, batch)
    }

    /// Reads replica `d` of `p` (waits for the ops that write it).
    ///
    /// # Errors
    ///
    /// [`Error::Parallel`] if `p` is not this group's or `d` is not one of
    /// its devices; the poison of a failed op that wrote it, or the
    /// engine's errors.
    ///
    /// ```
    /// use depflow::parallel::Group;
    /// use depflow::{Engine, Error};
    ///
    /// let engine = Engine::new();
    /// let mut group = Group::builder(&engine).device(engine.default_device()).build()?;
    /// let w = group.param(&[1.0, 2.0])?;
    /// assert_eq!(group.weights(w, 0)?, [1.0, 2.0]);
    /// assert!(matches!(group.weights(w, 1), Err(Error::Parallel(_))));
    /// # Ok::<(), Error>(())
    /// ```
    pub fn weights(&self, p: Param, d: usize) -> Result<Vec<f32>, Error> {
        let Some(param) = self.params.get(p.0) else {
            return Err(Error::Parallel(format!(
                "no parameter {} in this group (it has {})",
                p.0,
                self.params.len()
            )));
        };
        let Some(replica) = param.replicas.get(d) else {
            return Err(Error::Parallel(format!(
                "no device {d} in this group (it has {})",
                self.members.len()
            )));
        };
        self.engine.get(replica).wait()
    }
}

impl GroupBuilder {
    /// Adds a device: the user's step ops and the split run there, and so
    /// do its reduction ops.
    pub fn device(mut self, device: Device) -> Self {
        self.devices.push((device, None));
        self
    }

    /// Adds devices, as [`device`](Self::device) each.
    pub fn devices(mut self, devices: impl IntoIterator<Item = Device>) -> Self {
        self.devices.extend(devices.into_iter().map(|d| (d, None)));
        self
    }

    /// Adds a device whose reduction ops run on `comm` (a device of its
    /// own, as NCCL has its own stream): so that they overlap the
    /// device's backward ops instead of queueing behind them.
    pub fn device_with_comm(mut self, device: Device, comm: Device) -> Self {
        self.devices.push((device, Some(comm)));
        self
    }

    /// Declares an input of the batches: rows of `width` floats (labels
    /// are an input of width 1). Inputs are numbered in declaration order.
    pub fn input(mut self, width: usize) -> Self {
        self.widths.push(width);
        self
    }

    /// How gradients are summed across devices (default [`Backend::Ring`]).
    pub fn backend(mut self, backend: Backend) -> Self {
        self.backend = backend;
        self
    }

    /// Where the optimizer runs (default [`Update::EveryReplica`]).
    pub fn update(mut self, update: Update) -> Self {
        self.update = update;
        self
    }

    /// The optimizer step, `f(weights, summed_gradient)`: run on every
    /// replica, or once on the host (see [`Update`]). Without one, a step
    /// sums the gradients and leaves the weights alone.
    pub fn optimizer(mut self, f: impl Fn(&mut [f32], &[f32]) + Send + Sync + 'static) -> Self {
        self.optimizer = Some(Optimizer(Arc::new(f)));
        self
    }

    /// Gradients are reduced in buckets of at most `bytes`: consecutive
    /// parameters, filled from the last one back (the order backward
    /// writes them), a larger one alone. `0`: one bucket per parameter.
    ///
    /// **The order of the sum.** A bucket is summed as one buffer: each
    /// device's gradients of its parameters concatenated in parameter
    /// order, cut into chunks by the ring ([`serial_sum`](super::serial_sum)
    /// of those concatenations, bit for bit, with either [`Update`]). So
    /// [`serial_sum`](super::serial_sum) of one parameter's gradients alone
    /// gives its sum's bits only where the parameter is a bucket of its own
    /// (with `0`, always); in a shared bucket its elements fall in other
    /// chunks, whose folds start at other devices, and agree only where the
    /// sums are exact:
    ///
    /// ```
    /// use depflow::parallel::{Group, serial_sum};
    /// use depflow::{Engine, Error, Executor};
    ///
    /// // Each device's gradients are its row: 5 floats of `a`, then 3 of
    /// // `b`. Element 1 of `a` is 1 + 1e8 - 1e8 in some order: 0 or 1.
    /// let mut rows = [[0.0f32; 8]; 3];
    /// (rows[0][1], rows[1][1], rows[2][1]) = (1.0, 1e8, -1e8);
    /// let sums = |bucket_bytes| -> Result<[Vec<f32>; 2], Error> {
    ///     let mut b = Engine::builder();
    ///     for d in 0..3 {
    ///         b = b.device(&format!("cpu{d}"), Executor::pool(1));
    ///     }
    ///     let engine = b.build()?;
    ///     let devices = (0..3).map(|d| engine.device(&format!("cpu{d}")).unwrap());
    ///     let mut group = Group::builder(&engine)
    ///         .devices(devices)
    ///         .input(8)
    ///         .bucket_bytes(bucket_bytes)
    ///         .optimizer(|w, g| w.copy_from_slice(g)) // the weights: the sum
    ///         .build()?;
    ///     let (a, b) = (group.param(&[0.0; 5])?, group.param(&[0.0; 3])?);
    ///     group.load(vec![rows.concat()])?; // one row per device
    ///     group.step(|s| {
    ///         let (x, ga, gb) = (s.input(0).key(), s.grad(a).key(), s.grad(b).key());
    ///         s.engine()
    ///             .op()
    ///             .on(s.device())
    ///             .reads(&[s.input(0)])
    ///             .mutates(&[s.grad(a), s.grad(b)])
    ///             .run(move |ctx| {
    ///                 let x = ctx.read(x)?;
    ///                 ctx.write(ga)?.copy_from_slice(&x[..5]);
    ///                 ctx.write(gb)?.copy_from_slice(&x[5..]);
    ///                 Ok(())
    ///             })?;
    ///         s.grad_ready(b)?;
    ///         s.grad_ready(a)
    ///     })?;
    ///     Ok([group.weights(a, 0)?, group.weights(b, 0)?])
    /// };
    /// let each = |r: std::ops::Range<usize>| serial_sum(&rows.each_ref().map(|x| &x[r.clone()]));
    /// let whole = serial_sum(&rows.each_ref().map(|x| &x[..]));
    /// // One bucket per parameter: each one's own serial_sum.
    /// assert_eq!(sums(0)?, [each(0..5), each(5..8)]);
    /// // One bucket of both: the concatenation's, which differs.
    /// assert_eq!(sums(1 << 10)?, [whole[..5].to_vec(), whole[5..].to_vec()]);
    /// assert_ne!(whole[..5], each(0..5));
    /// # Ok::<(), Error>(())
    /// ```
    pub fn bucket_bytes(mut self, bytes: usize) -> Self {
        self.bucket_bytes = bytes;
        self
    }

    /// Spans the group across the ranks of `ranks` (the `mpi` feature):
    /// every rank builds the same group (the same number of local devices,
    /// the same parameters, in the same order) and steps it on its own
    /// share of each global batch; a step sums the gradients over every
    /// device of every rank, so every replica of every rank is updated
    /// alike. Each bucket's sum: the local ring's reduce-scatter, one MPI
    /// all-reduce per chunk (collective ops on `ranks`, pushed by the step
    /// in the same order on every rank), then the ring's all-gather (see
    /// [`AllReduce::across_ranks`](super::AllReduce::across_ranks) for the
    /// order of the sum). The first step checks, through one all-gather,
    /// that every rank has the same device count and buckets, and fails on
    /// every rank alike if not.
    ///
    /// The program's own collectives on `ranks` interleave with the
    /// group's in push order: push them from the thread that steps, in the
    /// same order on every rank. A gradient that fails on one rank only
    /// fails the step's cross-rank collectives on every rank (each carries
    /// a status word: see [`Communicator`]), so every rank's sums and
    /// replicas are poisoned and no rank waits forever; after
    /// [`clear_poison`](Group::clear_poison) on every rank the ranks train
    /// on in step.
    #[cfg(feature = "mpi")]
    pub fn across_ranks(mut self, ranks: &Communicator) -> Self {
        self.ranks = Some(ranks.clone());
        self
    }

    /// The group.
    ///
    /// # Errors
    ///
    /// [`Error::Parallel`] for no devices, a device given twice, or a zero
    /// input width; the engine's error for a device of another engine.
    pub fn build(self) -> Result<Group, Error> {
        if self.devices.is_empty() {
            return Err(Error::Parallel("a group of no devices".into()));
        }
        for (i, (d, _)) in self.devices.iter().enumerate() {
            if self.devices[..i].iter().any(|(e, _)| e == d) {
                return Err(Error::Parallel(format!(
                    "device {} is in the list twice (devices {} and {i})",
                    d.index(),
                    self.devices.iter().position(|(e, _)| e == d).unwrap_or(0)
                )));
            }
        }
        if self.widths.contains(&0) {
            return Err(Error::Parallel("an input of width 0".into()));
        }
        let mut members = Vec::with_capacity(self.devices.len());
        for &(device, comm) in &self.devices {
            members.push(Member {
                device,
                comm: comm.unwrap_or(device),
                stream: is_stream(&self.engine, device)?,
            });
        }
        #[cfg(feature = "mpi")]
        let across = self.ranks.is_some();
        #[cfg(not(feature = "mpi"))]
        let across = false;
        Ok(Group {
            inputs: Inputs::new(&self.engine, self.widths, members.len(), across),
            steps: 0,
            engine: self.engine,
            members,
            backend: self.backend,
            update: self.update,
            optimizer: self.optimizer,
            bucket_bytes: self.bucket_bytes,
            params: Vec::new(),
            buckets: None,
            #[cfg(feature = "mpi")]
            rank_count: self.ranks.as_ref().map_or(1, Communicator::size),
            #[cfg(not(feature = "mpi"))]
            rank_count: 1,
            #[cfg(feature = "mpi")]
            ranks: self.ranks,
        })
    }
}

/// Whether `device` is a stream device: the engine refuses a lane on any
/// other (checked at `run`, before anything is pushed). On a stream device
/// the probe is one empty op.
fn is_stream(engine: &Engine, device: Device) -> Result<bool, Error> {
    let probe = engine.new_var();
    let pushed = engine
        .op()
        .name("parallel probe")
        .on(device)
        .lane(Lane::HostToDevice)
        .mutates(&[&probe])
        .run(|_| Ok(()));
    match pushed {
        Ok(op) => op.wait().map(|()| true),
        Err(Error::Stream(_)) => Ok(false),
        Err(e) => Err(e),
    }
}
