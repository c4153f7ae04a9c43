//! The report of `cargo xtask bench-net`: reads the raw outputs of one run (ringcast's
//! `--json`, Open MPI's `mpi_bench` tables, the ceiling's `GOODPUT` lines, the bridge byte
//! counts) from `--dir`, writes `results.md`, `results.json`, `latency.svg` and
//! `goodput-loss.svg` there, and with `--record DIR` copies them to `DIR` (the docs).
//!
//! ```text
//! cargo run --release -p ringcast --example bench_net_report -- --dir target/bench-net/<id> \
//!     [--record docs/bench-net]
//! ```
//! xtask runs it; plotters and serde_json stay out of xtask.

#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use ringcast_charts::{Scales, line_chart};
use serde_json::{Value, json};

/// UDP payload of one ringcast datagram with a full chunk: BTH 12 + DETH 8 + ImmDt 4 + ICRC 4.
const ROCE_OVERHEAD: f64 = 28.0;

#[derive(Clone, Copy, Debug, Default)]
struct Lat {
    avg_us: f64,
    min_us: f64,
    max_us: f64,
}

/// One collective's results at one loss point, by size.
type Table = BTreeMap<u64, Lat>;

#[derive(Debug, Default)]
struct AtLoss {
    rc_bcast: Table,
    rc_allgather: Table,
    mpi_bcast: Table,
    mpi_allgather: Table,
    /// Bytes fetched by the ring recovery, per size, summed over ranks (ringcast Broadcast).
    rc_bcast_fetched: BTreeMap<u64, u64>,
    /// Receivers' goodput in UDP bits per second, and the sender's rate.
    ceiling_rx_gbps: Vec<f64>,
    ceiling_tx_gbps: f64,
}

/// One goodput round: the ceiling's receivers (UDP Gb/s), a Broadcast's ceiling's (runs
/// from before it was measured have none), ringcast's Broadcast.
type GoodputRound = (Vec<f64>, Option<Vec<f64>>, Lat);

struct Run {
    manifest: BTreeMap<String, String>,
    losses: Vec<(f64, AtLoss)>,
    /// Per collective: ringcast's and Open MPI's bytes per rank over the counted operations.
    bytes: BTreeMap<String, (Vec<u64>, Vec<u64>)>,
    /// ringcast's own count of what a rank injects per 16 MiB operation (from its JSON).
    injected_expected: BTreeMap<String, Vec<u64>>,
    /// The goodput rounds, loss-free, in turn: the largest size, then per round the ceiling's
    /// receivers (UDP Gb/s) and ringcast's Broadcast of that size.
    goodput_rounds: Option<(u64, Vec<GoodputRound>)>,
}

fn read(dir: &Path, name: &str) -> Result<String, String> {
    std::fs::read_to_string(dir.join(name)).map_err(|e| format!("{name}: {e}"))
}

/// A ringcast `--json` run, by size: latencies, bytes fetched, and what each rank injects.
struct RcRun {
    table: Table,
    fetched: BTreeMap<u64, u64>,
    injected: BTreeMap<u64, Vec<u64>>,
}

fn ringcast_table(text: &str) -> Result<RcRun, String> {
    let v: Value = serde_json::from_str(text).map_err(|e| format!("ringcast JSON: {e}"))?;
    let mut t = Table::new();
    let mut fetched = BTreeMap::new();
    let mut injected = BTreeMap::new();
    for r in v["results"].as_array().ok_or("ringcast JSON: no results")? {
        if r["verified"] != Value::Bool(true) {
            return Err(format!("ringcast: size {} not verified", r["size"]));
        }
        let size = r["size"].as_u64().ok_or("ringcast JSON: size")?;
        let f = |k: &str| r[k].as_f64().unwrap_or(f64::NAN);
        t.insert(
            size,
            Lat {
                avg_us: f("avg_us"),
                min_us: f("min_us"),
                max_us: f("max_us"),
            },
        );
        let sum = |k: &str| {
            r[k].as_array()
                .map_or(0, |a| a.iter().filter_map(Value::as_u64).sum::<u64>())
        };
        fetched.insert(size, sum("fetched_per_rank"));
        injected.insert(
            size,
            r["injected_per_rank"]
                .as_array()
                .map(|a| a.iter().filter_map(Value::as_u64).collect())
                .unwrap_or_default(),
        );
    }
    Ok(RcRun {
        table: t,
        fetched,
        injected,
    })
}

