//! Ring recovery: a rank fetches the chunks it missed from its ring predecessor.
//!
//! * The predecessor acknowledges (`FetchAck`) the requested runs it holds; the requester
//!   reads them straight from the predecessor's buffer (RDMA Read, or the transport's
//!   equivalent), one read per byte-contiguous piece.
//! * Runs it does not hold yet it answers with `FetchNack`, keeps them, and recovers them from
//!   its own predecessor first (recursion, ending at the block's root, which holds it). It
//!   acknowledges each piece as soon as its read lands, and repeats the `FetchNack` every
//!   `peer_timeout / 3` while anything is still owed, so the requester never blames a live
//!   rank for a dead one further up the ring. Acknowledging partially is what keeps an
//!   Allgather from deadlocking (every rank holds its own block, so data always moves one hop
//!   further) and from waiting on the slowest chain before passing anything on.
//! * A rank sends `Fin` to its predecessor when it holds everything and no read is in flight:
//!   from then on the predecessor's buffer is not touched again.
//!
//! Only missing runs travel, merged into maximal runs across block and lane borders, at most
//! as many as one control message holds; a rank with more runs asks again after a batch.

use crate::config::Rank;
use crate::event::{OpError, OpId, ReadId, Transmit};
use crate::op::{Collective, keepalive_interval, transfer_time};
use crate::out::{ControlMsg, Ctx, Outcome, Outgoing, bump};
use crate::timer::Timer;
use crate::wire::{ChunkRun, ControlKind, RunList};
use alloc::vec::Vec;

/// A fetch request outstanding at our ring predecessor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Fetch {
    /// Requested runs not acknowledged yet.
    pending: Vec<ChunkRun>,
    /// Reads in flight, each with the recovery depth its data will have.
    reads: Vec<(ReadId, ChunkRun, u32)>,
}

/// The ring recovery's own state: our request upstream, our successor's request to us, what
/// we recovered, and the `Fin` handshake.
#[derive(Clone, Debug, Default)]
pub(crate) struct Recovery {
    pub(crate) fetch: Option<Fetch>,
    /// Runs our successor asked for that we did not hold (or could not vouch for) yet.
    pub(crate) deferred: Option<Vec<ChunkRun>>,
    /// What we recovered by reads, with the length of the chain of reads behind each piece.
    recovered: Vec<(ChunkRun, u32)>,
    fin_sent: bool,
    pub(crate) fin_received: bool,
}

impl Recovery {
    /// No read in flight.
    pub(crate) fn reads_idle(&self) -> bool {
        self.fetch.as_ref().is_none_or(|f| f.reads.is_empty())
    }

    /// Whether read `id` is ours.
    pub(crate) fn has_read(&self, id: ReadId) -> bool {
        self.fetch
            .as_ref()
            .is_some_and(|f| f.reads.iter().any(|r| r.0 == id))
    }

    /// Sends `Fin` to the predecessor, once.
    pub(crate) fn send_fin(&mut self, cx: &mut Ctx<'_>, op: OpId, pred: Rank) {
        if !self.fin_sent {
            self.fin_sent = true;
            cx.send(pred, ControlMsg::simple(ControlKind::Fin, op.0));
        }
    }

    /// The longest recovery chain behind any of `runs`.
    fn hops(&self, runs: &[ChunkRun]) -> u32 {
        self.recovered
            .iter()
            .filter(|(rec, _)| runs.iter().any(|r| overlaps(*rec, *r)))
            .map(|(_, h)| *h)
            .max()
            .unwrap_or(0)
    }
}

impl Collective {
    /// Asks the predecessor for missing chunks, unless a request is outstanding already or
    /// the lanes have not handed their bitmaps back yet.
    ///
    /// Before our own cutoff fired only the runs `within` are asked for (the rest may still be
    /// on its way on the fast path); afterwards everything missing.
    pub(crate) fn start_fetch(&mut self, cx: &mut Ctx<'_>, within: Option<&[ChunkRun]>) {
        if self.ring.fetch.is_some() || !self.rx.known() || self.rx.complete() {
            return;
        }
        let max = cx.config.max_fetch_runs();
        let mut runs = Vec::new();
        match within.filter(|_| !self.cutoff_fired) {
            Some(asked) => asked
                .iter()
                .for_each(|r| self.rx.runs_within(&self.layout, *r, false, max, &mut runs)),
            None => {
                let all = ChunkRun {
                    start: 0,
                    len: self.layout.total(),
                };
                self.rx
                    .runs_within(&self.layout, all, false, max, &mut runs)
            }
        }
        if runs.is_empty() {
            return;
        }
        bump(&mut cx.stats.fetch_requests);
        let msg = ControlMsg {
            kind: ControlKind::Fetch,
            op: self.id.0,
            arg: 0,
            runs: runs.clone(),
        };
        cx.send(self.pred, msg);
        self.ring.fetch = Some(Fetch {
            pending: runs,
            reads: Vec::new(),
        });
        self.timers
            .set(Timer::Fetch, cx.now + cx.config.peer_timeout);
    }

