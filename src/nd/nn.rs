//! Layers, as much as the seeds' models need: [`Linear`], [`Conv2d`],
//! [`MaxPool2d`], [`Relu`], [`Flatten`] and [`Sequential`] behind one
//! small trait, [`Module`], and the loss [`softmax_cross_entropy`]. Each
//! forward pass is array operations, so it is pushed or recorded as the
//! caller chooses and differentiated by autograd.
//!
//! Parameters are drawn from the [`Arrays`]' generator as PyTorch draws
//! them by default: uniform in ±1/√fan_in.

use super::{Array, Arrays};
use crate::error::Error;

use super::shape::misfit;

/// A layer or a model: a function of one array with parameters.
///
/// ```
/// use depflow::{Engine, Error, nd};
/// use depflow::nd::nn::{Linear, Module, Relu, Sequential};
///
/// let arrays = nd::Arrays::new(&Engine::new());
/// let model = Sequential::new()
///     .push(Linear::new(&arrays, 4, 8)?)
///     .push(Relu)
///     .push(Linear::new(&arrays, 8, 2)?);
/// let y = model.forward(&arrays.ones(&[3, 4])?)?;
/// assert_eq!(y.shape(), [3, 2]);
/// assert_eq!(model.parameters().len(), 4);
/// # Ok::<(), Error>(())
/// ```
pub trait Module: Send + Sync {
    /// The layer applied to `x`.
    ///
    /// # Errors
    ///
    /// [`Error::Array`] if `x` does not fit the layer.
    fn forward(&self, x: &Array) -> Result<Array, Error>;

    /// The layer's parameters (leaves, [`Array::with_grad`]), in a fixed
    /// order.
    fn parameters(&self) -> Vec<Array> {
        Vec::new()
    }
}

/// A parameter of `shape` drawn uniformly in ±1/√`fan_in`.
fn parameter(arrays: &Arrays, shape: &[usize], fan_in: usize) -> Result<Array, Error> {
    let bound = 1.0 / (fan_in.max(1) as f32).sqrt();
    Ok(arrays.uniform(shape, -bound, bound)?.with_grad())
}

/// `y = x W + b`, for `x: [batch, inputs]`: `W: [inputs, outputs]`,
/// `b: [outputs]`.
#[derive(Clone, Debug)]
pub struct Linear {
    /// The weights, `[inputs, outputs]`.
    pub weight: Array,
    /// The biases, `[outputs]`.
    pub bias: Array,
}

impl Linear {
    /// A layer from `inputs` to `outputs` features, drawn from `arrays`'
    /// generator on its device.
    ///
    /// # Errors
    ///
    /// [`Error::ShutDown`] after shutdown.
    pub fn new(arrays: &Arrays, inputs: usize, outputs: usize) -> Result<Linear, Error> {
        Ok(Linear {
            weight: parameter(arrays, &[inputs, outputs], inputs)?,
            bias: parameter(arrays, &[outputs], inputs)?,
        })
    }
}

impl Module for Linear {
    fn forward(&self, x: &Array) -> Result<Array, Error> {
        x.matmul(&self.weight)?.add(&self.bias)
    }

    fn parameters(&self) -> Vec<Array> {
        vec![self.weight.clone(), self.bias.clone()]
    }
}

/// A 2-D convolution of images `[n, c, h, w]` ([`Array::conv2d`]) plus a
/// bias per output channel.
#[derive(Clone, Debug)]
pub struct Conv2d {
    /// The filters, `[outputs, inputs, k, k]`.
    pub weight: Array,
    /// The biases, `[outputs]`.
    pub bias: Array,
    /// The stride.
    pub stride: usize,
    /// The zero padding on every side.
    pub pad: usize,
}

impl Conv2d {
    /// `outputs` filters of `k × k` over `inputs` channels, stride 1 and
    /// padding `pad`, drawn from `arrays`' generator.
    ///
    /// # Errors
    ///
    /// [`Error::ShutDown`] after shutdown.
    pub fn new(
        arrays: &Arrays,
        inputs: usize,
        outputs: usize,
        k: usize,
        pad: usize,
    ) -> Result<Conv2d, Error> {
        let fan_in = inputs * k * k;
        Ok(Conv2d {
            weight: parameter(arrays, &[outputs, inputs, k, k], fan_in)?,
            bias: parameter(arrays, &[outputs], fan_in)?,
            stride: 1,
            pad,
        })
    }
}

