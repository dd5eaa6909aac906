//! [`AllReduce`]: the sum of one buffer across devices, left on every
//! device, pushed as engine ops; and [`Backend`], the way it is computed.
//!
//! A buffer is a list of *segments* on each device (a bucket of gradients:
//! variables of `Vec<f32>`, the same lengths on every device), summed as
//! if concatenated. One [`push`](AllReduce::push) pushes, at one priority:
//!
//! 1. per device, a *pack* op: reads the device's segments, writes its
//!    chunks (fails, poisoning the chunks, if a segment's length changed);
//! 2. the backend's ops on the chunks (the [ring](Backend::Ring): `2 n (n -
//!    1)` ops);
//! 3. per device, an *unpack* op: writes the sum back into its segments.
//!
//! **Across ranks** (the `mpi` feature, `AllReduce::across_ranks`): the
//! same buffer on every rank of a `Communicator`,
//! summed over every rank's devices. Between the ring's reduce-scatter and
//! its all-gather, each finished chunk (the local sum of chunk `c`, on the
//! device that owns it) is summed across ranks by one MPI all-reduce,
//! pushed as a collective op, `n` of them in chunk order; the all-gather
//! then spreads the global sums to the local devices. With one local
//! device there is no ring: the packed buffer is one chunk, all-reduced.
//! Element `i` of chunk `c` is so `Σ_r s_r[i]`, where `s_r` is rank `r`'s
//! local sum in [`serial_sum`](super::serial_sum)'s order (the fold from
//! device `c` around the ring) and `Σ_r` is MPI's `MPI_SUM` across ranks:
//! the same value on every rank (the MPI standard advises implementations so;
//! with two ranks it is one commutative addition, so its order cannot
//! matter). That differs from a one-rank ring over all the devices (whose
//! fold runs over every device in one chain), so the two agree bit for
//! bit only where the sums are exact.
//!
//! All of them carry a name starting with `allreduce` (what
//! [`Overlap`](super::Overlap) counts). A failed or poisoned segment poisons
//! the sum on every device, as any failed op poisons what depends on it.
//!
//! The backend is an enum so that other ways of reducing (across processes,
//! through an MPI communicator) can be added as variants, with the same
//! pack/unpack around them. [`Backend::Nccl`] (CUDA devices, the `cuda`
//! feature) is the exception: one op per push, which packs, sums through
//! NCCL on the GPUs and unpacks (`nccl.rs`).

use std::sync::Arc;

use super::ring::Ring;
use crate::dep::{Device, Var, VarKey};
#[cfg(feature = "mpi")]
use crate::engine::Communicator;
use crate::engine::Engine;
use crate::error::Error;

/// How an [`AllReduce`] sums across devices.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Backend {
    /// In-process chunked ring: reduce-scatter then all-gather, every chunk
    /// step an op; each device receives `2 (n - 1) / n` of the buffer. The
    /// sum's order is [`serial_sum`](super::serial_sum)'s.
    #[default]
    Ring,
    /// NCCL's all-reduce on the GPUs (the `cuda` feature; every device a
    /// CUDA device, one per GPU, and the NCCL library loadable at run
    /// time): one op per push, on the engine's default device, which packs
    /// every device's segments, sums them with one grouped `ncclAllReduce`
    /// per device (in device memory, on streams of its own) and unpacks the
    /// sums, awaiting the GPUs without blocking a thread. Even over one
    /// device it goes through NCCL (a one-rank all-reduce). The sum's order
    /// is NCCL's: the same bits on every device, not
    /// [`serial_sum`](super::serial_sum)'s. Not across ranks (use
    /// [`Ring`](Self::Ring) there).
    ///
    /// Refused with [`Error::Parallel`] when building the all-reduce (for a
    /// [`Group`](super::Group): at its first step) where it cannot run. A
    /// group with [`Update::Host`](super::Update::Host) sums on the host
    /// whatever the backend, as with the ring.
    /// Written without a GPU to run it on: its GPU test skips where there is
    /// no CUDA device.
    Nccl,
}

