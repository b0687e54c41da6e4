//! The `tessera` binary: parse the command line and hand over to a role.

use clap::Parser;

fn main() -> std::process::ExitCode {
    let args = tessera::cli::Args::parse();
    match tessera::cli::run(args) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            // Print the whole chain once, where it is handled.
            eprintln!("tessera: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
