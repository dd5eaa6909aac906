//! The engine's own cost per op, deterministically: ops pushed to an engine
//! whose only device is the inline executor, so that push, run and free
//! happen on one thread, in one order. Meant for instruction counts:
//!
//! ```sh
//! cargo bench --bench push_cost --no-run   # then, for KIND in chain read2 builder typed:
//! valgrind --tool=callgrind target/release/deps/push_cost-* KIND 10000
//! valgrind --tool=callgrind target/release/deps/push_cost-* KIND 20000
//! ```
//!
//! The difference of the two totals, divided by 10 000, is the cost of one
//! op from push to free (the program's fixed costs cancel out). `chain`:
//! `Engine::push` mutating one variable; `read2`: reading one and mutating
//! another; `builder`: the same through `engine.op()`; `typed`: the same
//! through typed access (`engine.op().with(..)`). A third argument,
//! `traced`, records a trace of every op (`Tracing::On`): what recording
//! costs per op.

use depflow::{Engine, Executor, Tracing};

fn main() {
    let mut args = std::env::args().skip(1).filter(|a| a != "--bench");
    let kind = args.next().unwrap_or_else(|| "chain".into());
    let n: usize = args.next().map_or(10_000, |n| n.parse().expect("N"));
    let tracing = match args.next().as_deref() {
        Some("traced") => Tracing::On,
        None => Tracing::Off,
        Some(other) => panic!("unknown option {other}: traced"),
    };
    let engine = Engine::builder()
        .executor(Executor::inline())
        .tracing(tracing)
        .build()
        .expect("engine");
    let vars: Vec<_> = (0..64).map(|_| engine.var(0u64)).collect();
    let k0 = vars[0].key();
    for i in 0..n {
        let (r, w) = (&vars[i % 64], &vars[(i + 1) % 64]);
        let (rk, wk) = (r.key(), w.key());
        let pushed = match kind.as_str() {
            "chain" => engine.push(&[], &[&vars[0]], move |ctx| {
                *ctx.write(k0)? += 1;
                Ok(())
            }),
            "read2" => engine.push(&[r], &[w], move |ctx| {
                let a = *ctx.read(rk)?;
                *ctx.write(wk)? += a;
                Ok(())
            }),
            "builder" => engine.op().reads(&[r]).mutates(&[w]).run(move |ctx| {
                let a = *ctx.read(rk)?;
                *ctx.write(wk)? += a;
                Ok(())
            }),
            "typed" => engine
                .op()
                .with((depflow::read(r), depflow::write(w)))
                .run(|(r, w)| {
                    *w += *r;
                    Ok(())
                }),
            other => panic!("unknown kind {other}: chain, read2, builder or typed"),
        };
        drop(pushed.expect("push"));
    }
    engine.wait_all().wait().expect("ops");
}
