//! A [`Trace`] as Chrome trace-event JSON (the format of chrome://tracing,
//! which Perfetto opens too): one track (`tid`) per thread and per stream
//! lane, each op's polls and device work as complete (`X`) slices (the
//! first carries everything known of the op in its `args`; an op that has
//! not started by the time the trace was taken has none), each run of a
//! recorded op in a replay as an `X` slice of category `recorded` on the
//! thread that ran it (`args.replay`: the replay's op id), a flow
//! arrow from each op to the ops it unblocked, and counter (`C`) tracks for
//! the ops in flight and each resource's units in use.
//!
//! Written by hand: the format is small, and the crate takes no JSON
//! dependency for it.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::timeline::{Slice, Trace, TracedOp};
use crate::error::{Error, VarId};

/// Microseconds, as the format counts (fractions allowed).
fn us(d: Duration) -> f64 {
    d.as_nanos() as f64 / 1000.0
}

/// `s` as a JSON string literal.
fn quoted(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

fn var_list(out: &mut String, vars: &[VarId]) {
    out.push('[');
    for (i, v) in vars.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let _ = write!(out, "{}", v.0);
    }
    out.push(']');
}

/// The op's label on its slices.
fn label(op: &TracedOp) -> String {
    op.name()
        .map_or_else(|| format!("op #{}", op.id()), str::to_string)
}

fn opt_us(out: &mut String, key: &str, at: Option<Duration>) {
    if let Some(at) = at {
        let _ = write!(out, ",\"{key}\":{:.3}", us(at));
    }
}

/// The `args` of an op's first slice: everything the trace knows of it.
fn args(out: &mut String, op: &TracedOp) {
    let _ = write!(out, "{{\"id\":{},\"device\":", op.id());
    quoted(out, op.device());
    if let Some(lane) = op.lane() {
        let _ = write!(out, ",\"lane\":{lane}");
    }
    out.push_str(",\"reads\":");
    var_list(out, op.reads());
    out.push_str(",\"mutates\":");
    var_list(out, op.mutates());
    opt_us(out, "pushed_us", Some(op.pushed()));
    opt_us(out, "ready_us", op.ready());
    opt_us(out, "granted_us", op.granted());
    opt_us(out, "started_us", op.started());
    opt_us(out, "enqueued_us", op.enqueued());
    opt_us(out, "ended_us", op.ended());
    if let Some(by) = op.unblocked_by() {
        let _ = write!(out, ",\"unblocked_by\":{by}");
    }
    if op.started().is_none() && op.ended().is_some() {
        out.push_str(",\"skipped\":true");
    }
    out.push('}');
}

/// A slice's `tid`: tracks are numbered from 1.
fn tid(slice: &Slice) -> usize {
    slice.track + 1
}

impl Trace {
    /// The trace as Chrome trace-event JSON (see
    /// [`write_chrome_json`](Self::write_chrome_json)).
    pub fn to_chrome_json(&self) -> String {
        let mut out = String::with_capacity(256 * (self.ops.len() + 8));
        out.push_str("{\"displayTimeUnit\":\"ns\",\"otherData\":{\"dropped_events\":");
        let _ = write!(out, "{}", self.dropped_events());
        out.push_str("},\"traceEvents\":[\n");
        out.push_str(
            "{\"ph\":\"M\",\"pid\":1,\"tid\":0,\"name\":\"process_name\",\"args\":{\"name\":\"depflow\"}}",
        );
        for (i, track) in self.tracks().iter().enumerate() {
            let _ = write!(
                out,
                ",\n{{\"ph\":\"M\",\"pid\":1,\"tid\":{},\"name\":\"thread_name\",\"args\":{{\"name\":",
                i + 1
            );
            quoted(&mut out, &track.name);
            out.push_str("}}");
        }
        let end = self.end_of_time();
        for op in self.ops() {
            let name = label(op);
            for (k, slice) in op.slices().iter().enumerate() {
                let stop = slice.end.unwrap_or(end);
                let _ = write!(
                    out,
                    ",\n{{\"ph\":\"X\",\"pid\":1,\"tid\":{},\"ts\":{:.3},\"dur\":{:.3},\"cat\":\"{}\",\"name\":",
                    tid(slice),
                    us(slice.start),
                    us(stop.saturating_sub(slice.start)),
                    if self.tracks()[slice.track].is_lane {
                        "device"
                    } else {
                        "op"
                    },
                );
                quoted(&mut out, &name);
                if k == 0 {
                    out.push_str(",\"args\":");
                    args(&mut out, op);
                }
                out.push('}');
            }
            for run in op.replayed() {
                let slice = &run.slice;
                let stop = slice.end.unwrap_or(end);
                let _ = write!(
                    out,
                    ",\n{{\"ph\":\"X\",\"pid\":1,\"tid\":{},\"ts\":{:.3},\"dur\":{:.3},\"cat\":\"recorded\",\"name\":",
                    tid(slice),
                    us(slice.start),
                    us(stop.saturating_sub(slice.start)),
                );
                quoted(&mut out, run.name.as_deref().unwrap_or("recorded op"));
                let _ = write!(out, ",\"args\":{{\"replay\":{}}}}}", op.id());
            }
            self.flow(&mut out, op);
        }
        for &(at, n) in self.in_flight() {
            let _ = write!(
                out,
                ",\n{{\"ph\":\"C\",\"pid\":1,\"ts\":{:.3},\"name\":\"ops in flight\",\"args\":{{\"ops\":{n}}}}}",
                us(at)
            );
        }
        for resource in self.resources() {
            let mut name = String::new();
            quoted(&mut name, &format!("units of {}", resource.name));
            for &(at, n) in &resource.in_use {
                let _ = write!(
                    out,
                    ",\n{{\"ph\":\"C\",\"pid\":1,\"ts\":{:.3},\"name\":{name},\"args\":{{\"in use\":{n}}}}}",
                    us(at)
                );
            }
        }
        out.push_str("\n]}\n");
        out
    }

