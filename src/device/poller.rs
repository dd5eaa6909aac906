//! The poller: one host thread per stream device that watches the events of
//! the ops in flight and completes their fences.
//!
//! Each lane completes in order, so only the oldest event of each lane is
//! queried: a round costs one query per busy lane, however many ops are in
//! flight. A fence whose op waited on the device for other fences of this
//! device (its *parents*) completes after them, so that a parent's failure
//! is known and inherited (the work behind a failed event ran on garbage).
//!
//! Between rounds that complete nothing the poller spins a little, then
//! yields, then sleeps with a doubling timeout up to [`MAX_SLEEP`]; a new
//! fence or a nudge (a simulated stream reached an event) wakes it at once.
//! With nothing in flight it sleeps until a fence arrives.

use std::borrow::Cow;
use std::collections::VecDeque;
use std::sync::Arc;
use std::task::Poll;
use std::thread::JoinHandle;
use std::time::Duration;

use super::{Backend, Fence};
use crate::error::{FailureKind, OpFailure};
use crate::loom::sync::{Condvar, Mutex};

/// Rounds without progress spent spinning, then yielding, before sleeping.
const SPIN_ROUNDS: u32 = 64;
const YIELD_ROUNDS: u32 = 64;
/// The longest sleep between rounds while work is in flight.
pub(crate) const MAX_SLEEP: Duration = Duration::from_micros(200);

/// One op's work in flight.
pub(crate) struct Entry {
    pub(crate) fence: Arc<Fence>,
    /// Fences of this device the work was enqueued behind, not done then.
    pub(crate) parents: Vec<Arc<Fence>>,
    /// The op's body failed (after enqueuing some work, perhaps).
    pub(crate) body_failure: Option<Arc<OpFailure>>,
    /// The op's name, for its failure.
    pub(crate) name: Option<Cow<'static, str>>,
}

#[derive(Default)]
struct State {
    incoming: Vec<Entry>,
    nudged: bool,
    stop: bool,
}

/// Where new fences and nudges reach the poller thread.
#[derive(Default)]
pub(crate) struct Wake {
    state: Mutex<State>,
    cv: Condvar,
}

impl Wake {
    pub(crate) fn new() -> Arc<Self> {
        Arc::default()
    }

    /// A function that wakes the poller (an event was reached).
    pub(crate) fn nudger(self: &Arc<Self>) -> Arc<dyn Fn() + Send + Sync> {
        let wake = self.clone();
        Arc::new(move || {
            wake.lock().nudged = true;
            wake.cv.notify_one();
        })
    }

    fn lock(&self) -> crate::loom::sync::MutexGuard<'_, State> {
        self.state.lock()
    }
}

pub(crate) struct Poller {
    wake: Arc<Wake>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Poller {
    pub(crate) fn start(
        name: &str,
        lanes: usize,
        device: Arc<Backend>,
        wake: Arc<Wake>,
    ) -> std::io::Result<Self> {
        let thread = std::thread::Builder::new()
            .name(format!("{name}-poll"))
            .spawn({
                let wake = wake.clone();
                move || run(&wake, &device, lanes)
            })?;
        Ok(Self {
            wake,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Hands the poller an op's work in flight.
    pub(crate) fn watch(&self, entry: Entry) {
        self.wake.lock().incoming.push(entry);
        self.wake.cv.notify_one();
    }

    /// Stops the thread once what it watches is done, and joins it.
    pub(crate) fn shutdown(&self) {
        self.wake.lock().stop = true;
        self.wake.cv.notify_one();
        let thread = self.thread.lock().take();
        if let Some(t) = thread
            && t.thread().id() != std::thread::current().id()
        {
            let _ = t.join();
        }
    }
}

impl std::fmt::Debug for Poller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Poller").finish_non_exhaustive()
    }
}

fn run(wake: &Wake, device: &Backend, lanes: usize) {
    let _device = super::DeviceThread::enter();
    device.enter_thread();
    let mut in_flight: Vec<VecDeque<Entry>> = (0..lanes).map(|_| VecDeque::new()).collect();
    let mut count = 0usize;
    let mut idle_rounds = 0u32;
    let mut sleep = Duration::from_micros(5);
    loop {
        {
            let mut state = wake.lock();
            loop {
                for e in state.incoming.drain(..) {
                    in_flight[usize::from(e.fence.lane())].push_back(e);
                    count += 1;
                }
                if count > 0 {
                    break;
                }
                if state.stop {
                    return;
                }
                state.nudged = false;
                state = wake.cv.wait(state);
            }
            state.nudged = false;
        }
        let done = round(device, &mut in_flight);
        count -= done;
        if done > 0 {
            idle_rounds = 0;
            sleep = Duration::from_micros(5);
            continue;
        }
        idle_rounds += 1;
        if idle_rounds <= SPIN_ROUNDS {
            std::hint::spin_loop();
        } else if idle_rounds <= SPIN_ROUNDS + YIELD_ROUNDS {
            std::thread::yield_now();
        } else {
            let state = wake.lock();
            if state.incoming.is_empty() && !state.nudged {
                drop(wake.cv.wait_timeout(state, sleep));
                sleep = (sleep * 2).min(MAX_SLEEP);
            }
        }
    }
}

/// Completes what is done at the head of each lane; returns how many.
fn round(device: &Backend, in_flight: &mut [VecDeque<Entry>]) -> usize {
    let mut done = 0;
    for lane in in_flight.iter_mut() {
        while let Some(head) = lane.front() {
            // A dead device runs nothing more: what is in flight fails with
            // the error it died of.
            let outcome = if let Some(error) = device.dead() {
                Err(format!("the device is dead: {error}"))
            } else {
                if head.parents.iter().any(|p| !p.is_done()) {
                    break; // a parent on another lane completes first
                }
                match device.query(head.fence.lane(), head.fence.event()) {
                    Poll::Pending => break,
                    Poll::Ready(r) => r,
                }
            };
            let entry = lane.pop_front().expect("head exists");
            complete(entry, outcome);
            done += 1;
        }
    }
    done
}

fn complete(entry: Entry, outcome: Result<(), String>) {
    let Entry {
        fence,
        parents,
        body_failure,
        name,
    } = entry;
    // In program order: an input's failure, the body's, the device's.
    let inherited = parents.iter().find_map(|p| p.failure());
    let own = || {
        if body_failure.is_some() {
            return body_failure;
        }
        let message = outcome.err().or_else(|| fence.take_fault())?;
        Some(Arc::new(OpFailure::new(name, FailureKind::Device(message))))
    };
    match inherited {
        Some(cause) => fence.complete_inherited(cause),
        None => match own() {
            Some(failure) => fence.complete(Err(failure)),
            None => fence.complete(Ok(())),
        },
    }
}
