//! Typed access (`OpBuilder::with`): declaring a variable is what gives the
//! body its access; the engine's semantics are those of the untyped form.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use depflow::{BoxError, Engine, Error, Executor, Lane, read, write};

/// A meeting point for `n` parties that gives up after a generous bound, so
/// a test that needs concurrency fails instead of hanging.
#[derive(Clone)]
struct Rendezvous(Arc<(Mutex<usize>, Condvar)>, usize);

impl Rendezvous {
    fn new(n: usize) -> Self {
        Self(Arc::new((Mutex::new(0), Condvar::new())), n)
    }

    /// Arrives and waits for the others; an error if they do not all come
    /// within 10 s.
    fn meet(&self) -> Result<(), BoxError> {
        let (count, cv) = &*self.0;
        let mut arrived = count.lock().unwrap();
        *arrived += 1;
        cv.notify_all();
        let (arrived, timeout) = cv
            .wait_timeout_while(arrived, Duration::from_secs(10), |a| *a < self.1)
            .unwrap();
        if timeout.timed_out() {
            return Err(format!("only {} of {} met", *arrived, self.1).into());
        }
        Ok(())
    }
}

#[test]
fn typed_bodies_get_the_declared_values_in_order() -> Result<(), Error> {
    let engine = Engine::new();
    let x = engine.var(vec![1.0f64, 2.0, 3.0]);
    let y = engine.var(vec![10.0f64; 3]);
    let n = engine.var(0usize);
    // y += 2 x; n = len(y)
    let total = engine
        .op()
        .name("axpy")
        .with((read(&x), write(&y), write(&n)))
        .run(|(x, y, n)| {
            y.iter_mut().zip(x).for_each(|(y, x)| *y += 2.0 * x);
            *n = y.len();
            Ok(y.iter().sum::<f64>())
        })?;
    assert_eq!(total.wait()?, 42.0);
    assert_eq!(engine.get(&y).wait()?, vec![12.0, 14.0, 16.0]);
    assert_eq!(engine.get(&n).wait()?, 3);
    // One access, not in a tuple: the body gets it bare.
    let len = engine.op().with(read(&x)).run(|x| Ok(x.len()))?;
    assert_eq!(len.wait()?, 3);
    engine.op().with(write(&n)).run(|n| {
        *n += 1;
        Ok(())
    })?;
    assert_eq!(engine.get(&n).wait()?, 4);
    Ok(())
}

#[test]
fn eight_accesses_of_different_types() -> Result<(), Error> {
    let engine = Engine::new();
    let (a, b, c, d) = (
        engine.var(1u8),
        engine.var(2u16),
        engine.var(3u32),
        engine.var(4u64),
    );
    let (e, f, g) = (
        engine.var(5i8),
        engine.var(String::from("s")),
        engine.var(()),
    );
    let out = engine.var(0.0f64);
    let sum = engine
        .op()
        .with((
            read(&a),
            read(&b),
            read(&c),
            read(&d),
            read(&e),
            write(&f),
            read(&g),
            write(&out),
        ))
        .run(|(a, b, c, d, e, f, (), out)| {
            let s = f64::from(*a) + f64::from(*b) + f64::from(*c) + *d as f64 + f64::from(*e);
            f.push('!');
            *out = s;
            Ok(s)
        })?;
    assert_eq!(sum.wait()?, 15.0);
    assert_eq!(engine.get(&f).wait()?, "s!");
    assert_eq!(engine.get(&out).wait()?, 15.0);
    Ok(())
}

#[test]
fn typed_readers_of_one_variable_run_together() -> Result<(), Error> {
    let engine = Engine::builder().threads(2).build()?;
    let v = engine.var(7);
    let meet = Rendezvous::new(2);
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let meet = meet.clone();
            engine.op().with(read(&v)).run(move |v| {
                // Both hold `v` at once, or neither returns.
                meet.meet()?;
                Ok(*v)
            })
        })
        .collect::<Result<_, _>>()?;
    for r in readers {
        assert_eq!(r.wait()?, 7);
    }
    Ok(())
}

