//! Making arrays: on one device of one engine, with the engine's random
//! generator.
//!
//! The generator is an engine variable that every draw mutates (seed
//! 000's random-number example): draws take effect in program order, so a
//! seed gives the same numbers whatever the number of threads, and a draw
//! inside a recording draws anew at each replay.

use rand::SeedableRng;
use rand::rngs::StdRng;
use rand_distr::{Distribution, Normal, Uniform};

use super::shape::{Shape, checked_numel, host_device, misfit};
use super::{Array, mode};
use crate::dep::{Device, Var};
use crate::engine::Engine;
use crate::error::Error;

/// Makes arrays on one device of an engine: filled with a value, from
/// data, or drawn at random from the engine's generator, which all the
/// `Arrays` of one [`new`](Self::new) share.
///
/// ```
/// use depflow::{Engine, Error, nd};
///
/// let engine = Engine::new();
/// let arrays = nd::Arrays::new(&engine);
/// arrays.seed(7)?;
/// let noise = arrays.normal(&[2, 3], 0.0, 1.0)?;
/// let ramp = arrays.arange(3)?; // [0, 1, 2]
/// let shifted = &noise + &ramp; // broadcast along the last axis
/// assert_eq!(shifted.shape(), [2, 3]);
/// # Ok::<(), Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct Arrays {
    engine: Engine,
    device: Device,
    rng: Var<StdRng>,
}

impl Arrays {
    /// Arrays on `engine`'s default device, with a new generator seeded 0.
    pub fn new(engine: &Engine) -> Arrays {
        Arrays {
            engine: engine.clone(),
            device: engine.default_device(),
            rng: engine.var_named("nd random generator", StdRng::seed_from_u64(0)),
        }
    }

    /// The same, making arrays on `device` (sharing the generator).
    ///
    /// # Errors
    ///
    /// [`Error::Array`] if `device` is not a device of the engine, or is a
    /// stream device ([`Engine::is_stream_device`]: arrays there are not
    /// built yet).
    pub fn on(&self, device: Device) -> Result<Arrays, Error> {
        host_device("on", &self.engine, device)?;
        Ok(Arrays {
            device,
            ..self.clone()
        })
    }

    /// The device new arrays are on.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The engine.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Reseeds the generator, in program order with the draws.
    ///
    /// # Errors
    ///
    /// [`Error::ShutDown`] after shutdown.
    pub fn seed(&self, seed: u64) -> Result<(), Error> {
        let rng = self.rng.clone();
        mode::submit(
            &self.engine,
            self.device,
            "seed",
            &[],
            &[&self.rng],
            move |ctx| {
                *ctx.write(&rng)? = StdRng::seed_from_u64(seed);
                Ok(())
            },
        )
    }

