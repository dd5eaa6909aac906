//! Gradient checks: every differentiable `nd` operation's backward pass
//! against central finite differences.
//!
//! The loss is `Σ f(x) · r` for a fixed random `r` of the result's shape
//! (so every output element's gradient is exercised with a different
//! weight). The numeric gradient perturbs each input element by ±h in
//! f64 around the f32 value, with h = 1e-2: the operations are f32, so
//! the difference quotient carries rounding errors of about
//! ε·|loss|/h ≈ 1e-5·|loss|; the tolerance is 1e-2 absolute plus 1e-2
//! relative, well above that and the O(h²) truncation for these smooth
//! functions on inputs kept away from their kinks (relu and abs at 0,
//! max ties, log and sqrt near 0).

use depflow::nd::{self, Array, Arrays};
use depflow::{Engine, Error, Executor};

/// splitmix64, for reproducible inputs.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [lo, hi).
    fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * ((self.next() >> 40) as f32 / (1u64 << 24) as f32)
    }

    /// `n` values in [lo, hi), each at least `gap` from 0 in magnitude
    /// (away from kinks at 0) when `gap > 0`.
    fn values(&mut self, n: usize, lo: f32, hi: f32, gap: f32) -> Vec<f32> {
        (0..n)
            .map(|_| {
                loop {
                    let v = self.uniform(lo, hi);
                    if v.abs() >= gap {
                        break v;
                    }
                }
            })
            .collect()
    }
}

type Op = dyn Fn(&[Array]) -> Result<Array, Error>;

/// A value range: low, high, and the least magnitude (a gap around 0).
type Range = (f32, f32, f32);

struct Case {
    name: &'static str,
    /// Each input's shape and value range.
    inputs: Vec<(Vec<usize>, Range)>,
    f: Box<Op>,
}

fn case(
    name: &'static str,
    inputs: &[(&[usize], Range)],
    f: impl Fn(&[Array]) -> Result<Array, Error> + 'static,
) -> Case {
    Case {
        name,
        inputs: inputs.iter().map(|(s, r)| (s.to_vec(), *r)).collect(),
        f: Box::new(f),
    }
}

const ANY: Range = (-2.0, 2.0, 0.0);
const AWAY: Range = (-2.0, 2.0, 0.2);
const POSITIVE: Range = (0.5, 2.0, 0.0);
const SMALL: Range = (0.0, 0.3, 0.0);

fn loss_of(arrays: &Arrays, f: &Op, xs: &[Array], r: &[f32]) -> Result<(Array, Vec<usize>), Error> {
    let y = f(xs)?;
    let shape = y.shape().to_vec();
    let r = arrays.from_vec(r.to_vec(), &shape)?;
    Ok(((&y * &r).sum()?, shape))
}

fn check(engine: &Engine, case: &Case, rng: &mut Rng) -> Result<(), String> {
    let arrays = Arrays::new(engine);
    let values: Vec<Vec<f32>> = case
        .inputs
        .iter()
        .map(|(shape, (lo, hi, gap))| rng.values(shape.iter().product(), *lo, *hi, *gap))
        .collect();
    let make = |values: &[Vec<f32>]| -> Vec<Array> {
        values
            .iter()
            .zip(&case.inputs)
            .map(|(v, (shape, _))| arrays.from_vec(v.clone(), shape).unwrap().with_grad())
            .collect()
    };
    // The result's shape, for r.
    let probe = nd::no_grad(|| (case.f)(&make(&values))).map_err(|e| e.to_string())?;
    let r = rng.values(probe.len(), -1.0, 1.0, 0.0);

    let xs = make(&values);
    let (loss, _) = loss_of(&arrays, &*case.f, &xs, &r).map_err(|e| e.to_string())?;
    loss.backward().map_err(|e| e.to_string())?;
    let analytic: Vec<Vec<f32>> = xs
        .iter()
        .map(|x| match x.grad() {
            Some(g) => g.to_vec().wait().unwrap(),
            None => vec![0.0; x.len()],
        })
        .collect();

    let h = 1e-2f32;
    for (i, v) in values.iter().enumerate() {
        for j in 0..v.len() {
            let at = |delta: f32| -> f64 {
                let mut moved = values.clone();
                moved[i][j] += delta;
                nd::no_grad(|| {
                    let (l, _) = loss_of(&arrays, &*case.f, &make(&moved), &r).unwrap();
                    l.item().unwrap() as f64
                })
            };
            let numeric = (at(h) - at(-h)) / (2.0 * h as f64);
            let got = analytic[i][j] as f64;
            if (got - numeric).abs() > 1e-2 + 1e-2 * numeric.abs() {
                return Err(format!(
                    "{}: input {i} element {j}: backward {got}, finite differences {numeric}",
                    case.name
                ));
            }
        }
    }
    Ok(())
}

