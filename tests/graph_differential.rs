//! Differential test of recorded graphs (issue 13): random programs are
//! recorded once and replayed several times, interleaved with dynamic
//! pushes on the same variables, and everything observable must equal what
//! pushing the same ops dynamically gives ("a replay behaves exactly as if
//! its ops had been pushed, in recorded order, at the point of the replay
//! call"). The generator is this file's own, in the style of
//! tests/differential.rs (whose deletes and lasting units recorded graphs
//! do not take).
//!
//! A program (per pushing thread) has boundary variables (`Var<u64>`, its
//! own, plus read-only ones all threads share) and one or two graphs, each
//! with intermediates (`rec.var(0u64)`), planned buffers
//! (`rec.buffer::<u64>(1..64)`) and up to 14 ops over them (a variable may
//! be declared twice), some of which fail (an error before or after
//! writing, or a panic) on the iterations a hash of (iteration, op) picks.
//! Ops run on the default device, a second CPU device or a simulated GPU
//! (on one of three lanes, enqueuing device work after reading, before
//! writing; never failing there, see `generate_graph`), and some take 1 or
//! 2 units of the program's resource of 2 (recorded and pushed alike).
//! The graphs are recorded once, then the program runs 3 to 6 iterations,
//! each a replay of one of them or a few pushes on boundary variables (ops,
//! some failing, some only poisoning a boundary variable, so that the
//! recorded ops reading it are skipped, `clear_poison`, `wait_for_var`); a graph may be dropped
//! before its replays end. The reference engine runs the same sequence all
//! pushed: intermediates are plain variables, cleared of poison right
//! before each replayed iteration's ops; buffers are `Var<Vec<u64>>`.
//!
//! Every recorded op reads the program's `iter` variable, which a pushed op
//! sets before most replays (in both engines): the bodies' iteration is
//! ordered with them whether or not the replays are waited for.
//!
//! Compared: each pushed step's outcome; each replay's Ok/Err against its
//! ops' outcomes in the reference (Err iff some op failed or was skipped,
//! and the error is one of theirs); every boundary variable's final value
//! or poison (with the failing op's name) and version (which the ops see
//! too: each folds its boundary variables' versions into its outputs); the
//! intermediates' values (each exported at its graph's end into a boundary
//! variable); the number of failures `wait_all` reports.
//!
//! The buffer checker: every write fills a buffer with a stamp (its owner,
//! the iteration, a value derived from the op's inputs) and every read
//! checks the whole buffer holds its own stamp of this iteration, so two
//! live buffers given overlapping memory are caught (the values read also
//! feed the outputs). Seen failing: with the conflict relations of
//! `src/graph/plan.rs` made to return `false`, the test fails at once.
//!
//! Every executor (pools of 1 and 2, inline, custom: spawn-per-job, a
//! thread pool and run-at-once, tokio with its feature), both orders, ops on a second CPU device, and 1 to 3
//! threads recording and replaying their own graphs at once.
//!
//! Seeds: 0..N with N = `DEPFLOW_GRAPH_SEEDS` (default 200);
//! `DEPFLOW_GRAPH_SEED=s` runs seed `s` only. A failure prints the seed,
//! the executor and the programs.

mod common;

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex, Once};

use common::{Rng, custom_pool, mix, within};
use depflow::{
    AnyVar, BoxError, Buffer, Engine, Error, Executor, Lane, OpCtx, OpHandle, Order, Replay,
    Resource, Var, Wait,
};

/// A variable an op declares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Slot {
    /// A boundary variable of the program's own.
    B(usize),
    /// A read-only boundary variable all threads share.
    S(usize),
    /// An intermediate of the op's graph.
    I(usize),
    /// A planned buffer of the op's graph.
    Buf(usize),
}

/// When an op fails: on the iterations where `mix(op, iteration) % 100`
/// falls below the percentage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fail {
    Never,
    /// Returns an error before writing anything.
    Err(u64),
    /// Panics before writing anything.
    Panic(u64),
    /// Writes its outputs, then returns an error.
    WriteThenErr(u64),
}

#[derive(Clone, Debug)]
struct Op {
    name: String,
    id: u64,
    /// Recorded in this graph (reads `iter`, may touch the graph's
    /// intermediates and buffers), or pushed between replays (`None`).
    graph: Option<usize>,
    /// As declared: a variable may come twice, or among both reads and
    /// mutations (but for a buffer the op writes first).
    reads: Vec<Slot>,
    mutates: Vec<Slot>,
    /// The buffers this op writes first in recorded order: it overwrites
    /// them without reading.
    fresh: Vec<usize>,
    fail: Fail,
    /// 0: the default device; 1: the second CPU device; 2: the simulated
    /// GPU, on lane `Compute(lane)`.
    device: usize,
    lane: u8,
    /// Units of the program's resource (capacity 2) it uses.
    units: u64,
    priority: i32,
}

impl Op {
    fn fails(&self, iteration: u64) -> bool {
        let pct = match self.fail {
            Fail::Never => return false,
            Fail::Err(p) | Fail::Panic(p) | Fail::WriteThenErr(p) => p,
        };
        mix(self.id ^ iteration.wrapping_mul(0x2545_F491_4F6C_DD1D)) % 100 < pct
    }
}

#[derive(Clone, Debug)]
struct GraphSpec {
    order: Order,
    inters: usize,
    /// The planned buffers' lengths.
    bufs: Vec<usize>,
    /// Random ops, then one export per intermediate.
    ops: Vec<Op>,
    /// Drop the graph before its replays end.
    drop_early: bool,
}

