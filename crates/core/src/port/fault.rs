//! Seeded faults around any port (smoltcp's `FaultInjector`), and the one small RNG the
//! workspace's drivers share.

use super::{Capabilities, ControlPort, LaneRxPort, LaneTxPort, Ports, RxMeta, RxToken};
use crate::event::{DropReason, OpId, Placement};
use crate::lane::Multicast;
use alloc::collections::VecDeque;
use alloc::vec::Vec;

/// splitmix64: a tiny, seeded, deterministic generator. Not for cryptography.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator from `seed`.
    pub const fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(GOLDEN);
        mix(self.0)
    }

    /// True with probability `p` (never for `p <= 0`).
    pub fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }

    /// Uniform in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

/// splitmix64's increment (2^64 over the golden ratio).
const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

/// One splitmix64 step from `z` (the increment, then [`mix`]): what
/// [`SplitMix64::new(z).next_u64()`](SplitMix64::next_u64) returns, as a stateless hash of `z`.
pub const fn splitmix64(z: u64) -> u64 {
    mix(z.wrapping_add(GOLDEN))
}

/// The splitmix64 finaliser: a good 64-bit mix of `z`.
pub const fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Fault rates, each a probability per packet.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Faults {
    /// A received chunk vanishes.
    pub rx_loss: f64,
    /// A received chunk arrives one byte short (the core must drop it).
    pub rx_truncate: f64,
    /// A received chunk's payload cannot be written where the core placed it (the token
    /// drops it and says so: the driver must release the chunk).
    pub rx_copy_fail: f64,
    /// A posted multicast never leaves (it is still reported sent).
    pub tx_loss: f64,
    /// Seed of the faults' generator.
    pub seed: u64,
}

/// A receive half with faults.
#[derive(Debug)]
pub struct FaultyRx<R> {
    inner: R,
    faults: Faults,
    rng: SplitMix64,
    /// Chunks dropped or truncated by the injector.
    pub injected: u64,
}

/// A send half with faults.
#[derive(Debug)]
pub struct FaultyTx<T> {
    inner: T,
    faults: Faults,
    rng: SplitMix64,
    lost: VecDeque<OpId>,
    /// Multicasts the injector swallowed.
    pub injected: u64,
}

/// A token whose length may have been cut, or whose payload may fail to be written.
pub struct FaultyToken<'a, Tk> {
    inner: Tk,
    meta: RxMeta,
    fail_copy: bool,
    injected: &'a mut u64,
}

impl<Tk: RxToken> RxToken for FaultyToken<'_, Tk> {
    fn meta(&self) -> RxMeta {
        self.meta
    }
    fn consume(self, placement: &Placement) -> bool {
        if self.fail_copy && matches!(placement, Placement::Place { .. }) {
            *self.injected += 1;
            // The payload goes nowhere; the buffer goes back.
            let _ = self.inner.consume(&Placement::Drop(DropReason::Stale));
            return false;
        }
        self.inner.consume(placement)
    }
}

impl<R: LaneRxPort> LaneRxPort for FaultyRx<R> {
    type Token<'a>
        = FaultyToken<'a, R::Token<'a>>
    where
        Self: 'a;

    fn receive(&mut self) -> Option<Self::Token<'_>> {
        // The fate of the next chunk is drawn before it is taken, so that a dropped token's
        // borrow ends before the next one is taken.
        while self.rng.chance(self.faults.rx_loss) {
            let tok = self.inner.receive()?;
            self.injected += 1;
            let _ = tok.consume(&Placement::Drop(DropReason::Stale));
        }
        let truncate = self.rng.chance(self.faults.rx_truncate);
        let fail_copy = self.rng.chance(self.faults.rx_copy_fail);
        let tok = self.inner.receive()?;
        let mut meta = tok.meta();
        if truncate && meta.len > 0 {
            self.injected += 1;
            meta.len -= 1;
        }
        Some(FaultyToken {
            inner: tok,
            meta,
            fail_copy,
            injected: &mut self.injected,
        })
    }
}

impl<T: LaneTxPort> LaneTxPort for FaultyTx<T> {
    fn post_multicast(&mut self, m: &Multicast) {
        if self.rng.chance(self.faults.tx_loss) {
            self.injected += 1;
            self.lost.push_back(m.op);
        } else {
            self.inner.post_multicast(m);
        }
    }

    fn poll_send_done(&mut self) -> Option<(OpId, u32)> {
        match self.lost.pop_front() {
            Some(op) => Some((op, 1)),
            None => self.inner.poll_send_done(),
        }
    }
}

