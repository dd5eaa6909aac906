//! The crate's layers (ARCHITECTURE.md), checked on its sources: every
//! `crate::` path in a layer names a lower layer or its own, and a layer's
//! `mod.rs` does not reach above itself through `super::`.

use std::fs;
use std::path::Path;

/// Each top-level module of `src/` and its floor: a module may name only
/// modules on lower floors (or itself). Modules on one floor know nothing
/// of each other.
const FLOORS: &[(&str, u8)] = &[
    ("loom", 0),
    ("core", 1),
    ("error", 1),
    ("exec", 2),
    ("resource", 2),
    ("device", 2),
    ("dep", 3),
    ("trace", 4),
    ("graph", 4),
    ("engine", 5),
    // Data-parallel groups, above the engine, on its public API.
    ("parallel", 6),
    // Arrays (`nd`), above the engine and data-parallel groups, on their
    // public API.
    ("nd", 7),
    // The planned MPI communicator (`comm`) goes inside `device`.
];

fn floor(module: &str) -> Option<u8> {
    FLOORS.iter().find(|(m, _)| *m == module).map(|(_, f)| *f)
}

/// The code of a source file, without its comments (doc links are not
/// imports).
fn code(path: &Path) -> String {
    fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The top-level modules a piece of code names through `crate::`.
fn named_modules(code: &str) -> Vec<String> {
    let mut names = Vec::new();
    for (i, _) in code.match_indices("crate::") {
        if i > 0 && code[..i].ends_with(|c: char| c.is_alphanumeric() || c == '_' || c == '$') {
            continue; // `$crate::`, `my_crate::`
        }
        let rest = &code[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // `use crate::{a::X, b::Y}`
            let group = &group[..group.find('}').unwrap_or(group.len())];
            for part in group.split(',') {
                let name: String = part
                    .trim()
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() {
                    names.push(name);
                }
            }
        } else {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            names.push(name);
        }
    }
    names
}

fn rs_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rs_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn every_layer_imports_only_the_layers_below_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rs_files(&src, &mut files);
    let mut violations = Vec::new();
    let mut checked = 0;
    for file in &files {
        let rel = file.strip_prefix(&src).unwrap();
        let first = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_str()
            .unwrap();
        let module = first.trim_end_matches(".rs");
        if module == "lib" {
            continue; // the root re-exports every layer
        }
        let own = floor(module)
            .unwrap_or_else(|| panic!("src/{first}: a module with no floor; add it to FLOORS"));
        let code = code(file);
        for name in named_modules(&code) {
            match floor(&name) {
                Some(f) if name == module || f < own => {}
                Some(f) => violations.push(format!(
                    "src/{} (floor {own}) names crate::{name} (floor {f})",
                    rel.display()
                )),
                None => violations.push(format!(
                    "src/{} names crate::{name}, an item of the crate root (above every layer)",
                    rel.display()
                )),
            }
        }
        if rel.ends_with("mod.rs") && rel.components().count() == 2 && code.contains("super::") {
            violations.push(format!(
                "src/{} reaches above its layer with super::",
                rel.display()
            ));
        }
        checked += 1;
    }
    assert!(
        checked > 30,
        "only {checked} files checked: is src/ laid out as expected?"
    );
    assert!(
        violations.is_empty(),
        "imports that run up:\n{}",
        violations.join("\n")
    );
}

#[test]
fn the_check_sees_imports() {
    assert_eq!(
        named_modules(
            "use crate::core::few::Few;\nuse crate::{dep::X, error::Y};\nlet e = crate::Error;"
        ),
        ["core", "dep", "error", "Error"]
    );
    assert!(named_modules("$crate::thread_local!").is_empty());
}
