//! Differential test, in the spirit of MXNet's RandSumExpr: random programs
//! (random reads and mutations over a few dozen variables, short sleeps,
//! failing and panicking ops, async ops, deletes, probes of intermediate
//! values, sometimes several pushing threads) run on every executor, and every
//! op's outcome, every probe, and every variable's final value, state and
//! version must equal what a serial replay of the program gives.
//!
//! Ops also take resource units: temporary ones from a pool all pushers
//! share, and temporary or allocated (lasting) ones from a pool of their
//! pusher, drawn so that the program fits when run serially (the engine's
//! no-deadlock guarantee). The op bodies keep their own account of the units
//! in use, which must never exceed a capacity, and the units still held at
//! the end must be those the replay says live variables hold.
//!
//! On the `streams` engine, devices `d1` and `d2` are simulated GPUs: their
//! ops enqueue their computation on a lane (random) and fail or panic on
//! the device or in the body, so the replay also checks stream order,
//! cross-lane waits, host ops waiting for device work, and poison reported
//! by the device (with `--features cuda` and a GPU, also on two CUDA
//! devices, the work running as host functions in stream order). Variable
//! values are "device memory" (an atomic cell the
//! enqueued work updates). Device ops take no lasting units: an op already
//! enqueued behind failed device work has handed its allocation on (see
//! `stream`), which a serial replay would not.
//!
//! `DEPFLOW_DIFF_PROGRAMS` sets the number of programs per executor (default
//! 1000; CI runs the default). With `--features cuda` but no GPU the CUDA
//! executor is skipped, with `SKIPPED` and why (the driver's words); under
//! `DEPFLOW_REQUIRE_GPU=1` that skip is a failure.

mod common;
#[path = "../examples/gpu/require.rs"]
mod require;

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use std::sync::atomic::{AtomicI64, Ordering::SeqCst};
use std::sync::{Arc, Mutex};

use common::{Rng, engines, mix, within};
use depflow::{AnyVar, Engine, Error, Lane, Resource, Var};

/// A variable's value: a cell that device work updates in stream order.
type Mem = Arc<std::sync::atomic::AtomicU64>;

fn mem(x: u64) -> Mem {
    Arc::new(std::sync::atomic::AtomicU64::new(x))
}

const VARS: usize = 24;
/// Capacity of each pusher's own pool.
const OWN_UNITS: u64 = 4;
/// Capacity of the pool all pushers share (temporary units only).
const SHARED_UNITS: u64 = 3;

/// Units an op takes: temporary ones of the shared and of its own pool, and
/// `alloc` units of its own pool handed on to its first mutated variable.
#[derive(Clone, Copy, Debug, Default)]
struct Units {
    shared: u64,
    own: u64,
    alloc: u64,
}

/// The units in use per pool as the op bodies see them (see `Account` in
/// tests/resources.rs: never above what the engine lets out), and what each
/// variable holds of its pusher's pool.
struct Ledger {
    shared: AtomicI64,
    own: Vec<AtomicI64>,
    held: Mutex<Vec<u64>>,
}

impl Ledger {
    fn take(pool: &AtomicI64, units: u64, capacity: u64) {
        let now = pool.fetch_add(units as i64, SeqCst) + units as i64;
        assert!(now <= capacity as i64, "{now} units in use of {capacity}");
    }
    fn give(pool: &AtomicI64, units: u64) {
        pool.fetch_sub(units as i64, SeqCst);
    }
}

#[derive(Clone, Debug)]
enum Body {
    Compute,
    Fail,
    Panic,
    Sleep(u64),
    Spin(u32),
    /// An async op that yields once before computing.
    Yield,
    /// An async op that waits for another thread to wake it.
    Timer(u64),
}

