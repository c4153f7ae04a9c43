//! The result of a run: per-rank outcomes, byte counters, drops by cause, and the buffer
//! verification. `Serialize` for snapshots and JSON; `Display` for a readable table.

use crate::workload::OpKind;
use ringcast_core::{OpError, StartError, Stats};
use serde::Serialize;

/// How one operation ended at one rank.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Outcome {
    /// Not started yet (the run ended before its start time, or the rank had crashed).
    NotStarted,
    /// Started, and neither completed nor failed when the run ended: a hang.
    Pending,
    /// Completed; `mismatches` chunk slots differed from the root's data.
    Completed {
        /// Virtual completion time, nanoseconds.
        at_ns: u64,
        /// Chunk slots that did not hold the expected data (must be 0).
        mismatches: u64,
    },
    /// Failed with a typed error.
    Failed {
        /// Virtual failure time, nanoseconds.
        at_ns: u64,
        /// Why.
        error: Failure,
    },
    /// The core refused to start it.
    Rejected {
        /// Why.
        reason: String,
    },
    /// This rank crashed while the operation was in flight.
    Crashed,
}

impl Outcome {
    /// Whether the operation is over at this rank (anything but `NotStarted`/`Pending`).
    pub fn is_final(&self) -> bool {
        !matches!(self, Outcome::NotStarted | Outcome::Pending)
    }
}

/// A core [`OpError`] in serializable form.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Failure {
    /// This rank waited on `peer` past the deadline.
    PeerUnresponsive {
        /// The rank blamed.
        peer: u32,
    },
    /// `reported_by` found `peer` unresponsive.
    PeerFailed {
        /// The rank blamed.
        peer: u32,
        /// Who found out.
        reported_by: u32,
    },
    /// A read from `peer` failed.
    ReadFailed {
        /// The rank blamed.
        peer: u32,
    },
    /// An error kind this simulator does not know yet.
    Other {
        /// The rank blamed.
        peer: u32,
    },
}

impl Failure {
    /// The rank the error blames.
    pub fn peer(&self) -> u32 {
        match *self {
            Failure::PeerUnresponsive { peer }
            | Failure::PeerFailed { peer, .. }
            | Failure::ReadFailed { peer }
            | Failure::Other { peer } => peer,
        }
    }
}

impl From<OpError> for Failure {
    fn from(e: OpError) -> Self {
        match e {
            OpError::PeerUnresponsive { peer } => Failure::PeerUnresponsive { peer: peer.0 },
            OpError::PeerFailed { peer, reported_by } => Failure::PeerFailed {
                peer: peer.0,
                reported_by: reported_by.0,
            },
            OpError::ReadFailed { peer } => Failure::ReadFailed { peer: peer.0 },
            other => Failure::Other {
                peer: other.peer().0,
            },
        }
    }
}

pub(crate) fn rejected(e: StartError) -> Outcome {
    Outcome::Rejected {
        reason: e.to_string(),
    }
}

/// Drops and faults counted by the fabric.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct FabricCounters {
    /// Packets lost on a link (Bernoulli), each pruning a subtree.
    pub lost: u64,
    /// Packets lost in a Gilbert-Elliott burst.
    pub burst_lost: u64,
    /// Deliveries duplicated.
    pub duplicated: u64,
    /// Deliveries delayed (reordered).
    pub reordered: u64,
    /// Deliveries with a corrupted payload, dropped by the receiver's transport checksum.
    pub corrupted_payload: u64,
    /// Deliveries with a corrupted immediate, dropped by the receiver's transport checksum.
    pub corrupted_imm: u64,
    /// Deliveries with a flipped operation-tag bit that escaped the checksum (opt-in fault),
    /// handed to the core.
    pub escaped_checksum: u64,
    /// Deliveries whose payload the receiver's copy failed to write (it released them).
    pub copy_failed: u64,
    /// Chunks that found no posted receive (RNR drops).
    pub rnr: u64,
    /// Chunks that arrived at a crashed host.
    pub to_crashed: u64,
    /// Control messages to a crashed host.
    pub control_to_crashed: u64,
    /// Reads that failed because the peer had crashed.
    pub reads_failed: u64,
    /// Picoseconds roots were paused because a switch port's queue exceeded its buffer
    /// (summed over packets).
    pub paused_ps: u64,
}

