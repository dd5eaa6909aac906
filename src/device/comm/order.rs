//! The issue order of a communicator's collectives, and the state every
//! MPI call of the backend is made under ([`Shared`], its lock).
//!
//! **Issue order.** MPI requires every rank to issue the collectives of a
//! communicator in the same order. Each collective takes a ticket when it
//! is pushed (push order, which is the program's order when one thread
//! pushes them, as it must); its submission is held until every earlier
//! ticket was issued, so requests are issued in ticket order whatever
//! order the ops become ready in. Collectives still overlap each other and
//! computation: only the issue is ordered.
//!
//! **Data in flight.** At most [`MAX_DATA_IN_FLIGHT`] bytes of this rank's
//! data calls are in flight at once (one larger collective goes alone): the
//! next one waits in line until those before it complete, since large
//! collectives sharing the cores and memory take longer together than one
//! after the other. Only *when* a rank issues changes, never the order, so
//! the ranks need not agree on it; a shutdown lifts the limit first
//! (`comm.rs`).
//!
//! **A failure on one rank.** A ticket dropped unsubmitted (its op skipped
//! on a poisoned or deleted input, cancelled, or refusing the collective in
//! its body) still takes its place: a *stand-in* issues the status word
//! saying this rank failed and why, and, once it came back, the data call
//! on a zeroed buffer of the other ranks' length (`calls.rs`). Nothing
//! later is issued on this rank until then. Every collective's status word
//! comes back as the maximum over the ranks, so every rank learns that
//! some rank failed, and its collective fails (poisoning its outputs) with
//! a message naming the lowest failing rank: a failure propagates to every
//! rank instead of leaving the others waiting forever in their calls, and
//! the ranks stay in step for the collectives after it.
//!
//! **The failed rank's message.** A status word that comes back saying
//! some rank failed adds a third call, the message part (`calls.rs`: an
//! `MPI_Ibcast` from that rank of its failure in words). It goes on the
//! communicator's second duplicate, whose calls must be in the same order
//! on every rank too, but status words complete in no set order, and a
//! rank whose op ran has issued later collectives by then while a failed
//! one has not. So the message parts are issued in ticket order, each once
//! no status word of an earlier ticket is in flight: every rank then issues
//! the same message parts (the status word is the same everywhere) in the
//! same order. A message part is not data: it does not count toward the
//! limit on data in flight. Nothing of this happens unless a rank failed.
//!
//! Owns the line of tickets and what is in flight (the requests, the
//! collective and part each is, the bytes of the data calls, the message
//! parts waiting for earlier status words); `comm.rs` takes tickets and
//! submits, `progress.rs` tests the requests and calls back in here when a
//! status word is back or data calls complete, `calls.rs` makes the
//! calls.

// `unsafe`: the communicator's handle is sent between threads; the impls
// say why that is sound.
#![allow(unsafe_code)]

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use mpi::ffi;

use super::calls::{InFlight, Part, Reason, Requests, Spec};
use super::library::error_string;
use crate::loom::sync::{Condvar, Mutex, MutexGuard};

/// The most data (bytes, this rank's buffers) of the collectives in flight at
/// once, unless one alone is larger: the next one waits for those before it to
/// complete. Collectives sharing the two ranks' cores and memory take longer
/// together than one after the other: 8 all-reduces of 1 MiB pushed back to
/// back on 2 ranks (`benches/mpi_allreduce.rs`, libnbc's ring) took 538 to 636
/// µs each all in flight, 141 to 176 with this limit; small ones gain from
/// overlapping their latencies (1 KiB: 3.5 to 4.4 µs each all in flight, 4.6
/// to 5.1 one at a time). The order they are issued in is unchanged, so every
/// rank still issues the same calls in the same order.
pub(super) const MAX_DATA_IN_FLIGHT: usize = 64 << 10;

