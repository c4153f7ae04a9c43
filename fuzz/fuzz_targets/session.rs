//! One rank's [`Node`] (the session and its lanes) fed an arbitrary sequence of inputs through a
//! mailbox port and the shared dispatcher, [`port::pump`]: it never panics, its outputs stay
//! inside the buffers they name, and what it holds stays within its configured limits.
//!
//! After every pump the target checks what the port collected:
//! * placements: only for an operation the driver started and that had not ended before the
//!   pump, within the sending root's block, at the offset the immediate names, of exactly the
//!   chunk's length;
//! * multicasts: within this rank's own block, of a chunk the immediate names, on the lane
//!   they were posted to, no more outstanding on a lane than the send window;
//! * reads: from another rank, within the operation's buffer, each with a fresh `ReadId`;
//! * control messages: to another rank, well-formed, within the length limit;
//! * events: only for started operations, at most one each;
//! * bounded state: `inflight()` and every lane's open operations within the limits, every
//!   pump's outputs bounded, no timer left due.
//!
//! Completions the driver makes up (a `ReadDone` for an id never handed out or already
//! reported, chunks on a lane the rank does not have) must be ignored without a panic.
//!
//! Input format (integers little-endian, as `arbitrary` reads them; missing bytes read as 0).
//! `cargo xtask fuzz-seed` writes seeds in this format; keep the two in step.
//!
//! Header, 9 bytes: `ranks u8` (2 + x % 7), `rank u8` (% ranks), `lanes u8` (1 + x % 4),
//! `chunk_size u16` (1 + x % 8192), `max_inflight u8` (1 + x % 8), `send_window u8` (1 + x % 64),
//! `peer_timeout_us u8` (1 + x), `alpha_us u8`.
//!
//! Then steps until the input ends, each `kind u8` (% 16) and its fields. Chunk steps (1, 2, 14)
//! only queue the chunk on its lane's receive port; every other step ends with a pump
//! (budget: every queued chunk), and a last pump runs when the input ends.
//! * 0 start broadcast: `root u8` (% (ranks + 1): may be out of range), `len u16` (bytes)
//! * 1 chunk, valid immediate: `op u8` (index into started ops, modulo), `chunk u16`,
//!   `lane u8` (>= lanes: handed to the node directly, must drop), `from u8`, `len_mode u8`
//!   (0: the chunk size, else the raw byte)
//! * 2 chunk, raw: `imm u32`, `lane u8` (as in 1), `from u8`, `len u16`
//! * 3 control, raw bytes: `from u8`, `n u8`, then `n` bytes
//! * 4 control, well-formed: `from u8`, `kind u8` (% 10), `op u8` (index into started ops; 255:
//!   the op after the last one started; 254: the next id plus `arg >> 8`, as far ahead as a
//!   peer that ran operations elsewhere can be), `arg u32` (FetchAck's hops, Abort's and
//!   Mismatch's culprit; Ready's shape when odd, the operation's own when even; Here's
//!   standing, `% 6`, the rank it names `arg >> 3`), `runs u8`
//!   (% 5), then per run `start u16`, `len u16`
//! * 5 read done: `which u8` (index into reads handed out and not reported; 255: an id never
//!   handed out; 254: an id already reported), `ok u8` (odd: success)
//! * 6 send done: `lane u8` (% lanes), `which u8` (index into that lane's outstanding
//!   multicasts), `chunks u8` (at least 1; as many of that op's outstanding ones as asked)
//! * 7 timeout: `mode u8` (odd: jump to `poll_timeout()`), `advance_ns u32`; pumps at the old
//!   time first (delivering queued chunks), then at the new one
//! * 8 start allgather: `n u8` (ranks - 1 + x % 3 sizes: may be the wrong count), then `n` times
//!   `size u16` (bytes contributed by that rank)
//! * 9 pump: `budget u8` (chunks per lane; queued ones beyond it wait for the next pump)
//! * 10 skip: `n u16` ids taken by operations that run elsewhere (`skip_op`): later starts
//!   may find their tag still in flight (`TagInUse`), messages may come for skipped ids
//! * 11 posts waiting to start (`set_queued`): `on u8` (odd: some wait)
//! * 12 failed elsewhere (`failed_elsewhere`): `back u16` (the id `back` before the last one
//!   taken; it may name one never taken, started here, or not skipped), `culprit u8`
//!   (% (ranks + 1): may be this rank or out of range)
//! * 13 abandon (`abandon_op`): `culprit u8` (as in 12); the next id is taken
//! * 14 chunk whose copy fails, as 1: placed, the token says the write failed and the pump
//!   releases it (the placement is checked as any other)
//! * 15 refuse (`refuse_op`): the next id is taken, and every other rank told
#![no_main]

use arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use ringcast_core::port::mailbox::{MailOut, Mailbox, mailbox};
use ringcast_core::port::{RxMeta, pump};
use ringcast_core::wire::{ChunkRun, ControlRepr, Imm, RunList, Standing};
use ringcast_core::{
    Config, DropReason, Event, Instant, Node, OpId, Placement, Rank, ReadError, ReadId,
    allgather_shape, broadcast_shape,
};
use std::collections::{BTreeSet, VecDeque};
use std::time::Duration;

/// Most steps of one input, so that one input cannot run for long.
const MAX_STEPS: usize = 4096;
/// Most outputs one pump may produce: anything more means the node loops.
const MAX_DRAIN: usize = 1 << 16;
/// Most reads the driver holds (the transport's queue would be bounded too).
const MAX_READS: usize = 256;

/// A chunk as the driver queued it: the payload of the mailbox.
#[derive(Clone, Copy, Debug)]
struct Sent {
    lane: u16,
    meta: RxMeta,
}

struct Driver {
    node: Node,
    ports: Mailbox<Sent>,
    now: Instant,
    /// Started operations: id, the bytes each rank contributes (a Broadcast: only the root),
    /// shape fingerprint.
    ops: Vec<(OpId, Vec<u64>, u32)>,
    /// The id the node gives the next operation (started or skipped).
    next_id: u64,
    /// Operations that reported `Completed` or `Failed`.
    ended: BTreeSet<OpId>,
    /// Reads handed out and not reported back.
    reads: Vec<ReadId>,
    /// Reads reported back (bounded).
    reported: Vec<ReadId>,
    /// Highest read id handed out.
    last_read: Option<ReadId>,
    /// Per lane, multicasts posted and not reported sent.
    sends: Vec<VecDeque<OpId>>,
    buf: Vec<u8>,
}

impl Driver {
    fn sizes(&self, op: OpId) -> &[u64] {
        self.ops
            .iter()
            .find(|(id, ..)| *id == op)
            .map(|(_, sizes, _)| sizes.as_slice())
            .unwrap_or_else(|| panic!("output for {op}, which was never started"))
    }

    /// The operation's buffer: every rank's block, concatenated.
    fn op_len(&self, op: OpId) -> u64 {
        self.sizes(op).iter().sum()
    }

    /// Where `rank`'s block starts in the operation's buffer.
    fn displ(&self, op: OpId, rank: Rank) -> u64 {
        self.sizes(op).iter().take(rank.index()).sum()
    }

