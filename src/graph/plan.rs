//! The memory planner: where each of a recording's buffers lives in one
//! shared arena, so that buffers never live at once share memory.
//!
//! Greedy by size with best fit, as TFLite's `GreedyBySize` and ONNX
//! Runtime's planner: buffers by size, largest first (ties by index); each
//! goes in the smallest gap, at its alignment, between the already placed
//! buffers it conflicts with (from offset 0), else after the highest of
//! them. O(B²) conflict tests for B buffers and O(B) memory besides.
//!
//! Invariants of a [`Plan`]: two buffers that conflict never overlap
//! (`[offset, offset + bytes)`); every offset is a multiple of its
//! buffer's alignment; `arena_bytes` covers every buffer. A buffer with no
//! uses is at offset 0 and conflicts with nothing. Sizes are assumed to
//! sum within `usize` (arithmetic saturates rather than panics).
//!
//! The conflict relations: [`conflicts_sequential`] (the recorded order
//! runs: intervals `[first use, last use]` overlap) and
//! [`conflicts_parallel`] (the DAG runs: neither buffer's uses all happen
//! before the other's). Overlapping intervals conflict in both, so the
//! parallel relation contains the sequential one.

// Wired into the runtime by the recording (issue 13); until then only tests use it.
#![allow(dead_code)]

use super::dag::HappensBefore;

/// A buffer to place: its size, its alignment (a power of two; 0 counts as
/// 1) and the nodes that use it, ascending.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Buffer {
    pub(crate) bytes: usize,
    pub(crate) align: usize,
    pub(crate) uses: Vec<u32>,
}

/// Where each buffer lives, and what that costs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Plan {
    /// Per buffer, its offset in the arena.
    pub(crate) offsets: Vec<usize>,
    /// The arena's size: the highest end of a buffer.
    pub(crate) arena_bytes: usize,
    /// What the buffers would take without sharing.
    pub(crate) total_bytes: usize,
    /// A lower bound on any arena: the most bytes of buffers whose
    /// intervals `[first use, last use]` hold one node. Those conflict
    /// pairwise in either order (a buffer all of whose uses come before
    /// another's cannot end after that one starts), so no plan under
    /// [`conflicts_sequential`] or [`conflicts_parallel`] fits them in
    /// less; under the sequential one it is the optimum before alignment
    /// (the interval graph's heaviest clique), under the parallel one it
    /// misses conflicts between branches.
    pub(crate) peak_live_bytes: usize,
}

/// `[first use, last use]` of each buffer, `None` without uses.
fn spans(buffers: &[Buffer]) -> Vec<Option<(u32, u32)>> {
    buffers
        .iter()
        .map(|b| Some((*b.uses.iter().min()?, *b.uses.iter().max()?)))
        .collect()
}

/// Conflicts when the recorded order runs: the buffers' intervals overlap.
pub(crate) fn conflicts_sequential(buffers: &[Buffer]) -> impl Fn(usize, usize) -> bool {
    let spans = spans(buffers);
    move |a, b| match (spans[a], spans[b]) {
        (Some((fa, la)), Some((fb, lb))) => a != b && fa <= lb && fb <= la,
        _ => false,
    }
}

/// Conflicts when the DAG runs: neither buffer's uses all happen before the
/// other's (a node using both conflicts). Each test costs
/// O(uses(a)·uses(b)) with [`Reach`](super::dag::Reach), O(1) past it.
pub(crate) fn conflicts_parallel<'a>(
    before: &'a HappensBefore,
    buffers: &'a [Buffer],
) -> impl Fn(usize, usize) -> bool + 'a {
    let spans = spans(buffers);
    move |a, b| {
        let (Some((fa, la)), Some((fb, lb))) = (spans[a], spans[b]) else {
            return false;
        };
        // Overlapping intervals are never ordered: skip the full test.
        let (ua, ub) = (&buffers[a].uses, &buffers[b].uses);
        a != b
            && (fa <= lb && fb <= la
                || !(la < fb && before.ordered(ua, ub) || lb < fa && before.ordered(ub, ua)))
    }
}

