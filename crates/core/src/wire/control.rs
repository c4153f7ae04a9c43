//! Control messages on the reliable path: barrier, ring fetch, FIN handshake, abort.
//!
//! ```text
//!  0      1        2          4          8                16
//!  +------+--------+----------+----------+----------------+------------------------+
//!  | kind | version| run count|   arg    |  op sequence   | runs: (start, len) u32 |
//!  +------+--------+----------+----------+----------------+------------------------+
//! ```
//! All integers are big-endian. `arg` is the recovery hop count for `FetchAck`, the culprit rank
//! for `Abort` and `Mismatch`, the operation's shape fingerprint for `Ready`, the sender's
//! [`Standing`] for `Here`, and zero otherwise. Runs are sorted, non-empty, disjoint and
//! non-adjacent.
//!
//! `Lacking` (kind 9) is a `FetchNack` with knowledge: the sender's fast path is over, so it
//! knows it misses some of the runs asked for. A `FetchNack` only says "not yet". The
//! requester answers a `Lacking` from its predecessor by probing ranks further back the ring
//! (see the ring module).

use super::{ChunkRun, EmitError, Error, Result, emit_buf};
use core::fmt;

mod field {
    use core::ops::Range;
    pub(super) const KIND: usize = 0;
    pub(super) const VERSION: usize = 1;
    pub(super) const COUNT: Range<usize> = 2..4;
    pub(super) const ARG: Range<usize> = 4..8;
    pub(super) const OP: Range<usize> = 8..16;
    pub(super) const RUNS: usize = 16;
    pub(super) const RUN_LEN: usize = 8;
}

/// Wire version written and accepted.
pub const VERSION: u8 = 1;
/// Bytes of the fixed header.
pub const HEADER_LEN: usize = field::RUNS;
/// Bytes of the longest message: the header and `u16::MAX` runs. A transport may refuse a
/// longer one from its length alone.
pub const MAX_LEN: usize = HEADER_LEN + u16::MAX as usize * field::RUN_LEN;

/// The kind of a control message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ControlKind {
    /// Leaf to root: receives are posted (RNR barrier, first half); `arg` is the sender's
    /// fingerprint of the operation's kind, root and sizes, which the hub compares with its
    /// own.
    Ready = 1,
    /// Root to leaf: every leaf is ready, multicast starts (RNR barrier, second half).
    Go = 2,
    /// Ring successor to predecessor: please vouch for these chunk runs.
    Fetch = 3,
    /// Predecessor holds every requested run: read them.
    FetchAck = 4,
    /// Predecessor misses some requested chunks and is recovering them; keep waiting.
    FetchNack = 5,
    /// Sender will not read from the receiver's buffer again for this operation.
    Fin = 6,
    /// The operation failed; `arg` names the unresponsive rank.
    Abort = 7,
    /// Allgather chain token: the sender's block is sent, the receiver's turn.
    Activate = 8,
    /// Predecessor's fast path is over and it misses some requested chunks: it is recovering
    /// them; look further back the ring meanwhile.
    Lacking = 9,
    /// The operation failed: `arg` names a rank that posted it with another kind, root or
    /// sizes than the sender did (an erroneous program). Sent to every other rank.
    Mismatch = 10,
    /// A rank whose barrier waited too long on the receiver asks where it stands on the
    /// operation (the receiver answers `Here`, whatever it is doing).
    Where = 11,
    /// Answer to `Where`: `arg` is the sender's [`Standing`] on the operation.
    Here = 12,
}

impl ControlKind {
    fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => ControlKind::Ready,
            2 => ControlKind::Go,
            3 => ControlKind::Fetch,
            4 => ControlKind::FetchAck,
            5 => ControlKind::FetchNack,
            6 => ControlKind::Fin,
            7 => ControlKind::Abort,
            8 => ControlKind::Activate,
            9 => ControlKind::Lacking,
            10 => ControlKind::Mismatch,
            11 => ControlKind::Where,
            12 => ControlKind::Here,
            _ => return None,
        })
    }

    fn has_runs(self) -> bool {
        matches!(self, ControlKind::Fetch | ControlKind::FetchAck)
    }

    fn has_arg(self) -> bool {
        matches!(
            self,
            ControlKind::Ready
                | ControlKind::FetchAck
                | ControlKind::Abort
                | ControlKind::Mismatch
                | ControlKind::Here
        )
    }
}