#[derive(Clone, Debug)]
enum Step {
    Op(Op),
    ClearPoison(usize),
    Wait(usize),
}

#[derive(Clone, Debug)]
enum Iteration {
    /// A replay of graph `graph`; `set` pushes `iter = iteration` first;
    /// `wait` waits for the replay at once (else at the end).
    Replay {
        graph: usize,
        iteration: u64,
        set: bool,
        wait: bool,
    },
    Dynamic(Vec<Step>),
}

#[derive(Clone, Debug)]
struct Program {
    thread: usize,
    /// The boundary variables' initial values; the last ones receive the
    /// graphs' exports.
    boundary: Vec<u64>,
    graphs: Vec<GraphSpec>,
    iterations: Vec<Iteration>,
}

const SHARED: usize = 2;

/// The simulated GPU's compute lanes: a recorded op waits for reads on
/// the others of what it mutates, and is woken by each of their fences.
const LANES: usize = 3;

/// Appends `s` unless it is there already, but one time in eight.
fn add(v: &mut Vec<Slot>, s: Slot, rng: &mut Rng) {
    if !v.contains(&s) || rng.below(8) == 0 {
        v.push(s);
    }
}

/// Graph `g` of thread `thread`, over `own` boundary variables of the
/// program's, exporting its intermediates from boundary variable `export`.
fn generate_graph(
    rng: &mut Rng,
    thread: usize,
    g: usize,
    own: usize,
    export: usize,
    order: Order,
) -> GraphSpec {
    let inters = rng.below(4) as usize;
    let bufs: Vec<usize> = (0..rng.below(8))
        .map(|_| 1 + rng.below(63) as usize)
        .collect();
    // The buffers written so far, the last written last.
    let mut written: Vec<usize> = Vec::new();
    let mut ops = Vec::new();
    // An op on the GPU never fails here: the ops after it on its device go
    // once its body returned, before its failure is known (it comes
    // through its fence), so whether their bodies run (and write what
    // they mutate) is a race, for pushed ops as in a replay. Device
    // failures in replays are checked in tests/graph_streams.rs.
    let fail = |rng: &mut Rng, device: usize| match rng.below(16) {
        _ if device == 2 => Fail::Never,
        0 => Fail::Err(10 + rng.below(40)),
        1 => Fail::Panic(10 + rng.below(40)),
        2 => Fail::WriteThenErr(10 + rng.below(40)),
        _ => Fail::Never,
    };
    let slot = |rng: &mut Rng, write: bool, written: &[usize]| -> Slot {
        match rng.below(10) {
            3 if !write => Slot::S(rng.below(SHARED as u64) as usize),
            4..=5 if inters > 0 => Slot::I(rng.below(inters as u64) as usize),
            // Reads favour the buffer written last: chains, whose buffers'
            // lives end and whose memory can be shared.
            6..=7 if !write && !written.is_empty() => Slot::Buf(if rng.below(2) == 0 {
                written[written.len() - 1]
            } else {
                written[rng.below(written.len() as u64) as usize]
            }),
            6..=9 if write && !bufs.is_empty() => Slot::Buf(rng.below(bufs.len() as u64) as usize),
            _ => Slot::B(rng.below(own as u64) as usize),
        }
    };
    // Sometimes no op: an empty graph replays too.
    for i in 0..rng.below(15) {
        let mut mutates: Vec<Slot> = Vec::new();
        for _ in 0..rng.below(3) {
            let s = slot(rng, true, &written);
            add(&mut mutates, s, rng);
        }
        let mut fresh = Vec::new();
        for s in &mutates {
            if let Slot::Buf(b) = *s
                && !written.contains(&b)
                && !fresh.contains(&b)
            {
                fresh.push(b);
            }
        }
        let mut reads: Vec<Slot> = Vec::new();
        for _ in 0..rng.below(4) {
            let s = slot(rng, false, &written);
            if mutates.contains(&s) && rng.below(4) != 0 {
                continue;
            }
            add(&mut reads, s, rng);
        }
        for s in &mutates {
            if let Slot::Buf(b) = *s {
                written.retain(|&w| w != b);
                written.push(b);
            }
        }
        let device = pick_device(rng);
        ops.push(Op {
            name: format!("t{thread}g{g}o{i}"),
            id: rng.next(),
            graph: Some(g),
            reads,
            mutates,
            fresh,
            fail: fail(rng, device),
            device,
            lane: rng.below(LANES as u64) as u8,
            units: pick_units(rng),
            priority: if rng.below(5) == 0 {
                rng.below(5) as i32 - 2
            } else {
                0
            },
        });
    }
    // Issue 35's shape, one graph in three: reads of a variable on two
    // lanes, then a write of it on a third lane that reads a boundary
    // variable, which a pushed op may have poisoned: skipped, the write
    // waits for both reads' fences, and each wakes it.
    if rng.below(3) == 0 {
        let target = if inters > 0 && rng.below(2) == 0 {
            Slot::I(rng.below(inters as u64) as usize)
        } else {
            Slot::B(rng.below(own as u64) as usize)
        };
        let input = Slot::B(rng.below(own as u64) as usize);
        let lanes = [0u8, 1, 2].map(|l| (l + rng.below(LANES as u64) as u8) % LANES as u8);
        for (k, lane) in lanes.into_iter().enumerate() {
            let (reads, mutates) = if k < 2 {
                (vec![target], Vec::new())
            } else if input == target {
                (Vec::new(), vec![target])
            } else {
                (vec![input], vec![target])
            };
            ops.push(Op {
                name: format!("t{thread}g{g}m{k}"),
                id: rng.next(),
                graph: Some(g),
                reads,
                mutates,
                fresh: Vec::new(),
                fail: Fail::Never,
                device: 2,
                lane,
                units: 0,
                priority: 0,
            });
        }
    }
    for i in 0..inters {
        ops.push(Op {
            name: format!("t{thread}g{g}x{i}"),
            id: rng.next(),
            graph: Some(g),
            reads: vec![Slot::I(i)],
            mutates: vec![Slot::B(export + i)],
            fresh: Vec::new(),
            fail: Fail::Never,
            device: 0,
            lane: 0,
            units: 0,
            priority: 0,
        });
    }
    GraphSpec {
        order,
        inters,
        bufs,
        ops,
        drop_early: rng.below(3) == 0,
    }
}

