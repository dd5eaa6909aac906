//! A [`Trace`] as an SVG timeline, to look at in a browser or a README: one
//! labelled row per track (threads, then stream lanes, each in name order);
//! each op's slices as bars coloured by its name, with the name inside where
//! it fits (else its last word, say a batch number) and a tooltip of its
//! times; a thin arrow from each op to the ops it unblocked; a time axis;
//! and under the rows, step plots of the ops in flight and of each
//! resource's units in use.
//!
//! Written by hand, like the JSON: plain SVG 1.1, all text escaped for XML.
//! The picture has a fixed width, so a long trace makes thin bars (never
//! thinner than [`MIN_BAR`] pixels, so that short ops stay visible): trace
//! a short run, or a window of one, to see single ops.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use super::chrome::write_file;
use super::timeline::{Trace, TracedOp};
use crate::error::{Error, VarId};

const WIDTH: f64 = 1400.0;
/// A track's row, and the bar inside it.
const ROW: f64 = 24.0;
const BAR: f64 = 18.0;
/// The narrowest bar drawn, in pixels.
const MIN_BAR: f64 = 2.0;
/// A counter plot's height, and the space around plots.
const PLOT: f64 = 48.0;
const GAP: f64 = 16.0;
/// Above the rows: the title, the legend and the tick labels.
const TOP: f64 = 62.0;
/// About the width of a character of the 11px font, to tell what fits.
const CHAR: f64 = 6.6;
/// Fills for op names, in the sorted order of the names.
const PALETTE: [&str; 12] = [
    "#8ab4e8", "#f2b36f", "#8fd18f", "#e88a8a", "#c3a6e3", "#d6b48c", "#f0a3d0", "#b8b8b8",
    "#d9d36a", "#7fd4d4", "#a7c66c", "#f5c6a0",
];

/// Where times go across the picture.
struct Scale {
    t0: f64,
    t1: f64,
    x0: f64,
    x1: f64,
}

impl Scale {
    fn at(&self, t: f64) -> f64 {
        let t = t.clamp(self.t0, self.t1);
        self.x0 + (t - self.t0) / (self.t1 - self.t0) * (self.x1 - self.x0)
    }

    fn x(&self, at: Duration) -> f64 {
        self.at(at.as_secs_f64())
    }
}

/// A step plot under the rows: `samples` (each value holds from its time
/// on) scaled so that `top` reaches the top, a dashed line at `limit`.
struct Plot {
    name: String,
    note: String,
    samples: Vec<(Duration, u64)>,
    top: u64,
    limit: Option<u64>,
}

/// `s` escaped for XML text and attributes; characters XML 1.0 does not
/// allow become U+FFFD.
fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\t' | '\n' | '\r' => out.push(c),
            c if c < ' ' || c == '\u{FFFE}' || c == '\u{FFFF}' => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
    out
}

/// A `<text>` at (x, y) with more attributes `attrs` (each after a space).
fn text(out: &mut String, x: f64, y: f64, attrs: &str, s: &str) {
    let s = esc(s);
    let _ = writeln!(out, "<text x=\"{x:.1}\" y=\"{y:.1}\"{attrs}>{s}</text>");
}

fn line(out: &mut String, (x1, y1): (f64, f64), (x2, y2): (f64, f64), attrs: &str) {
    let (a, b) = (
        format!("x1=\"{x1:.1}\" y1=\"{y1:.1}\""),
        format!("x2=\"{x2:.1}\" y2=\"{y2:.1}\""),
    );
    let _ = write!(out, "<line {a} {b}{attrs}/>");
}

/// A duration for people: µs below a millisecond, ms below a second.
fn human(d: Duration) -> String {
    match d.as_secs_f64() {
        s if s < 1e-3 => format!("{:.1} µs", s * 1e6),
        s if s < 1.0 => format!("{:.3} ms", s * 1e3),
        s => format!("{s:.3} s"),
    }
}

/// `s` less its trailing number (and the spaces or `#` before it).
fn stem(s: &str) -> &str {
    s.trim_end_matches(|c: char| c.is_ascii_digit() || c == ' ' || c == '#')
}

/// What picks an op's colour: its name less a trailing number, so that
/// `compute 3` and `compute 4` look alike (unnamed ops share one).
fn colour_key(op: &TracedOp) -> &str {
    let name = op.name().unwrap_or("");
    Some(stem(name))
        .filter(|key| !key.is_empty())
        .unwrap_or(name)
}

