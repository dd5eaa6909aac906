//! The NCCL communicators of a set of GPUs ([`Comms`]): per device a
//! context handle, a stream and a communicator, made once by
//! `ncclCommInitAll` and shared (a weak cache) by every all-reduce over the
//! same GPUs; issuing under their lock ([`Issuing`]: the grouped
//! `ncclAllReduce`), so that every device's stream gets the collectives in
//! the same order (NCCL's rule); and the stream callback counting a device
//! in once its stream ran them ([`arrived`]).
//!
//! Their lifecycle is `set.rs`'s, over the real calls here ([`CudaRanks`]):
//! any NCCL error aborts every communicator before a stream is
//! synchronised, waits poll NCCL's asynchronous errors, and the end is a
//! grouped finalize then the destroys. A keeper thread per set
//! (`keeper.rs`) watches the work in flight and makes that end, so that
//! the drop of the last all-reduce (on a device's launcher, perhaps) calls
//! neither NCCL nor CUDA. An aborted set is left out of the cache: the
//! next all-reduce over those GPUs makes new communicators.
//!
//! Owns the communicators, their streams and the lock; the buffers issued
//! on are the caller's ([`Staging`], or `nccl_slices.rs`'s device memory).

// `unsafe`: NCCL calls, and a stream callback's argument passed through
// the driver; each block says why it is sound.
#![allow(unsafe_code)]

use std::sync::{Arc, Mutex, PoisonError, Weak};

use cudarc::driver::{CudaContext, CudaStream, DevicePtrMut, sys};
use cudarc::nccl::{result as nccl, sys as nccl_sys};

use super::driver::{KeepContext, driver_message, nccl_message};
use super::keeper::Keeper;
use super::set::{Locked, Ranks, Set, StreamState};
use super::staging::Staging;
use crate::error::Error;

/// The NCCL functions the backend calls: all of them are probed
/// (`probe.rs`'s list) before the first call (cudarc's loader panics on a
/// missing one).
#[cfg(test)]
pub(super) const CALLED: [&str; 9] = [
    "ncclCommInitAll",
    "ncclGroupStart",
    "ncclGroupEnd",
    "ncclAllReduce",
    "ncclCommGetAsyncError",
    "ncclGetErrorString",
    "ncclCommAbort",
    "ncclCommFinalize",
    "ncclCommDestroy",
];

/// A communicator of NCCL's: used only under its [`Set`]'s lock while the
/// set is live.
struct RawComm(nccl_sys::ncclComm_t);

// SAFETY: an ncclComm_t may be used from any thread, one at a time (NCCL's
// rule); every use is under the set's lock.
unsafe impl Send for RawComm {}
// SAFETY: as above: every use goes through the set's lock.
unsafe impl Sync for RawComm {}

/// One device of a [`Comms`]: its context handle and NCCL stream.
#[derive(Clone)]
pub(super) struct Rank {
    pub(super) ctx: Arc<CudaContext>,
    pub(super) stream: Arc<CudaStream>,
}

/// The communicators of a set, with their devices, as `set.rs` calls them.
pub(super) struct CudaRanks {
    devices: Vec<Rank>,
    comms: Vec<RawComm>,
}

impl Ranks for CudaRanks {
    fn count(&self) -> usize {
        self.devices.len()
    }

    fn stream(&self, rank: usize) -> StreamState {
        let d = &self.devices[rank];
        let _ = d.ctx.bind_to_thread();
        // SAFETY: the stream is alive (the rank's).
        match unsafe { sys::cuStreamQuery(d.stream.cu_stream()) } {
            sys::CUresult::CUDA_SUCCESS => StreamState::Idle,
            sys::CUresult::CUDA_ERROR_NOT_READY => StreamState::Busy,
            e => StreamState::Failed(driver_message(cudarc::driver::DriverError(e))),
        }
    }

    fn synchronize(&self, rank: usize) {
        let d = &self.devices[rank];
        let _ = d.ctx.bind_to_thread();
        let _ = d.stream.synchronize();
    }

    unsafe fn async_error(&self, rank: usize) -> Option<String> {
        let mut e = nccl_sys::ncclResult_t::ncclSuccess;
        // SAFETY: the comm is live (the caller's); `e` is a valid place for
        // the answer.
        let asked = unsafe { nccl_sys::ncclCommGetAsyncError(self.comms[rank].0, &mut e) };
        [asked, e]
            .into_iter()
            .find(|&r| {
                !matches!(
                    r,
                    nccl_sys::ncclResult_t::ncclSuccess | nccl_sys::ncclResult_t::ncclInProgress
                )
            })
            .map(nccl_message)
    }

