//! The hang watchdog's state: its period, what it calls on a hang, when a
//! stall is due for a report ([`Stall`]), and the handle of its thread.
//!
//! The thread itself is the engine's (`engine::diagnostics`): it wakes every
//! quarter period, reads the progress the op registry counts (ops started or
//! ended, `track`) and the ops in flight, and reports through
//! [`Watchdog::report`] once per stall. It holds the engine only weakly,
//! and the engine's shutdown stops it ([`Watchdog::stop`]) and joins it.
//!
//! Who touches what: the builder makes it; the watchdog thread reads the
//! period and calls the callback; the shutdown sets `stopped` and takes the
//! thread's handle, which the builder put in `thread`.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use super::diag::Diagnostics;
use crate::loom::sync::Mutex;

/// What the watchdog calls with the report of a hang.
pub(crate) type OnHang = Box<dyn Fn(&Diagnostics) + Send + Sync>;

/// An engine's watchdog.
pub(crate) struct Watchdog {
    period: Duration,
    /// `None`: print to stderr.
    on_hang: Option<OnHang>,
    stopped: AtomicBool,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Watchdog {
    pub(crate) fn new(period: Duration, on_hang: Option<OnHang>) -> Self {
        Self {
            period,
            on_hang,
            stopped: AtomicBool::new(false),
            thread: Mutex::new(None),
        }
    }

    /// How long ops may be pending with none starting or ending before
    /// it reports.
    pub(crate) fn period(&self) -> Duration {
        self.period
    }

    /// How long its thread sleeps between looks: a quarter period (so a
    /// hang is reported within 1.25 periods), at least 1 ms.
    pub(crate) fn tick(&self) -> Duration {
        (self.period / 4).max(Duration::from_millis(1))
    }

    /// Keeps the thread's handle, for `stop` to join.
    pub(crate) fn set_thread(&self, thread: JoinHandle<()>) {
        *self.thread.lock() = Some(thread);
    }

    /// Whether the engine shut down: the thread should end.
    pub(crate) fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::SeqCst)
    }

    /// Tells the thread to end, wakes it and waits for it (unless called on
    /// it: then it ends when this returns to its loop).
    pub(crate) fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        let Some(thread) = self.thread.lock().take() else {
            return;
        };
        if thread.thread().id() == std::thread::current().id() {
            return;
        }
        thread.thread().unpark();
        // Its panics are caught (see `report`); nothing else can panic.
        let _ = thread.join();
    }

    /// Reports a hang: to the callback, or to stderr. A panicking callback
    /// is reported on stderr and the watchdog goes on.
    pub(crate) fn report(&self, report: &Diagnostics) {
        let Some(on_hang) = &self.on_hang else {
            eprintln!("{}", hang_message(self.period, report));
            return;
        };
        if catch_unwind(AssertUnwindSafe(|| on_hang(report))).is_err() {
            eprintln!("depflow watchdog: the on_hang callback panicked");
        }
    }
}

/// The default report on stderr: what happened (a deadlock, if the report
/// found wait cycles), then the report.
pub(crate) fn hang_message(period: Duration, report: &Diagnostics) -> String {
    let cycles = match report.cycles().len() {
        0 => String::new(),
        1 => " It is deadlocked: the wait cycle is named at the end.".into(),
        n => format!(" It is deadlocked: the {n} wait cycles are named at the end."),
    };
    format!(
        "depflow watchdog: the engine looks stuck: ops are pending and none has started or \
         ended for {period:?} or more.{cycles} What every unfinished op waits for:\n{report}"
    )
}

/// When a stall is due for a report: the watchdog thread's memory between
/// looks.
#[derive(Debug)]
pub(crate) struct Stall {
    /// The progress count at the last report: no new report until it
    /// changes (progress resumed) and stalls again.
    reported_at: Option<u64>,
    /// How long ago, at the last look, the engine was seen with nothing in
    /// flight (`None`: not yet seen idle); a stall starts no earlier.
    idle: Option<Duration>,
}

impl Stall {
    pub(crate) fn new() -> Self {
        Self {
            reported_at: None,
            idle: None,
        }
    }

    /// One look: `in_flight` ops pending, `progress` ops started or ended
    /// so far, the last `quiet` ago; `elapsed` since the previous look.
    /// Whether to report now.
    pub(crate) fn look(
        &mut self,
        in_flight: usize,
        progress: u64,
        quiet: Duration,
        elapsed: Duration,
        period: Duration,
    ) -> bool {
        if in_flight == 0 {
            self.idle = Some(Duration::ZERO);
            self.reported_at = None;
            return false;
        }
        // A stall is as old as the last progress, or the last time nothing
        // was in flight, whichever came later.
        let idle = self.idle.map(|idle| idle + elapsed);
        self.idle = idle;
        let stalled = idle.map_or(quiet, |idle| idle.min(quiet));
        if self.reported_at == Some(progress) || stalled < period {
            return false;
        }
        self.reported_at = Some(progress);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::{Stall, hang_message};
    use crate::trace::{Cycle, Diagnostics, Needs};
    use std::time::Duration;

    #[test]
    fn a_report_with_a_cycle_is_called_a_deadlock() {
        let mut report = Diagnostics {
            in_flight: 2,
            resources: Vec::new(),
            waiting_for_units: Vec::new(),
            tracked: Some(Vec::new()),
            quiet: None,
            waits: Vec::new(),
            cycles: Vec::new(),
            in_cycle: Vec::new(),
            freers: Vec::new(),
        };
        let stuck = hang_message(Duration::from_secs(1), &report);
        assert!(stuck.contains("looks stuck") && !stuck.contains("deadlocked"));
        report.cycles.push(Cycle::Ops(vec![
            ("`a`".into(), Needs::Result),
            ("`b`".into(), Needs::Result),
        ]));
        let message = hang_message(Duration::from_secs(1), &report);
        assert!(message.contains("It is deadlocked: the wait cycle is named at the end."));
        assert!(message.contains("deadlock: `a` waits for the result of `b`"));
    }

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn reports_once_per_stall() {
        let mut s = Stall::new();
        let period = 100 * MS;
        // Pending, quiet for less than the period: nothing.
        assert!(!s.look(3, 7, 50 * MS, 25 * MS, period));
        // Quiet for the period: once.
        assert!(s.look(3, 7, 100 * MS, 25 * MS, period));
        assert!(!s.look(3, 7, 125 * MS, 25 * MS, period));
        assert!(!s.look(3, 7, 900 * MS, 25 * MS, period));
        // Progress, then a new stall: again.
        assert!(!s.look(3, 9, 10 * MS, 25 * MS, period));
        assert!(s.look(3, 9, 110 * MS, 25 * MS, period));
    }

    #[test]
    fn a_stall_starts_no_earlier_than_the_last_idle_look() {
        let mut s = Stall::new();
        let period = 100 * MS;
        // Idle for a long time: the last progress was long ago.
        assert!(!s.look(0, 4, 10_000 * MS, 25 * MS, period));
        // An op comes in and waits: pending 25 ms, not a stall yet...
        assert!(!s.look(1, 4, 10_025 * MS, 25 * MS, period));
        assert!(!s.look(1, 4, 10_075 * MS, 50 * MS, period));
        // ...until it has been pending for the period.
        assert!(s.look(1, 4, 10_100 * MS, 25 * MS, period));
        // Nothing in flight forgets the report.
        assert!(!s.look(0, 5, Duration::ZERO, 25 * MS, period));
        assert!(!s.look(1, 5, 50 * MS, 50 * MS, period));
        assert!(s.look(1, 5, 150 * MS, 100 * MS, period));
    }
}