/// Places `buffers` so that no two of them that `conflicts` overlap (see
/// the module doc). `conflicts` must be symmetric; it is asked only about
/// buffers with uses.
pub(crate) fn plan(buffers: &[Buffer], conflicts: impl Fn(usize, usize) -> bool) -> Plan {
    let end = |i: usize, offsets: &[usize]| offsets[i].saturating_add(buffers[i].bytes);
    let mut order: Vec<usize> = (0..buffers.len())
        .filter(|&i| !buffers[i].uses.is_empty())
        .collect();
    order.sort_by(|&a, &b| buffers[b].bytes.cmp(&buffers[a].bytes).then(a.cmp(&b)));
    let mut offsets = vec![0; buffers.len()];
    // The buffers placed so far, by offset.
    let mut placed: Vec<usize> = Vec::with_capacity(order.len());
    for &i in &order {
        let (bytes, align) = (buffers[i].bytes, buffers[i].align.max(1));
        let up = |at: usize| at.checked_next_multiple_of(align).unwrap_or(usize::MAX);
        let mut prior_end = 0;
        // (gap, offset) of the smallest gap that fits so far.
        let mut best: Option<(usize, usize)> = None;
        for &j in &placed {
            if !conflicts(i, j) {
                continue;
            }
            let start = up(prior_end);
            let fits = offsets[j] >= start && offsets[j] - start >= bytes;
            let gap = offsets[j].saturating_sub(prior_end);
            if fits && best.is_none_or(|(g, _)| gap < g) {
                best = Some((gap, start));
            }
            prior_end = prior_end.max(end(j, &offsets));
        }
        offsets[i] = best.map_or_else(|| up(prior_end), |(_, at)| at);
        let at = placed.partition_point(|&j| offsets[j] <= offsets[i]);
        placed.insert(at, i);
    }
    let spans = spans(buffers);
    let mut events: Vec<(u32, bool, usize)> = Vec::with_capacity(2 * buffers.len());
    for (b, span) in buffers.iter().zip(&spans) {
        if let Some((first, last)) = *span {
            // At one node, ends (`false`, past the last use) sort first.
            events.push((first, true, b.bytes));
            events.push((last.saturating_add(1), false, b.bytes));
        }
    }
    events.sort_unstable();
    let (mut live, mut peak) = (0usize, 0usize);
    for (_, starts, bytes) in events {
        if starts {
            live = live.saturating_add(bytes);
            peak = peak.max(live);
        } else {
            live = live.saturating_sub(bytes);
        }
    }
    Plan {
        arena_bytes: (0..buffers.len())
            .map(|i| end(i, &offsets))
            .max()
            .unwrap_or(0),
        total_bytes: buffers.iter().fold(0, |t, b| t.saturating_add(b.bytes)),
        peak_live_bytes: peak,
        offsets,
    }
}

#[cfg(test)]
mod tests {
    use super::super::dag::testing::{Rng, recording};
    use super::super::dag::{Access, Barriers, Dag, HappensBefore, Reach};
    use super::*;

    fn buf(bytes: usize, uses: &[u32]) -> Buffer {
        Buffer {
            bytes,
            align: 1,
            uses: uses.to_vec(),
        }
    }
    fn dag(nodes: &[Vec<Access>]) -> Dag {
        Dag::build(&nodes.iter().map(Vec::as_slice).collect::<Vec<_>>(), false)
    }
    fn overlap(bs: &[Buffer], p: &Plan, a: usize, b: usize) -> bool {
        let (oa, ob) = (p.offsets[a], p.offsets[b]);
        bs[a].bytes > 0 && bs[b].bytes > 0 && oa < ob + bs[b].bytes && ob < oa + bs[a].bytes
    }

