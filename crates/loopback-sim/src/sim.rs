//! The driver: pops events in virtual-time order, feeds them to the real core sessions, and
//! carries out what the sessions ask for (multicasts, control messages, reads, timers).

use crate::config::{SimConfig, SimError};
use crate::event::{Delivery, Ev};
use crate::fabric::{Fabric, Packet};
use crate::held::Held;
use crate::host::Host;
use crate::link::Link;
use crate::queue::{EventQueue, PS_PER_NS, Ps};
use crate::report::{Failure, Outcome, rejected};
use crate::slots::SlotLayout;
use crate::store::Store;
use crate::topology::Topology;
use crate::workload::OpSpec;
use ringcast_core::port::mailbox::MailOut;
use ringcast_core::port::pump;
use ringcast_core::wire::ImmLayout;
use ringcast_core::{Event, Instant, Node, OpId, Placement, Rank, ReadError, ReadId};
use std::time::Duration;

/// A read on its way: request to the peer, data back to the reader.
#[derive(Clone, Copy, Debug)]
struct PendingRead {
    id: ReadId,
    reader: u32,
    peer: u32,
    op: OpId,
    offset: u64,
    len: u64,
    issued: Ps,
    ok: bool,
}

/// How far a run has got (for progress bars).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Progress {
    /// Virtual time reached.
    pub now: Duration,
    /// Multicast chunks delivered so far.
    pub deliveries: u64,
    /// Deliveries a lossless run of the whole workload makes.
    pub expected_deliveries: u64,
    /// Events processed.
    pub events: u64,
}

/// A simulation in progress. [`Sim::run`] runs it to the end; [`Sim::run_for`] in steps.
///
/// ```
/// use ringcast_loopback_sim::{Sim, SimConfig, TopologySpec, Workload};
/// use std::time::Duration;
/// let w = Workload::new().broadcast(Duration::ZERO, 0, 64 << 10);
/// let report = Sim::new(SimConfig::new(TopologySpec::Star { hosts: 4 }, w))?.run();
/// assert!(report.verified && report.all_completed());
/// # Ok::<(), ringcast_loopback_sim::SimError>(())
/// ```
#[derive(Debug)]
pub struct Sim {
    pub(crate) cfg: SimConfig,
    pub(crate) ops: Vec<OpSpec>,
    /// Token-store layout of each operation.
    layouts: Vec<SlotLayout>,
    pub(crate) hosts: Vec<Host>,
    pub(crate) fabric: Fabric,
    q: EventQueue<Ev>,
    msgs: Store<Vec<u8>>,
    spare: Vec<Vec<u8>>,
    reads: Store<PendingRead>,
    buf: Vec<u8>,
    scratch: Vec<u32>,
    events_scratch: Vec<Event>,
    pub(crate) now: Ps,
    pub(crate) events: u64,
    pub(crate) deliveries: u64,
    pub(crate) mismatches: u64,
    pub(crate) reads_after_release: u64,
    pub(crate) truncated: bool,
    finished: bool,
    control_overhead: Ps,
    read_timeout: Ps,
    time_limit: Ps,
    expected_deliveries: u64,
}

/// The longest [`SimConfig::time_limit`] the virtual clock holds (about 53 days): the
/// clock counts picoseconds in a `u64`, with room for the events scheduled past the end.
pub const MAX_TIME_LIMIT: Duration = Duration::from_nanos(u64::MAX / 4 / PS_PER_NS);

fn ps(d: Duration) -> Ps {
    u64::try_from(d.as_nanos())
        .unwrap_or(u64::MAX / PS_PER_NS)
        .saturating_mul(PS_PER_NS)
        .min(u64::MAX / 4)
}

