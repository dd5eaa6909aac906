//! What a recorded graph shows of itself: its ops, its edges and its
//! memory plan, as the analysis found them.

use super::dag::EdgeKind;
use crate::error::VarId;

/// The order a replay runs a graph's ops in
/// ([`Recorder::order`](crate::Recorder::order)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Order {
    /// Any order the dependencies allow: ops run in parallel where they
    /// may (the default).
    #[default]
    Parallel,
    /// The recorded order, one op at a time (SINGA's sequential mode):
    /// simpler to reason about, and host buffers share more memory (device
    /// buffers are planned by the dependencies in either order: work on two
    /// lanes of a device is ordered only through variables).
    Sequential,
}

/// One recorded op, as the analysis saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GraphOp {
    /// Its name, if it was given one.
    pub name: Option<String>,
    /// The index of its device in the engine.
    pub device: usize,
    /// The variables it reads (and does not mutate).
    pub reads: Vec<VarId>,
    /// The variables it mutates.
    pub mutates: Vec<VarId>,
}

/// A dependency between two recorded ops, through one variable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GraphEdge {
    /// The op that comes first (its index in recorded order).
    pub from: usize,
    /// The op that waits for it.
    pub to: usize,
    /// The variable they share.
    pub var: VarId,
    /// Why `to` waits.
    pub kind: EdgeKind,
}

/// Where a planned buffer lives in its graph's arena.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PlannedBuffer {
    /// The buffer.
    pub id: VarId,
    /// Its first byte in the arena.
    pub offset: usize,
    /// Its size in bytes.
    pub bytes: usize,
}

/// A graph's memory plan: its planned buffers share one arena, where two
/// buffers overlap only if no replay can have both live at once.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemoryPlan {
    /// The arena's size in bytes: the memory a replay takes.
    pub arena_bytes: usize,
    /// The sum of every buffer's size: the memory without the plan.
    pub total_bytes: usize,
    /// A lower bound of any plan's arena: the most bytes live at once in
    /// recorded order.
    pub peak_live_bytes: usize,
    /// Each buffer, in the order they were made.
    pub buffers: Vec<PlannedBuffer>,
}

impl MemoryPlan {
    /// The fraction of memory the plan saves: 1 - arena / total (0 for no
    /// buffers).
    pub fn saving(&self) -> f64 {
        if self.total_bytes == 0 {
            0.0
        } else {
            1.0 - self.arena_bytes as f64 / self.total_bytes as f64
        }
    }
}
