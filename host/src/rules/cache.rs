//! The compiled-rule cache: compiled components in memory (every rule in use, plus a few
//! recent ones) and on disk, by sha256, with a checksum.
//!
//! A compiled artifact is named `<sha256 of the rule>-<engine fingerprint>.cwasm`, where the
//! fingerprint hashes wasmtime's `precompile_compatibility_hash` (its version, the compiler's
//! settings and the CPU features it targets), so an artifact is only ever loaded by an engine
//! that could have written it. They are looked for in the engine's cache folder
//! (`<data_dir>/rule-cache`, written and trimmed by the host) and then beside the rule file
//! (artifacts shipped with the rules, written by `ebb rule compile --out`, read only).

use std::collections::HashSet;
use std::hash::{Hash, Hasher};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::SystemTime;

use anyhow::{Context as _, Result};
use sha2::{Digest, Sha256};
use wasmtime::component::Component;
use wasmtime::{Engine, Precompiled};

use super::engine::RuleEngine;
use super::file::read_rule_file;
use super::lock;
use super::memory::{image_bytes, release_free_memory_after};

/// What to do with a damaged cached artifact.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Damaged {
    /// Delete it: the host's own cache, written again after the compile.
    Delete,
    /// Leave it: a shipped artifact, not the host's to change.
    Keep,
}

/// How many compiled rules no queue uses stay in memory, for a quick swap back...
const KEEP_UNUSED_IN_MEMORY: usize = 1;
/// ...if their compiled images take no more than this: a large rule's previous version
/// is not worth its size in memory (a swap back to it loads from the disk cache).
const KEEP_UNUSED_IN_MEMORY_BYTES: usize = 8 << 20;
/// How many compiled rules no queue uses stay in the disk cache (within `cache_max_bytes`).
const KEEP_UNUSED_ON_DISK: usize = 3;

impl RuleEngine {
    /// The compiled component of the rule `bytes` (of hex sha256 `sha256`) and whether it came
    /// from a cache: memory, the cache folder, or a shipped artifact in `beside` (the rule
    /// file's folder); compiled (and written to the cache folder) when none has it.
    pub(super) fn compile(&self, sha256: &str, bytes: &[u8], beside: Option<&Path>) -> Result<(Component, bool)> {
        {
            let mut compiled = lock(&self.compiled);
            if let Some(component) = compiled.components.get(sha256).cloned() {
                compiled.touch(sha256);
                return Ok((component, true));
            }
        }
        let cached_file = self.cache_dir.as_ref().map(|dir| dir.join(self.artifact_name(sha256)));
        let shipped_file = beside.filter(|dir| Some(*dir) != self.cache_dir.as_deref()).map(|dir| dir.join(self.artifact_name(sha256)));
        let from_cache = cached_file.as_ref().and_then(|file| self.load_cached(file, Damaged::Delete));
        let found = from_cache.or_else(|| {
            let file = shipped_file.as_ref()?;
            let shipped = self.load_cached(file, Damaged::Keep);
            if shipped.is_none() {
                self.warn_of_foreign_artifacts(file.parent()?, sha256);
            }
            shipped
        });
        if let Some(component) = found {
            self.remember(sha256, &component);
            // The file's bytes were read into memory to be checked: give them back.
            release_free_memory_after(image_bytes(&component));
            return Ok((component, true));
        }
        self.compilations.fetch_add(1, Ordering::Relaxed);
        let component = Component::new(&self.engine, bytes).map_err(anyhow::Error::from).context("it is not a valid component")?;
        if let Some(file) = cached_file
            && let Err(e) = write_atomically(&file, &with_checksum(component.serialize().map_err(anyhow::Error::from)?))
        {
            tracing::warn!(file = %file.display(), "could not cache compiled rule: {e:#}");
        }
        self.remember(sha256, &component);
        release_free_memory_after(bytes.len());
        Ok((component, false))
    }

