//! Layers and optimizers on `nd`: updates against plain loops on the same
//! values, bit for bit; recorded training against eager training; bad
//! input.

use depflow::nd::nn::{self, Conv2d, Flatten, Linear, MaxPool2d, Module, Relu, Sequential};
use depflow::nd::optim::{Adam, Sgd};
use depflow::nd::{self, Array, Arrays};
use depflow::{Engine, Error, Executor};

fn bits(a: &Array) -> Vec<u32> {
    a.to_vec()
        .wait()
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect()
}

/// Parameters with gradients `g` set (by a backward pass of `Σ p·g`).
fn with_gradient(arrays: &Arrays, p: &[f32], g: &[f32]) -> Array {
    let p = arrays.from_vec(p.to_vec(), &[p.len()]).unwrap().with_grad();
    let g = arrays.from_vec(g.to_vec(), &[g.len()]).unwrap();
    p.zero_grad().unwrap();
    (&p * &g).sum().unwrap().backward().unwrap();
    p
}

#[test]
fn sgd_with_momentum_updates_as_its_formula_does() {
    let arrays = Arrays::new(&Engine::new());
    let (p0, g) = ([1.0f32, -0.5, 0.25], [0.3f32, 0.1, -0.7]);
    let p = with_gradient(&arrays, &p0, &g);
    let sgd = Sgd::new(vec![p.clone()], 0.1).momentum(0.9);
    let (mut want, mut v) = (p0, [0.0f32; 3]);
    for _ in 0..3 {
        sgd.step().unwrap();
        for i in 0..3 {
            v[i] = 0.9 * v[i] + g[i];
            want[i] -= 0.1 * v[i];
        }
    }
    let want: Vec<u32> = want.iter().map(|v| v.to_bits()).collect();
    assert_eq!(bits(&p), want);
}

#[test]
fn adam_updates_as_its_formula_does() {
    let arrays = Arrays::new(&Engine::new());
    let (p0, g) = ([1.0f32, -0.5, 0.25], [0.3f32, 0.1, -0.7]);
    let p = with_gradient(&arrays, &p0, &g);
    let adam = Adam::new(vec![p.clone()], 0.01).unwrap();
    let (mut want, mut m, mut v) = (p0, [0.0f32; 3], [0.0f32; 3]);
    for t in 1..=3 {
        adam.step().unwrap();
        let (c1, c2) = (1.0 - 0.9f32.powi(t), 1.0 - 0.999f32.powi(t));
        for i in 0..3 {
            m[i] = 0.9 * m[i] + (1.0 - 0.9) * g[i];
            v[i] = 0.999 * v[i] + (1.0 - 0.999) * g[i] * g[i];
            want[i] -= 0.01 * (m[i] / c1) / ((v[i] / c2).sqrt() + 1e-8);
        }
    }
    let want: Vec<u32> = want.iter().map(|v| v.to_bits()).collect();
    assert_eq!(bits(&p), want);
}

/// A small CNN and one training step with `opt`: written once.
fn cnn(arrays: &Arrays) -> Sequential {
    Sequential::new()
        .push(Conv2d::new(arrays, 1, 3, 3, 1).unwrap())
        .push(Relu)
        .push(MaxPool2d(2))
        .push(Flatten)
        .push(Linear::new(arrays, 3 * 2 * 2, 4).unwrap())
}

fn train_step(model: &Sequential, adam: &Adam, x: &Array, y: &Array) -> Result<(), Error> {
    adam.zero_grad()?;
    nn::softmax_cross_entropy(&model.forward(x)?, y)?.backward()?;
    adam.step()
}

