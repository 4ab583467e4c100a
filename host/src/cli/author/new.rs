//! `ebb rule new NAME --lang rust|python|js`: a rule folder that builds outside this
//! repository, with the rule, a unit test in the language's own runner and a cases file.
//!
//! Every file comes from the binary (works offline). The Rust SDK, the WIT contract and the
//! pinned Cargo.lock are embedded from rules-sdk/, wit/ and example-rules/Cargo.lock at
//! compile time, so a generated folder never drifts from the ebb that made it.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail};

use super::{Lang, MANIFEST, validate_name, validate_rust_name};

/// The contract a new Rust rule is built against: the SDK's (wit/ebb-rules-0.4.0).
const SDK_CONTRACT_WIT: &str = include_str!("../../../../wit/ebb-rules-0.4.0/rules.wit");
/// Where the SDK reads the contract from, relative to its own folder (rules-sdk/src/guest.rs).
const SDK_WIT_DIR: &str = "vendor/wit/ebb-rules-0.4.0";
/// The contract a new Python or JavaScript rule is written against (wit/ebb-rules-0.2.0):
/// their templates decide no handler concurrency, and a 0.2.0 rule keeps loading, its queues
/// keeping their configured bound. Moving them means a `max_concurrent_calls` in each template.
pub(crate) const SCRIPT_CONTRACT_WIT: &str = include_str!("../../../../wit/ebb-rules-0.2.0/rules.wit");

/// The SDK's sources, vendored into a Rust rule (it is not on crates.io).
const SDK_SOURCES: &[(&str, &str)] = &[
    ("backoff.rs", include_str!("../../../../rules-sdk/src/backoff.rs")),
    ("guest.rs", include_str!("../../../../rules-sdk/src/guest.rs")),
    ("lib.rs", include_str!("../../../../rules-sdk/src/lib.rs")),
    ("model.rs", include_str!("../../../../rules-sdk/src/model.rs")),
    ("paper.rs", include_str!("../../../../rules-sdk/src/paper.rs")),
    ("params.rs", include_str!("../../../../rules-sdk/src/params.rs")),
    ("thresholds.rs", include_str!("../../../../rules-sdk/src/thresholds.rs")),
];
/// The workspace manifest, for the SDK's pinned wit-bindgen line.
const WORKSPACE_MANIFEST: &str = include_str!("../../../../Cargo.toml");
/// The example rules' lock: the versions the SDK is tested with.
const EXAMPLE_RULES_LOCK: &str = include_str!("../../../../example-rules/Cargo.lock");

const CASES: &str = include_str!("../../../templates/cases.toml");

const RUST_CARGO_TOML: &str = include_str!("../../../templates/rust/Cargo.toml");
const RUST_LIB: &str = include_str!("../../../templates/rust/src/lib.rs");
const RUST_GITIGNORE: &str = include_str!("../../../templates/rust/gitignore");
const RUST_SDK_CARGO_TOML: &str = include_str!("../../../templates/rust/vendor-sdk-Cargo.toml");

const PYTHON_APP: &str = include_str!("../../../templates/python/app.py");
const PYTHON_TEST: &str = include_str!("../../../templates/python/test_app.py");
const PYTHON_GITIGNORE: &str = include_str!("../../../templates/python/gitignore");

const JS_RULE: &str = include_str!("../../../templates/js/rule.js");
const JS_TEST: &str = include_str!("../../../templates/js/rule.test.js");
const JS_PACKAGE: &str = include_str!("../../../templates/js/package.json");
const JS_GITIGNORE: &str = include_str!("../../../templates/js/gitignore");