fn mpi_table(text: &str) -> Table {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let w: Vec<f64> = l
                .split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect();
            (w.len() >= 4).then(|| {
                (
                    w[0] as u64,
                    Lat {
                        avg_us: w[1],
                        min_us: w[2],
                        max_us: w[3],
                    },
                )
            })
        })
        .collect()
}

fn field(line: &str, key: &str) -> Option<f64> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('=')?.parse().ok())
}

/// The `GOODPUT` lines' rates (UDP Gb/s) of a ceiling's receivers.
fn receivers(ceiling: &str) -> Vec<f64> {
    ceiling
        .lines()
        .filter(|l| l.starts_with("GOODPUT"))
        .filter_map(|l| field(l, "gbps"))
        .collect()
}

fn load(dir: &Path) -> Result<Run, String> {
    let manifest: BTreeMap<String, String> = read(dir, "manifest.txt")?
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    let mut losses = Vec::new();
    for l in manifest.get("losses").ok_or("manifest: losses")?.split(',') {
        let loss: f64 = l.parse().map_err(|_| format!("manifest: loss {l}"))?;
        let tag = format!("loss{l}");
        let bcast = ringcast_table(&read(dir, &format!("{tag}-ringcast-bcast.json"))?)?;
        let allgather = ringcast_table(&read(dir, &format!("{tag}-ringcast-allgather.json"))?)?;
        let ceiling = read(dir, &format!("{tag}-ceiling.txt"))?;
        let at = AtLoss {
            rc_bcast: bcast.table,
            rc_allgather: allgather.table,
            rc_bcast_fetched: bcast.fetched,
            mpi_bcast: mpi_table(&read(dir, &format!("{tag}-mpi-bcast.txt"))?),
            mpi_allgather: mpi_table(&read(dir, &format!("{tag}-mpi-allgather.txt"))?),
            ceiling_rx_gbps: receivers(&ceiling),
            ceiling_tx_gbps: ceiling
                .lines()
                .find(|l| l.starts_with("SENT"))
                .and_then(|l| field(l, "gbps"))
                .unwrap_or(f64::NAN),
        };
        losses.push((loss, at));
    }
    let mut bytes = BTreeMap::new();
    let mut injected_expected = BTreeMap::new();
    for coll in ["bcast", "allgather"] {
        let Ok(text) = read(dir, &format!("bytes-{coll}.txt")) else {
            continue;
        };
        let row = |who: &str| -> Vec<u64> {
            text.lines()
                .find_map(|l| l.strip_prefix(who))
                .map(|r| r.trim().split(',').filter_map(|x| x.parse().ok()).collect())
                .unwrap_or_default()
        };
        bytes.insert(coll.to_owned(), (row("ringcast "), row("mpi ")));
        let size: u64 = manifest
            .get("bytes_size")
            .and_then(|s| s.parse().ok())
            .unwrap_or(16 << 20);
        if let Ok(j) = read(dir, &format!("loss0-ringcast-{coll}.json"))
            && let Some(e) = ringcast_table(&j)?.injected.remove(&size)
        {
            injected_expected.insert(coll.to_owned(), e);
        }
    }
    let rounds: u32 = manifest
        .get("goodput_rounds")
        .and_then(|r| r.parse().ok())
        .unwrap_or(0);
    let mut goodput_rounds = None;
    let largest = manifest
        .get("sizes")
        .and_then(|s| s.split(',').filter_map(|x| x.parse::<u64>().ok()).max());
    if rounds > 0
        && let Some(size) = largest
    {
        let mut v = Vec::new();
        for r in 1..=rounds {
            let ceiling = receivers(&read(dir, &format!("goodput-r{r}-ceiling.txt"))?);
            let broadcast = read(dir, &format!("goodput-r{r}-ceiling-broadcast.txt"))
                .ok()
                .map(|c| receivers(&c));
            let json = read(dir, &format!("goodput-r{r}-ringcast-bcast.json"))?;
            let lat = ringcast_table(&json)?
                .table
                .remove(&size)
                .ok_or_else(|| format!("goodput round {r}: no {size} B Broadcast"))?;
            v.push((ceiling, broadcast, lat));
        }
        goodput_rounds = Some((size, v));
    }
    Ok(Run {
        manifest,
        losses,
        bytes,
        injected_expected,
        goodput_rounds,
    })
}

