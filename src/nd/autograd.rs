//! Reverse-mode differentiation on arrays: which arrays need gradients,
//! the graph of operations that made them, and the backward pass, whose
//! every step is an array operation, so an engine op like any other
//! (pushed, or recorded inside [`record`](super::record)).
//!
//! An array's `Grad` is fixed when it is made:
//!
//! - `Grad::None`: no gradient flows through it;
//! - `Grad::Leaf`: made by [`Array::requires_grad`]; its slot holds the
//!   accumulated gradient, an array of the engine's own (never a planned
//!   buffer, so it outlives a recording), made zeroed by the first
//!   backward pass that reaches it;
//! - `Grad::Node`: made by an operation on at least one array that needs
//!   a gradient while gradients are on this thread ([`no_grad`]); the node
//!   holds the operands (so the graph lives as long as its result does)
//!   and a closure from the result's gradient to the operands'.
//!
//! A node never holds its own result (it would hold itself): a closure
//! that needs the result captures a [`detach`](Array::detach)ed handle.

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::Array;
use super::shape::misfit;
use crate::error::Error;

/// From the gradient of an operation's result to its operands' (`None`
/// for one that gets none), in operand order.
pub(super) type Backward = Box<dyn Fn(&Array) -> Result<Vec<Option<Array>>, Error> + Send + Sync>;

/// Whether and how gradients flow through an array.
#[derive(Clone, Default)]
pub(super) enum Grad {
    #[default]
    None,
    Leaf(Arc<Slot>),
    Node(Arc<Node>),
}

/// A leaf's accumulated gradient.
#[derive(Default)]
pub(super) struct Slot {
    grad: Mutex<Option<Array>>,
}

/// The operation that made an array.
pub(super) struct Node {
    op: &'static str,
    operands: Vec<Array>,
    backward: Backward,
}

thread_local! {
    /// Whether operations on this thread build the graph (off inside
    /// [`no_grad`] and the backward pass).
    static ENABLED: Cell<bool> = const { Cell::new(true) };
}

/// Runs `f` with gradients off on this thread: operations made in it are
/// not recorded for a backward pass (an optimizer's update, evaluation).
pub fn no_grad<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            ENABLED.with(|e| e.set(self.0));
        }
    }
    let _restore = Restore(ENABLED.with(|e| e.replace(false)));
    f()
}

/// Whether operations on this thread build the graph.
pub fn is_grad_enabled() -> bool {
    ENABLED.with(Cell::get)
}

impl Grad {
    fn flows(&self) -> bool {
        !matches!(self, Grad::None)
    }
}

impl Array {
    /// `self` as the result of operation `op` on `operands`, if a gradient
    /// flows to any of them: `make`, given the result detached, gives the
    /// closure from the result's gradient to theirs (made only then).
    pub(super) fn tracked(
        self,
        op: &'static str,
        operands: &[&Array],
        make: impl FnOnce(Array) -> Backward,
    ) -> Array {
        if !operands.iter().any(|a| a.grad_kind().flows()) || !is_grad_enabled() {
            return self;
        }
        let node = Node {
            op,
            operands: operands.iter().map(|&a| a.clone()).collect(),
            backward: make(self.detach()),
        };
        let mut out = self;
        out.set_grad_kind(Grad::Node(Arc::new(node)));
        out
    }

    /// Whether a gradient flows to this array: it requires one, or was
    /// made from one that does.
    pub fn requires_grad(&self) -> bool {
        self.grad_kind().flows()
    }

    /// The same values as a leaf that accumulates its gradient: what a
    /// parameter is made of. Operations on it (or on arrays made from it)
    /// record what [`backward`](Self::backward) needs.
    ///
    /// ```
    /// use depflow::{Engine, Error, nd};
    ///
    /// let arrays = nd::Arrays::new(&Engine::new());
    /// let w = arrays.from_vec(vec![1.0, 2.0, 3.0], &[3])?.with_grad();
    /// let loss = (&w * &w).sum()?; // Σ w²
    /// loss.backward()?;
    /// assert_eq!(w.grad().unwrap().to_vec().wait()?, [2.0, 4.0, 6.0]);
    /// # Ok::<(), Error>(())
    /// ```
    pub fn with_grad(&self) -> Array {
        self.with_grad_kind(Grad::Leaf(Arc::default()))
    }

