//! Typed access: an op whose declarations are what give its body access.
//!
//! [`OpBuilder::with`] (for pushed and recorded ops alike) takes the op's accesses, [`read(&x)`](read()) and
//! [`write(&y)`](write()) (one, or a tuple of up to eight), declares their
//! variables on the builder and returns a [`TypedOp`], whose body receives
//! the values themselves, in order: `&X` for a read of a `Var<X>` (`&[X]`
//! for a planned `Buffer<X>`), `&mut Y` for a write. A body cannot reach a
//! variable it did not declare, nor mutate one it declared as read: such a
//! body does not compile. The untyped form (`reads`/`mutates`, keys,
//! [`OpCtx::read`]) is unchanged and sits beside it.
//!
//! Built on the public API of the layers below: at `run`, the body is
//! wrapped in a closure that holds the operands' keys ([`TypedVar`]) and
//! borrows the values through [`OpCtx::read`] and [`OpCtx::write`] before
//! calling it; the op is pushed (or recorded) by the builder's own `run`
//! like any other.

use std::future::Future;

use super::handle::OpHandle;
use super::op_builder::{OpBuilder, Ops, Reusable};
use crate::dep::{AnyVar, OpCtx, Operand, TypedVar, VarMut, VarRef};
use crate::error::{BoxError, Error, VarId};

/// Declares that an op reads `var`, a [`Var<T>`](crate::Var) (its body gets
/// `&T`) or a planned [`Buffer<T>`](crate::Buffer) (`&[T]`); see
/// [`OpBuilder::with`].
///
/// ```
/// use depflow::{Engine, read};
///
/// let engine = Engine::new();
/// let v = engine.var(vec![1, 2, 3]);
/// let sum = engine.op().with(read(&v)).run(|v| Ok(v.iter().sum::<i32>()))?;
/// assert_eq!(sum.wait()?, 6);
/// # Ok::<(), depflow::Error>(())
/// ```
pub fn read<V: TypedVar>(var: &V) -> Read<'_, V> {
    Read(var)
}

/// Declares that an op mutates `var`, a [`Var<T>`](crate::Var) (its body
/// gets `&mut T`) or a planned [`Buffer<T>`](crate::Buffer) (`&mut [T]`);
/// see [`OpBuilder::with`].
///
/// ```
/// use depflow::{Engine, write};
///
/// let engine = Engine::new();
/// let log = engine.var(String::new());
/// engine.op().with(write(&log)).run(|log| {
///     log.push_str("hello");
///     Ok(())
/// })?;
/// assert_eq!(engine.get(&log).wait()?, "hello");
/// # Ok::<(), depflow::Error>(())
/// ```
pub fn write<V: TypedVar>(var: &V) -> Write<'_, V> {
    Write(var)
}

/// A read of a variable or planned buffer, declared by [`read()`].
#[derive(Debug)]
pub struct Read<'a, V>(&'a V);

/// A mutation of a variable or planned buffer, declared by [`write()`].
#[derive(Debug)]
pub struct Write<'a, V>(&'a V);

/// What a [`Read`] leaves in the op's body: the operand's key.
#[derive(Clone, Copy, Debug)]
pub struct ReadKey<K>(K);

/// What a [`Write`] leaves in the op's body: the operand's key.
#[derive(Clone, Copy, Debug)]
pub struct WriteKey<K>(K);

mod sealed {
    pub trait Sealed {}
}

/// One declared access: [`Read`] or [`Write`]. Sealed.
pub trait Access<'a>: sealed::Sealed {
    /// What the body keeps of it.
    type Key: AccessKeys;
    /// The variable, its id, whether the access mutates it, and its key.
    #[doc(hidden)]
    fn declare(self) -> (&'a dyn AnyVar, VarId, bool, Self::Key);
}

