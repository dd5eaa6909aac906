//! The double-buffered pipeline of seed 003 (OneFlow, "Resource Dependency",
//! Figure 2), with counted resources and no control edges.
//!
//! Each batch goes through four stages: load, pre-process, host-to-device copy
//! and compute, the slowest. The first three stages each own two buffers: a
//! [`Resource`] of 2 units and a pool of two real `Vec<f32>`s. A stage's op
//! `allocates` one unit into the batch's fresh output variable and fills it
//! with a pooled buffer; once the next stage has read it, `delete_var` gives
//! the unit back and its callback returns the buffer to the pool.
//!
//! All 32 batches are pushed at once, as a plain serial program: no op names
//! another batch. Yet in the steady state every stage runs at the pace of
//! compute: a stage whose two buffers are full waits for its consumer to free
//! one (back-pressure). So the copy of batch `b` waits on compute of batch
//! `b - 2`, and the loader on compute of `b - 6`: the "counter-intuitive
//! dependencies" that, the article says, control edges cannot express.
//!
//! ```text
//! cargo run --release --example pipeline
//! cargo run --release --example pipeline -- --trace target/pipeline
//! ```
//!
//! With `--trace PATH` it runs 12 batches (a picture of 32 would be too
//! dense to read), with the engine recording a trace, and writes it as
//! `PATH.json` (Chrome trace-event JSON: open it in ui.perfetto.dev) and
//! `PATH.svg` (a timeline to open in a browser); an extension on `PATH` is
//! replaced.
//!
//! Work is simulated by sleeping, so the pacing shows on few cores. All it
//! prints is measured: per stage, the mean op time, the steady-state period
//! between completions, how far it ran ahead of compute, and the most buffers
//! it held (counted by its pool, and sampled with [`Resource::in_use`] by the
//! ops and by the main thread); then the total time against the serial sum and
//! against `batches x slowest stage`. It checks the model against a serial run.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use depflow::{Engine, Error, OpHandle, Resource, Tracing, Var};

const BATCHES: usize = 32;
/// Batches of a traced run (`--trace`).
const TRACED_BATCHES: usize = 12;
const BUFFERS: u64 = 2;
const LEN: usize = 4096;
const THREADS: usize = 4;
const COMPUTE: usize = 3;

type Buf = Var<Vec<f32>>;
type Res<T = ()> = Result<T, Error>;

// The real work of the first three stages, shared with the serial reference.
type StageFn = fn(usize, &[f32], &mut Vec<f32>);
fn load(b: usize, _: &[f32], out: &mut Vec<f32>) {
    out.extend((0..LEN).map(|i| ((b * 31 + i * 7) % 97) as f32));
}
fn preprocess(_: usize, x: &[f32], out: &mut Vec<f32>) {
    out.extend(x.iter().map(|v| (v - 48.0) / 16.0));
}
fn copy(_: usize, x: &[f32], out: &mut Vec<f32>) {
    out.extend_from_slice(x);
}
/// Compute. Order-sensitive: running the batches out of order would show.
fn step(model: f64, x: &[f32]) -> f64 {
    x.iter().fold(model, |acc, &v| acc * 0.999 + f64::from(v))
}

/// One stage: its simulated op time, its buffer pool (unused by compute) and
/// what its ops measured.
#[derive(Default)]
struct Stage {
    name: &'static str,
    work: Duration,
    f: Option<StageFn>,
    /// The free buffers. An op finding none allocates a third: nothing blocks
    /// here, only the engine paces the stages; `peak` would show the excess.
    free: Mutex<Vec<Vec<f32>>>,
    held: AtomicU64,
    peak: AtomicU64,
    /// The most units of the stage's resource in use, seen from its ops.
    peak_in_use: AtomicU64,
    /// (start, end) of each op body, from `t0`.
    spans: Mutex<Vec<(Duration, Duration)>>,
    /// Max over batches `b` of `b - (batches computed when its op for b began)`.
    ahead: AtomicUsize,
}

impl Stage {
    /// The columns "peak buffers" and "peak in_use"; none may exceed BUFFERS.
    fn peaks(&self, main: u64) -> [String; 2] {
        let (peak, ops) = (self.peak.load(SeqCst), self.peak_in_use.load(SeqCst));
        let worst = peak.max(ops).max(main);
        assert!(worst <= BUFFERS, "{}: {peak}, {ops} / {main}", self.name);
        [peak.to_string(), format!("{ops} / {main}")]
    }
}

struct Trace {
    t0: Instant,
    stages: [Stage; 4],
    resources: [Resource; 3],
    computed: AtomicUsize,
}

