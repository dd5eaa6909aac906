//! The hang watchdog's state: its period, what it calls on a hang, when a
//! stall is due for a report ([`Stall`]), and the handle of its thread.
//!
//! The thread itself is the engine's (`engine::diagnostics`): it wakes every
//! quarter period, reads the engine's progress ([`Watchdog::progress`]) and
//! the ops in flight, and reports through [`Watchdog::report`] once per
//! stall. It holds the engine only weakly, and the engine's shutdown stops
//! it ([`Watchdog::stop`]) and joins it: once the shutdown's wait resolves,
//! or as the last handle goes.
//!
//! Progress is ops started or ended, which the op registry counts (`track`),
//! and the runs of a replay's recorded ops, which it does not (a replay is
//! one op to the registry, running all along): a recorded op that starts or
//! ends raises a flag ([`Watchdog::recorded_ran`]), which the next look
//! takes down and counts. The flag costs a recorded op a load and a branch
//! (a store only for the first since the last look), not the registry's
//! lock and a clock read: the look dates it, a tick late at most.
//!
//! Who touches what: the builder makes it; recorded ops raise `recorded`;
//! the watchdog thread (and a report of the engine's diagnostics) takes it
//! down into `seen`, reads the period and calls the callback; the shutdown
//! sets `stopped` and takes the thread's handle, which the builder put in
//! `thread`.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::diag::Diagnostics;
use super::track::Tracker;
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
    /// A recorded op started or ended since `seen` last took it down.
    recorded: AtomicBool,
    /// The recorded ops' progress as the looks saw it.
    seen: Mutex<RecordedSeen>,
}

/// Recorded ops' progress, as seen by the looks that took the flag down.
#[derive(Debug, Default)]
struct RecordedSeen {
    /// Looks that found the flag up: a count that moves when recorded ops
    /// do, added to the registry's.
    looks: u64,
    /// The last such look.
    last: Option<Instant>,
}

impl Watchdog {
    pub(crate) fn new(period: Duration, on_hang: Option<OnHang>) -> Self {
        Self {
            period,
            on_hang,
            stopped: AtomicBool::new(false),
            thread: Mutex::new(None),
            recorded: AtomicBool::new(false),
            seen: Mutex::new(RecordedSeen::default()),
        }
    }

    /// A recorded op of a replay started or ended: progress that the
    /// registry does not count. Every recorded op's start and end calls it,
    /// on the thread that runs it: a load, and a store only if no other
    /// did since the last look (so the flag's cache line is not written by
    /// every op, from every worker).
    #[inline]
    pub(crate) fn recorded_ran(&self) {
        if !self.recorded.load(Ordering::Relaxed) {
            self.recorded.store(true, Ordering::Relaxed);
        }
    }

    /// The engine's progress: how many ops started or ended (the tracker's
    /// count, plus one for each look that found recorded ops had), and how
    /// long ago the last did, as of `now`. Recorded ops are dated by the
    /// look that saw them: up to a tick late, so a hang of a replay is
    /// reported up to a tick later than one of pushed ops.
    pub(crate) fn progress(&self, tracker: &Tracker, now: Instant) -> (u64, Duration) {
        let (ops, quiet) = tracker.progress();
        let mut seen = self.seen.lock();
        // Relaxed: the flag orders nothing; a raise this misses is seen by
        // the next look.
        if self.recorded.swap(false, Ordering::Relaxed) {
            seen.looks += 1;
            seen.last = Some(now);
        }
        let recorded_quiet = seen
            .last
            .map_or(quiet, |last| now.saturating_duration_since(last));
        (ops + seen.looks, quiet.min(recorded_quiet))
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
    use super::{Stall, Watchdog, hang_message};
    use crate::trace::{Cycle, Diagnostics, Needs, Tracker};
    use std::time::{Duration, Instant};

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
    fn recorded_runs_are_progress_once_per_look() {
        let tracker = Tracker::new(Box::new([]));
        let dog = Watchdog::new(100 * MS, None);
        let t0 = Instant::now() + 1000 * MS;
        let (before, _) = dog.progress(&tracker, t0);
        // Any number of runs between two looks: one step of progress, dated
        // by the look.
        dog.recorded_ran();
        dog.recorded_ran();
        let (p, quiet) = dog.progress(&tracker, t0 + 10 * MS);
        assert_eq!((p, quiet), (before + 1, Duration::ZERO));
        // None since: no progress, and quiet since that look at most (the
        // tracker's own quiet is shorter here).
        let (p, quiet) = dog.progress(&tracker, t0 + 30 * MS);
        assert_eq!(p, before + 1);
        assert!(quiet <= 20 * MS, "{quiet:?}");
    }

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
