fn main() -> std::process::ExitCode {
    ebb::run_command_line()
}
