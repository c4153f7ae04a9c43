//! Pacing: a token bucket that releases one send batch at a time, and a single-rate AIMD
//! controller that the slowest receiver drives.
//!
//! This kernel has no fq qdisc (no `SO_MAX_PACING_RATE`, no EDT), so pacing happens in user
//! space. Both types are pure logic on [`ringcast_core::Instant`]: they never read a clock, and
//! tests drive them in virtual time.
//!
//! A send worker's loop:
//! ```
//! use ringcast_core::Instant;
//! use ringcast_transport_rocev2_udp::pace::Pacer;
//! let mut pacer = Pacer::new(Instant::ZERO, 1_000_000_000, 256 << 10);
//! let mut now = Instant::ZERO;
//! for _ in 0..10 {
//!     if let Some(at) = pacer.poll_release(now) {
//!         now = at; // sleep until `at` (a real worker reads its clock again)
//!     }
//!     let bytes = 64 << 10; // LaneSender::send_batch(..)?.bytes
//!     pacer.on_sent(now, bytes);
//! }
//! ```
//! Receivers report what they lost ([`ReceiverReport`]); the controller turns the reports into
//! a rate ([`RateController::on_report`]) that the worker hands to [`Pacer::set_rate`].

use core::time::Duration;

use ringcast_core::Instant;

const NANOS_PER_SEC: i128 = 1_000_000_000;

/// A token bucket in bytes per second that lets whole batches go: a batch may leave whenever
/// the bucket is not in debt, and its bytes are charged after it left (so a batch larger than
/// the bucket still goes, and the average rate stays exact).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pacer {
    rate: u64,
    depth: u64,
    /// Credit in byte-nanoseconds per second (bytes × 10^9), negative while in debt.
    credit: i128,
    last: Instant,
}

impl Pacer {
    /// A full bucket of `depth` bytes refilled at `rate` bytes per second (at least 1).
    pub fn new(now: Instant, rate: u64, depth: u64) -> Self {
        Pacer {
            rate: rate.max(1),
            depth,
            credit: i128::from(depth) * NANOS_PER_SEC,
            last: now,
        }
    }

    /// Current rate in bytes per second.
    pub fn rate(&self) -> u64 {
        self.rate
    }

    /// Changes the rate from `now` on (what accrued before is kept).
    pub fn set_rate(&mut self, now: Instant, rate: u64) {
        self.refill(now);
        self.rate = rate.max(1);
    }

    /// `None` if a batch may leave at `now`, else the instant it may.
    #[must_use]
    pub fn poll_release(&mut self, now: Instant) -> Option<Instant> {
        self.refill(now);
        if self.credit >= 0 {
            return None;
        }
        let debt = self.credit.unsigned_abs();
        let wait_ns = u64::try_from(debt.div_ceil(u128::from(self.rate))).unwrap_or(u64::MAX);
        Some(Instant::from_nanos(now.as_nanos().saturating_add(wait_ns)))
    }

    /// Charges a batch of `bytes` sent at `now`.
    pub fn on_sent(&mut self, now: Instant, bytes: usize) {
        self.refill(now);
        self.credit -= bytes as i128 * NANOS_PER_SEC;
    }

    fn refill(&mut self, now: Instant) {
        // Time never goes back; an earlier `now` accrues nothing.
        let dt = now.saturating_duration_since(self.last);
        if now.as_nanos() > self.last.as_nanos() {
            self.last = now;
        }
        let cap = i128::from(self.depth) * NANOS_PER_SEC;
        let gained = dt.as_nanos() as i128 * i128::from(self.rate);
        self.credit = (self.credit + gained).min(cap);
    }
}

/// Limits and steps of the rate controller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RateConfig {
    /// Rate at start, bytes per second.
    pub initial: u64,
    /// Never below this.
    pub floor: u64,
    /// Never above this (the link, or a configured cap).
    pub ceiling: u64,
    /// Added after a round in which every receiver reported no loss.
    pub increase: u64,
    /// Kept on a decrease, in per mille (500 halves the rate).
    pub decrease_permille: u32,
    /// Loss a receiver may report without a decrease, in parts per million of its chunks
    /// (background loss that no rate cures).
    pub tolerance_ppm: u32,
    /// After a decrease, further losses within this time belong to the same episode (they were
    /// in flight before the cut) and do not cut again.
    pub hold: Duration,
    /// Slow start, as TCP's: until the first lossy report, a clean round doubles the rate
    /// instead of adding `increase`. A sender can then start well below what the receivers
    /// take (a fresh one does not know) and still find their pace within a few rounds.
    pub slow_start: bool,
}

