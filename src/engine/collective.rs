//! Collectives across processes as ops (the `mpi` feature): the
//! [`Communicator`] handle and its op builder, [`CollectiveOp`].
//!
//! A collective is an ordinary op: it declares the variables it reads and
//! mutates, waits for the ops before it on them, poisons its outputs when
//! it fails and is skipped on a poisoned input. Its body is async: it moves
//! the variable's `Vec` into the backend (`device::comm`), which issues the
//! non-blocking MPI call once every collective pushed before it on this
//! communicator was issued, and awaits the completion that the backend's
//! progress thread (`MPI_Testsome`) wakes. No thread blocks per collective;
//! the body runs on the communicator's device (the engine's default one
//! unless [`Communicator::on`]), briefly, twice: to issue and to put the
//! buffer back.
//!
//! Owns nothing but the handle; the order, the threads and the MPI calls
//! are the backend's.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Instant;

use mpi::traits::{AsRaw, Equivalence};

use super::facade::Engine;
use super::handle::OpHandle;
use crate::dep::{Device, OpCtx, Var, VarKey};
pub use crate::device::comm::ReduceOp;
use crate::device::comm::{Collective, Comm, Reason, Ticket};
use crate::error::{BoxError, Error};

/// An MPI communicator whose collectives are pushed as engine ops (the `mpi`
/// feature).
///
/// `all_reduce`, `broadcast` and `all_gather` build ops over `Var<Vec<T>>`
/// (`T` any of MPI's basic types: `f32`, `f64`, the integers); they are
/// issued as non-blocking MPI calls and completed by one progress thread
/// per communicator that tests the outstanding requests, so collectives
/// overlap computation and each other.
///
/// **Program order.** MPI requires every rank to issue a communicator's
/// collectives in the same order. Each collective takes its place in that
/// order when it is pushed; it is issued only after every collective pushed
/// before it (on this communicator) was, whatever order their inputs become
/// ready in. So push a communicator's collectives from one thread, in the
/// same order on every rank (as an MPI program calls them).
///
/// **Large all-reduces.** From 64 KiB on 2 ranks or more, an all-reduce is
/// the engine's own ring of point-to-point calls (`MPI_Isend`/`MPI_Irecv`,
/// reduce-scatter then all-gather, each chunk folded with
/// `MPI_Reduce_local`), stepped by the progress thread, rather than
/// `MPI_Iallreduce`: Open MPI's default non-blocking algorithm takes about
/// twice its blocking `MPI_Allreduce` there on 2 ranks. Every rank ends with
/// the same bits; the order of the reduction is the ring's (chunk `c`
/// folds from rank `c` around the ring), so a float sum may differ in its
/// last bits from `MPI_Allreduce`'s.
///
/// **A failure on one rank.** A collective whose op does not run on some
/// rank (a poisoned or deleted input, cancelled) or refuses it there (an
/// all-gather output of the wrong length) still takes its part on that
/// rank: a stand-in issues the MPI calls with a zeroed buffer, and every
/// collective carries a small status word (an `MPI_Iallreduce` of four
/// `i64`s, issued just before its data) that tells every rank whether some
/// rank failed. So the collective fails on *every* rank: its handle
/// resolves to [`Error::Failed`] whose failure's
/// [`source`](std::error::Error::source) is [`Error::Collective`], naming
/// the lowest failing rank and carrying its
/// own failure in words, up to 256 bytes (cut with an ellipsis), e.g.
/// ``grad: rank 1 failed its part (its op did not run: input `x` (var#7)
/// was poisoned because op `load` failed: NaN on rank 1): …`` (that rank
/// itself reports its own failure), its outputs poisoned, and the ranks
/// stay in step for the collectives after it: a failure propagates instead
/// of leaving the other ranks waiting forever in MPI. The words cost one
/// more small broadcast, made only when a rank failed.
///
/// **Ranks out of step.** Each collective's status word also carries its
/// [`tag`](CollectiveOp::tag): collectives paired across ranks with
/// different tags fail on every rank instead of computing with each
/// other's data.
///
/// **MPI's setup.** MPI must be initialised with
/// [`Threading::Serialized`](mpi::Threading::Serialized) at least (every
/// call this communicator makes is under one lock; use `Multiple` if the
/// program calls MPI itself on other threads meanwhile). The communicator
/// is duplicated, so the program's own collectives on it never mix with the
/// engine's, and the duplicate has `MPI_ERRORS_RETURN`: an MPI error fails
/// the op (and poisons its outputs) instead of aborting the job. MPI
/// itself recovers from nothing (Open MPI 4.1 has no fault tolerance): a
/// crashed or exited process makes `mpirun` abort the whole job; an error
/// MPI returns is reported, not repaired, and one returned on a single
/// rank only at issue leaves the other ranks waiting in that collective,
/// so treat an MPI error as the end of the job. A root out of range is
/// refused at push (the same on every rank). Lengths that differ between
/// ranks cannot be seen locally: MPI may report them (a truncation) or
/// not, and where they put one rank's all-reduce on either side of 64 KiB
/// the ranks make different calls and wait for each other.
///
/// **A rank that panics.** Its `MPI_Finalize` (rsmpi's `Universe` drop)
/// waits for the other ranks, which wait in their collectives: the job
/// ends only at their own timeouts. With
/// [`abort_on_panic`](Communicator::abort_on_panic), a panic that unwinds
/// through the communicator aborts the whole job at once (`MPI_Abort`).
///
/// **Shutdown.** [`shutdown`](Communicator::shutdown) (or the drop of the
/// last handle, after the last op that uses it) lets the collectives in
/// flight complete, frees the duplicate, and must come before MPI is
/// finalised (the drop of rsmpi's `Universe`): drop the communicator, and
/// shut the engine down, before the `Universe`.
///
/// **rsmpi beside it.** depflow re-exports the rsmpi crate it is built
/// against as [`depflow::mpi`](crate::mpi): use that to initialise MPI and
/// make the communicator, rather than a dependency of your own on `mpi`
/// (whose types are depflow's only at exactly depflow's version, 0.8.2).
/// rsmpi's `Communicator` trait (for `rank()`, `size()` and its own
/// collectives on `world`) has this type's name: import it unnamed, as
/// below, or under another name:
///
/// ```no_run
/// use depflow::mpi::topology::Communicator as MpiCommunicator;
/// use depflow::{Communicator, Engine};
///
/// fn ranks(world: &impl MpiCommunicator) -> i32 {
///     world.size()
/// }
///
/// let (universe, _) =
///     depflow::mpi::initialize_with_threading(depflow::mpi::Threading::Serialized).unwrap();
/// let world = universe.world();
/// let engine = Engine::new();
/// let comm = Communicator::new(&engine, &world)?;
/// assert_eq!(comm.size(), ranks(&world) as usize);
/// # Ok::<(), depflow::Error>(())
/// ```
///
/// An all-reduce, and the unnamed import:
///
/// ```no_run
/// use depflow::mpi::traits::Communicator as _;
/// use depflow::{Communicator, Engine, mpi};
///
/// let (universe, _) = mpi::initialize_with_threading(mpi::Threading::Multiple).unwrap();
/// let world = universe.world();
/// let engine = Engine::new();
/// let comm = Communicator::new(&engine, &world)?;
/// let grad = engine.var(vec![world.rank() as f32; 4]);
/// comm.all_reduce(&grad).name("grad sum").push()?.wait()?;
/// let n = comm.size() as f32;
/// assert_eq!(engine.get(&grad).wait()?, vec![n * (n - 1.0) / 2.0; 4]);
/// comm.shutdown()?;
/// # Ok::<(), depflow::Error>(())
/// ```
#[derive(Clone)]
pub struct Communicator {
    engine: Engine,
    comm: Arc<Comm>,
    device: Option<Device>,
    /// Abort the job when a panic unwinds through this handle
    /// ([`abort_on_panic`](Communicator::abort_on_panic)).
    abort_on_panic: bool,
}

