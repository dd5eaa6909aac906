//! The poller: one host thread per stream device that watches the events of
//! the ops in flight, completes their fences, and finishes the ops.
//!
//! Each lane completes in order, so only the oldest event of each lane is
//! queried: a round costs one query per busy lane, however many ops are in
//! flight. A fence whose op waited on the device for other fences of this
//! device (its *parents*) completes after them, so that a parent's failure
//! is known and inherited (the work behind a failed event ran on garbage).
//!
//! Completing a fence wakes its waiters (host ops, other devices' ops),
//! then finishes the op itself here, on this thread: its task is run inline
//! (see [`take_inline`]) rather than sent back to the device's launcher,
//! where one body that blocks (a copy from pageable memory, a synchronise)
//! would hold up every completion.
//!
//! Between rounds that complete nothing the poller sleeps, with a timeout
//! doubling from [`MIN_SLEEP`] up to [`MAX_SLEEP`]; it spins, then yields,
//! before sleeping only while some fence in flight has a waiter (a host
//! consumer, whose latency it is), and a new fence, a nudge (a simulated
//! stream reached an event) or a first waiter wakes it and starts the
//! backoff again. With nothing in flight it sleeps until a fence arrives.

use std::borrow::Cow;
use std::cell::Cell;
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicIsize, Ordering::Relaxed};
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

use super::{Backend, Deferred, Fence, FenceFailure, Threads};
use crate::error::{FailureKind, OpFailure, VarId};
use crate::loom::sync::{Condvar, Mutex};

/// Rounds without progress spent spinning, then yielding, before sleeping,
/// while a fence in flight has a waiter.
const SPIN_ROUNDS: u32 = 64;
const YIELD_ROUNDS: u32 = 64;
/// The first and the longest sleep between rounds while work is in flight.
pub(crate) const MIN_SLEEP: Duration = Duration::from_micros(5);
pub(crate) const MAX_SLEEP: Duration = Duration::from_micros(200);

/// One op's work in flight.
pub(crate) struct Entry {
    pub(crate) fence: Arc<Fence>,
    /// Fences of this device the work was enqueued behind, not done then,
    /// each with the variable it is the last write to (the first the op
    /// touches, in its edges' order): a failed parent's failure is the
    /// op's, inherited through that variable.
    pub(crate) parents: Vec<(Arc<Fence>, VarId)>,
    /// The op's body failed (after enqueuing some work, perhaps).
    pub(crate) body_failure: Option<Arc<OpFailure>>,
    /// The op's name, for its failure.
    pub(crate) name: Option<Cow<'static, str>>,
    /// The op's own task, woken (and run here) once the fence completes.
    pub(crate) owner: Option<Waker>,
    /// What the body handed to `Stream::drop_after`: dropped here once the
    /// work is done, before the fence completes.
    pub(crate) deferred: Vec<Deferred>,
}

#[derive(Default)]
struct State {
    incoming: Vec<Entry>,
    /// Values to drop on the poller's thread ([`Wake::defer`]).
    dropping: Vec<Deferred>,
    /// The poller thread has returned: it drops nothing more.
    exited: bool,
    /// Something happened that a sleeping poller should look at: an event
    /// reached, a first waiter.
    nudged: bool,
    stop: bool,
}

/// Where new fences and nudges reach the poller thread.
#[derive(Default)]
pub(crate) struct Wake {
    /// The device's name.
    name: Arc<str>,
    state: Mutex<State>,
    cv: Condvar,
    /// Fences in flight with a waiter: counted up by their first waiter
    /// (`Watch::first_waiter`), down by their completion (either may come
    /// first, hence signed).
    waited: AtomicIsize,
    #[cfg(test)]
    stats: Stats,
}

impl Wake {
    pub(crate) fn new(name: &str) -> Arc<Self> {
        Arc::new(Self {
            name: name.into(),
            ..Self::default()
        })
    }

    /// The device's name.
    pub(crate) fn name(&self) -> &Arc<str> {
        &self.name
    }

    /// Drops `value` on the poller's thread, which keeps the device's
    /// context current (see `context`), soon; or hands it back if the
    /// poller has exited (the device was shut down), for the caller to
    /// drop. A panic of its drop is caught there and printed: the poller
    /// must go on, and no op is left to fail.
    pub(crate) fn defer(&self, value: Deferred) -> Result<(), Deferred> {
        let mut state = self.lock();
        if state.exited {
            return Err(value);
        }
        state.dropping.push(value);
        drop(state);
        self.cv.notify_one();
        Ok(())
    }

