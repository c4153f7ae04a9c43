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

use crate::lane::LaneBlock;
use crate::wire::ChunkRun;
use alloc::vec::Vec;

/// A contiguous piece of a run: its numbers and the bytes they cover.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Piece {
    pub(crate) run: ChunkRun,
    /// The block (root) the piece belongs to.
    pub(crate) root: u32,
    pub(crate) offset: u64,
    pub(crate) len: u64,
}

/// One rank's block: byte offset in the buffer, byte size, chunks, chunks per lane.
#[derive(Clone, Copy, Debug)]
struct Block {
    displ: u64,
    size: u64,
    chunks: u32,
    per_lane: u32,
}

#[derive(Clone, Debug)]
pub(crate) struct Layout {
    chunk_size: u32,
    ranks: u32,
    lanes: u32,
    /// Per block, together so the fast path touches one cache line.
    blocks: Vec<Block>,
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
        let mut blocks = Vec::with_capacity(sizes.len());
        let mut at = 0u64;
        for &size in sizes {
            let chunks = u32::try_from(size.div_ceil(cs)).ok()?;
            blocks.push(Block {
                displ: at,
                size,
                chunks,
                per_lane: chunks.div_ceil(lanes),
            });
            at = at.checked_add(size)?;
        }
        let mut base = Vec::with_capacity((lanes * ranks) as usize);
        let mut lane_start = Vec::with_capacity(lanes as usize + 1);
        let mut n = 0u32;
        for l in 0..lanes {
            lane_start.push(n);
            for b in &blocks {
                base.push(n);
                n = n.checked_add(lane_count(b.chunks, b.per_lane, l))?;
            }
        }
        lane_start.push(n);
        Some(Layout {
            chunk_size,
            ranks,
            lanes,
            blocks,
            base,
            lane_start,
        })
    }

    #[inline]
    pub(crate) fn total(&self) -> u32 {
        self.lane_start[self.lanes as usize]
    }

    #[inline]
    pub(crate) fn lanes(&self) -> u32 {
        self.lanes
    }

    /// Ranks (blocks).
    #[inline]
    pub(crate) fn ranks(&self) -> u32 {
        self.ranks
    }

    /// Chunks on lane `l`.
    #[inline]
    pub(crate) fn lane_len(&self, l: u32) -> u32 {
        self.lane_start[l as usize + 1] - self.lane_start[l as usize]
    }

    #[inline]
    pub(crate) fn lane_start(&self, l: u32) -> u32 {
        self.lane_start[l as usize]
    }

    /// Chunks of block `r` (zero for a rank out of range).
    #[inline]
    pub(crate) fn block_chunks(&self, r: u32) -> u32 {
        self.blocks.get(r as usize).map_or(0, |b| b.chunks)
    }

    /// Bytes of block `r` (zero for a rank out of range).
    pub(crate) fn block_size(&self, r: u32) -> u64 {
        self.blocks.get(r as usize).map_or(0, |b| b.size)
    }

    /// Block-local index of chunk number `g` (global), which belongs to block `r`.
    pub(crate) fn block_local(&self, g: u32, r: u32) -> u32 {
        let l = self.lane_start.partition_point(|&s| s <= g) - 1;
        let base = self.base[l * self.ranks as usize + r as usize];
        l as u32 * self.blocks[r as usize].per_lane + g.saturating_sub(base)
    }

    /// Bytes of the whole buffer.
    pub(crate) fn bytes(&self) -> u64 {
        self.blocks.last().map_or(0, |b| b.displ + b.size)
    }

    /// Lane-relative index of block `r`'s first chunk on lane `l`.
    #[inline]
    pub(crate) fn lane_index(&self, r: u32, l: u32) -> u32 {
        self.base[(l * self.ranks + r) as usize] - self.lane_start[l as usize]
    }

    /// Chunks of block `r` on lane `l`.
    #[inline]
    pub(crate) fn lane_count(&self, r: u32, l: u32) -> u32 {
        let b = &self.blocks[r as usize];
        lane_count(b.chunks, b.per_lane, l)
    }

    /// Bytes of chunk `local` of block `r` (which must be in range).
    #[inline]
    pub(crate) fn chunk_bytes(&self, r: u32, local: u32) -> (u64, u64) {
        let b = &self.blocks[r as usize];
        let start = u64::from(local) * u64::from(self.chunk_size);
        (
            b.displ + start,
            (b.size - start.min(b.size)).min(u64::from(self.chunk_size)),
        )
    }

    /// Where block `r`'s chunks sit on lane `l`: the fast path's placement arithmetic.
    pub(crate) fn lane_block(&self, r: u32, l: u32) -> LaneBlock {
        let b = &self.blocks[r as usize];
        let cs = u64::from(self.chunk_size);
        let last_len = if b.chunks == 0 {
            0
        } else {
            (b.size - u64::from(b.chunks - 1) * cs) as u32
        };
        let (lo, count) = (l * b.per_lane, self.lane_count(r, l));
        let holds_last = count > 0 && lo + count == b.chunks;
        LaneBlock {
            displ: b.displ,
            lo,
            count,
            base: self.lane_index(r, l),
            chunks: b.chunks,
            last_len,
            full: count - u32::from(holds_last),
        }
    }

    /// Splits a global run (clipped to the layout) into lane-relative runs.
    pub(crate) fn split(&self, run: ChunkRun) -> impl Iterator<Item = (u32, ChunkRun)> + '_ {
        let end = run.end().min(self.total());
        (0..self.lanes).filter_map(move |l| {
            let base = self.lane_start(l);
            let s = run.start.max(base);
            let e = end.min(base + self.lane_len(l));
            (s < e).then(|| {
                (
                    l,
                    ChunkRun {
                        start: s - base,
                        len: e - s,
                    },
                )
            })
        })
    }

    /// Splits `run` (clipped to the layout) into pieces that are contiguous in bytes.
    pub(crate) fn pieces(&self, run: ChunkRun, out: &mut Vec<Piece>) {
        self.pieces_of_at_most(run, u32::MAX, out);
    }

    /// [`pieces`](Self::pieces) of at most `most` chunks each (at least one).
    pub(crate) fn pieces_of_at_most(&self, run: ChunkRun, most: u32, out: &mut Vec<Piece>) {
        let most = most.max(1);
        let end = run.end().min(self.total());
        let mut g = run.start;
        while g < end {
            let l = self.lane_start.partition_point(|&s| s <= g) - 1;
            let bases = &self.base[l * self.ranks as usize..(l + 1) * self.ranks as usize];
            // The last block starting at or before `g`: empty blocks share the next one's base.
            let r = bases.partition_point(|&b| b <= g) - 1;
            let next = bases.get(r + 1).copied().unwrap_or(self.lane_start[l + 1]);
            let stop = end.min(next).min(g.saturating_add(most));
            let local = l as u32 * self.blocks[r].per_lane + (g - bases[r]);
            let (offset, _) = self.chunk_bytes(r as u32, local);
            let (last_off, last_len) = self.chunk_bytes(r as u32, local + (stop - g) - 1);
            out.push(Piece {
                run: ChunkRun {
                    start: g,
                    len: stop - g,
                },
                root: r as u32,
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
        // Block 0 on lane 1: chunks 3..5 at lane index 0; block 2 on lane 0: chunks 0..2 at
        // lane index 3.
        let b = l.lane_block(0, 1);
        assert_eq!(
            (b.lo, b.count, b.base, b.chunks, b.last_len, b.displ),
            (3, 2, 0, 5, 5, 0)
        );
        let b = l.lane_block(2, 0);
        assert_eq!(
            (b.lo, b.count, b.base, b.chunks, b.last_len, b.displ),
            (0, 2, 3, 3, 10, 45)
        );
        assert_eq!(l.lane_block(1, 0).chunks, 0);
        assert_eq!(l.chunk_bytes(0, 4), (40, 5));
        let mut p = vec![];
        l.pieces(ChunkRun { start: 1, len: 6 }, &mut p);
        assert_eq!(
            p,
            vec![
                Piece {
                    run: ChunkRun { start: 1, len: 2 },
                    root: 0,
                    offset: 10,
                    len: 20
                },
                Piece {
                    run: ChunkRun { start: 3, len: 2 },
                    root: 2,
                    offset: 45,
                    len: 20
                },
                Piece {
                    run: ChunkRun { start: 5, len: 2 },
                    root: 0,
                    offset: 30,
                    len: 15
                },
            ]
        );
        assert_eq!(l.bytes(), 75);
    }
}
