//! One collective operation at one rank: a Broadcast, or an Allgather(v) composed of one
//! broadcast per rank. Both share this state machine: a Broadcast is an Allgatherv in which
//! only the root's block is non-empty.
//!
//! Life of an operation at one rank:
//! 1. `Barrier` (see `barrier`): the lanes open the operation, every rank says `Ready` to the
//!    hub (the Broadcast root, or rank 0); the hub answers `Go`.
//! 2. `Data`: active roots multicast their blocks (an Allgather activates roots chain by chain,
//!    see `send` and `schedule`). The lanes record arriving chunks in their bitmaps. The
//!    cutoff timer (`N / B + alpha`) ends the fast path: the lanes that are not full hand
//!    their bitmaps back, and the rank fetches what it misses from its ring predecessor (see
//!    `ring`). Before that, a lane that sees a gap behind its stream settles the chunks
//!    behind it (hands them over) and the rank recovers them while the data still flows.
//! 3. A rank that holds every chunk and has no read in flight sends `Fin` to its predecessor;
//!    it completes once its successor's `Fin` arrived and its own sends are done.
//!
//! A [`Collective`] is composed of parts that own their state: the [`Barrier`], the root's
//! sends and chain token ([`RootSend`]), the ring [`Recovery`], the view of the lanes
//! ([`RxView`]) and one [`TimerTable`]. The handlers that need several parts live here and
//! in the part's module.

use crate::barrier::Barrier;
use crate::config::{Config, Rank};
use crate::event::{OpError, OpId, StartError};
use crate::lane::{LaneCommand, RxCommand, RxOpen};
use crate::layout::Layout;
use crate::out::{Ctx, Outcome};
use crate::ring::Recovery;
use crate::rxview::RxView;
use crate::schedule::Chains;
use crate::send::RootSend;
use crate::shape::{allgather_shape_tagged, broadcast_shape};
use crate::time::Instant;
use crate::timer::{Timer, TimerTable};
use crate::wire::ChunkRun;
use alloc::vec::Vec;
use core::time::Duration;

/// Which step of the operation this rank is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    Barrier,
    Data,
}

