//! The engine's lifetime: the last [`Engine`](super::Engine) handle dropped
//! shuts it down. New pushes are refused, every op already pushed runs to
//! the end, then the executors stop and their threads are joined.
//!
//! Ops refer to the engine's shared state by pointer (their host), which is
//! sound because that state outlives every pending op: it is freed only once
//! shutdown has waited for them, and the waiting below holds a reference to
//! it until then.

use std::sync::Arc;

use super::shared::Shared;
use crate::dep::{in_op, reclaim};

/// Shuts the engine down when dropped (by the last engine handle).
pub(super) struct ShutdownOnDrop {
    shared: Arc<Shared>,
}

impl ShutdownOnDrop {
    pub(super) fn new(shared: Arc<Shared>) -> Self {
        Self { shared }
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
            reclaim::drain();
        };
        if !in_op() {
            return stop();
        }
        // Dropped inside an op: waiting here would wait for this very op.
        // Let a helper thread wait for the drain and stop the executors.
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
