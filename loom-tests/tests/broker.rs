//! Loom models of the resource broker: requests racing for the last units,
//! releases racing new requests, all-or-nothing grants over two pools,
//! seed 003's program with the next micro-batch pushed while it runs, and a
//! parked request moving from one pool to another while releases (or a
//! retire that gives it its turn) race it.
//!
//! A granted request is "run" by whichever thread the broker handed it to
//! (the requester, or the thread whose release made room), as the engine
//! dispatches it; running checks that the units it holds are really free.
#![cfg(loom)]

use depflow::__loom::{Broker, Demand, Granted, Request};
use loom::sync::Arc;
use loom::sync::atomic::{AtomicI64, AtomicUsize, Ordering::*};
use loom::thread;

struct Req {
    id: usize,
    demands: Vec<Demand>,
}

impl Request for Req {
    fn demands(&self) -> &[Demand] {
        &self.demands
    }
}

fn req(id: usize, demands: &[(usize, u64, bool, u64)]) -> Req {
    Req {
        id,
        demands: demands
            .iter()
            .map(|&(pool, amount, lasting, ticket)| Demand::new(pool, amount, lasting, ticket))
            .collect(),
    }
}

/// Units in use per pool as the running requests see them, checked against
/// the capacities; and how often each request ran.
struct World {
    broker: Broker<Req>,
    capacity: Vec<i64>,
    used: Vec<AtomicI64>,
    ran: Vec<AtomicUsize>,
}

impl World {
    fn new(capacity: &[u64], requests: usize) -> Arc<World> {
        let broker = Broker::default();
        for &c in capacity {
            broker.add_pool("pool", c);
        }
        Arc::new(World {
            broker,
            capacity: capacity.iter().map(|&c| c as i64).collect(),
            used: capacity.iter().map(|_| AtomicI64::new(0)).collect(),
            ran: (0..requests).map(|_| AtomicUsize::new(0)).collect(),
        })
    }

    /// Runs what a broker call granted; `after` says what each request does
    /// once it ran (request more, release units).
    fn run(&self, granted: Granted<Req>, after: &dyn Fn(&World, &Req)) {
        granted.for_each(|r| {
            assert_eq!(r.ran_in(self), 0, "request {} granted twice", r.id);
            for d in &r.demands {
                let now = self.used[d.pool].fetch_add(d.amount as i64, AcqRel) + d.amount as i64;
                assert!(
                    now <= self.capacity[d.pool],
                    "pool {} over capacity",
                    d.pool
                );
            }
            after(self, &r);
        });
    }

    /// Gives units back (the request's temporary ones, or a deleted buffer's).
    fn release(&self, returns: &[(usize, u64)], after: &dyn Fn(&World, &Req)) {
        for &(pool, amount) in returns {
            self.used[pool].fetch_sub(amount as i64, AcqRel);
        }
        self.run(self.broker.release(returns.iter().copied()), after);
    }

    /// Asks for `r`'s units and runs whatever that grants.
    fn request(&self, r: Req, after: &dyn Fn(&World, &Req)) {
        self.run(self.broker.request(r).granted, after);
    }

    fn ran(&self, id: usize) -> usize {
        self.ran[id].load(Acquire)
    }
}

impl Req {
    fn ran_in(&self, world: &World) -> usize {
        world.ran[self.id].fetch_add(1, AcqRel)
    }
}

/// Temporary requests just give their units back.
fn give_back(world: &World, r: &Req) {
    let returns: Vec<_> = r.demands.iter().map(|d| (d.pool, d.amount)).collect();
    world.release(&returns, &give_back);
}

/// Two requests race for the last unit: each runs exactly once, one after
/// the other.
#[test]
fn two_requests_race_for_the_last_unit() {
    loom::model(|| {
        let world = World::new(&[1], 2);
        let other = thread::spawn({
            let world = world.clone();
            move || world.request(req(1, &[(0, 1, false, 1)]), &give_back)
        });
        world.request(req(0, &[(0, 1, false, 0)]), &give_back);
        other.join().unwrap();
        assert_eq!((world.ran(0), world.ran(1)), (1, 1));
        assert_eq!(world.broker.pools()[0].free, 1);
    });
}

/// A release racing a new request: the request is granted by one of the
/// two, never lost between them.
#[test]
fn release_races_a_new_request() {
    loom::model(|| {
        let world = World::new(&[2], 2);
        // Request 0 holds both units.
        world.request(req(0, &[(0, 2, false, 0)]), &|_, _| {});
        let releaser = thread::spawn({
            let world = world.clone();
            // Whichever thread grants request 1 runs it; it keeps its unit.
            move || world.release(&[(0, 2)], &|_, _| {})
        });
        world.request(req(1, &[(0, 1, true, 1)]), &|_, _| {});
        releaser.join().unwrap();
        assert_eq!(world.ran(1), 1);
        assert_eq!(
            world.broker.pools()[0].free,
            1,
            "request 1 keeps its lasting unit"
        );
    });
}

