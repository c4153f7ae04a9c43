//! Broadcast down a unicast tree (binomial, k-nomial, chain), store-and-forward or pipelined.
//!
//! * **Store-and-forward**: a rank starts sending once it holds the whole message, to its
//!   children one after another (largest subtree first), each child getting the whole message
//!   before the next one starts: the textbook round structure (a binomial tree takes
//!   ceil(log2 P) rounds).
//! * **Pipelined**: a rank forwards chunk `c` to all of its children (in the same order) as
//!   soon as it has it, so a chain streams at line rate once the pipeline is full.

use super::engine::{Flow, Net, Pkt};
use serde::Serialize;
use std::collections::VecDeque;

/// When a tree rank forwards what it received.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Forwarding {
    /// After receiving the whole message.
    StoreAndForward,
    /// Chunk by chunk, as soon as each arrives.
    Pipelined,
}

/// Broadcast of `len` bytes from `root` down `children` (absolute ranks, send order).
#[derive(Debug)]
pub(crate) struct TreeBroadcast {
    id: u16,
    root: u32,
    len: u64,
    chunk: u32,
    chunks: u32,
    children: Vec<Vec<u32>>,
    mode: Forwarding,
    /// Per rank: (child, chunk) still to send.
    queue: Vec<VecDeque<(u32, u32)>>,
    have: Vec<u32>,
}

impl TreeBroadcast {
    pub(crate) fn new(
        id: u16,
        root: u32,
        len: u64,
        chunk: u32,
        children: Vec<Vec<u32>>,
        mode: Forwarding,
    ) -> Self {
        let chunk = chunk.max(1);
        let chunks = u32::try_from(len.div_ceil(u64::from(chunk))).unwrap_or(u32::MAX);
        let n = children.len();
        TreeBroadcast {
            id,
            root,
            len,
            chunk,
            chunks,
            children,
            mode,
            queue: vec![VecDeque::new(); n],
            have: vec![0; n],
        }
    }

    /// Queues what rank `r` sends once it holds chunk `c` (or, store-and-forward, everything).
    fn forward(&mut self, net: &mut Net, r: u32, c: u32) {
        let kids = &self.children[r as usize];
        if kids.is_empty() {
            return;
        }
        let q = &mut self.queue[r as usize];
        match self.mode {
            Forwarding::Pipelined => q.extend(kids.iter().map(|&k| (k, c))),
            Forwarding::StoreAndForward => {
                for &k in kids {
                    q.extend((0..self.chunks).map(|c| (k, c)));
                }
            }
        }
        net.kick(r);
    }
}

impl Flow for TreeBroadcast {
    fn start(&mut self, net: &mut Net) {
        net.done(self.id, self.root);
        self.have[self.root as usize] = self.chunks;
        if self.chunks == 0 {
            for r in 0..self.children.len() as u32 {
                net.done(self.id, r);
            }
            return;
        }
        match self.mode {
            Forwarding::Pipelined => {
                for c in 0..self.chunks {
                    self.forward(net, self.root, c);
                }
            }
            Forwarding::StoreAndForward => self.forward(net, self.root, 0),
        }
    }

    fn next_packet(&mut self, _net: &mut Net, host: u32) -> Option<Pkt> {
        let (dst, c) = self.queue.get_mut(host as usize)?.pop_front()?;
        let off = u64::from(c) * u64::from(self.chunk);
        Some(Pkt {
            flow: self.id,
            src: host,
            dst,
            block: 0,
            chunk: c,
            len: self.len.saturating_sub(off).min(u64::from(self.chunk)) as u32,
        })
    }

    fn arrive(&mut self, net: &mut Net, p: Pkt) {
        let r = p.dst;
        self.have[r as usize] += 1;
        let complete = self.have[r as usize] == self.chunks;
        match self.mode {
            Forwarding::Pipelined => self.forward(net, r, p.chunk),
            Forwarding::StoreAndForward if complete => self.forward(net, r, 0),
            Forwarding::StoreAndForward => {}
        }
        if complete {
            net.done(self.id, r);
        }
    }
}
