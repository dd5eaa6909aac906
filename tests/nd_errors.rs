//! The array layer's errors (`depflow::nd`, issue 30): every operation's
//! bad input gets `Error::Array` naming the operation (and both shapes
//! where there are two) at the call, leaving its operands untouched;
//! operators on misfits give failed arrays whose reads resolve to that
//! same error; a failure reaches the reads of every array depending on it
//! as `Error::Poisoned` carrying the original failure; an intermediate of a
//! recording cannot be read outside it. Never a panic, never a hang: every
//! blocking read runs under `within` (a bound on the wait, as `nd::Values`
//! has only `wait`).

mod common;

use common::within;
use depflow::{Engine, Error, Executor, nd};

/// The values, or the error, within 30 s.
fn read(a: &nd::Array) -> Result<Vec<f32>, Error> {
    let a = a.clone();
    within(30, move || a.to_vec().wait())
}

/// Asserts `result` is `Error::Array` of `op` whose message has every
/// piece of `names` (shapes, usually).
#[track_caller]
fn misfit<T: std::fmt::Debug>(result: Result<T, Error>, op: &str, names: &[&str]) -> String {
    match result {
        Err(Error::Array { op: got, message }) => {
            assert_eq!(got, op, "{message}");
            for n in names {
                assert!(message.contains(n), "`{op}`: {message:?} does not name {n}");
            }
            format!("{op}: {message}")
        }
        other => panic!("`{op}`: want Error::Array, got {other:?}"),
    }
}

fn setup() -> (Engine, nd::Arrays) {
    let engine = Engine::builder()
        .threads(2)
        .device("d1", Executor::pool(1))
        .build()
        .unwrap();
    let arrays = nd::Arrays::new(&engine);
    (engine, arrays)
}

type Method = fn(&nd::Array, &nd::Array) -> Result<nd::Array, Error>;
type InPlace = fn(&nd::Array, &nd::Array) -> Result<(), Error>;

const BINARY: [(&str, Method); 12] = [
    ("add", nd::Array::add),
    ("sub", nd::Array::sub),
    ("mul", nd::Array::mul),
    ("div", nd::Array::div),
    ("maximum", nd::Array::maximum),
    ("minimum", nd::Array::minimum),
    ("pow", nd::Array::pow),
    ("eq", nd::Array::eq),
    ("gt", nd::Array::gt),
    ("ge", nd::Array::ge),
    ("lt", nd::Array::lt),
    ("le", nd::Array::le),
];

const IN_PLACE: [(&str, InPlace); 5] = [
    ("add", nd::Array::add_assign),
    ("sub", nd::Array::sub_assign),
    ("mul", nd::Array::mul_assign),
    ("div", nd::Array::div_assign),
    ("assign", nd::Array::assign),
];

#[test]
fn binary_ops_refuse_shapes_that_do_not_broadcast() {
    let (_engine, arrays) = setup();
    let a = arrays.ones(&[2, 3]).unwrap();
    let b = arrays.ones(&[4]).unwrap();
    let c = arrays.ones(&[3, 2, 2]).unwrap();
    for (name, f) in BINARY {
        misfit(f(&a, &b), name, &["[2, 3]", "[4]"]);
        misfit(f(&b, &a), name, &["[2, 3]", "[4]"]);
        misfit(f(&a, &c), name, &["[2, 3]", "[3, 2, 2]"]);
    }
    // The operands are untouched.
    assert_eq!(read(&a).unwrap(), [1.0; 6]);
}

#[test]
fn in_place_ops_refuse_operands_that_do_not_broadcast_to_the_target() {
    let (_engine, arrays) = setup();
    let t = arrays.full(&[2, 3], 5.0).unwrap();
    let apart = arrays.ones(&[4]).unwrap();
    // Broadcasts with [2, 3], but to [4, 2, 3], not to the target's shape.
    let larger = arrays.ones(&[4, 2, 3]).unwrap();
    // Broadcasts with [2, 3] to [2, 3], but the target [1, 3] is smaller.
    let small = arrays.full(&[1, 3], 5.0).unwrap();
    let row = arrays.ones(&[2, 3]).unwrap();
    for (name, f) in IN_PLACE {
        misfit(f(&t, &apart), name, &["[4]", "[2, 3]"]);
        misfit(f(&t, &larger), name, &["[4, 2, 3]", "[2, 3]"]);
        misfit(f(&small, &row), name, &["[2, 3]", "[1, 3]"]);
    }
    // Refused at the call: the targets keep their values.
    assert_eq!(read(&t).unwrap(), [5.0; 6]);
    assert_eq!(read(&small).unwrap(), [5.0; 3]);
}

