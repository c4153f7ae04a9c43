//! The session state machine fed an arbitrary sequence of inputs: it never panics, its outputs
//! stay inside the buffers they name, and what it holds stays within its configured limits.
//!
//! Input format (integers little-endian, as `arbitrary` reads them; missing bytes read as 0).
//! `cargo xtask fuzz-seed` writes seeds in this format; keep the two in step.
//!
//! Header, 9 bytes: `ranks u8` (2 + x % 7), `rank u8` (% ranks), `lanes u8` (1 + x % 4),
//! `chunk_size u16` (1 + x % 8192), `max_inflight u8` (1 + x % 8), `send_window u8` (1 + x % 64),
//! `peer_timeout_us u8` (1 + x), `alpha_us u8`.
//!
//! Then steps until the input ends, each `kind u8` (% 9) and its fields:
//! * 0 start: `root u8` (% (ranks + 1): may be out of range), `len u16` (bytes)
//! * 1 chunk, valid immediate: `op u8` (index into started ops, modulo), `chunk u16`,
//!   `lane u8`, `from u8`, `len_mode u8` (0: the chunk's size, else the raw byte)
//! * 2 chunk, raw: `imm u32`, `lane u8`, `from u8`, `len u16`
//! * 3 control, raw bytes: `from u8`, `n u8`, then `n` bytes
//! * 4 control, well-formed: `from u8`, `kind u8` (% 7), `op u8` (index into started ops; 255:
//!   the op after the last one), `arg u32` (FetchAck's hops, Abort's culprit), `runs u8` (% 5), then per run `start u16`, `len u16`
//! * 5 read done: `which u8` (index into reads handed out), `ok u8` (odd: success)
//! * 6 send done: `which u8` (index into multicasts handed out), `chunks u8`
//! * 7 timeout: `mode u8` (odd: jump to `poll_timeout()`), `advance_ns u32`
//! * 8 start allgather: `n u8` (ranks - 1 + x % 3 sizes: may be the wrong count), then `n` times
//!   `size u16` (bytes contributed by that rank)
#![no_main]

use arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use ringcast_core::wire::{ChunkRun, ControlRepr, Imm, RunList};
use ringcast_core::{Config, Event, Instant, OpId, Placement, Rank, Session, Transmit};
use std::time::Duration;

/// Most steps of one input, so that one input cannot run for long.
const MAX_STEPS: usize = 4096;
/// Most outputs one drain may produce: anything more means the session loops.
const MAX_DRAIN: usize = 1 << 16;

struct Driver {
    s: Session,
    now: Instant,
    /// Started operations: id and the bytes each rank contributes (a Broadcast: only the root).
    ops: Vec<(OpId, Vec<u64>)>,
    /// Reads handed out and not reported back.
    reads: Vec<(OpId, ChunkRun)>,
    /// Multicasts handed out and not reported back.
    sends: Vec<OpId>,
    buf: Vec<u8>,
}

impl Driver {
    fn sizes(&self, op: OpId) -> &[u64] {
        self.ops
            .iter()
            .find(|(id, _)| *id == op)
            .map(|(_, sizes)| sizes.as_slice())
            .expect("output for an operation that was never started")
    }

    /// The operation's buffer: every rank's block, concatenated.
    fn op_len(&self, op: OpId) -> u64 {
        self.sizes(op).iter().sum()
    }

    /// Where `rank`'s block starts in the operation's buffer.
    fn displ(&self, op: OpId, rank: Rank) -> u64 {
        self.sizes(op).iter().take(rank.index()).sum()
    }

