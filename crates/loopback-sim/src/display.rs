//! The readable table form of a [`Report`].

use crate::report::{Failure, Outcome, RankReport, Report};
use std::fmt::{self, Display, Formatter, Write as _};

/// Ranks listed in full up to this many; beyond, only the ones that did not complete.
const FULL_RANK_TABLE: usize = 32;

/// `1536` -> `1.5 KiB`.
pub(crate) fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// `1_372_000` -> `1.372 ms`.
pub(crate) fn nanos(n: u64) -> String {
    if n >= 1_000_000_000 {
        format!("{:.3} s", n as f64 / 1e9)
    } else if n >= 1_000_000 {
        format!("{:.3} ms", n as f64 / 1e6)
    } else if n >= 1_000 {
        format!("{:.3} us", n as f64 / 1e3)
    } else {
        format!("{n} ns")
    }
}

impl Display for Failure {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        match *self {
            Failure::PeerUnresponsive { peer } => write!(f, "rank {peer} unresponsive"),
            Failure::PeerFailed { peer, reported_by } => {
                write!(f, "rank {peer} failed (reported by {reported_by})")
            }
            Failure::ReadFailed { peer } => write!(f, "read from rank {peer} failed"),
            Failure::Other { peer } => write!(f, "error blaming rank {peer}"),
        }
    }
}

impl Display for Outcome {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::NotStarted => f.write_str("not started"),
            Outcome::Pending => f.write_str("HUNG"),
            Outcome::Completed {
                at_ns,
                mismatches: 0,
            } => write!(f, "ok at {}", nanos(*at_ns)),
            Outcome::Completed { at_ns, mismatches } => {
                write!(f, "WRONG DATA ({mismatches} chunks) at {}", nanos(*at_ns))
            }
            Outcome::Failed { at_ns, error } => write!(f, "failed at {}: {error}", nanos(*at_ns)),
            Outcome::Rejected { reason } => write!(f, "rejected: {reason}"),
            Outcome::Crashed => f.write_str("crashed"),
        }
    }
}

/// One rank's row; `truncated`: the run stopped at its time limit, so an operation still
/// pending is unfinished, not hung.
fn rank_row(f: &mut Formatter<'_>, r: &RankReport, truncated: bool) -> fmt::Result {
    let mut outcome = String::new();
    for (i, o) in r.outcomes.iter().enumerate() {
        if i > 0 {
            outcome.push_str("; ");
        }
        match o {
            Outcome::Pending if truncated => outcome.push_str("unfinished"),
            o => {
                let _ = write!(outcome, "{o}");
            }
        }
    }
    writeln!(
        f,
        "  {:>5}  {:<44} {:>10} {:>10} {:>10} {:>8} {:>5}",
        r.rank,
        outcome,
        bytes(r.bytes_sent),
        bytes(r.bytes_received),
        bytes(r.bytes_read),
        r.chunks_fetched,
        r.max_fetch_depth
    )
}

