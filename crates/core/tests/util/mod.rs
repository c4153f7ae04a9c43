//! A tiny in-process network that drives N real sessions in virtual time, quinn-style: the
//! loop jumps to the next event or timer and bounds the number of steps.
//!
//! Every multicast chunk carries a token (a fingerprint of op, root and chunk) instead of
//! bytes; placements and reads copy tokens, so a wrong placement or a read of data the peer
//! does not hold shows up as a mismatch. Buffers are poisoned when an operation completes, so
//! a read from a released buffer is caught too.
#![allow(dead_code, unreachable_pub)]

use ringcast_core::port::mailbox::{MailOut, Mailbox, mailbox};
use ringcast_core::port::{RxMeta, pump};
use ringcast_core::wire::{ChunkRun, ControlRepr};
use ringcast_core::{
    Config, Event, Instant, Node, OpError, OpId, Placement, Rank, ReadError, ReadId,
};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::fmt::Write as _;

pub const POISON: u64 = u64::MAX;

/// The workspace's one splitmix64.
pub use ringcast_core::port::SplitMix64 as Rng;

pub fn token(op: u64, root: u32, chunk: u32) -> u64 {
    ((op << 48) ^ (u64::from(root) << 28) ^ u64::from(chunk)).wrapping_mul(0x9e37_79b9_7f4a_7c15)
        | 1
}

/// What every rank starts.
#[derive(Debug, Clone)]
pub enum Start {
    Broadcast {
        root: u32,
        len: u64,
    },
    Allgather {
        sizes: Vec<u64>,
    },
    /// The operation runs over another path here (`skip_op`): nothing to check.
    Skip,
    /// The operation fails here before it starts, naming this rank: a peer it needs is gone
    /// (`abandon_op`).
    Abandon(u32),
}

impl Start {
    /// Block sizes of the operation's buffer.
    pub fn sizes(&self, ranks: u32) -> Vec<u64> {
        match self {
            Start::Broadcast { root, len } => (0..ranks)
                .map(|r| if r == *root { *len } else { 0 })
                .collect(),
            Start::Allgather { sizes } => sizes.clone(),
            Start::Skip | Start::Abandon(_) => vec![0; ranks as usize],
        }
    }
}

/// Buffer contents: a token per chunk, keyed by the chunk's byte offset.
pub type Buf = BTreeMap<u64, u64>;

/// The buffer every rank must end with; with `only`, just that rank's own block.
pub fn expected(op: u64, sizes: &[u64], chunk: u32, only: Option<u32>) -> Buf {
    let mut b = Buf::new();
    let mut displ = 0;
    for (r, &sz) in sizes.iter().enumerate() {
        let chunks = sz.div_ceil(u64::from(chunk)) as u32;
        if only.is_none_or(|o| o == r as u32) {
            for c in 0..chunks {
                b.insert(
                    displ + u64::from(c) * u64::from(chunk),
                    token(op, r as u32, c),
                );
            }
        }
        displ += sz;
    }
    b
}

/// A rule that drops chunk `chunk` of op `op` from `root` on its way to rank `to`:
/// `(op, root, chunk, to)`.
pub type DropRule = Box<dyn Fn(u64, u32, u32, u32) -> bool>;

#[derive(Default)]
pub struct Faults {
    pub loss: f64,
    pub dup: f64,
    /// Extra random delay up to this many ns (reordering).
    pub jitter_ns: u64,
    pub rules: Vec<DropRule>,
    /// (rank, time ns): the rank stops at that time.
    pub crash: Vec<(u32, u64)>,
    /// Replays every chunk this many ns later (stale packets).
    pub replay_after_ns: Option<u64>,
    /// (rank, time ns): from that time on, every control message from or to the rank is
    /// dropped (an nft drop on its TCP ports); its multicast still flows.
    pub control_cut: Vec<(u32, u64)>,
    /// (rank, time ns): from that time on, the rank's NIC holds every multicast posted to
    /// it (a PFC pause of its data class): none leaves, none completes; control still flows.
    pub paused: Vec<(u32, u64)>,
}

#[derive(Debug, Clone)]
enum Ev {
    Chunk {
        to: u32,
        from: u32,
        lane: u16,
        imm: u32,
        len: u32,
        token: u64,
    },
    Control {
        to: u32,
        from: u32,
        bytes: Vec<u8>,
    },
    ReadDone {
        to: u32,
        from: u32,
        id: ReadId,
        op: OpId,
        run: ChunkRun,
        offset: u64,
        len: u64,
    },
    SendDone {
        to: u32,
        lane: u16,
        op: OpId,
    },
    Start {
        rank: u32,
        what: Start,
    },
}