fn cases() -> Vec<Case> {
    vec![
        case("add, broadcast", &[(&[2, 3], ANY), (&[3], ANY)], |x| {
            x[0].add(&x[1])
        }),
        case("sub, broadcast", &[(&[2, 1], ANY), (&[1, 3], ANY)], |x| {
            x[0].sub(&x[1])
        }),
        case("mul, broadcast", &[(&[2, 3], ANY), (&[2, 1], ANY)], |x| {
            x[0].mul(&x[1])
        }),
        case("div", &[(&[2, 3], ANY), (&[2, 3], POSITIVE)], |x| {
            x[0].div(&x[1])
        }),
        case("maximum", &[(&[4], ANY), (&[4], ANY)], |x| {
            x[0].maximum(&x[1])
        }),
        case("minimum", &[(&[4], ANY), (&[4], ANY)], |x| {
            x[0].minimum(&x[1])
        }),
        case("pow", &[(&[3], POSITIVE), (&[3], ANY)], |x| x[0].pow(&x[1])),
        case("add_scalar", &[(&[3], ANY)], |x| x[0].add_scalar(1.5)),
        case("rsub_scalar", &[(&[3], ANY)], |x| x[0].rsub_scalar(1.5)),
        case("mul_scalar", &[(&[3], ANY)], |x| x[0].mul_scalar(-2.5)),
        case("div_scalar", &[(&[3], ANY)], |x| x[0].div_scalar(4.0)),
        case("rdiv_scalar", &[(&[3], POSITIVE)], |x| {
            x[0].rdiv_scalar(2.0)
        }),
        case("pow_scalar", &[(&[3], POSITIVE)], |x| x[0].pow_scalar(3.0)),
        case("maximum_scalar", &[(&[4], AWAY)], |x| {
            x[0].maximum_scalar(0.0)
        }),
        case("operators", &[(&[2, 2], ANY), (&[2], ANY)], |x| {
            Ok(1.0 - (&x[0] * 2.0 + &x[1]) / 3.0)
        }),
        case("neg", &[(&[3], ANY)], |x| x[0].neg()),
        case("exp", &[(&[3], ANY)], |x| x[0].exp()),
        case("log", &[(&[3], POSITIVE)], |x| x[0].log()),
        case("relu", &[(&[6], AWAY)], |x| x[0].relu()),
        case("sigmoid", &[(&[3], ANY)], |x| x[0].sigmoid()),
        case("tanh", &[(&[3], ANY)], |x| x[0].tanh()),
        case("sqrt", &[(&[3], POSITIVE)], |x| x[0].sqrt()),
        case("abs", &[(&[4], AWAY)], |x| x[0].abs()),
        case("square", &[(&[3], ANY)], |x| x[0].square()),
        case("matmul", &[(&[2, 3], ANY), (&[3, 4], ANY)], |x| {
            x[0].matmul(&x[1])
        }),
        case(
            "matmul, batched",
            &[(&[2, 2, 3], ANY), (&[2, 3, 2], ANY)],
            |x| x[0].matmul(&x[1]),
        ),
        case("t", &[(&[2, 3], ANY)], |x| x[0].t()),
        case("permute", &[(&[2, 3, 4], ANY)], |x| {
            x[0].permute(&[2, 0, 1])
        }),
        case("reshape", &[(&[2, 3], ANY)], |x| x[0].reshape(&[3, 2])),
        case("slice_axis", &[(&[3, 4], ANY)], |x| {
            x[0].slice_axis(1, 1..3)
        }),
        case("concat", &[(&[2, 1], ANY), (&[2, 3], ANY)], |x| {
            nd::concat(&[&x[0], &x[1]], 1)
        }),
        case("broadcast_to", &[(&[3, 1], ANY)], |x| {
            x[0].broadcast_to(&[2, 3, 4])
        }),
        case("sum_axis", &[(&[2, 3], ANY)], |x| x[0].sum_axis(1)),
        case("mean_axis", &[(&[2, 3], ANY)], |x| x[0].mean_axis(0)),
        case("max_axis", &[(&[3, 4], ANY)], |x| x[0].max_axis(1)),
        case("sum", &[(&[2, 3], ANY)], |x| x[0].sum()),
        case("mean", &[(&[2, 3], ANY)], |x| x[0].mean()),
        case("max", &[(&[5], ANY)], |x| x[0].max()),
        case("softmax", &[(&[2, 4], ANY)], |x| x[0].softmax(1)),
        case("log_softmax", &[(&[3, 4], ANY)], |x| x[0].log_softmax(1)),
        case(
            "conv2d, padded",
            &[(&[2, 2, 4, 4], ANY), (&[3, 2, 3, 3], ANY)],
            |x| x[0].conv2d(&x[1], 1, 1),
        ),
        case(
            "conv2d, strided",
            &[(&[1, 1, 5, 5], ANY), (&[2, 1, 2, 2], ANY)],
            |x| x[0].conv2d(&x[1], 2, 0),
        ),
        case("max_pool2d", &[(&[2, 2, 4, 4], SMALL)], |x| {
            // Distinct values (offsets a permutation of 0..64), so that
            // no window has a tie within ±h.
            let offsets: Vec<f32> = (0..64).map(|i| ((i * 13) % 64) as f32).collect();
            let offsets = Arrays::new(x[0].engine()).from_vec(offsets, &[2, 2, 4, 4])?;
            x[0].add(&offsets)?.max_pool2d(2, 2)
        }),
        case("one input used twice", &[(&[3], ANY)], |x| {
            x[0].mul(&x[0].exp()?)
        }),
        case(
            "a small network",
            &[(&[4, 3], ANY), (&[3, 2], ANY), (&[2], ANY)],
            |x| x[0].matmul(&x[1])?.add(&x[2])?.tanh()?.log_softmax(1),
        ),
    ]
}

