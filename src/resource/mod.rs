//! Counted resources (device memory, buffer slots, stream slots): the public
//! [`Resource`] handle, and the units a variable holds.
//!
//! An op declares units next to its variables
//! ([`OpBuilder::uses`](crate::OpBuilder::uses),
//! [`OpBuilder::allocates`](crate::OpBuilder::allocates)). Once its variables
//! grant it, it asks the engine for all its units at once and is parked,
//! holding nothing, until they are free. Temporary units come back when the
//! op completes; allocated units stay with the output variable ([`Held`])
//! until it is deleted, dropped, or re-allocated by a later op. The engine
//! keeps the accounts (a `core::tickets` broker over its
//! ops), which a resource reaches through its [`Ledger`]: see `tickets` for
//! the granting order and why it cannot deadlock a program that fits when run
//! serially (unless an op waits inside its body, holding units, for an op
//! that needs them: [`Resource`] states the condition). A stream op hands
//! its allocated units on when it enqueues its work, [`Revocable`]ly: they
//! come back if the work fails.
//!
//! May import: `crate::loom`, `crate::error`. Knows no op: what an op asks for is the
//! dependency layer's (`dep::units`), who grants it the engine's.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use crate::error::VarId;
use crate::loom::sync::atomic::{
    AtomicU64,
    Ordering::{AcqRel, Acquire, Relaxed},
};

/// Where a resource's units are accounted: the engine's broker, which hands
/// what a returned unit makes room for to its executors.
pub(crate) trait Ledger: Send + Sync {
    /// Units of `pool` free now.
    fn free(&self, pool: usize) -> u64;

    /// Gives `amount` units of `pool` back, and starts what now fits.
    fn give_back(&self, pool: usize, amount: u64);

    /// Whether the ledger keeps a register of the variables holding units
    /// (for diagnostics): then [`holding`](Self::holding) is called as they
    /// change. Asked once, when a resource is made.
    fn tracks_holders(&self) -> bool {
        false
    }

    /// `holder` now holds `amount` units of `pool` (0: none).
    fn holding(&self, _pool: usize, _holder: VarId, _amount: u64) {}
}

/// A counted resource of one engine: `capacity` units that ops take while
/// they run or hand on to the variables they allocate.
///
/// Cheap to clone. Made by [`Engine::new_resource`](crate::Engine::new_resource).
///
/// # When a program cannot deadlock on units
///
/// Ops that [allocate](crate::OpBuilder::allocates) are granted their units
/// in push order; ops that only [use](crate::OpBuilder::uses) units may
/// take them ahead of older ops still waiting for theirs (which lets more
/// programs complete). Hence: **a program that fits when run serially, in
/// push order, never deadlocks — provided no op waits inside its body,
/// while it holds units, for another op that needs units of the same
/// resource.** The engine cannot see such a wait (an async body awaiting
/// another op's handle, a `wait_for_var` or `wait_all`; any body blocking on
/// a channel or lock another op fills). If the op waited for is older and
/// needs some of the units the waiting op took ahead of it, each waits for
/// the other, although serially (the older op first) the program fits.
/// Declare such a dependency through a variable instead: an op that reads
/// a variable the other mutates is granted, and takes its units, only
/// after the other completed. With
/// [`track_ops`](crate::EngineBuilder::track_ops),
/// [`Engine::diagnostics`](crate::Engine::diagnostics) names the suspects:
/// ops awaiting inside their body while holding units a parked op needs.
/// A program that does not fit serially may deadlock: ops wait for units
/// that variables hold, which only ops pushed after them give back (a
/// delete, an op allocating the variable again), and those wait for them.
/// The diagnostics name that too, as a [`Cycle`](crate::Cycle).
///
/// ```
/// use depflow::{Engine, Error};
///
/// let engine = Engine::new();
/// let memory = engine.new_resource("memory", 2);
/// let (a, b) = (engine.new_var(), engine.new_var());
/// let older = engine.op().mutates(&[&a]).uses(&memory, 2).run(|_| Ok(()))?;
/// // Waits for `older` through `a`, not by awaiting its handle while
/// // holding a unit `older` may still need.
/// engine
///     .op()
///     .reads(&[&a])
///     .mutates(&[&b])
///     .uses(&memory, 1)
///     .run_async(move |_| async move { Ok::<_, depflow::BoxError>(older.await?) })?
///     .wait()?;
/// # Ok::<(), Error>(())
/// ```
///
/// # Example
///
/// ```
/// use depflow::{Engine, Error};
///
/// let engine = Engine::new();
/// let memory = engine.new_resource("gpu0 memory", 4);
/// let (input, output) = (engine.new_var(), engine.new_var());
/// // Runs only when 3 units are free; gives 1 back when it completes and
/// // keeps 2 with `output` until `output` is deleted.
/// engine
///     .op()
///     .reads(&[&input])
///     .mutates(&[&output])
///     .uses(&memory, 1)
///     .allocates(&memory, 2, &output)
///     .run(|_| Ok(()))?
///     .wait()?;
/// assert_eq!(memory.in_use(), 2);
/// engine.delete_var(&output, drop)?.wait()?;
/// assert_eq!(memory.in_use(), 0);
/// // Asking for more than there is fails at push, not by hanging.
/// let too_much = engine.op().mutates(&[&input]).uses(&memory, 5).run(|_| Ok(()));
/// assert!(matches!(too_much, Err(Error::OverCapacity { .. })));
/// # Ok::<(), Error>(())
/// ```
#[derive(Clone)]
pub struct Resource {
    inner: Arc<ResourceInner>,
}

