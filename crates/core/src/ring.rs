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
use crate::event::OpError;
use crate::event::Transmit;
use crate::op::{Collective, Deferred, Fetch, Wait, keepalive_interval, transfer_time};
use crate::out::{ControlMsg, Ctx, Outcome, Outgoing, bump};
use crate::wire::{ChunkRun, ControlKind, RunList};
use alloc::vec::Vec;

impl Collective {
    /// Asks the predecessor for missing chunks, unless a request is outstanding already.
    ///
    /// Before our own cutoff fired only the runs `within` are asked for (the rest may still be
    /// on its way on the fast path); afterwards everything missing.
    pub(crate) fn start_fetch(&mut self, cx: &mut Ctx<'_>, within: Option<&[ChunkRun]>) {
        if self.fetch.is_some() || self.missing() == 0 {
            return;
        }
        let max = cx.config.max_fetch_runs();
        let mut runs = Vec::new();
        match within.filter(|_| !self.cutoff_fired) {
            Some(asked) => asked
                .iter()
                .for_each(|r| self.runs_within(*r, false, max, &mut runs)),
            None => {
                let all = ChunkRun {
                    start: 0,
                    len: self.layout.total(),
                };
                self.runs_within(all, false, max, &mut runs)
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
        self.fetch = Some(Fetch {
            pending: runs,
            reads: Vec::new(),
        });
        self.wait = Some(Wait {
            peer: self.pred,
            deadline: cx.now + cx.config.peer_timeout,
        });
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
        let keepalive_at = cx.now + keepalive_interval(cx.config);
        self.deferred = Some(Deferred {
            runs: runs.iter().collect(),
            keepalive_at,
        });
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

    /// Acknowledges every deferred run we hold now; keeps (and returns) the rest.
    fn answer_deferred(&mut self, cx: &mut Ctx<'_>) -> Vec<ChunkRun> {
        let Some(d) = self.deferred.take() else {
            return Vec::new();
        };
        let (mut held, mut lacking) = (Vec::new(), Vec::new());
        for r in &d.runs {
            self.runs_within(*r, true, usize::MAX, &mut held);
            self.runs_within(*r, false, usize::MAX, &mut lacking);
        }
        if !held.is_empty() {
            self.send_ack(cx, held);
        }
        if !lacking.is_empty() {
            self.deferred = Some(Deferred {
                runs: lacking.clone(),
                keepalive_at: d.keepalive_at,
            });
        }
        lacking
    }

    /// Acknowledges `runs`, in as many messages as the control size limit needs. Each message
    /// carries the longest recovery chain behind the chunks it names.
    pub(crate) fn send_ack(&mut self, cx: &mut Ctx<'_>, runs: Vec<ChunkRun>) {
        for batch in runs.chunks(cx.config.max_fetch_runs()) {
            let hops = self
                .recovered
                .iter()
                .filter(|(rec, _)| batch.iter().any(|r| overlaps(*rec, *r)))
                .map(|(_, h)| *h)
                .max()
                .unwrap_or(0);
            let runs = batch.to_vec();
            let msg = ControlMsg {
                kind: ControlKind::FetchAck,
                op: self.id.0,
                arg: hops,
                runs,
            };
            cx.send(self.succ, msg);
        }
    }

    /// Still recovering for our successor: acknowledge what arrived meanwhile, NACK the rest.
    pub(crate) fn keepalive(&mut self, cx: &mut Ctx<'_>) {
        if !self.answer_deferred(cx).is_empty() {
            cx.send(
                self.succ,
                ControlMsg::simple(ControlKind::FetchNack, self.id.0),
            );
            if let Some(d) = self.deferred.as_mut() {
                d.keepalive_at = cx.now + keepalive_interval(cx.config);
            }
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
                .fetch
                .as_ref()
                .is_some_and(|f| runs.iter().all(|r| covered(&f.pending, r)));
        if !expected {
            bump(&mut cx.stats.control_unexpected);
            return None;
        }
        let (mut still, mut pieces) = (Vec::new(), Vec::new());
        for r in runs.iter() {
            self.runs_within(r, false, usize::MAX, &mut still);
        }
        for m in &still {
            self.pieces(*m, &mut pieces);
        }
        let bytes: u64 = pieces.iter().map(|p| p.len).sum();
        for p in &pieces {
            let (op, run, offset, len) = (self.id, p.run, p.offset, p.len);
            cx.out.push_back(Outgoing::Ready(Transmit::Read {
                op,
                from,
                run,
                offset,
                len,
            }));
            bump(&mut cx.stats.reads);
        }
        if !pieces.is_empty() {
            cx.stats.max_fetch_depth = cx.stats.max_fetch_depth.max(hops);
        }
        let f = self.fetch.as_mut()?;
        for r in runs.iter() {
            subtract(&mut f.pending, r);
        }
        let depth = hops.saturating_add(1);
        f.reads.extend(pieces.iter().map(|p| (p.run, depth)));
        if f.reads.is_empty() && f.pending.is_empty() {
            return self.fetch_round_done(cx);
        }
        // The reads are one-sided: allow for moving the bytes before blaming the peer.
        let deadline = cx.now + cx.config.peer_timeout + transfer_time(cx.config, bytes);
        self.wait = Some(Wait {
            peer: from,
            deadline,
        });
        None
    }

    /// The predecessor is recovering on our behalf and is alive.
    pub(crate) fn on_fetch_nack(&mut self, cx: &mut Ctx<'_>, from: Rank) -> Option<Outcome> {
        if from != self.pred || self.fetch.as_ref().is_none_or(|f| f.pending.is_empty()) {
            bump(&mut cx.stats.control_unexpected);
            return None;
        }
        self.heard_from(cx, from);
        None
    }

    /// A read we issued finished.
    pub(crate) fn on_read_done(
        &mut self,
        cx: &mut Ctx<'_>,
        run: ChunkRun,
        ok: bool,
    ) -> Option<Outcome> {
        let issued = self.fetch.as_mut().and_then(|f| {
            let i = f.reads.iter().position(|(r, _)| *r == run)?;
            Some(f.reads.swap_remove(i).1)
        });
        let Some(hops) = issued else {
            bump(&mut cx.stats.control_unexpected);
            return None;
        };
        if !ok {
            let error = OpError::ReadFailed { peer: self.pred };
            return Some(Outcome::Failed { error, abort: true });
        }
        let new = self.record_fetched(run);
        self.recovered.push((run, hops));
        cx.stats.chunks_fetched = cx.stats.chunks_fetched.saturating_add(u64::from(new));
        // Pass it on at once: our successor may be waiting for exactly this piece.
        self.answer_deferred(cx);
        if self
            .fetch
            .as_ref()
            .is_some_and(|f| f.reads.is_empty() && f.pending.is_empty())
        {
            return self.fetch_round_done(cx);
        }
        self.progress(cx)
    }

    fn fetch_round_done(&mut self, cx: &mut Ctx<'_>) -> Option<Outcome> {
        self.fetch = None;
        self.wait = None;
        // More runs than one message held, or a deferred request still unanswered.
        if self.cutoff_fired {
            self.start_fetch(cx, None);
        } else if let Some(asked) = self.deferred.as_ref().map(|d| d.runs.clone()) {
            self.start_fetch(cx, Some(&asked));
        }
        self.progress(cx)
    }

    /// Our successor will not read from us again.
    pub(crate) fn on_fin(&mut self, cx: &mut Ctx<'_>, from: Rank) -> Option<Outcome> {
        if from != self.succ || self.fin_received {
            bump(&mut cx.stats.control_unexpected);
            return None;
        }
        self.fin_received = true;
        if self.wait.is_some_and(|w| w.peer == from) {
            self.wait = None;
        }
        self.deferred = None;
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
