//! The programs of seed 000 ("Dependency Engine for Deep Learning"), written
//! serially and run in parallel by the engine. Each op sleeps a little and
//! prints when it starts and ends, so the parallelism is visible:
//!
//! ```text
//! cargo run --example seed_program
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use depflow::{AnyVar, Engine, Error, OpCtx, Var, VarKey};

/// Pushes `out = f(inputs)`, named `name`, reporting its start and end.
fn op(
    engine: &Engine,
    clock: &Arc<Instant>,
    name: &'static str,
    inputs: &[&Var<i64>],
    out: &Var<i64>,
    f: fn(&[i64]) -> i64,
) -> Result<(), Error> {
    let keys: Vec<VarKey<i64>> = inputs.iter().map(|v| v.key()).collect();
    let decl: Vec<&dyn AnyVar> = inputs.iter().map(|v| *v as &dyn AnyVar).collect();
    let (out_key, clock) = (out.key(), clock.clone());
    engine
        .op()
        .name(name)
        .reads(&decl)
        .mutates(&[out])
        .run(move |ctx: &OpCtx| {
            let start = clock.elapsed();
            let args: Vec<i64> = keys
                .iter()
                .map(|k| ctx.read(*k).map(|v| *v))
                .collect::<Result<_, _>>()?;
            std::thread::sleep(Duration::from_millis(100));
            let value = f(&args);
            *ctx.write(out_key)? = value;
            let end = clock.elapsed();
            let thread = std::thread::current();
            println!(
                "  {name:<10} ran {:>4} ms .. {:>4} ms on {:<16} -> {value}",
                start.as_millis(),
                end.as_millis(),
                thread.name().unwrap_or("?"),
            );
            Ok(())
        })?;
    Ok(())
}

fn value(engine: &Engine, var: &Var<i64>) -> Result<i64, Error> {
    let key = var.key();
    engine
        .push(&[var], &[], move |ctx| Ok(*ctx.read(key)?))?
        .wait()
}

fn main() -> Result<(), Error> {
    let engine = Engine::builder().threads(4).build()?;

    println!("Program 1: B = A + 1; C = A + 2; D = B * C");
    println!("  (B and C only read A: they run at the same time; D waits for both)");
    let clock = Arc::new(Instant::now());
    let (a, b, c, d) = (engine.var(2), engine.var(0), engine.var(0), engine.var(0));
    op(&engine, &clock, "B = A + 1", &[&a], &b, |x| x[0] + 1)?;
    op(&engine, &clock, "C = A + 2", &[&a], &c, |x| x[0] + 2)?;
    op(&engine, &clock, "D = B * C", &[&b, &c], &d, |x| x[0] * x[1])?;
    engine.wait_all().wait()?;
    println!(
        "  D = {} after {} ms (serially: 300 ms)\n",
        value(&engine, &d)?,
        clock.elapsed().as_millis()
    );

    println!("Program 2: B = A + 1; C = A + 2; A = C * 2; D = A + 3");
    println!("  (A = C * 2 mutates A: it waits for both reads of A before it)");
    let clock = Arc::new(Instant::now());
    let (a, b, c, d) = (engine.var(2), engine.var(0), engine.var(0), engine.var(0));
    op(&engine, &clock, "B = A + 1", &[&a], &b, |x| x[0] + 1)?;
    op(&engine, &clock, "C = A + 2", &[&a], &c, |x| x[0] + 2)?;
    op(&engine, &clock, "A = C * 2", &[&c], &a, |x| x[0] * 2)?;
    op(&engine, &clock, "D = A + 3", &[&a], &d, |x| x[0] + 3)?;
    engine.wait_all().wait()?;
    println!(
        "  A = {}, B = {}, C = {}, D = {} after {} ms (serially: 400 ms)",
        value(&engine, &a)?,
        value(&engine, &b)?,
        value(&engine, &c)?,
        value(&engine, &d)?,
        clock.elapsed().as_millis()
    );
    println!(
        "  versions: A {} (one mutation), B {}, C {}, D {}",
        a.version(),
        b.version(),
        c.version(),
        d.version()
    );
    Ok(())
}