    /// A function that wakes the poller (an event was reached).
    pub(crate) fn nudger(self: &Arc<Self>) -> Arc<dyn Fn() + Send + Sync> {
        let wake = self.clone();
        Arc::new(move || wake.nudge())
    }

    fn nudge(&self) {
        self.lock().nudged = true;
        self.cv.notify_one();
    }

    /// A first waiter registered on a fence of this device.
    pub(crate) fn waiter(&self) {
        self.waited.fetch_add(1, Relaxed);
        self.nudge();
    }

    fn lock(&self) -> crate::loom::sync::MutexGuard<'_, State> {
        self.state.lock()
    }
}

crate::loom::thread::thread_local! {
    /// The poller is waking an op it completed: run it here (see
    /// [`take_inline`]).
    static INLINE: Cell<bool> = const { Cell::new(false) };
}

/// Whether the op being dispatched is one this thread, a poller, just
/// completed: then the executor runs it at once, here, rather than on the
/// device's launcher. True once per completion, so that what the op's end
/// makes ready is dispatched as usual.
pub(crate) fn take_inline() -> bool {
    INLINE.try_with(|i| i.replace(false)).unwrap_or(false)
}

/// Wakes `owner`, an op whose fence just completed, to run it here: its
/// task's schedule function dispatches it, and the executor sees
/// [`take_inline`]. (If the task is running elsewhere, async-task schedules
/// it from there once it returns, and it runs on the launcher.)
fn finish_here(owner: Waker) {
    INLINE.with(|i| i.set(true));
    owner.wake();
    INLINE.with(|i| i.set(false));
}

pub(crate) struct Poller {
    wake: Arc<Wake>,
    thread: Arc<Threads>,
}

impl Poller {
    pub(crate) fn start(
        name: &str,
        lanes: usize,
        device: Arc<Backend>,
        wake: Arc<Wake>,
    ) -> std::io::Result<Self> {
        let thread = Arc::new(Threads::default());
        thread.spawn(format!("{name}-poll"), {
            let wake = wake.clone();
            move || run(&wake, &device, lanes)
        })?;
        Ok(Self { wake, thread })
    }

    /// Hands the poller an op's work in flight.
    pub(crate) fn watch(&self, entry: Entry) {
        self.wake.lock().incoming.push(entry);
        self.wake.cv.notify_one();
    }

    /// Stops the thread once what it watches is done, and joins it, waiting
    /// until `deadline` at most (see `Threads::join`).
    pub(crate) fn shutdown(&self, deadline: Instant) {
        self.wake.lock().stop = true;
        self.wake.cv.notify_one();
        self.thread.join(Some(deadline));
    }
}

impl std::fmt::Debug for Poller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Poller").finish_non_exhaustive()
    }
}

/// What the poller does between rounds that complete nothing.
#[derive(Debug, PartialEq, Eq)]
enum Pause {
    Spin,
    Yield,
    Sleep(Duration),
}

/// The backoff between idle rounds (module docs).
struct Backoff {
    idle_rounds: u32,
    sleep: Duration,
}

impl Backoff {
    fn new() -> Self {
        Self {
            idle_rounds: 0,
            sleep: MIN_SLEEP,
        }
    }

    /// Progress, or new work: start again.
    fn reset(&mut self) {
        *self = Self::new();
    }

    /// The pause after one more idle round; `waited`: a fence in flight has
    /// a waiter.
    fn next(&mut self, waited: bool) -> Pause {
        self.idle_rounds = self.idle_rounds.saturating_add(1);
        if waited && self.idle_rounds <= SPIN_ROUNDS {
            Pause::Spin
        } else if waited && self.idle_rounds <= SPIN_ROUNDS + YIELD_ROUNDS {
            Pause::Yield
        } else {
            let sleep = self.sleep;
            self.sleep = (sleep * 2).min(MAX_SLEEP);
            Pause::Sleep(sleep)
        }
    }
}

