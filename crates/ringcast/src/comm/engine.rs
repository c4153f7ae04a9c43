//! The engine: one control thread, and per lane a receive worker and a send worker.
//!
//! ## Who owns what
//! | thread | owns | does |
//! |---|---|---|
//! | control (`ringcast-r{rank}`) | the [`Session`], the TCP control path ([`TcpControl`](ringcast_transport_rocev2_udp::TcpControl)), the operations' buffers and requests, the [`RateController`](ringcast_transport_rocev2_udp::pace::RateController) | posts, control messages, reads, timers, lane commands, completions, rate reports |
//! | lane `l` receive (`-rx{l}`) | lane `l`'s [`LaneRx`](ringcast_core::lane::LaneRx) and [`UdpRx`](ringcast_transport_rocev2_udp::UdpRx) | `recvmmsg` batches, `handle_chunk`, the copy into the buffer, `commit` |
//! | lane `l` send (`-tx{l}`) | lane `l`'s [`LaneTx`](ringcast_core::lane::LaneTx), [`UdpTx`](ringcast_transport_rocev2_udp::UdpTx) and [`Pacer`] | the root's multicasts, one GSO batch per pacer release |
//!
//! Buffers are shared through the transport's registry ([`OpBuffer`]: a reader-writer lock
//! per stripe of a buffer, so that workers reach disjoint parts of it at once):
//! the workers find an operation's buffer by its id, per batch, so a buffer that was released
//! is simply not found (the chunk is counted, never written). The transport adds one I/O thread
//! for all of TCP, whatever the number of peers.
//!
//! ## Queues
//! Per lane and direction one bounded `sync_channel` ([`QUEUE`](lane::QUEUE) deep), each with
//! one producer and one consumer: lane commands to the receive worker (`RxCommand`) and to the
//! send worker (`TxCommand`, or a new pacing rate), lane notes back from each. The control
//! thread blocks on a full command queue (a worker empties its queue at every turn of its
//! loop, whatever else it waits for); a worker never blocks on a note queue (it keeps what
//! did not fit, in order, and retries), so neither side can wait on the other in a cycle.
//! A worker that queued a note unparks the control thread.
//!
//! ## Why the order is safe
//! The core's rules ([`ringcast_core::lane`]) hold across the threads:
//! * **Commands before later chunks.** After every input the control thread hands *all* of
//!   the session's lane commands to the queues before it sends *any* control message. A
//!   lane's `Open` is queued with the operation's start, before this rank's `Ready` leaves,
//!   and no root multicasts before every `Ready` arrived: so the `Open` is in the receive
//!   worker's queue before the first chunk of the operation can reach its socket. The worker
//!   drains its queue after each socket read and before it handles the batch read, so it
//!   handles the `Open` first. (A channel send happens-before the receive that gets it.)
//! * **Commit after the copy, before the next command.** The receive worker claims a chunk
//!   (`handle_chunk`), copies it into the buffer (`consume`), then commits it, and takes no
//!   command until the whole batch is done. The notes it queues at commit (`Full`) therefore
//!   vouch only for written bytes, and a `Close` is handled only between batches: the bitmap
//!   it hands back (`Closed`) has every set bit written.
//! * **Notes follow the state they describe.** A note is queued after the lane's state that
//!   produced it, and the session takes notes for ended operations as no-ops, so a note
//!   that crosses a `Close` or an operation's failure is harmless.
//! * **Sends.** The send worker reads the buffer only between a `Start` and its
//!   `SendsDone`/`Cancel`; a `Cancel` drops its queued multicasts at once.
//! * **One operation per tag.** Chunks name their operation by a tag, the low bits of its id
//!   (12 of them). Ids of the operations that ran over TCP are skipped, so a tag can come around
//!   within a few multicast operations: the next operation waits while one with its tag is in
//!   flight ([`Session::can_start`]), and after one with its tag ended here until every
//!   receive worker has read its socket empty since (`TagQuarantine`; at most the peer
//!   timeout), before its `Open` and its `Ready`: no lane ever takes one operation's queued
//!   chunks for another's.
//!
//! ## Sleeping
//! Nothing spins. The control thread parks until the session's next timer; every input
//! unparks it: a post ([`PostTx`]), a worker's note, a control frame or read completion (the
//! transport's I/O thread, [`TcpControl::wake_on_arrival`](ringcast_transport_rocev2_udp::TcpControl::wake_on_arrival)).
//! [`IDLE_WAIT`] and [`BUSY_WAIT`] only cap a park. A receive worker sleeps on its socket and
//! an eventfd (a datagram wakes it, and the control thread does after queuing it a command:
//! [`RxWaker`](ringcast_transport_rocev2_udp::RxWaker));
//! a send worker blocks on its command queue, until the pacer's next release when it has
//! something queued.
//!
//! ## Pacing
//! See [`rate`]: receivers report during an operation (every few milliseconds, at once after
//! socket drops) and at its end (unless they reported moments ago without new drops), the root's AIMD controller sets one rate, the send workers' token buckets ([`Pacer`]) release one GSO batch at a time at their
//! share of it. `RINGCAST_PACING=off` disables it; `RINGCAST_PIN=1` pins the threads.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TryRecvError};
use std::sync::{Arc, Weak};
use std::thread;
use std::time::{Duration, Instant as StdInstant};

use ringcast_core::lane::{LaneCommand, LaneRx, LaneTx};
use ringcast_core::port::{self, ControlInput, ControlPort, Ports};
use ringcast_core::{Event, Node, OpError, OpId, Rank, Session, StartError, Stats};
use ringcast_transport_rocev2_udp::pace::{Pacer, ReceiverReport};
use ringcast_transport_rocev2_udp::{OpBuffer, PeerLost, Registry, UdpRx, UdpTx};

