//! The traffic/time study behind `cargo xtask figures`: ringcast (real core sessions in a
//! [`Sim`]) against the baselines, on one fabric model. Each function runs one table's
//! configurations and returns its rows; [`markdown`] renders rows as a table.
//!
//! Runs are independent and deterministic (fixed seeds), so `threads` only changes how fast a
//! table is computed, never what it holds.

use super::{Baseline, BaselineConfig, BaselineOp, BaselineReport, Forwarding, run, run_with_sim};
use crate::config::{SimConfig, SimError};
use crate::report::Report;
use crate::sim::Sim;
use crate::topology::TopologySpec;
use crate::workload::Workload;
use serde::Serialize;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// Seed of every study run.
pub const SEED: u64 = 1;

/// Maps `f` over `items` on `threads` threads; results in input order.
pub fn par_map<T: Sync, R: Send>(
    items: &[T],
    threads: usize,
    f: impl Fn(&T) -> R + Sync,
) -> Vec<R> {
    let next = AtomicUsize::new(0);
    let out: Mutex<Vec<Option<R>>> = Mutex::new((0..items.len()).map(|_| None).collect());
    std::thread::scope(|s| {
        for _ in 0..threads.clamp(1, items.len().max(1)) {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(item) = items.get(i) else { break };
                    let r = f(item);
                    if let Ok(mut o) = out.lock() {
                        o[i] = Some(r);
                    }
                }
            });
        }
    });
    out.into_inner()
        .unwrap_or_default()
        .into_iter()
        .flatten()
        .collect()
}

/// One algorithm's traffic for one collective (table 1).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TrafficRow {
    /// The fabric.
    pub topology: String,
    /// `allgather` or `broadcast`.
    pub collective: &'static str,
    /// Who moved the bytes.
    pub algorithm: String,
    /// Payload bytes summed over every link crossed.
    pub total_link_bytes: u64,
    /// Per level (names as in [`crate::LevelReport`]), lowest first.
    pub levels: Vec<(String, u64)>,
    /// Bytes the busiest rank's NIC injected.
    pub max_rank_injected: u64,
    /// This row's total over ringcast's total for the same collective.
    pub ratio_to_ringcast: f64,
    /// When the last rank finished, ns.
    pub completion_ns: u64,
}

fn sim(spec: TopologySpec, w: Workload, loss: f64) -> Result<Report, SimError> {
    let mut cfg = SimConfig::new(spec, w);
    cfg.seed = SEED;
    cfg.faults.loss = loss;
    Ok(Sim::new(cfg)?.run())
}

fn baseline(spec: TopologySpec, a: Baseline, loss: f64) -> Result<BaselineReport, SimError> {
    let mut cfg = BaselineConfig::one(spec, a);
    cfg.seed = SEED;
    cfg.faults.loss = loss;
    run(&cfg)?
        .pop()
        .ok_or(SimError::Invalid("baseline produced no report"))
}

/// ringcast's completion of its (only) operation, ns; `None` if not every rank completed.
fn sim_time(r: &Report) -> Option<u64> {
    if r.all_completed() {
        r.ops.first().and_then(|o| o.duration_ns)
    } else {
        None
    }
}

fn sim_row(spec: TopologySpec, collective: &'static str, r: &Report) -> TrafficRow {
    TrafficRow {
        topology: spec.to_string(),
        collective,
        algorithm: "ringcast".into(),
        total_link_bytes: r.levels.iter().map(|l| l.bytes()).sum(),
        levels: r
            .levels
            .iter()
            .map(|l| (l.name.clone(), l.bytes()))
            .collect(),
        max_rank_injected: r.per_rank.iter().map(|x| x.bytes_sent).max().unwrap_or(0),
        ratio_to_ringcast: 1.0,
        completion_ns: sim_time(r).unwrap_or(0),
    }
}