impl Sim {
    /// Builds the fabric and one core session per rank.
    pub fn new(cfg: SimConfig) -> Result<Self, SimError> {
        let topo = Topology::build(&cfg.topology)?;
        let ranks = topo.hosts;
        if cfg.bandwidth == 0 {
            return Err(SimError::Invalid("bandwidth must be positive"));
        }
        if cfg.chunk_size == 0 {
            return Err(SimError::Invalid("chunk size must be positive"));
        }
        if cfg.time_limit > MAX_TIME_LIMIT {
            return Err(SimError::Invalid(
                "time limit past the virtual clock's end (sim::MAX_TIME_LIMIT, about 53 days)",
            ));
        }
        let ops = cfg.workload.sorted();
        if let Some(index) = cfg.workload.ops().iter().position(|o| !o.kind.check(ranks)) {
            return Err(SimError::BadOp { index });
        }
        if let Some(c) = cfg.faults.crashes.iter().find(|c| c.rank >= ranks) {
            return Err(SimError::BadCrash { rank: c.rank });
        }
        let layouts = ops
            .iter()
            .enumerate()
            .map(|(w, o)| {
                SlotLayout::new(
                    &o.kind.block_sizes(ranks),
                    cfg.chunk_size,
                    cfg.seed,
                    w as u32,
                )
            })
            .collect::<Option<Vec<_>>>()
            .ok_or(SimError::Invalid("an operation has more than 2^32 chunks"))?;
        let most_chunks = layouts.iter().map(|l| l.total() as u64).max().unwrap_or(1);
        // Widen the immediate's chunk index (down to the narrowest allowed op tag) if needed;
        // the all-ones index is never a chunk's.
        let bits = (64 - most_chunks.leading_zeros()).clamp(20, 22) as u8;
        let imm = ImmLayout::new(bits).map_err(|_| SimError::Invalid("immediate layout"))?;
        let mut hosts = Vec::with_capacity(ranks as usize);
        for r in 0..ranks {
            let mut c = cfg.core_config(r, ranks);
            c.imm = imm;
            c.limits.max_chunks_per_op = (1 << bits) - 1;
            let n = Node::new(c)?;
            hosts.push(Host::new(n, cfg.faults.rx_slots, ops.len()));
        }
        let mut down = Vec::new();
        for d in &cfg.faults.links_down {
            let link = topo
                .edges
                .iter()
                .position(|e| topo.name(e.from) == d.from && topo.name(e.to) == d.to)
                .ok_or(SimError::Invalid("a link that is down does not exist"))?;
            down.push((link as u32, ps(d.at), ps(d.until)));
        }
        let mut fabric = Fabric::new(
            topo,
            cfg.bandwidth,
            ps(cfg.latency),
            cfg.lanes.max(1),
            &cfg.faults,
            bits,
            cfg.seed,
        );
        fabric.down = down;
        fabric.pause_after = Link::new(cfg.bandwidth, 0)
            .serialize(cfg.switch_buffer.min(u64::MAX >> 24))
            .saturating_add(ps(cfg.latency));
        let mut q = EventQueue::new();
        for (i, o) in ops.iter().enumerate() {
            q.push(ps(o.start), Ev::Start { op: i as u32 });
        }
        for c in &cfg.faults.crashes {
            q.push(ps(c.at), Ev::Crash { host: c.rank });
        }
        let expected_deliveries = ops
            .iter()
            .map(|o| o.kind.expected_deliveries(ranks, cfg.chunk_size))
            .sum();
        Ok(Sim {
            control_overhead: ps(cfg.control_overhead),
            read_timeout: ps(cfg.read_timeout),
            time_limit: ps(cfg.time_limit),
            cfg,
            ops,
            layouts,
            hosts,
            fabric,
            q,
            msgs: Store::new(),
            spare: Vec::new(),
            reads: Store::new(),
            buf: Vec::with_capacity(256),
            scratch: Vec::new(),
            events_scratch: Vec::new(),
            now: 0,
            events: 0,
            deliveries: 0,
            mismatches: 0,
            reads_after_release: 0,
            truncated: false,
            finished: false,
            expected_deliveries,
        })
    }

    /// Runs to the end (no event left, or the time limit) and reports.
    pub fn run(mut self) -> crate::Report {
        while !self.run_for(u64::MAX) {}
        self.report()
    }

