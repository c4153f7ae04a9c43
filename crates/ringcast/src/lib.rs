//! # ringcast
//!
//! Reliable, bandwidth-optimal Broadcast and Allgather over multicast.
//!
//! This crate is the user-facing entry point:
//!
//! * [`Communicator`] (feature `rocev2-udp`, on by default): Broadcast, Allgather and
//!   Allgatherv over RoCEv2 packets on UDP multicast, blocking and non-blocking; see
//!   [`comm`] for ordering, buffers, threads and failures;
//! * [`core`]: the sans-IO protocol core ([`ringcast_core`]), which any transport drives;
//! * [`bootstrap`]: rank, world size and rendezvous from mpirun / srun / torchrun variables,
//!   and the TCP rendezvous that hands every rank the peer table and the job nonce;
//! * [`sim`] (feature `sim`, on by default): the deterministic fabric simulator
//!   ([`ringcast_loopback_sim`]), which drives real core sessions over a simulated fabric
//!   with faults and checks every rank's buffer.
//!
//! The `ringcast` binary (feature `cli`) runs collectives between local or launched ranks
//! (`demo`, `bench`), checks a launch (`bootstrap`), and runs the simulator:
//!
//! ```text
//! ringcast sim bcast --ranks 64 --size 16MiB --chunk 4KiB --topology leaf-spine --loss 1e-4 --seed 7
//! ringcast sim allgather --ranks 1024 --size 1MiB --topology fat-tree --radix 32 --loss 1e-4
//! ringcast sim allgather --ranks 4 --sizes 4KiB,0,10000,1 --topology star
//! ```
//!
//! ```
//! # #[cfg(feature = "sim")] {
//! use ringcast::sim::{Sim, SimConfig, TopologySpec, Workload};
//! use std::time::Duration;
//! let w = Workload::new().broadcast(Duration::ZERO, 0, 256 << 10);
//! let report = Sim::new(SimConfig::new(TopologySpec::Star { hosts: 4 }, w)).unwrap().run();
//! assert!(report.all_completed());
//! # }
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod bootstrap;
#[cfg(feature = "rocev2-udp")]
pub mod comm;

#[cfg(feature = "rocev2-udp")]
pub use comm::{BuildError, CommError, Communicator, Request, SplitError, alloc_buffer};

/// Entry points for the fuzz targets under `fuzz/`: the parsers of what peers send before a
/// communicator exists, on bytes. Not part of the API: they panic on a finding.
#[doc(hidden)]
pub mod fuzzing {
    /// The rendezvous messages: `b` as a hello and as a reply for a job of `world` ranks;
    /// whether it read as each.
    pub fn bootstrap_wire(b: &[u8], world: u32) -> (bool, bool) {
        crate::bootstrap::fuzz_wire(b, world)
    }

    /// The start-up check's report on the control mesh, decoded and judged; whether it
    /// decoded.
    #[cfg(feature = "rocev2-udp")]
    pub fn startup_report(b: &[u8]) -> bool {
        crate::comm::fuzz_report(b)
    }
}

/// The sans-IO protocol core: sessions, configuration, events (re-export of `ringcast-core`).
pub use ringcast_core as core;

/// The deterministic fabric simulator (re-export of `ringcast-loopback-sim`).
#[cfg(feature = "sim")]
pub use ringcast_loopback_sim as sim;
