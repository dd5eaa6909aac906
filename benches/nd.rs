//! What `depflow::nd` costs per operation on tiny arrays (issue 30): a
//! chain of N elementwise ops `x + 1` on an array of 1 or 1,024 floats,
//! written four ways, at each thread count (`Executor::pool(T)`):
//!
//! - `nd`: the array layer, eager: `x = x.add_scalar(1.0)?` (`out`: a new
//!   array per op) or `x.add_assign_scalar(1.0)?` (`in`: one array
//!   mutated);
//! - `nd_replay`: the same code recorded once with `nd::record` (a graph of
//!   [`GRAPH_OPS`] ops; `out` ends with `x.assign(&t)`), then replayed
//!   N / `GRAPH_OPS` times back to back; the recording is untimed;
//! - `push`: what `nd` does minus the array layer: the same `Zip` kernel
//!   pushed with `engine.op().name(..).on(..).reads(..).mutates(..).run(..)`
//!   on `Engine::buffer`s (`out`: a new buffer per op);
//! - `ndarray`: the plain ndarray call in a loop, no engine (`x = &x + 1.0`,
//!   `x += 1.0`).
//!
//! Each run is timed from the first op to the read of the last value, and
//! checked (the value must be the number of ops); ns/op is its time / N.
//! The four ways run in turn inside each of the `--runs` runs, on one
//! engine per (size, T), so that they see the same machine; each figure is
//! the median of the runs. `nd - push` is what the array layer adds: the
//! median of the runs' differences (each run's `nd` and `push` ran one
//! after the other).
//!
//! ```text
//! cargo bench --features nd --bench nd -- [--quick] [--runs 5]
//!     [--threads 1,2] [--sizes 1,1024] [--n 100000]
//! ```
//!
//! `--quick` takes N / 10 and 3 runs (`--runs` after it overrides).
//!
//! # Instructions per op
//!
//! `--callgrind` runs this binary under `valgrind --tool=callgrind` (which
//! must be on the PATH) on the inline executor (one thread, one order:
//! deterministic), each way at N (`--n`, default 20,000, rounded to whole
//! graphs) and N / 10 ops of size 1, and prints the
//! difference of the two totals divided by 9N / 10: the cost of one op, from
//! the call to the free, with the program's fixed costs (and the
//! recording) cancelled out. One measurement by hand:
//!
//! ```text
//! cargo bench --features nd --bench nd --no-run
//! valgrind --tool=callgrind target/release/deps/nd-* --child WAY 20000 1
//! valgrind --tool=callgrind target/release/deps/nd-* --child WAY 2000 1
//! ```
//!
//! `WAY` is `nd_out`, `nd_in`, `nd_replay_out`, `nd_replay_in`, `push_out`,
//! `push_in`, `ndarray_out` or `ndarray_in`; the third argument is the
//! array's length.

use std::hint::black_box;
use std::process::Command;
use std::time::{Duration, Instant};

use depflow::{Buffer, Engine, Error, Executor, nd};
use ndarray::{Array1, ArrayView1, ArrayViewMut1, Zip};

/// Ops per recorded graph of the `nd_replay` rows.
const GRAPH_OPS: usize = 1000;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Way {
    Nd,
    NdReplay,
    Push,
    Ndarray,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Form {
    /// A new array per op.
    Out,
    /// One array mutated.
    In,
}

/// In the order they run in each run: `nd` and `push` one after the other.
const WAYS: [Way; 4] = [Way::Nd, Way::Push, Way::NdReplay, Way::Ndarray];
const FORMS: [Form; 2] = [Form::Out, Form::In];

impl Way {
    fn name(self) -> &'static str {
        match self {
            Way::Nd => "nd",
            Way::NdReplay => "nd_replay",
            Way::Push => "push",
            Way::Ndarray => "ndarray",
        }
    }
}

impl Form {
    fn name(self) -> &'static str {
        match self {
            Form::Out => "out",
            Form::In => "in",
        }
    }
}

