fn main() -> std::process::ExitCode {
    ebb::cli::main(ebb::cli::Cli::from_env())
}
