//! `ringcast bench {bcast,allgather,allgatherv}`: OSU-style latency table with nccl-tests'
//! algbw/busbw, under a launcher or with `--local N` rank processes.
//!
//! With `--warmup` above 0 the collective first runs at the largest size for
//! [`PACER_WARMUP`] (untimed), so that no size is timed while the pacer is in its slow start.
//! Every size runs once verified byte for byte, then `--warmup` untimed iterations, then
//! `--iters` timed ones, each after a barrier (a one-byte Allgather, untimed). An iteration's
//! latency is the slowest rank's time: every rank's times reach rank 0 through an Allgather of
//! `f64`s over the communicator itself; avg/min/max are over iterations of that maximum. The
//! bytes each rank injected come from its transport counters around the untimed iterations
//! (the verified one and the warm-ups), so that nothing but the barrier comes between a timed
//! iteration and the one before.

use crate::CmdError;
use crate::args::{BenchArgs, Collective, Dtype};
use crate::demo_cmd::typed;
use crate::local::{self, LocalRanks};
use crate::net::{self, Injected, Step};
use bytemuck::Pod;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use ringcast::{CommError, Communicator};
use serde_json::{Value, json};
use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// Counters appended to each rank's timings in the gather.
const EXTRA: usize = 6;

/// How long the pacer's warm-up runs the largest size (see [`warm_pacer`]).
const PACER_WARMUP: Duration = Duration::from_millis(100);
/// The most operations the pacer's warm-up runs.
const PACER_WARMUP_OPS: u32 = 200;

/// Most iterations `--iters` and `--warmup` may ask for each (every rank keeps a time per
/// timed iteration, and every rank gathers every rank's).
const MAX_ITERS: u32 = 10_000_000;

/// What is wrong with the flags that needs no other rank to tell.
fn check(a: &BenchArgs) -> Result<(), CmdError> {
    if a.iters == 0 {
        return Err("--iters must be at least 1".into());
    }
    for (flag, n) in [("--iters", a.iters), ("--warmup", a.warmup)] {
        if n > MAX_ITERS {
            return Err(format!("{flag} {n} is more than {MAX_ITERS}").into());
        }
    }
    net::check_flags(&a.net)?;
    let elem = a.dtype.size();
    if let Some(&size) = a.sizes.iter().find(|&&s| s % elem != 0) {
        return Err(format!(
            "--sizes {size}: not a multiple of --dtype {}'s {elem} bytes",
            a.dtype.name()
        )
        .into());
    }
    Ok(())
}

/// Most bytes of timings a rank gathers (every rank's time of every timed iteration).
const MAX_TIMINGS: u64 = 1 << 30;

/// What is wrong with the flags on `ranks` ranks: a size that does not fit in a buffer (naming
/// `--sizes`), or more timings than a rank should gather (naming `--iters`).
fn check_for(a: &BenchArgs, ranks: u32) -> Result<(), CmdError> {
    for &size in &a.sizes {
        net::held_bytes(size, ranks, a.collective != Collective::Bcast)?;
    }
    let timings = timing_bytes(a, ranks);
    if timings > MAX_TIMINGS {
        return Err(format!(
            "--iters {} on {ranks} ranks: every rank would gather {} of timings, more than {}; \
             use fewer --iters",
            a.iters,
            crate::units::human(timings),
            crate::units::human(MAX_TIMINGS)
        )
        .into());
    }
    Ok(())
}

/// The bytes of timings a rank gathers on `ranks` ranks: every rank's time of every timed
/// iteration. At most (10^7 + 6) * 8 * 2^32: no overflow.
fn timing_bytes(a: &BenchArgs, ranks: u32) -> u64 {
    (u64::from(a.iters) + EXTRA as u64) * 8 * u64::from(ranks)
}

/// Bytes a rank of `ranks` holds at once for the largest size: a Broadcast's buffer and the
/// expected pattern; an Allgather(v)'s receive buffer, its own block and one block of
/// expected bytes (an Allgatherv's largest block is under twice the size); and every rank's
/// time of every timed iteration, which each rank gathers.
fn held(a: &BenchArgs, ranks: u32) -> u64 {
    let largest = a.sizes.iter().copied().max().unwrap_or(0);
    let buffers = match a.collective {
        Collective::Bcast => largest.saturating_mul(2),
        _ => largest.saturating_mul(u64::from(ranks).saturating_add(4)),
    };
    buffers.saturating_add(timing_bytes(a, ranks))
}

