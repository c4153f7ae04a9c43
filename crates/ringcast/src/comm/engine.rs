//! The progress thread: one [`Node`] (the session and its lanes) driven by
//! [`port::pump`](ringcast_core::port::pump) over the RoCEv2/UDP transport. The application
//! thread posts operations over a bounded channel and gets each completion back through its
//! request's own channel.

use std::collections::VecDeque;
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TryRecvError};
use std::thread;
use std::time::{Duration, Instant as StdInstant};

use ringcast_core::port::{Ports, pump};
use ringcast_core::{Event, Instant, Node, OpError, OpId, Rank};
use ringcast_transport_rocev2_udp::{OpBuffer, PeerLost, Registry, UdpRx};

use super::error::CommError;
use super::request::Completion;
use super::stats::{CommStats, ControlCounters, Counters, OpStats, add_rx, add_tx, core_drops};
use super::track::{TrackedControl, TrackedTx};

/// Chunks taken per lane per pump.
const BUDGET: usize = 64;
/// With nothing in flight, how long the engine blocks on the post channel between pumps
/// (peers' control messages and losses are still served at this pace).
const IDLE_WAIT: Duration = Duration::from_millis(2);
/// With operations in flight and nothing moving, how long it sleeps between pumps.
const BUSY_WAIT: Duration = Duration::from_micros(50);
/// How long a failed operation's buffer waits for its transport work to drain before it is
/// released anyway (it is owned by the engine: a late write lands nowhere).
const DRAIN_LIMIT: Duration = Duration::from_secs(5);
/// How long the goodbye may take to flush when the communicator is dropped.
const LINGER: Duration = Duration::from_secs(1);

/// A collective, as posted by the application thread.
#[derive(Debug)]
pub(crate) enum Kind {
    Broadcast { root: u32 },
    Allgather { sizes: Vec<u64> },
}

/// An operation posted and not started yet.
#[derive(Debug)]
pub(crate) struct Post {
    pub(crate) kind: Kind,
    pub(crate) buf: Vec<u8>,
    pub(crate) reply: SyncSender<Completion>,
    pub(crate) span: tracing::Span,
}

/// What the application thread sends the engine.
#[derive(Debug)]
pub(crate) enum Command {
    Post(Post),
    Stats(SyncSender<CommStats>),
}

type EnginePorts = Ports<UdpRx, TrackedTx, TrackedControl>;

#[derive(Debug)]
struct Live {
    op: OpId,
    buf: OpBuffer,
    len: u64,
    /// Taken when the requester was answered (a failure is answered at once).
    reply: Option<SyncSender<Completion>>,
    started: StdInstant,
    base: Counters,
    /// The core's verdict, once its event arrived.
    verdict: Option<Result<(), OpError>>,
    failed_at: Option<StdInstant>,
    span: tracing::Span,
}

/// A lost rank, and the goodbye mark it sent (the first operation it did not finish), when it
/// left cleanly.
#[derive(Clone, Copy, Debug)]
struct Lost {
    rank: u32,
    mark: Option<u64>,
}

impl Lost {
    /// Whether operation `op` can no longer finish.
    fn dooms(&self, op: u64) -> bool {
        self.mark.is_none_or(|m| op >= m)
    }
}

pub(crate) struct Engine {
    node: Node,
    ports: EnginePorts,
    registry: Registry,
    posts: Receiver<Command>,
    queued: VecDeque<Post>,
    live: Vec<Live>,
    lost: Vec<Lost>,
    /// The id the node gives the next operation it starts.
    next_op: u64,
    max_inflight: usize,
    clock: StdInstant,
    buf: Vec<u8>,
    events: Vec<Event>,
    completed: u64,
    failed: u64,
    cancelled: u64,
}

impl Engine {
    pub(crate) fn new(node: Node, ports: EnginePorts, posts: Receiver<Command>) -> Self {
        let registry = ports.control.inner.registry().clone();
        let max_inflight = node.config().limits.max_inflight_ops as usize;
        Engine {
            node,
            ports,
            registry,
            posts,
            queued: VecDeque::new(),
            live: Vec::new(),
            lost: Vec::new(),
            next_op: 0,
            max_inflight,
            clock: StdInstant::now(),
            buf: Vec::new(),
            events: Vec::new(),
            completed: 0,
            failed: 0,
            cancelled: 0,
        }
    }

