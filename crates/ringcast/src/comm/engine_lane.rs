//! The lane workers: per lane, a receive worker owning the lane's [`LaneRx`] and [`UdpRx`],
//! and a send worker owning its [`LaneTx`], [`UdpTx`] and [`Pacer`]. The control thread
//! ([`Engine`](super::Engine)) talks to them over bounded single-producer single-consumer
//! queues; see the engine's module docs for why the order they keep is safe.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TryRecvError, TrySendError};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::{self, JoinHandle, Thread};
use std::time::{Duration, Instant as StdInstant};

use ringcast_core::lane::{
    LaneNote, LaneRx, LaneTx, Multicast, RxCommand, RxStats as LaneRxStats, TxCommand,
    TxStats as LaneTxStats,
};
use ringcast_core::port::{LaneRxPort, LaneTxPort, RxToken};
use ringcast_core::{Instant, OpId, Placement};
use ringcast_transport_rocev2_udp::pace::Pacer;
use ringcast_transport_rocev2_udp::{RxStats, RxWaker, TxStats, UdpRx, UdpTx};

/// Capacity of every queue between the control thread and a worker. Commands and notes are a
/// handful per operation and lane, so a full queue means a stuck peer, not load.
pub(super) const QUEUE: usize = 256;
/// The longest a receive worker sleeps on its socket: a datagram wakes it, and so does the
/// control thread after queuing it a command ([`LaneLink::rx_wake`]); the timeout only
/// bounds a missed wake-up and how stale the published counters get.
const RX_WAIT: Duration = Duration::from_millis(5);
/// Most socket reads a receive worker makes before it answers a `Count` or an `Overdue`
/// (what one `recvmmsg` takes at most, when each read is one datagram read in place).
const COUNT_READS: usize = 32;
/// How soon a worker retries notes the control thread's full queue did not take.
const BACKLOG_RETRY: Duration = Duration::from_micros(200);
/// How long a send worker with nothing to send blocks on its command queue (a command wakes
/// it at once; the timeout only bounds how late it notices a shutdown).
const TX_IDLE_WAIT: Duration = Duration::from_millis(5);
/// How often a busy receive worker re-reads its socket's kernel drop counter: every
/// millisecond where that is one `getsockopt` (`SO_MEMINFO`), so that the rate reports sent
/// during an operation carry fresh drops; every 100 ms where it is a walk of `/proc/net/udp`.
const DROPS_EVERY: Duration = Duration::from_millis(1);
const DROPS_EVERY_SLOW: Duration = Duration::from_millis(100);
/// The window over which a send worker measures the rate it reaches while it has something
/// to send.
const SENDING_WINDOW: Duration = Duration::from_millis(4);
/// How long a measured sending rate stands without a new full window: a window and a
/// report interval, so that every report sent while the worker keeps busy finds one fresh.
const SENDING_STALE: Duration = SENDING_WINDOW.saturating_add(super::REPORT_EVERY);
/// The pacer's bucket: what may leave at once after an idle spell, and the slack that
/// absorbs a worker's late wake-ups (a 64 KiB GSO batch is one step).
pub(super) const PACE_DEPTH: u64 = 256 << 10;

/// The engine's clock: core [`Instant`]s since one epoch shared by every thread.
#[derive(Clone, Copy, Debug)]
pub(super) struct Clock(pub(super) StdInstant);

impl Clock {
    pub(super) fn now(&self) -> Instant {
        Instant::from_nanos(self.0.elapsed().as_nanos() as u64)
    }
}

/// What the control thread sends a send worker.
#[derive(Debug)]
pub(super) enum TxMsg {
    /// A command from the session.
    Cmd(TxCommand),
    /// The rate controller's new rate for this lane, bytes per second.
    Rate(u64),
}

/// A receive worker's counters, published after every batch for the control thread.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct RxSnap {
    pub(super) lane: LaneRxStats,
    pub(super) udp: RxStats,
    pub(super) bad_source: u64,
    pub(super) bad_place: u64,
    pub(super) moved: u64,
    pub(super) errors: u64,
    pub(super) socket_drops: u64,
}

/// A send worker's counters.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct TxSnap {
    pub(super) lane: LaneTxStats,
    pub(super) udp: TxStats,
    pub(super) lost: u64,
    pub(super) timed_out: u64,
    /// UDP bytes per second the worker reached over its last full window with something to
    /// send (0, unknown: before the first, and once it is stale; see [`SendMeter`]).
    pub(super) sending: u64,
}

pub(super) type Shared<T> = Arc<Mutex<T>>;

pub(super) fn read<T: Copy>(s: &Shared<T>) -> T {
    *s.lock().unwrap_or_else(PoisonError::into_inner)
}

fn write<T>(s: &Shared<T>, v: T) {
    *s.lock().unwrap_or_else(PoisonError::into_inner) = v;
}

/// Notes a worker could not queue yet (the control thread is behind): kept in order and
/// retried, so a worker never blocks on the control thread.
#[derive(Debug)]
struct NoteOut {
    queue: SyncSender<LaneNote>,
    backlog: VecDeque<LaneNote>,
    control: Thread,
}

impl NoteOut {
    fn flush(&mut self) {
        let mut sent = false;
        while let Some(n) = self.backlog.pop_front() {
            match self.queue.try_send(n) {
                Ok(()) => sent = true,
                Err(TrySendError::Full(n)) => {
                    self.backlog.push_front(n);
                    break;
                }
                // The control thread is gone (shutting down): nobody needs the note.
                Err(TrySendError::Disconnected(_)) => self.backlog.clear(),
            }
        }
        if sent {
            self.control.unpark();
        }
    }
}