/// A communicator's state, shared by its submitters and its progress
/// thread.
pub(super) struct Shared {
    pub(super) raw: ffi::MPI_Comm,
    /// The second duplicate, for failed ranks' messages only (their own
    /// issue order: see the module docs).
    pub(super) messages: ffi::MPI_Comm,
    /// `MPI_IN_PLACE` of this MPI library (a macro, absent from rsmpi).
    pub(super) in_place: usize,
    pub(super) rank: usize,
    pub(super) size: usize,
    pub(super) next_ticket: AtomicU64,
    pub(super) state: Mutex<State>,
    pub(super) cv: Condvar,
    /// A ring's scratch chunk, kept between rings (`ring.rs`): taken under
    /// the state lock, so after it when both are held.
    pub(super) scratch: Mutex<Vec<u64>>,
}

// SAFETY: `raw` and `messages` are MPI handles (pointers in Open MPI) used
// only under the state lock, or by the progress thread after the last
// submitter left.
unsafe impl Send for Shared {}
// SAFETY: as above.
unsafe impl Sync for Shared {}

/// One ticket's place in the issue order.
pub(super) enum Slot {
    /// Not submitted yet.
    Open,
    /// Failed unissued (shut down): issues nothing.
    Void,
    /// Submitted: a rank's own buffer, or a stand-in for a failed one.
    Submitted(Arc<dyn InFlight>),
}

pub(super) struct State {
    /// The ticket issued next; `waiting[i]` is ticket `next_issue + i`.
    pub(super) next_issue: u64,
    pub(super) waiting: VecDeque<Slot>,
    /// Outstanding requests and the part of which collective each is,
    /// index for index (a ring's step: two requests of one data part).
    pub(super) requests: Vec<ffi::MPI_Request>,
    pub(super) in_flight: Vec<(Arc<dyn InFlight>, Part)>,
    /// The bytes of the data calls in flight (see [`MAX_DATA_IN_FLIGHT`]).
    pub(super) data_bytes: usize,
    /// Data calls issued so far (a ring's tag).
    pub(super) data_calls: u64,
    /// Whether the progress thread sleeps on the condition variable (set
    /// and cleared by it, under this lock, around its waits): an issue
    /// notifies it only then.
    pub(super) asleep: bool,
    /// A stand-in's status word is in flight: nothing is issued until it
    /// comes back and the stand-in's data call is issued.
    pub(super) held: bool,
    /// Requests issued so far (the progress thread starts spinning again
    /// when it changes).
    pub(super) issued: u64,
    /// Why nothing more is issued (shut down, or MPI broken).
    pub(super) closed: Option<&'static str>,
    /// Collectives whose status word came back saying a rank failed, in
    /// ticket order, whose message part waits for an earlier ticket's
    /// status word (see the module docs).
    pub(super) messages: Vec<Arc<dyn InFlight>>,
}

/// What failed without reaching MPI (or whose part MPI refused), to be
/// completed outside the state lock.
pub(super) type Failed = Vec<(Arc<dyn InFlight>, Part, String)>;

/// Held by an op between its push and its submission; dropping it
/// unsubmitted issues a stand-in in its place (this rank failed).
pub(crate) struct Ticket {
    pub(super) shared: Arc<Shared>,
    pub(super) n: u64,
    /// The collective's tag, the same on every rank for the same
    /// collective (the status word compares them: `calls.rs`).
    pub(super) tag: u64,
    pub(super) spec: Spec,
    /// Why the stand-in stands in, if dropped unsubmitted.
    pub(super) reason: Reason,
    /// And in words, if the op said ([`Ticket::fail`]).
    pub(super) why: Option<String>,
    pub(super) used: bool,
}

impl std::fmt::Debug for Ticket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ticket").field("n", &self.n).finish()
    }
}

