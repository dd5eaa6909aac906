//! The memory planner: where each of a recording's buffers lives in one
//! shared arena, so that buffers never live at once share memory.
//!
//! Greedy by size with best fit, as TFLite's `GreedyBySize` and ONNX
//! Runtime's planner: buffers by size, largest first (ties by index); each
//! goes in the smallest gap, at its alignment, between the already placed
//! buffers it conflicts with (from offset 0), else after the highest of
//! them.
//!
//! Cost: a buffer is tested only against the placed buffers whose
//! *horizons* overlap its own. A buffer's horizon is `[first use, settled)`,
//! where from node `settled` on every node happens after all its uses
//! ([`horizons_sequential`]: its last use + 1; [`horizons_parallel`]: from
//! the happens-before relation), so buffers with disjoint horizons never
//! conflict. Placed buffers are indexed by horizon in blocks of
//! [`BLOCK`] nodes, so that for B buffers the planner makes O(B·k) conflict
//! tests (k: how many horizons overlap one) and sorts as many, in O(B)
//! memory: O(B log B) on a chain, O(B²) where every horizon spans the
//! graph (a wide graph past `Reach::MAX_NODES`, which has no barriers).
//! Past [`MAX_TESTS`] conflict tests the remaining buffers are placed
//! without sharing (above every placed buffer), which bounds the time.
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

/// Horizons under [`conflicts_sequential`]: `[first use, last use + 1)`.
pub(crate) fn horizons_sequential(buffers: &[Buffer]) -> Vec<Option<(u32, u32)>> {
    spans(buffers)
        .into_iter()
        .map(|s| s.map(|(first, last)| (first, last.saturating_add(1))))
        .collect()
}

/// Horizons under [`conflicts_parallel`]: from the first use to the node
/// from which every node happens after all the uses
/// ([`HappensBefore::settled`]).
pub(crate) fn horizons_parallel(
    before: &HappensBefore,
    buffers: &[Buffer],
) -> Vec<Option<(u32, u32)>> {
    buffers
        .iter()
        .map(|b| Some((*b.uses.iter().min()?, before.settled(&b.uses))))
        .collect()
}

/// The horizon index's block, in nodes: a horizon spanning at most
/// [`SPAN_BLOCKS`] blocks is listed in each, a longer one in a list that
/// every query scans.
pub(crate) const BLOCK: u32 = 64;
const SPAN_BLOCKS: u32 = 16;
/// The most conflict tests before the rest is placed without sharing.
pub(crate) const MAX_TESTS: u64 = 1 << 28;

/// Places `buffers` so that no two of them that `conflicts` overlap (see
/// the module doc). `conflicts` must be symmetric; it is asked only about
/// buffers with uses whose `horizons` overlap. Two buffers whose horizons
/// do not overlap must not conflict.
pub(crate) fn plan(
    buffers: &[Buffer],
    conflicts: impl Fn(usize, usize) -> bool,
    horizons: &[Option<(u32, u32)>],
) -> Plan {
    plan_bounded(buffers, conflicts, horizons, MAX_TESTS)
}

