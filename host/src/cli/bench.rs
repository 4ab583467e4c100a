//! `ebb bench …`: the benchmarks are a binary of their own, `ebb-bench` (host/bench), kept out
//! of the shipped library; `ebb bench` runs it, as git and cargo run their subcommands.

use std::ffi::OsString;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};

/// The benchmarks' binary.
const BENCH_BINARY: &str = "ebb-bench";

/// Replaces this process with `ebb-bench args…`, found next to this executable or on `PATH`;
/// returns only with an error, which says how to get it when it is not found.
pub(super) fn run(args: Vec<OsString>) -> anyhow::Result<()> {
    let beside = std::env::current_exe().ok().and_then(|exe| exe.parent().map(Path::to_path_buf));
    let Some(binary) = find(beside.as_deref(), std::env::var_os("PATH")) else {
        anyhow::bail!(
            "ebb bench: the benchmarks are a binary of their own, {BENCH_BINARY}, found neither next to ebb nor on PATH: run `cargo run --release -p ebb-bench -- {}` in a checkout of ebb",
            args.iter().map(|a| a.to_string_lossy()).collect::<Vec<_>>().join(" ")
        );
    };
    let error = std::process::Command::new(&binary).args(args).exec();
    Err(anyhow::Error::from(error).context(format!("failed to run {}", binary.display())))
}

/// `ebb-bench` in `beside` (the folder of the running `ebb`), else in the first folder of
/// `path` that has it.
fn find(beside: Option<&Path>, path: Option<OsString>) -> Option<PathBuf> {
    let on_path = path.map(|p| std::env::split_paths(&p).collect::<Vec<_>>()).unwrap_or_default();
    beside.into_iter().map(Path::to_path_buf).chain(on_path).map(|dir| dir.join(BENCH_BINARY)).find(|candidate| candidate.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ebb_bench_is_found_next_to_ebb_first_then_on_path() -> anyhow::Result<()> {
        let (beside, on_path) = (tempfile::tempdir()?, tempfile::tempdir()?);
        let path = std::env::join_paths([on_path.path()])?;
        assert_eq!(find(Some(beside.path()), Some(path.clone())), None, "in neither");
        std::fs::write(on_path.path().join(BENCH_BINARY), "")?;
        assert_eq!(find(Some(beside.path()), Some(path.clone())), Some(on_path.path().join(BENCH_BINARY)));
        std::fs::write(beside.path().join(BENCH_BINARY), "")?;
        assert_eq!(find(Some(beside.path()), Some(path)), Some(beside.path().join(BENCH_BINARY)), "next to ebb wins");
        Ok(())
    }
}
