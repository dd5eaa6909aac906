//! SINGA's CNN (seed 004) on UCI's 8x8 handwritten digits (shipped inside
//! the `smartcore` crate, as in examples/nd_mlp.rs), its training step
//! written once with `nd::nn` and run three ways from the same initial
//! weights on the same batches: eagerly (the step called per batch),
//! recorded in graph mode sequential (`Order::Sequential`: one op at a
//! time, in recorded order) and in graph mode parallel (`nd::record`: any
//! order the dependencies allow). It prints SINGA's table: time per
//! iteration, throughput, peak memory (the graph's planned arena and the
//! process's peak resident set) and each graph mode's memory reduction
//! and speedup against eager.
//!
//! ```text
//! cargo run --release --features nd --example nd_cnn
//! cargo run --release --features nd --example nd_cnn -- --epochs 6   # quicker
//! cargo run --release --features nd --example nd_cnn -- --threads 1
//! cargo run --release --features nd --example nd_cnn -- --dump digits.bin
//! ```
//!
//! # The model, adapted to 8x8 images
//!
//! SINGA's model is for MNIST's 28x28 images: conv 20@5x5 (no padding,
//! 28 → 24), relu, max pool 2 (→ 12), conv 50@5x5 (→ 8), relu, max pool 2
//! (→ 4), linear 4·4·50 = 800 → 500, relu, linear 500 → 10. An unpadded
//! 5x5 convolution would leave 4x4 of an 8x8 digit, and the second one
//! nothing, so here both convolutions pad by 2 (a 5x5 kernel with padding
//! 2 keeps the size): 8x8 → conv 20@5 pad 2 → 8x8 → pool 2 → 4x4 → conv
//! 50@5 pad 2 → 4x4 → pool 2 → 2x2, so the first linear layer takes
//! 2·2·50 = 200 inputs (not 800). Kernels, channels, pooling and the
//! classifier (500 hidden units) are SINGA's.
//!
//! # How each mode is measured
//!
//! Each mode runs in a child process of this example (`--mode eager`,
//! `sequential` or `parallel`, the same executable), so that the peak
//! resident set it reports (`VmHWM` in /proc/self/status, read before the
//! test set is evaluated) is its own. A child also reports the peak of
//! the bytes its heap had allocated at once (a counting allocator around
//! the system's), which is measurable in eager mode too, where there is
//! no plan. The time per iteration is the training loop's (batches fed
//! with `set`, steps, the per-epoch loss read) over its steps; recording
//! the graph is timed apart.
//!
//! The parent checks that the three modes' weights are bit-identical
//! after the same steps (a hash of every parameter's bits) and that each
//! reaches at least `MIN_ACCURACY` on the held-out digits, and exits
//! non-zero otherwise. `--dump PATH` writes the same split digits for
//! benches/torch_cnn.py (PyTorch's side of the comparison) and exits:
//! three little-endian u32 (training samples, test samples, pixels per
//! sample), then the training pixels, training labels, test pixels and
//! test labels as little-endian f32.

use std::alloc::{GlobalAlloc, Layout, System};
use std::process::{Command, ExitCode};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

// The digits split and splitmix64, shared with the data-parallel example.
#[allow(dead_code)]
#[path = "data_parallel/data.rs"]
mod data;

use data::{CLASSES, Data, FEATURES, Rng};
use depflow::nd::nn::{self, Conv2d, Flatten, Linear, MaxPool2d, Module, Relu, Sequential};
use depflow::nd::optim::Adam;
use depflow::{Engine, Error, Executor, Order, nd};

const SIDE: usize = 8;
const BATCH: usize = 64;
const LEARNING_RATE: f32 = 3e-3;
/// The default: 97.8% test accuracy (at least `MIN_ACCURACY` from 5 epochs
/// on), the three modes in about 11 s on 2 cores. CI runs `--epochs 6`.
const EPOCHS: usize = 10;
const SEED: u64 = 13;
const MIN_ACCURACY: f32 = 0.95;
const MODES: [&str; 3] = ["eager", "sequential", "parallel"];

/// The system's allocator, counting the bytes allocated at once and
/// their peak: eager mode's memory, where there is no plan to read.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

impl Counting {
    fn grew(bytes: usize) {
        let live = LIVE.fetch_add(bytes, Relaxed) + bytes;
        PEAK.fetch_max(live, Relaxed);
    }
}