/// The control thread's end of one lane: its queues, its workers' counters and threads.
#[derive(Debug)]
pub(super) struct LaneLink {
    pub(super) rx_cmd: SyncSender<RxCommand>,
    /// Ends the receive worker's wait on its socket: called after queuing it a command.
    pub(super) rx_wake: RxWaker,
    pub(super) tx_cmd: SyncSender<TxMsg>,
    pub(super) rx_notes: Receiver<LaneNote>,
    pub(super) tx_notes: Receiver<LaneNote>,
    pub(super) rx_snap: Shared<RxSnap>,
    pub(super) tx_snap: Shared<TxSnap>,
    /// How often the receive worker found its socket empty, each time after taking the
    /// commands queued before (see [`Drained`]).
    pub(super) rx_drained: Drained,
    pub(super) threads: Vec<JoinHandle<()>>,
}

/// A receive worker's count of its turns that ended on an empty socket: each takes the
/// queued commands, then reads until a read finds the socket empty, and counts that. Once the
/// count has grown by two since the control thread queued a command, the worker has taken the
/// command and then read everything that had arrived by some moment after it. (One is not
/// enough: that turn may have taken its commands before this one was queued.)
#[derive(Clone, Debug, Default)]
pub(super) struct Drained(Arc<AtomicU64>);

impl Drained {
    pub(super) fn get(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }

    fn bump(&self) {
        self.0.fetch_add(1, Ordering::Release);
    }
}

/// Immediate tags whose operation ended here lately, with every lane's [`Drained`] count at
/// the end: the next operation with one of them waits until each lane has drained twice
/// since.
///
/// An operation can end while datagrams of it are still queued on a socket (its last chunks
/// fetched over TCP from a worker that was descheduled, or the operation failed). They are
/// harmless while no open operation has its tag; but ids skipped for operations that ran over
/// TCP can bring the tag around to the next multicast operation within a few operations
/// (4096 small ones in between), where the tag space alone would take 4096 multicast
/// operations. A lane that opened the new one first would take the old one's queued chunks
/// for its own. Waiting until every receive worker has read its socket empty after the end
/// (and before this rank says it is ready, so that no chunk of the new one can be queued yet)
/// leaves nothing of the old one behind but datagrams still on the wire.
///
/// A wait never outlasts `max` (the peer timeout): a receive worker that stopped (it
/// panicked) never drains again, and the operation must still start, and fail, in time.
#[derive(Debug)]
pub(super) struct TagQuarantine {
    ended: Vec<(u32, Box<[u64]>, StdInstant)>,
    max: Duration,
}

impl TagQuarantine {
    pub(super) fn new(max: Duration) -> Self {
        TagQuarantine {
            ended: Vec::new(),
            max,
        }
    }

    /// An operation with `tag` ended at `now`; `drained` holds every lane's count now.
    pub(super) fn ended(&mut self, tag: u32, drained: &[u64], now: StdInstant) {
        // What every lane drained past is over: the list holds what ended lately.
        let max = self.max;
        self.ended.retain(|(t, at, when)| {
            *t != tag && !drained_past(at, drained) && now.duration_since(*when) < max
        });
        self.ended.push((tag, drained.into(), now));
    }

    /// Whether an operation with `tag` must wait (`drained` and `now` as for
    /// [`ended`](Self::ended)).
    pub(super) fn holds(&mut self, tag: u32, drained: &[u64], now: StdInstant) -> bool {
        let Some(i) = self.ended.iter().position(|(t, ..)| *t == tag) else {
            return false;
        };
        let (_, at, when) = &self.ended[i];
        if drained_past(at, drained) || now.duration_since(*when) >= self.max {
            self.ended.swap_remove(i);
            return false;
        }
        true
    }
}

/// Every lane drained twice since `at`.
fn drained_past(at: &[u64], now: &[u64]) -> bool {
    at.iter().zip(now).all(|(a, n)| n.wrapping_sub(*a) >= 2)
}

/// Where a thread is pinned, when `RINGCAST_PIN=1`: the rank's threads take consecutive
/// cores from its base (control, then each lane's receive and send worker), wrapping around.
#[derive(Clone, Debug)]
pub(super) struct Pinning {
    cores: Vec<core_affinity::CoreId>,
    base: usize,
}

impl Pinning {
    /// From `RINGCAST_PIN`; `None` when unset, off, or the cores cannot be listed (logged).
    pub(super) fn from_env(base: usize) -> Option<Self> {
        let on = std::env::var("RINGCAST_PIN").is_ok_and(|v| matches!(v.trim(), "1" | "true"));
        if !on {
            return None;
        }
        match core_affinity::get_core_ids() {
            Some(cores) if !cores.is_empty() => Some(Pinning { cores, base }),
            _ => {
                tracing::info!("RINGCAST_PIN=1 but the cores cannot be listed: not pinning");
                None
            }
        }
    }

    /// Pins the calling thread as the rank's `slot`-th thread.
    pub(super) fn pin(&self, slot: usize, what: &str) {
        let core = self.cores[(self.base + slot) % self.cores.len()];
        if core_affinity::set_for_current(core) {
            tracing::debug!(core = core.id, what, "pinned");
        } else {
            tracing::info!(core = core.id, what, "pinning failed: running unpinned");
        }
    }
}

/// Whether receive workers go under `SCHED_BATCH` (see
/// [`batch_scheduling`](ringcast_transport_rocev2_udp::batch_scheduling)): yes unless
/// `RINGCAST_RX_SCHED=other`.
fn rx_batch_from_env() -> bool {
    std::env::var("RINGCAST_RX_SCHED").map_or(true, |v| v.trim() != "other")
}

