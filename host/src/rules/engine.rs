//! One wasmtime engine for the process: compiling (with a sha256-keyed cache), validating
//! and instantiating rule components under limits.

use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context as _, Result, bail};
use sha2::{Digest, Sha256};
use wasmtime::component::{Component, Linker, ResourceTable};
use wasmtime::{Config, Engine, ResourceLimiter, Store, Trap};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use super::bindings::{CONTRACT_INTERFACE, CONTRACT_VERSION, ScalingRule, ScalingRulePre, wit};
use super::stderr::CapturedOutput;

/// Limits applied to every rule. Decisions get the per-call limits; instantiation plus
/// `configure` get the (larger) setup limits.
#[derive(Debug, Clone)]
pub struct RuleLimits {
    /// Wall-clock budget of one decision call.
    pub call_deadline: Duration,
    /// Fuel (roughly, wasm instructions) of one decision call.
    pub call_fuel: u64,
    /// Wall-clock budget of instantiating a rule and calling `configure`.
    pub setup_deadline: Duration,
    /// Fuel of instantiating a rule and calling `configure`.
    pub setup_fuel: u64,
    /// Most linear memory one rule instance may hold, in bytes.
    pub memory_bytes: usize,
    /// Most wasm stack a call may use, in bytes (engine-wide).
    pub stack_bytes: usize,
    /// Largest rule file accepted, in bytes.
    pub max_file_bytes: u64,
    /// Consecutive faulty calls after which a rule is quarantined until its file's content changes.
    pub quarantine_after: u32,
    /// Most bytes the on-disk compiled-rule cache may hold. Rules in use are never evicted,
    /// even when they alone exceed it; unused ones go oldest first.
    pub cache_max_bytes: u64,
}

impl Default for RuleLimits {
    fn default() -> Self {
        RuleLimits {
            call_deadline: Duration::from_millis(10),
            call_fuel: 10_000_000,
            setup_deadline: Duration::from_secs(2),
            setup_fuel: 2_000_000_000,
            memory_bytes: 64 << 20,
            stack_bytes: 512 << 10,
            max_file_bytes: 64 << 20,
            quarantine_after: 5,
            cache_max_bytes: 256 << 20,
        }
    }
}

/// How often the epoch ticker advances the engine's epoch: the deadline's resolution.
const EPOCH_TICK: Duration = Duration::from_millis(1);

/// The state each rule `Store` carries: an empty, capability-free WASI context
/// (no preopened dirs, env, args or network), the memory limiter and the captured output.
pub struct RuleHost {
    wasi: WasiCtx,
    table: ResourceTable,
    limiter: MemoryLimiter,
    pub(crate) output: CapturedOutput,
}

/// Caps an instance's linear memory and remembers how much it holds.
struct MemoryLimiter {
    cap: usize,
    held: usize,
}

impl ResourceLimiter for MemoryLimiter {
    fn memory_growing(&mut self, current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        let after = self.held - current.min(self.held) + desired;
        if after > self.cap {
            wasmtime::bail!("memory limit: the rule asked for {after} bytes of linear memory, the limit is {} bytes", self.cap);
        }
        self.held = after;
        Ok(true)
    }

    fn table_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        Ok(desired <= 1_000_000)
    }
}

impl WasiView for RuleHost {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.wasi, table: &mut self.table }
    }
}

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
    pre: ScalingRulePre<RuleHost>,
}

/// How many compiled rules no queue uses stay in memory, for a quick swap back...
const KEEP_UNUSED_IN_MEMORY: usize = 1;
/// ...if their compiled images take no more than this: a large rule's previous version
/// is not worth its size in memory (a swap back to it loads from the disk cache).
const KEEP_UNUSED_IN_MEMORY_BYTES: usize = 8 << 20;
/// How many compiled rules no queue uses stay in the disk cache (within `cache_max_bytes`).
const KEEP_UNUSED_ON_DISK: usize = 3;

