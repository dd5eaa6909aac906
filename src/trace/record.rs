//! The trace recorder: what the lifecycle hooks write while a trace is on,
//! as fixed-size [`Event`]s in one bounded ring per thread.
//!
//! A hook appends to its own thread's ring, under that ring's lock, which
//! only a snapshot ever contends for: no allocation per op (a thread's ring
//! is allocated once, when it first records; an op's owned name is
//! interned once per distinct name), no shared counter between workers.
//! A full ring overwrites its oldest events and counts them.
//!
//! An event names its op by address: the block stays at that address from
//! its push until after it ended, and the address is reused only by an op
//! pushed after that, so `timeline` pairs events with ops by replaying them
//! in time order (a push opens an op at its address).
//!
//! # Who touches what
//!
//! | field | written by | read by |
//! | --- | --- | --- |
//! | `on` | `set_on` (the user) | every hook (`Relaxed`: a window's edge need not be exact) |
//! | `threads` | a thread's first event (registers its ring) | `snapshot`, `clear` |
//! | a ring | its thread's hooks; `clear` | `snapshot` |
//! | `names` | hooks of ops with owned names | `snapshot` |

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Weak};
use std::time::Instant;

use crate::dep::{OpBlock, RecordedRun};
use crate::error::VarId;
use crate::loom::sync::Mutex;

/// Events a thread's ring holds unless the builder says otherwise.
pub(crate) const DEFAULT_EVENTS_PER_THREAD: usize = 1 << 16;

/// An op's name as an event holds it: a static string as is, an owned one
/// by its number among the recorder's interned names.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Name {
    None,
    Static(&'static str),
    Interned(u32),
}

/// What happened to an op (or to a resource).
#[derive(Clone, Copy, Debug)]
pub(crate) enum What {
    /// Pushed to `device` (its lane if on a stream device), with its
    /// variables in the `Var` events that follow on the same thread.
    Pushed {
        name: Name,
        device: u16,
        lane: Option<u8>,
    },
    /// One variable the op declared.
    Var { var: VarId, write: bool },
    /// Every variable granted it; `by` is the op whose completion gave the
    /// last grant (0: none).
    Ready { by: usize },
    /// It got its units; `by` as for `Ready` (0: they were free when it
    /// asked), or [`BY_A_VARIABLE`].
    Granted { by: usize },
    /// Its body started on this thread.
    Started,
    /// Its async body awaits.
    Suspended,
    /// Its async body is polled again, on this thread.
    Resumed,
    /// A stream op's body enqueued its device work.
    Enqueued,
    /// It ended: body over, or device work done.
    Ended,
    /// `pool` has `in_use` units taken (by ops or variables).
    Units { pool: u32, in_use: u64 },
    /// A run of a recorded op named `name` starts on this thread, in the
    /// replay whose op is the event's (a thread runs one recorded op at a
    /// time: the next two events pair with it by thread).
    Recorded { name: Name },
    /// This thread's run of a recorded op of the event's replay ended.
    RecordedEnded,
    /// This thread's run of a recorded op of the event's replay stopped
    /// before its body (it waits for device work): it is no run, and starts
    /// again later.
    RecordedDeferred,
}

/// `What::Granted::by` when a variable let the units go (no op did).
pub(crate) const BY_A_VARIABLE: usize = usize::MAX;

/// One recorded event. `op` is the op's address (0 for `Units`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Event {
    /// Nanoseconds since the recorder's epoch.
    pub(crate) at: u64,
    pub(crate) op: usize,
    pub(crate) what: What,
}

/// One thread's bounded ring of events.
struct Ring {
    events: Vec<Event>,
    /// Where the next event goes once the ring is full.
    next: usize,
    /// Events overwritten since the last `clear`.
    dropped: u64,
}

