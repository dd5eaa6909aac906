//! Data-parallel training of a [`Module`] on arrays, over a
//! [`parallel::Group`](crate::parallel::Group) (seed 001's
//! `parallel_do`, PyTorch's DistributedDataParallel): one replica of the
//! module per device of the group, each batch split across them, and each
//! parameter's gradient handed to the group's bucketed all-reduce as soon
//! as the backward pass has pushed the last op adding into it, so the
//! reduction of the last layers overlaps the backward pass of the first.
//!
//! The group keeps its own copy of each replica's weights and gradients
//! (`Vec<f32>` variables, which its reduction and optimizer work on): a
//! step copies each finished gradient array into the group's gradient
//! (one op), and after the group's update copies the group's weights back
//! into the replica's parameter arrays (one op each). Two copies per
//! parameter and device per step: the price of reusing the group's
//! reduction (ring, NCCL, across MPI ranks) unchanged.
//!
//! The order of the sums is the group's (see
//! [`GroupBuilder::bucket_bytes`](crate::parallel::GroupBuilder::bucket_bytes)):
//! each device's gradient over its shard, summed across devices in
//! [`serial_sum`](crate::parallel::serial_sum)'s order.

use super::nn::Module;
use super::shape::misfit;
use super::{Array, Arrays, mode};
use crate::dep::{AnyVar, Var};
use crate::error::Error;
use crate::parallel::{Group, Param};

/// A module replicated on every device of a group (see the module docs).
///
/// ```
/// use depflow::nd::nn::{self, Linear, Module};
/// use depflow::nd::{self, DataParallel};
/// use depflow::parallel::Group;
/// use depflow::{Engine, Error, Executor};
///
/// let engine = Engine::builder()
///     .device("cpu0", Executor::pool(1))
///     .device("cpu1", Executor::pool(1))
///     .build()?;
/// let devices = ["cpu0", "cpu1"].map(|d| engine.device(d).unwrap());
/// // Inputs: rows of 3 features, and one-hot rows of 2 classes; SGD.
/// let group = Group::builder(&engine)
///     .devices(devices)
///     .input(3)
///     .input(2)
///     .optimizer(|w, g| w.iter_mut().zip(g).for_each(|(w, g)| *w -= 0.1 * g))
///     .build()?;
/// let arrays = nd::Arrays::new(&engine);
/// let mut model = DataParallel::new(group, &arrays, |arrays| Linear::new(arrays, 3, 2))?;
/// let batch = vec![vec![0.5; 4 * 3], vec![1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0]];
/// model.step(batch, |replica, inputs, batch_rows| {
///     // The loss summed over this device's rows, over the whole batch's:
///     // the group sums the devices' gradients.
///     let logits = replica.forward(&inputs[0])?;
///     let rows = inputs[0].shape()[0] as f32;
///     nn::softmax_cross_entropy(&logits, &inputs[1])?.mul_scalar(rows / batch_rows as f32)
/// })?;
/// let (w0, w1) = (model.replica(0).weight.to_vec().wait()?, model.replica(1).weight.to_vec().wait()?);
/// assert_eq!(w0, w1); // every replica updated alike
/// # Ok::<(), Error>(())
/// ```
pub struct DataParallel<M> {
    group: Group,
    replicas: Vec<M>,
    /// The group's parameter for each of a replica's parameters, in
    /// [`Module::parameters`] order.
    params: Vec<Param>,
    /// Per device, the arrays each step copies its shard of each input
    /// into, remade when the shard's rows change.
    inputs: Vec<Vec<Array>>,
}

impl<M> std::fmt::Debug for DataParallel<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DataParallel")
            .field("devices", &self.replicas.len())
            .field("params", &self.params.len())
            .finish()
    }
}

