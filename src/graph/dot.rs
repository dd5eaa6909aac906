//! A recorded graph as Graphviz DOT, to draw with `dot -Tsvg`: one box per
//! op (its index, name and device), top to bottom in dependency order; one
//! arrow per data edge, labelled with its variable and kind, drawn solid
//! (read after write), dashed (write after read) or dotted (write after
//! write).
//!
//! Variables are not nodes: they label the arrows. Two notes list them
//! instead, so that the picture stays the shape of the schedule: the
//! *boundary* variables (those the graph shares with the program, with
//! their sizes where known), and the *arena*, the other variables the
//! memory planner placed (size at offset).
//!
//! Written by hand: every name goes through [`quote`], so quotes,
//! backslashes and newlines in names cannot break the file. An edge naming
//! a variable past `vars` is labelled `v<index>`.

// Wired into the runtime by the recording (issue 13); until then only tests use it.

use std::fmt::Write as _;

use super::dag::{DagEdge, EdgeKind};

/// An op as drawn: its name and its device's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DotOp {
    pub(crate) name: String,
    pub(crate) device: String,
}

/// A variable as listed: its name, whether the graph shares it with the
/// program (`boundary`), its size and its offset in the arena, if planned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DotVar {
    pub(crate) name: String,
    pub(crate) boundary: bool,
    pub(crate) bytes: Option<usize>,
    pub(crate) offset: Option<usize>,
}

/// `s` as a DOT quoted string whose label shows `s`: quotes and backslashes
/// escaped, a newline as Graphviz's `\n`, other control characters as spaces.
fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    push_escaped(&mut out, s);
    out.push('"');
    out
}

fn push_escaped(out: &mut String, s: &str) {
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => {}
            c if c.is_control() => out.push(' '),
            c => out.push(c),
        }
    }
}

/// What an edge's kind is called on its arrow, and how the arrow is drawn.
fn kind(kind: EdgeKind) -> (&'static str, &'static str) {
    match kind {
        EdgeKind::ReadAfterWrite => ("RAW", "solid"),
        EdgeKind::WriteAfterRead => ("WAR", "dashed"),
        EdgeKind::WriteAfterWrite => ("WAW", "dotted"),
    }
}

/// A note listing `vars` (left-justified lines), or nothing if none.
/// (`write!` to a String cannot fail, here and below.)
fn note<'a>(out: &mut String, id: &str, title: &str, vars: impl Iterator<Item = &'a DotVar>) {
    let mut label = format!("{title}\\l");
    let mut any = false;
    for v in vars {
        any = true;
        push_escaped(&mut label, &v.name);
        let _ = match (v.bytes, v.offset) {
            (Some(b), Some(o)) => write!(label, ": {b} B at {o}"),
            (Some(b), None) => write!(label, ": {b} B"),
            (None, Some(o)) => write!(label, ": at {o}"),
            (None, None) => Ok(()),
        };
        label.push_str("\\l");
    }
    if any {
        let _ = writeln!(out, "  {id} [shape=note, label=\"{label}\"];");
    }
}