impl Default for RateConfig {
    fn default() -> Self {
        RateConfig {
            initial: 500_000_000,
            floor: 10_000_000,
            ceiling: 5_000_000_000,
            increase: 25_000_000,
            decrease_permille: 700,
            tolerance_ppm: 1_000,
            hold: Duration::from_millis(20),
            slow_start: false,
        }
    }
}

/// What a receiver reports; counters are cumulative, so a lost or reordered report is harmless.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReceiverReport {
    /// The receiver's rank.
    pub rank: u32,
    /// Chunks it received by multicast.
    pub received_chunks: u64,
    /// Chunks it had to fetch from a peer (lost on the way).
    pub fetched_chunks: u64,
    /// Datagrams its sockets dropped (`RxSocket::socket_drops`).
    pub socket_drops: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Receiver {
    last: ReceiverReport,
    /// Reported without loss since the last rate change.
    clean: bool,
}

/// Single-rate AIMD, as in Cepheus: one rate for all receivers, set by the slowest. A receiver
/// reporting loss above the tolerance cuts the rate (at most once per `hold`); the rate grows
/// only after every receiver reported a clean interval since the last change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RateController {
    cfg: RateConfig,
    rate: u64,
    receivers: Vec<Receiver>,
    last_decrease: Option<Instant>,
    slowest: Option<u32>,
    /// In slow start: no lossy report yet.
    starting: bool,
}

impl RateController {
    /// A controller for the receivers `ranks`, at `cfg.initial` clamped to floor and ceiling.
    pub fn new(cfg: RateConfig, ranks: impl IntoIterator<Item = u32>) -> Self {
        let mut receivers: Vec<Receiver> = ranks
            .into_iter()
            .map(|rank| Receiver {
                last: ReceiverReport {
                    rank,
                    ..ReceiverReport::default()
                },
                clean: false,
            })
            .collect();
        receivers.sort_unstable_by_key(|r| r.last.rank);
        receivers.dedup_by_key(|r| r.last.rank);
        RateController {
            rate: cfg.initial.clamp(cfg.floor, cfg.ceiling.max(cfg.floor)),
            cfg,
            receivers,
            last_decrease: None,
            slowest: None,
            starting: cfg.slow_start,
        }
    }

    /// Current rate, bytes per second.
    pub fn rate(&self) -> u64 {
        self.rate
    }

    /// The receiver whose loss caused the latest decrease.
    pub fn slowest(&self) -> Option<u32> {
        self.slowest
    }

    /// Takes a report; returns the new rate if it changed. Reports from unknown ranks are
    /// ignored.
    pub fn on_report(&mut self, now: Instant, report: ReceiverReport) -> Option<u64> {
        self.on_report_sending(now, report, None)
    }

    /// [`on_report`](Self::on_report), told the rate the sender actually reached lately
    /// (bytes per second while it had something to send). A decrease then cuts from the lower
    /// of that and the current rate: a sender held back by its CPU or its link below the
    /// pacer's rate would otherwise cut a rate it never reached, and the cut would not slow it.
    pub fn on_report_sending(
        &mut self,
        now: Instant,
        report: ReceiverReport,
        sending: Option<u64>,
    ) -> Option<u64> {
        let Ok(i) = self
            .receivers
            .binary_search_by_key(&report.rank, |r| r.last.rank)
        else {
            tracing::debug!(rank = report.rank, "rate report from an unknown receiver");
            return None;
        };
        let r = &mut self.receivers[i];
        // Counters come from the wire: their deltas may sum past u64 (saturate, never wrap).
        let lost = report
            .fetched_chunks
            .saturating_sub(r.last.fetched_chunks)
            .saturating_add(report.socket_drops.saturating_sub(r.last.socket_drops));
        let got = report
            .received_chunks
            .saturating_sub(r.last.received_chunks);
        r.last = ReceiverReport {
            rank: report.rank,
            received_chunks: r.last.received_chunks.max(report.received_chunks),
            fetched_chunks: r.last.fetched_chunks.max(report.fetched_chunks),
            socket_drops: r.last.socket_drops.max(report.socket_drops),
        };
        let total = u128::from(lost) + u128::from(got);
        let lossy = u128::from(lost) * 1_000_000 > u128::from(self.cfg.tolerance_ppm) * total;
        if lossy {
            let held = self
                .last_decrease
                .is_some_and(|t| now.saturating_duration_since(t) < self.cfg.hold);
            if held {
                return None;
            }
            self.last_decrease = Some(now);
            self.slowest = Some(report.rank);
            self.starting = false;
            let from = sending.map_or(self.rate, |s| s.min(self.rate));
            let cut = u128::from(from) * u128::from(self.cfg.decrease_permille) / 1000;
            return self.set(u64::try_from(cut).unwrap_or(u64::MAX));
        }
        r.clean = true;
        if self.receivers.iter().all(|r| r.clean) {
            let up = if self.starting {
                self.rate.saturating_mul(2)
            } else {
                self.rate.saturating_add(self.cfg.increase)
            };
            return self.set(up);
        }
        None
    }

