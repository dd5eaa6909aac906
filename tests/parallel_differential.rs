//! Random data-parallel programs (device counts and kinds, parameters,
//! buckets, update modes, failing backward ops, clearing the poison)
//! against a serial replay:
//! every replica's weights must be the replay's, bit for bit, or poisoned
//! exactly where the replay says.
//!
//! `DEPFLOW_DIFF_PROGRAMS` sets how many programs (default 60).

mod common;

use common::parallel::ring_order;
use common::{Rng, mix, within};
use depflow::parallel::{Group, Update};
use depflow::{Engine, Error, Executor};

const LR: f32 = 0.125;

/// One random program.
#[derive(Debug)]
struct Program {
    seed: u64,
    /// Per device: 0 pool, 1 simulated GPU, 2 inline; and whether its
    /// reductions get a device of their own.
    kinds: Vec<(u64, bool)>,
    lens: Vec<usize>,
    bucket_bytes: usize,
    update: Update,
    steps: usize,
    rows: usize,
    /// `fails[step][device][param]`.
    fails: Vec<Vec<Vec<bool>>>,
    /// Whether device `d` marks gradients ready as it goes.
    marks: Vec<bool>,
    /// Whether `Group::clear_poison` is called before step `k`.
    clears: Vec<bool>,
}

fn generate(seed: u64) -> Program {
    let mut r = Rng(seed);
    let n = 1 + r.below(5) as usize;
    let params = 1 + r.below(4) as usize;
    let steps = 1 + r.below(4) as usize;
    let mut prog = Program {
        seed,
        kinds: (0..n).map(|_| (r.below(3), r.below(2) == 0)).collect(),
        lens: (0..params).map(|_| r.below(21) as usize).collect(),
        bucket_bytes: [0, 16, 64, 1 << 20][r.below(4) as usize],
        update: if r.below(2) == 0 {
            Update::EveryReplica
        } else {
            Update::Host
        },
        steps,
        rows: 1 + r.below(3) as usize,
        fails: (0..steps)
            .map(|_| {
                (0..n)
                    .map(|_| (0..params).map(|_| r.below(15) == 0).collect())
                    .collect()
            })
            .collect(),
        marks: (0..n).map(|_| r.below(2) == 0).collect(),
        clears: (0..steps).map(|_| r.below(3) == 0).collect(),
    };
    // On a stream device, ops behind a failed one on the same device still
    // run their bodies (they are enqueued before the failure is known), so
    // a cleared variable's value there is not the replay's: clear only
    // without stream devices.
    if prog.kinds.iter().any(|&(kind, _)| kind == 1) {
        prog.clears.fill(false);
    }
    prog
}

fn init(p: usize, len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| value(mix(p as u64 * 977 + i as u64)))
        .collect()
}

