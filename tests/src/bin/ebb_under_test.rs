//! The `ebb` binary, built inside this package so end-to-end tests can run it
//! (`CARGO_BIN_EXE_*` exists only for a test's own package). Same code as `host/src/main.rs`,
//! except that `bench …` runs the benchmarks in this process (`ebb` runs the `ebb-bench`
//! binary instead), so the tests build no second binary.

fn main() -> std::process::ExitCode {
    if std::env::args_os().nth(1).is_some_and(|first| first == "bench") {
        return ebb_bench::main(&["bench"]);
    }
    ebb::run_command_line()
}