    /// Our successor asks for runs.
    pub(crate) fn on_fetch(
        &mut self,
        cx: &mut Ctx<'_>,
        from: Rank,
        runs: RunList<'_>,
    ) -> Option<Outcome> {
        if from != self.succ || from == self.me {
            bump(&mut cx.stats.control_unexpected);
            return None;
        }
        if runs.iter().any(|r| r.end() > self.layout.total()) {
            bump(&mut cx.stats.control_malformed);
            return None;
        }
        self.timers
            .set(Timer::Keepalive, cx.now + keepalive_interval(cx.config));
        self.ring.deferred = Some(runs.iter().collect());
        let lacking = self.answer_deferred(cx);
        if !lacking.is_empty() {
            bump(&mut cx.stats.fetch_nacks);
            cx.send(
                self.succ,
                ControlMsg::simple(ControlKind::FetchNack, self.id.0),
            );
            self.start_fetch(cx, Some(&lacking));
        }
        None
    }

    /// Acknowledges every deferred run we hold now; keeps (and returns) the rest. Runs on
    /// lanes whose bitmap is still with the lane count as not held: we answer them once the
    /// cutoff brought the bitmaps back.
    pub(crate) fn answer_deferred(&mut self, cx: &mut Ctx<'_>) -> Vec<ChunkRun> {
        let Some(asked) = self.ring.deferred.take() else {
            return Vec::new();
        };
        let mut held = Vec::new();
        for r in &asked {
            self.rx
                .runs_within(&self.layout, *r, true, usize::MAX, &mut held);
        }
        let mut lacking = asked;
        for h in &held {
            subtract(&mut lacking, *h);
        }
        if !held.is_empty() {
            self.send_ack(cx, held);
        }
        if lacking.is_empty() {
            self.timers.stop(Timer::Keepalive);
        } else {
            self.ring.deferred = Some(lacking.clone());
        }
        lacking
    }

    /// Acknowledges `runs`, in as many messages as the control size limit needs. Each message
    /// carries the longest recovery chain behind the chunks it names.
    pub(crate) fn send_ack(&mut self, cx: &mut Ctx<'_>, runs: Vec<ChunkRun>) {
        for batch in runs.chunks(cx.config.max_fetch_runs()) {
            let msg = ControlMsg {
                kind: ControlKind::FetchAck,
                op: self.id.0,
                arg: self.ring.hops(batch),
                runs: batch.to_vec(),
            };
            cx.send(self.succ, msg);
        }
    }

    /// Still recovering for our successor: acknowledge what arrived meanwhile, NACK the rest.
    pub(crate) fn keepalive(&mut self, cx: &mut Ctx<'_>) {
        self.timers.stop(Timer::Keepalive);
        if !self.answer_deferred(cx).is_empty() {
            cx.send(
                self.succ,
                ControlMsg::simple(ControlKind::FetchNack, self.id.0),
            );
            self.timers
                .set(Timer::Keepalive, cx.now + keepalive_interval(cx.config));
        }
    }

    /// The predecessor holds these runs: read those we still miss.
    pub(crate) fn on_fetch_ack(
        &mut self,
        cx: &mut Ctx<'_>,
        from: Rank,
        runs: RunList<'_>,
        hops: u32,
    ) -> Option<Outcome> {
        let expected = from == self.pred
            && self
                .ring
                .fetch
                .as_ref()
                .is_some_and(|f| runs.iter().all(|r| covered(&f.pending, r)));
        if !expected {
            bump(&mut cx.stats.control_unexpected);
            return None;
        }
        let (mut still, mut pieces) = (Vec::new(), Vec::new());
        for r in runs.iter() {
            self.rx
                .runs_within(&self.layout, r, false, usize::MAX, &mut still);
        }
        for m in &still {
            self.layout.pieces(*m, &mut pieces);
        }
        if !pieces.is_empty() {
            cx.stats.max_fetch_depth = cx.stats.max_fetch_depth.max(hops);
        }
        let depth = hops.saturating_add(1);
        let bytes: u64 = pieces.iter().map(|p| p.len).sum();
        let f = self.ring.fetch.as_mut()?;
        for p in &pieces {
            let id = cx.read_id();
            cx.out.push_back(Outgoing::Ready(Transmit::Read {
                id,
                op: self.id,
                from,
                run: p.run,
                offset: p.offset,
                len: p.len,
            }));
            bump(&mut cx.stats.reads);
            f.reads.push((id, p.run, depth));
        }
        for r in runs.iter() {
            subtract(&mut f.pending, r);
        }
        let (reads_done, pending_done) = (f.reads.is_empty(), f.pending.is_empty());
        if reads_done && pending_done {
            return self.fetch_round_done(cx);
        }
        if pending_done {
            self.timers.stop(Timer::Fetch);
        }
        if !pieces.is_empty() {
            // The reads are one-sided: allow for moving the bytes before blaming the peer.
            let at = cx.now + cx.config.peer_timeout + transfer_time(cx.config, bytes);
            match self.timers.get(Timer::Reads) {
                Some(_) => self.timers.extend(Timer::Reads, at),
                None => self.timers.set(Timer::Reads, at),
            }
        }
        None
    }