/// Runs `ringcast bench`: the parent of a local run, one of its ranks, or a launcher's rank.
pub(crate) fn run(a: &BenchArgs) -> Result<ExitCode, CmdError> {
    check(a)?;
    if a.net.child {
        return match rank(a, true) {
            Ok(()) => Ok(ExitCode::SUCCESS),
            Err(CmdError::Output(e)) => Err(CmdError::Output(e)),
            Err(e @ (CmdError::Msg(_) | CmdError::Run(_))) => {
                local::report_error(&e)?;
                Ok(ExitCode::FAILURE)
            }
        };
    }
    match a.local {
        Some(n) => parent(a, n),
        None => rank(a, false).map(|()| ExitCode::SUCCESS),
    }
}

/// What rank 0 renders: the table (with a progress bar) or, at the end, one JSON document.
struct Output {
    json: bool,
    /// The job's multicast lanes, once rank 0 said.
    lanes: Option<u64>,
    /// Its Allgather chains, said with the lanes.
    chains: Option<u64>,
    /// The TCP threshold in effect, said with the lanes.
    tcp_threshold: Option<u64>,
    /// The chunk size (payload bytes per datagram), said with the lanes.
    chunk: Option<u64>,
    /// The table's column line, printed once right above the first row (after the lanes).
    columns: Option<String>,
    rows: Vec<Value>,
    bar: ProgressBar,
    out: std::io::StdoutLock<'static>,
}

