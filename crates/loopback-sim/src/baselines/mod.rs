//! Baselines in the same simulator: the collectives ringcast is compared against, as compact
//! models over the same topology, links, routes, event queue and link loss.
//!
//! * [`Baseline::RingAllgather`] and [`Baseline::RingReduceScatter`]: unicast rings,
//!   pipelined by chunks;
//! * [`Baseline::Binomial`] / [`Baseline::KNomial`] broadcast trees, store-and-forward or
//!   pipelined ([`Forwarding`]); [`Baseline::Chain`], pipelined;
//! * [`Baseline::GoBackNMulticast`]: sender-retransmit multicast with go-back-N and in-switch
//!   ACK/NACK aggregation (the Cepheus design).
//!
//! These are models, not protocol implementations: packets carry no data, unicast losses are
//! retransmitted by the sender one timeout after the send (an ideal ACK oracle), and ACKs and
//! NACKs cost latency but no bandwidth and are never lost. Only link loss (Bernoulli and
//! burst) of [`Faults`] applies. ringcast itself runs through the real core with [`crate::Sim`];
//! [`run_with_sim`] runs baselines and a `Sim` on one shared fabric.
//!
//! ```
//! use ringcast_loopback_sim::TopologySpec;
//! use ringcast_loopback_sim::baselines::{self, Baseline, BaselineConfig};
//! let cfg = BaselineConfig::one(TopologySpec::Star { hosts: 4 }, Baseline::RingAllgather { len: 8192 });
//! let r = &baselines::run(&cfg)?[0];
//! assert!(r.completed);
//! assert_eq!(r.total_link_bytes, 4 * 3 * 8192 * 2); // P(P-1)N on each of up and down links
//! # Ok::<(), ringcast_loopback_sim::SimError>(())
//! ```

mod binomial;
mod cepheus;
mod chain;
mod cosim;
mod engine;
mod report;
mod ring;
pub mod study;
mod tree;

pub use cosim::run_with_sim;
pub use report::{BaselineReport, LevelBytes, RankTraffic};
pub use tree::Forwarding;

use crate::config::{SimConfig, SimError};
use crate::faults::Faults;
use crate::queue::{PS_PER_NS, Ps};
use crate::topology::{Topology, TopologySpec};
use cepheus::{GoBackN, GoBackNParams};
use engine::{Engine, Flow};
use serde::Serialize;
use std::fmt;
use std::time::Duration;

/// A baseline collective and its arguments.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
#[non_exhaustive]
pub enum Baseline {
    /// Ring Allgather of `len` bytes per rank (P - 1 steps, chunk-pipelined).
    RingAllgather {
        /// Bytes each rank contributes.
        len: u64,
    },
    /// Ring Reduce-Scatter of a `len`-byte buffer per rank (P - 1 steps of `len / P`).
    RingReduceScatter {
        /// Bytes of each rank's input buffer.
        len: u64,
    },
    /// Binomial-tree Broadcast.
    Binomial {
        /// The sending rank.
        root: u32,
        /// Bytes.
        len: u64,
        /// Store-and-forward or pipelined.
        forwarding: Forwarding,
    },
    /// k-nomial-tree Broadcast.
    KNomial {
        /// The sending rank.
        root: u32,
        /// Bytes.
        len: u64,
        /// Radix of the tree (at least 2).
        k: u32,
        /// Store-and-forward or pipelined.
        forwarding: Forwarding,
    },
    /// Chain Broadcast, root -> root+1 -> ..., chunk-pipelined.
    Chain {
        /// The sending rank.
        root: u32,
        /// Bytes.
        len: u64,
    },
    /// Multicast Broadcast with go-back-N sender retransmission and in-switch ACK/NACK
    /// aggregation (Cepheus).
    GoBackNMulticast {
        /// The sending rank.
        root: u32,
        /// Bytes.
        len: u64,
    },
}

impl Baseline {
    fn root(&self) -> Option<u32> {
        match *self {
            Baseline::RingAllgather { .. } | Baseline::RingReduceScatter { .. } => None,
            Baseline::Binomial { root, .. }
            | Baseline::KNomial { root, .. }
            | Baseline::Chain { root, .. }
            | Baseline::GoBackNMulticast { root, .. } => Some(root),
        }
    }
}

impl fmt::Display for Baseline {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mode = |m: &Forwarding| match m {
            Forwarding::StoreAndForward => "store-and-forward",
            Forwarding::Pipelined => "pipelined",
        };
        match self {
            Baseline::RingAllgather { .. } => f.write_str("ring allgather"),
            Baseline::RingReduceScatter { .. } => f.write_str("ring reduce-scatter"),
            Baseline::Binomial { forwarding, .. } => {
                write!(f, "binomial broadcast ({})", mode(forwarding))
            }
            Baseline::KNomial { k, forwarding, .. } => {
                write!(f, "{k}-nomial broadcast ({})", mode(forwarding))
            }
            Baseline::Chain { .. } => f.write_str("chain broadcast"),
            Baseline::GoBackNMulticast { .. } => f.write_str("go-back-N multicast (Cepheus)"),
        }
    }
}

/// One baseline operation and when every rank starts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct BaselineOp {
    /// Virtual start time.
    pub start: Duration,
    /// What runs.
    pub algorithm: Baseline,
}

