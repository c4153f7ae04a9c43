//! `cargo xtask bench-loopback`: issue 7's side by side on loopback, in one run, 4 local
//! ranks: `ringcast bench {bcast,allgather} --blocking --local 4` (the blocking calls on the
//! caller's buffers, `MPI_Bcast`'s and `MPI_Allgather`'s contract), as is and with everything
//! over its TCP path (`--tcp-threshold 1GiB`: what a network without multicast gets); Open
//! MPI's `MPI_Bcast` / `MPI_Allgather` (`xtask/src/lab/mpi_bench.c`, timed the same way) over TCP and over shared
//! memory (vader); and the raw multicast ceiling (`goodput --mode gso`: one sender to three
//! receivers, the datagram payload the ranks' chunk, read from `ringcast bench`'s header), as is and as a Broadcast's: the sender taking its payloads
//! from, and each receiver copying them into, a buffer of the largest size (`--source`,
//! `--deliver`: what reading and keeping the bytes cost, which the raw one leaves out).
//!
//! `--huge-pages`: every side's buffers on 2 MiB transparent huge pages (`ringcast bench
//! --huge-pages`, which allocates with `ringcast::alloc_buffer`; `mpi_bench --huge-pages`;
//! the Broadcast's ceiling's `goodput --pages huge`), as a caller that allocates its buffers
//! for communication (`MPI_Alloc_mem`, `ncclMemAlloc`) has them.
//!
//! The machine's speed drifts by up to 3x within an hour, so everything runs in `--rounds`
//! interleaved rounds and every ratio is taken within a round; the summary gives the medians.
//! Raw outputs and `results.md` land in `target/bench-loopback/<unix time>/`. No root needed;
//! Open MPI runs with `--allow-run-as-root` for CI-like machines.

use crate::bench_net::{SIZES, build, mpi_bench, sizes};
use crate::netns::require_tools;
use crate::netns_lab::sh_limit;
use crate::run::StepError;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

const USAGE: &str =
    "bench-loopback [--rounds N] [--sizes B,B,..] [--iters N] [--warmup N] [--huge-pages]";

struct Opts {
    rounds: u32,
    sizes: Vec<u64>,
    iters: u32,
    warmup: u32,
    huge_pages: bool,
}

fn parse(args: &[String]) -> Result<Opts, StepError> {
    let mut o = Opts {
        rounds: 3,
        sizes: SIZES.to_vec(),
        iters: 10,
        warmup: 2,
        huge_pages: false,
    };
    let bad = |m: String| StepError::Other(format!("{m}\n\nusage: cargo xtask {USAGE}"));
    // A count of at least `min` after option `what`.
    let count = |v: Option<&String>, what: &str, min: u32| {
        v.and_then(|v| v.parse::<u32>().ok())
            .filter(|&n| n >= min)
            .ok_or_else(|| bad(format!("`{what}` wants a count of at least {min}")))
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--rounds" => o.rounds = count(it.next(), a, 1)?,
            "--iters" => o.iters = count(it.next(), a, 1)?,
            "--warmup" => o.warmup = count(it.next(), a, 0)?,
            "--huge-pages" => o.huge_pages = true,
            "--sizes" => {
                o.sizes = it
                    .next()
                    .and_then(|v| sizes(v))
                    .ok_or_else(|| bad("`--sizes` wants positive byte counts".to_owned()))?;
            }
            other => return Err(bad(format!("unknown option `{other}`"))),
        }
    }
    Ok(o)
}

/// Average latency (µs) per size from an OSU-style table (`ringcast bench`, `mpi_bench`):
/// the first two columns of every line that starts with a digit.
fn table(out: &str) -> Vec<(u64, f64)> {
    out.lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            Some((w.next()?.parse().ok()?, w.next()?.parse().ok()?))
        })
        .collect()
}