/// The compiled components the engine holds: every rule in use, plus a few recent ones.
#[derive(Default)]
struct Compiled {
    /// By sha256.
    components: HashMap<String, Component>,
    /// sha256s, least recently used first.
    recent: Vec<String>,
    /// The rules handed out, to tell which are in use.
    handed_out: Vec<(String, Weak<CompiledRule>)>,
}

impl Compiled {
    fn touch(&mut self, sha256: &str) {
        self.recent.retain(|s| s != sha256);
        self.recent.push(sha256.to_string());
    }

    fn in_use(&mut self) -> HashSet<String> {
        self.handed_out.retain(|(_, rule)| rule.strong_count() > 0);
        self.handed_out.iter().map(|(sha, _)| sha.clone()).collect()
    }
}

/// The process-wide rule engine.
pub struct RuleEngine {
    engine: Engine,
    linker: Linker<RuleHost>,
    limits: RuleLimits,
    cache_dir: Option<PathBuf>,
    compiled: Mutex<Compiled>,
    compilations: AtomicU64,
    ticker_stop: Arc<AtomicBool>,
}

impl Drop for RuleEngine {
    fn drop(&mut self) {
        self.ticker_stop.store(true, Ordering::Relaxed);
    }
}

/// What a rule is doing when it faults: the limits differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Instantiation and `configure`.
    Setup,
    /// A decision call.
    Call,
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
        let ticker_stop = Arc::new(AtomicBool::new(false));
        spawn_epoch_ticker(engine.clone(), ticker_stop.clone())?;
        Ok(Arc::new(RuleEngine { engine, linker, limits, cache_dir, compiled: Mutex::default(), compilations: AtomicU64::new(0), ticker_stop }))
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
        self.load_bytes(&name, &bytes).with_context(|| format!("failed to load rule {name}"))
    }

    /// Compiles (or fetches from the cache) and validates a rule from its bytes.
    pub fn load_bytes(&self, name: &str, bytes: &[u8]) -> Result<Arc<CompiledRule>> {
        if bytes.len() as u64 > self.limits.max_file_bytes {
            bail!("{} bytes, over the limit of {} bytes", bytes.len(), self.limits.max_file_bytes);
        }
        if !bytes.starts_with(b"\0asm") {
            bail!("not a WebAssembly file (it does not start with \\0asm)");
        }
        let sha256 = hex::encode(Sha256::digest(bytes));
        let started = Instant::now();
        let (component, from_cache) = self.compile(&sha256, bytes)?;
        let compile_time = started.elapsed();
        let ty = component.component_type();
        let imports: Vec<String> = ty.imports(&self.engine).map(|(n, _)| n.to_string()).collect();
        let exports: Vec<String> = ty.exports(&self.engine).map(|(n, _)| n.to_string()).collect();
        check_contract_version(&exports)?;
        check_signatures(&self.engine, &ty)?;
        let instance_pre =
            self.linker.instantiate_pre(&component).map_err(anyhow::Error::from).context("its imports cannot be satisfied (a rule gets no capabilities)")?;
        let pre = ScalingRulePre::new(instance_pre).map_err(anyhow::Error::from).context("its exports do not match the ebb:rules/scaling-rule world")?;
        let rule = Arc::new(CompiledRule {
            name: name.to_string(),
            sha256: sha256.clone(),
            size: bytes.len() as u64,
            compile_time,
            from_cache,
            loaded_at: SystemTime::now(),
            imports,
            exports,
            pre,
        });
        lock(&self.compiled).handed_out.push((sha256, Arc::downgrade(&rule)));
        Ok(rule)
    }

    fn compile(&self, sha256: &str, bytes: &[u8]) -> Result<(Component, bool)> {
        {
            let mut compiled = lock(&self.compiled);
            if let Some(component) = compiled.components.get(sha256).cloned() {
                compiled.touch(sha256);
                return Ok((component, true));
            }
        }
        let cached_file = self.cache_dir.as_ref().map(|dir| dir.join(format!("{sha256}-{}.cwasm", self.engine_fingerprint())));
        if let Some(file) = &cached_file
            && let Some(component) = self.load_cached(file)
        {
            self.remember(sha256, &component);
            // The file's bytes were read into memory to be checked: give them back.
            release_free_memory_after(image_bytes(&component));
            return Ok((component, true));
        }
        self.compilations.fetch_add(1, Ordering::Relaxed);
        let component = Component::new(&self.engine, bytes).map_err(anyhow::Error::from).context("it is not a valid component")?;
        if let Some(file) = cached_file {
            if let Err(e) = write_atomically(&file, &with_checksum(component.serialize().map_err(anyhow::Error::from)?)) {
                tracing::warn!(file = %file.display(), "could not cache compiled rule: {e:#}");
            }
        }
        self.remember(sha256, &component);
        release_free_memory_after(bytes.len());
        Ok((component, false))
    }

    /// The component cached in `file`, if it is there and intact. Compiled code is trusted
    /// as is by wasmtime (damaged bytes crash the process or run corrupted machine code), so
    /// the file's checksum is verified first, on the bytes in memory that are then
    /// deserialised: nothing can change between the check and the load. A damaged file is
    /// deleted (the caller recompiles and writes it again).
    fn load_cached(&self, file: &Path) -> Option<Component> {
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
            tracing::warn!(file = %file.display(), "cached compiled rule is damaged (its checksum does not match); deleting it and recompiling");
            if let Err(e) = std::fs::remove_file(file)
                && e.kind() != std::io::ErrorKind::NotFound
            {
                tracing::warn!(file = %file.display(), "could not delete the damaged cached rule: {e}");
            }
            return None;
        };
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
                tracing::warn!(file = %file.display(), "ignoring an unloadable cached rule ({e:#}); recompiling");
                let _ = std::fs::remove_file(file);
                None
            }
        }
    }

    fn remember(&self, sha256: &str, component: &Component) {
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
        if let Some(dir) = &self.cache_dir {
            if let Err(error) = trim_disk_cache(dir, &in_use, self.limits.cache_max_bytes) {
                tracing::warn!(dir = %dir.display(), "could not trim the rule cache: {error:#}");
            }
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

    fn engine_fingerprint(&self) -> String {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        self.engine.precompile_compatibility_hash().hash(&mut hasher);
        format!("{:016x}", hasher.finish())
    }

    /// A fresh instance of `rule`, configured with `params`, under the setup limits.
    pub fn instantiate(&self, rule: &CompiledRule, params: &[(String, String)]) -> Result<RuleInstance> {
        let output = CapturedOutput::default();
        let host = RuleHost {
            wasi: capability_free_wasi(&output),
            table: ResourceTable::new(),
            limiter: MemoryLimiter { cap: self.limits.memory_bytes, held: 0 },
            output: output.clone(),
        };
        let mut store = Store::new(&self.engine, host);
        store.limiter(|host| &mut host.limiter);
        store.epoch_deadline_trap();
        store.set_fuel(self.limits.setup_fuel).map_err(anyhow::Error::from)?;
        store.set_epoch_deadline(deadline_ticks(self.limits.setup_deadline));
        let fault = |e| with_output(describe_fault(e, Phase::Setup, &self.limits), &output);
        let bindings = rule.pre.instantiate(&mut store).map_err(fault).context("instantiation failed")?;
        let configured = bindings.ebb_rules_decisions().call_configure(&mut store, params).map_err(fault).context("configure failed")?;
        if let Err(message) = configured {
            bail!("the rule rejected its parameters: {message}");
        }
        Ok(RuleInstance {
            store,
            bindings,
            call_fuel: self.limits.call_fuel,
            call_ticks: deadline_ticks(self.limits.call_deadline),
            limits: self.limits.clone(),
        })
    }
}

/// A poisoned lock only means a panic elsewhere: the data under it is still consistent here.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn file_name(path: &Path) -> String {
    path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned())
}