/// Requests over two pools take all their units or none: never over either
/// capacity, and all of them run.
#[test]
fn all_or_nothing_over_two_pools() {
    loom::model(|| {
        let world = World::new(&[1, 1], 3);
        let both = thread::spawn({
            let world = world.clone();
            move || {
                let r = req(0, &[(0, 1, false, 0), (1, 1, false, 0)]);
                world.request(r, &give_back)
            }
        });
        let p = thread::spawn({
            let world = world.clone();
            move || world.request(req(1, &[(0, 1, false, 1)]), &give_back)
        });
        world.request(req(2, &[(1, 1, false, 1)]), &give_back);
        both.join().unwrap();
        p.join().unwrap();
        assert_eq!((world.ran(0), world.ran(1), world.ran(2)), (1, 1, 1));
        let pools = world.broker.pools();
        assert_eq!((pools[0].free, pools[1].free), (1, 1));
    });
}

/// Seed 003 on 5 units, pushed in the order that does not fit serially
/// (M1 M2 O1 O2), with the next micro-batch's M1' and M2' pushed while the
/// first runs. M1 and M2 hand 1 and 2 units on to their buffers; O1 and O2
/// start once their M ran (their variable dependency), use 3 and 2 units,
/// then their buffer is deleted. Every interleaving completes.
#[test]
fn seed_003_completes_with_the_next_micro_batch() {
    const M1: usize = 0;
    const M2: usize = 1;
    const O1: usize = 2;
    const O2: usize = 3;
    const M1B: usize = 4;
    const M2B: usize = 5;
    fn after(world: &World, r: &Req) {
        match r.id {
            // The compute op's inputs are ready once its movement ran.
            M1 => world.request(req(O1, &[(0, 3, false, 2)]), &after),
            M2 => world.request(req(O2, &[(0, 2, false, 3)]), &after),
            // Compute done: its temporary units, then its input buffer.
            O1 => world.release(&[(0, 3), (0, 1)], &after),
            O2 => world.release(&[(0, 2), (0, 2)], &after),
            _ => {} // the next batch keeps its buffers
        }
    }
    loom::model(|| {
        let world = World::new(&[5], 6);
        let first = thread::spawn({
            let world = world.clone();
            move || world.request(req(M1, &[(0, 1, true, 0)]), &after)
        });
        let second = thread::spawn({
            let world = world.clone();
            move || world.request(req(M2, &[(0, 2, true, 1)]), &after)
        });
        world.request(req(M1B, &[(0, 1, true, 4)]), &after);
        world.request(req(M2B, &[(0, 2, true, 5)]), &after);
        first.join().unwrap();
        second.join().unwrap();
        for id in 0..6 {
            assert_eq!(world.ran(id), 1, "request {id} never ran: deadlock");
        }
        assert_eq!(world.broker.pools()[0].free, 2);
    });
}

/// A request short of two pools is parked at the first and moves to the
/// second when the first's units come back; releases of both pools race
/// each other and a younger request for the second pool alone. Each
/// request runs exactly once, never over a capacity, and every unit comes
/// back.
#[test]
fn a_request_short_of_two_pools_moves_between_them() {
    loom::model(|| {
        let world = World::new(&[1, 1], 4);
        // Requests 0 and 1 hold both pools' units.
        world.request(req(0, &[(0, 1, false, 0)]), &|_, _| {});
        world.request(req(1, &[(1, 1, false, 0)]), &|_, _| {});
        // Request 2 needs both: parked at pool 0.
        world.request(req(2, &[(0, 1, false, 1), (1, 1, false, 1)]), &give_back);
        let p = thread::spawn({
            let world = world.clone();
            move || world.release(&[(0, 1)], &give_back)
        });
        let q = thread::spawn({
            let world = world.clone();
            move || world.release(&[(1, 1)], &give_back)
        });
        world.request(req(3, &[(1, 1, false, 2)]), &give_back);
        p.join().unwrap();
        q.join().unwrap();
        for id in 2..4 {
            assert_eq!(world.ran(id), 1, "request {id} never ran");
        }
        let pools = world.broker.pools();
        assert_eq!((pools[0].free, pools[1].free), (1, 1));
    });
}

/// A request short of one pool and waiting for its turn on another (a
/// lasting demand behind an older ticket) moves from the first pool to the
/// second when units come back, while the older ticket is retired (its op
/// skipped) on another thread: whichever comes first, the request runs,
/// exactly once, and keeps only its lasting unit.
#[test]
fn a_moved_request_gets_its_turn_from_a_racing_retire() {
    loom::model(|| {
        let world = World::new(&[1, 1], 3);
        // Request 0 holds pool 0's unit.
        world.request(req(0, &[(0, 1, false, 0)]), &|_, _| {});
        // Request 1 needs pool 0, and pool 1's unit to keep, after ticket
        // 0 of pool 1: parked at pool 0.
        let keep_lasting = |world: &World, r: &Req| {
            if r.id == 1 {
                world.release(&[(0, 1)], &|_, _| {});
            }
        };
        world.request(req(1, &[(0, 1, false, 1), (1, 1, true, 1)]), &keep_lasting);
        let releaser = thread::spawn({
            let world = world.clone();
            move || world.release(&[(0, 1)], &keep_lasting)
        });
        // Ticket 0 of pool 1 will never ask: retired.
        let retire = [Demand::new(1, 1, false, 0)];
        world.run(world.broker.retire(&retire), &keep_lasting);
        releaser.join().unwrap();
        assert_eq!(world.ran(1), 1, "request 1 never ran");
        let pools = world.broker.pools();
        assert_eq!((pools[0].free, pools[1].free), (1, 0));
        assert_eq!(pools[1].base, 2);
    });
}