fn run(wake: &Arc<Wake>, device: &Backend, lanes: usize) {
    let _device = super::DeviceThread::enter();
    let _context = super::context::enter(wake);
    device.enter_thread();
    let mut in_flight: Vec<VecDeque<Entry>> = (0..lanes).map(|_| VecDeque::new()).collect();
    let mut count = 0usize;
    let mut backoff = Backoff::new();
    loop {
        let dropping = {
            let mut state = wake.lock();
            loop {
                if !state.incoming.is_empty() {
                    backoff.reset();
                }
                for e in state.incoming.drain(..) {
                    in_flight[usize::from(e.fence.lane())].push_back(e);
                    count += 1;
                }
                if count > 0 || !state.dropping.is_empty() {
                    break;
                }
                if state.stop {
                    // From now on `defer` hands values back to their
                    // senders; none is left here (checked just above).
                    state.exited = true;
                    return;
                }
                state.nudged = false;
                state = wake.cv.wait(state);
            }
            if std::mem::take(&mut state.nudged) {
                backoff.reset();
            }
            std::mem::take(&mut state.dropping)
        };
        drop_deferred(wake, dropping);
        if count == 0 {
            continue;
        }
        let done = round(device, wake, &mut in_flight);
        count -= done;
        if done > 0 {
            backoff.reset();
            continue;
        }
        let pause = backoff.next(wake.waited.load(Relaxed) > 0);
        #[cfg(test)]
        wake.stats.record(&pause);
        match pause {
            Pause::Spin => std::hint::spin_loop(),
            Pause::Yield => std::thread::yield_now(),
            Pause::Sleep(sleep) => {
                let state = wake.lock();
                if state.incoming.is_empty() && state.dropping.is_empty() && !state.nudged {
                    drop(wake.cv.wait_timeout(state, sleep));
                }
            }
        }
    }
}

/// Drops the values handed to [`Wake::defer`], each on its own: a panic
/// is printed (no op is left to fail with it) and the others still go.
fn drop_deferred(wake: &Wake, dropping: Vec<Deferred>) {
    for value in dropping {
        let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(value)));
        if let Err(p) = dropped {
            eprintln!(
                "depflow: a variable's value, dropped on device {:?}'s poller, panicked: {}",
                wake.name,
                crate::error::panic_message(p.as_ref())
            );
        }
    }
}

/// Completes what is done at the head of each lane; returns how many.
fn round(device: &Backend, wake: &Wake, in_flight: &mut [VecDeque<Entry>]) -> usize {
    let mut done = 0;
    for lane in in_flight.iter_mut() {
        while let Some(head) = lane.front() {
            // A dead device runs nothing more: what is in flight fails with
            // the error it died of.
            let outcome = if let Some(error) = device.dead() {
                Err(format!("the device is dead: {error}"))
            } else {
                if head.parents.iter().any(|(p, _)| !p.is_done()) {
                    break; // a parent on another lane completes first
                }
                match device.query(head.fence.lane(), head.fence.event()) {
                    Poll::Pending => break,
                    Poll::Ready(r) => r,
                }
            };
            let entry = lane.pop_front().expect("head exists");
            complete(entry, outcome, wake);
            done += 1;
        }
    }
    done
}

fn complete(entry: Entry, outcome: Result<(), String>, wake: &Wake) {
    let Entry {
        fence,
        parents,
        body_failure,
        name,
        owner,
        deferred,
    } = entry;
    // The work is over (or the device dead): the values the body handed on
    // may go, on this thread (which keeps a CUDA context current). A panic
    // there fails the op, unless something else did.
    let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(deferred)))
        .err()
        .map(|p| {
            format!(
                "a value handed to drop_after panicked when dropped: {}",
                crate::error::panic_message(p.as_ref())
            )
        });
    // In program order: an input's failure, the body's, the device's.
    let inherited = parents.iter().find_map(|(p, input)| {
        Some(FenceFailure::Inherited {
            input: *input,
            cause: p.failure()?.into_cause(),
        })
    });
    let own = || {
        if body_failure.is_some() {
            return body_failure;
        }
        let message = outcome.err().or_else(|| fence.take_fault()).or(dropped)?;
        Some(Arc::new(OpFailure::new(name, FailureKind::Device(message))))
    };
    match inherited {
        Some(inherited) => fence.complete(Err(inherited)),
        None => match own() {
            Some(failure) => fence.complete(Err(FenceFailure::Own(failure))),
            None => fence.complete(Ok(())),
        },
    }
    if fence.was_waited() {
        wake.waited.fetch_sub(1, Relaxed);
    }
    drop(parents);
    if let Some(owner) = owner {
        finish_here(owner);
    }
}

/// What the poller did between idle rounds (unit tests).
#[cfg(test)]
#[derive(Default)]
struct Stats {
    spins: std::sync::atomic::AtomicU64,
    /// Sleeps, the last one's length in µs, and the shortest ones.
    sleeps: std::sync::atomic::AtomicU64,
    last_sleep_us: std::sync::atomic::AtomicU64,
    min_sleeps: std::sync::atomic::AtomicU64,
}

