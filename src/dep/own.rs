//! The host's own ops, which it pushes like any other on the default device:
//! deleting a variable, clearing its poison, waiting for its mutations (the
//! wait never reaches the device's executor: see [`var_wait`]).

use super::block::{Mode, OpBlock, OpSpec};
use super::body::{Body, SyncBody};
use super::ctx::OpCtx;
use super::decl::edges;
use super::var::Var;
use crate::error::{BoxError, Error};

/// The name of the op that deletes a variable (how diagnostics tell it,
/// with its mode, from every other op: `OpBlock::is_deletion`).
pub(crate) const DELETE_VAR: &str = "delete_var";

impl OpBlock {
    /// Whether the op is the host's delete of the variable it mutates
    /// (`deletion`): its end gives back the units that variable held.
    #[inline]
    pub(crate) fn is_deletion(&self) -> bool {
        self.is_maintenance() && self.static_name() == Some(DELETE_VAR)
    }
}

/// The op that deletes `var` (of engine `engine`) after every op pushed on
/// it so far: when it runs, the variable's value goes to `recycle`; the
/// units it held go back once `recycle` returns (or unwinds). The pusher
/// marks `var` deleted ([`mark_deleted`]) once the op is admitted, before
/// it is linked: so a refused delete deletes nothing.
///
/// # Errors
///
/// As for any declaration of `var` (so [`Error::Deleted`] if a delete was
/// already pushed).
pub(crate) fn deletion<T, F>(
    var: &Var<T>,
    engine: u64,
    recycle: F,
) -> Result<(OpSpec, impl Body<Output = ()>), Error>
where
    T: Send + Sync + 'static,
    F: FnOnce(T) + Send + 'static,
{
    let edges = edges(&[], &[var], engine)?;
    let key = var.key();
    let body = SyncBody(Some(move |ctx: &OpCtx| -> Result<(), BoxError> {
        let (value, _units) = ctx.delete(key)?;
        if let Some(value) = value {
            recycle(value);
        }
        Ok(())
    }));
    Ok((OpSpec::own(edges, DELETE_VAR, Mode::Maintenance), body))
}

/// Marks `var` deleted: later pushes on it are refused. Called by the
/// pusher of its [`deletion`] once that is admitted, before it is linked.
///
/// # Errors
///
/// [`Error::Deleted`] if a delete was already pushed (then nothing changed).
pub(crate) fn mark_deleted<T>(var: &Var<T>) -> Result<(), Error> {
    match var.core().mark_deleted() {
        true => Ok(()),
        false => Err(Error::Deleted(var.id())),
    }
}

/// The op that clears the poison of `var` (of engine `engine`), in push
/// order: it runs even on a poisoned variable.
pub(crate) fn unpoisoning<T>(
    var: &Var<T>,
    engine: u64,
) -> Result<(OpSpec, impl Body<Output = ()>), Error>
where
    T: Send + Sync + 'static,
{
    let edges = edges(&[], &[var], engine)?;
    let key = var.key();
    let body = SyncBody(Some(move |ctx: &OpCtx| -> Result<(), BoxError> {
        ctx.clear_poison(key)?;
        Ok(())
    }));
    Ok((OpSpec::own(edges, "clear_poison", Mode::Maintenance), body))
}

/// The op that waits for every mutation of `var` (of engine `engine`)
/// pushed so far: a read that does nothing, and resolves to the variable's
/// poison if it has one (or to [`Error::Deleted`] if a delete got in
/// first). A `Mode::Wait` op: it finishes on the thread that makes it
/// ready, so a wait on an idle variable is over within its push; the host
/// admits it outside its bound on ops in flight.
pub(crate) fn var_wait<T>(
    var: &Var<T>,
    engine: u64,
) -> Result<(OpSpec, impl Body<Output = ()>), Error>
where
    T: Send + Sync + 'static,
{
    let edges = edges(&[var], &[], engine)?;
    let body = SyncBody(Some(|_: &OpCtx| Ok::<(), BoxError>(())));
    Ok((OpSpec::own(edges, "wait_for_var", Mode::Wait), body))
}
