//! Errors: what a push, a wait or an op can resolve to, and the names they
//! use ([`VarId`]). The crate's vocabulary: every layer reports in these
//! terms, so this module imports nothing of the crate.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

pub(crate) mod names;

/// A variable's identity, unique in the process; used in errors.
///
/// It prints as `var#N`, or, for a variable made with a name
/// ([`Engine::var_named`](crate::Engine::var_named)), as
/// `` `name` (var#N) `` while that variable is alive: an id is a plain
/// number, and the name is looked up when it is printed (see
/// [`name`](Self::name)).
///
/// ```
/// let engine = depflow::Engine::new();
/// let (a, b) = (engine.new_var(), engine.new_var());
/// assert_ne!(a.id(), b.id());
/// assert_eq!(a.id(), a.clone().id());
/// println!("{}", a.id()); // "var#N"
/// let w = engine.var_named("fc1.weight", vec![0f32; 4]);
/// assert!(w.id().to_string().starts_with("`fc1.weight` (var#"));
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct VarId(pub(crate) u64);

impl VarId {
    /// The variable's name, if it was given one and is still alive.
    ///
    /// ```
    /// let engine = depflow::Engine::new();
    /// let w = engine.var_named("fc1.weight", 0u8);
    /// let id = w.id();
    /// assert_eq!(id.name().as_deref(), Some("fc1.weight"));
    /// assert_eq!(engine.new_var().id().name(), None);
    /// drop(w); // freed: the name goes with it
    /// assert_eq!(id.name(), None);
    /// ```
    pub fn name(&self) -> Option<Arc<str>> {
        names::lookup(*self)
    }
}

impl fmt::Display for VarId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => write!(f, "`{name}` (var#{})", self.0),
            None => write!(f, "var#{}", self.0),
        }
    }
}

impl fmt::Debug for VarId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// A boxed error returned by an op's body: any error type an op returns is
/// converted into it.
///
/// ```
/// let e: depflow::BoxError = "shape mismatch".into();
/// assert_eq!(e.to_string(), "shape mismatch");
/// ```
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// The original failure of an op: its name and what went wrong.
///
/// Shared (behind an [`Arc`]) by every error it causes: the failing op's own
/// [`Error::Failed`], and the [`Error::Poisoned`] of every op skipped because
/// of it.
///
/// ```
/// use depflow::{Engine, Error};
///
/// let engine = Engine::new();
/// let v = engine.new_var();
/// let err = engine
///     .op()
///     .name("decode")
///     .mutates(&[&v])
///     .run(|_| Err::<(), _>(std::io::Error::other("truncated file").into()))?
///     .wait()
///     .unwrap_err();
/// let failure = err.failure().unwrap();
/// assert_eq!(failure.op_name(), Some("decode"));
/// assert_eq!(failure.message(), "truncated file");
/// assert!(!failure.is_panic());
/// assert!(failure.op_error().unwrap().downcast_ref::<std::io::Error>().is_some());
/// # let _ = engine.wait_all().wait();
/// # Ok::<(), Error>(())
/// ```
pub struct OpFailure {
    op: Option<Cow<'static, str>>,
    kind: FailureKind,
}

pub(crate) enum FailureKind {
    /// The body returned an error.
    Error(BoxError),
    /// The body panicked; the payload's message.
    Panic(String),
    /// The executor dropped the op before it finished.
    Dropped,
    /// A variable the op touches was deleted before it ran.
    InputDeleted(VarId),
    /// The op's device work failed (a CUDA error, or a host function's).
    Device(String),
    /// The op was cancelled through its handle before it started.
    Cancelled,
}

impl OpFailure {
    pub(crate) fn new(op: Option<Cow<'static, str>>, kind: FailureKind) -> Self {
        Self { op, kind }
    }

    /// The failing op's name, if it was given one.
    pub fn op_name(&self) -> Option<&str> {
        self.op.as_deref()
    }

