//! One lane's receive fast path: decode the immediate, find the operation by tag, check the
//! chunk against it, test-and-set its bit, say where the payload goes.

use super::{LaneBitmap, LaneBlock, RxCommand, RxNote, RxOpen};
use crate::bitmap::ChunkBitmap;
use crate::config::{Config, Rank};
use crate::event::{DropReason, OpId, Placement};
use alloc::boxed::Box;
use alloc::collections::VecDeque;
use alloc::vec::Vec;

/// Counters of one lane's receive half. All saturate, none panic.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RxStats {
    /// Chunks placed and committed.
    pub chunks_received: u64,
    /// Dropped: already present.
    pub dropped_duplicate: u64,
    /// Dropped: no such operation open on this lane.
    pub dropped_stale: u64,
    /// Dropped: index out of range.
    pub dropped_out_of_range: u64,
    /// Dropped: wrong source.
    pub dropped_wrong_source: u64,
    /// Dropped: wrong lane.
    pub dropped_wrong_lane: u64,
    /// Dropped: own loopback.
    pub dropped_own: u64,
    /// Dropped: payload length mismatch.
    pub dropped_bad_length: u64,
}

impl RxStats {
    #[cold]
    fn count_drop(&mut self, r: DropReason) {
        let c = match r {
            DropReason::Duplicate => &mut self.dropped_duplicate,
            DropReason::Stale => &mut self.dropped_stale,
            DropReason::OutOfRange => &mut self.dropped_out_of_range,
            DropReason::WrongSource => &mut self.dropped_wrong_source,
            DropReason::WrongLane => &mut self.dropped_wrong_lane,
            DropReason::Own => &mut self.dropped_own,
            DropReason::BadLength => &mut self.dropped_bad_length,
        };
        *c = c.saturating_add(1);
    }

    /// The count for one drop reason.
    pub fn dropped(&self, r: DropReason) -> u64 {
        match r {
            DropReason::Duplicate => self.dropped_duplicate,
            DropReason::Stale => self.dropped_stale,
            DropReason::OutOfRange => self.dropped_out_of_range,
            DropReason::WrongSource => self.dropped_wrong_source,
            DropReason::WrongLane => self.dropped_wrong_lane,
            DropReason::Own => self.dropped_own,
            DropReason::BadLength => self.dropped_bad_length,
        }
    }
}

/// One operation open on a lane.
#[derive(Clone, Debug)]
struct RxOp {
    tag: u32,
    /// Chunks tracked on this lane.
    len: u32,
    /// Chunks present and written (our own count from the start).
    committed: u32,
    /// Our own chunks on this lane (present from the start, never received).
    own: u32,
    id: OpId,
    /// Per rank, indexed by the source the transport reports. Our own block's `count` is
    /// zero, so its chunks leave the fast path at the lane check and are told apart there.
    blocks: Box<[LaneBlock]>,
    /// The bitmap as plain words: bit `i` is bit `i % 64` of word `i / 64`.
    words: Box<[u64]>,
}

/// One lane's receive half: for every operation in flight, the lane's bitmap and placement
/// arithmetic, and the lane's own counters.
///
/// It is `Send`, allocates nothing per chunk, and uses no lock and no atomic: one worker owns
/// it. [`handle_chunk`](Self::handle_chunk) is the whole fast path.
///
/// ```
/// use ringcast_core::lane::LaneRx;
/// use ringcast_core::{Config, DropReason, Placement, Rank};
/// let mut rx = LaneRx::new(&Config::new(1, 2), 0);
/// // No operation is open: the chunk is stale.
/// assert_eq!(rx.handle_chunk(Rank(0), 0, 4096), Placement::Drop(DropReason::Stale));
/// ```
#[derive(Clone, Debug)]
pub struct LaneRx {
    /// The immediate's split, precomputed: tag = imm >> shift, chunk = imm & mask.
    shift: u32,
    mask: u32,
    chunk_size: u32,
    me: Rank,
    lane: u16,
    /// The operation placed last: tried first (chunks come in long runs of one operation).
    last: usize,
    ops: Vec<RxOp>,
    notes: VecDeque<RxNote>,
    stats: RxStats,
}

