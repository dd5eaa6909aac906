//! Buckets: consecutive parameters whose gradients are reduced together,
//! fixed at the first step (filled from the last parameter back, as
//! backward writes gradients); and the bookkeeping of one step, which pushes a
//! bucket's reduction (and its update) as soon as every device has pushed
//! the ops that write its gradients.
//!
//! Bucket `b` of `B` (in parameter order) has priority `B - b` for its
//! reduction: a reduction's ops run before any ready op of priority 0 (the
//! backward ops, typically) on its device, so that it moves while backward
//! still computes, and the first layer's parameters (added first) are
//! reduced first, as the next forward pass needs them first. Its update on
//! every replica has priority `-(b + 1)`: below the backward ops still to
//! run on the device (the update is needed only by the next forward pass,
//! while every backward op it would delay delays the gradients still to be
//! reduced), and again the first layer's first.

use super::allreduce::AllReduce;
use super::group::{Group, ParamVars};
use super::update::{HostSum, Update, every_replica};
use crate::dep::{Device, Var};
use crate::engine::Engine;
use crate::error::Error;

/// The buckets of parameters of `lens` floats: filled from the last
/// parameter back (backward writes the last layer's gradients first, so a
/// bucket's gradients are ready about together, as in PyTorch's DDP),
/// consecutive parameters while they fit in `bytes` (a larger one alone);
/// listed in parameter order.
fn cuts(
    lens: impl DoubleEndedIterator<Item = usize> + ExactSizeIterator,
    bytes: usize,
) -> Vec<Vec<usize>> {
    let mut cuts: Vec<Vec<usize>> = Vec::new();
    let mut used = 0;
    for (i, len) in lens.enumerate().rev() {
        let size = len * 4;
        match cuts.last_mut() {
            Some(last) if used + size <= bytes => last.insert(0, i),
            _ => {
                cuts.push(vec![i]);
                used = 0;
            }
        }
        used += size;
    }
    cuts.reverse();
    cuts
}

/// A bucket's all-reduce over the devices `comm` (and the group's ranks,
/// if it spans some).
fn all_reduce(
    group: &Group,
    comm: &[Device],
    segments: Vec<Vec<Var<Vec<f32>>>>,
    lens: &[usize],
) -> Result<AllReduce, Error> {
    let e = &group.engine;
    #[cfg(feature = "mpi")]
    if let Some(ranks) = &group.ranks {
        return AllReduce::across_ranks(e, comm, segments, lens, group.backend, ranks);
    }
    AllReduce::new(e, comm, segments, lens, group.backend)
}

/// One bucket.
#[derive(Debug)]
struct Bucket {
    /// Its parameters' indices, in order.
    params: Vec<usize>,
    /// How its gradients are summed.
    reduce: Reduce,
}

#[derive(Debug)]
enum Reduce {
    AllReduce(AllReduce),
    Host(HostSum),
}

/// The group's buckets, and one step's progress through them.
#[derive(Debug)]
pub(super) struct Buckets {
    list: Vec<Bucket>,
    /// The bucket of each parameter.
    of: Vec<usize>,
    /// This step: `left[b]`, how many (parameter, device) gradients of
    /// bucket `b` are still to be pushed; `marked[p * n + d]`, whether
    /// device `d` has pushed the op writing `p`'s gradient.
    left: Vec<usize>,
    marked: Vec<bool>,
    /// This step's tag, on its collectives across ranks.
    tag: u64,
}

impl Buckets {
    /// Groups the parameters into buckets of at most `group.bucket_bytes`
    /// (across ranks, checking the ranks' layouts with one collective
    /// tagged `tag`).
    pub(super) fn new(group: &Group, tag: u64) -> Result<Self, Error> {
        let n = group.members.len();
        let cuts = cuts(group.params.iter().map(|p| p.len), group.bucket_bytes);
        #[cfg(not(feature = "mpi"))]
        let _ = tag;
        #[cfg(feature = "mpi")]
        if let Some(ranks) = &group.ranks {
            let lens: Vec<usize> = cuts
                .iter()
                .map(|b| b.iter().map(|&p| group.params[p].len).sum())
                .collect();
            super::ranks::check_layout(group, ranks, &lens, tag)?;
        }
        let mut of = vec![0; group.params.len()];
        let mut list = Vec::with_capacity(cuts.len());
        for (b, params) in cuts.into_iter().enumerate() {
            let vars: Vec<&ParamVars> = params.iter().map(|&p| &group.params[p]).collect();
            let reduce = match group.update {
                Update::EveryReplica => {
                    let comm: Vec<_> = group.members.iter().map(|m| m.comm).collect();
                    let segments = (0..n)
                        .map(|d| vars.iter().map(|p| p.grads[d].clone()).collect())
                        .collect();
                    let lens: Vec<usize> = vars.iter().map(|p| p.len).collect();
                    Reduce::AllReduce(all_reduce(group, &comm, segments, &lens)?)
                }
                Update::Host => Reduce::Host(HostSum::new(group, &vars, n)),
            };
            for &p in &params {
                of[p] = b;
            }
            list.push(Bucket { params, reduce });
        }
        Ok(Self {
            left: vec![0; list.len()],
            marked: vec![false; group.params.len() * n],
            list,
            of,
            tag,
        })
    }

