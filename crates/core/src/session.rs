//! The session: one rank's protocol endpoint. Inputs in, outputs drained.

use crate::config::{Config, ConfigError, Rank};
use crate::event::{Event, OpError, OpId, ReadError, ReadId, StartError, Stats, Transmit};
use crate::lane::{LaneCommand, LaneNote, RxNote, TxNote};
use crate::op::{Collective, transfer_time};
use crate::out::{ControlMsg, Ctx, Outcome, Outgoing, bump};
use crate::reports::Reports;
use crate::time::Instant;
use crate::wire::{ControlKind, ControlRepr, Standing};
use alloc::collections::VecDeque;
use alloc::vec::Vec;
use bitvec::prelude::*;
use core::cell::Cell;

/// Control messages that arrived for an operation this rank has not started yet.
#[derive(Debug)]
struct Early {
    seq: u64,
    /// `Ready`s, with the shape each carried (at most one per rank).
    ready: Vec<(Rank, u32)>,
    activate: BitVec<u64, Lsb0>,
    /// The first `Abort` or `Mismatch`, as the error it gives.
    abort: Option<OpError>,
    /// The ranks that sent an `Abort` or a `Mismatch` kept here (they ended it).
    ended: BitVec<u64, Lsb0>,
}

impl Early {
    /// Nothing is kept for the operation.
    fn is_empty(&self) -> bool {
        self.ready.is_empty()
            && self.activate.not_any()
            && self.abort.is_none()
            && self.ended.not_any()
    }

    /// `from` sent a `Ready` or an `Activate` kept here: it started the operation.
    fn started_by(&self, from: Rank) -> bool {
        self.activate[from.index()] || self.ready.iter().any(|&(r, _)| r == from)
    }
}

/// How many operations that ended without a barrier here (skipped, or empty) a session
/// remembers, to compare the `Ready`s that still come for them.
const RECENT_KEEP: usize = 256;

/// An operation that ended here without a barrier.
#[derive(Debug)]
struct Recent {
    seq: u64,
    /// `None`: skipped (it ran over another path); `Some`: empty, with its shape.
    shape: Option<u32>,
    /// Skipped because this rank refused the call ([`Session::refuse_op`]): a disagreement
    /// on it is this rank's doing.
    refused: bool,
    /// The other ranks were told of a disagreement on it.
    told: bool,
}

enum EarlyKind {
    Ready(u32),
    Activate,
    Abort(OpError),
}

/// One rank's protocol endpoint.
///
/// Methods come in four groups, as in quinn-proto:
/// * getters: [`config`](Self::config), [`stats`](Self::stats), [`inflight`](Self::inflight);
/// * commands: [`start_broadcast`](Self::start_broadcast),
///   [`start_allgather`](Self::start_allgather);
/// * inputs (`handle_*`): control messages, read completions, notes from the lanes, timeouts;
/// * outputs (`poll_*`): after **every** command or input, drain
///   [`poll_lane_command`](Self::poll_lane_command), [`poll_transmit`](Self::poll_transmit) and
///   [`poll_event`](Self::poll_event) until they return `None`, then re-arm the timer from
///   [`poll_timeout`](Self::poll_timeout).
///
/// The session is the control path only: chunks are handled by the lanes
/// ([`LaneRx`](crate::lane::LaneRx), [`LaneTx`](crate::lane::LaneTx)), which it steers with
/// commands and hears from through notes. [`Node`](crate::Node) bundles the three for a
/// single-threaded driver.
///
/// Time is passed in and must never go backwards. The session never touches payload bytes.
#[derive(Debug)]
pub struct Session {
    config: Config,
    next_seq: u64,
    ops: Vec<Collective>,
    out: VecDeque<Outgoing>,
    events: VecDeque<Event>,
    early: Vec<Early>,
    /// The last [`RECENT_KEEP`] operations skipped or empty here.
    recent: VecDeque<Recent>,
    stats: Stats,
    lane_out: VecDeque<LaneCommand>,
    next_read: u64,
    /// `poll_timeout`'s answer, until an input changes a timer (`None`: not computed). Chunks
    /// never reach the session, so on the hot path this is computed once and reused.
    timeout: Cell<Option<Option<Instant>>>,
    /// Per rank, the last failure it reported (`Abort`): the operation and the rank it named,
    /// until an operation after it completes here. A rank this one waits on that failed an
    /// earlier operation over a third rank is stuck on that rank, not hung itself.
    reports: Reports,
    /// When the last operations that ran here ended, and how long each takes on the link
    /// (at most [`ENDED_KEEP`]): a rank may still wait in one of them on its successor's
    /// `Fin` (see [`Self::barrier_slack`]).
    ended: VecDeque<(Instant, core::time::Duration)>,
    /// The last operation this rank posted failed, naming the rank held here, and nothing
    /// was posted since: its program may have stopped over that failure (a disagreement on
    /// an operation does not count: the program goes on). Told to ranks that ask where this
    /// one stands on a later operation ([`Standing::NotPostedAfter`]).
    stopped_over: Option<Rank>,
    /// The application posted operations this session has not started yet (they wait for
    /// room, see [`Self::set_queued`]): its program did not stop, whatever failed last.
    queued: bool,
    /// The last [`FAILED_KEEP`] runs of operations that failed here (consecutive ids, first
    /// and past-the-last, naming one rank), each with the rank its failures named: told to a
    /// rank that asks about one while still in its barrier ([`Standing::EndedAfter`]). Runs,
    /// so that a burst of operations abandoned over one rank (a queue of them failing behind
    /// a rank that never posts) does not crowd out the first ones, which the peers' barriers
    /// are still asking about.
    failures: VecDeque<(u64, u64, Rank)>,
}