    /// The same values with no gradient flowing through them: a constant
    /// to later operations.
    pub fn detach(&self) -> Array {
        self.with_grad_kind(Grad::None)
    }

    /// The gradient accumulated so far, for a leaf ([`with_grad`](Self::with_grad))
    /// that a backward pass reached; `None` otherwise.
    pub fn grad(&self) -> Option<Array> {
        match self.grad_kind() {
            Grad::Leaf(slot) => slot.grad.lock().unwrap_or_else(|e| e.into_inner()).clone(),
            _ => None,
        }
    }

    /// Sets a leaf's gradient to zero (an op, in program order), making it
    /// if no backward pass has yet. A training step calls it before its
    /// backward pass, as PyTorch's `zero_grad`: gradients accumulate
    /// otherwise (in a recorded step too, where it records the zeroing).
    ///
    /// # Errors
    ///
    /// [`Error::Array`] if the array is not a leaf ([`with_grad`](Self::with_grad));
    /// [`Error::ShutDown`] after shutdown.
    pub fn zero_grad(&self) -> Result<(), Error> {
        let Grad::Leaf(slot) = self.grad_kind() else {
            return Err(misfit(
                "zero_grad",
                format!(
                    "the array of shape {:?} is not a leaf made by with_grad",
                    self.shape()
                ),
            ));
        };
        let grad = slot_grad(self, slot);
        grad.fill(0.0)
    }

    /// Backpropagates from this one-element array (a loss): pushes (or,
    /// inside [`record`](super::record), records) the backward operations
    /// of every operation it was made by, and adds each leaf's gradient
    /// into its [`grad`](Self::grad). Returns once they are pushed; they
    /// run as their inputs allow, overlapping whatever else can run.
    ///
    /// # Errors
    ///
    /// [`Error::Array`] if the array has more than one element (use
    /// [`backward_with`](Self::backward_with)) or no gradient flows to it;
    /// [`Error::ShutDown`] after shutdown.
    pub fn backward(&self) -> Result<(), Error> {
        self.backward_each(&mut |_| Ok(()))
    }

    /// Backpropagates from this array with `seed` as its gradient (of its
    /// shape): see [`backward`](Self::backward).
    ///
    /// # Errors
    ///
    /// [`Error::Array`] if `seed`'s shape or device is not the array's, or
    /// no gradient flows to the array; [`Error::ShutDown`] after shutdown.
    pub fn backward_with(&self, seed: &Array) -> Result<(), Error> {
        if seed.shape() != self.shape() || seed.device() != self.device() {
            return Err(misfit(
                "backward",
                format!(
                    "the seed gradient's shape {:?} on {:?} is not the result's {:?} on {:?}",
                    seed.shape(),
                    seed.device(),
                    self.shape(),
                    self.device()
                ),
            ));
        }
        self.backpropagate_from(seed.clone(), &mut |_| Ok(()))
    }

    /// [`backward`](Self::backward), calling `on_leaf` for every leaf the
    /// pass reaches as soon as the last op adding into its gradient is
    /// pushed: where a data-parallel step hands that gradient on.
    pub(super) fn backward_each(
        &self,
        on_leaf: &mut dyn FnMut(&Array) -> Result<(), Error>,
    ) -> Result<(), Error> {
        if self.len() != 1 {
            return Err(misfit(
                "backward",
                format!(
                    "shape {:?} is not one element: give the gradient of the result with backward_with",
                    self.shape()
                ),
            ));
        }
        if !self.requires_grad() {
            // Before the seed's op: nothing is pushed for a refused pass.
            return Err(self.no_gradient());
        }
        let seed = no_grad(|| self.full(self.shape(), 1.0))?;
        self.backpropagate_from(seed, on_leaf)
    }

    /// Why a backward pass from this array is refused.
    fn no_gradient(&self) -> Error {
        misfit(
            "backward",
            format!(
                "no gradient flows to this array of shape {:?}: it was not made from an array \
                 that requires one (with_grad), or was made under no_grad",
                self.shape()
            ),
        )
    }

    fn backpropagate_from(
        &self,
        seed: Array,
        on_leaf: &mut dyn FnMut(&Array) -> Result<(), Error>,
    ) -> Result<(), Error> {
        no_grad(|| match self.grad_kind() {
            Grad::None => Err(self.no_gradient()),
            Grad::Leaf(slot) => {
                accumulate(self, slot, &seed)?;
                on_leaf(self)
            }
            Grad::Node(node) => backpropagate(node, seed, on_leaf),
        })
    }

