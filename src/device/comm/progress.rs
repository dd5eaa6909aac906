//! A communicator's progress thread: it tests the outstanding requests,
//! completes those done, issues a stand-in's data call once its status
//! word came back, and a failed rank's message once its turn comes
//! (`order.rs`), posts a ring's next step once its last one is done
//! (`ring.rs`), and frees the communicator once closed with nothing in
//! flight.
//!
//! **Progress.** Open MPI's non-blocking collectives progress only inside
//! MPI calls, so while anything is in flight the thread keeps testing:
//! since the last completion or issue, it spins between rounds for
//! [`SPIN_FOR`] plus the time the data in flight takes at
//! [`FAST_BYTES_PER_US`], then yields until [`YIELD_FOR`] plus its time at
//! [`SLOW_BYTES_PER_US`], then sleeps between rounds, each nap a share of
//! the time waited ([`NAP_SHARE`]), up to [`NAP_MAX`]; a completion or a
//! newly issued request starts it spinning again (an issue wakes a
//! sleeping thread). So it spins while its data can still be moving at
//! full speed, yields while it may be moving slowly, and naps once some
//! rank is late. With nothing in
//! flight it yields and looks for [`LINGER`], for a collective that
//! follows at once, then waits on a condition variable, using no CPU.
//!
//! Owns the thread's round (testing under the state lock, completing
//! outside it) and its back-off ([`Backoff`]); the requests and what they
//! belong to are `order.rs`'s state.

// `unsafe`: `MPI_Testsome` on the requests in flight, freeing the
// communicator; each block says why it is sound.
#![allow(unsafe_code)]

use std::ffi::c_int;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mpi::ffi;

use super::calls::{InFlight, Part};
use super::library::error_string;
use super::order::{Failed, Shared};
use super::ring::Step;

/// Since the last completion or issue, the progress thread spins between
/// rounds of `MPI_Testsome` for this long plus the data's time at
/// [`FAST_BYTES_PER_US`], then yields until [`YIELD_FOR`] plus its time at
/// [`SLOW_BYTES_PER_US`], then naps.
const SPIN_FOR: Duration = Duration::from_micros(250);
/// See [`SPIN_FOR`].
const YIELD_FOR: Duration = Duration::from_millis(1);
/// The rate (2 GB/s, a quarter to a half of what 2 ranks reach on one
/// machine from 1 MiB up) at which the data in flight extends the spin.
/// A collective progresses only inside a test, and a thread that yields
/// between tests slowed large ones (`benches/mpi_allreduce.rs`, 2 ranks,
/// libnbc's ring, 6 runs alternated, median time over the blocking call's:
/// 1.12 at 4 MiB and 1.07 at 1 MiB spinning for 250 µs, 1.03 and 1.02
/// spinning for 5 ms). Sized by the data, the spin stays short for the
/// small collectives of a training step, where a rank spinning for a late
/// one would take a core its peer computes on.
const FAST_BYTES_PER_US: u64 = 2000;
/// The rate (1 GB/s) at which the data in flight puts off the naps. A nap
/// in the middle of a collective holds up its next round
/// (`benches/mpi_allreduce.rs`, 16 MiB, 8 runs alternated: a median 1.10
/// times the blocking call napping after 1 ms, 1.00 napping after 17.8
/// ms); a rank waiting for a late one still naps, only later.
const SLOW_BYTES_PER_US: u64 = 1000;
/// A nap lasts this fraction (1 / `NAP_SHARE`) of the time since the last
/// completion or issue (31 µs or more), up to [`NAP_MAX`]. A collective
/// progresses only inside a test, so each nap can hold up one of its
/// rounds; as a share of the time already waited, it delays a collective
/// of a few rounds by a few percent. (`benches/mpi_allreduce.rs`, 2 ranks,
/// Open MPI's default algorithm, 3 runs: the engine op took 1.13 to 1.16
/// times `MPI_Iallreduce` + `MPI_Wait` at 1 MiB and 1.08 to 1.31 at 4 MiB
/// with naps from 10 µs doubling to 200 µs after 512 rounds, 0.97 to 1.03
/// and 0.94 to 0.96 with these.)
const NAP_SHARE: u32 = 32;
/// The longest nap: a rank waiting for a late one tests some 5000 times a
/// second.
const NAP_MAX: Duration = Duration::from_micros(200);
/// How long the progress thread, its last request done, yields and looks
/// for a new one before it waits on the condition variable: a collective
/// issued within that time is tested at once, without waking the thread.
/// `benches/mpi_allreduce.rs`, 2 ranks on 2 cores, 1 KiB: 8 µs per
/// all-reduce without it, 7 with it; 8 pushed back to back, 8 µs each
/// without, 3.5 with.
const LINGER: Duration = Duration::from_micros(20);

