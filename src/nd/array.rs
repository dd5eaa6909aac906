//! The array handle: a buffer of the engine, its shape and its device.
//!
//! An [`Array`] is a shared handle (`Arc`): clones, and arrays made by
//! [`reshape`](Array::reshape), name the same buffer, so an in-place
//! operation through one is seen through all, as MXNet's NDArray. The
//! shape and device are fixed when the array is made and known to the
//! caller at once; the values are the buffer's, reached only by ops.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use super::autograd::Grad;
use super::mode;
use ndarray::{ArrayViewD, ArrayViewMutD};

use super::shape::{Shape, numel, view, view_mut};
use crate::dep::{Buffer, Device, OpCtx};
use crate::engine::{Engine, OpHandle};
use crate::error::{BoxError, Error};

/// An n-dimensional array of `f32` on one device of an engine, whose every
/// operation is an engine op (see the [module docs](super)).
///
/// ```
/// use depflow::{Engine, Error, nd};
///
/// let engine = Engine::new();
/// let arrays = nd::Arrays::new(&engine);
/// let a = arrays.from_vec(vec![1.0, 2.0, 3.0, 4.0], &[2, 2])?;
/// let b = &a * 2.0 + 1.0; // returns at once: two ops pushed
/// assert_eq!(b.shape(), [2, 2]);
/// assert_eq!(b.to_vec().wait()?, [3.0, 5.0, 7.0, 9.0]);
/// # Ok::<(), Error>(())
/// ```
#[derive(Clone)]
pub struct Array {
    inner: Arc<Inner>,
}

struct Inner {
    data: Buffer<f32>,
    shape: Shape,
    device: Device,
    engine: Engine,
    /// Whether and how gradients flow through it (see `autograd`).
    grad: Grad,
}

impl Array {
    /// A new array of `shape` on `device` whose values its first op writes:
    /// the engine's buffer, or a planned buffer inside a recording.
    pub(super) fn uninit(engine: &Engine, device: Device, shape: Shape) -> Array {
        let data = mode::new_buffer(engine, numel(&shape));
        Self::over(engine, device, shape, data)
    }

    pub(super) fn over(engine: &Engine, device: Device, shape: Shape, data: Buffer<f32>) -> Array {
        Array {
            inner: Arc::new(Inner {
                data,
                shape,
                device,
                engine: engine.clone(),
                grad: Grad::None,
            }),
        }
    }

    /// A new array of `shape` on `device` with a buffer of the engine's
    /// own, zeroed, even inside a recording: state that outlives one (a
    /// gradient, an optimizer's moments, a data-parallel step's inputs).
    pub(super) fn zeroed_outside(engine: &Engine, device: Device, shape: Shape) -> Array {
        let data = engine.buffer(numel(&shape));
        Self::over(engine, device, shape, data)
    }

    /// [`zeroed_outside`](Self::zeroed_outside), like `self`.
    pub(super) fn zeroed_like(&self) -> Array {
        Self::zeroed_outside(self.engine(), self.device(), self.shape_arc().clone())
    }

    /// A new array of `shape` computed from `self` by one op: `kernel`
    /// gets `self`'s values and the result's, as views of their shapes.
    /// What most single-operand operations are.
    pub(super) fn derived<K>(
        &self,
        op: &'static str,
        shape: Shape,
        kernel: K,
    ) -> Result<Array, Error>
    where
        K: Fn(ArrayViewD<'_, f32>, ArrayViewMutD<'_, f32>) -> Result<(), BoxError>
            + Send
            + Sync
            + 'static,
    {
        let result = Array::uninit(self.engine(), self.device(), shape.clone());
        let (x, o) = (self.buffer().clone(), result.buffer().clone());
        let sx = self.shape_arc().clone();
        mode::submit(
            self.engine(),
            self.device(),
            op,
            &[self.buffer()],
            &[result.buffer()],
            move |ctx| {
                let (xd, mut od) = (ctx.read(&x)?, ctx.write(&o)?);
                kernel(view(&sx, &xd)?, view_mut(&shape, &mut od)?)
            },
        )?;
        Ok(result)
    }

    pub(super) fn grad_kind(&self) -> &Grad {
        &self.inner.grad
    }

    /// Sets how gradients flow through a new array: on this handle if it
    /// is the only one, else on a new handle to the same values.
    pub(super) fn set_grad_kind(&mut self, grad: Grad) {
        match Arc::get_mut(&mut self.inner) {
            Some(inner) => inner.grad = grad,
            None => {
                let mut fresh = Array::over(
                    &self.inner.engine,
                    self.inner.device,
                    self.inner.shape.clone(),
                    self.inner.data.clone(),
                );
                Arc::get_mut(&mut fresh.inner).expect("a new handle").grad = grad;
                *self = fresh;
            }
        }
    }

    /// The array's shape: its length along each axis (empty for a scalar).
    pub fn shape(&self) -> &[usize] {
        &self.inner.shape
    }

    pub(super) fn shape_arc(&self) -> &Shape {
        &self.inner.shape
    }

    /// The number of axes.
    pub fn ndim(&self) -> usize {
        self.inner.shape.len()
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.inner.data.len()
    }

    /// Whether it has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The device its operations run on.
    pub fn device(&self) -> Device {
        self.inner.device
    }

    /// The engine its operations are pushed to.
    pub fn engine(&self) -> &Engine {
        &self.inner.engine
    }