#[cfg(test)]
impl Stats {
    fn record(&self, pause: &Pause) {
        match pause {
            Pause::Spin | Pause::Yield => {
                self.spins.fetch_add(1, Relaxed);
            }
            Pause::Sleep(d) => {
                self.last_sleep_us.store(d.as_micros() as u64, Relaxed);
                self.sleeps.fetch_add(1, Relaxed);
                if *d == MIN_SLEEP {
                    self.min_sleeps.fetch_add(1, Relaxed);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering::Relaxed;
    use std::sync::mpsc;
    use std::task::{Context, Waker};
    use std::time::{Duration, Instant};

    use super::*;
    use crate::device::{Spec, StreamDevice};

    /// Waits up to 10 s for `cond` (a hang bound, not a timing check).
    fn eventually(what: &str, cond: impl Fn() -> bool) {
        let end = Instant::now() + Duration::from_secs(10);
        while !cond() {
            assert!(Instant::now() < end, "never: {what}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// A simulated device with a fence in flight on lane 0 that cannot
    /// complete until the returned sender is dropped.
    fn held() -> (StreamDevice, Arc<Fence>, mpsc::Sender<()>) {
        let dev = StreamDevice::new("poller-test", &Spec::Sim { compute: 1 }).unwrap();
        let (tx, rx) = mpsc::channel::<()>();
        dev.backend
            .enqueue_host(
                0,
                Box::new(move || {
                    let _ = rx.recv();
                }),
            )
            .unwrap();
        let fence = Arc::new(watched(&dev));
        (dev, fence, tx)
    }

    /// A fence recorded after lane 0's work so far, watched by the poller.
    fn watched(dev: &StreamDevice) -> Fence {
        let event = dev.backend.new_event().unwrap();
        dev.backend.record(0, &event).unwrap();
        Fence::new(0, 0, event)
    }

    fn watch(dev: &StreamDevice, fence: &Arc<Fence>) {
        dev.poller.watch(Entry {
            fence: fence.clone(),
            parents: Vec::new(),
            body_failure: None,
            name: None,
            owner: None,
            deferred: Vec::new(),
        });
    }

    fn stats(dev: &StreamDevice) -> &Stats {
        &dev.poller.wake.stats
    }

    #[test]
    fn the_poller_spins_only_while_a_fence_has_a_waiter() {
        let (dev, fence, open) = held();
        watch(&dev, &fence);
        eventually("a few sleeps", || stats(&dev).sleeps.load(Relaxed) >= 4);
        assert_eq!(stats(&dev).spins.load(Relaxed), 0, "spun with no waiter");
        // A host consumer waits for the fence: now latency matters.
        let mut cx = Context::from_waker(Waker::noop());
        assert!(fence.poll_done(&mut cx).is_pending());
        eventually("spins", || stats(&dev).spins.load(Relaxed) > 0);
        drop(open);
        eventually("the fence completes", || fence.is_done());
        assert_eq!(dev.poller.wake.waited.load(Relaxed), 0);
    }

    #[test]
    fn new_work_resets_the_pollers_backoff() {
        let (dev, fence, open) = held();
        watch(&dev, &fence);
        let max = MAX_SLEEP.as_micros() as u64;
        eventually("the longest sleep", || {
            stats(&dev).last_sleep_us.load(Relaxed) == max
        });
        let short = stats(&dev).min_sleeps.load(Relaxed);
        let second = Arc::new(watched(&dev));
        watch(&dev, &second);
        eventually("a short sleep after the new fence", || {
            stats(&dev).min_sleeps.load(Relaxed) > short
        });
        drop(open);
        eventually("both complete", || second.is_done());
    }

    #[test]
    fn the_backoff_spins_and_yields_only_for_waiters() {
        let mut b = Backoff::new();
        assert_eq!(b.next(false), Pause::Sleep(MIN_SLEEP));
        assert_eq!(b.next(false), Pause::Sleep(MIN_SLEEP * 2));
        b.reset();
        assert_eq!(b.next(true), Pause::Spin);
        for _ in 1..SPIN_ROUNDS {
            assert_eq!(b.next(true), Pause::Spin);
        }
        assert_eq!(b.next(true), Pause::Yield);
        for _ in 0..20 {
            b.next(false);
        }
        assert_eq!(b.next(false), Pause::Sleep(MAX_SLEEP));
    }
}