    /// Whether the op panicked (rather than returning an error).
    pub fn is_panic(&self) -> bool {
        matches!(self.kind, FailureKind::Panic(_))
    }

    /// The error the op returned, if it returned one.
    pub fn op_error(&self) -> Option<&(dyn std::error::Error + Send + Sync + 'static)> {
        match &self.kind {
            FailureKind::Error(e) => Some(e.as_ref()),
            _ => None,
        }
    }

    /// What went wrong, without the op's name: for an op that returned an
    /// error, that error's message (its own, without its sources).
    pub fn message(&self) -> String {
        match &self.kind {
            FailureKind::Error(e) => e.to_string(),
            FailureKind::Panic(msg) => format!("panicked: {msg}{}", runtime_hint(msg)),
            FailureKind::Dropped => "dropped by its executor before it finished".into(),
            FailureKind::InputDeleted(var) => format!("{var} was deleted before the op ran"),
            FailureKind::Device(message) => format!("device error: {message}"),
            FailureKind::Cancelled => "cancelled before it ran".into(),
        }
    }
}

/// ``op `name` failed: <message>`` (``unnamed op failed: <message>``),
/// whatever went wrong: the [`message`](OpFailure::message) is the op's
/// error's own, for an op that returned one, so the plain text says what
/// failed as for a panic. That error's sources are not printed: they are
/// this failure's [`source`](std::error::Error::source) chain.
impl fmt::Display for OpFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.op {
            Some(name) => write!(f, "op `{name}` failed: ")?,
            None => f.write_str("unnamed op failed: ")?,
        }
        match &self.kind {
            // Written straight from the error: no string built.
            FailureKind::Error(e) => write!(f, "{e}"),
            _ => f.write_str(&self.message()),
        }
    }
}

/// The source is the source of the error the op returned (if it returned
/// one, and that error has a source), not that error itself: its message is
/// already in this failure's `Display`, and a chain printer (`anyhow`'s
/// `{:#}`, a loop over `source()`) would print it twice. Reach the op's
/// error itself, to downcast it, with [`op_error`](OpFailure::op_error).
impl std::error::Error for OpFailure {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.op_error()?.source()
    }
}

impl fmt::Debug for OpFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpFailure")
            .field("op", &self.op)
            .field("message", &self.message())
            .finish()
    }
}