    /// Processes up to `max_events` events; `true` once the run is over.
    pub fn run_for(&mut self, max_events: u64) -> bool {
        for _ in 0..max_events {
            if self.finished {
                return true;
            }
            let Some((t, ev)) = self.q.pop() else {
                self.finished = true;
                return true;
            };
            if t > self.time_limit {
                self.truncated = true;
                self.finished = true;
                return true;
            }
            self.now = t;
            self.events += 1;
            self.handle(ev);
        }
        self.finished
    }

    /// How far the run has got.
    pub fn progress(&self) -> Progress {
        Progress {
            now: Duration::from_nanos(self.now / PS_PER_NS),
            deliveries: self.deliveries,
            expected_deliveries: self.expected_deliveries,
            events: self.events,
        }
    }

    #[inline]
    fn now_ns(&self) -> Instant {
        Instant::from_nanos(self.now / PS_PER_NS)
    }

    fn handle(&mut self, ev: Ev) {
        match ev {
            Ev::Chunk(d) => self.on_chunk(d),
            Ev::SendDone { host, lane, op } => {
                let h = &mut self.hosts[host as usize];
                if h.alive {
                    if let Some(tx) = h.port.tx.get_mut(usize::from(lane)) {
                        tx.complete(OpId(op), 1);
                    }
                    self.drain(host);
                }
            }
            Ev::Control { from, to, msg } => self.on_control(from, to, msg),
            Ev::ReadAtPeer { read } => self.on_read_at_peer(read),
            Ev::ReadDone { read } => self.on_read_done(read),
            Ev::Timer { host } => {
                let now = self.now_ns();
                let h = &mut self.hosts[host as usize];
                if h.alive && h.timer_at == Some(self.now) {
                    h.timer_at = None;
                    h.node.handle_timeout(now);
                    self.drain(host);
                }
            }
            Ev::Start { op } => self.on_start(op),
            Ev::Crash { host } => {
                let h = &mut self.hosts[host as usize];
                h.alive = false;
                for o in &mut h.ops {
                    if matches!(o.outcome, Outcome::Pending) {
                        o.outcome = Outcome::Crashed;
                    }
                }
            }
        }
    }

    fn on_start(&mut self, w: u32) {
        let now = self.now_ns();
        let kind = self.ops[w as usize].kind.clone();
        let layout = &self.layouts[w as usize];
        let slots = u32::try_from(layout.total()).unwrap_or(u32::MAX);
        for r in 0..self.hosts.len() as u32 {
            let layout = &self.layouts[w as usize];
            let h = &mut self.hosts[r as usize];
            if !h.alive {
                continue;
            }
            let mut buf = Held::new(0);
            // A buffer the core would refuse is not allocated.
            if slots <= h.node.config().limits.max_chunks_per_op {
                buf = Held::new(slots as usize);
                for s in layout.owned(r) {
                    buf.set(s, true);
                }
            }
            let op = &mut h.ops[w as usize];
            match kind.start(&mut h.node, now) {
                Ok(id) => {
                    debug_assert_eq!(id.0, h.op_of_seq.len() as u64);
                    h.op_of_seq.push(w);
                    op.buf = Some(buf);
                    op.outcome = Outcome::Pending;
                }
                Err(e) => op.outcome = rejected(e),
            }
            self.drain(r);
        }
    }

    #[inline]
    fn on_chunk(&mut self, d: Delivery) {
        self.deliveries += 1;
        let h = &mut self.hosts[d.dst as usize];
        if !h.alive {
            self.fabric.counters.to_crashed += 1;
            return;
        }
        if let Some(rx) = h.rx.as_mut()
            && !rx.take(self.now)
        {
            self.fabric.counters.rnr += 1;
            return;
        }
        if d.corrupt {
            return; // the transport checksum failed; counted when the fault was injected
        }
        // The chunk goes straight to the node's lane (a driver that owns the receive side, as
        // a lane worker does); everything the node then sends goes through the shared pump.
        let now = Instant::from_nanos(self.now / PS_PER_NS);
        let p = h
            .node
            .handle_chunk(d.lane, Rank(d.src), d.imm, d.len as usize);
        let mut heard = false;
        if let Placement::Place { op, offset, len } = p {
            if let Some(w) = h.op_index(op.0) {
                let layout = &self.layouts[w];
                if let Some((b, s)) = h.ops[w].buf.as_mut().zip(layout.slot(d.src, offset)) {
                    // A failed copy leaves garbage in the slot.
                    b.set(
                        s,
                        !d.copy_fails && layout.expected().get(s) == Some(&d.token),
                    );
                }
            }
            if d.copy_fails {
                h.node.release(d.lane, Rank(d.src), d.imm);
            } else {
                h.bytes_received += u64::from(len);
                heard = h.node.commit(now, d.lane, op);
            }
        }
        if heard || h.node.has_output() {
            self.drain(d.dst);
        }
    }