use super::blame::{Blame, Lost, doomed_by};
use super::error::CommError;
use super::fallback::LossTap;
use super::request::Completion;
use super::split::Builds;
use super::stats::{CommStats, ControlCounters, Counters, OpStats, add_rx, add_tx, core_drops};
use super::track::{TrackedControl, TrackedTx};

#[path = "engine_lane.rs"]
mod lane;
#[path = "engine_rate.rs"]
mod rate;

use lane::{Clock, LaneLink, Pinning, TagQuarantine, TxMsg};
use rate::Rates;

/// With nothing in flight, the longest the control thread parks between turns. Every input
/// wakes it ([`PostTx`], the workers' notes, the transport's I/O thread), so this only bounds a
/// missed wake-up.
const IDLE_WAIT: Duration = Duration::from_millis(20);
/// With operations in flight, the longest it parks (or less, to the session's next timer):
/// the drain of failed operations' buffers is checked at this pace.
const BUSY_WAIT: Duration = Duration::from_millis(2);
/// How long an operation's buffer waits after its verdict for its transport work to drain
/// before it is released anyway (it is owned by the engine: a late write lands nowhere). A
/// finished operation waits for the peers' reads of its buffer, and a peer that stopped
/// reading would otherwise withhold its request's answer for good: its queued read fails
/// instead (a frame whose buffer no longer holds its bytes shuts its connection down).
const DRAIN_LIMIT: Duration = Duration::from_secs(5);
/// How long the goodbye may take to flush when the communicator is dropped.
const LINGER: Duration = Duration::from_secs(1);
/// While operations with remote roots are in flight, a rank reports to their roots this
/// often, so that their rate climbs back within an operation and not once per operation.
const REPORT_EVERY: Duration = Duration::from_millis(5);
/// ... and this soon after its sockets dropped datagrams (at most this often).
const REPORT_ON_DROPS: Duration = Duration::from_millis(1);

/// A collective, as posted by the application thread.
#[derive(Debug)]
pub(crate) enum Kind {
    Broadcast {
        root: u32,
    },
    /// `tag`: 0 for the user's; a collective of the library's own (a split's exchange)
    /// otherwise, which a user's Allgather of the same sizes never matches
    /// ([`ringcast_core::allgather_shape_tagged`]).
    Allgather {
        sizes: Vec<u64>,
        tag: u32,
    },
}

/// An operation posted and not started yet.
#[derive(Debug)]
pub(crate) struct Post {
    pub(crate) kind: Kind,
    /// The operation's buffer: the caller's vector, or its slice lent by a blocking call
    /// ([`OpBuffer::lend`]), which the reply's [`OpBuffer::take`] lets go of.
    pub(crate) buf: OpBuffer,
    pub(crate) reply: SyncSender<Completion>,
    pub(crate) span: tracing::Span,
    /// The communicator's index of this operation, when a router numbers them (the small
    /// ones run over TCP, never reaching the engine): the engine skips the ids of those it
    /// did not get (`Session::skip_op`), so that an id names the same operation on every
    /// rank even where ranks disagree on a length and so on where it runs.
    pub(crate) index: Option<u64>,
    /// The operation failed this rank's checks before it was posted ([`Post::forfeit`]):
    /// it only takes its id, which the peers' operation of that id then fails against.
    pub(crate) forfeit: bool,
    /// When the application posted it ([`Engine::stalled`]).
    pub(crate) posted: StdInstant,
    /// The fallback's loss window, which a multicast operation tells its stats when it
    /// completes (whether or not anyone waits for its request). Weak: the engine must not
    /// keep the fallback's dispatcher's inbox open.
    pub(crate) tap: Option<Weak<LossTap>>,
}

impl Post {
    /// The place in the sequence of an operation that failed this rank's own checks: its id
    /// is taken all the same (`Session::refuse_op`), so that the next operation still meets
    /// the same one at every rank. The peers fail this one at once (`ShapeMismatch` naming
    /// this rank, which `refuse_op` tells them), never with another operation's bytes.
    pub(crate) fn forfeit(index: Option<u64>) -> Post {
        Post {
            kind: Kind::Broadcast { root: 0 },
            buf: OpBuffer::default(),
            // Nobody waits for it: the caller got its error already.
            reply: mpsc::sync_channel(1).0,
            span: tracing::Span::none(),
            index,
            forfeit: true,
            posted: StdInstant::now(),
            tap: None,
        }
    }
}

/// The application's (and the fallback router's) end of the post channel: every send also
/// unparks the control thread, which parks between turns while operations are in flight.
#[derive(Clone, Debug)]
pub(crate) struct PostTx {
    tx: SyncSender<Command>,
    engine: thread::Thread,
    /// How many operations the router has numbered (see [`Self::numbered`]).
    numbered: Arc<AtomicU64>,
    /// The engine's record of whom this rank's failures blame, which the TCP path shares.
    blame: Blame,
}

impl PostTx {
    pub(crate) fn new(
        tx: SyncSender<Command>,
        engine: thread::Thread,
        numbered: Arc<AtomicU64>,
        blame: Blame,
    ) -> Self {
        PostTx {
            tx,
            engine,
            numbered,
            blame,
        }
    }

    /// Whom this rank's failures blame: one record with the engine's.
    pub(crate) fn blame(&self) -> &Blame {
        &self.blame
    }

    /// The router numbered every operation below `next`, and sent the engine those of them
    /// that it runs before this call. Without a wake-up: the engine takes the ids of the
    /// others (they run over TCP) at its next turn ([`Engine::skip_numbered`]), so that a
    /// peer that asks where this rank stands on one hears that it ran elsewhere.
    pub(crate) fn numbered(&self, next: u64) {
        self.numbered.store(next, Ordering::Release);
    }

