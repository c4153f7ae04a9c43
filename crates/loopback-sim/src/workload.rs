//! What the simulated ranks run: collective operations, each started at a virtual time.
//!
//! Every rank starts every operation at its start time, in start-time order (ties in the order
//! given), so core sequence numbers agree across ranks as MPI-style collectives require. The
//! driver is generic over [`OpKind`]: a new collective adds a variant and its buffer layout.

use ringcast_core::{Instant, OpId, Rank, Session, StartError};
use serde::Serialize;
use std::ops::Range;
use std::time::Duration;

/// A collective and its arguments.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
#[non_exhaustive]
pub enum OpKind {
    /// `root` broadcasts `len` bytes to every rank.
    Broadcast {
        /// The sending rank.
        root: u32,
        /// Bytes.
        len: u64,
    },
}

impl OpKind {
    /// Bytes of every rank's receive buffer.
    pub fn buffer_len(&self) -> u64 {
        match *self {
            OpKind::Broadcast { len, .. } => len,
        }
    }

    /// Chunk slots of `rank`'s buffer that hold data before the operation starts.
    pub(crate) fn owned_slots(&self, rank: u32, slots: u32) -> Range<u32> {
        match *self {
            OpKind::Broadcast { root, .. } if root == rank => 0..slots,
            OpKind::Broadcast { .. } => 0..0,
        }
    }

    /// The rank whose data lands in other ranks' buffers (for reports).
    pub fn root(&self) -> u32 {
        match *self {
            OpKind::Broadcast { root, .. } => root,
        }
    }

    /// Multicast chunk deliveries a lossless run makes (for progress bars).
    pub(crate) fn expected_deliveries(&self, ranks: u32, chunk_size: u32) -> u64 {
        match *self {
            OpKind::Broadcast { len, .. } => {
                len.div_ceil(u64::from(chunk_size)) * u64::from(ranks.saturating_sub(1))
            }
        }
    }

    /// Checks the arguments against the communicator size.
    pub(crate) fn check(&self, ranks: u32) -> bool {
        match *self {
            OpKind::Broadcast { root, .. } => root < ranks,
        }
    }

    /// Starts the operation on one rank's session.
    pub(crate) fn start(&self, s: &mut Session, now: Instant) -> Result<OpId, StartError> {
        match *self {
            OpKind::Broadcast { root, len } => s.start_broadcast(now, Rank(root), len),
        }
    }
}

/// One operation of a [`Workload`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct OpSpec {
    /// Virtual time at which every rank starts it.
    pub start: Duration,
    /// What it is.
    pub kind: OpKind,
}

/// A list of operations with start times.
///
/// ```
/// # use ringcast_loopback_sim::Workload;
/// # use std::time::Duration;
/// let w = Workload::new()
///     .broadcast(Duration::ZERO, 0, 1 << 20)
///     .broadcast(Duration::from_micros(5), 3, 1 << 20);
/// assert_eq!(w.ops().len(), 2);
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Workload {
    ops: Vec<OpSpec>,
}

impl Workload {
    /// No operations.
    pub fn new() -> Self {
        Workload::default()
    }

    /// Adds an operation.
    pub fn push(mut self, start: Duration, kind: OpKind) -> Self {
        self.ops.push(OpSpec { start, kind });
        self
    }

    /// Adds a Broadcast of `len` bytes from `root` at `start`.
    pub fn broadcast(self, start: Duration, root: u32, len: u64) -> Self {
        self.push(start, OpKind::Broadcast { root, len })
    }

    /// The operations, in the order ranks start them.
    pub fn ops(&self) -> &[OpSpec] {
        &self.ops
    }

    /// Sorts by start time, keeping the given order among equal times.
    pub(crate) fn sorted(&self) -> Vec<OpSpec> {
        let mut ops = self.ops.clone();
        ops.sort_by_key(|o| o.start);
        ops
    }
}