/// One collective at one rank.
#[derive(Debug)]
pub(crate) struct Collective {
    pub(crate) id: OpId,
    pub(crate) tag: u32,
    pub(crate) me: Rank,
    pub(crate) pred: Rank,
    pub(crate) succ: Rank,
    pub(crate) layout: Layout,
    pub(crate) phase: Phase,
    pub(crate) rx: RxView,
    pub(crate) barrier: Barrier,
    pub(crate) send: RootSend,
    pub(crate) ring: Recovery,
    pub(crate) timers: TimerTable,
    /// When the fast path ends (set once the data phase begins).
    pub(crate) cutoff_at: Option<Instant>,
    pub(crate) cutoff_fired: bool,
    cutoff_after: Duration,
    /// How much longer than usual this rank waits for the barrier's hub (the session's
    /// `barrier_slack`: the hub may still wait in an earlier operation).
    pub(crate) barrier_slack: Duration,
    /// The hub's `Ready` wait was extended by the slack once.
    ready_extended: bool,
    /// With `Config::cutoff_extension`: chunks written on the open lanes at the last look,
    /// and the lanes whose count is still awaited.
    cutoff_seen: u64,
    counting: u32,
    counted: u64,
    /// Allgather: roots multicasting at once (a block's share of a link); 0: no per-block
    /// deadlines (a Broadcast's one block ends with the cutoff).
    block_roots: u32,
    /// Per-block deadlines (Allgather): when lane `l`'s part of a block should be in, sorted.
    blocks_due: Vec<(Instant, u16, Rank)>,
    /// Settles asked of a lane and not answered yet, per (lane, block).
    pub(crate) settles_asked: Vec<(u16, u32)>,
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
        let send = RootSend::new(c.rank == root, None, None);
        Self::new(c, id, (root, broadcast_shape(root, len)), &sizes, send)
    }

    /// An Allgatherv with block `r` of `sizes[r]` bytes (`tag`: see
    /// [`allgather_shape_tagged`]).
    pub(crate) fn allgather(
        cx: &Ctx<'_>,
        id: OpId,
        sizes: &[u64],
        tag: u32,
    ) -> Result<Self, StartError> {
        let c = cx.config;
        if sizes.len() != c.ranks as usize {
            return Err(StartError::SizesLength {
                got: sizes.len(),
                ranks: c.ranks,
            });
        }
        let chains = Chains::new(c.ranks, c.chains);
        let send = RootSend::new(
            chains.is_head(c.rank),
            chains.next(c.rank),
            chains.prev(c.rank),
        );
        let shape = allgather_shape_tagged(sizes, tag);
        let mut op = Self::new(c, id, (Rank(0), shape), sizes, send)?;
        // Each step needs a token to travel; give the cutoff slack for every step.
        op.cutoff_after += c.cutoff_alpha * chains.steps().saturating_sub(1);
        op.block_roots = c.chains.clamp(1, c.ranks);
        Ok(op)
    }

    /// `hub`: the barrier's hub and the operation's shape fingerprint.
    fn new(
        c: &Config,
        id: OpId,
        (hub, shape): (Rank, u32),
        sizes: &[u64],
        mut send: RootSend,
    ) -> Result<Self, StartError> {
        // The all-ones chunk index is never a chunk's (see `Limits::max_chunks_per_op`).
        let max = c
            .limits
            .max_chunks_per_op
            .min(u32::try_from(c.imm.max_chunks() - 1).unwrap_or(u32::MAX));
        // Saturating: sizes near 2^64 are refused below, never an overflow.
        let chunks: u64 = sizes
            .iter()
            .map(|s| s.div_ceil(u64::from(c.chunk_size)))
            .fold(0, u64::saturating_add);
        if chunks > u64::from(max) {
            return Err(StartError::TooLarge { chunks, max });
        }
        let layout = Layout::new(sizes, c.chunk_size, c.lanes)
            .ok_or(StartError::TooLarge { chunks, max })?;
        let (me, p) = (c.rank, c.ranks);
        let wire = transfer_time(c, layout.bytes());
        send.empty = layout.block_chunks(me.0) == 0;
        // This rank holds its own block from the start (the caller placed it): the view
        // vouches for it at once, as for chunks a lane settled with none missing, so that a
        // peer that lost some of it reads it here while this rank's lanes still receive the
        // other blocks (the ring's invariant: every rank holds its own block).
        let mut rx = RxView::new(layout.lanes());
        for l in 0..layout.lanes() {
            let own = ChunkRun {
                start: layout.lane_index(me.0, l),
                len: layout.lane_count(me.0, l),
            };
            if own.len > 0 {
                rx.on_settled(l as usize, layout.lane_len(l), own, &[]);
            }
        }
        Ok(Collective {
            id,
            tag: c.imm.tag_of(id.0),
            me,
            pred: Rank((me.0 + p - 1) % p),
            succ: Rank((me.0 + 1) % p),
            rx,
            layout,
            phase: Phase::Barrier,
            barrier: Barrier::new(hub, me, p, shape),
            send,
            ring: Recovery::default(),
            timers: TimerTable::default(),
            cutoff_at: None,
            cutoff_fired: false,
            cutoff_after: wire + c.cutoff_alpha,
            barrier_slack: Duration::ZERO,
            ready_extended: false,
            cutoff_seen: 0,
            counting: 0,
            counted: 0,
            block_roots: 0,
            blocks_due: Vec::new(),
            settles_asked: Vec::new(),
        })
    }

    /// Whether the operation moves no chunk at all.
    pub(crate) fn is_empty(&self) -> bool {
        self.layout.total() == 0
    }

    /// Opens the operation on every lane's receive half.
    pub(crate) fn open_lanes(&self, cx: &mut Ctx<'_>) {
        for l in 0..self.layout.lanes() {
            let open = RxOpen {
                op: self.id,
                tag: self.tag,
                blocks: (0..self.layout.ranks())
                    .map(|r| self.layout.lane_block(r, l))
                    .collect(),
                len: self.layout.lane_len(l),
                own: ChunkRun {
                    start: self.layout.lane_index(self.me.0, l),
                    len: self.layout.lane_count(self.me.0, l),
                },
            };
            cx.lane(LaneCommand::Rx {
                lane: l as u16,
                cmd: RxCommand::Open(open),
            });
        }
    }

    /// The operation ends here: no lane may keep it.
    pub(crate) fn close_lanes(&mut self, cx: &mut Ctx<'_>, failed: bool) {
        let id = self.id;
        for l in self.rx.close_all() {
            cx.lane(LaneCommand::Rx {
                lane: l as u16,
                cmd: RxCommand::Close { op: id },
            });
        }
        if failed {
            self.send.cancel(cx, id, self.layout.lanes());
        }
    }

    /// Earliest timer of this operation.
    pub(crate) fn next_timeout(&self) -> Option<Instant> {
        // A rank still waiting for the chain token keeps its cutoff even when it holds
        // everything else: it must not wait for a token from a crashed predecessor forever.
        // A complete rank keeps it too while it withholds chunks it recovered (see `ring`).
        let cutoff = !self.rx.complete() || self.send.waiting() || self.ring.owes_answers();
        self.timers.next(!self.cutoff_fired && cutoff)
    }

    pub(crate) fn on_timeout(&mut self, cx: &mut Ctx<'_>) -> Option<Outcome> {
        let now = cx.now;
        // Two silent ranks or more right after other operations: one may wait in an earlier
        // operation on another; its verdict comes first (see the barrier's module docs).
        if self.timers.expired(Timer::Ready, now)
            && self.barrier.silent() >= 2
            && !self.barrier_slack.is_zero()
            && !core::mem::replace(&mut self.ready_extended, true)
        {
            self.timers.set(Timer::Ready, now + self.barrier_slack);
            return None;
        }
        // The barrier's wait (re-armed unless the operation fails); other timers may be due
        // too (a fetch from a peer already in the data phase arms the keepalive).
        if (self.timers.expired(Timer::Ready, now) || self.timers.expired(Timer::Go, now))
            && let Some(o) = self.on_barrier_timeout(cx)
        {
            return Some(o);
        }
        // Our successor's `Fin` may wait on our own block, which our lanes have not sent
        // yet: while they have not, the sends' watch judges (it names us when they are
        // stuck), not the wait for `Fin`, which would name a rank that waits on us.
        if self.timers.expired(Timer::Fin, now) && !self.send.done() {
            self.timers.set(Timer::Fin, now + cx.config.peer_timeout);
        }
        let blame = [
            (Timer::Fetch, self.pred),
            (Timer::Reads, self.ring.reads_peer(self.pred)),
            (Timer::Fin, self.ring.fin_owed(self.succ)),
        ];
        if let Some((_, peer)) = blame.iter().find(|(t, _)| self.timers.expired(*t, now)) {
            return Some(Outcome::Failed {
                error: OpError::PeerUnresponsive { peer: *peer },
                abort: true,
            });
        }
        if self.timers.expired(Timer::Cutoff, now) && !self.cutoff_fired {
            self.timers.stop(Timer::Cutoff);
            if cx.config.cutoff_extension.is_some() && !self.rx.known() {
                self.count_lanes(cx);
            } else {
                self.cutoff_fired = true;
                if let Some(o) = self.end_fast_path(cx) {
                    return Some(o);
                }
            }
        }
        if self.timers.expired(Timer::Keepalive, now) {
            self.keepalive(cx);
        }
        if self.timers.expired(Timer::Blocks, now) {
            self.blocks_overdue(cx);
        }
        if self.timers.expired(Timer::Sends, now) {
            if self.send.done() {
                self.timers.stop(Timer::Sends);
            } else if self.send.look(cx, self.id) {
                return Some(Outcome::Failed {
                    error: OpError::SendsStalled { rank: self.me },
                    abort: true,
                });
            } else {
                self.timers.set(Timer::Sends, now + self.sends_patience(cx));
            }
        }
        None
    }

    /// How long a root waits between looks at its sends' completions: its block's wire
    /// time, and a peer timeout beyond it. A look whose answers show no completion since the
    /// last one's (no lane's count grew, none finished), or whose answers never all came by
    /// the next look, fails the operation ([`OpError::SendsStalled`]).
    fn sends_patience(&self, cx: &Ctx<'_>) -> Duration {
        transfer_time(cx.config, self.layout.block_size(self.me.0)) + cx.config.peer_timeout
    }

    /// Lane `lane` answered the sends' look: `done` of our multicasts on it completed.
    pub(crate) fn on_sent(&mut self, lane: u16, done: u32) -> Option<Outcome> {
        self.send.on_sent(lane, done).then_some(Outcome::Failed {
            error: OpError::SendsStalled { rank: self.me },
            abort: true,
        })
    }

    /// Lane `lane` finished its part of our block.
    pub(crate) fn on_sends_done(&mut self, lane: u16) {
        self.send.on_sends_done(lane);
        if self.send.done() {
            self.timers.stop(Timer::Sends);
        }
    }

    /// Allgather: a block started on a lane. Its chunks should be in after its share of the
    /// link, twice over, plus `alpha`; then the lane settles what it has, so a block whose
    /// last chunks were lost is recovered long before the operation's cutoff.
    pub(crate) fn on_lane_started(&mut self, cx: &Ctx<'_>, lane: u16, block: Rank) {
        if self.block_roots == 0 || self.cutoff_fired {
            return;
        }
        let share = self.layout.block_size(block.0) * u64::from(self.block_roots);
        let at = cx.now + transfer_time(cx.config, share) * 2 + cx.config.cutoff_alpha;
        self.block_due(at, lane, block);
    }

    /// With `cutoff_extension`: an overdue block's chunks still arrive on `lane`; look again
    /// after the extension (a transport slower than `link_bandwidth` must not send the rest
    /// of a block through the slow path while the multicast still brings it).
    pub(crate) fn on_lane_progress(&mut self, cx: &Ctx<'_>, lane: u16, block: Rank) {
        if let (Some(d), false) = (cx.config.cutoff_extension, self.cutoff_fired) {
            self.block_due(cx.now + d, lane, block);
        }
    }

    /// Block `block`'s chunks on `lane` are due at `at`.
    fn block_due(&mut self, at: Instant, lane: u16, block: Rank) {
        let i = self.blocks_due.partition_point(|d| d.0 <= at);
        self.blocks_due.insert(i, (at, lane, block));
        if i == 0 {
            self.timers.set(Timer::Blocks, at);
        }
    }

    /// Per-block deadlines passed: the lanes hand over what those blocks have (with
    /// `cutoff_extension`, unless their chunks still arrive).
    fn blocks_overdue(&mut self, cx: &mut Ctx<'_>) {
        let due = self.blocks_due.partition_point(|d| d.0 <= cx.now);
        let (op, patient) = (self.id, cx.config.cutoff_extension.is_some());
        for (_, lane, block) in self.blocks_due.drain(..due) {
            if self.rx.is_open(usize::from(lane)) {
                let cmd = if patient {
                    RxCommand::Overdue { op, block }
                } else {
                    RxCommand::Settle {
                        op,
                        block,
                        upto: None,
                    }
                };
                cx.lane(LaneCommand::Rx { lane, cmd });
            }
        }
        match self.blocks_due.first() {
            Some(d) => self.timers.set(Timer::Blocks, d.0),
            None => self.timers.stop(Timer::Blocks),
        }
    }

    /// A lane handed us chunks while it stays open.
    pub(crate) fn on_lane_settled(
        &mut self,
        cx: &mut Ctx<'_>,
        lane: u16,
        block: Rank,
        run: ChunkRun,
        missing: &[ChunkRun],
    ) -> Option<Outcome> {
        let len = self.layout.lane_len(u32::from(lane));
        self.rx.on_settled(usize::from(lane), len, run, missing);
        self.settles_asked
            .retain(|a| !(a.0 == lane && a.1 == block.0));
        self.lanes_changed(cx)
    }

    /// The cutoff fired: get back the bitmaps of the lanes that are not full.
    fn end_fast_path(&mut self, cx: &mut Ctx<'_>) -> Option<Outcome> {
        self.timers.stop(Timer::Blocks);
        self.blocks_due.clear();
        if self.send.waiting() {
            self.send.activate_late();
        }
        let id = self.id;
        for l in self.rx.close_unfilled() {
            cx.lane(LaneCommand::Rx {
                lane: l as u16,
                cmd: RxCommand::Close { op: id },
            });
        }
        self.lanes_known(cx)
    }

    /// The cutoff fired with `cutoff_extension` set: ask the open lanes how far they got.
    fn count_lanes(&mut self, cx: &mut Ctx<'_>) {
        let id = self.id;
        self.counted = 0;
        self.counting = 0;
        for l in self.rx.open_unfilled() {
            self.counting += 1;
            cx.lane(LaneCommand::Rx {
                lane: l as u16,
                cmd: RxCommand::Count { op: id },
            });
        }
    }

    /// A lane said how many chunks it wrote. Once every open lane answered: chunks still
    /// arriving push the cutoff out; a stalled fast path ends.
    pub(crate) fn on_lane_count(&mut self, cx: &mut Ctx<'_>, committed: u32) -> Option<Outcome> {
        if self.counting == 0 || self.cutoff_fired {
            return None;
        }
        self.counting -= 1;
        self.counted += u64::from(committed);
        if self.counting > 0 {
            return None;
        }
        match cx.config.cutoff_extension {
            Some(d) if self.counted > self.cutoff_seen => {
                self.cutoff_seen = self.counted;
                self.timers.set(Timer::Cutoff, cx.now + d);
                None
            }
            _ => {
                self.cutoff_fired = true;
                self.end_fast_path(cx)
            }
        }
    }

    /// A lane's receive half filled up.
    pub(crate) fn on_lane_full(&mut self, cx: &mut Ctx<'_>, lane: u16) -> Option<Outcome> {
        self.rx.on_full(usize::from(lane));
        self.lanes_changed(cx)
    }

    /// A lane handed its bitmap back.
    pub(crate) fn on_lane_closed(
        &mut self,
        cx: &mut Ctx<'_>,
        lane: u16,
        bits: crate::bitmap::ChunkBitmap,
    ) -> Option<Outcome> {
        // A bitmap of another length is another operation's (a driver's routing bug).
        if bits.len() != self.layout.lane_len(u32::from(lane)) {
            return None;
        }
        self.rx.on_closed(usize::from(lane), bits);
        self.lanes_known(cx)
    }

    /// Once every lane's content is known after the cutoff, the slow path starts.
    fn lanes_known(&mut self, cx: &mut Ctx<'_>) -> Option<Outcome> {
        if !self.rx.known() {
            return None;
        }
        self.answer_deferred(cx);
        self.tell_lacking(cx);
        self.answer_requesters(cx);
        self.start_fetch(cx, None);
        self.progress(cx)
    }

    /// Everything that may follow new data or a finished send/read: answer a deferred request
    /// that is now fully held, start or pass on the root's sends, send `Fin`, complete.
    pub(crate) fn progress(&mut self, cx: &mut Ctx<'_>) -> Option<Outcome> {
        let answerable = !self.send.sending()
            && self
                .ring
                .deferred
                .as_ref()
                .is_some_and(|d| d.iter().all(|r| self.rx.holds(&self.layout, *r)));
        if let Some(d) = self.ring.deferred.take_if(|_| answerable) {
            self.timers.stop(Timer::Keepalive);
            self.send_ack(cx, self.succ, d);
        }
        self.answer_requesters(cx);
        if self.phase == Phase::Data
            && self
                .send
                .start(cx, self.id, self.tag, &self.layout, self.me)
        {
            self.timers
                .set(Timer::Sends, cx.now + self.sends_patience(cx));
        }
        self.send.pass_token(cx, self.id);
        if self.ring.reads_idle() && self.phase == Phase::Data && self.rx.complete() {
            // An outstanding request is no longer needed, nor are its deadlines.
            if self.ring.drop_fetches() {
                self.timers.stop(Timer::Fetch);
                self.timers.stop(Timer::Reads);
            }
            self.ring.send_fin(cx, self.id, self.pred);
            if self.ring.fins_done() {
                if self.send.done() {
                    return Some(Outcome::Completed);
                }
            } else {
                self.wait_for_fin(cx);
            }
        }
        None
    }

    /// Expect the successor's `Fin`: it may still have to recover the whole buffer from us.
    ///
    /// A rank that owes us `Fin` (our successor, or one that probed us) may itself wait on a
    /// third rank, dead, for a whole `peer_timeout` after it last spoke to us (its
    /// predecessor, or a rank it reads from): we wait twice that, so that it times out first
    /// and its `Abort` names the right culprit.
    fn wait_for_fin(&mut self, cx: &Ctx<'_>) {
        let from = self.cutoff_at.map_or(cx.now, |c| c.max(cx.now));
        let deadline =
            from + cx.config.peer_timeout * 2 + transfer_time(cx.config, self.layout.bytes());
        match self.timers.get(Timer::Fin) {
            Some(_) => self.timers.extend(Timer::Fin, deadline),
            None => self.timers.set(Timer::Fin, deadline),
        }
    }

    /// Any message from a rank we wait on shows it is alive: push its deadlines out.
    pub(crate) fn heard_from(&mut self, cx: &Ctx<'_>, from: Rank) {
        let later = cx.now + cx.config.peer_timeout;
        // The hub waits on every rank at once: one answer says nothing of the others. Never
        // past the post timeout after this rank's own (when the hub is named anyway): what
        // else comes from it must not hold the barrier up for good.
        if from == self.barrier.hub() {
            let cap = self.barrier.post_by + cx.config.post_timeout;
            self.timers.extend(Timer::Go, later.min(cap));
        }
        if from == self.pred {
            self.timers.extend(Timer::Fetch, later);
        }
        if from == self.pred || self.ring.reads_from(from) {
            self.timers.extend(Timer::Reads, later);
        }
        if from == self.succ || self.ring.owes_fin(from) {
            self.timers
                .extend(Timer::Fin, later + cx.config.peer_timeout);
        }
    }

    /// The barrier is passed: the fast path starts and its cutoff is armed.
    pub(crate) fn begin_data(&mut self, cx: &mut Ctx<'_>) {
        self.phase = Phase::Data;
        self.timers.stop(Timer::Ready);
        self.timers.stop(Timer::Go);
        let at = cx.now + self.cutoff_after;
        self.cutoff_at = Some(at);
        self.timers.set(Timer::Cutoff, at);
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
