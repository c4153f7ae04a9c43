//! `ringcast demo`: Broadcast and Allgather for real, between local rank processes on loopback
//! multicast, every buffer verified byte for byte; prints throughput and the bytes each rank
//! injected next to what a binomial tree or a ring would have injected.

use crate::CmdError;
use crate::args::DemoArgs;
use crate::local::{self, LocalRanks};
use crate::net::{self, Injected, Step};
use crate::units::human;
use ringcast::{CommError, Communicator};
use serde_json::{Value, json};
use std::io::Write;
use std::process::ExitCode;
use std::time::Instant;

/// One collective of the demo.
#[derive(Clone, Copy, Debug)]
struct Op {
    broadcast: bool,
    /// Bytes: of the Broadcast, or of each rank's Allgather block.
    size: u64,
    root: u32,
}

fn ops(a: &DemoArgs) -> Vec<Op> {
    let sizes = if a.quick {
        vec![4 << 10, 64 << 10]
    } else {
        a.sizes.clone()
    };
    let mut v = Vec::new();
    for (i, &size) in sizes.iter().enumerate() {
        let root = i as u32 % a.ranks.max(1);
        v.push(Op {
            broadcast: true,
            size,
            root,
        });
        v.push(Op {
            broadcast: false,
            size,
            root: 0,
        });
    }
    v
}

/// Runs `ringcast demo`: the parent, or (with the hidden `--child`) one of its ranks.
pub(crate) fn run(a: &DemoArgs) -> Result<ExitCode, CmdError> {
    local::check_ranks(a.ranks, "--ranks")?;
    net::check_flags(&a.net)?;
    for op in ops(a) {
        net::held_bytes(op.size, a.ranks, !op.broadcast)?;
    }
    if !a.net.child {
        return parent(a);
    }
    match child(a) {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(CmdError::Output(e)) => Err(CmdError::Output(e)),
        Err(e @ (CmdError::Msg(_) | CmdError::Run(_))) => {
            local::report_error(&e)?;
            Ok(ExitCode::FAILURE)
        }
    }
}

/// A communicator error, typed: its message and its variant.
pub(crate) fn typed(what: &str, e: &CommError) -> String {
    format!("{what}: {e} ({e:?})")
}

fn child(a: &DemoArgs) -> Result<(), CmdError> {
    // The demo shows multicast at every size: small operations stay on it too.
    let comm = net::connect(&a.net, Some(0))?;
    let ops = ops(a);
    let what = |op: &Op| {
        if op.broadcast {
            format!("broadcast of {} from rank {}", human(op.size), op.root)
        } else {
            format!("allgather of {} per rank", human(op.size))
        }
    };
    let step = |op: &Op| {
        let what = what(op);
        move |e| match e {
            Step::Comm(e) => CmdError::Run(typed(&what, &e)),
            Step::Cmd(e) => e,
        }
    };
    // A verified warm-up of every collective before any is timed: in a single run the first
    // touch of fresh buffers, and the pacer's slow start (its rate doubles per round of
    // receiver reports, a few milliseconds each, from a sixteenth of the link), would weigh
    // more than the transfer; the larger operations' warm-ups bring the rate up for all.
    let mut warm = Vec::with_capacity(ops.len());
    for (k, op) in ops.iter().enumerate() {
        warm.push(one(&comm, 2 * k as u64, *op).map_err(step(op))?.2);
    }
    for ((k, op), warm) in ops.iter().enumerate().zip(warm) {
        let (secs, inj, check) = one(&comm, 2 * k as u64 + 1, *op).map_err(step(op))?;
        let check = warm.and(check);
        let body = json!({
            "op": k,
            "secs": secs,
            "datagrams": inj.datagrams,
            "payload": inj.payload,
            "wire": inj.wire,
            "served": inj.served,
            "fetched": inj.fetched,
            "mismatch": check.err(),
        });
        local::report("OP", &body.to_string())?;
    }
    // Multicast that did not work here (the start-up check's fallback, or loss past its
    // threshold) moved these over TCP: said, not shown as multicast.
    let mode = comm.transport_mode();
    if mode.is_tcp() {
        local::report("MODE", &format!("{mode:?}"))?;
    }
    Ok(())
}

/// What a receive buffer holds before the collective: written, so that its pages are in
/// memory before the clock starts (a fresh zeroed allocation is mapped lazily, and the
/// kernel's copy would first fault every page in), and not zero, so that a byte never written
/// shows.
const UNTOUCHED: u8 = 0xA5;

/// Waits for every rank to be done with the collective before this one checks its buffer:
/// a rank checking (a CPU-bound pass over the buffer) while another still waits for its last
/// control message took the CPU that message needed (4 ranks on 2 cores: a final `FIN` 2 ms
/// late, twice a 1 MiB Broadcast's time).
fn settle(comm: &Communicator) -> Result<(), Step> {
    Ok(comm.barrier()?)
}

