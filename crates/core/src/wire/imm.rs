//! The 32-bit immediate carried with every chunk: an operation tag and the chunk's index within
//! the sender's block (see `layout.rs`).

use super::{Error, Result};

/// How the 32 bits of the immediate are split between the operation tag (high bits) and the
/// chunk index (low bits).
///
/// The split is a configuration value, validated at start-up by [`ImmLayout::new`]. The
/// operation tag is the low `op_bits` of the operation's sequence number; at least
/// [`ImmLayout::MIN_OP_BITS`] bits are required so that a delayed packet would have to survive
/// over a thousand later collectives before its tag could alias a current one (and it must then
/// still come from the right root and land in range).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ImmLayout {
    chunk_bits: u8,
}

/// A decoded immediate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Imm {
    /// Low `op_bits` of the operation's sequence number.
    pub op_tag: u32,
    /// Index of the chunk within the sender's block (not within the whole operation, and not
    /// lane-relative); the block is known from the sender the transport reports.
    pub chunk: u32,
}

impl ImmLayout {
    /// Fewest bits the operation tag may have.
    pub const MIN_OP_BITS: u8 = 10;
    /// Most bits the chunk index may have (32 - `MIN_OP_BITS`).
    pub const MAX_CHUNK_BITS: u8 = 32 - Self::MIN_OP_BITS;

    /// A layout with `chunk_bits` bits of chunk index and the rest for the operation tag.
    ///
    /// ```
    /// # use ringcast_core::wire::ImmLayout;
    /// assert!(ImmLayout::new(22).is_ok()); // 16 GiB in 4 KiB chunks, 10-bit op tag
    /// assert!(ImmLayout::new(24).is_err()); // only 8 bits left for the op tag
    /// ```
    pub const fn new(chunk_bits: u8) -> Result<Self> {
        if chunk_bits == 0 || chunk_bits > Self::MAX_CHUNK_BITS {
            return Err(Error);
        }
        Ok(ImmLayout { chunk_bits })
    }

    /// Bits of chunk index.
    pub const fn chunk_bits(self) -> u8 {
        self.chunk_bits
    }

    /// Bits of operation tag.
    pub const fn op_bits(self) -> u8 {
        32 - self.chunk_bits
    }

    /// Number of distinct chunk indices (one more than the most chunks one operation may
    /// have: the all-ones index is never a chunk's).
    pub const fn max_chunks(self) -> u64 {
        1u64 << self.chunk_bits
    }

    /// Number of distinct operation tags.
    pub const fn op_tags(self) -> u64 {
        1u64 << self.op_bits()
    }

    /// The tag of operation sequence number `seq`.
    pub const fn tag_of(self, seq: u64) -> u32 {
        (seq & (self.op_tags() - 1)) as u32
    }

    /// Encodes an immediate; `None` if a field does not fit its bits.
    pub const fn encode(self, imm: Imm) -> Option<u32> {
        if imm.chunk as u64 >= self.max_chunks() || imm.op_tag as u64 >= self.op_tags() {
            return None;
        }
        Some((imm.op_tag << self.chunk_bits) | imm.chunk)
    }

    /// Decodes an immediate. Every 32-bit value decodes; the fields still have to be checked
    /// against the operation they name.
    #[inline]
    pub const fn decode(self, raw: u32) -> Imm {
        let mask = ((1u64 << self.chunk_bits) - 1) as u32;
        Imm {
            op_tag: raw >> self.chunk_bits,
            chunk: raw & mask,
        }
    }
}

impl Default for ImmLayout {
    /// 20 bits of chunk index (4 GiB in 4 KiB chunks), 12 bits of op tag.
    fn default() -> Self {
        ImmLayout { chunk_bits: 20 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_every_split() {
        for bits in 1..=ImmLayout::MAX_CHUNK_BITS {
            let l = ImmLayout::new(bits).unwrap();
            for raw in [0u32, 1, 0xdead_beef, u32::MAX, 1 << bits, (1 << bits) - 1] {
                let imm = l.decode(raw);
                assert_eq!(l.encode(imm), Some(raw));
            }
        }
    }

    #[test]
    fn rejects_narrow_op_tag_and_overflow() {
        assert_eq!(ImmLayout::new(0), Err(Error));
        assert_eq!(ImmLayout::new(23), Err(Error));
        let l = ImmLayout::new(22).unwrap();
        assert_eq!(l.op_bits(), 10);
        assert_eq!(
            l.encode(Imm {
                op_tag: 1024,
                chunk: 0
            }),
            None
        );
        assert_eq!(
            l.encode(Imm {
                op_tag: 0,
                chunk: 1 << 22
            }),
            None
        );
        assert_eq!(l.tag_of(1024 + 5), 5);
    }

    /// Fixed vectors: the tag sits in the high bits, the index in the low bits, big end first
    /// when the transport writes the 32-bit value in network order.
    #[test]
    fn fixed_vectors() {
        let cases: [(u8, u32, u32, u32); 6] = [
            // (chunk_bits, op_tag, chunk, raw)
            (20, 0xabc, 0x1_2345, 0xabc1_2345),
            (20, 0, 0, 0),
            (20, 0xfff, 0xf_ffff, 0xffff_ffff),
            (22, 1, 0, 0x0040_0000),
            (22, 0x3ff, 0x3f_ffff, 0xffff_ffff),
            (1, 0x7fff_ffff, 0, 0xffff_fffe),
        ];
        for (bits, op_tag, chunk, raw) in cases {
            let l = ImmLayout::new(bits).unwrap();
            let imm = Imm { op_tag, chunk };
            assert_eq!(l.encode(imm), Some(raw), "{bits} bits, {imm:?}");
            assert_eq!(l.decode(raw), imm, "{bits} bits, {raw:#010x}");
        }
        assert_eq!(ImmLayout::default().chunk_bits(), 20);
        assert_eq!(
            ImmLayout::default().decode(0x0010_0005),
            Imm {
                op_tag: 1,
                chunk: 5
            }
        );
    }
}