/// Reads a rule file: `None` if nothing is there, an error with the real reason if
/// something is there but cannot be read (a directory, a dangling or looping link, no
/// permission, too large, or anything else that is not a regular file: a FIFO, a device,
/// a socket, or a link to one).
///
/// Never blocks and never reads more than `max_bytes + 1` bytes: the file is opened with
/// `O_NONBLOCK` (opening a FIFO would otherwise wait for a writer), checked again with
/// `fstat` on the opened handle (the path may have been replaced since it was looked at),
/// and read through a bound (a device's reported size says nothing of what it yields).
pub(crate) fn read_rule_file(path: &Path, max_bytes: u64) -> Result<Option<Vec<u8>>> {
    use std::io::Read as _;
    use std::os::unix::fs::OpenOptionsExt as _;

    let shown = path.display();
    let link = match std::fs::symlink_metadata(path) {
        Ok(link) => link,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => bail!("cannot read rule file {shown}: {e}"),
    };
    let target = || std::fs::read_link(path).map(|t| t.display().to_string()).unwrap_or_default();
    let meta = match std::fs::metadata(path) {
        Ok(meta) => meta,
        Err(e) if link.file_type().is_symlink() && e.kind() == std::io::ErrorKind::NotFound => {
            bail!("rule file {shown} is a symbolic link to {}, which does not exist", target())
        }
        Err(e) => bail!("cannot read rule file {shown}: {e}"),
    };
    if meta.is_dir() {
        bail!("rule file {shown} is a directory, not a file");
    }
    let not_regular = |meta: &std::fs::Metadata| -> Option<String> {
        let kind = file_kind(meta)?;
        Some(if link.file_type().is_symlink() {
            format!("rule file {shown} is a symbolic link to {}, which is {kind}, not a regular file", target())
        } else {
            format!("rule file {shown} is {kind}, not a regular file")
        })
    };
    if let Some(reason) = not_regular(&meta) {
        bail!("{reason}");
    }
    if meta.len() > max_bytes {
        bail!("rule {} is {} bytes, over the limit of {max_bytes} bytes", file_name(path), meta.len());
    }
    let file = match std::fs::File::options().read(true).custom_flags(libc::O_NONBLOCK).open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => bail!("cannot read rule file {shown}: {e}"),
    };
    // The path may name something else by now: what counts is what was opened.
    let opened = file.metadata().with_context(|| format!("cannot read rule file {shown}"))?;
    if let Some(reason) = not_regular(&opened) {
        bail!("{reason}");
    }
    let mut bytes = Vec::with_capacity(opened.len().min(max_bytes) as usize);
    file.take(max_bytes.saturating_add(1)).read_to_end(&mut bytes).with_context(|| format!("cannot read rule file {shown}"))?;
    if bytes.len() as u64 > max_bytes {
        bail!("rule {} is over the limit of {max_bytes} bytes", file_name(path));
    }
    Ok(Some(bytes))
}

