//! A data-parallel [`Group`] across ranks: ranks × local devices.
//!
//! The model: least squares, `w` of `WIDTH` floats, trained by SGD on
//! `BATCHES` global batches of `ROWS` rows; rank `r` of `S` takes rows
//! `r * ROWS / S ..` of each, split over its local devices. The data are
//! not dyadic, so sums in different orders differ in their last bits: the
//! checks say which order the group's sum has.
//!
//! - every replica of every rank ends bit-identical, and equal to
//!   [`reference`] (each rank's devices summed in [`serial_sum`]'s order,
//!   then the ranks' sums added), computed serially on the host;
//! - the 1-rank run on the same global batches over `2 S` local devices
//!   (a plain local group) folds in another order: close, not required to
//!   be equal;
//! - with dyadic data (exact sums) the gradient sum equals the 1-rank
//!   run's bit for bit;
//! - with quantized gradients (rounded to a grid on which every sum of
//!   them is exact, so no order of summation can show), the weights of
//!   every rank, for any rank count (2, 3, 4), are bit-identical to the
//!   1-rank run on the same global batches over as many devices;
//! - a rank with another device count, or parameters of other lengths,
//!   fails the first step, on every rank alike;
//! - `Update::Host` across ranks gives the on-device update's weights.

use depflow::mpi;
use depflow::parallel::{Group, Update, serial_sum};
use depflow::{Communicator, Engine, Error, Executor};

use super::common::parallel::backward;
use std::time::Duration;

use super::{chain, digest32, gathered};

const WIDTH: usize = 12;
/// Divisible by 2 devices x 1, 2, 3 or 4 ranks.
const ROWS: usize = 24;
const BATCHES: usize = 6;
const RATE: f32 = 0.01;

/// Global batch `b`: `ROWS` rows of `WIDTH` inputs, and `ROWS` targets.
fn batch(b: usize, dyadic: bool) -> (Vec<f32>, Vec<f32>) {
    let (step, target) = if dyadic { (0.125, 0.25) } else { (0.1, 0.3) };
    let x = (0..ROWS * WIDTH)
        .map(|i| ((b * 31 + i * 7) % 17) as f32 * step - 1.0)
        .collect();
    let y = (0..ROWS).map(|r| ((b + r) % 5) as f32 * target).collect();
    (x, y)
}

/// How the data and gradients are made.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Data {
    /// Not dyadic: sums in different orders differ in their last bits.
    Plain,
    /// Dyadic, and no update: the gradient sums are exact.
    Dyadic,
    /// Plain data, each device's gradient rounded to multiples of 1/64
    /// (a few hundred at most: far fewer than f32's 24 bits hold, so every
    /// sum of them is exact and every order of summation gives the same
    /// bits), then SGD.
    Quantized,
}

/// The gradient of `Σ (x·w - y)² / 2` over `rows` rows (the same code on a
/// device and in the reference, so the same bits).
fn gradient(x: &[f32], y: &[f32], w: &[f32], g: &mut [f32]) {
    g.fill(0.0);
    for (row, &t) in x.chunks_exact(WIDTH).zip(y) {
        let err = row.iter().zip(w).map(|(a, b)| a * b).sum::<f32>() - t;
        g.iter_mut().zip(row).for_each(|(g, a)| *g += err * a);
    }
}

fn quantize(g: &mut [f32]) {
    g.iter_mut().for_each(|g| *g = (*g * 64.0).round() / 64.0);
}

fn sgd(w: &mut [f32], g: &[f32]) {
    w.iter_mut().zip(g).for_each(|(w, g)| *w -= RATE * g);
}

fn init() -> Vec<f32> {
    (0..WIDTH).map(|j| (j % 3) as f32 * 0.25 - 0.25).collect()
}

/// Rows `lo..hi` of a batch.
fn rows(x: &[f32], y: &[f32], lo: usize, hi: usize) -> (Vec<f32>, Vec<f32>) {
    (x[lo * WIDTH..hi * WIDTH].to_vec(), y[lo..hi].to_vec())
}

