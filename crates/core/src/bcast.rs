//! The Broadcast operation: one root multicasts its buffer once; leaves track chunks in
//! per-lane bitmaps and recover what they missed through the ring (see `ring`), behind an RNR
//! barrier (see `barrier`).
//!
//! Life of an operation at one rank:
//! 1. `Barrier`: a leaf has posted its receives and sent `Ready` to the root; the root collects
//!    every `Ready`, then sends `Go` to all leaves and starts multicasting.
//! 2. `Data`: chunks arrive in any order. A leaf's cutoff timer (`N / B + alpha` after `Go`)
//!    ends the fast path; then it fetches what is missing from its ring predecessor.
//! 3. A rank that holds every chunk and has no read in flight sends `Fin` to its predecessor;
//!    it completes once its successor's `Fin` arrived (and, at the root, every send is done).

use crate::bitmap::ChunkBitmap;
use crate::config::{Config, Rank};
use crate::event::{DropReason, OpError, OpId, Placement, StartError};
use crate::out::{ControlMsg, Ctx, Outcome};
use crate::time::Instant;
use crate::wire::{ChunkRun, ControlKind};
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
    pub(crate) runs: Vec<ChunkRun>,
    /// Reads issued after the ACK that have not completed yet.
    pub(crate) reads_left: u32,
    pub(crate) acked: bool,
}

/// A request from our successor that we could not answer yet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Deferred {
    pub(crate) runs: Vec<ChunkRun>,
    pub(crate) keepalive_at: Instant,
}

/// Contiguous blocks of the chunk space, one bitmap per lane.
#[derive(Clone, Debug)]
pub(crate) struct Lanes {
    per_lane: u32,
    maps: Vec<ChunkBitmap>,
}

impl Lanes {
    fn new(chunks: u32, lanes: u16, full: bool) -> Self {
        let k = u32::from(lanes).clamp(1, chunks.max(1));
        let per_lane = chunks.div_ceil(k).max(1);
        let maps = (0..k)
            .map(|l| {
                let n = chunks.saturating_sub(l * per_lane).min(per_lane);
                if full {
                    ChunkBitmap::full(n)
                } else {
                    ChunkBitmap::new(n)
                }
            })
            .collect();
        Lanes { per_lane, maps }
    }

    #[inline]
    fn lane_of(&self, chunk: u32) -> usize {
        (chunk / self.per_lane) as usize
    }

    fn contains_run(&self, run: ChunkRun) -> bool {
        self.split(run).all(|(l, r)| self.maps[l].contains_run(r))
    }

    fn insert_run(&mut self, run: ChunkRun) -> u32 {
        let parts: Vec<_> = self.split(run).collect();
        parts
            .into_iter()
            .map(|(l, r)| self.maps[l].insert_run(r))
            .sum()
    }

