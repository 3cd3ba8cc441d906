//! `cargo xtask deps`: the graph of a crate's top-level modules and its cycles.
//!
//! A top-level module is a file or a folder directly under the crate's `src/` (`lib.rs`, `main.rs`
//! and `bin/` are the crate's roots, not modules). Module `a` depends on module `b` when any file
//! of `a` names `crate::b` (also inside a `use crate::{b, ...}` group). Comments are ignored, so a
//! doc link is no dependency; test code counts like any other code. A layered crate has no
//! cycle: lower modules never name higher ones.
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Errors reading a crate's sources or its layers.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading {path}: {source}", path = path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: no ```layers block (the crate's rows of modules, top row first)", path = path.display())]
    NoLayers { path: PathBuf },
}

/// The rows of a layered crate's modules, top row first: a module may use modules of lower rows
/// only, never one of its own row or above.
pub type Layers = Vec<Vec<String>>;

/// What breaks the layers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Violation {
    /// `from` (row `from_row`, counted from the top) names `to`, which is in its row or above.
    Upward {
        from: String,
        to: String,
        from_row: usize,
        to_row: usize,
    },
    /// A module of the crate that no row names.
    Unplaced(String),
    /// A row names a module the crate does not have.
    Unknown(String),
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Violation::Upward {
                from,
                to,
                from_row,
                to_row,
            } if from_row == to_row => write!(
                f,
                "{from} -> {to}: both are in row {from_row}; a module uses lower rows only \
                 (move {to} to a row below {from})"
            ),
            Violation::Upward {
                from,
                to,
                from_row,
                to_row,
            } => write!(
                f,
                "{from} (row {from_row}) -> {to} (row {to_row}): an upward import; a module \
                 uses lower rows only"
            ),
            Violation::Unplaced(m) => write!(
                f,
                "{m} is in no row: add it to the ```layers block of docs/architecture.md, \
                 in a row above every module it uses and below every module that uses it"
            ),
            Violation::Unknown(m) => write!(
                f,
                "{m} is in a row but the crate has no such module: remove it from the \
                 ```layers block"
            ),
        }
    }
}

/// The rows of the first fenced ```layers block of `text`: one row a line, module names
/// separated by white space; blank lines and `#` comments are skipped.
pub fn parse_layers(text: &str) -> Option<Layers> {
    let mut lines = text.lines();
    lines.find(|l| l.trim() == "```layers")?;
    let mut rows = Vec::new();
    for line in lines {
        let line = line.trim();
        if line.starts_with("```") {
            return Some(rows);
        }
        let line = line.split('#').next().unwrap_or_default();
        let row: Vec<String> = line.split_whitespace().map(str::to_owned).collect();
        if !row.is_empty() {
            rows.push(row);
        }
    }
    None
}

/// The layers written in the document at `path`.
pub fn read_layers(path: &Path) -> Result<Layers, Error> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
        path: path.to_owned(),
        source,
    })?;
    parse_layers(&text).ok_or_else(|| Error::NoLayers {
        path: path.to_owned(),
    })
}

/// Every way `g` breaks `layers`: upward (or same-row) imports, modules in no row, rows naming
/// modules that do not exist.
pub fn layer_violations(g: &Graph, layers: &Layers) -> Vec<Violation> {
    let row_of: BTreeMap<&str, usize> = layers
        .iter()
        .enumerate()
        .flat_map(|(i, row)| row.iter().map(move |m| (m.as_str(), i + 1)))
        .collect();
    let mut out = Vec::new();
    for (from, deps) in g {
        let Some(&from_row) = row_of.get(from.as_str()) else {
            out.push(Violation::Unplaced(from.clone()));
            continue;
        };
        for to in deps {
            if let Some(&to_row) = row_of.get(to.as_str())
                && to_row <= from_row
            {
                out.push(Violation::Upward {
                    from: from.clone(),
                    to: to.clone(),
                    from_row,
                    to_row,
                });
            }
        }
    }
    out.extend(
        row_of
            .keys()
            .filter(|m| !g.contains_key(**m))
            .map(|m| Violation::Unknown((*m).to_owned())),
    );
    out
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

/// The document whose ```layers block the agent's modules must follow.
pub fn agent_layers_doc() -> PathBuf {
    crate::workspace_root().join("docs/architecture.md")
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

    fn graph_of(edges: &[(&str, &[&str])]) -> Graph {
        edges
            .iter()
            .map(|(m, deps)| {
                let deps = deps.iter().map(|d| (*d).to_owned()).collect();
                ((*m).to_owned(), deps)
            })
            .collect()
    }

    const DOC: &str = "# x\n\n```layers\ntop   # the wiring\nmid other\n\nbottom\n```\n";

    #[test]
    fn layers_are_read_from_the_fenced_block() {
        let rows = parse_layers(DOC).expect("a block");
        assert_eq!(rows, [vec!["top"], vec!["mid", "other"], vec!["bottom"]]);
        assert_eq!(parse_layers("no block here"), None);
        assert_eq!(parse_layers("```layers\na\n"), None, "an unclosed block");
    }

    #[test]
    fn an_upward_import_breaks_the_layers() {
        let layers = parse_layers(DOC).expect("a block");
        let clean = graph_of(&[
            ("top", &["mid", "bottom"]),
            ("mid", &["bottom"]),
            ("other", &[]),
            ("bottom", &[]),
        ]);
        assert_eq!(layer_violations(&clean, &layers), []);
        let upward = graph_of(&[
            ("top", &["mid"]),
            ("mid", &["bottom"]),
            ("other", &["mid"]),
            ("bottom", &["top"]),
        ]);
        let v = layer_violations(&upward, &layers);
        assert_eq!(
            v,
            [
                Violation::Upward {
                    from: "bottom".into(),
                    to: "top".into(),
                    from_row: 3,
                    to_row: 1
                },
                Violation::Upward {
                    from: "other".into(),
                    to: "mid".into(),
                    from_row: 2,
                    to_row: 2
                },
            ]
        );
        assert!(v[0].to_string().contains("upward import"), "{}", v[0]);
        assert!(v[1].to_string().contains("both are in row 2"), "{}", v[1]);
    }

    #[test]
    fn a_module_in_no_row_and_a_row_naming_nothing_are_reported() {
        let layers = parse_layers(DOC).expect("a block");
        let g = graph_of(&[("top", &[]), ("mid", &[]), ("bottom", &[]), ("new", &[])]);
        let v = layer_violations(&g, &layers);
        assert_eq!(
            v,
            [
                Violation::Unplaced("new".into()),
                Violation::Unknown("other".into())
            ]
        );
        assert!(
            v[0].to_string().contains("docs/architecture.md"),
            "{}",
            v[0]
        );
    }

    #[test]
    fn the_agent_follows_the_layers_of_docs_architecture() {
        let root = crate::workspace_root();
        let layers = read_layers(&agent_layers_doc()).expect("docs/architecture.md");
        let g = graph(&read_modules(&root.join("agent/src")).expect("agent sources"));
        let v: Vec<String> = layer_violations(&g, &layers)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert!(v.is_empty(), "{}", v.join("\n"));
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