impl Ring {
    fn push(&mut self, event: Event) {
        if self.events.len() < self.events.capacity() {
            self.events.push(event);
        } else {
            self.events[self.next] = event;
            self.next = (self.next + 1) % self.events.len();
            self.dropped += 1;
        }
    }

    /// The events, oldest first.
    fn in_order(&self) -> impl Iterator<Item = &Event> {
        let (newer, older) = self.events.split_at(self.next);
        older.iter().chain(newer)
    }
}

/// A thread's ring, with the thread's name (its track).
struct ThreadLog {
    track: String,
    ring: Mutex<Ring>,
}

/// What a snapshot copies out of one thread's ring.
pub(crate) struct ThreadEvents {
    pub(crate) track: String,
    pub(crate) events: Vec<Event>,
}

/// Everything recorded so far.
pub(crate) struct Snapshot {
    pub(crate) threads: Vec<ThreadEvents>,
    pub(crate) names: Vec<Box<str>>,
    pub(crate) dropped: u64,
}

#[derive(Default)]
struct Names {
    index: HashMap<Box<str>, u32>,
    list: Vec<Box<str>>,
}

/// An engine's trace recorder (see the module docs).
pub(crate) struct Recorder {
    /// Tells this recorder's rings from other engines' in a thread's list.
    id: u64,
    on: AtomicBool,
    epoch: Instant,
    events_per_thread: usize,
    threads: Mutex<Vec<Arc<ThreadLog>>>,
    names: Mutex<Names>,
    /// Dies with the recorder: tells threads their ring for it can go.
    alive: Arc<()>,
}

thread_local! {
    /// This thread's rings, one per recorder it recorded for, each with a
    /// token that dies with its recorder. Held strongly, so that a hit costs
    /// no reference count; a dead recorder's ring goes on the thread's next
    /// miss (or when the thread ends).
    static RINGS: RefCell<Vec<ThreadRing>> = const { RefCell::new(Vec::new()) };
}

/// A thread's entry for one recorder.
struct ThreadRing {
    recorder: u64,
    alive: Weak<()>,
    log: Arc<ThreadLog>,
}

impl Recorder {
    pub(crate) fn new(on: bool, events_per_thread: usize) -> Self {
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        Self {
            id: NEXT_ID.fetch_add(1, Relaxed),
            on: AtomicBool::new(on),
            epoch: Instant::now(),
            events_per_thread: events_per_thread.max(1),
            threads: Mutex::new(Vec::new()),
            names: Mutex::new(Names::default()),
            alive: Arc::new(()),
        }
    }

    /// Whether hooks record now.
    #[inline]
    pub(crate) fn is_on(&self) -> bool {
        self.on.load(Relaxed)
    }

    pub(crate) fn set_on(&self, on: bool) {
        self.on.store(on, Relaxed);
    }

    /// When the recorder was made: the trace's time zero.
    pub(crate) fn epoch(&self) -> Instant {
        self.epoch
    }

    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Appends `events` (at one instant) to this thread's ring.
    fn record(&self, op: usize, what: impl IntoIterator<Item = What>) {
        let at = self.now();
        self.with_ring(|ring| {
            for what in what {
                ring.push(Event { at, op, what });
            }
        });
    }

    /// Runs `f` on this thread's ring (none while the thread's locals are
    /// being destroyed: an op finishing then goes unrecorded).
    fn with_ring(&self, f: impl FnOnce(&mut Ring)) {
        let _ = RINGS.try_with(|rings| {
            let mut rings = rings.borrow_mut();
            let found = rings.iter().position(|r| r.recorder == self.id);
            let i = found.unwrap_or_else(|| {
                rings.retain(|r| r.alive.strong_count() > 0);
                let log = Arc::new(self.new_log());
                self.threads.lock().push(log.clone());
                rings.push(ThreadRing {
                    recorder: self.id,
                    alive: Arc::downgrade(&self.alive),
                    log,
                });
                rings.len() - 1
            });
            f(&mut rings[i].log.ring.lock());
        });
    }

