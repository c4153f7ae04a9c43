//! Ring recovery: a rank fetches the chunks it missed from its ring predecessor, and from
//! ranks a skip distance further back when the predecessor misses them too.
//!
//! * The predecessor acknowledges (`FetchAck`) the requested runs it holds; the requester
//!   reads them straight from the predecessor's buffer (RDMA Read, or the transport's
//!   equivalent), one read per byte-contiguous piece. A local loss costs exactly this: one
//!   read from the neighbour.
//! * Runs it does not hold yet it answers with `FetchNack` ("not yet": its lane has not told
//!   whether they arrived) or `Lacking` (it knows it misses them: its fast path is over, or
//!   its lane settled them missing), keeps them, and recovers them itself. It acknowledges each piece as soon as its read lands, and repeats
//!   the answer every `peer_timeout / 3` while anything is still owed, so the requester never
//!   blames a live rank for a dead one further up the ring. Acknowledging partially is what
//!   keeps an Allgather from deadlocking (every rank holds its own block, so data always moves
//!   one hop further) and from waiting on the slowest chain before passing anything on.
//! * A rank sends `Fin` to its predecessor (and to every rank it probed) when it holds
//!   everything and no read is in flight: from then on their buffers are not touched again.
//!
//! Only missing runs travel, merged into maximal runs across block and lane borders, at most
//! as many as one control message holds; a rank with more runs asks again after a batch, and
//! a rank that finds more missing while a request is out sends the request again, grown
//! (answers to the first one still count for what is still pending).
//!
//! ## Recovery during the data phase
//! Recovery used to start at the cutoff (`N / B + alpha`, see `op`): even one lost chunk cost
//! `alpha` plus a fetch round trip after the data, while a chain broadcast repairs inside its
//! pipeline (512 ranks, 128 MiB: 0.996 of the loss-free throughput at 1e-7 and 1e-6 against
//! the chain's 1.000; a 1024-rank 1 MiB Allgather took 9.8% longer at 1e-4, its cutoff
//! carrying `alpha` for each of its 256 chain steps). Now a loss is repaired while the
//! stream still flows:
//!
//! * **Gaps, found by the lane.** A block's chunks arrive in order on each path (a multicast
//!   tree), so a chunk missing well behind the stream is lost. The lane checks at watch
//!   points: a block's first chunk, every 256 bits of its bitmap (every 64 within 512 chunks
//!   of a part's end), and the part's last chunk. The check costs the fast path nothing: the
//!   watch point replaces the part's end in its one range check, and its work runs in
//!   `commit`'s cold path, after the chunk is written (one compare, against a count that is
//!   the lane's expected total or 0 while a watch point waits). A gap more than 64 chunks
//!   behind (none at the part's end) makes the lane **settle** the block's chunks behind it:
//!   it hands them to the session (`RxNote::Settled`, with the runs missing) and drops any
//!   that still come (as stale). Ownership moves, nothing is shared: the session recovers the
//!   settled chunks as it recovers a closed lane's, and placement stays exactly-once. More
//!   than 8 missing (a burst), or a chunk arriving behind a settled point (a reordering
//!   path), and the lane leaves the rest to the cutoff, as before.
//! * **Vouching from an open lane.** A predecessor asked for chunks its lane still tracks
//!   asks the lane to settle the block up to them once its stream got there
//!   (`RxCommand::Settle`), then acknowledges what arrived and answers `Lacking` for the rest
//!   (so the requester probes further back at once, see below) and fetches it itself.
//! * **Block deadlines (Allgather).** A block whose last chunks are lost shows no gap. Each
//!   block's first chunk on a lane starts a deadline of twice its share of the link (`M`
//!   roots at once) plus `alpha`; then the lane settles what the block has. So only the last
//!   chain step's tail losses wait that long, instead of every block waiting for the cutoff.
//! * **A root does not serve reads while it multicasts.** Reads from it would delay its
//!   stream, and so every rank's cutoff (at 1e-4 the 512-rank Broadcast fell to 0.92, its
//!   root reading out 2% of its block during the data phase). It answers once its sends are
//!   done.
//! * **Shallow chains while recoveries overlap.** Ranks recover at different times now, so
//!   a rank asking just after its predecessor recovered a chunk would read it from there,
//!   one hop deeper each time (depth 8 at 46 ranks in the property tests). Before its cutoff
//!   a rank vouches only for chunks recovered through fewer than `min(4, log2 P)` reads,
//!   answering `Lacking` for the others (the requester probes further back), and
//!   acknowledgements carry the chain length of the runs they name, not of their batch.
//!
//! The cutoff stays as the backstop: lanes not full then hand their bitmaps back, and
//! everything missing is fetched as before.
//!
//! ## Bounded depth: skip-distance probes
//! A chunk lost high in the tree (the root's uplink, a spine link) is missed by a long
//! stretch of consecutive ranks. With the predecessor alone, the chunk then walks the stretch
//! one rank at a time: depth 510 and 2.3 ms for a 512-rank 128 MiB Broadcast at 1e-4 loss
//! (normalised throughput 0.82, below the chain and go-back-N baselines).
//!
//! So when the predecessor answers `Lacking`, the requester also *probes*, once per request,
//! the ranks `d = m * 8^k` places behind it (`m` in `1..8`, `d >= 2`: 2..7, 8, 16, .., 56,
//! 64, ..), each for the runs whose root is at least `d` back (the root holds its block; a
//! rank beyond the root is at the end of its ring, the last to recover). A probed rank
//! answers like a predecessor (without NACKs: probes have no deadline), acknowledging what it
//! holds now and the rest as it recovers. The requester reads each chunk from whichever peer
//! vouches for it first, never from two at once. A rank at distance `x` from the stretch's
//! last holder is reached in about as many rounds as `x` has non-zero base-8 digits (plus the
//! odd predecessor hop when a predecessor recovers first), far below `log2 P` (measured: 3 at
//! 1e-5 and 5 at 1e-4 with 512 ranks, against `log2 512 = 9`), and the root, read only
//! by the ranks a skip distance away, serves each chunk lost on its uplink about
//! `7 * log8 P` times instead of once per rank.
//!
//! Safety of reads from a non-neighbour:
//! * a rank reads only what the probed rank acknowledged (vouched for), as from the
//!   predecessor;
//! * a probed rank registers the prober and keeps its buffer until the prober's `Fin`,
//!   blaming it on the `Fin` deadline like a successor. A probe that arrives after the probed
//!   rank completed is stale and unanswered; since probes are best effort and the predecessor
//!   stays the path with deadlines, nothing waits on it, and no read is issued without an
//!   acknowledgement from a live operation;
//! * the prober sends `Fin` to every rank it probed (a `Fin` to one that never registered is
//!   dropped as stale); the control path is ordered per pair, so the `Fin` never overtakes
//!   the probe.
//!
//! Probes are only sent on `Lacking`, never on `FetchNack`: a predecessor whose cutoff has not
//! fired yet says "not yet", and fanning out then would turn every loss into probes.
//!
//! ### Why not a re-multicast by the root
//! The other option, the root re-multicasting runs missing at several consecutive
//! ranks, needs the receivers' lanes open after the cutoff (they hand their bitmaps back
//! then; reopened with only their own block, a lane would write repeats again instead of
//! dropping them) and, harder, a root that is still there to be asked: a Broadcast root
//! completes when its successor's `Fin` arrives, typically before a rank far down the ring
//! has found out that a long stretch lacks a chunk. Keeping it until then costs either a
//! linger after everyone's cutoff in every run (the loss-free latency of small messages is
//! dominated by it) or a message from every rank. Probes need neither.
//!
//! ### Trade-off, measured
//! 512 ranks, 128 MiB Broadcast, radix-32 fat tree, seed 1 (`cargo run --release -p
//! ringcast-loopback-sim --example recovery -- 512 bcast 134217728 1e-5 1e-4`): normalised
//! throughput / max fetch depth / bytes the root sent over its block / fetch requests.
//!
//! | probes at | 1e-5 | 1e-4 |
//! |---|---|---|
//! | predecessor only (before) | 0.826 / 510 / - / - | 0.821 / 510 / - / - |
//! | `2^k` | 0.9926 / 5 / 1.0000 / 4157 | 0.9912 / 8 / 1.0014 / 4369 |
//! | `m * 4^k` | 0.9935 / 4 / 1.0000 / 5946 | 0.9916 / 6 / 1.0020 / 6251 |
//! | `m * 8^k` (chosen) | 0.9942 / 3 / 1.0000 / 8702 | 0.9891 / 5 / 1.0028 / 9479 |
//!
//! A wider base reaches a long stretch in fewer rounds (lower depth, better at 1e-5, where
//! one pod-wide loss sets the completion) for more probes and more reads served by the root;
//! at 1e-4 the extra reads on the root's and holders' links cost a little. Base 8 is the
//! only one that beats the chain broadcast at 1e-5 (0.9936) and keeps every goal at 1e-4.
//!
//! ### Recovery during the data phase, measured
//! Same command, with 1e-7 and 1e-6; normalised throughput / max fetch depth / root bytes.
//!
//! | recovery starts | 1e-7 | 1e-6 | 1e-5 | 1e-4 |
//! |---|---|---|---|---|
//! | at the cutoff (before) | 0.9957 / 1 / 1.0000 | 0.9957 / 2 / 1.0000 | 0.9942 / 3 / 1.0000 | 0.9891 / 5 / 1.0028 |
//! | settled gaps, root reads too | 0.9969 / 0 / 1.0000 | 0.9960 / 4 / 1.0000 | 0.9957 / 2 / 1.0002 | 0.9230 / 4 / 1.0205 |
//! | no reads from a sending root (chosen) | 1.0000 / 0 / 1.0000 | 0.9999 / 0 / 1.0000 | 0.9995 / 1 / 1.0000 | 0.9952 / 4 / 1.0020 |
//! | watch points every 256 bits everywhere | 0.9996 | 0.9994 | 0.9993 | 0.9952 |
//!
//! Chain broadcast: 0.99995 / 0.99975 / 0.9936 / 0.983; go-back-N: 0.998 / 0.976 / 0.865 /
//! 0.548. The 1024-rank 1 MiB Allgather at 1e-4 completes in 85.95 ms against 85.83 ms
//! loss-free (+0.14%, was +9.8%), depth 5. The price: more control messages (128 k fetch
//! requests and probes at 512 ranks and 1e-4, where 9.5 k did), reads issued while the
//! stream flows (they share the requester's downlink with it), a chunk lost within 64 of a
//! gap check waiting one more check, and a lane that sees reordering giving early recovery
//! up for that operation. The fast path: `handle_chunk` + `commit` 76.5 instructions per
//! chunk in order (75.0 before), the claim alone 59.0 (58.0).

