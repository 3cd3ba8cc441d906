//! `cargo xtask deps`: the graph of a crate's top-level modules and its cycles.
//!
//! A top-level module is a file or a folder directly under the crate's `src/` (`lib.rs`, `main.rs`
//! and `bin/` are the crate's roots, not modules). Module `a` depends on module `b` when any file
//! of `a` names `crate::b` (also inside a `use crate::{b, ...}` group). Comments are ignored, so a
//! doc link is no dependency; test code counts like any other code. A layered crate has no
//! cycle: lower modules never name higher ones.
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Errors reading a crate's sources.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading {path}: {source}", path = path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Each module and the modules it names.
pub type Graph = BTreeMap<String, BTreeSet<String>>;

/// The source text of every top-level module of the crate at `src`, by module name.
pub fn read_modules(src: &Path) -> Result<BTreeMap<String, String>, Error> {
    let read_err = |path: &Path| {
        let path = path.to_owned();
        move |source| Error::Read { path, source }
    };
    let mut modules = BTreeMap::new();
    for entry in std::fs::read_dir(src).map_err(read_err(src))? {
        let entry = entry.map_err(read_err(src))?;
        let path = entry.path();
        let Some(name) = path.file_stem().and_then(|n| n.to_str()).map(str::to_owned) else {
            continue;
        };
        if matches!(name.as_str(), "lib" | "main" | "bin") {
            continue;
        }
        let mut text = String::new();
        if path.is_dir() {
            for file in rust_files(&path)? {
                text.push_str(&std::fs::read_to_string(&file).map_err(read_err(&file))?);
                text.push('\n');
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            text = std::fs::read_to_string(&path).map_err(read_err(&path))?;
        } else {
            continue;
        }
        modules
            .entry(name)
            .or_insert_with(String::new)
            .push_str(&text);
    }
    Ok(modules)
}

fn rust_files(dir: &Path) -> Result<Vec<PathBuf>, Error> {
    let mut out = Vec::new();
    let entries = std::fs::read_dir(dir).map_err(|source| Error::Read {
        path: dir.to_owned(),
        source,
    })?;
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(rust_files(&path)?);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    out.sort();
    Ok(out)
}

/// `text` without its `//` and `/* */` comments and the contents of its string literals (a
/// doc link or a test's fixture text is no dependency).
fn strip_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix("//") {
            rest = after.find('\n').map_or("", |i| &after[i..]);
        } else if let Some(after) = rest.strip_prefix("/*") {
            rest = after.find("*/").map_or("", |i| &after[i + 2..]);
        } else if let Some(after) = rest.strip_prefix("'\"'") {
            // The one char literal that would open a string.
            out.push_str("' '");
            rest = after;
        } else if let Some(after) = rest.strip_prefix("r#\"") {
            out.push_str("\"\"");
            rest = after.find("\"#").map_or("", |i| &after[i + 2..]);
        } else if let Some(after) = rest.strip_prefix('"') {
            out.push_str("\"\"");
            let mut chars = after.char_indices();
            let mut end = after.len();
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => {
                        chars.next();
                    }
                    '"' => {
                        end = i + 1;
                        break;
                    }
                    _ => {}
                }
            }
            rest = &after[end..];
        } else {
            let mut chars = rest.chars();
            if let Some(c) = chars.next() {
                out.push(c);
            }
            rest = chars.as_str();
        }
    }
    out
}

/// The top-level module names `text` refers to through `crate::`.
fn referenced(text: &str) -> BTreeSet<String> {
    let text = strip_comments(text);
    let mut out = BTreeSet::new();
    let mut rest = text.as_str();
    while let Some(i) = rest.find("crate::") {
        let before = rest[..i].chars().next_back();
        rest = &rest[i + "crate::".len()..];
        // `swiftlet_crate::x` or `$crate::` are other paths.
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$') {
            continue;
        }
        if let Some(group) = rest.strip_prefix('{') {
            out.extend(group_heads(group));
        } else {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                out.insert(name);
            }
        }
    }
    out
}

/// The first path segment of each item of a `{...}` use group (`text` starts after the `{`).
fn group_heads(text: &str) -> Vec<String> {
    let mut heads = Vec::new();
    let mut depth = 0usize;
    let mut item = String::new();
    let mut at_start = true;
    for c in text.chars() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                at_start = true;
                if !item.is_empty() {
                    heads.push(std::mem::take(&mut item));
                }
                continue;
            }
            _ => {}
        }
        if depth == 0 && at_start {
            if c.is_alphanumeric() || c == '_' {
                item.push(c);
            } else if !item.is_empty() {
                at_start = false;
            }
        }
    }
    if !item.is_empty() {
        heads.push(item);
    }
    heads
}

/// The dependency graph of `modules` (module name -> source text): only edges to other modules
/// of the same crate.
pub fn graph(modules: &BTreeMap<String, String>) -> Graph {
    modules
        .iter()
        .map(|(name, text)| {
            let deps = referenced(text)
                .into_iter()
                .filter(|d| d != name && modules.contains_key(d))
                .collect();
            (name.clone(), deps)
        })
        .collect()
}