/// Wraps every data half of `ports` with seeded faults; the control path stays reliable, as
/// the protocol assumes. Lane `l` draws from its own generator (seed `faults.seed + l`).
pub fn inject<R: LaneRxPort, T: LaneTxPort, C: ControlPort>(
    ports: Ports<R, T, C>,
    faults: Faults,
) -> Ports<FaultyRx<R>, FaultyTx<T>, C> {
    let seed = |l: usize, salt: u64| SplitMix64::new(mix(faults.seed ^ salt) ^ l as u64);
    Ports {
        caps: Capabilities { ..ports.caps },
        rx: ports
            .rx
            .into_iter()
            .enumerate()
            .map(|(l, inner)| FaultyRx {
                inner,
                faults,
                rng: seed(l, 1),
                injected: 0,
            })
            .collect::<Vec<_>>(),
        tx: ports
            .tx
            .into_iter()
            .enumerate()
            .map(|(l, inner)| FaultyTx {
                inner,
                faults,
                rng: seed(l, 2),
                lost: VecDeque::new(),
                injected: 0,
            })
            .collect(),
        control: ports.control,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Rank;
    use crate::port::mailbox::mailbox;

    #[test]
    fn splitmix64_is_the_generators_step_with_its_known_outputs() {
        // The reference outputs of splitmix64 seeded with 0 (Vigna's splitmix64.c).
        let mut g = SplitMix64::new(0);
        assert_eq!(g.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(g.next_u64(), 0x6E78_9E6A_A1B9_65F4);
        assert_eq!(splitmix64(0), 0xE220_A839_7B1D_CDAF);
        for z in [1, 42, u64::MAX, 0x9E37_79B9_7F4A_7C15] {
            assert_eq!(splitmix64(z), SplitMix64::new(z).next_u64());
        }
    }

    fn meta(imm: u32) -> RxMeta {
        RxMeta {
            from: Rank(0),
            imm,
            len: 100,
        }
    }

    #[test]
    fn drops_truncates_and_swallows_at_the_seeded_rates() {
        let faults = Faults {
            rx_loss: 0.25,
            rx_truncate: 0.25,
            tx_loss: 0.5,
            seed: 7,
            ..Faults::default()
        };
        let mut p = inject(mailbox::<u32>(1), faults);
        for i in 0..1000 {
            p.rx[0].inner.push(meta(i), i);
        }
        let (mut seen, mut short) = (0, 0);
        while let Some(tok) = p.rx[0].receive() {
            seen += 1;
            if tok.meta().len == 99 {
                short += 1;
            }
            let _ = tok.consume(&Placement::Drop(DropReason::BadLength));
        }
        // Every token is consumed exactly once, delivered or dropped by the injector.
        assert_eq!(p.rx[0].inner.consumed.len(), 1000);
        let lost = 1000 - seen;
        assert!((180..320).contains(&lost), "lost {lost}");
        assert!((120..260).contains(&short), "short {short}");
        assert_eq!(p.rx[0].injected, (lost + short) as u64);
        let m = Multicast {
            op: OpId(1),
            lane: 0,
            imm: 0,
            chunk: 0,
            offset: 0,
            len: 1,
        };
        for _ in 0..200 {
            p.tx[0].post_multicast(&m);
        }
        let posted = p.tx[0].inner.posted.len();
        assert!((60..140).contains(&posted), "posted {posted}");
        // A swallowed multicast still completes, so the send window keeps moving.
        let mut done = 0;
        while let Some((_, n)) = p.tx[0].poll_send_done() {
            done += n;
        }
        assert_eq!(done as usize + posted, 200);
        // Same seed, same faults.
        let mut q = inject(mailbox::<u32>(1), faults);
        for i in 0..1000 {
            q.rx[0].inner.push(meta(i), i);
        }
        let mut again = 0;
        while let Some(tok) = q.rx[0].receive() {
            again += 1;
            let _ = tok.consume(&Placement::Drop(DropReason::BadLength));
        }
        assert_eq!(again, seen);
    }

    #[test]
    fn a_failed_copy_gives_the_buffer_back_and_says_so_for_placed_chunks_only() {
        let faults = Faults {
            rx_copy_fail: 0.5,
            seed: 3,
            ..Faults::default()
        };
        let mut p = inject(mailbox::<u32>(1), faults);
        for i in 0..400 {
            p.rx[0].inner.push(meta(i), i);
        }
        let place = Placement::Place {
            op: OpId(1),
            offset: 0,
            len: 100,
        };
        let (mut failed, mut i) = (0u64, 0);
        while let Some(tok) = p.rx[0].receive() {
            // Every other chunk is dropped by the core: nothing to write, nothing fails.
            if i % 2 == 0 {
                assert!(tok.consume(&Placement::Drop(DropReason::Stale)));
            } else if !tok.consume(&place) {
                failed += 1;
            }
            i += 1;
        }
        assert_eq!(i, 400);
        assert!((60..140).contains(&failed), "failed {failed}");
        assert_eq!(p.rx[0].injected, failed);
        // A failed copy's buffer goes back with nothing written: the inner token saw a drop.
        let placed = p.rx[0]
            .inner
            .consumed
            .iter()
            .filter(|(pl, _)| matches!(pl, Placement::Place { .. }))
            .count() as u64;
        assert_eq!(placed, 200 - failed);
        assert_eq!(p.rx[0].inner.consumed.len(), 400);
    }
}