/// The weights after training, serially: per batch, each device's
/// gradient, each rank's devices summed in `serial_sum`'s order, the
/// ranks' sums added in rank order (with two ranks one addition, which is
/// commutative: MPI's order cannot change it), then SGD.
pub fn reference(ranks: usize, devices: usize) -> Vec<f32> {
    assert!(ranks <= 2, "the ranks' order is known for 2 ranks");
    let mut w = init();
    for b in 0..BATCHES {
        let (x, y) = batch(b, false);
        let per = ROWS / (ranks * devices);
        let mut total = vec![0.0f32; WIDTH];
        for r in 0..ranks {
            let grads: Vec<Vec<f32>> = (0..devices)
                .map(|d| {
                    let lo = (r * devices + d) * per;
                    let (xs, ys) = rows(&x, &y, lo, lo + per);
                    let mut g = vec![0.0; WIDTH];
                    gradient(&xs, &ys, &w, &mut g);
                    g
                })
                .collect();
            let refs: Vec<&[f32]> = grads.iter().map(Vec::as_slice).collect();
            let local = serial_sum(&refs);
            if r == 0 {
                total = local;
            } else {
                total.iter_mut().zip(&local).for_each(|(t, l)| *t += l);
            }
        }
        sgd(&mut w, &total);
    }
    w
}

/// Trains with a group of `devices` local devices (across `comm`'s ranks
/// when given) and returns every local replica's weights, and the last
/// summed gradient (device 0's).
fn train(
    engine: &Engine,
    comm: Option<&Communicator>,
    devices: usize,
    data: Data,
) -> Result<(Vec<Vec<f32>>, Vec<f32>), Error> {
    train_with(engine, comm, devices, data, Update::EveryReplica)
}

/// [`train`] with the optimizer where `update` says.
fn train_with(
    engine: &Engine,
    comm: Option<&Communicator>,
    devices: usize,
    data: Data,
    update: Update,
) -> Result<(Vec<Vec<f32>>, Vec<f32>), Error> {
    let dyadic = data == Data::Dyadic;
    let quantized = data == Data::Quantized;
    let (rank, size) = comm.map_or((0, 1), |c| (c.rank(), c.size()));
    let devs = (0..devices).map(|d| engine.device(&format!("d{d}")).unwrap());
    let mut builder = Group::builder(engine)
        .devices(devs)
        .input(WIDTH)
        .input(1)
        .update(update);
    if !dyadic {
        builder = builder.optimizer(sgd);
    }
    if let Some(comm) = comm {
        builder = builder.across_ranks(comm);
    }
    let mut group = builder.build()?;
    let w = group.param(&init())?;
    let share = ROWS / size;
    for b in 0..BATCHES {
        let (x, y) = batch(b, dyadic);
        let (xs, ys) = rows(&x, &y, rank * share, (rank + 1) * share);
        group.load(vec![xs, ys])?;
        group.step(|s| {
            backward(s, w, move |x, y, w, g| {
                gradient(x, y, w, g);
                if quantized {
                    quantize(g);
                }
                Ok(())
            })
        })?;
    }
    let weights = (0..devices)
        .map(|d| group.weights(w, d))
        .collect::<Result<_, _>>()?;
    let grad = engine.get(group.grad(w, 0)).wait()?;
    Ok((weights, grad))
}

fn close(a: &[f32], b: &[f32]) -> bool {
    a.iter()
        .zip(b)
        .all(|(a, b)| (a - b).abs() <= 1e-5 * a.abs().max(b.abs()).max(1.0))
}

/// The digest of the quantized run's weights in this process alone, over
/// `devices` local devices.
pub fn single(devices: usize) -> u64 {
    let mut b = Engine::builder();
    for d in 0..devices {
        b = b.device(format!("d{d}"), Executor::pool(1));
    }
    let engine = b.build().unwrap();
    let (weights, _) = train(&engine, None, devices, Data::Quantized).unwrap();
    digest32(&weights[0])
}