impl Drop for Communicator {
    fn drop(&mut self) {
        if self.abort_on_panic && std::thread::panicking() {
            eprintln!(
                "depflow: rank {} panicked holding its Communicator: aborting the MPI job \
                 (Communicator::abort_on_panic)",
                self.comm.rank()
            );
            self.comm.abort(134);
        }
    }
}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Communicator")
            .field("rank", &self.rank())
            .field("size", &self.size())
            .finish_non_exhaustive()
    }
}

impl Communicator {
    /// Duplicates `comm` for `engine`'s collectives and starts its progress
    /// thread.
    ///
    /// # Errors
    ///
    /// [`Error::Collective`] if MPI is not initialised (or is finalised),
    /// was initialised with less than `Serialized` threading, refuses the
    /// duplicate, or is a library whose `MPI_IN_PLACE` is not known (Open
    /// MPI and MPICH derivatives are).
    pub fn new<C>(engine: &Engine, comm: &C) -> Result<Self, Error>
    where
        C: mpi::traits::Communicator + AsRaw<Raw = mpi::ffi::MPI_Comm>,
    {
        let comm = Comm::new("depflow", comm.as_raw()).map_err(Error::Collective)?;
        Ok(Self {
            engine: engine.clone(),
            comm: Arc::new(comm),
            device: None,
            abort_on_panic: false,
        })
    }

