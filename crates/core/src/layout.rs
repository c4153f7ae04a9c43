//! Where every chunk of an operation lives: blocks (one per root), lanes, and the numbering
//! that ties them together.
//!
//! An operation's buffer is the concatenation of one block per rank (a Broadcast has a single
//! non-empty block, the root's). Each block is cut into chunks; contiguous runs of a block's
//! chunks map to the `K` lanes (multicast subgroups). Chunks are numbered **lane-major**:
//! lane 0's chunks of rank 0, of rank 1, ..., then lane 1's, and so on, so that
//! * each lane owns one contiguous range of numbers and therefore its own bitmap, and
//! * a run of numbers spans few blocks, which keeps fetch requests short.
//!
//! The immediate carries a chunk's index *within its block*; the block is known from the
//! sender the transport reports.

use crate::wire::ChunkRun;
use alloc::vec::Vec;

/// A chunk's home: lane, and index within that lane's bitmap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Slot {
    pub(crate) lane: u32,
    pub(crate) index: u32,
}

/// A contiguous piece of a run: its numbers and the bytes they cover.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Piece {
    pub(crate) run: ChunkRun,
    pub(crate) offset: u64,
    pub(crate) len: u64,
}

#[derive(Clone, Debug)]
pub(crate) struct Layout {
    chunk_size: u32,
    ranks: u32,
    lanes: u32,
    /// Per block: byte size, byte offset in the buffer, chunks, chunks per lane.
    size: Vec<u64>,
    displ: Vec<u64>,
    chunks: Vec<u32>,
    per_lane: Vec<u32>,
    /// `base[l * ranks + r]`: number of the first chunk of block `r` on lane `l`.
    base: Vec<u32>,
    /// `lane_start[l]`: first number of lane `l`; `lane_start[lanes]` is the total.
    lane_start: Vec<u32>,
}

impl Layout {
    /// A layout for blocks of `sizes` bytes; `None` if the chunk count overflows `u32`.
    pub(crate) fn new(sizes: &[u64], chunk_size: u32, lanes: u16) -> Option<Self> {
        let ranks = sizes.len() as u32;
        let lanes = u32::from(lanes.max(1));
        let cs = u64::from(chunk_size);
        let mut displ = Vec::with_capacity(sizes.len());
        let mut chunks = Vec::with_capacity(sizes.len());
        let mut per_lane = Vec::with_capacity(sizes.len());
        let mut at = 0u64;
        for &s in sizes {
            displ.push(at);
            at = at.checked_add(s)?;
            let c = u32::try_from(s.div_ceil(cs)).ok()?;
            chunks.push(c);
            per_lane.push(c.div_ceil(lanes));
        }
        let mut base = Vec::with_capacity((lanes * ranks) as usize);
        let mut lane_start = Vec::with_capacity(lanes as usize + 1);
        let mut n = 0u32;
        for l in 0..lanes {
            lane_start.push(n);
            for r in 0..ranks as usize {
                base.push(n);
                n = n.checked_add(lane_count(chunks[r], per_lane[r], l))?;
            }
        }
        lane_start.push(n);
        Some(Layout {
            chunk_size,
            ranks,
            lanes,
            size: sizes.to_vec(),
            displ,
            chunks,
            per_lane,
            base,
            lane_start,
        })
    }

    pub(crate) fn total(&self) -> u32 {
        self.lane_start[self.lanes as usize]
    }

    pub(crate) fn lanes(&self) -> u32 {
        self.lanes
    }

    /// Chunks on lane `l`.
    pub(crate) fn lane_len(&self, l: u32) -> u32 {
        self.lane_start[l as usize + 1] - self.lane_start[l as usize]
    }

    pub(crate) fn lane_start(&self, l: u32) -> u32 {
        self.lane_start[l as usize]
    }

    /// Chunks of block `r`.
    pub(crate) fn block_chunks(&self, r: u32) -> u32 {
        self.chunks.get(r as usize).copied().unwrap_or(0)
    }

    /// Bytes of the whole buffer.
    pub(crate) fn bytes(&self) -> u64 {
        self.displ
            .last()
            .zip(self.size.last())
            .map_or(0, |(d, s)| d + s)
    }

    /// Ranks (blocks).
    pub(crate) fn ranks(&self) -> u32 {
        self.ranks
    }

