//! Arrays on the engine (feature `nd`): MXNet's NDArray, whose every
//! operation is an engine op whose reads and mutations come from its
//! operands. You write array code; you never name a variable.
//!
//! ```
//! use depflow::{Engine, Error, nd};
//!
//! let engine = Engine::new();
//! let arrays = nd::Arrays::new(&engine);
//! // Seed 000's program, on vectors: each line returns at once.
//! let mut a = arrays.full(&[4], 1.0)?;
//! let b = &a + 1.0; // reads a
//! let c = &a + 2.0; // reads a: may run beside b
//! a = &c * 2.0; // a new array; the old one goes once b and c have read it
//! let d = &a + 3.0;
//! assert_eq!(b.to_vec().wait()?, [2.0; 4]);
//! assert_eq!(d.to_vec().wait()?, [9.0; 4]);
//! # Ok::<(), Error>(())
//! ```
//!
//! # What an operation does
//!
//! An operation checks its operands at the call (shapes, devices), makes
//! its result (a new [`Array`] of the result's shape, its buffer not yet
//! written) and pushes one op that reads the operands' buffers and
//! mutates the result's, running on the operands' device. It returns at
//! once; the engine runs the op when the operands' earlier writers are
//! done. In-place forms (`a += &b`, [`Array::assign`],
//! [`Array::add_assign`]) push an op that mutates the target. So the
//! dependencies are the program's, per array: reads in parallel, writes
//! alone, in program order.
//!
//! Values are read through a future ([`Array::to_vec`], `.wait()` to
//! block), or [`Array::item`] for one element. An array's buffer goes
//! when its last handle does and its pending ops are done (seed 000's
//! memory recycling). Clones and [`Array::reshape`]s share the values.
//!
//! Kernels are ndarray's: `Zip` for elementwise operations with
//! broadcasting, `general_mat_mul` (matrixmultiply) for
//! [`Array::matmul`], `sum_axis` and its kin for reductions; so results
//! are bit for bit those of the same ndarray calls.
//!
//! # Errors
//!
//! A misfit known at the call (shapes that do not broadcast or multiply,
//! an axis out of range, operands on different devices) is
//! [`Error::Array`](crate::Error::Array), naming the operation and both
//! shapes, from the method (`a.add(&b)?`). Operators (`&a + &b`) cannot
//! return an error: they return a failed array instead, whose reads
//! resolve to that same error. A failure inside an op (and any operation
//! on its result) resolves at the read to the original failure, as for
//! any op ([`Error::Poisoned`](crate::Error::Poisoned)).
//!
//! # Graph mode
//!
//! [`record`] runs a function of arrays once and records its operations
//! into a [`Graph`](crate::Graph) instead of pushing them; a replay runs
//! them again, each time, on the arrays from outside the recording, with
//! the arrays made inside as planned buffers sharing the graph's arena.
//! The same function runs eagerly when called outside [`record`]: the
//! choice is the caller's (SINGA's `model.graph(True)`). See [`record`].
//!
//! Graph mode order: [`record`] replays in [`Order::Parallel`](crate::Order);
//! for SINGA's sequential mode, record with
//! `engine.record(|rec| { rec.order(Order::Sequential); nd::recording(rec, step) })`.
//!
//! # Training
//!
//! Autograd: [`Array::with_grad`] makes a parameter (a leaf); every
//! operation on arrays a gradient flows through adds a node to a graph,
//! and [`Array::backward`] pushes the backward pass as array operations
//! (engine ops, running as their inputs allow; recorded inside
//! [`record`]), accumulating each leaf's gradient into [`Array::grad`]
//! until [`Array::zero_grad`]. [`no_grad`] turns it off (updates,
//! evaluation). [`nn`] has the layers behind one trait ([`nn::Module`])
//! and the loss; [`optim`] the optimizers, one in-place op per parameter;
//! [`DataParallel`] replicates a module over a
//! [`parallel::Group`](crate::parallel::Group)'s devices (and ranks),
//! each gradient handed to the group's all-reduce as soon as the backward
//! pass has pushed it.
//!
//! ```
//! use depflow::nd::nn::{self, Linear, Module, Relu, Sequential};
//! use depflow::nd::{self, optim::Sgd};
//! use depflow::{Engine, Error};
//!
//! let engine = Engine::new();
//! let arrays = nd::Arrays::new(&engine);
//! let model = Sequential::new()
//!     .push(Linear::new(&arrays, 2, 8)?)
//!     .push(Relu)
//!     .push(Linear::new(&arrays, 8, 2)?);
//! let sgd = Sgd::new(model.parameters(), 0.5);
//! let (x, y) = (arrays.normal(&[16, 2], 0.0, 1.0)?, arrays.zeros(&[16, 2])?);
//! let labels = x.slice_axis(1, 0..1)?.gt_scalar(0.0)?; // class 1 where x₀ > 0
//! let targets = nd::concat(&[&labels.rsub_scalar(1.0)?, &labels], 1)?;
//! y.assign(&targets)?;
//!
//! // One step, written once; recorded here, then replayed.
//! let step = || -> Result<(), Error> {
//!     sgd.zero_grad()?;
//!     nn::softmax_cross_entropy(&model.forward(&x)?, &y)?.backward()?;
//!     sgd.step()
//! };
//! let graph = nd::record(&engine, step)?;
//! let before = nn::softmax_cross_entropy(&model.forward(&x)?, &y)?.item()?;
//! for _ in 0..50 {
//!     graph.replay();
//! }
//! let after = nn::softmax_cross_entropy(&model.forward(&x)?, &y)?.item()?;
//! assert!(after < before);
//! # Ok::<(), Error>(())
//! ```
//!
//! # Devices
//!
//! [`Arrays::on`] makes arrays on another device of the engine; operands
//! of one operation must share a device ([`Array::to`] copies). Array
//! values live in host memory and kernels run on the host: on CPU
//! devices, each with its own executor. Arrays on stream devices (CUDA,
//! the simulated GPU) are not built yet: [`Arrays::on`] and
//! [`Array::to`] refuse them with [`Error::Array`](crate::Error::Array).
//!
//! The layer uses only the public API of the engine and of `parallel`.

mod array;
mod arrays;
mod autograd;
mod conv;
mod copy;
mod data_parallel;
mod derivatives;
mod elementwise;
mod layout;
mod linalg;
mod mode;
pub mod nn;
mod operators;
pub mod optim;
mod reduce;
mod shape;

pub use array::{Array, Values};
pub use arrays::Arrays;
pub use autograd::{is_grad_enabled, no_grad};
pub use data_parallel::DataParallel;
pub use layout::concat;
pub use mode::{is_recording, record, recording};