    fn drain(&mut self) {
        let c = self.s.config().clone();
        let mut n = 0;
        while let Some(t) = self.s.poll_transmit(&mut self.buf) {
            n += 1;
            assert!(n < MAX_DRAIN, "poll_transmit does not run dry");
            match t {
                Transmit::Multicast {
                    op,
                    lane,
                    imm,
                    chunk,
                    offset,
                    len,
                } => {
                    // A rank multicasts only its own block.
                    let own = self.displ(op, c.rank);
                    assert!(offset >= own);
                    assert!(offset + u64::from(len) <= own + self.sizes(op)[c.rank.index()]);
                    assert!(len <= c.chunk_size && len > 0);
                    assert!(lane < c.lanes);
                    let _ = (imm, chunk);
                    // Bounded like the transport's send queue would be.
                    if self.sends.len() < 256 {
                        self.sends.push(op);
                    }
                }
                Transmit::Control { to, len } => {
                    assert!(to.0 < c.ranks && to != c.rank);
                    assert_eq!(len, self.buf.len());
                    assert!(len <= c.limits.max_control_len);
                    assert!(ControlRepr::parse_bytes(&self.buf).is_ok());
                }
                Transmit::Read {
                    op,
                    from,
                    run,
                    offset,
                    len,
                } => {
                    assert!(from.0 < c.ranks && from != c.rank);
                    assert!(offset + len <= self.op_len(op));
                    assert!(run.len > 0);
                    if self.reads.len() < 256 {
                        self.reads.push((op, run));
                    }
                }
                _ => {}
            }
        }
        let mut n = 0;
        while let Some(e) = self.s.poll_event() {
            n += 1;
            assert!(n < MAX_DRAIN, "poll_event does not run dry");
            let (Event::Completed { op } | Event::Failed { op, .. }) = e else {
                continue;
            };
            assert!(self.ops.iter().any(|(id, _)| *id == op));
        }
        assert!(self.s.inflight() <= c.limits.max_inflight_ops as usize);
    }

