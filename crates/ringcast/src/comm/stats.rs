//! Counters: per communicator ([`CommStats`]) and per operation ([`OpStats`]).

use std::sync::atomic::Ordering;
use std::time::Duration;

use ringcast_core::Stats;
use ringcast_transport_rocev2_udp::control::ControlStats;
use ringcast_transport_rocev2_udp::{RxStats, TxStats};

/// The headline counters, cumulative per communicator; an [`OpStats`] holds their growth while
/// the operation was in flight.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Chunks multicast as root.
    pub chunks_sent: u64,
    /// Payload bytes multicast.
    pub bytes_sent: u64,
    /// Chunks placed from the multicast fast path.
    pub chunks_received: u64,
    /// Payload bytes accepted from the multicast groups.
    pub bytes_received: u64,
    /// Chunks recovered by reads from the ring neighbour.
    pub chunks_fetched: u64,
    /// Bytes those reads brought in.
    pub bytes_fetched: u64,
    /// Chunks the core dropped (duplicate, stale, out of range, wrong source or lane, own,
    /// bad length: see [`CommStats::core`] for each reason).
    pub chunks_dropped: u64,
    /// Datagrams the transport dropped before the core saw them (bad headers, unknown
    /// source, no buffer: see [`CommStats::rx`] for each reason).
    pub datagrams_dropped: u64,
    /// Multicasts that could not be sent (socket errors, no buffer); the ring repairs them.
    pub multicasts_lost: u64,
    /// Multicast sends that waited for socket buffer space in vain (100 ms each): the send
    /// path was stuck (a NIC paused by PFC, a wedged queue). Their chunks stayed queued; an
    /// operation whose sends stop for good fails with
    /// [`CommError::SendsStalled`](super::CommError::SendsStalled).
    pub sends_timed_out: u64,
    /// Payload bytes sent over the TCP fallback (own pieces and pieces passed on).
    pub tcp_bytes_sent: u64,
    /// Payload bytes received over the TCP fallback.
    pub tcp_bytes_received: u64,
    /// Of `tcp_bytes_received`, the bytes the mesh read straight into the operation's buffer
    /// (pieces of an operation that had started, landing in place); the rest were read into
    /// a vector first and copied.
    pub tcp_bytes_landed: u64,
}

impl Counters {
    /// Growth from `earlier` to `self`.
    pub fn since(&self, earlier: &Counters) -> Counters {
        let d = |a: u64, b: u64| a.saturating_sub(b);
        Counters {
            chunks_sent: d(self.chunks_sent, earlier.chunks_sent),
            bytes_sent: d(self.bytes_sent, earlier.bytes_sent),
            chunks_received: d(self.chunks_received, earlier.chunks_received),
            bytes_received: d(self.bytes_received, earlier.bytes_received),
            chunks_fetched: d(self.chunks_fetched, earlier.chunks_fetched),
            bytes_fetched: d(self.bytes_fetched, earlier.bytes_fetched),
            chunks_dropped: d(self.chunks_dropped, earlier.chunks_dropped),
            datagrams_dropped: d(self.datagrams_dropped, earlier.datagrams_dropped),
            multicasts_lost: d(self.multicasts_lost, earlier.multicasts_lost),
            sends_timed_out: d(self.sends_timed_out, earlier.sends_timed_out),
            tcp_bytes_sent: d(self.tcp_bytes_sent, earlier.tcp_bytes_sent),
            tcp_bytes_received: d(self.tcp_bytes_received, earlier.tcp_bytes_received),
            tcp_bytes_landed: d(self.tcp_bytes_landed, earlier.tcp_bytes_landed),
        }
    }
}

/// What one operation did, returned with its completion.
///
/// The counters are the communicator's growth while the operation was in flight: exact when it
/// ran alone, shared with the operations that overlapped it otherwise.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpStats {
    /// The operation's sequence number (the same on every rank).
    pub op: u64,
    /// Bytes of the operation's buffer.
    pub bytes: u64,
    /// From the start on the engine thread to the completion.
    pub elapsed: Duration,
    /// Counters while it was in flight.
    pub counters: Counters,
}

/// The control path's counters, read once.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ControlCounters {
    /// Control messages sent.
    pub messages_sent: u64,
    /// Control messages received.
    pub messages_received: u64,
    /// Reads this rank asked for.
    pub reads_requested: u64,
    /// Reads that completed with data.
    pub reads_completed: u64,
    /// Reads that failed.
    pub reads_failed: u64,
    /// Peers' reads served.
    pub reads_served: u64,
    /// Bytes served to peers.
    pub bytes_served: u64,
    /// Peers' reads refused (unknown operation, range outside the buffer).
    pub reads_refused: u64,
    /// Peers' reads that waited for their connection's queue to drain before being answered.
    pub reads_deferred: u64,
    /// Read answers or refusals from a rank the read was not asked of, or for no read.
    pub stray_responses: u64,
    /// Frames that broke the protocol.
    pub malformed: u64,
    /// Peers lost.
    pub peers_lost: u64,
}

