//! The `ringcast` binary, run as a user would.

use std::process::Command;

fn ringcast(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_ringcast"))
        .args(args)
        .output()
        .expect("the binary runs")
}

#[test]
fn sim_bcast_json_is_verified_and_completed() {
    let out = ringcast(&[
        "sim",
        "bcast",
        "--ranks",
        "8",
        "--size",
        "256KiB",
        "--chunk",
        "4KiB",
        "--topology",
        "leaf-spine",
        "--hosts-per-leaf",
        "4",
        "--spines",
        "2",
        "--loss",
        "1e-2",
        "--dup",
        "1e-2",
        "--seed",
        "7",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON report");
    assert_eq!(v["verified"], true);
    assert_eq!(v["all_finished"], true);
    assert_eq!(v["ranks"], 8);
    let ranks = v["per_rank"].as_array().expect("per_rank");
    assert_eq!(ranks.len(), 8);
    for r in ranks {
        assert_eq!(r["outcomes"][0]["status"], "completed", "{r}");
        assert_eq!(r["outcomes"][0]["mismatches"], 0, "{r}");
    }
}

#[test]
fn sim_bcast_table_and_crash_exit_status() {
    let out = ringcast(&["sim", "bcast", "--ranks", "4", "--size", "64KiB"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("verified, all completed"), "{text}");

    // A crashed root: the run ends, survivors fail with typed errors, exit status 1.
    let out = ringcast(&[
        "sim", "bcast", "--ranks", "4", "--crash", "0@10us", "--json",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON report");
    assert_eq!(v["all_finished"], true);
    assert_eq!(v["per_rank"][1]["outcomes"][0]["status"], "failed");
}

#[test]
fn bad_flags_are_errors_not_panics() {
    for args in [
        &["sim", "bcast", "--size", "12XB"][..],
        &["sim", "bcast", "--crash", "3"],
        &["sim", "bcast", "--ranks", "4", "--root", "9"],
        &["sim", "bcast", "--ranks", "4", "--crash", "7@1us"],
        &["sim", "bcast", "--loss", "2"],
        &["sim", "bcast", "--chunk", "0"],
        &["sim", "bcast", "--ranks", "0"],
    ] {
        let out = ringcast(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("error"), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}
