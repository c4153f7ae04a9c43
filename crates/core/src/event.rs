//! What the session tells its driver: transmits, placements, events, errors.

use crate::config::Rank;
use crate::port::ReadRequest;
use core::fmt;

/// Identifies one collective operation: its sequence number on the session.
///
/// Every rank numbers operations in the order it starts them, so the same collective has the
/// same `OpId` everywhere (collectives must be started in the same order on every rank, as in
/// MPI).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct OpId(pub u64);

impl fmt::Display for OpId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "op {}", self.0)
    }
}

/// Identifies one read the session asked for; report it back with
/// [`Session::handle_read_done`](crate::Session::handle_read_done).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ReadId(pub u64);

/// Something the control path asks the driver to do, returned by
/// [`Session::poll_transmit`](crate::Session::poll_transmit). Multicasts come from the lanes
/// instead ([`LaneTx::poll_multicast`](crate::lane::LaneTx::poll_multicast)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Transmit {
    /// Send the `len` bytes written to the caller's buffer to rank `to` on the reliable path.
    Control {
        /// Destination.
        to: Rank,
        /// Bytes written to the buffer.
        len: usize,
    },
    /// Read bytes `offset..offset + len` of `from`'s buffer of this operation into the same
    /// range of ours, as [`ControlPort::read`](crate::port::ControlPort::read) takes it.
    /// Report with [`Session::handle_read_done`](crate::Session::handle_read_done).
    Read(ReadRequest),
}

/// Where a received chunk's payload goes, or why it is dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Copy the payload (exactly `len` bytes) to `offset` of the operation's buffer.
    Place {
        /// Operation.
        op: OpId,
        /// Byte offset.
        offset: u64,
        /// Bytes to copy (the payload's length: any other length was dropped).
        len: u32,
    },
    /// Do not touch the buffer.
    Drop(DropReason),
}

/// Why a chunk was dropped. Each reason has a counter in [`Stats`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DropReason {
    /// Chunk already present.
    Duplicate,
    /// The op tag names no operation in flight (an earlier, finished or unknown one).
    Stale,
    /// Chunk index beyond the operation's chunks.
    OutOfRange,
    /// Sent by a rank that is not the chunk's root.
    WrongSource,
    /// Arrived on a lane that does not carry this chunk.
    WrongLane,
    /// Our own multicast looped back; the root's own data is never "received".
    Own,
    /// The payload length does not match the chunk.
    BadLength,
}

/// A fatal condition of one operation, or its completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Event {
    /// The operation finished: the buffer holds exactly the root's bytes and may be released.
    Completed {
        /// Operation.
        op: OpId,
    },
    /// The operation failed; the buffer content is unspecified. Multicasts and reads the
    /// transport still has in flight for it may yet touch the buffer: the driver lets them
    /// finish (or cancels them) before handing the buffer back to its user.
    Failed {
        /// Operation.
        op: OpId,
        /// Why.
        error: OpError,
    },
}

/// Why an operation failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum OpError {
    /// This rank waited on `peer` past the deadline.
    PeerUnresponsive {
        /// The rank that did not answer.
        peer: Rank,
    },
    /// Another rank gave up on `peer` (unresponsive, or alive and not posting within the post
    /// timeout) and aborted the operation.
    PeerFailed {
        /// The rank that did not answer.
        peer: Rank,
        /// The rank that reported it.
        reported_by: Rank,
    },
    /// The transport could not read from `peer`.
    ReadFailed {
        /// The peer read from.
        peer: Rank,
    },
    /// The transport lost `peer`: its control connection closed (a crash), or it left.
    PeerLost {
        /// The rank that is gone.
        peer: Rank,
    },
    /// `peer` posted the operation with another kind, root or sizes than `reported_by` did
    /// (an erroneous program: see [`broadcast_shape`](crate::broadcast_shape)). Nothing
    /// moved; every rank fails it, and the next operation runs as usual.
    ShapeMismatch {
        /// The rank whose shape differs.
        peer: Rank,
        /// The rank that compared (the barrier's hub, or a rank that received its `Ready`).
        reported_by: Rank,
    },
    /// `peer` is alive (it answers) but did not post the operation within the post timeout
    /// ([`Config::post_timeout`](crate::Config::post_timeout)): its program is stuck, or
    /// never calls the operation.
    NotPosted {
        /// The rank that did not post.
        peer: Rank,
    },
    /// This rank's transport stopped completing its multicasts: none completed for a whole
    /// [`Config::peer_timeout`](crate::Config::peer_timeout) (after its block's wire time).
    /// The operation fails here, and the other ranks hear of it naming this rank.
    SendsStalled {
        /// This rank.
        rank: Rank,
    },
}

impl OpError {
    /// The rank this error blames.
    pub fn peer(&self) -> Rank {
        match *self {
            OpError::PeerUnresponsive { peer }
            | OpError::PeerFailed { peer, .. }
            | OpError::ReadFailed { peer }
            | OpError::PeerLost { peer }
            | OpError::ShapeMismatch { peer, .. }
            | OpError::NotPosted { peer } => peer,
            OpError::SendsStalled { rank } => rank,
        }
    }
}