    fn on_control(&mut self, from: u32, to: u32, msg: u32) {
        let Some(bytes) = self.msgs.take(msg) else {
            return;
        };
        let h = &mut self.hosts[to as usize];
        if h.alive {
            h.port.control.deliver(Rank(from), &bytes);
            self.spare.push(bytes);
            self.drain(to);
        } else {
            self.fabric.counters.control_to_crashed += 1;
            self.spare.push(bytes);
        }
    }

    fn on_read_at_peer(&mut self, id: u32) {
        let Some(r) = self.reads.get_mut(id).copied() else {
            return;
        };
        if !self.hosts[r.reader as usize].alive {
            self.reads.take(id);
            return;
        }
        let fail_at = (r.issued + self.read_timeout).max(self.now);
        if !self.hosts[r.peer as usize].alive {
            self.fabric.counters.reads_failed += 1;
            self.fail_read(id, fail_at);
            return;
        }
        let w = self.hosts[r.reader as usize].op_index(r.op.0);
        let range = w.map_or(0..0, |w| self.layouts[w].slots_of_bytes(r.offset, r.len));
        let peer = &self.hosts[r.peer as usize];
        let src = w.and_then(|w| peer.ops[w].buf.as_ref());
        let Some(src) = src.filter(|b| range.end <= b.len()) else {
            // The peer released (or never had) the buffer: the core let us read freed memory.
            self.reads_after_release += 1;
            self.fail_read(id, fail_at);
            return;
        };
        self.scratch.clear();
        self.scratch
            .extend(range.clone().map(|s| u32::from(src.get(s) == Some(true))));
        let reader = &mut self.hosts[r.reader as usize];
        if let Some(dst) = w.and_then(|w| reader.ops[w].buf.as_mut()) {
            for (s, held) in range.zip(&self.scratch) {
                dst.set(s, *held == 1);
            }
        }
        self.hosts[r.peer as usize].bytes_served += r.len;
        let done = self.fabric.transfer(r.peer, r.reader, r.len, self.now);
        self.q.push(done, Ev::ReadDone { read: id });
    }

    fn fail_read(&mut self, id: u32, at: Ps) {
        if let Some(r) = self.reads.get_mut(id) {
            r.ok = false;
        }
        self.q.push(at, Ev::ReadDone { read: id });
    }

    fn on_read_done(&mut self, id: u32) {
        let Some(r) = self.reads.take(id) else {
            return;
        };
        let h = &mut self.hosts[r.reader as usize];
        if !h.alive {
            return;
        }
        let result = if r.ok {
            h.bytes_read += r.len;
            Ok(())
        } else {
            Err(ReadError)
        };
        h.port.control.read_done(r.id, result);
        self.drain(r.reader);
    }

