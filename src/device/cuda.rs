//! The CUDA device behind [`Executor::cuda`](crate::Executor::cuda), through
//! cudarc's driver API, loaded at run time.
//!
//! Each lane is a stream of its own (`cuStreamCreate`, non-blocking), an
//! op's fence is an event without timing (`CU_EVENT_DISABLE_TIMING`, the
//! cheapest to record and query), a cross-lane dependency is
//! `cuStreamWaitEvent`, and a host function is `cuLaunchHostFunc`.
//!
//! # Raw calls, and the context current
//!
//! The engine's own calls (events, waits, queries, host functions) are the
//! driver's, not cudarc's safe wrappers: those begin with `bind_to_thread`,
//! which first returns (and clears) any error cudarc parked on the context
//! from an earlier drop (a `CudaEvent`'s or a `SyncOnDrop`'s, cudarc issue
//! #590). Such an error is not the call's: taken as the answer of an event
//! query, it would complete a fence while its work still runs. So the
//! launcher and poller threads make the context current themselves
//! (`cuCtxSetCurrent`, once, then `cuCtxGetCurrent` to check before each
//! call, as a body may have bound another context), and a query means done
//! only on `CUDA_SUCCESS`. On any other answer of a query or a record the
//! lane is synchronised before the error is reported, so that nothing that
//! depends on the fence proceeds while the work runs; if that fails too the
//! error is sticky (the context is unusable and runs nothing more): the
//! device is dead (see `Backend`).
//!
//! # cudarc's event tracking is off
//!
//! The engine's context disables cudarc's tracking of `CudaSlice`s
//! (`disable_event_tracking`, before its streams exist): slices allocated
//! through its streams carry no events, and a launch or copy with them adds
//! no stream waits and records. Only the engine orders their uses, through
//! the variables ops declare (see the `stream` module's docs for what users
//! may rely on).
//!
//! # Other threads' contexts
//!
//! The launcher and poller keep the engine's context current (`bind`).
//! Any other thread that calls in (the engine's build and shutdown on the
//! user's thread, the drop of an event, a captured graph or the device
//! anywhere) gets its own context back after the call ([`CudaGpu::scoped`]):
//! on a machine with several GPUs, building or dropping an engine must not
//! switch the user's thread to another device.
//!
//! # Host functions after a sticky error
//!
//! A host function's closure is the driver's until it calls it; a dead
//! context never does. So each one is also listed in the device's
//! [`HostJobs`], taken out by its call, and the device's death drops what
//! is still listed (with the fences, events and the backend the closures
//! hold), which would otherwise leak.
//!
//! Driver errors are told by their number (`driver::describe_code`):
//! cudarc's `CUresult` enum lacks codes of newer drivers.
//!
//! The only `unsafe` of the stream devices is here: probing for the driver
//! library, the driver calls, and passing a closure through
//! `cuLaunchHostFunc`.

// `unsafe`: CUDA driver calls; each block says why it is sound.
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::task::Poll;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaContext, CudaStream, DriverError, result, sys};

use super::backend::{SETTLE_DEADLINE, Settled};
use super::driver::describe_driver;
use super::sim::RepeatFn;
use crate::loom::sync::Mutex;

/// How many CUDA devices there are; 0 without a driver or on any error.
pub(crate) fn device_count() -> usize {
    // SAFETY: `is_culib_present` only tries to open the driver library; it is
    // what keeps the calls below from panicking where there is none.
    if !unsafe { sys::is_culib_present() } {
        return 0;
    }
    CudaContext::device_count().map_or(0, |n| usize::try_from(n).unwrap_or(0))
}

fn message(e: DriverError) -> String {
    describe_driver(&e)
}

/// A driver event of the engine's context (`CU_EVENT_DISABLE_TIMING`).
/// Destroyed by [`CudaGpu::destroy`], never by a drop.
pub(crate) struct RawEvent(sys::CUevent);

// SAFETY: a CUevent is a handle the driver lets any thread use (the driver
// API is thread-safe); the engine records, waits on and queries it only
// through `CudaGpu`, which makes the context current first.
unsafe impl Send for RawEvent {}
// SAFETY: as above; no method takes `&mut`.
unsafe impl Sync for RawEvent {}

pub(crate) struct CudaGpu {
    ctx: Arc<CudaContext>,
    /// The lanes' streams, then the capture stream (`Backend::capture_stream`).
    lanes: Box<[Arc<CudaStream>]>,
    /// Host functions the driver holds (module docs).
    jobs: Arc<HostJobs>,
}

