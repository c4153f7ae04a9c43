//! The `ringcast` binary, run as a user would.

use std::process::Command;

fn ringcast(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_ringcast"))
        .args(args)
        .output()
        .expect("the binary runs")
}

/// Runs a command that must succeed and print a JSON report; returns the report.
fn ringcast_json(args: &[&str]) -> serde_json::Value {
    let out = ringcast(args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON report")
}

#[test]
fn sim_bcast_json_is_verified_and_completed() {
    let v = ringcast_json(&[
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
        &["sim", "bcast", "--topology", "fat-tree", "--radix", "5"],
        &[
            "sim",
            "bcast",
            "--topology",
            "fat-tree",
            "--radix",
            "4",
            "--ranks",
            "17",
        ],
        &["sim", "allgather", "--ranks", "3", "--sizes", "1KiB,2KiB"],
        &["sim", "allgather", "--chains", "0"],
        &["sim", "allgather", "--corrupt-imm-bits", "chunk"],
    ] {
        let out = ringcast(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("error"), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

#[test]
fn sim_allgather_json_on_a_lossy_fat_tree_is_verified() {
    let v = ringcast_json(&[
        "sim",
        "allgather",
        "--ranks",
        "12",
        "--size",
        "32KiB",
        "--topology",
        "fat-tree",
        "--radix",
        "4",
        "--loss",
        "5e-3",
        "--corrupt-imm",
        "1e-2",
        "--chains",
        "5",
        "--seed",
        "7",
        "--json",
    ]);
    assert_eq!(v["verified"], true);
    assert_eq!(v["ranks"], 12);
    assert_eq!(v["ops"][0]["kind"]["kind"], "allgather");
    assert_eq!(v["ops"][0]["completed"], 12);
    let levels = v["levels"].as_array().expect("levels");
    let names: Vec<_> = levels.iter().map(|l| l["name"].clone()).collect();
    assert_eq!(names, ["host-edge", "edge-agg", "agg-core"]);
    // Each rank injects its 32 KiB block once; host uplinks also carry the reads served.
    let served: u64 = v["per_rank"]
        .as_array()
        .expect("per_rank")
        .iter()
        .filter_map(|r| r["bytes_served"].as_u64())
        .sum();
    assert_eq!(
        levels[0]["up_bytes"].as_u64(),
        Some(12 * 32 * 1024 + served)
    );
    for r in v["per_rank"].as_array().expect("per_rank") {
        assert_eq!(r["bytes_sent"], 32 * 1024, "{r}");
    }
}

#[test]
fn sim_allgatherv_table_and_testbed_bcast() {
    let out = ringcast(&[
        "sim",
        "allgather",
        "--ranks",
        "4",
        "--sizes",
        "4KiB,0,10000,1",
    ]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("verified, all completed"), "{text}");
    assert!(text.contains("allgather"), "{text}");

    let out = ringcast(&["sim", "bcast", "--topology", "testbed", "--size", "64KiB"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("188 ranks"), "{text}");
    assert!(text.contains("leaf-spine"), "{text}");
}

/// `ringcast ... | head -1`: the reader goes away; the CLI exits 0 without a word.
#[test]
fn closed_output_pipe_is_a_quiet_exit() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    // The testbed's JSON report (~150 KB) overfills the pipe, so the writer is still writing
    // when the reader leaves.
    let args = [
        "sim",
        "bcast",
        "--topology",
        "testbed",
        "--size",
        "64KiB",
        "--json",
    ];
    for read_first_line in [true, false] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_ringcast"))
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the binary runs");
        let stdout = child.stdout.take().expect("piped stdout");
        if read_first_line {
            let mut line = String::new();
            BufReader::new(stdout).read_line(&mut line).expect("a line");
            assert_eq!(line.trim(), "{");
        } else {
            drop(stdout);
        }
        let out = child.wait_with_output().expect("exit");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{:?}: {err}", out.status);
        assert!(err.is_empty(), "{err}");
    }
}