use crate::config::Rank;
use crate::event::{OpError, OpId, ReadId, Transmit};
use crate::lane::{LaneCommand, RxCommand};
use crate::op::{Collective, keepalive_interval, transfer_time};
use crate::out::{ControlMsg, Ctx, Outcome, Outgoing, bump};
use crate::port::ReadRequest;
use crate::timer::Timer;
use crate::wire::{ChunkRun, ControlKind, RunList};
use alloc::vec::Vec;

/// Before the cutoff, a recovered chunk is vouched for only below this many reads behind it
/// (and below `log2 P`).
const EARLY_HOPS: u32 = 4;

/// Skip distances are `m * SKIP_BASE^k` for `m` in `1..SKIP_BASE`, `k >= 0`, at least 2.
pub(crate) const SKIP_BASE: u32 = 8;

/// Whether a rank `d` places further ahead on the ring may probe us (`d` is a skip distance).
pub(crate) fn is_skip(d: u32) -> bool {
    if d < 2 {
        return false;
    }
    let mut x = d;
    while x.is_multiple_of(SKIP_BASE) {
        x /= SKIP_BASE;
    }
    x < SKIP_BASE
}

/// The skip distances up to `limit` (inclusive), ascending.
fn skips_up_to(limit: u32) -> impl Iterator<Item = u32> {
    let mut pow = 1u32;
    let mut m = 1u32;
    core::iter::from_fn(move || {
        loop {
            if m == SKIP_BASE {
                m = 1;
                pow = pow.checked_mul(SKIP_BASE)?;
            }
            let d = m.checked_mul(pow)?;
            m += 1;
            if d > limit {
                return None;
            }
            if d >= 2 {
                return Some(d);
            }
        }
    })
}

