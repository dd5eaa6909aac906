//! Recorded graphs over the no-op host (`dep::testing`): the loom models
//! record and replay real graphs, through the same analysis, runtime,
//! resident tasks and replay op as the engine's, and run what they
//! dispatch on threads of their choosing.

use super::analysis::{Analysed, Recording, analyse};
use super::run::ReplayBody;
use crate::dep::testing::{Handle, Harness, NoopHost};
use crate::dep::{AnyVar, Mode, OpCtx, OpSpec, Var, edges, new_host_id, recorded_edges};
use crate::error::{BoxError, Error};

/// Declares a graph's ops on a [`Harness`] (see [`record`]).
pub struct HarnessRecorder {
    recording: Recording,
    host: u64,
}

impl std::fmt::Debug for HarnessRecorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HarnessRecorder").finish_non_exhaustive()
    }
}

impl HarnessRecorder {
    /// An intermediate of the graph owning `value`.
    pub fn var<T: Send + Sync + 'static>(&mut self, value: T) -> Var<T> {
        Var::intermediate(self.host, value, self.recording.graph, None)
    }

    /// Records an op, as `Recorder::push` does.
    pub fn push(
        &mut self,
        name: &'static str,
        reads: &[&dyn AnyVar],
        mutates: &[&dyn AnyVar],
        f: impl Fn(&OpCtx) -> Result<(), BoxError> + Send + Sync + 'static,
    ) -> Result<(), Error> {
        let edges = recorded_edges(reads, mutates, self.host, self.recording.graph)?;
        let spec = OpSpec::own(edges, name, Mode::Normal);
        let vars: Vec<&dyn AnyVar> = mutates.iter().chain(reads).copied().collect();
        self.recording.push(spec, Box::new(f), &vars);
        Ok(())
    }
}

/// A graph recorded on a [`Harness`].
pub struct HarnessGraph {
    analysed: Analysed<NoopHost>,
    harness: Harness,
}

impl std::fmt::Debug for HarnessGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HarnessGraph").finish_non_exhaustive()
    }
}

/// Records a graph on `harness`, as `Engine::record` does.
pub fn record(
    harness: &Harness,
    f: impl FnOnce(&mut HarnessRecorder) -> Result<(), Error>,
) -> Result<HarnessGraph, Error> {
    let host = harness.host();
    let mut recorder = HarnessRecorder {
        recording: Recording {
            graph: new_host_id(),
            ..Recording::default()
        },
        host: crate::dep::Host::id(&**host),
    };
    f(&mut recorder)?;
    let mut analysed = analyse(recorder.recording, host.clone())?;
    analysed.mutates.push(Box::new(harness.var(())));
    Ok(HarnessGraph {
        analysed,
        harness: harness.clone(),
    })
}

impl HarnessGraph {
    /// Pushes a replay, as `Graph::replay` does; its handle resolves to the
    /// replay's first failure, if any.
    pub fn replay(&self) -> Result<Handle<Option<Error>>, Error> {
        let a = &self.analysed;
        let reads: Vec<&dyn AnyVar> = a.reads.iter().map(|v| &**v).collect();
        let mutates: Vec<&dyn AnyVar> = a.mutates.iter().map(|v| &**v).collect();
        let host = crate::dep::Host::id(&**self.harness.host());
        let spec = OpSpec::own(edges(&reads, &mutates, host)?, "replay", Mode::Maintenance);
        Ok(self
            .harness
            .push_spec(spec, ReplayBody::new(a.runtime.clone())))
    }
}
