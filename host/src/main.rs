use clap::Parser;

fn main() -> std::process::ExitCode {
    ebb::cli::main(ebb::cli::Cli::parse())
}
