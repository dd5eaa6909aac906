//! Counted resources (device memory, buffer slots, stream slots): the public
//! [`Resource`] handle and what an op that needs units carries.
//!
//! An op declares units next to its variables
//! ([`OpBuilder::uses`](crate::OpBuilder::uses),
//! [`OpBuilder::allocates`](crate::OpBuilder::allocates)). Once its variables
//! grant it, it asks the engine's [`Broker`] for all its units at once and is
//! parked, holding nothing, until they are free. Temporary units come back
//! when the op completes; allocated units stay with the output variable until
//! it is deleted, dropped, or re-allocated by a later op. See
//! [`broker`](crate::broker) for the granting order and why it cannot
//! deadlock a program that fits when run serially.

#![deny(unsafe_code)]

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::broker::{Broker, Demand, Granted, Request};
use crate::op::Runner;

/// The broker of an engine's resources, whose requests are parked ops.
pub(crate) type OpBroker = Broker<Runner>;

impl Request for Runner {
    fn demands(&self) -> &[Demand] {
        self.metadata()
            .resources()
            .map_or(&[], |r| r.demands.as_slice())
    }
}

/// A counted resource of one engine: `capacity` units that ops take while
/// they run or hand on to the variables they allocate.
///
/// Cheap to clone. Made by [`Engine::new_resource`](crate::Engine::new_resource).
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
///     .run(|_| Ok::<_, Error>(()))?
///     .wait()?;
/// assert_eq!(memory.in_use(), 2);
/// engine.delete_var(&output, drop)?.wait()?;
/// assert_eq!(memory.in_use(), 0);
/// // Asking for more than there is fails at push, not by hanging.
/// let too_much = engine.op().mutates(&[&input]).uses(&memory, 5).run(|_| Ok::<_, Error>(()));
/// assert!(matches!(too_much, Err(Error::OverCapacity { .. })));
/// # Ok::<(), Error>(())
/// ```
#[derive(Clone)]
pub struct Resource {
    pub(crate) inner: Arc<ResourceInner>,
}

pub(crate) struct ResourceInner {
    pub(crate) engine: u64,
    pub(crate) pool: usize,
    name: Cow<'static, str>,
    capacity: u64,
    /// The next request's place in push order; drawn under the push lock.
    next_ticket: AtomicU64,
    broker: Arc<OpBroker>,
}