/// A fetch request outstanding at one peer: our ring predecessor, or (a probe) a rank a skip
/// distance further back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Fetch {
    peer: Rank,
    /// Requested runs not acknowledged yet.
    pending: Vec<ChunkRun>,
    /// Reads in flight, each with the recovery depth its data will have.
    reads: Vec<(ReadId, ChunkRun, u32)>,
}

impl Fetch {
    fn new(peer: Rank, pending: Vec<ChunkRun>) -> Self {
        Fetch {
            peer,
            pending,
            reads: Vec::new(),
        }
    }

    fn idle(&self) -> bool {
        self.pending.is_empty() && self.reads.is_empty()
    }
}

/// A rank a skip distance further ahead that probed us: it may read what we acknowledge, so
/// we keep our buffer until its `Fin`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Requester {
    rank: Rank,
    /// Runs it asked for that we did not hold yet.
    deferred: Vec<ChunkRun>,
    fin: bool,
}

/// The ring recovery's own state: our requests upstream, the requests made to us, what we
/// recovered, and the `Fin` handshakes.
#[derive(Clone, Debug, Default)]
pub(crate) struct Recovery {
    /// Our request at the predecessor: the reliable path, with deadlines.
    pub(crate) fetch: Option<Fetch>,
    /// The predecessor said it lacks part of `fetch` and we probed further back for it.
    fanned: bool,
    /// Probes at ranks further back: best effort, no deadline.
    skips: Vec<Fetch>,
    /// Every rank we probed in this operation: each one is owed our `Fin`.
    probed: Vec<Rank>,
    /// Runs our successor asked for that we did not hold (or could not vouch for) yet.
    pub(crate) deferred: Option<Vec<ChunkRun>>,
    /// We told our successor we lack part of its request (`Lacking`).
    told: bool,
    /// Ranks further ahead that probed us.
    requesters: Vec<Requester>,
    /// What we recovered by reads, with the length of the chain of reads behind each piece.
    recovered: Vec<(ChunkRun, u32)>,
    fin_sent: bool,
    fin_received: bool,
}

impl Recovery {
    fn fetches(&self) -> impl Iterator<Item = &Fetch> {
        self.fetch.iter().chain(self.skips.iter())
    }

    /// No read in flight.
    pub(crate) fn reads_idle(&self) -> bool {
        self.fetches().all(|f| f.reads.is_empty())
    }

    /// Whether read `id` is ours.
    pub(crate) fn has_read(&self, id: ReadId) -> bool {
        self.fetches().any(|f| f.reads.iter().any(|r| r.0 == id))
    }

