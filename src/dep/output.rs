//! An op's result as its task stores it ([`Output`]), and the failures of
//! values dropped after their op retired ([`take_late_failures`]).
//!
//! The task keeps the value an op's body returned until its handle takes
//! it. If the handle was dropped first, the task drops the value, on the
//! thread that ran the op, after the op retired; `async-task` does that
//! under a guard that aborts the process on a panic. So the value is
//! wrapped: its drop catches a panic and keeps it as a failure of the op
//! for its engine's next `wait_all` (the engine itself may be gone by then:
//! it is kept by engine id, and dropped with the engine).

use std::borrow::Cow;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use super::block::OpBlock;
use crate::error::{FailureKind, OpFailure, panic_message};

/// The value an op's body returned, as its task keeps it.
pub(crate) struct Output<T> {
    value: Option<T>,
    /// The op's engine, and its name for a failure (kept only for values
    /// whose drop runs code).
    engine: u64,
    name: Option<Cow<'static, str>>,
}

impl<T> Output<T> {
    #[inline]
    pub(crate) fn new(value: T, op: &OpBlock, engine: u64) -> Self {
        Self {
            value: Some(value),
            engine,
            name: if std::mem::needs_drop::<T>() {
                op.failure_name()
            } else {
                None
            },
        }
    }

    /// The value, for the op's handle.
    #[inline]
    pub(crate) fn into_inner(mut self) -> T {
        self.value.take().expect("an output holds its value")
    }
}

impl<T> Drop for Output<T> {
    fn drop(&mut self) {
        if !std::mem::needs_drop::<T>() {
            return;
        }
        let Some(value) = self.value.take() else {
            return;
        };
        if let Err(payload) = catch_unwind(AssertUnwindSafe(|| drop(value))) {
            let kind = FailureKind::Panic(format!(
                "while its output, which nobody awaited, was dropped: {}",
                panic_message(payload.as_ref())
            ));
            record_late(
                self.engine,
                Arc::new(OpFailure::new(self.name.take(), kind)),
            );
        }
    }
}

/// Failures recorded after their op retired, by engine id.
static LATE: Mutex<Vec<(u64, Arc<OpFailure>)>> = Mutex::new(Vec::new());
/// `LATE` may hold something: so that taking costs one load while it is
/// empty.
static ANY_LATE: AtomicBool = AtomicBool::new(false);

fn record_late(engine: u64, failure: Arc<OpFailure>) {
    let mut late = LATE.lock().unwrap_or_else(PoisonError::into_inner);
    late.push((engine, failure));
    ANY_LATE.store(true, Ordering::Release);
}

/// Takes the failures of engine `engine` recorded after their op retired (a
/// panic dropping an output nobody awaited), oldest first.
pub(crate) fn take_late_failures(engine: u64) -> Vec<Arc<OpFailure>> {
    if !ANY_LATE.load(Ordering::Acquire) {
        return Vec::new();
    }
    let mut late = LATE.lock().unwrap_or_else(PoisonError::into_inner);
    let mut taken = Vec::new();
    late.retain(|(e, failure)| {
        let ours = *e == engine;
        if ours {
            taken.push(failure.clone());
        }
        !ours
    });
    if late.is_empty() {
        ANY_LATE.store(false, Ordering::Release);
    }
    taken
}
