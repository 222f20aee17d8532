//! The library's modules form layers: no top-level module may use one that (directly or
//! through others) uses it back. This reads `src/` and lists the `crate::X` (and `super::X`
//! reaching the crate root) edges between top-level modules, leaving out test code (`mod
//! tests` at a file's bottom, and modules declared under `#[cfg(test)]`), and fails on any
//! cycle, naming a file and line for each of its edges. `--nocapture` prints the edges.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// module -> module it uses -> one place that does.
type Graph = BTreeMap<String, BTreeMap<String, String>>;

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The module path of a file under src/ (`coll/exec.rs` -> [coll, exec]; `coll/mod.rs` ->
/// [coll]; `lib.rs` -> []).
fn module_path(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    let last = parts.pop().unwrap_or_default();
    let stem = last.trim_end_matches(".rs");
    if stem != "mod" && stem != "lib" {
        parts.push(stem.to_string());
    }
    parts
}

/// The code of a line: without a `//` comment (outside string literals).
fn code_of(line: &str) -> &str {
    let mut in_str = false;
    let b = line.as_bytes();
    for i in 0..b.len() {
        match b[i] {
            b'"' if i == 0 || b[i - 1] != b'\\' => in_str = !in_str,
            b'/' if !in_str && b.get(i + 1) == Some(&b'/') => return &line[..i],
            _ => {}
        }
    }
    line
}

fn ident_at(s: &str) -> &str {
    let end = s.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(s.len());
    &s[..end]
}

/// Top-level modules a line of code in module `path` names.
fn targets(code: &str, path: &[String]) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        let after = &rest[i + "crate::".len()..];
        if let Some(group) = after.strip_prefix('{') {
            // use crate::{a, b::c, ...}: the first segment of each entry.
            let body = &group[..group.find('}').unwrap_or(group.len())];
            found.extend(body.split(',').map(|e| ident_at(e.trim()).to_string()));
        } else {
            found.push(ident_at(after).to_string());
        }
        rest = after;
    }
    // super::...::x that climbs to the crate root.
    let mut rest = code;
    while let Some(i) = rest.find("super::") {
        let before_ok = i == 0 || !rest.as_bytes()[i - 1].is_ascii_alphanumeric() && rest.as_bytes()[i - 1] != b':';
        let mut after = &rest[i..];
        let mut ups = 0;
        while let Some(a) = after.strip_prefix("super::") {
            ups += 1;
            after = a;
        }
        if before_ok && ups >= path.len() {
            found.push(ident_at(after).to_string());
        }
        rest = &rest[i + "super::".len() * ups..];
    }
    found.retain(|m| !m.is_empty() && m.chars().next().is_some_and(|c| c.is_ascii_lowercase()));
    found
}

/// Files (relative to src/) declared under `#[cfg(test)]` by their parent.
fn test_only_files(src: &Path, files: &[PathBuf]) -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    for f in files {
        let rel = f.strip_prefix(src).unwrap();
        let text = std::fs::read_to_string(f).unwrap();
        let dir = match rel.file_name().and_then(|n| n.to_str()) {
            Some("mod.rs") | Some("lib.rs") => rel.parent().unwrap().to_path_buf(),
            _ => rel.with_extension(""),
        };
        let mut cfg_test = false;
        for line in text.lines().map(str::trim) {
            if line == "#[cfg(test)]" {
                cfg_test = true;
                continue;
            }
            if cfg_test && !line.starts_with("#[") {
                let decl = line.trim_start_matches("pub(crate) ").trim_start_matches("pub ");
                if let Some(name) = decl.strip_prefix("mod ").and_then(|d| d.strip_suffix(';')) {
                    out.insert(dir.join(format!("{name}.rs")));
                    out.insert(dir.join(name).join("mod.rs"));
                }
            }
            if !line.starts_with("#[") {
                cfg_test = false;
            }
        }
    }
    out
}

