//! Capturing a stream's work into a graph, and launching it (a recorded
//! graph's `Recorder::capture`): the device side, op-agnostic.
//!
//! A capture is for one lane. While it lasts, the [`Stream`] bodies get is
//! a *capturing* stream: the work they enqueue is recorded, not run.
//!
//! The capture records on the device's private *capture stream*
//! (`Backend::capture_stream`), never on the lane itself: forked from the
//! lane by an event (it waits for the lane's work so far), put in capture
//! mode, and after `cuStreamEndCapture` joined back (the lane waits for it).
//! A stream in capture mode takes into the graph whatever *any* thread
//! enqueues on it; the lane gets other threads' work at any time (the
//! poller's drops of `drop_after` values and of finished ops' variables, a
//! `cuMemFreeAsync` among them; a `DeviceMemory` drop's events and waits),
//! which would join the graph, fail or invalidate the capture, and never
//! run. No thread but the capturing body's enqueues on the capture stream.
//!
//! - On CUDA, the capture stream is in capture mode (`cuStreamBeginCapture`,
//!   thread-local): kernels and copies launched on `Stream::cuda` (the
//!   capture stream, while capturing) become the graph's nodes, and
//!   a repeatable host function becomes a host node
//!   (`cuLaunchHostFunc` with a pointer to it, kept alive by the graph).
//!   The capture ends in `cuStreamEndCapture` and `cuGraphInstantiate`; a
//!   launch is `cuGraphLaunch` on the lane.
//! - On the simulated device the capture keeps the work items (closures)
//!   in order, and a launch enqueues one item that runs them all on the
//!   lane (host functions on the host function thread, as usual). The
//!   device counts the launches its lanes reach (tests).
//!
//! Work in a graph repeats at every launch, so only repeatable work can be
//! captured: [`Stream::enqueue_repeatable`] and
//! [`Stream::simulate_repeatable`] (`Fn`, not `FnOnce`); the one-shot
//! `enqueue` and `simulate` are refused while capturing. A captured job's
//! error is reported to the launch that ran it: jobs keep the first error
//! of a launch in the graph's [`Faults`], and each launch is followed on
//! its lane by a host function that moves it into the launch's fence (the
//! launches of one graph are on one lane, so each launch's jobs and its
//! collector run after the previous launch's, before the next one's).
//!
//! | field | written by | read by |
//! | --- | --- | --- |
//! | `Capture` | the capturing body, on the launcher (one thread) | `Stream::end_capture` |
//! | `CapturedGraph` | its capture's end (then never) | launches |
//! | `Faults` | captured jobs, as they fail | the collector after each launch |

use std::sync::Arc;

use super::backend::{Backend, Exec};
use super::sim::{RepeatFn, SimNode};
use super::{Deferred, DeviceThread, Stream};
use crate::error::Error;
use crate::loom::sync::Mutex;

/// A capture in progress (the capturing stream's).
pub(crate) struct Capture {
    /// The device's capture stream it records on (`Backend::capture_stream`).
    on: u8,
    /// The repeatable jobs, in order: whether each is a host function.
    /// Boxed: a CUDA host node points at its job.
    jobs: Mutex<Vec<(bool, Box<RepeatFn>)>>,
    /// What bodies handed to `drop_after`: kept as long as the graph.
    keep: Mutex<Vec<Deferred>>,
    faults: Arc<Faults>,
}

/// The first error of a launch's captured jobs, until its collector takes it.
#[derive(Default)]
pub(crate) struct Faults(Mutex<Option<String>>);

impl Faults {
    fn set(&self, message: String) {
        self.0.lock().get_or_insert(message);
    }

    fn take(&self) -> Option<String> {
        self.0.lock().take()
    }
}

/// A graph captured from a lane, ready to launch there (any number of
/// times). Dropped once no launch of it is in flight: each launch hands
/// the device a reference until its work is done.
pub(crate) struct CapturedGraph {
    backend: Arc<Backend>,
    lane: u8,
    exec: Option<Exec>,
    /// The jobs (CUDA's host nodes point at them).
    _jobs: Vec<(bool, Box<RepeatFn>)>,
    /// In a lock only to be `Sync`.
    _keep: Mutex<Vec<Deferred>>,
    faults: Arc<Faults>,
    /// Whether it has jobs that may report errors (else no collector).
    reports: bool,
}

