//! The fabric: links, multicast trees and routes, and the analytic packet walk.
//!
//! A multicast packet is not moved hop by hop through the event queue. When the root injects
//! it, the precomputed tree is walked at once: each link starts the packet when both the packet
//! and the transmitter are ready (`max(arrival, free_at)`), is busy for the serialization time,
//! and the next node has it one latency later (store and forward). Faults are applied on the
//! way, pruning lost subtrees. Only the arrivals at hosts become events.

use crate::event::{Delivery, Ev};
use crate::faults::{EdgeFaults, Faults, LinkFaults};
use crate::link::Link;
use crate::queue::{EventQueue, Ps};
use crate::report::FabricCounters;
use crate::rng::Rng;
use crate::topology::{LinkId, NodeId, Topology, TreeStep};

/// A multicast packet as the root hands it to the fabric.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Packet {
    pub(crate) imm: u32,
    pub(crate) token: u32,
    pub(crate) len: u32,
    pub(crate) lane: u16,
}

/// Links, routes and fault state.
#[derive(Debug)]
pub(crate) struct Fabric {
    pub(crate) topo: Topology,
    pub(crate) links: Vec<Link>,
    lanes: u16,
    /// Multicast trees per `(root, lane)`, built on first use.
    trees: Vec<Option<Vec<TreeStep>>>,
    /// Unicast BFS parents per source host, built on first use.
    routes: Vec<Option<Vec<LinkId>>>,
    link_faults: LinkFaults,
    edge_faults: EdgeFaults,
    /// Bits of chunk index in the immediate (for targeted corruption).
    chunk_bits: u8,
    rng: Rng,
    /// Arrival times per tree depth during a walk.
    depth_time: Vec<Ps>,
    path: Vec<LinkId>,
    /// Queueing delay a switch egress port absorbs before it pauses the senders upstream
    /// (the switch buffer in time); `Ps::MAX`: unbounded buffers.
    pub(crate) pause_after: Ps,
    /// Links down for a window: `(link, from, until)`.
    pub(crate) down: Vec<(LinkId, Ps, Ps)>,
    pub(crate) counters: FabricCounters,
}

impl Fabric {
    pub(crate) fn new(
        topo: Topology,
        bandwidth: u64,
        latency: Ps,
        lanes: u16,
        faults: &Faults,
        chunk_bits: u8,
        seed: u64,
    ) -> Self {
        let links = topo
            .edges
            .iter()
            .map(|_| Link::new(bandwidth, latency))
            .collect();
        let hosts = topo.hosts as usize;
        Fabric {
            links,
            lanes,
            trees: vec![None; hosts * usize::from(lanes)],
            routes: vec![None; hosts],
            link_faults: faults.link(),
            edge_faults: faults.edge(),
            chunk_bits,
            rng: Rng::new(seed, 0xFAB),
            depth_time: vec![0; topo.nodes as usize + 1],
            path: Vec::new(),
            pause_after: Ps::MAX,
            down: Vec::new(),
            counters: FabricCounters::default(),
            topo,
        }
    }

    fn tree(&mut self, root: u32, lane: u16) -> usize {
        let i = root as usize * usize::from(self.lanes) + usize::from(lane);
        if self.trees[i].is_none() {
            let key = u64::from(root) + u64::from(lane);
            self.trees[i] = Some(self.topo.multicast_tree(root, key));
        }
        i
    }

