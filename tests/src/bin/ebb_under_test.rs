//! The `ebb` binary, built inside this package so end-to-end tests can run it
//! (`CARGO_BIN_EXE_*` exists only for a test's own package). Same code as `host/src/main.rs`,
//! except that `bench …` runs the benchmarks in this process (`ebb` runs the `ebb-bench`
//! binary instead), so the tests build no second binary, and that a test can make it panic.

/// A file path: once a file is there, a thread of the binary panics (the process lives on),
/// so that the tests see how a panic is logged; no input of ebb's own is known to cause one.
const PANIC_WHEN: &str = "EBB_UNDER_TEST_PANIC_WHEN";

fn main() -> std::process::ExitCode {
    if let Some(path) = std::env::var_os(PANIC_WHEN) {
        panic_when_there(path.into());
    }
    if std::env::args_os().nth(1).is_some_and(|first| first == "bench") {
        return ebb_bench::main(&["bench"]);
    }
    ebb::run_command_line()
}

/// Panics on a thread named `provoked-panic` once `path` exists.
fn panic_when_there(path: std::path::PathBuf) {
    let watch = move || {
        while !path.exists() {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        panic!("provoked by the test");
    };
    std::thread::Builder::new().name("provoked-panic".into()).spawn(watch).expect("a thread to provoke a panic");
}
