//! Declarations to edges: what an op reads and mutates, normalised into the
//! edges it links into its variables' chains.
//!
//! Mutated variables come first, each variable once, a variable both read
//! and mutated counting as mutated. Every variable must belong to the
//! pushing engine: so all ops in one chain share one host, which is what
//! lets a grant pass the granting op's host to the granted one (see
//! `lifecycle`).

use std::collections::HashSet;

use super::block::{Edges, OpEdge};
use super::var::{AnyVar, VarCore};
use crate::core::few::Few;
use crate::error::Error;

/// Declarations of up to this many variables are normalised on the stack.
const SMALL_DECL: usize = 8;

/// Normalises a declaration of the engine with id `engine` into edges.
///
/// # Errors
///
/// [`Error::NoVars`] for empty lists, [`Error::ForeignVar`] for a variable
/// of another engine, [`Error::Deleted`] for a deleted one.
#[inline(always)]
pub(crate) fn edges(
    reads: &[&dyn AnyVar],
    mutates: &[&dyn AnyVar],
    engine: u64,
) -> Result<Edges, Error> {
    recorded_edges(reads, mutates, engine, 0)
}

/// [`edges`] for an op recorded into the graph with id `graph` (0: a
/// pushed op), which may also declare that graph's intermediates.
#[inline(always)]
pub(crate) fn recorded_edges(
    reads: &[&dyn AnyVar],
    mutates: &[&dyn AnyVar],
    engine: u64,
    graph: u64,
) -> Result<Edges, Error> {
    // Fast paths for one or two variables, the common case, inlined into
    // the push so that the variables' calls are static. The general path
    // gives the same edges; this one saves 58 to 105 instructions per push
    // (callgrind, `chain` and `seed4`).
    match (mutates, reads) {
        ([v], []) | ([], [v]) => {
            check(v.core(), engine, graph)?;
            Ok(Few::One(OpEdge::new(*v, !mutates.is_empty())))
        }
        ([a], [b]) | ([a, b], []) | ([], [a, b]) => {
            check(a.core(), engine, graph)?;
            check(b.core(), engine, graph)?;
            let a_write = !mutates.is_empty();
            let b_write = mutates.len() == 2;
            Ok(if std::ptr::eq(a.core(), b.core()) {
                Few::One(OpEdge::new(*a, a_write))
            } else {
                Few::Two([OpEdge::new(*a, a_write), OpEdge::new(*b, b_write)])
            })
        }
        _ => general(reads, mutates, engine, graph),
    }
}

/// [`edges`] for no variable, or more than two.
fn general(
    reads: &[&dyn AnyVar],
    mutates: &[&dyn AnyVar],
    engine: u64,
    graph: u64,
) -> Result<Edges, Error> {
    let all = || mutates.iter().chain(reads);
    if mutates.is_empty() && reads.is_empty() {
        return Err(Error::NoVars);
    }
    for var in all() {
        check(var.core(), engine, graph)?;
    }
    let n = mutates.len() + reads.len();
    if n <= SMALL_DECL {
        // Dedup on the stack: no allocation unless more than two remain.
        let mut kept: [Option<(&dyn AnyVar, bool)>; SMALL_DECL] = [None; SMALL_DECL];
        let mut k = 0;
        for (i, var) in all().enumerate() {
            if !kept[..k]
                .iter()
                .flatten()
                .any(|(v, _)| std::ptr::eq(v.core(), var.core()))
            {
                kept[k] = Some((*var, i < mutates.len()));
                k += 1;
            }
        }
        return Ok(Few::from_fn(k, |j| {
            let (var, write) = kept[j].expect("kept");
            OpEdge::new(var, write)
        }));
    }
    let mut seen = HashSet::new();
    Ok(all()
        .enumerate()
        .filter(|(_, var)| seen.insert(var.core() as *const VarCore))
        .map(|(i, var)| OpEdge::new(*var, i < mutates.len()))
        .collect())
}

/// Edges of an op reading `reads` and mutating `mutates`, which the
/// caller guarantees are distinct variables (a replay's op: its graph's
/// boundary, deduplicated once at analysis), so that no pass removes
/// repeats. Checked as [`edges`] checks them.
///
/// # Errors
///
/// As for [`edges`].
pub(crate) fn distinct_edges(
    reads: &[Box<dyn AnyVar>],
    mutates: &[Box<dyn AnyVar>],
    engine: u64,
) -> Result<Edges, Error> {
    let all = || {
        mutates
            .iter()
            .map(|v| (v, true))
            .chain(reads.iter().map(|v| (v, false)))
    };
    for (var, _) in all() {
        check(var.core(), engine, 0)?;
    }
    Ok(all()
        .map(|(var, write)| OpEdge::new(&**var, write))
        .collect())
}

/// Whether `core` may be declared by an op of engine `engine`, recorded
/// into graph `graph` (0: pushed).
#[inline]
fn check(core: &VarCore, engine: u64, graph: u64) -> Result<(), Error> {
    if core.engine() != engine {
        Err(Error::ForeignVar(core.id()))
    } else if core.is_deleted() {
        Err(Error::Deleted(core.id()))
    } else if core.graph() != 0 && core.graph() != graph {
        Err(Error::GraphOwned(core.id()))
    } else {
        Ok(())
    }
}