/// A host function's closure, taken once: by the driver's call of it, or by
/// the device's death ([`CudaGpu::abandon_host_jobs`]).
struct HostJob {
    f: Mutex<Option<Box<dyn FnOnce() + Send>>>,
    /// Where it is listed until taken.
    listed: Weak<HostJobs>,
}

/// The host functions handed to the driver and not called yet, by address.
#[derive(Default)]
struct HostJobs(Mutex<HashMap<usize, Arc<HostJob>>>);

impl HostJobs {
    fn unlist(&self, job: &Arc<HostJob>) {
        self.0.lock().remove(&(Arc::as_ptr(job) as usize));
    }
}

/// The calling thread's context before the engine's was made current for a
/// call ([`CudaGpu::scoped`]): restored when dropped.
pub(crate) struct Scoped {
    before: Option<sys::CUcontext>,
    engine: sys::CUcontext,
}

impl Drop for Scoped {
    fn drop(&mut self) {
        if self.before != Some(self.engine) {
            set_back(self.before);
        }
    }
}

/// Makes `before` (the calling thread's context a moment ago; None: none)
/// current again.
fn set_back(before: Option<sys::CUcontext>) {
    // SAFETY: `before` was current on this thread a moment ago, so its
    // owner keeps it alive (setting it back is what it expects); null (none
    // was current) unbinds.
    let _ = unsafe { result::ctx::set_current(before.unwrap_or(std::ptr::null_mut())) };
}

impl CudaGpu {
    /// The device `ordinal`'s primary context, a stream for each of
    /// `lanes` and one more, the capture stream (index `lanes`: see
    /// `Backend::capture_stream`), as the simulator has. The calling thread
    /// (the user's) keeps its own context.
    pub(crate) fn new(ordinal: usize, lanes: usize) -> Result<Self, String> {
        let count = device_count();
        if ordinal >= count {
            return Err(if count == 0 {
                "no CUDA device (no driver, or no GPU)".to_string()
            } else {
                format!("no CUDA device {ordinal} (this machine has {count})")
            });
        }
        let before = result::ctx::get_current().map_err(message)?;
        // cudarc makes the context current here (and in `new_stream`).
        let made = Self::make(ordinal, lanes + 1);
        if result::ctx::get_current().ok() != Some(before) {
            set_back(before);
        }
        made
    }

    fn make(ordinal: usize, streams: usize) -> Result<Self, String> {
        let ctx = CudaContext::new(ordinal).map_err(message)?;
        // Before the streams exist: `new_stream` synchronises the context
        // while tracking is on, and the slices allocated through them would
        // carry events.
        // SAFETY: cudarc's conditions for turning tracking off are that the
        // user orders the slices' uses across streams, which is the engine's
        // job for everything declared through variables (module docs).
        unsafe { ctx.disable_event_tracking() };
        let lanes = (0..streams)
            .map(|_| ctx.new_stream())
            .collect::<Result<_, _>>()
            .map_err(message)?;
        Ok(Self {
            ctx,
            lanes,
            jobs: Arc::default(),
        })
    }

    /// Makes the engine's context current on the calling thread for as long
    /// as the guard lives, then gives the thread its own back: for calls
    /// from threads that are not the device's (module docs).
    pub(crate) fn scoped(&self) -> Result<Scoped, String> {
        let before = result::ctx::get_current().map_err(message)?;
        let engine = self.ctx.cu_ctx();
        if before != Some(engine) {
            // SAFETY: the context is alive (`self.ctx` retains it).
            unsafe { result::ctx::set_current(engine) }.map_err(message)?;
        }
        Ok(Scoped { before, engine })
    }

    pub(crate) fn stream(&self, lane: u8) -> &Arc<CudaStream> {
        &self.lanes[usize::from(lane)]
    }

    fn cu(&self, lane: u8) -> sys::CUstream {
        self.stream(lane).cu_stream()
    }

    /// Makes the engine's context current on the calling thread if it is
    /// not, without touching cudarc's parked error (module docs).
    pub(crate) fn bind(&self) -> Result<(), String> {
        let ctx = self.ctx.cu_ctx();
        match result::ctx::get_current() {
            Ok(Some(current)) if current == ctx => Ok(()),
            // SAFETY: the context is alive (`self.ctx` retains it).
            Ok(_) => unsafe { result::ctx::set_current(ctx) }.map_err(message),
            Err(e) => Err(message(e)),
        }
    }

    pub(crate) fn new_event(&self) -> Result<RawEvent, String> {
        self.bind()?;
        result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
            .map(RawEvent)
            .map_err(message)
    }