    /// A new array of `shape` whose values `fill` writes, in one op.
    fn filled<F>(&self, name: &'static str, shape: &[usize], fill: F) -> Result<Array, Error>
    where
        F: Fn(&mut [f32]) + Send + Sync + 'static,
    {
        checked_numel(name, shape)?;
        let shape: Shape = shape.into();
        let array = Array::uninit(&self.engine, self.device, shape);
        array.mutate(name, move |data| {
            fill(data);
            Ok(())
        })?;
        Ok(array)
    }

    /// An array of `shape` filled with `value`.
    ///
    /// # Errors
    ///
    /// [`Error::ShutDown`] after shutdown.
    pub fn full(&self, shape: &[usize], value: f32) -> Result<Array, Error> {
        self.filled("full", shape, move |data| data.fill(value))
    }

    /// An array of `shape` filled with 0.
    ///
    /// # Errors
    ///
    /// [`Error::ShutDown`] after shutdown.
    pub fn zeros(&self, shape: &[usize]) -> Result<Array, Error> {
        self.full(shape, 0.0)
    }

    /// An array of `shape` filled with 1.
    ///
    /// # Errors
    ///
    /// [`Error::ShutDown`] after shutdown.
    pub fn ones(&self, shape: &[usize]) -> Result<Array, Error> {
        self.full(shape, 1.0)
    }

    /// `[0, 1, ..., n - 1]`.
    ///
    /// # Errors
    ///
    /// [`Error::ShutDown`] after shutdown.
    pub fn arange(&self, n: usize) -> Result<Array, Error> {
        self.filled("arange", &[n], |data| {
            data.iter_mut().enumerate().for_each(|(i, v)| *v = i as f32);
        })
    }

    /// An array of `shape` holding `values` in row-major order.
    ///
    /// # Errors
    ///
    /// [`Error::Array`] if `values` has another length than `shape`
    /// has elements.
    pub fn from_vec(&self, values: Vec<f32>, shape: &[usize]) -> Result<Array, Error> {
        let n = checked_numel("from_vec", shape)?;
        if values.len() != n {
            return Err(misfit(
                "from_vec",
                format!(
                    "{} values for shape {shape:?} ({} elements)",
                    values.len(),
                    n
                ),
            ));
        }
        self.filled("from_vec", shape, move |data| data.copy_from_slice(&values))
    }

    /// An array holding a copy of `values`, of its shape.
    ///
    /// # Errors
    ///
    /// [`Error::ShutDown`] after shutdown.
    pub fn from_ndarray<S, D>(&self, values: &ndarray::ArrayBase<S, D>) -> Result<Array, Error>
    where
        S: ndarray::Data<Elem = f32>,
        D: ndarray::Dimension,
    {
        let shape = values.shape().to_vec();
        self.from_vec(values.iter().copied().collect(), &shape)
    }

    /// An array of `shape` drawn uniformly from `[low, high)` by the
    /// engine's generator.
    ///
    /// # Errors
    ///
    /// [`Error::Array`] unless `low < high`, both finite.
    pub fn uniform(&self, shape: &[usize], low: f32, high: f32) -> Result<Array, Error> {
        let dist = Uniform::new(low, high)
            .map_err(|e| misfit("uniform", format!("[{low}, {high}): {e}")))?;
        self.draw("uniform", shape, move |rng, data| {
            data.iter_mut().for_each(|v| *v = dist.sample(rng));
        })
    }

    /// An array of `shape` drawn from the normal distribution of mean
    /// `mean` and standard deviation `std` by the engine's generator.
    ///
    /// # Errors
    ///
    /// [`Error::Array`] unless `std` is finite and not negative.
    pub fn normal(&self, shape: &[usize], mean: f32, std: f32) -> Result<Array, Error> {
        // rand_distr's `Normal` accepts a negative deviation (drawing
        // `mean - |std| z`): refused here, as documented.
        if std < 0.0 {
            return Err(misfit(
                "normal",
                format!("mean {mean}, standard deviation {std}: negative"),
            ));
        }
        let dist = Normal::new(mean, std).map_err(|e| {
            misfit(
                "normal",
                format!("mean {mean}, standard deviation {std}: {e}"),
            )
        })?;
        self.draw("normal", shape, move |rng, data| {
            data.iter_mut().for_each(|v| *v = dist.sample(rng));
        })
    }

    fn draw<F>(&self, name: &'static str, shape: &[usize], fill: F) -> Result<Array, Error>
    where
        F: Fn(&mut StdRng, &mut [f32]) + Send + Sync + 'static,
    {
        checked_numel(name, shape)?;
        let shape: Shape = shape.into();
        let array = Array::uninit(&self.engine, self.device, shape);
        let (rng, data) = (self.rng.clone(), array.buffer().clone());
        mode::submit(
            &self.engine,
            self.device,
            name,
            &[],
            &[&self.rng, array.buffer()],
            move |ctx| {
                fill(&mut *ctx.write(&rng)?, &mut ctx.write(&data)?);
                Ok(())
            },
        )?;
        Ok(array)
    }
}
