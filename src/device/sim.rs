//! A simulated GPU: one host thread per stream runs the device work
//! enqueued on it (`Stream::simulate`), in order; an event completes when
//! its stream reaches it; a stream told to wait for an event blocks (that
//! stream's thread only) until it completes. Host functions
//! (`Stream::enqueue`) all run on one more thread, one at a time, each
//! stream waiting for its own: CUDA may serialise them so, and a host
//! function that waits for another stream's host function would deadlock
//! there; here it deadlocks too, rather than only on a GPU.
//!
//! It drives the very launcher, fence and poller code a CUDA device does, so
//! the stream machinery is tested where there is no GPU (`tests/streams.rs`,
//! the differential test, and the loom models of [`SimEvent`]).

use std::collections::VecDeque;
use std::sync::Arc;
use std::task::Poll;
use std::time::Instant;

use super::Threads;
use super::backend::{SETTLE_DEADLINE, Settled};

use crate::loom::sync::atomic::{AtomicU64, Ordering::*};
use crate::loom::sync::{Condvar, Mutex};

/// An event of the simulated device, reusable: each use records a new
/// *generation* (1, 2, ...), which the stream *reaches* in turn. A wait for
/// generation `g` is satisfied once the stream reached `g` or a later one,
/// as a CUDA stream's wait is tied to the record current when it was made,
/// not to later ones.
#[derive(Default)]
pub struct SimEvent {
    /// The last generation handed out (`next`).
    issued: AtomicU64,
    /// The last generation the stream reached.
    reached_gen: AtomicU64,
    lock: Mutex<()>,
    reached: Condvar,
}

impl SimEvent {
    /// The generation of the event's next use.
    pub fn next(&self) -> u64 {
        self.issued.fetch_add(1, Relaxed) + 1
    }

    /// Whether the stream reached generation `generation`.
    pub fn is_reached(&self, generation: u64) -> bool {
        self.reached_gen.load(Acquire) >= generation
    }

    /// The stream reached generation `generation`.
    pub fn signal(&self, generation: u64) {
        let _g = self.lock.lock();
        self.reached_gen.fetch_max(generation, Release);
        self.reached.notify_all();
    }

    /// Blocks the calling stream thread until generation `generation` is
    /// reached.
    pub fn wait(&self, generation: u64) {
        let mut g = self.lock.lock();
        while !self.is_reached(generation) {
            g = self.reached.wait(g);
        }
    }

    /// Blocks until generation `generation` is reached or `deadline`
    /// passed; whether it was reached.
    pub fn wait_until(&self, generation: u64, deadline: Instant) -> bool {
        let mut g = self.lock.lock();
        while !self.is_reached(generation) {
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                return false;
            };
            g = self.reached.wait_timeout(g, left).0;
        }
        true
    }
}

/// The loom models' events (the engine's are `backend::Event`).
impl crate::core::fence::Watch for Arc<SimEvent> {}

impl std::fmt::Debug for SimEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimEvent")
            .field("reached", &self.reached_gen.load(Relaxed))
            .finish()
    }
}

enum Item {
    /// Device work (`Stream::simulate`): run on the lane's thread.
    Run(Box<dyn FnOnce() + Send>),
    /// A host function (`Stream::enqueue`): run on the device's host
    /// function thread, the lane waiting for it.
    Host(Box<dyn FnOnce() + Send>),
    Wait(Arc<SimEvent>, u64),
    Signal(Arc<SimEvent>, u64),
    /// Tests: the device reports an error from here on (see
    /// [`SimGpu::fault`]).
    Fault(String, bool),
    /// A captured graph's launch: its nodes, in order, as this lane's
    /// work; counted in the device's launches once the lane reaches it.
    Launch(Arc<SimGraph>, Arc<AtomicU64>),
}

/// Work a captured graph repeats at each launch (`device::capture`).
pub(crate) type RepeatFn = Arc<dyn Fn() + Send + Sync>;

/// One node of a simulated captured graph.
pub(crate) enum SimNode {
    /// Device work, run on the launching lane's thread.
    Run(RepeatFn),
    /// A host function, run on the host function thread, the lane waiting.
    Host(RepeatFn),
}

/// A simulated device's captured graph: the stream's work items recorded
/// during a capture, in order (the stand-in for a CUDA graph's exec).
pub(crate) struct SimGraph {
    pub(crate) nodes: Vec<SimNode>,
}

/// An error the simulated device reports with its events: a stand-in for
/// CUDA's asynchronous errors, for tests.
#[derive(Default)]
struct Fault {
    /// Reported by the next query of any event, once.
    pending: Option<String>,
    /// Reported by every query from now on: the device runs nothing more.
    sticky: Option<String>,
}

#[derive(Default)]
struct LaneQueue {
    items: VecDeque<Item>,
    stop: bool,
    /// The stream is in capture mode (see [`SimGpu::begin_capture`]): what
    /// is enqueued on it joins the capture instead of running.
    capture: Option<Vec<Item>>,
}

