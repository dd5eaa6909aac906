//! The NCCL communicators of a set of GPUs ([`Comms`]): per device a
//! context handle, a stream and a communicator, made once by
//! `ncclCommInitAll` and shared (a weak cache) by every all-reduce over the
//! same GPUs; issuing under their lock ([`Issuing`]: the grouped
//! `ncclAllReduce`), so that every device's stream gets the collectives in
//! the same order (NCCL's rule); and the stream callback counting a device
//! in once its stream ran them ([`arrived`]).
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
use super::staging::Staging;
use crate::error::Error;

/// A communicator of NCCL's: used only under [`Comms`]'s lock, destroyed
/// once by its drop.
struct RawComm(nccl_sys::ncclComm_t);

// SAFETY: an ncclComm_t may be used from any thread, one at a time (NCCL's
// rule); `Comms` issues under its lock and destroys it in its drop.
unsafe impl Send for RawComm {}
// SAFETY: as above: every use goes through `Comms::issue` (under the lock)
// or the drop (`&mut`).
unsafe impl Sync for RawComm {}

/// One device of a [`Comms`].
pub(super) struct Rank {
    pub(super) ctx: Arc<CudaContext>,
    pub(super) stream: Arc<CudaStream>,
    comm: RawComm,
}

/// Per device: a stream and a communicator, all made by one
/// `ncclCommInitAll`; shared by the all-reduces over the same GPUs.
pub(in crate::parallel) struct Comms {
    ordinals: Vec<usize>,
    pub(super) ranks: Vec<Rank>,
    /// Held while a body issues; `Some` once an NCCL call failed (the
    /// communicators' state is then unknown: every later use fails so).
    issue: Mutex<Option<String>>,
}

impl std::fmt::Debug for Comms {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Comms")
            .field("ordinals", &self.ordinals)
            .finish()
    }
}

/// The live communicator sets of the process (weak: the last all-reduce
/// using one destroys it).
static CACHE: Mutex<Vec<Weak<Comms>>> = Mutex::new(Vec::new());

impl Comms {
    /// The communicators over `ordinals` (in that rank order): the cached
    /// ones, or new ones.
    pub(in crate::parallel) fn get(ordinals: &[usize]) -> Result<Arc<Self>, Error> {
        let mut cache = CACHE.lock().unwrap_or_else(PoisonError::into_inner);
        cache.retain(|w| w.strong_count() > 0);
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
        let mut ctxs = Vec::with_capacity(ordinals.len());
        let mut streams = Vec::with_capacity(ordinals.len());
        for &o in ordinals {
            let ctx = CudaContext::new(o).map_err(driver_message)?;
            // SAFETY: this handle's buffers (the staging) are used only on
            // its own stream, in order; turning tracking off before the
            // stream exists saves the synchronisation `new_stream` would do.
            unsafe { ctx.disable_event_tracking() };
            streams.push(ctx.new_stream().map_err(driver_message)?);
            ctxs.push(ctx);
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
        let ranks = ctxs
            .into_iter()
            .zip(streams)
            .zip(raw)
            .map(|((ctx, stream), comm)| Rank {
                ctx,
                stream,
                comm: RawComm(comm),
            })
            .collect();
        Ok(Self {
            ordinals: ordinals.to_vec(),
            ranks,
            issue: Mutex::new(None),
        })
    }

    /// The communicators, to issue on (under their lock), unless an NCCL
    /// call failed earlier.
    pub(in crate::parallel) fn lock(&self) -> Result<Issuing<'_>, String> {
        let broken = self.issue.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(m) = &*broken {
            return Err(format!("the NCCL communicators failed earlier: {m}"));
        }
        Ok(Issuing {
            comms: self,
            broken,
        })
    }

    /// Device `d`'s NCCL stream.
    pub(in crate::parallel) fn stream(&self, d: usize) -> &Arc<CudaStream> {
        &self.ranks[d].stream
    }

    /// Enqueues on every device's stream: the copy of its pinned buffer to
    /// the device, the grouped all-reduce, the copy back, and a callback
    /// counting it into the returned [`Arrivals`]. On an error, the streams
    /// are synchronised before it is returned (nothing is left running on
    /// the buffers).
    pub(super) fn issue(&self, staging: &mut Staging) -> Result<Arc<Arrivals>, String> {
        let _keep = KeepContext::new();
        let mut issuing = self.lock()?;
        let arrivals = Arc::new(Arrivals::new(self.ranks.len()));
        let issued = self.enqueue(&mut issuing, staging, &arrivals);
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

    /// Waits for every rank's stream (an error path, or a drop).
    pub(in crate::parallel) fn synchronize(&self) {
        let _keep = KeepContext::new();
        for r in &self.ranks {
            let _ = r.ctx.bind_to_thread();
            let _ = r.stream.synchronize();
        }
    }

    /// NCCL's asynchronous errors of the communicators, if any.
    pub(in crate::parallel) fn async_error(&self) -> Option<String> {
        for (i, r) in self.ranks.iter().enumerate() {
            let mut e = nccl_sys::ncclResult_t::ncclSuccess;
            // SAFETY: the comm is alive; `e` is a valid place for the answer.
            let asked = unsafe { nccl_sys::ncclCommGetAsyncError(r.comm.0, &mut e) };
            for got in [asked, e] {
                if got != nccl_sys::ncclResult_t::ncclSuccess {
                    return Some(format!("device {i}: {}", nccl_message(got)));
                }
            }
        }
        None
    }
}

impl Drop for Comms {
    fn drop(&mut self) {
        self.synchronize();
        for r in &self.ranks {
            let _ = r.ctx.bind_to_thread();
            // SAFETY: made by `ncclCommInitAll`, destroyed once, nothing
            // enqueued on it any more (synchronised above).
            let _ = unsafe { nccl::comm_destroy(r.comm.0) };
        }
    }
}

/// The communicators, locked for one thread to issue on.
pub(in crate::parallel) struct Issuing<'a> {
    comms: &'a Comms,
    broken: std::sync::MutexGuard<'a, Option<String>>,
}

impl Issuing<'_> {
    /// One in-place `ncclAllReduce` (sum) of `len` floats per rank, at
    /// `ptrs[rank]`, on each rank's stream, between `ncclGroupStart` and
    /// `ncclGroupEnd` (from one thread, the calls of all ranks must be
    /// grouped: each would wait for the others). An NCCL error marks the
    /// communicators failed: every later use fails so.
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
        if let Err(m) = &called {
            *self.broken = Some(m.clone());
        }
        called
    }

    fn grouped(&self, ptrs: &[sys::CUdeviceptr], len: usize) -> Result<(), String> {
        let error = |what: &str, e: nccl::NcclError| format!("{what}: {}", nccl_message(e.0));
        nccl::group_start().map_err(|e| error("ncclGroupStart", e))?;
        let mut called = Ok(());
        for (r, &ptr) in self.comms.ranks.iter().zip(ptrs) {
            // SAFETY: the caller's (`all_reduce`'s contract); in place, which
            // NCCL allows; the comm and the stream are the rank's.
            let r = unsafe {
                nccl::all_reduce(
                    ptr as *const std::ffi::c_void,
                    ptr as *mut std::ffi::c_void,
                    len,
                    nccl_sys::ncclDataType_t::ncclFloat32,
                    nccl_sys::ncclRedOp_t::ncclSum,
                    r.comm.0,
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
