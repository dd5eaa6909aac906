//! Describing an op before pushing or recording it: [`OpBuilder`]
//! (variables, typed accesses, name, priority, device and lane, resource
//! units), checked into an `OpSpec` at `run`, and its wait for room under
//! the engine's bound ([`WhenRoom`], by `when_room`'s rule); and where ops
//! go, [`Ops`]: an
//! [`Engine`], which pushes them, or a [`Recorder`](crate::Recorder), which
//! records them (its side is `record`'s).
//!
//! One builder for both: `OpBuilder<'a, O, B>` declares an op on `O` (an
//! `Ops`) with a body of kind `B`. [`Engine::op`] gives `OpBuilder<'_>`
//! (on the engine, [`Once`]: a `FnOnce` or async body, pushed once);
//! [`Ops::op`] gives `OpBuilder<'_, O, Reusable>` (a `Fn` body, which a
//! recording runs at every replay and a push runs once), so that code
//! generic over `Ops` declares its ops one way whether they are pushed or
//! recorded (SINGA's graph switch).

use std::borrow::Cow;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{Context, Poll};

use super::Engine;
use super::handle::OpHandle;
use super::handle::block_outside_ops;
use super::shared::Shared;
use super::typed_op::{Accesses, TypedOp};
use super::when_room::poll_room;
use crate::core::few::Few;
use crate::dep::{
    AnyVar, AsyncBody, Body, Buffer, Device, Element, Host, Mode, OpCtx, OpSpec, OpUnits, SyncBody,
    Var, edges,
};
use crate::device::Lane;
use crate::error::{BoxError, Error, VarId};
use crate::resource::Resource;

/// An op under construction on `O` (an [`Ops`]: an [`Engine`] by
/// default), with a body of kind `B`: set its variables, name, priority and
/// device, then run it.
///
/// - From [`Engine::op`], `OpBuilder<'_>` (`O = Engine`, `B = Once`):
///   [`run`](OpBuilder::run) or [`run_async`](OpBuilder::run_async) push it
///   with a body that runs once; [`when_room`](OpBuilder::when_room) waits
///   for room under the engine's bound first.
/// - From [`Ops::op`] (a recorder's [`op`](crate::Recorder::op) too),
///   `OpBuilder<'_, O, Reusable>`: [`run`](OpBuilder#method.run-1) pushes
///   (on an engine) or records (on a recorder) it with a `Fn` body.
///
/// Both take the same declarations, typed accesses included
/// ([`with`](OpBuilder::with)).
///
/// ```
/// let engine = depflow::Engine::new();
/// let grad = engine.var(vec![1.0f32; 8]);
/// let handle = engine
///     .op()
///     .name("allreduce fc1")
///     .priority(10)
///     .mutates(&[&grad])
///     .run({
///         let grad = grad.clone();
///         move |ctx| {
///             let mut g = ctx.write(&grad)?;
///             g.iter_mut().for_each(|x| *x *= 0.5);
///             Ok(g.iter().sum::<f32>())
///         }
///     })?;
/// assert_eq!(handle.wait()?, 4.0);
/// # Ok::<(), depflow::Error>(())
/// ```
#[must_use = "an OpBuilder does nothing until it is run"]
pub struct OpBuilder<'a, O: ?Sized = Engine, B = Once> {
    pub(super) target: &'a O,
    decl: Declaration<'a>,
    body: PhantomData<B>,
}

/// An [`OpBuilder`]'s body kind: a `FnOnce` or async body, pushed once
/// ([`Engine::op`]).
#[derive(Debug)]
pub enum Once {}

/// An [`OpBuilder`]'s body kind: a `Fn` body, which a recording runs once
/// per replay and a push runs once ([`Ops::op`]).
#[derive(Debug)]
pub enum Reusable {}

/// Seals [`Ops`]: implemented by [`Engine`] here and by
/// [`Recorder`](crate::Recorder) in `record`.
pub(super) mod sealed {
    pub trait Sealed {}
}

