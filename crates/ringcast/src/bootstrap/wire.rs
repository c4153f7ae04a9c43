//! The rendezvous messages, big-endian on TCP.
//!
//! ```text
//! Hello (rank -> rank 0):  "RCBS" version:u16 rank:u32 world:u32 local_rank:u32 job_key:u64
//!                          len:u32 control[len]
//! Reply (rank 0 -> rank):  "RCBS" version:u16 status:u8, then
//!   status 0 (table):      nonce:u64 world:u32, world x (local_rank:u32 len:u32 control[len])
//!   status 1 (refusal):    len:u32 utf8[len]
//! ```
//! `local_rank` `0xFFFF_FFFF` means unknown.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::Instant;

/// First bytes of every message.
pub(super) const MAGIC: [u8; 4] = *b"RCBS";
/// Protocol version. 2: a control entry carries the rank's cores and its host's boot id after
/// its addresses (`addr cpus=N host=ID`, for the lane count), which version 1 could not parse.
pub(super) const VERSION: u16 = 2;
/// Largest control blob a rank may send (it holds a few socket addresses).
pub const MAX_CONTROL_LEN: usize = 4096;
/// Longest hello: the fixed fields (30 bytes) and the longest control blob.
pub(super) const MAX_HELLO_LEN: usize = 30 + MAX_CONTROL_LEN;
/// Largest refusal text.
const MAX_TEXT_LEN: usize = 4096;
const NO_LOCAL_RANK: u32 = u32::MAX;
const STATUS_TABLE: u8 = 0;
const STATUS_REFUSED: u8 = 1;

/// A rank's introduction to rank 0.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Hello {
    pub(super) version: u16,
    pub(super) rank: u32,
    pub(super) world_size: u32,
    pub(super) local_rank: Option<u32>,
    pub(super) job_key: u64,
    pub(super) control: Vec<u8>,
}

/// Rank 0's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Reply {
    /// Everyone's entries, in rank order, and the job nonce.
    Table {
        nonce: u64,
        entries: Vec<(Option<u32>, Vec<u8>)>,
    },
    /// This rank, or the whole job, was refused; the text says why.
    Refused(String),
}

/// A message that is not ours or breaks the format.
#[derive(Debug, thiserror::Error)]
pub(super) enum WireError {
    #[error("not a ringcast rendezvous message (magic {0:02x?})")]
    Magic([u8; 4]),
    #[error("protocol version {0}, this build speaks {VERSION}")]
    Version(u16),
    #[error("{what} of {len} bytes is over the limit of {max}")]
    TooLong {
        what: &'static str,
        len: usize,
        max: usize,
    },
    #[error("a table of {got} ranks for a job of {want}")]
    TableSize { got: u32, want: u32 },
    #[error("unknown reply status {0}")]
    Status(u8),
    #[error("the refusal text is not UTF-8")]
    Text,
    #[error(transparent)]
    Io(#[from] io::Error),
}

fn local(l: Option<u32>) -> u32 {
    l.unwrap_or(NO_LOCAL_RANK)
}

fn unlocal(l: u32) -> Option<u32> {
    (l != NO_LOCAL_RANK).then_some(l)
}

/// Writes `bytes` after their length (callers keep them under the limits above).
fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    let len = u32::try_from(bytes.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(bytes);
}

impl Hello {
    pub(super) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(30 + self.control.len());
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&self.version.to_be_bytes());
        out.extend_from_slice(&self.rank.to_be_bytes());
        out.extend_from_slice(&self.world_size.to_be_bytes());
        out.extend_from_slice(&local(self.local_rank).to_be_bytes());
        out.extend_from_slice(&self.job_key.to_be_bytes());
        put_bytes(&mut out, &self.control);
        out
    }

    /// Reads one hello. A different version is returned (not refused here) so that rank 0 can
    /// tell the sender why it is refused; a different magic is an error.
    pub(super) fn read(r: &mut impl Read) -> Result<Self, WireError> {
        let version = header(r)?;
        if version != VERSION {
            return Err(WireError::Version(version));
        }
        Ok(Hello {
            version,
            rank: u32_be(r)?,
            world_size: u32_be(r)?,
            local_rank: unlocal(u32_be(r)?),
            job_key: u64_be(r)?,
            control: bytes(r, "control address", MAX_CONTROL_LEN)?,
        })
    }

    /// The rank and job key of a hello of this version whose fixed fields have come, from
    /// its first bytes (the control address may still be on its way); `None` before that.
    pub(super) fn rank_and_key(partial: &[u8]) -> Option<(u32, u64)> {
        let mut r = partial;
        if header(&mut r).ok()? != VERSION {
            return None;
        }
        let rank = u32_be(&mut r).ok()?;
        let _world = u32_be(&mut r).ok()?;
        let _local = u32_be(&mut r).ok()?;
        Some((rank, u64_be(&mut r).ok()?))
    }
}