    unsafe fn abort(&self, rank: usize) {
        let _ = self.devices[rank].ctx.bind_to_thread();
        // SAFETY: the caller's: live, aborted once.
        let _ = unsafe { nccl::comm_abort(self.comms[rank].0) };
    }

    unsafe fn group_start(&self) -> Result<(), String> {
        nccl::group_start().map(drop).map_err(|e| nccl_message(e.0))
    }

    unsafe fn group_end(&self) -> Result<(), String> {
        nccl::group_end().map(drop).map_err(|e| nccl_message(e.0))
    }

    unsafe fn finalize(&self, rank: usize) -> Result<(), String> {
        let _ = self.devices[rank].ctx.bind_to_thread();
        // SAFETY: the caller's: live, inside a group, nothing more
        // enqueued. Called through `sys` (cudarc's `result` wraps it only
        // for some CUDA versions); the probe found the symbol.
        unsafe { nccl_sys::ncclCommFinalize(self.comms[rank].0) }
            .result()
            .map(drop)
            .map_err(|e| nccl_message(e.0))
    }

    unsafe fn destroy(&self, rank: usize) {
        let _ = self.devices[rank].ctx.bind_to_thread();
        // SAFETY: the caller's: finalised, destroyed once.
        let _ = unsafe { nccl::comm_destroy(self.comms[rank].0) };
    }
}

/// Per device: a stream and a communicator, all made by one
/// `ncclCommInitAll`; shared by the all-reduces over the same GPUs.
pub(in crate::parallel) struct Comms {
    ordinals: Vec<usize>,
    /// The devices' context handles and streams (the staging's too).
    pub(super) ranks: Vec<Rank>,
    set: Arc<Set<CudaRanks>>,
    /// Watches the work in flight; ends the set on its own thread once
    /// this is dropped (module docs).
    keeper: Keeper,
}

impl std::fmt::Debug for Comms {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Comms")
            .field("ordinals", &self.ordinals)
            .finish()
    }
}

/// The live communicator sets of the process (weak: the last all-reduce
/// using one lets its keeper end it).
static CACHE: Mutex<Vec<Weak<Comms>>> = Mutex::new(Vec::new());

impl Comms {
    /// The communicators over `ordinals` (in that rank order): the cached
    /// ones (unless aborted), or new ones.
    pub(in crate::parallel) fn get(ordinals: &[usize]) -> Result<Arc<Self>, Error> {
        let mut cache = CACHE.lock().unwrap_or_else(PoisonError::into_inner);
        cache.retain(|w| w.upgrade().is_some_and(|c| !c.set.is_aborted()));
        if let Some(c) = cache
            .iter()
            .filter_map(Weak::upgrade)
            .find(|c| c.ordinals == ordinals)
        {
            return Ok(c);
        }
        let comms = Arc::new(Self::new(ordinals).map_err(|m| {
            Error::Parallel(format!("Backend::Nccl over CUDA devices {ordinals:?}: {m}"))
        })?);
        cache.push(Arc::downgrade(&comms));
        Ok(comms)
    }

    fn new(ordinals: &[usize]) -> Result<Self, String> {
        let mut devices = Vec::with_capacity(ordinals.len());
        for &o in ordinals {
            let ctx = CudaContext::new(o).map_err(driver_message)?;
            // SAFETY: this handle's buffers (the staging) are used only on
            // its own stream, in order; turning tracking off before the
            // stream exists saves the synchronisation `new_stream` would do.
            unsafe { ctx.disable_event_tracking() };
            let stream = ctx.new_stream().map_err(driver_message)?;
            devices.push(Rank { ctx, stream });
        }
        let n = i32::try_from(ordinals.len()).map_err(|_| "too many devices".to_string())?;
        let list = ordinals
            .iter()
            .map(|&o| i32::try_from(o).map_err(|_| format!("CUDA device {o}?")))
            .collect::<Result<Vec<i32>, _>>()?;
        let mut raw = vec![std::ptr::null_mut(); ordinals.len()];
        // SAFETY: `raw` has room for `n` communicators and `list` holds `n`
        // device ordinals; `library` found the symbols.
        unsafe { nccl::comm_init_all(raw.as_mut_ptr(), n, list.as_ptr()) }
            .map_err(|e| format!("ncclCommInitAll: {}", nccl_message(e.0)))?;
        let set = Arc::new(Set::new(CudaRanks {
            devices: devices.clone(),
            comms: raw.into_iter().map(RawComm).collect(),
        }));
        let keeper = Keeper::start("nccl-keeper".into(), set.clone()).map_err(|e| {
            // No keeper to end them: ended here.
            set.close();
            format!("starting the NCCL keeper thread: {e}")
        })?;
        Ok(Self {
            ordinals: ordinals.to_vec(),
            ranks: devices,
            set,
            keeper,
        })
    }