impl Ticket {
    /// Gives the place up unsubmitted, for `reason`: a stand-in takes
    /// part, telling every rank that this one failed, and `why` (cut to
    /// [`MESSAGE_BYTES`](super::calls::MESSAGE_BYTES)) if this is the lowest
    /// failing rank. (Dropped unsubmitted, it says its op did not run.)
    pub(crate) fn fail(mut self, reason: Reason, why: String) {
        self.reason = reason;
        self.why = Some(why);
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if !self.used {
            let s = &self.shared;
            let why = self
                .why
                .take()
                .unwrap_or_else(|| self.reason.detail().to_string());
            let stand_in = Arc::new(self.spec.stand_in(
                (self.n, self.tag),
                (s.rank, s.size),
                self.reason,
                why,
            ));
            let failed = s.fill(self.n, Slot::Submitted(stand_in));
            finish(failed);
        }
    }
}

/// Completes what failed outside the state lock (a waker may run its op
/// right here, and that op may submit).
pub(super) fn finish(failed: Failed) {
    for (p, part, message) in failed {
        p.done(part, Err(message), false);
    }
}

impl Shared {
    /// The state of communicator `raw` (and `messages`, its second
    /// duplicate), nothing issued yet.
    pub(super) fn new(
        (raw, messages): (ffi::MPI_Comm, ffi::MPI_Comm),
        in_place: usize,
        rank: usize,
        size: usize,
    ) -> Self {
        Self {
            raw,
            messages,
            in_place,
            rank,
            size,
            next_ticket: AtomicU64::new(0),
            state: Mutex::new(State {
                next_issue: 0,
                waiting: VecDeque::new(),
                requests: Vec::new(),
                in_flight: Vec::new(),
                data_bytes: 0,
                data_calls: 0,
                asleep: false,
                held: false,
                issued: 0,
                closed: None,
                messages: Vec::new(),
            }),
            cv: Condvar::default(),
            scratch: Mutex::new(Vec::new()),
        }
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock()
    }

    /// Puts `slot` at ticket `n` and issues what is now first in line;
    /// returns what failed, to complete unlocked.
    pub(super) fn fill(&self, n: u64, slot: Slot) -> Failed {
        let mut failed = Vec::new();
        let mut st = self.lock();
        let i = (n - st.next_issue) as usize;
        while st.waiting.len() <= i {
            st.waiting.push_back(Slot::Open);
        }
        st.waiting[i] = slot;
        let before = st.issued;
        self.issue_ready(&mut st, &mut failed);
        // A progress thread that does not sleep sees the issue on its next
        // round: no notify (a system call) then.
        let wake = st.issued != before && st.asleep;
        drop(st);
        if wake {
            self.cv.notify_one();
        }
        failed
    }

    /// Issues the submitted collectives at the front of the line, in
    /// ticket order, until an open ticket, a stand-in's status word in
    /// flight, or a collective whose data would pass
    /// [`MAX_DATA_IN_FLIGHT`]; what fails goes to `failed`.
    pub(super) fn issue_ready(&self, st: &mut State, failed: &mut Failed) {
        self.issue_within(st, failed, MAX_DATA_IN_FLIGHT);
    }

    /// [`issue_ready`](Self::issue_ready) without the limit on data in
    /// flight: what only the limit held back goes out, as it would have
    /// without it (for a shutdown, which then fails the rest: the other
    /// ranks may have issued it).
    pub(super) fn issue_all_ready(&self, st: &mut State, failed: &mut Failed) {
        self.issue_within(st, failed, usize::MAX);
    }

    /// [`issue_ready`](Self::issue_ready) with at most `limit` bytes of
    /// data in flight.
    fn issue_within(&self, st: &mut State, failed: &mut Failed, limit: usize) {
        while !st.held && matches!(st.waiting.front(), Some(Slot::Submitted(_) | Slot::Void)) {
            if let Some(Slot::Submitted(p)) = st.waiting.front()
                && st.closed.is_none()
                && !st.has_room_for(p.bytes(), limit)
            {
                break;
            }
            let Some(Slot::Submitted(p)) = st.waiting.pop_front() else {
                st.next_issue += 1;
                continue;
            };
            st.next_issue += 1;
            if let Some(why) = st.closed {
                // On every rank alike (a shutdown at the same point of the
                // program): nothing is issued.
                failed.push((p.clone(), Part::Status, why.to_string()));
                failed.push((p, Part::Data, why.to_string()));
                continue;
            }
            match p.issue(self, Part::Status, 0) {
                Ok(requests) => st.push(requests, p.clone(), Part::Status),
                Err(rc) => {
                    // MPI refused a status word of four i64s: refused alike
                    // on every rank, so none issues the data call either.
                    let m = error_string(rc);
                    failed.push((p.clone(), Part::Status, m.clone()));
                    failed.push((p, Part::Data, m));
                    continue;
                }
            }
            if p.data_after_status() {
                st.held = true;
            } else {
                self.issue_data(st, p, failed);
            }
        }
    }

