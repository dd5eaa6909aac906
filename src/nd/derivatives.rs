//! The derivatives of the elementwise kernels, as array operations (so a
//! backward pass is engine ops too), and the reduction of a broadcast
//! operand's gradient back to its shape.
//!
//! They run inside the backward pass, where gradients are off: nothing
//! here builds the graph.

use super::Array;
use super::elementwise::{
    Abs, Add, Binary, Div, Equal, Exp, Greater, GreaterEqual, Less, LessEqual, Log, Maximum,
    Minimum, Mul, Neg, Pow, Relu, Right, Sigmoid, Sqrt, Square, Sub, Tanh, Unary,
};
use crate::error::Error;

/// The gradients of `x op y` for `x` and `y`, at the broadcast shape (the
/// caller sums them back to each operand's), given the result's gradient
/// `dy`; `None` where none flows (comparisons).
pub(super) trait BinaryGrad: Binary {
    fn grads(x: &Array, y: &Array, dy: &Array) -> Result<[Option<Array>; 2], Error>;
}

/// The gradient of `x op s` (or `s op x`, `left`) for `x`.
pub(super) trait ScalarGrad: Binary {
    fn grad(x: &Array, s: f32, left: bool, dy: &Array) -> Result<Option<Array>, Error>;
}

/// The gradient of `f(x)` for `x`, given `y = f(x)` (detached).
pub(super) trait UnaryGrad: Unary {
    fn grad(x: &Array, y: &Array, dy: &Array) -> Result<Array, Error>;
}

impl BinaryGrad for Add {
    fn grads(_: &Array, _: &Array, dy: &Array) -> Result<[Option<Array>; 2], Error> {
        Ok([Some(dy.clone()), Some(dy.clone())])
    }
}

impl BinaryGrad for Sub {
    fn grads(_: &Array, _: &Array, dy: &Array) -> Result<[Option<Array>; 2], Error> {
        Ok([Some(dy.clone()), Some(dy.neg()?)])
    }
}

impl BinaryGrad for Mul {
    fn grads(x: &Array, y: &Array, dy: &Array) -> Result<[Option<Array>; 2], Error> {
        Ok([Some(dy.mul(y)?), Some(dy.mul(x)?)])
    }
}

impl BinaryGrad for Div {
    fn grads(x: &Array, y: &Array, dy: &Array) -> Result<[Option<Array>; 2], Error> {
        // d(x/y)/dy = -x / y²
        let dx = dy.div(y)?;
        let dy_y = dx.mul(x)?.div(y)?.neg()?;
        Ok([Some(dx), Some(dy_y)])
    }
}

impl BinaryGrad for Maximum {
    fn grads(x: &Array, y: &Array, dy: &Array) -> Result<[Option<Array>; 2], Error> {
        // A tie's gradient goes to `x`.
        let to_x = x.ge(y)?;
        Ok([Some(dy.mul(&to_x)?), Some(dy.mul(&to_x.rsub_scalar(1.0)?)?)])
    }
}

impl BinaryGrad for Minimum {
    fn grads(x: &Array, y: &Array, dy: &Array) -> Result<[Option<Array>; 2], Error> {
        let to_x = x.le(y)?;
        Ok([Some(dy.mul(&to_x)?), Some(dy.mul(&to_x.rsub_scalar(1.0)?)?)])
    }
}

impl BinaryGrad for Pow {
    fn grads(x: &Array, y: &Array, dy: &Array) -> Result<[Option<Array>; 2], Error> {
        // d(xʸ)/dx = y xʸ⁻¹, d(xʸ)/dy = xʸ ln x
        let dx = dy.mul(&y.mul(&x.pow(&y.sub_scalar(1.0)?)?)?)?;
        let dy_y = dy.mul(&x.pow(y)?.mul(&x.log()?)?)?;
        Ok([Some(dx), Some(dy_y)])
    }
}

macro_rules! no_gradient {
    ($($kernel:ident),*) => {$(
        impl BinaryGrad for $kernel {
            fn grads(_: &Array, _: &Array, _: &Array) -> Result<[Option<Array>; 2], Error> {
                Ok([None, None])
            }
        }
        impl ScalarGrad for $kernel {
            fn grad(_: &Array, _: f32, _: bool, _: &Array) -> Result<Option<Array>, Error> {
                Ok(None)
            }
        }
    )*};
}

no_gradient!(Equal, Greater, GreaterEqual, Less, LessEqual, Right);

impl ScalarGrad for Add {
    fn grad(_: &Array, _: f32, _: bool, dy: &Array) -> Result<Option<Array>, Error> {
        Ok(Some(dy.clone()))
    }
}