#[test]
fn typed_writers_of_one_variable_run_alone_in_push_order() -> Result<(), Error> {
    let engine = Engine::builder().threads(2).build()?;
    let v = engine.var(Vec::new());
    let inside = Arc::new(AtomicUsize::new(0));
    for i in 0..50 {
        let inside = inside.clone();
        engine.op().with(write(&v)).run(move |v| {
            assert_eq!(
                inside.fetch_add(1, Ordering::SeqCst),
                0,
                "two writers at once"
            );
            std::thread::yield_now();
            v.push(i);
            inside.fetch_sub(1, Ordering::SeqCst);
            Ok(())
        })?;
        // A reader between writers sees exactly the writes before it.
        let seen = engine.op().with(read(&v)).run(move |v| Ok(v.len()))?;
        assert_eq!(seen.wait()?, i + 1);
    }
    assert_eq!(engine.get(&v).wait()?, (0..50).collect::<Vec<_>>());
    Ok(())
}

#[test]
fn typed_ops_on_a_named_pool_device() -> Result<(), Error> {
    let engine = Engine::builder().device("d1", Executor::pool(1)).build()?;
    let d1 = engine.device("d1").unwrap();
    let v = engine.var(1);
    let (device, value) = engine
        .op()
        .on(d1)
        .with(write(&v))
        .run_with_ctx(|ctx, v| {
            *v += 1;
            Ok((ctx.device(), *v))
        })?
        .wait()?;
    assert_eq!((device, value), (d1, 2));
    Ok(())
}

#[test]
fn typed_ops_on_a_stream_device_enqueue_on_their_lane() -> Result<(), Error> {
    let engine = Engine::builder()
        .device("gpu", Executor::simulated_gpu(1))
        .build()?;
    let gpu = engine.device("gpu").unwrap();
    let (src, dst) = (engine.var(vec![1, 2, 3]), engine.var(Vec::new()));
    let lane = engine
        .op()
        .on(gpu)
        .lane(Lane::HostToDevice)
        .with((read(&src), write(&dst)))
        .run_with_ctx(|ctx, (src, dst)| {
            let lane = ctx.stream()?.lane();
            dst.extend_from_slice(src);
            Ok(lane)
        })?;
    assert_eq!(lane.wait()?, Lane::HostToDevice);
    assert_eq!(engine.get(&dst).wait()?, vec![1, 2, 3]);
    Ok(())
}

#[test]
fn typed_ops_take_resource_units() -> Result<(), Error> {
    let engine = Engine::builder().threads(2).build()?;
    let streams = engine.new_resource("streams", 1);
    let inside = Arc::new(AtomicUsize::new(0));
    let vars: Vec<_> = (0..8).map(|i| engine.var(i)).collect();
    // Independent variables, one unit: the ops never overlap.
    for v in &vars {
        let inside = inside.clone();
        engine.op().uses(&streams, 1).with(write(v)).run(move |v| {
            assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "units shared");
            std::thread::yield_now();
            *v *= 10;
            inside.fetch_sub(1, Ordering::SeqCst);
            Ok(())
        })?;
    }
    engine.wait_all().wait()?;
    assert_eq!(streams.in_use(), 0);
    for (i, v) in vars.iter().enumerate() {
        assert_eq!(engine.get(v).wait()?, i * 10);
    }
    // A lasting allocation, on a variable the typed access mutates.
    let memory = engine.new_resource("memory", 4);
    let buf = engine.var(Vec::new());
    engine
        .op()
        .allocates(&memory, 3, &buf)
        .with(write(&buf))
        .run(|buf| {
            buf.resize(3, 0u8);
            Ok(())
        })?
        .wait()?;
    assert_eq!(memory.in_use(), 3);
    Ok(())
}

