//! The keeper of a set of communicators ([`Keeper`]): a thread of its own
//! per set that watches NCCL's work while some is in flight, and ends the
//! set when its owner goes.
//!
//! - Watching: after each issue ([`Keeper::nudge`]) it looks at the set
//!   ([`Set::check`]: NCCL's asynchronous errors, then the streams) with a
//!   backoff until the streams are idle, so an error while the bodies
//!   await (a peer's kernel that never ran, a failed stream) aborts every
//!   rank: the kernels quit, the streams drain, and the awaiting bodies,
//!   woken by their stream callbacks or their fences, find the set
//!   aborted. With nothing in flight it sleeps until the next nudge.
//! - Ending: the owner's drop ([`Keeper`]'s) only tells the thread, which
//!   closes the set ([`Set::close`]: settle, finalize, destroy) and
//!   returns. The drop may run where no wait is allowed (a device's
//!   launcher, when the last all-reduce goes right after its push): no
//!   NCCL or CUDA call is made there.
//!
//! Owns the thread and its wake-ups; the set is shared with the owner.

use std::sync::{Arc, Condvar, Mutex, PoisonError};

use super::set::{Backoff, Ranks, Round, Set};

#[derive(Default)]
struct Flags {
    /// Work was issued since the thread last looked.
    nudged: bool,
    /// The owner is gone: close the set and return.
    stop: bool,
}

#[derive(Default)]
struct Wake {
    flags: Mutex<Flags>,
    cv: Condvar,
}

impl Wake {
    fn flags(&self) -> std::sync::MutexGuard<'_, Flags> {
        self.flags.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The keeper thread of one [`Set`] (module docs). Dropping it ends the
/// set on the thread, not on the dropping one.
pub(super) struct Keeper {
    wake: Arc<Wake>,
}

impl Keeper {
    /// Starts the thread (named `name`) keeping `set`.
    pub(super) fn start<R: Ranks>(name: String, set: Arc<Set<R>>) -> std::io::Result<Self> {
        let wake = Arc::new(Wake::default());
        let w = wake.clone();
        std::thread::Builder::new()
            .name(name)
            .spawn(move || keep(&w, &set))?;
        Ok(Self { wake })
    }

    /// Work was issued: watch it until the streams are idle.
    pub(super) fn nudge(&self) {
        self.wake.flags().nudged = true;
        self.wake.cv.notify_one();
    }
}

impl Drop for Keeper {
    fn drop(&mut self) {
        self.wake.flags().stop = true;
        self.wake.cv.notify_one();
    }
}

/// The thread's loop (module docs).
fn keep<R: Ranks>(wake: &Wake, set: &Set<R>) {
    let mut busy = false;
    let mut backoff = Backoff::new();
    loop {
        let stop = {
            let mut flags = wake.flags();
            if !busy {
                flags = wake
                    .cv
                    .wait_while(flags, |f| !f.nudged && !f.stop)
                    .unwrap_or_else(PoisonError::into_inner);
            } else if !flags.nudged && !flags.stop {
                flags = wake
                    .cv
                    .wait_timeout(flags, backoff.next())
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
            }
            if std::mem::take(&mut flags.nudged) {
                busy = true;
                backoff = Backoff::new();
            }
            flags.stop
        };
        if stop {
            set.close();
            return;
        }
        if busy {
            busy = set.check() == Round::Busy;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::set::fake::{Call, Fake, Script};
    use super::*;
    use std::time::{Duration, Instant};

    /// Waits (5 s at most) until `calls` holds `want`.
    fn wait_for(calls: &Mutex<Vec<Call>>, want: impl Fn(&[Call]) -> bool) -> Vec<Call> {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let got = calls.lock().unwrap().clone();
            if want(&got) || Instant::now() > deadline {
                return got;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn a_drop_on_a_launcher_leaves_the_destroy_to_the_keeper() {
        let script = Script {
            // A collective still running when the owner goes.
            busy_for: 50,
            ..Script::default()
        };
        let set = Arc::new(Set::new(Fake::new(2, script)));
        let calls = set.ranks().calls.clone();
        let keeper = Keeper::start("nccl-keeper-test".into(), set.clone()).unwrap();
        keeper.nudge();
        drop(set);
        // As the last all-reduce's closure does on a device's launcher.
        let launcher = std::thread::Builder::new()
            .name("gpu0-launch".into())
            .spawn(move || {
                let start = Instant::now();
                drop(keeper);
                start.elapsed()
            })
            .unwrap();
        let took = launcher.join().unwrap();
        let got = wait_for(&calls, |c| {
            c.iter()
                .any(|c| *c == Call::Destroy(1, "nccl-keeper-test".into()))
        });
        let destroyed: Vec<_> = got
            .iter()
            .filter_map(|c| match c {
                Call::Destroy(r, on) => Some((*r, on.as_str())),
                _ => None,
            })
            .collect();
        assert_eq!(
            destroyed,
            [(0, "nccl-keeper-test"), (1, "nccl-keeper-test")],
            "destroyed on the keeper, not on the launcher: {got:?}"
        );
        // The launcher waited for nothing (the streams were busy for 50
        // looks, with a backoff).
        assert!(took < Duration::from_millis(20), "the drop took {took:?}");
        // Nothing leaked: the keeper dropped the set after closing it.
        let gone = Instant::now() + Duration::from_secs(5);
        while Arc::strong_count(&calls) > 1 && Instant::now() < gone {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(Arc::strong_count(&calls), 1, "the keeper let the set go");
    }

    #[test]
    fn the_keeper_aborts_on_an_async_error_while_a_body_awaits() {
        // The collective never ends (a peer's part never ran); NCCL reports
        // an asynchronous error on rank 0 at its fifth look.
        let script = Script {
            busy_for: usize::MAX,
            async_error: Some((0, 5, "ncclSystemError: unhandled system error")),
            ..Script::default()
        };
        let set = Arc::new(Set::new(Fake::new(2, script)));
        let calls = set.ranks().calls.clone();
        let keeper = Keeper::start("nccl-keeper-test".into(), set.clone()).unwrap();
        keeper.nudge();
        let got = wait_for(&calls, |c| c.contains(&Call::Abort(1)));
        assert!(
            got.contains(&Call::Abort(0)) && got.contains(&Call::Abort(1)),
            "{got:?}"
        );
        assert!(
            !got.iter().any(|c| matches!(c, Call::Synchronize(_))),
            "{got:?}"
        );
        // What the awaiting body reads once woken.
        let why = set.failure().unwrap();
        assert_eq!(why, "rank 0: ncclSystemError: unhandled system error");
        // Idle once aborted: the keeper stops looking.
        let looks = calls.lock().unwrap().len();
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(calls.lock().unwrap().len(), looks, "still polling");
        drop(keeper);
    }
}