impl ScalarGrad for Sub {
    fn grad(_: &Array, _: f32, left: bool, dy: &Array) -> Result<Option<Array>, Error> {
        Ok(Some(if left { dy.neg()? } else { dy.clone() }))
    }
}

impl ScalarGrad for Mul {
    fn grad(_: &Array, s: f32, _: bool, dy: &Array) -> Result<Option<Array>, Error> {
        Ok(Some(dy.mul_scalar(s)?))
    }
}

impl ScalarGrad for Div {
    fn grad(x: &Array, s: f32, left: bool, dy: &Array) -> Result<Option<Array>, Error> {
        Ok(Some(if left {
            // d(s/x)/dx = -s / x²
            dy.mul_scalar(-s)?.div(&x.square()?)?
        } else {
            dy.div_scalar(s)?
        }))
    }
}

impl ScalarGrad for Maximum {
    fn grad(x: &Array, s: f32, _: bool, dy: &Array) -> Result<Option<Array>, Error> {
        Ok(Some(dy.mul(&x.ge_scalar(s)?)?))
    }
}

impl ScalarGrad for Minimum {
    fn grad(x: &Array, s: f32, _: bool, dy: &Array) -> Result<Option<Array>, Error> {
        Ok(Some(dy.mul(&x.le_scalar(s)?)?))
    }
}

impl ScalarGrad for Pow {
    fn grad(x: &Array, s: f32, left: bool, dy: &Array) -> Result<Option<Array>, Error> {
        Ok(Some(if left {
            // d(sˣ)/dx = sˣ ln s, sˣ = e^(x ln s)
            dy.mul(&x.mul_scalar(s.ln())?.exp()?.mul_scalar(s.ln())?)?
        } else {
            dy.mul(&x.pow_scalar(s - 1.0)?.mul_scalar(s)?)?
        }))
    }
}

impl UnaryGrad for Neg {
    fn grad(_: &Array, _: &Array, dy: &Array) -> Result<Array, Error> {
        dy.neg()
    }
}

impl UnaryGrad for Exp {
    fn grad(_: &Array, y: &Array, dy: &Array) -> Result<Array, Error> {
        dy.mul(y)
    }
}

impl UnaryGrad for Log {
    fn grad(x: &Array, _: &Array, dy: &Array) -> Result<Array, Error> {
        dy.div(x)
    }
}

impl UnaryGrad for Relu {
    fn grad(x: &Array, _: &Array, dy: &Array) -> Result<Array, Error> {
        dy.mul(&x.gt_scalar(0.0)?)
    }
}

impl UnaryGrad for Sigmoid {
    fn grad(_: &Array, y: &Array, dy: &Array) -> Result<Array, Error> {
        dy.mul(&y.mul(&y.rsub_scalar(1.0)?)?)
    }
}

impl UnaryGrad for Tanh {
    fn grad(_: &Array, y: &Array, dy: &Array) -> Result<Array, Error> {
        dy.mul(&y.square()?.rsub_scalar(1.0)?)
    }
}

impl UnaryGrad for Sqrt {
    fn grad(_: &Array, y: &Array, dy: &Array) -> Result<Array, Error> {
        dy.div(&y.mul_scalar(2.0)?)
    }
}

impl UnaryGrad for Abs {
    fn grad(x: &Array, _: &Array, dy: &Array) -> Result<Array, Error> {
        // sign(x), 0 at 0
        dy.mul(&x.gt_scalar(0.0)?.sub(&x.lt_scalar(0.0)?)?)
    }
}

impl UnaryGrad for Square {
    fn grad(x: &Array, _: &Array, dy: &Array) -> Result<Array, Error> {
        dy.mul(&x.mul_scalar(2.0)?)
    }
}

impl Array {
    /// This gradient, of a broadcast result, summed back to `shape` (an
    /// operand's): over the leading axes the operand lacks, and the axes
    /// where it has length 1.
    pub(super) fn sum_to(&self, shape: &[usize]) -> Result<Array, Error> {
        if self.shape() == shape {
            return Ok(self.clone());
        }
        let mut g = self.clone();
        while g.ndim() > shape.len() {
            g = g.sum_axis(0)?;
        }
        for (axis, &len) in shape.iter().enumerate() {
            if len == 1 && g.shape()[axis] != 1 {
                g = g.sum_axis(axis)?;
                let mut kept = g.shape().to_vec();
                kept.insert(axis, 1);
                g = g.reshape(&kept)?;
            }
        }
        Ok(g)
    }
}