/// Runs one collective after a barrier: its time on this rank, what this rank injected, and
/// whether its buffer holds what it must. Buffers are allocated fallibly: a size this rank
/// cannot hold is an error naming `--sizes`, not an abort.
fn one(
    comm: &Communicator,
    salt: u64,
    op: Op,
) -> Result<(f64, Injected, Result<(), String>), Step> {
    let (me, p) = (comm.rank(), comm.size());
    // `run` checked that size x ranks fits in a buffer.
    let n = op.size as usize;
    // Every buffer is made before the barrier: made after it, a rank that made its buffers
    // sooner would start its clock and then wait for the others' to be made.
    if op.broadcast {
        let want = net::pattern(salt, op.root, op.size)?;
        let buf = if me == op.root {
            net::pattern(salt, op.root, op.size)?
        } else {
            net::buffer(op.size, UNTOUCHED)?
        };
        comm.barrier()?;
        let s0 = comm.stats()?;
        let t0 = Instant::now();
        let got = comm.ibroadcast(op.root, buf)?.wait()?;
        let secs = t0.elapsed().as_secs_f64();
        let inj = Injected::between(&s0, &comm.stats()?);
        settle(comm)?;
        Ok((secs, inj, net::verify("broadcast", &got, &want, &[n])))
    } else {
        let mine = net::pattern(salt, me, op.size)?;
        let recv = net::buffer(net::held_bytes(op.size, p, true)?, UNTOUCHED)?;
        comm.barrier()?;
        let s0 = comm.stats()?;
        let t0 = Instant::now();
        let got = comm.iallgather(&mine, recv)?.wait()?;
        let secs = t0.elapsed().as_secs_f64();
        let inj = Injected::between(&s0, &comm.stats()?);
        settle(comm)?;
        let sizes = vec![n; p as usize];
        Ok((
            secs,
            inj,
            net::verify_gathered("allgather", &got, salt, &sizes),
        ))
    }
}

fn parent(a: &DemoArgs) -> Result<ExitCode, CmdError> {
    let ops = ops(a);
    let p = a.ranks;
    // What a rank holds at once (see `one`): a Broadcast's buffer and its expected bytes, an
    // Allgather's receive buffer, its own block and one block of expected bytes.
    let held = ops
        .iter()
        .map(|op| {
            let blocks = if op.broadcast { 2 } else { u64::from(p) + 2 };
            op.size.saturating_mul(blocks)
        })
        .max()
        .unwrap_or(0);
    local::check_memory(p, held, "--sizes / --ranks")?;
    for op in &ops {
        net::check_chunks(&a.net, op.size, p, !op.broadcast)?;
    }
    let ranks = LocalRanks::spawn(p)?;
    let mut out = std::io::stdout().lock();
    let mut put = |s: String| {
        writeln!(out, "{s}")
            .and_then(|()| out.flush())
            .map_err(CmdError::Output)
    };
    put(format!(
        "ringcast demo: {p} rank process{} on loopback multicast (127.0.0.1), every buffer \
         verified byte for byte",
        if p == 1 { "" } else { "es" }
    ))?;
    put(String::new())?;
    put(format!(
        "{:<10} {:>10} {:>10} {:>10}  {:<8} {:<40} {}",
        "op", "size", "time", "algbw", "check", "injected (wire bytes)", "a peer-to-peer algorithm"
    ))?;
    let mut got: Vec<Vec<Option<Value>>> = vec![vec![None; p as usize]; ops.len()];
    let mut bad = Vec::new();
    let mut worst_overhead = 0f64;
    let mut tcp = None;
    let result = ranks.drive(a.net.timeout, |r, tag, body| {
        if tag == "MODE" {
            tcp.get_or_insert_with(|| body.to_owned());
            return Ok(());
        }
        if tag != "OP" {
            return Ok(());
        }
        let v: Value =
            serde_json::from_str(body).map_err(|e| format!("rank {r}: bad report: {e}"))?;
        let k = v["op"].as_u64().unwrap_or(u64::MAX) as usize;
        let Some(slot) = got.get_mut(k).and_then(|o| o.get_mut(r as usize)) else {
            return Err(format!("rank {r}: report for unknown op {k}").into());
        };
        *slot = Some(v);
        if got[k].iter().all(Option::is_some) {
            let reports: Vec<&Value> = got[k].iter().flatten().collect();
            let (line, errs, overhead) = row(p, ops[k], &reports);
            bad.extend(errs);
            worst_overhead = worst_overhead.max(overhead);
            put(line)?;
        }
        Ok(())
    });
    result?;
    if !bad.is_empty() {
        return Err(CmdError::Run(format!(
            "verification failed:\n  {}",
            bad.join("\n  ")
        )));
    }
    put(String::new())?;
    match &tcp {
        Some(mode) => put(format!(
            "ok: {} collectives on {p} ranks, verified byte for byte, but over TCP, not \
             multicast: multicast did not work here and RINGCAST_FALLBACK=tcp let them fall \
             back ({mode}; RUST_LOG=warn says why).",
            ops.len()
        ))?,
        None if p == 1 => put(format!(
            "ok: {} collectives on one rank, verified byte for byte; alone, it sent nothing.",
            ops.len()
        ))?,
        None => put(format!(
            "ok: {} collectives on {p} ranks, verified byte for byte; each rank injected its \
             own data once, plus at most {:.1}% headers (RoCEv2 BTH+DETH+ImmDt+ICRC, IPv4, \
             UDP).",
            ops.len(),
            worst_overhead * 100.0
        ))?,
    }
    put(
        "time: the slowest rank's, from a barrier to its completion, after a verified warm-up \
         run of every collective (also checked above; it brings the pacer past its slow start); \
         algbw = bytes a rank ends with / time \
         (1 GB/s = 1e9 B/s; Allgather: all P blocks, as nccl-tests counts)."
            .into(),
    )?;
    Ok(ExitCode::SUCCESS)
}

