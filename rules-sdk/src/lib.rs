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
//! The component speaks the contract `ebb:rules/decisions@0.4.0` (`wit/ebb-rules-0.4.0`).
//! Its [`QueueState`] carries what a rule needs to decide without costing storage calls:
//! [`QueueState::last_get_messages`] against [`QueueState::batch_size`] (a short get emptied
//! the queue), [`QueueState::arrivals_per_sec`], [`QueueState::oldest_message_age_ms`] and
//! [`QueueState::depth_source`] (since 0.2.0).
//!
//! Since 0.3.0 a rule may also decide how many handler calls run at once:
//! [`ScalingRule::max_concurrent_calls`] is asked about every 250 ms while the queue has
//! handler calls, with a [`HandlerState`] of the window that ended (the limit in force, the
//! peak of calls running, tasks waiting for a slot, completions, failures, push-backs,
//! latencies). Its default, `None`, keeps the queue's configured `max_concurrent_calls`; the
//! host clamps a value to `[1, max_limit]`. The host reuses one instance of the rule between
//! calls, so a rule may remember what it saw in a `Cell` or `RefCell` field (the decisions
//! take `&self`); a reload, or a fault of any decision, starts a fresh instance from
//! [`Default`] and `configure`. `example-rules/adaptive-concurrency` is such a rule.
//!
//! Since 0.4.0 a rule may also decide what happens to a message whose handler failed:
//! enable the SDK's `failures` feature, implement [`FailureRule`] and export with
//! `export_rule!(MyRule, failures)`, which builds
//! the `failure-aware-rule` world (the `scaling-rule` world plus the `failures` interface).
//! The host tells the two worlds apart by the component's exports; a rule exported with
//! plain `export_rule!(MyRule)` is never asked, and its queue keeps `max_dequeue_count`:
//!
//! ```ignore
//! // (needs the `failures` feature)
//! use ebb_rules_sdk::{export_rule, ErrorClass, FailureContext, FailureDecision, FailureRule, ScalingRule};
//!
//! /// A 422 will never succeed: poison it at once; everything else as the host would.
//! #[derive(Default)]
//! struct NoRetryOnInvalid;
//!
//! impl ScalingRule for NoRetryOnInvalid {}
//!
//! impl FailureRule for NoRetryOnInvalid {
//!     fn on_handler_failure(&self, ctx: &FailureContext) -> FailureDecision {
//!         match (ctx.error_class, ctx.http_status) {
//!             (ErrorClass::HttpStatus, Some(422)) => FailureDecision::Poison("unprocessable: not retried".into()),
//!             _ => FailureDecision::Default,
//!         }
//!     }
//! }
//!
//! export_rule!(NoRetryOnInvalid, failures);
//! ```
//!
//! A rule built with an older SDK (contract 0.2.0 or 0.1.0) keeps loading in a newer host
//! (its queues keep their configured concurrency); rebuilt with this one, it compiles
//! unchanged (the new decision has a default, and new fields are only read by rules that
//! want them, defaulting in `QueueState { .., ..Default::default() }`).
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

pub use model::{DepthSource, ErrorClass, FailureContext, FailureDecision, HandlerState, IdleContext, IdleDecision, MAX_FAILURE_TEXT_BYTES, QueueState};
pub use params::{Params, ParamsExt};

#[cfg(feature = "failures")]
#[doc(hidden)]
pub use ebb_rules_failure_bindings as failure_bindings;
#[cfg(feature = "guest")]
#[doc(hidden)]
pub use guest::bindings;
#[cfg(feature = "guest")]
pub use wit_bindgen;

/// The decisions of a scaling rule, and its configuration step.
///
/// The two decisions of the whitepaper default to its rule (see [`paper`]); the concurrency
/// decision defaults to none (the configured bound). The host keeps one instance of the rule
/// per queue (per rule file and parameters): [`ScalingRule::configure`] runs once on a fresh
/// [`Default`] value, then the decisions run as often as the listener needs them, on that
/// same value until the rule is reloaded or faults.
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

    /// How many handler calls the queue may run at once from now on, from what the window
    /// that just ended showed (asked about every 250 ms while the queue has handler calls).
    ///
    /// `None` (the default) keeps the queue's configured `max_concurrent_calls`; the host
    /// clamps a value to `[1, state.max_limit]`. A rule that adapts the limit keeps what it
    /// learnt in `Cell`/`RefCell` fields: the instance lives on between calls, and a fresh
    /// one (after a reload or any fault) starts from [`Default`] and `configure` again, where
    /// [`HandlerState::current_limit`] tells it the limit in force. (Since contract 0.3.0.)
    fn max_concurrent_calls(&self, state: &HandlerState) -> Option<u32> {
        let _ = state;
        None
    }
}

/// The failure decision of a rule built for the `failure-aware-rule` world (contract 0.4.0),
/// exported with `export_rule!(MyRule, failures)`.
///
/// The host asks it once per failed delivery (of a message, or of an item of an envelope),
/// on the same instance as the [`ScalingRule`] decisions and under the same limits. Pushed-back
/// calls (HTTP 429, 503) and calls the host could not make are not failures of the message
/// and never reach it. A fault (a panic, a deadline, fuel) makes the host decide by default
/// and counts towards the rule's quarantine.
pub trait FailureRule: ScalingRule {
    /// What happens to the message: [`FailureDecision::Retry`] after a delay (clamped to
    /// `[0, max_retry_delay_ms]`), [`FailureDecision::Poison`] now with a reason, or
    /// [`FailureDecision::Default`] (the default): the host's own `max_dequeue_count`
    /// handling, with [`FailureContext::default_retry_delay_ms`].
    fn on_handler_failure(&self, ctx: &FailureContext) -> FailureDecision {
        let _ = ctx;
        FailureDecision::Default
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A rule written before contract 0.3.0: it overrides nothing about concurrency.
    #[derive(Default)]
    struct OnlyTasks;

    impl ScalingRule for OnlyTasks {
        fn optimal_dequeue_task_count(&self, _state: &QueueState) -> u32 {
            3
        }
    }

    #[test]
    fn a_rule_that_does_not_decide_concurrency_keeps_the_configured_bound() {
        let state = HandlerState { current_limit: 8, max_limit: 32, peak_in_flight: 8, waiting_tasks: 4, completed: 40, ..Default::default() };
        assert_eq!(OnlyTasks.max_concurrent_calls(&state), None);
        assert_eq!(OnlyTasks.optimal_dequeue_task_count(&QueueState::default()), 3);
    }
}
