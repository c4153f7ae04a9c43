//! The simulator's randomized campaign (see `ringcast_loopback_sim::soak`), not part of `ci`.
//! Fails if any run ended with a wrong buffer, a hang or a failure no crash explains, and
//! prints their seeds.
//!
//! Run: `cargo run --release -p ringcast-loopback-sim --example soak -- [--runs N] [--first
//! SEED] [--threads T]` (what `cargo xtask soak` does).

// A command-line tool: printing to the terminal is its job.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use ringcast_loopback_sim::soak;
use std::time::Instant;

/// This example's one error: a message.
#[derive(Debug)]
enum StepError {
    Other(String),
}

impl std::fmt::Display for StepError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let StepError::Other(s) = self;
        f.write_str(s)
    }
}

/// Options of the campaign.
struct Opts {
    runs: u64,
    first: u64,
    threads: usize,
}

fn parse(rest: &[String]) -> Result<Opts, String> {
    let mut o = Opts {
        runs: 100_000,
        first: 0,
        threads: 2,
    };
    let mut it = rest.iter();
    while let Some(a) = it.next() {
        let v = it.next().ok_or_else(|| format!("`{a}` needs a value"))?;
        let n: u64 = v
            .parse()
            .map_err(|_| format!("`{a}` wants a number, got `{v}`"))?;
        match a.as_str() {
            "--runs" if n > 0 => o.runs = n,
            "--first" => o.first = n,
            "--threads" if n > 0 => o.threads = n as usize,
            _ => return Err(format!("unknown option or bad value `{a} {v}`")),
        }
    }
    Ok(o)
}

fn run(o: &Opts) -> Result<(), StepError> {
    let t = Instant::now();
    eprintln!(
        "soak: seeds {}..{} on {} threads",
        o.first,
        o.first + o.runs,
        o.threads
    );
    let progress = |done: u64| {
        if done.is_multiple_of(10_000) {
            eprintln!("soak: {done} runs, {:.0}s", t.elapsed().as_secs_f64());
        }
    };
    let s = soak::campaign(o.first, o.runs, o.threads, &progress);
    println!(
        "soak: {} runs in {:.1}s ({} Broadcast, {} Allgather, {} Allgatherv; {} with a crash): \
         {} ok, {} wrong buffers, {} hangs, {} unexplained failures, {} refused configs; \
         {} chunks recovered, max fetch depth {}",
        s.runs,
        t.elapsed().as_secs_f64(),
        s.kinds[0],
        s.kinds[1],
        s.kinds[2],
        s.with_crash,
        s.ok,
        s.wrong_buffers,
        s.hangs,
        s.bad_failures,
        s.invalid,
        s.chunks_fetched,
        s.max_fetch_depth
    );
    if s.clean() {
        Ok(())
    } else {
        Err(StepError::Other(format!(
            "soak found bad runs (seed, verdict): {:?}",
            s.failing_seeds
        )))
    }
}

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = parse(&args)
        .map_err(|e| {
            StepError::Other(format!(
                "{e}\nusage: soak [--runs N] [--first SEED] [--threads T]"
            ))
        })
        .and_then(|o| run(&o));
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("soak: error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