    /// The error hands the command back (a post's reply is then failed by the caller).
    #[allow(
        clippy::result_large_err,
        reason = "the error is the post, handed back"
    )]
    pub(crate) fn send(&self, c: Command) -> Result<(), std::sync::mpsc::SendError<Command>> {
        let sent = self.tx.send(c);
        self.engine.unpark();
        sent
    }
}

/// What the application thread sends the engine.
#[derive(Debug)]
pub(crate) enum Command {
    Post(Post),
    Stats(SyncSender<CommStats>),
    /// Stop as the communicator's drop would ([`Communicator::abort`](super::Communicator::abort)).
    Abort,
}

type EnginePorts = Ports<UdpRx, TrackedTx, TrackedControl>;

#[derive(Debug)]
struct Live {
    op: OpId,
    buf: OpBuffer,
    len: u64,
    /// The ranks that multicast in it (they get this rank's rate report at its end).
    roots: Vec<u32>,
    /// Where this rank multicasts in it, the most roots any receiver hears at once (the
    /// pacing rate's share, see [`rate`]); 0 where it does not.
    fan_in: u64,
    /// Taken when the requester was answered (a failure is answered at once).
    reply: Option<SyncSender<Completion>>,
    started: StdInstant,
    base: Counters,
    /// The core's verdict, once its event arrived.
    verdict: Option<Result<(), OpError>>,
    /// When the verdict came.
    ended_at: Option<StdInstant>,
    span: tracing::Span,
    tap: Option<Weak<LossTap>>,
}

impl Live {
    /// The operation's stats, given the engine's counters now.
    fn stats(&self, now: &Counters) -> OpStats {
        OpStats {
            op: self.op.0,
            bytes: self.len,
            elapsed: self.started.elapsed(),
            counters: now.since(&self.base),
        }
    }
}

/// The lane halves and ports, until [`Engine::run`] hands them to their workers.
#[derive(Debug)]
struct Unstarted {
    rx: Vec<(LaneRx, UdpRx)>,
    tx: Vec<(LaneTx, UdpTx)>,
}

/// The control thread.
pub(crate) struct Engine {
    session: Session,
    control: TrackedControl,
    registry: Registry,
    posts: Receiver<Command>,
    unstarted: Option<Unstarted>,
    lanes: Vec<LaneLink>,
    rates: Rates,
    /// When this rank last sent a rate report, and the socket drops it carried.
    reported: Option<(StdInstant, u64)>,
    queued: VecDeque<Post>,
    live: Vec<Live>,
    lost: Vec<Lost>,
    /// The last failure over a rank that does not go on (`NotPosted`, `PeerUnresponsive`,
    /// `PeerFailed`, `PeerLost`, and this rank's own `SendsStalled`; not a `ShapeMismatch`,
    /// whose rank is alive and well, nor a `ReadFailed`, one operation's) and when it came.
    /// The operations posted before it and still queued then fail with it, as NCCL's
    /// operations fail once a timeout aborted the communicator: behind a rank that never
    /// posts they would otherwise wait a post timeout more per window of operations the session runs at once (200 queued, 10 min: 40 min
    /// for the last). Operations posted after it run as usual.
    stalled: Option<(CommError, StdInstant)>,
    /// With `RINGCAST_PIN=1`, the first core of this rank's threads.
    pin_base: usize,
    /// The splits building new communicators from this one: they hear of every rank lost.
    builds: Arc<Builds>,
    /// Whom this rank's failures blame, and its goodbye: one record with the TCP path's.
    blame: Blame,
    /// The last TCP failure handed to the session ([`Self::heard_tcp_failure`]).
    heard_failed: Option<u64>,
    /// The id the session gives the next operation it starts.
    next_op: u64,
    /// How many operations the router has numbered ([`PostTx::numbered`]).
    numbered: Arc<AtomicU64>,
    /// Tags of operations that ended lately, which the next one with that tag waits out.
    quarantine: TagQuarantine,
    clock: Clock,
    buf: Vec<u8>,
    completed: u64,
    failed: u64,
    cancelled: u64,
}

impl Engine {
    /// The engine of `node`'s rank over `ports`. The node only brings its configuration: the
    /// engine splits the rank into a session and lane halves of its own, one per thread.
    pub(crate) fn new(
        node: Node,
        ports: EnginePorts,
        posts: Receiver<Command>,
        numbered: Arc<AtomicU64>,
        blame: Blame,
        pin_base: usize,
        builds: Arc<Builds>,
    ) -> Self {
        let config = node.config().clone();
        let session = Session::new(config.clone()).expect("the node's configuration is valid");
        let registry = ports.control.inner.registry().clone();
        let Ports {
            rx, tx, control, ..
        } = ports;
        let unstarted = Unstarted {
            rx: rx
                .into_iter()
                .enumerate()
                .map(|(l, p)| (LaneRx::new(&config, l as u16), p))
                .collect(),
            tx: tx
                .into_iter()
                .enumerate()
                .map(|(l, p)| (LaneTx::new(&config, l as u16), p.inner))
                .collect(),
        };
        let off = std::env::var("RINGCAST_PACING")
            .is_ok_and(|v| matches!(v.trim(), "off" | "0" | "false"));
        let rates = Rates::new(
            rate::config(config.link_bandwidth),
            config.rank.0,
            config.ranks,
            config.lanes,
            off,
        );
        Engine {
            session,
            control,
            registry,
            posts,
            unstarted: Some(unstarted),
            lanes: Vec::new(),
            rates,
            reported: None,
            queued: VecDeque::new(),
            live: Vec::new(),
            lost: Vec::new(),
            stalled: None,
            pin_base,
            blame,
            builds,
            heard_failed: None,
            next_op: 0,
            numbered,
            quarantine: TagQuarantine::new(config.peer_timeout),
            clock: Clock(StdInstant::now()),
            buf: Vec::new(),
            completed: 0,
            failed: 0,
            cancelled: 0,
        }
    }