impl Backend {
    /// [`Nccl`](Self::Nccl) where it can run (the `cuda` feature, two or
    /// more devices, all CUDA devices on distinct GPUs, the NCCL library
    /// loadable), [`Ring`](Self::Ring) otherwise. Pushes one empty op per
    /// device to find out what it is, and waits for it.
    ///
    /// ```
    /// use depflow::parallel::Backend;
    /// use depflow::{Engine, Executor};
    ///
    /// let engine = Engine::builder().device("a", Executor::pool(1)).build()?;
    /// let devices = [engine.default_device(), engine.device("a").unwrap()];
    /// assert_eq!(Backend::auto(&engine, &devices), Backend::Ring);
    /// # Ok::<(), depflow::Error>(())
    /// ```
    pub fn auto(engine: &Engine, devices: &[Device]) -> Backend {
        #[cfg(feature = "cuda")]
        if devices.len() > 1 && super::nccl::ordinals(engine, devices).is_ok() {
            return Backend::Nccl;
        }
        let _ = (engine, devices);
        Backend::Ring
    }
}

/// The plan of one backend for one buffer.
#[derive(Debug)]
enum Plan {
    /// One device: the sum is the buffer; nothing to push.
    Alone,
    Ring(Ring),
    #[cfg(feature = "cuda")]
    Nccl(super::nccl::Nccl),
}

type Key = VarKey<Vec<f32>>;

/// An all-reduce of one buffer (a list of segments per device), set up
/// once and pushed as often as wanted: each [`push`](Self::push) sums the
/// segments' current values and leaves the sum in every device's segments.
///
/// ```
/// use depflow::parallel::{AllReduce, Backend};
/// use depflow::{Engine, Executor};
///
/// let engine = Engine::builder()
///     .device("a", Executor::pool(1))
///     .device("b", Executor::pool(1))
///     .build()?;
/// let devices = [engine.device("a").unwrap(), engine.device("b").unwrap()];
/// let grads = [engine.var(vec![1.0f32, 2.0, 3.0]), engine.var(vec![10.0, 20.0, 30.0])];
/// let segments = grads.iter().map(|g| vec![g.clone()]).collect();
/// let sum = AllReduce::new(&engine, &devices, segments, &[3], Backend::Ring)?;
/// sum.push(&engine, 0)?;
/// assert_eq!(engine.get(&grads[0]).wait()?, [11.0, 22.0, 33.0]);
/// assert_eq!(engine.get(&grads[1]).wait()?, [11.0, 22.0, 33.0]);
/// # Ok::<(), depflow::Error>(())
/// ```
#[derive(Debug)]
pub struct AllReduce {
    devices: Vec<Device>,
    segments: Vec<Vec<Var<Vec<f32>>>>,
    /// Per device, its segments' keys (shared with the ops, not copied).
    keys: Vec<Arc<[Key]>>,
    /// The segments' lengths, the same on every device.
    lens: Arc<[usize]>,
    plan: Plan,
    /// The ranks the sum spans (`None`: this process only).
    #[cfg(feature = "mpi")]
    ranks: Option<Communicator>,
}

impl AllReduce {
    /// An all-reduce over `devices` (where each device's ops run: its
    /// reduction ops, pack and unpack) of `segments[d]` on device `d`, whose
    /// segments have the lengths `lens`. Allocates the backend's buffers
    /// once.
    ///
    /// # Errors
    ///
    /// [`Error::Parallel`] if there are no devices, or not one list of
    /// segments per device, or a list whose count differs from `lens`.
    pub fn new(
        engine: &Engine,
        devices: &[Device],
        segments: Vec<Vec<Var<Vec<f32>>>>,
        lens: &[usize],
        backend: Backend,
    ) -> Result<Self, Error> {
        Self::build(engine, devices, segments, lens, backend, false)
    }

    /// An all-reduce as [`new`](Self::new), summed over this process's
    /// `devices` and across the ranks of `ranks` (the `mpi` feature): the
    /// local ring's reduce-scatter, one MPI all-reduce per chunk (pushed as
    /// a [`Communicator`] collective, in chunk order), the ring's
    /// all-gather. With one local device the packed buffer is one chunk.
    ///
    /// The order of the sum: element `i` of chunk `c` is `Σ_r s_r[i]`,
    /// each rank's local sum `s_r` in [`serial_sum`](super::serial_sum)'s
    /// order, added across ranks by `MPI_SUM` (the MPI standard advises
    /// implementations to give every rank the same result; with two ranks
    /// it is one commutative addition, which cannot differ): the same bits
    /// on every rank. A one-rank ring over all the devices folds in another
    /// order, so the two agree bit for bit only where the sums are exact.
    /// Every rank must build its all-reduces with the same device count
    /// and lengths and push them in the same order (MPI's rule for
    /// collectives); [`Group`](super::Group) checks the layout at its
    /// first step.
    ///
    /// # Errors
    ///
    /// As [`new`](Self::new).
    #[cfg(feature = "mpi")]
    pub fn across_ranks(
        engine: &Engine,
        devices: &[Device],
        segments: Vec<Vec<Var<Vec<f32>>>>,
        lens: &[usize],
        backend: Backend,
        ranks: &Communicator,
    ) -> Result<Self, Error> {
        let mut reduce = Self::build(engine, devices, segments, lens, backend, true)?;
        reduce.ranks = Some(ranks.clone());
        Ok(reduce)
    }

