//! Configuring an engine: [`EngineBuilder`] checks the devices asked for,
//! builds their executors and starts the engine.

use std::fmt;
use std::time::Duration;

use super::Engine;
use super::diagnostics::start_watchdog;
use super::executor::{Executor, ExecutorKind};
use super::shared::{DeviceSlot, Shared};
use super::trace_window::Tracing;
use crate::dep::new_host_id;
use crate::error::Error;
use crate::trace::{
    DEFAULT_EVENTS_PER_THREAD, Diagnostics, Observer, OnHang, Recorder, Tracker, Watchdog,
};

/// The name of the default device.
///
/// ```
/// let engine = depflow::Engine::new();
/// assert_eq!(engine.device_name(engine.default_device()), Some(depflow::DEFAULT_DEVICE));
/// ```
pub const DEFAULT_DEVICE: &str = "cpu";

/// Configures an [`Engine`]: its default device's executor and any further
/// named devices.
///
/// # Environment
///
/// The default device's executor can be switched without touching the code,
/// as MXNet's `MXNET_ENGINE_TYPE=NaiveEngine` is for debugging. These are
/// read when the builder is made ([`Engine::builder`], [`Engine::new`],
/// `EngineBuilder::default()`):
///
/// | variable | values | effect |
/// | --- | --- | --- |
/// | `DEPFLOW_EXECUTOR` | `pool` (default), `inline` | `inline`: every op runs on the thread that makes it ready ([`Executor::inline`]): one op at a time, in a debugger's reach |
/// | `DEPFLOW_THREADS` | a number, at least 1 | the default pool's threads (default: one per available core) |
///
/// An explicit [`executor`](EngineBuilder::executor) or
/// [`threads`](EngineBuilder::threads) call overrides both; named
/// [devices](EngineBuilder::device) keep their executors. An empty value
/// counts as unset. Any other value makes [`build`](EngineBuilder::build)
/// fail with [`Error::Config`] naming the variable (and so
/// [`Engine::new`] panic with that message), rather than being ignored.
///
/// ```
/// use depflow::{Engine, Error, Executor};
///
/// let engine = Engine::builder()
///     .threads(2) // the default device: a pool of two threads
///     .device("gpu0", Executor::pool(1))
///     .build()?;
/// let gpu0 = engine.device("gpu0").unwrap();
/// let v = engine.new_var();
/// let ran_on = engine
///     .op()
///     .on(gpu0)
///     .mutates(&[&v])
///     .run(|_| Ok(std::thread::current().name().map(String::from)))?
///     .wait()?;
/// assert_eq!(ran_on.as_deref(), Some("depflow-gpu0-0"));
/// # Ok::<(), Error>(())
/// ```
#[derive(Debug)]
pub struct EngineBuilder {
    default: Executor,
    /// A bad `DEPFLOW_*` variable, reported by `build` unless an explicit
    /// default executor replaces what it configures.
    env_error: Option<String>,
    devices: Vec<(String, Executor)>,
    max_in_flight: usize,
    track_ops: bool,
    tracing: Tracing,
    trace_buffer: usize,
    #[cfg(feature = "tracing")]
    tracing_spans: bool,
    watchdog: Option<Duration>,
    on_hang: Option<HangCallback>,
}

/// The watchdog's callback, as the builder keeps it.
struct HangCallback(OnHang);

impl fmt::Debug for HangCallback {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("on_hang(..)")
    }
}

impl EngineBuilder {
    /// The executor of the default device, named [`DEFAULT_DEVICE`]
    /// (default: a pool with one thread per available core, unless the
    /// [environment](EngineBuilder#environment) says otherwise: this call
    /// overrides it).
    pub fn executor(mut self, executor: Executor) -> Self {
        self.default = executor;
        self.env_error = None;
        self
    }

    /// Shorthand for `.executor(Executor::pool(threads))` (overrides
    /// `DEPFLOW_EXECUTOR` and `DEPFLOW_THREADS`).
    pub fn threads(self, threads: usize) -> Self {
        self.executor(Executor::pool(threads))
    }

