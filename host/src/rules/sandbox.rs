//! What a rule can reach: WASI with no capability (no files, sockets, environment or
//! arguments), clocks that stand still and a random source that replays, its output
//! captured, and its linear memory capped.

use std::convert::Infallible;
use std::time::Duration;

use rand_core::TryRng;
use wasmtime::ResourceLimiter;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::clocks::{HostMonotonicClock, HostWallClock};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use super::limits::Stopwatch;
use super::stderr::CapturedOutput;

/// The state each rule `Store` carries: an empty, capability-free WASI context
/// (no preopened dirs, env, args or network), the memory limiter, the captured output and
/// the time the current call has used.
pub struct RuleHost {
    pub(super) wasi: WasiCtx,
    pub(super) table: ResourceTable,
    pub(super) limiter: MemoryLimiter,
    pub(crate) output: CapturedOutput,
    /// Restarted by each call (and by the setup); read by the epoch deadline's callback.
    pub(super) stopwatch: Stopwatch,
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
    // No preopens, env, args or sockets: the builder grants nothing unless asked. Clocks and
    // random sources it grants by default, so they are replaced.
    wasmtime_wasi::WasiCtxBuilder::new()
        .stdout(output.clone())
        .stderr(output.clone())
        .wall_clock(FixedClock)
        .monotonic_clock(FixedClock)
        .secure_random(FixedRandom(RULE_RANDOM_SEED))
        .insecure_random(FixedRandom(RULE_RANDOM_SEED))
        .insecure_random_seed(u128::from(RULE_RANDOM_SEED))
        .build()
}

/// What a rule reads from `wasi:clocks/wall-clock`: always the Unix epoch. Rules are pure
/// decisions and simulations must replay: the time comes in each call's `timestamp-ms`.
pub(crate) const RULE_WALL_CLOCK: Duration = Duration::ZERO;
/// What a rule reads from `wasi:clocks/monotonic-clock`: always 0 (ns).
pub(crate) const RULE_MONOTONIC_CLOCK_NS: u64 = 0;
/// The seed of the one sequence every rule instance reads from `wasi:random` (both the
/// secure and the insecure generator, and `insecure-seed`): the same bytes in every
/// instance, so runs replay. Randomness a rule should use comes in each call's `random`.
pub(crate) const RULE_RANDOM_SEED: u64 = 0x6562_622d_7275_6c65; // "ebb-rule"

/// A clock that never moves.
struct FixedClock;

impl HostWallClock for FixedClock {
    fn resolution(&self) -> Duration {
        Duration::from_nanos(1)
    }

    fn now(&self) -> Duration {
        RULE_WALL_CLOCK
    }
}

impl HostMonotonicClock for FixedClock {
    fn resolution(&self) -> u64 {
        1
    }

    fn now(&self) -> u64 {
        RULE_MONOTONIC_CLOCK_NS
    }
}

/// A deterministic generator (SplitMix64): the same sequence from the same seed. Not for
/// secrets, which a rule has no use for.
struct FixedRandom(u64);

impl FixedRandom {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

impl TryRng for FixedRandom {
    type Error = Infallible;

    fn try_next_u32(&mut self) -> Result<u32, Infallible> {
        Ok(self.next() as u32)
    }

    fn try_next_u64(&mut self) -> Result<u64, Infallible> {
        Ok(self.next())
    }

    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Infallible> {
        for chunk in dst.chunks_mut(8) {
            chunk.copy_from_slice(&self.next().to_le_bytes()[..chunk.len()]);
        }
        Ok(())
    }
}