fn base_row(spec: TopologySpec, collective: &'static str, r: &BaselineReport) -> TrafficRow {
    TrafficRow {
        topology: spec.to_string(),
        collective,
        algorithm: r.algorithm.clone(),
        total_link_bytes: r.total_link_bytes,
        levels: r.levels.iter().map(|l| (l.name.clone(), l.bytes)).collect(),
        max_rank_injected: r.per_rank.iter().map(|x| x.sent).max().unwrap_or(0),
        ratio_to_ringcast: 1.0,
        completion_ns: r.completion_ns,
    }
}

/// Table 1: link traffic of ring vs ringcast Allgather and binomial vs ringcast Broadcast
/// (root 0), `len` bytes per rank, loss-free.
pub fn traffic(spec: TopologySpec, len: u64, threads: usize) -> Result<Vec<TrafficRow>, SimError> {
    let ranks = spec.hosts();
    let jobs = [0u8, 1, 2, 3];
    let rows = par_map(&jobs, threads, |j| -> Result<TrafficRow, SimError> {
        Ok(match j {
            0 => sim_row(
                spec,
                "allgather",
                &sim(
                    spec,
                    Workload::new().allgather_uniform(Duration::ZERO, ranks, len),
                    0.0,
                )?,
            ),
            1 => base_row(
                spec,
                "allgather",
                &baseline(spec, Baseline::RingAllgather { len }, 0.0)?,
            ),
            2 => sim_row(
                spec,
                "broadcast",
                &sim(spec, Workload::new().broadcast(Duration::ZERO, 0, len), 0.0)?,
            ),
            _ => base_row(
                spec,
                "broadcast",
                &baseline(
                    spec,
                    Baseline::Binomial {
                        root: 0,
                        len,
                        forwarding: Forwarding::StoreAndForward,
                    },
                    0.0,
                )?,
            ),
        })
    });
    let mut rows = rows.into_iter().collect::<Result<Vec<_>, _>>()?;
    for pair in rows.chunks_mut(2) {
        let base = pair[0].total_link_bytes.max(1) as f64;
        for r in pair {
            r.ratio_to_ringcast = r.total_link_bytes as f64 / base;
        }
    }
    Ok(rows)
}

/// One completion time (table 2).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TimeRow {
    /// `allgather` or `broadcast`.
    pub collective: &'static str,
    /// Message size: a Broadcast's buffer; an Allgather's whole output buffer (each rank
    /// contributes `size / P`, at least 1 byte), as nccl-tests count it.
    pub size: u64,
    /// Who.
    pub algorithm: String,
    /// When the last rank finished, ns (`None`: did not complete).
    pub completion_ns: Option<u64>,
}

/// The algorithms of table 2, per collective.
/// (A pipelined binomial tree is left out: its root still sends ceil(log2 P) copies, so it
/// finishes with the store-and-forward one.)
const BCAST_ALGOS: [&str; 4] = [
    "ringcast",
    "binomial broadcast (store-and-forward)",
    "chain broadcast",
    "go-back-N multicast (Cepheus)",
];
const AG_ALGOS: [&str; 2] = ["ringcast", "ring allgather"];

/// Table 2: completion time against message size, loss-free.
pub fn sizes(spec: TopologySpec, sizes: &[u64], threads: usize) -> Result<Vec<TimeRow>, SimError> {
    let ranks = spec.hosts();
    let mut jobs = Vec::new();
    for &size in sizes {
        for a in BCAST_ALGOS {
            jobs.push(("broadcast", size, a));
        }
        for a in AG_ALGOS {
            jobs.push(("allgather", size, a));
        }
    }
    let rows = par_map(&jobs, threads, |&(collective, size, a)| {
        let block = (size / u64::from(ranks)).max(1);
        let t = match (collective, a) {
            ("broadcast", "ringcast") => sim_time(&sim(
                spec,
                Workload::new().broadcast(Duration::ZERO, 0, size),
                0.0,
            )?),
            ("allgather", "ringcast") => sim_time(&sim(
                spec,
                Workload::new().allgather_uniform(Duration::ZERO, ranks, block),
                0.0,
            )?),
            ("allgather", _) => done(baseline(spec, Baseline::RingAllgather { len: block }, 0.0)?),
            (_, a) => {
                let b = match a {
                    "binomial broadcast (store-and-forward)" => Baseline::Binomial {
                        root: 0,
                        len: size,
                        forwarding: Forwarding::StoreAndForward,
                    },
                    "chain broadcast" => Baseline::Chain { root: 0, len: size },
                    _ => Baseline::GoBackNMulticast { root: 0, len: size },
                };
                done(baseline(spec, b, 0.0)?)
            }
        };
        Ok(TimeRow {
            collective,
            size,
            algorithm: a.to_owned(),
            completion_ns: t,
        })
    });
    rows.into_iter().collect()
}

