//! `ocular-analyze`: the command line over the `ocular_analyze` library (see `cli.rs`).

use std::process::ExitCode;

fn main() -> ExitCode {
    ocular_analyze::progress::enable();
    ExitCode::from(ocular_analyze::cli::run_from(std::env::args_os()) as u8)
}
