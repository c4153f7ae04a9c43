//! One rank of `cargo xtask netns` (the namespace lab): runs collectives with several in
//! flight, checks every buffer byte for byte, and reports on stdout in `TAG key=value ...`
//! lines that the harness parses (no JSON dependency in xtask).
//!
//! The rank and the rendezvous come from the environment (`RINGCAST_RANK`,
//! `RINGCAST_WORLD_SIZE`, `RINGCAST_BOOTSTRAP`, `RINGCAST_IFNAME`, ...), like any launcher's
//! rank. Modes:
//! * `check --rounds R --inflight K --size B`: R rounds of K operations posted at once
//!   (Broadcasts from rotating roots, Allgathers, Allgathervs with zero-sized blocks), each
//!   verified; then `STATS`.
//! * `hold --size B --hold-secs S`: a verified warm-up round, `STATS` (before), then one
//!   Allgather that the last rank posts S seconds late (so every other rank holds it open:
//!   the window the harness injects hostile packets into; rank 0 prints `HOLD seq=N` as it
//!   posts), verified, then `STATS` (after).
//! * `loop --size B --secs T`: Allgathers until one fails or T seconds pass; `RUNNING` after
//!   the first, `FAILED ...` naming the blamed rank on an error.
//! * `mix --ops N --seed S`: the tests' seeded random mix (`tests/common`: Broadcasts from
//!   any root, Allgathers, Allgathervs with zero-sized blocks, 0 B to 1 MiB, posted a few at a
//!   time and waited in a random order, or blocking), every result verified; `CHECKED`, then
//!   `STATS`. Every rank must be given the same seed.
//! * `mismatch --size B`: an erroneous program, then a correct one: a Broadcast of B bytes
//!   that the last rank posts twice as long, one for which the last rank names rank 1 the
//!   root; each must fail with `ShapeMismatch` (a `MISMATCH case=... peer=... by=... ms=...`
//!   line each), then a verified round as `check` runs it (`CHECKED`, `STATS`).
//! * `flood --ops N --size B --late-secs S`: rank 0 broadcasts N buffers of B bytes one after
//!   the other (blocking, no barrier) while every other rank starts S seconds later; every
//!   buffer is checked (`CHECKED`), then `FLOOD` gives each rank's time and peak resident
//!   memory in kB (what it kept of operations it had not posted). Run it with `RINGCAST_TCP_THRESHOLD` at or above
//!   B, so that the Broadcasts take the TCP tree.
//!
//! * `split --size B`: sub-communicators across the bridge: halves by parity (each with its
//!   own multicast groups, joined through the snooping bridge, and its own start-up check)
//!   run a Broadcast and an Allgather of B bytes per rank while the whole runs an Allgather
//!   of its own; then the ranks of this host's kernel (`split_by_host`: every namespace's
//!   rank) run a Broadcast, and a copy's (`dup`) `split_by_host` finds them all too. Each
//!   verified; `SPLIT half=RANK/SIZE host=RANK/SIZE copy_host=RANK/SIZE`, `CHECKED`.
//!
//! Exit status: 0 done, 1 a collective failed or delivered wrong bytes, 3 the communicator
//! could not be built (`BUILD_ERROR` line).

#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use ringcast::comm::{CommBuilder, CommStats, TransportMode};
use ringcast::{CommError, Communicator, Request};

#[path = "../tests/common/mod.rs"]
mod common;

