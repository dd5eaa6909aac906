//! Poison: whether an op may run given its inputs' states, how a failure
//! passes to what it mutates, and how device work on the variables (their
//! fences) joins in.
//!
//! An op that fails poisons the variables it mutates; a later op touching a
//! poisoned or deleted variable does not run (it is *skipped*) and passes the
//! poison on. A device write's failure is known only once its fence
//! completes: until a host op holding the write grant settles it into the
//! variable's state, the fence's failure counts as poison too.
//!
//! Every function here runs while the op holds every grant on its
//! variables: the states it reads and writes are the op's to touch (see
//! `var`'s access table).

// `unsafe`: variables' states, read and written under the op's grants; each block says why it is
// sound.
#![allow(unsafe_code)]

use std::sync::Arc;
use std::task::{Context, Poll};

use super::block::{OpBlock, OpEdge};
use super::var::VarState;
use crate::error::{OpFailure, VarId};

/// Why an op does not run.
pub(crate) enum Skip {
    /// `input` is poisoned by `cause` (or its last device write failed).
    Poisoned {
        input: VarId,
        cause: Arc<OpFailure>,
    },
    Deleted(VarId),
    /// Its handle cancelled it.
    Cancelled,
}

impl Skip {
    /// Why the op did not run, in words: for a poisoned input, which one,
    /// and the original failure with its op's error (as
    /// `Error::Poisoned` says it).
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    pub(crate) fn describe(&self) -> String {
        match self {
            Skip::Poisoned { input, cause } => {
                format!("input {input} was poisoned because {cause}")
            }
            Skip::Deleted(var, ..) => format!("{var} was deleted before the op ran"),
            Skip::Cancelled => "the op was cancelled before it ran".into(),
        }
    }
}

impl OpBlock {
    /// Whether the op may run: the first poisoned or deleted input, in edge
    /// order, if not. `streams`: the engine has stream devices, so failed
    /// device writes count (finding them takes a lock per variable).
    #[inline]
    pub(super) fn blocked_by(&self, streams: bool) -> Option<Skip> {
        self.blocked_by_edges(self.edges(), streams)
    }

    /// [`blocked_by`](Self::blocked_by), given the op's edges (a recorded
    /// op keeps them at hand).
    #[inline]
    pub(super) fn blocked_by_edges(&self, edges: &[OpEdge], streams: bool) -> Option<Skip> {
        if self.is_cancelled() {
            return Some(Skip::Cancelled);
        }
        for e in edges {
            // SAFETY: the op holds a grant on every edge.
            if unsafe { e.var.is_live() } {
                if streams
                    && !self.is_maintenance()
                    && let Some(failure) = e.var.fences().write_failure()
                {
                    // This variable's last device write failed: it is the
                    // input, whoever's the failure.
                    let cause = failure.into_cause();
                    return Some(Skip::Poisoned {
                        input: e.var.id(),
                        cause,
                    });
                }
                continue;
            }
            // SAFETY: as above.
            match unsafe { e.var.state() } {
                VarState::Live => {}
                VarState::Poisoned(cause) if !self.is_maintenance() => {
                    return Some(Skip::Poisoned {
                        input: e.var.id(),
                        cause,
                    });
                }
                VarState::Poisoned(_) => {}
                VarState::Deleted => return Some(Skip::Deleted(e.var.id())),
            }
        }
        None
    }

    /// The op failed (or was skipped) with `failure`: nothing is handed on,
    /// and the variables it mutates are poisoned.
    pub(super) fn fail(&self, failure: &Arc<OpFailure>) {
        if let Some(units) = self.units() {
            units.mark_failed();
        }
        for e in self.edges().iter().filter(|e| e.is_write()) {
            // SAFETY: the op holds the write grant on this variable.
            unsafe {
                if !matches!(e.var.state(), VarState::Deleted) {
                    e.var.set_state(VarState::Poisoned(failure.clone()));
                }
            }
        }
    }

    /// Ready once every fence this op must wait for on the host is done:
    /// all of them for a host op (`device` None), those of other devices
    /// for an op on stream device number `device_index`.
    pub(super) fn await_fences(&self, cx: &mut Context<'_>, device_index: Option<u16>) -> Poll<()> {
        let mut waiting = false;
        for e in self.edges() {
            e.var.fences().for_each_pending(e.is_write(), |f, _| {
                if Some(f.device_index()) != device_index && f.poll_done(cx).is_pending() {
                    waiting = true;
                }
            });
        }
        if waiting {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    }

    /// A host op holding write grants, its fences done: a failed device
    /// write becomes the variable's poison, and the fences are forgotten.
    pub(super) fn settle_fences(&self) {
        for e in self.edges().iter().filter(|e| e.is_write()) {
            if let Some(failure) = e.var.fences().settle() {
                // SAFETY: the op holds the write grant on this variable.
                unsafe {
                    if matches!(e.var.state(), VarState::Live) {
                        e.var.set_state(VarState::Poisoned(failure.into_cause()));
                    }
                }
            }
        }
    }
}