/// The accesses an op declares, as [`OpBuilder::with`] takes them: one
/// [`Access`], or a tuple of up to eight. Sealed.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not an op's accesses",
    label = "expected `read(&var)`, `write(&var)`, or a tuple of up to eight of them",
    note = "declare with `depflow::read(&var)` (the body gets `&T`) or `depflow::write(&var)` (`&mut T`)"
)]
pub trait Accesses<'a>: sealed::Sealed {
    /// What the body keeps of them.
    type Keys: AccessKeys;
    /// Each variable and whether it is mutated, in order.
    #[doc(hidden)]
    type Vars: AsRef<[(&'a dyn AnyVar, bool)]>;
    /// The variables, their keys, and a variable that appears twice,
    /// mutated at least once.
    #[doc(hidden)]
    fn declare(self) -> (Self::Vars, Self::Keys, Option<VarId>);
}

/// The keys of an op's declared accesses, and what they give its body.
/// Sealed.
pub trait AccessKeys: sealed::Sealed + Clone + Send + Sync + 'static {
    /// The borrows an async body gets from [`TypedCtx::get`]: [`VarRef`]
    /// for a read, [`VarMut`] for a write (a tuple of them, in order, for a
    /// tuple of accesses).
    type Guards<'c>;
    /// What a synchronous body gets: `&T` for a read, `&mut T` for a write
    /// (a tuple of them, in order, for a tuple of accesses).
    type Refs<'g>;
    /// Borrows the values from the op's context.
    #[doc(hidden)]
    fn guards<'c>(&self, ctx: &'c OpCtx) -> Result<Self::Guards<'c>, Error>;
    /// The values, from the borrows.
    #[doc(hidden)]
    fn refs<'g, 'c>(guards: &'g mut Self::Guards<'c>) -> Self::Refs<'g>;
}

impl<V> sealed::Sealed for Read<'_, V> {}
impl<V> sealed::Sealed for Write<'_, V> {}
impl<K> sealed::Sealed for ReadKey<K> {}
impl<K> sealed::Sealed for WriteKey<K> {}

impl<'a, V: TypedVar> Access<'a> for Read<'a, V> {
    type Key = ReadKey<V::Key>;
    #[inline]
    fn declare(self) -> (&'a dyn AnyVar, VarId, bool, Self::Key) {
        (
            self.0,
            self.0.core().id(),
            false,
            ReadKey(self.0.typed_key()),
        )
    }
}

impl<'a, V: TypedVar> Access<'a> for Write<'a, V> {
    type Key = WriteKey<V::Key>;
    #[inline]
    fn declare(self) -> (&'a dyn AnyVar, VarId, bool, Self::Key) {
        (
            self.0,
            self.0.core().id(),
            true,
            WriteKey(self.0.typed_key()),
        )
    }
}

impl<K: Operand + Clone + Send + Sync + 'static> AccessKeys for ReadKey<K> {
    type Guards<'c> = VarRef<'c, K::Value>;
    type Refs<'g> = &'g K::Value;
    #[inline]
    fn guards<'c>(&self, ctx: &'c OpCtx) -> Result<VarRef<'c, K::Value>, Error> {
        self.0.read_in(ctx)
    }
    #[inline]
    fn refs<'g, 'c>(guard: &'g mut VarRef<'c, K::Value>) -> &'g K::Value {
        guard
    }
}

impl<K: Operand + Clone + Send + Sync + 'static> AccessKeys for WriteKey<K> {
    type Guards<'c> = VarMut<'c, K::Value>;
    type Refs<'g> = &'g mut K::Value;
    #[inline]
    fn guards<'c>(&self, ctx: &'c OpCtx) -> Result<VarMut<'c, K::Value>, Error> {
        self.0.write_in(ctx)
    }
    #[inline]
    fn refs<'g, 'c>(guard: &'g mut VarMut<'c, K::Value>) -> &'g mut K::Value {
        guard
    }
}

/// A variable that accesses name twice, one of them a write: its body
/// could not hold both borrows.
#[inline]
fn duplicate(declared: &[(VarId, bool)]) -> Option<VarId> {
    declared.iter().enumerate().find_map(|(i, &(id, mutated))| {
        declared[i + 1..]
            .iter()
            .any(|&(other, m)| other == id && (mutated || m))
            .then_some(id)
    })
}

