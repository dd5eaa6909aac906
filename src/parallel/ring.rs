//! The in-process all-reduce: a chunked ring (reduce-scatter, then
//! all-gather), every chunk step an engine op, and its serial reference.
//!
//! A buffer of `len` floats on each of `n` devices is cut into `n` chunks
//! ([`chunk_range`]). Device `d` keeps its copy of each chunk in a variable
//! of its own (`chunks[d][c]`), so that the `n` ops of one ring step touch
//! `n` different pairs of variables and run in parallel:
//!
//! - reduce-scatter, step `s` in `0..n-1`: device `d + 1` adds its
//!   neighbour's chunk `(d - s) mod n` into its own (it reads
//!   `chunks[d][c]`, mutates `chunks[d+1][c]`). After `n - 1` steps device
//!   `d` holds the whole sum of chunk `(d + 1) mod n`.
//! - all-gather, step `s` in `0..n-1`: device `d + 1` copies its
//!   neighbour's finished chunk `(d + 1 - s) mod n`.
//!
//! Each device so receives `2 (n - 1)` chunks: `2 (n - 1) / n` of the
//! buffer. The sum of chunk `c` is a left fold around the ring from device
//! `c`: `((g[c] + g[c+1]) + g[c+2]) + …` (float addition is commutative,
//! so `dst += src` on the receiving side gives the same bits):
//! [`serial_sum`] computes exactly that, serially, and is what the host
//! aggregation of [`Update::Host`](super::Update::Host) uses, so both update
//! modes give the same bits.
//!
//! Nothing here knows a gradient: [`AllReduce`](super::AllReduce) packs a
//! bucket's gradients into each device's chunks before and unpacks them
//! after.

use std::sync::Arc;

use crate::dep::{Device, Var, VarKey};
use crate::engine::Engine;
use crate::error::Error;

/// The elements of chunk `c` of a buffer of `len` elements cut into `n`
/// chunks: `c * len / n .. (c + 1) * len / n` (chunks differ in length by
/// one at most; with `len < n` some are empty).
///
/// # Errors
///
/// [`Error::Parallel`] for no chunks (`n == 0`) or a chunk `c` that is not
/// one of them (`c >= n`).
///
/// ```
/// use depflow::parallel::chunk_range;
///
/// assert_eq!(chunk_range(10, 3, 0)?, 0..3);
/// assert_eq!(chunk_range(10, 3, 2)?, 6..10);
/// assert_eq!(chunk_range(2, 4, 1)?, 0..1); // some chunks are empty
/// assert!(chunk_range(10, 0, 0).is_err()); // no chunks
/// assert!(chunk_range(10, 3, 3).is_err()); // chunks 0, 1 and 2 only
/// # Ok::<(), depflow::Error>(())
/// ```
pub fn chunk_range(len: usize, n: usize, c: usize) -> Result<std::ops::Range<usize>, Error> {
    if c >= n {
        return Err(Error::Parallel(format!(
            "chunk {c} of a buffer cut into {n} chunk(s): chunks are 0..{n}"
        )));
    }
    Ok(chunk(len, n, c))
}

/// [`chunk_range`] for `c < n` (the ring's own, checked by construction).
/// In `u128`: `(c + 1) * len` may pass `usize::MAX`.
pub(super) fn chunk(len: usize, n: usize, c: usize) -> std::ops::Range<usize> {
    let at = |c: usize| (c as u128 * len as u128 / n as u128) as usize;
    at(c)..at(c + 1)
}

/// The element-wise sum of `buffers` (one per device, in device order, of
/// equal lengths) in the ring's order: chunk `c` folds from device `c`
/// around the ring. What the ring all-reduce leaves on every device, bit
/// for bit.
///
/// Which buffer: a [`Group`](super::Group) sums a *bucket* as one, each
/// device's gradients of its parameters concatenated in parameter order.
/// Its sums are `serial_sum` of those concatenations; `serial_sum` of one
/// parameter's gradients alone matches them only where that parameter is a
/// bucket of its own (as with
/// [`bucket_bytes(0)`](super::GroupBuilder::bucket_bytes), whose docs show
/// both), or where the sums are exact: the chunks, and so where each fold
/// starts, depend on the whole buffer.
///
/// # Panics
///
/// If the buffers differ in length (the group checks its buffers first).
///
/// ```
/// use depflow::parallel::serial_sum;
///
/// let sum = serial_sum(&[&[1.0, 2.0, 3.0], &[10.0, 20.0, 30.0]]);
/// assert_eq!(sum, [11.0, 22.0, 33.0]);
/// ```
pub fn serial_sum(buffers: &[&[f32]]) -> Vec<f32> {
    let mut out = vec![0.0; buffers.first().map_or(0, |b| b.len())];
    serial_sum_into(buffers, &mut out);
    out
}