    /// Splits a global run into lane-relative runs.
    fn split(&self, run: ChunkRun) -> impl Iterator<Item = (usize, ChunkRun)> + '_ {
        let end = run.end();
        let first = self.lane_of(run.start);
        (first..self.maps.len()).map_while(move |l| {
            let base = l as u32 * self.per_lane;
            let s = run.start.max(base);
            let e = end.min(base + self.maps[l].len());
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

    /// Missing runs inside `within` in global numbering, merged across lane borders.
    fn missing_runs(&self, within: ChunkRun, max: usize, out: &mut Vec<ChunkRun>) {
        for (l, r) in self.split(within) {
            let base = l as u32 * self.per_lane;
            for m in self.maps[l].missing_runs(r) {
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
}

/// One Broadcast at one rank.
#[derive(Debug)]
pub(crate) struct Broadcast {
    pub(crate) id: OpId,
    pub(crate) tag: u32,
    pub(crate) root: Rank,
    pub(crate) me: Rank,
    pub(crate) pred: Rank,
    pub(crate) succ: Rank,
    pub(crate) len: u64,
    pub(crate) chunks: u32,
    chunk_size: u32,
    pub(crate) lanes: Lanes,
    pub(crate) missing: u32,
    pub(crate) phase: Phase,
    /// Root only: which leaves said `Ready`.
    pub(crate) ready: BitVec<u64, Lsb0>,
    pub(crate) ready_count: u32,
    /// Root only: next chunk to multicast, and sends not yet reported done.
    pub(crate) next_send: u32,
    pub(crate) sent: u32,
    pub(crate) sends_done: u32,
    pub(crate) cutoff_at: Option<Instant>,
    pub(crate) cutoff_fired: bool,
    pub(crate) wait: Option<Wait>,
    pub(crate) fetch: Option<Fetch>,
    pub(crate) deferred: Option<Deferred>,
    pub(crate) fin_sent: bool,
    pub(crate) fin_received: bool,
    /// Longest chain of ring reads behind our recovered data (0: none).
    pub(crate) hops: u32,
}

impl Broadcast {
    /// Number of chunks of a `len`-byte buffer, or why it cannot be an operation.
    pub(crate) fn chunks_for(config: &Config, len: u64) -> Result<u32, StartError> {
        let chunks = len.div_ceil(u64::from(config.chunk_size));
        let max = config.limits.max_chunks_per_op;
        u32::try_from(chunks)
            .ok()
            .filter(|c| *c <= max)
            .ok_or(StartError::TooLarge { chunks, max })
    }

    pub(crate) fn new(
        cx: &mut Ctx<'_>,
        id: OpId,
        root: Rank,
        len: u64,
    ) -> Result<Self, StartError> {
        let c = cx.config;
        if root.0 >= c.ranks {
            return Err(StartError::RootOutOfRange);
        }
        let chunks = Self::chunks_for(c, len)?;
        let me = c.rank;
        let p = c.ranks;
        let is_root = me == root;
        let op = Broadcast {
            id,
            tag: c.imm.tag_of(id.0),
            root,
            me,
            pred: Rank((me.0 + p - 1) % p),
            succ: Rank((me.0 + 1) % p),
            len,
            chunks,
            chunk_size: c.chunk_size,
            lanes: Lanes::new(chunks, c.lanes, is_root),
            missing: if is_root { 0 } else { chunks },
            phase: Phase::Barrier,
            ready: if is_root {
                bitvec![u64, Lsb0; 0; p as usize]
            } else {
                BitVec::new()
            },
            ready_count: 0,
            next_send: 0,
            sent: 0,
            sends_done: 0,
            cutoff_at: None,
            cutoff_fired: false,
            wait: None,
            fetch: None,
            deferred: None,
            fin_sent: false,
            fin_received: false,
            hops: 0,
        };
        Ok(op)
    }

    pub(crate) fn is_root(&self) -> bool {
        self.me == self.root
    }

    /// Byte range of a run of chunks.
    pub(crate) fn byte_range(&self, run: ChunkRun) -> (u64, u64) {
        let cs = u64::from(self.chunk_size);
        let start = u64::from(run.start) * cs;
        let end = (u64::from(run.end()) * cs).min(self.len);
        (start, end.saturating_sub(start))
    }

    /// Time to move the whole buffer over one link.
    pub(crate) fn wire_time(&self, config: &Config) -> Duration {
        let ns = u128::from(self.len) * 1_000_000_000 / u128::from(config.link_bandwidth);
        Duration::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX))
    }

    /// The next multicast to hand to the transport, if the root has one.
    pub(crate) fn next_multicast(&mut self, config: &Config) -> Option<(u16, u32, u32, u64, u32)> {
        if !self.is_root() || self.phase != Phase::Data {
            return None;
        }
        // Interleave lanes so every lane's group carries traffic from the start; slot `i`
        // is position `i / k` of lane `i % k` (the last lane may be shorter).
        let k = self.lanes.maps.len() as u32;
        while self.next_send < self.total_send_slots() {
            let i = self.next_send;
            self.next_send += 1;
            let (lane, pos) = (i % k, i / k);
            if pos >= self.lanes.maps[lane as usize].len() {
                continue;
            }
            let chunk = lane * self.lanes.per_lane + pos;
            self.sent += 1;
            let imm = config.imm.encode(crate::wire::Imm {
                op_tag: self.tag,
                chunk,
            })?;
            let (offset, len) = self.byte_range(ChunkRun {
                start: chunk,
                len: 1,
            });
            return Some((lane as u16, chunk, imm, offset, len as u32));
        }
        None
    }

    /// Multicast sends still owed to the transport.
    pub(crate) fn sends_pending(&self) -> bool {
        self.is_root() && self.phase == Phase::Data && self.sent < self.chunks
    }

    fn total_send_slots(&self) -> u32 {
        self.lanes.maps.len() as u32 * self.lanes.per_lane
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
        if from != self.root {
            return Placement::Drop(DropReason::WrongSource);
        }
        if self.is_root() {
            return Placement::Drop(DropReason::Own);
        }
        if chunk >= self.chunks {
            return Placement::Drop(DropReason::OutOfRange);
        }
        let l = self.lanes.lane_of(chunk);
        if l != usize::from(lane) {
            return Placement::Drop(DropReason::WrongLane);
        }
        let (offset, len) = self.byte_range(ChunkRun {
            start: chunk,
            len: 1,
        });
        if payload as u64 != len {
            return Placement::Drop(DropReason::BadLength);
        }
        let base = l as u32 * self.lanes.per_lane;
        if !self.lanes.maps[l].insert(chunk - base) {
            return Placement::Drop(DropReason::Duplicate);
        }
        self.missing -= 1;
        Placement::Place {
            op: self.id,
            offset,
            len: len as u32,
        }
    }

    /// Whether work remains after new chunks arrived (the session calls `progress` if so).
    #[inline]
    pub(crate) fn wants_progress(&self) -> bool {
        self.missing == 0 || self.deferred.is_some()
    }

    pub(crate) fn on_send_done(&mut self, cx: &mut Ctx<'_>, n: u32) -> Option<Outcome> {
        self.sends_done = self.sends_done.saturating_add(n).min(self.sent);
        self.progress(cx)
    }

    /// Earliest timer of this operation.
    pub(crate) fn next_timeout(&self) -> Option<Instant> {
        let cutoff = self
            .cutoff_at
            .filter(|_| !self.cutoff_fired && self.missing > 0);
        let keepalive = self.deferred.as_ref().map(|d| d.keepalive_at);
        [cutoff, keepalive, self.wait.map(|w| w.deadline)]
            .into_iter()
            .flatten()
            .min()
    }

    pub(crate) fn on_timeout(&mut self, cx: &mut Ctx<'_>) -> Option<Outcome> {
        let now = cx.now;
        if let Some(w) = self.wait.filter(|w| w.deadline <= now) {
            let peer = if self.is_root() && self.phase == Phase::Barrier {
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
            if self.missing > 0 {
                self.start_fetch(cx, None);
            }
        }
        let interval = keepalive_interval(cx.config);
        if let Some(d) = self.deferred.as_mut().filter(|d| d.keepalive_at <= now) {
            d.keepalive_at = now + interval;
            cx.send(
                self.succ,
                ControlMsg::simple(ControlKind::FetchNack, self.id.0),
            );
        }
        None
    }

    /// Everything that may follow new data or a finished send/read: answer a deferred request,
    /// send `Fin`, complete.
    pub(crate) fn progress(&mut self, cx: &mut Ctx<'_>) -> Option<Outcome> {
        if let Some(d) = self.deferred.take() {
            if d.runs.iter().all(|r| self.lanes.contains_run(*r)) {
                self.send_ack(cx, d.runs);
            } else {
                self.deferred = Some(d);
            }
        }
        let reads_idle = self
            .fetch
            .as_ref()
            .is_none_or(|f| !f.acked || f.reads_left == 0);
        if self.missing == 0 && reads_idle {
            // An outstanding request is no longer needed, nor is its deadline.
            if self.fetch.take().is_some() && self.wait.is_some_and(|w| w.peer == self.pred) {
                self.wait = None;
            }
            if !self.fin_sent && !self.is_root() {
                self.fin_sent = true;
                cx.send(self.pred, ControlMsg::simple(ControlKind::Fin, self.id.0));
            }
            if self.fin_received {
                if !self.is_root() || self.sends_done >= self.chunks {
                    return Some(Outcome::Completed);
                }
                self.wait = None;
            } else if self.phase == Phase::Data {
                self.wait_for_fin(cx);
            }
        }
        None
    }

    /// Expect the successor's `Fin`: it may still have to recover the whole buffer from us.
    fn wait_for_fin(&mut self, cx: &Ctx<'_>) {
        let from = self.cutoff_at.map_or(cx.now, |c| c.max(cx.now));
        let deadline = from + cx.config.peer_timeout + self.wire_time(cx.config);
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
        if self.phase == Phase::Barrier && self.is_root() {
            return; // the root waits on every leaf at once; one answer says nothing of others
        }
        if let Some(w) = self.wait.as_mut().filter(|w| w.peer == from) {
            w.deadline = w.deadline.max(cx.now + cx.config.peer_timeout);
        }
    }

    pub(crate) fn record_fetched(&mut self, run: ChunkRun) -> u32 {
        let new = self.lanes.insert_run(run);
        self.missing -= new;
        new
    }

    pub(crate) fn holds(&self, run: ChunkRun) -> bool {
        self.lanes.contains_run(run)
    }

    pub(crate) fn missing_runs(&self, within: ChunkRun, max: usize, out: &mut Vec<ChunkRun>) {
        self.lanes.missing_runs(within, max, out)
    }
}

/// How often a rank that is recovering on behalf of its successor says so.
pub(crate) fn keepalive_interval(config: &Config) -> Duration {
    (config.peer_timeout / 3).max(Duration::from_nanos(1))
}