fn done(r: BaselineReport) -> Option<u64> {
    r.completed.then_some(r.completion_ns)
}

/// One point of the loss sweep (table 3).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LossRow {
    /// Ranks.
    pub ranks: u32,
    /// Bernoulli loss per packet per link.
    pub loss: f64,
    /// Who.
    pub algorithm: String,
    /// Completion, ns (`None`: did not complete).
    pub completion_ns: Option<u64>,
    /// Loss-free completion over this completion.
    pub normalised_throughput: Option<f64>,
    /// Packets lost on links.
    pub lost: u64,
    /// Recovery work: chunks fetched from a neighbour (ringcast), packets resent (baselines).
    pub recovered: u64,
    /// ringcast: the deepest chain of ring reads behind any recovered chunk (`max_fetch_depth`
    /// over every rank); `None` for the baselines.
    pub max_depth: Option<u32>,
    /// Bytes the root put on its link (multicasts, resends, and for ringcast the reads it
    /// served) over the buffer's size.
    pub root_sent: f64,
}

const LOSS_ALGOS: [&str; 3] = [
    "ringcast",
    "go-back-N multicast (Cepheus)",
    "chain broadcast",
];

/// Table 3: a `len`-byte Broadcast from rank 0 under Bernoulli link loss; throughput
/// normalised to each algorithm's loss-free run. `losses` should not include 0.
pub fn loss(
    spec: TopologySpec,
    len: u64,
    losses: &[f64],
    threads: usize,
) -> Result<Vec<LossRow>, SimError> {
    let mut jobs = Vec::new();
    for &l in std::iter::once(&0.0).chain(losses) {
        for a in LOSS_ALGOS {
            jobs.push((l, a));
        }
    }
    let runs = par_map(&jobs, threads, |&(l, a)| -> Result<_, SimError> {
        Ok(match a {
            "ringcast" => {
                let r = sim(spec, Workload::new().broadcast(Duration::ZERO, 0, len), l)?;
                let root = r
                    .per_rank
                    .first()
                    .map_or(0, |x| x.bytes_sent + x.bytes_served);
                let depth = r.per_rank.iter().map(|x| x.max_fetch_depth).max();
                (sim_time(&r), r.fabric.lost, r.chunks_fetched, depth, root)
            }
            _ => {
                let b = if a == "chain broadcast" {
                    Baseline::Chain { root: 0, len }
                } else {
                    Baseline::GoBackNMulticast { root: 0, len }
                };
                let r = baseline(spec, b, l)?;
                let root = r.per_rank.first().map_or(0, |x| x.sent);
                (done(r.clone()), r.lost, r.retransmissions, None, root)
            }
        })
    });
    let runs = runs.into_iter().collect::<Result<Vec<_>, _>>()?;
    let clean: Vec<Option<u64>> = runs[..LOSS_ALGOS.len()].iter().map(|r| r.0).collect();
    Ok(jobs
        .iter()
        .zip(&runs)
        .enumerate()
        .filter(|(i, _)| *i >= LOSS_ALGOS.len())
        .map(
            |(i, (&(l, a), &(t, lost, recovered, max_depth, root)))| LossRow {
                ranks: spec.hosts(),
                loss: l,
                algorithm: a.to_owned(),
                completion_ns: t,
                normalised_throughput: match (clean[i % LOSS_ALGOS.len()], t) {
                    (Some(c), Some(t)) if t > 0 => Some(c as f64 / t as f64),
                    _ => None,
                },
                lost,
                recovered,
                max_depth,
                root_sent: root as f64 / len.max(1) as f64,
            },
        )
        .collect())
}