struct ResourceInner {
    /// The id of the engine whose ops may use it.
    engine: u64,
    /// Its pool in the engine's ledger.
    pool: usize,
    name: Cow<'static, str>,
    capacity: u64,
    /// The next request's place in push order; drawn under the engine's
    /// push lock.
    next_ticket: AtomicU64,
    ledger: Arc<dyn Ledger>,
    /// The ledger registers holders (`Ledger::tracks_holders`).
    tracks_holders: bool,
}

impl Resource {
    /// The handle of pool `pool` of engine `engine`'s ledger.
    pub(crate) fn new(
        engine: u64,
        pool: usize,
        name: Cow<'static, str>,
        capacity: u64,
        ledger: Arc<dyn Ledger>,
    ) -> Self {
        Self {
            inner: Arc::new(ResourceInner {
                engine,
                pool,
                name,
                capacity,
                next_ticket: AtomicU64::new(0),
                tracks_holders: ledger.tracks_holders(),
                ledger,
            }),
        }
    }

    /// The name given at creation.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// How many units there are in all.
    pub fn capacity(&self) -> u64 {
        self.inner.capacity
    }

    /// How many units running ops and live variables hold now.
    pub fn in_use(&self) -> u64 {
        self.inner.capacity - self.inner.ledger.free(self.inner.pool)
    }

    /// The id of the engine it belongs to.
    #[inline]
    pub(crate) fn engine(&self) -> u64 {
        self.inner.engine
    }

    /// Its pool in the engine's ledger.
    #[inline]
    pub(crate) fn pool(&self) -> usize {
        self.inner.pool
    }

    /// The next place in push order among the requests for it; called
    /// under the engine's push lock, so that ticket order agrees with every
    /// variable's order.
    pub(crate) fn draw_ticket(&self) -> u64 {
        self.inner.next_ticket.fetch_add(1, Relaxed)
    }

    /// `n` consecutive places in push order (a replay's recorded ops'),
    /// the first returned; called under the engine's push lock.
    pub(crate) fn draw_tickets(&self, n: u64) -> u64 {
        self.inner.next_ticket.fetch_add(n, Relaxed)
    }

    /// Gives `amount` units back (a variable that held them is gone) and
    /// starts the ops that now fit.
    pub(crate) fn give_back(&self, amount: u64) {
        self.inner.ledger.give_back(self.inner.pool, amount);
    }

