//! One op description for pushes and recordings: the [`Ops`] trait, which
//! [`Engine`] (ops run now) and [`Recorder`] (ops run at each replay) both
//! implement, and the [`OpDecl`] it starts. Code written once against
//! `Ops` runs eagerly or recorded (SINGA's graph switch).
//!
//! An `OpDecl` collects what [`OpBuilder`](crate::OpBuilder) collects (the
//! same `Declaration`), and its body is `Fn`: a recording runs it once per
//! replay, and a push simply runs it once. The engine checks it into a
//! pushed op's spec exactly as an `OpBuilder` would; the recorder exactly
//! as a [`RecordOp`](crate::RecordOp) (which is this type, on a recorder).

use std::borrow::Cow;

use super::Engine;
use super::handle::OpHandle;
use super::op_builder::{Declaration, OpBuilder};
use super::record::Recorder;
use super::typed_op::{Accesses, TypedOp};
use crate::dep::{AnyVar, Buffer, Device, Element, OpCtx, Var};
use crate::device::Lane;
use crate::error::{BoxError, Error};
use crate::resource::Resource;

mod sealed {
    pub trait Sealed {}
}

/// Where ops go: pushed to an [`Engine`] (they run as soon as their
/// variables allow) or recorded by a [`Recorder`] (they run at each
/// [`Graph::replay`](crate::Graph::replay)). A function generic over `Ops`
/// is written once and runs either way: SINGA's graph switch. Sealed.
///
/// What differs is only what the two give back and keep:
///
/// | | [`Engine`] | [`Recorder`] |
/// | --- | --- | --- |
/// | `op().run(f)` | pushes; an [`OpHandle`] | records; `()` |
/// | `var(value)` | a variable | an intermediate of the graph |
/// | `buffer(len)` | a buffer of its own, zeroed | a planned buffer, sharing the graph's arena |
///
/// ```
/// use depflow::{Buffer, Engine, Error, Ops, Var, read, write};
///
/// /// One SGD step on `w` for the loss `(w - target)²`, through a
/// /// gradient buffer: written once.
/// fn step(ops: &impl Ops, w: &Var<Vec<f32>>, target: &Var<Vec<f32>>) -> Result<(), Error> {
///     let grad: Buffer<f32> = ops.buffer_named("grad", 3);
///     ops.op().name("gradient").with((read(w), read(target), write(&grad))).run(
///         |(w, target, grad)| {
///             for ((g, w), t) in grad.iter_mut().zip(w).zip(target) {
///                 *g = 2.0 * (w - t);
///             }
///             Ok(())
///         },
///     )?;
///     ops.op().name("update").with((read(&grad), write(w))).run(|(grad, w)| {
///         w.iter_mut().zip(grad).for_each(|(w, g)| *w -= 0.25 * g);
///         Ok(())
///     })?;
///     Ok(())
/// }
///
/// let engine = Engine::new();
/// let target = engine.var(vec![1.0, 2.0, 3.0]);
/// let (eager, replayed) = (engine.var(vec![0.0; 3]), engine.var(vec![0.0; 3]));
/// let graph = engine.record(|rec| step(rec, &replayed, &target))?;
/// for _ in 0..4 {
///     step(&engine, &eager, &target)?; // pushed: a fresh buffer each step
///     graph.replay(); // the recorded ops, on their planned buffer
/// }
/// assert_eq!(engine.get(&eager).wait()?, engine.get(&replayed).wait()?);
/// # Ok::<(), Error>(())
/// ```
pub trait Ops: sealed::Sealed {
    /// What [`OpDecl::run`] gives back: the op's [`OpHandle`] when it is
    /// pushed, `()` when it is recorded.
    type Handle<T: Send + 'static>;

    /// Starts declaring an op.
    fn op(&self) -> OpDecl<'_, Self> {
        OpDecl {
            target: self,
            decl: Declaration::default(),
        }
    }

    /// A new variable owning `value`: an engine's variable, or a recorded
    /// graph's intermediate (see [`Recorder::var`]).
    fn var<T: Send + Sync + 'static>(&self, value: T) -> Var<T>;

    /// [`var`](Self::var), named `name` in errors, diagnostics and traces.
    fn var_named<T: Send + Sync + 'static>(&self, name: &str, value: T) -> Var<T>;

    /// A new buffer of `len` values of `T`: an engine's buffer of its own,
    /// zeroed ([`Engine::buffer`]), or a recorded graph's planned buffer
    /// ([`Recorder::buffer`]: its first op must mutate it). Bodies reach it
    /// as `[T]`.
    fn buffer<T: Element>(&self, len: usize) -> Buffer<T>;

    /// [`buffer`](Self::buffer), named `name` in errors, diagnostics and
    /// the graph's DOT.
    fn buffer_named<T: Element>(&self, name: &str, len: usize) -> Buffer<T>;

    /// The engine the ops go to.
    #[doc(hidden)]
    fn engine(&self) -> &Engine;

    /// Pushes or records the op `decl` declared, with body `f`.
    #[doc(hidden)]
    fn submit<F, T>(decl: OpDecl<'_, Self>, f: F) -> Result<Self::Handle<T>, Error>
    where
        F: Fn(&OpCtx) -> Result<T, BoxError> + Send + Sync + 'static,
        T: Send + 'static;
}

