//! A recorded [`Trace`]: the recorder's events put back together into ops
//! on tracks, with the op that unblocked each, and counters.
//!
//! Events name ops by address; replaying every thread's events in time
//! order, a push opens an op at its address and later events there belong
//! to it. An op whose push is not in the trace (it came before the trace was
//! started, or its thread's ring overwrote it) is left out. A recorded op's
//! run is named by its replay's op, and its end by the thread it ran on.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::record::{BY_A_VARIABLE, Name, Snapshot, What};
use crate::error::VarId;

/// What an engine recorded while it traced
/// ([`Engine::trace`](crate::Engine::trace)): every op pushed with the times
/// it went through, the tracks (threads and stream lanes) it ran on, which
/// op unblocked which, and how many ops were in flight and units in use over
/// time. Write it as Chrome trace-event JSON with
/// [`write_chrome_json`](Self::write_chrome_json) (Perfetto and
/// chrome://tracing open it), or look at it here.
///
/// Times are since the engine was built.
#[derive(Clone, Debug)]
pub struct Trace {
    pub(crate) start: Instant,
    pub(crate) ops: Vec<TracedOp>,
    pub(crate) tracks: Vec<Track>,
    pub(crate) in_flight: Vec<(Duration, usize)>,
    pub(crate) resources: Vec<ResourceTrack>,
    pub(crate) dropped: u64,
}

/// One op of a [`Trace`].
#[derive(Clone, Debug)]
pub struct TracedOp {
    pub(crate) id: u64,
    pub(crate) name: Option<String>,
    pub(crate) device: String,
    pub(crate) lane: Option<u8>,
    pub(crate) reads: Vec<VarId>,
    pub(crate) mutates: Vec<VarId>,
    pub(crate) pushed: Duration,
    pub(crate) ready: Option<Duration>,
    pub(crate) granted: Option<Duration>,
    pub(crate) started: Option<Duration>,
    pub(crate) enqueued: Option<Duration>,
    pub(crate) ended: Option<Duration>,
    pub(crate) unblocked_by: Option<u64>,
    pub(crate) slices: Vec<Slice>,
    pub(crate) replayed: Vec<ReplayedOp>,
}

/// One recorded op as a replay ran it ([`TracedOp::replayed`]): its run on
/// the thread that ran it (a stream op's: its enqueue).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplayedOp {
    /// The recorded op's name, if it has one.
    pub name: Option<String>,
    /// Its run.
    pub slice: Slice,
}

/// A stretch of time an op spent on one track: a poll of its body on a
/// thread, or its device work on a stream lane.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slice {
    /// Index into [`Trace::tracks`].
    pub track: usize,
    /// When it began.
    pub start: Duration,
    /// When it ended (`None`: it had not when the trace was taken).
    pub end: Option<Duration>,
}

/// Where ops run: a thread (a pool worker, a stream device's launcher, any
/// thread an inline executor ran an op on) or a stream device's lane.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Track {
    /// The thread's name (its id if it has none), or `device lane N`.
    pub name: String,
    /// Whether it is a stream lane (device work), not a thread.
    pub is_lane: bool,
}

/// A resource's units in use over time.
#[derive(Clone, Debug)]
pub struct ResourceTrack {
    /// The resource's name.
    pub name: String,
    /// Its capacity.
    pub capacity: u64,
    /// (when, units taken by ops and variables), in time order.
    pub in_use: Vec<(Duration, u64)>,
}

impl TracedOp {
    /// The op's number in this trace: its place in push order.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Its name, if it has one.
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// The name of the device it was pushed to.
    pub fn device(&self) -> &str {
        &self.device
    }

    /// Its lane, on a stream device.
    pub fn lane(&self) -> Option<u8> {
        self.lane
    }

    /// The variables it reads.
    pub fn reads(&self) -> &[VarId] {
        &self.reads
    }

    /// The variables it mutates.
    pub fn mutates(&self) -> &[VarId] {
        &self.mutates
    }

    /// When it was pushed.
    pub fn pushed(&self) -> Duration {
        self.pushed
    }

    /// When its last variable granted it (it had its dependencies).
    pub fn ready(&self) -> Option<Duration> {
        self.ready
    }

    /// When it got its resource units (ops that need units only).
    pub fn granted(&self) -> Option<Duration> {
        self.granted
    }

    /// When its body started (`None` if it was skipped, or has not started).
    pub fn started(&self) -> Option<Duration> {
        self.started
    }

    /// When its body had enqueued its device work (stream devices only).
    pub fn enqueued(&self) -> Option<Duration> {
        self.enqueued
    }

    /// When it ended: its body returned (or it was skipped); on a stream
    /// device, when its device work was seen complete.
    pub fn ended(&self) -> Option<Duration> {
        self.ended
    }

    /// The op whose completion (or units) made this one runnable, by
    /// [`id`](Self::id); `None` if nothing held it back at its push, or if
    /// what it waited for last were units a variable let go (deleted or
    /// dropped: no op).
    pub fn unblocked_by(&self) -> Option<u64> {
        self.unblocked_by
    }