/// Where ops go: pushed to an [`Engine`] (they run as soon as their
/// variables allow) or recorded by a [`Recorder`](crate::Recorder) (they run at each
/// [`Graph::replay`](crate::Graph::replay)). A function generic over `Ops`
/// is written once and runs either way: SINGA's graph switch. Sealed.
///
/// What differs is only what the two give back and keep:
///
/// | | [`Engine`] | [`Recorder`](crate::Recorder) |
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
    /// What [`run`](OpBuilder#method.run-1) gives back: the op's
    /// [`OpHandle`] when it is pushed, `()` when it is recorded.
    type Handle<T: Send + 'static>;

    /// Starts declaring an op whose body may run many times.
    fn op(&self) -> OpBuilder<'_, Self, Reusable> {
        OpBuilder::declared(self, Declaration::default())
    }

    /// A new variable owning `value`: an engine's variable, or a recorded
    /// graph's intermediate (see [`Recorder::var`](crate::Recorder::var)).
    fn var<T: Send + Sync + 'static>(&self, value: T) -> Var<T>;

    /// [`var`](Self::var), named `name` in errors, diagnostics and traces.
    fn var_named<T: Send + Sync + 'static>(&self, name: &str, value: T) -> Var<T>;

    /// A new buffer of `len` values of `T`: an engine's buffer of its own,
    /// zeroed ([`Engine::buffer`]), or a recorded graph's planned buffer
    /// ([`Recorder::buffer`](crate::Recorder::buffer): its first op must
    /// mutate it). Bodies reach it
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
    fn submit<F, T>(op: OpBuilder<'_, Self, Reusable>, f: F) -> Result<Self::Handle<T>, Error>
    where
        F: Fn(&OpCtx) -> Result<T, BoxError> + Send + Sync + 'static,
        T: Send + 'static;
}

impl<O: Ops + ?Sized, B> std::fmt::Debug for OpBuilder<'_, O, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.decl.debug("OpBuilder", f)
    }
}

impl<'a> OpBuilder<'a> {
    #[inline]
    pub(super) fn new(engine: &'a Engine) -> Self {
        Self::declared(engine, Declaration::default())
    }
}

impl<'a, O: Ops + ?Sized, B> OpBuilder<'a, O, B> {
    /// The builder of an op already declared as `decl`, on `target`.
    #[inline]
    pub(super) fn declared(target: &'a O, decl: Declaration<'a>) -> Self {
        Self {
            target,
            decl,
            body: PhantomData,
        }
    }

    /// Adds variables the op reads (calls add up).
    ///
    /// ```
    /// let engine = depflow::Engine::new();
    /// let (a, b, out) = (engine.var(1), engine.var(2), engine.var(0));
    /// // A builder can be split across statements; declarations add up.
    /// let mut op = engine.op().reads(&[&a]);
    /// op = op.reads(&[&b]).mutates(&[&out]);
    /// let (ka, kb, ko) = (a.key(), b.key(), out.key());
    /// op.run(move |ctx| {
    ///     *ctx.write(ko)? = *ctx.read(ka)? + *ctx.read(kb)?;
    ///     Ok(())
    /// })?
    /// .wait()?;
    /// assert_eq!(engine.get(&out).wait()?, 3);
    /// # Ok::<(), depflow::Error>(())
    /// ```
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

    /// A name for errors, diagnostics, traces and a graph's DOT.
    #[inline]
    pub fn name(mut self, name: impl Into<Cow<'static, str>>) -> Self {
        self.decl.opts.name = Some(name.into());
        self
    }