/// An op under construction on an [`Ops`] (an [`Engine`] or a
/// [`Recorder`]), from [`Ops::op`]: the declarations of
/// [`OpBuilder`](crate::OpBuilder), and a body that may run many times
/// (`Fn`: once per replay when recorded). On a recorder it is
/// [`RecordOp`](crate::RecordOp).
///
/// Bodies are synchronous: a recording cannot replay an async body, so an
/// op that awaits is pushed with [`OpBuilder::run_async`], and waiting for
/// room under the engine's bound is [`OpBuilder::when_room`]'s.
#[must_use = "an OpDecl does nothing until `run`"]
pub struct OpDecl<'a, O: Ops + ?Sized> {
    target: &'a O,
    decl: Declaration<'a>,
}

impl<O: Ops + ?Sized> std::fmt::Debug for OpDecl<'_, O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.decl.debug("OpDecl", f)
    }
}

impl<'a, O: Ops + ?Sized> OpDecl<'a, O> {
    /// Adds variables the op reads (calls add up).
    #[inline]
    pub fn reads(mut self, vars: &[&'a dyn AnyVar]) -> Self {
        self.decl.reads.extend_from_slice(vars);
        self
    }

    /// Adds variables the op mutates (calls add up). A variable both read
    /// and mutated counts as mutated.
    #[inline]
    pub fn mutates(mut self, vars: &[&'a dyn AnyVar]) -> Self {
        self.decl.mutates.extend_from_slice(vars);
        self
    }

    /// A name for errors, traces and a graph's DOT.
    #[inline]
    pub fn name(mut self, name: impl Into<Cow<'static, str>>) -> Self {
        self.decl.opts.name = Some(name.into());
        self
    }

    /// A priority among ready ops; see [`OpBuilder::priority`].
    #[inline]
    pub fn priority(mut self, priority: i32) -> Self {
        self.decl.opts.priority = priority;
        self
    }

    /// The device to run on (default: the engine's default device); see
    /// [`OpBuilder::on`]. On a stream device the body enqueues work on its
    /// lane's stream ([`OpCtx::stream`]), as a pushed op's does: in a
    /// replay, the op's successors on the same device go once its work is
    /// enqueued (the device orders lanes with stream waits), the others
    /// once it is done, and the replay ends once all its ops' device work
    /// is done.
    #[inline]
    pub fn on(mut self, device: Device) -> Self {
        self.decl.opts.device = Some(device);
        self
    }

    /// The lane of a stream device the op's work goes to (default
    /// [`Lane::Compute(0)`](Lane::Compute)); see [`OpBuilder::lane`].
    ///
    /// ```
    /// use depflow::{Engine, Executor, Lane};
    ///
    /// let engine = Engine::builder().device("gpu", Executor::simulated_gpu(2)).build()?;
    /// let gpu = engine.device("gpu").unwrap();
    /// let v = engine.var(0u32);
    /// let graph = engine.record(|rec| {
    ///     rec.op().on(gpu).lane(Lane::HostToDevice).mutates(&[&v]).run({
    ///         let v = v.key();
    ///         move |ctx| {
    ///             *ctx.write(v)? += 1; // on the host, in the body
    ///             Ok(ctx.stream()?.enqueue(|| Ok(()))?) // device work
    ///         }
    ///     })
    /// })?;
    /// graph.replay().wait()?; // over once the device work is done
    /// assert_eq!(engine.get(&v).wait()?, 1);
    /// # Ok::<(), depflow::Error>(())
    /// ```
    #[inline]
    pub fn lane(mut self, lane: Lane) -> Self {
        self.decl.opts.lane = Some(lane);
        self
    }

    /// Units of `resource` the op needs while it runs (on a stream device,
    /// until its device work is done); see [`OpBuilder::uses`]. In a
    /// replay, the op starts only once they are free (waiting without
    /// holding a thread), in the order the replay's ops would get them had
    /// they been pushed at the replay call, and gives them back when it
    /// ends.
    ///
    /// ```
    /// use depflow::Engine;
    ///
    /// let engine = Engine::new();
    /// let slots = engine.new_resource("slots", 1);
    /// let (a, b) = (engine.var(0u32), engine.var(0u32));
    /// let graph = engine.record(|rec| {
    ///     // Independent ops, but one slot: they never overlap.
    ///     rec.op().mutates(&[&a]).uses(&slots, 1).run({
    ///         let a = a.key();
    ///         move |ctx| { *ctx.write(a)? += 1; Ok(()) }
    ///     })?;
    ///     rec.op().mutates(&[&b]).uses(&slots, 1).run({
    ///         let b = b.key();
    ///         move |ctx| { *ctx.write(b)? += 1; Ok(()) }
    ///     })
    /// })?;
    /// graph.replay().wait()?;
    /// assert_eq!(slots.in_use(), 0);
    /// # Ok::<(), depflow::Error>(())
    /// ```
    #[inline]
    pub fn uses(mut self, resource: &Resource, units: u64) -> Self {
        let engine = self.target.engine().shared().id;
        self.decl.uses(engine, resource, units);
        self
    }

    /// Units of `resource` the op hands on to `output`; see
    /// [`OpBuilder::allocates`]. Refused when recorded (`run` reports
    /// [`Error::Graph`]): a graph's memory is its planned buffers, taken
    /// once and shared by plan; use [`uses`](Self::uses) for units held
    /// while the op runs, or push the allocating op.
    #[inline]
    pub fn allocates(mut self, resource: &Resource, units: u64, output: &'a dyn AnyVar) -> Self {
        let engine = self.target.engine().shared().id;
        self.decl.allocates(engine, resource, units, output);
        self
    }

    /// Declares the op's variables as typed accesses, [`read`](crate::read)
    /// and [`write`](crate::write), whose values its body gets; see
    /// [`OpBuilder::with`] and [`TypedOp::run`](TypedOp#method.run-1).
    #[inline]
    pub fn with<A: Accesses<'a>>(mut self, accesses: A) -> TypedOp<Self, A::Keys> {
        let (keys, duplicate) = self.decl.declare(accesses);
        TypedOp::new(self, keys, duplicate)
    }

    /// Pushes the op (on an [`Engine`]: it runs once, as
    /// [`OpBuilder::run`] would) or records it (on a [`Recorder`]: it runs
    /// once per replay, and its output is dropped).
    ///
    /// # Errors
    ///
    /// As for [`Engine::push`], at once; and for a recorded op:
    /// [`Error::GraphOwned`] for another graph's intermediate;
    /// [`Error::Config`] for another engine's device; [`Error::Stream`]
    /// for a lane the device lacks, or a lane given for a host device;
    /// [`Error::OverCapacity`] and [`Error::ForeignResource`] as for
    /// [`OpBuilder::uses`]; [`Error::Graph`] for
    /// [`allocates`](Self::allocates), and for a device buffer declared
    /// off its device.
    #[inline]
    pub fn run<F, T>(self, f: F) -> Result<O::Handle<T>, Error>
    where
        F: Fn(&OpCtx) -> Result<T, BoxError> + Send + Sync + 'static,
        T: Send + 'static,
    {
        O::submit(self, f)
    }

    /// The op's target and declaration.
    pub(super) fn into_parts(self) -> (&'a O, Declaration<'a>) {
        (self.target, self.decl)
    }
}

impl sealed::Sealed for Engine {}

impl Ops for Engine {
    type Handle<T: Send + 'static> = OpHandle<T>;