impl LaneRx {
    /// The receive half of lane `lane` of the rank `config` describes.
    pub fn new(config: &Config, lane: u16) -> Self {
        let shift = u32::from(config.imm.chunk_bits());
        LaneRx {
            shift,
            mask: ((1u64 << shift) - 1) as u32,
            chunk_size: config.chunk_size,
            me: config.rank,
            lane,
            last: 0,
            ops: Vec::with_capacity(config.limits.max_inflight_ops as usize),
            notes: VecDeque::new(),
            stats: RxStats::default(),
        }
    }

    /// This lane's index.
    pub fn lane(&self) -> u16 {
        self.lane
    }

    /// Counters. Chunks received are counted per operation at commit and summed here, so the
    /// fast path updates one counter, not two.
    pub fn stats(&self) -> RxStats {
        let live: u64 = self
            .ops
            .iter()
            .map(|o| u64::from(o.committed - o.own))
            .sum();
        RxStats {
            chunks_received: self.stats.chunks_received.saturating_add(live),
            ..self.stats
        }
    }

    /// Operations open on this lane.
    pub fn open_ops(&self) -> usize {
        self.ops.len()
    }

    /// A chunk arrived from `from` (as the transport reports the source) with immediate `imm`
    /// and `len` payload bytes. Claims it and returns where the payload goes; on
    /// [`Placement::Drop`] the payload must be discarded (the drop is counted).
    ///
    /// After copying a placed payload, call [`commit`](Self::commit). The transport must have
    /// checked the packet's integrity first (ICRC or UDP checksum): that check is what covers
    /// the immediate.
    // Always inlined: the caller's loop then keeps the placement in registers instead of
    // passing a 24-byte enum through memory (a store-forwarding stall on every chunk).
    #[inline(always)]
    pub fn handle_chunk(&mut self, from: Rank, imm: u32, len: usize) -> Placement {
        let (tag, c) = (imm >> self.shift, imm & self.mask);
        let i = match self.ops.get(self.last) {
            Some(o) if o.tag == tag => self.last,
            _ => match self.ops.iter().position(|o| o.tag == tag) {
                Some(i) => {
                    self.last = i;
                    i
                }
                None => return self.dropped(DropReason::Stale),
            },
        };
        let cs = self.chunk_size;
        let op = &mut self.ops[i];
        let Some(b) = op.blocks.get(from.index()) else {
            return self.dropped(DropReason::WrongSource);
        };
        let k = c.wrapping_sub(b.lo);
        if k >= b.count {
            // Off this lane's part of the block: say exactly why.
            let why = if from == self.me {
                DropReason::Own
            } else if b.chunks == 0 {
                DropReason::WrongSource
            } else if c >= b.chunks {
                DropReason::OutOfRange
            } else {
                DropReason::WrongLane
            };
            return self.dropped(why);
        }
        let want = if k < b.full { cs } else { b.last_len };
        if len != want as usize {
            return self.dropped(DropReason::BadLength);
        }
        let offset = b.displ + u64::from(c) * u64::from(cs);
        let bit = b.base + k;
        let m = 1u64 << (bit % 64);
        // `bit < len` by construction of the blocks; `get_mut` keeps a corrupt open harmless.
        let Some(w) = op.words.get_mut((bit / 64) as usize) else {
            return self.dropped(DropReason::OutOfRange);
        };
        if *w & m != 0 {
            return self.dropped(DropReason::Duplicate);
        }
        *w |= m;
        Placement::Place {
            op: op.id,
            offset,
            len: want,
        }
    }

    #[cold]
    #[inline(never)]
    fn dropped(&mut self, r: DropReason) -> Placement {
        self.stats.count_drop(r);
        Placement::Drop(r)
    }