    /// A priority among ready ops (default 0; higher runs first). Honoured by
    /// the pool executor; it never overrides dependencies.
    ///
    /// The rule, on a pool: a ready op of positive priority runs before any
    /// ready op of priority 0, and those before any of negative priority;
    /// but no op waits forever behind others that keep coming:
    ///
    /// - priorities *age*: an op of non-zero priority stands one priority
    ///   level higher, among those of its sign, for every 64 ops of non-zero
    ///   priority made ready after it (so equal priorities run in the order
    ///   they became ready, and a priority-1 op runs before priority-5 ops
    ///   made ready 256 or more such ops after it);
    /// - a ready op of negative priority is passed over by at most 64 picks
    ///   of other work by the pool's workers: then the next worker to look
    ///   for work takes the first of them (sooner if a worker finds nothing
    ///   else to do).
    ///
    /// A steady supply of positive-priority ops still delays priority-0
    /// ones (a worker looks at the ops pushed from outside the pool first
    /// only on every 61st pick): keep positive priorities for short, urgent
    /// work.
    ///
    /// ```
    /// let engine = depflow::Engine::builder().threads(1).build()?;
    /// let (log, late) = (engine.var(Vec::new()), engine.new_var());
    /// let k = log.key();
    /// // Runs when nothing else is ready, or after at most 64 other picks.
    /// engine.op().mutates(&[&late]).priority(-1).run(|_| Ok(()))?;
    /// engine.op().mutates(&[&log]).priority(10).run(move |ctx| {
    ///     ctx.write(k)?.push("urgent");
    ///     Ok(())
    /// })?;
    /// engine.wait_all().wait()?;
    /// # Ok::<(), depflow::Error>(())
    /// ```
    #[inline]
    pub fn priority(mut self, priority: i32) -> Self {
        self.decl.opts.priority = priority;
        self
    }

    /// The device to run on (default: the engine's default device). On a
    /// stream device the body enqueues work on its lane's stream
    /// ([`OpCtx::stream`]); in a replay, the op's successors on the same
    /// device go once its work is enqueued (the device orders lanes with
    /// stream waits), the others once it is done, and the replay ends once
    /// all its ops' device work is done.
    #[inline]
    pub fn on(mut self, device: Device) -> Self {
        self.decl.opts.device = Some(device);
        self
    }

    /// The lane (stream) of a stream device the op's work goes to (default
    /// [`Lane::Compute(0)`](Lane::Compute)); see [`stream`](crate::stream).
    ///
    /// # Errors
    ///
    /// Reported by `run`: [`Error::Stream`] if the device has no such lane
    /// or is not a stream device.
    ///
    /// ```
    /// use depflow::{Engine, Error, Executor, Lane};
    ///
    /// let engine = Engine::builder().device("gpu", Executor::simulated_gpu(1)).build()?;
    /// let gpu = engine.device("gpu").unwrap();
    /// let v = engine.new_var();
    /// let lane = engine
    ///     .op()
    ///     .on(gpu)
    ///     .lane(Lane::HostToDevice)
    ///     .mutates(&[&v])
    ///     .run(|ctx| Ok(ctx.stream()?.lane()))?;
    /// assert_eq!(lane.wait()?, Lane::HostToDevice);
    /// # Ok::<(), Error>(())
    /// ```
    #[inline]
    pub fn lane(mut self, lane: Lane) -> Self {
        self.decl.opts.lane = Some(lane);
        self
    }

    /// Units of `resource` the op needs while it runs, given back when it
    /// completes. The op starts only once all its variables allow it *and*
    /// all its units are free; it takes them all at once. It may take them
    /// ahead of older ops that wait for theirs: so its body must not wait
    /// for an older op that needs units of the same resource (await its
    /// handle, say) — declare that dependency through a variable instead;
    /// see [`Resource`] for the exact condition.
    ///
    /// Recorded ([`Ops`] on a [`Recorder`](crate::Recorder)), the op starts
    /// in each replay once its units are free (waiting without holding a
    /// thread), in the order the replay's ops would get them had they been
    /// pushed at the replay call, and gives them back when it ends.
    ///
    /// # Errors
    ///
    /// Reported by `run`: [`Error::OverCapacity`] if the op needs more than
    /// the resource has (all its declarations of it together; a sum past
    /// `u64::MAX` counts as `u64::MAX`), [`Error::ForeignResource`] for
    /// another engine's.
    ///
    /// ```
    /// use depflow::{Engine, Error};
    ///
    /// let engine = Engine::new();
    /// let streams = engine.new_resource("streams", 1);
    /// let (a, b) = (engine.new_var(), engine.new_var());
    /// // Independent variables, but one stream: the two never overlap.
    /// let first = engine.op().mutates(&[&a]).uses(&streams, 1).run(|_| Ok(()))?;
    /// let second = engine.op().mutates(&[&b]).uses(&streams, 1).run(|_| Ok(()))?;
    /// first.wait()?;
    /// second.wait()?;
    /// assert_eq!(streams.in_use(), 0);
    /// # Ok::<(), Error>(())
    /// ```
    #[inline]
    pub fn uses(mut self, resource: &Resource, units: u64) -> Self {
        self.decl
            .uses(self.target.engine().shared().id, resource, units);
        self
    }

