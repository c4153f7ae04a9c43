//! The baselines' event-driven engine: host NICs, unicast paths, multicast trees, loss and
//! timeout retransmission, over the simulator's own topology, links and event queue.
//!
//! Packets move like the simulator's multicast chunks: when a NIC starts a packet, its whole
//! path (or tree) is walked at once, store-and-forward per hop, each link starting the packet
//! at `max(arrival, free_at)`; only arrivals at hosts become events. A host's NIC starts the
//! next packet when the previous one has left it, taking first a retransmission, then the
//! flows in round robin. A unicast packet lost on a link is retransmitted by its sender one
//! retransmission timeout after it was sent (an oracle for the missing ACK: ACKs and control
//! messages carry no modelled bytes and are never lost).

use super::report::FlowStats;
use crate::faults::{Faults, LinkFaults};
use crate::link::Link;
use crate::queue::{EventQueue, Ps};
use crate::rng::Rng;
use crate::topology::{LinkId, Topology, TreeStep};
use std::collections::VecDeque;
use std::rc::Rc;

/// `Pkt::dst` of a multicast packet: it goes down the source's multicast tree.
pub(crate) const MULTICAST: u32 = u32::MAX;

/// A data packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Pkt {
    /// The flow it belongs to.
    pub(crate) flow: u16,
    /// The host whose NIC sends it.
    pub(crate) src: u32,
    /// The receiving host, or [`MULTICAST`].
    pub(crate) dst: u32,
    /// Flow-specific: the block (ring) or 0.
    pub(crate) block: u32,
    /// Chunk index (or PSN).
    pub(crate) chunk: u32,
    /// Payload bytes.
    pub(crate) len: u32,
}

/// A flow's own timer or control message, delivered back to it at a virtual time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Wake {
    pub(crate) flow: u16,
    /// Flow-specific meaning (a node, a kind, values).
    pub(crate) node: u32,
    pub(crate) kind: u32,
    pub(crate) value: u32,
}

#[derive(Clone, Copy, Debug)]
enum Ev {
    Start(u16),
    NicReady(u32),
    Arrive(Pkt),
    Retransmit(Pkt),
    Wake(Wake),
}

/// A baseline algorithm as a state machine over [`Net`].
pub(crate) trait Flow {
    /// The flow starts (every rank at once).
    fn start(&mut self, net: &mut Net);
    /// The next packet `host`'s NIC should send for this flow, if any.
    fn next_packet(&mut self, net: &mut Net, host: u32) -> Option<Pkt>;
    /// `pkt` arrived at `pkt.dst` at `net.now`.
    fn arrive(&mut self, net: &mut Net, pkt: Pkt);
    /// A [`Wake`] this flow scheduled.
    fn wake(&mut self, net: &mut Net, w: Wake) {
        let _ = (net, w);
    }
}

/// Fabric state shared by the flows.
#[derive(Debug)]
pub(crate) struct Net {
    pub(crate) topo: Topology,
    pub(crate) links: Vec<Link>,
    faults: LinkFaults,
    rng: Rng,
    q: EventQueue<Ev>,
    /// An event popped to peek at its time, handled next.
    peeked: Option<(Ps, Ev)>,
    /// Virtual time of the event being handled.
    pub(crate) now: Ps,
    /// Retransmission timeout of unicast packets.
    pub(crate) rto: Ps,
    nic_busy: Vec<bool>,
    retx: Vec<VecDeque<Pkt>>,
    rr: Vec<u16>,
    kicks: Vec<u32>,
    routes: Vec<Option<Vec<LinkId>>>,
    trees: Vec<Option<Rc<[TreeStep]>>>,
    path: Vec<LinkId>,
    depth_time: Vec<Ps>,
    /// Counters per flow.
    pub(crate) stats: Vec<FlowStats>,
}

impl Net {
    /// Asks `host`'s NIC to look for a packet to send once the current event is handled.
    pub(crate) fn kick(&mut self, host: u32) {
        self.kicks.push(host);
    }