/// One goodput round in payload GB/s: ringcast's, the ceiling's, a Broadcast's ceiling's.
type Goodput = (f64, f64, Option<f64>);

/// The median percentage of (goodput, ceiling) pairs, and each pair written out.
fn against(v: &[(f64, f64)]) -> (f64, String) {
    let mut pct: Vec<f64> = v.iter().map(|(g, c)| 100.0 * g / c).collect();
    let each: Vec<String> = v
        .iter()
        .zip(&pct)
        .map(|((g, c), p)| format!("{g:.3} of {c:.3} GB/s = {p:.0}%"))
        .collect();
    pct.sort_by(f64::total_cmp);
    (
        pct.get(pct.len() / 2).copied().unwrap_or(0.0),
        each.join("; "),
    )
}

fn size_label(b: u64) -> String {
    if b >= 1 << 20 && b.is_multiple_of(1 << 20) {
        format!("{} MiB", b >> 20)
    } else if b >= 1 << 10 && b.is_multiple_of(1 << 10) {
        format!("{} KiB", b >> 10)
    } else {
        format!("{b} B")
    }
}

/// Broadcast goodput in GB/s (payload bytes per second).
fn gbs(size: u64, lat: &Lat) -> f64 {
    size as f64 / (lat.avg_us * 1e-6) / 1e9
}

impl Run {
    fn p(&self) -> u64 {
        self.manifest
            .get("ranks")
            .and_then(|r| r.parse().ok())
            .unwrap_or(4)
    }

    fn payload(&self) -> f64 {
        self.manifest
            .get("payload")
            .and_then(|r| r.parse().ok())
            .unwrap_or(4096.0)
    }

    fn at(&self, loss: f64) -> Option<&AtLoss> {
        self.losses.iter().find(|(l, _)| *l == loss).map(|(_, a)| a)
    }

    /// The ceiling per receiver in payload GB/s.
    fn ceiling_gbs(a: &AtLoss, payload: f64) -> f64 {
        Self::payload_gbs(&a.ceiling_rx_gbps, payload)
    }

    /// The mean of receivers' UDP rates (Gb/s) in payload GB/s.
    fn payload_gbs(rx_gbps: &[f64], payload: f64) -> f64 {
        let n = rx_gbps.len().max(1) as f64;
        let udp = rx_gbps.iter().sum::<f64>() / n;
        udp / 8.0 * payload / (payload + ROCE_OVERHEAD)
    }

    /// The goodput rounds: size, and per round ringcast's goodput, the ceiling and the
    /// Broadcast's ceiling where measured (GB/s).
    fn rounds(&self) -> Option<(u64, Vec<Goodput>)> {
        let (size, v) = self.goodput_rounds.as_ref()?;
        let p = self.payload();
        let v = v
            .iter()
            .map(|(c, d, lat)| {
                let d = d.as_ref().map(|d| Self::payload_gbs(d, p));
                (gbs(*size, lat), Self::payload_gbs(c, p), d)
            })
            .collect();
        Some((*size, v))
    }

    /// The largest size measured at 16 MiB or above, for the goodput figures.
    fn goodput_size(&self) -> Option<u64> {
        let a = &self.losses.first()?.1;
        a.rc_bcast.keys().copied().filter(|&s| s >= 16 << 20).max()
    }