/// An Allgather and a ring Reduce-Scatter started together (table 4).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ConcurrentRow {
    /// Which Allgather ran: `ring allgather` or `ringcast`.
    pub allgather: String,
    /// Its completion alone, ns.
    pub allgather_alone_ns: Option<u64>,
    /// Its completion next to the Reduce-Scatter, ns.
    pub allgather_ns: Option<u64>,
    /// The Reduce-Scatter's completion alone, ns.
    pub reduce_scatter_alone_ns: Option<u64>,
    /// The Reduce-Scatter's completion next to the Allgather, ns.
    pub reduce_scatter_ns: Option<u64>,
}

/// Table 4: an Allgather of `size` bytes in all (`size / P` per rank) and a ring
/// Reduce-Scatter of a `size`-byte buffer per rank, started together on every rank, once with
/// the ring Allgather and once with ringcast's (run through the real core, sharing the links
/// with the Reduce-Scatter: [`run_with_sim`]).
pub fn concurrent(
    spec: TopologySpec,
    size: u64,
    threads: usize,
) -> Result<Vec<ConcurrentRow>, SimError> {
    let ranks = spec.hosts();
    let block = (size / u64::from(ranks)).max(1);
    let at0 = |algorithm| BaselineOp {
        start: Duration::ZERO,
        algorithm,
    };
    let rs = at0(Baseline::RingReduceScatter { len: size });
    let ring = at0(Baseline::RingAllgather { len: block });
    let ag = || Workload::new().allgather_uniform(Duration::ZERO, ranks, block);
    let jobs = [0u8, 1, 2, 3, 4];
    let out = par_map(&jobs, threads, |j| -> Result<Vec<Option<u64>>, SimError> {
        let mut cfg = BaselineConfig::new(spec, Vec::new());
        cfg.seed = SEED;
        Ok(match j {
            0 => {
                cfg.ops = vec![ring, rs];
                run(&cfg)?.into_iter().map(done).collect()
            }
            1 => {
                cfg.ops = vec![ring];
                run(&cfg)?.into_iter().map(done).collect()
            }
            2 => {
                cfg.ops = vec![rs];
                run(&cfg)?.into_iter().map(done).collect()
            }
            3 => vec![sim_time(&sim(spec, ag(), 0.0)?)],
            _ => {
                let mut s = SimConfig::new(spec, ag());
                s.seed = SEED;
                let (sim_r, base) = run_with_sim(s, vec![rs])?;
                let mut v = vec![sim_time(&sim_r)];
                v.extend(base.into_iter().map(done));
                v
            }
        })
    });
    let out = out.into_iter().collect::<Result<Vec<_>, _>>()?;
    let first = |v: &Vec<Option<u64>>, i: usize| v.get(i).copied().flatten();
    Ok(vec![
        ConcurrentRow {
            allgather: "ring allgather".into(),
            allgather_alone_ns: first(&out[1], 0),
            allgather_ns: first(&out[0], 0),
            reduce_scatter_alone_ns: first(&out[2], 0),
            reduce_scatter_ns: first(&out[0], 1),
        },
        ConcurrentRow {
            allgather: "ringcast".into(),
            allgather_alone_ns: first(&out[3], 0),
            allgather_ns: first(&out[4], 0),
            reduce_scatter_alone_ns: first(&out[2], 0),
            reduce_scatter_ns: first(&out[4], 1),
        },
    ])
}