    /// Adds a named device with its own executor (its own threads, for a
    /// pool). Push an op to it with [`OpBuilder::on`](crate::OpBuilder::on).
    ///
    /// The name must be unique and must not contain a NUL byte (its threads
    /// are named after it); [`build`](Self::build) refuses it otherwise.
    ///
    /// ```
    /// use depflow::{Engine, Error, Executor};
    ///
    /// let bad = Engine::builder().device("gpu\0", Executor::pool(1)).build();
    /// assert!(matches!(bad, Err(Error::Config(_))));
    /// ```
    pub fn device(mut self, name: impl Into<String>, executor: Executor) -> Self {
        self.devices.push((name.into(), executor));
        self
    }

    /// Bounds the ops in flight (pushed, not finished) for producers that
    /// wait for room with [`OpBuilder::when_room`](crate::OpBuilder::when_room)
    /// (default: no bound); producers of replays with
    /// [`Graph::when_room`](crate::Graph::when_room) (a replay is one op,
    /// whatever its recorded ops), and of data-parallel steps with
    /// [`Group::when_room`](crate::parallel::Group::when_room). Plain pushes
    /// and replays never wait, but count; so do the
    /// engine's own deletions and un-poisonings, but not its waits
    /// ([`Engine::wait_for_var`]). `max_in_flight(0)` means no bound, as
    /// if it were never called.
    ///
    /// Without a bound nothing holds a producer back: every op pushed and
    /// not finished keeps its closure, what the closure captured and its
    /// variables alive, so a producer that pushes faster than the workers
    /// drain grows memory without bound (two unbounded pushers once reached
    /// 24 GB). Where producers may run ahead of the engine, set a bound and
    /// push through `when_room`. Inside an op of this engine `when_room`
    /// does not wait (see there).
    ///
    /// ```
    /// use depflow::{Engine, Error};
    ///
    /// let engine = Engine::builder().threads(1).max_in_flight(2).build()?;
    /// let v = engine.new_var();
    /// for _ in 0..100 {
    ///     // Blocks while 2 ops are in flight: memory stays flat however far
    ///     // this loop would otherwise run ahead.
    ///     engine.op().mutates(&[&v]).when_room().wait()?.run(|_| Ok(()))?;
    ///     assert!(engine.in_flight() <= 2);
    /// }
    /// # Ok::<(), Error>(())
    /// ```
    pub fn max_in_flight(mut self, ops: usize) -> Self {
        self.max_in_flight = ops;
        self
    }

    /// Keeps a registry of unfinished ops, so that
    /// [`Engine::diagnostics`] can list every unfinished op (waiting for its
    /// variables, queued, running or awaiting inside its body, and whose
    /// handles an awaiting body awaits) with how long ago it was pushed and
    /// how long it has been in its state, who holds each resource's units,
    /// who waits for whom and the [cycles](crate::Diagnostics::cycles)
    /// (default: off, unless a [watchdog](Self::watchdog) turns it on; it
    /// costs a clock read and a lock per push, per start, per completion
    /// and per suspension and resumption of an async body, and a lock per
    /// allocation of units).
    pub fn track_ops(mut self, on: bool) -> Self {
        self.track_ops = on;
        self
    }