/// `ringcast bench allgather`'s last two columns per size: the busiest rank's bytes on the
/// wire per iteration, and a ring's.
fn injected(out: &str) -> Vec<(u64, u64, u64)> {
    out.lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            let n = |i: usize| w.get(i)?.parse().ok();
            Some((n(0)?, n(w.len().checked_sub(2)?)?, n(w.len() - 1)?))
        })
        .collect()
}

/// The chunk size the ranks ran with, from `ringcast bench`'s `# chunks: N B ...` line.
fn chunk(out: &str) -> Option<u64> {
    let l = out.lines().find_map(|l| l.strip_prefix("# chunks: "))?;
    l.split_whitespace().next()?.parse().ok()
}

/// The mean goodput per receiver (GB/s) from `goodput`'s report.
fn goodput(out: &str) -> Option<f64> {
    let l = out.lines().find(|l| l.contains("mean per receiver"))?;
    let gbps: f64 = l.split_whitespace().rev().nth(1)?.parse().ok()?;
    Some(gbps / 8.0)
}

/// One round: per collective ([`COLLS`]) and side ([`SIDES`]), the average latency (µs) per
/// size; the ceilings (GB/s).
#[derive(Default)]
struct Round {
    colls: [[Vec<(u64, f64)>; 4]; 2],
    /// The Allgather's bytes on the wire per rank ([`injected`]).
    inject: Vec<(u64, u64, u64)>,
    /// The chunk size the ranks ran with ([`chunk`]): the ceilings' datagram payload.
    chunk: Option<u64>,
    raw: Option<f64>,
    broadcast: Option<f64>,
}

/// The collectives: `ringcast bench`'s and `mpi_bench`'s name, the report's.
const COLLS: [(&str, &str); 2] = [("bcast", "Broadcast"), ("allgather", "Allgather")];
const SIDES: [&str; 4] = [
    "ringcast",
    "ringcast over TCP",
    "Open MPI TCP",
    "Open MPI vader",
];
/// Where each side is in [`SIDES`] (and in a round's `colls`).
const RC: usize = 0;
const RC_TCP: usize = 1;
const MPI_TCP: usize = 2;
/// How long one benchmark run may take.
const RUN_SECS: u64 = 900;

fn at(t: &[(u64, f64)], size: u64) -> Option<f64> {
    t.iter().find(|(s, _)| *s == size).map(|(_, v)| *v)
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    (!v.is_empty()).then(|| v[v.len() / 2])
}

pub(crate) fn run(root: &Path, args: &[String]) -> Result<(), StepError> {
    let o = parse(args)?;
    require_tools(
        "bench-loopback",
        &["mpirun", "mpicc"],
        "openmpi-bin libopenmpi-dev",
    )?;
    build(root, &[])?;
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let dir = root.join("target/bench-loopback").join(stamp.to_string());
    std::fs::create_dir_all(&dir).map_err(|e| StepError::Other(format!("{e}")))?;
    let mpi = mpi_bench(root, &dir).map_err(StepError::Other)?;
    let b = Bench {
        dir: dir.clone(),
        ringcast: root.join("target/release/ringcast"),
        goodput: root.join("target/release/examples/goodput"),
        mpi,
        o: &o,
    };
    let started = Instant::now();
    let mut rounds = Vec::new();
    for r in 1..=o.rounds {
        eprintln!("bench-loopback: round {r} of {} ...", o.rounds);
        rounds.push(b.round(r).map_err(StepError::Other)?);
    }
    let report = b.report(&rounds);
    std::fs::write(dir.join("results.md"), &report)
        .map_err(|e| StepError::Other(format!("{e}")))?;
    print!("{report}");
    eprintln!(
        "bench-loopback: {} rounds in {:.0} s; raw outputs and results.md in {}",
        o.rounds,
        started.elapsed().as_secs_f64(),
        dir.display()
    );
    Ok(())
}

struct Bench<'a> {
    dir: PathBuf,
    ringcast: PathBuf,
    goodput: PathBuf,
    mpi: PathBuf,
    o: &'a Opts,
}