#[test]
fn a_recorded_cnn_step_trains_as_the_eager_one_bit_for_bit() {
    for executor in [Executor::inline(), Executor::pool(2)] {
        let engine = Engine::builder().executor(executor).build().unwrap();
        let arrays = Arrays::new(&engine);
        let x = arrays.normal(&[5, 1, 4, 4], 0.0, 1.0).unwrap();
        let y = nn::one_hot(&arrays, &[0, 1, 2, 3, 1], 4).unwrap();
        arrays.seed(5).unwrap();
        let eager = cnn(&arrays);
        arrays.seed(5).unwrap();
        let recorded = cnn(&arrays);
        let adam_eager = Adam::new(eager.parameters(), 0.01).unwrap();
        let adam_recorded = Adam::new(recorded.parameters(), 0.01).unwrap();
        let graph = nd::record(&engine, || train_step(&recorded, &adam_recorded, &x, &y)).unwrap();
        for _ in 0..4 {
            train_step(&eager, &adam_eager, &x, &y).unwrap();
            graph.replay();
        }
        for (a, b) in eager.parameters().iter().zip(recorded.parameters()) {
            assert_eq!(bits(a), bits(&b));
        }
        let before = bits(&cnn(&arrays).parameters()[0]);
        assert_ne!(bits(&eager.parameters()[0]), before);
    }
}

#[test]
fn bad_input_to_layers_and_optimizers_is_an_error() {
    let arrays = Arrays::new(&Engine::new());
    assert!(matches!(
        Adam::new(Vec::new(), 0.1),
        Err(Error::Array { op: "adam", .. })
    ));
    // A parameter no backward pass reached.
    let p = arrays.ones(&[2]).unwrap().with_grad();
    let err = Sgd::new(vec![p.clone()], 0.1).step().unwrap_err();
    assert!(err.to_string().contains("no gradient"), "{err}");
    let err = Adam::new(vec![p], 0.1).unwrap().step().unwrap_err();
    assert!(err.to_string().contains("parameter 0"), "{err}");
    // Shapes that do not fit a layer or the loss.
    let linear = Linear::new(&arrays, 3, 2).unwrap();
    let err = linear.forward(&arrays.ones(&[4, 5]).unwrap()).unwrap_err();
    assert!(err.to_string().contains("[4, 5]"), "{err}");
    let conv = Conv2d::new(&arrays, 2, 4, 3, 0).unwrap();
    let err = conv
        .forward(&arrays.ones(&[1, 3, 5, 5]).unwrap())
        .unwrap_err();
    assert!(err.to_string().contains("channels"), "{err}");
    let err = conv
        .forward(&arrays.ones(&[1, 2, 2, 2]).unwrap())
        .unwrap_err();
    assert!(err.to_string().contains("do not fit"), "{err}");
    let err = nn::softmax_cross_entropy(
        &arrays.ones(&[2, 3]).unwrap(),
        &arrays.ones(&[2, 4]).unwrap(),
    )
    .unwrap_err();
    assert!(err.to_string().contains("[2, 4]"), "{err}");
    assert!(matches!(
        nn::one_hot(&arrays, &[3], 3),
        Err(Error::Array { op: "one_hot", .. })
    ));
}

#[test]
fn one_hot_of_fed_labels_works_in_a_recorded_step_and_refuses_non_classes() {
    let engine = Engine::new();
    let arrays = Arrays::new(&engine);
    let labels = arrays.zeros(&[3, 1]).unwrap();
    let out = arrays.zeros(&[3, 2]).unwrap();
    let graph = nd::record(&engine, || out.assign(&labels.one_hot(2)?)).unwrap();
    labels.set(vec![1.0, 0.0, 1.0]).unwrap();
    graph.replay();
    assert_eq!(out.to_vec().wait().unwrap(), [0.0, 1.0, 1.0, 0.0, 0.0, 1.0]);
    // A label that is no class fails the op; the read names it.
    labels.set(vec![1.0, 2.0, 0.5]).unwrap();
    let err = labels.one_hot(2).unwrap().to_vec().wait().unwrap_err();
    assert!(err.to_string().contains("label 2 (row 1)"), "{err}");
    assert!(matches!(
        arrays.zeros(&[2, 2]).unwrap().one_hot(2),
        Err(Error::Array { op: "one_hot", .. })
    ));
}