    fn markdown(&self) -> String {
        let m = |k: &str| self.manifest.get(k).map_or("?", String::as_str);
        let mut s = String::new();
        let _ = writeln!(
            s,
            "# ringcast vs Open MPI (TCP) vs raw multicast, {} namespaces on a bridge\n",
            self.p()
        );
        let _ = writeln!(
            s,
            "`cargo xtask bench-net` (commit {}): {} ranks, one process per network namespace on \
             a Linux bridge with IGMPv3 snooping and a querier, MTU 9000; {} timed iterations \
             after {} warm-up (and one untimed, verified run) per size; an iteration's latency is \
             the slowest rank's; avg over iterations. Loss: nftables drops that share of the data \
             packets at random on every rank's input (ringcast and the ceiling: UDP to port 4791; \
             Open MPI: all TCP). Nothing pinned. Machine: {}, {} cores; {}. Buffers: {}.\n",
            m("commit"),
            self.p(),
            m("iters"),
            m("warmup"),
            m("cpu"),
            m("cores"),
            m("mpi"),
            if m("huge_pages") == "true" {
                "on 2 MiB transparent huge pages on every side (`--huge-pages`: \
                 `ringcast::alloc_buffer`, `mpi_bench --huge-pages`, `goodput --pages huge`)"
            } else {
                "the allocator's (4 KiB pages where transparent huge pages are `madvise`)"
            }
        );
        for (loss, a) in &self.losses {
            let _ = writeln!(
                s,
                "## Latency at {loss}% loss: average µs (GB/s of the output buffer)\n\n\
                 | size per rank | ringcast Broadcast | Open MPI Broadcast | ringcast Allgather \
                 | Open MPI Allgather |\n|---:|---:|---:|---:|---:|"
            );
            let p = self.p() as f64;
            for (&size, rb) in &a.rc_bcast {
                let cell = |t: &Table, total: f64| {
                    t.get(&size).map_or("-".to_owned(), |l| {
                        format!("{:.0} ({:.2})", l.avg_us, total / (l.avg_us * 1e-6) / 1e9)
                    })
                };
                let _ = writeln!(
                    s,
                    "| {} | {} | {} | {} | {} |",
                    size_label(size),
                    format_args!("{:.0} ({:.2})", rb.avg_us, gbs(size, rb)),
                    cell(&a.mpi_bcast, size as f64),
                    cell(&a.rc_allgather, size as f64 * p),
                    cell(&a.mpi_allgather, size as f64 * p),
                );
            }
            let _ = writeln!(
                s,
                "\nRaw multicast ceiling (`goodput --role send/recv`, the same {}-byte payload as \
                 the ranks' chunks, GSO): sender {:.2} Gb/s, receivers {} Gb/s UDP = **{:.3} GB/s \
                 payload per receiver**.\n",
                self.payload(),
                a.ceiling_tx_gbps,
                a.ceiling_rx_gbps
                    .iter()
                    .map(|g| format!("{g:.2}"))
                    .collect::<Vec<_>>()
                    .join(" / "),
                Self::ceiling_gbs(a, self.payload())
            );
        }
        if !self.bytes.is_empty() {
            let _ = writeln!(
                s,
                "## Bytes each rank put on the bridge per 16 MiB operation\n\n\
                 Counted on the bridge ports (host-side veth `rx_bytes`) over {} operations of \
                 each side, divided by their count; Ethernet, IP and transport headers and the \
                 control traffic included. *own + headers*: ringcast's own count of its \
                 datagrams (UDP payload + IPv4/UDP/Ethernet headers not included); *ring*: what \
                 a ring Allgather puts on each rank's link, (P-1) x the block.\n\n\
                 | operation | rank | ringcast | ringcast's datagrams (own + RoCE headers) | \
                 Open MPI (TCP) | ring (P-1) x block |\n|---|---:|---:|---:|---:|---:|",
                m("bytes_ops")
            );
            let ops: f64 = m("bytes_ops").parse().unwrap_or(1.0);
            let block: f64 = m("bytes_size").parse().unwrap_or(16.0 * 1048576.0);
            for (coll, (rc, mpi)) in &self.bytes {
                let exp = self.injected_expected.get(coll);
                for (i, b) in rc.iter().enumerate() {
                    let e = exp
                        .and_then(|e| e.get(i))
                        .map_or("-".to_owned(), |e| format!("{:.2} MB", *e as f64 / 1e6));
                    let ring = if coll == "allgather" {
                        format!("{:.2} MB", block * (self.p() - 1) as f64 / 1e6)
                    } else {
                        "-".to_owned()
                    };
                    let _ = writeln!(
                        s,
                        "| {coll} | {i} | {:.2} MB | {e} | {} | {ring} |",
                        *b as f64 / ops / 1e6,
                        mpi.get(i).map_or("-".to_owned(), |m| format!(
                            "{:.2} MB",
                            *m as f64 / ops / 1e6
                        ))
                    );
                }
            }
            s.push('\n');
        }
        s += &self.goals_markdown();
        s +=
            "\n![latency against size](latency.svg)\n\n![goodput against loss](goodput-loss.svg)\n";
        s
    }