/// What a bar's tooltip says of its op.
fn tooltip(op: &TracedOp, name: &str) -> String {
    let mut t = format!("{name} (op #{}) on {}", op.id(), op.device());
    if let Some(lane) = op.lane() {
        let _ = write!(t, ", lane {lane}");
    }
    let steps = [
        ("pushed", Some(op.pushed())),
        ("ready", op.ready()),
        ("got units", op.granted()),
        ("started", op.started()),
        ("enqueued", op.enqueued()),
        ("ended", op.ended()),
    ];
    for (what, at) in steps.iter().filter_map(|&(w, at)| Some((w, at?))) {
        let _ = write!(t, "\n{what} at {}", human(at));
    }
    if let (Some(s), Some(e)) = (op.started(), op.ended()) {
        let _ = write!(t, "\nran {}", human(e.saturating_sub(s)));
    }
    if let Some(by) = op.unblocked_by() {
        let _ = write!(t, "\nunblocked by op #{by}");
    }
    for (what, vars) in [("reads", op.reads()), ("mutates", op.mutates())] {
        if !vars.is_empty() {
            let vars: Vec<_> = vars.iter().map(VarId::to_string).collect();
            let _ = write!(t, "\n{what} {}", vars.join(", "));
        }
    }
    t
}

impl Trace {
    /// The trace as an SVG timeline (see [`write_svg`](Self::write_svg)).
    pub fn to_svg(&self) -> String {
        let end = self.end_of_time();
        let start = self.ops().iter().map(|op| op.pushed()).min();
        let start = start.unwrap_or_default().min(end);
        let (t0, t1) = (start.as_secs_f64(), end.as_secs_f64());
        let t1 = t1.max(t0 + 1e-3);
        let pad = (t1 - t0) * 0.005;
        let plots = self.plots();
        let names = self.tracks().iter().map(|t| &t.name);
        let longest = names.chain(plots.iter().map(|p| &p.name));
        let longest = longest.map(|s| s.chars().count()).max().unwrap_or(0);
        let x0 = (longest.max(16) as f64 * CHAR + 20.0).min(320.0);
        let (t0, t1) = ((t0 - pad).max(0.0), t1 + pad);
        let x1 = WIDTH - 24.0;
        let scale = Scale { t0, t1, x0, x1 };
        let rows_end = TOP + self.tracks().len() as f64 * ROW;
        let height = rows_end + plots.len() as f64 * (PLOT + GAP) + GAP;

        let mut out = String::with_capacity(4096 + 800 * self.ops().len());
        let _ = write!(
            out,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{height}\" \
             viewBox=\"0 0 {WIDTH} {height}\" font-family=\"DejaVu Sans, Arial, sans-serif\" font-size=\"11\">\n\
             <defs><marker id=\"arrow\" viewBox=\"0 0 6 6\" refX=\"6\" refY=\"3\" markerWidth=\"5\" \
             markerHeight=\"5\" orient=\"auto\"><path d=\"M0,0 L6,3 L0,6 z\" fill=\"#333\"/></marker></defs>\n\
             <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
             <text x=\"8\" y=\"17\" font-size=\"13\" font-weight=\"bold\">depflow trace: {} ops on {} tracks over {}",
            self.ops().len(),
            self.tracks().len(),
            human(end.saturating_sub(start))
        );
        if self.dropped_events() > 0 {
            let dropped = self.dropped_events();
            let _ = write!(
                out,
                "<tspan fill=\"#b00\"> ({dropped} events dropped: the oldest ops are missing)</tspan>"
            );
        }
        out.push_str("</text>\n");
        self.axis(&mut out, &scale, height - GAP);
        let rows = self.rows(&mut out, &scale);
        self.bars(&mut out, &scale, &rows, end);
        self.flows(&mut out, &scale, &rows);
        for (i, p) in plots.iter().enumerate() {
            p.draw(&mut out, &scale, rows_end + GAP + i as f64 * (PLOT + GAP));
        }
        out.push_str("</svg>\n");
        out
    }