    fn engine(&self) -> &Engine {
        self
    }

    fn var<T: Send + Sync + 'static>(&self, value: T) -> Var<T> {
        Engine::var(self, value)
    }

    fn var_named<T: Send + Sync + 'static>(&self, name: &str, value: T) -> Var<T> {
        Engine::var_named(self, name, value)
    }

    fn buffer<T: Element>(&self, len: usize) -> Buffer<T> {
        Engine::buffer(self, len)
    }

    fn buffer_named<T: Element>(&self, name: &str, len: usize) -> Buffer<T> {
        Engine::buffer_named(self, name, len)
    }

    #[inline]
    fn submit<F, T>(decl: OpDecl<'_, Self>, f: F) -> Result<OpHandle<T>, Error>
    where
        F: Fn(&OpCtx) -> Result<T, BoxError> + Send + Sync + 'static,
        T: Send + 'static,
    {
        let (engine, decl) = decl.into_parts();
        OpBuilder::declared(engine, decl).run(f)
    }
}

impl sealed::Sealed for Recorder<'_> {}

impl Ops for Recorder<'_> {
    type Handle<T: Send + 'static> = ();

    fn engine(&self) -> &Engine {
        self.engine
    }

    fn var<T: Send + Sync + 'static>(&self, value: T) -> Var<T> {
        Recorder::var(self, value)
    }

    fn var_named<T: Send + Sync + 'static>(&self, name: &str, value: T) -> Var<T> {
        Recorder::var_named(self, name, value)
    }

    fn buffer<T: Element>(&self, len: usize) -> Buffer<T> {
        Recorder::buffer(self, len)
    }

    fn buffer_named<T: Element>(&self, name: &str, len: usize) -> Buffer<T> {
        Recorder::buffer_named(self, name, len)
    }

    fn submit<F, T>(decl: OpDecl<'_, Self>, f: F) -> Result<(), Error>
    where
        F: Fn(&OpCtx) -> Result<T, BoxError> + Send + Sync + 'static,
        T: Send + 'static,
    {
        let (recorder, decl) = decl.into_parts();
        recorder.record_op(decl, move |ctx| f(ctx).map(drop))
    }
}