    fn rank(&self) -> u32 {
        self.session.config().rank.0
    }

    /// Starts the lane workers, then runs until the communicator is dropped (its post channel
    /// closes).
    pub(crate) fn run(mut self) {
        if let Err(e) = self.spawn_workers() {
            tracing::error!(rank = self.rank(), error = %e, "cannot start the lane workers");
            // The lanes cannot move a chunk: the engine stops, so that every post fails
            // (`Cancelled`, "its engine thread stopped") instead of waiting out its deadline.
            self.shutdown();
            return;
        }
        // Every input unparks this thread: a post (`PostTx`), a worker's note, a control
        // frame (the transport's I/O thread). Parking is bounded by the session's next timer.
        self.control.inner.wake_on_arrival(thread::current());
        loop {
            // Read before the posts: every one the router sent below it is in the channel.
            let numbered = self.numbered.load(Ordering::Acquire);
            let mut closed = false;
            loop {
                match self.posts.try_recv() {
                    Ok(Command::Abort) | Err(TryRecvError::Disconnected) => {
                        closed = true;
                        break;
                    }
                    Ok(c) => self.command(c),
                    Err(TryRecvError::Empty) => break,
                }
            }
            if closed {
                break;
            }
            self.start_queued();
            self.skip_numbered(numbered);
            self.heard_tcp_failure();
            // Posts waiting for room: a peer that asks hears that this rank's program went on.
            self.session.set_queued(!self.queued.is_empty());
            if !self.turn() {
                thread::park_timeout(self.sleep());
            }
        }
        self.shutdown();
    }

    /// How long the control thread may park when a turn moved nothing: until the session's
    /// next timer, at most [`IDLE_WAIT`] with nothing in flight and [`BUSY_WAIT`] otherwise
    /// (the caps only bound how late a missed wake-up is noticed).
    fn sleep(&mut self) -> Duration {
        let cap = if self.live.is_empty() && self.queued.is_empty() {
            IDLE_WAIT
        } else {
            BUSY_WAIT
        };
        let now = self.clock.now();
        match self.session.poll_timeout() {
            Some(t) if t <= now => Duration::ZERO,
            Some(t) => Duration::from_nanos(t.as_nanos() - now.as_nanos()).min(cap),
            None => cap,
        }
    }

    fn spawn_workers(&mut self) -> std::io::Result<()> {
        let Some(u) = self.unstarted.take() else {
            return Ok(());
        };
        let rank = self.rank();
        let pin = Pinning::from_env(self.pin_base);
        if let Some(p) = &pin {
            p.pin(0, "control thread");
        }
        let now = self.clock.now();
        for ((lrx, prx), (ltx, ptx)) in u.rx.into_iter().zip(u.tx) {
            let pacer = Pacer::new(now, self.rates.per_lane(), lane::PACE_DEPTH);
            let link = lane::spawn(
                rank,
                (lrx, ltx),
                (prx, ptx),
                pacer,
                self.clock,
                thread::current(),
                pin.clone(),
            )?;
            self.lanes.push(link);
        }
        Ok(())
    }

    fn command(&mut self, c: Command) {
        match c {
            // Doomed or not, in order (see `start_queued`).
            Command::Post(p) => self.queued.push_back(p),
            Command::Stats(reply) => {
                let _ = reply.send(self.stats());
            }
            // Taken by the loop (`run`); a second one, queued behind the first, stops nothing.
            Command::Abort => {}
        }
    }

    /// With no post queued, the operations numbered below `numbered` that the engine has not
    /// started ran elsewhere (over TCP): their ids are taken now rather than when the next
    /// post comes (as [`Self::start_queued`] does), so that a peer's barrier that asks where
    /// this rank stands on one hears that it ran elsewhere (the ranks disagree on it, and fail
    /// it at once) instead of that it has not posted (a late rank, waited for).
    fn skip_numbered(&mut self, numbered: u64) {
        if self.queued.is_empty() {
            self.skip_to(numbered);
        }
    }

    /// The TCP path's latest failure, once the session took its id as run elsewhere: a peer
    /// that asks where this rank stands on a later operation hears that its program may
    /// have stopped over it ([`Session::failed_elsewhere`](ringcast_core::Session::failed_elsewhere);
    /// the session ignores one of its own operations, or one started since). Not while a
    /// post waits here to start: the program went on.
    fn heard_tcp_failure(&mut self) {
        if let Some((f, c)) = self.blame.last_failed()
            && f < self.next_op
            && self.heard_failed != Some(f)
            && self.queued.is_empty()
        {
            self.heard_failed = Some(f);
            self.session.failed_elsewhere(OpId(f), Rank(c));
        }
    }

    /// Takes the ids below `k` that the session has not given out, as operations run
    /// elsewhere (over TCP).
    fn skip_to(&mut self, k: u64) {
        while self.next_op < k {
            self.next_op = self.session.skip_op().0 + 1;
        }
    }