/// Drops counted by the cores (summed over ranks).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CoreDrops {
    /// Chunk already present.
    pub duplicate: u64,
    /// No such operation in flight.
    pub stale: u64,
    /// Chunk index out of range.
    pub out_of_range: u64,
    /// Not sent by the chunk's root.
    pub wrong_source: u64,
    /// Wrong lane.
    pub wrong_lane: u64,
    /// Own multicast looped back.
    pub own: u64,
    /// Payload length mismatch.
    pub bad_length: u64,
    /// Placed, then released by the driver (its copy failed).
    pub released: u64,
    /// Control messages malformed, stale or unexpected.
    pub control: u64,
}

impl CoreDrops {
    pub(crate) fn add(&mut self, s: &Stats) {
        self.duplicate += s.dropped_duplicate;
        self.stale += s.dropped_stale;
        self.out_of_range += s.dropped_out_of_range;
        self.wrong_source += s.dropped_wrong_source;
        self.wrong_lane += s.dropped_wrong_lane;
        self.own += s.dropped_own;
        self.bad_length += s.dropped_bad_length;
        self.released += s.chunks_released;
        self.control += s.control_malformed + s.control_stale + s.control_unexpected;
    }
}

/// One rank's results.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RankReport {
    /// The rank.
    pub rank: u32,
    /// Whether it crashed.
    pub crashed: bool,
    /// Outcome per workload operation.
    pub outcomes: Vec<Outcome>,
    /// Multicast payload bytes this rank injected as a root.
    pub bytes_sent: u64,
    /// Payload bytes placed from the fast path.
    pub bytes_received: u64,
    /// Bytes this rank recovered by reads.
    pub bytes_read: u64,
    /// Bytes other ranks read from this rank.
    pub bytes_served: u64,
    /// Chunks recovered by reads (core counter).
    pub chunks_fetched: u64,
    /// Fetch requests sent (core counter).
    pub fetch_requests: u64,
    /// Deepest fetch recursion seen (core counter).
    pub max_fetch_depth: u32,
}

/// One operation's results over all ranks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct OpReport {
    /// What it was.
    pub kind: OpKind,
    /// Start time, nanoseconds.
    pub start_ns: u64,
    /// Ranks that completed with the right data.
    pub completed: u32,
    /// Ranks that failed with a typed error.
    pub failed: u32,
    /// Ranks that crashed.
    pub crashed: u32,
    /// Ranks that never finished (hangs) or never started.
    pub unfinished: u32,
    /// Ranks that completed with wrong data.
    pub corrupted: u32,
    /// Latest completion time, nanoseconds after the start.
    pub duration_ns: Option<u64>,
}

/// Traffic of one directed link.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LinkReport {
    /// Transmitting node (`h3`, `leaf0`, `spine1`, `sw`).
    pub from: String,
    /// Receiving node.
    pub to: String,
    /// Level of the cable (0: host-switch).
    pub level: u8,
    /// Whether the link goes up (towards the spines).
    pub up: bool,
    /// Bytes transmitted.
    pub bytes: u64,
    /// Packets transmitted.
    pub packets: u64,
    /// Packets lost.
    pub lost: u64,
}

/// Traffic of one cable level (`host-edge`, `edge-agg`, `agg-core`; `host-leaf`,
/// `leaf-spine`; `host-switch`), both directions.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LevelReport {
    /// Level (0: host-switch).
    pub level: u8,
    /// Name of the level.
    pub name: String,
    /// Directed links at this level.
    pub links: u32,
    /// Bytes transmitted on up-links.
    pub up_bytes: u64,
    /// Bytes transmitted on down-links.
    pub down_bytes: u64,
    /// Bytes on the busiest directed link.
    pub busiest: u64,
    /// Packets lost at this level.
    pub lost: u64,
}