impl Ev {
    fn rank(&self) -> u32 {
        match self {
            Ev::Chunk { to, .. }
            | Ev::Control { to, .. }
            | Ev::ReadDone { to, .. }
            | Ev::SendDone { to, .. } => *to,
            Ev::Start { rank, .. } => *rank,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Pending,
    Completed(u64),
    Failed(OpError),
}

pub struct Net {
    /// One node per rank, driven through its mailbox port by the shared pump.
    pub sessions: Vec<Node>,
    /// Chunk payloads are (token, immediate, source), so a trace can name them.
    ports: Vec<Mailbox<(u64, u32, u32)>>,
    pub now: u64,
    pub latency_ns: u64,
    pub byte_ns: f64,
    pub faults: Faults,
    pub rng: Rng,
    queue: BinaryHeap<Reverse<(u64, u64, usize)>>,
    evs: Vec<Option<Ev>>,
    seq: u64,
    pub bufs: Vec<BTreeMap<u64, Buf>>,
    pub ops: BTreeMap<u64, Start>,
    pub outcomes: Vec<BTreeMap<u64, Outcome>>,
    /// Per rank, when each operation failed there (virtual ns).
    pub failed_at: Vec<BTreeMap<u64, u64>>,
    pub trace: Option<String>,
    pub chunk_size: u32,
    pub errors: Vec<String>,
    nic_free_at: Vec<u64>,
    /// Operations every rank runs one after the other, as a program of blocking calls does:
    /// the next starts `gap` ns after the previous completed there (none after a failure).
    sequence: Vec<Start>,
    gap_ns: u64,
    /// `(rank, ns)`: that rank posts each operation of the sequence this much later than
    /// the others would (an application slow between its calls).
    pub slow: Option<(u32, u64)>,
    next_in_sequence: Vec<usize>,
}

impl Net {
    pub fn new(ranks: u32, tweak: impl Fn(&mut Config)) -> Self {
        let sessions: Vec<Node> = (0..ranks)
            .map(|r| {
                let mut c = Config::new(r, ranks);
                c.link_bandwidth = 1_000_000_000; // 1 GB/s: 1 ns per byte
                c.cutoff_alpha = std::time::Duration::from_micros(5);
                c.peer_timeout = std::time::Duration::from_millis(1);
                tweak(&mut c);
                Node::new(c).expect("valid config")
            })
            .collect();
        let chunk_size = sessions[0].config().chunk_size;
        let ports = sessions.iter().map(|s| mailbox(s.config().lanes)).collect();
        Net {
            sessions,
            ports,
            now: 0,
            latency_ns: 1_000,
            byte_ns: 1.0,
            faults: Faults::default(),
            rng: Rng::new(1),
            queue: BinaryHeap::new(),
            evs: Vec::new(),
            seq: 0,
            bufs: vec![BTreeMap::new(); ranks as usize],
            ops: BTreeMap::new(),
            outcomes: vec![BTreeMap::new(); ranks as usize],
            failed_at: vec![BTreeMap::new(); ranks as usize],
            trace: None,
            chunk_size,
            errors: Vec::new(),
            nic_free_at: vec![0; ranks as usize],
            sequence: Vec::new(),
            gap_ns: 0,
            slow: None,
            next_in_sequence: vec![0; ranks as usize],
        }
    }

    /// Every rank runs `ops` back to back from time 0 (rank `r` starting `skew_ns * r` late):
    /// each starts `gap_ns` after the one before completed on that rank; a failure ends the
    /// rank's program.
    pub fn sequence(&mut self, ops: Vec<Start>, skew_ns: u64, gap_ns: u64) {
        if let Some(first) = ops.first() {
            for r in 0..self.ranks() {
                let at = skew_ns * u64::from(r) + self.slow_by(r);
                let what = first.clone();
                self.push(at, Ev::Start { rank: r, what });
            }
            self.next_in_sequence.fill(1);
        }
        self.sequence = ops;
        self.gap_ns = gap_ns;
    }

    /// How much later than the others rank `r` posts each operation of the sequence.
    fn slow_by(&self, r: u32) -> u64 {
        self.slow.filter(|s| s.0 == r).map_or(0, |s| s.1)
    }

    pub fn ranks(&self) -> u32 {
        self.sessions.len() as u32
    }

    fn push(&mut self, at: u64, ev: Ev) {
        self.seq += 1;
        self.evs.push(Some(ev));
        self.queue.push(Reverse((at, self.seq, self.evs.len() - 1)));
    }

    fn log(&mut self, s: impl FnOnce() -> String) {
        if let Some(t) = self.trace.as_mut() {
            let _ = writeln!(t, "{:>9} {}", self.now, s());
        }
    }

    fn crash_time(&self, rank: u32) -> u64 {
        self.faults
            .crash
            .iter()
            .filter(|c| c.0 == rank)
            .map(|c| c.1)
            .min()
            .unwrap_or(u64::MAX)
    }

    /// Whether a control message between `a` and `b` is dropped now.
    fn cut(&self, a: u32, b: u32) -> bool {
        self.faults
            .control_cut
            .iter()
            .any(|&(r, t)| (r == a || r == b) && self.now >= t)
    }

    fn crashed(&self, rank: u32) -> bool {
        self.now >= self.crash_time(rank)
    }

    /// Schedules a Broadcast on every rank at time `at` (+ `skew_ns * rank`).
    pub fn broadcast_at(&mut self, at: u64, skew_ns: u64, root: u32, len: u64) {
        self.start_at(at, skew_ns, Start::Broadcast { root, len });
    }

    /// Schedules an Allgatherv on every rank at time `at` (+ `skew_ns * rank`).
    pub fn allgather_at(&mut self, at: u64, skew_ns: u64, sizes: Vec<u64>) {
        self.start_at(at, skew_ns, Start::Allgather { sizes });
    }

    /// Schedules `what` on rank `rank` alone at time `at` (ranks that disagree on an
    /// operation: an erroneous program).
    pub fn start_rank(&mut self, at: u64, rank: u32, what: Start) {
        self.push(at, Ev::Start { rank, what });
    }

    fn start_at(&mut self, at: u64, skew_ns: u64, what: Start) {
        for r in 0..self.ranks() {
            self.push(
                at + skew_ns * u64::from(r),
                Ev::Start {
                    rank: r,
                    what: what.clone(),
                },
            );
        }
    }

    /// Delivers a control message from `from` to `to` at time `at`, as if sent.
    pub fn inject_control(&mut self, at: u64, from: u32, to: u32, bytes: Vec<u8>) {
        self.push(at, Ev::Control { to, from, bytes });
    }

    /// Runs until nothing is left to do; panics (a hang) past `max_steps` events.
    pub fn run(&mut self, max_steps: usize) -> usize {
        for step in 0..max_steps {
            let next_ev = self.queue.peek().map(|Reverse((t, _, _))| *t);
            let next_timer = self
                .sessions
                .iter()
                .enumerate()
                .filter_map(|(r, s)| s.poll_timeout().map(|t| (t.as_nanos(), r as u32)))
                .filter(|&(t, r)| t < self.crash_time(r))
                .min();
            match (next_ev, next_timer) {
                (None, None) => return step,
                (Some(te), Some((tt, r))) if tt < te => self.fire_timer(tt, r),
                (None, Some((tt, r))) => self.fire_timer(tt, r),
                _ => {
                    let Reverse((t, _, i)) = self.queue.pop().expect("peeked");
                    self.now = self.now.max(t);
                    let ev = self.evs[i].take().expect("event once");
                    self.deliver(ev);
                }
            }
        }
        panic!("no quiescence after {max_steps} steps (a hang)");
    }

    fn fire_timer(&mut self, t: u64, r: u32) {
        self.now = self.now.max(t);
        self.log(|| format!("r{r} timeout"));
        self.sessions[r as usize].handle_timeout(Instant::from_nanos(self.now));
        self.drain(r);
    }

    fn deliver(&mut self, ev: Ev) {
        let now = Instant::from_nanos(self.now);
        let to = ev.rank();
        if self.crashed(to) {
            return;
        }
        match ev {
            Ev::Start { rank, what } => {
                let s = &mut self.sessions[rank as usize];
                let id = match &what {
                    Start::Broadcast { root, len } => s.start_broadcast(now, Rank(*root), *len),
                    Start::Allgather { sizes } => s.start_allgather(now, sizes),
                    Start::Skip => {
                        let id = s.skip_op();
                        self.log(|| format!("r{rank} skip {id}"));
                        self.drain(rank);
                        return;
                    }
                    Start::Abandon(c) => {
                        let id = s.abandon_op(Rank(*c));
                        self.log(|| format!("r{rank} abandon {id}"));
                        self.drain(rank);
                        return;
                    }
                }
                .expect("start");
                let sizes = what.sizes(self.ranks());
                self.log(|| format!("r{rank} start {id} {what:?}"));
                self.ops.insert(id.0, what);
                // The caller's own block is in place before the operation starts.
                let own = expected(id.0, &sizes, self.chunk_size, Some(rank));
                self.bufs[rank as usize].insert(id.0, own);
                self.outcomes[rank as usize].insert(id.0, Outcome::Pending);
            }
            Ev::Chunk {
                to,
                from,
                lane,
                imm,
                len,
                token,
            } => {
                let meta = RxMeta {
                    from: Rank(from),
                    imm,
                    len: len as usize,
                };
                match self.ports[to as usize].rx.get_mut(usize::from(lane)) {
                    Some(rx) => rx.push(meta, (token, imm, from)),
                    None => self.errors.push(format!("r{to}: chunk on lane {lane}")),
                }
            }
            Ev::Control { to, from, bytes } => {
                if self.cut(from, to) {
                    self.log(|| format!("r{to} <- r{from} cut"));
                    return;
                }
                if self.trace.is_some() {
                    let m = ControlRepr::parse_bytes(&bytes)
                        .map_or_else(|_| "<malformed>".into(), |m| format!("{m:?}"));
                    self.log(|| format!("r{to} <- r{from} {m}"));
                }
                self.ports[to as usize].control.deliver(Rank(from), &bytes);
            }
            Ev::ReadDone {
                to,
                from,
                id,
                op,
                run,
                offset,
                len,
            } => {
                let ok = !self.crashed(from);
                if ok {
                    self.copy_read(to, from, op, offset, len);
                }
                self.log(|| format!("r{to} read done {op} {run} from r{from} ok={ok}"));
                let res = if ok { Ok(()) } else { Err(ReadError) };
                self.ports[to as usize].control.read_done(id, res);
            }
            Ev::SendDone { to, lane, op } => {
                self.ports[to as usize].tx[usize::from(lane)].complete(op, 1)
            }
        }
        self.drain(to);
    }

    /// A one-sided read: copies the peer's chunks as they are now, and checks that it held
    /// every one of them in a live buffer.
    fn copy_read(&mut self, to: u32, from: u32, op: OpId, offset: u64, len: u64) {
        let Some(src) = self.bufs[from as usize].get(&op.0) else {
            self.errors
                .push(format!("r{to}: read from r{from} of unknown {op}"));
            return;
        };
        let got: Vec<(u64, u64)> = src
            .range(offset..offset + len)
            .map(|(k, v)| (*k, *v))
            .collect();
        let want = len.div_ceil(u64::from(self.chunk_size)) as usize;
        if got.len() < want || got.iter().any(|(_, v)| *v == POISON) {
            self.errors.push(format!(
                "r{to}: read {offset}+{len} of {op} from r{from}: {got:?}"
            ));
        }
        let dst = self.bufs[to as usize].entry(op.0).or_default();
        dst.extend(got);
    }

    /// Runs the shared pump for rank `r`, then carries out what its port collected.
    fn drain(&mut self, r: u32) {
        let mut buf = Vec::new();
        let now = self.now;
        let mut events = Vec::new();
        pump(
            &mut self.sessions[r as usize],
            &mut self.ports[r as usize],
            Instant::from_nanos(now),
            usize::MAX,
            &mut buf,
            |e| events.push(e),
        );
        for lane in 0..self.ports[r as usize].rx.len() {
            let consumed = std::mem::take(&mut self.ports[r as usize].rx[lane].consumed);
            for (p, (token, imm, from)) in consumed {
                self.log(|| format!("r{r} <- chunk imm {imm:#x} lane {lane} from r{from}: {p:?}"));
                if let Placement::Place { op, offset, .. } = p {
                    match self.bufs[r as usize].get_mut(&op.0) {
                        Some(b) => {
                            b.insert(offset, token);
                        }
                        None => self
                            .errors
                            .push(format!("r{r}: placement into unknown {op}")),
                    }
                }
            }
        }
        while let Some(o) = self.ports[r as usize].control.outbox.pop_front() {
            match o {
                MailOut::Message { to, bytes } => {
                    if self.trace.is_some() {
                        let m = ControlRepr::parse_bytes(&bytes)
                            .map(|m| format!("{m:?}"))
                            .unwrap_or_default();
                        self.log(|| format!("r{r} -> r{} {m}", to.0));
                    }
                    self.push(
                        now + self.latency_ns,
                        Ev::Control {
                            to: to.0,
                            from: r,
                            bytes,
                        },
                    );
                }
                MailOut::Read(q) => {
                    self.log(|| format!("r{r} read {} {} from r{}", q.op, q.run, q.from.0));
                    // A transport refuses a read longer than it takes.
                    let most = self.sessions[r as usize].config().limits.max_read;
                    if q.len > most {
                        self.errors
                            .push(format!("r{r}: a read of {} bytes (at most {most})", q.len));
                    }
                    let t = now + 2 * self.latency_ns + (q.len as f64 * self.byte_ns) as u64;
                    self.push(
                        t,
                        Ev::ReadDone {
                            to: r,
                            from: q.from.0,
                            id: q.id,
                            op: q.op,
                            run: q.run,
                            offset: q.offset,
                            len: q.len,
                        },
                    );
                }
            }
        }
        for lane in 0..self.ports[r as usize].tx.len() {
            while let Some(m) = self.ports[r as usize].tx[lane].posted.pop_front() {
                self.multicast(r, m);
            }
        }
        for e in events {
            self.on_event(r, e);
        }
    }

    fn multicast(&mut self, r: u32, m: ringcast_core::Multicast) {
        if self
            .faults
            .paused
            .iter()
            .any(|&(p, t)| p == r && self.now >= t)
        {
            self.log(|| format!("r{r} multicast {} chunk {} held (paused)", m.op, m.chunk));
            return;
        }
        let ranks = self.ranks();
        let start = self.nic_free_at[r as usize].max(self.now);
        let done = start + (f64::from(m.len) * self.byte_ns) as u64;
        self.nic_free_at[r as usize] = done;
        self.push(
            done,
            Ev::SendDone {
                to: r,
                lane: m.lane,
                op: m.op,
            },
        );
        let tok = token(m.op.0, r, m.chunk);
        let ev = |to| Ev::Chunk {
            to,
            from: r,
            lane: m.lane,
            imm: m.imm,
            len: m.len,
            token: tok,
        };
        for to in (0..ranks).filter(|t| *t != r) {
            let ruled = self.faults.rules.iter().any(|f| f(m.op.0, r, m.chunk, to));
            if ruled || self.rng.chance(self.faults.loss) {
                continue;
            }
            let copies = if self.rng.chance(self.faults.dup) {
                2
            } else {
                1
            };
            for _ in 0..copies {
                let jitter = self.rng.below(self.faults.jitter_ns + 1);
                self.push(done + self.latency_ns + jitter, ev(to));
            }
            if let Some(d) = self.faults.replay_after_ns {
                self.push(done + d, ev(to));
            }
        }
        // Our own loopback copy: the core must refuse it.
        self.push(done + self.latency_ns, ev(r));
    }

    fn on_event(&mut self, r: u32, e: Event) {
        let ranks = self.ranks();
        self.log(|| format!("r{r} event {e:?}"));
        match e {
            Event::Completed { op } => {
                self.outcomes[r as usize].insert(op.0, Outcome::Completed(self.now));
                let next = self.next_in_sequence[r as usize];
                if let Some(what) = self.sequence.get(next).cloned() {
                    self.next_in_sequence[r as usize] += 1;
                    let at = self.now + self.gap_ns + self.slow_by(r);
                    self.push(at, Ev::Start { rank: r, what });
                }
                // Check the buffer now, then poison it: nobody may read it any more.
                let sizes = self.ops[&op.0].sizes(ranks);
                let want = expected(op.0, &sizes, self.chunk_size, None);
                let b = self.bufs[r as usize].entry(op.0).or_default();
                if *b != want {
                    self.errors
                        .push(format!("r{r}: {op} completed with a wrong buffer"));
                }
                b.values_mut().for_each(|x| *x = POISON);
            }
            Event::Failed { op, error } => {
                self.outcomes[r as usize].insert(op.0, Outcome::Failed(error));
                self.failed_at[r as usize].insert(op.0, self.now);
            }
            other => panic!("unknown event {other:?}"),
        }
    }

    /// A rank's outcome for `op`.
    pub fn outcome(&self, rank: u32, op: u64) -> Outcome {
        self.outcomes[rank as usize]
            .get(&op)
            .copied()
            .unwrap_or(Outcome::Pending)
    }

    /// Asserts no data error and that every rank completed every operation.
    pub fn assert_all_completed(&self) {
        assert!(self.errors.is_empty(), "{:?}", self.errors);
        for r in 0..self.ranks() {
            for &op in self.ops.keys() {
                let o = self.outcome(r, op);
                assert!(matches!(o, Outcome::Completed(_)), "r{r} op {op}: {o:?}");
            }
        }
    }
}
