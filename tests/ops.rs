//! One op description for push and record (`Ops`, `OpBuilder`): typed access
//! on recorded ops, planned buffers as operands alike with variables, a
//! step written once that runs pushed or recorded to the same bits, and
//! what a recording's closure may return.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use depflow::{Buffer, Engine, Error, Executor, Lane, Ops, Var, read, write};

#[test]
fn recorded_ops_take_typed_accesses() -> Result<(), Error> {
    let engine = Engine::new();
    let (x, y) = (engine.var(vec![1.0f32, 2.0]), engine.var(vec![0.0f32; 2]));
    let graph = engine.record(|rec| {
        let t = rec.var(vec![0.0f32; 2]); // an intermediate
        rec.op()
            .name("scale")
            .with((read(&x), write(&t)))
            .run(|(x, t)| {
                t.iter_mut().zip(x).for_each(|(t, x)| *t = 2.0 * x);
                Ok(())
            })?;
        rec.op()
            .name("accumulate")
            .with((read(&t), write(&y)))
            .run_with_ctx(|ctx, (t, y)| {
                assert_eq!(ctx.name(), Some("accumulate"));
                y.iter_mut().zip(t).for_each(|(y, t)| *y += t);
                Ok(())
            })
    })?;
    for _ in 0..3 {
        graph.replay();
    }
    assert_eq!(engine.get(&y).wait()?, [6.0, 12.0]);
    assert_eq!(graph.ops().len(), 2);
    assert_eq!(graph.ops()[0].name.as_deref(), Some("scale"));
    Ok(())
}

#[test]
fn a_recorded_typed_op_naming_a_variable_twice_is_refused() {
    let engine = Engine::new();
    let x = engine.var(0u8);
    let err = engine
        .record(|rec| rec.op().with((read(&x), write(&x))).run(|_| Ok(())))
        .unwrap_err();
    assert!(
        matches!(err, Error::Borrowed(id) if id == x.id()),
        "{err:?}"
    );
}

#[test]
fn planned_buffers_are_operands_like_variables() -> Result<(), Error> {
    let engine = Engine::new();
    let (x, total) = (engine.var(vec![1u32, 2, 3]), engine.var(0u32));
    let graph = engine.record(|rec| {
        let doubled = rec.buffer::<u32>(3);
        // Typed access: the body gets `&[u32]` / `&mut [u32]`.
        rec.op().with((read(&x), write(&doubled))).run(|(x, d)| {
            d.iter_mut().zip(x).for_each(|(d, x)| *d = 2 * x);
            Ok(())
        })?;
        // The context: `ctx.read(&buffer)` as for a variable.
        rec.op().reads(&[&doubled]).mutates(&[&total]).run({
            let (d, total) = (doubled.clone(), total.key());
            move |ctx| {
                *ctx.write(total)? = ctx.read(&d)?.iter().sum();
                Ok(())
            }
        })
    })?;
    graph.replay().wait()?;
    assert_eq!(engine.get(&total).wait()?, 12);
    Ok(())
}

#[test]
fn a_buffer_is_borrow_checked_like_a_variable() -> Result<(), Error> {
    let engine = Engine::new();
    let (b, done) = (engine.buffer::<f64>(2), engine.new_var());
    let seen = engine
        .op()
        .reads(&[&b])
        .mutates(&[&done])
        .run({
            let b = b.clone();
            move |ctx| {
                let read = ctx.read(&b)?;
                assert!(read.iter().all(|&v| v == 0.0), "a new buffer is zeroed");
                // Declared as read: no write.
                Ok(matches!(ctx.write(&b), Err(Error::NotMutable(_))))
            }
        })?
        .wait()?;
    assert!(seen);
    let conflict = engine
        .op()
        .mutates(&[&b])
        .run({
            let b = b.clone();
            move |ctx| {
                let _held = ctx.write(&b)?;
                Ok(matches!(ctx.read(&b), Err(Error::Borrowed(_))))
            }
        })?
        .wait()?;
    assert!(conflict);
    let undeclared = engine.buffer::<u8>(1);
    let refused = engine
        .op()
        .mutates(&[&done])
        .run(move |ctx| Ok(matches!(ctx.read(&undeclared), Err(Error::NotDeclared(_)))))?
        .wait()?;
    assert!(refused);
    Ok(())
}