/// The graph as DOT: `ops` in recorded order, `vars` by the index the
/// edges name, `edges` as the DAG lists them (see the module doc).
pub(crate) fn to_dot(title: &str, ops: &[DotOp], vars: &[DotVar], edges: &[DagEdge]) -> String {
    let mut out = String::new();
    let w = &mut out;
    let t = quote(title);
    let _ = writeln!(w, "digraph {t} {{");
    let _ = writeln!(
        w,
        "  graph [label={t}, labelloc=t, rankdir=TB, fontname=Helvetica];"
    );
    let _ = writeln!(w, "  node [shape=box, fontname=Helvetica, fontsize=10];");
    let _ = writeln!(w, "  edge [fontname=Helvetica, fontsize=9];");
    for (i, op) in ops.iter().enumerate() {
        let mut label = format!("{i}: {}", op.name);
        if !op.device.is_empty() {
            label = format!("{label}\n{}", op.device);
        }
        let _ = writeln!(w, "  op{i} [label={}];", quote(&label));
    }
    for e in edges {
        let (name, style) = kind(e.kind);
        let var = match vars.get(e.var as usize) {
            Some(v) => v.name.clone(),
            None => format!("v{}", e.var),
        };
        let label = quote(&format!("{var}\n{name}"));
        let (from, to) = (e.from, e.to);
        let _ = writeln!(w, "  op{from} -> op{to} [label={label}, style={style}];");
    }
    note(
        w,
        "boundary",
        "boundary variables",
        vars.iter().filter(|v| v.boundary),
    );
    let planned = vars.iter().filter(|v| !v.boundary && v.offset.is_some());
    note(w, "arena", "arena", planned);
    out.push_str("}\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(name: &str, device: &str) -> DotOp {
        DotOp {
            name: name.into(),
            device: device.into(),
        }
    }

    fn var(name: &str, boundary: bool, bytes: Option<usize>, offset: Option<usize>) -> DotVar {
        DotVar {
            name: name.into(),
            boundary,
            bytes,
            offset,
        }
    }

    fn edge(from: u32, to: u32, var: u32, kind: EdgeKind) -> DagEdge {
        DagEdge {
            from,
            to,
            var,
            kind,
        }
    }

    /// Quotes closed, escapes inside them only, braces outside them
    /// balanced: panics otherwise.
    fn check_structure(dot: &str) {
        let (mut depth, mut quoted, mut escaped) = (0i32, false, false);
        for c in dot.chars() {
            match (quoted, escaped, c) {
                (true, true, _) => escaped = false,
                (true, false, '\\') => escaped = true,
                (_, false, '"') => quoted = !quoted,
                (false, _, '{') => depth += 1,
                (false, _, '}') => depth -= 1,
                (false, _, '\n') => assert!(depth >= 0, "unbalanced braces in\n{dot}"),
                _ => {}
            }
        }
        assert!(!quoted && depth == 0, "unclosed quote or brace in\n{dot}");
    }

    /// A graph of three ops with one edge of each kind and both notes.
    fn sample() -> String {
        let ops = [op("init", "cpu"), op("copy", "gpu0"), op("step", "")];
        let vars = [
            var("x", true, Some(64), None),
            var("tmp", false, Some(32), Some(0)),
        ];
        let edges = [
            edge(0, 1, 0, EdgeKind::ReadAfterWrite),
            edge(1, 2, 0, EdgeKind::WriteAfterRead),
            edge(0, 2, 1, EdgeKind::WriteAfterWrite),
        ];
        to_dot("train step", &ops, &vars, &edges)
    }

    #[test]
    fn one_line_per_op_and_per_edge() {
        let dot = sample();
        check_structure(&dot);
        let lines: Vec<&str> = dot.lines().collect();
        assert_eq!(lines[0], "digraph \"train step\" {");
        let ops: Vec<_> = lines
            .iter()
            .filter(|l| l.starts_with("  op") && !l.contains("->"))
            .collect();
        assert_eq!(
            ops,
            [
                &"  op0 [label=\"0: init\\ncpu\"];",
                &"  op1 [label=\"1: copy\\ngpu0\"];",
                &"  op2 [label=\"2: step\"];",
            ]
        );
        let edges: Vec<_> = lines.iter().filter(|l| l.contains(" -> ")).collect();
        assert_eq!(
            edges,
            [
                &"  op0 -> op1 [label=\"x\\nRAW\", style=solid];",
                &"  op1 -> op2 [label=\"x\\nWAR\", style=dashed];",
                &"  op0 -> op2 [label=\"tmp\\nWAW\", style=dotted];",
            ]
        );
        assert!(
            dot.contains("  boundary [shape=note, label=\"boundary variables\\lx: 64 B\\l\"];\n")
        );
        assert!(dot.contains("  arena [shape=note, label=\"arena\\ltmp: 32 B at 0\\l\"];\n"));
    }

    #[test]
    fn names_are_escaped() {
        let name = "say \"hi\" \\ \nbye";
        assert_eq!(quote(name), r#""say \"hi\" \\ \nbye""#);
        let dot = to_dot(
            name,
            &[op(name, name)],
            &[var(name, true, None, None)],
            &[edge(0, 0, 0, EdgeKind::ReadAfterWrite)],
        );
        check_structure(&dot);
        assert!(
            dot.contains(r#"op0 [label="0: say \"hi\" \\ \nbye\nsay \"hi\" \\ \nbye"];"#),
            "{dot}"
        );
        // An edge past the variables is labelled by index; no notes without
        // variables to list.
        let dot = to_dot(
            "t",
            &[op("a", "")],
            &[],
            &[edge(0, 0, 7, EdgeKind::ReadAfterWrite)],
        );
        assert!(
            dot.contains("label=\"v7\\nRAW\"") && !dot.contains("note"),
            "{dot}"
        );
    }

    /// Graphviz itself reads the output, where it is installed.
    #[test]
    fn graphviz_reads_it() {
        use std::io::Write as _;
        use std::process::{Command, Stdio};
        let Ok(mut dot) = Command::new("dot")
            .arg("-Tsvg")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
        else {
            eprintln!("skipped: Graphviz's `dot` is not installed");
            return;
        };
        let weird = to_dot(
            "q\"\\",
            &[op("a\"\\\n{b}", "d")],
            &[var("v\"", true, Some(1), Some(0))],
            &[edge(0, 0, 0, EdgeKind::WriteAfterWrite)],
        );
        let input = format!("{}{weird}", sample());
        // Two graphs in one input: dot renders each.
        dot.stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
        let out = dot.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && stderr.is_empty(),
            "dot refused:\n{stderr}\n{input}"
        );
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).matches("<svg").count(),
            2
        );
    }
}