impl Drop for CapturedGraph {
    fn drop(&mut self) {
        if let Some(exec) = self.exec.take() {
            self.backend.destroy_exec(exec);
        }
    }
}

impl std::fmt::Debug for CapturedGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CapturedGraph")
            .field("lane", &self.lane)
            .field("jobs", &self._jobs.len())
            .finish_non_exhaustive()
    }
}

impl Stream {
    /// Starts capturing this stream's lane: returns the capturing stream
    /// to hand to the bodies, whose work is recorded, not run, until
    /// [`end_capture`](Self::end_capture).
    pub(crate) fn begin_capture(&self) -> Result<Stream, String> {
        let on = self.backend.begin_capture(self.lane)?;
        let mut capturing = Stream::new(self.backend.clone(), self.lane, self.fence.clone());
        capturing.capture = Some(Arc::new(Capture {
            on,
            jobs: Mutex::default(),
            keep: Mutex::default(),
            faults: Arc::default(),
        }));
        Ok(capturing)
    }

    /// The device stream this stream's work goes to: its lane's, or while
    /// capturing, the device's capture stream.
    #[cfg(feature = "cuda")]
    pub(super) fn issue_lane(&self) -> u8 {
        self.capture.as_ref().map_or(self.lane, |c| c.on)
    }

    /// Ends the capture this stream makes: the graph, instantiated, if
    /// `keep` (the bodies succeeded), else nothing (the capture is
    /// discarded).
    pub(crate) fn end_capture(self, keep: bool) -> Result<Option<Arc<CapturedGraph>>, String> {
        let capture = self.capture.clone().expect("a capturing stream");
        let jobs = std::mem::take(&mut *capture.jobs.lock());
        let nodes = || {
            jobs.iter()
                .map(|(host, f)| match host {
                    true => SimNode::Host((**f).clone()),
                    false => SimNode::Run((**f).clone()),
                })
                .collect()
        };
        let exec = self
            .backend
            .end_capture(self.lane, capture.on, keep, nodes)?;
        let Some(exec) = exec else { return Ok(None) };
        Ok(Some(Arc::new(CapturedGraph {
            backend: self.backend.clone(),
            lane: self.lane,
            exec: Some(exec),
            reports: !jobs.is_empty(),
            _jobs: jobs,
            _keep: Mutex::new(std::mem::take(&mut *capture.keep.lock())),
            faults: capture.faults.clone(),
        })))
    }

    /// Launches `graph` (captured from this stream's lane) as this op's
    /// work: its errors go to this op's fence, and the graph stays alive
    /// until the launch's work is done.
    pub(crate) fn launch(&self, graph: &Arc<CapturedGraph>) -> Result<(), String> {
        debug_assert_eq!(graph.lane, self.lane, "a graph launches on its own lane");
        let exec = graph.exec.as_ref().expect("instantiated");
        // Kept until this op's work is done before the launch is enqueued:
        // if enqueuing the collector fails after the launch, the launch is
        // in flight all the same, and its host nodes point into `graph`.
        self.drop_after(graph.clone());
        self.backend.launch(self.lane, exec)?;
        if graph.reports {
            let faults = graph.faults.clone();
            self.backend.enqueue_host(
                self.lane,
                self.job(move || faults.take().map_or(Ok(()), Err)),
            )?;
        }
        Ok(())
    }

    /// Whether this stream captures its work into a graph (a captured
    /// graph's first replay runs its bodies so): then only repeatable work
    /// may be enqueued ([`enqueue_repeatable`](Self::enqueue_repeatable),
    /// [`simulate_repeatable`](Self::simulate_repeatable), kernels on
    /// `Stream::cuda`, which is then the device's capture stream).
    ///
    /// Allocate device memory outside the capture, or free it inside the
    /// bodies: an allocation on the capturing stream becomes a node of the
    /// graph, still allocated at the next launch, which would fail. A CUDA
    /// device refuses such a capture (the replay fails saying so).
    pub fn is_capturing(&self) -> bool {
        self.capture.is_some()
    }

