//! Stream devices, op-agnostic: backends (simulated, CUDA) with their
//! streams and pooled events, the [`Stream`] an op's body enqueues on, the
//! poller that completes fences when their events are reached (and runs
//! the ops' completions), the simulated device's memory, recorded graphs'
//! device memory (`arena`: taken and freed in stream order), and the device's
//! threads with their bounded shutdown.
//!
//! How an op runs on a stream device (enqueue, record its fence, hand its
//! variables on, complete with the event) is the dependency layer's
//! (`dep::stream_op`); the user-facing story is in the `stream` module's docs
//! (lib.rs). This layer knows no op: the poller completes `core::fence`
//! fences with the failures the dependency layer hands it. The MPI
//! communicator (`comm`, the `mpi` feature) is one more backend here: its
//! own progress thread completes collectives, whose ops await them.
//!
//! May import: `crate::loom`, `crate::core`, `crate::error`.

mod arena;
mod backend;
mod capture;
#[cfg(feature = "mpi")]
pub(crate) mod comm;
pub(crate) mod context;
#[cfg(feature = "cuda")]
mod cuda;
#[cfg(feature = "cuda")]
mod driver;
mod memory;
pub(crate) mod poller;
pub(crate) mod sim;

pub(crate) use self::arena::DeviceMemory;
pub use self::arena::DeviceSlice;
pub use self::memory::{SimMemory, SimView};

use std::cell::Cell;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use self::backend::Gpu;
pub(crate) use self::backend::{Backend, Event};
pub(crate) use self::capture::CapturedGraph;
#[cfg(feature = "cuda")]
pub(crate) use self::driver::mapped as mapped_libraries;
use self::poller::Poller;
use crate::error::{Error, OpFailure, VarId};

/// One op's work on a stream (see `core::fence`).
pub(crate) type Fence = crate::core::fence::Fence<Event, FenceFailure>;
/// The device work a variable waits for.
pub(crate) type VarFences = crate::core::fence::VarFences<Event, FenceFailure>;

/// How an op's work on a stream failed (a [`Fence`]'s failure).
#[derive(Clone, Debug)]
pub(crate) enum FenceFailure {
    /// The op's own failure: its body's, its device work's.
    Own(Arc<OpFailure>),
    /// The work ran behind failed device work that wrote `input` (a variable
    /// the op touches): that work's failure, `cause`, passed on. The fence
    /// completed as inherited.
    Inherited { input: VarId, cause: Arc<OpFailure> },
}

impl FenceFailure {
    /// The original failure, whoever's it is.
    pub(crate) fn into_cause(self) -> Arc<OpFailure> {
        match self {
            FenceFailure::Own(cause) | FenceFailure::Inherited { cause, .. } => cause,
        }
    }
}

crate::loom::thread::thread_local! {
    /// The calling thread does a device's work (see [`DeviceThread`]).
    static DEVICE_THREAD: Cell<bool> = const { Cell::new(false) };
}

/// Whether the calling thread does a stream device's work: one of its
/// stream threads or its poller, or a host function it runs. Waiting there
/// for the engine's ops could wait for this very thread.
pub(crate) fn on_device_thread() -> bool {
    DEVICE_THREAD.try_with(Cell::get).unwrap_or(false)
}

/// Marks the calling thread as doing a device's work until dropped.
pub(crate) struct DeviceThread(bool);

impl DeviceThread {
    pub(crate) fn enter() -> Self {
        DeviceThread(DEVICE_THREAD.with(|d| d.replace(true)))
    }
}

impl Drop for DeviceThread {
    fn drop(&mut self) {
        DEVICE_THREAD.with(|d| d.set(self.0));
    }
}

/// Lanes a stream device may have in all (compute plus the two copy lanes).
pub(crate) const MAX_LANES: usize = 31;

/// How long a stream device's shutdown waits for its threads and streams
/// to finish what they hold (nothing, after the engine drained, unless an
/// op was dropped mid-work or a kernel hangs); then it leaves them.
pub(crate) const SHUTDOWN_DEADLINE: Duration = Duration::from_secs(10);