    fn step(&mut self, u: &mut Unstructured<'_>) -> Result<()> {
        let c = self.s.config().clone();
        let ranks = c.ranks;
        match u.arbitrary::<u8>()? % 9 {
            0 => {
                let root = Rank(u32::from(u.arbitrary::<u8>()?) % (ranks + 1));
                let len = u64::from(u.arbitrary::<u16>()?);
                if let Ok(id) = self.s.start_broadcast(self.now, root, len) {
                    let mut sizes = vec![0; ranks as usize];
                    sizes[root.index()] = len;
                    self.ops.push((id, sizes));
                }
            }
            8 => {
                let n = ranks - 1 + u32::from(u.arbitrary::<u8>()?) % 3;
                let mut sizes = Vec::new();
                for _ in 0..n {
                    sizes.push(u64::from(u.arbitrary::<u16>()?));
                }
                if let Ok(id) = self.s.start_allgather(self.now, &sizes) {
                    assert_eq!(sizes.len(), ranks as usize, "accepted a wrong sizes count");
                    self.ops.push((id, sizes));
                }
            }
            1 => {
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
                    self.chunk(lane, from, imm, len);
                }
            }
            2 => {
                let imm = u.arbitrary::<u32>()?;
                let lane = u16::from(u.arbitrary::<u8>()?);
                let from = Rank(u32::from(u.arbitrary::<u8>()?));
                let len = usize::from(u.arbitrary::<u16>()?);
                self.chunk(lane, from, imm, len);
            }
            3 => {
                let from = Rank(u32::from(u.arbitrary::<u8>()?));
                let n = usize::from(u.arbitrary::<u8>()?);
                let bytes = u.bytes(n.min(u.len()))?;
                self.s.handle_control(self.now, from, bytes);
            }
            4 => {
                let from = Rank(u32::from(u.arbitrary::<u8>()?) % (ranks + 1));
                let kind = u.arbitrary::<u8>()? % 7;
                let which = u.arbitrary::<u8>()?;
                let op = if which == 255 {
                    self.ops.last().map_or(0, |(id, _)| id.0 + 1)
                } else {
                    self.pick_op(which).0
                };
                let arg = u.arbitrary::<u32>()?;
                let n = u.arbitrary::<u8>()? % 5;
                let mut runs = Vec::new();
                for _ in 0..n {
                    let start = u32::from(u.arbitrary::<u16>()?);
                    let len = u32::from(u.arbitrary::<u16>()?);
                    runs.push(ChunkRun { start, len });
                }
                let runs = RunList::Slice(&runs);
                let repr = match kind {
                    0 => ControlRepr::Ready { op },
                    1 => ControlRepr::Go { op },
                    2 => ControlRepr::Fetch { op, runs },
                    3 => ControlRepr::FetchAck {
                        op,
                        runs,
                        hops: arg,
                    },
                    4 => ControlRepr::FetchNack { op },
                    5 => ControlRepr::Fin { op },
                    _ => ControlRepr::Abort { op, culprit: arg },
                };
                let mut bytes = Vec::new();
                if repr.emit_vec(&mut bytes).is_ok() {
                    self.s.handle_control(self.now, from, &bytes);
                }
            }
            5 => {
                let which = usize::from(u.arbitrary::<u8>()?);
                let ok = u.arbitrary::<u8>()? % 2 == 1;
                if !self.reads.is_empty() {
                    let (op, run) = self.reads.swap_remove(which % self.reads.len());
                    let result = if ok {
                        Ok(())
                    } else {
                        Err(ringcast_core::ReadError)
                    };
                    self.s.handle_read_done(self.now, op, run, result);
                }
            }
            6 => {
                let which = usize::from(u.arbitrary::<u8>()?);
                let chunks = u32::from(u.arbitrary::<u8>()?).max(1);
                if !self.sends.is_empty() {
                    let i = which % self.sends.len();
                    let op = self.sends[i];
                    // Report as many of this op's sends as asked for (and were handed out).
                    let mut done = 0;
                    self.sends.retain(|&o| {
                        let take = o == op && done < chunks;
                        done += u32::from(take);
                        !take
                    });
                    self.s.handle_send_done(self.now, op, done);
                }
            }
            _ => {
                let jump = u.arbitrary::<u8>()? % 2 == 1;
                let advance = u64::from(u.arbitrary::<u32>()?);
                let next = match self.s.poll_timeout() {
                    Some(t) if jump => t.max(self.now),
                    _ => Instant::from_nanos(self.now.as_nanos().saturating_add(advance)),
                };
                self.now = next;
                self.s.handle_timeout(self.now);
                self.drain();
                // Everything due has been handled: the driver would otherwise spin.
                if let Some(t) = self.s.poll_timeout() {
                    assert!(t > self.now, "timer at {t:?} still due at {:?}", self.now);
                }
            }
        }
        self.drain();
        Ok(())
    }

    fn pick_op(&self, which: u8) -> OpId {
        if self.ops.is_empty() {
            OpId(0)
        } else {
            self.ops[usize::from(which) % self.ops.len()].0
        }
    }

    fn chunk(&mut self, lane: u16, from: Rank, imm: u32, len: usize) {
        let c = self.s.config();
        let chunk_size = c.chunk_size;
        let decoded = c.imm.decode(imm);
        match self.s.handle_chunk(self.now, lane, from, imm, len) {
            Placement::Place { op, offset, len: n } => {
                assert_eq!(n as usize, len, "placed a payload of the wrong length");
                assert!(n <= chunk_size);
                // The immediate names the chunk within the sender's block.
                let block = self.displ(op, from);
                assert_eq!(
                    offset,
                    block + u64::from(decoded.chunk) * u64::from(chunk_size)
                );
                assert!(offset + u64::from(n) <= block + self.sizes(op)[from.index()]);
            }
            Placement::Drop(_) => {}
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
    let s = Session::new(config).expect("the fuzzer builds only valid configurations");
    let mut d = Driver {
        s,
        now: Instant::ZERO,
        ops: Vec::new(),
        reads: Vec::new(),
        sends: Vec::new(),
        buf: Vec::new(),
    };
    for _ in 0..MAX_STEPS {
        if u.is_empty() {
            break;
        }
        d.step(&mut u)?;
    }
    Ok(())
}

fuzz_target!(|data: &[u8]| {
    let _ = run(data);
});
