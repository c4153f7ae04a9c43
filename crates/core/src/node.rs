//! One rank on one thread: the session and its lanes, passing commands and notes in place.

use crate::config::{Config, ConfigError, Rank};
use crate::event::{
    DropReason, Event, OpId, Placement, ReadError, ReadId, StartError, Stats, Transmit,
};
use crate::lane::{LaneCommand, LaneRx, LaneTx, Multicast};
use crate::session::Session;
use crate::time::Instant;
use alloc::vec::Vec;

/// A [`Session`] with one [`LaneRx`] and one [`LaneTx`] per lane, for a driver that runs a
/// rank on one thread (the simulator, tests, fuzz targets, a DPA-less host). Commands and
/// notes pass in place after every input, so its methods mirror the session's, plus the
/// lanes' inputs and outputs.
///
/// An engine that gives each lane its own thread uses the three parts directly instead and
/// passes commands and notes over queues.
///
/// ```
/// use ringcast_core::{Config, Instant, Node, Rank, Transmit};
/// let mut leaf = Node::new(Config::new(1, 2)).unwrap();
/// leaf.start_broadcast(Instant::ZERO, Rank(0), 8192).unwrap();
/// let mut buf = Vec::new();
/// // The leaf's first output: `Ready` to the root (the RNR barrier).
/// assert!(matches!(leaf.poll_transmit(&mut buf), Some(Transmit::Control { to: Rank(0), .. })));
/// ```
#[derive(Debug)]
pub struct Node {
    session: Session,
    rx: Vec<LaneRx>,
    tx: Vec<LaneTx>,
    tx_cursor: usize,
    /// Chunks reported on a lane this rank does not have.
    no_such_lane: u64,
}

