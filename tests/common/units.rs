//! Units of a resource held by a variable.

use depflow::{AnyVar, BoxError, Engine, OpCtx, Resource, Var};

/// Makes `var` hold `units` of `resource`: an op that allocates them to it,
/// waited for. The units stay taken until the variable is deleted or freed.
pub fn allocate(engine: &Engine, resource: &Resource, units: u64, var: &dyn AnyVar) {
    engine
        .op()
        .mutates(&[var])
        .allocates(resource, units, var)
        .run(|_| Ok(()))
        .unwrap()
        .wait()
        .unwrap();
}

/// Four loads that each allocate a buffer, pushed before the ops that
/// consume the buffers: each `preprocess` reads its buffer and allocates
/// its output (so it takes its units in push order, after every load), and
/// the buffer's delete comes after it. On 2 units the third load waits for
/// units that only a delete pushed after it gives back, behind a
/// `preprocess` whose turn for units comes after that load: a deadlock,
/// which nothing but a shutdown ends.
pub fn loads_pushed_before_their_consumers(engine: &Engine) -> Vec<Var> {
    let memory = engine.new_resource("memory", 2);
    let ok = |_: &OpCtx| Ok::<_, BoxError>(());
    let bufs: Vec<_> = (0..4)
        .map(|i| engine.var_named(format!("buf{i}"), ()))
        .collect();
    for (i, buf) in bufs.iter().enumerate() {
        engine
            .op()
            .name(format!("load {i}"))
            .mutates(&[buf])
            .allocates(&memory, 1, buf)
            .run(ok)
            .unwrap();
    }
    for (i, buf) in bufs.iter().enumerate() {
        let out = engine.var_named(format!("out{i}"), ());
        engine
            .op()
            .name(format!("preprocess {i}"))
            .reads(&[buf])
            .mutates(&[&out])
            .allocates(&memory, 1, &out)
            .run(ok)
            .unwrap();
        engine.delete_var(buf, drop).unwrap();
    }
    bufs
}

/// An engine deadlocked for good: shut down without waiting for its ops
/// (whatever the test's end), so that dropping it does not hang.
pub struct Abandoned(pub Engine);

impl std::ops::Deref for Abandoned {
    type Target = Engine;
    fn deref(&self) -> &Engine {
        &self.0
    }
}

impl Drop for Abandoned {
    fn drop(&mut self) {
        let _ = self.0.shutdown_timeout(std::time::Duration::from_millis(1));
    }
}