/// A float of a random magnitude (so that sums' orders show).
fn value(z: u64) -> f32 {
    ((z >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 2f32.powi((z % 16) as i32 - 8)
}

fn batch(seed: u64, step: usize, rows: usize) -> Vec<f32> {
    (0..rows)
        .map(|i| value(mix(seed ^ ((step as u64) << 32) ^ i as u64)))
        .collect()
}

/// What the backward op computes: `g[i] = w[i] * sum(x) + c(step, d, p, i)`.
fn grad(w: &[f32], x: &[f32], seed: u64, step: usize, d: usize, p: usize) -> Vec<f32> {
    let s: f32 = x.iter().sum();
    w.iter()
        .enumerate()
        .map(|(i, w)| {
            w * s
                + value(mix(
                    seed ^ (((step * 8 + d) * 8 + p) as u64 * 131 + i as u64)
                ))
        })
        .collect()
}

/// The buckets, by the documented rule: filled from the last parameter
/// back, consecutive parameters while they fit in `bytes`, a larger one
/// alone.
fn buckets(lens: &[usize], bytes: usize) -> Vec<Vec<usize>> {
    let mut out: Vec<Vec<usize>> = Vec::new();
    let mut used = 0;
    for p in (0..lens.len()).rev() {
        match out.last_mut() {
            Some(last) if used + lens[p] * 4 <= bytes => last.insert(0, p),
            _ => {
                out.push(vec![p]);
                used = 0;
            }
        }
        used += lens[p] * 4;
    }
    out.reverse();
    out
}

/// The serial replay: each parameter's weights (the same on every
/// replica), or `None` where poisoned.
fn replay(prog: &Program) -> Vec<Option<Vec<f32>>> {
    let n = prog.kinds.len();
    let mut w: Vec<Option<Vec<f32>>> = prog
        .lens
        .iter()
        .enumerate()
        .map(|(p, &l)| Some(init(p, l)))
        .collect();
    // A poisoned parameter's weights stay those of its last update.
    let mut last: Vec<Vec<f32>> = w.iter().flatten().cloned().collect();
    for step in 0..prog.steps {
        if prog.clears[step] {
            for (w, last) in w.iter_mut().zip(&last) {
                *w = Some(last.clone());
            }
        }
        let x = batch(prog.seed, step, prog.rows * n);
        let grads: Vec<Vec<Option<Vec<f32>>>> = (0..n)
            .map(|d| {
                let shard = &x[d * prog.rows..(d + 1) * prog.rows];
                (0..prog.lens.len())
                    .map(|p| match &w[p] {
                        Some(w) if !prog.fails[step][d][p] => {
                            Some(grad(w, shard, prog.seed, step, d, p))
                        }
                        _ => None,
                    })
                    .collect()
            })
            .collect();
        for bucket in buckets(&prog.lens, prog.bucket_bytes) {
            // One device and no host: nothing ties a bucket's parameters.
            let groups: Vec<Vec<usize>> = if n == 1 && prog.update == Update::EveryReplica {
                bucket.iter().map(|&p| vec![p]).collect()
            } else {
                vec![bucket]
            };
            for ps in groups {
                let whole: Option<Vec<Vec<f32>>> = (0..n)
                    .map(|d| {
                        ps.iter()
                            .map(|&p| grads[d][p].clone())
                            .collect::<Option<Vec<_>>>()
                            .map(|v| v.concat())
                    })
                    .collect();
                let Some(whole) = whole else {
                    ps.iter().for_each(|&p| w[p] = None);
                    continue;
                };
                let sum = ring_order(&whole);
                let mut at = 0;
                for &p in &ps {
                    let w = w[p].as_mut().expect("gradients only of live weights");
                    for (w, g) in w.iter_mut().zip(&sum[at..]) {
                        *w -= LR * g;
                    }
                    last[p].clone_from(w);
                    at += prog.lens[p];
                }
            }
        }
    }
    w
}

fn run(prog: &Program) -> Vec<Vec<Result<Vec<f32>, Error>>> {
    let n = prog.kinds.len();
    let mut b = Engine::builder().threads(1);
    for (d, &(kind, comm)) in prog.kinds.iter().enumerate() {
        let exec = match kind {
            0 => Executor::pool(1),
            1 => Executor::simulated_gpu(1),
            _ => Executor::inline(),
        };
        b = b.device(format!("d{d}"), exec);
        if comm {
            b = b.device(format!("c{d}"), Executor::pool(1));
        }
    }
    let engine = b.build().unwrap();
    let mut gb = Group::builder(&engine)
        .input(1)
        .bucket_bytes(prog.bucket_bytes)
        .update(prog.update)
        .optimizer(|w, g| w.iter_mut().zip(g).for_each(|(w, g)| *w -= LR * g));
    for (d, &(_, comm)) in prog.kinds.iter().enumerate() {
        let dev = engine.device(&format!("d{d}")).unwrap();
        gb = match engine.device(&format!("c{d}")).filter(|_| comm) {
            Some(c) => gb.device_with_comm(dev, c),
            None => gb.device(dev),
        };
    }
    let mut group = gb.build().unwrap();
    let params: Vec<_> = (0..prog.lens.len())
        .map(|p| group.param(&init(p, prog.lens[p])).unwrap())
        .collect();
    group
        .load(vec![batch(prog.seed, 0, prog.rows * n)])
        .unwrap();
    for step in 0..prog.steps {
        if prog.clears[step] {
            group.clear_poison().unwrap();
        }
        if step + 1 < prog.steps {
            group
                .load(vec![batch(prog.seed, step + 1, prog.rows * n)])
                .unwrap();
        }
        group
            .step(|s| {
                let d = s.index();
                // Backward order: the last parameter's gradient first.
                for (p, &param) in params.iter().enumerate().rev() {
                    let (x, wv, g) = (s.input(0), s.replica(param), s.grad(param));
                    let (xk, wk, gk) = (x.key(), wv.key(), g.key());
                    let (fail, seed) = (prog.fails[step][d][p], prog.seed);
                    s.engine()
                        .op()
                        .name("backward")
                        .on(s.device())
                        .reads(&[x, wv])
                        .mutates(&[g])
                        .run(move |ctx| {
                            if fail {
                                return Err(format!("backward {p} fails on {d}").into());
                            }
                            let v = grad(&ctx.read(wk)?, &ctx.read(xk)?, seed, step, d, p);
                            ctx.write(gk)?.copy_from_slice(&v);
                            Ok(())
                        })?;
                    if prog.marks[d] {
                        s.grad_ready(param)?;
                    }
                }
                Ok(())
            })
            .unwrap();
    }
    params
        .iter()
        .map(|&p| (0..n).map(|d| group.weights(p, d)).collect())
        .collect()
}

fn check(seed: u64) {
    let prog = generate(seed);
    let want = replay(&prog);
    let got = run(&prog);
    for (p, (want, got)) in want.iter().zip(&got).enumerate() {
        for (d, got) in got.iter().enumerate() {
            match (want, got) {
                (Some(w), Ok(g)) => assert_eq!(
                    w.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    g.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    "seed {seed}: parameter {p}, replica {d}: {prog:?}"
                ),
                (None, Err(Error::Poisoned { .. })) => {}
                _ => panic!(
                    "seed {seed}: parameter {p}, replica {d}: want {want:?}, got {got:?}: {prog:?}"
                ),
            }
        }
    }
}

#[test]
fn random_data_parallel_programs_match_a_serial_replay() {
    let programs = std::env::var("DEPFLOW_DIFF_PROGRAMS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60u64);
    within(300, move || {
        for seed in 0..programs {
            check(0x5EED_0000 + seed);
        }
    });
}
