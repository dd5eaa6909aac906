//! Data-parallel training on arrays (`nd::DataParallel` over a
//! `parallel::Group`): on 1, 2 and 4 devices, every replica's weights
//! equal, bit for bit, a serial run over the whole batch in the group's
//! summation order (each shard's gradient, summed with `serial_sum`); and
//! bad input is refused.

use depflow::nd::nn::{self, Linear, Module, Relu, Sequential};
use depflow::nd::{self, Arrays, DataParallel};
use depflow::parallel::{Group, serial_sum};
use depflow::{Engine, Error, Executor};

const FEATURES: usize = 6;
const CLASSES: usize = 3;
const ROWS: usize = 8;
const STEPS: usize = 3;
const LR: f32 = 0.3;

fn model(arrays: &Arrays) -> Result<Sequential, Error> {
    Ok(Sequential::new()
        .push(Linear::new(arrays, FEATURES, 8)?)
        .push(Relu)
        .push(Linear::new(arrays, 8, CLASSES)?))
}

/// Batch `k`: features and one-hot labels, made up.
fn batch(k: usize) -> (Vec<f32>, Vec<f32>) {
    let x = (0..ROWS * FEATURES)
        .map(|i| (((i * 7 + k * 13) % 17) as f32 - 8.0) / 8.0)
        .collect();
    let mut y = vec![0.0; ROWS * CLASSES];
    for r in 0..ROWS {
        y[r * CLASSES + (r + k) % CLASSES] = 1.0;
    }
    (x, y)
}

/// The loss of one shard, scaled so that the devices' gradients sum to
/// the batch mean's.
fn shard_loss(
    m: &Sequential,
    x: &nd::Array,
    y: &nd::Array,
    batch_rows: usize,
) -> Result<nd::Array, Error> {
    let rows = x.shape()[0] as f32;
    nn::softmax_cross_entropy(&m.forward(x)?, y)?.mul_scalar(rows / batch_rows as f32)
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|v| v.to_bits()).collect()
}

/// Trains on `n` devices; every replica's weights, per parameter.
fn data_parallel(n: usize) -> Vec<Vec<Vec<f32>>> {
    let mut builder = Engine::builder();
    for d in 0..n {
        builder = builder.device(format!("dev{d}"), Executor::pool(1));
    }
    let engine = builder.build().unwrap();
    let devices: Vec<_> = (0..n)
        .map(|d| engine.device(&format!("dev{d}")).unwrap())
        .collect();
    let group = Group::builder(&engine)
        .devices(devices)
        .input(FEATURES)
        .input(CLASSES)
        .bucket_bytes(0) // each parameter a bucket: serial_sum per parameter
        .optimizer(|w, g| w.iter_mut().zip(g).for_each(|(w, g)| *w -= LR * g))
        .build()
        .unwrap();
    let arrays = Arrays::new(&engine);
    arrays.seed(21).unwrap();
    let mut dp = DataParallel::new(group, &arrays, model).unwrap();
    for k in 0..STEPS {
        let (x, y) = batch(k);
        dp.step(vec![x, y], |m, inputs, batch_rows| {
            shard_loss(m, &inputs[0], &inputs[1], batch_rows)
        })
        .unwrap();
    }
    (0..n)
        .map(|d| {
            dp.replica(d)
                .parameters()
                .iter()
                .map(|p| p.to_vec().wait().unwrap())
                .collect()
        })
        .collect()
}

/// The same training, serially on one device: each shard's gradient in
/// turn, summed across shards in the ring's order.
fn serial(n: usize) -> Vec<Vec<f32>> {
    let engine = Engine::builder()
        .executor(Executor::inline())
        .build()
        .unwrap();
    let arrays = Arrays::new(&engine);
    arrays.seed(21).unwrap();
    let m = model(&arrays).unwrap();
    let rows = ROWS / n;
    for k in 0..STEPS {
        let (x, y) = batch(k);
        let mut grads: Vec<Vec<Vec<f32>>> = Vec::new(); // [shard][param]
        for s in 0..n {
            let xs = arrays
                .from_vec(
                    x[s * rows * FEATURES..][..rows * FEATURES].to_vec(),
                    &[rows, FEATURES],
                )
                .unwrap();
            let ys = arrays
                .from_vec(
                    y[s * rows * CLASSES..][..rows * CLASSES].to_vec(),
                    &[rows, CLASSES],
                )
                .unwrap();
            for p in m.parameters() {
                p.zero_grad().unwrap();
            }
            shard_loss(&m, &xs, &ys, ROWS).unwrap().backward().unwrap();
            grads.push(
                m.parameters()
                    .iter()
                    .map(|p| p.grad().unwrap().to_vec().wait().unwrap())
                    .collect(),
            );
        }
        for (j, p) in m.parameters().iter().enumerate() {
            let per_shard: Vec<&[f32]> = grads.iter().map(|g| &g[j][..]).collect();
            let sum = serial_sum(&per_shard);
            let mut w = p.to_vec().wait().unwrap();
            w.iter_mut().zip(&sum).for_each(|(w, g)| *w -= LR * g);
            nd::no_grad(|| p.set(w)).unwrap();
        }
    }
    m.parameters()
        .iter()
        .map(|p| p.to_vec().wait().unwrap())
        .collect()
}