/// Threads a device started, and how many of them are still running: each
/// holds an [`Exiting`] that counts it out when it returns.
#[derive(Default)]
pub(crate) struct Threads {
    handles: crate::loom::sync::Mutex<Vec<JoinHandle<()>>>,
    running: crate::loom::sync::Mutex<usize>,
    exited: crate::loom::sync::Condvar,
}

/// Held by a device thread; counts it out when dropped (as it returns).
pub(crate) struct Exiting(Arc<Threads>);

impl Drop for Exiting {
    fn drop(&mut self) {
        *self.0.running.lock() -= 1;
        self.0.exited.notify_all();
    }
}

impl Threads {
    /// Spawns a device thread named `name` running `f`.
    pub(crate) fn spawn(
        self: &Arc<Self>,
        name: String,
        f: impl FnOnce() + Send + 'static,
    ) -> std::io::Result<()> {
        *self.running.lock() += 1;
        let exiting = Exiting(self.clone());
        let t = std::thread::Builder::new().name(name).spawn(move || {
            let _exiting = exiting;
            f();
        })?;
        self.handles.lock().push(t);
        Ok(())
    }

    /// Joins the threads once they all returned, waiting until `deadline`
    /// at most (and not at all from a device's own thread, which may be one
    /// of them); threads still running then are left to finish on their own.
    pub(crate) fn join(&self, deadline: Option<Instant>) {
        let handles = std::mem::take(&mut *self.handles.lock());
        let mut running = self.running.lock();
        while *running > 0 {
            let Some(left) = deadline
                .filter(|_| !on_device_thread())
                .and_then(|d| d.checked_duration_since(Instant::now()))
                .filter(|left| !left.is_zero())
            else {
                return; // dropping `handles` detaches them
            };
            running = self.exited.wait_timeout(running, left).0;
        }
        drop(running);
        for t in handles {
            let _ = t.join();
        }
    }
}

/// Which stream of a stream device an op's work goes to
/// ([`OpBuilder::lane`](crate::OpBuilder::lane)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Lane {
    /// Compute stream `i` (`Compute(0)` by default).
    Compute(u8),
    /// The host-to-device copy stream.
    HostToDevice,
    /// The device-to-host copy stream.
    DeviceToHost,
}

impl Default for Lane {
    /// `Compute(0)`.
    fn default() -> Self {
        Lane::Compute(0)
    }
}

impl Lane {
    /// The lane's index on a device with `compute` compute streams.
    pub(crate) fn index(self, compute: usize) -> Option<u8> {
        let i = match self {
            Lane::Compute(i) if usize::from(i) < compute => usize::from(i),
            Lane::Compute(_) => return None,
            Lane::HostToDevice => compute,
            Lane::DeviceToHost => compute + 1,
        };
        Some(i as u8)
    }

    fn from_index(i: u8, compute: usize) -> Lane {
        match usize::from(i) {
            i if i < compute => Lane::Compute(i as u8),
            i if i == compute => Lane::HostToDevice,
            _ => Lane::DeviceToHost,
        }
    }
}

/// How many CUDA devices this machine has: 0 without the `cuda` feature,
/// without a driver, or if the driver reports an error. Never panics.
/// [`cuda_devices`] says why there is none.
///
/// ```
/// if depflow::stream::cuda_device_count() == 0 {
///     println!("no GPU: running on CPU devices");
/// }
/// ```
pub fn cuda_device_count() -> usize {
    cuda_devices().unwrap_or(0)
}

/// How many CUDA devices this machine has (at least 1), or why it has
/// none. Never panics.
///
/// # Errors
///
/// [`Error::Stream`] saying why there is no device: built without the
/// `cuda` feature; no driver library (naming every file name tried); the
/// driver failed to start or to count its devices, with the driver's
/// error by name and number (`CUDA_ERROR_STUB_LIBRARY (34)`: a stub
/// `libcuda.so` was opened instead of the driver;
/// `CUDA_ERROR_SYSTEM_DRIVER_MISMATCH (803)`: a forward-compatibility
/// library the driver refuses; codes newer than the CUDA 12.6 API the crate
/// is built for are named too) and the library file opened; or no device
/// visible (`CUDA_VISIBLE_DEVICES`, MIG).
///
/// ```
/// match depflow::stream::cuda_devices() {
///     Ok(n) => println!("{n} CUDA device(s)"),
///     Err(why) => println!("running on CPU devices: {why}"),
/// }
/// ```
pub fn cuda_devices() -> Result<usize, Error> {
    #[cfg(feature = "cuda")]
    return driver::devices().map_err(Error::Stream);
    #[cfg(not(feature = "cuda"))]
    Err(Error::Stream(
        "no CUDA device: depflow was built without its `cuda` feature".into(),
    ))
}

