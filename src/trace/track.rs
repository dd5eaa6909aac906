//! The optional registry of unfinished ops behind
//! [`Engine::diagnostics`](crate::Engine::diagnostics) (see `diag`), fed by
//! the engine's lifecycle hooks (pushed, granted its units, started,
//! suspended and resumed, finished), and of the variables holding units,
//! fed by the engine's ledger; with the engine's progress (how many ops
//! started or ended, and when last), which its watchdog reads.
//!
//! It also learns which ops' handles an op's async body awaits: the start
//! and resume hooks mark the thread as polling that op's body
//! (`POLLING`), a handle of the same engine found pending in that poll
//! notes itself there ([`note_awaited`], from the engine's `OpHandle`),
//! and the suspend hook, on the same thread right after the poll, moves
//! the notes into the op's entry. Only a tracking engine marks a thread,
//! so an untracked one pays a thread-local read per pending handle polled
//! inside an op, nothing more.
//!
//! It exists only when the engine tracks its ops: an untracked engine never
//! reads the clock or takes this lock.
//!
//! The one `unsafe` block: a report reads the registered ops, which are
//! alive while registered.

// `unsafe`: reading the registered ops, alive while registered; each block says why it is sound.
#![allow(unsafe_code)]

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use super::diag::{OpReport, OpState, ResourceReport, blockers};
use crate::dep::{OpBlock, with_current_op};
use crate::error::VarId;
use crate::loom::sync::{Mutex, MutexGuard};

/// Where a registered op is, as the hooks last told.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Pushed, its body not started: waiting for variables, units or a
    /// worker (the report tells which).
    Pushed,
    /// Its body is being polled (or a stream op's device work runs).
    Running,
    /// Its async body returned `Pending`.
    Awaiting,
}

/// One registered op.
struct Entry {
    /// Its place in push order.
    number: u64,
    pushed: Instant,
    phase: Phase,
    /// When it entered `phase` (its push, start, resumption or suspension).
    since: Instant,
    /// The broker granted it its units (it holds them until it finishes).
    holds_units: bool,
    /// While `Awaiting`: the ops (push numbers) whose handles its body found
    /// pending in its last poll.
    awaits: Vec<u64>,
}

struct Registry {
    next: u64,
    /// Unfinished ops by address.
    ops: HashMap<usize, Entry>,
    /// Units held by variables: (pool, variable) to amount.
    held: BTreeMap<(usize, VarId), u64>,
    /// Ops started or ended so far, and when the last did (or when the
    /// tracker was made).
    progress: u64,
    last_progress: Instant,
}

/// Unfinished ops by address, the variables holding units, and progress.
pub(crate) struct Tracker {
    registry: Mutex<Registry>,
    /// Per device (by index), how many ops can run at once: a pool's
    /// threads; `None` where the engine cannot tell (inline, custom, tokio
    /// and stream devices).
    workers: Box<[Option<usize>]>,
}

crate::loom::thread::thread_local! {
    /// The op whose body this thread is polling for a tracking engine (its
    /// address; 0 for none), and the ops whose handles that poll found
    /// pending (addresses).
    static POLLING: RefCell<(usize, Vec<usize>)> = const { RefCell::new((0, Vec::new())) };
}

/// Notes that the body running on this thread awaits `awaited`'s handle,
/// which is pending; the suspend hook of a tracking engine that sees
/// `awaited` among its ops records it. At most 8 per poll (a body awaiting
/// more at once is reported by its first 8).
pub(crate) fn note_awaited(awaited: &OpBlock) {
    let _ = POLLING.try_with(|polling| {
        let Ok(mut polling) = polling.try_borrow_mut() else {
            return;
        };
        // Only for the op the hooks marked, and only while its body (not
        // one nested in it, of another engine) is the thread's current op.
        if polling.0 == 0 || !with_current_op(|op| op.is_some_and(|op| key(op) == polling.0)) {
            return;
        }
        let awaited = key(awaited);
        if polling.1.len() < 8 && !polling.1.contains(&awaited) {
            polling.1.push(awaited);
        }
    });
}

/// Marks this thread as polling `op`'s body (0: none), dropping notes left
/// from before; returns the notes of the op marked until now if that was
/// `taking`.
fn mark_polling(op: usize, taking: usize, out: &mut Vec<usize>) {
    let _ = POLLING.try_with(|polling| {
        if let Ok(mut polling) = polling.try_borrow_mut() {
            if taking != 0 && polling.0 == taking {
                out.append(&mut polling.1);
            }
            polling.0 = op;
            polling.1.clear();
        }
    });
}

fn key(op: &OpBlock) -> usize {
    std::ptr::from_ref(op) as usize
}