    /// Chunks of block `r` per lane (the last lanes may hold fewer).
    pub(crate) fn per_lane(&self, r: u32) -> u32 {
        self.per_lane[r as usize]
    }

    /// Lane-relative index of block `r`'s first chunk on lane `l`.
    pub(crate) fn lane_index(&self, r: u32, l: u32) -> u32 {
        self.base[(l * self.ranks + r) as usize] - self.lane_start[l as usize]
    }

    /// Chunks of block `r` on lane `l`.
    pub(crate) fn lane_count(&self, r: u32, l: u32) -> u32 {
        lane_count(self.chunks[r as usize], self.per_lane[r as usize], l)
    }

    /// The lane and lane-relative index of chunk `local` of block `r`, or `None` when out
    /// of range.
    #[inline]
    pub(crate) fn slot(&self, r: u32, local: u32) -> Option<Slot> {
        let (c, p) = (*self.chunks.get(r as usize)?, self.per_lane[r as usize]);
        if local >= c {
            return None;
        }
        let lane = local / p;
        let g = self.base[(lane * self.ranks + r) as usize] + (local - lane * p);
        Some(Slot {
            lane,
            index: g - self.lane_start[lane as usize],
        })
    }

    /// Bytes of chunk `local` of block `r` (which must be in range).
    #[inline]
    pub(crate) fn chunk_bytes(&self, r: u32, local: u32) -> (u64, u64) {
        let start = u64::from(local) * u64::from(self.chunk_size);
        let size = self.size[r as usize];
        (
            self.displ[r as usize] + start,
            (size - start.min(size)).min(u64::from(self.chunk_size)),
        )
    }

    /// Splits `run` (clipped to the layout) into pieces that are contiguous in bytes.
    pub(crate) fn pieces(&self, run: ChunkRun, out: &mut Vec<Piece>) {
        let end = run.end().min(self.total());
        let mut g = run.start;
        while g < end {
            let l = self.lane_start.partition_point(|&s| s <= g) - 1;
            let bases = &self.base[l * self.ranks as usize..(l + 1) * self.ranks as usize];
            let r = bases.partition_point(|&b| b <= g) - 1;
            let next = bases.get(r + 1).copied().unwrap_or(self.lane_start[l + 1]);
            let stop = end.min(next);
            let local = l as u32 * self.per_lane[r] + (g - bases[r]);
            let (offset, _) = self.chunk_bytes(r as u32, local);
            let (last_off, last_len) = self.chunk_bytes(r as u32, local + (stop - g) - 1);
            out.push(Piece {
                run: ChunkRun {
                    start: g,
                    len: stop - g,
                },
                offset,
                len: last_off + last_len - offset,
            });
            g = stop;
        }
    }
}

fn lane_count(chunks: u32, per_lane: u32, l: u32) -> u32 {
    chunks.saturating_sub(l * per_lane).min(per_lane)
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec;

    #[test]
    fn lane_major_numbering_and_pieces() {
        // Three blocks of 5, 0 and 3 chunks (chunk 10 bytes, last chunk of block 0 short),
        // two lanes: lane 0 = b0[0..3], b2[0..2]; lane 1 = b0[3..5], b2[2..3].
        let l = Layout::new(&[45, 0, 30], 10, 2).unwrap();
        assert_eq!(l.total(), 8);
        assert_eq!(l.lane_len(0), 5);
        assert_eq!(l.slot(0, 4), Some(Slot { lane: 1, index: 1 }));
        assert_eq!(l.slot(2, 1), Some(Slot { lane: 0, index: 4 }));
        assert_eq!(l.slot(2, 2), Some(Slot { lane: 1, index: 2 }));
        assert_eq!(l.slot(1, 0), None);
        assert_eq!(l.slot(3, 0), None);
        assert_eq!(l.chunk_bytes(0, 4), (40, 5));
        let mut p = vec![];
        l.pieces(ChunkRun { start: 1, len: 6 }, &mut p);
        assert_eq!(
            p,
            vec![
                Piece {
                    run: ChunkRun { start: 1, len: 2 },
                    offset: 10,
                    len: 20
                },
                Piece {
                    run: ChunkRun { start: 3, len: 2 },
                    offset: 45,
                    len: 20
                },
                Piece {
                    run: ChunkRun { start: 5, len: 2 },
                    offset: 30,
                    len: 15
                },
            ]
        );
        assert_eq!(l.bytes(), 75);
    }
}
