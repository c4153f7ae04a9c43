//! What a baseline run reports: completion, bytes per link level and per rank, losses and
//! retransmissions.

use crate::queue::{PS_PER_NS, Ps};
use crate::topology::Topology;
use serde::Serialize;

/// Counters of one flow, kept by the engine.
#[derive(Clone, Debug)]
pub(crate) struct FlowStats {
    pub(crate) start: Ps,
    /// Payload bytes transmitted per cable level.
    pub(crate) level_bytes: Vec<u64>,
    /// Link transmissions (one packet crossing one link).
    pub(crate) link_packets: u64,
    /// Packets lost on a link.
    pub(crate) lost: u64,
    /// Packets sent again (timeout retransmissions, go-back-N resends).
    pub(crate) retransmissions: u64,
    /// Sender timeouts (go-back-N).
    pub(crate) timeouts: u64,
    /// ACK and NACK messages sent by receivers and switches.
    pub(crate) control: u64,
    /// Payload bytes each host's NIC injected.
    pub(crate) sent: Vec<u64>,
    /// Payload bytes delivered to each host (duplicates included).
    pub(crate) received: Vec<u64>,
    /// When each rank finished.
    pub(crate) done: Vec<Option<Ps>>,
}

impl FlowStats {
    pub(crate) fn new(start: Ps, hosts: usize, levels: usize) -> Self {
        FlowStats {
            start,
            level_bytes: vec![0; levels],
            link_packets: 0,
            lost: 0,
            retransmissions: 0,
            timeouts: 0,
            control: 0,
            sent: vec![0; hosts],
            received: vec![0; hosts],
            done: vec![None; hosts],
        }
    }
}

/// Bytes on the links of one cable level.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LevelBytes {
    /// `host-edge`, `edge-agg`, `agg-core` (fat tree); `host-leaf`, `leaf-spine`; `host-switch`.
    pub name: String,
    /// Payload bytes transmitted on this level's links, both directions.
    pub bytes: u64,
}

/// One rank's share of a baseline run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RankTraffic {
    /// The rank.
    pub rank: u32,
    /// Payload bytes its NIC injected.
    pub sent: u64,
    /// Payload bytes delivered to it (duplicates included).
    pub received: u64,
    /// When it finished, nanoseconds after the operation started (`None`: never).
    pub done_ns: Option<u64>,
}

/// The result of one baseline operation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BaselineReport {
    /// The algorithm, in words.
    pub algorithm: String,
    /// Ranks.
    pub ranks: u32,
    /// Whether every rank finished.
    pub completed: bool,
    /// When the last rank finished, nanoseconds after the start.
    pub completion_ns: u64,
    /// Payload bytes summed over every link crossed.
    pub total_link_bytes: u64,
    /// The same per cable level, lowest first.
    pub levels: Vec<LevelBytes>,
    /// Packets lost on links.
    pub lost: u64,
    /// Packets sent again.
    pub retransmissions: u64,
    /// Sender timeouts (go-back-N only).
    pub timeouts: u64,
    /// ACK/NACK messages (go-back-N only; not counted in link bytes).
    pub control_messages: u64,
    /// Per rank.
    pub per_rank: Vec<RankTraffic>,
}

impl BaselineReport {
    pub(crate) fn new(algorithm: String, s: &FlowStats, topo: &Topology) -> Self {
        let ns = |t: Ps| t.saturating_sub(s.start) / PS_PER_NS;
        let per_rank: Vec<RankTraffic> = (0..topo.hosts as usize)
            .map(|r| RankTraffic {
                rank: r as u32,
                sent: s.sent[r],
                received: s.received[r],
                done_ns: s.done[r].map(ns),
            })
            .collect();
        BaselineReport {
            algorithm,
            ranks: topo.hosts,
            completed: per_rank.iter().all(|r| r.done_ns.is_some()),
            completion_ns: per_rank.iter().filter_map(|r| r.done_ns).max().unwrap_or(0),
            total_link_bytes: s.level_bytes.iter().sum(),
            levels: s
                .level_bytes
                .iter()
                .enumerate()
                .map(|(l, b)| LevelBytes {
                    name: topo.level_name(l as u8).to_owned(),
                    bytes: *b,
                })
                .collect(),
            lost: s.lost,
            retransmissions: s.retransmissions,
            timeouts: s.timeouts,
            control_messages: s.control,
            per_rank,
        }
    }

    /// Bytes at the level named `name` (0 if there is none).
    pub fn level(&self, name: &str) -> u64 {
        self.levels
            .iter()
            .find(|l| l.name == name)
            .map_or(0, |l| l.bytes)
    }
}
