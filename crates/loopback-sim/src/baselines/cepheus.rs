//! Sender-retransmit multicast with go-back-N and in-switch ACK/NACK aggregation (the Cepheus
//! design), as a model.
//!
//! * The root multicasts PSNs `0..n` down its multicast tree (the simulator's tree for the
//!   root, lane 0), at most `window` beyond the aggregated cumulative ACK.
//! * A receiver accepts only the next expected PSN (go-back-N receivers drop out-of-order
//!   packets), sends a cumulative ACK upstream every `ack_every` packets and at the end, and a
//!   NACK for its expected PSN when an out-of-order packet shows a gap (at most once per
//!   `nack_gap` for the same PSN).
//! * A switch keeps the latest ACK of each downstream port and forwards the minimum upstream
//!   when it grows. It forwards a NACK only for the minimum itself (the subtree's earliest
//!   missing PSN): a NACK for a later PSN from one port would hide an earlier loss on a port
//!   that is behind, so it is held until that port catches up (or dropped if the port's ACK
//!   passes it).
//! * The sender goes back to the NACKed PSN (once per `nack_gap` for the same PSN), or to the
//!   aggregated ACK when no ACK progress was seen for the retransmission timeout.
//!
//! ACKs and NACKs travel up the tree with the links' latency, are never lost and carry no
//! modelled bytes (they are counted as control messages).

use super::engine::{Flow, MULTICAST, Net, Pkt, Wake};
use crate::queue::Ps;

const ACK: u32 = 0;
const NACK: u32 = 1;
const TIMER: u32 = 2;
const NONE: u32 = u32::MAX;

/// Tunables of the go-back-N multicast.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct GoBackNParams {
    pub(crate) window: u32,
    pub(crate) ack_every: u32,
    pub(crate) nack_gap: Ps,
}

/// One go-back-N multicast broadcast.
#[derive(Debug)]
pub(crate) struct GoBackN {
    id: u16,
    root: u32,
    len: u64,
    chunk: u32,
    n: u32,
    p: GoBackNParams,
    // Sender.
    una: u32,
    nxt: u32,
    max_sent: u32,
    deadline: Ps,
    timer_armed: bool,
    last_goback: (u32, Ps),
    // Receivers, by host.
    expect: Vec<u32>,
    last_nack: Vec<(u32, Ps)>,
    // The tree, by node: parent node (NONE for the root) and the latency up to it.
    parent: Vec<u32>,
    up_latency: Vec<Ps>,
    children: Vec<Vec<u32>>,
    // Switch state: the latest ACK/NACK heard from each node by its parent; what each
    // switch last forwarded.
    child_ack: Vec<u32>,
    child_nack: Vec<u32>,
    sent_ack: Vec<u32>,
    sent_nack: Vec<(u32, Ps)>,
}

impl GoBackN {
    pub(crate) fn new(id: u16, root: u32, len: u64, chunk: u32, p: GoBackNParams) -> Self {
        let chunk = chunk.max(1);
        GoBackN {
            id,
            root,
            len,
            chunk,
            n: u32::try_from(len.div_ceil(u64::from(chunk))).unwrap_or(u32::MAX),
            p: GoBackNParams {
                window: p.window.max(1),
                ack_every: p.ack_every.max(1),
                ..p
            },
            una: 0,
            nxt: 0,
            max_sent: 0,
            deadline: 0,
            timer_armed: false,
            last_goback: (NONE, 0),
            expect: Vec::new(),
            last_nack: Vec::new(),
            parent: Vec::new(),
            up_latency: Vec::new(),
            children: Vec::new(),
            child_ack: Vec::new(),
            child_nack: Vec::new(),
            sent_ack: Vec::new(),
            sent_nack: Vec::new(),
        }
    }

    /// Sends an ACK or NACK from `node` to its parent.
    fn up(&mut self, net: &mut Net, node: u32, kind: u32, value: u32) {
        net.stats[usize::from(self.id)].control += 1;
        let w = Wake {
            flow: self.id,
            node,
            kind,
            value,
        };
        net.wake_at(net.now + self.up_latency[node as usize], w);
    }

    fn arm(&mut self, net: &mut Net) {
        if !self.timer_armed {
            self.timer_armed = true;
            let w = Wake {
                flow: self.id,
                node: self.root,
                kind: TIMER,
                value: 0,
            };
            net.wake_at(self.deadline, w);
        }
    }

    fn sender_ack(&mut self, net: &mut Net, a: u32) {
        if a > self.una {
            self.una = a;
            self.deadline = net.now + net.rto;
            net.kick(self.root);
        }
    }