    /// Runs the shared pump once and checks everything the port collected.
    fn pump(&mut self, budget: usize) {
        let ended_before = self.ended.clone();
        let mut events = Vec::new();
        let done = pump(
            &mut self.node,
            &mut self.ports,
            self.now,
            budget,
            &mut self.buf,
            |e| events.push(e),
        );
        assert!(done.transmits < MAX_DRAIN, "poll_transmit does not run dry");
        assert!(
            done.multicasts < MAX_DRAIN,
            "poll_multicast does not run dry"
        );
        assert!(events.len() < MAX_DRAIN, "poll_event does not run dry");
        self.check_placements(&ended_before);
        self.check_multicasts();
        self.check_control();
        for e in events {
            let (Event::Completed { op } | Event::Failed { op, .. }) = e else {
                continue;
            };
            assert!(
                self.ops.iter().any(|(id, ..)| *id == op),
                "event for {op}, which was never started"
            );
            assert!(self.ended.insert(op), "two final events for {op}");
        }
        let c = self.node.config();
        let max = c.limits.max_inflight_ops as usize;
        assert!(self.node.inflight() <= max);
        for l in 0..c.lanes {
            let open = self.node.lane_rx(l).map_or(0, |rx| rx.open_ops());
            assert!(open <= max, "lane {l} holds {open} operations");
        }
        // Everything due has been handled: the driver would otherwise spin.
        if let Some(t) = self.node.poll_timeout() {
            assert!(t > self.now, "timer at {t:?} still due at {:?}", self.now);
        }
        let _ = self.node.stats();
    }

    /// Pumps until every queued chunk was handed to the node.
    fn pump_all(&mut self) {
        self.pump(usize::MAX);
    }

    fn check_placements(&mut self, ended_before: &BTreeSet<OpId>) {
        let c = self.node.config().clone();
        for l in 0..self.ports.rx.len() {
            let failed = std::mem::take(&mut self.ports.rx[l].failed);
            for (p, sent) in std::mem::take(&mut self.ports.rx[l].consumed)
                .into_iter()
                .chain(failed)
            {
                assert_eq!(usize::from(sent.lane), l);
                let Placement::Place { op, offset, len } = p else {
                    continue;
                };
                assert!(
                    self.ops.iter().any(|(id, ..)| *id == op),
                    "placement for {op}, which was never started"
                );
                assert!(
                    !ended_before.contains(&op),
                    "placement for {op}, which had ended"
                );
                let RxMeta { from, imm, len: n } = sent.meta;
                assert_eq!(len as usize, n, "placed a payload of the wrong length");
                assert!(len > 0 && len <= c.chunk_size);
                assert_ne!(from, c.rank, "placed our own multicast");
                // The immediate names the operation and the chunk within the sender's block.
                let decoded = c.imm.decode(imm);
                assert_eq!(decoded.op_tag, c.imm.tag_of(op.0));
                let block = self.displ(op, from);
                assert_eq!(
                    offset,
                    block + u64::from(decoded.chunk) * u64::from(c.chunk_size)
                );
                assert!(offset + u64::from(len) <= block + self.sizes(op)[from.index()]);
            }
        }
    }

    fn check_multicasts(&mut self) {
        let c = self.node.config().clone();
        for l in 0..self.ports.tx.len() {
            while let Some(m) = self.ports.tx[l].posted.pop_front() {
                assert_eq!(usize::from(m.lane), l, "multicast posted on another lane");
                // A rank multicasts only its own block.
                let own = self.displ(m.op, c.rank);
                let size = self.sizes(m.op)[c.rank.index()];
                assert!(m.len <= c.chunk_size && m.len > 0);
                assert!(m.offset >= own);
                assert!(m.offset + u64::from(m.len) <= own + size);
                assert_eq!(m.offset, own + u64::from(m.chunk) * u64::from(c.chunk_size));
                assert_eq!(
                    c.imm.decode(m.imm),
                    Imm {
                        op_tag: c.imm.tag_of(m.op.0),
                        chunk: m.chunk
                    }
                );
                self.sends[l].push_back(m.op);
                assert!(
                    self.sends[l].len() <= c.send_window as usize,
                    "lane {l} has {} multicasts outstanding, window {}",
                    self.sends[l].len(),
                    c.send_window
                );
            }
        }
    }

