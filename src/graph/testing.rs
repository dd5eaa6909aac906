//! Recorded graphs over the no-op host (`dep::testing`): the loom models
//! record and replay real graphs, through the same analysis, runtime,
//! resident tasks and replay op as the engine's, and run what they
//! dispatch on threads of their choosing.

// Not every part serves both the loom models and the unit tests.
#![allow(dead_code)]

use super::analysis::{Analysed, Recording, analyse};
use super::run::ReplayBody;
use crate::dep::testing::{Handle, Harness, NoopHost};
use crate::dep::{AnyVar, Mode, OpCtx, OpSpec, Var, distinct_edges, new_host_id, recorded_edges};
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
        let host = crate::dep::Host::id(&**self.harness.host());
        let edges = distinct_edges(&a.reads, &a.mutates, host)?;
        let spec = OpSpec::own(edges, "replay", Mode::Replay);
        Ok(self
            .harness
            .push_spec(spec, ReplayBody::new(a.runtime.clone())))
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// A graph recorded on the no-op host replays through its runtime: a
    /// root runs in the replay's op, the other waits for a runner, the join
    /// runs where the last of them ends; the replay resolves once all have.
    #[test]
    fn a_replay_on_the_no_op_host_runs_every_op_once() {
        let h = Harness::new();
        let a = h.var(1u64);
        let ka = a.key();
        let graph = record(&h, |rec| {
            let (t1, t2) = (rec.var(0u64), rec.var(0u64));
            let (k1, k2) = (t1.key(), t2.key());
            rec.push("left", &[&a], &[&t1], move |ctx| {
                *ctx.write(k1)? = *ctx.read(ka)? + 1;
                Ok(())
            })?;
            rec.push("right", &[&a], &[&t2], move |ctx| {
                *ctx.write(k2)? = *ctx.read(ka)? + 2;
                Ok(())
            })?;
            rec.push("join", &[&t1, &t2], &[&a], move |ctx| {
                *ctx.write(ka)? = *ctx.read(k1)? * *ctx.read(k2)?;
                Ok(())
            })
        })
        .unwrap();
        for want in [6, 56] {
            let replay = graph.replay().unwrap();
            while h.run_one() {}
            assert!(replay.wait().unwrap().is_none());
            let get = h
                .push("get", &[&a], &[], move |ctx| Ok(*ctx.read(ka)?))
                .unwrap();
            h.run_one();
            assert_eq!(get.wait().unwrap(), want);
        }
        assert!(h.failures().is_empty());
    }
}