/// Whether receive workers read predicted runs straight into the operation's buffer: yes
/// unless `RINGCAST_RX_DIRECT=0`.
fn rx_direct_from_env() -> bool {
    on_unless_off("RINGCAST_RX_DIRECT")
}

/// Whether send workers gather GSO batches straight from the operation's buffer: yes unless
/// `RINGCAST_TX_DIRECT=0`.
fn tx_direct_from_env() -> bool {
    on_unless_off("RINGCAST_TX_DIRECT")
}

/// A switch that is on unless the variable says `0` or `off`.
fn on_unless_off(var: &str) -> bool {
    std::env::var(var).map_or(true, |v| !matches!(v.trim(), "0" | "off"))
}

/// Spawns lane `l`'s two workers. `control` is the control thread (workers unpark it when
/// they queue a note).
#[allow(clippy::too_many_arguments)]
pub(super) fn spawn(
    rank: u32,
    lane: (LaneRx, LaneTx),
    mut port: (UdpRx, UdpTx),
    pacer: Pacer,
    clock: Clock,
    control: Thread,
    pin: Option<Pinning>,
) -> std::io::Result<LaneLink> {
    let l = lane.0.lane();
    port.1.set_send_in_place(tx_direct_from_env());
    let rx_wake = port.0.waker();
    let drops_every = if port.0.socket_drops_cheap() {
        DROPS_EVERY
    } else {
        DROPS_EVERY_SLOW
    };
    let (rx_cmd, rx_cmds) = mpsc::sync_channel(QUEUE);
    let (tx_cmd, tx_cmds) = mpsc::sync_channel(QUEUE);
    let (rx_note, rx_notes) = mpsc::sync_channel(QUEUE);
    let (tx_note, tx_notes) = mpsc::sync_channel(QUEUE);
    let rx_snap = Shared::default();
    let tx_snap = Shared::default();
    let rx_drained = Drained::default();
    let mut rw = RxWorker {
        lane: lane.0,
        port: port.0,
        cmds: rx_cmds,
        out: NoteOut {
            queue: rx_note,
            backlog: VecDeque::new(),
            control: control.clone(),
        },
        snap: rx_snap.clone(),
        drops_every,
        drops_at: None,
        dirty: false,
        socket_drops: 0,
        counts: Vec::new(),
        direct: rx_direct_from_env(),
        drained: rx_drained.clone(),
    };
    let tw = TxWorker {
        core: TxCore {
            lane: lane.1,
            port: port.1,
            pacer,
        },
        cmds: tx_cmds,
        out: NoteOut {
            queue: tx_note,
            backlog: VecDeque::new(),
            control,
        },
        snap: tx_snap.clone(),
        clock,
        meter: SendMeter::default(),
    };
    // The counters as they stand (the start-up check's probes went through these ports): a
    // worker publishes at its first turn, which may come after the application's first
    // `stats()` on a busy host, and a snapshot left at zero until then would count those
    // datagrams in the first operations' window.
    rw.publish(true);
    tw.publish();
    let slot = 1 + 2 * usize::from(l);
    let p = pin.clone();
    let batch = rx_batch_from_env();
    let rt = thread::Builder::new()
        .name(format!("ringcast-r{rank}-rx{l}"))
        .spawn(move || {
            if let Some(p) = p {
                p.pin(slot, "receive worker");
            }
            if batch && let Err(e) = ringcast_transport_rocev2_udp::batch_scheduling() {
                tracing::info!(error = %e, "receive worker stays under SCHED_OTHER");
            }
            rw.run()
        })?;
    let tt = thread::Builder::new()
        .name(format!("ringcast-r{rank}-tx{l}"))
        .spawn(move || {
            if let Some(p) = pin {
                p.pin(slot + 1, "send worker");
            }
            tw.run()
        });
    let tt = match tt {
        Ok(t) => t,
        Err(e) => {
            // The receive worker ends once its command queue closes.
            drop(rx_cmd);
            let _ = rt.join();
            return Err(e);
        }
    };
    Ok(LaneLink {
        rx_drained,
        rx_cmd,
        rx_wake,
        tx_cmd,
        rx_notes,
        tx_notes,
        rx_snap,
        tx_snap,
        threads: vec![rt, tt],
    })
}

/// One lane's receive worker.
struct RxWorker {
    lane: LaneRx,
    port: UdpRx,
    cmds: Receiver<RxCommand>,
    out: NoteOut,
    snap: Shared<RxSnap>,
    /// How often the socket's drop counter is read while datagrams arrive.
    drops_every: Duration,
    /// When the socket's drop counter was read last.
    drops_at: Option<StdInstant>,
    /// Datagrams arrived since.
    dirty: bool,
    socket_drops: u64,
    /// `Count` and `Overdue` commands waiting for the batch queued behind them (see
    /// `counts`).
    counts: Vec<RxCommand>,
    /// Receive predicted runs in place ([`UdpRx::wait_with`]); `RINGCAST_RX_DIRECT=0` turns
    /// it off.
    direct: bool,
    drained: Drained,
}

impl RxWorker {
    /// Until the control thread closes the command queue.
    fn run(mut self) {
        while self.turn() {}
    }

