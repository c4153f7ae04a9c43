//! `cargo xtask`: the workspace's automation (CI, tests, fuzzing), in Rust so that it runs
//! wherever cargo does. See `cargo xtask help`.

// A command-line tool: printing to the terminal is its job.
#![allow(clippy::print_stdout, clippy::print_stderr)]

mod bench_loopback;
mod bench_net;
mod fuzz;
mod miri;
mod netns;
mod netns_lab;
mod run;
mod seed;

use run::{Step, StepError};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

const USAGE: &str = "\
usage: cargo xtask <command> [options]

commands:
  ci                          fmt check, clippy, docs (warnings denied), core dependency check,
                              tests, no_std riscv build, fuzz smoke (10 s/target), Miri on
                              the unsafe buffer code (both skipped, saying why, without nightly)
  test                        cargo test --workspace --features ringcast/cli
  core-deps                   check that ringcast-core depends on nothing but bitvec (no I/O, no runtime)
  long [--cases N]            long campaigns, not in `ci`: the core's property tests with N cases
                              (default 20000), every #[ignore]d long test (e.g. the 1024-rank
                              Allgather) and 20000 operations of each Communicator random mix,
                              in release mode
  fuzz [--time SECS] [TARGET...]
                              run each fuzz target (all if none named) for SECS seconds (default 60);
                              needs a nightly toolchain and cargo-fuzz (installed if missing)
  fuzz-seed                   rewrite the seed corpora under fuzz/corpus/
  miri                        the tests of the unsafe buffer code (the transport's opbuf) under
                              Miri; needs nightly (its miri and rust-src components are added)
  figures [--quick|--full]    regenerate the study's tables and plots in docs/figures/ (quick default)
  netns [--ranks N] [--long] [--only NAME,...]
                              the namespace lab (needs root): N ranks (default 4, at most 8) on an
                              IGMPv3-snooping bridge: correctness, a random mix, a root running
                              ahead, loss, three lanes, hostile traffic, failures, fallback,
                              wire checks, mpirun; removes all it created, even on Ctrl-C;
                              skips with a message where namespaces cannot be created; --long:
                              longer runs (2 000-op random mix, more loss rates, tcp-block
                              at 16 KiB too)
  bench-net [--ranks N] [--sizes B,..] [--iters N] [--warmup N] [--losses PCT,..]
            [--tcp-threshold B] [--quick] [--record]
                              ringcast vs Open MPI over TCP vs the raw multicast ceiling in the
                              namespace lab (needs root, mpicc): Broadcast and Allgather, 64 KiB
                              to 64 MiB, loss-free and at 1% loss, bytes on the bridge per rank;
                              report and SVG plots in target/bench-net/<id>/ (--record: also
                              docs/bench-net/); --tcp-threshold: ringcast's (its default if
                              not given)
  bench-loopback [--rounds N] [--sizes B,..] [--iters N] [--warmup N]
                              issue 7's side by side on loopback, 4 local ranks (needs mpicc):
                              ringcast (as is and all over TCP) vs Open MPI over TCP and
                              shared memory vs the raw multicast ceiling and a Broadcast's
                              one, Broadcast and Allgather,
                              64 KiB to 64 MiB, in interleaved rounds (default 3) with ratios per
                              round and medians; report in target/bench-loopback/<time>/
  soak [--runs N] [--first SEED] [--threads T]
                              randomized simulator campaign (default 100000 runs from seed 0 on 2
                              threads): loss up to 30%, bursts, reordering, duplication,
                              corruption, overruns, links down, crashes; Broadcast, Allgather(v);
                              fails on any wrong buffer, hang or unexplained failure
  help                        this message
";