    /// The communicators, to issue on (under their lock), unless they were
    /// aborted (an NCCL error, earlier).
    pub(in crate::parallel) fn lock(&self) -> Result<Issuing<'_>, String> {
        Ok(Issuing {
            locked: self.set.lock()?,
            keeper: &self.keeper,
        })
    }

    /// Device `d`'s NCCL stream.
    pub(in crate::parallel) fn stream(&self, d: usize) -> &Arc<CudaStream> {
        &self.ranks[d].stream
    }

    /// Enqueues on every device's stream: the copy of its pinned buffer to
    /// the device, the grouped all-reduce, the copy back, and a callback
    /// counting it into the returned [`Arrivals`]. On an error, the streams
    /// are settled before it is returned (nothing is left running on the
    /// buffers; an NCCL error aborted the communicators first).
    pub(super) fn issue(&self, staging: &mut Staging) -> Result<Arc<Arrivals>, String> {
        let _keep = KeepContext::new();
        let mut issuing = self.lock()?;
        let arrivals = Arc::new(Arrivals::new(self.ranks.len()));
        let issued = self.enqueue(&mut issuing, staging, &arrivals);
        drop(issuing);
        if issued.is_err() {
            self.synchronize();
        }
        issued.map(|()| arrivals)
    }

    /// [`issue`](Self::issue)'s calls.
    fn enqueue(
        &self,
        issuing: &mut Issuing<'_>,
        staging: &mut Staging,
        arrivals: &Arc<Arrivals>,
    ) -> Result<(), String> {
        for (r, s) in self.ranks.iter().zip(&mut staging.0) {
            r.stream
                .memcpy_htod(&s.host, &mut s.dev)
                .map_err(driver_message)?;
        }
        let ptrs: Vec<_> = self
            .ranks
            .iter()
            .zip(&mut staging.0)
            .map(|(r, s)| s.dev.device_ptr_mut(&r.stream).0)
            .collect();
        // SAFETY: each pointer is the device buffer of its rank's staging,
        // `len` floats, alive until the streams are done with it (the staging
        // is put back only then).
        unsafe { issuing.all_reduce(&ptrs, staging.len()) }?;
        for (r, s) in self.ranks.iter().zip(&mut staging.0) {
            r.stream
                .memcpy_dtoh(&s.dev, &mut s.host)
                .map_err(driver_message)?;
            let arg = Arc::into_raw(arrivals.clone()).cast_mut().cast();
            // SAFETY: `arrived` takes back the `Arc` leaked here exactly once:
            // the driver calls it once if this succeeds (on an error of the
            // stream too, with the error); if it fails, it is taken back
            // below. The stream is alive (the rank's).
            let added = unsafe {
                sys::cuStreamAddCallback(r.stream.cu_stream(), Some(arrived), arg, 0).result()
            };
            if let Err(e) = added {
                // SAFETY: the driver refused the callback: it never calls it.
                drop(unsafe { Arc::from_raw(arg.cast::<Arrivals>()) });
                return Err(driver_message(e));
            }
        }
        Ok(())
    }

    /// Waits until nothing of NCCL's runs on the streams (an error path, or
    /// a drop while the devices work): polls NCCL's asynchronous errors and
    /// the streams; on an error, aborts every communicator, then
    /// synchronises (`set.rs`). Never a blocking synchronise on live
    /// communicators, whose kernels could wait for a peer forever.
    pub(in crate::parallel) fn synchronize(&self) {
        let _keep = KeepContext::new();
        let _ = self.set.settle();
    }

    /// Why the communicators failed, if they did: aborted after an NCCL
    /// error (the keeper's, or an issue's), or an asynchronous error now
    /// (which aborts them). Names the rank and NCCL's message.
    pub(in crate::parallel) fn failure(&self) -> Option<String> {
        self.set.failure()
    }
}

/// The communicators, locked for one thread to issue on.
pub(in crate::parallel) struct Issuing<'a> {
    locked: Locked<'a, CudaRanks>,
    keeper: &'a Keeper,
}

