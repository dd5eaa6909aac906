//! The in-process all-reduce (`depflow::parallel::AllReduce`, the chunked
//! ring) over 2 and 4 CPU devices (one worker thread each), buffers of 1 KiB
//! to 64 MiB per device, against a plain memcpy of the same size measured in
//! the same run.
//!
//! ```sh
//! cargo bench --bench allreduce            # every size
//! cargo bench --bench allreduce -- 1048576 # one size (bytes)
//! ```
//!
//! Algorithm bandwidth is the buffer's bytes over the time of one
//! all-reduce (push, then wait for every device's result): what a caller
//! sees, as NCCL's tests report `algbw`. Each device moves `2 (n - 1) / n`
//! of the buffer through the ring, plus a pack and an unpack copy of it
//! (the buffer is a variable of its own, the ring's chunks others). The
//! memcpy column copies one buffer of the same size, on one thread (small
//! sizes timed in batches of copies up to 1 MiB). Both are the best of
//! repeated runs over about 0.3 s.

use std::hint::black_box;
use std::time::{Duration, Instant};

use depflow::parallel::{AllReduce, Backend};
use depflow::{Engine, Executor, Var};

/// Repeats `f` until `budget` has passed (at least 3 times), returns the
/// best time of one.
fn best(budget: Duration, mut f: impl FnMut()) -> Duration {
    f(); // warm-up
    let (start, mut best, mut runs) = (Instant::now(), Duration::MAX, 0);
    while runs < 3 || start.elapsed() < budget {
        let t = Instant::now();
        f();
        best = best.min(t.elapsed());
        runs += 1;
    }
    best
}

fn gbps(bytes: usize, t: Duration) -> f64 {
    bytes as f64 / t.as_secs_f64() / 1e9
}

fn main() {
    let only: Option<usize> = std::env::args()
        .skip(1)
        .find(|a| a != "--bench")
        .map(|a| a.parse().expect("a size in bytes"));
    let sizes: Vec<usize> = match only {
        Some(s) => vec![s],
        None => (0..9).map(|i| 1024 << (2 * i)).collect(), // 1 KiB .. 64 MiB
    };
    println!(
        "{:>10} {:>8} {:>12} {:>12} {:>12}",
        "bytes", "devices", "allreduce", "algbw GB/s", "memcpy GB/s"
    );
    for n in [2, 4] {
        let mut b = Engine::builder().threads(1);
        for d in 0..n {
            b = b.device(format!("d{d}"), Executor::pool(1));
        }
        let engine = b.build().expect("engine");
        let devices: Vec<_> = (0..n)
            .map(|d| engine.device(&format!("d{d}")).expect("device"))
            .collect();
        for &bytes in &sizes {
            let len = bytes / 4;
            let grads: Vec<Var<Vec<f32>>> = (0..n).map(|_| engine.var(vec![1.0f32; len])).collect();
            let segments = grads.iter().map(|g| vec![g.clone()]).collect();
            let reduce = AllReduce::new(&engine, &devices, segments, &[len], Backend::Ring)
                .expect("all-reduce");
            let budget = Duration::from_millis(300);
            let t = best(budget, || {
                reduce.push(&engine, 0).expect("push");
                engine.wait_all().wait().expect("all-reduce ran");
            });
            // Small copies are timed in batches (a clock read costs more).
            // The destination starts 256 bytes into its allocation: source
            // and destination 4 KiB apart (as malloc may place them) make
            // the CPU's store forwarding alias, a third of the speed.
            let (src, mut dst) = (vec![1.0f32; len], vec![0.0f32; len + 64]);
            let dst = &mut dst[64..];
            let reps = (1 << 20) / bytes.min(1 << 20);
            let copy = best(budget, || {
                for _ in 0..reps {
                    dst.copy_from_slice(black_box(&src));
                    black_box(&mut *dst);
                }
            }) / reps as u32;
            println!(
                "{bytes:>10} {n:>8} {:>10.1}us {:>12.2} {:>12.2}",
                t.as_secs_f64() * 1e6,
                gbps(bytes, t),
                gbps(bytes, copy)
            );
            drop(reduce);
            drop(grads);
            engine.wait_all().wait().expect("freed");
        }
    }
}