/// Where a rank stands on an operation another rank asked about (`Where`): the argument of
/// its `Here`.
///
/// A rank that has not posted an operation yet is alive, only late (an application that
/// loads a checkpoint before a Broadcast): the barrier keeps waiting for it, up to the
/// post timeout. One that does not answer is hung or cut off.
///
/// On the wire: the values from `0xFFFF_FFF0` up are the states without a rank (four of
/// them used, the rest reserved); below, bit 31 set is [`Standing::EndedAfter`] and clear
/// [`Standing::NotPostedAfter`], with the rank in the other 31 bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Standing {
    /// It has posted the operation and not ended it.
    Running,
    /// It ended the operation after its barrier and did not fail it (or no longer knows).
    Ended,
    /// It failed the operation, naming this rank, or failed it before starting it (a peer it
    /// needs is gone). A rank still in the operation's barrier is not waited for: the
    /// answer ends its wait.
    EndedAfter(u32),
    /// It ended the operation without a barrier: it ran it over another path, or it was empty
    /// there. The ranks disagree on the operation.
    EndedApart,
    /// It has not posted the operation yet, and the last operation it posted did not fail.
    NotPosted,
    /// It has not posted the operation yet, and the last operation it posted failed, naming
    /// this rank: its program may have stopped over that failure.
    NotPostedAfter(u32),
}

impl Standing {
    /// The wire values of the states without a rank.
    const RUNNING: u32 = u32::MAX;
    const ENDED: u32 = u32::MAX - 1;
    const ENDED_APART: u32 = u32::MAX - 2;
    const NOT_POSTED: u32 = u32::MAX - 3;
    /// Values from here up are states without a rank; a state with one is below.
    const RESERVED: u32 = u32::MAX - 15;
    /// Set in [`Standing::EndedAfter`]'s value.
    const ENDED_BIT: u32 = 1 << 31;
    /// The largest rank the wire carries: 31 bits, below the reserved range.
    pub const MAX_RANK: u32 = (1 << 31) - 1;

    pub(crate) fn from_u32(v: u32) -> Option<Self> {
        Some(match v {
            Self::RUNNING => Standing::Running,
            Self::ENDED => Standing::Ended,
            Self::ENDED_APART => Standing::EndedApart,
            Self::NOT_POSTED => Standing::NotPosted,
            v if v >= Self::RESERVED => return None,
            v if v & Self::ENDED_BIT != 0 => Standing::EndedAfter(v & !Self::ENDED_BIT),
            r => Standing::NotPostedAfter(r),
        })
    }

    /// The wire value, or `None` for a rank above [`Self::MAX_RANK`] or whose value falls in
    /// the reserved range.
    pub(crate) fn to_u32(self) -> Option<u32> {
        let ranked = |r: u32, bit: u32| {
            let v = r | bit;
            (r <= Self::MAX_RANK && v < Self::RESERVED).then_some(v)
        };
        match self {
            Standing::Running => Some(Self::RUNNING),
            Standing::Ended => Some(Self::ENDED),
            Standing::EndedApart => Some(Self::ENDED_APART),
            Standing::NotPosted => Some(Self::NOT_POSTED),
            Standing::EndedAfter(r) => ranked(r, Self::ENDED_BIT),
            Standing::NotPostedAfter(r) => ranked(r, 0),
        }
    }
}

/// A read-only view of a control message.
#[derive(Debug, Clone)]
pub struct ControlPacket<T: AsRef<[u8]>> {
    buffer: T,
}

fn be_u16(b: &[u8]) -> u16 {
    u16::from_be_bytes([b[0], b[1]])
}
fn be_u32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}
fn be_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_be_bytes(a)
}

impl<T: AsRef<[u8]>> ControlPacket<T> {
    /// Wraps a buffer without checking it; accessors may panic until [`Self::check_len`] passed.
    pub fn new_unchecked(buffer: T) -> Self {
        ControlPacket { buffer }
    }

    /// Wraps a buffer and checks that the header and the runs it announces fit exactly.
    pub fn new_checked(buffer: T) -> Result<Self> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Checks the length: a full header, and exactly `run count` runs after it.
    pub fn check_len(&self) -> Result<()> {
        let b = self.buffer.as_ref();
        if b.len() < HEADER_LEN {
            return Err(Error);
        }
        let want = HEADER_LEN + usize::from(self.run_count()) * field::RUN_LEN;
        if b.len() != want { Err(Error) } else { Ok(()) }
    }

    /// Raw kind byte.
    pub fn kind_raw(&self) -> u8 {
        self.buffer.as_ref()[field::KIND]
    }
    /// Version byte.
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[field::VERSION]
    }
    /// Number of runs that follow the header.
    pub fn run_count(&self) -> u16 {
        be_u16(&self.buffer.as_ref()[field::COUNT])
    }
    /// Kind-specific argument.
    pub fn arg(&self) -> u32 {
        be_u32(&self.buffer.as_ref()[field::ARG])
    }
    /// Operation sequence number.
    pub fn op(&self) -> u64 {
        be_u64(&self.buffer.as_ref()[field::OP])
    }
    /// The run bytes.
    pub fn runs_bytes(&self) -> &[u8] {
        &self.buffer.as_ref()[field::RUNS..]
    }
}

