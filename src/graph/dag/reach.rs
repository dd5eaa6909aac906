//! Happens-before between a recording's nodes, over the DAG's data edges
//! (never its sequential schedule): exactly with [`Reach`], an n × n bitset
//! (n²/8 bytes), up to [`Reach::MAX_NODES`]; past it with [`Barriers`],
//! O(n), which never claims an order that is not there but misses some.
//! [`HappensBefore`] picks one of them for the planner.

use super::Dag;

/// Happens-before over the data edges, exactly: row `b` is the set of
/// ancestors of `b`, one bit per node. Costs n·⌈n/64⌉·8 ≈ n²/8 bytes (32 MiB
/// at [`Reach::MAX_NODES`], 1.25 GB at 100 000 nodes) and
/// O(n/64 · edges) time; past `MAX_NODES` use [`HappensBefore::of`].
#[derive(Debug, Clone)]
pub(crate) struct Reach {
    n: usize,
    words: usize,
    ancestors: Vec<u64>,
    /// Per node `u`: the least `s > u` such that every node from `s` on
    /// happens after `u`.
    settled: Vec<u32>,
}

impl Reach {
    /// The most nodes [`HappensBefore::of`] builds a `Reach` for.
    pub(crate) const MAX_NODES: usize = 16384;

    /// The reachability of `dag`'s data edges (whatever its schedule),
    /// filled in recorded order: a node's ancestors are its predecessors'
    /// and the predecessors themselves, all earlier.
    pub(crate) fn of(dag: &Dag) -> Reach {
        let n = dag.len();
        let words = n.div_ceil(64);
        let mut ancestors = vec![0u64; n * words];
        for b in 0..n {
            let (done, rest) = ancestors.split_at_mut(b * words);
            let row = &mut rest[..words];
            for &p in dag.data_preds(b as u32) {
                let p = p as usize;
                for (w, a) in row.iter_mut().zip(&done[p * words..(p + 1) * words]) {
                    *w |= a;
                }
                row[p / 64] |= 1 << (p % 64);
            }
        }
        // Latest first: the first node found that `u` does not reach sets
        // `u`'s `settled`; `open` holds the nodes not yet settled so.
        let mut settled: Vec<u32> = (1..=n as u32).collect();
        let mut open = vec![u64::MAX; words];
        for x in (1..n).rev() {
            let row = &ancestors[x * words..(x + 1) * words];
            for w in 0..x.div_ceil(64) {
                let below_x = if (w + 1) * 64 <= x {
                    u64::MAX
                } else {
                    (1 << (x % 64)) - 1
                };
                let mut missed = open[w] & !row[w] & below_x;
                open[w] &= !missed;
                while missed != 0 {
                    settled[w * 64 + missed.trailing_zeros() as usize] = x as u32 + 1;
                    missed &= missed - 1;
                }
            }
        }
        Reach {
            n,
            words,
            ancestors,
            settled,
        }
    }

    /// The least node `s` past every use such that every node from `s` on
    /// happens after all `uses`.
    pub(crate) fn settled(&self, uses: &[u32]) -> u32 {
        uses.iter()
            .map(|&u| self.settled[u as usize])
            .max()
            .unwrap_or(0)
    }

    /// Whether `a` happens before `b`: `a ≠ b` and a path `a → b`.
    pub(crate) fn before(&self, a: u32, b: u32) -> bool {
        let (a, b) = (a as usize, b as usize);
        a < self.n && b < self.n && self.ancestors[b * self.words + a / 64] & (1 << (a % 64)) != 0
    }

    /// Whether every use in `a_uses` happens before every use in `b_uses`.
    pub(crate) fn ordered(&self, a_uses: &[u32], b_uses: &[u32]) -> bool {
        b_uses
            .iter()
            .all(|&b| a_uses.iter().all(|&a| self.before(a, b)))
    }
}

/// The O(n) fallback: *barriers*, nodes that every earlier node happens
/// before and that happen before every later node. Uses all at or before a
/// barrier happen before uses all at or after it (unless one node holds
/// both), so [`Barriers::ordered`] implies [`Reach::ordered`]; it misses
/// orders not through a barrier (between branches, say), which only costs
/// memory sharing.
#[derive(Debug, Clone)]
pub(crate) struct Barriers {
    /// `before[i]`: the number of barriers among nodes `0..i`.
    before: Vec<u32>,
    /// `next[i]`: the first barrier at or after node `i` (`n` if none).
    next: Vec<u32>,
}

impl Barriers {
    /// Finds the barriers in O(n + edges): every earlier node reaches `i` iff
    /// every node of `0..i` with no successor in `0..i` is a direct
    /// predecessor of `i` (a path from it to `i` has no earlier node to go
    /// through); the same, mirrored, for the later ones.
    pub(crate) fn of(dag: &Dag) -> Barriers {
        let n = dag.len();
        let (succ_start, succ) = dag.data_successors();
        let succs = |i: usize| &succ[succ_start[i] as usize..succ_start[i + 1] as usize];
        let mut barrier = vec![false; n];
        let (mut open, mut frontier) = (0, vec![false; n]);
        for i in 0..n {
            let preds = dag.data_preds(i as u32);
            barrier[i] = preds.iter().filter(|&&p| frontier[p as usize]).count() == open;
            for &p in preds {
                open -= usize::from(std::mem::take(&mut frontier[p as usize]));
            }
            frontier[i] = true;
            open += 1;
        }
        let (mut open, mut frontier) = (0, vec![false; n]);
        for i in (0..n).rev() {
            barrier[i] &= succs(i).iter().filter(|&&s| frontier[s as usize]).count() == open;
            for &s in succs(i) {
                open -= usize::from(std::mem::take(&mut frontier[s as usize]));
            }
            frontier[i] = true;
            open += 1;
        }
        let mut before = Vec::with_capacity(n + 1);
        before.push(0);
        for (i, &b) in barrier.iter().enumerate() {
            before.push(before[i] + u32::from(b));
        }
        let mut next = vec![n as u32; n];
        for i in (0..n).rev() {
            next[i] = if barrier[i] {
                i as u32
            } else {
                next.get(i + 1).copied().unwrap_or(n as u32)
            };
        }
        Barriers { before, next }
    }

