//! Data-parallel groups (`depflow::parallel`): the ring all-reduce against
//! a serial sum in the same order, both update modes against a serial run,
//! bad input, and failing ops.

mod common;

use common::parallel::{backward, hold, ring_order, sgd};
use common::{mix, within};
use depflow::parallel::{
    AllReduce, Backend, Group, Overlap, Param, Update, chunk_range, serial_sum,
};
use depflow::{Device, Engine, Error, Executor, Tracing, Var};

/// An engine with `n` devices: CPU devices (one worker each), or, with
/// `gpu`, every other one a simulated GPU.
fn engine(n: usize, gpu: bool, tracing: Tracing) -> (Engine, Vec<Device>) {
    let mut b = Engine::builder().threads(1).tracing(tracing);
    for d in 0..n {
        let exec = if gpu && d % 2 == 1 {
            Executor::simulated_gpu(1)
        } else {
            Executor::pool(1)
        };
        b = b.device(format!("d{d}"), exec);
    }
    let engine = b.build().unwrap();
    let devices = (0..n)
        .map(|d| engine.device(&format!("d{d}")).unwrap())
        .collect();
    (engine, devices)
}

/// Floats of very different magnitudes, so that the order of a sum shows
/// in its bits.
fn values(seed: u64, len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| {
            let z = mix(seed ^ ((i as u64) << 20));
            let exp = (z % 24) as i32 - 12;
            ((z >> 32) as f32 / u32::MAX as f32 - 0.5) * 2f32.powi(exp)
        })
        .collect()
}

