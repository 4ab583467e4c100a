//! The component side: bindings for `ebb:rules/scaling-rule` and `ebb:rules/failure-aware-rule`
//! (both of `wit/ebb-rules-0.4.0`) and the export macro.

/// Bindings of the `scaling-rule` world (used by [`crate::export_rule!`]).
#[allow(missing_docs)]
pub mod bindings {
    wit_bindgen::generate!({
        path: "../wit/ebb-rules-0.4.0",
        world: "ebb:rules/scaling-rule@0.4.0",
        pub_export_macro: true,
        export_macro_name: "__export_scaling_rule",
        default_bindings_module: "ebb_rules_sdk::bindings",
    });
}

/// The conversions of the `decisions` records, the same in both worlds' bindings.
macro_rules! decisions_conversions {
    ($wit:path) => {
        const _: () = {
            use $wit as wit;

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
        };
    };
}

decisions_conversions!(bindings::exports::ebb::rules::decisions);
#[cfg(feature = "failures")]
decisions_conversions!(ebb_rules_failure_bindings::exports::ebb::rules::decisions);

#[cfg(feature = "failures")]
use ebb_rules_failure_bindings::exports::ebb::rules::failures as fwit;

#[cfg(feature = "failures")]
impl From<fwit::FailureContext> for crate::FailureContext {
    fn from(c: fwit::FailureContext) -> Self {
        crate::FailureContext {
            queue: c.queue,
            dequeue_count: c.dequeue_count,
            max_dequeue_count: c.max_dequeue_count,
            error_class: match c.error_class {
                fwit::ErrorClass::Timeout => crate::ErrorClass::Timeout,
                fwit::ErrorClass::Connect => crate::ErrorClass::Connect,
                fwit::ErrorClass::HttpStatus => crate::ErrorClass::HttpStatus,
                fwit::ErrorClass::Panic => crate::ErrorClass::Panic,
                fwit::ErrorClass::Other => crate::ErrorClass::Other,
            },
            http_status: c.http_status,
            error: c.error,
            item: c.item,
            elapsed_ms: c.elapsed_ms,
            handler_latency_ms: c.handler_latency_ms,
            default_retry_delay_ms: c.default_retry_delay_ms,
            max_retry_delay_ms: c.max_retry_delay_ms,
            timestamp_ms: c.timestamp_ms,
            random: c.random,
        }
    }
}

#[cfg(feature = "failures")]
impl From<crate::FailureDecision> for fwit::FailureDecision {
    fn from(d: crate::FailureDecision) -> Self {
        match d {
            crate::FailureDecision::Retry(delay_ms) => fwit::FailureDecision::Retry(delay_ms),
            crate::FailureDecision::Poison(reason) => fwit::FailureDecision::Poison(reason),
            crate::FailureDecision::Default => fwit::FailureDecision::Default,
        }
    }
}

/// Exports a [`ScalingRule`](crate::ScalingRule) implementation as the rule of this component.
///
/// Use it once per crate, at the top level, on a type that implements
/// [`ScalingRule`](crate::ScalingRule) (and so [`Default`]): `export_rule!(MyRule);` builds
/// the `scaling-rule` world (the rule decides no failure: the host keeps its
/// `max_dequeue_count` handling). `export_rule!(MyRule, failures);` builds the
/// `failure-aware-rule` world, for a type that also implements
/// [`FailureRule`](crate::FailureRule): the host then asks it what happens to each failed
/// message. The crate must be a `cdylib` built for `wasm32-wasip2`.
#[macro_export]
macro_rules! export_rule {
    ($rule:ty) => {
        const _: () = {
            $crate::__export_rule_decisions!($rule, bindings);
    $crate::bindings::__export_scaling_rule!(EbbRuleExport with_types_in $crate::bindings);
        };
    };
    ($rule:ty, failures) => {
        const _: () = {
            $crate::__export_rule_decisions!($rule, failure_bindings);

            impl $crate::failure_bindings::exports::ebb::rules::failures::Guest for EbbRuleExport {
                fn on_handler_failure(
                    ctx: $crate::failure_bindings::exports::ebb::rules::failures::FailureContext,
                ) -> $crate::failure_bindings::exports::ebb::rules::failures::FailureDecision {
                    let ctx: $crate::FailureContext = ctx.into();
                    EBB_RULE.with(|rule| $crate::FailureRule::on_handler_failure(&*rule.borrow(), &ctx)).into()
                }
            }

    $crate::failure_bindings::__export_failure_aware_rule!(EbbRuleExport with_types_in $crate::failure_bindings);
        };
    };
    ($rule:ty, $other:ident) => {
        ::core::compile_error!(concat!("export_rule!: unknown option `", stringify!($other), "`; the only option is `failures`"));
    };
}

/// The rule's instance and its `decisions`, in the bindings `$module` of its world, for
/// [`export_rule!`].
#[doc(hidden)]
#[macro_export]
macro_rules! __export_rule_decisions {
    ($rule:ty, $module:ident) => {
        ::std::thread_local! {
            static EBB_RULE: ::std::cell::RefCell<$rule> =
                ::std::cell::RefCell::new(<$rule as ::core::default::Default>::default());
        }

        struct EbbRuleExport;

        impl $crate::$module::exports::ebb::rules::decisions::Guest for EbbRuleExport {
            fn configure(params: ::std::vec::Vec<(::std::string::String, ::std::string::String)>) -> ::core::result::Result<(), ::std::string::String> {
                EBB_RULE.with(|rule| $crate::ScalingRule::configure(&mut *rule.borrow_mut(), &params))
            }

            fn optimal_dequeue_task_count(state: $crate::$module::exports::ebb::rules::decisions::QueueState) -> u32 {
                let state: $crate::QueueState = state.into();
                EBB_RULE.with(|rule| $crate::ScalingRule::optimal_dequeue_task_count(&*rule.borrow(), &state))
            }

            fn on_queue_empty(
                ctx: $crate::$module::exports::ebb::rules::decisions::IdleContext,
            ) -> $crate::$module::exports::ebb::rules::decisions::IdleDecision {
                let ctx: $crate::IdleContext = ctx.into();
                EBB_RULE.with(|rule| $crate::ScalingRule::on_queue_empty(&*rule.borrow(), &ctx)).into()
            }

            fn max_concurrent_calls(state: $crate::$module::exports::ebb::rules::decisions::HandlerState) -> ::core::option::Option<u32> {
                let state: $crate::HandlerState = state.into();
                EBB_RULE.with(|rule| $crate::ScalingRule::max_concurrent_calls(&*rule.borrow(), &state))
            }
        }
    };
}