    /// `spans_ranks`: even one device gets a (one-chunk) ring, for the
    /// collective to work on.
    fn build(
        engine: &Engine,
        devices: &[Device],
        segments: Vec<Vec<Var<Vec<f32>>>>,
        lens: &[usize],
        backend: Backend,
        spans_ranks: bool,
    ) -> Result<Self, Error> {
        if devices.is_empty() {
            return Err(Error::Parallel("an all-reduce over no devices".into()));
        }
        if segments.len() != devices.len() {
            return Err(Error::Parallel(format!(
                "{} lists of segments for {} devices",
                segments.len(),
                devices.len()
            )));
        }
        if let Some(bad) = segments.iter().position(|s| s.len() != lens.len()) {
            return Err(Error::Parallel(format!(
                "device {bad} has {} segments, the others {}",
                segments[bad].len(),
                lens.len()
            )));
        }
        let len = lens.iter().sum();
        let plan = match (backend, devices.len()) {
            (Backend::Nccl, _) => nccl_plan(engine, devices, len, spans_ranks)?,
            (_, 1) if !spans_ranks => Plan::Alone,
            (Backend::Ring, _) => Plan::Ring(Ring::new(engine, devices.to_vec(), len)),
        };
        Ok(Self {
            devices: devices.to_vec(),
            keys: segments
                .iter()
                .map(|s| s.iter().map(|v| v.key()).collect())
                .collect(),
            segments,
            lens: lens.into(),
            plan,
            #[cfg(feature = "mpi")]
            ranks: None,
        })
    }

    /// The floats summed: the segments' lengths together.
    pub fn len(&self) -> usize {
        self.lens.iter().sum()
    }

    /// Whether there is nothing to sum.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Pushes one all-reduce of the segments' current values (the ops run
    /// after the ops already pushed that write them), at `priority`.
    ///
    /// # Errors
    ///
    /// What pushing an op can return ([`Error::ShutDown`], say); some of
    /// the ops may then have been pushed. Failures of the ops themselves
    /// go to their outputs, as poison.
    pub fn push(&self, engine: &Engine, priority: i32) -> Result<(), Error> {
        self.push_tagged(engine, priority, 0)
    }

    /// [`push`](Self::push), its collectives across ranks tagged `tag`
    /// (a group's step: `CollectiveOp::tag`).
    pub(super) fn push_tagged(
        &self,
        engine: &Engine,
        priority: i32,
        tag: u64,
    ) -> Result<(), Error> {
        #[cfg(not(feature = "mpi"))]
        let _ = tag;
        let ring = match &self.plan {
            Plan::Alone => return Ok(()),
            Plan::Ring(ring) => ring,
            #[cfg(feature = "cuda")]
            Plan::Nccl(nccl) => {
                return nccl.push(engine, &self.segments, &self.keys, &self.lens, priority);
            }
        };
        for d in 0..self.devices.len() {
            self.pack(engine, ring, d, priority)?;
        }
        ring.push_phase(engine, priority, false)?;
        #[cfg(feature = "mpi")]
        if let Some(ranks) = &self.ranks {
            // The local sums, across ranks: one collective per chunk, on
            // the chunk's owner's copy, in chunk order on every rank.
            for c in 0..self.devices.len() {
                ranks
                    .all_reduce(&ring.chunks[ring.owner(c)][c])
                    .name("allreduce ranks")
                    .priority(priority)
                    .tag(tag)
                    .push()?;
            }
        }
        ring.push_phase(engine, priority, true)?;
        for d in 0..self.devices.len() {
            self.unpack(engine, ring, d, priority)?;
        }
        Ok(())
    }

    /// The variables the all-reduce keeps for itself (the backend's
    /// chunks), for [`Group::clear_poison`](super::Group::clear_poison).
    pub(super) fn own_vars(&self) -> impl Iterator<Item = &Var<Vec<f32>>> {
        let ring = match &self.plan {
            Plan::Alone => None,
            Plan::Ring(ring) => Some(ring),
            #[cfg(feature = "cuda")]
            Plan::Nccl(_) => None, // its buffers are no variables
        };
        ring.into_iter().flat_map(|r| r.chunks.iter().flatten())
    }