impl Issuing<'_> {
    /// One in-place `ncclAllReduce` (sum) of `len` floats per rank, at
    /// `ptrs[rank]`, on each rank's stream, between `ncclGroupStart` and
    /// `ncclGroupEnd` (from one thread, the calls of all ranks must be
    /// grouped: each would wait for the others). An NCCL error aborts every
    /// communicator at once (a rank's kernel may have launched without its
    /// peers'): every later use fails so. On success the keeper watches
    /// the work until it is done.
    ///
    /// # Safety
    ///
    /// `ptrs[rank]` is `len` floats of device memory on that rank's GPU,
    /// alive and not used by other work until the rank's stream has run
    /// what is enqueued here.
    pub(in crate::parallel) unsafe fn all_reduce(
        &mut self,
        ptrs: &[sys::CUdeviceptr],
        len: usize,
    ) -> Result<(), String> {
        let called = self.grouped(ptrs, len);
        match &called {
            Err(m) => self.locked.fail(m.clone()),
            Ok(()) => self.keeper.nudge(),
        }
        called
    }

    fn grouped(&self, ptrs: &[sys::CUdeviceptr], len: usize) -> Result<(), String> {
        let error = |what: &str, e: nccl::NcclError| format!("{what}: {}", nccl_message(e.0));
        let ranks = self.locked.ranks();
        nccl::group_start().map_err(|e| error("ncclGroupStart", e))?;
        let mut called = Ok(());
        for ((r, comm), &ptr) in ranks.devices.iter().zip(&ranks.comms).zip(ptrs) {
            // SAFETY: the caller's (`all_reduce`'s contract); in place, which
            // NCCL allows; the comm (live: the set is locked) and the stream
            // are the rank's.
            let r = unsafe {
                nccl::all_reduce(
                    ptr as *const std::ffi::c_void,
                    ptr as *mut std::ffi::c_void,
                    len,
                    nccl_sys::ncclDataType_t::ncclFloat32,
                    nccl_sys::ncclRedOp_t::ncclSum,
                    comm.0,
                    r.stream.cu_stream() as nccl_sys::cudaStream_t,
                )
            };
            if let Err(e) = r {
                called = Err(error("ncclAllReduce", e));
                break;
            }
        }
        // Always closed, even after a failed call: an open group swallows
        // every later NCCL call of this thread.
        let ended = nccl::group_end().map_err(|e| error("ncclGroupEnd", e));
        called.and(ended.map(drop))
    }
}

/// The devices' callbacks still to come, the first error a stream
/// reported, and the body awaiting the last (`core::arrivals`).
type Arrivals = crate::core::arrivals::Arrivals<sys::CUresult>;

/// A stream callback (`cuStreamAddCallback`): counts a device in, with
/// its stream's status. Calls no CUDA (waking the body only schedules it on
/// its executor).
unsafe extern "C" fn arrived(
    _stream: sys::CUstream,
    status: sys::CUresult,
    arg: *mut std::ffi::c_void,
) {
    // SAFETY: `arg` is the `Arc` leaked by `Comms::enqueue`, passed once.
    let arrivals = unsafe { Arc::from_raw(arg.cast::<Arrivals>()) };
    // Nothing may unwind into the driver's thread.
    let failure = (status != sys::CUresult::CUDA_SUCCESS).then_some(status);
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| arrivals.arrive(failure)));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_nccl_function_called_is_probed_first() {
        for name in CALLED {
            assert!(
                super::super::probe::SYMBOLS.contains(&name),
                "{name} is called but not probed: a library without it would panic in \
                 cudarc's loader instead of being refused"
            );
        }
    }

    #[test]
    fn the_callback_counts_its_device_in_and_gives_its_arc_back() {
        let arrivals = Arc::new(Arrivals::new(2));
        let call = |status| {
            // As the driver would: the `Arc` leaked by `enqueue`.
            let arg = Arc::into_raw(arrivals.clone()).cast_mut().cast();
            // SAFETY: `arg` is a leaked `Arc<Arrivals>`, passed once.
            unsafe { arrived(std::ptr::null_mut(), status, arg) };
        };
        let waker = futures::task::noop_waker();
        let mut cx = std::task::Context::from_waker(&waker);
        call(sys::CUresult::CUDA_SUCCESS);
        assert!(arrivals.poll_arrived(&mut cx).is_pending());
        // A failed stream's callback arrives too, with its error.
        call(sys::CUresult::CUDA_ERROR_LAUNCH_FAILED);
        assert_eq!(
            arrivals.poll_arrived(&mut cx),
            std::task::Poll::Ready(Some(sys::CUresult::CUDA_ERROR_LAUNCH_FAILED))
        );
        assert_eq!(
            Arc::strong_count(&arrivals),
            1,
            "every callback gave its Arc back"
        );
    }
}
