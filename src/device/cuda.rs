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
//! The only `unsafe` of the stream devices is here: probing for the driver
//! library, the driver calls, and passing a boxed closure through
//! `cuLaunchHostFunc`.

// `unsafe`: CUDA driver calls; each block says why it is sound.
#![allow(unsafe_code)]

use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaContext, CudaStream, DriverError, result, sys};

use super::backend::Settled;
use super::sim::RepeatFn;

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
    match e.error_string() {
        Ok(s) => format!("{:?}: {}", e.0, s.to_string_lossy()),
        Err(_) => format!("{:?}", e.0),
    }
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
    lanes: Box<[Arc<CudaStream>]>,
}

impl CudaGpu {
    pub(crate) fn new(ordinal: usize, lanes: usize) -> Result<Self, String> {
        let count = device_count();
        if ordinal >= count {
            return Err(if count == 0 {
                "no CUDA device (no driver, or no GPU)".to_string()
            } else {
                format!("no CUDA device {ordinal} (this machine has {count})")
            });
        }
        let ctx = CudaContext::new(ordinal).map_err(message)?;
        // Before the streams exist: `new_stream` synchronises the context
        // while tracking is on, and the slices allocated through them would
        // carry events.
        // SAFETY: cudarc's conditions for turning tracking off are that the
        // user orders the slices' uses across streams, which is the engine's
        // job for everything declared through variables (module docs).
        unsafe { ctx.disable_event_tracking() };
        let lanes = (0..lanes)
            .map(|_| ctx.new_stream())
            .collect::<Result<_, _>>()
            .map_err(message)?;
        Ok(Self { ctx, lanes })
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
    /// fence, or was never recorded).
    pub(crate) fn destroy(&self, event: RawEvent) {
        if self.bind().is_ok() {
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

    /// `error` came with `lane`'s work: synchronises the lane, so that the
    /// work is over before anything that depends on it proceeds.
    fn settle(&self, lane: u8, error: String) -> Settled {
        let synced = self.bind().and_then(|()| {
            // SAFETY: the stream is this context's and alive.
            unsafe { result::stream::synchronize(self.cu(lane)) }.map_err(message)
        });
        match synced {
            Ok(()) => Settled::Over(error),
            Err(again) => Settled::Dead(if again == error {
                error
            } else {
                format!("{error} (then, synchronising the stream: {again})")
            }),
        }
    }

    pub(crate) fn enqueue_host(&self, lane: u8, f: Box<dyn FnOnce() + Send>) -> Result<(), String> {
        self.bind()?;
        let arg = Box::into_raw(Box::new(f));
        // SAFETY: `call_host` takes back the box leaked here exactly once: the
        // driver calls it once if the launch succeeds; if it fails, we take it
        // back below instead. The stream is alive (owned by `self`).
        let launched =
            unsafe { result::stream::launch_host_function(self.cu(lane), call_host, arg.cast()) };
        launched.map_err(|e| {
            // SAFETY: the driver refused the function, so it never calls it.
            drop(unsafe { Box::from_raw(arg) });
            message(e)
        })
    }

    /// Waits for the streams to finish what they hold (nothing, after the
    /// engine drained, unless an op was dropped mid-work), until `deadline`
    /// at most (None: not at all): an event recorded on each, queried, so
    /// that a hung kernel cannot hold the shutdown forever (as
    /// `cuStreamSynchronize` would).
    pub(crate) fn shutdown(&self, deadline: Option<Instant>) {
        let Some(deadline) = deadline else { return };
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

/// Capturing a lane into a CUDA graph (see `device::capture`).
impl CudaGpu {
    /// Puts `lane`'s stream in capture mode, thread-local: calls of other
    /// threads (the poller's queries) are not affected.
    pub(crate) fn begin_capture(&self, lane: u8) -> Result<(), String> {
        self.bind()?;
        // SAFETY: the stream is this context's and alive.
        unsafe {
            result::stream::begin_capture(
                self.cu(lane),
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            )
        }
        .map_err(message)
    }

    /// Captures a host node calling `f` at each launch.
    pub(crate) fn capture_host(&self, lane: u8, f: &RepeatFn) -> Result<(), String> {
        self.bind()?;
        let arg: *const RepeatFn = f;
        // SAFETY: the stream is capturing and alive; `f` stays where it is
        // (boxed) for as long as the graph, whose `CapturedGraph` keeps it
        // and outlives every launch (each hands the device a reference
        // until its work is done); `call_repeated` only borrows it.
        unsafe {
            result::stream::launch_host_function(
                self.cu(lane),
                call_repeated,
                arg.cast_mut().cast(),
            )
        }
        .map_err(message)
    }

    /// Ends the capture on `lane`: the graph instantiated if `keep`, else
    /// destroyed (None).
    pub(crate) fn end_capture(&self, lane: u8, keep: bool) -> Result<Option<RawExec>, String> {
        self.bind()?;
        // SAFETY: the stream is this context's, alive, and capturing.
        let graph = unsafe { result::stream::end_capture(self.cu(lane)) }.map_err(message)?;
        if graph.is_null() {
            return if keep {
                Err("the capture produced no graph".into())
            } else {
                Ok(None)
            };
        }
        let exec = if keep {
            // SAFETY: `graph` was just captured and is destroyed below only.
            let exec =
                unsafe { result::graph::instantiate(graph, sys::CUgraphInstantiate_flags(0)) };
            Some(exec.map(RawExec).map_err(message))
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
    /// (the driver frees it on completion).
    pub(crate) fn destroy_exec(&self, exec: RawExec) {
        if self.bind().is_ok() {
            // SAFETY: instantiated on this context, destroyed once.
            let _ = unsafe { result::graph::exec_destroy(exec.0) };
        }
    }
}

unsafe extern "C" fn call_repeated(arg: *mut std::ffi::c_void) {
    // SAFETY: `arg` points at a job the graph keeps alive (see
    // `capture_host`); it is only borrowed. The job catches its own panics,
    // so nothing unwinds across this boundary.
    let f = unsafe { &*arg.cast_const().cast::<RepeatFn>() };
    f();
}

unsafe extern "C" fn call_host(arg: *mut std::ffi::c_void) {
    // SAFETY: `arg` is the box leaked by `enqueue_host`, passed once. The
    // function catches its own panics (see `Stream::enqueue`), so nothing
    // unwinds across this boundary.
    let f = unsafe { Box::from_raw(arg.cast::<Box<dyn FnOnce() + Send>>()) };
    f();
}
