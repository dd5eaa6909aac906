//! `tracing` spans for ops (the `tracing` feature,
//! [`EngineBuilder::tracing_spans`](crate::EngineBuilder::tracing_spans)):
//! one `op` span per op, a child of the span current where it was pushed,
//! entered while its body runs (each poll, on the thread that polls it),
//! following from the op that unblocked it, with `ready`, `granted`,
//! `enqueued` and `ended` events inside. So subscribers (tracing-chrome,
//! tracing-perfetto, tokio-console-style tools) show engine ops among the
//! user's own spans. Its `reads` and `mutates` list variables as their
//! `Display` does: `` `name` (var#N) `` for a named one, else `var#N`.
//!
//! Each run of a recorded op in a replay is an `op` span too (with
//! `recorded = true`), a child of the replay's op's span, entered while it
//! runs on the thread that runs it.
//!
//! The live spans are kept by op address under one lock: a cost only
//! engines that asked for spans pay.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use tracing::Span;

use super::record::address;
use crate::dep::{OpBlock, RecordedRun};
use crate::error::VarId;
use crate::loom::sync::Mutex;

/// A live op's span, and whether this op's body has it entered now.
struct Live {
    span: Span,
    entered: bool,
}

/// The spans of an engine's unfinished ops.
pub(crate) struct Spans {
    devices: Vec<String>,
    next: AtomicU64,
    live: Mutex<HashMap<usize, Live>>,
}

impl Spans {
    /// Spans for an engine with these devices (by index).
    pub(crate) fn new(devices: Vec<String>) -> Self {
        Self {
            devices,
            next: AtomicU64::new(0),
            live: Mutex::new(HashMap::new()),
        }
    }

    pub(crate) fn pushed(&self, op: &OpBlock) {
        let device = self
            .devices
            .get(usize::from(op.device_index()))
            .map_or("", String::as_str);
        let (reads, mutates) = vars(op);
        let span = tracing::info_span!(
            "op",
            name = op.name().unwrap_or(""),
            id = self.next.fetch_add(1, Relaxed),
            device,
            lane = op.lane().map(i64::from).unwrap_or(-1),
            reads = ?reads,
            mutates = ?mutates,
        );
        if span.is_disabled() {
            return;
        }
        self.live.lock().insert(
            address(op),
            Live {
                span,
                entered: false,
            },
        );
    }

    /// Recorded op `op` of the replay at `replay` is at `run` on this
    /// thread: its span is made and entered as it starts, a child of the
    /// replay's, and exited and closed as it ends.
    pub(crate) fn recorded(&self, op: &OpBlock, replay: usize, run: RecordedRun) {
        match run {
            RecordedRun::Started => {
                let parent = self.live.lock().get(&replay).and_then(|l| l.span.id());
                let (reads, mutates) = vars(op);
                let span = tracing::info_span!(
                    parent: parent,
                    "op",
                    name = op.name().unwrap_or(""),
                    recorded = true,
                    reads = ?reads,
                    mutates = ?mutates,
                );
                if span.is_disabled() {
                    return;
                }
                span.with_subscriber(|(id, dispatch)| dispatch.enter(id));
                let live = Live {
                    span,
                    entered: true,
                };
                self.live.lock().insert(address(op), live);
            }
            RecordedRun::Ended | RecordedRun::Deferred => {
                let live = self.live.lock().remove(&address(op));
                if let Some(mut live) = live {
                    exit(&mut live, None);
                }
            }
        }
    }

    /// Runs `f` on the op's live span, if it has one.
    fn with(&self, op: &OpBlock, f: impl FnOnce(&mut Live)) {
        if let Some(live) = self.live.lock().get_mut(&address(op)) {
            f(live);
        }
    }

    /// The op became ready (`what`: "ready" or "granted"), unblocked by `by`.
    pub(crate) fn unblocked(&self, op: &OpBlock, by: Option<&OpBlock>, what: &'static str) {
        let mut live = self.live.lock();
        let from = by.and_then(|by| live.get(&address(by))?.span.id());
        if let Some(l) = live.get_mut(&address(op)) {
            l.span.follows_from(from);
            event(&l.span, what);
        }
    }

    /// The op's body is polled (on this thread).
    pub(crate) fn enter(&self, op: &OpBlock) {
        self.with(op, |l| {
            l.span.with_subscriber(|(id, dispatch)| dispatch.enter(id));
            l.entered = true;
        });
    }

    /// The op's body returned (pending, or enqueued), on the thread that
    /// entered it.
    pub(crate) fn exit(&self, op: &OpBlock, event: Option<&'static str>) {
        self.with(op, |l| exit(l, event));
    }

    /// The op ended; its span stays for the ops it unblocks to follow.
    pub(crate) fn ended(&self, op: &OpBlock) {
        self.with(op, |l| exit(l, Some("ended")));
    }

    /// The op retired: its span closes (once nothing else holds it).
    pub(crate) fn retired(&self, op: &OpBlock) {
        let live = self.live.lock().remove(&address(op));
        drop(live);
    }
}

/// The variables `op` reads and mutates, which print as `VarId`s do (by
/// name where they have one).
fn vars(op: &OpBlock) -> (Vec<VarId>, Vec<VarId>) {
    let (mut reads, mut mutates) = (Vec::new(), Vec::new());
    for e in op.edges() {
        if e.is_write() {
            mutates.push(e.var.id());
        } else {
            reads.push(e.var.id());
        }
    }
    (reads, mutates)
}

/// A `DEBUG` event `what` in `span`, sent to the span's subscriber (this
/// thread's default may be another: ops run on the engine's threads).
fn event(span: &Span, what: &'static str) {
    span.with_subscriber(|(_, dispatch)| {
        tracing::dispatcher::with_default(dispatch, || tracing::debug!(parent: span, "{what}"));
    });
}

fn exit(l: &mut Live, what: Option<&'static str>) {
    if let Some(what) = what {
        event(&l.span, what);
    }
    if std::mem::take(&mut l.entered) {
        l.span.with_subscriber(|(id, dispatch)| dispatch.exit(id));
    }
}