    /// Multicasts `pkt` from host `root` at `now`; schedules the deliveries and returns when
    /// the root's NIC may count the packet as sent: when it left, or later if a switch port
    /// on its tree queued it longer than its buffer holds (lossless-fabric backpressure, as
    /// PFC pauses the sender until the port drains).
    pub(crate) fn multicast(
        &mut self,
        root: u32,
        now: Ps,
        pkt: Packet,
        q: &mut EventQueue<Ev>,
    ) -> Ps {
        let ti = self.tree(root, pkt.lane);
        let Fabric {
            trees,
            links,
            link_faults,
            edge_faults,
            rng,
            depth_time,
            counters,
            chunk_bits,
            pause_after,
            down,
            ..
        } = self;
        let Some(steps) = trees[ti].as_deref() else {
            return now;
        };
        let bytes = u64::from(pkt.len);
        let lossy = !link_faults.loss.is_zero() || link_faults.bursty;
        let mut sent = now;
        let mut worst_wait = 0;
        depth_time[0] = now;
        let mut i = 0;
        while i < steps.len() {
            let s = steps[i];
            let link = &mut links[s.link as usize];
            let ready = depth_time[usize::from(s.depth)];
            let left = link.transmit(ready, bytes);
            if s.depth == 0 {
                sent = left;
            } else {
                worst_wait = worst_wait.max(left.saturating_sub(ready));
            }
            if !down.is_empty()
                && down
                    .iter()
                    .any(|&(l, a, b)| l == s.link && (a..b).contains(&ready))
            {
                counters.lost += 1;
                i = s.skip as usize;
                continue;
            }
            if lossy && let Some(burst) = link.lose(link_faults, rng) {
                if burst {
                    counters.burst_lost += 1;
                } else {
                    counters.lost += 1;
                }
                i = s.skip as usize;
                continue;
            }
            let arrive = left + link.latency;
            if s.host == u32::MAX {
                depth_time[usize::from(s.depth) + 1] = arrive;
            } else {
                let d = Delivery {
                    dst: s.host,
                    src: root,
                    imm: pkt.imm,
                    token: pkt.token,
                    len: pkt.len,
                    lane: pkt.lane,
                    corrupt: false,
                    copy_fails: false,
                };
                if edge_faults.any {
                    let extra = link.serialize(bytes);
                    last_hop(d, arrive, extra, edge_faults, *chunk_bits, rng, counters, q);
                } else {
                    q.push(arrive, Ev::Chunk(d));
                }
            }
            i += 1;
        }
        if worst_wait > *pause_after {
            counters.paused_ps += worst_wait - *pause_after;
            sent += worst_wait - *pause_after;
        }
        sent
    }

    fn route(&mut self, from: NodeId, to: NodeId) -> &[LinkId] {
        let r = &mut self.routes[from as usize];
        if r.is_none() {
            *r = Some(self.topo.bfs(from, u64::from(from)).0);
        }
        if let Some(parent) = r.as_deref() {
            self.topo.path(parent, to, &mut self.path);
        }
        &self.path
    }

    /// One-way latency of a control message from host `from` to host `to` (links only).
    pub(crate) fn path_latency(&mut self, from: NodeId, to: NodeId) -> Ps {
        let path = self.route(from, to).to_vec();
        path.iter().map(|l| self.links[*l as usize].latency).sum()
    }

    /// Moves `bytes` reliably from `from` to `to`, ready at `ready`, cut-through: each link
    /// starts when the head arrives and the transmitter is free. Returns when the tail arrives.
    pub(crate) fn transfer(&mut self, from: NodeId, to: NodeId, bytes: u64, ready: Ps) -> Ps {
        let path = self.route(from, to).to_vec();
        let mut head = ready;
        let mut done = ready;
        for l in path {
            let link = &mut self.links[l as usize];
            let left = link.transmit(head, bytes);
            let start = left - link.serialize(bytes);
            head = start + link.latency;
            done = left + link.latency;
        }
        done
    }
}

/// Applies last-hop faults to a delivery and schedules what is left of it.
#[allow(clippy::too_many_arguments)]
#[inline(never)]
fn last_hop(
    mut d: Delivery,
    mut at: Ps,
    ser: Ps,
    f: &EdgeFaults,
    chunk_bits: u8,
    rng: &mut Rng,
    c: &mut FabricCounters,
    q: &mut EventQueue<Ev>,
) {
    if rng.chance(f.corrupt_payload) {
        d.corrupt = true;
        c.corrupted_payload += 1;
    }
    if rng.chance(f.corrupt_imm) {
        // Any of the 32 bits; the checksum covers the immediate, so which one is moot.
        d.imm ^= 1 << rng.below(32);
        d.corrupt = true;
        c.corrupted_imm += 1;
    }
    if rng.chance(f.corrupt_escaping) {
        // Opt-in: an op-tag bit flip that the checksum missed reaches the core.
        let n = 32 - u32::from(chunk_bits);
        d.imm ^= 1 << (u32::from(chunk_bits) + rng.below(u64::from(n.max(1))) as u32);
        c.escaped_checksum += 1;
    }
    if rng.chance(f.copy_fail) {
        d.copy_fails = true;
        c.copy_failed += 1;
    }
    if rng.chance(f.reorder) {
        at += rng.below(f.reorder_max_ps);
        c.reordered += 1;
    }
    q.push(at, Ev::Chunk(d));
    if rng.chance(f.duplicate) {
        c.duplicated += 1;
        q.push(at + ser, Ev::Chunk(d));
    }
}
