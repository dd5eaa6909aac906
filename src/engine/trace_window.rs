//! Tracing an engine: [`Tracing`] (whether it can record, and from when),
//! and the [`Engine`] calls that open and close a window and take the
//! [`Trace`].

use super::Engine;
use crate::error::Error;
use crate::trace::{EngineInfo, Trace, assemble};

/// Whether an engine records a [`Trace`] of its ops, and from when
/// ([`EngineBuilder::tracing`](crate::EngineBuilder::tracing)).
///
/// `Off` costs nothing beyond one predictable branch per lifecycle step of
/// an op (the same branch as [`track_ops`](crate::EngineBuilder::track_ops)
/// being off). `Paused` builds the recorder in but records only between
/// [`Engine::start_trace`] and [`Engine::stop_trace`]: a window of a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Tracing {
    /// No recorder (the default).
    #[default]
    Off,
    /// A recorder that waits for [`Engine::start_trace`].
    Paused,
    /// A recorder that records from the start.
    On,
}

impl Engine {
    fn recorder_or_err(&self) -> Result<&crate::trace::Recorder, Error> {
        self.shared().recorder().ok_or_else(|| {
            Error::Config(
                "this engine does not trace: build it with `EngineBuilder::tracing`".into(),
            )
        })
    }

    /// Forgets what was recorded and records from now on, until
    /// [`stop_trace`](Self::stop_trace): a window of the run.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] if the engine was built with [`Tracing::Off`].
    ///
    /// ```
    /// use depflow::{Engine, Error, Tracing};
    ///
    /// let engine = Engine::builder().tracing(Tracing::Paused).build()?;
    /// let v = engine.new_var();
    /// engine.op().name("warm-up").mutates(&[&v]).run(|_| Ok(()))?.wait()?;
    /// engine.start_trace()?;
    /// engine.op().name("step").mutates(&[&v]).run(|_| Ok(()))?.wait()?;
    /// engine.stop_trace()?;
    /// let trace = engine.trace()?;
    /// let names: Vec<_> = trace.ops().iter().map(|op| op.name()).collect();
    /// assert_eq!(names, [Some("step")]);
    /// # Ok::<(), Error>(())
    /// ```
    pub fn start_trace(&self) -> Result<(), Error> {
        let recorder = self.recorder_or_err()?;
        recorder.set_on(false);
        recorder.clear();
        recorder.set_on(true);
        Ok(())
    }

    /// Stops recording; what was recorded stays, for [`trace`](Self::trace).
    ///
    /// # Errors
    ///
    /// [`Error::Config`] if the engine was built with [`Tracing::Off`].
    pub fn stop_trace(&self) -> Result<(), Error> {
        self.recorder_or_err()?.set_on(false);
        Ok(())
    }

    /// What was recorded so far (recording goes on if it is on). Ops still
    /// in flight appear with the steps they went through; wait for them
    /// first (say with [`wait_all`](Self::wait_all)) for a whole picture.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] if the engine was built with [`Tracing::Off`].
    ///
    /// ```
    /// use depflow::{Engine, Error, Tracing};
    ///
    /// let engine = Engine::builder().threads(2).tracing(Tracing::On).build()?;
    /// let (a, b) = (engine.new_var(), engine.new_var());
    /// engine.op().name("produce").mutates(&[&a]).run(|_| Ok(()))?;
    /// engine.op().name("consume").reads(&[&a]).mutates(&[&b]).run(|_| Ok(()))?;
    /// engine.wait_all().wait()?;
    ///
    /// let trace = engine.trace()?;
    /// let [produce, consume] = trace.ops() else { panic!() };
    /// assert!(consume.started() >= produce.ended());
    /// assert_eq!(consume.reads(), [a.id()]);
    /// # Ok::<(), Error>(())
    /// ```
    pub fn trace(&self) -> Result<Trace, Error> {
        let recorder = self.recorder_or_err()?;
        let shared = self.shared();
        let info = EngineInfo {
            start: recorder.epoch(),
            devices: shared.devices.iter().map(|d| d.name.clone()).collect(),
            resources: shared
                .broker
                .pools()
                .into_iter()
                .map(|p| (p.name, p.capacity))
                .collect(),
        };
        Ok(assemble(recorder.snapshot(), info))
    }
}