    /// Runs the shared pump for host `h` after an input, carries out what its port collected,
    /// then re-arms its timer.
    fn drain(&mut self, h: u32) {
        let now = self.now;
        let mut events = std::mem::take(&mut self.events_scratch);
        let host = &mut self.hosts[h as usize];
        pump(
            &mut host.node,
            &mut host.port,
            Instant::from_nanos(now / PS_PER_NS),
            usize::MAX,
            &mut self.buf,
            |e| events.push(e),
        );
        for lane in 0..host.port.rx.len() {
            let mut consumed = std::mem::take(&mut host.port.rx[lane].consumed);
            for (p, (token, src)) in consumed.drain(..) {
                let Placement::Place { op, offset, len } = p else {
                    continue;
                };
                host.bytes_received += u64::from(len);
                if let Some(w) = host.op_index(op.0) {
                    let layout = &self.layouts[w];
                    if let Some((b, s)) = host.ops[w].buf.as_mut().zip(layout.slot(src, offset)) {
                        b.set(s, layout.expected().get(s) == Some(&token));
                    }
                }
            }
            // Give the (empty) vector back so its capacity is reused.
            host.port.rx[lane].consumed = consumed;
        }
        while let Some(o) = self.hosts[h as usize].port.control.outbox.pop_front() {
            match o {
                MailOut::Message { to, bytes } => {
                    let mut v = self.spare.pop().unwrap_or_default();
                    v.clear();
                    v.extend_from_slice(&bytes);
                    self.hosts[h as usize].port.control.recycle(bytes);
                    let msg = self.msgs.put(v);
                    let at = now + self.fabric.path_latency(h, to.0) + self.control_overhead;
                    self.q.push(
                        at,
                        Ev::Control {
                            from: h,
                            to: to.0,
                            msg,
                        },
                    );
                }
                MailOut::Read(q) => {
                    let read = self.reads.put(PendingRead {
                        id: q.id,
                        reader: h,
                        peer: q.from.0,
                        op: q.op,
                        offset: q.offset,
                        len: q.len,
                        issued: now,
                        ok: true,
                    });
                    let at = now + self.fabric.path_latency(h, q.from.0);
                    self.q.push(at, Ev::ReadAtPeer { read });
                }
            }
        }
        for lane in 0..self.hosts[h as usize].port.tx.len() {
            while let Some(m) = self.hosts[h as usize].port.tx[lane].posted.pop_front() {
                let host = &mut self.hosts[h as usize];
                host.bytes_sent += u64::from(m.len);
                let token = host
                    .op_index(m.op.0)
                    .and_then(|w| {
                        let layout = &self.layouts[w];
                        let s = layout.chunk_slot(h, m.chunk)?;
                        let held = host.ops[w].buf.as_ref()?.get(s)?;
                        // Data it does not hold goes out as garbage (token 0).
                        held.then(|| layout.expected()[s])
                    })
                    .unwrap_or(0);
                let pkt = Packet {
                    imm: m.imm,
                    token,
                    len: m.len,
                    lane: m.lane,
                };
                let sent = self.fabric.multicast(h, now, pkt, &mut self.q);
                self.q.push(
                    sent,
                    Ev::SendDone {
                        host: h,
                        lane: m.lane,
                        op: m.op.0,
                    },
                );
            }
        }
        for e in events.drain(..) {
            self.finish(h, e);
        }
        self.events_scratch = events;
        let host = &mut self.hosts[h as usize];
        if let Some(t) = host.node.poll_timeout() {
            let t = t.as_nanos().saturating_mul(PS_PER_NS).max(now);
            if host.timer_at.is_none_or(|cur| t < cur) {
                host.timer_at = Some(t);
                self.q.push(t, Ev::Timer { host: h });
            }
        }
    }

    /// An operation ended at host `h`: record it, and check the buffer of a completion.
    fn finish(&mut self, h: u32, e: Event) {
        let at_ns = self.now / PS_PER_NS;
        let host = &mut self.hosts[h as usize];
        match e {
            Event::Completed { op } => {
                let Some(w) = host.op_index(op.0) else { return };
                let o = &mut host.ops[w];
                // The core says the buffer may be released: check it, then free it.
                let want = self.layouts[w].total();
                let mismatches = o.buf.take().map_or(0, |b| {
                    if b.len() != want {
                        return want as u64;
                    }
                    b.wrong()
                });
                self.mismatches += mismatches;
                o.outcome = Outcome::Completed { at_ns, mismatches };
            }
            Event::Failed { op, error } => {
                let Some(w) = host.op_index(op.0) else { return };
                // Peers may still read a failed rank's buffer: keep it.
                host.ops[w].outcome = Outcome::Failed {
                    at_ns,
                    error: Failure::from(error),
                };
            }
            _ => {}
        }
    }
}