#[test]
fn replicas_on_1_2_and_4_devices_equal_the_serial_run_bit_for_bit() {
    for n in [1, 2, 4] {
        let want = serial(n);
        let replicas = data_parallel(n);
        for (d, weights) in replicas.iter().enumerate() {
            for (j, (got, want)) in weights.iter().zip(&want).enumerate() {
                assert_eq!(
                    bits(got),
                    bits(want),
                    "{n} devices: replica {d}, parameter {j}"
                );
            }
        }
        // Training moved the weights.
        let engine = Engine::new();
        let arrays = Arrays::new(&engine);
        arrays.seed(21).unwrap();
        let initial = model(&arrays).unwrap().parameters()[0]
            .to_vec()
            .wait()
            .unwrap();
        assert_ne!(bits(&replicas[0][0]), bits(&initial));
    }
}

fn two_device_group() -> (Engine, Group) {
    let engine = Engine::builder()
        .device("a", Executor::pool(1))
        .device("b", Executor::pool(1))
        .build()
        .unwrap();
    let devices = ["a", "b"].map(|d| engine.device(d).unwrap());
    let group = Group::builder(&engine)
        .devices(devices)
        .input(2)
        .build()
        .unwrap();
    (engine, group)
}

#[test]
fn replicas_that_do_not_match_or_sit_on_another_device_are_refused() {
    // Replicas of different shapes.
    let (engine, group) = two_device_group();
    let arrays = Arrays::new(&engine);
    let widths = std::sync::atomic::AtomicUsize::new(2);
    let err = DataParallel::new(group, &arrays, |arrays| {
        let w = widths.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Linear::new(arrays, w, 1)
    })
    .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Array {
                op: "data_parallel",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("replica 1"), "{err}");
    // A parameter on the wrong device: made with other Arrays than given.
    let (engine, group) = two_device_group();
    let arrays = Arrays::new(&engine);
    let err = DataParallel::new(group, &arrays, |_| Linear::new(&arrays, 2, 1)).unwrap_err();
    assert!(err.to_string().contains("not on its device"), "{err}");
    // A group that has parameters of its own already.
    let (engine, mut group) = two_device_group();
    group.param(&[0.0]).unwrap();
    let err =
        DataParallel::new(group, &Arrays::new(&engine), |a| Linear::new(a, 2, 1)).unwrap_err();
    assert!(matches!(err, Error::Parallel(_)), "{err}");
    // A module that lists a parameter twice.
    struct Twice(Linear);
    impl Module for Twice {
        fn forward(&self, x: &nd::Array) -> Result<nd::Array, Error> {
            self.0.forward(x)
        }
        fn parameters(&self) -> Vec<nd::Array> {
            let mut p = self.0.parameters();
            p.push(self.0.weight.clone());
            p
        }
    }
    let (engine, group) = two_device_group();
    let err = DataParallel::new(group, &Arrays::new(&engine), |a| {
        Ok(Twice(Linear::new(a, 2, 1)?))
    })
    .unwrap_err();
    assert!(err.to_string().contains("twice"), "{err}");
}

#[test]
fn a_loss_of_more_than_one_element_is_an_error_not_a_hang() {
    let (engine, group) = two_device_group();
    let arrays = Arrays::new(&engine);
    let mut dp = DataParallel::new(group, &arrays, |arrays| Linear::new(arrays, 2, 1)).unwrap();
    let err = dp
        .step(vec![vec![1.0; 4 * 2]], |m, inputs, _| m.forward(&inputs[0]))
        .unwrap_err();
    assert!(matches!(err, Error::Array { op: "backward", .. }), "{err}");
    // A batch that does not split over the devices: the group's error.
    let err = dp
        .step(vec![vec![1.0; 3 * 2]], |m, inputs, _| {
            m.forward(&inputs[0])?.sum()
        })
        .unwrap_err();
    assert!(matches!(err, Error::Parallel(_)), "{err}");
}
