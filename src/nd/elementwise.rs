//! Elementwise operations: of two arrays (NumPy broadcasting), of an array
//! and a scalar, of one array; out of place (a new array) or in place
//! (mutating the target). Each pushes one op whose kernel is ndarray's
//! `Zip`; operands of one shape go through flat views, so the common case
//! pays no broadcasting.
//!
//! Each kernel is a zero-sized type, so that the loop is compiled for it.

use ndarray::{ArrayView1, ArrayViewMut1, Zip};

use super::derivatives::{BinaryGrad, ScalarGrad, UnaryGrad};
use super::shape::{broadcast, broadcasts_to, same_device, view, view_mut};
use super::{Array, mode};
use crate::error::{BoxError, Error};

/// A function of two floats, applied elementwise.
pub(super) trait Binary: Send + Sync + 'static {
    const NAME: &'static str;
    fn f(x: f32, y: f32) -> f32;
}

/// A function of one float, applied elementwise.
pub(super) trait Unary: Send + Sync + 'static {
    const NAME: &'static str;
    fn f(x: f32) -> f32;
}

macro_rules! kernels {
    ($trait:ident: $($kernel:ident $name:literal |$($arg:ident),*| $body:expr;)*) => {$(
        pub(super) struct $kernel;
        impl $trait for $kernel {
            const NAME: &'static str = $name;
            #[inline(always)]
            fn f($($arg: f32),*) -> f32 {
                $body
            }
        }
    )*};
}

fn truth(b: bool) -> f32 {
    if b { 1.0 } else { 0.0 }
}

kernels! { Binary:
    Add "add" |x, y| x + y;
    Sub "sub" |x, y| x - y;
    Mul "mul" |x, y| x * y;
    Div "div" |x, y| x / y;
    Maximum "maximum" |x, y| x.max(y);
    Minimum "minimum" |x, y| x.min(y);
    Pow "pow" |x, y| x.powf(y);
    Equal "eq" |x, y| truth(x == y);
    Greater "gt" |x, y| truth(x > y);
    GreaterEqual "ge" |x, y| truth(x >= y);
    Less "lt" |x, y| truth(x < y);
    LessEqual "le" |x, y| truth(x <= y);
    // The right operand: `assign`.
    Right "assign" |_x, y| y;
}

kernels! { Unary:
    Neg "neg" |x| -x;
    Exp "exp" |x| x.exp();
    Log "log" |x| x.ln();
    Relu "relu" |x| if x > 0.0 { x } else { 0.0 };
    Sigmoid "sigmoid" |x| 1.0 / (1.0 + (-x).exp());
    Tanh "tanh" |x| x.tanh();
    Sqrt "sqrt" |x| x.sqrt();
    Abs "abs" |x| x.abs();
    Square "square" |x| x * x;
}

/// `y` applied to a scalar `s` on the right (`x op s`) or on the left
/// (`s op x`).
#[derive(Clone, Copy)]
enum Side {
    Right,
    Left,
}

impl Array {
    /// `self op other`, broadcast, as a new array.
    pub(super) fn zip<K: BinaryGrad>(&self, other: &Array) -> Result<Array, Error> {
        same_device(K::NAME, &[self, other])?;
        let shape = broadcast(K::NAME, self.shape(), other.shape())?;
        let out = Array::uninit(self.engine(), self.device(), shape.clone());
        let (x, y, o) = (
            self.buffer().clone(),
            other.buffer().clone(),
            out.buffer().clone(),
        );
        let (sx, sy) = (self.shape_arc().clone(), other.shape_arc().clone());
        let flat = sx == sy;
        mode::submit(
            self.engine(),
            self.device(),
            K::NAME,
            &[self.buffer(), other.buffer()],
            &[out.buffer()],
            move |ctx| {
                let (xd, yd, mut od) = (ctx.read(&x)?, ctx.read(&y)?, ctx.write(&o)?);
                if flat {
                    Zip::from(ArrayViewMut1::from(&mut od[..]))
                        .and(ArrayView1::from(&xd[..]))
                        .and(ArrayView1::from(&yd[..]))
                        .for_each(|o, &x, &y| *o = K::f(x, y));
                } else {
                    Zip::from(view_mut(&shape, &mut od)?)
                        .and_broadcast(view(&sx, &xd)?)
                        .and_broadcast(view(&sy, &yd)?)
                        .for_each(|o, &x, &y| *o = K::f(x, y));
                }
                Ok(())
            },
        )?;
        Ok(out.tracked(K::NAME, &[self, other], |_| {
            let (x, y) = (self.clone(), other.clone());
            Box::new(move |dy| {
                let [dx, dy_y] = K::grads(&x, &y, dy)?;
                Ok(vec![
                    dx.map(|g| g.sum_to(x.shape())).transpose()?,
                    dy_y.map(|g| g.sum_to(y.shape())).transpose()?,
                ])
            })
        }))
    }