/// What `meta` describes, in words, when it is not a regular file.
fn file_kind(meta: &std::fs::Metadata) -> Option<&'static str> {
    use std::os::unix::fs::FileTypeExt as _;
    let kind = meta.file_type();
    Some(if kind.is_file() {
        return None;
    } else if kind.is_dir() {
        "a directory"
    } else if kind.is_fifo() {
        "a FIFO (named pipe)"
    } else if kind.is_char_device() {
        "a character device"
    } else if kind.is_block_device() {
        "a block device"
    } else if kind.is_socket() {
        "a socket"
    } else {
        "not a file"
    })
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
    unused.sort_by(|a, b| b.0.cmp(&a.0));
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

/// A live, configured rule instance. Not shared: callers hold it behind a lock.
pub struct RuleInstance {
    store: Store<RuleHost>,
    bindings: ScalingRule,
    call_fuel: u64,
    call_ticks: u64,
    limits: RuleLimits,
}

impl RuleInstance {
    fn arm(&mut self) -> Result<()> {
        self.store.set_fuel(self.call_fuel).map_err(anyhow::Error::from)?;
        self.store.set_epoch_deadline(self.call_ticks);
        Ok(())
    }

    /// `optimal-dequeue-task-count`, raw (unclamped). Any error means the instance is unusable.
    pub fn optimal_dequeue_task_count(&mut self, state: &ebb_rules_sdk::QueueState) -> Result<u32> {
        self.arm()?;
        let state = state.into();
        self.bindings
            .ebb_rules_decisions()
            .call_optimal_dequeue_task_count(&mut self.store, &state)
            .map_err(|e| with_output(describe_fault(e, Phase::Call, &self.limits), &self.store.data().output))
    }

