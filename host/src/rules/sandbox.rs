//! What a rule can reach: WASI with no capability (no files, sockets, environment or
//! arguments), its output captured, and its linear memory capped.

use wasmtime::ResourceLimiter;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use super::stderr::CapturedOutput;

/// The state each rule `Store` carries: an empty, capability-free WASI context
/// (no preopened dirs, env, args or network), the memory limiter and the captured output.
pub struct RuleHost {
    pub(super) wasi: WasiCtx,
    pub(super) table: ResourceTable,
    pub(super) limiter: MemoryLimiter,
    pub(crate) output: CapturedOutput,
}

/// Caps an instance's linear memory and remembers how much it holds.
pub(super) struct MemoryLimiter {
    pub(super) cap: usize,
    pub(super) held: usize,
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

pub(super) fn capability_free_wasi(output: &CapturedOutput) -> WasiCtx {
    // No preopens, env, args or sockets: the builder grants nothing unless asked.
    wasmtime_wasi::WasiCtxBuilder::new().stdout(output.clone()).stderr(output.clone()).build()
}