fn parse_way(s: &str) -> (Way, Form) {
    for way in WAYS {
        for form in FORMS {
            if s == format!("{}_{}", way.name(), form.name()) {
                return (way, form);
            }
        }
    }
    panic!(
        "unknown way {s}: nd_out, nd_in, nd_replay_out, nd_replay_in, push_out, push_in, ndarray_out or ndarray_in"
    );
}

/// The ops of one run: `n` rounded down to whole graphs for a replay row
/// (at least one).
fn ops_of(way: Way, n: usize) -> usize {
    match way {
        Way::NdReplay => (n / GRAPH_OPS).max(1) * GRAPH_OPS,
        _ => n,
    }
}

/// Runs `n` ops (see [`ops_of`]) of `way` and `form` on arrays of `len`
/// floats; returns the time from the first op to the read of the result,
/// and the ops run. Checks the result.
fn run(
    engine: &Engine,
    way: Way,
    form: Form,
    len: usize,
    n: usize,
) -> Result<(Duration, usize), Error> {
    let ops = ops_of(way, n);
    let (took, value) = match way {
        Way::Nd => nd_eager(engine, form, len, ops)?,
        Way::NdReplay => nd_replay(engine, form, len, ops)?,
        Way::Push => push(engine, form, len, ops)?,
        Way::Ndarray => plain(form, len, ops),
    };
    assert_eq!(
        value,
        ops as f32,
        "{} {}: {ops} ops of +1 on 0 gave {value}",
        way.name(),
        form.name()
    );
    Ok((took, ops))
}

fn nd_eager(engine: &Engine, form: Form, len: usize, ops: usize) -> Result<(Duration, f32), Error> {
    let arrays = nd::Arrays::new(engine);
    let mut x = arrays.zeros(&[len])?;
    x.wait_to_read()?;
    let start = Instant::now();
    match form {
        Form::Out => {
            for _ in 0..ops {
                x = x.add_scalar(1.0)?;
            }
        }
        Form::In => {
            for _ in 0..ops {
                x.add_assign_scalar(1.0)?;
            }
        }
    }
    let last = x.to_vec().wait()?[len - 1];
    Ok((start.elapsed(), last))
}

fn nd_replay(
    engine: &Engine,
    form: Form,
    len: usize,
    ops: usize,
) -> Result<(Duration, f32), Error> {
    let arrays = nd::Arrays::new(engine);
    let x = arrays.zeros(&[len])?;
    let graph = nd::record(engine, || -> Result<(), Error> {
        match form {
            // GRAPH_OPS - 1 new arrays (the graph's planned buffers), and
            // the copy back into `x`.
            Form::Out => {
                let mut t = x.add_scalar(1.0)?;
                for _ in 2..GRAPH_OPS {
                    t = t.add_scalar(1.0)?;
                }
                x.assign(&t)
            }
            Form::In => {
                for _ in 0..GRAPH_OPS {
                    x.add_assign_scalar(1.0)?;
                }
                Ok(())
            }
        }
    })?;
    x.wait_to_read()?;
    let start = Instant::now();
    let mut last = None;
    for _ in 0..ops / GRAPH_OPS {
        last = Some(graph.replay());
    }
    if let Some(replay) = last {
        replay.wait()?;
    }
    let last = x.to_vec().wait()?[len - 1];
    let took = start.elapsed();
    // `out` adds 1 per op but the copy: GRAPH_OPS - 1 per replay.
    let value = match form {
        Form::Out => last / (GRAPH_OPS - 1) as f32 * GRAPH_OPS as f32,
        Form::In => last,
    };
    Ok((took, value))
}

