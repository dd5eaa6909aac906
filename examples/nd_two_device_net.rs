//! Seed 000's case study on arrays (`depflow::nd`): a two-layer network
//! trained on two devices (CPU devices "gpu0" and "gpu1", one worker thread
//! each), one half of every batch each, written as the seed writes it: the
//! weights live on the CPU and are copied to each device; each device runs
//! forward, the loss gradient (softmax cross-entropy) and backward on its
//! half; the gradients are copied to the CPU and added; the CPU updates its
//! weights and copies them back. The program is serial; the engine runs it
//! in parallel as the arrays' reads and writes allow.
//!
//! ```text
//! cargo run --release --features nd --example nd_two_device_net
//! ```
//!
//! The data, sizes and initial weights are examples/two_device_net.rs's
//! (that one writes the same net with `parallel::Group` and hand-written
//! kernels). It trains on the threaded engine, then runs the same program
//! on an engine whose devices all run ops inline (serially, on the pushing
//! thread), and exits non-zero unless the weights are bit-identical. It
//! prints the code lines of both versions.

use std::time::Instant;

use depflow::{Engine, Error, Executor, nd};

const SAMPLES: usize = 4096;
const INPUTS: usize = 256;
const HIDDEN: usize = 512;
const CLASSES: usize = 10;
const BATCH: usize = 512;
const HALF: usize = BATCH / 2;
const ITERATIONS: usize = 60;
const LEARNING_RATE: f32 = 0.5;

/// splitmix64, for the same synthetic data as two_device_net.rs.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// `rows x cols` values uniform in [-scale, scale).
    fn matrix(&mut self, rows: usize, cols: usize, scale: f32) -> Vec<f32> {
        let mut uniform = || (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0;
        (0..rows * cols).map(|_| uniform() * scale).collect()
    }
}