    /// The plan's invariants (the module doc), under `conflicts`.
    fn check(bs: &[Buffer], p: &Plan, conflicts: &impl Fn(usize, usize) -> bool) {
        for (i, b) in bs.iter().enumerate() {
            assert_eq!(p.offsets[i] % b.align.max(1), 0, "buffer {i} misaligned");
            assert!(p.offsets[i] + b.bytes <= p.arena_bytes);
            assert!(!b.uses.is_empty() || p.offsets[i] == 0);
            for j in 0..i {
                assert!(
                    !(conflicts(i, j) && overlap(bs, p, i, j)),
                    "{i} and {j} conflict yet overlap: {p:?}"
                );
            }
        }
        assert_eq!(p.total_bytes, bs.iter().map(|b| b.bytes).sum::<usize>());
        assert!(p.peak_live_bytes <= p.arena_bytes);
    }

    /// The optimum arena: the best of first fit (each buffer at the lowest
    /// aligned offset clear of the conflicting placed ones) over every
    /// placement order. Placing in the order of an optimal plan's offsets
    /// puts each buffer no higher than there, so this is exact.
    fn optimum(bs: &[Buffer], conflicts: &impl Fn(usize, usize) -> bool) -> usize {
        fn go(
            bs: &[Buffer],
            c: &impl Fn(usize, usize) -> bool,
            off: &mut Vec<Option<usize>>,
            best: &mut usize,
        ) {
            let top = (0..bs.len())
                .filter_map(|i| Some(off[i]? + bs[i].bytes))
                .max()
                .unwrap_or(0);
            if top >= *best {
                return;
            }
            let Some(_) = off.iter().position(Option::is_none) else {
                *best = top;
                return;
            };
            for i in 0..bs.len() {
                if off[i].is_some() {
                    continue;
                }
                let clash = |at: usize| {
                    (0..bs.len()).any(|j| {
                        off[j].is_some_and(|o| {
                            c(i, j)
                                && bs[i].bytes > 0
                                && bs[j].bytes > 0
                                && at < o + bs[j].bytes
                                && o < at + bs[i].bytes
                        })
                    })
                };
                let ends = (0..bs.len()).filter_map(|j| Some(off[j]? + bs[j].bytes));
                let at = std::iter::once(0)
                    .chain(ends)
                    .map(|e| e.next_multiple_of(bs[i].align))
                    .filter(|&at| !clash(at))
                    .min()
                    .unwrap();
                off[i] = Some(at);
                go(bs, c, off, best);
                off[i] = None;
            }
        }
        let mut best = usize::MAX;
        go(bs, conflicts, &mut vec![None; bs.len()], &mut best);
        best
    }

    /// Op `i` reads `b_i` and writes `b_{i+1}`; the buffers, and the DAG.
    fn chain(sizes: &[usize]) -> (Vec<Buffer>, Dag) {
        let k = sizes.len() as u32;
        let bs = (0..k).map(|i| {
            buf(
                sizes[i as usize],
                &(i.saturating_sub(1)..i.min(k - 2) + 1).collect::<Vec<_>>(),
            )
        });
        let ops: Vec<_> = (0..k - 1)
            .map(|i| {
                vec![
                    Access {
                        var: i,
                        write: false,
                    },
                    Access {
                        var: i + 1,
                        write: true,
                    },
                ]
            })
            .collect();
        (bs.collect(), dag(&ops))
    }

    #[test]
    fn chains_take_the_largest_adjacent_pair() {
        let patterns: [&[usize]; 7] = [
            &[4, 4, 4, 4, 4, 4],
            &[1, 2, 3, 4, 5, 6, 7, 8],
            &[8, 7, 6, 5, 4, 3, 2, 1],
            &[10, 1, 10, 1, 10, 1],
            &[1, 10, 1, 10, 1, 10, 1],
            &[1, 3, 5, 7, 5, 3, 1],
            &[9, 5, 2, 1, 2, 5, 9],
        ];
        for sizes in patterns {
            let (bs, dag) = chain(sizes);
            let pair = sizes.windows(2).map(|w| w[0] + w[1]).max().unwrap();
            let before = HappensBefore::of(&dag);
            let parallel = plan(&bs, conflicts_parallel(&before, &bs));
            let sequential = plan(&bs, conflicts_sequential(&bs));
            check(&bs, &parallel, &conflicts_parallel(&before, &bs));
            assert_eq!(
                (parallel.arena_bytes, sequential.arena_bytes),
                (pair, pair),
                "{sizes:?}"
            );
            assert_eq!(parallel.peak_live_bytes, pair);
        }
    }