impl Display for Report {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "ringcast sim: {}, {} ranks, seed {}",
            self.topology, self.ranks, self.seed
        )?;
        let verdict = match (self.verified, self.all_completed()) {
            (false, _) => "WRONG DATA",
            (true, true) => "verified, all completed",
            (true, false) if !self.all_finished && self.truncated => {
                "verified so far, some ranks unfinished"
            }
            (true, false) if !self.all_finished => "verified, but some ranks HUNG",
            (true, false) if self.ops.iter().any(|o| o.completed + o.failed == 0) => {
                "verified, but every rank crashed during an operation: none completed it"
            }
            (true, false) => "verified, some ranks failed with typed errors",
        };
        writeln!(
            f,
            "result: {verdict}{} | last op finished at {} virtual, {} deliveries, {} events",
            if self.truncated {
                " (TRUNCATED at time limit)"
            } else {
                ""
            },
            nanos(self.makespan_ns),
            self.deliveries,
            self.events
        )?;
        if self.mismatches > 0 || self.reads_after_release > 0 {
            writeln!(
                f,
                "  {} wrong chunk slots, {} reads of released buffers",
                self.mismatches, self.reads_after_release
            )?;
        }
        writeln!(f, "\noperations")?;
        writeln!(
            f,
            "  {:>3}  {:<10} {:>5} {:>10} {:>9} {:>6} {:>7} {:>10} {:>9} {:>11}",
            "#",
            "kind",
            "root",
            "bytes",
            "completed",
            "failed",
            "crashed",
            "unfinished",
            "corrupted",
            "time"
        )?;
        for (i, o) in self.ops.iter().enumerate() {
            writeln!(
                f,
                "  {:>3}  {:<10} {:>5} {:>10} {:>9} {:>6} {:>7} {:>10} {:>9} {:>11}",
                i,
                o.kind.name(),
                o.kind
                    .root()
                    .map_or_else(|| "all".into(), |r| r.to_string()),
                bytes(o.kind.buffer_len()),
                o.completed,
                o.failed,
                o.crashed,
                o.unfinished,
                o.corrupted,
                o.duration_ns.map_or_else(|| "-".into(), nanos)
            )?;
        }
        writeln!(
            f,
            "\nrecovery: {} chunks fetched, max fetch depth {}",
            self.chunks_fetched, self.max_fetch_depth
        )?;
        let c = &self.fabric;
        writeln!(
            f,
            "fabric: lost {}, burst-lost {}, checksum drops {} (payload) + {} (imm), \
             escaped checksum {}, copies failed {}, rnr {}, \
             duplicated {}, reordered {}, to crashed {}, control to crashed {}, reads failed {}",
            c.lost,
            c.burst_lost,
            c.corrupted_payload,
            c.corrupted_imm,
            c.escaped_checksum,
            c.copy_failed,
            c.rnr,
            c.duplicated,
            c.reordered,
            c.to_crashed,
            c.control_to_crashed,
            c.reads_failed
        )?;
        let d = &self.core;
        writeln!(
            f,
            "core drops: duplicate {}, stale {}, out of range {}, wrong source {}, wrong lane {}, \
             own {}, bad length {}, control {}; released {}",
            d.duplicate,
            d.stale,
            d.out_of_range,
            d.wrong_source,
            d.wrong_lane,
            d.own,
            d.bad_length,
            d.control,
            d.released
        )?;
        writeln!(f, "\nlinks by level: {} in all", bytes(self.link_bytes))?;
        writeln!(
            f,
            "  {:>5}  {:<12} {:>6} {:>12} {:>12} {:>12} {:>8}",
            "level", "name", "links", "up", "down", "busiest", "lost"
        )?;
        for l in &self.levels {
            writeln!(
                f,
                "  {:>5}  {:<12} {:>6} {:>12} {:>12} {:>12} {:>8}",
                l.level,
                l.name,
                l.links,
                bytes(l.up_bytes),
                bytes(l.down_bytes),
                bytes(l.busiest),
                l.lost
            )?;
        }
        let full = self.per_rank.len() <= FULL_RANK_TABLE;
        let rows: Vec<&RankReport> = self
            .per_rank
            .iter()
            .filter(|r| {
                full || r
                    .outcomes
                    .iter()
                    .any(|o| !matches!(o, Outcome::Completed { mismatches: 0, .. }))
            })
            .collect();
        if full {
            writeln!(f, "\nranks")?;
        } else if rows.is_empty() {
            writeln!(
                f,
                "\nranks: all {} completed with every byte right (--json lists each)",
                self.per_rank.len()
            )?;
        } else {
            writeln!(
                f,
                "\nranks that did not complete ({} of {}; --json lists all)",
                rows.len(),
                self.per_rank.len()
            )?;
        }
        if !rows.is_empty() {
            writeln!(
                f,
                "  {:>5}  {:<44} {:>10} {:>10} {:>10} {:>8} {:>5}",
                "rank", "outcome", "sent", "received", "read", "fetched", "depth"
            )?;
        }
        for r in rows {
            rank_row(f, r, self.truncated)?;
        }
        Ok(())
    }
}
