//! One training step: [`Group::step`] calls the user's closure once per
//! device with a [`DeviceStep`] (the device's shard, replicas and
//! gradients), and pushes each bucket's reduction and update as soon as
//! every device has pushed the ops writing its gradients
//! ([`DeviceStep::grad_ready`]), else at the end of the step.
//!
//! **Across ranks, every step pushes all its collectives.** A step that
//! fails on one rank (the closure's error, a batch refused or missing)
//! would otherwise leave that rank's collectives of the step unpushed, and
//! the other ranks' would pair with its *next* step's: the same wrong
//! weights on every rank, no error, then a wait forever. So there a failed
//! step poisons the gradients of the buckets it has not reduced yet, with
//! its error (one op), and pushes their reductions anyway: they skip on
//! the poison, their collectives stand in, failed, and every rank's sums
//! of the step fail naming this rank and its error. Every collective of
//! step `k` is tagged `k + 1` (see `CollectiveOp::tag`): a mismatch left
//! anyway fails on every rank rather than being computed with.

use super::bucket::Buckets;
use super::group::{Group, Param};
use super::split::Slot;
use crate::dep::{Device, Var};
use crate::engine::Engine;
use crate::error::Error;

/// What the step closure gets for one device: where to push, and the
/// variables of that device.
#[derive(Debug)]
pub struct DeviceStep<'g> {
    group: &'g Group,
    slot: &'g Slot,
    d: usize,
    buckets: &'g mut Buckets,
}

impl<'g> DeviceStep<'g> {
    /// The device's position in the group.
    pub fn index(&self) -> usize {
        self.d
    }

    /// The device to push this device's ops to (`.on(step.device())`).
    pub fn device(&self) -> Device {
        self.group.members[self.d].device
    }

    /// The engine.
    pub fn engine(&self) -> &'g Engine {
        &self.group.engine
    }

    /// This device's shard of input `i` (inputs in declaration order):
    /// [`rows`](Self::rows) rows of its width. (Like the other variables
    /// here, borrowed from the group, not from `self`: they can be held
    /// across [`grad_ready`](Self::grad_ready).)
    ///
    /// # Panics
    ///
    /// If the group has no input `i`.
    pub fn input(&self, i: usize) -> &'g Var<Vec<f32>> {
        &self.slot.shards[self.d][i]
    }

    /// The number of inputs ([`input`](Self::input) takes `0..` this).
    pub fn input_count(&self) -> usize {
        self.slot.shards[self.d].len()
    }

    /// The rows of this device's shard.
    pub fn rows(&self) -> usize {
        self.slot.rows
    }

    /// The rows of the whole batch (over all devices, of every rank for
    /// a group across ranks: `GroupBuilder::across_ranks`).
    pub fn batch_rows(&self) -> usize {
        self.slot.rows * self.group.members.len() * self.group.rank_count
    }

    /// This device's replica of `p`.
    pub fn replica(&self, p: Param) -> &'g Var<Vec<f32>> {
        self.group.replica(p, self.d)
    }

    /// This device's gradient of `p`: the step's backward ops write it
    /// (whole: it is not zeroed in between), the reduction sums it.
    pub fn grad(&self, p: Param) -> &'g Var<Vec<f32>> {
        self.group.grad(p, self.d)
    }

    /// Says that the op writing `p`'s gradient on this device has been
    /// pushed: once every device has said so for every parameter of `p`'s
    /// bucket, the bucket's reduction and update are pushed, right behind
    /// (so they run while the backward of earlier layers still computes).
    /// Gradients not marked are reduced at the end of the step.
    ///
    /// # Errors
    ///
    /// [`Error::Parallel`] for a parameter marked twice in a step, or not
    /// this group's; the engine's errors for the ops pushed.
    pub fn grad_ready(&mut self, p: Param) -> Result<(), Error> {
        self.buckets.mark(self.group, p.0, self.d)
    }
}

