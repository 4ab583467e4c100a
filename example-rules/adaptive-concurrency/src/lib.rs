//! Adaptive concurrency: the paper's task count and idle back-off, and a handler concurrency
//! limit that follows the app's knee, the most calls at once before its latency climbs.
//!
//! The limit is an AIMD controller steered by latency, in the style of TCP congestion
//! control and Netflix's concurrency-limits (Vegas, Gradient2): see [`controller`] for the
//! algorithm. Each window (about 250 ms) it compares the window's slowest call's latency with
//! a baseline, the lowest windowed latency it has seen, and
//!
//! - grows the limit when the limit was reached (the window's peak of calls at once reached
//!   it), latency stayed within `tolerance` of the baseline and the calls started under the
//!   limit have had time to end: doubling at first (slow start), then by one call (or 1/32 of
//!   the limit) a window;
//! - cuts it when latency rose past `tolerance` × the baseline (to the calls at once when the
//!   slowest call started × the square root of baseline ÷ latency, at most `backoff` × those),
//!   when the app pushed back (HTTP 429 or 503), or when more than `failure_percent` of the
//!   window's calls failed (to `backoff` × the limit); then holds it for `settle` windows
//!   (doubled, up to 16 ×, each time a cut lands where the one before did);
//! - holds it when no call ended in the window, or when calls never reached the limit.
//!
//! It never goes below 1; the host bounds it by the queue's `max_concurrent_calls`.
//!
//! | parameter | meaning | default |
//! |---|---|---|
//! | `initial` | calls at once when a queue starts (while the host's limit is still its ceiling), from 1 | 1 |
//! | `tolerance` | how far latency may rise over the baseline before the limit is cut, a ratio over 1 | 1.2 |
//! | `backoff` | the least cut, as the share of the limit kept, over 0 and under 1 | 0.9 |
//! | `settle` | windows a cut limit is held before it grows again, 0 to 1000 | 8 |
//! | `failure_percent` | share of a window's calls that may fail before the limit is cut, 0 to 100 | 10 |
//!
//! **State.** The host keeps one instance of the rule and reuses it between calls, so the
//! controller remembers its limit and baseline in a `RefCell` (one controller per queue, as
//! queues with the same rule file and parameters share an instance). A reload of the rule,
//! or a fault in any of its calls, builds a fresh instance: its controller restarts from the
//! limit in force, [`HandlerState::current_limit`] (or from `initial` while that is still the
//! ceiling), and learns the baseline again.

pub mod controller;

use std::cell::RefCell;
use std::collections::BTreeMap;

use controller::{Controller, Settings};
use ebb_rules_sdk::params::ParamsExt;
use ebb_rules_sdk::{HandlerState, Params, ScalingRule, export_rule};

/// The rule: its settings, and one controller per queue it decides for.
#[derive(Default)]
pub struct AdaptiveConcurrency {
    settings: Settings,
    controllers: RefCell<BTreeMap<String, Controller>>,
}

impl ScalingRule for AdaptiveConcurrency {
    fn configure(&mut self, params: &Params) -> Result<(), String> {
        let mut reader = params.reader();
        let defaults = Settings::default();
        let settings = Settings {
            initial: reader.get_or("initial", defaults.initial)?,
            tolerance: reader.get_or("tolerance", defaults.tolerance)?,
            backoff: reader.get_or("backoff", defaults.backoff)?,
            settle: reader.get_or("settle", defaults.settle)?,
            failure_percent: reader.get_or("failure_percent", defaults.failure_percent)?,
        };
        reader.finish()?;
        self.settings = settings.validated()?;
        Ok(())
    }

    // The task count and the idle back-off are the paper's (the SDK's defaults).

    fn max_concurrent_calls(&self, state: &HandlerState) -> Option<u32> {
        let mut controllers = self.controllers.borrow_mut();
        let controller = controllers.entry(state.queue.clone()).or_insert_with(|| Controller::new(&self.settings, state));
        Some(controller.decide(&self.settings, state))
    }
}

export_rule!(AdaptiveConcurrency);

#[cfg(test)]
mod model;

#[cfg(test)]
mod tests {
    use super::*;

    fn configured(pairs: &[(&str, &str)]) -> Result<AdaptiveConcurrency, String> {
        let params: Vec<(String, String)> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let mut rule = AdaptiveConcurrency::default();
        rule.configure(&params).map(|()| rule)
    }

    #[test]
    fn bad_parameters_are_rejected_naming_the_key() {
        let cases = [
            ("initial", "0"),
            ("initial", "-1"),
            ("initial", "many"),
            ("tolerance", "1"),
            ("tolerance", "0.5"),
            ("tolerance", "NaN"),
            ("tolerance", "inf"),
            ("backoff", "0"),
            ("backoff", "1"),
            ("backoff", "1.5"),
            ("backoff", "NaN"),
            ("settle", "1001"),
            ("settle", "-3"),
            ("failure_percent", "101"),
            ("failure_percent", "-1"),
            ("failure_percent", "NaN"),
        ];
        for (key, value) in cases {
            let error = configured(&[(key, value)]).err().unwrap_or_else(|| panic!("{key} = {value:?} was accepted"));
            assert!(error.contains(&format!("\"{key}\"")), "{key} = {value:?}: {error}");
        }
        let error = configured(&[("tolerence", "1.5")]).err().expect("a misspelt parameter is rejected");
        assert!(error.contains("tolerence"), "{error}");
    }

    #[test]
    fn good_parameters_are_taken() -> Result<(), String> {
        let rule = configured(&[("initial", "4"), ("tolerance", "1.5"), ("backoff", "0.5"), ("settle", "0"), ("failure_percent", "0")])?;
        assert_eq!(rule.settings, Settings { initial: 4, tolerance: 1.5, backoff: 0.5, settle: 0, failure_percent: 0.0 });
        assert_eq!(configured(&[])?.settings, Settings::default());
        Ok(())
    }

    #[test]
    fn each_queue_has_a_controller_of_its_own() -> Result<(), String> {
        let rule = configured(&[("initial", "2")])?;
        let window = |queue: &str, limit| HandlerState {
            queue: queue.into(),
            current_limit: limit,
            max_limit: 64,
            peak_in_flight: limit,
            in_flight: limit,
            waiting_tasks: 3,
            window_ms: 250,
            completed: limit * 5,
            latency_mean_ms: 50.0,
            latency_min_ms: 50.0,
            latency_max_ms: 50.0,
            ..Default::default()
        };
        // Queue a starts and grows; queue b, sharing the instance, starts from its own state.
        assert_eq!(rule.max_concurrent_calls(&window("a", 64)), Some(2));
        assert_eq!(rule.max_concurrent_calls(&window("a", 2)), Some(4));
        assert_eq!(rule.max_concurrent_calls(&window("b", 64)), Some(2));
        assert_eq!(rule.max_concurrent_calls(&window("a", 4)), Some(8));
        Ok(())
    }

    #[test]
    fn the_task_count_and_idle_back_off_are_the_papers() {
        use ebb_rules_sdk::{IdleContext, QueueState, paper};
        let rule = AdaptiveConcurrency::default();
        let state = QueueState { approximate_depth: 5_000, min_tasks: 1, max_tasks: 100, ..Default::default() };
        assert_eq!(rule.optimal_dequeue_task_count(&state), paper::optimal_dequeue_task_count(&state));
        let ctx = IdleContext { idle_count: 3, min_interval_ms: 100, max_interval_ms: 60_000, random: 7, ..Default::default() };
        assert_eq!(rule.on_queue_empty(&ctx), paper::on_queue_empty(&ctx));
    }
}