    /// Device `d`'s segments, concatenated, into its chunks.
    fn pack(&self, engine: &Engine, ring: &Ring, d: usize, priority: i32) -> Result<(), Error> {
        let mut op = engine
            .op()
            .name("allreduce pack")
            .priority(priority)
            .on(self.devices[d]);
        for s in &self.segments[d] {
            op = op.reads(&[s]);
        }
        for c in &ring.chunks[d] {
            op = op.mutates(&[c]);
        }
        let (segments, chunks) = (self.keys[d].clone(), chunk_keys(ring, d));
        let lens = self.lens.clone();
        op.run(move |ctx| {
            let mut chunks = chunks.iter().map(|&c| ctx.write(c));
            let mut chunk = chunks.next().transpose()?;
            let mut at = 0; // in `chunk`
            for (i, (&key, &len)) in segments.iter().zip(lens.iter()).enumerate() {
                let mut src = &ctx.read(key)?[..];
                check(i, src.len(), len)?;
                while !src.is_empty() {
                    while chunk.as_ref().is_some_and(|c| at == c.len()) {
                        (chunk, at) = (chunks.next().transpose()?, 0);
                    }
                    let dst = chunk.as_mut().expect("chunks cover the segments");
                    let n = src.len().min(dst.len() - at);
                    dst[at..at + n].copy_from_slice(&src[..n]);
                    (src, at) = (&src[n..], at + n);
                }
            }
            Ok(())
        })?;
        Ok(())
    }

    /// Device `d`'s chunks back into its segments.
    fn unpack(&self, engine: &Engine, ring: &Ring, d: usize, priority: i32) -> Result<(), Error> {
        let mut op = engine
            .op()
            .name("allreduce unpack")
            .priority(priority)
            .on(self.devices[d]);
        for c in &ring.chunks[d] {
            op = op.reads(&[c]);
        }
        for s in &self.segments[d] {
            op = op.mutates(&[s]);
        }
        let (segments, chunks) = (self.keys[d].clone(), chunk_keys(ring, d));
        let lens = self.lens.clone();
        op.run(move |ctx| {
            let mut chunks = chunks.iter().map(|&c| ctx.read(c));
            let mut chunk = chunks.next().transpose()?;
            let mut at = 0;
            for (i, (&key, &len)) in segments.iter().zip(lens.iter()).enumerate() {
                let mut dst = ctx.write(key)?;
                check(i, dst.len(), len)?;
                let mut dst = &mut dst[..];
                while !dst.is_empty() {
                    while chunk.as_ref().is_some_and(|c| at == c.len()) {
                        (chunk, at) = (chunks.next().transpose()?, 0);
                    }
                    let src = chunk.as_ref().expect("chunks cover the segments");
                    let n = dst.len().min(src.len() - at);
                    dst[..n].copy_from_slice(&src[at..at + n]);
                    (dst, at) = (&mut dst[n..], at + n);
                }
            }
            Ok(())
        })?;
        Ok(())
    }
}

/// [`Backend::Nccl`]'s plan, or why there is none.
fn nccl_plan(
    engine: &Engine,
    devices: &[Device],
    len: usize,
    spans_ranks: bool,
) -> Result<Plan, Error> {
    if spans_ranks {
        return Err(Error::Parallel(
            "Backend::Nccl sums within this process only: across ranks use Backend::Ring".into(),
        ));
    }
    #[cfg(feature = "cuda")]
    {
        if len == 0 {
            // Nothing to sum, but refused where it could not run.
            super::nccl::ordinals(engine, devices)?;
            return Ok(Plan::Alone);
        }
        Ok(Plan::Nccl(super::nccl::Nccl::new(engine, devices, len)?))
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (engine, devices, len);
        Err(Error::Parallel(
            "Backend::Nccl needs the `cuda` feature (use Backend::Ring)".into(),
        ))
    }
}

/// Device `d`'s chunk keys (the ring keeps them; an `Arc` clone).
fn chunk_keys(ring: &Ring, d: usize) -> Arc<[Key]> {
    ring.keys[d].clone()
}

/// A segment whose length is no longer the one declared fails the op.
pub(super) fn check(segment: usize, got: usize, want: usize) -> Result<(), Error> {
    if got == want {
        return Ok(());
    }
    Err(Error::Parallel(format!(
        "segment {segment} of an all-reduce holds {got} floats, not the {want} declared"
    )))
}
