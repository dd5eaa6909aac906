//! Counted units granted in ticket order: who may take how many units, and
//! when.
//!
//! A [`Broker`] owns *pools* (for the engine, one per
//! [`Resource`](crate::Resource): a capacity and the units free) and the
//! requests parked because their units are not free. An op reaches the broker only once all its variables have
//! granted it, so a parked op holds no units and blocks no thread; it is
//! granted when a release makes room, by the releasing thread, which hands it
//! to its executor.
//!
//! # Granting order
//!
//! A request takes all its units at once or none (all or nothing, over every
//! pool it names). Each request carries, per pool, a *ticket*: its place in
//! push order among the requests on that pool (drawn under the engine's push
//! lock, so ticket order agrees with every variable's order). Units are of two
//! kinds:
//!
//! - *temporary* units come back when the op completes. A request made only
//!   of temporary units is granted as soon as they fit, ahead of older
//!   requests that do not fit: it cannot hold anything up for long, because a
//!   running op always completes.
//! - *lasting* units are handed on to an output variable and come back only
//!   when that variable is deleted or dropped. A request with lasting units on
//!   a pool is granted only when every older request on that pool has been
//!   granted (its ticket is the pool's `base`): a newer producer never takes
//!   the room an older consumer needs.
//!
//! # Why this does not deadlock
//!
//! Take the oldest request not granted yet, `R`. Every op pushed before it
//! either holds no units or was granted, and ops complete, so `R`'s variables
//! grant it. Nothing younger than `R` holds lasting units on `R`'s pools, and
//! younger temporary units come back. So `R` waits only for lasting units of
//! older ops still alive: exactly what a serial run of the program, in push
//! order, would hold when it reaches `R`, or less (deletes may run early).
//! Hence: **if the program fits when run serially in push order, the engine
//! runs it to the end**, in parallel. Temporary requests overtaking older ones
//! only add schedules: the seed-003 program (movements `M1`, `M2` hand 1 and
//! 2 units on to buffers; computes `O1`, `O2` use 3 and 2 units and free the
//! buffers; 5 units) does not fit serially in the order M1 M2 O1 O2, yet
//! completes because `O2` overtakes `O1` (`loom-tests/tests/broker.rs` and
//! `tests/resources.rs` check every order). The price of overtaking: a large
//! temporary request can wait as long as smaller ones keep the pool busy.
//!
//! # The condition: bodies that wait for other ops
//!
//! "Younger temporary units come back" assumes that an op holding units
//! completes on its own. The engine cannot see an op's body wait for another
//! op (await its handle, a `wait_for_var` or `wait_all`, a channel or lock
//! that another op fills): if it does so while holding units, and the op it
//! waits for is older and needs some of those units, each waits for the
//! other. A serial run never gets there (the older op would have run first),
//! but a younger temporary request may overtake an older one for units
//! before the older one's variables even grant it. So the guarantee is
//! exactly: **a program that fits when run serially in push order runs to
//! the end, provided no op waits inside its body, while it holds units, for
//! an op that needs units of the same resources.** Declaring such a
//! dependency through a variable (the waiting op reads something the awaited
//! op mutates) keeps the guarantee: the waiting op is then granted its
//! variables, and asks for its units, only once the awaited op completed.
//! `Engine::diagnostics` names the suspects: ops awaiting inside their body
//! while holding units that a parked op needs.
//!
//! # Where parked requests wait
//!
//! Each pool keeps the requests parked *at* it, in arrival order. A request
//! that does not fit parks at the pool of its first unmet demand: too few
//! units free there, or a lasting demand whose turn has not come. The
//! invariant, whenever the lock is free: **every parked request's demand on
//! the pool it is parked at is unmet**, so no parked request fits, and only
//! a change to that pool can make it fit: units given back, or its `base`
//! moved by a grant or a retire (which matters only while a lasting request
//! is parked there: the pool counts them).
//!
//! So a broker call rescans only the pools it changed: a release, each pool
//! it gives units back to, at once; a grant or a retire that moves a pool's
//! `base` while a lasting request is parked there puts that pool on a
//! worklist, rescanned before the lock is released (a pool is on it at most
//! once at a time; a lasting request passed over earlier in the same rescan
//! thus gets its turn). A rescan looks at the pool's requests oldest first
//! and stops as soon as the pool has no unit free (every demand is for one
//! unit at least): a request that now fits is granted; one that fits this
//! pool but not another moves to the other pool, at its place in arrival
//! order there (that pool's next change looks at it); the others stay.
//! Requests parked at an exhausted pool thus cost nothing to the traffic of
//! other pools, and a release that grants the oldest request of its pool
//! looks at nothing else. What remains linear: a change to a pool whose free
//! units fit none of its parked requests looks at each of them.
//!
//! The granting rules above do not depend on where a request waits. Among
//! the requests parked at one pool that fit, the oldest arrival is granted
//! first; [`Broker::for_each_waiting`] lists them all, oldest arrival first.
//!
//! # Withdrawing
//!
//! A parked request may be withdrawn (its op cancelled): it then leaves
//! without units, its tickets given up as a retire's are. The request says
//! so itself, under the broker's lock, with two questions it answers from
//! a state of its own that the withdrawer changes first (for an op, its
//! status word: see `dep::start`):
//!
//! - about to park ([`Request::park`]): withdrawn already, it does not
//!   park; [`Broker::request`] gives up its tickets and hands it back
//!   ([`Asked::withdrawn`]);
//! - parked and about to be granted ([`Request::unpark`]): withdrawn
//!   meanwhile, it is *held*: it stays parked, taking nothing, until its
//!   withdrawer takes it out ([`Broker::withdraw`], which gives up its
//!   tickets).
//!
//! So a withdrawer that found its request parked (the answers and its
//! change are ordered on the request's state) finds it still in the
//! broker when it takes the lock, and only it takes it out. A held request
//! is the one exception to the invariant above, for the moment between the
//! withdrawer's change and its call: it fits, yet stays parked (and a
//! rescan looks at it again).
//!
//! The state is one mutex per engine: requests and releases are short
//! critical sections that never run an op, wake a thread or drop user data
//! (granted requests are handed back to the caller to dispatch after the lock
//! is released).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use super::few::Few;
use crate::loom::sync::Mutex;

