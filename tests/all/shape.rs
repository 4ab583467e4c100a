//! The shape of the host crate: dependencies between its top-level modules point one way,
//! down the layers listed in `host/src/lib.rs`'s docs. A module may use modules of its own
//! layer or below, never above, and no two modules use each other, directly or not.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Each top-level module of `host/src` and its layer (1 at the bottom).
const LAYERS: &[(&str, u32)] = &[
    ("defaults", 1),
    ("health", 1),
    ("log_limit", 1),
    ("panics", 1),
    ("input", 1),
    ("names", 1),
    ("durations", 1),
    ("output", 1),
    ("queue", 2),
    ("rules", 2),
    ("bus", 2),
    ("handler", 2),
    ("cost", 2),
    ("payload", 2),
    ("record", 2),
    ("listener", 3),
    ("config", 4),
    ("service", 5),
    ("http", 6),
    ("scaler", 6),
    ("host", 7),
    ("cli", 7),
    ("demo", 7),
    ("simulate", 7),
    ("bench", 7),
    // Tests only: property tests of every parser of outside input.
    ("fuzz", 7),
];

/// Every `crate::<module>` a file's code (not its comments) names.
fn uses_in(text: &str) -> BTreeSet<String> {
    let mut used = BTreeSet::new();
    for line in text.lines().filter(|l| !l.trim_start().starts_with("//")) {
        let mut rest = line;
        while let Some(at) = rest.find("crate::") {
            let name: String = rest[at + 7..].chars().take_while(|c| c.is_ascii_lowercase() || *c == '_').collect();
            if !name.is_empty() {
                used.insert(name);
            }
            rest = &rest[at + 7..];
        }
    }
    used
}

fn files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Top-level module → the other top-level modules it uses.
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../host/src");
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut all = Vec::new();
    files(&src, &mut all);
    for path in all {
        let relative = path.strip_prefix(&src).unwrap();
        let module = relative.components().next().unwrap().as_os_str().to_string_lossy().trim_end_matches(".rs").to_string();
        if module == "lib" || module == "main" {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let entry = graph.entry(module.clone()).or_default();
        entry.extend(uses_in(&text).into_iter().filter(|used| *used != module));
    }
    graph
}

#[test]
fn every_module_uses_only_its_own_layer_or_those_below() {
    let layers: BTreeMap<&str, u32> = LAYERS.iter().copied().collect();
    let mut wrong = Vec::new();
    for (module, used) in graph() {
        let Some(&layer) = layers.get(module.as_str()) else {
            wrong.push(format!("{module}: not in the layer table of tests/all/shape.rs (and host/src/lib.rs's docs)"));
            continue;
        };
        for other in used {
            match layers.get(other.as_str()) {
                Some(&other_layer) if other_layer > layer => wrong.push(format!("{module} (layer {layer}) uses {other} (layer {other_layer})")),
                Some(_) => {}
                None => wrong.push(format!("{module} uses {other}, which is not in the layer table")),
            }
        }
    }
    assert!(wrong.is_empty(), "imports that run back up:\n{}", wrong.join("\n"));
}

#[test]
fn no_two_modules_use_each_other() {
    let graph = graph();
    // Depth-first search for a cycle, reporting its path.
    fn visit(node: &str, graph: &BTreeMap<String, BTreeSet<String>>, path: &mut Vec<String>, done: &mut BTreeSet<String>) -> Option<Vec<String>> {
        if let Some(start) = path.iter().position(|p| p == node) {
            let mut cycle = path[start..].to_vec();
            cycle.push(node.to_string());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    for module in graph.keys() {
        if let Some(cycle) = visit(module, &graph, &mut Vec::new(), &mut done) {
            panic!("a cycle of imports: {}", cycle.join(" -> "));
        }
    }
}

/// A module of `host/src/<folder>` as a path of names (`["listener", "pool", "tasks"]`),
/// for each `.rs` file under it.
fn modules_in(folder: &str) -> BTreeMap<Vec<String>, String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../host/src");
    let mut all = Vec::new();
    files(&src.join(folder), &mut all);
    let mut modules = BTreeMap::new();
    for path in all {
        let relative = path.strip_prefix(&src).unwrap().with_extension("");
        let mut names: Vec<String> = relative.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
        if names.last().is_some_and(|n| n == "mod") {
            names.pop();
        }
        modules.insert(names, std::fs::read_to_string(&path).unwrap());
    }
    modules
}

/// The paths a file's code names through `super::` (with `super::{a, b::c}` split) or
/// `crate::listener::`, each resolved to a path of names from the crate's root.
fn super_paths(module: &[String], is_folder: bool, text: &str) -> Vec<Vec<String>> {
    let mut paths = Vec::new();
    for line in text.lines().filter(|l| !l.trim_start().starts_with("//")) {
        let mut rest = line;
        while let Some(at) = rest.find("super::") {
            // The parent of a file's module; a folder's `mod.rs` is its module itself.
            let mut base = module.to_vec();
            if !is_folder || base.len() > 1 {
                base.pop();
            }
            let mut tail = &rest[at..];
            while let Some(after) = tail.strip_prefix("super::") {
                tail = after;
                if tail.starts_with("super::") {
                    base.pop();
                }
            }
            let ident = |s: &str| s.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect::<String>();
            if let Some(group) = tail.strip_prefix('{') {
                let group = group.split('}').next().unwrap_or("");
                for part in group.split(',') {
                    let name = ident(part.trim());
                    if !name.is_empty() {
                        paths.push([base.clone(), vec![name]].concat());
                    }
                }
            } else {
                let names: Vec<String> = tail.split("::").map(ident).take_while(|n| !n.is_empty()).collect();
                paths.push([base.clone(), names].concat());
            }
            rest = &rest[at + 7..];
        }
        // And what it names by its path from the crate's root.
        let mut rest = line;
        while let Some(at) = rest.find("crate::listener::") {
            rest = &rest[at + 7..];
            let names: Vec<String> = rest
                .split("::")
                .map(|s| s.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect::<String>())
                .take_while(|n| !n.is_empty())
                .collect();
            paths.push(names);
        }
    }
    paths
}

/// No two sibling modules of `host/src/listener/` (files, or folders taken whole) name
/// each other: each part of the listener reads without its neighbours reading it back.
#[test]
fn no_two_files_of_the_listener_import_each_other() {
    let modules = modules_in("listener");
    let mut edges: BTreeSet<(Vec<String>, Vec<String>)> = BTreeSet::new();
    for (module, text) in &modules {
        let is_folder = modules.keys().any(|other| other.len() > module.len() && other.starts_with(module));
        for path in super_paths(module, is_folder, text) {
            // The two siblings the reference joins: the first names where the paths part.
            let shared = module.iter().zip(&path).take_while(|(a, b)| a == b).count();
            if shared >= module.len() || shared >= path.len() {
                continue;
            }
            let (from, to) = (module[..=shared].to_vec(), path[..=shared].to_vec());
            if modules.contains_key(&to) {
                edges.insert((from, to));
            }
        }
    }
    let circles: Vec<String> = edges
        .iter()
        .filter(|(from, to)| from < to && edges.contains(&(to.clone(), from.clone())))
        .map(|(a, b)| format!("{} <-> {}", a.join("/"), b.join("/")))
        .collect();
    assert!(circles.is_empty(), "files of the listener that import each other:\n{}", circles.join("\n"));
}