impl Reply {
    pub(super) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&VERSION.to_be_bytes());
        match self {
            Reply::Table { nonce, entries } => {
                out.push(STATUS_TABLE);
                out.extend_from_slice(&nonce.to_be_bytes());
                let n = u32::try_from(entries.len()).unwrap_or(u32::MAX);
                out.extend_from_slice(&n.to_be_bytes());
                for (l, control) in entries {
                    out.extend_from_slice(&local(*l).to_be_bytes());
                    put_bytes(&mut out, control);
                }
            }
            Reply::Refused(text) => {
                out.push(STATUS_REFUSED);
                let cut = floor_char_boundary(text, MAX_TEXT_LEN);
                put_bytes(&mut out, &text.as_bytes()[..cut]);
            }
        }
        out
    }

    /// Reads one reply for a job of `world_size` ranks (a table of another size is refused).
    pub(super) fn read(r: &mut impl Read, world_size: u32) -> Result<Self, WireError> {
        let version = header(r)?;
        let mut status = [0u8];
        r.read_exact(&mut status)?;
        if status[0] == STATUS_REFUSED {
            // A refusal is readable whatever the version, so that version skew reads clearly.
            let text = bytes(r, "refusal", MAX_TEXT_LEN)?;
            return String::from_utf8(text)
                .map(Reply::Refused)
                .map_err(|_| WireError::Text);
        }
        if version != VERSION {
            return Err(WireError::Version(version));
        }
        if status[0] != STATUS_TABLE {
            return Err(WireError::Status(status[0]));
        }
        let nonce = u64_be(r)?;
        let n = u32_be(r)?;
        if n != world_size {
            return Err(WireError::TableSize {
                got: n,
                want: world_size,
            });
        }
        let mut entries = Vec::new();
        for _ in 0..n {
            let l = unlocal(u32_be(r)?);
            entries.push((l, bytes(r, "control address", MAX_CONTROL_LEN)?));
        }
        Ok(Reply::Table { nonce, entries })
    }
}

fn floor_char_boundary(s: &str, max: usize) -> usize {
    (0..=max.min(s.len()))
        .rev()
        .find(|i| s.is_char_boundary(*i))
        .unwrap_or(0)
}

fn header(r: &mut impl Read) -> Result<u16, WireError> {
    let mut magic = [0u8; 4];
    r.read_exact(&mut magic)?;
    if magic != MAGIC {
        return Err(WireError::Magic(magic));
    }
    let mut v = [0u8; 2];
    r.read_exact(&mut v)?;
    Ok(u16::from_be_bytes(v))
}

fn u32_be(r: &mut impl Read) -> io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_be_bytes(b))
}

fn u64_be(r: &mut impl Read) -> io::Result<u64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_be_bytes(b))
}

fn bytes(r: &mut impl Read, what: &'static str, max: usize) -> Result<Vec<u8>, WireError> {
    let len = u32_be(r)? as usize;
    if len > max {
        return Err(WireError::TooLong { what, len, max });
    }
    let mut out = vec![0u8; len];
    r.read_exact(&mut out)?;
    Ok(out)
}

/// A connection whose reads and writes all end by a deadline: each sets the socket's timeout
/// to the time left (`TimedOut` once none is), so that a peer that trickles a message byte by
/// byte, or reads one that way, cannot stretch a rendezvous past it.
pub(super) struct By<'a>(pub(super) &'a TcpStream, pub(super) Instant);

impl By<'_> {
    fn left(&self) -> io::Result<std::time::Duration> {
        self.1
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
            .ok_or_else(|| io::Error::from(io::ErrorKind::TimedOut))
    }
}

impl Read for By<'_> {
    fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
        self.0.set_read_timeout(Some(self.left()?))?;
        (&*self.0).read(b)
    }
}

impl Write for By<'_> {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.0.set_write_timeout(Some(self.left()?))?;
        (&*self.0).write(b)
    }

    fn flush(&mut self) -> io::Result<()> {
        (&*self.0).flush()
    }
}

/// Parses `b` as a hello and as a reply for a job of `world` ranks, as rank 0 and a joining
/// rank would; whatever parses must encode back to what it was read from (a refusal, read
/// whatever its version, to what reads the same). Whether it read as a hello, and as a reply.
/// For the fuzz target.
pub(super) fn fuzz(b: &[u8], world: u32) -> (bool, bool) {
    let mut r = b;
    let hello = Hello::read(&mut r);
    if let Ok(h) = &hello {
        let used = b.len() - r.len();
        assert_eq!(h.encode(), b[..used], "a hello re-encodes to its bytes");
    }
    let mut r = b;
    let reply = Reply::read(&mut r, world);
    if let Ok(reply) = &reply {
        let used = b.len() - r.len();
        let again = reply.encode();
        if b[4..6] == VERSION.to_be_bytes() {
            assert_eq!(again, b[..used], "a reply re-encodes to its bytes");
        }
        assert_eq!(
            Reply::read(&mut &again[..], world).ok().as_ref(),
            Some(reply),
            "a reply reads back"
        );
    }
    (hello.is_ok(), reply.is_ok())
}