/// The stream an op on a stream device enqueues its work on
/// ([`OpCtx::stream`](crate::OpCtx::stream)); valid during the op's body.
///
/// ```
/// use depflow::{Engine, Error, Executor};
/// use std::sync::{Arc, Mutex};
///
/// // A simulated GPU (a host thread per stream): runs anywhere.
/// let engine = Engine::builder().device("gpu", Executor::simulated_gpu(2)).build()?;
/// let gpu = engine.device("gpu").unwrap();
/// // "Device memory": the value is a handle the stream's work mutates.
/// let buf = engine.var(Arc::new(Mutex::new(0)));
/// let b = buf.key();
/// engine.op().on(gpu).mutates(&[&buf]).run(move |ctx| {
///     let mem = ctx.write(b)?.clone();
///     // Returns at once; the work runs on the stream, in order.
///     Ok(ctx.stream()?.enqueue(move || { *mem.lock().unwrap() += 41; Ok(()) })?)
/// })?;
/// // A host op waits for the device work before it runs.
/// let got = engine.push(&[&buf], &[], move |ctx| Ok(*ctx.read(b)?.lock().unwrap() + 1))?;
/// assert_eq!(got.wait()?, 42);
/// # Ok::<(), Error>(())
/// ```
pub struct Stream {
    backend: Arc<Backend>,
    lane: u8,
    fence: Arc<Fence>,
    /// Values handed to [`drop_after`](Stream::drop_after).
    deferred: crate::loom::sync::Mutex<Vec<Deferred>>,
    /// The capture this stream records into, if it is a capturing one
    /// (see `capture`).
    capture: Option<Arc<capture::Capture>>,
}

/// A value the engine drops once an op's device work is done.
pub(crate) type Deferred = Box<dyn Send>;

impl Stream {
    /// Lane `lane` of `backend`, whose host functions report to `fence`.
    pub(crate) fn new(backend: Arc<Backend>, lane: u8, fence: Arc<Fence>) -> Self {
        Self {
            backend,
            lane,
            fence,
            deferred: crate::loom::sync::Mutex::new(Vec::new()),
            capture: None,
        }
    }

    /// What the body handed to [`drop_after`](Stream::drop_after).
    pub(crate) fn take_deferred(&self) -> Vec<Deferred> {
        std::mem::take(&mut *self.deferred.lock())
    }

    /// The lane this op's work goes to.
    pub fn lane(&self) -> Lane {
        Lane::from_index(self.lane, self.backend.compute)
    }

    /// Enqueues a host function: `f` runs on a host thread after the work
    /// enqueued before it on this stream, and the stream's later work waits
    /// for it. An `Err` fails the op (its handle resolves to
    /// [`Error::Failed`] with the message once the op's work is done) and
    /// poisons what it mutates; so does a panic.
    ///
    /// # Rules
    ///
    /// A host function is part of its op's device work, and CUDA runs it
    /// on a driver thread, where it may serialise the host functions of all
    /// streams:
    ///
    /// - It must not wait for other work of the device (another stream's
    ///   host function, an event, an op of the engine): that work may be
    ///   queued behind it. Blocking waits on the engine there are refused
    ///   ([`Error::BlockingInOp`]), as inside an op's body. The simulated
    ///   device runs every stream's host functions on one thread too, so
    ///   such a wait deadlocks there as well, not only on a GPU.
    /// - On a CUDA device it must not call CUDA, and neither may the drop of
    ///   anything it captures (a `CudaSlice` captured by the closure is
    ///   freed where the closure is dropped, inside the callback): hand such
    ///   values to [`drop_after`](Self::drop_after) instead.
    ///
    /// # Errors
    ///
    /// [`Error::Stream`] if the device refused it, or while a graph is
    /// captured ([`is_capturing`](Self::is_capturing): use
    /// [`enqueue_repeatable`](Self::enqueue_repeatable)).
    pub fn enqueue(
        &self,
        f: impl FnOnce() -> Result<(), String> + Send + 'static,
    ) -> Result<(), Error> {
        self.one_shot("enqueue")?;
        self.backend
            .enqueue_host(self.lane, self.job(f))
            .map_err(Error::Stream)
    }