/// Seconds per target of the fuzz smoke run by `ci`.
const CI_FUZZ_SECS: u64 = 10;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match dispatch(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn dispatch(args: &[String]) -> Result<(), StepError> {
    let root = workspace_root()?;
    let (cmd, rest) = match args.split_first() {
        Some((c, rest)) => (c.as_str(), rest),
        None => ("help", &[][..]),
    };
    match cmd {
        "ci" => {
            no_args(cmd, rest)?;
            ci(&root)
        }
        "core-deps" => {
            no_args(cmd, rest)?;
            core_deps_check(&root, &cargo())
        }
        "test" => {
            no_args(cmd, rest)?;
            test(&root)
        }
        "long" => {
            let cases = match rest {
                [] => 20_000,
                [flag, n] if flag == "--cases" => {
                    n.parse().ok().filter(|&c: &u64| c > 0).ok_or_else(|| {
                        StepError::Other(format!("`--cases` wants a positive integer, got `{n}`"))
                    })?
                }
                _ => {
                    return Err(StepError::Other(format!(
                        "usage: long [--cases N]\n\n{USAGE}"
                    )));
                }
            };
            long(&root, cases)
        }
        "fuzz" => {
            let (secs, targets) = parse_fuzz_args(rest)?;
            fuzz::run(&root, secs, &targets, fuzz::Mode::Required)
        }
        "miri" => {
            no_args(cmd, rest)?;
            miri::run(&root, fuzz::Mode::Required)
        }
        "fuzz-seed" => {
            no_args(cmd, rest)?;
            seed::write_all(&root.join("fuzz").join("corpus"))
        }
        // The study and the soak need the simulator (and plotters): they are examples of the
        // simulator crate that xtask runs, so that xtask itself stays light.
        "figures" => match rest {
            [] => sim_example(&root, "figures", &["--quick".to_owned()]),
            [a] if a == "--quick" || a == "--full" => sim_example(&root, "figures", rest),
            _ => Err(StepError::Other(format!(
                "usage: figures [--quick|--full]\n\n{USAGE}"
            ))),
        },
        "soak" => sim_example(&root, "soak", rest),
        "netns" => netns::run(&root, rest),
        "bench-net" => bench_net::run(&root, rest),
        "bench-loopback" => bench_loopback::run(&root, rest),
        "help" | "-h" | "--help" => {
            print!("{USAGE}");
            Ok(())
        }
        other => Err(StepError::Other(format!(
            "unknown command `{other}`\n\n{USAGE}"
        ))),
    }
}

fn no_args(cmd: &str, rest: &[String]) -> Result<(), StepError> {
    match rest.first() {
        None => Ok(()),
        Some(a) => Err(StepError::Other(format!(
            "`{cmd}` takes no arguments, got `{a}`\n\n{USAGE}"
        ))),
    }
}

fn parse_fuzz_args(rest: &[String]) -> Result<(u64, Vec<String>), StepError> {
    let mut secs = 60;
    let mut targets = Vec::new();
    let mut it = rest.iter();
    while let Some(a) = it.next() {
        let value =
            if a == "--time" {
                Some(it.next().ok_or_else(|| {
                    StepError::Other("`--time` needs a number of seconds".to_owned())
                })?)
            } else {
                a.strip_prefix("--time=").map(|_| a)
            };
        if let Some(v) = value {
            let v = v.strip_prefix("--time=").unwrap_or(v);
            secs = v.parse().ok().filter(|&s| s > 0).ok_or_else(|| {
                StepError::Other(format!("`--time` wants a positive integer, got `{v}`"))
            })?;
        } else if a.starts_with('-') {
            return Err(StepError::Other(format!("unknown option `{a}`\n\n{USAGE}")));
        } else {
            targets.push(a.clone());
        }
    }
    Ok((secs, targets))
}

/// Runs an example of the simulator crate in release mode with `args`.
fn sim_example(root: &Path, name: &str, args: &[String]) -> Result<(), StepError> {
    let mut all: Vec<String> = [
        "run",
        "--release",
        "-p",
        "ringcast-loopback-sim",
        "--example",
        name,
        "--",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    all.extend(args.iter().cloned());
    let refs: Vec<&str> = all.iter().map(String::as_str).collect();
    Step::new(root, &cargo(), &refs, minutes(600)).run()
}

/// The workspace root: xtask's manifest directory's parent.
fn workspace_root() -> Result<PathBuf, StepError> {
    let dir = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    dir.parent()
        .map(Path::to_path_buf)
        .ok_or_else(|| StepError::Other(format!("no parent of {}", dir.display())))
}

/// The cargo that runs us (the toolchain's binary), for stable steps.
fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned())
}

fn minutes(m: u64) -> Duration {
    Duration::from_secs(m * 60)
}

/// The CLI binary is behind the `cli` feature (library users do not get clap): the tests
/// that spawn it need the feature on.
const CLI: &[&str] = &["--features", "ringcast/cli"];

