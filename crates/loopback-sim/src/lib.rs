//! # ringcast-loopback-sim
//!
//! A seeded, deterministic discrete-event simulator of a multicast fabric that drives **real**
//! [`ringcast_core`] sessions, one per rank, in virtual time.
//!
//! * Topologies ([`TopologySpec`]): a single-switch star, a two-level leaf/spine (the 188-host
//!   testbed, [`TopologySpec::testbed`]) or a three-level k-ary fat tree, possibly partly
//!   filled (radix 32 with 1024 hosts), built as a generic graph of hosts and switches with
//!   leveled links and up/down routing. Reports give bytes per link and per level.
//! * Links have bandwidth, latency and byte counters; switches replicate multicast along a
//!   tree. A multicast packet's walk down its tree is computed analytically when it is
//!   injected, so only deliveries to hosts are events.
//! * Control messages travel reliably with the path's latency; reads move the peer's data
//!   at the time the request reaches it, and fail after a timeout if the peer crashed.
//! * Faults ([`Faults`]): Bernoulli and Gilbert-Elliott loss, reordering, duplication,
//!   corruption of payload or immediate (both dropped by the receiving transport's checksum,
//!   as the ICRC / UDP checksum covers the immediate; opt-in: an op-tag flip that escapes it),
//!   receiver overrun (RNR drops) and node crashes.
//! * Correctness is checked for real: every chunk slot of every rank's buffer holds a token
//!   (the root's slot `i` a seeded fingerprint); packets carry tokens, placements and reads
//!   copy them. A rank that completes must hold exactly the root's tokens ([`Report::verified`]).
//!
//! The same [`SimConfig`] (seed included) always gives the same [`Report`].
//!
//! ```
//! use ringcast_loopback_sim::{Faults, Sim, SimConfig, TopologySpec, Workload};
//! use std::time::Duration;
//! let workload = Workload::new().broadcast(Duration::ZERO, 0, 1 << 20);
//! let mut cfg = SimConfig::new(TopologySpec::Star { hosts: 8 }, workload);
//! cfg.seed = 7;
//! cfg.faults = Faults { loss: 1e-3, ..Faults::default() };
//! let report = Sim::new(cfg)?.run();
//! assert!(report.all_completed());
//! println!("{report}");
//! # Ok::<(), ringcast_loopback_sim::SimError>(())
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod baselines;
mod collect;
mod config;
mod display;
mod event;
mod fabric;
mod faults;
mod held;
mod host;
mod link;
mod queue;
mod report;
mod rng;
mod sim;
mod slots;
pub mod soak;
mod store;
mod topology;
mod workload;

pub use config::{SimConfig, SimError};
pub use faults::{Crash, Faults, GilbertElliott, LinkDown, Reorder, RxSlots};
pub use report::{
    CoreDrops, FabricCounters, Failure, LevelReport, LinkReport, OpReport, Outcome, RankReport,
    Report,
};
pub use sim::{MAX_TIME_LIMIT, Progress, Sim};
pub use topology::{TopologyError, TopologySpec};
pub use workload::{OpKind, OpSpec, Workload};