#[derive(Default)]
struct Lane {
    queue: crate::loom::sync::Mutex<LaneQueue>,
    ready: crate::loom::sync::Condvar,
}

/// The simulated device: its streams' threads, and the one thread that
/// runs every stream's host functions, one at a time (as CUDA may).
pub(crate) struct SimGpu {
    lanes: Box<[Arc<Lane>]>,
    threads: Arc<Threads>,
    fault: Arc<Mutex<Fault>>,
    /// Captured graphs' launches the lanes reached (tests).
    launches: Arc<AtomicU64>,
}

/// A host function handed to the host function thread, and the generation
/// of its lane's event that says it returned.
type HostCall = (Box<dyn FnOnce() + Send>, Arc<SimEvent>, u64);

impl SimGpu {
    /// Starts a stream thread for each of `lanes` and one for the capture
    /// stream (index `lanes`: see `Backend::capture_stream`), and the host
    /// function thread; `reached` is called after each event completes (to
    /// wake the poller).
    pub(crate) fn new(
        name: &str,
        lanes: usize,
        reached: Arc<dyn Fn() + Send + Sync>,
    ) -> std::io::Result<Self> {
        let gpu = Self {
            lanes: (0..=lanes).map(|_| Arc::default()).collect(),
            threads: Arc::default(),
            fault: Arc::default(),
            launches: Arc::default(),
        };
        // The host function thread runs until every stream thread (each
        // holding a sender) is gone.
        let (calls, queue) = std::sync::mpsc::channel::<HostCall>();
        let started = gpu.threads.spawn(format!("{name}-hostfn"), move || {
            let _device = super::DeviceThread::enter();
            for (f, returned, generation) in queue {
                // Panics are caught inside `f` (see `Stream::enqueue`).
                f();
                returned.signal(generation);
            }
        });
        if let Err(e) = started {
            gpu.shutdown(None);
            return Err(e);
        }
        for (i, lane) in gpu.lanes.iter().enumerate() {
            let (lane, reached, f) = (lane.clone(), reached.clone(), gpu.fault.clone());
            let lane_calls = calls.clone();
            let spawned = gpu.threads.spawn(format!("{name}-stream{i}"), move || {
                run_lane(&lane, &*reached, &f, &lane_calls)
            });
            if let Err(e) = spawned {
                drop(calls);
                gpu.shutdown(None);
                return Err(e);
            }
        }
        Ok(gpu)
    }

    fn push(&self, lane: u8, item: Item) {
        let lane = &self.lanes[usize::from(lane)];
        let mut queue = lane.queue.lock();
        if let Some(joined) = &mut queue.capture {
            // As on CUDA, any thread's work on a capturing stream joins the
            // capture rather than running.
            joined.push(item);
            return;
        }
        queue.items.push_back(item);
        drop(queue);
        lane.ready.notify_one();
    }

    /// Puts stream `lane` in capture mode, as `cuStreamBeginCapture` does:
    /// until [`end_capture`](Self::end_capture), what any thread enqueues
    /// on it joins the capture instead of running. The capturing body's own
    /// repeatable work is recorded by `device::capture`, not enqueued; so
    /// anything that joins here is other work, which invalidates the
    /// capture (on CUDA: a free, an event or a wait of another thread's,
    /// which fails or invalidates it, the free never running).
    pub(crate) fn begin_capture(&self, lane: u8) -> Result<(), String> {
        let mut queue = self.lanes[usize::from(lane)].queue.lock();
        if queue.capture.is_some() {
            return Err("the stream is capturing already".into());
        }
        queue.capture = Some(Vec::new());
        Ok(())
    }

    /// Ends stream `lane`'s capture mode: an error if other work joined
    /// the capture (that work is dropped unrun, as an invalidated graph's).
    pub(crate) fn end_capture(&self, lane: u8) -> Result<(), String> {
        let joined = self.lanes[usize::from(lane)].queue.lock().capture.take();
        match joined {
            Some(joined) if !joined.is_empty() => Err(format!(
                "the capture was invalidated: {} pieces of other work enqueued on its stream \
                 joined it",
                joined.len()
            )),
            _ => Ok(()),
        }
    }

    /// Device work: `f` runs on `lane`'s own thread, in the lane's order.
    pub(crate) fn run(&self, lane: u8, f: Box<dyn FnOnce() + Send>) {
        self.push(lane, Item::Run(f));
    }

    /// A host function: `f` runs on the host function thread when `lane`
    /// reaches it, and the lane waits for it to return.
    pub(crate) fn host(&self, lane: u8, f: Box<dyn FnOnce() + Send>) {
        self.push(lane, Item::Host(f));
    }

    /// Makes `lane` wait until generation `generation` of `event` is reached.
    pub(crate) fn wait(&self, lane: u8, event: Arc<SimEvent>, generation: u64) {
        self.push(lane, Item::Wait(event, generation));
    }

    /// `lane` reaches generation `generation` of `event` after what it holds.
    pub(crate) fn signal(&self, lane: u8, event: Arc<SimEvent>, generation: u64) {
        self.push(lane, Item::Signal(event, generation));
    }

