//! The [`Observer`]: everything that watches an engine's ops through the
//! lifecycle hooks (the registry behind diagnostics, the trace recorder),
//! and the hang watchdog that reads the registry, behind one pointer, so that an engine that observes nothing pays one
//! predictable branch per hook.

use super::record::{Recorder, What, address};
use super::track::Tracker;
use super::watchdog::Watchdog;
use crate::dep::OpBlock;

/// What an engine observes of its ops; at least one part is present.
pub(crate) struct Observer {
    pub(crate) tracker: Option<Tracker>,
    pub(crate) recorder: Option<Recorder>,
    /// The hang watchdog (its progress count is the tracker's, which it
    /// needs: the builder makes one with it).
    pub(crate) watchdog: Option<Watchdog>,
}

/// `by` as an event holds it.
fn by_address(by: Option<&OpBlock>) -> usize {
    by.map_or(0, address)
}

impl Observer {
    /// The observer of these parts, or none if there is nothing to observe.
    pub(crate) fn new(
        tracker: Option<Tracker>,
        recorder: Option<Recorder>,
        watchdog: Option<Watchdog>,
    ) -> Option<Box<Self>> {
        debug_assert!(
            watchdog.is_none() || tracker.is_some(),
            "a watchdog reads the tracker"
        );
        (tracker.is_some() || recorder.is_some()).then(|| {
            Box::new(Self {
                tracker,
                recorder,
                watchdog,
            })
        })
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
    }

    pub(crate) fn ready(&self, op: &OpBlock, by: Option<&OpBlock>) {
        if let Some(r) = self.recording() {
            r.event(op, What::Ready { by: by_address(by) });
        }
    }

    pub(crate) fn granted(&self, op: &OpBlock, by: Option<&OpBlock>) {
        if let Some(t) = &self.tracker {
            t.granted(op);
        }
        if let Some(r) = self.recording() {
            r.event(op, What::Granted { by: by_address(by) });
        }
    }

    /// `pool` has `in_use` units taken now.
    pub(crate) fn units(&self, pool: usize, in_use: impl FnOnce() -> u64) {
        if let Some(r) = self.recording() {
            r.units(pool, in_use());
        }
    }

    pub(crate) fn started(&self, op: &OpBlock) {
        if let Some(t) = &self.tracker {
            t.running(op);
        }
        if let Some(r) = self.recording() {
            r.event(op, What::Started);
        }
    }

    pub(crate) fn suspended(&self, op: &OpBlock) {
        if let Some(t) = &self.tracker {
            t.awaiting(op);
        }
        if let Some(r) = self.recording() {
            r.event(op, What::Suspended);
        }
    }

    pub(crate) fn resumed(&self, op: &OpBlock) {
        if let Some(t) = &self.tracker {
            t.running(op);
        }
        if let Some(r) = self.recording() {
            r.event(op, What::Resumed);
        }
    }

    pub(crate) fn enqueued(&self, op: &OpBlock) {
        if let Some(r) = self.recording() {
            r.event(op, What::Enqueued);
        }
    }

    pub(crate) fn ended(&self, op: &OpBlock) {
        if let Some(t) = &self.tracker {
            t.remove(op);
        }
        if let Some(r) = self.recording() {
            r.event(op, What::Ended);
        }
    }
}