impl fmt::Display for OpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OpError::PeerUnresponsive { peer } => write!(f, "{peer} stopped answering"),
            OpError::PeerFailed { peer, reported_by } => {
                write!(f, "{reported_by} gave up on {peer}")
            }
            OpError::ReadFailed { peer } => write!(f, "read from {peer} failed"),
            OpError::PeerLost { peer } => {
                write!(f, "{peer} is gone (its control connection closed)")
            }
            OpError::ShapeMismatch { peer, reported_by } if peer == reported_by => write!(
                f,
                "{peer} refused its own call of this operation, or posted another kind, root \
                 or size"
            ),
            OpError::ShapeMismatch { peer, reported_by } => write!(
                f,
                "{peer} posted this operation with another kind, root or size than \
                 {reported_by} did"
            ),
            OpError::NotPosted { peer } => {
                write!(f, "{peer} is alive but did not post this operation in time")
            }
            OpError::SendsStalled { rank } => write!(
                f,
                "the transport of {rank} (this rank) stopped completing its multicasts"
            ),
        }
    }
}

impl core::error::Error for OpError {}

/// Why an operation could not start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum StartError {
    /// The root is not a rank of the communicator.
    RootOutOfRange,
    /// `limits.max_inflight_ops` operations are in flight already.
    TooManyInflight,
    /// The operation in flight whose id is `op` has the same immediate tag as the next id:
    /// ids taken by operations that ran elsewhere ([`Session::skip_op`](crate::Session::skip_op))
    /// since it started went once around the tag space. Start once it has ended
    /// ([`Session::can_start`](crate::Session::can_start) says when).
    TagInUse {
        /// The operation in flight that holds the tag.
        op: OpId,
    },
    /// An Allgatherv needs one size per rank.
    SizesLength {
        /// Sizes given.
        got: usize,
        /// Ranks of the communicator.
        ranks: u32,
    },
    /// The buffer needs more chunks than the limits or the immediate allow.
    TooLarge {
        /// Chunks needed.
        chunks: u64,
        /// Most chunks allowed.
        max: u32,
    },
}

impl fmt::Display for StartError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StartError::RootOutOfRange => f.write_str("root is not a rank of the communicator"),
            StartError::TooManyInflight => f.write_str("too many operations in flight"),
            StartError::TagInUse { op } => write!(
                f,
                "operation {} still holds the immediate tag of the next operation id",
                op.0
            ),
            StartError::SizesLength { got, ranks } => {
                write!(f, "{got} block sizes given for {ranks} ranks")
            }
            StartError::TooLarge { chunks, max } => {
                write!(f, "buffer needs {chunks} chunks, at most {max} allowed")
            }
        }
    }
}

impl core::error::Error for StartError {}

/// Transport failure reported for a read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadError;

/// Counters of everything dropped, sent and recovered. All saturate, none panic.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Chunks placed from the fast path.
    pub chunks_received: u64,
    /// Chunks recovered by reads from a ring neighbour.
    pub chunks_fetched: u64,
    /// Chunks multicast as root.
    pub chunks_sent: u64,
    /// Dropped: already present.
    pub dropped_duplicate: u64,
    /// Dropped: no such operation in flight.
    pub dropped_stale: u64,
    /// Dropped: index out of range.
    pub dropped_out_of_range: u64,
    /// Dropped: wrong source.
    pub dropped_wrong_source: u64,
    /// Dropped: wrong lane.
    pub dropped_wrong_lane: u64,
    /// Dropped: own loopback.
    pub dropped_own: u64,
    /// Dropped: payload length mismatch.
    pub dropped_bad_length: u64,
    /// Chunks placed whose payload the driver could not write, given back to be recovered
    /// like lost ones.
    pub chunks_released: u64,
    /// Control messages that failed to parse or named impossible values.
    pub control_malformed: u64,
    /// Control messages for operations no longer in flight.
    pub control_stale: u64,
    /// Control messages from a rank that had no reason to send them.
    pub control_unexpected: u64,
    /// Fetch requests sent to the ring predecessor.
    pub fetch_requests: u64,
    /// Fetch requests answered with a NACK (we had to recover first).
    pub fetch_nacks: u64,
    /// Reads issued.
    pub reads: u64,
    /// Deepest fetch recursion behind any chunk this rank recovered: 0 when the neighbour
    /// had it from the fast path (or is the root), `k` when it passed through `k` other
    /// ranks' recovery first.
    pub max_fetch_depth: u32,
}

impl Stats {
    /// Adds one lane's receive counters (the session's own counters cover the control path;
    /// a driver that wants one view adds every lane's).
    pub fn add_rx(&mut self, rx: &crate::lane::RxStats) {
        let add = |a: &mut u64, b: u64| *a = a.saturating_add(b);
        add(&mut self.chunks_received, rx.chunks_received);
        add(&mut self.dropped_duplicate, rx.dropped_duplicate);
        add(&mut self.dropped_stale, rx.dropped_stale);
        add(&mut self.dropped_out_of_range, rx.dropped_out_of_range);
        add(&mut self.dropped_wrong_source, rx.dropped_wrong_source);
        add(&mut self.dropped_wrong_lane, rx.dropped_wrong_lane);
        add(&mut self.dropped_own, rx.dropped_own);
        add(&mut self.dropped_bad_length, rx.dropped_bad_length);
        add(&mut self.chunks_released, rx.released);
    }

    /// Adds one lane's send counters.
    pub fn add_tx(&mut self, tx: &crate::lane::TxStats) {
        self.chunks_sent = self.chunks_sent.saturating_add(tx.chunks_sent);
    }
}
