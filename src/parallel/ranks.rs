//! A group across ranks (the `mpi` feature): the check, at the first
//! step, that every rank laid the group out alike; and under
//! [`Update::Host`](super::Update::Host) the all-reduce of each rank's
//! host sums.
//!
//! The cross-rank sums are MPI all-reduces of the ring's chunks, whose
//! lengths follow from the local device count and the buckets' lengths. A
//! rank with another layout would issue collectives of other lengths (MPI
//! truncates or hangs) or another number of them (the ranks fall out of
//! step). So the first step all-gathers every rank's layout, once, and
//! every rank compares the same gathered list, failing alike, before any
//! reduction is pushed.

use super::group::Group;
use crate::dep::Var;
use crate::engine::Communicator;
use crate::error::Error;

/// This rank's layout: local devices, buckets, and a digest (FNV-1a) of
/// the buckets' lengths in floats.
fn layout(devices: usize, buckets: &[usize]) -> [u64; 3] {
    let digest = buckets.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, &len| {
        (len as u64)
            .to_le_bytes()
            .iter()
            .fold(h, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
    });
    [devices as u64, buckets.len() as u64, digest]
}

/// Checks that every rank of `ranks` has `group`'s device count and
/// buckets of the lengths `buckets` (floats per bucket): one all-gather
/// (tagged `tag`, the first step's), waited for.
///
/// # Errors
///
/// [`Error::Parallel`] naming the first rank whose layout differs from
/// rank 0's (the same error on every rank); the collective's errors.
pub(super) fn check_layout(
    group: &Group,
    ranks: &Communicator,
    buckets: &[usize],
    tag: u64,
) -> Result<(), Error> {
    let engine = &group.engine;
    let mine = engine.var(layout(group.members.len(), buckets).to_vec());
    let all = engine.var(Vec::new());
    ranks
        .all_gather(&mine, &all)
        .name("parallel layout")
        .tag(tag)
        .push()?
        .wait()?;
    let all = engine.get(&all).wait()?;
    let first = &all[..3];
    if let Some(r) = (1..ranks.size()).find(|&r| all[r * 3..][..3] != *first) {
        let other = &all[r * 3..][..3];
        let what = if other[0] != first[0] {
            format!("{} local device(s), rank 0 {}", other[0], first[0])
        } else {
            format!(
                "{} bucket(s) of other lengths than rank 0's {} (different parameters or bucket sizes)",
                other[1], first[1]
            )
        };
        return Err(Error::Parallel(format!(
            "the group's layout differs across ranks: rank {r} has {what}; every rank needs \
             the same device count and parameters"
        )));
    }
    Ok(())
}

/// Under [`Update::Host`](super::Update::Host): sums each of `sums` (this
/// rank's host sum of a parameter's gradient, over its devices) across
/// `ranks`, in place, one collective per parameter in the bucket's order
/// (the same on every rank), before the host's update reads them. The sum
/// is the on-device update's: each rank's local sum in
/// [`serial_sum`](super::serial_sum)'s order, then `MPI_SUM` across ranks.
/// Each collective is tagged `tag` (the step's).
pub(super) fn sum_host<'p>(
    ranks: &Communicator,
    sums: impl Iterator<Item = &'p Var<Vec<f32>>>,
    (priority, tag): (i32, u64),
) -> Result<(), Error> {
    for g in sums {
        ranks
            .all_reduce(g)
            .name("allreduce ranks (host)")
            .priority(priority)
            .tag(tag)
            .push()?;
    }
    Ok(())
}