    /// The payload of a chunk that [`handle_chunk`](Self::handle_chunk) placed for `op` is
    /// written. When the lane's part of the operation is complete, queues [`RxNote::Full`].
    #[inline]
    pub fn commit(&mut self, op: OpId) {
        let i = match self.ops.get(self.last) {
            Some(o) if o.id == op => self.last,
            _ => match self.ops.iter().position(|o| o.id == op) {
                Some(i) => i,
                None => return,
            },
        };
        let o = &mut self.ops[i];
        o.committed += 1;
        if o.committed == o.len {
            self.notes.push_back(RxNote::Full {
                lane: self.lane,
                op,
            });
        }
    }

    /// A command from the session.
    pub fn handle_command(&mut self, cmd: RxCommand) {
        match cmd {
            RxCommand::Open(o) => self.open(o),
            RxCommand::Count { op } => {
                let committed = self
                    .ops
                    .iter()
                    .find(|o| o.id == op)
                    .map_or(0, |o| o.committed);
                self.notes.push_back(RxNote::Count {
                    lane: self.lane,
                    op,
                    committed,
                });
            }
            RxCommand::Close { op } => {
                let Some(i) = self.ops.iter().position(|o| o.id == op) else {
                    return;
                };
                let o = self.ops.remove(i);
                self.last = 0;
                let got = u64::from(o.committed - o.own);
                self.stats.chunks_received = self.stats.chunks_received.saturating_add(got);
                self.notes.push_back(RxNote::Closed {
                    lane: self.lane,
                    op,
                    bitmap: LaneBitmap(ChunkBitmap::from_words(o.words.into_vec(), o.len)),
                });
            }
        }
    }

    fn open(&mut self, o: RxOpen) {
        let mut bits = ChunkBitmap::new(o.len);
        let own = bits.insert_run(o.own);
        let full = own == o.len;
        let mut blocks = o.blocks.into_boxed_slice();
        if let Some(b) = blocks.get_mut(self.me.index()) {
            b.count = 0;
        }
        // A tag must name one operation; the session never reuses a tag in flight.
        self.ops.retain(|x| x.tag != o.tag);
        self.last = 0;
        self.ops.push(RxOp {
            tag: o.tag,
            len: o.len,
            committed: own,
            own,
            id: o.op,
            blocks,
            words: bits.into_words().into_boxed_slice(),
        });
        if full {
            self.notes.push_back(RxNote::Full {
                lane: self.lane,
                op: o.op,
            });
        }
    }

    /// Whether a note is waiting.
    pub fn has_notes(&self) -> bool {
        !self.notes.is_empty()
    }

    /// The next note for the session.
    pub fn poll_note(&mut self) -> Option<RxNote> {
        self.notes.pop_front()
    }
}