/// The checks on this rank; prints `group digest: …` (the weights of the
/// 2-devices-per-rank run, on 1 or 2 ranks) for the caller to compare with
/// the reference, and `quantized digest: …` (the quantized run's weights,
/// on any rank count) to compare with the 1-rank run's ([`single`]).
pub fn checks(world: &mpi::topology::SimpleCommunicator) {
    let size = mpi::traits::Communicator::size(world) as usize;
    let mut b = Engine::builder();
    for d in 0..(2 * size).max(4) {
        b = b.device(format!("d{d}"), Executor::pool(1));
    }
    let engine = b.build().unwrap();
    let comm = Communicator::new(&engine, world).expect("communicator");
    let rank = comm.rank();
    assert_eq!(size, comm.size());

    // Any rank count: with quantized gradients every sum is exact, so the
    // weights are the 1-rank run's on the same global batches, bit for
    // bit, on every replica of every rank.
    let (weights, _) = train(&engine, Some(&comm), 2, Data::Quantized).unwrap();
    assert!(weights.iter().all(|w| *w == weights[0]), "replicas differ");
    let (single, _) = train(&engine, None, 2 * size, Data::Quantized).unwrap();
    assert_eq!(
        weights[0], single[0],
        "rank {rank}: not the 1-rank run's weights"
    );
    assert_ne!(weights[0], init(), "nothing trained");
    let q = digest32(&weights[0]);
    assert!(
        gathered(&engine, &comm, q).iter().all(|&x| x == q),
        "ranks' weights differ"
    );
    println!("quantized digest: {q:016x}");

    // Exact sums: the gradient sum is the 1-rank run's, bit for bit.
    let (_, across) = train(&engine, Some(&comm), 2, Data::Dyadic).unwrap();
    let (_, local) = train(&engine, None, 2 * size, Data::Dyadic).unwrap();
    assert_eq!(across, local);

    if size <= 2 {
        in_known_order(&engine, &comm);
    }
    #[cfg(feature = "nd")]
    nd_across_ranks(&engine, &comm);
    if size >= 2 {
        one_rank_fails(&engine, &comm);
        a_step_fails_on_one_rank(&engine, &comm);
        a_load_fails_on_one_rank(&engine, &comm);
    }

    // Update::Host across ranks: each rank's host sums its devices, the
    // sums are all-reduced across ranks, the host updates once and copies
    // back: the weights of the on-device update, bit for bit (quantized:
    // on any rank count; plain data on 1 or 2 ranks, where MPI's order of
    // summation is one addition).
    let (host, _) = train_with(&engine, Some(&comm), 2, Data::Quantized, Update::Host).unwrap();
    assert!(
        host.iter().all(|w| *w == weights[0]),
        "rank {rank}: Update::Host differs"
    );
    if size <= 2 {
        let (host, _) = train_with(&engine, Some(&comm), 2, Data::Plain, Update::Host).unwrap();
        let (every, _) = train(&engine, Some(&comm), 2, Data::Plain).unwrap();
        assert!(
            host.iter().all(|w| *w == every[0]),
            "rank {rank}: Update::Host differs"
        );
    }

    // Another device count on the last rank: the first step fails on
    // every rank.
    if size >= 2 {
        let last = size - 1;
        let devices = if rank == last { 1 } else { 2 };
        match train(&engine, Some(&comm), devices, Data::Plain) {
            Err(Error::Parallel(m)) => assert!(
                m.contains(&format!("rank {last} has 1 local device(s), rank 0 2")),
                "{m}"
            ),
            other => panic!("rank {rank}: {other:?}"),
        }
    }
    // Parameters of other lengths on rank 1: the first step fails too.
    if size >= 2 {
        let mut group = Group::builder(&engine)
            .device(engine.device("d0").unwrap())
            .across_ranks(&comm)
            .build()
            .unwrap();
        group.param(&vec![0.0; WIDTH + rank]).unwrap();
        match group.step(|_| Ok(())) {
            Err(Error::Parallel(m)) => assert!(m.contains("of other lengths"), "{m}"),
            other => panic!("rank {rank}: {other:?}"),
        }
    }
    comm.shutdown().expect("collectives done");
    engine.wait_all().wait().ok();
    println!("rank {rank} of {size}: group checks passed");
}

/// A backward that fails on the last rank only: the step's collectives
/// fail on every rank (no rank waits forever), every replica of every rank
/// is poisoned; after `clear_poison` the ranks are still in step and train
/// on, with identical weights.
fn one_rank_fails(engine: &Engine, comm: &Communicator) {
    let (rank, size) = (comm.rank(), comm.size());
    let devs = (0..2).map(|d| engine.device(&format!("d{d}")).unwrap());
    let mut group = Group::builder(engine)
        .devices(devs)
        .input(WIDTH)
        .input(1)
        .optimizer(sgd)
        .across_ranks(comm)
        .build()
        .unwrap();
    let w = group.param(&init()).unwrap();
    let share = ROWS / size;
    for b in 0..3 {
        let (x, y) = batch(b, false);
        let (xs, ys) = rows(&x, &y, rank * share, (rank + 1) * share);
        group.load(vec![xs, ys]).unwrap();
        let fail = b == 1 && rank == size - 1;
        group
            .step(|s| {
                let fail = fail && s.index() == 0;
                backward(s, w, move |x, y, w, g| {
                    if fail {
                        return Err("out of memory on this rank".into());
                    }
                    gradient(x, y, w, g);
                    Ok(())
                })
            })
            .unwrap();
        if b == 1 {
            for d in 0..2 {
                let r = group.weights(w, d);
                assert!(r.is_err(), "rank {rank}, device {d}: not poisoned: {r:?}");
            }
            engine.wait_all().wait().ok();
            group.clear_poison().unwrap();
        }
    }
    let weights: Vec<_> = (0..2).map(|d| group.weights(w, d).unwrap()).collect();
    assert_eq!(weights[0], weights[1], "replicas differ");
    let d = digest32(&weights[0]);
    assert!(
        gathered(engine, comm, d).iter().all(|&x| x == d),
        "ranks' weights differ after a failed step"
    );
}