    /// Aborts the whole MPI job (`MPI_Abort`) when a panic unwinds through
    /// this handle (or a clone made after this call): a rank whose main
    /// thread panics then takes the job down at once, instead of leaving
    /// the other ranks waiting in their collectives for their own timeouts
    /// (the panicking rank's `MPI_Finalize`, in rsmpi's `Universe` drop,
    /// waits for them too). This is what Open MPI programs do with
    /// `MPI_Abort`; without it a panic is the process's own business.
    ///
    /// Only a panic that unwinds through the handle counts: a body's panic
    /// that the engine catches (it fails the op) does not, unless the body
    /// owned a handle. The job ends with `mpirun` reporting the abort
    /// (exit code 134) after the panic's message.
    ///
    /// ```no_run
    /// use depflow::mpi::traits::Communicator as _;
    /// use depflow::{Communicator, Engine, mpi};
    ///
    /// let (universe, _) = mpi::initialize_with_threading(mpi::Threading::Multiple).unwrap();
    /// let world = universe.world();
    /// let engine = Engine::new();
    /// let comm = Communicator::new(&engine, &world)?.abort_on_panic();
    /// let grad = engine.var(vec![1.0f32; 4]);
    /// if world.rank() == 1 {
    ///     panic!("rank 1 gives up"); // every rank ends now, not at a timeout
    /// }
    /// comm.all_reduce(&grad).push()?.wait()?;
    /// # Ok::<(), depflow::Error>(())
    /// ```
    pub fn abort_on_panic(mut self) -> Self {
        self.abort_on_panic = true;
        self
    }

    /// Runs the collectives' bodies (issue, then put the buffer back) on
    /// `device` rather than the engine's default device. On an
    /// [inline](crate::Executor::inline) device the progress thread that
    /// sees a collective complete finishes its op itself, with no hand-off
    /// to a pool worker (`benches/mpi_allreduce.rs` uses one).
    pub fn on(mut self, device: Device) -> Self {
        self.device = Some(device);
        self
    }

    /// This process's rank in the communicator.
    pub fn rank(&self) -> usize {
        self.comm.rank()
    }

    /// How many ranks the communicator has.
    pub fn size(&self) -> usize {
        self.comm.size()
    }

    /// Reduces `var` in place across ranks (a sum unless
    /// [`reduce`](CollectiveOp::reduce) says otherwise): every rank ends
    /// with the same values. Mutates `var`.
    pub fn all_reduce<'a, T>(&'a self, var: &'a Var<Vec<T>>) -> CollectiveOp<'a, T>
    where
        T: Equivalence + Copy + Send + Sync + 'static,
    {
        self.build(Kind::AllReduce(ReduceOp::Sum), var, None)
    }

    /// Overwrites `var` on every rank with rank `root`'s value. Mutates
    /// `var`; every rank's must have the same length.
    pub fn broadcast<'a, T>(&'a self, var: &'a Var<Vec<T>>, root: usize) -> CollectiveOp<'a, T>
    where
        T: Equivalence + Copy + Send + Sync + 'static,
    {
        self.build(Kind::Broadcast(root), var, None)
    }

