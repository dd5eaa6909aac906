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
//! ```text
//! cargo bench --bench workloads -- [--json] [--quick] [--threads 1,2]
//!     [--runs 5] [--workloads chain,fanout] [--bodies empty,spin1000]
//!     [--no-pending] [--trace]
//! ```
//!
//! `--trace` builds every engine with [`Tracing::On`]: what recording a
//! trace costs (the trace is never taken).
//!
//! `--quick` scales every N down by 10. Besides the workload table it
//! measures, per workload shape, the producer's cost per push alone and the
//! memory held per pending op: one op holds every variable, N ops are pushed
//! behind it, and the pushing time and growth of the resident set are divided
//! by N. For `round_robin_quota` the pending ops carry their resource
//! demand but hold no units: ops ask for units only once their variables
//! grant them.

use std::time::{Duration, Instant};

use depflow::{AnyVar, Engine, Error, OpBuilder, OpCtx, OpHandle, Resource, Tracing, Var};

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

    fn run(self) {
        if let Body::Spin(ns) = self {
            let start = Instant::now();
            let target = Duration::from_nanos(ns);
            while start.elapsed() < target {
                std::hint::spin_loop();
            }
        }
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

/// The values a serial run of `program` leaves.
fn reference(program: &Program) -> Vec<u64> {
    let mut vals = vec![0u64; program.vars];
    for (i, op) in program.ops.iter().enumerate() {
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

/// Pushes one op of the program. Closures capture `Copy` keys, not handles.
fn push(
    engine: &Engine,
    vars: &[Var<u64>],
    quota: Option<&Resource>,
    i: usize,
    op: OpSpec,
    body: Body,
) {
    let w = &vars[op.write as usize];
    let wk = w.key();
    let i = i as u64;
    let result = match op.nreads {
        0 => run(engine.op().mutates(&[w]), quota, move |ctx| {
            let mut v = ctx.write(wk)?;
            *v = step(i, *v, 0, 0);
            drop(v);
            body.run();
            Ok(())
        }),
        1 => {
            let r0 = &vars[op.reads[0] as usize];
            let rk = r0.key();
            run(engine.op().reads(&[r0]).mutates(&[w]), quota, move |ctx| {
                let a = *ctx.read(rk)?;
                let mut v = ctx.write(wk)?;
                *v = step(i, *v, a, 0);
                drop(v);
                body.run();
                Ok(())
            })
        }
        _ => {
            let (r0, r1) = (&vars[op.reads[0] as usize], &vars[op.reads[1] as usize]);
            let (rk0, rk1) = (r0.key(), r1.key());
            run(
                engine.op().reads(&[r0, r1]).mutates(&[w]),
                quota,
                move |ctx| {
                    let (a, b) = (*ctx.read(rk0)?, *ctx.read(rk1)?);
                    let mut v = ctx.write(wk)?;
                    *v = step(i, *v, a, b);
                    drop(v);
                    body.run();
                    Ok(())
                },
            )
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

fn engine(threads: usize) -> Engine {
    let tracing = if TRACE.load(std::sync::atomic::Ordering::Relaxed) {
        Tracing::On
    } else {
        Tracing::Off
    };
    Engine::builder()
        .threads(threads)
        .tracing(tracing)
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
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new(exe)
        .args(["--pending-child", name, "--scale", &scale.to_string()])
        .output()
        .expect("cannot run the pending measurement");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut it = text.split_whitespace();
    let mut next = || {
        it.next().unwrap_or_else(|| {
            panic!(
                "pending child failed: {}",
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
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = || it.next().unwrap_or_else(|| panic!("{a} needs a value"));
        match a.as_str() {
            "--json" => args.json = true,
            "--quick" => args.scale = 10,
            "--no-pending" => args.pending = false,
            "--trace" => TRACE.store(true, std::sync::atomic::Ordering::Relaxed),
            "--threads" => {
                args.threads = value()
                    .split(',')
                    .map(|t| t.parse().expect("--threads 1,2"))
                    .collect()
            }
            "--runs" => args.runs = value().parse().expect("--runs N"),
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

fn main() {
    let mut argv = std::env::args().skip(1);
    if argv.next().as_deref() == Some("--pending-child") {
        let name = argv.next().unwrap();
        let scale = argv.nth(1).unwrap().parse().unwrap();
        let program = programs(scale)
            .into_iter()
            .find(|p| p.name == name)
            .unwrap();
        let (push_ns, bytes, ok) = pending_cost(&program, &reference(&program));
        println!("{push_ns} {bytes} {}", if ok { "ok" } else { "failed" });
        return;
    }
    let args = parse_args();
    let programs: Vec<Program> = programs(args.scale)
        .into_iter()
        .filter(|p| {
            args.workloads
                .as_ref()
                .is_none_or(|w| w.iter().any(|n| n == p.name))
        })
        .collect();
    if !args.json {
        println!(
            "{:<17} {:<10} {:>3} {:>12} {:>10} {:>6}",
            "workload", "body", "T", "ns/op", "efficiency", "check"
        );
    }
    for program in &programs {
        let expected = reference(program);
        for &body in args.bodies.iter().filter(|_| args.runs > 0) {
            for &threads in &args.threads {
                let runs: Vec<Run> = (0..args.runs)
                    .map(|_| run_once(program, body, threads, &expected))
                    .collect();
                let ok = runs.iter().all(|r| r.ok);
                let wall = median(runs.iter().map(|r| r.wall).collect());
                let n = program.ops.len() as f64;
                let ns_per_op = wall.as_nanos() as f64 / n;
                let efficiency = match body {
                    Body::Empty => None,
                    Body::Spin(w) => Some((n * w as f64 / threads as f64) / wall.as_nanos() as f64),
                };
                let check = if ok { "ok" } else { "FAILED" };
                if args.json {
                    let eff = efficiency.map_or("null".to_string(), |e| format!("{e:.4}"));
                    println!(
                        "{{\"workload\": \"{}\", \"body\": \"{}\", \"threads\": {threads}, \"ns_per_op\": {ns_per_op:.1}, \"efficiency\": {eff}, \"check\": \"{check}\"}}",
                        program.name,
                        body.name()
                    );
                } else {
                    let eff = efficiency.map_or("-".to_string(), |e| format!("{e:.3}"));
                    println!(
                        "{:<17} {:<10} {:>3} {:>12.1} {:>10} {:>6}",
                        program.name,
                        body.name(),
                        threads,
                        ns_per_op,
                        eff,
                        check
                    );
                }
                assert!(
                    ok,
                    "check failed: {} {} T={threads}",
                    program.name,
                    body.name()
                );
            }
        }
        if args.pending {
            let (push_ns, bytes, ok) = pending_in_child(program.name, args.scale);
            let check = if ok { "ok" } else { "FAILED" };
            if args.json {
                println!(
                    "{{\"workload\": \"{}\", \"metric\": \"pending\", \"push_ns_per_op\": {push_ns:.1}, \"bytes_per_pending_op\": {bytes:.1}, \"check\": \"{check}\"}}",
                    program.name
                );
            } else {
                println!(
                    "{:<17} push alone {push_ns:.1} ns/op, {bytes:.1} bytes per pending op, check {check}",
                    program.name
                );
            }
            assert!(ok, "check failed: {} pending", program.name);
        }
    }
}
