//! Windows of images as columns (im2col) and back (col2im): what a
//! convolution becomes a GEMM by, and a max-pool a max over an axis.
//!
//! `im2col` of `x: [n, c, h, w]` with `kh × kw` windows, stride `s` and
//! zero padding `p` is `[c·kh·kw, n·oh·ow]`, where `oh = (h + 2p − kh)/s + 1`
//! (and `ow` alike): column `(b·oh + y)·ow + x` holds the window at
//! output position `(y, x)` of image `b`, row `(ch·kh + i)·kw + j` its
//! element `(i, j)` of channel `ch` (0 where the window overlaps the
//! padding). `col2im` adds each column's elements back where they came
//! from: the gradient of `im2col`. The loops are this crate's: ndarray has
//! no im2col.

use super::shape::{Shape, misfit};
use super::{Array, mode};
use crate::error::Error;

/// A window geometry over images of `[n, c, h, w]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Windows {
    pub n: usize,
    pub c: usize,
    pub h: usize,
    pub w: usize,
    pub kh: usize,
    pub kw: usize,
    pub stride: usize,
    pub pad: usize,
}

impl Windows {
    /// The geometry of `kh × kw` windows over `shape`, checked.
    pub(super) fn of(
        op: &'static str,
        shape: &[usize],
        (kh, kw): (usize, usize),
        stride: usize,
        pad: usize,
    ) -> Result<Windows, Error> {
        let &[n, c, h, w] = shape else {
            return Err(misfit(op, format!("shape {shape:?} is not [n, c, h, w]")));
        };
        if kh == 0 || kw == 0 || stride == 0 || kh > h + 2 * pad || kw > w + 2 * pad {
            return Err(misfit(
                op,
                format!(
                    "{kh}x{kw} windows with stride {stride} and padding {pad} do not fit images of shape {shape:?}"
                ),
            ));
        }
        Ok(Windows {
            n,
            c,
            h,
            w,
            kh,
            kw,
            stride,
            pad,
        })
    }

    pub(super) fn out_h(&self) -> usize {
        (self.h + 2 * self.pad - self.kh) / self.stride + 1
    }

    pub(super) fn out_w(&self) -> usize {
        (self.w + 2 * self.pad - self.kw) / self.stride + 1
    }

    fn cols_shape(&self) -> [usize; 2] {
        [
            self.c * self.kh * self.kw,
            self.n * self.out_h() * self.out_w(),
        ]
    }

    /// Calls `f(row start, column, index into x)` for every element of the
    /// columns that comes from `x` (not from the padding): the element is
    /// at `row start + column` of the columns.
    #[inline]
    fn each(&self, mut f: impl FnMut(usize, usize, usize)) {
        let (oh, ow) = (self.out_h(), self.out_w());
        let columns = self.n * oh * ow;
        for ch in 0..self.c {
            for i in 0..self.kh {
                for j in 0..self.kw {
                    let row = (ch * self.kh + i) * self.kw + j;
                    for b in 0..self.n {
                        for y in 0..oh {
                            let Some(src_y) = (y * self.stride + i).checked_sub(self.pad) else {
                                continue;
                            };
                            if src_y >= self.h {
                                continue;
                            }
                            for x in 0..ow {
                                let Some(src_x) = (x * self.stride + j).checked_sub(self.pad)
                                else {
                                    continue;
                                };
                                if src_x >= self.w {
                                    continue;
                                }
                                let column = (b * oh + y) * ow + x;
                                let at = ((b * self.c + ch) * self.h + src_y) * self.w + src_x;
                                f(row * columns, column, at);
                            }
                        }
                    }
                }
            }
        }
    }
}

impl Array {
    /// The windows of these images as columns (see the module docs).
    pub(super) fn im2col(&self, geometry: Windows) -> Result<Array, Error> {
        let shape: Shape = geometry.cols_shape().into();
        let out = Array::uninit(self.engine(), self.device(), shape);
        let (x, o) = (self.buffer().clone(), out.buffer().clone());
        mode::submit(
            self.engine(),
            self.device(),
            "im2col",
            &[self.buffer()],
            &[out.buffer()],
            move |ctx| {
                let (xd, mut od) = (ctx.read(&x)?, ctx.write(&o)?);
                od.fill(0.0);
                geometry.each(|row, column, at| od[row + column] = xd[at]);
                Ok(())
            },
        )?;
        Ok(out.tracked("im2col", &[self], |_| {
            Box::new(move |dy| Ok(vec![Some(dy.col2im(geometry)?)]))
        }))
    }