/// Bytes of one open operation's state (for the size snapshot).
#[cfg(test)]
pub(super) fn op_size() -> usize {
    core::mem::size_of::<RxOp>()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::ImmLayout;
    use crate::wire::{ChunkRun, Imm};
    use alloc::vec;

    /// Three ranks; block of rank 0: 3 chunks of 10 bytes, the last 5 long, on lane 0 of 2
    /// (chunks 0..2 on lane 0, chunk 2 on lane 1); rank 2's block is empty; we are rank 1.
    fn lane0() -> LaneRx {
        let mut c = Config::new(1, 3);
        c.chunk_size = 10;
        let mut rx = LaneRx::new(&c, 0);
        let blocks = vec![
            LaneBlock {
                displ: 0,
                lo: 0,
                count: 2,
                base: 0,
                chunks: 3,
                last_len: 5,
                full: 2,
            },
            LaneBlock {
                displ: 25,
                lo: 0,
                count: 1,
                base: 2,
                chunks: 1,
                last_len: 10,
                full: 0,
            },
            LaneBlock::default(),
        ];
        rx.handle_command(RxCommand::Open(RxOpen {
            op: OpId(7),
            tag: 7,
            blocks,
            len: 3,
            own: ChunkRun { start: 2, len: 1 },
        }));
        rx
    }

    fn imm(chunk: u32) -> u32 {
        ImmLayout::default()
            .encode(Imm { op_tag: 7, chunk })
            .unwrap()
    }

    #[test]
    fn every_drop_reason_is_returned_and_counted() {
        let mut rx = lane0();
        let cases = [
            (
                Rank(0),
                ImmLayout::default()
                    .encode(Imm {
                        op_tag: 8,
                        chunk: 0,
                    })
                    .unwrap(),
                10,
                DropReason::Stale,
            ),
            (Rank(1), imm(0), 10, DropReason::Own),
            (Rank(2), imm(0), 10, DropReason::WrongSource),
            (Rank(3), imm(0), 10, DropReason::WrongSource),
            (Rank(0), imm(3), 5, DropReason::OutOfRange),
            (Rank(0), imm(2), 5, DropReason::WrongLane),
            (Rank(0), imm(1), 9, DropReason::BadLength),
        ];
        for (from, raw, len, why) in cases {
            assert_eq!(
                rx.handle_chunk(from, raw, len),
                Placement::Drop(why),
                "{why:?}"
            );
        }
        let p = rx.handle_chunk(Rank(0), imm(1), 10);
        assert_eq!(
            p,
            Placement::Place {
                op: OpId(7),
                offset: 10,
                len: 10
            }
        );
        assert_eq!(
            rx.handle_chunk(Rank(0), imm(1), 10),
            Placement::Drop(DropReason::Duplicate)
        );
        let s = rx.stats();
        for r in [
            DropReason::Own,
            DropReason::OutOfRange,
            DropReason::WrongLane,
            DropReason::BadLength,
            DropReason::Duplicate,
            DropReason::Stale,
        ] {
            assert_eq!(s.dropped(r), 1, "{r:?}");
        }
        assert_eq!(s.dropped_wrong_source, 2);
        // Claimed, not committed: not yet counted as received.
        assert_eq!(s.chunks_received, 0);
    }

    #[test]
    fn full_is_noted_at_commit_and_close_hands_the_bitmap_back() {
        let mut rx = lane0();
        assert_eq!(rx.poll_note(), None);
        assert!(matches!(
            rx.handle_chunk(Rank(0), imm(0), 10),
            Placement::Place { offset: 0, .. }
        ));
        rx.commit(OpId(7));
        assert!(matches!(
            rx.handle_chunk(Rank(0), imm(1), 10),
            Placement::Place { offset: 10, .. }
        ));
        assert_eq!(rx.poll_note(), None, "claimed but not written: no note yet");
        rx.commit(OpId(7));
        assert_eq!(
            rx.poll_note(),
            Some(RxNote::Full {
                lane: 0,
                op: OpId(7)
            })
        );
        rx.handle_command(RxCommand::Close { op: OpId(7) });
        match rx.poll_note() {
            Some(RxNote::Closed {
                lane: 0,
                op: OpId(7),
                bitmap,
            }) => {
                assert_eq!((bitmap.present(), bitmap.len()), (3, 3));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(rx.open_ops(), 0);
        assert_eq!(
            rx.handle_chunk(Rank(0), imm(0), 10),
            Placement::Drop(DropReason::Stale)
        );
    }

    #[test]
    fn last_chunk_of_a_block_has_its_own_length() {
        let mut c = Config::new(1, 2);
        c.chunk_size = 10;
        let mut rx = LaneRx::new(&c, 1);
        rx.handle_command(RxCommand::Open(RxOpen {
            op: OpId(7),
            tag: 7,
            blocks: vec![
                LaneBlock {
                    displ: 0,
                    lo: 2,
                    count: 1,
                    base: 0,
                    chunks: 3,
                    last_len: 5,
                    full: 0,
                },
                LaneBlock::default(),
            ],
            len: 1,
            own: ChunkRun { start: 0, len: 0 },
        }));
        assert_eq!(
            rx.handle_chunk(Rank(0), imm(2), 10),
            Placement::Drop(DropReason::BadLength)
        );
        assert_eq!(
            rx.handle_chunk(Rank(0), imm(1), 10),
            Placement::Drop(DropReason::WrongLane)
        );
        assert_eq!(
            rx.handle_chunk(Rank(0), imm(2), 5),
            Placement::Place {
                op: OpId(7),
                offset: 20,
                len: 5
            }
        );
    }
}
