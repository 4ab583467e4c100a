//! Scaling rules: WebAssembly components that decide how many dequeue tasks a queue runs
//! and what a task does when the queue is empty, with the paper's rule built in.
//!
//! [`RuleEngine`] compiles and runs components under limits; [`RuleSet`] keeps one
//! configured instance per queue, falls back to the built-in rule when a rule faults,
//! clamps every decision to the queue's bounds, and swaps rules in when their files change
//! ([`RuleSet::watch`]). Calls are synchronous and may block for up to the call deadline:
//! from async code, call them through `tokio::task::spawn_blocking`.

mod bindings;
mod decider;
mod engine;
mod set;
mod stderr;
mod watcher;

pub use bindings::{CONTRACT_INTERFACE, CONTRACT_VERSION};
pub use decider::{BuiltInRule, Decider};
pub use engine::{CompiledRule, RuleEngine, RuleInstance, RuleLimits};
pub use set::{
    Decision, DecisionSource, NativeRule, QueueRuleConfig, QueueRules, RuleSet, RuleStatus, built_in_queue_empty, built_in_task_count, native_queue_empty,
    native_task_count,
};
pub use watcher::{MAX_DEBOUNCE_DELAY, RuleWatcher};

pub use ebb_rules_sdk::{IdleContext, IdleDecision, QueueState};
