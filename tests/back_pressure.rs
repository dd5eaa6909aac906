//! Back-pressure for producers of replays and of data-parallel steps (issue
//! 29, item 4): a replay counts as one op under `max_in_flight`, a
//! producer of replays waits with `Graph::when_room`, and one of steps with
//! `Group::when_room`; the ops in flight then never exceed the bound (plus,
//! for steps, one step's ops less one: the documented slack).

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::mpsc;
use std::time::Duration;

use common::within;
use depflow::parallel::Group;
use depflow::{Engine, Error, Executor, Graph, Var};

const BOUND: usize = 8;

/// Holds `gate` (mutated) until the returned sender is dropped or sent to.
fn hold(engine: &Engine, gate: &Var) -> mpsc::Sender<()> {
    let (tx, rx) = mpsc::channel::<()>();
    engine
        .push(&[], &[gate], move |_| {
            let _ = rx.recv();
            Ok(())
        })
        .unwrap();
    tx
}

/// A graph of one op that reads `gate`, spends `work` and counts itself
/// into `x`.
fn counting_graph(engine: &Engine, gate: &Var, x: &Var<u64>, work: Duration) -> Graph {
    engine
        .record(|rec| {
            let k = x.key();
            rec.op().reads(&[gate]).mutates(&[x]).run(move |ctx| {
                std::thread::sleep(work);
                *ctx.write(k)? += 1;
                Ok(())
            })
        })
        .unwrap()
}

/// A replay is admitted as one op: counted in flight while it waits, and
/// out once it ended.
#[test]
fn a_replay_counts_as_one_op_in_flight() {
    within(60, || {
        let engine = Engine::builder().max_in_flight(BOUND).build().unwrap();
        let (gate, x) = (engine.new_var(), engine.var(0u64));
        let graph = counting_graph(&engine, &gate, &x, Duration::ZERO);
        let release = hold(&engine, &gate);
        // Plain replays never wait: 20 pushed behind the gate are all in
        // flight, past the bound (what `when_room` is for).
        let replays: Vec<_> = (0..20).map(|_| graph.replay()).collect();
        assert_eq!(engine.in_flight(), 21);
        assert!(engine.diagnostics().in_flight() == 21);
        drop(release);
        for r in replays {
            r.wait().unwrap();
        }
        engine.wait_all().wait().unwrap();
        assert_eq!(engine.in_flight(), 0);
        assert_eq!(engine.get(&x).wait().unwrap(), 20);
    });
}

/// A captured graph's replay (one launch op on a stream device) counts as
/// one op too, and waits for room the same way.
#[test]
fn a_captured_replay_counts_as_one_op_in_flight() {
    within(60, || {
        let engine = Engine::builder()
            .device("gpu", Executor::simulated_gpu(1))
            .max_in_flight(BOUND)
            .build()
            .unwrap();
        let gpu = engine.device("gpu").unwrap();
        let (gate, x) = (engine.new_var(), engine.new_var());
        let graph = engine
            .record(|rec| {
                rec.capture();
                rec.op()
                    .on(gpu)
                    .reads(&[&gate])
                    .mutates(&[&x])
                    .run(|ctx| Ok(ctx.stream()?.enqueue_repeatable(|| Ok(()))?))
            })
            .unwrap();
        let release = hold(&engine, &gate);
        let replays: Vec<_> = (0..3).map(|_| graph.replay()).collect();
        assert_eq!(engine.in_flight(), 4);
        drop(release);
        for r in replays {
            r.wait().unwrap();
        }
        let peak = AtomicUsize::new(0);
        for _ in 0..200 {
            graph.when_room().wait().unwrap().replay();
            peak.fetch_max(engine.in_flight(), SeqCst);
        }
        engine.wait_all().wait().unwrap();
        assert!(
            peak.load(SeqCst) <= BOUND,
            "{} in flight",
            peak.load(SeqCst)
        );
    });
}