/// The last rank's step closure returns an error at step 1 (after device
/// 0 pushed its backward, before device 1's): that rank pushed only part
/// of the step, yet the step's cross-rank sums fail on every rank (the
/// failing rank's collectives stand in, failed), naming that rank and its
/// words; no rank pairs step 1's collectives with step 2's (which gave
/// every rank the same wrong weights, silently, then a hang); after
/// `clear_poison` the ranks train on in step, every replica of every rank
/// alike, to the weights of training on batches 0 and 2 only.
fn a_step_fails_on_one_rank(engine: &Engine, comm: &Communicator) {
    let (rank, size) = (comm.rank(), comm.size());
    let last = size - 1;
    let limit = Duration::from_secs(60);
    let mut group = group_across(engine, comm);
    let w = group.param(&init()).unwrap();
    let share = ROWS / size;
    for b in 0..3 {
        let (x, y) = batch(b, false);
        let (xs, ys) = rows(&x, &y, rank * share, (rank + 1) * share);
        group.load(vec![xs, ys]).unwrap();
        let fail = b == 1 && rank == last;
        let r = group.step(|s| {
            if fail && s.index() == 1 {
                return Err(Error::Parallel("out of memory on this rank".into()));
            }
            backward(s, w, move |x, y, w, g| {
                gradient(x, y, w, g);
                Ok(())
            })
        });
        if fail {
            let e = r.expect_err("the closure's error");
            assert!(e.to_string().contains("out of memory on this rank"), "{e}");
        } else {
            r.unwrap();
        }
        if b == 1 {
            for d in 0..2 {
                let e = engine
                    .get(group.replica(w, d))
                    .wait_timeout(limit)
                    .expect_err("a failed step's weights are poisoned");
                let m = chain(&e);
                assert!(
                    m.contains("out of memory on this rank"),
                    "rank {rank}, device {d}: {m}"
                );
                if rank != last {
                    assert!(m.contains(&format!("rank {last} failed its part")), "{m}");
                }
            }
            engine.wait_all().wait().ok();
            group.clear_poison().unwrap();
        }
    }
    let weights: Vec<_> = (0..2)
        .map(|d| engine.get(group.replica(w, d)).wait_timeout(limit).unwrap())
        .collect();
    assert_eq!(weights[0], weights[1], "replicas differ");
    let d = digest32(&weights[0]);
    assert!(
        gathered(engine, comm, d).iter().all(|&x| x == d),
        "rank {rank}: ranks' weights differ after a failed step"
    );
    assert_ne!(weights[0], init(), "nothing trained");
}

/// The last rank's load of batch 1 fails (a batch of partial rows there
/// only): its next step fails with the load's error, and so does that
/// step's sum on every rank (the failing rank's collectives stand in), so
/// the ranks stay in step and train on after `clear_poison`.
fn a_load_fails_on_one_rank(engine: &Engine, comm: &Communicator) {
    let (rank, size) = (comm.rank(), comm.size());
    let last = size - 1;
    let limit = Duration::from_secs(60);
    let mut group = group_across(engine, comm);
    let w = group.param(&init()).unwrap();
    let share = ROWS / size;
    for b in 0..3 {
        let (x, y) = batch(b, false);
        let (mut xs, ys) = rows(&x, &y, rank * share, (rank + 1) * share);
        let fail = b == 1 && rank == last;
        if fail {
            xs.pop(); // partial rows
        }
        let loaded = group.load(vec![xs, ys]);
        assert_eq!(loaded.is_err(), fail, "rank {rank}: {loaded:?}");
        let r = group.step(|s| {
            backward(s, w, move |x, y, w, g| {
                gradient(x, y, w, g);
                Ok(())
            })
        });
        if fail {
            let e = r.expect_err("the load's error");
            assert!(e.to_string().contains("not whole rows"), "{e}");
        } else {
            r.unwrap();
        }
        if b == 1 {
            let e = engine
                .get(group.replica(w, 0))
                .wait_timeout(limit)
                .expect_err("a failed step's weights are poisoned");
            assert!(chain(&e).contains("not whole rows"), "rank {rank}: {e:?}");
            engine.wait_all().wait().ok();
            group.clear_poison().unwrap();
        }
    }
    let weights = engine.get(group.replica(w, 0)).wait_timeout(limit).unwrap();
    let d = digest32(&weights);
    assert!(
        gathered(engine, comm, d).iter().all(|&x| x == d),
        "rank {rank}: ranks' weights differ after a failed load"
    );
}

