fn main() -> std::process::ExitCode {
    ebb_bench::main(&[])
}