/// `nd`'s kernels and op, pushed directly on engine buffers.
fn push(engine: &Engine, form: Form, len: usize, ops: usize) -> Result<(Duration, f32), Error> {
    let device = engine.default_device();
    let mut x: Buffer<f32> = engine.buffer(len);
    let b = x.clone();
    engine.op().mutates(&[&x]).run(move |ctx| {
        ctx.write(&b)?.fill(0.0);
        Ok(())
    })?;
    engine.wait_all().wait()?;
    let start = Instant::now();
    match form {
        Form::Out => {
            for _ in 0..ops {
                let out: Buffer<f32> = engine.buffer(len);
                let (xb, ob) = (x.clone(), out.clone());
                drop(
                    engine
                        .op()
                        .name("add")
                        .on(device)
                        .reads(&[&x])
                        .mutates(&[&out])
                        .run(move |ctx| {
                            let (xd, mut od) = (ctx.read(&xb)?, ctx.write(&ob)?);
                            Zip::from(ArrayViewMut1::from(&mut od[..]))
                                .and(ArrayView1::from(&xd[..]))
                                .for_each(|o, &x| *o = x + 1.0);
                            Ok(())
                        })?,
                );
                x = out;
            }
        }
        Form::In => {
            for _ in 0..ops {
                let xb = x.clone();
                drop(
                    engine
                        .op()
                        .name("add")
                        .on(device)
                        .reads(&[])
                        .mutates(&[&x])
                        .run(move |ctx| {
                            ArrayViewMut1::from(&mut ctx.write(&xb)?[..]).mapv_inplace(|v| v + 1.0);
                            Ok(())
                        })?,
                );
            }
        }
    }
    let xb = x.clone();
    let last = engine
        .op()
        .reads(&[&x])
        .run(move |ctx| Ok(ctx.read(&xb)?[len - 1]))?
        .wait()?;
    Ok((start.elapsed(), last))
}

/// The plain ndarray calls (no engine).
fn plain(form: Form, len: usize, ops: usize) -> (Duration, f32) {
    let mut x = Array1::<f32>::zeros(len);
    let start = Instant::now();
    match form {
        Form::Out => {
            for _ in 0..ops {
                x = black_box(&x + 1.0);
            }
        }
        Form::In => {
            for _ in 0..ops {
                x += 1.0;
                black_box(&mut x);
            }
        }
    }
    (start.elapsed(), x[len - 1])
}

struct Args {
    /// `--n`, if given.
    n: Option<usize>,
    /// `--quick`: N / 10 and 3 runs.
    quick: bool,
    runs: usize,
    threads: Vec<usize>,
    sizes: Vec<usize>,
    callgrind: bool,
}

fn list(value: String, what: &str) -> Vec<usize> {
    value
        .split(',')
        .map(|t| t.parse().unwrap_or_else(|_| panic!("{what} 1,2")))
        .collect()
}

