//! One collective operation at one rank: a Broadcast, or an Allgather(v) composed of one
//! broadcast per rank. Both share this state machine: a Broadcast is an Allgatherv in which
//! only the root's block is non-empty.
//!
//! Life of an operation at one rank:
//! 1. `Barrier` (see `barrier`): every rank has posted its receives and said `Ready` to the
//!    hub (the Broadcast root, or rank 0); the hub answers `Go`.
//! 2. `Data`: active roots multicast their blocks (an Allgather activates roots chain by chain,
//!    see `schedule`). Chunks arrive in any order and are recorded in per-lane bitmaps. The
//!    cutoff timer (`N / B + alpha`) ends the fast path; then a rank fetches what it misses
//!    from its ring predecessor (see `ring`).
//! 3. A rank that holds every chunk and has no read in flight sends `Fin` to its predecessor;
//!    it completes once its successor's `Fin` arrived and its own sends are done.

use crate::bitmap::ChunkBitmap;
use crate::config::{Config, Rank};
use crate::event::{DropReason, OpError, OpId, Placement, StartError};
use crate::layout::{Layout, Piece};
use crate::out::{ControlMsg, Ctx, Outcome};
use crate::schedule::Chains;
use crate::time::Instant;
use crate::wire::{ChunkRun, ControlKind, Imm};
use alloc::vec::Vec;
use bitvec::prelude::*;
use core::time::Duration;

/// Which step of the operation this rank is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    Barrier,
    Data,
}

/// A deadline on a peer that owes us an answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Wait {
    pub(crate) peer: Rank,
    pub(crate) deadline: Instant,
}

/// A fetch request outstanding at our ring predecessor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Fetch {
    /// Requested runs not acknowledged yet.
    pub(crate) pending: Vec<ChunkRun>,
    /// Reads in flight, each with the recovery depth its data will have.
    pub(crate) reads: Vec<(ChunkRun, u32)>,
}

/// Runs our successor asked for that we did not hold yet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Deferred {
    pub(crate) runs: Vec<ChunkRun>,
    pub(crate) keepalive_at: Instant,
}

/// One collective at one rank.
#[derive(Debug)]
pub(crate) struct Collective {
    pub(crate) id: OpId,
    pub(crate) tag: u32,
    pub(crate) me: Rank,
    pub(crate) pred: Rank,
    pub(crate) succ: Rank,
    /// The barrier's gathering point.
    pub(crate) hub: Rank,
    pub(crate) layout: Layout,
    /// One bitmap per lane, indexed lane-relative.
    pub(crate) lanes: Vec<ChunkBitmap>,
    pub(crate) phase: Phase,
    /// Hub only: which ranks said `Ready`.
    pub(crate) ready: BitVec<u64, Lsb0>,
    pub(crate) ready_count: u32,
    /// Sending our own block: allowed once activated (and in `Data`).
    pub(crate) activated: bool,
    pub(crate) chain_next: Option<Rank>,
    pub(crate) chain_prev: Option<Rank>,
    pub(crate) next_send: u32,
    pub(crate) sent: u32,
    pub(crate) sends_done: u32,
    pub(crate) token_passed: bool,
    pub(crate) cutoff_at: Option<Instant>,
    pub(crate) cutoff_fired: bool,
    pub(crate) cutoff_after: Duration,
    pub(crate) wait: Option<Wait>,
    pub(crate) fetch: Option<Fetch>,
    pub(crate) deferred: Option<Deferred>,
    pub(crate) fin_sent: bool,
    pub(crate) fin_received: bool,
    /// What we recovered by reads, with the length of the chain of reads behind each piece.
    pub(crate) recovered: Vec<(ChunkRun, u32)>,
}

impl Collective {
    /// A Broadcast of `len` bytes from `root`.
    pub(crate) fn broadcast(
        cx: &Ctx<'_>,
        id: OpId,
        root: Rank,
        len: u64,
    ) -> Result<Self, StartError> {
        let c = cx.config;
        if root.0 >= c.ranks {
            return Err(StartError::RootOutOfRange);
        }
        let mut sizes = alloc::vec![0u64; c.ranks as usize];
        sizes[root.index()] = len;
        let mut op = Self::new(c, id, root, &sizes)?;
        op.activated = c.rank == root;
        Ok(op)
    }