    /// [`enqueue`](Self::enqueue) for work a captured graph repeats: `f`
    /// runs once per launch of the graph (once, outside a capture). Same
    /// rules as `enqueue`; an `Err` or a panic fails the launch it ran in.
    ///
    /// ```
    /// use depflow::{Engine, Executor};
    /// use std::sync::Arc;
    /// use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
    ///
    /// let engine = Engine::builder().device("gpu", Executor::simulated_gpu(1)).build()?;
    /// let gpu = engine.device("gpu").unwrap();
    /// let x = engine.var(Arc::new(AtomicU64::new(0)));
    /// let graph = engine.record(|rec| {
    ///     rec.capture();
    ///     rec.op().on(gpu).mutates(&[&x]).run({
    ///         let k = x.key();
    ///         move |ctx| {
    ///             let x = ctx.write(k)?.clone();
    ///             Ok(ctx.stream()?.enqueue_repeatable(move || {
    ///                 x.fetch_add(1, SeqCst);
    ///                 Ok(())
    ///             })?)
    ///         }
    ///     })
    /// })?;
    /// for _ in 0..3 {
    ///     graph.replay(); // one launch each; the body ran at the first only
    /// }
    /// let k = x.key();
    /// let got = engine.push(&[&x], &[], move |ctx| Ok(ctx.read(k)?.load(SeqCst)))?;
    /// assert_eq!(got.wait()?, 3);
    /// # Ok::<(), depflow::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Stream`] if the device refused it.
    pub fn enqueue_repeatable(
        &self,
        f: impl Fn() -> Result<(), String> + Send + Sync + 'static,
    ) -> Result<(), Error> {
        match &self.capture {
            None => self.enqueue(f),
            Some(capture) => {
                let job = Box::new(self.repeat_job(capture, f));
                self.backend
                    .capture_host(capture.on, &job)
                    .map_err(Error::Stream)?;
                capture.jobs.lock().push((true, job));
                Ok(())
            }
        }
    }

    /// [`simulate`](Self::simulate) for work a captured graph repeats: `f`
    /// runs once per launch of the graph (once, outside a capture).
    ///
    /// # Errors
    ///
    /// As `simulate`'s.
    pub fn simulate_repeatable(
        &self,
        f: impl Fn() -> Result<(), String> + Send + Sync + 'static,
    ) -> Result<(), Error> {
        match &self.capture {
            None => self.simulate(f),
            Some(capture) => {
                self.backend.capture_work().map_err(Error::Stream)?;
                let job = Box::new(self.repeat_job(capture, f));
                capture.jobs.lock().push((false, job));
                Ok(())
            }
        }
    }

    /// `f` as a captured job: marked as device work, its error or panic
    /// kept in the graph's faults for the launch running it.
    fn repeat_job(
        &self,
        capture: &Capture,
        f: impl Fn() -> Result<(), String> + Send + Sync + 'static,
    ) -> RepeatFn {
        let faults = capture.faults.clone();
        Arc::new(move || {
            let _device = DeviceThread::enter();
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(&f)) {
                Ok(Ok(())) => {}
                Ok(Err(message)) => faults.set(message),
                Err(p) => faults.set(format!(
                    "host function panicked: {}",
                    crate::error::panic_message(p.as_ref())
                )),
            }
        })
    }

    /// While capturing: `drop_after`'s value is kept as long as the graph
    /// (its work may use it at every launch). Returns it back otherwise.
    pub(super) fn keep_captured(&self, value: Deferred) -> Option<Deferred> {
        match &self.capture {
            Some(capture) => {
                capture.keep.lock().push(value);
                None
            }
            None => Some(value),
        }
    }

    /// Refuses one-shot work while capturing.
    pub(super) fn one_shot(&self, what: &str) -> Result<(), Error> {
        match self.capture {
            None => Ok(()),
            Some(_) => Err(Error::Stream(format!(
                "`Stream::{what}` while a graph is captured: its work repeats at every launch, \
                 use `Stream::{what}_repeatable` (an `Fn`)"
            ))),
        }
    }

    /// Tests only: how many captured graphs' launches the simulated device
    /// ran so far (0 on a CUDA device).
    #[doc(hidden)]
    pub fn graph_launches(&self) -> u64 {
        self.backend.graph_launches()
    }
}