impl LevelReport {
    /// Bytes transmitted at this level, both directions.
    pub fn bytes(&self) -> u64 {
        self.up_bytes + self.down_bytes
    }
}

/// Everything a run produced.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Report {
    /// The seed.
    pub seed: u64,
    /// The fabric, in words.
    pub topology: String,
    /// Ranks.
    pub ranks: u32,
    /// Whether every completed rank holds exactly the root's data, and no rank read memory
    /// its peer had released.
    pub verified: bool,
    /// Chunk slots that differed, over every completed rank.
    pub mismatches: u64,
    /// Reads that found the peer's buffer already released (a protocol violation).
    pub reads_after_release: u64,
    /// Whether every surviving rank finished every operation (no hang).
    pub all_finished: bool,
    /// Whether the run hit its time limit.
    pub truncated: bool,
    /// Virtual time of the last completion or failure, nanoseconds.
    pub makespan_ns: u64,
    /// Virtual time of the last event (stale timers included), nanoseconds.
    pub end_ns: u64,
    /// Events processed.
    pub events: u64,
    /// Multicast chunks delivered to hosts (before receive-side checks).
    pub deliveries: u64,
    /// Per operation.
    pub ops: Vec<OpReport>,
    /// Per rank.
    pub per_rank: Vec<RankReport>,
    /// Chunks recovered by reads, all ranks.
    pub chunks_fetched: u64,
    /// Deepest fetch recursion, all ranks.
    pub max_fetch_depth: u32,
    /// Fabric drops and faults.
    pub fabric: FabricCounters,
    /// Core drops.
    pub core: CoreDrops,
    /// Bytes transmitted over all directed links (multicast copies and reads).
    pub link_bytes: u64,
    /// Traffic per cable level.
    pub levels: Vec<LevelReport>,
    /// Per directed link.
    pub links: Vec<LinkReport>,
}

impl Report {
    /// Whether the run is a success: verified, nothing hung, every rank that survived
    /// completed every operation, and every operation completed somewhere (an operation
    /// whose every rank crashed delivered nothing to anyone).
    pub fn all_completed(&self) -> bool {
        self.verified
            && self.all_finished
            && self.every_op_completed_somewhere()
            && self
                .ops
                .iter()
                .all(|o| o.failed == 0 && o.unfinished == 0 && o.corrupted == 0)
    }

    /// Whether every operation completed at one rank at least.
    pub(crate) fn every_op_completed_somewhere(&self) -> bool {
        self.ops.iter().all(|o| o.completed > 0)
    }
}

#[cfg(test)]
mod tests {
    use crate::{Crash, Sim, SimConfig, TopologySpec, Workload};
    use std::time::Duration;

    fn crash_at_1us(ranks: &[u32]) -> crate::Report {
        let w = Workload::new().broadcast(Duration::ZERO, 0, 64 << 10);
        let mut cfg = SimConfig::new(TopologySpec::Star { hosts: 4 }, w);
        cfg.faults.crashes = ranks
            .iter()
            .map(|&rank| Crash {
                rank,
                at: Duration::from_micros(1),
            })
            .collect();
        Sim::new(cfg).expect("valid").run()
    }

    #[test]
    fn an_operation_every_rank_crashed_in_is_not_completed() {
        let r = crash_at_1us(&[0, 1, 2, 3]);
        assert_eq!((r.ops[0].completed, r.ops[0].crashed), (0, 4), "{r}");
        assert!(r.verified && r.all_finished, "{r}");
        // Was reported "verified, all completed" with nothing delivered.
        assert!(!r.all_completed(), "{r}");
        assert!(r.to_string().contains("none completed it"), "{r}");
    }

    #[test]
    fn survivors_that_completed_still_count() {
        // A leaf that crashes: the others complete or fail naming it, as before.
        let r = crash_at_1us(&[3]);
        assert_eq!(r.ops[0].crashed, 1, "{r}");
        assert_eq!(
            r.all_completed(),
            r.ops[0].failed == 0 && r.ops[0].unfinished == 0,
            "{r}"
        );
        assert!(crash_at_1us(&[]).all_completed());
    }
}
