//! Seed 000's two small programs, written on arrays (`depflow::nd`): every
//! line is an engine op whose reads and mutations come from its operands.
//!
//! ```text
//! cargo run --release --features nd --example nd_seed_program
//! ```
//!
//! 1. The four lines `B = A + 1; C = A + 2; A = C * 2; D = A + 3` on vectors
//!    of `LEN` elements: `B` and `C` both read `A` and may run side by side;
//!    `A = C * 2` makes a new `A`, and the old one goes once `B` and `C`
//!    have read it. The values are checked against the same lines on plain
//!    `f32`s.
//! 2. The random-number example: several ops draw from one generator, an
//!    engine variable that every draw mutates, so the draws run one at a
//!    time in program order whatever the executor. The same seeded program
//!    runs on engines of one thread, two threads, the default pool and the
//!    inline executor (with a second device drawing from the same
//!    generator), and every run must draw the same numbers, bit for bit, as
//!    a plain `StdRng` making the same draws in the same order.
//!
//! It exits non-zero (a failed `assert!`) on any mismatch.

use depflow::{Engine, Error, Executor, nd};
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand_distr::{Distribution, Normal, Uniform};

const LEN: usize = 1000;
const SEED: u64 = 2024;

/// `B = A + 1; C = A + 2; A = C * 2; D = A + 3`, with `A = [0, 1, ...]`.
fn four_lines(engine: &Engine) -> Result<(), Error> {
    let arrays = nd::Arrays::new(engine);
    let mut a = arrays.arange(LEN)?;
    let b = &a + 1.0;
    let c = &a + 2.0;
    a = &c * 2.0;
    let d = &a + 3.0;
    let got = [&b, &c, &a, &d].map(|x| x.to_vec().wait());
    let [b, c, a, d] = got.map(|x| x.expect("read"));
    for i in 0..LEN {
        let a0 = i as f32;
        let (b1, c1) = (a0 + 1.0, a0 + 2.0);
        let a1 = c1 * 2.0;
        assert_eq!([b[i], c[i], a[i], d[i]], [b1, c1, a1, a1 + 3.0], "at {i}");
    }
    println!(
        "four lines on {LEN} elements: B[999] = {}, C[999] = {}, A[999] = {}, D[999] = {}: \
         all {LEN} checked",
        b[LEN - 1],
        c[LEN - 1],
        a[LEN - 1],
        d[LEN - 1]
    );
    Ok(())
}

/// The seeded program: draws on two devices from the one generator, each
/// used by an op as soon as drawn. Returns every draw's bits, in program
/// order, and the sum of two of them (computed on the engine).
fn draws(engine: &Engine) -> Result<(Vec<Vec<u32>>, Vec<u32>), Error> {
    let cpu = nd::Arrays::new(engine);
    let other = cpu.on(engine.device("dev1").expect("built with it"))?;
    cpu.seed(SEED)?;
    let r1 = cpu.uniform(&[LEN], -1.0, 1.0)?;
    let r2 = other.normal(&[LEN], 0.0, 1.0)?;
    let sum = (&r1 + &r2.to(cpu.device())?).to_vec(); // uses r1 and r2 at once
    let r3 = other.uniform(&[LEN], 0.0, 10.0)?;
    let r4 = cpu.normal(&[LEN], 5.0, 2.0)?;
    let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<u32>>();
    let all = [r1, r2, r3, r4]
        .iter()
        .map(|r| r.to_vec().wait().map(bits))
        .collect::<Result<_, _>>()?;
    Ok((all, bits(sum.wait()?)))
}

/// The same draws from a plain generator, in the same order, without the
/// engine.
fn reference() -> Vec<Vec<u32>> {
    let mut rng = StdRng::seed_from_u64(SEED);
    let mut draw = |d: &dyn Fn(&mut StdRng) -> f32| {
        (0..LEN)
            .map(|_| d(&mut rng).to_bits())
            .collect::<Vec<u32>>()
    };
    let u1 = Uniform::new(-1.0f32, 1.0).expect("range");
    let n2 = Normal::new(0.0f32, 1.0).expect("std");
    let u3 = Uniform::new(0.0f32, 10.0).expect("range");
    let n4 = Normal::new(5.0f32, 2.0).expect("std");
    vec![
        draw(&|r| u1.sample(r)),
        draw(&|r| n2.sample(r)),
        draw(&|r| u3.sample(r)),
        draw(&|r| n4.sample(r)),
    ]
}

fn main() -> Result<(), Error> {
    four_lines(&Engine::new())?;

    let expected = reference();
    let mut sums = Vec::new();
    for (label, executor) in [
        ("pool(1)", Some(Executor::pool(1))),
        ("pool(2)", Some(Executor::pool(2))),
        ("default pool", None),
        ("inline", Some(Executor::inline())),
    ] {
        // The second device runs on the same kind of executor.
        let (default, dev1) = match &executor {
            Some(e) => (e.clone(), e.clone()),
            None => (Executor::pool(1), Executor::pool(1)),
        };
        let mut builder = Engine::builder().device("dev1", dev1);
        if executor.is_some() {
            builder = builder.executor(default);
        }
        let engine = builder.build()?;
        let (got, sum) = draws(&engine)?;
        let same = got == expected;
        println!(
            "{label:>12}: 4 draws of {LEN} from one generator on two devices; \
             first {:.6}, last {:.6}; same bits as a plain StdRng: {same}",
            f32::from_bits(got[0][0]),
            f32::from_bits(got[3][LEN - 1]),
        );
        assert!(
            same,
            "{label}: the draws differ from the serial generator's"
        );
        sums.push(sum);
    }
    assert!(
        sums.windows(2).all(|w| w[0] == w[1]),
        "r1 + r2 differs between executors"
    );
    println!("r1 + r2 bit-identical on all four engines: true");
    Ok(())
}