fn bits(xs: &[f32]) -> Vec<u32> {
    xs.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn the_ring_all_reduce_is_the_serial_sum_in_ring_order() {
    within(60, || {
        for n in 1..=5 {
            for gpu in [false, true] {
                let (engine, devices) = engine(n, gpu, Tracing::Off);
                // Segments of odd lengths (one empty), summed as one buffer.
                let lens = [7usize, 0, 1, 13, 101];
                let seg = |d: usize, s: usize| values(((n * 10 + d) * 10 + s) as u64, lens[s]);
                let grads: Vec<Vec<Var<Vec<f32>>>> = (0..n)
                    .map(|d| (0..lens.len()).map(|s| engine.var(seg(d, s))).collect())
                    .collect();
                let reduce =
                    AllReduce::new(&engine, &devices, grads.clone(), &lens, Backend::Ring).unwrap();
                assert_eq!(reduce.len(), lens.iter().sum::<usize>());
                reduce.push(&engine, 1).unwrap();
                let whole: Vec<Vec<f32>> = (0..n)
                    .map(|d| (0..lens.len()).flat_map(|s| seg(d, s)).collect())
                    .collect();
                let want = ring_order(&whole);
                let refs: Vec<&[f32]> = whole.iter().map(|b| &b[..]).collect();
                assert_eq!(bits(&serial_sum(&refs)), bits(&want), "n = {n}");
                for (d, segs) in grads.iter().enumerate() {
                    let got: Vec<f32> = segs
                        .iter()
                        .flat_map(|s| engine.get(s).wait().unwrap())
                        .collect();
                    assert_eq!(bits(&got), bits(&want), "n = {n}, gpu {gpu}, device {d}");
                }
            }
        }
    });
}

#[test]
fn the_order_of_the_sum_shows_in_the_values_used() {
    // Guards the test above: with these values another order gives other
    // bits, so agreeing with the ring's order is not a coincidence.
    let bufs: Vec<Vec<f32>> = (0..4).map(|d| values(40 + d, 101)).collect();
    let mut other = vec![0.0f32; 101];
    for b in &bufs {
        for (o, x) in other.iter_mut().zip(b) {
            *o += *x;
        }
    }
    assert_ne!(bits(&other), bits(&ring_order(&bufs)));
}

#[test]
fn an_all_reduce_repeats_and_counts_its_ops() {
    let (engine, devices) = engine(3, false, Tracing::On);
    let grads: Vec<Vec<Var<Vec<f32>>>> = (0..3)
        .map(|d| vec![engine.var(vec![d as f32; 10])])
        .collect();
    let reduce = AllReduce::new(&engine, &devices, grads.clone(), &[10], Backend::Ring).unwrap();
    reduce.push(&engine, 0).unwrap();
    reduce.push(&engine, 0).unwrap(); // sums the sums
    for g in &grads {
        assert_eq!(engine.get(&g[0]).wait().unwrap(), vec![9.0; 10]);
    }
    engine.wait_all().wait().unwrap();
    // Per push: 3 packs, 2 * 3 * 2 ring steps, 3 unpacks; nothing is compute.
    let trace = engine.trace().unwrap();
    let overlap = Overlap::measure(&trace, |_| false);
    assert_eq!(overlap.ops, 2 * (3 + 12 + 3));
    // Each device receives 2 (n - 1) chunks a push: one reduce-scatter
    // and one all-gather op per ring step, each on a third of the buffer.
    for d in ["d0", "d1", "d2"] {
        let ring = trace.ops().iter().filter(|op| {
            op.device() == d && matches!(op.name(), Some("allreduce reduce" | "allreduce gather"))
        });
        assert_eq!(ring.count(), 2 * 2 * 2, "device {d}");
    }
    assert_eq!(overlap.hidden, std::time::Duration::ZERO);
}

/// A linear model `y = w . x` with squared loss, trained by a group: its
/// per-device gradient op, and the same computation serially.
struct Linear {
    dims: usize,
    rows: usize,
    steps: usize,
    lr: f32,
}

impl Linear {
    fn batch(&self, step: usize) -> Vec<Vec<f32>> {
        let x = values(1000 + step as u64, self.rows * self.dims);
        let y = values(2000 + step as u64, self.rows);
        vec![x, y]
    }

    /// The gradient of rows `x`, `y` at `w` (also what the ops compute).
    fn grad(dims: usize, w: &[f32], x: &[f32], y: &[f32]) -> Vec<f32> {
        let mut g = vec![0.0; dims + 1];
        for (row, &t) in x.chunks(dims).zip(y) {
            let p: f32 = row.iter().zip(w).map(|(a, b)| a * b).sum::<f32>() + w[dims];
            let e = p - t;
            for (gi, xi) in g.iter_mut().zip(row) {
                *gi += e * xi;
            }
            g[dims] += e;
        }
        g
    }

    fn train(&self, n: usize, update: Update, gpu: bool) -> Result<Vec<Vec<f32>>, Error> {
        let (engine, devices) = engine(n, gpu, Tracing::Off);
        let lr = self.lr;
        let mut group = Group::builder(&engine)
            .devices(devices)
            .input(self.dims)
            .input(1)
            .update(update)
            .optimizer(move |w, g| w.iter_mut().zip(g).for_each(|(w, g)| *w -= lr * g))
            .build()?;
        let w = group.param(&values(7, self.dims + 1))?;
        group.load(self.batch(0))?;
        for step in 0..self.steps {
            if step + 1 < self.steps {
                group.load(self.batch(step + 1))?; // prefetch
            }
            let dims = self.dims;
            group.step(|s| {
                backward(s, w, move |x, y, w, g| {
                    g.copy_from_slice(&Self::grad(dims, w, x, y));
                    Ok(())
                })
            })?;
        }
        (0..n).map(|d| group.weights(w, d)).collect()
    }

    /// The same training, serially: shards, gradients, the ring's sum, SGD.
    fn serial(&self, n: usize) -> Vec<f32> {
        let mut w = values(7, self.dims + 1);
        let r = self.rows / n;
        for step in 0..self.steps {
            let batch = self.batch(step);
            let grads: Vec<Vec<f32>> = (0..n)
                .map(|d| {
                    let x = &batch[0][d * r * self.dims..(d + 1) * r * self.dims];
                    Self::grad(self.dims, &w, x, &batch[1][d * r..(d + 1) * r])
                })
                .collect();
            let g = ring_order(&grads);
            w.iter_mut().zip(&g).for_each(|(w, g)| *w -= self.lr * g);
        }
        w
    }
}

#[test]
fn both_update_modes_give_the_serial_runs_weights_bit_for_bit() {
    within(60, || {
        let model = Linear {
            dims: 9,
            rows: 60,
            steps: 5,
            lr: 0.01,
        };
        for n in [1, 2, 3, 4] {
            let want = bits(&model.serial(n));
            for update in [Update::EveryReplica, Update::Host] {
                for gpu in [false, true] {
                    let got = model.train(n, update, gpu).unwrap();
                    for (d, w) in got.iter().enumerate() {
                        assert_eq!(bits(w), want, "n {n}, {update:?}, gpu {gpu}, replica {d}");
                    }
                }
            }
        }
    });
}

#[test]
fn buckets_of_small_gradients_sum_like_one_per_parameter() {
    within(60, || {
        let run = |bucket_bytes: usize| {
            let (engine, devices) = engine(3, false, Tracing::Off);
            let mut group = Group::builder(&engine)
                .devices(devices)
                .bucket_bytes(bucket_bytes)
                .build()
                .unwrap();
            let lens = [5usize, 1, 33, 2, 0, 17];
            let params: Vec<Param> = lens
                .iter()
                .map(|&l| group.param(&vec![0.0; l]).unwrap())
                .collect();
            group
                .step(|s| {
                    let d = s.index();
                    for (i, &p) in params.iter().enumerate() {
                        let (g, v) = (s.grad(p).key(), values((d * 10 + i) as u64, lens[i]));
                        s.engine()
                            .op()
                            .on(s.device())
                            .mutates(&[s.grad(p)])
                            .run(move |ctx| {
                                ctx.write(g)?.copy_from_slice(&v);
                                Ok(())
                            })
                            .unwrap();
                    }
                    Ok(())
                })
                .unwrap();
            params
                .iter()
                .map(|&p| engine.get(group.grad(p, 2)).wait().unwrap())
                .collect::<Vec<_>>()
        };
        let alone = run(0);
        let bucketed = run(1 << 20);
        // Bucketed, the chunks cut the concatenation: other orders per
        // element, so compare with the ring order over the concatenation.
        let lens = [5usize, 1, 33, 2, 0, 17];
        let whole: Vec<Vec<f32>> = (0..3)
            .map(|d| {
                (0..lens.len())
                    .flat_map(|i| values((d * 10 + i) as u64, lens[i]))
                    .collect()
            })
            .collect();
        let got: Vec<f32> = bucketed.concat();
        assert_eq!(bits(&got), bits(&ring_order(&whole)));
        for (i, g) in alone.iter().enumerate() {
            let each: Vec<Vec<f32>> = (0..3)
                .map(|d| values((d * 10 + i) as u64, lens[i]))
                .collect();
            assert_eq!(bits(g), bits(&ring_order(&each)), "parameter {i}");
        }
    });
}

fn parallel_error<T: std::fmt::Debug>(r: Result<T, Error>, words: &str) {
    match r {
        Err(Error::Parallel(msg)) => assert!(msg.contains(words), "{msg:?} lacks {words:?}"),
        other => panic!("expected Error::Parallel({words:?}), got {other:?}"),
    }
}

#[test]
fn bad_input_is_refused_with_a_clear_error() {
    let (engine, devices) = engine(2, false, Tracing::Off);
    parallel_error(
        Group::builder(&engine)
            .devices([devices[0], devices[1], devices[0]])
            .build(),
        "twice",
    );
    parallel_error(Group::builder(&engine).build(), "no devices");
    parallel_error(
        Group::builder(&engine).device(devices[0]).input(0).build(),
        "width 0",
    );

    let mut group = Group::builder(&engine)
        .devices(devices.clone())
        .input(3)
        .input(1)
        .build()
        .unwrap();
    parallel_error(
        group.param_replicas(vec![vec![0.0; 4], vec![0.0; 5]]),
        "different shapes",
    );
    parallel_error(
        group.param_replicas(vec![vec![0.0; 4]]),
        "1 replicas for 2 devices",
    );
    parallel_error(group.load(vec![vec![], vec![]]), "empty batch");
    parallel_error(
        group.load(vec![vec![0.0; 9], vec![0.0; 3]]),
        "does not split over 2",
    );
    parallel_error(
        group.load(vec![vec![0.0; 7], vec![0.0; 2]]),
        "not whole rows of 3",
    );
    parallel_error(
        group.load(vec![vec![0.0; 6], vec![0.0; 4]]),
        "input 1 has 4 rows",
    );
    parallel_error(group.load(vec![vec![0.0; 6]]), "1 inputs for a group of 2");
    parallel_error(group.step(|_| Ok(())), "no batch loaded");

    let p = group.param(&[1.0]).unwrap();
    for _ in 0..2 {
        group.load(vec![vec![0.0; 6], vec![0.0; 2]]).unwrap();
    }
    parallel_error(
        group.load(vec![vec![0.0; 6], vec![0.0; 2]]),
        "already loaded",
    );
    parallel_error(
        group.step(|s| {
            s.grad_ready(p)?;
            s.grad_ready(p)
        }),
        "twice in one step",
    );
    group.step(|_| Ok(())).unwrap();
    parallel_error(group.param(&[1.0]), "before the first step");
    // Nothing was left half pushed, nothing failed.
    engine.wait_all().wait().unwrap();
    assert_eq!(group.weights(p, 1).unwrap(), [1.0]);
    // Indices out of range: errors, not panics.
    parallel_error(group.weights(p, 2), "no device 2");
    parallel_error(chunk_range(10, 0, 0), "cut into 0 chunk(s)");
    parallel_error(chunk_range(10, 3, 3), "chunk 3 of");
}

#[test]
fn a_failing_backward_op_poisons_every_replica_and_only_its_bucket() {
    within(60, || {
        for update in [Update::EveryReplica, Update::Host] {
            let (engine, devices) = engine(3, true, Tracing::Off);
            let mut group = Group::builder(&engine)
                .devices(devices)
                .bucket_bytes(0)
                .update(update)
                .optimizer(sgd)
                .build()
                .unwrap();
            let (a, b) = (
                group.param(&[1.0; 4]).unwrap(),
                group.param(&[1.0; 3]).unwrap(),
            );
            group
                .step(|s| {
                    let fail = s.index() == 1;
                    for p in [b, a] {
                        s.engine()
                            .op()
                            .name(if p == a && fail {
                                "failing backward"
                            } else {
                                "backward"
                            })
                            .on(s.device())
                            .mutates(&[s.grad(p)])
                            .run({
                                let g = s.grad(p).key();
                                move |ctx| {
                                    if p == a && fail {
                                        return Err("out of memory".into());
                                    }
                                    ctx.write(g)?.fill(0.5);
                                    Ok(())
                                }
                            })?;
                        s.grad_ready(p)?;
                    }
                    Ok(())
                })
                .unwrap();
            for d in 0..3 {
                match group.weights(a, d) {
                    Err(Error::Poisoned { cause, .. }) => {
                        assert_eq!(cause.op_name(), Some("failing backward"), "{update:?}")
                    }
                    other => panic!("{update:?}: replica {d} of a: {other:?}"),
                }
                // The other bucket: summed over three devices, updated.
                assert_eq!(group.weights(b, d).unwrap(), [-0.5; 3], "{update:?}");
            }
        }
    });
}

#[test]
fn a_stream_devices_split_and_copy_back_go_to_its_host_to_device_lane() {
    // d0 a CPU device, d1 a simulated GPU with one compute stream: its
    // host-to-device lane is lane 1.
    let (engine, devices) = engine(2, true, Tracing::On);
    let mut group = Group::builder(&engine)
        .devices(devices)
        .input(1)
        .update(Update::Host)
        .optimizer(sgd)
        .build()
        .unwrap();
    let p = group.param(&[0.0]).unwrap();
    group.load(vec![vec![1.0, 2.0]]).unwrap();
    group.step(|_| Ok(())).unwrap();
    engine.wait_all().wait().unwrap();
    let trace = engine.trace().unwrap();
    let lanes = |name: &str| -> Vec<(String, Option<u8>)> {
        trace
            .ops()
            .iter()
            .filter(|op| op.name() == Some(name))
            .map(|op| (op.device().to_string(), op.lane()))
            .collect()
    };
    let want = vec![("d0".to_string(), None), ("d1".to_string(), Some(1))];
    assert_eq!(lanes("split"), want);
    assert_eq!(lanes("copy back"), want);
    assert_eq!(group.weights(p, 1).unwrap(), [0.0]);
}

/// A group of two parameters, one bucket each (3 and 5 floats: the first
/// layer's, the last's), on `n` CPU devices of a traced engine, with SGD
/// if `optimizer`; each device's one worker held until its gate sends.
struct TwoLayers {
    engine: Engine,
    devices: Vec<Device>,
    group: Group,
    first: Param,
    last: Param,
    gates: Vec<std::sync::mpsc::Sender<()>>,
}

fn two_layers(n: usize, optimizer: bool) -> TwoLayers {
    let (engine, devices) = engine(n, false, Tracing::On);
    let mut builder = Group::builder(&engine)
        .devices(devices.clone())
        .bucket_bytes(0);
    if optimizer {
        builder = builder.optimizer(sgd);
    }
    let mut group = builder.build().unwrap();
    let (first, last) = (
        group.param(&[0.0; 3]).unwrap(),
        group.param(&[0.0; 5]).unwrap(),
    );
    let gates = hold(&engine, &devices);
    TwoLayers {
        engine,
        devices,
        group,
        first,
        last,
        gates,
    }
}

#[test]
fn the_first_layers_reduction_goes_first() {
    within(60, || {
        // One worker per device, held until everything is pushed: then
        // both buckets' packs are made ready by one op, and the worker
        // picks by priority.
        let TwoLayers {
            engine,
            mut group,
            first,
            last,
            gates,
            ..
        } = two_layers(2, false);
        group
            .step(|s| {
                // One backward op writes both gradients (the last layer's
                // is marked first, as backward would).
                let (a, b) = (s.grad(first), s.grad(last));
                let (ak, bk) = (a.key(), b.key());
                s.engine()
                    .op()
                    .name("backward")
                    .on(s.device())
                    .mutates(&[a, b])
                    .run(move |ctx| {
                        ctx.write(ak)?.fill(1.0);
                        ctx.write(bk)?.fill(1.0);
                        Ok(())
                    })?;
                s.grad_ready(last)?;
                s.grad_ready(first)
            })
            .unwrap();
        gates.iter().for_each(|g| g.send(()).unwrap());
        engine.wait_all().wait().unwrap();
        let trace = engine.trace().unwrap();
        let first_grad = group.grad(first, 0).id();
        let mut packs: Vec<_> = trace
            .ops()
            .iter()
            .filter(|op| op.name() == Some("allreduce pack") && op.device() == "d0")
            .collect();
        packs.sort_by_key(|op| op.started());
        assert_eq!(packs.len(), 2);
        assert_eq!(
            packs[0].reads(),
            [first_grad],
            "the first layer's bucket is packed first"
        );
        assert_eq!(engine.get(group.grad(first, 1)).wait().unwrap(), [2.0; 3]);
    });
}

#[test]
fn updates_wait_for_the_backward_ops_still_to_run() {
    within(60, || {
        // One device (no ring: the update is pushed right behind the
        // backward op), its worker held until everything is pushed. The first backward
        // op makes ready both the update of the parameter it wrote and
        // the next backward op: the backward op goes first (the update is
        // needed only by the next step; the backward op makes the
        // gradients still to be reduced).
        let TwoLayers {
            engine,
            devices,
            mut group,
            first,
            last,
            gates,
        } = two_layers(1, true);
        let dys: Vec<Var<Vec<f32>>> = devices.iter().map(|_| engine.var(Vec::new())).collect();
        group
            .step(|s| {
                let dy = &dys[s.index()];
                let (g, dyk) = (s.grad(last), dy.key());
                let gk = g.key();
                s.engine()
                    .op()
                    .name("backward")
                    .on(s.device())
                    .mutates(&[g, dy])
                    .run(move |ctx| {
                        ctx.write(gk)?.fill(1.0);
                        ctx.write(dyk)?.push(1.0);
                        Ok(())
                    })?;
                s.grad_ready(last)?;
                let g = s.grad(first);
                let gk = g.key();
                s.engine()
                    .op()
                    .name("backward")
                    .on(s.device())
                    .reads(&[dy])
                    .mutates(&[g])
                    .run(move |ctx| {
                        ctx.write(gk)?.fill(ctx.read(dyk)?[0]);
                        Ok(())
                    })?;
                s.grad_ready(first)
            })
            .unwrap();
        gates.iter().for_each(|g| g.send(()).unwrap());
        engine.wait_all().wait().unwrap();
        let trace = engine.trace().unwrap();
        let started = |name: &str, nth: usize| {
            let mut times: Vec<_> = trace
                .ops()
                .iter()
                .filter(|op| op.name() == Some(name))
                .map(|op| op.started().unwrap())
                .collect();
            times.sort();
            times[nth]
        };
        assert!(
            started("backward", 1) < started("update", 0),
            "the second backward op runs before any update"
        );
        assert_eq!(group.weights(last, 0).unwrap(), [-1.0; 5]);
        assert_eq!(group.weights(first, 0).unwrap(), [-1.0; 3]);
    });
}

#[test]
fn overlap_counts_the_reduction_time_spent_under_compute() {
    within(60, || {
        // "backward" on d0 runs until an op that follows "allreduce x" has
        // started; "allreduce x" is pushed once "backward" runs: the
        // reduction's whole span lies inside the backward op's.
        let (engine, devices) = engine(2, false, Tracing::On);
        let (started, running) = std::sync::mpsc::channel::<()>();
        let (after, done) = std::sync::mpsc::channel::<()>();
        let (a, b, c) = (engine.new_var(), engine.new_var(), engine.new_var());
        engine
            .op()
            .name("backward")
            .on(devices[0])
            .mutates(&[&a])
            .run(move |_| {
                started.send(())?;
                done.recv()?;
                Ok(())
            })
            .unwrap();
        running.recv().unwrap();
        engine
            .op()
            .name("allreduce x")
            .on(devices[1])
            .mutates(&[&b])
            .run(|_| Ok(()))
            .unwrap();
        engine
            .op()
            .name("after")
            .on(devices[1])
            .reads(&[&b])
            .mutates(&[&c])
            .run(move |_| {
                after.send(())?;
                Ok(())
            })
            .unwrap();
        engine.wait_all().wait().unwrap();
        let trace = engine.trace().unwrap();
        let o = Overlap::measure(&trace, |op| op.name() == Some("backward"));
        assert_eq!((o.ops, o.started_under), (1, 1));
        assert!(!o.reduce.is_zero());
        assert_eq!(o.hidden, o.reduce);
        assert_eq!(o.fraction(), 1.0);
        // Nothing counts as compute: nothing hidden.
        let none = Overlap::measure(&trace, |_| false);
        assert_eq!(
            (none.ops, none.started_under, none.hidden),
            (1, 0, Default::default())
        );
        assert_eq!(none.fraction(), 0.0);
    });
}

#[test]
fn after_a_failure_clear_poison_lets_training_go_on() {
    within(60, || {
        for update in [Update::EveryReplica, Update::Host] {
            let (engine, devices) = engine(3, false, Tracing::Off);
            let mut group = Group::builder(&engine)
                .devices(devices)
                .update(update)
                .optimizer(sgd)
                .build()
                .unwrap();
            let p = group.param(&[1.0; 4]).unwrap();
            // Every device's gradient is 1; device 1 fails where asked.
            let step = |group: &mut Group, fail: bool| {
                group
                    .step(|s| {
                        let (g, failing) = (s.grad(p).key(), fail && s.index() == 1);
                        s.engine()
                            .op()
                            .name("backward")
                            .on(s.device())
                            .mutates(&[s.grad(p)])
                            .run(move |ctx| {
                                if failing {
                                    return Err("out of memory".into());
                                }
                                ctx.write(g)?.fill(1.0);
                                Ok(())
                            })?;
                        Ok(())
                    })
                    .unwrap()
            };
            step(&mut group, false);
            step(&mut group, true);
            assert!(matches!(group.weights(p, 0), Err(Error::Poisoned { .. })));
            // Clearing only what the user can reach is not enough: the
            // reductions' own buffers are poisoned too.
            for d in 0..3 {
                engine.clear_poison(group.replica(p, d)).unwrap();
                engine.clear_poison(group.grad(p, d)).unwrap();
            }
            step(&mut group, false);
            assert!(
                matches!(group.weights(p, 2), Err(Error::Poisoned { .. })),
                "{update:?}"
            );
            // The group's clear: the next step runs, from the weights of
            // before the failed update (1 - 3 after step 0, then - 3).
            group.clear_poison().unwrap();
            step(&mut group, false);
            for d in 0..3 {
                assert_eq!(group.weights(p, d).unwrap(), [-5.0; 4], "{update:?}");
            }
        }
    });
}