    /// Units of `resource` the op needs and hands on to `output`, one of the
    /// variables it mutates (the buffer it fills): `output` holds them from
    /// the op's completion until it is deleted or dropped, or a later op
    /// allocates it again (which replaces them). If the op fails, they come
    /// back at once. (On a stream device `output` holds them from when the
    /// op's work is enqueued; if that work fails, they come back when the
    /// failure is known, before the op's handle resolves.)
    ///
    /// Such an op waits for every op pushed before it that needs units of
    /// the same resource (see [`Resource`] on why this makes pipelines
    /// deadlock-free).
    ///
    /// # Errors
    ///
    /// As for [`uses`](Self::uses), and [`Error::NotMutable`] (reported by
    /// `run`) if the op does not mutate `output`. Recorded, `run` refuses
    /// it ([`Error::Graph`]): a graph's memory is its planned buffers, taken
    /// once and shared by plan; use [`uses`](Self::uses) for units held
    /// while the op runs, or push the allocating op.
    #[inline]
    pub fn allocates(mut self, resource: &Resource, units: u64, output: &'a dyn AnyVar) -> Self {
        let engine = self.target.engine().shared().id;
        self.decl.allocates(engine, resource, units, output);
        self
    }

    /// Declares the op's variables as typed accesses, [`read`](crate::read)
    /// and [`write`](crate::write) (one, or a tuple of up to eight), and
    /// hands them to its body: `&T` for a read, `&mut T` for a write, in
    /// order. Declaring a variable is what gives the body its access, so a
    /// body cannot touch a variable it did not declare, nor mutate one it
    /// only reads: it would not compile. Options set on the builder before
    /// (name, priority, device, lane, units, more variables) apply. See
    /// [`TypedOp`](crate::TypedOp), and its `run` for a reusable body.
    ///
    /// ```
    /// use depflow::{Engine, read, write};
    ///
    /// let engine = Engine::new();
    /// let (x, y) = (engine.var(vec![1.0f32, 2.0]), engine.var(vec![1.0f32; 2]));
    /// // y += 2 x
    /// engine.op().name("axpy").with((read(&x), write(&y))).run(|(x, y)| {
    ///     y.iter_mut().zip(x).for_each(|(y, x)| *y += 2.0 * x);
    ///     Ok(())
    /// })?;
    /// assert_eq!(engine.get(&y).wait()?, vec![3.0, 5.0]);
    /// # Ok::<(), depflow::Error>(())
    /// ```
    ///
    /// Mutating a variable declared with `read` does not compile:
    ///
    /// ```compile_fail,E0594
    /// use depflow::{Engine, read};
    ///
    /// let engine = Engine::new();
    /// let x = engine.var(1);
    /// engine.op().with(read(&x)).run(|x| {
    ///     *x += 1; // cannot assign: `x` is `&i32`
    ///     Ok(())
    /// })?;
    /// # Ok::<(), depflow::Error>(())
    /// ```
    #[inline]
    pub fn with<A: Accesses<'a>>(mut self, accesses: A) -> TypedOp<Self, A::Keys> {
        let (keys, duplicate) = self.decl.declare(accesses);
        TypedOp::new(self, keys, duplicate)
    }

    /// The op's target and declaration.
    #[inline]
    pub(super) fn into_parts(self) -> (&'a O, Declaration<'a>) {
        (self.target, self.decl)
    }
}

