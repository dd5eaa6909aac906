//! Stream devices: ops that enqueue work on a GPU's streams, and complete
//! when that work is done.
//!
//! A stream device ([`Executor::cuda`](crate::Executor::cuda), or
//! [`Executor::simulated_gpu`](crate::Executor::simulated_gpu) for machines
//! without one) has *lanes*: compute streams, and one stream each for
//! host-to-device and device-to-host copies (MXNet's copy workers), so that
//! copies overlap compute. An op pushed to it runs on the device's launcher
//! thread; its body gets the [`Stream`] of its lane ([`OpCtx::stream`]),
//! enqueues work and returns. Then:
//!
//! 1. The engine records an event after the work (the op's *fence*, see
//!    `fence`) and gives the op's variables back at once. A consumer on the
//!    same device is enqueued behind the event (a stream wait, no host round
//!    trip, even before the producer has finished); a consumer on the host or
//!    another device waits for the event first, parked, blocking no thread.
//! 2. The device's *poller* thread sees the event complete; only then is the
//!    op finished: its handle resolves, `wait_all` counts it out and its
//!    resource units go back.
//!
//! So a device costs two host threads (launcher, poller) however many ops are
//! in flight. The poller queries only the oldest event of each lane (a lane
//! completes in order), spinning briefly, then yielding, then sleeping up to
//! `poller::MAX_SLEEP` between rounds; a simulated device also wakes it when
//! an event is reached. Completion latency matters only to host consumers:
//! device consumers never wait for the poller.
//!
//! Errors: a failed launch or a host function's error fails the op like any
//! error; an error reported with the event fails the op when the poller sees
//! it, and poisons what it mutates. A consumer already enqueued behind a
//! failed op's event resolves to [`Error::Poisoned`]
//! with the original failure, and passes the poison on.
//!
//! [`OpCtx::stream`]: crate::OpCtx::stream

#![deny(unsafe_code)]

#[cfg(feature = "cuda")]
mod cuda;
pub(crate) mod fence;
pub(crate) mod poller;
pub(crate) mod sim;

use std::fmt;
use std::sync::Arc;
use std::task::Poll;

use self::fence::Fence;
use self::poller::Poller;
use crate::error::Error;
use crate::exec::{Pool, Queue};