impl Output {
    fn new(a: &BenchArgs, ranks: u32, launch: &str) -> Result<Self, CmdError> {
        // Both at most MAX_ITERS: no overflow.
        let ticks = a.sizes.len() as u64 * (1 + u64::from(a.warmup) + u64::from(a.iters));
        let target = if a.json || !std::io::stderr().is_terminal() {
            ProgressDrawTarget::hidden()
        } else {
            ProgressDrawTarget::stderr()
        };
        let bar = ProgressBar::with_draw_target(Some(ticks), target);
        if let Ok(s) = ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {wide_bar} {pos}/{len} iterations {msg}",
        ) {
            bar.set_style(s);
        }
        let mut o = Output {
            json: a.json,
            lanes: None,
            chains: None,
            tcp_threshold: None,
            chunk: None,
            columns: None,
            rows: Vec::new(),
            bar,
            out: std::io::stdout().lock(),
        };
        if !a.json {
            let busbw = match a.collective {
                Collective::Bcast => "busbw = algbw",
                _ => "busbw = algbw * (P-1)/P",
            };
            let peer = match a.collective {
                Collective::Bcast => "binomial(B): the busiest rank of a binomial tree",
                _ => {
                    "ring(B): the busiest rank of a ring, every block but its successor's \
                     ((P-1) x the block when all are equal)"
                }
            };
            o.line(&format!(
                "# ringcast bench {}: {ranks} ranks ({launch}), {} verified + {} warm-up + {} \
                 timed iterations per size, {} calls on {} buffers{}",
                name(a.collective),
                1,
                a.warmup,
                a.iters,
                calls(a),
                a.dtype.name(),
                if a.huge_pages {
                    " (ringcast::alloc_buffer: huge pages)"
                } else {
                    ""
                }
            ))?;
            if a.warmup > 0 {
                o.line(&format!(
                    "# Before the first size: the largest for {} ms, untimed (the pacer's slow \
                     start)",
                    PACER_WARMUP.as_millis()
                ))?;
            }
            o.line(
                "# Latency: per iteration the slowest rank's time; avg/min/max over iterations",
            )?;
            o.line(&format!(
                "# algbw = S / avg latency, GB/s = 1e9 B/s, S = {}; {busbw}",
                match a.collective {
                    Collective::Bcast => "the buffer",
                    _ => "all blocks gathered",
                }
            ))?;
            o.line(&format!(
                "# inject(B): the busiest rank's bytes on the wire per iteration, counted over \
                 the untimed ones (headers included; TCP: data only); {peer}; `tcp`: the size ran over TCP \
                 (--tcp-threshold)"
            ))?;
            o.columns = Some(format!(
                "{:<10}{:>18}{:>18}{:>18}{:>12}{:>14}{:>14}{:>14}{:>14}",
                "# Size",
                "Avg Latency(us)",
                "Min Latency(us)",
                "Max Latency(us)",
                "Iterations",
                "algbw(GB/s)",
                "busbw(GB/s)",
                "inject(B)",
                if a.collective == Collective::Bcast {
                    "binomial(B)"
                } else {
                    "ring(B)"
                }
            ));
        }
        Ok(o)
    }

    /// The column line, if not printed yet.
    fn columns(&mut self) -> Result<(), CmdError> {
        match self.columns.take() {
            Some(c) => self.line(&c),
            None => Ok(()),
        }
    }

    fn line(&mut self, s: &str) -> Result<(), CmdError> {
        self.bar.suspend(|| {
            writeln!(self.out, "{s}")
                .and_then(|()| self.out.flush())
                .map_err(CmdError::Output)
        })
    }

    /// Rank 0's lane count, Allgather chains, TCP threshold and chunk size (`body`: `LANES
    /// CHAINS THRESHOLD CHUNK`), printed before the first row.
    fn lanes(&mut self, body: &str) -> Result<(), CmdError> {
        let bad = || format!("bad lane count, chains, TCP threshold and chunk {body:?}");
        let n: Vec<u64> = body
            .split(' ')
            .map(str::parse)
            .collect::<Result<_, _>>()
            .map_err(|_| bad())?;
        let &[l, c, t, k] = &n[..] else {
            return Err(bad().into());
        };
        (self.lanes, self.chains, self.tcp_threshold, self.chunk) =
            (Some(l), Some(c), Some(t), Some(k));
        if self.json {
            return Ok(());
        }
        self.line(&format!(
            "# multicast lanes: {l} (--lanes or RINGCAST_LANES; by default from the cores); \
             Allgather roots at once: {c} (RINGCAST_CHAINS; by default from the cores)"
        ))?;
        self.line(&format!(
            "# chunks: {k} B of payload a datagram (RINGCAST_CHUNK_SIZE; by default 4 KiB within \
             the interface's MTU, {} on loopback)",
            ringcast::comm::LOOPBACK_CHUNK
        ))?;
        let tcp = if t == 0 {
            // `--tcp-threshold 0`, or no TCP path to take (one rank).
            "none: every operation goes to multicast".to_owned()
        } else {
            format!("operations of at most {t} B")
        };
        self.line(&format!(
            "# over TCP: {tcp} (--tcp-threshold or RINGCAST_TCP_THRESHOLD; by default {} \
             with every rank on one host, else {}; none for one rank)",
            crate::units::human(ringcast::comm::ONE_HOST_TCP_THRESHOLD),
            crate::units::human(ringcast::comm::DEFAULT_TCP_THRESHOLD),
        ))?;
        self.columns()
    }

    fn row(&mut self, v: Value) -> Result<(), CmdError> {
        if !self.json {
            self.columns()?;
            let f = |k: &str| v[k].as_f64().unwrap_or(0.0);
            let max_u = |k: &str| {
                v[k].as_array()
                    .map_or(0, |a| a.iter().filter_map(Value::as_u64).max().unwrap_or(0))
            };
            // A size whose operations ran over TCP (at or below the TCP threshold) is marked.
            let tcp = if max_u("tcp_per_rank") > 0 {
                " tcp"
            } else {
                ""
            };
            let s = format!(
                "{:<10}{:>18.2}{:>18.2}{:>18.2}{:>12}{:>14.2}{:>14.2}{:>14}{:>14}{tcp}",
                v["size"].as_u64().unwrap_or(0),
                f("avg_us"),
                f("min_us"),
                f("max_us"),
                v["iterations"].as_u64().unwrap_or(0),
                f("algbw_gbs"),
                f("busbw_gbs"),
                max_u("injected_per_rank"),
                max_u("p2p_per_rank"),
            );
            self.line(&s)?;
        }
        self.rows.push(v);
        Ok(())
    }

    fn finish(mut self, a: &BenchArgs, ranks: u32, launch: &str) -> Result<(), CmdError> {
        self.bar.finish_and_clear();
        if !self.json {
            return Ok(());
        }
        let doc = json!({
            "benchmark": "ringcast",
            "collective": name(a.collective),
            "ranks": ranks,
            "launch": launch,
            "warmup": a.warmup,
            "pacer_warmup_ms": if a.warmup > 0 { PACER_WARMUP.as_millis() } else { 0 },
            "blocking": a.blocking,
            "in_place": a.in_place,
            "huge_pages": a.huge_pages,
            "dtype": a.dtype.name(),
            "iters": a.iters,
            "lanes": self.lanes,
            "allgather_chains": self.chains,
            "tcp_threshold": self.tcp_threshold,
            "chunk_size": self.chunk,
            "latency": "per iteration the slowest rank's time (us); avg/min/max over iterations",
            "injected": "bytes per iteration each rank put on the wire, counted over the \
                         untimed iterations (the verified one and the warm-ups)",
            "algbw": "S / avg latency in GB/s (1e9 B/s); S = the buffer (bcast) or all blocks",
            "busbw": match a.collective {
                Collective::Bcast => "algbw",
                _ => "algbw * (P-1)/P",
            },
            "p2p": match a.collective {
                Collective::Bcast => "binomial tree, bytes each rank sends",
                _ => "ring, bytes each rank sends: every block but its successor's",
            },
            "results": self.rows,
        });
        serde_json::to_writer_pretty(&mut self.out, &doc)
            .map_err(std::io::Error::from)
            .and_then(|()| writeln!(self.out))
            .and_then(|()| self.out.flush())
            .map_err(CmdError::Output)
    }
}

