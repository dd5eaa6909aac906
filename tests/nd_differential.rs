//! Differential test of the array layer (`depflow::nd`, issue 30): random
//! array programs, each evaluated
//!
//! - eagerly on every executor (inline, a pool of 1, a pool of 2, an
//!   engine whose three devices are pools of 2, 1 and 2, a custom
//!   executor of the test's own, and with the `tokio` feature a tokio
//!   runtime's),
//! - recorded with `nd::record` and replayed (inputs made outside the
//!   recording, every result written with `assign` into an array made
//!   outside), on all of those engines but the single pools, and
//! - serially with plain ndarray calls: the calls the kernels of
//!   `src/nd/` make, in the same sequences (`sum_axis`, `fold_axis` for
//!   the max, the softmaxes' four steps, `general_mat_mul` with β = 0),
//!
//! and every value compared bit for bit (`f32::to_bits`). No tolerance is
//! needed anywhere: each reduction is the same ndarray call on an array of
//! the same shape and (standard) layout, so it adds in the same order; and
//! an elementwise result does not depend on the order of the elements.
//!
//! A program starts from 2 or 3 input arrays (ranks 0..=3, lengths 1..=3)
//! on any of three CPU devices, and makes ~12 operations: binary ones with
//! broadcasting (methods and operators), with a scalar on either side,
//! unary ones, in-place ones (`+=`, `assign`, `fill`, ...) on arrays the
//! program made (a view made by `reshape` sees them), `matmul` (2-D and
//! batched), `t`, `permute`, `reshape`, `slice_axis`, `concat`, the
//! reductions and softmaxes, `to` and `copy_to` across devices. About one
//! program in three also has a misfit made through an operator (`&a + &b`
//! whose shapes do not broadcast: a failed array; `t += &b` with `b` that
//! broadcasts but not to `t`'s shape: a poisoned target): every value
//! depending on it must resolve to `Error::Poisoned` whose failure is that
//! op's, and every other value must still be right.
//!
//! Seeds: 0..N with N = `DEPFLOW_ND_SEEDS` (default 300);
//! `DEPFLOW_ND_SEED=s` runs seed `s` only. A mismatch prints the seed and
//! the program.

mod common;

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::ops::Range;

use common::{Rng, within};
use depflow::{Device, Engine, Error, Executor, nd};
use ndarray::linalg::general_mat_mul;
use ndarray::{
    ArrayD, ArrayView2, ArrayView3, ArrayViewMut2, ArrayViewMut3, Axis, IxDyn, Slice, Zip,
};

/// The three devices' names: index 0 is the default device.
const DEVICES: [&str; 2] = ["d1", "d2"];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Bin {
    Add,
    Sub,
    Mul,
    Div,
    Maximum,
    Minimum,
    Pow,
    Eq,
    Gt,
    Ge,
    Lt,
    Le,
}

const BINS: [Bin; 12] = [
    Bin::Add,
    Bin::Sub,
    Bin::Mul,
    Bin::Div,
    Bin::Maximum,
    Bin::Minimum,
    Bin::Pow,
    Bin::Eq,
    Bin::Gt,
    Bin::Ge,
    Bin::Lt,
    Bin::Le,
];

impl Bin {
    /// The kernel's function (src/nd/elementwise.rs).
    fn f(self, x: f32, y: f32) -> f32 {
        let truth = |b: bool| if b { 1.0 } else { 0.0 };
        match self {
            Bin::Add => x + y,
            Bin::Sub => x - y,
            Bin::Mul => x * y,
            Bin::Div => x / y,
            Bin::Maximum => x.max(y),
            Bin::Minimum => x.min(y),
            Bin::Pow => x.powf(y),
            Bin::Eq => truth(x == y),
            Bin::Gt => truth(x > y),
            Bin::Ge => truth(x >= y),
            Bin::Lt => truth(x < y),
            Bin::Le => truth(x <= y),
        }
    }

    /// The four with operators, in-place forms and left scalars.
    fn arithmetic(self) -> bool {
        matches!(self, Bin::Add | Bin::Sub | Bin::Mul | Bin::Div)
    }

