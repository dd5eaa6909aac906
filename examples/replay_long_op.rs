//! A replay of a root op and four ops on it, one 10 ms and three 1 ms
//! (recorded first, the long one), against the same ops pushed, on 2
//! threads. Ideal: 10 ms per step. The README's section on recorded graphs
//! quotes it: the second replay measures its ops, and from the third on the
//! long op is woken onto the pool instead of run by the thread that keeps
//! the 1 ms ones, which would hold them back behind it.
//!
//! ```text
//! cargo run --release --example replay_long_op
//! ```
use std::time::{Duration, Instant};

use depflow::{BoxError, Engine};

fn spin(d: Duration) {
    let t = Instant::now();
    while t.elapsed() < d {
        std::hint::spin_loop();
    }
}

fn main() -> Result<(), depflow::Error> {
    let engine = Engine::builder().threads(2).build()?;
    let root = engine.new_var();
    let outs: Vec<_> = (0..4).map(|_| engine.new_var()).collect();
    let durs = [10_000u64, 1000, 1000, 1000];
    let graph = engine.record(|rec| {
        rec.op().mutates(&[&root]).run(|_| Ok::<(), BoxError>(()))?;
        for (o, &d) in outs.iter().zip(&durs) {
            rec.op().reads(&[&root]).mutates(&[o]).run(move |_| {
                spin(Duration::from_micros(d));
                Ok::<(), BoxError>(())
            })?;
        }
        Ok::<(), depflow::Error>(())
    })?;
    for round in 0..3 {
        let t = Instant::now();
        for _ in 0..20 {
            graph.replay().wait()?;
        }
        let replay = t.elapsed() / 20;
        let t = Instant::now();
        for _ in 0..20 {
            engine.push(&[], &[&root], |_| Ok::<(), BoxError>(()))?;
            for (o, &d) in outs.iter().zip(&durs) {
                engine.push(&[&root], &[o], move |_| {
                    spin(Duration::from_micros(d));
                    Ok::<(), BoxError>(())
                })?;
            }
            engine.wait_all().wait()?;
        }
        let pushed = t.elapsed() / 20;
        println!(
            "round {round}: replay {replay:?} per step, pushed {pushed:?} per step (ideal 10 ms)"
        );
    }
    Ok(())
}