    #[test]
    fn greedy_by_size_misses_on_some_chains() {
        // Both 6s go at 0, the 5 above the first (6..11), and the 1, between
        // the 5 and the second 6, finds no gap: 12. Best: 1 at 0, 6 at 1.
        let (bs, _) = chain(&[6, 5, 1, 6]);
        let c = conflicts_sequential(&bs);
        assert_eq!((plan(&bs, &c).arena_bytes, optimum(&bs, &c)), (12, 11));
    }

    #[test]
    fn known_dags() {
        let (r, w) = (
            |var| Access { var, write: false },
            |var| Access { var, write: true },
        );
        // Diamond 0 → {1, 2} → 3 over a → {b, c} → d: a, b and c are live
        // together at 2; d may take a's place.
        let d = dag(&[
            vec![w(0)],
            vec![r(0), w(1)],
            vec![r(0), w(2)],
            vec![r(1), r(2), w(3)],
        ]);
        let bs = [
            buf(10, &[0, 1, 2]),
            buf(10, &[1, 3]),
            buf(10, &[2, 3]),
            buf(10, &[3]),
        ];
        let before = HappensBefore::of(&d);
        let p = plan(&bs, conflicts_parallel(&before, &bs));
        check(&bs, &p, &conflicts_parallel(&before, &bs));
        assert_eq!(
            (p.arena_bytes, p.offsets[3], p.peak_live_bytes),
            (30, p.offsets[0], 30)
        );
        // Fanout: 0 writes a, 1..=3 read it into o1..o3, 4 reads those.
        let d = dag(&[
            vec![w(0)],
            vec![r(0), w(1)],
            vec![r(0), w(2)],
            vec![r(0), w(3)],
            vec![r(1), r(2), r(3)],
        ]);
        let bs = [
            buf(8, &[0, 1, 2, 3]),
            buf(4, &[1, 4]),
            buf(2, &[2, 4]),
            buf(1, &[3, 4]),
        ];
        let before = HappensBefore::of(&d);
        assert_eq!(plan(&bs, conflicts_parallel(&before, &bs)).arena_bytes, 15);
    }

    #[test]
    fn independent_branches_share_in_order_but_not_in_parallel() {
        // 0 writes x then reads it; 1 and 2 do the same with y: in recorded
        // order y may take x's memory, but the DAG may run 0..3 at once.
        let (r, w) = (
            |var| Access { var, write: false },
            |var| Access { var, write: true },
        );
        let d = dag(&[vec![w(0)], vec![r(0)], vec![w(1)], vec![r(1)]]);
        let bs = [buf(16, &[0, 1]), buf(16, &[2, 3])];
        let before = HappensBefore::of(&d);
        assert!(!conflicts_sequential(&bs)(0, 1) && conflicts_parallel(&before, &bs)(0, 1));
        assert_eq!(plan(&bs, conflicts_sequential(&bs)).arena_bytes, 16);
        assert_eq!(plan(&bs, conflicts_parallel(&before, &bs)).arena_bytes, 32);
    }

    #[test]
    fn unused_and_empty_buffers() {
        let bs = [
            buf(5, &[]),
            Buffer {
                bytes: 0,
                align: 64,
                uses: vec![0],
            },
            Buffer {
                bytes: 3,
                align: 4,
                uses: vec![0],
            },
        ];
        let c = conflicts_sequential(&bs);
        let p = plan(&bs, &c);
        check(&bs, &p, &c);
        assert_eq!(
            (
                p.offsets[0],
                p.arena_bytes,
                p.total_bytes,
                p.peak_live_bytes
            ),
            (0, 5, 8, 3)
        );
        assert!(!c(0, 2) && !c(2, 0) && c(1, 2));
    }
}
