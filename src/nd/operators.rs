//! Operators: `&a + &b`, `&a * 2.0`, `1.0 - &a`, `-&a`, `a += &b`.
//!
//! An operator cannot return an error, so one whose operands do not fit
//! returns a *failed* array instead (or poisons its target, for `+=`): an
//! op that fails with the very [`Error::Array`](crate::Error::Array) the
//! method (`add`, `add_assign`, ...) returns, so that reading the result
//! resolves to it, as to any failed op. Never a panic. Use the methods to
//! get the error at the call.

use std::ops::{Add, AddAssign, Div, DivAssign, Mul, MulAssign, Neg, Sub, SubAssign};

use super::Array;
use super::elementwise;
use crate::error::Error;

impl Array {
    fn or_failed(&self, result: Result<Array, Error>) -> Array {
        result.unwrap_or_else(|e| self.failed(e))
    }

    fn or_poison(&self, result: Result<(), Error>) {
        if let Err(e) = result {
            self.poison(e);
        }
    }
}

macro_rules! operator {
    ($trait:ident $method:ident $assign_trait:ident $assign:ident, $kernel:ident, $scalar:ident $rscalar:ident $scalar_assign:ident) => {
        impl $trait<&Array> for &Array {
            type Output = Array;
            fn $method(self, rhs: &Array) -> Array {
                self.or_failed(self.zip::<elementwise::$kernel>(rhs))
            }
        }
        impl $trait<Array> for &Array {
            type Output = Array;
            fn $method(self, rhs: Array) -> Array {
                <&Array as $trait<&Array>>::$method(self, &rhs)
            }
        }
        impl $trait<&Array> for Array {
            type Output = Array;
            fn $method(self, rhs: &Array) -> Array {
                <&Array as $trait<&Array>>::$method(&self, rhs)
            }
        }
        impl $trait<Array> for Array {
            type Output = Array;
            fn $method(self, rhs: Array) -> Array {
                <&Array as $trait<&Array>>::$method(&self, &rhs)
            }
        }
        impl $trait<f32> for &Array {
            type Output = Array;
            fn $method(self, rhs: f32) -> Array {
                self.or_failed(self.$scalar(rhs))
            }
        }
        impl $trait<f32> for Array {
            type Output = Array;
            fn $method(self, rhs: f32) -> Array {
                <&Array as $trait<f32>>::$method(&self, rhs)
            }
        }
        impl $trait<&Array> for f32 {
            type Output = Array;
            fn $method(self, rhs: &Array) -> Array {
                rhs.or_failed(rhs.$rscalar(self))
            }
        }
        impl $trait<Array> for f32 {
            type Output = Array;
            fn $method(self, rhs: Array) -> Array {
                <f32 as $trait<&Array>>::$method(self, &rhs)
            }
        }
        impl $assign_trait<&Array> for Array {
            fn $assign(&mut self, rhs: &Array) {
                self.or_poison(self.zip_assign::<elementwise::$kernel>(rhs));
            }
        }
        impl $assign_trait<Array> for Array {
            fn $assign(&mut self, rhs: Array) {
                <Array as $assign_trait<&Array>>::$assign(self, &rhs);
            }
        }
        impl $assign_trait<f32> for Array {
            fn $assign(&mut self, rhs: f32) {
                self.or_poison(self.$scalar_assign(rhs));
            }
        }
    };
}

operator!(Add add AddAssign add_assign, Add, add_scalar radd_scalar add_assign_scalar);
operator!(Sub sub SubAssign sub_assign, Sub, sub_scalar rsub_scalar sub_assign_scalar);
operator!(Mul mul MulAssign mul_assign, Mul, mul_scalar rmul_scalar mul_assign_scalar);
operator!(Div div DivAssign div_assign, Div, div_scalar rdiv_scalar div_assign_scalar);

impl Neg for &Array {
    type Output = Array;
    fn neg(self) -> Array {
        self.or_failed(self.map::<elementwise::Neg>())
    }
}

impl Neg for Array {
    type Output = Array;
    fn neg(self) -> Array {
        -&self
    }
}