    /// The buffer holding its values, in row-major order: to declare the
    /// array in an op of your own ([`OpBuilder::reads`](crate::OpBuilder::reads),
    /// [`read`](crate::read)).
    pub fn buffer(&self) -> &Buffer<f32> {
        &self.inner.data
    }

    /// Whether `self` and `other` share their values (one is a clone or a
    /// reshape of the other).
    pub fn shares_data(&self, other: &Array) -> bool {
        self.inner.data.id() == other.inner.data.id()
    }

    /// A future of its values, in row-major order, once the operations
    /// pushed on it so far are done ([`Values::wait`] blocks): pushed to
    /// the engine at once, even inside a recording.
    ///
    /// It resolves to the failure of an operation the values depend on
    /// ([`Error::Poisoned`]), and to [`Error::GraphOwned`] for an
    /// intermediate of a recorded graph.
    pub fn to_vec(&self) -> Values<Vec<f32>> {
        self.read_with("to_vec", |x| Ok(x.to_vec()))
    }

    /// A future of its values as an [`ndarray::ArrayD`] of its shape.
    pub fn to_ndarray(&self) -> Values<ndarray::ArrayD<f32>> {
        let shape = self.inner.shape.clone();
        self.read_with("to_ndarray", move |x| {
            Ok(ndarray::ArrayD::from_shape_vec(&shape[..], x.to_vec())?)
        })
    }

    /// Waits until the values can be read: every operation pushed on the
    /// array so far is done (MXNet's `wait_to_read`).
    ///
    /// # Errors
    ///
    /// As for [`to_vec`](Self::to_vec), and the errors of a blocking wait
    /// ([`OpHandle::wait`]).
    pub fn wait_to_read(&self) -> Result<(), Error> {
        self.read_with("wait_to_read", |_| Ok(())).wait()
    }

    /// Its one element, once written (blocks).
    ///
    /// # Errors
    ///
    /// [`Error::Array`] if it does not have exactly one element; as for
    /// [`wait_to_read`](Self::wait_to_read).
    pub fn item(&self) -> Result<f32, Error> {
        if self.len() != 1 {
            return Err(super::shape::misfit(
                "item",
                format!(
                    "shape {:?} has {} elements, not 1",
                    self.shape(),
                    self.len()
                ),
            ));
        }
        self.read_with("item", |x| Ok(x[0])).wait()
    }

    fn read_with<T, F>(&self, name: &'static str, f: F) -> Values<T>
    where
        T: Send + 'static,
        F: Fn(&[f32]) -> Result<T, BoxError> + Send + Sync + 'static,
    {
        let data = self.inner.data.clone();
        let pushed = self
            .inner
            .engine
            .op()
            .name(name)
            .on(self.inner.device)
            .reads(&[&self.inner.data])
            .run(move |ctx: &OpCtx| f(&ctx.read(&data)?));
        Values(match pushed {
            Ok(handle) => Pending::Pushed(handle),
            Err(e) => Pending::Refused(Some(e)),
        })
    }
}

impl fmt::Debug for Array {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Array")
            .field("id", &self.inner.data.id())
            .field("shape", &self.shape())
            .field("device", &self.inner.device)
            .finish()
    }
}

/// Waits for the values and prints them as ndarray does, or the error
/// that stands in their place.
impl fmt::Display for Array {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.to_ndarray().wait() {
            Ok(values) => fmt::Display::fmt(&values, f),
            Err(e) => write!(f, "<array {:?}: {e}>", self.shape()),
        }
    }
}

/// A future of an array's values ([`Array::to_vec`]): an
/// [`OpHandle`] of the read, or the error that refused it.
#[must_use = "a read does nothing unless waited for or awaited"]
#[derive(Debug)]
pub struct Values<T>(Pending<T>);

#[derive(Debug)]
enum Pending<T> {
    Pushed(OpHandle<T>),
    Refused(Option<Error>),
}

impl<T: Send + 'static> Values<T> {
    /// Blocks until the values are read (see [`OpHandle::wait`] for where
    /// blocking is refused).
    ///
    /// # Errors
    ///
    /// See [`Array::to_vec`].
    pub fn wait(self) -> Result<T, Error> {
        match self.0 {
            Pending::Pushed(handle) => handle.wait(),
            Pending::Refused(e) => Err(e.expect("Values polled after it returned")),
        }
    }
}

impl<T: Send + 'static> Values<T> {
    /// As [`wait`](Self::wait), giving up after `timeout` (see
    /// [`OpHandle::wait_timeout`]); the read stays pending, so waiting
    /// again may still get the values.
    ///
    /// # Errors
    ///
    /// [`Error::TimedOut`] after `timeout`; else as [`wait`](Self::wait).
    ///
    /// # Panics
    ///
    /// If the values were already returned, as [`OpHandle::wait_timeout`].
    pub fn wait_timeout(&mut self, timeout: std::time::Duration) -> Result<T, Error> {
        match &mut self.0 {
            Pending::Pushed(handle) => handle.wait_timeout(timeout),
            Pending::Refused(e) => Err(e.take().expect("Values waited for after it returned")),
        }
    }
}

impl<T: Send + 'static> Future for Values<T> {
    type Output = Result<T, Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.0 {
            Pending::Pushed(handle) => Pin::new(handle).poll(cx),
            Pending::Refused(e) => {
                Poll::Ready(Err(e.take().expect("Values polled after it returned")))
            }
        }
    }
}
