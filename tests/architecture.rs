//! The layer tables of `docs/ARCHITECTURE.md` hold for the code: every
//! `crate::` import of `host/src` and `policy/src` runs to a room of the
//! same layer or a lower one (or is a listed exception), the folders of an
//! `apart` layer do not import each other, every source file is in the
//! table, and no files import each other in a circle.
//!
//! The tables are read from the document itself, so the page and the code
//! cannot drift apart unnoticed.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()
}

/// One layer row: its number, its rooms (files, or folders ending in `/`),
/// and whether its folders stay apart.
#[derive(Debug)]
struct Layer {
    level: u32,
    rooms: Vec<String>,
    apart: bool,
}

/// The table rows after `<!-- {marker}: {tree} -->`, split into cells.
fn table(doc: &str, marker: &str, tree: &str) -> Vec<Vec<String>> {
    let tag = format!("<!-- {marker}: {tree} -->");
    let start = doc
        .find(&tag)
        .unwrap_or_else(|| panic!("docs/ARCHITECTURE.md has no `{tag}`"));
    doc[start + tag.len()..]
        .lines()
        .skip_while(|l| l.trim().is_empty())
        .take_while(|l| l.starts_with('|'))
        .skip(2)
        .map(|l| {
            l.trim()
                .trim_matches('|')
                .split('|')
                .map(|c| c.trim().to_string())
                .collect()
        })
        .collect()
}

fn ticked(cell: &str) -> Vec<String> {
    cell.split('`').skip(1).step_by(2).map(str::to_string).collect()
}

fn layers(doc: &str, tree: &str) -> Vec<Layer> {
    let rows = table(doc, "layers", tree);
    assert!(!rows.is_empty(), "the layer table of {tree} is empty");
    rows.iter()
        .map(|r| Layer {
            level: r[0]
                .parse()
                .unwrap_or_else(|_| panic!("layer `{}` of {tree} is not a number", r[0])),
            rooms: ticked(&r[2]),
            apart: r.get(3).is_some_and(|c| c == "apart"),
        })
        .collect()
}

fn exceptions(doc: &str, tree: &str) -> BTreeSet<(String, String)> {
    table(doc, "exceptions", tree)
        .iter()
        .filter(|r| r.len() >= 3 && !r[2].is_empty())
        .map(|r| (ticked(&r[0])[0].clone(), ticked(&r[1])[0].clone()))
        .collect()
}

/// Every source file under `dir` (relative to it), test files left out.
fn sources(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let p = entry.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|e| e == "rs") {
                let rel = p.strip_prefix(dir).unwrap().to_string_lossy().into_owned();
                if !rel.ends_with("_tests.rs") {
                    out.push(rel);
                }
            }
        }
    }
    out.sort();
    out
}

/// The room (its table entry) a file belongs to.
fn room_of<'a>(file: &str, layers: &'a [Layer]) -> Option<(&'a Layer, &'a str)> {
    layers.iter().find_map(|l| {
        l.rooms
            .iter()
            .find(|r| {
                if r.ends_with('/') {
                    file.starts_with(r.as_str())
                } else {
                    file == r.as_str()
                }
            })
            .map(|r| (l, r.as_str()))
    })
}

/// The code of a file without its comments and its `mod tests` block.
fn code(text: &str) -> String {
    let cut = text.find("#[cfg(test)]\nmod tests").unwrap_or(text.len());
    text[..cut]
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The file a `crate::a::b::c` path names: the longest prefix that is one.
fn target(tree: &Path, path: &[&str]) -> Option<String> {
    (1..=path.len()).rev().find_map(|n| {
        let stem = path[..n].join("/");
        [format!("{stem}.rs"), format!("{stem}/mod.rs")]
            .into_iter()
            .find(|c| tree.join(c).is_file())
    })
}

/// Each file's `crate::` imports, by the file they name.
fn imports(tree: &Path, files: &[String]) -> BTreeMap<String, BTreeSet<String>> {
    let mut out = BTreeMap::new();
    for f in files {
        let text = code(&std::fs::read_to_string(tree.join(f)).unwrap());
        let mut to = BTreeSet::new();
        for (i, _) in text.match_indices("crate::") {
            let rest = &text[i + "crate::".len()..];
            let end = rest
                .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == ':'))
                .unwrap_or(rest.len());
            let path: Vec<&str> = rest[..end].split("::").filter(|s| !s.is_empty()).collect();
            if let Some(t) = target(tree, &path)
                && &t != f
            {
                to.insert(t);
            }
        }
        out.insert(f.clone(), to);
    }
    out
}