    fn name(self) -> &'static str {
        match self {
            Bin::Add => "add",
            Bin::Sub => "sub",
            Bin::Mul => "mul",
            Bin::Div => "div",
            Bin::Maximum => "maximum",
            Bin::Minimum => "minimum",
            Bin::Pow => "pow",
            Bin::Eq => "eq",
            Bin::Gt => "gt",
            Bin::Ge => "ge",
            Bin::Lt => "lt",
            Bin::Le => "le",
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Un {
    Neg,
    Exp,
    Log,
    Relu,
    Sigmoid,
    Tanh,
    Sqrt,
    Abs,
    Square,
}

const UNS: [Un; 9] = [
    Un::Neg,
    Un::Exp,
    Un::Log,
    Un::Relu,
    Un::Sigmoid,
    Un::Tanh,
    Un::Sqrt,
    Un::Abs,
    Un::Square,
];

impl Un {
    fn f(self, x: f32) -> f32 {
        match self {
            Un::Neg => -x,
            Un::Exp => x.exp(),
            Un::Log => x.ln(),
            Un::Relu => {
                if x > 0.0 {
                    x
                } else {
                    0.0
                }
            }
            Un::Sigmoid => 1.0 / (1.0 + (-x).exp()),
            Un::Tanh => x.tanh(),
            Un::Sqrt => x.sqrt(),
            Un::Abs => x.abs(),
            Un::Square => x * x,
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Red {
    SumAxis(usize),
    MeanAxis(usize),
    MaxAxis(usize),
    Argmax(usize),
    Sum,
    Mean,
    Max,
    Softmax(usize),
    LogSoftmax(usize),
}

#[derive(Clone, Debug)]
enum Op {
    /// An array made outside (and before) the program, from `values`.
    Input {
        shape: Vec<usize>,
        device: usize,
        values: Vec<f32>,
    },
    Binary {
        kind: Bin,
        a: usize,
        b: usize,
        operator: bool,
    },
    Scalar {
        kind: Bin,
        a: usize,
        s: f32,
        left: bool,
        operator: bool,
    },
    Unary {
        kind: Un,
        a: usize,
        operator: bool,
    },
    /// `target op= b` (`kind: None`: `assign`).
    Assign {
        kind: Option<Bin>,
        target: usize,
        b: usize,
        operator: bool,
    },
    ScalarAssign {
        kind: Bin,
        target: usize,
        s: f32,
        operator: bool,
    },
    Fill {
        target: usize,
        v: f32,
    },
    Matmul {
        a: usize,
        b: usize,
    },
    Transpose {
        a: usize,
    },
    Permute {
        a: usize,
        axes: Vec<usize>,
    },
    Reshape {
        a: usize,
        shape: Vec<usize>,
    },
    SliceAxis {
        a: usize,
        axis: usize,
        range: Range<usize>,
    },
    Concat {
        parts: Vec<usize>,
        axis: usize,
    },
    Reduce {
        kind: Red,
        a: usize,
    },
    To {
        a: usize,
        device: usize,
    },
    CopyTo {
        a: usize,
        dest: usize,
    },
    /// `&a op &b` whose shapes do not broadcast: a failed array.
    Misfit {
        kind: Bin,
        a: usize,
        b: usize,
    },
    /// `target op= &b`, `b` broadcasting but not to `target`'s shape: the
    /// target poisoned.
    MisfitAssign {
        kind: Bin,
        target: usize,
        b: usize,
    },
}

impl Op {
    /// Whether it makes a new slot (an array), rather than changing one.
    fn makes_slot(&self) -> bool {
        !matches!(
            self,
            Op::Assign { .. }
                | Op::ScalarAssign { .. }
                | Op::Fill { .. }
                | Op::CopyTo { .. }
                | Op::MisfitAssign { .. }
        )
    }
}

#[derive(Clone, Debug)]
struct Program {
    ops: Vec<Op>,
    /// Per slot: its shape and device, and whether it shares the values
    /// of an input (recorded programs must not change those: a replay
    /// would see the last one's changes).
    slots: Vec<(Vec<usize>, usize, bool)>,
    /// Whether some op fails.
    fails: bool,
}

impl Program {
    fn listing(&self) -> String {
        let mut s = String::new();
        let mut slot = 0;
        for op in &self.ops {
            if op.makes_slot() {
                let _ = writeln!(s, "  s{slot} = {op:?}");
                slot += 1;
            } else {
                let _ = writeln!(s, "  {op:?}");
            }
        }
        s
    }
}

// ---------------------------------------------------------------- generator

fn broadcast(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let n = a.len().max(b.len());
    let at = |s: &[usize], i: usize| {
        let missing = n - s.len();
        if i < missing { 1 } else { s[i - missing] }
    };
    (0..n)
        .map(|i| match (at(a, i), at(b, i)) {
            (x, y) if x == y || y == 1 => Some(x),
            (1, y) => Some(y),
            _ => None,
        })
        .collect()
}

fn broadcasts_to(from: &[usize], to: &[usize]) -> bool {
    broadcast(to, from).as_deref() == Some(to)
}

struct Gen {
    rng: Rng,
    p: Program,
    /// Per slot: the storage it views (reshape shares it).
    storage: Vec<usize>,
    storages: usize,
}

impl Gen {
    fn below(&mut self, n: usize) -> usize {
        self.rng.below(n as u64) as usize
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.rng.below(100) < percent
    }

    /// Small values, exact in f32, with zeros and negatives (so `log`,
    /// `sqrt`, `pow` and `/` make NaNs and infinities too).
    fn value(&mut self) -> f32 {
        (self.rng.below(33) as f32 - 16.0) / 8.0
    }

    fn shape(&mut self) -> Vec<usize> {
        let rank = self.below(4);
        (0..rank).map(|_| 1 + self.below(3)).collect()
    }

    fn push(&mut self, op: Op, shape: Vec<usize>, device: usize, storage: Option<usize>) -> usize {
        let (storage, of_input) = match storage {
            Some(s) => (
                s,
                self.p.slots[self.storage.iter().position(|&x| x == s).unwrap()].2,
            ),
            None => {
                self.storages += 1;
                (self.storages - 1, matches!(op, Op::Input { .. }))
            }
        };
        self.p.ops.push(op);
        self.p.slots.push((shape, device, of_input));
        self.storage.push(storage);
        self.p.slots.len() - 1
    }

    fn input(&mut self, shape: Vec<usize>, device: usize) -> usize {
        let n = shape.iter().product();
        let values = (0..n).map(|_| self.value()).collect();
        self.push(
            Op::Input {
                shape: shape.clone(),
                device,
                values,
            },
            shape,
            device,
            None,
        )
    }

    fn shape_of(&self, s: usize) -> Vec<usize> {
        self.p.slots[s].0.clone()
    }

    fn device_of(&self, s: usize) -> usize {
        self.p.slots[s].1
    }

    /// A slot on `device` whose shape passes `fits`, or a new input of
    /// `make()`'s shape.
    fn operand(
        &mut self,
        device: usize,
        fits: impl Fn(&[usize]) -> bool,
        make: impl FnOnce(&mut Self) -> Vec<usize>,
    ) -> usize {
        let found: Vec<usize> = (0..self.p.slots.len())
            .filter(|&s| self.p.slots[s].1 == device && fits(&self.p.slots[s].0))
            .collect();
        if !found.is_empty() && self.chance(50) {
            return found[self.below(found.len())];
        }
        let shape = make(self);
        self.input(shape, device)
    }

    /// A shape that broadcasts with `shape`: some leading axes dropped,
    /// some lengths made 1, sometimes a leading axis added.
    fn broadcastable(&mut self, shape: &[usize], grow: bool) -> Vec<usize> {
        let drop = self.below(shape.len() + 1);
        let mut out: Vec<usize> = shape[drop..]
            .iter()
            .map(|&n| if self.chance(30) { 1 } else { n })
            .collect();
        if grow && drop == 0 && out.len() < 3 && self.chance(25) {
            out.insert(0, 2);
        }
        out
    }

    /// A slot made by the program itself (not a view of an input): a
    /// target for in-place operations.
    fn own_slot(&mut self) -> Option<usize> {
        let own: Vec<usize> = (0..self.p.slots.len())
            .filter(|&s| !self.p.slots[s].2)
            .collect();
        (!own.is_empty()).then(|| own[self.below(own.len())])
    }

    fn random_shape_of(&mut self, n: usize) -> Vec<usize> {
        let rank = if n == 1 {
            self.below(4)
        } else {
            1 + self.below(3)
        };
        let mut left = n;
        let mut shape = Vec::new();
        for _ in 1..rank {
            let divisors: Vec<usize> = (1..=left).filter(|d| left % d == 0).collect();
            let d = divisors[self.below(divisors.len())];
            shape.push(d);
            left /= d;
        }
        if rank > 0 {
            shape.push(left);
        }
        shape
    }

    fn op(&mut self, with_failure: bool) {
        let a = self.below(self.p.slots.len());
        let (sa, da) = (self.shape_of(a), self.device_of(a));
        match self.below(if with_failure { 17 } else { 15 }) {
            0 | 1 => {
                let kind = BINS[self.below(BINS.len())];
                let grow = true;
                let b = self.operand(
                    da,
                    |s| broadcast(&sa, s).is_some(),
                    |g| g.broadcastable(&sa, grow),
                );
                let (a, b) = if self.chance(50) { (a, b) } else { (b, a) };
                let shape = broadcast(&self.shape_of(a), &self.shape_of(b))
                    .unwrap_or_else(|| panic!("{:?} {:?}", self.shape_of(a), self.shape_of(b)));
                let operator = kind.arithmetic() && self.chance(50);
                self.push(
                    Op::Binary {
                        kind,
                        a,
                        b,
                        operator,
                    },
                    shape,
                    da,
                    None,
                );
            }
            2 => {
                let kind = BINS[self.below(BINS.len())];
                let left = kind.arithmetic() && self.chance(50);
                let operator = kind.arithmetic() && self.chance(50);
                let s = self.value();
                self.push(
                    Op::Scalar {
                        kind,
                        a,
                        s,
                        left,
                        operator,
                    },
                    sa,
                    da,
                    None,
                );
            }
            3 => {
                let kind = UNS[self.below(UNS.len())];
                let operator = matches!(kind, Un::Neg) && self.chance(50);
                self.push(Op::Unary { kind, a, operator }, sa, da, None);
            }
            4 => {
                let Some(target) = self.own_slot() else {
                    return;
                };
                let (st, dt) = (self.shape_of(target), self.device_of(target));
                let b = self.operand(
                    dt,
                    |s| broadcasts_to(s, &st),
                    |g| g.broadcastable(&st, false),
                );
                let kind = match self.below(5) {
                    0 => None,
                    k => Some(BINS[k - 1]),
                };
                let operator = kind.is_some() && self.chance(50);
                self.p.ops.push(Op::Assign {
                    kind,
                    target,
                    b,
                    operator,
                });
            }
            5 => {
                let Some(target) = self.own_slot() else {
                    return;
                };
                let v = self.value();
                if self.chance(30) {
                    self.p.ops.push(Op::Fill { target, v });
                } else {
                    let kind = BINS[self.below(4)];
                    let operator = self.chance(50);
                    self.p.ops.push(Op::ScalarAssign {
                        kind,
                        target,
                        s: v,
                        operator,
                    });
                }
            }
            6 => {
                let (a, sa) = if sa.len() == 2 || sa.len() == 3 {
                    (a, sa)
                } else {
                    let mut s = vec![1 + self.below(3), 1 + self.below(3)];
                    if self.chance(40) {
                        s.insert(0, 1 + self.below(3));
                    }
                    (self.input(s.clone(), da), s)
                };
                let n = 1 + self.below(3);
                let r = sa.len();
                let mut want = sa.clone();
                want[r - 2] = sa[r - 1];
                want[r - 1] = n;
                let fits = {
                    let sa = sa.clone();
                    move |s: &[usize]| {
                        s.len() == r && s[..r - 2] == sa[..r - 2] && s[r - 2] == sa[r - 1]
                    }
                };
                let b = self.operand(da, fits, |_| want);
                let sb = self.shape_of(b);
                let mut out = sa.clone();
                out[r - 1] = sb[r - 1];
                self.push(Op::Matmul { a, b }, out, da, None);
            }
            7 => {
                if self.chance(50) {
                    let shape = sa.iter().rev().copied().collect();
                    self.push(Op::Transpose { a }, shape, da, None);
                } else {
                    let mut axes: Vec<usize> = (0..sa.len()).collect();
                    for i in (1..axes.len()).rev() {
                        let j = self.below(i + 1);
                        axes.swap(i, j);
                    }
                    let shape = axes.iter().map(|&k| sa[k]).collect();
                    self.push(Op::Permute { a, axes }, shape, da, None);
                }
            }
            8 => {
                let shape = self.random_shape_of(sa.iter().product());
                let storage = self.storage[a];
                self.push(
                    Op::Reshape {
                        a,
                        shape: shape.clone(),
                    },
                    shape,
                    da,
                    Some(storage),
                );
            }
            9 if !sa.is_empty() => {
                let axis = self.below(sa.len());
                let start = self.below(sa[axis]);
                let end = start + 1 + self.below(sa[axis] - start);
                let mut shape = sa.clone();
                shape[axis] = end - start;
                self.push(
                    Op::SliceAxis {
                        a,
                        axis,
                        range: start..end,
                    },
                    shape,
                    da,
                    None,
                );
            }
            10 if !sa.is_empty() => {
                let axis = self.below(sa.len());
                let mut parts = vec![a];
                for _ in 0..1 + self.below(2) {
                    let p = if self.chance(30) {
                        a
                    } else {
                        let mut s = sa.clone();
                        s[axis] = 1 + self.below(3);
                        let sa = sa.clone();
                        self.operand(
                            da,
                            move |x| {
                                x.len() == sa.len()
                                    && (0..sa.len()).all(|i| i == axis || x[i] == sa[i])
                            },
                            |_| s,
                        )
                    };
                    parts.push(p);
                }
                let i = self.below(parts.len());
                parts.swap(0, i);
                let mut shape = sa.clone();
                shape[axis] = parts.iter().map(|&p| self.p.slots[p].0[axis]).sum();
                self.push(Op::Concat { parts, axis }, shape, da, None);
            }
            11 | 12 => {
                let along = if sa.is_empty() {
                    0
                } else {
                    self.below(sa.len())
                };
                let kind = match (sa.is_empty(), self.below(9)) {
                    (true, k) | (false, k @ 0..=2) => [Red::Sum, Red::Mean, Red::Max][k % 3],
                    (false, 3) => Red::SumAxis(along),
                    (false, 4) => Red::MeanAxis(along),
                    (false, 5) => Red::MaxAxis(along),
                    (false, 6) => Red::Argmax(along),
                    (false, 7) => Red::Softmax(along),
                    (false, _) => Red::LogSoftmax(along),
                };
                let shape = match kind {
                    Red::Sum | Red::Mean | Red::Max => vec![],
                    Red::Softmax(_) | Red::LogSoftmax(_) => sa,
                    _ => {
                        let mut s = sa;
                        s.remove(along);
                        s
                    }
                };
                self.push(Op::Reduce { kind, a }, shape, da, None);
            }
            13 => {
                let device = self.below(3);
                self.push(Op::To { a, device }, sa, device, None);
            }
            14 => {
                let dests: Vec<usize> = (0..self.p.slots.len())
                    .filter(|&s| !self.p.slots[s].2 && self.p.slots[s].0 == sa)
                    .collect();
                if dests.is_empty() {
                    return;
                }
                let dest = dests[self.below(dests.len())];
                self.p.ops.push(Op::CopyTo { a, dest });
            }
            15 => {
                // Misfit: an axis of length >= 2 against one of length + 1.
                let Some(i) = sa.iter().position(|&n| n >= 2) else {
                    return;
                };
                let mut sb = sa[i..].to_vec();
                sb[0] += 1;
                let b = self.input(sb, da);
                let kind = BINS[self.below(4)];
                let (x, y) = if self.chance(50) { (a, b) } else { (b, a) };
                let shape = self.shape_of(x);
                self.p.fails = true;
                self.push(Op::Misfit { kind, a: x, b: y }, shape, da, None);
            }
            16 => {
                // Broadcasts, but to a larger shape than the target's.
                let Some(target) = self.own_slot() else {
                    return;
                };
                let (st, dt) = (self.shape_of(target), self.device_of(target));
                if st.len() >= 3 {
                    return;
                }
                let mut sb = st.clone();
                sb.insert(0, 2);
                let b = self.input(sb, dt);
                let kind = BINS[self.below(4)];
                self.p.fails = true;
                self.p.ops.push(Op::MisfitAssign { kind, target, b });
            }
            _ => {}
        }
    }
}

fn generate(seed: u64) -> Program {
    let mut g = Gen {
        rng: Rng(seed.wrapping_mul(0x2545_F491_4F6C_DD1D) ^ 0x5EED),
        p: Program {
            ops: vec![],
            slots: vec![],
            fails: false,
        },
        storage: vec![],
        storages: 0,
    };
    for _ in 0..2 + g.below(2) {
        let shape = g.shape();
        let device = if g.chance(70) { 0 } else { g.below(3) };
        g.input(shape, device);
    }
    let with_failure = seed % 3 == 2;
    let len = g.p.ops.len() + 10 + g.below(5);
    while g.p.ops.len() < len {
        g.op(with_failure);
    }
    g.p
}

// ---------------------------------------------------------------- engine

/// The program's inputs, made outside it (and outside any recording).
fn make_inputs(p: &Program, arrays: &[nd::Arrays]) -> Result<Vec<nd::Array>, Error> {
    p.ops
        .iter()
        .filter_map(|op| match op {
            Op::Input {
                shape,
                device,
                values,
            } => Some(arrays[*device].from_vec(values.clone(), shape)),
            _ => None,
        })
        .collect()
}

fn binary(kind: Bin, x: &nd::Array, y: &nd::Array, operator: bool) -> Result<nd::Array, Error> {
    if operator {
        return Ok(match kind {
            Bin::Add => x + y,
            Bin::Sub => x - y,
            Bin::Mul => x * y,
            Bin::Div => x / y,
            _ => unreachable!("no operator for {kind:?}"),
        });
    }
    match kind {
        Bin::Add => x.add(y),
        Bin::Sub => x.sub(y),
        Bin::Mul => x.mul(y),
        Bin::Div => x.div(y),
        Bin::Maximum => x.maximum(y),
        Bin::Minimum => x.minimum(y),
        Bin::Pow => x.pow(y),
        Bin::Eq => x.eq(y),
        Bin::Gt => x.gt(y),
        Bin::Ge => x.ge(y),
        Bin::Lt => x.lt(y),
        Bin::Le => x.le(y),
    }
}

fn in_place(kind: Bin, t: &nd::Array, y: &nd::Array, operator: bool) -> Result<(), Error> {
    if operator {
        let mut t = t.clone();
        match kind {
            Bin::Add => t += y,
            Bin::Sub => t -= y,
            Bin::Mul => t *= y,
            Bin::Div => t /= y,
            _ => unreachable!("no operator for {kind:?}"),
        }
        return Ok(());
    }
    match kind {
        Bin::Add => t.add_assign(y),
        Bin::Sub => t.sub_assign(y),
        Bin::Mul => t.mul_assign(y),
        Bin::Div => t.div_assign(y),
        _ => unreachable!("no in-place form of {kind:?}"),
    }
}

fn scalar(
    kind: Bin,
    x: &nd::Array,
    s: f32,
    left: bool,
    operator: bool,
) -> Result<nd::Array, Error> {
    Ok(match (operator, left, kind) {
        (true, false, Bin::Add) => x + s,
        (true, false, Bin::Sub) => x - s,
        (true, false, Bin::Mul) => x * s,
        (true, false, Bin::Div) => x / s,
        (true, true, Bin::Add) => s + x,
        (true, true, Bin::Sub) => s - x,
        (true, true, Bin::Mul) => s * x,
        (true, true, Bin::Div) => s / x,
        (false, true, Bin::Add) => x.radd_scalar(s)?,
        (false, true, Bin::Sub) => x.rsub_scalar(s)?,
        (false, true, Bin::Mul) => x.rmul_scalar(s)?,
        (false, true, Bin::Div) => x.rdiv_scalar(s)?,
        (false, false, Bin::Add) => x.add_scalar(s)?,
        (false, false, Bin::Sub) => x.sub_scalar(s)?,
        (false, false, Bin::Mul) => x.mul_scalar(s)?,
        (false, false, Bin::Div) => x.div_scalar(s)?,
        (false, false, Bin::Maximum) => x.maximum_scalar(s)?,
        (false, false, Bin::Minimum) => x.minimum_scalar(s)?,
        (false, false, Bin::Pow) => x.pow_scalar(s)?,
        (false, false, Bin::Eq) => x.eq_scalar(s)?,
        (false, false, Bin::Gt) => x.gt_scalar(s)?,
        (false, false, Bin::Ge) => x.ge_scalar(s)?,
        (false, false, Bin::Lt) => x.lt_scalar(s)?,
        (false, false, Bin::Le) => x.le_scalar(s)?,
        _ => unreachable!("no such scalar form: {kind:?}"),
    })
}

/// Runs the program's operations on `inputs` (eagerly, or recorded when
/// called inside `nd::record`): every slot's array.
fn exec(p: &Program, inputs: &[nd::Array], devices: &[Device]) -> Result<Vec<nd::Array>, Error> {
    let mut slots: Vec<nd::Array> = Vec::new();
    let mut inputs = inputs.iter();
    for op in &p.ops {
        let new = match op {
            Op::Input { .. } => inputs.next().unwrap().clone(),
            Op::Binary {
                kind,
                a,
                b,
                operator,
            } => binary(*kind, &slots[*a], &slots[*b], *operator)?,
            Op::Scalar {
                kind,
                a,
                s,
                left,
                operator,
            } => scalar(*kind, &slots[*a], *s, *left, *operator)?,
            Op::Unary { kind, a, operator } => {
                let x = &slots[*a];
                match kind {
                    Un::Neg if *operator => -x,
                    Un::Neg => x.neg()?,
                    Un::Exp => x.exp()?,
                    Un::Log => x.log()?,
                    Un::Relu => x.relu()?,
                    Un::Sigmoid => x.sigmoid()?,
                    Un::Tanh => x.tanh()?,
                    Un::Sqrt => x.sqrt()?,
                    Un::Abs => x.abs()?,
                    Un::Square => x.square()?,
                }
            }
            Op::Assign {
                kind,
                target,
                b,
                operator,
            } => {
                match kind {
                    None => slots[*target].assign(&slots[*b])?,
                    Some(kind) => in_place(*kind, &slots[*target], &slots[*b], *operator)?,
                }
                continue;
            }
            Op::ScalarAssign {
                kind,
                target,
                s,
                operator,
            } => {
                let t = &slots[*target];
                if *operator {
                    let mut t = t.clone();
                    match kind {
                        Bin::Add => t += *s,
                        Bin::Sub => t -= *s,
                        Bin::Mul => t *= *s,
                        Bin::Div => t /= *s,
                        _ => unreachable!(),
                    }
                } else {
                    match kind {
                        Bin::Add => t.add_assign_scalar(*s)?,
                        Bin::Sub => t.sub_assign_scalar(*s)?,
                        Bin::Mul => t.mul_assign_scalar(*s)?,
                        Bin::Div => t.div_assign_scalar(*s)?,
                        _ => unreachable!(),
                    }
                }
                continue;
            }
            Op::Fill { target, v } => {
                slots[*target].fill(*v)?;
                continue;
            }
            Op::Matmul { a, b } => slots[*a].matmul(&slots[*b])?,
            Op::Transpose { a } => slots[*a].t()?,
            Op::Permute { a, axes } => slots[*a].permute(axes)?,
            Op::Reshape { a, shape } => slots[*a].reshape(shape)?,
            Op::SliceAxis { a, axis, range } => slots[*a].slice_axis(*axis, range.clone())?,
            Op::Concat { parts, axis } => {
                let parts: Vec<&nd::Array> = parts.iter().map(|&p| &slots[p]).collect();
                nd::concat(&parts, *axis)?
            }
            Op::Reduce { kind, a } => {
                let x = &slots[*a];
                match *kind {
                    Red::SumAxis(k) => x.sum_axis(k)?,
                    Red::MeanAxis(k) => x.mean_axis(k)?,
                    Red::MaxAxis(k) => x.max_axis(k)?,
                    Red::Argmax(k) => x.argmax(k)?,
                    Red::Sum => x.sum()?,
                    Red::Mean => x.mean()?,
                    Red::Max => x.max()?,
                    Red::Softmax(k) => x.softmax(k)?,
                    Red::LogSoftmax(k) => x.log_softmax(k)?,
                }
            }
            Op::To { a, device } => slots[*a].to(devices[*device])?,
            Op::CopyTo { a, dest } => {
                slots[*a].copy_to(&slots[*dest])?;
                continue;
            }
            Op::Misfit { kind, a, b } => binary(*kind, &slots[*a], &slots[*b], true)?,
            Op::MisfitAssign { kind, target, b } => {
                in_place(*kind, &slots[*target], &slots[*b], true)?;
                continue;
            }
        };
        slots.push(new);
    }
    Ok(slots)
}

/// What reading a slot gave.
type Got = Vec<Result<Vec<f32>, Error>>;

fn engine_devices(engine: &Engine) -> (Vec<nd::Arrays>, Vec<Device>) {
    let arrays = nd::Arrays::new(engine);
    let mut devices = vec![engine.default_device()];
    devices.extend(DEVICES.iter().map(|d| engine.device(d).unwrap()));
    let all = devices.iter().map(|&d| arrays.on(d).unwrap()).collect();
    (all, devices)
}

fn eager(p: &Program, engine: &Engine) -> Result<Got, Error> {
    let (arrays, devices) = engine_devices(engine);
    let inputs = make_inputs(p, &arrays)?;
    let slots = exec(p, &inputs, &devices)?;
    for (i, (s, want)) in slots.iter().zip(&p.slots).enumerate() {
        assert_eq!(s.shape(), &want.0[..], "slot {i}'s shape");
        assert_eq!(s.device(), devices[want.1], "slot {i}'s device");
    }
    // Every read pushed before any is waited for: they run as they may.
    let reads: Vec<_> = slots.iter().map(|s| s.to_vec()).collect();
    Ok(reads.into_iter().map(|r| r.wait()).collect())
}

/// Recorded once, replayed (twice when nothing fails: the second replay
/// must give the same values). `Err` is the first replay's error, checked
/// by the caller.
fn recorded(p: &Program, engine: &Engine) -> Result<(Got, Result<(), Error>), Error> {
    let (arrays, devices) = engine_devices(engine);
    let inputs = make_inputs(p, &arrays)?;
    let outs: Vec<Option<nd::Array>> = p
        .slots
        .iter()
        .map(|(shape, device, of_input)| {
            (!of_input).then(|| arrays[*device].full(shape, -99.0).unwrap())
        })
        .collect();
    let graph = nd::record(engine, || {
        let slots = exec(p, &inputs, &devices)?;
        for (slot, out) in slots.iter().zip(&outs) {
            if let Some(out) = out {
                out.assign(slot)?;
            }
        }
        Ok::<(), Error>(())
    })?;
    let first = graph.replay().wait();
    let read = |outs: &[Option<nd::Array>]| -> Got {
        let reads: Vec<_> = outs
            .iter()
            .zip(&inputs_by_slot(p, &inputs))
            .map(|(out, input)| out.as_ref().or(input.as_ref()).unwrap().to_vec())
            .collect();
        reads.into_iter().map(|r| r.wait()).collect()
    };
    let got = read(&outs);
    if !p.fails {
        first.as_ref().expect("a replay with no failing op");
        graph.replay().wait()?;
        let again = read(&outs);
        for (i, (x, y)) in got.iter().zip(&again).enumerate() {
            let (x, y) = (x.as_ref().unwrap(), y.as_ref().unwrap());
            assert!(
                bits(x) == bits(y),
                "slot {i}: the second replay gave {y:?}, the first {x:?}"
            );
        }
    }
    Ok((got, first))
}

/// Per slot, the input array it is (a view of an input shares its values,
/// and a recording changes no input, so the input itself stands for it:
/// reading the view outside the recording would be an intermediate's read).
fn inputs_by_slot(p: &Program, inputs: &[nd::Array]) -> Vec<Option<nd::Array>> {
    let mut next = inputs.iter();
    let mut by_slot: Vec<Option<nd::Array>> = Vec::new();
    for op in &p.ops {
        match op {
            Op::Input { .. } => by_slot.push(next.next().cloned()),
            Op::Reshape { a, shape } => {
                let view = by_slot[*a].as_ref().map(|x| x.reshape(shape).unwrap());
                by_slot.push(view);
            }
            op if op.makes_slot() => by_slot.push(None),
            _ => {}
        }
    }
    by_slot
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

// ---------------------------------------------------------------- reference

/// Values (row-major) and the names of the failed ops they depend on.
struct Stored {
    values: Vec<f32>,
    fails: BTreeSet<&'static str>,
}

struct Reference {
    storages: Vec<Stored>,
    /// Per slot: shape and storage.
    slots: Vec<(Vec<usize>, usize)>,
}

fn max_of(x: &ArrayD<f32>, along: usize) -> ArrayD<f32> {
    x.fold_axis(Axis(along), f32::NEG_INFINITY, |&m, &v| m.max(v))
}

impl Reference {
    fn arr(&self, s: usize) -> ArrayD<f32> {
        let (shape, st) = &self.slots[s];
        ArrayD::from_shape_vec(IxDyn(shape), self.storages[*st].values.clone()).unwrap()
    }

    fn fails(&self, s: &[usize]) -> BTreeSet<&'static str> {
        s.iter()
            .flat_map(|&s| self.storages[self.slots[s].1].fails.iter().copied())
            .collect()
    }

    fn push(&mut self, values: ArrayD<f32>, fails: BTreeSet<&'static str>) {
        let shape = values.shape().to_vec();
        let values = values.as_standard_layout().iter().copied().collect();
        self.storages.push(Stored { values, fails });
        self.slots.push((shape, self.storages.len() - 1));
    }

    /// Changes slot `t`'s values (seen by every slot of its storage).
    fn change(&mut self, t: usize, values: ArrayD<f32>, more_fails: BTreeSet<&'static str>) {
        let st = &mut self.storages[self.slots[t].1];
        st.values = values.as_standard_layout().iter().copied().collect();
        st.fails.extend(more_fails);
    }
}

fn zip_bin(kind: Bin, x: &ArrayD<f32>, y: &ArrayD<f32>) -> ArrayD<f32> {
    let shape = broadcast(x.shape(), y.shape()).unwrap();
    let (xb, yb) = (
        x.broadcast(IxDyn(&shape)).unwrap(),
        y.broadcast(IxDyn(&shape)).unwrap(),
    );
    Zip::from(&xb).and(&yb).map_collect(|&x, &y| kind.f(x, y))
}

fn reference(p: &Program) -> Reference {
    let mut r = Reference {
        storages: vec![],
        slots: vec![],
    };
    let none = BTreeSet::new;
    for op in &p.ops {
        match op {
            Op::Input { shape, values, .. } => r.push(
                ArrayD::from_shape_vec(IxDyn(shape), values.clone()).unwrap(),
                none(),
            ),
            Op::Binary { kind, a, b, .. } => {
                let v = zip_bin(*kind, &r.arr(*a), &r.arr(*b));
                r.push(v, r.fails(&[*a, *b]));
            }
            Op::Scalar {
                kind, a, s, left, ..
            } => {
                let v = r
                    .arr(*a)
                    .mapv(|x| if *left { kind.f(*s, x) } else { kind.f(x, *s) });
                r.push(v, r.fails(&[*a]));
            }
            Op::Unary { kind, a, .. } => {
                let v = r.arr(*a).mapv(|x| kind.f(x));
                r.push(v, r.fails(&[*a]));
            }
            Op::Assign {
                kind, target, b, ..
            } => {
                let (t, y) = (r.arr(*target), r.arr(*b));
                let y = y.broadcast(t.raw_dim()).unwrap();
                let v = Zip::from(&t)
                    .and(&y)
                    .map_collect(|&t, &y| kind.map_or(y, |k| k.f(t, y)));
                r.change(*target, v, r.fails(&[*b]));
            }
            Op::ScalarAssign {
                kind, target, s, ..
            } => {
                let v = r.arr(*target).mapv(|t| kind.f(t, *s));
                r.change(*target, v, none());
            }
            Op::Fill { target, v } => {
                let v = r.arr(*target).mapv(|_| *v);
                r.change(*target, v, none());
            }
            Op::Matmul { a, b } => {
                let (x, y) = (r.arr(*a), r.arr(*b));
                let (sa, sb) = (x.shape().to_vec(), y.shape().to_vec());
                let v = if sa.len() == 2 {
                    let mut o = vec![0.0f32; sa[0] * sb[1]];
                    let xv = ArrayView2::from_shape((sa[0], sa[1]), x.as_slice().unwrap()).unwrap();
                    let yv = ArrayView2::from_shape((sb[0], sb[1]), y.as_slice().unwrap()).unwrap();
                    let mut ov = ArrayViewMut2::from_shape((sa[0], sb[1]), &mut o).unwrap();
                    general_mat_mul(1.0, &xv, &yv, 0.0, &mut ov);
                    ArrayD::from_shape_vec(IxDyn(&[sa[0], sb[1]]), o).unwrap()
                } else {
                    let mut o = vec![0.0f32; sa[0] * sa[1] * sb[2]];
                    let xv = ArrayView3::from_shape((sa[0], sa[1], sa[2]), x.as_slice().unwrap())
                        .unwrap();
                    let yv = ArrayView3::from_shape((sb[0], sb[1], sb[2]), y.as_slice().unwrap())
                        .unwrap();
                    let mut ov = ArrayViewMut3::from_shape((sa[0], sa[1], sb[2]), &mut o).unwrap();
                    for (i, mut o) in ov.axis_iter_mut(Axis(0)).enumerate() {
                        general_mat_mul(
                            1.0,
                            &xv.index_axis(Axis(0), i),
                            &yv.index_axis(Axis(0), i),
                            0.0,
                            &mut o,
                        );
                    }
                    ArrayD::from_shape_vec(IxDyn(&[sa[0], sa[1], sb[2]]), o).unwrap()
                };
                r.push(v, r.fails(&[*a, *b]));
            }
            Op::Transpose { a } => {
                let v = r.arr(*a).reversed_axes();
                r.push(v, r.fails(&[*a]));
            }
            Op::Permute { a, axes } => {
                let v = r.arr(*a).permuted_axes(IxDyn(axes));
                r.push(v, r.fails(&[*a]));
            }
            Op::Reshape { a, shape } => {
                let st = r.slots[*a].1;
                r.slots.push((shape.clone(), st));
            }
            Op::SliceAxis { a, axis, range } => {
                let x = r.arr(*a);
                let v = x
                    .slice_axis(Axis(*axis), Slice::from(range.clone()))
                    .to_owned();
                r.push(v, r.fails(&[*a]));
            }
            Op::Concat { parts, axis } => {
                let arrs: Vec<ArrayD<f32>> = parts.iter().map(|&p| r.arr(p)).collect();
                let views: Vec<_> = arrs.iter().map(|a| a.view()).collect();
                let v = ndarray::concatenate(Axis(*axis), &views).unwrap();
                r.push(v, r.fails(parts));
            }
            Op::Reduce { kind, a } => {
                let x = r.arr(*a);
                let scalar = |v: f32| ArrayD::from_elem(IxDyn(&[]), v);
                let v = match *kind {
                    Red::SumAxis(k) => x.sum_axis(Axis(k)),
                    Red::MeanAxis(k) => x.mean_axis(Axis(k)).unwrap(),
                    Red::MaxAxis(k) => max_of(&x, k),
                    Red::Argmax(k) => {
                        let mut o = ArrayD::<f32>::zeros(x.sum_axis(Axis(k)).raw_dim());
                        Zip::from(&mut o).and(x.lanes(Axis(k))).for_each(|o, lane| {
                            let (mut best, mut at) = (lane[0], 0);
                            for (i, &v) in lane.iter().enumerate().skip(1) {
                                if v > best {
                                    (best, at) = (v, i);
                                }
                            }
                            *o = at as f32;
                        });
                        o
                    }
                    Red::Sum => scalar(x.sum()),
                    Red::Mean => scalar(x.mean().unwrap()),
                    Red::Max => scalar(x.fold(f32::NEG_INFINITY, |m, &v| m.max(v))),
                    Red::Softmax(k) => {
                        let mut o = ArrayD::<f32>::zeros(x.raw_dim());
                        let max = max_of(&x, k).insert_axis(Axis(k));
                        Zip::from(&mut o)
                            .and(&x)
                            .and_broadcast(&max)
                            .for_each(|o, &x, &m| *o = (x - m).exp());
                        let sum = o.sum_axis(Axis(k)).insert_axis(Axis(k));
                        Zip::from(&mut o)
                            .and_broadcast(&sum)
                            .for_each(|o, &s| *o /= s);
                        o
                    }
                    Red::LogSoftmax(k) => {
                        let mut o = ArrayD::<f32>::zeros(x.raw_dim());
                        let max = max_of(&x, k).insert_axis(Axis(k));
                        Zip::from(&mut o)
                            .and(&x)
                            .and_broadcast(&max)
                            .for_each(|o, &x, &m| *o = x - m);
                        let log_sum = o
                            .mapv(f32::exp)
                            .sum_axis(Axis(k))
                            .mapv(f32::ln)
                            .insert_axis(Axis(k));
                        Zip::from(&mut o)
                            .and_broadcast(&log_sum)
                            .for_each(|o, &l| *o -= l);
                        o
                    }
                };
                r.push(v, r.fails(&[*a]));
            }
            Op::To { a, .. } => {
                let v = r.arr(*a);
                r.push(v, r.fails(&[*a]));
            }
            Op::CopyTo { a, dest } => {
                if r.slots[*a].1 != r.slots[*dest].1 {
                    let v = r.arr(*a);
                    r.change(*dest, v, r.fails(&[*a]));
                }
            }
            Op::Misfit { kind, a, .. } => {
                let v = r.arr(*a);
                r.push(v, BTreeSet::from([kind.name()]));
            }
            Op::MisfitAssign { kind, target, .. } => {
                let v = r.arr(*target);
                r.change(*target, v, BTreeSet::from([kind.name()]));
            }
        }
    }
    r
}

// ---------------------------------------------------------------- comparison

/// Checks every slot's read against the reference: bit for bit where it
/// depends on no failure, else `Error::Poisoned` whose failure is one of
/// the failed ops it depends on, and whose message names that op.
fn compare(label: &str, seed: u64, p: &Program, r: &Reference, got: &Got) {
    let fail = |msg: String| -> ! {
        panic!(
            "seed {seed}, {label}: {msg}\nprogram:\n{}(rerun with DEPFLOW_ND_SEED={seed})",
            p.listing()
        )
    };
    assert_eq!(got.len(), r.slots.len());
    for (i, g) in got.iter().enumerate() {
        let st = &r.storages[r.slots[i].1];
        match (g, st.fails.is_empty()) {
            (Ok(v), true) => {
                if bits(v) != bits(&st.values) {
                    fail(format!("slot s{i}: got {v:?}, want {:?}", st.values));
                }
            }
            (Err(e @ Error::Poisoned { cause, .. }), false) => {
                let op = cause.op_name().unwrap_or("?");
                if !st.fails.contains(op) {
                    fail(format!(
                        "slot s{i}: failure of `{op}`, want one of {:?}: {e}",
                        st.fails
                    ));
                }
                let text = e.to_string();
                if !text.contains(&format!("{op}: shape")) {
                    fail(format!(
                        "slot s{i}: the message does not name `{op}` and the shapes: {text}"
                    ));
                }
            }
            (Ok(v), false) => fail(format!(
                "slot s{i}: got {v:?}, want a failure of {:?}",
                st.fails
            )),
            (Err(e), _) => fail(format!(
                "slot s{i}: got {e:?}, want {:?} (failures {:?})",
                st.values, st.fails
            )),
        }
    }
}

fn seeds() -> Vec<u64> {
    if let Ok(s) = std::env::var("DEPFLOW_ND_SEED") {
        return vec![s.parse().expect("DEPFLOW_ND_SEED: a number")];
    }
    let n = std::env::var("DEPFLOW_ND_SEEDS")
        .map(|s| s.parse().expect("DEPFLOW_ND_SEEDS: a number"))
        .unwrap_or(300);
    (0..n).collect()
}

fn engines() -> Vec<(&'static str, Engine)> {
    let with = |default: Executor, d1: Executor, d2: Executor| {
        Engine::builder()
            .executor(default)
            .device(DEVICES[0], d1)
            .device(DEVICES[1], d2)
            .build()
            .unwrap()
    };
    vec![
        (
            "inline",
            with(Executor::inline(), Executor::inline(), Executor::inline()),
        ),
        (
            "pool1",
            with(Executor::pool(1), Executor::inline(), Executor::inline()),
        ),
        (
            "pool2",
            with(Executor::pool(2), Executor::inline(), Executor::inline()),
        ),
        (
            "pools",
            with(Executor::pool(2), Executor::pool(1), Executor::pool(2)),
        ),
        (
            // A custom executor: a thread of the test's own, fed by a
            // channel.
            "custom",
            with(custom_executor(), Executor::pool(1), Executor::inline()),
        ),
        #[cfg(feature = "tokio")]
        (
            "tokio",
            with(
                Executor::tokio(TOKIO.handle().clone()),
                Executor::pool(1),
                Executor::tokio(TOKIO.handle().clone()),
            ),
        ),
    ]
}

/// An executor of the test's own: one thread running the jobs a channel
/// brings, in order.
fn custom_executor() -> Executor {
    let (jobs, ready) = std::sync::mpsc::channel::<depflow::Job>();
    std::thread::spawn(move || {
        ready.into_iter().for_each(|job| {
            job.run();
        })
    });
    Executor::custom(move |job| {
        // The thread outlives the engine's use of it.
        let _ = jobs.send(job);
    })
}

/// The runtime of the engine whose devices are tokio's (feature `tokio`).
#[cfg(feature = "tokio")]
static TOKIO: std::sync::LazyLock<tokio::runtime::Runtime> = std::sync::LazyLock::new(|| {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap()
});

#[test]
fn random_array_programs_agree_with_ndarray_on_every_executor_eager_and_replayed() {
    let engines = engines();
    let mut failing = 0;
    for seed in seeds() {
        let p = generate(seed);
        failing += usize::from(p.fails);
        let r = reference(&p);
        for (name, engine) in &engines {
            let (q, e) = (p.clone(), engine.clone());
            let got = within(60, move || eager(&q, &e))
                .unwrap_or_else(|e| panic!("seed {seed}, eager on {name}: {e}\n{}", p.listing()));
            compare(&format!("eager on {name}"), seed, &p, &r, &got);
            if *name == "pool1" || *name == "pool2" {
                continue; // replayed on the others
            }
            let (q, e) = (p.clone(), engine.clone());
            let (got, replay) = within(60, move || recorded(&q, &e)).unwrap_or_else(|e| {
                panic!("seed {seed}, recorded on {name}: {e}\n{}", p.listing())
            });
            compare(&format!("replayed on {name}"), seed, &p, &r, &got);
            match (&replay, p.fails) {
                (Ok(()), false) => {}
                (Err(e), true) => {
                    let op = e.failure().and_then(|f| f.op_name()).unwrap_or("?");
                    let all: BTreeSet<_> = r
                        .storages
                        .iter()
                        .flat_map(|s| s.fails.iter().copied())
                        .collect();
                    assert!(
                        all.contains(op),
                        "seed {seed}, replay on {name}: {e}, want a failure of one of {all:?}\n{}",
                        p.listing()
                    );
                }
                (replay, _) => panic!(
                    "seed {seed}, replay on {name}: {replay:?} (failing op: {})\n{}",
                    p.fails,
                    p.listing()
                ),
            }
        }
    }
    if seeds().len() >= 30 {
        assert!(failing >= 5, "only {failing} programs with a failing op");
    }
}

// ---------------------------------------------------------------- random draws

/// A seed, then uniform and normal draws on every device of `engine`, read.
fn draws(engine: &Engine, seed: u64) -> Vec<Vec<u32>> {
    let (arrays, _) = engine_devices(engine);
    arrays[0].seed(seed).unwrap();
    let mut made = Vec::new();
    for round in 0..3 {
        for a in &arrays {
            made.push(a.uniform(&[3, 5], -1.0, 1.0 + round as f32).unwrap());
            made.push(a.normal(&[7], 0.5, 2.0).unwrap());
        }
    }
    let reads: Vec<_> = made.iter().map(|a| a.to_vec()).collect();
    reads
        .into_iter()
        .map(|r| bits(&r.wait().unwrap()))
        .collect()
}

#[test]
fn a_seed_gives_the_same_draws_on_every_executor() {
    let engines = engines();
    for seed in [0, 7, u64::MAX] {
        let e = engines[0].1.clone();
        let want = within(60, move || draws(&e, seed));
        assert!(
            want.iter().flatten().collect::<BTreeSet<_>>().len() > 100,
            "draws vary"
        );
        for (name, engine) in &engines[1..] {
            let e = engine.clone();
            let got = within(60, move || draws(&e, seed));
            assert_eq!(got, want, "seed {seed}: {name} against inline");
        }
    }
    let e = engines[0].1.clone();
    assert_ne!(
        within(60, move || draws(&e, 1)),
        within(60, move || draws(&engines[0].1, 2))
    );
}

#[test]
fn draws_inside_a_recording_draw_anew_at_each_replay() {
    for (name, engine) in engines() {
        let (arrays, _) = engine_devices(&engine);
        let a = &arrays[0];
        a.seed(3).unwrap();
        let (u, n) = (a.zeros(&[4]).unwrap(), a.zeros(&[2, 2]).unwrap());
        let graph = nd::record(&engine, || {
            u.assign(&a.uniform(&[4], 0.0, 1.0)?)?;
            n.assign(&(a.normal(&[2, 2], 0.0, 1.0)? + 1.0))
        })
        .unwrap();
        let mut seen = Vec::new();
        for _ in 0..3 {
            let g = graph.clone();
            within(60, move || g.replay().wait()).unwrap();
            seen.push((
                bits(&u.to_vec().wait().unwrap()),
                bits(&n.to_vec().wait().unwrap()),
            ));
        }
        assert!(
            seen[0] != seen[1] && seen[1] != seen[2],
            "{name}: replays drew the same"
        );
        // The generator is the engine's: eager draws after the seed give the
        // same sequence as the replays did.
        a.seed(3).unwrap();
        for (i, want) in seen.iter().enumerate() {
            let x = bits(&a.uniform(&[4], 0.0, 1.0).unwrap().to_vec().wait().unwrap());
            let y = a.normal(&[2, 2], 0.0, 1.0).unwrap() + 1.0;
            let y = bits(&y.to_vec().wait().unwrap());
            assert_eq!((x, y), *want, "{name}: replay {i} against eager draws");
        }
    }
}