/// Two steps of a tiny model, written once against `Ops`: a hidden layer
/// through a planned (or engine) buffer, a loss into a variable, and an
/// update of the weights.
fn train_step(
    ops: &impl Ops,
    w: &Var<Vec<f32>>,
    x: &Buffer<f32>,
    loss: &Var<f32>,
) -> Result<(), Error> {
    let h = ops.buffer_named::<f32>("h", 4);
    let g = ops.buffer_named::<f32>("grad", 4);
    ops.op()
        .name("forward")
        .with((read(w), read(x), write(&h)))
        .run(|(w, x, h)| {
            for ((h, w), x) in h.iter_mut().zip(w).zip(x) {
                *h = (w * x).tanh();
            }
            Ok(())
        })?;
    ops.op()
        .name("loss")
        .with((read(&h), read(x), write(&g), write(loss)))
        .run(|(h, x, g, loss)| {
            for ((g, h), x) in g.iter_mut().zip(h).zip(x) {
                // d/dw of (h - 0.5)^2 with h = tanh(w x).
                *g = 2.0 * (h - 0.5) * (1.0 - h * h) * x;
            }
            *loss += h.iter().map(|h| (h - 0.5) * (h - 0.5)).sum::<f32>();
            Ok(())
        })?;
    ops.op()
        .name("sgd")
        .with((read(&g), write(w)))
        .run(|(g, w)| {
            w.iter_mut().zip(g).for_each(|(w, g)| *w -= 0.3 * g);
            Ok(())
        })?;
    Ok(())
}

#[test]
fn a_step_written_once_runs_pushed_or_recorded_to_the_same_bits() -> Result<(), Error> {
    for order in [depflow::Order::Parallel, depflow::Order::Sequential] {
        let engine = Engine::new();
        let x = engine.buffer::<f32>(4);
        engine.op().with(write(&x)).run(|x| {
            x.copy_from_slice(&[0.5, -1.0, 2.0, 0.25]);
            Ok(())
        })?;
        let init = vec![0.1f32, 0.2, -0.3, 0.4];
        let (w_eager, loss_eager) = (engine.var(init.clone()), engine.var(0.0f32));
        let (w_graph, loss_graph) = (engine.var(init), engine.var(0.0f32));
        let graph = engine.record(|rec| {
            rec.order(order);
            train_step(rec, &w_graph, &x, &loss_graph)
        })?;
        // The recorded step's intermediates are planned buffers.
        assert_eq!(graph.plan().buffers.len(), 2);
        for _ in 0..20 {
            train_step(&engine, &w_eager, &x, &loss_eager)?;
            graph.replay();
        }
        engine.wait_all().wait()?;
        let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
        let w = engine.get(&w_eager).wait()?;
        assert_eq!(bits(w.clone()), bits(engine.get(&w_graph).wait()?));
        assert_eq!(
            engine.get(&loss_eager).wait()?.to_bits(),
            engine.get(&loss_graph).wait()?.to_bits()
        );
        assert_ne!(w, [0.1, 0.2, -0.3, 0.4], "the step trained nothing");
    }
    Ok(())
}

