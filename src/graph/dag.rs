//! The dependency DAG of a recording, built once from the variables each
//! recorded op reads and mutates, as SINGA builds its graph: per variable,
//! its last writer and the readers since that write.
//!
//! - a read of `v` waits for `v`'s last writer (read after write);
//! - a write of `v` waits for every reader since the last write (write
//!   after read), or, when there was none, for the last writer (write after
//!   write); it becomes `v`'s last writer and clears its readers.
//!
//! Invariants: every edge goes forward (`from < to`), so the recorded order
//! is a topological order; there is at most one [`DagEdge`] per `(from, to,
//! var)`; successor lists are distinct and ascending. A variable listed twice
//! by one node counts once, as a write if either listing is one.
//!
//! [`Reach`] answers happens-before over the data edges with an n × n bitset
//! (n²/8 bytes); [`Barriers`] is the O(n) fallback past
//! [`Reach::MAX_NODES`], weaker but never claiming an order that is not there.

// Wired into the runtime by the recording (issue 13); until then only tests use it.

/// One variable a recorded node touches: `var` is its dense index within the
/// recording, `write` whether the node mutates it (read and mutated is a write).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Access {
    pub(crate) var: u32,
    pub(crate) write: bool,
}

/// Why one recorded op waits for an earlier one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EdgeKind {
    /// The later op reads what the earlier one wrote: a true dependency.
    ReadAfterWrite,
    /// The later op mutates what the earlier one read, so it waits for the
    /// read to finish: an anti-dependency.
    WriteAfterRead,
    /// The later op mutates what the earlier one wrote, with no read in
    /// between: an output dependency, which keeps the writes in order.
    WriteAfterWrite,
}

/// A labelled data edge: `to` waits for `from` because of `var`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DagEdge {
    pub(crate) from: u32,
    pub(crate) to: u32,
    pub(crate) var: u32,
    pub(crate) kind: EdgeKind,
}

/// The analysed recording: what a replay schedules by (`pred_count`,
/// successors, `roots`) and the data edges (`edges`, always, for inspection).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Dag {
    /// Per node, its number of distinct predecessors in the schedule.
    pub(crate) pred_count: Vec<u32>,
    /// Successors of node `i`: `succ[succ_start[i]..succ_start[i + 1]]`.
    pub(crate) succ_start: Vec<u32>,
    pub(crate) succ: Vec<u32>,
    /// Nodes with no predecessor, ascending.
    pub(crate) roots: Vec<u32>,
    /// The data edges, sorted by `(to, from, var)`.
    pub(crate) edges: Vec<DagEdge>,
    /// Whether the schedule is the recorded order (`i → i + 1`) rather
    /// than the data edges.
    pub(crate) sequential: bool,
    /// Distinct data predecessors of node `i`, ascending:
    /// `data_pred[data_start[i]..data_start[i + 1]]`, whatever the schedule.
    data_start: Vec<u32>,
    data_pred: Vec<u32>,
}

mod reach;

pub(crate) use self::reach::HappensBefore;
#[cfg(test)]
pub(crate) use self::reach::{Barriers, Reach};

const NONE: u32 = u32::MAX;

