//! What the simulated ranks run: collective operations, each started at a virtual time.
//!
//! Every rank starts every operation at its start time, in start-time order (ties in the order
//! given), so core sequence numbers agree across ranks as MPI-style collectives require. The
//! driver is generic over [`OpKind`]: a new collective adds a variant and its buffer layout.

use ringcast_core::{Instant, Node, OpId, Rank, StartError};
use serde::Serialize;
use std::time::Duration;

/// A collective and its arguments.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
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
    /// Allgather(v): rank `r` contributes `sizes[r]` bytes (zero allowed); every rank ends
    /// with the concatenation of all blocks in rank order (block `r` at byte
    /// `sizes[..r].sum()`), as a composition of broadcasts in the core's chains.
    Allgather {
        /// Bytes per rank; as many entries as ranks.
        sizes: Vec<u64>,
    },
}

impl OpKind {
    /// Bytes of every rank's receive buffer.
    pub fn buffer_len(&self) -> u64 {
        match self {
            OpKind::Broadcast { len, .. } => *len,
            OpKind::Allgather { sizes } => sizes.iter().sum(),
        }
    }

    /// Bytes of each rank's block of the buffer (a Broadcast: only the root's is non-empty).
    pub(crate) fn block_sizes(&self, ranks: u32) -> Vec<u64> {
        match self {
            OpKind::Broadcast { root, len } => (0..ranks)
                .map(|r| if r == *root { *len } else { 0 })
                .collect(),
            OpKind::Allgather { sizes } => sizes.clone(),
        }
    }

    /// The rank whose data lands in other ranks' buffers, if there is one (for reports).
    pub fn root(&self) -> Option<u32> {
        match self {
            OpKind::Broadcast { root, .. } => Some(*root),
            OpKind::Allgather { .. } => None,
        }
    }

    /// A short name: `broadcast`, `allgather`.
    pub fn name(&self) -> &'static str {
        match self {
            OpKind::Broadcast { .. } => "broadcast",
            OpKind::Allgather { .. } => "allgather",
        }
    }

    /// Multicast chunk deliveries a lossless run makes (for progress bars).
    pub(crate) fn expected_deliveries(&self, ranks: u32, chunk_size: u32) -> u64 {
        let chunks = |len: u64| len.div_ceil(u64::from(chunk_size));
        let others = u64::from(ranks.saturating_sub(1));
        match self {
            OpKind::Broadcast { len, .. } => chunks(*len) * others,
            OpKind::Allgather { sizes } => sizes.iter().map(|s| chunks(*s)).sum::<u64>() * others,
        }
    }

    /// Checks the arguments against the communicator size.
    pub(crate) fn check(&self, ranks: u32) -> bool {
        match self {
            OpKind::Broadcast { root, .. } => *root < ranks,
            OpKind::Allgather { sizes } => sizes.len() == ranks as usize,
        }
    }

    /// Starts the operation on one rank's session.
    pub(crate) fn start(&self, s: &mut Node, now: Instant) -> Result<OpId, StartError> {
        match self {
            OpKind::Broadcast { root, len } => s.start_broadcast(now, Rank(*root), *len),
            OpKind::Allgather { sizes } => s.start_allgather(now, sizes),
        }
    }
}

/// One operation of a [`Workload`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
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

    /// Adds an Allgatherv at `start` in which rank `r` contributes `sizes[r]` bytes.
    ///
    /// ```
    /// # use ringcast_loopback_sim::Workload;
    /// # use std::time::Duration;
    /// let w = Workload::new().allgather(Duration::ZERO, &[4096, 0, 10_000]);
    /// assert_eq!(w.ops()[0].kind.buffer_len(), 14_096);
    /// ```
    pub fn allgather(self, start: Duration, sizes: &[u64]) -> Self {
        self.push(
            start,
            OpKind::Allgather {
                sizes: sizes.to_vec(),
            },
        )
    }

    /// Adds an Allgather at `start` in which each of `ranks` ranks contributes `size` bytes.
    pub fn allgather_uniform(self, start: Duration, ranks: u32, size: u64) -> Self {
        self.allgather(start, &vec![size; ranks as usize])
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