/// [`serial_sum`] into `out` (no allocation).
pub(super) fn serial_sum_into<B: AsRef<[f32]>>(buffers: &[B], out: &mut [f32]) {
    let n = buffers.len();
    for b in buffers {
        assert_eq!(b.as_ref().len(), out.len(), "buffers of different lengths");
    }
    for c in 0..n {
        let range = chunk(out.len(), n, c);
        let out = &mut out[range.clone()];
        out.copy_from_slice(&buffers[c].as_ref()[range.clone()]);
        for k in 1..n {
            let src = &buffers[(c + k) % n].as_ref()[range.clone()];
            for (o, s) in out.iter_mut().zip(src) {
                *o += *s;
            }
        }
    }
}

/// One bucket's ring: each device's chunk variables, and the devices the
/// ring's ops run on.
#[derive(Debug)]
pub(super) struct Ring {
    /// `chunks[d][c]`: device `d`'s copy of chunk `c`.
    pub(super) chunks: Vec<Vec<Var<Vec<f32>>>>,
    /// Their keys, per device (what the pack and unpack ops capture).
    pub(super) keys: Vec<Arc<[VarKey<Vec<f32>>]>>,
    /// Where device `d`'s reduction ops run (its compute device, or the
    /// communication device the group was given for it).
    pub(super) comm: Vec<Device>,
}

impl Ring {
    /// Chunk variables for a buffer of `len` floats on each of `comm.len()`
    /// devices, allocated once (a step allocates nothing).
    pub(super) fn new(engine: &Engine, comm: Vec<Device>, len: usize) -> Self {
        let n = comm.len();
        let chunks: Vec<Vec<Var<Vec<f32>>>> = (0..n)
            .map(|_| {
                (0..n)
                    .map(|c| engine.var(vec![0.0; chunk(len, n, c).len()]))
                    .collect()
            })
            .collect();
        let keys = chunks
            .iter()
            .map(|cs| cs.iter().map(|c| c.key()).collect())
            .collect();
        Self { chunks, keys, comm }
    }

    /// The device that holds the whole (local) sum of chunk `c` once the
    /// reduce-scatter has run: device `(c + n - 1) mod n`, where the
    /// all-gather starts from.
    #[cfg(feature = "mpi")]
    pub(super) fn owner(&self, c: usize) -> usize {
        let n = self.comm.len();
        (c + n - 1) % n
    }

    /// Pushes one phase of an all-reduce of the chunks (which each device's
    /// pack op wrote), at `priority`: the reduce-scatter's `n (n - 1)` ops,
    /// or (`gather`) the all-gather's, each finished chunk from its
    /// [`owner`](Self::owner). The two phases together are the ring's
    /// `2 n (n - 1)` ops.
    pub(super) fn push_phase(
        &self,
        engine: &Engine,
        priority: i32,
        gather: bool,
    ) -> Result<(), Error> {
        let n = self.comm.len();
        let name = if gather {
            "allreduce gather"
        } else {
            "allreduce reduce"
        };
        for s in 0..n.saturating_sub(1) {
            for d in 0..n {
                let to = (d + 1) % n;
                let c = if gather {
                    (d + 1 + n - s) % n
                } else {
                    (d + n - s) % n
                };
                let (src, dst) = (&self.chunks[d][c], &self.chunks[to][c]);
                let (sk, dk) = (src.key(), dst.key());
                engine
                    .op()
                    .name(name)
                    .priority(priority)
                    .on(self.comm[to])
                    .reads(&[src])
                    .mutates(&[dst])
                    .run(move |ctx| {
                        let src = ctx.read(sk)?;
                        let mut dst = ctx.write(dk)?;
                        if gather {
                            dst.copy_from_slice(&src);
                        } else {
                            for (o, s) in dst.iter_mut().zip(src.iter()) {
                                *o += *s;
                            }
                        }
                        Ok(())
                    })?;
            }
        }
        Ok(())
    }
}
