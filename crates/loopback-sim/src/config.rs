//! Everything one simulation run needs.

use crate::faults::Faults;
use crate::topology::{TopologyError, TopologySpec};
use crate::workload::Workload;
use ringcast_core::ConfigError;
use std::fmt;
use std::time::Duration;

/// Parameters of a simulation run. Build with [`SimConfig::new`] and adjust the public fields.
#[derive(Clone, Debug, PartialEq)]
pub struct SimConfig {
    /// Seed of every random choice (faults, fingerprints): same seed, same report.
    pub seed: u64,
    /// The fabric.
    pub topology: TopologySpec,
    /// Bandwidth of every link, bytes per second.
    pub bandwidth: u64,
    /// Latency of every link (propagation plus switching).
    pub latency: Duration,
    /// Extra one-way latency of a control message on top of the links' latency (software).
    pub control_overhead: Duration,
    /// Bytes per chunk (one multicast packet's payload).
    pub chunk_size: u32,
    /// Multicast subgroups.
    pub lanes: u16,
    /// Allgather broadcast chains M (roots multicasting at once); see the core's
    /// `Config::chains`.
    pub chains: u32,
    /// Multicasts a root may have handed to its NIC and not yet seen leave.
    pub send_window: u32,
    /// The core's cutoff slack; `None`: derived from the fabric (4 round trips + 10 us).
    pub cutoff_alpha: Option<Duration>,
    /// The core's peer timeout.
    pub peer_timeout: Duration,
    /// How long a read from a crashed peer takes to fail.
    pub read_timeout: Duration,
    /// Bytes a switch egress port queues before it pauses the senders (a lossless fabric's
    /// PFC backpressure, modeled end to end: a root's send completes only once every port on
    /// its tree has drained below this); `u64::MAX`: unbounded buffers. It bounds the
    /// simulator's memory when several roots converge on one link (Allgather chains).
    pub switch_buffer: u64,
    /// Faults to inject.
    pub faults: Faults,
    /// Operations to run.
    pub workload: Workload,
    /// Virtual time after which the run stops (reported as truncated); at most
    /// [`MAX_TIME_LIMIT`](crate::MAX_TIME_LIMIT).
    pub time_limit: Duration,
}

impl SimConfig {
    /// A lossless fabric with 500 ns links running `workload`; link bandwidth, chunk size,
    /// lanes, chains and send window are the core's defaults (`Config::new`: 100 Gbit/s,
    /// 4 KiB, one lane, four chains, 64).
    pub fn new(topology: TopologySpec, workload: Workload) -> Self {
        // The core's own defaults, not copies of them.
        let core = ringcast_core::Config::new(0, 1);
        SimConfig {
            seed: 0,
            topology,
            bandwidth: core.link_bandwidth,
            latency: Duration::from_nanos(500),
            control_overhead: Duration::from_micros(1),
            chunk_size: core.chunk_size,
            lanes: core.lanes,
            chains: core.chains,
            send_window: core.send_window,
            cutoff_alpha: None,
            peer_timeout: Duration::from_millis(1),
            read_timeout: Duration::from_millis(1),
            switch_buffer: 1 << 20,
            faults: Faults::default(),
            workload,
            time_limit: Duration::from_secs(60),
        }
    }

    /// The core configuration of rank `rank` of `ranks`: the one place the simulator's
    /// fields map onto the core's (the immediate's split and the chunk limit are set per
    /// run by [`Sim::new`](crate::Sim::new), from the workload).
    pub fn core_config(&self, rank: u32, ranks: u32) -> ringcast_core::Config {
        let mut c = ringcast_core::Config::new(rank, ranks);
        c.chunk_size = self.chunk_size;
        c.lanes = self.lanes;
        c.link_bandwidth = self.bandwidth;
        c.cutoff_alpha = self.effective_cutoff_alpha();
        c.peer_timeout = self.peer_timeout;
        // No post timeout of its own: never shorter than the peer timeout, which the core
        // refuses.
        c.post_timeout = c.post_timeout.max(self.peer_timeout);
        c.send_window = self.send_window;
        c.chains = self.chains;
        c
    }

    /// The cutoff slack the sessions use.
    pub fn effective_cutoff_alpha(&self) -> Duration {
        // Saturating: a latency too long for the sum is refused by the core's bound anyway.
        self.cutoff_alpha.unwrap_or(
            self.latency
                .saturating_mul(8 * 4)
                .saturating_add(self.control_overhead.saturating_mul(4))
                .saturating_add(Duration::from_micros(10)),
        )
    }
}

/// Why a simulation could not be set up.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SimError {
    /// The topology is malformed.
    Topology(TopologyError),
    /// The core rejected the session configuration.
    Core(ConfigError),
    /// An operation names a rank outside the communicator.
    BadOp {
        /// Index of the operation in the workload.
        index: usize,
    },
    /// A crash names a rank outside the communicator.
    BadCrash {
        /// The rank named.
        rank: u32,
    },
    /// A parameter is out of range.
    Invalid(&'static str),
}

impl fmt::Display for SimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SimError::Topology(e) => write!(f, "topology: {e}"),
            SimError::Core(e) => write!(f, "core configuration: {e}"),
            SimError::BadOp { index } => {
                write!(f, "operation {index} names a rank outside the communicator")
            }
            SimError::BadCrash { rank } => {
                write!(f, "crash of rank {rank}, which is outside the communicator")
            }
            SimError::Invalid(what) => f.write_str(what),
        }
    }
}

impl std::error::Error for SimError {}

impl From<TopologyError> for SimError {
    fn from(e: TopologyError) -> Self {
        SimError::Topology(e)
    }
}

impl From<ConfigError> for SimError {
    fn from(e: ConfigError) -> Self {
        SimError::Core(e)
    }
}
