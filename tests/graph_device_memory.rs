//! Planned device buffers of recorded graphs (issue 13, item 6: "on a GPU
//! device the arena is device memory and frees are stream-ordered"), on
//! the simulated GPU, whose memory fails a use after free instead of
//! reading freed memory:
//!
//! - values are right over several replays, and a chain's buffers share;
//! - the stamp checker (as `tests/graph_differential.rs`'s for host
//!   buffers): every kernel that writes a buffer stamps it with its owner
//!   and the iteration, every kernel that reads it checks the whole buffer
//!   holds that stamp, on random DAGs across two lanes, in both orders, so
//!   two live buffers given overlapping device memory are caught;
//! - the arena is taken by the first replay (not at recording), once, and
//!   given back once, after the last replay's device work, when the graph
//!   goes; a graph dropped while its replay's kernel runs frees only after
//!   that kernel;
//! - misuse gets clear errors.
//!
//! Real CUDA is in `tests/cuda.rs` (skipped without a GPU).

mod common;

use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Mem, Rng, gate, gpu_engine, mix, within};
use depflow::stream::DeviceSlice;
use depflow::{BoxError, DeviceBuffer, Engine, Error, Executor, Graph, Lane, OpCtx, Order, Var};

/// Waits (30 s at most) until `cond` holds.
fn eventually(what: &str, cond: impl Fn() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < Duration::from_secs(30), "never: {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Records `load → double → double → double → export` on `gpu`, over four
/// device buffers of 16 `u64`, alternating lanes; returns the buffers.
fn chain(
    engine: &Engine,
    gpu: depflow::Device,
    x: &Var<u64>,
    out: &Var<Mem>,
) -> (depflow::Graph, Vec<DeviceBuffer<u64>>) {
    let mut kept = Vec::new();
    let graph = engine
        .record(|rec| {
            let bufs = (0..4)
                .map(|_| rec.device_buffer::<u64>(gpu, 16))
                .collect::<Result<Vec<_>, _>>()?;
            rec.op()
                .name("load")
                .on(gpu)
                .reads(&[x])
                .mutates(&[&bufs[0]])
                .run({
                    let (x, b) = (x.key(), bufs[0].clone());
                    move |ctx| {
                        let (x, b) = (*ctx.read(x)?, ctx.device_buffer_mut(&b)?);
                        Ok(ctx.stream()?.simulate(move || {
                            b.with_mut(|v| {
                                for (j, y) in v.iter_mut().enumerate() {
                                    *y = x + j as u64;
                                }
                            })
                        })?)
                    }
                })?;
            for i in 1..4 {
                let (a, b) = (bufs[i - 1].clone(), bufs[i].clone());
                rec.op()
                    .name(format!("double {i}"))
                    .on(gpu)
                    .lane(Lane::Compute(i as u8 % 2))
                    .reads(&[&bufs[i - 1]])
                    .mutates(&[&bufs[i]])
                    .run(move |ctx| {
                        let (a, b) = (ctx.device_buffer(&a)?, ctx.device_buffer_mut(&b)?);
                        Ok(ctx.stream()?.simulate(move || {
                            let a = a.with(|v| v.to_vec())?;
                            b.with_mut(|w| {
                                for (w, a) in w.iter_mut().zip(a) {
                                    *w = a * 2;
                                }
                            })
                        })?)
                    })?;
            }
            rec.op()
                .name("export")
                .on(gpu)
                .lane(Lane::Compute(0))
                .reads(&[&bufs[3]])
                .mutates(&[out])
                .run(sum_into(&bufs[3], out))?;
            kept = bufs;
            Ok::<(), depflow::Error>(())
        })
        .unwrap();
    (graph, kept)
}

/// The body of an op that stores the sum of `b` in `out`, on its stream.
fn sum_into(
    b: &DeviceBuffer<u64>,
    out: &Var<Mem>,
) -> impl Fn(&OpCtx) -> Result<(), BoxError> + Send + Sync + 'static {
    let (b, out) = (b.clone(), out.key());
    move |ctx| {
        let (b, out) = (ctx.device_buffer(&b)?, ctx.write(out)?.clone());
        Ok(ctx
            .stream()?
            .simulate(move || b.with(|v| out.store(v.iter().sum(), SeqCst)))?)
    }
}