/// 1,000 replays pushed at once through `when_room`, blocking and async,
/// each slower than its push: the ops in flight never exceed the bound.
/// (Without the wait they reach the hundreds.)
#[test]
fn replays_pushed_through_when_room_stay_under_the_bound() {
    within(120, || {
        let engine = Engine::builder()
            .threads(2)
            .max_in_flight(BOUND)
            .build()
            .unwrap();
        let (gate, x) = (engine.new_var(), engine.var(0u64));
        let graph = counting_graph(&engine, &gate, &x, Duration::from_micros(50));
        let mut peak = 0;
        for _ in 0..1000 {
            graph.when_room().wait().unwrap().replay();
            peak = peak.max(engine.in_flight());
        }
        assert!(peak <= BOUND, "{peak} ops in flight, bound {BOUND}");
        futures::executor::block_on(async {
            for _ in 0..1000 {
                graph.when_room().await.unwrap().replay();
                peak = peak.max(engine.in_flight());
            }
        });
        assert!(peak <= BOUND, "{peak} ops in flight, bound {BOUND}");
        engine.wait_all().wait().unwrap();
        assert_eq!(engine.get(&x).wait().unwrap(), 2000);
    });
}

/// Inside an op of the engine a replay's wait never waits, as an op's does:
/// room besides the calling op, or `WaitsForItself`.
#[test]
fn a_replays_wait_inside_an_op_never_waits() {
    within(60, || {
        let engine = Engine::builder()
            .threads(2)
            .max_in_flight(1)
            .build()
            .unwrap();
        let (gate, x) = (engine.new_var(), engine.var(0u64));
        let graph = counting_graph(&engine, &gate, &x, Duration::ZERO);
        let release = hold(&engine, &gate);
        let (e, g, v) = (engine.clone(), graph.clone(), engine.new_var());
        // In flight: the gate and this op; no room besides this op.
        let inside = engine
            .push(&[], &[&v], move |_| {
                let blocking = g.when_room().wait().map(drop);
                let polled = futures::executor::block_on(g.when_room()).map(drop);
                Ok((blocking, polled, e.in_flight()))
            })
            .unwrap();
        let (blocking, polled, in_flight) = inside.wait().unwrap();
        assert_eq!(in_flight, 2);
        assert!(
            matches!(blocking, Err(Error::WaitsForItself)),
            "{blocking:?}"
        );
        assert!(matches!(polled, Err(Error::WaitsForItself)), "{polled:?}");
        drop(release);
        engine.wait_all().wait().unwrap();
        // Room besides the calling op: it resolves, and the replay runs.
        let g = graph.clone();
        let replayed = engine
            .push(&[], &[&v], move |_| {
                g.when_room().wait()?.replay();
                Ok(())
            })
            .unwrap();
        replayed.wait().unwrap();
        engine.wait_all().wait().unwrap();
        assert_eq!(engine.get(&x).wait().unwrap(), 1);
    });
}

/// A group of two CPU devices, one parameter of 4 floats; each step pushes
/// one op per device writing its gradient (reading `gate`, spending
/// `work`), then the group's reduction and update.
struct Steps {
    engine: Engine,
    group: Group,
    gate: Var,
    param: depflow::parallel::Param,
}

impl Steps {
    fn new(bound: usize) -> Self {
        let engine = Engine::builder()
            .threads(2)
            .device("cpu0", Executor::pool(1))
            .device("cpu1", Executor::pool(1))
            .max_in_flight(bound)
            .build()
            .unwrap();
        let devices = ["cpu0", "cpu1"].map(|d| engine.device(d).unwrap());
        let mut group = Group::builder(&engine)
            .devices(devices)
            .optimizer(|w, g| w.iter_mut().zip(g).for_each(|(w, g)| *w -= g))
            .build()
            .unwrap();
        let param = group.param(&[0.0; 4]).unwrap();
        let gate = engine.new_var();
        Self {
            engine,
            group,
            gate,
            param,
        }
    }

    /// The step closure.
    fn backward(
        gate: &Var,
        param: depflow::parallel::Param,
        work: Duration,
    ) -> impl FnMut(&mut depflow::parallel::DeviceStep<'_>) -> Result<(), Error> {
        move |s| {
            let g = s.grad(param).clone();
            s.engine()
                .op()
                .on(s.device())
                .reads(&[gate])
                .mutates(&[&g])
                .run({
                    let g = g.key();
                    move |ctx| {
                        std::thread::sleep(work);
                        ctx.write(g)?.fill(0.25);
                        Ok(())
                    }
                })?;
            s.grad_ready(param)
        }
    }

