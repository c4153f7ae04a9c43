//! Single-rate pacing across the job: receivers report, each root's controller sets its rate.
//!
//! While an operation is in flight (every 5 ms, and within a millisecond of a socket drop)
//! and at its end, each rank sends a [`ReceiverReport`] (its cumulative chunks received by
//! multicast, chunks fetched from a neighbour, kernel socket drops) to the operation's roots
//! over the control path: the Broadcast's root, every rank with a
//! non-empty block of an Allgatherv. A root feeds them to its [`RateController`] (AIMD, the
//! slowest receiver sets the rate) and hands the new rate to its send workers, split evenly
//! over the lanes. Counters are cumulative, so a late or duplicated report is harmless.
//!
//! The controller's rate is what a receiver takes from all the roots that send to it at once,
//! not what one root may send: the roots of an Allgather share each receiver, so each sends
//! at the rate over its operation's fan-in ([`Rates::set_share`]: the most roots any one
//! receiver hears at once, 3 for a 4-rank Allgather, 1 for a Broadcast). A root held to the
//! whole rate in an Allgather put several times what a receiver takes on it, and the
//! controller's cuts (30 % every `hold`) took tens of milliseconds to bring it down: a
//! 64 MiB-per-rank Allgather on a 16-core host fetched tens of MB per rank over TCP.
//!
//! What counts as loss: the receivers' kernel socket drops. Fetched chunks travel in the
//! report (for the logs) but do not cut the rate: the core also fetches every chunk that had
//! not arrived when its cutoff fired, and the cutoff is timed from `link_bandwidth`, so a
//! paced or CPU-starved multicast is fetched without any loss; counting those fetches would
//! cut the rate, which fires the cutoff earlier still, down to the floor.
//!
//! The report travels as a control message of its own kind ([`REPORT_KIND`], outside the
//! core's range, and not the start-up check's): the engine takes it before the session sees
//! the message.

use ringcast_core::Instant;
use ringcast_transport_rocev2_udp::pace::{RateConfig, RateController, ReceiverReport};

/// First byte of a rate report (the core's control kinds are small integers).
///
/// Not the start-up check's report kind (`0xF0`): a rank that finished its check and began an
/// operation reports to its roots at once, while a slower rank may still be reading start-up
/// reports, and one kind for both made it fail its check on a rate report ("a start-up
/// report this rank cannot read").
pub(super) const REPORT_KIND: u8 = 0xF1;
const _: () = assert!(REPORT_KIND != crate::comm::probe::REPORT_KIND);
const REPORT_VERSION: u8 = 1;
const REPORT_LEN: usize = 2 + 4 + 3 * 8;

/// A report as a control message.
pub(super) fn encode(r: &ReceiverReport) -> [u8; REPORT_LEN] {
    let mut b = [0u8; REPORT_LEN];
    b[0] = REPORT_KIND;
    b[1] = REPORT_VERSION;
    b[2..6].copy_from_slice(&r.rank.to_be_bytes());
    for (i, v) in [r.received_chunks, r.fetched_chunks, r.socket_drops]
        .into_iter()
        .enumerate()
    {
        b[6 + 8 * i..14 + 8 * i].copy_from_slice(&v.to_be_bytes());
    }
    b
}

/// Whether a control message is a rate report (well formed or not): the session never sees
/// one.
pub(super) fn is_report(bytes: &[u8]) -> bool {
    bytes.first() == Some(&REPORT_KIND)
}

/// A report, if `bytes` is a well-formed one.
pub(super) fn decode(bytes: &[u8]) -> Option<ReceiverReport> {
    if bytes.len() != REPORT_LEN || bytes[0] != REPORT_KIND || bytes[1] != REPORT_VERSION {
        return None;
    }
    let u64_at = |at: usize| u64::from_be_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
    Some(ReceiverReport {
        rank: u32::from_be_bytes(bytes[2..6].try_into().expect("4 bytes")),
        received_chunks: u64_at(6),
        fetched_chunks: u64_at(14),
        socket_drops: u64_at(22),
    })
}

/// The rate limits for a rank whose link carries `link` bytes per second: start at a
/// sixteenth of the link rate and double per clean round until the first loss (slow start),
/// cut by 30% on loss (from the rate the root reached, when it fell short of the pacer's),
/// climb back by 2% of the link per clean round.
///
/// Slow start, not the link rate, at start: every root of an Allgather sends at once, so a
/// first operation at the link rate put several times what the receivers could take on
/// them (bench-net, 16 MiB per rank on 2 cores: 8-28 MB per rank fetched in the first
/// operation, where a paced one fetches well under 1 MB). Doubling every report round
/// (reports come every few ms) reaches the link within four rounds.
///
/// The ceiling is [`CEILING_TIMES_LINK`] times the link rate, not the link rate: the pacer is
/// there to slow a root for its receivers, while the link (or the kernel path, on a veth)
/// limits it by itself. A configured link rate below what the path really carries (the
/// default 10 Gb/s on the namespace lab's veths, which carry more) would otherwise cap every
/// root below it. Sending faster than the configured rate only ends the fast path before the
/// core's cutoff, which is timed from that rate.
pub(super) fn config(link: u64) -> RateConfig {
    let link = link.max(1);
    RateConfig {
        initial: (link / 16).max(1),
        floor: (link / 100).clamp(1, 10_000_000),
        ceiling: link.saturating_mul(CEILING_TIMES_LINK),
        increase: (link / 50).max(1),
        slow_start: true,
        ..RateConfig::default()
    }
}

