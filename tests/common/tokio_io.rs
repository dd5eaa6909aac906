//! Engines with a device on a tokio runtime (feature `tokio`).

use depflow::{Device, Engine, Executor};

/// An engine of one host worker and a device "io" that spawns its ops on
/// `runtime`, and that device.
pub fn io_engine(runtime: &tokio::runtime::Handle) -> (Engine, Device) {
    let engine = Engine::builder()
        .threads(1)
        .device("io", Executor::tokio(runtime.clone()))
        .build()
        .unwrap();
    let io = engine.device("io").unwrap();
    (engine, io)
}