/// One pool's share of a request.
#[derive(Debug)]
pub struct Demand {
    /// The pool's index.
    pub pool: usize,
    /// Units taken when granted; at least one.
    pub amount: u64,
    /// Whether some of the units are lasting (handed on to a variable), which
    /// makes the request wait for every older request on this pool.
    pub lasting: bool,
    /// Place among the requests on this pool, in push order. Set once, by
    /// the pusher, before the request can reach the broker (the op's trigger
    /// orders the two), hence `Relaxed`. A plain `std` atomic even under loom:
    /// it carries no synchronisation of its own.
    pub ticket: AtomicU64,
}

impl Demand {
    /// A demand of `amount` units of `pool`, with its place in push order.
    pub fn new(pool: usize, amount: u64, lasting: bool, ticket: u64) -> Self {
        Self {
            pool,
            amount,
            lasting,
            ticket: AtomicU64::new(ticket),
        }
    }

    /// Its place among the requests on its pool.
    pub fn ticket(&self) -> u64 {
        self.ticket.load(Relaxed)
    }
}

/// What the broker parks: anything that can say what it asks for, and
/// that may be withdrawn (cancelled) while it waits.
pub trait Request {
    /// At most one demand per pool.
    fn demands(&self) -> &[Demand];

    /// The request does not fit and is about to park (called under the
    /// broker's lock): [`Park::Withdrawn`] if it was withdrawn first (then
    /// it does not park: see the module docs, *Withdrawing*).
    #[inline]
    fn park(&self) -> Park {
        Park::Parked
    }

    /// The parked request now fits and is about to be granted (called
    /// under the broker's lock): [`Unpark::Held`] if it was withdrawn
    /// while parked (then it stays parked, for its withdrawer to take out
    /// with [`Broker::withdraw`]).
    #[inline]
    fn unpark(&self) -> Unpark {
        Unpark::Granted
    }
}

/// What a request about to park said ([`Request::park`]).
#[must_use = "a withdrawn request must not park"]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Park {
    /// It parks: from now on only a grant or [`Broker::withdraw`] takes it
    /// out.
    Parked,
    /// It was withdrawn before it parked: the broker gives up its tickets
    /// and hands it back ([`Asked::withdrawn`]).
    Withdrawn,
}

/// What a parked request about to be granted said ([`Request::unpark`]).
#[must_use = "a withdrawn request must not be granted"]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unpark {
    /// It is granted (and is no longer parked).
    Granted,
    /// It was withdrawn while parked: it stays parked, holding nothing,
    /// until its withdrawer takes it out.
    Held,
}

