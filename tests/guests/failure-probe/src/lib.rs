//! A failure-aware rule (contract 0.4.0) whose `on-handler-failure` does what its `mode`
//! parameter says: `retry` after `delay_ms`, `poison` with the reason `probe says no`,
//! `default`, `trap` (panics) or `loop` (never returns); with `trap_item` = N, it panics on
//! item N of an envelope whatever the mode. Its scaling decisions are the paper's.
use ebb_rules_sdk::{FailureContext, FailureDecision, FailureRule, Params, ParamsExt, ScalingRule, export_rule};

#[derive(Default)]
struct Probe {
    mode: String,
    delay_ms: u64,
    trap_item: Option<u32>,
}

impl ScalingRule for Probe {
    fn configure(&mut self, params: &Params) -> Result<(), String> {
        let mut reader = params.reader();
        self.mode = reader.raw("mode").unwrap_or("default").to_string();
        self.delay_ms = reader.get_or("delay_ms", 0)?;
        self.trap_item = reader.get("trap_item")?;
        reader.finish()
    }
}

impl FailureRule for Probe {
    fn on_handler_failure(&self, ctx: &FailureContext) -> FailureDecision {
        if ctx.item.is_some() && ctx.item == self.trap_item {
            panic!("probe traps on item {}", ctx.item.unwrap_or_default());
        }
        match self.mode.as_str() {
            "retry" => FailureDecision::Retry(self.delay_ms),
            "poison" => FailureDecision::Poison("probe says no".into()),
            "trap" => panic!("probe traps on failure {}", ctx.dequeue_count),
            "loop" => {
                let mut n = ctx.random;
                loop {
                    n = std::hint::black_box(n.wrapping_mul(6364136223846793005).wrapping_add(1));
                }
            }
            _ => FailureDecision::Default,
        }
    }
}

export_rule!(Probe, failures);