    fn goals(&self) -> Vec<(String, String, String, Option<bool>)> {
        let mut g = Vec::new();
        let Some(a0) = self.at(0.0) else {
            return g;
        };
        let s16 = 16u64 << 20;
        for (name, rc, mpi, limit) in [
            ("Broadcast 16 MiB", &a0.rc_bcast, &a0.mpi_bcast, 25_000.0),
            (
                "Allgather 16 MiB per rank",
                &a0.rc_allgather,
                &a0.mpi_allgather,
                100_000.0,
            ),
        ] {
            if let (Some(r), Some(m)) = (rc.get(&s16), mpi.get(&s16)) {
                g.push((
                    name.to_owned(),
                    format!("≤ {:.0} ms, and ≥ 2x faster than Open MPI", limit / 1000.0),
                    format!(
                        "{:.1} ms vs Open MPI {:.1} ms: {:.2}x",
                        r.avg_us / 1000.0,
                        m.avg_us / 1000.0,
                        m.avg_us / r.avg_us
                    ),
                    Some(r.avg_us <= limit && m.avg_us >= 2.0 * r.avg_us),
                ));
            }
        }
        if let Some(size) = self.goodput_size() {
            // Against the ceiling measured next to it, round by round, where the run has
            // rounds; else against the sweep's ceiling.
            if let Some((size, v)) = self.rounds() {
                let raw: Vec<(f64, f64)> = v.iter().map(|&(g, c, _)| (g, c)).collect();
                let (median, each) = against(&raw);
                g.push((
                    format!(
                        "Broadcast goodput ({}), each beside a ceiling",
                        size_label(size)
                    ),
                    "≥ 85% of the ceiling".to_owned(),
                    format!("median {median:.0}% ({each})"),
                    Some(median >= 85.0),
                ));
                let kept: Option<Vec<(f64, f64)>> =
                    v.iter().map(|&(g, _, d)| d.map(|d| (g, d))).collect();
                if let Some(kept) = kept.filter(|k| !k.is_empty()) {
                    let (median, each) = against(&kept);
                    g.push((
                        format!(
                            "Broadcast goodput ({}), beside a Broadcast's ceiling: its sender \
                             reads and its receivers keep a buffer of that size (not an issue \
                             goal: what a Broadcast can reach)",
                            size_label(size)
                        ),
                        "≥ 85% of that ceiling".to_owned(),
                        format!("median {median:.0}% ({each})"),
                        Some(median >= 85.0),
                    ));
                }
            } else if let Some(r) = a0.rc_bcast.get(&size) {
                let c = Self::ceiling_gbs(a0, self.payload());
                let got = gbs(size, r);
                g.push((
                    format!("Broadcast goodput ({})", size_label(size)),
                    "≥ 85% of the ceiling".to_owned(),
                    format!("{got:.3} GB/s of {c:.3} GB/s = {:.0}%", 100.0 * got / c),
                    Some(got >= 0.85 * c),
                ));
            }
            if let (Some(r0), Some(a1)) = (a0.rc_bcast.get(&size), self.at(1.0))
                && let Some(r1) = a1.rc_bcast.get(&size)
            {
                let (g0, g1) = (gbs(size, r0), gbs(size, r1));
                g.push((
                    format!("Broadcast goodput under 1% loss ({})", size_label(size)),
                    "≥ 80% of the loss-free goodput".to_owned(),
                    format!("{g1:.3} GB/s vs {g0:.3} GB/s = {:.0}%", 100.0 * g1 / g0),
                    Some(g1 >= 0.8 * g0),
                ));
            }
        }
        if let Some((rc, _)) = self.bytes.get("allgather") {
            let ops: f64 = self
                .manifest
                .get("bytes_ops")
                .and_then(|o| o.parse().ok())
                .unwrap_or(1.0);
            let block: f64 = self
                .manifest
                .get("bytes_size")
                .and_then(|o| o.parse().ok())
                .unwrap_or(16.0 * 1048576.0);
            let worst = rc.iter().copied().max().unwrap_or(0) as f64 / ops;
            g.push((
                "bytes injected per rank (Allgather 16 MiB)".to_owned(),
                "own data + headers; a ring: P-1 times".to_owned(),
                format!(
                    "at most {:.2} MB = {:.3} x own block; a ring {:.1} x",
                    worst / 1e6,
                    worst / block,
                    (self.p() - 1) as f64
                ),
                Some(worst < block * 1.1),
            ));
        }
        g
    }