    fn sender_nack(&mut self, net: &mut Net, e: u32) {
        self.sender_ack(net, e);
        let (last, at) = self.last_goback;
        if e < self.nxt && (last != e || net.now >= at + self.p.nack_gap) {
            self.nxt = e;
            self.last_goback = (e, net.now);
            net.kick(self.root);
        }
    }

    /// Switch `s` heard `kind`/`value` from `child`.
    fn switch(&mut self, net: &mut Net, s: u32, child: u32, kind: u32, value: u32) {
        let c = child as usize;
        self.child_ack[c] = self.child_ack[c].max(value);
        if kind == NACK {
            self.child_nack[c] = value;
        }
        let kids = &self.children[s as usize];
        let agg = kids
            .iter()
            .map(|&k| self.child_ack[k as usize])
            .min()
            .unwrap_or(0);
        let nack_here = kids
            .iter()
            .any(|&k| self.child_nack[k as usize] == agg && self.child_ack[k as usize] == agg);
        let (last, at) = self.sent_nack[s as usize];
        let advanced = agg > self.sent_ack[s as usize];
        self.sent_ack[s as usize] = self.sent_ack[s as usize].max(agg);
        if nack_here && (last != agg || net.now >= at + self.p.nack_gap) {
            self.sent_nack[s as usize] = (agg, net.now);
            self.up(net, s, NACK, agg);
        } else if advanced {
            self.up(net, s, ACK, agg);
        }
    }
}

impl Flow for GoBackN {
    fn start(&mut self, net: &mut Net) {
        let nodes = net.topo.nodes as usize;
        let hosts = net.topo.hosts;
        self.expect = vec![0; hosts as usize];
        self.last_nack = vec![(NONE, 0); hosts as usize];
        self.parent = vec![NONE; nodes];
        self.up_latency = vec![0; nodes];
        self.children = vec![Vec::new(); nodes];
        self.child_ack = vec![0; nodes];
        self.child_nack = vec![NONE; nodes];
        self.sent_ack = vec![0; nodes];
        self.sent_nack = vec![(NONE, 0); nodes];
        for s in net.tree(self.root).iter() {
            let e = net.topo.edges[s.link as usize];
            self.parent[e.to as usize] = e.from;
            self.up_latency[e.to as usize] = net.links[s.link as usize].latency;
            self.children[e.from as usize].push(e.to);
        }
        net.done(self.id, self.root);
        if self.n == 0 || hosts == 1 {
            for r in 0..hosts {
                net.done(self.id, r);
            }
            return;
        }
        self.deadline = net.now + net.rto;
        self.arm(net);
        net.kick(self.root);
    }

    fn next_packet(&mut self, net: &mut Net, host: u32) -> Option<Pkt> {
        if host != self.root || self.nxt >= self.n || self.nxt >= self.una + self.p.window {
            return None;
        }
        let psn = self.nxt;
        self.nxt += 1;
        if psn < self.max_sent {
            net.stats[usize::from(self.id)].retransmissions += 1;
        } else {
            self.max_sent = psn + 1;
        }
        let off = u64::from(psn) * u64::from(self.chunk);
        Some(Pkt {
            flow: self.id,
            src: self.root,
            dst: MULTICAST,
            block: 0,
            chunk: psn,
            len: self.len.saturating_sub(off).min(u64::from(self.chunk)) as u32,
        })
    }

    fn arrive(&mut self, net: &mut Net, pkt: Pkt) {
        let h = pkt.dst as usize;
        let e = self.expect[h];
        if pkt.chunk == e {
            self.expect[h] = e + 1;
            if e + 1 == self.n {
                net.done(self.id, pkt.dst);
                self.up(net, pkt.dst, ACK, e + 1);
            } else if (e + 1).is_multiple_of(self.p.ack_every) {
                self.up(net, pkt.dst, ACK, e + 1);
            }
        } else if pkt.chunk > e {
            let (last, at) = self.last_nack[h];
            if last != e || net.now >= at + self.p.nack_gap {
                self.last_nack[h] = (e, net.now);
                self.up(net, pkt.dst, NACK, e);
            }
        }
    }

    fn wake(&mut self, net: &mut Net, w: Wake) {
        if w.kind == TIMER {
            self.timer_armed = false;
            if self.una >= self.n {
                return;
            }
            if net.now >= self.deadline {
                net.stats[usize::from(self.id)].timeouts += 1;
                self.nxt = self.una;
                self.deadline = net.now + net.rto;
                net.kick(self.root);
            }
            self.arm(net);
            return;
        }
        let to = self.parent[w.node as usize];
        if to == self.root {
            if w.kind == NACK {
                self.sender_nack(net, w.value);
            } else {
                self.sender_ack(net, w.value);
            }
        } else if to != NONE {
            self.switch(net, to, w.node, w.kind, w.value);
        }
    }
}
