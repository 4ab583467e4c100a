//! Write [ebb](https://github.com/) scaling rules in Rust.
//!
//! A rule is a type that implements [`ScalingRule`]; [`export_rule!`] turns it into a
//! WebAssembly component that the ebb host loads from its rules folder. Every method has a
//! default, the whitepaper's own rule, so a rule overrides only the decision it changes:
//!
//! ```
//! use ebb_rules_sdk::{export_rule, QueueState, ScalingRule};
//!
//! /// Twice the paper's task count when handlers are slow.
//! #[derive(Default)]
//! struct SlowHandlerRule;
//!
//! impl ScalingRule for SlowHandlerRule {
//!     fn optimal_dequeue_task_count(&self, state: &QueueState) -> u32 {
//!         let tasks = ebb_rules_sdk::paper::optimal_dequeue_task_count(state);
//!         if state.mean_handler_latency_ms > 500.0 { tasks * 2 } else { tasks }
//!     }
//! }
//!
//! export_rule!(SlowHandlerRule);
//! ```
//!
//! The component speaks the contract `ebb:rules/decisions@0.2.0` (`wit/ebb-rules-0.2.0`).
//! Its [`QueueState`] carries what a rule needs to decide without costing storage calls:
//! [`QueueState::last_get_messages`] against [`QueueState::batch_size`] (a short get emptied
//! the queue), [`QueueState::arrivals_per_sec`], [`QueueState::oldest_message_age_ms`] and
//! [`QueueState::depth_source`]. A rule built with an older SDK (contract 0.1.0) keeps
//! loading in a newer host; rebuilt with this one, it compiles unchanged (the new fields are
//! only read by rules that want them, and default in `QueueState { .., ..Default::default() }`).
//!
//! Build it with `cargo build --release --target wasm32-wasip2` (crate type `cdylib`), then
//! check it with `ebb rule check target/wasm32-wasip2/release/<name>.wasm` and copy the file
//! into the host's rules folder: the host swaps it in while it runs.
//!
//! Rule logic is plain Rust and testable natively: call your methods with a
//! [`QueueState`] or [`IdleContext`] in an ordinary `#[test]`.
#![deny(missing_docs)]

pub mod backoff;
mod model;
pub mod paper;
pub mod params;
pub mod thresholds;

#[cfg(feature = "guest")]
mod guest;

pub use model::{DepthSource, HandlerState, IdleContext, IdleDecision, QueueState};
pub use params::{Params, ParamsExt};

#[cfg(feature = "guest")]
#[doc(hidden)]
pub use guest::bindings;
#[cfg(feature = "guest")]
pub use wit_bindgen;

/// The two decisions of a scaling rule, and its configuration step.
///
/// Each method defaults to the whitepaper's rule (see [`paper`]). The host keeps one
/// instance of the rule per queue: [`ScalingRule::configure`] runs once on a fresh
/// [`Default`] value, then the decisions run as often as the listener needs them.
pub trait ScalingRule: Default + 'static {
    /// Receives the queue's `rule_params` from the host configuration.
    ///
    /// Return `Err` with a message naming the parameter to reject them; the host shows it to
    /// the operator and keeps the previous rule. The default accepts no parameters at all,
    /// so a typo in the config file is an error rather than silently ignored.
    fn configure(&mut self, params: &Params) -> Result<(), String> {
        params.reader().finish()
    }

    /// `GetOptimalDequeueTaskCount`: how many dequeue tasks the queue should run now.
    /// The host clamps the answer to the queue's `[min_tasks, max_tasks]`.
    fn optimal_dequeue_task_count(&self, state: &QueueState) -> u32 {
        paper::optimal_dequeue_task_count(state)
    }

    /// `QueueEmpty`: how long a task that found the queue empty sleeps, and whether it stops.
    /// The host clamps the delay to the queue's polling interval range.
    fn on_queue_empty(&self, ctx: &IdleContext) -> IdleDecision {
        paper::on_queue_empty(ctx)
    }
}