    /// `p`'s status word came back (`ok`: without an error), its request
    /// taken out of flight (the progress thread): a stand-in's data call
    /// goes out (see [`status_back`](Self::status_back)); if it says a rank
    /// failed, `p`'s message part waits its turn; the message parts whose
    /// turn it is now go out.
    pub(super) fn status_done(
        &self,
        st: &mut State,
        p: &Arc<dyn InFlight>,
        ok: bool,
        failed: &mut Failed,
    ) {
        if p.data_after_status() {
            self.status_back(st, p, ok, failed);
        }
        if ok && p.failed_root().is_some() {
            let n = p.ticket();
            let at = st.messages.partition_point(|q| q.ticket() < n);
            st.messages.insert(at, p.clone());
        }
        if !st.messages.is_empty() {
            self.issue_messages(st, failed);
        }
    }

    /// Issues the message parts waiting, in ticket order, up to the first
    /// whose ticket comes after a status word still in flight (even if shut
    /// down since: the other ranks wait for them).
    fn issue_messages(&self, st: &mut State, failed: &mut Failed) {
        while let Some(first) = st.messages.first() {
            let n = first.ticket();
            let earlier_status_out = st
                .in_flight
                .iter()
                .any(|(q, part)| *part == Part::Status && q.ticket() < n);
            if earlier_status_out {
                break;
            }
            let p = st.messages.remove(0);
            match p.issue(self, Part::Message, 0) {
                Ok(requests) => st.push(requests, p, Part::Message),
                Err(rc) => failed.push((p, Part::Message, error_string(rc))),
            }
        }
    }

    /// A stand-in's status word came back (`ok`: without an error): its
    /// data call goes out now (even if shut down since: the other ranks
    /// wait for it), then the line behind it.
    fn status_back(&self, st: &mut State, p: &Arc<dyn InFlight>, ok: bool, failed: &mut Failed) {
        st.held = false;
        if ok {
            self.issue_data(st, p.clone(), failed);
        }
        self.issue_ready(st, failed);
    }

    /// Data calls of `bytes` in all completed (the progress thread): the
    /// line may go on.
    pub(super) fn data_done(&self, st: &mut State, bytes: usize, failed: &mut Failed) {
        st.data_bytes -= bytes;
        self.issue_ready(st, failed);
    }

    fn issue_data(&self, st: &mut State, p: Arc<dyn InFlight>, failed: &mut Failed) {
        // Every rank numbers its data calls alike (the same calls in the
        // same order): a ring's messages carry its number as their tag.
        let tag = super::ring::tag(st.data_calls);
        st.data_calls += 1;
        match p.issue(self, Part::Data, tag) {
            Ok(requests) => {
                st.data_bytes += p.bytes();
                st.push(requests, p, Part::Data);
            }
            Err(rc) => failed.push((p, Part::Data, error_string(rc))),
        }
    }
}

impl State {
    /// Puts `requests` of `p`'s `part` in flight.
    pub(super) fn push(&mut self, requests: Requests, p: Arc<dyn InFlight>, part: Part) {
        for request in requests.iter() {
            self.requests.push(request);
            self.in_flight.push((p.clone(), part));
            self.issued += 1;
        }
    }

    /// Whether a collective of `bytes` may go out now: nothing is in
    /// flight, or it keeps the data in flight within `limit`.
    fn has_room_for(&self, bytes: usize, limit: usize) -> bool {
        self.data_bytes == 0 || self.data_bytes.saturating_add(bytes) <= limit
    }
}

