//! Data-parallel training on the engine's devices (seed 001's
//! `parallel_do`, seed 000's multi-device case study): one model replicated
//! on several devices, each batch split across them, gradients summed
//! across devices while the backward pass still runs, every replica
//! updated alike.
//!
//! A layer above the engine (floor 6 of ARCHITECTURE.md): everything here
//! is pushed through the engine's public API, as ops with read and mutate
//! sets; the engine orders and overlaps them.
//!
//! - [`Group`] (built by [`Group::builder`]): a list of devices (CPU
//!   devices, stream devices), declared inputs, parameters.
//! - **split** ([`Group::load`]): a host batch into per-device shards, one
//!   copy op per device (on a stream device, on its host-to-device lane),
//!   into one of two slots, so that loading batch `k + 1` before stepping on
//!   batch `k` overlaps its copies with step `k`.
//! - **replicate** ([`Group::param`]): one replica per device per
//!   parameter, identically initialised, and one gradient per device.
//! - **step** ([`Group::step`]): the user's closure pushes one device's
//!   forward and backward ops, given a [`DeviceStep`]; it is called for
//!   every device. A producer under the engine's bound on ops in flight
//!   waits for room first ([`Group::when_room`]).
//! - **all-reduce** ([`AllReduce`], [`Backend`]): gradients, in buckets of
//!   consecutive small ones, are summed by a chunked ring (reduce-scatter,
//!   all-gather; every chunk step an op), pushed right behind the op that
//!   writes the bucket's last gradient
//!   ([`DeviceStep::grad_ready`]), at a priority that makes the first
//!   layer's go first. On CUDA devices, [`Backend::Nccl`] (the `cuda`
//!   feature) sums a bucket with NCCL instead: one op that issues the
//!   grouped calls on every GPU (`nccl.rs`); `NcclAllReduce` sums buffers
//!   of device memory with NCCL, as one stream op.
//! - **across ranks** (the `mpi` feature,
//!   `GroupBuilder::across_ranks`): the group spans ranks x local
//!   devices; each bucket's local reduce-scatter is followed by one MPI
//!   all-reduce per chunk (a `Communicator` collective op) and the local all-gather, so every replica of every
//!   rank holds the same sum (the order: [`AllReduce`]'s docs).
//! - **update** ([`Update`]): the optimizer on every replica (the
//!   default), or on the host once with a copy back to every replica. Both
//!   sum in [`serial_sum`]'s order: the same weights, bit for bit. The
//!   order is a bucket's: [`serial_sum`] of each device's gradients of the
//!   bucket concatenated in parameter order, which is a parameter's own
//!   [`serial_sum`] only where it is a bucket alone
//!   ([`GroupBuilder::bucket_bytes`] shows both).
//! - [`Overlap`]: how much of the all-reduce ran under compute, from a
//!   trace.
//!
//! Errors: bad input ([`Error::Parallel`](crate::Error::Parallel):
//! duplicate devices, replicas of different shapes, an empty batch, a
//! batch that does not split evenly) is refused before anything is pushed.
//! A failing op poisons as usual: a failed backward op poisons its
//! gradient, the reduction's ops skip on it and poison the sum on *every*
//! device, and so every replica's updated weights; reading them returns
//! [`Error::Poisoned`](crate::Error::Poisoned) with the original failure.
//! [`Group::clear_poison`] clears it from every variable of the group (the
//! reductions' own buffers included) so that training can go on, from the
//! weights of before the failed step's update. Not quite on a stream
//! device: there the ops behind a failed one on the same device are
//! enqueued before the failure is known (the stream model: no host round
//! trip), so their bodies, which do the group's work, still run; after a
//! clear, a stream device's replica may hold the failed step's update
//! while the others do not. Reload the weights into every replica then.
//!
//! On a stream device the group's ops (split, reduction, update) do their
//! work in the op's body on the device's launcher thread: the buffers are
//! `Vec<f32>` in host memory (a simulated GPU's model), so there is no
//! device memory to enqueue a kernel on; the ops still go to the device
//! and the split to its host-to-device lane, ordered like the device's
//! other ops.
//!
//! ```
//! use depflow::parallel::Group;
//! use depflow::{Engine, Error, Executor};
//!
//! let engine = Engine::builder()
//!     .device("cpu0", Executor::pool(1))
//!     .device("cpu1", Executor::pool(1))
//!     .build()?;
//! let devices = ["cpu0", "cpu1"].map(|d| engine.device(d).unwrap());
//! // One input of width 2; SGD on every replica.
//! let mut group = Group::builder(&engine)
//!     .devices(devices)
//!     .input(2)
//!     .optimizer(|w, g| w.iter_mut().zip(g).for_each(|(w, g)| *w -= 0.5 * g))
//!     .build()?;
//! let w = group.param(&[1.0, 1.0])?;
//! group.load(vec![vec![1.0, 2.0, 3.0, 4.0]])?; // two rows: one per device
//! group.step(|s| {
//!     // "Backward": the gradient is the sum of this device's rows.
//!     let (x, g) = (s.input(0).clone(), s.grad(w).clone());
//!     s.engine().op().name("backward").on(s.device()).reads(&[&x]).mutates(&[&g]).run({
//!         let (x, g) = (x.key(), g.key());
//!         move |ctx| {
//!             let x = ctx.read(x)?;
//!             ctx.write(g)?.copy_from_slice(&x[..2]);
//!             Ok(())
//!         }
//!     })?;
//!     s.grad_ready(w)
//! })?;
//! // Gradients summed over devices ([1, 2] + [3, 4]), then w -= 0.5 g.
//! assert_eq!(group.weights(w, 0)?, [-1.0, -2.0]);
//! assert_eq!(group.weights(w, 1)?, [-1.0, -2.0]);
//! # Ok::<(), Error>(())
//! ```

mod allreduce;
mod bucket;
mod group;
#[cfg(feature = "cuda")]
mod nccl;
#[cfg(feature = "cuda")]
mod nccl_slices;
mod overlap;
#[cfg(feature = "mpi")]
mod ranks;
mod ring;
mod split;
mod step;
mod step_room;
mod update;

pub use allreduce::{AllReduce, Backend};
pub use group::{DEFAULT_BUCKET_BYTES, Group, GroupBuilder, Param};
#[cfg(feature = "cuda")]
pub use nccl_slices::NcclAllReduce;
pub use overlap::Overlap;
pub use ring::{chunk_range, serial_sum};
pub use step::DeviceStep;
pub use step_room::StepRoom;
pub use update::Update;