    fn new_log(&self) -> ThreadLog {
        let thread = std::thread::current();
        let track = match thread.name() {
            Some(name) => name.to_string(),
            None => format!("{:?}", thread.id()),
        };
        ThreadLog {
            track,
            ring: Mutex::new(Ring {
                events: Vec::with_capacity(self.events_per_thread),
                next: 0,
                dropped: 0,
            }),
        }
    }

    fn name_of(&self, op: &OpBlock) -> Name {
        if let Some(name) = op.static_name() {
            return Name::Static(name);
        }
        let Some(name) = op.name() else {
            return Name::None;
        };
        let mut names = self.names.lock();
        if let Some(&n) = names.index.get(name) {
            return Name::Interned(n);
        }
        let n = u32::try_from(names.list.len()).unwrap_or(u32::MAX);
        names.list.push(name.into());
        names.index.insert(name.into(), n);
        Name::Interned(n)
    }

    pub(crate) fn pushed(&self, op: &OpBlock) {
        let pushed = What::Pushed {
            name: self.name_of(op),
            device: op.device_index(),
            lane: op.lane(),
        };
        let vars = op.edges().iter().map(|e| What::Var {
            var: e.var.id(),
            write: e.is_write(),
        });
        self.record(address(op), std::iter::once(pushed).chain(vars));
    }

    pub(crate) fn event(&self, op: &OpBlock, what: What) {
        self.record(address(op), [what]);
    }

    /// Recorded op `op` of the replay at `replay` is at `run`.
    pub(crate) fn recorded(&self, op: &OpBlock, replay: usize, run: RecordedRun) {
        let what = match run {
            RecordedRun::Started => What::Recorded {
                name: self.name_of(op),
            },
            RecordedRun::Ended => What::RecordedEnded,
            RecordedRun::Deferred => What::RecordedDeferred,
        };
        // Named by its replay's op: the event stays 48 bytes.
        self.record(replay, [what]);
    }

    pub(crate) fn units(&self, pool: usize, in_use: u64) {
        let pool = u32::try_from(pool).unwrap_or(u32::MAX);
        self.record(0, [What::Units { pool, in_use }]);
    }

    /// A copy of every ring, oldest event first per thread.
    pub(crate) fn snapshot(&self) -> Snapshot {
        let threads = self.threads.lock();
        let mut dropped = 0;
        let threads = threads
            .iter()
            .map(|log| {
                let ring = log.ring.lock();
                dropped += ring.dropped;
                ThreadEvents {
                    track: log.track.clone(),
                    events: ring.in_order().copied().collect(),
                }
            })
            .collect();
        Snapshot {
            threads,
            names: self.names.lock().list.clone(),
            dropped,
        }
    }

    /// Forgets every event recorded (keeping the rings' memory).
    pub(crate) fn clear(&self) {
        for log in self.threads.lock().iter() {
            let mut ring = log.ring.lock();
            ring.events.clear();
            ring.next = 0;
            ring.dropped = 0;
        }
    }
}

/// An op's address: its name in events.
#[inline]
pub(crate) fn address(op: &OpBlock) -> usize {
    std::ptr::from_ref(op) as usize
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// The builder's docs give a ring's size from this.
    #[test]
    fn an_event_takes_48_bytes() {
        assert_eq!(std::mem::size_of::<Event>(), 48);
    }

    #[test]
    fn a_full_ring_keeps_the_newest_and_counts_the_rest() {
        let mut ring = Ring {
            events: Vec::with_capacity(3),
            next: 0,
            dropped: 0,
        };
        for at in 0..5 {
            ring.push(Event {
                at,
                op: 0,
                what: What::Started,
            });
        }
        let kept: Vec<u64> = ring.in_order().map(|e| e.at).collect();
        assert_eq!(kept, [2, 3, 4]);
        assert_eq!(ring.dropped, 2);
    }
}