    /// Concatenates every rank's `input`, in rank order, into `output` on
    /// every rank. Reads `input`, mutates `output`: an empty `output` is
    /// sized to `size() * input.len()`; any other length must be that.
    pub fn all_gather<'a, T>(
        &'a self,
        input: &'a Var<Vec<T>>,
        output: &'a Var<Vec<T>>,
    ) -> CollectiveOp<'a, T>
    where
        T: Equivalence + Copy + Send + Sync + 'static,
    {
        self.build(Kind::AllGather, output, Some(input))
    }

    fn build<'a, T>(
        &'a self,
        kind: Kind,
        var: &'a Var<Vec<T>>,
        input: Option<&'a Var<Vec<T>>>,
    ) -> CollectiveOp<'a, T> {
        CollectiveOp {
            comm: self,
            kind,
            var,
            input,
            name: None,
            priority: 0,
            tag: 0,
        }
    }

    /// Stops issuing collectives (those not issued yet fail), completes
    /// those in flight (the other ranks must take part), and frees the
    /// duplicated communicator; waits 10 s at most. Later collectives fail
    /// with [`Error::Collective`]. Call it before MPI is finalised; the
    /// drop of the last handle does the same.
    ///
    /// # Errors
    ///
    /// [`Error::Collective`] saying how many collectives were still in
    /// flight at the deadline: their buffers are left to the progress
    /// thread (MPI may still write them), and MPI must not be finalised
    /// under them.
    pub fn shutdown(&self) -> Result<(), Error> {
        self.comm
            .shutdown(Instant::now() + crate::device::SHUTDOWN_DEADLINE)
            .map_err(|n| Error::Collective(format!("{n} collective(s) still in flight")))
    }
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    AllReduce(ReduceOp),
    Broadcast(usize),
    AllGather,
}

/// A collective being described ([`Communicator::all_reduce`],
/// [`broadcast`](Communicator::broadcast),
/// [`all_gather`](Communicator::all_gather)); [`push`](CollectiveOp::push)
/// pushes it.
#[derive(Debug)]
#[must_use = "a CollectiveOp does nothing until `push`"]
pub struct CollectiveOp<'a, T> {
    comm: &'a Communicator,
    kind: Kind,
    /// The variable mutated (reduced, broadcast into, gathered into).
    var: &'a Var<Vec<T>>,
    /// An all-gather's input.
    input: Option<&'a Var<Vec<T>>>,
    name: Option<Cow<'static, str>>,
    priority: i32,
    tag: u64,
}

impl<T> CollectiveOp<'_, T>
where
    T: Equivalence + Copy + Send + Sync + 'static,
{
    /// Names the op (its failures and traces say it).
    pub fn name(mut self, name: impl Into<Cow<'static, str>>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// The op's priority among ready ops ([`OpBuilder::priority`](crate::OpBuilder::priority)).
    /// It orders when the op's body runs, not the issue order, which is
    /// the push order (see [`Communicator`]).
    pub fn priority(mut self, priority: i32) -> Self {
        self.priority = priority;
        self
    }

    /// Tags the collective (default 0): every rank must give the
    /// collective it pairs with the same tag, a step number, say. The
    /// status word carries it, so collectives whose tags differ across
    /// ranks (some rank skipped or added a collective before this one: the
    /// ranks are out of step) fail on every rank ([`Error::Failed`], with
    /// an [`Error::Collective`] saying so as its source), their outputs
    /// poisoned, instead of
    /// computing with another collective's data. A
    /// [`Group`](crate::parallel::Group) across ranks tags its collectives
    /// with its step number (from 1).
    ///
    /// It detects, it cannot repair: the data calls were issued meanwhile,
    /// and ranks out of step stay so (the collectives after fail too, and
    /// the last ones of the rank with more wait for a partner). Of
    /// different shapes (a broadcast paired with an all-reduce, other
    /// lengths), MPI may refuse them or wait in them.
    ///
    /// ```no_run
    /// # fn f(engine: &depflow::Engine, comm: &depflow::Communicator) -> Result<(), depflow::Error> {
    /// let grad = engine.var(vec![1.0f32; 4]);
    /// for step in 1..=10 {
    ///     // ... the step's ops on `grad` ...
    ///     comm.all_reduce(&grad).tag(step).push()?;
    /// }
    /// # Ok(()) }
    /// ```
    pub fn tag(mut self, tag: u64) -> Self {
        self.tag = tag;
        self
    }

    /// The reduction of an all-reduce (ignored by the others).
    pub fn reduce(mut self, op: ReduceOp) -> Self {
        if let Kind::AllReduce(_) = self.kind {
            self.kind = Kind::AllReduce(op);
        }
        self
    }

    /// Pushes the collective: it takes its place in the communicator's
    /// issue order now.
    ///
    /// # Errors
    ///
    /// [`Error::Collective`] for a broadcast root that is not a rank, or an
    /// all-gather into its own input; then as [`Engine::push`].
    pub fn push(self) -> Result<OpHandle<()>, Error> {
        let comm = self.comm;
        let size = comm.size();
        let rank = comm.rank();
        let what = match self.kind {
            Kind::AllReduce(op) => Collective::AllReduce(op),
            Kind::Broadcast(root) => Collective::Broadcast {
                root: i32::try_from(root)
                    .ok()
                    .filter(|_| root < size)
                    .ok_or_else(|| {
                        Error::Collective(format!(
                            "broadcast from rank {root}: the communicator has {size} rank(s)"
                        ))
                    })?,
            },
            Kind::AllGather => Collective::AllGather,
        };
        if let Some(input) = self.input
            && input.id() == self.var.id()
        {
            return Err(Error::Collective(
                "all_gather: the input is also the output".into(),
            ));
        }
        let mut op = comm
            .engine
            .op()
            .mutates(&[self.var])
            .priority(self.priority);
        if let Some(input) = self.input {
            op = op.reads(&[input]);
        }
        if let Some(device) = comm.device {
            op = op.on(device);
        }
        let label: Cow<'static, str> = self.name.clone().unwrap_or(Cow::Borrowed(match what {
            Collective::AllReduce(_) => "all_reduce",
            Collective::Broadcast { .. } => "broadcast",
            Collective::AllGather => "all_gather",
        }));
        if let Some(name) = self.name {
            op = op.name(name);
        }
        let out = self.var.key();
        let input = self.input.map(Var::key);
        let backend = comm.comm.clone();
        // Its place in the issue order: taken now, in push order. If the
        // body never submits (skipped, cancelled, a failed push, refusing
        // the collective), dropping it issues a stand-in in its place,
        // telling the other ranks why.
        let mut ticket = Unsubmitted(Some(backend.ticket::<T>(what, self.tag)));
        op.run_async(move |ctx: OpCtx| async move {
            let fail =
                |m: String| -> BoxError { Box::new(Error::Collective(format!("{label}: {m}"))) };
            let buf = match prepare(&ctx, out, input, (rank, size), fail) {
                Ok(buf) => buf,
                Err(e) => {
                    // A stand-in takes this rank's part, telling the others.
                    ticket.take().fail(Reason::Refused, e.to_string());
                    return Err(e);
                }
            };
            let (buf, outcome) = backend.submit(ticket.take(), buf).await;
            *ctx.write(out)? = buf;
            outcome.map_err(fail)
        })
    }
}