fn name(c: Collective) -> &'static str {
    match c {
        Collective::Bcast => "bcast",
        Collective::Allgather => "allgather",
        Collective::Allgatherv => "allgatherv",
    }
}

fn parent(a: &BenchArgs, n: u32) -> Result<ExitCode, CmdError> {
    local::check_ranks(n, "--local")?;
    check_for(a, n)?;
    local::check_memory(n, held(a, n), "--sizes / --iters / --local")?;
    for &size in &a.sizes {
        net::check_chunks(&a.net, size, n, a.collective != Collective::Bcast)?;
    }
    let ranks = LocalRanks::spawn(n)?;
    let launch = "local processes, loopback multicast";
    let mut o = Output::new(a, n, launch)?;
    ranks.drive(a.net.timeout, |r, tag, body| {
        match (r, tag) {
            (0, "TICK") => o.bar.inc(1),
            (0, "SIZE") => o.bar.set_message(body.to_owned()),
            (0, "LANES") => o.lanes(body)?,
            (0, "ROW") => {
                let v = serde_json::from_str(body).map_err(|e| format!("bad row: {e}"))?;
                o.row(v)?;
            }
            _ => {}
        }
        Ok(())
    })?;
    o.finish(a, n, launch)?;
    Ok(ExitCode::SUCCESS)
}

/// What a rank hands on: rank 0 of a launcher's job renders, a local rank reports to its
/// parent, the others stay quiet.
enum Sink {
    Quiet,
    Parent,
    Render(Box<Output>),
}

impl Sink {
    fn emit(&mut self, tag: &str, body: &str) -> Result<(), CmdError> {
        match self {
            Sink::Quiet => Ok(()),
            Sink::Parent => local::report(tag, body),
            Sink::Render(o) => match tag {
                "TICK" => {
                    o.bar.inc(1);
                    Ok(())
                }
                "SIZE" => {
                    o.bar.set_message(body.to_owned());
                    Ok(())
                }
                "ROW" => o.row(serde_json::from_str(body).map_err(|e| e.to_string())?),
                "LANES" => o.lanes(body),
                _ => Ok(()),
            },
        }
    }
}

