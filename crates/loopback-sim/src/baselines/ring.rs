//! Ring pipelines: the ring Allgather and the ring Reduce-Scatter.
//!
//! Both are P - 1 steps in which every rank sends a block to its right neighbour; here they
//! are pipelined by chunks: a rank forwards chunk `c` of a block as soon as it has received
//! it, so all steps overlap. A block is named by the rank that starts it (its *origin*) and
//! travels P - 1 hops to the origin's left neighbour.
//!
//! * Allgather: rank `r` starts with its own block (`len` bytes) and forwards every block
//!   except the one its right neighbour originated.
//! * Reduce-Scatter of `len` bytes per rank: blocks of `len / P`; rank `r` starts the partial
//!   sum of block `r - 1`, adds its contribution to each block it receives and forwards it,
//!   and ends holding the full sum of its block `r`. The reduction itself is free here, so
//!   its traffic is that of an Allgather with blocks of `len / P`.
//!
//! A rank finishes when it has received all (P - 1) blocks.

use super::engine::{Flow, Net, Pkt};
use std::collections::VecDeque;

/// A ring pipeline of P blocks of `block` bytes.
#[derive(Debug)]
pub(crate) struct Ring {
    id: u16,
    ranks: u32,
    chunk: u32,
    block: u64,
    chunks: u32,
    /// Per rank: (origin, chunk) to send to the right neighbour.
    queue: Vec<VecDeque<(u32, u32)>>,
    received: Vec<u32>,
}

impl Ring {
    /// A ring over `ranks` ranks moving blocks of `block` bytes in `chunk`-byte packets.
    pub(crate) fn new(id: u16, ranks: u32, block: u64, chunk: u32) -> Self {
        let chunks = u32::try_from(block.div_ceil(u64::from(chunk.max(1)))).unwrap_or(u32::MAX);
        Ring {
            id,
            ranks,
            chunk: chunk.max(1),
            block,
            chunks,
            queue: vec![VecDeque::new(); ranks as usize],
            received: vec![0; ranks as usize],
        }
    }

    fn len(&self, c: u32) -> u32 {
        let off = u64::from(c) * u64::from(self.chunk);
        self.block.saturating_sub(off).min(u64::from(self.chunk)) as u32
    }

    fn expected(&self) -> u32 {
        (self.ranks - 1).saturating_mul(self.chunks)
    }
}

impl Flow for Ring {
    fn start(&mut self, net: &mut Net) {
        for r in 0..self.ranks {
            if self.ranks == 1 || self.chunks == 0 {
                net.done(self.id, r);
                continue;
            }
            self.queue[r as usize].extend((0..self.chunks).map(|c| (r, c)));
            net.kick(r);
        }
    }

    fn next_packet(&mut self, _net: &mut Net, host: u32) -> Option<Pkt> {
        let (origin, c) = self.queue.get_mut(host as usize)?.pop_front()?;
        Some(Pkt {
            flow: self.id,
            src: host,
            dst: (host + 1) % self.ranks,
            block: origin,
            chunk: c,
            len: self.len(c),
        })
    }

    fn arrive(&mut self, net: &mut Net, p: Pkt) {
        let r = p.dst;
        self.received[r as usize] += 1;
        if (r + 1) % self.ranks != p.block {
            self.queue[r as usize].push_back((p.block, p.chunk));
            net.kick(r);
        }
        if self.received[r as usize] == self.expected() {
            net.done(self.id, r);
        }
    }
}
