//! `ringcast demo` and `ringcast bench` run for real: local rank processes on loopback
//! multicast (no root needed). Every run is bounded: a run past its deadline is killed and the
//! test fails. Tests never assert on wall-clock figures.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Output, Stdio};
use std::thread;
use std::time::{Duration, Instant};

const DEADLINE: Duration = Duration::from_secs(120);

fn command(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ringcast"));
    c.args(args)
        .env_remove("RINGCAST_IFNAME")
        .env_remove("RINGCAST_LANES")
        .env_remove("RINGCAST_CHAINS")
        .env_remove("RINGCAST_CHUNK_SIZE")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// Kills the process if the test fails before it exits.
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn drain(r: Option<impl Read + Send + 'static>) -> thread::JoinHandle<Vec<u8>> {
    thread::spawn(move || {
        let mut v = Vec::new();
        if let Some(mut r) = r {
            let _ = r.read_to_end(&mut v);
        }
        v
    })
}

/// Runs `c` to its end, killing it at the deadline.
fn run_bounded(mut c: Command) -> Output {
    let mut g = Guard(c.spawn().expect("the binary runs"));
    let out = drain(g.0.stdout.take());
    let err = drain(g.0.stderr.take());
    let end = Instant::now() + DEADLINE;
    let status = loop {
        if let Some(st) = g.0.try_wait().expect("try_wait") {
            break st;
        }
        assert!(Instant::now() < end, "still running after {DEADLINE:?}");
        thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: out.join().expect("stdout"),
        stderr: err.join().expect("stderr"),
    }
}

/// A report row's list of counts `k` (one per rank or block).
fn counts(row: &serde_json::Value, k: &str) -> Vec<u64> {
    row[k]
        .as_array()
        .unwrap_or_else(|| panic!("{k} in {row}"))
        .iter()
        .map(|x| x.as_u64().expect("a count"))
        .collect()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn demo_quick_verifies_and_prints_its_summary() {
    let out = run_bounded(command(&["demo", "--quick"]));
    let (so, se) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{}\n{so}\n{se}", out.status);
    assert!(
        so.contains("ok: 4 collectives on 4 ranks, verified byte for byte"),
        "{so}"
    );
    let rows: Vec<&str> = so
        .lines()
        .filter(|l| l.starts_with("broadcast") || l.starts_with("allgather"))
        .collect();
    assert_eq!(rows.len(), 4, "{so}");
    for r in rows {
        assert!(r.contains(" ok "), "{r}");
        let peer = if r.starts_with("broadcast") {
            "binomial tree"
        } else {
            "ring:"
        };
        assert!(r.contains(peer), "{r}");
    }
}

#[test]
fn bench_allgather_json_has_the_fields() {
    let out = run_bounded(command(&[
        "bench",
        "allgather",
        "--local",
        "4",
        "--sizes",
        "4KiB,64KiB",
        "--iters",
        "3",
        "--tcp-threshold",
        "0",
        "--json",
    ]));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
    assert_eq!(v["collective"], "allgather");
    assert_eq!(v["ranks"], 4);
    assert_eq!(v["iters"], 3);
    // The default warm-up (2 per size) comes with the pacer's: the largest size for 100 ms.
    assert_eq!(
        (&v["warmup"], &v["pacer_warmup_ms"]),
        (&2.into(), &100.into())
    );
    let rows = v["results"].as_array().expect("results");
    assert_eq!(rows.len(), 2);
    for (row, size) in rows.iter().zip([4096u64, 65536]) {
        assert_eq!(row["size"], size, "{row}");
        assert_eq!(row["bytes_total"], 4 * size, "{row}");
        assert_eq!(row["iterations"], 3, "{row}");
        assert_eq!(row["verified"], true, "{row}");
        let f = |k: &str| row[k].as_f64().unwrap_or_else(|| panic!("{k} in {row}"));
        let (avg, min, max) = (f("avg_us"), f("min_us"), f("max_us"));
        assert!(min > 0.0 && min <= avg && avg <= max, "{row}");
        let (algbw, busbw) = (f("algbw_gbs"), f("busbw_gbs"));
        assert!(algbw > 0.0, "{row}");
        assert!(
            (busbw - algbw * 3.0 / 4.0).abs() <= 1e-9 * algbw.max(1.0),
            "{row}"
        );
        let (wire, payload, ring) = (
            counts(row, "injected_per_rank"),
            counts(row, "payload_per_rank"),
            counts(row, "p2p_per_rank"),
        );
        assert_eq!((wire.len(), payload.len(), ring.len()), (4, 4, 4), "{row}");
        for r in 0..4 {
            // Each rank multicasts its own block at most once (a lost multicast is repaired
            // over the ring, not resent), plus headers; a ring sends it 3 times.
            assert!(payload[r] <= size, "{row}");
            assert!(wire[r] >= payload[r] && wire[r] < ring[r], "{row}");
            assert_eq!(ring[r], 3 * size, "{row}");
        }
    }
}

/// The collective may follow a `--` (the ranks' `--child` went after it, where it was taken
/// for a positional argument and every rank failed with a usage error). An Allgatherv's ring
/// figures are what a ring sends: every block but the successor's, not P - 1 times its own
/// (which overstated the busiest rank of a ring by a third for blocks of 4, 8, 12, 16).
#[test]
fn bench_allgatherv_after_a_double_dash_reports_a_ring_s_bytes() {
    let out = run_bounded(command(&[
        "bench",
        "--local",
        "4",
        "--sizes",
        "10",
        "--iters",
        "1",
        "--json",
        "--",
        "allgatherv",
    ]));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
    let row = &v["results"][0];
    assert_eq!(counts(row, "blocks"), [4, 8, 12, 16], "{row}");
    assert_eq!(counts(row, "p2p_per_rank"), [32, 28, 24, 36], "{row}");
}

/// `--dtype` runs the calls on vectors and slices of that type (aligned above a byte), each
/// size verified byte for byte first: uneven Allgatherv blocks of whole elements, blocking
/// and not, over multicast and over TCP.
#[test]
fn bench_typed_buffers_are_verified() {
    for (dtype, more) in [
        ("f32", None),
        ("f64", Some("--blocking")),
        ("bf16", Some("--in-place")),
    ] {
        let mut args = vec![
            "bench",
            "allgatherv",
            "--local",
            "3",
            "--sizes",
            "8,4KiB,300KiB",
            "--iters",
            "2",
            "--dtype",
            dtype,
            "--json",
        ];
        args.extend(more);
        let out = run_bounded(command(&args));
        assert!(out.status.success(), "{dtype}: {}", text(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
        assert_eq!(v["dtype"], dtype);
        let elem = match dtype {
            "bf16" => 2,
            "f32" => 4,
            _ => 8,
        };
        for row in v["results"].as_array().expect("results") {
            assert_eq!(row["verified"], true, "{row}");
            for b in row["blocks"].as_array().expect("blocks") {
                assert_eq!(b.as_u64().expect("bytes") % elem, 0, "{row}");
            }
        }
    }
}

/// `--huge-pages` allocates every buffer with `ringcast::alloc_buffer` (typed, of more than
/// one huge page), for the blocking and the non-blocking calls, each size verified first.
#[test]
fn bench_buffers_on_huge_pages_are_verified() {
    for (coll, more) in [("bcast", Some("--blocking")), ("allgatherv", None)] {
        let mut args = vec![
            "bench",
            coll,
            "--local",
            "3",
            "--sizes",
            "4KiB,5MiB",
            "--iters",
            "2",
            "--dtype",
            "f64",
            "--huge-pages",
            "--json",
        ];
        args.extend(more);
        let out = run_bounded(command(&args));
        assert!(out.status.success(), "{coll}: {}", text(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
        assert_eq!(v["huge_pages"], true);
        let rows = v["results"].as_array().expect("results");
        assert_eq!(rows.len(), 2);
        for row in rows {
            assert_eq!(row["verified"], true, "{row}");
        }
    }
}

/// `--in-place` times the in-place Allgatherv, over multicast and over TCP, each size
/// verified byte for byte first; it conflicts with `--blocking`.
#[test]
fn bench_in_place_allgathers_are_verified() {
    for threshold in ["0", "1GiB"] {
        let out = run_bounded(command(&[
            "bench",
            "allgatherv",
            "--local",
            "4",
            "--sizes",
            "4KiB,300KiB",
            "--iters",
            "2",
            "--tcp-threshold",
            threshold,
            "--in-place",
            "--json",
        ]));
        assert!(out.status.success(), "{}", text(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
        assert_eq!(v["in_place"], true);
        for row in v["results"].as_array().expect("results") {
            assert_eq!(row["verified"], true, "{row}");
        }
    }
    let out = run_bounded(command(&["bench", "allgather", "--in-place", "--blocking"]));
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("--blocking"),
        "{}",
        text(&out.stderr)
    );
}

/// At the default TCP threshold (512 KiB: local ranks share one host, which the JSON says) a
/// 4 KiB-per-rank Allgather (16 KiB in all) runs over TCP: no datagram, every rank sends its
/// block P - 1 times (one tree per block), and the table marks the row (here of a blocking
/// Broadcast) under a header naming the threshold.
#[test]
fn bench_runs_small_operations_over_tcp_by_default() {
    let out = run_bounded(command(&[
        "bench",
        "allgather",
        "--local",
        "4",
        "--sizes",
        "4KiB",
        "--iters",
        "3",
        "--json",
    ]));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
    assert_eq!(v["tcp_threshold"], 512 << 10);
    let row = &v["results"][0];
    for r in 0..4 {
        assert_eq!(row["payload_per_rank"][r], 0, "{row}");
        assert_eq!(row["tcp_per_rank"][r], 3 * 4096, "{row}");
    }
    let out = run_bounded(command(&[
        "bench",
        "bcast",
        "--local",
        "4",
        "--sizes",
        "4KiB",
        "--iters",
        "2",
        "--blocking",
    ]));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let table = text(&out.stdout);
    let line = table
        .lines()
        .find(|l| l.starts_with("4096"))
        .unwrap_or_else(|| panic!("no 4096 row in {table}"));
    assert!(line.ends_with(" tcp"), "{line}");
    assert!(
        table.contains("# over TCP: operations of at most 524288 B"),
        "{table}"
    );
}

#[test]
fn bench_into_a_closed_pipe_exits_quietly() {
    let mut c = command(&[
        "bench",
        "bcast",
        "--local",
        "4",
        "--sizes",
        "4KiB,8KiB,16KiB,32KiB",
        "--iters",
        "3",
    ]);
    let mut g = Guard(c.spawn().expect("the binary runs"));
    let err = drain(g.0.stderr.take());
    let mut first = String::new();
    BufReader::new(g.0.stdout.take().expect("stdout"))
        .read_line(&mut first)
        .expect("a first line");
    // `| head -1`: the reader is gone; the rows still to come meet a closed pipe.
    assert!(first.starts_with("# ringcast bench bcast"), "{first}");
    let end = Instant::now() + DEADLINE;
    let status = loop {
        if let Some(st) = g.0.try_wait().expect("try_wait") {
            break st;
        }
        assert!(Instant::now() < end, "still running after {DEADLINE:?}");
        thread::sleep(Duration::from_millis(20));
    };
    let err = text(&err.join().expect("stderr"));
    assert!(status.success(), "{status}: {err}");
    assert!(err.is_empty(), "{err}");
}

#[test]
fn a_failing_rank_fails_the_run_naming_the_setting() {
    for (var, value) in [("RINGCAST_LANES", "many"), ("RINGCAST_CHAINS", "0")] {
        let mut c = command(&["demo", "--quick"]);
        c.env(var, value);
        let out = run_bounded(c);
        let err = text(&out.stderr);
        // A setting every rank refuses: a usage error (2), as under a launcher.
        assert_eq!(out.status.code(), Some(2), "{var}: {err}");
        // Every rank refuses it: one line names them all.
        assert!(
            err.contains("ranks 0, 1, 2, 3: ") && err.contains(var),
            "{err}"
        );
        assert_eq!(err.matches(var).count(), 1, "{err}");
    }
}

/// The processes whose parent is `pid` (from `/proc/*/stat`).
fn children_of(pid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&p| stat_fields(p).is_some_and(|(_, ppid)| ppid == pid))
        .collect()
}

/// A process's state and parent, from `/proc/<pid>/stat` (its name, in parentheses, may hold
/// anything: the fields are read after the last `)`).
fn stat_fields(pid: u32) -> Option<(char, u32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut rest = stat.rsplit_once(')')?.1.split_whitespace();
    let state = rest.next()?.chars().next()?;
    Some((state, rest.next()?.parse().ok()?))
}

/// A parent killed alone (SIGKILL: none of its clean-up runs) takes its ranks with it, a
/// stopped one (as a hung rank) included: they ran on as orphans before, the others until
/// their peer timeout (here ten minutes), the stopped one for good.
#[test]
fn ranks_leave_with_a_parent_killed_alone() {
    use rustix::process::{Pid, Signal, kill_process};
    let mut c = command(&[
        "bench",
        "bcast",
        "--local",
        "3",
        "--sizes",
        "4KiB",
        "--warmup",
        "0",
        "--iters",
        "10000000",
        "--peer-timeout",
        "600s",
    ]);
    let mut g = Guard(c.spawn().expect("the binary runs"));
    let (_out, _err) = (drain(g.0.stdout.take()), drain(g.0.stderr.take()));
    let end = Instant::now() + DEADLINE;
    let ranks = loop {
        let kids = children_of(g.0.id());
        if kids.len() == 3 {
            break kids;
        }
        assert!(Instant::now() < end, "ranks {kids:?} after {DEADLINE:?}");
        thread::sleep(Duration::from_millis(20));
    };
    // Until they run collectives (the last one's communicator built).
    thread::sleep(Duration::from_millis(500));
    let hung = Pid::from_raw(i32::try_from(ranks[2]).expect("a pid")).expect("a pid");
    kill_process(hung, Signal::STOP).expect("SIGSTOP");
    g.0.kill().expect("kill the parent");
    g.0.wait().expect("wait");
    loop {
        // Gone, or a zombie that nobody here reaps (in a container without an init).
        let left: Vec<u32> = ranks
            .iter()
            .copied()
            .filter(|&p| stat_fields(p).is_some_and(|(state, _)| state != 'Z'))
            .collect();
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < end,
            "ranks {left:?} outlived their parent by {DEADLINE:?}"
        );
        thread::sleep(Duration::from_millis(20));
    }
}