fn graph_of(src: &Path) -> Graph {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    files.sort();
    let test_only = test_only_files(src, &files);
    let mut graph = Graph::new();
    for f in &files {
        let rel = f.strip_prefix(src).unwrap();
        let path = module_path(rel);
        let Some(top) = path.first() else { continue };
        if test_only.iter().any(|t| rel == t) {
            continue;
        }
        graph.entry(top.clone()).or_default();
        let text = std::fs::read_to_string(f).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        for (n, line) in lines.iter().enumerate() {
            let trimmed = line.trim();
            // Unit tests sit at the bottom of a file, after `#[cfg(test)] mod tests`.
            if trimmed.starts_with("mod tests") && n > 0 && lines[n - 1].trim() == "#[cfg(test)]" {
                break;
            }
            for target in targets(code_of(trimmed), &path) {
                if &target != top {
                    graph
                        .entry(top.clone())
                        .or_default()
                        .entry(target)
                        .or_insert_with(|| format!("src/{}:{}", rel.display(), n + 1));
                }
            }
        }
    }
    graph
}

/// A cycle as its modules in order (the first repeated at the end), if there is one.
fn find_cycle(graph: &Graph) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &Graph,
        state: &mut BTreeMap<String, u8>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(node.to_string(), 1);
        stack.push(node.to_string());
        for next in graph.get(node).into_iter().flat_map(|m| m.keys()) {
            match state.get(next.as_str()) {
                Some(1) => {
                    let start = stack.iter().position(|s| s == next).unwrap_or(0);
                    let mut cycle = stack[start..].to_vec();
                    cycle.push(next.clone());
                    return Some(cycle);
                }
                Some(_) => {}
                None => {
                    if let Some(c) = visit(next, graph, state, stack) {
                        return Some(c);
                    }
                }
            }
        }
        stack.pop();
        state.insert(node.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for node in graph.keys() {
        if !state.contains_key(node) {
            if let Some(c) = visit(node, graph, &mut state, &mut Vec::new()) {
                return Some(c);
            }
        }
    }
    None
}

#[test]
fn top_level_modules_form_layers() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph = graph_of(&src);
    for (module, uses) in &graph {
        println!("{module} -> {}", uses.keys().cloned().collect::<Vec<_>>().join(", "));
    }
    // The reader must see the edges everyone knows about, or an empty graph would pass.
    for (from, to) in [("ffi", "comm"), ("coll", "comm"), ("comm", "transport"), ("bootstrap", "transport")] {
        assert!(graph.get(from).is_some_and(|m| m.contains_key(to)), "edge {from} -> {to} not found");
    }
    if let Some(cycle) = find_cycle(&graph) {
        let places: Vec<String> =
            cycle.windows(2).map(|w| format!("  {} -> {}: {}", w[0], w[1], graph[&w[0]][&w[1]])).collect();
        panic!("modules use each other in a cycle: {}\n{}", cycle.join(" -> "), places.join("\n"));
    }
    // The simulator is a test harness, not part of the shipped library.
    assert!(test_only_files(&src, &[src.join("coll/mod.rs")]).contains(Path::new("coll/sim.rs")));
}

#[test]
fn the_checker_sees_cycles_and_paths() {
    let mut g = Graph::new();
    for (a, b) in [("a", "b"), ("b", "c"), ("c", "d")] {
        g.entry(a.into()).or_default().insert(b.into(), String::new());
    }
    assert_eq!(find_cycle(&g), None);
    g.entry("d".into()).or_default().insert("b".into(), String::new());
    assert_eq!(find_cycle(&g), Some(vec!["b".into(), "c".into(), "d".into(), "b".into()]));

    let path = |p: &str| module_path(Path::new(p));
    assert_eq!(targets("use crate::{comm::Comm, error::Result};", &path("coll/mod.rs")), ["comm", "error"]);
    assert_eq!(targets("use super::super::tls::Channel;", &path("transport/x.rs")), ["tls"]);
    assert_eq!(targets("use super::socket;", &path("transport/x.rs")), Vec::<String>::new());
    assert_eq!(targets("use super::socket;", &path("transport/mod.rs")), ["socket"]);
    assert_eq!(targets("crate::Result<()>", &path("comm.rs")), Vec::<String>::new());
    assert_eq!(code_of(r#"f("a // b"); // crate::x"#), r#"f("a // b"); "#);
}
