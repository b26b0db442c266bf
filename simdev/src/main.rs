//! The `simdev` binary: everything is in the library ([`simdev::cli::main_with_args`]).

fn main() -> std::process::ExitCode {
    simdev::cli::main_with_args(std::env::args_os())
}
