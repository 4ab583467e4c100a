//! The component side: bindings for `ebb:rules/scaling-rule` and the export macro.

/// Bindings generated from `wit/ebb-rules-0.3.0` (used by [`crate::export_rule!`]).
#[allow(missing_docs)]
pub mod bindings {
    wit_bindgen::generate!({
        path: "../wit/ebb-rules-0.3.0",
        world: "ebb:rules/scaling-rule@0.3.0",
        pub_export_macro: true,
        export_macro_name: "__export_scaling_rule",
        default_bindings_module: "ebb_rules_sdk::bindings",
    });
}

use bindings::exports::ebb::rules::decisions as wit;

impl From<wit::QueueState> for crate::QueueState {
    fn from(s: wit::QueueState) -> Self {
        crate::QueueState {
            queue: s.queue,
            approximate_depth: s.approximate_depth,
            in_flight: s.in_flight,
            active_tasks: s.active_tasks,
            min_tasks: s.min_tasks,
            max_tasks: s.max_tasks,
            throughput_per_sec: s.throughput_per_sec,
            mean_handler_latency_ms: s.mean_handler_latency_ms,
            recent_failures: s.recent_failures,
            push_enabled: s.push_enabled,
            timestamp_ms: s.timestamp_ms,
            random: s.random,
            last_get_messages: s.last_get_messages,
            batch_size: s.batch_size,
            arrivals_per_sec: s.arrivals_per_sec,
            oldest_message_age_ms: s.oldest_message_age_ms,
            depth_source: match s.depth_source {
                wit::DepthSource::Measured => crate::DepthSource::Measured,
                wit::DepthSource::Inferred => crate::DepthSource::Inferred,
            },
        }
    }
}

impl From<wit::IdleContext> for crate::IdleContext {
    fn from(c: wit::IdleContext) -> Self {
        crate::IdleContext {
            queue: c.queue,
            idle_count: c.idle_count,
            active_tasks: c.active_tasks,
            min_interval_ms: c.min_interval_ms,
            max_interval_ms: c.max_interval_ms,
            push_enabled: c.push_enabled,
            timestamp_ms: c.timestamp_ms,
            random: c.random,
        }
    }
}

impl From<wit::HandlerState> for crate::HandlerState {
    fn from(s: wit::HandlerState) -> Self {
        crate::HandlerState {
            queue: s.queue,
            current_limit: s.current_limit,
            max_limit: s.max_limit,
            in_flight: s.in_flight,
            peak_in_flight: s.peak_in_flight,
            waiting_tasks: s.waiting_tasks,
            window_ms: s.window_ms,
            completed: s.completed,
            failed: s.failed,
            pushed_back: s.pushed_back,
            latency_mean_ms: s.latency_mean_ms,
            latency_min_ms: s.latency_min_ms,
            latency_max_ms: s.latency_max_ms,
            timestamp_ms: s.timestamp_ms,
            random: s.random,
        }
    }
}

impl From<crate::IdleDecision> for wit::IdleDecision {
    fn from(d: crate::IdleDecision) -> Self {
        wit::IdleDecision { delay_ms: d.delay_ms, stop: d.stop }
    }
}

/// Exports a [`ScalingRule`](crate::ScalingRule) implementation as the rule of this component.
///
/// Use it once per crate, at the top level, on a type that implements
/// [`ScalingRule`](crate::ScalingRule) (and so [`Default`]): `export_rule!(MyRule);`.
/// The crate must be a `cdylib` built for `wasm32-wasip2`.
#[macro_export]
macro_rules! export_rule {
    ($rule:ty) => {
        const _: () = {
            ::std::thread_local! {
                static EBB_RULE: ::std::cell::RefCell<$rule> =
                    ::std::cell::RefCell::new(<$rule as ::core::default::Default>::default());
            }

            struct EbbRuleExport;

            impl $crate::bindings::exports::ebb::rules::decisions::Guest for EbbRuleExport {
                fn configure(params: ::std::vec::Vec<(::std::string::String, ::std::string::String)>) -> ::core::result::Result<(), ::std::string::String> {
                    EBB_RULE.with(|rule| $crate::ScalingRule::configure(&mut *rule.borrow_mut(), &params))
                }

                fn optimal_dequeue_task_count(state: $crate::bindings::exports::ebb::rules::decisions::QueueState) -> u32 {
                    let state: $crate::QueueState = state.into();
                    EBB_RULE.with(|rule| $crate::ScalingRule::optimal_dequeue_task_count(&*rule.borrow(), &state))
                }

                fn on_queue_empty(
                    ctx: $crate::bindings::exports::ebb::rules::decisions::IdleContext,
                ) -> $crate::bindings::exports::ebb::rules::decisions::IdleDecision {
                    let ctx: $crate::IdleContext = ctx.into();
                    EBB_RULE.with(|rule| $crate::ScalingRule::on_queue_empty(&*rule.borrow(), &ctx)).into()
                }

                fn max_concurrent_calls(state: $crate::bindings::exports::ebb::rules::decisions::HandlerState) -> ::core::option::Option<u32> {
                    let state: $crate::HandlerState = state.into();
                    EBB_RULE.with(|rule| $crate::ScalingRule::max_concurrent_calls(&*rule.borrow(), &state))
                }
            }

    $crate::bindings::__export_scaling_rule!(EbbRuleExport with_types_in $crate::bindings);
        };
    };
}