impl Dag {
    /// Builds the DAG of `nodes` (in recorded order, each with its
    /// accesses) in O(nodes + vars + accesses + edges) time and memory.
    /// With `sequential`, the schedule is the recorded order.
    pub(crate) fn build(nodes: &[&[Access]], sequential: bool) -> Dag {
        let n = nodes.len();
        assert!(n < NONE as usize, "a recording of {n} nodes is too long");
        let vars = nodes
            .iter()
            .flat_map(|a| a.iter())
            .map(|a| a.var as usize + 1)
            .max()
            .unwrap_or(0);
        let mut writer = vec![NONE; vars];
        // Readers since the last write: a linked list per variable in one
        // arena (`(node, next)`), so that no variable allocates its own.
        let mut head = vec![NONE; vars];
        let mut readers: Vec<(u32, u32)> = Vec::new();
        // The node's accesses, each variable once.
        let mut stamp = vec![NONE; vars];
        let mut slot = vec![0u32; vars];
        let mut merged: Vec<(u32, bool)> = Vec::new();
        let mut edges = Vec::new();
        let mut data_start = Vec::with_capacity(n + 1);
        let mut data_pred = Vec::new();
        data_start.push(0);
        for (i, accesses) in nodes.iter().enumerate() {
            let i = i as u32;
            merged.clear();
            for a in accesses.iter() {
                let v = a.var as usize;
                if stamp[v] == i {
                    merged[slot[v] as usize].1 |= a.write;
                } else {
                    stamp[v] = i;
                    slot[v] = merged.len() as u32;
                    merged.push((a.var, a.write));
                }
            }
            let first = edges.len();
            for &(var, write) in &merged {
                let v = var as usize;
                let edge = |from, kind| DagEdge {
                    from,
                    to: i,
                    var,
                    kind,
                };
                if !write {
                    if writer[v] != NONE {
                        edges.push(edge(writer[v], EdgeKind::ReadAfterWrite));
                    }
                    readers.push((i, head[v]));
                    head[v] = readers.len() as u32 - 1;
                    continue;
                }
                if head[v] == NONE && writer[v] != NONE {
                    edges.push(edge(writer[v], EdgeKind::WriteAfterWrite));
                }
                let mut r = head[v];
                while r != NONE {
                    let (reader, next) = readers[r as usize];
                    edges.push(edge(reader, EdgeKind::WriteAfterRead));
                    r = next;
                }
                writer[v] = i;
                head[v] = NONE;
            }
            let mine = &mut edges[first..];
            mine.sort_unstable_by_key(|e| (e.from, e.var));
            for (k, e) in mine.iter().enumerate() {
                if k == 0 || mine[k - 1].from != e.from {
                    data_pred.push(e.from);
                }
            }
            data_start.push(data_pred.len() as u32);
        }
        let mut dag = Dag {
            pred_count: Vec::new(),
            succ_start: Vec::new(),
            succ: Vec::new(),
            roots: Vec::new(),
            edges,
            sequential,
            data_start,
            data_pred,
        };
        if sequential {
            dag.pred_count = (0..n).map(|i| u32::from(i > 0)).collect();
            dag.succ_start = (0..=n as u32)
                .map(|i| i.min(n.saturating_sub(1) as u32))
                .collect();
            dag.succ = (1..n as u32).collect();
        } else {
            dag.pred_count = (0..n)
                .map(|i| dag.data_preds(i as u32).len() as u32)
                .collect();
            (dag.succ_start, dag.succ) = dag.data_successors();
        }
        dag.roots = (0..n as u32)
            .filter(|&i| dag.pred_count[i as usize] == 0)
            .collect();
        dag
    }

    /// The number of nodes.
    pub(crate) fn len(&self) -> usize {
        self.pred_count.len()
    }

    /// The scheduled successors of `node`, ascending.
    #[cfg(test)]
    pub(crate) fn successors(&self, node: u32) -> &[u32] {
        let i = node as usize;
        &self.succ[self.succ_start[i] as usize..self.succ_start[i + 1] as usize]
    }

    /// The distinct data predecessors of `node`, ascending.
    pub(crate) fn data_preds(&self, node: u32) -> &[u32] {
        let i = node as usize;
        &self.data_pred[self.data_start[i] as usize..self.data_start[i + 1] as usize]
    }

    /// The data successors as a CSR (start, list), each list ascending.
    fn data_successors(&self) -> (Vec<u32>, Vec<u32>) {
        let n = self.len();
        let mut start = vec![0u32; n + 1];
        for &p in &self.data_pred {
            start[p as usize + 1] += 1;
        }
        for i in 0..n {
            start[i + 1] += start[i];
        }
        let mut fill = start.clone();
        let mut succ = vec![0u32; self.data_pred.len()];
        for to in 0..n as u32 {
            for &from in self.data_preds(to) {
                succ[fill[from as usize] as usize] = to;
                fill[from as usize] += 1;
            }
        }
        (start, succ)
    }
}

/// Seeded random recordings for the graph modules' tests.
#[cfg(test)]
pub(crate) mod testing {
    use super::{Access, Dag};