/// Sets `x` to `value`, replays `graph` and returns the sum it left in `out`.
fn replay_with<T: Send + Sync + 'static>(
    engine: &Engine,
    graph: &Graph,
    x: &Var<T>,
    value: T,
    out: &Var<Mem>,
) -> u64 {
    let k = x.key();
    engine
        .push(&[], &[x], move |ctx| {
            *ctx.write(k)? = value;
            Ok(())
        })
        .unwrap();
    graph.replay().wait().unwrap();
    engine.get(out).wait().unwrap().load(SeqCst)
}

#[test]
fn a_chain_of_device_buffers_is_right_over_replays_and_shares_memory() {
    within(60, || {
        let (engine, gpu) = gpu_engine(2);
        let (x, out) = (engine.var(0u64), engine.var(Mem::default()));
        let (graph, bufs) = chain(&engine, gpu, &x, &out);
        let plan = graph.device_plan(gpu).expect("a device plan");
        assert_eq!(plan.total_bytes, 4 * 128);
        // Only neighbours live at once: two buffers' worth.
        assert_eq!(plan.arena_bytes, 2 * 128, "{plan:?}");
        assert_eq!(plan.buffers.len(), 4);
        assert!(graph.plan().buffers.is_empty(), "no host buffer");
        assert!(graph.device_plan(engine.default_device()).is_none());
        // Taken by a replay, not at recording.
        assert!(!graph.is_device_allocated(gpu));
        assert_eq!(bufs[0].arena_events(), (0, 0));
        for round in 1..=4u64 {
            let got = replay_with(&engine, &graph, &x, round, &out);
            assert_eq!(got, 8 * (16 * round + 120), "round {round}");
        }
        assert!(graph.is_device_allocated(gpu));
        // Once, and kept for the next replays.
        assert_eq!(bufs[0].arena_events(), (1, 0));
        // Unwaited replays, then the graph goes: freed once, after them.
        let replays: Vec<_> = (0..5).map(|_| graph.replay()).collect();
        drop(graph);
        for r in replays {
            r.wait().unwrap();
        }
        eventually("the arena is given back", || bufs[0].arena_events().1 == 1);
        assert_eq!(bufs[0].arena_events(), (1, 1));
        engine.wait_all().wait().unwrap();
    });
}

/// A graph that is never replayed takes no device memory, and gives none
/// back.
#[test]
fn a_graph_never_replayed_takes_no_device_memory() {
    within(60, || {
        let (engine, gpu) = gpu_engine(1);
        let (x, out) = (engine.var(0u64), engine.var(Mem::default()));
        let (graph, bufs) = chain(&engine, gpu, &x, &out);
        drop(graph);
        engine.wait_all().wait().unwrap();
        assert_eq!(bufs[0].arena_events(), (0, 0));
    });
}

#[test]
fn a_graph_dropped_while_its_kernel_runs_frees_after_it() {
    within(60, || {
        let (engine, gpu) = gpu_engine(1);
        let out = engine.var(Mem::default());
        let (open, gate) = gate();
        let (entered_tx, entered) = std::sync::mpsc::channel::<()>();
        let entered_tx = Mutex::new(entered_tx);
        let mut buf = None;
        let graph = engine
            .record(|rec| {
                let b = rec.device_buffer::<u64>(gpu, 8)?;
                rec.op()
                    .on(gpu)
                    .lane(Lane::Compute(1))
                    .mutates(&[&b])
                    .run({
                        let b = b.clone();
                        move |ctx| {
                            let b = ctx.device_buffer_mut(&b)?;
                            let (gate, entered) =
                                (gate.clone(), entered_tx.lock().unwrap().clone());
                            Ok(ctx.stream()?.simulate(move || {
                                let _ = entered.send(());
                                gate.pass();
                                // Fails (the op, so the replay) if the memory
                                // was given back meanwhile.
                                b.with_mut(|v| v.fill(7))
                            })?)
                        }
                    })?;
                rec.op()
                    .on(gpu)
                    .reads(&[&b])
                    .mutates(&[&out])
                    .run(sum_into(&b, &out))?;
                buf = Some(b);
                Ok::<(), depflow::Error>(())
            })
            .unwrap();
        let buf = buf.unwrap();
        let replay = graph.replay();
        entered.recv().unwrap();
        drop(graph);
        // The kernel holds the replay, and the replay the graph's memory.
        assert_eq!(buf.arena_events(), (1, 0));
        open.send(()).unwrap();
        replay.wait().expect("no kernel touched freed memory");
        assert_eq!(engine.get(&out).wait().unwrap().load(SeqCst), 56);
        eventually("the arena is given back", || buf.arena_events().1 == 1);
        assert_eq!(buf.arena_events(), (1, 1));
    });
}