#[test]
fn a_variable_mutated_twice_in_one_typed_op_is_refused_at_push() -> Result<(), Error> {
    let engine = Engine::new();
    let (x, y) = (engine.var(1), engine.var(2));
    let refused = engine
        .op()
        .with((write(&x), read(&y), read(&x)))
        .run(|(x, _, _)| {
            *x += 1;
            Ok(())
        });
    assert!(
        matches!(refused, Err(Error::Borrowed(id)) if id == x.id()),
        "{refused:?}"
    );
    let refused = engine
        .op()
        .with((write(&y), write(&y)))
        .run_async(|_| async { Ok(()) });
    assert!(
        matches!(refused, Err(Error::Borrowed(id)) if id == y.id()),
        "{refused:?}"
    );
    // Nothing was pushed.
    engine.wait_all().wait()?;
    assert_eq!((x.version(), y.version()), (0, 0));
    // Two reads of one variable are fine.
    let sum = engine
        .op()
        .with((read(&x), read(&x)))
        .run(|(a, b)| Ok(a + b))?;
    assert_eq!(sum.wait()?, 2);
    Ok(())
}

#[test]
fn typed_async_bodies_hold_their_values_across_awaits() -> Result<(), Error> {
    let engine = Engine::builder().threads(2).build()?;
    let (src, dst) = (engine.var(vec![1u8, 2, 3]), engine.var(Vec::new()));
    let len = engine
        .op()
        .name("upload")
        .with((read(&src), write(&dst)))
        .run_async(|mut vars| async move {
            assert_eq!(vars.ctx().name(), Some("upload"));
            let (src, mut dst) = vars.get()?;
            let data = async { src.clone() }.await;
            dst.extend(data);
            Ok(dst.len())
        })?;
    assert_eq!(len.wait()?, 3);
    assert_eq!(engine.get(&dst).wait()?, vec![1, 2, 3]);
    // Two async readers hold the variable together.
    let meet = Rendezvous::new(2);
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let meet = meet.clone();
            engine
                .op()
                .with(read(&dst))
                .run_async(move |mut vars| async move {
                    let dst = vars.get()?;
                    meet.meet()?;
                    Ok(dst.len())
                })
        })
        .collect::<Result<_, _>>()?;
    for r in readers {
        assert_eq!(r.wait()?, 3);
    }
    Ok(())
}

#[test]
fn typed_failures_poison_like_untyped_ones() -> Result<(), Error> {
    let engine = Engine::new();
    let (x, y) = (engine.var(1), engine.var(0));
    let failed = engine
        .op()
        .name("bad")
        .with((read(&x), write(&y)))
        .run(|(_, _)| Err::<(), _>("no".into()))?;
    assert!(matches!(failed.wait(), Err(Error::Failed(_))));
    let ran = Arc::new(AtomicUsize::new(0));
    let skipped = engine.op().with(read(&y)).run({
        let ran = ran.clone();
        move |_| {
            ran.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
    })?;
    match skipped.wait() {
        Err(Error::Poisoned { cause, .. }) => assert_eq!(cause.op_name(), Some("bad")),
        other => panic!("{other:?}"),
    }
    assert_eq!(ran.load(Ordering::SeqCst), 0);
    let _ = engine.wait_all().wait();
    Ok(())
}

#[test]
fn typed_and_untyped_declarations_mix() -> Result<(), Error> {
    let engine = Engine::new();
    let (tag, x, y) = (engine.new_var(), engine.var(3), engine.var(0));
    let ky = y.key();
    let out = engine
        .op()
        .reads(&[&tag])
        .with(read(&x))
        .run_with_ctx(move |ctx, x| {
            // The context reaches the other declared variables; a handed
            // value stays borrowed.
            assert!(matches!(ctx.read(ky), Err(Error::NotDeclared(_))));
            Ok(*x)
        })?;
    assert_eq!(out.wait()?, 3);
    let kx = x.key();
    let borrowed = engine
        .op()
        .with(write(&x))
        .run_with_ctx(move |ctx, _x| Ok(matches!(ctx.write(kx), Err(Error::Borrowed(_)))))?;
    assert!(borrowed.wait()?);
    // The untyped form still works beside it.
    engine.push(&[&x], &[&y], {
        let kx = x.key();
        move |ctx| {
            *ctx.write(ky)? = *ctx.read(kx)? * 2;
            Ok(())
        }
    })?;
    assert_eq!(engine.get(&y).wait()?, 6);
    // After waiting for room.
    let room = engine.op().when_room().wait()?;
    room.with(write(&y)).run(|y| {
        *y += 1;
        Ok(())
    })?;
    assert_eq!(engine.get(&y).wait()?, 7);
    Ok(())
}