#[cfg(test)]
mod tests {
    use std::ffi::c_int;
    use std::sync::Mutex as StdMutex;
    use std::sync::atomic::Ordering::Relaxed;

    use super::*;

    type Log = Arc<StdMutex<Vec<(u32, Part)>>>;

    /// Records the order its parts are issued in; MPI is never called.
    struct Fake {
        id: u32,
        stand_in: bool,
        bytes: usize,
        log: Log,
        outcomes: StdMutex<Vec<(Part, Result<(), String>)>>,
        /// Its data call is a ring's first step: two requests.
        ring: bool,
        /// The tag its data call was given.
        tag: StdMutex<Option<c_int>>,
        /// The failing rank its status word names once back.
        failed: Option<usize>,
    }

    impl InFlight for Fake {
        fn issue(&self, _: &Shared, part: Part, tag: c_int) -> Result<Requests, c_int> {
            self.log.lock().unwrap().push((self.id, part));
            let mut requests = Requests::default();
            let n = if part == Part::Data && self.ring {
                2
            } else {
                1
            };
            for _ in 0..n {
                // SAFETY: rsmpi's null request, a plain value.
                *requests.slot() = unsafe { ffi::RSMPI_REQUEST_NULL };
            }
            if part == Part::Data {
                *self.tag.lock().unwrap() = Some(tag);
            }
            Ok(requests)
        }
        fn done(&self, part: Part, outcome: Result<(), String>, _: bool) {
            self.outcomes.lock().unwrap().push((part, outcome));
        }
        fn data_after_status(&self) -> bool {
            self.stand_in
        }
        fn bytes(&self) -> usize {
            self.bytes
        }
        /// Its id: the tests give them in ticket order.
        fn ticket(&self) -> u64 {
            u64::from(self.id)
        }
        fn failed_root(&self) -> Option<usize> {
            self.failed
        }
    }

    fn shared() -> Arc<Shared> {
        // SAFETY: rsmpi's null communicator, a plain value (unused).
        let null = unsafe { ffi::RSMPI_COMM_NULL };
        Arc::new(Shared::new((null, null), 1, 0, 2))
    }

    /// A ticket's place, filled by hand (a dropped `Ticket` would make a
    /// real stand-in, which calls MPI).
    fn place(shared: &Arc<Shared>) -> u64 {
        shared.next_ticket.fetch_add(1, Relaxed)
    }

    fn fake(id: u32, stand_in: bool, log: &Log) -> Arc<Fake> {
        sized(id, stand_in, 8, log)
    }

    fn sized(id: u32, stand_in: bool, bytes: usize, log: &Log) -> Arc<Fake> {
        Arc::new(Fake {
            id,
            stand_in,
            bytes,
            log: log.clone(),
            outcomes: StdMutex::new(Vec::new()),
            ring: false,
            tag: StdMutex::new(None),
            failed: None,
        })
    }

    fn submit(s: &Shared, n: u64, f: &Arc<Fake>) {
        finish(s.fill(n, Slot::Submitted(f.clone())));
    }

    use Part::{Data, Message, Status};

    /// What the progress thread does when the status word of collective
    /// `id` comes back (`ok`: without an error): its request taken out of
    /// flight, then `status_done`.
    fn status_back(s: &Shared, id: u32, ok: bool) -> Failed {
        let mut failed = Vec::new();
        let mut st = s.lock();
        let i = st
            .in_flight
            .iter()
            .position(|(p, part)| *part == Status && p.ticket() == u64::from(id))
            .expect("its status word is in flight");
        st.requests.swap_remove(i);
        let (p, _) = st.in_flight.swap_remove(i);
        s.status_done(&mut st, &p, ok, &mut failed);
        failed
    }

    /// The issue log of collectives `ids` issued one after the other, each
    /// its status word first.
    fn status_then_data(ids: &[u32]) -> Vec<(u32, Part)> {
        ids.iter()
            .flat_map(|&id| [(id, Status), (id, Data)])
            .collect()
    }