#[test]
fn matmul_refuses_what_does_not_multiply() {
    let (_engine, arrays) = setup();
    let z = |s: &[usize]| arrays.zeros(s).unwrap();
    for (a, b) in [
        (vec![2, 3], vec![3]),          // rank
        (vec![3], vec![3]),             // rank
        (vec![2, 3], vec![2, 3, 2]),    // ranks differ
        (vec![2, 3], vec![4, 2]),       // inner length
        (vec![2, 2, 3], vec![2, 4, 2]), // inner length, batched
        (vec![2, 2, 3], vec![3, 3, 2]), // batch
        (vec![1, 2, 2, 2], vec![1, 2, 2, 2]),
    ] {
        let (sa, sb) = (format!("{a:?}"), format!("{b:?}"));
        misfit(z(&a).matmul(&z(&b)), "matmul", &[&sa, &sb]);
    }
}

#[test]
fn layout_ops_refuse_bad_axes_ranges_and_shapes() {
    let (_engine, arrays) = setup();
    let a = arrays.arange(6).unwrap().reshape(&[2, 3]).unwrap();
    for axes in [&[0, 0][..], &[0], &[0, 2], &[1, 0, 2], &[]] {
        misfit(
            a.permute(axes),
            "permute",
            &["[2, 3]", &format!("{axes:?}")],
        );
    }
    misfit(a.reshape(&[4]), "reshape", &["[2, 3]", "[4]"]);
    misfit(a.reshape(&[]), "reshape", &["[2, 3]", "[]"]);
    misfit(a.slice_axis(1, 2..4), "slice_axis", &["2..4", "[2, 3]"]);
    #[allow(clippy::reversed_empty_ranges)]
    let backwards = 2..1;
    misfit(
        a.slice_axis(0, backwards),
        "slice_axis",
        &["2..1", "[2, 3]"],
    );
    misfit(a.slice_axis(2, 0..1), "slice_axis", &["axis 2", "[2, 3]"]);
    let scalar = arrays.full(&[], 1.0).unwrap();
    misfit(scalar.slice_axis(0, 0..1), "slice_axis", &["axis 0", "[]"]);

    misfit(nd::concat(&[], 0), "concat", &["no arrays"]);
    let b = arrays.zeros(&[2, 2]).unwrap();
    misfit(nd::concat(&[&a, &b], 0), "concat", &["[2, 3]", "[2, 2]"]);
    let c = arrays.zeros(&[2, 3, 1]).unwrap();
    misfit(nd::concat(&[&a, &c], 0), "concat", &["[2, 3]", "[2, 3, 1]"]);
    misfit(nd::concat(&[&a, &a], 2), "concat", &["axis 2", "[2, 3]"]);
    misfit(nd::concat(&[&scalar], 0), "concat", &["axis 0", "[]"]);
    // Nothing was pushed on `a`'s values by the refusals.
    assert_eq!(read(&a).unwrap(), [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
}

#[test]
fn reductions_refuse_bad_axes_and_argmax_an_empty_one() {
    let (_engine, arrays) = setup();
    let a = arrays.zeros(&[2, 3]).unwrap();
    type Reduce = fn(&nd::Array, usize) -> Result<nd::Array, Error>;
    let reductions: [(&str, Reduce); 6] = [
        ("sum_axis", nd::Array::sum_axis),
        ("mean_axis", nd::Array::mean_axis),
        ("max_axis", nd::Array::max_axis),
        ("argmax", nd::Array::argmax),
        ("softmax", nd::Array::softmax),
        ("log_softmax", nd::Array::log_softmax),
    ];
    let scalar = arrays.full(&[], 1.0).unwrap();
    for (name, f) in reductions {
        misfit(f(&a, 2), name, &["axis 2", "[2, 3]"]);
        misfit(f(&scalar, 0), name, &["axis 0", "[]"]);
    }
    let empty = arrays.zeros(&[2, 0]).unwrap();
    misfit(empty.argmax(1), "argmax", &["axis 1", "[2, 0]", "empty"]);
    // Along a non-empty axis of an empty array: an empty result.
    assert_eq!(empty.argmax(0).unwrap().shape(), [0]);
    assert_eq!(read(&empty.argmax(0).unwrap()).unwrap(), [] as [f32; 0]);
}

#[test]
fn making_and_reading_refuse_bad_lengths_and_distributions() {
    let (_engine, arrays) = setup();
    misfit(
        arrays.from_vec(vec![1.0; 5], &[2, 3]),
        "from_vec",
        &["5", "[2, 3]"],
    );
    misfit(arrays.from_vec(vec![], &[]), "from_vec", &["0", "[]"]);
    let a = arrays.zeros(&[2, 3]).unwrap();
    misfit(a.set(vec![1.0; 7]), "set", &["7", "[2, 3]"]);
    assert_eq!(read(&a).unwrap(), [0.0; 6]);
    misfit(a.item(), "item", &["[2, 3]", "6"]);
    misfit(arrays.zeros(&[0]).unwrap().item(), "item", &["[0]"]);
    assert_eq!(arrays.full(&[1, 1], 4.0).unwrap().item().unwrap(), 4.0);

    misfit(arrays.uniform(&[2], 1.0, 1.0), "uniform", &["[1, 1)"]);
    misfit(arrays.uniform(&[2], 2.0, 1.0), "uniform", &["[2, 1)"]);
    misfit(arrays.uniform(&[2], f32::NAN, 1.0), "uniform", &["NaN"]);
    misfit(
        arrays.uniform(&[2], 0.0, f32::INFINITY),
        "uniform",
        &["inf"],
    );
    // rand_distr's Normal takes a negative deviation; the docs say no.
    misfit(
        arrays.normal(&[2], 0.0, -1.0),
        "normal",
        &["-1", "negative"],
    );
    misfit(arrays.normal(&[2], 0.0, f32::NAN), "normal", &["NaN"]);
}

#[test]
fn devices_of_another_engine_and_operands_on_different_devices_are_refused() {
    let (engine, arrays) = setup();
    let (other, other_arrays) = setup();
    let a = arrays.ones(&[2]).unwrap();
    // Another engine's devices, the default one (index 0) included.
    for device in [other.default_device(), other.device("d1").unwrap()] {
        misfit(a.to(device), "to", &["[2]", "not a device"]);
        misfit(arrays.on(device), "on", &["not a device"]);
        let dest = other_arrays.on(device).unwrap().zeros(&[2]).unwrap();
        misfit(a.copy_to(&dest), "copy_to", &["another engine"]);
        assert_eq!(read(&dest).unwrap(), [0.0; 2]);
    }
    misfit(
        a.copy_to(&arrays.zeros(&[3]).unwrap()),
        "copy_to",
        &["[2]", "[3]"],
    );

    // Operands on two devices of one engine, and of two engines.
    let d1 = engine.device("d1").unwrap();
    let b = arrays.on(d1).unwrap().ones(&[2]).unwrap();
    let foreign = other_arrays.ones(&[2]).unwrap();
    for x in [&b, &foreign] {
        for (name, f) in BINARY {
            misfit(f(&a, x), name, &["different devices", "[2]"]);
        }
        for (name, f) in IN_PLACE {
            misfit(f(&a, x), name, &["different devices"]);
        }
        misfit(a.matmul(x), "matmul", &["different devices"]);
        misfit(nd::concat(&[&a, x], 0), "concat", &["different devices"]);
    }
    assert_eq!(read(&a).unwrap(), [1.0; 2]);
}

#[test]
fn operators_on_misfits_give_failed_arrays_with_the_methods_error() {
    let (_engine, arrays) = setup();
    let a = arrays.ones(&[2, 3]).unwrap();
    let b = arrays.ones(&[4]).unwrap();
    let failed = [
        (&a + &b, a.add(&b)),
        (&a - &b, a.sub(&b)),
        (&a * &b, a.mul(&b)),
        (&a / &b, a.div(&b)),
        (a.clone() + b.clone(), a.add(&b)),
    ];
    for (array, method) in failed {
        let message = method.unwrap_err().to_string();
        // Of the left operand's shape, as documented.
        assert_eq!(array.shape(), [2, 3]);
        let err = read(&array).unwrap_err();
        assert!(
            matches!(err, Error::Poisoned { .. }),
            "{err:?}: a read of a failed array"
        );
        assert!(err.to_string().contains(&message), "{err} lacks {message}");
        let op_error = err.failure().unwrap().op_error().unwrap();
        assert!(
            matches!(op_error.downcast_ref::<Error>(), Some(Error::Array { .. })),
            "the failure's error is the method's: {op_error:?}"
        );
        // `Display` shows it in place of the values.
        assert!(array.to_string().contains(&message));
    }
}

#[test]
fn an_in_place_operator_on_a_misfit_poisons_its_target_and_its_views() {
    let (_engine, arrays) = setup();
    let mut t = arrays.ones(&[2, 3]).unwrap();
    let view = t.reshape(&[6]).unwrap();
    let before = &t * 2.0; // pushed before the misfit: still right
    let larger = arrays.ones(&[4, 2, 3]).unwrap();
    let message = t.add_assign(&larger).unwrap_err().to_string();
    t += &larger;
    let after = &t * 2.0;
    assert_eq!(read(&before).unwrap(), [2.0; 6]);
    for x in [&t, &view, &after] {
        let err = read(x).unwrap_err();
        assert!(matches!(err, Error::Poisoned { .. }), "{err:?}");
        assert!(err.to_string().contains(&message), "{err} lacks {message}");
    }
    // The operand is untouched.
    assert_eq!(read(&larger).unwrap(), [1.0; 24]);
}

#[test]
fn a_failure_reaches_every_dependent_read_as_poisoned_with_the_original() {
    let (engine, arrays) = setup();
    let a = arrays.ones(&[2, 3]).unwrap();
    let b = arrays.ones(&[4]).unwrap();
    let f = &a + &b; // failed
    let g = f.exp().unwrap();
    let h = &g * 2.0;
    let d1 = engine.device("d1").unwrap();
    let moved = h.to(d1).unwrap().sum().unwrap();
    let independent = (&a * 3.0).sum().unwrap();
    let out = arrays.zeros(&[2, 3]).unwrap();
    out.assign(&h).unwrap();
    for x in [&g, &h, &moved, &out] {
        match read(x) {
            Err(Error::Poisoned { cause, .. }) => {
                assert_eq!(cause.op_name(), Some("add"));
                assert!(cause.to_string().contains("[2, 3] and [4]"), "{cause}");
            }
            other => panic!("want Poisoned by `add`, got {other:?}"),
        }
    }
    assert!(matches!(moved.item(), Err(Error::Poisoned { .. })));
    assert_eq!(independent.item().unwrap(), 18.0);
}

#[test]
fn an_intermediate_of_a_recording_cannot_be_read_outside_it() {
    let (engine, arrays) = setup();
    let x = arrays.from_vec(vec![1.0, 2.0], &[2]).unwrap();
    let y = arrays.zeros(&[2]).unwrap();
    let mut leaked = None;
    let graph = nd::record(&engine, || {
        let t = x.mul_scalar(2.0)?;
        y.assign(&t)?;
        leaked = Some(t);
        Ok::<(), Error>(())
    })
    .unwrap();
    let t = leaked.unwrap();
    within(30, move || graph.replay().wait()).unwrap();
    assert_eq!(read(&y).unwrap(), [2.0, 4.0]);
    assert!(
        matches!(read(&t), Err(Error::GraphOwned(_))),
        "{:?}",
        read(&t)
    );
    assert!(matches!(t.item(), Err(Error::Array { op: "item", .. })));
    assert!(matches!(t.wait_to_read(), Err(Error::GraphOwned(_))));
    // Nor used in an eager operation: the method refuses, the operator
    // gives a failed array.
    assert!(matches!(t.add_scalar(1.0), Err(Error::GraphOwned(_))));
    let err = read(&(&t + 1.0)).unwrap_err();
    assert!(
        err.to_string().contains("intermediate of a recorded graph"),
        "{err}"
    );
    assert!(matches!(x.add(&t), Err(Error::GraphOwned(_))));
}

#[test]
fn shapes_whose_element_count_overflows_are_refused_not_a_panic() {
    let (_engine, arrays) = setup();
    let huge = [usize::MAX, 2];
    misfit(arrays.zeros(&huge), "full", &["[18446744073709551615, 2]"]);
    misfit(arrays.full(&[1 << 40, 1 << 40], 1.0), "full", &["usize"]);
    misfit(arrays.uniform(&huge, 0.0, 1.0), "uniform", &["usize"]);
    misfit(arrays.normal(&huge, 0.0, 1.0), "normal", &["usize"]);
    misfit(arrays.from_vec(vec![1.0], &huge), "from_vec", &["usize"]);
    let a = arrays.zeros(&[0]).unwrap();
    misfit(a.reshape(&huge), "reshape", &["usize"]);
    // A zero length makes any other length fit.
    assert_eq!(a.reshape(&[usize::MAX, 0]).unwrap().len(), 0);
    assert_eq!(arrays.zeros(&[0, usize::MAX, 2]).unwrap().len(), 0);
}