    /// Writes the trace as an SVG timeline to `path`: open it in a browser
    /// (hover over a bar for its op's times, over an arrow for its ops).
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
    /// let path = std::env::temp_dir().join("depflow-doc-trace.svg");
    /// trace.write_svg(&path)?;
    /// assert!(std::fs::read_to_string(&path)?.contains("<title>fill (op #0)"));
    /// assert!(matches!(trace.write_svg("/no/such/dir/t.svg"), Err(Error::Io { .. })));
    /// # std::fs::remove_file(path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn write_svg(&self, path: impl AsRef<Path>) -> Result<(), Error> {
        write_file(path.as_ref(), self.to_svg().as_bytes())
    }

    /// The plots under the rows: ops in flight, then each resource.
    fn plots(&self) -> Vec<Plot> {
        let samples: Vec<_> = self
            .in_flight()
            .iter()
            .map(|&(t, n)| (t, n as u64))
            .collect();
        let top = samples.iter().map(|s| s.1).max().unwrap_or(0);
        let mut plots = vec![Plot {
            name: "ops in flight".into(),
            note: format!("peak {top}"),
            samples,
            top,
            limit: None,
        }];
        plots.extend(self.resources().iter().map(|r| Plot {
            name: format!("units of {}", r.name),
            note: format!("capacity {}", r.capacity),
            samples: r.in_use.clone(),
            top: r.in_use.iter().map(|s| s.1).fold(r.capacity, u64::max),
            limit: Some(r.capacity),
        }));
        plots
    }

    /// Tick labels above the rows (1, 2 or 5 times a power of ten apart,
    /// some 6 to 12 of them), and grid lines down to `bottom`.
    fn axis(&self, out: &mut String, s: &Scale, bottom: f64) {
        let raw = (s.t1 - s.t0) / 10.0;
        let power = 10f64.powf(raw.log10().floor());
        let step = [1.0, 2.0, 5.0, 10.0].map(|m| m * power);
        let step = step.into_iter().find(|&v| v >= raw * 0.999).unwrap_or(raw);
        let (unit, per) = match step {
            v if v < 1e-3 => ("µs", 1e6),
            v if v < 1.0 => ("ms", 1e3),
            _ => ("s", 1.0),
        };
        let decimals = (-(step * per).log10().floor()).max(0.0) as usize;
        for k in (s.t0 / step).ceil() as u64..=(s.t1 / step).floor() as u64 {
            let (t, x) = (k as f64 * step, s.at(k as f64 * step));
            line(out, (x, TOP - 4.0), (x, bottom), " stroke=\"#ddd\"");
            let (label, attrs) = (
                format!("{:.decimals$} {unit}", t * per),
                " text-anchor=\"middle\"",
            );
            text(out, x, TOP - 8.0, attrs, &label);
        }
    }

    /// Row backgrounds and labels: threads, then lanes (a line between),
    /// each in name order, numbers by value. Gives each track's row.
    fn rows(&self, out: &mut String, s: &Scale) -> Vec<usize> {
        let tracks = self.tracks();
        // By stem, then length: `cpu-2` before `cpu-10`.
        let key = |i: usize| {
            (
                tracks[i].is_lane,
                stem(&tracks[i].name),
                tracks[i].name.len(),
            )
        };
        let mut order: Vec<usize> = (0..tracks.len()).collect();
        order.sort_by(|&a, &b| {
            key(a)
                .cmp(&key(b))
                .then(tracks[a].name.cmp(&tracks[b].name))
        });
        let mut row_of = vec![0; tracks.len()];
        for (row, &i) in order.iter().enumerate() {
            row_of[i] = row;
            let (y, lane) = (TOP + row as f64 * ROW, tracks[i].is_lane);
            let fill =
                ["#f2f2f2", "#fafafa", "#e8eef8", "#f1f5fb"][usize::from(lane) * 2 + row % 2];
            let _ = write!(
                out,
                "<rect x=\"0\" y=\"{y}\" width=\"{WIDTH}\" height=\"{ROW}\" fill=\"{fill}\"/>"
            );
            if lane && (row == 0 || !tracks[order[row - 1]].is_lane) {
                line(out, (0.0, y), (WIDTH, y), " stroke=\"#889\"");
            }
            let attrs = " class=\"track\" text-anchor=\"end\"";
            text(out, s.x0 - 8.0, y + ROW / 2.0 + 4.0, attrs, &tracks[i].name);
        }
        row_of
    }

    /// The legend (a swatch per colour), then each slice as a bar with its
    /// op's tooltip, named where it fits.
    fn bars(&self, out: &mut String, s: &Scale, rows: &[usize], end: Duration) {
        let mut colours = BTreeMap::new();
        for op in self.ops() {
            colours.insert(colour_key(op), "");
        }
        let mut x = 8.0;
        for (i, (key, fill)) in colours.iter_mut().enumerate() {
            *fill = PALETTE[i % PALETTE.len()];
            let _ = write!(
                out,
                "<rect x=\"{x:.1}\" y=\"26\" width=\"12\" height=\"12\" fill=\"{fill}\" stroke=\"#0006\"/>"
            );
            let key = if key.is_empty() { "unnamed" } else { key };
            text(out, x + 16.0, 36.0, "", key);
            x += 16.0 + key.chars().count() as f64 * CHAR + 14.0;
        }
        for op in self.ops() {
            let name = op
                .name()
                .map_or_else(|| format!("op #{}", op.id()), str::to_string);
            let (fill, tip) = (colours[colour_key(op)], esc(&tooltip(op, &name)));
            let last_word = name.rsplit(' ').next().unwrap_or("");
            for slice in op.slices() {
                let x = s.x(slice.start);
                let w = (s.x(slice.end.unwrap_or(end)) - x).max(MIN_BAR);
                let y = TOP + rows[slice.track] as f64 * ROW + (ROW - BAR) / 2.0;
                let open = slice.end.map_or(" stroke-dasharray=\"3,2\"", |_| "");
                let _ = writeln!(
                    out,
                    "<rect class=\"slice\" x=\"{x:.2}\" y=\"{y}\" width=\"{w:.2}\" height=\"{BAR}\" \
                     fill=\"{fill}\" stroke=\"#0007\" stroke-width=\"0.5\"{open}><title>{tip}</title></rect>"
                );
                let fits = |t: &&str| t.chars().count() as f64 * CHAR + 6.0 <= w;
                if let Some(label) = [name.as_str(), last_word].into_iter().find(fits) {
                    let attrs = " pointer-events=\"none\"";
                    text(out, x + 3.0, y + BAR - 5.0, attrs, label);
                }
            }
        }
    }

    /// An arrow from where each op's unblocker was when it let the op go to
    /// where the op began; on one row, an arc above the bars.
    fn flows(&self, out: &mut String, s: &Scale, rows: &[usize]) {
        let mid = |track: usize| TOP + rows[track] as f64 * ROW + ROW / 2.0;
        for op in self.ops() {
            let (Some(by), Some(to)) = (op.unblocked_by(), op.slices().first()) else {
                continue;
            };
            let when = op.granted().or(op.ready()).unwrap_or(to.start);
            let mut from = self.ops()[by as usize].slices().iter().rev();
            let Some(from) = from.find(|f| f.start <= when) else {
                continue;
            };
            let x1 = s.x(when.min(from.end.unwrap_or(when)).max(from.start));
            let x2 = s.x(to.start);
            let (y1, y2) = (mid(from.track), mid(to.track));
            let d = if from.track != to.track {
                format!("M{x1:.1},{y1:.1} L{x2:.1},{y2:.1}")
            } else if x2 - x1 >= 6.0 {
                let (xm, y, top) = ((x1 + x2) / 2.0, y1 - BAR / 2.0, y1 - BAR / 2.0 - 10.0);
                format!("M{x1:.1},{y} Q{xm:.1},{top:.1} {x2:.1},{y}")
            } else {
                continue; // back to back on one row: the bars say it
            };
            let _ = writeln!(
                out,
                "<path class=\"flow\" d=\"{d}\" fill=\"none\" stroke=\"#333\" stroke-opacity=\"0.6\" \
                 stroke-width=\"0.7\" marker-end=\"url(#arrow)\"><title>op #{by} unblocked op #{}</title></path>",
                op.id()
            );
        }
    }
}