impl<'a> OpBuilder<'a> {
    /// Waits for room under the engine's bound on ops in flight
    /// ([`EngineBuilder::max_in_flight`](crate::EngineBuilder::max_in_flight)), then gives the builder back to
    /// [`run`](Self::run): a producer that pushes this way never runs more
    /// than the bound ahead of the engine (plus one op per other producer
    /// between its wait and its push). Ready at once without a bound.
    ///
    /// `.await` it in async code, or block with [`WhenRoom::wait`].
    ///
    /// Inside an op of this engine it never waits: the calling op counts
    /// itself in flight, and the ops that would make room may be waiting
    /// for it (a child pushed on its variables), so the wait might never
    /// end. There it resolves at once: to the builder if there is room
    /// besides the calling op, else to [`Error::WaitsForItself`] (push with
    /// [`run`](Self::run), which never waits, if the op must push anyway).
    ///
    /// ```
    /// use depflow::{Engine, Error};
    ///
    /// # futures::executor::block_on(async {
    /// let engine = Engine::builder().max_in_flight(8).build()?;
    /// let v = engine.new_var();
    /// for _ in 0..100 {
    ///     engine.op().mutates(&[&v]).when_room().await?.run(|_| Ok(()))?;
    /// }
    /// engine.wait_all().await?;
    /// # Ok::<(), Error>(()) }).unwrap();
    /// ```
    pub fn when_room(self) -> WhenRoom<'a> {
        WhenRoom::new(self)
    }

    /// Pushes the op with a synchronous body; see [`Engine::push`].
    ///
    /// # Errors
    ///
    /// As for [`Engine::push`].
    pub fn run<F, T>(self, f: F) -> Result<OpHandle<T>, Error>
    where
        F: FnOnce(&OpCtx) -> Result<T, BoxError> + Send + 'static,
        T: Send + 'static,
    {
        self.push(SyncBody(Some(f)))
    }

    /// Pushes the op with an asynchronous body; see [`Engine::push_async`].
    ///
    /// # Errors
    ///
    /// As for [`Engine::push`].
    pub fn run_async<F, Fut, T>(self, f: F) -> Result<OpHandle<T>, Error>
    where
        F: FnOnce(OpCtx) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, BoxError>> + Send + 'static,
        T: Send + 'static,
    {
        self.push(AsyncBody::new(f))
    }

    /// Checks the declaration and pushes the op.
    // The spec is written here, from the builder's fields in place: a
    // helper of `Declaration`'s, or moving the declaration out first, cost
    // 30 to 40 instructions an op (benches/push_cost.rs, builder and typed).
    #[inline]
    fn push<B: Body>(mut self, body: B) -> Result<OpHandle<B::Output>, Error> {
        let engine = self.target;
        let shared = engine.shared();
        let device = self.decl.opts.device_index(shared)?;
        if let Some(e) = self.decl.opts.invalid.take() {
            return Err(e);
        }
        let edges = edges(
            self.decl.reads.as_slice(),
            self.decl.mutates.as_slice(),
            shared.id,
        )?;
        self.decl.opts.check_capacity()?;
        if let Some(r) = &mut self.decl.opts.units {
            // Point each allocation at its output's edge, merging repeats.
            for l in &mut r.lasting {
                let var = self.decl.allocations[l.edge].core();
                l.edge = edges
                    .as_slice()
                    .iter()
                    .position(|e| std::ptr::eq(e.var.core(), var) && e.is_write())
                    .ok_or(Error::NotMutable(var.id()))?;
            }
            r.merge_lasting();
        }
        let lane = self.decl.opts.lane_index(shared, device, B::SYNC)?;
        engine.push_spec(
            OpSpec {
                edges,
                units: self.decl.opts.units,
                name: self.decl.opts.name,
                device_index: device,
                lane,
                priority: self.decl.opts.priority,
                mode: Mode::Normal,
                generation: 0,
            },
            body,
        )
    }
}

