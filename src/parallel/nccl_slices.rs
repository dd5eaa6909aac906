//! [`NcclAllReduce`]: the sum, by NCCL, of one buffer of device memory per
//! CUDA device (`Var<CudaSlice<f32>>`), as one stream op (the `cuda`
//! feature). For gradients that live on the GPUs; a [`Group`](super::Group)'s
//! gradients live in host memory and go through
//! [`Backend::Nccl`](super::Backend::Nccl) instead (`nccl.rs`).
//!
//! # One stream op, fenced on every device
//!
//! One [`push`](NcclAllReduce::push) is one op on the first device's
//! compute lane 0 that mutates every device's buffer (one op, not one per
//! device: NCCL's calls for all ranks are issued from one thread, grouped,
//! see `nccl.rs`). Before its body runs, the engine has put the waits for
//! the first device's earlier work on the buffers on the op's lane, and
//! waited (parked, no thread blocked) for the other devices' earlier work
//! on them. The body, on the first device's launcher:
//!
//! 1. records an event on the op's lane, and makes every device's NCCL
//!    stream wait for it (the first device's earlier work is then done
//!    before any rank starts);
//! 2. issues the grouped in-place `ncclAllReduce` (sum) on every device's
//!    NCCL stream (the communicators' streams, shared with `nccl.rs`, under
//!    their lock: every stream gets the collectives in one order);
//! 3. records an event on every NCCL stream and makes the op's lane wait
//!    for each.
//!
//! The engine then records the op's fence on its lane: it is reached once
//! every device's part of the all-reduce is done, and completes the op like
//! any stream op, through the device's poller. Later ops on the first
//! device are ordered behind it on the GPU; later ops on the others wait
//! for it as for any other device's fence.
//!
//! The buffers' cudarc event tracking is not used (the engine orders them:
//! see `Stream::cuda`'s docs): keep it off on the context they come from.
//! On an NCCL error (an asynchronous one, a failed call or stream) the
//! communicators are aborted before anything waits for their streams (see
//! `nccl.rs`): the kernels quit, so the op's fence is reached, but the
//! buffers hold no sum. A failed call fails the op; an error seen while the
//! devices work (the keeper's, or NCCL's asynchronous one) fails the next
//! push's op (a stream op's fence cannot carry it).
//! A buffer is freed where its `CudaSlice` drops, with that thread's
//! current context (cudarc's rule): keep the variables' handles until the
//! ops on them are done, so that the values drop on your thread (bind the
//! buffer's context there), not on the first device's poller.
//! Never run on a GPU where it was written (no GPU was lent).

// `unsafe`: CUDA events between the engine's lane and NCCL's streams, and
// the NCCL call's device pointers; each block says why it is sound.
#![allow(unsafe_code)]

use std::sync::Arc;

use cudarc::driver::{CudaSlice, DevicePtrMut, result, sys};

use super::nccl::{Comms, KeepContext, driver_message, ordinals};
use crate::dep::{Device, Var, VarKey};
use crate::device::Lane;
use crate::engine::Engine;
use crate::error::{BoxError, Error};

/// An all-reduce (sum) of one `f32` buffer of device memory per CUDA
/// device, by NCCL (the `cuda` feature). Set up once, pushed as often as
/// wanted.
///
/// A push is one stream op on the first device's compute lane 0 that
/// mutates every buffer: it issues the grouped in-place `ncclAllReduce` on
/// a stream of each GPU (after the first device's earlier work on the
/// buffers; the others' earlier work is waited for, parked, before), and
/// makes its lane wait for each of them, so that its fence (and with it
/// every later op on the buffers) waits for every GPU's part. No thread
/// blocks. The sum's order is NCCL's: the same bits on every device.
///
/// - The engine orders the buffers, not cudarc's events: keep event
///   tracking off on the context they come from (see
///   `Stream::cuda`'s docs, `cuda` feature).
/// - A buffer is freed where its `CudaSlice` drops, with that thread's
///   current context: keep the variables' handles until their ops are done,
///   so that the values drop on your thread.
/// - On an NCCL error the communicators are aborted (their kernels quit,
///   the buffers hold no sum): a failed call fails the op, an
///   asynchronous error fails the next push's op, and every later push
///   fails (make a new `NcclAllReduce` for new communicators).
/// - Written and built without a GPU to run it on: its GPU test
///   (`tests/nccl.rs`) skips where there is no CUDA device.
///
/// ```no_run
/// use depflow::parallel::NcclAllReduce;
/// use depflow::{Engine, Executor};
///
/// let engine = Engine::builder()
///     .device("gpu0", Executor::cuda(0, 1))
///     .device("gpu1", Executor::cuda(1, 1))
///     .build()?;
/// let devices = [engine.device("gpu0").unwrap(), engine.device("gpu1").unwrap()];
/// // One buffer of 1024 floats per GPU (filled by the GPUs' own ops).
/// let grads = (0..2)
///     .map(|d| {
///         let ctx = cudarc::driver::CudaContext::new(d).unwrap();
///         engine.var(ctx.default_stream().alloc_zeros::<f32>(1024).unwrap())
///     })
///     .collect();
/// let sum = NcclAllReduce::new(&engine, &devices, grads, 1024)?;
/// sum.push(&engine, 0)?; // ordered after the ops already pushed on the buffers
/// # Ok::<(), depflow::Error>(())
/// ```
#[derive(Debug)]
pub struct NcclAllReduce {
    devices: Vec<Device>,
    buffers: Vec<Var<CudaSlice<f32>>>,
    keys: Arc<[VarKey<CudaSlice<f32>>]>,
    len: usize,
    comms: Arc<Comms>,
}