/// Parameters of a baseline run: the fabric as in [`SimConfig`], plus the baselines' own
/// reliability knobs.
#[derive(Clone, Debug, PartialEq)]
pub struct BaselineConfig {
    /// Seed of the loss draws.
    pub seed: u64,
    /// The fabric.
    pub topology: TopologySpec,
    /// Bandwidth of every link, bytes per second.
    pub bandwidth: u64,
    /// Latency of every link.
    pub latency: Duration,
    /// Bytes per packet.
    pub chunk_size: u32,
    /// Faults; only link loss (Bernoulli and burst) applies.
    pub faults: Faults,
    /// Retransmission timeout: unicast resend of a lost packet, go-back-N without ACK progress.
    pub rto: Duration,
    /// Go-back-N: packets in flight beyond the aggregated cumulative ACK.
    pub window: u32,
    /// Go-back-N: a receiver ACKs every this many in-order packets (and the last one).
    pub ack_every: u32,
    /// Go-back-N: the same NACK (or go-back) is repeated at most once per this interval.
    pub nack_gap: Duration,
    /// What runs.
    pub ops: Vec<BaselineOp>,
}

impl BaselineConfig {
    /// The fabric of [`SimConfig::new`] (100 Gbit/s, 500 ns links, 4 KiB packets), a 100 us
    /// retransmission timeout, a 256-packet window, an ACK every 16 packets.
    pub fn new(topology: TopologySpec, ops: Vec<BaselineOp>) -> Self {
        let sim = SimConfig::new(topology, crate::Workload::new());
        Self::like(&sim, ops)
    }

    /// One operation at time zero.
    pub fn one(topology: TopologySpec, algorithm: Baseline) -> Self {
        Self::new(
            topology,
            vec![BaselineOp {
                start: Duration::ZERO,
                algorithm,
            }],
        )
    }

    /// The same fabric, seed and faults as `sim`.
    pub fn like(sim: &SimConfig, ops: Vec<BaselineOp>) -> Self {
        BaselineConfig {
            seed: sim.seed,
            topology: sim.topology,
            bandwidth: sim.bandwidth,
            latency: sim.latency,
            chunk_size: sim.chunk_size,
            faults: sim.faults.clone(),
            rto: Duration::from_micros(100),
            window: 256,
            ack_every: 16,
            nack_gap: Duration::from_micros(20),
            ops,
        }
    }

    fn engine(&self) -> Result<(Engine, Vec<String>), SimError> {
        let topo = Topology::build(&self.topology)?;
        if self.bandwidth == 0 {
            return Err(SimError::Invalid("bandwidth must be positive"));
        }
        if self.chunk_size == 0 {
            return Err(SimError::Invalid("chunk size must be positive"));
        }
        let ranks = topo.hosts;
        if let Some(index) = self
            .ops
            .iter()
            .position(|o| o.algorithm.root().is_some_and(|r| r >= ranks))
        {
            return Err(SimError::BadOp { index });
        }
        let params = GoBackNParams {
            window: self.window,
            ack_every: self.ack_every,
            nack_gap: ps(self.nack_gap),
        };
        let mut e = Engine::new(
            topo,
            self.bandwidth,
            ps(self.latency),
            &self.faults,
            self.seed,
            ps(self.rto).max(1),
        );
        let chunk = self.chunk_size;
        let mut names = Vec::new();
        for op in &self.ops {
            names.push(op.algorithm.to_string());
            let a = op.algorithm;
            e.add(ps(op.start), |id| -> Box<dyn Flow> {
                match a {
                    Baseline::RingAllgather { len } => {
                        Box::new(ring::Ring::new(id, ranks, len, chunk))
                    }
                    Baseline::RingReduceScatter { len } => Box::new(ring::Ring::new(
                        id,
                        ranks,
                        len.div_ceil(u64::from(ranks)),
                        chunk,
                    )),
                    Baseline::Binomial {
                        root,
                        len,
                        forwarding,
                    } => Box::new(tree::TreeBroadcast::new(
                        id,
                        root,
                        len,
                        chunk,
                        binomial::knomial_children(ranks, root, 2),
                        forwarding,
                    )),
                    Baseline::KNomial {
                        root,
                        len,
                        k,
                        forwarding,
                    } => Box::new(tree::TreeBroadcast::new(
                        id,
                        root,
                        len,
                        chunk,
                        binomial::knomial_children(ranks, root, k),
                        forwarding,
                    )),
                    Baseline::Chain { root, len } => Box::new(tree::TreeBroadcast::new(
                        id,
                        root,
                        len,
                        chunk,
                        chain::chain_children(ranks, root),
                        Forwarding::Pipelined,
                    )),
                    Baseline::GoBackNMulticast { root, len } => {
                        Box::new(GoBackN::new(id, root, len, chunk, params))
                    }
                }
            });
        }
        Ok((e, names))
    }
}

fn ps(d: Duration) -> Ps {
    u64::try_from(d.as_nanos())
        .unwrap_or(u64::MAX / PS_PER_NS)
        .saturating_mul(PS_PER_NS)
        .min(u64::MAX / 4)
}

fn reports(e: &Engine, names: Vec<String>) -> Vec<BaselineReport> {
    names
        .into_iter()
        .zip(&e.net.stats)
        .map(|(n, s)| BaselineReport::new(n, s, &e.net.topo))
        .collect()
}

/// Runs every operation of `cfg` together on one fabric; one report per operation, in order.
pub fn run(cfg: &BaselineConfig) -> Result<Vec<BaselineReport>, SimError> {
    let (mut e, names) = cfg.engine()?;
    e.run();
    Ok(reports(&e, names))
}