    /// Destroys an event (whose work is done: it comes from a completed
    /// fence, or was never recorded). On any thread.
    pub(crate) fn destroy(&self, event: RawEvent) {
        if let Ok(_current) = self.scoped() {
            // SAFETY: created by `new_event` on this context, destroyed once.
            let _ = unsafe { result::event::destroy(event.0) };
        }
    }

    /// Records `event` after the work enqueued on `lane` so far; on an
    /// error, waits for that work first (see [`Settled`]).
    pub(crate) fn record(&self, lane: u8, event: &RawEvent) -> Result<(), Settled> {
        let recorded = self.bind().and_then(|()| {
            // SAFETY: the event and the stream are this context's and alive.
            unsafe { result::event::record(event.0, self.cu(lane)) }.map_err(message)
        });
        recorded.map_err(|e| self.settle(lane, e))
    }

    /// Makes `lane`'s later work wait for `event`'s.
    pub(crate) fn wait(&self, lane: u8, event: &RawEvent) -> Result<(), String> {
        self.bind()?;
        // SAFETY: the stream and the event are this context's and alive.
        unsafe {
            result::stream::wait_event(
                self.cu(lane),
                event.0,
                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
        }
        .map_err(message)
    }

    /// Whether the work before `event` (recorded on `lane`) is done: only
    /// `CUDA_SUCCESS` says so. Any error but `CUDA_ERROR_NOT_READY` ends
    /// the lane's work first (see [`Settled`]).
    pub(crate) fn query(&self, lane: u8, event: &RawEvent) -> Poll<Result<(), Settled>> {
        if let Err(e) = self.bind() {
            return Poll::Ready(Err(self.settle(lane, e)));
        }
        // SAFETY: the event is this context's and alive.
        match unsafe { result::event::query(event.0) } {
            Ok(()) => Poll::Ready(Ok(())),
            Err(DriverError(sys::CUresult::CUDA_ERROR_NOT_READY)) => Poll::Pending,
            Err(e) => Poll::Ready(Err(self.settle(lane, message(e)))),
        }
    }

    /// `error` came with `lane`'s work: waits for the lane's work so far,
    /// so that it is over before anything that depends on it proceeds.
    ///
    /// Not `cuStreamSynchronize`: this runs on the launcher or the poller,
    /// and a host function on the lane may wait for that very thread (for
    /// a value the poller drops, say); the synchronise would never return.
    /// An event is recorded and polled instead, until [`SETTLE_DEADLINE`]:
    /// past it the device counts as dead (its work may still run, so
    /// nothing may proceed as if it were over).
    fn settle(&self, lane: u8, error: String) -> Settled {
        match self.drain(lane, Instant::now() + SETTLE_DEADLINE) {
            Ok(()) => Settled::Over(error),
            Err(again) => Settled::Dead(if again == error {
                error
            } else {
                format!("{error} (then, waiting for the stream: {again})")
            }),
        }
    }

    /// Waits until `lane`'s work so far is done, polling an event recorded
    /// after it, until `deadline`.
    fn drain(&self, lane: u8, deadline: Instant) -> Result<(), String> {
        self.bind()?;
        let event = self.new_event()?;
        let drained = (|| {
            // SAFETY: the event and the stream are this context's and alive.
            unsafe { result::event::record(event.0, self.cu(lane)) }.map_err(message)?;
            let mut pause = Duration::from_micros(20);
            loop {
                // SAFETY: the event is this context's and alive.
                match unsafe { result::event::query(event.0) } {
                    Ok(()) => return Ok(()),
                    Err(DriverError(sys::CUresult::CUDA_ERROR_NOT_READY)) => {}
                    Err(e) => return Err(message(e)),
                }
                if Instant::now() >= deadline {
                    return Err(format!(
                        "its work did not end within {SETTLE_DEADLINE:?}; the device is treated \
                         as dead"
                    ));
                }
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(1));
            }
        })();
        self.destroy(event);
        drained
    }

    pub(crate) fn enqueue_host(&self, lane: u8, f: Box<dyn FnOnce() + Send>) -> Result<(), String> {
        self.bind()?;
        let job = Arc::new(HostJob {
            f: Mutex::new(Some(f)),
            listed: Arc::downgrade(&self.jobs),
        });
        self.jobs
            .0
            .lock()
            .insert(Arc::as_ptr(&job) as usize, job.clone());
        let arg = Arc::into_raw(job);
        // SAFETY: `call_host` takes back the reference leaked here exactly
        // once: the driver calls it once if the launch succeeds; if it fails,
        // we take it back below instead. The stream is alive (owned by
        // `self`).
        let launched = unsafe {
            result::stream::launch_host_function(self.cu(lane), call_host, arg.cast_mut().cast())
        };
        launched.map_err(|e| {
            // SAFETY: the driver refused the function, so it never calls it.
            let job = unsafe { Arc::from_raw(arg) };
            self.jobs.unlist(&job);
            message(e)
        })
    }