    /// For a replay's op ([`Graph::replay`](crate::Graph::replay)): each
    /// recorded op of the replay as it ran, in the order the runs started
    /// (empty for other ops, and for replays whose runs the trace did not
    /// see). Its own [`slices`](Self::slices) are its body's: arming the
    /// replay, running the first ops inline, and its end.
    pub fn replayed(&self) -> &[ReplayedOp] {
        &self.replayed
    }

    /// Where it spent its time: each poll of its body on a thread, then its
    /// device work on a lane. An op skipped without running (an input was
    /// poisoned or deleted, or it was cancelled) has one empty slice on the
    /// thread that ended it; one that has not started has none.
    pub fn slices(&self) -> &[Slice] {
        &self.slices
    }
}

impl Trace {
    /// The ops, in push order (`ops()[i].id() == i`).
    pub fn ops(&self) -> &[TracedOp] {
        &self.ops
    }

    /// The tracks ops ran on: threads first, then stream lanes.
    pub fn tracks(&self) -> &[Track] {
        &self.tracks
    }

    /// Ops in flight (pushed, not ended) over time, in time order.
    pub fn in_flight(&self) -> &[(Duration, usize)] {
        &self.in_flight
    }

    /// Each resource's units in use over time (resources of the engine, by
    /// index).
    pub fn resources(&self) -> &[ResourceTrack] {
        &self.resources
    }

    /// Events lost because a thread recorded more than its buffer holds
    /// (the oldest go first; see
    /// [`EngineBuilder::trace_buffer`](crate::EngineBuilder::trace_buffer)).
    /// The ops they belonged to may be missing or incomplete.
    pub fn dropped_events(&self) -> u64 {
        self.dropped
    }

    /// The instant the trace's times count from.
    pub fn start(&self) -> Instant {
        self.start
    }
}

/// What a trace needs of its engine besides the events.
pub(crate) struct EngineInfo {
    pub(crate) start: Instant,
    pub(crate) devices: Vec<String>,
    /// Each resource's (name, capacity), by pool.
    pub(crate) resources: Vec<(String, u64)>,
}

fn ns(at: u64) -> Duration {
    Duration::from_nanos(at)
}

