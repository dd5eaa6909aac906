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

/// What the broker parks: anything that can say what it asks for.
pub trait Request {
    /// At most one demand per pool.
    fn demands(&self) -> &[Demand];
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

struct Pool {
    name: String,
    capacity: u64,
    free: u64,
    /// Tickets below `base` are all granted (or retired).
    base: u64,
    /// Tickets from `base` on, granted out of order: `granted[i]` is ticket
    /// `base + i`.
    granted: VecDeque<bool>,
}

impl Pool {
    fn mark(&mut self, ticket: u64) {
        debug_assert!(ticket >= self.base, "ticket {ticket} granted twice");
        if ticket == self.base && self.granted.is_empty() {
            self.base += 1; // granted in order: the common case
            return;
        }
        let i = (ticket - self.base) as usize;
        if self.granted.len() <= i {
            self.granted.resize(i + 1, false);
        }
        debug_assert!(!self.granted[i], "ticket {ticket} granted twice");
        self.granted[i] = true;
        while self.granted.front() == Some(&true) {
            self.granted.pop_front();
            self.base += 1;
        }
    }
}

struct State<W> {
    pools: Vec<Pool>,
    /// Requests whose variables granted them but whose units are not free, in
    /// arrival order.
    waiting: VecDeque<W>,
}

/// The pools of one engine and the requests waiting for them.
pub struct Broker<W> {
    state: Mutex<State<W>>,
}

impl<W> std::fmt::Debug for Broker<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.state.lock();
        f.debug_struct("Broker")
            .field("pools", &state.pools.len())
            .field("waiting", &state.waiting.len())
            .finish()
    }
}

impl<W> Default for Broker<W> {
    fn default() -> Self {
        Self {
            state: Mutex::new(State {
                pools: Vec::new(),
                waiting: VecDeque::new(),
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
        });
        state.pools.len() - 1
    }

    /// Asks for `w`'s units: returns `w` (and any request its ticket
    /// unblocked) if granted now, or parks it until a release.
    pub fn request(&self, w: W) -> Granted<W> {
        let mut granted = Granted::default();
        let mut state = self.lock();
        if state.fits(&w) {
            state.take(&w);
            granted.push(w);
            state.grant_waiting(&mut granted);
        } else {
            state.waiting.push_back(w);
        }
        granted
    }

    /// Gives up the tickets of a request that will not ask for its units
    /// (its op is skipped), so that younger lasting requests can go on.
    pub fn retire(&self, demands: &[Demand]) -> Granted<W> {
        let mut granted = Granted::default();
        let mut state = self.lock();
        for d in demands {
            state.pools[d.pool].mark(d.ticket());
        }
        state.grant_waiting(&mut granted);
        granted
    }

    /// Returns `amount` units to `pool`, and grants what now fits.
    pub fn release(&self, returns: impl IntoIterator<Item = (usize, u64)>) -> Granted<W> {
        let mut granted = Granted::default();
        let mut state = self.lock();
        for (pool, amount) in returns {
            let p = &mut state.pools[pool];
            p.free += amount;
            debug_assert!(p.free <= p.capacity, "more units returned than taken");
        }
        state.grant_waiting(&mut granted);
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
    /// broker's lock (so `f` must not call back into the broker).
    pub fn for_each_waiting(&self, mut f: impl FnMut(&W)) {
        self.lock().waiting.iter().for_each(&mut f);
    }
}

impl<W: Request> State<W> {
    fn fits(&self, w: &W) -> bool {
        w.demands().iter().all(|d| {
            let p = &self.pools[d.pool];
            p.free >= d.amount && (!d.lasting || d.ticket() == p.base)
        })
    }

    fn take(&mut self, w: &W) {
        for d in w.demands() {
            let p = &mut self.pools[d.pool];
            p.free -= d.amount;
            p.mark(d.ticket());
        }
    }

    /// Grants parked requests that fit, oldest first, until a pass grants
    /// nothing (a grant can advance a pool's `base` and so unblock a lasting
    /// request passed over earlier in the same pass).
    fn grant_waiting(&mut self, granted: &mut Granted<W>) {
        loop {
            let mut progressed = false;
            let mut i = 0;
            while i < self.waiting.len() {
                if self.pools.iter().all(|p| p.free == 0) {
                    return; // every demand is for at least one unit
                }
                if self.fits(&self.waiting[i]) {
                    let w = self.waiting.remove(i).expect("index in range");
                    self.take(&w);
                    granted.push(w);
                    progressed = true;
                } else {
                    i += 1;
                }
            }
            if !progressed {
                return;
            }
        }
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
            names(b.request(Req(vec![d(pool, 1, true, 0)], "M1"))),
            ["M1"]
        );
        assert_eq!(
            names(b.request(Req(vec![d(pool, 2, true, 1)], "M2"))),
            ["M2"]
        );
        assert!(b.request(Req(vec![d(pool, 3, false, 2)], "O1")).is_empty());
        // The next micro-batch's M1 is younger than O1 and O2: it waits.
        assert!(b.request(Req(vec![d(pool, 1, true, 4)], "M1'")).is_empty());
        // O2 overtakes O1 (temporary, fits).
        assert_eq!(
            names(b.request(Req(vec![d(pool, 2, false, 3)], "O2"))),
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
        assert_eq!(names(b.request(Req(vec![d(q, 2, false, 0)], "q2"))), ["q2"]);
        assert!(
            b.request(Req(vec![d(p, 1, false, 0), d(q, 1, false, 1)], "pq"))
                .is_empty()
        );
        assert_eq!(b.pools()[p].free, 2, "nothing taken while waiting");
        assert_eq!(names(b.release([(q, 2)])), ["pq"]);
        assert_eq!((b.pools()[p].free, b.pools()[q].free), (1, 1));
    }

    #[test]
    fn retired_tickets_unblock_lasting_requests() {
        let b = Broker::default();
        let pool = b.add_pool("p", 4);
        assert!(
            b.request(Req(vec![d(pool, 1, true, 1)], "young"))
                .is_empty()
        );
        assert_eq!(names(b.retire(&[d(pool, 1, false, 0)])), ["young"]);
        assert_eq!(b.pools()[pool].base, 2);
    }
}