/// How long the progress thread waits before its next round of testing:
/// spin, then yield, then nap (see [`SPIN_FOR`] and the module docs).
/// `reset` when something completed or was issued.
#[derive(Debug)]
struct Backoff {
    since: Instant,
}

/// What the progress thread does before its next round.
#[derive(Debug, PartialEq, Eq)]
enum Pause {
    Spin,
    Yield,
    Nap(Duration),
}

impl Backoff {
    fn new(now: Instant) -> Self {
        Self { since: now }
    }

    fn reset(&mut self, now: Instant) {
        self.since = now;
    }

    /// A round completed nothing, with `bytes` of data in flight: what to
    /// do before the next one.
    fn next(&self, now: Instant, bytes: usize) -> Pause {
        let idle = now.saturating_duration_since(self.since);
        let at = |rate: u64| Duration::from_micros(bytes as u64 / rate);
        if idle < SPIN_FOR.saturating_add(at(FAST_BYTES_PER_US)) {
            Pause::Spin
        } else if idle < YIELD_FOR.saturating_add(at(SLOW_BYTES_PER_US)) {
            Pause::Yield
        } else {
            Pause::Nap((idle / NAP_SHARE).min(NAP_MAX))
        }
    }
}

/// The progress thread: tests the outstanding requests, completes those
/// done, issues a stand-in's data call once its status word came back,
/// and frees the communicator once closed with nothing in flight.
pub(super) fn progress(shared: &Shared) {
    let mut indices: Vec<c_int> = Vec::new();
    let mut statuses: Vec<ffi::MPI_Status> = Vec::new();
    // What completed this round: the collective, its part, its outcome,
    // whether its buffer must be leaked.
    type Done = (Arc<dyn InFlight>, Part, Result<(), String>, bool);
    let mut done: Vec<Done> = Vec::new();
    let mut failed: Failed = Vec::new();
    let mut hit: Vec<(usize, c_int)> = Vec::new();
    // When the last round with requests in flight began: the round's clock.
    let mut last_busy = Instant::now();
    let mut backoff = Backoff::new(last_busy);
    let mut seen = 0u64; // requests issued as of the last round
    let mut pause = Pause::Spin;
    loop {
        let mut st = shared.lock();
        if let Pause::Nap(nap) = pause {
            // Woken early by an issue (`fill` notifies).
            if st.issued == seen && !st.requests.is_empty() {
                st.asleep = true;
                st = shared.cv.wait_timeout(st, nap).0;
                st.asleep = false;
            }
        }
        while st.requests.is_empty() {
            if st.closed.is_some() {
                drop(st);
                free([shared.raw, shared.messages]);
                return;
            }
            if last_busy.elapsed() < LINGER {
                // The next collective often follows at once: be there.
                drop(st);
                std::thread::yield_now();
                st = shared.lock();
                continue;
            }
            st.asleep = true;
            st = shared.cv.wait(st);
            st.asleep = false;
        }
        last_busy = Instant::now();
        if st.issued != seen {
            seen = st.issued;
            backoff.reset(last_busy);
        }
        let n = st.requests.len();
        let bytes = st.data_bytes;
        indices.resize(n, 0);
        // SAFETY: MPI_Status is plain data; zero is a valid value.
        statuses.resize(n, unsafe { std::mem::zeroed() });
        let mut outcount: c_int = 0;
        // SAFETY: the arrays hold `n` elements each, as MPI_Testsome needs;
        // every request is an outstanding one of `raw`, called under the
        // state lock.
        let rc = unsafe {
            ffi::MPI_Testsome(
                n as c_int,
                st.requests.as_mut_ptr(),
                &mut outcount,
                indices.as_mut_ptr(),
                statuses.as_mut_ptr(),
            )
        };
        let in_status = rc == ffi::MPI_ERR_IN_STATUS as c_int;
        if rc != ffi::MPI_SUCCESS as c_int && !in_status {
            // The requests' state is unknown: fail them all, keep their
            // buffers from being freed, issue nothing more.
            let message = format!("MPI_Testsome failed: {}", error_string(rc));
            st.requests.clear();
            st.held = false;
            st.data_bytes = 0;
            st.closed = Some("MPI_Testsome failed: the communicator is unusable");
            for (p, part) in st.in_flight.drain(..) {
                // Once per part (a ring's step is two requests).
                if !done.iter().any(|d| d.1 == part && Arc::ptr_eq(&d.0, &p)) {
                    done.push((p, part, Err(message.clone()), true));
                }
            }
            // Message parts waiting their turn: never issued.
            for p in std::mem::take(&mut st.messages) {
                failed.push((p, Part::Message, message.clone()));
            }
            shared.issue_ready(&mut st, &mut failed);
        } else if outcount > 0 {
            // (MPI_UNDEFINED, negative, only when no request is active.)
            let k = outcount as usize;
            hit.extend((0..k).map(|j| (indices[j] as usize, statuses[j].MPI_ERROR)));
            // From the last index down, so that `swap_remove` keeps the
            // others' indices.
            hit.sort_unstable_by_key(|h| std::cmp::Reverse(h.0));
            let mut freed = 0; // bytes of the data calls done
            for (i, err) in hit.drain(..) {
                st.requests.swap_remove(i);
                let (p, part) = st.in_flight.swap_remove(i);
                let outcome = if in_status && err != ffi::MPI_SUCCESS as c_int {
                    Err(error_string(err))
                } else {
                    Ok(())
                };
                if part == Part::Status {
                    shared.status_done(&mut st, &p, outcome.is_ok(), &mut failed);
                    done.push((p, part, outcome, false));
                    continue;
                }
                if part == Part::Message {
                    done.push((p, part, outcome, false));
                    continue;
                }
                match p.advance(shared, outcome) {
                    Step::Waiting => {}
                    Step::Posted(requests) => st.push(requests, p, Part::Data),
                    Step::Done { outcome, leak } => {
                        freed += p.bytes();
                        done.push((p, part, outcome, leak));
                    }
                }
            }
            if freed > 0 {
                shared.data_done(&mut st, freed, &mut failed);
            }
        }
        drop(st);
        if done.is_empty() && failed.is_empty() {
            pause = backoff.next(last_busy, bytes);
            match pause {
                Pause::Spin => std::hint::spin_loop(),
                Pause::Yield => std::thread::yield_now(),
                Pause::Nap(_) => {} // at the top, under the lock
            }
        } else {
            backoff.reset(last_busy);
            pause = Pause::Spin;
            for (p, part, outcome, leak) in done.drain(..) {
                p.done(part, outcome, leak);
            }
            for (p, part, message) in failed.drain(..) {
                p.done(part, Err(message), false);
            }
        }
    }
}