    /// Starts posted operations, in order, while the core has room (and the next one's tag is
    /// free: see [`Session::can_start`](ringcast_core::Session::can_start)).
    fn start_queued(&mut self) {
        while let Some((index, forfeit)) = self.queued.front().map(|p| (p.index, p.forfeit)) {
            // The operations before it that ran elsewhere take their ids first.
            if let Some(k) = index {
                self.skip_to(k);
                // Its id was taken already (the router numbered it too soon: a bug). Run
                // under the next id, it would meet another operation at the peers and could
                // complete with that one's bytes: it fails instead.
                if k < self.next_op {
                    tracing::error!(op = k, next = self.next_op, "a post came after its id");
                    if let Some(p) = self.queued.pop_front() {
                        self.failed += 1;
                        let _ = p.reply.send(Err(CommError::Cancelled));
                    }
                    continue;
                }
            }
            if forfeit {
                self.queued.pop_front();
                self.next_op = self.session.refuse_op().0 + 1;
                continue;
            }
            // A peer it needs is gone: it fails here, and takes its id as a failed operation
            // (a peer that asks where this rank stands on it hears that it ended, not that it
            // ran elsewhere).
            if let Some(l) = doomed_by(&self.lost, self.next_op) {
                let (rank, culprit) = (l.rank, l.blamed.unwrap_or(l.rank));
                if let Some(p) = self.queued.pop_front() {
                    self.doom(p, rank);
                    self.next_op = self.session.abandon_op(Rank(culprit)).0 + 1;
                }
                continue;
            }
            // Queued behind a failure naming a rank: it fails with it, and takes its id as a
            // failed operation, as a doomed one does.
            if let Some((error, at)) = &self.stalled
                && let Some(peer) = error.peer()
                && self.queued.front().is_some_and(|p| p.posted <= *at)
                && let Some(p) = self.queued.pop_front()
            {
                let error = error.clone();
                self.failed += 1;
                p.span.in_scope(|| {
                    tracing::warn!(op = self.next_op, %error, "operation failed: queued behind a failure");
                });
                let _ = p.reply.send(Err(error));
                self.next_op = self.session.abandon_op(Rank(peer)).0 + 1;
                continue;
            }
            if !self.session.can_start() {
                return;
            }
            let tag = self.session.config().imm.tag_of(self.next_op);
            if self
                .quarantine
                .holds(tag, &self.drained(), StdInstant::now())
            {
                tracing::trace!(
                    op = self.next_op,
                    tag,
                    "the tag ended lately: lanes draining"
                );
                // Each wake-up makes a worker take its commands and read its socket empty.
                for l in &self.lanes {
                    l.rx_wake.wake();
                }
                return;
            }
            let Some(p) = self.queued.pop_front() else {
                return;
            };
            let now = self.clock.now();
            let len = p.buf.len() as u64;
            let me = self.rank();
            let (started, roots) = match &p.kind {
                Kind::Broadcast { root } => (
                    self.session.start_broadcast(now, Rank(*root), len),
                    vec![*root],
                ),
                Kind::Allgather { sizes, tag } => (
                    self.session.start_allgather_tagged(now, sizes, *tag),
                    (0..sizes.len() as u32)
                        .filter(|&r| sizes[r as usize] > 0)
                        .collect(),
                ),
            };
            match started {
                Ok(op) => {
                    let fan_in = rate::fan_in(&roots, me, self.session.config().ranks);
                    let buf = p.buf;
                    // Registered before its lane commands and its `Ready` leave this thread:
                    // no chunk or read of it can come earlier.
                    self.registry.register(op, buf.clone());
                    self.next_op = op.0 + 1;
                    p.span
                        .in_scope(|| tracing::debug!(op = op.0, len, "started"));
                    let base = self.counters();
                    self.live.push(Live {
                        op,
                        buf,
                        len,
                        roots: roots.into_iter().filter(|&r| r != me).collect(),
                        fan_in,
                        reply: Some(p.reply),
                        started: StdInstant::now(),
                        base,
                        verdict: None,
                        ended_at: None,
                        span: p.span,
                        tap: p.tap,
                    });
                    self.reshare();
                }
                Err(e) => {
                    // Refused here (too large for this rank's chunk size, say) and perhaps
                    // not at the peers: its id is taken all the same, so that the next
                    // operation meets the same one everywhere (see `Post::forfeit`).
                    if !matches!(e, StartError::TooManyInflight | StartError::TagInUse { .. }) {
                        self.next_op = self.session.skip_op().0 + 1;
                    }
                    self.failed += 1;
                    let _ = p.reply.send(Err(CommError::Start(e)));
                }
            }
        }
    }

    /// One turn: the workers' notes, control arrivals, timers, then every output; then lost
    /// peers and drained operations. Whether anything moved.
    fn turn(&mut self) -> bool {
        let now = self.clock.now();
        let mut moved = false;
        // Losses first, handled last: the transport queues every frame it read from a
        // connection before it reports the loss, so an `Abort` a failing peer sent before
        // leaving is handled before its departure (the culprit it names is the one to blame).
        let mut lost = Vec::new();
        while let Some(PeerLost(r)) = self.control.inner.take_lost() {
            lost.push(r.0);
        }
        for l in &self.lanes {
            for q in [&l.rx_notes, &l.tx_notes] {
                while let Ok(n) = q.try_recv() {
                    moved = true;
                    tracing::trace!(rank = self.rank(), note = ?n, "lane note");
                    self.session.handle_lane_note(now, n);
                }
            }
        }
        while let Some(input) = self.control.poll_control(&mut self.buf) {
            moved = true;
            match input {
                ControlInput::Message { from, len } => {
                    let bytes = &self.buf[..len.min(self.buf.len())];
                    if rate::is_report(bytes) {
                        let sending = self.sending();
                        if let Some(r) = self.rates.on_message(now, from.0, bytes, sending) {
                            self.set_rate(r);
                        }
                    } else {
                        tracing::trace!(
                            rank = self.rank(),
                            from = from.0,
                            kind = bytes.first(),
                            len,
                            "control in"
                        );
                        self.session.handle_control(now, from, bytes);
                    }
                }
                ControlInput::ReadDone { id, result } => {
                    self.session.handle_read_done(now, id, result)
                }
            }
        }
        if self.session.poll_timeout().is_some_and(|t| t <= now) {
            self.session.handle_timeout(now);
        }
        // A rank that crashed before one that said goodbye: a rank may leave over another's
        // crash, and its goodbye and the crash can come in one batch, in the connections'
        // order (the TCP path's `doomed_by` prefers the crash the same way).
        lost.sort_by_key(|&r| self.control.inner.departed(Rank(r)).is_some());
        for r in lost {
            moved = true;
            self.peer_lost(now, r);
        }
        if self.session.has_output() {
            moved = true;
            self.outputs();
        }
        self.report_in_flight();
        self.reap();
        moved
    }