    /// A new handle to the same values, with gradients flowing as `grad`
    /// says.
    fn with_grad_kind(&self, grad: Grad) -> Array {
        let mut out = Array::over(
            self.engine(),
            self.device(),
            self.shape_arc().clone(),
            self.buffer().clone(),
        );
        out.set_grad_kind(grad);
        out
    }
}

/// Adds `grad` into leaf `leaf`'s slot, making its gradient array (of the
/// engine's, zeroed) the first time.
fn accumulate(leaf: &Array, slot: &Slot, grad: &Array) -> Result<(), Error> {
    slot_grad(leaf, slot).add_assign(grad)
}

/// Leaf `leaf`'s gradient array, made (zeroed) if it has none yet: the
/// engine's own buffer, even inside a recording, because the gradient
/// outlives it.
fn slot_grad(leaf: &Array, slot: &Slot) -> Array {
    let mut held = slot.grad.lock().unwrap_or_else(|e| e.into_inner());
    held.get_or_insert_with(|| leaf.zeroed_like()).clone()
}

/// The backward pass from `root`, whose result's gradient is `seed`: the
/// nodes in reverse topological order, each one's gradient the sum of
/// what its users gave it. `on_leaf` is called once for every leaf the
/// pass reaches, as soon as the last op adding into its gradient is
/// pushed (at the end for a leaf whose users gave it none).
fn backpropagate(
    root: &Arc<Node>,
    seed: Array,
    on_leaf: &mut dyn FnMut(&Array) -> Result<(), Error>,
) -> Result<(), Error> {
    let order = topological(root);
    // Each leaf's contributions still to come, in order of appearance.
    let mut leaves: Vec<(Array, usize)> = Vec::new();
    let mut leaf_at: HashMap<*const Slot, usize> = HashMap::new();
    for node in &order {
        for operand in &node.operands {
            if let Grad::Leaf(slot) = operand.grad_kind() {
                let at = *leaf_at.entry(Arc::as_ptr(slot)).or_insert_with(|| {
                    leaves.push((operand.clone(), 0));
                    leaves.len() - 1
                });
                leaves[at].1 += 1;
            }
        }
    }
    let mut grads: HashMap<*const Node, Array> = HashMap::new();
    grads.insert(Arc::as_ptr(root), seed);
    for node in order.iter().rev() {
        let grad = grads.remove(&Arc::as_ptr(node));
        let operand_grads = match &grad {
            Some(grad) => (node.backward)(grad)?,
            None => vec![None; node.operands.len()],
        };
        debug_assert_eq!(operand_grads.len(), node.operands.len(), "{}", node.op);
        for (operand, g) in node.operands.iter().zip(operand_grads) {
            match operand.grad_kind() {
                Grad::None => {}
                Grad::Leaf(slot) => {
                    if let Some(g) = g {
                        accumulate(operand, slot, &g)?;
                    }
                    let (leaf, left) = &mut leaves[leaf_at[&Arc::as_ptr(slot)]];
                    *left -= 1;
                    if *left == 0 {
                        on_leaf(leaf)?;
                    }
                }
                Grad::Node(n) => {
                    let Some(g) = g else { continue };
                    let key = Arc::as_ptr(n);
                    let sum = match grads.remove(&key) {
                        Some(acc) => acc.add(&g)?,
                        None => g,
                    };
                    grads.insert(key, sum);
                }
            }
        }
    }
    Ok(())
}

/// The nodes reachable from `root`, each after every node it was made
/// from (a post-order of the depth-first walk, without recursion).
fn topological(root: &Arc<Node>) -> Vec<Arc<Node>> {
    let mut order = Vec::new();
    let mut seen: HashMap<*const Node, ()> = HashMap::new();
    // (node, whether its operands were pushed already)
    let mut stack = vec![(root.clone(), false)];
    while let Some((node, expanded)) = stack.pop() {
        if expanded {
            order.push(node);
            continue;
        }
        if seen.insert(Arc::as_ptr(&node), ()).is_some() {
            continue;
        }
        stack.push((node.clone(), true));
        for operand in &node.operands {
            if let Grad::Node(n) = operand.grad_kind() {
                if !seen.contains_key(&Arc::as_ptr(n)) {
                    stack.push((n.clone(), false));
                }
            }
        }
    }
    order
}
