//! Running policy, separate from dependency tracking (seed 000): once an op's
//! dependencies are granted, its device's executor decides where and when it
//! runs.
//!
//! An engine has one or more *devices*, each with its own [`Executor`]:
//!
//! - [`Executor::pool`]: a work-stealing pool of CPU threads (the default);
//! - [`Executor::inline`]: runs each op on the thread that made it ready,
//!   usually inside `push` (MXNet's `NaiveEngine`, for debugging: same
//!   results, no threads);
//! - [`Executor::custom`]: hands each ready op, as a [`Job`], to a function of
//!   yours, for example one that spawns it on a tokio or smol runtime;
//! - [`Executor::cuda`] and [`Executor::simulated_gpu`]: a stream device,
//!   whose ops enqueue work on streams and complete with it (see
//!   [`stream`](crate::stream)).
//!
//! The CPU executors implement the crate-internal [`Queue`] trait.

#![deny(unsafe_code)]

mod custom;
mod inline;
mod pool;

use std::fmt;
use std::sync::Arc;

use crate::op::Runner;
use crate::stream::{Spec, StreamExec};

pub(crate) use pool::Pool;

/// What executors implement: take ready ops, run them, stop on shutdown.
pub(crate) trait Queue: Send + Sync + fmt::Debug {
    /// Takes a ready op. `yielded` tells an op that woke itself while running
    /// (it should go behind other ready ops). Must not block, and should not
    /// run the op on the calling thread unless the executor is built for that
    /// (the inline one).
    fn schedule(&self, runner: Runner, yielded: bool);

    /// Stops the executor once the engine has drained; joins its threads
    /// unless called from one of them.
    fn shutdown(&self);
}

/// A device's executor: the pool is dispatched statically (it is the hot
/// path), the others through [`Queue`].
#[derive(Debug)]
pub(crate) enum Exec {
    Pool(Pool),
    Stream(Box<StreamExec>),
    Other(Box<dyn Queue>),
}

impl Exec {
    #[inline]
    pub(crate) fn schedule(&self, runner: Runner, yielded: bool) {
        match self {
            Exec::Pool(pool) => pool.schedule(runner, yielded),
            Exec::Stream(s) => s.launcher.schedule(runner, yielded),
            Exec::Other(queue) => queue.schedule(runner, yielded),
        }
    }

    pub(crate) fn shutdown(&self) {
        match self {
            Exec::Pool(pool) => pool.shutdown(),
            Exec::Stream(s) => s.shutdown(),
            Exec::Other(queue) => queue.shutdown(),
        }
    }

    /// The stream device, if this is one.
    #[inline]
    pub(crate) fn streams(&self) -> Option<&StreamExec> {
        match self {
            Exec::Stream(s) => Some(s),
            _ => None,
        }
    }
}

/// How a device runs its ops; passed to [`EngineBuilder`](crate::EngineBuilder).
///
/// ```
/// use depflow::{Engine, Executor};
///
/// let engine = Engine::builder()
///     .executor(Executor::pool(2))               // the default device, "cpu"
///     .device("cpu1", Executor::pool(1))         // a second CPU device
///     .device("debug", Executor::inline())       // runs ops in `push`
///     .build()?;
/// assert!(engine.device("cpu1").is_some());
/// # Ok::<(), depflow::Error>(())
/// ```
#[derive(Clone)]
pub struct Executor(pub(crate) Kind);

#[derive(Clone)]
pub(crate) enum Kind {
    Pool(usize),
    Inline,
    Custom(Arc<dyn Fn(Job) + Send + Sync>),
    Streams(Spec),
}

impl Executor {
    /// A work-stealing pool of `threads` CPU worker threads. Ready ops with a
    /// higher [priority](crate::OpBuilder::priority) run before lower ones.
    pub fn pool(threads: usize) -> Self {
        Executor(Kind::Pool(threads))
    }

    /// Runs each op on the thread that makes it ready: inside `push` when its
    /// dependencies are met at once, else on the thread that completes its
    /// last dependency. For debugging: no worker threads, same results.
    pub fn inline() -> Self {
        Executor(Kind::Inline)
    }

    /// Hands every ready op to `schedule`, which must arrange for
    /// [`Job::run`] to be called soon, on any thread, without blocking the
    /// caller (push it to a queue, or spawn it on a runtime).
    ///
    /// ```
    /// use depflow::{Engine, Executor};
    ///
    /// let rt = tokio::runtime::Runtime::new().unwrap();
    /// let handle = rt.handle().clone();
    /// let engine = Engine::builder()
    ///     .executor(Executor::custom(move |job| {
    ///         handle.spawn(async move { job.run(); });
    ///     }))
    ///     .build()?;
    /// let v = engine.var(1);
    /// let op = engine.push(&[], &[&v], {
    ///     let v = v.clone();
    ///     move |ctx| -> Result<i32, depflow::Error> { Ok(*ctx.write(&v)? * 7) }
    /// })?;
    /// assert_eq!(op.wait()?, 7);
    /// # Ok::<(), depflow::Error>(())
    /// ```
    pub fn custom(schedule: impl Fn(Job) + Send + Sync + 'static) -> Self {
        Executor(Kind::Custom(Arc::new(schedule)))
    }

