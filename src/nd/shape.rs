//! Shapes: NumPy broadcasting, axis checks, and the errors that name the
//! operation and its operands' shapes. Everything here runs at the call,
//! before any op is pushed, so a misfit is an error where it is made.

use std::sync::Arc;

use ndarray::{ArrayViewD, ArrayViewMutD, IxDyn};

use super::Array;
use crate::dep::Device;
use crate::engine::Engine;
use crate::error::{BoxError, Error};

/// An array's shape, shared by the array and the ops that use it.
pub(super) type Shape = Arc<[usize]>;

/// The number of elements of `shape` (1 for a scalar).
pub(super) fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// The number of elements of a shape the caller gave (to make or reshape
/// an array), checked: a count past `usize` is an error of `op`, where
/// [`numel`] would overflow (a panic in debug builds, a wrong length in
/// release ones).
pub(super) fn checked_numel(op: &'static str, shape: &[usize]) -> Result<usize, Error> {
    if shape.contains(&0) {
        return Ok(0);
    }
    shape
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .ok_or_else(|| {
            misfit(
                op,
                format!("shape {shape:?} has more elements than usize counts"),
            )
        })
}

/// An error of operation `op`.
pub(super) fn misfit(op: &'static str, message: impl Into<String>) -> Error {
    Error::Array {
        op,
        message: message.into().into_boxed_str(),
    }
}

/// The shape `a` and `b` broadcast to (NumPy's rule: align trailing axes;
/// each pair equal, or one of them 1).
pub(super) fn broadcast(op: &'static str, a: &[usize], b: &[usize]) -> Result<Shape, Error> {
    let n = a.len().max(b.len());
    let at = |s: &[usize], i: usize| {
        let missing = n - s.len();
        if i < missing { 1 } else { s[i - missing] }
    };
    (0..n)
        .map(|i| match (at(a, i), at(b, i)) {
            (x, y) if x == y || y == 1 => Ok(x),
            (1, y) => Ok(y),
            _ => Err(misfit(
                op,
                format!("shapes {a:?} and {b:?} do not broadcast"),
            )),
        })
        .collect()
}

/// Checks that `from` broadcasts to exactly `to` (an in-place operation's
/// operand to its target).
pub(super) fn broadcasts_to(op: &'static str, from: &[usize], to: &[usize]) -> Result<(), Error> {
    match broadcast(op, to, from) {
        Ok(shape) if *shape == *to => Ok(()),
        _ => Err(misfit(
            op,
            format!("shape {from:?} does not broadcast to the target's shape {to:?}"),
        )),
    }
}

/// Checks that `axis` is an axis of `shape`.
pub(super) fn axis(op: &'static str, shape: &[usize], axis: usize) -> Result<(), Error> {
    if axis < shape.len() {
        Ok(())
    } else {
        Err(misfit(
            op,
            format!(
                "axis {axis} out of range for shape {shape:?} ({} axes)",
                shape.len()
            ),
        ))
    }
}

/// Checks that every operand is on the first one's device (and engine).
pub(super) fn same_device(op: &'static str, arrays: &[&Array]) -> Result<(), Error> {
    let first = arrays[0];
    match arrays.iter().find(|a| a.device() != first.device()) {
        None => Ok(()),
        Some(other) => Err(misfit(
            op,
            format!(
                "operands on different devices ({:?} of shape {:?} and {:?} of shape {:?}): \
                 copy one with `to`",
                first.device(),
                first.shape(),
                other.device(),
                other.shape()
            ),
        )),
    }
}

/// Checks that arrays can live on `device`: a device of `engine` that
/// runs ops on host threads (arrays on stream devices are not built yet).
pub(super) fn host_device(op: &'static str, engine: &Engine, device: Device) -> Result<(), Error> {
    match engine.device_name(device) {
        None => Err(misfit(
            op,
            format!("{device:?} is not a device of the array's engine"),
        )),
        Some(name) if engine.is_stream_device(device) => Err(misfit(
            op,
            format!(
                "device {name:?} is a stream device: arrays live in host memory and run host \
                 kernels, on CPU devices only (arrays on GPUs are not built yet)"
            ),
        )),
        Some(_) => Ok(()),
    }
}

/// `data` as an array view of `shape` (their lengths agree: the buffer was
/// made for the shape).
pub(super) fn view<'a>(shape: &[usize], data: &'a [f32]) -> Result<ArrayViewD<'a, f32>, BoxError> {
    Ok(ArrayViewD::from_shape(IxDyn(shape), data)?)
}

/// [`view`], mutable.
pub(super) fn view_mut<'a>(
    shape: &[usize],
    data: &'a mut [f32],
) -> Result<ArrayViewMutD<'a, f32>, BoxError> {
    Ok(ArrayViewMutD::from_shape(IxDyn(shape), data)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_broadcast_as_numpy_s() {
        let b = |x: &[usize], y: &[usize]| broadcast("t", x, y).map(|s| s.to_vec());
        assert_eq!(b(&[2, 3], &[3]).unwrap(), [2, 3]);
        assert_eq!(b(&[4, 1, 5], &[3, 1]).unwrap(), [4, 3, 5]);
        assert_eq!(b(&[], &[2]).unwrap(), [2]);
        assert_eq!(b(&[0, 1], &[1, 7]).unwrap(), [0, 7]);
        let err = b(&[2, 3], &[4]).unwrap_err();
        assert_eq!(err.to_string(), "t: shapes [2, 3] and [4] do not broadcast");
        assert!(broadcasts_to("t", &[3], &[2, 3]).is_ok());
        assert!(broadcasts_to("t", &[2, 3], &[3]).is_err());
    }
}
