//! A rank's buffer of one operation, as the simulator keeps it: one bit per chunk slot saying
//! whether the slot holds its owner's data.
//!
//! Packets still carry the sender's token (the owner's fingerprint of the slot the sender
//! meant, or 0 for data it did not hold), and a placement stores whether that token is the
//! fingerprint of the slot the core placed it in: a misplaced, stale or empty chunk leaves the
//! bit clear, and reads copy bits. One bit instead of a 32-bit token per slot keeps a
//! 1024-rank Allgather's buffers (2^28 slots) in 32 MiB rather than 1 GiB, which is what
//! makes the random per-delivery stores cheap.

/// Bit per slot: the slot holds its owner's data.
#[derive(Clone, Debug)]
pub(crate) struct Held {
    words: Vec<u64>,
    len: usize,
}

impl Held {
    /// `len` slots, none held.
    pub(crate) fn new(len: usize) -> Self {
        Held {
            words: vec![0; len.div_ceil(64)],
            len,
        }
    }

    /// Slots.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether slot `s` holds its owner's data (`None` out of range).
    #[inline]
    pub(crate) fn get(&self, s: usize) -> Option<bool> {
        (s < self.len).then(|| self.words[s >> 6] >> (s & 63) & 1 == 1)
    }

    /// Records what slot `s` holds now (ignored out of range).
    #[inline]
    pub(crate) fn set(&mut self, s: usize, right: bool) {
        if s < self.len {
            let bit = 1u64 << (s & 63);
            let w = &mut self.words[s >> 6];
            *w = if right { *w | bit } else { *w & !bit };
        }
    }

    /// Slots that do not hold their owner's data.
    pub(crate) fn wrong(&self) -> u64 {
        let right: u64 = self.words.iter().map(|w| u64::from(w.count_ones())).sum();
        self.len as u64 - right
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_get_and_count() {
        let mut h = Held::new(130);
        assert_eq!(h.wrong(), 130);
        h.set(0, true);
        h.set(129, true);
        h.set(64, true);
        h.set(64, false);
        h.set(500, true);
        assert_eq!(
            (h.get(0), h.get(64), h.get(129), h.get(130)),
            (Some(true), Some(false), Some(true), None)
        );
        assert_eq!(h.wrong(), 128);
    }
}