/// The cycles of `g`: each strongly connected component of more than one module, as one cycle
/// through it (the shortest from its first module back to itself), in name order.
pub fn cycles(g: &Graph) -> Vec<Vec<String>> {
    let reach = |from: &str| -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from.to_owned()];
        while let Some(m) = stack.pop() {
            for d in g.get(&m).into_iter().flatten() {
                if seen.insert(d.clone()) {
                    stack.push(d.clone());
                }
            }
        }
        seen
    };
    let reachable: BTreeMap<&String, BTreeSet<String>> = g.keys().map(|m| (m, reach(m))).collect();
    let mut done = BTreeSet::new();
    let mut out = Vec::new();
    for m in g.keys() {
        if done.contains(m) || !reachable[m].contains(m) {
            continue;
        }
        let component: BTreeSet<&String> = g
            .keys()
            .filter(|o| reachable[m].contains(*o) && reachable[*o].contains(m))
            .collect();
        done.extend(component.iter().map(|s| (*s).clone()));
        if let Some(path) = shortest_cycle(g, m) {
            out.push(path);
        }
    }
    out
}

/// The shortest path from `start` back to itself, as the modules along it.
fn shortest_cycle(g: &Graph, start: &str) -> Option<Vec<String>> {
    let mut prev: BTreeMap<String, String> = BTreeMap::new();
    let mut queue = std::collections::VecDeque::from([start.to_owned()]);
    while let Some(m) = queue.pop_front() {
        for d in g.get(&m).into_iter().flatten() {
            if d == start {
                let mut path = vec![m.clone()];
                let mut at = m.clone();
                while let Some(p) = prev.get(&at) {
                    path.push(p.clone());
                    at = p.clone();
                }
                path.reverse();
                path.push(start.to_owned());
                return Some(path);
            }
            if !prev.contains_key(d) && d != start {
                prev.insert(d.clone(), m.clone());
                queue.push_back(d.clone());
            }
        }
    }
    None
}

/// The graph and cycles of the crate whose sources are at `src`.
pub fn check(src: &Path) -> Result<(Graph, Vec<Vec<String>>), Error> {
    let g = graph(&read_modules(src)?);
    let c = cycles(&g);
    Ok((g, c))
}

/// The crates `cargo xtask deps` checks when none is named: the agent's and xtask's.
pub fn default_dirs() -> Vec<PathBuf> {
    let root = crate::workspace_root();
    vec![root.join("agent/src"), root.join("xtask/src")]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn modules(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(n, t)| ((*n).to_owned(), (*t).to_owned()))
            .collect()
    }

    #[test]
    fn references_come_from_paths_and_use_groups_not_comments() {
        let text = "use crate::{a::X, b, c::{self, d::Y}};\n\
                    // crate::commented\n\
                    /* crate::block */\n\
                    fn f() { crate::e::g(); other_crate::h(); }\n\
                    let s = \"crate::in_a_string \\\" crate::still\"; let q = '\"';\n\
                    use crate::{\n    f as g,\n};";
        let got: Vec<String> = referenced(text).into_iter().collect();
        assert_eq!(got, ["a", "b", "c", "e", "f"]);
    }

    #[test]
    fn a_layered_graph_has_no_cycle_and_a_loop_is_named() {
        let layered = modules(&[
            ("pod", "fn f() {}"),
            ("runtime", "use crate::pod::X;"),
            ("status", "use crate::{pod, runtime::Y};"),
        ]);
        let g = graph(&layered);
        assert_eq!(g["status"].iter().collect::<Vec<_>>(), ["pod", "runtime"]);
        assert!(cycles(&g).is_empty());
        let looped = modules(&[
            ("pod", "fn f() {}"),
            ("runtime", "use crate::prober::Results;"),
            ("prober", "use crate::status::S;"),
            ("status", "use crate::runtime::PodState; use crate::pod::P;"),
        ]);
        assert_eq!(
            cycles(&graph(&looped)),
            [["prober", "status", "runtime", "prober"]]
        );
        // Two modules naming each other, and a module naming only itself (no cycle).
        let pair = modules(&[
            ("a", "crate::b::x"),
            ("b", "crate::a::y"),
            ("c", "crate::c::z"),
        ]);
        assert_eq!(cycles(&graph(&pair)), [["a", "b", "a"]]);
    }

    #[test]
    fn the_agent_and_xtask_have_no_module_cycle() {
        for dir in default_dirs() {
            let (g, cycles) = check(&dir).expect("read the sources");
            assert!(
                g.len() > 5,
                "{}: too few modules found: {g:?}",
                dir.display()
            );
            assert!(
                cycles.is_empty(),
                "{}: module cycles {cycles:?}",
                dir.display()
            );
        }
    }
}