    #[test]
    fn collectives_are_issued_in_ticket_order_status_word_first() {
        let s = shared();
        let log = Log::default();
        let (t0, t1, t2) = (place(&s), place(&s), place(&s));
        let (f0, f1, f2) = (
            fake(0, false, &log),
            fake(1, false, &log),
            fake(2, false, &log),
        );
        submit(&s, t2, &f2);
        submit(&s, t1, &f1);
        assert!(log.lock().unwrap().is_empty(), "issued before ticket 0");
        submit(&s, t0, &f0);
        assert_eq!(*log.lock().unwrap(), status_then_data(&[0, 1, 2]));
        let st = s.lock();
        assert_eq!((st.next_issue, st.requests.len(), st.issued), (3, 6, 6));
        assert!(st.waiting.is_empty() && !st.held);
    }

    #[test]
    fn a_stand_in_holds_the_line_until_its_status_word_is_back() {
        let s = shared();
        let log = Log::default();
        let (t0, t1, t2) = (place(&s), place(&s), place(&s));
        let (f1, f2) = (fake(1, false, &log), fake(2, false, &log));
        let stand_in = fake(0, true, &log);
        submit(&s, t1, &f1);
        submit(&s, t0, &stand_in); // its op failed: a stand-in takes part
        assert_eq!(*log.lock().unwrap(), [(0, Status)]);
        submit(&s, t2, &f2);
        assert_eq!(log.lock().unwrap().len(), 1, "issued past a held line");
        assert!(status_back(&s, 0, true).is_empty());
        assert_eq!(*log.lock().unwrap(), status_then_data(&[0, 1, 2]));
        assert!(!s.lock().held);
    }

    #[test]
    fn a_collective_waits_while_the_data_in_flight_would_pass_the_limit() {
        let s = shared();
        let log = Log::default();
        let big = MAX_DATA_IN_FLIGHT * 3 / 4;
        let small = MAX_DATA_IN_FLIGHT / 8;
        let ids = [0, 1, 2, 3];
        let sizes = [big, big, small, 16 * MAX_DATA_IN_FLIGHT];
        for (&id, &bytes) in ids.iter().zip(&sizes) {
            submit(&s, place(&s), &sized(id, false, bytes, &log));
        }
        assert_eq!(*log.lock().unwrap(), status_then_data(&[0]));
        assert_eq!(s.lock().data_bytes, big);
        // What the progress thread does when a data call completes: the
        // next big one goes, and the small one fits beside it.
        let mut failed = Vec::new();
        s.data_done(&mut s.lock(), big, &mut failed);
        assert_eq!(*log.lock().unwrap(), status_then_data(&[0, 1, 2]));
        assert_eq!(s.lock().data_bytes, big + small);
        // One larger than the limit goes alone, once nothing is in flight.
        s.data_done(&mut s.lock(), big, &mut failed);
        assert_eq!(log.lock().unwrap().len(), 6, "issued past the limit");
        s.data_done(&mut s.lock(), small, &mut failed);
        assert_eq!(*log.lock().unwrap(), status_then_data(&[0, 1, 2, 3]));
        assert_eq!(s.lock().data_bytes, 16 * MAX_DATA_IN_FLIGHT);
        assert!(failed.is_empty());
    }

