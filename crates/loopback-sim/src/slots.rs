//! Where each chunk of an operation's buffer lives in the simulator's token store.
//!
//! A rank's buffer is simulated as one `u32` token per chunk **slot** instead of bytes. The
//! buffer of an operation is the concatenation of one block per rank in rank order (a
//! Broadcast has one non-empty block, the root's), and blocks are *not* chunk-aligned in
//! bytes (block `r` starts at byte `sizes[..r].sum()`). Slots are numbered block by block:
//! block `r`'s chunk `j` is slot `base[r] + j`. A byte range that starts at a chunk boundary
//! of some block maps to a contiguous slot range, which is all the core ever names.

use crate::rng::splitmix64;
use std::ops::Range;

/// One block's bytes and slots.
#[derive(Clone, Copy, Debug, Default)]
struct Block {
    /// Byte offset in the buffer.
    displ: u64,
    /// Bytes.
    size: u64,
    /// First slot.
    base: u32,
    /// Chunks (slots).
    chunks: u32,
}

/// The slot layout of one workload operation, with the tokens a correct buffer holds.
#[derive(Clone, Debug)]
pub(crate) struct SlotLayout {
    chunk: u64,
    /// `chunk.trailing_zeros()` when the chunk size is a power of two (no division).
    shift: Option<u32>,
    blocks: Vec<Block>,
    /// The token every slot must hold at the end (the owner's fingerprint).
    expected: Vec<u32>,
}

impl SlotLayout {
    /// The layout of blocks of `sizes` bytes in `chunk`-byte chunks, for workload operation
    /// `op` of a run seeded with `seed`; `None` if the slots overflow `u32`.
    pub(crate) fn new(sizes: &[u64], chunk: u32, seed: u64, op: u32) -> Option<Self> {
        let chunk = u64::from(chunk.max(1));
        let mut blocks = Vec::with_capacity(sizes.len());
        let (mut displ, mut base) = (0u64, 0u32);
        for &size in sizes {
            let chunks = u32::try_from(size.div_ceil(chunk)).ok()?;
            blocks.push(Block {
                displ,
                size,
                base,
                chunks,
            });
            displ = displ.checked_add(size)?;
            base = base.checked_add(chunks)?;
        }
        let expected = (0..base).map(|s| fingerprint(seed, op, s)).collect();
        Some(SlotLayout {
            chunk,
            shift: chunk.is_power_of_two().then(|| chunk.trailing_zeros()),
            blocks,
            expected,
        })
    }

    /// Slots in all.
    pub(crate) fn total(&self) -> usize {
        self.expected.len()
    }

    /// The tokens of a correct buffer.
    pub(crate) fn expected(&self) -> &[u32] {
        &self.expected
    }

    /// The slots of `rank`'s own block (filled before the operation starts).
    pub(crate) fn owned(&self, rank: u32) -> Range<usize> {
        self.blocks.get(rank as usize).map_or(0..0, |b| {
            b.base as usize..b.base as usize + b.chunks as usize
        })
    }

    /// Slot of chunk `chunk` (index within the block) of `rank`'s block.
    #[inline]
    pub(crate) fn chunk_slot(&self, rank: u32, chunk: u32) -> Option<usize> {
        let b = self.blocks.get(rank as usize)?;
        (chunk < b.chunks).then_some(b.base as usize + chunk as usize)
    }

    #[inline]
    fn index(&self, bytes: u64) -> u64 {
        match self.shift {
            Some(s) => bytes >> s,
            None => bytes / self.chunk,
        }
    }

    /// Slot of the chunk of `rank`'s block that starts at byte `offset` of the buffer.
    #[inline]
    pub(crate) fn slot(&self, rank: u32, offset: u64) -> Option<usize> {
        let b = self.blocks.get(rank as usize)?;
        let j = self.index(offset.checked_sub(b.displ)?);
        (j < u64::from(b.chunks)).then_some(b.base as usize + j as usize)
    }

    /// Slot of the chunk holding byte `at` (in the non-empty block that contains it).
    fn slot_at(&self, at: u64) -> Option<usize> {
        let r = self.blocks.partition_point(|b| b.displ + b.size <= at);
        let b = self.blocks.get(r)?;
        Some(b.base as usize + self.index(at - b.displ) as usize)
    }

    /// The slots covering bytes `offset..offset + len` (empty if out of range).
    pub(crate) fn slots_of_bytes(&self, offset: u64, len: u64) -> Range<usize> {
        if len == 0 {
            return 0..0;
        }
        match (
            self.slot_at(offset),
            offset.checked_add(len - 1).and_then(|e| self.slot_at(e)),
        ) {
            (Some(a), Some(b)) if a <= b => a..b + 1,
            _ => 0..0,
        }
    }
}

/// The token the owner's slot `slot` of workload operation `op` holds: never 0 (empty).
pub(crate) fn fingerprint(seed: u64, op: u32, slot: u32) -> u32 {
    let x = splitmix64(seed ^ splitmix64((u64::from(op) << 32) | u64::from(slot)));
    let v = (x as u32) ^ ((x >> 32) as u32);
    if v == 0 { 1 } else { v }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_not_chunk_aligned_in_bytes() {
        // Blocks of 25, 0 and 30 bytes in 10-byte chunks: slots 0..3 | - | 3..6.
        let l = SlotLayout::new(&[25, 0, 30], 10, 1, 0).unwrap();
        assert_eq!(l.total(), 6);
        assert_eq!(l.owned(0), 0..3);
        assert_eq!(l.owned(1), 3..3);
        assert_eq!(l.owned(2), 3..6);
        assert_eq!(l.slot(2, 25), Some(3));
        assert_eq!(l.slot(2, 35), Some(4));
        assert_eq!(l.slot(1, 25), None);
        assert_eq!(l.slot(0, 30), None);
        assert_eq!(l.chunk_slot(2, 2), Some(5));
        assert_eq!(l.chunk_slot(2, 3), None);
        assert_eq!(l.slots_of_bytes(10, 15), 1..3);
        assert_eq!(l.slots_of_bytes(20, 15), 2..4); // spans blocks 0 and 2
        assert_eq!(l.slots_of_bytes(25, 30), 3..6);
        assert_eq!(l.slots_of_bytes(55, 1), 0..0);
        assert!(l.expected().iter().all(|t| *t != 0));
    }

    #[test]
    fn power_of_two_chunks_shift() {
        let l = SlotLayout::new(&[0, 8192, 4097], 4096, 1, 0).unwrap();
        assert_eq!(l.slot(1, 4096), Some(1));
        assert_eq!(l.slot(2, 8192 + 4096), Some(3));
        assert_eq!(l.slots_of_bytes(8192, 4097), 2..4);
    }
}