    /// Takes the queued commands, then waits for a batch and hands it to the lane; false
    /// once the control thread is gone.
    fn turn(&mut self) -> bool {
        if !self.commands() {
            return false;
        }
        self.counts();
        // Notes the control thread could not take yet are retried soon.
        let wait = if self.out.backlog.is_empty() {
            RX_WAIT
        } else {
            BACKLOG_RETRY
        };
        if self.wait(wait) == 0 {
            // Nothing held. Drained only if the read found the socket empty: one whose
            // datagrams were all dropped (this rank's own trimmed multicast, another job's)
            // may have left more queued, an old operation's chunks among them, and a failed
            // read says nothing.
            if self.port.found_empty() {
                self.drained.bump();
            }
            self.publish(false);
            return true;
        }
        // Commands queued while we waited are handled before the batch just read: an
        // `Open` queued before one of its chunks arrived is always seen first.
        if !self.commands() {
            return false;
        }
        self.batch();
        self.dirty = true;
        self.notes();
        true
    }

    /// A `Count` or an `Overdue` asks whether chunks still arrive (the cutoff's and a
    /// block deadline's stall checks). Answered only after the batch queued on the socket, if
    /// any, is read: a worker that was descheduled would otherwise report what it had before,
    /// and a fast path whose chunks sit queued would look stalled (its rest then fetched over
    /// TCP while the multicast still brings it).
    fn counts(&mut self) {
        if self.counts.is_empty() {
            return;
        }
        // A read in place takes one datagram, a batched read up to a `recvmmsg`'s worth:
        // either way, read what is queued (up to a batched read's worth of reads) first,
        // until a read finds the socket empty (one that held no chunk may have read only
        // dropped datagrams, with chunks queued behind them).
        for _ in 0..COUNT_READS {
            let errors = self.port.errors;
            if self.wait(Duration::ZERO) == 0 {
                if self.port.found_empty() || self.port.errors != errors {
                    break;
                }
                continue;
            }
            self.batch();
            self.dirty = true;
        }
        for c in self.counts.drain(..) {
            self.lane.handle_command(c);
        }
        self.notes();
    }

    /// Handles every queued command (a `Count` or an `Overdue` waits for
    /// [`counts`](Self::counts)); false once the control thread is gone.
    fn commands(&mut self) -> bool {
        let mut alive = true;
        loop {
            match self.cmds.try_recv() {
                Ok(c @ (RxCommand::Count { .. } | RxCommand::Overdue { .. })) => {
                    self.counts.push(c)
                }
                Ok(c) => self.lane.handle_command(c),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    alive = false;
                    break;
                }
            }
        }
        self.notes();
        alive
    }

    /// Makes sure a batch is held (waiting up to `timeout`); a datagram that starts a run of
    /// chunks the lane expects is received straight into the operation's buffer.
    fn wait(&mut self, timeout: Duration) -> usize {
        let lane = &self.lane;
        if self.direct {
            self.port
                .wait_with(timeout, |from, imm, max| lane.predict(from, imm, max))
        } else {
            self.port.wait(timeout)
        }
    }

    /// Claims, copies and commits every chunk of the batch held: no command is taken before
    /// the batch is over, so every claimed chunk is committed (or released, when its copy
    /// failed) before the next command.
    fn batch(&mut self) {
        let (lane, port) = (&mut self.lane, &mut self.port);
        while port.held() > 0 {
            let Some(tok) = port.receive() else {
                break;
            };
            let m = tok.meta();
            let p = lane.handle_chunk(m.from, m.imm, m.len);
            let written = tok.consume(&p);
            if let Placement::Place { op, .. } = p {
                if written {
                    lane.commit(op);
                } else {
                    lane.release(m.from, m.imm);
                }
            }
        }
    }

    /// Queues the lane's notes for the control thread, counters first (an operation's end
    /// reads them for its rate report).
    fn notes(&mut self) {
        let mut any = false;
        while let Some(n) = self.lane.poll_note() {
            self.out.backlog.push_back(n.into());
            any = true;
        }
        self.publish(any);
        self.out.flush();
    }

    fn publish(&mut self, fresh_drops: bool) {
        let stale = self
            .drops_at
            .is_none_or(|t| t.elapsed() >= self.drops_every);
        if fresh_drops || (self.dirty && stale) {
            if let Some(d) = self.port.socket_drops() {
                self.socket_drops = d;
            }
            self.drops_at = Some(StdInstant::now());
            self.dirty = false;
        }
        write(
            &self.snap,
            RxSnap {
                lane: self.lane.stats(),
                udp: *self.port.receiver().stats(),
                bad_source: self.port.bad_source,
                bad_place: self.port.bad_place,
                moved: self.port.moved,
                errors: self.port.errors,
                socket_drops: self.socket_drops,
            },
        );
    }
}

/// What a paced send worker needs of its port (a trait so that tests run the worker's logic
/// in virtual time over a fake).
pub(super) trait PacedPort {
    fn post(&mut self, m: &Multicast);
    fn queued(&self) -> usize;
    /// Sends one batch; its bytes.
    fn send_one_batch(&mut self) -> usize;
    fn take_done(&mut self) -> Option<(OpId, u32)>;
    fn cancel(&mut self, op: OpId);
}

impl PacedPort for UdpTx {
    fn post(&mut self, m: &Multicast) {
        self.post_multicast(m);
    }

    fn queued(&self) -> usize {
        UdpTx::queued(self)
    }

    fn send_one_batch(&mut self) -> usize {
        UdpTx::send_one_batch(self)
    }

    fn take_done(&mut self) -> Option<(OpId, u32)> {
        UdpTx::take_done(self)
    }

    fn cancel(&mut self, op: OpId) {
        UdpTx::cancel(self, op);
    }
}

