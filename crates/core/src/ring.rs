//! Ring recovery: a rank fetches the chunks it missed from its ring predecessor.
//!
//! * The predecessor answers `FetchAck` when it holds every requested run; the requester then
//!   reads the runs straight from the predecessor's buffer (RDMA Read, or the transport's
//!   equivalent), one read per run.
//! * Otherwise the predecessor answers `FetchNack`, keeps the request, and recovers the runs
//!   from its own predecessor first (recursion, ending at the root, which holds everything).
//!   While it recovers it repeats the `FetchNack` every `peer_timeout / 3`, so the requester
//!   never blames a live rank for a dead one further up the ring.
//! * A rank sends `Fin` to its predecessor when it holds everything and no read is in flight:
//!   from then on the predecessor's buffer is not touched again.
//!
//! Only the missing runs travel, merged into maximal runs, at most as many as one control
//! message holds; a rank with more runs than that asks again after the first batch.

use crate::bcast::{Broadcast, Deferred, Fetch, Wait, keepalive_interval};
use crate::config::Rank;
use crate::event::OpError;
use crate::out::{ControlMsg, Ctx, Outcome, Outgoing, bump};
use crate::wire::{ChunkRun, ControlKind, RunList};
use alloc::vec::Vec;
use core::time::Duration;

impl Broadcast {
    /// Asks the predecessor for missing chunks, unless a request is outstanding already.
    ///
    /// Before our own cutoff fired only the runs `within` are asked for (the rest may still be
    /// on its way on the fast path); afterwards everything missing.
    pub(crate) fn start_fetch(&mut self, cx: &mut Ctx<'_>, within: Option<&[ChunkRun]>) {
        if self.fetch.is_some() || self.missing == 0 || self.is_root() {
            return;
        }
        let max = cx.config.max_fetch_runs();
        let mut runs = Vec::new();
        match within.filter(|_| !self.cutoff_fired) {
            Some(asked) => asked
                .iter()
                .for_each(|r| self.missing_runs(*r, max, &mut runs)),
            None => self.missing_runs(
                ChunkRun {
                    start: 0,
                    len: self.chunks,
                },
                max,
                &mut runs,
            ),
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
            runs,
            reads_left: 0,
            acked: false,
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
        if runs.iter().any(|r| r.end() > self.chunks) {
            bump(&mut cx.stats.control_malformed);
            return None;
        }
        let runs: Vec<ChunkRun> = runs.iter().collect();
        if runs.iter().all(|r| self.holds(*r)) {
            self.send_ack(cx, runs);
            return None;
        }
        bump(&mut cx.stats.fetch_nacks);
        cx.send(
            self.succ,
            ControlMsg::simple(ControlKind::FetchNack, self.id.0),
        );
        let keepalive_at = cx.now + keepalive_interval(cx.config);
        self.start_fetch(cx, Some(&runs));
        self.deferred = Some(Deferred { runs, keepalive_at });
        None
    }

    pub(crate) fn send_ack(&mut self, cx: &mut Ctx<'_>, runs: Vec<ChunkRun>) {
        let msg = ControlMsg {
            kind: ControlKind::FetchAck,
            op: self.id.0,
            arg: self.hops,
            runs,
        };
        cx.send(self.succ, msg);
    }

    /// The predecessor holds the runs: read those we still miss.
    pub(crate) fn on_fetch_ack(
        &mut self,
        cx: &mut Ctx<'_>,
        from: Rank,
        runs: RunList<'_>,
        hops: u32,
    ) -> Option<Outcome> {
        let expected = self.fetch.as_ref().is_some_and(|f| {
            !f.acked && from == self.pred && runs.iter().eq(f.runs.iter().copied())
        });
        if !expected {
            bump(&mut cx.stats.control_unexpected);
            return None;
        }
        let (mut reads, mut bytes) = (0u32, 0u64);
        let mut still = Vec::new();
        for r in runs.iter() {
            still.clear();
            self.missing_runs(r, usize::MAX, &mut still);
            for m in &still {
                let (offset, len) = self.byte_range(*m);
                cx.out.push_back(Outgoing::Read {
                    op: self.id,
                    from,
                    run: *m,
                    offset,
                    len,
                });
                bump(&mut cx.stats.reads);
                reads += 1;
                bytes += len;
            }
        }
        if let Some(f) = self.fetch.as_mut() {
            f.acked = true;
            f.reads_left = reads;
        }
        if reads == 0 {
            return self.fetch_round_done(cx);
        }
        self.hops = self.hops.max(hops.saturating_add(1));
        cx.stats.max_fetch_depth = cx.stats.max_fetch_depth.max(hops);
        // The reads are one-sided: allow for moving the bytes before blaming the peer.
        let ns = u128::from(bytes) * 1_000_000_000 / u128::from(cx.config.link_bandwidth);
        let t = Duration::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX));
        self.wait = Some(Wait {
            peer: from,
            deadline: cx.now + cx.config.peer_timeout + t,
        });
        None
    }

    /// The predecessor is recovering on our behalf and is alive.
    pub(crate) fn on_fetch_nack(&mut self, cx: &mut Ctx<'_>, from: Rank) -> Option<Outcome> {
        if from != self.pred || self.fetch.as_ref().is_none_or(|f| f.acked) {
            bump(&mut cx.stats.control_unexpected);
            return None;
        }
        self.heard_from(cx, from);
        None
    }

    /// A read finished.
    pub(crate) fn on_read_done(
        &mut self,
        cx: &mut Ctx<'_>,
        run: ChunkRun,
        ok: bool,
    ) -> Option<Outcome> {
        let Some(f) = self.fetch.as_mut().filter(|f| f.acked && f.reads_left > 0) else {
            bump(&mut cx.stats.control_unexpected);
            return None;
        };
        if !ok {
            let error = OpError::ReadFailed { peer: self.pred };
            return Some(Outcome::Failed { error, abort: true });
        }
        f.reads_left -= 1;
        let done = f.reads_left == 0;
        let new = self.record_fetched(run);
        cx.stats.chunks_fetched = cx.stats.chunks_fetched.saturating_add(u64::from(new));
        if done {
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