    /// The ops one step pushes, counted behind a held gate.
    fn ops_per_step(&mut self) -> usize {
        let release = hold(&self.engine, &self.gate);
        let before = self.engine.in_flight();
        let f = Self::backward(&self.gate, self.param, Duration::ZERO);
        self.group.step(f).unwrap();
        let ops = self.engine.in_flight() - before;
        drop(release);
        self.engine.wait_all().wait().unwrap();
        ops
    }
}

/// 1,000 steps pushed at once through `Group::when_room`, blocking and
/// async, each slower than its push: the ops in flight never exceed the
/// bound plus one step's ops less one (a step starts with room for one op
/// and is never left half pushed). Without the wait they grow without
/// bound.
#[test]
fn steps_pushed_through_when_room_stay_under_the_bound() {
    within(120, || {
        let mut t = Steps::new(BOUND);
        let per_step = t.ops_per_step();
        assert!(per_step >= 4, "{per_step} ops per step");
        // Behind a held gate, plain steps never wait: all their ops are in
        // flight, far past the bound (what `when_room` is for).
        let release = hold(&t.engine, &t.gate);
        for _ in 0..5 {
            let f = Steps::backward(&t.gate, t.param, Duration::ZERO);
            t.group.step(f).unwrap();
        }
        assert_eq!(t.engine.in_flight(), 1 + 5 * per_step);
        drop(release);
        t.engine.wait_all().wait().unwrap();

        let slack = per_step - 1;
        let mut peak = 0;
        let work = Duration::from_micros(50);
        for _ in 0..1000 {
            let f = Steps::backward(&t.gate, t.param, work);
            t.group.when_room().wait().unwrap().step(f).unwrap();
            peak = peak.max(t.engine.in_flight());
        }
        assert!(
            peak <= BOUND + slack,
            "{peak} ops in flight, bound {BOUND} + {slack}"
        );
        let (group, engine) = (&mut t.group, &t.engine);
        futures::executor::block_on(async {
            for _ in 0..1000 {
                let f = Steps::backward(&t.gate, t.param, work);
                group.when_room().await.unwrap().step(f).unwrap();
                peak = peak.max(engine.in_flight());
            }
        });
        assert!(
            peak <= BOUND + slack,
            "{peak} ops in flight, bound {BOUND} + {slack}"
        );
        t.engine.wait_all().wait().unwrap();
        // Every step ran: 2,006 steps of -0.5 each (two devices' 0.25).
        assert_eq!(t.group.weights(t.param, 0).unwrap(), [-1003.0; 4]);
    });
}

/// A step's wait inside an op of the engine never waits: with no room
/// besides the calling op it resolves to `WaitsForItself`.
#[test]
fn a_steps_wait_inside_an_op_never_waits() {
    within(60, || {
        let t = Steps::new(1);
        let release = hold(&t.engine, &t.gate);
        let group = Arc::new(std::sync::Mutex::new(t.group));
        let (g, v) = (group.clone(), t.engine.new_var());
        // In flight: the gate and this op; no room besides this op.
        let inside = t
            .engine
            .push(&[], &[&v], move |_| {
                let mut group = g.lock().unwrap();
                let blocking = group.when_room().wait().map(drop);
                let polled = futures::executor::block_on(group.when_room()).map(drop);
                Ok((blocking, polled))
            })
            .unwrap();
        let (blocking, polled) = inside.wait().unwrap();
        assert!(
            matches!(blocking, Err(Error::WaitsForItself)),
            "{blocking:?}"
        );
        assert!(matches!(polled, Err(Error::WaitsForItself)), "{polled:?}");
        drop(release);
        t.engine.wait_all().wait().unwrap();
        // Room besides the calling op: it resolves, and the step is pushed.
        let (g, param, gate) = (group.clone(), t.param, t.gate.clone());
        let stepped = t
            .engine
            .push(&[], &[&v], move |_| {
                let mut group = g.lock().unwrap();
                group
                    .when_room()
                    .wait()?
                    .step(Steps::backward(&gate, param, Duration::ZERO))?;
                Ok(())
            })
            .unwrap();
        stepped.wait().unwrap();
        t.engine.wait_all().wait().unwrap();
        let weights = group.lock().unwrap().weights(t.param, 0).unwrap();
        assert_eq!(weights, [-0.5; 4]);
    });
}
