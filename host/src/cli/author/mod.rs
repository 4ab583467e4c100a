//! The rule author's commands: `ebb rule new` (a rule folder from a template embedded in the
//! binary) and `ebb rule build` (the right toolchain, with the flags that matter).

pub(crate) mod build;
pub(crate) mod new;

use std::path::Path;

use anyhow::{Context as _, Result, bail};
use serde::Deserialize;

/// The file `ebb rule new` writes into a rule folder, naming the rule and its language, so
/// that `ebb rule build` knows what to run without guessing.
pub(crate) const MANIFEST: &str = "ebb-rule.toml";

/// Largest rule manifest read, in bytes (it holds two short lines).
const MAX_MANIFEST_BYTES: u64 = 64 * 1024;

/// Longest rule name: it becomes a folder, a package and a file name.
const MAX_NAME_LEN: usize = 64;

/// A language a rule can be written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Lang {
    /// Rust, with the ebb rules SDK (cargo, target wasm32-wasip2).
    Rust,
    /// Python, with componentize-py.
    Python,
    /// JavaScript, with componentize-qjs (QuickJS).
    #[value(alias = "javascript")]
    #[serde(alias = "javascript")]
    Js,
}

impl Lang {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Lang::Rust => "rust",
            Lang::Python => "python",
            Lang::Js => "js",
        }
    }
}

/// What [`MANIFEST`] holds.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Manifest {
    pub(crate) name: String,
    pub(crate) lang: Lang,
}

impl Manifest {
    /// The manifest of `folder`, `None` when it has none; its name is validated.
    pub(crate) fn read(folder: &Path) -> Result<Option<Manifest>> {
        let path = folder.join(MANIFEST);
        if std::fs::symlink_metadata(&path).is_err() {
            return Ok(None);
        }
        let text = crate::input::read_text("rule manifest", &path, MAX_MANIFEST_BYTES)?;
        let manifest: Manifest = toml::from_str(&text)
            .with_context(|| format!("rule manifest {} is not valid: it holds name = \"NAME\" and lang = \"rust\", \"python\" or \"js\"", path.display()))?;
        validate_name(&manifest.name).with_context(|| format!("in rule manifest {}", path.display()))?;
        Ok(Some(manifest))
    }
}

/// Checks a rule name: 1 to 64 lowercase ASCII letters, digits and '-', starting with a
/// letter and not ending with '-'. It becomes a folder, a package and a file name, and is
/// passed to build tools as an argument, so nothing else is let through.
pub(crate) fn validate_name(name: &str) -> Result<()> {
    let rule = "a rule name is 1 to 64 lowercase letters (a-z), digits and '-', starting with a letter and not ending with '-' (e.g. depth-per-task)";
    let valid = (1..=MAX_NAME_LEN).contains(&name.len())
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && !name.ends_with('-')
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if !valid {
        bail!("rule name {name:?} is not valid: {rule}");
    }
    Ok(())
}

/// Checks that `name` can be the package of a Rust rule: not a name Cargo refuses (a Rust
/// keyword or a crate of the standard library) nor the SDK's own.
pub(crate) fn validate_rust_name(name: &str) -> Result<()> {
    // Rust's keywords (strict and reserved), the standard crates, and the SDK.
    const TAKEN: &str = "abstract alloc as async await become box break const continue core crate do dyn ebb-rules-sdk else enum extern false final fn for gen if impl in let loop macro match mod move mut override priv proc-macro pub ref return self static std struct super test trait true try type typeof unsafe unsized use virtual where while yield";
    if TAKEN.split(' ').any(|taken| taken == name) {
        bail!("rule name {name:?} cannot name a Rust package (a Rust keyword, a standard crate or the SDK's name): pick another, e.g. {name}-rule");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_lowercase_words_joined_by_dashes() {
        let (longest, too_long) = ("a".repeat(64), "a".repeat(65));
        for good in ["a", "depth-per-task", "rule2", "a-1-b", longest.as_str()] {
            validate_name(good).unwrap();
        }
        for bad in ["", "Depth", "1rule", "-rule", "rule-", "my_rule", "my rule", "../up", "rule.wasm", "é", too_long.as_str()] {
            let error = validate_name(bad).unwrap_err().to_string();
            assert!(error.contains("lowercase letters") && error.contains(&format!("{bad:?}")), "{bad:?}: {error}");
        }
    }

    #[test]
    fn rust_names_cargo_refuses_are_refused() {
        for taken in ["test", "std", "fn", "ebb-rules-sdk"] {
            assert!(validate_rust_name(taken).unwrap_err().to_string().contains("Rust package"), "{taken}");
        }
        validate_rust_name("depth-per-task").unwrap();
    }

    #[test]
    fn a_manifest_with_an_unsafe_name_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(MANIFEST), "name = \"../x\"\nlang = \"js\"\n").unwrap();
        let error = format!("{:#}", Manifest::read(dir.path()).unwrap_err());
        assert!(error.contains("\"../x\" is not valid"), "{error}");
        std::fs::write(dir.path().join(MANIFEST), "name = \"x\"\nlang = \"go\"\n").unwrap();
        let error = format!("{:#}", Manifest::read(dir.path()).unwrap_err());
        assert!(error.contains("lang = \"rust\", \"python\" or \"js\""), "{error}");
        std::fs::write(dir.path().join(MANIFEST), "name = \"x\"\nlang = \"javascript\"\n").unwrap();
        assert_eq!(Manifest::read(dir.path()).unwrap().unwrap().lang, Lang::Js);
    }
}