    /// The component cached in `file`, if it is there and intact. Compiled code is trusted
    /// as is by wasmtime (damaged bytes crash the process or run corrupted machine code), so
    /// the file's checksum is verified first, on the bytes in memory that are then
    /// deserialised: nothing can change between the check and the load. A damaged file is
    /// ignored with a warning, and deleted from the host's own cache (the caller recompiles
    /// and writes it again).
    pub(super) fn load_cached(&self, file: &Path, damaged: Damaged) -> Option<Component> {
        // The same refusal of FIFOs, devices and endless files as for rule files.
        let stored = match read_rule_file(file, MAX_CACHED_BYTES) {
            Ok(Some(stored)) => stored,
            Ok(None) => return None,
            Err(e) => {
                tracing::warn!(file = %file.display(), "cannot read a cached compiled rule ({e:#}); recompiling");
                return None;
            }
        };
        let Some(artifact) = verified_artifact(&stored) else {
            if damaged == Damaged::Keep {
                tracing::warn!(file = %file.display(), "ignoring a damaged compiled rule (its checksum does not match); compiling the rule");
                return None;
            }
            tracing::warn!(file = %file.display(), "cached compiled rule is damaged (its checksum does not match); deleting it and recompiling");
            if let Err(e) = std::fs::remove_file(file)
                && e.kind() != std::io::ErrorKind::NotFound
            {
                tracing::warn!(file = %file.display(), "could not delete the damaged cached rule: {e}");
            }
            return None;
        };
        // A last check that the bytes are this engine's kind of artifact (deserialising
        // checks the version and settings again, and fails with the reason).
        if Engine::detect_precompiled(artifact) != Some(Precompiled::Component) {
            tracing::warn!(file = %file.display(), "ignoring a compiled rule that is not a wasmtime component artifact; compiling the rule");
            if damaged == Damaged::Delete {
                let _ = std::fs::remove_file(file);
            }
            return None;
        }
        // SAFETY: `artifact` is exactly the bytes this engine configuration serialised (the
        // file name carries the engine fingerprint, the sha256 trailer was just verified on
        // these bytes in memory), keyed by the source's sha256.
        match unsafe { Component::deserialize(&self.engine, artifact) } {
            Ok(component) => {
                // The modification time orders the disk cache by last use.
                let _ = std::fs::File::options().append(true).open(file).and_then(|f| f.set_modified(SystemTime::now()));
                Some(component)
            }
            Err(e) => {
                tracing::warn!(file = %file.display(), "ignoring an unloadable compiled rule ({e:#}); compiling the rule");
                if damaged == Damaged::Delete {
                    let _ = std::fs::remove_file(file);
                }
                None
            }
        }
    }

    pub(super) fn remember(&self, sha256: &str, component: &Component) {
        let mut compiled = lock(&self.compiled);
        compiled.components.insert(sha256.to_string(), component.clone());
        compiled.touch(sha256);
    }

    /// Frees the compiled rules no [`CompiledRule`] handed out is using any more, except the
    /// most recent one (a quick swap back), and trims the disk cache: rules in use stay, a
    /// few recent unused ones stay within [`RuleLimits::cache_max_bytes`], the rest go.
    /// [`RuleSet`](super::RuleSet) calls it after every swap.
    pub fn evict_unused(&self) {
        let in_use = {
            let mut compiled = lock(&self.compiled);
            let in_use = compiled.in_use();
            let unused: Vec<String> = compiled.recent.iter().filter(|s| !in_use.contains(*s)).cloned().collect();
            // `recent` runs from least to most recently used: keep the last few that fit.
            let mut kept = 0;
            let mut kept_bytes = 0;
            let mut keep_from = unused.len();
            for sha in unused.iter().rev() {
                let size = compiled.components.get(sha).map_or(0, image_bytes);
                if kept == KEEP_UNUSED_IN_MEMORY || kept_bytes + size > KEEP_UNUSED_IN_MEMORY_BYTES {
                    break;
                }
                (kept, kept_bytes, keep_from) = (kept + 1, kept_bytes + size, keep_from - 1);
            }
            let evicted = &unused[..keep_from];
            let mut freed = 0;
            for sha in evicted {
                freed += compiled.components.remove(sha).map_or(0, |c| image_bytes(&c));
            }
            compiled.recent.retain(|s| !evicted.contains(s));
            (in_use, freed)
        };
        let (in_use, freed) = in_use;
        release_free_memory_after(freed);
        if let Some(dir) = &self.cache_dir
            && let Err(error) = trim_disk_cache(dir, &in_use, self.limits.cache_max_bytes)
        {
            tracing::warn!(dir = %dir.display(), "could not trim the rule cache: {error:#}");
        }
    }

    /// How many times the engine has compiled a rule (neither memory nor the disk cache had it).
    pub fn compilations(&self) -> u64 {
        self.compilations.load(Ordering::Relaxed)
    }

    /// How many compiled rules the engine holds in memory (in use or kept for a swap back).
    pub fn compiled_in_memory(&self) -> usize {
        lock(&self.compiled).components.len()
    }

    /// The file name of the compiled artifact of the rule of hex sha256 `sha256`, for this
    /// engine (as the cache and `ebb rule compile` write it).
    pub fn artifact_file_name(&self, sha256: &str) -> String {
        self.artifact_name(sha256)
    }

    /// The name of the compiled artifact of the rule of hex sha256 `sha256` for this engine.
    pub(super) fn artifact_name(&self, sha256: &str) -> String {
        format!("{sha256}-{}.cwasm", self.engine_fingerprint())
    }