    /// Hands `value` to the engine, to drop once this op's device work is
    /// done, and with it every earlier use of the variables the op mutates
    /// (the op's stream waited for those before its work); on the device's
    /// poller thread, which keeps a CUDA device's context current.
    ///
    /// This is how a body replaces or drops device memory that earlier ops
    /// may still be using: those ops' work may still run on other lanes
    /// when the body runs, and a drop there would free the memory under
    /// them (a `CudaSlice` is freed on the stream it was allocated on,
    /// ordered with nothing else). A panic of the drop fails the op.
    ///
    /// ```
    /// use depflow::{Engine, Executor, Lane};
    /// use depflow::stream::SimMemory;
    ///
    /// let engine = Engine::builder().device("gpu", Executor::simulated_gpu(2)).build()?;
    /// let gpu = engine.device("gpu").unwrap();
    /// let buf = engine.var(SimMemory::new(vec![0u32; 4]));
    /// let k = buf.key();
    /// engine.op().on(gpu).lane(Lane::Compute(1)).mutates(&[&buf]).run(move |ctx| {
    ///     // A bigger buffer; an earlier op's kernel may still read the old one.
    ///     let old = std::mem::replace(&mut *ctx.write(k)?, SimMemory::new(vec![0u32; 8]));
    ///     ctx.stream()?.drop_after(old);
    ///     Ok(())
    /// })?;
    /// # Ok::<(), depflow::Error>(())
    /// ```
    ///
    /// While a graph is captured ([`is_capturing`](Self::is_capturing)),
    /// the value is kept as long as the captured graph instead: its work
    /// may use it at every launch.
    pub fn drop_after(&self, value: impl Send + 'static) {
        if let Some(value) = self.keep_captured(Box::new(value)) {
            self.deferred.lock().push(value);
        }
    }

    /// On a simulated device: enqueues `f` as the stream's own device work,
    /// a kernel's or a copy's stand-in. It runs on the stream's thread,
    /// after the work enqueued before it, concurrently with other streams'
    /// work (host functions, [`enqueue`](Self::enqueue), run one at a time
    /// instead). An `Err` or a panic fails the op as in `enqueue`.
    ///
    /// ```
    /// use depflow::{Engine, Executor, Lane};
    /// use std::sync::Arc;
    /// use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
    ///
    /// let engine = Engine::builder().device("gpu", Executor::simulated_gpu(2)).build()?;
    /// let gpu = engine.device("gpu").unwrap();
    /// let x = engine.var(Arc::new(AtomicU64::new(1)));
    /// let k = x.key();
    /// engine.op().on(gpu).lane(Lane::Compute(1)).mutates(&[&x]).run(move |ctx| {
    ///     let x = ctx.write(k)?.clone();
    ///     Ok(ctx.stream()?.simulate(move || { x.fetch_add(1, SeqCst); Ok(()) })?)
    /// })?;
    /// let got = engine.push(&[&x], &[], move |ctx| Ok(ctx.read(k)?.load(SeqCst)))?;
    /// assert_eq!(got.wait()?, 2);
    /// # Ok::<(), depflow::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Stream`] on a CUDA device (launch kernels on
    /// `Stream::cuda` there, `cuda` feature), if the device refused it, or
    /// while a graph is captured (use
    /// [`simulate_repeatable`](Self::simulate_repeatable)).
    pub fn simulate(
        &self,
        f: impl FnOnce() -> Result<(), String> + Send + 'static,
    ) -> Result<(), Error> {
        self.one_shot("simulate")?;
        self.backend
            .enqueue_work(self.lane, self.job(f))
            .map_err(Error::Stream)
    }

