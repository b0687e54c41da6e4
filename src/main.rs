//! The `tessera` binary: parse the command line and hand over to a role.

use clap::Parser;

fn main() -> std::process::ExitCode {
    let args = tessera::cli::Args::parse();
    match tessera::cli::run(args) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            // Print the whole chain once, where it is handled (a cause that its
            // error's message already contains is not repeated).
            let err: &(dyn std::error::Error + 'static) = err.as_ref();
            eprintln!("tessera: {}", tessera_runtime::error_chain(err));
            std::process::ExitCode::FAILURE
        }
    }
}