    /// Tests: once `lane` reaches this point, the device reports `message`
    /// with the next query of an event (`sticky`: with every query, and it
    /// runs nothing more), as CUDA reports the errors of asynchronous work.
    pub(crate) fn fault(&self, lane: u8, message: String, sticky: bool) {
        self.push(lane, Item::Fault(message, sticky));
    }

    /// A captured graph's launch: `graph`'s nodes run in order once `lane`
    /// reaches it, as one item of the lane's work.
    pub(crate) fn launch(&self, lane: u8, graph: Arc<SimGraph>) {
        self.push(lane, Item::Launch(graph, self.launches.clone()));
    }

    /// How many captured graphs' launches the lanes reached so far.
    pub(crate) fn launches(&self) -> u64 {
        self.launches.load(Acquire)
    }

    /// Whether the work before `event`, recorded on `lane`, is done. An
    /// error is reported as CUDA's is (see `cuda::CudaGpu::query`): a
    /// passing one once the lane's work is over, a sticky one as fatal.
    pub(crate) fn query(
        &self,
        lane: u8,
        event: &SimEvent,
        generation: u64,
    ) -> Poll<Result<(), Settled>> {
        let pending = {
            let mut fault = self.fault.lock();
            if let Some(m) = &fault.sticky {
                return Poll::Ready(Err(Settled::Dead(m.clone())));
            }
            fault.pending.take()
        };
        if let Some(m) = pending {
            // Wait for the lane's work so far, as CUDA's settle does: a new
            // event, waited for until the deadline (a host function on the
            // lane may be waiting for this very thread).
            let reached = Arc::new(SimEvent::default());
            self.signal(lane, reached.clone(), 1);
            let deadline = Instant::now() + SETTLE_DEADLINE;
            return Poll::Ready(Err(if reached.wait_until(1, deadline) {
                Settled::Over(m)
            } else {
                Settled::Dead(format!(
                    "{m} (then, waiting for the stream: its work did not end within \
                     {SETTLE_DEADLINE:?}; the device is treated as dead)"
                ))
            }));
        }
        if event.is_reached(generation) {
            Poll::Ready(Ok(()))
        } else {
            Poll::Pending
        }
    }

    /// Whether every thread of the device has returned (after its
    /// shutdown): work enqueued from now on never runs.
    pub(crate) fn is_finished(&self) -> bool {
        *self.threads.running.lock() == 0
    }

    /// Lets the streams finish what they hold, then joins their threads,
    /// waiting until `deadline` at most (None: not at all; see
    /// `Threads::join`).
    pub(crate) fn shutdown(&self, deadline: Option<Instant>) {
        for lane in self.lanes.iter() {
            lane.queue.lock().stop = true;
            lane.ready.notify_one();
        }
        self.threads.join(deadline);
    }
}

fn run_lane(
    lane: &Lane,
    reached: &(dyn Fn() + Send + Sync),
    fault: &Mutex<Fault>,
    calls: &std::sync::mpsc::Sender<HostCall>,
) {
    let _device = super::DeviceThread::enter();
    // Reached each time a host function of this lane returns.
    let returned = Arc::new(SimEvent::default());
    loop {
        let item = {
            let mut q = lane.queue.lock();
            loop {
                if let Some(item) = q.items.pop_front() {
                    break item;
                }
                if q.stop {
                    return;
                }
                q = lane.ready.wait(q);
            }
        };
        // After a sticky error the device runs nothing more (as CUDA's
        // context does); its events are still reached, so nothing waits.
        let dead = fault.lock().sticky.is_some();
        match item {
            Item::Run(_) | Item::Host(_) | Item::Launch(..) if dead => {}
            Item::Wait(..) if dead => {}
            // Panics are caught inside `f` (see `Stream::enqueue`).
            Item::Run(f) => f(),
            Item::Host(f) => host_call(f, &returned, calls),
            Item::Launch(graph, launches) => {
                launches.fetch_add(1, Release);
                for node in &graph.nodes {
                    match node {
                        SimNode::Run(f) => f(),
                        SimNode::Host(f) => {
                            let f = f.clone();
                            host_call(Box::new(move || f()), &returned, calls);
                        }
                    }
                }
            }
            Item::Wait(event, generation) => event.wait(generation),
            Item::Signal(event, generation) => {
                event.signal(generation);
                reached();
            }
            Item::Fault(message, sticky) => {
                let mut f = fault.lock();
                if sticky {
                    f.sticky.get_or_insert(message);
                } else {
                    f.pending.get_or_insert(message);
                }
                drop(f);
                reached();
            }
        }
    }
}

/// Runs host function `f` on the host function thread, the lane waiting
/// for it to return (`returned`: the lane's own event for that).
fn host_call(
    f: Box<dyn FnOnce() + Send>,
    returned: &Arc<SimEvent>,
    calls: &std::sync::mpsc::Sender<HostCall>,
) {
    let generation = returned.next();
    if calls.send((f, returned.clone(), generation)).is_ok() {
        returned.wait(generation);
    }
}