impl Trace {
    /// Runs an op body of stage `s` for batch `b`: the real work, then a sleep.
    fn timed<T>(&self, s: usize, b: usize, work: impl FnOnce() -> T) -> T {
        let (stage, start) = (&self.stages[s], self.t0.elapsed());
        let ahead = b - self.computed.load(SeqCst);
        stage.ahead.fetch_max(ahead, SeqCst);
        let result = work();
        std::thread::sleep(stage.work);
        if s == COMPUTE {
            self.computed.fetch_add(1, SeqCst);
        }
        stage.spans.lock().unwrap().push((start, self.t0.elapsed()));
        result
    }

    fn take(&self, s: usize) -> Vec<f32> {
        let stage = &self.stages[s];
        let held = stage.held.fetch_add(1, SeqCst) + 1;
        stage.peak.fetch_max(held, SeqCst);
        let in_use = self.resources[s].in_use();
        stage.peak_in_use.fetch_max(in_use, SeqCst);
        let mut buffer = stage.free.lock().unwrap().pop().unwrap_or_default();
        buffer.clear();
        buffer
    }

    fn give(&self, s: usize, buffer: Vec<f32>) {
        self.stages[s].free.lock().unwrap().push(buffer);
        self.stages[s].held.fetch_sub(1, SeqCst);
    }
}

/// Pushes the op of stage `s` for batch `b`: it reads `input` (if any),
/// allocates one of the stage's buffers into `out` and fills it.
fn stage(e: &Engine, t: &Arc<Trace>, s: usize, b: usize, input: Option<&Buf>, out: &Buf) -> Res {
    let reads: Vec<&dyn depflow::AnyVar> = input.iter().map(|v| *v as _).collect();
    let (input, out_key, t) = (input.map(Var::key), out.key(), t.clone());
    let f = t.stages[s].f.expect("a stage with buffers");
    let outs: [&dyn depflow::AnyVar; 1] = [out];
    let op = e.op().name(format!("{} {b}", t.stages[s].name));
    let op = op.reads(&reads).mutates(&outs);
    op.allocates(&t.resources[s], 1, out).run(move |ctx| {
        t.timed(s, b, || {
            let mut buffer = t.take(s);
            match input {
                Some(k) => f(b, &ctx.read(k)?, &mut buffer),
                None => f(b, &[], &mut buffer),
            }
            *ctx.write(out_key)? = buffer;
            Ok(())
        })
    })?;
    Ok(())
}

/// Deletes the output of stage `s` after its reader: the unit goes back to the
/// resource, the buffer to the pool.
fn recycle(e: &Engine, t: &Arc<Trace>, s: usize, v: &Buf) -> Res<OpHandle<()>> {
    let t = t.clone();
    e.delete_var(v, move |buffer| t.give(s, buffer))
}

/// The `--trace PATH` argument, if given.
fn trace_path() -> Res<Option<PathBuf>> {
    let mut args = std::env::args().skip(1);
    match (args.next().as_deref(), args.next(), args.next()) {
        (None, _, _) => Ok(None),
        (Some("--trace"), Some(path), None) => Ok(Some(PathBuf::from(path))),
        _ => Err(Error::Config(
            "usage: pipeline [--trace PATH]  (writes PATH.json and PATH.svg)".into(),
        )),
    }
}