impl<M: Module> DataParallel<M> {
    /// Replicates the module `make` builds on every device of `group`
    /// (a group with no parameters yet): `make` is called once per
    /// device with `arrays` on that device, and every replica then gets
    /// device 0's initial values.
    ///
    /// # Errors
    ///
    /// [`Error::Parallel`] if the group already has parameters;
    /// [`Error::Array`] if the replicas' parameters differ in number or
    /// shape, one is not on its replica's device, or a module lists one
    /// twice; what `make` returns; the group's errors adding parameters
    /// ([`Group::param`]).
    pub fn new(
        mut group: Group,
        arrays: &Arrays,
        make: impl Fn(&Arrays) -> Result<M, Error>,
    ) -> Result<DataParallel<M>, Error> {
        if group.param_count() != 0 {
            return Err(Error::Parallel(format!(
                "the group already has {} parameter(s): DataParallel adds the module's own",
                group.param_count()
            )));
        }
        let devices: Vec<_> = group.devices().collect();
        let replicas = devices
            .iter()
            .map(|&d| make(&arrays.on(d)?))
            .collect::<Result<Vec<M>, Error>>()?;
        let first = replicas[0].parameters();
        if let Some(j) =
            (1..first.len()).find(|&j| first[..j].iter().any(|p| p.shares_data(&first[j])))
        {
            return Err(misfit(
                "data_parallel",
                format!("the module lists parameter {j} twice: each parameter once"),
            ));
        }
        for (d, replica) in replicas.iter().enumerate() {
            if let Some(p) = replica
                .parameters()
                .iter()
                .find(|p| p.device() != devices[d])
            {
                return Err(misfit(
                    "data_parallel",
                    format!(
                        "replica {d} has a parameter of shape {:?} on {:?}, not on its device {:?}: \
                         make it with the Arrays it is given",
                        p.shape(),
                        p.device(),
                        devices[d]
                    ),
                ));
            }
            let shapes: Vec<_> = replica
                .parameters()
                .iter()
                .map(|p| p.shape().to_vec())
                .collect();
            let want: Vec<_> = first.iter().map(|p| p.shape().to_vec()).collect();
            if shapes != want {
                return Err(misfit(
                    "data_parallel",
                    format!("replica {d}'s parameters {shapes:?} are not replica 0's {want:?}"),
                ));
            }
        }
        let mut params = Vec::with_capacity(first.len());
        for (j, p) in first.iter().enumerate() {
            let init = p.to_vec().wait()?;
            params.push(group.param(&init)?);
            for replica in &replicas[1..] {
                super::no_grad(|| p.copy_to(&replica.parameters()[j]))?;
            }
        }
        Ok(DataParallel {
            inputs: vec![Vec::new(); devices.len()],
            group,
            replicas,
            params,
        })
    }

    /// The replica on device `d` of the group.
    ///
    /// # Panics
    ///
    /// If `d` is not a device of the group.
    pub fn replica(&self, d: usize) -> &M {
        &self.replicas[d]
    }

    /// The group (its devices, [`Group::weights`], its trace of
    /// reductions).
    pub fn group(&self) -> &Group {
        &self.group
    }