    /// The device died (a sticky error): the driver calls no host function
    /// any more, so the closures still listed are dropped here, with what
    /// they hold. (The driver's reference to each, a few bytes, is lost.)
    pub(crate) fn abandon_host_jobs(&self) {
        let listed: Vec<Arc<HostJob>> = self.jobs.0.lock().drain().map(|(_, j)| j).collect();
        for job in listed {
            let f = job.f.lock().take();
            drop(f);
        }
    }

    /// Waits for the streams to finish what they hold (nothing, after the
    /// engine drained, unless an op was dropped mid-work), until `deadline`
    /// at most (None: not at all): an event recorded on each, queried, so
    /// that a hung kernel cannot hold the shutdown forever (as
    /// `cuStreamSynchronize` would).
    pub(crate) fn shutdown(&self, deadline: Option<Instant>) {
        let Some(deadline) = deadline else { return };
        // On the thread that shuts the engine down: the user's, perhaps.
        let Ok(_current) = self.scoped() else { return };
        let ends: Vec<(u8, RawEvent)> = (0..self.lanes.len() as u8)
            .filter_map(|lane| {
                let event = self.new_event().ok()?;
                match self.record(lane, &event) {
                    Ok(()) => Some((lane, event)),
                    Err(_) => {
                        self.destroy(event);
                        None
                    }
                }
            })
            .collect();
        let mut pause = Duration::from_micros(50);
        for (lane, event) in ends {
            while self.query(lane, &event).is_pending() && Instant::now() < deadline {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(10));
            }
            // Destroying an event not reached yet is allowed: the driver
            // releases it once reached.
            self.destroy(event);
        }
    }
}

/// A CUDA graph's executable, instantiated from a capture. Destroyed by
/// [`CudaGpu::destroy_exec`], never by a drop.
pub(crate) struct RawExec(sys::CUgraphExec);

// SAFETY: a CUgraphExec is a handle the driver lets any thread use; the
// engine launches and destroys it only through `CudaGpu`, which makes the
// context current first.
unsafe impl Send for RawExec {}
// SAFETY: as above; no method takes `&mut`.
unsafe impl Sync for RawExec {}

/// Capturing into a CUDA graph on the capture stream (see `device::capture`).
impl CudaGpu {
    /// Makes stream `to` wait for the work enqueued on `from` so far: a
    /// one-shot event (destroyed at once: the driver keeps it until it
    /// completes, and the wait keeps the record it saw).
    pub(crate) fn link(&self, from: u8, to: u8) -> Result<(), String> {
        let event = self.new_event()?;
        let linked = self
            .record(from, &event)
            .map_err(|s| match s {
                Settled::Over(m) | Settled::Dead(m) => m,
            })
            .and_then(|()| self.wait(to, &event));
        self.destroy(event);
        linked
    }

    /// Puts the capture stream `on` in capture mode, thread-local: calls of
    /// other threads (the poller's queries) are not affected, and no other
    /// thread enqueues on that stream.
    pub(crate) fn begin_capture(&self, on: u8) -> Result<(), String> {
        self.bind()?;
        // SAFETY: the stream is this context's and alive.
        unsafe {
            result::stream::begin_capture(
                self.cu(on),
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            )
        }
        .map_err(message)
    }

    /// Captures a host node calling `f` at each launch, on capture stream `on`.
    pub(crate) fn capture_host(&self, on: u8, f: &RepeatFn) -> Result<(), String> {
        self.bind()?;
        let arg: *const RepeatFn = f;
        // SAFETY: the stream is capturing and alive; `f` stays where it is
        // (boxed) for as long as the graph, whose `CapturedGraph` keeps it
        // and outlives every launch (each hands the device a reference
        // until its work is done); `call_repeated` only borrows it.
        unsafe {
            result::stream::launch_host_function(self.cu(on), call_repeated, arg.cast_mut().cast())
        }
        .map_err(message)
    }

