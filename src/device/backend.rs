//! The backend of a stream device: its streams and events, simulated or
//! CUDA, behind one interface (what the launcher, the poller and
//! [`Stream`](crate::stream::Stream) call).

use std::sync::Arc;
use std::task::Poll;

#[cfg(feature = "cuda")]
use super::cuda;
use super::sim;

/// A device's event: the point in a stream after an op's work.
pub(crate) enum Event {
    Sim(Arc<sim::SimEvent>),
    #[cfg(feature = "cuda")]
    Cuda(cudarc::driver::CudaEvent),
}

/// The device behind a stream device.
pub(crate) struct Backend {
    /// Compute lanes; the two copy lanes follow them.
    pub(crate) compute: usize,
    pub(crate) gpu: Gpu,
    /// Debug builds only: [`NO_LANE_WAITS`] was set, so [`wait`](Self::wait)
    /// does nothing (the engine's cross-lane ordering is broken on purpose).
    pub(crate) no_lane_waits: bool,
}

/// The environment variable that, in debug builds only, turns the engine's
/// cross-lane waits (`cuStreamWaitEvent`, or the simulated stream's wait)
/// into no-ops on the stream devices built afterwards: a check that the
/// ordering tests (`tests/streams.rs`, `tests/cuda.rs`) can fail. Release
/// builds never read it.
pub(crate) const NO_LANE_WAITS: &str = "DEPFLOW_DEBUG_NO_LANE_WAITS";

/// Whether [`NO_LANE_WAITS`] is set to `1` (never, in release builds).
pub(crate) fn no_lane_waits() -> bool {
    cfg!(debug_assertions) && std::env::var(NO_LANE_WAITS).is_ok_and(|v| v == "1")
}

pub(crate) enum Gpu {
    Sim(sim::SimGpu),
    #[cfg(feature = "cuda")]
    Cuda(cuda::CudaGpu),
}

impl Backend {
    pub(crate) fn new_event(&self) -> Result<Event, String> {
        match &self.gpu {
            Gpu::Sim(_) => Ok(Event::Sim(Arc::default())),
            #[cfg(feature = "cuda")]
            Gpu::Cuda(gpu) => gpu.new_event().map(Event::Cuda),
        }
    }

    /// Records `event` after the work enqueued on `lane` so far.
    pub(crate) fn record(&self, lane: u8, event: &Event) -> Result<(), String> {
        match (&self.gpu, event) {
            (Gpu::Sim(gpu), Event::Sim(e)) => {
                gpu.signal(lane, e.clone());
                Ok(())
            }
            #[cfg(feature = "cuda")]
            (Gpu::Cuda(gpu), Event::Cuda(e)) => gpu.record(lane, e),
            #[cfg(feature = "cuda")]
            _ => unreachable!("an event of another device"),
        }
    }

    /// Makes `lane`'s later work wait for `event` (on the device).
    pub(crate) fn wait(&self, lane: u8, event: &Event) -> Result<(), String> {
        if self.no_lane_waits {
            return Ok(());
        }
        match (&self.gpu, event) {
            (Gpu::Sim(gpu), Event::Sim(e)) => {
                gpu.wait(lane, e.clone());
                Ok(())
            }
            #[cfg(feature = "cuda")]
            (Gpu::Cuda(gpu), Event::Cuda(e)) => gpu.wait(lane, e),
            #[cfg(feature = "cuda")]
            _ => unreachable!("an event of another device"),
        }
    }

    /// Whether the work before `event` is done, and how it ended.
    pub(crate) fn query(&self, event: &Event) -> Poll<Result<(), String>> {
        match event {
            Event::Sim(e) => {
                if e.is_done() {
                    Poll::Ready(Ok(()))
                } else {
                    Poll::Pending
                }
            }
            #[cfg(feature = "cuda")]
            Event::Cuda(e) => cuda::query(e),
        }
    }

    /// Runs `f` on the host once `lane` reaches it.
    pub(crate) fn enqueue_host(&self, lane: u8, f: Box<dyn FnOnce() + Send>) -> Result<(), String> {
        match &self.gpu {
            Gpu::Sim(gpu) => {
                gpu.run(lane, f);
                Ok(())
            }
            #[cfg(feature = "cuda")]
            Gpu::Cuda(gpu) => gpu.enqueue_host(lane, f),
        }
    }

    pub(crate) fn is_simulated(&self) -> bool {
        matches!(self.gpu, Gpu::Sim(_))
    }

    pub(crate) fn shutdown(&self) {
        match &self.gpu {
            Gpu::Sim(gpu) => gpu.shutdown(),
            #[cfg(feature = "cuda")]
            Gpu::Cuda(gpu) => gpu.shutdown(),
        }
    }
}
