//! The backend of a stream device: its streams and events, simulated or
//! CUDA, behind one interface (what the launcher, the poller and
//! [`Stream`](crate::stream::Stream) call), and whether the device is dead.
//!
//! A device is *dead* once its context reported an error that does not go
//! away (CUDA's sticky errors: an illegal address, a trap; the context runs
//! nothing more). From then on every call fails at once with that first
//! error, and the poller fails every op in flight with it.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use std::task::Poll;
use std::time::{Duration, Instant};

use crate::loom::sync::Mutex;

#[cfg(feature = "cuda")]
use super::cuda;
use super::poller::Wake;
use super::sim;

/// A device's event: the point in a stream after an op's work. Taken from
/// its device's pool of spare events, and given back when dropped (with its
/// fence, once that work is done: the poller holds the fence until then),
/// so a device creates about as many events as it has ops in flight, not one
/// per op. Reuse is sound: a stream wait already enqueued on an event keeps
/// the record it saw (CUDA's `cuStreamWaitEvent`, and the simulated
/// device's generations).
pub(crate) struct Event {
    raw: Option<Raw>,
    /// The simulated event's generation this use records.
    generation: u64,
    backend: Arc<Backend>,
}

enum Raw {
    Sim(Arc<sim::SimEvent>),
    #[cfg(feature = "cuda")]
    Cuda(cuda::RawEvent),
}

/// Spare events a device keeps, at most; beyond that they are destroyed.
const MAX_SPARE: usize = 4096;

impl crate::core::fence::Watch for Event {
    fn first_waiter(&self) {
        self.backend.wake.waiter();
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        let Some(raw) = self.raw.take() else { return };
        let mut spare = self.backend.spare.lock();
        if spare.len() < MAX_SPARE {
            spare.push(raw);
        } else {
            drop(spare);
            self.backend.destroy(raw);
        }
    }
}

/// The device behind a stream device.
pub(crate) struct Backend {
    /// Compute lanes; the two copy lanes follow them.
    pub(crate) compute: usize,
    pub(crate) gpu: Gpu,
    /// Debug builds only: [`NO_LANE_WAITS`] was set, so [`wait`](Self::wait)
    /// does nothing (the engine's cross-lane ordering is broken on purpose).
    pub(crate) no_lane_waits: bool,
    /// The error that killed the device.
    dead: OnceLock<String>,
    /// The poller's: told of fences' first waiters.
    wake: Arc<Wake>,
    /// Events not in use (see [`Event`]).
    spare: Mutex<Vec<Raw>>,
    /// Events created, in all.
    created: AtomicUsize,
}

impl Drop for Backend {
    fn drop(&mut self) {
        for raw in std::mem::take(&mut *self.spare.lock()) {
            self.destroy(raw);
        }
    }
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

/// A captured graph, instantiated (see `capture`).
pub(crate) enum Exec {
    Sim(Arc<sim::SimGraph>),
    #[cfg(feature = "cuda")]
    Cuda(cuda::RawExec),
}

pub(crate) enum Gpu {
    Sim(sim::SimGpu),
    #[cfg(feature = "cuda")]
    Cuda(cuda::CudaGpu),
}

/// How long the backend waits for a lane's work after it reported an error
/// (see [`Settled`]) before it treats the device as dead. Not a synchronise
/// without end: the wait runs on the launcher or the poller, and a host
/// function on the lane may be waiting for that thread.
pub(crate) const SETTLE_DEADLINE: Duration = Duration::from_secs(5);

/// How work that reported an error with its event or record ended: the
/// backend waited for its lane (until [`SETTLE_DEADLINE`]) before saying so.
pub(crate) enum Settled {
    /// The lane's work up to now is over.
    Over(String),
    /// Waiting failed too (the context is unusable: a sticky error), or the
    /// lane's work did not end by the deadline.
    Dead(String),
}

impl Backend {
    /// `settled`'s message; a dead context kills the device first.
    fn settled(&self, settled: Settled) -> String {
        match settled {
            Settled::Over(m) => m,
            Settled::Dead(m) => self.kill(m),
        }
    }