/// Buffers on two devices: an arena on each, planned, taken and given
/// back on its own; values pass from one device to the other through a
/// variable.
#[test]
fn each_device_has_its_own_arena() {
    within(60, || {
        let engine = Engine::builder()
            .threads(2)
            .device("gpu0", Executor::simulated_gpu(2))
            .device("gpu1", Executor::simulated_gpu(1))
            .build()
            .unwrap();
        let (gpu0, gpu1) = (
            engine.device("gpu0").unwrap(),
            engine.device("gpu1").unwrap(),
        );
        let (x, mid, out) = (
            engine.var(0u32),
            engine.var(Mem::default()),
            engine.var(Mem::default()),
        );
        let mut kept = None;
        let graph = engine
            .record(|rec| {
                let a = rec.device_buffer::<u32>(gpu0, 8)?;
                let b = rec.device_buffer_named::<u64>("b", gpu1, 3)?;
                rec.op().on(gpu0).reads(&[&x]).mutates(&[&a]).run({
                    let (x, a) = (x.key(), a.clone());
                    move |ctx| {
                        let (x, a) = (*ctx.read(x)?, ctx.device_buffer_mut(&a)?);
                        Ok(ctx.stream()?.simulate(move || a.with_mut(|v| v.fill(x)))?)
                    }
                })?;
                rec.op()
                    .on(gpu0)
                    .lane(Lane::Compute(1))
                    .reads(&[&a])
                    .mutates(&[&mid])
                    .run({
                        let (a, mid) = (a.clone(), mid.key());
                        move |ctx| {
                            let (a, mid) = (ctx.device_buffer(&a)?, ctx.write(mid)?.clone());
                            Ok(ctx.stream()?.simulate(move || {
                                a.with(|v| mid.store(v.iter().map(|&y| u64::from(y)).sum(), SeqCst))
                            })?)
                        }
                    })?;
                rec.op().on(gpu1).reads(&[&mid]).mutates(&[&b]).run({
                    let (mid, b) = (mid.key(), b.clone());
                    move |ctx| {
                        let (mid, b) = (ctx.read(mid)?.clone(), ctx.device_buffer_mut(&b)?);
                        Ok(ctx
                            .stream()?
                            .simulate(move || b.with_mut(|v| v.fill(mid.load(SeqCst))))?)
                    }
                })?;
                rec.op()
                    .on(gpu1)
                    .reads(&[&b])
                    .mutates(&[&out])
                    .run(sum_into(&b, &out))?;
                kept = Some((a, b));
                Ok::<(), depflow::Error>(())
            })
            .unwrap();
        let (a, b) = kept.unwrap();
        assert_eq!((a.device_index(), b.device_index()), (1, 2));
        assert_eq!(graph.device_plan(gpu0).unwrap().total_bytes, 32);
        assert_eq!(graph.device_plan(gpu1).unwrap().total_bytes, 24);
        for round in 1..=3u32 {
            let got = replay_with(&engine, &graph, &x, round, &out);
            assert_eq!(got, 3 * 8 * u64::from(round), "round {round}");
        }
        assert!(graph.is_device_allocated(gpu0) && graph.is_device_allocated(gpu1));
        assert_eq!((a.arena_events(), b.arena_events()), ((1, 0), (1, 0)));
        drop(graph);
        eventually("both arenas are given back", || {
            a.arena_events().1 == 1 && b.arena_events().1 == 1
        });
    });
}

/// A graph that outlives its engine gives its device memory back when it
/// goes. (Seen failing before the simulated device freed at once once shut
/// down: the free waited, unrun, in a stopped lane's queue for as long as
/// anything held the device.)
#[test]
fn a_graph_that_outlives_its_engine_frees_its_device_memory() {
    within(60, || {
        let (engine, gpu) = gpu_engine(1);
        let (x, out) = (engine.var(1u64), engine.var(Mem::default()));
        let (graph, bufs) = chain(&engine, gpu, &x, &out);
        graph.replay().wait().unwrap();
        drop(engine);
        assert!(matches!(graph.replay().wait(), Err(Error::ShutDown)));
        assert_eq!(bufs[0].arena_events(), (1, 0));
        drop(graph);
        eventually("the arena is given back", || bufs[0].arena_events().1 == 1);
    });
}

