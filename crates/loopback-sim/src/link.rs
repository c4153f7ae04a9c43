//! Dynamic state of a directed link: when it is next free, what crossed it, what it lost.

use crate::faults::LinkFaults;
use crate::queue::Ps;
use crate::rng::Rng;

/// One directed link.
#[derive(Clone, Debug)]
pub(crate) struct Link {
    /// Serialization cost in picoseconds per byte, fixed point with 16 fractional bits.
    ps_per_byte_q16: u64,
    /// Propagation (and switching) latency.
    pub(crate) latency: Ps,
    /// When the transmitter is next idle.
    pub(crate) free_at: Ps,
    /// Bytes and packets transmitted.
    pub(crate) bytes: u64,
    pub(crate) packets: u64,
    /// Packets lost on this link (Bernoulli and burst).
    pub(crate) lost: u64,
    /// Gilbert-Elliott state.
    bad: bool,
}

impl Link {
    /// A link of `bandwidth` bytes/s and `latency` picoseconds.
    pub(crate) fn new(bandwidth: u64, latency: Ps) -> Self {
        let q = (1_000_000_000_000u128 << 16) / u128::from(bandwidth.max(1));
        Link {
            ps_per_byte_q16: u64::try_from(q).unwrap_or(u64::MAX),
            latency,
            free_at: 0,
            bytes: 0,
            packets: 0,
            lost: 0,
            bad: false,
        }
    }

    /// Time to put `bytes` on the wire.
    #[inline]
    pub(crate) fn serialize(&self, bytes: u64) -> Ps {
        ((u128::from(bytes) * u128::from(self.ps_per_byte_q16)) >> 16) as u64
    }

    /// Transmits a packet of `bytes` that is ready at `ready`: returns when its last bit left
    /// (the transmitter is busy until then).
    #[inline]
    pub(crate) fn transmit(&mut self, ready: Ps, bytes: u64) -> Ps {
        let start = ready.max(self.free_at);
        self.free_at = start + self.serialize(bytes);
        self.bytes += bytes;
        self.packets += 1;
        self.free_at
    }

    /// Whether the packet just transmitted is lost: `None` if it goes through, `Some(burst)` if
    /// lost (`burst`: by the Gilbert-Elliott bad state). Counts the loss.
    #[inline]
    pub(crate) fn lose(&mut self, f: &LinkFaults, rng: &mut Rng) -> Option<bool> {
        if f.bursty {
            if self.bad {
                if rng.chance(f.exit_bad) {
                    self.bad = false;
                }
            } else if rng.chance(f.enter_bad) {
                self.bad = true;
            }
            if self.bad {
                self.lost += 1;
                return Some(true);
            }
        }
        if rng.chance(f.loss) {
            self.lost += 1;
            return Some(false);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serialization_is_exact_at_100g() {
        let l = Link::new(12_500_000_000, 0);
        assert_eq!(l.serialize(4096), 327_680);
    }

    #[test]
    fn transmit_queues_behind_busy_link() {
        let mut l = Link::new(1_000_000_000, 500); // 1 ns per byte
        assert_eq!(l.transmit(0, 100), 100_000);
        assert_eq!(l.transmit(10, 100), 200_000);
        assert_eq!(l.transmit(500_000, 100), 600_000);
        assert_eq!((l.bytes, l.packets), (300, 3));
    }
}