/// The pacer's ceiling over the link rate. Twice it held the namespace lab's Broadcast to
/// 2.5 GB/s (its veths report 10 Gbit/s; the kernel path carries 2.6-4 GB/s there), 10-25 %
/// slower than with pacing off and nothing fetched either way (BENCHMARKS.md, twenty-fifth
/// round). On a real NIC the line rate holds a root first, whatever the ceiling; an
/// Allgather's roots share it by their fan-in ([`Rates::set_share`]).
const CEILING_TIMES_LINK: u64 = 4;

/// Where `me` is among an operation's `roots` (the ranks with data to multicast, of
/// `ranks`), the most of them any one receiver hears at once: every root but itself when all
/// ranks are roots (an Allgather), all of them when some rank only receives (a Broadcast, an
/// Allgatherv with empty blocks). 0 where `me` is no root.
pub(super) fn fan_in(roots: &[u32], me: u32, ranks: u32) -> u64 {
    if !roots.contains(&me) {
        return 0;
    }
    let k = roots.len() as u64;
    if k >= u64::from(ranks) { k - 1 } else { k }
}

/// One rank's controller, and what it tells the send workers.
#[derive(Debug)]
pub(super) struct Rates {
    ctl: RateController,
    lanes: u64,
    /// The fan-in the rate is shared by (at least 1).
    share: u64,
    /// Pacing off (`RINGCAST_PACING=off`): the workers' rate never changes from unlimited.
    off: bool,
    /// Reports taken, malformed ones counted apart.
    pub(super) reports: u64,
    pub(super) malformed: u64,
}

impl Rates {
    /// For rank `me` of `ranks`, with `lanes` send workers.
    pub(super) fn new(cfg: RateConfig, me: u32, ranks: u32, lanes: u16, off: bool) -> Self {
        Rates {
            ctl: RateController::new(cfg, (0..ranks).filter(|&r| r != me)),
            lanes: u64::from(lanes.max(1)),
            share: 1,
            off,
            reports: 0,
            malformed: 0,
        }
    }

    /// What a receiver takes from all its roots at once, bytes per second (`u64::MAX` when
    /// pacing is off).
    pub(super) fn rate(&self) -> u64 {
        if self.off { u64::MAX } else { self.ctl.rate() }
    }

    /// Each send worker's part: the rate over the fan-in, split over the lanes.
    pub(super) fn per_lane(&self) -> u64 {
        if self.off {
            u64::MAX
        } else {
            (self.ctl.rate() / self.share / self.lanes).max(1)
        }
    }

    /// Shares the rate among `fan_in` roots (0 counts as 1): the most roots any receiver of
    /// this rank's multicast hears at once. The new per-lane rate when it changed.
    pub(super) fn set_share(&mut self, fan_in: u64) -> Option<u64> {
        let fan_in = fan_in.max(1);
        if fan_in == self.share {
            return None;
        }
        let before = self.per_lane();
        self.share = fan_in;
        let after = self.per_lane();
        (after != before).then_some(after)
    }