    /// Schedules `w` at time `at`.
    pub(crate) fn wake_at(&mut self, at: Ps, w: Wake) {
        self.q.push(at, Ev::Wake(w));
    }

    /// Records that `rank` finished flow `flow` now.
    pub(crate) fn done(&mut self, flow: u16, rank: u32) {
        let now = self.now;
        if let Some(d) = self.stats[usize::from(flow)].done.get_mut(rank as usize) {
            d.get_or_insert(now);
        }
    }

    /// The multicast tree of host `root` (the simulator's tree for lane 0: key `root`).
    pub(crate) fn tree(&mut self, root: u32) -> Rc<[TreeStep]> {
        let t = &mut self.trees[root as usize];
        t.get_or_insert_with(|| self.topo.multicast_tree(root, u64::from(root)).into())
            .clone()
    }

    fn count(&mut self, flow: u16, link: LinkId, len: u32) {
        let e = self.topo.edges[link as usize];
        let s = &mut self.stats[usize::from(flow)];
        s.level_bytes[usize::from(e.level)] += u64::from(len);
        s.link_packets += 1;
    }

    fn lost(&mut self, link: LinkId) -> bool {
        (!self.faults.loss.is_zero() || self.faults.bursty)
            && self.links[link as usize]
                .lose(&self.faults, &mut self.rng)
                .is_some()
    }

    /// Sends unicast `p` now; returns when it has left the sender's NIC.
    fn unicast(&mut self, p: Pkt) -> Ps {
        if self.routes[p.src as usize].is_none() {
            self.routes[p.src as usize] = Some(self.topo.bfs(p.src, u64::from(p.src)).0);
        }
        let mut path = std::mem::take(&mut self.path);
        if let Some(parent) = self.routes[p.src as usize].as_deref() {
            self.topo.path(parent, p.dst, &mut path);
        }
        let (mut t, mut sent) = (self.now, self.now);
        let mut arrived = true;
        for (i, &l) in path.iter().enumerate() {
            let left = self.links[l as usize].transmit(t, u64::from(p.len));
            self.count(p.flow, l, p.len);
            if i == 0 {
                sent = left;
            }
            if self.lost(l) {
                let s = &mut self.stats[usize::from(p.flow)];
                s.lost += 1;
                self.q.push(self.now + self.rto, Ev::Retransmit(p));
                arrived = false;
                break;
            }
            t = left + self.links[l as usize].latency;
        }
        self.path = path;
        if arrived {
            self.q.push(t, Ev::Arrive(p));
        }
        sent
    }

    /// Multicasts `p` down `p.src`'s tree now; returns when it has left the root's NIC.
    fn multicast(&mut self, p: Pkt) -> Ps {
        let steps = self.tree(p.src);
        let mut sent = self.now;
        self.depth_time[0] = self.now;
        let mut i = 0;
        while i < steps.len() {
            let s = steps[i];
            let at = self.depth_time[usize::from(s.depth)];
            let left = self.links[s.link as usize].transmit(at, u64::from(p.len));
            self.count(p.flow, s.link, p.len);
            if s.depth == 0 {
                sent = left;
            }
            if self.lost(s.link) {
                self.stats[usize::from(p.flow)].lost += 1;
                i = s.skip as usize;
                continue;
            }
            let arrive = left + self.links[s.link as usize].latency;
            if s.host == u32::MAX {
                self.depth_time[usize::from(s.depth) + 1] = arrive;
            } else {
                self.q.push(arrive, Ev::Arrive(Pkt { dst: s.host, ..p }));
            }
            i += 1;
        }
        sent
    }
}

/// Runs flows over one fabric.
pub(crate) struct Engine {
    pub(crate) net: Net,
    flows: Vec<Box<dyn Flow>>,
}

