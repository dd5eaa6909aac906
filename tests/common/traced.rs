//! Engines that record what they run (a trace, or their ops for
//! diagnostics), and a named op to see in what they record.

use std::sync::mpsc;

use depflow::{AnyVar, Engine, Tracing};

/// An engine of `threads` workers that traces from the start.
pub fn traced_engine(threads: usize) -> Engine {
    Engine::builder()
        .threads(threads)
        .tracing(Tracing::On)
        .build()
        .unwrap()
}

/// An engine of `threads` workers that tracks its ops for its diagnostics.
pub fn tracked_engine(threads: usize) -> Engine {
    Engine::builder()
        .threads(threads)
        .track_ops(true)
        .build()
        .unwrap()
}

/// Pushes an op named `name` mutating `var` that runs until the returned
/// sender sends (it fails if the sender is dropped instead): the ops pushed
/// behind it wait for it, and are unblocked by it.
pub fn held_named_op(engine: &Engine, name: &'static str, var: &dyn AnyVar) -> mpsc::Sender<()> {
    let (open, gate) = mpsc::channel::<()>();
    engine
        .op()
        .name(name)
        .mutates(&[var])
        .run(move |_| Ok(gate.recv()?))
        .unwrap();
    open
}
