//! Property-based fuzzing of the parsers of outside input that the library's public API
//! reaches: the config file, the trace CSV of `ebb simulate --trace`, and the payload
//! envelope. (The bus trigger JSON and API requests are fuzzed inside the library, in
//! `bus::fuzz` and `http::fuzz`: their parsers are private.)
//!
//! Each target draws structured-but-hostile inputs (and plain arbitrary ones) with proptest
//! and checks that nothing panics and that every refusal says what is wrong. A test binary
//! of its own, not a module of `tests/all`: the envelope's fuzzer counts allocations with a
//! global allocator. A normal `cargo test` runs a short budget per target;
//! `EBB_FUZZ_CASES=<n>` runs `n` inputs per target (see "Fuzzing" in docs/benchmarks.md):
//!
//! ```text
//! EBB_FUZZ_CASES=1000000 cargo test -p ebb-tests --release --test fuzz
//! ```

mod config;
mod envelope;
mod trace;

use proptest::test_runner::Config;

/// Environment variable: inputs per target, instead of each target's short default.
const CASES_ENV: &str = "EBB_FUZZ_CASES";

/// The runner's settings for a target whose short budget is `default_cases`: no regression
/// files written into the tree (a failure found is kept as a named test instead), and
/// shrinking bounded so a failure in a long run is reported within minutes.
fn budget(default_cases: u32) -> Config {
    let cases = std::env::var(CASES_ENV).ok().and_then(|v| v.trim().parse().ok()).unwrap_or(default_cases);
    Config { cases, failure_persistence: None, max_shrink_iters: 10_000, ..Config::default() }
}