    /// Whether we have reads in flight from `peer`.
    pub(crate) fn reads_from(&self, peer: Rank) -> bool {
        self.fetches()
            .any(|f| f.peer == peer && !f.reads.is_empty())
    }

    /// Whom to blame when reads stall: the first peer with reads in flight.
    pub(crate) fn reads_peer(&self, pred: Rank) -> Rank {
        self.fetches()
            .find(|f| !f.reads.is_empty())
            .map_or(pred, |f| f.peer)
    }

    /// Whether a successor or a prober waits for runs we have not acknowledged.
    pub(crate) fn owes_answers(&self) -> bool {
        self.deferred.as_ref().is_some_and(|d| !d.is_empty())
            || self.requesters.iter().any(|r| !r.deferred.is_empty())
    }

    /// Every rank that may read from us said it will not any more.
    pub(crate) fn fins_done(&self) -> bool {
        self.fin_received && self.requesters.iter().all(|r| r.fin)
    }

    /// Whom to blame when a `Fin` does not come: the successor, else a requester.
    pub(crate) fn fin_owed(&self, succ: Rank) -> Rank {
        match self.requesters.iter().find(|r| !r.fin) {
            Some(r) if self.fin_received => r.rank,
            _ => succ,
        }
    }

    /// Whether `from` (not our successor) still owes us a `Fin`.
    pub(crate) fn owes_fin(&self, from: Rank) -> bool {
        self.requesters.iter().any(|r| r.rank == from && !r.fin)
    }

    /// Drops every request we made (we hold everything).
    pub(crate) fn drop_fetches(&mut self) -> bool {
        self.skips.clear();
        self.fanned = false;
        self.fetch.take().is_some()
    }

    /// Sends `Fin` to the predecessor and to every rank we probed, once.
    pub(crate) fn send_fin(&mut self, cx: &mut Ctx<'_>, op: OpId, pred: Rank) {
        if !self.fin_sent {
            self.fin_sent = true;
            cx.send(pred, ControlMsg::simple(ControlKind::Fin, op.0));
            for &q in self.probed.iter().filter(|q| **q != pred) {
                cx.send(q, ControlMsg::simple(ControlKind::Fin, op.0));
            }
        }
    }

    /// `runs` cut where the recovery chain behind them changes, each piece with the longest
    /// chain behind any of its chunks (0: it came on the fast path), in order.
    fn split_by_hops(&self, runs: &[ChunkRun]) -> Vec<(ChunkRun, u32)> {
        let mut out: Vec<(ChunkRun, u32)> = Vec::new();
        for r in runs {
            let mut cuts = alloc::vec![r.start, r.end()];
            for (rec, _) in self.recovered.iter().filter(|(rec, _)| overlaps(*rec, *r)) {
                cuts.extend([rec.start.max(r.start), rec.end().min(r.end())]);
            }
            cuts.sort_unstable();
            cuts.dedup();
            for w in cuts.windows(2) {
                let piece = ChunkRun::span(w[0], w[1]);
                let h = self
                    .recovered
                    .iter()
                    .filter(|(rec, _)| overlaps(*rec, piece))
                    .map(|(_, h)| *h)
                    .max()
                    .unwrap_or(0);
                match out.last_mut() {
                    Some((last, lh)) if *lh == h && last.end() == piece.start => {
                        *last = ChunkRun::span(last.start, piece.end())
                    }
                    _ => out.push((piece, h)),
                }
            }
        }
        out
    }
}

impl Collective {
    /// How many places ahead of us on the ring `r` is.
    fn ahead(&self, r: Rank) -> u32 {
        let p = self.layout.ranks();
        (r.0 + p - self.me.0) % p
    }

    /// The answer to a request we cannot serve in full yet (`lacking`): `Lacking` once we
    /// know we miss part of it (our fast path is over, or a lane settled those chunks
    /// missing), `FetchNack` ("not yet") before.
    fn nack_kind(&self, lacking: &[ChunkRun]) -> ControlKind {
        if (self.cutoff_fired && self.rx.known())
            || self.knows_missing(lacking)
            || self.withholds(lacking)
        {
            ControlKind::Lacking
        } else {
            ControlKind::FetchNack
        }
    }

    /// Before our cutoff, chunks we recovered through `early_hops` reads or more are not
    /// vouched for: a rank asking for them probes further back, where chains are shorter.
    /// Recoveries then overlap in time, and without the bound a rank that asks just after
    /// its predecessor recovered would lengthen the chain by one each time.
    fn withheld(&self) -> Vec<ChunkRun> {
        if self.cutoff_fired {
            return Vec::new();
        }
        let p = self.layout.ranks().max(2);
        let cap = (32 - (p - 1).leading_zeros()).clamp(1, EARLY_HOPS);
        let mut out: Vec<ChunkRun> = self
            .ring
            .recovered
            .iter()
            .filter(|(_, h)| *h >= cap)
            .map(|(r, _)| *r)
            .collect();
        out.sort_unstable();
        out
    }

    /// Whether we hold part of `runs` but do not vouch for it yet (see `withheld`).
    fn withholds(&self, runs: &[ChunkRun]) -> bool {
        self.withheld()
            .iter()
            .any(|w| runs.iter().any(|r| overlaps(*w, *r)))
    }

