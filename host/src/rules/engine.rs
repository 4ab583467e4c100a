//! One wasmtime engine for the process: compiling, validating and instantiating rule
//! components under limits.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context as _, Result, bail};
use sha2::{Digest, Sha256};
use wasmtime::component::{Component, Linker};
use wasmtime::{Config, Engine};

use super::bindings::{ContractVersion, v0_1, v0_2, v0_3, v0_4};
use super::contract::{check_signatures, contract_version, exports_failures};
use super::file::{file_name, read_rule_file};
use super::hint::with_hint;
use super::limits::RuleLimits;
use super::lock;
use super::sandbox::RuleHost;
use super::ticker::{EPOCH_TICK, EpochTicker};

/// A compiled, validated rule component, shared by every queue that uses the file.
pub struct CompiledRule {
    /// The rule's file name (without directory).
    pub name: String,
    /// Hex sha256 of the file's bytes.
    pub sha256: String,
    /// File size in bytes.
    pub size: u64,
    /// Time spent compiling (or loading from the cache).
    pub compile_time: Duration,
    /// Whether the compiled artifact came from the cache.
    pub from_cache: bool,
    /// When this version was loaded.
    pub loaded_at: SystemTime,
    /// Component-level imports, by name.
    pub imports: Vec<String>,
    /// Component-level exports, by name.
    pub exports: Vec<String>,
    /// The contract version it was built for (read from its exports).
    pub contract: ContractVersion,
    /// Whether it exports `ebb:rules/failures@0.4.0` (the `failure-aware-rule` world): it
    /// decides what happens to failed messages.
    pub decides_failures: bool,
    pub(super) pre: RulePre,
}

/// A rule, linked and ready to instantiate, with the bindings of its contract version.
pub(super) enum RulePre {
    V0_1(v0_1::ScalingRulePre<RuleHost>),
    V0_2(v0_2::ScalingRulePre<RuleHost>),
    V0_3(v0_3::ScalingRulePre<RuleHost>),
    /// Loaded interface by interface: `failures` only when the rule exports it.
    V0_4 {
        pre: wasmtime::component::InstancePre<RuleHost>,
        decisions: v0_4::wit::GuestIndices,
        failures: Option<v0_4::failures_wit::GuestIndices>,
    },
}

/// The compiled components the engine holds: every rule in use, plus a few recent ones.
#[derive(Default)]
pub(super) struct Compiled {
    /// By sha256.
    pub(super) components: HashMap<String, Component>,
    /// sha256s, least recently used first.
    pub(super) recent: Vec<String>,
    /// The rules handed out, to tell which are in use.
    pub(super) handed_out: Vec<(String, Weak<CompiledRule>)>,
}

impl Compiled {
    pub(super) fn touch(&mut self, sha256: &str) {
        self.recent.retain(|s| s != sha256);
        self.recent.push(sha256.to_string());
    }

    pub(super) fn in_use(&mut self) -> HashSet<String> {
        self.handed_out.retain(|(_, rule)| rule.strong_count() > 0);
        self.handed_out.iter().map(|(sha, _)| sha.clone()).collect()
    }
}

/// The process-wide rule engine.
pub struct RuleEngine {
    pub(super) engine: Engine,
    pub(super) linker: Linker<RuleHost>,
    pub(super) limits: RuleLimits,
    pub(super) cache_dir: Option<PathBuf>,
    pub(super) compiled: Mutex<Compiled>,
    pub(super) compilations: AtomicU64,
    pub(super) ticker: EpochTicker,
}

impl RuleEngine {
    /// An engine with these limits. `cache_dir`, if given, keeps compiled rules by sha256
    /// so that a restart or a re-deploy of a known rule skips compilation.
    pub fn new(limits: RuleLimits, cache_dir: Option<PathBuf>) -> Result<Arc<Self>> {
        let mut config = Config::new();
        config.wasm_component_model(true).epoch_interruption(true).consume_fuel(true).max_wasm_stack(limits.stack_bytes);
        let engine = Engine::new(&config).map_err(anyhow::Error::from).context("failed to create the wasm engine")?;
        let mut linker = Linker::new(&engine);
        // Toolchains import WASI even for pure code; link it against an empty context so
        // every capability it could reach is denied.
        wasmtime_wasi::p2::add_to_linker_sync(&mut linker).map_err(anyhow::Error::from).context("failed to link WASI")?;
        if let Some(dir) = &cache_dir {
            std::fs::create_dir_all(dir).with_context(|| format!("failed to create rule cache {}", dir.display()))?;
        }
        let ticker = EpochTicker::start(engine.clone())?;
        Ok(Arc::new(RuleEngine { engine, linker, limits, cache_dir, compiled: Mutex::default(), compilations: AtomicU64::new(0), ticker }))
    }

    /// The limits every rule runs under.
    pub fn limits(&self) -> &RuleLimits {
        &self.limits
    }