    /// `f` as a job for the device: marked as device work, its error or
    /// panic reported to the op's fence.
    fn job(
        &self,
        f: impl FnOnce() -> Result<(), String> + Send + 'static,
    ) -> Box<dyn FnOnce() + Send> {
        let fence = self.fence.clone();
        Box::new(move || {
            // It runs on a thread of the device's (CUDA's own, for a host
            // function on a CUDA device): marked as such, so that blocking
            // waits there are refused.
            let _device = DeviceThread::enter();
            // Caught here: a panic must not unwind into the device's thread
            // (across the FFI boundary, on CUDA).
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
                Ok(Ok(())) => {}
                Ok(Err(message)) => fence.set_fault(message),
                Err(p) => fence.set_fault(format!(
                    "host function panicked: {}",
                    crate::error::panic_message(p.as_ref())
                )),
            }
        })
    }

    /// Tests only, on a simulated device: once the lane reaches this point
    /// (after the work enqueued before), the device reports `message` the
    /// way CUDA reports an error of asynchronous work: with the next query
    /// of an event, or, if `sticky` (an illegal address, a trap), with
    /// every query from then on, running nothing more.
    ///
    /// # Errors
    ///
    /// [`Error::Stream`] on a CUDA device.
    #[doc(hidden)]
    pub fn simulate_device_error(&self, message: &str, sticky: bool) -> Result<(), Error> {
        if self.is_capturing() {
            return Err(Error::Stream(
                "a simulated device error cannot be captured".into(),
            ));
        }
        match &self.backend.gpu {
            Gpu::Sim(gpu) => {
                gpu.fault(self.lane, message.to_string(), sticky);
                Ok(())
            }
            #[cfg(feature = "cuda")]
            Gpu::Cuda(_) => Err(Error::Stream("not a simulated device".into())),
        }
    }

    /// Tests only: how many events the device has created so far (ops
    /// reuse those of finished ops).
    #[doc(hidden)]
    pub fn events_created(&self) -> usize {
        self.backend.events_created()
    }

    /// Whether this is a simulated device's stream.
    pub fn is_simulated(&self) -> bool {
        self.backend.is_simulated()
    }

    /// The CUDA stream (None on a simulated device): launch kernels and
    /// copies on it. The engine orders them with the other ops' work on the
    /// variables this op declared.
    ///
    /// # What the engine orders, and what it does not
    ///
    /// - **Only the engine orders device memory across lanes.** The
    ///   engine's context has cudarc's event tracking off: a `CudaSlice`
    ///   allocated through these streams (`alloc_zeros`, `clone_htod`)
    ///   carries no events, and using it adds no stream waits. Declare every
    ///   use through the op's variables (`reads`, `mutates`); memory no
    ///   variable covers is not ordered with other lanes' work.
    /// - A slice allocated through a `CudaContext` handle of your own
    ///   follows that handle's setting: turn tracking off there too
    ///   (`unsafe { ctx.disable_event_tracking() }`, before allocating) for
    ///   data engine ops touch. Left on, each launch with the slice adds two
    ///   stream waits and an event record, ordering only what the engine
    ///   already orders.
    /// - Pinned host memory (`PinnedHostSlice`) waits on its own event at
    ///   each copy whatever the setting, but on these streams nothing
    ///   records that event, so its `as_slice()` does not wait for a copy:
    ///   read it in a host op that declares its variable (which waits for
    ///   the copy's fence). Copies from or to pageable memory (`Vec`,
    ///   `&[T]`) block the launcher thread until done, delaying every
    ///   lane's enqueues: use pinned memory.
    /// - **Memory is freed where its `CudaSlice` is dropped**, on the stream
    ///   it was allocated on, with the dropping thread's current context
    ///   (cudarc does not make it current for the drop). The device's
    ///   launcher and poller threads keep its context current, so what the
    ///   engine drops there is freed properly: a body's values, and the
    ///   variables of stream ops, which go when their last op completes.
    ///   The value of a variable a stream op touched goes to the device's
    ///   poller wherever else its last holder goes (a host op retiring on
    ///   a worker, the last `Var` dropped on your thread), and is dropped
    ///   there soon after. A slice the engine does not drop (one your host
    ///   op's body replaces or drops, one `delete_var` hands your closure)
    ///   needs the context current where it is dropped:
    ///   `ctx.bind_to_thread()`, e.g. on a pool's workers with
    ///   [`Executor::on_thread_start`](crate::Executor::on_thread_start).
    ///   Allocate from an engine lane rather than the null stream
    ///   (`ctx.default_stream()`), which the engine's lanes do not wait for.
    /// - **Memory a body replaces or drops** (`*ctx.write(d)? =
    ///   stream.alloc_zeros(n)?`) may still be read by earlier ops' kernels
    ///   on other lanes: hand the old value to
    ///   [`drop_after`](Self::drop_after) rather than dropping it there.
    /// - A host function ([`enqueue`](Self::enqueue)) runs on a driver
    ///   thread: it must not call CUDA, nor may the drop of anything it
    ///   captures.
    #[cfg(feature = "cuda")]
    pub fn cuda(&self) -> Option<&Arc<cudarc::driver::CudaStream>> {
        match &self.backend.gpu {
            // While capturing, the capture's private stream (see `capture`).
            Gpu::Cuda(gpu) => Some(gpu.stream(self.issue_lane())),
            Gpu::Sim(_) => None,
        }
    }
}