/// Lanes a stream device may have in all (compute plus the two copy lanes).
pub(crate) const MAX_LANES: usize = 31;

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
///
/// ```
/// if depflow::stream::cuda_device_count() == 0 {
///     println!("no GPU: running on CPU devices");
/// }
/// ```
pub fn cuda_device_count() -> usize {
    #[cfg(feature = "cuda")]
    return cuda::device_count();
    #[cfg(not(feature = "cuda"))]
    0
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
///     ctx.stream()?.enqueue(move || { *mem.lock().unwrap() += 41; Ok(()) })
/// })?;
/// // A host op waits for the device work before it runs.
/// let got = engine.push(&[&buf], &[], move |ctx| Ok::<_, Error>(*ctx.read(b)?.lock().unwrap() + 1))?;
/// assert_eq!(got.wait()?, 42);
/// # Ok::<(), Error>(())
/// ```
pub struct Stream {
    pub(crate) device: Arc<Backend>,
    pub(crate) lane: u8,
    pub(crate) fence: Arc<Fence<Event>>,
}

impl Stream {
    /// The lane this op's work goes to.
    pub fn lane(&self) -> Lane {
        Lane::from_index(self.lane, self.device.compute)
    }

    /// Enqueues a host function: `f` runs on a host thread after the work
    /// enqueued before it on this stream, and the stream's later work waits
    /// for it. An `Err` fails the op (its handle resolves to
    /// [`Error::Failed`] with the message once the op's work is done) and
    /// poisons what it mutates. On a CUDA device it must not call CUDA.
    ///
    /// # Errors
    ///
    /// [`Error::Stream`] if the device refused it.
    pub fn enqueue(
        &self,
        f: impl FnOnce() -> Result<(), String> + Send + 'static,
    ) -> Result<(), Error> {
        let fence = self.fence.clone();
        let job = Box::new(move || {
            // Caught here: a panic must not unwind into the device's thread
            // (across the FFI boundary, on CUDA).
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
                Ok(Ok(())) => {}
                Ok(Err(message)) => fence.set_fault(message),
                Err(p) => fence.set_fault(format!(
                    "host function panicked: {}",
                    crate::op::panic_message(p.as_ref())
                )),
            }
        });
        self.device
            .enqueue_host(self.lane, job)
            .map_err(Error::Stream)
    }

    /// Whether this is a simulated device's stream.
    pub fn is_simulated(&self) -> bool {
        matches!(self.device.kind, Kind::Sim(_))
    }

    /// The CUDA stream (None on a simulated device): launch kernels and
    /// copies on it. The engine orders them with the other ops' work.
    #[cfg(feature = "cuda")]
    pub fn cuda(&self) -> Option<&Arc<cudarc::driver::CudaStream>> {
        match &self.device.kind {
            Kind::Cuda(gpu) => Some(gpu.stream(self.lane)),
            Kind::Sim(_) => None,
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

/// A device's event: the point in a stream after an op's work.
pub(crate) enum Event {
    Sim(Arc<sim::SimEvent>),
    #[cfg(feature = "cuda")]
    Cuda(cudarc::driver::CudaEvent),
}

/// The device behind a stream executor.
pub(crate) struct Backend {
    /// Compute lanes; the two copy lanes follow them.
    compute: usize,
    kind: Kind,
}

enum Kind {
    Sim(sim::SimGpu),
    #[cfg(feature = "cuda")]
    Cuda(cuda::CudaGpu),
}

impl Backend {
    pub(crate) fn new_event(&self) -> Result<Event, String> {
        match &self.kind {
            Kind::Sim(_) => Ok(Event::Sim(Arc::default())),
            #[cfg(feature = "cuda")]
            Kind::Cuda(gpu) => gpu.new_event().map(Event::Cuda),
        }
    }

    /// Records `event` after the work enqueued on `lane` so far.
    pub(crate) fn record(&self, lane: u8, event: &Event) -> Result<(), String> {
        match (&self.kind, event) {
            (Kind::Sim(gpu), Event::Sim(e)) => {
                gpu.signal(lane, e.clone());
                Ok(())
            }
            #[cfg(feature = "cuda")]
            (Kind::Cuda(gpu), Event::Cuda(e)) => gpu.record(lane, e),
            #[cfg(feature = "cuda")]
            _ => unreachable!("an event of another device"),
        }
    }

    /// Makes `lane`'s later work wait for `event` (on the device).
    pub(crate) fn wait(&self, lane: u8, event: &Event) -> Result<(), String> {
        match (&self.kind, event) {
            (Kind::Sim(gpu), Event::Sim(e)) => {
                gpu.wait(lane, e.clone());
                Ok(())
            }
            #[cfg(feature = "cuda")]
            (Kind::Cuda(gpu), Event::Cuda(e)) => gpu.wait(lane, e),
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

    fn enqueue_host(&self, lane: u8, f: Box<dyn FnOnce() + Send>) -> Result<(), String> {
        match &self.kind {
            Kind::Sim(gpu) => {
                gpu.run(lane, f);
                Ok(())
            }
            #[cfg(feature = "cuda")]
            Kind::Cuda(gpu) => gpu.enqueue_host(lane, f),
        }
    }

    fn shutdown(&self) {
        match &self.kind {
            Kind::Sim(gpu) => gpu.shutdown(),
            #[cfg(feature = "cuda")]
            Kind::Cuda(gpu) => gpu.shutdown(),
        }
    }
}

/// A stream device's executor: the launcher thread that runs op bodies (a
/// one-thread pool: it enqueues, so one is enough and keeps each lane's
/// enqueues in op order), the device, and the poller that completes fences.
pub(crate) struct StreamExec {
    pub(crate) launcher: Pool,
    pub(crate) device: Arc<Backend>,
    pub(crate) poller: Poller,
    pub(crate) index: u16,
}

impl StreamExec {
    pub(crate) fn new(name: &str, index: u16, spec: &Spec) -> Result<Self, String> {
        let compute = spec.compute();
        if compute == 0 || compute + 2 > MAX_LANES {
            return Err(format!(
                "a stream device needs 1 to {} compute streams, not {compute}",
                MAX_LANES - 2
            ));
        }
        let lanes = compute + 2;
        let wake = poller::Wake::new();
        let kind = match spec {
            Spec::Sim { .. } => {
                Kind::Sim(sim::SimGpu::new(name, lanes, wake.nudger()).map_err(|e| e.to_string())?)
            }
            #[cfg(feature = "cuda")]
            Spec::Cuda { ordinal, .. } => Kind::Cuda(cuda::CudaGpu::new(*ordinal, lanes)?),
        };
        let device = Arc::new(Backend { compute, kind });
        let poller = Poller::start(name, lanes, device.clone(), wake).map_err(|e| e.to_string())?;
        let launcher = Pool::new(&format!("{name}-launch"), 1).map_err(|e| e.to_string())?;
        Ok(Self {
            launcher,
            device,
            poller,
            index,
        })
    }

    pub(crate) fn lane(&self, lane: Lane) -> Option<u8> {
        lane.index(self.device.compute)
    }

    /// Stops the launcher, then the poller (nothing is in flight: the engine
    /// drained), then the device's own threads.
    pub(crate) fn shutdown(&self) {
        self.launcher.shutdown();
        self.poller.shutdown();
        self.device.shutdown();
    }
}

impl fmt::Debug for StreamExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamExec")
            .field("compute_lanes", &self.device.compute)
            .field("simulated", &matches!(self.device.kind, Kind::Sim(_)))
            .finish()
    }
}
