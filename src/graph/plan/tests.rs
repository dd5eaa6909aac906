//! The planner's tests: invariants, known graphs, the optimum by brute
//! force on small instances, seeded random instances.

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
        let parallel = plan(
            &bs,
            conflicts_parallel(&before, &bs),
            &horizons_parallel(&before, &bs),
        );
        let sequential = plan(&bs, conflicts_sequential(&bs), &horizons_sequential(&bs));
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
    assert_eq!(
        (
            plan(&bs, &c, &horizons_sequential(&bs)).arena_bytes,
            optimum(&bs, &c)
        ),
        (12, 11)
    );
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
    let p = plan(
        &bs,
        conflicts_parallel(&before, &bs),
        &horizons_parallel(&before, &bs),
    );
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
    assert_eq!(
        plan(
            &bs,
            conflicts_parallel(&before, &bs),
            &horizons_parallel(&before, &bs)
        )
        .arena_bytes,
        15
    );
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
    assert_eq!(
        plan(&bs, conflicts_sequential(&bs), &horizons_sequential(&bs)).arena_bytes,
        16
    );
    assert_eq!(
        plan(
            &bs,
            conflicts_parallel(&before, &bs),
            &horizons_parallel(&before, &bs)
        )
        .arena_bytes,
        32
    );
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
    let p = plan(&bs, &c, &horizons_sequential(&bs));
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

/// `count` buffers of random sizes (up to `max_bytes`, and if `whole`,
/// whole multiples of their alignment), alignments (1 to 8 if `aligned`)
/// and uses over `n` nodes.
fn buffers(
    rng: &mut Rng,
    n: usize,
    count: usize,
    max_bytes: usize,
    (aligned, whole): (bool, bool),
) -> Vec<Buffer> {
    (0..count)
        .map(|_| {
            let mut uses: Vec<u32> = (0..rng.below(4)).map(|_| rng.below(n) as u32).collect();
            uses.sort_unstable();
            uses.dedup();
            let align = if aligned { 1 << rng.below(4) } else { 1 };
            let bytes = rng.below(max_bytes + 1);
            Buffer {
                bytes: if whole {
                    bytes.next_multiple_of(align)
                } else {
                    bytes
                },
                align,
                uses,
            }
        })
        .collect()
}

/// The known gap, measured on 400 seeded instances of up to 6 buffers
/// on random DAGs of up to 9 nodes (the counts below are what this
/// seed gives): greedy by size is near the optimum when sizes are whole
/// multiples of their alignment (as tensors' are), and loses more to
/// padding when small buffers have large alignments.
#[test]
fn greedy_against_the_optimum_on_small_instances() {
    for (mode, least_equal, worst_ratio) in [
        ((false, false), 398, 1.1),
        ((true, true), 322, 1.42),
        ((true, false), 268, 1.54),
    ] {
        let mut rng = Rng(13);
        let (mut equal, mut worst) = (0, 1.0f64);
        for _ in 0..400 {
            let n = 2 + rng.below(8);
            let d = dag(&recording(&mut rng, n, 4));
            let count = 1 + rng.below(6);
            let bs = buffers(&mut rng, n, count, 16, mode);
            let before = HappensBefore::of(&d);
            let c = conflicts_parallel(&before, &bs);
            let (greedy, best) = (
                plan(&bs, &c, &horizons_parallel(&before, &bs)),
                optimum(&bs, &c),
            );
            check(&bs, &greedy, &c);
            assert!(best <= greedy.arena_bytes && greedy.peak_live_bytes <= best);
            equal += usize::from(greedy.arena_bytes == best);
            worst = worst.max(greedy.arena_bytes as f64 / best.max(1) as f64);
        }
        eprintln!("{mode:?}: greedy == optimum in {equal} of 400; worst ratio {worst}");
        assert!(
            equal >= least_equal && worst <= worst_ratio,
            "{mode:?}: {equal}, {worst}"
        );
    }
}