// ---- the stamp checker on random DAGs ----

/// A buffer's stamp for an iteration: its owner and the iteration, in 32
/// bits, over the value's low 32 bits, each word xored with its index.
fn stamp(data: &mut [u64], owner: u64, iteration: u64, value: u64) {
    let word = ((owner << 16 | (iteration & 0xffff)) & 0xffff_ffff) << 32 | (value & 0xffff_ffff);
    for (j, x) in data.iter_mut().enumerate() {
        *x = word ^ j as u64;
    }
}

#[derive(Default)]
struct Checker {
    violations: Mutex<Vec<String>>,
    verified: AtomicU64,
}

impl Checker {
    /// The value `owner`'s stamp of `iteration` in `data` carries, or a
    /// violation (recorded) if any word is not that stamp.
    fn verify(&self, owner: u64, iteration: u64, data: &[u64], op: &str) -> Result<u64, String> {
        let want = (owner << 16 | (iteration & 0xffff)) & 0xffff_ffff;
        let value = data[0] & 0xffff_ffff;
        for (j, &x) in data.iter().enumerate() {
            let x = x ^ j as u64;
            if x >> 32 != want || x & 0xffff_ffff != value {
                let msg = format!(
                    "{op} reads buffer {owner} of iteration {iteration}: word {j} holds the stamp \
                     of buffer {}, iteration {}",
                    x >> 48,
                    (x >> 32) & 0xffff
                );
                self.violations.lock().unwrap().push(msg.clone());
                return Err(msg);
            }
        }
        self.verified.fetch_add(1, SeqCst);
        Ok(value)
    }
}

/// A random op: the buffers it reads and those it mutates (each with
/// whether it is the buffer's first writer), and its lane.
#[derive(Debug, Clone)]
struct RandomOp {
    reads: Vec<usize>,
    mutates: Vec<(usize, bool)>,
    lane: u8,
}

fn random_program(rng: &mut Rng) -> (Vec<usize>, Vec<RandomOp>) {
    let lens: Vec<usize> = (0..2 + rng.below(7))
        .map(|_| 1 + rng.below(48) as usize)
        .collect();
    let mut written = vec![false; lens.len()];
    let ops = (0..4 + rng.below(11))
        .map(|_| {
            let mut mutates: Vec<(usize, bool)> = Vec::new();
            for _ in 0..1 + rng.below(2) {
                let b = rng.below(lens.len() as u64) as usize;
                if !mutates.iter().any(|m| m.0 == b) {
                    mutates.push((b, !written[b]));
                }
            }
            let mut reads = Vec::new();
            for _ in 0..rng.below(3) {
                let b = rng.below(lens.len() as u64) as usize;
                if written[b] && !reads.contains(&b) && !mutates.iter().any(|m| m.0 == b) {
                    reads.push(b);
                }
            }
            for &(b, _) in &mutates {
                written[b] = true;
            }
            RandomOp {
                reads,
                mutates,
                lane: rng.below(2) as u8,
            }
        })
        .collect();
    (lens, ops)
}