macro_rules! single {
    ($($access:ident),*) => {$(
        impl<'a, V: TypedVar> Accesses<'a> for $access<'a, V> {
            type Keys = <Self as Access<'a>>::Key;
            type Vars = [(&'a dyn AnyVar, bool); 1];
            #[inline]
            fn declare(self) -> (Self::Vars, Self::Keys, Option<VarId>) {
                let (var, _, mutated, key) = Access::declare(self);
                ([(var, mutated)], key, None)
            }
        }
    )*};
}
single!(Read, Write);

macro_rules! tuples {
    ($($n:literal ($($a:ident $k:ident $g:ident),*))*) => {$(
        impl<$($a),*> sealed::Sealed for ($($a,)*) {}

        impl<'a, $($a: Access<'a>),*> Accesses<'a> for ($($a,)*) {
            type Keys = ($($a::Key,)*);
            type Vars = [(&'a dyn AnyVar, bool); $n];
            #[inline]
            fn declare(self) -> (Self::Vars, Self::Keys, Option<VarId>) {
                let ($($a,)*) = self;
                $(let $a = $a.declare();)*
                let duplicate = duplicate(&[$(($a.1, $a.2)),*]);
                ([$(($a.0, $a.2)),*], ($($a.3,)*), duplicate)
            }
        }

        impl<$($k: AccessKeys),*> AccessKeys for ($($k,)*) {
            type Guards<'c> = ($($k::Guards<'c>,)*);
            type Refs<'g> = ($($k::Refs<'g>,)*);
            #[inline]
            fn guards<'c>(&self, ctx: &'c OpCtx) -> Result<Self::Guards<'c>, Error> {
                let ($($k,)*) = self;
                Ok(($($k.guards(ctx)?,)*))
            }
            #[inline]
            fn refs<'g, 'c>(guards: &'g mut Self::Guards<'c>) -> Self::Refs<'g> {
                let ($($g,)*) = guards;
                ($($k::refs($g),)*)
            }
        }
    )*};
}
// The macro names each value after its type parameter (`A0`, `K0`).
#[allow(non_snake_case)]
mod tuple_impls {
    use super::*;
    tuples! {
        1 (A0 K0 g0)
        2 (A0 K0 g0, A1 K1 g1)
        3 (A0 K0 g0, A1 K1 g1, A2 K2 g2)
        4 (A0 K0 g0, A1 K1 g1, A2 K2 g2, A3 K3 g3)
        5 (A0 K0 g0, A1 K1 g1, A2 K2 g2, A3 K3 g3, A4 K4 g4)
        6 (A0 K0 g0, A1 K1 g1, A2 K2 g2, A3 K3 g3, A4 K4 g4, A5 K5 g5)
        7 (A0 K0 g0, A1 K1 g1, A2 K2 g2, A3 K3 g3, A4 K4 g4, A5 K5 g5, A6 K6 g6)
        8 (A0 K0 g0, A1 K1 g1, A2 K2 g2, A3 K3 g3, A4 K4 g4, A5 K5 g5, A6 K6 g6, A7 K7 g7)
    }
}

/// An op whose body gets the values of the variables it declared, made by
/// `with` on a builder `B`: an [`OpBuilder`] ([`OpBuilder::with`]: push it
/// with [`run`](TypedOp::run) (the body gets `&T`/`&mut T`),
/// [`run_with_ctx`](TypedOp::run_with_ctx) (and the [`OpCtx`]) or
/// [`run_async`](TypedOp::run_async)), or an `OpBuilder<'_, O, Reusable>` ([`Ops::op`]:
/// pushed or recorded by `run` or `run_with_ctx`, with a body that may run
/// many times).
///
/// Set the op's other options (name, priority, device, lane, resource
/// units, more variables) on the builder before `with`.
#[must_use = "a TypedOp does nothing until it is run"]
#[derive(Debug)]
pub struct TypedOp<B, K> {
    builder: B,
    keys: K,
    /// A variable declared twice, once at least as written: reported by
    /// `run` as [`Error::Borrowed`].
    duplicate: Option<VarId>,
}

impl<B, K: AccessKeys> TypedOp<B, K> {
    /// The typed op on `builder`, which has declared the accesses' variables.
    #[inline]
    pub(super) fn new(builder: B, keys: K, duplicate: Option<VarId>) -> Self {
        Self {
            builder,
            keys,
            duplicate,
        }
    }

    /// The builder and the keys, unless the accesses name a variable twice,
    /// once at least as written.
    #[inline]
    fn checked(self) -> Result<(B, K), Error> {
        match self.duplicate {
            Some(id) => Err(Error::Borrowed(id)),
            None => Ok((self.builder, self.keys)),
        }
    }
}

