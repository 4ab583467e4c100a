//! The limits every rule runs under.

use std::time::Duration;

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
    /// Consecutive faulty calls after which a rule is quarantined until its file's content
    /// changes; 0: never (every call is tried, the built-in rule deciding each that faults).
    pub quarantine_after: u32,
    /// Most bytes the on-disk compiled-rule cache may hold. Rules in use are never evicted,
    /// even when they alone exceed it; unused ones go oldest first.
    pub cache_max_bytes: u64,
}

impl RuleLimits {
    /// Whether `faults` consecutive faults quarantine a rule.
    pub fn quarantines_at(&self, faults: u32) -> bool {
        self.quarantine_after > 0 && faults >= self.quarantine_after
    }
}

impl Default for RuleLimits {
    fn default() -> Self {
        RuleLimits {
            call_deadline: crate::defaults::CALL_DEADLINE,
            call_fuel: crate::defaults::CALL_FUEL,
            setup_deadline: Duration::from_secs(2),
            setup_fuel: 2_000_000_000,
            memory_bytes: crate::defaults::MEMORY_MIB << 20,
            stack_bytes: 512 << 10,
            max_file_bytes: 64 << 20,
            quarantine_after: crate::defaults::QUARANTINE_AFTER,
            cache_max_bytes: crate::defaults::CACHE_MIB << 20,
        }
    }
}