/// What [`Broker::request`] did with a request.
#[must_use = "granted requests must be dispatched"]
#[derive(Debug)]
pub struct Asked<W> {
    /// The request, if it was granted at once, and the requests its ticket
    /// let through.
    pub granted: Granted<W>,
    /// The request itself, if it was withdrawn before it parked
    /// ([`Park::Withdrawn`]): it holds nothing and its tickets are given
    /// up.
    pub withdrawn: Option<W>,
}

/// What [`Broker::withdraw`] took out.
#[must_use = "granted requests must be dispatched"]
#[derive(Debug)]
pub struct Withdrawn<W> {
    /// The request withdrawn, if it was parked here.
    pub request: Option<W>,
    /// The requests that giving up its tickets let through.
    pub granted: Granted<W>,
}

/// Requests granted by one broker call, for the caller to dispatch once the
/// broker's lock is released; inline up to two (a release usually grants at
/// most one request, and then allocates nothing).
pub type Granted<W> = Few<W>;

/// A pool's state, as [`Broker::pools`] reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolState {
    pub name: String,
    pub capacity: u64,
    pub free: u64,
    /// The oldest ticket not granted yet.
    pub base: u64,
}

struct Pool<W> {
    name: String,
    capacity: u64,
    free: u64,
    /// Tickets below `base` are all granted (or retired).
    base: u64,
    /// Tickets from `base` on, granted out of order: `granted[i]` is ticket
    /// `base + i`.
    granted: VecDeque<bool>,
    /// Requests parked here: their demand on this pool is not met. In
    /// arrival order.
    parked: VecDeque<Parked<W>>,
    /// How many of `parked` ask for lasting units here: only they can be
    /// unblocked by `base` moving.
    lasting: usize,
    /// On the worklist.
    queued: bool,
}

impl<W> Pool<W> {
    /// Marks `ticket` granted (or retired); returns whether `base` moved.
    #[inline]
    fn mark(&mut self, ticket: u64) -> bool {
        debug_assert!(ticket >= self.base, "ticket {ticket} granted twice");
        if ticket == self.base && self.granted.is_empty() {
            self.base += 1; // granted in order: the common case
            return true;
        }
        let i = (ticket - self.base) as usize;
        if self.granted.len() <= i {
            self.granted.resize(i + 1, false);
        }
        debug_assert!(!self.granted[i], "ticket {ticket} granted twice");
        self.granted[i] = true;
        let base = self.base;
        while self.granted.front() == Some(&true) {
            self.granted.pop_front();
            self.base += 1;
        }
        self.base != base
    }
}

/// A parked request, with its place in arrival order.
struct Parked<W> {
    /// Its place in arrival order, shifted left by one; the low bit is set
    /// when its demand on the pool it is parked at is lasting. (One word:
    /// the hot paths move parked requests around.)
    order: u64,
    w: W,
}

impl<W> Parked<W> {
    fn lasting(&self) -> usize {
        (self.order & 1) as usize
    }
}

/// Where a request does not fit: the pool of its first unmet demand, and
/// whether that demand is lasting.
type Unmet = (usize, bool);

struct State<W> {
    pools: Vec<Pool<W>>,
    /// The next parked request's place in arrival order, shifted left by
    /// one (as [`Parked::order`]).
    arrivals: u64,
    /// Pools whose `base` moved, in the broker call under way, while a
    /// lasting request is parked there: each at most once until its rescan
    /// starts; empty whenever the lock is free. Rarely used, and it keeps
    /// its allocation.
    work: Vec<usize>,
}

/// The pools of one engine and the requests waiting for them.
pub struct Broker<W> {
    state: Mutex<State<W>>,
}

impl<W> std::fmt::Debug for Broker<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.state.lock();
        let waiting: usize = state.pools.iter().map(|p| p.parked.len()).sum();
        f.debug_struct("Broker")
            .field("pools", &state.pools.len())
            .field("waiting", &waiting)
            .finish()
    }
}

impl<W> Default for Broker<W> {
    fn default() -> Self {
        Self {
            state: Mutex::new(State {
                pools: Vec::new(),
                arrivals: 0,
                work: Vec::new(),
            }),
        }
    }
}

