//! The standard engine workloads of `shared/bench/WORKLOADS.md`: `chain`,
//! `round_robin`, `fanout`, `seed4` and `random_dag`, each with `empty`,
//! `spin(1000 ns)` and `spin(10000 ns)` bodies, at every requested thread
//! count. Every run carries real values (each variable a `u64`) and checks
//! them against a serial replay.
//!
//! One more, not in `WORKLOADS.md`: `round_robin_quota` is `round_robin` with
//! every op also taking 1 unit of a resource of capacity 64 (made, like the
//! variables, before the clock starts). The resource changes no value, so it
//! is checked against the same replay, and also that every unit came back.
//!
//! Each workload but `round_robin_quota` also has a `<name>_replay` row: the
//! whole program is recorded once as a graph ([`Engine::record`], untimed,
//! its time printed apart), then replayed `--replays` times (default 3)
//! without waiting in between; the clock runs from the first replay to the
//! return of `wait_all`, and ns/op is that time / (replays x ops). The values
//! must equal the serial program run `replays` times (the op index `i` in
//! each op's step is its index in the program, the same in every replay).
//! One recording serves the row's `--runs` runs, on one engine: the
//! variables are set back to 0 between runs, untimed. `round_robin_quota`
//! has no replay row: recorded ops cannot take resource units yet.
//!
//! ```text
//! cargo bench --bench workloads -- [--json] [--quick] [--threads 1,2]
//!     [--runs 5] [--workloads chain,fanout,chain_replay]
//!     [--bodies empty,spin1000] [--replays 3] [--no-pending] [--trace]
//!     [--watchdog]
//! ```
//!
//! `--workloads` names rows: `chain` is the pushed program, `chain_replay`
//! its replays. `--replays 0` records and checks without replaying: the
//! baseline a profile of the replays subtracts (see README, *Recorded
//! graphs*).
//!
//! `--trace` builds every engine with [`Tracing::On`]: what recording a
//! trace costs (the trace is never taken). `--watchdog` gives every engine
//! a hang watchdog of a minute: what watching for hangs costs.
//!
//! `--quick` scales every N down by 10. Besides the workload table it
//! measures, per workload shape, the producer's cost per push alone and the
//! memory held per pending op: one op holds every variable, N ops are pushed
//! behind it, and the pushing time and growth of the resident set are divided
//! by N. For `round_robin_quota` the pending ops carry their resource
//! demand but hold no units: ops ask for units only once their variables
//! grant them. For each replay row it measures, in a fresh process too, the
//! time to record the program and the growth of the resident set per
//! recorded op (each recorded op keeps a task and its body for the graph's
//! lifetime).

use std::time::{Duration, Instant};

use depflow::{
    AnyVar, Engine, Error, Graph, OpBuilder, OpCtx, OpHandle, Recorder, Replay, Resource, Tracing,
    Var, VarKey,
};

/// Units of the resource of `round_robin_quota`.
const QUOTA_CAPACITY: u64 = 64;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Body {
    Empty,
    Spin(u64),
}

impl Body {
    fn name(self) -> String {
        match self {
            Body::Empty => "empty".into(),
            Body::Spin(ns) => format!("spin{ns}"),
        }
    }

    /// Runs the body: the test inline, the spin out of line (an empty body
    /// costs an op a test, not a call).
    #[inline]
    fn run(self) {
        if let Body::Spin(ns) = self {
            spin(ns);
        }
    }
}

/// Busy-waits `ns` nanoseconds on a monotonic clock.
#[inline(never)]
fn spin(ns: u64) {
    let start = Instant::now();
    let target = Duration::from_nanos(ns);
    while start.elapsed() < target {
        std::hint::spin_loop();
    }
}

/// One op of a workload: reads (up to two, as drawn) and one mutated variable.
#[derive(Clone, Copy)]
struct OpSpec {
    reads: [u32; 2],
    nreads: u8,
    write: u32,
}