/// Trains `ITERATIONS` steps; the CPU's weights and both devices' copies.
fn train(engine: &Engine, verbose: bool) -> Result<Vec<Vec<f32>>, Error> {
    let cpu = nd::Arrays::new(engine);
    let gpus = ["gpu0", "gpu1"].map(|d| engine.device(d).expect("built with it"));
    // Inputs, and one-hot labels from a fixed random linear teacher.
    let mut rng = Rng(7);
    let data = cpu.from_vec(rng.matrix(SAMPLES, INPUTS, 1.0), &[SAMPLES, INPUTS])?;
    let teacher = cpu.from_vec(rng.matrix(INPUTS, CLASSES, 1.0), &[INPUTS, CLASSES])?;
    let classes = data.matmul(&teacher)?.argmax(1)?.reshape(&[SAMPLES, 1])?;
    let label = classes.eq(&cpu.arange(CLASSES)?)?;
    let mut rng = Rng(7 ^ 0xDEAD_BEEF);
    let glorot = |n, m| (6.0 / (n + m) as f32).sqrt();
    let w1 = rng.matrix(INPUTS, HIDDEN, glorot(INPUTS, HIDDEN));
    let fc1_weight = cpu.from_vec(w1, &[INPUTS, HIDDEN])?;
    let w2 = rng.matrix(HIDDEN, CLASSES, glorot(HIDDEN, CLASSES));
    let fc2_weight = cpu.from_vec(w2, &[HIDDEN, CLASSES])?;
    let copies = |w: &nd::Array| gpus.iter().map(|&g| w.to(g)).collect::<Result<Vec<_>, _>>();
    let (fc1_weights, fc2_weights) = (copies(&fc1_weight)?, copies(&fc2_weight)?); // [gpu0], [gpu1]
    let start = Instant::now();
    for i in 0..ITERATIONS {
        let (mut fc1_wgrads, mut fc2_wgrads, mut losses) = (vec![], vec![], vec![]);
        for (d, &gpu) in gpus.iter().enumerate() {
            let (fc1_w, fc2_w) = (&fc1_weights[d], &fc2_weights[d]);
            let rows = i * BATCH % SAMPLES + d * HALF..i * BATCH % SAMPLES + (d + 1) * HALF;
            let x = data.slice_axis(0, rows.clone())?.to(gpu)?; // data[gpu].copyfrom(...)
            let y = label.slice_axis(0, rows)?.to(gpu)?;
            let fc1 = x.matmul(fc1_w)?.relu()?;
            let fc2 = fc1.matmul(fc2_w)?;
            // LossGrad: softmax cross-entropy, averaged over the whole batch.
            let fc2_ograd = (fc2.softmax(1)? - &y) / BATCH as f32;
            losses.push(-(fc2.log_softmax(1)? * &y).sum()? / HALF as f32);
            // FullcBackward twice (ReLU's gradient folded into the first).
            fc2_wgrads.push(fc1.t()?.matmul(&fc2_ograd)?);
            let fc1_ograd = fc2_ograd.matmul(&fc2_w.t()?)? * fc1.gt_scalar(0.0)?;
            fc1_wgrads.push(x.t()?.matmul(&fc1_ograd)?);
        }
        // Aggregate on the CPU, update, copy back: layer 2 first, as it is
        // ready first.
        for (weight, copies, grads) in [
            (&fc2_weight, &fc2_weights, &fc2_wgrads),
            (&fc1_weight, &fc1_weights, &fc1_wgrads),
        ] {
            let wgrad = grads[0].to(cpu.device())? + grads[1].to(cpu.device())?;
            weight.sub_assign(&(wgrad * LEARNING_RATE))?;
            for copy in copies {
                weight.copy_to(copy)?;
            }
        }
        if verbose && (i % 10 == 0 || i == ITERATIONS - 1) {
            let loss = (&losses[0] + &losses[1].to(gpus[0])?) / 2.0;
            println!("  iteration {i:>3}: loss {:.4}", loss.item()?);
        }
    }
    let all = [&fc1_weight, &fc2_weight]
        .into_iter()
        .chain(&fc1_weights)
        .chain(&fc2_weights);
    let all = all
        .map(|w| w.to_vec().wait())
        .collect::<Result<Vec<_>, _>>()?;
    let ms = start.elapsed().as_secs_f64() * 1e3 / ITERATIONS as f64;
    println!("  {ms:.1} ms per iteration");
    Ok(all)
}

/// Lines that are neither blank nor comments.
fn code_lines(source: &str) -> usize {
    let code = |l: &&str| !l.trim().is_empty() && !l.trim().starts_with("//");
    source.lines().filter(code).count()
}

fn main() -> Result<(), Error> {
    println!(
        "Two-layer net ({INPUTS}-{HIDDEN}-{CLASSES}) on arrays, batch {BATCH} split over two \
         CPU devices, {ITERATIONS} iterations"
    );
    let parallel = Engine::builder()
        .executor(Executor::pool(1))
        .device("gpu0", Executor::pool(1))
        .device("gpu1", Executor::pool(1))
        .build()?;
    println!("engine (three devices, one thread each):");
    let got = train(&parallel, true)?;
    let serial = Engine::builder()
        .executor(Executor::inline())
        .device("gpu0", Executor::inline())
        .device("gpu1", Executor::inline())
        .build()?;
    println!("the same program, every device inline (serial):");
    let want = train(&serial, false)?;
    let bits = |ws: &[Vec<f32>]| {
        ws.concat()
            .into_iter()
            .map(f32::to_bits)
            .collect::<Vec<_>>()
    };
    let same = bits(&got) == bits(&want);
    let copies_agree =
        got[2..4].iter().all(|c| *c == got[0]) && got[4..].iter().all(|c| *c == got[1]);
    println!(
        "weights bit-identical to the serial run: {same}; device copies equal the CPU's: {copies_agree}"
    );
    println!(
        "code lines (not blank, not comments): this file {}, examples/two_device_net.rs {}",
        code_lines(include_str!("nd_two_device_net.rs")),
        code_lines(include_str!("two_device_net.rs"))
    );
    assert!(
        same && copies_agree,
        "the engine must give the serial program's weights"
    );
    Ok(())
}
