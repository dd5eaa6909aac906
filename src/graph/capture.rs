//! Captured replays (`Recorder::capture`): a graph whose ops all run on one
//! stream device is captured once into a device graph (CUDA's stream
//! capture; the simulated device's list of work items) and each replay
//! launches it as one op.
//!
//! A captured graph's replay is not the countdown-driven replay of `run`:
//! the engine pushes one *launch op* on the graph's device and lane, which
//! declares the graph's boundary variables (and its token) as the replay's
//! op does, but is an ordinary stream op (`dep::stream_op`): it waits for
//! their fences (stream waits on its lane, other devices' on the host),
//! runs its body ([`CapturedBody`]), records one fence after it, hands its
//! variables on at once and completes when the poller sees the fence. Its
//! body:
//!
//! 1. the first time (or after a failed capture): begins a capture on the
//!    lane and runs every recorded op's body in recorded order
//!    (`dep::run_captured`) with the capturing stream (so all of them go
//!    to one stream: the lanes of the recorded ops are not kept inside the
//!    graph, and neither is their parallelism), then ends and instantiates
//!    the capture. A body's error ends the capture discarded, fails this
//!    replay, and leaves the graph uncaptured: the next replay tries again;
//! 2. every time: launches the graph on the lane.
//!
//! Only the launch op's body touches [`Capturing::graph`], under its lock,
//! held through the capture and the launch: of two replays in flight, the
//! second's body waits for the first's capture and launches the graph it
//! captured (bodies on a stream device all run on its one launcher thread
//! anyway, so the lock is uncontended).
//!
//! Launches of one graph are ordered by the boundary variables the graph
//! mutates (each launch op mutates them) and by their lane (all on one:
//! their device work runs one launch after the other, in enqueue order).
//! A launch op only *reads* the graph's token, unlike the replay's op of
//! an uncaptured graph: a failed launch poisons what it mutates, and a
//! poisoned token would skip every later launch. So the replays of a graph
//! that mutates no boundary variable are not ordered with each other,
//! beyond each launch's work running whole before or after another's.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::task::{Context, Poll};

use super::run::Runtime;
use crate::dep::{Body, Env, Host, OpBlock, run_captured};
use crate::device::CapturedGraph;
use crate::error::{BoxError, Error};
use crate::loom::sync::Mutex;

/// A captured graph's state, shared by its handle and its launch ops.
#[derive(Debug)]
pub(crate) struct Capturing {
    /// The stream device and lane its launches run on.
    pub(crate) device: u16,
    pub(crate) lane: u8,
    /// The instantiated graph, once a capture succeeded.
    graph: Mutex<Option<Arc<CapturedGraph>>>,
    /// How many captures ran (their bodies ran once each).
    captures: AtomicU64,
}

impl Capturing {
    /// Whether the graph is captured (a replay's capture succeeded).
    pub(crate) fn is_captured(&self) -> bool {
        self.graph.lock().is_some()
    }

    /// How many times the recorded bodies ran under a capture.
    pub(crate) fn captures(&self) -> u64 {
        self.captures.load(Relaxed)
    }
}

/// Checks that `runtime`'s graph can be captured: every op on one stream
/// device, none with units, no planned buffer (`planned`: how many). The
/// launches run on the lane of the first op.
///
/// # Errors
///
/// [`Error::Graph`], naming the first op that cannot be captured.
pub(crate) fn capturing<H: Host>(runtime: &Runtime<H>, planned: usize) -> Result<Capturing, Error> {
    let refuse = |why: String| {
        Err(Error::Graph(format!(
            "a graph can be captured only if all its ops run on one stream device: {why}"
        )))
    };
    if planned > 0 {
        return refuse(format!(
            "it has {planned} planned buffers (host or device memory, taken by its replays)"
        ));
    }
    let mut target = None;
    for (i, step) in runtime.steps().iter().enumerate() {
        let op = step.resident.block();
        let name = match op.failure_name() {
            Some(name) => format!("op `{name}` ({i})"),
            None => format!("op {i}"),
        };
        let Some(lane) = op.lane() else {
            return refuse(format!("{name} is a host op"));
        };
        if op.units().is_some() {
            return refuse(format!("{name} takes resource units"));
        }
        match target {
            None => target = Some((op.device_index(), lane)),
            Some((device, _)) if device != op.device_index() => {
                return refuse(format!("{name} runs on another device than op 0"));
            }
            Some(_) => {}
        }
    }
    let Some((device, lane)) = target else {
        return refuse("it has no ops".into());
    };
    Ok(Capturing {
        device,
        lane,
        graph: Mutex::new(None),
        captures: AtomicU64::new(0),
    })
}

/// The body of a captured graph's launch op (see the module docs): the
/// graph, until the launch is enqueued (`discard`: the graph may go with
/// its handle once every launch op ended).
pub(crate) struct CapturedBody<H: Host>(Option<(Arc<Runtime<H>>, Arc<Capturing>)>);

impl<H: Host> CapturedBody<H> {
    pub(crate) fn new(runtime: Arc<Runtime<H>>, capturing: Arc<Capturing>) -> Self {
        Self(Some((runtime, capturing)))
    }
}

/// Captures the graph on `stream`'s lane: every recorded body of
/// `runtime`, in recorded order.
fn capture<H: Host>(
    runtime: &Runtime<H>,
    capturing: &Capturing,
    env: &Env<'_>,
) -> Result<Arc<CapturedGraph>, String> {
    let stream = env.stream.expect("a launch op runs on a stream device");
    let capture = stream.begin_capture()?;
    capturing.captures.fetch_add(1, Relaxed);
    let captured = Env {
        stream: Some(&capture),
        engine: env.engine,
        lease_dropped: env.lease_dropped,
    };
    let failed = runtime.steps().iter().enumerate().find_map(|(i, step)| {
        let op = step.resident.block();
        run_captured(op, &step.body, &captured).err().map(|why| {
            let name = op
                .failure_name()
                .map_or_else(|| format!("op {i}"), |n| format!("op `{n}` ({i})"));
            format!("recorded {name} failed while its graph was captured: {why}")
        })
    });
    let ended = capture.end_capture(failed.is_none());
    match (failed, ended) {
        (Some(why), _) => Err(why),
        (None, Err(e)) => Err(format!("capturing the graph failed: {e}")),
        (None, Ok(graph)) => Ok(graph.expect("kept")),
    }
}

impl<H: Host> Unpin for CapturedBody<H> {}

impl<H: Host> Body for CapturedBody<H> {
    type Output = Option<Error>;
    const SYNC: bool = true;

    fn poll_body(
        self: Pin<&mut Self>,
        _op: &OpBlock,
        env: &Env<'_>,
        _cx: &mut Context<'_>,
    ) -> Poll<Result<Option<Error>, BoxError>> {
        let (runtime, capturing) = self.get_mut().0.as_ref().expect("launch ran once");
        // Held through the capture and the launch: launches of one graph
        // capture once and enqueue one at a time.
        let mut slot = capturing.graph.lock();
        if slot.is_none() {
            match capture(runtime, capturing, env) {
                Ok(graph) => *slot = Some(graph),
                Err(why) => return Poll::Ready(Err(why.into())),
            }
        }
        let graph = slot.as_ref().expect("captured");
        let stream = env.stream.expect("a launch op runs on a stream device");
        Poll::Ready(match stream.launch(graph) {
            Ok(()) => Ok(None),
            Err(e) => Err(format!("launching the captured graph failed: {e}").into()),
        })
    }

    fn discard(self: Pin<&mut Self>) {
        self.get_mut().0 = None;
    }
}