    /// `self = self op other`, `other` broadcast to `self`'s shape.
    pub(super) fn zip_assign<K: Binary>(&self, other: &Array) -> Result<(), Error> {
        self.writable(K::NAME)?;
        same_device(K::NAME, &[self, other])?;
        broadcasts_to(K::NAME, other.shape(), self.shape())?;
        let (t, y) = (self.buffer().clone(), other.buffer().clone());
        let (st, sy) = (self.shape_arc().clone(), other.shape_arc().clone());
        let alias = self.shares_data(other);
        let flat = st == sy;
        mode::submit(
            self.engine(),
            self.device(),
            K::NAME,
            &[other.buffer()],
            &[self.buffer()],
            move |ctx| {
                if alias {
                    // The same values on both sides (equal lengths, so the
                    // shapes differ at most by leading 1s).
                    let mut td = ctx.write(&t)?;
                    ArrayViewMut1::from(&mut td[..]).mapv_inplace(|v| K::f(v, v));
                    return Ok(());
                }
                let (yd, mut td) = (ctx.read(&y)?, ctx.write(&t)?);
                if flat {
                    Zip::from(ArrayViewMut1::from(&mut td[..]))
                        .and(ArrayView1::from(&yd[..]))
                        .for_each(|t, &y| *t = K::f(*t, y));
                } else {
                    Zip::from(view_mut(&st, &mut td)?)
                        .and_broadcast(view(&sy, &yd)?)
                        .for_each(|t, &y| *t = K::f(*t, y));
                }
                Ok(())
            },
        )
    }

    fn scalar<K: ScalarGrad>(&self, s: f32, side: Side) -> Result<Array, Error> {
        let out = Array::uninit(self.engine(), self.device(), self.shape_arc().clone());
        let (x, o) = (self.buffer().clone(), out.buffer().clone());
        mode::submit(
            self.engine(),
            self.device(),
            K::NAME,
            &[self.buffer()],
            &[out.buffer()],
            move |ctx| {
                let (xd, mut od) = (ctx.read(&x)?, ctx.write(&o)?);
                let zip =
                    Zip::from(ArrayViewMut1::from(&mut od[..])).and(ArrayView1::from(&xd[..]));
                match side {
                    Side::Right => zip.for_each(|o, &x| *o = K::f(x, s)),
                    Side::Left => zip.for_each(|o, &x| *o = K::f(s, x)),
                }
                Ok(())
            },
        )?;
        Ok(out.tracked(K::NAME, &[self], |_| {
            let x = self.clone();
            let left = matches!(side, Side::Left);
            Box::new(move |dy| Ok(vec![K::grad(&x, s, left, dy)?]))
        }))
    }

    fn scalar_assign<K: Binary>(&self, s: f32) -> Result<(), Error> {
        self.mutate(K::NAME, move |td| {
            ArrayViewMut1::from(td).mapv_inplace(|v| K::f(v, s));
            Ok(())
        })
    }

