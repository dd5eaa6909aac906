//! [`Backend::Nccl`](super::Backend::Nccl): an all-reduce summed by NCCL
//! (the `cuda` feature, through cudarc's `nccl` module, loaded at run
//! time), for groups whose devices are all CUDA devices.
//!
//! # One op for all the devices, not one per device
//!
//! NCCL's collectives block until every rank has issued its call: from one
//! thread, the `n` calls of a single-process all-reduce must be issued
//! between `ncclGroupStart` and `ncclGroupEnd`, or the first call waits for
//! the others forever. One op per device, on each device's launcher, would
//! need all `n` launchers inside their bodies at once, which nothing in the
//! engine promises (a launcher busy with a long op, a device whose
//! gradient failed and whose op is skipped: the others wait for ever).
//! So a bucket's reduction is **one** op that mutates every device's
//! segments: its body issues the `n` grouped calls, each on its device's
//! stream, from one thread, and they all launch together or not at all.
//!
//! # A host op, awaiting the devices
//!
//! The group's gradients are `Vec<f32>` in host memory (the model of the
//! module docs), so the sum goes through device memory: per device a
//! pinned host buffer and a device buffer, allocated once. The op runs on
//! the engine's default device (a host executor) with an asynchronous body:
//!
//! 1. the engine grants it once every device's ops that write the segments
//!    are done (a host op waits, parked, for the fences on its variables);
//! 2. the body packs each device's segments into its pinned buffer, and,
//!    under the communicators' lock, enqueues on each device's NCCL stream a
//!    copy to the device, the grouped `ncclAllReduce` (in place, sum) and a
//!    copy back, then a stream callback (`cuStreamAddCallback`, which,
//!    unlike `cuLaunchHostFunc`, is called on an error of the context too,
//!    with the error) that counts the device in;
//! 3. the body awaits: no thread blocks. The last device's callback wakes
//!    it; it checks for errors (the communicators aborted or NCCL's
//!    asynchronous ones, the callbacks' statuses, the copies') and unpacks
//!    the sums into every device's segments.
//!
//! # Errors: abort first
//!
//! Meanwhile the communicators' keeper thread polls NCCL's asynchronous
//! errors and the streams (`nccl/keeper.rs`). On any NCCL error (a failed
//! call while issuing, an asynchronous error, a stream that failed) every
//! communicator of the set is aborted (`ncclCommAbort`) **before** any
//! stream is synchronised: a rank's kernel may wait forever for a peer
//! whose part never ran, and only the abort makes it quit. The callbacks
//! then come, the body fails with the rank and NCCL's message, and every
//! later all-reduce on the set fails so; the next one made over the same
//! GPUs gets new communicators. The error paths and a drop while the
//! devices work wait the same way (polling, never a blocking synchronise
//! on live communicators). The last all-reduce over a set lets the keeper
//! end it (a grouped `ncclCommFinalize`, then `ncclCommDestroy` on each):
//! its drop calls neither NCCL nor CUDA, wherever it runs.
//!
//! Why not a stream op on one device, completed by its event: the ops
//! behind it on that device (the update, which reads the gradient in its
//! body) would be enqueued, and their bodies run on the host, before the
//! copy back landed. A host op's outputs are done when it ends, for every
//! device alike.
//!
//! # Who owns what
//!
//! - [`Comms`]: per device, a context handle of its own (the device's
//!   primary context, cudarc's event tracking off), a stream, and a
//!   communicator (`ncclCommInitAll`, once). Shared by every all-reduce
//!   over the same CUDA devices in the process (a weak cache), so a group's
//!   buckets share one communicator set; its lock is held while one body
//!   issues, so every device's stream gets the collectives in the same
//!   order (NCCL's rule; two orders deadlock the kernels).
//! - [`Staging`]: one all-reduce's pinned and device buffers. Taken by the
//!   running op (the ops of one all-reduce mutate the same segments, so they
//!   run one at a time) and put back at its end; an op dropped while the
//!   devices work waits for its streams before the buffers are reused or
//!   freed.
//!
//! The sum's order is NCCL's (its ring or tree, by size and topology), not
//! [`serial_sum`](super::serial_sum)'s: the same bits on every device, but
//! not those of [`Backend::Ring`](super::Backend::Ring) unless the sums are
//! exact.
//!
//! Refused (as [`Error::Parallel`], before anything is pushed): a device
//! that is not a CUDA device, two devices on one GPU (NCCL wants one rank
//! per GPU), a process where the NCCL library cannot be loaded (probed
//! first: cudarc's loader panics on a missing library or symbol).
//!
//! Never run on a GPU where it was written (no GPU was lent): the GPU test
//! (`tests/nccl.rs`) skips, saying so, where there is no CUDA device.
//!
//! # Files
//!
//! - here: the plan of one all-reduce ([`Nccl`]) and the op it pushes;
//! - `probe.rs`: the library and the devices, checked before NCCL is
//!   called;
//! - `comms.rs`: the communicators of a set of GPUs, issuing on them, the
//!   stream callback;
//! - `set.rs`: a set's state (live, aborted) and the order of its calls on
//!   an error and at its end (abort before synchronise; finalize, grouped,
//!   before destroy), over a trait the tests fake;
//! - `keeper.rs`: the thread per set that watches the work in flight and
//!   ends the set;
//! - `staging.rs`: one all-reduce's pinned and device buffers;
//! - `driver.rs`: the driver's and NCCL's error messages, the thread's
//!   context kept.

