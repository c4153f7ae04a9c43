//! The `ringcast` binary, run as a user would.

use std::process::Command;

fn ringcast(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_ringcast"))
        .args(args)
        .output()
        .expect("the binary runs")
}

/// [`ringcast`] with no input and without the settings a caller's environment may carry
/// (`RINGCAST_IFNAME`, `RINGCAST_LANES`, `RINGCAST_CHUNK_SIZE`).
fn ringcast_clean(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_ringcast"))
        .args(args)
        .env_remove("RINGCAST_IFNAME")
        .env_remove("RINGCAST_LANES")
        .env_remove("RINGCAST_CHAINS")
        .env_remove("RINGCAST_CHUNK_SIZE")
        .stdin(std::process::Stdio::null())
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

/// A peer timeout past the core's default post timeout runs (the simulator has no post
/// timeout of its own); timeouts and latencies past the core's bounds are refused naming
/// the flag, not the core's field.
#[test]
fn sim_timeouts_are_bounded_by_their_flags() {
    let out = ringcast(&[
        "sim",
        "bcast",
        "--ranks",
        "4",
        "--size",
        "1KiB",
        "--peer-timeout",
        "601s",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for (flag, value) in [("--peer-timeout", "700000s"), ("--latency", "1000000000s")] {
        let out = ringcast(&[
            "sim", "bcast", "--ranks", "4", "--size", "1KiB", flag, value,
        ]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flag}: {err}");
        assert!(err.contains(flag), "{flag}: {err}");
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

/// `args` and then `more`.
fn then<'a>(args: &[&'a str], more: &[&'a str]) -> Vec<&'a str> {
    args.iter().chain(more).copied().collect()
}

/// Runs a command that must fail with exit status 2 (bad flags) and an error naming `want`;
/// never a panic or an abort.
fn refused(args: &[&str], want: &str) {
    let out = ringcast_clean(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    assert!(err.contains("error"), "{args:?}: {err}");
    assert!(err.contains(want), "{args:?}: want `{want}` in: {err}");
    assert!(!err.contains("panicked"), "{args:?}: {err}");
}

#[test]
fn sim_fat_tree_radix_is_bounded_and_checked() {
    let ft = |radix: &'static str| {
        ["sim", "bcast", "--ranks", "2", "--size", "4KiB"]
            .into_iter()
            .chain(["--topology", "fat-tree", "--radix", radix])
    };
    // half * half wrapped in u32: a panic slicing the cores.
    refused(&ft("2097152").collect::<Vec<_>>(), "--radix 2097152");
    // radix^3 wrapped in u64: a wrong capacity (in a debug build, a panic).
    refused(&ft("4294967295").collect::<Vec<_>>(), "at most 1024");
    // Above the cap: was a million cores for two hosts.
    refused(&ft("2048").collect::<Vec<_>>(), "at most 1024");
    refused(
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
        "--ranks 17",
    );
    // The largest radix builds only the switches its hosts use.
    let v = ringcast_json(&ft("1024").chain(["--json"]).collect::<Vec<_>>());
    assert_eq!(v["verified"], true);
    assert!(
        v["topology"]
            .as_str()
            .is_some_and(|t| t.contains("0 cores")),
        "{v}"
    );
}

#[test]
fn sim_ranks_are_checked_before_allocating_per_rank() {
    for cmd in ["bcast", "allgather"] {
        // Aborted allocating ~100 GB before the core's limit was checked.
        refused(
            &["sim", cmd, "--ranks", "4294967295", "--size", "4KiB"],
            "--ranks 4294967295 is more than 8192",
        );
        refused(&["sim", cmd, "--ranks", "65537"], "--ranks 65537");
        // A legal session count, but some 120 GB of simulated ranks in one process.
        refused(
            &["sim", cmd, "--ranks", "65536"],
            "--ranks 65536 is more than 8192",
        );
        // Was "--root 0 is not below --ranks 0".
        refused(&["sim", cmd, "--ranks", "0"], "--ranks must be at least 1");
    }
}

#[test]
fn sim_fabric_and_lane_flags_are_bounded() {
    let with = |more: &[&'static str]| then(&["sim", "bcast", "--topology", "leaf-spine"], more);
    refused(&with(&["--spines", "100000000"]), "--spines 100000000");
    refused(
        &with(&["--hosts-per-leaf", "100000"]),
        "--hosts-per-leaf 100000",
    );
    // 4096 leaves x 1024 spines: four million cables.
    refused(
        &with(&[
            "--ranks",
            "4096",
            "--hosts-per-leaf",
            "1",
            "--spines",
            "1024",
        ]),
        "use fewer --spines",
    );
    refused(&["sim", "bcast", "--lanes", "65535"], "--lanes 65535");
    refused(&["sim", "allgather", "--lanes", "257"], "--lanes 257");
    // 65 concurrent roots: refused up front, not rejected mid-run.
    let roots = vec!["0"; 65].join(",");
    refused(
        &["sim", "bcast", "--ranks", "4", "--root", &roots],
        "--root",
    );
}

/// Flags under which no run could go well are refused, naming the flag: a peer timeout no
/// chunk or round trip fits in (every rank was reported unresponsive), zero timeouts, more
/// memory than any host has (lanes multiply it), a chunk of 4 GiB.
#[test]
fn sim_flags_that_doom_every_run_are_refused() {
    let b = |more: &[&'static str]| then(&["sim", "bcast", "--ranks", "4", "--size", "4KiB"], more);
    // A 16 MiB chunk takes 1.34 ms at 100 Gbit/s: longer than the 1 ms default.
    refused(&b(&["--chunk", "16MiB"]), "--peer-timeout 1ms is too short");
    refused(&b(&["--bandwidth", "1Mbps"]), "--peer-timeout");
    refused(&b(&["--latency", "1s"]), "--peer-timeout");
    refused(
        &b(&["--peer-timeout", "0ns"]),
        "--peer-timeout must be positive",
    );
    refused(&b(&["--time-limit", "0ns"]), "--time-limit");
    // 58 days: past the simulator's clock (it was clamped to 53 days without a word).
    refused(
        &b(&["--time-limit", "5000000s"]),
        "--time-limit 5000000s is past the simulator's clock",
    );
    refused(&b(&["--chunk", "4GiB"]), "4 294 967 295 B");
    // About 1.2 TB: was 19 GB at 1024 ranks before it was refused.
    refused(
        &["sim", "bcast", "--ranks", "8192", "--lanes", "256"],
        "--ranks 8192 on --lanes 256",
    );
    // With the timeout raised, the same fabric runs.
    let v = ringcast_json(&b(&["--chunk", "16MiB", "--peer-timeout", "10s", "--json"]));
    assert_eq!(v["verified"], true, "{v}");
    // A run cut at its time limit: its ranks are unfinished, not hung.
    let out = ringcast(&[
        "sim",
        "bcast",
        "--ranks",
        "4",
        "--size",
        "64MiB",
        "--time-limit",
        "100us",
    ]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{table}");
    assert!(table.contains("unfinished"), "{table}");
    assert!(!table.contains("HUNG"), "{table}");
}

/// `bench` started by no launcher says how to run locally; under one (a rank in the
/// environment), a bad setting is named alone, without that hint.
#[test]
fn bench_hints_at_local_runs_only_without_a_launcher() {
    // A usage error (status 2), run with only `env` in its environment: its message.
    let refused_with = |args: &[&str], env: &[(&str, &str)]| {
        let out = Command::new(env!("CARGO_BIN_EXE_ringcast"))
            .args(args)
            .env_clear()
            .envs(env.iter().copied())
            .stdin(std::process::Stdio::null())
            .output()
            .expect("the binary runs");
        assert_eq!(out.status.code(), Some(2), "{out:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let bench = |env: &[(&str, &str)]| refused_with(&["bench", "bcast", "--sizes", "4KiB"], env);
    let alone = bench(&[]);
    assert!(alone.contains("no rank in the environment"), "{alone}");
    assert!(alone.contains("--local N"), "{alone}");
    let launched = bench(&[
        ("RINGCAST_RANK", "0"),
        ("RINGCAST_WORLD_SIZE", "1"),
        ("RINGCAST_LANES", "0"),
    ]);
    assert!(launched.contains("RINGCAST_LANES"), "{launched}");
    assert!(!launched.contains("--local"), "{launched}");
    // Under a launcher too, sizes past this host's memory are refused before anything is
    // allocated (the kernel overcommits: the ranks would be killed touching their pages).
    let err = refused_with(
        &["bench", "allgather", "--sizes", "1TiB"],
        &[("RINGCAST_RANK", "0"), ("RINGCAST_WORLD_SIZE", "1")],
    );
    assert!(err.contains("--sizes"), "{err}");
}

/// A setting every local rank refuses (from the environment they share) is a usage error,
/// exit status 2, as it is under a launcher: not a failed run (1).
#[test]
fn settings_the_local_ranks_refuse_are_usage_errors() {
    for args in [
        &["bench", "bcast", "--local", "2", "--sizes", "4KiB"][..],
        &["demo", "--ranks", "2", "--sizes", "4KiB"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_ringcast"))
            .args(args)
            .env("RINGCAST_LANES", "0")
            .env_remove("RINGCAST_IFNAME")
            .stdin(std::process::Stdio::null())
            .output()
            .expect("the binary runs");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains("RINGCAST_LANES"), "{args:?}: {err}");
    }
}

#[test]
fn sim_sizes_are_parsed_exactly() {
    // 2^53 + 1 became 2^53 through f64.
    refused(
        &["sim", "bcast", "--size", "9007199254740993"],
        "a buffer of 9007199254740993 B",
    );
    // Exactly 2^63 passed the old `>` check.
    refused(
        &["sim", "bcast", "--size", "9223372036854775808"],
        "too large",
    );
    refused(
        &["sim", "allgather", "--sizes", "1,8388608TiB"],
        "too large",
    );
    let v = ringcast_json(&["sim", "bcast", "--ranks", "2", "--size", "1.5KiB", "--json"]);
    assert_eq!(v["ops"][0]["kind"]["len"], 1536);
}

#[test]
fn sim_run_in_which_every_rank_crashed_is_a_failure() {
    let mut args = vec!["sim", "bcast", "--ranks", "4", "--size", "64KiB"];
    for r in ["0@1us", "1@1us", "2@1us", "3@1us"] {
        args.extend(["--crash", r]);
    }
    let out = ringcast(&args);
    let text = String::from_utf8_lossy(&out.stdout);
    // Was exit 0 and "verified, all completed" with 0 deliveries.
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(!text.contains("all completed"), "{text}");
    assert!(text.contains("none completed it"), "{text}");
}

#[test]
fn bench_and_demo_refuse_bad_flags_before_spawning() {
    let bench =
        |more: &[&'static str]| then(&["bench", "bcast", "--sizes", "4KiB", "--local", "2"], more);
    // Overflowed `1 + warmup + iters` (u32), then aborted reserving the timings.
    refused(&bench(&["--iters", "4294967295"]), "--iters 4294967295");
    refused(&bench(&["--warmup", "4294967295"]), "--warmup 4294967295");
    refused(
        &["bench", "bcast", "--local", "256", "--iters", "10000000"],
        "--iters 10000000 on 256 ranks",
    );
    // Spawned that many rank processes.
    refused(&["bench", "bcast", "--local", "257"], "--local 257");
    refused(&["demo", "--quick", "--ranks", "257"], "--ranks 257");
    // Killed every rank at once.
    refused(&bench(&["--timeout", "0ns"]), "--timeout");
    // Silently ignored --sizes.
    refused(&["demo", "--quick", "--sizes", "1"], "--quick");
    // A size that is not a whole number of elements.
    refused(
        &bench(&["--dtype", "f64", "--sizes", "4KiB,1001"]),
        "--sizes 1001: not a multiple of --dtype f64's 8 bytes",
    );
    // Every rank started, to refuse them alike, naming the variables.
    refused(
        &bench(&["--lanes", "0"]),
        "--lanes 0 must be between 1 and 64",
    );
    refused(&bench(&["--lanes", "65"]), "--lanes 65");
    refused(
        &bench(&["--peer-timeout", "0s"]),
        "--peer-timeout must be positive",
    );
    refused(
        &["demo", "--quick", "--peer-timeout", "700000s"],
        "--peer-timeout",
    );
    // Every rank allocated its buffers before the core refused so many chunks.
    refused(
        &[
            "bench", "bcast", "--local", "2", "--chunk", "16", "--sizes", "128MiB",
        ],
        "--sizes 134217728: 8388608 chunks of 16 B",
    );
    // Blamed RINGCAST_CHUNK_SIZE; or let every rank start to refuse a chunk no datagram holds.
    refused(&bench(&["--chunk", "0"]), "--chunk 0");
    refused(
        &bench(&["--chunk", "70000"]),
        "--chunk 70000 must be between 16 B and 65476 B",
    );
    // size x ranks does not fit in a buffer: refused before connecting.
    refused(
        &[
            "bench",
            "allgather",
            "--sizes",
            "4611686018427387904",
            "--local",
            "2",
        ],
        "--sizes 4611686018427387904: 2 ranks",
    );
    refused(
        &["demo", "--sizes", "9223372036854775807", "--ranks", "2"],
        "--sizes 9223372036854775807",
    );
}

/// A size no process can allocate (2^62 bytes) fails the run with an error naming `--sizes`,
/// not an abort ("memory allocation of N bytes failed") or a panic ("capacity overflow"):
/// refused before any rank starts, as more than the host has available for its ranks.
#[test]
fn sizes_too_large_for_memory_fail_the_ranks_cleanly() {
    for args in [
        &[
            "bench",
            "bcast",
            "--sizes",
            "4611686018427387904",
            "--iters",
            "1",
            "--warmup",
            "0",
            "--local",
            "2",
        ][..],
        &["demo", "--sizes", "4611686018427387904", "--ranks", "1"],
    ] {
        let out = ringcast_clean(&[args, &["--timeout", "60s"]].concat());
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains("use smaller --sizes"), "{args:?}: {err}");
        assert!(err.contains("this host has available"), "{args:?}: {err}");
        assert!(!err.contains("memory allocation"), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}