/// An op's device: the default one, the second CPU device or the
/// simulated GPU, a third each.
fn pick_device(rng: &mut Rng) -> usize {
    match rng.below(6) {
        0 | 1 => 1,
        2 | 3 => 2,
        _ => 0,
    }
}

/// Units of the program's resource: mostly none.
fn pick_units(rng: &mut Rng) -> u64 {
    match rng.below(8) {
        0 | 1 => 1,
        2 => 2,
        _ => 0,
    }
}

fn generate(rng: &mut Rng, thread: usize, order: Order) -> Program {
    let own = 2 + rng.below(4) as usize;
    let mut graphs = Vec::new();
    let mut nb = own;
    for g in 0..1 + usize::from(rng.below(3) == 0) {
        let order = match (g, order) {
            (0, o) => o,
            (_, Order::Parallel) => Order::Sequential,
            _ => Order::Parallel,
        };
        let spec = generate_graph(rng, thread, g, own, nb, order);
        nb += spec.inters;
        graphs.push(spec);
    }
    let boundary: Vec<u64> = (0..nb).map(|_| rng.next()).collect();
    let k = 3 + rng.below(4);
    let mut iterations = Vec::new();
    let mut iteration = 0;
    for j in 0..k {
        let replays = iterations
            .iter()
            .filter(|i| matches!(i, Iteration::Replay { .. }))
            .count() as u64;
        // At least two replays.
        if rng.below(5) < 3 || k - j <= 2u64.saturating_sub(replays) {
            iteration += 1;
            iterations.push(Iteration::Replay {
                graph: rng.below(graphs.len() as u64) as usize,
                iteration,
                set: iteration == 1 || rng.below(4) != 0,
                wait: rng.below(3) == 0,
            });
            continue;
        }
        let steps = (0..1 + rng.below(3))
            .map(|s| {
                let v = rng.below(nb as u64) as usize;
                match rng.below(10) {
                    0..=2 => return Step::ClearPoison(v),
                    3 => return Step::Wait(v),
                    // Poisons a boundary variable: the recorded ops that
                    // read it are skipped in the next replays (on the GPU,
                    // perhaps while waiting for other lanes' fences).
                    4 => {
                        return Step::Op(Op {
                            name: format!("t{thread}d{j}_{s}p"),
                            id: rng.next(),
                            graph: None,
                            reads: Vec::new(),
                            mutates: vec![Slot::B(v)],
                            fresh: Vec::new(),
                            fail: Fail::Err(100),
                            device: 0,
                            lane: 0,
                            units: 0,
                            priority: 0,
                        });
                    }
                    _ => {}
                }
                let mut mutates = Vec::new();
                for _ in 0..1 + rng.below(2) {
                    let s = Slot::B(rng.below(nb as u64) as usize);
                    add(&mut mutates, s, rng);
                }
                let mut reads = Vec::new();
                for _ in 0..rng.below(3) {
                    let s = if rng.below(3) == 0 {
                        Slot::S(rng.below(SHARED as u64) as usize)
                    } else {
                        Slot::B(rng.below(nb as u64) as usize)
                    };
                    add(&mut reads, s, rng);
                }
                let device = pick_device(rng);
                Step::Op(Op {
                    name: format!("t{thread}d{j}_{s}"),
                    id: rng.next(),
                    graph: None,
                    reads,
                    mutates,
                    fresh: Vec::new(),
                    // Never on the GPU (see `generate_graph`).
                    fail: if rng.below(12) == 0 && device != 2 {
                        Fail::Err(100)
                    } else {
                        Fail::Never
                    },
                    device,
                    lane: rng.below(LANES as u64) as u8,
                    units: pick_units(rng),
                    priority: 0,
                })
            })
            .collect();
        iterations.push(Iteration::Dynamic(steps));
    }
    Program {
        thread,
        boundary,
        graphs,
        iterations,
    }
}