impl Node {
    /// A rank from a validated configuration.
    pub fn new(config: Config) -> Result<Self, ConfigError> {
        let session = Session::new(config)?;
        let c = session.config();
        let rx = (0..c.lanes).map(|l| LaneRx::new(c, l)).collect();
        let tx = (0..c.lanes).map(|l| LaneTx::new(c, l)).collect();
        Ok(Node {
            session,
            rx,
            tx,
            tx_cursor: 0,
            no_such_lane: 0,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        self.session.config()
    }

    /// The control path.
    pub fn session(&self) -> &Session {
        &self.session
    }

    /// Lane `l`'s receive half.
    pub fn lane_rx(&self, l: u16) -> Option<&LaneRx> {
        self.rx.get(usize::from(l))
    }

    /// Lane `l`'s send half.
    pub fn lane_tx(&self, l: u16) -> Option<&LaneTx> {
        self.tx.get(usize::from(l))
    }

    /// Every counter: the session's and every lane's.
    pub fn stats(&self) -> Stats {
        let mut s = *self.session.stats();
        self.rx.iter().for_each(|r| s.add_rx(&r.stats()));
        self.tx.iter().for_each(|t| s.add_tx(t.stats()));
        s.dropped_wrong_lane = s.dropped_wrong_lane.saturating_add(self.no_such_lane);
        s
    }

    /// Operations in flight.
    pub fn inflight(&self) -> usize {
        self.session.inflight()
    }

    /// See [`Session::can_start`].
    pub fn can_start(&self) -> bool {
        self.session.can_start()
    }

    /// See [`Session::start_broadcast`].
    pub fn start_broadcast(
        &mut self,
        now: Instant,
        root: Rank,
        len: u64,
    ) -> Result<OpId, StartError> {
        let r = self.session.start_broadcast(now, root, len);
        self.route(now);
        r
    }

    /// See [`Session::skip_op`].
    pub fn skip_op(&mut self) -> OpId {
        self.session.skip_op()
    }

    /// See [`Session::refuse_op`].
    pub fn refuse_op(&mut self) -> OpId {
        self.session.refuse_op()
    }

    /// See [`Session::abandon_op`].
    pub fn abandon_op(&mut self, culprit: Rank) -> OpId {
        self.session.abandon_op(culprit)
    }

    /// See [`Session::set_queued`].
    pub fn set_queued(&mut self, queued: bool) {
        self.session.set_queued(queued)
    }

    /// See [`Session::failed_elsewhere`].
    pub fn failed_elsewhere(&mut self, seq: OpId, culprit: Rank) {
        self.session.failed_elsewhere(seq, culprit)
    }

    /// See [`Session::start_allgather`].
    pub fn start_allgather(&mut self, now: Instant, sizes: &[u64]) -> Result<OpId, StartError> {
        let r = self.session.start_allgather(now, sizes);
        self.route(now);
        r
    }

    /// A chunk arrived on `lane`: see [`LaneRx::handle_chunk`]. Copy a placed payload, then
    /// call [`commit`](Self::commit).
    #[inline]
    pub fn handle_chunk(&mut self, lane: u16, from: Rank, imm: u32, len: usize) -> Placement {
        match self.rx.get_mut(usize::from(lane)) {
            Some(rx) => rx.handle_chunk(from, imm, len),
            None => {
                self.no_such_lane = self.no_such_lane.saturating_add(1);
                Placement::Drop(DropReason::WrongLane)
            }
        }
    }

    /// The payload of a chunk placed for `op` on `lane` is written. Returns whether the
    /// session heard of it (the lane filled up): only then may outputs or timers have changed.
    ///
    /// The driver's contract, as [`LaneRx::commit`](crate::lane::LaneRx::commit)'s: exactly
    /// one commit per [`Placement::Place`], after its bytes are written (or one
    /// [`release`](Self::release), when they could not be).
    #[inline]
    pub fn commit(&mut self, now: Instant, lane: u16, op: OpId) -> bool {
        let Some(rx) = self.rx.get_mut(usize::from(lane)) else {
            return false;
        };
        rx.commit(op);
        // Most commits change nothing the session sees.
        let heard = rx.has_notes();
        if heard {
            self.route(now);
        }
        heard
    }

    /// The payload of a chunk placed on `lane` (sent by `from` with immediate `imm`) could not
    /// be written: call this instead of [`commit`](Self::commit). The chunk is recovered like
    /// a lost one; see [`LaneRx::release`](crate::lane::LaneRx::release).
    pub fn release(&mut self, lane: u16, from: Rank, imm: u32) {
        if let Some(rx) = self.rx.get_mut(usize::from(lane)) {
            rx.release(from, imm);
        }
    }

    /// See [`Session::handle_control`].
    pub fn handle_control(&mut self, now: Instant, from: Rank, bytes: &[u8]) {
        self.session.handle_control(now, from, bytes);
        self.route(now);
    }

    /// See [`Session::handle_read_done`].
    pub fn handle_read_done(&mut self, now: Instant, id: ReadId, result: Result<(), ReadError>) {
        self.session.handle_read_done(now, id, result);
        self.route(now);
    }

    /// The transport finished `chunks` multicasts of `op` on `lane`.
    pub fn handle_send_done(&mut self, now: Instant, lane: u16, op: OpId, chunks: u32) {
        if let Some(tx) = self.tx.get_mut(usize::from(lane)) {
            tx.handle_send_done(op, chunks);
            self.route(now);
        }
    }

    /// See [`Session::handle_peer_lost`].
    pub fn handle_peer_lost(
        &mut self,
        now: Instant,
        peer: Rank,
        first: OpId,
        blamed: Option<Rank>,
    ) {
        self.session.handle_peer_lost(now, peer, first, blamed);
        self.route(now);
    }

    /// See [`Session::handle_timeout`].
    pub fn handle_timeout(&mut self, now: Instant) {
        self.session.handle_timeout(now);
        self.route(now);
    }

    /// See [`Session::poll_transmit`].
    pub fn poll_transmit(&mut self, buf: &mut Vec<u8>) -> Option<Transmit> {
        self.session.poll_transmit(buf)
    }

    /// The next multicast of any lane; lanes take turns.
    pub fn poll_multicast(&mut self) -> Option<Multicast> {
        let n = self.tx.len();
        for k in 0..n {
            let l = (self.tx_cursor + k) % n;
            if let Some(m) = self.tx[l].poll_multicast() {
                self.tx_cursor = (l + 1) % n;
                return Some(m);
            }
        }
        None
    }

    /// Whether any output may be waiting: a transmit, an event or a multicast. A driver may
    /// skip draining when it is false.
    pub fn has_output(&self) -> bool {
        self.session.has_output() || self.tx.iter().any(|t| t.may_send())
    }

    /// Whether multicasts wait only for a send window to open.
    pub fn sends_blocked(&self) -> bool {
        self.tx.iter().any(|t| t.blocked())
    }

    /// See [`Session::poll_event`].
    pub fn poll_event(&mut self) -> Option<Event> {
        self.session.poll_event()
    }

    /// See [`Session::poll_timeout`].
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.session.poll_timeout()
    }

    /// Passes the session's commands to the lanes and the lanes' notes to the session until
    /// neither side has anything left.
    fn route(&mut self, now: Instant) {
        loop {
            let mut moved = false;
            while let Some(cmd) = self.session.poll_lane_command() {
                moved = true;
                match cmd {
                    LaneCommand::Rx { lane, cmd } => {
                        if let Some(rx) = self.rx.get_mut(usize::from(lane)) {
                            rx.handle_command(cmd);
                        }
                    }
                    LaneCommand::Tx { lane, cmd } => {
                        if let Some(tx) = self.tx.get_mut(usize::from(lane)) {
                            tx.handle_command(cmd);
                        }
                    }
                }
            }
            for rx in &mut self.rx {
                while let Some(n) = rx.poll_note() {
                    moved = true;
                    self.session.handle_lane_note(now, n.into());
                }
            }
            for tx in &mut self.tx {
                while let Some(n) = tx.poll_note() {
                    moved = true;
                    self.session.handle_lane_note(now, n.into());
                }
            }
            if !moved {
                return;
            }
        }
    }
}