// `unsafe`: only in the files below (NCCL calls, pinned memory, a stream
// callback's argument passed through the driver); none here.

mod comms;
mod driver;
mod keeper;
mod probe;
mod set;
mod staging;

use std::ops::Range;
use std::sync::{Arc, Mutex, PoisonError};

use cudarc::driver::DriverError;

pub(super) use self::comms::Comms;
pub(super) use self::driver::{KeepContext, driver_message};
pub(super) use self::probe::ordinals;
use self::staging::{Held, Slot, Staging};
use crate::dep::{Device, Var, VarKey};
use crate::engine::Engine;
use crate::error::{BoxError, Error};

type Key = VarKey<Vec<f32>>;

/// Each of a device's segments `keys` (of `lens`), numbered, with its span
/// in the device's pinned buffer, where they lie one after the other.
fn packed<'a, K: Copy>(
    keys: &'a [K],
    lens: &'a [usize],
) -> impl Iterator<Item = (usize, K, Range<usize>)> + 'a {
    let spans = lens.iter().scan(0, |at, &len| {
        *at += len;
        Some(*at - len..*at)
    });
    keys.iter()
        .zip(spans)
        .enumerate()
        .map(|(i, (&k, span))| (i, k, span))
}

/// [`Backend::Nccl`](super::Backend::Nccl)'s plan for one all-reduce.
pub(super) struct Nccl {
    comms: Arc<Comms>,
    slot: Slot,
}

impl std::fmt::Debug for Nccl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nccl").field("comms", &self.comms).finish()
    }
}

impl Nccl {
    /// The plan over `devices` for `len` floats: the communicators (shared),
    /// the staging (its own).
    pub(super) fn new(engine: &Engine, devices: &[Device], len: usize) -> Result<Self, Error> {
        let ordinals = ordinals(engine, devices)?;
        let _keep = KeepContext::new();
        let comms = Comms::get(&ordinals)?;
        let staging = Staging::new(&comms, len).map_err(|m| {
            Error::Parallel(format!(
                "Backend::Nccl: allocating {len} floats per device: {m}"
            ))
        })?;
        Ok(Self {
            comms,
            slot: Arc::new(Mutex::new(Some(staging))),
        })
    }

    /// Pushes the one op summing `segments` (per device, their variables
    /// and keys, of `lens`) at `priority` (module docs).
    pub(super) fn push(
        &self,
        engine: &Engine,
        segments: &[Vec<Var<Vec<f32>>>],
        keys: &[Arc<[Key]>],
        lens: &Arc<[usize]>,
        priority: i32,
    ) -> Result<(), Error> {
        let mut op = engine.op().name("allreduce nccl").priority(priority);
        for s in segments.iter().flatten() {
            op = op.mutates(&[s]);
        }
        let (comms, slot) = (self.comms.clone(), self.slot.clone());
        let (keys, lens): (Vec<Arc<[Key]>>, _) = (keys.to_vec(), lens.clone());
        op.run_async(move |ctx| async move {
            let fail = |m: String| -> BoxError { Box::new(Error::Parallel(m)) };
            let staging = slot.lock().unwrap_or_else(PoisonError::into_inner).take();
            let mut held = Held {
                slot,
                comms,
                staging: Some(staging.ok_or_else(|| fail("the staging is in use".into()))?),
                in_flight: false,
            };
            let staging = held.staging.as_mut().expect("just put");
            let keep = KeepContext::new();
            for (d, keys) in keys.iter().enumerate() {
                let host = staging.0[d]
                    .host
                    .as_mut_slice()
                    .map_err(|e| fail(driver_message(e)))?;
                for (i, k, span) in packed(keys, &lens) {
                    let src = ctx.read(k)?;
                    super::allreduce::check(i, src.len(), span.len())?;
                    host[span].copy_from_slice(&src);
                }
            }
            drop(keep);
            let arrivals = held.comms.issue(staging).map_err(fail)?;
            held.in_flight = true;
            // Woken by the last stream callback. Meanwhile the keeper polls
            // NCCL's asynchronous errors and the streams: on an error it
            // aborts the communicators, whose kernels then quit, and the
            // callbacks come.
            let failed = std::future::poll_fn(|cx| arrivals.poll_arrived(cx)).await;
            held.in_flight = false;
            if let Some(m) = held.comms.failure() {
                return Err(fail(format!("NCCL: {m}")));
            }
            if let Some(e) = failed {
                return Err(fail(format!("CUDA: {}", driver_message(DriverError(e)))));
            }
            let staging = held.staging.as_mut().expect("held until the drop");
            let _keep = KeepContext::new();
            for (d, keys) in keys.iter().enumerate() {
                // Done already (the callback ran after the copy back):
                // this reports the copy's error, if any.
                let host = staging.0[d]
                    .host
                    .as_slice()
                    .map_err(|e| fail(driver_message(e)))?;
                for (_, k, span) in packed(keys, &lens) {
                    ctx.write(k)?.copy_from_slice(&host[span]);
                }
            }
            Ok(())
        })?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_are_packed_one_after_the_other() {
        let got: Vec<_> = packed(&['a', 'b', 'c', 'd'], &[2, 0, 3, 1]).collect();
        let want = [
            (0, 'a', 0..2),
            (1, 'b', 2..2),
            (2, 'c', 2..5),
            (3, 'd', 5..6),
        ];
        assert_eq!(got, want);
    }
}