    /// `on-queue-empty`, raw (unclamped). Any error means the instance is unusable.
    pub fn on_queue_empty(&mut self, ctx: &ebb_rules_sdk::IdleContext) -> Result<ebb_rules_sdk::IdleDecision> {
        self.arm()?;
        let ctx = ctx.into();
        self.bindings
            .ebb_rules_decisions()
            .call_on_queue_empty(&mut self.store, &ctx)
            .map(Into::into)
            .map_err(|e| with_output(describe_fault(e, Phase::Call, &self.limits), &self.store.data().output))
    }

    /// What the rule wrote to stdout/stderr since the last look.
    pub(crate) fn output(&self) -> &CapturedOutput {
        &self.store.data().output
    }

    /// Bytes of linear memory the instance holds (for reports).
    pub fn memory_bytes(&self) -> usize {
        self.store.data().limiter.held
    }
}

fn capability_free_wasi(output: &CapturedOutput) -> WasiCtx {
    // No preopens, env, args or sockets: the builder grants nothing unless asked.
    wasmtime_wasi::WasiCtxBuilder::new().stdout(output.clone()).stderr(output.clone()).build()
}

fn deadline_ticks(deadline: Duration) -> u64 {
    // +1: the current tick may be almost over when the call starts.
    (deadline.as_micros() / EPOCH_TICK.as_micros()).max(1) as u64 + 1
}

fn spawn_epoch_ticker(engine: Engine, stop: Arc<AtomicBool>) -> Result<()> {
    std::thread::Builder::new()
        .name("ebb-rule-epoch".into())
        .spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(EPOCH_TICK);
                engine.increment_epoch();
            }
        })
        .context("failed to start the rule deadline ticker")?;
    Ok(())
}

fn check_contract_version(exports: &[String]) -> Result<()> {
    let wanted = format!("{CONTRACT_INTERFACE}@{CONTRACT_VERSION}");
    if exports.iter().any(|e| *e == wanted) {
        return Ok(());
    }
    if let Some(other) = exports.iter().find(|e| e.starts_with(&format!("{CONTRACT_INTERFACE}@"))) {
        bail!("it exports {other}, but this host speaks {wanted}");
    }
    let listed = if exports.is_empty() { "nothing".to_string() } else { exports.join(", ") };
    bail!("it does not export {wanted} (it exports {listed}); build it for the ebb:rules/scaling-rule world")
}