    /// Applies `rate` within limits; every change starts a new round of clean reports.
    fn set(&mut self, rate: u64) -> Option<u64> {
        let rate = rate.clamp(self.cfg.floor, self.cfg.ceiling.max(self.cfg.floor));
        for r in &mut self.receivers {
            r.clean = false;
        }
        (rate != self.rate).then(|| {
            self.rate = rate;
            rate
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at_us(us: u64) -> Instant {
        Instant::from_nanos(us * 1_000)
    }

    #[test]
    fn bucket_paces_batches_at_the_rate() {
        // 1 GB/s, a bucket of one 64 KB batch.
        let mut p = Pacer::new(Instant::ZERO, 1_000_000_000, 64_000);
        let mut now = Instant::ZERO;
        for _ in 0..100 {
            if let Some(t) = p.poll_release(now) {
                assert!(t.as_nanos() > now.as_nanos());
                now = t;
            }
            assert_eq!(p.poll_release(now), None);
            p.on_sent(now, 64_000);
        }
        // The full bucket let two batches go at once (the second only empties it), then each
        // waited 64 µs.
        assert_eq!(now, at_us(98 * 64));
    }

    #[test]
    fn idle_time_accrues_only_up_to_the_depth() {
        let mut p = Pacer::new(Instant::ZERO, 1_000_000, 10_000);
        p.on_sent(Instant::ZERO, 10_000);
        // A second of idleness is worth one bucket (10 KB), not a million bytes.
        let t = Instant::from_nanos(1_000_000_000);
        assert_eq!(p.poll_release(t), None);
        p.on_sent(t, 10_000);
        assert_eq!(p.poll_release(t), None); // credit exactly 0: not in debt
        p.on_sent(t, 1_000);
        assert_eq!(p.poll_release(t), Some(Instant::from_nanos(1_001_000_000)));
    }

    #[test]
    fn time_going_back_accrues_nothing() {
        let mut p = Pacer::new(at_us(100), 1_000_000_000, 0);
        p.on_sent(at_us(100), 1_000);
        assert_eq!(p.poll_release(at_us(50)), Some(Instant::from_nanos(51_000)));
        assert_eq!(p.poll_release(at_us(101)), None);
    }

    #[test]
    fn set_rate_keeps_accrued_credit() {
        let mut p = Pacer::new(Instant::ZERO, 1_000_000_000, 0);
        p.on_sent(Instant::ZERO, 2_000); // debt 2 µs at 1 GB/s
        p.set_rate(at_us(1), 100_000_000); // 1 µs repaid 1000 bytes, 1000 left at 100 MB/s
        assert_eq!(p.poll_release(at_us(1)), Some(at_us(11)));
    }

    fn cfg() -> RateConfig {
        RateConfig {
            initial: 1_000,
            floor: 100,
            ceiling: 2_000,
            increase: 100,
            decrease_permille: 500,
            tolerance_ppm: 0,
            hold: Duration::from_millis(10),
            slow_start: false,
        }
    }

    #[test]
    fn slow_start_doubles_until_the_first_loss() {
        let mut c = RateController::new(
            RateConfig {
                initial: 100,
                slow_start: true,
                ..cfg()
            },
            [1, 2],
        );
        // A clean round (both receivers report) at `t` ms.
        let round = |c: &mut RateController, t: u64, n: u64| {
            c.on_report(at_us(t * 1_000), report(1, n, 0, 0));
            c.on_report(at_us(t * 1_000), report(2, n, 0, 0))
        };
        assert_eq!(round(&mut c, 5, 10), Some(200));
        assert_eq!(round(&mut c, 10, 20), Some(400));
        assert_eq!(round(&mut c, 15, 30), Some(800));
        // A loss cuts and ends slow start: clean rounds then add `increase`.
        assert_eq!(c.on_report(at_us(30_000), report(2, 40, 0, 1)), Some(400));
        assert_eq!(round(&mut c, 50, 50), Some(500));
        assert_eq!(round(&mut c, 55, 60), Some(600));
        // Slow start never passes the ceiling.
        let mut d = RateController::new(
            RateConfig {
                initial: 1_500,
                slow_start: true,
                ..cfg()
            },
            [1],
        );
        assert_eq!(d.on_report(at_us(0), report(1, 10, 0, 0)), Some(2_000));
    }

    fn report(rank: u32, received: u64, fetched: u64, drops: u64) -> ReceiverReport {
        ReceiverReport {
            rank,
            received_chunks: received,
            fetched_chunks: fetched,
            socket_drops: drops,
        }
    }

    #[test]
    fn increase_waits_for_every_receiver() {
        let mut c = RateController::new(cfg(), [1, 2, 3]);
        let t = at_us(0);
        assert_eq!(c.on_report(t, report(1, 10, 0, 0)), None);
        assert_eq!(c.on_report(t, report(2, 10, 0, 0)), None);
        assert_eq!(c.on_report(t, report(1, 20, 0, 0)), None);
        assert_eq!(c.on_report(t, report(3, 10, 0, 0)), Some(1_100));
        // A new round starts.
        assert_eq!(c.on_report(t, report(1, 30, 0, 0)), None);
    }

    #[test]
    fn the_slowest_receiver_cuts_once_per_hold() {
        let mut c = RateController::new(cfg(), [1, 2]);
        assert_eq!(c.on_report(at_us(0), report(2, 10, 1, 0)), Some(500));
        assert_eq!(c.slowest(), Some(2));
        // Same episode: socket drops reported 5 ms later do not cut again.
        assert_eq!(c.on_report(at_us(5_000), report(1, 10, 0, 3)), None);
        // After the hold they do.
        assert_eq!(c.on_report(at_us(15_000), report(1, 20, 0, 4)), Some(250));
        assert_eq!(c.slowest(), Some(1));
        for i in 0..10 {
            c.on_report(at_us(30_000 + i * 20_000), report(1, 30 + i, 0, 5 + i));
        }
        assert_eq!(c.rate(), 100, "floor");
    }

    #[test]
    fn a_cut_starts_from_the_rate_the_sender_reached() {
        let mut c = RateController::new(cfg(), [1]);
        // The pacer allows 1000 B/s but the sender reached 600: the cut is from 600.
        assert_eq!(
            c.on_report_sending(at_us(0), report(1, 10, 0, 1), Some(600)),
            Some(300)
        );
        // Reached more than the rate (a burst from the bucket): the rate is the base.
        assert_eq!(
            c.on_report_sending(at_us(50_000), report(1, 20, 0, 2), Some(5_000)),
            Some(150)
        );
        // A clean report with a rate reached changes nothing but the round.
        assert_eq!(
            c.on_report_sending(at_us(100_000), report(1, 30, 0, 2), Some(1)),
            Some(250)
        );
    }

    #[test]
    fn cumulative_counters_tolerate_stale_and_duplicate_reports() {
        let mut c = RateController::new(cfg(), [1]);
        assert_eq!(c.on_report(at_us(0), report(1, 100, 5, 0)), Some(500));
        // The same report again, and an older one: no new loss, counted as clean.
        assert_eq!(c.on_report(at_us(50_000), report(1, 100, 5, 0)), Some(600));
        assert_eq!(c.on_report(at_us(60_000), report(1, 90, 4, 0)), Some(700));
        // Unknown ranks are ignored.
        assert_eq!(c.on_report(at_us(70_000), report(9, 0, 99, 99)), None);
    }

    #[test]
    fn tolerance_and_ceiling() {
        let mut c = RateController::new(
            RateConfig {
                tolerance_ppm: 10_000,
                ..cfg()
            },
            [1],
        );
        // 1 lost in 1000: below 1%, clean.
        assert_eq!(c.on_report(at_us(0), report(1, 999, 1, 0)), Some(1_100));
        // 20 lost in 1000: cut.
        assert_eq!(c.on_report(at_us(0), report(1, 1_979, 21, 0)), Some(550));
        for i in 0..30 {
            c.on_report(at_us(100_000), report(1, 3_000 + i, 21, 0));
        }
        assert_eq!(c.rate(), 2_000, "ceiling");
    }

    /// Counters are cumulative u64s from the wire: two deltas whose sum passes u64 are still
    /// a loss (a wrapped sum of 1 in 1001 chunks would pass as clean, and debug builds panic).
    #[test]
    fn loss_deltas_summing_past_u64_still_cut() {
        let mut c = RateController::new(
            RateConfig {
                tolerance_ppm: 1_000,
                ..cfg()
            },
            [1],
        );
        assert_eq!(
            c.on_report(at_us(0), report(1, 1_000, u64::MAX, 2)),
            Some(500)
        );
    }
}