    /// Pushes an op that mutates `self`'s values with `f`.
    pub(super) fn mutate<F>(&self, name: &'static str, f: F) -> Result<(), Error>
    where
        F: Fn(&mut [f32]) -> Result<(), BoxError> + Send + Sync + 'static,
    {
        self.writable(name)?;
        self.mutate_unchecked(name, f)
    }

    /// Checks that operation `op` may change `self` in place: not while a
    /// gradient flows through it (the backward pass would read the new
    /// values), unless gradients are off ([`no_grad`](super::no_grad),
    /// where updates run).
    pub(super) fn writable(&self, op: &'static str) -> Result<(), Error> {
        if self.requires_grad() && super::is_grad_enabled() {
            return Err(super::shape::misfit(
                op,
                format!(
                    "an in-place operation on an array of shape {:?} that requires a gradient: \
                     update it inside nd::no_grad, or use the operation that returns a new array",
                    self.shape()
                ),
            ));
        }
        Ok(())
    }

    /// [`mutate`](Self::mutate) without the check.
    fn mutate_unchecked<F>(&self, name: &'static str, f: F) -> Result<(), Error>
    where
        F: Fn(&mut [f32]) -> Result<(), BoxError> + Send + Sync + 'static,
    {
        let t = self.buffer().clone();
        mode::submit(
            self.engine(),
            self.device(),
            name,
            &[],
            &[self.buffer()],
            move |ctx| f(&mut ctx.write(&t)?),
        )
    }

    pub(super) fn map<K: UnaryGrad>(&self) -> Result<Array, Error> {
        let out = Array::uninit(self.engine(), self.device(), self.shape_arc().clone());
        let (x, o) = (self.buffer().clone(), out.buffer().clone());
        mode::submit(
            self.engine(),
            self.device(),
            K::NAME,
            &[self.buffer()],
            &[out.buffer()],
            move |ctx| {
                let (xd, mut od) = (ctx.read(&x)?, ctx.write(&o)?);
                Zip::from(ArrayViewMut1::from(&mut od[..]))
                    .and(ArrayView1::from(&xd[..]))
                    .for_each(|o, &x| *o = K::f(x));
                Ok(())
            },
        )?;
        Ok(out.tracked(K::NAME, &[self], |y| {
            let x = self.clone();
            Box::new(move |dy| Ok(vec![Some(K::grad(&x, &y, dy)?)]))
        }))
    }

    /// A failed array standing in for the result of `op`, for operators,
    /// which cannot return the error: of `self`'s shape, and poisoned by
    /// `error` (its reads resolve to it).
    pub(super) fn failed(&self, error: Error) -> Array {
        let out = Array::uninit(self.engine(), self.device(), self.shape_arc().clone());
        out.poison(error);
        out
    }

    /// Pushes an op that fails with `error`, poisoning `self` with it.
    pub(super) fn poison(&self, error: Error) {
        let name = match &error {
            Error::Array { op, .. } => op,
            _ => "nd",
        };
        // Refused only if the engine is shut down, when every later read is
        // refused too.
        let _ = self.mutate_unchecked(name, move |_| Err(Box::new(error.clone())));
    }
}

macro_rules! binary_methods {
    ($($(#[$doc:meta])* $method:ident $assign:ident $scalar:ident $rscalar:ident $scalar_assign:ident => $kernel:ident;)*) => {
        impl Array {$(
            $(#[$doc])*
            ///
            /// # Errors
            ///
            /// [`Error::Array`] if the shapes do not broadcast or the
            /// arrays are on different devices; [`Error::ShutDown`] after
            /// shutdown.
            pub fn $method(&self, other: &Array) -> Result<Array, Error> {
                self.zip::<$kernel>(other)
            }

            /// In place: `self` becomes
            #[doc = concat!("`self.", stringify!($method), "(other)`,")]
            /// `other` broadcast to `self`'s shape (the op mutates `self`).
            ///
            /// # Errors
            ///
            /// [`Error::Array`] if `other` does not broadcast to `self`'s
            /// shape or is on another device.
            pub fn $assign(&self, other: &Array) -> Result<(), Error> {
                self.zip_assign::<$kernel>(other)
            }

            /// With a scalar on the right: each element `x` becomes
            #[doc = concat!("`", stringify!($method), "(x, s)`.")]
            ///
            /// # Errors
            ///
            /// [`Error::ShutDown`] after shutdown.
            pub fn $scalar(&self, s: f32) -> Result<Array, Error> {
                self.scalar::<$kernel>(s, Side::Right)
            }

            /// With a scalar on the left: each element `x` becomes
            #[doc = concat!("`", stringify!($method), "(s, x)`.")]
            ///
            /// # Errors
            ///
            /// [`Error::ShutDown`] after shutdown.
            pub fn $rscalar(&self, s: f32) -> Result<Array, Error> {
                self.scalar::<$kernel>(s, Side::Left)
            }

            /// In place, with a scalar on the right.
            ///
            /// # Errors
            ///
            /// [`Error::ShutDown`] after shutdown.
            pub fn $scalar_assign(&self, s: f32) -> Result<(), Error> {
                self.scalar_assign::<$kernel>(s)
            }
        )*}
    };
}

binary_methods! {
    /// `self + other`.
    add add_assign add_scalar radd_scalar add_assign_scalar => Add;
    /// `self - other`.
    sub sub_assign sub_scalar rsub_scalar sub_assign_scalar => Sub;
    /// `self * other`, elementwise.
    mul mul_assign mul_scalar rmul_scalar mul_assign_scalar => Mul;
    /// `self / other`.
    div div_assign div_scalar rdiv_scalar div_assign_scalar => Div;
}

macro_rules! compare_methods {
    ($($(#[$doc:meta])* $method:ident $scalar:ident => $kernel:ident;)*) => {
        impl Array {$(
            $(#[$doc])*
            ///
            /// # Errors
            ///
            /// [`Error::Array`] if the shapes do not broadcast or the
            /// arrays are on different devices; [`Error::ShutDown`] after
            /// shutdown.
            pub fn $method(&self, other: &Array) -> Result<Array, Error> {
                self.zip::<$kernel>(other)
            }

            /// With a scalar on the right: each element `x` becomes
            #[doc = concat!("`", stringify!($method), "(x, s)`.")]
            ///
            /// # Errors
            ///
            /// [`Error::ShutDown`] after shutdown.
            pub fn $scalar(&self, s: f32) -> Result<Array, Error> {
                self.scalar::<$kernel>(s, Side::Right)
            }
        )*}
    };
}

compare_methods! {
    /// The larger of each pair (`f32::max`: a NaN loses to a number).
    maximum maximum_scalar => Maximum;
    /// The smaller of each pair (`f32::min`).
    minimum minimum_scalar => Minimum;
    /// `self` to the power `other` (`f32::powf`).
    pow pow_scalar => Pow;
    /// 1 where `self == other`, else 0.
    eq eq_scalar => Equal;
    /// 1 where `self > other`, else 0.
    gt gt_scalar => Greater;
    /// 1 where `self >= other`, else 0.
    ge ge_scalar => GreaterEqual;
    /// 1 where `self < other`, else 0.
    lt lt_scalar => Less;
    /// 1 where `self <= other`, else 0.
    le le_scalar => LessEqual;
}

macro_rules! unary_methods {
    ($($(#[$doc:meta])* $method:ident => $kernel:ident;)*) => {
        impl Array {$(
            $(#[$doc])*
            ///
            /// # Errors
            ///
            /// [`Error::ShutDown`] after shutdown.
            pub fn $method(&self) -> Result<Array, Error> {
                self.map::<$kernel>()
            }
        )*}
    };
}

unary_methods! {
    /// `-x` for each element.
    neg => Neg;
    /// `eˣ` (`f32::exp`).
    exp => Exp;
    /// The natural logarithm (`f32::ln`).
    log => Log;
    /// `max(x, 0)` (0 for NaN).
    relu => Relu;
    /// `1 / (1 + e⁻ˣ)`.
    sigmoid => Sigmoid;
    /// `tanh x` (`f32::tanh`).
    tanh => Tanh;
    /// `√x` (`f32::sqrt`).
    sqrt => Sqrt;
    /// `|x|`.
    abs => Abs;
    /// `x * x`.
    square => Square;
}

impl Array {
    /// Copies `other`'s values into `self` (broadcast to its shape), in
    /// program order with the other operations on both: how a step writes
    /// its result into an array made outside a recording.
    ///
    /// ```
    /// use depflow::{Engine, Error, nd};
    ///
    /// let engine = Engine::new();
    /// let arrays = nd::Arrays::new(&engine);
    /// let a = arrays.zeros(&[2, 2])?;
    /// a.assign(&arrays.from_vec(vec![1.0, 2.0], &[2])?)?; // each row
    /// assert_eq!(a.to_vec().wait()?, [1.0, 2.0, 1.0, 2.0]);
    /// # Ok::<(), Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Array`] if `other` does not broadcast to `self`'s shape or
    /// is on another device.
    pub fn assign(&self, other: &Array) -> Result<(), Error> {
        self.zip_assign::<Right>(other)
    }

    /// Sets the values to `values`, in row-major order: how a loop feeds
    /// each batch into an input array that a recorded step reads.
    ///
    /// ```
    /// use depflow::{Engine, Error, nd};
    ///
    /// let arrays = nd::Arrays::new(&Engine::new());
    /// let x = arrays.zeros(&[2])?;
    /// x.set(vec![4.0, 5.0])?;
    /// assert_eq!(x.to_vec().wait()?, [4.0, 5.0]);
    /// # Ok::<(), Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Array`] if `values` has another length than the array.
    pub fn set(&self, values: Vec<f32>) -> Result<(), Error> {
        if values.len() != self.len() {
            return Err(super::shape::misfit(
                "set",
                format!(
                    "{} values for shape {:?} ({} elements)",
                    values.len(),
                    self.shape(),
                    self.len()
                ),
            ));
        }
        self.mutate("set", move |t| {
            t.copy_from_slice(&values);
            Ok(())
        })
    }

    /// Sets every element to `value`.
    ///
    /// # Errors
    ///
    /// [`Error::ShutDown`] after shutdown.
    pub fn fill(&self, value: f32) -> Result<(), Error> {
        self.mutate("fill", move |t| {
            t.fill(value);
            Ok(())
        })
    }
}