#[derive(Clone, Debug)]
enum Step {
    Op {
        reads: Vec<usize>,
        mutates: Vec<usize>,
        body: Body,
        priority: i32,
        device: usize,
        units: Units,
    },
    Delete(usize),
    /// Reads a variable's value through an op pushed at this point.
    Probe(usize),
    /// `wait_for_var`, compared with the replay's state.
    Wait(usize),
}

/// What a step resolved to; compared between the engine and the replay.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Outcome {
    Value(u64),
    Failed(String),
    Poisoned(String),
    Refused(&'static str),
    Done,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum State {
    Live(u64),
    Poisoned(String),
    Deleted,
}

/// The value an op writes to its `k`-th mutated variable.
fn compute(op: usize, k: usize, old: u64, inputs: u64) -> u64 {
    mix(old
        .wrapping_add((op as u64).wrapping_mul(31))
        .wrapping_add(inputs.wrapping_mul(17))
        .wrapping_add(k as u64))
}

fn generate(
    rng: &mut Rng,
    vars: &[usize],
    shared: &[usize],
    len: usize,
    devices: usize,
    streams: bool,
) -> Vec<Step> {
    let mut steps = Vec::with_capacity(len);
    let mut deleted = Vec::new();
    // At most what each variable holds of the own pool, to keep the program
    // fitting when run serially whichever ops fail.
    let mut held = [0u64; VARS];
    for _ in 0..len {
        let pick = |rng: &mut Rng, from: &[usize]| from[rng.below(from.len() as u64) as usize];
        let roll = rng.below(100);
        if roll < 2 && vars.len() > deleted.len() + 2 {
            let v = pick(rng, vars);
            deleted.push(v);
            held[v] = 0;
            steps.push(Step::Delete(v));
            continue;
        }
        if roll < 8 {
            steps.push(Step::Probe(pick(rng, vars)));
            continue;
        }
        if roll < 11 {
            steps.push(Step::Wait(pick(rng, vars)));
            continue;
        }
        let nr = rng.below(4) as usize;
        let nm = rng.below(3) as usize;
        let mut reads: Vec<usize> = (0..nr)
            .map(|_| {
                if !shared.is_empty() && rng.below(3) == 0 {
                    pick(rng, shared)
                } else {
                    pick(rng, vars)
                }
            })
            .collect();
        let mutates: Vec<usize> = (0..nm).map(|_| pick(rng, vars)).collect();
        if reads.is_empty() && mutates.is_empty() {
            reads.push(pick(rng, vars));
        }
        let body = match rng.below(100) {
            0..=3 => Body::Fail,
            4..=5 => Body::Panic,
            6..=8 => Body::Sleep(1 + rng.below(50)),
            9..=29 => Body::Spin(rng.below(2000) as u32),
            30..=37 => Body::Yield,
            38..=40 => Body::Timer(rng.below(200)),
            _ => Body::Compute,
        };
        let priority = if rng.below(5) == 0 {
            rng.below(7) as i32 - 3
        } else {
            0
        };
        let device = rng.below(devices as u64) as usize;
        let on_streams = streams && device != 0;
        // Stream ops have synchronous bodies.
        let body = match body {
            Body::Yield | Body::Timer(_) if on_streams => Body::Compute,
            b => b,
        };
        let mut units = Units::default();
        if rng.below(3) == 0 {
            let free = OWN_UNITS - held.iter().sum::<u64>();
            units.shared = rng.below(SHARED_UNITS + 1);
            units.own = rng.below(free + 1);
            if let Some(&out) = mutates.first()
                && !deleted.contains(&out)
                && !on_streams
                && rng.below(2) == 0
            {
                units.alloc = rng.below(free - units.own + 1);
                // A successful op replaces what `out` held; a failed or
                // skipped one leaves it: count the larger.
                held[out] = held[out].max(units.alloc);
            }
        }
        steps.push(Step::Op {
            reads,
            mutates,
            body,
            priority,
            device,
            units,
        });
    }
    steps
}

/// The declared variables in the engine's edge order: mutated first, each
/// variable once, read-and-mutated counting as mutated.
fn edge_order(reads: &[usize], mutates: &[usize]) -> Vec<(usize, bool)> {
    let mut out: Vec<(usize, bool)> = Vec::new();
    for &m in mutates {
        if !out.iter().any(|&(v, _)| v == m) {
            out.push((m, true));
        }
    }
    for &r in reads {
        if !out.iter().any(|&(v, _)| v == r) {
            out.push((r, false));
        }
    }
    out
}

/// What the engine must do, computed serially.
fn replay(
    name: &str,
    steps: &[Step],
    states: &mut BTreeMap<usize, State>,
    versions: &mut BTreeMap<usize, u64>,
    held: &mut [u64],
) -> Vec<Outcome> {
    let mut outcomes = Vec::with_capacity(steps.len());
    for (i, step) in steps.iter().enumerate() {
        let outcome = match step {
            Step::Delete(v) => {
                if states[v] == State::Deleted {
                    Outcome::Refused("deleted")
                } else {
                    states.insert(*v, State::Deleted);
                    *versions.get_mut(v).unwrap() += 1;
                    held[*v] = 0;
                    Outcome::Done
                }
            }
            Step::Probe(v) | Step::Wait(v) => match &states[v] {
                State::Deleted => Outcome::Refused("deleted"),
                State::Poisoned(cause) => Outcome::Poisoned(cause.clone()),
                State::Live(x) => match step {
                    Step::Probe(_) => Outcome::Value(*x),
                    _ => Outcome::Done,
                },
            },
            Step::Op {
                reads,
                mutates,
                body,
                units,
                ..
            } => {
                let edges = edge_order(reads, mutates);
                if edges.iter().any(|(v, _)| states[v] == State::Deleted) {
                    outcomes.push(Outcome::Refused("deleted"));
                    continue;
                }
                let op_name = format!("{name}{i}");
                let poisoned = edges.iter().find_map(|(v, _)| match &states[v] {
                    State::Poisoned(c) => Some(c.clone()),
                    _ => None,
                });
                let result = match (poisoned, body) {
                    (Some(cause), _) => Err(Outcome::Poisoned(cause)),
                    (None, Body::Fail | Body::Panic) => Err(Outcome::Failed(op_name.clone())),
                    (None, _) => Ok(()),
                };
                let inputs: u64 = reads
                    .iter()
                    .map(|r| match states[r] {
                        State::Live(x) => x,
                        _ => 0,
                    })
                    .fold(0, u64::wrapping_add);
                for (k, (v, write)) in edges.iter().enumerate() {
                    if !write {
                        continue;
                    }
                    *versions.get_mut(v).unwrap() += 1;
                    let new = match &result {
                        Ok(()) => match states[v] {
                            State::Live(old) => State::Live(compute(i, k, old, inputs)),
                            _ => unreachable!(),
                        },
                        Err(Outcome::Poisoned(cause)) => State::Poisoned(cause.clone()),
                        Err(_) => State::Poisoned(op_name.clone()),
                    };
                    states.insert(*v, new);
                }
                if result.is_ok() && units.alloc > 0 {
                    held[mutates[0]] = units.alloc;
                }
                match result {
                    Ok(()) => Outcome::Value(inputs),
                    Err(o) => o,
                }
            }
        };
        outcomes.push(outcome);
    }
    outcomes
}

/// A future that wakes itself once before finishing.
struct YieldOnce(bool);

impl Future for YieldOnce {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if std::mem::replace(&mut self.0, true) {
            Poll::Ready(())
        } else {
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }
}

fn to_outcome<T>(r: Result<T, Error>, ok: impl FnOnce(T) -> Outcome) -> Outcome {
    match r {
        Ok(v) => ok(v),
        Err(Error::Failed(f)) => Outcome::Failed(f.op_name().unwrap_or("?").to_string()),
        Err(Error::Poisoned { cause: f, .. }) => {
            Outcome::Poisoned(f.op_name().unwrap_or("?").to_string())
        }
        Err(Error::Deleted(_)) => Outcome::Refused("deleted"),
        Err(e) => panic!("unexpected error {e}"),
    }
}

type Pending = Box<dyn FnOnce() -> Outcome + Send>;

/// A pusher's pools and the ledger, for its op bodies.
#[derive(Clone)]
struct Pools {
    shared: Resource,
    own: Resource,
    pusher: usize,
    ledger: Arc<Ledger>,
}

impl Pools {
    /// The body of an op with `units` (allocated to `out`) starts.
    fn start(&self, units: Units) {
        Ledger::take(&self.ledger.shared, units.shared, SHARED_UNITS);
        Ledger::take(
            &self.ledger.own[self.pusher],
            units.own + units.alloc,
            OWN_UNITS,
        );
    }

    /// It ends: temporary units go back; allocated ones replace what `out`
    /// held, or go back too if the op failed.
    fn end(&self, units: Units, out: Option<usize>, ok: bool) {
        Ledger::give(&self.ledger.shared, units.shared);
        let own = &self.ledger.own[self.pusher];
        match out {
            Some(v) if ok && units.alloc > 0 => {
                let old = std::mem::replace(&mut self.ledger.held.lock().unwrap()[v], units.alloc);
                Ledger::give(own, units.own + old);
            }
            _ => Ledger::give(own, units.own + units.alloc),
        }
    }
}

/// Pushes the program on the engine, in order, and returns how to collect
/// each step's outcome.
fn run(
    engine: &Engine,
    name: &str,
    steps: &[Step],
    vars: &[Var<Mem>],
    streams: bool,
    pools: &Pools,
) -> Vec<Pending> {
    let devices: Vec<_> = (0..3)
        .map(|d| match d {
            0 => engine.default_device(),
            d => engine
                .device(&format!("d{d}"))
                .unwrap_or(engine.default_device()),
        })
        .collect();
    let mut pending: Vec<Pending> = Vec::with_capacity(steps.len());
    for (i, step) in steps.iter().enumerate() {
        match step {
            Step::Delete(v) => {
                let (pools, v) = (pools.clone(), *v);
                let r = engine.delete_var(&vars[v], move |_| {
                    let held = std::mem::take(&mut pools.ledger.held.lock().unwrap()[v]);
                    Ledger::give(&pools.ledger.own[pools.pusher], held);
                });
                pending.push(Box::new(move || {
                    to_outcome(r.and_then(|h| h.wait()), |()| Outcome::Done)
                }));
            }
            Step::Probe(v) => {
                let var = vars[*v].clone();
                let r = engine.push(&[&vars[*v]], &[], move |ctx| {
                    Ok(ctx.read(&var)?.load(SeqCst))
                });
                pending.push(Box::new(move || {
                    to_outcome(r.and_then(|h| h.wait()), Outcome::Value)
                }));
            }
            Step::Wait(v) => {
                let w = engine.wait_for_var(&vars[*v]);
                pending.push(Box::new(move || to_outcome(w.wait(), |()| Outcome::Done)));
            }
            Step::Op {
                reads,
                mutates,
                body,
                priority,
                device,
                units,
            } => {
                let r_vars: Vec<Var<Mem>> = reads.iter().map(|&r| vars[r].clone()).collect();
                let edges = edge_order(reads, mutates);
                let m_vars: Vec<Var<Mem>> = edges
                    .iter()
                    .filter(|e| e.1)
                    .map(|&(m, _)| vars[m].clone())
                    .collect();
                let r_decl: Vec<&dyn AnyVar> =
                    reads.iter().map(|&r| &vars[r] as &dyn AnyVar).collect();
                let m_decl: Vec<&dyn AnyVar> =
                    mutates.iter().map(|&m| &vars[m] as &dyn AnyVar).collect();
                let (units, out, p) = (*units, mutates.first().copied(), pools.clone());
                // The op's memory: its inputs' and outputs' cells.
                let cells = move |ctx: &depflow::OpCtx| {
                    let ins = r_vars.iter().map(|r| Ok(ctx.read(r)?.clone()));
                    let outs = m_vars.iter().map(|m| Ok(ctx.write(m)?.clone()));
                    Ok((
                        ins.collect::<Result<_, Error>>()?,
                        outs.collect::<Result<_, Error>>()?,
                    ))
                };
                let work = move |ins: &[Mem], outs: &[Mem]| -> u64 {
                    p.start(units);
                    let inputs = ins.iter().fold(0u64, |a, r| a.wrapping_add(r.load(SeqCst)));
                    for (k, m) in outs.iter().enumerate() {
                        m.store(compute(i, k, m.load(SeqCst), inputs), SeqCst);
                    }
                    p.end(units, out, true);
                    inputs
                };
                let failing = {
                    let p = pools.clone();
                    move || {
                        p.start(units);
                        p.end(units, out, false);
                    }
                };
                let builder = engine
                    .op()
                    .name(format!("{name}{i}"))
                    .priority(*priority)
                    .on(devices[*device % devices.len()])
                    .reads(&r_decl)
                    .mutates(&m_decl)
                    .uses(&pools.shared, units.shared)
                    .uses(&pools.own, units.own);
                if streams && *device % 3 != 0 {
                    let lanes: &[Lane] = match *device % 3 {
                        1 => &[
                            Lane::Compute(0),
                            Lane::Compute(1),
                            Lane::HostToDevice,
                            Lane::DeviceToHost,
                        ],
                        _ => &[Lane::Compute(0), Lane::HostToDevice, Lane::DeviceToHost],
                    };
                    let lane = lanes[i % lanes.len()];
                    let r = run_on_streams(
                        builder.lane(lane),
                        i,
                        body.clone(),
                        units,
                        cells,
                        work,
                        pools,
                    );
                    pending.push(r);
                    continue;
                }
                let compute_all = move |ctx: &depflow::OpCtx| {
                    let (ins, outs) = cells(ctx)?;
                    Ok(work(&ins, &outs))
                };
                let builder = match out {
                    Some(v) if units.alloc > 0 => {
                        builder.allocates(&pools.own, units.alloc, &vars[v])
                    }
                    _ => builder,
                };
                let r = match body.clone() {
                    Body::Compute => builder.run(compute_all),
                    Body::Fail => builder.run(move |_| -> Result<u64, depflow::BoxError> {
                        failing();
                        Err("planned failure".into())
                    }),
                    Body::Panic => builder.run(move |_| {
                        failing();
                        panic!("planned panic")
                    }),
                    Body::Sleep(us) => builder.run(move |ctx| {
                        std::thread::sleep(Duration::from_micros(us));
                        compute_all(ctx)
                    }),
                    Body::Spin(n) => builder.run(move |ctx| {
                        for _ in 0..n {
                            std::hint::spin_loop();
                        }
                        compute_all(ctx)
                    }),
                    Body::Yield => builder.run_async(move |ctx| async move {
                        YieldOnce(false).await;
                        compute_all(&ctx)
                    }),
                    Body::Timer(us) => builder.run_async(move |ctx| async move {
                        let (tx, rx) = futures::channel::oneshot::channel();
                        std::thread::spawn(move || {
                            std::thread::sleep(Duration::from_micros(us));
                            let _ = tx.send(());
                        });
                        let _ = rx.await;
                        compute_all(&ctx)
                    }),
                };
                pending.push(Box::new(move || {
                    to_outcome(r.and_then(|h| h.wait()), Outcome::Value)
                }));
            }
        }
    }
    pending
}

/// Runs an op on a stream device (its builder ready): its body takes its
/// cells and enqueues the computation (or the failure: in the body or on the
/// device, by the op's parity). Stream ops take no lasting units.
fn run_on_streams(
    builder: depflow::OpBuilder<'_>,
    i: usize,
    body: Body,
    units: Units,
    cells: impl FnOnce(&depflow::OpCtx) -> Result<(Vec<Mem>, Vec<Mem>), Error> + Send + 'static,
    work: impl FnOnce(&[Mem], &[Mem]) -> u64 + Send + 'static,
    pools: &Pools,
) -> Pending {
    let p = pools.clone();
    let result = Arc::new(AtomicI64::new(0));
    let r2 = result.clone();
    let on_device = i % 2 == 0;
    let handle = builder.run(move |ctx| {
        let stream = ctx.stream()?;
        let fail = matches!(body, Body::Fail | Body::Panic);
        if fail && !on_device {
            p.start(units);
            p.end(units, None, false);
            return match body {
                Body::Fail => Err("planned failure".into()),
                _ => panic!("planned panic"),
            };
        }
        let (ins, outs) = if fail {
            Default::default()
        } else {
            cells(ctx)?
        };
        stream.enqueue(move || {
            if fail {
                p.start(units);
                p.end(units, None, false);
                match body {
                    Body::Fail => return Err("planned failure".into()),
                    _ => panic!("planned panic"),
                }
            }
            match body {
                Body::Sleep(us) => std::thread::sleep(Duration::from_micros(us)),
                Body::Spin(n) => (0..n).for_each(|_| std::hint::spin_loop()),
                _ => {}
            }
            r2.store(work(&ins, &outs) as i64, SeqCst);
            Ok(())
        })?;
        Ok(())
    });
    Box::new(move || {
        to_outcome(handle.and_then(|h| h.wait()), |()| {
            Outcome::Value(result.load(SeqCst) as u64)
        })
    })
}

fn final_state(engine: &Engine, var: &Var<Mem>) -> State {
    let v = var.clone();
    match engine.push(&[var], &[], move |ctx| Ok(ctx.read(&v)?.load(SeqCst))) {
        Err(Error::Deleted(_)) => State::Deleted,
        Err(e) => panic!("{e}"),
        Ok(h) => match h.wait() {
            Ok(x) => State::Live(x),
            Err(Error::Poisoned { cause: f, .. }) => {
                State::Poisoned(f.op_name().unwrap().to_string())
            }
            Err(e) => panic!("{e}"),
        },
    }
}

/// One program on one engine: `pushers` threads, each with its own mutated
/// variables and a few shared read-only ones.
fn check_program(engine: &Engine, seed: u64, pushers: usize, streams: bool) {
    let mut rng = Rng(seed);
    let vars: Vec<Var<Mem>> = (0..VARS)
        .map(|i| engine.var(mem(i as u64 * 1000)))
        .collect();
    let shared: Vec<usize> = (VARS - 4..VARS).collect();
    let per = (VARS - 4) / pushers;
    let mut initial: BTreeMap<usize, State> = (0..VARS)
        .map(|i| (i, State::Live(i as u64 * 1000)))
        .collect();
    let mut versions: BTreeMap<usize, u64> = (0..VARS).map(|i| (i, 0)).collect();
    let len = 20 + rng.below(100) as usize;
    let mut held = vec![0u64; VARS];
    let ledger = Arc::new(Ledger {
        shared: AtomicI64::new(0),
        own: (0..pushers).map(|_| AtomicI64::new(0)).collect(),
        held: Mutex::new(vec![0; VARS]),
    });
    let shared_pool = engine.new_resource("shared", SHARED_UNITS);
    let pools: Vec<Pools> = (0..pushers)
        .map(|t| Pools {
            shared: shared_pool.clone(),
            own: engine.new_resource(format!("own {t}"), OWN_UNITS),
            pusher: t,
            ledger: ledger.clone(),
        })
        .collect();
    let programs: Vec<(String, Vec<Step>, Vec<Outcome>)> = (0..pushers)
        .map(|t| {
            let own: Vec<usize> = (t * per..(t + 1) * per).collect();
            let mut steps = generate(&mut rng, &own, &shared, len, 3, streams);
            if pushers > 1 {
                // Shared variables stay read-only: keep their reads only.
                steps.retain(|s| !matches!(s, Step::Delete(v) | Step::Probe(v) | Step::Wait(v) if shared.contains(v)));
            }
            let name = format!("t{t}op");
            let expected = replay(&name, &steps, &mut initial, &mut versions, &mut held);
            (name, steps, expected)
        })
        .collect();
    let results: Vec<Vec<Outcome>> = std::thread::scope(|s| {
        let handles: Vec<_> = programs
            .iter()
            .zip(&pools)
            .map(|((name, steps, _), pools)| {
                let vars = &vars;
                s.spawn(move || run(engine, name, steps, vars, streams, pools))
            })
            .collect();
        let pending: Vec<Vec<Pending>> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        pending
            .into_iter()
            .map(|p| p.into_iter().map(|f| f()).collect())
            .collect()
    });
    for ((name, steps, expected), got) in programs.iter().zip(&results) {
        for (i, (e, g)) in expected.iter().zip(got).enumerate() {
            assert_eq!(e, g, "seed {seed}, {name}{i}: {:?}", steps[i]);
        }
    }
    for (i, var) in vars.iter().enumerate() {
        assert_eq!(
            final_state(engine, var),
            initial[&i],
            "seed {seed}: final state of var {i}"
        );
        assert_eq!(
            var.version(),
            versions[&i],
            "seed {seed}: version of var {i}"
        );
    }
    let _ = engine.wait_all().wait();
    assert_eq!(shared_pool.in_use(), 0, "seed {seed}: shared units left");
    for (t, pools) in pools.iter().enumerate() {
        let own: u64 = (t * per..(t + 1) * per).map(|v| held[v]).sum();
        assert_eq!(pools.own.in_use(), own, "seed {seed}: units of pusher {t}");
    }
}

fn programs() -> u64 {
    std::env::var("DEPFLOW_DIFF_PROGRAMS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1000)
}

#[test]
fn random_programs_match_a_serial_replay_on_every_executor() {
    let n = programs();
    let streams = Engine::builder()
        .threads(2)
        .device("d1", depflow::Executor::simulated_gpu(2))
        .device("d2", depflow::Executor::simulated_gpu(1))
        .build()
        .unwrap();
    let mut all = engines();
    all.push(("streams", streams));
    // The same programs on a real GPU (their device work is host functions,
    // run through cuLaunchHostFunc) where there is one.
    #[cfg(feature = "cuda")]
    match require::cuda_devices() {
        Ok(_) => {
            let cuda = Engine::builder()
                .threads(2)
                .device("d1", depflow::Executor::cuda(0, 2))
                .device("d2", depflow::Executor::cuda(0, 1))
                .build()
                .unwrap();
            all.push(("cuda", cuda));
        }
        Err(why) => require::skip(
            "random_programs_match_a_serial_replay_on_every_executor (its CUDA executor)",
            &why,
        ),
    }
    for (name, engine) in all {
        let name = name.to_string();
        let streams = name == "streams" || name == "cuda";
        within(600, move || {
            for seed in 0..n {
                let pushers = if seed % 4 == 3 {
                    1 + (seed as usize / 4) % 3
                } else {
                    1
                };
                let engine = engine.clone();
                let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    check_program(&engine, seed, pushers, streams)
                }));
                if let Err(e) = result {
                    eprintln!("executor {name}, seed {seed}, {pushers} pusher(s) failed");
                    std::panic::resume_unwind(e);
                }
            }
        });
    }
}