// SAFETY: every method forwards to `System` with the caller's own
// arguments, so `System`'s guarantees are this allocator's; the counters
// only observe sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract for `alloc` is `System.alloc`'s.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            Counting::grew(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for `alloc`.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            Counting::grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by this allocator, so by `System`,
        // with `layout`.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` was allocated by `System` with `layout`, and the
        // caller's contract for `new_size` is `System.realloc`'s.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE.fetch_sub(layout.size(), Relaxed);
            Counting::grew(new_size);
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// What the command line asks for.
struct Args {
    /// Run one mode and report it (a child), or all three (the parent).
    mode: Option<String>,
    epochs: usize,
    /// Threads of the engine's pool (default: one per core).
    threads: Option<usize>,
    dump: Option<String>,
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        mode: None,
        epochs: EPOCHS,
        threads: None,
        dump: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--mode" => a.mode = Some(value()?),
            "--epochs" => a.epochs = value()?.parse().map_err(|e| format!("--epochs: {e}"))?,
            "--threads" => {
                a.threads = Some(value()?.parse().map_err(|e| format!("--threads: {e}"))?)
            }
            "--dump" => a.dump = Some(value()?),
            _ => {
                return Err(format!(
                    "unknown argument {flag}: use --epochs N, --threads N, --dump PATH or --mode \
                     eager|sequential|parallel"
                ));
            }
        }
    }
    if let Some(m) = &a.mode {
        if !MODES.contains(&m.as_str()) {
            return Err(format!("--mode {m}: use eager, sequential or parallel"));
        }
    }
    if a.epochs == 0 || a.threads == Some(0) {
        return Err("--epochs and --threads must be at least 1".into());
    }
    Ok(a)
}

/// SINGA's CNN, its convolutions padded for 8x8 digits (module docs).
fn cnn(arrays: &nd::Arrays) -> Result<Sequential, Error> {
    Ok(Sequential::new()
        .push(Conv2d::new(arrays, 1, 20, 5, 2)?)
        .push(Relu)
        .push(MaxPool2d(2))
        .push(Conv2d::new(arrays, 20, 50, 5, 2)?)
        .push(Relu)
        .push(MaxPool2d(2))
        .push(Flatten)
        .push(Linear::new(arrays, 50 * 2 * 2, 500)?)
        .push(Relu)
        .push(Linear::new(arrays, 500, CLASSES)?))
}

/// The batch and the loss sum: arrays made outside the step.
struct Inputs {
    /// `[BATCH, 1, 8, 8]`.
    x: nd::Array,
    /// One-hot labels, `[BATCH, 10]`.
    y: nd::Array,
    loss: nd::Array,
}

/// One training step: forward, softmax cross-entropy, backward, Adam.
/// The same code runs eagerly or recorded.
fn step(model: &Sequential, adam: &Adam, i: &Inputs) -> Result<(), Error> {
    adam.zero_grad()?;
    let loss = nn::softmax_cross_entropy(&model.forward(&i.x)?, &i.y)?;
    i.loss.add_assign(&loss.detach())?;
    loss.backward()?;
    adam.step()
}

/// What a child reports to the parent, one `key=value` line.
struct Report {
    mode: String,
    per_step: Duration,
    record: Duration,
    arena: Option<usize>,
    unplanned: Option<usize>,
    rss_kib: u64,
    heap_peak: usize,
    hash: u64,
    accuracy: f32,
}

impl Report {
    fn line(&self) -> String {
        let opt = |v: Option<usize>| v.map_or("-".into(), |v| v.to_string());
        format!(
            "REPORT mode={} step_ns={} record_ns={} arena={} unplanned={} rss_kib={} heap_peak={} \
             hash={:016x} accuracy={}",
            self.mode,
            self.per_step.as_nanos(),
            self.record.as_nanos(),
            opt(self.arena),
            opt(self.unplanned),
            self.rss_kib,
            self.heap_peak,
            self.hash,
            self.accuracy
        )
    }

    fn parse(line: &str) -> Option<Report> {
        let fields: std::collections::HashMap<&str, &str> = line
            .strip_prefix("REPORT ")?
            .split(' ')
            .filter_map(|kv| kv.split_once('='))
            .collect();
        let opt = |k| fields.get(k).and_then(|v: &&str| v.parse().ok());
        Some(Report {
            mode: fields.get("mode")?.to_string(),
            per_step: Duration::from_nanos(fields.get("step_ns")?.parse().ok()?),
            record: Duration::from_nanos(fields.get("record_ns")?.parse().ok()?),
            arena: opt("arena"),
            unplanned: opt("unplanned"),
            rss_kib: fields.get("rss_kib")?.parse().ok()?,
            heap_peak: fields.get("heap_peak")?.parse().ok()?,
            hash: u64::from_str_radix(fields.get("hash")?, 16).ok()?,
            accuracy: fields.get("accuracy")?.parse().ok()?,
        })
    }
}