    fn goals_markdown(&self) -> String {
        let mut s = "## Goals (issue 8)\n\n| measure | goal | result | met? |\n|---|---|---|---|\n"
            .to_owned();
        for (name, goal, result, met) in self.goals() {
            let m = match met {
                Some(true) => "yes",
                Some(false) => "**no**",
                None => "-",
            };
            let _ = writeln!(s, "| {name} | {goal} | {result} | {m} |");
        }
        s
    }

    fn json(&self) -> Value {
        let table = |t: &Table| -> Value {
            t.iter()
                .map(|(s, l)| json!({"size": s, "avg_us": l.avg_us, "min_us": l.min_us, "max_us": l.max_us}))
                .collect()
        };
        json!({
            "manifest": self.manifest,
            "losses": self.losses.iter().map(|(loss, a)| json!({
                "loss_pct": loss,
                "ringcast_bcast": table(&a.rc_bcast),
                "ringcast_allgather": table(&a.rc_allgather),
                "mpi_bcast": table(&a.mpi_bcast),
                "mpi_allgather": table(&a.mpi_allgather),
                "ringcast_bcast_fetched_bytes": a.rc_bcast_fetched,
                "ceiling_rx_udp_gbps": a.ceiling_rx_gbps,
                "ceiling_tx_udp_gbps": a.ceiling_tx_gbps,
                "ceiling_payload_gbs": Self::ceiling_gbs(a, self.payload()),
            })).collect::<Vec<_>>(),
            "goodput_rounds": self.rounds().map(|(size, v)| json!({
                "size": size,
                "rounds": v.iter().map(|(g, c, d)| json!({"ringcast_gbs": g, "ceiling_payload_gbs": c, "broadcast_ceiling_payload_gbs": d})).collect::<Vec<_>>(),
            })),
            "bytes_per_rank": self.bytes.iter().map(|(c, (r, m))| (c.clone(), json!({"ringcast": r, "mpi": m}))).collect::<BTreeMap<_, _>>(),
            "goals": self.goals().iter().map(|(n, g, r, m)| json!({"measure": n, "goal": g, "result": r, "met": m})).collect::<Vec<_>>(),
        })
    }
}

/// An axis tick in bytes, decimal (the log axis puts ticks at powers of ten).
fn tick_bytes(x: &f64) -> String {
    match *x {
        x if x >= 1e9 => format!("{} GB", x / 1e9),
        x if x >= 1e6 => format!("{} MB", x / 1e6),
        x if x >= 1e3 => format!("{} kB", x / 1e3),
        x => format!("{x} B"),
    }
}

