//! What to do about a rule's error: one place that reads an error's text (toolchains report
//! these as text, not as types: a trap with what the guest wrote, a wasmtime validation
//! message) and adds the next step for the author. `ebb rule check`, `eval`, `test`, `ebb
//! check` and the host's log all show the hint, because it travels in the error itself.

/// The export a fault happened in, when there was one: hints name it.
pub(crate) type Export<'a> = Option<&'a str>;

/// The line a hint starts with, after the error: `error: …\n  hint: …`.
pub(crate) const HINT_PREFIX: &str = "\n  hint: ";

/// The next step for an error whose text (the whole chain, what the rule wrote included) is
/// `text`, raised while loading the rule (`export` is `None`), configuring it
/// (`Some("configure")`) or calling `export`. `None` when nothing better than the error
/// itself can be said.
pub fn hint(text: &str, export: Export<'_>) -> Option<String> {
    let decision = export.unwrap_or("the decision");
    if text.contains("attempted to parse a wasm module with a component parser") {
        return Some(
            "this is a core WebAssembly module, not a component: build Rust for the wasm32-wasip2 target (`cargo build --target wasm32-wasip2 --release`), \
             or make a component of it (componentize-py for Python, componentize-qjs for JavaScript); `ebb rule build` runs the right one"
                .into(),
        );
    }
    if text.contains("but this host speaks") {
        return Some(format!(
            "rebuild the rule against a contract this host serves: Rust with this ebb's rules-sdk (wit/ebb-rules-{}), Python and JavaScript with `ebb rule build` in the rule's folder; or run the ebb that serves its version",
            super::CONTRACT_VERSION
        ));
    }
    if text.contains("lacks the function max-concurrent-calls") {
        return Some(
            "contract 0.3.0 adds max-concurrent-calls (return none to keep the queue's max_concurrent_calls): rebuild with the SDK (`export_rule!` exports it, \
             its default returns none), regenerate the bindings from wit/ebb-rules-0.3.0 and add the function, or build against wit/ebb-rules-0.2.0, which the host still serves"
                .into(),
        );
    }
    if text.contains("lacks the function") {
        return Some(
            "a rule exports every function of its contract: configure, optimal-dequeue-task-count and on-queue-empty, and since 0.3.0 max-concurrent-calls \
             (in Rust, `export_rule!` does; the SDK gives every function but optimal-dequeue-task-count a default)"
                .into(),
        );
    }
    if text.contains("requires the component model async feature") {
        return Some("this JavaScript rule was built without `--sync`: build it with `componentize-qjs --sync`, as `ebb rule build` does".into());
    }
    if text.contains("function '") && text.contains("' not found") {
        return Some(
            "a JavaScript rule exports one object `decisions` whose functions are camelCase: `decisions.optimalDequeueTaskCount`, \
             `decisions.onQueueEmpty`, `decisions.configure` (not the WIT's kebab-case or snake_case names)"
                .into(),
        );
    }
    if text.contains("console is not defined") {
        return Some(format!(
            "{decision} uses `console`, which plain componentize-qjs does not define: build with `ebb rule build`, which provides it (its output reaches the host's log), or remove the console calls"
        ));
    }
    if text.contains("TypeError") && text.contains("float") {
        return Some(format!("{decision} returned a float where the contract wants an integer: return an int (for example `math.ceil(x)` or `round(x)`)"));
    }
    if export == Some("configure") && (text.contains("Traceback") || text.contains("Python function threw an unexpected exception")) {
        return Some(
            "configure raised an exception, which traps: to reject parameters, `raise Err(\"what is wrong and what to write\")` (`from componentize_py_types import Err`), \
             and the host reports your message as a rejection"
                .into(),
        );
    }
    if text.contains("does not have the type of contract") {
        return Some(format!(
            "the function's parameters or result differ from the contract's: regenerate the bindings from wit/ebb-rules-{} (rebuild with the SDK, or `ebb rule build`) rather than writing the signature by hand",
            super::CONTRACT_VERSION
        ));
    }
    if text.contains("memory limit:") {
        return Some(format!(
            "{decision} grew its memory past the host's limit: keep no state that grows with each call (a list of every depth seen), or raise rule_limits.memory_mib"
        ));
    }
    if text.contains("overflowed its stack") {
        return Some(format!("{decision} recursed too deep: make the recursion a loop, or bound its depth (a context value can be 2^64 - 1)"));
    }
    if text.contains("called exit(") {
        return Some(format!("{decision} ended the process: return a decision (or, from configure, an error) instead of calling exit"));
    }
    if text.contains("ran out of its") && text.contains("fuel") || text.contains("ran past its") && text.contains("deadline") {
        // No loop needed: one big-integer power of a context value is enough (Python's
        // `2 ** depth` at a depth of 2^64 - 1 runs out of fuel inside the interpreter).
        return Some(format!(
            "{decision} did not return within the host's limits: look for a loop that does not end (or one bounded by a context value such as a depth of 2^64 - 1), \
             or for one costly step without a loop: an integer power or other big-integer maths on a context value (Python's `2 ** depth` makes a number of up to 2^64 bits); \
             clamp the value first (`min(depth, 64)`)"
        ));
    }
    None
}