/// [`plan`] with the bound on conflict tests given.
pub(crate) fn plan_bounded(
    buffers: &[Buffer],
    conflicts: impl Fn(usize, usize) -> bool,
    horizons: &[Option<(u32, u32)>],
    max_tests: u64,
) -> Plan {
    let end = |i: usize, offsets: &[usize]| offsets[i].saturating_add(buffers[i].bytes);
    let mut order: Vec<usize> = (0..buffers.len())
        .filter(|&i| !buffers[i].uses.is_empty())
        .collect();
    order.sort_by(|&a, &b| buffers[b].bytes.cmp(&buffers[a].bytes).then(a.cmp(&b)));
    let mut offsets = vec![0; buffers.len()];
    let mut index = HorizonIndex::new(horizons);
    // Per buffer, when it was placed (ties of offset keep that order) and
    // the last query that saw it (so a query takes it once).
    let (mut placed_at, mut seen) = (vec![0u32; buffers.len()], vec![u32::MAX; buffers.len()]);
    let (mut tests, mut top) = (0u64, 0usize);
    let mut candidates: Vec<usize> = Vec::new();
    for (n, &i) in order.iter().enumerate() {
        let (bytes, align) = (buffers[i].bytes, buffers[i].align.max(1));
        let up = |at: usize| at.checked_next_multiple_of(align).unwrap_or(usize::MAX);
        if tests > max_tests {
            // Out of budget: above everything, sharing nothing.
            offsets[i] = up(top);
            top = top.max(end(i, &offsets));
            continue;
        }
        candidates.clear();
        index.overlapping(i, |j| {
            if std::mem::replace(&mut seen[j], i as u32) != i as u32 {
                candidates.push(j);
            }
        });
        tests += candidates.len() as u64;
        candidates.retain(|&j| conflicts(i, j));
        candidates.sort_unstable_by_key(|&j| (offsets[j], placed_at[j]));
        let mut prior_end = 0;
        // (gap, offset) of the smallest gap that fits so far.
        let mut best: Option<(usize, usize)> = None;
        for &j in &candidates {
            let start = up(prior_end);
            let fits = offsets[j] >= start && offsets[j] - start >= bytes;
            let gap = offsets[j].saturating_sub(prior_end);
            if fits && best.is_none_or(|(g, _)| gap < g) {
                best = Some((gap, start));
            }
            prior_end = prior_end.max(end(j, &offsets));
        }
        offsets[i] = best.map_or_else(|| up(prior_end), |(_, at)| at);
        top = top.max(end(i, &offsets));
        placed_at[i] = n as u32;
        index.insert(i);
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

/// The placed buffers by horizon: block `b` lists those whose horizon
/// meets nodes `[b·BLOCK, (b+1)·BLOCK)` and spans at most `SPAN_BLOCKS`
/// blocks; `long` lists the others.
struct HorizonIndex<'h> {
    horizons: &'h [Option<(u32, u32)>],
    blocks: Vec<Vec<u32>>,
    long: Vec<u32>,
}

impl<'h> HorizonIndex<'h> {
    fn new(horizons: &'h [Option<(u32, u32)>]) -> Self {
        let end = horizons.iter().flatten().map(|h| h.1).max().unwrap_or(0);
        Self {
            horizons,
            blocks: vec![Vec::new(); end.div_ceil(BLOCK) as usize + 1],
            long: Vec::new(),
        }
    }

    /// The blocks `[first, last]` that horizon `[start, settled)` meets.
    fn blocks_of((start, settled): (u32, u32)) -> (u32, u32) {
        (start / BLOCK, settled.saturating_sub(1).max(start) / BLOCK)
    }

    fn insert(&mut self, i: usize) {
        let Some(h) = self.horizons[i] else { return };
        let (first, last) = Self::blocks_of(h);
        if last - first < SPAN_BLOCKS {
            for b in first..=last {
                self.blocks[b as usize].push(i as u32);
            }
        } else {
            self.long.push(i as u32);
        }
    }

    /// Calls `f` with every placed buffer whose horizon overlaps `i`'s
    /// (some more than once, and some whose horizons only share a block).
    fn overlapping(&self, i: usize, mut f: impl FnMut(usize)) {
        let Some(h) = self.horizons[i] else { return };
        let (first, last) = Self::blocks_of(h);
        if last - first < SPAN_BLOCKS {
            for b in first..=last {
                self.blocks[b as usize].iter().for_each(|&j| f(j as usize));
            }
        } else {
            self.blocks.iter().flatten().for_each(|&j| f(j as usize));
        }
        self.long.iter().for_each(|&j| f(j as usize));
    }
}

#[cfg(test)]
mod tests;