impl Module for Conv2d {
    fn forward(&self, x: &Array) -> Result<Array, Error> {
        let outputs = self.bias.len();
        let y = x.conv2d(&self.weight, self.stride, self.pad)?;
        y.add(&self.bias.reshape(&[1, outputs, 1, 1])?)
    }

    fn parameters(&self) -> Vec<Array> {
        vec![self.weight.clone(), self.bias.clone()]
    }
}

/// Max pooling over `k × k` windows with stride `k` ([`Array::max_pool2d`]).
#[derive(Clone, Copy, Debug)]
pub struct MaxPool2d(pub usize);

impl Module for MaxPool2d {
    fn forward(&self, x: &Array) -> Result<Array, Error> {
        x.max_pool2d(self.0, self.0)
    }
}

/// `max(x, 0)` ([`Array::relu`]).
#[derive(Clone, Copy, Debug)]
pub struct Relu;

impl Module for Relu {
    fn forward(&self, x: &Array) -> Result<Array, Error> {
        x.relu()
    }
}

/// `[n, ...]` seen as `[n, rest]` ([`Array::reshape`]: no copy).
#[derive(Clone, Copy, Debug)]
pub struct Flatten;

impl Module for Flatten {
    fn forward(&self, x: &Array) -> Result<Array, Error> {
        let n = x.shape().first().copied().unwrap_or(1);
        x.reshape(&[n, x.len() / n.max(1)])
    }
}

/// Layers applied in turn.
#[derive(Default)]
pub struct Sequential {
    layers: Vec<Box<dyn Module>>,
}

impl std::fmt::Debug for Sequential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sequential")
            .field("layers", &self.layers.len())
            .finish()
    }
}

impl Sequential {
    /// No layers.
    pub fn new() -> Sequential {
        Sequential::default()
    }

    /// `layer` added last.
    pub fn push(mut self, layer: impl Module + 'static) -> Sequential {
        self.layers.push(Box::new(layer));
        self
    }
}

impl Module for Sequential {
    fn forward(&self, x: &Array) -> Result<Array, Error> {
        let mut y = x.clone();
        for layer in &self.layers {
            y = layer.forward(&y)?;
        }
        Ok(y)
    }

    fn parameters(&self) -> Vec<Array> {
        self.layers.iter().flat_map(|l| l.parameters()).collect()
    }
}

/// The mean over the batch of the cross-entropy between the softmax of
/// `logits: [n, classes]` and `targets: [n, classes]` (one-hot rows, or
/// probabilities): `−Σ targets · log_softmax(logits) / n`, a scalar array.
///
/// # Errors
///
/// [`Error::Array`] if the shapes differ or are not 2-D.
pub fn softmax_cross_entropy(logits: &Array, targets: &Array) -> Result<Array, Error> {
    if logits.ndim() != 2 || logits.shape() != targets.shape() {
        return Err(misfit(
            "softmax_cross_entropy",
            format!(
                "logits {:?} and targets {:?} are not both [n, classes]",
                logits.shape(),
                targets.shape()
            ),
        ));
    }
    let n = logits.shape()[0].max(1) as f32;
    targets.mul(&logits.log_softmax(1)?)?.sum()?.div_scalar(-n)
}

/// One-hot rows for class `labels`: `[labels.len(), classes]`.
///
/// # Errors
///
/// [`Error::Array`] for a label not below `classes`.
pub fn one_hot(arrays: &Arrays, labels: &[usize], classes: usize) -> Result<Array, Error> {
    let mut rows = vec![0.0; labels.len() * classes];
    for (i, &label) in labels.iter().enumerate() {
        if label >= classes {
            return Err(misfit(
                "one_hot",
                format!("label {label} is not below {classes} classes"),
            ));
        }
        rows[i * classes + label] = 1.0;
    }
    arrays.from_vec(rows, &[labels.len(), classes])
}
