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
//!    it; it checks for errors (the callbacks' statuses, NCCL's
//!    asynchronous ones, the copies') and unpacks the sums into every
//!    device's segments.
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

// `unsafe`: NCCL calls, pinned memory, and a stream callback's argument
// passed through the driver; each block says why it is sound.
#![allow(unsafe_code)]

use std::sync::{Arc, Mutex, PoisonError, Weak};

use cudarc::driver::{
    CudaContext, CudaSlice, CudaStream, DevicePtrMut, DriverError, PinnedHostSlice, result, sys,
};
use cudarc::nccl::{result as nccl, sys as nccl_sys};

use crate::dep::{Device, Var, VarKey};
use crate::engine::Engine;
use crate::error::{BoxError, Error};

/// The NCCL symbols the backend calls (probed before the first call).
const SYMBOLS: [&str; 7] = [
    "ncclCommInitAll",
    "ncclCommDestroy",
    "ncclGroupStart",
    "ncclGroupEnd",
    "ncclAllReduce",
    "ncclCommGetAsyncError",
    "ncclGetErrorString",
];

/// Whether the NCCL library loads and has what the backend calls; why not
/// otherwise. cudarc's own loading panics on a missing library or symbol:
/// nothing of NCCL is called before this said yes.
pub(super) fn library() -> Result<(), String> {
    // SAFETY: only tries to open the library (its initialisers run, as for
    // any library loaded).
    if !unsafe { nccl_sys::is_culib_present() } {
        return Err(format!(
            "the NCCL library could not be loaded (tried {}; set LD_LIBRARY_PATH to where \
             libnccl.so.2 is)",
            cudarc::get_lib_name_candidates("nccl").join(", ")
        ));
    }
    // SAFETY: the library is present (just checked), so `culib` finds it and
    // does not panic.
    let lib = unsafe { nccl_sys::culib() };
    for name in SYMBOLS {
        // SAFETY: the symbol is only looked up, never called through this
        // (mistyped) pointer.
        if let Err(e) = unsafe { lib.get::<unsafe extern "C" fn()>(name.as_bytes()) } {
            return Err(format!("the NCCL library has no {name}: {e}"));
        }
    }
    Ok(())
}

/// What kind of device a device of the engine is.
enum Kind {
    Host,
    Simulated,
    Cuda(usize),
}

/// Device `device`'s CUDA ordinal, from the stream an (empty) op on it
/// gets; or why it has none.
fn ordinal(engine: &Engine, device: Device, i: usize) -> Result<usize, Error> {
    let probe = engine.new_var(); // an op declares a variable at least
    let kind = engine
        .op()
        .name("parallel probe")
        .on(device)
        .mutates(&[&probe])
        .run(|ctx| {
            Ok(match ctx.stream() {
                Err(_) => Kind::Host,
                Ok(s) => s
                    .cuda()
                    .map_or(Kind::Simulated, |c| Kind::Cuda(c.context().ordinal())),
            })
        })?
        .wait()?;
    let name = engine.device_name(device).unwrap_or("?");
    match kind {
        Kind::Cuda(ordinal) => Ok(ordinal),
        Kind::Host => Err(Error::Parallel(format!(
            "Backend::Nccl needs CUDA devices: device {i} (`{name}`) runs on the host (use \
             Backend::Ring)"
        ))),
        Kind::Simulated => Err(Error::Parallel(format!(
            "Backend::Nccl needs CUDA devices: device {i} (`{name}`) is a simulated GPU (use \
             Backend::Ring)"
        ))),
    }
}

/// The CUDA ordinals of `devices`, checked for NCCL: CUDA devices, one per
/// GPU, and the library loadable.
pub(super) fn ordinals(engine: &Engine, devices: &[Device]) -> Result<Vec<usize>, Error> {
    let mut ordinals = Vec::with_capacity(devices.len());
    for (i, &d) in devices.iter().enumerate() {
        let o = ordinal(engine, d, i)?;
        if let Some(j) = ordinals.iter().position(|&p| p == o) {
            return Err(Error::Parallel(format!(
                "Backend::Nccl wants one device per GPU: devices {j} and {i} are both CUDA \
                 device {o}"
            )));
        }
        ordinals.push(o);
    }
    library().map_err(|m| Error::Parallel(format!("Backend::Nccl: {m}")))?;
    Ok(ordinals)
}

/// NCCL's message for `r`.
fn nccl_message(r: nccl_sys::ncclResult_t) -> String {
    // SAFETY: `library` found the symbol; NCCL returns a static string.
    let s = unsafe { nccl_sys::ncclGetErrorString(r) };
    if s.is_null() {
        return format!("{r:?}");
    }
    // SAFETY: a non-null answer is a NUL-terminated static string.
    let s = unsafe { std::ffi::CStr::from_ptr(s) };
    format!("{r:?}: {}", s.to_string_lossy())
}

pub(super) fn driver_message(e: DriverError) -> String {
    match e.error_string() {
        Ok(s) => format!("{:?}: {}", e.0, s.to_string_lossy()),
        Err(_) => format!("{:?}", e.0),
    }
}

/// Puts back, when dropped, the context that was current on the calling
/// thread: the backend binds its devices' contexts on whatever thread runs
/// it (a pool worker, the user's thread), whose own code may rely on the one
/// it had bound (to drop a `CudaSlice`, say).
pub(super) struct KeepContext(Option<sys::CUcontext>);

impl KeepContext {
    pub(super) fn new() -> Self {
        Self(
            result::ctx::get_current()
                .ok()
                .map(|c| c.unwrap_or(std::ptr::null_mut())),
        )
    }
}