/// Writes a whole message.
pub(super) fn send(w: &mut impl Write, message: &[u8]) -> io::Result<()> {
    w.write_all(message)?;
    w.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    const HELLO: [u8; 33] = [
        b'R', b'C', b'B', b'S', 0, 2, // magic, version
        0, 0, 0, 3, // rank
        0, 0, 0, 4, // world
        0xff, 0xff, 0xff, 0xff, // local rank unknown
        1, 2, 3, 4, 5, 6, 7, 8, // job key
        0, 0, 0, 3, b'a', b'b', b'c', // control
    ];

    fn hello() -> Hello {
        Hello {
            version: VERSION,
            rank: 3,
            world_size: 4,
            local_rank: None,
            job_key: 0x0102_0304_0506_0708,
            control: b"abc".to_vec(),
        }
    }

    #[test]
    fn the_longest_hello_is_max_hello_len() {
        let longest = Hello {
            control: vec![7; MAX_CONTROL_LEN],
            ..hello()
        };
        assert_eq!(longest.encode().len(), MAX_HELLO_LEN);
    }

    #[test]
    fn hello_fixed_vector() {
        assert_eq!(hello().encode(), HELLO);
        assert_eq!(Hello::read(&mut &HELLO[..]).expect("hello"), hello());
    }

    #[test]
    fn a_partial_hello_names_its_rank_and_key_once_they_came() {
        let want = Some((3, 0x0102_0304_0506_0708));
        assert_eq!(Hello::rank_and_key(&HELLO), want);
        assert_eq!(Hello::rank_and_key(&HELLO[..26]), want);
        assert_eq!(Hello::rank_and_key(&HELLO[..25]), None);
        let mut other = HELLO;
        other[5] = 1;
        assert_eq!(Hello::rank_and_key(&other), None, "another version");
        other = HELLO;
        other[0] = b'X';
        assert_eq!(Hello::rank_and_key(&other), None, "not a hello");
    }

    #[test]
    fn reply_fixed_vectors() {
        let table = Reply::Table {
            nonce: 0x1122_3344_5566_7788,
            entries: vec![(Some(0), b"x".to_vec()), (None, vec![])],
        };
        let bytes: &[u8] = &[
            b'R', b'C', b'B', b'S', 0, 2, 0, // header, status table
            0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, // nonce
            0, 0, 0, 2, // entries
            0, 0, 0, 0, 0, 0, 0, 1, b'x', // rank 0: local 0, "x"
            0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, // rank 1: no local rank, empty
        ];
        assert_eq!(table.encode(), bytes);
        assert_eq!(Reply::read(&mut &bytes[..], 2).expect("table"), table);
        assert!(matches!(
            Reply::read(&mut &bytes[..], 3),
            Err(WireError::TableSize { got: 2, want: 3 })
        ));

        let refused = Reply::Refused("no".into());
        let bytes: &[u8] = &[b'R', b'C', b'B', b'S', 0, 2, 1, 0, 0, 0, 2, b'n', b'o'];
        assert_eq!(refused.encode(), bytes);
        assert_eq!(Reply::read(&mut &bytes[..], 9).expect("refusal"), refused);
    }

    #[test]
    fn bad_messages() {
        let mut wrong = HELLO;
        wrong[0] = b'X';
        assert!(matches!(
            Hello::read(&mut &wrong[..]),
            Err(WireError::Magic(_))
        ));
        let mut wrong = HELLO;
        wrong[5] = 9;
        assert!(matches!(
            Hello::read(&mut &wrong[..]),
            Err(WireError::Version(9))
        ));
        // A build from before the entries carried cores and a host id.
        wrong[5] = 1;
        assert!(matches!(
            Hello::read(&mut &wrong[..]),
            Err(WireError::Version(1))
        ));
        let mut wrong = HELLO;
        wrong[26..30].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(matches!(
            Hello::read(&mut &wrong[..]),
            Err(WireError::TooLong { .. })
        ));
        assert!(matches!(
            Hello::read(&mut &HELLO[..20]),
            Err(WireError::Io(_))
        ));
        let long = Reply::Refused("é".repeat(3000)).encode();
        let Ok(Reply::Refused(t)) = Reply::read(&mut &long[..], 1) else {
            panic!("refusal");
        };
        assert_eq!(t.len(), MAX_TEXT_LEN);
    }
}
