//! The `ringcast` command-line tool.

#![forbid(unsafe_code)]

mod args;
mod bench_cmd;
mod bootstrap_cmd;
mod demo_cmd;
mod local;
mod net;
mod sim_cmd;
mod units;

use clap::Parser;
use std::io::{ErrorKind, Write};
use std::process::ExitCode;

/// Why a command stopped early.
pub(crate) enum CmdError {
    /// Bad flags or a failed run: printed, exit status 2.
    Msg(String),
    /// A collective failed or delivered wrong bytes: printed, exit status 1.
    Run(String),
    /// Writing the output failed (a closed pipe is a quiet, successful exit).
    Output(std::io::Error),
}

impl From<String> for CmdError {
    fn from(s: String) -> Self {
        CmdError::Msg(s)
    }
}

impl From<&str> for CmdError {
    fn from(s: &str) -> Self {
        CmdError::Msg(s.to_owned())
    }
}

/// Prints the library's `tracing` events to stderr when `RUST_LOG` asks for them (the library
/// installs no subscriber; the tool does, and only then: a run without `RUST_LOG` prints nothing
/// more than before).
fn init_tracing() {
    let Ok(filter) = tracing_subscriber::EnvFilter::try_from_default_env() else {
        return;
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .try_init();
}

fn main() -> ExitCode {
    init_tracing();
    let cli = args::Cli::parse();
    let result = match cli.command {
        args::Command::Sim(args::SimCommand::Bcast(a)) => sim_cmd::bcast(&a),
        args::Command::Sim(args::SimCommand::Allgather(a)) => sim_cmd::allgather(&a),
        args::Command::Bootstrap(a) => bootstrap_cmd::run(&a),
        args::Command::Demo(a) => demo_cmd::run(&a),
        args::Command::Bench(a) => bench_cmd::run(&a),
    };
    let (message, code) = match result {
        Ok(code) => return code,
        // `ringcast ... | head`: the reader has all it wanted.
        Err(CmdError::Output(e)) if e.kind() == ErrorKind::BrokenPipe => return ExitCode::SUCCESS,
        Err(CmdError::Output(e)) => (format!("writing the output: {e}"), 2),
        Err(CmdError::Msg(m)) => (m, 2),
        Err(CmdError::Run(m)) => (m, 1),
    };
    // Not eprintln!: it panics when stderr is closed too.
    let _ = writeln!(std::io::stderr(), "ringcast: error: {message}");
    ExitCode::from(code)
}