impl Drop for KeepContext {
    fn drop(&mut self) {
        if let Some(c) = self.0 {
            // SAFETY: `c` was current on this thread (or null: none was),
            // and stays retained by whoever made it current.
            let _ = unsafe { result::ctx::set_current(c) };
        }
    }
}

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
struct Rank {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    comm: RawComm,
}

/// Per device: a stream and a communicator, all made by one
/// `ncclCommInitAll`; shared by the all-reduces over the same GPUs.
pub(super) struct Comms {
    ordinals: Vec<usize>,
    ranks: Vec<Rank>,
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
    pub(super) fn get(ordinals: &[usize]) -> Result<Arc<Self>, Error> {
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
    pub(super) fn lock(&self) -> Result<Issuing<'_>, String> {
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
    pub(super) fn stream(&self, d: usize) -> &Arc<CudaStream> {
        &self.ranks[d].stream
    }

    /// Enqueues on every device's stream: the copy of its pinned buffer to
    /// the device, the grouped all-reduce, the copy back, and a callback
    /// counting it into the returned [`Arrivals`]. On an error, the streams
    /// are synchronised before it is returned (nothing is left running on
    /// the buffers).
    fn issue(&self, staging: &mut Staging) -> Result<Arc<Arrivals>, String> {
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
    pub(super) fn synchronize(&self) {
        let _keep = KeepContext::new();
        for r in &self.ranks {
            let _ = r.ctx.bind_to_thread();
            let _ = r.stream.synchronize();
        }
    }

    /// NCCL's asynchronous errors of the communicators, if any.
    pub(super) fn async_error(&self) -> Option<String> {
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
pub(super) struct Issuing<'a> {
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
    pub(super) unsafe fn all_reduce(
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

/// One device's buffers: pinned host memory and device memory of the
/// all-reduce's length, allocated through the rank's context.
struct Staged {
    ctx: Arc<CudaContext>,
    host: PinnedHostSlice<f32>,
    dev: CudaSlice<f32>,
}

impl Drop for Staged {
    fn drop(&mut self) {
        // The buffers are freed through the current context (cudarc does
        // not bind it for a drop).
        let _ = self.ctx.bind_to_thread();
    }
}

/// One all-reduce's buffers, one [`Staged`] per device.
struct Staging(Vec<Staged>);

impl Staging {
    /// The floats per device.
    fn len(&self) -> usize {
        self.0.first().map_or(0, |s| s.dev.len())
    }

    fn new(comms: &Comms, len: usize) -> Result<Self, String> {
        let mut staged = Vec::with_capacity(comms.ranks.len());
        for r in &comms.ranks {
            // SAFETY: the memory is zeroed below before any slice of it is
            // made (flags 0: cached, as the host reads it back).
            let mut host =
                unsafe { r.ctx.alloc_pinned_with_flags::<f32>(len, 0) }.map_err(driver_message)?;
            let ptr = host.as_mut_ptr().map_err(driver_message)?;
            // SAFETY: `ptr` is `len` floats of host memory just allocated,
            // unused by any stream yet.
            unsafe { std::ptr::write_bytes(ptr, 0, len) };
            let dev = r.stream.alloc_zeros::<f32>(len).map_err(driver_message)?;
            staged.push(Staged {
                ctx: r.ctx.clone(),
                host,
                dev,
            });
        }
        Ok(Self(staged))
    }
}

/// Where an all-reduce keeps its [`Staging`] between runs.
type Slot = Arc<Mutex<Option<Staging>>>;

/// A run's hold on the staging: puts it back when dropped, after waiting
/// for the streams if the devices may still use it (the op was dropped
/// while awaiting, or failed after issuing).
struct Held {
    slot: Slot,
    comms: Arc<Comms>,
    staging: Option<Staging>,
    in_flight: bool,
}

impl Drop for Held {
    fn drop(&mut self) {
        if self.in_flight {
            self.comms.synchronize();
        }
        *self.slot.lock().unwrap_or_else(PoisonError::into_inner) = self.staging.take();
    }
}

type Key = VarKey<Vec<f32>>;

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
                let mut at = 0;
                for (i, (&k, &len)) in keys.iter().zip(lens.iter()).enumerate() {
                    let src = ctx.read(k)?;
                    super::allreduce::check(i, src.len(), len)?;
                    host[at..at + len].copy_from_slice(&src);
                    at += len;
                }
            }
            drop(keep);
            let arrivals = held.comms.issue(staging).map_err(fail)?;
            held.in_flight = true;
            let failed = std::future::poll_fn(|cx| arrivals.poll_arrived(cx)).await;
            held.in_flight = false;
            if let Some(e) = failed {
                return Err(fail(format!("CUDA: {}", driver_message(DriverError(e)))));
            }
            if let Some(m) = held.comms.async_error() {
                return Err(fail(format!("NCCL: {m}")));
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
                let mut at = 0;
                for (&k, &len) in keys.iter().zip(lens.iter()) {
                    ctx.write(k)?.copy_from_slice(&host[at..at + len]);
                    at += len;
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
    fn the_library_probe_answers_without_panicking() {
        // SAFETY: only tries to open the library.
        let present = unsafe { nccl_sys::is_culib_present() };
        match library() {
            Ok(()) => assert!(present, "no library, yet the probe found one"),
            Err(m) if present => assert!(m.contains("has no nccl"), "{m}"),
            // Here (no NCCL): a message naming what was tried, not cudarc's
            // panic.
            Err(m) => assert!(
                m.contains("could not be loaded") && m.contains("libnccl"),
                "{m}"
            ),
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