/// Puts `snapshot` together into a trace.
pub(crate) fn assemble(snapshot: Snapshot, info: EngineInfo) -> Trace {
    // Every event with its thread's index, in time order; at one instant,
    // a thread's own order is kept (the sort is stable).
    let mut events: Vec<(usize, &super::record::Event)> = snapshot
        .threads
        .iter()
        .enumerate()
        .flat_map(|(t, thread)| thread.events.iter().map(move |e| (t, e)))
        .collect();
    events.sort_by_key(|(_, e)| e.at);

    let mut tracks: Vec<Track> = Vec::new();
    let mut thread_track: Vec<Option<usize>> = vec![None; snapshot.threads.len()];
    let mut lane_track: HashMap<(u16, u8), usize> = HashMap::new();
    let mut ops: Vec<TracedOp> = Vec::new();
    let mut at_address: HashMap<usize, usize> = HashMap::new();
    let mut resources: Vec<ResourceTrack> = info
        .resources
        .iter()
        .map(|(name, capacity)| ResourceTrack {
            name: name.clone(),
            capacity: *capacity,
            in_use: Vec::new(),
        })
        .collect();
    let mut in_flight = Vec::new();
    let mut count = 0usize;
    // The lane of each op on a stream device, by index, for its device slice.
    let mut device_of: Vec<u16> = Vec::new();
    // Recorded ops running, by thread and replay (innermost last): their
    // replay's op and the run's place in its `replayed`; and the runs that
    // turned out to be none.
    let mut open_runs: HashMap<(usize, usize), Vec<(usize, usize)>> = HashMap::new();
    let mut deferred: Vec<(usize, usize)> = Vec::new();
    let name_of = |name: Name| match name {
        Name::None => None,
        Name::Static(s) => Some(s.to_string()),
        Name::Interned(n) => snapshot.names.get(n as usize).map(|s| s.to_string()),
    };

    let mut track_of_thread = |t: usize, tracks: &mut Vec<Track>| -> usize {
        *thread_track[t].get_or_insert_with(|| {
            tracks.push(Track {
                name: snapshot.threads[t].track.clone(),
                is_lane: false,
            });
            tracks.len() - 1
        })
    };

    for (t, event) in events {
        let at = ns(event.at);
        let op = match event.what {
            What::Units { pool, in_use } => {
                if let Some(r) = resources.get_mut(pool as usize) {
                    r.in_use.push((at, in_use));
                }
                continue;
            }
            What::Recorded { name } => {
                // A run of a replay the trace saw pushed: a slice of it.
                if let Some(&i) = at_address.get(&event.op) {
                    let track = track_of_thread(t, &mut tracks);
                    let runs = &mut ops[i].replayed;
                    open_runs
                        .entry((t, event.op))
                        .or_default()
                        .push((i, runs.len()));
                    runs.push(ReplayedOp {
                        name: name_of(name),
                        slice: Slice {
                            track,
                            start: at,
                            end: None,
                        },
                    });
                }
                continue;
            }
            What::RecordedEnded => {
                if let Some((i, k)) = open_runs.get_mut(&(t, event.op)).and_then(Vec::pop) {
                    ops[i].replayed[k].slice.end = Some(at);
                }
                continue;
            }
            What::RecordedDeferred => {
                if let Some(run) = open_runs.get_mut(&(t, event.op)).and_then(Vec::pop) {
                    deferred.push(run);
                }
                continue;
            }
            What::Pushed { name, device, lane } => {
                let name = name_of(name);
                at_address.insert(event.op, ops.len());
                ops.push(TracedOp {
                    id: ops.len() as u64,
                    name,
                    device: info
                        .devices
                        .get(usize::from(device))
                        .cloned()
                        .unwrap_or_default(),
                    lane,
                    reads: Vec::new(),
                    mutates: Vec::new(),
                    pushed: at,
                    ready: None,
                    granted: None,
                    started: None,
                    enqueued: None,
                    ended: None,
                    unblocked_by: None,
                    slices: Vec::new(),
                    replayed: Vec::new(),
                });
                device_of.push(device);
                count += 1;
                in_flight.push((at, count));
                continue;
            }
            _ => match at_address.get(&event.op) {
                Some(&i) => &mut ops[i],
                None => continue, // pushed before the trace
            },
        };
        let by = |by: usize| {
            (by != 0)
                .then(|| at_address.get(&by).map(|&i| i as u64))
                .flatten()
        };
        match event.what {
            What::Var { var, write } => {
                if write {
                    op.mutates.push(var);
                } else {
                    op.reads.push(var);
                }
            }
            What::Ready { by: b } => {
                op.ready = Some(at);
                op.unblocked_by = by(b);
            }
            What::Granted { by: b } => {
                op.granted = Some(at);
                if b == BY_A_VARIABLE {
                    // Its units came from a variable, not an op.
                    op.unblocked_by = None;
                } else if let Some(b) = by(b) {
                    op.unblocked_by = Some(b);
                }
            }
            What::Started | What::Resumed => {
                op.started.get_or_insert(at);
                let track = track_of_thread(t, &mut tracks);
                op.slices.push(Slice {
                    track,
                    start: at,
                    end: None,
                });
            }
            What::Suspended => close_slice(op, at),
            What::Enqueued => {
                op.enqueued = Some(at);
                close_slice(op, at);
                if let Some(lane) = op.lane {
                    let device = device_of[op.id as usize];
                    let track = *lane_track.entry((device, lane)).or_insert_with(|| {
                        tracks.push(Track {
                            name: format!("{} lane {lane}", op.device),
                            is_lane: true,
                        });
                        tracks.len() - 1
                    });
                    op.slices.push(Slice {
                        track,
                        start: at,
                        end: None,
                    });
                }
            }
            What::Ended => {
                op.ended = Some(at);
                close_slice(op, at);
                if op.slices.is_empty() {
                    // Skipped (poisoned, cancelled, an input deleted): an
                    // instant on the thread that ended it.
                    let track = track_of_thread(t, &mut tracks);
                    op.slices.push(Slice {
                        track,
                        start: at,
                        end: Some(at),
                    });
                }
                count -= 1;
                in_flight.push((at, count));
            }
            What::Pushed { .. }
            | What::Units { .. }
            | What::Recorded { .. }
            | What::RecordedEnded
            | What::RecordedDeferred => unreachable!("handled above"),
        }
    }
    // Runs that stopped before their body were none: the latest first, so
    // that the places of the others hold.
    deferred.sort_unstable_by(|a, b| b.cmp(a));
    for (i, k) in deferred {
        ops[i].replayed.remove(k);
    }
    // Threads first, then lanes, as `Trace::tracks` says: renumber.
    let mut order: Vec<usize> = (0..tracks.len()).collect();
    order.sort_by_key(|&i| (tracks[i].is_lane, i));
    let mut new_index = vec![0; tracks.len()];
    for (new, &old) in order.iter().enumerate() {
        new_index[old] = new;
    }
    for op in &mut ops {
        let runs = op.replayed.iter_mut().map(|r| &mut r.slice);
        for s in op.slices.iter_mut().chain(runs) {
            s.track = new_index[s.track];
        }
    }
    let tracks = order.into_iter().map(|i| tracks[i].clone()).collect();
    Trace {
        start: info.start,
        ops,
        tracks,
        in_flight,
        resources,
        dropped: snapshot.dropped,
    }
}

/// Ends the op's open slice, if it has one, at `at`.
fn close_slice(op: &mut TracedOp, at: Duration) {
    if let Some(s) = op.slices.last_mut()
        && s.end.is_none()
    {
        s.end = Some(at);
    }
}