impl<'a, O: Ops + ?Sized> OpBuilder<'a, O, Reusable> {
    /// Pushes the op (on an [`Engine`]: it runs once, as a
    /// [`run`](OpBuilder::run) of `Engine::op`'s builder would) or records
    /// it (on a [`Recorder`](crate::Recorder): it runs once per replay, and
    /// its output is dropped).
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
    fn submit<F, T>(op: OpBuilder<'_, Self, Reusable>, f: F) -> Result<OpHandle<T>, Error>
    where
        F: Fn(&OpCtx) -> Result<T, BoxError> + Send + Sync + 'static,
        T: Send + 'static,
    {
        let (engine, decl) = op.into_parts();
        OpBuilder::<Engine, Once>::declared(engine, decl).run(f)
    }
}

/// Waits for room under the engine's bound on ops in flight; resolves to the
/// [`OpBuilder`] to push with. Made by [`OpBuilder::when_room`].
#[must_use = "a WhenRoom does nothing unless awaited or waited on"]
#[derive(Debug)]
pub struct WhenRoom<'a> {
    builder: Option<OpBuilder<'a>>,
}

impl<'a> WhenRoom<'a> {
    pub(super) fn new(builder: OpBuilder<'a>) -> Self {
        Self {
            builder: Some(builder),
        }
    }

    /// Blocks the calling thread until there is room.
    ///
    /// # Errors
    ///
    /// While there is no room: [`Error::WaitsForItself`] inside an op of
    /// this engine (see [`OpBuilder::when_room`]), [`Error::BlockingInOp`]
    /// inside another engine's op, and [`Error::BlockingInRuntime`] inside a
    /// tokio runtime (with the `tokio` feature); `.await` it there instead.
    pub fn wait(self) -> Result<OpBuilder<'a>, Error> {
        block_outside_ops(false, self)
    }
}

impl<'a> Future for WhenRoom<'a> {
    type Output = Result<OpBuilder<'a>, Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let builder = self
            .builder
            .as_ref()
            .expect("WhenRoom polled after it resolved");
        let room = std::task::ready!(poll_room(builder.target.shared(), cx));
        let builder = self.builder.take();
        Poll::Ready(room.map(|()| builder.expect("checked above")))
    }
}

// An `OpBuilder` holds only shared references and owned data.
impl Unpin for WhenRoom<'_> {}

/// What an op declares: its variables (`reads` and `mutates` add up over
/// calls; copied, so that the caller's slices need not outlive the
/// statement), its options, and the outputs of its lasting units. Collected
/// by [`OpBuilder`] (for a push or a recording alike), checked by whoever
/// takes the op.
#[derive(Default)]
pub(super) struct Declaration<'a> {
    pub(super) reads: Few<&'a dyn AnyVar>,
    pub(super) mutates: Few<&'a dyn AnyVar>,
    pub(super) opts: OpOptions,
    /// The variable of each lasting demand in `opts.units`, in order.
    pub(super) allocations: Vec<&'a dyn AnyVar>,
}

impl<'a> Declaration<'a> {
    /// Units of `resource` held while the op runs (on engine `engine`).
    #[inline]
    pub(super) fn uses(&mut self, engine: u64, resource: &Resource, units: u64) {
        self.opts.add_units(engine, resource, units, None);
    }

    /// Units of `resource` handed on to `output` (on engine `engine`).
    #[inline]
    pub(super) fn allocates(
        &mut self,
        engine: u64,
        resource: &Resource,
        units: u64,
        output: &'a dyn AnyVar,
    ) {
        self.allocations.push(output);
        let allocation = Some(self.allocations.len() - 1);
        self.opts.add_units(engine, resource, units, allocation);
    }