    fn check_control(&mut self) {
        let c = self.node.config().clone();
        while let Some(o) = self.ports.control.outbox.pop_front() {
            match o {
                MailOut::Message { to, bytes } => {
                    assert!(to.0 < c.ranks && to != c.rank);
                    assert!(bytes.len() <= c.limits.max_control_len);
                    assert!(ControlRepr::parse_bytes(&bytes).is_ok());
                    self.ports.control.recycle(bytes);
                }
                MailOut::Read(r) => {
                    assert!(r.from.0 < c.ranks && r.from != c.rank);
                    assert!(r.offset + r.len <= self.op_len(r.op));
                    assert!(r.run.len > 0);
                    assert!(
                        self.last_read.is_none_or(|last| r.id > last),
                        "read id {:?} handed out twice",
                        r.id
                    );
                    self.last_read = Some(r.id);
                    if self.reads.len() < MAX_READS {
                        self.reads.push(r.id);
                    }
                }
            }
        }
    }

    fn step(&mut self, u: &mut Unstructured<'_>) -> Result<()> {
        let c = self.node.config().clone();
        let ranks = c.ranks;
        match u.arbitrary::<u8>()? % 16 {
            0 => {
                let root = Rank(u32::from(u.arbitrary::<u8>()?) % (ranks + 1));
                let len = u64::from(u.arbitrary::<u16>()?);
                if let Ok(id) = self.node.start_broadcast(self.now, root, len) {
                    assert_eq!(id.0, self.next_id, "ids go in order");
                    self.next_id += 1;
                    let mut sizes = vec![0; ranks as usize];
                    sizes[root.index()] = len;
                    self.ops.push((id, sizes, broadcast_shape(root, len)));
                }
            }
            8 => {
                let n = ranks - 1 + u32::from(u.arbitrary::<u8>()?) % 3;
                let mut sizes = Vec::new();
                for _ in 0..n {
                    sizes.push(u64::from(u.arbitrary::<u16>()?));
                }
                if let Ok(id) = self.node.start_allgather(self.now, &sizes) {
                    assert_eq!(sizes.len(), ranks as usize, "accepted a wrong sizes count");
                    assert_eq!(id.0, self.next_id, "ids go in order");
                    self.next_id += 1;
                    let shape = allgather_shape(&sizes);
                    self.ops.push((id, sizes, shape));
                }
            }
            k @ (1 | 14) => {
                let op = self.pick_op(u.arbitrary::<u8>()?);
                let chunk = u32::from(u.arbitrary::<u16>()?);
                let lane = u16::from(u.arbitrary::<u8>()?);
                let from = Rank(u32::from(u.arbitrary::<u8>()?));
                let len_mode = u.arbitrary::<u8>()?;
                let len = if len_mode == 0 {
                    c.chunk_size as usize
                } else {
                    usize::from(len_mode)
                };
                let tag = c.imm.tag_of(op.0);
                if let Some(imm) = c.imm.encode(Imm { op_tag: tag, chunk }) {
                    self.chunk(lane, from, imm, len, k == 14);
                }
                return Ok(());
            }
            2 => {
                let imm = u.arbitrary::<u32>()?;
                let lane = u16::from(u.arbitrary::<u8>()?);
                let from = Rank(u32::from(u.arbitrary::<u8>()?));
                let len = usize::from(u.arbitrary::<u16>()?);
                self.chunk(lane, from, imm, len, false);
                return Ok(());
            }
            3 => {
                let from = Rank(u32::from(u.arbitrary::<u8>()?));
                let n = usize::from(u.arbitrary::<u8>()?);
                let bytes = u.bytes(n.min(u.len()))?;
                self.ports.control.deliver(from, bytes);
            }
            4 => {
                let from = Rank(u32::from(u.arbitrary::<u8>()?) % (ranks + 1));
                let kind = u.arbitrary::<u8>()? % 10;
                let which = u.arbitrary::<u8>()?;
                let arg = u.arbitrary::<u32>()?;
                let op = match which {
                    255 => self.ops.last().map_or(0, |(id, ..)| id.0 + 1),
                    254 => self.next_id + u64::from(arg >> 8),
                    _ => self.pick_op(which).0,
                };
                let n = u.arbitrary::<u8>()? % 5;
                let mut runs = Vec::new();
                for _ in 0..n {
                    let start = u32::from(u.arbitrary::<u16>()?);
                    let len = u32::from(u.arbitrary::<u16>()?);
                    runs.push(ChunkRun { start, len });
                }
                let runs = RunList::Slice(&runs);
                let repr = match kind {
                    0 => ControlRepr::Ready {
                        op,
                        shape: match self.ops.iter().find(|(id, ..)| id.0 == op) {
                            Some(&(_, _, shape)) if arg & 1 == 0 => shape,
                            _ => arg,
                        },
                    },
                    1 => ControlRepr::Go { op },
                    2 => ControlRepr::Fetch { op, runs },
                    3 => ControlRepr::FetchAck {
                        op,
                        runs,
                        hops: arg,
                    },
                    4 => ControlRepr::FetchNack { op },
                    5 => ControlRepr::Fin { op },
                    6 => ControlRepr::Abort { op, culprit: arg },
                    7 => ControlRepr::Mismatch { op, culprit: arg },
                    8 => ControlRepr::Where { op },
                    _ => ControlRepr::Here {
                        op,
                        standing: match arg % 6 {
                            0 => Standing::Running,
                            1 => Standing::Ended,
                            2 => Standing::EndedApart,
                            3 => Standing::NotPosted,
                            4 => Standing::EndedAfter(arg >> 3),
                            _ => Standing::NotPostedAfter(arg >> 3),
                        },
                    },
                };
                let mut bytes = Vec::new();
                if repr.emit_vec(&mut bytes).is_ok() {
                    self.ports.control.deliver(from, &bytes);
                }
            }
            5 => {
                let which = u.arbitrary::<u8>()?;
                let ok = u.arbitrary::<u8>()? % 2 == 1;
                let id = match which {
                    // Never handed out (ids only grow; this one is past every id so far).
                    255 => Some(ReadId(
                        self.last_read.map_or(0, |r| r.0).wrapping_add(1 << 32),
                    )),
                    254 => self.reported.last().copied(),
                    _ if self.reads.is_empty() => None,
                    _ => {
                        let id = self
                            .reads
                            .swap_remove(usize::from(which) % self.reads.len());
                        if self.reported.len() < MAX_READS {
                            self.reported.push(id);
                        }
                        Some(id)
                    }
                };
                if let Some(id) = id {
                    let result = if ok { Ok(()) } else { Err(ReadError) };
                    self.ports.control.read_done(id, result);
                }
            }
            6 => {
                let lane = usize::from(u.arbitrary::<u8>()?) % self.sends.len();
                let which = usize::from(u.arbitrary::<u8>()?);
                let chunks = u32::from(u.arbitrary::<u8>()?).max(1);
                let sends = &mut self.sends[lane];
                if !sends.is_empty() {
                    let op = sends[which % sends.len()];
                    // Report as many of this op's sends as asked for (and were posted).
                    let mut done = 0;
                    sends.retain(|&o| {
                        let take = o == op && done < chunks;
                        done += u32::from(take);
                        !take
                    });
                    self.ports.tx[lane].complete(op, done);
                }
            }
            7 => {
                let jump = u.arbitrary::<u8>()? % 2 == 1;
                let advance = u64::from(u.arbitrary::<u32>()?);
                // Deliver what is queued first, so that the timers it arms count.
                self.pump_all();
                let next = match self.node.poll_timeout() {
                    Some(t) if jump => t.max(self.now),
                    _ => Instant::from_nanos(self.now.as_nanos().saturating_add(advance)),
                };
                self.now = next;
            }
            9 => {
                let budget = usize::from(u.arbitrary::<u8>()?);
                self.pump(budget);
                return Ok(());
            }
            11 => self.node.set_queued(u.arbitrary::<u8>()? % 2 == 1),
            12 => {
                let back = u64::from(u.arbitrary::<u16>()?);
                let culprit = Rank(u32::from(u.arbitrary::<u8>()?) % (ranks + 1));
                let seq = OpId(self.next_id.wrapping_sub(1).wrapping_sub(back));
                self.node.failed_elsewhere(seq, culprit);
            }
            15 => {
                assert_eq!(self.node.refuse_op().0, self.next_id, "ids go in order");
                self.next_id += 1;
            }
            13 => {
                let culprit = Rank(u32::from(u.arbitrary::<u8>()?) % (ranks + 1));
                assert_eq!(
                    self.node.abandon_op(culprit).0,
                    self.next_id,
                    "ids go in order"
                );
                self.next_id += 1;
            }
            _ => {
                for _ in 0..u.arbitrary::<u16>()? {
                    assert_eq!(self.node.skip_op().0, self.next_id, "ids go in order");
                    self.next_id += 1;
                }
            }
        }
        self.pump_all();
        Ok(())
    }