/// `error` with its hint (see [`hint`]) appended, if there is one.
pub fn with_hint(error: anyhow::Error, export: Export<'_>) -> anyhow::Error {
    let text = format!("{error:#}");
    if text.contains(HINT_PREFIX) {
        return error;
    }
    // The chain becomes one message: the hint must come after every cause, not before.
    match hint(&text, export) {
        Some(hint) => anyhow::anyhow!("{text}{HINT_PREFIX}{hint}"),
        None => error,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_known_error_gets_its_hint_and_others_none() {
        let cases = [
            ("attempted to parse a wasm module with a component parser", None, "wasm32-wasip2"),
            ("task.cancel requires the component model async feature", None, "--sync"),
            ("trapped; the rule wrote: function 'optimalDequeueTaskCount' not found", Some("optimal-dequeue-task-count"), "decisions.onQueueEmpty"),
            ("the rule wrote: ReferenceError: console is not defined", Some("optimal-dequeue-task-count"), "ebb rule build"),
            ("the rule wrote: TypeError: 'float' object cannot be interpreted as an integer", Some("optimal-dequeue-task-count"), "math.ceil"),
            ("trapped; the rule wrote: Traceback (most recent call last): ValueError", Some("configure"), "raise Err("),
            ("ran out of its call fuel (100 units)", Some("on-queue-empty"), "on-queue-empty did not return"),
            ("it exports ebb:rules/decisions@0.9.0, but this host speaks ebb:rules/decisions@0.4.0", None, "wit/ebb-rules-0.4.0"),
            ("its export ebb:rules/decisions@0.2.0 lacks the function on-queue-empty", None, "export_rule!"),
            ("its export ebb:rules/decisions@0.3.0 lacks the function max-concurrent-calls", None, "rebuild with the SDK"),
            ("its export ebb:rules/decisions@0.3.0 lacks the function max-concurrent-calls", None, "wit/ebb-rules-0.2.0, which the host still serves"),
            ("its function max-concurrent-calls does not have the type of contract 0.3.0", None, "wit/ebb-rules-0.4.0"),
            ("ran out of its call fuel (100 units)", Some("max-concurrent-calls"), "max-concurrent-calls did not return"),
            ("ran out of its call fuel (100 units)", Some("optimal-dequeue-task-count"), "a loop that does not end"),
            ("ran out of its call fuel (100 units)", Some("optimal-dequeue-task-count"), "an integer power or other big-integer maths"),
            ("ran past its call deadline of 50ms", Some("on-queue-empty"), "`2 ** depth`"),
            ("memory limit: the rule asked for 99 bytes of linear memory, the limit is 9 bytes", Some("on-queue-empty"), "on-queue-empty grew its memory"),
            ("overflowed its stack (524288 bytes)", Some("optimal-dequeue-task-count"), "recursed too deep"),
            ("called exit(3), which rules may not do", Some("configure"), "instead of calling exit"),
        ];
        for (text, export, expected) in cases {
            let hint = hint(text, export).unwrap_or_default();
            assert!(hint.contains(expected), "{text}: {hint}");
        }
        assert_eq!(hint("the rule rejected its parameters: per_task", Some("configure")), None);
    }

    #[test]
    fn a_hint_is_added_once_after_the_whole_message() {
        let error = anyhow::anyhow!("attempted to parse a wasm module with a component parser").context("failed to load rule x.wasm");
        let hinted = with_hint(error, None);
        let text = format!("{hinted:#}");
        assert!(text.starts_with("failed to load rule x.wasm: attempted"), "{text}");
        assert!(text.contains("\n  hint: this is a core WebAssembly module"), "{text}");
        assert_eq!(format!("{:#}", with_hint(hinted, None)), text);
    }
}