fn svgs(run: &Run) -> Result<Vec<(&'static str, String)>, String> {
    let ms = |t: &Table| -> Vec<(f64, f64)> {
        t.iter()
            .map(|(&s, l)| (s as f64, l.avg_us / 1000.0))
            .collect()
    };
    let mut lat = Vec::new();
    for (loss, a) in &run.losses {
        let suffix = if *loss == 0.0 {
            String::new()
        } else {
            format!(", {loss}% loss")
        };
        lat.push((format!("ringcast Broadcast{suffix}"), ms(&a.rc_bcast)));
        lat.push((format!("Open MPI Broadcast{suffix}"), ms(&a.mpi_bcast)));
        lat.push((format!("ringcast Allgather{suffix}"), ms(&a.rc_allgather)));
        lat.push((format!("Open MPI Allgather{suffix}"), ms(&a.mpi_allgather)));
    }
    let latency = line_chart(
        &format!(
            "Latency against size, {} ranks in namespaces on a bridge (TCP for Open MPI)",
            run.p()
        ),
        ("bytes per rank", "latency (ms)"),
        &lat,
        Scales {
            x_log: true,
            y_log: true,
        },
        &tick_bytes,
    )?;
    let size = run
        .goodput_size()
        .ok_or("no size of 16 MiB or more for goodput")?;
    let mut rc = Vec::new();
    let mut mpi = Vec::new();
    let mut ceiling = Vec::new();
    for (loss, a) in &run.losses {
        if let Some(l) = a.rc_bcast.get(&size) {
            rc.push((*loss, gbs(size, l)));
        }
        if let Some(l) = a.mpi_bcast.get(&size) {
            mpi.push((*loss, gbs(size, l)));
        }
        ceiling.push((*loss, Run::ceiling_gbs(a, run.payload())));
    }
    let goodput = line_chart(
        &format!("Broadcast goodput against loss, {}", size_label(size)),
        ("random loss at every receiver (%)", "goodput (GB/s)"),
        &[
            ("ringcast".to_owned(), rc),
            ("Open MPI (TCP)".to_owned(), mpi),
            ("raw multicast ceiling".to_owned(), ceiling),
        ],
        Scales {
            x_log: false,
            y_log: false,
        },
        &|x| format!("{x}"),
    )?;
    Ok(vec![
        ("latency.svg", latency),
        ("goodput-loss.svg", goodput),
    ])
}

fn main() {
    let mut args = std::env::args().skip(1);
    let (mut dir, mut record) = (None::<PathBuf>, None::<PathBuf>);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--dir" => dir = args.next().map(PathBuf::from),
            "--record" => record = args.next().map(PathBuf::from),
            other => {
                eprintln!("bench_net_report: unknown argument {other}");
                std::process::exit(2);
            }
        }
    }
    let Some(dir) = dir else {
        eprintln!("usage: bench_net_report --dir DIR [--record DOCS_DIR]");
        std::process::exit(2);
    };
    let result = (|| -> Result<(), String> {
        let run = load(&dir)?;
        let md = run.markdown();
        let json = serde_json::to_string_pretty(&run.json()).map_err(|e| e.to_string())?;
        let mut files = vec![("results.md", md.clone()), ("results.json", json + "\n")];
        files.extend(svgs(&run)?);
        for target in [Some(&dir), record.as_ref()].into_iter().flatten() {
            std::fs::create_dir_all(target).map_err(|e| format!("{}: {e}", target.display()))?;
            for (name, text) in &files {
                let p = target.join(name);
                std::fs::write(&p, text).map_err(|e| format!("{}: {e}", p.display()))?;
            }
            eprintln!("bench_net_report: wrote {}", target.display());
        }
        println!("{md}");
        Ok(())
    })();
    if let Err(e) = result {
        eprintln!("bench_net_report: {e}");
        std::process::exit(1);
    }
}