struct Program {
    name: &'static str,
    vars: usize,
    ops: Vec<OpSpec>,
    /// Every op also takes 1 unit of a resource of `QUOTA_CAPACITY` units.
    quota: bool,
}

fn splitmix(s: &mut u64) -> u64 {
    *s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *s;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn step(i: u64, old: u64, r0: u64, r1: u64) -> u64 {
    mix(old
        .wrapping_add(i.wrapping_mul(31))
        .wrapping_add(r0.wrapping_mul(17))
        .wrapping_add(r1.wrapping_mul(13)))
}

fn op(reads: &[u32], write: u32) -> OpSpec {
    let mut r = [0; 2];
    r[..reads.len()].copy_from_slice(reads);
    OpSpec {
        reads: r,
        nreads: reads.len() as u8,
        write,
    }
}

fn programs(scale: usize) -> Vec<Program> {
    let n = 1_000_000 / scale;
    let chain = Program {
        name: "chain",
        vars: 1,
        ops: (0..n).map(|_| op(&[], 0)).collect(),
        quota: false,
    };
    let round_robin = |name, quota| Program {
        name,
        vars: 1024,
        ops: (0..n).map(|i| op(&[], (i % 1024) as u32)).collect(),
        quota,
    };
    // Variable 0 is A, 1..=64 are B_0..B_63.
    let mut fanout = Vec::with_capacity(n);
    for _ in 0..15_385 / scale {
        fanout.push(op(&[], 0));
        fanout.extend((1..=64).map(|k| op(&[0], k)));
    }
    let fanout = Program {
        name: "fanout",
        vars: 65,
        ops: fanout,
        quota: false,
    };
    // Copy c has A, B, C, D at 4c..4c+4.
    let mut seed4 = Vec::with_capacity(n);
    for _ in 0..4_000 / scale {
        for (read, write) in [(0, 1), (0, 2), (2, 0), (0, 3)] {
            seed4.extend((0..64u32).map(|c| op(&[4 * c + read], 4 * c + write)));
        }
    }
    let seed4 = Program {
        name: "seed4",
        vars: 256,
        ops: seed4,
        quota: false,
    };
    let mut s = 42u64;
    let random_dag = Program {
        name: "random_dag",
        vars: 4096,
        ops: (0..n)
            .map(|_| {
                let r0 = (splitmix(&mut s) % 4096) as u32;
                let r1 = (splitmix(&mut s) % 4096) as u32;
                let w = (splitmix(&mut s) % 4096) as u32;
                op(&[r0, r1], w)
            })
            .collect(),
        quota: false,
    };
    vec![
        chain,
        round_robin("round_robin", false),
        round_robin("round_robin_quota", true),
        fanout,
        seed4,
        random_dag,
    ]
}

/// The values `times` serial runs of `program`, one after the other, leave.
/// (Not inlined: a callgrind profile subtracts its cost by name.)
#[inline(never)]
fn reference(program: &Program, times: usize) -> Vec<u64> {
    let mut vals = vec![0u64; program.vars];
    for (i, op) in std::iter::repeat_n(&program.ops, times).flat_map(|ops| ops.iter().enumerate()) {
        let r = |k: usize| {
            if k < op.nreads as usize {
                vals[op.reads[k] as usize]
            } else {
                0
            }
        };
        let (r0, r1) = (r(0), r(1));
        let w = op.write as usize;
        vals[w] = step(i as u64, vals[w], r0, r1);
    }
    vals
}

/// Runs `b` as `Engine::push` does, with 1 unit of `quota` if there is one.
/// (Each arm calls `run` itself: merging the two builders first costs the
/// plain workloads a copy of the builder per push.)
fn run<F>(b: OpBuilder<'_>, quota: Option<&Resource>, f: F) -> Result<OpHandle<()>, Error>
where
    F: FnOnce(&OpCtx) -> Result<(), depflow::BoxError> + Send + 'static,
{
    match quota {
        Some(q) => b.uses(q, 1).run(f),
        None => b.run(f),
    }
}

/// The body of an op mutating `wk` (index `i`) that reads nothing, one
/// variable or two: the same closure for pushed and recorded ops. Keys are
/// `Copy`, not handles.
fn body0(wk: VarKey<u64>, i: u64, body: Body) -> impl Fn(&OpCtx) -> OpResult + Send + Sync {
    move |ctx| {
        let mut v = ctx.write(wk)?;
        *v = step(i, *v, 0, 0);
        drop(v);
        body.run();
        Ok(())
    }
}

/// See [`body0`].
fn body1(
    rk: VarKey<u64>,
    wk: VarKey<u64>,
    i: u64,
    body: Body,
) -> impl Fn(&OpCtx) -> OpResult + Send + Sync {
    move |ctx| {
        let a = *ctx.read(rk)?;
        let mut v = ctx.write(wk)?;
        *v = step(i, *v, a, 0);
        drop(v);
        body.run();
        Ok(())
    }
}

/// See [`body0`].
fn body2(
    (rk0, rk1): (VarKey<u64>, VarKey<u64>),
    wk: VarKey<u64>,
    i: u64,
    body: Body,
) -> impl Fn(&OpCtx) -> OpResult + Send + Sync {
    move |ctx| {
        let (a, b) = (*ctx.read(rk0)?, *ctx.read(rk1)?);
        let mut v = ctx.write(wk)?;
        *v = step(i, *v, a, b);
        drop(v);
        body.run();
        Ok(())
    }
}

type OpResult = Result<(), depflow::BoxError>;

/// Pushes one op of the program.
fn push(
    engine: &Engine,
    vars: &[Var<u64>],
    quota: Option<&Resource>,
    i: usize,
    op: OpSpec,
    body: Body,
) {
    let w = &vars[op.write as usize];
    let (wk, i) = (w.key(), i as u64);
    let result = match op.nreads {
        0 => run(engine.op().mutates(&[w]), quota, body0(wk, i, body)),
        1 => {
            let r0 = &vars[op.reads[0] as usize];
            let b = engine.op().reads(&[r0]).mutates(&[w]);
            run(b, quota, body1(r0.key(), wk, i, body))
        }
        _ => {
            let (r0, r1) = (&vars[op.reads[0] as usize], &vars[op.reads[1] as usize]);
            let b = engine.op().reads(&[r0, r1]).mutates(&[w]);
            run(b, quota, body2((r0.key(), r1.key()), wk, i, body))
        }
    };
    drop(result.expect("push failed"));
}

fn values(engine: &Engine, vars: &[Var<u64>]) -> Vec<u64> {
    let handles: Vec<_> = vars
        .iter()
        .map(|v| {
            let v2 = v.clone();
            engine
                .push(&[v], &[], move |ctx| Ok(*ctx.read(&v2)?))
                .unwrap()
        })
        .collect();
    handles.into_iter().map(|h| h.wait().unwrap()).collect()
}

/// The resource of a program whose ops take units, if any.
fn new_quota(engine: &Engine, program: &Program) -> Option<Resource> {
    program
        .quota
        .then(|| engine.new_resource("quota", QUOTA_CAPACITY))
}

/// Whether every unit came back once the ops finished.
fn units_back(quota: Option<&Resource>) -> bool {
    quota.is_none_or(|q| q.in_use() == 0)
}

struct Run {
    wall: Duration,
    ok: bool,
}

/// `--trace`: every engine records a trace (never taken), to measure what
/// recording costs.
static TRACE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
/// `--watchdog`: every engine has a hang watchdog (of a minute, never
/// reporting), to measure what watching for hangs costs.
static WATCHDOG: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn engine(threads: usize) -> Engine {
    let tracing = if TRACE.load(std::sync::atomic::Ordering::Relaxed) {
        Tracing::On
    } else {
        Tracing::Off
    };
    let builder = Engine::builder().threads(threads).tracing(tracing);
    if WATCHDOG.load(std::sync::atomic::Ordering::Relaxed) {
        builder.watchdog(std::time::Duration::from_secs(60))
    } else {
        builder
    }
    .build()
    .unwrap()
}

fn run_once(program: &Program, body: Body, threads: usize, expected: &[u64]) -> Run {
    let engine = engine(threads);
    let vars: Vec<Var<u64>> = (0..program.vars).map(|_| engine.var(0u64)).collect();
    let quota = new_quota(&engine, program);
    let start = Instant::now();
    for (i, op) in program.ops.iter().enumerate() {
        push(&engine, &vars, quota.as_ref(), i, *op, body);
    }
    engine.wait_all().wait().expect("an op failed");
    let wall = start.elapsed();
    let ok = values(&engine, &vars) == expected && units_back(quota.as_ref());
    Run { wall, ok }
}

/// Pushes the whole program behind one op that holds every variable; returns
/// (ns per push, resident bytes per pending op, check).
fn pending_cost(program: &Program, expected: &[u64]) -> (f64, f64, bool) {
    let engine = engine(1);
    let vars: Vec<Var<u64>> = (0..program.vars).map(|_| engine.var(0u64)).collect();
    let quota = new_quota(&engine, program);
    let (release, gate) = std::sync::mpsc::channel::<()>();
    let all: Vec<&dyn AnyVar> = vars.iter().map(|v| v as &dyn AnyVar).collect();
    let blocker = engine
        .push(&[], &all, move |_| {
            gate.recv().unwrap();
            Ok(())
        })
        .unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let before = resident_bytes();
    let start = Instant::now();
    for (i, op) in program.ops.iter().enumerate() {
        push(&engine, &vars, quota.as_ref(), i, *op, Body::Empty);
    }
    let pushing = start.elapsed();
    let after = resident_bytes();
    release.send(()).unwrap();
    blocker.wait().unwrap();
    engine.wait_all().wait().unwrap();
    let ok = values(&engine, &vars) == expected && units_back(quota.as_ref());
    let n = program.ops.len() as f64;
    (
        pushing.as_nanos() as f64 / n,
        (after as f64 - before as f64) / n,
        ok,
    )
}

/// Runs `pending_cost` in a fresh process, so that memory freed by earlier
/// runs cannot hide the growth.
fn pending_in_child(name: &str, scale: usize) -> (f64, f64, bool) {
    child(&["--pending-child", name, "--scale", &scale.to_string()])
}

/// Runs this bench with `args` (a `--*-child` mode) and parses the three
/// figures it prints.
fn child(args: &[&str]) -> (f64, f64, bool) {
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new(exe)
        .args(args)
        .output()
        .expect("cannot run the child measurement");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut it = text.split_whitespace();
    let mut next = || {
        it.next().unwrap_or_else(|| {
            panic!(
                "child {args:?} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            )
        })
    };
    (
        next().parse().unwrap(),
        next().parse().unwrap(),
        next() == "ok",
    )
}

/// Records op `i` of a program as `push` pushes it (the same bodies).
fn record_op(rec: &mut Recorder<'_>, vars: &[Var<u64>], i: usize, op: OpSpec, body: Body) {
    let w = &vars[op.write as usize];
    let (wk, i) = (w.key(), i as u64);
    let result = match op.nreads {
        0 => rec.op().mutates(&[w]).run(body0(wk, i, body)),
        1 => {
            let r0 = &vars[op.reads[0] as usize];
            rec.op()
                .reads(&[r0])
                .mutates(&[w])
                .run(body1(r0.key(), wk, i, body))
        }
        _ => {
            let (r0, r1) = (&vars[op.reads[0] as usize], &vars[op.reads[1] as usize]);
            let b = rec.op().reads(&[r0, r1]).mutates(&[w]);
            b.run(body2((r0.key(), r1.key()), wk, i, body))
        }
    };
    result.expect("recording an op failed");
}

/// Records the whole program as one graph (nothing runs).
fn record(engine: &Engine, vars: &[Var<u64>], program: &Program, body: Body) -> Graph {
    assert!(!program.quota, "recorded ops cannot take resource units");
    engine
        .record(|rec| {
            for (i, op) in program.ops.iter().enumerate() {
                record_op(rec, vars, i, *op, body);
            }
            Ok::<(), depflow::Error>(())
        })
        .expect("recording failed")
}

/// Sets every variable back to 0 (between runs of a replay row, untimed).
fn reset(engine: &Engine, vars: &[Var<u64>]) {
    for v in vars {
        let v2 = v.clone();
        drop(
            engine
                .push(&[], &[v], move |ctx| {
                    *ctx.write(&v2)? = 0;
                    Ok(())
                })
                .unwrap(),
        );
    }
    engine.wait_all().wait().expect("reset failed");
}

/// The runs of a replay row: one engine, the program recorded once, then
/// per run `replays` replays pushed back to back and timed up to
/// `wait_all`'s return. Returns the runs and the recording's time.
fn replay_runs(
    program: &Program,
    body: Body,
    threads: usize,
    replays: usize,
    runs: usize,
    expected: &[u64],
) -> (Vec<Run>, Duration) {
    let engine = engine(threads);
    let vars: Vec<Var<u64>> = (0..program.vars).map(|_| engine.var(0u64)).collect();
    let start = Instant::now();
    let graph = record(&engine, &vars, program, body);
    let recording = start.elapsed();
    let runs = (0..runs)
        .map(|run| {
            if run > 0 {
                reset(&engine, &vars);
            }
            let start = Instant::now();
            let pushed: Vec<Replay> = (0..replays).map(|_| graph.replay()).collect();
            engine.wait_all().wait().expect("an op failed");
            let wall = start.elapsed();
            let replayed = pushed.into_iter().all(|r| r.wait().is_ok());
            let ok = replayed && values(&engine, &vars) == expected;
            Run { wall, ok }
        })
        .collect();
    (runs, recording)
}

/// Records the program once on a fresh engine; returns (ns per recorded
/// op, resident bytes per recorded op, check of one replay).
fn record_cost(program: &Program, expected: &[u64]) -> (f64, f64, bool) {
    let engine = engine(1);
    let vars: Vec<Var<u64>> = (0..program.vars).map(|_| engine.var(0u64)).collect();
    let before = resident_bytes();
    let start = Instant::now();
    let graph = record(&engine, &vars, program, Body::Empty);
    let recording = start.elapsed();
    let after = resident_bytes();
    let ok = graph.replay().wait().is_ok() && values(&engine, &vars) == expected;
    let n = program.ops.len() as f64;
    (
        recording.as_nanos() as f64 / n,
        (after as f64 - before as f64) / n,
        ok,
    )
}

/// Runs `record_cost` in a fresh process (as `pending_in_child`).
fn record_in_child(name: &str, scale: usize) -> (f64, f64, bool) {
    child(&["--record-child", name, "--scale", &scale.to_string()])
}

fn resident_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

struct Args {
    json: bool,
    scale: usize,
    threads: Vec<usize>,
    runs: usize,
    workloads: Option<Vec<String>>,
    bodies: Vec<Body>,
    pending: bool,
    /// Replays per run of a replay row.
    replays: usize,
}

fn parse_args() -> Args {
    let mut args = Args {
        json: false,
        scale: 1,
        threads: vec![1, 2],
        runs: 5,
        workloads: None,
        bodies: vec![Body::Empty, Body::Spin(1000), Body::Spin(10_000)],
        pending: true,
        replays: 3,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = || it.next().unwrap_or_else(|| panic!("{a} needs a value"));
        match a.as_str() {
            "--json" => args.json = true,
            "--quick" => args.scale = 10,
            "--no-pending" => args.pending = false,
            "--trace" => TRACE.store(true, std::sync::atomic::Ordering::Relaxed),
            "--watchdog" => WATCHDOG.store(true, std::sync::atomic::Ordering::Relaxed),
            "--threads" => {
                args.threads = value()
                    .split(',')
                    .map(|t| t.parse().expect("--threads 1,2"))
                    .collect()
            }
            "--runs" => args.runs = value().parse().expect("--runs N"),
            "--replays" => args.replays = value().parse().expect("--replays R"),
            "--workloads" => args.workloads = Some(value().split(',').map(String::from).collect()),
            "--bodies" => {
                args.bodies = value()
                    .split(',')
                    .map(|b| match b {
                        "empty" => Body::Empty,
                        s => Body::Spin(
                            s.trim_start_matches("spin")
                                .parse()
                                .expect("--bodies empty,spin1000"),
                        ),
                    })
                    .collect()
            }
            _ => {} // cargo passes `--bench`
        }
    }
    args
}

fn median(mut xs: Vec<Duration>) -> Duration {
    xs.sort();
    xs[xs.len() / 2]
}

/// One row's figures, printed as text or JSON.
struct Row<'a> {
    workload: &'a str,
    body: Body,
    threads: usize,
    runs: &'a [Run],
    /// Ops per run (replays x ops for a replay row).
    ops: usize,
    /// A replay row's: (replays per run, ns per recorded op, this row's
    /// ns/op over the pushed program's in this process, if it ran).
    replay: Option<(usize, f64, Option<f64>)>,
}

/// Prints the row; returns its ns/op.
fn report(row: &Row<'_>, json: bool) -> f64 {
    let ok = row.runs.iter().all(|r| r.ok);
    let wall = median(row.runs.iter().map(|r| r.wall).collect());
    // `--replays 0` (a profile's baseline) replays no op: 0 ns/op.
    let n = row.ops as f64;
    let ns_per_op = if row.ops == 0 {
        0.0
    } else {
        wall.as_nanos() as f64 / n
    };
    let efficiency = match row.body {
        Body::Empty => None,
        Body::Spin(w) => Some((n * w as f64 / row.threads as f64) / wall.as_nanos() as f64),
    };
    let check = if ok { "ok" } else { "FAILED" };
    let threads = row.threads;
    if json {
        let eff = efficiency.map_or("null".to_string(), |e| format!("{e:.4}"));
        let extra = row.replay.map_or(String::new(), |(replays, record, vs)| {
            let vs = vs.map_or("null".to_string(), |r| format!("{:.3}", ns_per_op / r));
            format!(
                ", \"replays\": {replays}, \"record_ns_per_op\": {record:.1}, \"vs_dynamic\": {vs}"
            )
        });
        println!(
            "{{\"workload\": \"{}\", \"body\": \"{}\", \"threads\": {threads}, \"ns_per_op\": {ns_per_op:.1}, \"efficiency\": {eff}, \"check\": \"{check}\"{extra}}}",
            row.workload,
            row.body.name()
        );
    } else {
        let eff = efficiency.map_or("-".to_string(), |e| format!("{e:.3}"));
        println!(
            "{:<18} {:<10} {:>3} {:>12.1} {:>10} {:>6}",
            row.workload,
            row.body.name(),
            threads,
            ns_per_op,
            eff,
            check
        );
        if let Some((replays, record, vs)) = row.replay {
            let vs = vs.map_or(String::new(), |r| {
                format!(", {:.3}x the pushed program", ns_per_op / r)
            });
            eprintln!(
                "  {}: {replays} replays per run, recorded in {record:.1} ns/op{vs}",
                row.workload
            );
        }
    }
    assert!(
        ok,
        "check failed: {} {} T={threads}",
        row.workload,
        row.body.name()
    );
    ns_per_op
}

/// Prints a child's measurement (`metric`: "pending" or "recorded").
fn report_child(workload: &str, metric: &str, figures: (f64, f64, bool), json: bool) {
    let (ns, bytes, ok) = figures;
    let check = if ok { "ok" } else { "FAILED" };
    match (metric, json) {
        ("pending", true) => println!(
            "{{\"workload\": \"{workload}\", \"metric\": \"pending\", \"push_ns_per_op\": {ns:.1}, \"bytes_per_pending_op\": {bytes:.1}, \"check\": \"{check}\"}}"
        ),
        ("pending", false) => println!(
            "{workload:<18} push alone {ns:.1} ns/op, {bytes:.1} bytes per pending op, check {check}"
        ),
        (_, true) => println!(
            "{{\"workload\": \"{workload}\", \"metric\": \"recorded\", \"record_ns_per_op\": {ns:.1}, \"bytes_per_recorded_op\": {bytes:.1}, \"check\": \"{check}\"}}"
        ),
        (_, false) => println!(
            "{workload:<18} recording alone {ns:.1} ns/op, {bytes:.1} bytes per recorded op, check {check}"
        ),
    }
    assert!(ok, "check failed: {workload} {metric}");
}

fn main() {
    let mut argv = std::env::args().skip(1);
    let mode = argv.next();
    if let Some(mode @ ("--pending-child" | "--record-child")) = mode.as_deref() {
        let name = argv.next().unwrap();
        let scale = argv.nth(1).unwrap().parse().unwrap();
        let program = programs(scale)
            .into_iter()
            .find(|p| p.name == name)
            .unwrap();
        let expected = reference(&program, 1);
        let (ns, bytes, ok) = if mode == "--pending-child" {
            pending_cost(&program, &expected)
        } else {
            record_cost(&program, &expected)
        };
        println!("{ns} {bytes} {}", if ok { "ok" } else { "failed" });
        return;
    }
    let args = parse_args();
    let wanted = |name: &str| {
        args.workloads
            .as_ref()
            .is_none_or(|w| w.iter().any(|n| n == name))
    };
    // Per program: whether its pushed rows and its replay rows run.
    let programs: Vec<(Program, bool, bool)> = programs(args.scale)
        .into_iter()
        .map(|p| {
            let pushed = wanted(p.name);
            let replay_name = format!("{}_replay", p.name);
            if p.quota
                && args
                    .workloads
                    .as_ref()
                    .is_some_and(|w| w.contains(&replay_name))
            {
                eprintln!("no {replay_name} row: recorded ops cannot take resource units yet");
            }
            let replayed = !p.quota && wanted(&replay_name);
            (p, pushed, replayed)
        })
        .filter(|&(_, pushed, replayed)| pushed || replayed)
        .collect();
    if !args.json {
        println!(
            "{:<18} {:<10} {:>3} {:>12} {:>10} {:>6}",
            "workload", "body", "T", "ns/op", "efficiency", "check"
        );
    }
    for (program, pushed, replayed) in &programs {
        let expected = reference(program, 1);
        let replay_name = format!("{}_replay", program.name);
        let expected_replays = if *replayed {
            reference(program, args.replays)
        } else {
            Vec::new()
        };
        for &body in args.bodies.iter().filter(|_| args.runs > 0) {
            for &threads in &args.threads {
                let mut dynamic = None;
                if *pushed {
                    let runs: Vec<Run> = (0..args.runs)
                        .map(|_| run_once(program, body, threads, &expected))
                        .collect();
                    let row = Row {
                        workload: program.name,
                        body,
                        threads,
                        runs: &runs,
                        ops: program.ops.len(),
                        replay: None,
                    };
                    dynamic = Some(report(&row, args.json));
                }
                if *replayed {
                    let (runs, recording) = replay_runs(
                        program,
                        body,
                        threads,
                        args.replays,
                        args.runs,
                        &expected_replays,
                    );
                    let record_ns = recording.as_nanos() as f64 / program.ops.len() as f64;
                    let row = Row {
                        workload: &replay_name,
                        body,
                        threads,
                        runs: &runs,
                        ops: args.replays * program.ops.len(),
                        replay: Some((args.replays, record_ns, dynamic)),
                    };
                    report(&row, args.json);
                }
            }
        }
        if args.pending && *pushed {
            let figures = pending_in_child(program.name, args.scale);
            report_child(program.name, "pending", figures, args.json);
        }
        if args.pending && *replayed {
            let figures = record_in_child(program.name, args.scale);
            report_child(&replay_name, "recorded", figures, args.json);
        }
    }
}
