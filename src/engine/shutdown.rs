//! The engine's lifetime: the last [`Engine`] handle dropped shuts it down.
//! New pushes are refused, every op already pushed runs to the end, then the
//! executors stop and their threads are joined, and so is the watchdog's
//! thread (which, until then, still reports a drain that hangs).
//! [`Engine::shutdown`]'s wait stops and joins the watchdog's thread as it
//! resolves (`handle::Drained`), the executors' threads stay until the
//! last handle goes.
//!
//! The drop waits for that on its own thread, except where waiting could
//! hang: inside an op (it would wait for that very op; this includes
//! dropping what a skipped or abandoned op's body held), on a thread that
//! runs ops (a pool's worker, an inline or custom executor's job, where an
//! op's output nobody awaited is dropped) or device work (a stream
//! device's stream threads and host functions, its poller): the ops left
//! may need that very thread; inside a tokio runtime (the ops may need
//! that very thread to drive the runtime), and after
//! [`Engine::shutdown_timeout`] gave up. There a helper thread waits and
//! stops the executors, and the drop returns at once.
//!
//! Ops refer to the engine's shared state by pointer (their host), which is
//! sound because that state outlives every pending op: it is freed only once
//! shutdown has waited for them, and the waiting below holds a reference to
//! it until then.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::Engine;
use super::diagnostics::stop_watchdog;
use super::shared::Shared;
use crate::dep::{in_op, reclaim};
use crate::device::on_device_thread;
use crate::error::Error;
use crate::exec::{in_tokio_runtime, on_executor_thread};

/// Shuts the engine down when dropped (by the last engine handle).
pub(super) struct ShutdownOnDrop {
    shared: Arc<Shared>,
    /// A shutdown with a deadline gave up: the drop must not wait either.
    in_background: AtomicBool,
}

impl ShutdownOnDrop {
    pub(super) fn new(shared: Arc<Shared>) -> Self {
        Self {
            shared,
            in_background: AtomicBool::new(false),
        }
    }

    #[inline]
    pub(super) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }
}

impl Drop for ShutdownOnDrop {
    fn drop(&mut self) {
        let shared = self.shared.clone();
        let stop = move || {
            let drained = shared.close_and_drain();
            reclaim::block_on(std::future::poll_fn(|cx| drained.poll_fired(cx)));
            shared.stop_executors();
            stop_watchdog(&shared);
            reclaim::drain();
        };
        // Dropped inside an op (waiting here would wait for this very op),
        // on a thread that runs ops or device work (the ops left may need
        // it), inside an async runtime with ops in flight (they may need
        // this thread to drive it), or after a shutdown gave up waiting: let
        // a helper thread wait for the drain and stop the executors.
        let in_background = self.in_background.load(Ordering::SeqCst)
            || in_op()
            || on_executor_thread()
            || on_device_thread()
            || (in_tokio_runtime() && self.shared.pending.in_flight() != 0);
        if !in_background {
            return stop();
        }
        let keep = self.shared.clone();
        let spawned = std::thread::Builder::new()
            .name("depflow-shutdown".into())
            .spawn(stop);
        if spawned.is_err() {
            // Nowhere to wait: the engine stays up (its ops still finish), so
            // its state must too. The failed spawn dropped the helper's
            // reference; without this one, the last could go with `self`
            // while pending ops still point at the state.
            self.shared.close();
            std::mem::forget(keep);
        }
    }
}

impl Engine {
    /// Shuts the engine down as [`shutdown`](Engine::shutdown) does, and
    /// waits up to `timeout` for the ops pushed before to finish, instead of
    /// hanging on an op that never does.
    ///
    /// If they do not finish in time it returns [`Error::TimedOut`] with the
    /// number of ops still in flight, and from then on the engine's last
    /// handle no longer waits for them when dropped: a helper thread waits
    /// and stops the executors (threads cannot be killed: a stuck op keeps
    /// its thread). Meanwhile [`diagnostics`](Engine::diagnostics) can tell
    /// what is stuck.
    ///
    /// ```
    /// use std::time::Duration;
    /// use depflow::{BoxError, Engine, Error};
    ///
    /// let engine = Engine::new();
    /// let v = engine.new_var();
    /// let (release, gate) = std::sync::mpsc::channel::<()>();
    /// engine.push(&[], &[&v], move |_| -> Result<(), BoxError> { Ok(gate.recv()?) })?;
    /// match engine.shutdown_timeout(Duration::from_millis(10)) {
    ///     Err(Error::TimedOut { in_flight, .. }) => assert_eq!(in_flight, Some(1)),
    ///     other => panic!("{other:?}"),
    /// }
    /// drop(engine); // returns at once; the op is still running
    /// release.send(()).unwrap();
    /// # Ok::<(), Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::TimedOut`]; or, as for [`Wait::wait`](crate::Wait::wait),
    /// [`Error::WaitsForItself`] inside an op and
    /// [`Error::BlockingInRuntime`] inside a tokio runtime while ops are in
    /// flight (the engine is shut down all the same; `.await`
    /// [`shutdown`](Engine::shutdown) there instead).
    pub fn shutdown_timeout(&self, timeout: Duration) -> Result<(), Error> {
        let result = self.shutdown().wait_timeout(timeout);
        if matches!(result, Err(Error::TimedOut { .. })) {
            self.handle.in_background.store(true, Ordering::SeqCst);
        }
        result
    }
}
