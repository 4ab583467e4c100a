//! A rule's fault, in words: which limit it hit, and what it wrote just before.

use wasmtime::Trap;

use super::limits::{Overrun, RuleLimits};
use super::stderr::CapturedOutput;

/// What a rule is doing when it faults: the limits differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Instantiation and `configure`.
    Setup,
    /// A decision call.
    Call,
}

/// Turns a wasmtime error into one whose message is the reason, in words, naming the
/// limit of the phase that applied (`overrun`: why the deadline's check stopped the rule, if
/// it did). The wasm backtrace goes to the DEBUG log, not the message.
pub(crate) fn describe_fault(error: wasmtime::Error, phase: Phase, limits: &RuleLimits, overrun: Option<Overrun>) -> anyhow::Error {
    let error = anyhow::Error::from(error);
    let (deadline, backstop, fuel, which, key) = match phase {
        Phase::Setup => (limits.setup_deadline, limits.setup_backstop(), limits.setup_fuel, "setup (instantiation and configure)", None),
        Phase::Call => (limits.call_deadline, limits.call_backstop(), limits.call_fuel, "call", Some("rule_limits.call_deadline")),
    };
    let reason = match error.downcast_ref::<Trap>() {
        Some(Trap::Interrupt) => match overrun {
            Some(Overrun::Backstop { wall, cpu }) => format!(
                "was still running {} after it began, past the wall-clock backstop ({backstop:?}) of its {which} deadline of {deadline:?}, \
                 having used only {} of CPU time: it was waiting (a sleep or a blocking call), which a rule must not do",
                show(wall),
                show(cpu)
            ),
            Some(Overrun::Cpu { cpu }) => format!(
                "ran past its {which} deadline of {deadline:?} of CPU time (it used {}): make it do less{}",
                show(cpu),
                key.map_or(String::new(), |key| format!(", or raise {key}"))
            ),
            None => format!("ran past its {which} deadline of {deadline:?}"),
        },
        Some(Trap::OutOfFuel) => format!(
            "ran out of its {which} fuel ({fuel} units){}",
            key.map_or(String::new(), |_| ": make it do less (a loop that never ends?), or raise rule_limits.call_fuel".to_string())
        ),
        Some(Trap::StackOverflow) => format!("overflowed its stack ({} bytes)", limits.stack_bytes),
        Some(trap) => format!("trapped: {trap}"),
        None => match error.downcast_ref::<wasmtime_wasi::I32Exit>() {
            Some(exit) => format!("called exit({}), which rules may not do", exit.0),
            None => match error.chain().map(|e| e.to_string()).find(|m| m.starts_with("memory limit")) {
                Some(memory) => memory,
                None => error.root_cause().to_string(),
            },
        },
    };
    tracing::debug!(%reason, details = %format!("{error:#}"), "rule fault details");
    anyhow::anyhow!(reason)
}

/// A duration to the tenth of a millisecond (`12.3ms`), as a person reads it.
fn show(duration: std::time::Duration) -> String {
    format!("{:.1}ms", duration.as_secs_f64() * 1000.0)
}

/// Adds what the rule wrote just before it faulted (a panic message, a traceback) to `error`.
pub(super) fn with_output(error: anyhow::Error, output: &CapturedOutput) -> anyhow::Error {
    match output.last_words() {
        Some(words) => anyhow::anyhow!("{error:#}; the rule wrote: {words}"),
        None => error,
    }
}