    #[test]
    fn a_failed_ranks_message_goes_out_in_ticket_order_once_no_earlier_status_word_is_out() {
        let s = shared();
        let log = Log::default();
        let failing = |id| {
            Arc::new(Fake {
                failed: Some(1),
                ..Arc::into_inner(fake(id, false, &log)).unwrap()
            })
        };
        let (f0, f1, f2) = (failing(0), fake(1, false, &log), failing(2));
        for f in [&f0, &f1, &f2] {
            submit(&s, place(&s), f);
        }
        let issued = status_then_data(&[0, 1, 2]);
        assert_eq!(*log.lock().unwrap(), issued);
        // Collective 2's word is back first, saying rank 1 failed: its
        // message waits for the earlier ones' words (another rank may see
        // collective 0 fail first).
        assert!(status_back(&s, 2, true).is_empty());
        assert_eq!(*log.lock().unwrap(), issued);
        // Collective 0's is back, failed too: its message goes, 2's waits
        // for 1's word.
        assert!(status_back(&s, 0, true).is_empty());
        assert_eq!(log.lock().unwrap()[6..], [(0, Message)]);
        // Collective 1's is back (nothing failed): 2's message goes.
        assert!(status_back(&s, 1, true).is_empty());
        assert_eq!(log.lock().unwrap()[6..], [(0, Message), (2, Message)]);
        let st = s.lock();
        assert!(st.messages.is_empty());
        let count = |part| st.in_flight.iter().filter(|f| f.1 == part).count();
        assert_eq!((count(Data), count(Message), count(Status)), (3, 2, 0));
        // Messages are not data: the limit's count is the data calls'.
        assert_eq!(st.data_bytes, 3 * 8);
    }

    #[test]
    fn a_status_word_back_with_an_error_sends_no_message() {
        let s = shared();
        let log = Log::default();
        let f = Arc::new(Fake {
            failed: Some(0),
            ..Arc::into_inner(fake(0, false, &log)).unwrap()
        });
        submit(&s, place(&s), &f);
        assert!(status_back(&s, 0, false).is_empty());
        assert_eq!(*log.lock().unwrap(), status_then_data(&[0]));
        assert!(s.lock().messages.is_empty());
    }

    #[test]
    fn a_data_call_of_two_requests_counts_its_bytes_once_and_data_calls_are_tagged_in_order() {
        let s = shared();
        let log = Log::default();
        let ring = Arc::new(Fake {
            ring: true,
            ..Arc::into_inner(sized(0, false, 4 * MAX_DATA_IN_FLIGHT, &log)).unwrap()
        });
        let after = fake(1, false, &log);
        submit(&s, place(&s), &ring);
        submit(&s, place(&s), &after);
        {
            let st = s.lock();
            // Its status word, then its two requests, its bytes counted
            // once; the next collective waits behind it.
            let parts: Vec<_> = st.in_flight.iter().map(|f| f.1).collect();
            assert_eq!(parts, [Status, Data, Data]);
            assert_eq!(
                (st.data_bytes, st.requests.len()),
                (4 * MAX_DATA_IN_FLIGHT, 3)
            );
        }
        s.data_done(&mut s.lock(), 4 * MAX_DATA_IN_FLIGHT, &mut Vec::new());
        assert_eq!(*log.lock().unwrap(), status_then_data(&[0, 1]));
        let tags = [&ring, &after].map(|f| f.tag.lock().unwrap().unwrap());
        assert_eq!(tags, [0, 1]);
    }

    #[test]
    fn what_the_limit_held_back_goes_out_when_all_ready_is_issued_at_shutdown() {
        let s = shared();
        let log = Log::default();
        for id in 0..3 {
            submit(&s, place(&s), &sized(id, false, MAX_DATA_IN_FLIGHT, &log));
        }
        assert_eq!(*log.lock().unwrap(), status_then_data(&[0]));
        let (mut st, mut failed) = (s.lock(), Vec::new());
        s.issue_all_ready(&mut st, &mut failed);
        assert_eq!(*log.lock().unwrap(), status_then_data(&[0, 1, 2]));
        assert!(failed.is_empty());
    }

    #[test]
    fn after_closing_submissions_fail_without_being_issued() {
        let s = shared();
        let log = Log::default();
        let (t0, t1) = (place(&s), place(&s));
        let f1 = fake(1, false, &log);
        submit(&s, t1, &f1); // waits for ticket 0
        s.lock().closed = Some("closed");
        submit(&s, t0, &fake(0, true, &log));
        assert!(log.lock().unwrap().is_empty());
        let closed = Err("closed".to_string());
        assert_eq!(
            *f1.outcomes.lock().unwrap(),
            [(Status, closed.clone()), (Data, closed)]
        );
    }
}
