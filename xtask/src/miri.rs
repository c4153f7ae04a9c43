//! `cargo xtask miri`: the tests of the modules that hold `unsafe` on memory (not FFI) under
//! Miri, which reports undefined behaviour a normal run cannot see: the transport's striped
//! operation buffer (`opbuf`, raw parts of a vector shared across threads).

use crate::fuzz::Mode;
use crate::minutes;
use crate::run::{Step, StepError};
use std::path::Path;

/// `cargo test` filters run under Miri: (package, test name filter).
const UNDER_MIRI: &[(&str, &str)] = &[("ringcast-transport-rocev2-udp", "opbuf::")];

/// Why Miri cannot run here, if it cannot: needs a nightly toolchain with the `miri` and
/// `rust-src` components, which it adds if missing.
fn toolchain_missing(root: &Path) -> Option<String> {
    if let Some(why) = crate::fuzz::no_nightly(root) {
        return Some(why);
    }
    let have = || {
        Step::new(
            root,
            "cargo",
            &["+nightly", "miri", "--version"],
            minutes(2),
        )
        .probe()
    };
    if have() {
        return None;
    }
    eprintln!("Miri not found; adding the nightly miri and rust-src components");
    let add = Step::new(
        root,
        "rustup",
        &[
            "component",
            "add",
            "--toolchain",
            "nightly",
            "miri",
            "rust-src",
        ],
        minutes(10),
    );
    if let Err(e) = add.run() {
        return Some(format!("Miri is missing and adding it failed: {e}"));
    }
    if have() {
        None
    } else {
        Some("Miri was added but `cargo +nightly miri --version` still fails".to_owned())
    }
}

/// Runs every [`UNDER_MIRI`] filter under Miri.
pub(crate) fn run(root: &Path, mode: Mode) -> Result<(), StepError> {
    if let Some(why) = toolchain_missing(root) {
        return match mode {
            Mode::Optional => {
                eprintln!("skipping Miri: {why}");
                Ok(())
            }
            Mode::Required => Err(StepError::Other(format!("cannot run Miri: {why}"))),
        };
    }
    for (package, filter) in UNDER_MIRI {
        Step::new(
            root,
            "cargo",
            &[
                "+nightly", "miri", "test", "-p", package, "--lib", "--", filter,
            ],
            // The sysroot and the dependencies' first build, then the interpreted tests.
            minutes(30),
        )
        .run()?;
    }
    Ok(())
}