/// Records `ops` over device buffers of `lens` on `gpu` (each op's kernel
/// checks what it reads and stamps what it writes), replays it `replays`
/// times (not waiting in between), and returns how many reads the checker
/// verified.
#[allow(clippy::too_many_arguments)]
fn run_program(
    engine: &Engine,
    gpu: depflow::Device,
    order: Order,
    lens: &[usize],
    ops: &[RandomOp],
    replays: u64,
    checker: &Arc<Checker>,
    what: &str,
) -> (usize, usize) {
    let iter = engine.var(0u64);
    let graph = engine
        .record(|rec| {
            rec.order(order);
            let bufs = lens
                .iter()
                .map(|&n| rec.device_buffer::<u64>(gpu, n))
                .collect::<Result<Vec<_>, _>>()?;
            for (i, op) in ops.iter().enumerate() {
                let reads: Vec<&dyn depflow::AnyVar> = std::iter::once(&iter as _)
                    .chain(op.reads.iter().map(|&b| &bufs[b] as _))
                    .collect();
                let mutates: Vec<&dyn depflow::AnyVar> =
                    op.mutates.iter().map(|&(b, _)| &bufs[b] as _).collect();
                let (op, bufs, checker) = (op.clone(), bufs.clone(), checker.clone());
                let (iter, name) = (iter.key(), format!("op {i}"));
                rec.op()
                    .name(name.clone())
                    .on(gpu)
                    .lane(Lane::Compute(op.lane))
                    .reads(&reads)
                    .mutates(&mutates)
                    .run(move |ctx| {
                        let it = *ctx.read(iter)?;
                        let reads = op
                            .reads
                            .iter()
                            .map(|&b| Ok((b, ctx.device_buffer(&bufs[b])?)))
                            .collect::<Result<Vec<(usize, DeviceSlice<u64>)>, Error>>()?;
                        let writes = op
                            .mutates
                            .iter()
                            .map(|&(b, fresh)| Ok((b, fresh, ctx.device_buffer_mut(&bufs[b])?)))
                            .collect::<Result<Vec<(usize, bool, DeviceSlice<u64>)>, Error>>()?;
                        let (checker, name) = (checker.clone(), name.clone());
                        Ok(ctx.stream()?.simulate(move || {
                            let mut inputs = i as u64;
                            for (b, s) in &reads {
                                let v = s.with(|d| checker.verify(*b as u64, it, d, &name))??;
                                inputs = mix(inputs ^ v);
                            }
                            for (k, (b, fresh, s)) in writes.iter().enumerate() {
                                s.with_mut(|d| {
                                    let old = if *fresh {
                                        0
                                    } else {
                                        checker.verify(*b as u64, it, d, &name)?
                                    };
                                    stamp(d, *b as u64, it, mix(old ^ inputs ^ k as u64));
                                    Ok::<(), String>(())
                                })??;
                            }
                            Ok(())
                        })?)
                    })?;
            }
            Ok::<(), depflow::Error>(())
        })
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let plan = graph.device_plan(gpu).unwrap();
    assert!(plan.arena_bytes <= plan.total_bytes, "{what}: {plan:?}");
    let sizes = (plan.arena_bytes, plan.total_bytes);
    let mut pending = Vec::new();
    for it in 1..=replays {
        engine
            .push(&[], &[&iter], {
                let iter = iter.key();
                move |ctx| {
                    *ctx.write(iter)? = it;
                    Ok(())
                }
            })
            .unwrap();
        pending.push(graph.replay());
    }
    for (k, r) in pending.into_iter().enumerate() {
        if let Err(e) = r.wait() {
            panic!(
                "{what}: replay {k} failed: {e}; violations: {:?}",
                checker.violations.lock().unwrap()
            );
        }
    }
    sizes
}

