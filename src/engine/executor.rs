//! How each device of an engine runs its ops: the public [`Executor`]
//! choices and [`Job`] (a ready op, as a custom executor sees it), and the
//! built executor of a device ([`Exec`]). The queues themselves are
//! `crate::exec`'s, over the engine's runnable ops.

use std::fmt;
use std::sync::Arc;

use crate::dep::{OpBlock, Runner, reclaim};
use crate::device::{Spec, StreamDevice};
#[cfg(feature = "tokio")]
use crate::exec::Tokio;
use crate::exec::{self, Custom, Inline, Pool, Queue, StartHook, Work};

impl Work for Runner {
    #[inline]
    fn run(self) -> bool {
        async_task::Runnable::<OpBlock>::run(self)
    }

    #[inline]
    fn priority(&self) -> i32 {
        self.metadata().priority()
    }

    fn before_park() {
        // Free what ops run on this worker pushed and have finished.
        reclaim::collect();
    }

    #[inline]
    fn in_body() -> bool {
        crate::dep::in_op()
    }
}

/// A device's executor, built: the pool is dispatched statically (it is the
/// hot path), the others through [`Queue`].
#[derive(Debug)]
pub(crate) enum Exec {
    Pool(Pool<Runner>),
    Stream(Box<StreamExec>),
    Other(Box<dyn Queue<Runner>>),
}

/// A stream device and its launcher thread (a one-thread pool: bodies only
/// enqueue, so one is enough, and it keeps each lane's enqueues in op
/// order).
#[derive(Debug)]
pub(crate) struct StreamExec {
    launcher: Pool<Runner>,
    device: StreamDevice,
}

impl Exec {
    #[inline]
    pub(crate) fn schedule(&self, op: Runner, yielded: bool) {
        match self {
            Exec::Pool(pool) => pool.schedule(op, yielded),
            // An op its device's poller just completed finishes there (see
            // `device::poller`); any other goes to the launcher.
            Exec::Stream(_) if crate::device::poller::take_inline() => {
                op.run();
            }
            Exec::Stream(s) => s.launcher.schedule(op, yielded),
            Exec::Other(queue) => queue.schedule(op, yielded),
        }
    }

    /// How many kept ready ops to hand over now (see `Pool::wanted`); for
    /// an executor that cannot tell, `usize::MAX`: hand it all.
    #[inline]
    pub(crate) fn wanted(&self) -> usize {
        match self {
            Exec::Pool(pool) => pool.wanted(),
            Exec::Stream(_) | Exec::Other(_) => usize::MAX,
        }
    }

    /// Stops the executor: for a stream device the launcher, then the
    /// device (nothing is in flight: the engine drained).
    pub(crate) fn shutdown(&self) {
        match self {
            Exec::Pool(pool) => pool.shutdown(),
            Exec::Stream(s) => {
                s.launcher.shutdown();
                s.device.shutdown();
            }
            Exec::Other(queue) => queue.shutdown(),
        }
    }