/// Creates `parent/name` holding a new rule in `lang`, and returns its path. Refuses a path
/// that exists; the files are written into a hidden sibling first and renamed into place, so
/// a failure leaves nothing half-made.
pub(crate) fn create(name: &str, lang: Lang, parent: &Path) -> Result<PathBuf> {
    validate_name(name)?;
    if lang == Lang::Rust {
        validate_rust_name(name)?;
    }
    match std::fs::metadata(parent) {
        Ok(meta) if meta.is_dir() => {}
        Ok(_) => bail!("{} is not a folder: give --dir a folder to create the rule in", parent.display()),
        Err(error) => bail!("cannot use folder {} ({error}): create it first, or give another --dir", parent.display()),
    }
    let target = parent.join(name);
    if std::fs::symlink_metadata(&target).is_ok() {
        bail!("{} already exists, and ebb rule new never overwrites: pick another name or --dir, or move it away", target.display());
    }
    let staging = parent.join(format!(".{name}.ebb-new-{}", std::process::id()));
    std::fs::create_dir(&staging).with_context(|| format!("failed to create folder {} (is {} writable?)", staging.display(), parent.display()))?;
    let written = write_files(&staging, name, lang).and_then(|()| {
        // Checked again just before: a folder made meanwhile is not replaced (rename would
        // replace an empty one; nothing in it is lost then, but it is still refused here).
        if std::fs::symlink_metadata(&target).is_ok() {
            bail!("{} appeared while the rule was written, and ebb rule new never overwrites", target.display());
        }
        std::fs::rename(&staging, &target).with_context(|| format!("failed to move {} to {}", staging.display(), target.display()))
    });
    if let Err(error) = written {
        let _ = std::fs::remove_dir_all(&staging);
        return Err(error);
    }
    Ok(target)
}

/// Tells the author what was made and the loop that follows.
pub(crate) fn print_next_steps(folder: &Path, lang: Lang) {
    let shown = folder.display();
    let name = folder.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let (edit, test_and_build) = match lang {
        Lang::Rust => ("src/lib.rs", vec!["cargo test", "ebb rule build"]),
        Lang::Python => ("app.py", vec!["ebb rule build    # also writes the bindings app.py imports", "python3 -m unittest"]),
        Lang::Js => ("rule.js", vec!["node --test", "ebb rule build"]),
    };
    println!("created {shown} ({} rule: tasks = ceil(depth / per_task), the paper's back-off)", lang.as_str());
    println!("next, in {shown}:");
    println!("  edit {edit}, and cases.toml");
    for step in test_and_build {
        println!("  {step}");
    }
    println!("  ebb rule test {name}.wasm cases.toml");
    println!("  ebb rule check {name}.wasm --param per_task=32");
    println!("  cp {name}.wasm <the host's rules folder>/    # the host swaps it in while it runs");
}

/// The files of a new rule, as (path in the folder, content).
fn files(name: &str, lang: Lang) -> Result<Vec<(String, String)>> {
    let fill = |template: &str| template.replace("{{name}}", name).replace("{{crate}}", &name.replace('-', "_"));
    let mut files = vec![
        (MANIFEST.to_string(), format!("# Written by `ebb rule new`: what `ebb rule build` builds.\nname = \"{name}\"\nlang = \"{}\"\n", lang.as_str())),
        ("cases.toml".to_string(), fill(CASES)),
    ];
    match lang {
        Lang::Rust => {
            files.push(("Cargo.toml".into(), fill(RUST_CARGO_TOML)));
            files.push(("Cargo.lock".into(), rust_lock(name)));
            files.push(("src/lib.rs".into(), fill(RUST_LIB)));
            files.push((".gitignore".into(), RUST_GITIGNORE.into()));
            files.push(("vendor/ebb-rules-sdk/Cargo.toml".into(), RUST_SDK_CARGO_TOML.replace("{{wit_bindgen}}", &wit_bindgen_dependency()?)));
            for (file, text) in SDK_SOURCES {
                files.push((format!("vendor/ebb-rules-sdk/src/{file}"), (*text).into()));
            }
            files.push((format!("{SDK_WIT_DIR}/rules.wit"), SDK_CONTRACT_WIT.into()));
        }
        Lang::Python => {
            files.push(("app.py".into(), fill(PYTHON_APP)));
            files.push(("test_app.py".into(), fill(PYTHON_TEST)));
            files.push(("wit/rules.wit".into(), SCRIPT_CONTRACT_WIT.into()));
            files.push((".gitignore".into(), PYTHON_GITIGNORE.into()));
        }
        Lang::Js => {
            files.push(("rule.js".into(), fill(JS_RULE)));
            files.push(("rule.test.js".into(), fill(JS_TEST)));
            files.push(("package.json".into(), fill(JS_PACKAGE)));
            // Not read by the build (it brings its own copy): the fields, for the author.
            files.push(("wit/rules.wit".into(), SCRIPT_CONTRACT_WIT.into()));
            files.push((".gitignore".into(), JS_GITIGNORE.into()));
        }
    }
    Ok(files)
}

fn write_files(root: &Path, name: &str, lang: Lang) -> Result<()> {
    for (relative, content) in files(name, lang)? {
        let path = root.join(&relative);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("failed to create folder {}", dir.display()))?;
        }
        std::fs::write(&path, content).with_context(|| format!("failed to write {}", path.display()))?;
    }
    Ok(())
}