    /// splitmix64, as in the workloads.
    pub(crate) struct Rng(pub(crate) u64);

    impl Rng {
        pub(crate) fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }

        /// Uniform in `0..n` (n > 0).
        pub(crate) fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    pub(crate) fn r(var: u32) -> Access {
        Access { var, write: false }
    }

    pub(crate) fn w(var: u32) -> Access {
        Access { var, write: true }
    }

    /// The DAG of `nodes`.
    pub(crate) fn build(nodes: &[Vec<Access>], sequential: bool) -> Dag {
        Dag::build(
            &nodes.iter().map(Vec::as_slice).collect::<Vec<_>>(),
            sequential,
        )
    }

    /// `n` nodes, each touching up to 3 of `vars` variables (maybe twice).
    pub(crate) fn recording(rng: &mut Rng, n: usize, vars: usize) -> Vec<Vec<Access>> {
        (0..n)
            .map(|_| {
                (0..rng.below(4))
                    .map(|_| Access {
                        var: rng.below(vars) as u32,
                        write: rng.below(2) == 0,
                    })
                    .collect()
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{build, r, w};
    use super::*;

    #[test]
    fn edges_follow_singas_rules() {
        use EdgeKind::*;
        // 0 writes x; 1 and 2 read it; 3 writes it (after both reads);
        // 4 writes it again (no read between: after 3's write); 5 reads y,
        // never written, and 6 writes y after that read.
        let dag = build(
            &[
                vec![w(0)],
                vec![r(0)],
                vec![r(0)],
                vec![w(0)],
                vec![w(0)],
                vec![r(1)],
                vec![w(1)],
            ],
            false,
        );
        let edges: Vec<_> = dag
            .edges
            .iter()
            .map(|e| (e.from, e.to, e.var, e.kind))
            .collect();
        assert_eq!(
            edges,
            [
                (0, 1, 0, ReadAfterWrite),
                (0, 2, 0, ReadAfterWrite),
                (1, 3, 0, WriteAfterRead),
                (2, 3, 0, WriteAfterRead),
                (3, 4, 0, WriteAfterWrite),
                (5, 6, 1, WriteAfterRead),
            ]
        );
        assert_eq!(dag.pred_count, [0, 1, 1, 2, 1, 0, 1]);
        assert_eq!(dag.successors(0), [1, 2]);
        assert_eq!(dag.successors(4), [] as [u32; 0]);
        assert_eq!(dag.roots, [0, 5]);
    }

    #[test]
    fn a_node_depends_on_another_once_and_lists_a_variable_once() {
        // 1 reads both of 0's outputs: one predecessor, two edges. 2 lists
        // x as read and as write: a write (after 1's read), one edge.
        let dag = build(
            &[vec![w(0), w(1)], vec![r(1), r(0)], vec![r(0), w(0)]],
            false,
        );
        assert_eq!(dag.edges.len(), 3);
        assert_eq!((dag.edges[0].var, dag.edges[1].var), (0, 1));
        assert_eq!(
            dag.edges[2],
            DagEdge {
                from: 1,
                to: 2,
                var: 0,
                kind: EdgeKind::WriteAfterRead
            }
        );
        assert_eq!(dag.pred_count, [0, 1, 1]);
        assert_eq!(dag.successors(0), [1]);
    }

    #[test]
    fn sequential_schedules_the_recorded_order_and_keeps_the_data_edges() {
        let nodes = [vec![w(0)], vec![w(1)], vec![r(0)]];
        let dag = build(&nodes, true);
        assert_eq!(dag.pred_count, [0, 1, 1]);
        assert_eq!(
            (dag.successors(0), dag.successors(1), dag.successors(2)),
            (&[1][..], &[2][..], &[][..])
        );
        assert_eq!(dag.roots, [0]);
        assert_eq!(dag.edges, build(&nodes, false).edges);
        assert!(Reach::of(&dag).before(0, 2) && !Reach::of(&dag).before(1, 2));
        assert_eq!(build(&[], true).roots, [] as [u32; 0]);
    }
}
