//! Scaling rules: WebAssembly components that decide how many dequeue tasks a queue runs
//! and what a task does when the queue is empty, with the paper's rule built in.
//!
//! [`RuleEngine`] compiles and runs components under limits; [`RuleSet`] keeps one
//! configured instance per queue, falls back to the built-in rule when a rule faults,
//! clamps every decision to the queue's bounds, and swaps rules in when their files change
//! ([`RuleSet::watch`]). Calls are synchronous and may block for up to the call deadline:
//! from async code, call them through `tokio::task::spawn_blocking`.

mod bindings;
mod cache;
mod contract;
mod decision;
mod engine;
mod fault;
mod file;
mod instance;
mod limits;
mod memory;
mod sandbox;
mod set;
mod slot;
mod stderr;
mod watcher;

pub use bindings::{CONTRACT_INTERFACE, CONTRACT_VERSION};
pub use decision::{Decision, DecisionSource, NativeRule, built_in_queue_empty, built_in_task_count, native_queue_empty, native_task_count};
pub use engine::{CompiledRule, RuleEngine};
pub use instance::RuleInstance;
pub use limits::RuleLimits;
pub use set::{QueueRuleConfig, RuleSet};
pub use slot::{QueueRules, RuleStatus};
pub use watcher::{MAX_DEBOUNCE_DELAY, RuleWatcher};

pub use ebb_rules_sdk::{IdleContext, IdleDecision, QueueState};

/// A poisoned lock only means a panic elsewhere: the data under it is still consistent here.
pub(crate) fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