#[test]
fn planned_sharing_of_device_memory_is_safe_on_random_dags_across_two_lanes() {
    within(240, || {
        let seeds: u64 = std::env::var("DEPFLOW_GRAPH_SEEDS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(60);
        let (engine, gpu) = gpu_engine(2);
        let checker = Arc::new(Checker::default());
        // Graphs whose plan shares memory (else the checker proves little).
        let mut shared = 0;
        for seed in 0..seeds {
            let mut rng = Rng(seed);
            let (lens, ops) = random_program(&mut rng);
            for order in [Order::Parallel, Order::Sequential] {
                let what = format!("seed {seed}, {order:?}, buffers {lens:?}, ops {ops:?}");
                let (arena, total) =
                    run_program(&engine, gpu, order, &lens, &ops, 3, &checker, &what);
                shared += usize::from(arena < total);
            }
        }
        let violations = checker.violations.lock().unwrap();
        assert!(violations.is_empty(), "{violations:?}");
        assert!(checker.verified.load(SeqCst) > 0);
        assert!(
            shared >= seeds as usize / 2,
            "only {shared} graphs share memory"
        );
        engine.wait_all().wait().unwrap();
    });
}

// ---- misuse ----

#[test]
fn device_buffers_off_their_device_are_refused() {
    let engine = Engine::builder()
        .threads(1)
        .device("gpu0", Executor::simulated_gpu(1))
        .device("gpu1", Executor::simulated_gpu(1))
        .device("cpu1", Executor::pool(1))
        .build()
        .unwrap();
    let (gpu0, gpu1) = (
        engine.device("gpu0").unwrap(),
        engine.device("gpu1").unwrap(),
    );
    let cpu = engine.device("cpu1").unwrap();
    let graph_err = |r: Result<depflow::Graph, Error>, want: &str| match r {
        Err(Error::Graph(m)) => assert!(m.contains(want), "{m}"),
        other => panic!("expected a graph error with {want:?}, got {other:?}"),
    };
    // A host op.
    graph_err(
        engine.record(|rec| {
            let b = rec.device_buffer::<f32>(gpu0, 4)?;
            rec.op().name("host").mutates(&[&b]).run(|_| Ok(()))
        }),
        "on the host",
    );
    // Another device's op.
    graph_err(
        engine.record(|rec| {
            let b = rec.device_buffer::<f32>(gpu0, 4)?;
            rec.op().on(gpu1).mutates(&[&b]).run(|_| Ok(()))
        }),
        "on device 2",
    );
    // A device without streams.
    graph_err(
        engine.record(|rec| rec.device_buffer::<f32>(cpu, 4).map(drop)),
        "no streams",
    );
    // Another engine's device.
    let other = Engine::builder()
        .device("gpu", Executor::simulated_gpu(1))
        .build()
        .unwrap();
    let theirs = other.device("gpu").unwrap();
    assert!(matches!(
        engine.record(|rec| rec.device_buffer::<f32>(theirs, 4).map(drop)),
        Err(Error::Config(_))
    ));
    // Read before any write.
    graph_err(
        engine.record(|rec| {
            let b = rec.device_buffer::<f32>(gpu0, 4)?;
            let v = rec.new_var();
            rec.op()
                .on(gpu0)
                .reads(&[&b])
                .mutates(&[&v])
                .run(|_| Ok(()))
        }),
        "before any op writes it",
    );
    // Pushed dynamically.
    let mut kept = None;
    let _graph = engine
        .record(|rec| {
            let b = rec.device_buffer::<f32>(gpu0, 4)?;
            rec.op().on(gpu0).mutates(&[&b]).run(|_| Ok(()))?;
            kept = Some(b);
            Ok::<(), depflow::Error>(())
        })
        .unwrap();
    let b = kept.unwrap();
    assert!(matches!(
        engine.push(&[], &[&b], |_| Ok(())),
        Err(Error::GraphOwned(_))
    ));
}

#[test]
fn views_refuse_what_their_op_did_not_declare_and_bad_casts() {
    within(60, || {
        let (engine, gpu) = gpu_engine(1);
        let seen: Arc<Mutex<Vec<String>>> = Arc::default();
        let graph = engine
            .record(|rec| {
                let a = rec.device_buffer::<u8>(gpu, 6)?;
                let b = rec.device_buffer::<u32>(gpu, 4)?;
                rec.op().on(gpu).mutates(&[&a, &b]).run({
                    let (a, b) = (a.clone(), b.clone());
                    move |ctx| {
                        let (a, b) = (ctx.device_buffer_mut(&a)?, ctx.device_buffer_mut(&b)?);
                        // 4 u32 are 2 u64; 6 u8 are no whole u32.
                        assert_eq!(b.cast::<u64>()?.len(), 2);
                        assert!(matches!(a.cast::<u32>(), Err(Error::Graph(_))));
                        Ok(ctx.stream()?.simulate(move || {
                            a.with_mut(|x| x.fill(1))?;
                            b.with_mut(|x| x.fill(2))
                        })?)
                    }
                })?;
                rec.op().on(gpu).reads(&[&a]).mutates(&[&b]).run({
                    let (a, b, seen) = (a.clone(), b.clone(), seen.clone());
                    move |ctx| {
                        let mut seen = seen.lock().unwrap();
                        match ctx.device_buffer_mut(&a) {
                            Err(Error::NotMutable(_)) => {}
                            other => seen.push(format!("device_buffer_mut on a read: {other:?}")),
                        }
                        let (ra, wb) = (ctx.device_buffer(&a)?, ctx.device_buffer_mut(&b)?);
                        Ok(ctx.stream()?.simulate(move || {
                            if ra.with_mut(|x| x[0] = 9).is_ok() {
                                return Err("wrote through a read-only slice".into());
                            }
                            match ra.with(|_| wb.with(|_| ())) {
                                Ok(Err(m)) if m.contains("inside another") => Ok(()),
                                other => Err(format!("nested: {other:?}")),
                            }
                        })?)
                    }
                })
            })
            .unwrap();
        graph.replay().wait().unwrap();
        engine.wait_all().wait().unwrap();
        let seen = seen.lock().unwrap();
        assert!(seen.is_empty(), "{seen:?}");
    });
}