/// Setters, for building a message in place.
impl<T: AsRef<[u8]> + AsMut<[u8]>> ControlPacket<T> {
    fn header_mut(&mut self, kind: ControlKind, count: u16, arg: u32, op: u64) {
        let b = self.buffer.as_mut();
        b[field::KIND] = kind as u8;
        b[field::VERSION] = VERSION;
        b[field::COUNT].copy_from_slice(&count.to_be_bytes());
        b[field::ARG].copy_from_slice(&arg.to_be_bytes());
        b[field::OP].copy_from_slice(&op.to_be_bytes());
    }
}

/// A list of chunk runs: either borrowed from a received message or from the sender's slice.
#[derive(Clone, Copy)]
pub enum RunList<'a> {
    /// Validated wire bytes (8 bytes a run).
    Wire(&'a [u8]),
    /// Runs to send.
    Slice(&'a [ChunkRun]),
}

impl<'a> RunList<'a> {
    /// Number of runs.
    pub fn len(&self) -> usize {
        match self {
            RunList::Wire(b) => b.len() / field::RUN_LEN,
            RunList::Slice(s) => s.len(),
        }
    }

    /// True when there are no runs.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Iterates the runs in order.
    pub fn iter(&self) -> impl Iterator<Item = ChunkRun> + 'a {
        let (wire, slice): (&'a [u8], &'a [ChunkRun]) = match *self {
            RunList::Wire(b) => (b, &[]),
            RunList::Slice(s) => (&[], s),
        };
        wire.chunks_exact(field::RUN_LEN)
            .map(|c| ChunkRun {
                start: be_u32(&c[..4]),
                len: be_u32(&c[4..]),
            })
            .chain(slice.iter().copied())
    }

    /// Total number of chunks in all runs.
    pub fn chunks(&self) -> u64 {
        self.iter().map(|r| u64::from(r.len)).sum()
    }

    /// Checks that the runs are non-empty, sorted, disjoint, non-adjacent and do not overflow.
    pub fn validate(&self) -> Result<()> {
        let mut prev_end: Option<u32> = None;
        for r in self.iter() {
            let end = r.start.checked_add(r.len).ok_or(Error)?;
            if r.len == 0 || prev_end.is_some_and(|p| r.start <= p) {
                return Err(Error);
            }
            prev_end = Some(end);
        }
        Ok(())
    }
}

impl fmt::Debug for RunList<'_> {
    /// Lists the runs (`[3..4, 7..9]`) whichever way they are stored.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, r) in self.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{r}")?;
        }
        f.write_str("]")
    }
}

impl PartialEq for RunList<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}
impl Eq for RunList<'_> {}

/// The validated meaning of a control message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ControlRepr<'a> {
    /// See [`ControlKind::Ready`].
    Ready {
        /// Operation sequence number.
        op: u64,
        /// The sender's fingerprint of the operation's shape.
        shape: u32,
    },
    /// See [`ControlKind::Go`].
    Go {
        /// Operation sequence number.
        op: u64,
    },
    /// See [`ControlKind::Fetch`].
    Fetch {
        /// Operation sequence number.
        op: u64,
        /// Runs asked for.
        runs: RunList<'a>,
    },
    /// See [`ControlKind::FetchAck`].
    FetchAck {
        /// Operation sequence number.
        op: u64,
        /// Runs the sender vouches for (the runs requested).
        runs: RunList<'a>,
        /// Longest chain of ring reads behind the sender's data (0: it had everything from
        /// the fast path or is the root). An upper bound for the runs acknowledged.
        hops: u32,
    },
    /// See [`ControlKind::FetchNack`].
    FetchNack {
        /// Operation sequence number.
        op: u64,
    },
    /// See [`ControlKind::Fin`].
    Fin {
        /// Operation sequence number.
        op: u64,
    },
    /// See [`ControlKind::Activate`].
    Activate {
        /// Operation sequence number.
        op: u64,
    },
    /// See [`ControlKind::Lacking`].
    Lacking {
        /// Operation sequence number.
        op: u64,
    },
    /// See [`ControlKind::Abort`].
    Abort {
        /// Operation sequence number.
        op: u64,
        /// The rank that stopped answering.
        culprit: u32,
    },
    /// See [`ControlKind::Mismatch`].
    Mismatch {
        /// Operation sequence number.
        op: u64,
        /// The rank whose shape differs from the sender's.
        culprit: u32,
    },
    /// See [`ControlKind::Where`].
    Where {
        /// Operation sequence number.
        op: u64,
    },
    /// See [`ControlKind::Here`].
    Here {
        /// Operation sequence number.
        op: u64,
        /// Where the sender stands on it.
        standing: Standing,
    },
}

