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
mod tests;