    /// An Allgatherv with block `r` of `sizes[r]` bytes.
    pub(crate) fn allgather(cx: &Ctx<'_>, id: OpId, sizes: &[u64]) -> Result<Self, StartError> {
        let c = cx.config;
        if sizes.len() != c.ranks as usize {
            return Err(StartError::SizesLength {
                got: sizes.len(),
                ranks: c.ranks,
            });
        }
        let chains = Chains::new(c.ranks, c.chains);
        let mut op = Self::new(c, id, Rank(0), sizes)?;
        op.activated = chains.is_head(c.rank);
        op.chain_next = chains.next(c.rank);
        op.chain_prev = chains.prev(c.rank);
        // Each step needs a token to travel; give the cutoff slack for every step.
        op.cutoff_after += c.cutoff_alpha * chains.steps().saturating_sub(1);
        Ok(op)
    }

    fn new(c: &Config, id: OpId, hub: Rank, sizes: &[u64]) -> Result<Self, StartError> {
        let max = c.limits.max_chunks_per_op;
        let chunks: u64 = sizes
            .iter()
            .map(|s| s.div_ceil(u64::from(c.chunk_size)))
            .sum();
        if chunks > u64::from(max) {
            return Err(StartError::TooLarge { chunks, max });
        }
        let layout = Layout::new(sizes, c.chunk_size, c.lanes)
            .ok_or(StartError::TooLarge { chunks, max })?;
        let me = c.rank;
        let p = c.ranks;
        let lanes: Vec<ChunkBitmap> = (0..layout.lanes())
            .map(|l| {
                let mut b = ChunkBitmap::new(layout.lane_len(l));
                // Our own block is ours from the start; its loopback is never "received".
                let own = ChunkRun {
                    start: layout.lane_index(me.0, l),
                    len: layout.lane_count(me.0, l),
                };
                b.insert_run(own);
                b
            })
            .collect();
        let wire = transfer_time(c, layout.bytes());
        Ok(Collective {
            id,
            tag: c.imm.tag_of(id.0),
            me,
            pred: Rank((me.0 + p - 1) % p),
            succ: Rank((me.0 + 1) % p),
            hub,
            layout,
            lanes,
            phase: Phase::Barrier,
            ready: if me == hub {
                bitvec![u64, Lsb0; 0; p as usize]
            } else {
                BitVec::new()
            },
            ready_count: 0,
            activated: false,
            chain_next: None,
            chain_prev: None,
            next_send: 0,
            sent: 0,
            sends_done: 0,
            token_passed: false,
            cutoff_at: None,
            cutoff_fired: false,
            cutoff_after: wire + c.cutoff_alpha,
            wait: None,
            fetch: None,
            deferred: None,
            fin_sent: false,
            fin_received: false,
            recovered: Vec::new(),
        })
    }

    pub(crate) fn own_chunks(&self) -> u32 {
        self.layout.block_chunks(self.me.0)
    }

    /// The next multicast of our own block, if we are an active root with sends left.
    pub(crate) fn next_multicast(&mut self, config: &Config) -> Option<(u16, u32, u32, u64, u32)> {
        if !self.activated || self.phase != Phase::Data {
            return None;
        }
        // Interleave lanes so every lane's group carries traffic from the start: slot `i` is
        // position `i / k` of lane `i % k` (the last lanes may be shorter).
        let k = self.layout.lanes();
        let own = self.own_chunks();
        let per_lane = self.layout.per_lane(self.me.0).max(1);
        while self.sent < own && self.next_send < k * per_lane {
            let i = self.next_send;
            self.next_send += 1;
            let (lane, pos) = (i % k, i / k);
            if pos >= self.layout.lane_count(self.me.0, lane) {
                continue;
            }
            let chunk = lane * per_lane + pos;
            self.sent += 1;
            let imm = config.imm.encode(Imm {
                op_tag: self.tag,
                chunk,
            })?;
            let (offset, len) = self.layout.chunk_bytes(self.me.0, chunk);
            return Some((lane as u16, chunk, imm, offset, len as u32));
        }
        None
    }

    /// Multicast sends still owed to the transport.
    pub(crate) fn sends_pending(&self) -> bool {
        self.activated && self.phase == Phase::Data && self.sent < self.own_chunks()
    }