fn main() -> Res {
    let trace_to = trace_path()?;
    let (batches, tracing) = match trace_to {
        Some(_) => (TRACED_BATCHES, Tracing::On),
        None => (BATCHES, Tracing::Off),
    };
    let engine = Engine::builder()
        .threads(THREADS)
        .tracing(tracing)
        .build()?;
    let new = |name, micros, f| Stage {
        name,
        work: Duration::from_micros(micros),
        f,
        free: Mutex::new((0..BUFFERS).map(|_| Vec::with_capacity(LEN)).collect()),
        ..Stage::default()
    };
    let stages = [
        new("load", 1000, Some(load as StageFn)),
        new("preprocess", 1500, Some(preprocess)),
        new("copy h2d", 1000, Some(copy)),
        new("compute", 4000, None),
    ];
    let names = ["load buffers", "pre buffers", "device buffers"];
    let resources = names.map(|n| engine.new_resource(n, BUFFERS));
    let computed = AtomicUsize::new(0);
    let trace = Arc::new(Trace {
        t0: Instant::now(),
        stages,
        resources,
        computed,
    });
    let model = engine.var(0.0f64);

    // The serial program, every batch pushed at once.
    let mut last = None;
    for b in 0..batches {
        let [l, p, d] = [(); 3].map(|()| engine.var(Vec::new()));
        let (e, t) = (&engine, &trace);
        stage(e, t, 0, b, None, &l)?;
        stage(e, t, 1, b, Some(&l), &p)?;
        recycle(e, t, 0, &l)?;
        stage(e, t, 2, b, Some(&p), &d)?;
        recycle(e, t, 1, &p)?;
        let (tc, x, m) = (trace.clone(), d.key(), model.key());
        let op = engine.op().name(format!("compute {b}"));
        op.reads(&[&d]).mutates(&[&model]).run(move |ctx| {
            tc.timed(COMPUTE, b, || {
                let mut model = ctx.write(m)?;
                *model = step(*model, &ctx.read(x)?);
                Ok(())
            })
        })?;
        last = Some(recycle(e, t, 2, &d)?);
    }
    let pushed = trace.t0.elapsed();

    // Sample the resources from the main thread while the pipeline runs.
    let (mut sampled, last) = ([0u64; 3], last.expect("a batch"));
    while !last.is_finished() {
        for (max, r) in sampled.iter_mut().zip(&trace.resources) {
            *max = (*max).max(r.in_use());
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    engine.wait_all().wait()?;
    let total = trace.t0.elapsed();

    let pushed = ms(pushed);
    println!("{batches} batches pushed in {pushed:.2} ms, {THREADS} threads\n");
    println!("stage       mean op  period  ahead of     peak   peak in_use");
    println!("               (ms)    (ms)   compute  buffers  (ops / main)");
    let (mut serial, mut slowest) = (Duration::ZERO, Duration::ZERO);
    for (s, stage) in trace.stages.iter().enumerate() {
        let spans = stage.spans.lock().unwrap();
        assert_eq!(spans.len(), batches);
        let busy: Duration = spans.iter().map(|(start, end)| *end - *start).sum();
        serial += busy;
        slowest = slowest.max(busy / batches as u32);
        // The steady state: the median gap between completions, middle half.
        let mut ends: Vec<f64> = spans.iter().map(|(_, end)| ms(*end)).collect();
        ends.sort_by(f64::total_cmp);
        let middle = &ends[batches / 4..3 * batches / 4];
        let mut gaps: Vec<f64> = middle.windows(2).map(|w| w[1] - w[0]).collect();
        gaps.sort_by(f64::total_cmp);
        let (period, ahead) = (gaps[gaps.len() / 2], stage.ahead.load(SeqCst));
        let [peak, in_use] = match s {
            COMPUTE => ["-".into(), "-".into()],
            _ => stage.peaks(sampled[s]),
        };
        let (name, mean) = (stage.name, ms(busy) / batches as f64);
        println!("{name:<11}{mean:>8.2}{period:>8.2}{ahead:>10}{peak:>9}{in_use:>14}");
    }
    println!("(ahead of compute: max over b of b - batches computed when its op for b began)");
    let (total, serial, bound) = (ms(total), ms(serial), ms(slowest * batches as u32));
    let (speedup, ratio) = (serial / total, total / bound);
    println!("\ntotal {total:.1} ms; serial sum {serial:.1} ms ({speedup:.2}x the total)");
    println!("batches x slowest stage {bound:.1} ms (the total is {ratio:.2}x that)");

    // The pipeline computed what a serial run computes, and gave all back.
    let m = model.key();
    let got = engine.op().name("read model").reads(&[&model]);
    let got = got.run(move |ctx| Ok(*ctx.read(m)?))?;
    let (got, mut expected) = (got.wait()?, 0.0);
    for b in 0..batches {
        let (mut l, mut p, mut d) = (Vec::new(), Vec::new(), Vec::new());
        load(b, &[], &mut l);
        preprocess(b, &l, &mut p);
        copy(b, &p, &mut d);
        expected = step(expected, &d);
    }
    assert_eq!(got, expected, "the model differs from a serial run");
    for (stage, r) in trace.stages.iter().zip(&trace.resources) {
        let free = stage.free.lock().unwrap().len() as u64;
        assert_eq!((r.in_use(), free), (0, BUFFERS), "{}", stage.name);
    }
    println!("check: ok (model = {got}, as a serial run gives)");
    if let Some(path) = trace_to {
        let trace = engine.trace()?;
        let (json, svg) = (path.with_extension("json"), path.with_extension("svg"));
        trace.write_chrome_json(&json)?;
        trace.write_svg(&svg)?;
        let (n, json, svg) = (trace.ops().len(), json.display(), svg.display());
        println!("trace of {n} ops: {json} (open in ui.perfetto.dev) and {svg}");
    }
    Ok(())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
