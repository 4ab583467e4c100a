//! A rule's fault, in words: which limit it hit, and what it wrote just before.

use wasmtime::Trap;

use super::limits::RuleLimits;
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
/// limit of the phase that applied. The wasm backtrace goes to the DEBUG log, not the message.
pub(crate) fn describe_fault(error: wasmtime::Error, phase: Phase, limits: &RuleLimits) -> anyhow::Error {
    let error = anyhow::Error::from(error);
    let (deadline, fuel, which) = match phase {
        Phase::Setup => (limits.setup_deadline, limits.setup_fuel, "setup (instantiation and configure)"),
        Phase::Call => (limits.call_deadline, limits.call_fuel, "call"),
    };
    let reason = match error.downcast_ref::<Trap>() {
        Some(Trap::Interrupt) => format!("ran past its {which} deadline of {deadline:?}"),
        Some(Trap::OutOfFuel) => format!("ran out of its {which} fuel ({fuel} units)"),
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

/// Adds what the rule wrote just before it faulted (a panic message, a traceback) to `error`.
pub(super) fn with_output(error: anyhow::Error, output: &CapturedOutput) -> anyhow::Error {
    match output.last_words() {
        Some(words) => anyhow::anyhow!("{error:#}; the rule wrote: {words}"),
        None => error,
    }
}