/// A group of 2 local devices across `comm`'s ranks, inputs `WIDTH` and 1,
/// SGD.
fn group_across(engine: &Engine, comm: &Communicator) -> Group {
    let devs = (0..2).map(|d| engine.device(&format!("d{d}")).unwrap());
    Group::builder(engine)
        .devices(devs)
        .input(WIDTH)
        .input(1)
        .optimizer(sgd)
        .across_ranks(comm)
        .build()
        .unwrap()
}

/// On 1 or 2 ranks, where MPI's order of summation cannot show (one
/// commutative addition): the weights are the serial reference's, in the
/// group's order.
fn in_known_order(engine: &Engine, comm: &Communicator) {
    let (rank, size) = (comm.rank(), comm.size());
    // The data tell the orders apart (else the equalities below would not
    // say which order the group sums in).
    // (1 device per rank against 2 local devices: both one commutative
    // addition, the same bits.)
    assert_ne!(reference(2, 2), reference(1, 4));
    assert_eq!(reference(2, 1), reference(1, 2));

    // Ranks × 2 devices: every replica equal, and equal to the reference.
    let (weights, _) = train(engine, Some(comm), 2, Data::Plain).unwrap();
    assert!(weights.iter().all(|w| *w == weights[0]), "replicas differ");
    let want = reference(size, 2);
    assert_eq!(weights[0], want, "rank {rank}: not the reference's order");
    let d = digest32(&weights[0]);
    assert!(
        gathered(engine, comm, d).iter().all(|&x| x == d),
        "ranks' weights differ"
    );
    println!("group digest: {d:016x}");

    // The 1-rank run on the same global batches, all devices local: close.
    let (single, _) = train(engine, None, 2 * size, Data::Plain).unwrap();
    assert_eq!(single[0], reference(1, 2 * size));
    assert!(close(&single[0], &weights[0]), "{single:?} vs {weights:?}");

    // One device per rank: the packed buffer all-reduced as one chunk.
    let (one, _) = train(engine, Some(comm), 1, Data::Plain).unwrap();
    assert_eq!(one[0], reference(size, 1));
}

/// `nd::DataParallel` over a group across ranks (the `nd` feature): the
/// same code as in one process; every replica of every rank ends with the
/// same weights, and training lowers the loss.
#[cfg(feature = "nd")]
fn nd_across_ranks(engine: &Engine, comm: &Communicator) {
    use depflow::nd::nn::{Linear, Module};
    use depflow::nd::{Arrays, DataParallel};
    let (rank, size) = (comm.rank(), comm.size());
    let devs = (0..2).map(|d| engine.device(&format!("d{d}")).unwrap());
    let group = Group::builder(engine)
        .devices(devs)
        .input(WIDTH)
        .input(1)
        .optimizer(sgd)
        .across_ranks(comm)
        .build()
        .unwrap();
    let arrays = Arrays::new(engine);
    arrays.seed(5).unwrap();
    let mut dp = DataParallel::new(group, &arrays, |a| Linear::new(a, WIDTH, 1)).unwrap();
    let mut losses = Vec::new();
    for b in 0..BATCHES * 4 {
        let (x, y) = batch(b % BATCHES, false);
        let share = ROWS / size;
        let (x, y) = rows(&x, &y, rank * share, (rank + 1) * share);
        let mut loss = 0.0;
        dp.step(vec![x, y], |m, inputs, batch_rows| {
            let l = m
                .forward(&inputs[0])?
                .sub(&inputs[1])?
                .square()?
                .sum()?
                .div_scalar(batch_rows as f32)?;
            loss += l.item()?;
            Ok(l)
        })
        .unwrap();
        losses.push(loss);
    }
    let replicas: Vec<Vec<f32>> = (0..2)
        .map(|d| dp.replica(d).weight.to_vec().wait().unwrap())
        .collect();
    assert_eq!(replicas[0], replicas[1], "rank {rank}: replicas differ");
    let w = digest32(&replicas[0]);
    assert!(
        gathered(engine, comm, w).iter().all(|&x| x == w),
        "rank {rank}: the ranks' nd replicas differ"
    );
    // The same batches in the first round and the last.
    let (first, last): (f32, f32) = (
        losses[..BATCHES].iter().sum(),
        losses[losses.len() - BATCHES..].iter().sum(),
    );
    assert!(
        last < first,
        "rank {rank}: the loss did not fall: {losses:?}"
    );
    println!("rank {rank}: nd::DataParallel across {size} ranks: replicas identical ({w:016x})");
}