    /// Tells a ledger that registers holders that `holder` holds `amount`
    /// units now (a branch on a constant otherwise).
    #[inline]
    fn note_holder(&self, holder: VarId, amount: u64) {
        if self.inner.tracks_holders {
            self.inner.ledger.holding(self.inner.pool, holder, amount);
        }
    }
}

impl PartialEq for Resource {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl Eq for Resource {}

impl fmt::Debug for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Resource")
            .field("name", &self.name())
            .field("capacity", &self.capacity())
            .field("in_use", &self.in_use())
            .finish()
    }
}

/// Units held by something that is not an op (a variable, `holder`): given
/// back when dropped, so after the value they stand for has been recycled
/// or freed.
#[derive(Debug)]
pub(crate) struct Held {
    holder: VarId,
    units: Vec<(Resource, Amount)>,
}

/// How many units a [`Held`] holds of one resource.
#[derive(Debug)]
enum Amount {
    /// Its own (an op on the host, which completed, handed them on).
    Own(u64),
    /// Shared with the stream op that handed them on before its device
    /// work completed, which takes them back ([`Revocable::revoke`]) if that
    /// work fails: whoever of the two swaps the amount out first gives it
    /// back.
    Revocable(Arc<AtomicU64>),
}

impl Amount {
    /// Takes the units out (to give back): 0 if revoked already.
    fn take(&mut self) -> u64 {
        match self {
            Amount::Own(n) => std::mem::take(n),
            Amount::Revocable(n) => n.swap(0, AcqRel),
        }
    }
}

impl Held {
    /// Nothing yet, held by `holder`.
    pub(crate) fn new(holder: VarId) -> Self {
        Self {
            holder,
            units: Vec::new(),
        }
    }

    /// Holds `amount` units of `resource`, instead of what was held of it;
    /// returns the amount replaced (to give back).
    pub(crate) fn replace(&mut self, resource: &Resource, amount: u64) -> Option<u64> {
        self.put(resource, amount, Amount::Own(amount))
    }

    /// Holds the units of `units`, instead of what was held of its resource,
    /// until they are revoked; returns the amount replaced (to give back).
    pub(crate) fn replace_revocable(&mut self, units: &Revocable) -> Option<u64> {
        let amount = units.units.load(Acquire);
        self.put(
            &units.resource,
            amount,
            Amount::Revocable(units.units.clone()),
        )
    }

    fn put(&mut self, resource: &Resource, amount: u64, new: Amount) -> Option<u64> {
        resource.note_holder(self.holder, amount);
        match self.units.iter_mut().find(|(r, _)| r == resource) {
            Some((_, held)) => Some(std::mem::replace(held, new).take()),
            None => {
                self.units.push((resource.clone(), new));
                None
            }
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        for (resource, mut units) in self.units.drain(..) {
            resource.note_holder(self.holder, 0);
            match units.take() {
                0 => {} // revoked
                units => resource.give_back(units),
            }
        }
    }
}

/// Units a stream op handed on to a variable (`holder`) when it enqueued
/// its device work, which it takes back if that work fails: as a host op
/// that fails hands nothing on. Cheap to clone (the variable's [`Held`]
/// shares the count).
#[derive(Clone, Debug)]
pub(crate) struct Revocable {
    resource: Resource,
    holder: VarId,
    units: Arc<AtomicU64>,
}

impl Revocable {
    /// `amount` units of `resource`, to be held by `holder`.
    pub(crate) fn new(resource: Resource, holder: VarId, amount: u64) -> Self {
        Self {
            resource,
            holder,
            units: Arc::new(AtomicU64::new(amount)),
        }
    }

    /// Gives the units back now, unless the variable gave them back already
    /// (it was deleted, dropped, or allocated again).
    pub(crate) fn revoke(&self) {
        let units = self.units.swap(0, AcqRel);
        if units != 0 {
            // (A later op allocating the same variable at this very moment
            // may register its own amount just before this: the register
            // is for diagnostics only.)
            self.resource.note_holder(self.holder, 0);
            self.resource.give_back(units);
        }
    }
}