/// One table line for an operation from every rank's report; the mismatches; and the largest
/// share of headers in what a rank injected.
fn row(p: u32, op: Op, reports: &[&Value]) -> (String, Vec<String>, f64) {
    let f = |v: &Value, k: &str| v[k].as_u64().unwrap_or(0);
    let secs = reports
        .iter()
        .map(|v| v["secs"].as_f64().unwrap_or(0.0))
        .fold(0.0, f64::max);
    let errs: Vec<String> = reports
        .iter()
        .enumerate()
        .filter_map(|(r, v)| v["mismatch"].as_str().map(|m| format!("rank {r}: {m}")))
        .collect();
    let wire: Vec<u64> = reports.iter().map(|v| f(v, "wire")).collect();
    let overhead = reports
        .iter()
        .filter(|v| f(v, "payload") > 0)
        .map(|v| (f(v, "wire") - f(v, "payload")) as f64 / f(v, "payload") as f64)
        .fold(0.0, f64::max);
    let delivered = if op.broadcast {
        op.size
    } else {
        op.size * u64::from(p)
    };
    let algbw = if secs > 0.0 {
        delivered as f64 / secs / 1e9
    } else {
        0.0
    };
    let check = if errs.is_empty() { "ok" } else { "MISMATCH" };
    let (name, size, injected, other) = if op.broadcast {
        let tree = net::binomial_bcast(p, op.root, op.size);
        let sends: Vec<String> = tree
            .iter()
            .enumerate()
            .filter(|(_, b)| **b > 0)
            .map(|(r, b)| format!("r{r} {}", human(*b)))
            .collect();
        let others = if wire
            .iter()
            .enumerate()
            .all(|(r, w)| r as u32 == op.root || *w == 0)
        {
            "others 0 B".to_owned()
        } else {
            per_rank(&wire)
        };
        (
            "broadcast".to_owned(),
            human(op.size),
            format!(
                "root r{} {}, {others}",
                op.root,
                human(wire[op.root as usize])
            ),
            if sends.is_empty() {
                "binomial tree: nothing to send".to_owned()
            } else {
                format!(
                    "binomial tree: {} (total {})",
                    sends.join(", "),
                    human(tree.iter().sum())
                )
            },
        )
    } else {
        let ring = u64::from(p.saturating_sub(1)) * op.size;
        let (lo, hi) = (
            wire.iter().copied().min().unwrap_or(0),
            wire.iter().copied().max().unwrap_or(0),
        );
        let each = if lo == hi {
            format!("{} each", human(hi))
        } else {
            format!("{}..{} per rank", human(lo), human(hi))
        };
        (
            "allgather".to_owned(),
            format!("{}/rank", human(op.size)),
            format!("{each} (own {})", human(op.size)),
            format!("ring: {} each ((P-1) x own)", human(ring)),
        )
    };
    let line = format!(
        "{name:<10} {size:>10} {:>10} {:>10}  {check:<8} {injected:<40} {other}",
        ms(secs),
        if algbw < 0.1 {
            format!("{:.1} MB/s", algbw * 1e3)
        } else {
            format!("{algbw:.2} GB/s")
        },
    );
    (line, errs, overhead)
}

fn per_rank(v: &[u64]) -> String {
    v.iter()
        .enumerate()
        .map(|(r, b)| format!("r{r} {}", human(*b)))
        .collect::<Vec<_>>()
        .join(", ")
}

fn ms(secs: f64) -> String {
    if secs < 0.01 {
        format!("{:.2} ms", secs * 1e3)
    } else {
        format!("{:.1} ms", secs * 1e3)
    }
}