impl<'a> ControlRepr<'a> {
    /// Parses and validates a message. Anything not in canonical form is an error.
    pub fn parse(packet: &ControlPacket<&'a [u8]>) -> Result<Self> {
        packet.check_len()?;
        let bytes: &'a [u8] = packet.buffer;
        if packet.version() != VERSION {
            return Err(Error);
        }
        let kind = ControlKind::from_u8(packet.kind_raw()).ok_or(Error)?;
        let (count, arg, op) = (packet.run_count(), packet.arg(), packet.op());
        if kind.has_runs() != (count > 0) || (!kind.has_arg() && arg != 0) {
            return Err(Error);
        }
        let runs = RunList::Wire(&bytes[field::RUNS..]);
        runs.validate()?;
        Ok(match kind {
            ControlKind::Ready => ControlRepr::Ready { op, shape: arg },
            ControlKind::Go => ControlRepr::Go { op },
            ControlKind::Fetch => ControlRepr::Fetch { op, runs },
            ControlKind::FetchAck => ControlRepr::FetchAck {
                op,
                runs,
                hops: arg,
            },
            ControlKind::FetchNack => ControlRepr::FetchNack { op },
            ControlKind::Fin => ControlRepr::Fin { op },
            ControlKind::Abort => ControlRepr::Abort { op, culprit: arg },
            ControlKind::Activate => ControlRepr::Activate { op },
            ControlKind::Lacking => ControlRepr::Lacking { op },
            ControlKind::Mismatch => ControlRepr::Mismatch { op, culprit: arg },
            ControlKind::Where => ControlRepr::Where { op },
            ControlKind::Here => ControlRepr::Here {
                op,
                standing: Standing::from_u32(arg).ok_or(Error)?,
            },
        })
    }

    /// Parses a byte slice.
    pub fn parse_bytes(bytes: &'a [u8]) -> Result<Self> {
        Self::parse(&ControlPacket::new_checked(bytes)?)
    }

    /// The operation sequence number the message is about.
    pub fn op(&self) -> u64 {
        match *self {
            ControlRepr::Ready { op, .. }
            | ControlRepr::Go { op }
            | ControlRepr::Fetch { op, .. }
            | ControlRepr::FetchAck { op, .. }
            | ControlRepr::FetchNack { op }
            | ControlRepr::Fin { op }
            | ControlRepr::Activate { op }
            | ControlRepr::Lacking { op }
            | ControlRepr::Abort { op, .. }
            | ControlRepr::Mismatch { op, .. }
            | ControlRepr::Where { op }
            | ControlRepr::Here { op, .. } => op,
        }
    }

    /// The message kind.
    pub fn kind(&self) -> ControlKind {
        match self {
            ControlRepr::Ready { .. } => ControlKind::Ready,
            ControlRepr::Go { .. } => ControlKind::Go,
            ControlRepr::Fetch { .. } => ControlKind::Fetch,
            ControlRepr::FetchAck { .. } => ControlKind::FetchAck,
            ControlRepr::FetchNack { .. } => ControlKind::FetchNack,
            ControlRepr::Fin { .. } => ControlKind::Fin,
            ControlRepr::Abort { .. } => ControlKind::Abort,
            ControlRepr::Activate { .. } => ControlKind::Activate,
            ControlRepr::Lacking { .. } => ControlKind::Lacking,
            ControlRepr::Mismatch { .. } => ControlKind::Mismatch,
            ControlRepr::Where { .. } => ControlKind::Where,
            ControlRepr::Here { .. } => ControlKind::Here,
        }
    }