    /// Records a [`Trace`](crate::Trace) of every op: when it was pushed,
    /// became ready, got its units, started and ended, where it ran, what
    /// it declared and which op unblocked it; see [`Tracing`] for the
    /// choices, and [`Engine::trace`] for what you get (default: off).
    ///
    /// Recording costs a clock read and an uncontended lock per step of an
    /// op, into a buffer per thread that holds the newest
    /// [`trace_buffer`](Self::trace_buffer) events (older ones are dropped
    /// and counted); no allocation per op.
    ///
    /// ```
    /// use depflow::{Engine, Tracing};
    ///
    /// let engine = Engine::builder().tracing(Tracing::On).build()?;
    /// let v = engine.new_var();
    /// engine.op().name("fill").mutates(&[&v]).run(|_| Ok(()))?.wait()?;
    /// let path = std::env::temp_dir().join("depflow-builder-trace.json");
    /// engine.trace()?.write_chrome_json(&path)?; // open it in ui.perfetto.dev
    /// # std::fs::remove_file(path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn tracing(mut self, tracing: Tracing) -> Self {
        self.tracing = tracing;
        self
    }

    /// How many events each thread's trace buffer holds (default: 65536,
    /// 48 bytes each: 3 MiB a thread; an op takes about 5 plus one per variable).
    /// When a thread records more, its oldest events go, and
    /// [`Trace::dropped_events`](crate::Trace::dropped_events) counts them.
    /// At least 1.
    pub fn trace_buffer(mut self, events_per_thread: usize) -> Self {
        self.trace_buffer = events_per_thread.max(1);
        self
    }

    /// Makes a [`tracing`](https://docs.rs/tracing) span for every op
    /// (feature `tracing`; default: off): `op`, at level `INFO`, with fields
    /// `name`, `id` (push order), `device`, `lane` (-1 off a stream
    /// device), `reads` and `mutates` (the variables, as
    /// [`VarId`](crate::VarId) prints them: `` `name` (var#N) `` for a
    /// [named](crate::Engine::var_named) one, else `var#N`). Its parent is the
    /// span current where the op was pushed; it is entered while the body
    /// runs (each poll of an async body, on its thread; on a stream device,
    /// while the body enqueues), follows from the span of the op that
    /// unblocked it, and holds `DEBUG` events `ready`, `granted` (units),
    /// `enqueued` and `ended`. Each run of a recorded op in a
    /// [replay](crate::Graph::replay) is an `op` span too, with `name`,
    /// `recorded = true`, `reads` and `mutates`, a child of the replay's
    /// op's span, entered while it runs on the thread that runs it. Spans
    /// cost a lock and the subscriber's work per step of an op; a
    /// subscriber that disables them costs one check per push (and per
    /// recorded op's run).
    ///
    /// ```
    /// # #[cfg(feature = "tracing")] {
    /// use depflow::Engine;
    ///
    /// let engine = Engine::builder().tracing_spans(true).build()?;
    /// let v = engine.new_var();
    /// // With a subscriber installed (tracing-subscriber, tracing-chrome...),
    /// // this op shows as an `op` span named "fill", inside `step`.
    /// let _step = tracing::info_span!("step").entered();
    /// engine.op().name("fill").mutates(&[&v]).run(|_| Ok(()))?.wait()?;
    /// # }
    /// # Ok::<(), depflow::Error>(())
    /// ```
    #[cfg(feature = "tracing")]
    pub fn tracing_spans(mut self, on: bool) -> Self {
        self.tracing_spans = on;
        self
    }

    /// Watches for hangs: when ops are pending but none has started or
    /// ended for `period`, the engine reports what every unfinished op
    /// waits for, as [`Engine::diagnostics`] tells it (each waiting op's
    /// chain: the variable, the op holding it, what that one waits for,
    /// resources and who holds them; and the [cycles](Diagnostics::cycles)
    /// it finds, naming their ops). By default the report goes to stderr;
    /// [`on_hang`](Self::on_hang) takes it instead. It reports once per
    /// stall: again only after an op started or ended and the engine stalled
    /// anew. Default: no watchdog.
    ///
    /// It turns [op tracking](Self::track_ops) on (it reads the registry of
    /// unfinished ops, and its count of ops started and ended), and runs a
    /// thread of its own, `depflow-watch`, which looks every quarter period
    /// (so a hang is reported within about 1.25 periods) and sleeps in
    /// between; the engine's shutdown stops and joins it (once
    /// [`Engine::shutdown`]'s wait resolves, or as the last handle is
    /// dropped), and it never keeps the engine alive.
    ///
    /// Choose a period longer than the longest op body you expect: an op
    /// that runs longer, with nothing else starting or ending meanwhile,
    /// looks like a hang. (An async body that awaits does not count as
    /// progress either; only starts and ends do.) In a
    /// [replay](crate::Graph::replay), the recorded ops that start and end
    /// are progress, so the longest recorded op counts, not the replay;
    /// they are seen at the watchdog's next look, so a replay that hangs
    /// is reported within about 1.5 periods.
    ///
    /// [`build`](Self::build) refuses a zero period.
    ///
    /// ```
    /// use std::sync::mpsc;
    /// use std::time::Duration;
    /// use depflow::{Cycle, Engine, Error};
    ///
    /// let (reports, hangs) = mpsc::channel();
    /// let reports = std::sync::Mutex::new(reports);
    /// let engine = Engine::builder()
    ///     .threads(1)
    ///     .watchdog(Duration::from_millis(100))
    ///     .on_hang(move |report| {
    ///         let _ = reports.lock().unwrap().send(report.clone());
    ///     })
    ///     .build()?;
    /// // A body blocked on a channel whose sender is an op queued behind it
    /// // on the one worker: neither can go on.
    /// let (tx, rx) = mpsc::channel::<()>();
    /// let (a, b) = (engine.new_var(), engine.new_var());
    /// let rx = std::sync::Mutex::new(rx);
    /// engine.op().name("consumer").mutates(&[&a]).run(move |_| Ok(rx.lock().unwrap().recv()?))?;
    /// let sender = tx.clone();
    /// engine.op().name("producer").mutates(&[&b]).run(move |_| {
    ///     let _ = sender.send(()); // (the consumer may be gone by then)
    ///     Ok(())
    /// })?;
    ///
    /// let report = hangs.recv_timeout(Duration::from_secs(30)).expect("reported");
    /// assert!(matches!(
    ///     &report.cycles()[0],
    ///     Cycle::Workers { running, queued, .. }
    ///         if running == &["`consumer`"] && queued == &["`producer`"]
    /// ));
    /// println!("{report}"); // as the default would print on stderr
    /// tx.send(()).unwrap(); // unblocks the consumer: both run
    /// engine.wait_all().wait()?;
    /// # Ok::<(), Error>(())
    /// ```
    pub fn watchdog(mut self, period: Duration) -> Self {
        self.watchdog = Some(period);
        self
    }

    /// What the [watchdog](Self::watchdog) calls with the report of a hang,
    /// on its own thread, instead of printing it to stderr (a log, a
    /// metric, a dump of `report.to_dot()`). A panic in it is caught and
    /// noted on stderr; the watchdog goes on. A second call replaces the
    /// first.
    ///
    /// It needs a watchdog: [`build`](Self::build) refuses an `on_hang`
    /// without one. It must not keep a clone of the [`Engine`]: that would
    /// keep the engine alive for as long as its watchdog lives, which is as
    /// long as the engine.
    pub fn on_hang(mut self, f: impl Fn(&Diagnostics) + Send + Sync + 'static) -> Self {
        self.on_hang = Some(HangCallback(Box::new(f)));
        self
    }

    /// Starts the engine.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for a pool of zero threads, a repeated device name,
    /// a device name with a NUL byte, more than 65536 devices, threads that
    /// could not be spawned, a
    /// [thread start hook](Executor::on_thread_start) that panicked or was
    /// given to an executor without threads of its own, a zero
    /// [watchdog](Self::watchdog) period or an [`on_hang`](Self::on_hang)
    /// without a watchdog, or a bad
    /// [`DEPFLOW_*` variable](EngineBuilder#environment).
    pub fn build(self) -> Result<Engine, Error> {
        if let Some(e) = self.env_error {
            return Err(Error::Config(e));
        }
        match (self.watchdog, &self.on_hang) {
            (Some(Duration::ZERO), _) => {
                return Err(Error::Config("the watchdog period must not be zero".into()));
            }
            (None, Some(_)) => {
                return Err(Error::Config(
                    "on_hang needs a watchdog: set its period with EngineBuilder::watchdog".into(),
                ));
            }
            _ => {}
        }
        let mut specs = vec![(DEFAULT_DEVICE.to_string(), self.default)];
        specs.extend(self.devices);
        if specs.len() > usize::from(u16::MAX) + 1 {
            return Err(Error::Config("too many devices".into()));
        }
        let mut devices = Vec::with_capacity(specs.len());
        for (name, executor) in &specs {
            // Every thread the engine starts for a device (pool workers, a
            // stream device's launcher, streams and poller) is named after
            // it, and a thread name cannot hold a NUL byte.
            if name.contains('\0') {
                return Err(Error::Config(format!(
                    "device {name:?}: a device name must not contain a NUL byte"
                )));
            }
            if devices.iter().any(|d: &DeviceSlot| &d.name == name) {
                return Err(Error::Config(format!("device `{name}` is defined twice")));
            }
            if devices.is_empty() && matches!(executor.kind, ExecutorKind::Streams(_)) {
                return Err(Error::Config(format!(
                    "the default device `{name}` must run on the host (a stream device's ops enqueue work): add the stream device with `device`"
                )));
            }
            if let ExecutorKind::Pool(0) = executor.kind {
                return Err(Error::Config(format!(
                    "device `{name}`: a pool needs at least one thread"
                )));
            }
            let exec = executor
                .build(name)
                .map_err(|e| Error::Config(format!("device `{name}`: {e}")))?;
            devices.push(DeviceSlot {
                name: name.clone(),
                exec,
            });
        }
        // Variables, resources and devices carry the engine's id, so that
        // another engine's are refused.
        let recorder = (self.tracing != Tracing::Off)
            .then(|| Recorder::new(self.tracing == Tracing::On, self.trace_buffer));
        // How many ops each device runs at once, where the report can tell
        // (a stream device's launcher is free while its ops' device work
        // runs, so its running ops do not count its workers).
        let workers = specs
            .iter()
            .map(|(_, e)| match e.kind {
                ExecutorKind::Pool(threads) => Some(threads),
                _ => None,
            })
            .collect();
        let tracker = (self.track_ops || self.watchdog.is_some()).then(|| Tracker::new(workers));
        let watchdog = self
            .watchdog
            .map(|period| Watchdog::new(period, self.on_hang.map(|f| f.0)));
        let observer = Observer {
            tracker,
            recorder,
            #[cfg(feature = "tracing")]
            spans: self.tracing_spans.then(|| {
                crate::trace::Spans::new(devices.iter().map(|d| d.name.clone()).collect())
            }),
            watchdog,
        }
        .boxed();
        let shared = Shared::new(
            new_host_id(),
            devices.into_boxed_slice(),
            self.max_in_flight,
            observer,
        );
        let engine = Engine::start(shared);
        start_watchdog(engine.shared())?;
        Ok(engine)
    }
}