    /// Reports to the roots of the operations in flight: every [`REPORT_EVERY`], and at
    /// once (at most every [`REPORT_ON_DROPS`]) when the sockets dropped datagrams since the
    /// last report. The roots' controllers then act within an operation: a 64 MiB Broadcast
    /// lasts tens of milliseconds, many of the controller's rounds.
    fn report_in_flight(&mut self) {
        let now = StdInstant::now();
        let Some((at, _)) = self.reported else {
            self.reported = Some((now, 0));
            return;
        };
        let since = now.saturating_duration_since(at);
        if since < REPORT_ON_DROPS {
            return;
        }
        let mut roots: Vec<u32> = self
            .live
            .iter()
            .filter(|l| l.verdict.is_none())
            .flat_map(|l| l.roots.iter().copied())
            .collect();
        if roots.is_empty() {
            return;
        }
        let r = self.report();
        if !self.report_due(&r) {
            return;
        }
        roots.sort_unstable();
        roots.dedup();
        let msg = rate::encode(&r);
        for root in roots {
            self.control.send_control(Rank(root), &msg);
        }
        self.reported = Some((now, r.socket_drops));
    }

    /// The rate this rank's send workers reached lately (bytes per second, 0: unknown).
    fn sending(&self) -> u64 {
        lane::sending_total(self.lanes.iter().map(|l| lane::read(&l.tx_snap).sending))
    }

    /// Hands the session's outputs out: lane commands first (see the module docs), then
    /// control messages and reads, then events.
    fn outputs(&mut self) {
        while let Some(c) = self.session.poll_lane_command() {
            tracing::trace!(rank = self.rank(), command = ?c, "lane command");
            // A worker that is gone (it panicked) loses its commands; its operations then
            // fail by the peer timeout or the cutoff.
            let _ = match c {
                LaneCommand::Rx { lane, cmd } => match self.lanes.get(usize::from(lane)) {
                    Some(l) => {
                        let sent = l.rx_cmd.send(cmd).map_err(drop);
                        l.rx_wake.wake();
                        sent
                    }
                    None => Ok(()),
                },
                LaneCommand::Tx { lane, cmd } => match self.lanes.get(usize::from(lane)) {
                    Some(l) => l.tx_cmd.send(TxMsg::Cmd(cmd)).map_err(drop),
                    None => Ok(()),
                },
                _ => Ok(()),
            };
        }
        while let Some(t) = self.session.poll_transmit(&mut self.buf) {
            tracing::trace!(rank = self.rank(), transmit = ?t, kind = self.buf.first(), "control out");
            port::send_transmit(&mut self.control, t, &self.buf);
        }
        while let Some(e) = self.session.poll_event() {
            self.event(e);
        }
    }

    fn event(&mut self, e: Event) {
        let (op, verdict) = match e {
            Event::Completed { op } => (op, Ok(())),
            Event::Failed { op, error } => (op, Err(error)),
            _ => return,
        };
        let tag = self.session.config().imm.tag_of(op.0);
        let drained = self.drained();
        self.quarantine.ended(tag, &drained, StdInstant::now());
        // What the application is told (a loss of a rank that left over another rank's
        // failure already names that rank: the session was told whom it blamed).
        let told = verdict.err().map(CommError::from);
        // A rank that failed names the culprit of later losses; one that posted another
        // shape is alive and well.
        match &told {
            Some(CommError::ShapeMismatch { .. }) => {}
            Some(t) => self.blame.failed(op.0, t.peer()),
            None => self.blame.completed(op.0),
        }
        match &told {
            Some(
                t @ (CommError::NotPosted { .. }
                | CommError::PeerUnresponsive { .. }
                | CommError::PeerFailed { .. }
                | CommError::PeerLost { .. }
                | CommError::SendsStalled { .. }),
            ) => self.stalled = Some((t.clone(), StdInstant::now())),
            Some(_) => {}
            None => self.stalled = None,
        }
        let Some(i) = self.live.iter().position(|l| l.op == op) else {
            return;
        };
        if verdict.is_ok() && !self.live[i].roots.is_empty() {
            let r = self.report();
            if self.report_due(&r) {
                let report = rate::encode(&r);
                for &root in &self.live[i].roots {
                    self.control.send_control(Rank(root), &report);
                }
                self.reported = Some((StdInstant::now(), r.socket_drops));
            }
        }
        let live = &mut self.live[i];
        live.verdict = Some(verdict);
        live.ended_at.get_or_insert_with(StdInstant::now);
        // It multicasts no more (what a peer still lacks it reads over TCP): the roots of the
        // operations still sending share the rate without it from now, not once its buffer
        // has drained.
        let reshare = live.fan_in > 1;
        if let (Err(error), Some(told)) = (verdict, told) {
            // Answered now; the buffer waits for the transport's work on it to drain.
            if let Some(reply) = live.reply.take() {
                live.span
                    .in_scope(|| tracing::warn!(op = op.0, %error, "operation failed"));
                self.failed += 1;
                let _ = reply.send(Err(told));
            }
        }
        if reshare {
            self.reshare();
        }
    }

