//! Eager or recorded: where an array operation goes.
//!
//! An operation is pushed to its array's engine, unless the calling thread
//! is inside [`record`] (or [`recording`]): then it is recorded by that
//! recording's [`Recorder`], and new arrays are the graph's planned
//! buffers. The choice is made once, by the caller of the step, never in
//! the step: SINGA's graph flag.
//!
//! The recorder is reached through a thread-local pointer that only
//! [`recording`] sets, for the duration of its closure, and that a guard
//! restores on the way out (a panic included). So a pointer in the slot
//! always points at a recorder that is alive and borrowed by the
//! `recording` frame below on this very thread.

// `unsafe`: the thread-local pointer to the recorder; each block says why
// it is sound.
#![allow(unsafe_code)]

use std::cell::Cell;
use std::ptr::NonNull;

use crate::dep::{AnyVar, Buffer, Device, OpCtx};
use crate::engine::{Engine, Graph, Ops, Recorder};
use crate::error::{BoxError, Error};

thread_local! {
    /// The recorder of the innermost [`recording`] on this thread. Its
    /// lifetime is erased: see the module docs for why a pointer here is
    /// alive.
    static RECORDING: Cell<Option<NonNull<Recorder<'static>>>> = const { Cell::new(None) };
}

/// Records a graph from code written on arrays: `f` runs once, and every
/// array operation it makes on this thread is recorded instead of pushed
/// (see [`Engine::record`]). Arrays made inside are the graph's planned
/// intermediates; arrays from outside (parameters, inputs, outputs) are
/// its boundary, read and updated in place at each replay.
///
/// An intermediate cannot be read outside its graph: write what you need
/// into an array made outside ([`Array::assign`](super::Array::assign)).
///
/// ```
/// use depflow::{Engine, Error, nd};
///
/// /// `y = 2x + 1`: the same function, eager or recorded.
/// fn step(x: &nd::Array, y: &nd::Array) -> Result<(), Error> {
///     let t = x.mul_scalar(2.0)?; // an intermediate when recorded
///     y.assign(&t.add_scalar(1.0)?)
/// }
///
/// let engine = Engine::new();
/// let arrays = nd::Arrays::new(&engine);
/// let x = arrays.from_vec(vec![1.0, 2.0], &[2])?;
/// let (eager, replayed) = (arrays.zeros(&[2])?, arrays.zeros(&[2])?);
/// step(&x, &eager)?;
/// let graph = nd::record(&engine, || step(&x, &replayed))?;
/// graph.replay().wait()?;
/// assert_eq!(eager.to_vec().wait()?, [3.0, 5.0]);
/// assert_eq!(replayed.to_vec().wait()?, [3.0, 5.0]);
/// # Ok::<(), Error>(())
/// ```
///
/// # Errors
///
/// As for [`Engine::record`]: what `f` returns, and the recording's own
/// errors.
pub fn record<F, E>(engine: &Engine, f: F) -> Result<Graph, Error>
where
    F: FnOnce() -> Result<(), E>,
    E: Into<BoxError>,
{
    engine.record(|rec| recording(rec, f))
}

/// Runs `f` with every array operation it makes on this thread recorded by
/// `rec`: for array code inside a recording that also records ops of its
/// own ([`Engine::record`]). [`record`] is this on a new recording.
pub fn recording<R>(rec: &Recorder<'_>, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<NonNull<Recorder<'static>>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            RECORDING.with(|slot| slot.set(self.0));
        }
    }
    let pointer = NonNull::from(rec).cast::<Recorder<'static>>();
    let _restore = Restore(RECORDING.with(|slot| slot.replace(Some(pointer))));
    f()
}

/// Whether array operations on this thread are being recorded.
pub fn is_recording() -> bool {
    RECORDING.with(|slot| slot.get().is_some())
}

/// Calls `f` with the recorder of this thread's innermost recording, if
/// any.
fn with_recorder<R>(f: impl FnOnce(Option<&Recorder<'_>>) -> R) -> R {
    match RECORDING.with(|slot| slot.get()) {
        // SAFETY: a pointer in the slot was set by a `recording` frame of
        // this thread from a `&Recorder` it holds until it restores the
        // slot, and that frame is below this one (the slot is
        // thread-local); the reference does not escape `f`, which returns
        // before that frame does.
        Some(pointer) => f(Some(unsafe { pointer.as_ref() })),
        None => f(None),
    }
}

/// A new buffer of `len` floats for an operation's result: the engine's
/// own, or a planned buffer of the recording.
pub(super) fn new_buffer(engine: &Engine, len: usize) -> Buffer<f32> {
    with_recorder(|rec| match rec {
        Some(rec) => rec.buffer(len),
        None => engine.buffer(len),
    })
}

/// Pushes (or records) an op on `device` that reads `reads`, mutates
/// `mutates` and runs `body`.
pub(super) fn submit<F>(
    engine: &Engine,
    device: Device,
    name: &'static str,
    reads: &[&dyn AnyVar],
    mutates: &[&dyn AnyVar],
    body: F,
) -> Result<(), Error>
where
    F: Fn(&OpCtx) -> Result<(), BoxError> + Send + Sync + 'static,
{
    with_recorder(|rec| match rec {
        Some(rec) => submit_to(rec, device, name, reads, mutates, body),
        None => submit_to(engine, device, name, reads, mutates, body).map(drop),
    })
}

fn submit_to<O: Ops, F>(
    ops: &O,
    device: Device,
    name: &'static str,
    reads: &[&dyn AnyVar],
    mutates: &[&dyn AnyVar],
    body: F,
) -> Result<O::Handle<()>, Error>
where
    F: Fn(&OpCtx) -> Result<(), BoxError> + Send + Sync + 'static,
{
    ops.op()
        .name(name)
        .on(device)
        .reads(reads)
        .mutates(mutates)
        .run(body)
}