fn parse_args() -> Args {
    let mut args = Args {
        n: None,
        quick: false,
        runs: 5,
        threads: vec![1, 2],
        sizes: vec![1, 1024],
        callgrind: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = || it.next().unwrap_or_else(|| panic!("{a} needs a value"));
        match a.as_str() {
            "--quick" => {
                args.quick = true;
                args.runs = 3;
            }
            "--callgrind" => args.callgrind = true,
            "--runs" => args.runs = value().parse().expect("--runs N"),
            "--n" => args.n = Some(value().parse().expect("--n N")),
            "--threads" => args.threads = list(value(), "--threads"),
            "--sizes" => args.sizes = list(value(), "--sizes"),
            _ => {} // cargo passes `--bench`
        }
    }
    assert!(args.runs > 0, "--runs must be at least 1");
    args
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// The total instructions of one run of `--child WAY N 1` under callgrind.
fn instructions(way: &str, n: usize) -> u64 {
    let exe = std::env::current_exe().expect("this binary's path");
    let out = std::env::temp_dir().join(format!("depflow-nd-{}-{way}-{n}.out", std::process::id()));
    let status = Command::new("valgrind")
        .arg("--tool=callgrind")
        .arg(format!("--callgrind-out-file={}", out.display()))
        .arg(&exe)
        .args(["--child", way, &n.to_string(), "1"])
        .output()
        .expect("running valgrind (is it installed?)");
    assert!(
        status.status.success(),
        "valgrind on {way} {n}: {}",
        String::from_utf8_lossy(&status.stderr)
    );
    let text = std::fs::read_to_string(&out).expect("callgrind's output file");
    std::fs::remove_file(&out).ok();
    text.lines()
        .find_map(|l| {
            l.strip_prefix("summary: ")
                .or_else(|| l.strip_prefix("totals: "))
        })
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("a summary line in callgrind's output")
}

fn callgrind(n: usize) {
    // At least one graph at N / 10, and whole graphs at N and N / 10.
    let n = n.max(10 * GRAPH_OPS) / (10 * GRAPH_OPS) * (10 * GRAPH_OPS);
    println!(
        "instructions per op, size 1, inline executor, ({n} ops) - ({} ops) / {}",
        n / 10,
        n - n / 10
    );
    let mut per_op = Vec::new();
    for way in WAYS {
        for form in FORMS {
            let name = format!("{}_{}", way.name(), form.name());
            let (big, small) = (instructions(&name, n), instructions(&name, n / 10));
            let op = (big as f64 - small as f64) / (n - n / 10) as f64;
            println!("{name:<16} {op:>10.1}");
            per_op.push(((way, form), op));
        }
    }
    let of = |w, f| {
        per_op
            .iter()
            .find(|(k, _)| *k == (w, f))
            .map(|(_, v)| *v)
            .unwrap()
    };
    for form in FORMS {
        println!(
            "nd - push ({}) {:>10.1}",
            form.name(),
            of(Way::Nd, form) - of(Way::Push, form)
        );
    }
}

fn engine(threads: usize) -> Engine {
    Engine::builder()
        .executor(if threads == 0 {
            Executor::inline()
        } else {
            Executor::pool(threads)
        })
        .build()
        .expect("engine")
}

fn main() {
    let mut argv = std::env::args().skip(1);
    if argv.next().as_deref() == Some("--child") {
        let (way, form) = parse_way(&argv.next().expect("--child WAY N LEN"));
        let n = argv.next().expect("N").parse().expect("N");
        let len = argv.next().map_or(1, |l| l.parse().expect("LEN"));
        let engine = engine(0);
        run(&engine, way, form, len, n).expect("run");
        return;
    }
    let args = parse_args();
    if args.callgrind {
        callgrind(args.n.unwrap_or(20_000));
        return;
    }
    let n = args.n.unwrap_or(100_000) / if args.quick { 10 } else { 1 };
    println!(
        "{:>5} {:>2} {:<4} {:>10} {:>10} {:>10} {:>10} {:>10}",
        "size", "T", "form", "nd", "nd_replay", "push", "ndarray", "nd - push"
    );
    for &len in &args.sizes {
        for &threads in &args.threads {
            let engine = engine(threads);
            for form in FORMS {
                let mut ns: Vec<Vec<f64>> = vec![Vec::new(); WAYS.len()];
                for _ in 0..args.runs {
                    for (i, way) in WAYS.into_iter().enumerate() {
                        // Replays and the plain loop are far cheaper per op: 10x the ops.
                        let n = if matches!(way, Way::NdReplay | Way::Ndarray) {
                            n * 10
                        } else {
                            n
                        };
                        let (took, ops) = run(&engine, way, form, len, n).expect("run");
                        ns[i].push(took.as_nanos() as f64 / ops as f64);
                    }
                }
                // Paired: each run's nd against the push that ran right
                // after it, so that a change of the machine's load between
                // runs cancels.
                let nd_minus_push = median(ns[0].iter().zip(&ns[1]).map(|(a, b)| a - b).collect());
                let m: Vec<f64> = ns.into_iter().map(median).collect();
                println!(
                    "{len:>5} {threads:>2} {:<4} {:>10.1} {:>10.1} {:>10.1} {:>10.1} {:>10.1}",
                    form.name(),
                    m[0],
                    m[2],
                    m[1],
                    m[3],
                    nd_minus_push
                );
            }
        }
    }
}