    /// Whether report `r` goes to the roots (in flight, and at an operation's end): when the
    /// sockets dropped datagrams since the last report, or that one is [`REPORT_EVERY`] old.
    /// A run of short operations then reports as often as a long one does in flight, not
    /// once per operation and root: on a busy host every such message is a wake-up on both
    /// ends, paid by the next operation.
    fn report_due(&self, r: &ReceiverReport) -> bool {
        self.reported
            .is_none_or(|(at, drops)| r.socket_drops > drops || at.elapsed() >= REPORT_EVERY)
    }

    /// This rank's cumulative receiver report.
    fn report(&self) -> ReceiverReport {
        let mut r = ReceiverReport {
            rank: self.rank(),
            fetched_chunks: self.session.stats().chunks_fetched,
            ..ReceiverReport::default()
        };
        for l in &self.lanes {
            let s = lane::read(&l.rx_snap);
            r.received_chunks += s.lane.chunks_received;
            r.socket_drops += s.socket_drops;
        }
        r
    }

    /// `rank`'s control connection closed: every operation it can no longer finish fails now,
    /// through the session, which also tells the other ranks (`Abort` naming it).
    fn peer_lost(&mut self, now: ringcast_core::Instant, rank: u32) {
        let blamed_here = self.control.inner.departed_blaming(Rank(rank)).map(|b| b.0);
        // A peer that left over a failure it blamed on this rank did not finish what it
        // failed, whatever its mark says (an operation failed and waited on is no longer in
        // flight there): nothing this rank runs with it can finish, so its departure counts
        // as a crash here, and this rank's operations, posted or to come, fail at once
        // naming it, not at their deadlines.
        let mark = match blamed_here {
            Some(b) if b == self.rank() => None,
            _ => self.control.inner.departed(Rank(rank)),
        };
        let blamed = blamed_here.filter(|&b| b != self.rank());
        let lost = Lost { rank, mark, blamed };
        // A goodbye is the end of a job, or a departure over a failure it names; the
        // operations it dooms say so themselves ("operation failed").
        if mark.is_none() || blamed.is_some() {
            tracing::warn!(rank, ?mark, ?blamed, "peer lost");
        } else {
            tracing::debug!(rank, ?mark, "peer left");
        }
        self.lost.push(lost);
        self.builds.lost(rank, blamed);
        // It left over another rank's failure, which this rank may not have heard of yet
        // (it travels over another connection): that rank is the one to blame.
        self.blame.heard(blamed);
        self.session
            .handle_peer_lost(now, Rank(rank), OpId(mark.unwrap_or(0)), blamed.map(Rank));
        // The posts queued here fail in `start_queued`, in order, each taking its id as a
        // failed operation (`Session::abandon_op`): failed here without their ids, the ids
        // after them were skipped as operations run elsewhere and answered as such.
        if !self.queued.is_empty() {
            self.start_queued();
        }
    }

    /// Fails post `p`, which the loss of `rank` dooms before it starts: with the loss of
    /// `rank`, or, when an earlier failure blamed another rank, with that failure, reported
    /// by the rank that left over it or by this one (as the TCP path's doomed operations
    /// fail, [`Lost::error`]: the rank named may be alive, and `PeerLost` says it is gone).
    fn doom(&mut self, p: Post, rank: u32) {
        let peer = self.blame.doomed(self.next_op, rank);
        let e = if peer == rank {
            CommError::PeerLost { peer }
        } else {
            let told = self
                .lost
                .iter()
                .any(|l| l.rank == rank && l.blamed == Some(peer));
            CommError::PeerFailed {
                peer,
                reported_by: if told { rank } else { self.rank() },
            }
        };
        self.failed += 1;
        let _ = p.reply.send(Err(e));
    }

    /// Releases the buffers of operations that are over and whose reads drained.
    ///
    /// Only reads are waited for: the lane workers look a buffer up per batch, so once it is
    /// unregistered they cannot reach it, and a copy under way holds the locks of the stripes
    /// it covers (the release takes the bytes under every stripe's lock, leaving an empty
    /// buffer that every later write misses).
    ///
    /// The pacing share needs nothing here: an operation left it at its verdict.
    fn reap(&mut self) {
        let mut i = 0;
        while i < self.live.len() {
            let l = &self.live[i];
            let drained = self.control.in_flight(l.op) == 0;
            let give_up = l.ended_at.is_some_and(|t| t.elapsed() > DRAIN_LIMIT);
            if !(l.verdict.is_some() && (drained || give_up)) {
                i += 1;
                continue;
            }
            let mut l = self.live.swap_remove(i);
            self.registry.unregister(l.op);
            let bytes = l.buf.take();
            if let Some(reply) = l.reply.take() {
                let stats = l.stats(&self.counters());
                l.span.in_scope(
                    || tracing::debug!(op = l.op.0, elapsed = ?stats.elapsed, "completed"),
                );
                if let Some(tap) = l.tap.as_ref().and_then(Weak::upgrade) {
                    tap.observe(&stats);
                }
                self.completed += 1;
                let _ = reply.send(Ok((bytes, stats)));
            }
        }
    }