/// The workspace's `wit-bindgen = { ... }` line (the SDK's bindings generator, pinned),
/// optional as in the SDK's own manifest (its `guest` feature turns it on).
fn wit_bindgen_dependency() -> Result<String> {
    let line = WORKSPACE_MANIFEST
        .lines()
        .find(|line| line.starts_with("wit-bindgen = {") && line.trim_end().ends_with('}'))
        .context("this ebb was built without a wit-bindgen pin in its workspace Cargo.toml (a bug: report it)")?;
    Ok(format!("{}, optional = true }}", line.trim_end().trim_end_matches('}').trim_end()))
}

/// example-rules/Cargo.lock for a workspace holding only `name`: the example rules' own
/// packages are replaced by this one, the registry packages (pinned, with checksums) kept.
fn rust_lock(name: &str) -> String {
    let (header, packages) = EXAMPLE_RULES_LOCK.split_once("[[package]]").unwrap_or((EXAMPLE_RULES_LOCK, ""));
    let mut blocks: Vec<String> = packages
        .split("[[package]]")
        .map(|block| format!("[[package]]{}", block.trim_end()))
        .filter(|block| block.contains("\nsource = ") || block.contains("name = \"ebb-rules-sdk\""))
        // The vendored SDK leaves out the optional failure-aware world's bindings crate.
        .map(|block| block.replace(" \"ebb-rules-failure-bindings\",\n", ""))
        .collect();
    blocks.push(format!("[[package]]\nname = \"{name}\"\nversion = \"0.1.0\"\ndependencies = [\n \"ebb-rules-sdk\",\n]"));
    let package_name = |block: &String| block.lines().find_map(|l| l.strip_prefix("name = ")).unwrap_or_default().to_string();
    blocks.sort_by_key(package_name);
    format!("{}{}\n", header, blocks.join("\n\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_sdk_source_is_vendored() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../rules-sdk/src");
        let mut on_disk: Vec<String> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        on_disk.sort();
        let vendored: Vec<&str> = SDK_SOURCES.iter().map(|(file, _)| *file).collect();
        assert_eq!(on_disk, vendored, "add the new file of rules-sdk/src to SDK_SOURCES");
        let read_from = SDK_WIT_DIR.strip_prefix("vendor/").unwrap();
        assert!(SDK_SOURCES.iter().any(|(_, text)| text.contains(&format!("\"../{read_from}\""))), "the SDK reads the WIT from {SDK_WIT_DIR}");
        assert!(SDK_CONTRACT_WIT.contains(&format!("package ebb:rules@{};", crate::rules::CONTRACT_VERSION)), "the vendored WIT is the newest contract");
    }

    #[test]
    fn the_rust_lock_pins_the_examples_registry_packages_for_the_new_rule() {
        let lock = rust_lock("depth-rule");
        assert!(lock.starts_with("# This file is automatically @generated by Cargo.") && lock.contains("version = 4"), "{lock}");
        assert!(lock.contains("name = \"depth-rule\"") && lock.contains("name = \"ebb-rules-sdk\"") && lock.contains("name = \"wit-bindgen\""));
        // The examples, and the failure-aware world's bindings the vendored SDK leaves out.
        let local = ["adaptive-concurrency", "paper-default", "proportional", "retry-policy", "threshold-table", "ebb-rules-failure-bindings"];
        assert!(local.iter().all(|package| !lock.contains(&format!("\"{package}\""))), "{lock}");
        assert_eq!(lock.matches("[[package]]").count(), EXAMPLE_RULES_LOCK.matches("[[package]]").count() - local.len() + 1);
        let wit_bindgen = wit_bindgen_dependency().unwrap();
        assert!(wit_bindgen.contains("\"=0.") && wit_bindgen.ends_with(", optional = true }"), "pinned exactly, optional: {wit_bindgen}");
    }

    #[test]
    fn templates_name_the_rule_and_leave_no_placeholder() {
        for lang in [Lang::Rust, Lang::Python, Lang::Js] {
            let files = files("depth-rule", lang).unwrap();
            for (path, text) in &files {
                assert!(!text.contains("{{"), "{lang:?} {path} keeps a placeholder");
            }
            let manifest = &files.iter().find(|(p, _)| p == MANIFEST).unwrap().1;
            assert!(manifest.contains("name = \"depth-rule\"") && manifest.contains(&format!("lang = \"{}\"", lang.as_str())));
        }
    }
}
