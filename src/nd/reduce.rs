//! Reductions (sum, mean, max, argmax over an axis or the whole array) and
//! the softmaxes, each one op computed by ndarray's own reductions
//! (`sum_axis`, `mean_axis`, `fold_axis`, `sum`), so that a result is
//! bit for bit what those calls give on the same values.

use ndarray::{ArrayViewD, ArrayViewMutD, Axis, Zip};

use super::Array;
use super::shape::{Shape, axis, misfit};
use crate::error::{BoxError, Error};

fn max_of(x: &ArrayViewD<'_, f32>, along: usize) -> ndarray::ArrayD<f32> {
    x.fold_axis(Axis(along), f32::NEG_INFINITY, |&m, &v| m.max(v))
}

/// Writes `f(x - max)` into `o`, the max taken per lane along `along`:
/// the first step of both softmaxes, for stability.
fn shifted_by_max(
    x: &ArrayViewD<'_, f32>,
    o: &mut ArrayViewMutD<'_, f32>,
    along: usize,
    f: impl Fn(f32) -> f32,
) {
    let max = max_of(x, along).insert_axis(Axis(along));
    Zip::from(o)
        .and(x)
        .and_broadcast(&max)
        .for_each(|o, &x, &m| *o = f(x - m));
}

/// What a reduction (or softmax) computed, for its gradient: the axis, or
/// `None` for the whole array.
#[derive(Clone, Copy)]
enum Reduction {
    Sum(Option<usize>),
    Mean(Option<usize>),
    Max(Option<usize>),
    Softmax(usize),
    LogSoftmax(usize),
}

impl Reduction {
    fn name(self) -> &'static str {
        match self {
            Reduction::Sum(Some(_)) => "sum_axis",
            Reduction::Sum(None) => "sum",
            Reduction::Mean(Some(_)) => "mean_axis",
            Reduction::Mean(None) => "mean",
            Reduction::Max(Some(_)) => "max_axis",
            Reduction::Max(None) => "max",
            Reduction::Softmax(_) => "softmax",
            Reduction::LogSoftmax(_) => "log_softmax",
        }
    }

    /// The gradient for `x`, given the result `y` (detached) and its
    /// gradient `dy`.
    fn grad(self, x: &Array, y: &Array, dy: &Array) -> Result<Array, Error> {
        // `dy` (or `y`) with the reduced axes kept as 1s, to broadcast
        // against `x`.
        let kept = |a: &Array, along: Option<usize>| {
            let shape: Vec<usize> = match along {
                Some(k) => {
                    let mut s = a.shape().to_vec();
                    s.insert(k, 1);
                    s
                }
                None => vec![1; x.ndim()],
            };
            a.reshape(&shape)
        };
        match self {
            Reduction::Sum(along) => kept(dy, along)?.broadcast_to(x.shape()),
            Reduction::Mean(along) => {
                let n = match along {
                    Some(k) => x.shape()[k],
                    None => x.len(),
                };
                kept(dy, along)?
                    .broadcast_to(x.shape())?
                    .div_scalar(n as f32)
            }
            // Every maximal element gets the gradient (a subgradient).
            Reduction::Max(along) => x.eq(&kept(y, along)?)?.mul(&kept(dy, along)?),
            Reduction::Softmax(k) => {
                // y (dy - Σ dy y)
                let dot = kept(&dy.mul(y)?.sum_axis(k)?, Some(k))?;
                y.mul(&dy.sub(&dot)?)
            }
            Reduction::LogSoftmax(k) => {
                // dy - softmax(x) Σ dy
                let total = kept(&dy.sum_axis(k)?, Some(k))?;
                dy.sub(&y.exp()?.mul(&total)?)
            }
        }
    }
}

/// A reduction's kernel: from the input's view to the result's, along an
/// axis.
type Kernel = fn(ArrayViewD<'_, f32>, ArrayViewMutD<'_, f32>, usize) -> Result<(), BoxError>;

impl Array {
    /// The reduction `what` of `self` into a new array of `shape` by
    /// `kernel` (given the axis `along`), and the result's gradient.
    fn reduction(
        &self,
        what: Reduction,
        shape: Shape,
        along: usize,
        kernel: Kernel,
    ) -> Result<Array, Error> {
        let out = self.derived(what.name(), shape, move |x, o| kernel(x, o, along))?;
        Ok(out.tracked(what.name(), &[self], |y| {
            let x = self.clone();
            Box::new(move |dy| Ok(vec![Some(what.grad(&x, &y, dy)?)]))
        }))
    }

    /// `self`'s shape without axis `along`, checked.
    fn without(&self, op: &'static str, along: usize) -> Result<Shape, Error> {
        axis(op, self.shape(), along)?;
        let mut shape = self.shape().to_vec();
        shape.remove(along);
        Ok(shape.into())
    }

    /// The sums along axis `along` (which the result drops), as ndarray's
    /// `sum_axis`.
    ///
    /// ```
    /// use depflow::{Engine, Error, nd};
    ///
    /// let arrays = nd::Arrays::new(&Engine::new());
    /// let a = arrays.from_vec(vec![1.0, 2.0, 3.0, 4.0], &[2, 2])?;
    /// assert_eq!(a.sum_axis(0)?.to_vec().wait()?, [4.0, 6.0]);
    /// assert_eq!(a.sum()?.item()?, 10.0);
    /// # Ok::<(), Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Array`] if `along` is not an axis of the array.
    pub fn sum_axis(&self, along: usize) -> Result<Array, Error> {
        let shape = self.without("sum_axis", along)?;
        self.reduction(
            Reduction::Sum(Some(along)),
            shape,
            along,
            |x, mut o, along| {
                o.assign(&x.sum_axis(Axis(along)));
                Ok(())
            },
        )
    }

