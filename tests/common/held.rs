//! An op that holds its variable until the test lets it go: what waits,
//! timeouts and queues behind a busy variable are tested against.

use std::sync::mpsc;

use depflow::{AnyVar, BoxError, Engine, OpCtx, OpHandle};

/// Pushes an op mutating `var` that first waits for a send on the returned
/// sender (it fails if the sender is dropped instead), then returns what
/// `then` does.
pub fn held_op<T: Send + 'static>(
    engine: &Engine,
    var: &dyn AnyVar,
    then: impl FnOnce(&OpCtx) -> Result<T, BoxError> + Send + 'static,
) -> (mpsc::Sender<()>, OpHandle<T>) {
    let (release, gate) = mpsc::channel::<()>();
    let op = engine
        .push(&[], &[var], move |ctx| {
            gate.recv()?;
            then(ctx)
        })
        .unwrap();
    (release, op)
}