    /// A simulated GPU with `compute_streams` compute streams and two copy
    /// streams, each a host thread that runs what is enqueued on it in
    /// order; events complete when their stream reaches them. It runs the
    /// same launcher, event and completion code as [`Executor::cuda`], so
    /// GPU programs can be tested (and their dependencies checked) on any
    /// machine. See [`Stream`](crate::stream::Stream) for an example.
    pub fn simulated_gpu(compute_streams: usize) -> Self {
        Executor(Kind::Streams(Spec::Sim {
            compute: compute_streams,
        }))
    }

    /// CUDA device `ordinal`, with `compute_streams` compute streams and two
    /// copy streams (see [`stream`](crate::stream)). Building the engine
    /// fails with [`Error::Config`](crate::Error::Config) where there is no
    /// such device; check [`cuda_device_count`](crate::stream::cuda_device_count)
    /// first to fall back to CPU devices.
    ///
    /// One launcher thread runs every op body of the device, so a body must
    /// only enqueue: a blocking call in it (a synchronize, a copy from
    /// pageable host memory) stalls every lane's enqueues. cudarc's own event
    /// tracking is per `CudaContext` object: turn it off on the context you
    /// allocate with if only engine ops touch the memory.
    #[cfg(feature = "cuda")]
    pub fn cuda(ordinal: usize, compute_streams: usize) -> Self {
        Executor(Kind::Streams(Spec::Cuda {
            ordinal,
            compute: compute_streams,
        }))
    }

    pub(crate) fn build(&self, name: &str, index: u16) -> Result<Exec, String> {
        let io = |e: std::io::Error| format!("cannot spawn its threads: {e}");
        Ok(match &self.0 {
            Kind::Pool(threads) => Exec::Pool(Pool::new(name, *threads).map_err(io)?),
            Kind::Inline => Exec::Other(Box::new(inline::Inline)),
            Kind::Custom(f) => Exec::Other(Box::new(custom::Custom(f.clone()))),
            Kind::Streams(spec) => Exec::Stream(Box::new(StreamExec::new(name, index, spec)?)),
        })
    }
}

impl fmt::Debug for Executor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Kind::Pool(n) => write!(f, "Executor::pool({n})"),
            Kind::Inline => f.write_str("Executor::inline()"),
            Kind::Custom(_) => f.write_str("Executor::custom(..)"),
            Kind::Streams(spec) => write!(f, "Executor::{spec:?}"),
        }
    }
}

/// A ready op, handed to a [custom executor](Executor::custom).
///
/// ```
/// use depflow::{Engine, Error, Executor, Job};
/// use std::sync::mpsc;
///
/// // Ops go to a channel; a thread of ours runs them.
/// let (tx, rx) = mpsc::channel::<Job>();
/// std::thread::spawn(move || {
///     for job in rx {
///         println!("running {:?} (priority {})", job.name(), job.priority());
///         job.run();
///     }
/// });
/// let tx = std::sync::Mutex::new(tx);
/// let engine = Engine::builder()
///     .executor(Executor::custom(move |job| tx.lock().unwrap().send(job).unwrap()))
///     .build()?;
/// let v = engine.new_var();
/// engine.op().name("step").mutates(&[&v]).run(|_| Ok::<_, Error>(()))?.wait()?;
/// # Ok::<(), Error>(())
/// ```
pub struct Job(pub(crate) Runner);

impl Job {
    /// Runs the op (one poll of its future). Returns `true` if the op woke
    /// itself while running and has already been scheduled again.
    pub fn run(self) -> bool {
        self.0.run()
    }

    /// The op's name, if it was given one.
    pub fn name(&self) -> Option<&str> {
        self.0.metadata().name()
    }

    /// The op's priority (0 unless set).
    pub fn priority(&self) -> i32 {
        self.0.metadata().priority()
    }
}

impl fmt::Debug for Job {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Job").field(self.0.metadata()).finish()
    }
}

/// A device of an engine: where an op runs. Cheap to copy.
///
/// Get one from [`Engine::device`](crate::Engine::device) or
/// [`Engine::default_device`](crate::Engine::default_device), and pick it for an
/// op with [`OpBuilder::on`](crate::OpBuilder::on).
///
/// ```
/// use depflow::{Engine, Error, Executor};
///
/// let engine = Engine::builder().device("gpu1", Executor::pool(1)).build()?;
/// let gpu1 = engine.device("gpu1").unwrap();
/// assert_eq!(gpu1.index(), 1);
/// let v = engine.new_var();
/// let device = engine.op().on(gpu1).mutates(&[&v]).run(|ctx| Ok::<_, Error>(ctx.device()))?.wait()?;
/// assert_eq!(device, gpu1);
/// # Ok::<(), Error>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Device {
    pub(crate) engine: u64,
    pub(crate) index: u16,
}

impl Device {
    pub(crate) fn new(engine: u64, index: u16) -> Self {
        Self { engine, index }
    }

    /// The device's position in its engine (0 is the default device).
    pub fn index(&self) -> usize {
        self.index as usize
    }
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Device({})", self.index)
    }
}