    /// The predecessor is recovering on our behalf and is alive.
    pub(crate) fn on_fetch_nack(&mut self, cx: &mut Ctx<'_>, from: Rank) -> Option<Outcome> {
        let pending = self
            .ring
            .fetch
            .as_ref()
            .is_some_and(|f| !f.pending.is_empty());
        if from != self.pred || !pending {
            bump(&mut cx.stats.control_unexpected);
        }
        None
    }

    /// A read we issued finished.
    pub(crate) fn on_read_done(
        &mut self,
        cx: &mut Ctx<'_>,
        id: ReadId,
        ok: bool,
    ) -> Option<Outcome> {
        let issued = self.ring.fetch.as_mut().and_then(|f| {
            let i = f.reads.iter().position(|r| r.0 == id)?;
            Some(f.reads.swap_remove(i))
        });
        let Some((_, run, hops)) = issued else {
            bump(&mut cx.stats.control_unexpected);
            return None;
        };
        if !ok {
            let error = OpError::ReadFailed { peer: self.pred };
            return Some(Outcome::Failed { error, abort: true });
        }
        let new = self.rx.record_fetched(&self.layout, run);
        self.ring.recovered.push((run, hops));
        cx.stats.chunks_fetched = cx.stats.chunks_fetched.saturating_add(u64::from(new));
        // Pass it on at once: our successor may be waiting for exactly this piece.
        self.answer_deferred(cx);
        let (reads_done, pending_done) = self
            .ring
            .fetch
            .as_ref()
            .map_or((true, true), |f| (f.reads.is_empty(), f.pending.is_empty()));
        if reads_done {
            self.timers.stop(Timer::Reads);
            if pending_done {
                return self.fetch_round_done(cx);
            }
        }
        self.progress(cx)
    }

    fn fetch_round_done(&mut self, cx: &mut Ctx<'_>) -> Option<Outcome> {
        self.ring.fetch = None;
        self.timers.stop(Timer::Fetch);
        self.timers.stop(Timer::Reads);
        // More runs than one message held, or a deferred request still unanswered.
        if self.cutoff_fired {
            self.start_fetch(cx, None);
        } else if let Some(asked) = self.ring.deferred.clone() {
            self.start_fetch(cx, Some(&asked));
        }
        self.progress(cx)
    }

    /// Our successor will not read from us again.
    pub(crate) fn on_fin(&mut self, cx: &mut Ctx<'_>, from: Rank) -> Option<Outcome> {
        if from != self.succ || self.ring.fin_received {
            bump(&mut cx.stats.control_unexpected);
            return None;
        }
        self.ring.fin_received = true;
        self.timers.stop(Timer::Fin);
        self.ring.deferred = None;
        self.timers.stop(Timer::Keepalive);
        self.progress(cx)
    }
}

fn overlaps(a: ChunkRun, b: ChunkRun) -> bool {
    a.start < b.end() && b.start < a.end()
}

/// Whether `run` lies inside one of the sorted, disjoint `runs`.
fn covered(runs: &[ChunkRun], run: ChunkRun) -> bool {
    let i = runs.partition_point(|r| r.end() <= run.start);
    runs.get(i)
        .is_some_and(|r| r.start <= run.start && run.end() <= r.end())
}

/// Removes `run` from the sorted, disjoint `runs`.
fn subtract(runs: &mut Vec<ChunkRun>, run: ChunkRun) {
    let mut out = Vec::with_capacity(runs.len() + 1);
    for r in runs.iter() {
        if r.end() <= run.start || run.end() <= r.start {
            out.push(*r);
            continue;
        }
        if r.start < run.start {
            out.push(ChunkRun {
                start: r.start,
                len: run.start - r.start,
            });
        }
        if run.end() < r.end() {
            out.push(ChunkRun {
                start: run.end(),
                len: r.end() - run.end(),
            });
        }
    }
    *runs = out;
}
