//! The `ebb` binary, built inside this package so end-to-end tests can run it
//! (`CARGO_BIN_EXE_*` exists only for a test's own package). Same code as `host/src/main.rs`.

fn main() -> std::process::ExitCode {
    ebb::run_command_line()
}