impl ControlCounters {
    pub(crate) fn read(c: &ControlStats) -> Self {
        let g = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        ControlCounters {
            messages_sent: g(&c.messages_sent),
            messages_received: g(&c.messages_received),
            reads_requested: g(&c.reads_requested),
            reads_completed: g(&c.reads_completed),
            reads_failed: g(&c.reads_failed),
            reads_served: g(&c.reads_served),
            bytes_served: g(&c.bytes_served),
            reads_refused: g(&c.reads_refused),
            reads_deferred: g(&c.reads_deferred),
            stray_responses: g(&c.stray_responses),
            malformed: g(&c.malformed),
            peers_lost: g(&c.peers_lost),
        }
    }
}

/// Everything a communicator counted, from [`Communicator::stats`](super::Communicator::stats).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CommStats {
    /// The headline counters.
    pub counters: Counters,
    /// The core's counters (drops by reason, fetch requests, control messages).
    pub core: Stats,
    /// The lanes' receivers, summed: datagrams read, accepted, dropped by reason.
    pub rx: RxStats,
    /// The lanes' senders, summed.
    pub tx: TxStats,
    /// The control path.
    pub control: ControlCounters,
    /// Chunks whose SrcQP named no rank of the job.
    pub rx_bad_source: u64,
    /// Chunks placed into no buffer (operation already released).
    pub rx_bad_place: u64,
    /// Chunks the kernel wrote straight into an operation's buffer that the core placed at
    /// another offset, so they were copied there after all (0 unless a prediction went wrong).
    pub rx_moved: u64,
    /// Receive calls that failed.
    pub rx_errors: u64,
    /// Datagrams the kernel dropped on the lanes' sockets (full receive buffer).
    pub socket_drops: u64,
    /// The pacing rate, bytes per second (`u64::MAX` when pacing is off): what the slowest
    /// receiver takes from all the roots that send to it at once, set by its reports. This
    /// rank multicasts at it over its operation's fan-in (the most roots any receiver hears
    /// at once: 1 in a Broadcast, P-1 in a P-rank Allgather), shared evenly by its lanes' send
    /// workers.
    pub pacing_rate: u64,
    /// Receiver reports this rank's rate controller took (one per receiver and operation
    /// this rank multicast in).
    pub rate_reports: u64,
    /// Messages of TCP operations not started here that peers sent beyond what they may (more
    /// than 64 MiB from one peer, or failures of thousands of operations): dropped.
    pub tcp_early_dropped: u64,
    /// Operations completed.
    pub ops_completed: u64,
    /// Operations failed.
    pub ops_failed: u64,
    /// Operations cancelled by dropping the communicator.
    pub ops_cancelled: u64,
    /// Multicast, or the TCP fallback (from which operation on, and why).
    pub mode: super::fallback::TransportMode,
}

pub(crate) fn add_rx(a: &mut RxStats, b: &RxStats) {
    let f = |x: &mut u64, y: u64| *x = x.saturating_add(y);
    f(&mut a.recv_calls, b.recv_calls);
    f(&mut a.datagrams, b.datagrams);
    f(&mut a.empty, b.empty);
    f(&mut a.accepted, b.accepted);
    f(&mut a.payload_bytes, b.payload_bytes);
    f(&mut a.truncated, b.truncated);
    f(&mut a.oversize, b.oversize);
    f(&mut a.opcode, b.opcode);
    f(&mut a.pkey, b.pkey);
    f(&mut a.qkey, b.qkey);
    f(&mut a.destqp, b.destqp);
    f(&mut a.version, b.version);
    f(&mut a.malformed, b.malformed);
    f(&mut a.unknown_source, b.unknown_source);
    f(&mut a.bad_icrc, b.bad_icrc);
    f(&mut a.direct, b.direct);
    f(&mut a.guessed, b.guessed);
    f(&mut a.guessed_wrong, b.guessed_wrong);
}

pub(crate) fn add_tx(a: &mut TxStats, b: &TxStats) {
    let f = |x: &mut u64, y: u64| *x = x.saturating_add(y);
    f(&mut a.datagrams, b.datagrams);
    f(&mut a.payload_bytes, b.payload_bytes);
    f(&mut a.udp_bytes, b.udp_bytes);
    f(&mut a.sends, b.sends);
    f(&mut a.gso_fallbacks, b.gso_fallbacks);
    f(&mut a.in_place, b.in_place);
}

pub(crate) fn core_drops(s: &Stats) -> u64 {
    [
        s.dropped_duplicate,
        s.dropped_stale,
        s.dropped_out_of_range,
        s.dropped_wrong_source,
        s.dropped_wrong_lane,
        s.dropped_own,
        s.dropped_bad_length,
    ]
    .iter()
    .fold(0u64, |a, &b| a.saturating_add(b))
}