impl Default for EngineBuilder {
    /// The default device is a pool with one thread per available core (or
    /// as the [environment](EngineBuilder#environment) says); no other
    /// device, no bound on ops in flight, no op tracking, no watchdog.
    fn default() -> Self {
        let (default, env_error) = match executor_from_env() {
            Ok(executor) => (executor, None),
            Err(e) => (Executor::inline(), Some(e)),
        };
        Self {
            default,
            env_error,
            devices: Vec::new(),
            max_in_flight: 0,
            track_ops: false,
            tracing: Tracing::Off,
            trace_buffer: DEFAULT_EVENTS_PER_THREAD,
            #[cfg(feature = "tracing")]
            tracing_spans: false,
            watchdog: None,
            on_hang: None,
        }
    }
}

/// The default device's executor, as `DEPFLOW_EXECUTOR` and `DEPFLOW_THREADS`
/// say; a message naming the variable if one is bad.
fn executor_from_env() -> Result<Executor, String> {
    fn var(name: &str) -> Result<Option<String>, String> {
        match std::env::var(name) {
            Ok(v) if v.trim().is_empty() => Ok(None),
            Ok(v) => Ok(Some(v.trim().to_string())),
            Err(std::env::VarError::NotPresent) => Ok(None),
            Err(std::env::VarError::NotUnicode(v)) => Err(format!("{name}={v:?}: not unicode")),
        }
    }
    let threads = match var("DEPFLOW_THREADS")? {
        None => None,
        Some(v) => match v.parse::<usize>() {
            Ok(n) if n > 0 => Some(n),
            _ => {
                return Err(format!(
                    "DEPFLOW_THREADS={v:?}: expected a number of threads, at least 1"
                ));
            }
        },
    };
    let pool = || {
        Executor::pool(
            threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, usize::from)),
        )
    };
    match var("DEPFLOW_EXECUTOR")?.as_deref() {
        None => Ok(pool()),
        Some(kind) if kind.eq_ignore_ascii_case("pool") => Ok(pool()),
        Some(kind) if kind.eq_ignore_ascii_case("inline") => Ok(Executor::inline()),
        Some(kind) => Err(format!(
            "DEPFLOW_EXECUTOR={kind:?}: expected `pool` or `inline`"
        )),
    }
}