impl Group {
    /// Clears the poison a failed op left on the group's variables
    /// (replicas, gradients, the host's copies, and the reductions' own
    /// buffers, which the user cannot reach), so that training can go on:
    /// the replicas then hold their values from before the failed step's
    /// update (which did not run; on a stream device it may have: see the
    /// [module docs](crate::parallel)). Pushed like any op, behind what is
    /// already pushed on those variables.
    ///
    /// # Errors
    ///
    /// The engine's errors pushing the ops ([`Error::ShutDown`], say).
    pub fn clear_poison(&self) -> Result<(), Error> {
        let e = &self.engine;
        for p in &self.params {
            for v in p.replicas.iter().chain(&p.grads) {
                e.clear_poison(v)?;
            }
            if let Some((w, g)) = &p.host {
                e.clear_poison(w)?;
                e.clear_poison(g)?;
            }
        }
        match &self.buckets {
            Some(buckets) => buckets.clear_poison(e),
            None => Ok(()),
        }
    }

    /// Pushes one training step on the oldest loaded batch: `f` once per
    /// device, in order, to push that device's forward and backward ops;
    /// then what is left of the gradients' reductions, and the updates.
    /// Returns once everything is pushed (not run: wait with
    /// [`weights`](Self::weights), or on a variable the ops write).
    ///
    /// # Errors
    ///
    /// [`Error::Parallel`] if no batch is loaded (for a group with inputs)
    /// or its batch was refused by [`load`](Self::load) (across ranks), or,
    /// at the first step of a group across ranks, if the ranks' device
    /// counts or buckets differ (on every rank alike);
    /// the first error `f` returns (the step stops there: what was pushed
    /// runs); errors pushing ops.
    ///
    /// Within one process, a failed step pushes no more of its reductions.
    /// Across ranks it pushes all of them, failed: the gradients of the
    /// buckets not reduced yet are poisoned with its error and their sums
    /// fail on *every* rank, whose replicas are then poisoned
    /// ([`Error::Poisoned`]) by the collective's failure, whose source is an
    /// [`Error::Collective`] naming this rank and its error (here: the
    /// error itself). The ranks stay in step: after
    /// [`clear_poison`](Self::clear_poison) on every rank, they train on.
    pub fn step<F>(&mut self, mut f: F) -> Result<(), Error>
    where
        F: FnMut(&mut DeviceStep<'_>) -> Result<(), Error>,
    {
        let tag = self.steps + 1;
        self.steps += 1;
        if self.spans_ranks() {
            return self.step_across_ranks(&mut f, tag);
        }
        let s = self.inputs.take()?;
        let mut buckets = match self.buckets.take() {
            Some(b) => b,
            None => Buckets::new(self, tag)?,
        };
        buckets.start(self.members.len(), tag);
        let result = self.step_with(s, &mut buckets, &mut f);
        self.buckets = Some(buckets);
        result
    }

    /// Whether the group spans ranks (even a communicator of one).
    #[cfg(feature = "mpi")]
    fn spans_ranks(&self) -> bool {
        self.ranks.is_some()
    }

    #[cfg(not(feature = "mpi"))]
    fn spans_ranks(&self) -> bool {
        false
    }

    /// A step of a group across ranks: whatever fails on this rank, every
    /// collective of the step is pushed (see the module docs).
    fn step_across_ranks<F>(&mut self, f: &mut F, tag: u64) -> Result<(), Error>
    where
        F: FnMut(&mut DeviceStep<'_>) -> Result<(), Error>,
    {
        // The layout check (the first step's collective) comes first: it
        // is pushed on every rank, whatever this one's batch.
        let mut buckets = match self.buckets.take() {
            Some(b) => b,
            None => Buckets::new(self, tag)?,
        };
        buckets.start(self.members.len(), tag);
        let result = self
            .inputs
            .take()
            .and_then(|s| self.step_with(s, &mut buckets, f));
        if let Err(e) = &result {
            // Only a push refused by the engine (shut down) fails this;
            // the step's own error is the one to report.
            let _ = buckets.fail_rest(self, e);
        }
        self.buckets = Some(buckets);
        result
    }

    fn step_with<F>(&self, s: usize, buckets: &mut Buckets, f: &mut F) -> Result<(), Error>
    where
        F: FnMut(&mut DeviceStep<'_>) -> Result<(), Error>,
    {
        let n = self.members.len();
        let group = self;
        let slot = group.inputs.slot(s);
        for d in 0..n {
            f(&mut DeviceStep {
                group,
                slot,
                d,
                buckets,
            })?;
        }
        buckets.finish(group)
    }
}