fn rank(a: &BenchArgs, child: bool) -> Result<(), CmdError> {
    // Under a launcher, before meeting anyone: the ranks this host runs, each holding its
    // buffers (a local run's parent checked them all).
    let job = ringcast::bootstrap::JobEnv::from_env();
    if !child && let Ok(job) = &job {
        let here = job.local_size.unwrap_or(1).max(1);
        local::check_memory(here, held(a, job.world_size), "--sizes / --iters")?;
    }
    // Only where no launcher started this process: under one, the setting named is what is
    // wrong.
    let no_launcher = matches!(job, Err(ringcast::bootstrap::EnvError::NoLauncher));
    let comm = net::connect(&a.net, None).map_err(|e| {
        if child || !no_launcher {
            e
        } else {
            format!("{e}\n(or pass --local N to spawn N local ranks)")
        }
    })?;
    check_for(a, comm.size())?;
    let launch = "launcher's environment, one rank per process";
    let mut sink = match (comm.rank(), child) {
        (0, true) => Sink::Parent,
        (0, false) => Sink::Render(Box::new(Output::new(a, comm.size(), launch)?)),
        _ => Sink::Quiet,
    };
    sink.emit(
        "LANES",
        &format!(
            "{} {} {} {}",
            comm.lanes(),
            comm.allgather_chains(),
            comm.tcp_threshold(),
            comm.chunk_size()
        ),
    )?;
    if a.warmup > 0 {
        warm_pacer(&comm, a).map_err(|e| match e {
            Step::Comm(e) => CmdError::Run(typed("the pacer's warm-up", &e)),
            Step::Cmd(e) => e,
        })?;
    }
    for (si, &size) in a.sizes.iter().enumerate() {
        sink.emit("SIZE", &crate::units::human(size))?;
        let what = format!("{} of {size} B per rank", name(a.collective));
        let row = match a.dtype {
            Dtype::U8 => one_size::<u8>(&comm, a, si as u64, size, &mut sink),
            Dtype::F16 | Dtype::Bf16 => one_size::<u16>(&comm, a, si as u64, size, &mut sink),
            Dtype::F32 => one_size::<f32>(&comm, a, si as u64, size, &mut sink),
            Dtype::F64 => one_size::<f64>(&comm, a, si as u64, size, &mut sink),
            Dtype::I32 => one_size::<i32>(&comm, a, si as u64, size, &mut sink),
            Dtype::I64 => one_size::<i64>(&comm, a, si as u64, size, &mut sink),
        };
        let row = row.map_err(|e| match e {
            Step::Comm(e) => CmdError::Run(typed(&what, &e)),
            Step::Cmd(e) => e,
        })?;
        if let Some(row) = row {
            sink.emit("ROW", &row.to_string())?;
        }
    }
    if let Sink::Render(o) = sink {
        o.finish(a, comm.size(), launch)?;
    }
    Ok(())
}

/// The buffers of one collective, reused across iterations; `counts` in elements.
enum Bufs<T> {
    Bcast(Vec<T>),
    Gather {
        send: Vec<T>,
        recv: Vec<T>,
        counts: Vec<usize>,
    },
}

impl<T: Pod> Bufs<T> {
    fn run(self, comm: &Communicator, a: &BenchArgs) -> Result<Self, CommError> {
        if a.blocking {
            return Ok(match self {
                Bufs::Bcast(mut b) => {
                    comm.broadcast(0, &mut b)?;
                    Bufs::Bcast(b)
                }
                Bufs::Gather {
                    send,
                    mut recv,
                    counts,
                } => {
                    comm.allgatherv(&send, &mut recv, &counts)?;
                    Bufs::Gather { send, recv, counts }
                }
            });
        }
        Ok(match self {
            Bufs::Bcast(b) => Bufs::Bcast(comm.ibroadcast(0, b)?.wait()?),
            Bufs::Gather { send, recv, counts } => {
                let recv = if a.in_place {
                    // This rank's block is in place: put there before the first run, and
                    // left as it was by every run since.
                    comm.iallgatherv_in_place(recv, &counts)?.wait()?
                } else {
                    comm.iallgatherv(&send, recv, &counts)?.wait()?
                };
                Bufs::Gather { send, recv, counts }
            }
        })
    }
}

/// Which calls `bench` times, in words.
fn calls(a: &BenchArgs) -> &'static str {
    match (a.blocking, a.in_place) {
        (true, _) => "blocking",
        (false, true) => "non-blocking in-place",
        (false, false) => "non-blocking",
    }
}

/// One size's buffers on this rank, and their shape.
struct SizeBufs<T> {
    bufs: Bufs<T>,
    /// The whole buffer's bytes.
    total: u64,
    /// Every block's bytes.
    blocks: Vec<u64>,
    /// The same, as counts (what is verified).
    counts: Vec<usize>,
}