    /// Starts a step tagged `tag`: no gradient pushed yet.
    pub(super) fn start(&mut self, n: usize, tag: u64) {
        self.tag = tag;
        for (left, bucket) in self.left.iter_mut().zip(&self.list) {
            *left = bucket.params.len() * n;
        }
        self.marked.fill(false);
    }

    /// Device `d` has pushed the op that writes `p`'s gradient: if that was
    /// the bucket's last, pushes its reduction and update.
    pub(super) fn mark(&mut self, group: &Group, p: usize, d: usize) -> Result<(), Error> {
        let n = group.members.len();
        let Some(marked) = self.marked.get_mut(p * n + d) else {
            return Err(Error::Parallel(format!("no parameter {p} in this group")));
        };
        if std::mem::replace(marked, true) {
            return Err(Error::Parallel(format!(
                "device {d} marked parameter {p}'s gradient ready twice in one step"
            )));
        }
        let b = self.of[p];
        self.left[b] -= 1;
        if self.left[b] == 0 {
            self.push(group, b)?;
        }
        Ok(())
    }

    /// Marks every gradient not marked yet, in bucket order (the end of a
    /// step).
    pub(super) fn finish(&mut self, group: &Group) -> Result<(), Error> {
        let n = group.members.len();
        for p in 0..group.params.len() {
            for d in 0..n {
                if !self.marked[p * n + d] {
                    self.mark(group, p, d)?;
                }
            }
        }
        Ok(())
    }

    /// The step failed with `error` on this rank (across ranks): poisons
    /// the gradients of the buckets not pushed yet with it (one op), then
    /// pushes their reductions, which skip on the poison, so that their
    /// collectives take part, failed (see `step.rs`).
    pub(super) fn fail_rest(&mut self, group: &Group, error: &Error) -> Result<(), Error> {
        let unpushed = (0..self.list.len()).filter(|&b| self.left[b] > 0);
        let params = unpushed.flat_map(|b| &self.list[b].params);
        let grads: Vec<&Var<Vec<f32>>> = params.flat_map(|&p| &group.params[p].grads).collect();
        if grads.is_empty() {
            return Ok(());
        }
        let why = error.to_string();
        let mut op = group.engine.op().name("failed step");
        for g in grads {
            op = op.mutates(&[g]);
        }
        op.run(move |_| Err::<(), _>(why.into()))?;
        self.finish(group)
    }

    /// Clears the poison of the variables the buckets keep for themselves.
    pub(super) fn clear_poison(&self, engine: &Engine) -> Result<(), Error> {
        for bucket in &self.list {
            match &bucket.reduce {
                Reduce::AllReduce(reduce) => {
                    for v in reduce.own_vars() {
                        engine.clear_poison(v)?;
                    }
                }
                Reduce::Host(sum) => {
                    engine.clear_poison(sum.scratch())?;
                }
            }
        }
        Ok(())
    }

    /// Pushes bucket `b`'s reduction and update.
    fn push(&self, group: &Group, b: usize) -> Result<(), Error> {
        let priority = i32::try_from(self.list.len() - b).unwrap_or(i32::MAX);
        let update_priority = i32::try_from(b + 1).map_or(i32::MIN, |b| -b);
        let bucket = &self.list[b];
        let opt = group.optimizer.as_ref();
        match &bucket.reduce {
            Reduce::AllReduce(reduce) => {
                reduce.push_tagged(&group.engine, priority, self.tag)?;
                if let Some(opt) = opt {
                    for &p in &bucket.params {
                        every_replica(
                            &group.engine,
                            &group.members,
                            &group.params[p],
                            opt,
                            update_priority,
                        )?;
                    }
                }
            }
            Reduce::Host(sum) => {
                let params = bucket.params.iter().map(|&p| &group.params[p]);
                let at = (priority, self.tag);
                sum.push(&group.engine, &group.members, params, opt, at)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::cuts;

    #[test]
    fn buckets_fill_from_the_last_parameter_back() {
        // 4-byte floats: a 40-byte bucket holds 10. From the back: 5 (0
        // floats), then 4 (20: too many to join, alone), 3, 2 and 1 (10
        // together), 0 (would make 14).
        assert_eq!(
            cuts([4, 1, 6, 3, 20, 0].into_iter(), 40),
            [vec![0], vec![1, 2, 3], vec![4], vec![5]]
        );
        assert_eq!(cuts([4, 1].into_iter(), 0), [vec![0], vec![1]]);
        assert!(cuts(std::iter::empty(), 40).is_empty());
    }
}