impl<W: Request> Broker<W> {
    fn lock(&self) -> crate::loom::sync::MutexGuard<'_, State<W>> {
        self.state.lock()
    }

    /// Adds a pool of `capacity` units, all free. Returns its index.
    pub fn add_pool(&self, name: impl Into<String>, capacity: u64) -> usize {
        let mut state = self.lock();
        state.pools.push(Pool {
            name: name.into(),
            capacity,
            free: capacity,
            base: 0,
            granted: VecDeque::new(),
            parked: VecDeque::new(),
            lasting: 0,
            queued: false,
        });
        state.pools.len() - 1
    }

    /// Asks for `w`'s units: returns `w` (and any request its ticket
    /// unblocked) if granted now, or parks it until a release; or, if it
    /// does not fit and was withdrawn ([`Request::park`]), gives up its
    /// tickets and returns it as withdrawn.
    pub fn request(&self, w: W) -> Asked<W> {
        let mut granted = Granted::default();
        let mut state = self.lock();
        match state.unmet(&w) {
            None => {
                state.take(&w);
                granted.push(w);
                state.settle(&mut granted);
            }
            Some((pool, lasting)) => match w.park() {
                Park::Parked => {
                    let order = state.arrivals | u64::from(lasting);
                    state.arrivals += 2;
                    let p = &mut state.pools[pool];
                    p.lasting += usize::from(lasting);
                    p.parked.push_back(Parked { order, w });
                }
                Park::Withdrawn => {
                    state.give_up_tickets(w.demands(), &mut granted);
                    return Asked {
                        granted,
                        withdrawn: Some(w),
                    };
                }
            },
        }
        Asked {
            granted,
            withdrawn: None,
        }
    }

    /// Gives up the tickets of a request that will not ask for its units
    /// (its op is skipped), so that younger lasting requests can go on.
    pub fn retire(&self, demands: &[Demand]) -> Granted<W> {
        let mut granted = Granted::default();
        self.lock().give_up_tickets(demands, &mut granted);
        granted
    }

    /// Takes out the parked request that `is` picks, looking at `pools`
    /// only (those it has demands on), and gives up its tickets: what a
    /// cancel of a request that [`Request::unpark`] holds does. `None` if
    /// no such request is parked there.
    pub fn withdraw(
        &self,
        pools: impl IntoIterator<Item = usize>,
        is: impl Fn(&W) -> bool,
    ) -> Withdrawn<W> {
        let mut granted = Granted::default();
        let mut state = self.lock();
        let state = &mut *state;
        let mut request = None;
        for pool in pools {
            let p = &mut state.pools[pool];
            if let Some(i) = p.parked.iter().position(|q| is(&q.w)) {
                let parked = p.parked.remove(i).expect("found");
                p.lasting -= parked.lasting();
                request = Some(parked.w);
                break;
            }
        }
        if let Some(w) = &request {
            state.give_up_tickets(w.demands(), &mut granted);
        }
        Withdrawn { request, granted }
    }

    /// Returns `amount` units to `pool`, and grants what now fits.
    pub fn release(&self, returns: impl IntoIterator<Item = (usize, u64)>) -> Granted<W> {
        let mut granted = Granted::default();
        let mut state = self.lock();
        let state = &mut *state;
        for (pool, amount) in returns {
            let p = &mut state.pools[pool];
            p.free += amount;
            debug_assert!(p.free <= p.capacity, "more units returned than taken");
            // Rescanned at once: a request that fits this pool but waits
            // for a pool returned to later moves there, and is looked at
            // again when that pool is rescanned in turn.
            if !p.parked.is_empty() {
                state.rescan(pool, &mut granted);
            }
        }
        state.settle(&mut granted);
        granted
    }

    /// One pool's units: (capacity, free).
    pub fn units(&self, pool: usize) -> (u64, u64) {
        let state = self.lock();
        (state.pools[pool].capacity, state.pools[pool].free)
    }

    /// Every pool's state, by index.
    pub fn pools(&self) -> Vec<PoolState> {
        self.lock()
            .pools
            .iter()
            .map(|p| PoolState {
                name: p.name.clone(),
                capacity: p.capacity,
                free: p.free,
                base: p.base,
            })
            .collect()
    }

    /// Calls `f` on every parked request, oldest arrival first, under the
    /// broker's lock (so `f` must not call back into the broker). Requests
    /// parked at several pools are merged by sorting: diagnostics only.
    pub fn for_each_waiting(&self, mut f: impl FnMut(&W)) {
        let state = self.lock();
        let mut at = state.pools.iter().filter(|p| !p.parked.is_empty());
        match (at.next(), at.next()) {
            (None, _) => {}
            (Some(one), None) => one.parked.iter().for_each(|p| f(&p.w)),
            (Some(_), Some(_)) => {
                let mut all: Vec<&Parked<W>> =
                    state.pools.iter().flat_map(|p| p.parked.iter()).collect();
                all.sort_unstable_by_key(|p| p.order);
                all.into_iter().for_each(|p| f(&p.w));
            }
        }
    }
}