impl Resource {
    pub(crate) fn new(
        engine: u64,
        name: Cow<'static, str>,
        capacity: u64,
        broker: &Arc<OpBroker>,
    ) -> Self {
        let pool = broker.add_pool(name.as_ref(), capacity);
        Self {
            inner: Arc::new(ResourceInner {
                engine,
                pool,
                name,
                capacity,
                next_ticket: AtomicU64::new(0),
                broker: broker.clone(),
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
        let (capacity, free) = self.inner.broker.units(self.inner.pool);
        capacity - free
    }

    /// Gives `amount` units back (a variable that held them is gone) and
    /// dispatches the ops that now fit.
    pub(crate) fn give_back(&self, amount: u64) {
        dispatch(self.inner.broker.release([(self.inner.pool, amount)]));
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

/// Units a deleted variable held: they go back when this is dropped, after
/// the variable's value has been recycled or freed.
pub(crate) struct HeldUnits(pub(crate) Vec<(Resource, u64)>);

impl Drop for HeldUnits {
    fn drop(&mut self) {
        for (resource, units) in self.0.drain(..) {
            resource.give_back(units);
        }
    }
}

/// Units an op hands on to one of its mutated variables.
pub(crate) struct Lasting {
    /// Index into the op's `demands`.
    pub(crate) demand: usize,
    pub(crate) amount: u64,
    /// Index into the op's edges.
    pub(crate) edge: usize,
}

/// What an op with resource demands carries.
pub(crate) struct OpResources {
    /// One per resource, tickets filled in at push (under the push lock).
    pub(crate) demands: Few<Demand>,
    /// The resource of each demand.
    pub(crate) resources: Few<Resource>,
    pub(crate) lasting: Vec<Lasting>,
    /// The units were granted (set before the op is dispatched).
    held: AtomicBool,
    /// The op failed: nothing is handed on.
    failed: AtomicBool,
    /// On a stream device: the units to give back once the op's device
    /// work is done (its outputs took theirs when the work was enqueued).
    pub(crate) deferred: crate::loom::sync::Mutex<Returns>,
}

impl OpResources {
    pub(crate) fn new() -> Self {
        Self {
            demands: Few::default(),
            resources: Few::default(),
            lasting: Vec::new(),
            held: AtomicBool::new(false),
            failed: AtomicBool::new(false),
            deferred: crate::loom::sync::Mutex::default(),
        }
    }

    /// Adds `amount` units of `resource`; lasting ones are handed on to the
    /// op's allocation number `allocation` (the builder turns it into an
    /// edge index).
    pub(crate) fn add(&mut self, resource: &Resource, amount: u64, allocation: Option<usize>) {
        let i = match self.resources.iter().position(|r| r == resource) {
            Some(i) => i,
            None => {
                self.resources.push(resource.clone());
                self.demands
                    .push(Demand::new(resource.inner.pool, 0, false, 0));
                self.resources.len() - 1
            }
        };
        let demand = &mut self.demands.as_mut_slice()[i];
        demand.amount += amount;
        if let Some(edge) = allocation {
            demand.lasting = true;
            self.lasting.push(Lasting {
                demand: i,
                amount,
                edge,
            });
        }
    }

    /// Merges allocations of one resource to one variable (once `edge`
    /// holds edge indices).
    pub(crate) fn merge_lasting(&mut self) {
        let mut i = 0;
        while i < self.lasting.len() {
            let (demand, edge) = (self.lasting[i].demand, self.lasting[i].edge);
            if let Some(j) = self.lasting[..i]
                .iter()
                .position(|l| l.demand == demand && l.edge == edge)
            {
                self.lasting[j].amount += self.lasting.remove(i).amount;
            } else {
                i += 1;
            }
        }
    }

    /// The first demand above its resource's capacity.
    pub(crate) fn over_capacity(&self) -> Option<(&Resource, u64)> {
        self.demands
            .iter()
            .zip(&self.resources)
            .find(|(d, r)| d.amount > r.capacity())
            .map(|(d, r)| (r, d.amount))
    }

    /// Draws the op's place in push order on each resource.
    ///
    /// Called under the engine's push lock, in the same critical section that
    /// links the op into its variables' chains: ticket order then agrees with
    /// the order of every chain, so an older ticket never waits on a younger
    /// one through a variable.
    pub(crate) fn draw_tickets(&self) {
        for (d, r) in self.demands.iter().zip(&self.resources) {
            let ticket = r.inner.next_ticket.fetch_add(1, Ordering::Relaxed);
            d.ticket.store(ticket, Ordering::Relaxed);
        }
    }

    pub(crate) fn mark_held(&self) {
        self.held.store(true, Ordering::Relaxed);
    }

    pub(crate) fn is_held(&self) -> bool {
        self.held.load(Ordering::Relaxed)
    }

    pub(crate) fn mark_failed(&self) {
        self.failed.store(true, Ordering::Relaxed);
    }

    pub(crate) fn failed(&self) -> bool {
        self.failed.load(Ordering::Relaxed)
    }
}

/// A list stored inline while it has at most one element: most ops need
/// one resource, and an allocation per list would double their cost.
pub(crate) enum Few<T> {
    One(Option<T>),
    Many(Vec<T>),
}

impl<T> Default for Few<T> {
    fn default() -> Self {
        Few::One(None)
    }
}

impl<T> Few<T> {
    pub(crate) fn push(&mut self, value: T) {
        match self {
            Few::One(slot @ None) => *slot = Some(value),
            Few::One(Some(_)) => {
                let Few::One(Some(first)) = std::mem::replace(self, Few::Many(Vec::new())) else {
                    unreachable!()
                };
                *self = Few::Many(vec![first, value]);
            }
            Few::Many(values) => values.push(value),
        }
    }

    pub(crate) fn as_slice(&self) -> &[T] {
        match self {
            Few::One(one) => one.as_slice(),
            Few::Many(values) => values,
        }
    }

    pub(crate) fn as_mut_slice(&mut self) -> &mut [T] {
        match self {
            Few::One(one) => one.as_mut_slice(),
            Few::Many(values) => values,
        }
    }

    pub(crate) fn iter(&self) -> std::slice::Iter<'_, T> {
        self.as_slice().iter()
    }

    pub(crate) fn len(&self) -> usize {
        self.as_slice().len()
    }
}

impl<'a, T> IntoIterator for &'a Few<T> {
    type Item = &'a T;
    type IntoIter = std::slice::Iter<'a, T>;
    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl<T> FromIterator<T> for Few<T> {
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> Self {
        let mut few = Few::default();
        iter.into_iter().for_each(|v| few.push(v));
        few
    }
}

/// Units to give back: (pool, amount) pairs.
pub(crate) type Returns = Few<(usize, u64)>;

impl<T> std::ops::Index<usize> for Few<T> {
    type Output = T;
    fn index(&self, i: usize) -> &T {
        &self.as_slice()[i]
    }
}

/// Hands granted ops to their executors (after the broker's lock is gone).
pub(crate) fn dispatch(granted: Granted<Runner>) {
    for runner in granted {
        if let Some(r) = runner.metadata().resources() {
            r.mark_held();
        }
        crate::op::dispatch(runner);
    }
}