/// The buffers of `size` (per rank) for this rank, its data drawn from `salt`.
fn buffers<T: Pod>(
    comm: &Communicator,
    a: &BenchArgs,
    salt: u64,
    size: u64,
) -> Result<SizeBufs<T>, Step> {
    let (me, p) = (comm.rank(), comm.size());
    // Every size is a multiple of it (`check`).
    let elem = std::mem::size_of::<T>() as u64;
    // Every size was checked against the ranks (`check_for`): the total fits in a buffer.
    let total = net::held_bytes(size, p, a.collective != Collective::Bcast)?;
    let blocks: Vec<u64> = match a.collective {
        Collective::Bcast => vec![size],
        Collective::Allgather => vec![size; p as usize],
        Collective::Allgatherv => net::uneven_blocks(p, size / elem)
            .ok_or_else(|| format!("--sizes {size}: too large"))?
            .into_iter()
            .map(|b| b * elem)
            .collect(),
    };
    // In bytes (what is verified), and in elements (what the calls take).
    let counts: Vec<usize> = blocks.iter().map(|&b| b as usize).collect();
    let elems: Vec<usize> = counts.iter().map(|&b| b / elem as usize).collect();
    // Zeroed, or this rank's pattern: `len` bytes as `T`s, from the allocator asked for.
    let buf = |len: u64, pattern: Option<u32>| -> Result<Vec<T>, String> {
        let mut v = if a.huge_pages {
            usize::try_from(len / elem)
                .ok()
                .and_then(|n| ringcast::alloc_buffer(n).ok())
                .ok_or_else(|| format!("cannot allocate a buffer of {len} B on this rank"))?
        } else {
            net::zeroed::<T>(len)?
        };
        if let Some(rank) = pattern {
            net::pattern_into(salt, rank, bytemuck::cast_slice_mut(&mut v));
        }
        Ok(v)
    };
    let bufs = match a.collective {
        Collective::Bcast => Bufs::Bcast(buf(size, (me == 0).then_some(0))?),
        _ => {
            let send = buf(blocks[me as usize], Some(me))?;
            let mut recv = buf(total, None)?;
            if a.in_place {
                let at: usize = elems[..me as usize].iter().sum();
                recv[at..at + send.len()].copy_from_slice(&send);
            }
            Bufs::Gather {
                send,
                recv,
                counts: elems,
            }
        }
    };
    Ok(SizeBufs {
        bufs,
        total,
        blocks,
        counts,
    })
}

/// Takes the pacer past its slow start before anything is timed: a communicator's multicast
/// starts at a sixteenth of the link rate and doubles per round of receiver reports (one
/// every 5 ms), a one-off cost of its first traffic, as connection set-up is an MPI job's.
/// Untimed, it would be paid by whichever sizes come first (a 256 KiB Broadcast timed at
/// twice its warm time on loopback, BENCHMARKS.md, twenty-sixth round). Runs the collective
/// at the largest size for [`PACER_WARMUP`] by rank 0's clock (at most [`PACER_WARMUP_OPS`]
/// times), rank 0 telling the others after each run whether to go on.
fn warm_pacer(comm: &Communicator, a: &BenchArgs) -> Result<(), Step> {
    let Some(&size) = a.sizes.iter().max() else {
        return Ok(());
    };
    let mut bufs = buffers::<u8>(comm, a, u64::MAX, size)?.bufs;
    let t0 = Instant::now();
    for n in 1.. {
        bufs = bufs.run(comm, a)?;
        let mut go = [u8::from(
            t0.elapsed() < PACER_WARMUP && n < PACER_WARMUP_OPS,
        )];
        comm.broadcast(0, &mut go)?;
        if go[0] == 0 {
            break;
        }
    }
    Ok(())
}