/// Puts `p` (at index `pool`) on the worklist, unless it is there already.
#[inline]
fn queue<W>(p: &mut Pool<W>, pool: usize, work: &mut Vec<usize>) {
    if !p.queued {
        p.queued = true;
        work.push(pool);
    }
}

impl<W: Request> State<W> {
    /// Marks the tickets of `demands` as if granted, taking no units (a
    /// request that will not ask for them), and grants what that lets
    /// through.
    fn give_up_tickets(&mut self, demands: &[Demand], granted: &mut Granted<W>) {
        for d in demands {
            let p = &mut self.pools[d.pool];
            if p.mark(d.ticket()) && p.lasting != 0 {
                queue(p, d.pool, &mut self.work);
            }
        }
        self.settle(granted);
    }

    /// The first demand of `w` not met now, if any.
    #[inline]
    fn unmet(&self, w: &W) -> Option<Unmet> {
        w.demands().iter().find_map(|d| {
            let p = &self.pools[d.pool];
            let met = p.free >= d.amount && (!d.lasting || d.ticket() == p.base);
            (!met).then_some((d.pool, d.lasting))
        })
    }

    /// Takes `w`'s units; a pool whose `base` moves while a lasting request
    /// is parked there goes on the worklist.
    #[inline(always)]
    fn take(&mut self, w: &W) {
        for d in w.demands() {
            let p = &mut self.pools[d.pool];
            p.free -= d.amount;
            if p.mark(d.ticket()) && p.lasting != 0 {
                queue(p, d.pool, &mut self.work);
            }
        }
    }

    /// Rescans the pools on the worklist, and those their grants put there,
    /// until none is left.
    #[inline]
    fn settle(&mut self, granted: &mut Granted<W>) {
        if !self.work.is_empty() {
            self.settle_work(granted);
        }
    }

    #[inline(never)]
    fn settle_work(&mut self, granted: &mut Granted<W>) {
        while let Some(pool) = self.work.pop() {
            self.pools[pool].queued = false;
            self.rescan(pool, granted);
        }
    }

    /// Looks at the requests parked at `pool`, oldest first, until its units
    /// run out: grants those that fit, moves those that fit here but not at
    /// another pool to that pool, keeps the others in their order.
    fn rescan(&mut self, pool: usize, granted: &mut Granted<W>) {
        let mut kept = 0;
        for _ in 0..self.pools[pool].parked.len() {
            let p = &mut self.pools[pool];
            if p.free == 0 {
                break; // every demand is for one unit at least
            }
            let parked = p.parked.pop_front().expect("counted");
            match self.unmet(&parked.w) {
                Some((at, _)) if at == pool => {
                    self.pools[pool].parked.push_back(parked);
                    kept += 1;
                }
                None if parked.w.unpark() == Unpark::Held => {
                    // Withdrawn while parked: it stays, for its withdrawer
                    // (who is on its way to take it out) to find.
                    self.pools[pool].parked.push_back(parked);
                    kept += 1;
                }
                unmet => {
                    self.pools[pool].lasting -= parked.lasting();
                    match unmet {
                        None => {
                            self.take(&parked.w);
                            granted.push(parked.w);
                        }
                        Some(to) => self.park_moved(parked, to),
                    }
                }
            }
        }
        // The kept ones went behind those not looked at: put them back
        // in front, in their order.
        let parked = &mut self.pools[pool].parked;
        if kept != 0 && kept != parked.len() {
            parked.rotate_right(kept);
        }
    }