/// This process's peak resident set in KiB (`VmHWM`).
fn peak_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// FNV-1a over every parameter's bits, in the model's order.
fn weights_hash(model: &Sequential) -> Result<u64, Error> {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for p in model.parameters() {
        for v in p.to_vec().wait()? {
            for byte in v.to_bits().to_le_bytes() {
                h = (h ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
            }
        }
    }
    Ok(h)
}

/// Trains in `mode` (a child's work) and reports.
fn run_mode(mode: &str, a: &Args, data: &Data) -> Result<Report, Error> {
    let engine = match a.threads {
        Some(n) => Engine::builder().executor(Executor::pool(n)).build()?,
        None => Engine::new(),
    };
    let arrays = nd::Arrays::new(&engine);
    arrays.seed(SEED)?;
    let model = cnn(&arrays)?;
    let adam = Adam::new(model.parameters(), LEARNING_RATE)?;
    let i = Inputs {
        x: arrays.zeros(&[BATCH, 1, SIDE, SIDE])?,
        y: arrays.zeros(&[BATCH, CLASSES])?,
        loss: arrays.zeros(&[])?,
    };

    let start = Instant::now();
    let graph = match mode {
        "eager" => None,
        "sequential" => Some(engine.record(|rec| {
            rec.order(Order::Sequential);
            nd::recording(rec, || step(&model, &adam, &i))
        })?),
        _ => Some(nd::record(&engine, || step(&model, &adam, &i))?),
    };
    let record = start.elapsed();
    if let Some(g) = &graph {
        println!("{mode}: recorded the step, {} ops", g.ops().len());
    }

    let batches = data.train_y.len() / BATCH;
    let start = Instant::now();
    for epoch in 0..a.epochs {
        let mut order: Vec<usize> = (0..data.train_y.len()).collect();
        Rng(SEED + 1 + epoch as u64).shuffle(&mut order);
        for b in 0..batches {
            let [x, labels]: [Vec<f32>; 2] = data.batch(&order, b, BATCH).try_into().expect("2");
            let mut onehot = vec![0.0; BATCH * CLASSES];
            for (row, &label) in labels.iter().enumerate() {
                onehot[row * CLASSES + label as usize] = 1.0;
            }
            i.x.set(x)?;
            i.y.set(onehot)?;
            match &graph {
                None => step(&model, &adam, &i)?,
                // Not waited for: the next `set` queues behind it.
                Some(g) => drop(g.replay()),
            }
        }
        let loss = i.loss.item()? / batches as f32;
        i.loss.fill(0.0)?;
        println!("{mode} epoch {}: training loss {loss:.4}", epoch + 1);
    }
    engine.wait_all().wait()?;
    let per_step = start.elapsed() / (a.epochs * batches) as u32;
    let (rss_kib, heap_peak) = (peak_rss_kib(), PEAK.load(Relaxed));

    let test_n = data.test_y.len();
    let test_x = arrays.from_vec(data.test_x.clone(), &[test_n, 1, SIDE, SIDE])?;
    let test_y = arrays.from_vec(data.test_y.clone(), &[test_n])?;
    let logits = nd::no_grad(|| model.forward(&test_x))?;
    let accuracy = logits.argmax(1)?.eq(&test_y)?.mean()?.item()?;
    Ok(Report {
        mode: mode.into(),
        per_step,
        record,
        arena: graph.as_ref().map(|g| g.plan().arena_bytes),
        unplanned: graph.as_ref().map(|g| g.plan().total_bytes),
        rss_kib,
        heap_peak,
        hash: weights_hash(&model)?,
        accuracy,
    })
}

/// Writes the split digits for benches/torch_cnn.py (module docs).
fn dump(path: &str, data: &Data) -> std::io::Result<()> {
    let mut bytes = Vec::new();
    for n in [data.train_y.len(), data.test_y.len(), FEATURES] {
        bytes.extend((n as u32).to_le_bytes());
    }
    for part in [&data.train_x, &data.train_y, &data.test_x, &data.test_y] {
        bytes.extend(part.iter().flat_map(|v| v.to_le_bytes()));
    }
    std::fs::write(path, bytes)
}

/// Runs each mode in a child process and prints SINGA's table.
fn compare(a: &Args, train_n: usize) -> Result<bool, String> {
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let mut reports = Vec::new();
    for mode in MODES {
        let mut cmd = Command::new(&exe);
        cmd.args(["--mode", mode, "--epochs", &a.epochs.to_string()]);
        if let Some(n) = a.threads {
            cmd.args(["--threads", &n.to_string()]);
        }
        let out = cmd.output().map_err(|e| format!("{mode}: {e}"))?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        print!("{stdout}");
        eprint!("{}", String::from_utf8_lossy(&out.stderr));
        if !out.status.success() {
            return Err(format!("the {mode} child failed: {}", out.status));
        }
        let report = stdout.lines().find_map(Report::parse);
        reports.push(report.ok_or(format!("the {mode} child printed no report"))?);
    }

    let mib = |bytes: f64| bytes / (1024.0 * 1024.0);
    let eager = &reports[0];
    println!();
    println!(
        "SINGA's CNN on 8x8 digits, batch {BATCH}, Adam lr {LEARNING_RATE}, {} epochs, {} steps \
         per mode, engine threads: {}",
        a.epochs,
        a.epochs * (train_n / BATCH),
        a.threads.map_or("one per core".into(), |n| n.to_string())
    );
    println!(
        "{:<11} {:>10} {:>9} {:>13} {:>14} {:>13} {:>10} {:>8}",
        "mode",
        "ms/iter",
        "images/s",
        "arena MiB",
        "peak RSS MiB",
        "heap peak MiB",
        "reduction",
        "speedup"
    );
    for r in &reports {
        let arena = r
            .arena
            .map_or("n/a".into(), |b| format!("{:.2}", mib(b as f64)));
        let (reduction, speedup) = if r.mode == "eager" {
            ("-".to_string(), "-".to_string())
        } else {
            (
                format!(
                    "{:.1}%",
                    100.0 * (1.0 - r.rss_kib as f64 / eager.rss_kib as f64)
                ),
                format!(
                    "{:.2}x",
                    eager.per_step.as_secs_f64() / r.per_step.as_secs_f64()
                ),
            )
        };
        println!(
            "{:<11} {:>10.3} {:>9.0} {:>13} {:>14.1} {:>13.1} {:>10} {:>8}",
            r.mode,
            r.per_step.as_secs_f64() * 1e3,
            BATCH as f64 / r.per_step.as_secs_f64(),
            arena,
            r.rss_kib as f64 / 1024.0,
            mib(r.heap_peak as f64),
            reduction,
            speedup
        );
    }
    println!(
        "(reduction: of the peak RSS against eager's; speedup: eager's time per iteration over the mode's)"
    );
    for r in &reports[1..] {
        let (arena, all) = (r.arena.unwrap_or(0), r.unplanned.unwrap_or(0));
        println!(
            "{}: recording took {:.1} ms; the step's intermediates add up to {:.2} MiB, planned \
             into a {:.2} MiB arena ({:.1}% less)",
            r.mode,
            r.record.as_secs_f64() * 1e3,
            mib(all as f64),
            mib(arena as f64),
            100.0 * (1.0 - arena as f64 / all.max(1) as f64)
        );
    }
    let same = reports.iter().all(|r| r.hash == eager.hash);
    println!(
        "weights after the same steps bit-identical in all three modes: {same} (hashes {})",
        reports
            .iter()
            .map(|r| format!("{:016x}", r.hash))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let mut ok = same;
    for r in &reports {
        println!(
            "{} test accuracy: {:.1}% (the least accepted: {:.0}%)",
            r.mode,
            r.accuracy * 100.0,
            MIN_ACCURACY * 100.0
        );
        ok &= r.accuracy >= MIN_ACCURACY;
    }
    Ok(ok)
}

fn main() -> ExitCode {
    let a = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("nd_cnn: {e}");
            return ExitCode::FAILURE;
        }
    };
    let data = Data::load(SEED);
    if let Some(path) = &a.dump {
        return match dump(path, &data) {
            Ok(()) => {
                println!("wrote the digits to {path}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("nd_cnn: --dump {path}: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if let Some(mode) = &a.mode {
        return match run_mode(mode, &a, &data) {
            Ok(report) => {
                println!("{}", report.line());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("nd_cnn --mode {mode}: {e}");
                ExitCode::FAILURE
            }
        };
    }
    println!(
        "digits: {} training, {} test samples; SINGA's CNN (convolutions padded for 8x8), batch \
         {BATCH}",
        data.train_y.len(),
        data.test_y.len()
    );
    match compare(&a, data.train_y.len()) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("nd_cnn: the modes' weights differ or an accuracy is too low");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("nd_cnn: {e}");
            ExitCode::FAILURE
        }
    }
}
