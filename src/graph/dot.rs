//! (interim, replaced by the helper's module on merge)
use super::dag::{DagEdge, EdgeKind};

pub(crate) struct DotOp {
    pub(crate) name: String,
    pub(crate) device: String,
}

#[allow(dead_code)]
pub(crate) struct DotVar {
    pub(crate) name: String,
    pub(crate) boundary: bool,
    pub(crate) bytes: Option<usize>,
    pub(crate) offset: Option<usize>,
}

fn esc(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

pub(crate) fn to_dot(title: &str, ops: &[DotOp], vars: &[DotVar], edges: &[DagEdge]) -> String {
    let mut out = format!("digraph \"{}\" {{\n  rankdir=TB;\n", esc(title));
    for (i, op) in ops.iter().enumerate() {
        out += &format!(
            "  op{i} [shape=box, label=\"{} #{i} ({})\"];\n",
            esc(&op.name),
            esc(&op.device)
        );
    }
    for e in edges {
        let (kind, style) = match e.kind {
            EdgeKind::ReadAfterWrite => ("RAW", "solid"),
            EdgeKind::WriteAfterRead => ("WAR", "dashed"),
            EdgeKind::WriteAfterWrite => ("WAW", "dotted"),
        };
        let v = &vars[e.var as usize];
        out += &format!(
            "  op{} -> op{} [style={style}, label=\"{} {kind}\"];\n",
            e.from,
            e.to,
            esc(&v.name)
        );
    }
    out + "}\n"
}