    /// The stream device, if this is one.
    #[inline]
    pub(crate) fn stream_device(&self) -> Option<&StreamDevice> {
        match self {
            Exec::Stream(s) => Some(&s.device),
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
///
/// # Which futures work where
///
/// An async op ([`Engine::push_async`](crate::Engine::push_async)) is polled
/// on its device's threads, so the futures it awaits need what those threads
/// have:
///
/// | device | futures that work |
/// | --- | --- |
/// | [`pool`](Executor::pool), [`inline`](Executor::inline) | runtime-agnostic ones: other ops' handles and waits, channels (`futures`, `async-channel`, tokio's `sync`), smol's `async-io` timers and I/O (its reactor is a thread of its own) |
/// | a pool whose threads [entered a runtime](Executor::on_thread_start) | also that runtime's: tokio's timers, `tokio::fs`, sockets |
/// | `Executor::tokio` (the `tokio` feature) | also tokio's: timers, `tokio::fs`, sockets; its sync bodies run on tokio's workers |
/// | [`custom`](Executor::custom) | whatever the threads that call [`Job::run`] provide |
///
/// Elsewhere tokio's futures panic with "there is no reactor running"; the
/// engine reports that as the op's failure.
#[derive(Clone)]
pub struct Executor {
    pub(crate) kind: ExecutorKind,
    /// Run first thing on each of the device's threads.
    on_thread_start: Option<StartHook>,
}

#[derive(Clone)]
pub(crate) enum ExecutorKind {
    Pool(usize),
    Inline,
    Custom(Arc<dyn Fn(Job) + Send + Sync>),
    Streams(Spec),
    #[cfg(feature = "tokio")]
    Tokio(tokio::runtime::Handle),
}

impl Executor {
    fn of(kind: ExecutorKind) -> Self {
        Executor {
            kind,
            on_thread_start: None,
        }
    }

    /// A work-stealing pool of `threads` CPU worker threads. Ready ops with a
    /// higher [priority](crate::OpBuilder::priority) run before lower ones,
    /// with bounded overtaking (priorities age; see there).
    pub fn pool(threads: usize) -> Self {
        Self::of(ExecutorKind::Pool(threads))
    }

    /// Runs each op on the thread that makes it ready: inside `push` when its
    /// dependencies are met at once, else on the thread that completes its
    /// last dependency. For debugging: no worker threads, same results.
    pub fn inline() -> Self {
        Self::of(ExecutorKind::Inline)
    }

    /// Hands every ready op to `schedule`, which must arrange for
    /// [`Job::run`] to be called soon, on any thread, without blocking the
    /// caller (push it to a queue, or spawn it on a runtime).
    ///
    /// `schedule` may also run the job at once (`|job| { job.run(); }`): a
    /// job made ready while another runs on the same thread then runs after
    /// it, as on [`inline`](Executor::inline), so long chains do not nest. A
    /// panic in `schedule` is caught: the ops it was not handed to proceed,
    /// and a job it dropped fails its op as dropped by its executor.
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
    ///     move |ctx| { Ok(*ctx.write(&v)? * 7) }
    /// })?;
    /// assert_eq!(op.wait()?, 7);
    /// # Ok::<(), depflow::Error>(())
    /// ```
    pub fn custom(schedule: impl Fn(Job) + Send + Sync + 'static) -> Self {
        Self::of(ExecutorKind::Custom(Arc::new(schedule)))
    }

    /// Runs the device's ops on the tokio runtime of `handle` (the `tokio`
    /// feature): each ready op is spawned there as a task, so async ops can
    /// await tokio's timers, files and sockets.
    ///
    /// Each step of an op runs in a task, not in `spawn_blocking`: a
    /// synchronous body holds one of tokio's workers while it runs, so long
    /// computations belong on a [pool](Executor::pool) device (push them
    /// there and `.await` their handles from the async ops). On a
    /// current-thread runtime, ops run only while the runtime is driven (in
    /// its `block_on`). If the runtime shuts down with ops of the device
    /// still to run, those ops are dropped: their handles resolve to a
    /// failure, and their outputs are poisoned.
    ///
    /// ```
    /// use std::time::Duration;
    /// use depflow::{Engine, Executor};
    ///
    /// let rt = tokio::runtime::Runtime::new().unwrap();
    /// let engine = Engine::builder()
    ///     .device("io", Executor::tokio(rt.handle().clone()))
    ///     .build()?;
    /// let io = engine.device("io").unwrap();
    /// let v = engine.var(0u32);
    /// let k = v.key();
    /// let op = engine.op().on(io).mutates(&[&v]).run_async(move |ctx| async move {
    ///     tokio::time::sleep(Duration::from_millis(1)).await; // tokio's timer
    ///     *ctx.write(k)? += 1;
    ///     Ok::<_, depflow::BoxError>(())
    /// })?;
    /// rt.block_on(op)?; // or `.await` it inside the runtime; `op.wait()` outside
    /// # Ok::<(), depflow::Error>(())
    /// ```
    #[cfg(feature = "tokio")]
    pub fn tokio(handle: tokio::runtime::Handle) -> Self {
        Self::of(ExecutorKind::Tokio(handle))
    }

    /// A simulated GPU with `compute_streams` compute streams and two copy
    /// streams, each a host thread that runs the work
    /// [simulated](crate::stream::Stream::simulate) on it in order, and one
    /// more thread that runs every stream's host functions one at a time (as
    /// CUDA may); events complete when their stream reaches them. It runs the
    /// same launcher, event and completion code as `Executor::cuda` (feature `cuda`), so
    /// GPU programs can be tested (and their dependencies checked) on any
    /// machine. See [`Stream`](crate::stream::Stream) for an example.
    pub fn simulated_gpu(compute_streams: usize) -> Self {
        Self::of(ExecutorKind::Streams(Spec::Sim {
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
        Self::of(ExecutorKind::Streams(Spec::Cuda {
            ordinal,
            compute: compute_streams,
        }))
    }

    /// Runs `f` first thing on each thread the device runs op bodies on: a
    /// pool's workers, a stream device's launcher (as tokio's and rayon's
    /// builders' `on_thread_start`). Building the engine waits until every
    /// thread has run it (so `f` must return), and fails with
    /// [`Error::Config`](crate::Error::Config) if it panics on any, or if
    /// the executor has no threads of its own ([`inline`](Executor::inline),
    /// [`custom`](Executor::custom), `tokio`). A second
    /// call replaces the first.
    ///
    /// The use it was made for: enter an async runtime on each worker, so
    /// that the pool's async ops can await that runtime's timers and I/O.
    /// Keep the guard for the thread's life by forgetting it (the runtime's
    /// context then stays entered until the thread exits):
    ///
    /// ```
    /// use std::time::Duration;
    /// use depflow::{Engine, Executor};
    ///
    /// let rt = tokio::runtime::Runtime::new().unwrap();
    /// let handle = rt.handle().clone();
    /// let engine = Engine::builder()
    ///     .executor(Executor::pool(2).on_thread_start(move || {
    ///         std::mem::forget(handle.enter());
    ///     }))
    ///     .build()?;
    /// let v = engine.var(0u32);
    /// let k = v.key();
    /// let op = engine.push_async(&[], &[&v], move |ctx| async move {
    ///     // On a pool worker, which entered the runtime: tokio's timer works.
    ///     tokio::time::sleep(Duration::from_millis(1)).await;
    ///     *ctx.write(k)? += 1;
    ///     Ok::<_, depflow::BoxError>(())
    /// })?;
    /// op.wait()?;
    /// assert_eq!(v.version(), 1);
    /// # Ok::<(), depflow::Error>(())
    /// ```
    ///
    /// The pool's workers are then inside the runtime as far as tokio can
    /// tell, but they are not its workers: the runtime must stay up (here
    /// `rt`) for their timers and I/O to make progress.
    pub fn on_thread_start(mut self, f: impl Fn() + Send + Sync + 'static) -> Self {
        self.on_thread_start = Some(Arc::new(f));
        self
    }

    /// Builds the executor of the device named `name`.
    pub(crate) fn build(&self, name: &str) -> Result<Exec, String> {
        let hook = self.on_thread_start.as_ref();
        if hook.is_some() && !matches!(self.kind, ExecutorKind::Pool(_) | ExecutorKind::Streams(_))
        {
            return Err(format!(
                "{self:?}: only a pool or a stream device has threads of its own to run a start hook on"
            ));
        }
        Ok(match &self.kind {
            ExecutorKind::Pool(threads) => Exec::Pool(Pool::new(name, *threads, hook)?),
            ExecutorKind::Inline => Exec::Other(Box::new(Inline)),
            ExecutorKind::Custom(f) => {
                let f = f.clone();
                Exec::Other(Box::new(Custom::new(move |op| f(Job(Some(op))))))
            }
            ExecutorKind::Streams(spec) => Exec::Stream(Box::new(StreamExec {
                device: StreamDevice::new(name, spec)?,
                launcher: Pool::new(&format!("{name}-launch"), 1, hook)?,
            })),
            #[cfg(feature = "tokio")]
            ExecutorKind::Tokio(handle) => Exec::Other(Box::new(Tokio::new(handle.clone()))),
        })
    }
}

impl fmt::Debug for Executor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            ExecutorKind::Pool(n) => write!(f, "Executor::pool({n})"),
            ExecutorKind::Inline => f.write_str("Executor::inline()"),
            ExecutorKind::Custom(_) => f.write_str("Executor::custom(..)"),
            ExecutorKind::Streams(spec) => write!(f, "Executor::{spec:?}"),
            #[cfg(feature = "tokio")]
            ExecutorKind::Tokio(_) => f.write_str("Executor::tokio(..)"),
        }?;
        if self.on_thread_start.is_some() {
            f.write_str(".on_thread_start(..)")?;
        }
        Ok(())
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
/// engine.op().name("step").mutates(&[&v]).run(|_| Ok(()))?.wait()?;
/// # Ok::<(), Error>(())
/// ```
///
/// A job dropped without running fails its op ("dropped by its executor"),
/// as does one the executor's function drops while it panics: the engine
/// catches that panic, so that the other ops it was handing on proceed.
pub struct Job(Option<Runner>);

impl Job {
    /// Runs the op (one poll of its future). Returns `true` if the op woke
    /// itself while running and has already been scheduled again.
    ///
    /// Called while another job runs on this thread (the executor's function
    /// runs jobs where it gets them), it runs the op once that job returns,
    /// on this thread, and returns `false`: so a long chain of ops made
    /// ready one by the other runs one after the other, not nested.
    pub fn run(mut self) -> bool {
        exec::run_here(self.runner())
    }

    /// The op's name, if it was given one.
    pub fn name(&self) -> Option<&str> {
        self.op().name()
    }

    /// The op's priority (0 unless set).
    pub fn priority(&self) -> i32 {
        self.op().priority()
    }

    fn op(&self) -> &OpBlock {
        self.0
            .as_ref()
            .expect("a job holds its op until run")
            .metadata()
    }

    fn runner(&mut self) -> Runner {
        self.0.take().expect("a job is run once")
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        if let Some(runner) = self.0.take() {
            // Its op fails; what that releases runs after the current job.
            exec::drop_here(runner);
        }
    }
}

impl fmt::Debug for Job {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Job").field(self.op()).finish()
    }
}