/// Files that import each other in a loop, if any.
fn circle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        match state.get(n) {
            Some(2) => return None,
            Some(1) => {
                let at = path.iter().position(|p| p == n).unwrap_or(0);
                return Some(path[at..].to_vec());
            }
            _ => {}
        }
        state.insert(n.to_string(), 1);
        path.push(n.to_string());
        for m in graph.get(n).into_iter().flatten() {
            if let Some(c) = visit(m, graph, state, path) {
                return Some(c);
            }
        }
        path.pop();
        state.insert(n.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    graph.keys().find_map(|n| visit(n, graph, &mut state, &mut Vec::new()))
}

/// Every way the code of `tree` breaks the document's table for it.
fn breaches(tree_name: &str, doc: &str) -> Vec<String> {
    let tree = root().join(tree_name);
    let layers = layers(doc, tree_name);
    let allowed = exceptions(doc, tree_name);
    let files = sources(&tree);
    let graph = imports(&tree, &files);
    let mut out = Vec::new();
    for f in &files {
        let Some((from, from_room)) = room_of(f, &layers) else {
            out.push(format!("{tree_name}/{f} is in no layer of docs/ARCHITECTURE.md"));
            continue;
        };
        for t in &graph[f] {
            let Some((to, to_room)) = room_of(t, &layers) else {
                continue;
            };
            if allowed.contains(&(f.clone(), t.clone())) {
                continue;
            }
            if to.level > from.level {
                out.push(format!(
                    "{tree_name}/{f} (layer {}) imports {t} (layer {}), a higher layer",
                    from.level, to.level
                ));
            } else if from.apart && to.level == from.level && from_room != to_room {
                out.push(format!(
                    "{tree_name}/{f} imports {t}: the rooms of layer {} stay apart",
                    from.level
                ));
            }
        }
    }
    if let Some(c) = circle(&graph) {
        out.push(format!(
            "{tree_name}: these files import each other in a circle: {}",
            c.join(" -> ")
        ));
    }
    out
}

fn doc() -> String {
    std::fs::read_to_string(root().join("docs/ARCHITECTURE.md")).expect("docs/ARCHITECTURE.md")
}

#[test]
fn the_host_keeps_its_layers() {
    let b = breaches("host/src", &doc());
    assert!(b.is_empty(), "{}", b.join("\n"));
}

#[test]
fn the_policy_keeps_its_layers() {
    let b = breaches("policy/src", &doc());
    assert!(b.is_empty(), "{}", b.join("\n"));
}

/// The check itself can fail: each kind of breach, put into the table, is
/// found.
#[test]
fn a_breach_of_the_table_is_found() {
    let doc = doc();
    // The engines' layer below the executor: the executor's imports of
    // words and files stay lawful, and every engine's import of the
    // executor now runs up.
    let lowered = doc.replace(
        "| 5 | engines | `store/`, `pg/` | apart |",
        "| 3 | engines | `store/`, `pg/` | apart |",
    );
    assert_ne!(lowered, doc, "the engines' row is not where this test expects it");
    assert!(
        breaches("host/src", &lowered)
            .iter()
            .any(|b| b.contains("store/") && b.contains("a higher layer")),
        "an engine importing the executor above it is not found"
    );
    // The two engines in one folder-less layer that is not apart is lawful;
    // pg/replay.rs's exception struck makes its import a breach.
    let struck = doc.replace("| `pg/replay.rs` | `replay.rs` |", "| `pg/none.rs` | `replay.rs` |");
    assert!(
        breaches("host/src", &struck)
            .iter()
            .any(|b| b.starts_with("host/src/pg/replay.rs") && b.contains("replay.rs")),
        "an import the exceptions no longer list is not found"
    );
    // A file missing from the table.
    let missing = doc.replace("`db_copy.rs`, ", "");
    assert!(
        breaches("host/src", &missing)
            .iter()
            .any(|b| b.contains("db_copy.rs is in no layer")),
        "a file in no layer is not found"
    );
}

#[test]
fn a_circle_is_found() {
    let mut g = BTreeMap::new();
    g.insert("a.rs".to_string(), BTreeSet::from(["b.rs".to_string()]));
    g.insert("b.rs".to_string(), BTreeSet::from(["c.rs".to_string()]));
    g.insert("c.rs".to_string(), BTreeSet::from(["a.rs".to_string()]));
    assert_eq!(circle(&g).map(|c| c.len()), Some(3));
    g.insert("c.rs".to_string(), BTreeSet::new());
    assert_eq!(circle(&g), None);
}