fn main() -> ExitCode {
    // Under `RUST_LOG` (say `ringcast=debug`), the library's events go to stderr, which the
    // lab keeps per rank (`<tag>-rank<i>.err`).
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(mode) = args.first().cloned() else {
        eprintln!("usage: lab_rank check|hold|loop [--size B] [--rounds R] [--inflight K] ...");
        return ExitCode::from(2);
    };
    let num = |name: &str, default: u64| -> u64 {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let size = num("--size", 256 << 10) as usize;
    let started = Instant::now();
    // The lab checks multicast: small operations stay on it unless the harness says otherwise.
    let build = |b: CommBuilder| {
        if std::env::var_os("RINGCAST_TCP_THRESHOLD").is_some() {
            b.build()
        } else {
            b.tcp_threshold(0).build()
        }
    };
    let comm = match CommBuilder::from_env().and_then(build) {
        Ok(c) => c,
        Err(e) => {
            say(&format!(
                "BUILD_ERROR kind={} msg={}",
                build_kind(&e),
                one_line(&e.to_string())
            ));
            return ExitCode::from(3);
        }
    };
    say(&format!(
        "READY rank={} size={} mode={} build_ms={}",
        comm.rank(),
        comm.size(),
        mode_name(comm.transport_mode()),
        started.elapsed().as_millis()
    ));
    let r = match mode.as_str() {
        "check" => check(
            &comm,
            num("--rounds", 3),
            num("--inflight", 4) as usize,
            size,
        ),
        "hold" => hold(&comm, size, Duration::from_secs(num("--hold-secs", 2))),
        "loop" => run_loop(&comm, size, Duration::from_secs(num("--secs", 30))),
        "mismatch" => mismatch(&comm, size),
        "mix" => mix(&comm, num("--ops", 200), num("--seed", 1)),
        "split" => split(&comm, size),
        "flood" => flood(
            &comm,
            num("--ops", 20_000),
            size,
            Duration::from_secs(num("--late-secs", 4)),
        ),
        other => Err(Fail::Other(format!("unknown mode {other}"))),
    };
    match r {
        Ok(()) => {
            say(&format!("DONE rank={}", comm.rank()));
            ExitCode::SUCCESS
        }
        Err(Fail::Comm(e)) => {
            say(&format!(
                "FAILED rank={} peer={} error={} msg={}",
                comm.rank(),
                e.peer().map_or("none".to_owned(), |p| p.to_string()),
                variant(&e),
                one_line(&e.to_string())
            ));
            ExitCode::from(1)
        }
        Err(Fail::Other(m)) => {
            say(&format!("WRONG rank={} msg={}", comm.rank(), one_line(&m)));
            ExitCode::from(1)
        }
    }
}

enum Fail {
    Comm(CommError),
    Other(String),
}

impl From<CommError> for Fail {
    fn from(e: CommError) -> Self {
        Fail::Comm(e)
    }
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

fn one_line(s: &str) -> String {
    s.replace('\n', " | ")
}

/// The error's variant name (`PeerLost`, `PeerUnresponsive`, ...).
fn variant(e: &CommError) -> String {
    let d = format!("{e:?}");
    d.split([' ', '(', '{']).next().unwrap_or("").to_owned()
}

fn build_kind(e: &ringcast::BuildError) -> String {
    let d = format!("{e:?}");
    d.split([' ', '(', '{']).next().unwrap_or("").to_owned()
}

fn mode_name(m: TransportMode) -> String {
    match m {
        TransportMode::Multicast => "multicast".to_owned(),
        TransportMode::Tcp { from_op, reason } => format!("tcp(from_op={from_op},{reason:?})"),
        other => format!("{other:?}").replace(' ', ""),
    }
}

/// Rank `rank`'s bytes for `salt`: every 8-byte word differs between salts, ranks and offsets.
fn pattern(salt: u64, rank: u32, len: usize) -> Vec<u8> {
    let seed = salt.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (u64::from(rank) << 48);
    let mut v = Vec::with_capacity(len + 8);
    let mut i = 0u64;
    while v.len() < len {
        let mut z = seed ^ i;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        v.extend_from_slice(&(z ^ (z >> 31)).to_le_bytes());
        i += 1;
    }
    v.truncate(len);
    v
}

/// One posted operation and what its buffer must hold when it completes.
struct Pending {
    what: String,
    req: Request<u8>,
    want: Vec<u8>,
}

/// Operation `j` of round `round`: a Broadcast, an Allgather or an Allgatherv with zero-sized
/// blocks, by turns.
fn post(comm: &Communicator, round: u64, j: u64, size: usize) -> Result<Pending, CommError> {
    let (me, p) = (comm.rank(), comm.size());
    let salt = round * 1000 + j;
    match (round + j) % 3 {
        0 => {
            let root = ((round + j) % u64::from(p)) as u32;
            let want = pattern(salt, root, size);
            let buf = if me == root {
                want.clone()
            } else {
                vec![0; size]
            };
            Ok(Pending {
                what: format!("broadcast of {size} B from rank {root} (round {round}, op {j})"),
                req: comm.ibroadcast(root, buf)?,
                want,
            })
        }
        k => {
            let counts: Vec<usize> = (0..p)
                .map(|r| {
                    if k == 1 {
                        size / p as usize
                    } else if (u64::from(r) + round + j).is_multiple_of(3) {
                        0
                    } else {
                        // Uneven, not a multiple of the chunk size.
                        size / p as usize + 13 * r as usize
                    }
                })
                .collect();
            let want: Vec<u8> = (0..p)
                .map(|r| pattern(salt, r, counts[r as usize]))
                .collect::<Vec<_>>()
                .concat();
            let mine = pattern(salt, me, counts[me as usize]);
            let name = if k == 1 { "allgather" } else { "allgatherv" };
            Ok(Pending {
                what: format!("{name} of blocks {counts:?} (round {round}, op {j})"),
                req: comm.iallgatherv(&mine, vec![0; want.len()], &counts)?,
                want,
            })
        }
    }
}

/// Waits for `p`, checks its bytes; returns its sequence number.
fn finish(p: Pending) -> Result<u64, Fail> {
    let (got, st) = p.req.wait_with_stats()?;
    if got.len() != p.want.len() {
        return Err(Fail::Other(format!(
            "{}: {} bytes, want {}",
            p.what,
            got.len(),
            p.want.len()
        )));
    }
    if let Some(i) = got.iter().zip(&p.want).position(|(a, b)| a != b) {
        return Err(Fail::Other(format!(
            "{}: byte {i} is {:#04x}, want {:#04x}",
            p.what, got[i], p.want[i]
        )));
    }
    Ok(st.op)
}

/// Posts `inflight` operations, waits for all, checks them; the highest sequence number.
fn round(comm: &Communicator, r: u64, inflight: usize, size: usize) -> Result<u64, Fail> {
    let posted = (0..inflight as u64)
        .map(|j| post(comm, r, j, size))
        .collect::<Result<Vec<_>, _>>()?;
    let mut last = 0;
    for p in posted {
        last = last.max(finish(p)?);
    }
    Ok(last)
}

fn check(comm: &Communicator, rounds: u64, inflight: usize, size: usize) -> Result<(), Fail> {
    let t = Instant::now();
    for r in 0..rounds {
        round(comm, r, inflight, size)?;
    }
    say(&format!(
        "CHECKED rank={} ops={} ms={} lanes={}",
        comm.rank(),
        rounds * inflight as u64,
        t.elapsed().as_millis(),
        comm.lanes()
    ));
    stats(comm, "after")
}

fn mix(comm: &Communicator, ops: u64, seed: u64) -> Result<(), Fail> {
    let t = Instant::now();
    common::random_ops(comm, seed, ops).map_err(Fail::Other)?;
    say(&format!(
        "CHECKED rank={} ops={ops} ms={}",
        comm.rank(),
        t.elapsed().as_millis()
    ));
    stats(comm, "after")
}

fn split(comm: &Communicator, size: usize) -> Result<(), Fail> {
    let (me, n) = (comm.rank(), comm.size());
    let t = Instant::now();
    let sp = |e: ringcast::SplitError| Fail::Other(format!("split: {e}"));
    let half = comm
        .split(Some(me % 2), me)
        .map_err(sp)?
        .ok_or_else(|| Fail::Other("no half".into()))?;
    let members: Vec<u32> = (0..n).filter(|r| r % 2 == me % 2).collect();
    // Meanwhile, an Allgather on the whole.
    let whole_blocks: Vec<Vec<u8>> = (0..n).map(|r| pattern(90, r, size)).collect();
    let on_whole = comm.iallgather(&whole_blocks[me as usize], vec![0u8; size * n as usize])?;
    // A failure on the half names a rank of the half: said with its parent rank.
    let on_half = |what: &str| {
        let members = members.clone();
        let what = what.to_owned();
        move |f: Fail| match f {
            Fail::Comm(e) => Fail::Other(format!(
                "{what}: {e} (on the half: parent rank {})",
                e.peer()
                    .and_then(|p| members.get(p as usize))
                    .map_or("none".to_owned(), u32::to_string)
            )),
            other => other,
        }
    };
    let root_data = pattern(91 + u64::from(me % 2), members[0], size);
    broadcast_from_0(&half, &root_data, "a half's broadcast")
        .map_err(on_half("a half's broadcast"))?;
    let mut recv = vec![0u8; size * members.len()];
    half.allgather(&pattern(93, me, size), &mut recv)
        .map_err(|e| on_half("a half's allgather")(Fail::Comm(e)))?;
    let want: Vec<u8> = members.iter().flat_map(|&r| pattern(93, r, size)).collect();
    if recv != want {
        return Err(Fail::Other("a half's allgather: wrong bytes".into()));
    }
    if on_whole.wait()? != whole_blocks.concat() {
        return Err(Fail::Other("the whole's allgather: wrong bytes".into()));
    }
    let host = comm.split_by_host(me).map_err(sp)?;
    broadcast_from_0(&host, &pattern(94, 0, size), "the host part's broadcast")?;
    // A copy knows the hosts too (it was built from a peer table, which carries no ids).
    let copy_host = comm.dup().map_err(sp)?.split_by_host(me).map_err(sp)?;
    say(&format!(
        "SPLIT rank={me} half={}/{} host={}/{} copy_host={}/{} half_mode={}",
        half.rank(),
        half.size(),
        host.rank(),
        host.size(),
        copy_host.rank(),
        copy_host.size(),
        mode_name(half.transport_mode())
    ));
    say(&format!(
        "CHECKED rank={me} ops=5 ms={}",
        t.elapsed().as_millis()
    ));
    Ok(())
}

/// A Broadcast of `data` from rank 0 of `comm`, checked byte for byte (`what` names it).
fn broadcast_from_0(comm: &Communicator, data: &[u8], what: &str) -> Result<(), Fail> {
    let mut b = if comm.rank() == 0 {
        data.to_vec()
    } else {
        vec![0u8; data.len()]
    };
    comm.broadcast(0, &mut b)?;
    if b != data {
        return Err(Fail::Other(format!("{what}: wrong bytes")));
    }
    Ok(())
}

fn flood(comm: &Communicator, ops: u64, size: usize, late: Duration) -> Result<(), Fail> {
    let me = comm.rank();
    if me != 0 {
        std::thread::sleep(late);
    }
    let t = Instant::now();
    let mut buf = vec![0u8; size];
    for i in 0..ops {
        let want = (i * 31 + 7) as u8;
        if me == 0 {
            buf.fill(want);
        }
        comm.broadcast(0, &mut buf)?;
        if let Some(at) = buf.iter().position(|&b| b != want) {
            return Err(Fail::Other(format!(
                "operation {i}: byte {at} is {}, want {want}",
                buf[at]
            )));
        }
    }
    let ms = t.elapsed().as_millis();
    say(&format!("CHECKED rank={me} ops={ops} ms={ms}"));
    // Peak resident memory, in kB (`VmHWM:   12345 kB`).
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let peak = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .unwrap_or("unknown");
    say(&format!("FLOOD rank={me} ops={ops} ms={ms} peak_kb={peak}"));
    Ok(())
}

fn mismatch(comm: &Communicator, size: usize) -> Result<(), Fail> {
    let (me, last) = (comm.rank(), comm.size() - 1);
    let odd = me == last;
    let cases = [
        ("length", 0, if odd { 2 * size } else { size }),
        ("root", if odd { 1 } else { 0 }, size),
    ];
    for (case, root, len) in cases {
        let t = Instant::now();
        let buf = if me == root {
            pattern(4242, root, len)
        } else {
            vec![0; len]
        };
        match comm.ibroadcast(root, buf)?.wait() {
            Err(CommError::ShapeMismatch { peer, reported_by }) => say(&format!(
                "MISMATCH rank={me} case={case} peer={peer} by={reported_by} ms={}",
                t.elapsed().as_millis()
            )),
            Err(e) => return Err(Fail::Comm(e)),
            Ok(_) => return Err(Fail::Other(format!("{case}: completed"))),
        }
    }
    check(comm, 1, 3, size)
}

fn hold(comm: &Communicator, size: usize, hold: Duration) -> Result<(), Fail> {
    let last = round(comm, 0, 3, size)?;
    stats(comm, "before")?;
    let (me, p) = (comm.rank(), comm.size());
    if me == p - 1 {
        std::thread::sleep(hold);
    }
    let block = size / p as usize;
    if me == 0 {
        say(&format!(
            "HOLD seq={} block={block} late_rank={}",
            last + 1,
            p - 1
        ));
    }
    let want: Vec<u8> = (0..p)
        .map(|r| pattern(7777, r, block))
        .collect::<Vec<_>>()
        .concat();
    let req = comm.iallgatherv(
        &pattern(7777, me, block),
        vec![0; want.len()],
        &vec![block; p as usize],
    )?;
    let seq = finish(Pending {
        what: format!("held allgather of {block} B per rank"),
        req,
        want,
    })?;
    if seq != last + 1 {
        say(&format!(
            "NOTE held op had seq {seq}, announced {}",
            last + 1
        ));
    }
    stats(comm, "after")
}

/// Rounds until rank 0's clock says `secs` passed: after each, rank 0 broadcasts whether
/// another follows, so that every rank runs the same rounds (each rank's own clock could
/// stop one a round before the others, which would then wait on it).
fn run_loop(comm: &Communicator, size: usize, secs: Duration) -> Result<(), Fail> {
    let t = Instant::now();
    let mut r = 0;
    loop {
        round(comm, r, 2, size)?;
        if r == 0 {
            say(&format!("RUNNING rank={}", comm.rank()));
        }
        r += 1;
        let mut more = [u8::from(t.elapsed() < secs)];
        comm.broadcast(0, &mut more)?;
        if more[0] == 0 {
            break;
        }
    }
    stats(comm, "after")
}

fn stats(comm: &Communicator, when: &str) -> Result<(), Fail> {
    let s: CommStats = comm.stats()?;
    let (rx, c) = (&s.rx, &s.core);
    say(&format!(
        "STATS rank={} when={when} mode={} datagrams={} accepted={} truncated={} oversize={} \
         opcode={} pkey={} qkey={} destqp={} version={} malformed={} unknown_source={} \
         bad_icrc={} stale={} out_of_range={} duplicate={} own={} wrong_source={} \
         wrong_lane={} bad_length={} fetched={} socket_drops={} tcp_sent={} tcp_received={} \
         tcp_landed={} ops_completed={} ops_failed={} sent={} sent_in_place={}",
        comm.rank(),
        mode_name(s.mode),
        rx.datagrams,
        rx.accepted,
        rx.truncated,
        rx.oversize,
        rx.opcode,
        rx.pkey,
        rx.qkey,
        rx.destqp,
        rx.version,
        rx.malformed,
        rx.unknown_source,
        rx.bad_icrc,
        c.dropped_stale,
        c.dropped_out_of_range,
        c.dropped_duplicate,
        c.dropped_own,
        c.dropped_wrong_source,
        c.dropped_wrong_lane,
        c.dropped_bad_length,
        s.counters.chunks_fetched,
        s.socket_drops,
        s.counters.tcp_bytes_sent,
        s.counters.tcp_bytes_received,
        s.counters.tcp_bytes_landed,
        s.ops_completed,
        s.ops_failed,
        s.tx.datagrams,
        s.tx.in_place,
    ));
    Ok(())
}
