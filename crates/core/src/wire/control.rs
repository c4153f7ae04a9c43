//! Control messages on the reliable path: barrier, ring fetch, FIN handshake, abort.
//!
//! ```text
//!  0      1        2          4          8                16
//!  +------+--------+----------+----------+----------------+------------------------+
//!  | kind | version| run count|   arg    |  op sequence   | runs: (start, len) u32 |
//!  +------+--------+----------+----------+----------------+------------------------+
//! ```
//! All integers are big-endian. `arg` is the recovery hop count for `FetchAck`, the culprit rank
//! for `Abort`, and zero otherwise. Runs are sorted, non-empty, disjoint and non-adjacent.

use super::{Error, Result};
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

/// The kind of a control message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ControlKind {
    /// Leaf to root: receives are posted (RNR barrier, first half).
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
            _ => return None,
        })
    }

    fn has_runs(self) -> bool {
        matches!(self, ControlKind::Fetch | ControlKind::FetchAck)
    }

    fn has_arg(self) -> bool {
        matches!(self, ControlKind::FetchAck | ControlKind::Abort)
    }
}

/// A run of consecutive chunk indices `[start, start + len)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChunkRun {
    /// First chunk.
    pub start: u32,
    /// Number of chunks, at least one in any valid message.
    pub len: u32,
}

impl ChunkRun {
    /// One past the last chunk (saturating).
    pub fn end(self) -> u32 {
        self.start.saturating_add(self.len)
    }
}

impl fmt::Display for ChunkRun {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}..{}", self.start, self.end())
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
    /// See [`ControlKind::Abort`].
    Abort {
        /// Operation sequence number.
        op: u64,
        /// The rank that stopped answering.
        culprit: u32,
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
            ControlKind::Ready => ControlRepr::Ready { op },
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
        })
    }

    /// Parses a byte slice.
    pub fn parse_bytes(bytes: &'a [u8]) -> Result<Self> {
        Self::parse(&ControlPacket::new_checked(bytes)?)
    }

    /// The operation sequence number the message is about.
    pub fn op(&self) -> u64 {
        match *self {
            ControlRepr::Ready { op }
            | ControlRepr::Go { op }
            | ControlRepr::Fetch { op, .. }
            | ControlRepr::FetchAck { op, .. }
            | ControlRepr::FetchNack { op }
            | ControlRepr::Fin { op }
            | ControlRepr::Activate { op }
            | ControlRepr::Abort { op, .. } => op,
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

    /// Writes the message into `buf`, which must be exactly [`Self::buffer_len`] bytes.
    ///
    /// Fails if the run list has more than `u16::MAX` runs or is not canonical.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        if buf.len() != self.buffer_len() {
            return Err(Error);
        }
        let runs = self.runs();
        let count = u16::try_from(runs.map_or(0, |r| r.len())).map_err(|_| Error)?;
        if let Some(r) = runs {
            if r.is_empty() {
                return Err(Error);
            }
            r.validate()?;
        }
        let arg = match *self {
            ControlRepr::FetchAck { hops, .. } => hops,
            ControlRepr::Abort { culprit, .. } => culprit,
            _ => 0,
        };
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
        Ok(())
    }

    /// Appends the message to `out`.
    pub fn emit_vec(&self, out: &mut alloc::vec::Vec<u8>) -> Result<()> {
        let start = out.len();
        out.resize(start + self.buffer_len(), 0);
        let r = self.emit(&mut out[start..]);
        if r.is_err() {
            out.truncate(start);
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec::Vec;

    fn round_trip(repr: ControlRepr<'_>) {
        let mut v = Vec::new();
        repr.emit_vec(&mut v).unwrap();
        let back = ControlRepr::parse_bytes(&v).unwrap();
        assert_eq!(back, repr);
        let mut again = Vec::new();
        back.emit_vec(&mut again).unwrap();
        assert_eq!(again, v);
    }

    #[test]
    fn every_kind_round_trips() {
        let runs = [ChunkRun { start: 1, len: 2 }, ChunkRun { start: 7, len: 1 }];
        round_trip(ControlRepr::Ready { op: 3 });
        round_trip(ControlRepr::Go { op: u64::MAX });
        round_trip(ControlRepr::Fetch {
            op: 9,
            runs: RunList::Slice(&runs),
        });
        round_trip(ControlRepr::FetchAck {
            op: 9,
            runs: RunList::Slice(&runs),
            hops: 3,
        });
        round_trip(ControlRepr::FetchNack { op: 9 });
        round_trip(ControlRepr::Fin { op: 0 });
        round_trip(ControlRepr::Activate { op: 4 });
        round_trip(ControlRepr::Abort { op: 1, culprit: 17 });
    }

    #[test]
    fn rejects_non_canonical() {
        let mut v = Vec::new();
        ControlRepr::Fin { op: 5 }.emit_vec(&mut v).unwrap();
        assert!(ControlRepr::parse_bytes(&v[..15]).is_err());
        let mut bad = v.clone();
        bad[4] = 1; // arg on a Fin
        assert!(ControlRepr::parse_bytes(&bad).is_err());
        let mut bad = v.clone();
        bad[1] = 2; // version
        assert!(ControlRepr::parse_bytes(&bad).is_err());
        let mut bad = v.clone();
        bad[0] = 0; // kind
        assert!(ControlRepr::parse_bytes(&bad).is_err());
        // overlapping runs
        let runs = [ChunkRun { start: 1, len: 2 }, ChunkRun { start: 2, len: 1 }];
        let mut v = Vec::new();
        assert!(
            ControlRepr::FetchAck {
                op: 1,
                runs: RunList::Slice(&runs),
                hops: 0
            }
            .emit_vec(&mut v)
            .is_err()
        );
        assert!(v.is_empty());
        // Fetch without runs
        let mut v = Vec::new();
        ControlRepr::Fin { op: 5 }.emit_vec(&mut v).unwrap();
        v[0] = ControlKind::Fetch as u8;
        assert!(ControlRepr::parse_bytes(&v).is_err());
    }
}
