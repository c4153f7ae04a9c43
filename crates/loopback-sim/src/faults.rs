//! Fault injection: what the fabric does wrong, and how often.
//!
//! * Loss (Bernoulli and Gilbert-Elliott bursts) applies to every link a packet crosses; a
//!   packet lost on a link is lost for the whole subtree below it.
//! * Duplication, reordering and corruption apply on the last hop, the switch port facing the
//!   receiving host.
//! * Corruption models a real transport: its integrity check (the RoCEv2 / InfiniBand ICRC, or
//!   the UDP checksum) covers payload **and** immediate, so a corrupted packet is dropped by
//!   the receiving transport and counted, never handed to the core; the chunk is recovered
//!   like a lost one. The one exception is opt-in ([`Faults::corrupt_escaping`]): a flipped
//!   bit that escapes the check, restricted to the immediate's operation-tag bits, which the
//!   core must drop as stale. (A flipped chunk index that stays in range names another valid
//!   chunk; no receiver can tell, which is why the check must cover the immediate.)
//! * Receiver overrun models the host's posted receives; node crashes stop a rank.

use crate::rng::Prob;
use serde::Serialize;
use std::time::Duration;

/// The Gilbert-Elliott burst-loss channel: a link flips between a good state (no burst loss)
/// and a bad state (every packet lost), per packet.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct GilbertElliott {
    /// Probability, per packet in the good state, of entering the bad state.
    pub enter_bad: f64,
    /// Probability, per packet in the bad state, of going back to the good state.
    pub exit_bad: f64,
}

/// Receive-side reordering: a delivery is delayed by a uniform extra time (multipath).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Reorder {
    /// Probability that a delivery is delayed.
    pub probability: f64,
    /// Largest extra delay.
    pub max_delay: Duration,
}

/// Receiver overrun: each host has `slots` posted receives; a consumed receive is reposted
/// one per `service` interval. A chunk that finds no posted receive is an RNR drop.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct RxSlots {
    /// Receives posted at start.
    pub slots: u32,
    /// Time to repost one receive.
    pub service: Duration,
}

/// A node crash: `rank` stops processing and sending at `at` (virtual time).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Crash {
    /// The rank that stops.
    pub rank: u32,
    /// When.
    pub at: Duration,
}

/// A directed link that drops every multicast packet entering it during a window (a link or
/// port going down and coming back). Links are named by their end nodes as the topology names
/// them: `h3` for host 3, switches as in [`crate::TopologySpec`]'s docs (`leaf1`, `spine0`,
/// `p0e1`, `p1a3`, `core17`). Reads and control messages are on reliable connections and are
/// not affected.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LinkDown {
    /// Node the link leaves.
    pub from: String,
    /// Node the link enters.
    pub to: String,
    /// Down from this time...
    pub at: Duration,
    /// ...until this one.
    pub until: Duration,
}

/// Every fault the simulator can inject. The default injects nothing.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Faults {
    /// Bernoulli loss probability per packet per link.
    pub loss: f64,
    /// Burst loss per link.
    pub burst: Option<GilbertElliott>,
    /// Probability that the last hop delivers a packet twice.
    pub duplicate: f64,
    /// Reordering on the last hop.
    pub reorder: Option<Reorder>,
    /// Probability that a payload bit flips (the receiver's transport checksum drops it).
    pub corrupt_payload: f64,
    /// Probability that an immediate bit flips (the checksum covers the immediate too: the
    /// receiver's transport drops it).
    pub corrupt_imm: f64,
    /// Opt-in: probability that an operation-tag bit of the immediate flips **and escapes
    /// the checksum**, so the packet reaches the core, which must drop it as stale.
    pub corrupt_escaping: f64,
    /// Probability that the receiver's driver fails to write a chunk the core placed (a
    /// copy that faults): it releases the chunk instead of committing it, and the core
    /// recovers it like a lost one.
    pub copy_fail: f64,
    /// Receiver overrun; `None`: receives never run out.
    pub rx_slots: Option<RxSlots>,
    /// Node crashes.
    pub crashes: Vec<Crash>,
    /// Links down for a window.
    pub links_down: Vec<LinkDown>,
}

/// Per-link loss probabilities as integer thresholds.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct LinkFaults {
    pub(crate) loss: Prob,
    pub(crate) enter_bad: Prob,
    pub(crate) exit_bad: Prob,
    pub(crate) bursty: bool,
}

/// Last-hop faults as integer thresholds.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct EdgeFaults {
    pub(crate) duplicate: Prob,
    pub(crate) reorder: Prob,
    pub(crate) reorder_max_ps: u64,
    pub(crate) corrupt_payload: Prob,
    pub(crate) corrupt_imm: Prob,
    pub(crate) corrupt_escaping: Prob,
    pub(crate) copy_fail: Prob,
    pub(crate) any: bool,
}

impl Faults {
    pub(crate) fn link(&self) -> LinkFaults {
        let (enter, exit) = self.burst.map_or((0.0, 1.0), |b| (b.enter_bad, b.exit_bad));
        let enter_bad = Prob::new(enter);
        LinkFaults {
            loss: Prob::new(self.loss),
            enter_bad,
            exit_bad: Prob::new(exit),
            bursty: !enter_bad.is_zero(),
        }
    }

    pub(crate) fn edge(&self) -> EdgeFaults {
        let (reorder, max) = self
            .reorder
            .map_or((0.0, Duration::ZERO), |r| (r.probability, r.max_delay));
        let e = EdgeFaults {
            duplicate: Prob::new(self.duplicate),
            reorder: Prob::new(reorder),
            reorder_max_ps: u64::try_from(max.as_nanos())
                .unwrap_or(u64::MAX / 1_000_000)
                .saturating_mul(1_000)
                .max(1),
            corrupt_payload: Prob::new(self.corrupt_payload),
            corrupt_imm: Prob::new(self.corrupt_imm),
            corrupt_escaping: Prob::new(self.corrupt_escaping),
            copy_fail: Prob::new(self.copy_fail),
            any: false,
        };
        EdgeFaults {
            any: !(e.duplicate.is_zero()
                && e.reorder.is_zero()
                && e.corrupt_payload.is_zero()
                && e.corrupt_imm.is_zero()
                && e.corrupt_escaping.is_zero()
                && e.copy_fail.is_zero()),
            ..e
        }
    }
}