    fn now(&self) -> Instant {
        Instant::from_nanos(self.clock.elapsed().as_nanos() as u64)
    }

    /// Runs until the communicator is dropped (its post channel closes).
    pub(crate) fn run(mut self) {
        loop {
            if self.live.is_empty() && self.queued.is_empty() {
                match self.posts.recv_timeout(IDLE_WAIT) {
                    Ok(c) => self.command(c),
                    Err(RecvTimeoutError::Timeout) => {}
                    Err(RecvTimeoutError::Disconnected) => break,
                }
            }
            let mut closed = false;
            loop {
                match self.posts.try_recv() {
                    Ok(c) => self.command(c),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        closed = true;
                        break;
                    }
                }
            }
            if closed {
                break;
            }
            self.start_queued();
            let moved = self.pump();
            if !moved && !self.live.is_empty() {
                thread::sleep(BUSY_WAIT);
            }
        }
        self.shutdown();
    }

    fn command(&mut self, c: Command) {
        match c {
            Command::Post(p) => {
                if let Some(l) = self.lost.iter().find(|l| l.dooms(self.next_op)) {
                    let peer = l.rank;
                    self.failed += 1;
                    let _ = p.reply.send(Err(CommError::PeerLost { peer }));
                } else {
                    self.queued.push_back(p);
                }
            }
            Command::Stats(reply) => {
                let _ = reply.send(self.stats(true));
            }
        }
    }

    /// Starts posted operations, in order, while the core has room.
    fn start_queued(&mut self) {
        while self.node.inflight() < self.max_inflight {
            let Some(p) = self.queued.pop_front() else {
                return;
            };
            let now = self.now();
            let len = p.buf.len() as u64;
            let started = match &p.kind {
                Kind::Broadcast { root } => self.node.start_broadcast(now, Rank(*root), len),
                Kind::Allgather { sizes } => self.node.start_allgather(now, sizes),
            };
            match started {
                Ok(op) => {
                    let buf = OpBuffer::from_vec(p.buf);
                    // Registered before the next pump: no chunk or read of it comes earlier.
                    self.registry.register(op, buf.clone());
                    self.next_op = op.0 + 1;
                    p.span
                        .in_scope(|| tracing::debug!(op = op.0, len, "started"));
                    let base = self.counters();
                    self.live.push(Live {
                        op,
                        buf,
                        len,
                        reply: Some(p.reply),
                        started: StdInstant::now(),
                        base,
                        verdict: None,
                        failed_at: None,
                        span: p.span,
                    });
                }
                Err(e) => {
                    self.failed += 1;
                    let _ = p.reply.send(Err(CommError::Start(e)));
                }
            }
        }
    }

    /// One pump, then the events, lost peers and drained operations. Whether anything moved.
    fn pump(&mut self) -> bool {
        let now = self.now();
        let mut events = std::mem::take(&mut self.events);
        let p = pump(
            &mut self.node,
            &mut self.ports,
            now,
            BUDGET,
            &mut self.buf,
            |e| events.push(e),
        );
        let moved = !p.is_idle() || !events.is_empty();
        for e in events.drain(..) {
            self.event(e);
        }
        self.events = events;
        while let Some(PeerLost(r)) = self.ports.control.inner.take_lost() {
            self.peer_lost(r.0);
        }
        self.reap();
        moved
    }

    fn event(&mut self, e: Event) {
        let (op, verdict) = match e {
            Event::Completed { op } => (op, Ok(())),
            Event::Failed { op, error } => (op, Err(error)),
            _ => return,
        };
        let Some(live) = self.live.iter_mut().find(|l| l.op == op) else {
            return;
        };
        live.verdict = Some(verdict);
        if let Err(error) = verdict {
            // Answered now; the buffer waits for the transport's work on it to drain.
            live.failed_at.get_or_insert_with(StdInstant::now);
            if let Some(reply) = live.reply.take() {
                live.span
                    .in_scope(|| tracing::warn!(op = op.0, %error, "operation failed"));
                self.failed += 1;
                let _ = reply.send(Err(error.into()));
            }
        }
    }

    /// `rank`'s control connection closed: every operation it can no longer finish fails now.
    fn peer_lost(&mut self, rank: u32) {
        let mark = self.ports.control.inner.departed(Rank(rank));
        let lost = Lost { rank, mark };
        tracing::warn!(rank, ?mark, "peer lost");
        self.lost.push(lost);
        let now = StdInstant::now();
        for live in &mut self.live {
            if lost.dooms(live.op.0)
                && let Some(reply) = live.reply.take()
            {
                live.failed_at = Some(now);
                self.failed += 1;
                let _ = reply.send(Err(CommError::PeerLost { peer: rank }));
            }
        }
        for p in self.queued.drain(..) {
            self.failed += 1;
            let _ = p.reply.send(Err(CommError::PeerLost { peer: rank }));
        }
    }

    /// Releases the buffers of operations that are over and whose transport work drained.
    fn reap(&mut self) {
        let mut i = 0;
        while i < self.live.len() {
            let l = &self.live[i];
            let drained = self.ports.tx.iter().all(|t| t.in_flight(l.op) == 0)
                && self.ports.control.in_flight(l.op) == 0;
            let over =
                l.verdict.is_some() || l.failed_at.is_some_and(|t| t.elapsed() > DRAIN_LIMIT * 4);
            let give_up = l.failed_at.is_some_and(|t| t.elapsed() > DRAIN_LIMIT);
            if !(over && (drained || give_up)) {
                i += 1;
                continue;
            }
            let mut l = self.live.swap_remove(i);
            self.registry.unregister(l.op);
            let bytes = l.buf.with(std::mem::take);
            if let Some(reply) = l.reply.take() {
                let stats = OpStats {
                    op: l.op.0,
                    bytes: l.len,
                    elapsed: l.started.elapsed(),
                    counters: self.counters().since(&l.base),
                };
                l.span.in_scope(
                    || tracing::debug!(op = l.op.0, elapsed = ?stats.elapsed, "completed"),
                );
                self.completed += 1;
                let _ = reply.send(Ok((bytes, stats)));
            }
        }
    }

    fn counters(&self) -> Counters {
        let s = self.node.stats();
        let mut c = Counters {
            chunks_sent: s.chunks_sent,
            chunks_received: s.chunks_received,
            chunks_fetched: s.chunks_fetched,
            chunks_dropped: core_drops(&s),
            bytes_fetched: self
                .ports
                .control
                .inner
                .stats()
                .bytes_read
                .load(std::sync::atomic::Ordering::Relaxed),
            ..Counters::default()
        };
        for rx in &self.ports.rx {
            let r = rx.receiver().stats();
            c.bytes_received += r.payload_bytes;
            c.datagrams_dropped += r.dropped() + rx.bad_source + rx.bad_place;
        }
        for tx in &self.ports.tx {
            c.bytes_sent += tx.inner.sender().stats().payload_bytes;
            c.multicasts_lost += tx.inner.lost;
        }
        c
    }

    fn stats(&self, socket_drops: bool) -> CommStats {
        let mut s = CommStats {
            counters: self.counters(),
            core: self.node.stats(),
            control: ControlCounters::read(self.ports.control.inner.stats()),
            ops_completed: self.completed,
            ops_failed: self.failed,
            ops_cancelled: self.cancelled,
            ..CommStats::default()
        };
        for rx in &self.ports.rx {
            add_rx(&mut s.rx, rx.receiver().stats());
            s.rx_bad_source += rx.bad_source;
            s.rx_bad_place += rx.bad_place;
            s.rx_errors += rx.errors;
            if socket_drops {
                s.socket_drops += rx.receiver().socket().socket_drops().unwrap_or(0);
            }
        }
        for tx in &self.ports.tx {
            add_tx(&mut s.tx, tx.inner.sender().stats());
        }
        s
    }

    /// Cancels everything in flight, says goodbye to the peers and closes the transport.
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
        for l in &mut self.live {
            if l.verdict != Some(Ok(())) {
                mark = mark.min(l.op.0);
            }
            if let Some(reply) = l.reply.take() {
                self.cancelled += 1;
                let _ = reply.send(Err(CommError::Cancelled));
            }
        }
        tracing::debug!(rank = self.node.config().rank.0, mark, "engine stopping");
        let Engine { ports, live, .. } = self;
        let Ports {
            rx, tx, control, ..
        } = ports;
        control.inner.close(mark, LINGER);
        drop(rx);
        drop(tx);
        // Nothing touches the buffers any more: the transport's threads are joined.
        drop(live);
    }
}
