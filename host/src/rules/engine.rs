//! One wasmtime engine for the process: compiling (with a sha256-keyed cache), validating
//! and instantiating rule components under limits.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
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
    /// Consecutive faulty calls after which a rule is quarantined until its file changes.
    pub quarantine_after: u32,
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

/// The process-wide rule engine.
pub struct RuleEngine {
    engine: Engine,
    linker: Linker<RuleHost>,
    limits: RuleLimits,
    cache_dir: Option<PathBuf>,
    compiled: Mutex<HashMap<String, Component>>,
    ticker_stop: Arc<AtomicBool>,
}

impl Drop for RuleEngine {
    fn drop(&mut self) {
        self.ticker_stop.store(true, Ordering::Relaxed);
    }
}

impl RuleEngine {
    /// An engine with these limits. `cache_dir`, if given, keeps compiled rules by sha256
    /// so that a restart or a re-deploy of a known rule skips compilation.
    pub fn new(limits: RuleLimits, cache_dir: Option<PathBuf>) -> Result<Arc<Self>> {
        let mut config = Config::new();
        config
            .wasm_component_model(true)
            .epoch_interruption(true)
            .consume_fuel(true)
            .max_wasm_stack(limits.stack_bytes);
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
        Ok(Arc::new(RuleEngine { engine, linker, limits, cache_dir, compiled: Mutex::default(), ticker_stop }))
    }

    /// The limits every rule runs under.
    pub fn limits(&self) -> &RuleLimits {
        &self.limits
    }

    /// Reads, compiles and validates the rule at `path`. Fails, naming the file and the
    /// reason, on anything that is not a loadable `ebb:rules` component.
    pub fn load_file(&self, path: &Path) -> Result<Arc<CompiledRule>> {
        let name = path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned());
        let size = std::fs::metadata(path).with_context(|| format!("failed to read rule {}", path.display()))?.len();
        if size > self.limits.max_file_bytes {
            bail!("rule {name} is {size} bytes, over the limit of {} bytes", self.limits.max_file_bytes);
        }
        let bytes = std::fs::read(path).with_context(|| format!("failed to read rule {}", path.display()))?;
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
        let instance_pre = self.linker.instantiate_pre(&component).map_err(anyhow::Error::from).context("its imports cannot be satisfied (a rule gets no capabilities)")?;
        let pre = ScalingRulePre::new(instance_pre).map_err(anyhow::Error::from).context("its exports do not match the ebb:rules/scaling-rule world")?;
        Ok(Arc::new(CompiledRule {
            name: name.to_string(),
            sha256,
            size: bytes.len() as u64,
            compile_time,
            from_cache,
            loaded_at: SystemTime::now(),
            imports,
            exports,
            pre,
        }))
    }

    fn compile(&self, sha256: &str, bytes: &[u8]) -> Result<(Component, bool)> {
        if let Some(component) = self.compiled.lock().unwrap().get(sha256) {
            return Ok((component.clone(), true));
        }
        let cached_file = self.cache_dir.as_ref().map(|dir| dir.join(format!("{sha256}-{}.cwasm", self.engine_fingerprint())));
        if let Some(file) = cached_file.as_ref().filter(|f| f.exists()) {
            // SAFETY: the cache holds only artifacts this engine configuration serialised
            // (the file name carries the engine fingerprint) keyed by the source's sha256.
            match unsafe { Component::deserialize_file(&self.engine, file) } {
                Ok(component) => {
                    self.compiled.lock().unwrap().insert(sha256.to_string(), component.clone());
                    return Ok((component, true));
                }
                Err(e) => tracing::warn!(file = %file.display(), "ignoring unreadable cached rule: {e:#}"),
            }
        }
        let component = Component::new(&self.engine, bytes).map_err(anyhow::Error::from).context("it is not a valid component")?;
        if let Some(file) = cached_file {
            if let Err(e) = write_atomically(&file, &component.serialize().map_err(anyhow::Error::from)?) {
                tracing::warn!(file = %file.display(), "could not cache compiled rule: {e:#}");
            }
        }
        self.compiled.lock().unwrap().insert(sha256.to_string(), component.clone());
        Ok((component, false))
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
            output,
        };
        let mut store = Store::new(&self.engine, host);
        store.limiter(|host| &mut host.limiter);
        store.epoch_deadline_trap();
        store.set_fuel(self.limits.setup_fuel).map_err(anyhow::Error::from)?;
        store.set_epoch_deadline(deadline_ticks(self.limits.setup_deadline));
        let bindings = rule.pre.instantiate(&mut store).map_err(|e| describe_fault(e, &self.limits)).context("instantiation failed")?;
        let configured = bindings
            .ebb_rules_decisions()
            .call_configure(&mut store, params)
            .map_err(|e| describe_fault(e, &self.limits))
            .context("configure failed")?;
        if let Err(message) = configured {
            bail!("the rule rejected its parameters: {message}");
        }
        Ok(RuleInstance { store, bindings, call_fuel: self.limits.call_fuel, call_ticks: deadline_ticks(self.limits.call_deadline), limits: self.limits.clone() })
    }
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
            .map_err(|e| describe_fault(e, &self.limits))
    }

    /// `on-queue-empty`, raw (unclamped). Any error means the instance is unusable.
    pub fn on_queue_empty(&mut self, ctx: &ebb_rules_sdk::IdleContext) -> Result<ebb_rules_sdk::IdleDecision> {
        self.arm()?;
        let ctx = ctx.into();
        self.bindings
            .ebb_rules_decisions()
            .call_on_queue_empty(&mut self.store, &ctx)
            .map(Into::into)
            .map_err(|e| describe_fault(e, &self.limits))
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

/// Turns a wasmtime error into one that says which limit was hit, in words.
fn describe_fault(error: wasmtime::Error, limits: &RuleLimits) -> anyhow::Error {
    let error = anyhow::Error::from(error);
    let reason = match error.downcast_ref::<Trap>() {
        Some(Trap::Interrupt) => format!("ran past its deadline of {:?}", limits.call_deadline),
        Some(Trap::OutOfFuel) => format!("ran out of fuel ({} units)", limits.call_fuel),
        Some(Trap::StackOverflow) => format!("overflowed its stack ({} bytes)", limits.stack_bytes),
        Some(trap) => format!("trapped: {trap}"),
        None => match error.downcast_ref::<wasmtime_wasi::I32Exit>() {
            Some(exit) => format!("called exit({}), which rules may not do", exit.0),
            None => return error,
        },
    };
    error.context(reason)
}

fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}