    /// One training step on `batch` (one `Vec` per input of the group:
    /// whole rows; see [`Group::load`]): splits it across the devices,
    /// then on every device calls `loss(replica, inputs, batch_rows)` with
    /// that device's shard of each input (`[rows, width]` arrays), and
    /// pushes the backward pass of the loss it returns, handing each
    /// gradient to the group's all-reduce as soon as it is pushed; then
    /// the group's update, and the updated weights copied back into every
    /// replica. Returns once all of it is pushed.
    ///
    /// The group sums the devices' gradients: for the gradient of the
    /// batch's mean loss, return each shard's summed loss divided by
    /// `batch_rows`.
    ///
    /// # Errors
    ///
    /// As for [`Group::load`] and [`Group::step`]; what `loss` returns;
    /// the backward pass's errors ([`Error::Array`] for a loss of more
    /// than one element).
    pub fn step<F>(&mut self, batch: Vec<Vec<f32>>, mut loss: F) -> Result<(), Error>
    where
        F: FnMut(&M, &[Array], usize) -> Result<Array, Error>,
    {
        let lengths: Vec<usize> = batch.iter().map(Vec::len).collect();
        self.group.load(batch)?;
        let devices = self.replicas.len();
        let (replicas, inputs, params) = (&self.replicas, &mut self.inputs, &self.params);
        self.group.step(|s| {
            let d = s.index();
            let replica = &replicas[d];
            let shards = (0..s.input_count())
                .map(|i| s.input(i).clone())
                .collect::<Vec<_>>();
            // This process's batch is `rows` rows per device.
            let widths: Vec<usize> = lengths
                .iter()
                .map(|l| l / (s.rows() * devices).max(1))
                .collect();
            let arrays = shard_arrays(&mut inputs[d], replica, s.device(), s.rows(), &widths)?;
            for (array, shard) in arrays.iter().zip(&shards) {
                copy_in(shard, array)?;
            }
            let weights = replica.parameters();
            for p in &weights {
                p.zero_grad()?;
            }
            let l = loss(replica, arrays, s.batch_rows())?;
            let mut handed = vec![false; weights.len()];
            l.backward_each(&mut |leaf| {
                let Some(j) = weights.iter().position(|p| p.shares_data(leaf)) else {
                    return Ok(()); // a leaf that is not a parameter
                };
                handed[j] = true;
                hand_over(leaf, s.grad(params[j]))?;
                s.grad_ready(params[j])
            })?;
            // Parameters the loss did not reach: their (zeroed) gradients.
            for (j, p) in weights.iter().enumerate().filter(|(j, _)| !handed[*j]) {
                hand_over(p, s.grad(params[j]))?;
            }
            Ok(())
        })?;
        for (d, replica) in self.replicas.iter().enumerate() {
            for (p, &param) in replica.parameters().iter().zip(&self.params) {
                copy_in(self.group.replica(param, d), p)?;
            }
        }
        Ok(())
    }
}

/// The arrays a device's shards are copied into: `[rows, width]` each,
/// on `device`, made (of the engine's own) when the rows change.
fn shard_arrays<'a, M: Module>(
    kept: &'a mut Vec<Array>,
    replica: &M,
    device: crate::dep::Device,
    rows: usize,
    widths: &[usize],
) -> Result<&'a [Array], Error> {
    let fits = kept.len() == widths.len()
        && kept
            .iter()
            .zip(widths)
            .all(|(a, &w)| a.shape() == [rows, w]);
    if !fits {
        let engine = replica
            .parameters()
            .first()
            .map(|p| p.engine().clone())
            .ok_or_else(|| misfit("data_parallel", "a module with no parameters"))?;
        *kept = widths
            .iter()
            .map(|&width| Array::zeroed_outside(&engine, device, [rows, width].into()))
            .collect();
    }
    Ok(kept)
}

/// Pushes an op copying `from` into `to`'s values.
fn copy_in(from: &Var<Vec<f32>>, to: &Array) -> Result<(), Error> {
    let (src, dst) = (from.clone(), to.buffer().clone());
    mode::submit(
        to.engine(),
        to.device(),
        "copy in",
        &[from],
        &[to.buffer()],
        move |ctx| {
            ctx.write(&dst)?.copy_from_slice(&ctx.read(&src)?);
            Ok(())
        },
    )
}

/// Pushes an op copying parameter `p`'s gradient into the group's
/// gradient variable `to`.
fn hand_over(p: &Array, to: &Var<Vec<f32>>) -> Result<(), Error> {
    let grad = p
        .grad()
        .ok_or_else(|| misfit("data_parallel", "a parameter without a gradient"))?;
    let (src, dst) = (grad.buffer().clone(), to.clone());
    let reads: [&dyn AnyVar; 1] = [grad.buffer()];
    mode::submit(
        p.engine(),
        p.device(),
        "hand over",
        &reads,
        &[to],
        move |ctx| {
            ctx.write(&dst)?.copy_from_slice(&ctx.read(&src)?);
            Ok(())
        },
    )
}
