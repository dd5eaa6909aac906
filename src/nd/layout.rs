//! Shape changes: reshape (the same values, as MXNet's), slices and
//! concatenation along an axis (new arrays).

use std::ops::Range;

use ndarray::{Axis, Slice};

use super::shape::{Shape, axis, checked_numel, misfit, same_device, view, view_mut};
use super::{Array, mode};
use crate::error::Error;

impl Array {
    /// The same values seen with shape `shape` (row-major): no op, no copy.
    /// The result shares the values, so an in-place operation on one is
    /// seen through the other, as a clone is.
    ///
    /// ```
    /// use depflow::{Engine, Error, nd};
    ///
    /// let arrays = nd::Arrays::new(&Engine::new());
    /// let a = arrays.arange(6)?;
    /// let m = a.reshape(&[2, 3])?;
    /// m.add_assign_scalar(10.0)?;
    /// assert_eq!(a.to_vec().wait()?, [10.0, 11.0, 12.0, 13.0, 14.0, 15.0]);
    /// # Ok::<(), Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Array`] if `shape` has another number of elements.
    pub fn reshape(&self, shape: &[usize]) -> Result<Array, Error> {
        let n = checked_numel("reshape", shape)?;
        if n != self.len() {
            return Err(misfit(
                "reshape",
                format!(
                    "shape {:?} ({} elements) cannot be seen as {shape:?} ({} elements)",
                    self.shape(),
                    self.len(),
                    n
                ),
            ));
        }
        let out = Array::over(
            self.engine(),
            self.device(),
            shape.into(),
            self.buffer().clone(),
        );
        Ok(out.tracked("reshape", &[self], |_| {
            let back = self.shape_arc().clone();
            Box::new(move |dy| Ok(vec![Some(dy.reshape(&back)?)]))
        }))
    }

    /// The elements `range` along `axis`, as a new array (MXNet's
    /// `slice_axis`).
    ///
    /// # Errors
    ///
    /// [`Error::Array`] if `axis` is not an axis of the array or `range`
    /// is not within its length.
    pub fn slice_axis(&self, along: usize, range: Range<usize>) -> Result<Array, Error> {
        const OP: &str = "slice_axis";
        axis(OP, self.shape(), along)?;
        let len = self.shape()[along];
        if range.start > range.end || range.end > len {
            return Err(misfit(
                OP,
                format!(
                    "range {range:?} out of axis {along} of shape {:?}",
                    self.shape()
                ),
            ));
        }
        let (range_start, range_end) = (range.start, range.end);
        let mut shape = self.shape().to_vec();
        shape[along] = range.len();
        let result = self.derived(OP, shape.into(), move |x, mut o| {
            o.assign(&x.slice_axis(Axis(along), Slice::from(range.clone())));
            Ok(())
        })?;
        Ok(result.tracked(OP, &[self], |_| {
            let x = self.detach();
            let (start, end) = (range_start, range_end);
            Box::new(move |dy| {
                // dy in place of the slice, zeros around it.
                let mut around = x.shape().to_vec();
                around[along] = start;
                let before = x.full(&around, 0.0)?;
                around[along] = x.shape()[along] - end;
                let after = x.full(&around, 0.0)?;
                Ok(vec![Some(concat(&[&before, dy, &after], along)?)])
            })
        }))
    }

    /// A new array of `shape` filled with `value`, on `self`'s device.
    pub(super) fn full(&self, shape: &[usize], value: f32) -> Result<Array, Error> {
        let out = Array::uninit(self.engine(), self.device(), shape.into());
        out.fill(value)?;
        Ok(out)
    }

    /// The values broadcast to `shape` (NumPy's rule), as a new array.
    ///
    /// ```
    /// use depflow::{Engine, Error, nd};
    ///
    /// let arrays = nd::Arrays::new(&Engine::new());
    /// let row = arrays.arange(3)?;
    /// assert_eq!(row.broadcast_to(&[2, 3])?.to_vec().wait()?, [0.0, 1.0, 2.0, 0.0, 1.0, 2.0]);
    /// # Ok::<(), Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Array`] if the shape does not broadcast to `shape`.
    pub fn broadcast_to(&self, shape: &[usize]) -> Result<Array, Error> {
        const OP: &str = "broadcast_to";
        super::shape::broadcasts_to(OP, self.shape(), shape)?;
        let out = Array::uninit(self.engine(), self.device(), shape.into());
        out.assign(self)?;
        Ok(out.tracked(OP, &[self], |_| {
            let back = self.shape_arc().clone();
            Box::new(move |dy| Ok(vec![Some(dy.sum_to(&back)?)]))
        }))
    }
}