    pub(crate) fn new(compute: usize, gpu: Gpu, wake: Arc<Wake>) -> Self {
        Self {
            compute,
            gpu,
            no_lane_waits: no_lane_waits(),
            dead: OnceLock::new(),
            wake,
            spare: Mutex::new(Vec::new()),
            created: AtomicUsize::new(0),
        }
    }

    /// How many events the device created (the rest were reused).
    pub(crate) fn events_created(&self) -> usize {
        self.created.load(Relaxed)
    }

    fn destroy(&self, raw: Raw) {
        match (raw, &self.gpu) {
            #[cfg(feature = "cuda")]
            (Raw::Cuda(e), Gpu::Cuda(gpu)) => gpu.destroy(e),
            _ => {}
        }
    }

    /// The error that killed the device, if one did.
    pub(crate) fn dead(&self) -> Option<&str> {
        self.dead.get().map(String::as_str)
    }

    /// Marks the device dead with `error` (the first error wins); returns
    /// the error it died of.
    pub(crate) fn kill(&self, error: String) -> String {
        let mut died = false;
        let error = self
            .dead
            .get_or_init(|| {
                died = true;
                error
            })
            .clone();
        if died {
            self.on_death();
        }
        error
    }

    /// The device just died.
    fn on_death(&self) {
        #[cfg(feature = "cuda")]
        if let Gpu::Cuda(gpu) = &self.gpu {
            // The driver calls none of the host functions it holds any more.
            gpu.abandon_host_jobs();
        }
    }

    fn alive(&self) -> Result<(), String> {
        match self.dead() {
            Some(e) => Err(format!("the device is dead: {e}")),
            None => Ok(()),
        }
    }

    /// An event for one op: a spare one, or a new one.
    pub(crate) fn new_event(self: &Arc<Self>) -> Result<Event, String> {
        self.alive()?;
        let spare = self.spare.lock().pop();
        let raw = match spare {
            Some(raw) => raw,
            None => {
                let raw = match &self.gpu {
                    Gpu::Sim(_) => Raw::Sim(Arc::default()),
                    #[cfg(feature = "cuda")]
                    Gpu::Cuda(gpu) => Raw::Cuda(gpu.new_event()?),
                };
                self.created.fetch_add(1, Relaxed);
                raw
            }
        };
        let generation = match &raw {
            Raw::Sim(e) => e.next(),
            #[cfg(feature = "cuda")]
            Raw::Cuda(_) => 0,
        };
        Ok(Event {
            raw: Some(raw),
            generation,
            backend: self.clone(),
        })
    }

    /// Records `event` after the work enqueued on `lane` so far. On an
    /// error that work is over (or the device is dead) when this returns.
    pub(crate) fn record(&self, lane: u8, event: &Event) -> Result<(), String> {
        self.alive()?;
        match (&self.gpu, event.raw()) {
            (Gpu::Sim(gpu), Raw::Sim(e)) => {
                gpu.signal(lane, e.clone(), event.generation);
                Ok(())
            }
            #[cfg(feature = "cuda")]
            (Gpu::Cuda(gpu), Raw::Cuda(e)) => gpu.record(lane, e).map_err(|s| self.settled(s)),
            #[cfg(feature = "cuda")]
            _ => unreachable!("an event of another device"),
        }
    }

    /// Makes `lane`'s later work wait for `event` (on the device).
    pub(crate) fn wait(&self, lane: u8, event: &Event) -> Result<(), String> {
        self.alive()?;
        if self.no_lane_waits {
            return Ok(());
        }
        match (&self.gpu, event.raw()) {
            (Gpu::Sim(gpu), Raw::Sim(e)) => {
                gpu.wait(lane, e.clone(), event.generation);
                Ok(())
            }
            #[cfg(feature = "cuda")]
            (Gpu::Cuda(gpu), Raw::Cuda(e)) => gpu.wait(lane, e),
            #[cfg(feature = "cuda")]
            _ => unreachable!("an event of another device"),
        }
    }