impl Engine {
    /// An engine over `topo` with every link at `bandwidth` bytes/s and `latency`.
    pub(crate) fn new(
        topo: Topology,
        bandwidth: u64,
        latency: Ps,
        faults: &Faults,
        seed: u64,
        rto: Ps,
    ) -> Self {
        let hosts = topo.hosts as usize;
        let links = topo
            .edges
            .iter()
            .map(|_| Link::new(bandwidth, latency))
            .collect();
        Engine {
            net: Net {
                links,
                faults: faults.link(),
                rng: Rng::new(seed, 0xBA5E),
                q: EventQueue::new(),
                peeked: None,
                now: 0,
                rto,
                nic_busy: vec![false; hosts],
                retx: vec![VecDeque::new(); hosts],
                rr: vec![0; hosts],
                kicks: Vec::new(),
                routes: vec![None; hosts],
                trees: vec![None; hosts],
                path: Vec::new(),
                depth_time: vec![0; topo.nodes as usize + 1],
                stats: Vec::new(),
                topo,
            },
            flows: Vec::new(),
        }
    }

    /// Adds a flow that starts at `start`; returns its id.
    pub(crate) fn add(&mut self, start: Ps, make: impl FnOnce(u16) -> Box<dyn Flow>) -> u16 {
        let id = self.flows.len() as u16;
        self.flows.push(make(id));
        let net = &mut self.net;
        net.stats.push(FlowStats::new(
            start,
            net.topo.hosts as usize,
            usize::from(net.topo.levels()),
        ));
        net.q.push(start, Ev::Start(id));
        id
    }

    /// Time of the next event, if any.
    pub(crate) fn peek(&mut self) -> Option<Ps> {
        if self.net.peeked.is_none() {
            self.net.peeked = self.net.q.pop();
        }
        self.net.peeked.map(|(t, _)| t)
    }

    /// Handles every event up to and including time `until`.
    pub(crate) fn run_until(&mut self, until: Ps) {
        while self.peek().is_some_and(|t| t <= until) {
            let Some((t, ev)) = self.net.peeked.take() else {
                return;
            };
            self.net.now = t;
            self.handle(ev);
        }
    }

    /// Runs to the end.
    pub(crate) fn run(&mut self) {
        self.run_until(Ps::MAX);
    }

    fn handle(&mut self, ev: Ev) {
        match ev {
            Ev::Start(f) => self.flows[usize::from(f)].start(&mut self.net),
            Ev::NicReady(h) => {
                self.net.nic_busy[h as usize] = false;
                self.net.kick(h);
            }
            Ev::Arrive(p) => {
                let s = &mut self.net.stats[usize::from(p.flow)];
                s.received[p.dst as usize] += u64::from(p.len);
                self.flows[usize::from(p.flow)].arrive(&mut self.net, p);
            }
            Ev::Retransmit(p) => {
                self.net.stats[usize::from(p.flow)].retransmissions += 1;
                self.net.retx[p.src as usize].push_back(p);
                self.net.kick(p.src);
            }
            Ev::Wake(w) => self.flows[usize::from(w.flow)].wake(&mut self.net, w),
        }
        while let Some(h) = self.net.kicks.pop() {
            self.pump(h);
        }
    }

    /// Starts the next packet on `h`'s NIC if it is idle and has one.
    fn pump(&mut self, h: u32) {
        let net = &mut self.net;
        if net.nic_busy[h as usize] {
            return;
        }
        let mut pkt = net.retx[h as usize].pop_front();
        let n = self.flows.len();
        let first = usize::from(net.rr[h as usize]);
        for i in 0..n {
            if pkt.is_some() {
                break;
            }
            let f = (first + i) % n;
            pkt = self.flows[f].next_packet(net, h);
            if pkt.is_some() {
                net.rr[h as usize] = ((f + 1) % n) as u16;
            }
        }
        let Some(p) = pkt else { return };
        net.stats[usize::from(p.flow)].sent[h as usize] += u64::from(p.len);
        let sent = if p.dst == MULTICAST {
            net.multicast(p)
        } else {
            net.unicast(p)
        };
        net.nic_busy[h as usize] = true;
        net.q.push(sent, Ev::NicReady(h));
    }

    /// Swaps the engine's links with `links` (to share a fabric with a [`crate::Sim`]).
    pub(crate) fn swap_links(&mut self, links: &mut Vec<Link>) {
        std::mem::swap(&mut self.net.links, links);
    }
}
