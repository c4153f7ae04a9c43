//! One lane's send half: the active roots' cursors over their blocks and the lane's send
//! window.

use super::{LaneBlock, TxCommand, TxNote, TxStart};
use crate::config::Config;
use crate::event::OpId;
use crate::wire::{Imm, ImmLayout};
use alloc::collections::VecDeque;
use alloc::vec::Vec;

/// A multicast to post: bytes `offset..offset + len` of the operation's buffer on `lane`,
/// carrying `imm`. Report completion with [`LaneTx::handle_send_done`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Multicast {
    /// Operation.
    pub op: OpId,
    /// Multicast subgroup.
    pub lane: u16,
    /// The 32-bit immediate to carry.
    pub imm: u32,
    /// Chunk index within this rank's block (also encoded in `imm`).
    pub chunk: u32,
    /// Byte offset into the buffer.
    pub offset: u64,
    /// Bytes.
    pub len: u32,
}

/// Counters of one lane's send half.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TxStats {
    /// Chunks handed out to multicast.
    pub chunks_sent: u64,
}

#[derive(Clone, Debug)]
struct TxOp {
    id: OpId,
    tag: u32,
    block: LaneBlock,
    /// Next position within the lane's part of the block.
    next: u32,
    /// Sends reported done.
    done: u32,
}

/// One lane's send half: which operations this rank multicasts on the lane, how far each
/// got, and how many sends the transport holds (the send window).
///
/// `Send`, no allocation per chunk, no lock, no atomic.
#[derive(Clone, Debug)]
pub struct LaneTx {
    imm: ImmLayout,
    chunk_size: u32,
    lane: u16,
    window: u32,
    in_flight: u32,
    ops: Vec<TxOp>,
    cursor: usize,
    notes: VecDeque<TxNote>,
    stats: TxStats,
}

impl LaneTx {
    /// The send half of lane `lane` of the rank `config` describes.
    pub fn new(config: &Config, lane: u16) -> Self {
        LaneTx {
            imm: config.imm,
            chunk_size: config.chunk_size,
            lane,
            window: config.send_window,
            in_flight: 0,
            ops: Vec::new(),
            cursor: 0,
            notes: VecDeque::new(),
            stats: TxStats::default(),
        }
    }

    /// This lane's index.
    pub fn lane(&self) -> u16 {
        self.lane
    }

    /// Counters.
    pub fn stats(&self) -> &TxStats {
        &self.stats
    }

    /// Whether multicasts wait only for the send window to open.
    pub fn blocked(&self) -> bool {
        self.in_flight >= self.window && self.ops.iter().any(|o| o.next < o.block.count)
    }

    /// Whether [`poll_multicast`](Self::poll_multicast) may have something (a cheap check).
    pub fn may_send(&self) -> bool {
        !self.ops.is_empty() && self.in_flight < self.window
    }

    /// A command from the session.
    pub fn handle_command(&mut self, cmd: TxCommand) {
        match cmd {
            TxCommand::Start(TxStart { op, tag, block }) => {
                if block.count == 0 {
                    self.notes.push_back(TxNote::SendsDone {
                        lane: self.lane,
                        op,
                    });
                    return;
                }
                self.ops.push(TxOp {
                    id: op,
                    tag,
                    block,
                    next: 0,
                    done: 0,
                });
            }
            TxCommand::Cancel { op } => {
                self.ops.retain(|o| o.id != op);
                self.cursor = 0;
            }
            TxCommand::Count { op } => {
                let done = self.ops.iter().find(|o| o.id == op).map_or(0, |o| o.done);
                self.notes.push_back(TxNote::Sent {
                    lane: self.lane,
                    op,
                    done,
                });
            }
        }
    }

    /// The next multicast to post, if the window allows; operations take turns.
    pub fn poll_multicast(&mut self) -> Option<Multicast> {
        if self.in_flight >= self.window {
            return None;
        }
        let n = self.ops.len();
        for k in 0..n {
            let i = (self.cursor + k) % n;
            let o = &mut self.ops[i];
            if o.next >= o.block.count {
                continue;
            }
            let chunk = o.block.lo + o.next;
            let Some(imm) = self.imm.encode(Imm {
                op_tag: o.tag,
                chunk,
            }) else {
                // The session checked the chunk count against the immediate at start.
                debug_assert!(false, "chunk {chunk} does not fit the immediate");
                o.next = o.block.count;
                continue;
            };
            o.next += 1;
            self.cursor = (i + 1) % n;
            self.in_flight += 1;
            self.stats.chunks_sent = self.stats.chunks_sent.saturating_add(1);
            let b = &o.block;
            let len = if o.next - 1 < b.full {
                self.chunk_size
            } else {
                b.last_len
            };
            return Some(Multicast {
                op: o.id,
                lane: self.lane,
                imm,
                chunk,
                offset: b.displ + u64::from(chunk) * u64::from(self.chunk_size),
                len,
            });
        }
        None
    }

    /// The transport finished `chunks` multicasts of `op` on this lane.
    pub fn handle_send_done(&mut self, op: OpId, chunks: u32) {
        self.in_flight = self.in_flight.saturating_sub(chunks);
        let Some(i) = self.ops.iter().position(|o| o.id == op) else {
            return;
        };
        let o = &mut self.ops[i];
        o.done = o.done.saturating_add(chunks).min(o.next);
        if o.done >= o.block.count {
            self.ops.remove(i);
            self.cursor = 0;
            self.notes.push_back(TxNote::SendsDone {
                lane: self.lane,
                op,
            });
        }
    }

    /// The next note for the session.
    pub fn poll_note(&mut self) -> Option<TxNote> {
        self.notes.pop_front()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sends_a_block_within_the_window_and_notes_when_done() {
        let mut c = Config::new(0, 2);
        c.chunk_size = 10;
        c.send_window = 2;
        let mut tx = LaneTx::new(&c, 1);
        tx.handle_command(TxCommand::Start(TxStart {
            op: OpId(3),
            tag: 3,
            block: LaneBlock {
                displ: 100,
                lo: 2,
                count: 3,
                base: 0,
                chunks: 5,
                last_len: 4,
                full: 2,
            },
        }));
        let a = tx.poll_multicast().unwrap();
        let b = tx.poll_multicast().unwrap();
        assert_eq!((a.chunk, a.offset, a.len, a.lane), (2, 120, 10, 1));
        assert_eq!((b.chunk, b.offset), (3, 130));
        assert_eq!(tx.poll_multicast(), None, "window of 2");
        assert!(tx.blocked());
        tx.handle_send_done(OpId(3), 2);
        let c3 = tx.poll_multicast().unwrap();
        assert_eq!((c3.chunk, c3.len), (4, 4));
        assert_eq!(
            ImmLayout::default().decode(c3.imm),
            Imm {
                op_tag: 3,
                chunk: 4
            }
        );
        assert_eq!(tx.poll_note(), None);
        tx.handle_send_done(OpId(3), 1);
        assert_eq!(
            tx.poll_note(),
            Some(TxNote::SendsDone {
                lane: 1,
                op: OpId(3)
            })
        );
        assert_eq!(tx.poll_multicast(), None);
        assert_eq!(tx.stats().chunks_sent, 3);
    }
}