/// Everything that can go wrong in depflow.
///
/// Errors are cheap to clone: failures are shared behind an [`Arc`].
///
/// ```
/// use depflow::{Engine, Error};
///
/// let engine = Engine::new();
/// let (a, b) = (engine.new_var(), engine.new_var());
/// engine.op().name("load").mutates(&[&a]).run(|_| Err::<(), _>("disk full".into()))?;
/// // Reads `a`, which "load" poisoned: does not run.
/// let skipped = engine.push(&[&a], &[&b], |_| Ok(()))?.wait();
/// match skipped {
///     Err(Error::Poisoned { input, cause }) => {
///         assert_eq!(input, a.id()); // the input that carried the poison
///         assert_eq!(cause.op_name(), Some("load"));
///     }
///     other => panic!("{other:?}"),
/// }
/// # let _ = engine.wait_all().wait();
/// # Ok::<(), Error>(())
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum Error {
    /// The op ran and returned an error or panicked (or its executor dropped
    /// it). The variables it mutates are now poisoned by this failure.
    Failed(Arc<OpFailure>),
    /// The op did not run: a variable it touches (`input`) was poisoned by an
    /// earlier failure (`cause`). The variables it mutates are poisoned by
    /// the same failure.
    Poisoned {
        /// The variable whose poison made the op skip: the first poisoned
        /// one the op's check of its inputs met (those it mutates come
        /// first, then those it reads, each in the order declared). For an
        /// op on a stream device whose work ran behind failed device work,
        /// the variable that failed work wrote.
        input: VarId,
        /// The original failure.
        cause: Arc<OpFailure>,
    },
    /// The variable has been deleted with [`Engine::delete_var`](crate::Engine::delete_var).
    Deleted(VarId),
    /// The variable was created by another engine.
    ForeignVar(VarId),
    /// The engine is shut down and takes no new work.
    ShutDown,
    /// An op must declare at least one variable it reads or mutates.
    NoVars,
    /// A blocking wait was called inside an op, where it could stall the very
    /// executor that has to make progress; `.await` the wait instead.
    BlockingInOp,
    /// A blocking wait was called on a thread inside an async runtime (a
    /// tokio runtime, with the `tokio` feature) before its work was done:
    /// blocking there could stall the very runtime that work needs, as
    /// tokio's own `block_on` refuses to. `.await` the wait instead. See
    /// [`OpHandle::wait`](crate::OpHandle::wait) for what is and is not
    /// detected.
    BlockingInRuntime,
    /// A wait with a deadline ([`OpHandle::wait_timeout`](crate::OpHandle::wait_timeout),
    /// [`Wait::wait_timeout`](crate::Wait::wait_timeout),
    /// [`Engine::shutdown_timeout`](crate::Engine::shutdown_timeout)) ran out
    /// of time. The wait itself is still good: wait or `.await` it again.
    TimedOut {
        /// How long it waited.
        waited: std::time::Duration,
        /// The engine's ops still in flight at the deadline, for waits on
        /// the whole engine (`wait_all`, shutdown).
        in_flight: Option<usize>,
    },
    /// A wait inside an op would wait for that op itself (`wait_all` of
    /// its own engine, `wait_for_var` on a variable the op declared, or
    /// `when_room` with no room besides the op).
    WaitsForItself,
    /// The op body accessed a variable it did not declare.
    NotDeclared(VarId),
    /// The op body asked to mutate a variable it only declared as read.
    NotMutable(VarId),
    /// The op body asked for a variable that it is already borrowing in a
    /// conflicting way (two mutable borrows, or shared and mutable).
    Borrowed(VarId),
    /// The op was cancelled ([`OpHandle::cancel`](crate::OpHandle::cancel))
    /// before it started: its body never ran.
    Cancelled,
    /// [`Engine::wait_all`](crate::Engine::wait_all) found ops that failed
    /// since the previous `wait_all`: the first one and how many.
    Failures {
        /// The first failure recorded.
        first: Arc<OpFailure>,
        /// How many failures were recorded.
        count: usize,
    },
    /// An op asked for more units of a resource than it has: it could never
    /// run.
    OverCapacity {
        /// The resource's name.
        resource: String,
        /// The units the op asked for (all its declarations together).
        requested: u64,
        /// The resource's capacity.
        capacity: u64,
    },
    /// The resource (named here) was created by another engine.
    ForeignResource(String),
    /// The engine could not be built as configured.
    Config(String),
    /// A file could not be written (a trace, say): which, and why (also
    /// the error's `source`).
    Io {
        /// The file.
        path: std::path::PathBuf,
        /// What the system said.
        source: Arc<std::io::Error>,
    },
    /// A misuse of a stream device, or a call its device refused: a lane
    /// the device does not have, an async body on a stream device,
    /// [`OpCtx::stream`](crate::OpCtx::stream) off one, a failed enqueue.
    Stream(String),
    /// The variable is an intermediate of a recorded graph
    /// ([`Recorder::var`](crate::Recorder::var)): only that graph's ops
    /// may declare it, not a pushed op nor another graph's.
    GraphOwned(VarId),
    /// A misuse of a recording ([`Engine::record`](crate::Engine::record))
    /// or of a graph's replay: recording inside an op, an op the recording
    /// cannot replay (an async body, a stream lane, resource units), a
    /// planned buffer read before anything wrote it; the message says which.
    Graph(String),
    /// A collective across processes (the `mpi` feature, `Communicator`)
    /// that cannot be carried out:
    /// caught before it was issued (a root out of range, buffers whose
    /// lengths do not fit the number of ranks, the communicator shut down),
    /// or MPI's own error. As an op's error, inside
    /// [`Failed`](Error::Failed) (its `source`).
    Collective(String),
    /// A misuse of a data-parallel group ([`parallel`](crate::parallel)):
    /// duplicate devices, replicas of different shapes, an empty batch or
    /// one that does not split evenly; the message says which.
    Parallel(String),
    /// An array operation (`depflow::nd`, feature `nd`) whose operands
    /// do not fit: shapes that do not broadcast or multiply, an axis out
    /// of range, arrays on different devices or engines. `op` names the
    /// operation, `message` the operands (both shapes).
    Array {
        /// The operation (`"add"`, `"matmul"`, ...).
        op: &'static str,
        /// What did not fit, with the operands' shapes. (A `Box<str>`, not
        /// a `String`: it keeps `Error` at 40 bytes, the size every
        /// `Result` of a push carries.)
        message: Box<str>,
    },
    /// The closure given to [`Engine::record`](crate::Engine::record)
    /// returned an error of its own (not a depflow `Error`, which comes
    /// back as itself): the recording was dropped. It prints the error's
    /// message; its `source` is that error's own source.
    Recording(Arc<dyn std::error::Error + Send + Sync>),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Failed(failure) => write!(f, "{failure}"),
            Error::Poisoned { input, cause } => {
                write!(f, "skipped: input {input} was poisoned because {cause}")
            }
            Error::Deleted(var) => write!(f, "{var} has been deleted"),
            Error::ForeignVar(var) => write!(f, "{var} belongs to another engine"),
            Error::ShutDown => f.write_str("the engine is shut down"),
            Error::Cancelled => f.write_str("the op was cancelled before it ran"),
            Error::NoVars => f.write_str("an op must declare at least one variable"),
            Error::BlockingInOp => f.write_str(
                "blocking wait inside an op (it could deadlock the executor); use .await",
            ),
            Error::BlockingInRuntime => f.write_str(
                "blocking wait inside an async runtime (it could stall the runtime the awaited work needs); use .await",
            ),
            Error::TimedOut { waited, in_flight } => {
                write!(f, "timed out after {waited:?}")?;
                match in_flight {
                    Some(n) => write!(f, " with {n} op(s) still in flight"),
                    None => Ok(()),
                }
            }
            Error::WaitsForItself => {
                f.write_str("this wait inside an op would wait for the op itself")
            }
            Error::NotDeclared(var) => write!(f, "the op did not declare {var}"),
            Error::NotMutable(var) => write!(f, "the op declared {var} as read, not mutated"),
            Error::Borrowed(var) => write!(f, "{var} is already borrowed by this op"),
            Error::Failures { first, count } => {
                write!(f, "{count} op(s) failed; the first: {first}")
            }
            Error::OverCapacity {
                resource,
                requested,
                capacity,
            } => write!(
                f,
                "the op needs {requested} units of `{resource}`, which has only {capacity}"
            ),
            Error::ForeignResource(name) => {
                write!(f, "resource `{name}` belongs to another engine")
            }
            Error::Config(msg) => write!(f, "invalid engine configuration: {msg}"),
            Error::Stream(msg) => write!(f, "stream device: {msg}"),
            Error::Io { path, .. } => write!(f, "could not write {}", path.display()),
            Error::GraphOwned(var) => write!(
                f,
                "{var} is an intermediate of a recorded graph: only its graph's ops may declare it"
            ),
            Error::Graph(msg) => write!(f, "recorded graph: {msg}"),
            Error::Collective(msg) => write!(f, "collective: {msg}"),
            Error::Parallel(msg) => write!(f, "data-parallel group: {msg}"),
            Error::Array { op, message } => write!(f, "{op}: {message}"),
            Error::Recording(e) => write!(f, "recording: {e}"),
        }
    }
}