impl std::fmt::Display for Program {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let op = |op: &Op| {
            let mut s = format!("{}: reads {:?} mutates {:?}", op.name, op.reads, op.mutates);
            if !op.fresh.is_empty() {
                let _ = write!(s, " fresh {:?}", op.fresh);
            }
            if op.fail != Fail::Never {
                let _ = write!(s, " {:?}", op.fail);
            }
            match op.device {
                1 => s.push_str(" on d1"),
                2 => {
                    let _ = write!(s, " on gpu lane {}", op.lane);
                }
                _ => {}
            }
            if op.units != 0 {
                let _ = write!(s, " uses {}", op.units);
            }
            if op.priority != 0 {
                let _ = write!(s, " priority {}", op.priority);
            }
            s
        };
        writeln!(f, "thread {}: boundary {:?}", self.thread, self.boundary)?;
        for (g, spec) in self.graphs.iter().enumerate() {
            writeln!(
                f,
                "  graph {g} ({:?}{}): {} intermediates, buffers {:?}",
                spec.order,
                if spec.drop_early {
                    ", dropped early"
                } else {
                    ""
                },
                spec.inters,
                spec.bufs
            )?;
            for o in &spec.ops {
                writeln!(f, "    {}", op(o))?;
            }
        }
        for it in &self.iterations {
            match it {
                Iteration::Replay {
                    graph,
                    iteration,
                    set,
                    wait,
                } => writeln!(
                    f,
                    "  replay graph {graph}: iteration {iteration}{}{}",
                    if *set { ", set" } else { "" },
                    if *wait { ", waited" } else { "" }
                )?,
                Iteration::Dynamic(steps) => {
                    for s in steps {
                        match s {
                            Step::Op(o) => writeln!(f, "  push {}", op(o))?,
                            Step::ClearPoison(v) => writeln!(f, "  clear_poison B{v}")?,
                            Step::Wait(v) => writeln!(f, "  wait_for_var B{v}")?,
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

// ---- the bodies, the same for the graph and the reference ----

/// How an op reaches a buffer: a planned one in the graph, a
/// `Var<Vec<u64>>` in the reference.
trait Store: Send + Sync + 'static {
    type Buf: AnyVar + Clone + Send + Sync + 'static;
    fn read_buf<R>(ctx: &OpCtx, b: &Self::Buf, f: impl FnOnce(&[u64]) -> R) -> Result<R, Error>;
    fn write_buf<R>(
        ctx: &OpCtx,
        b: &Self::Buf,
        f: impl FnOnce(&mut [u64]) -> R,
    ) -> Result<R, Error>;
}

struct Planned;

impl Store for Planned {
    type Buf = Buffer<u64>;
    fn read_buf<R>(ctx: &OpCtx, b: &Self::Buf, f: impl FnOnce(&[u64]) -> R) -> Result<R, Error> {
        Ok(f(&ctx.read(b)?))
    }
    fn write_buf<R>(
        ctx: &OpCtx,
        b: &Self::Buf,
        f: impl FnOnce(&mut [u64]) -> R,
    ) -> Result<R, Error> {
        Ok(f(&mut ctx.write(b)?))
    }
}

struct Plain;

impl Store for Plain {
    type Buf = Var<Vec<u64>>;
    fn read_buf<R>(ctx: &OpCtx, b: &Self::Buf, f: impl FnOnce(&[u64]) -> R) -> Result<R, Error> {
        Ok(f(&ctx.read(b)?))
    }
    fn write_buf<R>(
        ctx: &OpCtx,
        b: &Self::Buf,
        f: impl FnOnce(&mut [u64]) -> R,
    ) -> Result<R, Error> {
        Ok(f(&mut ctx.write(b)?[..]))
    }
}

/// The variables an op may see on one engine: the program's boundary, and
/// its graph's intermediates and buffers (none for a pushed op).
struct Vars<B> {
    iter: Var<u64>,
    boundary: Vec<Var<u64>>,
    shared: Vec<Var<u64>>,
    inters: Vec<Var<u64>>,
    bufs: Vec<B>,
    /// The program's resource (capacity 2).
    slots: Resource,
}

impl<B: AnyVar> Vars<B> {
    /// The same boundary, with a graph's intermediates and buffers.
    fn with<C>(&self, inters: Vec<Var<u64>>, bufs: Vec<C>) -> Vars<C> {
        Vars {
            iter: self.iter.clone(),
            boundary: self.boundary.clone(),
            shared: self.shared.clone(),
            inters,
            bufs,
            slots: self.slots.clone(),
        }
    }

    fn decl(&self, s: Slot) -> &dyn AnyVar {
        match s {
            Slot::Buf(b) => &self.bufs[b],
            s => self.var(s),
        }
    }

    fn var(&self, s: Slot) -> &Var<u64> {
        match s {
            Slot::B(i) => &self.boundary[i],
            Slot::S(i) => &self.shared[i],
            Slot::I(i) => &self.inters[i],
            Slot::Buf(_) => unreachable!("a buffer"),
        }
    }
}

/// Stamps and checks the buffers' contents, and counts what it checked.
#[derive(Default)]
struct Checker {
    violations: Mutex<Vec<String>>,
    verified: AtomicU64,
}

/// A buffer's stamp for an iteration: its owner and the iteration, in 32
/// bits.
fn tag(owner: u64, iteration: u64) -> u64 {
    (owner << 16 | (iteration & 0xffff)) & 0xffff_ffff
}

/// Buffer `buf` of graph `graph` of thread `thread`, in 16 bits.
fn owner(thread: usize, graph: usize, buf: usize) -> u64 {
    ((thread as u64 + 1) << 8) | (graph as u64) << 4 | buf as u64
}

/// Fills `data` with `owner`'s stamp of `iteration` carrying `value`'s low
/// 32 bits.
fn stamp(data: &mut [u64], owner: u64, iteration: u64, value: u64) {
    let word = tag(owner, iteration) << 32 | (value & 0xffff_ffff);
    for (j, x) in data.iter_mut().enumerate() {
        *x = word ^ j as u64;
    }
}

impl Checker {
    /// The value `owner`'s stamp of `iteration` in `data` carries; a
    /// violation if any word of it is not that stamp.
    fn verify(
        &self,
        owner: u64,
        iteration: u64,
        data: &[u64],
        reader: &str,
    ) -> Result<u64, BoxError> {
        let want = tag(owner, iteration);
        let value = data[0] & 0xffff_ffff;
        for (j, &x) in data.iter().enumerate() {
            let x = x ^ j as u64;
            if x >> 32 != want || x & 0xffff_ffff != value {
                let msg = format!(
                    "{reader} reads buffer {owner:#x} of iteration {iteration}: word {j} holds \
                     the stamp of owner {:#x}, iteration {} (value {:#x}, first word's {value:#x})",
                    x >> 48,
                    (x >> 32) & 0xffff,
                    x & 0xffff_ffff
                );
                self.violations.lock().unwrap().push(msg.clone());
                return Err(msg.into());
            }
        }
        self.verified.fetch_add(1, SeqCst);
        Ok(value)
    }
}

/// The value an op writes to its `k`-th mutated variable.
fn compute(op: u64, k: usize, old: u64, inputs: u64) -> u64 {
    mix(old
        .wrapping_add(op.wrapping_mul(31))
        .wrapping_add(inputs.wrapping_mul(17))
        .wrapping_add(k as u64))
}

/// The body of every op, recorded or pushed: reads its inputs (checking
/// the buffers' stamps) and its boundary variables' versions, fails if it
/// is its iteration to, writes each output from all that and its old value
/// (stamping the buffers).
fn body<S: Store>(
    ctx: &OpCtx,
    op: &Op,
    vars: &Vars<S::Buf>,
    thread: usize,
    checker: &Checker,
) -> Result<(), BoxError> {
    let iteration = match op.graph {
        Some(_) => *ctx.read(&vars.iter)?,
        None => 0,
    };
    let who = |b| owner(thread, op.graph.unwrap_or(0), b);
    let mut inputs = 0u64;
    for &s in &op.reads {
        let v = match s {
            Slot::Buf(b) => S::read_buf(ctx, &vars.bufs[b], |data| {
                checker.verify(who(b), iteration, data, &op.name)
            })??,
            s => *ctx.read(vars.var(s))?,
        };
        inputs = inputs.wrapping_mul(0x100_0000_01B3).wrapping_add(v);
    }
    // The versions of its boundary variables, as the op sees them: those a
    // pushed op would see.
    for &s in op.reads.iter().chain(&op.mutates) {
        if let Slot::B(_) | Slot::S(_) = s {
            inputs = inputs.wrapping_mul(31).wrapping_add(vars.var(s).version());
        }
    }
    let fails = op.fails(iteration);
    match op.fail {
        Fail::Err(_) if fails => return Err("planned failure".into()),
        Fail::Panic(_) if fails => panic!("planned panic"),
        _ => {}
    }
    if op.device == 2 {
        // Device work (after which the writes below are the body's), long
        // enough that the ops after it on other lanes find its fence
        // pending.
        ctx.stream()?.enqueue(|| {
            std::hint::black_box((0..500u64).sum::<u64>());
            Ok(())
        })?;
    }
    for (k, &s) in op.mutates.iter().enumerate() {
        match s {
            Slot::Buf(b) => {
                let fresh = op.fresh.contains(&b);
                S::write_buf(ctx, &vars.bufs[b], |data| -> Result<(), BoxError> {
                    let old = if fresh {
                        0
                    } else {
                        checker.verify(who(b), iteration, data, &op.name)?
                    };
                    stamp(data, who(b), iteration, compute(op.id, k, old, inputs));
                    Ok(())
                })??;
            }
            s => {
                let mut w = ctx.write(vars.var(s))?;
                *w = compute(op.id, k, *w, inputs);
            }
        }
    }
    if fails {
        return Err("planned failure after writing".into());
    }
    Ok(())
}

// ---- running a program ----

/// How an op, a replay or a wait ended (a failure as its op's name and
/// message).
#[derive(Clone, Debug, PartialEq, Eq)]
enum Outcome {
    Ok,
    Failed(String),
    Poisoned(String),
}

fn outcome(r: Result<(), Error>) -> Outcome {
    let name = |f: &depflow::OpFailure| format!("{}: {}", f.op_name().unwrap_or("?"), f.message());
    match r {
        Ok(()) => Outcome::Ok,
        Err(Error::Failed(f)) => Outcome::Failed(name(&f)),
        Err(Error::Poisoned { cause: f, .. }) => Outcome::Poisoned(name(&f)),
        Err(e) => panic!("unexpected error: {e}"),
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum State {
    Live(u64),
    Poisoned(String),
}

enum Pending {
    Op(OpHandle<()>),
    Wait(Wait),
    Replay(Replay),
    Done(Outcome),
}

impl Pending {
    fn resolve(self) -> Outcome {
        match self {
            Pending::Op(h) => outcome(h.wait()),
            Pending::Wait(w) => outcome(w.wait()),
            // Through the future, not the blocking wait.
            Pending::Replay(r) => outcome(futures::executor::block_on(r)),
            Pending::Done(o) => o,
        }
    }
}

/// What a program did on one engine.
#[derive(Debug)]
struct Run {
    /// Per replay: its outcome (graph), or its ops' outcomes (reference).
    replays: Vec<Vec<Outcome>>,
    /// Per dynamic step, in order.
    steps: Vec<Outcome>,
    /// Per boundary variable, then `iter`: final state and version.
    finals: Vec<(State, u64)>,
    /// Per graph, its arena's size and its buffers' total.
    plans: Vec<(usize, usize)>,
}

fn final_state(engine: &Engine, var: &Var<u64>) -> (State, u64) {
    let v = var.clone();
    let read = engine.push(&[var], &[], move |ctx| Ok(*ctx.read(&v)?));
    let state = match read.unwrap().wait() {
        Ok(x) => State::Live(x),
        Err(Error::Poisoned { cause: f, .. }) => {
            State::Poisoned(format!("{}: {}", f.op_name().unwrap_or("?"), f.message()))
        }
        Err(e) => panic!("reading a final value: {e}"),
    };
    (state, var.version())
}

/// The op's declarations: recorded ops also read `iter`.
fn declarations<'a, B: AnyVar>(
    op: &Op,
    vars: &'a Vars<B>,
) -> (Vec<&'a dyn AnyVar>, Vec<&'a dyn AnyVar>) {
    let mut reads: Vec<&dyn AnyVar> = Vec::new();
    if op.graph.is_some() {
        reads.push(&vars.iter);
    }
    reads.extend(op.reads.iter().map(|&s| vars.decl(s)));
    let mutates = op.mutates.iter().map(|&s| vars.decl(s)).collect();
    (reads, mutates)
}

fn push_op<S: Store>(
    engine: &Engine,
    op: &Op,
    vars: &Arc<Vars<S::Buf>>,
    thread: usize,
    checker: &Arc<Checker>,
) -> Pending {
    let (reads, mutates) = declarations(op, vars);
    let mut b = engine
        .op()
        .name(op.name.clone())
        .priority(op.priority)
        .reads(&reads)
        .mutates(&mutates);
    match op.device {
        1 => b = b.on(engine.device("d1").unwrap()),
        2 => {
            b = b
                .on(engine.device("gpu").unwrap())
                .lane(Lane::Compute(op.lane))
        }
        _ => {}
    }
    b = b.uses(&vars.slots, op.units);
    let (o, v, c) = (op.clone(), vars.clone(), checker.clone());
    Pending::Op(
        b.run(move |ctx| body::<S>(ctx, &o, &v, thread, &c))
            .unwrap(),
    )
}

fn set_iter(engine: &Engine, iter: &Var<u64>, value: u64) {
    let k = iter.key();
    engine
        .push(&[], &[iter], move |ctx| {
            *ctx.write(k)? = value;
            Ok(())
        })
        .unwrap();
}

fn run_steps<S: Store>(
    engine: &Engine,
    steps: &[Step],
    vars: &Arc<Vars<S::Buf>>,
    thread: usize,
    checker: &Arc<Checker>,
    out: &mut Vec<Pending>,
) {
    for step in steps {
        out.push(match step {
            Step::Op(op) => push_op::<S>(engine, op, vars, thread, checker),
            Step::ClearPoison(v) => Pending::Op(engine.clear_poison(&vars.boundary[*v]).unwrap()),
            Step::Wait(v) => Pending::Wait(engine.wait_for_var(&vars.boundary[*v])),
        });
    }
}

fn finish<B>(
    engine: &Engine,
    vars: &Vars<B>,
    replays: Vec<Vec<Pending>>,
    steps: Vec<Pending>,
    plans: Vec<(usize, usize)>,
) -> Run {
    let replays = replays
        .into_iter()
        .map(|r| r.into_iter().map(Pending::resolve).collect())
        .collect();
    let steps = steps.into_iter().map(Pending::resolve).collect();
    let finals = vars
        .boundary
        .iter()
        .chain([&vars.iter])
        .map(|v| final_state(engine, v))
        .collect();
    Run {
        replays,
        steps,
        finals,
        plans,
    }
}

/// Runs `p` on `engine`: its graphs recorded and replayed, its steps
/// pushed.
fn run_graph(engine: &Engine, p: &Program, shared: &[Var<u64>], checker: &Arc<Checker>) -> Run {
    let iter = engine.var(0u64);
    let boundary: Vec<Var<u64>> = p.boundary.iter().map(|&x| engine.var(x)).collect();
    let (d1, gpu) = (engine.device("d1").unwrap(), engine.device("gpu").unwrap());
    // For the pushed ops: no intermediates, no buffers.
    let vars: Arc<Vars<Buffer<u64>>> = Arc::new(Vars {
        iter: iter.clone(),
        boundary,
        shared: shared.to_vec(),
        inters: Vec::new(),
        bufs: Vec::new(),
        slots: engine.new_resource("slots", 2),
    });
    let mut graphs = Vec::new();
    for spec in &p.graphs {
        let graph = engine
            .record(|rec| {
                rec.order(spec.order).name(&format!("t{}", p.thread));
                let inters = (0..spec.inters).map(|_| rec.var(0u64)).collect();
                let bufs = spec.bufs.iter().map(|&n| rec.buffer::<u64>(n)).collect();
                let local = Arc::new(vars.with(inters, bufs));
                for op in &spec.ops {
                    let (reads, mutates) = declarations(op, &local);
                    let mut b = rec
                        .op()
                        .name(op.name.clone())
                        .priority(op.priority)
                        .reads(&reads)
                        .mutates(&mutates);
                    match op.device {
                        1 => b = b.on(d1),
                        2 => b = b.on(gpu).lane(Lane::Compute(op.lane)),
                        _ => {}
                    }
                    b = b.uses(&local.slots, op.units);
                    let (o, v, c, t) = (op.clone(), local.clone(), checker.clone(), p.thread);
                    b.run(move |ctx| body::<Planned>(ctx, &o, &v, t, &c))?;
                }
                Ok::<(), depflow::Error>(())
            })
            .unwrap_or_else(|e| panic!("recording failed: {e}"));
        assert_eq!(graph.ops().len(), spec.ops.len());
        graphs.push(Some(graph));
    }
    let plans = graphs
        .iter()
        .flatten()
        .map(|g| (g.plan().arena_bytes, g.plan().total_bytes))
        .collect();
    let (mut replays, mut steps) = (Vec::new(), Vec::new());
    for it in &p.iterations {
        match it {
            Iteration::Replay {
                graph,
                iteration,
                set,
                wait,
            } => {
                if *set {
                    set_iter(engine, &iter, *iteration);
                }
                let r = graphs[*graph].as_ref().unwrap().replay();
                replays.push(vec![if *wait {
                    Pending::Done(outcome(r.wait()))
                } else {
                    Pending::Replay(r)
                }]);
            }
            Iteration::Dynamic(s) => {
                run_steps::<Planned>(engine, s, &vars, p.thread, checker, &mut steps)
            }
        }
    }
    for (graph, spec) in graphs.iter_mut().zip(&p.graphs) {
        if spec.drop_early {
            *graph = None;
        }
    }
    finish(engine, &vars, replays, steps, plans)
}

/// Runs `p` on `engine` all pushed: a replay becomes its graph's ops,
/// after clearing the poison of the graph's intermediates.
fn run_reference(engine: &Engine, p: &Program, shared: &[Var<u64>], checker: &Arc<Checker>) -> Run {
    let vars: Arc<Vars<Var<Vec<u64>>>> = Arc::new(Vars {
        iter: engine.var(0u64),
        boundary: p.boundary.iter().map(|&x| engine.var(x)).collect(),
        shared: shared.to_vec(),
        inters: Vec::new(),
        bufs: Vec::new(),
        slots: engine.new_resource("slots", 2),
    });
    let graphs: Vec<Arc<Vars<Var<Vec<u64>>>>> = p
        .graphs
        .iter()
        .map(|spec| {
            let inters = (0..spec.inters).map(|_| engine.var(0u64)).collect();
            let bufs = spec
                .bufs
                .iter()
                .map(|&n| engine.var(vec![0u64; n]))
                .collect();
            Arc::new(vars.with(inters, bufs))
        })
        .collect();
    let (mut replays, mut steps) = (Vec::new(), Vec::new());
    for it in &p.iterations {
        match it {
            Iteration::Replay {
                graph,
                iteration,
                set,
                ..
            } => {
                if *set {
                    set_iter(engine, &vars.iter, *iteration);
                }
                let local = &graphs[*graph];
                for t in &local.inters {
                    engine.clear_poison(t).unwrap();
                }
                for b in &local.bufs {
                    engine.clear_poison(b).unwrap();
                }
                let ops = p.graphs[*graph]
                    .ops
                    .iter()
                    .map(|op| push_op::<Plain>(engine, op, local, p.thread, checker))
                    .collect();
                replays.push(ops);
            }
            Iteration::Dynamic(s) => {
                run_steps::<Plain>(engine, s, &vars, p.thread, checker, &mut steps)
            }
        }
    }
    finish(engine, &vars, replays, steps, Vec::new())
}

// ---- comparing ----

fn failures(engine: &Engine) -> usize {
    match engine.wait_all().wait() {
        Ok(()) => 0,
        Err(Error::Failures { count, .. }) => count,
        Err(e) => panic!("wait_all: {e}"),
    }
}

/// What the whole test saw, to show it tested something.
#[derive(Default)]
struct Coverage {
    programs: AtomicU64,
    replays_ok: AtomicU64,
    replays_err: AtomicU64,
    shared_plans: AtomicU64,
    failures: AtomicU64,
    verified: AtomicU64,
}

fn compare(p: &Program, got: &Run, want: &Run, cov: &Coverage) {
    let t = p.thread;
    assert_eq!(
        got.steps, want.steps,
        "thread {t}: the dynamic pushes' outcomes"
    );
    assert_eq!(got.replays.len(), want.replays.len());
    for (i, (g, w)) in got.replays.iter().zip(&want.replays).enumerate() {
        let g = &g[0];
        let ok = w.iter().all(|o| *o == Outcome::Ok);
        match g {
            Outcome::Ok => {
                assert!(
                    ok,
                    "thread {t}: replay {i} succeeded; pushed, its ops gave {w:?}"
                );
                cov.replays_ok.fetch_add(1, SeqCst);
            }
            bad => {
                assert!(
                    w.contains(bad),
                    "thread {t}: replay {i} gave {bad:?}; pushed, its ops gave {w:?}"
                );
                cov.replays_err.fetch_add(1, SeqCst);
            }
        }
    }
    let names: Vec<String> = (0..p.boundary.len())
        .map(|i| format!("B{i}"))
        .chain(["iter".to_string()])
        .collect();
    for ((name, g), w) in names.iter().zip(&got.finals).zip(&want.finals) {
        assert_eq!(g, w, "thread {t}: final state and version of {name}");
    }
    for &(arena, total) in &got.plans {
        if arena < total {
            cov.shared_plans.fetch_add(1, SeqCst);
        }
    }
}

/// The engines under test: every executor, each with a second CPU device.
fn engines() -> Vec<(&'static str, Engine)> {
    let build = |default: Executor, d1: Executor| {
        Engine::builder()
            .executor(default)
            .device("d1", d1)
            .device("gpu", Executor::simulated_gpu(LANES))
            .build()
            .unwrap()
    };
    vec![
        ("pool1", build(Executor::pool(1), Executor::pool(1))),
        ("pool2", build(Executor::pool(2), Executor::inline())),
        ("inline", build(Executor::inline(), Executor::inline())),
        (
            "custom",
            build(
                // Spawn per job on the default device, a thread pool on d1.
                Executor::custom(|job| {
                    std::thread::spawn(move || {
                        job.run();
                    });
                }),
                custom_pool(2),
            ),
        ),
        (
            "custom-now",
            // Jobs run at once, on the thread that made them ready.
            build(
                Executor::custom(|job| {
                    job.run();
                }),
                Executor::custom(|job| {
                    job.run();
                }),
            ),
        ),
        #[cfg(feature = "tokio")]
        ("tokio", {
            // Kept for the test's life: the engine's ops run on it.
            let rt = Box::leak(Box::new(
                tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .build()
                    .unwrap(),
            ));
            build(Executor::tokio(rt.handle().clone()), Executor::pool(1))
        }),
    ]
}

fn reference() -> Engine {
    Engine::builder()
        .threads(2)
        .device("d1", Executor::pool(1))
        .device("gpu", Executor::simulated_gpu(LANES))
        .build()
        .unwrap()
}

/// One seed on one engine: 1 to 3 threads, each with its program, on the
/// engine under test (recorded) and the reference (pushed).
fn check(engine: &Engine, reference: &Engine, seed: u64, order: Order, cov: &Coverage) {
    let mut rng = Rng(seed);
    let threads = if seed % 3 == 2 {
        2 + rng.below(2) as usize
    } else {
        1
    };
    let other = match order {
        Order::Parallel => Order::Sequential,
        _ => Order::Parallel,
    };
    let programs: Vec<Program> = (0..threads)
        .map(|t| generate(&mut rng, t, if t % 2 == 0 { order } else { other }))
        .collect();
    let shared_values: Vec<u64> = (0..SHARED).map(|_| rng.next()).collect();
    let describe = || programs.iter().map(|p| p.to_string()).collect::<String>();
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let (gc, rc) = (Arc::new(Checker::default()), Arc::new(Checker::default()));
        let runs = |engine: &Engine, graph: bool, checker: &Arc<Checker>| -> Vec<Run> {
            let shared: Vec<Var<u64>> = shared_values.iter().map(|&x| engine.var(x)).collect();
            std::thread::scope(|s| {
                let handles: Vec<_> = programs
                    .iter()
                    .map(|p| {
                        let shared = &shared;
                        s.spawn(move || match graph {
                            true => run_graph(engine, p, shared, checker),
                            false => run_reference(engine, p, shared, checker),
                        })
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect()
            })
        };
        let got = runs(engine, true, &gc);
        let want = runs(reference, false, &rc);
        let (got_failures, want_failures) = (failures(engine), failures(reference));
        let violations = gc.violations.lock().unwrap().clone();
        assert!(
            violations.is_empty(),
            "live buffers shared memory:\n{}",
            violations.join("\n")
        );
        let violations = rc.violations.lock().unwrap().clone();
        assert!(violations.is_empty(), "the reference: {violations:?}");
        for (p, (g, w)) in programs.iter().zip(got.iter().zip(&want)) {
            compare(p, g, w, cov);
        }
        assert_eq!(
            gc.verified.load(SeqCst),
            rc.verified.load(SeqCst),
            "buffer reads checked"
        );
        assert_eq!(got_failures, want_failures, "failures wait_all reports");
        cov.failures.fetch_add(got_failures as u64, SeqCst);
        cov.programs.fetch_add(programs.len() as u64, SeqCst);
        cov.verified.fetch_add(gc.verified.load(SeqCst), SeqCst);
    }));
    if let Err(e) = result {
        eprintln!(
            "seed {seed} ({order:?}) failed; DEPFLOW_GRAPH_SEED={seed} reruns it. The programs:\n{}",
            describe()
        );
        std::panic::resume_unwind(e);
    }
}

/// Keeps the planned panics off stderr.
fn quiet_planned_panics() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if info.payload().downcast_ref::<&str>() != Some(&"planned panic") {
                default(info);
            }
        }));
    });
}