/// What a send worker does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Next {
    /// Go on at once.
    Now,
    /// The pacer holds the next batch until then.
    At(Instant),
    /// Nothing to send: wait for a command.
    Idle,
}

/// A send worker's logic, clock-free: the lane's send half, its port and the pacer.
#[derive(Debug)]
pub(super) struct TxCore<P> {
    pub(super) lane: LaneTx,
    pub(super) port: P,
    pub(super) pacer: Pacer,
}

impl<P: PacedPort> TxCore<P> {
    pub(super) fn handle(&mut self, now: Instant, m: TxMsg) {
        match m {
            TxMsg::Cmd(c) => {
                if let TxCommand::Cancel { op } = &c {
                    // Queued multicasts of a failed operation are dropped (and reported done).
                    self.port.cancel(*op);
                }
                self.lane.handle_command(c);
            }
            TxMsg::Rate(r) => self.pacer.set_rate(now, r),
        }
    }

    /// Posts what the lane's window allows, releases at most one batch if the pacer lets it
    /// go, and hands completions back to the lane.
    pub(super) fn step(&mut self, now: Instant) -> Next {
        while let Some(m) = self.lane.poll_multicast() {
            self.port.post(&m);
        }
        let mut next = Next::Idle;
        if self.port.queued() > 0 {
            match self.pacer.poll_release(now) {
                Some(at) => next = Next::At(at),
                None => {
                    let bytes = self.port.send_one_batch();
                    self.pacer.on_sent(now, bytes);
                    next = Next::Now;
                }
            }
        }
        while let Some((op, n)) = self.port.take_done() {
            self.lane.handle_send_done(op, n);
        }
        if next == Next::Idle && (self.port.queued() > 0 || self.lane.may_send()) {
            next = Next::Now;
        }
        next
    }
}

/// The rate a send worker reaches while it has something to send, over windows of
/// [`SENDING_WINDOW`]; idle spells are left out (a window starts again after one).
///
/// The rate is what a cut starts from ([`RateController::on_report_sending`]), so it must be
/// recent: it becomes unknown (0, and a cut then starts from the pacer's rate) once its
/// window is [`SENDING_STALE`] old, and when a busy spell starts after an idle one longer
/// than a window. A root whose operations are shorter than a window would otherwise keep
/// reporting a rate reached long ago, far below what it sends now.
///
/// [`RateController::on_report_sending`]: ringcast_transport_rocev2_udp::pace::RateController::on_report_sending
#[derive(Debug, Default)]
pub(super) struct SendMeter {
    window: Option<(Instant, u64)>,
    rate: u64,
    /// When the last full window ended (`None` while the rate is unknown).
    measured: Option<Instant>,
    /// When the current idle spell started.
    idle_since: Option<Instant>,
}

impl SendMeter {
    /// At `now` the worker has sent `bytes` in all; `busy`: it still has something to send.
    pub(super) fn update(&mut self, now: Instant, bytes: u64, busy: bool) {
        if self
            .measured
            .is_some_and(|at| now.saturating_duration_since(at) >= SENDING_STALE)
        {
            self.forget();
        }
        if !busy {
            if self.window.take().is_some() {
                self.idle_since = Some(now);
            }
            return;
        }
        let Some((t0, b0)) = self.window else {
            if self
                .idle_since
                .take()
                .is_some_and(|t| now.saturating_duration_since(t) > SENDING_WINDOW)
            {
                self.forget();
            }
            self.window = Some((now, bytes));
            return;
        };
        let dt = now.saturating_duration_since(t0);
        if dt >= SENDING_WINDOW {
            let per_sec = u128::from(bytes.saturating_sub(b0)) * 1_000_000_000 / dt.as_nanos();
            self.rate = u64::try_from(per_sec).unwrap_or(u64::MAX);
            self.measured = Some(now);
            self.window = Some((now, bytes));
        }
    }

    fn forget(&mut self) {
        self.rate = 0;
        self.measured = None;
    }

    /// Bytes per second over the last full window; 0 (unknown) before the first and once
    /// it is stale.
    pub(super) fn rate(&self) -> u64 {
        self.rate
    }
}

/// The rate a rank's send workers reached lately, from each lane's [`TxSnap::sending`]:
/// their sum, or 0 (unknown) when a lane's is unknown (the lanes measured would stand for the
/// whole rate, and a cut would start far below it).
pub(super) fn sending_total(lanes: impl IntoIterator<Item = u64>) -> u64 {
    lanes
        .into_iter()
        .try_fold(0u64, |sum, r| (r > 0).then(|| sum.saturating_add(r)))
        .unwrap_or(0)
}

/// One lane's send worker.
struct TxWorker {
    core: TxCore<UdpTx>,
    cmds: Receiver<TxMsg>,
    out: NoteOut,
    snap: Shared<TxSnap>,
    clock: Clock,
    meter: SendMeter,
}

impl TxWorker {
    /// Until the control thread closes the command queue.
    fn run(mut self) {
        loop {
            loop {
                match self.cmds.try_recv() {
                    Ok(m) => self.core.handle(self.clock.now(), m),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => return,
                }
            }
            let now = self.clock.now();
            let next = self.core.step(now);
            let sent = self.core.port.sender().stats().udp_bytes;
            self.meter.update(now, sent, next != Next::Idle);
            while let Some(n) = self.core.lane.poll_note() {
                self.out.backlog.push_back(n.into());
            }
            self.publish();
            self.out.flush();
            let wait = match next {
                Next::Now if self.out.backlog.is_empty() => continue,
                Next::Now => BACKLOG_RETRY,
                Next::At(at) => Duration::from_nanos(at.as_nanos().saturating_sub(now.as_nanos()))
                    .min(TX_IDLE_WAIT),
                Next::Idle => TX_IDLE_WAIT,
            };
            // Sleeps until the pacer releases the next batch, and wakes for a command.
            match self.cmds.recv_timeout(wait) {
                Ok(m) => self.core.handle(self.clock.now(), m),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return,
            }
        }
    }