    /// Reads, compiles and validates the rule at `path`. Fails, naming the file and the
    /// reason, on anything that is not a loadable `ebb:rules` component.
    pub fn load_file(&self, path: &Path) -> Result<Arc<CompiledRule>> {
        let name = file_name(path);
        let Some(bytes) = read_rule_file(path, self.limits.max_file_bytes)? else {
            bail!("rule file {} does not exist", path.display());
        };
        self.load_bytes_beside(&name, &bytes, path.parent()).with_context(|| format!("failed to load rule {name}"))
    }

    /// Compiles (or fetches from the cache) and validates a rule from its bytes.
    pub fn load_bytes(&self, name: &str, bytes: &[u8]) -> Result<Arc<CompiledRule>> {
        self.load_bytes_beside(name, bytes, None)
    }

    /// [`RuleEngine::load_bytes`] of a rule read from a file in `folder`, where a compiled
    /// artifact may have been shipped beside it (see `ebb rule compile --out`).
    /// An error says what to do about it when the mistake is a known one (see `hint`).
    pub(crate) fn load_bytes_beside(&self, name: &str, bytes: &[u8], folder: Option<&Path>) -> Result<Arc<CompiledRule>> {
        self.load_validated(name, bytes, folder).map_err(|e| with_hint(e, None))
    }

    fn load_validated(&self, name: &str, bytes: &[u8], folder: Option<&Path>) -> Result<Arc<CompiledRule>> {
        if bytes.len() as u64 > self.limits.max_file_bytes {
            bail!("{} bytes, over the limit of {} bytes", bytes.len(), self.limits.max_file_bytes);
        }
        if !bytes.starts_with(b"\0asm") {
            bail!("not a WebAssembly file (it does not start with \\0asm)");
        }
        let sha256 = hex::encode(Sha256::digest(bytes));
        let started = Instant::now();
        let (component, from_cache) = self.compile(&sha256, bytes, folder)?;
        let compile_time = started.elapsed();
        let ty = component.component_type();
        let imports: Vec<String> = ty.imports(&self.engine).map(|(n, _)| n.to_string()).collect();
        let exports: Vec<String> = ty.exports(&self.engine).map(|(n, _)| n.to_string()).collect();
        let contract = contract_version(&exports)?;
        check_signatures(&self.engine, &ty, contract)?;
        let decides_failures = exports_failures(&self.engine, &ty, &exports)?;
        if decides_failures && contract != ContractVersion::V0_4 {
            bail!(
                "it exports ebb:rules/failures@0.4.0 beside ebb:rules/decisions@{contract}: build both from the failure-aware-rule world of wit/ebb-rules-0.4.0"
            );
        }
        let instance_pre =
            self.linker.instantiate_pre(&component).map_err(anyhow::Error::from).context("its imports cannot be satisfied (a rule gets no capabilities)")?;
        let world = || format!("its exports do not match the ebb:rules/scaling-rule@{contract} world");
        let pre = match contract {
            ContractVersion::V0_1 => RulePre::V0_1(v0_1::ScalingRulePre::new(instance_pre).map_err(anyhow::Error::from).with_context(world)?),
            ContractVersion::V0_2 => RulePre::V0_2(v0_2::ScalingRulePre::new(instance_pre).map_err(anyhow::Error::from).with_context(world)?),
            ContractVersion::V0_3 => RulePre::V0_3(v0_3::ScalingRulePre::new(instance_pre).map_err(anyhow::Error::from).with_context(world)?),
            ContractVersion::V0_4 => RulePre::V0_4 {
                decisions: v0_4::wit::GuestIndices::new(&instance_pre).map_err(anyhow::Error::from).with_context(world)?,
                failures: match decides_failures {
                    true => Some(
                        v0_4::failures_wit::GuestIndices::new(&instance_pre)
                            .map_err(anyhow::Error::from)
                            .context("its exports do not match the ebb:rules/failure-aware-rule@0.4.0 world")?,
                    ),
                    false => None,
                },
                pre: instance_pre,
            },
        };
        let rule = Arc::new(CompiledRule {
            name: name.to_string(),
            sha256: sha256.clone(),
            size: bytes.len() as u64,
            compile_time,
            from_cache,
            loaded_at: SystemTime::now(),
            imports,
            exports,
            contract,
            decides_failures,
            pre,
        });
        lock(&self.compiled).handed_out.push((sha256, Arc::downgrade(&rule)));
        Ok(rule)
    }
}

pub(super) fn deadline_ticks(deadline: Duration) -> u64 {
    // +1: the current tick may be almost over when the call starts.
    (deadline.as_micros() / EPOCH_TICK.as_micros()).max(1) as u64 + 1
}

/// Epoch ticks until the next check of a running call, `wait` from now (at least one).
pub(super) fn ticks_until(wait: Duration) -> u64 {
    wait.as_micros().div_ceil(EPOCH_TICK.as_micros()).clamp(1, u128::from(u64::MAX)) as u64
}