fn test(root: &Path) -> Result<(), StepError> {
    let args = [&["test", "--workspace"], CLI].concat();
    Step::new(root, &cargo(), &args, minutes(40)).run()
}

/// Campaigns too long for CI's default run.
fn long(root: &Path, cases: u64) -> Result<(), StepError> {
    let cargo = cargo();
    let props = [
        "test",
        "--release",
        "-p",
        "ringcast-core",
        "--test",
        "props",
    ];
    Step::new(root, &cargo, &props, minutes(120))
        .env("PROPTEST_CASES", &cases.to_string())
        .run()?;
    let ignored = ["test", "--release", "--workspace", "--", "--ignored"];
    Step::new(root, &cargo, &ignored, minutes(60)).run()?;
    // The Communicator's random mix (beside multicast, all over multicast, after a failed
    // start-up check, across a switch to TCP), 20 000 operations each.
    let mix = [
        &["test", "--release", "-p", "ringcast"],
        CLI,
        &["--test", "comm", "--test", "fallback", "random_mix"],
    ]
    .concat();
    Step::new(root, &cargo, &mix, minutes(60))
        .env("RINGCAST_SOAK_OPS", "20000")
        .run()
}

fn ci(root: &Path) -> Result<(), StepError> {
    let cargo = cargo();
    let started = std::time::Instant::now();
    Step::new(root, &cargo, &["fmt", "--all", "--check"], minutes(5)).run()?;
    Step::new(
        root,
        &cargo,
        &[
            &["clippy", "--workspace", "--all-targets"],
            CLI,
            &["--", "-D", "warnings"],
        ]
        .concat(),
        minutes(40),
    )
    .run()?;
    // Every doc link resolves (the crate docs are the reference users read).
    Step::new(
        root,
        &cargo,
        &[&["doc", "--workspace", "--no-deps"], CLI].concat(),
        minutes(20),
    )
    .env("RUSTDOCFLAGS", "-D warnings")
    .run()?;
    core_deps_check(root, &cargo)?;
    test(root)?;
    riscv_check(root, &cargo)?;
    fuzz::run(root, CI_FUZZ_SECS, &[], fuzz::Mode::Optional)?;
    miri::run(root, fuzz::Mode::Optional)?;
    eprintln!(
        "xtask ci: all steps passed in {:.0}s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Everything `ringcast-core` may depend on: bitvec and its own dependencies. No I/O, no
/// runtime, no other workspace crate.
const CORE_DEPS: &[&str] = &["ringcast-core", "bitvec", "funty", "radium", "tap", "wyz"];

/// The core stays pure: `cargo tree` of its normal dependencies holds only `CORE_DEPS`.
fn core_deps_check(root: &Path, cargo: &str) -> Result<(), StepError> {
    let args = [
        "tree",
        "-p",
        "ringcast-core",
        "-e",
        "normal",
        "--prefix",
        "none",
        "--format",
        "{p}",
    ];
    let out_dir = root.join("target");
    std::fs::create_dir_all(&out_dir).map_err(|e| StepError::Other(format!("target/: {e}")))?;
    let tree =
        Step::new(root, cargo, &args, minutes(5)).capture(&out_dir.join("xtask-core-deps.txt"))?;
    let extra: Vec<&str> = tree
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| !CORE_DEPS.contains(name))
        .collect();
    if extra.is_empty() {
        eprintln!("core dependencies: only {}", CORE_DEPS[1..].join(", "));
        Ok(())
    } else {
        Err(StepError::Other(format!(
            "ringcast-core must not depend on {}",
            extra.join(", ")
        )))
    }
}

const RISCV: &str = "riscv64gc-unknown-none-elf";

/// The core must build without `std` for a bare-metal target (the DPA offload's target).
fn riscv_check(root: &Path, cargo: &str) -> Result<(), StepError> {
    let add = Step::new(root, "rustup", &["target", "add", RISCV], minutes(10));
    let what = add.what().to_owned();
    if let Err(e) = add.run() {
        eprintln!("skipping riscv check: `{what}` did not succeed: {e}");
        return Ok(());
    }
    Step::new(
        root,
        cargo,
        &["build", "-p", "ringcast-core", "--target", RISCV],
        minutes(20),
    )
    .run()
}
