//! Buckets: consecutive parameters whose gradients are reduced together,
//! fixed at the first step; and the bookkeeping of one step, which pushes a
//! bucket's reduction (and its update) as soon as every device has pushed
//! the ops that write its gradients.
//!
//! Bucket `b` of `B` has priority `B - b`: the first layer's parameters
//! (added first) are reduced and updated first, as the next forward pass
//! needs them first.

use super::allreduce::AllReduce;
use super::group::{Group, ParamVars};
use super::update::{HostSum, Update, every_replica};
use crate::error::Error;

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
}

impl Buckets {
    /// Groups the parameters into buckets of at most `group.bucket_bytes`.
    pub(super) fn new(group: &Group) -> Result<Self, Error> {
        let n = group.members.len();
        let mut cuts: Vec<Vec<usize>> = Vec::new();
        let mut bytes = 0;
        for (i, p) in group.params.iter().enumerate() {
            let size = p.len * 4;
            match cuts.last_mut() {
                Some(last) if bytes + size <= group.bucket_bytes => last.push(i),
                _ => {
                    cuts.push(vec![i]);
                    bytes = 0;
                }
            }
            bytes += size;
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
                    Reduce::AllReduce(AllReduce::new(
                        &group.engine,
                        &comm,
                        segments,
                        &lens,
                        group.backend,
                    )?)
                }
                Update::Host => Reduce::Host(HostSum::new(&group.engine, &vars, n)),
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
        })
    }

    /// Starts a step: no gradient pushed yet.
    pub(super) fn start(&mut self, n: usize) {
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

    /// Pushes bucket `b`'s reduction and update.
    fn push(&self, group: &Group, b: usize) -> Result<(), Error> {
        let priority = i32::try_from(self.list.len() - b).unwrap_or(i32::MAX);
        let bucket = &self.list[b];
        let opt = group.optimizer.as_ref();
        match &bucket.reduce {
            Reduce::AllReduce(reduce) => {
                reduce.push(&group.engine, priority)?;
                if let Some(opt) = opt {
                    for &p in &bucket.params {
                        every_replica(
                            &group.engine,
                            &group.members,
                            &group.params[p],
                            opt,
                            priority,
                        )?;
                    }
                }
            }
            Reduce::Host(sum) => {
                let params: Vec<&ParamVars> =
                    bucket.params.iter().map(|&p| &group.params[p]).collect();
                sum.push(&group.engine, &group.members, &params, opt, priority)?;
            }
        }
        Ok(())
    }
}