/// One size on this rank; rank 0 returns the row.
fn one_size<T: Pod>(
    comm: &Communicator,
    a: &BenchArgs,
    salt: u64,
    size: u64,
    sink: &mut Sink,
) -> Result<Option<Value>, Step> {
    let (me, p) = (comm.rank(), comm.size());
    let SizeBufs {
        mut bufs,
        total,
        blocks,
        counts,
    } = buffers::<T>(comm, a, salt, size)?;
    // What this rank puts on the wire is counted over the untimed runs (the verified one and
    // the warm-ups): counting it around a timed one took a round trip to the engine between
    // the barrier and the clock's start, which staggered the ranks' starts by up to 0.2 ms.
    let s0 = comm.stats()?;
    bufs = bufs.run(comm, a)?;
    let checked = match &bufs {
        Bufs::Bcast(b) => net::verify(
            "bcast",
            bytemuck::cast_slice(b),
            &net::pattern::<u8>(salt, 0, size)?,
            &counts,
        ),
        Bufs::Gather { recv, .. } => net::verify_gathered(
            name(a.collective),
            bytemuck::cast_slice(recv),
            salt,
            &counts,
        ),
    };
    checked.map_err(CmdError::Run)?;
    sink.emit("TICK", "")?;
    for _ in 0..a.warmup {
        bufs = bufs.run(comm, a)?;
        sink.emit("TICK", "")?;
    }
    let inj = Injected::between(&s0, &comm.stats()?);
    let counted = f64::from(a.warmup) + 1.0;
    let per = u64::from(a.iters) + EXTRA as u64;
    let timings = |n: u64| {
        net::try_filled(n, 0f64).ok_or_else(|| {
            format!(
                "cannot allocate the timings of --iters {} on {p} ranks: use fewer --iters",
                a.iters
            )
        })
    };
    // Allocated up front, so that a short memory shows before the first timed iteration.
    let mut all = timings(per * u64::from(p))?;
    let mut mine = timings(per)?;
    mine.clear();
    for _ in 0..a.iters {
        comm.barrier()?;
        let t0 = Instant::now();
        bufs = bufs.run(comm, a)?;
        mine.push(t0.elapsed().as_secs_f64());
        sink.emit("TICK", "")?;
    }
    mine.extend([
        inj.wire as f64 / counted,
        inj.payload as f64 / counted,
        inj.datagrams as f64 / counted,
        inj.served as f64 / counted,
        inj.fetched as f64 / counted,
        inj.tcp as f64 / counted,
    ]);
    comm.allgather(&mine, &mut all)?;
    if me != 0 {
        return Ok(None);
    }
    Ok(Some(summarize(a, p, size, total, &blocks, &all)))
}

/// Rank 0's row from every rank's timings and counters.
fn summarize(a: &BenchArgs, p: u32, size: u64, total: u64, blocks: &[u64], all: &[f64]) -> Value {
    let n = a.iters as usize;
    let per = n + EXTRA;
    let ranks: Vec<&[f64]> = all.chunks(per).collect();
    let slowest: Vec<f64> = (0..n)
        .map(|i| ranks.iter().map(|r| r[i]).fold(0.0, f64::max))
        .collect();
    let avg = slowest.iter().sum::<f64>() / n as f64;
    let min = slowest.iter().copied().fold(f64::INFINITY, f64::min);
    let max = slowest.iter().copied().fold(0.0, f64::max);
    let algbw = if avg > 0.0 {
        total as f64 / avg / 1e9
    } else {
        0.0
    };
    let busbw = match a.collective {
        Collective::Bcast => algbw,
        _ => algbw * f64::from(p - 1) / f64::from(p),
    };
    let col = |k: usize| -> Vec<u64> { ranks.iter().map(|r| r[n + k].round() as u64).collect() };
    let (own, p2p): (Vec<u64>, Vec<u64>) = match a.collective {
        Collective::Bcast => (
            (0..p).map(|r| if r == 0 { size } else { 0 }).collect(),
            net::binomial_bcast(p, 0, size),
        ),
        // A ring's rank r forwards every block but the one its successor r + 1 owns (for
        // equal blocks, P - 1 times its own); the blocks add up to `total`.
        _ => {
            let n = blocks.len();
            let ring = (0..n).map(|r| total - blocks[(r + 1) % n]).collect();
            (blocks.to_vec(), ring)
        }
    };
    json!({
        "size": size,
        "bytes_total": total,
        "blocks": blocks,
        "avg_us": avg * 1e6,
        "min_us": min * 1e6,
        "max_us": max * 1e6,
        "iterations": a.iters,
        "algbw_gbs": algbw,
        "busbw_gbs": busbw,
        "verified": true,
        "own_per_rank": own,
        "injected_per_rank": col(0),
        "payload_per_rank": col(1),
        "datagrams_per_rank": col(2),
        "served_per_rank": col(3),
        "fetched_per_rank": col(4),
        "tcp_per_rank": col(5),
        "p2p_per_rank": p2p,
        "slowest_us": slowest.iter().map(|t| t * 1e6).collect::<Vec<f64>>(),
    })
}
