//! The CUDA device behind [`Executor::cuda`](crate::Executor::cuda), through
//! cudarc's driver API, loaded at run time.
//!
//! Each lane is a stream of its own (created with `cuStreamCreate`), an op's
//! fence is an event without timing (`CU_EVENT_DISABLE_TIMING`, the cheapest
//! to record and query), a cross-lane dependency is `cuStreamWaitEvent`, and
//! a host function is `cuLaunchHostFunc`.
//!
//! cudarc's own event tracking of `CudaSlice`s stays as the user set it on
//! the context: it orders what the engine already orders (harmless, it costs
//! a few event records per launch); turn it off with
//! `CudaContext::disable_event_tracking` for data that only engine ops touch.
//!
//! The only `unsafe` of the stream devices is here: probing for the driver
//! library, and passing a boxed closure through `cuLaunchHostFunc`.

// `unsafe`: CUDA driver calls; each block says why it is sound.
#![allow(unsafe_code)]

use std::sync::Arc;
use std::task::Poll;

use cudarc::driver::{CudaContext, CudaEvent, CudaStream, DriverError, result, sys};

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
        let lanes = (0..lanes)
            .map(|_| ctx.new_stream())
            .collect::<Result<_, _>>()
            .map_err(message)?;
        Ok(Self { ctx, lanes })
    }

    pub(crate) fn stream(&self, lane: u8) -> &Arc<CudaStream> {
        &self.lanes[usize::from(lane)]
    }

    pub(crate) fn new_event(&self) -> Result<CudaEvent, String> {
        self.ctx.new_event(None).map_err(message)
    }

    pub(crate) fn record(&self, lane: u8, event: &CudaEvent) -> Result<(), String> {
        event.record(self.stream(lane)).map_err(message)
    }

    pub(crate) fn wait(&self, lane: u8, event: &CudaEvent) -> Result<(), String> {
        self.stream(lane).wait(event).map_err(message)
    }

    pub(crate) fn enqueue_host(&self, lane: u8, f: Box<dyn FnOnce() + Send>) -> Result<(), String> {
        let stream = self.stream(lane);
        self.ctx.bind_to_thread().map_err(message)?;
        let arg = Box::into_raw(Box::new(f));
        // SAFETY: `call_host` takes back the box leaked here exactly once: the
        // driver calls it once if the launch succeeds; if it fails, we take it
        // back below instead. The stream is alive (owned by `self`).
        let launched = unsafe {
            result::stream::launch_host_function(stream.cu_stream(), call_host, arg.cast())
        };
        launched.map_err(|e| {
            // SAFETY: the driver refused the function, so it never calls it.
            drop(unsafe { Box::from_raw(arg) });
            message(e)
        })
    }

    /// Waits for the device to finish (the engine drained already).
    pub(crate) fn shutdown(&self) {
        for s in self.lanes.iter() {
            let _ = s.synchronize();
        }
    }
}

unsafe extern "C" fn call_host(arg: *mut std::ffi::c_void) {
    // SAFETY: `arg` is the box leaked by `enqueue_host`, passed once. The
    // function catches its own panics (see `Stream::enqueue`), so nothing
    // unwinds across this boundary.
    let f = unsafe { Box::from_raw(arg.cast::<Box<dyn FnOnce() + Send>>()) };
    f();
}

/// Whether the work before `event` is done; an error the event reports
/// (a failed kernel, say) is the work's failure.
pub(crate) fn query(event: &CudaEvent) -> Poll<Result<(), String>> {
    // The poller thread's first query makes the context current on it.
    if let Err(e) = event.context().bind_to_thread() {
        return Poll::Ready(Err(message(e)));
    }
    match event.try_is_complete() {
        Ok(true) => Poll::Ready(Ok(())),
        Ok(false) => Poll::Pending,
        Err(e) => Poll::Ready(Err(message(e))),
    }
}
