//! The budget of the property fuzzers of the library's private parsers: the bus trigger JSON
//! (`bus::fuzz`) and API requests (`http::fuzz`). The fuzzers of what the public API parses
//! (the config file, the trace CSV, the payload envelope) are a test binary of their own,
//! `tests/fuzz`.
//!
//! A normal `cargo test` runs a short budget per target; `EBB_FUZZ_CASES=<n>` runs `n` inputs
//! per target (see "Fuzzing" in docs/benchmarks.md):
//!
//! ```text
//! EBB_FUZZ_CASES=1000000 cargo test -p ebb --release --lib fuzz
//! ```

use proptest::test_runner::Config;

/// Environment variable: inputs per target, instead of each target's short default.
const CASES_ENV: &str = "EBB_FUZZ_CASES";

/// The runner's settings for a target whose short budget is `default_cases`: no regression
/// files written into the tree (a failure found is kept as a named test instead), and
/// shrinking bounded so a failure in a long run is reported within minutes.
pub(crate) fn budget(default_cases: u32) -> Config {
    let cases = std::env::var(CASES_ENV).ok().and_then(|v| v.trim().parse().ok()).unwrap_or(default_cases);
    Config { cases, failure_persistence: None, max_shrink_iters: 10_000, ..Config::default() }
}