/// Frees the duplicated communicators, unless MPI was finalised already.
fn free(raw: [ffi::MPI_Comm; 2]) {
    let mut finalized: c_int = 0;
    // SAFETY: MPI_Finalized may be called at any time; MPI_Comm_free on
    // the communicators this module duplicated, with no request left on
    // them.
    unsafe {
        ffi::MPI_Finalized(&mut finalized);
        if finalized == 0 {
            for mut raw in raw {
                ffi::MPI_Comm_free(&mut raw);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_progress_thread_spins_then_yields_then_naps_a_share_of_the_wait_up_to_a_bound() {
        let t0 = Instant::now();
        let mut b = Backoff::new(t0);
        let at = |us: u64| t0 + Duration::from_micros(us);
        assert_eq!(b.next(t0, 0), Pause::Spin);
        assert_eq!(b.next(at(249), 0), Pause::Spin);
        assert_eq!(b.next(at(250), 0), Pause::Yield);
        assert_eq!(b.next(at(999), 0), Pause::Yield);
        assert_eq!(
            b.next(at(1000), 0),
            Pause::Nap(Duration::from_nanos(31_250))
        );
        assert_eq!(b.next(at(3200), 0), Pause::Nap(Duration::from_micros(100)));
        assert_eq!(b.next(at(1_000_000), 0), Pause::Nap(NAP_MAX));
        b.reset(at(1_000_000));
        assert_eq!(b.next(at(1_000_010), 0), Pause::Spin);
        // A clock read before the reset is no later than it.
        assert_eq!(b.next(at(999_000), 0), Pause::Spin);
    }

    #[test]
    fn data_in_flight_extends_the_spin_and_puts_off_the_naps_by_its_time() {
        let t0 = Instant::now();
        let b = Backoff::new(t0);
        let at = |us: u64| t0 + Duration::from_micros(us);
        let mib16 = 16 << 20; // 8.4 ms at 2 GB/s, 16.8 ms at 1 GB/s
        assert_eq!(b.next(at(8_600), mib16), Pause::Spin);
        assert_eq!(b.next(at(8_700), mib16), Pause::Yield);
        assert_eq!(b.next(at(17_700), mib16), Pause::Yield);
        assert_eq!(b.next(at(17_800), mib16), Pause::Nap(NAP_MAX));
        // A small one about as with none (1 KiB: 1 µs later).
        assert_eq!(b.next(at(250), 1 << 10), Pause::Yield);
        assert_eq!(b.next(at(1000), 1 << 10), Pause::Yield);
        assert_eq!(
            b.next(at(1001), 1 << 10),
            Pause::Nap(Duration::from_nanos(31_281))
        );
    }
}