/// How many runs of failed operations [`Session::standing`] remembers.
const FAILED_KEEP: usize = 64;

/// How many ended operations [`Session::barrier_slack`] looks at.
const ENDED_KEEP: usize = 8;

macro_rules! cx {
    ($s:ident, $now:expr) => {
        Ctx {
            now: $now,
            config: &$s.config,
            out: &mut $s.out,
            stats: &mut $s.stats,
            lanes: &mut $s.lane_out,
            next_read: &mut $s.next_read,
        }
    };
}

impl Session {
    /// A session for `config.rank`, or why the configuration is invalid.
    pub fn new(config: Config) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(Session {
            next_seq: 0,
            ops: Vec::new(),
            out: VecDeque::new(),
            events: VecDeque::new(),
            early: Vec::new(),
            recent: VecDeque::new(),
            stats: Stats::default(),
            lane_out: VecDeque::new(),
            next_read: 0,
            timeout: Cell::new(None),
            reports: Reports::new(config.rank, config.ranks),
            ended: VecDeque::new(),
            stopped_over: None,
            queued: false,
            failures: VecDeque::new(),
            config,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Counters of the control path (the lanes count chunks: see
    /// [`Stats::add_rx`] and [`Node::stats`](crate::Node::stats)).
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Operations in flight.
    pub fn inflight(&self) -> usize {
        self.ops.len()
    }

    /// Whether the next collective may start now: fewer than `limits.max_inflight_ops` are in
    /// flight, and none holds the immediate tag of the next id. Ids skipped for operations
    /// that run elsewhere ([`Self::skip_op`]) move the next id on without starting anything,
    /// so a long run of them while one collective is in flight can bring the tag around to
    /// that collective's; a lane would then take one operation's chunks for the other's.
    pub fn can_start(&self) -> bool {
        self.start_blocker().is_none()
    }

    fn start_blocker(&self) -> Option<StartError> {
        if self.ops.len() >= self.config.limits.max_inflight_ops as usize {
            return Some(StartError::TooManyInflight);
        }
        let tag = self.config.imm.tag_of(self.next_seq);
        self.ops
            .iter()
            .find(|o| o.tag == tag)
            .map(|o| StartError::TagInUse { op: o.id })
    }

    /// Starts a Broadcast of `len` bytes from `root`. Every rank must call it, in the same order
    /// relative to other collectives, with the same `root` and `len`.
    ///
    /// The operation's buffer is `len` bytes: the root's holds the data, every leaf's must be
    /// ready to receive when this is called (the lanes' `Open` commands this queues are
    /// handed to the lanes before anything else).
    pub fn start_broadcast(
        &mut self,
        now: Instant,
        root: Rank,
        len: u64,
    ) -> Result<OpId, StartError> {
        self.start(now, |cx, id| Collective::broadcast(cx, id, root, len))
    }

    /// Starts an Allgatherv: rank `r` contributes `sizes[r]` bytes (zero allowed). Every rank
    /// must call it, in the same order relative to other collectives, with the same `sizes`.
    ///
    /// The operation's buffer is the concatenation of all blocks in rank order (block `r` at
    /// byte `sizes[..r].sum()`). Before calling, the caller places its own block there (the
    /// local copy of `MPI_Allgather`); it is never sent to itself.
    pub fn start_allgather(&mut self, now: Instant, sizes: &[u64]) -> Result<OpId, StartError> {
        self.start_allgather_tagged(now, sizes, 0)
    }

    /// [`start_allgather`](Self::start_allgather) for a collective of a library's own kind
    /// (see [`allgather_shape_tagged`](crate::allgather_shape_tagged)): every rank passes the
    /// same `tag`, and a rank that starts a plain Allgather of the same sizes in its place
    /// fails it with a `ShapeMismatch` instead of exchanging bytes with it.
    pub fn start_allgather_tagged(
        &mut self,
        now: Instant,
        sizes: &[u64],
        tag: u32,
    ) -> Result<OpId, StartError> {
        self.start(now, |cx, id| Collective::allgather(cx, id, sizes, tag))
    }

    /// Takes the next operation id without running anything here: the operation runs over
    /// another path (ringcast sends short ones over TCP). Every rank must skip the same ids,
    /// in the same order relative to the collectives it starts, so that ids keep naming the
    /// same operation everywhere; a rank that started the operation instead waits for ranks
    /// that skipped it, never mistaking it for the next one. Messages for a skipped id are
    /// stale, but a `Ready` for it (before or after the skip) says that its sender started
    /// the operation: this rank tells every other one (`Mismatch`, naming the sender), so
    /// that the ranks that started it fail it at once, not at their deadline.
    pub fn skip_op(&mut self) -> OpId {
        self.take_skipped(false)
    }

    /// Takes the next operation id for a call this rank refused before starting it (its
    /// arguments failed the caller's own checks: a root out of range, a buffer of the wrong
    /// size). As [`Self::skip_op`], but the disagreement is this rank's, and every other rank
    /// is told at once (`Mismatch` naming this rank): the ranks that started the operation,
    /// or start it later, fail it at once blaming this rank, not at their deadline; those that
    /// ran it over another path, or skip it too, take the message as stale.
    pub fn refuse_op(&mut self) -> OpId {
        let id = self.take_skipped(true);
        // `Ready`s that came early told the others already (`late_ready`).
        let untold = self
            .recent
            .iter_mut()
            .find(|r| r.seq == id.0)
            .is_some_and(|r| !core::mem::replace(&mut r.told, true));
        if untold {
            self.tell_others(ControlKind::Mismatch, id.0, self.config.rank, None);
        }
        id
    }

    /// Takes the next operation id for an operation that does not run here (`refused`: see
    /// [`Self::refuse_op`], else [`Self::skip_op`]).
    fn take_skipped(&mut self, refused: bool) -> OpId {
        let id = OpId(self.next_seq);
        self.next_seq += 1;
        self.stopped_over = None;
        self.ended_here(id.0, None, refused);
        id
    }

    /// Tells every other rank but `skip` that operation `seq` ended over `culprit`: `kind` is
    /// `Mismatch` (the ranks disagree on it) or `Abort`.
    fn tell_others(&mut self, kind: ControlKind, seq: u64, culprit: Rank, skip: Option<Rank>) {
        for r in (0..self.config.ranks).map(Rank) {
            if r != self.config.rank && Some(r) != skip {
                let msg = ControlMsg {
                    kind,
                    op: seq,
                    arg: culprit.0,
                    runs: Vec::new(),
                };
                self.out.push_back(Outgoing::Control { to: r, msg });
            }
        }
    }

    /// Operation `seq`, which ran over another path ([`Self::skip_op`]), failed there naming
    /// `culprit`: if nothing was posted since, a rank that asks where this one stands on a
    /// later operation hears that its program may have stopped over that failure
    /// ([`Standing::NotPostedAfter`]), as after a failure here. Ignored for an operation
    /// that did not run elsewhere, one posted since, or a culprit that is this rank.
    pub fn failed_elsewhere(&mut self, seq: OpId, culprit: Rank) {
        let skipped = self
            .recent
            .iter()
            .any(|r| r.seq == seq.0 && r.shape.is_none());
        if skipped && seq.0 + 1 == self.next_seq && culprit != self.config.rank {
            self.stopped_over = Some(culprit);
        }
    }

    /// Whether the application posted operations that wait to start here (the caller holds
    /// them while [`Self::can_start`] says no). While it has, a rank that asks where this
    /// one stands on the next operation hears that it has not posted it
    /// ([`Standing::NotPosted`]: waited for), never that its program may have stopped over
    /// its last failure.
    pub fn set_queued(&mut self, queued: bool) {
        self.queued = queued;
    }

    /// Takes the next operation id for an operation this rank fails without starting it (a
    /// peer it needs is gone; the failure names `culprit`). Nothing runs and nothing is
    /// sent: a rank waiting in its barrier asks where this one stands, and hears that it
    /// failed it naming `culprit` ([`Standing::EndedAfter`]: the ranks do not disagree on it,
    /// as with [`Self::skip_op`]). (Told at once instead, a rank that had not heard of the
    /// loss yet would fail its next operation over this rank's report, not over the loss
    /// itself.) Messages for it are stale.
    pub fn abandon_op(&mut self, culprit: Rank) -> OpId {
        let id = OpId(self.next_seq);
        self.next_seq += 1;
        self.stopped_over = (culprit != self.config.rank).then_some(culprit);
        self.early.retain(|e| e.seq != id.0);
        self.failed_here(id.0, culprit);
        id
    }

    /// Operation `seq` failed here naming `culprit` (see [`Self::standing`]).
    fn failed_here(&mut self, seq: u64, culprit: Rank) {
        match self.failures.back_mut() {
            Some((_, end, c)) if *end == seq && *c == culprit => *end += 1,
            _ => keep_last(&mut self.failures, FAILED_KEEP, (seq, seq + 1, culprit)),
        }
    }

    /// Operation `seq` ended here without a barrier: skipped (`shape` `None`) or empty. Its
    /// `Ready`s that came early are compared now, later ones on arrival ([`Self::late_ready`]).
    fn ended_here(&mut self, seq: u64, shape: Option<u32>, refused: bool) {
        let r = Recent {
            seq,
            shape,
            refused,
            told: false,
        };
        keep_last(&mut self.recent, RECENT_KEEP, r);
        let early = self.early.iter().position(|e| e.seq == seq);
        if let Some(e) = early.map(|i| self.early.swap_remove(i)) {
            for (from, shape) in e.ready {
                self.late_ready(seq, from, shape);
            }
        }
    }

    /// A `Ready` from `from` for operation `seq` with `shape`, which this rank ended without a
    /// barrier: true if that is what it expects (an empty operation of the same shape).
    /// Otherwise the ranks disagree on the operation (`from` started one that this rank
    /// skipped, or one with bytes where this rank's was empty): every other rank is told,
    /// once (`Mismatch`, naming `from`), so that the ranks waiting in its barrier fail it at
    /// once, not at their deadline.
    fn late_ready(&mut self, seq: u64, from: Rank, shape: u32) -> bool {
        let Some(r) = self.recent.iter_mut().find(|r| r.seq == seq) else {
            return false;
        };
        if r.shape == Some(shape) {
            return true;
        }
        if core::mem::replace(&mut r.told, true) {
            return false;
        }
        let culprit = if r.refused { self.config.rank } else { from };
        self.tell_others(ControlKind::Mismatch, seq, culprit, None);
        false
    }

    fn start(
        &mut self,
        now: Instant,
        make: impl FnOnce(&Ctx<'_>, OpId) -> Result<Collective, StartError>,
    ) -> Result<OpId, StartError> {
        self.timeout.set(None);
        if let Some(e) = self.start_blocker() {
            return Err(e);
        }
        let id = OpId(self.next_seq);
        let slack = self.barrier_slack(now);
        let mut cx = cx!(self, now);
        let mut op = make(&cx, id)?;
        self.next_seq += 1;
        self.stopped_over = None;
        if self.config.ranks == 1 {
            self.early.retain(|e| e.seq != id.0);
            self.events.push_back(Event::Completed { op: id });
            return Ok(id);
        }
        if op.is_empty() {
            // Nothing moves; the `Ready` still goes out, so that ranks that posted it with
            // bytes hear of the disagreement (see the barrier).
            op.say_ready(&mut cx);
            let shape = op.barrier.shape();
            self.ended_here(id.0, Some(shape), false);
            self.events.push_back(Event::Completed { op: id });
            return Ok(id);
        }
        let early = self
            .early
            .iter()
            .position(|e| e.seq == id.0)
            .map(|i| self.early.swap_remove(i));
        op.barrier_slack = slack;
        let mut outcome = op.on_start(&mut cx);
        if let Some(e) = early {
            for (r, shape) in e.ready {
                outcome = outcome.or_else(|| op.on_ready(&mut cx, r, shape));
            }
            for r in e.activate.iter_ones() {
                outcome = outcome.or_else(|| op.on_activate(&mut cx, Rank(r as u32)));
            }
            if let Some(error) = e.abort {
                outcome = outcome.or(Some(Outcome::Failed {
                    error,
                    abort: false,
                }));
            }
        }
        self.ops.push(op);
        if let Some(o) = outcome {
            self.finish(self.ops.len() - 1, o, now);
        }
        Ok(id)
    }

    /// How much longer than usual the barrier waits (the hub for every `Ready`, the others
    /// for the hub's `Go`) right after operations that ended here: a rank it waits on may
    /// still be in one of them, waiting on a `Fin` (`2 * peer_timeout` and the operation's
    /// time on the link, from about when this rank finished it) or on a read, and the
    /// verdict of that wait (its `Abort`, which names the rank it waited on, see
    /// [`Self::reports`]) must come first. One and a half peer timeouts and the link time of
    /// the longest operation that ended within such a wait: the others then wait 3.5 peer
    /// timeouts for `Go` (2 with no operation before), and the hub, once one peer timeout
    /// passed with two ranks or more silent, this much more (see the barrier).
    fn barrier_slack(&self, now: Instant) -> core::time::Duration {
        let pt = self.config.peer_timeout;
        self.ended
            .iter()
            .filter(|&&(at, link)| now.saturating_duration_since(at) < pt * 2 + link)
            .map(|&(_, link)| link + pt * 3 / 2)
            .max()
            .unwrap_or_default()
    }

    /// `from` reported a failure of operation `seq` naming `culprit` (its `Abort`). Only for
    /// an operation this rank ran or may still run (within the window of operations in
    /// flight): a report far ahead would outlive every completion that clears it; and no rank
    /// blames itself (such a report is noise). Whether it was kept.
    fn reported(&mut self, from: Rank, seq: u64, culprit: Rank) -> bool {
        let window = u64::from(self.config.limits.max_inflight_ops);
        let horizon = self.next_seq.saturating_add(window);
        self.reports.report(from, seq, culprit, horizon)
    }

    /// A verdict of this rank's timers (`PeerUnresponsive`), unless a failure was reported
    /// since the last operation that completed here: the rank it names may be stuck in that
    /// operation, or have failed it (its program then posts nothing more) on hearing of it.
    /// Then the rank that failure named: the one the named rank reported, else the earliest.
    fn verdict(&self, error: OpError) -> OpError {
        let OpError::PeerUnresponsive { peer } = error else {
            return error;
        };
        match self.reports.blame(peer) {
            Some((culprit, reported_by)) => OpError::PeerFailed {
                peer: culprit,
                reported_by,
            },
            None => error,
        }
    }

    /// A control message arrived from `from` on the reliable path. Malformed, stale or
    /// unexpected messages are dropped and counted.
    pub fn handle_control(&mut self, now: Instant, from: Rank, bytes: &[u8]) {
        if let Some(culprit) = self.control(now, from, bytes) {
            self.fail_waits_on(now, culprit, from);
        }
    }

    /// [`Self::handle_control`]; the rank an `Abort` reported failed, if it was one.
    fn control(&mut self, now: Instant, from: Rank, bytes: &[u8]) -> Option<Rank> {
        self.timeout.set(None);
        if bytes.len() > self.config.limits.max_control_len || from.0 >= self.config.ranks {
            bump(&mut self.stats.control_malformed);
            return None;
        }
        let Ok(msg) = ControlRepr::parse_bytes(bytes) else {
            bump(&mut self.stats.control_malformed);
            return None;
        };
        let seq = msg.op();
        if let ControlRepr::Where { op } = msg {
            if from == self.config.rank {
                bump(&mut self.stats.control_unexpected);
                return None;
            }
            let msg = ControlMsg::here(op, self.standing(op));
            self.out.push_back(Outgoing::Control { to: from, msg });
            return None;
        }
        let report = match msg {
            ControlRepr::Abort { culprit, .. } if culprit < self.config.ranks => {
                Some(Rank(culprit)).filter(|&c| self.reported(from, seq, c))
            }
            _ => None,
        };
        let Some(i) = self.ops.iter().position(|o| o.id.0 == seq) else {
            self.control_for_unstarted(from, &msg);
            return report;
        };
        let mut cx = cx!(self, now);
        let op = &mut self.ops[i];
        op.heard_from(&cx, from);
        let outcome = match msg {
            ControlRepr::Ready { shape, .. } => op.on_ready(&mut cx, from, shape),
            ControlRepr::Go { .. } => op.on_go(&mut cx, from),
            ControlRepr::Fetch { runs, .. } => op.on_fetch(&mut cx, from, runs),
            ControlRepr::FetchAck { runs, hops, .. } => op.on_fetch_ack(&mut cx, from, runs, hops),
            ControlRepr::FetchNack { .. } => op.on_fetch_nack(&mut cx, from, false),
            ControlRepr::Lacking { .. } => op.on_fetch_nack(&mut cx, from, true),
            ControlRepr::Fin { .. } => op.on_fin(&mut cx, from),
            ControlRepr::Activate { .. } => op.on_activate(&mut cx, from),
            ControlRepr::Here { standing, .. } => op.on_here(&mut cx, from, standing),
            ControlRepr::Where { .. } => None, // answered above
            ControlRepr::Abort { .. } | ControlRepr::Mismatch { .. } => {
                match failure(from, &msg, self.config.ranks) {
                    Some(error) => Some(Outcome::Failed {
                        error,
                        abort: false,
                    }),
                    None => {
                        bump(&mut cx.stats.control_malformed);
                        None
                    }
                }
            }
        };
        if let Some(o) = outcome {
            self.finish(i, o, now);
        }
        report
    }

    /// Where this rank stands on operation `seq`, for a rank that asked (`Where`).
    fn standing(&self, seq: u64) -> Standing {
        if self.ops.iter().any(|o| o.id.0 == seq) {
            Standing::Running
        } else if seq < self.next_seq {
            if self.recent.iter().any(|r| r.seq == seq) {
                Standing::EndedApart
            } else if let Some(&(.., c)) = self.failures.iter().find(|f| (f.0..f.1).contains(&seq))
            {
                Standing::EndedAfter(c.0)
            } else {
                Standing::Ended
            }
        } else {
            match self.stopped_over {
                Some(c) if !self.queued => Standing::NotPostedAfter(c.0),
                _ => Standing::NotPosted,
            }
        }
    }

    /// `reporter` failed an operation over `culprit`: the operations still in their barrier
    /// waiting on that rank fail now (see the barrier's `on_report`).
    fn fail_waits_on(&mut self, now: Instant, culprit: Rank, reporter: Rank) {
        let mut i = 0;
        while i < self.ops.len() {
            match self.ops[i].on_report(culprit, reporter) {
                Some(o) => self.finish(i, o, now),
                None => i += 1,
            }
        }
    }

    fn control_for_unstarted(&mut self, from: Rank, msg: &ControlRepr<'_>) {
        let seq = msg.op();
        let window = u64::from(self.config.limits.max_inflight_ops);
        if seq < self.next_seq {
            let expected = match *msg {
                ControlRepr::Ready { shape, .. } => self.late_ready(seq, from, shape),
                _ => false,
            };
            if !expected {
                bump(&mut self.stats.control_stale);
            }
            return;
        }
        let keep = match *msg {
            ControlRepr::Ready { shape, .. } => EarlyKind::Ready(shape),
            ControlRepr::Activate { .. } => EarlyKind::Activate,
            _ => match failure(from, msg, self.config.ranks) {
                Some(error) => EarlyKind::Abort(error),
                None => {
                    bump(&mut self.stats.control_unexpected);
                    return;
                }
            },
        };
        // How far ahead a peer may be is not bounded: this rank takes the ids of operations
        // that run elsewhere ([`Self::skip_op`]) only as it posts them, so a peer that ran a
        // thousand of them over TCP and then started one here is a thousand ids ahead of this
        // session. What is bounded is how many operations one peer has in flight that this
        // rank has not started: none completes before every rank started it (its barrier), so
        // at most `window` (with the same limits everywhere), whose `Ready`s and `Activate`s
        // are kept. Its failures are not bounded so (a failed operation is over there): they
        // are kept apart, at most `window` of them too, so that they never crowd out a
        // `Ready`; one dropped only costs the fast failure. Beyond that, from one sender, it
        // is noise: dropped, so what is kept stays within `2 * ranks * window` entries.
        let aborting = matches!(keep, EarlyKind::Abort(_));
        let from_sender = self
            .early
            .iter()
            .filter(|e| {
                let kept = if aborting {
                    e.ended[from.index()]
                } else {
                    e.started_by(from)
                };
                e.seq != seq && kept
            })
            .count();
        if from_sender as u64 >= window {
            bump(&mut self.stats.control_unexpected);
            // A full quota of `Ready`s and `Activate`s gives way to a lower id, the highest
            // one kept dropped: an honest rank's early messages are for the operations just
            // ahead of this one, and a sender of far-future ids (confused, or hostile) must
            // not crowd out the next operation's. (A failure dropped only costs the fast
            // failure: those stay first come.)
            let highest = (!aborting)
                .then(|| {
                    self.early
                        .iter()
                        .enumerate()
                        .filter(|(_, e)| e.seq != seq && e.started_by(from))
                        .max_by_key(|(_, e)| e.seq)
                        .filter(|(_, e)| e.seq > seq)
                        .map(|(i, _)| i)
                })
                .flatten();
            let Some(i) = highest else {
                return;
            };
            let e = &mut self.early[i];
            e.ready.retain(|&(r, _)| r != from);
            e.activate.set(from.index(), false);
            if e.is_empty() {
                self.early.swap_remove(i);
            }
        }
        let ranks = self.config.ranks as usize;
        let e = match self.early.iter().position(|e| e.seq == seq) {
            Some(i) => &mut self.early[i],
            None => {
                self.early.push(Early {
                    seq,
                    ready: Vec::new(),
                    activate: bitvec![u64, Lsb0; 0; ranks],
                    abort: None,
                    ended: bitvec![u64, Lsb0; 0; ranks],
                });
                self.early.last_mut().expect("just pushed")
            }
        };
        match keep {
            EarlyKind::Ready(shape) => {
                if e.ready.iter().any(|&(r, _)| r == from) {
                    bump(&mut self.stats.control_unexpected);
                } else {
                    e.ready.push((from, shape));
                }
            }
            EarlyKind::Activate => e.activate.set(from.index(), true),
            EarlyKind::Abort(error) => {
                e.ended.set(from.index(), true);
                e.abort = e.abort.or(Some(error));
            }
        }
    }

    /// A read issued by [`Transmit::Read`] finished (or failed). An unknown `id` (its
    /// operation ended meanwhile) is ignored.
    pub fn handle_read_done(&mut self, now: Instant, id: ReadId, result: Result<(), ReadError>) {
        self.timeout.set(None);
        let Some(i) = self.ops.iter().position(|o| o.ring.has_read(id)) else {
            return;
        };
        let mut cx = cx!(self, now);
        if let Some(o) = self.ops[i].on_read_done(&mut cx, id, result.is_ok()) {
            self.finish(i, o, now);
        }
    }

    /// A note from a lane (drained from [`LaneRx::poll_note`](crate::lane::LaneRx::poll_note)
    /// or [`LaneTx::poll_note`](crate::lane::LaneTx::poll_note)). Notes for operations that
    /// ended are ignored.
    pub fn handle_lane_note(&mut self, now: Instant, note: LaneNote) {
        self.timeout.set(None);
        let (op, lane) = match &note {
            LaneNote::Rx(
                RxNote::Full { op, lane }
                | RxNote::Closed { op, lane, .. }
                | RxNote::Count { op, lane, .. }
                | RxNote::Started { op, lane, .. }
                | RxNote::Progress { op, lane, .. }
                | RxNote::Settled { op, lane, .. },
            )
            | LaneNote::Tx(TxNote::SendsDone { op, lane } | TxNote::Sent { op, lane, .. }) => {
                (*op, *lane)
            }
        };
        // A note from a lane this session does not have (a driver's routing bug): dropped.
        if lane >= self.config.lanes {
            return;
        }
        let Some(i) = self.ops.iter().position(|o| o.id == op) else {
            return;
        };
        let mut cx = cx!(self, now);
        let c = &mut self.ops[i];
        let outcome = match note {
            LaneNote::Rx(RxNote::Full { lane, .. }) => c.on_lane_full(&mut cx, lane),
            LaneNote::Rx(RxNote::Closed { lane, bitmap, .. }) => {
                c.on_lane_closed(&mut cx, lane, bitmap.0)
            }
            LaneNote::Rx(RxNote::Count { committed, .. }) => c.on_lane_count(&mut cx, committed),
            LaneNote::Rx(RxNote::Started { lane, block, .. }) => {
                c.on_lane_started(&cx, lane, block);
                None
            }
            LaneNote::Rx(RxNote::Progress { lane, block, .. }) => {
                c.on_lane_progress(&cx, lane, block);
                None
            }
            LaneNote::Rx(RxNote::Settled {
                lane,
                block,
                run,
                missing,
                ..
            }) => c.on_lane_settled(&mut cx, lane, block, run, &missing),
            LaneNote::Tx(TxNote::Sent { lane, done, .. }) => c.on_sent(lane, done),
            LaneNote::Tx(TxNote::SendsDone { lane, .. }) => {
                c.on_sends_done(lane);
                // Requests held back while we were sending may be answered now.
                c.lanes_changed(&mut cx)
            }
        };
        if let Some(o) = outcome {
            self.finish(i, o, now);
        }
    }

    /// The transport lost `peer` (its control connection closed, or it left): every operation
    /// in flight from `first` on fails at once naming it, and the other ranks hear of it
    /// through `Abort` (sent before anything else this rank sends them). Operations before
    /// `first` are ones the peer had finished when it left cleanly: they need nothing more of it.
    ///
    /// A peer that left over a failure it named (`blamed`, from its goodbye) left because of
    /// that rank, whose failure may not have reached this rank yet (it travels over other
    /// connections, or this rank was past that operation): the operations fail with
    /// [`OpError::PeerFailed`] naming `blamed` as reported by `peer`, the `Abort`s name it,
    /// and it counts as `peer`'s report for this rank's later verdicts. A `blamed` that is
    /// this rank or no rank is ignored.
    pub fn handle_peer_lost(
        &mut self,
        now: Instant,
        peer: Rank,
        first: OpId,
        blamed: Option<Rank>,
    ) {
        self.timeout.set(None);
        if peer.0 >= self.config.ranks || peer == self.config.rank {
            return;
        }
        let blamed = blamed.filter(|b| b.0 < self.config.ranks && *b != self.config.rank);
        let report = blamed.filter(|&b| self.reported(peer, first.0, b));
        let error = match blamed {
            Some(b) => OpError::PeerFailed {
                peer: b,
                reported_by: peer,
            },
            None => OpError::PeerLost { peer },
        };
        let mut i = 0;
        while i < self.ops.len() {
            if self.ops[i].id >= first {
                self.finish(i, Outcome::Failed { error, abort: true }, now);
            } else {
                i += 1;
            }
        }
        // The operations it finished may still wait on the rank it blamed.
        if let Some(b) = report {
            self.fail_waits_on(now, b, peer);
        }
    }

    /// Timers may have expired. A spurious call is harmless.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.timeout.set(None);
        let mut i = 0;
        while i < self.ops.len() {
            let due = self.ops[i].next_timeout().is_some_and(|t| t <= now);
            if due {
                let mut cx = cx!(self, now);
                if let Some(o) = self.ops[i].on_timeout(&mut cx) {
                    let o = match o {
                        Outcome::Failed { error, abort } => Outcome::Failed {
                            error: self.verdict(error),
                            abort,
                        },
                        o => o,
                    };
                    self.finish(i, o, now);
                    continue; // `finish` removed op `i`
                }
            }
            i += 1;
        }
    }

    /// The next thing to transmit. Control messages are written into `buf` (cleared first).
    pub fn poll_transmit(&mut self, buf: &mut Vec<u8>) -> Option<Transmit> {
        while let Some(o) = self.out.pop_front() {
            return Some(match o {
                Outgoing::Control { to, msg } => {
                    buf.clear();
                    // Our own messages are canonical by construction.
                    if msg.repr().emit_vec(buf).is_err() {
                        debug_assert!(false, "emitting {msg:?} failed");
                        continue;
                    }
                    Transmit::Control { to, len: buf.len() }
                }
                Outgoing::Ready(t) => t,
            });
        }
        None
    }

    /// Whether a `poll_*` output (transmit, lane command, event) is waiting.
    pub fn has_output(&self) -> bool {
        !self.out.is_empty() || !self.lane_out.is_empty() || !self.events.is_empty()
    }

    /// The next command for a lane.
    pub fn poll_lane_command(&mut self) -> Option<LaneCommand> {
        self.lane_out.pop_front()
    }

    /// When to call [`handle_timeout`](Self::handle_timeout) next.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        if let Some(t) = self.timeout.get() {
            return t;
        }
        let t = self.ops.iter().filter_map(|o| o.next_timeout()).min();
        self.timeout.set(Some(t));
        t
    }

    /// The next completion or failure.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    fn finish(&mut self, i: usize, outcome: Outcome, now: Instant) {
        let mut op = self.ops.remove(i);
        let link = transfer_time(&self.config, op.layout.bytes());
        keep_last(&mut self.ended, ENDED_KEEP, (now, link));
        if matches!(outcome, Outcome::Completed) {
            // Every rank took part in it: what was reported before is over.
            self.reports.completed(op.id.0);
        }
        let failed = matches!(outcome, Outcome::Failed { .. });
        if let Outcome::Failed { error, .. } = outcome {
            self.failed_here(op.id.0, error.peer());
            if op.id.0 + 1 == self.next_seq
                && error.peer() != self.config.rank
                && !matches!(error, OpError::ShapeMismatch { .. })
            {
                self.stopped_over = Some(error.peer());
            }
        }
        op.close_lanes(&mut cx!(self, Instant::ZERO), failed);
        match outcome {
            Outcome::Completed => self.events.push_back(Event::Completed { op: op.id }),
            Outcome::Failed { error, abort } => {
                if abort {
                    let culprit = error.peer();
                    // A rank that stopped answering is not told; one whose shape differs, or
                    // that did not post in time, is alive and fails the operation too (at
                    // once when it posts it).
                    let (kind, tell_culprit) = match error {
                        OpError::ShapeMismatch { .. } => (ControlKind::Mismatch, true),
                        OpError::NotPosted { .. } => (ControlKind::Abort, true),
                        _ => (ControlKind::Abort, false),
                    };
                    let skip = (!tell_culprit).then_some(culprit);
                    self.tell_others(kind, op.id.0, culprit, skip);
                }
                self.events.push_back(Event::Failed { op: op.id, error });
            }
        }
    }
}

/// Appends `x` to `q`, dropping the oldest entry when `q` already holds `cap`.
fn keep_last<T>(q: &mut VecDeque<T>, cap: usize, x: T) {
    if q.len() == cap {
        q.pop_front();
    }
    q.push_back(x);
}

/// What an `Abort` or a `Mismatch` from `from` tells: the error to fail its operation with
/// (`None` for another kind of message, or a culprit that is not a rank).
fn failure(from: Rank, msg: &ControlRepr<'_>, ranks: u32) -> Option<OpError> {
    match *msg {
        ControlRepr::Abort { culprit, .. } if culprit < ranks => Some(OpError::PeerFailed {
            peer: Rank(culprit),
            reported_by: from,
        }),
        ControlRepr::Mismatch { culprit, .. } if culprit < ranks => Some(OpError::ShapeMismatch {
            peer: Rank(culprit),
            reported_by: from,
        }),
        _ => None,
    }
}
