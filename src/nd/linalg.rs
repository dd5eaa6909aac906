//! Matrix products and transposes: ndarray's GEMM (`general_mat_mul`, on
//! matrixmultiply) and its axis permutations, each one op.

use ndarray::linalg::general_mat_mul;
use ndarray::{ArrayView2, ArrayView3, ArrayViewMut2, ArrayViewMut3, Axis};

use super::shape::{Shape, misfit, same_device};
use super::{Array, mode};
use crate::error::Error;

impl Array {
    /// The matrix product: `[m, k] × [k, n] → [m, n]`, or batched,
    /// `[b, m, k] × [b, k, n] → [b, m, n]` (one GEMM per batch entry).
    ///
    /// ```
    /// use depflow::{Engine, Error, nd};
    ///
    /// let arrays = nd::Arrays::new(&Engine::new());
    /// let a = arrays.from_vec(vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3])?;
    /// let b = arrays.ones(&[3, 1])?;
    /// assert_eq!(a.matmul(&b)?.to_vec().wait()?, [6.0, 15.0]);
    /// # Ok::<(), Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Array`] naming both shapes if they do not multiply (not
    /// both 2-D or both 3-D, inner lengths or batch sizes that differ),
    /// or if the arrays are on different devices.
    pub fn matmul(&self, other: &Array) -> Result<Array, Error> {
        const OP: &str = "matmul";
        same_device(OP, &[self, other])?;
        let (a, b) = (self.shape(), other.shape());
        let out: Shape = match (a, b) {
            ([m, k], [k2, n]) if k == k2 => [*m, *n].into(),
            ([ba, m, k], [bb, k2, n]) if k == k2 && ba == bb => [*ba, *m, *n].into(),
            _ => {
                return Err(misfit(
                    OP,
                    format!(
                        "shapes {a:?} and {b:?} do not multiply ([m, k] × [k, n], or batched [b, m, k] × [b, k, n])"
                    ),
                ));
            }
        };
        let result = Array::uninit(self.engine(), self.device(), out.clone());
        let (x, y, o) = (
            self.buffer().clone(),
            other.buffer().clone(),
            result.buffer().clone(),
        );
        let (sa, sb) = (self.shape_arc().clone(), other.shape_arc().clone());
        mode::submit(
            self.engine(),
            self.device(),
            OP,
            &[self.buffer(), other.buffer()],
            &[result.buffer()],
            move |ctx| {
                let (xd, yd, mut od) = (ctx.read(&x)?, ctx.read(&y)?, ctx.write(&o)?);
                if sa.len() == 2 {
                    let xv = ArrayView2::from_shape((sa[0], sa[1]), &xd)?;
                    let yv = ArrayView2::from_shape((sb[0], sb[1]), &yd)?;
                    let mut ov = ArrayViewMut2::from_shape((out[0], out[1]), &mut od)?;
                    // β = 0: the output's old values are not read.
                    general_mat_mul(1.0, &xv, &yv, 0.0, &mut ov);
                } else {
                    let xv = ArrayView3::from_shape((sa[0], sa[1], sa[2]), &xd)?;
                    let yv = ArrayView3::from_shape((sb[0], sb[1], sb[2]), &yd)?;
                    let mut ov = ArrayViewMut3::from_shape((out[0], out[1], out[2]), &mut od)?;
                    for (i, mut o) in ov.axis_iter_mut(Axis(0)).enumerate() {
                        general_mat_mul(
                            1.0,
                            &xv.index_axis(Axis(0), i),
                            &yv.index_axis(Axis(0), i),
                            0.0,
                            &mut o,
                        );
                    }
                }
                Ok(())
            },
        )?;
        Ok(result.tracked(OP, &[self, other], |_| {
            let (a, b) = (self.clone(), other.clone());
            Box::new(move |dy| {
                // dA = dY Bᵀ, dB = Aᵀ dY (per batch entry)
                let swap = |m: &Array| match m.ndim() {
                    2 => m.permute(&[1, 0]),
                    _ => m.permute(&[0, 2, 1]),
                };
                Ok(vec![
                    Some(dy.matmul(&swap(&b)?)?),
                    Some(swap(&a)?.matmul(dy)?),
                ])
            })
        }))
    }

    /// The transpose: the axes reversed (`[m, n] → [n, m]`), as a new
    /// array.
    ///
    /// # Errors
    ///
    /// [`Error::ShutDown`] after shutdown.
    pub fn t(&self) -> Result<Array, Error> {
        let axes: Vec<usize> = (0..self.ndim()).rev().collect();
        self.permute(&axes)
    }

    /// The axes in the order `axes` gives (axis `i` of the result is axis
    /// `axes[i]` of `self`), as a new array.
    ///
    /// # Errors
    ///
    /// [`Error::Array`] if `axes` is not a permutation of `self`'s axes.
    pub fn permute(&self, axes: &[usize]) -> Result<Array, Error> {
        const OP: &str = "permute";
        let n = self.ndim();
        let mut seen = vec![false; n];
        let valid = axes.len() == n
            && axes
                .iter()
                .all(|&a| a < n && !std::mem::replace(&mut seen[a], true));
        if !valid {
            return Err(misfit(
                OP,
                format!(
                    "{axes:?} is not a permutation of the axes of shape {:?}",
                    self.shape()
                ),
            ));
        }
        let shape: Shape = axes.iter().map(|&a| self.shape()[a]).collect();
        let kept: Box<[usize]> = axes.into();
        let axes = kept.clone();
        let result = self.derived(OP, shape, move |x, mut o| {
            o.assign(&x.permuted_axes(&axes[..]));
            Ok(())
        })?;
        Ok(result.tracked(OP, &[self], |_| {
            let mut inverse = vec![0; kept.len()];
            for (i, &a) in kept.iter().enumerate() {
                inverse[a] = i;
            }
            Box::new(move |dy| Ok(vec![Some(dy.permute(&inverse)?)]))
        }))
    }
}
