//! Describing an op before pushing it: [`OpBuilder`] (variables, name,
//! priority, device and lane, resource units), checked into an `OpSpec` at
//! `run` (its wait for room, [`WhenRoom`], is `when_room`'s).

use std::borrow::Cow;
use std::future::Future;

use super::Engine;
use super::handle::OpHandle;
use super::shared::Shared;
use super::typed_op::{Accesses, TypedOp};
use super::when_room::WhenRoom;
use crate::core::few::Few;
use crate::dep::{
    AnyVar, AsyncBody, Body, Device, Host, Mode, OpCtx, OpSpec, OpUnits, SyncBody, edges,
};
use crate::device::Lane;
use crate::error::{BoxError, Error, VarId};
use crate::resource::Resource;

/// An op under construction: set its variables, name, priority and device,
/// then [`run`](OpBuilder::run) or [`run_async`](OpBuilder::run_async) it.
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
#[must_use = "an OpBuilder does nothing until `run` or `run_async`"]
pub struct OpBuilder<'a> {
    pub(super) engine: &'a Engine,
    decl: Declaration<'a>,
}

impl std::fmt::Debug for OpBuilder<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.decl.debug("OpBuilder", f)
    }
}

impl<'a> OpBuilder<'a> {
    #[inline]
    pub(super) fn new(engine: &'a Engine) -> Self {
        Self::declared(engine, Declaration::default())
    }

    /// The builder of an op already declared as `decl`.
    #[inline]
    pub(super) fn declared(engine: &'a Engine, decl: Declaration<'a>) -> Self {
        Self { engine, decl }
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

    /// A name for errors and `Debug` output.
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

    /// The device to run on (default: the engine's default device).
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
        self.decl.uses(self.engine.shared().id, resource, units);
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
    /// `run`) if the op does not mutate `output`.
    #[inline]
    pub fn allocates(mut self, resource: &Resource, units: u64, output: &'a dyn AnyVar) -> Self {
        self.decl
            .allocates(self.engine.shared().id, resource, units, output);
        self
    }

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
        let engine = self.engine;
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

    /// Declares the op's variables as typed accesses, [`read`](crate::read)
    /// and [`write`](crate::write) (one, or a tuple of up to eight), and
    /// hands them to its body: `&T` for a read, `&mut T` for a write, in
    /// order. Declaring a variable is what gives the body its access, so a
    /// body cannot touch a variable it did not declare, nor mutate one it
    /// only reads: it would not compile. Options set on the builder before
    /// (name, priority, device, lane, units, more variables) apply. See
    /// [`TypedOp`](crate::TypedOp).
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
}

/// What an op declares: its variables (`reads` and `mutates` add up over
/// calls; copied, so that the caller's slices need not outlive the
/// statement), its options, and the outputs of its lasting units. Collected
/// alike by [`OpBuilder`] and [`OpDecl`](crate::OpDecl) (and so
/// [`RecordOp`](crate::RecordOp)), checked by whoever takes the op.
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