    /// Warns when `dir` holds an artifact of this rule compiled by another engine (another
    /// wasmtime version, other settings, or a CPU with other features): it is ignored.
    fn warn_of_foreign_artifacts(&self, dir: &Path, sha256: &str) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        let ours = self.artifact_name(sha256);
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name != ours && name.starts_with(sha256) && name.ends_with(".cwasm") {
                tracing::warn!(
                    file = %entry.path().display(),
                    expected = %ours,
                    "ignoring a compiled rule made by another build of ebb or wasmtime, or for another CPU (its engine fingerprint differs); compiling the rule"
                );
            }
        }
    }

    pub(super) fn engine_fingerprint(&self) -> String {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        self.engine.precompile_compatibility_hash().hash(&mut hasher);
        format!("{:016x}", hasher.finish())
    }
}

/// Deletes cached artifacts no rule in use needs: all but the [`KEEP_UNUSED_ON_DISK`] most
/// recently used unused ones, then more, oldest first, while the cache is over `max_bytes`.
fn trim_disk_cache(dir: &Path, in_use: &HashSet<String>, max_bytes: u64) -> Result<()> {
    let mut total = 0u64;
    let mut unused = Vec::new();
    for entry in std::fs::read_dir(dir)?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(stem) = name.strip_suffix(".cwasm") else { continue };
        let Ok(meta) = entry.metadata() else { continue };
        total += meta.len();
        let sha = stem.split('-').next().unwrap_or_default();
        if !in_use.contains(sha) {
            unused.push((meta.modified().unwrap_or(SystemTime::UNIX_EPOCH), meta.len(), entry.path()));
        }
    }
    // Newest first: keep the first few, then drop from the end while over the bound.
    unused.sort_by_key(|entry| std::cmp::Reverse(entry.0));
    while let Some((_, len, path)) = unused.last().cloned() {
        if unused.len() <= KEEP_UNUSED_ON_DISK && total <= max_bytes {
            break;
        }
        unused.pop();
        match std::fs::remove_file(&path) {
            Ok(()) => {
                total -= len;
                tracing::debug!(file = %path.display(), "evicted a compiled rule no queue uses");
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => total -= len,
            Err(e) => return Err(e).with_context(|| format!("failed to remove {}", path.display())),
        }
    }
    Ok(())
}

/// Marks the end of a cached artifact: `artifact ‖ sha256(artifact) ‖ CACHE_TRAILER`.
const CACHE_TRAILER: &[u8; 16] = b"ebb-cwasm-sha256";

/// A serialised component with its checksum appended, as the disk cache stores it.
fn with_checksum(mut artifact: Vec<u8>) -> Vec<u8> {
    let digest = Sha256::digest(&artifact);
    artifact.extend_from_slice(&digest);
    artifact.extend_from_slice(CACHE_TRAILER);
    artifact
}

/// The artifact inside a cache file's bytes, if its checksum matches; `None` for a damaged,
/// truncated, or unmarked (older) file.
fn verified_artifact(stored: &[u8]) -> Option<&[u8]> {
    let body = stored.strip_suffix(CACHE_TRAILER.as_slice())?;
    let split = body.len().checked_sub(32)?;
    let (artifact, digest) = body.split_at(split);
    (Sha256::digest(artifact).as_slice() == digest).then_some(artifact)
}

/// Writes through a temporary file of its own, so processes sharing a cache (hosts, `ebb rule`
/// commands) never write into one another's half-written file.
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write as _;
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut tmp = tempfile::Builder::new().prefix(".ebb-artifact-").suffix(".tmp").tempfile_in(dir)?;
    tmp.write_all(bytes)?;
    tmp.persist(path).map_err(|error| error.error)?;
    Ok(())
}

/// Largest compiled rule read from the cache (a compiled Python rule is ~100 MB).
const MAX_CACHED_BYTES: u64 = 1 << 30;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cache_file_is_accepted_only_with_its_checksum_intact() {
        let stored = with_checksum(b"compiled code".to_vec());
        assert_eq!(verified_artifact(&stored), Some(&b"compiled code"[..]));
        for at in [0, 5, stored.len() - 20, stored.len() - 1] {
            let mut damaged = stored.clone();
            damaged[at] ^= 1;
            assert_eq!(verified_artifact(&damaged), None, "byte {at} flipped");
        }
        assert_eq!(verified_artifact(&stored[..stored.len() - 1]), None, "truncated");
        assert_eq!(verified_artifact(b"compiled code"), None, "no checksum (an older cache file)");
        assert_eq!(verified_artifact(b""), None);
    }
}