impl fmt::Debug for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Stream")
            .field("lane", &self.lane())
            .field("simulated", &self.is_simulated())
            .finish()
    }
}

/// How a stream device is built ([`Executor`](crate::Executor)).
#[derive(Clone, Debug)]
pub(crate) enum Spec {
    Sim {
        compute: usize,
    },
    #[cfg(feature = "cuda")]
    Cuda {
        ordinal: usize,
        compute: usize,
    },
}

impl Spec {
    pub(crate) fn compute(&self) -> usize {
        match self {
            Spec::Sim { compute } => *compute,
            #[cfg(feature = "cuda")]
            Spec::Cuda { compute, .. } => *compute,
        }
    }
}

/// A stream device, as the engine keeps it: the backend and the poller that
/// completes its fences. Ops reach it on the device's launcher thread (an
/// executor the engine gives it).
pub(crate) struct StreamDevice {
    pub(crate) backend: Arc<Backend>,
    pub(crate) poller: Poller,
    /// Shut down already (it runs once: by the engine, or by the drop).
    stopped: AtomicBool,
}

impl StreamDevice {
    pub(crate) fn new(name: &str, spec: &Spec) -> Result<Self, String> {
        let compute = spec.compute();
        if compute == 0 || compute + 2 > MAX_LANES {
            return Err(format!(
                "a stream device needs 1 to {} compute streams, not {compute}",
                MAX_LANES - 2
            ));
        }
        let lanes = compute + 2;
        let wake = poller::Wake::new(name);
        let gpu = match spec {
            Spec::Sim { .. } => {
                Gpu::Sim(sim::SimGpu::new(name, lanes, wake.nudger()).map_err(|e| e.to_string())?)
            }
            #[cfg(feature = "cuda")]
            Spec::Cuda { ordinal, .. } => Gpu::Cuda(cuda::CudaGpu::new(*ordinal, lanes)?),
        };
        let backend = Arc::new(Backend::new(compute, gpu, wake.clone()));
        let poller =
            Poller::start(name, lanes, backend.clone(), wake).map_err(|e| e.to_string())?;
        Ok(Self {
            backend,
            poller,
            stopped: AtomicBool::new(false),
        })
    }

    /// The index of `lane` on this device, if it has it.
    pub(crate) fn lane(&self, lane: Lane) -> Option<u8> {
        lane.index(self.backend.compute)
    }

    /// Stops the poller once what it watches is done, then the backend's
    /// streams and threads, waiting for each until [`SHUTDOWN_DEADLINE`] at
    /// most (after the engine drained they hold nothing, unless an op was
    /// dropped mid-work or a kernel hangs): what is still running then is
    /// left to finish on its own. A dead device is not waited for (it runs
    /// nothing more). Idempotent; run by the drop too (a failed engine
    /// build drops the devices it built).
    pub(crate) fn shutdown(&self) {
        if self.stopped.swap(true, SeqCst) {
            return;
        }
        let deadline = Instant::now() + SHUTDOWN_DEADLINE;
        self.poller.shutdown(deadline);
        self.backend.shutdown(deadline);
    }
}

impl Drop for StreamDevice {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl fmt::Debug for StreamDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamDevice")
            .field("compute_lanes", &self.backend.compute)
            .field("simulated", &self.backend.is_simulated())
            .finish()
    }
}