#[test]
fn random_plans_share_only_what_happens_before_allows() {
    let mut rng = Rng(42);
    // Pairs that share memory, with Reach and with the fallback.
    let mut shared = [0, 0];
    for case in 0..300 {
        let n = 1 + rng.below(40);
        let vars = 1 + rng.below(12);
        let d = dag(&recording(&mut rng, n, vars));
        let count = rng.below(31);
        let mode = (rng.below(2) == 0, rng.below(2) == 0);
        let bs = buffers(&mut rng, n, count, 100, mode);
        let reach = Reach::of(&d);
        let exact = HappensBefore::Reach(reach.clone());
        let fallback = HappensBefore::Barriers(Barriers::of(&d));
        let sequential = conflicts_sequential(&bs);
        for (k, before) in [&exact, &fallback].into_iter().enumerate() {
            let c = conflicts_parallel(before, &bs);
            let p = plan(&bs, &c, &horizons_parallel(before, &bs));
            check(&bs, &p, &c);
            for a in 0..bs.len() {
                for b in 0..a {
                    assert!(
                        !sequential(a, b) || c(a, b),
                        "case {case}: parallel misses an overlap"
                    );
                    let (ua, ub) = (&bs[a].uses, &bs[b].uses);
                    if overlap(&bs, &p, a, b) {
                        shared[k] += 1;
                        assert!(
                            reach.ordered(ua, ub) || reach.ordered(ub, ua),
                            "case {case}: {a} and {b} share unordered"
                        );
                    }
                }
            }
        }
        let p = plan(&bs, &sequential, &horizons_sequential(&bs));
        check(&bs, &p, &sequential);
    }
    eprintln!("pairs sharing memory: {shared:?}");
    assert!(shared[0] > shared[1] && shared[1] > 0, "{shared:?}");
}

/// A conflict relation, whichever it is.
type Conflict<'a> = dyn Fn(usize, usize) -> bool + 'a;

/// Horizons only prune: buffers with disjoint horizons never conflict, and
/// the plan is the one a scan of every placed buffer gives (horizons
/// spanning everything), with Reach, with the fallback and in order; and
/// a plan out of its test budget still never overlaps conflicting buffers.
#[test]
fn horizons_prune_without_changing_the_plan() {
    let mut rng = Rng(5);
    for case in 0..300 {
        let n = 1 + rng.below(if case % 10 == 0 { 3000 } else { 300 });
        let vars = 1 + rng.below(12);
        let d = dag(&recording(&mut rng, n, vars));
        let count = rng.below(60);
        let mode = (rng.below(2) == 0, rng.below(2) == 0);
        let bs = buffers(&mut rng, n, count, 100, mode);
        let everything: Vec<_> = bs
            .iter()
            .map(|b| (!b.uses.is_empty()).then_some((0, n as u32)))
            .collect();
        let exact = HappensBefore::Reach(Reach::of(&d));
        let fallback = HappensBefore::Barriers(Barriers::of(&d));
        let sequential = conflicts_sequential(&bs);
        let runs: [(&Conflict<'_>, Vec<_>); 3] = [
            (
                &conflicts_parallel(&exact, &bs),
                horizons_parallel(&exact, &bs),
            ),
            (
                &conflicts_parallel(&fallback, &bs),
                horizons_parallel(&fallback, &bs),
            ),
            (&sequential, horizons_sequential(&bs)),
        ];
        for (k, (c, horizons)) in runs.iter().enumerate() {
            for a in 0..bs.len() {
                for b in 0..a {
                    if let (Some((fa, sa)), Some((fb, sb))) = (horizons[a], horizons[b]) {
                        assert!(
                            fa < sb && fb < sa || !c(a, b),
                            "case {case}, relation {k}: {a} and {b} conflict, horizons disjoint"
                        );
                    }
                }
            }
            let pruned = plan(&bs, c, horizons);
            assert_eq!(
                pruned,
                plan(&bs, c, &everything),
                "case {case}, relation {k}"
            );
            let bounded = plan_bounded(&bs, c, horizons, 0);
            check(&bs, &bounded, c);
        }
    }
}

/// `settled` against a search: every node from it on happens after all the
/// uses, and (with Reach) the node before it, if past every use, does not.
#[test]
fn settled_is_where_every_later_node_is_ordered_after() {
    let mut rng = Rng(11);
    for case in 0..200 {
        let n = 1 + rng.below(150);
        let vars = 1 + rng.below(8);
        let d = dag(&recording(&mut rng, n, vars));
        let reach = Reach::of(&d);
        for before in [
            HappensBefore::Reach(reach.clone()),
            HappensBefore::Barriers(Barriers::of(&d)),
        ] {
            for _ in 0..20 {
                let mut uses: Vec<u32> =
                    (0..1 + rng.below(3)).map(|_| rng.below(n) as u32).collect();
                uses.sort_unstable();
                uses.dedup();
                let s = before.settled(&uses);
                let last = *uses.last().unwrap();
                assert!(
                    s > last && s as usize <= n,
                    "case {case}: {uses:?} settled at {s}"
                );
                for x in s..n as u32 {
                    assert!(
                        before.ordered(&uses, &[x]),
                        "case {case}: {uses:?} not before {x}"
                    );
                }
                if let HappensBefore::Reach(_) = before
                    && s > last + 1
                {
                    assert!(
                        !reach.ordered(&uses, &[s - 1]),
                        "case {case}: {uses:?} settles before {s}"
                    );
                }
            }
        }
    }
}
