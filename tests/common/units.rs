//! Units of a resource held by a variable.

use depflow::{AnyVar, Engine, Resource};

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