    /// Whether the work before `event`, recorded on `lane`, is done, and how
    /// it ended. An `Err` comes once that work is over, or the device is
    /// dead ([`dead`](Self::dead) says which).
    pub(crate) fn query(&self, lane: u8, event: &Event) -> Poll<Result<(), String>> {
        match (&self.gpu, event.raw()) {
            (Gpu::Sim(gpu), Raw::Sim(e)) => gpu
                .query(lane, e, event.generation)
                .map(|r| r.map_err(|s| self.settled(s))),
            #[cfg(feature = "cuda")]
            (Gpu::Cuda(gpu), Raw::Cuda(e)) => {
                gpu.query(lane, e).map(|r| r.map_err(|s| self.settled(s)))
            }
            #[cfg(feature = "cuda")]
            _ => unreachable!("an event of another device"),
        }
    }

    /// Runs `f` on the host once `lane` reaches it (a host function).
    pub(crate) fn enqueue_host(&self, lane: u8, f: Box<dyn FnOnce() + Send>) -> Result<(), String> {
        self.alive()?;
        match &self.gpu {
            Gpu::Sim(gpu) => {
                gpu.host(lane, f);
                Ok(())
            }
            #[cfg(feature = "cuda")]
            Gpu::Cuda(gpu) => gpu.enqueue_host(lane, f),
        }
    }

    /// Runs `f` as `lane`'s own device work (the simulated device only).
    pub(crate) fn enqueue_work(&self, lane: u8, f: Box<dyn FnOnce() + Send>) -> Result<(), String> {
        self.alive()?;
        match &self.gpu {
            Gpu::Sim(gpu) => {
                gpu.run(lane, f);
                Ok(())
            }
            #[cfg(feature = "cuda")]
            Gpu::Cuda(_) => {
                Err("`Stream::simulate` on a CUDA device: launch kernels on `Stream::cuda`".into())
            }
        }
    }

    /// The device's private capture stream: one stream past the lanes,
    /// which runs no op's work. A capture records there, never on a lane,
    /// so that other threads' work on the lane (the poller's drops, a
    /// `DeviceMemory`'s free) cannot join the graph (see `capture`).
    pub(crate) fn capture_stream(&self) -> u8 {
        (self.compute + 2) as u8
    }

    /// Starts capturing into the capture stream, forked from `lane` (it
    /// waits for `lane`'s work so far); returns the capture stream. Captures
    /// of one device run one at a time (on its launcher).
    pub(crate) fn begin_capture(&self, lane: u8) -> Result<u8, String> {
        self.alive()?;
        let on = self.capture_stream();
        self.link(lane, on)?;
        match &self.gpu {
            Gpu::Sim(gpu) => gpu.begin_capture(on)?,
            #[cfg(feature = "cuda")]
            Gpu::Cuda(gpu) => gpu.begin_capture(on)?,
        }
        Ok(on)
    }

    /// Makes stream `to` wait, on the device, for the work enqueued on
    /// `from` so far (a one-shot event: see `arena::order`).
    fn link(&self, from: u8, to: u8) -> Result<(), String> {
        match &self.gpu {
            Gpu::Sim(gpu) => {
                let event = Arc::new(sim::SimEvent::default());
                let generation = event.next();
                gpu.signal(from, event.clone(), generation);
                gpu.wait(to, event, generation);
                Ok(())
            }
            #[cfg(feature = "cuda")]
            Gpu::Cuda(gpu) => gpu.link(from, to),
        }
    }

    /// Captures host function `f` on capture stream `on`: on CUDA a host
    /// node pointing at `f`, which the caller keeps alive with the graph;
    /// the simulated device keeps nothing (the capture lists its jobs).
    pub(crate) fn capture_host(&self, on: u8, f: &sim::RepeatFn) -> Result<(), String> {
        self.alive()?;
        match &self.gpu {
            Gpu::Sim(_) => {
                let _ = (on, f);
                Ok(())
            }
            #[cfg(feature = "cuda")]
            Gpu::Cuda(gpu) => gpu.capture_host(on, f),
        }
    }

    /// Whether device work of the simulated kind may be captured.
    pub(crate) fn capture_work(&self) -> Result<(), String> {
        self.alive()?;
        match &self.gpu {
            Gpu::Sim(_) => Ok(()),
            #[cfg(feature = "cuda")]
            Gpu::Cuda(_) => Err(
                "`Stream::simulate_repeatable` on a CUDA device: launch kernels on `Stream::cuda`"
                    .into(),
            ),
        }
    }