impl NcclAllReduce {
    /// An all-reduce of `buffers[d]` (`len` floats, on device `d`'s GPU)
    /// over `devices`: CUDA devices of the engine, one per GPU. Makes (or
    /// shares) the NCCL communicators over these GPUs.
    ///
    /// # Errors
    ///
    /// [`Error::Parallel`] for no devices, a device that is not a CUDA
    /// device, two devices on one GPU, no loadable NCCL library, not one
    /// buffer per device, or NCCL failing to make the communicators.
    pub fn new(
        engine: &Engine,
        devices: &[Device],
        buffers: Vec<Var<CudaSlice<f32>>>,
        len: usize,
    ) -> Result<Self, Error> {
        if devices.is_empty() {
            return Err(Error::Parallel("an all-reduce over no devices".into()));
        }
        let ordinals = ordinals(engine, devices)?;
        if buffers.len() != devices.len() {
            return Err(Error::Parallel(format!(
                "{} buffers for {} devices",
                buffers.len(),
                devices.len()
            )));
        }
        let _keep = KeepContext::new();
        Ok(Self {
            comms: Comms::get(&ordinals)?,
            devices: devices.to_vec(),
            keys: buffers.iter().map(Var::key).collect(),
            buffers,
            len,
        })
    }

    /// The floats summed per device.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there is nothing to sum.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Pushes one all-reduce of the buffers' current values, at `priority`:
    /// one op on the first device's compute lane 0 (see the type's docs). It fails
    /// (poisoning every buffer) if a buffer's length is not the one
    /// declared, or on an NCCL or CUDA error.
    ///
    /// # Errors
    ///
    /// What pushing an op can return.
    pub fn push(&self, engine: &Engine, priority: i32) -> Result<(), Error> {
        let mut op = engine
            .op()
            .name("allreduce nccl")
            .priority(priority)
            .on(self.devices[0])
            .lane(Lane::Compute(0));
        for b in &self.buffers {
            op = op.mutates(&[b]);
        }
        let (comms, keys, len) = (self.comms.clone(), self.keys.clone(), self.len);
        op.run(move |ctx| {
            if len == 0 {
                return Ok(());
            }
            if let Some(m) = comms.failure() {
                return Err(Error::Parallel(format!("NCCL: {m}")).into());
            }
            let lane = ctx
                .stream()?
                .cuda()
                .ok_or_else(|| Error::Parallel("not a CUDA device".into()))?
                .clone();
            // The launcher keeps the engine's context current: put it back.
            let _keep = KeepContext::new();
            let mut ptrs = Vec::with_capacity(keys.len());
            for (d, &k) in keys.iter().enumerate() {
                let mut b = ctx.write(k)?;
                if b.len() != len {
                    return Err(Error::Parallel(format!(
                        "device {d}'s buffer holds {} floats, not the {len} declared",
                        b.len()
                    ))
                    .into());
                }
                // The engine orders the buffers, not cudarc's events (off).
                ptrs.push(b.device_ptr_mut(comms.stream(d)).0);
            }
            // SAFETY: each pointer is its device's buffer, `len` floats, held
            // by a variable this op mutates: nothing else uses it until the
            // op's fence, which waits for every NCCL stream (below).
            unsafe { enqueue(&comms, &lane, &ptrs, len) }.map_err(|m| {
                // Nothing may run on the buffers behind the op's back.
                comms.synchronize();
                Box::new(Error::Parallel(m)) as BoxError
            })
        })?;
        Ok(())
    }
}

/// The body's calls (module docs, 1 to 3).
///
/// # Safety
///
/// As `Issuing::all_reduce`'s (`nccl/comms.rs`), with
/// `lane` a stream of the first device's primary context.
unsafe fn enqueue(
    comms: &Comms,
    lane: &cudarc::driver::CudaStream,
    ptrs: &[sys::CUdeviceptr],
    len: usize,
) -> Result<(), String> {
    let flags = Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING);
    let mut issuing = comms.lock()?;
    // The event is made on the handle of the communicators (the same
    // primary context as the engine's); recorded on the engine's lane with
    // a raw call, as the engine does (a safe one would take the engine's
    // context's parked error, see `device/cuda.rs`).
    let start = comms
        .stream(0)
        .context()
        .new_event(flags)
        .map_err(driver_message)?;
    // SAFETY: the event and the lane are alive, of the same primary context.
    unsafe { result::event::record(start.cu_event(), lane.cu_stream()) }.map_err(driver_message)?;
    for d in 0..ptrs.len() {
        comms.stream(d).wait(&start).map_err(driver_message)?;
    }
    // SAFETY: the caller's.
    unsafe { issuing.all_reduce(ptrs, len) }?;
    for d in 0..ptrs.len() {
        let end = comms
            .stream(d)
            .record_event(flags)
            .map_err(driver_message)?;
        // SAFETY: the lane and the event are alive; a stream may wait for an
        // event of another device. The event may be destroyed (dropped here)
        // before it is reached: the driver keeps it until then.
        unsafe {
            result::stream::wait_event(
                lane.cu_stream(),
                end.cu_event(),
                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
        }
        .map_err(driver_message)?;
    }
    Ok(())
}