/// `bytes` in the largest binary unit that keeps it whole-ish: `64 KiB`, `1.5 MiB`.
pub fn bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if v.fract() == 0.0 {
        format!("{v:.0} {}", UNITS[u])
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// `ns` as microseconds with one decimal, or `-` for none.
pub fn micros(ns: Option<u64>) -> String {
    ns.map_or_else(|| "-".to_owned(), |n| format!("{:.1}", n as f64 / 1000.0))
}

/// A markdown table of `header` and `rows`.
pub fn markdown(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut s = format!("| {} |\n|", header.join(" | "));
    for _ in header {
        s.push_str("---|");
    }
    s.push('\n');
    for r in rows {
        s.push_str(&format!("| {} |\n", r.join(" | ")));
    }
    s
}

/// Table 1 as markdown rows.
pub fn traffic_markdown(rows: &[TrafficRow]) -> String {
    let mut levels: Vec<String> = Vec::new();
    for r in rows {
        for (n, _) in &r.levels {
            if !levels.contains(n) {
                levels.push(n.clone());
            }
        }
    }
    let mut header = vec!["collective", "algorithm", "total link bytes"];
    header.extend(levels.iter().map(String::as_str));
    header.extend(["max NIC injection", "vs ringcast", "completion (us)"]);
    let body: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let mut v = vec![
                r.collective.to_owned(),
                r.algorithm.clone(),
                bytes(r.total_link_bytes),
            ];
            for l in &levels {
                let b = r.levels.iter().find(|x| &x.0 == l).map_or(0, |x| x.1);
                v.push(bytes(b));
            }
            v.push(bytes(r.max_rank_injected));
            v.push(format!("{:.2}x", r.ratio_to_ringcast));
            v.push(micros(Some(r.completion_ns)));
            v
        })
        .collect();
    markdown(&header, &body)
}

/// Table 2 as markdown: one row per size and collective, one column per algorithm.
pub fn sizes_markdown(rows: &[TimeRow]) -> String {
    let mut out = String::new();
    for (collective, algos) in [
        ("broadcast", &BCAST_ALGOS[..]),
        ("allgather", &AG_ALGOS[..]),
    ] {
        let mut header = vec!["size"];
        header.extend(algos.iter().copied());
        let mut sizes: Vec<u64> = rows
            .iter()
            .filter(|r| r.collective == collective)
            .map(|r| r.size)
            .collect();
        sizes.dedup();
        let body: Vec<Vec<String>> = sizes
            .iter()
            .map(|&s| {
                let mut v = vec![bytes(s)];
                for a in algos {
                    let t = rows
                        .iter()
                        .find(|r| r.collective == collective && r.size == s && r.algorithm == *a)
                        .and_then(|r| r.completion_ns);
                    v.push(micros(t));
                }
                v
            })
            .collect();
        out.push_str(&format!(
            "**{collective}**, completion in microseconds\n\n{}\n",
            markdown(&header, &body)
        ));
    }
    out
}

/// Table 3 as markdown.
pub fn loss_markdown(rows: &[LossRow]) -> String {
    let header = [
        "ranks",
        "loss",
        "algorithm",
        "completion (us)",
        "normalised throughput",
        "packets lost",
        "recovered (fetched / resent)",
        "max fetch depth",
        "root sends (x buffer)",
    ];
    let body: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.ranks.to_string(),
                format!("{:.0e}", r.loss),
                r.algorithm.clone(),
                micros(r.completion_ns),
                r.normalised_throughput
                    .map_or_else(|| "-".into(), |x| format!("{x:.3}")),
                r.lost.to_string(),
                r.recovered.to_string(),
                r.max_depth.map_or_else(|| "-".into(), |d| d.to_string()),
                format!("{:.4}", r.root_sent),
            ]
        })
        .collect();
    markdown(&header, &body)
}

/// Table 4 as markdown.
pub fn concurrent_markdown(rows: &[ConcurrentRow]) -> String {
    let header = [
        "allgather",
        "allgather alone (us)",
        "allgather with RS (us)",
        "reduce-scatter alone (us)",
        "reduce-scatter with AG (us)",
    ];
    let body: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.allgather.clone(),
                micros(r.allgather_alone_ns),
                micros(r.allgather_ns),
                micros(r.reduce_scatter_alone_ns),
                micros(r.reduce_scatter_ns),
            ]
        })
        .collect();
    markdown(&header, &body)
}

/// The loss values of [`loss`]'s sweep: 1e-8 .. 1e-4, one per decade.
pub fn loss_decades() -> Vec<f64> {
    vec![1e-8, 1e-7, 1e-6, 1e-5, 1e-4]
}