/// What a collective's body hands MPI: the buffer moved out of `out`,
/// with this rank's block copied from `input` for an all-gather (an empty
/// output sized first). `Err`: the body refuses the collective (`out`
/// keeps its value).
fn prepare<T: Copy + Send + Sync + 'static>(
    ctx: &OpCtx,
    out: VarKey<Vec<T>>,
    input: Option<VarKey<Vec<T>>>,
    (rank, size): (usize, usize),
    fail: impl Fn(String) -> BoxError,
) -> Result<Vec<T>, BoxError> {
    let mut buf = std::mem::take(&mut *ctx.write(out)?);
    if let Some(input) = input {
        let input = ctx.read(input)?;
        let n = input.len();
        if buf.is_empty() {
            buf.reserve_exact(n * size);
            (0..size).for_each(|_| buf.extend_from_slice(&input));
        } else if buf.len() != n * size {
            let len = buf.len();
            *ctx.write(out)? = buf;
            return Err(fail(format!(
                "the output holds {len} elements, not {size} rank(s) x {n} (the input)"
            )));
        }
        buf[rank * n..(rank + 1) * n].copy_from_slice(&input);
    }
    Ok(buf)
}

/// A collective's ticket until its body submits its buffer. Dropped with
/// it unsubmitted (the op skipped, or dropped before it ran), the ticket's
/// stand-in takes this rank's part, saying why the op was skipped when the
/// engine says (`dep::skipped_because`).
struct Unsubmitted(Option<Ticket>);

impl Unsubmitted {
    /// The ticket, to submit or give up (once).
    fn take(&mut self) -> Ticket {
        self.0.take().expect("a collective's ticket is taken once")
    }
}

impl Drop for Unsubmitted {
    fn drop(&mut self) {
        if let Some(ticket) = self.0.take() {
            match crate::dep::skipped_because() {
                Some(why) => ticket.fail(Reason::Skipped, why),
                None => drop(ticket),
            }
        }
    }
}
