//! `cargo xtask fuzz`: build the cargo-fuzz targets under `fuzz/` with nightly and run each for
//! a fixed time, starting from the committed seed corpus.

use crate::minutes;
use crate::run::{Step, StepError};
use std::path::Path;
use std::time::Duration;

/// What to do when the fuzzing toolchain is missing.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// `cargo xtask fuzz`: missing nightly or cargo-fuzz is an error.
    Required,
    /// `cargo xtask ci`: print why fuzzing is skipped and succeed.
    Optional,
}

/// The fuzz targets: the file stems of `fuzz/fuzz_targets/*.rs`, sorted.
fn all_targets(fuzz_dir: &Path) -> Result<Vec<String>, StepError> {
    let dir = fuzz_dir.join("fuzz_targets");
    let entries = std::fs::read_dir(&dir)
        .map_err(|e| StepError::Other(format!("cannot list {}: {e}", dir.display())))?;
    let mut targets: Vec<String> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            name.strip_suffix(".rs").map(str::to_owned)
        })
        .collect();
    targets.sort();
    Ok(targets)
}

/// Why there is no nightly toolchain here, if there is none (fuzzing and Miri need one).
pub(crate) fn no_nightly(root: &Path) -> Option<String> {
    // Through rustup's `cargo` proxy: `$CARGO` is a toolchain's own binary and knows no `+`.
    let nightly = Step::new(root, "cargo", &["+nightly", "--version"], minutes(2));
    (!nightly.probe()).then(|| {
        "no nightly toolchain (`cargo +nightly --version` failed; \
         install it with `rustup toolchain install nightly --profile minimal`)"
            .to_owned()
    })
}

/// Why fuzzing cannot run here, if it cannot: checks for nightly and cargo-fuzz, installing
/// cargo-fuzz if it is missing.
fn toolchain_missing(root: &Path) -> Option<String> {
    if let Some(why) = no_nightly(root) {
        return Some(why);
    }
    let have_fuzz = || Step::new(root, "cargo", &["fuzz", "--version"], minutes(2)).probe();
    if have_fuzz() {
        return None;
    }
    eprintln!("cargo-fuzz not found; installing it");
    let install = Step::new(
        root,
        "cargo",
        &["install", "cargo-fuzz", "--locked"],
        minutes(30),
    );
    if let Err(e) = install.run() {
        return Some(format!(
            "cargo-fuzz is missing and installing it failed: {e}"
        ));
    }
    if have_fuzz() {
        None
    } else {
        Some("cargo-fuzz was installed but `cargo fuzz --version` still fails".to_owned())
    }
}

/// Builds every target, then runs each of `targets` (all if empty) for `secs` seconds.
pub(crate) fn run(root: &Path, secs: u64, targets: &[String], mode: Mode) -> Result<(), StepError> {
    let fuzz_dir = root.join("fuzz");
    let known = all_targets(&fuzz_dir)?;
    if let Some(unknown) = targets.iter().find(|t| !known.contains(t)) {
        return Err(StepError::Other(format!(
            "no fuzz target `{unknown}`; known: {}",
            known.join(", ")
        )));
    }
    if let Some(why) = toolchain_missing(root) {
        return match mode {
            Mode::Optional => {
                eprintln!("skipping fuzz smoke: {why}");
                Ok(())
            }
            Mode::Required => Err(StepError::Other(format!("cannot fuzz: {why}"))),
        };
    }
    let chosen: Vec<&String> = if targets.is_empty() {
        known.iter().collect()
    } else {
        targets.iter().collect()
    };
    let fuzz_dir_arg = fuzz_dir.to_string_lossy().into_owned();
    Step::new(
        root,
        "cargo",
        &["+nightly", "fuzz", "build", "--fuzz-dir", &fuzz_dir_arg],
        minutes(30),
    )
    .run()?;
    for target in chosen {
        // New inputs go to a scratch corpus under target/; the committed seeds are only read.
        let scratch = root.join("target").join("xtask-fuzz").join(target);
        std::fs::create_dir_all(&scratch)
            .map_err(|e| StepError::Other(format!("cannot create {}: {e}", scratch.display())))?;
        let scratch = scratch.to_string_lossy().into_owned();
        let seeds = fuzz_dir.join("corpus").join(target);
        let seeds = seeds.to_string_lossy().into_owned();
        let max_time = format!("-max_total_time={secs}");
        Step::new(
            root,
            "cargo",
            &[
                "+nightly",
                "fuzz",
                "run",
                "--fuzz-dir",
                &fuzz_dir_arg,
                target,
                &scratch,
                &seeds,
                "--",
                &max_time,
                "-print_final_stats=1",
            ],
            // Time to fuzz, plus slack for a rebuild and for merging the corpus.
            Duration::from_secs(secs) + minutes(15),
        )
        .run()?;
    }
    Ok(())
}
