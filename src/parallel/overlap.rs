//! [`Overlap`]: how much of the all-reduce's time ran while compute ops
//! ran, measured from a [`Trace`]'s per-op start and end timestamps.
//!
//! Meant for ops on CPU devices: on a stream device an op's span runs from
//! its launch until the device's poller sees its event, which is not the
//! time its work ran.

use std::time::Duration;

use crate::trace::{Trace, TracedOp};

/// The time the all-reduce ops of a trace ran (those named `allreduce …`:
/// packs, ring steps, unpacks), and how much of it some compute op ran too.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Overlap {
    /// The all-reduce ops' time, summed over ops.
    pub reduce: Duration,
    /// The part of it during which a compute op was running (on any
    /// device).
    pub hidden: Duration,
    /// How many all-reduce ops the trace holds (with both timestamps).
    pub ops: usize,
    /// How many of them started while a compute op was running.
    pub started_under: usize,
}

impl Overlap {
    /// Measures `trace`: `compute` says which ops are compute (the
    /// backward ops, say: `|op| op.name().is_some_and(|n| n.contains("backward"))`).
    pub fn measure(trace: &Trace, compute: impl Fn(&TracedOp) -> bool) -> Self {
        Self::between(
            trace,
            |op| op.name().is_some_and(|n| n.starts_with("allreduce")),
            compute,
        )
    }

    /// As [`measure`](Self::measure), for the ops `reduce` picks (the host
    /// aggregation of [`Update::Host`](super::Update::Host), named `host
    /// sum`, say) instead of the all-reduce's.
    pub fn between(
        trace: &Trace,
        reduce: impl Fn(&TracedOp) -> bool,
        compute: impl Fn(&TracedOp) -> bool,
    ) -> Self {
        let span = |op: &TracedOp| Some((op.started()?, op.ended()?));
        let mut busy: Vec<(Duration, Duration)> = trace
            .ops()
            .iter()
            .filter(|op| compute(op))
            .filter_map(span)
            .collect();
        busy.sort();
        // Merged into disjoint intervals, in order.
        let mut merged: Vec<(Duration, Duration)> = Vec::with_capacity(busy.len());
        for (s, e) in busy {
            match merged.last_mut() {
                Some(last) if s <= last.1 => last.1 = last.1.max(e),
                _ => merged.push((s, e)),
            }
        }
        let mut out = Overlap::default();
        for op in trace.ops() {
            let Some((s, e)) = span(op).filter(|_| reduce(op)) else {
                continue;
            };
            out.ops += 1;
            let i = merged.partition_point(|&(_, end)| end <= s);
            if merged.get(i).is_some_and(|&(bs, _)| bs <= s) {
                out.started_under += 1;
            }
            out.reduce += e.saturating_sub(s);
            let first = merged.partition_point(|&(_, end)| end <= s);
            for &(bs, be) in merged[first..].iter().take_while(|&&(bs, _)| bs < e) {
                out.hidden += e.min(be).saturating_sub(s.max(bs));
            }
        }
        out
    }

    /// `hidden / reduce` (0 without all-reduce time).
    pub fn fraction(&self) -> f64 {
        if self.reduce.is_zero() {
            0.0
        } else {
            self.hidden.as_secs_f64() / self.reduce.as_secs_f64()
        }
    }
}