    /// The flow arrow into `op` from the op that unblocked it: from that
    /// op's last slice begun by the time `op` became ready, to `op`'s first.
    fn flow(&self, out: &mut String, op: &TracedOp) {
        let (Some(by), Some(to)) = (op.unblocked_by(), op.slices().first()) else {
            return;
        };
        let when = op.granted().or(op.ready()).unwrap_or(to.start);
        let Some(from) = self.ops()[by as usize]
            .slices()
            .iter()
            .rev()
            .find(|s| s.start <= when)
        else {
            return;
        };
        // A flow binds to the slice enclosing its time on its track: start
        // inside the source slice, finish at the target's start (`bp: e`).
        let _ = write!(
            out,
            ",\n{{\"ph\":\"s\",\"pid\":1,\"tid\":{},\"ts\":{:.3},\"id\":{},\"cat\":\"unblocks\",\"name\":\"unblocks\"}}",
            tid(from),
            us(from.start),
            op.id()
        );
        let _ = write!(
            out,
            ",\n{{\"ph\":\"f\",\"bp\":\"e\",\"pid\":1,\"tid\":{},\"ts\":{:.3},\"id\":{},\"cat\":\"unblocks\",\"name\":\"unblocks\"}}",
            tid(to),
            us(to.start),
            op.id()
        );
    }

    /// The last time in the trace: where slices still open end.
    pub(crate) fn end_of_time(&self) -> Duration {
        let ops = self.ops().iter().flat_map(|op| {
            op.slices()
                .iter()
                .flat_map(|s| [Some(s.start), s.end])
                .chain([Some(op.pushed()), op.ended()])
                .flatten()
        });
        let counters = self.in_flight().iter().map(|&(at, _)| at);
        ops.chain(counters).max().unwrap_or_default()
    }

    /// Writes the trace as Chrome trace-event JSON to `path`: open it in
    /// [Perfetto](https://ui.perfetto.dev) or chrome://tracing.
    ///
    /// # Errors
    ///
    /// [`Error::Io`] if `path` cannot be written.
    ///
    /// ```
    /// use depflow::{Engine, Error, Tracing};
    ///
    /// let engine = Engine::builder().tracing(Tracing::On).build()?;
    /// let v = engine.new_var();
    /// engine.op().name("fill").mutates(&[&v]).run(|_| Ok(()))?;
    /// engine.wait_all().wait()?;
    /// let trace = engine.trace()?;
    /// let path = std::env::temp_dir().join("depflow-doc-trace.json");
    /// trace.write_chrome_json(&path)?;
    /// assert!(std::fs::read_to_string(&path)?.contains("\"fill\""));
    /// // A path that cannot be written is an error, not a panic.
    /// assert!(matches!(trace.write_chrome_json("/no/such/dir/t.json"), Err(Error::Io { .. })));
    /// # std::fs::remove_file(path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn write_chrome_json(&self, path: impl AsRef<Path>) -> Result<(), Error> {
        write_file(path.as_ref(), self.to_chrome_json().as_bytes())
    }
}

/// Writes `bytes` to `path`, an error naming the path if it fails.
pub(crate) fn write_file(path: &Path, bytes: &[u8]) -> Result<(), Error> {
    let io = |source| Error::Io {
        path: path.to_path_buf(),
        source: Arc::new(source),
    };
    let mut file = std::fs::File::create(path).map_err(io)?;
    file.write_all(bytes).map_err(io)?;
    file.flush().map_err(io)
}