#[test]
fn ops_descriptions_carry_every_option_both_ways() -> Result<(), Error> {
    let engine = Engine::builder()
        .device("gpu", Executor::simulated_gpu(1))
        .build()?;
    let gpu = engine.device("gpu").unwrap();
    let slots = engine.new_resource("slots", 1);
    let v = engine.var(0u32);
    let lanes = Arc::new(AtomicUsize::new(0));
    fn on_gpu(
        ops: &impl Ops,
        gpu: depflow::Device,
        slots: &depflow::Resource,
        v: &Var<u32>,
        lanes: &Arc<AtomicUsize>,
    ) -> Result<(), Error> {
        let lanes = lanes.clone();
        ops.op()
            .name("upload")
            .priority(3)
            .on(gpu)
            .lane(Lane::HostToDevice)
            .uses(slots, 1)
            .with(write(v))
            .run_with_ctx(move |ctx, v| {
                assert_eq!(ctx.stream()?.lane(), Lane::HostToDevice);
                lanes.fetch_add(1, Ordering::Relaxed);
                *v += 1;
                Ok(())
            })?;
        Ok(())
    }
    on_gpu(&engine, gpu, &slots, &v, &lanes)?;
    let graph = engine.record(|rec| on_gpu(rec, gpu, &slots, &v, &lanes))?;
    graph.replay().wait()?;
    assert_eq!(engine.get(&v).wait()?, 2);
    assert_eq!(lanes.load(Ordering::Relaxed), 2);
    assert_eq!(slots.in_use(), 0);
    Ok(())
}

#[test]
fn an_allocating_description_is_pushed_but_refused_when_recorded() -> Result<(), Error> {
    fn fill(ops: &impl Ops, pool: &depflow::Resource, out: &Var<u8>) -> Result<(), Error> {
        ops.op()
            .allocates(pool, 1, out)
            .with(write(out))
            .run(|out| {
                *out = 7;
                Ok(())
            })?;
        Ok(())
    }
    let engine = Engine::new();
    let pool = engine.new_resource("pool", 1);
    let out = engine.var(0u8);
    fill(&engine, &pool, &out)?;
    assert_eq!(engine.get(&out).wait()?, 7);
    assert_eq!(pool.in_use(), 1, "the output holds its unit");
    let err = engine.record(|rec| fill(rec, &pool, &out)).unwrap_err();
    match err {
        Error::Graph(msg) => assert!(msg.contains("`pool`"), "{msg}"),
        other => panic!("{other:?}"),
    }
    Ok(())
}

#[derive(Debug)]
struct LoadFailed;

impl std::fmt::Display for LoadFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the batch file is missing")
    }
}

impl std::error::Error for LoadFailed {}

#[test]
fn a_recording_closure_may_return_any_error() {
    let engine = Engine::new();
    let v = engine.var(0u8);
    // The caller's own error type.
    let err = engine
        .record(|rec| {
            rec.op().with(write(&v)).run(|_| Ok(()))?;
            Err(LoadFailed)?;
            Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
        })
        .unwrap_err();
    let Error::Recording(inner) = &err else {
        panic!("{err:?}")
    };
    assert!(inner.downcast_ref::<LoadFailed>().is_some());
    assert_eq!(err.to_string(), "recording: the batch file is missing");
    // A depflow error comes back as itself, not wrapped.
    let foreign = Engine::new().var(0u8);
    let err = engine
        .record(|rec| rec.op().with(write(&foreign)).run(|_| Ok(())))
        .unwrap_err();
    assert!(
        matches!(err, Error::ForeignVar(id) if id == foreign.id()),
        "{err:?}"
    );
    // A closure returning a concrete error type of its own.
    let err = engine.record(|_| Err::<(), _>(LoadFailed)).unwrap_err();
    assert!(matches!(err, Error::Recording(_)), "{err:?}");
}

#[test]
fn an_engine_buffer_lives_on_its_own_and_joins_a_recording_as_boundary() -> Result<(), Error> {
    let engine = Engine::new();
    let b = engine.buffer_named::<i64>("acc", 3);
    assert_eq!((b.len(), b.is_empty()), (3, false));
    assert!(b.id().to_string().starts_with("`acc` (var#"));
    let graph = engine.record(|rec| {
        rec.op().with(write(&b)).run(|b| {
            b.iter_mut().for_each(|v| *v += 1);
            Ok(())
        })
    })?;
    assert_eq!(graph.boundary(), [(b.id(), true)]);
    for _ in 0..4 {
        graph.replay();
    }
    let got = engine.op().with(read(&b)).run(|b| Ok(b.to_vec()))?.wait()?;
    assert_eq!(got, [4, 4, 4]);
    Ok(())
}