    /// Declares typed accesses' variables; their keys, and a variable
    /// declared twice, once at least as written.
    #[inline]
    pub(super) fn declare<A: Accesses<'a>>(&mut self, accesses: A) -> (A::Keys, Option<VarId>) {
        let (vars, keys, duplicate) = accesses.declare();
        for &(var, mutated) in vars.as_ref() {
            match mutated {
                true => self.mutates.push(var),
                false => self.reads.push(var),
            }
        }
        (keys, duplicate)
    }

    /// `Debug` for a builder named `what`.
    pub(super) fn debug(&self, what: &str, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct(what)
            .field("reads", &self.reads)
            .field("mutates", &self.mutates)
            .field("name", &self.opts.name)
            .field("priority", &self.opts.priority)
            .field("device", &self.opts.device)
            .field("lane", &self.opts.lane)
            .field(
                "resources",
                &self.opts.units.as_ref().map(|u| {
                    u.demands()
                        .map(|(r, d)| (r.name(), d.amount))
                        .collect::<Vec<_>>()
                }),
            )
            .finish()
    }
}

/// What an op declares besides its variables and body: checked alike by
/// pushes and recordings (each in its own order).
#[derive(Default)]
pub(super) struct OpOptions {
    pub(super) name: Option<Cow<'static, str>>,
    pub(super) priority: i32,
    pub(super) device: Option<Device>,
    pub(super) lane: Option<Lane>,
    pub(super) units: Option<Box<OpUnits>>,
    /// The first bad declaration, reported by `run`.
    pub(super) invalid: Option<Error>,
}

impl OpOptions {
    /// Adds `units` of `resource` (lasting ones handed on to allocation
    /// number `allocation`), or notes that the resource is another engine's.
    #[inline]
    pub(super) fn add_units(
        &mut self,
        engine: u64,
        resource: &Resource,
        units: u64,
        allocation: Option<usize>,
    ) {
        if resource.engine() != engine {
            self.invalid
                .get_or_insert(Error::ForeignResource(resource.name().to_string()));
        } else if units > 0 {
            self.units
                .get_or_insert_with(Box::default)
                .add(resource, units, allocation);
        }
    }

    /// The index of the op's device in `shared` (0, the default device,
    /// unless one was given).
    #[inline]
    pub(super) fn device_index(&self, shared: &Shared) -> Result<u16, Error> {
        match self.device {
            None => Ok(0),
            Some(d) if d.engine == shared.id => Ok(d.index),
            Some(_) => Err(Error::Config("the device belongs to another engine".into())),
        }
    }

    /// The op's lane on device `device` if it is a stream device (None
    /// elsewhere); `sync` says whether the body is synchronous, as one on a
    /// stream device must be (it enqueues work).
    #[inline]
    pub(super) fn lane_index(
        &self,
        shared: &Shared,
        device: u16,
        sync: bool,
    ) -> Result<Option<u8>, Error> {
        if self.lane.is_none() && !shared.has_streams() {
            return Ok(None); // the common case, one load
        }
        let lane = self.lane.unwrap_or_default();
        match shared.stream_device(device) {
            None if self.lane.is_some() => Err(Error::Stream(format!(
                "{lane:?} given for an op on a device without streams"
            ))),
            None => Ok(None),
            Some(_) if !sync => Err(Error::Stream(
                "an op on a stream device has a synchronous body (it enqueues work)".into(),
            )),
            Some(stream_device) => stream_device
                .lane(lane)
                .map(Some)
                .ok_or_else(|| Error::Stream(format!("the device has no lane {lane:?}"))),
        }
    }

    /// [`Error::OverCapacity`] if the op needs more of a resource than it has.
    #[inline]
    pub(super) fn check_capacity(&self) -> Result<(), Error> {
        match self.units.as_ref().and_then(|u| u.over_capacity()) {
            None => Ok(()),
            Some((resource, requested)) => Err(Error::OverCapacity {
                resource: resource.name().to_string(),
                requested,
                capacity: resource.capacity(),
            }),
        }
    }
}