    fn runs(&self) -> Option<RunList<'a>> {
        match *self {
            ControlRepr::Fetch { runs, .. } | ControlRepr::FetchAck { runs, .. } => Some(runs),
            _ => None,
        }
    }

    /// Bytes [`Self::emit`] writes.
    pub fn buffer_len(&self) -> usize {
        HEADER_LEN + self.runs().map_or(0, |r| r.len()) * field::RUN_LEN
    }

    /// Writes the message into the first [`Self::buffer_len`] bytes of `buf` and returns that
    /// length; bytes after it are left alone.
    ///
    /// Fails with [`EmitError::NotCanonical`] if the run list is empty where runs are required,
    /// has more than `u16::MAX` runs, or is not sorted, disjoint and non-adjacent, or a
    /// [`Standing`] names a rank the wire cannot carry; otherwise
    /// with [`EmitError::BufferTooSmall`] if `buf` is shorter than the message.
    pub fn emit(&self, buf: &mut [u8]) -> core::result::Result<usize, EmitError> {
        // Canonical form first: a bigger buffer would not help.
        let runs = self.runs();
        let count =
            u16::try_from(runs.map_or(0, |r| r.len())).map_err(|_| EmitError::NotCanonical)?;
        if let Some(r) = runs
            && (r.is_empty() || r.validate().is_err())
        {
            return Err(EmitError::NotCanonical);
        }
        let arg = match *self {
            ControlRepr::FetchAck { hops, .. } => hops,
            ControlRepr::Abort { culprit, .. } | ControlRepr::Mismatch { culprit, .. } => culprit,
            ControlRepr::Ready { shape, .. } => shape,
            ControlRepr::Here { standing, .. } => {
                standing.to_u32().ok_or(EmitError::NotCanonical)?
            }
            _ => 0,
        };
        let len = self.buffer_len();
        let buf = emit_buf(buf, len)?;
        ControlPacket::new_unchecked(&mut *buf).header_mut(self.kind(), count, arg, self.op());
        if let Some(r) = runs {
            for (dst, run) in buf[field::RUNS..]
                .chunks_exact_mut(field::RUN_LEN)
                .zip(r.iter())
            {
                dst[..4].copy_from_slice(&run.start.to_be_bytes());
                dst[4..].copy_from_slice(&run.len.to_be_bytes());
            }
        }
        Ok(len)
    }

    /// Appends the message to `out`; on error `out` is left as it was.
    pub fn emit_vec(&self, out: &mut alloc::vec::Vec<u8>) -> core::result::Result<(), EmitError> {
        let start = out.len();
        out.resize(start + self.buffer_len(), 0);
        let r = self.emit(&mut out[start..]);
        if r.is_err() {
            out.truncate(start);
        }
        r.map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec::Vec;

    // Fixed vectors (smoltcp style): parse and emit are each checked against bytes written by
    // hand, so a bug made symmetrically in both (a swapped field, the wrong endianness) shows.
    // Operation numbers use distinct bytes so a misplaced or byte-swapped field cannot match.

    const READY: [u8; 16] = [
        0x01, 0x01, 0x00, 0x00, // kind Ready, version 1, no runs
        0xa1, 0xb2, 0xc3, 0xd4, // shape
        0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, // op
    ];
    const GO: [u8; 16] = [
        0x02, 0x01, 0x00, 0x00, //
        0x00, 0x00, 0x00, 0x00, //
        0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
    ];
    const FETCH: [u8; 32] = [
        0x03, 0x01, 0x00, 0x02, // kind Fetch, two runs
        0x00, 0x00, 0x00, 0x00, //
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x09, //
        0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x02, // 1..3
        0x00, 0x01, 0x00, 0x07, 0x00, 0x00, 0x01, 0x00, // 65543..65799
    ];
    const FETCH_ACK: [u8; 24] = [
        0x04, 0x01, 0x00, 0x01, // kind FetchAck, one run
        0x00, 0x00, 0x01, 0x03, // hops 259
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x0a, //
        0xfe, 0xdc, 0xba, 0x98, 0x00, 0x00, 0x00, 0x04, // 0xfedcba98..+4
    ];
    const FETCH_NACK: [u8; 16] = [
        0x05, 0x01, 0x00, 0x00, //
        0x00, 0x00, 0x00, 0x00, //
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x0b,
    ];
    const FIN: [u8; 16] = [
        0x06, 0x01, 0x00, 0x00, //
        0x00, 0x00, 0x00, 0x00, //
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    ];
    const ABORT: [u8; 16] = [
        0x07, 0x01, 0x00, 0x00, //
        0x00, 0x00, 0x00, 0x11, // culprit 17
        0x80, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01,
    ];
    const ACTIVATE: [u8; 16] = [
        0x08, 0x01, 0x00, 0x00, //
        0x00, 0x00, 0x00, 0x00, //
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04,
    ];

    const LACKING: [u8; 16] = [
        0x09, 0x01, 0x00, 0x00, // kind Lacking, version 1, no runs
        0x00, 0x00, 0x00, 0x00, //
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x0c, // op 268
    ];
    const MISMATCH: [u8; 16] = [
        0x0a, 0x01, 0x00, 0x00, // kind Mismatch, version 1, no runs
        0x00, 0x00, 0x02, 0x05, // culprit 517
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x03, 0x0d, // op 781
    ];

    const WHERE: [u8; 16] = [
        0x0b, 0x01, 0x00, 0x00, // kind Where, version 1, no runs
        0x00, 0x00, 0x00, 0x00, //
        0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x02, 0x03, // op 66051
    ];
    const HERE_RUNNING: [u8; 16] = [
        0x0c, 0x01, 0x00, 0x00, // kind Here, version 1, no runs
        0xff, 0xff, 0xff, 0xff, // running
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x07, // op 7
    ];
    const HERE_ENDED: [u8; 16] = [
        0x0c, 0x01, 0x00, 0x00, //
        0xff, 0xff, 0xff, 0xfe, // ended
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x08,
    ];
    const HERE_APART: [u8; 16] = [
        0x0c, 0x01, 0x00, 0x00, //
        0xff, 0xff, 0xff, 0xfd, // ended apart
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x09,
    ];
    const HERE_NOT_POSTED: [u8; 16] = [
        0x0c, 0x01, 0x00, 0x00, //
        0xff, 0xff, 0xff, 0xfc, // not posted
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x0a,
    ];
    const HERE_ENDED_AFTER: [u8; 16] = [
        0x0c, 0x01, 0x00, 0x00, //
        0x80, 0x00, 0x00, 0x2a, // failed it naming rank 42
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x0c,
    ];
    const HERE_AFTER: [u8; 16] = [
        0x0c, 0x01, 0x00, 0x00, //
        0x00, 0x00, 0x01, 0x2c, // not posted, after a failure naming rank 300
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x0b,
    ];

    const FETCH_RUNS: [ChunkRun; 2] = [
        ChunkRun { start: 1, len: 2 },
        ChunkRun {
            start: 65543,
            len: 256,
        },
    ];
    const ACK_RUNS: [ChunkRun; 1] = [ChunkRun {
        start: 0xfedc_ba98,
        len: 4,
    }];

    /// Every kind once, with the bytes it must have.
    fn vectors() -> [(&'static [u8], ControlRepr<'static>); 17] {
        [
            (
                &READY,
                ControlRepr::Ready {
                    op: 0x0102_0304_0506_0708,
                    shape: 0xa1b2_c3d4,
                },
            ),
            (&GO, ControlRepr::Go { op: u64::MAX }),
            (
                &FETCH,
                ControlRepr::Fetch {
                    op: 9,
                    runs: RunList::Slice(&FETCH_RUNS),
                },
            ),
            (
                &FETCH_ACK,
                ControlRepr::FetchAck {
                    op: 10,
                    runs: RunList::Slice(&ACK_RUNS),
                    hops: 259,
                },
            ),
            (&FETCH_NACK, ControlRepr::FetchNack { op: 11 }),
            (&FIN, ControlRepr::Fin { op: 0 }),
            (
                &ABORT,
                ControlRepr::Abort {
                    op: 0x8000_0000_0000_0001,
                    culprit: 17,
                },
            ),
            (&ACTIVATE, ControlRepr::Activate { op: 4 }),
            (&LACKING, ControlRepr::Lacking { op: 268 }),
            (
                &MISMATCH,
                ControlRepr::Mismatch {
                    op: 781,
                    culprit: 517,
                },
            ),
            (&WHERE, ControlRepr::Where { op: 66051 }),
            (
                &HERE_RUNNING,
                ControlRepr::Here {
                    op: 7,
                    standing: Standing::Running,
                },
            ),
            (
                &HERE_ENDED,
                ControlRepr::Here {
                    op: 8,
                    standing: Standing::Ended,
                },
            ),
            (
                &HERE_APART,
                ControlRepr::Here {
                    op: 9,
                    standing: Standing::EndedApart,
                },
            ),
            (
                &HERE_NOT_POSTED,
                ControlRepr::Here {
                    op: 10,
                    standing: Standing::NotPosted,
                },
            ),
            (
                &HERE_AFTER,
                ControlRepr::Here {
                    op: 11,
                    standing: Standing::NotPostedAfter(300),
                },
            ),
            (
                &HERE_ENDED_AFTER,
                ControlRepr::Here {
                    op: 12,
                    standing: Standing::EndedAfter(42),
                },
            ),
        ]
    }

    #[test]
    fn every_kind_parses_from_fixed_bytes() {
        for (bytes, want) in vectors() {
            let got = ControlRepr::parse_bytes(bytes).unwrap();
            assert_eq!(got, want, "{bytes:02x?}");
            assert_eq!(got.kind(), want.kind());
            assert_eq!(got.buffer_len(), bytes.len());
            // The header accessors agree with the bytes too.
            let p = ControlPacket::new_checked(bytes).unwrap();
            assert_eq!(p.kind_raw(), want.kind() as u8);
            assert_eq!(p.version(), VERSION);
            assert_eq!(p.op(), want.op());
        }
    }

    #[test]
    fn every_kind_emits_fixed_bytes() {
        for (bytes, repr) in vectors() {
            assert_eq!(repr.buffer_len(), bytes.len());
            let mut v = Vec::new();
            repr.emit_vec(&mut v).unwrap();
            assert_eq!(v, bytes, "{repr:?}");
            // Into a larger buffer: only the message's bytes are written.
            let mut big = [0xaau8; 40];
            assert_eq!(repr.emit(&mut big), Ok(bytes.len()));
            assert_eq!(&big[..bytes.len()], bytes);
            assert!(big[bytes.len()..].iter().all(|&b| b == 0xaa));
        }
    }

    #[test]
    fn every_kind_is_covered() {
        let mut kinds: Vec<u8> = vectors().iter().map(|(_, r)| r.kind() as u8).collect();
        kinds.dedup();
        assert_eq!(kinds, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]);
        for k in 0..=u8::MAX {
            assert_eq!(ControlKind::from_u8(k).is_some(), (1..=12).contains(&k));
        }
    }

    #[test]
    fn short_buffer_reports_the_size_needed() {
        for (bytes, repr) in vectors() {
            let mut buf = [0u8; 40];
            for short in [0, HEADER_LEN - 1, bytes.len() - 1] {
                assert_eq!(
                    repr.emit(&mut buf[..short]),
                    Err(EmitError::BufferTooSmall {
                        required: bytes.len()
                    })
                );
            }
            assert!(buf.iter().all(|&b| b == 0), "a failed emit wrote bytes");
        }
    }

    // Negative vectors: each is a valid message with one thing wrong.

    /// Fin with version 2.
    const BAD_VERSION: [u8; 16] = [
        0x06, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, //
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x05,
    ];
    /// Kind 0 and kind 13 do not exist.
    const BAD_KIND_0: [u8; 16] = [
        0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, //
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x05,
    ];
    const BAD_KIND_13: [u8; 16] = [
        0x0d, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, //
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x05,
    ];
    /// Where with an argument.
    const ARG_ON_WHERE: [u8; 16] = [
        0x0b, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, //
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x05,
    ];
    /// Here with a standing in the reserved range.
    const HERE_RESERVED: [u8; 16] = [
        0x0c, 0x01, 0x00, 0x00, 0xff, 0xff, 0xff, 0xf0, //
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x05,
    ];
    /// Lacking with an argument.
    const ARG_ON_LACKING: [u8; 16] = [
        0x09, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, //
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x05,
    ];
    /// Lacking carrying a run.
    const RUNS_ON_LACKING: [u8; 24] = [
        0x09, 0x01, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, //
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x05, //
        0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01,
    ];
    /// Fin with an argument.
    const ARG_ON_FIN: [u8; 16] = [
        0x06, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, //
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x05,
    ];
    /// Fetch with an argument (only FetchAck and Abort have one).
    const ARG_ON_FETCH: [u8; 24] = [
        0x03, 0x01, 0x00, 0x01, 0x01, 0x00, 0x00, 0x00, //
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x05, //
        0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01,
    ];
    /// Go carrying a run.
    const RUNS_ON_GO: [u8; 24] = [
        0x02, 0x01, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, //
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x05, //
        0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01,
    ];
    /// Abort (has an argument, no runs) carrying a run.
    const RUNS_ON_ABORT: [u8; 24] = [
        0x07, 0x01, 0x00, 0x01, 0x00, 0x00, 0x00, 0x02, //
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x05, //
        0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01,
    ];
    /// Fetch without runs.
    const FETCH_NO_RUNS: [u8; 16] = [
        0x03, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, //
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x05,
    ];
    /// FetchAck without runs.
    const FETCH_ACK_NO_RUNS: [u8; 16] = [
        0x04, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x03, //
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x05,
    ];
    /// Runs 5..7 then 1..2.
    const UNSORTED: [u8; 32] = [
        0x03, 0x01, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, //
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x05, //
        0x00, 0x00, 0x00, 0x05, 0x00, 0x00, 0x00, 0x02, //
        0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01,
    ];
    /// Runs 1..3 then 2..3.
    const OVERLAPPING: [u8; 32] = [
        0x03, 0x01, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, //
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x05, //
        0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x02, //
        0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x01,
    ];
    /// Runs 1..3 then 3..4: should have been one run.
    const ADJACENT: [u8; 32] = [
        0x03, 0x01, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, //
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x05, //
        0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x02, //
        0x00, 0x00, 0x00, 0x03, 0x00, 0x00, 0x00, 0x01,
    ];
    /// The same run twice.
    const DUPLICATE: [u8; 32] = [
        0x03, 0x01, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, //
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x05, //
        0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x02, //
        0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x02,
    ];
    /// A run of zero chunks.
    const EMPTY_RUN: [u8; 24] = [
        0x03, 0x01, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, //
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x05, //
        0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00,
    ];
    /// start + len overflows u32.
    const OVERFLOW: [u8; 24] = [
        0x04, 0x01, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, //
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x05, //
        0xff, 0xff, 0xff, 0xff, 0x00, 0x00, 0x00, 0x01,
    ];
    /// Announces two runs, carries one.
    const COUNT_TOO_BIG: [u8; 24] = [
        0x03, 0x01, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, //
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x05, //
        0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01,
    ];
    /// Announces one run, carries one and a half.
    const TRAILING: [u8; 28] = [
        0x03, 0x01, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, //
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x05, //
        0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, //
        0x00, 0x00, 0x00, 0x00,
    ];

    #[test]
    fn rejects_fixed_negative_vectors() {
        let cases: [(&str, &[u8]); 21] = [
            ("arg on Lacking", &ARG_ON_LACKING),
            ("runs on Lacking", &RUNS_ON_LACKING),
            ("bad version", &BAD_VERSION),
            ("kind 0", &BAD_KIND_0),
            ("kind 13", &BAD_KIND_13),
            ("arg on Where", &ARG_ON_WHERE),
            ("reserved standing", &HERE_RESERVED),
            ("arg on Fin", &ARG_ON_FIN),
            ("arg on Fetch", &ARG_ON_FETCH),
            ("runs on Go", &RUNS_ON_GO),
            ("runs on Abort", &RUNS_ON_ABORT),
            ("Fetch without runs", &FETCH_NO_RUNS),
            ("FetchAck without runs", &FETCH_ACK_NO_RUNS),
            ("unsorted runs", &UNSORTED),
            ("overlapping runs", &OVERLAPPING),
            ("adjacent runs", &ADJACENT),
            ("duplicate runs", &DUPLICATE),
            ("empty run", &EMPTY_RUN),
            ("start + len overflows", &OVERFLOW),
            ("count beyond the bytes", &COUNT_TOO_BIG),
            ("bytes beyond the count", &TRAILING),
        ];
        for (why, bytes) in cases {
            assert_eq!(ControlRepr::parse_bytes(bytes), Err(Error), "{why}");
        }
    }

    #[test]
    fn rejects_wrong_lengths() {
        for (bytes, _) in vectors() {
            for cut in 0..bytes.len() {
                assert_eq!(ControlRepr::parse_bytes(&bytes[..cut]), Err(Error));
            }
            let mut long = bytes.to_vec();
            long.push(0);
            assert_eq!(ControlRepr::parse_bytes(&long), Err(Error));
        }
    }

    #[test]
    fn refuses_to_emit_a_standing_the_wire_cannot_carry() {
        for standing in [
            Standing::NotPostedAfter(1 << 31),
            Standing::NotPostedAfter(u32::MAX),
            Standing::EndedAfter(1 << 31),
            Standing::EndedAfter(Standing::MAX_RANK),
        ] {
            let repr = ControlRepr::Here { op: 1, standing };
            let mut v = Vec::new();
            assert_eq!(
                repr.emit_vec(&mut v),
                Err(EmitError::NotCanonical),
                "{standing:?}"
            );
            assert!(v.is_empty());
        }
        // The reserved values are refused on parsing.
        for v in u32::MAX - 15..=u32::MAX - 4 {
            assert_eq!(Standing::from_u32(v), None, "{v:#x}");
        }
        // The largest ranks that fit, both ways.
        for (standing, v) in [
            (Standing::NotPostedAfter(Standing::MAX_RANK), 0x7fff_ffff),
            (Standing::EndedAfter((1 << 31) - 17), 0xffff_ffef),
            (Standing::EndedAfter(0), 0x8000_0000),
        ] {
            assert_eq!(standing.to_u32(), Some(v), "{standing:?}");
            assert_eq!(Standing::from_u32(v), Some(standing), "{v:#x}");
        }
    }

    #[test]
    fn refuses_to_emit_non_canonical_runs() {
        let r = |start, len| ChunkRun { start, len };
        let bad: [&[ChunkRun]; 6] = [
            &[],
            &[r(5, 2), r(1, 1)],
            &[r(1, 2), r(2, 1)],
            &[r(1, 2), r(3, 1)],
            &[r(1, 0)],
            &[r(u32::MAX, 1)],
        ];
        for runs in bad {
            for repr in [
                ControlRepr::Fetch {
                    op: 1,
                    runs: RunList::Slice(runs),
                },
                ControlRepr::FetchAck {
                    op: 1,
                    runs: RunList::Slice(runs),
                    hops: 0,
                },
            ] {
                let mut v = alloc::vec![7u8];
                assert_eq!(
                    repr.emit_vec(&mut v),
                    Err(EmitError::NotCanonical),
                    "{runs:?}"
                );
                assert_eq!(v, [7], "a failed emit_vec must leave the vector as it was");
            }
        }
        // More runs than the 16-bit count can announce.
        let many: Vec<ChunkRun> = (0..=u32::from(u16::MAX)).map(|i| r(2 * i, 1)).collect();
        let repr = ControlRepr::Fetch {
            op: 1,
            runs: RunList::Slice(&many),
        };
        let mut buf = alloc::vec![0u8; repr.buffer_len()];
        assert_eq!(repr.emit(&mut buf), Err(EmitError::NotCanonical));
        // As many as it can announce: the longest message there is.
        let repr = ControlRepr::Fetch {
            op: 1,
            runs: RunList::Slice(&many[..usize::from(u16::MAX)]),
        };
        let mut v = Vec::new();
        assert_eq!(repr.emit_vec(&mut v), Ok(()));
        assert_eq!(v.len(), MAX_LEN);
        assert_eq!(ControlRepr::parse_bytes(&v), Ok(repr));
    }

    #[test]
    fn wire_runs_iterate_like_slices() {
        let p = ControlRepr::parse_bytes(&FETCH).unwrap();
        let ControlRepr::Fetch { runs, .. } = p else {
            panic!("{p:?}")
        };
        assert!(matches!(runs, RunList::Wire(_)));
        assert_eq!(runs, RunList::Slice(&FETCH_RUNS));
        assert_eq!(runs.chunks(), 258);
        assert_eq!(alloc::format!("{runs:?}"), "[1..3, 65543..65799]");
    }
}