    /// Columns added back into images (the gradient of [`im2col`](Self::im2col)).
    fn col2im(&self, geometry: Windows) -> Result<Array, Error> {
        let Windows { n, c, h, w, .. } = geometry;
        let out = Array::uninit(self.engine(), self.device(), [n, c, h, w].into());
        let (cols, o) = (self.buffer().clone(), out.buffer().clone());
        mode::submit(
            self.engine(),
            self.device(),
            "col2im",
            &[self.buffer()],
            &[out.buffer()],
            move |ctx| {
                let (cd, mut od) = (ctx.read(&cols)?, ctx.write(&o)?);
                od.fill(0.0);
                geometry.each(|row, column, at| od[at] += cd[row + column]);
                Ok(())
            },
        )?;
        Ok(out)
    }

    /// A 2-D convolution (cross-correlation, as deep-learning frameworks
    /// define it) of images `self: [n, c, h, w]` with filters
    /// `weight: [o, c, kh, kw]`, stride `stride` and zero padding `pad` on
    /// every side: `[n, o, oh, ow]`. Computed as im2col, one GEMM
    /// (ndarray's) and a transpose, so its gradient flows through those.
    ///
    /// ```
    /// use depflow::{Engine, Error, nd};
    ///
    /// let arrays = nd::Arrays::new(&Engine::new());
    /// let image = arrays.arange(9)?.reshape(&[1, 1, 3, 3])?;
    /// let sum2x2 = arrays.ones(&[1, 1, 2, 2])?;
    /// let out = image.conv2d(&sum2x2, 1, 0)?;
    /// assert_eq!(out.to_vec().wait()?, [8.0, 12.0, 20.0, 24.0]);
    /// # Ok::<(), Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Array`] if the shapes are not images and filters of as
    /// many channels, or the windows do not fit the padded images.
    pub fn conv2d(&self, weight: &Array, stride: usize, pad: usize) -> Result<Array, Error> {
        const OP: &str = "conv2d";
        let &[o, c, kh, kw] = weight.shape() else {
            return Err(misfit(
                OP,
                format!(
                    "filters of shape {:?} are not [o, c, kh, kw]",
                    weight.shape()
                ),
            ));
        };
        let geometry = Windows::of(OP, self.shape(), (kh, kw), stride, pad)?;
        if geometry.c != c {
            return Err(misfit(
                OP,
                format!(
                    "images {:?} and filters {:?} differ in channels",
                    self.shape(),
                    weight.shape()
                ),
            ));
        }
        let (oh, ow) = (geometry.out_h(), geometry.out_w());
        let cols = self.im2col(geometry)?;
        let out = weight.reshape(&[o, c * kh * kw])?.matmul(&cols)?;
        out.reshape(&[o, geometry.n, oh, ow])?
            .permute(&[1, 0, 2, 3])
    }

    /// 2-D max pooling of images `[n, c, h, w]` over `k × k` windows with
    /// stride `stride` (no padding): `[n, c, oh, ow]`. Computed as im2col
    /// and a max over each window, so its gradient flows to every maximal
    /// element of a window.
    ///
    /// # Errors
    ///
    /// [`Error::Array`] if the array is not images or the windows do not
    /// fit them.
    pub fn max_pool2d(&self, k: usize, stride: usize) -> Result<Array, Error> {
        const OP: &str = "max_pool2d";
        let geometry = Windows::of(OP, self.shape(), (k, k), stride, 0)?;
        let Windows { n, c, h, w, .. } = geometry;
        // Each channel an image of one channel: windows of one channel.
        let single = Windows {
            n: n * c,
            c: 1,
            ..geometry
        };
        let (oh, ow) = (geometry.out_h(), geometry.out_w());
        self.reshape(&[n * c, 1, h, w])?
            .im2col(single)?
            .max_axis(0)?
            .reshape(&[n, c, oh, ow])
    }
}