    /// Shares the pacing rate by the largest fan-in among the operations in flight in which
    /// this rank multicasts (1 when there is none). An operation with a verdict multicasts no
    /// more (a failed one's queued batches are dropped; a completed one's peers read what
    /// they lack over TCP) while its buffer drains: it no longer counts.
    fn reshare(&mut self) {
        let most = self
            .live
            .iter()
            .filter(|l| l.verdict.is_none())
            .map(|l| l.fan_in)
            .max()
            .unwrap_or(1);
        if let Some(r) = self.rates.set_share(most) {
            self.set_rate(r);
        }
    }

    /// Hands every send worker its new rate.
    fn set_rate(&self, per_lane: u64) {
        for l in &self.lanes {
            let _ = l.tx_cmd.send(TxMsg::Rate(per_lane));
        }
    }

    /// Every lane's [`Drained`](lane::Drained) count.
    fn drained(&self) -> Vec<u64> {
        self.lanes.iter().map(|l| l.rx_drained.get()).collect()
    }

    /// The core's counters: the session's and every lane's, as the workers last published.
    fn core_stats(&self) -> Stats {
        let mut s = *self.session.stats();
        for l in &self.lanes {
            s.add_rx(&lane::read(&l.rx_snap).lane);
            s.add_tx(&lane::read(&l.tx_snap).lane);
        }
        s
    }

    fn counters(&self) -> Counters {
        let s = self.core_stats();
        let mut c = Counters {
            chunks_sent: s.chunks_sent,
            chunks_received: s.chunks_received,
            chunks_fetched: s.chunks_fetched,
            chunks_dropped: core_drops(&s),
            bytes_fetched: self
                .control
                .inner
                .stats()
                .bytes_read
                .load(std::sync::atomic::Ordering::Relaxed),
            ..Counters::default()
        };
        for l in &self.lanes {
            let r = lane::read(&l.rx_snap);
            c.bytes_received += r.udp.payload_bytes;
            c.datagrams_dropped += r.udp.dropped() + r.bad_source + r.bad_place;
            let t = lane::read(&l.tx_snap);
            c.bytes_sent += t.udp.payload_bytes;
            c.multicasts_lost += t.lost;
            c.sends_timed_out += t.timed_out;
        }
        c
    }

    fn stats(&self) -> CommStats {
        let mut s = CommStats {
            counters: self.counters(),
            core: self.core_stats(),
            control: ControlCounters::read(self.control.inner.stats()),
            ops_completed: self.completed,
            ops_failed: self.failed,
            ops_cancelled: self.cancelled,
            ..CommStats::default()
        };
        for l in &self.lanes {
            let r = lane::read(&l.rx_snap);
            add_rx(&mut s.rx, &r.udp);
            s.rx_bad_source += r.bad_source;
            s.rx_bad_place += r.bad_place;
            s.rx_moved += r.moved;
            s.rx_errors += r.errors;
            s.socket_drops += r.socket_drops;
            let t = lane::read(&l.tx_snap);
            add_tx(&mut s.tx, &t.udp);
        }
        s.pacing_rate = self.rates.rate();
        s.rate_reports = self.rates.reports;
        s
    }

    /// Cancels everything in flight, stops and joins the lane workers, says goodbye to the
    /// peers and closes the transport.
    fn shutdown(mut self) {
        while let Ok(c) = self.posts.try_recv() {
            if let Command::Post(p) = c {
                self.queued.push_back(p);
            }
        }
        for p in self.queued.drain(..) {
            self.cancelled += 1;
            let _ = p.reply.send(Err(CommError::Cancelled));
        }
        // The first operation this rank did not finish: the peers fail it and later ones at
        // once, and let earlier ones finish without us.
        let mut mark = self.next_op;
        // Leaving over a failure (reaped or not): the peers may hear of this departure before
        // the failure itself, or have finished the operation it failed (its `Abort` then tells
        // them nothing), so the goodbye names the rank it blamed.
        let blamed = self.blame.goodbye();
        // An operation this rank finished is answered with its bytes once every thread that
        // could touch them is joined (its buffer may still serve a peer's read until then);
        // the others are cancelled.
        let counters = self.counters();
        let mut finished = Vec::new();
        for l in &mut self.live {
            if l.verdict != Some(Ok(())) {
                mark = mark.min(l.op.0);
            }
            let Some(reply) = l.reply.take() else {
                continue;
            };
            if l.verdict == Some(Ok(())) {
                self.completed += 1;
                finished.push((reply, l.buf.clone(), l.stats(&counters)));
            } else {
                self.cancelled += 1;
                let _ = reply.send(Err(CommError::Cancelled));
            }
        }
        if tracing::enabled!(tracing::Level::DEBUG) {
            let s = self.stats();
            tracing::debug!(
                rank = self.rank(),
                reads = s.rx.recv_calls,
                datagrams = s.rx.datagrams,
                in_place = s.rx.direct,
                guessed = s.rx.guessed,
                guessed_wrong = s.rx.guessed_wrong,
                socket_drops = s.socket_drops,
                "receive totals"
            );
        }
        tracing::debug!(rank = self.rank(), mark, "engine stopping");
        let rank = self.rank();
        let Engine {
            control,
            live,
            lanes,
            ..
        } = self;
        // Closing the command queues stops the workers (woken, or at the end of their wait).
        let wakers: Vec<_> = lanes.iter().map(|l| l.rx_wake.clone()).collect();
        let threads: Vec<_> = lanes.into_iter().flat_map(|l| l.threads).collect();
        for w in wakers {
            w.wake();
        }
        for t in threads {
            if t.join().is_err() {
                tracing::error!(rank, "a lane worker panicked");
            }
        }
        control.inner.close_blaming(mark, blamed.map(Rank), LINGER);
        // Nothing touches the buffers any more: every thread that could is joined.
        for (reply, buf, stats) in finished {
            let _ = reply.send(Ok((buf.take(), stats)));
        }
        drop(live);
    }
}