    /// A report message from `from`; the new per-lane rate when it changed. `sending`: the
    /// rate this rank's send workers reached lately, bytes per second (0: unknown), which
    /// stands for the fan-in's times that at the receivers.
    pub(super) fn on_message(
        &mut self,
        now: Instant,
        from: u32,
        bytes: &[u8],
        sending: u64,
    ) -> Option<u64> {
        match decode(bytes).filter(|r| r.rank == from) {
            Some(r) => {
                self.reports += 1;
                let r = ReceiverReport {
                    fetched_chunks: 0,
                    ..r
                };
                let sending = sending.saturating_mul(self.share);
                let changed =
                    self.ctl
                        .on_report_sending(now, r, (sending > 0).then_some(sending))?;
                if let Some(slow) = self.ctl.slowest() {
                    tracing::debug!(rate = changed, slowest = slow, "pacing rate changed");
                }
                (!self.off).then(|| self.per_lane())
            }
            None => {
                self.malformed += 1;
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(rank: u32, received: u64, fetched: u64, drops: u64) -> ReceiverReport {
        ReceiverReport {
            rank,
            received_chunks: received,
            fetched_chunks: fetched,
            socket_drops: drops,
        }
    }

    #[test]
    fn report_round_trips_and_is_outside_the_core_kinds() {
        let r = report(7, 1 << 40, 3, u64::MAX);
        let b = encode(&r);
        assert!(is_report(&b));
        assert_eq!(decode(&b), Some(r));
        assert_eq!(decode(&b[..b.len() - 1]), None);
        // A core control message (kind 1..=8) is never taken for a report.
        for kind in 0..=8u8 {
            assert!(!is_report(&[kind, 1, 0, 0]));
        }
    }

    #[test]
    fn the_slowest_receiver_sets_the_rate_split_over_lanes() {
        let cfg = RateConfig {
            initial: 1_000,
            floor: 100,
            ceiling: 1_000,
            increase: 100,
            decrease_permille: 500,
            tolerance_ppm: 0,
            hold: core::time::Duration::from_millis(10),
            slow_start: false,
        };
        let mut r = Rates::new(cfg, 0, 3, 2, false);
        assert_eq!((r.rate(), r.per_lane()), (1_000, 500));
        let t = Instant::ZERO;
        // Rank 1 is clean, rank 2's socket dropped datagrams: the rate halves, each lane gets
        // half of it.
        assert_eq!(r.on_message(t, 1, &encode(&report(1, 100, 0, 0)), 0), None);
        assert_eq!(
            r.on_message(t, 2, &encode(&report(2, 90, 10, 10)), 0),
            Some(250)
        );
        assert_eq!(r.rate(), 500);
        // Both clean afterwards: the rate climbs back.
        let later = Instant::from_nanos(50_000_000);
        assert_eq!(
            r.on_message(later, 1, &encode(&report(1, 200, 0, 0)), 0),
            None
        );
        assert_eq!(
            r.on_message(later, 2, &encode(&report(2, 190, 10, 10)), 0),
            Some(300)
        );
        // Fetched chunks alone (a cutoff that fired before the paced multicast ended) are no
        // loss: the next clean round climbs on.
        let t3 = Instant::from_nanos(100_000_000);
        assert_eq!(
            r.on_message(t3, 1, &encode(&report(1, 250, 50, 0)), 0),
            None
        );
        assert_eq!(
            r.on_message(t3, 2, &encode(&report(2, 200, 90, 10)), 0),
            Some(350)
        );
        // A report claiming another rank, or garbage, counts as malformed.
        assert_eq!(
            r.on_message(later, 1, &encode(&report(2, 0, 99, 0)), 0),
            None
        );
        assert_eq!(r.on_message(later, 1, &[REPORT_KIND, 9], 0), None);
        assert_eq!((r.reports, r.malformed), (6, 2));
    }

    #[test]
    fn fan_in_counts_the_roots_a_receiver_hears() {
        // A Broadcast: its root's receivers hear it alone; the others multicast nothing.
        assert_eq!((fan_in(&[2], 2, 4), fan_in(&[2], 0, 4)), (1, 0));
        // An Allgather of 4: each rank hears the 3 others.
        assert_eq!(fan_in(&[0, 1, 2, 3], 1, 4), 3);
        // An Allgatherv with an empty block: its rank hears all 3 roots.
        assert_eq!(fan_in(&[0, 1, 3], 3, 4), 3);
        assert_eq!(fan_in(&[0, 1, 3], 2, 4), 0);
        // Alone: nobody to hear it (the share counts it as 1).
        assert_eq!(fan_in(&[0], 0, 1), 0);
    }

    #[test]
    fn the_rate_is_shared_by_the_fan_in() {
        let cfg = RateConfig {
            initial: 3_000,
            floor: 30,
            ceiling: 3_000,
            increase: 300,
            decrease_permille: 500,
            tolerance_ppm: 0,
            hold: core::time::Duration::from_millis(10),
            slow_start: false,
        };
        let mut r = Rates::new(cfg, 0, 4, 1, false);
        assert_eq!(r.per_lane(), 3_000);
        // An Allgather of 4 ranks: every receiver hears 3 roots at once.
        assert_eq!(r.set_share(3), Some(1_000));
        assert_eq!(r.set_share(3), None, "unchanged");
        assert_eq!((r.rate(), r.per_lane()), (3_000, 1_000));
        // A drop report cuts from what the receivers got from all three roots: 3 x 800 (what
        // this root reached) halved, shared by 3 again.
        assert_eq!(
            r.on_message(Instant::ZERO, 1, &encode(&report(1, 90, 0, 10)), 800),
            Some(400)
        );
        assert_eq!(r.rate(), 1_200);
        // Back to a Broadcast (0 counts as 1): the whole rate.
        assert_eq!(r.set_share(0), Some(1_200));
        assert_eq!(r.per_lane(), 1_200);
        // Pacing off stays unlimited whatever the fan-in.
        let mut off = Rates::new(cfg, 0, 4, 2, true);
        assert_eq!(off.set_share(3), None);
        assert_eq!(off.per_lane(), u64::MAX);
    }

    #[test]
    fn pacing_off_never_limits() {
        let mut r = Rates::new(config(1_000), 0, 2, 1, true);
        assert_eq!(r.per_lane(), u64::MAX);
        assert_eq!(
            r.on_message(Instant::ZERO, 1, &encode(&report(1, 1, 1, 0)), 0),
            None
        );
        assert_eq!(r.rate(), u64::MAX);
    }
}
