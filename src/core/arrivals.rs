//! Arrivals: `n` parties that each arrive once, from any thread (a GPU's
//! stream callback, say), the first failure among them, and the one task
//! that awaits the last arrival.
//!
//! The count and the waker meet as in [`futures`' `AtomicWaker`] pattern:
//! the awaiting task registers its waker, then reads the count; a party
//! decrements the count, and the one that takes it to zero wakes the
//! registered waker. Either the task's read sees zero, or the last party's
//! wake finds the waker: no lost wake-up. A failure is stored (under a
//! short lock) before the party's decrement, so the task, which reads the
//! failure after it saw zero, sees every party's. Used by the NCCL
//! all-reduce (`parallel/nccl.rs`), whose body awaits one callback per GPU.
//!
//! [`futures`' `AtomicWaker`]: https://docs.rs/futures/latest/futures/task/struct.AtomicWaker.html

use std::task::{Context, Poll};

use crate::loom::future::AtomicWaker;
use crate::loom::sync::Mutex;
use crate::loom::sync::atomic::{AtomicUsize, Ordering::*};

/// `n` parties to arrive, the first failure `F` among them, and the task
/// awaiting the last.
#[derive(Debug)]
pub struct Arrivals<F> {
    left: AtomicUsize,
    waker: AtomicWaker,
    failed: Mutex<Option<F>>,
}

impl<F> Arrivals<F> {
    /// `n` parties to come.
    pub fn new(n: usize) -> Self {
        Self {
            left: AtomicUsize::new(n),
            waker: AtomicWaker::default(),
            failed: Mutex::new(None),
        }
    }

    /// One party arrives, with its failure if it failed (the first one is
    /// kept); the last one wakes the awaiting task.
    pub fn arrive(&self, failure: Option<F>) {
        if let Some(f) = failure {
            self.failed.lock().get_or_insert(f);
        }
        if self.left.fetch_sub(1, AcqRel) == 1 {
            self.waker.wake();
        }
    }

    /// Ready with the first failure (taken) once every party arrived;
    /// otherwise registers `cx`'s waker, which the last party wakes.
    pub fn poll_arrived(&self, cx: &mut Context<'_>) -> Poll<Option<F>> {
        self.waker.register(cx.waker());
        if self.left.load(Acquire) == 0 {
            Poll::Ready(self.failed.lock().take())
        } else {
            Poll::Pending
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn the_last_arrival_wakes_the_task_with_the_first_failure() {
        let arrivals = Arc::new(Arrivals::new(3));
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        arrivals.arrive(None);
        assert!(arrivals.poll_arrived(&mut cx).is_pending());
        arrivals.arrive(Some("first"));
        assert!(arrivals.poll_arrived(&mut cx).is_pending());
        arrivals.arrive(Some("second"));
        assert_eq!(arrivals.poll_arrived(&mut cx), Poll::Ready(Some("first")));
    }

    #[test]
    fn parties_on_other_threads_wake_a_blocked_task() {
        for n in 1..=4 {
            let arrivals = Arc::new(Arrivals::<()>::new(n));
            let parties: Vec<_> = (0..n)
                .map(|_| {
                    let a = arrivals.clone();
                    std::thread::spawn(move || a.arrive(None))
                })
                .collect();
            let got =
                futures::executor::block_on(std::future::poll_fn(|cx| arrivals.poll_arrived(cx)));
            assert_eq!(got, None);
            parties.into_iter().for_each(|t| t.join().unwrap());
        }
    }
}