impl<'a, K: AccessKeys> TypedOp<OpBuilder<'a>, K> {
    /// Pushes the op with a synchronous body, which gets the values of the
    /// declared variables in order: `&T` for a [`read()`], `&mut T` for a
    /// [`write()`]. See [`OpBuilder::with`].
    ///
    /// # Errors
    ///
    /// As for [`Engine::push`](crate::Engine::push), and
    /// [`Error::Borrowed`] if the accesses name a variable twice, once at
    /// least with [`write()`] (two reads of one variable are fine).
    #[inline]
    pub fn run<F, T>(self, f: F) -> Result<OpHandle<T>, Error>
    where
        F: for<'g> FnOnce(K::Refs<'g>) -> Result<T, BoxError> + Send + 'static,
        T: Send + 'static,
    {
        self.run_with_ctx(move |_, refs| f(refs))
    }

    /// Like [`run`](Self::run), for a body that needs the op's context too
    /// (its stream on a stream device, its name, its device).
    ///
    /// The context still reaches the declared variables, but a value the
    /// body was handed is borrowed: [`OpCtx::write`] on it gives
    /// [`Error::Borrowed`].
    ///
    /// # Errors
    ///
    /// As for [`run`](Self::run).
    ///
    /// ```
    /// use depflow::{Engine, Executor, write};
    ///
    /// let engine = Engine::builder().device("gpu", Executor::simulated_gpu(1)).build()?;
    /// let gpu = engine.device("gpu").unwrap();
    /// let buf = engine.var(vec![0u8; 4]);
    /// engine.op().on(gpu).with(write(&buf)).run_with_ctx(|ctx, buf| {
    ///     let _stream = ctx.stream()?; // enqueue work here
    ///     buf.fill(7);
    ///     Ok(())
    /// })?;
    /// assert_eq!(engine.get(&buf).wait()?, vec![7; 4]);
    /// # Ok::<(), depflow::Error>(())
    /// ```
    #[inline]
    pub fn run_with_ctx<F, T>(self, f: F) -> Result<OpHandle<T>, Error>
    where
        F: for<'g> FnOnce(&'g OpCtx, K::Refs<'g>) -> Result<T, BoxError> + Send + 'static,
        T: Send + 'static,
    {
        // Not through `checked`: moving the builder out in a `Result` cost
        // 40 instructions an op (benches/push_cost.rs, typed).
        if let Some(id) = self.duplicate {
            return Err(Error::Borrowed(id));
        }
        let keys = self.keys;
        self.builder.run(move |ctx| {
            let mut guards = keys.guards(ctx)?;
            f(ctx, K::refs(&mut guards))
        })
    }

    /// Pushes the op with an asynchronous body, which gets a [`TypedCtx`]:
    /// its [`get`](TypedCtx::get) borrows the declared variables' values,
    /// which the future may hold across `.await`s.
    ///
    /// # Errors
    ///
    /// As for [`run`](Self::run).
    ///
    /// ```
    /// use depflow::{Engine, read, write};
    ///
    /// let engine = Engine::new();
    /// let (src, dst) = (engine.var(vec![1u8, 2, 3]), engine.var(Vec::new()));
    /// let copied = engine.op().with((read(&src), write(&dst))).run_async(|mut vars| async move {
    ///     let (src, mut dst) = vars.get()?;
    ///     let data = async { src.clone() }.await; // e.g. an upload
    ///     dst.extend(data);
    ///     Ok(dst.len())
    /// })?;
    /// assert_eq!(copied.wait()?, 3);
    /// # Ok::<(), depflow::Error>(())
    /// ```
    #[inline]
    pub fn run_async<F, Fut, T>(self, f: F) -> Result<OpHandle<T>, Error>
    where
        F: FnOnce(TypedCtx<K>) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, BoxError>> + Send + 'static,
        T: Send + 'static,
    {
        let (builder, keys) = self.checked()?;
        builder.run_async(move |ctx| f(TypedCtx { ctx, keys }))
    }
}