/// The arrays joined along `axis`, as a new array: their shapes must agree
/// on every other axis.
///
/// ```
/// use depflow::{Engine, Error, nd};
///
/// let arrays = nd::Arrays::new(&Engine::new());
/// let a = arrays.ones(&[1, 2])?;
/// let b = arrays.zeros(&[2, 2])?;
/// let c = nd::concat(&[&a, &b], 0)?;
/// assert_eq!(c.shape(), [3, 2]);
/// assert_eq!(c.to_vec().wait()?, [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]);
/// # Ok::<(), Error>(())
/// ```
///
/// # Errors
///
/// [`Error::Array`] for no arrays, an axis out of range, shapes that
/// differ elsewhere, or arrays on different devices.
pub fn concat(arrays: &[&Array], along: usize) -> Result<Array, Error> {
    const OP: &str = "concat";
    let Some(first) = arrays.first() else {
        return Err(misfit(OP, "no arrays to join"));
    };
    same_device(OP, arrays)?;
    axis(OP, first.shape(), along)?;
    let mut shape = first.shape().to_vec();
    shape[along] = 0;
    for a in arrays {
        let fits = a.ndim() == shape.len()
            && (0..shape.len()).all(|i| i == along || a.shape()[i] == first.shape()[i]);
        if !fits {
            return Err(misfit(
                OP,
                format!(
                    "shapes {:?} and {:?} differ off axis {along}",
                    first.shape(),
                    a.shape()
                ),
            ));
        }
        shape[along] += a.shape()[along];
    }
    let shape: Shape = shape.into();
    let result = Array::uninit(first.engine(), first.device(), shape.clone());
    let inputs: Vec<_> = arrays
        .iter()
        .map(|a| (a.buffer().clone(), a.shape_arc().clone()))
        .collect();
    let reads: Vec<&dyn crate::dep::AnyVar> = arrays.iter().map(|a| a.buffer() as _).collect();
    let o = result.buffer().clone();
    mode::submit(
        first.engine(),
        first.device(),
        OP,
        &reads,
        &[result.buffer()],
        move |ctx| {
            let mut od = ctx.write(&o)?;
            let mut ov = view_mut(&shape, &mut od)?;
            let mut at = 0;
            for (x, sx) in &inputs {
                let xd = ctx.read(x)?;
                let n = sx[along];
                ov.slice_axis_mut(Axis(along), Slice::from(at..at + n))
                    .assign(&view(sx, &xd)?);
                at += n;
            }
            Ok(())
        },
    )?;
    let lengths: Vec<usize> = arrays.iter().map(|a| a.shape()[along]).collect();
    Ok(result.tracked(OP, arrays, |_| {
        Box::new(move |dy| {
            let mut at = 0;
            lengths
                .iter()
                .map(|&n| {
                    at += n;
                    dy.slice_axis(along, at - n..at).map(Some)
                })
                .collect()
        })
    }))
}

impl Array {
    /// One-hot rows for these class labels (class indices as `f32`, shape
    /// `[n]` or `[n, 1]`): `[n, classes]`, as one op, so that labels fed
    /// into an array (`set`) become targets inside a recorded step.
    ///
    /// ```
    /// use depflow::{Engine, Error, nd};
    ///
    /// let arrays = nd::Arrays::new(&Engine::new());
    /// let labels = arrays.from_vec(vec![2.0, 0.0], &[2])?;
    /// assert_eq!(labels.one_hot(3)?.to_vec().wait()?, [0.0, 0.0, 1.0, 1.0, 0.0, 0.0]);
    /// # Ok::<(), Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Array`] for another shape; the op fails (and its result is
    /// poisoned) for a label that is not a class below `classes`.
    pub fn one_hot(&self, classes: usize) -> Result<Array, Error> {
        const OP: &str = "one_hot";
        let n = match self.shape() {
            [n] | [n, 1] => *n,
            shape => {
                return Err(misfit(
                    OP,
                    format!("labels of shape {shape:?} are not [n] or [n, 1]"),
                ));
            }
        };
        let result = Array::uninit(self.engine(), self.device(), [n, classes].into());
        let (x, o) = (self.buffer().clone(), result.buffer().clone());
        mode::submit(
            self.engine(),
            self.device(),
            OP,
            &[self.buffer()],
            &[result.buffer()],
            move |ctx| {
                let (labels, mut rows) = (ctx.read(&x)?, ctx.write(&o)?);
                rows.fill(0.0);
                for (i, &label) in labels.iter().enumerate() {
                    let class = label as usize;
                    if label < 0.0 || class as f32 != label || class >= classes {
                        return Err(format!(
                            "label {label} (row {i}) is not a class below {classes}"
                        )
                        .into());
                    }
                    rows[i * classes + class] = 1.0;
                }
                Ok(())
            },
        )?;
        Ok(result)
    }
}