impl Plot {
    /// Draws the plot in a band from `y` down.
    fn draw(&self, out: &mut String, s: &Scale, y: f64) {
        let base = y + PLOT;
        let level = |v: u64| base - v as f64 / self.top.max(1) as f64 * (PLOT - 4.0);
        let attrs = " class=\"plot\" text-anchor=\"end\"";
        text(out, s.x0 - 8.0, y + PLOT / 2.0, attrs, &self.name);
        let attrs = " text-anchor=\"end\" fill=\"#777\"";
        text(out, s.x0 - 8.0, y + PLOT / 2.0 + 14.0, attrs, &self.note);
        let mut d = format!("M{:.1},{base:.1}", s.x0);
        for &(at, v) in &self.samples {
            let _ = write!(d, " H{:.2} V{:.1}", s.x(at), level(v));
        }
        let _ = writeln!(
            out,
            "<path class=\"counter\" d=\"{d} H{:.1} V{base:.1} Z\" fill=\"#7aa6d6\" \
             fill-opacity=\"0.35\" stroke=\"#2a5d95\"/>",
            s.x1
        );
        line(out, (s.x0, base), (s.x1, base), " stroke=\"#999\"");
        if let Some(limit) = self.limit {
            let (y, attrs) = (level(limit), " stroke=\"#c33\" stroke-dasharray=\"4,3\"");
            line(out, (s.x0, y), (s.x1, y), attrs);
        }
    }
}
