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
    // Span names, fields and the OTLP exporter: below every module that makes spans.
    ("telemetry", 1),
    // Tests only: the budget of the property fuzzers of private parsers (bus, http).
    ("fuzz", 1),
    ("queue", 2),
    ("rules", 2),
    ("bus", 2),
    ("handler", 2),
    ("cost", 2),
    ("payload", 2),
    ("record", 2),
    ("listener", 3),
    ("status", 3),
    ("config", 4),
    ("service", 5),
    ("http", 6),
    ("scaler", 6),
    ("host", 7),
    ("cli", 7),
    ("demo", 7),
    ("simulate", 7),
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

/// The sources of the crates whose folders are checked for circles: the library, and the
/// benchmarks (host/bench) beside it.
const CRATE_SOURCES: [&str; 2] = ["../host/src", "../host/bench/src"];

/// Every module of the crate in `src` with a file of its own, as a path of names from the
/// crate's root (`["listener", "pool", "tasks"]`; a folder's `mod.rs` is the folder), and its
/// text. `main.rs` is another crate and is left out.
fn modules(src: &Path) -> BTreeMap<Vec<String>, String> {
    let mut all = Vec::new();
    files(src, &mut all);
    let mut modules = BTreeMap::new();
    for path in all {
        let relative = path.strip_prefix(src).unwrap().with_extension("");
        let mut names: Vec<String> = relative.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
        if names.last().is_some_and(|n| n == "mod" || n == "lib") {
            names.pop();
        }
        if names == ["main"] {
            continue;
        }
        modules.insert(names, std::fs::read_to_string(&path).unwrap());
    }
    modules
}

/// A file's code as tokens: identifiers, `::`, and single punctuation; comments, strings and
/// character literals dropped (their braces would throw the count of inline modules off).
fn tokens(text: &str) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    let skip_string = |mut i: usize| {
        while i < chars.len() && chars[i] != '"' {
            i += if chars[i] == '\\' { 2 } else { 1 };
        }
        i + 1
    };
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            i += 2;
            while i + 1 < chars.len() && !(chars[i] == '*' && chars[i + 1] == '/') {
                i += 1;
            }
            i += 2;
        } else if c == '"' {
            i = skip_string(i + 1);
        } else if c == '\'' {
            // A character literal ('x', '\n', '{'); otherwise a lifetime's quote.
            if next == Some('\\') {
                i += 2;
                while i < chars.len() && chars[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if chars.get(i + 2) == Some(&'\'') {
                i += 3;
            } else {
                i += 1;
            }
        } else if c.is_alphanumeric() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            // A raw string (r"…", r#"…"#, br"…"): skip to its closing quote and hashes.
            if (word == "r" || word == "br") && matches!(chars.get(i), Some('"') | Some('#')) {
                let hashes = chars[i..].iter().take_while(|c| **c == '#').count();
                i += hashes + 1;
                let close: Vec<char> = std::iter::once('"').chain(std::iter::repeat_n('#', hashes)).collect();
                while i < chars.len() && !chars[i..].starts_with(&close) {
                    i += 1;
                }
                i += close.len();
            } else if word == "b" && chars.get(i) == Some(&'"') {
                i = skip_string(i + 1);
            } else {
                out.push(word);
            }
        } else if c == ':' && next == Some(':') {
            out.push("::".to_string());
            i += 2;
        } else if !c.is_whitespace() {
            out.push(c.to_string());
            i += 1;
        } else {
            i += 1;
        }
    }
    out
}

/// The paths named by a `use` tree or path that starts at `tokens[at]` (just after `base::`),
/// each added to `base`: `a::{b, c::d}` gives `base/a/b` and `base/a/c/d`. Returns where it ends.
fn tree(tokens: &[String], mut at: usize, base: Vec<String>, out: &mut Vec<Vec<String>>) -> usize {
    let mut path = base;
    loop {
        match tokens.get(at).map(String::as_str) {
            Some("{") => {
                at += 1;
                while tokens.get(at).is_some_and(|t| t != "}") {
                    at = tree(tokens, at, path.clone(), out);
                    if tokens.get(at).is_some_and(|t| t == ",") {
                        at += 1;
                    }
                }
                return at + 1;
            }
            Some(word) if word.chars().all(|c| c.is_alphanumeric() || c == '_') && word != "self" => {
                path.push(word.to_string());
                at += 1;
                if tokens.get(at).is_some_and(|t| t == "::") {
                    at += 1;
                    continue;
                }
                out.push(path);
                // Skip an `as name` so the name is not read as the next path.
                if tokens.get(at).is_some_and(|t| t == "as") {
                    at += 2;
                }
                return at;
            }
            Some(_) | None => {
                // `self`, `*`, or the end: the path so far.
                if tokens.get(at).is_some_and(|t| t == "self" || t == "*") {
                    at += 1;
                }
                out.push(path);
                return at;
            }
        }
    }
}

/// Every path a module's file names through `super::` or `crate::`, resolved to a path of
/// names from the crate's root. `super` inside an inline module (`mod tests { … }`) counts
/// from that inline module.
fn named_paths(module: &[String], text: &str) -> Vec<Vec<String>> {
    let tokens = tokens(text);
    let mut paths = Vec::new();
    // One entry per open brace: the inline module it opens, if it opens one.
    let mut braces: Vec<Option<String>> = Vec::new();
    let mut at = 0;
    while at < tokens.len() {
        let token = tokens[at].as_str();
        let starts_path = at == 0 || tokens[at - 1] != "::";
        if token == "{" {
            let opens_mod = at >= 2 && tokens[at - 2] == "mod";
            braces.push(opens_mod.then(|| tokens[at - 1].clone()));
            at += 1;
        } else if token == "}" {
            braces.pop();
            at += 1;
        } else if starts_path && (token == "super" || token == "crate") && tokens.get(at + 1).is_some_and(|t| t == "::") {
            let mut base: Vec<String> = if token == "crate" {
                Vec::new()
            } else {
                let mut here = module.to_vec();
                here.extend(braces.iter().flatten().cloned());
                here.pop();
                here
            };
            at += 2;
            while tokens.get(at).is_some_and(|t| t == "super") && tokens.get(at + 1).is_some_and(|t| t == "::") {
                base.pop();
                at += 2;
            }
            at = tree(&tokens, at, base, &mut paths);
        } else {
            at += 1;
        }
    }
    paths
}

/// Each pair of sibling modules of a folder of the crate in `src` (files, or folders taken
/// whole) where the first names the second.
fn sibling_edges(src: &Path) -> BTreeSet<(Vec<String>, Vec<String>)> {
    let modules = modules(src);
    let mut edges = BTreeSet::new();
    for (module, text) in &modules {
        for path in named_paths(module, text) {
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
    edges
}

/// No two sibling modules of any folder of `host/src` or `host/bench/src` (files, or folders
/// taken whole) name each other: each part of a folder reads without its neighbours reading
/// it back.
#[test]
fn no_two_files_of_a_folder_import_each_other() {
    let mut circles = Vec::new();
    for src in CRATE_SOURCES {
        let edges = sibling_edges(&Path::new(env!("CARGO_MANIFEST_DIR")).join(src));
        circles.extend(
            edges
                .iter()
                .filter(|(from, to)| from < to && edges.contains(&(to.clone(), from.clone())))
                .map(|(a, b)| format!("{src}: {} <-> {}", a.join("/"), b.join("/"))),
        );
    }
    assert!(circles.is_empty(), "files of a folder that import each other:\n{}", circles.join("\n"));
}