/// Checks each decision function's type, so that a mismatch names the function.
fn check_signatures(engine: &Engine, ty: &wasmtime::component::types::Component) -> Result<()> {
    use wasmtime::component::types::ComponentItem;
    let interface = format!("{CONTRACT_INTERFACE}@{CONTRACT_VERSION}");
    let Some(ComponentItem::ComponentInstance(decisions)) = ty.get_export(engine, &interface).map(|e| e.ty) else {
        bail!("its export {interface} is not an instance");
    };
    let cx = ty.instance_type();
    for name in ["configure", "optimal-dequeue-task-count", "on-queue-empty"] {
        let Some(ComponentItem::ComponentFunc(func)) = decisions.get_export(engine, name).map(|e| e.ty) else {
            bail!("its export {interface} lacks the function {name}");
        };
        let checked = match name {
            "configure" => func.typecheck::<(Vec<(String, String)>,), (Result<(), String>,)>(&cx),
            "optimal-dequeue-task-count" => func.typecheck::<(wit::QueueState,), (u32,)>(&cx),
            _ => func.typecheck::<(wit::IdleContext,), (wit::IdleDecision,)>(&cx),
        };
        checked.map_err(anyhow::Error::from).with_context(|| format!("its function {name} does not have the contract's type"))?;
    }
    Ok(())
}

/// Turns a wasmtime error into one whose message is the reason, in words, naming the
/// limit of the phase that applied. The wasm backtrace goes to the DEBUG log, not the message.
pub(crate) fn describe_fault(error: wasmtime::Error, phase: Phase, limits: &RuleLimits) -> anyhow::Error {
    let error = anyhow::Error::from(error);
    let (deadline, fuel, which) = match phase {
        Phase::Setup => (limits.setup_deadline, limits.setup_fuel, "setup (instantiation and configure)"),
        Phase::Call => (limits.call_deadline, limits.call_fuel, "call"),
    };
    let reason = match error.downcast_ref::<Trap>() {
        Some(Trap::Interrupt) => format!("ran past its {which} deadline of {deadline:?}"),
        Some(Trap::OutOfFuel) => format!("ran out of its {which} fuel ({fuel} units)"),
        Some(Trap::StackOverflow) => format!("overflowed its stack ({} bytes)", limits.stack_bytes),
        Some(trap) => format!("trapped: {trap}"),
        None => match error.downcast_ref::<wasmtime_wasi::I32Exit>() {
            Some(exit) => format!("called exit({}), which rules may not do", exit.0),
            None => match error.chain().map(|e| e.to_string()).find(|m| m.starts_with("memory limit")) {
                Some(memory) => memory,
                None => error.root_cause().to_string(),
            },
        },
    };
    tracing::debug!(%reason, details = %format!("{error:#}"), "rule fault details");
    anyhow::anyhow!(reason)
}

/// Adds what the rule wrote just before it faulted (a panic message, a traceback) to `error`.
fn with_output(error: anyhow::Error, output: &CapturedOutput) -> anyhow::Error {
    match output.last_words() {
        Some(words) => anyhow::anyhow!("{error:#}; the rule wrote: {words}"),
        None => error,
    }
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

fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

/// Gives memory freed by the allocator back to the system. Compiling a large rule (a 25 MB
/// component) allocates hundreds of MB of temporary buffers, and glibc keeps freed heap
/// memory (its mmap threshold grows after large frees), so without this the resident size
/// stays at the compile's peak and grows with each swap of a new rule version.
/// The size of a compiled component's image in memory.
fn image_bytes(component: &Component) -> usize {
    let range = component.image_range();
    (range.end as usize).saturating_sub(range.start as usize)
}

/// [`release_free_memory`] when `freed` bytes are worth it: trimming walks the allocator's
/// heaps (milliseconds), so small rules, swapped often, skip it.
pub(crate) fn release_free_memory_after(freed: usize) {
    if freed >= TRIM_AFTER_BYTES {
        release_free_memory();
    }
}

/// Largest compiled rule read from the cache (a compiled Python rule is ~100 MB).
const MAX_CACHED_BYTES: u64 = 1 << 30;

/// Below this, memory freed by a rule's compile, load or eviction is left to the allocator.
const TRIM_AFTER_BYTES: usize = 4 << 20;

fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory; it takes the allocator's own locks.
    unsafe {
        libc::malloc_trim(0);
    }
}

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