    /// Whether a chunk of `runs` is known missing here.
    fn knows_missing(&self, runs: &[ChunkRun]) -> bool {
        let mut v = Vec::new();
        for r in runs {
            self.rx.runs_within(&self.layout, *r, false, 1, &mut v);
            if !v.is_empty() {
                return true;
            }
        }
        false
    }

    /// Sends the answer to a request we cannot serve in full yet.
    fn send_nack(&mut self, cx: &mut Ctx<'_>, lacking: &[ChunkRun]) {
        let kind = self.nack_kind(lacking);
        self.ring.told |= kind == ControlKind::Lacking;
        cx.send(self.succ, ControlMsg::simple(kind, self.id.0));
    }

    /// Asks lane `l` to settle the blocks of lane-relative `r` up to its end (once they got
    /// there), one settle per block at a time: its answer brings us back here if more is needed.
    fn ask_settle(&mut self, cx: &mut Ctx<'_>, l: u32, r: ChunkRun) {
        let base = self.layout.lane_start(l);
        let mut pieces = Vec::new();
        let global = ChunkRun {
            start: r.start + base,
            len: r.len,
        };
        self.layout.pieces(global, &mut pieces);
        for p in pieces {
            let asked = (l as u16, p.root);
            if self.settles_asked.contains(&asked) {
                continue;
            }
            self.settles_asked.push(asked);
            let upto = self.layout.block_local(p.run.start, p.root) + p.run.len;
            cx.lane(LaneCommand::Rx {
                lane: l as u16,
                cmd: RxCommand::Settle {
                    op: self.id,
                    block: Rank(p.root),
                    upto: Some(upto),
                },
            });
        }
    }

    /// What the lanes told us changed what we hold or know we miss: acknowledge what we
    /// can, tell a waiting successor we lack the rest once we know, recover it.
    pub(crate) fn lanes_changed(&mut self, cx: &mut Ctx<'_>) -> Option<Outcome> {
        let lacking = self.answer_deferred(cx);
        if !self.ring.told
            && !lacking.is_empty()
            && (self.knows_missing(&lacking) || self.withholds(&lacking))
        {
            self.send_nack(cx, &lacking);
        }
        self.answer_requesters(cx);
        self.start_fetch(cx, None);
        self.progress(cx)
    }