impl Tracker {
    /// A tracker for an engine whose devices run this many ops at once
    /// (see `workers`).
    pub(crate) fn new(workers: Box<[Option<usize>]>) -> Self {
        Self {
            registry: Mutex::new(Registry {
                next: 0,
                ops: HashMap::new(),
                held: BTreeMap::new(),
                progress: 0,
                last_progress: Instant::now(),
            }),
            workers,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Registry> {
        self.registry.lock()
    }

    /// Per device, how many ops it can run at once, where known.
    pub(crate) fn workers(&self) -> &[Option<usize>] {
        &self.workers
    }

    /// How many ops have started or ended so far, and how long ago the last
    /// one did (or the tracker was made).
    pub(crate) fn progress(&self) -> (u64, Duration) {
        let registry = self.lock();
        (registry.progress, registry.last_progress.elapsed())
    }

    /// Registers an op being pushed (before it can run).
    pub(crate) fn add(&self, op: &OpBlock) {
        let pushed = Instant::now();
        let mut registry = self.lock();
        let number = registry.next;
        registry.next += 1;
        registry.ops.insert(
            key(op),
            Entry {
                number,
                pushed,
                phase: Phase::Pushed,
                since: pushed,
                holds_units: false,
                awaits: Vec::new(),
            },
        );
    }

    fn set(&self, op: &OpBlock, f: impl FnOnce(&mut Entry)) {
        if let Some(entry) = self.lock().ops.get_mut(&key(op)) {
            f(entry);
        }
    }

    /// The op got its units.
    pub(crate) fn granted(&self, op: &OpBlock) {
        self.set(op, |e| e.holds_units = true);
    }

    /// The op's body starts, or resumes after awaiting (on this thread,
    /// which is about to poll it).
    pub(crate) fn running(&self, op: &OpBlock) {
        mark_polling(key(op), 0, &mut Vec::new());
        let now = Instant::now();
        let mut registry = self.lock();
        let Some(e) = registry.ops.get_mut(&key(op)) else {
            return;
        };
        let started = e.phase == Phase::Pushed;
        e.phase = Phase::Running;
        e.since = now;
        e.awaits.clear();
        if started {
            registry.progress += 1;
            registry.last_progress = now;
        }
    }

    /// The op's async body awaits (its poll on this thread just returned).
    pub(crate) fn awaiting(&self, op: &OpBlock) {
        let mut awaited = Vec::new();
        mark_polling(0, key(op), &mut awaited);
        let now = Instant::now();
        let mut registry = self.lock();
        // The awaited ops of this engine, by push number (a handle of
        // another engine, or of an op that ended since, is not found).
        let awaits: Vec<u64> = awaited
            .iter()
            .filter_map(|a| registry.ops.get(a).map(|e| e.number))
            .collect();
        if let Some(e) = registry.ops.get_mut(&key(op)) {
            e.phase = Phase::Awaiting;
            e.since = now;
            e.awaits = awaits;
        }
    }

    /// Unregisters an op that ended (before its block can be freed).
    pub(crate) fn remove(&self, op: &OpBlock) {
        let now = Instant::now();
        let mut registry = self.lock();
        registry.ops.remove(&key(op));
        registry.progress += 1;
        registry.last_progress = now;
    }

    /// `var` holds `amount` units of `pool` now (0: none).
    pub(crate) fn holding(&self, pool: usize, var: VarId, amount: u64) {
        let mut registry = self.lock();
        if amount == 0 {
            registry.held.remove(&(pool, var));
        } else {
            registry.held.insert((pool, var), amount);
        }
    }

    /// Every registered op in push order; `parked` are the addresses of the
    /// ops the broker holds. Adds who holds units to `resources` (by pool).
    /// Each report's `awaited` are places in the returned list.
    pub(crate) fn report(
        &self,
        parked: &HashSet<usize>,
        resources: &mut [ResourceReport],
    ) -> Vec<OpReport> {
        let now = Instant::now();
        let registry = self.lock();
        let mut ops: Vec<(&Entry, usize)> = registry.ops.iter().map(|(&a, e)| (e, a)).collect();
        ops.sort_unstable_by_key(|(e, _)| e.number);
        // Each op's report, and the push numbers of the ops it awaits.
        let (mut reports, awaited): (Vec<OpReport>, Vec<Vec<u64>>) = ops
            .into_iter()
            .map(|(entry, addr)| {
                // SAFETY: a registered op is alive: it unregisters itself when
                // it ends (the `on_ended` hook), before the anchor that
                // keeps it alive can be dropped, and we hold the lock that
                // unregistering takes.
                let op = unsafe { &*(addr as *const OpBlock) };
                let mut report = OpReport::of(op, Some(entry.number));
                report.waited = Some(now.saturating_duration_since(entry.pushed));
                report.in_state = Some(now.saturating_duration_since(entry.since));
                report.state = match entry.phase {
                    Phase::Running => OpState::Running,
                    Phase::Awaiting => OpState::Awaiting,
                    Phase::Pushed if op.ungranted() > 0 => OpState::Variables(Vec::new()),
                    Phase::Pushed if parked.contains(&addr) => {
                        OpState::Units(OpReport::units_of(op))
                    }
                    Phase::Pushed => OpState::Queued,
                };
                if entry.holds_units
                    && let Some(units) = op.units()
                {
                    for (resource, demand) in units.demands() {
                        if let Some(r) = resources.get_mut(resource.pool()) {
                            r.held_by_ops.push((report.label(), demand.amount));
                            report.holds.push((r.name.clone(), demand.amount));
                        }
                    }
                }
                let awaited = match entry.phase {
                    Phase::Awaiting => entry.awaits.clone(),
                    _ => Vec::new(),
                };
                (report, awaited)
            })
            .unzip();
        for (&(pool, var), &amount) in &registry.held {
            if let Some(r) = resources.get_mut(pool) {
                r.held_by_vars.push((var, amount));
            }
        }
        blockers(&mut reports);
        // The awaited ops, by their place in the report, and named.
        let places: HashMap<u64, usize> = reports
            .iter()
            .enumerate()
            .filter_map(|(i, r)| Some((r.number?, i)))
            .collect();
        for (i, numbers) in awaited.into_iter().enumerate() {
            for n in numbers {
                if let Some(&place) = places.get(&n) {
                    let label = reports[place].label();
                    reports[i].awaited.push(place);
                    reports[i].awaits.push(label);
                }
            }
        }
        reports
    }
}