impl Bench<'_> {
    /// Runs `program args`, keeps its output as `name` in the run's directory, returns it.
    fn keep(&self, name: &str, program: &Path, args: &[String]) -> Result<String, String> {
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = sh_limit(RUN_SECS, &program.to_string_lossy(), &refs)?;
        std::fs::write(self.dir.join(name), &out).map_err(|e| format!("{name}: {e}"))?;
        Ok(out)
    }

    fn round(&self, r: u32) -> Result<Round, String> {
        let o = self.o;
        let sizes: Vec<String> = o.sizes.iter().map(u64::to_string).collect();
        let (w, i) = (o.warmup.to_string(), o.iters.to_string());
        let mut round = Round::default();
        for (slot, (coll, _)) in COLLS.into_iter().enumerate() {
            let mut args = [
                "bench",
                coll,
                "--blocking",
                "--local",
                "4",
                "--sizes",
                &sizes.join(","),
                "--warmup",
                &w,
                "--iters",
                &i,
            ]
            .map(str::to_owned)
            .to_vec();
            if o.huge_pages {
                args.push("--huge-pages".to_owned());
            }
            let out = self.keep(&format!("r{r}-ringcast-{coll}.txt"), &self.ringcast, &args)?;
            if coll == "allgather" {
                round.inject = injected(&out);
            }
            round.chunk = round.chunk.or(chunk(&out));
            let mut sides = vec![table(&out)];
            let mut over_tcp = args.to_vec();
            over_tcp.extend(["--tcp-threshold".to_owned(), "1073741824".to_owned()]);
            let name = format!("r{r}-ringcast-tcp-{coll}.txt");
            sides.push(table(&self.keep(&name, &self.ringcast, &over_tcp)?));
            for btl in ["tcp", "vader"] {
                let mut args: Vec<String> = [
                    "--allow-run-as-root",
                    "--oversubscribe",
                    "-np",
                    "4",
                    "--mca",
                    "btl",
                    &format!("{btl},self"),
                    &self.mpi.to_string_lossy(),
                ]
                .map(str::to_owned)
                .to_vec();
                if o.huge_pages {
                    args.push("--huge-pages".to_owned());
                }
                args.extend([coll, &w, &i].map(str::to_owned));
                args.extend(sizes.iter().cloned());
                let name = format!("r{r}-mpi-{btl}-{coll}.txt");
                sides.push(table(&self.keep(&name, Path::new("mpirun"), &args)?));
            }
            round.colls[slot] = sides.try_into().map_err(|_| "three sides")?;
        }
        let largest = o.sizes.iter().max().copied().unwrap_or(0).to_string();
        for (name, deliver) in [("raw", false), ("broadcast", true)] {
            // The ceilings are "the same datagram size" only with the ranks' chunk.
            let payload = round
                .chunk
                .ok_or("ringcast bench printed no `# chunks:` line: cannot size the ceilings")?
                .to_string();
            let mut args = ["--payload", &payload, "--secs", "2", "--mode", "gso"]
                .map(str::to_owned)
                .to_vec();
            if deliver {
                for opt in ["--source", "--deliver"] {
                    args.extend([opt.to_owned(), largest.clone()]);
                }
                if o.huge_pages {
                    args.extend(["--pages", "huge"].map(str::to_owned));
                }
            }
            let out = self.keep(&format!("r{r}-ceiling-{name}.txt"), &self.goodput, &args)?;
            let g = goodput(&out).ok_or_else(|| format!("goodput {name}: no mean: {out}"))?;
            if deliver {
                round.broadcast = Some(g);
            } else {
                round.raw = Some(g);
            }
        }
        Ok(round)
    }

    fn report(&self, rounds: &[Round]) -> String {
        let o = self.o;
        let mut s = String::new();
        let _ = writeln!(
            s,
            "# bench-loopback: 4 local ranks, {} rounds, warm-up {}, {} timed iterations, \
             buffers on {}\n\n\
             Average latency in µs per size (bytes; per rank for the Allgather); `x TCP`: Open \
             MPI over TCP's time over ringcast's, within the round (`TCP x TCP`: over ringcast's \
             TCP path's).\n",
            o.rounds,
            o.warmup,
            o.iters,
            if o.huge_pages {
                "2 MiB huge pages (`--huge-pages`)"
            } else {
                "the allocator's pages (4 KiB where transparent huge pages are `madvise`)"
            }
        );
        let fmt = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.0}"));
        let ratio = |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| a / b);
        for (slot, (_, what)) in COLLS.into_iter().enumerate() {
            let _ = writeln!(s, "## {what}\n");
            let _ = writeln!(
                s,
                "| round | size | {} | {} | {} | {} | x TCP | TCP x TCP |\n\
                 |---|---:|---:|---:|---:|---:|---:|---:|",
                SIDES[0], SIDES[1], SIDES[2], SIDES[3]
            );
            for (n, r) in rounds.iter().enumerate() {
                for &size in &o.sizes {
                    let v: Vec<Option<f64>> = r.colls[slot].iter().map(|t| at(t, size)).collect();
                    let x = |of: usize| {
                        ratio(v[MPI_TCP], v[of]).map_or("-".to_owned(), |x| format!("{x:.2}x"))
                    };
                    let _ = writeln!(
                        s,
                        "| {} | {size} | {} | {} | {} | {} | {} | {} |",
                        n + 1,
                        fmt(v[0]),
                        fmt(v[1]),
                        fmt(v[2]),
                        fmt(v[3]),
                        x(RC),
                        x(RC_TCP)
                    );
                }
            }
            let _ = writeln!(s, "\nMedian over the rounds of `x TCP` (of `TCP x TCP`):\n");
            for &size in &o.sizes {
                let m = |of: usize| {
                    median(
                        rounds
                            .iter()
                            .filter_map(|r| {
                                let c = &r.colls[slot];
                                ratio(at(&c[MPI_TCP], size), at(&c[of], size))
                            })
                            .collect(),
                    )
                    .map_or("-".to_owned(), |m| format!("{m:.2}x"))
                };
                let _ = writeln!(s, "* {size}: {} ({})", m(RC), m(RC_TCP));
            }
            let _ = writeln!(s);
        }
        let _ = writeln!(
            s,
            "## Bytes a rank injects per Allgather (round 1, ringcast's count)\n\n\
             | size per rank | ringcast, headers included | x own block | a ring |\n\
             |---:|---:|---:|---:|"
        );
        for &(size, inject, ring) in rounds.first().map_or(&[][..], |r| &r.inject) {
            let _ = writeln!(
                s,
                "| {size} | {inject} | {:.3} | {ring} |",
                inject as f64 / size as f64
            );
        }
        let _ = writeln!(s);
        let largest = o.sizes.iter().max().copied().unwrap_or(0);
        let chunk = rounds.first().and_then(|r| r.chunk).unwrap_or(0);
        let _ = writeln!(
            s,
            "## Broadcast goodput at {largest} B against the ceilings\n\n\
             The ceilings' datagrams carry {chunk} B, the ranks' chunk.\n\n\
             | round | ringcast GB/s | raw ceiling GB/s | a Broadcast's GB/s | of raw | of a Broadcast's |\n\
             |---|---:|---:|---:|---:|---:|"
        );
        let mut of_raw = Vec::new();
        for (n, r) in rounds.iter().enumerate() {
            let gb = at(&r.colls[0][RC], largest).map(|us| largest as f64 / us / 1e3);
            let pct = |c: Option<f64>| ratio(gb, c).map(|x| 100.0 * x);
            of_raw.extend(pct(r.raw));
            let f3 = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.3}"));
            let p = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.0} %"));
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} |",
                n + 1,
                f3(gb),
                f3(r.raw),
                f3(r.broadcast),
                p(pct(r.raw)),
                p(pct(r.broadcast))
            );
        }
        let _ = writeln!(
            s,
            "\nMedian share of the raw ceiling: {}\n",
            median(of_raw).map_or("-".to_owned(), |m| format!("{m:.0} %"))
        );
        s
    }
}