    /// The first node from which a barrier orders every node after all
    /// `uses` ([`Barriers::ordered`]): past the last use, the first barrier
    /// at or after it (past it, if the last use is one); the graph's end if
    /// there is none.
    pub(crate) fn settled(&self, uses: &[u32]) -> u32 {
        let Some(&last) = uses.iter().max() else {
            return 0;
        };
        match self.next.get(last as usize) {
            Some(&b) if b == last => last + 1,
            Some(&b) => b,
            None => last + 1,
        }
    }

    /// Whether a barrier separates the uses: the last of `a_uses` comes
    /// before the first of `b_uses`, with a barrier in between (inclusive).
    pub(crate) fn ordered(&self, a_uses: &[u32], b_uses: &[u32]) -> bool {
        let (Some(&last), Some(&first)) = (a_uses.iter().max(), b_uses.iter().min()) else {
            return true;
        };
        let (last, first) = (last as usize, first as usize);
        last < first && first + 1 < self.before.len() && self.before[first + 1] > self.before[last]
    }
}

/// What the planner knows of happens-before: [`Reach`] up to
/// [`Reach::MAX_NODES`], [`Barriers`] past it.
#[derive(Debug, Clone)]
pub(crate) enum HappensBefore {
    Reach(Reach),
    Barriers(Barriers),
}

impl HappensBefore {
    /// The exact relation where affordable, else the safe fallback.
    pub(crate) fn of(dag: &Dag) -> HappensBefore {
        if dag.len() <= Reach::MAX_NODES {
            HappensBefore::Reach(Reach::of(dag))
        } else {
            HappensBefore::Barriers(Barriers::of(dag))
        }
    }

    /// Whether every use in `a_uses` happens before every use in `b_uses`
    /// (never true when it does not; with `Barriers`, maybe false when it does).
    pub(crate) fn ordered(&self, a_uses: &[u32], b_uses: &[u32]) -> bool {
        match self {
            HappensBefore::Reach(r) => r.ordered(a_uses, b_uses),
            HappensBefore::Barriers(b) => b.ordered(a_uses, b_uses),
        }
    }

    /// The least node past every one of `uses` from which every node
    /// happens after all of them as [`ordered`](Self::ordered) sees it: two
    /// sets of uses each before the other's `settled` are never ordered
    /// either way, and one whose `settled` is at or before every use of the
    /// other is ordered before it.
    pub(crate) fn settled(&self, uses: &[u32]) -> u32 {
        match self {
            HappensBefore::Reach(r) => r.settled(uses),
            HappensBefore::Barriers(b) => b.settled(uses),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{Rng, build, r, recording, w};
    use super::*;

    #[test]
    fn reach_and_barriers_agree_with_a_search() {
        let mut rng = Rng(7);
        for case in 0..200 {
            let n = rng.below(70);
            let vars = 1 + rng.below(10);
            let dag = build(&recording(&mut rng, n, vars), case % 2 == 0);
            let reach = Reach::of(&dag);
            let barriers = Barriers::of(&dag);
            for a in 0..n {
                // Everything a reaches, by search over the data edges.
                let mut seen = vec![false; n];
                let mut stack = vec![a as u32];
                while let Some(x) = stack.pop() {
                    for e in dag.edges.iter().filter(|e| e.from == x) {
                        if !std::mem::replace(&mut seen[e.to as usize], true) {
                            stack.push(e.to);
                        }
                    }
                }
                for (b, &seen) in seen.iter().enumerate() {
                    assert_eq!(
                        reach.before(a as u32, b as u32),
                        seen,
                        "case {case}: {a} → {b}"
                    );
                }
            }
            for _ in 0..50 {
                let mut uses = || {
                    (0..1 + rng.below(3))
                        .map(|_| rng.below(n.max(1)) as u32)
                        .collect::<Vec<_>>()
                };
                let (a, b) = (uses(), uses());
                if barriers.ordered(&a, &b) {
                    assert!(
                        reach.ordered(&a, &b),
                        "case {case}: barriers order {a:?} before {b:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn barriers_are_the_joins_of_a_chain() {
        // 0 → {1, 2} → 3 → 4: 0, 3 and 4 are barriers; 1 and 2 are not.
        let dag = build(
            &[
                vec![w(0)],
                vec![r(0), w(1)],
                vec![r(0), w(2)],
                vec![r(1), r(2), w(3)],
                vec![r(3)],
            ],
            false,
        );
        let b = Barriers::of(&dag);
        assert!(b.ordered(&[0], &[1, 2]) && b.ordered(&[1, 2], &[3]) && b.ordered(&[3], &[4]));
        assert!(!b.ordered(&[1], &[2]) && !b.ordered(&[3], &[3]) && !b.ordered(&[4], &[3]));
        assert!(Reach::of(&dag).ordered(&[0, 1, 2], &[3, 4]));
        assert!(!Reach::of(&dag).ordered(&[1], &[2]));
    }
}