#[test]
fn every_operation_s_backward_matches_finite_differences() {
    let engine = Engine::builder()
        .executor(Executor::inline())
        .build()
        .unwrap();
    let mut rng = Rng(7);
    let failures: Vec<String> = cases()
        .iter()
        .filter_map(|c| check(&engine, c, &mut rng).err())
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn copies_between_devices_carry_the_gradient_back() {
    let engine = Engine::builder()
        .device("gpu1", Executor::pool(1))
        .build()
        .unwrap();
    let arrays = Arrays::new(&engine);
    let x = arrays.from_vec(vec![1.0, 2.0], &[2]).unwrap().with_grad();
    let far = x.to(engine.device("gpu1").unwrap()).unwrap();
    far.square().unwrap().sum().unwrap().backward().unwrap();
    let g = x.grad().unwrap();
    assert_eq!(g.device(), x.device());
    assert_eq!(g.to_vec().wait().unwrap(), [2.0, 4.0]);
}

#[test]
fn gradients_accumulate_until_zeroed() {
    let arrays = Arrays::new(&Engine::new());
    let w = arrays.from_vec(vec![3.0], &[1]).unwrap().with_grad();
    for _ in 0..2 {
        (&w * 2.0).sum().unwrap().backward().unwrap();
    }
    assert_eq!(w.grad().unwrap().to_vec().wait().unwrap(), [4.0]);
    w.zero_grad().unwrap();
    assert_eq!(w.grad().unwrap().to_vec().wait().unwrap(), [0.0]);
    // Only a leaf has a gradient to zero.
    assert!(matches!(
        (&w * 1.0).zero_grad(),
        Err(Error::Array {
            op: "zero_grad",
            ..
        })
    ));
}

/// One SGD step of a linear model with a squared loss: written once.
fn sgd_step(x: &Array, y: &Array, w: &Array, b: &Array) -> Result<(), Error> {
    w.zero_grad()?;
    b.zero_grad()?;
    let loss = (x.matmul(w)? + b - y).square()?.mean()?;
    loss.backward()?;
    nd::no_grad(|| {
        w.sub_assign(&(w.grad().unwrap() * 0.1))?;
        b.sub_assign(&(b.grad().unwrap() * 0.1))
    })
}

#[test]
fn a_recorded_training_step_gives_the_eager_step_s_weights_bit_for_bit() {
    let engine = Engine::new();
    let arrays = Arrays::new(&engine);
    arrays.seed(3).unwrap();
    let x = arrays.normal(&[8, 3], 0.0, 1.0).unwrap();
    let y = arrays.normal(&[8, 2], 0.0, 1.0).unwrap();
    let params = || {
        let w = arrays.normal(&[3, 2], 0.0, 0.5).unwrap();
        (w.with_grad(), arrays.zeros(&[2]).unwrap().with_grad())
    };
    arrays.seed(11).unwrap();
    let (w1, b1) = params();
    arrays.seed(11).unwrap();
    let (w2, b2) = params();
    let graph = nd::record(&engine, || sgd_step(&x, &y, &w2, &b2)).unwrap();
    for _ in 0..5 {
        sgd_step(&x, &y, &w1, &b1).unwrap();
        graph.replay();
    }
    let bits = |a: &Array| -> Vec<u32> {
        a.to_vec()
            .wait()
            .unwrap()
            .iter()
            .map(|v| v.to_bits())
            .collect()
    };
    assert_eq!(bits(&w1), bits(&w2));
    assert_eq!(bits(&b1), bits(&b2));
    assert_eq!(bits(&w1.grad().unwrap()), bits(&w2.grad().unwrap()));
    // And training did something.
    assert_ne!(bits(&b1), [0, 0]);
}

#[test]
fn bad_backward_calls_are_errors() {
    let arrays = Arrays::new(&Engine::new());
    let w = arrays.ones(&[2]).unwrap().with_grad();
    // A result of more than one element needs its gradient given.
    let err = (&w * 2.0).backward().unwrap_err();
    assert!(matches!(err, Error::Array { op: "backward", .. }), "{err}");
    // A seed of another shape.
    let err = (&w * 2.0)
        .backward_with(&arrays.ones(&[3]).unwrap())
        .unwrap_err();
    assert!(err.to_string().contains("[3]"), "{err}");
    // Nothing flows to a constant, or to what no_grad made.
    let c = arrays.ones(&[1]).unwrap();
    assert!(matches!(c.backward(), Err(Error::Array { .. })));
    let made = nd::no_grad(|| w.sum()).unwrap();
    assert!(!made.requires_grad());
    assert!(matches!(made.backward(), Err(Error::Array { .. })));
    // In place on an array a gradient flows through: refused, except
    // under no_grad.
    let err = w.add_assign_scalar(1.0).unwrap_err();
    assert!(err.to_string().contains("no_grad"), "{err}");
    nd::no_grad(|| w.add_assign_scalar(1.0)).unwrap();
    assert_eq!(w.to_vec().wait().unwrap(), [2.0, 2.0]);
    // An operator's in-place form poisons instead (it cannot return).
    let mut v = w.clone();
    v += 1.0;
    assert!(w.to_vec().wait().is_err());
}
