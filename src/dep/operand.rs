//! What a body reaches through its [`OpCtx`]: an [`Operand`] (a variable,
//! its key, or a planned buffer), and the declarable ones with a known value
//! type, [`TypedVar`], which typed access (`read(&x)`, `write(&y)`) takes.
//!
//! One trait for both kinds, so that a body does not care whether its
//! operand is a variable (`Var<T>`, value `T`) or a planned buffer
//! (`Buffer<T>`, value `[T]`): `ctx.read(&x)` and `ctx.write(&y)` take
//! either, with the same checks and the same borrow counting.

use super::buffer::{Buffer, Element};
use super::ctx::{OpCtx, VarMut, VarRef};
use super::var::{AnyVar, Var, VarKey};
use crate::error::Error;

mod sealed {
    pub trait Sealed {}
}

/// Something an op's body reads or writes through its context: a variable
/// (`&Var<T>`, or its [`VarKey<T>`]), whose value is `T`, or a planned
/// buffer (`&Buffer<T>`), whose value is `[T]`. Sealed.
///
/// ```
/// use depflow::Engine;
///
/// let engine = Engine::new();
/// let (n, total) = (engine.var(3u32), engine.var(0u32));
/// let graph = engine.record(|rec| {
///     let squares = rec.buffer::<u32>(4); // a planned buffer
///     rec.op().reads(&[&n]).mutates(&[&squares]).run({
///         let (n, squares) = (n.key(), squares.clone());
///         move |ctx| {
///             let n = *ctx.read(n)?; // a variable's key: a `u32`
///             for (i, s) in ctx.write(&squares)?.iter_mut().enumerate() {
///                 *s = n * i as u32; // the buffer: a `[u32]`
///             }
///             Ok(())
///         }
///     })?;
///     rec.op().reads(&[&squares]).mutates(&[&total]).run({
///         let (squares, total) = (squares.clone(), total.clone());
///         move |ctx| {
///             *ctx.write(&total)? = ctx.read(&squares)?.iter().sum();
///             Ok(())
///         }
///     })
/// })?;
/// graph.replay().wait()?;
/// assert_eq!(engine.get(&total).wait()?, 18);
/// # Ok::<(), depflow::Error>(())
/// ```
pub trait Operand: sealed::Sealed {
    /// What a body borrows: `T` for a variable of `T`, `[T]` for a buffer
    /// of `T`.
    type Value: ?Sized + Send + Sync + 'static;

    /// Borrows the value in `ctx` (see [`OpCtx::read`]).
    #[doc(hidden)]
    fn read_in<'c>(&self, ctx: &'c OpCtx) -> Result<VarRef<'c, Self::Value>, Error>;

    /// Borrows the value mutably in `ctx` (see [`OpCtx::write`]).
    #[doc(hidden)]
    fn write_in<'c>(&self, ctx: &'c OpCtx) -> Result<VarMut<'c, Self::Value>, Error>;
}

/// A variable an op may declare whose value type is known: a [`Var<T>`] or
/// a planned [`Buffer<T>`]. What [`read()`](crate::read) and
/// [`write()`](crate::write) take. Sealed.
pub trait TypedVar: AnyVar + Operand {
    /// What an op's body keeps to reach it: a copyable key for a variable,
    /// a handle for a buffer.
    #[doc(hidden)]
    type Key: Operand<Value = Self::Value> + Clone + Send + Sync + 'static;

    #[doc(hidden)]
    fn typed_key(&self) -> Self::Key;
}

impl<T> sealed::Sealed for VarKey<T> {}
impl<T> sealed::Sealed for Var<T> {}
impl<T: Element> sealed::Sealed for Buffer<T> {}
impl<O: sealed::Sealed + ?Sized> sealed::Sealed for &O {}

impl<T: Send + Sync + 'static> Operand for VarKey<T> {
    type Value = T;

    #[inline(always)]
    fn read_in<'c>(&self, ctx: &'c OpCtx) -> Result<VarRef<'c, T>, Error> {
        ctx.read_key(*self)
    }

    #[inline(always)]
    fn write_in<'c>(&self, ctx: &'c OpCtx) -> Result<VarMut<'c, T>, Error> {
        ctx.write_key(*self)
    }
}

impl<T: Send + Sync + 'static> Operand for Var<T> {
    type Value = T;

    #[inline(always)]
    fn read_in<'c>(&self, ctx: &'c OpCtx) -> Result<VarRef<'c, T>, Error> {
        ctx.read_key(self.key())
    }

    #[inline(always)]
    fn write_in<'c>(&self, ctx: &'c OpCtx) -> Result<VarMut<'c, T>, Error> {
        ctx.write_key(self.key())
    }
}

impl<T: Element> Operand for Buffer<T> {
    type Value = [T];

    #[inline]
    fn read_in<'c>(&self, ctx: &'c OpCtx) -> Result<VarRef<'c, [T]>, Error> {
        ctx.read_buffer(self)
    }

    #[inline]
    fn write_in<'c>(&self, ctx: &'c OpCtx) -> Result<VarMut<'c, [T]>, Error> {
        ctx.write_buffer(self)
    }
}

impl<O: Operand + ?Sized> Operand for &O {
    type Value = O::Value;

    #[inline(always)]
    fn read_in<'c>(&self, ctx: &'c OpCtx) -> Result<VarRef<'c, O::Value>, Error> {
        (**self).read_in(ctx)
    }

    #[inline(always)]
    fn write_in<'c>(&self, ctx: &'c OpCtx) -> Result<VarMut<'c, O::Value>, Error> {
        (**self).write_in(ctx)
    }
}

impl<T: Send + Sync + 'static> TypedVar for Var<T> {
    type Key = VarKey<T>;

    #[inline]
    fn typed_key(&self) -> VarKey<T> {
        self.key()
    }
}

impl<T: Element> TypedVar for Buffer<T> {
    type Key = Buffer<T>;

    #[inline]
    fn typed_key(&self) -> Buffer<T> {
        self.clone()
    }
}