    /// Asks the predecessor for missing chunks, unless a request is outstanding already.
    /// Only chunks known missing are asked for: on a lane still open, those it settled.
    ///
    /// Before our own cutoff fired, with `within`, only the runs `within` are asked for;
    /// afterwards everything missing.
    ///
    /// With a request outstanding, runs it does not name yet are added to it and the whole
    /// request is sent again (the predecessor's answer covers both): chunks found missing
    /// later (a lane settled them, the cutoff came) never wait behind runs the predecessor
    /// is still recovering, so no cycle of ranks waits on each other around the ring.
    pub(crate) fn start_fetch(&mut self, cx: &mut Ctx<'_>, within: Option<&[ChunkRun]>) {
        if self.rx.complete() {
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
        // A chunk being read already is not asked for again.
        for f in self.ring.fetches() {
            for (_, r, _) in &f.reads {
                subtract(&mut runs, *r);
            }
        }
        if let Some(f) = &self.ring.fetch {
            let mut all = f.pending.clone();
            for r in &runs {
                union_into(&mut all, *r);
            }
            all.truncate(max);
            if all == f.pending {
                return;
            }
            runs = all;
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
        match self.ring.fetch.as_mut() {
            Some(f) => f.pending = runs,
            None => self.ring.fetch = Some(Fetch::new(self.pred, runs)),
        }
        self.ring.fanned = false;
        // A grown request keeps its deadline: the predecessor's silence since the first one
        // counts (a rank waiting on a dead predecessor must time out before the ranks that
        // wait on it do, so that its Abort names the right culprit).
        if self.timers.get(Timer::Fetch).is_none() {
            self.timers
                .set(Timer::Fetch, cx.now + cx.config.peer_timeout);
        }
    }

    /// Our successor asks for runs, or a rank a skip distance ahead probes us.
    pub(crate) fn on_fetch(
        &mut self,
        cx: &mut Ctx<'_>,
        from: Rank,
        runs: RunList<'_>,
    ) -> Option<Outcome> {
        let probe = from != self.succ;
        if from == self.me || (probe && !is_skip(self.ahead(from))) {
            bump(&mut cx.stats.control_unexpected);
            return None;
        }
        if runs.iter().any(|r| r.end() > self.layout.total()) {
            bump(&mut cx.stats.control_malformed);
            return None;
        }
        if probe {
            let asked: Vec<ChunkRun> = runs.iter().collect();
            match self.ring.requesters.iter_mut().find(|r| r.rank == from) {
                Some(r) => {
                    r.deferred = asked;
                    r.fin = false;
                }
                None => self.ring.requesters.push(Requester {
                    rank: from,
                    deferred: asked,
                    fin: false,
                }),
            }
            self.answer_requesters(cx);
            return None;
        }
        self.timers
            .set(Timer::Keepalive, cx.now + keepalive_interval(cx.config));
        self.ring.deferred = Some(runs.iter().collect());
        self.ring.told = false;
        let lacking = self.answer_deferred(cx);
        if !lacking.is_empty() {
            bump(&mut cx.stats.fetch_nacks);
            self.send_nack(cx, &lacking);
            self.start_fetch(cx, Some(&lacking));
        }
        None
    }

    /// Acknowledges every deferred run we hold now; keeps (and returns) the rest. Runs a lane
    /// still tracks count as not held: we ask it to settle them, and answer once it did (or
    /// the cutoff brought the bitmaps back).
    pub(crate) fn answer_deferred(&mut self, cx: &mut Ctx<'_>) -> Vec<ChunkRun> {
        let Some(asked) = self.ring.deferred.take() else {
            return Vec::new();
        };
        let lacking = self.answer(cx, self.succ, asked);
        if lacking.is_empty() {
            self.timers.stop(Timer::Keepalive);
        } else {
            self.ring.deferred = Some(lacking.clone());
        }
        lacking
    }

    /// Acknowledges to every requester what it waits for and we hold now.
    pub(crate) fn answer_requesters(&mut self, cx: &mut Ctx<'_>) {
        if self.ring.requesters.iter().all(|r| r.deferred.is_empty()) {
            return;
        }
        let mut reqs = core::mem::take(&mut self.ring.requesters);
        for r in reqs.iter_mut().filter(|r| !r.deferred.is_empty()) {
            let asked = core::mem::take(&mut r.deferred);
            r.deferred = self.answer(cx, r.rank, asked);
        }
        self.ring.requesters = reqs;
    }

    /// Acknowledges to `to` the runs of `asked` we hold; returns the rest.
    ///
    /// While our own block's multicasts are under way we acknowledge nothing: reads from us
    /// would take our uplink from them, and late multicasts cost every rank.
    fn answer(&mut self, cx: &mut Ctx<'_>, to: Rank, asked: Vec<ChunkRun>) -> Vec<ChunkRun> {
        let mut held = Vec::new();
        for r in asked.iter().filter(|_| !self.send.sending()) {
            self.rx
                .runs_within(&self.layout, *r, true, usize::MAX, &mut held);
        }
        for w in self.withheld() {
            subtract(&mut held, w);
        }
        let mut lacking = asked;
        for h in &held {
            subtract(&mut lacking, *h);
        }
        if !held.is_empty() {
            self.send_ack(cx, to, held);
        }
        let mut undecided = Vec::new();
        for r in &lacking {
            self.rx.undecided(&self.layout, *r, &mut undecided);
        }
        for (l, r) in undecided {
            self.ask_settle(cx, l, r);
        }
        lacking
    }

    /// Acknowledges `runs` to `to`, in as many messages as the control size limit needs. Each
    /// message carries the longest recovery chain behind the chunks it names.
    ///
    /// Runs are grouped by that chain's length, so a chunk that arrived on the fast path is
    /// not reported as deep as one recovered through several ranks beside it.
    pub(crate) fn send_ack(&mut self, cx: &mut Ctx<'_>, to: Rank, runs: Vec<ChunkRun>) {
        let mut by_hops: Vec<(u32, Vec<ChunkRun>)> = Vec::new();
        for (r, h) in self.ring.split_by_hops(&runs) {
            match by_hops.iter_mut().find(|g| g.0 == h) {
                Some(g) => g.1.push(r),
                None => by_hops.push((h, alloc::vec![r])),
            }
        }
        for (hops, group) in by_hops {
            for batch in group.chunks(cx.config.max_fetch_runs()) {
                let msg = ControlMsg {
                    kind: ControlKind::FetchAck,
                    op: self.id.0,
                    arg: hops,
                    runs: batch.to_vec(),
                };
                cx.send(to, msg);
            }
        }
    }

    /// Still recovering for our successor: acknowledge what arrived meanwhile, NACK the rest.
    pub(crate) fn keepalive(&mut self, cx: &mut Ctx<'_>) {
        self.timers.stop(Timer::Keepalive);
        let lacking = self.answer_deferred(cx);
        if !lacking.is_empty() {
            self.send_nack(cx, &lacking);
            self.timers
                .set(Timer::Keepalive, cx.now + keepalive_interval(cx.config));
        }
    }

    /// Our fast path is over: tell a successor still waiting that we lack what it asked for.
    pub(crate) fn tell_lacking(&mut self, cx: &mut Ctx<'_>) {
        if let Some(d) = self.ring.deferred.clone().filter(|d| !d.is_empty()) {
            self.send_nack(cx, &d);
        }
    }

    /// The predecessor (or a probed rank) holds these runs: read those we still miss and are
    /// not reading already.
    pub(crate) fn on_fetch_ack(
        &mut self,
        cx: &mut Ctx<'_>,
        from: Rank,
        runs: RunList<'_>,
        hops: u32,
    ) -> Option<Outcome> {
        // Only what is still pending counts: an answer to a request we since asked again
        // (with more runs) may repeat runs it already acknowledged.
        let asked = |f: &Fetch| {
            let mut a = Vec::new();
            if f.peer == from {
                for r in runs.iter() {
                    intersect_into(&f.pending, r, &mut a);
                }
            }
            a
        };
        let mut acked = Vec::new();
        let mut which = None;
        if from == self.pred
            && let Some(f) = &self.ring.fetch
        {
            acked = asked(f);
        }
        if acked.is_empty() {
            for (i, f) in self.ring.skips.iter().enumerate() {
                acked = asked(f);
                if !acked.is_empty() {
                    which = Some(i);
                    break;
                }
            }
        }
        if acked.is_empty() {
            bump(&mut cx.stats.control_unexpected);
            return None;
        }
        let (mut still, mut pieces) = (Vec::new(), Vec::new());
        for &r in &acked {
            self.rx
                .runs_within(&self.layout, r, false, usize::MAX, &mut still);
        }
        // A chunk on its way from another peer is not read twice.
        for f in self.ring.fetches() {
            for (_, r, _) in &f.reads {
                subtract(&mut still, *r);
            }
        }
        // Each read within what the transport takes in one.
        let most = cx.config.max_read_chunks();
        for m in &still {
            self.layout.pieces_of_at_most(*m, most, &mut pieces);
        }
        if !pieces.is_empty() {
            cx.stats.max_fetch_depth = cx.stats.max_fetch_depth.max(hops);
        }
        let depth = hops.saturating_add(1);
        let bytes: u64 = pieces.iter().map(|p| p.len).sum();
        let f = match which {
            None => self.ring.fetch.as_mut()?,
            Some(i) => &mut self.ring.skips[i],
        };
        for p in &pieces {
            let id = cx.read_id();
            cx.out
                .push_back(Outgoing::Ready(Transmit::Read(ReadRequest {
                    id,
                    op: self.id,
                    from,
                    run: p.run,
                    offset: p.offset,
                    len: p.len,
                })));
            bump(&mut cx.stats.reads);
            f.reads.push((id, p.run, depth));
        }
        for r in &acked {
            subtract(&mut f.pending, *r);
        }
        let (reads_done, pending_done) = (f.reads.is_empty(), f.pending.is_empty());
        if !pieces.is_empty() {
            // The reads are one-sided: allow for moving the bytes before blaming the peer.
            let at = cx.now + cx.config.peer_timeout + transfer_time(cx.config, bytes);
            match self.timers.get(Timer::Reads) {
                Some(_) => self.timers.extend(Timer::Reads, at),
                None => self.timers.set(Timer::Reads, at),
            }
        }
        match which {
            Some(i) => {
                if reads_done && pending_done {
                    self.ring.skips.swap_remove(i);
                }
                None
            }
            None if reads_done && pending_done => self.fetch_round_done(cx),
            None => {
                if pending_done {
                    self.timers.stop(Timer::Fetch);
                }
                None
            }
        }
    }

    /// The predecessor is recovering on our behalf and is alive. With `known`, it misses part
    /// of what we asked for: probe ranks further back for that part, once per request.
    pub(crate) fn on_fetch_nack(
        &mut self,
        cx: &mut Ctx<'_>,
        from: Rank,
        known: bool,
    ) -> Option<Outcome> {
        let pending = self
            .ring
            .fetch
            .as_ref()
            .is_some_and(|f| !f.pending.is_empty());
        if from != self.pred || !pending {
            bump(&mut cx.stats.control_unexpected);
            return None;
        }
        if known && !self.ring.fanned {
            self.fan_out(cx);
        }
        None
    }

    /// Probes the ranks at every skip distance behind us for what the predecessor lacks, each
    /// for the runs whose root is at least that far back (the root itself holds its block, and
    /// a rank beyond it would be at the end of the root's ring, the last to recover).
    fn fan_out(&mut self, cx: &mut Ctx<'_>) {
        self.ring.fanned = true;
        let Some(f) = self.ring.fetch.as_ref() else {
            return;
        };
        let (p, me) = (self.layout.ranks(), self.me.0);
        let back = |root: u32| (me + p - root) % p;
        let mut pieces = Vec::new();
        for r in &f.pending {
            self.layout.pieces(*r, &mut pieces);
        }
        pieces.retain(|pc| pc.root != me);
        let Some(far) = pieces.iter().map(|pc| back(pc.root)).max() else {
            return;
        };
        let max = cx.config.max_fetch_runs();
        for d in skips_up_to(far.min(p - 1)) {
            let q = Rank((me + p - d) % p);
            if q == self.pred {
                continue;
            }
            let mut runs: Vec<ChunkRun> = Vec::new();
            for pc in pieces.iter().filter(|pc| back(pc.root) >= d) {
                let full = runs.len() >= max;
                match runs.last_mut() {
                    Some(last) if last.end() == pc.run.start => last.len += pc.run.len,
                    _ if full => break,
                    _ => runs.push(pc.run),
                }
            }
            // A rank probed already is probed again only for runs it was not asked for.
            let probed = self.ring.skips.iter().position(|s| s.peer == q);
            if let Some(i) = probed {
                let mut all = self.ring.skips[i].pending.clone();
                for r in &runs {
                    union_into(&mut all, *r);
                }
                all.truncate(max);
                if all == self.ring.skips[i].pending {
                    continue;
                }
                runs = all;
            }
            if runs.is_empty() {
                continue;
            }
            bump(&mut cx.stats.fetch_requests);
            let msg = ControlMsg {
                kind: ControlKind::Fetch,
                op: self.id.0,
                arg: 0,
                runs: runs.clone(),
            };
            cx.send(q, msg);
            match probed {
                Some(i) => self.ring.skips[i].pending = runs,
                None => self.ring.skips.push(Fetch::new(q, runs)),
            }
            if !self.ring.probed.contains(&q) {
                self.ring.probed.push(q);
            }
        }
    }

    /// A read we issued finished.
    pub(crate) fn on_read_done(
        &mut self,
        cx: &mut Ctx<'_>,
        id: ReadId,
        ok: bool,
    ) -> Option<Outcome> {
        let take = |f: &mut Fetch| {
            let i = f.reads.iter().position(|r| r.0 == id)?;
            let (_, run, hops) = f.reads.swap_remove(i);
            Some((f.peer, run, hops))
        };
        let mut issued = self.ring.fetch.as_mut().and_then(take);
        let from_pred = issued.is_some();
        let mut skip_idle = None;
        if issued.is_none() {
            for (i, f) in self.ring.skips.iter_mut().enumerate() {
                issued = take(f);
                if issued.is_some() {
                    skip_idle = f.idle().then_some(i);
                    break;
                }
            }
        }
        let Some((peer, run, hops)) = issued else {
            bump(&mut cx.stats.control_unexpected);
            return None;
        };
        if let Some(i) = skip_idle {
            self.ring.skips.swap_remove(i);
        }
        if !ok {
            let error = OpError::ReadFailed { peer };
            return Some(Outcome::Failed { error, abort: true });
        }
        let new = self.rx.record_fetched(&self.layout, run);
        self.ring.recovered.push((run, hops));
        cx.stats.chunks_fetched = cx.stats.chunks_fetched.saturating_add(u64::from(new));
        // Pass it on at once: our successor (or a requester) may be waiting for exactly this.
        self.answer_deferred(cx);
        self.answer_requesters(cx);
        if self.ring.reads_idle() {
            self.timers.stop(Timer::Reads);
        }
        if from_pred && self.ring.fetch.as_ref().is_none_or(Fetch::idle) {
            return self.fetch_round_done(cx);
        }
        self.progress(cx)
    }

    fn fetch_round_done(&mut self, cx: &mut Ctx<'_>) -> Option<Outcome> {
        self.ring.fetch = None;
        self.ring.fanned = false;
        self.timers.stop(Timer::Fetch);
        if self.ring.reads_idle() {
            self.timers.stop(Timer::Reads);
        }
        // More runs than one message held, chunks settled missing meanwhile, or a deferred
        // request still unanswered: everything known missing.
        self.start_fetch(cx, None);
        self.progress(cx)
    }

    /// Our successor (or a rank that probed us) will not read from us again.
    pub(crate) fn on_fin(&mut self, cx: &mut Ctx<'_>, from: Rank) -> Option<Outcome> {
        if from == self.succ && !self.ring.fin_received {
            self.ring.fin_received = true;
            self.ring.deferred = None;
            self.timers.stop(Timer::Keepalive);
        } else if let Some(r) = self
            .ring
            .requesters
            .iter_mut()
            .find(|r| r.rank == from && !r.fin)
        {
            r.fin = true;
            r.deferred.clear();
        } else {
            bump(&mut cx.stats.control_unexpected);
            return None;
        }
        if self.ring.fins_done() {
            self.timers.stop(Timer::Fin);
        }
        self.progress(cx)
    }
}

fn overlaps(a: ChunkRun, b: ChunkRun) -> bool {
    a.start < b.end() && b.start < a.end()
}

/// Appends the parts of `run` inside the sorted, disjoint `runs`, in order.
fn intersect_into(runs: &[ChunkRun], run: ChunkRun, out: &mut Vec<ChunkRun>) {
    let i = runs.partition_point(|r| r.end() <= run.start);
    for r in runs[i..].iter().take_while(|r| r.start < run.end()) {
        out.push(ChunkRun::span(
            r.start.max(run.start),
            r.end().min(run.end()),
        ));
    }
}

/// Adds `run` to the sorted, disjoint `runs`, merging what it touches.
fn union_into(runs: &mut Vec<ChunkRun>, run: ChunkRun) {
    if run.len == 0 {
        return;
    }
    let i = runs.partition_point(|r| r.end() < run.start);
    let j = runs.partition_point(|r| r.start <= run.end());
    let (mut s, mut e) = (run.start, run.end());
    if i < j {
        s = s.min(runs[i].start);
        e = e.max(runs[j - 1].end());
    }
    runs.splice(i..j, [ChunkRun::span(s, e)]);
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