impl<'a, O: Ops + ?Sized, K: AccessKeys> TypedOp<OpBuilder<'a, O, Reusable>, K> {
    /// Pushes or records the op (see [`OpBuilder::run`](OpBuilder#method.run-1)) with a body that gets
    /// the values of the declared variables in order: `&T` for a
    /// [`read()`] of a `Var<T>` (`&[T]` of a `Buffer<T>`), `&mut T` for a
    /// [`write()`]. The body may run many times (once per replay).
    ///
    /// # Errors
    ///
    /// As for [`OpBuilder::run`](OpBuilder#method.run-1), and [`Error::Borrowed`] if the accesses name
    /// a variable twice, once at least with [`write()`].
    ///
    /// ```
    /// use depflow::{Buffer, Engine, Error, Ops, Var, read, write};
    ///
    /// /// `y = x + 1` through a scratch buffer: pushed or recorded alike.
    /// fn plus_one(ops: &impl Ops, x: &Var<Vec<f32>>, y: &Var<Vec<f32>>) -> Result<(), Error> {
    ///     let t: Buffer<f32> = ops.buffer(2);
    ///     ops.op().with((read(x), write(&t))).run(|(x, t)| {
    ///         t.iter_mut().zip(x).for_each(|(t, x)| *t = x + 1.0);
    ///         Ok(())
    ///     })?;
    ///     ops.op().with((read(&t), write(y))).run(|(t, y)| {
    ///         y.copy_from_slice(t);
    ///         Ok(())
    ///     })?;
    ///     Ok(())
    /// }
    ///
    /// let engine = Engine::new();
    /// let (x, y) = (engine.var(vec![1.0, 2.0]), engine.var(vec![0.0; 2]));
    /// plus_one(&engine, &x, &y)?; // pushed: runs now
    /// assert_eq!(engine.get(&y).wait()?, [2.0, 3.0]);
    /// let graph = engine.record(|rec| plus_one(rec, &y, &x))?; // recorded
    /// graph.replay().wait()?;
    /// assert_eq!(engine.get(&x).wait()?, [3.0, 4.0]);
    /// # Ok::<(), Error>(())
    /// ```
    #[inline]
    pub fn run<F, T>(self, f: F) -> Result<O::Handle<T>, Error>
    where
        F: for<'g> Fn(K::Refs<'g>) -> Result<T, BoxError> + Send + Sync + 'static,
        T: Send + 'static,
    {
        self.run_with_ctx(move |_, refs| f(refs))
    }

    /// Like [`run`](Self::run), for a body that needs the op's context too.
    /// See [`TypedOp::<OpBuilder, K>::run_with_ctx`](TypedOp::run_with_ctx).
    ///
    /// # Errors
    ///
    /// As for [`run`](Self::run).
    #[inline]
    pub fn run_with_ctx<F, T>(self, f: F) -> Result<O::Handle<T>, Error>
    where
        F: for<'g> Fn(&'g OpCtx, K::Refs<'g>) -> Result<T, BoxError> + Send + Sync + 'static,
        T: Send + 'static,
    {
        let (builder, keys) = self.checked()?;
        builder.run(move |ctx| {
            let mut guards = keys.guards(ctx)?;
            f(ctx, K::refs(&mut guards))
        })
    }
}

/// What a typed async body gets (see [`TypedOp::run_async`]): the op's
/// context, and access to exactly the variables it declared.
#[derive(Debug)]
pub struct TypedCtx<K> {
    ctx: OpCtx,
    keys: K,
}

impl<K: AccessKeys> TypedCtx<K> {
    /// Borrows the declared variables' values, in order: a [`VarRef`] for a
    /// [`read()`], a [`VarMut`] for a [`write()`] (a tuple for a tuple of
    /// accesses). They borrow `self`, so the body holds one set at a time.
    ///
    /// # Errors
    ///
    /// [`Error::Deleted`] if a variable has no value (never for a variable
    /// the engine lets the op run on); the others `OpCtx` could report
    /// cannot happen here.
    ///
    /// A second set while the first is held does not compile:
    ///
    /// ```compile_fail,E0499
    /// use depflow::{Engine, write};
    ///
    /// let engine = Engine::new();
    /// let v = engine.var(0);
    /// engine.op().with(write(&v)).run_async(|mut vars| async move {
    ///     let mut a = vars.get()?;
    ///     let mut b = vars.get()?; // `vars` is already borrowed by `a`
    ///     *a += 1;
    ///     *b += 1;
    ///     Ok(())
    /// })?;
    /// # Ok::<(), depflow::Error>(())
    /// ```
    pub fn get(&mut self) -> Result<K::Guards<'_>, Error> {
        self.keys.guards(&self.ctx)
    }

    /// The op's context (its name, its device).
    pub fn ctx(&self) -> &OpCtx {
        &self.ctx
    }
}
