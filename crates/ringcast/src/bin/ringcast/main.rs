//! The `ringcast` command-line tool.

#![forbid(unsafe_code)]

mod args;
mod sim_cmd;
mod units;

use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = args::Cli::parse();
    let result = match cli.command {
        args::Command::Sim(args::SimCommand::Bcast(a)) => sim_cmd::bcast(&a),
        args::Command::Sim(args::SimCommand::Allgather(a)) => sim_cmd::allgather(&a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            #[allow(clippy::print_stderr)]
            {
                eprintln!("ringcast: error: {e}");
            }
            ExitCode::from(2)
        }
    }
}