fn seeds() -> Vec<u64> {
    let env = |name| std::env::var(name).ok().and_then(|s| s.parse::<u64>().ok());
    match (env("DEPFLOW_GRAPH_SEED"), env("DEPFLOW_GRAPH_SEEDS")) {
        (Some(seed), _) => vec![seed],
        (None, n) => (0..n.unwrap_or(200)).collect(),
    }
}

#[test]
fn replays_match_the_same_ops_pushed() {
    quiet_planned_panics();
    let seeds = seeds();
    let cov = Arc::new(Coverage::default());
    let reference = reference();
    let engines = engines();
    let executors = engines.len();
    for (i, (name, engine)) in engines.into_iter().enumerate() {
        let (seeds, cov, reference) = (seeds.clone(), cov.clone(), reference.clone());
        // A generous bound (a seed takes some 20 ms in debug): a hang fails.
        let secs = 120 + seeds.len() as u64 / 10;
        within(secs, move || {
            for seed in seeds {
                // Both orders on every executor, alternating by seed.
                let order = if (seed + i as u64) % 2 == 0 {
                    Order::Parallel
                } else {
                    Order::Sequential
                };
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    check(&engine, &reference, seed, order, &cov)
                }));
                if let Err(e) = r {
                    eprintln!("executor {name}, seed {seed}");
                    std::panic::resume_unwind(e);
                }
            }
        });
    }
    let c = |a: &AtomicU64| a.load(SeqCst);
    eprintln!(
        "{} seeds x {} executors ({} programs passed): {} replays ok, {} failed, {} failures, {} shared plans, {} buffer reads checked",
        seeds.len(),
        executors,
        c(&cov.programs),
        c(&cov.replays_ok),
        c(&cov.replays_err),
        c(&cov.failures),
        c(&cov.shared_plans),
        c(&cov.verified)
    );
    // The run exercised what it compares (with the default seeds).
    if seeds.len() >= 200 {
        assert!(c(&cov.replays_ok) > 0 && c(&cov.replays_err) > 0);
        assert!(c(&cov.failures) > 0);
        assert!(c(&cov.shared_plans) > 0, "no plan shared memory");
        assert!(c(&cov.verified) > 0, "no buffer read was checked");
    }
}