    /// Parks a request that fits the pool it was parked at but not `to`'s,
    /// at its place in arrival order there.
    #[cold]
    fn park_moved(&mut self, mut parked: Parked<W>, (to, lasting): Unmet) {
        let p = &mut self.pools[to];
        parked.order = parked.order & !1 | u64::from(lasting);
        p.lasting += usize::from(lasting);
        let at = p.parked.partition_point(|q| q.order < parked.order);
        p.parked.insert(at, parked);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    struct Req(Vec<Demand>, &'static str);
    impl Request for Req {
        fn demands(&self) -> &[Demand] {
            &self.0
        }
    }

    fn d(pool: usize, amount: u64, lasting: bool, ticket: u64) -> Demand {
        Demand::new(pool, amount, lasting, ticket)
    }

    fn names(g: Granted<Req>) -> Vec<&'static str> {
        let mut names = Vec::new();
        g.for_each(|r| names.push(r.1));
        names
    }

    #[test]
    fn temporary_requests_overtake_but_lasting_ones_keep_push_order() {
        let b = Broker::default();
        let pool = b.add_pool("p", 5);
        // Seed 003: M1 (1, lasting), M2 (2, lasting), O1 (3), O2 (2).
        assert_eq!(
            names(b.request(Req(vec![d(pool, 1, true, 0)], "M1")).granted),
            ["M1"]
        );
        assert_eq!(
            names(b.request(Req(vec![d(pool, 2, true, 1)], "M2")).granted),
            ["M2"]
        );
        assert!(
            b.request(Req(vec![d(pool, 3, false, 2)], "O1"))
                .granted
                .is_empty()
        );
        // The next micro-batch's M1 is younger than O1 and O2: it waits.
        assert!(
            b.request(Req(vec![d(pool, 1, true, 4)], "M1'"))
                .granted
                .is_empty()
        );
        // O2 overtakes O1 (temporary, fits).
        assert_eq!(
            names(b.request(Req(vec![d(pool, 2, false, 3)], "O2")).granted),
            ["O2"]
        );
        // O2 completes and its input buffer is deleted: O1 fits, then M1'.
        assert_eq!(names(b.release([(pool, 2), (pool, 2)])), ["O1", "M1'"]);
        assert_eq!(b.pools()[0].free, 0);
    }

    #[test]
    fn all_or_nothing_over_two_pools() {
        let b = Broker::default();
        let (p, q) = (b.add_pool("p", 2), b.add_pool("q", 2));
        assert_eq!(
            names(b.request(Req(vec![d(q, 2, false, 0)], "q2")).granted),
            ["q2"]
        );
        assert!(
            b.request(Req(vec![d(p, 1, false, 0), d(q, 1, false, 1)], "pq"))
                .granted
                .is_empty()
        );
        assert_eq!(b.pools()[p].free, 2, "nothing taken while waiting");
        assert_eq!(names(b.release([(q, 2)])), ["pq"]);
        assert_eq!((b.pools()[p].free, b.pools()[q].free), (1, 1));
    }

    /// A request that counts how often the broker looks at it.
    struct Counted(Vec<Demand>, std::rc::Rc<std::cell::Cell<u64>>);
    impl Request for Counted {
        fn demands(&self) -> &[Demand] {
            self.1.set(self.1.get() + 1);
            &self.0
        }
    }

    #[test]
    fn requests_parked_at_one_pool_are_not_looked_at_for_another() {
        let b = Broker::default();
        let (busy, free) = (b.add_pool("busy", 1), b.add_pool("free", 1));
        let looks = std::rc::Rc::new(std::cell::Cell::new(0));
        let req = |pool, ticket| Counted(vec![d(pool, 1, false, ticket)], looks.clone());
        assert_eq!(b.request(req(busy, 0)).granted.len(), 1);
        for ticket in 1..=1000 {
            assert!(b.request(req(busy, ticket)).granted.is_empty());
        }
        looks.set(0);
        for ticket in 0..1000 {
            assert_eq!(b.request(req(free, ticket)).granted.len(), 1);
            assert!(b.release([(free, 1)]).is_empty());
        }
        assert!(
            looks.get() <= 2000,
            "1000 grants on a free pool looked at requests {} times",
            looks.get()
        );
        // The parked ones are all still there, and go one by one, each
        // release looking at one request.
        let mut waiting = 0;
        b.for_each_waiting(|_| waiting += 1);
        assert_eq!(waiting, 1000);
        looks.set(0);
        for _ in 0..1000 {
            assert_eq!(b.release([(busy, 1)]).len(), 1);
        }
        assert!(b.release([(busy, 1)]).is_empty());
        assert!(looks.get() <= 2000, "{} looks", looks.get());
    }

    #[test]
    fn a_request_short_of_two_pools_moves_and_keeps_its_arrival_order() {
        let b = Broker::default();
        let (p, q) = (b.add_pool("p", 1), b.add_pool("q", 1));
        assert_eq!(
            names(b.request(Req(vec![d(p, 1, false, 0)], "p")).granted),
            ["p"]
        );
        assert_eq!(
            names(b.request(Req(vec![d(q, 1, false, 0)], "q")).granted),
            ["q"]
        );
        // Short of both: parked at p (its first demand).
        assert!(
            b.request(Req(vec![d(p, 1, false, 1), d(q, 1, false, 1)], "pq"))
                .granted
                .is_empty()
        );
        // A younger request for q alone parks at q.
        assert!(
            b.request(Req(vec![d(q, 1, false, 2)], "q'"))
                .granted
                .is_empty()
        );
        // p comes back: `pq` still waits, now at q, ahead of `q'`.
        assert!(b.release([(p, 1)]).is_empty());
        let mut order = Vec::new();
        b.for_each_waiting(|r| order.push(r.1));
        assert_eq!(order, ["pq", "q'"]);
        assert_eq!(names(b.release([(q, 1)])), ["pq"]);
        assert_eq!(names(b.release([(q, 1)])), ["q'"]);
        assert_eq!((b.pools()[p].free, b.pools()[q].free), (0, 0));
    }

    #[test]
    fn waiting_lists_every_pool_oldest_arrival_first() {
        let b = Broker::default();
        let (p, q) = (b.add_pool("p", 1), b.add_pool("q", 1));
        assert_eq!(b.request(Req(vec![d(p, 1, false, 0)], "")).granted.len(), 1);
        assert_eq!(b.request(Req(vec![d(q, 1, false, 0)], "")).granted.len(), 1);
        for (i, (pool, name)) in [(q, "a"), (p, "b"), (q, "c"), (p, "d")]
            .into_iter()
            .enumerate()
        {
            assert!(
                b.request(Req(vec![d(pool, 1, false, 1 + i as u64)], name))
                    .granted
                    .is_empty()
            );
        }
        let mut order = Vec::new();
        b.for_each_waiting(|r| order.push(r.1));
        assert_eq!(order, ["a", "b", "c", "d"]);
    }

    #[test]
    fn a_grant_gives_a_lasting_request_passed_over_earlier_its_turn() {
        let b = Broker::default();
        let pool = b.add_pool("p", 2);
        assert_eq!(
            names(b.request(Req(vec![d(pool, 2, false, 0)], "t0")).granted),
            ["t0"]
        );
        // `l` (ticket 2, lasting) parks before `t1` (ticket 1): a rescan
        // looks at `l` first, then grants `t1`, which gives `l` its turn.
        assert!(
            b.request(Req(vec![d(pool, 1, true, 2)], "l"))
                .granted
                .is_empty()
        );
        assert!(
            b.request(Req(vec![d(pool, 1, false, 1)], "t1"))
                .granted
                .is_empty()
        );
        assert_eq!(names(b.release([(pool, 2)])), ["t1", "l"]);
        assert_eq!((b.pools()[pool].base, b.pools()[pool].free), (3, 0));
    }

    #[test]
    fn a_request_moved_to_wait_for_its_turn_is_granted_by_a_retire() {
        let b = Broker::default();
        let (p, q) = (b.add_pool("p", 1), b.add_pool("q", 1));
        assert_eq!(
            names(b.request(Req(vec![d(p, 1, false, 0)], "p")).granted),
            ["p"]
        );
        // Short of p, and lasting on q behind ticket 0: parked at p.
        assert!(
            b.request(Req(vec![d(p, 1, false, 1), d(q, 1, true, 1)], "pq"))
                .granted
                .is_empty()
        );
        // p comes back: it moves to q, for its turn.
        assert!(b.release([(p, 1)]).is_empty());
        assert_eq!(names(b.retire(&[d(q, 1, false, 0)])), ["pq"]);
        assert_eq!((b.pools()[p].free, b.pools()[q].free), (0, 0));
    }

    #[test]
    fn one_release_to_both_pools_grants_a_request_parked_at_either() {
        for order in [[0, 1], [1, 0]] {
            let b = Broker::default();
            let (p, q) = (b.add_pool("p", 1), b.add_pool("q", 1));
            assert_eq!(b.request(Req(vec![d(p, 1, false, 0)], "")).granted.len(), 1);
            assert_eq!(b.request(Req(vec![d(q, 1, false, 0)], "")).granted.len(), 1);
            assert!(
                b.request(Req(vec![d(p, 1, false, 1), d(q, 1, false, 1)], "pq"))
                    .granted
                    .is_empty()
            );
            assert_eq!(names(b.release(order.map(|pool| (pool, 1)))), ["pq"]);
        }
    }

    /// A granted request in the model below: its demands, and its id.
    struct Op(Vec<Demand>, usize);
    impl Request for Op {
        fn demands(&self) -> &[Demand] {
            &self.0
        }
    }

    /// Random programs over three pools, their requests arriving in random
    /// order (some retired), ops completing and buffers freed at random:
    /// after every call no parked request fits, no pool goes over its
    /// capacity, a lasting demand is granted only at its turn, and once
    /// everything is given back every request was granted or retired.
    #[test]
    fn random_programs_never_leave_a_request_that_fits_parked() {
        let mut seed = 0x9E37_79B9_7F4A_7C15_u64;
        let mut rand = move |n: u64| {
            seed = seed
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (seed >> 33) % n
        };
        const CAPS: [u64; 3] = [3, 2, 4];
        for _ in 0..300 {
            let b = Broker::default();
            for c in CAPS {
                b.add_pool("p", c);
            }
            let mut tickets = [0u64; 3];
            let mut pending = Vec::new();
            for id in 0..24 {
                let mut demands = Vec::new();
                for (pool, cap) in CAPS.into_iter().enumerate() {
                    if rand(2) == 0 {
                        let amount = 1 + rand(cap);
                        demands.push(d(pool, amount, rand(4) == 0, tickets[pool]));
                        tickets[pool] += 1;
                    }
                }
                if !demands.is_empty() {
                    pending.push(Op(demands, id));
                }
            }
            let total = pending.len();
            // Tickets granted or retired, per pool; ops running; units
            // handed on to buffers.
            let mut done: [Vec<u64>; 3] = Default::default();
            let mut running: Vec<Op> = Vec::new();
            let mut buffers: Vec<(usize, u64)> = Vec::new();
            let mut finished = 0;
            let check = |g: Granted<Op>,
                         done: &mut [Vec<u64>; 3],
                         running: &mut Vec<Op>,
                         b: &Broker<Op>| {
                g.for_each(|op| {
                    for x in &op.0 {
                        let older = done[x.pool].iter().filter(|&&t| t < x.ticket()).count();
                        assert!(
                            !x.lasting || older as u64 == x.ticket(),
                            "lasting demand granted before its turn"
                        );
                        done[x.pool].push(x.ticket());
                    }
                    running.push(op);
                });
                let pools = b.pools();
                b.for_each_waiting(|w| {
                    let fits = w.0.iter().all(|x| {
                        let p = &pools[x.pool];
                        p.free >= x.amount && (!x.lasting || x.ticket() == p.base)
                    });
                    assert!(!fits, "request {} fits but is parked", w.1);
                });
            };
            loop {
                let step = rand(4);
                if step == 0 && !pending.is_empty() {
                    let op = pending.swap_remove(rand(pending.len() as u64) as usize);
                    if rand(8) == 0 {
                        finished += 1;
                        for x in &op.0 {
                            done[x.pool].push(x.ticket());
                        }
                        check(b.retire(&op.0), &mut done, &mut running, &b);
                    } else {
                        check(b.request(op).granted, &mut done, &mut running, &b);
                    }
                } else if step == 1 && !running.is_empty() {
                    let op = running.swap_remove(rand(running.len() as u64) as usize);
                    finished += 1;
                    let mut back = Vec::new();
                    for x in &op.0 {
                        if x.lasting {
                            buffers.push((x.pool, x.amount));
                        } else {
                            back.push((x.pool, x.amount));
                        }
                    }
                    check(b.release(back), &mut done, &mut running, &b);
                } else if step == 2 && !buffers.is_empty() {
                    let buffer = buffers.swap_remove(rand(buffers.len() as u64) as usize);
                    check(b.release([buffer]), &mut done, &mut running, &b);
                } else if pending.is_empty() && running.is_empty() && buffers.is_empty() {
                    break;
                }
                let (pools, used) = (b.pools(), |pool: usize| {
                    let ops: u64 = running
                        .iter()
                        .flat_map(|op| op.0.iter().filter(|x| x.pool == pool))
                        .map(|x| x.amount)
                        .sum();
                    let bufs: u64 = buffers.iter().filter(|x| x.0 == pool).map(|x| x.1).sum();
                    ops + bufs
                });
                for (pool, p) in pools.iter().enumerate() {
                    assert_eq!(p.free + used(pool), p.capacity, "pool {pool} units");
                }
            }
            assert_eq!(finished, total, "a request was never granted");
            let mut waiting = 0;
            b.for_each_waiting(|_| waiting += 1);
            assert_eq!(waiting, 0);
        }
    }

    #[test]
    fn retired_tickets_unblock_lasting_requests() {
        let b = Broker::default();
        let pool = b.add_pool("p", 4);
        assert!(
            b.request(Req(vec![d(pool, 1, true, 1)], "young"))
                .granted
                .is_empty()
        );
        assert_eq!(names(b.retire(&[d(pool, 1, false, 0)])), ["young"]);
        assert_eq!(b.pools()[pool].base, 2);
    }
}
