//! Speaks ebb:rules@0.9.0, a version no host serves yet: loading must fail naming it and
//! the versions the host speaks.
wit_bindgen::generate!({
    inline: r#"
        package ebb:rules@0.9.0;
        interface decisions {
            record queue-state { queue: string, approximate-depth: u64, in-flight: u32, active-tasks: u32, min-tasks: u32, max-tasks: u32, throughput-per-sec: f64, mean-handler-latency-ms: f64, recent-failures: u32, push-enabled: bool, timestamp-ms: u64, random: u64 }
            record idle-context { queue: string, idle-count: u32, active-tasks: u32, min-interval-ms: u64, max-interval-ms: u64, push-enabled: bool, timestamp-ms: u64, random: u64 }
            record idle-decision { delay-ms: u64, stop: bool }
            configure: func(params: list<tuple<string, string>>) -> result<_, string>;
            optimal-dequeue-task-count: func(state: queue-state) -> u32;
            on-queue-empty: func(ctx: idle-context) -> idle-decision;
        }
        world scaling-rule { export decisions; }
    "#,
});

use exports::ebb::rules::decisions::*;

struct Rule;

impl Guest for Rule {
    fn configure(_: Vec<(String, String)>) -> Result<(), String> {
        Ok(())
    }
    fn optimal_dequeue_task_count(_: QueueState) -> u32 {
        1
    }
    fn on_queue_empty(_: IdleContext) -> IdleDecision {
        IdleDecision { delay_ms: 1, stop: false }
    }
}

export!(Rule);