    /// Fast path: a chunk arrived. Returns where it goes.
    #[inline]
    pub(crate) fn on_chunk(
        &mut self,
        lane: u16,
        from: Rank,
        chunk: u32,
        payload: usize,
    ) -> Placement {
        if from == self.me {
            return Placement::Drop(DropReason::Own);
        }
        if from.0 >= self.layout.ranks() || self.layout.block_chunks(from.0) == 0 {
            return Placement::Drop(DropReason::WrongSource);
        }
        let Some(slot) = self.layout.slot(from.0, chunk) else {
            return Placement::Drop(DropReason::OutOfRange);
        };
        if slot.lane != u32::from(lane) {
            return Placement::Drop(DropReason::WrongLane);
        }
        let (offset, len) = self.layout.chunk_bytes(from.0, chunk);
        if payload as u64 != len {
            return Placement::Drop(DropReason::BadLength);
        }
        // The only mutable state a chunk touches is its own lane's bitmap.
        if !self.lanes[slot.lane as usize].insert(slot.index) {
            return Placement::Drop(DropReason::Duplicate);
        }
        Placement::Place {
            op: self.id,
            offset,
            len: len as u32,
        }
    }

    /// Whether work may remain after a new chunk on `lane` (the session calls `progress` if
    /// so): the lane just filled up, or a deferred request may now be answerable.
    #[inline]
    pub(crate) fn wants_progress(&self, lane: u16) -> bool {
        self.lanes
            .get(usize::from(lane))
            .is_some_and(|b| b.is_full())
            || self.deferred.is_some()
    }

    /// Chunks still missing, over all lanes (slow path only: it reads every lane).
    pub(crate) fn missing(&self) -> u32 {
        self.lanes.iter().map(|b| b.missing()).sum()
    }

    pub(crate) fn on_send_done(&mut self, cx: &mut Ctx<'_>, n: u32) -> Option<Outcome> {
        self.sends_done = self.sends_done.saturating_add(n).min(self.sent);
        self.progress(cx)
    }

    /// Earliest timer of this operation.
    pub(crate) fn next_timeout(&self) -> Option<Instant> {
        let cutoff = self
            .cutoff_at
            .filter(|_| !self.cutoff_fired && self.missing() > 0);
        let keepalive = self.deferred.as_ref().map(|d| d.keepalive_at);
        [cutoff, keepalive, self.wait.map(|w| w.deadline)]
            .into_iter()
            .flatten()
            .min()
    }

    pub(crate) fn on_timeout(&mut self, cx: &mut Ctx<'_>) -> Option<Outcome> {
        let now = cx.now;
        if let Some(w) = self.wait.filter(|w| w.deadline <= now) {
            let peer = if self.me == self.hub && self.phase == Phase::Barrier {
                self.first_unready().unwrap_or(w.peer)
            } else {
                w.peer
            };
            return Some(Outcome::Failed {
                error: OpError::PeerUnresponsive { peer },
                abort: true,
            });
        }
        if self.cutoff_at.is_some_and(|t| t <= now) && !self.cutoff_fired {
            self.cutoff_fired = true;
            self.start_fetch(cx, None);
        }
        if self
            .deferred
            .as_ref()
            .is_some_and(|d| d.keepalive_at <= now)
        {
            self.keepalive(cx);
        }
        None
    }

    /// Everything that may follow new data or a finished send/read: answer a deferred request
    /// that is now fully held, pass the chain token, send `Fin`, complete.
    pub(crate) fn progress(&mut self, cx: &mut Ctx<'_>) -> Option<Outcome> {
        if self
            .deferred
            .as_ref()
            .is_some_and(|d| d.runs.iter().all(|r| self.holds(*r)))
        {
            if let Some(d) = self.deferred.take() {
                self.send_ack(cx, d.runs);
            }
        }
        if self.activated && !self.token_passed && self.sends_done >= self.own_chunks() {
            self.token_passed = true;
            if let Some(next) = self.chain_next {
                cx.send(next, ControlMsg::simple(ControlKind::Activate, self.id.0));
            }
        }
        let reads_idle = self.fetch.as_ref().is_none_or(|f| f.reads.is_empty());
        if reads_idle && self.phase == Phase::Data && self.missing() == 0 {
            // An outstanding request is no longer needed, nor is its deadline.
            if self.fetch.take().is_some() && self.wait.is_some_and(|w| w.peer == self.pred) {
                self.wait = None;
            }
            if !self.fin_sent {
                self.fin_sent = true;
                cx.send(self.pred, ControlMsg::simple(ControlKind::Fin, self.id.0));
            }
            if self.fin_received {
                if self.sends_done >= self.own_chunks() {
                    return Some(Outcome::Completed);
                }
                self.wait = None;
            } else {
                self.wait_for_fin(cx);
            }
        }
        None
    }

