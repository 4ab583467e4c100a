//! Scaling rules: WebAssembly components that decide how many dequeue tasks a queue runs,
//! what a task does when the queue is empty (the paper's rule is built in) and, since
//! contract 0.3.0, how many handler calls run at once (without a rule: the configured bound)
//! and, since 0.4.0 and for rules that export the optional `failures` interface, what
//! happens to a message whose handler failed (without: `max_dequeue_count`).
//!
//! Calls are synchronous and may block for up to the call deadline: from async code, call
//! them through `tokio::task::spawn_blocking`. The files, along the way a rule goes:
//!
//! - `file`: reading a rule file (regular files only, bounded, never blocking);
//! - `engine`: the process-wide [`RuleEngine`], compiling and validating a component into a
//!   [`CompiledRule`]; `bindings` serves each contract version (0.3.0, and 0.2.0 and
//!   0.1.0 for rules built before it); `contract` tells a component's version and checks it against
//!   it; `cache` keeps compiled components in memory and on disk; `memory` gives freed
//!   memory back;
//! - `limits`: [`RuleLimits`]; `sandbox`: what a rule can reach (no capability, a fixed
//!   clock and random source, a memory cap); `instance`: a live, configured
//!   [`RuleInstance`] and its calls; `fault`: a fault, in words; `hint`: what to do about one;
//! - `decision`: a [`Decision`], its [`DecisionSource`], the clamp, the built-in rule and
//!   [`NativeRule`]s;
//! - `queue_rules`: one queue's [`QueueRules`] and the group sharing its instance (fallback,
//!   rebuild, quarantine); `set`: the [`RuleSet`] of every queue, loading and swapping
//!   rules; `shadow`: a queue's shadow rule, asked beside the live one and never applied
//!   ([`Shadowed`]); `watcher`: hot reload from the rules folder; `threads`: the set's threads,
//!   counted and joined when it stops; `stderr`: a rule's output, logged.

mod bindings;
mod cache;
mod contract;
mod decider;
mod decision;
mod engine;
mod fault;
mod file;
mod hint;
mod instance;
mod limits;
mod memory;
mod queue_rules;
mod sandbox;
mod set;
mod shadow;
mod stderr;
mod threads;
mod ticker;
mod watcher;

pub(crate) use bindings::CONTRACT_VERSION;
pub use bindings::ContractVersion;
pub use decider::{BuiltInRule, Decider};
pub use decision::{Decision, DecisionSource, NativeRule, native_failure};
pub(crate) use decision::{built_in_queue_empty, built_in_task_count, clamp_failure, native_concurrency, native_queue_empty, native_task_count};
pub(crate) use decision::{clamp_concurrency, clamp_idle, clamp_task_count, cut};
pub(crate) use engine::CompiledRule;
pub use engine::RuleEngine;

pub(crate) use file::read_rule_file;
pub(crate) use hint::HINT_PREFIX;
pub use instance::RuleInstance;
pub use limits::RuleLimits;
pub use queue_rules::{ConsecutiveFaults, Export, Quarantine, QueueRules, RefusedFile, RuleLoad, RuleState, RuleStatus, RuleSwap};
pub use set::{QueueRuleConfig, RuleSet};
pub(crate) use shadow::ShadowOutcome;
pub use shadow::{DecisionKind, Disagreement, SHADOW_CHANNEL_CAPACITY, ShadowCounts, ShadowStatus, Shadowed};

pub use watcher::{MAX_DEBOUNCE_DELAY, RuleWatcher};

pub use ebb_rules_sdk::{DepthSource, ErrorClass, FailureContext, FailureDecision, HandlerState, IdleContext, IdleDecision, QueueState};

/// A poisoned lock only means a panic elsewhere: the data under it is still consistent here.
pub(crate) fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