    /// Ends the capture on capture stream `on`: the graph instantiated if
    /// `keep`, else destroyed (None). A graph that allocates memory it does
    /// not free is refused: its second launch would fail.
    pub(crate) fn end_capture(&self, on: u8, keep: bool) -> Result<Option<RawExec>, String> {
        self.bind()?;
        // SAFETY: the stream is this context's, alive, and capturing.
        let graph = unsafe { result::stream::end_capture(self.cu(on)) }.map_err(message)?;
        if graph.is_null() {
            return if keep {
                Err("the capture produced no graph".into())
            } else {
                Ok(None)
            };
        }
        let exec = if keep {
            Some(unfreed_allocations(graph).and_then(|()| {
                // SAFETY: `graph` was just captured and is destroyed below only.
                let exec =
                    unsafe { result::graph::instantiate(graph, sys::CUgraphInstantiate_flags(0)) };
                exec.map(RawExec).map_err(message)
            }))
        } else {
            None
        };
        // SAFETY: the graph is ours and destroyed once; the executable (if
        // any) does not depend on it.
        let _ = unsafe { result::graph::destroy(graph) };
        exec.transpose()
    }

    /// Launches `exec` on `lane`.
    pub(crate) fn launch(&self, lane: u8, exec: &RawExec) -> Result<(), String> {
        self.bind()?;
        // SAFETY: the executable and the stream are this context's and alive.
        unsafe { result::graph::launch(exec.0, self.cu(lane)) }.map_err(message)
    }

    /// Destroys an executable graph; a launch in flight finishes first
    /// (the driver frees it on completion). On any thread.
    pub(crate) fn destroy_exec(&self, exec: RawExec) {
        if let Ok(_current) = self.scoped() {
            // SAFETY: instantiated on this context, destroyed once.
            let _ = unsafe { result::graph::exec_destroy(exec.0) };
        }
    }
}

impl Drop for CudaGpu {
    fn drop(&mut self) {
        // The streams' drops (cudarc's) make the context current: on
        // whatever thread drops the device, which keeps its own.
        let _current = self.scoped();
        self.lanes = Box::default();
    }
}

/// Refuses a captured graph with more memory-allocation nodes than free
/// nodes: memory allocated inside the capture (`alloc_zeros` on the
/// capturing stream, a `cuMemAllocAsync`) and not freed inside it is still
/// allocated when the graph launches again, and that launch fails.
fn unfreed_allocations(graph: sys::CUgraph) -> Result<(), String> {
    let mut count = 0usize;
    // SAFETY: a null array asks for the count only.
    unsafe { sys::cuGraphGetNodes(graph, std::ptr::null_mut(), &mut count) }
        .result()
        .map_err(message)?;
    let mut nodes: Vec<sys::CUgraphNode> = vec![std::ptr::null_mut(); count];
    // SAFETY: `nodes` has room for `count` nodes; the driver writes at most
    // that many and says how many in `count`.
    unsafe { sys::cuGraphGetNodes(graph, nodes.as_mut_ptr(), &mut count) }
        .result()
        .map_err(message)?;
    let (mut allocs, mut frees) = (0usize, 0usize);
    for &node in &nodes[..count.min(nodes.len())] {
        let mut kind = 0u32;
        // SAFETY: the node is the graph's; the driver writes the node's type,
        // a C enum (an `unsigned int`), into `kind`, read as a number: a
        // newer driver's type unknown to cudarc's enum is no value of it.
        unsafe { sys::cuGraphNodeGetType(node, (&raw mut kind).cast()) }
            .result()
            .map_err(message)?;
        if kind == sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEM_ALLOC as u32 {
            allocs += 1;
        } else if kind == sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEM_FREE as u32 {
            frees += 1;
        }
    }
    if allocs > frees {
        return Err(format!(
            "the captured work allocates device memory it does not free ({allocs} allocations, \
             {frees} frees in the graph): the graph's next launch would fail while that memory \
             is still allocated. Allocate outside the capture (in an op pushed before the first \
             replay) or free inside the recorded bodies"
        ));
    }
    Ok(())
}

unsafe extern "C" fn call_repeated(arg: *mut std::ffi::c_void) {
    // SAFETY: `arg` points at a job the graph keeps alive (see
    // `capture_host`); it is only borrowed. The job catches its own panics,
    // so nothing unwinds across this boundary.
    let f = unsafe { &*arg.cast_const().cast::<RepeatFn>() };
    f();
}

unsafe extern "C" fn call_host(arg: *mut std::ffi::c_void) {
    // SAFETY: `arg` is the reference leaked by `enqueue_host`, passed once.
    let job = unsafe { Arc::from_raw(arg.cast_const().cast::<HostJob>()) };
    if let Some(jobs) = job.listed.upgrade() {
        jobs.unlist(&job);
    }
    // Taken already if the device died meanwhile. The function catches its
    // own panics (see `Stream::enqueue`), so nothing unwinds across this
    // boundary.
    let f = job.f.lock().take();
    if let Some(f) = f {
        f();
    }
}