/// For [`Failed`](Error::Failed), [`Poisoned`](Error::Poisoned) and
/// [`Failures`](Error::Failures), `Display` says what the failing op's own
/// error said (see [`OpFailure`]'s), and the source is the same as
/// [`OpFailure`]'s: the source of that error, not the error itself (whose
/// message is printed already), so a chain printer shows each message once
/// and goes on to the deeper causes. [`OpFailure::op_error`] (through
/// [`failure`](Error::failure)) gives the op's error itself, to downcast.
/// For [`Io`](Error::Io), the source is the system's error, whose message
/// `Display` leaves to the chain.
///
/// ```
/// use depflow::{Engine, Error};
///
/// #[derive(Debug)]
/// struct Corrupt(std::io::Error);
/// impl std::fmt::Display for Corrupt {
///     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
///         f.write_str("corrupt input") // its cause is its source
///     }
/// }
/// impl std::error::Error for Corrupt {
///     fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
///         Some(&self.0)
///     }
/// }
///
/// let engine = Engine::new();
/// let v = engine.new_var();
/// let err = engine
///     .op()
///     .name("decode")
///     .mutates(&[&v])
///     .run(|_| Err::<(), _>(Corrupt(std::io::Error::other("truncated file")).into()))?
///     .wait()
///     .unwrap_err();
/// assert_eq!(err.to_string(), "op `decode` failed: corrupt input");
/// // The chain goes on to the op's error's cause.
/// let source = std::error::Error::source(&err).unwrap();
/// assert_eq!(source.to_string(), "truncated file");
/// assert!(source.source().is_none());
/// // The op's error itself, to downcast.
/// let op_error = err.failure().unwrap().op_error().unwrap();
/// assert!(op_error.downcast_ref::<Corrupt>().is_some());
/// # let _ = engine.wait_all().wait();
/// # Ok::<(), Error>(())
/// ```
impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io { source, .. } => return Some(&**source),
            Error::Recording(e) => return e.source(),
            _ => {}
        }
        std::error::Error::source(&**self.failure()?)
    }
}