    /// The means along axis `along` (NaN for an empty axis), as ndarray's
    /// `mean_axis`.
    ///
    /// # Errors
    ///
    /// [`Error::Array`] if `along` is not an axis of the array.
    pub fn mean_axis(&self, along: usize) -> Result<Array, Error> {
        let shape = self.without("mean_axis", along)?;
        self.reduction(
            Reduction::Mean(Some(along)),
            shape,
            along,
            |x, mut o, along| {
                match x.mean_axis(Axis(along)) {
                    Some(mean) => o.assign(&mean),
                    None => o.fill(f32::NAN),
                }
                Ok(())
            },
        )
    }

    /// The largest values along axis `along` (`f32::max`: NaNs lose to
    /// numbers; −∞ for an empty axis).
    ///
    /// # Errors
    ///
    /// [`Error::Array`] if `along` is not an axis of the array.
    pub fn max_axis(&self, along: usize) -> Result<Array, Error> {
        let shape = self.without("max_axis", along)?;
        self.reduction(
            Reduction::Max(Some(along)),
            shape,
            along,
            |x, mut o, along| {
                o.assign(&max_of(&x, along));
                Ok(())
            },
        )
    }

    /// The index of the largest value along axis `along` (the first, if
    /// several; a NaN is never larger), as `f32`.
    ///
    /// # Errors
    ///
    /// [`Error::Array`] if `along` is not an axis of the array, or it is
    /// empty.
    pub fn argmax(&self, along: usize) -> Result<Array, Error> {
        let shape = self.without("argmax", along)?;
        if self.shape()[along] == 0 {
            return Err(misfit(
                "argmax",
                format!("axis {along} of shape {:?} is empty", self.shape()),
            ));
        }
        self.derived("argmax", shape, move |x, mut o| {
            Zip::from(&mut o)
                .and(x.lanes(Axis(along)))
                .for_each(|o, lane| {
                    let (mut best, mut at) = (lane[0], 0);
                    for (i, &v) in lane.iter().enumerate().skip(1) {
                        if v > best {
                            (best, at) = (v, i);
                        }
                    }
                    *o = at as f32;
                });
            Ok(())
        })
    }

    /// The sum of all elements, as a scalar array (shape `[]`), as
    /// ndarray's `sum`.
    ///
    /// # Errors
    ///
    /// [`Error::ShutDown`] after shutdown.
    pub fn sum(&self) -> Result<Array, Error> {
        self.reduction(Reduction::Sum(None), Shape::from([]), 0, |x, mut o, _| {
            o.fill(x.sum());
            Ok(())
        })
    }

    /// The mean of all elements (NaN for none), as a scalar array.
    ///
    /// # Errors
    ///
    /// [`Error::ShutDown`] after shutdown.
    pub fn mean(&self) -> Result<Array, Error> {
        self.reduction(Reduction::Mean(None), Shape::from([]), 0, |x, mut o, _| {
            o.fill(x.mean().unwrap_or(f32::NAN));
            Ok(())
        })
    }

    /// The largest element (−∞ for none), as a scalar array.
    ///
    /// # Errors
    ///
    /// [`Error::ShutDown`] after shutdown.
    pub fn max(&self) -> Result<Array, Error> {
        self.reduction(Reduction::Max(None), Shape::from([]), 0, |x, mut o, _| {
            o.fill(x.fold(f32::NEG_INFINITY, |m, &v| m.max(v)));
            Ok(())
        })
    }

    /// The softmax along axis `along`: `exp(x - max) / sum(exp(x - max))`
    /// per lane, the max subtracted for stability.
    ///
    /// ```
    /// use depflow::{Engine, Error, nd};
    ///
    /// let arrays = nd::Arrays::new(&Engine::new());
    /// let p = arrays.from_vec(vec![0.0, 0.0, 5.0, 5.0], &[2, 2])?.softmax(1)?;
    /// assert_eq!(p.to_vec().wait()?, [0.5, 0.5, 0.5, 0.5]);
    /// # Ok::<(), Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Array`] if `along` is not an axis of the array.
    pub fn softmax(&self, along: usize) -> Result<Array, Error> {
        axis("softmax", self.shape(), along)?;
        self.reduction(
            Reduction::Softmax(along),
            self.shape_arc().clone(),
            along,
            |x, mut o, along| {
                shifted_by_max(&x, &mut o, along, f32::exp);
                let sum = o.sum_axis(Axis(along)).insert_axis(Axis(along));
                Zip::from(&mut o)
                    .and_broadcast(&sum)
                    .for_each(|o, &s| *o /= s);
                Ok(())
            },
        )
    }

    /// The log of the softmax along axis `along`:
    /// `x - max - ln(sum(exp(x - max)))` per lane, computed so (not as the
    /// log of [`softmax`](Self::softmax)) for stability.
    ///
    /// # Errors
    ///
    /// [`Error::Array`] if `along` is not an axis of the array.
    pub fn log_softmax(&self, along: usize) -> Result<Array, Error> {
        axis("log_softmax", self.shape(), along)?;
        self.reduction(
            Reduction::LogSoftmax(along),
            self.shape_arc().clone(),
            along,
            |x, mut o, along| {
                shifted_by_max(&x, &mut o, along, |d| d);
                let log_sum = o
                    .mapv(f32::exp)
                    .sum_axis(Axis(along))
                    .mapv(f32::ln)
                    .insert_axis(Axis(along));
                Zip::from(&mut o)
                    .and_broadcast(&log_sum)
                    .for_each(|o, &l| *o -= l);
                Ok(())
            },
        )
    }
}