    /// Expect the successor's `Fin`: it may still have to recover the whole buffer from us.
    fn wait_for_fin(&mut self, cx: &Ctx<'_>) {
        let from = self.cutoff_at.map_or(cx.now, |c| c.max(cx.now));
        let deadline =
            from + cx.config.peer_timeout + transfer_time(cx.config, self.layout.bytes());
        match &mut self.wait {
            Some(w) if w.peer == self.succ => w.deadline = w.deadline.max(deadline),
            Some(_) => {}
            None => {
                self.wait = Some(Wait {
                    peer: self.succ,
                    deadline,
                })
            }
        }
    }

    /// Any message from the rank we wait on shows it is alive: push its deadline out.
    pub(crate) fn heard_from(&mut self, cx: &Ctx<'_>, from: Rank) {
        if self.phase == Phase::Barrier && self.me == self.hub {
            return; // the hub waits on every rank at once; one answer says nothing of others
        }
        if let Some(w) = self.wait.as_mut().filter(|w| w.peer == from) {
            w.deadline = w.deadline.max(cx.now + cx.config.peer_timeout);
        }
    }

    /// A chain predecessor finished its block: our turn to multicast.
    pub(crate) fn on_activate(&mut self, cx: &mut Ctx<'_>, from: Rank) -> Option<Outcome> {
        if self.activated || self.chain_prev != Some(from) {
            crate::out::bump(&mut cx.stats.control_unexpected);
            return None;
        }
        self.activated = true;
        self.progress(cx)
    }

    /// Marks a run (global numbering) present; returns how many chunks were new.
    pub(crate) fn record_fetched(&mut self, run: ChunkRun) -> u32 {
        let parts: Vec<(u32, ChunkRun)> = self.split(run).collect();
        let mut new = 0;
        for (l, r) in parts {
            new += self.lanes[l as usize].insert_run(r);
        }
        new
    }

    /// Whether every chunk of `run` is present.
    pub(crate) fn holds(&self, run: ChunkRun) -> bool {
        run.end() <= self.layout.total()
            && self
                .split(run)
                .all(|(l, r)| self.lanes[l as usize].contains_run(r))
    }

    /// Missing (or, with `present`, held) chunks inside `within`, as maximal global runs
    /// appended to `out`, at most `max` runs in all.
    pub(crate) fn runs_within(
        &self,
        within: ChunkRun,
        present: bool,
        max: usize,
        out: &mut Vec<ChunkRun>,
    ) {
        for (l, r) in self.split(within) {
            let base = self.layout.lane_start(l);
            let map = &self.lanes[l as usize];
            for m in map.runs(r, present) {
                let g = ChunkRun {
                    start: m.start + base,
                    len: m.len,
                };
                let full = out.len() >= max;
                match out.last_mut() {
                    Some(last) if last.end() == g.start => last.len += g.len,
                    _ if full => return,
                    _ => out.push(g),
                }
            }
        }
    }

    /// Splits a global run into lane-relative runs.
    fn split(&self, run: ChunkRun) -> impl Iterator<Item = (u32, ChunkRun)> + '_ {
        let end = run.end().min(self.layout.total());
        (0..self.layout.lanes()).filter_map(move |l| {
            let base = self.layout.lane_start(l);
            let s = run.start.max(base);
            let e = end.min(base + self.layout.lane_len(l));
            (s < e).then(|| {
                (
                    l,
                    ChunkRun {
                        start: s - base,
                        len: e - s,
                    },
                )
            })
        })
    }

    /// Byte pieces of a global run.
    pub(crate) fn pieces(&self, run: ChunkRun, out: &mut Vec<Piece>) {
        self.layout.pieces(run, out)
    }

    pub(crate) fn begin_data(&mut self, cx: &mut Ctx<'_>) {
        self.phase = Phase::Data;
        self.wait = None;
        self.cutoff_at = Some(cx.now + self.cutoff_after);
    }
}

/// Time to move `bytes` over one link.
pub(crate) fn transfer_time(config: &Config, bytes: u64) -> Duration {
    let ns = u128::from(bytes) * 1_000_000_000 / u128::from(config.link_bandwidth);
    Duration::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX))
}

/// How often a rank that is recovering on behalf of its successor says so.
pub(crate) fn keepalive_interval(config: &Config) -> Duration {
    (config.peer_timeout / 3).max(Duration::from_nanos(1))
}