impl Error {
    /// A caller's error returned through the engine (by a recording's
    /// closure): a depflow `Error` as itself, any other in
    /// [`Recording`](Error::Recording).
    pub(crate) fn from_caller(e: BoxError) -> Self {
        match e.downcast::<Error>() {
            Ok(e) => *e,
            Err(e) => Error::Recording(Arc::from(e)),
        }
    }

    /// The original failure behind this error, for [`Failed`](Error::Failed),
    /// [`Poisoned`](Error::Poisoned) and [`Failures`](Error::Failures).
    pub fn failure(&self) -> Option<&Arc<OpFailure>> {
        match self {
            Error::Failed(f) | Error::Poisoned { cause: f, .. } => Some(f),
            Error::Failures { first, .. } => Some(first),
            _ => None,
        }
    }
}

/// What tokio says when one of its timers, files or sockets, or a spawn, is
/// used on a thread outside its runtime (tokio 1.x; its messages begin so).
const NO_TOKIO_RUNTIME: [&str; 2] = [
    "there is no reactor running",
    "must be called from the context of a Tokio 1.x runtime",
];

/// For a panic's message that says an op needed a tokio runtime and ran
/// outside one (an op awaiting a tokio timer on the default pool, say):
/// the remedies of the README's "Async runtimes". Looked for when the
/// failure's message is made, so only a panic that is printed pays.
fn runtime_hint(panic: &str) -> &'static str {
    if NO_TOKIO_RUNTIME.iter().any(|m| panic.contains(m)) {
        " (hint: the op ran outside a tokio runtime: put it on a tokio device, \
         `EngineBuilder::device(\"io\", Executor::tokio(handle))` (feature `tokio`) \
         and the op's `.on(io)`, or enter the runtime on the pool's threads, \
         `Executor::pool(n).on_thread_start(move || std::mem::forget(handle.enter()))`)"
    } else {
        ""
    }
}

/// The message of a caught panic's payload.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&'static str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
    }
}