    /// Ends the capture on capture stream `on` and joins it back into
    /// `lane` (which waits for whatever `on` holds): the graph,
    /// instantiated, if `keep` (`nodes`: the simulated device's, from the
    /// capture's jobs); else the capture is discarded (None).
    pub(crate) fn end_capture(
        &self,
        lane: u8,
        on: u8,
        keep: bool,
        nodes: impl FnOnce() -> Vec<sim::SimNode>,
    ) -> Result<Option<Exec>, String> {
        let ended = match &self.gpu {
            Gpu::Sim(gpu) => match gpu.end_capture(on) {
                Ok(()) => Ok(keep.then(|| Exec::Sim(Arc::new(sim::SimGraph { nodes: nodes() })))),
                Err(e) if keep => Err(e),
                Err(_) => Ok(None),
            },
            #[cfg(feature = "cuda")]
            Gpu::Cuda(gpu) => gpu.end_capture(on, keep).map(|e| e.map(Exec::Cuda)),
        };
        // Out of capture mode whatever happened: the join is an ordinary
        // wait (only a dead device refuses it, and it runs nothing more).
        let joined = self.alive().and_then(|()| self.link(on, lane));
        let exec = ended?;
        if let Err(e) = joined {
            if let Some(exec) = exec {
                self.destroy_exec(exec);
            }
            return Err(e);
        }
        Ok(exec)
    }

    /// Launches a captured graph on `lane` (its capture's).
    pub(crate) fn launch(&self, lane: u8, exec: &Exec) -> Result<(), String> {
        self.alive()?;
        match (&self.gpu, exec) {
            (Gpu::Sim(gpu), Exec::Sim(graph)) => {
                gpu.launch(lane, graph.clone());
                Ok(())
            }
            #[cfg(feature = "cuda")]
            (Gpu::Cuda(gpu), Exec::Cuda(exec)) => gpu.launch(lane, exec),
            #[cfg(feature = "cuda")]
            _ => unreachable!("a graph of another device"),
        }
    }

    /// Destroys a captured graph (launches still in flight finish first).
    pub(crate) fn destroy_exec(&self, exec: Exec) {
        match (exec, &self.gpu) {
            #[cfg(feature = "cuda")]
            (Exec::Cuda(e), Gpu::Cuda(gpu)) => gpu.destroy_exec(e),
            _ => {}
        }
    }

    /// How many captured graphs' launches the device ran (the simulated
    /// device counts them; 0 on CUDA).
    pub(crate) fn graph_launches(&self) -> u64 {
        match &self.gpu {
            Gpu::Sim(gpu) => gpu.launches(),
            #[cfg(feature = "cuda")]
            Gpu::Cuda(_) => 0,
        }
    }

    /// Prepares the calling thread to drive the device (the poller's, at
    /// its start): on CUDA, makes the context current.
    pub(crate) fn enter_thread(&self) {
        #[cfg(feature = "cuda")]
        if let Gpu::Cuda(gpu) = &self.gpu {
            let _ = gpu.bind();
        }
    }

    pub(crate) fn is_simulated(&self) -> bool {
        matches!(self.gpu, Gpu::Sim(_))
    }

    /// Lets the streams finish what they hold, waiting until `deadline` at
    /// most; a dead device, which runs nothing more, not at all.
    pub(crate) fn shutdown(&self, deadline: Instant) {
        let deadline = self.dead().is_none().then_some(deadline);
        match &self.gpu {
            Gpu::Sim(gpu) => gpu.shutdown(deadline),
            #[cfg(feature = "cuda")]
            Gpu::Cuda(gpu) => gpu.shutdown(deadline),
        }
    }
}

impl Event {
    /// The poller of the event's device: where values of the device go to
    /// be dropped (see `context`).
    pub(crate) fn poller(&self) -> &Arc<Wake> {
        &self.backend.wake
    }

    fn raw(&self) -> &Raw {
        self.raw
            .as_ref()
            .expect("an event is taken only by its drop")
    }
}