    fn pick_op(&self, which: u8) -> OpId {
        if self.ops.is_empty() {
            OpId(0)
        } else {
            self.ops[usize::from(which) % self.ops.len()].0
        }
    }

    /// Queues a chunk on its lane's receive port (`fails`: its copy fails); a lane the rank
    /// does not have goes to the node directly (no port carries it) and must be dropped.
    fn chunk(&mut self, lane: u16, from: Rank, imm: u32, len: usize, fails: bool) {
        let meta = RxMeta { from, imm, len };
        match self.ports.rx.get_mut(usize::from(lane)) {
            Some(rx) if fails => rx.push_failing(meta, Sent { lane, meta }),
            Some(rx) => rx.push(meta, Sent { lane, meta }),
            None => {
                let p = self.node.handle_chunk(lane, from, imm, len);
                assert_eq!(p, Placement::Drop(DropReason::WrongLane));
            }
        }
    }
}

fn run(data: &[u8]) -> Result<()> {
    let mut u = Unstructured::new(data);
    let ranks = 2 + u32::from(u.arbitrary::<u8>()?) % 7;
    let rank = u32::from(u.arbitrary::<u8>()?) % ranks;
    let mut config = Config::new(rank, ranks);
    config.lanes = 1 + u16::from(u.arbitrary::<u8>()?) % 4;
    config.chunk_size = 1 + u32::from(u.arbitrary::<u16>()?) % 8192;
    config.limits.max_inflight_ops = 1 + u32::from(u.arbitrary::<u8>()?) % 8;
    config.send_window = 1 + u32::from(u.arbitrary::<u8>()?) % 64;
    config.peer_timeout = Duration::from_micros(1 + u64::from(u.arbitrary::<u8>()?));
    config.cutoff_alpha = Duration::from_micros(u64::from(u.arbitrary::<u8>()?));
    let lanes = config.lanes;
    let node = Node::new(config).expect("the fuzzer builds only valid configurations");
    let mut d = Driver {
        node,
        ports: mailbox(lanes),
        now: Instant::ZERO,
        ops: Vec::new(),
        next_id: 0,
        ended: BTreeSet::new(),
        reads: Vec::new(),
        reported: Vec::new(),
        last_read: None,
        sends: vec![VecDeque::new(); usize::from(lanes)],
        buf: Vec::new(),
    };
    let mut steps = 0;
    while steps < MAX_STEPS && !u.is_empty() {
        steps += 1;
        if d.step(&mut u).is_err() {
            break;
        }
    }
    // Whatever is still queued reaches the node.
    d.pump_all();
    Ok(())
}

fuzz_target!(|data: &[u8]| {
    let _ = run(data);
});
