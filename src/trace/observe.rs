//! The [`Observer`]: everything that watches an engine's ops through the
//! lifecycle hooks (the registry behind diagnostics, the trace recorder,
//! `tracing` spans), and the hang watchdog that reads the registry,
//! behind one pointer, so that an engine that observes nothing pays one
//! predictable branch per hook.

use super::record::BY_A_VARIABLE;
use super::record::{Recorder, What, address};
#[cfg(feature = "tracing")]
use super::spans::Spans;
use super::track::Tracker;
use super::watchdog::Watchdog;
use crate::dep::{OpBlock, RecordedRun, Units};

/// What an engine observes of its ops; at least one part is present.
#[derive(Default)]
pub(crate) struct Observer {
    pub(crate) tracker: Option<Tracker>,
    pub(crate) recorder: Option<Recorder>,
    #[cfg(feature = "tracing")]
    pub(crate) spans: Option<Spans>,
    /// The hang watchdog (its progress count is the tracker's, which it
    /// needs: the builder makes one with it).
    pub(crate) watchdog: Option<Watchdog>,
}

/// `by` as an event holds it.
fn by_address(by: Option<&OpBlock>) -> usize {
    by.map_or(0, address)
}

impl Observer {
    /// The observer, or none if it has nothing to observe.
    pub(crate) fn boxed(self) -> Option<Box<Self>> {
        debug_assert!(
            self.watchdog.is_none() || self.tracker.is_some(),
            "a watchdog reads the tracker"
        );
        #[cfg(feature = "tracing")]
        let spans = self.spans.is_some();
        #[cfg(not(feature = "tracing"))]
        let spans = false;
        (self.tracker.is_some() || self.recorder.is_some() || spans).then(|| Box::new(self))
    }

    /// The spans, if the engine makes them.
    #[cfg(feature = "tracing")]
    #[inline]
    fn spans(&self) -> Option<&Spans> {
        self.spans.as_ref()
    }

    /// The recorder, if it records now.
    #[inline]
    fn recording(&self) -> Option<&Recorder> {
        self.recorder.as_ref().filter(|r| r.is_on())
    }

    pub(crate) fn pushed(&self, op: &OpBlock) {
        if let Some(t) = &self.tracker {
            t.add(op);
        }
        if let Some(r) = self.recording() {
            r.pushed(op);
        }
        #[cfg(feature = "tracing")]
        if let Some(s) = self.spans() {
            s.pushed(op);
        }
    }

    pub(crate) fn ready(&self, op: &OpBlock, by: Option<&OpBlock>) {
        if let Some(r) = self.recording() {
            r.event(op, What::Ready { by: by_address(by) });
        }
        #[cfg(feature = "tracing")]
        if let Some(s) = self.spans() {
            s.unblocked(op, by, "ready");
        }
    }

    pub(crate) fn granted(&self, op: &OpBlock, by: Units<'_>) {
        if let Some(t) = &self.tracker {
            t.granted(op);
        }
        if let Some(r) = self.recording() {
            let by = match by {
                Units::Free => 0,
                Units::Op(b) => address(b),
                Units::Var => BY_A_VARIABLE,
            };
            r.event(op, What::Granted { by });
        }
        #[cfg(feature = "tracing")]
        if let Some(s) = self.spans() {
            let by = match by {
                Units::Op(b) => Some(b),
                Units::Free | Units::Var => None,
            };
            s.unblocked(op, by, "granted");
        }
    }

    /// The units taken of each of `pools` changed: `in_use` tells how many
    /// are taken now.
    pub(crate) fn units(&self, pools: impl Iterator<Item = usize>, in_use: impl Fn(usize) -> u64) {
        if let Some(r) = self.recording() {
            for pool in pools {
                r.units(pool, in_use(pool));
            }
        }
    }

    pub(crate) fn started(&self, op: &OpBlock) {
        self.running(op, What::Started);
    }

    /// The op's body runs: from its start, or again after it awaited.
    #[inline]
    fn running(&self, op: &OpBlock, what: What) {
        if let Some(t) = &self.tracker {
            t.running(op);
        }
        if let Some(r) = self.recording() {
            r.event(op, what);
        }
        #[cfg(feature = "tracing")]
        if let Some(s) = self.spans() {
            s.enter(op);
        }
    }

    pub(crate) fn suspended(&self, op: &OpBlock) {
        if let Some(t) = &self.tracker {
            t.awaiting(op);
        }
        if let Some(r) = self.recording() {
            r.event(op, What::Suspended);
        }
        #[cfg(feature = "tracing")]
        if let Some(s) = self.spans() {
            s.exit(op, None);
        }
    }

    pub(crate) fn resumed(&self, op: &OpBlock) {
        self.running(op, What::Resumed);
    }

    pub(crate) fn enqueued(&self, op: &OpBlock) {
        if let Some(r) = self.recording() {
            r.event(op, What::Enqueued);
        }
        #[cfg(feature = "tracing")]
        if let Some(s) = self.spans() {
            s.exit(op, Some("enqueued"));
        }
    }

    pub(crate) fn ended(&self, op: &OpBlock) {
        if let Some(t) = &self.tracker {
            t.remove(op);
        }
        if let Some(r) = self.recording() {
            r.event(op, What::Ended);
        }
        #[cfg(feature = "tracing")]
        if let Some(s) = self.spans() {
            s.ended(op);
        }
    }

    /// Whether recorded ops' runs are of interest: a trace recorder, spans,
    /// or a watchdog (they are progress; a tracker only counts pushed ops).
    #[inline]
    pub(crate) fn watches_recorded(&self) -> bool {
        #[cfg(feature = "tracing")]
        if self.spans.is_some() {
            return true;
        }
        self.recorder.is_some() || self.watchdog.is_some()
    }

    /// Recorded op `op` of the replay at `replay` is at `run`.
    pub(crate) fn recorded(&self, op: &OpBlock, replay: usize, run: RecordedRun) {
        if let Some(w) = &self.watchdog {
            w.recorded_ran();
        }
        if let Some(r) = self.recording() {
            r.recorded(op, replay, run);
        }
        #[cfg(feature = "tracing")]
        if let Some(s) = self.spans() {
            s.recorded(op, replay, run);
        }
    }

    /// The op released everything and is counted out.
    pub(crate) fn retired(&self, _op: &OpBlock) {
        #[cfg(feature = "tracing")]
        if let Some(s) = self.spans() {
            s.retired(_op);
        }
    }
}