    fn publish(&self) {
        let tx = self.core.port.sender();
        write(
            &self.snap,
            TxSnap {
                lane: *self.core.lane.stats(),
                udp: *tx.stats(),
                lost: self.core.port.lost,
                timed_out: self.core.port.blocked,
                sending: self.meter.rate(),
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringcast_core::lane::LaneCommand;
    use ringcast_core::port::Port;
    use ringcast_core::{Config, Rank, Session};
    use ringcast_transport_rocev2_udp::addr::JobAddrs;
    use ringcast_transport_rocev2_udp::{
        ControlConfig, LaneSender, OutChunk, Registry, SocketConfig, TcpControl, TxConfig,
        TxSocket, UdpPort, UdpPortConfig,
    };

    /// A tag that ended waits until every lane drained twice; other tags never wait; what
    /// every lane drained past is forgotten when the next operation ends.
    #[test]
    fn a_tag_waits_until_every_lane_drained_twice_since_its_end() {
        let t = StdInstant::now();
        let mut q = TagQuarantine::new(Duration::from_secs(5));
        assert!(!q.holds(5, &[0, 0], t));
        q.ended(5, &[10, 20], t);
        assert!(q.holds(5, &[10, 20], t));
        assert!(!q.holds(6, &[10, 20], t), "another tag");
        assert!(q.holds(5, &[11, 25], t), "lane 0 drained once");
        assert!(q.holds(5, &[15, 21], t), "lane 1 drained once");
        assert!(!q.holds(5, &[12, 22], t));
        assert!(!q.holds(5, &[12, 22], t), "forgotten once free");
        // Ending the same tag again restarts its wait; ends every lane drained past go.
        q.ended(7, &[12, 22], t);
        q.ended(5, &[13, 22], t);
        q.ended(5, &[14, 23], t);
        assert_eq!(q.ended.len(), 2, "{:?}", q.ended);
        assert!(q.holds(5, &[15, 24], t));
        q.ended(8, &[16, 25], t);
        assert_eq!(
            q.ended.iter().map(|(t, ..)| *t).collect::<Vec<_>>(),
            [8],
            "7 and 5 drained past"
        );
        // Counts wrap.
        q.ended(9, &[u64::MAX, 0], t);
        assert!(q.holds(9, &[0, 2], t));
        assert!(!q.holds(9, &[1, 2], t));
        // A lane that never drains again (its worker stopped) holds a tag for `max` at most.
        q.ended(10, &[3, 3], t);
        assert!(q.holds(10, &[3, 9], t + Duration::from_millis(4_999)));
        assert!(!q.holds(10, &[3, 9], t + Duration::from_secs(5)));
        q.ended(11, &[3, 9], t);
        q.ended(12, &[3, 9], t + Duration::from_secs(6));
        assert_eq!(
            q.ended.iter().map(|(t, ..)| *t).collect::<Vec<_>>(),
            [12],
            "11 is past `max`"
        );
    }

    /// A receive worker of rank 0 of a one-rank job (one lane, on loopback), driven from the
    /// test's thread, with its command queue; and a sender of another job's datagrams (the
    /// wrong Q_Key) into its group.
    fn lone_rx(nonce: u64, direct: bool) -> (RxWorker, SyncSender<RxCommand>, LaneSender) {
        let udp = std::net::UdpSocket::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let cfg = UdpPortConfig::loopback(0, 1, 1, nonce, udp);
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let table = [listener.local_addr().unwrap()];
        let control = TcpControl::connect(
            0,
            &table,
            listener,
            Registry::default(),
            ControlConfig::new(nonce),
        )
        .unwrap();
        let mut ports = UdpPort::open(&cfg, control).unwrap().into_ports();
        let port = ports.rx.remove(0);
        let qkey = JobAddrs::derive(nonce, 1, &cfg.addr).unwrap().qkey();
        let stranger = LaneSender::new(
            TxSocket::open(&SocketConfig::loopback()).unwrap(),
            TxConfig {
                lane: 0,
                group: port.receiver().socket().group(),
                pkey: 0xFFFF,
                qkey: qkey ^ 1,
                rank: 0,
                max_payload: 4096,
                gso: false,
                initial_psn: 0,
            },
        )
        .unwrap();
        let (cmd, cmds) = mpsc::sync_channel(QUEUE);
        let (note, _) = mpsc::sync_channel(QUEUE);
        let w = RxWorker {
            lane: LaneRx::new(&Config::new(0, 1), 0),
            port,
            cmds,
            out: NoteOut {
                queue: note,
                backlog: VecDeque::new(),
                control: thread::current(),
            },
            snap: Shared::default(),
            drops_every: DROPS_EVERY,
            drops_at: None,
            dirty: false,
            socket_drops: 0,
            counts: Vec::new(),
            direct,
            drained: Drained::default(),
        };
        (w, cmd, stranger)
    }

    /// More datagrams of another job than one `recvmmsg` takes (each dropped by the
    /// receiver), queued on `w`'s socket.
    const STRANGERS: u64 = 80;

    fn queue_strangers(stranger: &mut LaneSender) {
        for k in 0..STRANGERS {
            let c = OutChunk {
                imm: k as u32,
                payload: &[7; 64],
            };
            stranger.send_batch(&[c]).unwrap();
        }
        // Loopback delivers at once; the sleep only covers a slow softirq.
        thread::sleep(Duration::from_millis(100));
    }

    /// A worker counts a drain (what ends a tag's quarantine) only after a read found its
    /// socket empty: reads that held no chunk because every datagram in them was dropped
    /// left more queued (an old operation's chunks could be among them).
    #[test]
    fn a_lane_drains_only_once_a_read_found_its_socket_empty() {
        for direct in [false, true] {
            let (mut w, _cmd, mut stranger) = lone_rx(0xE1A0_0001 + u64::from(direct), direct);
            queue_strangers(&mut stranger);
            let mut turns = 0;
            while w.drained.get() == 0 {
                turns += 1;
                assert!(turns < 50, "never drained (direct: {direct})");
                assert!(w.turn());
            }
            assert_eq!(
                w.port.receiver().stats().qkey,
                STRANGERS,
                "drained with datagrams still queued (direct: {direct})"
            );
        }
    }

    /// A `Count` is answered only after the datagrams queued are read, past reads that held
    /// no chunk because every datagram in them was dropped: a chunk queued behind them
    /// would otherwise look stalled, and be fetched over TCP.
    #[test]
    fn a_count_waits_for_the_queue_read_past_dropped_datagrams() {
        for direct in [false, true] {
            let (mut w, _cmd, mut stranger) = lone_rx(0xE1A0_0003 + u64::from(direct), direct);
            queue_strangers(&mut stranger);
            w.counts.push(RxCommand::Count { op: OpId(1) });
            w.counts();
            assert!(w.counts.is_empty());
            assert_eq!(
                w.port.receiver().stats().qkey,
                STRANGERS,
                "answered with datagrams still queued (direct: {direct})"
            );
        }
    }

    /// A port that "sends" every queued chunk of a batch at once and records when.
    #[derive(Default)]
    struct Fake {
        queued: VecDeque<Multicast>,
        done: VecDeque<(OpId, u32)>,
        batch: usize,
        bytes_per_chunk: usize,
        sent: Vec<usize>,
    }

    impl PacedPort for Fake {
        fn post(&mut self, m: &Multicast) {
            self.queued.push_back(*m);
        }
        fn queued(&self) -> usize {
            self.queued.len()
        }
        fn send_one_batch(&mut self) -> usize {
            let n = self.batch.min(self.queued.len());
            let op = self.queued[0].op;
            self.queued.drain(..n);
            self.done.push_back((op, n as u32));
            self.sent.push(n);
            n * self.bytes_per_chunk
        }
        fn take_done(&mut self) -> Option<(OpId, u32)> {
            self.done.pop_front()
        }
        fn cancel(&mut self, op: OpId) {
            let before = self.queued.len();
            self.queued.retain(|m| m.op != op);
            let n = before - self.queued.len();
            if n > 0 {
                self.done.push_back((op, n as u32));
            }
        }
    }

    /// Rank 0 of 2, root of a Broadcast of `len` bytes, one lane: its send half, started.
    fn root(len: u64) -> (Session, LaneTx) {
        let mut cfg = Config::new(0, 2);
        cfg.chunk_size = 1000;
        let mut s = Session::new(cfg.clone()).unwrap();
        let mut tx = LaneTx::new(&cfg, 0);
        s.start_broadcast(Instant::ZERO, Rank(0), len).unwrap();
        // The leaf is ready: the root activates its sends.
        let mut ready = Vec::new();
        let mut leaf_cfg = Config::new(1, 2);
        leaf_cfg.chunk_size = 1000;
        let mut leaf = Session::new(leaf_cfg).unwrap();
        leaf.start_broadcast(Instant::ZERO, Rank(0), len).unwrap();
        let mut buf = Vec::new();
        while let Some(t) = leaf.poll_transmit(&mut buf) {
            if let ringcast_core::Transmit::Control { len, .. } = t {
                ready.push(buf[..len].to_vec());
            }
        }
        for m in ready {
            s.handle_control(Instant::ZERO, Rank(1), &m);
        }
        while let Some(c) = s.poll_lane_command() {
            if let LaneCommand::Tx { cmd, .. } = c {
                tx.handle_command(cmd);
            }
        }
        (s, tx)
    }

    /// A send worker's core for a 100,000-chunk root: batches of 10 chunks of 1000 bytes,
    /// paced at `rate` bytes/s with a bucket of `depth` bytes (the session must outlive it).
    fn paced(rate: u64, depth: u64) -> (Session, TxCore<Fake>) {
        let (s, lane) = root(100_000);
        let core = TxCore {
            lane,
            port: Fake {
                batch: 10,
                bytes_per_chunk: 1000,
                ..Fake::default()
            },
            pacer: Pacer::new(Instant::ZERO, rate, depth),
        };
        (s, core)
    }

    fn at_us(us: u64) -> Instant {
        Instant::from_nanos(us * 1_000)
    }

    /// Drives the core in virtual time as the worker does (sleeping exactly until each
    /// release) and returns the instants batches left.
    fn drive(core: &mut TxCore<Fake>, until: Instant) -> Vec<Instant> {
        let mut now = Instant::ZERO;
        let mut releases = Vec::new();
        while now.as_nanos() <= until.as_nanos() {
            let before = core.port.sent.len();
            match core.step(now) {
                Next::Now => {}
                Next::At(t) => now = t,
                Next::Idle => break,
            }
            if core.port.sent.len() > before {
                releases.push(now);
            }
        }
        releases
    }

    #[test]
    fn the_send_worker_releases_one_batch_per_rate_step() {
        // 100 chunks of 1000 bytes, batches of 10 (10 kB), 10 MB/s, a bucket of one batch:
        // after the first two batches (the full bucket), one batch leaves every millisecond.
        let (_s, mut core) = paced(10_000_000, 10_000);
        let releases = drive(&mut core, at_us(1_000_000));
        assert_eq!(core.port.sent.iter().sum::<usize>(), 100);
        assert!(
            core.port.sent.iter().all(|&n| n == 10),
            "{:?}",
            core.port.sent
        );
        let want: Vec<Instant> = [0, 0]
            .into_iter()
            .chain((1..9).map(|k| k * 1_000))
            .map(at_us)
            .collect();
        assert_eq!(releases, want);
        assert_eq!(core.lane.stats().chunks_sent, 100);
        // Every send completed: the lane says its sends are done.
        assert!(core.lane.poll_note().is_some());
        assert_eq!(core.step(at_us(10_000)), Next::Idle);
    }

    #[test]
    fn a_new_rate_applies_from_the_next_batch() {
        let (_s, mut core) = paced(10_000_000, 0);
        // The first batch leaves at 0 and puts the bucket 1 ms in debt.
        assert_eq!(core.step(Instant::ZERO), Next::Now);
        assert_eq!(core.step(Instant::ZERO), Next::At(at_us(1_000)));
        // Halving the rate at 0 doubles the wait.
        core.handle(Instant::ZERO, TxMsg::Rate(5_000_000));
        assert_eq!(core.step(Instant::ZERO), Next::At(at_us(2_000)));
        assert_eq!(core.pacer.rate(), 5_000_000);
    }

    #[test]
    fn the_send_meter_measures_busy_windows_only() {
        let mut m = SendMeter::default();
        m.update(at_us(0), 0, true);
        m.update(at_us(2_000), 1_000, true);
        assert_eq!(m.rate(), 0, "no full window yet");
        m.update(at_us(4_000), 4_000, true);
        assert_eq!(m.rate(), 1_000_000);
        // An idle spell is not averaged in: the next window starts when sending does.
        m.update(at_us(10_000), 4_000, false);
        m.update(at_us(500_000), 4_000, true);
        m.update(at_us(505_000), 14_000, true);
        assert_eq!(m.rate(), 2_000_000);
    }

    /// The rate a cut starts from is recent: a worker that sent 10 MB/s once, long ago, and
    /// since sends 1 GB/s in bursts shorter than the window, does not report 10 MB/s (one
    /// lossy report would cut a 1 GB/s rate to 7 MB/s), but an unknown rate.
    #[test]
    fn the_send_meter_forgets_a_rate_from_before_an_idle_spell() {
        let mut m = SendMeter::default();
        m.update(at_us(0), 0, true);
        m.update(at_us(4_000), 40_000, true);
        assert_eq!(m.rate(), 10_000_000);
        m.update(at_us(5_000), 40_000, false);
        // A second of 1 MB operations, each 1 ms at 1 GB/s, every 10 ms.
        let mut bytes = 40_000u64;
        for k in 0..100u64 {
            let t0 = 1_000_000 + k * 10_000;
            m.update(at_us(t0), bytes, true);
            bytes += 1_000_000;
            m.update(at_us(t0 + 1_000), bytes, true);
            m.update(at_us(t0 + 1_000), bytes, false);
        }
        assert_eq!(m.rate(), 0, "the meter still says {} B/s", m.rate());
    }

    /// A measured rate stands for a window and a report interval, through a short idle
    /// spell; then it is unknown, busy or not.
    #[test]
    fn the_send_meter_rate_goes_stale() {
        let mut m = SendMeter::default();
        m.update(at_us(0), 0, true);
        m.update(at_us(4_000), 40_000, true);
        assert_eq!(m.rate(), 10_000_000);
        // Idle for less than a window: the next operation keeps the rate.
        m.update(at_us(5_000), 40_000, false);
        m.update(at_us(8_000), 40_000, true);
        assert_eq!(m.rate(), 10_000_000);
        // Then idle: the rate stands until its window is `SENDING_STALE` old.
        let stale = 4_000 + SENDING_STALE.as_micros() as u64;
        m.update(at_us(stale - 1), 40_000, false);
        assert_eq!(m.rate(), 10_000_000);
        m.update(at_us(stale), 40_000, false);
        assert_eq!(m.rate(), 0);
    }

    /// The lanes' rates add up, but one lane's unknown rate makes the rank's unknown: the
    /// others alone would make a cut start far too low.
    #[test]
    fn the_rate_sent_is_unknown_while_a_lane_s_is() {
        assert_eq!(sending_total([3, 4]), 7);
        assert_eq!(sending_total([3, 0, 4]), 0);
        assert_eq!(sending_total([u64::MAX, 1]), u64::MAX);
    }

    #[test]
    fn cancel_drops_queued_multicasts_and_completes_them() {
        let (_s, mut core) = paced(1, 0);
        // One batch leaves; the bucket is then in debt for ages.
        assert_eq!(core.step(Instant::ZERO), Next::Now);
        assert!(matches!(core.step(Instant::ZERO), Next::At(_)));
        assert!(core.port.queued() > 0);
        let op = core.port.queued[0].op;
        core.handle(Instant::ZERO, TxMsg::Cmd(TxCommand::Cancel { op }));
        assert_eq!(core.port.queued(), 0);
        assert_eq!(core.step(Instant::ZERO), Next::Idle);
        assert_eq!(core.port.sent, vec![10]);
    }
}
